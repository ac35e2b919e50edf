//! Converted-weight cache files: a header that identifies what the payload was made from, then
//! the payload, written once to a temporary file and renamed into place.
//!
//! ```text
//! [0..8)        magic  b"QWENBPF\0"
//! [8..12)       format version (u32 LE)
//! [12..16)      header length H (u32 LE)
//! [16..16+H)    header JSON: { format, version, identity, config, tensors: [{name, q, offset, len}],
//!               payload_bytes, checksum }
//! [16+H ..)     zero padding
//! [4096*k ..)   payload, starting at the first page boundary after the header
//! ```
//! A file is used only if its magic, version, format, checkpoint identity, config, length and
//! checksum all match, its header is exactly as [`fn@write`] serialises it and its padding is zero.
//! The checksum covers the header (with the checksum field zeroed) and the payload, so a file is
//! accepted only byte for byte as written: anything else (truncated, bit-flipped, stale, another
//! format, an edited tensor table) is reported by [`open`] as a reason, and the caller rebuilds it.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use crate::{Config, Error, Result};

const MAGIC: &[u8; 8] = b"QWENBPF\0";
/// Bump when any payload layout changes. (2: the checksum covers the header too.)
pub const VERSION: u32 = 2;
const MAX_HEADER: usize = 16 << 20;

/// One tensor in a cache payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// The Hugging Face tensor name (or a derived name like `…​.packed`).
    pub name: String,
    /// Fixed-point fraction bits, or the store's own tag.
    pub q: u32,
    /// Byte offset in the payload.
    pub offset: usize,
    /// Byte length.
    pub len: usize,
}

/// What identifies a cache file's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// "q24", "int4", …
    pub format: String,
    /// [`VERSION`].
    pub version: u32,
    /// [`crate::Checkpoint::identity`] of the source.
    pub identity: String,
    /// The source's config.
    pub config: Config,
    /// Payload layout.
    pub tensors: Vec<Entry>,
    /// Payload size in bytes.
    pub payload_bytes: usize,
    /// [`checksum`] of the payload, as hex.
    pub checksum: String,
}

/// An opened, verified cache file: header plus memory-mapped payload.
#[derive(Debug)]
pub struct CacheFile {
    /// The file.
    pub path: PathBuf,
    /// Its header.
    pub header: Header,
    map: Mmap,
    payload_at: usize,
}

impl CacheFile {
    /// The whole payload.
    pub fn payload(&self) -> &[u8] {
        &self.map[self.payload_at..self.payload_at + self.header.payload_bytes]
    }

    /// The entry called `name`.
    pub fn entry(&self, name: &str) -> Result<&Entry> {
        self.header
            .tensors
            .iter()
            .find(|e| e.name == name)
            .ok_or_else(|| Error::Cache {
                path: self.path.clone(),
                msg: format!("no tensor `{name}` in the cache"),
            })
    }

    /// The bytes of entry `name`.
    pub fn bytes(&self, name: &str) -> Result<&[u8]> {
        let e = self.entry(name)?;
        Ok(&self.payload()[e.offset..e.offset + e.len])
    }

    /// Entry `name` as i32 values.
    pub fn i32s(&self, name: &str) -> Result<&[i32]> {
        bytemuck::try_cast_slice(self.bytes(name)?).map_err(|e| Error::Cache {
            path: self.path.clone(),
            msg: format!("`{name}`: {e}"),
        })
    }
}

/// A 64-bit checksum of `data` (multiply-xorshift over 8-byte words): any single flipped bit
/// changes it. Not cryptographic.
pub fn checksum(data: &[u8]) -> u64 {
    let mut h: u64 = 0x9E37_79B9_7F4A_7C15 ^ data.len() as u64;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        h = (h ^ u64::from_le_bytes(w.try_into().unwrap())).wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        h ^= h >> 29;
    }
    for &b in words.remainder() {
        h = (h ^ b as u64).wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    }
    h
}

/// Opens `path` and checks it against `want` (format, identity and config; tensors, payload size
/// and checksum are taken from the file and verified). `Ok(Err(reason))` means "present but
/// unusable: rebuild"; `Err` is reserved for I/O failures other than a missing file.
pub fn open(
    path: &Path,
    format: &str,
    identity: &str,
    config: &Config,
) -> Result<std::result::Result<CacheFile, String>> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Err("no cache file yet".into()))
        }
        Err(e) => return Err(Error::io(path, e)),
    };
    let len = f.metadata().map_err(|e| Error::io(path, e))?.len() as usize;
    let mut head = [0u8; 16];
    if len < 16 || f.read_exact(&mut head).is_err() {
        return Ok(Err(format!("truncated: {len} bytes")));
    }
    if &head[..8] != MAGIC {
        return Ok(Err("not a qwen_bpf cache file (bad magic)".into()));
    }
    let version = u32::from_le_bytes(head[8..12].try_into().unwrap());
    if version != VERSION {
        return Ok(Err(format!(
            "format version {version}, this build writes {VERSION}"
        )));
    }
    let hlen = u32::from_le_bytes(head[12..16].try_into().unwrap()) as usize;
    if hlen > MAX_HEADER || 16 + hlen > len {
        return Ok(Err(format!(
            "header of {hlen} bytes does not fit a {len}-byte file"
        )));
    }
    let mut hbuf = vec![0u8; hlen];
    if f.read_exact(&mut hbuf).is_err() {
        return Ok(Err("truncated header".into()));
    }
    let header: Header = match serde_json::from_slice(&hbuf) {
        Ok(h) => h,
        Err(e) => return Ok(Err(format!("unreadable header: {e}"))),
    };
    if serde_json::to_vec(&header).ok().as_deref() != Some(&hbuf[..]) {
        return Ok(Err("header is not as written (edited or padded)".into()));
    }
    if header.format != format || header.version != VERSION {
        return Ok(Err(format!(
            "holds format {:?} v{}, wanted {format:?} v{VERSION}",
            header.format, header.version
        )));
    }
    if header.identity != identity {
        return Ok(Err("made from another checkpoint (identity differs)".into()));
    }
    if &header.config != config {
        return Ok(Err("made for another config".into()));
    }
    let payload_at = (16 + hlen).div_ceil(4096) * 4096;
    if payload_at.checked_add(header.payload_bytes) != Some(len) {
        return Ok(Err(format!(
            "truncated or padded: {len} bytes, header says {}",
            payload_at + header.payload_bytes
        )));
    }
    if header.tensors.iter().any(|e| {
        e.offset
            .checked_add(e.len)
            .is_none_or(|end| end > header.payload_bytes)
    }) {
        return Ok(Err("a tensor lies outside the payload".into()));
    }
    f.seek(SeekFrom::Start(0)).map_err(|e| Error::io(path, e))?;
    // SAFETY: read-only map; cache files are replaced by rename, never rewritten in place.
    let map = unsafe { Mmap::map(&f) }.map_err(|e| Error::io(path, e))?;
    if map[16 + hlen..payload_at].iter().any(|&b| b != 0) {
        return Ok(Err("non-zero bytes between header and payload".into()));
    }
    let got = format!(
        "{:016x}",
        file_checksum(checksum(&map[payload_at..]), &header)
    );
    if got != header.checksum {
        return Ok(Err(format!(
            "checksum mismatch (file {got}, header {})",
            header.checksum
        )));
    }
    Ok(Ok(CacheFile {
        path: path.into(),
        header,
        map,
        payload_at,
    }))
}

/// Opens the cache at `path` if it is usable; otherwise logs why (prefixed by `doing`), runs
/// `build` to write it, and opens the fresh file, which must then be usable.
pub fn open_or_build(
    path: &Path,
    format: &str,
    identity: &str,
    config: &Config,
    doing: &str,
    build: impl FnOnce() -> Result<()>,
) -> Result<CacheFile> {
    match open(path, format, identity, config)? {
        Ok(c) => return Ok(c),
        Err(reason) => log::info!("{doing} ({}: {reason})", path.display()),
    }
    build()?;
    match open(path, format, identity, config)? {
        Ok(c) => Ok(c),
        Err(reason) => Err(Error::Cache {
            path: path.into(),
            msg: format!("freshly written cache is unusable: {reason}"),
        }),
    }
}

/// Writes a cache file atomically: `fill` streams the payload (whose layout `tensors` describes)
/// into the writer; the header with the checksum goes in front; then the temporary file is
/// renamed over `path`. Concurrent writers each write their own temporary file.
pub fn write(
    path: &Path,
    format: &str,
    identity: &str,
    config: &Config,
    tensors: Vec<Entry>,
    fill: impl FnOnce(&mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()>,
) -> Result<()> {
    let payload_bytes: usize = tensors.iter().map(|e| e.offset + e.len).max().unwrap_or(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    let result = (|| {
        let mut header = Header {
            format: format.into(),
            version: VERSION,
            identity: identity.into(),
            config: config.clone(),
            tensors,
            payload_bytes,
            checksum: format!("{:016x}", 0u64),
        };
        // The header's length must not depend on the checksum: it is fixed-width hex.
        let hlen = serde_json::to_vec(&header)
            .map_err(|e| Error::Invalid(e.to_string()))?
            .len();
        let payload_at = (16 + hlen).div_ceil(4096) * 4096;
        let f = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
        let mut w = std::io::BufWriter::with_capacity(8 << 20, f);
        w.seek(SeekFrom::Start(payload_at as u64))
            .map_err(|e| Error::io(&tmp, e))?;
        let mut written = 0usize;
        let mut hasher = Checksum::new(payload_bytes);
        fill(&mut |bytes: &[u8]| {
            hasher.update(bytes);
            written += bytes.len();
            w.write_all(bytes).map_err(|e| Error::io(&tmp, e))
        })?;
        if written != payload_bytes {
            return Err(Error::Invalid(format!(
                "cache payload: wrote {written} bytes, layout says {payload_bytes}"
            )));
        }
        header.checksum = format!("{:016x}", file_checksum(hasher.finish(), &header));
        let hjson = serde_json::to_vec(&header).map_err(|e| Error::Invalid(e.to_string()))?;
        debug_assert_eq!(hjson.len(), hlen);
        w.seek(SeekFrom::Start(0)).map_err(|e| Error::io(&tmp, e))?;
        w.write_all(MAGIC)
            .and_then(|_| w.write_all(&VERSION.to_le_bytes()))
            .map_err(|e| Error::io(&tmp, e))?;
        w.write_all(&(hjson.len() as u32).to_le_bytes())
            .and_then(|_| w.write_all(&hjson))
            .map_err(|e| Error::io(&tmp, e))?;
        let f = w
            .into_inner()
            .map_err(|e| Error::io(&tmp, e.into_error()))?;
        f.sync_all().map_err(|e| Error::io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The checksum a file stores: [`checksum`] of the payload's checksum and the header serialised
/// with its checksum field zeroed, so that an edited tensor table is caught like a flipped bit.
fn file_checksum(payload_sum: u64, header: &Header) -> u64 {
    let zeroed = Header {
        checksum: format!("{:016x}", 0u64),
        ..header.clone()
    };
    let json = serde_json::to_vec(&zeroed).unwrap_or_default();
    checksum(&[&payload_sum.to_le_bytes()[..], &json].concat())
}

/// Streaming form of [`checksum`] (same result for the same bytes in any chunking).
pub(crate) struct Checksum {
    h: u64,
    pending: Vec<u8>,
}

impl Checksum {
    pub(crate) fn new(total_len: usize) -> Checksum {
        Checksum {
            h: 0x9E37_79B9_7F4A_7C15 ^ total_len as u64,
            pending: Vec::with_capacity(8),
        }
    }
    fn word(&mut self, w: u64) {
        self.h = (self.h ^ w).wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        self.h ^= self.h >> 29;
    }
    pub(crate) fn update(&mut self, mut bytes: &[u8]) {
        while !self.pending.is_empty() && !bytes.is_empty() {
            self.pending.push(bytes[0]);
            bytes = &bytes[1..];
            if self.pending.len() == 8 {
                let w = u64::from_le_bytes(self.pending[..].try_into().unwrap());
                self.pending.clear();
                self.word(w);
            }
        }
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.word(u64::from_le_bytes(w.try_into().unwrap()));
        }
        self.pending.extend_from_slice(words.remainder());
    }
    pub(crate) fn finish(mut self) -> u64 {
        for b in std::mem::take(&mut self.pending) {
            self.h = (self.h ^ b as u64).wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        }
        self.h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_checksum_equals_one_shot_for_any_chunking() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        for chunk in [1, 3, 8, 13, 1000] {
            let mut c = Checksum::new(data.len());
            data.chunks(chunk).for_each(|p| c.update(p));
            assert_eq!(c.finish(), checksum(&data), "chunk size {chunk}");
        }
        let mut flipped = data.clone();
        flipped[500] ^= 4;
        assert_ne!(
            checksum(&flipped),
            checksum(&data),
            "one flipped bit must change the checksum"
        );
    }
}
