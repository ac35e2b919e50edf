//! The Qwen3 tokenizer: a thin wrapper over the `tokenizers` crate, loaded from a model
//! directory's `tokenizer.json`, plus the Qwen3 chat template for one user turn and a streaming
//! decoder that only ever emits whole UTF-8 characters.
//!
//! Qwen3's tokenizer is a byte-level BPE: one character outside ASCII (Chinese, emoji, ...) may be
//! split over several tokens, each carrying a fragment of its UTF-8 encoding. [`TextStream`] holds
//! such fragments back until the character is complete.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// The chat end-of-turn token, Qwen3's EOS for chat generation.
pub const IM_END: &str = "<|im_end|>";
/// The chat start-of-turn token.
pub const IM_START: &str = "<|im_start|>";
/// The end-of-text token (Qwen3's pad/EOS for plain text).
pub const END_OF_TEXT: &str = "<|endoftext|>";

/// A loaded Qwen3 tokenizer. Every error it returns names its `tokenizer.json`.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("path", &self.path)
            .field("vocab_size", &self.vocab_size())
            .finish()
    }
}

impl Tokenizer {
    /// Loads a `tokenizer.json`. A file that cannot be read gives [`Error::Io`]; one that is not a
    /// valid tokenizer gives [`Error::Tokenizer`]; both name `path`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| Error::Tokenizer {
            path: path.to_path_buf(),
            msg: format!("cannot parse: {e}"),
        })?;
        Ok(Tokenizer {
            inner,
            path: path.to_path_buf(),
        })
    }

    /// Loads `dir/tokenizer.json`.
    pub fn from_model_dir(dir: impl AsRef<Path>) -> Result<Tokenizer> {
        Self::from_file(dir.as_ref().join("tokenizer.json"))
    }

    /// The `tokenizers` crate's tokenizer inside (for the in-kernel tokenizer's tables).
    pub(crate) fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The `tokenizer.json` this tokenizer was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, msg: impl std::fmt::Display) -> Error {
        Error::Tokenizer {
            path: self.path.clone(),
            msg: msg.to_string(),
        }
    }

    /// Encodes `text` into token ids. No special tokens are added (Qwen3 adds none), but
    /// special-token text in the input, such as `<|im_start|>`, is recognised as that token.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| self.err(format_args!("cannot encode: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes `ids` into text, special tokens included (`skip_special_tokens = false`).
    /// An id with no token in the vocabulary gives [`Error::TokenOutOfRange`].
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.check_ids(ids)?;
        self.inner
            .decode(ids, false)
            .map_err(|e| self.err(format_args!("cannot decode: {e}")))
    }

    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        // `tokenizers` silently drops unknown ids; refuse them instead.
        let vocab = self.vocab_size();
        match ids
            .iter()
            .position(|&id| self.inner.id_to_token(id).is_none())
        {
            Some(index) => Err(Error::TokenOutOfRange {
                id: ids[index],
                index,
                vocab,
            }),
            None => Ok(()),
        }
    }

    /// The Qwen3 chat template for one user turn followed by the generation prompt:
    /// `"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"`.
    pub fn chat_prompt(user: &str) -> String {
        format!("{IM_START}user\n{user}{IM_END}\n{IM_START}assistant\n")
    }

    /// Encodes [`Tokenizer::chat_prompt`]`(user)`.
    pub fn encode_chat(&self, user: &str) -> Result<Vec<u32>> {
        self.encode(&Self::chat_prompt(user))
    }

    /// The id of one token given by its vocabulary string (e.g. `"<|im_end|>"`), if it exists.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The ids that end generation: `<|im_end|>` (151645) and `<|endoftext|>` (151643), those
    /// present in this vocabulary, in that order.
    pub fn eos_ids(&self) -> Vec<u32> {
        [IM_END, END_OF_TEXT]
            .iter()
            .filter_map(|t| self.token_id(t))
            .collect()
    }

    /// The bytes token `id` stands for: an added (special) token's text, or a byte-level BPE
    /// token's characters mapped back to the bytes they encode (GPT-2's byte-to-unicode table,
    /// which the Qwen3 `ByteLevel` decoder inverts). `None` for an id with no token. A token may
    /// be part of a UTF-8 character; joining the bytes of consecutive tokens gives the text.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        self.bytes_of(id, &self.added_tokens())
    }

    /// [`Tokenizer::token_bytes`] of ids `0..n`; an id with no token (a padded embedding row)
    /// has no bytes.
    pub fn vocabulary_bytes(&self, n: usize) -> Vec<Vec<u8>> {
        let added = self.added_tokens();
        (0..n as u32)
            .map(|id| self.bytes_of(id, &added).unwrap_or_default())
            .collect()
    }

    fn added_tokens(&self) -> std::collections::HashMap<u32, String> {
        self.inner
            .get_added_tokens_decoder()
            .into_iter()
            .map(|(id, t)| (id, t.content))
            .collect()
    }

    fn bytes_of(&self, id: u32, added: &std::collections::HashMap<u32, String>) -> Option<Vec<u8>> {
        let token = self.inner.id_to_token(id)?;
        if let Some(content) = added.get(&id) {
            return Some(content.clone().into_bytes());
        }
        let table = byte_level_inverse();
        token
            .chars()
            .map(|c| table.get(&c).copied())
            .collect::<Option<Vec<u8>>>()
            .or_else(|| Some(token.into_bytes()))
    }

    /// The number of tokens, added tokens included (151,669 for Qwen3). The model's embedding
    /// table may be larger (Qwen3-0.6B pads it to 151,936).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// A streaming decoder: feed it ids one at a time as they are generated.
    pub fn stream(&self) -> TextStream<'_> {
        TextStream {
            tok: self,
            inner: self.inner.decode_stream(false),
            held: Vec::new(),
            context: Vec::new(),
        }
    }
}

/// The `tokenizers` crate's streaming decoder for a [`tokenizers::Tokenizer`].
type DecodeStream<'a> = tokenizers::DecodeStream<
    'a,
    tokenizers::ModelWrapper,
    tokenizers::NormalizerWrapper,
    tokenizers::PreTokenizerWrapper,
    tokenizers::PostProcessorWrapper,
    tokenizers::DecoderWrapper,
>;

/// Incremental decoding for generation, from [`Tokenizer::stream`].
///
/// [`push`](TextStream::push) returns new text as soon as it is complete UTF-8; a character
/// whose bytes are split over several tokens is held back until its last byte arrives.
/// [`finish`](TextStream::finish) flushes whatever is still held back. Concatenating every piece
/// emitted equals [`Tokenizer::decode`] of all the ids pushed.
///
/// This is the `tokenizers` crate's own [`DecodeStream`](tokenizers::DecodeStream) (special tokens
/// kept), which decodes only the last few tokens at each step, plus the flush it lacks and a check
/// that every id is in the vocabulary.
pub struct TextStream<'a> {
    tok: &'a Tokenizer,
    inner: DecodeStream<'a>,
    /// Ids pushed since the last emitted piece: held back.
    held: Vec<u32>,
    /// The ids that completed the last emitted piece: the context [`TextStream::finish`] decodes
    /// the held ids in.
    context: Vec<u32>,
}

impl std::fmt::Debug for TextStream<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextStream")
            .field("tokenizer", &self.tok.path)
            .field("held", &self.held)
            .field("context", &self.context)
            .finish()
    }
}

impl TextStream<'_> {
    /// Adds one token. Returns the text it completes, or `None` while a character is still
    /// incomplete (or the token decodes to nothing). An id with no token in the vocabulary is
    /// [`Error::TokenOutOfRange`] and is not taken: the stream is unchanged.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        self.tok.check_ids(&[id])?;
        match self.inner.step(id) {
            Ok(Some(piece)) => {
                self.context.clear();
                self.context.append(&mut self.held);
                self.context.push(id);
                Ok(Some(piece))
            }
            Ok(None) => {
                self.held.push(id);
                Ok(None)
            }
            Err(e) => Err(self
                .tok
                .err(format_args!("streaming decode of token {id}: {e}"))),
        }
    }

    /// Ends the stream: returns the text of any tokens still held back (an incomplete character
    /// decodes to U+FFFD, exactly as [`Tokenizer::decode`] would), or `None` if there are none.
    /// The stream then starts afresh.
    pub fn finish(&mut self) -> Result<Option<String>> {
        if self.held.is_empty() {
            return Ok(None);
        }
        let prefix = self.tok.decode(&self.context)?;
        let all: Vec<u32> = self.context.iter().chain(&self.held).copied().collect();
        let text = self.tok.decode(&all)?;
        let piece = text.strip_prefix(prefix.as_str()).map(str::to_string).ok_or_else(|| {
            self.tok.err(format_args!(
                "streaming decode: tokens {:?} changed already-emitted text {prefix:?} into {text:?}",
                self.held
            ))
        })?;
        self.held.clear();
        self.context.clear();
        self.inner = self.tok.inner.decode_stream(false);
        Ok((!piece.is_empty()).then_some(piece))
    }
}

/// GPT-2's byte-level alphabet inverted: the character each byte is written as in a byte-level
/// BPE vocabulary, mapped back to the byte. Printable Latin-1 bytes stand for themselves; the
/// other 68 are the code points from 256 on, in byte order.
fn byte_level_inverse() -> &'static std::collections::HashMap<char, u8> {
    static TABLE: std::sync::OnceLock<std::collections::HashMap<char, u8>> =
        std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut next = 256u32;
        (0..=255u8)
            .map(|b| {
                let c = if printable(b) {
                    b as u32
                } else {
                    next += 1;
                    next - 1
                };
                (char::from_u32(c).expect("code points below 0x200"), b)
            })
            .collect()
    })
}
