//! The KV cache in the arena: its formats, memory committed only for positions reached, and saved
//! contexts (the cache and position written to a file and read back).
//!
//! Each layer keeps a few arrays indexed by position first (`[max_ctx][...]`), so the bytes of
//! positions `0..n` are a prefix of every array. The int8 format's arrays are split by kv head
//! (`[n_kv][max_ctx][...]`, each head's part page aligned), so that attention, which reads one
//! head over all positions, reads consecutive bytes; each head's part is such a prefix array.
//! The whole cache is reserved for `max_context` when a model opens, but kernel memory is
//! committed (arena pages faulted in from user space) in steps of [`COMMIT_STEP`] positions ahead
//! of use, because a BPF store to an arena page that was never committed is silently dropped.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::kernel::arena::{Arena, Region, PAGE};
use crate::store::cache;
use crate::types::KvFormat;
use crate::{Config, Error, Result};


impl KvFormat {
    /// A layer's arrays, each as (bytes per position of one part, parts): Q16 K, V (`[max_ctx]
    /// [n_kv * hd]` i32, one part); Int8 K codes, K steps, V codes, V steps (`[n_kv][max_ctx][hd]`
    /// i8 and `[n_kv][max_ctx]` u32, one part per kv head).
    fn arrays(self, cfg: &Config) -> Vec<(usize, usize)> {
        let (kvd, n_kv, hd) = (cfg.kv_dim(), cfg.num_key_value_heads, cfg.head_dim());
        match self {
            KvFormat::Q16 => vec![(kvd * 4, 1), (kvd * 4, 1)],
            KvFormat::Int8 => vec![(hd, n_kv), (4, n_kv), (hd, n_kv), (4, n_kv)],
        }
    }

    /// Bytes per position of each part of each of a layer's arrays, in order.
    fn row_bytes(self, cfg: &Config) -> Vec<usize> {
        self.arrays(cfg)
            .iter()
            .flat_map(|&(row, parts)| std::iter::repeat_n(row, parts))
            .collect()
    }

    /// KV-cache bytes per position over all layers.
    pub fn bytes_per_position(self, cfg: &Config) -> usize {
        self.row_bytes(cfg).iter().sum::<usize>() * cfg.num_hidden_layers
    }
}

/// Positions committed at a time, ahead of use.
pub const COMMIT_STEP: usize = 256;

/// One array of a layer: `parts` parts (one per kv head in the int8 format, else one) of
/// `max_ctx` rows of `row` bytes, each page aligned and `stride` bytes after the previous one;
/// `span` covers all of them, as the attention kernels take it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KvArray {
    pub span: Region,
    pub stride: usize,
    row: usize,
    parts: usize,
}

impl KvArray {
    /// Part `j`: positions `0..max_ctx` of one kv head (or of all), a prefix array.
    fn part(&self, j: usize) -> Region {
        Region {
            off: self.span.off + j * self.stride,
            len: self.span.len - (self.parts - 1) * self.stride,
        }
    }
}

/// The KV cache of a model: per layer, the arrays of its format in the arena.
#[derive(Debug)]
pub(crate) struct KvCache {
    pub format: KvFormat,
    /// `layers[l][a]`: array a of layer l.
    layers: Vec<Vec<KvArray>>,
    max_ctx: usize,
    /// Positions whose bytes are committed in every array.
    committed: usize,
}

/// Page-rounded bytes of `n` rows of `row` bytes.
fn pages(n: usize, row: usize) -> usize {
    (n * row).div_ceil(PAGE) * PAGE
}

impl KvCache {
    /// Arena bytes reserved for `max_ctx` positions (page-rounded per array part).
    pub fn reserved_bytes(format: KvFormat, cfg: &Config, max_ctx: usize) -> usize {
        let per_layer: usize = format
            .row_bytes(cfg)
            .iter()
            .map(|&r| pages(max_ctx, r))
            .sum();
        per_layer * cfg.num_hidden_layers
    }

    /// Reserves the arrays in `arena`, committing nothing.
    pub fn reserve(
        arena: &mut Arena,
        format: KvFormat,
        cfg: &Config,
        max_ctx: usize,
    ) -> Result<KvCache> {
        let layers = (0..cfg.num_hidden_layers)
            .map(|_| {
                format
                    .arrays(cfg)
                    .into_iter()
                    .map(|(row, parts)| {
                        // one reservation, its parts page aligned: each is committed and saved
                        // by prefix
                        let stride = pages(max_ctx, row);
                        let whole = arena.reserve(parts * stride, "KV cache")?;
                        Ok(KvArray {
                            span: whole.sub(0, (parts - 1) * stride + max_ctx * row)?,
                            stride,
                            row,
                            parts,
                        })
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(KvCache {
            format,
            layers,
            max_ctx,
            committed: 0,
        })
    }

    /// Every part of every array, with its row bytes, in file order (layer by layer, array by
    /// array, kv head by kv head).
    fn parts(&self) -> impl Iterator<Item = (Region, usize)> + '_ {
        self.layers
            .iter()
            .flatten()
            .flat_map(|a| (0..a.parts).map(move |j| (a.part(j), a.row)))
    }

    /// Commits memory for positions `0..n` (and up to [`COMMIT_STEP`] beyond), if not yet done.
    pub fn ensure(&mut self, arena: &mut Arena, n: usize) {
        if n <= self.committed {
            return;
        }
        let upto = n
            .div_ceil(COMMIT_STEP)
            .saturating_mul(COMMIT_STEP)
            .min(self.max_ctx);
        for (r, row) in self.parts() {
            arena.commit(r, pages(self.committed, row), pages(upto, row));
        }
        self.committed = upto;
    }

    /// Array `a` of layer `l` (in the order of [`KvFormat`]'s arrays).
    pub fn array(&self, l: usize, a: usize) -> KvArray {
        self.layers[l][a]
    }

    /// Kernel memory committed so far.
    pub fn committed_bytes(&self) -> usize {
        self.parts()
            .map(|(_, row)| pages(self.committed, row))
            .sum()
    }

    /// Fills positions `have..to` of every array with copies of positions `0..have` (committed).
    pub fn repeat_rows(&self, arena: &mut Arena, have: usize, to: usize) -> Result<()> {
        for (r, row) in self.parts() {
            let bytes = arena.slice_mut::<u8>(r.sub(0, to * row)?)?;
            for p in have..to {
                bytes.copy_within((p % have) * row..(p % have + 1) * row, p * row);
            }
        }
        Ok(())
    }

    /// The byte prefixes holding positions `0..n`, in file order.
    fn prefixes(&self, n: usize) -> impl Iterator<Item = Result<Region>> + '_ {
        self.parts().map(move |(r, row)| r.sub(0, n * row))
    }
}

const MAGIC: &[u8; 8] = b"QBPFCTX\0";
/// Saved-context file format version (2: the int8 arrays split by kv head).
pub const CONTEXT_VERSION: u32 = 2;

/// What a saved context was made with: it loads only into a model that matches every field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ContextHeader {
    pub identity: String,
    pub config: Config,
    pub store: String,
    pub kv: String,
    pub position: usize,
    pub payload_bytes: usize,
    pub checksum: String,
}

/// Checks the fixed 16-byte preamble `head` (magic, version) and returns the header's length.
fn preamble(path: &Path, head: &[u8]) -> Result<usize> {
    if head.len() < 16 || &head[..8] != MAGIC {
        return Err(context_error(
            path,
            "not a qwen_bpf saved context (bad magic)",
        ));
    }
    let version = u32::from_le_bytes(head[8..12].try_into().unwrap());
    if version != CONTEXT_VERSION {
        return Err(context_error(
            path,
            format!("format version {version}, this build reads {CONTEXT_VERSION}"),
        ));
    }
    Ok(u32::from_le_bytes(head[12..16].try_into().unwrap()) as usize)
}

/// The header JSON.
fn parse_header(path: &Path, json: &[u8]) -> Result<ContextHeader> {
    serde_json::from_slice(json).map_err(|e| context_error(path, format!("unreadable header: {e}")))
}

/// The position (tokens) a saved context holds, read from its header alone: enough to size a
/// model's `max_context` before [`crate::Model::load_context`] verifies the whole file.
pub fn saved_position(path: &Path) -> Result<usize> {
    let mut f = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut head = [0u8; 16];
    f.read_exact(&mut head)
        .map_err(|_| context_error(path, "truncated: no header"))?;
    let hlen = preamble(path, &head)?;
    if hlen > 1 << 24 {
        return Err(context_error(
            path,
            format!("header of {hlen} bytes is implausible"),
        ));
    }
    let mut h = vec![0u8; hlen];
    f.read_exact(&mut h)
        .map_err(|_| context_error(path, "truncated header"))?;
    Ok(parse_header(path, &h)?.position)
}

fn context_error(path: &Path, msg: impl Into<String>) -> Error {
    Error::Context {
        path: path.into(),
        msg: msg.into(),
    }
}

fn header_checksum(h: &ContextHeader, payload: &[&[u8]]) -> Result<String> {
    let mut zeroed = h.clone();
    zeroed.checksum = format!("{:016x}", 0u64);
    let hbytes = serde_json::to_vec(&zeroed).map_err(|e| Error::Invalid(e.to_string()))?;
    let total = hbytes.len() + payload.iter().map(|p| p.len()).sum::<usize>();
    let mut sum = cache::Checksum::new(total);
    sum.update(&hbytes);
    for p in payload {
        sum.update(p);
    }
    Ok(format!("{:016x}", sum.finish()))
}

/// Writes positions `0..header.position` of `kv` to `path` (a temporary file renamed into place).
pub(crate) fn save(
    path: &Path,
    arena: &Arena,
    kv: &KvCache,
    mut header: ContextHeader,
) -> Result<()> {
    let parts: Vec<&[u8]> = kv
        .prefixes(header.position)
        .map(|r| arena.slice::<u8>(r?))
        .collect::<Result<_>>()?;
    header.payload_bytes = parts.iter().map(|p| p.len()).sum();
    header.checksum = header_checksum(&header, &parts)?;
    let hbytes = serde_json::to_vec(&header).map_err(|e| Error::Invalid(e.to_string()))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| Error::io(dir, e))?;
    let w = tmp.as_file_mut();
    let write = |w: &mut File, b: &[u8]| w.write_all(b).map_err(|e| Error::io(path, e));
    write(w, MAGIC)?;
    write(w, &CONTEXT_VERSION.to_le_bytes())?;
    write(w, &(hbytes.len() as u32).to_le_bytes())?;
    write(w, &hbytes)?;
    for p in &parts {
        write(w, p)?;
    }
    tmp.persist(path).map_err(|e| Error::io(path, e.error))?;
    Ok(())
}

/// Reads a saved context's header and payload, checking the magic, version, length and checksum,
/// and that it was made with `want`'s identity, config, store and KV format. Returns the header
/// and the payload, ready to copy with [`load_into`].
pub(crate) fn read(path: &Path, want: &ContextHeader) -> Result<(ContextHeader, Vec<u8>)> {
    let mut f = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut data = Vec::new();
    f.read_to_end(&mut data).map_err(|e| Error::io(path, e))?;
    let hlen = preamble(path, &data)?;
    if 16 + hlen > data.len() {
        return Err(context_error(path, "truncated header"));
    }
    let header = parse_header(path, &data[16..16 + hlen])?;
    let payload = data.split_off(16 + hlen);
    if payload.len() != header.payload_bytes {
        return Err(context_error(
            path,
            format!(
                "truncated or padded: payload of {} bytes, header says {}",
                payload.len(),
                header.payload_bytes
            ),
        ));
    }
    if header_checksum(&header, &[&payload])? != header.checksum {
        return Err(context_error(
            path,
            "checksum mismatch: the file is damaged",
        ));
    }
    let mismatch = |what: &str, got: &str, wanted: &str| {
        Err(context_error(
            path,
            format!("saved with {what} {got}, this model has {wanted}"),
        ))
    };
    if header.config != want.config || header.identity != want.identity {
        return mismatch("another checkpoint:", &header.identity, &want.identity);
    }
    if header.store != want.store {
        return mismatch("weight store", &header.store, &want.store);
    }
    if header.kv != want.kv {
        return mismatch("KV format", &header.kv, &want.kv);
    }
    Ok((header, payload))
}

/// Copies a verified payload of `position` positions into `kv`, committing their memory first.
/// The caller has checked that `position` fits the cache.
pub(crate) fn load_into(
    path: &Path,
    arena: &mut Arena,
    kv: &mut KvCache,
    position: usize,
    payload: &[u8],
) -> Result<()> {
    let regions: Vec<Region> = kv.prefixes(position).collect::<Result<_>>()?;
    if regions.iter().map(|r| r.len).sum::<usize>() != payload.len() {
        return Err(context_error(
            path,
            "payload size does not match this model's KV layout",
        ));
    }
    kv.ensure(arena, position);
    let mut at = 0;
    for r in regions {
        arena
            .slice_mut::<u8>(r)?
            .copy_from_slice(&payload[at..at + r.len]);
        at += r.len;
    }
    Ok(())
}
