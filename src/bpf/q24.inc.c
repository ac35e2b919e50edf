// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* The Q24 matrix kernels: matvec (a row range times a batch of vectors, stored or added into the
 * residual stream), gate_up_swiglu (the MLP's two projections and SwiGLU, fused) and
 * lm_head_argmax (logits and their argmax in one pass). Included by ops.bpf.c in both memory
 * layers' builds: shares its `arena` map, fixed.h's helpers and mem.h's layer. src/num/fixed.rs
 * holds their Rust twins. */
#pragma once

/* ------------------------------------------------------------------ matvec */

/* Finishes one row of a matrix-vector product: d is the row's accumulator in Q_W + Q_ACT
 * (Q24 weights, or code * Q24 scale, times Q16 activations). Stores the Q16 value to the s32
 * y[l], or with `residual` adds d in Q_RES to the s64 residual stream y[l] (saturating); ya 0
 * stores nothing. Returns the saturated Q16 value (the logit, for the LM heads' argmax). The
 * Q24 and the SWAR kernels share it: finish_row_q16 for one row, finish_row_in for the rows of
 * a block whose outputs rows_out found once (an array lookup per row, in the array build). */
#ifndef QB_ARRAY_LAYER
typedef u64 rows_out_t; /* the arena build: the rows' address */

static __always_inline rows_out_t rows_out(u64 ya, u32 n, int residual)
{
	return ya;
}

static __always_inline s32 finish_row_in(s64 d, rows_out_t ya, u32 l, int residual)
{
	s32 v = sat32(rshr(d, Q_W));

	if (residual)
		ARENA_PTR(s64, ya)[l] = sat_res(ARENA_PTR(s64, ya)[l] + rshr(d, Q_W + Q_ACT - Q_RES));
	else if (ya)
		ARENA_PTR(s32, ya)[l] = v;
	return v;
}
#else
typedef struct qb_vec rows_out_t; /* the array build: the rows, looked up */

/* The n rows' outputs at ya, s64 with `residual`, else s32 (ya = 0: none). */
static __always_inline rows_out_t rows_out(u64 ya, u32 n, int residual)
{
	rows_out_t none = {};

	return ya ? QB_VEC(char, arena, ya, n * (residual ? 8 : 4)) : none;
}

static __always_inline s32 finish_row_in(s64 d, rows_out_t y, u32 l, int residual)
{
	s32 v = sat32(rshr(d, Q_W));

	if (residual && QB_VEC_OK(y))
		QB_IX(s64, y, l) = sat_res(QB_IX(s64, y, l) + rshr(d, Q_W + Q_ACT - Q_RES));
	else if (QB_VEC_OK(y))
		QB_IX(s32, y, l) = v;
	return v;
}
#endif

static __always_inline s32 finish_row_q16(s64 d, u64 ya, u32 l, int residual)
{
	return finish_row_in(d, rows_out(ya, l + 1, residual), l, residual);
}

struct matvec_args {
	u64 w;        /* s32 Q24 [nrows][k]: the rows row0.. of the matrix (a resident matrix or a window) */
	u64 x;        /* s32 Q16 [nb][k] */
	u64 y;        /* out: s32 Q16 [rows], or the s64 Q32 residual stream when accumulating; vector
		       * b at y + b * ystride */
	u32 k;        /* columns, a multiple of 8, <= 16384 */
	u32 row0, nrows;
	u32 accumulate; /* 1: y (s64 Q32) += W x, the residual add, saturating; 0: y (s32 Q16) = W x */
	u32 nb;       /* vectors, 1..LIM_BATCH_MAX: a prefill block times each row while it is cached */
	u32 pad;
	u64 ystride;  /* bytes between the vectors of y */
};

/* Whether the Q24 row programs take k columns: the dot products below stop at LIM_COLS_MAX, so a
 * wider k is refused rather than truncated. */
static __always_inline int q24_cols_ok(u32 k)
{
	return k != 0 && k % LIM_Q24_COLS_ALIGN == 0 && k <= LIM_COLS_MAX;
}

/* Whether the row of k columns at w lies in one element of the array layer (always, in the
 * arena): the row programs refuse a row that crosses an element's end, which user space never
 * places so (kernel/memory.rs). */
static __always_inline int q24_row_ok(u64 w, u32 k)
{
	return QB_VEC_OK(QB_VEC(const s32, arena, w, k));
}

/* Whether the nb vectors at y, y + ystride, .. hold rows [row0, row0 + nrows) of ysz bytes each
 * in one element (always, in the arena; y = 0: nothing is written). */
static __always_inline int rows_out_ok(u64 y, u64 ystride, u32 nb, u32 row0, u32 nrows, u64 ysz)
{
#ifdef QB_ARRAY_LAYER
	return !y || (ystride < (1ull << 40) &&
		      QB_VEC_OK(QB_VEC(char, arena, y + row0 * ysz, (nb - 1) * ystride + nrows * ysz)));
#else
	return 1; /* no test: the arena build's verification stays as it was */
#endif
}

/* The Q24 dot products below, column j (a literal) of a step of 8: a0 += w0[j] * x[j] and
 * a1 += w1[j] * x[j] (Q24_MAC2: x loaded once for both rows), or a0 += w0[j] * x[j] (Q24_MAC1),
 * all s32 loaded, then sign-extended by a register move (movsx: a sign-extending load from an
 * arena, ldsx, is refused by verifiers before Linux 6.18 and by JITs without it). Written as asm, as SW_QUAD_PACKED in swar.inc.c, because
 * clang re-associates the unrolled sums into trees and spills them: 5.8 BPF instructions per
 * multiply in rows2_q24 as C, 3.5 plus the loop's as asm. */
#define Q24_MAC2(a0, a1, w0, w1, x, j, xv, t)                                          \
	asm("%[xv] = *(u32 *)(%[xp] + %[o])\n\t" QB_SX32(xv) "\n\t"                      \
	    "%[tt] = *(u32 *)(%[w0p] + %[o])\n\t" QB_SX32(tt) "\n\t"                       \
	    "%[tt] *= %[xv]\n\t%[aa] += %[tt]\n\t"                                          \
	    "%[tt] = *(u32 *)(%[w1p] + %[o])\n\t" QB_SX32(tt) "\n\t"                       \
	    "%[tt] *= %[xv]\n\t%[ab] += %[tt]"                                               \
	    : [aa] "+r"(a0), [ab] "+r"(a1), [xv] "=&r"(xv), [tt] "=&r"(t)                 \
	    : [xp] "r"(x), [w0p] "r"(w0), [w1p] "r"(w1), [o] "i"(4 * (j)))
#define Q24_MAC1(a0, w0, x, j, xv, t)                                                  \
	asm("%[xv] = *(u32 *)(%[xp] + %[o])\n\t" QB_SX32(xv) "\n\t"                      \
	    "%[tt] = *(u32 *)(%[w0p] + %[o])\n\t" QB_SX32(tt) "\n\t"                       \
	    "%[tt] *= %[xv]\n\t%[aa] += %[tt]"                                               \
	    : [aa] "+r"(a0), [xv] "=&r"(xv), [tt] "=&r"(t)                                \
	    : [xp] "r"(x), [w0p] "r"(w0), [o] "i"(4 * (j)))

/* Columns j0 .. j0 + 7 (j0 a literal) of two rows (Q24_STEP2) or one row (Q24_STEP1) from w0,
 * w1, x. */
#define Q24_STEP2(a0, a1, w0, w1, x, xv, t, j0)                                         \
	do {                                                                            \
		Q24_MAC2(a0, a1, w0, w1, x, (j0) + 0, xv, t);                           \
		Q24_MAC2(a0, a1, w0, w1, x, (j0) + 1, xv, t);                           \
		Q24_MAC2(a0, a1, w0, w1, x, (j0) + 2, xv, t);                           \
		Q24_MAC2(a0, a1, w0, w1, x, (j0) + 3, xv, t);                           \
		Q24_MAC2(a0, a1, w0, w1, x, (j0) + 4, xv, t);                           \
		Q24_MAC2(a0, a1, w0, w1, x, (j0) + 5, xv, t);                           \
		Q24_MAC2(a0, a1, w0, w1, x, (j0) + 6, xv, t);                           \
		Q24_MAC2(a0, a1, w0, w1, x, (j0) + 7, xv, t);                           \
	} while (0)
#define Q24_STEP1(a0, w0, x, xv, t, j0)                                                 \
	do {                                                                            \
		Q24_MAC1(a0, w0, x, (j0) + 0, xv, t);                                   \
		Q24_MAC1(a0, w0, x, (j0) + 1, xv, t);                                   \
		Q24_MAC1(a0, w0, x, (j0) + 2, xv, t);                                   \
		Q24_MAC1(a0, w0, x, (j0) + 3, xv, t);                                   \
		Q24_MAC1(a0, w0, x, (j0) + 4, xv, t);                                   \
		Q24_MAC1(a0, w0, x, (j0) + 5, xv, t);                                   \
		Q24_MAC1(a0, w0, x, (j0) + 6, xv, t);                                   \
		Q24_MAC1(a0, w0, x, (j0) + 7, xv, t);                                   \
	} while (0)
/* Columns 0 .. 63: eight steps of `step` (Q24_STEP2 or Q24_STEP1, its arguments but the last) */
#define Q24_STEPS64(step, ...)                                                          \
	do {                                                                            \
		step(__VA_ARGS__, 0);                                                   \
		step(__VA_ARGS__, 8);                                                   \
		step(__VA_ARGS__, 16);                                                  \
		step(__VA_ARGS__, 24);                                                  \
		step(__VA_ARGS__, 32);                                                  \
		step(__VA_ARGS__, 40);                                                  \
		step(__VA_ARGS__, 48);                                                  \
		step(__VA_ARGS__, 56);                                                  \
	} while (0)

#ifndef QB_ARRAY_LAYER
/* a[0] = w0 . x and a[1] = w1 . x over k columns (a multiple of 8), Q24 x Q16 -> Q40, sharing
 * each load of x, 8 columns per step (a products mod 2^64, as the twin's wrapping sums). The
 * arena build walks pointers in a can_loop loop. */
static __always_inline void dot2_q24_inline(u64 w0a, u64 w1a, u64 xa, u32 k, s64 *a)
{
	const s32 __arena *w0 = ARENA_PTR(const s32, w0a);
	const s32 __arena *w1 = ARENA_PTR(const s32, w1a);
	const s32 __arena *x = ARENA_PTR(const s32, xa);
	s64 a0 = 0, a1 = 0, xv, t;

	ARENA_CAST(w0);
	ARENA_CAST(w1);
	ARENA_CAST(x);
	for (u32 b = 0; b < k / LIM_Q24_COLS_ALIGN && can_loop; b++) {
		Q24_STEP2(a0, a1, w0, w1, x, xv, t, 0);
		w0 += 8;
		w1 += 8;
		x += 8;
	}
	a[0] = a0;
	a[1] = a1;
}

/* sum_j w[j] * x[j] over k columns, Q24 x Q16 -> Q40, 8 columns per step. A global function:
 * the verifier checks it once, on its own, not at every call site. */
__noinline s64 dot_q24(u64 wa, u64 xa, u32 k)
{
	const s32 __arena *w = ARENA_PTR(const s32, wa);
	const s32 __arena *x = ARENA_PTR(const s32, xa);
	s64 acc = 0, xv, t;

	ARENA_CAST(w);
	ARENA_CAST(x);
	for (u32 b = 0; b < k / LIM_Q24_COLS_ALIGN && can_loop; b++) {
		Q24_STEP1(acc, w, x, xv, t, 0);
		w += 8;
		x += 8;
	}
	return acc;
}
#else
/* The array build: the same steps of 8 columns, as bpf_loop callbacks of 64 columns (then of 8
 * for the rest), each finding its columns through the rows' checked vectors: 6.1's verifier
 * would walk a bounded loop of k / 8 iterations step by step, past its 1 M instructions. The
 * sums ride in the walk; `first` is the first step of 8 of the rest. */
struct q24_walk {
	struct qb_vec w0, w1, x;
	s64 a0, a1;
	u32 first;
};

static __always_inline int q24_step2x8(struct q24_walk *c, u32 b)
{
	const s32 *w0 = QB_AT(const s32, c->w0, b * 256ull, 256);
	const s32 *w1 = QB_AT(const s32, c->w1, b * 256ull, 256);
	const s32 *x = QB_AT(const s32, c->x, b * 256ull, 256);
	s64 a0 = c->a0, a1 = c->a1, xv, t;

	Q24_STEPS64(Q24_STEP2, a0, a1, w0, w1, x, xv, t);
	c->a0 = a0;
	c->a1 = a1;
	return 0;
}
QB_EACH_FN(q24_step2x8, struct q24_walk)

static __always_inline int q24_step2(struct q24_walk *c, u32 b)
{
	u64 off = (c->first + b) * 32ull;
	const s32 *w0 = QB_AT(const s32, c->w0, off, 32);
	const s32 *w1 = QB_AT(const s32, c->w1, off, 32);
	const s32 *x = QB_AT(const s32, c->x, off, 32);
	s64 a0 = c->a0, a1 = c->a1, xv, t;

	Q24_STEP2(a0, a1, w0, w1, x, xv, t, 0);
	c->a0 = a0;
	c->a1 = a1;
	return 0;
}
QB_EACH_FN(q24_step2, struct q24_walk)

static __always_inline int q24_step1x8(struct q24_walk *c, u32 b)
{
	const s32 *w0 = QB_AT(const s32, c->w0, b * 256ull, 256);
	const s32 *x = QB_AT(const s32, c->x, b * 256ull, 256);
	s64 a0 = c->a0, xv, t;

	Q24_STEPS64(Q24_STEP1, a0, w0, x, xv, t);
	c->a0 = a0;
	return 0;
}
QB_EACH_FN(q24_step1x8, struct q24_walk)

static __always_inline int q24_step1(struct q24_walk *c, u32 b)
{
	u64 off = (c->first + b) * 32ull;
	const s32 *w0 = QB_AT(const s32, c->w0, off, 32);
	const s32 *x = QB_AT(const s32, c->x, off, 32);
	s64 a0 = c->a0, xv, t;

	Q24_STEP1(a0, w0, x, xv, t, 0);
	c->a0 = a0;
	return 0;
}
QB_EACH_FN(q24_step1, struct q24_walk)

/* a[0] = w0 . x and a[1] = w1 . x, as the arena build's; rows the operator did not check give
 * 0 (the operators check every row before its dot product). */
static __always_inline void dot2_q24_inline(u64 w0a, u64 w1a, u64 xa, u32 k, s64 *a)
{
	struct q24_walk c = { .w0 = QB_VEC(const s32, arena, w0a, k),
			      .w1 = QB_VEC(const s32, arena, w1a, k),
			      .x = QB_VEC(const s32, arena, xa, k),
			      .first = k / 64 * 8 };

	if (QB_VEC_OK(c.w0) && QB_VEC_OK(c.w1) && QB_VEC_OK(c.x)) {
		QB_EACH(q24_step2x8, k / 64, &c);
		QB_EACH(q24_step2, k % 64 / 8, &c);
	}
	a[0] = c.a0;
	a[1] = c.a1;
}

/* sum_j w[j] * x[j], as the arena build's. */
__noinline s64 dot_q24(u64 wa, u64 xa, u32 k)
{
	struct q24_walk c = { .w0 = QB_VEC(const s32, arena, wa, k),
			      .x = QB_VEC(const s32, arena, xa, k),
			      .first = k / 64 * 8 };

	if (QB_VEC_OK(c.w0) && QB_VEC_OK(c.x)) {
		QB_EACH(q24_step1x8, k / 64, &c);
		QB_EACH(q24_step1, k % 64 / 8, &c);
	}
	return c.a0;
}
#endif

/* Two rows' dot products with one x (dot2_q24_inline) as a global function, into out. */
struct dot2 {
	s64 a[2];
};

__noinline int dot2_q24(u64 w0a, u64 w1a, u64 xa, u32 k, struct dot2 *out __arg_nonnull)
{
	if (!out) /* Linux 6.1 ignores __arg_nonnull */
		return 1;
	dot2_q24_inline(w0a, w1a, xa, k, out->a);
	return 0;
}

/* Row loops run as bpf_loop callbacks: the verifier checks a callback once, with its ctx fields
 * unknown, where an open-coded iterator around the long column loop would be re-verified until
 * its state converged. */
struct row_ctx {
	u64 w, w2, x, y, tab, stride, ystride;
	u32 k, row0, nrows, flag, best, nb;
	s64 best_val;
	u32 err; /* set (and the loop stopped) when a row crosses an element's end: the op fails */
};

/* Whether a batched operator takes nb vectors. */
static __always_inline int batch_ok(u32 nb)
{
	return nb != 0 && nb <= LIM_BATCH_MAX;
}

#define ROWS_STORE 0   /* y (s32 Q16) = W x */
#define ROWS_RESIDUAL 1 /* y (the s64 Q32 residual stream) += W x, saturating */
#define ROWS_LOGITS 2  /* y (s32 Q16, or none) = W x; returns the better row packed */

/* Finishes one row in the given mode (see rows2_q24). */
static __always_inline s64 finish_q24(s64 d, u64 ya, u32 mode, u32 l)
{
	return (s64)finish_row_q16(d, ya, l, mode == ROWS_RESIDUAL) * 2 + (1 - l);
}

/* Two consecutive rows (at wa and wa + 4k) times x, sharing each load of x: 8 columns per step.
 * y is written per mode at ya = &y[first row]; returns the better row packed as
 * logit * 2 + 1 - l, so that the larger value is the larger logit and, on ties, the first row.
 * k_mode = k | mode << 32 (BPF functions take at most five arguments). A global function: the
 * verifier checks it once. */
__noinline s64 rows2_q24(u64 wa, u64 xa, u64 ya, u64 k_mode)
{
	u32 k = (u32)k_mode, mode = (u32)(k_mode >> 32);
	s64 acc[2], p0, p1;

	dot2_q24_inline(wa, wa + (u64)k * 4, xa, k, acc);
	p0 = finish_q24(acc[0], ya, mode, 0);
	p1 = finish_q24(acc[1], ya, mode, 1);
	return p0 > p1 ? p0 : p1;
}

/* One row, as rows2_q24 (for an odd row count). */
__noinline s64 row1_q24(u64 wa, u64 xa, u64 ya, u64 k_mode)
{
	return finish_q24(dot_q24(wa, xa, (u32)k_mode), ya, (u32)(k_mode >> 32), 0);
}

/* One vector of a batch times a row pair (rows_pair's step), the best row so far carried along. */
struct pair_walk {
	u64 wa, x, y, xstride, ystride, ysz, k_mode;
	s64 best_val;
	u32 r, two, flag, best;
};

static __always_inline int pair_step(struct pair_walk *p, u32 b)
{
	u64 xa = p->x + b * p->xstride;
	u64 ya = p->y ? p->y + b * p->ystride + p->r * p->ysz : 0;
	s64 v = p->two ? rows2_q24(p->wa, xa, ya, p->k_mode) : row1_q24(p->wa, xa, ya, p->k_mode);

	if (p->flag == ROWS_LOGITS && (v >> 1) > p->best_val) {
		p->best_val = v >> 1;
		p->best = p->r + 1 - (u32)(v & 1);
	}
	return 0;
}
QB_EACH_FN(pair_step, struct pair_walk)

/* Rows 2i, 2i + 1 of the range (the last one alone when the count is odd), times each of the nb
 * vectors in turn: the rows stay in the L1 cache, so that a block of vectors reads them from
 * memory once. The LM head (ROWS_LOGITS) runs with nb = 1. */
static long rows_pair(u64 i, struct row_ctx *c)
{
	u32 r = c->row0 + 2 * (u32)i, two = r + 1 < c->row0 + c->nrows;
	u64 wa = c->w + 2 * i * c->stride;
	struct pair_walk p = { .wa = wa, .x = c->x, .y = c->y, .xstride = (u64)c->k * 4,
			       .ystride = c->ystride, .ysz = c->flag == ROWS_RESIDUAL ? 8 : 4,
			       .k_mode = c->k | (u64)c->flag << 32, .best_val = c->best_val,
			       .r = r, .two = two, .flag = c->flag, .best = c->best };

	if (!q24_row_ok(wa, c->k) || (two && !q24_row_ok(wa + c->stride, c->k)) ||
	    QB_EACH(pair_step, c->nb, &p)) {
		c->err = 1;
		return 1;
	}
	c->best = p.best;
	c->best_val = p.best_val;
	return 0;
}

/* y_b[r] = W[r] . x_b, or y_b[r] += W[r] . x_b into the residual stream, for r in
 * [row0, row0 + nrows) and each of the nb vectors b, two rows per step. */
OP(matvec, struct matvec_args)
{
	struct row_ctx c = { .w = a->w, .x = a->x, .y = a->y, .stride = (u64)a->k * 4, .k = a->k,
			     .row0 = a->row0, .nrows = a->nrows, .nb = a->nb, .ystride = a->ystride,
			     .flag = a->accumulate ? ROWS_RESIDUAL : ROWS_STORE };

	QB_MEM_USE(arena);
	if (!q24_cols_ok(a->k) || !batch_ok(a->nb) ||
	    !QB_VEC_OK(QB_VEC(const s32, arena, a->x, (u64)a->nb * a->k)) ||
	    !rows_out_ok(a->y, a->ystride, a->nb, a->row0, a->nrows, a->accumulate ? 8 : 4))
		return 1;
	return (int)bpf_loop((a->nrows + 1) / 2, rows_pair, &c, 0) < 0 || c.err;
}

struct gate_up_args {
	u64 gate;     /* s32 Q24 [nrows][k]: rows row0.. of mlp.gate_proj */
	u64 up;       /* s32 Q24 [nrows][k]: rows row0.. of mlp.up_proj */
	u64 x;        /* s32 Q16 [nb][k] */
	u64 y;        /* s32 Q16 [rows], out: silu(gate x) * (up x); vector b at y + b * ystride */
	u64 exp2;     /* u32 Q30 [257] */
	u32 k, row0, nrows;
	u32 nb;       /* vectors, 1..LIM_BATCH_MAX */
	u64 ystride;  /* bytes between the vectors of y */
};

/* One vector of a batch times row r of both projections (gate_up_row's step). */
struct gate_up_walk {
	u64 w0, w1, x, y, xstride, ystride, tab;
	u32 k, r, err;
};

static __always_inline int gate_up_step(struct gate_up_walk *g, u32 b)
{
	QB_VEC_T(const u32) tab = QB_VEC(const u32, arena, g->tab, EXP2_ENTRIES);
	s32 QB *y = QB_SPAN(s32, arena, g->y + b * g->ystride + g->r * 4ull, 4);
	struct dot2 d = {};

	if (!QB_VEC_OK(tab) || !QB_SPAN_OK(y)) { /* on arrays, the operator checked them */
		g->err = 1;
		return 1;
	}
	dot2_q24(g->w0, g->w1, g->x + b * g->xstride, g->k, &d);
	*y = swiglu(sat32(rshr(d.a[0], Q_W)), sat32(rshr(d.a[1], Q_W)), tab);
	return 0;
}
QB_EACH_FN(gate_up_step, struct gate_up_walk)

/* Row i of both projections times each of the nb vectors, sharing each load of x (the rows stay
 * cached, as rows_pair). */
static long gate_up_row(u64 i, struct row_ctx *c)
{
	struct gate_up_walk g = { .w0 = c->w + i * c->stride, .w1 = c->w2 + i * c->stride,
				  .x = c->x, .y = c->y, .xstride = (u64)c->k * 4,
				  .ystride = c->ystride, .tab = c->tab, .k = c->k,
				  .r = c->row0 + (u32)i };

	if (!q24_row_ok(g.w0, c->k) || !q24_row_ok(g.w1, c->k) ||
	    QB_EACH(gate_up_step, c->nb, &g) || g.err) {
		c->err = 1;
		return 1;
	}
	return 0;
}

/* The SwiGLU half of the MLP, fused: both projections of a row, then silu(g) * u, for each of
 * the nb vectors. */
OP(gate_up_swiglu, struct gate_up_args)
{
	struct row_ctx c = { .w = a->gate, .w2 = a->up, .x = a->x, .y = a->y, .tab = a->exp2,
			     .stride = (u64)a->k * 4, .k = a->k, .row0 = a->row0, .nb = a->nb,
			     .ystride = a->ystride };

	QB_MEM_USE(arena);
	if (!q24_cols_ok(a->k) || !batch_ok(a->nb) ||
	    !QB_VEC_OK(QB_VEC(const s32, arena, a->x, (u64)a->nb * a->k)) ||
	    !rows_out_ok(a->y, a->ystride, a->nb, a->row0, a->nrows, 4))
		return 1;
	return (int)bpf_loop(a->nrows, gate_up_row, &c, 0) < 0 || c.err;
}

/* ------------------------------------------------------------------ LM head + argmax */

struct lm_head_args {
	u64 w;       /* s32 Q24 [nrows][k]: rows row0.. of the LM head */
	u64 x;       /* s32 Q16 [k] */
	u64 y;       /* s32 Q16 [vocab] logits out (indexed by row), or 0 to skip writing them */
	u32 k, row0, nrows;
	u32 best;    /* out: argmax row (first on ties) */
	s64 best_val; /* out: its logit, Q16 */
};

/* Logits for rows [row0, row0 + nrows) and their argmax, in one pass. */
OP(lm_head_argmax, struct lm_head_args)
{
	struct row_ctx c = { .w = a->w, .x = a->x, .y = a->y, .stride = (u64)a->k * 4, .k = a->k,
			     .row0 = a->row0, .nrows = a->nrows, .flag = ROWS_LOGITS, .nb = 1,
			     .best = a->row0, .best_val = -ACT_MAX - 1 };
	long ret;

	QB_MEM_USE(arena);
	if (!q24_cols_ok(a->k) || !QB_VEC_OK(QB_VEC(const s32, arena, a->x, a->k)) ||
	    !rows_out_ok(a->y, 0, 1, a->row0, a->nrows, 4))
		return 1;
	ret = bpf_loop((a->nrows + 1) / 2, rows_pair, &c, 0);
	a->best = c.best;
	a->best_val = c.best_val;
	return (int)ret < 0 || c.err;
}
