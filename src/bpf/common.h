/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Conventions shared by every qwen_bpf program: types, the arena, helpers.
 * Only <linux/bpf.h> from the distribution's uapi (Debian 12 ships 6.1 headers, older than
 * arenas), so the two arena constants are pinned here. */
#pragma once
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

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

/* Every program that touches arena memory must reference the arena map, so that the verifier
 * ties the program to it (a ld_imm64 of &arena). */
#define USE_ARENA(map) asm volatile("" ::"r"(&(map)))

/* Arena pointers travel through the ctx as the user-space addresses of the mmap. */
#define ARENA_PTR(type, addr) ((type __arena *)(u64)(addr))
