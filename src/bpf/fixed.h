// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* Fixed-point formats and integer helpers shared by every operator. Mirrored, constant for
 * constant and function for function, in src/fixed.rs; the `formats` program reports these
 * constants so that a test can check that the two agree. A value in format Qn is round(v * 2^n). */
#pragma once
#include "mem.h"
#include "limits.h"

#define Q_ACT 16  /* activations, K/V cache, logits: s32 */
#define Q_RES 32  /* the residual stream: s64, so that it keeps ~30 significant bits even when its
		   * rms is small (embeddings are ~0.03: Q16 would leave 11 bits) */
#define Q_Q 22    /* queries after q_norm and RoPE: s32, |q| < 512. Their rounding error is
		   * multiplied by the keys, which reach ~1000 where k_norm is large */
#define Q_W 24    /* linear weights and embeddings: s32, |w| < 128 */
#define Q_NORM 20 /* RMSNorm weights: s32, |w| < 2048 (real Qwen3 k_norm exceeds Q24's 128) */
#define Q_NRM 24  /* a normalised value x / rms inside RMSNorm (|.| <= sqrt(n)) */
#define Q_ONE 30  /* RoPE cos/sin, the exp2 table, attention probabilities: 1.0 = 2^30 */
#define Q_SCALE 22 /* the attention scale head_dim^-0.5 */
#define EXP2_BITS 8 /* exp2 table: 2^(-i/256), i = 0..256, linearly interpolated */
#define EXP2_ENTRIES ((1 << EXP2_BITS) + 1)
#define LOG2E_Q30 1549082005LL /* round(log2(e) * 2^30) */
#define ACT_MAX 2147483647LL /* activations saturate to +-ACT_MAX (never INT_MIN) */
#define RES_MAX (1LL << 62) /* the residual stream saturates to +-RES_MAX */

/* Round-half-up arithmetic shift right by sh >= 1, without the overflow of adding 2^(sh-1). */
static __always_inline s64 rshr(s64 v, u32 sh)
{
	return (v >> sh) + ((v >> (sh - 1)) & 1);
}

/* Values clamped to their format since the programs were loaded: sat32 and sat_res count every
 * clamp here, so that user space reports saturation instead of hiding it. A .bss global read
 * through the skeleton; atomic because row-split runs of one program execute concurrently. Only
 * the clamping branches touch it, so it costs nothing while values fit. */
u64 saturations;
#define COUNT_SATURATION() __sync_fetch_and_add(&saturations, 1)

/* Saturate to the activation range (counted). */
static __always_inline s32 sat32(s64 v)
{
	if (v > ACT_MAX) {
		COUNT_SATURATION();
		return ACT_MAX;
	}
	if (v < -ACT_MAX) {
		COUNT_SATURATION();
		return -ACT_MAX;
	}
	return (s32)v;
}

/* The verifier tracks known constants along every branch: a loop of data-dependent ifs over a
 * known accumulator (isqrt's r) splits into 2^32 states. These helpers are branch-free, and
 * OPAQUE() stops clang from turning the arithmetic back into compares and branches. */
#define OPAQUE(v) asm volatile("" : "+r"(v))

/* 1 if v != 0 else 0, for v < 2^63. */
static __always_inline u64 nonzero(u64 v)
{
	u64 neg = -v;

	OPAQUE(neg);
	return (v | neg) >> 63;
}

/* Saturate to the residual range (counted). */
static __always_inline s64 sat_res(s64 v)
{
	if (v > RES_MAX) {
		COUNT_SATURATION();
		return RES_MAX;
	}
	if (v < -RES_MAX) {
		COUNT_SATURATION();
		return -RES_MAX;
	}
	return v;
}

/* Number of significant bits of v < 2^63 (0 for 0). */
static __always_inline u32 bitlen(u64 v)
{
	u64 n = 0, sh;

	sh = nonzero(v >> 32) << 5; v >>= sh; n += sh;
	sh = nonzero(v >> 16) << 4; v >>= sh; n += sh;
	sh = nonzero(v >> 8) << 3; v >>= sh; n += sh;
	sh = nonzero(v >> 4) << 2; v >>= sh; n += sh;
	sh = nonzero(v >> 2) << 1; v >>= sh; n += sh;
	sh = nonzero(v >> 1); v >>= sh; n += sh;
	return (u32)(n + v);
}

/* floor(sqrt(v)) for v in [2^60, 2^62): eight integer Newton steps down from 2^31 (>= sqrt(v)),
 * which settle on floor or floor + 1, then one correction. Branch-free but for the last step:
 * the verifier sees unknown values, not a tree of constants. */
static __always_inline u64 isqrt(u64 v)
{
	u64 r = 1ULL << 31;

	for (int i = 0; i < 8; i++)
		r = (r + v / r) >> 1;
	if (r * r > v)
		r -= 1;
	return r;
}

/* exp(-a) in Q30 for a >= 0 in Q16 (a <= ACT_MAX), from a 257-entry table of 2^(-i/256) in Q30. */
static __always_inline u64 exp_neg(u64 a, QB_VEC_T(const u32) tab)
{
	u64 t = (a * LOG2E_Q30) >> Q_ONE; /* a * log2(e), Q16 */
	u64 ip = t >> 16, fr = t & 0xffff;
	u64 idx = fr >> (16 - EXP2_BITS), lo = fr & ((1 << (16 - EXP2_BITS)) - 1);
	u64 t0, t1, v;

	if (ip >= 31)
		return 0;
	t0 = QB_IX(const u32, tab, idx & 255);
	t1 = QB_IX(const u32, tab, (idx & 255) + 1);
	v = t0 - (((t0 - t1) * lo) >> (16 - EXP2_BITS));
	return ip ? (u64)rshr((s64)v, (u32)ip) : v;
}

/* silu(g) * u, both Q16: silu(g) = g * sigmoid(g), sigmoid from exp(-|g|). */
static __always_inline s32 swiglu(s32 g, s32 u, QB_VEC_T(const u32) tab)
{
	u64 a = g < 0 ? (u64)(-(s64)g) : (u64)g;
	u64 e = exp_neg(a, tab); /* Q30, <= 2^30 */
	u64 sig = g >= 0 ? (1ULL << 60) / ((1ULL << 30) + e) : (e << 30) / ((1ULL << 30) + e);
	s64 silu = rshr((s64)g * (s64)sig, Q_ONE);

	return sat32(rshr(silu * (s64)u, Q_ACT));
}

/* An attention score: s = q . k_t in Q16, clamped to +-2^40 so that s * scale (the Q22
 * hd^-0.5) cannot overflow, then scaled to Q16 and saturated. The Q16 and the int8 KV cache's
 * attention share it. */
static __always_inline s32 attn_score(s64 s, s64 scale)
{
	if (s > (1LL << 40))
		s = 1LL << 40;
	if (s < -(1LL << 40))
		s = -(1LL << 40);
	return sat32(rshr(s * scale, Q_SCALE));
}
