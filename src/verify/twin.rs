//! The fixed-point twin of the whole forward pass: [`crate::Model::forward`]'s steps, computed in
//! Rust with the [`crate::num::fixed`] operators on the same Q24 cache. It must produce the same
//! integers as the BPF path, bit for bit (tested); it is also a readable statement of the math.

use std::path::Path;

use crate::num::fixed::{self, AttnShape};
use crate::types::KvFormat;
use crate::num::kv8;
use crate::store::cache::CacheFile;
use crate::store::q24;
use crate::{Checkpoint, Config, Result};

/// The Rust twin of a Q24 [`crate::Model`].
#[derive(Debug)]
pub struct TwinModel {
    cfg: Config,
    w: CacheFile,
    max_ctx: usize,
    pos: usize,
    k_cache: Vec<Vec<i32>>, // Q16 KV: per layer [max_ctx][kv_dim]
    v_cache: Vec<Vec<i32>>,
    kv8: Vec<kv8::Cache>, // int8 KV: per layer
    ksh: Vec<Vec<u8>>,    // int8 KV: per layer, the key smoothing shifts [hd]
    exp2: [u32; 257],
    cos: Vec<i32>, // [max_ctx][hd/2]
    sin: Vec<i32>,
}

impl TwinModel {
    /// Opens `dir`'s Q24 cache (converting into `cache_dir` if needed), with a Q16 KV cache.
    pub fn open(dir: &Path, cache_dir: &Path, max_ctx: usize) -> Result<TwinModel> {
        Self::open_with_kv(dir, cache_dir, max_ctx, KvFormat::Q16)
    }

    /// As [`TwinModel::open`], with the KV cache in format `kv`.
    pub fn open_with_kv(
        dir: &Path,
        cache_dir: &Path,
        max_ctx: usize,
        kv: KvFormat,
    ) -> Result<TwinModel> {
        let ck = Checkpoint::open(dir)?;
        let w = q24::open_or_convert(&ck, cache_dir, false)?;
        let cfg = ck.config.clone();
        let (cos, sin) = fixed::rope_tables(cfg.rope_theta(), cfg.head_dim(), max_ctx);
        let (q16_len, layers8) = match kv {
            KvFormat::Q16 => (max_ctx * cfg.kv_dim(), 0),
            KvFormat::Int8 => (0, cfg.num_hidden_layers),
        };
        let shape = AttnShape {
            n_q: cfg.num_attention_heads,
            n_kv: cfg.num_key_value_heads,
            hd: cfg.head_dim(),
            max_ctx,
        };
        Ok(TwinModel {
            k_cache: vec![vec![0; q16_len]; cfg.num_hidden_layers],
            v_cache: vec![vec![0; q16_len]; cfg.num_hidden_layers],
            kv8: vec![kv8::Cache::new(shape); layers8],
            ksh: (0..layers8)
                .map(|l| {
                    let name = format!("model.layers.{l}.self_attn.k_norm.weight");
                    Ok(kv8::key_shifts(w.i32s(&name)?))
                })
                .collect::<Result<_>>()?,
            cfg,
            w,
            max_ctx,
            pos: 0,
            exp2: fixed::exp2_table(),
            cos,
            sin,
        })
    }

    fn t(&self, name: &str) -> Result<&[i32]> {
        self.w.i32s(name)
    }

    /// Feeds `token`; returns the Q16 logits and their argmax.
    pub fn forward(&mut self, token: u32) -> Result<(Vec<i32>, usize)> {
        let c = self.cfg.clone();
        crate::types::check_feed(&[token], self.pos, self.max_ctx, c.vocab_size)?;
        let (h, hd, pos) = (c.hidden_size, c.head_dim(), self.pos);
        let (qd, kvd, ffn) = (c.q_dim(), c.kv_dim(), c.intermediate_size);
        let eps = fixed::eps_q64(c.rms_norm_eps);
        let scale = fixed::attn_scale_q22(hd);
        let shape = AttnShape {
            n_q: c.num_attention_heads,
            n_kv: c.num_key_value_heads,
            hd,
            max_ctx: self.max_ctx,
        };
        let (cos, sin) = (
            &self.cos[pos * hd / 2..(pos + 1) * hd / 2],
            &self.sin[pos * hd / 2..(pos + 1) * hd / 2],
        );

        let mut x = vec![0i64; h]; // [hidden] the Q32 residual stream
        let mut xn = vec![0i32; h]; // [hidden]
        let mut qkv = vec![0i32; qd + 2 * kvd]; // [q_dim + 2 kv_dim]
        let mut att = vec![0i32; qd]; // [q_dim]
        let mut mlp = vec![0i32; ffn]; // [intermediate]
                                       // 0. x = embed_tokens[token]
        fixed::embed(
            self.t("model.embed_tokens.weight")?,
            token as usize,
            h,
            &mut x,
        );
        for l in 0..c.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let t = |n: &str| self.w.i32s(&format!("{p}.{n}"));
            // 1. xn = RMSNorm(x; input_layernorm)
            fixed::rmsnorm(&x, t("input_layernorm.weight")?, eps, fixed::Q_ACT, &mut xn);
            // 2. q, k, v (the three matrices are consecutive in the cache, like the arena)
            let (wq, wk, wv) = (
                t("self_attn.q_proj.weight")?,
                t("self_attn.k_proj.weight")?,
                t("self_attn.v_proj.weight")?,
            );
            fixed::matvec(wq, &xn, 0..qd, &mut qkv[..qd]);
            fixed::matvec(wk, &xn, 0..kvd, &mut qkv[qd..qd + kvd]);
            fixed::matvec(wv, &xn, 0..kvd, &mut qkv[qd + kvd..]);
            // 3. q_norm / k_norm, RoPE
            let (q, kv) = qkv.split_at_mut(qd);
            let (k, v) = kv.split_at_mut(kvd);
            fixed::qk_norm_rope(
                q,
                k,
                t("self_attn.q_norm.weight")?,
                t("self_attn.k_norm.weight")?,
                cos,
                sin,
                hd,
                eps,
            );
            // 4. attention
            if let Some(c8) = self.kv8.get_mut(l) {
                let ksh = &self.ksh[l];
                kv8::attention(q, k, v, c8, ksh, pos, shape, scale, &self.exp2, &mut att);
            } else {
                let (kc, vc) = (&mut self.k_cache[l], &mut self.v_cache[l]);
                fixed::attention(q, k, v, kc, vc, pos, shape, scale, &self.exp2, &mut att);
            }
            // 5. x += o_proj · att
            fixed::matvec_residual(
                self.w.i32s(&format!("{p}.self_attn.o_proj.weight"))?,
                &att,
                0..h,
                &mut x,
            );
            // 6. xn = RMSNorm(x; post_attention_layernorm)
            fixed::rmsnorm(
                &x,
                self.w
                    .i32s(&format!("{p}.post_attention_layernorm.weight"))?,
                eps,
                fixed::Q_ACT,
                &mut xn,
            );
            // 7. mlp = silu(gate · xn) * (up · xn)
            let (g, u) = (
                self.w.i32s(&format!("{p}.mlp.gate_proj.weight"))?,
                self.w.i32s(&format!("{p}.mlp.up_proj.weight"))?,
            );
            fixed::gate_up_swiglu(g, u, &xn, 0..ffn, &self.exp2, &mut mlp);
            // 8. x += down_proj · mlp
            fixed::matvec_residual(
                self.w.i32s(&format!("{p}.mlp.down_proj.weight"))?,
                &mlp,
                0..h,
                &mut x,
            );
        }
        // 9. final norm; 10. LM head and argmax
        fixed::rmsnorm(&x, self.t("model.norm.weight")?, eps, fixed::Q_ACT, &mut xn);
        let head = if c.tie_word_embeddings {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        let mut logits = vec![0i32; c.vocab_size];
        let (best, _) =
            fixed::lm_head_argmax(self.t(head)?, &xn, 0..c.vocab_size, Some(&mut logits));
        self.pos += 1;
        Ok((logits, best))
    }
}
