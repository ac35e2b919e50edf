// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* Conventions shared by every qwen_bpf program: types, the arena, helpers.
 * Only <linux/bpf.h> from the distribution's uapi (Debian 12 ships 6.1 headers, older than
 * arenas), so the two arena constants are pinned here. */
#pragma once
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/version.h>
#include <bpf/bpf_helpers.h>

/* Open-coded number iterators (bpf_for) need this uapi struct, which headers before 6.4 lack. */
#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 4, 0)
struct bpf_iter_num {
	__u64 __opaque[1];
} __attribute__((aligned(8)));
#endif

/* BPF workqueues (Linux >= 6.10) are newer than the distribution's uapi headers. */
#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 10, 0)
struct bpf_wq {
	__u64 __opaque[2];
} __attribute__((aligned(8)));
#endif

/* The workqueue kfuncs. Setting the callback was bpf_wq_set_callback_impl(wq, cb, flags, aux)
 * from 6.10; Linux 7.x renamed it bpf_wq_set_callback(wq, cb, flags) (the aux argument became
 * implicit) and left the old name as an internal function, no longer a kfunc. Both are weak: libbpf
 * resolves the one this kernel has, and the verifier drops the branch of the other. */
extern int bpf_wq_init(struct bpf_wq *wq, void *p__map, unsigned int flags) __weak __ksym;
extern int bpf_wq_start(struct bpf_wq *wq, unsigned int flags) __weak __ksym;
extern int bpf_wq_set_callback_impl(struct bpf_wq *wq,
				    int (callback_fn)(void *map, int *key, void *value),
				    unsigned int flags, void *aux__ign) __weak __ksym;
extern int bpf_wq_set_callback(struct bpf_wq *wq,
			       int (callback_fn)(void *map, int *key, void *value),
			       unsigned int flags) __weak __ksym;
#define qb_wq_set_callback(wq, cb)                                                  \
	(bpf_ksym_exists(bpf_wq_set_callback) ? bpf_wq_set_callback((wq), (cb), 0)  \
					      : bpf_wq_set_callback_impl((wq), (cb), 0, 0))

typedef __s8 s8;
typedef __u8 u8;
typedef __s16 s16;
typedef __u16 u16;
typedef __s32 s32;
typedef __u32 u32;
typedef __s64 s64;
typedef __u64 u64;

#define QB_MAP_TYPE_ARENA 33 /* BPF_MAP_TYPE_ARENA, Linux >= 6.9 */
#define __arena __attribute__((address_space(1)))

/* The one declaration of a BPF arena map, `name`: mmapable, one page until user space sets its
 * size before load (bpf_map__set_max_entries). */
#define QB_ARENA(name)                                                                      \
	struct {                                                                            \
		__uint(type, QB_MAP_TYPE_ARENA);                                            \
		__uint(map_flags, BPF_F_MMAPABLE);                                          \
		__uint(max_entries, 1);                                                     \
	} name SEC(".maps")

/* Every program that touches arena memory must reference the arena map, so that the verifier
 * ties the program to it (a ld_imm64 of &arena). */
#define USE_ARENA(map) asm volatile("" ::"r"(&(map)))

/* Arena pointers travel through the ctx as the user-space addresses of the mmap. */
#define ARENA_PTR(type, addr) ((type __arena *)(u64)(addr))

/* p as the verifier's arena pointer, for loads written as asm: clang casts an arena pointer only
 * where C dereferences it. */
#define ARENA_CAST(p) asm volatile("%[ptr] = addr_space_cast(%[ptr], 0, 1)" : [ptr] "+r"(p))

/* n checked to lie in [1, max], as a value whose bounds every verifier can prove, or a jump to
 * `fail`. For a helper's size argument: clang compiles `n >= 1 && n <= max` into one unsigned
 * compare of n - 1 (or `n == 0`) and then passes n itself, whose lower bound the verifiers of
 * 6.12, 6.18.15 and 7.3.4 do not learn ("invalid zero-sized read"); here the compare is on an opaque n - 1 and the size passed is
 * rebuilt from that same register. */
#define QB_LEN(n, max, fail)                                                              \
	({                                                                                \
		u64 m_ = (u64)(n) - 1;                                                    \
		asm volatile("" : "+r"(m_));                                              \
		if (m_ >= (u64)(max))                                                     \
			goto fail;                                                        \
		(u32)(m_ + 1);                                                            \
	})

/* for (int i = start; i < end; i++) as an open-coded iterator (bpf_for): the verifier checks the
 * body once, not once per iteration. start and end must not change inside the loop. */
#define FOR(i, start, end) \
	for (int i##_once_ = 1, i = 0; i##_once_; i##_once_ = 0) bpf_for(i, start, end)

/* A loop condition that lets the verifier check a plain loop by convergence instead of walking
 * every iteration (the may_goto instruction, Linux 6.9+), and costs a decrement and a branch per
 * iteration instead of bpf_for's kfunc call: for hot inner loops. The kernel bounds such loops
 * with a hidden budget (8M iterations per call; a time slice on newer kernels) and the condition
 * turns false when it runs out, so a loop using it must stay far below that budget (say where). */
#define can_loop                                                                  \
	({                                                                        \
		__label__ l_break, l_continue;                                    \
		int ret_ = 1;                                                     \
		asm volatile goto("may_goto %l[l_break]" :::: l_break);           \
		goto l_continue;                                                  \
	l_break:                                                                  \
		ret_ = 0;                                                         \
	l_continue:                                                               \
		ret_;                                                             \
	})

/* for (u32 i = start; i < end; i++) as a can_loop loop: for loops over a vector's elements or a
 * context's positions, where bpf_for's kfunc call per iteration costs more than the body. The
 * bound must stay far below can_loop's budget: every use is at most LIM_COLS_MAX or max_ctx
 * (~10^5) iterations. */
#define LOOP(i, start, end) for (u32 i = (start); i < (end) && can_loop; i++)

/* An operator: the global function op_<name>(type *a), verified once on its own, and the
 * SEC("syscall") program <name> that runs it on its ctx (one test_run per operator run). The
 * plan interpreter (plan.inc.c) calls the same global functions, in order, in one invocation. */
#ifndef QB_ARRAY_LAYER
#define OP(name, type)                                                                  \
	__noinline int op_##name(type *a __arg_nonnull);                                \
	SEC("syscall") int name(type *ctx)                                              \
	{                                                                               \
		return op_##name(ctx);                                                  \
	}                                                                               \
	__noinline int op_##name(type *a __arg_nonnull)
#else
/* The array build (mem.h) also runs on verifiers before 6.8, which ignore __arg_nonnull and
 * take a global function's pointer argument as possibly NULL: op_<name> checks it, then runs
 * the body. */
#define OP(name, type)                                                                  \
	static __always_inline int op_body_##name(type *a);                             \
	__noinline int op_##name(type *a)                                               \
	{                                                                               \
		if (!a)                                                                 \
			return 1;                                                       \
		return op_body_##name(a);                                               \
	}                                                                               \
	SEC("syscall") int name(type *ctx)                                              \
	{                                                                               \
		return op_##name(ctx);                                                  \
	}                                                                               \
	static __always_inline int op_body_##name(type *a)
#endif
