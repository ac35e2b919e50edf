//! The low-bit stores: linear weights quantised group-wise (32 columns, a Q24 scale per row and
//! group) to 4 or 8 bits and multiplied by the SWAR kernels of `src/bpf/swar.inc.c`, with the
//! activations quantised per 32-column block in BPF before each matrix. A [`Plan`] says which
//! format each kind of matrix gets. RMSNorm weights stay Q20 and resident; the embedding table
//! stays Q24 in the memory-mapped cache file and one row is staged per token.
//!
//! Cache file (`qwen_bpf.int4` / `qwen_bpf.int8`, see [`super::cache`]): the norm vectors (Q20),
//! `model.embed_tokens.weight` (Q24), then per matrix `<name>.words` (u64, kernel layout) and
//! `<name>.scales` (u32 Q24). q, k and v are stacked as `model.layers.N.self_attn.qkv`, gate and
//! up as `model.layers.N.mlp.gate_up`: one kernel run each.

use std::path::Path;

use super::cache::{self, CacheFile, Entry};
use super::{Linear, Norm, ResidentNorms, WeightStore};
use crate::hf::checkpoint::tensor_specs;
use crate::num::fixed::{self, Q_NORM, Q_W};
use crate::kernel::arena::Region;
use crate::kernel::operators::Batch;
use crate::kernel::ops::{Ops, Rows};
use crate::kernel::swar_ops::{
    unpack_scratch_bytes, ExactHead, PackedRegions, QuantXRegion, ScreenResult,
};
use crate::num::bound::Screen;
use crate::store::screen::ScreenedHead;
use crate::num::swar::{self, Format, PackedMatrix, W4A8, W8A16};
use crate::{Checkpoint, Config, Result};

/// Which format each kind of matrix is stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Cache format name ("int4", "int8").
    pub name: &'static str,
    /// q/k/v projections (stacked).
    pub qkv: Format,
    /// o projection.
    pub o: Format,
    /// gate and up projections.
    pub gate_up: Format,
    /// down projection.
    pub down: Format,
    /// The LM head.
    pub lm_head: Format,
}

/// INT4: every decoder matrix 4-bit; the LM head stays 8-bit (a 4-bit head halved argmax
/// agreement on the tiny synthetic model for 17 ms/token saved). On a trained checkpoint
/// (docs/accuracy.md: `train_tiny`, then `rounding --bits 4 --only NAME`) each kind of decoder
/// matrix contributes a similar share of the KL divergence (q 0.8e-3, k 0.9e-3, v 1.0e-3,
/// o 0.9e-3, gate 1.5e-3, up 0.8e-3, down 1.2e-3 of 6.8e-3 in all), so none is worth 8 bits
/// alone; 8-bit q/k/v would remove ~40 % of it for ~20 % more decode time at the 0.6B shape.
pub const INT4: Plan = Plan {
    name: "int4",
    qkv: W4A8,
    o: W4A8,
    gate_up: W4A8,
    down: W4A8,
    lm_head: W8A16,
};
/// INT8: every matrix 8-bit with 16-bit activations.
pub const INT8: Plan = Plan {
    name: "int8",
    qkv: W8A16,
    o: W8A16,
    gate_up: W8A16,
    down: W8A16,
    lm_head: W8A16,
};

/// The matrices of one layer in the arena.
#[derive(Debug, Clone, Copy)]
struct LayerMats {
    qkv: PackedRegions,
    o: PackedRegions,
    gate_up: PackedRegions,
    down: PackedRegions,
}

super::layer_linears!(LayerMats: PackedRegions);

/// Quantised weights resident in the arena.
#[derive(Debug)]
pub struct IntStore {
    plan: Plan,
    cache: CacheFile,
    cfg: Config,
    layers: Vec<LayerMats>,
    lm_head: Option<PackedRegions>,
    norms: ResidentNorms,
    embed_row: Region,
    /// Whether [`WeightStore::enable_plan`] asked for the embedding table in the arena.
    resident_embed: bool,
    /// The Q24 embedding table in the arena, when resident.
    embed_table: Option<Region>,
    /// Quantised-activation buffers, one per (columns, format) in use.
    xq: Vec<QuantXRegion>,
    /// gate and up outputs `[2][intermediate]` i32 Q16.
    gate_up_out: Region,
    /// Contexts that may run at once ([`WeightStore::enable_plan`]); each has its own `xq` and
    /// `gate_up_out`, kept here, of which the fields above are the current one's.
    contexts: usize,
    scratch_sets: Vec<(Vec<QuantXRegion>, Region)>,
    /// Whether [`WeightStore::enable_screen`] asked for a screened head.
    screened: bool,
    screen: Option<ScreenedHead>,
}

/// The format of the int stores' head screen ([`crate::num::bound`]): 4-bit, screening their W8A16
/// head (an 8-bit screen would cost as much as the head). It prunes to ~1 % of the rows on the
/// tiny synthetic model (hidden 64) but, at hidden 1024, its certified window (~`sqrt(hidden)`
/// times the typical 4-bit error) covers nearly every row of the synthetic 0.6B; then the
/// screen backs off ([`crate::store::screen::BACKOFF_MAX`]) and the exact head runs, so the screen
/// costs one W4A8 pass per 64 tokens where it cannot help.
pub const SCREEN: Format = W4A8;

/// The widest hidden size the int stores build their 4-bit screen for: its certified window
/// grows with `sqrt(hidden)`, and at hidden 1,024 (Qwen3-0.6B) it covers nearly every row, so
/// that the screen would cost arena memory (99 MB there) and a back-off pass for nothing.
pub const SCREEN_HIDDEN_MAX: usize = 512;

fn file_name(plan: &Plan) -> String {
    format!("qwen_bpf.{}", plan.name)
}

/// The cache's format string: the plan in full, so that a file written under another plan is
/// detected as stale.
fn format_of(plan: &Plan) -> String {
    format!(
        "{}:quantiser=mse-v1:qkv={},o={},gate_up={},down={},lm_head={}",
        plan.name, plan.qkv.name, plan.o.name, plan.gate_up.name, plan.down.name, plan.lm_head.name
    )
}

/// The matrices of the cache, in payload order: (name, rows, cols, format, HF tensors stacked).
fn matrices(cfg: &Config, plan: &Plan) -> Vec<(String, usize, usize, Format, Vec<String>)> {
    let (h, ffn) = (cfg.hidden_size, cfg.intermediate_size);
    let mut v = Vec::new();
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        let t = |n: &str| format!("{p}.{n}.weight");
        v.push((
            format!("{p}.self_attn.qkv"),
            cfg.q_dim() + 2 * cfg.kv_dim(),
            h,
            plan.qkv,
            vec![
                t("self_attn.q_proj"),
                t("self_attn.k_proj"),
                t("self_attn.v_proj"),
            ],
        ));
        v.push((
            format!("{p}.self_attn.o"),
            h,
            cfg.q_dim(),
            plan.o,
            vec![t("self_attn.o_proj")],
        ));
        v.push((
            format!("{p}.mlp.gate_up"),
            2 * ffn,
            h,
            plan.gate_up,
            vec![t("mlp.gate_proj"), t("mlp.up_proj")],
        ));
        v.push((
            format!("{p}.mlp.down"),
            h,
            ffn,
            plan.down,
            vec![t("mlp.down_proj")],
        ));
    }
    let head = if cfg.tie_word_embeddings {
        "model.embed_tokens.weight"
    } else {
        "lm_head.weight"
    };
    v.push((
        "lm_head".into(),
        cfg.vocab_size,
        h,
        plan.lm_head,
        vec![head.into()],
    ));
    v
}

/// Bytes of the packed words and the scales of a `rows` × `cols` matrix in `f`.
fn packed_bytes(f: Format, rows: usize, cols: usize) -> (usize, usize) {
    (
        rows * cols * f.bits as usize / 8,
        rows * (cols / swar::GROUP) * 4,
    )
}

/// Opens the cache of `plan` for `ck` in `cache_dir`, (re)building it when missing or unusable.
fn open_or_convert(
    ck: &Checkpoint,
    cache_dir: &Path,
    plan: &Plan,
    progress: bool,
) -> Result<CacheFile> {
    let path = cache_dir.join(file_name(plan));
    let identity = ck.identity();
    let format = format_of(plan);
    cache::open_or_build(
        &path,
        &format,
        &identity,
        &ck.config,
        &format!("quantising weights to {}", plan.name),
        || quantise(ck, &path, plan, &format, &identity, progress),
    )
}

/// Quantises `ck` per `plan` and writes the cache file at `path`.
fn quantise(
    ck: &Checkpoint,
    path: &Path,
    plan: &Plan,
    format: &str,
    identity: &str,
    progress: bool,
) -> Result<()> {
    let cfg = &ck.config;
    let mut entries = Vec::new();
    let mut off = 0usize;
    let mut push = |name: String, q: u32, len: usize| {
        entries.push(Entry {
            name,
            q,
            offset: off,
            len,
        });
        off += len;
    };
    for (name, shape) in tensor_specs(cfg) {
        if shape.len() == 1 {
            push(name, Q_NORM, shape[0] * 4);
        } else if name == "model.embed_tokens.weight" {
            push(name, Q_W, shape[0] * shape[1] * 4);
        }
    }
    let mats = matrices(cfg, plan);
    for (name, rows, cols, f, _) in &mats {
        let (w, s) = packed_bytes(*f, *rows, *cols);
        push(format!("{name}.words"), f.bits, w);
        push(format!("{name}.scales"), f.bits, s);
    }
    let total = cfg.num_parameters() as u64;
    let bar = progress.then(|| crate::progress_bar(total, plan.name));
    cache::write(path, format, identity, cfg, entries, |sink| {
        let mut buf = Vec::new();
        for (name, shape) in tensor_specs(cfg) {
            if shape.len() == 1 || name == "model.embed_tokens.weight" {
                let q = if shape.len() == 1 { Q_NORM } else { Q_W };
                let vals = ck.tensor_f32(&name)?;
                buf.clear();
                for (i, &v) in vals.iter().enumerate() {
                    buf.extend_from_slice(
                        &fixed::to_fixed(v, q, if q == Q_W { "Q24" } else { "Q20" }, &name, i)?
                            .to_le_bytes(),
                    );
                }
                sink(&buf)?;
            }
        }
        for (_, rows, cols, f, sources) in &mats {
            let mut w = Vec::with_capacity(rows * cols);
            for s in sources {
                ck.read_rows_f32(s, 0, usize::MAX, &mut w)?;
            }
            let (words, scales) = if *f == W4A8 {
                let m = swar::quantize_int4(&w, *rows, *cols)?;
                (m.words, m.scales)
            } else {
                let m = swar::quantize_int8(&w, *rows, *cols)?;
                (m.words, m.scales)
            };
            sink(bytemuck::cast_slice(&words))?;
            sink(bytemuck::cast_slice(&scales))?;
            if let Some(b) = &bar {
                b.inc((rows * cols) as u64);
            }
        }
        Ok(())
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(())
}

impl IntStore {
    /// Opens (quantising if needed) the `plan` cache of `ck` in `cache_dir`.
    pub fn open(ck: &Checkpoint, cache_dir: &Path, plan: Plan, progress: bool) -> Result<IntStore> {
        let cache = open_or_convert(ck, cache_dir, &plan, progress)?;
        Ok(IntStore {
            plan,
            cache,
            cfg: ck.config.clone(),
            layers: Vec::new(),
            lm_head: None,
            norms: ResidentNorms::default(),
            embed_row: Region::default(),
            resident_embed: false,
            embed_table: None,
            xq: Vec::new(),
            gate_up_out: Region::default(),
            contexts: 1,
            scratch_sets: Vec::new(),
            screened: false,
            screen: None,
        })
    }

    fn upload_matrix(
        &self,
        ops: &mut Ops,
        name: &str,
        rows: usize,
        cols: usize,
        f: Format,
    ) -> Result<PackedRegions> {
        let (wb, sb) = (
            self.cache.bytes(&format!("{name}.words"))?,
            self.cache.bytes(&format!("{name}.scales"))?,
        );
        let words = ops.arena.alloc(wb.len(), "packed weights")?;
        ops.arena.slice_mut::<u8>(words)?.copy_from_slice(wb);
        let scales = ops.arena.alloc(sb.len(), "weight scales")?;
        ops.arena.slice_mut::<u8>(scales)?.copy_from_slice(sb);
        Ok(PackedRegions {
            format: f,
            words,
            scales,
            rows,
            cols,
        })
    }

    /// The most columns of any matrix.
    fn k_max(&self) -> usize {
        let c = &self.cfg;
        c.hidden_size.max(c.intermediate_size).max(c.q_dim())
    }

    /// The quantised-activation buffer for the columns and format of `m`, after quantising the
    /// `n` vectors of `x` into it.
    fn quantize(
        &self,
        ops: &mut Ops,
        x: Region,
        m: &PackedRegions,
        n: usize,
    ) -> Result<QuantXRegion> {
        let xq = *self
            .xq
            .iter()
            .find(|q| q.k == m.cols && q.format == m.format)
            .expect("a buffer for every (k, format) in the plan");
        ops.quantize_x_batch(x, &xq, n)?;
        Ok(xq)
    }
}

impl WeightStore for IntStore {
    fn name(&self) -> &'static str {
        self.plan.name
    }

    fn arena_bytes(&self) -> usize {
        // everything but the embedding table, which stays in the file unless a plan needs it in
        // the arena; plus staging and scratch
        let embed = match self.resident_embed {
            true => 0,
            false => self
                .cache
                .entry("model.embed_tokens.weight")
                .map(|e| e.len)
                .unwrap_or(0),
        };
        let c = &self.cfg;
        // every context's buffers hold one vector, the first context's a prefill block
        let vectors = self.contexts - 1 + super::PREFILL_BLOCK;
        let unpack = match super::PREFILL_BLOCK > 1 {
            true => unpack_scratch_bytes(self.k_max()) + 4096,
            false => 0,
        };
        let scratch = vectors
            * (5 * swar::QuantX::bytes(self.k_max()) + 2 * c.intermediate_size * 4)
            + self.contexts * 5 * 4096
            + c.hidden_size * 4
            + unpack;
        self.cache.header.payload_bytes - embed
            + scratch
            + 4096 * (self.cache.header.tensors.len() + 16)
            + self.screen_bytes()
    }

    fn enable_plan(&mut self, contexts: usize) -> bool {
        self.resident_embed = true;
        self.contexts = contexts.max(1);
        true
    }

    fn set_context(&mut self, i: usize) {
        if let Some((xq, out)) = self.scratch_sets.get(i) {
            self.xq = xq.clone();
            self.gate_up_out = *out;
        }
    }

    fn enable_screen(&mut self) -> bool {
        self.screened = self.plan.lm_head == W8A16
            && self.cfg.hidden_size <= SCREEN_HIDDEN_MAX
            && crate::num::bound::fits(SCREEN, self.cfg.vocab_size, self.cfg.hidden_size);
        self.screened
    }

    fn screen_bytes(&self) -> usize {
        if self.screened {
            ScreenedHead::arena_bytes(SCREEN, self.cfg.vocab_size, self.cfg.hidden_size)
        } else {
            0
        }
    }

    fn screen_result(&self) -> Option<ScreenResult> {
        self.screen.as_ref().and_then(|s| s.last)
    }

    fn lm_head_argmax(&mut self, ops: &mut Ops, x: Region, rows: Rows) -> Result<(usize, i32)> {
        let head = self.lm_head.expect("uploaded");
        if self.screen.is_some() && rows == (0..head.rows) {
            let xq = self.quantize(ops, x, &head, 1)?;
            if let Some(s) = self.screen.as_mut() {
                if let Some(best) = s.argmax(ops, x, &ExactHead::W8 { head, xq })? {
                    return Ok(best);
                }
            }
        }
        self.lm_head(ops, x, None, rows)
    }

    fn upload(&mut self, ops: &mut Ops) -> Result<()> {
        self.norms = ResidentNorms::upload(&self.cache, ops)?;
        let c = self.cfg.clone();
        for (name, rows, cols, f, _) in matrices(&c, &self.plan) {
            let m = self.upload_matrix(ops, &name, rows, cols, f)?;
            if name == "lm_head" {
                self.lm_head = Some(m);
            } else if name.ends_with(".qkv") {
                self.layers.push(LayerMats {
                    qkv: m,
                    o: m,
                    gate_up: m,
                    down: m,
                });
            } else {
                let l = self
                    .layers
                    .last_mut()
                    .expect("qkv comes first in each layer");
                match name.rsplit('.').next() {
                    Some("o") => l.o = m,
                    Some("gate_up") => l.gate_up = m,
                    _ => l.down = m,
                }
            }
        }
        let mut wanted: Vec<(usize, Format)> = vec![
            (c.hidden_size, self.plan.qkv),
            (c.q_dim(), self.plan.o),
            (c.hidden_size, self.plan.gate_up),
            (c.intermediate_size, self.plan.down),
            (c.hidden_size, self.plan.lm_head),
        ];
        wanted.sort_by_key(|(k, f)| (*k, f.name));
        wanted.dedup();
        for i in 0..self.contexts {
            let n = if i == 0 { super::PREFILL_BLOCK } else { 1 };
            let xq = wanted
                .iter()
                .map(|&(k, f)| ops.alloc_quant_x_batch(k, f, n))
                .collect::<Result<Vec<_>>>()?;
            let out = ops
                .arena
                .alloc(n * 2 * c.intermediate_size * 4, "gate/up outputs")?;
            self.scratch_sets.push((xq, out));
        }
        if super::PREFILL_BLOCK > 1 {
            ops.alloc_unpack_scratch(self.k_max())?;
        }
        self.set_context(0);
        self.embed_row = ops.arena.alloc(c.hidden_size * 4, "embedding row")?;
        if self.resident_embed {
            let table = self.cache.bytes("model.embed_tokens.weight")?;
            let r = ops.arena.alloc(table.len(), "embedding table")?;
            ops.arena.slice_mut::<u8>(r)?.copy_from_slice(table);
            self.embed_table = Some(r);
        }
        if self.screened {
            let m = swar::Int8Matrix {
                rows: c.vocab_size,
                cols: c.hidden_size,
                words: self
                    .cache
                    .bytes("lm_head.words")?
                    .chunks_exact(8)
                    .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
                    .collect(),
                scales: self
                    .cache
                    .bytes("lm_head.scales")?
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
                    .collect(),
            };
            let screen = Screen::build(SCREEN, m.rows, m.cols, |r, w| {
                for (j, v) in w.iter_mut().enumerate() {
                    *v = m.code(r, j) as i64 * m.scale(r, j / swar::GROUP) as i64;
                }
            });
            self.screen = Some(ScreenedHead::upload(ops, &screen)?);
        }
        Ok(())
    }

    fn norm(&self, n: Norm) -> Region {
        self.norms.get(n)
    }

    fn embed(&mut self, ops: &mut Ops, token: u32, x: Region) -> Result<()> {
        let h = self.cfg.hidden_size;
        if let Some(table) = self.embed_table {
            return ops.embed(table, token, h, x);
        }
        let table = self.cache.bytes("model.embed_tokens.weight")?;
        let row = &table[token as usize * h * 4..(token as usize + 1) * h * 4];
        ops.arena
            .slice_mut::<u8>(self.embed_row)?
            .copy_from_slice(row);
        ops.embed(self.embed_row, 0, h, x)
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
        let mat = super::linear(&self.layers, m);
        let xq = self.quantize(ops, x, &mat, n)?;
        let batch = super::batch(&self.cfg, m, accumulate, n);
        ops.swar_matvec_batch(&mat, &xq, y, rows, accumulate, batch)
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
        let (ffn, mat) = (self.cfg.intermediate_size, self.layers[layer].gate_up);
        let xq = self.quantize(ops, x, &mat, n)?;
        // gate and up of vector b: out [n][2][intermediate]
        let out = self.gate_up_out;
        let batch = Batch {
            n,
            y_stride: 2 * ffn * 4,
        };
        if rows == (0..ffn) {
            ops.swar_matvec_batch(&mat, &xq, out, 0..2 * ffn, false, batch)?;
        } else {
            ops.swar_matvec_batch(&mat, &xq, out, rows.clone(), false, batch)?;
            let up = ffn + rows.start..ffn + rows.end;
            ops.swar_matvec_batch(&mat, &xq, out, up, false, batch)?;
        }
        for b in 0..n {
            let (o, yb) = (b * 2 * ffn * 4, b * ffn * 4);
            let (g, u) = (
                out.sub(o + rows.start * 4, rows.len() * 4)?,
                out.sub(o + (ffn + rows.start) * 4, rows.len() * 4)?,
            );
            let y = y.sub(yb + rows.start * 4, rows.len() * 4)?;
            ops.swiglu(g, u, y, exp2, rows.len())?;
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
        let head = self.lm_head.expect("uploaded");
        let xq = self.quantize(ops, x, &head, 1)?;
        ops.swar_lm_head_argmax(&head, &xq, logits, rows)
    }
}
