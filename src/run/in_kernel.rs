//! Generation inside the kernel ([`crate::Model::generate_in_kernel`]): the prompt and every
//! generated token run in BPF, the argmax of each step (or the token the integer sampler,
//! `src/bpf/sample.inc.c`, draws) fed back in the kernel; user space only starts invocations and
//! reads the tokens from a ring buffer.
//!
//! One invocation of the `generate` program (`src/bpf/generate.inc.c`; one per thread, meeting at
//! the plan's barriers) runs for at most [`BUDGET`]: a kernel built without preemption lets one
//! BPF program hold its CPU, and its soft-lockup watchdog fires after ~20 s. The invocation then
//! returns where it stopped and the iterator starts the next one, so a generation of N tokens
//! costs `threads × (1 + ceil(time / BUDGET))` `bpf(2)` calls in all: the first invocation
//! returns after the first new token, so that it shows at once and its time is the prompt's. An invocation cannot be
//! interrupted: a signal (Ctrl-C) takes effect when it returns, at most [`BUDGET`] later.

use std::time::Duration;

use crate::run::generate::FinishReason;
use crate::kernel::drivers::PlanFailure;
use crate::kernel::ops::GenArgs;
use crate::kernel::ring::GenToken;
use crate::{Error, GenerateOptions, Model, Result, Tokenizer};

/// The longest one in-kernel generation invocation runs before it returns to user space.
pub const BUDGET: Duration = Duration::from_millis(500);

/// Stop tokens the kernel checks (`GEN_STOPS_MAX`).
pub const STOPS_MAX: usize = 8;

/// Times an invocation is retried when its threads did not run at the same time (a barrier
/// timed out: other work held the CPUs; the first barrier gives up after 20 ms) before the
/// generation fails.
const RETRIES: u32 = 50;

/// `status` of `struct gen_args`: the time budget ran out; call again (`GEN_MORE`).
pub const GEN_MORE: i32 = 1;
/// A stop token was generated (`GEN_STOP`).
pub const GEN_STOP: i32 = 2;
/// `max_new` tokens were generated (`GEN_MAX`).
pub const GEN_MAX: i32 = 3;
/// The context is full (`GEN_FULL`).
pub const GEN_FULL: i32 = 4;

/// The tokens [`Model::generate_in_kernel`] generates: an iterator of `Result<u32>`, in the
/// order the kernel made them. Stop tokens are not yielded ([`KernelGeneration::finish_reason`]).
pub struct KernelGeneration<'m> {
    model: &'m mut Model,
    args: Vec<GenArgs>,
    finish: Option<FinishReason>,
    invocations: u64,
    last_bytes: Vec<u8>,
    /// The time budget of every invocation after the first (the first returns after the first
    /// token, so that the prompt's time is measured and its token shown at once).
    budget_ns: u64,
    /// The sampler's seed; `None` when greedy by the argmax.
    seed: Option<u64>,
}

impl std::fmt::Debug for KernelGeneration<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelGeneration")
            .field("generated", &self.generated())
            .field("finish", &self.finish)
            .field("invocations", &self.invocations)
            .finish()
    }
}

impl<'m> KernelGeneration<'m> {
    pub(crate) fn new(model: &'m mut Model, mut args: Vec<GenArgs>, seed: Option<u64>) -> Self {
        let budget_ns = args[0].budget_ns;
        for a in &mut args {
            a.budget_ns = 0;
        }
        KernelGeneration {
            model,
            args,
            finish: None,
            invocations: 0,
            last_bytes: Vec::new(),
            budget_ns,
            seed,
        }
    }

    /// The in-kernel sampler's seed ([`crate::SamplingParams::seed`], or the one drawn when it
    /// is `None`), or `None` when the kernel takes the argmax.
    pub fn seed(&self) -> Option<u64> {
        self.seed
    }

    /// For tests: a time budget per invocation other than [`BUDGET`].
    #[cfg(feature = "internals")]
    pub fn with_budget(mut self, budget: Duration) -> Self {
        self.budget_ns = budget.as_nanos() as u64;
        self
    }

    /// Why the generation ended (`None` while it goes on).
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.finish
    }

    /// Tokens generated so far (a stop token included).
    pub fn generated(&self) -> usize {
        self.args[0].generated as usize
    }

    /// Rounds of invocations so far (each is one `test_run` per thread).
    pub fn invocations(&self) -> u64 {
        self.invocations
    }

    /// The text bytes the kernel sent with the last token yielded (empty unless
    /// [`Model::load_vocabulary`] was called); possibly part of a UTF-8 character.
    pub fn last_bytes(&self) -> &[u8] {
        &self.last_bytes
    }

    /// The text as it is generated, from the bytes the kernel sends with each token, joined
    /// into whole UTF-8 characters (invalid sequences become U+FFFD). Needs
    /// [`Model::load_vocabulary`].
    ///
    /// The text comes from the vocabulary [`Model::load_vocabulary`] put in the arena; without
    /// it the first item is an [`Error::Invalid`] saying so (the token ids are still available
    /// by iterating the generation itself).
    pub fn text(self) -> KernelText<'m> {
        KernelText {
            tokens: self,
            pending: Vec::new(),
        }
    }

    /// Runs one round of invocations; queues the records.
    fn invoke(&mut self) -> Result<()> {
        let mut tries = 0;
        loop {
            let r = self.model.invoke_generate(&mut self.args);
            self.invocations += 1;
            // every thread follows thread 0's position, prompt and token counts
            let lead = self.args[0];
            for a in &mut self.args[1..] {
                a.run.pos = lead.run.pos;
                a.fed = lead.fed;
                a.generated = lead.generated;
                a.next = lead.next;
            }
            match r {
                Ok(()) => {
                    for a in &mut self.args {
                        a.budget_ns = self.budget_ns;
                    }
                    break;
                }
                Err(PlanFailure::TimedOut) if tries < RETRIES => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(PlanFailure::TimedOut) => {
                    return Err(Error::Bpf {
                        what: "in-kernel generation".into(),
                        detail: format!(
                            "its {} threads did not run at the same time in {} attempts (the CPUs are busy); use one thread",
                            self.args.len(),
                            RETRIES + 1
                        ),
                    })
                }
                Err(PlanFailure::Error(e)) => return Err(e),
            }
        }
        self.finish = match self.args[0].status {
            GEN_MORE => None,
            GEN_STOP => Some(FinishReason::Stop(self.args[0].next)),
            GEN_MAX => Some(FinishReason::MaxTokens),
            GEN_FULL => Some(FinishReason::ContextFull),
            s => {
                return Err(Error::Bpf {
                    what: "in-kernel generation".into(),
                    detail: format!("ended with status {s}"),
                })
            }
        };
        Ok(())
    }
}

impl Iterator for KernelGeneration<'_> {
    type Item = Result<u32>;

    fn next(&mut self) -> Option<Result<u32>> {
        loop {
            if let Some(GenToken { id, bytes, .. }) = self.model.next_generated() {
                // in-kernel generation writes token records only
                self.last_bytes = bytes;
                return Some(Ok(id));
            }
            if self.finish.is_some() {
                return None;
            }
            if let Err(e) = self.invoke() {
                self.finish = Some(FinishReason::Error);
                return Some(Err(e));
            }
        }
    }
}

/// [`KernelGeneration::text`]: text pieces of whole UTF-8 characters.
pub struct KernelText<'m> {
    tokens: KernelGeneration<'m>,
    pending: Vec<u8>,
}

impl KernelText<'_> {
    /// The generation behind the text.
    pub fn tokens(&self) -> &KernelGeneration<'_> {
        &self.tokens
    }
}

impl Iterator for KernelText<'_> {
    type Item = Result<String>;

    fn next(&mut self) -> Option<Result<String>> {
        if !self.tokens.model.vocab_loaded && self.tokens.finish.is_none() {
            self.tokens.finish = Some(FinishReason::Error);
            return Some(Err(Error::Invalid(
                "in-kernel text needs the vocabulary in the arena: call Model::load_vocabulary first"
                    .into(),
            )));
        }
        loop {
            match self.tokens.next() {
                Some(Ok(_)) => {
                    self.pending.extend_from_slice(&self.tokens.last_bytes);
                    let whole = match std::str::from_utf8(&self.pending) {
                        Ok(_) => self.pending.len(),
                        // keep an incomplete character at the end for the next token
                        Err(e) if e.error_len().is_none() => e.valid_up_to(),
                        Err(_) => self.pending.len(),
                    };
                    if whole > 0 {
                        let rest = self.pending.split_off(whole);
                        let piece = String::from_utf8_lossy(&self.pending).into_owned();
                        self.pending = rest;
                        return Some(Ok(piece));
                    }
                }
                Some(Err(e)) => return Some(Err(e)),
                None if self.pending.is_empty() => return None,
                None => {
                    let piece = String::from_utf8_lossy(&self.pending).into_owned();
                    self.pending.clear();
                    return Some(Ok(piece));
                }
            }
        }
    }
}

/// The stop tokens as the kernel takes them: at most [`STOPS_MAX`].
pub(crate) fn kernel_stops(tokens: &[u32]) -> Result<[u32; STOPS_MAX]> {
    let mut stops = [0u32; STOPS_MAX];
    if tokens.len() > stops.len() {
        return Err(Error::InvalidParameter {
            name: "stop_tokens",
            value: tokens.len() as f64,
            expected: "at most 8 stop tokens in the kernel",
        });
    }
    stops[..tokens.len()].copy_from_slice(tokens);
    Ok(stops)
}


impl Model {
    /// Puts every token's text bytes ([`Tokenizer::token_bytes`]) in the arena, so that
    /// [`Model::generate_in_kernel`] carries the text of each token out of the kernel with it.
    /// A vocabulary whose text exceeds the space reserved for it, or with a token longer than a
    /// ring-buffer record holds (256 bytes), is refused.
    pub fn load_vocabulary(&mut self, tok: &Tokenizer) -> Result<()> {
        let n = self.cfg.vocab_size;
        let bytes = tok.vocabulary_bytes(n);
        if let Some((id, b)) = bytes
            .iter()
            .enumerate()
            .find(|(_, b)| b.len() > crate::kernel::ring::TEXT_MAX)
        {
            return Err(Error::Invalid(format!(
                "token {id} has {} bytes of text; in-kernel generation carries at most {}",
                b.len(),
                crate::kernel::ring::TEXT_MAX
            )));
        }
        let head = (n + 1) * 4;
        let total = head + bytes.iter().map(Vec::len).sum::<usize>();
        if total > self.b.vocab.len() {
            return Err(Error::Invalid(format!(
                "the vocabulary's text takes {total} bytes; {} are reserved",
                self.b.vocab.len()
            )));
        }
        let mut table = Vec::with_capacity(total);
        let mut off = head as u32;
        for b in bytes.iter().map(|b| b.len() as u32).chain([0]) {
            table.extend_from_slice(&off.to_ne_bytes());
            off += b;
        }
        bytes.iter().for_each(|b| table.extend_from_slice(b));
        let dst = self.b.vocab.prefix(total)?;
        self.ops.arena.slice_mut::<u8>(dst)?.copy_from_slice(&table);
        self.vocab_loaded = true;
        Ok(())
    }

    /// Generation inside the kernel: one BPF invocation per thread feeds `prompt` and generates
    /// up to `opts.max_tokens` tokens (stopping at `opts.stop_tokens`), each chosen and fed back
    /// in the kernel, writing each token to a BPF ring buffer as it is made; the returned
    /// iterator reads them. An invocation runs at most `BUDGET` (the first one returns after the
    /// first new token) and the iterator invokes again until the generation ends.
    ///
    /// Greedy `opts.sampling` with no penalty (the default) takes the LM head's argmax; any
    /// other sampling draws each token with the kernel's integer sampler
    /// (`src/bpf/sample.inc.c`), the prompt counted for the penalties, so that one seed gives
    /// the tokens [`Model::generate`] gives. Parameters outside the integer sampler's ranges
    /// are [`Error::InvalidParameter`] (see `SamplingParams`). Needs a store that can be
    /// planned. The prompt is checked as in [`Model::prefill`].
    pub fn generate_in_kernel(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
    ) -> Result<KernelGeneration<'_>> {
        let Some(plan) = self.plan.clone() else {
            return Err(Error::Invalid(format!(
                "in-kernel generation needs a store that can be planned, not {}",
                self.store.name()
            )));
        };
        let p = &opts.sampling;
        let fixed = p.to_fixed()?;
        let sampling = !(p.is_greedy() && !fixed.has_penalties());
        if sampling {
            crate::num::limits::check_sampler_vocab(self.cfg.vocab_size)?;
        }
        let stops = kernel_stops(&opts.stop_tokens)?;
        self.check_feed(prompt)?;
        let seed = sampling.then(|| p.seed.unwrap_or_else(crate::run::sampling::random_seed));
        // the prompt counted for the penalties (the kernel counts each token it draws)
        let counts = if sampling && fixed.has_penalties() {
            let c = self.ops.arena.slice_mut::<u32>(self.b.counts)?;
            c.fill(0);
            for &t in prompt {
                c[t as usize] += 1; // checked above: below the vocabulary
            }
            self.ops.addr_of(self.b.counts)
        } else {
            0
        };
        let sample = crate::kernel::ops::sample_args(
            &fixed,
            self.ops.addr_of(self.b.logits),
            self.cfg.vocab_size as u32,
            counts,
            self.ops.addr_of(self.b.hist),
            self.ops.addr_of(self.b.exp2),
            seed.unwrap_or(0),
        );
        let max_new = opts.max_tokens.min(u32::MAX as usize - 1) as u32;
        // every position this generation can feed, committed ahead (a store to an uncommitted
        // arena page would be lost)
        let reach = (self.pos + prompt.len() + max_new as usize).min(self.max_context);
        self.b.kv.ensure(&mut self.ops.arena, reach);
        let dst = self.b.prompt.prefix(prompt.len() * 4)?;
        self.ops
            .arena
            .slice_mut::<u32>(dst)?
            .copy_from_slice(prompt);
        self.ops.tokens().clear();
        let head = plan.entries.last().expect("a plan ends with the head");
        let args = (0..plan.threads)
            .map(|t| crate::kernel::ops::GenArgs {
                run: crate::kernel::ops::RunPlanArgs {
                    plan: self.ops.addr_of(self.b.plan),
                    n_entries: plan.entries.len() as u32,
                    thread: t as u32,
                    lane: t as u32,
                    n_threads: plan.threads as u32,
                    pos: self.pos as u32,
                    ..Default::default()
                },
                prompt: self.ops.addr_of(self.b.prompt),
                vocab: if self.vocab_loaded {
                    self.ops.addr_of(self.b.vocab)
                } else {
                    0
                },
                budget_ns: BUDGET.as_nanos() as u64,
                n_prompt: prompt.len() as u32,
                max_new,
                max_ctx: self.max_context as u32,
                head_parts: head.parts.len() as u32,
                n_stops: opts.stop_tokens.len() as u32,
                stops,
                sampling: sampling.into(),
                sample,
                ..Default::default()
            })
            .collect();
        Ok(KernelGeneration::new(self, args, seed))
    }

    /// One round of in-kernel generation (see [`crate::run::in_kernel`]): runs `args` and moves the
    /// position to where the kernel stopped.
    pub(crate) fn invoke_generate(
        &mut self,
        args: &mut [crate::kernel::ops::GenArgs],
    ) -> std::result::Result<(), PlanFailure> {
        let r = self.ops.run_generate(args);
        self.pos = args[0].run.pos as usize;
        r
    }

    /// The next record of in-kernel generation, if one has arrived.
    pub(crate) fn next_generated(&mut self) -> Option<crate::kernel::ring::GenToken> {
        self.ops.tokens().pop()
    }
}
