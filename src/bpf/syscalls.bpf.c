// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* Counts the bpf(2) calls of one process: a raw tracepoint on every system call entry that adds
 * one when the caller's thread group is `tgid` and the call is bpf. User space reads the count
 * through the mapped .bss, so reading it makes no system call. */
#include "common.h"

/* A GPL-compatible licence: the arena kfuncs and BPF helpers used here are GPL-only. */
char LICENSE[] SEC("license") = "Dual MIT/GPL";

const volatile u32 tgid = 0;     /* the process to count, set before load */
const volatile u64 nr_bpf = 321; /* __NR_bpf of this architecture (x86_64: 321, arm64: 280) */
u64 bpf_calls;

SEC("raw_tp/sys_enter")
int count_bpf(struct bpf_raw_tracepoint_args *ctx)
{
	/* sys_enter(struct pt_regs *regs, long id) */
	if ((u32)(bpf_get_current_pid_tgid() >> 32) == tgid && ctx->args[1] == nr_bpf)
		__sync_fetch_and_add(&bpf_calls, 1);
	return 0;
}
