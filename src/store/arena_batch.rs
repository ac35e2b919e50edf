//! The arena-batch store, for hosts that cannot spare gigabytes of kernel memory: weights stay in
//! the memory-mapped Q24 cache file, and before each operator run Rust copies the next rows into
//! a 2 MiB arena window through the arena's mmap (as many whole rows as the window holds); the
//! kernel computes on them with the same programs as the resident store, so the logits are
//! byte-identical to [`super::q24::Q24Store`]'s. The RMSNorm weights (~260 KB at the 0.6B shape)
//! stay resident inside the same 2 MiB budget.

use std::path::Path;

use super::cache::CacheFile;
use super::{q24, Linear, Norm, ResidentNorms, WeightStore};
use crate::kernel::arena::{Region, PAGE};
use crate::kernel::ops::{first_best, Ops, Rows};
use crate::{Checkpoint, Config, Error, Result};

/// Kernel memory for weights: the window plus the resident norm weights.
pub const WEIGHT_BYTES: usize = 2 << 20;

/// Byte offsets (in the cache payload) of one layer's matrices.
#[derive(Debug, Clone, Copy)]
struct LayerOffsets {
    qkv: usize,
    o: usize,
    gate: usize,
    up: usize,
    down: usize,
}

super::layer_linears!(LayerOffsets: usize);

/// Q24 weights streamed through a small arena window.
#[derive(Debug)]
pub struct ArenaBatchStore {
    cache: CacheFile,
    cfg: Config,
    layers: Vec<LayerOffsets>,
    embed: usize,
    lm_head: usize,
    /// Norm tensors in cache order with their resident regions.
    norms: ResidentNorms,
    window: Region,
}

impl ArenaBatchStore {
    /// Opens (converting if needed) the Q24 cache of `ck` in `cache_dir`.
    pub fn open(ck: &Checkpoint, cache_dir: &Path, progress: bool) -> Result<ArenaBatchStore> {
        let cache = q24::open_or_convert(ck, cache_dir, progress)?;
        let off = |n: &str| cache.entry(n).map(|e| e.offset);
        let layers = (0..ck.config.num_hidden_layers)
            .map(|l| {
                let p = format!("model.layers.{l}");
                Ok(LayerOffsets {
                    qkv: off(&format!("{p}.self_attn.q_proj.weight"))?,
                    o: off(&format!("{p}.self_attn.o_proj.weight"))?,
                    gate: off(&format!("{p}.mlp.gate_proj.weight"))?,
                    up: off(&format!("{p}.mlp.up_proj.weight"))?,
                    down: off(&format!("{p}.mlp.down_proj.weight"))?,
                })
            })
            .collect::<Result<_>>()?;
        let embed = off("model.embed_tokens.weight")?;
        let lm_head = if ck.config.tie_word_embeddings {
            embed
        } else {
            off("lm_head.weight")?
        };
        Ok(ArenaBatchStore {
            cfg: ck.config.clone(),
            layers,
            embed,
            lm_head,
            norms: ResidentNorms::default(),
            window: Region::default(),
            cache,
        })
    }

    /// Copies rows `rows` of the `k`-column matrix at payload offset `base` to byte `at` of the
    /// window; returns the window sub-region holding them.
    fn stage(
        &self,
        ops: &mut Ops,
        base: usize,
        k: usize,
        rows: &Rows,
        at: usize,
    ) -> Result<Region> {
        let (start, len) = (base + rows.start * k * 4, rows.len() * k * 4);
        let dst = self.window.sub(at, len)?;
        ops.arena
            .slice_mut::<u8>(dst)?
            .copy_from_slice(&self.cache.payload()[start..start + len]);
        Ok(dst)
    }

    /// Row batches of `rows` such that `mats` matrices of `k` columns fit the window together.
    fn batches(&self, rows: Rows, k: usize, mats: usize) -> impl Iterator<Item = Rows> {
        let per = (self.window.len / (mats * k * 4) / 8 * 8).max(1);
        let end = rows.end;
        rows.step_by(per).map(move |r| r..(r + per).min(end))
    }
}

impl WeightStore for ArenaBatchStore {
    fn name(&self) -> &'static str {
        "arena"
    }

    fn arena_bytes(&self) -> usize {
        WEIGHT_BYTES
    }

    fn upload(&mut self, ops: &mut Ops) -> Result<()> {
        let used = ops.arena.used();
        self.norms = ResidentNorms::upload(&self.cache, ops)?;
        let left = WEIGHT_BYTES.checked_sub(ops.arena.used() - used).filter(|l| *l >= 64 * PAGE).ok_or_else(|| Error::Resources {
            msg: format!("norm weights take {} bytes: no room for a window in the {WEIGHT_BYTES}-byte budget", ops.arena.used() - used),
        })?;
        self.window = ops.arena.alloc(left, "weight window")?;
        let widest = self
            .cfg
            .hidden_size
            .max(self.cfg.intermediate_size)
            .max(self.cfg.q_dim());
        if self.window.len < 2 * widest * 4 * 8 {
            return Err(Error::Resources {
                msg: format!(
                    "a {}-byte window cannot hold 8 rows of two {widest}-wide matrices",
                    self.window.len
                ),
            });
        }
        Ok(())
    }

    fn norm(&self, n: Norm) -> Region {
        self.norms.get(n)
    }

    fn embed(&mut self, ops: &mut Ops, token: u32, x: Region) -> Result<()> {
        let h = self.cfg.hidden_size;
        let row = self.stage(ops, self.embed, h, &(token as usize..token as usize + 1), 0)?;
        ops.embed(row, 0, h, x)
    }

    fn matvec(
        &mut self,
        ops: &mut Ops,
        m: Linear,
        x: Region,
        y: Region,
        rows: Rows,
        accumulate: bool,
        n: usize,
    ) -> Result<()> {
        let k = super::linear_cols(&self.cfg, m);
        let batch = super::batch(&self.cfg, m, accumulate, n);
        let base = super::linear(&self.layers, m);
        for b in self.batches(rows, k, 1).collect::<Vec<_>>() {
            let w = self.stage(ops, base, k, &b, 0)?;
            ops.matvec_batch(w, x, y, k, b, accumulate, batch)?;
        }
        Ok(())
    }

    fn gate_up_swiglu(
        &mut self,
        ops: &mut Ops,
        layer: usize,
        x: Region,
        y: Region,
        exp2: Region,
        rows: Rows,
        n: usize,
    ) -> Result<()> {
        let (k, l) = (self.cfg.hidden_size, self.layers[layer]);
        let batch = super::mlp_batch(&self.cfg, n);
        let half = self.window.len / 2 / PAGE * PAGE;
        for b in self.batches(rows, k, 2).collect::<Vec<_>>() {
            let g = self.stage(ops, l.gate, k, &b, 0)?;
            let u = self.stage(ops, l.up, k, &b, half)?;
            ops.gate_up_swiglu_batch(g, u, x, y, exp2, k, b, batch)?;
        }
        Ok(())
    }

    fn lm_head(
        &mut self,
        ops: &mut Ops,
        x: Region,
        logits: Option<Region>,
        rows: Rows,
    ) -> Result<(usize, i32)> {
        let k = self.cfg.hidden_size;
        let mut bests = Vec::new();
        for b in self.batches(rows.clone(), k, 1).collect::<Vec<_>>() {
            let w = self.stage(ops, self.lm_head, k, &b, 0)?;
            let (r, v) = ops.lm_head_argmax(w, x, logits, k, b)?;
            bests.push((r, v as i64));
        }
        Ok(first_best(rows.start, bests))
    }
}
