// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* A kernel event starts a generation: an XDP program on the served interface takes UDP
 * datagrams to the served port, validates them, claims a free request slot and starts the slot's
 * BPF workqueue item; the workqueue callback (process context, where BPF may run long) runs the
 * generation of generate.inc.c for up to its time budget on the slot's own context (KV cache,
 * scratch, plan), then queues itself again until the generation ends, and frees the slot. Tokens
 * and the outcome go to the `tokens` ring buffer. No system call drives any of it.
 *
 * Request datagram (little-endian u32s): magic EV_MAGIC, request id, max new tokens, n, then n
 * token ids. Every field is checked here (sizes, ids below the vocabulary, limits); a datagram
 * from a source not configured, or to another port, is passed on untouched. A valid request
 * finding every slot busy is refused: a ring-buffer record says so and it is counted, as are
 * malformed ones, so that every datagram to the port is answered or counted.
 *
 * Slots run on the CPU whose workqueue they were queued on (the CPU that received the datagram),
 * so requests sent from different CPUs are served at once.
 *
 * With EV_F_REPLY (an installed model: src/run/serve.rs) the program answers every datagram to
 * the port itself: it rewrites the received frame into the reply (Ethernet addresses, IPv4
 * addresses and UDP ports swapped, lengths set, the IPv4 checksum recomputed, UDP checksum 0)
 * and sends it back with XDP_TX. A request is answered ACCEPTED or REFUSED (with a reason); a
 * POLL datagram from the address and port that made a request gets the request's text bytes
 * since an offset, which the workqueue generation appends to the slot's text buffer in the arena,
 * and once the generation is over its FINAL record. A slot whose client has not polled for
 * ev_cfg.timeout_ns is given back: by its worker while it runs, by the next request looking for a
 * slot once it has finished (a finished slot whose FINAL record was sent is free to take at once).
 * The wire format is in docs/in-kernel.md.
 *
 * A reply is never longer than the frame it answers (a poll is padded to the room its client
 * wants for text): a datagram too short for its reply (a REFUSED one to a few bytes) gets none,
 * counted in ev_unanswered. So the server cannot amplify what a spoofed source sends. The lengths
 * are measured on the frame: its UDP length, IPv4 total length and size must agree, or the
 * datagram is dropped unanswered. Fragments and datagrams to an address not the interface's
 * pass to the stack untouched. Each source address holds at most ev_cfg.per_source slots at
 * once (refused EV_R_SOURCE past it), and its requests (not its polls) are rate limited (a token
 * bucket per source in an LRU map): over the rate they are dropped unanswered and counted, so one
 * served source cannot keep the others out. (Frames grown with bpf_xdp_adjust_tail were also lost, every other
 * one, after XDP_TX on a veth in native mode, Linux 6.18.)
 *
 * This file holds the slots, the workqueue and ev_setup; event_xdp.inc.c the XDP side. */
#pragma once

#define EV_SLOTS_MAX PLAN_THREADS_MAX
#define EV_PROMPT_MAX 1024      /* prompt tokens one datagram may carry */
#define EV_MAGIC 0x46504251     /* "QBPF": a request of token ids, greedy */
#define EV_TEXT_MAGIC 0x54504251 /* "QBPT": a request of UTF-8 text, with sampling parameters */
#define EV_TEXT_IN_MAX 4096     /* text bytes one request may carry */
#define EV_TF_CHAT 1            /* QBPT flags: wrap the text in the chat template */
#define EV_SOURCES_MAX 4
#define EV_DESTS_MAX 8          /* the interface's IPv4 addresses served */
#define EV_FREE 0
#define EV_BUSY 1     /* generating */
#define EV_DONE 2     /* finished, its text and outcome kept for polls (EV_F_REPLY) */
#define EV_CLAIMED 3  /* being set up by the XDP program that claimed it */

/* Record kinds (struct gen_token's kind) and refusal reasons (its id). */
#define REC_TOKEN 0
#define REC_DONE 1    /* id: the GEN_* status, or a negative plan error */
#define REC_REFUSED 2 /* id: EV_R_* */
#define EV_R_BUSY 1
#define EV_R_MALFORMED 2
#define EV_R_TOKEN 3  /* a token id at or past the vocabulary */
#define EV_R_LIMIT 4  /* too many prompt tokens or new tokens */
#define EV_R_UNKNOWN 5 /* a poll for no request this address and port made (or one given back) */
#define EV_R_OFFSET 6 /* a poll past the text generated so far */
#define EV_R_UTF8 7   /* a text request whose text is not UTF-8 */
#define EV_R_SOURCE 8 /* its source address holds its share of the slots (ev_cfg.per_source) */
#define EV_REASONS 16
#define EV_RATE_SOURCES 64      /* sources the rate limiter remembers (an LRU map) */

/* Replies (EV_F_REPLY): little-endian u32 words, then text bytes; docs/in-kernel.md. */
#define EV_POLL_MAGIC 0x4C504251  /* "QBPL": a poll datagram */
#define EV_REPLY_MAGIC 0x52504251 /* "QBPR": every reply */
#define EV_K_ACCEPTED 1
#define EV_K_REFUSED 2
#define EV_K_TEXT 3
#define EV_K_FINAL 4
#define EV_TEXT_REPLY_MAX 1024    /* text bytes one reply carries */
#define EV_POLL_MIN 32            /* a poll's least payload: room for the FINAL record */
#define EV_FIN_STOP 1             /* FINAL's finish: a stop token (detail: its id) */
#define EV_FIN_MAX_TOKENS 2       /* max_new tokens */
#define EV_FIN_CONTEXT 3          /* the context is full */
#define EV_FIN_LENGTH 4           /* the slot's text buffer is full */
#define EV_FIN_ERROR 5            /* the kernel failed it (detail: the error code) */
#define EV_FIN_PROMPT 6           /* a text did not become a prompt (detail: TOK_E_*, or 0: empty) */
#define GEN_PROMPT 0x100          /* the slot's finish for EV_FIN_PROMPT (no GEN_* status) */

/* ev_config.flags */
#define EV_F_RING 1  /* ring-buffer records for a reader (Model::serve_events) */
#define EV_F_REPLY 2 /* answer with XDP_TX; keep each slot's text for polls */

/* What is served; written by user space through the mapped .bss before attaching. */
struct ev_config {
	u32 port;        /* UDP destination port, host order */
	u32 ifindex;     /* the interface the program is attached to */
	u32 n_sources;
	u32 sources[EV_SOURCES_MAX]; /* IPv4 sources served, network order */
	u32 n_dests;
	u32 dests[EV_DESTS_MAX]; /* the interface's IPv4 addresses, network order: others pass */
	u32 vocab;       /* token ids must be below this */
	u32 max_new;     /* the most new tokens a request may ask for */
	u32 max_prompt;  /* the most prompt tokens (<= EV_PROMPT_MAX and the context) */
	u32 n_slots;     /* request slots (contexts), <= EV_SLOTS_MAX */
	u32 flags;       /* EV_F_* */
	u64 timeout_ns;  /* EV_F_REPLY: a slot whose client has not polled this long is given back */
	u64 tok_text;    /* u8 [LIM_TOK_TEXT_MAX] (arena): a text request's text, for tokenize (whose
			  * tables and work area tok_cfg names); 0: no tokenizer, text requests refused */
	u64 secret[2];   /* EV_F_REPLY: the SipHash key of the cookies (getrandom(2) at install) */
	u32 per_source;  /* the most slots one source address holds at once (1 to n_slots) */
	u32 pad;
	u64 rate_ns;     /* a source's requests: one per rate_ns on average; 0: no rate limit */
	u64 rate_tau_ns; /* ... with a burst of b requests: (b - 1) * rate_ns */
};
struct ev_config ev_cfg;

/* Counters (.bss): every request datagram to the port ends in exactly one of the first three,
 * or is dropped by the rate limiter (ev_rate_limited). */
u64 ev_accepted, ev_refused_busy, ev_refused_invalid, ev_done;
/* EV_F_REPLY: refusals by reason (EV_R_*, polls' included), polls answered, requests repeated
 * (answered ACCEPTED again, not started again), tokens generated, slots given back after the
 * timeout, replies that could not be built (the frame could not be resized), datagrams left
 * unanswered (their reply would be longer than their frame, or the frame's lengths disagree). */
u64 ev_refusals[EV_REASONS], ev_polls, ev_repeats, ev_tokens, ev_reclaimed, ev_reply_failed,
	ev_unanswered;
/* EV_F_REPLY: polls for a request of their address and port whose cookie was not the request's
 * (a spoofer's guess, or a poll for an earlier request of the same id): dropped, no reply */
u64 ev_bad_cookie;
/* request datagrams (not polls) over their source's rate (ev_cfg.rate_ns): dropped, no reply */
u64 ev_rate_limited;
/* 1 while a worker uses the tokenizer's text buffer and work area (one text at a time) */
u32 ev_tok_busy;

/* Each slot's generation before a request: its context's plan, prompt and KV (user space). */
struct gen_args ev_template[EV_SLOTS_MAX];

/* A text request's sampling parameters, as on the wire: Q16.16 fixed point, 0 = off; within
 * the integer sampler's limits (sample.inc.c, limits.h). */
struct ev_sampling {
	u32 temperature;        /* 0: greedy; else 0.01 to 100 */
	u32 top_k;              /* an integer; 0: off */
	u32 top_p, min_p;       /* at most 1.0 */
	u32 penalty;            /* the repetition penalty: 0 (off) or 0.01 to 100 */
	u32 seed_lo, seed_hi;
};

struct ev_slot {
	struct bpf_wq wq;
	u32 state;              /* EV_FREE, EV_BUSY, EV_DONE or EV_CLAIMED */
	u32 started;            /* the prompt has been copied to the arena */
	struct gen_args args;
	u32 prompt[EV_PROMPT_MAX];
	/* EV_F_REPLY: who may poll, and how it ended */
	u32 client_addr;        /* the requester's IPv4 address, network order */
	u32 client_port;        /* its UDP port, host order */
	u32 request;
	s32 finish;             /* once EV_DONE: GEN_* or a negative plan error */
	u32 generation;         /* counts the requests the slot has taken (ev_launch) */
	u32 delivered;          /* the generation whose FINAL record was sent */
	u32 cancel;             /* give the slot back at the worker's next round */
	u32 tok_wait;           /* waits for the tokenizer: started again by the worker done with it */
	u64 last_ns;            /* the request or its last poll (bpf_ktime_get_ns) */
	/* a text request (EV_TEXT_MAGIC): tokenized by the worker before it generates */
	u32 is_text;
	u32 text_flags;         /* EV_TF_* */
	u32 n_text;
	s32 tok_result;         /* once tokenized: the prompt's tokens, or TOK_E_* */
	u8 text_in[EV_TEXT_IN_MAX];
};

/* One reply's payload, built here before it is copied into the frame. */
struct ev_out {
	u32 w[8];
	u8 text[EV_TEXT_REPLY_MAX];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct ev_out);
} ev_out SEC(".maps");

/* A text request's header; its n text bytes follow. Sampling fields: Q16.16, 0 = off. */
struct ev_text_head {
	u32 magic, request, max_new, flags;
	struct ev_sampling sampling;
	u32 n;
};

/* A checked request, staged in ev_stage: its text (is_text), else its n token ids. */
struct ev_req {
	u32 src, sport;         /* the client: IPv4 address (network order), UDP port */
	u32 request, max_new, n;
	u32 is_text, flags;     /* a text request's EV_TF_* */
	struct qb_sample_params p; /* a text request's sampling (sample.inc.c) */
	u64 seed;
};

/* A request's prompt or text, staged and checked before a slot is claimed for it (per CPU:
 * kept off the XDP program's stack, which its calls would overflow). */
struct ev_stage {
	u32 prompt[EV_PROMPT_MAX];
	u8 text[EV_TEXT_IN_MAX];
	struct ev_text_head th;
	struct ev_req req;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct ev_stage);
} ev_stage SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, EV_SLOTS_MAX);
	__type(key, u32);
	__type(value, struct ev_slot);
} ev_slots SEC(".maps");

/* The rate limiter's state per source address (network order): the theoretical arrival time of
 * its next request (GCRA, the token bucket's equivalent with one word), bpf_ktime_get_ns. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, EV_RATE_SOURCES);
	__type(key, u32);
	__type(value, u64);
} ev_rate SEC(".maps");


/* A record without text: a request's outcome or refusal. */
static __always_inline void ev_record(u32 kind, u32 id, u32 request, u32 pos)
{
	struct gen_token *r = bpf_ringbuf_reserve(&tokens, sizeof(*r), 0);

	if (!r)
		return;
	r->id = id;
	r->pos = pos;
	r->request = request;
	r->len = 0;
	r->kind = kind;
	bpf_ringbuf_submit(r, 0);
}

/* The penalties' counts of a sampled request: its prompt's tokens (the sampler adds each token
 * it draws). Its own function: the worker's frame stays small under gen_run's deep calls. */
static __noinline void ev_count_prompt(struct gen_args *a)
{
	u32 __arena *c = ARENA_PTR(u32, a->sample.counts);
	const u32 __arena *p = ARENA_PTR(const u32, a->prompt);
	u32 n = a->sample.n, np = a->n_prompt;

	for (u32 i = 0; i < n && can_loop; i++)
		c[i] = 0;
	for (u32 i = 0; i < np && can_loop; i++)
		if (p[i] < n)
			c[p[i]] += 1;
}

/* A generation is over with `finish` (GEN_*, GEN_PROMPT or a negative plan error): counted, its
 * record (EV_F_RING), its outcome kept for polls (EV_F_REPLY) or the slot freed. */
static __noinline void ev_end(struct ev_slot *s, int finish)
{
	/* counted before the record: a reader that saw the record sees the count. pos carries the
	 * last token generated: the stop token when it stopped */
	__sync_fetch_and_add(&ev_done, 1);
	if (ev_cfg.flags & EV_F_RING)
		ev_record(REC_DONE, (u32)finish, s->args.request, s->args.next);
	if (ev_cfg.flags & EV_F_REPLY) {
		/* the outcome before the state (an exchange: a full barrier) */
		s->finish = finish;
		__sync_lock_test_and_set(&s->state, EV_DONE);
	} else {
		__sync_lock_test_and_set(&s->state, EV_FREE);
	}
}

/* The chat template around a text request's text (Tokenizer::chat_prompt in Rust). */
static const char ev_chat_head[] = "<|im_start|>user\n";
static const char ev_chat_tail[] = "<|im_end|>\n<|im_start|>assistant\n";

/* A text request's prompt: its text (in the chat template when asked) copied to the
 * tokenizer's text buffer and tokenized into the slot's prompt. The count of tokens, 0 when
 * none, or TOK_E_* (TOK_E_IDS: more than the prompt may hold). */
static __noinline int ev_tokenize(struct ev_slot *s)
{
	u8 __arena *t = ARENA_PTR(u8, ev_cfg.tok_text);
	u32 n = 0, len = s->n_text, chat = s->text_flags & EV_TF_CHAT;

	if (!ev_cfg.tok_text)
		return TOK_E_TABLES;
	if (chat)
		for (u32 i = 0; i < sizeof(ev_chat_head) - 1; i++)
			t[n++] = ev_chat_head[i];
	FOR(i, 0, len) /* len <= EV_TEXT_IN_MAX: checked in XDP */
		t[n + i] = s->text_in[i & (EV_TEXT_IN_MAX - 1)];
	n += len;
	if (chat)
		for (u32 i = 0; i < sizeof(ev_chat_tail) - 1; i++)
			t[n++] = ev_chat_tail[i];
	return tokenize(ev_cfg.tok_text, n, s->args.prompt, ev_cfg.max_prompt);
}

/* Slot i, or NULL past the configured slots: every walk over the slots starts here. */
static __always_inline struct ev_slot *ev_slot_at(u32 i)
{
	u32 k = i;

	return i < ev_cfg.n_slots ? bpf_map_lookup_elem(&ev_slots, &k) : 0;
}

/* Starts the worker of every slot waiting for the tokenizer (tok_wait), which is free again. */
static __noinline void ev_tok_wake(void)
{
	for (u32 i = 0; i < EV_SLOTS_MAX; i++) {
		struct ev_slot *c = ev_slot_at(i);

		if (c && *(volatile u32 *)&c->tok_wait && __sync_lock_test_and_set(&c->tok_wait, 0))
			bpf_wq_start(&c->wq, 0);
	}
}

/* The workqueue callback: one round of the slot's generation. */
static int ev_work(void *map, int *key, void *value)
{
	struct ev_slot *s = value;
	u32 before;
	int r;

	USE_ARENA(arena);
	if (!s->started && s->is_text) {
		/* one text at a time in the tokenizer's buffers. A worker finding them taken does not
		 * queue itself again (a spin): it marks itself waiting, and the worker done with them
		 * starts it again (ev_tok_wake). The mark goes first (exchanges: full barriers), so
		 * either this worker takes the buffers or their holder, releasing them after this
		 * failed, sees the mark. */
		__sync_lock_test_and_set(&s->tok_wait, 1);
		if (__sync_val_compare_and_swap(&ev_tok_busy, 0, 1) != 0)
			return 0;
		__sync_lock_test_and_set(&s->tok_wait, 0);
		r = ev_tokenize(s);
		__sync_lock_test_and_set(&ev_tok_busy, 0);
		ev_tok_wake();
		s->tok_result = r;
		if (r <= 0) {
			ev_end(s, GEN_PROMPT);
			return 0;
		}
		s->args.n_prompt = r;
	}
	if (!s->started) {
		u32 __arena *p = ARENA_PTR(u32, s->args.prompt);

		if (!s->is_text) /* a text's prompt was tokenized into the arena above */
			for (u32 i = 0; i < s->args.n_prompt && i < EV_PROMPT_MAX; i++)
				p[i] = s->prompt[i];
		if (s->args.sampling && s->args.sample.counts)
			ev_count_prompt(&s->args);
		s->started = 1;
	}
	if ((ev_cfg.flags & EV_F_REPLY) &&
	    (s->cancel || bpf_ktime_get_ns() - s->last_ns > ev_cfg.timeout_ns)) {
		/* its client stopped polling: the slot is given back unfinished */
		__sync_fetch_and_add(&ev_reclaimed, 1);
		__sync_fetch_and_add(&ev_done, 1);
		__sync_lock_test_and_set(&s->state, EV_FREE);
		return 0;
	}
	before = s->args.generated;
	r = gen_run(&s->args);
	__sync_fetch_and_add(&ev_tokens, s->args.generated - before);
	if (r == 0 && s->args.status == GEN_MORE) {
		bpf_wq_start(&s->wq, 0);
		return 0;
	}
	ev_end(s, r ? r : s->args.status);
	return 0;
}

/* Initialises every slot's workqueue item with ev_work; run once before attaching. */
SEC("syscall")
int ev_setup(void *ctx)
{
	int err;

	for (u32 i = 0; i < EV_SLOTS_MAX; i++) {
		u32 k = i;
		struct ev_slot *s = bpf_map_lookup_elem(&ev_slots, &k);

		if (!s)
			return 1;
		err = bpf_wq_init(&s->wq, &ev_slots, 0);
		if (err)
			return 2 << 16 | (-err & 0xffff); /* which step failed, and its errno */
		err = qb_wq_set_callback(&s->wq, ev_work);
		if (err)
			return 3 << 16 | (-err & 0xffff);
	}
	return 0;
}
