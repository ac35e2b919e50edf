//! The context a model has fed: saved to a file and loaded back, reset and rewound.

use std::path::Path;

use super::kv::{self, ContextHeader};
use super::Model;
use crate::types::check_rewind;
use crate::{Error, Result};

impl Model {
    /// What a saved context of this model must match.
    fn context_header(&self) -> ContextHeader {
        ContextHeader {
            identity: self.identity.clone(),
            config: self.cfg.clone(),
            store: self.store.name().into(),
            kv: self.b.kv.format.name().into(),
            position: self.pos,
            payload_bytes: 0,
            checksum: String::new(),
        }
    }

    /// Writes the context (the KV cache of every position fed so far, and the position) to
    /// `path`, checksummed, through a temporary file renamed into place. [`Model::load_context`]
    /// in any process restores it into a model of the same checkpoint, weight store and KV
    /// format, which then continues exactly as this one would.
    pub fn save_context(&self, path: impl AsRef<Path>) -> Result<()> {
        kv::save(
            path.as_ref(),
            &self.ops.arena,
            &self.b.kv,
            self.context_header(),
        )
    }

    /// Replaces the context with the one saved at `path`. A file that is damaged, truncated, or
    /// was saved by a model of another checkpoint, weight store or KV format is refused with
    /// [`Error::Context`]; one longer than this model's `max_context` with
    /// [`Error::ContextOverflow`]. The model is unchanged on error.
    pub fn load_context(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let (header, payload) = kv::read(path, &self.context_header())?;
        if header.position > self.max_context {
            return Err(Error::ContextOverflow {
                pos: header.position,
                max_context: self.max_context,
                tokens: header.position,
            });
        }
        kv::load_into(
            path,
            &mut self.ops.arena,
            &mut self.b.kv,
            header.position,
            &payload,
        )?;
        self.pos = header.position;
        Ok(())
    }

    /// Forgets the context (the KV cache is overwritten as positions are reused).
    pub fn reset(&mut self) {
        self.pos = 0;
    }

    /// Keeps only the first `position` tokens of the context, so that generation can continue
    /// from there (e.g. after a shared prompt). A position beyond the current one is
    /// [`Error::InvalidParameter`] and changes nothing.
    pub fn rewind(&mut self, position: usize) -> Result<()> {
        check_rewind(position, self.pos)?;
        self.pos = position;
        Ok(())
    }

    /// For benchmarks at depth: extends the context to `position` tokens by repeating the KV
    /// rows of the positions fed so far (at least one), as if that many tokens had been fed.
    /// Attention then costs what it costs at that depth; the logits mean nothing.
    #[cfg(feature = "internals")]
    pub fn bench_fill_context(&mut self, position: usize) -> Result<()> {
        if self.pos == 0 || position > self.max_context {
            return Err(Error::Invalid(format!(
                "bench_fill_context({position}) needs a fed token and position <= max_context {}",
                self.max_context
            )));
        }
        self.b.kv.ensure(&mut self.ops.arena, position);
        self.b
            .kv
            .repeat_rows(&mut self.ops.arena, self.pos, position)?;
        self.pos = position;
        Ok(())
    }
}
