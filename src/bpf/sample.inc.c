// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* The sampler, in integers: the next token drawn from the Q16 logits the LM head wrote. Joined
 * into ops.bpf.c after kv8.inc.c and before plan.inc.c (it uses fixed.h's exp_neg and the arena;
 * generate.inc.c and event.inc.c, joined later, call it). src/num/sample.rs is its Rust twin,
 * computing the same integers; docs/sampling.md has the spec.
 *
 * op_sample(struct qb_sample_args *) (also the `sample` program, for tests): in llama.cpp's order,
 *   1. penalties (counts[i]: how often token i was seen; none when counts is 0): a seen token's
 *      logit v becomes v * 2^16 / rep (v > 0) or v * rep / 2^16 (v <= 0), rounded, minus
 *      presence + count * frequency, clamped to +-ACT_MAX; written back into logits;
 *   2. vmax, the largest penalised logit, and d[i] = vmax - v[i] (u32): every later step orders
 *      tokens by (d, id), best first, so ties go to the lower id;
 *   3. temperature 0: the first token with d = 0 (greedy), no draw; else
 *   4. top-k: the k best (by a radix select on d, below);
 *   5. top-p over what top-k kept, at temperature 1: with w1 = exp(-d) in Q30 (exp_neg) and
 *      S1 their sum, the shortest best-first prefix whose w1 reach floor(S1 * top_p / 2^16);
 *   6. min-p: only tokens with w1 >= min_p * 2^14 (min_p Q16, w1 of the best is 2^30);
 *   7. draw: weights wT = exp(-d / T) in Q30, S their sum over the kept tokens, r the next
 *      splitmix64 output mod S; the token is the first, in id order, where the running sum of
 *      wT passes r.
 * The cut of steps 4 and 5 is a radix select: three passes histogram d's bits (11, 11, 10) into
 * LIM_SAMPLE_BUCKETS u64 masses (hist, arena), each time keeping the bucket where the running
 * mass reaches the target; a fourth pass walks the ties at the cut value in id order. So the
 * whole vocabulary is handled in a bounded number of passes, without sorting. Every pass is a
 * global function of its own, so that each loop over n <= LIM_VOCAB_MAX has its own can_loop
 * budget (a pass that ran out of it returns an error instead of a short answer). */
#pragma once

#define SAMPLE_ONE (1U << 16) /* 1.0 in Q16 */
#define SAMPLE_E_PARAM (-10)  /* a parameter out of range (what src/num/sample.rs refuses) */
#define SAMPLE_E_LOOP (-11)   /* a pass stopped early, or a select found no cut */

/* The sampling parameters, fixed point (src/num/sample.rs: Params). */
struct qb_sample_params {
	u32 temp_q16;      /* temperature, 0 (greedy) or LIM_SAMPLE_TEMP_MIN..MAX */
	u32 top_k;         /* 0 or >= n: off */
	u32 top_p_q16;     /* 1..SAMPLE_ONE; SAMPLE_ONE: off */
	u32 min_p_q16;     /* 0..SAMPLE_ONE; 0: off */
	u32 rep_q16;       /* repetition penalty, LIM_SAMPLE_REP_MIN..MAX; SAMPLE_ONE: off */
	s32 presence_q16;  /* |.| <= LIM_SAMPLE_PEN_MAX */
	s32 frequency_q16; /* |.| <= LIM_SAMPLE_PEN_MAX */
};

/* One draw: inputs, the generator's state (in/out), the token (out), and the working state of
 * the passes (kept here so that every pass takes this one pointer). */
struct qb_sample_args {
	struct qb_sample_params p;
	u64 logits;   /* s32 Q16 [n] (arena), in/out: penalised in place */
	u64 counts;   /* u32 [n] (arena): times each token was seen; 0: no penalties */
	u64 hist;     /* u64 [LIM_SAMPLE_BUCKETS] (arena): scratch */
	u64 exp2;     /* u32 Q30 [257] (arena): the exp2 table */
	u64 rng;      /* in/out: splitmix64 state */
	u32 n;        /* logits */
	u32 token;    /* out */
	/* working state */
	s64 vmax;
	u64 inv_t;    /* round(2^32 / temp_q16): 1/T in Q16 */
	u64 target, below, total;
	u32 cut_d, cut_id;   /* kept: d < cut_d, or d == cut_d and id <= cut_id */
	u32 prefix, mode;    /* the select's prefix of d; SEL_COUNT or SEL_MASS */
};

#define SEL_COUNT 0 /* top-k: each token weighs 1, every token eligible */
#define SEL_MASS 1  /* top-p: each token weighs w1, only what top-k kept */

static __always_inline s32 sample_clamp(s64 v)
{
	return v > ACT_MAX ? ACT_MAX : v < -ACT_MAX ? -ACT_MAX : (s32)v;
}

/* Step 1 for one logit seen cnt > 0 times. */
static __always_inline s32 sample_penalise(s32 v, u32 cnt, const struct qb_sample_params *p)
{
	s64 x = v;
	u64 rep = p->rep_q16;

	if (rep != SAMPLE_ONE)
		x = x > 0 ? (s64)((((u64)x << 16) + rep / 2) / rep)
			  : -(s64)(((u64)(-x) * rep + (1U << 15)) >> 16);
	return sample_clamp(x - p->presence_q16 - (s64)cnt * p->frequency_q16);
}

#ifndef QB_ARRAY_LAYER
static __always_inline u32 sample_d(struct qb_sample_args *s, u32 i)
{
	return (u32)(s->vmax - ARENA_PTR(const s32, s->logits)[i]);
}

/* exp(-d) (w1) and exp(-d/T) (wT), Q30. */
static __always_inline u64 sample_w1(struct qb_sample_args *s, u32 d)
{
	return exp_neg(d > ACT_MAX ? ACT_MAX : d, ARENA_PTR(const u32, s->exp2));
}

static __always_inline u64 sample_wt(struct qb_sample_args *s, u32 d)
{
	u64 a = ((u64)d * s->inv_t) >> 16;

	return exp_neg(a > ACT_MAX ? ACT_MAX : a, ARENA_PTR(const u32, s->exp2));
}

static __always_inline int sample_kept(struct qb_sample_args *s, u32 d, u32 i)
{
	return d < s->cut_d || (d == s->cut_d && i <= s->cut_id);
}

/* Steps 1-3: penalties, vmax, and the greedy token (the first with the largest value). */
__noinline int sample_max(struct qb_sample_args *s __arg_nonnull)
{
	s32 __arena *l = ARENA_PTR(s32, s->logits);
	const u32 __arena *c = ARENA_PTR(const u32, s->counts);
	const struct qb_sample_params *p = &s->p;
	int pen = s->counts && (p->rep_q16 != SAMPLE_ONE || p->presence_q16 || p->frequency_q16);
	s64 best = -ACT_MAX - 1;
	u32 n = s->n, i, arg = 0;

	for (i = 0; i < n && can_loop; i++) {
		s32 v = l[i];

		if (pen && c[i]) {
			v = sample_penalise(v, c[i], p);
			l[i] = v;
		}
		if (v > best) {
			best = v;
			arg = i;
		}
	}
	s->vmax = best;
	s->token = arg;
	return i < n ? SAMPLE_E_LOOP : 0;
}

/* One level of the radix select: histogram the `bits` bits of d at `shift` over the eligible
 * tokens whose higher bits are the prefix, then keep the bucket where the mass reaches target. */
__noinline int sample_level(struct qb_sample_args *s __arg_nonnull, u32 shift, u32 bits)
{
	u64 __arena *h = ARENA_PTR(u64, s->hist);
	u32 n = s->n, nb = 1U << (bits & 15), i, b;
	u64 acc = s->below;

	if (nb > LIM_SAMPLE_BUCKETS || shift > 31)
		return SAMPLE_E_PARAM;
	for (b = 0; b < nb && can_loop; b++)
		h[b] = 0;
	for (i = 0; i < n && can_loop; i++) {
		u32 d = sample_d(s, i);

		if (((u64)d >> (shift + bits)) != s->prefix)
			continue;
		if (s->mode == SEL_COUNT)
			h[(d >> shift) & (nb - 1)] += 1;
		else if (sample_kept(s, d, i))
			h[(d >> shift) & (nb - 1)] += sample_w1(s, d);
	}
	if (i < n)
		return SAMPLE_E_LOOP;
	for (b = 0; b < nb && can_loop; b++) {
		u64 m = h[b];

		if (acc + m >= s->target)
			break;
		acc += m;
	}
	if (b >= nb)
		return SAMPLE_E_LOOP;
	s->prefix = (s->prefix << bits) | b;
	s->below = acc;
	return 0;
}

/* The select's last pass: the ties at d = prefix, in id order, up to the target. Sets the cut. */
__noinline int sample_ties(struct qb_sample_args *s __arg_nonnull)
{
	u32 n = s->n, i, tau = s->prefix;
	u64 acc = s->below;

	for (i = 0; i < n && can_loop; i++) {
		u32 d = sample_d(s, i);

		if (d != tau)
			continue;
		if (s->mode == SEL_COUNT)
			acc += 1;
		else if (sample_kept(s, d, i))
			acc += sample_w1(s, d);
		else
			continue;
		if (acc >= s->target) {
			s->cut_d = tau;
			s->cut_id = i;
			return 0;
		}
	}
	return SAMPLE_E_LOOP;
}

/* The radix select for mode and target (see the top). */
static __always_inline int sample_select(struct qb_sample_args *s, u32 mode, u64 target)
{
	s->mode = mode;
	s->target = target;
	s->prefix = 0;
	s->below = 0;
	if (sample_level(s, 21, 11) || sample_level(s, 10, 11) || sample_level(s, 0, 10))
		return SAMPLE_E_LOOP;
	return sample_ties(s);
}

/* S1 (mode SEL_MASS: w1 of what is kept) or S (wT of what is kept and passes min-p), into
 * s->total. */
__noinline int sample_sum(struct qb_sample_args *s __arg_nonnull, u32 tempered)
{
	u32 n = s->n, i;
	u64 sum = 0, minw = (u64)s->p.min_p_q16 << 14;

	for (i = 0; i < n && can_loop; i++) {
		u32 d = sample_d(s, i);

		if (!sample_kept(s, d, i))
			continue;
		if (!tempered)
			sum += sample_w1(s, d);
		else if (!s->p.min_p_q16 || sample_w1(s, d) >= minw)
			sum += sample_wt(s, d);
	}
	s->total = sum;
	return i < n ? SAMPLE_E_LOOP : 0;
}

/* Step 7's walk: the first kept token where the running sum of wT passes r. */
__noinline int sample_pick(struct qb_sample_args *s __arg_nonnull, u64 r)
{
	u32 n = s->n, i;
	u64 acc = 0, minw = (u64)s->p.min_p_q16 << 14;

	for (i = 0; i < n && can_loop; i++) {
		u32 d = sample_d(s, i);

		if (!sample_kept(s, d, i) || (s->p.min_p_q16 && sample_w1(s, d) < minw))
			continue;
		acc += sample_wt(s, d);
		if (acc > r) {
			s->token = i;
			return 0;
		}
	}
	return SAMPLE_E_LOOP;
}

#else
/* The array build (no can_loop before 6.9): every pass is a bpf_loop over the tokens, its
 * callback one token's step, on a walk that holds the pass's checked vectors. The steps compute
 * what the arena build's loops do, token for token; a vector that does not lie whole in one
 * element refuses the draw (SAMPLE_E_PARAM). */
struct sample_walk {
	struct qb_sample_args *s;
	QB_VEC_T(s32) l;          /* logits [n] */
	QB_VEC_T(const u32) c;    /* counts [n] (with penalties) */
	QB_VEC_T(u64) h;          /* hist [LIM_SAMPLE_BUCKETS] */
	QB_VEC_T(const u32) tab;  /* exp2 [257] */
	s64 best;
	u64 acc, minw, r;
	u32 arg, pen, shift, bits, nb, b, found, tempered;
};

/* The walk over s's vectors; 1 when one of them is not whole in an element. */
static __always_inline int sample_walk_init(struct sample_walk *w, struct qb_sample_args *s)
{
	w->s = s;
	w->l = QB_VEC(s32, arena, s->logits, s->n);
	w->c = QB_VEC(const u32, arena, s->counts ? s->counts : s->logits, s->n);
	w->h = QB_VEC(u64, arena, s->hist, LIM_SAMPLE_BUCKETS);
	w->tab = QB_VEC(const u32, arena, s->exp2, 257);
	w->acc = 0;
	w->found = 0;
	return !QB_VEC_OK(w->l) || !QB_VEC_OK(w->c) || !QB_VEC_OK(w->h) || !QB_VEC_OK(w->tab);
}

static __always_inline u32 sample_d(struct sample_walk *w, u32 i)
{
	return (u32)(w->s->vmax - QB_IX(s32, w->l, i));
}

static __always_inline u64 sample_w1(struct sample_walk *w, u32 d)
{
	return exp_neg(d > ACT_MAX ? ACT_MAX : d, w->tab);
}

static __always_inline u64 sample_wt(struct sample_walk *w, u32 d)
{
	u64 a = ((u64)d * w->s->inv_t) >> 16;

	return exp_neg(a > ACT_MAX ? ACT_MAX : a, w->tab);
}

static __always_inline int sample_kept(struct qb_sample_args *s, u32 d, u32 i)
{
	return d < s->cut_d || (d == s->cut_d && i <= s->cut_id);
}

static __always_inline int sample_max_step(struct sample_walk *w, u32 i)
{
	s32 v = QB_IX(s32, w->l, i);

	if (w->pen && QB_IX(const u32, w->c, i)) {
		v = sample_penalise(v, QB_IX(const u32, w->c, i), &w->s->p);
		QB_IX(s32, w->l, i) = v;
	}
	if (v > w->best) {
		w->best = v;
		w->arg = i;
	}
	return 0;
}
QB_EACH_FN(sample_max_step, struct sample_walk)

/* Steps 1-3 (see the arena build's sample_max). */
static __always_inline int sample_max(struct qb_sample_args *s)
{
	const struct qb_sample_params *p = &s->p;
	struct sample_walk w;

	if (sample_walk_init(&w, s))
		return SAMPLE_E_PARAM;
	w.pen = s->counts && (p->rep_q16 != SAMPLE_ONE || p->presence_q16 || p->frequency_q16);
	w.best = -ACT_MAX - 1;
	w.arg = 0;
	if (QB_EACH(sample_max_step, s->n, &w))
		return SAMPLE_E_LOOP;
	s->vmax = w.best;
	s->token = w.arg;
	return 0;
}

static __always_inline int sample_zero_step(struct sample_walk *w, u32 b)
{
	QB_IX(u64, w->h, b) = 0;
	return 0;
}
QB_EACH_FN(sample_zero_step, struct sample_walk)

static __always_inline int sample_hist_step(struct sample_walk *w, u32 i)
{
	struct qb_sample_args *s = w->s;
	u32 d = sample_d(w, i), b = (d >> w->shift) & (w->nb - 1);

	if (((u64)d >> (w->shift + w->bits)) != s->prefix)
		return 0;
	if (s->mode == SEL_COUNT)
		QB_IX(u64, w->h, b) += 1;
	else if (sample_kept(s, d, i))
		QB_IX(u64, w->h, b) += sample_w1(w, d);
	return 0;
}
QB_EACH_FN(sample_hist_step, struct sample_walk)

static __always_inline int sample_bucket_step(struct sample_walk *w, u32 b)
{
	u64 m = QB_IX(u64, w->h, b);

	if (w->acc + m >= w->s->target) {
		w->b = b;
		w->found = 1;
		return 1;
	}
	w->acc += m;
	return 0;
}
QB_EACH_FN(sample_bucket_step, struct sample_walk)

/* One level of the radix select, on the select's walk (see the arena build's sample_level). */
static __always_inline int sample_level(struct sample_walk *w, u32 shift, u32 bits)
{
	struct qb_sample_args *s = w->s;

	w->shift = shift;
	w->bits = bits;
	w->nb = 1U << (bits & 15);
	if (w->nb > LIM_SAMPLE_BUCKETS || shift > 31)
		return SAMPLE_E_PARAM;
	if (QB_EACH(sample_zero_step, w->nb, w) || QB_EACH(sample_hist_step, s->n, w))
		return SAMPLE_E_LOOP;
	w->acc = s->below;
	w->found = 0;
	if (QB_EACH(sample_bucket_step, w->nb, w) || !w->found)
		return SAMPLE_E_LOOP;
	s->prefix = (s->prefix << bits) | w->b;
	s->below = w->acc;
	return 0;
}

static __always_inline int sample_ties_step(struct sample_walk *w, u32 i)
{
	struct qb_sample_args *s = w->s;
	u32 d = sample_d(w, i);

	if (d != s->prefix)
		return 0;
	if (s->mode == SEL_COUNT)
		w->acc += 1;
	else if (sample_kept(s, d, i))
		w->acc += sample_w1(w, d);
	else
		return 0;
	if (w->acc >= s->target) {
		s->cut_d = s->prefix;
		s->cut_id = i;
		w->found = 1;
		return 1;
	}
	return 0;
}
QB_EACH_FN(sample_ties_step, struct sample_walk)

/* The select's last pass, on its walk (see the arena build's sample_ties). */
static __always_inline int sample_ties(struct sample_walk *w)
{
	w->acc = w->s->below;
	w->found = 0;
	if (QB_EACH(sample_ties_step, w->s->n, w) || !w->found)
		return SAMPLE_E_LOOP;
	return 0;
}

/* The radix select for mode and target (see the top): one walk for its four passes. */
static __always_inline int sample_select(struct qb_sample_args *s, u32 mode, u64 target)
{
	struct sample_walk w;

	if (sample_walk_init(&w, s))
		return SAMPLE_E_PARAM;
	s->mode = mode;
	s->target = target;
	s->prefix = 0;
	s->below = 0;
	if (sample_level(&w, 21, 11) || sample_level(&w, 10, 11) || sample_level(&w, 0, 10))
		return SAMPLE_E_LOOP;
	return sample_ties(&w);
}

static __always_inline int sample_sum_step(struct sample_walk *w, u32 i)
{
	struct qb_sample_args *s = w->s;
	u32 d = sample_d(w, i);

	if (!sample_kept(s, d, i))
		return 0;
	if (!w->tempered)
		w->acc += sample_w1(w, d);
	else if (!s->p.min_p_q16 || sample_w1(w, d) >= w->minw)
		w->acc += sample_wt(w, d);
	return 0;
}
QB_EACH_FN(sample_sum_step, struct sample_walk)

/* S1 or S into s->total (see the arena build's sample_sum). */
static __always_inline int sample_sum(struct qb_sample_args *s, u32 tempered)
{
	struct sample_walk w;

	if (sample_walk_init(&w, s))
		return SAMPLE_E_PARAM;
	w.tempered = tempered;
	w.minw = (u64)s->p.min_p_q16 << 14;
	if (QB_EACH(sample_sum_step, s->n, &w))
		return SAMPLE_E_LOOP;
	s->total = w.acc;
	return 0;
}

static __always_inline int sample_pick_step(struct sample_walk *w, u32 i)
{
	struct qb_sample_args *s = w->s;
	u32 d = sample_d(w, i);

	if (!sample_kept(s, d, i) || (s->p.min_p_q16 && sample_w1(w, d) < w->minw))
		return 0;
	w->acc += sample_wt(w, d);
	if (w->acc > w->r) {
		s->token = i;
		w->found = 1;
		return 1;
	}
	return 0;
}
QB_EACH_FN(sample_pick_step, struct sample_walk)

/* Step 7's walk (see the arena build's sample_pick). */
static __always_inline int sample_pick(struct qb_sample_args *s, u64 r)
{
	struct sample_walk w;

	if (sample_walk_init(&w, s))
		return SAMPLE_E_PARAM;
	w.minw = (u64)s->p.min_p_q16 << 14;
	w.r = r;
	if (QB_EACH(sample_pick_step, s->n, &w) || !w.found)
		return SAMPLE_E_LOOP;
	return 0;
}

#endif /* QB_ARRAY_LAYER */

/* splitmix64 (Steele, Lea, Flood 2014): the state advances by the golden gamma, the output is
 * the state mixed. */
static __always_inline u64 sample_next(u64 *state)
{
	u64 z = (*state += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* Whether p is in the ranges src/num/sample.rs accepts. */
static __always_inline int sample_params_ok(const struct qb_sample_params *p)
{
	s32 pres = p->presence_q16, freq = p->frequency_q16;

	return (p->temp_q16 == 0 ||
		(p->temp_q16 >= LIM_SAMPLE_TEMP_MIN && p->temp_q16 <= LIM_SAMPLE_TEMP_MAX)) &&
	       p->top_p_q16 >= 1 && p->top_p_q16 <= SAMPLE_ONE && p->min_p_q16 <= SAMPLE_ONE &&
	       p->rep_q16 >= LIM_SAMPLE_REP_MIN && p->rep_q16 <= LIM_SAMPLE_REP_MAX &&
	       pres >= -LIM_SAMPLE_PEN_MAX && pres <= LIM_SAMPLE_PEN_MAX &&
	       freq >= -LIM_SAMPLE_PEN_MAX && freq <= LIM_SAMPLE_PEN_MAX;
}

/* The next token into s->token (see the top); 0, or SAMPLE_E_*. */
OP(sample, struct qb_sample_args)
{
	struct qb_sample_params *p = &a->p;
	u64 rng;
	int r;

	QB_MEM_USE(arena);
	if (a->n == 0 || a->n > LIM_VOCAB_MAX || !sample_params_ok(p))
		return SAMPLE_E_PARAM;
	r = sample_max(a);
	if (r || p->temp_q16 == 0)
		return r;
	a->inv_t = ((1ULL << 32) + p->temp_q16 / 2) / p->temp_q16;
	/* nothing cut: every d is below 2^32 - 1 */
	a->cut_d = ~0U;
	a->cut_id = a->n;
	if (p->top_k && p->top_k < a->n && sample_select(a, SEL_COUNT, p->top_k))
		return SAMPLE_E_LOOP;
	if (p->top_p_q16 < SAMPLE_ONE) {
		u64 s1, t;

		if (sample_sum(a, 0))
			return SAMPLE_E_LOOP;
		s1 = a->total;
		t = (s1 >> 16) * p->top_p_q16 + (((s1 & 0xffff) * p->top_p_q16) >> 16);
		if (sample_select(a, SEL_MASS, t ? t : 1))
			return SAMPLE_E_LOOP;
	}
	if (sample_sum(a, 1) || a->total == 0)
		return SAMPLE_E_LOOP;
	rng = a->rng;
	r = sample_pick(a, sample_next(&rng) % a->total);
	a->rng = rng;
	return r;
}
