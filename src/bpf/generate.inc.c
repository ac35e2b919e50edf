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

/* The array build copies a token's text from its bytes in the vocabulary to the generation's
 * text (`to`) or to a record (`rec`) one byte a step (a QB_EACH walk: it has no can_loop, and a
 * bounded loop costs its verifier every iteration); the arena build keeps its can_loop loops. */
struct gen_copy {
	QB_VEC_T(u8) from;
	QB_VEC_T(u8) to;
	struct gen_token *rec;
};

#ifdef QB_ARRAY_LAYER
static __always_inline int gen_text_step(struct gen_copy *c, u32 i)
{
	QB_IX(u8, c->to, i) = QB_IX(u8, c->from, i);
	return 0;
}
QB_EACH_FN(gen_text_step, struct gen_copy)

static __always_inline int gen_rec_step(struct gen_copy *c, u32 i)
{
	c->rec->text[i & (GEN_TEXT_MAX - 1)] = QB_IX(u8, c->from, i);
	return 0;
}
QB_EACH_FN(gen_rec_step, struct gen_copy)

/* The array build's records (struct gen_token) are written here and copied to the ring buffer
 * (bpf_ringbuf_output): a reserved record is a reference, which a walk's callback cannot hold.
 * Bytes, so that the build's .bss has only the arena build's types (build.rs compares them). */
u8 gen_rec[PLAN_THREADS_MAX][sizeof(struct gen_token)] __attribute__((aligned(8)));
#endif

/* Token id's text (thread 0): its bytes, from the vocabulary in shared memory, appended to
 * a->text when the generation keeps its text there, and a ring-buffer record unless a->quiet.
 * Returns 0, 1 when the ring buffer is full or the vocabulary's or the text's bytes cannot be
 * reached (array build: outside the map or across an element's end), GEN_LENGTH when the text
 * does not fit a->text (nothing of it is written then). */
static __noinline int gen_emit(struct gen_args *a, u32 id, u32 pos)
{
	struct gen_copy c = {};
	struct gen_token *r;
	u64 src = 0;
	u32 len = 0;

	if (a->vocab) {
		u32 o0 = 0, o1 = 0;

		if (QB_LD(u32, arena, a->vocab + (u64)id * 4, &o0) ||
		    QB_LD(u32, arena, a->vocab + (u64)id * 4 + 4, &o1))
			return 1;
		src = a->vocab + o0;
		len = o1 > o0 ? o1 - o0 : 0;
		if (len > GEN_TEXT_MAX)
			len = GEN_TEXT_MAX;
	}
	c.from = QB_VEC(u8, arena, src, len);
	if (len && !QB_VEC_OK(c.from))
		return 1;
	if (a->text) {
		u32 at = a->text_len;

		if (at > a->text_cap || len > a->text_cap - at)
			return GEN_LENGTH;
		c.to = QB_VEC(u8, arena, a->text + at, len);
#ifndef QB_ARRAY_LAYER
		for (u32 i = 0; i < len && can_loop; i++)
			QB_IX(u8, c.to, i) = QB_IX(u8, c.from, i);
#else
		/* (not walked when empty: 6.1 verifies the callback even then, vectors unchecked) */
		if (len && (!QB_VEC_OK(c.to) || QB_EACH(gen_text_step, len, &c)))
			return 1;
#endif
		/* the bytes before their length (a full barrier): a reader on another CPU reads
		 * text_len first and then only bytes below it */
		__sync_fetch_and_add(&a->text_len, len);
	}
	if (a->quiet)
		return 0;
#ifndef QB_ARRAY_LAYER
	r = bpf_ringbuf_reserve(&tokens, sizeof(*r), 0);
	if (!r)
		return 1;
#else
	r = (struct gen_token *)gen_rec[a->run.lane & (PLAN_THREADS_MAX - 1)];
#endif
#ifndef QB_ARRAY_LAYER
	/* bounded by the constant: the verifier may have forgotten len's bound by now */
	for (u32 i = 0; i < GEN_TEXT_MAX && can_loop; i++) {
		if (i >= len)
			break;
		r->text[i] = QB_IX(u8, c.from, i);
	}
#else
	c.rec = r;
	if (len)
		QB_EACH(gen_rec_step, len, &c); /* (len <= GEN_TEXT_MAX: bpf_loop takes it) */
#endif
	r->id = id;
	r->pos = pos;
	r->request = a->request;
	r->len = len;
	r->kind = 0;
	r->pad = 0;
#ifndef QB_ARRAY_LAYER
	bpf_ringbuf_submit(r, 0);
#else
	if (bpf_ringbuf_output(&tokens, r, sizeof(*r), 0))
		return 1;
#endif
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

/* Thread 0's part after each token `id` (`serr`: the draw's error): whether to stop (for every
 * thread: gen_stop of its lane, lane 0 when shared), its text, its count for the penalties. A
 * function of its own to keep gen_run's frame small (the worker's calls nest deep). 0, or
 * PLAN_E_ARGS when the text could not be written or the token not counted. */
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
	if (a->sampling && a->sample.counts) {
		u32 QB *n = QB_SPAN(u32, arena, a->sample.counts + (u64)id * 4, 4);

		if (!QB_SPAN_OK(n))
			return PLAN_E_ARGS;
		*n += 1;
	}
	return 0;
}

/* The two halves of one token's step around its plan run, shared by both builds: the arena's
 * gen_run calls plan_run between them, the array build's walk runs the plan's entries one per
 * step between them (see there). Inlined into the arena's gen_run; on arrays global functions,
 * so that the walk's callback, above the deepest operator chain, keeps a small frame, and so
 * that each is verified once, not once for every path of the walk that reaches it (6.1 takes
 * a global function's pointer as possibly NULL: each checks its own). */
#ifndef QB_ARRAY_LAYER
#define GEN_PART static __always_inline
#else
#define GEN_PART __noinline
#endif

/* Before a token's plan run: the token to feed (the prompt's next, or the last generated) and
 * how much of the plan it needs. 0: go on; 1: stop (the context is full, a->status says so);
 * PLAN_E_ARGS when the prompt cannot be read. */
GEN_PART int gen_begin(struct gen_args *a, struct run_plan_args *st)
{
	u32 prefill, token;

	if (!a || !st)
		return PLAN_E_ARGS;
	prefill = a->fed < a->n_prompt;
	token = a->next;
	if (st->pos >= a->max_ctx) {
		a->status = GEN_FULL;
		return 1;
	}
	if (prefill && QB_LD(u32, arena, a->prompt + (u64)a->fed * 4, &token))
		return PLAN_E_ARGS;
	st->token = token;
	/* a prompt token before the last needs no LM head: its prediction is not wanted */
	st->n_run = prefill && a->fed + 1 < a->n_prompt ? a->run.n_entries - 1 : 0;
	return 0;
}

/* After a token's plan run (t0: when this invocation started): the next token (the head's
 * argmax, or thread 0's draw), its text and the decision to stop, met by every thread at a
 * barrier. 0: go on; 1: stop (a->status says why); < 0: an error (PLAN_E_*, SAMPLE_E_*). */
GEN_PART int gen_end(struct gen_args *a, struct run_plan_args *st, u64 t0)
{
	u32 t, lane, id;
	int serr = 0;

	if (!a || !st)
		return PLAN_E_ARGS;
	t = a->run.thread;
	lane = a->run.lane & (PLAN_THREADS_MAX - 1);
	st->pos++;
	if (a->fed < a->n_prompt && ++a->fed < a->n_prompt)
		return 0;
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
		return 1;
	}
	return 0;
}

/* Before the first token: the arguments checked, this thread's plan state set up. 0: go on;
 * 1: nothing to do (max_new tokens generated already); PLAN_E_ARGS. */
static __always_inline int gen_start(struct gen_args *a, struct run_plan_args *st)
{
	u32 t = a->run.thread;

	/* several threads share one generation on lanes 0..n_threads; one thread may use any lane */
	if (t >= PLAN_THREADS_MAX || a->head_parts == 0 || a->head_parts > a->run.n_threads ||
	    a->n_stops > GEN_STOPS_MAX || (a->run.n_threads > 1 && a->run.lane != t))
		return PLAN_E_ARGS;
	*st = a->run;
	st->passed = 0;
	a->status = 0;
	if (a->generated >= a->max_new) {
		a->status = GEN_MAX;
		return 1;
	}
	return 0;
}

#ifndef QB_ARRAY_LAYER
/* Feeds the rest of the prompt and generates until done or out of time (see the top). */
__noinline int gen_run(struct gen_args *a __arg_nonnull)
{
	struct run_plan_args *st = &gen_state[a->run.lane & (PLAN_THREADS_MAX - 1)];
	u64 t0 = bpf_ktime_get_ns();
	int r;

	USE_ARENA(arena);
	r = gen_start(a, st);
	if (r)
		return r < 0 ? r : 0;
	/* at most one token per position, so max_ctx bounds the loop */
	FOR(i, 0, a->max_ctx) {
		r = gen_begin(a, st);
		if (r)
			break;
		r = plan_run(st);
		if (r)
			return r;
		r = gen_end(a, st, t0);
		if (r)
			break;
	}
	a->run.pos = st->pos;
	return r < 0 ? r : 0;
}
#else
/* The array build: one bpf_loop walk over the tokens' plan entries, one entry a step, with a
 * token's gen_begin before its first entry and gen_end after its last. Not a walk over tokens
 * whose step runs the plan (a walk of its own): the plan's deepest operator chain already
 * takes the 8 frames 6.1 allows below run_plan (its program, the entry callback, six), so
 * generation keeps that shape, its program the entry walk's caller. The state lives in .bss
 * (unknown to the verifier, which 6.1 needs of what a callback reads: see tokenize.inc.c's
 * TOK_EACH), the ctx copied in and out (the ctx takes no atomic operations). */
#define GEN_WALK_MAX (1U << 23) /* bpf_loop's most iterations (BPF_MAX_LOOPS) */

/* Per lane: the generation's ctx (copied in and out), the next entry of the token under way,
 * and when the invocation started. */
struct gen_args gen_ctx[PLAN_THREADS_MAX];
u32 gen_entry[PLAN_THREADS_MAX];
u64 gen_t0[PLAN_THREADS_MAX];
s32 gen_err[PLAN_THREADS_MAX]; /* the error that stopped the walk (0: none) */

/* The walk: its lane. Everything else is found from it, in .bss, whose values the verifier
 * takes as unknown (what 6.1 needs of what a callback reads). */
struct gen_walk {
	u32 lane;
};

#define GEN_LANE(w) ((w)->lane & (PLAN_THREADS_MAX - 1))

/* Before a token's first entry (k: the walk's step). 0: go on; 1: the walk stops. */
static __noinline int gen_walk_begin(u32 lane, u32 k)
{
	struct run_plan_args *st = &gen_state[lane & (PLAN_THREADS_MAX - 1)];
	struct gen_args *a = &gen_ctx[lane & (PLAN_THREADS_MAX - 1)];
	int r;

	/* a token starts only where the walk has the steps to finish it: an invocation ends
	 * between tokens, and the next one goes on from there */
	if (GEN_WALK_MAX - k < st->n_entries) {
		a->status = GEN_MORE;
		return 1;
	}
	r = gen_begin(a, st);
	if (!r)
		r = plan_start(st);
	if (r) {
		gen_err[lane & (PLAN_THREADS_MAX - 1)] = r < 0 ? r : 0;
		return 1;
	}
	return 0;
}

/* After entry gen_entry[lane] ran: the next entry, or the token's end. 0: go on; 1: stop. */
static __noinline int gen_walk_next(u32 lane)
{
	struct run_plan_args *st;
	u32 e;
	int r;

	lane &= PLAN_THREADS_MAX - 1;
	st = &gen_state[lane];
	e = gen_entry[lane] + 1;

	if (e < (st->n_run ? st->n_run : st->n_entries)) {
		gen_entry[lane] = e;
		return 0;
	}
	gen_entry[lane] = 0;
	r = st->ret ? st->ret : gen_end(&gen_ctx[lane], st, gen_t0[lane]);
	if (r) {
		gen_err[lane] = r < 0 || st->ret ? r : 0;
		return 1;
	}
	return 0;
}

/* One step: one plan entry, with the token's start before its first. The callback's own frame
 * stays small (it keeps only w across the operator call): it sits above the deepest chain. */
static __always_inline int gen_step(struct gen_walk *w, u32 k)
{
	if (gen_entry[GEN_LANE(w)] == 0 && gen_walk_begin(w->lane, k))
		return 1;
	if (plan_entry(&gen_state[GEN_LANE(w)], gen_entry[GEN_LANE(w)])) {
		gen_err[GEN_LANE(w)] = PLAN_E_BARRIER;
		return 1;
	}
	return gen_walk_next(w->lane);
}
QB_EACH_FN(gen_step, struct gen_walk)

/* The generation of lane `lane` (its ctx in gen_ctx[lane]). */
static __always_inline int gen_run(u32 lane)
{
	struct gen_walk w = { lane };
	struct gen_args *a = &gen_ctx[lane];
	int r;

	gen_entry[lane] = 0;
	gen_err[lane] = 0;
	gen_t0[lane] = bpf_ktime_get_ns();
	r = gen_start(a, &gen_state[lane]);
	if (r)
		return r < 0 ? r : 0;
	if (QB_EACH(gen_step, GEN_WALK_MAX, &w))
		return PLAN_E_ARGS;
	a->run.pos = gen_state[lane].pos;
	/* every stop sets a status or an error: without either, the walk ran out of steps
	 * (between tokens: see gen_walk_begin), and the next invocation goes on */
	if (!gen_err[lane] && !a->status)
		a->status = GEN_MORE;
	return gen_err[lane];
}
#endif

/* Generation as a syscall program: user space calls it until status is not GEN_MORE. */
SEC("syscall")
int generate(struct gen_args *ctx)
{
#ifndef QB_ARRAY_LAYER
	return gen_run(ctx);
#else
	u32 lane = ctx->run.lane & (PLAN_THREADS_MAX - 1);
	int r;

	gen_ctx[lane] = *ctx;
	r = gen_run(lane); /* (lane < PLAN_THREADS_MAX) */
	*ctx = gen_ctx[lane];
	return r;
#endif
}
