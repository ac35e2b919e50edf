// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* The Qwen3 tokenizer in the kernel: UTF-8 text in a shared-memory buffer -> token ids in
 * another, equal to the `tokenizers` crate's encode (no special tokens added) for a byte-level
 * BPE tokenizer.json of Qwen's kind. src/num/tok_tables.rs builds the tables (layout and shapes
 * there, header below) and src/num/tok_twin.rs is the Rust twin of every function here.
 *
 * tokenize(text, len, out, max_out) runs the stages:
 *   1. added tokens: matched in the raw text, leftmost-longest (tok_find_added);
 *   each stretch between them (tok_segment):
 *   2. UTF-8 decode and canonical decomposition, Hangul arithmetically (tok_decompose);
 *   3. canonical reordering: a stable insertion sort of each run of non-starters (tok_reorder);
 *   4. canonical composition (tok_compose), then each code point's regex class (tok_classify);
 *   5. Qwen's split regex as a state machine: the end of the piece at i (tok_piece_end;
 *      stages 5 and 6 are in tok_bpe.inc.c);
 *   6. byte-level BPE of each piece: the lowest-ranked adjacent pair merged, leftmost on ties,
 *      until none is left (tok_bpe; tok_bpe_round merges the lowest rank's pairs left to right
 *      while no merge makes a lower rank: the same merges in the same order).
 * Every stage is a function verified on its own (global) whose loops are bounded by limits.h's
 * LIM_TOK_*, each loop a step function run by TOK_EACH: a may_goto loop in the arena build, a
 * bpf_loop in the array build (mem.h), the same step in both. A limit exceeded is a negative
 * TOK_E_* return, never a truncation. The tables and a work area are in the shared memory
 * (arena or array maps): tok_cfg says where (the tokenize_text program sets it from its ctx; a
 * bpf_wq callback that tokenizes sets it the same way). One tokenize runs at a time per work
 * area. The array build inlines tokenize, tok_segment and tok_bpe_round into their callers, so
 * that its deepest chain (tokenize_text, then callbacks and tok_bpe, tok_merge_pair) is the
 * verifier's 8 frames. */
#pragma once

#define TOK_MAGIC 0x4b4f5451U /* "QTOK" */
#define TOK_NONE 0xffffffffU

/* header words (src/num/tok_tables.rs, mod h); offsets count u32 words from the header */
#define TOK_H_MAGIC 0
#define TOK_H_STAGE1 1      /* u32 [0x1100]: block of each 256 code points */
#define TOK_H_STAGE2 2      /* u32 [blocks][256]: class | SECOND | ccc << 8 | decomp << 16 */
#define TOK_H_DECOMP 3      /* u32 [..]: len, then len words cp | W_SECOND | ccc << 24 */
#define TOK_H_COMP 4        /* u32 [comp_mask + 1][4]: a, b, composite, 0 */
#define TOK_H_COMP_MASK 5
#define TOK_H_MERGE 6       /* u32 [merge_mask + 1][4]: left + 1, right, rank, merged id */
#define TOK_H_MERGE_MASK 7
#define TOK_H_BYTE_ID 8     /* u32 [256]: id of each byte alone */
#define TOK_H_ADDED 9       /* u32 [n_added][4]: pool offset, len, id, 0; by first byte */
#define TOK_H_N_ADDED 10
#define TOK_H_ADDED_FIRST 11 /* u32 [256]: first index | count << 16 */
#define TOK_H_POOL 12       /* u8 []: the added tokens' text */

/* character classes (the regex's \p{L}, \p{N}, \s without CR/LF, CR/LF, the rest) */
#define TOK_C_OTHER 0
#define TOK_C_LETTER 1
#define TOK_C_NUMBER 2
#define TOK_C_SPACE 3
#define TOK_C_NEWLINE 4
#define TOK_SECOND (1U << 7)    /* record: second of some composition */
#define TOK_W_SECOND (1U << 23) /* the same in a code-point word */
#define TOK_CP_MASK 0x1fffffU

/* returns */
#define TOK_E_TEXT (-1)   /* text longer than LIM_TOK_TEXT_MAX */
#define TOK_E_IDS (-2)    /* more ids than max_out, or max_out above LIM_TOK_IDS_MAX */
#define TOK_E_UTF8 (-3)   /* not UTF-8 */
#define TOK_E_CPS (-4)    /* a segment decomposes into more than LIM_TOK_CP_MAX code points */
#define TOK_E_WORD (-5)   /* a piece longer than LIM_TOK_WORD_MAX bytes */
#define TOK_E_MARKS (-6)  /* more than LIM_TOK_MARKS_MAX non-starters in a row */
#define TOK_E_TABLES (-7) /* no tables (array build: or a buffer not inside one element) */
#define TOK_E_BUDGET (-8) /* a loop reached its bound with work left (never expected) */

/* the work area: code points, then BPE's word bytes, symbols, pair ranks and merged ids */
#define TOK_S_CPS 0                                          /* u32 [LIM_TOK_CP_MAX] */
#define TOK_S_WORD (LIM_TOK_CP_MAX * 4)                      /* u8 [LIM_TOK_WORD_MAX] */
#define TOK_S_SYM (TOK_S_WORD + LIM_TOK_WORD_MAX)            /* u32 [LIM_TOK_WORD_MAX] */
#define TOK_S_RANK (TOK_S_SYM + LIM_TOK_WORD_MAX * 4)        /* u32 [LIM_TOK_WORD_MAX] */
#define TOK_S_MERGED (TOK_S_RANK + LIM_TOK_WORD_MAX * 4)     /* u32 [LIM_TOK_WORD_MAX] */
#define TOK_S_OPAQUE (TOK_S_MERGED + LIM_TOK_WORD_MAX * 4) /* u32 [16]: see tok_opaque */
#define TOK_SCRATCH_BYTES (TOK_S_OPAQUE + 64)

/* Hangul syllables (Unicode 3.12) */
#define TOK_S_BASE 0xAC00U
#define TOK_L_BASE 0x1100U
#define TOK_V_BASE 0x1161U
#define TOK_T_BASE 0x11A7U
#define TOK_L_COUNT 19U
#define TOK_V_COUNT 21U
#define TOK_T_COUNT 28U
#define TOK_N_COUNT (TOK_V_COUNT * TOK_T_COUNT)
#define TOK_S_COUNT (TOK_L_COUNT * TOK_N_COUNT)

/* Where the tables and the work area are (addresses of the shared memory). */
struct tok_config {
	u64 tables;
	u64 scratch;
};
struct tok_config tok_cfg;

/* A vector of the shared memory (mem.h), read by byte (TOK_U8) or word (TOK_U32). The array build
 * keeps every index inside the vector's element: user space places the tables, the work area and
 * each buffer inside one element (kernel/tokenize.rs), so that a corrupt table reads garbage,
 * never memory outside the map. */
#define TOK_V QB_VEC_T(u8)
#define TOK_U8(v, i) QB_IX(u8, v, i)
#define TOK_U32(v, i) QB_IX(u32, v, i) /* word i */

static __always_inline TOK_V tok_vec(u64 a, u64 bytes)
{
	return QB_VEC(u8, arena, a, bytes);
}

/* the tables (their header: what every table index starts from) and the work area */
static __always_inline TOK_V tok_words(void)
{
	return tok_vec(tok_cfg.tables, (TOK_H_POOL + 1) * 4);
}

static __always_inline TOK_V tok_scratch(void)
{
	return tok_vec(tok_cfg.scratch, TOK_SCRATCH_BYTES);
}

/* the work area's arrays, by index */
#define TOK_CP(s, i) TOK_U32(s, (i))
#define TOK_WORD(s, i) TOK_U8(s, TOK_S_WORD + (i))
#define TOK_SYM(s, i) TOK_U32(s, TOK_S_SYM / 4 + (i))
#define TOK_RANK(s, i) TOK_U32(s, TOK_S_RANK / 4 + (i))
#define TOK_MERGED(s, i) TOK_U32(s, TOK_S_MERGED / 4 + (i))

/* v, unknown to the verifier: a counter that starts at a constant and grows in a loop would
 * be a new constant at every iteration, and if anything makes it precise the verifier walks
 * the loop iteration by iteration; started from a value it cannot know (read back from the
 * work area), its range converges at once. */
static __always_inline u32 tok_opaque(TOK_V s, u32 v)
{
	volatile u32 QB *slot = &TOK_U32(s, TOK_S_OPAQUE / 4);

	*slot = v;
	barrier();
	return *slot;
}

/* x, its value kept, no longer linked (to the verifier) to the value it was computed from: an
 * ALU operation other than adding a constant clears a scalar's link (Linux 7.x links alu32
 * additions too). The array build's only (the arena build's loops are may_goto loops). */
#ifdef QB_ARRAY_LAYER
#define TOK_UNLINK(x) asm volatile("%0 |= 0" : "+r"(x))
#else
#define TOK_UNLINK(x) ((void)0)
#endif

/* TOK_EACH(fn, c, start, end): for (u32 i = start; i < end; i++) until fn(c, i) returns nonzero,
 * fn a `static __always_inline int fn(T *c, u32 i)` and c a T with a member `from` (TOK_EACH sets
 * it). The arena build: a may_goto loop (can_loop), whose start must be unknown to the verifier
 * (data, or tok_opaque of a constant) so that its states converge; every use is at most
 * LIM_TOK_CP_MAX (or a table's slots, < 2^20) iterations a call, far below can_loop's budget.
 * The array build: bpf_loop (Linux 5.17) over fn's callback, which TOK_EACH_FN(fn, T) defines
 * after fn. A caller that needs the whole range checks its own progress afterwards (a
 * TOK_E_BUDGET when short). Every member a step reads starts unknown to the verifier (data, an
 * argument, or tok_opaque of a constant): Linux 6.1 verifies a callback once, with the values it
 * sees at the call, and removes the branches those values make dead (6.7 on verify callbacks as
 * loops). */
#ifndef QB_ARRAY_LAYER
#define TOK_EACH_FN(fn, T)
#define TOK_EACH(fn, c, start, end)                                                          \
	do {                                                                                 \
		for (u32 i_ = (start); i_ < (end) && can_loop; i_++)                         \
			if (fn((c), i_))                                                     \
				break;                                                       \
	} while (0)
/* a function the array build inlines into its caller, for the frame it saves */
#define TOK_FLAT __noinline
#else
#define TOK_EACH_FN(fn, T)                                                                   \
	static int fn##_cb(u64 k, void *c)                                                   \
	{                                                                                    \
		int r_ = fn((T *)c, ((T *)c)->from + (u32)k);                                \
		asm volatile("" : "+r"(r_));                                                 \
		return r_ != 0;                                                              \
	}
#define TOK_EACH(fn, c, start, end)                                                          \
	do {                                                                                 \
		u32 s_ = (start), e_ = (end);                                                 \
		(c)->from = s_;                                                              \
		if (e_ > s_)                                                                 \
			bpf_loop(e_ - s_, fn##_cb, (c), 0);                                  \
	} while (0)
#define TOK_FLAT static __always_inline
#endif

/* In a step or a function: v, the vector `expr` gives, or the walk stops (returns `fail`). In
 * the array build the lookup cannot fail once tokenize has checked tok_cfg and the buffers;
 * in the arena build there is no test. Walks hold scalars only and each step looks its vectors
 * up again (an array map's lookup is a few inlined instructions): a vector is 16 bytes of
 * stack in the array build, and stack is what the deepest chain runs short of. */
#define TOK_GET(v, expr, fail)                                                               \
	TOK_V v = (expr);                                                                    \
	if (!QB_VEC_OK(v))                                                                   \
		return (fail)

/* A code point's record. */
static __always_inline u32 tok_record(TOK_V w, u32 cp)
{
	u32 blk = TOK_U32(w, TOK_U32(w, TOK_H_STAGE1) + (cp >> 8));

	return TOK_U32(w, TOK_U32(w, TOK_H_STAGE2) + blk * 256 + (cp & 255));
}

/* The hash of a pair of keys (tok_tables.rs's hash). */
static __always_inline u32 tok_hash(u32 a, u32 b)
{
	u32 h = a * 0x9E3779B1U ^ b * 0x85EBCA6BU;

	return h ^ h >> 15;
}

/* ------------------------------------------------------------------ 1. added tokens */

struct tok_match_walk {
	u64 text;
	u32 from, p, pool, same;
};

static __always_inline int tok_match_step(struct tok_match_walk *c, u32 j)
{
	TOK_GET(w, tok_words(), 1);
	TOK_GET(t, tok_vec(c->text, 1), 1);

	if (TOK_U8(t, c->p + j) != TOK_U8(w, c->pool + j)) {
		c->same = 0;
		return 1;
	}
	return 0;
}
TOK_EACH_FN(tok_match_step, struct tok_match_walk)

/* Whether the n (<= LIM_TOK_ADDED_LEN) bytes at text + p are those at byte off of the pool. */
__noinline int tok_match(u64 text, u32 p, u32 off, u32 n)
{
	struct tok_match_walk c = { .text = text, .p = p, .same = 1 };
	TOK_GET(s, tok_scratch(), 0);
	TOK_GET(w, tok_words(), 0);

	c.pool = TOK_U32(w, TOK_H_POOL) * 4 + off;
	TOK_EACH(tok_match_step, &c, tok_opaque(s, 0), n);
	return c.same;
}

struct tok_added_walk {
	u64 text;
	u32 from, p, len, best_len;
	int best;
};

static __always_inline int tok_added_step(struct tok_added_walk *c, u32 k)
{
	TOK_GET(w, tok_words(), 1);
	u32 e = TOK_U32(w, TOK_H_ADDED) + k * 4;
	u32 off = TOK_U32(w, e), n = TOK_U32(w, e + 1);

	if (n > c->best_len && n <= c->len - c->p && tok_match(c->text, c->p, off, n)) {
		c->best = k;
		c->best_len = n;
	}
	return 0;
}
TOK_EACH_FN(tok_added_step, struct tok_added_walk)

/* The longest added token at byte p of text[0, len): its index, or -1. */
__noinline int tok_added_at(u64 text, u32 p, u32 len)
{
	struct tok_added_walk c = { .text = text, .p = p, .len = len, .best = -1 };
	TOK_GET(s, tok_scratch(), -1);
	TOK_GET(w, tok_words(), -1);
	TOK_GET(t, tok_vec(text, 1), -1);
	u32 f = TOK_U32(w, TOK_U32(w, TOK_H_ADDED_FIRST) + TOK_U8(t, p)), first = f & 0xffff;

	c.best_len = tok_opaque(s, 0);
	/* the (at most LIM_TOK_ADDED_MAX) tokens that start with this byte */
	TOK_EACH(tok_added_step, &c, first, first + (f >> 16));
	return c.best;
}

struct tok_find_walk {
	u64 text, found;
	u32 from, len, first;
};

static __always_inline int tok_find_step(struct tok_find_walk *c, u32 p)
{
	TOK_GET(w, tok_words(), 1);
	TOK_GET(t, tok_vec(c->text, 1), 1);
	int k;

	if (!(TOK_U32(w, c->first + TOK_U8(t, p)) >> 16))
		return 0;
	k = tok_added_at(c->text, p, c->len);
	if (k >= 0) {
		c->found = p | (u64)(k + 1) << 32;
		return 1;
	}
	return 0;
}
TOK_EACH_FN(tok_find_step, struct tok_find_walk)

/* The leftmost-longest added token at or after pos: its start | (index + 1) << 32, or len. */
__noinline u64 tok_find_added(u64 text, u32 pos, u32 len)
{
	struct tok_find_walk c = { .text = text, .found = len, .len = len };
	TOK_GET(w, tok_words(), len);

	c.first = TOK_U32(w, TOK_H_ADDED_FIRST);
	TOK_EACH(tok_find_step, &c, pos, len);
	return c.found;
}

/* ------------------------------------------------------------------ 2-4. NFC */

struct tok_decompose_walk {
	u64 text;
	u32 from, p, end, n;
	int err;
};

/* Pushes x as the next code point, or sets TOK_E_CPS (then 1: stop). */
static __always_inline int tok_push(struct tok_decompose_walk *c, TOK_V s, u32 x)
{
	if (c->n >= LIM_TOK_CP_MAX) {
		c->err = TOK_E_CPS;
		return 1;
	}
	TOK_CP(s, c->n) = x;
	c->n++;
	return 0;
}

/* Sets the walk's error (then 1: stop). */
#define TOK_FAIL(c, e) ((c)->err = (e), 1)

/* One character at byte c->p (at least a byte per step). */
static __always_inline int tok_decompose_step(struct tok_decompose_walk *c, u32 step)
{
	TOK_GET(s, tok_scratch(), TOK_FAIL(c, TOK_E_TABLES));
	TOK_GET(w, tok_words(), TOK_FAIL(c, TOK_E_TABLES));
	TOK_GET(t, tok_vec(c->text, 1), TOK_FAIL(c, TOK_E_TABLES));
	u32 p = c->p, end = c->end, b0, cp, len, min, rec, d;

	if (p >= end)
		return 1;
	b0 = TOK_U8(t, p);
	/* UTF-8: the lead byte gives the length; no overlongs, surrogates or > U+10FFFF */
	if (b0 < 0x80) {
		cp = b0, len = 1, min = 0;
	} else if ((b0 & 0xe0) == 0xc0) {
		cp = b0 & 0x1f, len = 2, min = 0x80;
	} else if ((b0 & 0xf0) == 0xe0) {
		cp = b0 & 0x0f, len = 3, min = 0x800;
	} else if ((b0 & 0xf8) == 0xf0) {
		cp = b0 & 0x07, len = 4, min = 0x10000;
	} else {
		return TOK_FAIL(c, TOK_E_UTF8);
	}
	if (len > end - p)
		return TOK_FAIL(c, TOK_E_UTF8);
	for (u32 k = 1; k < 4; k++) {
		if (k < len) {
			u32 b = TOK_U8(t, p + k);

			if ((b & 0xc0) != 0x80)
				return TOK_FAIL(c, TOK_E_UTF8);
			cp = cp << 6 | (b & 0x3f);
		}
	}
	if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000))
		return TOK_FAIL(c, TOK_E_UTF8);
	c->p = p + len;

	if (cp - TOK_S_BASE < TOK_S_COUNT) {
		u32 h = cp - TOK_S_BASE;

		if (tok_push(c, s, TOK_L_BASE + h / TOK_N_COUNT) ||
		    tok_push(c, s, (TOK_V_BASE + (h % TOK_N_COUNT) / TOK_T_COUNT) | TOK_W_SECOND))
			return 1;
		if (h % TOK_T_COUNT && tok_push(c, s, (TOK_T_BASE + h % TOK_T_COUNT) | TOK_W_SECOND))
			return 1;
		return 0;
	}
	rec = tok_record(w, cp);
	d = rec >> 16;
	if (!d)
		return tok_push(c, s, cp | (rec & TOK_SECOND ? TOK_W_SECOND : 0) | (rec >> 8 & 0xff) << 24);
	/* a canonical decomposition has at most 4 code points */
	u32 dec = TOK_U32(w, TOK_H_DECOMP) + d, dn = TOK_U32(w, dec);

	for (u32 k = 0; k < 4; k++)
		if (k < dn && tok_push(c, s, TOK_U32(w, dec + 1 + k)))
			return 1;
	return 0;
}
TOK_EACH_FN(tok_decompose_step, struct tok_decompose_walk)

/* Stage 2: decodes text[start, end) into the work area's code points, canonically decomposed,
 * each cp | W_SECOND | ccc << 24. Returns how many, or an error. */
__noinline int tok_decompose(u64 text, u32 start, u32 end)
{
	struct tok_decompose_walk c = { .text = text, .p = start, .end = end };
	TOK_GET(s, tok_scratch(), TOK_E_TABLES);

	c.n = tok_opaque(s, 0);
	TOK_EACH(tok_decompose_step, &c, start, end);
	if (c.err)
		return c.err;
	return c.p < end ? TOK_E_BUDGET : (int)c.n;
}

struct tok_reorder_walk {
	u32 from, j, ccc, run;
	int err;
};

static __always_inline int tok_reorder_one_step(struct tok_reorder_walk *c, u32 step)
{
	TOK_GET(s, tok_scratch(), 1);
	u32 j = c->j;

	if (j == 0 || (TOK_CP(s, j - 1) >> 24) <= c->ccc)
		return 1;
	TOK_CP(s, j) = TOK_CP(s, j - 1);
	c->j = j - 1;
	return 0;
}
TOK_EACH_FN(tok_reorder_one_step, struct tok_reorder_walk)

/* Moves code point i back before the non-starters of a higher class just before it. */
__noinline int tok_reorder_one(u32 i)
{
	struct tok_reorder_walk c = { .j = i };
	TOK_GET(s, tok_scratch(), TOK_E_TABLES);
	u32 x = TOK_CP(s, i);

	c.ccc = x >> 24;
	/* stops at the run's starter (class 0): at most LIM_TOK_MARKS_MAX steps */
	TOK_EACH(tok_reorder_one_step, &c, tok_opaque(s, 0), LIM_TOK_MARKS_MAX);
	TOK_CP(s, c.j) = x;
	return 0;
}

static __always_inline int tok_reorder_step(struct tok_reorder_walk *c, u32 i)
{
	TOK_GET(s, tok_scratch(), TOK_FAIL(c, TOK_E_TABLES));
	u32 ccc = TOK_CP(s, i) >> 24;

	if (!ccc) {
		/* a constant here would make the verifier walk every run length (6.12) */
		c->run = tok_opaque(s, 0);
		return 0;
	}
	if (++c->run > LIM_TOK_MARKS_MAX)
		return TOK_FAIL(c, TOK_E_MARKS);
	if (i > 0 && (TOK_CP(s, i - 1) >> 24) > ccc)
		tok_reorder_one(i);
	return 0;
}
TOK_EACH_FN(tok_reorder_step, struct tok_reorder_walk)

/* Stage 3: canonical order of the n code points. */
__noinline int tok_reorder(u32 n)
{
	struct tok_reorder_walk c = {};
	TOK_GET(s, tok_scratch(), TOK_E_TABLES);

	c.run = tok_opaque(s, 0);
	TOK_EACH(tok_reorder_step, &c, tok_opaque(s, 0), n);
	return c.err;
}

/* A probe of one of the tables' hash maps (compositions, merges: slots of four words), from
 * the key's hash on, slot k & mask. */
struct tok_probe_walk {
	u64 found;
	u32 from, table, mask, a, b;
};

static __always_inline int tok_probe_step(struct tok_probe_walk *c, u32 k)
{
	TOK_GET(w, tok_words(), 1);
	u32 e = c->table + (k & c->mask) * 4, a = TOK_U32(w, e);

	if (!a)
		return 1;
	if (a == c->a && TOK_U32(w, e + 1) == c->b) {
		c->found = (u64)TOK_U32(w, e + 2) << 32 | TOK_U32(w, e + 3);
		return 1;
	}
	return 0;
}
TOK_EACH_FN(tok_probe_step, struct tok_probe_walk)

/* The slot of key (a, b) in the hash map whose slots start at header word `table` and whose
 * mask is at header word `mask`: its words 2 and 3 as word2 << 32 | word3, or `none`. */
static __always_inline u64 tok_probe(u32 table, u32 mask, u32 a, u32 b, u64 none)
{
	struct tok_probe_walk c = { .found = none, .a = a, .b = b };
	TOK_GET(w, tok_words(), none);
	u32 h;

	c.table = TOK_U32(w, table);
	c.mask = TOK_U32(w, mask);
	/* (the hash, read from the tables, is unknown to the verifier: a start that converges) */
	h = tok_hash(a, b) & c.mask;
	TOK_EACH(tok_probe_step, &c, h, h + c.mask + 1);
	return c.found;
}

/* The primary composite of a and b, 0 if none. */
__noinline u32 tok_compose_pair(u32 a, u32 b)
{
	if (a - TOK_L_BASE < TOK_L_COUNT && b - TOK_V_BASE < TOK_V_COUNT)
		return TOK_S_BASE + ((a - TOK_L_BASE) * TOK_V_COUNT + (b - TOK_V_BASE)) * TOK_T_COUNT;
	if (a - TOK_S_BASE < TOK_S_COUNT && (a - TOK_S_BASE) % TOK_T_COUNT == 0 && b > TOK_T_BASE &&
	    b < TOK_T_BASE + TOK_T_COUNT)
		return a + (b - TOK_T_BASE);
	/* the composite is the slot's word 2 */
	return tok_probe(TOK_H_COMP, TOK_H_COMP_MASK, a, b, 0) >> 32;
}

struct tok_compose_walk {
	u32 from, w, starter, last;
};

static __always_inline int tok_compose_step(struct tok_compose_walk *c, u32 r)
{
	TOK_GET(s, tok_scratch(), 1);
	u32 x = TOK_CP(s, r), ccc = x >> 24;

	if (c->starter != TOK_NONE && (c->last == 0x100 || c->last < ccc) && (x & TOK_W_SECOND)) {
		u32 comp = tok_compose_pair(TOK_CP(s, c->starter) & TOK_CP_MASK, x & TOK_CP_MASK);

		if (comp) {
			TOK_CP(s, c->starter) = comp;
			return 0;
		}
	}
	if (!ccc) {
		c->starter = c->w;
		c->last = 0x100;
	} else if (c->starter != TOK_NONE) {
		c->last = ccc;
	}
	TOK_CP(s, c->w) = x;
	c->w++;
	return 0;
}
TOK_EACH_FN(tok_compose_step, struct tok_compose_walk)

/* Stage 4: composes the n code points in place (starter: the index of the character others
 * compose with; last: the class of the last one kept after it, 0x100 for none). Returns the
 * new count. */
__noinline int tok_compose(u32 n)
{
	struct tok_compose_walk c = {};
	TOK_GET(s, tok_scratch(), TOK_E_TABLES);

	c.w = tok_opaque(s, 0);
	c.starter = tok_opaque(s, TOK_NONE);
	c.last = tok_opaque(s, 0x100);
	TOK_EACH(tok_compose_step, &c, tok_opaque(s, 0), n);
	return c.w;
}

struct tok_classify_walk {
	u32 from;
};

static __always_inline int tok_classify_step(struct tok_classify_walk *c, u32 i)
{
	TOK_GET(s, tok_scratch(), 1);
	TOK_GET(w, tok_words(), 1);
	u32 cp = TOK_CP(s, i) & TOK_CP_MASK;

	TOK_CP(s, i) = cp | (tok_record(w, cp) & 0xf) << 24;
	return 0;
}
TOK_EACH_FN(tok_classify_step, struct tok_classify_walk)

/* Each code point's word becomes cp | class << 24. */
__noinline int tok_classify(u32 n)
{
	struct tok_classify_walk c = {};
	TOK_GET(s, tok_scratch(), TOK_E_TABLES);

	TOK_EACH(tok_classify_step, &c, tok_opaque(s, 0), n);
	return 0;
}

#include "tok_bpe.inc.c"

/* ------------------------------------------------------------------ the pipeline */

struct tok_segment_walk {
	u64 out;
	u32 from, i, n, count, max_out;
	int err;
};

/* The piece at code point c->i (at least a code point per piece). */
static __always_inline int tok_piece_step(struct tok_segment_walk *c, u32 step)
{
	u32 e;
	int r;

	if (c->i >= c->n)
		return 1;
	e = tok_piece_end(c->i, c->n);
	r = tok_bpe(c->i, e, c->out, c->count, c->max_out);
	if (r < 0)
		return TOK_FAIL(c, r);
	c->count = r;
	c->i = e;
	return 0;
}
TOK_EACH_FN(tok_piece_step, struct tok_segment_walk)

/* Stages 2-6 on text[start, end), ids written from out[count] (count_max: count | max_out << 32).
 * Returns the new count or an error. */
TOK_FLAT int tok_segment(u64 text, u32 start, u32 end, u64 out, u64 count_max)
{
	struct tok_segment_walk c = { .out = out, .count = (u32)count_max, .max_out = count_max >> 32 };
	int n, r;

	n = tok_decompose(text, start, end);
	if (n < 0)
		return n;
	r = tok_reorder(n);
	if (r < 0)
		return r;
	n = tok_compose(n);
	if (n < 0)
		return n;
	r = tok_classify(n);
	if (r < 0)
		return r;
	TOK_GET(s, tok_scratch(), TOK_E_TABLES);
	c.i = tok_opaque(s, 0);
	c.n = n;
	TOK_EACH(tok_piece_step, &c, tok_opaque(s, 0), n);
	if (c.err)
		return c.err;
	return c.i < (u32)n ? TOK_E_BUDGET : (int)c.count;
}

struct tok_walk {
	u64 text, out;
	u32 from, len, max_out, pos, count;
	int err;
};

/* The stretch from c->pos to the next added token, then that token (each pass consumes at least
 * a byte). */
static __always_inline int tok_step(struct tok_walk *c, u32 step)
{
	u64 f;
	u32 m, k, e;

	if (c->pos >= c->len)
		return 1;
	f = tok_find_added(c->text, c->pos, c->len);
	m = (u32)f;
	k = f >> 32;
	if (m > c->pos) {
		int r = tok_segment(c->text, c->pos, m, c->out, c->count | (u64)c->max_out << 32);

		if (r < 0)
			return TOK_FAIL(c, r);
		c->count = r;
	}
	if (!k) {
		c->pos = c->len;
		return 1;
	}
	if (c->count >= c->max_out)
		return TOK_FAIL(c, TOK_E_IDS);
	TOK_GET(w, tok_words(), TOK_FAIL(c, TOK_E_TABLES));
	TOK_GET(o, tok_vec(c->out, (u64)c->max_out * 4), TOK_FAIL(c, TOK_E_TABLES));
	e = TOK_U32(w, TOK_H_ADDED) + (k - 1) * 4;
	TOK_U32(o, c->count) = TOK_U32(w, e + 2);
	c->count++;
	c->pos = m + TOK_U32(w, e + 1);
	return 0;
}
TOK_EACH_FN(tok_step, struct tok_walk)

/* The ids of the len bytes of UTF-8 at `text`, written to out (max_out ids): their count, or a
 * negative TOK_E_*. Reads the tables and work area tok_cfg names. The array build checks here
 * that the work area, the text and the ids each lie in one element (TOK_E_TABLES if not). */
TOK_FLAT int tokenize(u64 text, u32 len, u64 out, u32 max_out)
{
	struct tok_walk c = { .text = text, .out = out, .len = len, .max_out = max_out };

	if (!tok_cfg.tables || !tok_cfg.scratch)
		return TOK_E_TABLES;
	TOK_GET(s, tok_scratch(), TOK_E_TABLES);
	TOK_GET(w, tok_words(), TOK_E_TABLES);
	if (TOK_U32(w, TOK_H_MAGIC) != TOK_MAGIC)
		return TOK_E_TABLES;
	if (len > LIM_TOK_TEXT_MAX)
		return TOK_E_TEXT;
	if (max_out > LIM_TOK_IDS_MAX)
		return TOK_E_IDS;
	if (!QB_VEC_OK(tok_vec(out, (u64)max_out * 4)) || !QB_VEC_OK(tok_vec(text, len)))
		return TOK_E_TABLES;
	c.pos = tok_opaque(s, 0);
	c.count = tok_opaque(s, 0);
	TOK_EACH(tok_step, &c, tok_opaque(s, 0), len);
	if (c.err)
		return c.err;
	return c.pos < len ? TOK_E_BUDGET : (int)c.count;
}

struct tokenize_args {
	u64 tables;  /* the tables, see tok_tables.rs */
	u64 scratch; /* the work area, TOK_SCRATCH_BYTES */
	u64 text;    /* u8 [len]: UTF-8 */
	u64 out;     /* u32 [max_out]: the ids */
	u32 len, max_out;
	s32 count;   /* out: ids written, or a negative TOK_E_* */
	u32 pad;
};

/* Runs tokenize on the ctx's text with the ctx's tables and work area. */
SEC("syscall")
int tokenize_text(struct tokenize_args *a)
{
	QB_MEM_USE(arena);
	tok_cfg.tables = a->tables;
	tok_cfg.scratch = a->scratch;
	a->count = tokenize(a->text, a->len, a->out, a->max_out);
	return 0;
}
