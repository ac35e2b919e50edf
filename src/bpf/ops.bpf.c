// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* Every operator of the Qwen3 forward pass, as SEC("syscall") programs run with test_run.
 *
 * Bulk data (weights, activations, KV cache, tables, logits) lives in one BPF arena that user
 * space fills through its mmap; each program's ctx carries only arena addresses and sizes.
 * Formats are in fixed.h; src/num/fixed.rs holds a Rust twin of every operator computing the
 * same integers. Long loops use open-coded iterators (bpf_for), so the verifier checks the
 * body once instead of once per iteration.
 *
 * One object, one arena: the operators below (the Q24 matrix kernels in q24.inc.c and the
 * low-bit SWAR kernels in swar.inc.c, included after SwiGLU), then six fragments (*.inc.c, not compiled on
 * their own) joined at the end in this order, each using what the ones before it define:
 *   tokenize.inc.c  the Qwen3 tokenizer: text -> ids (this file's arena; first, so that the
 *                   event path below can tokenize a request's text)
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
 * formats, embed, rmsnorm, qk_norm_rope, swiglu_vec, the Q24 and the SWAR kernels (issue 35). */
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

/* ------------------------------------------------------------------ SwiGLU */

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

/* ------------------------------------------------------------------ the Q24 matrix kernels */
#include "q24.inc.c"

/* ------------------------------------------------------------------ low-bit SWAR kernels */
#include "swar.inc.c"

/* ------------------------------------------------------------------ attention */
#include "attention.inc.c"

/* ------------------------------------------------------------------ screened LM-head argmax */
#include "argmax.inc.c"

/* ------------------------------------------------------------------ int8 KV-cache attention */
#include "kv8.inc.c"

_Static_assert(KV8_HD_MAX == LIM_HEAD_DIM_MAX, "kv8.inc.c's head_dim bound is limits.h's");

/* ------------------------------------------------------------------ the tokenizer */
#include "tokenize.inc.c"

/* ------------------------------------------------------------------ the integer sampler */
#include "sample.inc.c"

/* ------------------------------------------------------------------ the plan interpreter */
#include "plan.inc.c"

/* ------------------------------------------------------------------ generation in the kernel */
#include "generate.inc.c"

/* The array memory layer (issue 35) builds, so far, only the programs above; the others follow
 * step by step (docs/plans/array-layer.md). */
#ifndef QB_ARRAY_LAYER
/* ------------------------------------------------------------------ a kernel event starts it */
#include "event.inc.c"
#include "event_xdp.inc.c"

/* ------------------------------------------------------------------ the packet filter */
#include "filter.inc.c"
#include "filter_xdp.inc.c"

/* ------------------------------------------------------------------ constants shared with Rust */
#include "constants.inc.c"
#endif /* QB_ARRAY_LAYER */
