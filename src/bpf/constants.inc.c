// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* The constants C and Rust share beyond fixed.h and limits.h, reported by the `constants`
 * program. Not compiled on its own: included at the end of ops.bpf.c, after every fragment whose
 * constants it reports. */

/* Every constant that C and Rust both use beyond fixed.h and limits.h (which `formats`
 * reports): the plan's format, the event path's datagram and records, generation's statuses,
 * the SWAR and int8-KV kernels' bounds, the filter's. tests/constants.rs compares each with its Rust mirror. */
struct constants_args {
	u32 plan_args_words, plan_patches, plan_threads_max, plan_sync, plan_head;
	u32 plan_var_token, plan_var_pos, op_count;
	s32 plan_e_barrier, plan_e_args;
	u32 ev_slots_max, ev_prompt_max, ev_magic, ev_sources_max;
	u32 rec_token, rec_done, rec_refused;
	u32 ev_r_busy, ev_r_malformed, ev_r_token, ev_r_limit, ev_r_unknown, ev_r_offset;
	u32 ev_poll_magic, ev_reply_magic, ev_k_accepted, ev_k_refused, ev_k_text, ev_k_final;
	u32 ev_text_reply_max, ev_poll_min, ev_r_utf8, ev_text_magic, ev_text_in_max, ev_tf_chat;
	u32 ev_r_source, ev_reasons;
	u32 gen_stops_max, gen_text_max, gen_more, gen_stop, gen_max, gen_full;
	u32 sw_group, sw_scale_shift, sw_kmax;
	u32 kv8_qmax, kv8_hd_max;
	u32 slot_bytes;
	u32 sample_one, sample_params_bytes, sample_args_bytes;
	s32 sample_e_param, sample_e_loop;
	u32 tok_magic, tok_scratch_bytes, tok_args_bytes;
	s32 tok_e_text, tok_e_ids, tok_e_utf8, tok_e_cps, tok_e_word, tok_e_marks, tok_e_tables;
	s32 tok_e_budget;
	u32 flt_suffix_max, flt_steps_max, flt_flows, flt_name_max, flt_excerpt;
	u32 flt_pass, flt_drop, flt_count, flt_slots_max;
	s32 flt_more;
	char op_names[256]; /* PLAN_OP_NAMES, NUL-terminated */
};

static const char plan_op_names[] = PLAN_OP_NAMES;
_Static_assert(sizeof(plan_op_names) <= sizeof(((struct constants_args *)0)->op_names),
	       "the op names fit the report");

SEC("syscall")
int constants(struct constants_args *a)
{
	a->plan_args_words = PLAN_ARGS_WORDS;
	a->plan_patches = PLAN_PATCHES;
	a->plan_threads_max = PLAN_THREADS_MAX;
	a->plan_sync = PLAN_SYNC;
	a->plan_head = PLAN_HEAD;
	a->plan_var_token = PLAN_VAR_TOKEN;
	a->plan_var_pos = PLAN_VAR_POS;
	a->op_count = OP_COUNT;
	a->plan_e_barrier = PLAN_E_BARRIER;
	a->plan_e_args = PLAN_E_ARGS;
	a->ev_slots_max = EV_SLOTS_MAX;
	a->ev_prompt_max = EV_PROMPT_MAX;
	a->ev_magic = EV_MAGIC;
	a->ev_sources_max = EV_SOURCES_MAX;
	a->rec_token = REC_TOKEN;
	a->rec_done = REC_DONE;
	a->rec_refused = REC_REFUSED;
	a->ev_r_busy = EV_R_BUSY;
	a->ev_r_malformed = EV_R_MALFORMED;
	a->ev_r_token = EV_R_TOKEN;
	a->ev_r_limit = EV_R_LIMIT;
	a->ev_r_unknown = EV_R_UNKNOWN;
	a->ev_r_offset = EV_R_OFFSET;
	a->ev_poll_magic = EV_POLL_MAGIC;
	a->ev_reply_magic = EV_REPLY_MAGIC;
	a->ev_k_accepted = EV_K_ACCEPTED;
	a->ev_k_refused = EV_K_REFUSED;
	a->ev_k_text = EV_K_TEXT;
	a->ev_k_final = EV_K_FINAL;
	a->ev_text_reply_max = EV_TEXT_REPLY_MAX;
	a->ev_poll_min = EV_POLL_MIN;
	a->ev_r_utf8 = EV_R_UTF8;
	a->ev_text_magic = EV_TEXT_MAGIC;
	a->ev_text_in_max = EV_TEXT_IN_MAX;
	a->ev_tf_chat = EV_TF_CHAT;
	a->ev_r_source = EV_R_SOURCE;
	a->ev_reasons = EV_REASONS;
	a->gen_stops_max = GEN_STOPS_MAX;
	a->gen_text_max = GEN_TEXT_MAX;
	a->gen_more = GEN_MORE;
	a->gen_stop = GEN_STOP;
	a->gen_max = GEN_MAX;
	a->gen_full = GEN_FULL;
	a->sw_group = SW_GROUP;
	a->sw_scale_shift = SW_SCALE_SHIFT;
	a->sw_kmax = SW_KMAX;
	a->kv8_qmax = KV8_QMAX;
	a->kv8_hd_max = KV8_HD_MAX;
	a->slot_bytes = sizeof(struct plan_slot);
	a->sample_one = SAMPLE_ONE;
	a->sample_params_bytes = sizeof(struct qb_sample_params);
	a->sample_args_bytes = sizeof(struct qb_sample_args);
	a->sample_e_param = SAMPLE_E_PARAM;
	a->sample_e_loop = SAMPLE_E_LOOP;
	a->tok_magic = TOK_MAGIC;
	a->tok_scratch_bytes = TOK_SCRATCH_BYTES;
	a->tok_args_bytes = sizeof(struct tokenize_args);
	a->tok_e_text = TOK_E_TEXT;
	a->tok_e_ids = TOK_E_IDS;
	a->tok_e_utf8 = TOK_E_UTF8;
	a->tok_e_cps = TOK_E_CPS;
	a->tok_e_word = TOK_E_WORD;
	a->tok_e_marks = TOK_E_MARKS;
	a->tok_e_tables = TOK_E_TABLES;
	a->tok_e_budget = TOK_E_BUDGET;
	a->flt_suffix_max = FLT_SUFFIX_MAX;
	a->flt_steps_max = FLT_STEPS_MAX;
	a->flt_flows = FLT_FLOWS;
	a->flt_name_max = FLT_NAME_MAX;
	a->flt_excerpt = FLT_EXCERPT;
	a->flt_pass = FLT_PASS;
	a->flt_drop = FLT_DROP;
	a->flt_count = FLT_COUNT;
	a->flt_slots_max = FLT_SLOTS_MAX;
	a->flt_more = FLT_MORE;
	for (u32 i = 0; i < sizeof(plan_op_names); i++)
		a->op_names[i] = plan_op_names[i];
	return 0;
}

