// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* The memory layer: how a program reaches the memory it shares with user space, in one of two
 * builds of the same source (docs/plans/array-layer.md, issue 35).
 *
 * - The arena build (default): one BPF arena map (Linux >= 6.9). An address is a user-space
 *   address of the arena's mmap, and a pointer to it is an __arena pointer: every access works,
 *   a page never touched reads 0.
 * - The array build (-DQB_ARRAY_LAYER, -mcpu=v3: what Linux 6.1's verifier takes): one
 *   BPF_MAP_TYPE_ARRAY with BPF_F_MMAPABLE whose elements of 2^qb_mem_shift bytes user space
 *   mmaps contiguously at qb_mem_base. An address is still a user-space address of that mmap
 *   (so plans, twins and ctx structs hold the same integers in both builds); a program turns it
 *   into (element, offset) with one lookup, and an access that would cross an element's end,
 *   or lie outside the map, is refused (NULL / nonzero), never wrapped. User space lays out
 *   every buffer the programs index so that it does not cross an element (kernel/memory.rs).
 *
 * The primitives, the same in both builds:
 *   QB                   the qualifier of a pointer into the shared memory
 *   QB_MEM(map)          declares the shared-memory map
 *   QB_MEM_USE(map)      ties a program to it (the arena build needs the reference)
 *   QB_SPAN(T, map, a, room)  a T pointer to the `room` bytes at address a (room a constant,
 *                        at most one element), or NULL in the array build when they cross an
 *                        element's end or lie outside the map; never NULL in the arena build
 *   QB_LD(T, map, a, dst)     *dst = the T at a: 0, or -1 (dst untouched) where QB_SPAN is NULL
 *   QB_ST(T, map, a, v)       the T at a = v: 0, or -1 (nothing written) likewise
 */
#pragma once
#include "common.h"

#ifndef QB_ARRAY_LAYER

#define QB __arena
#define QB_MEM(map) QB_ARENA(map)
#define QB_MEM_USE(map) USE_ARENA(map)
#define QB_SPAN(T, map, a, room) ARENA_PTR(T, a)

#else /* QB_ARRAY_LAYER */

#define QB
/* Set by user space before load (then frozen, so the verifier knows them as constants): where
 * element 0 is mapped, and log2 of the element size (the map's value_size). */
const volatile u64 qb_mem_base = 0;
const volatile u32 qb_mem_shift = 12;

/* The map's value_size and max_entries are set by user space before load; no BTF value type, as
 * its size is not known here. */
#define QB_MEM(map)                                                                         \
	struct {                                                                            \
		__uint(type, BPF_MAP_TYPE_ARRAY);                                           \
		__uint(map_flags, BPF_F_MMAPABLE);                                          \
		__uint(key_size, sizeof(u32));                                              \
		__uint(value_size, 4096);                                                   \
		__uint(max_entries, 1);                                                     \
	} map SEC(".maps")
#define QB_MEM_USE(map) ((void)0)

/* The `room` bytes at user address a, inside one element of `map`, or NULL. The offset inside
 * the element is checked against element size - room, which is what lets the verifier prove
 * every access through the pointer within [0, room). */
static __always_inline void *qb_span(void *map, u64 a, u64 room)
{
	u64 shift = qb_mem_shift;
	u64 size = 1ull << shift;
	u64 off = a - qb_mem_base; /* below the base: wraps to a huge offset, refused below */
	u64 elem = off >> shift;
	u64 in = off & (size - 1);
	u32 key;
	char *e;

	if (room > size || elem > 0xffffffffull || in > size - room)
		return NULL;
	key = elem;
	e = bpf_map_lookup_elem(map, &key); /* NULL past max_entries */
	if (!e)
		return NULL;
	return e + in;
}

#define QB_SPAN(T, map, a, room) ((T *)qb_span(&(map), (u64)(a), (room)))

#endif /* QB_ARRAY_LAYER */

/* One checked access: `what` runs on p_, a T pointer to `a`, when `a` holds a whole T; 0 then,
 * -1 when it does not (nothing read or written). */
#define QB_DO(T, map, a, what)                                                              \
	({                                                                                  \
		T QB *p_ = QB_SPAN(T, map, a, sizeof(T));                                   \
		int r_ = -1;                                                                \
		if (p_) {                                                                   \
			what;                                                               \
			r_ = 0;                                                             \
		}                                                                           \
		r_;                                                                         \
	})

#define QB_LD(T, map, a, dst) QB_DO(T, map, a, *(dst) = *p_)
#define QB_ST(T, map, a, v) QB_DO(T, map, a, *p_ = (v))
