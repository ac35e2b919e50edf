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
 * A reply is never longer than the datagram it answers (a poll is padded to the room its client
 * wants for text), except a REFUSED reply to a datagram shorter than it: frames grown with
 * bpf_xdp_adjust_tail were lost, every other one, after XDP_TX on a veth in native mode (Linux
 * 6.18), where shrunk and same-size ones all arrived. */
#pragma once

#define EV_SLOTS_MAX PLAN_THREADS_MAX
#define EV_PROMPT_MAX 1024      /* prompt tokens one datagram may carry */
#define EV_MAGIC 0x46504251     /* "QBPF": a request of token ids, greedy */
#define EV_TEXT_MAGIC 0x54504251 /* "QBPT": a request of UTF-8 text, with sampling parameters */
#define EV_TEXT_IN_MAX 4096     /* text bytes one request may carry */
#define EV_TF_CHAT 1            /* QBPT flags: wrap the text in the chat template */
#define EV_SOURCES_MAX 4
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
#define EV_REASONS 8

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
	u32 vocab;       /* token ids must be below this */
	u32 max_new;     /* the most new tokens a request may ask for */
	u32 max_prompt;  /* the most prompt tokens (<= EV_PROMPT_MAX and the context) */
	u32 n_slots;     /* request slots (contexts), <= EV_SLOTS_MAX */
	u32 flags;       /* EV_F_* */
	u64 timeout_ns;  /* EV_F_REPLY: a slot whose client has not polled this long is given back */
	u64 tok_text;    /* u8 [LIM_TOK_TEXT_MAX] (arena): a text request's text, for tokenize (whose
			  * tables and work area tok_cfg names); 0: no tokenizer, text requests refused */
};
struct ev_config ev_cfg;

/* Counters (.bss): every request datagram to the port ends in exactly one of the first three. */
u64 ev_accepted, ev_refused_busy, ev_refused_invalid, ev_done;
/* EV_F_REPLY: refusals by reason (EV_R_*, polls' included), polls answered, requests repeated
 * (answered ACCEPTED again, not started again), tokens generated, slots given back after the
 * timeout, replies that could not be built (the frame could not be resized). */
u64 ev_refusals[EV_REASONS], ev_polls, ev_repeats, ev_tokens, ev_reclaimed, ev_reply_failed;
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
	u32 delivered;          /* the FINAL record was sent */
	u32 cancel;             /* give the slot back at the worker's next round */
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

/* The workqueue callback: one round of the slot's generation. */
static int ev_work(void *map, int *key, void *value)
{
	struct ev_slot *s = value;
	u32 before;
	int r;

	USE_ARENA(arena);
	if (!s->started && s->is_text) {
		/* one text at a time in the tokenizer's buffers: later, if another slot has them */
		if (__sync_val_compare_and_swap(&ev_tok_busy, 0, 1) != 0) {
			bpf_wq_start(&s->wq, 0);
			return 0;
		}
		r = ev_tokenize(s);
		__sync_lock_test_and_set(&ev_tok_busy, 0);
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

struct ev_head {
	u32 magic, request, max_new, n;
};

struct ev_poll {
	u32 magic, request, offset;
};

#define EV_HDR (14 + 20 + 8) /* Ethernet, IPv4 without options, UDP */

/* The frame as the reply: `payload` bytes of UDP payload after the headers of the datagram
 * received (`hdr`), with addresses and ports swapped. Returns XDP_TX, or XDP_DROP (counted) when
 * the frame cannot be resized. The payload is written by the caller after this. */
static __always_inline int ev_frame(struct xdp_md *ctx, const u8 *hdr, u32 payload)
{
	u8 out[EV_HDR];
	u32 sum = 0, ip_len = 20 + 8 + payload, udp_len = 8 + payload;
	int cur = bpf_xdp_get_buff_len(ctx);

	if (bpf_xdp_adjust_tail(ctx, (int)(EV_HDR + payload) - cur)) {
		__sync_fetch_and_add(&ev_reply_failed, 1);
		return XDP_DROP;
	}
	for (int i = 0; i < 6; i++) {
		out[i] = hdr[6 + i];
		out[6 + i] = hdr[i];
	}
	out[12] = hdr[12];
	out[13] = hdr[13];
	for (int i = 14; i < 34; i++)
		out[i] = hdr[i];
	out[14 + 2] = ip_len >> 8;
	out[14 + 3] = ip_len;
	out[14 + 6] &= 0x40; /* keep DF; not a fragment */
	out[14 + 7] = 0;
	out[14 + 8] = 64;    /* TTL */
	out[14 + 10] = 0;
	out[14 + 11] = 0;
	for (int i = 0; i < 4; i++) {
		out[14 + 12 + i] = hdr[14 + 16 + i];
		out[14 + 16 + i] = hdr[14 + 12 + i];
	}
	for (int i = 0; i < 20; i += 2)
		sum += (u32)out[14 + i] << 8 | out[14 + i + 1];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	out[14 + 10] = ~sum >> 8;
	out[14 + 11] = ~sum;
	out[34 + 0] = hdr[34 + 2];
	out[34 + 1] = hdr[34 + 3];
	out[34 + 2] = hdr[34 + 0];
	out[34 + 3] = hdr[34 + 1];
	out[34 + 4] = udp_len >> 8;
	out[34 + 5] = udp_len;
	out[34 + 6] = 0; /* no UDP checksum: legal for IPv4 */
	out[34 + 7] = 0;
	if (bpf_xdp_store_bytes(ctx, 0, out, sizeof(out))) {
		__sync_fetch_and_add(&ev_reply_failed, 1);
		return XDP_DROP;
	}
	return XDP_TX;
}

/* A reply of `words` u32 words (at most 8) from o->w and `n` text bytes from o->text. */
static __always_inline int ev_send(struct xdp_md *ctx, const u8 *hdr, struct ev_out *o, u32 words,
				   u32 n)
{
	u32 hlen = words * 4;
	int act;

	if (hlen > sizeof(o->w) || n > EV_TEXT_REPLY_MAX)
		return XDP_DROP;
	act = ev_frame(ctx, hdr, hlen + n);
	if (act != XDP_TX)
		return act;
	if (bpf_xdp_store_bytes(ctx, EV_HDR, o->w, hlen))
		goto failed;
	if (n >= 1 && bpf_xdp_store_bytes(ctx, EV_HDR + hlen, o->text,
					  QB_LEN(n, EV_TEXT_REPLY_MAX, failed)))
		goto failed;
	return XDP_TX;
failed:
	__sync_fetch_and_add(&ev_reply_failed, 1);
	return XDP_DROP;
}

/* A five-word reply: magic, kind, request, a, b. */
static __always_inline int ev_answer(struct xdp_md *ctx, const u8 *hdr, u32 kind, u32 request,
				     u32 a, u32 b)
{
	u32 zero = 0;
	struct ev_out *o = bpf_map_lookup_elem(&ev_out, &zero);

	if (!o)
		return XDP_DROP;
	o->w[0] = EV_REPLY_MAGIC;
	o->w[1] = kind;
	o->w[2] = request;
	o->w[3] = a;
	o->w[4] = b;
	return ev_send(ctx, hdr, o, 5, 0);
}

/* Refuses a datagram: counted, a record for its request (EV_F_RING), a REFUSED reply
 * (EV_F_REPLY). Polls are refused here too, counted by reason only. */
static __always_inline int ev_refuse_as(struct xdp_md *ctx, const u8 *hdr, u32 reason,
					u32 request, int poll)
{
	if (!poll) {
		if (reason == EV_R_BUSY)
			__sync_fetch_and_add(&ev_refused_busy, 1);
		else
			__sync_fetch_and_add(&ev_refused_invalid, 1);
	}
	__sync_fetch_and_add(&ev_refusals[reason & (EV_REASONS - 1)], 1);
	if (ev_cfg.flags & EV_F_RING)
		ev_record(REC_REFUSED, reason, request, 0);
	if (ev_cfg.flags & EV_F_REPLY)
		return ev_answer(ctx, hdr, EV_K_REFUSED, request, reason, 0);
	return XDP_DROP;
}

#define ev_refuse(reason, request) ev_refuse_as(ctx, hdr, reason, request, 0)

/* The slot of request `request` from addr:port, running or finished; EV_SLOTS_MAX if none. */
static __always_inline u32 ev_find(u32 request, u32 addr, u32 port)
{
	for (u32 i = 0; i < EV_SLOTS_MAX; i++) {
		u32 k = i, st;
		struct ev_slot *c;

		if (i >= ev_cfg.n_slots)
			break;
		c = bpf_map_lookup_elem(&ev_slots, &k);
		if (!c)
			break;
		st = *(volatile u32 *)&c->state;
		if ((st == EV_BUSY || st == EV_DONE) && c->request == request &&
		    c->client_addr == addr && c->client_port == port)
			return i;
	}
	return EV_SLOTS_MAX;
}

/* The FINAL record's finish code and detail for a slot's outcome. */
static __always_inline void ev_finish(struct ev_slot *s, u32 *finish, u32 *detail)
{
	*detail = 0;
	switch (s->finish) {
	case GEN_STOP:
		*finish = EV_FIN_STOP;
		*detail = s->args.next;
		break;
	case GEN_MAX:
		*finish = EV_FIN_MAX_TOKENS;
		break;
	case GEN_FULL:
		*finish = EV_FIN_CONTEXT;
		break;
	case GEN_LENGTH:
		*finish = EV_FIN_LENGTH;
		break;
	case GEN_PROMPT:
		*finish = EV_FIN_PROMPT;
		*detail = (u32)s->tok_result;
		break;
	default:
		*finish = EV_FIN_ERROR;
		*detail = (u32)s->finish;
	}
}

/* A poll: the text of the request since the offset, or its FINAL record once it is over. */
static __noinline int ev_poll(struct xdp_md *ctx, const u8 *hdr, u32 src, u32 sport, u32 len)
{
	u32 zero = 0, slot, st, text, n, fin, detail;
	struct ev_poll p;
	struct ev_slot *s;
	struct ev_out *o;
	const u8 __arena *from;

	USE_ARENA(arena);
	/* the reply is never longer than the poll (see the top): it must have room for FINAL */
	if (len < 8 + EV_POLL_MIN || bpf_xdp_load_bytes(ctx, EV_HDR, &p, sizeof(p)))
		return ev_refuse_as(ctx, hdr, EV_R_MALFORMED, 0, 1);
	slot = ev_find(p.request, src, sport);
	if (slot >= EV_SLOTS_MAX)
		return ev_refuse_as(ctx, hdr, EV_R_UNKNOWN, p.request, 1);
	s = bpf_map_lookup_elem(&ev_slots, &slot);
	o = bpf_map_lookup_elem(&ev_out, &zero);
	if (!s || !o)
		return XDP_DROP;
	s->last_ns = bpf_ktime_get_ns();
	/* the state before the length: a finished slot's length is final */
	st = __sync_fetch_and_add(&s->state, 0);
	text = __sync_fetch_and_add(&s->args.text_len, 0);
	if (p.offset > text || text > s->args.text_cap)
		return ev_refuse_as(ctx, hdr, EV_R_OFFSET, p.request, 1);
	__sync_fetch_and_add(&ev_polls, 1);
	o->w[0] = EV_REPLY_MAGIC;
	o->w[2] = p.request;
	o->w[3] = p.offset;
	if (p.offset == text && st == EV_DONE) {
		ev_finish(s, &fin, &detail);
		o->w[1] = EV_K_FINAL;
		o->w[4] = fin;
		o->w[5] = s->args.n_prompt;
		o->w[6] = s->args.generated;
		o->w[7] = detail;
		s->delivered = 1;
		return ev_send(ctx, hdr, o, 8, 0);
	}
	n = text - p.offset;
	if (n > EV_TEXT_REPLY_MAX)
		n = EV_TEXT_REPLY_MAX;
	if (n > len - 8 - 20) /* what fits the poll's own size */
		n = len - 8 - 20;
	from = ARENA_PTR(const u8, s->args.text + p.offset);
	for (u32 i = 0; i < EV_TEXT_REPLY_MAX && can_loop; i++) {
		if (i >= n)
			break;
		o->text[i] = from[i];
	}
	o->w[1] = EV_K_TEXT;
	o->w[4] = n;
	return ev_send(ctx, hdr, o, 5, n);
}

/* Claims a slot for a new request: a free one, else (EV_F_REPLY) a finished one whose FINAL
 * record was sent or whose client stopped polling. A running slot whose client stopped polling
 * is told to stop; its worker gives it back. EV_SLOTS_MAX if none. */
static __always_inline u32 ev_claim(void)
{
	u64 now = bpf_ktime_get_ns();

	for (u32 i = 0; i < EV_SLOTS_MAX; i++) {
		u32 k = i;
		struct ev_slot *c;

		if (i >= ev_cfg.n_slots)
			break;
		c = bpf_map_lookup_elem(&ev_slots, &k);
		if (c && __sync_val_compare_and_swap(&c->state, EV_FREE, EV_CLAIMED) == EV_FREE)
			return i;
	}
	if (!(ev_cfg.flags & EV_F_REPLY))
		return EV_SLOTS_MAX;
	for (u32 i = 0; i < EV_SLOTS_MAX; i++) {
		u32 k = i, st;
		struct ev_slot *c;
		int stale;

		if (i >= ev_cfg.n_slots)
			break;
		c = bpf_map_lookup_elem(&ev_slots, &k);
		if (!c)
			break;
		stale = now - *(volatile u64 *)&c->last_ns > ev_cfg.timeout_ns;
		st = *(volatile u32 *)&c->state;
		if (st == EV_BUSY && stale)
			c->cancel = 1;
		if (st == EV_DONE && (stale || c->delivered) &&
		    __sync_val_compare_and_swap(&c->state, EV_DONE, EV_CLAIMED) == EV_DONE) {
			if (stale && !c->delivered)
				__sync_fetch_and_add(&ev_reclaimed, 1);
			return i;
		}
	}
	return EV_SLOTS_MAX;
}

/* Claims a slot for a checked request, fills the slot from its template and starts its worker;
 * the ACCEPTED or REFUSED reply. */
static __noinline int ev_launch(struct xdp_md *ctx, const u8 *hdr)
{
	u32 zero = 0, slot, src, sport, request, max_new, n;
	struct ev_stage *st = bpf_map_lookup_elem(&ev_stage, &zero);
	struct ev_slot *s = 0;
	struct ev_req *q;

	if (!st)
		return XDP_DROP;
	q = &st->req;
	src = q->src, sport = q->sport, request = q->request, max_new = q->max_new, n = q->n;
	if (ev_cfg.flags & EV_F_REPLY) {
		/* a request sent again (its ACCEPTED reply lost?) is not started again */
		if (ev_find(request, src, sport) < EV_SLOTS_MAX) {
			__sync_fetch_and_add(&ev_repeats, 1);
			return ev_answer(ctx, hdr, EV_K_ACCEPTED, request, n, max_new);
		}
	}
	slot = ev_claim();
	if (slot < EV_SLOTS_MAX)
		s = bpf_map_lookup_elem(&ev_slots, &slot);
	if (!s)
		return ev_refuse(EV_R_BUSY, request);
	s->is_text = q->is_text;
	if (q->is_text) {
		s->text_flags = q->flags;
		s->n_text = n;
		/* open-coded iterators: the verifier checks each body once, not 4,096 times */
		FOR(i, 0, (n + 7) / 8)
			((u64 *)s->text_in)[i & (EV_TEXT_IN_MAX / 8 - 1)] =
				((u64 *)st->text)[i & (EV_TEXT_IN_MAX / 8 - 1)];
	} else {
		FOR(i, 0, n)
			s->prompt[i & (EV_PROMPT_MAX - 1)] = st->prompt[i & (EV_PROMPT_MAX - 1)];
	}
	s->args = ev_template[slot & (EV_SLOTS_MAX - 1)];
	s->args.n_prompt = q->is_text ? 0 : n; /* a text's: once the worker has tokenized it */
	/* sampling: the integer sampler draws when the temperature or a penalty asks for it (the
	 * argmax otherwise); the penalties' counts are the slot's, counted by the worker */
	s->args.sample.p = q->p;
	s->args.sample.rng = q->seed;
	s->args.sampling = q->p.temp_q16 || q->p.rep_q16 != SAMPLE_ONE;
	if (q->p.rep_q16 == SAMPLE_ONE)
		s->args.sample.counts = 0;
	s->args.max_new = max_new;
	s->args.request = request;
	s->started = 0;
	s->client_addr = src;
	s->client_port = sport;
	s->request = request;
	s->finish = 0;
	s->delivered = 0;
	s->cancel = 0;
	s->last_ns = bpf_ktime_get_ns();
	/* the fields before the state (an exchange: a full barrier): polls match on them */
	__sync_lock_test_and_set(&s->state, EV_BUSY);
	if (bpf_wq_start(&s->wq, 0)) {
		__sync_lock_test_and_set(&s->state, EV_FREE);
		return ev_refuse(EV_R_BUSY, request);
	}
	__sync_fetch_and_add(&ev_accepted, 1);
	if (ev_cfg.flags & EV_F_REPLY)
		return ev_answer(ctx, hdr, EV_K_ACCEPTED, request, n, max_new);
	return XDP_DROP;
}

/* A text request's sampling fields as the sampler's parameters (0 = off becomes 1.0 for top-p
 * and the penalty); 0 when they are outside the sampler's limits. */
static __always_inline int ev_sampling(const struct ev_sampling *w, struct qb_sample_params *p)
{
	p->temp_q16 = w->temperature;
	p->top_k = w->top_k;
	p->top_p_q16 = w->top_p ? w->top_p : SAMPLE_ONE;
	p->min_p_q16 = w->min_p;
	p->rep_q16 = w->penalty ? w->penalty : SAMPLE_ONE;
	p->presence_q16 = 0;
	p->frequency_q16 = 0;
	return sample_params_ok(p);
}

/* Whether the n bytes staged (ev_stage's text) are UTF-8 (RFC 3629: shortest forms, no
 * surrogates, at most U+10FFFF), byte by byte: `need` continuation bytes are still due, the next
 * in [lo, hi]. A global function: verified once, not once per state of its caller. */
__noinline int ev_utf8(u32 n)
{
	u32 zero = 0, need = 0, lo = 0x80, hi = 0xbf;
	struct ev_stage *st = bpf_map_lookup_elem(&ev_stage, &zero);

	if (!st || n > EV_TEXT_IN_MAX)
		return 0;
	FOR(i, 0, n) {
		u8 c = st->text[i & (EV_TEXT_IN_MAX - 1)];

		if (need) {
			if (c < lo || c > hi)
				return 0;
			need--, lo = 0x80, hi = 0xbf;
		} else if (c < 0x80) {
			continue;
		} else if (c >= 0xc2 && c <= 0xdf) {
			need = 1;
		} else if (c >= 0xe0 && c <= 0xef) {
			need = 2;
			lo = c == 0xe0 ? 0xa0 : 0x80; /* E0: no overlong form */
			hi = c == 0xed ? 0x9f : 0xbf; /* ED: no surrogate */
		} else if (c >= 0xf0 && c <= 0xf4) {
			need = 3;
			lo = c == 0xf0 ? 0x90 : 0x80; /* F0: no overlong form */
			hi = c == 0xf4 ? 0x8f : 0xbf; /* F4: nothing past U+10FFFF */
		} else {
			return 0;
		}
	}
	return need == 0;
}

/* A text request: the header checked, the text staged and checked as UTF-8, then launched. */
static __noinline int ev_text_request(struct xdp_md *ctx, const u8 *hdr, u32 src, u32 sport,
				      u32 len)
{
	u32 zero = 0, n;
	struct ev_stage *st = bpf_map_lookup_elem(&ev_stage, &zero);
	struct ev_text_head *h;
	struct ev_req *q;

	if (!st)
		return XDP_DROP;
	h = &st->th;
	q = &st->req;
	if (len < 8 + sizeof(*h) || bpf_xdp_load_bytes(ctx, EV_HDR, h, sizeof(*h)))
		return ev_refuse(EV_R_MALFORMED, 0);
	n = h->n;
	if (len != 8 + sizeof(*h) + (u64)n || (h->flags & ~EV_TF_CHAT))
		return ev_refuse(EV_R_MALFORMED, h->request);
	if (n > EV_TEXT_IN_MAX || h->max_new == 0 || h->max_new > ev_cfg.max_new ||
	    !ev_sampling(&h->sampling, &q->p))
		return ev_refuse(EV_R_LIMIT, h->request);
	if (n == 0 && !(h->flags & EV_TF_CHAT)) /* nothing to generate from */
		return ev_refuse(EV_R_LIMIT, h->request);
	if (!ev_cfg.tok_text) /* no tokenizer in this model's arena (Model::load_tokenizer) */
		return ev_refuse(EV_R_MALFORMED, h->request);
	if (n >= 1 && bpf_xdp_load_bytes(ctx, EV_HDR + sizeof(*h), st->text,
					 QB_LEN(n, EV_TEXT_IN_MAX, malformed))) {
malformed:
		return ev_refuse(EV_R_MALFORMED, h->request);
	}
	if (!ev_utf8(n))
		return ev_refuse(EV_R_UTF8, h->request);
	q->src = src;
	q->sport = sport;
	q->request = h->request;
	q->max_new = h->max_new;
	q->n = n;
	q->is_text = 1;
	q->flags = h->flags;
	q->seed = (u64)h->sampling.seed_hi << 32 | h->sampling.seed_lo;
	return ev_launch(ctx, hdr);
}

SEC("xdp")
int ev_xdp(struct xdp_md *ctx)
{
	u8 hdr[EV_HDR];
	struct ev_head h;
	struct ev_stage *st;
	u32 ihl, off, len, src, sport, dport, bytes, magic, ok = 0, zero = 0;

	if (ctx->ingress_ifindex != ev_cfg.ifindex)
		return XDP_PASS;
	if (bpf_xdp_load_bytes(ctx, 0, hdr, sizeof(hdr)))
		return XDP_PASS;
	/* Ethernet: IPv4 (loopback carries a zero Ethernet header) */
	if (hdr[12] != 0x08 || hdr[13] != 0x00 || (hdr[14] >> 4) != 4 || hdr[14 + 9] != 17)
		return XDP_PASS;
	ihl = (hdr[14] & 15) * 4;
	if (ihl != 20) /* IP options: not a datagram we serve */
		return XDP_PASS;
	dport = (u32)hdr[14 + 20 + 2] << 8 | hdr[14 + 20 + 3];
	if (dport != ev_cfg.port)
		return XDP_PASS;
	__builtin_memcpy(&src, &hdr[14 + 12], 4);
	for (u32 i = 0; i < EV_SOURCES_MAX; i++)
		if (i < ev_cfg.n_sources && ev_cfg.sources[i] == src)
			ok = 1;
	if (!ok)
		return XDP_PASS;
	/* ours from here: every path below is counted */
	sport = (u32)hdr[14 + 20 + 0] << 8 | hdr[14 + 20 + 1];
	off = EV_HDR;
	len = ((u32)hdr[14 + 20 + 4] << 8 | hdr[14 + 20 + 5]); /* UDP length: header + payload */
	if ((ev_cfg.flags & EV_F_REPLY) && len >= 8 + 4 && !bpf_xdp_load_bytes(ctx, off, &magic, 4) &&
	    magic == EV_POLL_MAGIC)
		return ev_poll(ctx, hdr, src, sport, len);
	if (len >= 8 + 4 && !bpf_xdp_load_bytes(ctx, off, &magic, 4) && magic == EV_TEXT_MAGIC)
		return ev_text_request(ctx, hdr, src, sport, len);
	if (len < 8 + sizeof(h) || bpf_xdp_load_bytes(ctx, off, &h, sizeof(h)))
		return ev_refuse(EV_R_MALFORMED, 0);
	if (h.magic != EV_MAGIC || len != 8 + sizeof(h) + (u64)h.n * 4)
		return ev_refuse(EV_R_MALFORMED, h.request);
	if (h.n == 0 || h.n > ev_cfg.max_prompt || h.n > EV_PROMPT_MAX || h.max_new == 0 ||
	    h.max_new > ev_cfg.max_new)
		return ev_refuse(EV_R_LIMIT, h.request);
	/* the prompt is staged and checked before a slot is claimed: an invalid request is refused
	 * for what is wrong with it, whether or not a slot is free */
	st = bpf_map_lookup_elem(&ev_stage, &zero);
	if (!st)
		return XDP_DROP;
	bytes = h.n * 4;
	if (bpf_xdp_load_bytes(ctx, off + sizeof(h), st->prompt,
			       QB_LEN(bytes, sizeof(st->prompt), malformed))) {
malformed:
		return ev_refuse(EV_R_MALFORMED, h.request);
	}
	for (u32 i = 0; i < EV_PROMPT_MAX; i++) {
		if (i >= h.n)
			break;
		if (st->prompt[i] >= ev_cfg.vocab)
			return ev_refuse(EV_R_TOKEN, h.request);
	}
	st->req = (struct ev_req){
		.src = src, .sport = sport, .request = h.request, .max_new = h.max_new, .n = h.n,
		.p = { .top_p_q16 = SAMPLE_ONE, .rep_q16 = SAMPLE_ONE }, /* greedy */
	};
	return ev_launch(ctx, hdr);
}
