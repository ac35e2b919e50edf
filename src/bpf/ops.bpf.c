// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* Every operator of the Qwen3 forward pass, as SEC("syscall") programs run with test_run.
 *
 * Bulk data (weights, activations, KV cache, tables, logits) lives in one BPF arena that user
 * space fills through its mmap; each program's ctx carries only arena addresses and sizes.
 * Formats are in fixed.h; src/num/fixed.rs holds a Rust twin of every operator computing the
 * same integers. Long loops use open-coded iterators (bpf_for), so the verifier checks the
 * body once instead of once per iteration.
 *
 * One object, one arena: the operators below, then seven fragments (*.inc.c, not compiled on
 * their own) joined at the end in this order, each using what the ones before it define:
 *   tokenize.inc.c  the Qwen3 tokenizer: text -> ids (this file's arena; first, so that the
 *                   event path below can tokenize a request's text)
 *   swar.inc.c      the low-bit SWAR kernels (fixed.h's helpers, this file's arena)
 *   argmax.inc.c    the screened LM-head argmax (calls the exact heads above and swar's)
 *   kv8.inc.c       int8 KV-cache attention (the attention helpers above)
 *   sample.inc.c    the integer sampler (fixed.h's exp_neg, this file's arena)
 *   plan.inc.c      the plan interpreter (every operator's ctx and op_* function above)
 *   generate.inc.c  generation in the kernel (plan.inc.c's run_plan steps, sample.inc.c's draw)
 *   event.inc.c     a datagram starts a generation (generate.inc.c's loop, on a bpf_wq)
 *   filter.inc.c    the packet filter (and their XDP sides, event_xdp.inc.c, filter_xdp.inc.c)
 *   constants.inc.c the constants shared with Rust, from all of the above
 *
 * Built twice (mem.h): over the arena, and over array maps (ops_array.bpf.o), which so far has
 * only formats, embed, rmsnorm, qk_norm_rope and swiglu_vec (issue 35). */
#include "fixed.h"

/* A GPL-compatible licence: the arena kfuncs and bpf_wq are GPL-only. */
char LICENSE[] SEC("license") = "Dual MIT/GPL";

QB_MEM(arena);

/* ------------------------------------------------------------------ formats */

struct formats_args {
	u32 q_act, q_w, q_norm, q_nrm, q_one, q_scale, exp2_bits, q_res, q_q, pad;
	s64 log2e_q30, act_max, res_max;
	/* limits.h */
	u32 cols_max, q24_cols_align, swar_cols_align, w4_rows_align, w8_rows_align, norm_max;
	u32 head_dim_max, batch_max;
	u32 vocab_max, sample_buckets, sample_temp_min, sample_temp_max, sample_rep_min;
	u32 sample_rep_max, sample_pen_max;
	u32 tok_text_max, tok_ids_max, tok_cp_max, tok_word_max, tok_marks_max, tok_added_max;
	u32 tok_added_len;
	u32 filter_bytes_max, filter_labels_max, filter_label_tokens_max, filter_ports_max;
	u32 filter_sources_max;
};

/* Reports fixed.h's and limits.h's constants, so that a test can compare them with src/fixed.rs
 * and src/limits.rs. */
SEC("syscall")
int formats(struct formats_args *a)
{
	a->q_act = Q_ACT;
	a->q_w = Q_W;
	a->q_norm = Q_NORM;
	a->q_nrm = Q_NRM;
	a->q_one = Q_ONE;
	a->q_scale = Q_SCALE;
	a->exp2_bits = EXP2_BITS;
	a->log2e_q30 = LOG2E_Q30;
	a->act_max = ACT_MAX;
	a->q_res = Q_RES;
	a->q_q = Q_Q;
	a->res_max = RES_MAX;
	a->cols_max = LIM_COLS_MAX;
	a->q24_cols_align = LIM_Q24_COLS_ALIGN;
	a->swar_cols_align = LIM_SWAR_COLS_ALIGN;
	a->w4_rows_align = LIM_W4_ROWS_ALIGN;
	a->w8_rows_align = LIM_W8_ROWS_ALIGN;
	a->norm_max = LIM_NORM_MAX;
	a->head_dim_max = LIM_HEAD_DIM_MAX;
	a->batch_max = LIM_BATCH_MAX;
	a->vocab_max = LIM_VOCAB_MAX;
	a->sample_buckets = LIM_SAMPLE_BUCKETS;
	a->sample_temp_min = LIM_SAMPLE_TEMP_MIN;
	a->sample_temp_max = LIM_SAMPLE_TEMP_MAX;
	a->sample_rep_min = LIM_SAMPLE_REP_MIN;
	a->sample_rep_max = LIM_SAMPLE_REP_MAX;
	a->sample_pen_max = LIM_SAMPLE_PEN_MAX;
	a->tok_text_max = LIM_TOK_TEXT_MAX;
	a->tok_ids_max = LIM_TOK_IDS_MAX;
	a->tok_cp_max = LIM_TOK_CP_MAX;
	a->tok_word_max = LIM_TOK_WORD_MAX;
	a->tok_marks_max = LIM_TOK_MARKS_MAX;
	a->tok_added_max = LIM_TOK_ADDED_MAX;
	a->tok_added_len = LIM_TOK_ADDED_LEN;
	a->filter_bytes_max = LIM_FILTER_BYTES_MAX;
	a->filter_labels_max = LIM_FILTER_LABELS_MAX;
	a->filter_label_tokens_max = LIM_FILTER_LABEL_TOKENS_MAX;
	a->filter_ports_max = LIM_FILTER_PORTS_MAX;
	a->filter_sources_max = LIM_FILTER_SOURCES_MAX;
	return 0;
}

/* ------------------------------------------------------------------ embed */

struct embed_args {
	u64 table; /* s32 Q24 [vocab][dim] */
	u64 x;     /* s64 Q32 [dim], out: the residual stream */
	u32 token, dim;
};

struct embed_walk {
	QB_VEC_T(const s32) e; /* the token's row [dim] */
	QB_VEC_T(s64) x;       /* [dim] */
};

static __always_inline int embed_step(struct embed_walk *c, u32 i)
{
	QB_IX(s64, c->x, i) = (s64)QB_IX(const s32, c->e, i) << (Q_RES - Q_W);
	return 0;
}
QB_EACH_FN(embed_step, struct embed_walk)

/* x = embed_tokens[token], Q24 -> Q32 (exact). */
OP(embed, struct embed_args)
{
	u32 dim = a->dim;
	struct embed_walk c = {
		.e = QB_VEC(const s32, arena, a->table + (u64)a->token * dim * 4, dim),
		.x = QB_VEC(s64, arena, a->x, dim),
	};

	QB_MEM_USE(arena);
	if (!QB_VEC_OK(c.e) || !QB_VEC_OK(c.x))
		return 1;
	return QB_EACH(embed_step, dim, &c) ? 1 : 0;
}

/* ------------------------------------------------------------------ RMSNorm */

/* Element i of x as a Q32 s64: x is either the s64 Q32 residual stream (wide) or s32 Q16. */
static __always_inline s64 load_q32(QB_VEC_T(const s32) x, u32 i, u32 wide)
{
	return wide ? QB_IX(const s64, x, i) : (s64)QB_IX(const s32, x, i) << (Q_RES - Q_ACT);
}

/* y = w * x / sqrt(mean(x^2) + eps) for one vector of n (<= 16384) elements, y (s32 Q16) may be
 * x when x is not wide. eps_q64 = round(eps * 2^64). In Q32 units: pre-shift s so that every
 * |x| >> s < 2^24 and sum((x >> s)^2) fits u64; v = mean + eps (units 2^(2s-64)); scale v by
 * 4^e into [2^60, 2^62); r = isqrt -> inv = 2^62 / r, so that the normalised value in Q24 is
 * (x >> s) * inv * 2^(e - 38); times w (Q20) -> Q16. */
/* BPF calls take at most 5 arguments, so the vector length n (< 2^15), the output format and
 * the input kind share one u32: n | q_out << 16 | WIDE (x is the s64 Q32 residual). */
#define WIDE (1U << 31)
#define NQW(n, q_out, wide) ((n) | (q_out) << 16 | ((wide) ? WIDE : 0))

/* One vector's walk: x (s32 Q16, or the s64 Q32 residual when wide), the weight w and the
 * output y, all [n]; acc the max |x| or the sum of squares; s, inv, e, q_out rmsnorm_vec's. */
struct norm_walk {
	QB_VEC_T(const s32) x;
	QB_VEC_T(const s32) w;
	QB_VEC_T(s32) y;
	u64 acc, inv;
	u32 wide, s, e, q_out;
};

static __always_inline int maxabs_step(struct norm_walk *c, u32 i)
{
	s64 xi = load_q32(c->x, i, c->wide);
	u64 ax = xi < 0 ? -xi : xi;

	if (ax > c->acc)
		c->acc = ax;
	return 0;
}
QB_EACH_FN(maxabs_step, struct norm_walk)

static __always_inline int sumsq_step(struct norm_walk *c, u32 i)
{
	s64 xi = load_q32(c->x, i, c->wide);
	u64 ax = (xi < 0 ? -xi : xi) >> (c->s & 63);

	c->acc += ax * ax;
	return 0;
}
QB_EACH_FN(sumsq_step, struct norm_walk)

static __always_inline int norm_step(struct norm_walk *c, u32 i)
{
	s64 nrm = rshr((load_q32(c->x, i, c->wide) >> c->s) * (s64)c->inv, (38 - c->e) & 63); /* Q24 */

	QB_IX(s32, c->y, i) =
		sat32(rshr(nrm * (s64)QB_IX(const s32, c->w, i), (Q_NRM + Q_NORM - c->q_out) & 63));
	return 0;
}
QB_EACH_FN(norm_step, struct norm_walk)

/* max |x_i| over the n = nqw & 0xffff elements (<= LIM_NORM_MAX) of x (see load_q32). Global
 * functions, so that the verifier does not carry the sums' precision, which the shifts computed
 * from them need, back into the loops (it could then not prove the loops' states equal). */
__noinline u64 vec_maxabs(u64 xa, u32 nqw)
{
	u32 n = nqw & 0xffff, wide = (nqw & WIDE) != 0;
	struct norm_walk c = { .x = QB_VEC(const s32, arena, xa, (u64)n << wide), .wide = wide };

	if (!QB_VEC_OK(c.x)) /* refused by rmsnorm_vec before */
		return 0;
	QB_EACH(maxabs_step, n, &c);
	return c.acc;
}

/* sum of (|x_i| >> s)^2 over the n elements of x, as vec_maxabs. */
__noinline u64 vec_sumsq(u64 xa, u32 nqw, u32 s)
{
	u32 n = nqw & 0xffff, wide = (nqw & WIDE) != 0;
	struct norm_walk c = { .x = QB_VEC(const s32, arena, xa, (u64)n << wide), .wide = wide,
			       .s = s };

	if (!QB_VEC_OK(c.x))
		return 0;
	QB_EACH(sumsq_step, n, &c);
	return c.acc;
}
static __noinline int rmsnorm_vec(u64 xa, u64 wa, u64 ya, u32 nqw, u64 eps_q64)
{
	u32 n = nqw & 0xffff, q_out = (nqw >> 16) & 31, wide = (nqw & WIDE) != 0;
	struct norm_walk c = {
		.x = QB_VEC(const s32, arena, xa, (u64)n << wide),
		.w = QB_VEC(const s32, arena, wa, n),
		.y = QB_VEC(s32, arena, ya, n),
		.wide = wide,
		.q_out = q_out,
	};
	u64 maxabs = 0, ss = 0, v, r, inv;
	u32 s = 0, e;

	if (n == 0 || n > LIM_NORM_MAX || !QB_VEC_OK(c.x) || !QB_VEC_OK(c.w) || !QB_VEC_OK(c.y))
		return 1;
	maxabs = vec_maxabs(xa, nqw);
	if (bitlen(maxabs) > 24)
		s = bitlen(maxabs) - 24;
	ss = vec_sumsq(xa, nqw, s);
	v = ss / n + (s < 32 ? eps_q64 >> (2 * s) : 0);
	if (v == 0)
		v = 1;
	e = (62 - bitlen(v)) / 2;
	r = isqrt(v << (2 * e));
	inv = (1ULL << 62) / r;
	c.s = s;
	c.e = e;
	c.inv = inv;
	return QB_EACH(norm_step, n, &c) ? 1 : 0;
}

struct rmsnorm_args {
	u64 x;       /* s64 Q32 [nvec][n] if wide, else s32 Q16 [nvec][n] */
	u64 w;       /* s32 Q20 [n], shared by every vector */
	u64 y;       /* s32 Q16 [nvec][n], out; may equal x when not wide */
	u64 eps_q64; /* round(rms_norm_eps * 2^64) */
	u32 n, nvec;
	u32 wide;    /* 1: x is the s64 Q32 residual stream */
	s32 ret;     /* out: 0, or 1 on bad n */
};

/* The vectors of one rmsnorm run: vector h at x + h * xstride, y + h * ystride. */
struct norm_vecs {
	u64 x, w, y, eps, xstride, ystride;
	u32 nqw, n_q;   /* rmsnorm_vec's nqw; qk_norm_rope: the heads of q before those of k */
	u64 k, kn;      /* qk_norm_rope: k and its norm weight; cos, sin: this position's rows */
	u64 cos, sin;
	int ret;
};

static __always_inline int norm_vec_step(struct norm_vecs *c, u32 h)
{
	c->ret |= rmsnorm_vec(c->x + h * c->xstride, c->w, c->y + h * c->ystride, c->nqw, c->eps);
	return 0;
}
QB_EACH_FN(norm_vec_step, struct norm_vecs)

/* RMSNorm of nvec consecutive vectors with one weight: hidden-wide (nvec = 1) or per head. */
OP(rmsnorm, struct rmsnorm_args)
{
	u64 stride = (u64)a->n * 4;
	u32 n = a->n, wide = a->wide != 0;
	struct norm_vecs c = { .x = a->x, .w = a->w, .y = a->y, .eps = a->eps_q64,
			       .xstride = stride * (1 + wide), .ystride = stride };

	QB_MEM_USE(arena);
	/* n travels in 16 bits of rmsnorm_vec's nqw: check it before it is packed */
	if (n == 0 || n > LIM_NORM_MAX) {
		a->ret = 1;
		return 1;
	}
	c.nqw = NQW(n, Q_ACT, wide);
	if (QB_EACH(norm_vec_step, a->nvec, &c))
		c.ret = 1;
	a->ret = c.ret;
	return c.ret;
}

/* ------------------------------------------------------------------ RoPE */

/* One head's rotation: x [2 * half], cos/sin Q30 [half]. */
struct rope_walk {
	QB_VEC_T(s32) x;
	QB_VEC_T(const s32) c;
	QB_VEC_T(const s32) s;
	u32 half;
};

static __always_inline int rope_step(struct rope_walk *w, u32 i)
{
	s64 a = QB_IX(s32, w->x, i), b = QB_IX(s32, w->x, i + w->half);
	s64 ci = QB_IX(const s32, w->c, i), si = QB_IX(const s32, w->s, i);

	QB_IX(s32, w->x, i) = sat32(rshr(a * ci - b * si, Q_ONE));
	QB_IX(s32, w->x, i + w->half) = sat32(rshr(b * ci + a * si, Q_ONE));
	return 0;
}
QB_EACH_FN(rope_step, struct rope_walk)

/* Rotates one head in place: pairs (i, i + half), cos/sin Q30 [half] for this position. */
static __noinline int rope_vec(u64 xa, u64 ca, u64 sa, u32 half)
{
	struct rope_walk w = {
		.x = QB_VEC(s32, arena, xa, 2 * half),
		.c = QB_VEC(const s32, arena, ca, half),
		.s = QB_VEC(const s32, arena, sa, half),
		.half = half,
	};

	if (!QB_VEC_OK(w.x) || !QB_VEC_OK(w.c) || !QB_VEC_OK(w.s))
		return 1;
	return QB_EACH(rope_step, half, &w) ? 1 : 0;
}

struct qk_norm_rope_args {
	u64 q;       /* s32 [n_q][hd], in place: Q16 in, Q22 out */
	u64 k;       /* s32 Q16 [n_k][hd], in place */
	u64 q_norm;  /* s32 Q20 [hd] */
	u64 k_norm;  /* s32 Q20 [hd] */
	u64 cos;     /* s32 Q30 [hd/2]: the table row of this position */
	u64 sin;     /* s32 Q30 [hd/2] */
	u64 eps_q64;
	u32 n_q, n_k, hd;
	s32 ret;
};

/* Head h of q (h < n_q) or of k: its norm, then its rotation (c->nqw is hd). */
static __always_inline int qk_head_step(struct norm_vecs *c, u32 h)
{
	u32 hd = c->nqw, is_q = h < c->n_q;
	u64 v = is_q ? c->x + h * c->xstride : c->k + (h - c->n_q) * c->xstride;

	c->ret |= rmsnorm_vec(v, is_q ? c->w : c->kn, v, NQW(hd, is_q ? Q_Q : Q_ACT, 0), c->eps);
	c->ret |= rope_vec(v, c->cos, c->sin, hd / 2);
	return 0;
}
QB_EACH_FN(qk_head_step, struct norm_vecs)

/* Qwen3's per-head q_norm / k_norm, then RoPE (rotate_half pairing i with i + hd/2). */
OP(qk_norm_rope, struct qk_norm_rope_args)
{
	/* ctx fields are read once into registers: the verifier forbids ctx loads at offsets that
	 * clang would otherwise compute from a select between two fields. */
	u64 q = a->q, k = a->k, qn = a->q_norm, kn = a->k_norm;
	u32 hd = a->hd, n_all = a->n_q + a->n_k;
	struct norm_vecs c = { .eps = a->eps_q64, .xstride = (u64)hd * 4, .n_q = a->n_q,
			       .cos = a->cos, .sin = a->sin };

	if (hd == 0 || hd > LIM_NORM_MAX) {
		a->ret = 1;
		return 1;
	}

	OPAQUE(q);
	OPAQUE(k);
	OPAQUE(qn);
	OPAQUE(kn);
	c.x = q;
	c.w = qn;
	c.k = k;
	c.kn = kn;
	c.nqw = hd;
	QB_MEM_USE(arena);
	if (QB_EACH(qk_head_step, n_all, &c))
		c.ret = 1;
	a->ret = c.ret;
	return c.ret;
}

/* The array memory layer (issue 35) builds, so far, only the operators above and swiglu_vec
 * below; the others follow it step by step (docs/plans/array-layer.md). */
#ifndef QB_ARRAY_LAYER
/* ------------------------------------------------------------------ matvec */

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

/* The Q24 dot products below, column j (a literal) of a step of 8: a0 += w0[j] * x[j] and
 * a1 += w1[j] * x[j] (Q24_MAC2: x loaded once for both rows), or a0 += w0[j] * x[j] (Q24_MAC1),
 * all s32 loaded, then sign-extended by a register move (movsx: a sign-extending load from an
 * arena, ldsx, is refused by verifiers before Linux 6.18 and by JITs without it). Written as asm, as SW_QUAD_PACKED in swar.inc.c, because
 * clang re-associates the unrolled sums into trees and spills them: 5.8 BPF instructions per
 * multiply in rows2_q24 as C, 3.5 plus the loop's as asm. */
#define Q24_MAC2(a0, a1, w0, w1, x, j, xv, t)                                          \
	asm("%[xv] = *(u32 *)(%[xp] + %[o])\n\t%[xv] = (s32)%[xv]\n\t"                   \
	    "%[tt] = *(u32 *)(%[w0p] + %[o])\n\t%[tt] = (s32)%[tt]\n\t"                    \
	    "%[tt] *= %[xv]\n\t%[aa] += %[tt]\n\t"                                          \
	    "%[tt] = *(u32 *)(%[w1p] + %[o])\n\t%[tt] = (s32)%[tt]\n\t"                    \
	    "%[tt] *= %[xv]\n\t%[ab] += %[tt]"                                               \
	    : [aa] "+r"(a0), [ab] "+r"(a1), [xv] "=&r"(xv), [tt] "=&r"(t)                 \
	    : [xp] "r"(x), [w0p] "r"(w0), [w1p] "r"(w1), [o] "i"(4 * (j)))
#define Q24_MAC1(a0, w0, x, j, xv, t)                                                  \
	asm("%[xv] = *(u32 *)(%[xp] + %[o])\n\t%[xv] = (s32)%[xv]\n\t"                   \
	    "%[tt] = *(u32 *)(%[w0p] + %[o])\n\t%[tt] = (s32)%[tt]\n\t"                    \
	    "%[tt] *= %[xv]\n\t%[aa] += %[tt]"                                               \
	    : [aa] "+r"(a0), [xv] "=&r"(xv), [tt] "=&r"(t)                                \
	    : [xp] "r"(x), [w0p] "r"(w0), [o] "i"(4 * (j)))

/* a[0] = w0 . x and a[1] = w1 . x over k columns (a multiple of 8), Q24 x Q16 -> Q40, sharing
 * each load of x, 8 columns per step (a products mod 2^64, as the twin's wrapping sums). */
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
		Q24_MAC2(a0, a1, w0, w1, x, 0, xv, t);
		Q24_MAC2(a0, a1, w0, w1, x, 1, xv, t);
		Q24_MAC2(a0, a1, w0, w1, x, 2, xv, t);
		Q24_MAC2(a0, a1, w0, w1, x, 3, xv, t);
		Q24_MAC2(a0, a1, w0, w1, x, 4, xv, t);
		Q24_MAC2(a0, a1, w0, w1, x, 5, xv, t);
		Q24_MAC2(a0, a1, w0, w1, x, 6, xv, t);
		Q24_MAC2(a0, a1, w0, w1, x, 7, xv, t);
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
		Q24_MAC1(acc, w, x, 0, xv, t);
		Q24_MAC1(acc, w, x, 1, xv, t);
		Q24_MAC1(acc, w, x, 2, xv, t);
		Q24_MAC1(acc, w, x, 3, xv, t);
		Q24_MAC1(acc, w, x, 4, xv, t);
		Q24_MAC1(acc, w, x, 5, xv, t);
		Q24_MAC1(acc, w, x, 6, xv, t);
		Q24_MAC1(acc, w, x, 7, xv, t);
		w += 8;
		x += 8;
	}
	return acc;
}

/* Two rows' dot products with one x (dot2_q24_inline) as a global function, into out. */
struct dot2 {
	s64 a[2];
};

__noinline int dot2_q24(u64 w0a, u64 w1a, u64 xa, u32 k, struct dot2 *out __arg_nonnull)
{
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

/* Rows 2i, 2i + 1 of the range (the last one alone when the count is odd), times each of the nb
 * vectors in turn: the rows stay in the L1 cache, so that a block of vectors reads them from
 * memory once. The LM head (ROWS_LOGITS) runs with nb = 1. */
static long rows_pair(u64 i, struct row_ctx *c)
{
	u32 r = c->row0 + 2 * (u32)i, two = r + 1 < c->row0 + c->nrows;
	u64 ysz = c->flag == ROWS_RESIDUAL ? 8 : 4;
	u64 wa = c->w + 2 * i * c->stride, k_mode = c->k | (u64)c->flag << 32;

	for (u32 b = 0; b < c->nb && can_loop; b++) { /* nb <= LIM_BATCH_MAX */
		u64 xa = c->x + (u64)b * c->k * 4;
		u64 ya = c->y ? c->y + b * c->ystride + (u64)r * ysz : 0;
		s64 p = two ? rows2_q24(wa, xa, ya, k_mode) : row1_q24(wa, xa, ya, k_mode);

		if (c->flag == ROWS_LOGITS && (p >> 1) > c->best_val) {
			c->best_val = p >> 1;
			c->best = r + 1 - (u32)(p & 1);
		}
	}
	return 0;
}

/* y_b[r] = W[r] . x_b, or y_b[r] += W[r] . x_b into the residual stream, for r in
 * [row0, row0 + nrows) and each of the nb vectors b, two rows per step. */
OP(matvec, struct matvec_args)
{
	struct row_ctx c = { .w = a->w, .x = a->x, .y = a->y, .stride = (u64)a->k * 4, .k = a->k,
			     .row0 = a->row0, .nrows = a->nrows, .nb = a->nb, .ystride = a->ystride,
			     .flag = a->accumulate ? ROWS_RESIDUAL : ROWS_STORE };

	USE_ARENA(arena);
	if (!q24_cols_ok(a->k) || !batch_ok(a->nb))
		return 1;
	return (int)bpf_loop((a->nrows + 1) / 2, rows_pair, &c, 0) < 0;
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

/* Row i of both projections times each of the nb vectors, sharing each load of x (the rows stay
 * cached, as rows_pair). */
static long gate_up_row(u64 i, struct row_ctx *c)
{
	u32 r = c->row0 + (u32)i;

	for (u32 b = 0; b < c->nb && can_loop; b++) { /* nb <= LIM_BATCH_MAX */
		u64 xa = c->x + (u64)b * c->k * 4;
		s32 __arena *y = ARENA_PTR(s32, c->y + b * c->ystride + (u64)r * 4);
		struct dot2 d = {};
		s32 g, u;

		dot2_q24(c->w + i * c->stride, c->w2 + i * c->stride, xa, c->k, &d);
		g = sat32(rshr(d.a[0], Q_W));
		u = sat32(rshr(d.a[1], Q_W));

		*y = swiglu(g, u, ARENA_PTR(const u32, c->tab));
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

	USE_ARENA(arena);
	if (!q24_cols_ok(a->k) || !batch_ok(a->nb))
		return 1;
	return (int)bpf_loop(a->nrows, gate_up_row, &c, 0) < 0;
}

#endif /* QB_ARRAY_LAYER */

struct swiglu_args {
	u64 gate;  /* s32 Q16 [n]: gate_proj . x */
	u64 up;    /* s32 Q16 [n]: up_proj . x */
	u64 y;     /* s32 Q16 [n], out: silu(gate) * up; may equal gate or up */
	u64 exp2;  /* u32 Q30 [257] */
	u32 n, pad;
};

struct swiglu_walk {
	QB_VEC_T(const s32) g;
	QB_VEC_T(const s32) u;
	QB_VEC_T(s32) y;
	QB_VEC_T(const u32) tab;
};

static __always_inline int swiglu_step(struct swiglu_walk *c, u32 i)
{
	QB_IX(s32, c->y, i) = swiglu(QB_IX(const s32, c->g, i), QB_IX(const s32, c->u, i), c->tab);
	return 0;
}
QB_EACH_FN(swiglu_step, struct swiglu_walk)

/* silu(gate) * up elementwise, for stores whose projections run as separate matvecs. */
OP(swiglu_vec, struct swiglu_args)
{
	u32 n = a->n;
	struct swiglu_walk c = {
		.g = QB_VEC(const s32, arena, a->gate, n),
		.u = QB_VEC(const s32, arena, a->up, n),
		.y = QB_VEC(s32, arena, a->y, n),
		.tab = QB_VEC(const u32, arena, a->exp2, EXP2_ENTRIES),
	};

	QB_MEM_USE(arena);
	if (!QB_VEC_OK(c.g) || !QB_VEC_OK(c.u) || !QB_VEC_OK(c.y) || !QB_VEC_OK(c.tab))
		return 1;
	return QB_EACH(swiglu_step, n, &c) ? 1 : 0;
}

#ifndef QB_ARRAY_LAYER
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

	USE_ARENA(arena);
	if (!q24_cols_ok(a->k))
		return 1;
	ret = bpf_loop((a->nrows + 1) / 2, rows_pair, &c, 0);
	a->best = c.best;
	a->best_val = c.best_val;
	return (int)ret < 0;
}

/* ------------------------------------------------------------------ attention */
#include "attention.inc.c"

/* ------------------------------------------------------------------ the tokenizer */
#include "tokenize.inc.c"

/* ------------------------------------------------------------------ low-bit SWAR kernels */
#include "swar.inc.c"

/* ------------------------------------------------------------------ screened LM-head argmax */
#include "argmax.inc.c"

/* ------------------------------------------------------------------ int8 KV-cache attention */
#include "kv8.inc.c"

_Static_assert(KV8_HD_MAX == LIM_HEAD_DIM_MAX, "kv8.inc.c's head_dim bound is limits.h's");

/* ------------------------------------------------------------------ the integer sampler */
#include "sample.inc.c"

/* ------------------------------------------------------------------ the plan interpreter */
#include "plan.inc.c"

/* ------------------------------------------------------------------ generation in the kernel */
#include "generate.inc.c"

/* ------------------------------------------------------------------ a kernel event starts it */
#include "event.inc.c"
#include "event_xdp.inc.c"

/* ------------------------------------------------------------------ the packet filter */
#include "filter.inc.c"
#include "filter_xdp.inc.c"

/* ------------------------------------------------------------------ constants shared with Rust */
#include "constants.inc.c"
#endif /* QB_ARRAY_LAYER */
