//! Tokenizing inside the kernel with a model's arena: [`Model::load_tokenizer`] puts a
//! tokenizer's tables into the arena space the model reserved for them, and
//! [`Model::tokenize_in_kernel`] runs the same BPF program as [`crate::KernelTokenizer`] on them,
//! so that the serving path of the same object can tokenize a request's text.

use crate::kernel::tokenize::TokRegions;
use crate::num::tok_tables::TokTables;
use crate::{Error, Model, Result, Tokenizer};

impl Model {
    /// Builds `tok`'s tables (refusing with [`Error::Tokenizer`] a tokenizer of another kind than
    /// Qwen's byte-level BPE) and puts them, with the kernel tokenizer's work area and buffers,
    /// into the arena space reserved at open ([`crate::KernelMemory::tokenizer`]). Tables larger
    /// than that space are refused with [`Error::Resources`]. Loading twice is refused.
    pub fn load_tokenizer(&mut self, tok: &Tokenizer) -> Result<()> {
        if self.tok.is_some() {
            return Err(Error::Invalid(
                "a tokenizer is already in this model's arena".into(),
            ));
        }
        let tables = TokTables::build(tok)?;
        self.tok = Some(TokRegions::place(
            &mut self.ops.arena,
            self.tok_space,
            &tables,
        )?);
        Ok(())
    }

    /// The ids of `text`, computed in the kernel from the tables [`Model::load_tokenizer`] put in
    /// the arena: those [`Tokenizer::encode`] gives. A text past a kernel limit is refused with
    /// [`Error::Limit`]; without a loaded tokenizer, [`Error::Invalid`].
    pub fn tokenize_in_kernel(&mut self, text: &str) -> Result<Vec<u32>> {
        let Some(r) = self.tok else {
            return Err(Error::Invalid(
                "in-kernel tokenizing needs the tables in the arena: call Model::load_tokenizer first"
                    .into(),
            ));
        };
        self.ops.tokenize(&r, text)
    }
}
