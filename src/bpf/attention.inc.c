// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* Causal GQA attention over the Q16 KV cache (the int8 cache is kv8.inc.c): one query head at a
 * time, scores, softmax and the weighted sum of values. Included by ops.bpf.c after the matvec
 * section, whose helpers it uses. */
#pragma once


struct attention_args {
	u64 q;       /* s32 Q22 [n_q][hd]: after q_norm and RoPE */
	u64 k;       /* s32 Q16 [n_kv][hd]: this position's key, after k_norm and RoPE */
	u64 v;       /* s32 Q16 [n_kv][hd]: this position's value */
	u64 k_cache; /* s32 Q16 [max_ctx][n_kv][hd] of this layer */
	u64 v_cache; /* s32 Q16 [max_ctx][n_kv][hd] */
	u64 probs;   /* u32 Q30 [n_q][max_ctx] scratch */
	u64 acc;     /* s64 [n_q][hd] scratch */
	u64 out;     /* s32 Q16 [n_q][hd], out */
	u64 exp2;    /* u32 Q30 [257] */
	u32 pos, max_ctx, n_q, n_kv, hd;
	s32 scale_q22; /* round(hd^-0.5 * 2^22) */
	u32 kv0, kv1;  /* this run's kv heads [kv0, kv1) and their query heads: a thread's part */
};

#ifndef QB_ARRAY_LAYER
/* q . k over hd (<= 512) dimensions, Q22 x Q16 -> Q38 (a global function, verified once). Four
 * columns per step into four sums (the same total: the sums wrap mod 2^64 like the twin's),
 * then the remainder. */
__noinline s64 dot_head(u64 qa, u64 ka, u32 hd)
{
	const s32 __arena *q = ARENA_PTR(const s32, qa);
	const s32 __arena *k = ARENA_PTR(const s32, ka);
	u64 d0 = 0, d1 = 0, d2 = 0, d3 = 0;
	u32 d = 0;

	for (; d + 4 <= hd && can_loop; d += 4) {
		d0 += (s64)q[0] * k[0];
		d1 += (s64)q[1] * k[1];
		d2 += (s64)q[2] * k[2];
		d3 += (s64)q[3] * k[3];
		q += 4;
		k += 4;
	}
	for (; d < hd && can_loop; d++) {
		d0 += (s64)*q * *k;
		q++;
		k++;
	}
	return (s64)(d0 + d1 + d2 + d3);
}

/* acc[d] += p * v[d] over hd (<= 512) dimensions, four per step. */
__noinline int axpy_head(u64 acca, u64 va, s64 p, u32 hd)
{
	s64 __arena *acc = ARENA_PTR(s64, acca);
	const s32 __arena *v = ARENA_PTR(const s32, va);
	u32 d = 0;

	for (; d + 4 <= hd && can_loop; d += 4) {
		acc[0] += p * v[0];
		acc[1] += p * v[1];
		acc[2] += p * v[2];
		acc[3] += p * v[3];
		acc += 4;
		v += 4;
	}
	for (; d < hd && can_loop; d++) {
		*acc += p * *v;
		acc++;
		v++;
	}
	return 0;
}
#else
/* dot_head and axpy_head of the array build: the same sums over checked vectors, as loops
 * bounded by constants (LIM_HEAD_DIM_MAX; global functions, verified once, whose loop exits lead
 * straight to the return). barrier_var keeps clang from folding the two exits into one test
 * against min(hd, 512), a bound the verifier cannot follow. Vectors the operator did not check
 * give 0 and change nothing (it checks them). */
__noinline s64 dot_head(u64 qa, u64 ka, u32 hd)
{
	QB_VEC_T(const s32) q = QB_VEC(const s32, arena, qa, hd);
	QB_VEC_T(const s32) k = QB_VEC(const s32, arena, ka, hd);
	u64 sum = 0; /* one sum, two columns a step: the same total mod 2^64, and few registers */
	u32 d = 0;

	if (hd > LIM_HEAD_DIM_MAX || !QB_VEC_OK(q) || !QB_VEC_OK(k))
		return 0;
	for (; d < LIM_HEAD_DIM_MAX; d += 2) {
		barrier_var(hd);
		if (d + 2 > hd)
			break;
		sum += (u64)((s64)QB_IX(const s32, q, d) * QB_IX(const s32, k, d));
		sum += (u64)((s64)QB_IX(const s32, q, d + 1) * QB_IX(const s32, k, d + 1));
	}
	if (d < hd)
		sum += (u64)((s64)QB_IX(const s32, q, d) * QB_IX(const s32, k, d));
	return (s64)sum;
}

__noinline int axpy_head(u64 acca, u64 va, s64 p, u32 hd)
{
	QB_VEC_T(s64) acc = QB_VEC(s64, arena, acca, hd);
	QB_VEC_T(const s32) v = QB_VEC(const s32, arena, va, hd);

	if (hd > LIM_HEAD_DIM_MAX || !QB_VEC_OK(acc) || !QB_VEC_OK(v))
		return 1;
	for (u32 d = 0; d < LIM_HEAD_DIM_MAX; d++) {
		barrier_var(hd);
		if (d >= hd)
			break;
		QB_IX(s64, acc, d) += p * QB_IX(const s32, v, d);
	}
	return 0;
}
#endif

/* exp(s_t - m) in Q30, in place over one head's npos scores (s32 Q16, m their maximum);
 * returns their sum. Shared by the Q16 and int8 KV attention. npos <= max_ctx (at most the
 * arena holds, ~10^5) stays far below the can_loop budget. */
struct exp_walk {
	QB_VEC_T(u32) p;
	QB_VEC_T(const u32) tab;
	s64 m;
	u64 sum;
};

static __always_inline int exp_step(struct exp_walk *c, u32 t)
{
	u64 d = (u64)(c->m - (s64)(s32)QB_IX(u32, c->p, t));

	if (d > ACT_MAX)
		d = ACT_MAX;
	QB_IX(u32, c->p, t) = (u32)exp_neg(d, c->tab);
	c->sum += QB_IX(u32, c->p, t);
	return 0;
}
QB_EACH_FN(exp_step, struct exp_walk)

__noinline u64 softmax_exp(u64 pa, u64 tab_a, s64 m, u32 npos)
{
	struct exp_walk c = { .p = QB_VEC(u32, arena, pa, npos),
			      .tab = QB_VEC(const u32, arena, tab_a, EXP2_ENTRIES), .m = m };

	if (!QB_VEC_OK(c.p) || !QB_VEC_OK(c.tab))
		return 0;
	QB_EACH(exp_step, npos, &c);
	return c.sum;
}

/* The position, dimension and head loops: open-coded iterators over the arena (the arena
 * build's loops as they were: its `attention` verified in 1,000,001 instructions on 7.3.4 with
 * QB_EACH's can_loop loops), QB_EACH on arrays. A step's result is ignored, as before. */
#ifndef QB_ARRAY_LAYER
#define ATT_EACH(fn, n, c)                                                                  \
	({                                                                                  \
		FOR(i_, 0, n)                                                               \
			fn((c), i_);                                                        \
		0;                                                                          \
	})
#else
#define ATT_EACH(fn, n, c) QB_EACH(fn, n, c)
#endif

/* One query head's walk: its query (q), its kv head's cache columns (kc, vc, kvd4 bytes a
 * position), its accumulator (acc); p its scores, then probabilities, [npos]. */
struct head_walk {
	u64 q, kc, vc, acc, kvd4;
	QB_VEC_T(u32) p;
	QB_VEC_T(s64) accp;
	QB_VEC_T(s32) out;
	s64 scale, m;
	u64 sum;
	u32 hd;
};

/* 1. score s_t = (q . k_t) * hd^-0.5 in Q16, kept (as s32) in p; their maximum m */
static __always_inline int score_step(struct head_walk *c, u32 t)
{
	s64 s = attn_score(rshr(dot_head(c->q, c->kc + t * c->kvd4, c->hd), Q_Q), c->scale);

	QB_IX(u32, c->p, t) = (u32)(s32)s;
	if (s > c->m)
		c->m = s;
	return 0;
}
QB_EACH_FN(score_step, struct head_walk)

static __always_inline int zero_step(struct head_walk *c, u32 d)
{
	QB_IX(s64, c->accp, d) = 0;
	return 0;
}
QB_EACH_FN(zero_step, struct head_walk)

/* 3. normalised probability t (Q30) times value t, accumulated per dimension */
static __always_inline int axpy_step(struct head_walk *c, u32 t)
{
	axpy_head(c->acc, c->vc + t * c->kvd4, (s64)(((u64)QB_IX(u32, c->p, t) << Q_ONE) / c->sum),
		  c->hd);
	return 0;
}
QB_EACH_FN(axpy_step, struct head_walk)

static __always_inline int out_step(struct head_walk *c, u32 d)
{
	QB_IX(s32, c->out, d) = sat32(rshr(QB_IX(s64, c->accp, d), Q_ONE));
	return 0;
}
QB_EACH_FN(out_step, struct head_walk)

/* One query head over positions 0..pos: scores, softmax, weighted sum of values. */
static __noinline int attend_head(struct attention_args *a, u32 h)
{
	u32 hd = a->hd, npos = a->pos + 1;
	u64 probs = a->probs + (u64)h * a->max_ctx * 4, acc = a->acc + (u64)h * hd * 8;
	struct head_walk c = {
		.q = a->q + (u64)h * hd * 4,
		.kc = a->k_cache + (u64)(h / (a->n_q / a->n_kv)) * hd * 4,
		.vc = a->v_cache + (u64)(h / (a->n_q / a->n_kv)) * hd * 4,
		.acc = acc,
		.kvd4 = (u64)a->n_kv * a->hd * 4,
		.p = QB_VEC(u32, arena, probs, npos),
		.accp = QB_VEC(s64, arena, acc, hd),
		.out = QB_VEC(s32, arena, a->out + (u64)h * hd * 4, hd),
		.scale = a->scale_q22,
		.m = -ACT_MAX,
		.hd = hd,
	};

	if (!QB_VEC_OK(c.p) || !QB_VEC_OK(c.accp) || !QB_VEC_OK(c.out))
		return 1;
	ATT_EACH(score_step, npos, &c);
	/* 2. unnormalised probabilities exp(s_t - m) in Q30 and their sum */
	c.sum = softmax_exp(probs, a->exp2, c.m, npos);
	ATT_EACH(zero_step, hd, &c);
	ATT_EACH(axpy_step, npos, &c);
	ATT_EACH(out_step, hd, &c);
	return 0;
}

/* This position's key and value (k, v) into their row of the caches (kc, vc), columns i0.. */
struct append_walk {
	QB_VEC_T(const s32) k;
	QB_VEC_T(const s32) v;
	QB_VEC_T(s32) kc;
	QB_VEC_T(s32) vc;
	u32 i0;
};

static __always_inline int append_step(struct append_walk *c, u32 i)
{
	QB_IX(s32, c->kc, c->i0 + i) = QB_IX(const s32, c->k, c->i0 + i);
	QB_IX(s32, c->vc, c->i0 + i) = QB_IX(const s32, c->v, c->i0 + i);
	return 0;
}
QB_EACH_FN(append_step, struct append_walk)

/* The query heads h0.. (a walk of its own, small: on 6.1 the stacks of the six frames down to
 * dot_head must fit in 512 bytes) */
struct heads_walk {
	struct attention_args *a;
	u32 h0, err;
};

static __always_inline int head_step(struct heads_walk *c, u32 i)
{
	c->err = attend_head(c->a, c->h0 + i);
	return c->err;
}
QB_EACH_FN(head_step, struct heads_walk)

/* Whether every buffer of the attention lies in one element (always, in the arena). */
static __always_inline int attention_ok(struct attention_args *a, u32 kvd)
{
#ifdef QB_ARRAY_LAYER
	u64 qd = (u64)a->n_q * a->hd, cache = (u64)a->max_ctx * kvd;

	return QB_VEC_OK(QB_VEC(const s32, arena, a->q, qd)) &&
	       QB_VEC_OK(QB_VEC(const s32, arena, a->k_cache, cache)) &&
	       QB_VEC_OK(QB_VEC(const s32, arena, a->v_cache, cache)) &&
	       QB_VEC_OK(QB_VEC(u32, arena, a->probs, (u64)a->n_q * a->max_ctx)) &&
	       QB_VEC_OK(QB_VEC(s64, arena, a->acc, qd)) && QB_VEC_OK(QB_VEC(s32, arena, a->out, qd)) &&
	       QB_VEC_OK(QB_VEC(const u32, arena, a->exp2, EXP2_ENTRIES));
#else
	return 1;
#endif
}

/* Appends this position's key and value, columns [kv0 hd, kv1 hd), to the caches' row pos. A
 * function of its own, so that its walk stays off the stack of the head loop's call chain. */
static __noinline int attention_append(struct attention_args *a)
{
	u32 kvd = a->n_kv * a->hd;
	struct append_walk c = {
		.k = QB_VEC(const s32, arena, a->k, kvd),
		.v = QB_VEC(const s32, arena, a->v, kvd),
		.kc = QB_VEC(s32, arena, a->k_cache + (u64)a->pos * kvd * 4, kvd),
		.vc = QB_VEC(s32, arena, a->v_cache + (u64)a->pos * kvd * 4, kvd),
		.i0 = a->kv0 * a->hd,
	};

	if (!QB_VEC_OK(c.k) || !QB_VEC_OK(c.v) || !QB_VEC_OK(c.kc) || !QB_VEC_OK(c.vc))
		return 1;
	ATT_EACH(append_step, (a->kv1 - a->kv0) * a->hd, &c);
	return 0;
}

/* Causal GQA attention at position pos for kv heads [kv0, kv1): append their columns of this
 * position's k and v to the layer's cache, then attend their query heads (head h reads kv head
 * h / (n_q / n_kv)). Parts with disjoint kv-head ranges touch disjoint cache columns, scratch
 * and outputs, so that threads can run them at once. */
OP(attention, struct attention_args)
{
	u32 hd = a->hd, kv0 = a->kv0, kv1 = a->kv1, g;
	struct heads_walk h = { .a = a };

	QB_MEM_USE(arena);
	if (a->pos >= a->max_ctx || a->n_kv == 0 || a->n_q % a->n_kv || hd > LIM_HEAD_DIM_MAX)
		return 1;
	if (kv0 >= kv1 || kv1 > a->n_kv)
		return 1;
	if (!attention_ok(a, a->n_kv * hd) || attention_append(a))
		return 1;
	g = a->n_q / a->n_kv;
	h.h0 = kv0 * g;
	return ATT_EACH(head_step, (kv1 - kv0) * g, &h) || h.err;
}
