//! Weight stores: how a tensor's rows reach the kernel at the moment an operator needs them.
//!
//! The model code calls a store for every weight-bearing step (embedding, the linear layers, the
//! fused gate/up/SwiGLU, the LM head) and never touches weight memory itself, so a store may keep
//! everything resident in the arena ([`q24::Q24Store`]), stream rows through a small window, or
//! use another number format with its own kernels. RMSNorm weights are tiny and always resident.

pub mod arena_batch;
pub mod cache;
pub mod int;
pub mod q24;
pub mod screen;

use std::path::Path;

use crate::kernel::arena::Region;
use crate::kernel::operators::Batch;
use crate::kernel::ops::{Ops, Rows};
use crate::types::Backend;
use crate::{Checkpoint, Config, Result};

/// A linear layer of one decoder layer, as the forward pass uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Linear {
    /// `q_proj`, `k_proj` and `v_proj` stacked: `[q_dim + 2 kv_dim][hidden]`.
    Qkv(usize),
    /// `o_proj`: `[hidden][q_dim]`.
    O(usize),
    /// `down_proj`: `[hidden][intermediate]`.
    Down(usize),
}

/// A store's per-layer weights, which hold the three matrices [`Linear`] names (in the store's
/// own form: regions, packed regions, cache offsets).
pub(crate) trait Layer {
    /// How the store holds one matrix.
    type Matrix: Copy;
    /// The layer's `[qkv, o, down]`.
    fn linears(&self) -> [Self::Matrix; 3];
}

/// Implements [`Layer`] for a struct with `qkv`, `o` and `down` fields of type `$m`.
macro_rules! layer_linears {
    ($layer:ty: $m:ty) => {
        impl super::Layer for $layer {
            type Matrix = $m;
            fn linears(&self) -> [$m; 3] {
                [self.qkv, self.o, self.down]
            }
        }
    };
}
pub(crate) use layer_linears;

/// `layers`' matrix that `m` names: the one place that maps a [`Linear`] to a layer's field.
pub(crate) fn linear<L: Layer>(layers: &[L], m: Linear) -> L::Matrix {
    let (l, i) = match m {
        Linear::Qkv(l) => (l, 0),
        Linear::O(l) => (l, 1),
        Linear::Down(l) => (l, 2),
    };
    layers[l].linears()[i]
}

/// An RMSNorm weight vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Norm {
    /// `input_layernorm` of a layer.
    Input(usize),
    /// `post_attention_layernorm` of a layer.
    PostAttention(usize),
    /// `self_attn.q_norm` of a layer.
    Q(usize),
    /// `self_attn.k_norm` of a layer.
    K(usize),
    /// `model.norm`.
    Final,
}

impl Norm {
    /// The Hugging Face tensor name.
    pub fn tensor_name(self) -> String {
        match self {
            Norm::Input(l) => format!("model.layers.{l}.input_layernorm.weight"),
            Norm::PostAttention(l) => format!("model.layers.{l}.post_attention_layernorm.weight"),
            Norm::Q(l) => format!("model.layers.{l}.self_attn.q_norm.weight"),
            Norm::K(l) => format!("model.layers.{l}.self_attn.k_norm.weight"),
            Norm::Final => "model.norm.weight".into(),
        }
    }
}

/// Where the weights live and how each weight-bearing operator reaches them.
///
/// Implementations are driven by [`crate::Model`]: [`WeightStore::arena_bytes`] sizes the arena,
/// [`WeightStore::upload`] runs once after the BPF programs are loaded, and the operator methods
/// run once per token each, or once per prefill block of `n` tokens (`rows` lets the caller
/// split a matrix across CPUs).
pub trait WeightStore: Send {
    /// Short name ("q24", "arena", …).
    fn name(&self) -> &'static str;
    /// Arena bytes this store needs for weights (resident tensors or staging windows).
    fn arena_bytes(&self) -> usize;
    /// Reserves its arena space and copies in whatever it keeps resident.
    fn upload(&mut self, ops: &mut Ops) -> Result<()>;
    /// The resident RMSNorm weight (Q20).
    fn norm(&self, n: Norm) -> Region;
    /// `x = embed_tokens[token]` in Q16.
    fn embed(&mut self, ops: &mut Ops, token: u32, x: Region) -> Result<()>;
    /// `y[rows] (+)= W[rows] · x` for each of `n` vectors: x `[n][cols]`, y `[n][rows of m]`
    /// (i32, or the i64 residual stream when accumulating). `n` is 1 when decoding and at most
    /// [`Backend::prefill_block`].
    #[allow(clippy::too_many_arguments)]
    fn matvec(
        &mut self,
        ops: &mut Ops,
        m: Linear,
        x: Region,
        y: Region,
        rows: Rows,
        accumulate: bool,
        n: usize,
    ) -> Result<()>;
    /// `y[rows] = silu(gate[rows] · x) * (up[rows] · x)` for `layer`, for each of `n` vectors:
    /// x `[n][hidden]`, y `[n][intermediate]`.
    #[allow(clippy::too_many_arguments)]
    fn gate_up_swiglu(
        &mut self,
        ops: &mut Ops,
        layer: usize,
        x: Region,
        y: Region,
        exp2: Region,
        rows: Rows,
        n: usize,
    ) -> Result<()>;
    /// Logits of `rows` (written to `logits` when given) and their argmax (row, Q16 logit).
    fn lm_head(
        &mut self,
        ops: &mut Ops,
        x: Region,
        logits: Option<Region>,
        rows: Rows,
    ) -> Result<(usize, i32)>;
    /// The argmax (row, Q16 logit) of the whole head (`rows` is all of it), exactly what
    /// `lm_head(ops, x, None, rows)` returns. Stores with a screen ([`WeightStore::enable_screen`])
    /// compute it at the screen's cost (see [`crate::num::bound`]).
    fn lm_head_argmax(&mut self, ops: &mut Ops, x: Region, rows: Rows) -> Result<(usize, i32)> {
        self.lm_head(ops, x, None, rows)
    }
    /// Asks for what a recorded plan ([`crate::kernel::plan`]) needs: every tensor an operator reads
    /// resident in the arena (the int stores then keep their embedding table there too), and
    /// scratch for `contexts` contexts that may run at once; call before
    /// [`WeightStore::arena_bytes`]. Returns whether this store's operators can be planned:
    /// false for stores that move weights from user space between runs.
    fn enable_plan(&mut self, _contexts: usize) -> bool {
        false
    }
    /// Makes context `i` (of those [`WeightStore::enable_plan`] asked for) the one whose
    /// scratch the operator methods use: for recording each context's plan.
    fn set_context(&mut self, _i: usize) {}
    /// Asks for a screened head, built at [`WeightStore::upload`]; call before
    /// [`WeightStore::arena_bytes`]. Returns whether this store has one.
    fn enable_screen(&mut self) -> bool {
        false
    }
    /// Arena bytes of the screen (part of [`WeightStore::arena_bytes`]).
    fn screen_bytes(&self) -> usize {
        0
    }
    /// What the screened head found at the last [`WeightStore::lm_head_argmax`] (`None`: no
    /// screen, or the token fell back to the exact head).
    fn screen_result(&self) -> Option<crate::kernel::swar_ops::ScreenResult> {
        None
    }
}

/// RMSNorm weights (Q20) copied from a cache file into the arena: every store keeps them resident.
#[derive(Debug, Default)]
pub(crate) struct ResidentNorms(Vec<(String, Region)>);

impl ResidentNorms {
    /// Copies every Q20 entry of `cache` into its own arena region.
    pub(crate) fn upload(cache: &cache::CacheFile, ops: &mut Ops) -> Result<ResidentNorms> {
        let mut v = Vec::new();
        for e in cache
            .header
            .tensors
            .iter()
            .filter(|e| e.q == crate::num::fixed::Q_NORM)
        {
            let r = ops.arena.alloc(e.len, "norm weights")?;
            ops.arena
                .slice_mut::<u8>(r)?
                .copy_from_slice(&cache.payload()[e.offset..e.offset + e.len]);
            v.push((e.name.clone(), r));
        }
        Ok(ResidentNorms(v))
    }

    /// The region of norm `n`.
    pub(crate) fn get(&self, n: Norm) -> Region {
        let name = n.tensor_name();
        self.0
            .iter()
            .find(|(t, _)| *t == name)
            .map(|(_, r)| *r)
            .expect("norm weights are uploaded for every tensor_specs norm")
    }
}

/// Tokens per prefill block, for every store: each weight row block is read from memory once
/// per block and multiplied by the block's vectors while it is in the L1 cache. 16 makes the
/// weight traffic a sixteenth of token-by-token prefill, while a block's activations (at most
/// 16 × intermediate × 8 bytes of quantised x) stay in the L2 cache.
pub const PREFILL_BLOCK: usize = 16;

/// The batch of `n` vectors through linear layer `m`: y's vectors are the layer's rows apart, in
/// i64 (the residual stream) when accumulating, else i32.
pub(crate) fn batch(cfg: &Config, m: Linear, accumulate: bool, n: usize) -> Batch {
    let elem = if accumulate { 8 } else { 4 };
    Batch {
        n,
        y_stride: linear_rows(cfg, m) * elem,
    }
}

/// The batch of `n` vectors through the MLP's gate/up half: y `[n][intermediate]` i32.
pub(crate) fn mlp_batch(cfg: &Config, n: usize) -> Batch {
    Batch {
        n,
        y_stride: cfg.intermediate_size * 4,
    }
}

/// Rows of a linear layer for `cfg`.
pub fn linear_rows(cfg: &Config, m: Linear) -> usize {
    match m {
        Linear::Qkv(_) => cfg.q_dim() + 2 * cfg.kv_dim(),
        Linear::O(_) | Linear::Down(_) => cfg.hidden_size,
    }
}

/// Columns of a linear layer for `cfg`.
pub fn linear_cols(cfg: &Config, m: Linear) -> usize {
    match m {
        Linear::Qkv(_) => cfg.hidden_size,
        Linear::O(_) => cfg.q_dim(),
        Linear::Down(_) => cfg.intermediate_size,
    }
}


impl Backend {
    /// Opens the store for `ck`, converting (and caching in `cache_dir`) as needed.
    pub fn open(
        self,
        ck: &Checkpoint,
        cache_dir: &Path,
        progress: bool,
    ) -> Result<Box<dyn WeightStore>> {
        match self {
            Backend::Q24 => Ok(Box::new(q24::Q24Store::open(ck, cache_dir, progress)?)),
            Backend::Arena => Ok(Box::new(arena_batch::ArenaBatchStore::open(
                ck, cache_dir, progress,
            )?)),
            Backend::Int4 => Ok(Box::new(int::IntStore::open(
                ck,
                cache_dir,
                int::INT4,
                progress,
            )?)),
            Backend::Int8 => Ok(Box::new(int::IntStore::open(
                ck,
                cache_dir,
                int::INT8,
                progress,
            )?)),
        }
    }

    /// Tokens per prefill block ([`crate::Model::prefill`]) of this backend's store.
    pub fn prefill_block(self) -> usize {
        PREFILL_BLOCK
    }
}
