// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* The in-kernel tokenizer's stages 5 and 6: Qwen's split regex and byte-level BPE.
 * tokenize.inc.c includes this file after stages 1-4 and before the pipeline; each loop is a
 * TOK_EACH step as there. */
#pragma once
/* ------------------------------------------------------------------ 5. the split regex */

struct tok_run_walk {
	u32 from, set, end;
};

static __always_inline int tok_run_step(struct tok_run_walk *c, u32 j)
{
	TOK_GET(s, tok_scratch(), 1);

	if (!(c->set >> (TOK_CP(s, j) >> 24) & 1)) {
		c->end = j;
		return 1;
	}
	return 0;
}
TOK_EACH_FN(tok_run_step, struct tok_run_walk)

/* The first index at or after k (below n) whose class is not in the bit set `set`. */
__noinline u32 tok_run(u32 k, u32 n, u32 set)
{
	struct tok_run_walk c = { .set = set, .end = n };

	TOK_EACH(tok_run_step, &c, k, n);
	return c.end;
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

static __always_inline int tok_newline_step(struct tok_run_walk *c, u32 m)
{
	TOK_GET(s, tok_scratch(), 1);

	if ((TOK_CP(s, m) >> 24) == TOK_C_NEWLINE)
		c->end = m + 1;
	return 0;
}
TOK_EACH_FN(tok_newline_step, struct tok_run_walk)

/* The end of the piece that starts at code point i of n, as Qwen's split regex
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*
 *   |\s*[\r\n]+|\s+(?!\S)|\s+
 * matches there: the first alternative that matches, each as the engine backtracks it. */
__noinline u32 tok_piece_end(u32 i, u32 n)
{
	struct tok_run_walk c = {};
	TOK_GET(s, tok_scratch(), n);
	u32 cp = TOK_CP(s, i) & TOK_CP_MASK, k = TOK_CP(s, i) >> 24, j;

	if (cp == '\'' && i + 1 < n) {
		u32 a = tok_fold(TOK_CP(s, i + 1) & TOK_CP_MASK), b;

		if (a == 's' || a == 't' || a == 'm' || a == 'd')
			return i + 2;
		b = i + 2 < n ? tok_fold(TOK_CP(s, i + 2) & TOK_CP_MASK) : 0;
		if (((a == 'r' || a == 'v') && b == 'e') || (a == 'l' && b == 'l'))
			return i + 3;
	}
	if (k == TOK_C_LETTER)
		return tok_run(i, n, TOK_BIT(TOK_C_LETTER));
	if ((k == TOK_C_OTHER || k == TOK_C_SPACE) && i + 1 < n &&
	    (TOK_CP(s, i + 1) >> 24) == TOK_C_LETTER)
		return tok_run(i + 1, n, TOK_BIT(TOK_C_LETTER));
	if (k == TOK_C_NUMBER)
		return i + 1;
	if (cp == ' ' && i + 1 < n && (TOK_CP(s, i + 1) >> 24) == TOK_C_OTHER)
		return tok_run(tok_run(i + 1, n, TOK_BIT(TOK_C_OTHER)), n, TOK_BIT(TOK_C_NEWLINE));
	if (k == TOK_C_OTHER)
		return tok_run(tok_run(i, n, TOK_BIT(TOK_C_OTHER)), n, TOK_BIT(TOK_C_NEWLINE));
	/* whitespace [i, j): \s*[\r\n]+ ends after the run's last CR/LF; else \s+(?!\S) leaves
	 * the run's last character to the next piece unless the text ends there; else \s+ */
	j = tok_run(i, n, TOK_BIT(TOK_C_SPACE) | TOK_BIT(TOK_C_NEWLINE));
	TOK_EACH(tok_newline_step, &c, i, j);
	if (c.end)
		return c.end;
	return j == n || j - i < 2 ? j : j - 1;
}

/* ------------------------------------------------------------------ 6. byte-level BPE */

/* The merge of ids (l, r): rank << 32 | merged id; rank TOK_NONE if there is none. */
__noinline u64 tok_merge_pair(u32 l, u32 r)
{
	return tok_probe(TOK_H_MERGE, TOK_H_MERGE_MASK, l + 1, r, (u64)TOK_NONE << 32);
}

struct tok_round_walk {
	u32 from, n, best, w, k, stop, left;
};

static __always_inline int tok_lowest_step(struct tok_round_walk *c, u32 j)
{
	TOK_GET(s, tok_scratch(), 1);
	u32 r = TOK_RANK(s, j);

	if (r < c->best)
		c->best = r;
	return 0;
}
TOK_EACH_FN(tok_lowest_step, struct tok_round_walk)

/* Writes the pair (w, right)'s rank and merged id at w; 1 when its rank is below best. */
static __always_inline int tok_pair_at(struct tok_round_walk *c, TOK_V s, u32 w, u32 right)
{
	u64 m = tok_merge_pair(TOK_SYM(s, w), right);

	TOK_RANK(s, w) = m >> 32;
	TOK_MERGED(s, w) = (u32)m;
	return m >> 32 < c->best;
}

/* w: symbols written, k: symbols read (one or two per step). TOK_UNLINK: Linux 7.x's verifier
 * links k + 1 and k + 2 to k (linked scalars, alu32 additions too), so that each comparison of
 * them with n narrows k as well; the walk's states then differ at every step and never converge
 * ("The sequence of 8193 jumps is too complex"). Unlinked, they are values of their own. */
static __always_inline int tok_merge_step(struct tok_round_walk *c, u32 step)
{
	TOK_GET(s, tok_scratch(), 1);
	u32 w = c->w, k = c->k, n = c->n, next = k + 1;

	TOK_UNLINK(next);
	if (k >= n)
		return 1;
	if (!c->stop && next < n && TOK_RANK(s, k) == c->best) {
		TOK_SYM(s, w) = TOK_MERGED(s, k);
		if (c->left && tok_pair_at(c, s, w - 1, TOK_SYM(s, w)))
			c->stop = 1;
		TOK_RANK(s, w) = TOK_NONE;
		next = k + 2;
		TOK_UNLINK(next);
		if (next < n && tok_pair_at(c, s, w, TOK_SYM(s, next)))
			c->stop = 1;
	} else {
		TOK_SYM(s, w) = TOK_SYM(s, k);
		TOK_RANK(s, w) = TOK_RANK(s, k);
		TOK_MERGED(s, w) = TOK_MERGED(s, k);
	}
	c->k = next;
	c->w = w + 1;
	c->left = 1;
	return 0;
}
TOK_EACH_FN(tok_merge_step, struct tok_round_walk)

/* One round of merges of the n symbols: the lowest rank among the pairs, then its pairs merged
 * left to right (the leftmost first, as one merge at a time would) until a merge makes a pair
 * of a lower rank, which the next round takes first. Returns the new count, or -1 if no pair
 * merges. */
TOK_FLAT int tok_bpe_round(u32 n)
{
	struct tok_round_walk c = { .n = n };
	TOK_GET(s, tok_scratch(), -1);

	c.best = tok_opaque(s, TOK_NONE);
	TOK_EACH(tok_lowest_step, &c, tok_opaque(s, 0), n - 1);
	if (c.best == TOK_NONE)
		return -1;
	/* (a flag, not w > 0: a comparison with a constant would make w a constant again) */
	c.w = tok_opaque(s, 0);
	c.k = tok_opaque(s, 0);
	c.stop = tok_opaque(s, 0);
	c.left = tok_opaque(s, 0);
	TOK_EACH(tok_merge_step, &c, tok_opaque(s, 0), n);
	return c.w;
}

struct tok_bpe_walk {
	u64 out;
	u32 from, nb, n, count;
	int err;
};

/* Code point i's UTF-8 bytes appended to the word. */
static __always_inline int tok_bytes_step(struct tok_bpe_walk *c, u32 i)
{
	TOK_GET(s, tok_scratch(), TOK_FAIL(c, TOK_E_TABLES));
	u32 cp = TOK_CP(s, i) & TOK_CP_MASK, nb = c->nb;
	u32 len = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;

	if (len > LIM_TOK_WORD_MAX - nb)
		return TOK_FAIL(c, TOK_E_WORD);
	if (len == 1) {
		TOK_WORD(s, nb) = cp;
	} else if (len == 2) {
		TOK_WORD(s, nb) = 0xc0 | cp >> 6;
		TOK_WORD(s, nb + 1) = 0x80 | (cp & 0x3f);
	} else if (len == 3) {
		TOK_WORD(s, nb) = 0xe0 | cp >> 12;
		TOK_WORD(s, nb + 1) = 0x80 | (cp >> 6 & 0x3f);
		TOK_WORD(s, nb + 2) = 0x80 | (cp & 0x3f);
	} else {
		TOK_WORD(s, nb) = 0xf0 | cp >> 18;
		TOK_WORD(s, nb + 1) = 0x80 | (cp >> 12 & 0x3f);
		TOK_WORD(s, nb + 2) = 0x80 | (cp >> 6 & 0x3f);
		TOK_WORD(s, nb + 3) = 0x80 | (cp & 0x3f);
	}
	c->nb = nb + len;
	return 0;
}
TOK_EACH_FN(tok_bytes_step, struct tok_bpe_walk)

/* One symbol per byte (a byte outside the vocabulary is dropped, as without an unk token). */
static __always_inline int tok_symbol_step(struct tok_bpe_walk *c, u32 k)
{
	TOK_GET(s, tok_scratch(), TOK_FAIL(c, TOK_E_TABLES));
	TOK_GET(w, tok_words(), TOK_FAIL(c, TOK_E_TABLES));
	u32 id = TOK_U32(w, TOK_U32(w, TOK_H_BYTE_ID) + TOK_WORD(s, k));

	if (id != TOK_NONE) {
		TOK_SYM(s, c->n) = id;
		c->n++;
	}
	return 0;
}
TOK_EACH_FN(tok_symbol_step, struct tok_bpe_walk)

/* The rank and merged id of each adjacent pair. */
static __always_inline int tok_pairs_step(struct tok_bpe_walk *c, u32 k)
{
	TOK_GET(s, tok_scratch(), TOK_FAIL(c, TOK_E_TABLES));
	u64 m = tok_merge_pair(TOK_SYM(s, k), TOK_SYM(s, k + 1));

	TOK_RANK(s, k) = m >> 32;
	TOK_MERGED(s, k) = (u32)m;
	return 0;
}
TOK_EACH_FN(tok_pairs_step, struct tok_bpe_walk)

/* A round of merges (at least one merge a round, so at most LIM_TOK_WORD_MAX rounds). */
static __always_inline int tok_rounds_step(struct tok_bpe_walk *c, u32 step)
{
	int r = c->n > 1 ? tok_bpe_round(c->n) : -1;

	if (r < 0)
		return 1;
	c->n = r;
	return 0;
}
TOK_EACH_FN(tok_rounds_step, struct tok_bpe_walk)

static __always_inline int tok_out_step(struct tok_bpe_walk *c, u32 k)
{
	TOK_GET(s, tok_scratch(), TOK_FAIL(c, TOK_E_TABLES));
	TOK_GET(o, tok_vec(c->out, 4), TOK_FAIL(c, TOK_E_TABLES));

	TOK_U32(o, c->count + k) = TOK_SYM(s, k);
	return 0;
}
TOK_EACH_FN(tok_out_step, struct tok_bpe_walk)

/* Stage 6 on the piece of code points [a, b): writes its ids at out[count..]; returns the new
 * count or an error. */
__noinline int tok_bpe(u32 a, u32 b, u64 out, u32 count, u32 max_out)
{
	struct tok_bpe_walk c = { .out = out, .count = count };
	TOK_GET(s, tok_scratch(), TOK_E_TABLES);

	c.nb = tok_opaque(s, 0);
	c.n = tok_opaque(s, 0);
	TOK_EACH(tok_bytes_step, &c, a, b);
	if (!c.err)
		TOK_EACH(tok_symbol_step, &c, tok_opaque(s, 0), c.nb);
	if (!c.err)
		TOK_EACH(tok_pairs_step, &c, tok_opaque(s, 0), c.n - (c.n > 0));
	if (c.err)
		return c.err;
	TOK_EACH(tok_rounds_step, &c, tok_opaque(s, 0), LIM_TOK_WORD_MAX);
	if (c.n > max_out - count)
		return TOK_E_IDS;
	TOK_EACH(tok_out_step, &c, tok_opaque(s, 0), c.n);
	return c.err ? c.err : (int)(count + c.n);
}
