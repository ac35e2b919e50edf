//! [`Forward`]: what the BPF [`Model`](crate::Model) and the f32 [`Reference`](crate::Reference)
//! have in common, so that code comparing or driving them can take either.

use crate::{Config, Result};

/// A Qwen3 model with its KV cache, fed one token at a time.
///
/// ```no_run
/// use qwen_bpf::{Forward, Model, ModelOptions, Reference, Checkpoint};
///
/// /// The most likely token after `prompt`, by any engine.
/// fn next(m: &mut dyn Forward, prompt: &[u32]) -> qwen_bpf::Result<usize> {
///     let mut best = 0;
///     for &t in prompt {
///         let logits = m.forward(t)?;
///         best = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap_or(0);
///     }
///     Ok(best)
/// }
///
/// # fn main() -> qwen_bpf::Result<()> {
/// let dir = "/path/to/Qwen3-0.6B";
/// let mut bpf = Model::open(dir, &ModelOptions::default())?;
/// let mut f32_ref = Reference::new(&Checkpoint::open(dir)?, 64)?;
/// assert_eq!(next(&mut bpf, &[9707, 11])?, next(&mut f32_ref, &[9707, 11])?);
/// # Ok(())
/// # }
/// ```
pub trait Forward {
    /// The model's hyper-parameters.
    fn config(&self) -> &Config;

    /// Tokens fed so far: the position the next token will take.
    fn position(&self) -> usize;

    /// The KV-cache capacity in tokens.
    fn max_context(&self) -> usize;

    /// Feeds `token` at the current position and returns the next-token logits (`vocab_size`
    /// values), borrowed until the next call: no vector is allocated per token.
    ///
    /// A token outside the vocabulary is [`Error::TokenOutOfRange`](crate::Error::TokenOutOfRange)
    /// and a full cache [`Error::ContextOverflow`](crate::Error::ContextOverflow); either leaves
    /// the model unchanged.
    fn forward(&mut self, token: u32) -> Result<&[f32]>;

    /// Forgets the context: the next token is at position 0 again.
    fn reset(&mut self);

    /// Keeps only the first `position` tokens of the context; a position beyond the current one
    /// is [`Error::InvalidParameter`](crate::Error::InvalidParameter).
    fn rewind(&mut self, position: usize) -> Result<()>;
}

/// Implements [`Forward`] for `$t` by its inherent methods of the same names (the same for
/// `Model` and `Reference`, so that both are used the same way).
macro_rules! impl_forward {
    ($t:ty) => {
        impl $crate::Forward for $t {
            fn config(&self) -> &$crate::Config {
                <$t>::config(self)
            }
            fn position(&self) -> usize {
                <$t>::position(self)
            }
            fn max_context(&self) -> usize {
                <$t>::max_context(self)
            }
            fn forward(&mut self, token: u32) -> $crate::Result<&[f32]> {
                <$t>::forward(self, token)
            }
            fn reset(&mut self) {
                <$t>::reset(self)
            }
            fn rewind(&mut self, position: usize) -> $crate::Result<()> {
                <$t>::rewind(self, position)
            }
        }
    };
}
pub(crate) use impl_forward;
