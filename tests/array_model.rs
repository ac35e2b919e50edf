//! The forward pass on the array memory layer (issue 35): a [`Model`] opened with
//! `MemoryLayer::Array` runs every operator of the step on mmapable array maps, one `test_run`
//! each or all through the plan interpreter (`run_plan`), and must give the Rust twin's logits
//! integer for integer. Runs natively on a host that
//! refuses arenas (`scripts/test.sh`) and on 6.1, which has none (`scripts/smoke.txt`).

mod common;

use qwen_bpf::verify::twin::TwinModel;
use qwen_bpf::{
    Backend, Dispatch, Error, GenerateOptions, KvFormat, MemoryLayer, Model, ModelOptions,
    Tokenizer,
};

const TOKENS: [u32; 6] = [785, 3974, 13876, 151644, 0, 42];

/// Held while a model loads: the small-elements test sets the process's environment for its load.
static LOADING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn open(dir: &std::path::Path, opts: ModelOptions) -> Model {
    let _held = LOADING.lock().unwrap_or_else(|e| e.into_inner());
    common::open(dir, opts)
}

fn options(backend: Backend, kv: KvFormat, threads: usize) -> ModelOptions {
    ModelOptions::default()
        .with_backend(backend)
        .with_kv(kv)
        .with_max_context(16)
        .with_threads(threads)
        .with_memory(MemoryLayer::Array)
}

/// Feeds TOKENS to `m` (opened on `dir`, running with `dispatch`) and to the twin, comparing
/// every position's logits.
fn equal_to_twin(
    m: &mut Model,
    dir: &std::path::Path,
    kv: KvFormat,
    dispatch: Dispatch,
    what: &str,
) {
    let mut twin = TwinModel::open_with_kv(dir, dir, 16, kv).unwrap();
    assert_eq!(m.dispatch(), dispatch, "{what}: the dispatch");
    assert_eq!(
        m.memory_layer(),
        MemoryLayer::Array,
        "{what}: on array maps"
    );
    for (i, &t) in TOKENS.iter().enumerate() {
        let (want, _) = twin.forward(t).unwrap();
        let got = m.forward_fixed(t).unwrap().to_vec();
        assert_eq!(
            got, want,
            "{what}: logits at position {i}, array layer vs Rust twin"
        );
    }
}

#[test]
fn array_forward_equals_the_twin_per_op_and_by_plan_with_q16_and_int8_kv_on_one_and_two_threads() {
    // per operator (one test_run each) and through the plan interpreter (run_plan: one
    // invocation per thread and token, the default where the store can be planned)
    let dir = common::tiny_model("array-model");
    for kv in [KvFormat::Q16, KvFormat::Int8] {
        for threads in [1, 2] {
            for dispatch in [Dispatch::PerOp, Dispatch::Kernel] {
                let opts = options(Backend::Q24, kv, threads).with_dispatch(dispatch);
                let mut m = open(&dir, opts);
                let what = format!("q24, {kv:?} KV, {threads} threads, dispatch {dispatch:?}");
                equal_to_twin(&mut m, &dir, kv, dispatch, &what);
            }
        }
    }
}

#[test]
fn array_forward_with_the_batch_store_equals_the_twin() {
    // the 2 MiB arena-batch store moves each matrix into memory before its operator
    let dir = common::tiny_model("array-model");
    let mut m = open(&dir, options(Backend::Arena, KvFormat::Q16, 1));
    equal_to_twin(
        &mut m,
        &dir,
        KvFormat::Q16,
        Dispatch::PerOp,
        "arena-batch store",
    );
}

#[test]
fn array_layer_refuses_what_needs_the_arena_and_says_why() {
    let dir = common::tiny_model("array-model");
    let opts = options(Backend::Q24, KvFormat::Q16, 1).with_event_slots(1);
    match Model::open(&dir, &opts) {
        Err(Error::Invalid(msg)) => assert!(
            msg.starts_with("kernel events") && msg.contains("arena memory layer"),
            "{msg}"
        ),
        Err(e) => panic!("kernel events: expected Error::Invalid, got {e}"),
        Ok(_) => panic!("kernel events: opened on the array layer"),
    }
}

#[test]
fn array_screened_next_token_is_the_twins_argmax() {
    // Model::next_token runs the screened LM head (screen_argmax) on the array layer too
    let dir = common::tiny_model("array-model");
    let mut m = open(&dir, options(Backend::Q24, KvFormat::Q16, 1));
    let mut twin = TwinModel::open(&dir, &dir, 16).unwrap();
    for (i, &t) in TOKENS.iter().enumerate() {
        let (logits, _) = twin.forward(t).unwrap();
        let max = *logits.iter().max().unwrap();
        let want = logits.iter().position(|&l| l == max).unwrap() as u32;
        assert_eq!(
            m.next_token(t).unwrap(),
            want,
            "position {i}: next token vs the twin's first argmax"
        );
    }
}

#[test]
fn array_cli_generate_prints_what_the_library_generates() {
    // `qwen-bpf generate --memory array`: the plan interpreter on array maps, greedy in user space
    let dir = common::tiny_model_with_tokenizer("array-cli");
    let tok = Tokenizer::from_model_dir(&dir).unwrap();
    let prompt = [785, 3974, 13876];
    let mut m = open(&dir, options(Backend::Q24, KvFormat::Q16, 1));
    let opts = GenerateOptions::new(5).with_stop_tokens(tok.eos_ids());
    let ids: Vec<u32> = m
        .generate(&prompt, &opts)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(!ids.is_empty(), "the library generated nothing");
    let mut stream = tok.stream();
    let mut want = tok.decode(&prompt).unwrap(); // the command echoes the prompt
    for id in ids {
        want += &stream.push(id).unwrap().unwrap_or_default();
    }
    want += &stream.finish().unwrap().unwrap_or_default();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qwen-bpf"))
        .args([
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "--tokens",
            "785,3974,13876",
        ])
        .args(["--max-tokens", "5", "--memory", "array"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "generate --memory array failed: {err}"
    );
    assert!(
        err.contains("dispatch kernel: one invocation per thread and token")
            && err.contains(", on array maps"),
        "the summary names the dispatch and the layer: {err}"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end_matches('\n'),
        want
    );
}

#[test]
fn array_forward_with_small_elements_equals_the_twin() {
    // 1 MiB elements under a 12-layer tiny model: its 39 MB embedding spans dozens of element
    // ends, and its 2.4 MB of layer tensors several, so that a row would cross an end if the
    // weights were copied as one block (down_proj's rows are 768 bytes)
    let mut cfg = qwen_bpf::hf::synth::Preset::Tiny.config();
    cfg.num_hidden_layers = 12;
    let dir = common::model_with("array-deep", &cfg, &Default::default());
    let mut m = {
        let _held = LOADING.lock().unwrap_or_else(|e| e.into_inner());
        std::env::set_var(qwen_bpf::kernel::ops::ELEM_SHIFT_ENV, "20");
        let m = Model::open(&dir, &options(Backend::Q24, KvFormat::Int8, 2));
        std::env::remove_var(qwen_bpf::kernel::ops::ELEM_SHIFT_ENV);
        m.unwrap()
    };
    // the plan's slots, the KV cache and the scratch all placed among element ends too
    equal_to_twin(
        &mut m,
        &dir,
        KvFormat::Int8,
        Dispatch::Kernel,
        "1 MiB elements, 12 layers",
    );
}

#[test]
fn array_doctor_loads_every_array_program_and_reports_its_count() {
    // `qwen-bpf doctor --programs`: a section for the array layer, in which the verifier takes
    // every program of ARRAY_PROGRAMS (loaded alone) with a positive instruction count
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qwen-bpf"))
        .args(["doctor", "--programs"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&out.stdout);
    let section: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("programs on the array layer (each loaded alone):"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .collect();
    // what this kernel's verifier is known to refuse on this layer (scripts/known-refusals.txt,
    // docs/kernels.md says why; none today): it must still be refused here, by name, so that the
    // list is kept true
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let known_refused = |name: &str| common::known_refused("array", name);
    for name in qwen_bpf::kernel::ops::ARRAY_PROGRAMS {
        let line = section
            .iter()
            .find(|l| l.split_whitespace().nth(1) == Some(name))
            .unwrap_or_else(|| panic!("no line for {name} in the array section:\n{out}"));
        if known_refused(name) {
            assert!(
                line.contains("REFUSED: "),
                "{name} was known refused on {release}: {line}"
            );
            continue;
        }
        let count: u64 = line
            .split("ok, ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{name} not verified: {line}"));
        assert!(count > 0, "{line}");
    }
    assert_eq!(
        section.len(),
        qwen_bpf::kernel::ops::ARRAY_PROGRAMS.len(),
        "{out}"
    );
}

/// Needs both layers (a kernel with arenas that allows them: 7.3.4 in the smoke suite): every
/// store, both KV formats, the same logits at every position from the arena and from array maps,
/// each in its default dispatch (the plan interpreter where the store can be planned).
#[test]
fn both_layers_give_the_same_logits_on_every_store_and_kv_format() {
    let dir = common::tiny_model("array-model");
    for backend in Backend::ALL {
        for kv in KvFormat::ALL {
            let what = format!("{} store, {kv:?} KV", backend.name());
            let opts = options(backend, kv, 2);
            let mut array = open(&dir, opts.clone());
            let mut arena = open(&dir, opts.with_memory(MemoryLayer::Arena));
            assert_eq!(array.memory_layer(), MemoryLayer::Array, "{what}");
            assert_eq!(arena.memory_layer(), MemoryLayer::Arena, "{what}");
            assert_eq!(
                array.dispatch(),
                arena.dispatch(),
                "{what}: the same dispatch"
            );
            for (i, &t) in TOKENS.iter().enumerate() {
                let want = arena.forward_fixed(t).unwrap().to_vec();
                let got = array.forward_fixed(t).unwrap().to_vec();
                assert_eq!(got, want, "{what}: logits at position {i}, array vs arena");
            }
        }
    }
}
