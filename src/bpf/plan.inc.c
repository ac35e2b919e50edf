// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* The plan interpreter: the whole decoder step of one token in one BPF invocation.
 *
 * At open, user space records the forward pass once as a plan in the arena (src/plan.rs): for
 * each thread, one slot per operator run, in order. A slot holds the operator's id, its ctx (the
 * very struct its SEC("syscall") program takes) and up to two patches: the per-token fields,
 * written as field = base + var * mul with var the token or the position (the embedding row,
 * the RoPE table rows, the attention position). run_plan walks one thread's slots: it copies
 * the ctx into that thread's .bss buffer, patches it, calls the operator's global function (the
 * same code the per-operator programs run), copies the ctx back to the slot (outputs such as an
 * argmax included) and, where the plan marks it, meets the other threads at a barrier.
 *
 * Threads: n_threads invocations of run_plan run in parallel on different CPUs, each with its
 * own slots (its rows of a split operator, or a NOP); after every entry marked PLAN_SYNC each
 * one adds 1 to plan_arrivals and waits until all have, so that no operator reads an input
 * before every thread has written its part. The first meeting waits PLAN_START_NS, the others
 * PLAN_BARRIER_NS; a thread that times out sets plan_abort, so that every waiter gives up, and
 * the run fails with PLAN_E_BARRIER instead of spinning until the soft-lockup watchdog fires.
 * User space then runs the token per operator (a token's step rewrites everything it reads). */
#pragma once

#define PLAN_ARGS_WORDS 20 /* u64 words of a slot's ctx (the largest, attention_i8_args: 19) */
#define PLAN_PATCHES 2
#define PLAN_THREADS_MAX 8
#define PLAN_SYNC 1 /* flags: every thread waits here until all have finished this entry */
#define PLAN_HEAD 2 /* flags: the LM head; bits 16..23: word of `best` (u32 index, in u32
		     * units), bits 24..31: word of `best_val` (s64, in u64 units) */
#define PLAN_VAR_TOKEN 0
#define PLAN_VAR_POS 1
#define PLAN_BARRIER_NS 2000000000ULL /* the longest a thread waits for the others: 2 s */
#define PLAN_START_NS 20000000ULL     /* ... at the first barrier, where the others may not have
				       * reached the kernel yet: 20 ms */
#define PLAN_E_BARRIER (-1)           /* run_plan: a barrier timed out */
#define PLAN_E_ARGS (-2)              /* run_plan: bad thread, thread count or plan length */

/* The operators a plan can run, in id order after OP_NOP (0): (ID, program and op_ function
 * name, member of union plan_args). One list makes the ids, the dispatch switch of plan_op and
 * the names the `constants` program reports, which a test compares with src/kernel/plan.rs's
 * OPS (ids and order). */
#define PLAN_OPS(X)                                                                         \
	X(EMBED, embed, embed)                                                              \
	X(RMSNORM, rmsnorm, rmsnorm)                                                        \
	X(QK_NORM_ROPE, qk_norm_rope, qk_norm_rope)                                         \
	X(MATVEC, matvec, matvec)                                                           \
	X(GATE_UP_SWIGLU, gate_up_swiglu, gate_up)                                          \
	X(SWIGLU_VEC, swiglu_vec, swiglu)                                                   \
	X(LM_HEAD_ARGMAX, lm_head_argmax, lm_head)                                          \
	X(ATTENTION, attention, attention)                                                  \
	X(QUANTIZE_X8, quantize_x8, quantize_x)                                             \
	X(QUANTIZE_X16, quantize_x16, quantize_x)                                           \
	X(W4A8_MATVEC, w4a8_matvec, swar_mv)                                                \
	X(W8A16_MATVEC, w8a16_matvec, swar_mv)                                              \
	X(W4A8_LM_HEAD_ARGMAX, w4a8_lm_head_argmax, swar_mv)                                \
	X(W8A16_LM_HEAD_ARGMAX, w8a16_lm_head_argmax, swar_mv)                              \
	X(ATTENTION_I8, attention_i8, attention_i8)

#define PLAN_OP_ID(id, name, member) OP_##id,
enum plan_op_id {
	OP_NOP,
	PLAN_OPS(PLAN_OP_ID)
	OP_COUNT,
};

/* "nop,embed,rmsnorm,...": every id's program name, comma-separated, in id order. */
#define PLAN_OP_NAME(id, name, member) "," #name
#define PLAN_OP_NAMES ("nop" PLAN_OPS(PLAN_OP_NAME))

struct plan_patch {
	u16 off;  /* byte offset of the field in the ctx; size 0: no patch */
	u8 size;  /* 4 or 8 */
	u8 var;   /* PLAN_VAR_TOKEN or PLAN_VAR_POS */
	u32 mul;
	u64 base; /* field = base + var * mul */
};

struct plan_slot {
	u32 op, flags;
	struct plan_patch patch[PLAN_PATCHES];
	u64 args[PLAN_ARGS_WORDS]; /* the operator's ctx; outputs are written back here */
};

union plan_args {
	u64 w[PLAN_ARGS_WORDS];
	struct embed_args embed;
	struct rmsnorm_args rmsnorm;
	struct qk_norm_rope_args qk_norm_rope;
	struct matvec_args matvec;
	struct gate_up_args gate_up;
	struct swiglu_args swiglu;
	struct lm_head_args lm_head;
	struct attention_args attention;
	struct quantize_x_args quantize_x;
	struct swar_mv_args swar_mv;
	struct attention_i8_args attention_i8;
};
_Static_assert(sizeof(union plan_args) == PLAN_ARGS_WORDS * 8, "every ctx fits a plan slot");

/* Each thread's working copy of its current entry's ctx (.bss, so that no stack is spent). */
union plan_args plan_buf[PLAN_THREADS_MAX];
/* Arrivals at the barriers of the current run; user space zeroes it before starting threads. */
u64 plan_arrivals;
/* Set by the first thread whose barrier timed out, so that the others give up at once instead
 * of waiting for it at the next barrier; user space zeroes it before starting threads. */
u32 plan_abort;

struct run_plan_args {
	u64 plan;      /* struct plan_slot [n_threads][n_entries] */
	u32 n_entries, thread, n_threads;
	u32 token, pos;
	u32 best;      /* out: the LM head's argmax over this thread's rows (first on ties) */
	s64 best_val;  /* out: its Q16 logit */
	u64 passed;    /* barriers passed since the threads started (set to 0 before the first) */
	s32 ret;       /* scratch: the first failing entry + 1 */
	u32 lane;      /* which .bss working buffer this run uses: the thread, or for one-thread
			* runs that go on at once (the event path's requests), a slot of its own */
	u32 n_run;     /* entries to run, from the first (0: all); the rest are left to user space */
	u32 pad;
};

static __always_inline int plan_op(u32 op, union plan_args *b)
{
#define PLAN_OP_CASE(id, name, member) \
	case OP_##id: return op_##name(&b->member);
	switch (op) {
	PLAN_OPS(PLAN_OP_CASE)
	default: return 1;
	}
}

/* Writes the slot's per-token fields into b; 1 on a malformed patch. */
static __always_inline int plan_patch(union plan_args *b, const struct plan_slot QB *e,
				      u32 token, u32 pos)
{
	for (int p = 0; p < PLAN_PATCHES; p++) {
		u32 off = e->patch[p].off, size = e->patch[p].size;
		u64 v = e->patch[p].base + (u64)(e->patch[p].var == PLAN_VAR_POS ? pos : token) * e->patch[p].mul;

		if (size == 0)
			continue;
		if (off > sizeof(*b) - 8 || off % size)
			return 1;
		if (size == 8)
			*(u64 *)((u8 *)b + off) = v;
		else if (size == 4)
			*(u32 *)((u8 *)b + off) = (u32)v;
		else
			return 1;
	}
	return 0;
}

/* Arrives at a barrier and waits until `target` arrivals are counted; 1 after `ns`. */
#ifndef QB_ARRAY_LAYER
static __noinline int plan_wait(u64 target, u64 ns)
{
	u64 t0 = bpf_ktime_get_ns();

	__sync_fetch_and_add(&plan_arrivals, 1);
	/* bpf_for runs at most 2^23 iterations (BPF_MAX_LOOPS), hence two loops */
	FOR(j, 0, 1 << 10) {
		FOR(i, 0, 1 << 20) {
			if (*(volatile u32 *)&plan_abort)
				return 1;
			if (*(volatile u64 *)&plan_arrivals >= target)
				return 0;
			if ((i & 255) == 0 && bpf_ktime_get_ns() - t0 > ns) {
				plan_abort = 1;
				return 1;
			}
		}
	}
	return 1;
}
#else
/* The array build (no bpf_for before 6.4): the same two loops as bpf_loop callbacks. */
struct plan_waiter {
	u64 target, ns, t0;
	s32 r; /* 0: all arrived, 1: gave up, 2: still waiting */
};

static int plan_spin_cb(u64 i, void *c)
{
	struct plan_waiter *w = c;

	if (*(volatile u32 *)&plan_abort)
		w->r = 1;
	else if (*(volatile u64 *)&plan_arrivals >= w->target)
		w->r = 0;
	else if ((i & 255) == 0 && bpf_ktime_get_ns() - w->t0 > w->ns)
		w->r = 1, plan_abort = 1;
	return w->r != 2;
}

static int plan_round_cb(u64 j, void *c)
{
	struct plan_waiter *w = c;

	bpf_loop(1 << 20, plan_spin_cb, c, 0);
	return w->r != 2;
}

/* a global function: verified once, not at each of its calls */
__noinline int plan_wait(u64 target, u64 ns)
{
	struct plan_waiter w = { target, ns, bpf_ktime_get_ns(), 2 };

	__sync_fetch_and_add(&plan_arrivals, 1);
	bpf_loop(1 << 10, plan_round_cb, &w, 0);
	return w.r != 0;
}
#endif

/* Entry i of thread a->thread: copy, patch, run, copy back; then the barrier if marked.
 * Returns 1 when a barrier timed out. Over the arena a function of its own, so that few values
 * stay live across the operator call (the whole chain down to the deepest operator shares 512
 * bytes of stack); on arrays the body of the walk's callback (the chain may have 8 frames: the
 * int8 attention's takes six below the program, and the callback is one). A slot that would
 * cross an element's end (array build) fails its entry. */
#ifndef QB_ARRAY_LAYER
static __noinline
#else
static __always_inline
#endif
int plan_entry(struct run_plan_args *a, u32 i)
{
	struct plan_slot QB *e = QB_SPAN(struct plan_slot, arena,
		a->plan + ((u64)a->thread * a->n_entries + i) * sizeof(struct plan_slot),
		sizeof(struct plan_slot));
	union plan_args *b = &plan_buf[a->lane & (PLAN_THREADS_MAX - 1)];
	u32 op, flags;

	if (!QB_SPAN_OK(e)) {
		if (!a->ret)
			a->ret = i + 1;
		return 0; /* (its barrier, if it had one, cannot be known: the threads time out) */
	}
	op = e->op;
	flags = e->flags;
	if (op != OP_NOP && !a->ret) {
		for (int w = 0; w < PLAN_ARGS_WORDS; w++)
			b->w[w] = e->args[w];
		if (plan_patch(b, e, a->token, a->pos) || plan_op(op, b)) {
			a->ret = i + 1;
		} else {
			for (int w = 0; w < PLAN_ARGS_WORDS; w++)
				e->args[w] = b->w[w];
			if (flags & PLAN_HEAD) {
				u32 bw = (flags >> 16) & 0xff, vw = flags >> 24;

				if (bw >= 2 * PLAN_ARGS_WORDS || vw >= PLAN_ARGS_WORDS) {
					a->ret = i + 1;
				} else {
					a->best = ((u32 *)b)[bw];
					a->best_val = (s64)b->w[vw];
				}
			}
		}
	}
	if ((flags & PLAN_SYNC) && a->n_threads > 1) {
		a->passed++;
		return plan_wait(a->passed * a->n_threads, PLAN_BARRIER_NS);
	}
	return 0;
}

#ifdef QB_ARRAY_LAYER
/* The array build walks the entries with bpf_loop: its callback's context. */
struct plan_walk {
	struct run_plan_args *a;
	u32 timed_out;
};

static __always_inline int plan_step(struct plan_walk *w, u32 i)
{
	if (plan_entry(w->a, i)) {
		w->timed_out = 1;
		return 1;
	}
	return 0;
}
QB_EACH_FN(plan_step, struct plan_walk)
#endif

/* One thread's walk through the plan for one token. Returns 0, 1 + the index of the first entry
 * whose operator refused its ctx (the later ones are skipped, their barriers still kept), or a
 * PLAN_E_* code. a->passed counts on from its value at the call. On arrays inlined into its
 * program: a frame less for the operators below. */
/* Before a walk through the plan: its arguments checked and, on the threads' first walk, their
 * first meeting. 0, or a PLAN_E_* code. */
static __always_inline int plan_start(struct run_plan_args *a)
{
	if (a->thread >= a->n_threads || a->n_threads > PLAN_THREADS_MAX || a->n_entries == 0)
		return PLAN_E_ARGS;
	if (a->n_run > a->n_entries)
		return PLAN_E_ARGS;
	a->ret = 0;
	/* The threads meet once before the first entry of a run. A thread that is not in the
	 * kernel yet may be queued behind this one on its CPU (which this one, spinning without
	 * preemption, would never give up), so this wait is short: the run fails fast and user
	 * space runs the step per operator instead. Past it, every thread runs on a CPU of its own
	 * and cannot be preempted, so the later barriers only wait for work. */
	if (a->n_threads > 1 && a->passed == 0) {
		a->passed = 1;
		if (plan_wait(a->n_threads, PLAN_START_NS))
			return PLAN_E_BARRIER;
	}
	return 0;
}

#ifndef QB_ARRAY_LAYER
__noinline int plan_run(struct run_plan_args *a __arg_nonnull)
#else
static __always_inline int plan_run(struct run_plan_args *a)
#endif
{
	int r;

	QB_MEM_USE(arena);
	r = plan_start(a);
	if (r)
		return r;
#ifndef QB_ARRAY_LAYER
	FOR(i, 0, a->n_run ? a->n_run : a->n_entries) {
		if (plan_entry(a, i))
			return PLAN_E_BARRIER;
	}
#else
	{
		struct plan_walk w = { a, 0 };

		if (QB_EACH(plan_step, a->n_run ? a->n_run : a->n_entries, &w))
			return PLAN_E_ARGS;
		if (w.timed_out)
			return PLAN_E_BARRIER;
	}
#endif
	return a->ret;
}

/* The decoder step of one token (ctx->token at ctx->pos) on thread ctx->thread of
 * ctx->n_threads. */
SEC("syscall")
int run_plan(struct run_plan_args *ctx)
{
	ctx->passed = 0;
	return plan_run(ctx);
}
