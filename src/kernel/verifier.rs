//! What the verifier says of the operator object's programs, read from libbpf's log: the
//! program a load failed on and the verifier's last line ([`load_explained`]), and the kind of
//! each program ([`ProgramKind`]), so that a kernel refusing one kind may still run the others.

use std::sync::Mutex;

use libbpf_rs::PrintLevel;

/// What a program does, for grouping a report: a kernel refusing one kind may still run others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgramKind {
    /// The operators of the forward pass and the plan interpreter.
    Forward,
    /// `generate`: greedy or sampled generation inside the kernel.
    Generation,
    /// `tokenize_text`: the in-kernel tokenizer.
    Tokenizer,
    /// `sample`: the integer sampler.
    Sampler,
    /// `ev_setup`, `ev_xdp`: kernel events and the installed server.
    Server,
    /// `flt_setup`, `flt_xdp`, `filter_classify`: the packet filter.
    Filter,
}

impl ProgramKind {
    /// The kind of the operator object's program `name`.
    pub fn of(name: &str) -> ProgramKind {
        match name {
            "generate" => ProgramKind::Generation,
            "tokenize_text" => ProgramKind::Tokenizer,
            "sample" => ProgramKind::Sampler,
            n if n.starts_with("ev_") => ProgramKind::Server,
            n if n.starts_with("flt_") || n.starts_with("filter_") => ProgramKind::Filter,
            _ => ProgramKind::Forward,
        }
    }

    /// Every kind, the forward pass first.
    pub const ALL: [ProgramKind; 6] = [
        ProgramKind::Forward,
        ProgramKind::Generation,
        ProgramKind::Tokenizer,
        ProgramKind::Sampler,
        ProgramKind::Server,
        ProgramKind::Filter,
    ];

    /// The kind called `name` ([`ProgramKind::name`]).
    pub fn from_name(name: &str) -> Option<ProgramKind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// A short lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            ProgramKind::Forward => "forward",
            ProgramKind::Generation => "generation",
            ProgramKind::Tokenizer => "tokenizer",
            ProgramKind::Sampler => "sampler",
            ProgramKind::Server => "server",
            ProgramKind::Filter => "filter",
        }
    }
}

/// What libbpf printed during the current capture.
pub(crate) static LOG: Mutex<String> = Mutex::new(String::new());

/// A libbpf print callback that only captures into [`LOG`].
pub(crate) fn capture(_level: PrintLevel, msg: String) {
    LOG.lock().unwrap_or_else(|e| e.into_inner()).push_str(&msg);
}

fn capture_and_print(level: PrintLevel, msg: String) {
    eprint!("{msg}");
    capture(level, msg);
}

/// The program a libbpf log says failed to load (`libbpf: prog 'NAME': failed to load`).
pub fn refused_program(log: &str) -> Option<String> {
    log.lines().find_map(|l| {
        let rest = l.split("prog '").nth(1)?;
        let (name, tail) = rest.split_once('\'')?;
        tail.contains("failed to load").then(|| name.to_string())
    })
}

/// Runs `load` (a skeleton's load) with libbpf's warnings still printed to stderr and also
/// captured; when it fails, also returns the program the kernel refused and why (the verifier's
/// last line), when libbpf said so. Loads on other threads meanwhile may add to the capture.
pub(crate) fn load_explained<T>(
    load: impl FnOnce() -> std::result::Result<T, libbpf_rs::Error>,
) -> std::result::Result<T, (libbpf_rs::Error, Option<(String, String)>)> {
    let previous = libbpf_rs::set_print(Some((PrintLevel::Warn, capture_and_print)));
    LOG.lock().unwrap_or_else(|e| e.into_inner()).clear();
    let r = load();
    let log = std::mem::take(&mut *LOG.lock().unwrap_or_else(|e| e.into_inner()));
    libbpf_rs::set_print(previous);
    r.map_err(|e| {
        let why = refused_program(&log).zip(refusal_line(&log));
        (e, why)
    })
}

/// The line of a libbpf log that says why the verifier refused a program: the last line of the
/// program's load log that is not the verifier's closing statistics, or libbpf's own last warning.
pub fn refusal_line(log: &str) -> Option<String> {
    let body = match (log.find("-- BEGIN PROG LOAD LOG --"), log.find("-- END PROG LOAD LOG --")) {
        (Some(a), Some(b)) if a < b => &log[a + "-- BEGIN PROG LOAD LOG --".len()..b],
        _ => log,
    };
    body.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .filter(|l| {
            !(l.starts_with("processed ")
                || l.starts_with("verification time")
                || l.starts_with("stack depth")
                || l.starts_with("-- ")
                || l.starts_with("libbpf: failed to load object")
                || l.starts_with("libbpf: failed to load BPF skeleton"))
        })
        .last()
        .map(|l| l.trim_start_matches("libbpf: ").to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_is_the_verifiers_last_word_not_its_statistics() {
        let log = "libbpf: prog 'tokenize_text': BPF program load failed: -EACCES\n\
                   libbpf: prog 'tokenize_text': -- BEGIN PROG LOAD LOG --\n\
                   1292: (79) r1 = *(u64 *)(r10 -40)     ; R1=arena\n\
                   1293: (0f) r6 += r1\n\
                   R6 pointer arithmetic on arena prohibited\n\
                   processed 5170 insns (limit 1000000) max_states_per_insn 4 total_states 300\n\
                   -- END PROG LOAD LOG --\n\
                   libbpf: prog 'tokenize_text': failed to load: -EACCES\n\
                   libbpf: failed to load object 'ops_bpf'\n";
        assert_eq!(
            refusal_line(log).as_deref(),
            Some("R6 pointer arithmetic on arena prohibited")
        );
        // no verifier log (libbpf refused before the kernel saw it): libbpf's own last word
        let log = "libbpf: kfunc 'bpf_wq_set_callback_impl' is referenced but wasn't resolved\n\
                   libbpf: failed to load object 'ops_bpf'\n";
        assert_eq!(
            refusal_line(log).as_deref(),
            Some("kfunc 'bpf_wq_set_callback_impl' is referenced but wasn't resolved")
        );
        assert_eq!(refusal_line(""), None);
    }

    #[test]
    fn the_refused_program_is_named_from_libbpfs_log() {
        let log = "libbpf: prog 'ev_xdp': BPF program load failed: -EACCES\n\
                   libbpf: prog 'ev_xdp': -- BEGIN PROG LOAD LOG --\n\
                   R4 invalid zero-sized read: u64=[0,1023]\n\
                   -- END PROG LOAD LOG --\n\
                   libbpf: prog 'ev_xdp': failed to load: -EACCES\n";
        assert_eq!(refused_program(log).as_deref(), Some("ev_xdp"));
        assert_eq!(refused_program("libbpf: failed to load object 'ops_bpf'\n"), None);
    }

    #[test]
    fn programs_are_grouped_by_kind() {
        assert_eq!(ProgramKind::of("matvec"), ProgramKind::Forward);
        assert_eq!(ProgramKind::of("run_plan"), ProgramKind::Forward);
        assert_eq!(ProgramKind::of("generate"), ProgramKind::Generation);
        assert_eq!(ProgramKind::of("tokenize_text"), ProgramKind::Tokenizer);
        assert_eq!(ProgramKind::of("sample"), ProgramKind::Sampler);
        assert_eq!(ProgramKind::of("ev_xdp"), ProgramKind::Server);
        assert_eq!(ProgramKind::of("flt_setup"), ProgramKind::Filter);
        assert_eq!(ProgramKind::of("filter_classify"), ProgramKind::Filter);
    }
}
