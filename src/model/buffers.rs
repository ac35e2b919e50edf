//! The forward pass's arena buffers, listed once: [`buffers!`] below turns the one table into the
//! [`Buffers`] struct, the byte size of each buffer ([`Buffers::bytes`], which sizes the arena up
//! front and is the memory account) and their allocation ([`Buffers::alloc`]).

use crate::kernel::arena::{Arena, Region, PAGE};
use crate::kernel::operators::kv8_pairs;
use crate::kernel::plan::{self, Plan};
use crate::model::kv::KvCache;
use crate::num::fixed;
use crate::types::KvFormat;
use crate::{Config, Result};

/// What sizes the buffers: the model's config and the context they serve.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape<'a> {
    pub cfg: &'a Config,
    /// KV-cache capacity in positions.
    pub max_ctx: usize,
    pub kv: KvFormat,
    /// Threads the plan is split across.
    pub threads: usize,
    /// Tokens the block buffers hold: the prefill block ([`crate::Backend::prefill_block`]), 1
    /// for an event context.
    pub block: usize,
    /// Bytes of the reply text buffer: [`REPLY_TEXT_BYTES`] for an event context, 0 otherwise.
    pub text: usize,
}

/// The text buffer of each event context: the generated text an installed model keeps for its
/// client's polls (`src/bpf/event.inc.c`); a generation stops when it is full.
pub const REPLY_TEXT_BYTES: usize = 16 * 1024;

impl Shape<'_> {
    /// GQA pairs of the int8-KV attention scratch (0 with the Q16 cache).
    fn pairs(&self) -> usize {
        match self.kv {
            KvFormat::Q16 => 0,
            KvFormat::Int8 => kv8_pairs(self.cfg.num_attention_heads, self.cfg.num_key_value_heads),
        }
    }
}

/// `name: "label" = bytes;` for each buffer, with its element type and shape beside it.
macro_rules! buffers {
    ($($(#[$doc:meta])* $name:ident: $label:literal = |$s:ident| $bytes:expr;)*) => {
        /// Arena buffers of the forward pass (one table: see the module docs).
        #[derive(Debug)]
        pub(crate) struct Buffers {
            $($(#[$doc])* pub $name: Region,)*
            /// Per layer: Q16 K, V `[max_ctx][kv_dim]`, or the int8 codes and steps.
            pub kv: KvCache,
            /// Per layer u8 `[head_dim]`: the int8 KV cache's key smoothing shifts (else empty).
            pub ksh: Vec<Region>,
            /// Tokens the block buffers hold.
            pub block: usize,
        }

        impl Buffers {
            /// Each buffer's label and bytes for `s`, in allocation order (without the KV cache
            /// and the key shifts: [`Buffers::arena_bytes`] adds them).
            fn table(s: &Shape) -> Vec<(&'static str, usize)> {
                vec![$(($label, { let $s = s; $bytes }),)*]
            }

            /// Reserves every buffer for `s` in `arena`, writes the tables (exp2, RoPE) and the
            /// key smoothing shifts (`key_shifts`: one per layer with the int8 cache, else none).
            pub fn alloc(arena: &mut Arena, s: &Shape, key_shifts: &[Vec<u8>]) -> Result<Buffers> {
                let b = Buffers {
                    $($name: { let $s = s; arena.alloc($bytes, $label)? },)*
                    kv: KvCache::reserve(arena, s.kv, s.cfg, s.max_ctx)?,
                    ksh: key_shifts
                        .iter()
                        .map(|k| {
                            let r = arena.alloc(k.len(), "key smoothing shifts")?;
                            arena.slice_mut::<u8>(r)?.copy_from_slice(k);
                            Ok(r)
                        })
                        .collect::<Result<_>>()?,
                    block: s.block,
                };
                arena.slice_mut::<u32>(b.exp2)?.copy_from_slice(&fixed::exp2_table());
                let (cos, sin) = fixed::rope_tables(s.cfg.rope_theta(), s.cfg.head_dim(), s.max_ctx);
                arena.slice_mut::<i32>(b.cos)?.copy_from_slice(&cos);
                arena.slice_mut::<i32>(b.sin)?.copy_from_slice(&sin);
                Ok(b)
            }
        }
    };
}

buffers! {
    /// i64 Q32 `[block][hidden]`: the residual stream.
    x: "x" = |s| s.block * s.cfg.hidden_size * 8;
    /// i32 Q16 `[block][hidden]`: RMSNorm output.
    xn: "xn" = |s| s.block * s.cfg.hidden_size * 4;
    /// i32 Q16 `[block][q_dim + 2 kv_dim]`: q, k, v of each position.
    qkv: "qkv" = |s| s.block * (s.cfg.q_dim() + 2 * s.cfg.kv_dim()) * 4;
    /// i32 Q16 `[block][q_dim]`: attention output.
    att: "att" = |s| s.block * s.cfg.q_dim() * 4;
    /// i32 Q16 `[block][intermediate]`: silu(gate) * up.
    mlp: "mlp" = |s| s.block * s.cfg.intermediate_size * 4;
    /// i32 Q16 `[vocab]`.
    logits: "logits" = |s| s.cfg.vocab_size * 4;
    /// u32 Q30 `[n_q][max_ctx]`: attention scratch.
    probs: "attention probabilities" = |s| s.cfg.num_attention_heads * s.max_ctx * 4;
    /// i64 `[n_q][head_dim]`: attention scratch.
    acc: "attention accumulators" = |s| s.cfg.num_attention_heads * s.cfg.head_dim() * 8;
    /// u64 `[n_pairs][max_ctx]`: int8-KV attention scratch (else empty).
    wv: "attention value weights" = |s| s.pairs() * s.max_ctx * 8;
    /// u64 `[n_pairs][head_dim]`: int8-KV attention scratch (else empty).
    qq: "attention packed queries" = |s| s.pairs() * s.cfg.head_dim() * 8;
    /// u32 Q30 `[257]`.
    exp2: "exp2 table" = |_s| 257 * 4;
    /// i32 Q30 `[max_ctx][head_dim/2]`.
    cos: "RoPE cos" = |s| s.max_ctx * s.cfg.head_dim() / 2 * 4;
    /// i32 Q30 `[max_ctx][head_dim/2]`.
    sin: "RoPE sin" = |s| s.max_ctx * s.cfg.head_dim() / 2 * 4;
    /// `plan::Slot [threads][entries]`: the recorded step (see [`crate::kernel::plan`]).
    plan: "plan slots" = |s| Plan::arena_bytes(plan_capacity(s.cfg), s.threads.clamp(1, plan::THREADS_MAX));
    /// u32 `[vocab]`: times each token was seen, for the in-kernel sampler's penalties.
    counts: "sampling counts" = |s| s.cfg.vocab_size * 4;
    /// u64 `[SAMPLE_BUCKETS]`: the in-kernel sampler's radix-select histogram.
    hist: "sampling histogram" = |_s| crate::num::limits::SAMPLE_BUCKETS * 8;
    /// u32 `[max_ctx]`: the prompt of in-kernel generation.
    prompt: "in-kernel prompt" = |s| s.max_ctx * 4;
    /// u32 offsets `[vocab + 1]`, then the bytes: each token's text, for in-kernel generation
    /// (16 bytes a token reserved; Qwen3's average under 7, pages committed only as written).
    vocab: "vocabulary text" = |s| (s.cfg.vocab_size + 1) * 4 + s.cfg.vocab_size * 16;
    /// u8 `[text]`: an event context's generated text, for its client's polls (else empty).
    text: "reply text" = |s| s.text;
}

impl Buffers {
    /// Arena bytes of the scratch buffers (the key shifts included) and of the KV cache for
    /// `s`, page-rounded as the arena allocates them.
    pub fn arena_bytes(s: &Shape) -> (usize, usize) {
        let page = |b: usize| b.div_ceil(PAGE) * PAGE;
        let shifts = match s.kv {
            KvFormat::Q16 => 0,
            KvFormat::Int8 => s.cfg.num_hidden_layers * page(s.cfg.head_dim()),
        };
        let scratch = Buffers::table(s).iter().map(|&(_, b)| page(b)).sum::<usize>() + shifts;
        (scratch, KvCache::reserved_bytes(s.kv, s.cfg, s.max_ctx))
    }
}

/// Plan entries the arena holds room for.
pub(crate) fn plan_capacity(cfg: &Config) -> usize {
    plan::ENTRIES_PER_LAYER * (cfg.num_hidden_layers + 1)
}
