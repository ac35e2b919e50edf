// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* The XDP side of a kernel event (event.inc.c says what it serves): the datagram's checks, the
 * reply written into the received frame and sent with XDP_TX, polls, claiming a slot and starting
 * its workqueue item. Included by ops.bpf.c right after event.inc.c. */
#pragma once

struct ev_head {
	u32 magic, request, max_new, n;
};

struct ev_poll {
	u32 magic, request, offset;
	u32 cookie_lo, cookie_hi; /* the cookie of the request's ACCEPTED reply */
};

/* SipHash-2-4 (Aumasson and Bernstein) of a 16-byte message m0, m1 under the install's secret.
 * The twin is the standard library's `SipHasher` (tests/network_safety.rs). */
#define SIP_ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))
#define SIP_ROUND(v0, v1, v2, v3)                                                              \
	do {                                                                                   \
		v0 += v1; v1 = SIP_ROTL(v1, 13); v1 ^= v0; v0 = SIP_ROTL(v0, 32);              \
		v2 += v3; v3 = SIP_ROTL(v3, 16); v3 ^= v2;                                     \
		v0 += v3; v3 = SIP_ROTL(v3, 21); v3 ^= v0;                                     \
		v2 += v1; v1 = SIP_ROTL(v1, 17); v1 ^= v2; v2 = SIP_ROTL(v2, 32);              \
	} while (0)

/* SipHash-2-4's state, fed 8-byte blocks: sip_init under a key, sip_block per block (the last
 * block holds the message's length in its top byte and its tail bytes below), sip_final. */
struct sip {
	u64 v0, v1, v2, v3;
};

static __always_inline void sip_init(struct sip *s, const u64 *key)
{
	s->v0 = key[0] ^ 0x736f6d6570736575ULL;
	s->v1 = key[1] ^ 0x646f72616e646f6dULL;
	s->v2 = key[0] ^ 0x6c7967656e657261ULL;
	s->v3 = key[1] ^ 0x7465646279746573ULL;
}

static __always_inline void sip_block(struct sip *s, u64 m)
{
	s->v3 ^= m;
	SIP_ROUND(s->v0, s->v1, s->v2, s->v3);
	SIP_ROUND(s->v0, s->v1, s->v2, s->v3);
	s->v0 ^= m;
}

static __always_inline u64 sip_final(struct sip *s)
{
	s->v2 ^= 0xff;
	for (int i = 0; i < 4; i++)
		SIP_ROUND(s->v0, s->v1, s->v2, s->v3);
	return s->v0 ^ s->v1 ^ s->v2 ^ s->v3;
}

static __always_inline u64 ev_siphash16(u64 m0, u64 m1)
{
	struct sip s;

	sip_init(&s, ev_cfg.secret);
	sip_block(&s, m0);
	sip_block(&s, m1);
	sip_block(&s, (u64)16 << 56); /* the last block: the length, no tail bytes */
	return sip_final(&s);
}

/* A request's server cookie (as DNS cookies, RFC 7873): bound to the client's address and port,
 * its request id and the slot's generation, so only who received the ACCEPTED reply can poll,
 * and a poll for an earlier request of the same id is not this one's. */
static __always_inline u64 ev_cookie(u32 addr, u32 port, u32 request, u32 generation)
{
	return ev_siphash16((u64)addr | (u64)port << 32, (u64)request | (u64)generation << 32);
}

#define EV_HDR (14 + 20 + 8) /* Ethernet, IPv4 without options, UDP */

/* The frame as the reply: `payload` bytes of UDP payload after the headers of the datagram
 * received (`hdr`), with addresses and ports swapped. Returns XDP_TX, or XDP_DROP (counted) when
 * the frame cannot be resized. The payload is written by the caller after this. */
static __always_inline int ev_frame(struct xdp_md *ctx, const u8 *hdr, u32 payload)
{
	u8 out[EV_HDR];
	u32 sum = 0, ip_len = 20 + 8 + payload, udp_len = 8 + payload;
	int cur = bpf_xdp_get_buff_len(ctx);

	if (EV_HDR + payload > (u32)cur) { /* never larger than what asked for it */
		__sync_fetch_and_add(&ev_unanswered, 1);
		return XDP_DROP;
	}
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
		if (reason == EV_R_BUSY || reason == EV_R_SOURCE)
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
		struct ev_slot *c = ev_slot_at(i);
		u32 st;

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
	u32 zero = 0, slot, st, text, n, fin, detail, gen;
	int act;
	struct ev_poll p = {};
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
	/* the generation, then the state, then the identity again: a slot given back and taken by
	 * another request since ev_find is not this request's (the generation would be marked
	 * delivered below, never the new request's) */
	gen = __sync_fetch_and_add(&s->generation, 0);
	st = __sync_fetch_and_add(&s->state, 0);
	if ((st != EV_BUSY && st != EV_DONE) || s->request != p.request || s->client_addr != src ||
	    s->client_port != sport)
		return ev_refuse_as(ctx, hdr, EV_R_UNKNOWN, p.request, 1);
	if (((u64)p.cookie_hi << 32 | p.cookie_lo) != ev_cookie(src, sport, p.request, gen)) {
		__sync_fetch_and_add(&ev_bad_cookie, 1);
		return XDP_DROP;
	}
	s->last_ns = bpf_ktime_get_ns();
	/* the state before the length: a finished slot's length is final */
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
		act = ev_send(ctx, hdr, o, 8, 0);
		if (act == XDP_TX)
			s->delivered = gen;
		return act;
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
		struct ev_slot *c = ev_slot_at(i);

		if (c && __sync_val_compare_and_swap(&c->state, EV_FREE, EV_CLAIMED) == EV_FREE)
			return i;
	}
	if (!(ev_cfg.flags & EV_F_REPLY))
		return EV_SLOTS_MAX;
	for (u32 i = 0; i < EV_SLOTS_MAX; i++) {
		struct ev_slot *c = ev_slot_at(i);
		int stale, delivered;
		u32 st;

		if (!c)
			break;
		stale = now - *(volatile u64 *)&c->last_ns > ev_cfg.timeout_ns;
		st = *(volatile u32 *)&c->state;
		if (st == EV_BUSY && stale)
			c->cancel = 1;
		delivered = *(volatile u32 *)&c->delivered == *(volatile u32 *)&c->generation;
		if (st == EV_DONE && (stale || delivered) &&
		    __sync_val_compare_and_swap(&c->state, EV_DONE, EV_CLAIMED) == EV_DONE) {
			if (stale && !delivered)
				__sync_fetch_and_add(&ev_reclaimed, 1);
			return i;
		}
	}
	return EV_SLOTS_MAX;
}

/* Whether a request from `src` is within its rate (GCRA: a token bucket of ev_cfg's burst
 * refilled one request per rate_ns, kept as the time its next request is due). A lost race
 * against another CPU retries a few times, then counts as over the rate. */
static __always_inline int ev_rate_ok(u32 src)
{
	u64 now = bpf_ktime_get_ns(), *tat, next, due;

	if (!ev_cfg.rate_ns)
		return 1;
	tat = bpf_map_lookup_elem(&ev_rate, &src);
	if (!tat) {
		next = now + ev_cfg.rate_ns;
		if (!bpf_map_update_elem(&ev_rate, &src, &next, BPF_NOEXIST))
			return 1;
		tat = bpf_map_lookup_elem(&ev_rate, &src); /* another CPU made it */
		if (!tat)
			return 0;
	}
	for (int i = 0; i < 4; i++) {
		u64 old = *(volatile u64 *)tat;

		due = old > now ? old : now;
		if (due - now > ev_cfg.rate_tau_ns) /* the bucket is empty */
			return 0;
		if (__sync_val_compare_and_swap(tat, old, due + ev_cfg.rate_ns) == old)
			return 1;
	}
	return 0;
}

/* The slots `src` holds: being claimed, generating, or finished with their FINAL record not yet
 * sent and their client still polling (as ev_claim would not take them). */
static __always_inline u32 ev_held(u32 src)
{
	u64 now = bpf_ktime_get_ns();
	u32 held = 0;

	for (u32 i = 0; i < EV_SLOTS_MAX; i++) {
		struct ev_slot *c = ev_slot_at(i);
		u32 st;

		if (!c)
			break;
		if (*(volatile u32 *)&c->client_addr != src)
			continue;
		st = *(volatile u32 *)&c->state;
		if (st == EV_CLAIMED || st == EV_BUSY ||
		    (st == EV_DONE &&
		     *(volatile u32 *)&c->delivered != *(volatile u32 *)&c->generation &&
		     now - *(volatile u64 *)&c->last_ns <= ev_cfg.timeout_ns))
			held++;
	}
	return held;
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
		slot = ev_find(request, src, sport);
		if (slot < EV_SLOTS_MAX && (s = bpf_map_lookup_elem(&ev_slots, &slot))) {
			/* its cookie goes to the address the request was from, as the first time */
			u64 c = ev_cookie(src, sport, request, *(volatile u32 *)&s->generation);

			__sync_fetch_and_add(&ev_repeats, 1);
			return ev_answer(ctx, hdr, EV_K_ACCEPTED, request, (u32)c, c >> 32);
		}
		s = 0;
	}
	slot = ev_claim();
	if (slot < EV_SLOTS_MAX)
		s = bpf_map_lookup_elem(&ev_slots, &slot);
	if (!s)
		return ev_refuse(EV_R_BUSY, request);
	/* the source's share, counted with this claim marked as its own (an exchange: a full
	 * barrier), so two CPUs claiming for one source at once cannot both pass */
	__sync_lock_test_and_set(&s->client_addr, src);
	if (ev_cfg.per_source && ev_held(src) > ev_cfg.per_source) {
		__sync_lock_test_and_set(&s->state, EV_FREE);
		return ev_refuse(EV_R_SOURCE, request);
	}
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
	s->generation++; /* a late poll's delivery mark of the request before is not this one's */
	s->cancel = 0;
	s->tok_wait = 0;
	s->last_ns = bpf_ktime_get_ns();
	/* the fields before the state (an exchange: a full barrier): polls match on them */
	__sync_lock_test_and_set(&s->state, EV_BUSY);
	if (bpf_wq_start(&s->wq, 0)) {
		__sync_lock_test_and_set(&s->state, EV_FREE);
		return ev_refuse(EV_R_BUSY, request);
	}
	__sync_fetch_and_add(&ev_accepted, 1);
	if (ev_cfg.flags & EV_F_REPLY) {
		u64 c = ev_cookie(src, sport, request, s->generation);

		return ev_answer(ctx, hdr, EV_K_ACCEPTED, request, (u32)c, c >> 32);
	}
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
	u32 ihl, off, len, ip_len, src, dst, sport, dport, bytes, magic, ok = 0, zero = 0;

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
	if ((hdr[14 + 6] & 0x3f) || hdr[14 + 7]) /* a fragment (MF, or an offset): the stack's */
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
	__builtin_memcpy(&dst, &hdr[14 + 16], 4);
	ok = 0;
	for (u32 i = 0; i < EV_DESTS_MAX; i++)
		if (i < ev_cfg.n_dests && ev_cfg.dests[i] == dst)
			ok = 1;
	if (!ok) /* not to this interface's own address (broadcast, multicast, routed through) */
		return XDP_PASS;
	/* ours from here: every path below is counted */
	sport = (u32)hdr[14 + 20 + 0] << 8 | hdr[14 + 20 + 1];
	off = EV_HDR;
	len = ((u32)hdr[14 + 20 + 4] << 8 | hdr[14 + 20 + 5]); /* UDP length: header + payload */
	/* the lengths, measured on the frame: the UDP length is the IPv4 payload's, and the IPv4
	 * total length fits the frame (which may carry Ethernet padding past it). Every reply is
	 * sized from `len`: a forged one would make the server answer more than it was sent. */
	ip_len = (u32)hdr[14 + 2] << 8 | hdr[14 + 3];
	if (len < 8 || ip_len != 20 + len || 14 + ip_len > (u32)bpf_xdp_get_buff_len(ctx)) {
		__sync_fetch_and_add(&ev_refused_invalid, 1);
		__sync_fetch_and_add(&ev_refusals[EV_R_MALFORMED], 1);
		__sync_fetch_and_add(&ev_unanswered, 1);
		return XDP_DROP;
	}
	if ((ev_cfg.flags & EV_F_REPLY) && len >= 8 + 4 && !bpf_xdp_load_bytes(ctx, off, &magic, 4) &&
	    magic == EV_POLL_MAGIC)
		return ev_poll(ctx, hdr, src, sport, len);
	/* a request (or what claims to be one): within its source's rate, or dropped unanswered */
	if (!ev_rate_ok(src)) {
		__sync_fetch_and_add(&ev_rate_limited, 1);
		return XDP_DROP;
	}
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
