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

/* The loop over a head's hd (<= KV8_HD_MAX) dimensions: bpf_for over the arena (can_loop cost
 * 6.12.57's verifier 27,000 more instructions in attention_i8); on arrays a loop bounded by the
 * constant (barrier_var keeps clang from folding the two exits into one test against
 * min(hd, KV8_HD_MAX), which the verifier cannot bound: see dot_head). */
#ifndef QB_ARRAY_LAYER
#define KV8_DIMS(d, hd) FOR(d, 0, hd)
#else
#define KV8_DIMS(d, hd)                                                                     \
	for (u32 d = 0; d < KV8_HD_MAX; d++)                                                \
		if (({ barrier_var(hd); d >= (hd); }))                                      \
			break;                                                              \
		else
#endif

/* |v| and max(a, b) (a, b < 2^62), branch-free: a branch per dimension would double the paths
 * the verifier walks through the array build's bounded loops (kv8_quant_row verified in
 * about 290,000 instructions with them). */
static __always_inline u64 kv8_abs(s64 v)
{
	s64 sgn = v >> 63;

	OPAQUE(sgn);
	return (u64)((v ^ sgn) - sgn);
}

static __always_inline u64 kv8_max(u64 a, u64 b)
{
	s64 lt = (s64)(a - b) >> 63; /* -1 when a < b */

	OPAQUE(lt);
	return a + ((b - a) & (u64)lt);
}

static __always_inline s64 kv8_shr(s64 x, u64 k) /* x / 2^k, rounded half up (k = 0: x) */
{
	return (x + (s64)((1ULL << k) >> 1)) >> k;
}

/* One row of hd Q16 values, each divided by 2^sh[d] (sha != 0), into codes and a step (the
 * format above). With sha == 0 the row's own bytes stand in for sh, masked to shifts of 0
 * (branch-free, as below: one path through the loops, not one for each case). */
__noinline int kv8_quant_row(u64 xa, u64 ca, u64 sa, u64 sha, u32 hd)
{
	u64 some = 0 - ((sha | (0 - sha)) >> 63); /* ~0 when sha != 0 (an address < 2^63) */
	u64 kmask = 31 & some, amax = 0, step, nz, den;
	QB_VEC_T(const s32) x = QB_VEC(const s32, arena, xa, hd);
	QB_VEC_T(const u8) sh = QB_VEC(const u8, arena, xa + ((sha - xa) & some), hd);
	QB_VEC_T(s8) c = QB_VEC(s8, arena, ca, hd);
	u32 QB *s = QB_SPAN(u32, arena, sa, 4);

	if (hd > KV8_HD_MAX || !QB_VEC_OK(x) || !QB_VEC_OK(sh) || !QB_VEC_OK(c) || !QB_SPAN_OK(s))
		return 1;
	KV8_DIMS(d, hd) {
		s64 v = kv8_shr(QB_IX(const s32, x, d), QB_IX(const u8, sh, d) & kmask);

		amax = kv8_max(amax, kv8_abs(v));
	}
	step = (amax * 128 + 126) / 127;
	*s = (u32)step;
	/* r = round(|v| * 128 / step), 0 when step = 0 (then den = 1 and nz = 0), branch-free */
	nz = (step | (0 - step)) >> 63;
	den = 2 * step + (1 - nz);
	KV8_DIMS(d, hd) {
		s64 v = kv8_shr(QB_IX(const s32, x, d), QB_IX(const u8, sh, d) & kmask);
		s64 sgn = v >> 63;
		u64 r = (kv8_abs(v) * 256 + step) / den * nz;

		QB_IX(s8, c, d) = (s8)(((s64)r ^ sgn) - sgn);
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

/* The shift e of one head's hd Q22 values (as quantize_block, with qmax 32767); 63 (refused by
 * the caller) for vectors that do not lie in one element. A global function, so that the
 * caller's verifier state holds e as an unknown, not 32 constants. */
__noinline u32 kv8_query_shift(u64 qa, u64 sha, u32 hd)
{
	QB_VEC_T(const s32) q = QB_VEC(const s32, arena, qa, hd);
	QB_VEC_T(const u8) sh = QB_VEC(const u8, arena, sha, hd);
	u64 m = 0;
	u32 e = 0;

	if (hd > KV8_HD_MAX || !QB_VEC_OK(q) || !QB_VEC_OK(sh))
		return 63;
	KV8_DIMS(d, hd)
		m = kv8_max(m, kv8_abs((s64)QB_IX(const s32, q, d) << (QB_IX(const u8, sh, d) & 31)));
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

/* QQ[d] for heads h0 and h0 + 1 (a zero lane 1 when only one: head h0's values, masked);
 * returns e0 | e1 << 8. Branch-free in `two` (keep, h1), so that the verifier walks one path
 * through the loop, not one for each value of `two`. */
__noinline u32 kv8_pack_queries(u64 qa, u64 qqa, u64 sha, u32 hd, u32 two)
{
	u64 keep = 0 - (u64)(two & 1);
	u32 h1 = hd & (u32)keep;
	QB_VEC_T(const s32) q = QB_VEC(const s32, arena, qa, (u64)hd + h1);
	QB_VEC_T(const u8) sh = QB_VEC(const u8, arena, sha, hd);
	QB_VEC_T(u64) qq = QB_VEC(u64, arena, qqa, hd);
	u64 e0 = kv8_query_shift(qa, sha, hd) & 63;
	u64 e1 = kv8_query_shift(qa + (u64)h1 * 4, sha, hd) & 63 & keep;

	if (hd > KV8_HD_MAX || !QB_VEC_OK(q) || !QB_VEC_OK(sh) || !QB_VEC_OK(qq))
		return 63;
	KV8_DIMS(d, hd) {
		u64 k = QB_IX(const u8, sh, d) & 31;
		u64 lo = kv8_qcode((s64)QB_IX(const s32, q, d) << k, e0);
		u64 hi = kv8_qcode(((s64)QB_IX(const s32, q, h1 + d) << k) & (s64)keep, e1);

		QB_IX(u64, qq, d) = lo + (hi << 32);
	}
	return (u32)(e0 | e1 << 8);
}

#ifndef QB_ARRAY_LAYER
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

#else
/* kv8_dots and kv8_axpys of the array build: the same sums (mod 2^64, in another order) over
 * checked vectors, a row of the cache per step (a bpf_loop callback) and its hd dimensions in a
 * global function, verified once. Rows the operator did not check give 0 (it checks them all). */
__noinline u64 kv8_dot_row(u64 qqa, u64 ca, u32 hd)
{
	QB_VEC_T(const u64) q = QB_VEC(const u64, arena, qqa, hd);
	QB_VEC_T(const s8) c = QB_VEC(const s8, arena, ca, hd);
	u64 a = 0;

	if (hd > KV8_HD_MAX || !QB_VEC_OK(q) || !QB_VEC_OK(c))
		return 0;
	KV8_DIMS(d, hd)
		a += QB_IX(const u64, q, d) * (u64)(s64)QB_IX(const s8, c, d);
	return a;
}

__noinline int kv8_axpy_row(u64 acca, u64 w, u64 ca, u32 hd)
{
	QB_VEC_T(u64) acc = QB_VEC(u64, arena, acca, hd);
	QB_VEC_T(const s8) c = QB_VEC(const s8, arena, ca, hd);

	if (hd > KV8_HD_MAX || !QB_VEC_OK(acc) || !QB_VEC_OK(c))
		return 1;
	KV8_DIMS(d, hd)
		QB_IX(u64, acc, d) += w * (u64)(s64)QB_IX(const s8, c, d);
	return 0;
}

/* Key or value rows t at ca + t * stride: dots[t] (out) or acc += W[t] * row t (w). */
struct kv8_rows_walk {
	QB_VEC_T(u64) v; /* dots: out [n]; axpys: W [n] */
	u64 qq_acc, ca, stride;
	u32 hd;
};

static __always_inline int kv8_dot_step(struct kv8_rows_walk *c, u32 t)
{
	QB_IX(u64, c->v, t) = kv8_dot_row(c->qq_acc, c->ca + t * c->stride, c->hd);
	return 0;
}
QB_EACH_FN(kv8_dot_step, struct kv8_rows_walk)

static __always_inline int kv8_axpy_step(struct kv8_rows_walk *c, u32 t)
{
	return kv8_axpy_row(c->qq_acc, QB_IX(u64, c->v, t), c->ca + t * c->stride, c->hd);
}
QB_EACH_FN(kv8_axpy_step, struct kv8_rows_walk)

/* Inline (into kv8_scores): a frame less of 6.1's eight. */
static __always_inline int kv8_dots(u64 qqa, u64 ca, u64 stride, u64 outa, u64 hd_n)
{
	u32 hd = (u32)hd_n, n = (u32)(hd_n >> 32);
	struct kv8_rows_walk c = { .v = QB_VEC(u64, arena, outa, n), .qq_acc = qqa, .ca = ca,
				   .stride = stride, .hd = hd };

	if (hd > KV8_HD_MAX || !QB_VEC_OK(c.v))
		return 1;
	return QB_EACH(kv8_dot_step, n, &c) != 0;
}

/* All n rows (no KV8_TBLOCK blocks: no sums held in registers), inline as kv8_dots. */
static __always_inline int kv8_axpys(u64 acca, u64 wa, u64 ca, u64 stride, u64 hd_n)
{
	u32 hd = (u32)hd_n, n = (u32)(hd_n >> 32);
	struct kv8_rows_walk c;

	c = (struct kv8_rows_walk){ .v = QB_VEC(u64, arena, wa, n), .qq_acc = acca, .ca = ca,
				    .stride = stride, .hd = hd };
	if (hd > KV8_HD_MAX || !QB_VEC_OK(c.v))
		return 1;
	return QB_EACH(kv8_axpy_step, n, &c) != 0;
}
#endif

/* A Q16 score from a lane D of the packed dot product, the key step and the query shift e. A
 * global function: to the verifier its result is then one unknown, where the paths through its
 * clamps (constants, compared with the maxima) kept the score loop's states from converging
 * (inline: kv8_scores 270,000 instructions on 6.1's arrays, attention_i8 664,057 on 6.12.57). */
__noinline
s64 kv8_score(s64 dot, u32 kstep, u32 e, s64 scale)
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

/* acc[0..3) = x, y, z: what steps 2 and 4 hand over (1 when acc does not lie in one element). */
static __always_inline int kv8_put3(u64 acca, u64 x, u64 y, u64 z)
{
	QB_VEC_T(u64) acc = QB_VEC(u64, arena, acca, 3);

	if (!QB_VEC_OK(acc))
		return 1;
	QB_IX(u64, acc, 0) = x;
	QB_IX(u64, acc, 1) = y;
	QB_IX(u64, acc, 2) = z;
	return 0;
}

/* Step 2 of kv8_attend_pair, per position t: both heads' Q16 scores (into p at t and, for head
 * h0 + 1, at o1 + t) from the packed dot products (wv), their maxima m0, m1 and the largest
 * value step. */
struct kv8_scores_walk {
	QB_VEC_T(const u64) wv;
	QB_VEC_T(const u32) ks;
	QB_VEC_T(const u32) vs;
	QB_VEC_T(u32) p; /* both heads' rows (head h0's alone when there is one) */
	s64 scale, m0, m1;
	u64 vmax;
	u32 o1, two, e0, e1;
};

static __always_inline int kv8_score_step(struct kv8_scores_walk *c, u32 t)
{
	u64 w = QB_IX(const u64, c->wv, t); /* this pair's packed dot products, until step 4 */
	u32 kstep = QB_IX(const u32, c->ks, t), vstep = QB_IX(const u32, c->vs, t);
	s64 s0 = kv8_score(lane0(w), kstep, c->e0, c->scale);

	QB_IX(u32, c->p, t) = (u32)(s32)s0;
	c->m0 = s0 > c->m0 ? s0 : c->m0;
	if (c->two) {
		s64 s1 = kv8_score(lane1(w), kstep, c->e1, c->scale);

		QB_IX(u32, c->p, c->o1 + t) = (u32)(s32)s1;
		c->m1 = s1 > c->m1 ? s1 : c->m1;
	}
	c->vmax = vstep > c->vmax ? vstep : c->vmax;
	return 0;
}
QB_EACH_FN(kv8_score_step, struct kv8_scores_walk)

/* Step 2 of kv8_attend_pair: (arrays) the packed dot products of the pair's queries with every
 * key row, then the scores (kv8_score_step); m0, m1 and the largest value step are left in
 * acc[0..3) for the caller. A global function (as kv8_weights, kv8_attend_pair): its loop's
 * values stay off the caller's stack (the plan runs attention inside 512 bytes), and the
 * verifier checks it once, not inside the callers' loops (E2BIG on some 6.18 builds).
 * two_e = two | e0 << 8 | e1 << 16. */
__noinline int kv8_scores(struct attention_i8_args *a __arg_nonnull, u32 j, u32 h0, u32 pair,
			  u32 two_e)
{
	u32 npos, hd, two = two_e & 1;
	u64 wva, o1;
	struct kv8_scores_walk c;

	if (!a) /* Linux 6.1 ignores __arg_nonnull */
		return 1;
	npos = a->pos + 1;
	hd = a->hd;
	wva = a->wv + (u64)pair * a->max_ctx * 8;
	o1 = (u64)a->max_ctx * two; /* head h0 + 1's row, after head h0's */
#ifdef QB_ARRAY_LAYER /* over the arena kv8_attend_pair calls it: see there */
	if (kv8_dots(a->qq + (u64)pair * hd * 8, a->k_codes + (u64)j * a->codes_stride, hd, wva,
		     hd | (u64)npos << 32))
		return 1;
#endif
	c = (struct kv8_scores_walk){
		.wv = QB_VEC(const u64, arena, wva, npos),
		.ks = QB_VEC(const u32, arena, a->k_steps + (u64)j * a->steps_stride, npos),
		.vs = QB_VEC(const u32, arena, a->v_steps + (u64)j * a->steps_stride, npos),
		.p = QB_VEC(u32, arena, a->probs + (u64)h0 * a->max_ctx * 4, o1 + npos),
		.scale = a->scale_q22, .m0 = -ACT_MAX, .m1 = -ACT_MAX, .o1 = (u32)o1, .two = two,
		.e0 = (two_e >> 8) & 0xff, .e1 = (two_e >> 16) & 0xff,
	};
	if (!QB_VEC_OK(c.wv) || !QB_VEC_OK(c.ks) || !QB_VEC_OK(c.vs) || !QB_VEC_OK(c.p))
		return 1;
	ATT_EACH(kv8_score_step, npos, &c);
	return kv8_put3(a->acc + (u64)pair * hd * 8, (u64)c.m0, (u64)c.m1, c.vmax);
}

/* Step 4 of kv8_attend_pair, per position: the packed value weights W_t of both heads, from the
 * reciprocals the caller left in acc[0..3) (inv0, inv1, invv). */
struct kv8_weights_walk {
	QB_VEC_T(u64) wv;
	QB_VEC_T(const u32) vs;
	QB_VEC_T(const u32) p; /* as kv8_scores_walk's */
	u64 inv0, inv1, invv;
	u32 o1, two;
};

static __always_inline int kv8_weight_step(struct kv8_weights_walk *c, u32 t)
{
	u64 r = ((u64)QB_IX(const u32, c->vs, t) * c->invv) >> 32;
	u64 w0 = ((((u64)QB_IX(const u32, c->p, t) * c->inv0) >> 32) * r) >> Q_ONE;
	u64 w1 = c->two ? ((((u64)QB_IX(const u32, c->p, c->o1 + t) * c->inv1) >> 32) * r) >> Q_ONE
			: 0;

	QB_IX(u64, c->wv, t) = w0 + (w1 << 32);
	return 0;
}
QB_EACH_FN(kv8_weight_step, struct kv8_weights_walk)

__noinline int kv8_weights(struct attention_i8_args *a __arg_nonnull, u32 j, u32 h0, u32 pair,
			   u32 two)
{
	u32 npos;
	u64 o1;
	struct kv8_weights_walk c;
	QB_VEC_T(const u64) acc;

	if (!a)
		return 1;
	npos = a->pos + 1;
	o1 = (u64)a->max_ctx * two;
	acc = QB_VEC(const u64, arena, a->acc + (u64)pair * a->hd * 8, 3);
	if (!QB_VEC_OK(acc))
		return 1;
	c = (struct kv8_weights_walk){
		.wv = QB_VEC(u64, arena, a->wv + (u64)pair * a->max_ctx * 8, npos),
		.vs = QB_VEC(const u32, arena, a->v_steps + (u64)j * a->steps_stride, npos),
		.p = QB_VEC(const u32, arena, a->probs + (u64)h0 * a->max_ctx * 4, o1 + npos),
		.inv0 = QB_IX(const u64, acc, 0), .inv1 = QB_IX(const u64, acc, 1),
		.invv = QB_IX(const u64, acc, 2), .o1 = (u32)o1, .two = two,
	};
	if (!QB_VEC_OK(c.wv) || !QB_VEC_OK(c.vs) || !QB_VEC_OK(c.p))
		return 1;
	ATT_EACH(kv8_weight_step, npos, &c);
	return 0;
}

/* Step 5 of kv8_attend_pair: the pair's value sums (acc, zeroed first), then its outputs. */
struct kv8_out_walk {
	QB_VEC_T(u64) acc;
	QB_VEC_T(s32) out; /* heads h0 (and h0 + 1 when two): [hd] each */
	u64 acca, wva, vc;
	s64 vmax;
	u32 hd, npos, two;
};

static __always_inline int kv8_zero_step(struct kv8_out_walk *c, u32 d)
{
	QB_IX(u64, c->acc, d) = 0;
	return 0;
}
QB_EACH_FN(kv8_zero_step, struct kv8_out_walk)

#ifndef QB_ARRAY_LAYER
/* value rows [blk KV8_TBLOCK, +KV8_TBLOCK) into the sums (the arena build's blocks) */
static __always_inline int kv8_block_step(struct kv8_out_walk *c, u32 blk)
{
	u32 t0 = blk * KV8_TBLOCK;

	kv8_axpys(c->acca, c->wva + (u64)t0 * 8, c->vc + (u64)t0 * c->hd, c->hd,
		  c->hd | (u64)(c->npos - t0) << 32);
	return 0;
}
#endif

static __always_inline int kv8_out_step(struct kv8_out_walk *c, u32 d)
{
	u64 w = QB_IX(u64, c->acc, d);

	QB_IX(s32, c->out, d) = sat32(rshr(lane0(w) * c->vmax, 30));
	if (c->two)
		QB_IX(s32, c->out, c->hd + d) = sat32(rshr(lane1(w) * c->vmax, 30));
	return 0;
}
QB_EACH_FN(kv8_out_step, struct kv8_out_walk)

/* Step 5: out = lane * V / 2^30 of the sums of weighted value codes (two_v = two | V << 32).
 * Inline over the arena: a frame more made generate's calls 528 bytes of stack on 7.3.4. */
#ifdef QB_ARRAY_LAYER
__noinline
#else
static __always_inline
#endif
int kv8_values(struct attention_i8_args *a __arg_nonnull, u32 j, u32 h0, u32 pair,
			  u64 two_v)
{
	struct kv8_out_walk c;
	u32 hd;
	u64 acca;

	if (!a)
		return 1;
	hd = a->hd;
	acca = a->acc + (u64)pair * hd * 8;
	c = (struct kv8_out_walk){
		.acc = QB_VEC(u64, arena, acca, hd),
		.out = QB_VEC(s32, arena, a->out + (u64)h0 * hd * 4, (u64)hd << (two_v & 1)),
		.acca = acca, .wva = a->wv + (u64)pair * a->max_ctx * 8,
		.vc = a->v_codes + (u64)j * a->codes_stride,
		.vmax = (s64)(two_v >> 32), .hd = hd, .npos = a->pos + 1, .two = two_v & 1,
	};
	if (!QB_VEC_OK(c.acc) || !QB_VEC_OK(c.out))
		return 1;
	ATT_EACH(kv8_zero_step, hd, &c);
#ifndef QB_ARRAY_LAYER
	ATT_EACH(kv8_block_step, (c.npos + KV8_TBLOCK - 1) / KV8_TBLOCK, &c);
#else
	if (kv8_axpys(c.acca, c.wva, c.vc, hd, hd | (u64)c.npos << 32))
		return 1;
#endif
	ATT_EACH(kv8_out_step, hd, &c);
	return 0;
}

/* One pair of query heads (h0 and, when `two`, h0 + 1) of kv head j over positions 0..pos. */
__noinline int kv8_attend_pair(struct attention_i8_args *a __arg_nonnull, u32 j, u32 h0, u32 two,
			    u32 pair)
{
	QB_VEC_T(u64) acc;
	u32 hd, npos, ee, e0, e1;
	u64 pa0;
	u64 sum0, sum1 = 1ULL << Q_ONE, vmax;
	s64 m0, m1;

	if (!a)
		return 1;
	hd = a->hd;
	npos = a->pos + 1;
	pa0 = a->probs + (u64)h0 * a->max_ctx * 4; /* head h0's row, then h0 + 1's */
	acc = QB_VEC(u64, arena, a->acc + (u64)pair * hd * 8, 3);
	if (!QB_VEC_OK(acc))
		return 1;
	/* 1. packed queries */
	ee = kv8_pack_queries(a->q + (u64)h0 * hd * 4, a->qq + (u64)pair * hd * 8, a->ksh, hd, two);
	e0 = ee & 0xff;
	e1 = (ee >> 8) & 0xff;
	if (e0 > 60 || e1 > 60)
		return 1;
	/* 2. scores, maxima, largest value step (over the arena the dots first, here: under
	 * kv8_scores they made run_plan's calls 528 bytes of stack on 7.3.4, of 512) */
#ifndef QB_ARRAY_LAYER
	if (kv8_dots(a->qq + (u64)pair * hd * 8, a->k_codes + (u64)j * a->codes_stride, hd,
		     a->wv + (u64)pair * a->max_ctx * 8, hd | (u64)npos << 32))
		return 1;
#endif
	if (kv8_scores(a, j, h0, pair, two | e0 << 8 | e1 << 16))
		return 1;
	m0 = (s64)QB_IX(u64, acc, 0);
	m1 = (s64)QB_IX(u64, acc, 1);
	vmax = QB_IX(u64, acc, 2);
	/* 3. exp(s - m) and the sums */
	sum0 = softmax_exp(pa0, a->exp2, m0, npos);
	if (two)
		sum1 = softmax_exp(pa0 + (u64)a->max_ctx * 4, a->exp2, m1, npos);
	if (sum0 == 0 || sum1 == 0)
		return 1;
	/* 4. packed value weights W_t of both heads */
	QB_IX(u64, acc, 0) = (1ULL << 62) / sum0;
	QB_IX(u64, acc, 1) = (1ULL << 62) / sum1;
	QB_IX(u64, acc, 2) = vmax ? (1ULL << 55) / vmax : 0;
	if (kv8_weights(a, j, h0, pair, two))
		return 1;
	/* 5. sums of weighted value codes, then out = lane * V / 2^30 */
	return kv8_values(a, j, h0, pair, two | vmax << 32);
}

/* The operator's two loops: kv heads kv0 + i (append), then their pairs of query heads. */
struct kv8_op_walk {
	struct attention_i8_args *a;
	u32 g, pairs, err;
};

/* 0. kv head kv0 + i's key and value rows, quantised, into the caches' row pos */
static __always_inline int kv8_append_step(struct kv8_op_walk *w, u32 i)
{
	struct attention_i8_args *a = w->a;
	u32 j = a->kv0 + i, hd = a->hd;
	u64 c = (u64)j * a->codes_stride + (u64)a->pos * hd;
	u64 st = (u64)j * a->steps_stride + (u64)a->pos * 4;

	w->err |= kv8_quant_row(a->k + (u64)j * hd * 4, a->k_codes + c, a->k_steps + st, a->ksh, hd);
	w->err |= kv8_quant_row(a->v + (u64)j * hd * 4, a->v_codes + c, a->v_steps + st, 0, hd);
	return 0;
}
QB_EACH_FN(kv8_append_step, struct kv8_op_walk)

/* pair i % pairs of kv head kv0 + i / pairs (none after an error) */
static __always_inline int kv8_pair_step(struct kv8_op_walk *w, u32 i)
{
	struct attention_i8_args *a = w->a;
	u32 j = a->kv0 + i / w->pairs, k = i % w->pairs;

	if (!w->err)
		w->err = kv8_attend_pair(a, j, j * w->g + 2 * k, 2 * k + 1 < w->g, j * w->pairs + k);
	return w->err != 0;
}
QB_EACH_FN(kv8_pair_step, struct kv8_op_walk)

/* Whether every buffer lies in one element (always, in the arena). A function of its own on
 * arrays: its lookups' stack stays out of the chain down to kv8_dot_row (6.1: 512 bytes). */
#ifdef QB_ARRAY_LAYER
static __noinline int kv8_ok(struct attention_i8_args *a, u32 pairs_total)
{
	u64 hd = a->hd, n = a->max_ctx, qd = (u64)a->n_q * hd, kvd = (u64)a->n_kv * hd;
	u64 codes = (u64)(a->n_kv - 1) * a->codes_stride + n * hd;
	u64 steps = (u64)(a->n_kv - 1) * a->steps_stride + n * 4;

	return QB_VEC_OK(QB_VEC(const s32, arena, a->q, qd)) &&
	       QB_VEC_OK(QB_VEC(const s32, arena, a->k, kvd)) &&
	       QB_VEC_OK(QB_VEC(const s32, arena, a->v, kvd)) &&
	       QB_VEC_OK(QB_VEC(s8, arena, a->k_codes, codes)) &&
	       QB_VEC_OK(QB_VEC(s8, arena, a->v_codes, codes)) &&
	       QB_VEC_OK(QB_VEC(char, arena, a->k_steps, steps)) &&
	       QB_VEC_OK(QB_VEC(char, arena, a->v_steps, steps)) &&
	       QB_VEC_OK(QB_VEC(u32, arena, a->probs, (u64)a->n_q * n)) &&
	       QB_VEC_OK(QB_VEC(u64, arena, a->wv, pairs_total * n)) &&
	       QB_VEC_OK(QB_VEC(u64, arena, a->qq, pairs_total * hd)) &&
	       QB_VEC_OK(QB_VEC(u64, arena, a->acc, pairs_total * hd)) &&
	       QB_VEC_OK(QB_VEC(s32, arena, a->out, qd)) &&
	       QB_VEC_OK(QB_VEC(const u32, arena, a->exp2, EXP2_ENTRIES)) &&
	       QB_VEC_OK(QB_VEC(const u8, arena, a->ksh, hd));
}
#else
#define kv8_ok(a, pairs_total) 1
#endif

/* Causal GQA attention over the int8 cache at position pos, for kv heads kv0..kv1: quantise and
 * append those heads' k and v rows, then attend their query heads, two at a time. */
OP(attention_i8, struct attention_i8_args)
{
	u32 hd = a->hd, n_kv = a->n_kv;
	struct kv8_op_walk w = { .a = a };

	QB_MEM_USE(arena);
	if (a->pos >= a->max_ctx || n_kv == 0 || a->n_q % n_kv || hd < 4 || hd > KV8_HD_MAX ||
	    a->kv0 >= a->kv1 || a->kv1 > n_kv || a->codes_stride < (u64)a->max_ctx * hd ||
	    a->steps_stride < (u64)a->max_ctx * 4)
		return 1;
	w.g = a->n_q / n_kv;
	w.pairs = (w.g + 1) / 2;
	if (!kv8_ok(a, n_kv * w.pairs))
		return 1;
	ATT_EACH(kv8_append_step, a->kv1 - a->kv0, &w);
	if (w.err)
		return 1;
	ATT_EACH(kv8_pair_step, (a->kv1 - a->kv0) * w.pairs, &w);
	return w.err != 0;
}
