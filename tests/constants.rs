//! Every constant that the BPF C and the Rust side both use, as the programs were compiled
//! (the `constants` program reports them), against its Rust mirror: the plan's format and its
//! operator ids in order, the event path's datagram, records and refusal reasons, generation's
//! statuses and limits, the SWAR and int8-KV kernels' bounds, the sampler's constants, the
//! packet filter's limits, actions and step status. (fixed.h and limits.h are compared
//! by tests/ops_twins.rs and tests/limits.rs through the `formats` program.)

use qwen_bpf::kernel::ops::Ops;
use qwen_bpf::kernel::tokenize;
use qwen_bpf::kernel::{filter, plan, ring};
use qwen_bpf::num::{kv8, sample, swar, tok_tables, tok_twin};
use qwen_bpf::run::{event, in_kernel, wire};
use qwen_bpf::Refusal;

#[test]
fn every_constant_shared_by_c_and_rust_is_the_same_on_both_sides() {
    let mut ops = Ops::load(1 << 16).expect("load the operator programs");
    let c = ops.constants().expect("run the constants program");
    let names = c
        .op_names
        .iter()
        .take_while(|&&b| b != 0)
        .map(|&b| b as u8 as char);
    assert_eq!(
        names.collect::<String>(),
        plan::OPS.join(","),
        "operator ids and order: PLAN_OPS in src/bpf/plan.inc.c vs OPS in src/kernel/plan.rs"
    );
    let pairs: &[(&str, i64, i64)] = &[
        (
            "OP_COUNT vs OPS.len()",
            c.op_count as i64,
            plan::OPS.len() as i64,
        ),
        (
            "PLAN_ARGS_WORDS vs plan::ARGS_WORDS",
            c.plan_args_words as i64,
            plan::ARGS_WORDS as i64,
        ),
        (
            "PLAN_PATCHES vs plan::PATCHES",
            c.plan_patches as i64,
            plan::PATCHES as i64,
        ),
        (
            "PLAN_THREADS_MAX vs plan::THREADS_MAX",
            c.plan_threads_max as i64,
            plan::THREADS_MAX as i64,
        ),
        (
            "PLAN_SYNC vs plan::SYNC",
            c.plan_sync as i64,
            plan::SYNC as i64,
        ),
        (
            "PLAN_HEAD vs plan::HEAD",
            c.plan_head as i64,
            plan::HEAD as i64,
        ),
        (
            "PLAN_VAR_TOKEN vs plan::Var::Token",
            c.plan_var_token as i64,
            plan::Var::Token as i64,
        ),
        (
            "PLAN_VAR_POS vs plan::Var::Pos",
            c.plan_var_pos as i64,
            plan::Var::Pos as i64,
        ),
        (
            "PLAN_E_BARRIER vs plan::E_BARRIER",
            c.plan_e_barrier as i64,
            plan::E_BARRIER as i64,
        ),
        (
            "PLAN_E_ARGS vs plan::E_ARGS",
            c.plan_e_args as i64,
            plan::E_ARGS as i64,
        ),
        (
            "sizeof(struct plan_slot) vs plan::Slot",
            c.slot_bytes as i64,
            std::mem::size_of::<plan::Slot>() as i64,
        ),
        (
            "TOK_MAGIC vs tok_tables::MAGIC",
            c.tok_magic as i64,
            tok_tables::MAGIC as i64,
        ),
        (
            "TOK_SCRATCH_BYTES vs tokenize::SCRATCH_BYTES",
            c.tok_scratch_bytes as i64,
            tokenize::SCRATCH_BYTES as i64,
        ),
        (
            "sizeof(struct tokenize_args) vs 48",
            c.tok_args_bytes as i64,
            48,
        ),
        (
            "TOK_E_TEXT",
            c.tok_e_text as i64,
            tok_twin::err::TEXT as i64,
        ),
        ("TOK_E_IDS", c.tok_e_ids as i64, tok_twin::err::IDS as i64),
        (
            "TOK_E_UTF8",
            c.tok_e_utf8 as i64,
            tok_twin::err::UTF8 as i64,
        ),
        ("TOK_E_CPS", c.tok_e_cps as i64, tok_twin::err::CPS as i64),
        (
            "TOK_E_WORD",
            c.tok_e_word as i64,
            tok_twin::err::WORD as i64,
        ),
        (
            "TOK_E_MARKS",
            c.tok_e_marks as i64,
            tok_twin::err::MARKS as i64,
        ),
        (
            "TOK_E_TABLES",
            c.tok_e_tables as i64,
            tok_twin::err::TABLES as i64,
        ),
        (
            "TOK_E_BUDGET",
            c.tok_e_budget as i64,
            tok_twin::err::BUDGET as i64,
        ),
        (
            "EV_SLOTS_MAX vs event::SLOTS_MAX",
            c.ev_slots_max as i64,
            event::SLOTS_MAX as i64,
        ),
        (
            "EV_PROMPT_MAX vs event::PROMPT_MAX",
            c.ev_prompt_max as i64,
            event::PROMPT_MAX as i64,
        ),
        (
            "EV_MAGIC vs event::MAGIC",
            c.ev_magic as i64,
            event::MAGIC as i64,
        ),
        (
            "EV_SOURCES_MAX vs event::SOURCES_MAX",
            c.ev_sources_max as i64,
            event::SOURCES_MAX as i64,
        ),
        (
            "REC_TOKEN vs ring::REC_TOKEN",
            c.rec_token as i64,
            ring::REC_TOKEN as i64,
        ),
        (
            "REC_DONE vs ring::REC_DONE",
            c.rec_done as i64,
            ring::REC_DONE as i64,
        ),
        (
            "REC_REFUSED vs ring::REC_REFUSED",
            c.rec_refused as i64,
            ring::REC_REFUSED as i64,
        ),
        (
            "EV_R_BUSY vs event::R_BUSY",
            c.ev_r_busy as i64,
            event::R_BUSY as i64,
        ),
        (
            "EV_R_MALFORMED vs event::R_MALFORMED",
            c.ev_r_malformed as i64,
            event::R_MALFORMED as i64,
        ),
        (
            "EV_R_TOKEN vs event::R_TOKEN",
            c.ev_r_token as i64,
            event::R_TOKEN as i64,
        ),
        (
            "EV_R_LIMIT vs event::R_LIMIT",
            c.ev_r_limit as i64,
            event::R_LIMIT as i64,
        ),
        (
            "EV_R_UNKNOWN vs event::R_UNKNOWN",
            c.ev_r_unknown as i64,
            event::R_UNKNOWN as i64,
        ),
        (
            "EV_R_OFFSET vs event::R_OFFSET",
            c.ev_r_offset as i64,
            event::R_OFFSET as i64,
        ),
        (
            "EV_POLL_MAGIC vs wire::POLL_MAGIC",
            c.ev_poll_magic as i64,
            wire::POLL_MAGIC as i64,
        ),
        (
            "EV_REPLY_MAGIC vs wire::REPLY_MAGIC",
            c.ev_reply_magic as i64,
            wire::REPLY_MAGIC as i64,
        ),
        (
            "EV_K_ACCEPTED vs wire::KIND_ACCEPTED",
            c.ev_k_accepted as i64,
            wire::KIND_ACCEPTED as i64,
        ),
        (
            "EV_K_REFUSED vs wire::KIND_REFUSED",
            c.ev_k_refused as i64,
            wire::KIND_REFUSED as i64,
        ),
        (
            "EV_K_TEXT vs wire::KIND_TEXT",
            c.ev_k_text as i64,
            wire::KIND_TEXT as i64,
        ),
        (
            "EV_K_FINAL vs wire::KIND_FINAL",
            c.ev_k_final as i64,
            wire::KIND_FINAL as i64,
        ),
        (
            "EV_TEXT_REPLY_MAX vs wire::TEXT_REPLY_MAX",
            c.ev_text_reply_max as i64,
            wire::TEXT_REPLY_MAX as i64,
        ),
        (
            "EV_POLL_MIN vs wire::POLL_MIN_BYTES",
            c.ev_poll_min as i64,
            wire::POLL_MIN_BYTES as i64,
        ),
        (
            "EV_R_UTF8 vs event::R_UTF8",
            c.ev_r_utf8 as i64,
            event::R_UTF8 as i64,
        ),
        (
            "EV_R_SOURCE vs event::R_SOURCE",
            c.ev_r_source as i64,
            event::R_SOURCE as i64,
        ),
        (
            "EV_REASONS holds every reason's code",
            (c.ev_reasons > event::R_SOURCE && Refusal::ALL.iter().all(|r| r.code() < c.ev_reasons))
                as i64,
            1,
        ),
        (
            "EV_TEXT_MAGIC vs wire::TEXT_MAGIC",
            c.ev_text_magic as i64,
            wire::TEXT_MAGIC as i64,
        ),
        (
            "EV_TEXT_IN_MAX vs wire::TEXT_IN_MAX",
            c.ev_text_in_max as i64,
            wire::TEXT_IN_MAX as i64,
        ),
        (
            "EV_TF_CHAT vs wire::FLAG_CHAT",
            c.ev_tf_chat as i64,
            wire::FLAG_CHAT as i64,
        ),
        (
            "GEN_STOPS_MAX vs in_kernel::STOPS_MAX",
            c.gen_stops_max as i64,
            in_kernel::STOPS_MAX as i64,
        ),
        (
            "GEN_TEXT_MAX vs ring::TEXT_MAX",
            c.gen_text_max as i64,
            ring::TEXT_MAX as i64,
        ),
        (
            "GEN_MORE vs in_kernel::GEN_MORE",
            c.gen_more as i64,
            in_kernel::GEN_MORE as i64,
        ),
        (
            "GEN_STOP vs in_kernel::GEN_STOP",
            c.gen_stop as i64,
            in_kernel::GEN_STOP as i64,
        ),
        (
            "GEN_MAX vs in_kernel::GEN_MAX",
            c.gen_max as i64,
            in_kernel::GEN_MAX as i64,
        ),
        (
            "GEN_FULL vs in_kernel::GEN_FULL",
            c.gen_full as i64,
            in_kernel::GEN_FULL as i64,
        ),
        (
            "SW_GROUP vs swar::GROUP",
            c.sw_group as i64,
            swar::GROUP as i64,
        ),
        (
            "SW_SCALE_SHIFT vs swar::SCALE_SHIFT",
            c.sw_scale_shift as i64,
            swar::SCALE_SHIFT as i64,
        ),
        (
            "SW_KMAX vs swar::K_MAX",
            c.sw_kmax as i64,
            swar::K_MAX as i64,
        ),
        ("KV8_QMAX vs kv8::QMAX", c.kv8_qmax as i64, kv8::QMAX as i64),
        (
            "SAMPLE_ONE vs sample::ONE",
            c.sample_one as i64,
            sample::ONE as i64,
        ),
        (
            "SAMPLE_E_PARAM vs sample::E_PARAM",
            c.sample_e_param as i64,
            sample::E_PARAM as i64,
        ),
        (
            "SAMPLE_E_LOOP vs sample::E_LOOP",
            c.sample_e_loop as i64,
            sample::E_LOOP as i64,
        ),
        (
            "sizeof(struct qb_sample_params) vs sample::Params",
            c.sample_params_bytes as i64,
            std::mem::size_of::<sample::Params>() as i64,
        ),
        (
            "KV8_HD_MAX vs kv8::HD_MAX",
            c.kv8_hd_max as i64,
            kv8::HD_MAX as i64,
        ),
        (
            "FLT_SUFFIX_MAX vs filter::SUFFIX_MAX",
            c.flt_suffix_max as i64,
            filter::SUFFIX_MAX as i64,
        ),
        (
            "FLT_STEPS_MAX vs filter::STEPS_MAX",
            c.flt_steps_max as i64,
            filter::STEPS_MAX as i64,
        ),
        (
            "FLT_FLOWS vs filter::FLOWS",
            c.flt_flows as i64,
            filter::FLOWS as i64,
        ),
        (
            "FLT_NAME_MAX vs filter::NAME_MAX",
            c.flt_name_max as i64,
            filter::NAME_MAX as i64,
        ),
        (
            "FLT_EXCERPT vs filter::EXCERPT",
            c.flt_excerpt as i64,
            filter::EXCERPT as i64,
        ),
        (
            "FLT_PASS vs filter::PASS",
            c.flt_pass as i64,
            filter::PASS as i64,
        ),
        (
            "FLT_DROP vs filter::DROP",
            c.flt_drop as i64,
            filter::DROP as i64,
        ),
        (
            "FLT_COUNT vs filter::COUNT",
            c.flt_count as i64,
            filter::COUNT as i64,
        ),
        (
            "FLT_MORE vs filter::MORE",
            c.flt_more as i64,
            filter::MORE as i64,
        ),
        (
            "FLT_SLOTS_MAX vs event::SLOTS_MAX",
            c.flt_slots_max as i64,
            event::SLOTS_MAX as i64,
        ),
    ];
    let differ: Vec<String> = pairs
        .iter()
        .filter(|(_, c, rust)| c != rust)
        .map(|(what, c, rust)| format!("{what}: C {c}, Rust {rust}"))
        .collect();
    assert!(
        differ.is_empty(),
        "constants that differ:\n{}",
        differ.join("\n")
    );
}
