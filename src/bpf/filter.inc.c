// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* The packet filter: the model reads a flow's payload and XDP enforces its verdict.
 *
 * flt_xdp, on the rule's interface, matches IPv4 packets of the rule's protocol (UDP or TCP) to
 * its destination ports from its source prefixes. Each flow (the 5-tuple) has an entry in the
 * LRU table flt_flows:
 *   - a verdict younger than the TTL: the packet gets the label's action (pass, drop, count),
 *     without the model;
 *   - pending (a classification is running): the rule's pending policy (pass, or drop so that
 *     TCP retransmits and the retransmission meets the verdict);
 *   - none: a packet without payload (a TCP handshake, a bare ACK) passes; the first one with a
 *     payload claims a classification slot, copies up to `bytes` bytes of its payload there,
 *     records the flow as pending, starts the slot's workqueue item and gets the pending policy.
 *     With every slot busy it gets the overflow policy, counted, and the flow stays unknown (its
 *     next packet with a payload tries again). The fast path never waits for the model.
 * IPv4 fragments (whose ports are in the first fragment only): the first, which carries them,
 * gets its flow's verdict (UDP; for TCP a drop verdict only, since a fragment's bytes cannot be
 * checked) or else the pending policy, and what it got is remembered by datagram (flt_frags),
 * so that the later fragments get the same; a later fragment whose first was not seen gets the
 * pending policy. Fragments of other ports pass. All counted.
 *
 * The worker (flt_work, process context) runs flt_step until the classification is over, one
 * gen_run segment per round (each within the generation's time budget), requeueing itself:
 *   1. the text: the payload's first `bytes` bytes, cut at the first CR or LF (first_line), cut
 *      to its longest valid UTF-8 prefix; tokenized (tokenize.inc.c) after the prefix, the
 *      suffix's tokens (tokenized at install) appended;
 *   2. those tokens fed from position prefix_len: the prefix's KV was computed once, at install,
 *      in every slot's context, and is never overwritten (positions only grow from there);
 *   3. each label's log-probability: its first token's from the logits after the prompt, each
 *      later token's after feeding the label's earlier tokens (flt_lse, the twin of
 *      src/num/classify.rs); the best label, or the fallback when the margin or the threshold is
 *      not met;
 *   4. the verdict into flt_flows, the counters, a record in the flt_log ring buffer.
 * The `filter_classify` program runs the same steps on a payload given in its ctx (the
 * classifier's in-kernel path, and the tests). */
#pragma once

#define FLT_SLOTS_MAX EV_SLOTS_MAX
#define FLT_BYTES_MAX LIM_FILTER_BYTES_MAX /* payload bytes one classification reads */
#define FLT_LABELS_MAX LIM_FILTER_LABELS_MAX
#define FLT_LABEL_TOKENS_MAX LIM_FILTER_LABEL_TOKENS_MAX
#define FLT_PORTS_MAX LIM_FILTER_PORTS_MAX
#define FLT_SOURCES_MAX LIM_FILTER_SOURCES_MAX
#define FLT_SUFFIX_MAX 512       /* tokens of the template after the payload */
#define FLT_STEPS_MAX 32         /* label steps: at least FLT_LABELS_MAX * (FLT_LABEL_TOKENS_MAX - 1),
				  * a power of two */
#define FLT_FLOWS 65536          /* entries of the flow table (LRU) */
#define FLT_FRAGS 4096           /* fragmented datagrams remembered (LRU) */
#define FLT_NAME_MAX 32          /* bytes of a label's name */
#define FLT_EXCERPT 64           /* payload bytes a verdict record carries */
#define LN2_Q16 45426            /* ln 2 in Q16, rounded */
#define FLT_LSE_NONE ((s64)(1ULL << 63)) /* flt_lse: a pass was cut short */

#define FLT_PASS 0               /* actions (a label's) and policies (pending, overflow) */
#define FLT_DROP 1
#define FLT_COUNT 2              /* pass, counted under the label */

#define FLT_PENDING 1            /* flow states */
#define FLT_JUDGED 2
#define FLT_OPEN 3               /* TCP: the handshake was seen; the text is being read */
#define FLT_SYN 1                /* handshake states (flt_syns) */
#define FLT_SYNACK 2
#define FLT_ACCUM 5              /* a slot's state: holding a TCP flow's text as it arrives */
#define FLT_NO_SLOT 0xffffffff
#define FLT_SEG_MAX 16384        /* bytes of a TCP segment (header and payload) whose checksum
				  * is verified; a power of two */
#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_PSH 0x08
#define TCP_ACK 0x10

#define FLT_PH_TEXT 0            /* worker phases */
#define FLT_PH_PROMPT 1
#define FLT_PH_LABELS 2
#define FLT_PH_DONE 3
#define FLT_MORE 1               /* flt_step: call again */
#define FLT_E_TOKENIZE (-20)     /* the text did not tokenize (detail in tok_result) */
#define FLT_E_ARGS (-21)

struct flt_label {
	u32 n;                          /* tokens, 1..FLT_LABEL_TOKENS_MAX */
	u32 action;                     /* FLT_PASS, FLT_DROP or FLT_COUNT */
	u32 tokens[FLT_LABEL_TOKENS_MAX];
};

/* The rule, as user space compiled it (src/run/filter): written through the mapped .bss. */
struct flt_config {
	u32 ifindex, proto;             /* the interface; IPPROTO_UDP or IPPROTO_TCP */
	u32 n_ports, n_sources;         /* n_sources 0: every source */
	u32 ports[FLT_PORTS_MAX];       /* destination ports, host order */
	u32 src_net[FLT_SOURCES_MAX];   /* IPv4 prefixes: address & mask == net (network order) */
	u32 src_mask[FLT_SOURCES_MAX];
	u32 bytes, first_line;          /* the text read: at most `bytes`, cut at the first line */
	u32 n_labels, fallback;
	u32 pending, overflow;          /* FLT_PASS or FLT_DROP */
	u32 n_slots, prefix_len;        /* classification slots; the prefix's tokens (its KV) */
	u32 n_suffix, has_threshold;
	s64 margin_q16, threshold_q16;
	u64 ttl_ns, pending_ns;         /* a verdict's life; a pending entry's */
	u64 tok_text;                   /* the tokenizer's text buffer (arena) */
	u32 max_text_tokens;            /* the most tokens the text may take (checked at install:
					 * FLT_BYTES_MAX bytes never take more) */
	u32 vocab;
	u32 per_source;                 /* TCP: slots one source address may hold (0: any) */
	u64 hash_key[2];                /* TCP: the key of the held segments' hashes (getrandom) */
	struct flt_label labels[FLT_LABELS_MAX];
	u32 n_steps;                    /* label steps: label << 8 | token, every token after a
					 * label's first, label by label */
	u32 steps[FLT_STEPS_MAX];
	u32 suffix[FLT_SUFFIX_MAX];
	char names[FLT_LABELS_MAX][FLT_NAME_MAX]; /* the labels' names, for `filter status` */
};
struct flt_config flt_cfg;

/* Counters (.bss). flt_packets: packets the rule matched; each ends in one of: a verdict's
 * action (flt_label_packets), the pending policy (flt_pending_packets), the overflow policy
 * (flt_overflow), passed without payload and verdict (flt_bare). */
u64 flt_packets, flt_bare, flt_pending_packets, flt_overflow, flt_fragments, flt_dropped;
/* classifications started, judged, failed (the flow is forgotten: its next packet retries);
 * verdict records the ring buffer had no room for */
u64 flt_started, flt_judged, flt_errors, flt_log_lost;
u64 flt_label_flows[FLT_LABELS_MAX], flt_label_packets[FLT_LABELS_MAX];
/* TCP: segments with a payload on a flow whose handshake was not seen (the pending policy);
 * out of order (dropped: TCP sends them again); with a bad checksum (dropped, never read);
 * new flows refused a slot because their source held per_source (the overflow policy);
 * retransmissions of a held segment with other bytes than were judged (dropped); slots taken
 * back from a flow whose text stopped arriving for pending_ns (its segments then meet the
 * overflow policy) */
u64 flt_untracked, flt_out_of_order, flt_bad_checksum, flt_source_busy, flt_mismatch,
	flt_reclaimed;

struct flt_key {
	u32 saddr, daddr;               /* network order */
	u16 sport, dport;               /* network order */
	u32 proto;
};

struct flt_flow {
	u64 time_ns;                    /* the verdict's, or the classification's start */
	s64 score;                      /* the label's log-probability, Q16 */
	u32 label;
	u32 state;                      /* FLT_PENDING, FLT_JUDGED, or FLT_OPEN (TCP) */
	/* TCP only; sequence numbers in host order */
	u32 isn;                        /* the client's initial sequence number: the text starts
					 * at isn + 1 */
	u32 acc;                        /* the text's bytes read so far */
	u32 slot;                       /* the slot that holds them, FLT_NO_SLOT before the first */
	u32 complete;                   /* the text is whole (`bytes` read, or its line ended) */
	u32 held_lo, held_hi;           /* the last judged segment's new bytes (sequence range) */
	u64 held_hash;                  /* their keyed hash: a retransmission must carry them */
};

/* A fragmented datagram (IPv4's identification is per source, destination and protocol) and
 * what its first fragment met: a label (< FLT_LABELS_MAX), FLT_FRAG_PENDING or FLT_FRAG_OTHER. */
struct flt_frag_key {
	u32 saddr, daddr;               /* network order */
	u16 id, pad;
	u32 proto;
};

#define FLT_FRAG_PENDING FLT_LABELS_MAX          /* no verdict: the pending policy */
#define FLT_FRAG_OTHER (FLT_LABELS_MAX + 1)      /* not the rule's port: passes */

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, FLT_FRAGS);
	__type(key, struct flt_frag_key);
	__type(value, u32);
} flt_frags SEC(".maps");

/* A TCP handshake under way (a table apart, so that a flood of SYNs, spoofed or not, evicts
 * only other handshakes, never a flow being read or judged). */
struct flt_syn {
	u32 state;                      /* FLT_SYN, FLT_SYNACK */
	u32 isn, srv_isn;
	u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, FLT_FLOWS);
	__type(key, struct flt_key);
	__type(value, struct flt_syn);
} flt_syns SEC(".maps");

/* A TCP segment, loaded to verify its checksum and hash what it carries (per CPU). */
struct flt_seg {
	u8 b[FLT_SEG_MAX];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct flt_seg);
} flt_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, FLT_FLOWS);
	__type(key, struct flt_key);
	__type(value, struct flt_flow);
} flt_flows SEC(".maps");

/* A classification's state: scalars only (global functions take it). */
struct flt_work {
	u32 phase;
	u32 running;                    /* a gen_run segment is under way (it returned GEN_MORE) */
	u32 n_payload;
	u32 n_text;                     /* bytes of the text, once cut */
	u32 n_prompt;                   /* text + suffix tokens */
	s32 tok_result;                 /* tokenize's count, or TOK_E_* */
	u32 step;                       /* the next label step (flt_cfg.steps) */
	u32 label, token;               /* the label step under way: label, its token index */
	u32 chosen;
	s32 err;
	s64 scores[FLT_LABELS_MAX];     /* Q16 log-probabilities */
	struct gen_args args;           /* the slot's context (ev_template), per segment */
	u8 payload[FLT_BYTES_MAX];
};

struct flt_slot {
	struct bpf_wq wq;
	u32 state;                      /* EV_FREE, EV_CLAIMED, EV_BUSY */
	u32 slot;
	struct flt_key key;
	u64 t0;                         /* when the packet arrived (TCP: the last one read) */
	u32 tcp;                        /* a TCP flow's: its verdict updates its flt_flows entry */
	u32 pad;
	struct flt_work w;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FLT_SLOTS_MAX);
	__type(key, u32);
	__type(value, struct flt_slot);
} flt_slots SEC(".maps");

/* One verdict, as the log carries it. */
struct flt_record {
	struct flt_key key;
	u32 label;
	u32 n_text;                     /* the text's bytes (excerpt: the first FLT_EXCERPT) */
	s64 score;
	u64 elapsed_ns;                 /* from the packet to the verdict */
	u8 excerpt[FLT_EXCERPT];
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 18);
} flt_log SEC(".maps");

/* ln(s / 2^30) in Q16 for s >= 2^30: log2 bit by bit (squaring), times ln 2. */
static __always_inline s64 flt_ln_q16(u64 s)
{
	u64 y;
	s64 k = 63, f = 0;

	for (int i = 0; i < 64 && !(s >> k); i++)
		k--;
	y = k >= 30 ? s >> (k - 30) : s << (30 - k);
	for (int i = 0; i < 16; i++) {
		y = (y * y) >> 30;
		f <<= 1;
		if (y >= (1ULL << 31)) {
			y >>= 1;
			f |= 1;
		}
	}
	return ((((k - 30) << 16) + f) * LN2_Q16) >> 16;
}

/* The largest of the n logits; LLONG_MIN when the loop was cut short. A global function (as
 * the sampler's passes): its loop has its own can_loop budget, and its result is not tracked
 * into the caller's loop. */
__noinline s64 flt_max(u64 logits, u32 n)
{
	const s32 __arena *z = ARENA_PTR(const s32, logits);
	s64 m = -ACT_MAX - 1;
	u32 i;

	for (i = 0; i < n && can_loop; i++)
		if (z[i] > m)
			m = z[i];
	return i < n ? FLT_LSE_NONE : m;
}

/* sum_i exp(-(m - z_i)) in Q30 by exp_neg (fixed.h, the sampler's table); 0 when cut short. */
__noinline u64 flt_sum(u64 logits, u32 n, s64 m, u64 exp2)
{
	const s32 __arena *z = ARENA_PTR(const s32, logits);
	const u32 __arena *tab = ARENA_PTR(const u32, exp2);
	u64 s = 0, d;
	u32 i;

	for (i = 0; i < n && can_loop; i++) {
		d = (u64)(m - z[i]);
		s += exp_neg(d > ACT_MAX ? ACT_MAX : d, tab);
	}
	return i < n ? 0 : s;
}

/* The log of the softmax's denominator, Q16: m + ln(sum_i exp(-(m - z_i))); FLT_LSE_NONE when
 * a pass was cut short (never expected: n <= LIM_VOCAB_MAX). A global function: verified once. */
__noinline s64 flt_lse(u64 logits, u32 n, u64 exp2)
{
	s64 m = flt_max(logits, n);
	u64 s;

	if (m == FLT_LSE_NONE)
		return FLT_LSE_NONE;
	s = flt_sum(logits, n, m, exp2);
	if (s < (1ULL << 30))
		return FLT_LSE_NONE;
	return m + flt_ln_q16(s);
}

/* The payload's text: its first `bytes` bytes, cut at the first CR or LF when first_line, then
 * to its longest valid UTF-8 prefix (RFC 3629, as ev_utf8). The twin of payload_text in
 * src/run/filter. */
__noinline u32 flt_text(struct flt_work *w __arg_nonnull)
{
	u32 n = w->n_payload, good = 0, need = 0, lo = 0x80, hi = 0xbf;

	if (n > flt_cfg.bytes)
		n = flt_cfg.bytes;
	if (n > FLT_BYTES_MAX)
		n = FLT_BYTES_MAX;
	FOR(i, 0, n) {
		u8 c = w->payload[i & (FLT_BYTES_MAX - 1)];

		if (flt_cfg.first_line && !need && (c == '\r' || c == '\n'))
			break;
		if (need) {
			if (c < lo || c > hi)
				break;
			need--, lo = 0x80, hi = 0xbf;
		} else if (c < 0x80) {
		} else if (c >= 0xc2 && c <= 0xdf) {
			need = 1;
		} else if (c >= 0xe0 && c <= 0xef) {
			need = 2;
			lo = c == 0xe0 ? 0xa0 : 0x80;
			hi = c == 0xed ? 0x9f : 0xbf;
		} else if (c >= 0xf0 && c <= 0xf4) {
			need = 3;
			lo = c == 0xf0 ? 0x90 : 0x80;
			hi = c == 0xf4 ? 0x8f : 0xbf;
		} else {
			break;
		}
		if (!need)
			good = i + 1;
	}
	return good;
}

/* Step 1: the text tokenized into the context's prompt, the suffix appended. */
static __always_inline int flt_tokenize(struct flt_work *w)
{
	u8 __arena *t = ARENA_PTR(u8, flt_cfg.tok_text);
	u32 __arena *p = ARENA_PTR(u32, w->args.prompt);
	u32 n = flt_text(w), ns = flt_cfg.n_suffix;
	int r;

	if (!flt_cfg.tok_text || ns == 0 || ns > FLT_SUFFIX_MAX)
		return FLT_E_ARGS;
	w->n_text = n;
	FOR(i, 0, n)
		t[i] = w->payload[i & (FLT_BYTES_MAX - 1)];
	r = tokenize(flt_cfg.tok_text, n, w->args.prompt, flt_cfg.max_text_tokens);
	w->tok_result = r;
	if (r < 0)
		return FLT_E_TOKENIZE;
	FOR(i, 0, ns)
		p[r + i] = flt_cfg.suffix[i & (FLT_SUFFIX_MAX - 1)];
	w->n_prompt = r + ns;
	return 0;
}

/* Starts a gen_run segment: `n` tokens of the context's prompt fed from position `pos`, the
 * head's logits after the last (one token "generated": the argmax, ignored). */
static __always_inline void flt_feed(struct flt_work *w, u32 n, u32 pos)
{
	struct gen_args *a = &w->args;

	a->run.pos = pos;
	a->n_prompt = n;
	a->fed = 0;
	a->generated = 0;
	a->max_new = 1;
	a->n_stops = 0;
	a->quiet = 1;
	a->text = 0;
	a->sampling = 0;
	w->running = 1;
}

/* Label l's token t's log-probability under the logits just computed (lse: their
 * flt_lse), added to its score. */
static __always_inline int flt_score(struct flt_work *w, u32 l, u32 t, s64 lse)
{
	const s32 __arena *z = ARENA_PTR(const s32, w->args.sample.logits);
	u32 tok;

	if (l >= FLT_LABELS_MAX || t >= FLT_LABEL_TOKENS_MAX)
		return FLT_E_ARGS;
	tok = flt_cfg.labels[l].tokens[t];
	if (tok >= flt_cfg.vocab)
		return FLT_E_ARGS;
	w->scores[l] += (s64)z[tok] - lse;
	return 0;
}

/* The label chosen from the scores (src/num/classify.rs: decide). A global function: its
 * loops are verified once, not once per state of flt_step. */
__noinline u32 flt_decide(struct flt_work *w __arg_nonnull)
{
	u32 n = flt_cfg.n_labels, best = 0;
	s64 top, second = -(1LL << 62);

	for (u32 l = 1; l < FLT_LABELS_MAX; l++)
		if (l < n && w->scores[l] > w->scores[best & (FLT_LABELS_MAX - 1)])
			best = l;
	top = w->scores[best & (FLT_LABELS_MAX - 1)];
	for (u32 l = 0; l < FLT_LABELS_MAX; l++)
		if (l < n && l != best && w->scores[l] > second)
			second = w->scores[l];
	if ((flt_cfg.margin_q16 > 0 && top - second < flt_cfg.margin_q16) ||
	    (flt_cfg.has_threshold && top < flt_cfg.threshold_q16))
		return flt_cfg.fallback;
	return best;
}

/* Starts the next label step, if one is left: (label, token) from the rule's step list (every
 * label token after a label's first, in order), with the label's tokens before it fed after
 * the prompt. 1 when a segment was started, 0 when none is left. */
__noinline int flt_next(struct flt_work *w __arg_nonnull)
{
	u32 __arena *p = ARENA_PTR(u32, w->args.prompt);
	u32 i = w->step, st, l, t;

	if (i >= flt_cfg.n_steps || i >= FLT_STEPS_MAX)
		return 0;
	st = flt_cfg.steps[i & (FLT_STEPS_MAX - 1)];
	l = (st >> 8) & (FLT_LABELS_MAX - 1);
	t = st & 0xff;
	if (t == 0 || t >= FLT_LABEL_TOKENS_MAX)
		return 0;
	w->step = i + 1;
	w->label = l;
	w->token = t;
	/* the label's first tokens; only t of them are fed */
	for (u32 j = 0; j < FLT_LABEL_TOKENS_MAX; j++)
		p[j] = flt_cfg.labels[l].tokens[j];
	flt_feed(w, t, flt_cfg.prefix_len + w->n_prompt);
	return 1;
}

/* The steps between gen_run segments (see the top): FLT_MORE when a segment is to run, 0 once
 * w->chosen is the verdict, or a negative error. Its callers run the segments (flt_round): the
 * tokenizer's and the plan's calls nest deep, and BPF allows 8 frames. */
__noinline int flt_step(struct flt_work *w __arg_nonnull)
{
	s64 lse;
	int r;

	USE_ARENA(arena);
	switch (w->phase) {
	case FLT_PH_TEXT:
		r = flt_tokenize(w);
		if (r)
			return r;
		flt_feed(w, w->n_prompt, flt_cfg.prefix_len);
		w->phase = FLT_PH_PROMPT;
		return FLT_MORE;
	case FLT_PH_PROMPT:
		/* every label's first token from the prompt's logits */
		lse = flt_lse(w->args.sample.logits, flt_cfg.vocab, w->args.sample.exp2);
		if (lse == FLT_LSE_NONE)
			return FLT_E_ARGS;
		for (u32 l = 0; l < FLT_LABELS_MAX; l++) {
			if (l >= flt_cfg.n_labels)
				break;
			w->scores[l] = 0;
			r = flt_score(w, l, 0, lse);
			if (r)
				return r;
		}
		w->step = 0;
		w->phase = FLT_PH_LABELS;
		break;
	case FLT_PH_LABELS:
		lse = flt_lse(w->args.sample.logits, flt_cfg.vocab, w->args.sample.exp2);
		if (lse == FLT_LSE_NONE)
			return FLT_E_ARGS;
		r = flt_score(w, w->label, w->token, lse);
		if (r)
			return r;
		break;
	default:
		return FLT_E_ARGS;
	}
	if (flt_next(w))
		return FLT_MORE;
	w->chosen = flt_decide(w);
	w->phase = FLT_PH_DONE;
	return 0;
}

/* One round of a classification: the gen_run segment under way, else the next steps. */
static __always_inline int flt_round(struct flt_work *w)
{
	int r;

	if (w->running) {
		r = gen_run(&w->args);
		if (r)
			return r;
		if (w->args.status == GEN_MORE)
			return FLT_MORE;
		if (w->args.status != GEN_MAX)
			return FLT_E_ARGS; /* the context filled up: checked at install */
		w->running = 0;
		return FLT_MORE;
	}
	return flt_step(w);
}

/* A slot's classification set up from its template, for a payload already in w->payload. */
static __always_inline void flt_begin(struct flt_work *w, u32 slot)
{
	w->args = ev_template[slot & (EV_SLOTS_MAX - 1)];
	w->phase = FLT_PH_TEXT;
	w->running = 0;
	w->n_text = 0;
	w->n_prompt = 0;
	w->tok_result = 0;
	w->err = 0;
	w->chosen = 0;
}

/* A TCP flow's verdict into its flt_flows entry: final when the label drops or the text is
 * whole; otherwise the flow reads on (FLT_OPEN) and is judged again, on all of its text, at its
 * next end of a write. The slot's next state: EV_FREE, or FLT_ACCUM while the flow reads on. */
static __always_inline u32 flt_publish_tcp(struct flt_slot *s, u32 l, u64 now)
{
	struct flt_flow *f = bpf_map_lookup_elem(&flt_flows, &s->key);

	if (!f)
		return EV_FREE; /* evicted: its next segment is untracked */
	f->label = l;
	f->score = s->w.scores[l];
	f->time_ns = now;
	if (flt_cfg.labels[l].action == FLT_DROP || f->complete) {
		f->slot = FLT_NO_SLOT;
		__sync_lock_test_and_set(&f->state, FLT_JUDGED);
		return EV_FREE;
	}
	s->t0 = now;
	__sync_lock_test_and_set(&f->state, FLT_OPEN);
	return FLT_ACCUM;
}

/* The verdict published: the flow's entry, the counters, a log record. The slot's next state. */
static __noinline u32 flt_publish(struct flt_slot *s)
{
	struct flt_work *w = &s->w;
	u32 l = w->chosen & (FLT_LABELS_MAX - 1), next = EV_FREE;
	u64 t0 = s->t0;
	struct flt_flow f = {
		.time_ns = bpf_ktime_get_ns(), .score = w->scores[l], .label = l, .state = FLT_JUDGED,
	};
	struct flt_record *r;

	if (s->tcp)
		next = flt_publish_tcp(s, l, f.time_ns);
	else
		bpf_map_update_elem(&flt_flows, &s->key, &f, BPF_ANY);
	__sync_fetch_and_add(&flt_label_flows[l], 1);
	__sync_fetch_and_add(&flt_judged, 1);
	r = bpf_ringbuf_reserve(&flt_log, sizeof(*r), 0);
	if (!r) {
		__sync_fetch_and_add(&flt_log_lost, 1);
		return next;
	}
	r->key = s->key;
	r->label = l;
	r->n_text = w->n_text;
	r->score = w->scores[l];
	r->elapsed_ns = f.time_ns - t0;
	/* the text's first bytes; none of an earlier flow's past its end */
	__builtin_memcpy(r->excerpt, w->payload, FLT_EXCERPT);
	FOR(i, w->n_text, FLT_EXCERPT)
		r->excerpt[i & (FLT_EXCERPT - 1)] = 0;
	bpf_ringbuf_submit(r, 0);
	return next;
}

/* The workqueue callback: one round of the slot's classification. */
static int flt_work(void *map, int *key, void *value)
{
	struct flt_slot *s = value;
	int r, tok;

	USE_ARENA(arena);
	/* one text at a time in the tokenizer's buffers (shared with the event path) */
	tok = s->w.phase == FLT_PH_TEXT && !s->w.running;
	if (tok && __sync_val_compare_and_swap(&ev_tok_busy, 0, 1) != 0) {
		bpf_wq_start(&s->wq, 0);
		return 0;
	}
	r = flt_round(&s->w);
	if (tok)
		__sync_lock_test_and_set(&ev_tok_busy, 0);
	if (r == FLT_MORE) {
		bpf_wq_start(&s->wq, 0);
		return 0;
	}
	if (r == 0) {
		__sync_lock_test_and_set(&s->state, flt_publish(s));
		return 0;
	} else {
		/* forgotten: the flow's next packet with a payload tries again */
		s->w.err = r;
		bpf_map_delete_elem(&flt_flows, &s->key);
		__sync_fetch_and_add(&flt_errors, 1);
	}
	__sync_lock_test_and_set(&s->state, EV_FREE);
	return 0;
}

/* Initialises every classification slot's workqueue item with flt_work; run once. */
SEC("syscall")
int flt_setup(void *ctx)
{
	int err;

	for (u32 i = 0; i < FLT_SLOTS_MAX; i++) {
		u32 k = i;
		struct flt_slot *s = bpf_map_lookup_elem(&flt_slots, &k);

		if (!s)
			return 1;
		s->slot = i;
		err = bpf_wq_init(&s->wq, &flt_slots, 0);
		if (err)
			return 2 << 16 | (-err & 0xffff);
		err = qb_wq_set_callback(&s->wq, flt_work);
		if (err)
			return 3 << 16 | (-err & 0xffff);
	}
	return 0;
}

/* The ctx of filter_classify: one payload classified in a slot, in the caller's thread. The
 * first call (resume 0) claims the slot; the caller calls again with resume 1 while status is
 * FLT_MORE. */
struct flt_run_args {
	u32 slot, resume;
	u32 n_payload;
	s32 status;                     /* out: FLT_MORE, 0 (done) or an error */
	u32 chosen, n_text, n_prompt;
	s32 tok_result;
	s64 scores[FLT_LABELS_MAX];
	u8 payload[FLT_BYTES_MAX];
};

SEC("syscall")
int filter_classify(struct flt_run_args *a)
{
	u32 k = a->slot;
	struct flt_slot *s;
	int r, tok;

	if (k >= FLT_SLOTS_MAX || k >= flt_cfg.n_slots || a->n_payload > FLT_BYTES_MAX)
		return 1;
	s = bpf_map_lookup_elem(&flt_slots, &k);
	if (!s)
		return 1;
	if (!a->resume) {
		if (__sync_val_compare_and_swap(&s->state, EV_FREE, EV_BUSY) != EV_FREE)
			return 2; /* the slot is classifying a flow */
		flt_begin(&s->w, k);
		s->w.n_payload = a->n_payload;
		/* constant offsets: the verifier refuses a ctx access at a variable one */
		__builtin_memcpy(s->w.payload, a->payload, FLT_BYTES_MAX);
	} else if (*(volatile u32 *)&s->state != EV_BUSY) {
		return 3;
	}
	tok = s->w.phase == FLT_PH_TEXT && !s->w.running;
	if (tok && __sync_val_compare_and_swap(&ev_tok_busy, 0, 1) != 0) {
		a->status = FLT_MORE; /* a worker has the tokenizer: call again */
		return 0;
	}
	r = flt_round(&s->w);
	if (tok)
		__sync_lock_test_and_set(&ev_tok_busy, 0);
	a->status = r;
	if (r == FLT_MORE)
		return 0;
	a->chosen = s->w.chosen;
	a->n_text = s->w.n_text;
	a->n_prompt = s->w.n_prompt;
	a->tok_result = s->w.tok_result;
	for (u32 l = 0; l < FLT_LABELS_MAX; l++)
		a->scores[l] = s->w.scores[l];
	__sync_lock_test_and_set(&s->state, EV_FREE);
	return 0;
}

/* The rule's policy `p` for a packet: XDP_PASS or XDP_DROP (counted). */
static __always_inline int flt_policy(u32 p)
{
	if (p == FLT_DROP) {
		__sync_fetch_and_add(&flt_dropped, 1);
		return XDP_DROP;
	}
	return XDP_PASS;
}

/* Claims a classification slot (EV_CLAIMED): a free one, or one holding a TCP flow's text that
 * arrived no byte for pending_ns (taken back, counted; the flow's later segments meet the
 * overflow policy). Its index, or FLT_NO_SLOT when every slot is busy. */
static __noinline u32 flt_take_slot(u64 now)
{
	for (u32 i = 0; i < FLT_SLOTS_MAX; i++) {
		u32 k = i;
		struct flt_slot *c = bpf_map_lookup_elem(&flt_slots, &k);

		if (!c || i >= flt_cfg.n_slots)
			break;
		if (__sync_val_compare_and_swap(&c->state, EV_FREE, EV_CLAIMED) == EV_FREE)
			return i;
		if (*(volatile u32 *)&c->state == FLT_ACCUM &&
		    now - *(volatile u64 *)&c->t0 > flt_cfg.pending_ns &&
		    __sync_val_compare_and_swap(&c->state, FLT_ACCUM, EV_CLAIMED) == FLT_ACCUM) {
			__sync_fetch_and_add(&flt_reclaimed, 1);
			return i;
		}
	}
	return FLT_NO_SLOT;
}

/* A new flow's first packet with a payload: a slot claimed, the payload copied, the flow
 * pending, the worker started. The packet's verdict: the pending policy, or the overflow
 * policy when no slot is free. */
static __noinline int flt_start(struct xdp_md *ctx, const struct flt_key *key, u32 off, u32 len)
{
	struct flt_flow f = { .state = FLT_PENDING };
	u32 slot = flt_take_slot(bpf_ktime_get_ns()), n;
	struct flt_slot *s = slot == FLT_NO_SLOT ? 0 : bpf_map_lookup_elem(&flt_slots, &slot);

	if (!s) {
		__sync_fetch_and_add(&flt_overflow, 1);
		return flt_policy(flt_cfg.overflow);
	}
	n = len < flt_cfg.bytes ? len : flt_cfg.bytes;
	if (bpf_xdp_load_bytes(ctx, off, s->w.payload, n = QB_LEN(n, FLT_BYTES_MAX, no_payload))) {
no_payload:
		__sync_lock_test_and_set(&s->state, EV_FREE);
		__sync_fetch_and_add(&flt_errors, 1);
		return flt_policy(flt_cfg.pending);
	}
	flt_begin(&s->w, slot);
	s->w.n_payload = n;
	s->key = *key;
	s->tcp = 0;
	s->t0 = bpf_ktime_get_ns();
	f.time_ns = s->t0;
	bpf_map_update_elem(&flt_flows, key, &f, BPF_ANY);
	__sync_lock_test_and_set(&s->state, EV_BUSY);
	if (bpf_wq_start(&s->wq, 0)) {
		bpf_map_delete_elem(&flt_flows, key);
		__sync_lock_test_and_set(&s->state, EV_FREE);
		__sync_fetch_and_add(&flt_errors, 1);
		return flt_policy(flt_cfg.pending);
	}
	__sync_fetch_and_add(&flt_started, 1);
	__sync_fetch_and_add(&flt_pending_packets, 1);
	return flt_policy(flt_cfg.pending);
}
