//! A Hugging Face checkpoint directory: `config.json` plus `model.safetensors` or a sharded
//! `model.safetensors.index.json`. Files are memory-mapped; every tensor the config implies is
//! checked for presence, dtype and shape at open, and for finite values when it is read.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::{Config, Error, Result};

pub use super::config::tensor_specs;

/// Where one tensor's bytes are.
#[derive(Debug, Clone)]
struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

/// An opened, validated checkpoint. Tensor data stays in the memory-mapped files until read.
pub struct Checkpoint {
    dir: PathBuf,
    /// The validated config.
    pub config: Config,
    files: Vec<(PathBuf, Mmap)>,
    entries: HashMap<String, Entry>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("dir", &self.dir)
            .field("tensors", &self.entries.len())
            .finish()
    }
}

impl Checkpoint {
    /// Opens `dir`, parses every safetensors header and checks each required tensor's dtype and shape.
    pub fn open(dir: impl AsRef<Path>) -> Result<Checkpoint> {
        let dir = dir.as_ref().to_path_buf();
        let config = Config::from_file(&dir.join("config.json"))?;
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let shard_names: Vec<String> = if single.exists() {
            vec!["model.safetensors".into()]
        } else if index.exists() {
            shards_from_index(&index)?
        } else {
            return Err(Error::io(
                &single,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "neither model.safetensors nor model.safetensors.index.json",
                ),
            ));
        };
        let mut files = Vec::new();
        let mut entries = HashMap::new();
        for (fi, name) in shard_names.iter().enumerate() {
            let path = dir.join(name);
            let f = File::open(&path).map_err(|e| Error::io(&path, e))?;
            // SAFETY: the map is read-only; a checkpoint modified while open is outside our contract.
            let map = unsafe { Mmap::map(&f) }.map_err(|e| Error::io(&path, e))?;
            let st = SafeTensors::deserialize(&map).map_err(|e| Error::Safetensors {
                path: path.clone(),
                msg: e.to_string(),
            })?;
            let base = map.as_ptr() as usize;
            for (tname, view) in st.tensors() {
                let start = view.data().as_ptr() as usize - base;
                let e = Entry {
                    file: fi,
                    dtype: view.dtype(),
                    shape: view.shape().to_vec(),
                    start,
                    end: start + view.data().len(),
                };
                entries.insert(tname, e);
            }
            files.push((path, map));
        }
        let ck = Checkpoint {
            dir,
            config,
            files,
            entries,
        };
        for (name, shape) in tensor_specs(&ck.config) {
            let e = ck.entries.get(&name).ok_or_else(|| Error::MissingTensor {
                dir: ck.dir.clone(),
                name: name.clone(),
            })?;
            let path = ck.files[e.file].0.clone();
            if !matches!(e.dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32) {
                return Err(Error::Dtype {
                    path,
                    name,
                    dtype: format!("{:?}", e.dtype),
                });
            }
            if e.shape != shape {
                return Err(Error::Shape {
                    path,
                    name,
                    found: e.shape.clone(),
                    expected: shape,
                });
            }
        }
        Ok(ck)
    }

    /// The model directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the checkpoint holds a tensor called `name`.
    pub fn has(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// The shape of tensor `name`.
    pub fn shape(&self, name: &str) -> Result<&[usize]> {
        Ok(&self.entry(name)?.shape)
    }

    fn entry(&self, name: &str) -> Result<&Entry> {
        self.entries.get(name).ok_or_else(|| Error::MissingTensor {
            dir: self.dir.clone(),
            name: name.into(),
        })
    }

    /// Reads tensor `name` as f32 (row-major), failing on the first NaN or infinity.
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        self.read_rows_f32(name, 0, usize::MAX, &mut out)?;
        Ok(out)
    }

    /// Appends rows `[row0, row0 + nrows)` (clamped to the tensor) of 2-D or 1-D tensor `name`
    /// to `out` as f32, failing on the first non-finite value. Lets converters stream large tensors.
    pub fn read_rows_f32(
        &self,
        name: &str,
        row0: usize,
        nrows: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let e = self.entry(name)?;
        let cols = if e.shape.len() >= 2 {
            e.shape[1..].iter().product()
        } else {
            e.shape.iter().product::<usize>()
        };
        let rows = if e.shape.len() >= 2 { e.shape[0] } else { 1 };
        // Clamp the start too: rows past the end read as nothing rather than slicing out of bounds.
        let row0 = row0.min(rows);
        let r1 = row0.saturating_add(nrows).min(rows);
        let bytes = &self.files[e.file].1[e.start..e.end];
        let first = row0 * cols;
        let n = r1.saturating_sub(row0) * cols;
        let base = out.len();
        out.reserve(n);
        match e.dtype {
            Dtype::BF16 => out.extend(
                bytes[first * 2..(first + n) * 2]
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()),
            ),
            Dtype::F16 => out.extend(
                bytes[first * 2..(first + n) * 2]
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
            ),
            Dtype::F32 => out.extend(
                bytes[first * 4..(first + n) * 4]
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            ),
            other => {
                return Err(Error::Dtype {
                    path: self.files[e.file].0.clone(),
                    name: name.into(),
                    dtype: format!("{other:?}"),
                })
            }
        }
        if let Some(k) = out[base..].iter().position(|v| !v.is_finite()) {
            return Err(Error::NonFinite {
                name: name.into(),
                index: first + k,
                value: out[base + k],
            });
        }
        Ok(())
    }

    /// A cheap identity of the weights: names, sizes and modification times of the files.
    /// Cache files store it so that a changed checkpoint is detected.
    pub fn identity(&self) -> String {
        let mut s = String::new();
        for (p, m) in &self.files {
            let mtime = std::fs::metadata(p)
                .and_then(|md| md.modified())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            s.push_str(&format!("{name}:{}:{mtime};", m.len()));
        }
        s
    }
}

/// The distinct shard files named by an index's `weight_map`, in first-seen order.
fn shards_from_index(index: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(index).map_err(|e| Error::io(index, e))?;
    let bad = |msg: String| Error::Safetensors {
        path: index.into(),
        msg,
    };
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("no `weight_map` object".into()))?;
    let mut shards: Vec<String> = Vec::new();
    for (tensor, file) in map {
        let f = file
            .as_str()
            .ok_or_else(|| bad(format!("weight_map[{tensor}] is not a file name")))?;
        if f.contains('/') || f.contains("..") {
            return Err(bad(format!(
                "weight_map[{tensor}] = {f:?} leaves the model directory"
            )));
        }
        if !shards.iter().any(|s| s == f) {
            shards.push(f.to_string());
        }
    }
    Ok(shards)
}
