// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* Generation inside the kernel: one invocation feeds a prompt and then generates tokens, each
 * step the plan of plan.inc.c, greedy (the LM head's argmax) or, with `sampling`, drawn by
 * sample.inc.c's op_sample from the logits the head wrote (thread 0 draws, counts the token for
 * the penalties and hands it to the other threads at the barrier), honouring stop tokens, and writes
 * every new token (id, position and its text bytes) to the `tokens` ring buffer as it is made.
 *
 * An invocation stops at a stop token, after max_new tokens, at a full context, or once it has
 * run budget_ns (so that one invocation stays far below the soft-lockup watchdog on a kernel
 * without preemption); the ctx then holds where it stopped and the next invocation, with the
 * same ctx, continues. With n_threads > 1 every thread runs this loop for its parts of the plan;
 * thread 0 alone decides whether to go on and writes the ring buffer, and the others follow its
 * decision after a barrier, so that all stop after the same token. */
#pragma once

#define GEN_STOPS_MAX 8
#define GEN_TEXT_MAX 256 /* text bytes a token record carries (user space checks the vocabulary) */
#define GEN_MORE 1       /* status: the time budget ran out; call again with the same ctx */
#define GEN_STOP 2       /* a stop token was generated (not written to the ring buffer) */
#define GEN_MAX 3        /* max_new tokens were generated */
#define GEN_FULL 4       /* the context is full */
#define GEN_LENGTH 5     /* the generation's text buffer (gen_args.text) is full */

/* One generated token, as the ring buffer carries it. */
struct gen_token {
	u32 id, pos;   /* the token and the position it will be fed at */
	u32 request;   /* which request made it (the ctx's request field) */
	u32 len;       /* text bytes (0 when no vocabulary is loaded) */
	u32 kind;      /* 0: a token; event.inc.c's REC_DONE, REC_REFUSED: a request's outcome */
	u32 pad;
	u8 text[GEN_TEXT_MAX];
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} tokens SEC(".maps");

struct gen_args {
	struct run_plan_args run; /* plan, n_entries, thread, n_threads; pos: in/out */
	u64 prompt;      /* u32 [n_prompt] token ids (arena) */
	u64 vocab;       /* u32 offsets [vocab + 1], then the bytes (arena); 0: no text */
	u64 budget_ns;   /* the longest one invocation runs before returning GEN_MORE */
	u32 n_prompt;    /* prompt tokens */
	u32 fed;         /* in/out: prompt tokens fed so far */
	u32 max_new;     /* tokens to generate in all */
	u32 generated;   /* in/out: tokens generated so far */
	u32 max_ctx;     /* the KV cache's positions (committed by user space up to what can run) */
	u32 head_parts;  /* threads that take rows of the LM head (their argmaxes are combined) */
	u32 next;        /* in/out: the last token generated, fed next once the prompt is done */
	u32 n_stops;
	u32 stops[GEN_STOPS_MAX];
	u32 request;     /* copied into each record */
	s32 status;      /* out: GEN_* or a negative plan error */
	u64 text;        /* u8 [text_cap] (arena): every token's text bytes appended, for the event
			  * path's replies (event.inc.c); 0: none */
	u32 text_cap;
	u32 text_len;    /* in/out: bytes in text; grows after the bytes are written */
	u32 quiet;       /* 1: no ring-buffer records (nobody reads them) */
	u32 sampling;    /* 0: the argmax; 1: op_sample draws each token (thread 0's `sample`) */
	struct qb_sample_args sample; /* its logits, counts (each token drawn is counted), rng */
};

/* Each thread's plan state while generating, in .bss so that every thread can read the others'
 * head results after the barrier. */
struct run_plan_args gen_state[PLAN_THREADS_MAX];
/* Thread 0's decision after each token (1: stop), read by the others after a barrier; one per
 * lane, since the event path runs several one-thread generations at once. */
u32 gen_stop[PLAN_THREADS_MAX];
/* Thread 0's sampled token, read by the others after the barrier (per lane, as gen_stop). */
u32 gen_pick[PLAN_THREADS_MAX];

/* The argmax over the head parts of every thread (row order, first on ties). */
static __always_inline u32 gen_best(u32 parts)
{
	u32 best = gen_state[0].best;
	s64 val = gen_state[0].best_val;

	for (int t = 1; t < PLAN_THREADS_MAX; t++) {
		if (t < parts && gen_state[t].best_val > val) {
			val = gen_state[t].best_val;
			best = gen_state[t].best;
		}
	}
	return best;
}

/* Token id's text (thread 0): its bytes, from the arena vocabulary, appended to a->text when
 * the generation keeps its text there, and a ring-buffer record unless a->quiet. Returns 0, 1
 * when the ring buffer is full, GEN_LENGTH when the text does not fit a->text (nothing of it is
 * written then). */
static __noinline int gen_emit(struct gen_args *a, u32 id, u32 pos)
{
	const u8 __arena *bytes = 0;
	struct gen_token *r;
	u32 len = 0;

	if (a->vocab) {
		const u32 __arena *off = ARENA_PTR(const u32, a->vocab);
		u32 o0 = off[id], o1 = off[id + 1];

		bytes = ARENA_PTR(const u8, a->vocab + o0);
		len = o1 > o0 ? o1 - o0 : 0;
		if (len > GEN_TEXT_MAX)
			len = GEN_TEXT_MAX;
	}
	if (a->text) {
		u32 at = a->text_len;
		u8 __arena *dst = ARENA_PTR(u8, a->text + at);

		if (at > a->text_cap || len > a->text_cap - at)
			return GEN_LENGTH;
		for (u32 i = 0; i < len && can_loop; i++)
			dst[i] = bytes[i];
		/* the bytes before their length (a full barrier): a reader on another CPU reads
		 * text_len first and then only bytes below it */
		__sync_fetch_and_add(&a->text_len, len);
	}
	if (a->quiet)
		return 0;
	r = bpf_ringbuf_reserve(&tokens, sizeof(*r), 0);
	if (!r)
		return 1;
	/* bounded by the constant: the verifier may have forgotten len's bound by now */
	for (u32 i = 0; i < GEN_TEXT_MAX && can_loop; i++) {
		if (i >= len)
			break;
		r->text[i] = bytes[i];
	}
	r->id = id;
	r->pos = pos;
	r->request = a->request;
	r->len = len;
	r->kind = 0;
	r->pad = 0;
	bpf_ringbuf_submit(r, 0);
	return 0;
}

/* Thread 0: whether to stop after generating `id`; sets a->status. */
static __always_inline int gen_done(struct gen_args *a, u32 id, u64 t0)
{
	for (int i = 0; i < GEN_STOPS_MAX; i++) {
		if (i < a->n_stops && a->stops[i] == id) {
			a->status = GEN_STOP;
			return 1;
		}
	}
	if (a->generated >= a->max_new) {
		a->status = GEN_MAX;
		return 1;
	}
	if (a->run.pos >= a->max_ctx) {
		a->status = GEN_FULL;
		return 1;
	}
	if (bpf_ktime_get_ns() - t0 > a->budget_ns) {
		a->status = GEN_MORE;
		return 1;
	}
	return 0;
}

/* Feeds the rest of the prompt and generates until done or out of time (see the top). */
/* Thread 0's part after each token `id` (`serr`: the draw's error): whether to stop (for every
 * thread: gen_stop of its lane, lane 0 when shared), its text, its count for the penalties. A
 * function of its own to keep gen_run's frame small (the worker's calls nest deep). 0, or
 * PLAN_E_ARGS when the text could not be written. */
static __noinline int gen_take(struct gen_args *a, u32 id, u32 pos, u64 t0, int serr)
{
	u32 lane = a->run.lane & (PLAN_THREADS_MAX - 1);
	int r;

	gen_stop[lane] = serr || gen_done(a, id, t0); /* a failed draw stops every thread */
	if (serr) {
		a->status = serr;
	} else if (a->status != GEN_STOP) {
		r = gen_emit(a, id, pos);
		if (r == GEN_LENGTH) {
			a->status = GEN_LENGTH;
			gen_stop[lane] = 1;
		} else if (r) {
			return PLAN_E_ARGS;
		}
	}
	if (a->sampling && a->sample.counts)
		ARENA_PTR(u32, a->sample.counts)[id] += 1;
	return 0;
}

__noinline int gen_run(struct gen_args *a __arg_nonnull)
{
	u32 t = a->run.thread, lane = a->run.lane & (PLAN_THREADS_MAX - 1);
	struct run_plan_args *st = &gen_state[lane];
	u64 t0 = bpf_ktime_get_ns();
	int r, serr = 0;

	USE_ARENA(arena);
	/* several threads share one generation on lanes 0..n_threads; one thread may use any lane */
	if (a->run.thread >= PLAN_THREADS_MAX || a->head_parts == 0 ||
	    a->head_parts > a->run.n_threads || a->n_stops > GEN_STOPS_MAX ||
	    (a->run.n_threads > 1 && a->run.lane != t))
		return PLAN_E_ARGS;
	*st = a->run;
	st->passed = 0;
	a->status = 0;
	if (a->generated >= a->max_new) {
		a->status = GEN_MAX;
		return 0;
	}
	/* at most one token per position, so max_ctx bounds the loop */
	FOR(i, 0, a->max_ctx) {
		const u32 __arena *prompt = ARENA_PTR(const u32, a->prompt);
		u32 prefill = a->fed < a->n_prompt, id;

		if (st->pos >= a->max_ctx) {
			a->status = GEN_FULL;
			break;
		}
		st->token = prefill ? prompt[a->fed] : a->next;
		/* a prompt token before the last needs no LM head: its prediction is not wanted */
		st->n_run = prefill && a->fed + 1 < a->n_prompt ? a->run.n_entries - 1 : 0;
		r = plan_run(st);
		if (r)
			return r;
		st->pos++;
		if (prefill && ++a->fed < a->n_prompt)
			continue;
		/* the step's argmax is the next token */
		id = a->run.n_threads > 1 ? gen_best(a->head_parts) : st->best;
		if (a->sampling && t == 0) {
			/* thread 0 draws; the others take its token after the barrier */
			serr = op_sample(&a->sample);
			id = a->sample.token;
			gen_pick[lane] = id;
		}
		a->next = id;
		a->generated++;
		a->run.pos = st->pos;
		if (t == 0 && gen_take(a, id, st->pos, t0, serr))
			return PLAN_E_ARGS;
		if (a->run.n_threads > 1) {
			st->passed++;
			if (plan_wait(st->passed * a->run.n_threads, PLAN_BARRIER_NS))
				return PLAN_E_BARRIER;
			if (a->sampling && t != 0)
				a->next = *(volatile u32 *)&gen_pick[(lane - t) & (PLAN_THREADS_MAX - 1)];
		}
		if (serr)
			return serr;
		/* thread 0's decision: its lane is lane - t */
		if (*(volatile u32 *)&gen_stop[(lane - t) & (PLAN_THREADS_MAX - 1)]) {
			if (t != 0)
				a->status = GEN_MORE; /* thread 0's ctx says why */
			break;
		}
	}
	a->run.pos = st->pos;
	return 0;
}

/* Generation as a syscall program: user space calls it until status is not GEN_MORE. */
SEC("syscall")
int generate(struct gen_args *ctx)
{
	return gen_run(ctx);
}
