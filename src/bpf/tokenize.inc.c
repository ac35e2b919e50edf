// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* The Qwen3 tokenizer in the kernel: UTF-8 text in an arena buffer -> token ids in an arena
 * buffer, equal to the `tokenizers` crate's encode (no special tokens added) for a byte-level
 * BPE tokenizer.json of Qwen's kind. src/num/tok_tables.rs builds the tables (layout and shapes
 * there, header below) and src/num/tok_twin.rs is the Rust twin of every function here.
 *
 * tokenize(text, len, out, max_out) runs the stages:
 *   1. added tokens: matched in the raw text, leftmost-longest (tok_find_added);
 *   each stretch between them (tok_segment):
 *   2. UTF-8 decode and canonical decomposition, Hangul arithmetically (tok_decompose);
 *   3. canonical reordering: a stable insertion sort of each run of non-starters (tok_reorder);
 *   4. canonical composition (tok_compose), then each code point's regex class (tok_classify);
 *   5. Qwen's split regex as a state machine: the end of the piece at i (tok_piece_end);
 *   6. byte-level BPE of each piece: the lowest-ranked adjacent pair merged, leftmost on ties,
 *      until none is left (tok_bpe; tok_bpe_round merges the lowest rank's pairs left to right
 *      while no merge makes a lower rank: the same merges in the same order).
 * Every stage is a global function (verified on its own) whose loops are bounded by limits.h's
 * LIM_TOK_*: the outer ones open-coded iterators (bpf_for, whose counters the verifier widens),
 * the hot ones may_goto loops (TOK_LOOP). A limit exceeded is a negative TOK_E_* return, never
 * a truncation. The tables and a work area are in the arena:
 * tok_cfg says where (the tokenize_text program sets it from its ctx; a bpf_wq callback that
 * tokenizes sets it the same way). One tokenize runs at a time per work area. */
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
#define TOK_E_TABLES (-7) /* no tables */
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

/* Where the tables and the work area are (arena addresses). */
struct tok_config {
	u64 tables;
	u64 scratch;
};
struct tok_config tok_cfg;

static __always_inline const u32 __arena *tok_words(void)
{
	return ARENA_PTR(const u32, tok_cfg.tables);
}

static __always_inline u32 __arena *tok_area(u32 off)
{
	return ARENA_PTR(u32, tok_cfg.scratch + off);
}

/* v, unknown to the verifier: a counter that starts at a constant and grows in a loop would
 * be a new constant at every iteration, and if anything makes it precise the verifier walks
 * the loop iteration by iteration; started from a value it cannot know (read back from the
 * arena), its range converges at once. */
static __always_inline u32 tok_opaque(u32 v)
{
	u32 __arena *slot = ARENA_PTR(u32, tok_cfg.scratch + TOK_S_OPAQUE);

	*slot = v;
	barrier();
	return *(volatile u32 __arena *)slot;
}

/* for (u32 i = start; i < end; i++) as a may_goto loop (common.h's can_loop: a decrement and a
 * branch per iteration, where bpf_for calls a kfunc) for the hot loops: the probes of the hash
 * tables, the per-code-point passes, BPE's rounds. Each runs in a global function of its own,
 * at most LIM_TOK_CP_MAX (or a table's slots, < 2^20) iterations per call, far below can_loop's
 * budget per call. The counter starts opaque (tok_opaque) so that the verifier's states
 * converge. */
#define TOK_LOOP(i, start, end) for (u32 i = tok_opaque(start); i < (end) && can_loop; i++)

/* A code point's record. */
static __always_inline u32 tok_record(const u32 __arena *w, u32 cp)
{
	u32 blk = w[w[TOK_H_STAGE1] + (cp >> 8)];

	return w[w[TOK_H_STAGE2] + blk * 256 + (cp & 255)];
}

/* The hash of a pair of keys (tok_tables.rs's hash). */
static __always_inline u32 tok_hash(u32 a, u32 b)
{
	u32 h = a * 0x9E3779B1U ^ b * 0x85EBCA6BU;

	return h ^ h >> 15;
}

/* ------------------------------------------------------------------ 1. added tokens */

/* Whether the n (<= LIM_TOK_ADDED_LEN) bytes at text + p are those at byte off of the pool. */
__noinline int tok_match(u64 text, u32 p, u32 off, u32 n)
{
	const u32 __arena *w = tok_words();
	const u8 __arena *t = ARENA_PTR(const u8, text + p);
	const u8 __arena *pool = ARENA_PTR(const u8, tok_cfg.tables + (u64)w[TOK_H_POOL] * 4 + off);
	int same = 1;

	FOR(j, 0, n) {
		if (t[j] != pool[j]) {
			same = 0;
			break;
		}
	}
	return same;
}

/* The longest added token at byte p of text[0, len): its index, or -1. */
__noinline int tok_added_at(u64 text, u32 p, u32 len)
{
	const u32 __arena *w = tok_words();
	const u8 __arena *t = ARENA_PTR(const u8, text);
	u32 f = w[w[TOK_H_ADDED_FIRST] + t[p]];
	u32 first = f & 0xffff, best_len = 0;
	int best = -1;

	/* the (at most LIM_TOK_ADDED_MAX) tokens that start with this byte */
	FOR(k, first, first + (f >> 16)) {
		const u32 __arena *e = w + w[TOK_H_ADDED] + k * 4;
		u32 off = e[0], n = e[1];

		if (n > best_len && n <= len - p && tok_match(text, p, off, n)) {
			best = k;
			best_len = n;
		}
	}
	return best;
}

/* The leftmost-longest added token at or after pos: its start | (index + 1) << 32, or len. */
__noinline u64 tok_find_added(u64 text, u32 pos, u32 len)
{
	const u32 __arena *w = tok_words();
	const u8 __arena *t = ARENA_PTR(const u8, text);
	u32 first = w[TOK_H_ADDED_FIRST];
	u64 found = len;

	TOK_LOOP(p, pos, len) {
		int k;

		if (!(w[first + t[p]] >> 16))
			continue;
		k = tok_added_at(text, p, len);
		if (k >= 0) {
			found = p | (u64)(k + 1) << 32;
			break;
		}
	}
	return found;
}

/* ------------------------------------------------------------------ 2-4. NFC */

/* Stage 2: decodes text[start, end) into the work area's code points, canonically decomposed,
 * each cp | W_SECOND | ccc << 24. Returns how many, or an error. */
__noinline int tok_decompose(u64 text, u32 start, u32 end)
{
	const u32 __arena *w = tok_words();
	const u8 __arena *t = ARENA_PTR(const u8, text);
	u32 __arena *cps = tok_area(TOK_S_CPS);
	u32 n = tok_opaque(0), p = start;

#define TOK_PUSH(x)                              \
	do {                                     \
		if (n >= LIM_TOK_CP_MAX)         \
			return TOK_E_CPS;        \
		cps[n++] = (x);                  \
	} while (0)

	/* at least a byte per step */
	TOK_LOOP(step, start, end) {
		u32 b0 = t[p], cp, len, min, rec, d;

		if (p >= end)
			break;
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
			return TOK_E_UTF8;
		}
		if (len > end - p)
			return TOK_E_UTF8;
		for (u32 k = 1; k < 4; k++) {
			if (k < len) {
				u32 b = t[p + k];

				if ((b & 0xc0) != 0x80)
					return TOK_E_UTF8;
				cp = cp << 6 | (b & 0x3f);
			}
		}
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000))
			return TOK_E_UTF8;
		p += len;

		if (cp - TOK_S_BASE < TOK_S_COUNT) {
			u32 s = cp - TOK_S_BASE;

			TOK_PUSH(TOK_L_BASE + s / TOK_N_COUNT);
			TOK_PUSH((TOK_V_BASE + (s % TOK_N_COUNT) / TOK_T_COUNT) | TOK_W_SECOND);
			if (s % TOK_T_COUNT)
				TOK_PUSH((TOK_T_BASE + s % TOK_T_COUNT) | TOK_W_SECOND);
			continue;
		}
		rec = tok_record(w, cp);
		d = rec >> 16;
		if (!d) {
			TOK_PUSH(cp | (rec & TOK_SECOND ? TOK_W_SECOND : 0) | (rec >> 8 & 0xff) << 24);
			continue;
		}
		/* a canonical decomposition has at most 4 code points */
		const u32 __arena *dec = w + w[TOK_H_DECOMP] + d;
		u32 dn = dec[0];

		for (u32 k = 0; k < 4; k++)
			if (k < dn)
				TOK_PUSH(dec[1 + k]);
	}
#undef TOK_PUSH
	return p < end ? TOK_E_BUDGET : (int)n;
}

/* Moves code point i back before the non-starters of a higher class just before it. */
__noinline int tok_reorder_one(u32 i)
{
	u32 __arena *cps = tok_area(TOK_S_CPS);
	u32 x = cps[i], c = x >> 24, j = i;

	/* stops at the run's starter (class 0): at most LIM_TOK_MARKS_MAX steps */
	FOR(step, 0, LIM_TOK_MARKS_MAX) {
		if (j == 0 || (cps[j - 1] >> 24) <= c)
			break;
		cps[j] = cps[j - 1];
		j--;
	}
	cps[j] = x;
	return 0;
}

/* Stage 3: canonical order of the n code points. */
__noinline int tok_reorder(u32 n)
{
	u32 __arena *cps = tok_area(TOK_S_CPS);
	u32 run = tok_opaque(0);

	TOK_LOOP(i, 0, n) {
		u32 c = cps[i] >> 24;

		if (!c) {
			run = tok_opaque(0); /* a constant here would make the verifier walk every run length (6.12) */
			continue;
		}
		if (++run > LIM_TOK_MARKS_MAX)
			return TOK_E_MARKS;
		if (i > 0 && (cps[i - 1] >> 24) > c)
			tok_reorder_one(i);
	}
	return 0;
}

/* The primary composite of a and b, 0 if none. */
__noinline u32 tok_compose_pair(u32 a, u32 b)
{
	const u32 __arena *w = tok_words();
	u32 mask = w[TOK_H_COMP_MASK], i = tok_hash(a, b) & mask;

	if (a - TOK_L_BASE < TOK_L_COUNT && b - TOK_V_BASE < TOK_V_COUNT)
		return TOK_S_BASE + ((a - TOK_L_BASE) * TOK_V_COUNT + (b - TOK_V_BASE)) * TOK_T_COUNT;
	if (a - TOK_S_BASE < TOK_S_COUNT && (a - TOK_S_BASE) % TOK_T_COUNT == 0 && b > TOK_T_BASE &&
	    b < TOK_T_BASE + TOK_T_COUNT)
		return a + (b - TOK_T_BASE);
	u32 comp = 0;

	TOK_LOOP(k, 0, mask + 1) {
		const u32 __arena *e = w + w[TOK_H_COMP] + i * 4;

		if (!e[0])
			break;
		if (e[0] == a && e[1] == b) {
			comp = e[2];
			break;
		}
		i = (i + 1) & mask;
	}
	return comp;
}

/* Stage 4: composes the n code points in place (starter: the index of the character others
 * compose with; last: the class of the last one kept after it, 0x100 for none). Returns the
 * new count. */
__noinline int tok_compose(u32 n)
{
	u32 __arena *cps = tok_area(TOK_S_CPS);
	u32 w = tok_opaque(0), starter = TOK_NONE, last = 0x100;

	TOK_LOOP(r, 0, n) {
		u32 x = cps[r], c = x >> 24;

		if (starter != TOK_NONE && (last == 0x100 || last < c) && (x & TOK_W_SECOND)) {
			u32 comp = tok_compose_pair(cps[starter] & TOK_CP_MASK, x & TOK_CP_MASK);

			if (comp) {
				cps[starter] = comp;
				continue;
			}
		}
		if (!c) {
			starter = w;
			last = 0x100;
		} else if (starter != TOK_NONE) {
			last = c;
		}
		cps[w++] = x;
	}
	return w;
}

/* Each code point's word becomes cp | class << 24. */
__noinline int tok_classify(u32 n)
{
	const u32 __arena *w = tok_words();
	u32 __arena *cps = tok_area(TOK_S_CPS);

	TOK_LOOP(i, 0, n) {
		u32 cp = cps[i] & TOK_CP_MASK;

		cps[i] = cp | (tok_record(w, cp) & 0xf) << 24;
	}
	return 0;
}

/* ------------------------------------------------------------------ 5. the split regex */

/* The first index at or after k (below n) whose class is not in the bit set `set`. */
__noinline u32 tok_run(u32 k, u32 n, u32 set)
{
	const u32 __arena *cps = tok_area(TOK_S_CPS);
	u32 end = n;

	TOK_LOOP(j, k, n) {
		if (!(set >> (cps[j] >> 24) & 1)) {
			end = j;
			break;
		}
	}
	return end;
}

/* The ASCII letter a code point matches case-insensitively (the engine folds U+017F to s). */
static __always_inline u32 tok_fold(u32 cp)
{
	if (cp - 'A' < 26)
		return cp + 32;
	if (cp - 'a' < 26)
		return cp;
	return cp == 0x17f ? 's' : 0;
}

#define TOK_BIT(c) (1U << (c))

/* The end of the piece that starts at code point i of n, as Qwen's split regex
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*
 *   |\s*[\r\n]+|\s+(?!\S)|\s+
 * matches there: the first alternative that matches, each as the engine backtracks it. */
__noinline u32 tok_piece_end(u32 i, u32 n)
{
	const u32 __arena *cps = tok_area(TOK_S_CPS);
	u32 c = cps[i] & TOK_CP_MASK, k = cps[i] >> 24, j, nl = 0;

	if (c == '\'' && i + 1 < n) {
		u32 a = tok_fold(cps[i + 1] & TOK_CP_MASK), b;

		if (a == 's' || a == 't' || a == 'm' || a == 'd')
			return i + 2;
		b = i + 2 < n ? tok_fold(cps[i + 2] & TOK_CP_MASK) : 0;
		if (((a == 'r' || a == 'v') && b == 'e') || (a == 'l' && b == 'l'))
			return i + 3;
	}
	if (k == TOK_C_LETTER)
		return tok_run(i, n, TOK_BIT(TOK_C_LETTER));
	if ((k == TOK_C_OTHER || k == TOK_C_SPACE) && i + 1 < n &&
	    (cps[i + 1] >> 24) == TOK_C_LETTER)
		return tok_run(i + 1, n, TOK_BIT(TOK_C_LETTER));
	if (k == TOK_C_NUMBER)
		return i + 1;
	if (c == ' ' && i + 1 < n && (cps[i + 1] >> 24) == TOK_C_OTHER)
		return tok_run(tok_run(i + 1, n, TOK_BIT(TOK_C_OTHER)), n, TOK_BIT(TOK_C_NEWLINE));
	if (k == TOK_C_OTHER)
		return tok_run(tok_run(i, n, TOK_BIT(TOK_C_OTHER)), n, TOK_BIT(TOK_C_NEWLINE));
	/* whitespace [i, j): \s*[\r\n]+ ends after the run's last CR/LF; else \s+(?!\S) leaves
	 * the run's last character to the next piece unless the text ends there; else \s+ */
	j = tok_run(i, n, TOK_BIT(TOK_C_SPACE) | TOK_BIT(TOK_C_NEWLINE));
	FOR(m, i, j) {
		if ((cps[m] >> 24) == TOK_C_NEWLINE)
			nl = m + 1;
	}
	if (nl)
		return nl;
	return j == n || j - i < 2 ? j : j - 1;
}

/* ------------------------------------------------------------------ 6. byte-level BPE */

/* The merge of ids (l, r): rank << 32 | merged id; rank TOK_NONE if there is none. */
__noinline u64 tok_merge_pair(u32 l, u32 r)
{
	const u32 __arena *w = tok_words();
	u32 mask = w[TOK_H_MERGE_MASK], i = tok_hash(l + 1, r) & mask;

	u64 found = (u64)TOK_NONE << 32;

	TOK_LOOP(k, 0, mask + 1) {
		const u32 __arena *e = w + w[TOK_H_MERGE] + i * 4;

		if (!e[0])
			break;
		if (e[0] == l + 1 && e[1] == r) {
			found = (u64)e[2] << 32 | e[3];
			break;
		}
		i = (i + 1) & mask;
	}
	return found;
}

/* One round of merges of the n symbols: the lowest rank among the pairs, then its pairs merged
 * left to right (the leftmost first, as one merge at a time would) until a merge makes a pair
 * of a lower rank, which the next round takes first. Returns the new count, or -1 if no pair
 * merges. */
__noinline int tok_bpe_round(u32 n)
{
	u32 __arena *sym = tok_area(TOK_S_SYM);
	u32 __arena *rank = tok_area(TOK_S_RANK);
	u32 __arena *merged = tok_area(TOK_S_MERGED);
	/* (a flag, not w > 0: a comparison with a constant would make w a constant again) */
	u32 best = TOK_NONE, w = tok_opaque(0), k = tok_opaque(0), stop = 0, left = 0;
	u64 m;

	TOK_LOOP(j, 0, n - 1) {
		if (rank[j] < best)
			best = rank[j];
	}
	if (best == TOK_NONE)
		return -1;
	/* w: symbols written, k: symbols read (one or two per step) */
	TOK_LOOP(step, 0, n) {
		if (k >= n)
			break;
		if (!stop && k + 1 < n && rank[k] == best) {
			sym[w] = merged[k];
			if (left) {
				m = tok_merge_pair(sym[w - 1], sym[w]);
				rank[w - 1] = m >> 32;
				merged[w - 1] = (u32)m;
				if (m >> 32 < best)
					stop = 1;
			}
			rank[w] = TOK_NONE;
			if (k + 2 < n) {
				m = tok_merge_pair(sym[w], sym[k + 2]);
				rank[w] = m >> 32;
				merged[w] = (u32)m;
				if (m >> 32 < best)
					stop = 1;
			}
			k += 2;
		} else {
			sym[w] = sym[k];
			rank[w] = rank[k];
			merged[w] = merged[k];
			k++;
		}
		w++;
		left = 1;
	}
	return w;
}

/* Stage 6 on the piece of code points [a, b): writes its ids at out[count..]; returns the new
 * count or an error. */
__noinline int tok_bpe(u32 a, u32 b, u64 out, u32 count, u32 max_out)
{
	const u32 __arena *w = tok_words();
	const u32 __arena *cps = tok_area(TOK_S_CPS);
	u8 __arena *word = (u8 __arena *)tok_area(TOK_S_WORD);
	u32 __arena *sym = tok_area(TOK_S_SYM);
	u32 __arena *rank = tok_area(TOK_S_RANK);
	u32 __arena *merged = tok_area(TOK_S_MERGED);
	u32 __arena *o = ARENA_PTR(u32, out);
	u32 nb = tok_opaque(0), n = tok_opaque(0);
	u64 m;

	/* the piece's UTF-8 bytes */
	TOK_LOOP(i, a, b) {
		u32 cp = cps[i] & TOK_CP_MASK;
		u32 len = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;

		if (len > LIM_TOK_WORD_MAX - nb)
			return TOK_E_WORD;
		if (len == 1) {
			word[nb] = cp;
		} else if (len == 2) {
			word[nb] = 0xc0 | cp >> 6;
			word[nb + 1] = 0x80 | (cp & 0x3f);
		} else if (len == 3) {
			word[nb] = 0xe0 | cp >> 12;
			word[nb + 1] = 0x80 | (cp >> 6 & 0x3f);
			word[nb + 2] = 0x80 | (cp & 0x3f);
		} else {
			word[nb] = 0xf0 | cp >> 18;
			word[nb + 1] = 0x80 | (cp >> 12 & 0x3f);
			word[nb + 2] = 0x80 | (cp >> 6 & 0x3f);
			word[nb + 3] = 0x80 | (cp & 0x3f);
		}
		nb += len;
	}
	/* one symbol per byte (a byte outside the vocabulary is dropped, as without an unk token) */
	TOK_LOOP(k, 0, nb) {
		u32 id = w[w[TOK_H_BYTE_ID] + word[k]];

		if (id != TOK_NONE)
			sym[n++] = id;
	}
	/* walked by pointers: indexed, clang adds the arena base to the scaled index, a form
	 * Debian's 6.18.15 verifier refuses ("pointer arithmetic on arena prohibited") */
	{
		u32 __arena *sk = sym, *rk = rank, *mk = merged;

		TOK_LOOP(k, 0, n - (n > 0)) {
			m = tok_merge_pair(sk[0], sk[1]);
			*rk++ = m >> 32;
			*mk++ = (u32)m;
			sk++;
		}
	}
	/* at least one merge per round */
	FOR(step, 0, LIM_TOK_WORD_MAX) {
		int r = n > 1 ? tok_bpe_round(n) : -1;

		if (r < 0)
			break;
		n = r;
	}
	if (n > max_out - count)
		return TOK_E_IDS;
	TOK_LOOP(k, 0, n)
		o[count + k] = sym[k];
	return count + n;
}

/* ------------------------------------------------------------------ the pipeline */

/* Stages 2-6 on text[start, end), ids written from out[count] (count_max: count | max_out << 32).
 * Returns the new count or an error. */
__noinline int tok_segment(u64 text, u32 start, u32 end, u64 out, u64 count_max)
{
	u32 count = (u32)count_max, max_out = count_max >> 32, i = tok_opaque(0);
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
	tok_classify(n);
	/* at least a code point per piece */
	FOR(step, 0, n) {
		u32 e;

		if (i >= (u32)n)
			break;
		e = tok_piece_end(i, n);
		r = tok_bpe(i, e, out, count, max_out);
		if (r < 0)
			return r;
		count = r;
		i = e;
	}
	return i < (u32)n ? TOK_E_BUDGET : (int)count;
}

/* The ids of the len bytes of UTF-8 at `text` (arena), written to out (arena, max_out ids):
 * their count, or a negative TOK_E_*. Reads the tables and work area tok_cfg names. */
__noinline int tokenize(u64 text, u32 len, u64 out, u32 max_out)
{
	const u32 __arena *w = tok_words();
	u32 __arena *o = ARENA_PTR(u32, out);
	u32 pos, count;

	if (!tok_cfg.tables || !tok_cfg.scratch || w[TOK_H_MAGIC] != TOK_MAGIC)
		return TOK_E_TABLES;
	if (len > LIM_TOK_TEXT_MAX)
		return TOK_E_TEXT;
	if (max_out > LIM_TOK_IDS_MAX)
		return TOK_E_IDS;
	pos = tok_opaque(0);
	count = tok_opaque(0);
	/* each pass consumes at least a byte */
	FOR(step, 0, len) {
		u64 f;
		u32 m, k;

		if (pos >= len)
			break;
		f = tok_find_added(text, pos, len);
		m = (u32)f;
		k = f >> 32;
		if (m > pos) {
			int r = tok_segment(text, pos, m, out, count | (u64)max_out << 32);

			if (r < 0)
				return r;
			count = r;
		}
		if (!k) {
			pos = len;
			break;
		}
		if (count >= max_out)
			return TOK_E_IDS;
		const u32 __arena *e = w + w[TOK_H_ADDED] + (k - 1) * 4;

		o[count++] = e[2];
		pos = m + e[1];
	}
	return pos < len ? TOK_E_BUDGET : (int)count;
}

struct tokenize_args {
	u64 tables;  /* the tables (arena), see tok_tables.rs */
	u64 scratch; /* the work area, TOK_SCRATCH_BYTES (arena) */
	u64 text;    /* u8 [len]: UTF-8 (arena) */
	u64 out;     /* u32 [max_out]: the ids (arena) */
	u32 len, max_out;
	s32 count;   /* out: ids written, or a negative TOK_E_* */
	u32 pad;
};

/* Runs tokenize on the ctx's text with the ctx's tables and work area. */
SEC("syscall")
int tokenize_text(struct tokenize_args *a)
{
	USE_ARENA(arena);
	tok_cfg.tables = a->tables;
	tok_cfg.scratch = a->scratch;
	a->count = tokenize(a->text, a->len, a->out, a->max_out);
	return 0;
}
