// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* The exact LM-head argmax from a low-bit screen (src/num/bound.rs has the scheme and
 * its proof, src/store/screen.rs the driver). Included in ops.bpf.c after swar.inc.c: it calls the
 * exact heads' row functions (row1_q24, w8a16_rows4), so that a rescored logit is the very integer
 * lm_head_argmax / w8a16_lm_head_argmax computes.
 *
 * Given the screen logits s[r] (the SWAR matvec of the screen, run before) and per row the norms
 * nd[r], nv[r], the bound is E[r] = ceil((nd[r] * bx + nv[r] * by) / 2^shift) (nd, nv, bx, by
 * below 2^31: no overflow). Pass 1: L = max_r s[r] - E[r]. Pass 2: every row with
 * s[r] + E[r] >= L is rescored exactly (a W8 head: its block of four rows), and the first row
 * with the largest exact logit wins. */
#pragma once

struct screen_argmax_args {
	u64 s;        /* s32 Q16 [rows]: screen logits */
	u64 nd, nv;   /* u32 [rows]: the norms of the bound */
	u64 w;        /* the exact head: s32 Q24 [rows][k], or W8 words (w8) */
	u64 ws;       /* W8 scales (w8), else unused */
	u64 x;        /* s32 Q16 x [k], or the W8A16-quantised x (w8) */
	u64 bx, by;   /* per-token factors, below 2^31 */
	u32 k, rows;  /* rows: a multiple of 4 (w8) */
	u32 shift;    /* <= 24 */
	u32 w8;       /* 1: the exact head is W8A16 */
	u32 best;     /* out: the exact argmax (first on ties) */
	u32 candidates; /* out: rows rescored */
	s64 best_val; /* out: its exact logit */
	s64 lower;    /* out: L */
};

/* The scan's state: s, nd and nv are vectors of `rows` entries (checked on arrays before the
 * scans); err is set, and the scan stopped, when a rescored row or block crosses an element's end
 * (array layer only). */
struct screen_ctx {
	QB_VEC_T(const s32) s;
	QB_VEC_T(const u32) nd;
	QB_VEC_T(const u32) nv;
	u64 w, ws, x, bx, by, wstride, sstride;
	u32 k, shift, w8, best, candidates, last_block, err;
	s64 best_val, lower;
};

static __always_inline s64 screen_bound(struct screen_ctx *c, u32 r)
{
	u64 nd = QB_IX(const u32, c->nd, r), nv = QB_IX(const u32, c->nv, r);

	return (s64)((nd * c->bx + nv * c->by + (1ULL << c->shift) - 1) >> (c->shift & 31));
}

/* The callbacks take void *: a struct screen_ctx * in their prototype would put the struct in
 * the skeleton's types, where its vectors differ between the two builds. */
static long screen_lower(u64 r, void *ctx)
{
	struct screen_ctx *c = ctx;
	s64 lo = (s64)QB_IX(const s32, c->s, (u32)r) - screen_bound(c, (u32)r);

	if (lo > c->lower)
		c->lower = lo;
	return 0;
}

static long screen_rescore(u64 r, void *ctx)
{
	struct screen_ctx *c = ctx;
	s64 hi = (s64)QB_IX(const s32, c->s, (u32)r) + screen_bound(c, (u32)r), p, v;
	u32 row;

	if (hi < c->lower)
		return 0;
	if (c->w8) {
		u64 blk = r / 4, wa = c->w + blk * c->wstride, sa = c->ws + blk * c->sstride;

		if ((u32)blk == c->last_block)
			return 0;
		c->last_block = (u32)blk;
		if (!swar_block_ok(wa, sa, c->k, 1, 0)) {
			c->err = 1;
			return 1;
		}
		p = w8a16_rows4(wa, sa, c->x, 0, c->k | (u64)SW_MODE_ARGMAX << 32);
		v = p >> 3;
		row = (u32)blk * 4 + 7 - (u32)(p & 7);
		c->candidates += 4;
	} else {
		u64 wa = c->w + r * c->wstride;

		if (!q24_row_ok(wa, c->k)) {
			c->err = 1;
			return 1;
		}
		p = row1_q24(wa, c->x, 0, c->k | (u64)ROWS_LOGITS << 32);
		v = p >> 1;
		row = (u32)r;
		c->candidates += 1;
	}
	if (v > c->best_val) {
		c->best_val = v;
		c->best = row;
	}
	return 0;
}

/* The exact argmax of the head from its screen logits (see above). */
SEC("syscall")
int screen_argmax(struct screen_argmax_args *a)
{
	u32 k = a->k, rows = a->rows, w8 = a->w8 != 0;
	struct screen_ctx c = {
		.s = QB_VEC(const s32, arena, a->s, rows),
		.nd = QB_VEC(const u32, arena, a->nd, rows),
		.nv = QB_VEC(const u32, arena, a->nv, rows),
		.w = a->w, .ws = a->ws, .x = a->x,
		.bx = a->bx, .by = a->by, .k = k, .shift = a->shift, .w8 = w8,
		.wstride = 4ULL * k, /* a Q24 row, or a W8 block of 4 rows */
		.sstride = 4ULL * (k / SW_GROUP) * 4,
		.best = 0, .best_val = -ACT_MAX - 1, .lower = -(1LL << 62), .last_block = ~0U,
	};
	long ret;

	QB_MEM_USE(arena);
	if (k == 0 || k % SW_GROUP || k > SW_KMAX || a->shift > 24 || a->bx >= (1ULL << 31) ||
	    a->by >= (1ULL << 31) || (w8 && rows % 4))
		return 1;
	/* the array layer: the scans' vectors and x in one element each (rows are checked as
	 * they are rescored) */
	if (!QB_VEC_OK(c.s) || !QB_VEC_OK(c.nd) || !QB_VEC_OK(c.nv) ||
	    !QB_VEC_OK(w8 ? QB_VEC(const char, arena, a->x, SW_XQ_BYTES(k))
			  : QB_VEC(const char, arena, a->x, 4ULL * k)))
		return 1;
	ret = bpf_loop(rows, screen_lower, &c, 0);
	if (ret >= 0)
		ret = bpf_loop(rows, screen_rescore, &c, 0);
	a->best = c.best;
	a->best_val = c.best_val;
	a->lower = c.lower;
	a->candidates = c.candidates;
	return ret < 0 || c.err;
}
