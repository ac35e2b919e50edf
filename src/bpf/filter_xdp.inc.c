// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* The packet filter's packet side (after filter.inc.c, whose maps, slots and workers it uses):
 * flt_xdp, which matches a packet to the rule and gives it a verdict, its TCP reading
 * (flt_tcp, flt_segment) and flt_egress, the tc program that sees the server's SYN-ACKs. */
#pragma once

/* ---- TCP: a flow is read from its handshake on, its text judged as a whole ----
 *
 * A SYN is remembered in flt_syns (its sequence number); the server's SYN-ACK, seen leaving by
 * flt_egress (tc, egress of the same interface), adds the server's. The client's ACK of exactly
 * that number (which a sender that cannot see the SYN-ACK cannot give) makes the flow an
 * flt_flows entry, FLT_OPEN. Only then are its bytes read: in order (a segment past the next
 * expected byte is dropped, and TCP sends it again), with a valid checksum (else dropped, never
 * read), into a classification slot (at most per_source per source address). With first_line,
 * a segment that neither ends the line nor ends a write passes to the server; without it, none
 * that brings text does. The one that completes the text (`bytes` read, or with first_line its
 * line ended), that ends a write (PSH), or any without first_line, is held:
 * dropped while the flow is judged on all its text so far, so that TCP sends it again to meet
 * the verdict, and only with the bytes that were judged (a keyed hash of them is kept). A pass
 * verdict on a text not yet whole lets the flow read on, to be judged again on more. Data with
 * no handshake seen (a flow older than the rule, a spoofed segment, data in a SYN) meets the
 * pending policy. Once judged, a flow keeps its verdict for its life: later requests on a
 * keep-alive connection are not read. */

/* A TCP segment as flt_xdp parsed it. */
struct flt_pkt {
	struct flt_key key;
	u8 th[20];                      /* the TCP header's first 20 bytes */
	u32 l4, thlen, len;             /* the header's offset in the frame, its length; the payload's */
	u64 now;
};

static __always_inline u32 flt_be32(const u8 *p)
{
	return (u32)p[0] << 24 | (u32)p[1] << 16 | (u32)p[2] << 8 | p[3];
}

/* The TCP checksum of the segment in b[0, n) (header and payload) with the IPv4 pseudo-header
 * of saddr, daddr (network order): 1 when it is valid. */
static __noinline int flt_csum_ok(const u8 *b, u32 n, u32 saddr, u32 daddr)
{
	u64 sum = 0;

	if (n > FLT_SEG_MAX)
		return 0;
	/* open-coded iterators: the verifier checks each body once, not once per position */
	FOR(k, 0, n / 2)
		sum += (u32)b[(2 * k) & (FLT_SEG_MAX - 1)] << 8 | b[(2 * k + 1) & (FLT_SEG_MAX - 1)];
	if (n & 1)
		sum += (u32)b[(n - 1) & (FLT_SEG_MAX - 1)] << 8;
	saddr = __builtin_bswap32(saddr); /* network order to host (x86 and arm64: little endian) */
	daddr = __builtin_bswap32(daddr);
	sum += (saddr >> 16) + (saddr & 0xffff) + (daddr >> 16) + (daddr & 0xffff) + 6 + n;
	for (int k = 0; k < 4; k++)
		sum = (sum & 0xffff) + (sum >> 16);
	return sum == 0xffff;
}

/* SipHash-2-4 (event_xdp.inc.c's sip_*) of b[lo, lo + n) under the rule's hash key
 * (n <= FLT_SEG_MAX). */
static __noinline u64 flt_hash(const u8 *b, u32 lo, u32 n)
{
	u64 m, last = (u64)n << 56;
	u32 i = n / 8 * 8;
	struct sip s;

	if (n > FLT_SEG_MAX)
		return 0;
	sip_init(&s, flt_cfg.hash_key);
	FOR(k, 0, n / 8) {
		m = 0;
		for (u32 j = 0; j < 8; j++)
			m |= (u64)b[(lo + 8 * k + j) & (FLT_SEG_MAX - 1)] << (8 * j);
		sip_block(&s, m);
	}
	for (u32 j = 0; j < 7; j++)
		if (i + j < n)
			last |= (u64)b[(lo + i + j) & (FLT_SEG_MAX - 1)] << (8 * j);
	sip_block(&s, last);
	return sip_final(&s);
}

/* Whether `dport` (host order) is one of the rule's ports. */
static __always_inline int flt_port_ok(u32 dport)
{
	int ok = 0;

	for (u32 i = 0; i < FLT_PORTS_MAX; i++)
		if (i < flt_cfg.n_ports && flt_cfg.ports[i] == dport)
			ok = 1;
	return ok;
}

/* A packet meets the verdict of label l (< FLT_LABELS_MAX): counted under it; whether its
 * action drops. */
static __always_inline int flt_label_drops(u32 l)
{
	l &= FLT_LABELS_MAX - 1;
	__sync_fetch_and_add(&flt_label_packets[l], 1);
	return flt_cfg.labels[l].action == FLT_DROP;
}

/* Slots held by source address `src` (claimed, reading, classifying). */
static __always_inline u32 flt_held(u32 src)
{
	u32 held = 0;

	for (u32 i = 0; i < FLT_SLOTS_MAX; i++) {
		u32 k = i;
		struct flt_slot *c = bpf_map_lookup_elem(&flt_slots, &k);

		if (!c || i >= flt_cfg.n_slots)
			break;
		if (*(volatile u32 *)&c->state != EV_FREE && *(volatile u32 *)&c->key.saddr == src)
			held++;
	}
	return held;
}

/* A slot for a TCP flow's text (flt_take_slot), keyed to it: FLT_NO_SLOT when none is free or
 * the source holds per_source already (counted). */
static __noinline u32 flt_claim(const struct flt_key *key, u64 now)
{
	u32 slot = flt_take_slot(now);
	struct flt_slot *s = slot == FLT_NO_SLOT ? 0 : bpf_map_lookup_elem(&flt_slots, &slot);

	if (!s)
		return FLT_NO_SLOT;
	/* marked as the source's before counting: two CPUs claiming for one source see both */
	__sync_lock_test_and_set(&s->key.saddr, key->saddr);
	if (flt_cfg.per_source && flt_held(key->saddr) > flt_cfg.per_source) {
		__sync_lock_test_and_set(&s->state, EV_FREE);
		__sync_fetch_and_add(&flt_source_busy, 1);
		return FLT_NO_SLOT;
	}
	s->key = *key;
	s->tcp = 1;
	s->t0 = now;
	s->w.n_payload = 0;
	return slot;
}

/* The overflow policy for a TCP flow that has no slot: with `pass` the flow passes unread from
 * now on (FLT_JUDGED under no label's action: flt_overflow counts its packets); with `drop`
 * this segment is dropped and the flow tries again when TCP sends it again. */
static __always_inline int flt_tcp_overflow(struct flt_flow *f, int lost)
{
	__sync_fetch_and_add(&flt_overflow, 1);
	if (flt_cfg.overflow == FLT_DROP && !lost)
		return flt_policy(FLT_DROP);
	/* passed unread, or its text lost: every later segment meets the overflow policy */
	f->label = FLT_LABELS_MAX;
	f->slot = FLT_NO_SLOT;
	f->state = FLT_JUDGED;
	return flt_policy(flt_cfg.overflow);
}

/* A payload segment of an open or judged-pass TCP flow: the held segment's bytes checked, new
 * bytes in order read into the flow's slot, the segment held when it completes the text or
 * ends a write. `th`: its TCP header (20 bytes), thlen bytes long at offset l4 of the frame. */
static __noinline int flt_segment(struct xdp_md *ctx, const struct flt_pkt *p, struct flt_flow *f)
{
	const struct flt_key *key = &p->key;
	const u8 *th = p->th;
	u32 thlen = p->thlen, len = p->len;
	u64 now = p->now;
	u32 seq = flt_be32(th + 4), end = seq + len, next = f->isn + 1 + f->acc;
	u32 open = f->state == FLT_OPEN, zero = 0, slot, take, d, n, line = 0, claimed = 0;
	int held = f->held_hi != f->held_lo && (s32)(seq - f->held_hi) < 0 &&
		   (s32)(end - f->held_lo) > 0;
	int fresh = open && (s32)(next - seq) >= 0 && (s32)(end - next) > 0;
	struct flt_seg *b;
	struct flt_slot *s;

	if (open && (s32)(seq - next) > 0) {
		__sync_fetch_and_add(&flt_out_of_order, 1);
		return flt_policy(FLT_DROP);
	}
	if (!held && !fresh)
		return XDP_PASS; /* bytes before the text's end that were let through already */
	b = bpf_map_lookup_elem(&flt_scratch, &zero);
	n = thlen + len;
	if (!b || n > FLT_SEG_MAX ||
	    bpf_xdp_load_bytes(ctx, p->l4, b->b, n = QB_LEN(n, FLT_SEG_MAX, bad)) ||
	    !flt_csum_ok(b->b, n, key->saddr, key->daddr)) {
bad:
		__sync_fetch_and_add(&flt_bad_checksum, 1);
		return flt_policy(FLT_DROP);
	}
	if (held && ((s32)(seq - f->held_lo) > 0 || (s32)(end - f->held_hi) < 0 ||
		     flt_hash(b->b, thlen + (f->held_lo - seq), f->held_hi - f->held_lo) !=
			     f->held_hash)) {
		__sync_fetch_and_add(&flt_mismatch, 1);
		return flt_policy(FLT_DROP);
	}
	if (!fresh)
		return XDP_PASS;
	/* the new bytes, into the flow's slot */
	slot = f->slot;
	if (slot == FLT_NO_SLOT) {
		slot = flt_claim(key, now);
		if (slot == FLT_NO_SLOT)
			return flt_tcp_overflow(f, f->acc != 0);
		claimed = 1;
	}
	s = bpf_map_lookup_elem(&flt_slots, &slot);
	/* a claim is the flow's only if no other CPU gave it one meanwhile */
	if (claimed && s && __sync_val_compare_and_swap(&f->slot, FLT_NO_SLOT, slot) != FLT_NO_SLOT) {
		__sync_lock_test_and_set(&s->state, EV_FREE);
		return flt_policy(FLT_DROP);
	}
	if (!s)
		return flt_tcp_overflow(f, 1);
	if (!claimed) {
		/* the flow's slot, unless it was taken back: then its text is lost */
		d = __sync_val_compare_and_swap(&s->state, FLT_ACCUM, EV_CLAIMED);
		/* another CPU reads this flow now, or has just started judging it: TCP sends this
		 * again, to meet the reading's next byte or the verdict */
		if (d == EV_CLAIMED || d == EV_BUSY)
			return flt_policy(FLT_DROP);
		if (d != FLT_ACCUM)
			return flt_tcp_overflow(f, 1);
		if (s->key.saddr != key->saddr || s->key.sport != key->sport ||
		    s->key.daddr != key->daddr || s->key.dport != key->dport) {
			__sync_lock_test_and_set(&s->state, FLT_ACCUM);
			return flt_tcp_overflow(f, 1);
		}
		/* the slot held: read again what another CPU may have added before the claim */
		if (f->isn + 1 + f->acc != next) {
			__sync_lock_test_and_set(&s->state, FLT_ACCUM);
			return flt_policy(FLT_DROP);
		}
	}
	d = next - seq;
	take = len - d;
	if (f->acc >= flt_cfg.bytes) /* never: a whole text is judged for good */
		take = 0;
	else if (take > flt_cfg.bytes - f->acc)
		take = flt_cfg.bytes - f->acc;
	FOR(i, 0, take) {
		u8 c = b->b[(thlen + d + i) & (FLT_SEG_MAX - 1)];

		s->w.payload[(f->acc + i) & (FLT_BYTES_MAX - 1)] = c;
		if (c == '\r' || c == '\n')
			line = 1;
	}
	f->acc += take;
	s->w.n_payload = f->acc;
	s->t0 = now;
	f->complete = f->acc >= flt_cfg.bytes || (flt_cfg.first_line && line);
	/* Without first_line every segment that brings text is held and judged on the text so far:
	 * a sender may leave PSH off, and a server acts on what it has read, not on PSH. */
	if (!f->complete && !(th[13] & TCP_PSH) && flt_cfg.first_line) {
		__sync_lock_test_and_set(&s->state, FLT_ACCUM);
		return XDP_PASS;
	}
	/* held: judged on the text so far; TCP sends it again to meet the verdict */
	f->held_lo = next;
	f->held_hi = next + take;
	f->held_hash = flt_hash(b->b, thlen + d, take);
	f->time_ns = now;
	f->state = FLT_PENDING;
	flt_begin(&s->w, slot);
	__sync_lock_test_and_set(&s->state, EV_BUSY);
	if (bpf_wq_start(&s->wq, 0)) {
		bpf_map_delete_elem(&flt_flows, key);
		__sync_lock_test_and_set(&s->state, EV_FREE);
		__sync_fetch_and_add(&flt_errors, 1);
		return flt_policy(FLT_DROP);
	}
	__sync_fetch_and_add(&flt_started, 1);
	__sync_fetch_and_add(&flt_pending_packets, 1);
	return flt_policy(FLT_DROP);
}

/* A SYN's sequence number remembered (a leaf: its frame is not on flt_segment's chain). */
static __noinline void flt_syn_seen(const struct flt_key *key, u32 isn)
{
	struct flt_syn n = { .state = FLT_SYN, .isn = isn };

	bpf_map_update_elem(&flt_syns, key, &n, BPF_ANY);
}

/* A flow whose handshake completed, entered in the flow table (FLT_OPEN). */
static __noinline void flt_open(const struct flt_key *key, u32 isn, u64 now)
{
	struct flt_flow n = { .time_ns = now, .state = FLT_OPEN, .isn = isn, .slot = FLT_NO_SLOT };

	bpf_map_update_elem(&flt_flows, key, &n, BPF_ANY);
	bpf_map_delete_elem(&flt_syns, key);
}

/* A TCP segment of the rule's ports and sources (see above). */
static __noinline int flt_tcp(struct xdp_md *ctx, struct flt_pkt *p)
{
	const struct flt_key *key = &p->key;
	const u8 *th = p->th;
	u32 flags = th[13], seq = flt_be32(th + 4), ack = flt_be32(th + 8), l, len = p->len;
	u64 now = p->now = bpf_ktime_get_ns();
	struct flt_flow *f;
	struct flt_syn *h;

	if (flags & TCP_SYN) {
		if (len) { /* data in a SYN (TCP Fast Open) would reach the server unread */
			__sync_fetch_and_add(&flt_untracked, 1);
			return flt_policy(FLT_DROP);
		}
		if (!(flags & TCP_ACK))
			flt_syn_seen(key, seq);
		__sync_fetch_and_add(&flt_bare, 1);
		return XDP_PASS;
	}
	f = bpf_map_lookup_elem(&flt_flows, key);
	if (!f) {
		h = bpf_map_lookup_elem(&flt_syns, key);
		if (!h || h->state != FLT_SYNACK || !(flags & TCP_ACK) || ack != h->srv_isn + 1 ||
		    seq != h->isn + 1) {
			if (!len) {
				__sync_fetch_and_add(&flt_bare, 1);
				return XDP_PASS;
			}
			__sync_fetch_and_add(&flt_untracked, 1);
			__sync_fetch_and_add(&flt_pending_packets, 1);
			return flt_policy(flt_cfg.pending);
		}
		/* the handshake, whole: the flow is read from here */
		flt_open(key, h->isn, now);
		f = bpf_map_lookup_elem(&flt_flows, key);
		if (!f)
			return flt_policy(flt_cfg.pending);
	}
	switch (*(volatile u32 *)&f->state) {
	case FLT_JUDGED:
		l = f->label;
		if (l >= FLT_LABELS_MAX) { /* passed unread: the overflow policy */
			__sync_fetch_and_add(&flt_overflow, 1);
			return flt_policy(flt_cfg.overflow);
		}
		if (flt_label_drops(l))
			return flt_policy(FLT_DROP);
		return len ? flt_segment(ctx, p, f) : XDP_PASS;
	case FLT_OPEN:
		if (!len) {
			__sync_fetch_and_add(&flt_bare, 1);
			return XDP_PASS;
		}
		return flt_segment(ctx, p, f);
	default:
		__sync_fetch_and_add(&flt_pending_packets, 1);
		return flt_policy(flt_cfg.pending);
	}
}

#ifndef TC_ACT_OK
#define TC_ACT_OK 0
#endif

/* The server's SYN-ACKs, seen leaving the rule's interface: the server's initial sequence
 * number of each handshake flt_syns holds. Passes every packet. */
SEC("tc")
int flt_egress(struct __sk_buff *skb)
{
	u8 h[14 + 20];
	u8 t[20];
	struct flt_key key = {};
	struct flt_syn *s;
	u32 ihl;

	if (flt_cfg.proto != 6 || skb->ifindex != flt_cfg.ifindex)
		return TC_ACT_OK;
	if (bpf_skb_load_bytes(skb, 0, h, sizeof(h)))
		return TC_ACT_OK;
	if (h[12] != 0x08 || h[13] != 0x00 || (h[14] >> 4) != 4 || h[14 + 9] != 6)
		return TC_ACT_OK;
	ihl = (h[14] & 15) * 4;
	if (ihl < 20 || ihl > 60 || bpf_skb_load_bytes(skb, 14 + ihl, t, sizeof(t)))
		return TC_ACT_OK;
	if ((t[13] & (TCP_SYN | TCP_ACK)) != (TCP_SYN | TCP_ACK))
		return TC_ACT_OK;
	/* the client's flow: the reply's addresses and ports swapped */
	__builtin_memcpy(&key.saddr, &h[14 + 16], 4);
	__builtin_memcpy(&key.daddr, &h[14 + 12], 4);
	__builtin_memcpy(&key.sport, &t[2], 2);
	__builtin_memcpy(&key.dport, &t[0], 2);
	key.proto = 6;
	s = bpf_map_lookup_elem(&flt_syns, &key);
	if (s && s->state != 0 && flt_be32(t + 8) == s->isn + 1) {
		s->srv_isn = flt_be32(t + 4);
		s->state = FLT_SYNACK;
	}
	return TC_ACT_OK;
}

/* An IPv4 fragment (offset or more-fragments set) from a source the rule covers; `h`: the frame's
 * Ethernet and IPv4 headers (ihl, tot as flt_xdp read them). The first fragment carries the
 * ports: its flow's verdict (a UDP one younger than the TTL; for TCP only a drop, since no
 * fragment's bytes can be checked) or the pending policy, remembered for the datagram's later
 * fragments, which get the same. */
static __noinline int flt_fragment(struct xdp_md *ctx, const u8 *h, u32 ihl, u32 tot)
{
	struct flt_frag_key k = {};
	struct flt_key key = {};
	struct flt_flow *f;
	u32 *seen, l = FLT_FRAG_PENDING;
	u8 ports[4];

	__builtin_memcpy(&k.saddr, &h[14 + 12], 4);
	__builtin_memcpy(&k.daddr, &h[14 + 16], 4);
	__builtin_memcpy(&k.id, &h[14 + 4], 2);
	k.proto = flt_cfg.proto;
	if ((h[14 + 6] & 0x1f) || h[14 + 7]) {
		/* a later fragment: what its datagram's first met, if it was seen */
		seen = bpf_map_lookup_elem(&flt_frags, &k);
		if (seen)
			l = *seen;
	} else {
		/* the first: its ports */
		if (tot < ihl + 4 || bpf_xdp_load_bytes(ctx, 14 + ihl, ports, 4))
			return XDP_PASS; /* no room for ports: the stack drops it */
		if (flt_port_ok((u32)ports[2] << 8 | ports[3])) {
			key.saddr = k.saddr, key.daddr = k.daddr, key.proto = k.proto;
			__builtin_memcpy(&key.sport, &ports[0], 2);
			__builtin_memcpy(&key.dport, &ports[2], 2);
			f = bpf_map_lookup_elem(&flt_flows, &key);
			if (f && f->state == FLT_JUDGED && f->label < FLT_LABELS_MAX &&
			    (flt_cfg.proto == 6 ? flt_cfg.labels[f->label & (FLT_LABELS_MAX - 1)].action ==
						      FLT_DROP
						: bpf_ktime_get_ns() - f->time_ns < flt_cfg.ttl_ns))
				l = f->label;
		} else {
			l = FLT_FRAG_OTHER;
		}
		bpf_map_update_elem(&flt_frags, &k, &l, BPF_ANY);
	}
	if (l == FLT_FRAG_OTHER)
		return XDP_PASS;
	__sync_fetch_and_add(&flt_packets, 1);
	__sync_fetch_and_add(&flt_fragments, 1);
	if (l < FLT_LABELS_MAX)
		return flt_label_drops(l) ? flt_policy(FLT_DROP) : XDP_PASS;
	__sync_fetch_and_add(&flt_pending_packets, 1);
	return flt_policy(flt_cfg.pending);
}

SEC("xdp")
int flt_xdp(struct xdp_md *ctx)
{
	u8 h[14 + 20];
	struct flt_pkt p = {};          /* the flow's key, the L4 header's first 20 bytes */
	struct flt_flow *f;
	u32 ihl, tot, l4len, dport, ok, off, len;
	u64 now;

	if (ctx->ingress_ifindex != flt_cfg.ifindex)
		return XDP_PASS;
	if (bpf_xdp_load_bytes(ctx, 0, h, sizeof(h)))
		return XDP_PASS;
	/* IPv4 (loopback carries a zero Ethernet header) of the rule's protocol */
	if (h[12] != 0x08 || h[13] != 0x00 || (h[14] >> 4) != 4 || h[14 + 9] != flt_cfg.proto)
		return XDP_PASS;
	ihl = (h[14] & 15) * 4;
	tot = (u32)h[14 + 2] << 8 | h[14 + 3];
	if (ihl < 20 || tot < ihl || 14 + tot > bpf_xdp_get_buff_len(ctx))
		return XDP_PASS; /* not a well-formed IPv4 packet: the stack drops it */
	__builtin_memcpy(&p.key.saddr, &h[14 + 12], 4);
	__builtin_memcpy(&p.key.daddr, &h[14 + 16], 4);
	ok = flt_cfg.n_sources == 0;
	for (u32 i = 0; i < FLT_SOURCES_MAX; i++)
		if (i < flt_cfg.n_sources && (p.key.saddr & flt_cfg.src_mask[i]) == flt_cfg.src_net[i])
			ok = 1;
	if (!ok)
		return XDP_PASS;
	if ((h[14 + 6] & 0x3f) || h[14 + 7])
		return flt_fragment(ctx, h, ihl, tot);
	l4len = flt_cfg.proto == 6 ? 20 : 8;
	if (tot < ihl + l4len || bpf_xdp_load_bytes(ctx, 14 + ihl, p.th, l4len))
		return XDP_PASS;
	dport = (u32)p.th[2] << 8 | p.th[3];
	if (!flt_port_ok(dport))
		return XDP_PASS;
	if (flt_cfg.proto == 6) {
		l4len = (p.th[12] >> 4) * 4; /* the TCP header's data offset */
		if (l4len < 20 || tot < ihl + l4len)
			return XDP_PASS;
	}
	__sync_fetch_and_add(&flt_packets, 1);
	__builtin_memcpy(&p.key.sport, &p.th[0], 2);
	__builtin_memcpy(&p.key.dport, &p.th[2], 2);
	p.key.proto = flt_cfg.proto;
	if (flt_cfg.proto == 6) {
		p.l4 = 14 + ihl;
		p.thlen = l4len;
		p.len = tot - ihl - l4len;
		return flt_tcp(ctx, &p);
	}
	now = bpf_ktime_get_ns();
	f = bpf_map_lookup_elem(&flt_flows, &p.key);
	if (f && f->state == FLT_JUDGED && now - f->time_ns < flt_cfg.ttl_ns)
		return flt_label_drops(f->label) ? flt_policy(FLT_DROP) : XDP_PASS;
	if (f && f->state == FLT_PENDING && now - f->time_ns < flt_cfg.pending_ns) {
		__sync_fetch_and_add(&flt_pending_packets, 1);
		return flt_policy(flt_cfg.pending);
	}
	off = 14 + ihl + l4len;
	len = tot - ihl - l4len;
	if (len == 0) {
		__sync_fetch_and_add(&flt_bare, 1);
		return XDP_PASS;
	}
	return flt_start(ctx, &p.key, off, len);
}
