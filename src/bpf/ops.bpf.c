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
 *   event.inc.c     a datagram starts a generation (generate.inc.c's loop, on a bpf_wq) */
#include "fixed.h"

/* A GPL-compatible licence: the arena kfuncs and bpf_wq are GPL-only. */
char LICENSE[] SEC("license") = "Dual MIT/GPL";

QB_ARENA(arena);

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

/* x = embed_tokens[token], Q24 -> Q32 (exact). */
OP(embed, struct embed_args)
{
	const s32 __arena *e = ARENA_PTR(const s32, a->table + (u64)a->token * a->dim * 4);
	s64 __arena *x = ARENA_PTR(s64, a->x);

	USE_ARENA(arena);
	LOOP(i, 0, a->dim)
		x[i] = (s64)e[i] << (Q_RES - Q_W);
	return 0;
}

/* ------------------------------------------------------------------ RMSNorm */

/* Element i of x as a Q32 s64: x is either the s64 Q32 residual stream (wide) or s32 Q16. */
static __always_inline s64 load_q32(u64 xa, u32 i, u32 wide)
{
	return wide ? ARENA_PTR(const s64, xa)[i] : (s64)ARENA_PTR(const s32, xa)[i] << (Q_RES - Q_ACT);
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

/* max |x_i| over the n = nqw & 0xffff elements (<= LIM_NORM_MAX) of x (see load_q32). Global
 * functions, so that the verifier does not carry the sums' precision, which the shifts computed
 * from them need, back into the loops (it could then not prove the loops' states equal). */
__noinline u64 vec_maxabs(u64 xa, u32 nqw)
{
	u32 n = nqw & 0xffff, wide = (nqw & WIDE) != 0;
	u64 maxabs = 0;

	LOOP(i, 0, n) {
		s64 xi = load_q32(xa, i, wide);
		u64 ax = xi < 0 ? -xi : xi;

		if (ax > maxabs)
			maxabs = ax;
	}
	return maxabs;
}

/* sum of (|x_i| >> s)^2 over the n elements of x, as vec_maxabs. */
__noinline u64 vec_sumsq(u64 xa, u32 nqw, u32 s)
{
	u32 n = nqw & 0xffff, wide = (nqw & WIDE) != 0;
	u64 ss = 0;

	LOOP(i, 0, n) {
		s64 xi = load_q32(xa, i, wide);
		u64 ax = (xi < 0 ? -xi : xi) >> (s & 63);

		ss += ax * ax;
	}
	return ss;
}
static __noinline int rmsnorm_vec(u64 xa, u64 wa, u64 ya, u32 nqw, u64 eps_q64)
{
	u32 n = nqw & 0xffff, q_out = (nqw >> 16) & 31, wide = (nqw & WIDE) != 0;
	const s32 __arena *w = ARENA_PTR(const s32, wa);
	s32 __arena *y = ARENA_PTR(s32, ya);
	u64 maxabs = 0, ss = 0, v, r, inv;
	u32 s = 0, e;

	if (n == 0 || n > LIM_NORM_MAX)
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
	LOOP(i, 0, n) {
		s64 nrm = rshr((load_q32(xa, i, wide) >> s) * (s64)inv, (38 - e) & 63); /* Q24 */

		y[i] = sat32(rshr(nrm * (s64)w[i], (Q_NRM + Q_NORM - q_out) & 63));
	}
	return 0;
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

/* RMSNorm of nvec consecutive vectors with one weight: hidden-wide (nvec = 1) or per head. */
OP(rmsnorm, struct rmsnorm_args)
{
	u64 x = a->x, w = a->w, y = a->y, eps = a->eps_q64, stride = (u64)a->n * 4;
	u32 n = a->n, wide = a->wide != 0;
	int ret = 0;

	USE_ARENA(arena);
	/* n travels in 16 bits of rmsnorm_vec's nqw: check it before it is packed */
	if (n == 0 || n > LIM_NORM_MAX) {
		a->ret = 1;
		return 1;
	}
	FOR(h, 0, a->nvec)
		ret |= rmsnorm_vec(x + h * stride * (1 + wide), w, y + h * stride, NQW(n, Q_ACT, wide), eps);
	a->ret = ret;
	return ret;
}

/* ------------------------------------------------------------------ RoPE */

/* Rotates one head in place: pairs (i, i + half), cos/sin Q30 [half] for this position. */
static __noinline int rope_vec(u64 xa, u64 ca, u64 sa, u32 half)
{
	s32 __arena *x = ARENA_PTR(s32, xa);
	const s32 __arena *c = ARENA_PTR(const s32, ca);
	const s32 __arena *s = ARENA_PTR(const s32, sa);

	FOR(i, 0, half) {
		s64 a = x[i], b = x[i + half], ci = c[i], si = s[i];

		x[i] = sat32(rshr(a * ci - b * si, Q_ONE));
		x[i + half] = sat32(rshr(b * ci + a * si, Q_ONE));
	}
	return 0;
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

/* Qwen3's per-head q_norm / k_norm, then RoPE (rotate_half pairing i with i + hd/2). */
OP(qk_norm_rope, struct qk_norm_rope_args)
{
	/* ctx fields are read once into registers: the verifier forbids ctx loads at offsets that
	 * clang would otherwise compute from a select between two fields. */
	u64 q = a->q, k = a->k, qn = a->q_norm, kn = a->k_norm, cs = a->cos, sn = a->sin;
	u64 eps = a->eps_q64, stride = (u64)a->hd * 4;
	u32 hd = a->hd, n_q = a->n_q, n_all = a->n_q + a->n_k;
	int ret = 0;

	if (hd == 0 || hd > LIM_NORM_MAX) {
		a->ret = 1;
		return 1;
	}

	OPAQUE(q);
	OPAQUE(k);
	OPAQUE(qn);
	OPAQUE(kn);
	USE_ARENA(arena);
	FOR(h, 0, n_all) {
		int is_q = h < n_q;
		u64 v = is_q ? q + h * stride : k + (h - n_q) * stride;

		ret |= rmsnorm_vec(v, is_q ? qn : kn, v, NQW(hd, is_q ? Q_Q : Q_ACT, 0), eps);
		rope_vec(v, cs, sn, hd / 2);
	}
	a->ret = ret;
	return ret;
}

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

struct swiglu_args {
	u64 gate;  /* s32 Q16 [n]: gate_proj . x */
	u64 up;    /* s32 Q16 [n]: up_proj . x */
	u64 y;     /* s32 Q16 [n], out: silu(gate) * up; may equal gate or up */
	u64 exp2;  /* u32 Q30 [257] */
	u32 n, pad;
};

/* silu(gate) * up elementwise, for stores whose projections run as separate matvecs. */
OP(swiglu_vec, struct swiglu_args)
{
	const s32 __arena *g = ARENA_PTR(const s32, a->gate);
	const s32 __arena *u = ARENA_PTR(const s32, a->up);
	const u32 __arena *tab = ARENA_PTR(const u32, a->exp2);
	s32 __arena *y = ARENA_PTR(s32, a->y);

	USE_ARENA(arena);
	LOOP(i, 0, a->n)
		y[i] = swiglu(g[i], u[i], tab);
	return 0;
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

/* Every constant that C and Rust both use beyond fixed.h and limits.h (which `formats`
 * reports): the plan's format, the event path's datagram and records, generation's statuses,
 * the SWAR and int8-KV kernels' bounds, the filter's. tests/constants.rs compares each with its Rust mirror. */
struct constants_args {
	u32 plan_args_words, plan_patches, plan_threads_max, plan_sync, plan_head;
	u32 plan_var_token, plan_var_pos, op_count;
	s32 plan_e_barrier, plan_e_args;
	u32 ev_slots_max, ev_prompt_max, ev_magic, ev_sources_max;
	u32 rec_token, rec_done, rec_refused;
	u32 ev_r_busy, ev_r_malformed, ev_r_token, ev_r_limit, ev_r_unknown, ev_r_offset;
	u32 ev_poll_magic, ev_reply_magic, ev_k_accepted, ev_k_refused, ev_k_text, ev_k_final;
	u32 ev_text_reply_max, ev_poll_min, ev_r_utf8, ev_text_magic, ev_text_in_max, ev_tf_chat;
	u32 ev_r_source, ev_reasons;
	u32 gen_stops_max, gen_text_max, gen_more, gen_stop, gen_max, gen_full;
	u32 sw_group, sw_scale_shift, sw_kmax;
	u32 kv8_qmax, kv8_hd_max;
	u32 slot_bytes;
	u32 sample_one, sample_params_bytes, sample_args_bytes;
	s32 sample_e_param, sample_e_loop;
	u32 tok_magic, tok_scratch_bytes, tok_args_bytes;
	s32 tok_e_text, tok_e_ids, tok_e_utf8, tok_e_cps, tok_e_word, tok_e_marks, tok_e_tables;
	s32 tok_e_budget;
	u32 flt_suffix_max, flt_steps_max, flt_flows, flt_name_max, flt_excerpt;
	u32 flt_pass, flt_drop, flt_count, flt_slots_max;
	s32 flt_more;
	char op_names[256]; /* PLAN_OP_NAMES, NUL-terminated */
};

static const char plan_op_names[] = PLAN_OP_NAMES;
_Static_assert(sizeof(plan_op_names) <= sizeof(((struct constants_args *)0)->op_names),
	       "the op names fit the report");

SEC("syscall")
int constants(struct constants_args *a)
{
	a->plan_args_words = PLAN_ARGS_WORDS;
	a->plan_patches = PLAN_PATCHES;
	a->plan_threads_max = PLAN_THREADS_MAX;
	a->plan_sync = PLAN_SYNC;
	a->plan_head = PLAN_HEAD;
	a->plan_var_token = PLAN_VAR_TOKEN;
	a->plan_var_pos = PLAN_VAR_POS;
	a->op_count = OP_COUNT;
	a->plan_e_barrier = PLAN_E_BARRIER;
	a->plan_e_args = PLAN_E_ARGS;
	a->ev_slots_max = EV_SLOTS_MAX;
	a->ev_prompt_max = EV_PROMPT_MAX;
	a->ev_magic = EV_MAGIC;
	a->ev_sources_max = EV_SOURCES_MAX;
	a->rec_token = REC_TOKEN;
	a->rec_done = REC_DONE;
	a->rec_refused = REC_REFUSED;
	a->ev_r_busy = EV_R_BUSY;
	a->ev_r_malformed = EV_R_MALFORMED;
	a->ev_r_token = EV_R_TOKEN;
	a->ev_r_limit = EV_R_LIMIT;
	a->ev_r_unknown = EV_R_UNKNOWN;
	a->ev_r_offset = EV_R_OFFSET;
	a->ev_poll_magic = EV_POLL_MAGIC;
	a->ev_reply_magic = EV_REPLY_MAGIC;
	a->ev_k_accepted = EV_K_ACCEPTED;
	a->ev_k_refused = EV_K_REFUSED;
	a->ev_k_text = EV_K_TEXT;
	a->ev_k_final = EV_K_FINAL;
	a->ev_text_reply_max = EV_TEXT_REPLY_MAX;
	a->ev_poll_min = EV_POLL_MIN;
	a->ev_r_utf8 = EV_R_UTF8;
	a->ev_text_magic = EV_TEXT_MAGIC;
	a->ev_text_in_max = EV_TEXT_IN_MAX;
	a->ev_tf_chat = EV_TF_CHAT;
	a->ev_r_source = EV_R_SOURCE;
	a->ev_reasons = EV_REASONS;
	a->gen_stops_max = GEN_STOPS_MAX;
	a->gen_text_max = GEN_TEXT_MAX;
	a->gen_more = GEN_MORE;
	a->gen_stop = GEN_STOP;
	a->gen_max = GEN_MAX;
	a->gen_full = GEN_FULL;
	a->sw_group = SW_GROUP;
	a->sw_scale_shift = SW_SCALE_SHIFT;
	a->sw_kmax = SW_KMAX;
	a->kv8_qmax = KV8_QMAX;
	a->kv8_hd_max = KV8_HD_MAX;
	a->slot_bytes = sizeof(struct plan_slot);
	a->sample_one = SAMPLE_ONE;
	a->sample_params_bytes = sizeof(struct qb_sample_params);
	a->sample_args_bytes = sizeof(struct qb_sample_args);
	a->sample_e_param = SAMPLE_E_PARAM;
	a->sample_e_loop = SAMPLE_E_LOOP;
	a->tok_magic = TOK_MAGIC;
	a->tok_scratch_bytes = TOK_SCRATCH_BYTES;
	a->tok_args_bytes = sizeof(struct tokenize_args);
	a->tok_e_text = TOK_E_TEXT;
	a->tok_e_ids = TOK_E_IDS;
	a->tok_e_utf8 = TOK_E_UTF8;
	a->tok_e_cps = TOK_E_CPS;
	a->tok_e_word = TOK_E_WORD;
	a->tok_e_marks = TOK_E_MARKS;
	a->tok_e_tables = TOK_E_TABLES;
	a->tok_e_budget = TOK_E_BUDGET;
	a->flt_suffix_max = FLT_SUFFIX_MAX;
	a->flt_steps_max = FLT_STEPS_MAX;
	a->flt_flows = FLT_FLOWS;
	a->flt_name_max = FLT_NAME_MAX;
	a->flt_excerpt = FLT_EXCERPT;
	a->flt_pass = FLT_PASS;
	a->flt_drop = FLT_DROP;
	a->flt_count = FLT_COUNT;
	a->flt_slots_max = FLT_SLOTS_MAX;
	a->flt_more = FLT_MORE;
	for (u32 i = 0; i < sizeof(plan_op_names); i++)
		a->op_names[i] = plan_op_names[i];
	return 0;
}
