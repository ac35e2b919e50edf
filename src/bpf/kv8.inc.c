// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* Attention over an int8 KV cache. Included at the end of ops.bpf.c: shares its `arena` map and
 * fixed.h's helpers. src/kv8.rs holds the format and a Rust twin computing the same integers.
 *
 * Format, per layer, position t and kv head j (hd codes and one step each for K and for V):
 *   step  u32 Q23 = ceil(amax * 128 / 127), amax = max_d |x[d]| of the Q16 row (0 for a zero row)
 *   code  s8 c[d] = round(|x[d]| * 128 / step) with x's sign, in -127..127, so that
 *         x[d] ~= c[d] * step / 2^7 in Q16.
 * Codes [n_kv][max_ctx][hd] and steps [n_kv][max_ctx] are separate arrays, each kv head's part
 * codes_stride (steps_stride) bytes after the previous one: 132 bytes per head and position at
 * hd = 128, against 512 for Q16. Head-major, so that a pair of query heads reads its kv head's
 * rows at consecutive addresses (a block of KV8_TBLOCK value rows, 32 KiB at hd 128, stays in
 * the L1 cache over the passes of kv8_axpys).
 *
 * Key smoothing: Qwen3's k_norm weights are 60-90 on a few channels and ~1 elsewhere, so one
 * step per row would leave the ordinary channels one or two codes. Each layer has a shift per
 * channel, sh[d] (from its k_norm weights, see src/kv8.rs): keys are quantised as
 * round(k[d] / 2^sh[d]) and queries multiplied by 2^sh[d], which leaves q . k unchanged.
 *
 * SWAR: the query heads of a GQA group are taken two at a time ("a pair"); their values share
 * one u64 word as two signed 32-bit lanes, w = lo + hi * 2^32 (mod 2^64). Multiplying a word by
 * a scalar and summing is exact in the ring, and a lane pair (L0, L1) with |L0|, |L1| < 2^31 is
 * read back as L0 = (s32)w, L1 = (w - L0) >> 32 (arithmetic). So one 64-bit multiply by a key
 * or value code serves both heads of a pair, and every K/V code is loaded once per pair.
 *
 * 1. Queries: q'[d] = q[d] * 2^sh[d] (s64); per head, e = the least shift with
 *    round(max|q'| / 2^e) <= 32767 (q is Q22), and qq = round(|q'| / 2^e) with q's sign; qq of
 *    the pair packed per dimension: QQ[d].
 *    |sum_d qq * c| <= 32767 * 127 * 512 < 2^31 for hd <= 512: the lanes never carry.
 * 2. Scores (Q16): s = D * kstep * 2^e / 2^29 with D the lane of sum_d QQ[d] * c_t[d] (rounded
 *    when e < 29), clamped to +-2^40, then, as in the Q16 path, sat32(rshr(s * scale, 22)).
 * 3. Softmax: e_t = exp(s_t - max) in Q30 (as the Q16 path), p_t = (e_t * floor(2^62 / sum)) >>
 *    32 <= 2^30 (Q30, sum_t p_t <= 2^30).
 * 4. Values: V = max_t vstep_t of the kv head, r_t = (vstep_t * floor(2^55 / V)) >> 32 <= 2^23,
 *    W_t = (p_t * r_t) >> 30: sum_t W_t <= 2^23, so a lane of sum_t W_t * c_t[d] stays below
 *    127 * 2^23 < 2^31 at any context length. out[d] = sat32(rshr(lane * V, 30)) in Q16.
 * No division inside the loops over positions.
 *
 * The inner loops (kv8_dots, kv8_axpys) keep their sums in registers, load each packed query word
 * once per three key rows and each value weight once per four channels, and are written with
 * KV8_MAC so that a multiply-add is three instructions. Their can_loop budgets: at most
 * ceil(max_ctx / 3) * hd / 8 < 900,000 iterations per kv8_dots call (max_ctx 40,960, hd 512) and
 * (hd / 4) * (KV8_TBLOCK / 8 + 7) = 4,992 per kv8_axpys call, far below the kernel's 8M. */
#pragma once

#define KV8_QMAX 32767  /* packed query codes */
#define KV8_HD_MAX 512  /* head_dim bound of the lane algebra above */
#define KV8_TBLOCK 256  /* value rows per pass of kv8_axpys (its sums stay in registers) */

struct attention_i8_args {
	u64 q;       /* s32 Q22 [n_q][hd]: after q_norm and RoPE */
	u64 k;       /* s32 Q16 [n_kv][hd]: this position's key */
	u64 v;       /* s32 Q16 [n_kv][hd]: this position's value */
	u64 k_codes; /* s8 [n_kv][max_ctx][hd] of this layer, heads codes_stride bytes apart */
	u64 k_steps; /* u32 Q23 [n_kv][max_ctx], heads steps_stride bytes apart */
	u64 v_codes;
	u64 v_steps;
	u64 probs;   /* u32 [n_q][max_ctx] scratch: scores, then exp */
	u64 wv;      /* u64 [n_pairs][max_ctx] scratch: packed value weights W_t */
	u64 qq;      /* u64 [n_pairs][hd] scratch: packed quantised queries */
	u64 acc;     /* u64 [n_pairs][hd] scratch: packed value sums */
	u64 out;     /* s32 Q16 [n_q][hd], out */
	u64 exp2;    /* u32 Q30 [257] */
	u64 ksh;     /* u8 [hd]: this layer's key smoothing shifts */
	u32 pos, max_ctx, n_q, n_kv, hd;
	u32 kv0, kv1; /* this run's kv heads: kv0..kv1 (their rows are appended, their groups attended) */
	s32 scale_q22;
	u32 codes_stride, steps_stride; /* >= max_ctx * hd and max_ctx * 4 */
};

/* x[d] / 2^sh[d], rounded half up (sh[d] = 0: x[d]); sha == 0: no shifts. */
static __always_inline s64 kv8_smooth(const s32 __arena *x, const u8 __arena *sh, u64 sha, u32 d)
{
	u64 k = sha ? sh[d] & 31 : 0;

	return ((s64)x[d] + (s64)((1ULL << k) >> 1)) >> k;
}

/* One row of hd Q16 values, each divided by 2^sh[d] (sha != 0), into codes and a step (the
 * format above). */
__noinline int kv8_quant_row(u64 xa, u64 ca, u64 sa, u64 sha, u32 hd)
{
	const s32 __arena *x = ARENA_PTR(const s32, xa);
	const u8 __arena *sh = ARENA_PTR(const u8, sha);
	s8 __arena *c = ARENA_PTR(s8, ca);
	u32 __arena *s = ARENA_PTR(u32, sa);
	u64 amax = 0, step;

	for (u32 d = 0; d < hd && can_loop; d++) {
		s64 v = kv8_smooth(x, sh, sha, d);
		u64 a = v < 0 ? -v : v;

		amax = a > amax ? a : amax;
	}
	step = (amax * 128 + 126) / 127;
	*s = (u32)step;
	for (u32 d = 0; d < hd && can_loop; d++) {
		s64 v = kv8_smooth(x, sh, sha, d);
		u64 a = (u64)(v < 0 ? -v : v) * 128;
		s64 r = step ? (s64)((2 * a + step) / (2 * step)) : 0;

		c[d] = (s8)(v < 0 ? -r : r);
	}
	return 0;
}

/* The two lanes of a packed word (see above). */
static __always_inline s64 lane0(u64 w)
{
	return (s64)(s32)w;
}

static __always_inline s64 lane1(u64 w)
{
	return (s64)(w - (u64)lane0(w)) >> 32;
}

/* The shift e of one head's hd Q22 values (as quantize_block, with qmax 32767). A global
 * function, so that the caller's verifier state holds e as an unknown, not 32 constants. */
__noinline u32 kv8_query_shift(u64 qa, u64 sha, u32 hd)
{
	const s32 __arena *q = ARENA_PTR(const s32, qa);
	const u8 __arena *sh = ARENA_PTR(const u8, sha);
	u64 m = 0;
	u32 e = 0;

	for (u32 d = 0; d < hd && can_loop; d++) {
		s64 v = (s64)q[d] << (sh[d] & 31);
		u64 a = v < 0 ? -v : v;

		m = a > m ? a : m;
	}
	while (e < 63 && ((m + ((1ULL << e) >> 1)) >> e) > KV8_QMAX)
		e++;
	return e;
}

/* round(|v| / 2^e) with v's sign, branch-free (a branch per element would split the verifier's
 * state at every dimension). */
static __always_inline u64 kv8_qcode(s64 v, u64 e)
{
	s64 sgn = v >> 63;
	u64 a, r;

	OPAQUE(sgn);
	a = (u64)((v ^ sgn) - sgn);
	r = (a + ((1ULL << e) >> 1)) >> e;
	return (u64)(((s64)r ^ sgn) - sgn);
}

/* QQ[d] for heads h0 and h0 + 1 (a zero lane 1 when only one); returns e0 | e1 << 8. */
__noinline u32 kv8_pack_queries(u64 qa, u64 qqa, u64 sha, u32 hd, u32 two)
{
	const s32 __arena *q0 = ARENA_PTR(const s32, qa);
	const s32 __arena *q1 = ARENA_PTR(const s32, qa + (u64)hd * 4);
	const u8 __arena *sh = ARENA_PTR(const u8, sha);
	u64 __arena *qq = ARENA_PTR(u64, qqa);
	u64 e0 = kv8_query_shift(qa, sha, hd) & 63;
	u64 e1 = two ? kv8_query_shift(qa + (u64)hd * 4, sha, hd) & 63 : 0;
	u64 keep = two ? ~0ULL : 0;

	for (u32 d = 0; d < hd && can_loop; d++) {
		u64 k = sh[d] & 31;
		u64 lo = kv8_qcode((s64)q0[d] << k, e0);
		u64 hi = kv8_qcode(((s64)q1[d] << k) & (s64)keep, e1);

		qq[d] = lo + (hi << 32);
	}
	return (u32)(e0 | e1 << 8);
}

/* a += x * c[off] (c an s8 arena pointer, off a literal), as four BPF instructions: a load, a
 * sign extension (movsx: a sign-extending load from an arena is refused before Linux 6.18), a
 * multiply, an add. Written as asm because clang spills the sums of the loops
 * below to the stack and re-loads them (six to seven instructions per multiply instead of three
 * to four). */
#define KV8_MAC(a, x, c, off, t)                                                       \
	asm("%[tmp] = *(u8 *)(%[cp] + " #off ")\n\t%[tmp] = (s8)%[tmp]\n\t"                  \
	    "%[tmp] *= %[xv]\n\t%[acc] += %[tmp]"                                            \
	    : [acc] "+r"(a), [tmp] "=&r"(t)                                             \
	    : [cp] "r"(c), [xv] "r"(x))
/* x = q[off / 8] (q a u64 arena pointer): a packed query word or value weight */
#define KV8_LOAD(x, q, off) asm("%[xv] = *(u64 *)(%[qp] + " #off ")" : [xv] "=r"(x) : [qp] "r"(q))
/* Column d of three key rows: x = QQ[d] (qoff = 8 d), ar += x * cr[d] for r = 0, 1, 2. */
#define KV8_DOT_COL(a0, a1, a2, x, q, c0, c1, c2, qoff, d, t)                          \
	do {                                                                            \
		KV8_LOAD(x, q, qoff);                                                   \
		KV8_MAC(a0, x, c0, d, t);                                               \
		KV8_MAC(a1, x, c1, d, t);                                               \
		KV8_MAC(a2, x, c2, d, t);                                               \
	} while (0)

/* dots[t] = sum_d QQ[d] * c_t[d] (mod 2^64) for t < n, key row t at ca + t * stride: both heads'
 * dot products with every key row (hd_n = hd | n << 32). Three rows per pass over QQ, so each
 * packed query word is loaded once per three multiplies, eight columns per iteration; rows past
 * n in the last pass repeat row t and are not stored. */
__noinline int kv8_dots(u64 qqa, u64 ca, u64 stride, u64 outa, u64 hd_n)
{
	u64 __arena *out = ARENA_PTR(u64, outa);
	u32 hd = (u32)hd_n, n = (u32)(hd_n >> 32), octs = hd / 8;

	if (hd > KV8_HD_MAX)
		return 1;
	FOR(i, 0, (n + 2) / 3) {
		u32 t = 3 * i;
		const u64 __arena *q = ARENA_PTR(const u64, qqa);
		const s8 __arena *c0 = ARENA_PTR(const s8, ca + (u64)t * stride);
		const s8 __arena *c1 = t + 1 < n ? c0 + stride : c0;
		const s8 __arena *c2 = t + 2 < n ? c1 + stride : c0;
		u64 a0 = 0, a1 = 0, a2 = 0, x, tmp;

		ARENA_CAST(q);
		ARENA_CAST(c0);
		ARENA_CAST(c1);
		ARENA_CAST(c2);
		for (u32 j = 0; j < octs && can_loop; j++) {
			KV8_DOT_COL(a0, a1, a2, x, q, c0, c1, c2, 0, 0, tmp);
			KV8_DOT_COL(a0, a1, a2, x, q, c0, c1, c2, 8, 1, tmp);
			KV8_DOT_COL(a0, a1, a2, x, q, c0, c1, c2, 16, 2, tmp);
			KV8_DOT_COL(a0, a1, a2, x, q, c0, c1, c2, 24, 3, tmp);
			KV8_DOT_COL(a0, a1, a2, x, q, c0, c1, c2, 32, 4, tmp);
			KV8_DOT_COL(a0, a1, a2, x, q, c0, c1, c2, 40, 5, tmp);
			KV8_DOT_COL(a0, a1, a2, x, q, c0, c1, c2, 48, 6, tmp);
			KV8_DOT_COL(a0, a1, a2, x, q, c0, c1, c2, 56, 7, tmp);
			q += 8;
			c0 += 8;
			c1 += 8;
			c2 += 8;
		}
		for (u32 d = octs * 8; d < hd && can_loop; d++) {
			KV8_DOT_COL(a0, a1, a2, x, q, c0, c1, c2, 0, 0, tmp);
			q++;
			c0++;
			c1++;
			c2++;
		}
		out[t] = a0;
		if (t + 1 < n)
			out[t + 1] = a1;
		if (t + 2 < n)
			out[t + 2] = a2;
	}
	return 0;
}

/* One value row's four channels into a0..a3: x = W[t] (woff = 8 t, a literal), ai += x * c[i],
 * then c to the next row. The step is asm too: written as C, clang computes c + k * stride for
 * the rows of an iteration from the first and runs out of registers (spills and reloads). */
#define KV8_AXPY_ROW(a0, a1, a2, a3, x, w, woff, c, stride, t)                              \
	do {                                                                                \
		KV8_LOAD(x, w, woff);                                                       \
		KV8_MAC(a0, x, c, 0, t);                                                    \
		KV8_MAC(a1, x, c, 1, t);                                                    \
		KV8_MAC(a2, x, c, 2, t);                                                    \
		KV8_MAC(a3, x, c, 3, t);                                                    \
		asm("%[cp] += %[st]" : [cp] "+r"(c) : [st] "r"(stride));                    \
	} while (0)

/* acc[d] += sum_t W[t] * c_t[d] (mod 2^64) for t < n, value row t at ca + t * stride: the value
 * rows into both heads' sums (hd_n = hd | n << 32, n capped at KV8_TBLOCK), four channels at a
 * time with their sums held in registers over all n rows, eight rows per iteration (the loop's
 * may_goto count-down and bound check cost about ten x86 instructions per iteration; at two rows
 * an iteration they were a fifth of the kernel), then the last n % 8 one at a time. */
__noinline int kv8_axpys(u64 acca, u64 wa, u64 ca, u64 stride, u64 hd_n)
{
	u64 __arena *acc = ARENA_PTR(u64, acca);
	u32 hd = (u32)hd_n, n = (u32)(hd_n >> 32), quads = hd / 4, octs;

	if (n > KV8_TBLOCK)
		n = KV8_TBLOCK;
	octs = n / 8;
	FOR(b, 0, quads) {
		u32 d = 4 * b;
		const u64 __arena *w = ARENA_PTR(const u64, wa);
		const s8 __arena *c = ARENA_PTR(const s8, ca + d);
		u64 a0 = acc[d], a1 = acc[d + 1], a2 = acc[d + 2], a3 = acc[d + 3], x, tmp;

		ARENA_CAST(w);
		ARENA_CAST(c);

		for (u32 t = 0; t < octs && can_loop; t++) {
			KV8_AXPY_ROW(a0, a1, a2, a3, x, w, 0, c, stride, tmp);
			KV8_AXPY_ROW(a0, a1, a2, a3, x, w, 8, c, stride, tmp);
			KV8_AXPY_ROW(a0, a1, a2, a3, x, w, 16, c, stride, tmp);
			KV8_AXPY_ROW(a0, a1, a2, a3, x, w, 24, c, stride, tmp);
			KV8_AXPY_ROW(a0, a1, a2, a3, x, w, 32, c, stride, tmp);
			KV8_AXPY_ROW(a0, a1, a2, a3, x, w, 40, c, stride, tmp);
			KV8_AXPY_ROW(a0, a1, a2, a3, x, w, 48, c, stride, tmp);
			KV8_AXPY_ROW(a0, a1, a2, a3, x, w, 56, c, stride, tmp);
			w += 8;
		}
		for (u32 t = octs * 8; t < n && can_loop; t++) {
			KV8_AXPY_ROW(a0, a1, a2, a3, x, w, 0, c, stride, tmp);
			w++;
		}
		acc[d] = a0;
		acc[d + 1] = a1;
		acc[d + 2] = a2;
		acc[d + 3] = a3;
	}
	FOR(d, quads * 4, hd) {
		const u64 __arena *w = ARENA_PTR(const u64, wa);
		const s8 __arena *c = ARENA_PTR(const s8, ca + d);
		u64 a0 = acc[d], x, tmp;

		ARENA_CAST(w);
		ARENA_CAST(c);

		for (u32 t = 0; t < n && can_loop; t++) {
			KV8_LOAD(x, w, 0);
			KV8_MAC(a0, x, c, 0, tmp);
			w++;
			c += stride;
		}
		acc[d] = a0;
	}
	return 0;
}

/* A Q16 score from a lane D of the packed dot product, the key step and the query shift e. */
static __always_inline s64 kv8_score(s64 dot, u32 kstep, u32 e, s64 scale)
{
	s64 s = dot * (s64)kstep, lim;

	if (e < 29) {
		s = rshr(s, 29 - e);
	} else {
		lim = (1LL << 40) >> (e - 29);
		s = s > lim ? lim : s < -lim ? -lim : s;
		s <<= e - 29;
	}
	return attn_score(s, scale);
}

/* The arena addresses one pair of query heads works on (see kv8_attend_pair). */
struct kv8_pair {
	u64 ks, vs;   /* kv head j's key and value steps at position 0 (u32 [max_ctx]) */
	u64 pa0, pa1; /* the two heads' score / probability rows (u32 [max_ctx]) */
	u64 wva;      /* the pair's packed dot products, then value weights (u64 [max_ctx]) */
	u64 acc;      /* the pair's packed value sums (u64 [hd]) */
};

static __always_inline void kv8_pair_at(struct attention_i8_args *a, u32 j, u32 h0, u32 pair,
					struct kv8_pair *p)
{
	p->ks = a->k_steps + (u64)j * a->steps_stride;
	p->vs = a->v_steps + (u64)j * a->steps_stride;
	p->pa0 = a->probs + (u64)h0 * a->max_ctx * 4;
	p->pa1 = p->pa0 + (u64)a->max_ctx * 4;
	p->wva = a->wv + (u64)pair * a->max_ctx * 8;
	p->acc = a->acc + (u64)pair * a->hd * 8;
}

/* Step 2 of kv8_attend_pair: the Q16 scores of both heads from the packed dot products, their
 * maxima m0, m1 and the largest value step, left in acc[0..3) for the caller (acc is zeroed
 * before step 5). A function of its own so that its loop's values do not stay live, and on the
 * stack, beside the caller's (the plan interpreter calls attention inside a 512-byte stack).
 * kv8_scores, kv8_weights and kv8_attend_pair are global functions, which the verifier checks
 * once each with unknown arguments: as static functions they were re-verified inside the
 * callers' loops, which on some 6.18 builds exceeded the one-million-instruction limit (E2BIG).
 * two_e = two | e0 << 8 | e1 << 16. */
__noinline int kv8_scores(struct attention_i8_args *a __arg_nonnull, u32 j, u32 h0, u32 pair,
			  u32 two_e)
{
	struct kv8_pair p;
	u32 npos = a->pos + 1, two = two_e & 1;
	u32 e0 = (two_e >> 8) & 0xff, e1 = (two_e >> 16) & 0xff;
	s64 scale = a->scale_q22, m0 = -ACT_MAX, m1 = -ACT_MAX;
	u64 vmax = 0;

	kv8_pair_at(a, j, h0, pair, &p);
	const u64 __arena *wv = ARENA_PTR(const u64, p.wva);
	const u32 __arena *ks = ARENA_PTR(const u32, p.ks);
	const u32 __arena *vs = ARENA_PTR(const u32, p.vs);
	u32 __arena *p0 = ARENA_PTR(u32, p.pa0);
	u32 __arena *p1 = ARENA_PTR(u32, p.pa1);
	u64 __arena *acc = ARENA_PTR(u64, p.acc);

	for (u32 t = 0; t < npos && can_loop; t++) {
		u64 w = wv[t]; /* this pair's packed dot products, until step 4 */
		u32 kstep = ks[t], vstep = vs[t];
		s64 s0 = kv8_score(lane0(w), kstep, e0, scale);

		p0[t] = (u32)(s32)s0;
		m0 = s0 > m0 ? s0 : m0;
		if (two) {
			s64 s1 = kv8_score(lane1(w), kstep, e1, scale);

			p1[t] = (u32)(s32)s1;
			m1 = s1 > m1 ? s1 : m1;
		}
		vmax = vstep > vmax ? vstep : vmax;
	}
	acc[0] = (u64)m0;
	acc[1] = (u64)m1;
	acc[2] = vmax;
	return 0;
}

/* Step 4 of kv8_attend_pair: the packed value weights W_t of both heads, from the reciprocals
 * the caller left in acc[0..3) (inv0, inv1, invv). */
__noinline int kv8_weights(struct attention_i8_args *a __arg_nonnull, u32 j, u32 h0, u32 pair,
			   u32 two)
{
	struct kv8_pair p;
	u32 npos = a->pos + 1;

	kv8_pair_at(a, j, h0, pair, &p);
	u64 __arena *wv = ARENA_PTR(u64, p.wva);
	const u32 __arena *vs = ARENA_PTR(const u32, p.vs);
	const u32 __arena *p0 = ARENA_PTR(const u32, p.pa0);
	const u32 __arena *p1 = ARENA_PTR(const u32, p.pa1);
	const u64 __arena *acc = ARENA_PTR(const u64, p.acc);
	u64 inv0 = acc[0], inv1 = acc[1], invv = acc[2];

	for (u32 t = 0; t < npos && can_loop; t++) {
		u64 r = ((u64)vs[t] * invv) >> 32;
		u64 w0 = ((((u64)p0[t] * inv0) >> 32) * r) >> Q_ONE;
		u64 w1 = two ? ((((u64)p1[t] * inv1) >> 32) * r) >> Q_ONE : 0;

		wv[t] = w0 + (w1 << 32);
	}
	return 0;
}

/* One pair of query heads (h0 and, when `two`, h0 + 1) of kv head j over positions 0..pos. */
__noinline int kv8_attend_pair(struct attention_i8_args *a __arg_nonnull, u32 j, u32 h0, u32 two,
			    u32 pair)
{
	struct kv8_pair p;
	u32 hd = a->hd, npos = a->pos + 1;
	u64 kc = a->k_codes + (u64)j * a->codes_stride, vc = a->v_codes + (u64)j * a->codes_stride;
	u64 __arena *accp;
	s64 m0, m1;
	u64 sum0, sum1 = 1ULL << Q_ONE, vmax;
	u32 ee, e0, e1;

	kv8_pair_at(a, j, h0, pair, &p);
	accp = ARENA_PTR(u64, p.acc);
	/* 1. packed queries */
	ee = kv8_pack_queries(a->q + (u64)h0 * hd * 4, a->qq + (u64)pair * hd * 8, a->ksh, hd, two);
	e0 = ee & 0xff;
	e1 = (ee >> 8) & 0xff;
	if (e0 > 60 || e1 > 60)
		return 1;
	/* 2. scores of both heads, their maxima, and the largest value step */
	kv8_dots(a->qq + (u64)pair * hd * 8, kc, hd, p.wva, hd | (u64)npos << 32);
	kv8_scores(a, j, h0, pair, two | e0 << 8 | e1 << 16);
	m0 = (s64)accp[0];
	m1 = (s64)accp[1];
	vmax = accp[2];
	/* 3. exp(s - m) and the sums */
	sum0 = softmax_exp(p.pa0, a->exp2, m0, npos);
	if (two)
		sum1 = softmax_exp(p.pa1, a->exp2, m1, npos);
	if (sum0 == 0 || sum1 == 0)
		return 1;
	/* 4. packed value weights W_t of both heads */
	accp[0] = (1ULL << 62) / sum0;
	accp[1] = (1ULL << 62) / sum1;
	accp[2] = vmax ? (1ULL << 55) / vmax : 0;
	kv8_weights(a, j, h0, pair, two);
	/* 5. sums of weighted value codes, then out = lane * V / 2^30 */
	FOR(d, 0, hd)
		accp[d] = 0;
	FOR(blk, 0, (npos + KV8_TBLOCK - 1) / KV8_TBLOCK) {
		u32 t0 = blk * KV8_TBLOCK;

		kv8_axpys(p.acc, p.wva + (u64)t0 * 8, vc + (u64)t0 * hd, hd,
			  hd | (u64)(npos - t0) << 32);
	}
	FOR(d, 0, hd) {
		s32 __arena *out = ARENA_PTR(s32, a->out + (u64)h0 * hd * 4);
		u64 w = accp[d];

		out[d] = sat32(rshr(lane0(w) * (s64)vmax, 30));
		if (two)
			out[hd + d] = sat32(rshr(lane1(w) * (s64)vmax, 30));
	}
	return 0;
}

/* Causal GQA attention over the int8 cache at position pos, for kv heads kv0..kv1: quantise and
 * append those heads' k and v rows, then attend their query heads, two at a time. */
OP(attention_i8, struct attention_i8_args)
{
	u32 hd = a->hd, n_kv = a->n_kv, g, pairs;

	USE_ARENA(arena);
	if (a->pos >= a->max_ctx || n_kv == 0 || a->n_q % n_kv || hd < 4 || hd > KV8_HD_MAX ||
	    a->kv0 >= a->kv1 || a->kv1 > n_kv || a->codes_stride < (u64)a->max_ctx * hd ||
	    a->steps_stride < (u64)a->max_ctx * 4)
		return 1;
	g = a->n_q / n_kv;
	pairs = (g + 1) / 2;
	FOR(j, a->kv0, a->kv1) {
		u64 c = (u64)j * a->codes_stride + (u64)a->pos * hd;
		u64 st = (u64)j * a->steps_stride + (u64)a->pos * 4;

		kv8_quant_row(a->k + (u64)j * hd * 4, a->k_codes + c, a->k_steps + st, a->ksh, hd);
		kv8_quant_row(a->v + (u64)j * hd * 4, a->v_codes + c, a->v_steps + st, 0, hd);
	}
	FOR(j, a->kv0, a->kv1) {
		FOR(i, 0, pairs) {
			u32 h0 = j * g + 2 * i;

			if (kv8_attend_pair(a, j, h0, 2 * i + 1 < g, j * pairs + i))
				return 1;
		}
	}
	return 0;
}
