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
 * so requests sent from different CPUs are served at once. */
#pragma once

#define EV_SLOTS_MAX PLAN_THREADS_MAX
#define EV_PROMPT_MAX 1024      /* prompt tokens one datagram may carry */
#define EV_MAGIC 0x46504251     /* "QBPF" */
#define EV_SOURCES_MAX 4
#define EV_FREE 0
#define EV_BUSY 1

/* Record kinds (struct gen_token's kind) and refusal reasons (its id). */
#define REC_TOKEN 0
#define REC_DONE 1    /* id: the GEN_* status, or a negative plan error */
#define REC_REFUSED 2 /* id: EV_R_* */
#define EV_R_BUSY 1
#define EV_R_MALFORMED 2
#define EV_R_TOKEN 3  /* a token id at or past the vocabulary */
#define EV_R_LIMIT 4  /* too many prompt tokens or new tokens */

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
};
struct ev_config ev_cfg;

/* Counters (.bss): every datagram to the port ends in exactly one of them. */
u64 ev_accepted, ev_refused_busy, ev_refused_invalid, ev_done;

/* Each slot's generation before a request: its context's plan, prompt and KV (user space). */
struct gen_args ev_template[EV_SLOTS_MAX];

struct ev_slot {
	struct bpf_wq wq;
	u32 state;              /* EV_FREE or EV_BUSY */
	u32 started;            /* the prompt has been copied to the arena */
	struct gen_args args;
	u32 prompt[EV_PROMPT_MAX];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, EV_SLOTS_MAX);
	__type(key, u32);
	__type(value, struct ev_slot);
} ev_slots SEC(".maps");

extern int bpf_wq_init(struct bpf_wq *wq, void *p__map, unsigned int flags) __weak __ksym;
extern int bpf_wq_start(struct bpf_wq *wq, unsigned int flags) __weak __ksym;
extern int bpf_wq_set_callback_impl(struct bpf_wq *wq,
				    int (callback_fn)(void *map, int *key, void *value),
				    unsigned int flags, void *aux__ign) __weak __ksym;

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

/* The workqueue callback: one round of the slot's generation. */
static int ev_work(void *map, int *key, void *value)
{
	struct ev_slot *s = value;
	int r;

	USE_ARENA(arena);
	if (!s->started) {
		u32 __arena *p = ARENA_PTR(u32, s->args.prompt);

		for (u32 i = 0; i < s->args.n_prompt && i < EV_PROMPT_MAX; i++)
			p[i] = s->prompt[i];
		s->started = 1;
	}
	r = gen_run(&s->args);
	if (r == 0 && s->args.status == GEN_MORE) {
		bpf_wq_start(&s->wq, 0);
		return 0;
	}
	/* pos carries the last token generated: the stop token when it stopped */
	ev_record(REC_DONE, r ? (u32)r : (u32)s->args.status, s->args.request, s->args.next);
	__sync_fetch_and_add(&ev_done, 1);
	__sync_lock_test_and_set(&s->state, EV_FREE);
	return 0;
}

/* Initialises every slot's workqueue item with ev_work; run once before attaching. */
SEC("syscall")
int ev_setup(void *ctx)
{
	for (u32 i = 0; i < EV_SLOTS_MAX; i++) {
		u32 k = i;
		struct ev_slot *s = bpf_map_lookup_elem(&ev_slots, &k);

		if (!s)
			return 1;
		if (bpf_wq_init(&s->wq, &ev_slots, 0) || bpf_wq_set_callback_impl(&s->wq, ev_work, 0, 0))
			return 2;
	}
	return 0;
}

struct ev_head {
	u32 magic, request, max_new, n;
};

/* Refuses a datagram: counted, and a record for its request. */
static __always_inline int ev_refuse(u32 reason, u32 request)
{
	if (reason == EV_R_BUSY)
		__sync_fetch_and_add(&ev_refused_busy, 1);
	else
		__sync_fetch_and_add(&ev_refused_invalid, 1);
	ev_record(REC_REFUSED, reason, request, 0);
	return XDP_DROP;
}

SEC("xdp")
int ev_xdp(struct xdp_md *ctx)
{
	u8 hdr[14 + 20 + 8];
	struct ev_head h;
	struct ev_slot *s = 0;
	u32 ihl, off, len, src, dport, bytes, ok = 0, slot = 0;

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
	off = 14 + 20 + 8;
	len = ((u32)hdr[14 + 20 + 4] << 8 | hdr[14 + 20 + 5]); /* UDP length: header + payload */
	if (len < 8 + sizeof(h) || bpf_xdp_load_bytes(ctx, off, &h, sizeof(h)))
		return ev_refuse(EV_R_MALFORMED, 0);
	if (h.magic != EV_MAGIC || len != 8 + sizeof(h) + (u64)h.n * 4)
		return ev_refuse(EV_R_MALFORMED, h.request);
	if (h.n == 0 || h.n > ev_cfg.max_prompt || h.n > EV_PROMPT_MAX || h.max_new == 0 ||
	    h.max_new > ev_cfg.max_new)
		return ev_refuse(EV_R_LIMIT, h.request);
	for (u32 i = 0; i < EV_SLOTS_MAX; i++) {
		u32 k = i;
		struct ev_slot *c;

		if (s || i >= ev_cfg.n_slots)
			break;
		c = bpf_map_lookup_elem(&ev_slots, &k);
		if (c && __sync_val_compare_and_swap(&c->state, EV_FREE, EV_BUSY) == EV_FREE) {
			s = c;
			slot = i;
		}
	}
	if (!s)
		return ev_refuse(EV_R_BUSY, h.request);
	bytes = h.n * 4;
	if (bytes == 0 || bytes > sizeof(s->prompt) || bpf_xdp_load_bytes(ctx, off + sizeof(h), s->prompt, bytes))
		goto malformed;
	for (u32 i = 0; i < EV_PROMPT_MAX; i++) {
		if (i >= h.n)
			break;
		if (s->prompt[i] >= ev_cfg.vocab) {
			__sync_lock_test_and_set(&s->state, EV_FREE);
			return ev_refuse(EV_R_TOKEN, h.request);
		}
	}
	s->args = ev_template[slot & (EV_SLOTS_MAX - 1)];
	s->args.n_prompt = h.n;
	s->args.max_new = h.max_new;
	s->args.request = h.request;
	s->started = 0;
	if (bpf_wq_start(&s->wq, 0)) {
		__sync_lock_test_and_set(&s->state, EV_FREE);
		return ev_refuse(EV_R_BUSY, h.request);
	}
	__sync_fetch_and_add(&ev_accepted, 1);
	return XDP_DROP;
malformed:
	__sync_lock_test_and_set(&s->state, EV_FREE);
	return ev_refuse(EV_R_MALFORMED, h.request);
}
