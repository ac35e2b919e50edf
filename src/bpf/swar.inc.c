// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* Low-bit SWAR (SIMD within a register) matrix-vector kernels: W4A8 and W8A16.
 * Included at the end of ops.bpf.c: shares its `arena` map and fixed.h's helpers.
 * src/swar.rs holds the formats, the packing and a Rust twin of every program here.
 *
 * BPF has no vector instructions, but one 64-bit multiply of a word holding several small
 * weights (one per "lane") by one activation yields several products at once. Formats:
 *
 *   weights   code w in -8..7 (W4) or -128..127 (W8), one u32 scale s per (row, group of 32
 *             columns): weight = w * s / 2^24 (scale Q24, SW_SCALE_SHIFT).
 *             W4: u64 word (b, q, h) of [rows/8][k/4][2] holds rows 8b+4h+l (l = 0..3) times
 *                 columns 4q+c (c = 0..3), nibble w+8 at bit 16l+4c (four 16-bit lanes).
 *                 scales u32 [rows/8][k/32][8]: row 8b+l, group g at (b * k/32 + g) * 8 + l.
 *             W8: u64 word (b, q, h) of [rows/4][k/4][2] holds rows 4b+2h+l (l = 0..1) times
 *                 columns 4q+c, byte w+128 at bit 32l+8c (two 32-bit lanes).
 *                 scales u32 [rows/4][k/32][4].
 *   activations x (s32 Q16) quantised per block of 32 columns by quantize_x8 / quantize_x16:
 *             shift e, the least with round(max|x| / 2^e) <= QMAX (so x ~= xq * 2^e in Q16
 *             units: a power-of-two scale, applied by a shift instead of a multiply),
 *             xq = round(x / 2^e) (half away from zero) in -QMAX..QMAX, QMAX = 127 (a8) or
 *             32767 (a16). One buffer of 8.5 k bytes: s64 xq [k], then
 *             struct swar_xblock { sum of xq, e } [k/32].
 *   output    y[r] = sat(round(sum_g (s[r][g] * D[r][g]) << e[g] / 2^24)) in Q16, where
 *             D[r][g] = sum over the group's columns of w * xq, exactly.
 *
 * The lane algebra (W4; W8 is the same with two 32-bit lanes and bias 128). All word arithmetic
 * is in the ring of integers mod 2^64, where a 64-bit multiply-add is exact whatever the carries
 * between lanes do. A weight word unpacked for column c, u = (v >> 4c) & M4, equals
 * sum_l (w_l + 8) 2^(16 l). Summing u * xq over the 32 columns of a group gives
 *     A = sum_l (D_l + 8 S) 2^(16 l)      (mod 2^64),   S = sum of the group's xq,
 * and adding kx = C - 8 S R, with R = sum_l 2^(16 l) and C = 2^15 (1 + 2^16 + 2^32), gives
 *     Q = (D_0 + 2^15) + (D_1 + 2^15) 2^16 + (D_2 + 2^15) 2^32 + D_3 2^48   (mod 2^64).
 * |D_l| <= 32 * 8 * 127 = 32512 < 2^15, so the first three brackets are 16-bit digits in
 * [0, 2^16) and the value lies in [-2^63, 2^63): Q read as s64 is that value, and
 *     D_l = ((Q >> 16 l) & 0xffff) - 2^15 (l < 3),   D_3 = Q >> 48 (arithmetic shift).
 * No spills inside a group and no weight sums are needed: the +8 bias is removed through the
 * activations' block sum. W8: |D| <= 32 * 128 * 32767 < 2^27 < 2^31 in 32-bit lanes.
 *
 * The row accumulator sum_g (s * D) << e is an s64 (computed as u64: it wraps, identically in the
 * twin) and is exact while every partial sum stays below 2^63 / 2^40 = 2^23 in real terms, 256
 * times the largest output (outputs saturate at 2^15). */
#pragma once

#define SW_GROUP LIM_SWAR_COLS_ALIGN /* columns per weight-scale group and activation block: 32 */
#define SW_SCALE_SHIFT 24  /* weight scales are Q24 */
_Static_assert(SW_SCALE_SHIFT == Q_W, "finish_row_q16 finishes SWAR rows as Q24 weights");
#define SW_KMAX LIM_COLS_MAX /* most columns: 16384 */
#define SW_MODE_STORE 0
#define SW_MODE_ACCUMULATE 1
#define SW_MODE_ARGMAX 2

/* W4: four 16-bit lanes. */
#define SW4_MASK 0x000F000F000F000FULL  /* one nibble per lane */
#define SW4_ONES 0x0001000100010001ULL  /* R: 1 in every lane */
#define SW4_HALF 0x0000800080008000ULL  /* C: 2^15 in lanes 0..2 */
/* W8: two 32-bit lanes. */
#define SW8_MASK 0x000000FF000000FFULL
#define SW8_ONES 0x0000000100000001ULL
#define SW8_HALF 0x0000000080000000ULL  /* 2^31 in lane 0 */

/* Columns 4q..4q+3 (q a literal) of a group's weight-word pair: the words v0 = w[2q],
 * v1 = w[2q + 1] (row halves 0 and 1 of the block), and for each column c x = xq[4q + c],
 * a0 += ((v0 >> c cb) & m) * x, a1 += ((v1 >> c cb) & m) * x (cb = the code width, a literal),
 * as 44 BPF instructions for eight multiplies. Written as one asm block because clang, given the
 * same C, holds the four activations and both words at once, runs out of BPF's ten registers and
 * spills the pointers: about 6.5 instructions per multiply instead of 5.5. Nine registers: the
 * two sums, the words, the mask (m must be a register: see the kernels'
 * `asm volatile("" : "+r"(m))`), x, one temporary and the two pointers. */
#define SW_COL2(sh)                                                                      \
	"%[xv] = *(u64 *)(%[xpp] + %[xo" #sh "])\n\t"                                    \
	"%[tt] = %[va]\n\t%[tt] >>= %[s" #sh "]\n\t%[tt] &= %[msk]\n\t%[tt] *= %[xv]\n\t"  \
	"%[aa] += %[tt]\n\t"                                                               \
	"%[tt] = %[vb]\n\t%[tt] >>= %[s" #sh "]\n\t%[tt] &= %[msk]\n\t%[tt] *= %[xv]\n\t"  \
	"%[ab] += %[tt]\n\t"
#define SW_QUAD_PACKED(a0, a1, wp, xp, q, m, cb, v0, v1, xv, t)                        \
	asm("%[va] = *(u64 *)(%[wpp] + %[wo])\n\t%[vb] = *(u64 *)(%[wpp] + %[wo1])\n\t"    \
	    "%[xv] = *(u64 *)(%[xpp] + %[xo0])\n\t"                                        \
	    "%[tt] = %[va]\n\t%[tt] &= %[msk]\n\t%[tt] *= %[xv]\n\t%[aa] += %[tt]\n\t"      \
	    "%[tt] = %[vb]\n\t%[tt] &= %[msk]\n\t%[tt] *= %[xv]\n\t%[ab] += %[tt]\n\t"      \
	    SW_COL2(1) SW_COL2(2) SW_COL2(3)                                              \
	    : [aa] "+r"(a0), [ab] "+r"(a1), [va] "=&r"(v0), [vb] "=&r"(v1), [xv] "=&r"(xv), \
	      [tt] "=&r"(t)                                                               \
	    : [wpp] "r"(wp), [xpp] "r"(xp), [msk] "r"(m), [wo] "i"(16 * (q)),              \
	      [wo1] "i"(16 * (q) + 8), [xo0] "i"(32 * (q)), [xo1] "i"(32 * (q) + 8),       \
	      [xo2] "i"(32 * (q) + 16), [xo3] "i"(32 * (q) + 24), [s1] "i"(cb),            \
	      [s2] "i"(2 * (cb)), [s3] "i"(3 * (cb)))

/* The same two multiply-adds for column j (a literal, 0..31) of a group from unpacked words
 * (swar_unpack): x = xq[j], a0 += u[2 j] * x, a1 += u[2 j + 1] * x, as seven BPF instructions,
 * all operands in registers: the batched kernels' inner step. */
#define SW_UMAC2(a0, a1, up, xp, j, xv, t0, t1)                                        \
	asm("%[xv] = *(u64 *)(%[xpp] + %[xo])\n\t"                                       \
	    "%[ta] = *(u64 *)(%[upp] + %[uo])\n\t%[ta] *= %[xv]\n\t%[aa] += %[ta]\n\t"      \
	    "%[tb] = *(u64 *)(%[upp] + %[vo])\n\t%[tb] *= %[xv]\n\t%[ab] += %[tb]"          \
	    : [aa] "+r"(a0), [ab] "+r"(a1), [xv] "=&r"(xv), [ta] "=&r"(t0), [tb] "=&r"(t1)   \
	    : [xpp] "r"(xp), [upp] "r"(up), [xo] "i"(8 * (j)), [uo] "i"(16 * (j)),         \
	      [vo] "i"(16 * (j) + 8))
#define SW_UQUAD(a0, a1, up, xp, q, xv, t0, t1)                                        \
	do {                                                                            \
		SW_UMAC2(a0, a1, up, xp, 4 * (q), xv, t0, t1);                          \
		SW_UMAC2(a0, a1, up, xp, 4 * (q) + 1, xv, t0, t1);                      \
		SW_UMAC2(a0, a1, up, xp, 4 * (q) + 2, xv, t0, t1);                      \
		SW_UMAC2(a0, a1, up, xp, 4 * (q) + 3, xv, t0, t1);                      \
	} while (0)

struct swar_xblock {
	s64 sum;   /* sum of the block's quantised activations */
	s64 shift; /* e: x ~= xq << e, Q16 units, 0..25 */
};

/* ------------------------------------------------------------------ activation quantisation */

struct quantize_x_args {
	u64 x;   /* s32 Q16 [nb][k] */
	u64 xq;  /* out, per vector (SW_XQ_BYTES(k) each): s64 xq [k] in -qmax..qmax, then
		  * struct swar_xblock [k/32] */
	u32 k;   /* a multiple of 32, <= 16384 */
	u32 nb;  /* vectors, 1..LIM_BATCH_MAX */
};

/* Bytes of one vector's quantised activations (QuantX::bytes in src/swar.rs). */
#define SW_XQ_BYTES(k) ((u64)(k) * 8 + (u64)(k) / SW_GROUP * 16)

/* One block of 32: e is the least shift with round(max|x| / 2^e) <= qmax, so every code is at
 * most qmax; xq = round(|x| / 2^e) with x's sign, as (|x| + (2^e >> 1)) >> e (half up).
 * |x| <= 2^31 keeps the sums in u64 and e <= 25. A power-of-two scale costs at most one bit of
 * the code range and lets the matvec kernels apply it with a shift, not a multiply (W4A8
 * spends 81 multiplies per 256 products with a multiply here, 73 with the shift). */
__noinline int quantize_block(u64 xa, u64 qa, u64 ba, u32 qmax)
{
	const s32 __arena *x = ARENA_PTR(const s32, xa);
	s64 __arena *q = ARENA_PTR(s64, qa);
	struct swar_xblock __arena *b = ARENA_PTR(struct swar_xblock, ba);
	u64 m = 0, sum = 0;
	u32 e = 0;

	for (int j = 0; j < SW_GROUP; j++) {
		s64 v = x[j];
		u64 a = v < 0 ? -v : v;

		m = a > m ? a : m;
	}
	while (e < 31 && ((m + ((1ULL << e) >> 1)) >> e) > qmax)
		e++;
	for (int j = 0; j < SW_GROUP; j++) {
		s64 v = x[j];
		u64 a = (u64)(v < 0 ? -v : v);
		s64 r = (s64)((a + ((1ULL << e) >> 1)) >> e);

		r = v < 0 ? -r : r;
		q[j] = r;
		sum += r;
	}
	b->sum = (s64)sum;
	b->shift = e;
	return 0;
}

static __always_inline int quantize_x(struct quantize_x_args *a, u32 qmax)
{
	u32 k = a->k, nb = a->nb;

	USE_ARENA(arena);
	if (k == 0 || k % SW_GROUP || k > SW_KMAX || nb == 0 || nb > LIM_BATCH_MAX)
		return 1;
	FOR(v, 0, nb) {
		u64 x = a->x + (u64)v * k * 4, xq = a->xq + v * SW_XQ_BYTES(k);
		u64 blk = xq + (u64)k * 8;

		LOOP(g, 0, k / SW_GROUP)
			quantize_block(x + g * SW_GROUP * 4, xq + g * SW_GROUP * 8, blk + g * 16, qmax);
	}
	return 0;
}

/* Activations for the W4A8 kernels: int8 codes in -127..127 per block of 32. */
OP(quantize_x8, struct quantize_x_args)
{
	return quantize_x(a, 127);
}

/* Activations for the W8A16 kernels: int16 codes in -32767..32767 per block of 32. */
OP(quantize_x16, struct quantize_x_args)
{
	return quantize_x(a, 32767);
}

/* ------------------------------------------------------------------ matvec and LM head */

struct swar_mv_args {
	u64 w;       /* packed weight words (layouts above) */
	u64 s;       /* u32 Q24 weight scales */
	u64 xq;      /* quantised activations: s64 [k], then struct swar_xblock [k/32] */
	u64 y;       /* s32 Q16 [rows] out; LM head: logits, or 0 to skip writing them */
	u32 k;       /* columns: a multiple of 32, <= 16384 */
	u32 row0, nrows; /* multiples of 8 (W4) or 4 (W8) */
	u32 accumulate;  /* matvec: 1 = y (the s64 Q32 residual stream) += W x, saturating;
			  * 0 = y (s32 Q16) = W x */
	u32 best;    /* LM head out: argmax row (first on ties) */
	u32 nb;      /* vectors, 1..LIM_BATCH_MAX (the LM head: 1): x b at xq + b * SW_XQ_BYTES(k) */
	s64 best_val; /* LM head out: its logit, Q16 */
	u64 ystride; /* bytes between the vectors of y */
	u64 unpack;  /* nb > 1: this part's scratch of 16 k bytes for the unpacked row block
		      * (swar_unpack), or 0 to read the packed words for every vector */
};

/* Digit l of a decoded group word with `lanes` lanes of `bits` bits (see the algebra above):
 * the top lane is read signed, the others lifted by 2^(bits-1). l, lanes and bits are
 * compile-time constants. */
static __always_inline u64 lane(u64 q, int l, int lanes, int bits)
{
	if (l == lanes - 1)
		return (u64)((s64)q >> (bits * l));
	return ((q >> (bits * l)) & ((1ULL << bits) - 1)) - (1ULL << (bits - 1));
}

/* The end of a row block: y = sat(round(acc / 2^24)) in Q16, written unless ya == 0, or in
 * accumulate mode y += round(acc / 2^8) into the s64 Q32 residual stream; returns the block's
 * best row packed as logit * 8 + 7 - l, so that the larger packed value is the larger logit and,
 * on ties, the lower row. */
static __always_inline s64 finish_row(u64 acc, u64 ya, int l, u32 mode)
{
	return (s64)finish_row_q16((s64)acc, ya, l, mode == SW_MODE_ACCUMULATE) * 8 + (7 - l);
}

/* A row block's words unpacked once for a batch: u[(4 q + c) * 2 + h] = (w[q][h] >> c * cb) & m
 * (cb = 4 with W4's mask, 8 with W8's), the very lane words that SW_QUAD_PACKED forms for column 4q + c,
 * so that the batched kernels spend no shift or mask per vector. wa = the block's [k/4][2]
 * words, ua = 16 k bytes of scratch. k / 4 <= 4096 iterations. */
__noinline int swar_unpack(u64 wa, u64 ua, u32 k, u32 w8)
{
	const u64 __arena *w = ARENA_PTR(const u64, wa);
	u64 __arena *u = ARENA_PTR(u64, ua);
	u64 m = w8 ? SW8_MASK : SW4_MASK, cb = w8 ? 8 : 4;

	for (u32 q = 0; q < k / 4 && can_loop; q++) {
		u64 v0 = w[2 * q], v1 = w[2 * q + 1];

#pragma unroll
		for (int c = 0; c < 4; c++) {
			u[8 * q + 2 * c] = (v0 >> (cb * c)) & m;
			u[8 * q + 2 * c + 1] = (v1 >> (cb * c)) & m;
		}
	}
	return 0;
}

/* One row block times quantised x: w8 = 0 for eight rows of W4 (four 16-bit lanes per word,
 * bias 8), 1 for four rows of W8 (two 32-bit lanes, bias 128), a compile-time constant. wa = the
 * block's [k/4][2] words, or with `unpacked` its swar_unpack scratch, sa = its [k/32][rows]
 * scales, xqa = the quantised activations, ya = &y[first row] or 0, k_mode = k | mode << 32.
 * Both forms add the same products in the same order. Returns the block's best row as
 * finish_row packs it. */
static __always_inline s64 swar_rows(u64 wa, u64 sa, u64 xqa, u64 ya, u64 k_mode, const int w8,
				     const int unpacked)
{
	const int lanes = w8 ? 2 : 4, bits = w8 ? 32 : 16, rows = 2 * lanes;
	u32 k = (u32)k_mode, mode = (u32)(k_mode >> 32);
	u64 xba = xqa + (u64)k * 8;
	u64 acc[8] = {};
	u64 m = w8 ? SW8_MASK : SW4_MASK;
	s64 best = -(1LL << 62), p;

	asm volatile("" : "+r"(m)); /* keep the mask in a register */
	for (u32 g = 0; g < k / SW_GROUP && can_loop; g++) {
		const u64 __arena *w = ARENA_PTR(const u64, wa) + g * 16;
		const s64 __arena *x = ARENA_PTR(const s64, xqa) + g * SW_GROUP;
		const u32 __arena *s = ARENA_PTR(const u32, sa) + g * rows;
		const struct swar_xblock __arena *b = ARENA_PTR(const struct swar_xblock, xba) + g;
		u64 a0 = 0, a1 = 0; /* the block's first and second half of rows, one lane each */
		u64 kx, e;

		if (unpacked) {
			const u64 __arena *up = ARENA_PTR(const u64, wa) + g * 64;
			const s64 __arena *xp = x;
			u64 xv, t0, t1;

			ARENA_CAST(up);
			ARENA_CAST(xp);
			SW_UQUAD(a0, a1, up, xp, 0, xv, t0, t1);
			SW_UQUAD(a0, a1, up, xp, 1, xv, t0, t1);
			SW_UQUAD(a0, a1, up, xp, 2, xv, t0, t1);
			SW_UQUAD(a0, a1, up, xp, 3, xv, t0, t1);
			SW_UQUAD(a0, a1, up, xp, 4, xv, t0, t1);
			SW_UQUAD(a0, a1, up, xp, 5, xv, t0, t1);
			SW_UQUAD(a0, a1, up, xp, 6, xv, t0, t1);
			SW_UQUAD(a0, a1, up, xp, 7, xv, t0, t1);
		} else {
			const u64 __arena *wp = w;
			const s64 __arena *xp = x;
			const int cb = w8 ? 8 : 4;
			u64 v0, v1, xv, t;

			ARENA_CAST(wp);
			ARENA_CAST(xp);
			SW_QUAD_PACKED(a0, a1, wp, xp, 0, m, cb, v0, v1, xv, t);
			SW_QUAD_PACKED(a0, a1, wp, xp, 1, m, cb, v0, v1, xv, t);
			SW_QUAD_PACKED(a0, a1, wp, xp, 2, m, cb, v0, v1, xv, t);
			SW_QUAD_PACKED(a0, a1, wp, xp, 3, m, cb, v0, v1, xv, t);
			SW_QUAD_PACKED(a0, a1, wp, xp, 4, m, cb, v0, v1, xv, t);
			SW_QUAD_PACKED(a0, a1, wp, xp, 5, m, cb, v0, v1, xv, t);
			SW_QUAD_PACKED(a0, a1, wp, xp, 6, m, cb, v0, v1, xv, t);
			SW_QUAD_PACKED(a0, a1, wp, xp, 7, m, cb, v0, v1, xv, t);
		}
		/* A + kx: remove the weights' bias (bias * S per lane), lift the lower lanes by half
		 * their range */
		if (w8)
			kx = SW8_HALF - (u64)(128 * b->sum) * SW8_ONES;
		else
			kx = SW4_HALF - (u64)(8 * b->sum) * SW4_ONES;
		e = (u64)b->shift;
		a0 += kx;
		a1 += kx;
		/* acc += (D * s) << e, in u64 (wrapping exactly like the twin) */
#pragma unroll
		for (int l = 0; l < lanes; l++) {
			acc[l] += lane(a0, l, lanes, bits) * s[l] << e;
			acc[lanes + l] += lane(a1, l, lanes, bits) * s[lanes + l] << e;
		}
	}
#pragma unroll
	for (int l = 0; l < rows; l++) {
		p = finish_row(acc[l], ya, l, mode);
		best = p > best ? p : best;
	}
	return best;
}

/* Eight rows of W4 (swar_rows). A global function: the verifier checks it once, but walks its
 * group loop once per possible iteration (SW_KMAX / 32 = 512: ~250k instructions processed, a
 * fraction of a second at load). An open-coded iterator would verify in a few passes but costs a
 * kfunc call per group in the hot loop. BPF functions take at most five arguments, hence
 * k_mode. */
__noinline s64 w4a8_rows8(u64 wa, u64 sa, u64 xqa, u64 ya, u64 k_mode)
{
	return swar_rows(wa, sa, xqa, ya, k_mode, 0, 0);
}

/* Four rows of W8 (swar_rows), a global function like w4a8_rows8. */
__noinline s64 w8a16_rows4(u64 wa, u64 sa, u64 xqa, u64 ya, u64 k_mode)
{
	return swar_rows(wa, sa, xqa, ya, k_mode, 1, 0);
}

/* w4a8_rows8 from the block's unpacked words (ua, see swar_unpack). */
__noinline s64 w4a8_rows8_unpacked(u64 ua, u64 sa, u64 xqa, u64 ya, u64 k_mode)
{
	return swar_rows(ua, sa, xqa, ya, k_mode, 0, 1);
}

/* w8a16_rows4 from the block's unpacked words (ua, see swar_unpack). */
__noinline s64 w8a16_rows4_unpacked(u64 ua, u64 sa, u64 xqa, u64 ya, u64 k_mode)
{
	return swar_rows(ua, sa, xqa, ya, k_mode, 1, 1);
}

struct swar_ctx {
	u64 w, s, xq, y;
	u64 wstride, sstride; /* bytes of words and of scales per row block */
	u64 ysize;            /* bytes per y element: 8 for the residual stream, else 4 */
	u64 xqstride, ystride; /* bytes between the vectors of xq and of y */
	u64 unpack;            /* the unpacked row block's scratch, or 0 */
	u32 k, block0, mode, best, nb, pad;
	s64 best_val;
};

/* Keeps the best row: packed = logit * 8 + 7 - l from the row-block function. */
static __always_inline void keep_best(struct swar_ctx *c, s64 packed, u32 rows_per_block, u64 blk)
{
	s64 v = packed >> 3;

	if (v > c->best_val) {
		c->best_val = v;
		c->best = (u32)(blk * rows_per_block) + 7 - (u32)(packed & 7);
	}
}

/* Row block i times each of the nb vectors in turn: the block's words and scales stay in the L1
 * cache, so that a prefill block reads them from memory once, and with scratch (c->unpack) they
 * are unpacked once for all the vectors. w8 selects the W8 kernel (four rows per block) over the
 * W4 one (eight), a compile-time constant. */
static __always_inline long swar_block(u64 i, struct swar_ctx *c, const int w8)
{
	const u32 rpb = w8 ? 4 : 8;
	u64 blk = c->block0 + i;
	u64 wa = c->w + blk * c->wstride, sa = c->s + blk * c->sstride;
	u64 ua = c->nb > 1 ? c->unpack : 0;

	if (ua)
		swar_unpack(wa, ua, c->k, w8);
	for (u32 b = 0; b < c->nb && can_loop; b++) { /* nb <= LIM_BATCH_MAX */
		u64 xqa = c->xq + b * c->xqstride;
		u64 ya = c->y ? c->y + b * c->ystride + blk * rpb * c->ysize : 0;
		u64 k_mode = c->k | (u64)c->mode << 32;
		s64 p;

		if (ua)
			p = w8 ? w8a16_rows4_unpacked(ua, sa, xqa, ya, k_mode)
			       : w4a8_rows8_unpacked(ua, sa, xqa, ya, k_mode);
		else
			p = w8 ? w8a16_rows4(wa, sa, xqa, ya, k_mode)
			       : w4a8_rows8(wa, sa, xqa, ya, k_mode);

		if (c->mode == SW_MODE_ARGMAX)
			keep_best(c, p, rpb, blk);
	}
	return 0;
}

static long w4a8_block(u64 i, struct swar_ctx *c)
{
	return swar_block(i, c, 0);
}

static long w8a16_block(u64 i, struct swar_ctx *c)
{
	return swar_block(i, c, 1);
}

/* Checks the arguments and runs the row blocks of [row0, row0 + nrows); rpb = rows per block
 * (8 for W4, 4 for W8), w8 selects the W8 kernel (a byte of words per weight, W4 half a byte),
 * argmax the LM-head mode. */
static __always_inline int swar_run(struct swar_mv_args *a, u32 rpb, int w8, int argmax)
{
	u32 k = a->k, row0 = a->row0, nrows = a->nrows;
	struct swar_ctx c = {
		.w = a->w, .s = a->s, .xq = a->xq, .y = a->y,
		.wstride = (u64)rpb * k / (w8 ? 1 : 2), .sstride = (u64)rpb * (k / SW_GROUP) * 4,
		.k = k, .block0 = row0 / rpb, .best = row0, .best_val = -ACT_MAX - 1,
		.mode = argmax ? SW_MODE_ARGMAX : (a->accumulate ? SW_MODE_ACCUMULATE : SW_MODE_STORE),
		.ysize = !argmax && a->accumulate ? 8 : 4,
		.nb = a->nb, .xqstride = SW_XQ_BYTES(k), .ystride = a->ystride, .unpack = a->unpack,
	};
	long ret;

	USE_ARENA(arena);
	if (k == 0 || k % SW_GROUP || k > SW_KMAX || row0 % rpb || nrows % rpb)
		return 1;
	if (a->nb == 0 || a->nb > LIM_BATCH_MAX || (argmax && a->nb != 1))
		return 1;
	if (!argmax && !c.y)
		return 1;
	ret = bpf_loop(nrows / rpb, w8 ? (void *)w8a16_block : (void *)w4a8_block, &c, 0);
	if (argmax) {
		a->best = c.best;
		a->best_val = c.best_val;
	}
	return (int)ret < 0;
}

/* y[r] (+)= W4 x for r in [row0, row0 + nrows), x from quantize_x8. */
OP(w4a8_matvec, struct swar_mv_args)
{
	return swar_run(a, 8, 0, 0);
}

/* y[r] (+)= W8 x for r in [row0, row0 + nrows), x from quantize_x16. */
OP(w8a16_matvec, struct swar_mv_args)
{
	return swar_run(a, 4, 1, 0);
}

/* W4 logits of rows [row0, row0 + nrows) (into y unless y == 0) and their argmax. */
OP(w4a8_lm_head_argmax, struct swar_mv_args)
{
	return swar_run(a, 8, 0, 1);
}

/* W8 logits of rows [row0, row0 + nrows) (into y unless y == 0) and their argmax. */
OP(w8a16_lm_head_argmax, struct swar_mv_args)
{
	return swar_run(a, 4, 1, 1);
}
