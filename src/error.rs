//! The crate's one error type: every variant says what went wrong and where (file, tensor, token).

use std::path::PathBuf;

/// Everything that can go wrong in `qwen_bpf`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// `config.json` is not valid JSON or lacks a field the engine needs.
    #[error("{path}: invalid config: {msg}")]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// The config asks for a feature this engine does not implement.
    #[error("{path}: unsupported model feature: {msg}")]
    Unsupported {
        /// The config file.
        path: PathBuf,
        /// Which feature.
        msg: String,
    },
    /// A safetensors file (or its index) is malformed: bad header, lying offsets, truncated data.
    #[error("{path}: malformed safetensors: {msg}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// A tensor the config requires is not in the checkpoint.
    #[error("{dir}: tensor `{name}` is missing")]
    MissingTensor {
        /// The model directory.
        dir: PathBuf,
        /// The Hugging Face tensor name.
        name: String,
    },
    /// A tensor's shape contradicts the config.
    #[error("{path}: tensor `{name}` has shape {found:?}, the config implies {expected:?}")]
    Shape {
        /// The file holding the tensor.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// Shape in the file.
        found: Vec<usize>,
        /// Shape the config implies.
        expected: Vec<usize>,
    },
    /// A tensor's dtype is not BF16, F16 or F32.
    #[error("{path}: tensor `{name}` has dtype {dtype}; supported: BF16, F16, F32")]
    Dtype {
        /// The file holding the tensor.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// The dtype found.
        dtype: String,
    },
    /// A tensor holds NaN or infinity.
    #[error("tensor `{name}`: non-finite value {value} at element {index}")]
    NonFinite {
        /// The tensor.
        name: String,
        /// Flat element index.
        index: usize,
        /// The value.
        value: f32,
    },
    /// A weight does not fit the fixed-point format it is converted to.
    #[error("tensor `{name}`: value {value} at element {index} exceeds the range of {format} (|v| < {max})")]
    OutOfRange {
        /// The tensor.
        name: String,
        /// Flat element index.
        index: usize,
        /// The value.
        value: f32,
        /// The fixed-point format, e.g. "Q24".
        format: &'static str,
        /// The largest magnitude the format holds.
        max: f64,
    },
    /// `tokenizer.json` is missing or cannot be used.
    #[error("tokenizer {path}: {msg}")]
    Tokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// A token id outside the vocabulary.
    #[error("token id {id} at index {index} is not below the vocabulary size {vocab}")]
    TokenOutOfRange {
        /// The offending id.
        id: u32,
        /// Its position: the index in the context it would have been fed at (for a list of ids
        /// that is not fed, such as a decode, its index in the list).
        index: usize,
        /// The model's vocabulary size.
        vocab: usize,
    },
    /// A saved context cannot be loaded: damaged, truncated, or made with another checkpoint,
    /// weight store or KV format.
    #[error("saved context {path}: {msg}")]
    Context {
        /// The context file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// The input does not fit the KV cache: `tokens` fed from the current position would reach
    /// position `pos`, at or past `max_context`.
    #[error("context overflow: {tokens} token(s) would reach position {pos}, past max_context {max_context}")]
    ContextOverflow {
        /// The position that was asked for: the first that does not fit (a saved context's: its
        /// length).
        pos: usize,
        /// The context the model was opened with.
        max_context: usize,
        /// How many tokens the input had (a prompt's length, 1 for a single token, a saved
        /// context's positions).
        tokens: usize,
    },
    /// A prompt that encodes to no token.
    #[error("empty prompt: nothing to feed the model")]
    EmptyPrompt,
    /// The process may not load BPF programs or create the maps it needs.
    #[error("{what}: permission denied; needs {capability} (or root)")]
    Privileges {
        /// What was attempted.
        what: String,
        /// The capabilities required.
        capability: &'static str,
    },
    /// The running kernel has a BPF feature but refused this process its use: a security policy
    /// (an LSM, a sysctl, a container's seccomp filter) or a missing capability.
    #[error("{what}: the kernel refused {feature}: {detail}; kernel {kernel} supports {plural} (Linux >= {since}), so a security policy or a missing capability forbids it")]
    Refused {
        /// What was attempted.
        what: String,
        /// The feature, as in "the kernel refused a BPF arena".
        feature: &'static str,
        /// The feature's plural, as in "kernel 6.18.44 supports arenas".
        plural: &'static str,
        /// The first Linux version that has it.
        since: &'static str,
        /// The running kernel's release (`uname -r`).
        kernel: String,
        /// The kernel's answer.
        detail: String,
    },
    /// The running kernel lacks a BPF feature.
    #[error("{what}: this kernel lacks {feature} (needs {needs}): {detail}")]
    KernelFeature {
        /// What was attempted.
        what: String,
        /// The missing feature.
        feature: &'static str,
        /// The kernel version or config that provides it.
        needs: &'static str,
        /// The kernel's answer.
        detail: String,
    },
    /// Any other BPF failure (verifier rejection, test_run error, bad return).
    #[error("BPF {what}: {detail}")]
    Bpf {
        /// Which program or map.
        what: String,
        /// What happened.
        detail: String,
    },
    /// A weight cache file is unusable (reported only where it cannot be rebuilt).
    #[error("cache {path}: {msg}")]
    Cache {
        /// The cache file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// A request that would exceed a kernel or machine limit, refused before loading.
    #[error("resource limit: {msg}")]
    Resources {
        /// The numbers involved.
        msg: String,
    },
    /// A model dimension beyond a bound of the kernels (see `num::limits`), refused when the
    /// model is opened, before anything is converted or loaded.
    #[error("{what} = {value}: the kernels need {limit}")]
    Limit {
        /// The dimension, e.g. `"intermediate_size (columns of down_proj)"`.
        what: &'static str,
        /// Its value in this model.
        value: usize,
        /// What the kernels take, e.g. `"at most 16384"`.
        limit: String,
    },
    /// A packet-filter rule ([`crate::filter::FilterRule`]) that cannot be used: not JSON, an unknown or
    /// missing field, or a value out of its range.
    #[error("filter rule: {field}: {msg}")]
    Rule {
        /// The field, as a path into the rule (`bytes`, `labels[1].text`); `JSON` when the text
        /// is not a rule at all (syntax, a type, an unknown or missing field: serde's message,
        /// with its line and column).
        field: String,
        /// What is wrong and what is allowed.
        msg: String,
    },
    /// A bad argument to a library call.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A numeric parameter out of its range, such as a NaN or negative sampling temperature.
    #[error("invalid {name} {value}: expected {expected}")]
    InvalidParameter {
        /// The parameter's name, e.g. `"temperature"`.
        name: &'static str,
        /// The value given.
        value: f64,
        /// The values accepted.
        expected: &'static str,
    },
    /// A view of the BPF arena that would lie outside its region or the mapping, or be misaligned
    /// for its element type: refused instead of creating an invalid reference.
    #[error("arena view refused: {0}")]
    ArenaView(String),
    /// A model is installed under this name already ([`crate::Model::install`]).
    #[error("a model is installed as {name:?} already ({path}); remove it first")]
    AlreadyInstalled {
        /// The name.
        name: String,
        /// Its pin directory.
        path: PathBuf,
    },
    /// No model is installed under this name.
    #[error("no model is installed as {name:?} ({path} does not exist)")]
    NotInstalled {
        /// The name.
        name: String,
        /// The pin directory it would have.
        path: PathBuf,
    },
    /// The BPF filesystem is not mounted where pins go, and mounting it failed.
    #[error("the BPF filesystem is not mounted at {path} and mounting it failed: {source}")]
    Bpffs {
        /// Where it was expected (`/sys/fs/bpf`).
        path: PathBuf,
        /// Why mounting failed.
        source: std::io::Error,
    },
    /// A pin of an installed model is missing: someone removed it, so the installation is
    /// incomplete (remove it and install again).
    #[error("the pin {path} is missing")]
    LostPin {
        /// The missing pin.
        path: PathBuf,
    },
    /// A directory pins go in could be turned against whoever installs or removes: a symbolic
    /// link, not a directory, owned by another user, or writable by others.
    #[error("refusing the pin directory {path}: {reason}")]
    UnsafePinDir {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// `Result` with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An [`Error::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
