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
	const s32 QB *x = QB_SPAN(const s32, arena, xa, SW_GROUP * 4);
	s64 QB *q = QB_SPAN(s64, arena, qa, SW_GROUP * 8);
	struct swar_xblock QB *b = QB_SPAN(struct swar_xblock, arena, ba, sizeof(*b));
	u64 m = 0, sum = 0;
	u32 e = 0;

	if (!x || !q || !b) /* never, in the arena */
		return 1;

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

/* The blocks of every vector, i = vector * k/32 + block, one step each. */
struct quantize_walk {
	u64 x, xq;
	u32 k, qmax, err;
};

static __always_inline int quantize_step(struct quantize_walk *c, u32 i)
{
	u32 groups = c->k / SW_GROUP, v = i / groups, g = i % groups;
	u64 x = c->x + (u64)v * c->k * 4, xq = c->xq + v * SW_XQ_BYTES(c->k);

	c->err = quantize_block(x + g * SW_GROUP * 4, xq + g * SW_GROUP * 8,
				xq + (u64)c->k * 8 + g * 16, c->qmax);
	return c->err;
}
QB_EACH_FN(quantize_step, struct quantize_walk)

static __always_inline int quantize_x(struct quantize_x_args *a, u32 qmax)
{
	u32 k = a->k, nb = a->nb;
	struct quantize_walk c = { .x = a->x, .xq = a->xq, .k = k, .qmax = qmax };

	QB_MEM_USE(arena);
	if (k == 0 || k % SW_GROUP || k > SW_KMAX || nb == 0 || nb > LIM_BATCH_MAX)
		return 1;
	return QB_EACH(quantize_step, nb * (k / SW_GROUP), &c) || c.err;
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

/* The end of a row block: y = sat(round(acc / 2^24)) in Q16 into y (rows_out: none, in argmax
 * mode), or with `residual` y += round(acc / 2^8) into the s64 Q32 residual stream; returns the
 * block's best row packed as logit * 8 + 7 - l, so that the larger packed value is the larger
 * logit and, on ties, the lower row. `residual` is a constant and y found once, for all the
 * rows: a test and a lookup per row made 6.18's verifier walk every combination of their
 * outcomes. */
static __always_inline s64 finish_rows(const u64 *acc, rows_out_t y, const int rows,
				       const int residual)
{
	s64 best = -(1LL << 62), p;

#pragma unroll
	for (int l = 0; l < rows; l++) {
		p = (s64)finish_row_in((s64)acc[l], y, l, residual) * 8 + (7 - l);
		best = p > best ? p : best;
	}
	return best;
}

/* A row block's words unpacked once for a batch: u[(4 q + c) * 2 + h] = (w[q][h] >> c * cb) & m
 * (cb = 4 with W4's mask, 8 with W8's), the very lane words that SW_QUAD_PACKED forms for column 4q + c,
 * so that the batched kernels spend no shift or mask per vector. wa = the block's [k/4][2]
 * words, ua = 16 k bytes of scratch. k / 4 <= 4096 iterations. */
#ifndef QB_ARRAY_LAYER
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
#else
/* The array build: a bpf_loop callback per 4 columns (6.1 would walk k / 4 <= 4096 steps). */
struct unpack_walk {
	QB_VEC_T(const u64) w; /* [k/4][2] */
	QB_VEC_T(u64) u;       /* [k/4][4][2] */
	u64 m, cb;
};

static __always_inline int unpack_step(struct unpack_walk *c, u32 q)
{
	const u64 QB *w = QB_AT(const u64, c->w, q * 16ull, 16);
	u64 QB *u = QB_AT(u64, c->u, q * 64ull, 64);
	u64 v0 = w[0], v1 = w[1];

#pragma unroll
	for (int j = 0; j < 4; j++) {
		u[2 * j] = (v0 >> (c->cb * j)) & c->m;
		u[2 * j + 1] = (v1 >> (c->cb * j)) & c->m;
	}
	return 0;
}
QB_EACH_FN(unpack_step, struct unpack_walk)

__noinline int swar_unpack(u64 wa, u64 ua, u32 k, u32 w8)
{
	struct unpack_walk c = { .w = QB_VEC(const u64, arena, wa, k / 2),
				 .u = QB_VEC(u64, arena, ua, k * 2),
				 .m = w8 ? SW8_MASK : SW4_MASK, .cb = w8 ? 8 : 4 };

	if (k > SW_KMAX || !QB_VEC_OK(c.w) || !QB_VEC_OK(c.u))
		return 1;
	return QB_EACH(unpack_step, k / 4, &c);
}
#endif

/* The products of one group of 32 columns: a0 (the row block's first half of rows, one lane
 * each) and a1 (the second half) from the group's words wp (packed, or with `unpacked` from
 * swar_unpack) and activations xp. w8 = 0 for eight rows of W4 (four 16-bit lanes per word,
 * bias 8), 1 for four rows of W8 (two 32-bit lanes, bias 128); w8 and `unpacked` are
 * compile-time constants. Both forms add the same products in the same order. */
static __always_inline void swar_group_macs(const u64 QB *wp, const s64 QB *xp, u64 m, u64 *a0p,
					    u64 *a1p, const int w8, const int unpacked)
{
	u64 a0 = 0, a1 = 0;

	QB_CAST(wp);
	QB_CAST(xp);
	if (unpacked) {
		u64 xv, t0, t1;

		SW_UQUAD(a0, a1, wp, xp, 0, xv, t0, t1);
		SW_UQUAD(a0, a1, wp, xp, 1, xv, t0, t1);
		SW_UQUAD(a0, a1, wp, xp, 2, xv, t0, t1);
		SW_UQUAD(a0, a1, wp, xp, 3, xv, t0, t1);
		SW_UQUAD(a0, a1, wp, xp, 4, xv, t0, t1);
		SW_UQUAD(a0, a1, wp, xp, 5, xv, t0, t1);
		SW_UQUAD(a0, a1, wp, xp, 6, xv, t0, t1);
		SW_UQUAD(a0, a1, wp, xp, 7, xv, t0, t1);
	} else {
		const int cb = w8 ? 8 : 4;
		u64 v0, v1, xv, t;

		SW_QUAD_PACKED(a0, a1, wp, xp, 0, m, cb, v0, v1, xv, t);
		SW_QUAD_PACKED(a0, a1, wp, xp, 1, m, cb, v0, v1, xv, t);
		SW_QUAD_PACKED(a0, a1, wp, xp, 2, m, cb, v0, v1, xv, t);
		SW_QUAD_PACKED(a0, a1, wp, xp, 3, m, cb, v0, v1, xv, t);
		SW_QUAD_PACKED(a0, a1, wp, xp, 4, m, cb, v0, v1, xv, t);
		SW_QUAD_PACKED(a0, a1, wp, xp, 5, m, cb, v0, v1, xv, t);
		SW_QUAD_PACKED(a0, a1, wp, xp, 6, m, cb, v0, v1, xv, t);
		SW_QUAD_PACKED(a0, a1, wp, xp, 7, m, cb, v0, v1, xv, t);
	}
	*a0p = a0;
	*a1p = a1;
}

/* The end of a group: A + kx removes the weights' bias (bias * S per lane) and lifts the lower
 * lanes by half their range, then acc += (D * s) << e per row, in u64 (wrapping exactly like
 * the twin); b is the group's activation block, s its rows' scales. */
static __always_inline void swar_group_add(u64 a0, u64 a1, const struct swar_xblock QB *b,
					   const u32 QB *s, u64 *acc, const int w8)
{
	const int lanes = w8 ? 2 : 4, bits = w8 ? 32 : 16;
	u64 kx, e;

	if (w8)
		kx = SW8_HALF - (u64)(128 * b->sum) * SW8_ONES;
	else
		kx = SW4_HALF - (u64)(8 * b->sum) * SW4_ONES;
	e = (u64)b->shift;
	a0 += kx;
	a1 += kx;
#pragma unroll
	for (int l = 0; l < lanes; l++) {
		acc[l] += lane(a0, l, lanes, bits) * s[l] << e;
		acc[lanes + l] += lane(a1, l, lanes, bits) * s[lanes + l] << e;
	}
}

#ifndef QB_ARRAY_LAYER
/* The groups of one row block: wa = the block's [k/4][2] words, or with `unpacked` its
 * swar_unpack scratch ([k/4][4][2]), sa = its [k/32][rows] scales, xqa = the quantised
 * activations, k columns; the rows' sums into acc. The arena build walks the groups in a
 * can_loop loop. */
static __always_inline void swar_groups(u64 wa, u64 sa, u64 xqa, u32 k, u64 *acc, const int w8,
					const int unpacked)
{
	const int rows = w8 ? 4 : 8;
	u64 xba = xqa + (u64)k * 8;
	u64 m = w8 ? SW8_MASK : SW4_MASK;

	asm volatile("" : "+r"(m)); /* keep the mask in a register */
	for (u32 g = 0; g < k / SW_GROUP && can_loop; g++) {
		u64 a0, a1;

		swar_group_macs(ARENA_PTR(const u64, wa) + g * (unpacked ? 64 : 16),
				ARENA_PTR(const s64, xqa) + g * SW_GROUP, m, &a0, &a1, w8, unpacked);
		swar_group_add(a0, a1, ARENA_PTR(const struct swar_xblock, xba) + g,
			       ARENA_PTR(const u32, sa) + g * rows, acc, w8);
	}
}
#else
/* The array build: one bpf_loop callback a group (6.1's verifier would walk a bounded loop of
 * k/32 groups one by one), finding its pieces through the block's checked vectors: the words,
 * the scales, and the activations (SW_XQ_BYTES(k): s64 [k], then their blocks at xb). The walk
 * is small: on Linux 6.1 the stacks of the six frames from the program to this callback must
 * fit in 512 bytes. */
struct swar_walk {
	struct qb_vec w, s, x;
	u64 xb;
	u64 acc[8];
};

static __always_inline int swar_group(struct swar_walk *c, u32 g, const int w8, const int unpacked)
{
	const int rows = w8 ? 4 : 8;
	u64 a0, a1, m = w8 ? SW8_MASK : SW4_MASK;

	asm volatile("" : "+r"(m)); /* keep the mask in a register */
	swar_group_macs(QB_AT(const u64, c->w, g * (unpacked ? 512ull : 128ull), unpacked ? 512 : 128),
			QB_AT(const s64, c->x, g * SW_GROUP * 8ull, SW_GROUP * 8), m, &a0, &a1, w8,
			unpacked);
	/* the block and the scales found after the multiplies, which use nine of the ten
	 * registers (found before, they would be spilled) */
	swar_group_add(a0, a1, QB_AT(const struct swar_xblock, c->x, c->xb + g * 16, 16),
		       QB_AT(const u32, c->s, g * rows * 4ull, rows * 4), c->acc, w8);
	return 0;
}

/* The four forms' group steps: name, w8, unpacked. */
#define SWAR_GROUP_STEP(name, w8, unpacked)                                                 \
	static __always_inline int name(struct swar_walk *c, u32 g)                         \
	{                                                                                   \
		return swar_group(c, g, w8, unpacked);                                      \
	}                                                                                   \
	QB_EACH_FN(name, struct swar_walk)

SWAR_GROUP_STEP(w4_group, 0, 0)
SWAR_GROUP_STEP(w8_group, 1, 0)
SWAR_GROUP_STEP(w4_group_unpacked, 0, 1)
SWAR_GROUP_STEP(w8_group_unpacked, 1, 1)

/* swar_groups of the arena build, over checked vectors: a block or activations the operator
 * did not check leave acc 0 (the operators check every block first). */
static __always_inline void swar_groups(u64 wa, u64 sa, u64 xqa, u32 k, u64 *acc, const int w8,
					const int unpacked)
{
	const int rows = w8 ? 4 : 8;
	u32 groups = k / SW_GROUP;
	struct swar_walk c = {
		.w = QB_VEC(const u64, arena, wa, unpacked ? (u64)k * 2 : (u64)k / 2),
		.s = QB_VEC(const u32, arena, sa, rows * groups),
		.x = QB_VEC(const char, arena, xqa, SW_XQ_BYTES(k)),
		.xb = (u64)k * 8,
	};

	if (QB_VEC_OK(c.w) && QB_VEC_OK(c.s) && QB_VEC_OK(c.x)) {
		if (unpacked && w8)
			QB_EACH(w8_group_unpacked, groups, &c);
		else if (unpacked)
			QB_EACH(w4_group_unpacked, groups, &c);
		else if (w8)
			QB_EACH(w8_group, groups, &c);
		else
			QB_EACH(w4_group, groups, &c);
	}
#pragma unroll
	for (int l = 0; l < 8; l++)
		acc[l] = c.acc[l];
}
#endif

/* Whether a row block's words (packed, or unpacked when `unpacked`) and scales lie in one element
 * each (always, in the arena). */
static __always_inline int swar_block_ok(u64 wa, u64 sa, u32 k, const int w8, const int unpacked)
{
	return QB_VEC_OK(QB_VEC(const u64, arena, wa, unpacked ? (u64)k * 2 : (u64)k / 2)) &&
	       QB_VEC_OK(QB_VEC(const u32, arena, sa, (w8 ? 4 : 8) * (k / SW_GROUP)));
}

/* One row block times quantised x (swar_groups), ya = &y[first row] or 0, k_mode = k | mode <<
 * 32. Returns the block's best row as finish_row packs it. */
static __always_inline s64 swar_rows(u64 wa, u64 sa, u64 xqa, u64 ya, u64 k_mode, const int w8,
				     const int unpacked)
{
	const int rows = w8 ? 4 : 8;
	u32 k = (u32)k_mode, mode = (u32)(k_mode >> 32);
	u64 acc[8] = {};

	swar_groups(wa, sa, xqa, k, acc, w8, unpacked);
	if (mode == SW_MODE_ACCUMULATE)
		return finish_rows(acc, rows_out(ya, rows, 1), rows, 1);
	return finish_rows(acc, rows_out(ya, rows, 0), rows, 0);
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
	u64 ystride;           /* bytes between the vectors of y */
	u64 unpack;            /* the unpacked row block's scratch, or 0 */
	u32 k, block0, mode, best, nb, err;
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

#ifndef QB_ARRAY_LAYER
/* Row block i times each of the nb vectors in turn: the block's words and scales stay in the L1
 * cache, so that a prefill block reads them from memory once, and with scratch (c->unpack) they
 * are unpacked once for all the vectors. w8 selects the W8 kernel (four rows per block) over the
 * W4 one (eight), a compile-time constant. */
static __always_inline long swar_block(u64 i, struct swar_ctx *c, const int w8)
{
	const u32 rpb = w8 ? 4 : 8;
	u64 blk = c->block0 + i;
	u64 wa = c->w + blk * (rpb * c->k / (w8 ? 1 : 2));
	u64 sa = c->s + blk * (rpb * (c->k / SW_GROUP) * 4);
	u64 ua = c->nb > 1 ? c->unpack : 0;
	u64 ysize = c->mode == SW_MODE_ACCUMULATE ? 8 : 4;

	if (ua)
		swar_unpack(wa, ua, c->k, w8);
	for (u32 b = 0; b < c->nb && can_loop; b++) { /* nb <= LIM_BATCH_MAX */
		u64 xqa = c->xq + b * SW_XQ_BYTES(c->k);
		u64 ya = c->y ? c->y + b * c->ystride + blk * rpb * ysize : 0;
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
#else
/* The array build: the batch's vectors as bpf_loop callbacks (6.1 would walk a bounded loop of
 * LIM_BATCH_MAX), each block checked whole first. */
/* One vector of a batch times row block blk (swar_block's step). */
struct swar_vec_walk {
	struct swar_ctx *c;
	u64 blk, wa, sa, ua;
};

static __always_inline int swar_vec_step(struct swar_vec_walk *v, u32 b, const int w8)
{
	struct swar_ctx *c = v->c;
	const u32 rpb = w8 ? 4 : 8;
	u64 xqa = c->xq + b * SW_XQ_BYTES(c->k);
	u64 ysize = c->mode == SW_MODE_ACCUMULATE ? 8 : 4;
	u64 ya = c->y ? c->y + b * c->ystride + v->blk * rpb * ysize : 0;
	u64 k_mode = c->k | (u64)c->mode << 32;
	s64 p;

	if (v->ua)
		p = w8 ? w8a16_rows4_unpacked(v->ua, v->sa, xqa, ya, k_mode)
		       : w4a8_rows8_unpacked(v->ua, v->sa, xqa, ya, k_mode);
	else
		p = w8 ? w8a16_rows4(v->wa, v->sa, xqa, ya, k_mode)
		       : w4a8_rows8(v->wa, v->sa, xqa, ya, k_mode);
	if (c->mode == SW_MODE_ARGMAX)
		keep_best(c, p, rpb, v->blk);
	return 0;
}

#define SWAR_VEC_STEP(name, w8)                                                             \
	static __always_inline int name(struct swar_vec_walk *v, u32 b)                     \
	{                                                                                   \
		return swar_vec_step(v, b, w8);                                             \
	}                                                                                   \
	QB_EACH_FN(name, struct swar_vec_walk)

SWAR_VEC_STEP(w4_vec_step, 0)
SWAR_VEC_STEP(w8_vec_step, 1)

/* swar_block of the array build; a block that crosses an element's end stops the loop with
 * c->err. */
static __always_inline long swar_block(u64 i, struct swar_ctx *c, const int w8)
{
	u64 blk = c->block0 + i;
	/* rpb rows per block; a block's words take rpb * k / (w8 ? 1 : 2) bytes */
	const u64 rpb = w8 ? 4 : 8;
	struct swar_vec_walk v = { .c = c, .blk = blk,
				   .wa = c->w + blk * (rpb * c->k / (w8 ? 1 : 2)),
				   .sa = c->s + blk * (rpb * (c->k / SW_GROUP) * 4),
				   .ua = c->nb > 1 ? c->unpack : 0 };

	if (!swar_block_ok(v.wa, v.sa, c->k, w8, 0) || (v.ua && swar_unpack(v.wa, v.ua, c->k, w8)) ||
	    (w8 ? QB_EACH(w8_vec_step, c->nb, &v) : QB_EACH(w4_vec_step, c->nb, &v))) {
		c->err = 1;
		return 1;
	}
	return 0;
}
#endif

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
		.k = k, .block0 = row0 / rpb, .best = row0, .best_val = -ACT_MAX - 1,
		.mode = argmax ? SW_MODE_ARGMAX : (a->accumulate ? SW_MODE_ACCUMULATE : SW_MODE_STORE),
		.nb = a->nb, .ystride = a->ystride, .unpack = a->unpack,
	};
	long ret;

	QB_MEM_USE(arena);
	if (k == 0 || k % SW_GROUP || k > SW_KMAX || row0 % rpb || nrows % rpb)
		return 1;
	if (a->nb == 0 || a->nb > LIM_BATCH_MAX || (argmax && a->nb != 1))
		return 1;
	if (!argmax && !c.y)
		return 1;
	/* the array layer: every vector of xq, y's rows and the unpack scratch in one element */
	if (!QB_VEC_OK(QB_VEC(char, arena, a->xq, a->nb * SW_XQ_BYTES(k))) ||
	    !rows_out_ok(a->y, a->ystride, a->nb, row0, nrows, c.mode == SW_MODE_ACCUMULATE ? 8 : 4) ||
	    (a->nb > 1 && a->unpack && !QB_VEC_OK(QB_VEC(u64, arena, a->unpack, (u64)k * 2))))
		return 1;
	ret = bpf_loop(nrows / rpb, w8 ? (void *)w8a16_block : (void *)w4a8_block, &c, 0);
	if (argmax) {
		a->best = c.best;
		a->best_val = c.best_val;
	}
	return (int)ret < 0 || c.err;
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
