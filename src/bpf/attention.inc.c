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

/* exp(s_t - m) in Q30, in place over one head's npos scores (s32 Q16, m their maximum);
 * returns their sum. Shared by the Q16 and int8 KV attention. npos <= max_ctx (at most the
 * arena holds, ~10^5) stays far below the can_loop budget. */
__noinline u64 softmax_exp(u64 pa, u64 tab_a, s64 m, u32 npos)
{
	u32 __arena *p = ARENA_PTR(u32, pa);
	const u32 __arena *tab = ARENA_PTR(const u32, tab_a);
	u64 sum = 0;

	for (u32 t = 0; t < npos && can_loop; t++) {
		u64 d = (u64)(m - (s64)(s32)p[t]);

		if (d > ACT_MAX)
			d = ACT_MAX;
		p[t] = (u32)exp_neg(d, tab);
		sum += p[t];
	}
	return sum;
}

/* One query head over positions 0..pos: scores, softmax, weighted sum of values. */
static __noinline int attend_head(struct attention_args *a, u32 h)
{
	u32 hd = a->hd, npos = a->pos + 1;
	u64 kvd4 = (u64)a->n_kv * a->hd * 4;
	u32 kvh = h / (a->n_q / a->n_kv);
	u64 q = a->q + (u64)h * hd * 4;
	u64 kc = a->k_cache + (u64)kvh * hd * 4;
	u64 vc = a->v_cache + (u64)kvh * hd * 4;
	u64 acc = a->acc + (u64)h * hd * 8;
	u32 __arena *p = ARENA_PTR(u32, a->probs + (u64)h * a->max_ctx * 4);
	s64 __arena *accp = ARENA_PTR(s64, acc);
	s32 __arena *out = ARENA_PTR(s32, a->out + (u64)h * hd * 4);
	s64 scale = a->scale_q22, m = -ACT_MAX;
	u64 sum = 0;

	/* 1. scores s_t = (q . k_t) * hd^-0.5 in Q16, kept (as s32) in p; their maximum m */
	FOR(t, 0, npos) {
		s64 s = attn_score(rshr(dot_head(q, kc + t * kvd4, hd), Q_Q), scale); /* Q16 */

		p[t] = (u32)(s32)s;
		if (s > m)
			m = s;
	}
	/* 2. unnormalised probabilities exp(s_t - m) in Q30 and their sum */
	sum = softmax_exp(a->probs + (u64)h * a->max_ctx * 4, a->exp2, m, npos);
	/* 3. normalised probabilities (Q30) times values, accumulated per dimension */
	FOR(d, 0, hd)
		accp[d] = 0;
	FOR(t, 0, npos)
		axpy_head(acc, vc + t * kvd4, (s64)(((u64)p[t] << Q_ONE) / sum), hd);
	FOR(d, 0, hd)
		out[d] = sat32(rshr(accp[d], Q_ONE));
	return 0;
}

/* Causal GQA attention at position pos for kv heads [kv0, kv1): append their columns of this
 * position's k and v to the layer's cache, then attend their query heads (head h reads kv head
 * h / (n_q / n_kv)). Parts with disjoint kv-head ranges touch disjoint cache columns, scratch
 * and outputs, so that threads can run them at once. */
OP(attention, struct attention_args)
{
	u32 kvd = a->n_kv * a->hd, hd = a->hd, kv0 = a->kv0, kv1 = a->kv1, g;
	const s32 __arena *k = ARENA_PTR(const s32, a->k);
	const s32 __arena *v = ARENA_PTR(const s32, a->v);
	s32 __arena *kc = ARENA_PTR(s32, a->k_cache + (u64)a->pos * kvd * 4);
	s32 __arena *vc = ARENA_PTR(s32, a->v_cache + (u64)a->pos * kvd * 4);

	USE_ARENA(arena);
	if (a->pos >= a->max_ctx || a->n_kv == 0 || a->n_q % a->n_kv || hd > LIM_HEAD_DIM_MAX)
		return 1;
	if (kv0 >= kv1 || kv1 > a->n_kv)
		return 1;
	g = a->n_q / a->n_kv;
	FOR(i, kv0 * hd, kv1 * hd) {
		kc[i] = k[i];
		vc[i] = v[i];
	}
	FOR(h, kv0 * g, kv1 * g)
		attend_head(a, h);
	return 0;
}
