/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Low-bit SWAR kernels: being written. Included at the end of ops.bpf.c. */
#pragma once
