// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* Every size bound of the kernels, in one table. Mirrored constant for constant in src/limits.rs,
 * which checks a model's dimensions against them when it is opened (a typed error naming the
 * dimension); the `formats` program reports them so that a test can check the two agree. */
#pragma once

#define LIM_COLS_MAX 16384   /* columns of one dot product: every matrix's width (the Q24 dot
			      * and SWAR loops are bounded by it; hidden, q_dim, intermediate) */
#define LIM_Q24_COLS_ALIGN 8 /* Q24 matvec: 8 columns per step */
#define LIM_SWAR_COLS_ALIGN 32 /* SWAR matvec: groups of 32 columns */
#define LIM_W4_ROWS_ALIGN 8  /* W4A8: rows in blocks of 8 */
#define LIM_W8_ROWS_ALIGN 4  /* W8A16: rows in blocks of 4 (the LM head of both int stores) */
#define LIM_NORM_MAX 16384   /* RMSNorm vector length (packed in 15 bits of rmsnorm_vec's nqw) */
#define LIM_HEAD_DIM_MAX 512 /* attention's per-head loops and the int8 KV lane algebra */
#define LIM_BATCH_MAX 64     /* vectors of one batched matvec or quantisation (a prefill block) */
/* The sampler (sample.inc.c): ids in 20 bits, so that the u64 sums of up to 2^20 Q30 weights
 * stay below 2^50 */
#define LIM_VOCAB_MAX (1 << 20)    /* logits one draw takes (the vocabulary) */
#define LIM_SAMPLE_BUCKETS 2048    /* u64 buckets of the radix select's histogram (11 bits) */
#define LIM_SAMPLE_TEMP_MIN 656    /* temperature, Q16: 0.01 (1/T in Q16 stays below 2^23) */
#define LIM_SAMPLE_TEMP_MAX (100 << 16) /* ... 100 */
#define LIM_SAMPLE_REP_MIN 656     /* repetition penalty, Q16: 0.01 ... */
#define LIM_SAMPLE_REP_MAX (100 << 16) /* ... 100 */
#define LIM_SAMPLE_PEN_MAX (64 << 16)  /* |presence|, |frequency| penalty, Q16: 64 */

/* The in-kernel tokenizer (tokenize.inc.c, src/num/tok_twin.rs): every loop is bounded by these. */
#define LIM_TOK_TEXT_MAX 65536  /* text bytes of one tokenize call */
#define LIM_TOK_IDS_MAX 65536   /* ids one call may write (max_out is at most this) */
#define LIM_TOK_CP_MAX 131072   /* code points of one segment after canonical decomposition */
#define LIM_TOK_WORD_MAX 8192   /* bytes of one pre-tokenized piece (BPE's word) */
#define LIM_TOK_MARKS_MAX 4096  /* non-starters in a row (canonical reordering's insertion sort) */
#define LIM_TOK_ADDED_MAX 4096  /* added tokens */
#define LIM_TOK_ADDED_LEN 256   /* bytes of one added token */

/* The packet filter (filter.inc.c, src/run/filter): what one rule may ask for. */
#define LIM_FILTER_BYTES_MAX 1024      /* payload bytes one classification reads */
#define LIM_FILTER_LABELS_MAX 8        /* labels of a rule */
#define LIM_FILTER_LABEL_TOKENS_MAX 4  /* tokens of one label */
#define LIM_FILTER_PORTS_MAX 8         /* destination ports of a rule */
#define LIM_FILTER_SOURCES_MAX 8       /* source prefixes of a rule */
