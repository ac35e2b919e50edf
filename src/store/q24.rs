//! The Q24 full-file store: every matrix converted once to Q24 (RMSNorm weights to Q20) in a
//! cache file, memory-mapped, and copied into a resident arena region at load, so that no weight
//! is copied per token and each operator is one BPF run over a whole matrix.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::cache::{self, CacheFile, Entry};
use super::{Linear, Norm, WeightStore};
use crate::hf::checkpoint::tensor_specs;
use crate::num::fixed::{self, Q_NORM, Q_W};
use crate::kernel::arena::{Region, PAGE};
use crate::kernel::ops::{Ops, Rows};
use crate::kernel::swar_ops::{ExactHead, ScreenResult};
use crate::num::bound::Screen;
use crate::store::screen::ScreenedHead;
use crate::num::swar::{Format, W8A16};
use crate::{Checkpoint, Config, Error, Result};

/// Cache file name inside the cache directory.
pub const FILE_NAME: &str = "qwen_bpf.q24";

/// Fixed-point fraction bits a tensor is stored with: Q20 for RMSNorm vectors, Q24 otherwise.
pub fn q_of(shape: &[usize]) -> u32 {
    if shape.len() == 1 {
        Q_NORM
    } else {
        Q_W
    }
}

/// Opens the Q24 cache for `ck` in `cache_dir`, (re)building it when it is missing, truncated,
/// corrupt or stale. Returns the verified file.
pub fn open_or_convert(ck: &Checkpoint, cache_dir: &Path, progress: bool) -> Result<CacheFile> {
    let path = cache_dir.join(FILE_NAME);
    cache::open_or_build(
        &path,
        "q24",
        &ck.identity(),
        &ck.config,
        "converting weights to Q24",
        || convert(ck, &path, progress),
    )
}

/// Converts every tensor of `ck` to fixed point and writes the cache file at `path`.
pub fn convert(ck: &Checkpoint, path: &Path, progress: bool) -> Result<()> {
    let specs = tensor_specs(&ck.config);
    let mut entries = Vec::with_capacity(specs.len());
    let mut off = 0usize;
    for (name, shape) in &specs {
        let len = shape.iter().product::<usize>() * 4;
        entries.push(Entry {
            name: name.clone(),
            q: q_of(shape),
            offset: off,
            len,
        });
        off += len;
    }
    let total: u64 = specs
        .iter()
        .map(|(_, s)| s.iter().product::<usize>() as u64)
        .sum();
    let bar = progress.then(|| crate::progress_bar(total, "Q24"));
    cache::write(path, "q24", &ck.identity(), &ck.config, entries, |sink| {
        let mut f32s = Vec::new();
        let mut out: Vec<u8> = Vec::new();
        for (name, shape) in &specs {
            let q = q_of(shape);
            let (rows, cols) = if shape.len() == 2 {
                (shape[0], shape[1])
            } else {
                (1, shape[0])
            };
            let chunk = (1 << 20) / cols.max(1) + 1;
            let mut r = 0;
            while r < rows {
                f32s.clear();
                ck.read_rows_f32(name, r, chunk, &mut f32s)?;
                out.clear();
                for (i, &v) in f32s.iter().enumerate() {
                    let format = if q == Q_W { "Q24" } else { "Q20" };
                    let x = fixed::to_fixed(v, q, format, name, r * cols + i)?;
                    out.extend_from_slice(&x.to_le_bytes());
                }
                sink(&out)?;
                if let Some(b) = &bar {
                    b.inc(f32s.len() as u64);
                }
                r += chunk;
            }
        }
        Ok(())
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(())
}

/// The arena regions of one decoder layer.
#[derive(Debug, Clone, Copy, Default)]
struct LayerRegions {
    input_norm: Region,
    qkv: Region,
    o: Region,
    q_norm: Region,
    k_norm: Region,
    post_norm: Region,
    gate: Region,
    up: Region,
    down: Region,
}

super::layer_linears!(LayerRegions: Region);

/// Q24 weights resident in the arena.
#[derive(Debug)]
pub struct Q24Store {
    cache: CacheFile,
    cfg: Config,
    layers: Vec<LayerRegions>,
    embed: Region,
    lm_head: Region,
    final_norm: Region,
    /// The screen's format once [`WeightStore::enable_screen`] asked for one.
    screen_format: Option<Format>,
    screen: Option<ScreenedHead>,
}

/// The format of the Q24 head's screen ([`crate::num::bound`]): 8-bit. The certified window is a
/// worst case over all activations of the token's norms, about `sqrt(hidden)` times the typical
/// screening error: at the Qwen3-0.6B shape a 4-bit screen's window (several logits) spans the
/// whole logit range of the synthetic model and prunes nothing, while the 8-bit screen leaves
/// 1–16 of 151,936 rows to rescore. Its W8A16 pass costs about 0.3 of the Q24 head's.
pub const SCREEN: Format = W8A16;

impl Q24Store {
    /// Opens (converting if needed) the Q24 cache of `ck` in `cache_dir`.
    pub fn open(ck: &Checkpoint, cache_dir: &Path, progress: bool) -> Result<Q24Store> {
        let cache = open_or_convert(ck, cache_dir, progress)?;
        Ok(Q24Store {
            cache,
            cfg: ck.config.clone(),
            layers: Vec::new(),
            embed: Region::default(),
            lm_head: Region::default(),
            final_norm: Region::default(),
            screen_format: None,
            screen: None,
        })
    }

    /// The cache file backing this store.
    pub fn cache_path(&self) -> &PathBuf {
        &self.cache.path
    }
}

impl WeightStore for Q24Store {
    fn name(&self) -> &'static str {
        "q24"
    }

    fn arena_bytes(&self) -> usize {
        let pages = |n: usize| n.div_ceil(PAGE) * PAGE;
        let weights: usize = upload_groups(&self.cache.header.tensors)
            .map(|g| pages(g.iter().map(|e| e.len).sum()))
            .sum();
        weights + self.screen_bytes()
    }

    fn enable_screen(&mut self) -> bool {
        let fits = crate::num::bound::fits(SCREEN, self.cfg.vocab_size, self.cfg.hidden_size);
        self.screen_format = fits.then_some(SCREEN);
        fits
    }

    fn screen_bytes(&self) -> usize {
        self.screen_format.map_or(0, |f| {
            ScreenedHead::arena_bytes(f, self.cfg.vocab_size, self.cfg.hidden_size)
        })
    }

    fn screen_result(&self) -> Option<ScreenResult> {
        self.screen.as_ref().and_then(|s| s.last)
    }

    fn lm_head_argmax(&mut self, ops: &mut Ops, x: Region, rows: Rows) -> Result<(usize, i32)> {
        let w = self.lm_head;
        if let (Some(s), true) = (self.screen.as_mut(), rows == (0..self.cfg.vocab_size)) {
            if let Some(best) = s.argmax(ops, x, &ExactHead::Q24 { w, x })? {
                return Ok(best);
            }
        }
        self.lm_head(ops, x, None, rows)
    }

    fn upload(&mut self, ops: &mut Ops) -> Result<()> {
        let payload = self.cache.payload();
        let mut at: HashMap<&str, Region> = HashMap::new();
        for group in upload_groups(&self.cache.header.tensors) {
            let (first, last) = (group[0], group[group.len() - 1]);
            let (start, end) = (first.offset, last.offset.saturating_add(last.len));
            let bytes = payload.get(start..end).ok_or_else(|| Error::Cache {
                path: self.cache.path.clone(),
                msg: format!("tensor `{}` lies outside the payload", group[0].name),
            })?;
            let r = ops.arena.alloc(bytes.len(), "Q24 weights")?;
            ops.arena.slice_mut::<u8>(r)?.copy_from_slice(bytes);
            for e in group {
                at.insert(e.name.as_str(), r.sub(e.offset - start, e.len)?);
            }
        }
        let get = |n: &str| {
            at.get(n).copied().ok_or_else(|| Error::Cache {
                path: self.cache.path.clone(),
                msg: format!("no tensor `{n}`"),
            })
        };
        self.layers = (0..self.cfg.num_hidden_layers)
            .map(|l| {
                let p = format!("model.layers.{l}");
                let (q, k, v) = (
                    get(&format!("{p}.self_attn.q_proj.weight"))?,
                    get(&format!("{p}.self_attn.k_proj.weight"))?,
                    get(&format!("{p}.self_attn.v_proj.weight"))?,
                );
                if k.off != q.off + q.len || v.off != k.off + k.len {
                    return Err(Error::Cache {
                        path: self.cache.path.clone(),
                        msg: format!("layer {l}: q, k, v are not contiguous"),
                    });
                }
                Ok(LayerRegions {
                    input_norm: get(&Norm::Input(l).tensor_name())?,
                    qkv: Region {
                        off: q.off,
                        len: q.len + k.len + v.len,
                    },
                    o: get(&format!("{p}.self_attn.o_proj.weight"))?,
                    q_norm: get(&Norm::Q(l).tensor_name())?,
                    k_norm: get(&Norm::K(l).tensor_name())?,
                    post_norm: get(&Norm::PostAttention(l).tensor_name())?,
                    gate: get(&format!("{p}.mlp.gate_proj.weight"))?,
                    up: get(&format!("{p}.mlp.up_proj.weight"))?,
                    down: get(&format!("{p}.mlp.down_proj.weight"))?,
                })
            })
            .collect::<Result<_>>()?;
        self.embed = get("model.embed_tokens.weight")?;
        self.lm_head = if self.cfg.tie_word_embeddings {
            self.embed
        } else {
            get("lm_head.weight")?
        };
        self.final_norm = get("model.norm.weight")?;
        if let Some(f) = self.screen_format {
            let (rows, k) = (self.cfg.vocab_size, self.cfg.hidden_size);
            let name = match self.cfg.tie_word_embeddings {
                true => "model.embed_tokens.weight",
                false => "lm_head.weight",
            };
            let e = self.cache.entry(name)?;
            let head = payload
                .get(e.offset..)
                .and_then(|h| h.get(..rows * k * 4))
                .ok_or_else(|| Error::Cache {
                    path: self.cache.path.clone(),
                    msg: format!("`{name}` is shorter than {rows} rows of {k}"),
                })?;
            let screen = Screen::build(f, rows, k, |r, w| {
                for (v, b) in w
                    .iter_mut()
                    .zip(head[r * k * 4..(r + 1) * k * 4].chunks_exact(4))
                {
                    *v = i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64;
                }
            });
            self.screen = Some(ScreenedHead::upload(ops, &screen)?);
        }
        Ok(())
    }

    fn norm(&self, n: Norm) -> Region {
        match n {
            Norm::Input(l) => self.layers[l].input_norm,
            Norm::PostAttention(l) => self.layers[l].post_norm,
            Norm::Q(l) => self.layers[l].q_norm,
            Norm::K(l) => self.layers[l].k_norm,
            Norm::Final => self.final_norm,
        }
    }

    fn enable_plan(&mut self, _contexts: usize) -> bool {
        true // no scratch of its own
    }

    fn embed(&mut self, ops: &mut Ops, token: u32, x: Region) -> Result<()> {
        ops.embed(self.embed, token, self.cfg.hidden_size, x)
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
        let w = super::linear(&self.layers, m);
        let k = super::linear_cols(&self.cfg, m);
        let batch = super::batch(&self.cfg, m, accumulate, n);
        ops.matvec_batch(rows_of(w, k, &rows)?, x, y, k, rows, accumulate, batch)
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
        let (l, k) = (self.layers[layer], self.cfg.hidden_size);
        ops.gate_up_swiglu_batch(
            rows_of(l.gate, k, &rows)?,
            rows_of(l.up, k, &rows)?,
            x,
            y,
            exp2,
            k,
            rows,
            super::mlp_batch(&self.cfg, n),
        )
    }

    fn lm_head(
        &mut self,
        ops: &mut Ops,
        x: Region,
        logits: Option<Region>,
        rows: Rows,
    ) -> Result<(usize, i32)> {
        let k = self.cfg.hidden_size;
        ops.lm_head_argmax(rows_of(self.lm_head, k, &rows)?, x, logits, k, rows)
    }
}

/// The bytes of `rows` of a resident i32 matrix with `k` columns.
fn rows_of(w: Region, k: usize, rows: &Rows) -> Result<Region> {
    w.sub(rows.start * k * 4, rows.len() * k * 4)
}

/// The tensors in payload order, in the groups [`Q24Store::upload`] copies to memory one
/// allocation each: a layer's q, k and v projections together (the fused qkv matvec reads them
/// as one matrix), every other tensor alone. On array maps an allocation that fits an element
/// never crosses an element's end, so no row does; one copy of the whole payload would have
/// rows across elements' ends, which the programs refuse.
fn upload_groups(tensors: &[Entry]) -> impl Iterator<Item = Vec<&Entry>> {
    let mut sorted: Vec<&Entry> = tensors.iter().collect();
    sorted.sort_by_key(|e| e.offset);
    let mut groups = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let n = if sorted[i].name.ends_with(".self_attn.q_proj.weight") { 3 } else { 1 };
        let end = (i + n).min(sorted.len());
        groups.push(sorted[i..end].to_vec());
        i = end;
    }
    groups.into_iter()
}
