//! Generation: [`Model::generate`] feeds a prompt and streams the tokens that follow, chosen by
//! [`SamplingParams`], as a [`Generation`] iterator; [`Generation::text`] turns it into text.
//!
//! ```no_run
//! use qwen_bpf::{GenerateOptions, Model, ModelOptions, SamplingParams, Tokenizer};
//!
//! # fn main() -> qwen_bpf::Result<()> {
//! let dir = std::path::Path::new("/path/to/Qwen3-0.6B");
//! let tok = Tokenizer::from_model_dir(dir)?;
//! let mut model = Model::open(dir, &ModelOptions::default())?;
//! let opts = GenerateOptions::new(64)
//!     .with_stop_tokens(tok.eos_ids())
//!     .with_sampling(SamplingParams::new(0.7).with_top_p(0.9).with_seed(1));
//! let prompt = tok.encode_chat("What is eBPF?")?;
//! let mut text = model.generate(&prompt, &opts)?.text(&tok);
//! for piece in &mut text {
//!     print!("{}", piece?);
//! }
//! println!("\n[{:?}]", text.finish_reason());
//! # Ok(())
//! # }
//! ```

use crate::run::sampling::{IntSampler, SamplingParams};
use crate::hf::tokenizer::{TextStream, Tokenizer};
use crate::{Error, Model, Result};

/// What [`Model::generate`] generates: how many tokens at most, where to stop, how to choose.
///
/// ```
/// use qwen_bpf::{GenerateOptions, SamplingParams};
/// let opts = GenerateOptions::new(32)
///     .with_stop_tokens([151645, 151643])
///     .with_sampling(SamplingParams::new(0.8).with_top_k(40));
/// assert_eq!(opts.max_tokens, 32);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct GenerateOptions {
    /// The most tokens to yield (default 256). 0 only feeds the prompt.
    pub max_tokens: usize,
    /// Tokens that end the generation when chosen (for Qwen3, usually
    /// [`Tokenizer::eos_ids`]). A stop token is not yielded: it is reported by
    /// [`Generation::finish_reason`] as [`FinishReason::Stop`]. Default: none.
    pub stop_tokens: Vec<u32>,
    /// How each token is chosen. Default: greedy.
    pub sampling: SamplingParams,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 256,
            stop_tokens: Vec::new(),
            sampling: SamplingParams::default(),
        }
    }
}

impl GenerateOptions {
    /// Greedy generation of at most `max_tokens` tokens, with no stop token.
    pub fn new(max_tokens: usize) -> Self {
        GenerateOptions {
            max_tokens,
            ..Self::default()
        }
    }

    /// With at most `max_tokens` tokens.
    pub fn with_max_tokens(mut self, max_tokens: usize) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    /// With these stop tokens (replacing any set before).
    pub fn with_stop_tokens(mut self, stop_tokens: impl IntoIterator<Item = u32>) -> Self {
        self.stop_tokens = stop_tokens.into_iter().collect();
        self
    }

    /// With these sampling parameters.
    pub fn with_sampling(mut self, sampling: SamplingParams) -> Self {
        self.sampling = sampling;
        self
    }
}

/// Why a [`Generation`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FinishReason {
    /// This stop token was chosen; it was not yielded (nor fed to the model).
    Stop(u32),
    /// [`GenerateOptions::max_tokens`] tokens were yielded.
    MaxTokens,
    /// The KV cache is full: the last token yielded could not be fed to the model.
    ContextFull,
    /// The iterator yielded an error and stopped.
    Error,
}

/// The tokens [`Model::generate`] generates, one forward pass each: an iterator of
/// `Result<u32>` that ends at a stop token, after `max_tokens` tokens or when the context is
/// full ([`Generation::finish_reason`] says which), or after yielding an error.
///
/// A token is fed to the model only when the next one is asked for, so the model's position
/// after the generation is the prompt's end plus the tokens yielded, minus one: the last token
/// yielded was never fed. Dropping a `Generation` early is fine; the model stays usable.
#[derive(Debug)]
pub struct Generation<'m> {
    model: &'m mut Model,
    /// `None`: greedy by the BPF argmax ([`Model::next_token`]).
    sampler: Option<IntSampler>,
    stop_tokens: Vec<u32>,
    max_tokens: usize,
    prompt_len: usize,
    /// Chosen by the last forward pass, not yet yielded.
    pending: Option<u32>,
    /// Yielded, not yet fed.
    to_feed: Option<u32>,
    generated: usize,
    decode_steps: usize,
    finish: Option<FinishReason>,
}

impl Model {
    /// Feeds `prompt` at the current position (call [`Model::reset`] first for a fresh context)
    /// and returns the tokens that follow as a streaming [`Generation`].
    ///
    /// The prompt is fed here, with [`Model::prefill`]; every token after the first then costs
    /// one forward pass when the iterator asks for it. With temperature 0 and no penalties the
    /// tokens are the BPF LM head's argmax ([`Model::next_token`]), exactly the tokens of calling
    /// it in a loop; otherwise the integer sampler (`src/num/sample.rs`, the twin of the kernel's
    /// `src/bpf/sample.inc.c`) draws them from the Q16 logits ([`Model::forward_fixed`]), with the
    /// prompt counted for the penalties: one seed gives the tokens of
    /// [`Model::generate_in_kernel`] with the same options (docs/sampling.md).
    ///
    /// Everything is checked before anything is fed, so on error the model is unchanged: bad
    /// sampling parameters are [`Error::InvalidParameter`], and the prompt errors are those of
    /// [`Model::prefill`] ([`Error::EmptyPrompt`], [`Error::TokenOutOfRange`],
    /// [`Error::ContextOverflow`]).
    pub fn generate(&mut self, prompt: &[u32], opts: &GenerateOptions) -> Result<Generation<'_>> {
        let sampling = &opts.sampling;
        sampling.to_fixed()?;
        self.check_feed(prompt)?;
        let Some((&last, head)) = prompt.split_last() else {
            return Err(Error::EmptyPrompt);
        };
        let (sampler, first) = if sampling.is_greedy() && !sampling.has_penalties() {
            if !head.is_empty() {
                self.prefill(head)?;
            }
            (None, self.next_token(last)?)
        } else {
            let mut sampler = IntSampler::new(sampling, self.cfg.vocab_size)?;
            prompt.iter().for_each(|&t| sampler.accept(t));
            self.prefill(prompt)?;
            let first = sampler.sample(self.last_logits_fixed()?)?;
            (Some(sampler), first)
        };
        Ok(Generation {
            model: self,
            sampler,
            stop_tokens: opts.stop_tokens.clone(),
            max_tokens: opts.max_tokens,
            prompt_len: prompt.len(),
            pending: Some(first),
            to_feed: None,
            generated: 0,
            decode_steps: 0,
            finish: None,
        })
    }
}

impl<'m> Generation<'m> {
    /// Why the generation ended, once the iterator has returned `None` (before: `None`).
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.finish
    }

    /// Tokens yielded so far.
    pub fn generated(&self) -> usize {
        self.generated
    }

    /// Forward passes after the prompt so far (the first token comes from the prompt's last).
    pub fn decode_steps(&self) -> usize {
        self.decode_steps
    }

    /// The prompt's length in tokens.
    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    /// The sampler's seed ([`SamplingParams::seed`], or the one drawn from the operating system
    /// when it is `None`: pass it back to replay), or `None` when decoding greedily by the BPF
    /// argmax.
    pub fn seed(&self) -> Option<u64> {
        self.sampler.as_ref().map(IntSampler::seed)
    }

    /// The model generating (for its position, [`Model::bpf_runs`], ...).
    pub fn model(&self) -> &Model {
        self.model
    }

    /// Streams the generation as text decoded by `tokenizer` ([`Tokenizer::stream`]).
    pub fn text<'t>(self, tokenizer: &'t Tokenizer) -> TextGeneration<'m, 't> {
        TextGeneration {
            tokens: self,
            stream: tokenizer.stream(),
            flushed: false,
        }
    }

    /// One forward pass feeding `token`; returns the next token.
    fn step(&mut self, token: u32) -> Result<u32> {
        self.decode_steps += 1;
        match &mut self.sampler {
            None => self.model.next_token(token),
            Some(sampler) => {
                let logits = self.model.forward_fixed(token)?;
                sampler.sample(logits)
            }
        }
    }

    fn end(&mut self, reason: FinishReason) -> Option<Result<u32>> {
        self.finish = Some(reason);
        None
    }
}

impl Iterator for Generation<'_> {
    type Item = Result<u32>;

    fn next(&mut self) -> Option<Result<u32>> {
        if self.finish.is_some() {
            return None;
        }
        if self.generated >= self.max_tokens {
            return self.end(FinishReason::MaxTokens);
        }
        let token = match self.pending.take() {
            Some(t) => t,
            None => {
                let fed = self
                    .to_feed
                    .take()
                    .expect("a yielded token waits to be fed");
                if self.model.position() >= self.model.max_context() {
                    return self.end(FinishReason::ContextFull);
                }
                match self.step(fed) {
                    Ok(t) => t,
                    Err(e) => {
                        self.finish = Some(FinishReason::Error);
                        return Some(Err(e));
                    }
                }
            }
        };
        if self.stop_tokens.contains(&token) {
            return self.end(FinishReason::Stop(token));
        }
        if let Some(s) = &mut self.sampler {
            s.accept(token);
        }
        self.generated += 1;
        self.to_feed = Some(token);
        Some(Ok(token))
    }
}

/// A [`Generation`] as text, from [`Generation::text`]: an iterator of non-empty text pieces,
/// each the text completed by the tokens since the last piece (a character split over several
/// tokens comes out whole). When the tokens end, whatever is still held back is flushed as a last
/// piece. A token the tokenizer has no entry for (a padding row of the embedding table) yields
/// [`Error::TokenOutOfRange`] and is skipped; the iteration goes on.
#[derive(Debug)]
pub struct TextGeneration<'m, 't> {
    tokens: Generation<'m>,
    stream: TextStream<'t>,
    flushed: bool,
}

impl<'m> TextGeneration<'m, '_> {
    /// Why the generation ended, once it has ([`Generation::finish_reason`]).
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.tokens.finish_reason()
    }

    /// The token generation underneath.
    pub fn tokens(&self) -> &Generation<'m> {
        &self.tokens
    }
}

impl Iterator for TextGeneration<'_, '_> {
    type Item = Result<String>;

    fn next(&mut self) -> Option<Result<String>> {
        loop {
            match self.tokens.next() {
                Some(Ok(id)) => match self.stream.push(id) {
                    Ok(Some(piece)) => return Some(Ok(piece)),
                    Ok(None) => continue,
                    Err(e) => return Some(Err(e)),
                },
                Some(Err(e)) => return Some(Err(e)),
                None if self.flushed => return None,
                None => {
                    self.flushed = true;
                    return self.stream.finish().transpose();
                }
            }
        }
    }
}
