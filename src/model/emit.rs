//! The forward pass, written once: [`Model::emit`] (see the module docs of [`crate::model`]).

use super::{Head, Model};
use crate::kernel::operators::{AttentionBuffers, AttentionI8Buffers};
use crate::num::fixed::AttnShape;
use crate::store::{linear_rows, Linear, Norm};
use crate::types::KvFormat;
use crate::{Error, Result};

impl Model {
    /// The forward pass of the `tokens` at positions `pos..`, one operator after another: the
    /// one statement of the step. Decoding feeds one token; prefill feeds a block of up to
    /// `b.block`, each weight-bearing operator taking the block's vectors at once (the
    /// per-position operators run token by token), so every token's integers are those of
    /// feeding it alone. It runs live for stores that cannot be planned and for blocks, and is
    /// recorded once at open into the plan ([`crate::kernel::plan`]) for one token. `head` says what
    /// step 10 does, for the last token.
    pub(super) fn emit(&mut self, tokens: &[u32], pos: usize, head: Head) -> Result<(usize, i32)> {
        let c = &self.cfg;
        let (h, hd, eps) = (c.hidden_size, c.head_dim(), self.eps_q64);
        let (nq, nkv, qd, kvd) = (
            c.num_attention_heads,
            c.num_key_value_heads,
            c.q_dim(),
            c.kv_dim(),
        );
        let (ops, store, b) = (&mut self.ops, &mut self.store, &self.b);
        let n = tokens.len();
        if n == 0 || n > b.block {
            return Err(Error::Invalid(format!(
                "a block of {n} tokens (1..={})",
                b.block
            )));
        }
        let qkv_row = (qd + 2 * kvd) * 4;
        let shape = AttnShape {
            n_q: nq,
            n_kv: nkv,
            hd,
            max_ctx: self.max_context,
        };

        // 0. x = embed_tokens[token], for each token                x [n][hidden]
        for (t, &token) in tokens.iter().enumerate() {
            store.embed(ops, token, b.x.sub(t * h * 8, h * 8)?)?;
        }
        for l in 0..c.num_hidden_layers {
            // 1. xn = RMSNorm(x; input_layernorm)                      xn [n][hidden]
            ops.rmsnorm(b.x, true, store.norm(Norm::Input(l)), b.xn, h, n, eps)?;
            // 2. q, k, v = q_proj·xn, k_proj·xn, v_proj·xn (one matrix) qkv [n][q_dim + 2 kv_dim]
            store.matvec(
                ops,
                Linear::Qkv(l),
                b.xn,
                b.qkv,
                0..linear_rows(c, Linear::Qkv(l)),
                false,
                n,
            )?;
            for t in 0..n {
                let (pos, qkv) = (pos + t, b.qkv.sub(t * qkv_row, qkv_row)?);
                let q = qkv.sub(0, qd * 4)?; // [n_q][hd]
                let k = qkv.sub(qd * 4, kvd * 4)?; // [n_kv][hd]
                let v = qkv.sub((qd + kvd) * 4, kvd * 4)?; // [n_kv][hd]
                let att = b.att.sub(t * qd * 4, qd * 4)?; // [q_dim]

                // 3. per-head q_norm / k_norm, then RoPE at pos        q [n_q][hd], k [n_kv][hd]
                ops.qk_norm_rope(
                    q,
                    k,
                    store.norm(Norm::Q(l)),
                    store.norm(Norm::K(l)),
                    b.cos, // [max_ctx][hd/2], the row at pos
                    b.sin,
                    pos,
                    nq,
                    nkv,
                    hd,
                    eps,
                )?;
                // 4. append k, v to the cache; causal GQA attention    att [q_dim]
                let kv = |a: usize| b.kv.array(l, a);
                match b.kv.format {
                    KvFormat::Q16 => {
                        let ab = AttentionBuffers {
                            q,
                            k,
                            v,
                            k_cache: kv(0).span,
                            v_cache: kv(1).span,
                            probs: b.probs,
                            acc: b.acc,
                            out: att,
                            exp2: b.exp2,
                        };
                        ops.attention(&ab, pos, shape, self.scale_q22)?;
                    }
                    KvFormat::Int8 => {
                        let ab = AttentionI8Buffers {
                            q,
                            k,
                            v,
                            k_codes: kv(0).span,
                            k_steps: kv(1).span,
                            v_codes: kv(2).span,
                            v_steps: kv(3).span,
                            codes_stride: kv(0).stride,
                            steps_stride: kv(1).stride,
                            probs: b.probs,
                            wv: b.wv,
                            qq: b.qq,
                            acc: b.acc,
                            out: att,
                            exp2: b.exp2,
                            ksh: b.ksh[l],
                        };
                        ops.attention_i8(&ab, pos, shape, self.scale_q22)?;
                    }
                }
            }
            // 5. x += o_proj · att                                     x [n][hidden]
            store.matvec(ops, Linear::O(l), b.att, b.x, 0..h, true, n)?;
            // 6. xn = RMSNorm(x; post_attention_layernorm)             xn [n][hidden]
            ops.rmsnorm(
                b.x,
                true,
                store.norm(Norm::PostAttention(l)),
                b.xn,
                h,
                n,
                eps,
            )?;
            // 7. mlp = silu(gate_proj · xn) * (up_proj · xn)           mlp [n][intermediate]
            store.gate_up_swiglu(ops, l, b.xn, b.mlp, b.exp2, 0..c.intermediate_size, n)?;
            // 8. x += down_proj · mlp                                  x [n][hidden]
            store.matvec(ops, Linear::Down(l), b.mlp, b.x, 0..h, true, n)?;
        }
        // 9. xn = RMSNorm(x; model.norm), of the last token only       xn [hidden]
        let last = b.x.sub((n - 1) * h * 8, h * 8)?;
        ops.rmsnorm(last, true, store.norm(Norm::Final), b.xn, h, 1, eps)?;
        // 10. logits = lm_head · xn, and their argmax                  logits [vocab]
        match head {
            Head::Logits => store.lm_head(ops, b.xn, Some(b.logits), 0..c.vocab_size),
            Head::Argmax if self.screened => store.lm_head_argmax(ops, b.xn, 0..c.vocab_size),
            Head::Argmax => store.lm_head(ops, b.xn, None, 0..c.vocab_size),
            Head::Skip => Ok((0, 0)),
        }
    }
}
