//! Feeding tokens: one step per token (by the recorded plan, in the kernel or per operator) or
//! a prompt in blocks, and the LM head's logits or argmax.

use super::{Head, Model};
use crate::kernel::drivers::PlanFailure;
use crate::kernel::ops::first_best;
use crate::kernel::plan::Plan;
use crate::num::fixed;
use crate::types::{check_feed, Dispatch};
use crate::Result;

impl Model {
    /// Feeds `token` and returns the next-token logits (`vocab_size` f32, converted from Q16),
    /// borrowed until the next call ([`Forward::forward`](crate::Forward::forward)).
    pub fn forward(&mut self, token: u32) -> Result<&[f32]> {
        self.step(token, Head::Logits)?;
        self.logits_f32()
    }

    /// The logits the last step wrote, converted from Q16 to f32 into `self.logits`.
    fn logits_f32(&mut self) -> Result<&[f32]> {
        let q16 = self.ops.arena.slice::<i32>(self.b.logits)?;
        for (out, &v) in self.logits.iter_mut().zip(q16) {
            *out = fixed::from_fixed(v, fixed::Q_ACT);
        }
        Ok(&self.logits)
    }

    /// Feeds `token` and returns the logits exactly as the kernel computed them (Q16), borrowed
    /// from the arena until the next call.
    pub fn forward_fixed(&mut self, token: u32) -> Result<&[i32]> {
        self.step(token, Head::Logits)?;
        self.ops.arena.slice::<i32>(self.b.logits)
    }

    /// The Q16 logits the last step or prefill wrote (as [`Model::forward_fixed`] returns them).
    pub(crate) fn last_logits_fixed(&self) -> Result<&[i32]> {
        self.ops.arena.slice::<i32>(self.b.logits)
    }

    /// Feeds `token` and returns the most likely next token, computed by the BPF LM head with a
    /// fused argmax (no logits are copied out): the screened head (`num::bound`) unless the
    /// model was opened with [`ModelOptions::screened_head`](crate::ModelOptions::screened_head) false; the same token either way.
    pub fn next_token(&mut self, token: u32) -> Result<u32> {
        Ok(self.step(token, Head::Argmax)?.0 as u32)
    }

    /// Whether [`Model::next_token`] uses the screened head (see [`ModelOptions::screened_head`](crate::ModelOptions::screened_head)).
    pub fn screened_head(&self) -> bool {
        self.screened
    }

    /// For benchmarks and tests: switches [`Model::next_token`] between the screened head (when
    /// the model was opened with one) and the full exact head.
    #[cfg(feature = "internals")]
    pub fn set_screened_head(&mut self, on: bool) {
        self.screened = on && self.memory.head_screen > 0;
    }

    /// What the screened head found at the last [`Model::next_token`]: rows rescored exactly,
    /// the best lower bound. `None` when the full head ran.
    #[cfg(feature = "internals")]
    pub fn head_screen_result(&self) -> Option<crate::kernel::swar_ops::ScreenResult> {
        self.store.screen_result().filter(|_| self.screened)
    }

    /// Feeds a whole prompt and returns the logits after its last token. The prompt is checked
    /// before anything is fed, so on error the model is unchanged: no token is
    /// [`Error::EmptyPrompt`](crate::Error::EmptyPrompt), an id outside the vocabulary is [`Error::TokenOutOfRange`](crate::Error::TokenOutOfRange) (with its
    /// index in `tokens`), and a prompt longer than the remaining context is
    /// [`Error::ContextOverflow`](crate::Error::ContextOverflow) (at the first position that does not fit). The logits are
    /// borrowed as in [`Model::forward`].
    ///
    /// The prompt goes through the model in blocks of [`Model::prefill_block`] tokens: each
    /// weight matrix is read once per block and multiplied by the block's vectors, attention
    /// runs position by position inside the block, and only the last token gets the LM head.
    /// Every token's integers (its KV rows, the last token's logits) are exactly those of
    /// feeding the tokens one by one with [`Model::forward`].
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        self.prefill_blocks(tokens)?;
        self.logits_f32()
    }

    /// [`Model::prefill`] returning the logits as the kernel computed them (Q16), as
    /// [`Model::forward_fixed`] does.
    pub fn prefill_fixed(&mut self, tokens: &[u32]) -> Result<&[i32]> {
        self.prefill_blocks(tokens)?;
        self.last_logits_fixed()
    }

    /// Feeds `tokens` in blocks (see [`Model::prefill`]), leaving the last one's logits in the
    /// arena.
    fn prefill_blocks(&mut self, tokens: &[u32]) -> Result<()> {
        self.check_feed(tokens)?;
        let block = self.b.block;
        let n = tokens.len();
        let mut fed = 0;
        while fed < n {
            let chunk = &tokens[fed..(fed + block).min(n)];
            fed += chunk.len();
            // only the last prompt token's logits are wanted
            let head = if fed == n { Head::Logits } else { Head::Skip };
            match chunk {
                [t] => {
                    self.step(*t, head)?;
                }
                _ => {
                    // checked above: every id is in the vocabulary and the context has room
                    self.b
                        .kv
                        .ensure(&mut self.ops.arena, self.pos + chunk.len());
                    self.emit(chunk, self.pos, head)?;
                    self.pos += chunk.len();
                }
            }
        }
        Ok(())
    }

    /// Tokens per prefill block: how many prompt tokens [`Model::prefill`] runs through each
    /// weight matrix at once ([`Backend::prefill_block`](crate::Backend::prefill_block) of the store).
    pub fn prefill_block(&self) -> usize {
        self.b.block
    }

    /// How the step runs: [`Dispatch::Kernel`] (one `run_plan` invocation per thread and
    /// token) or [`Dispatch::PerOp`] (one `test_run` per operator run).
    pub fn dispatch(&self) -> Dispatch {
        self.dispatch
    }

    /// Where the model's kernel memory lives: [`crate::MemoryLayer::Arena`] or
    /// [`crate::MemoryLayer::Array`] ([`ModelOptions::memory`](crate::ModelOptions::memory), with `Auto` resolved).
    pub fn memory_layer(&self) -> crate::MemoryLayer {
        self.ops.layer()
    }

    /// For benchmarks and tests: switches between [`Dispatch::Kernel`] and [`Dispatch::PerOp`]
    /// ([`Dispatch::Auto`] picks the kernel); the kernel needs a store that can be planned.
    #[cfg(feature = "internals")]
    pub fn set_dispatch(&mut self, dispatch: Dispatch) -> Result<()> {
        self.dispatch = super::open::resolve_dispatch(dispatch, self.plan.is_some(), self.store.name())?;
        Ok(())
    }

    /// The recorded step (`None` for the arena-batch store, whose step runs live).
    #[cfg(feature = "internals")]
    pub fn plan(&self) -> Option<&Plan> {
        self.plan.as_deref()
    }

    /// Kernel runs whose threads did not meet at a barrier in time (another process held the
    /// CPUs), so that the token ran per operator instead; the result is the same.
    #[cfg(feature = "internals")]
    pub fn kernel_fallbacks(&self) -> u64 {
        self.fallbacks
    }

    /// For tests: [`Model::forward_fixed`] with the recorded step executed by the Rust twins
    /// ([`crate::verify::twin_plan`]) on this model's arena instead of BPF. Returns the logits and the
    /// head's argmax (row, Q16 logit).
    #[cfg(feature = "internals")]
    pub fn twin_forward_fixed(&mut self, token: u32) -> Result<(&[i32], (usize, i32))> {
        let plan = self.plan.clone().ok_or_else(|| {
            crate::Error::Invalid(format!("the {} store records no plan", self.store.name()))
        })?;
        self.begin_step(token)?;
        let best = crate::verify::twin_plan::run_plan(&mut self.ops.arena, &plan, token, self.pos as u32)?;
        self.pos += 1;
        Ok((self.ops.arena.slice::<i32>(self.b.logits)?, best))
    }

    /// Checks that `tokens` can be fed at the current position ([`check_feed`]).
    pub(crate) fn check_feed(&self, tokens: &[u32]) -> Result<()> {
        check_feed(tokens, self.pos, self.max_context, self.cfg.vocab_size)
    }

    /// Checks that `token` can be fed at the current position and commits its KV pages.
    fn begin_step(&mut self, token: u32) -> Result<()> {
        self.check_feed(&[token])?;
        self.b.kv.ensure(&mut self.ops.arena, self.pos + 1);
        Ok(())
    }

    /// One decoder pass at the current position. Returns the argmax (row, Q16 logit; (0, 0)
    /// with [`Head::Skip`]).
    fn step(&mut self, token: u32, head: Head) -> Result<(usize, i32)> {
        self.begin_step(token)?;
        let best = match self.plan.clone() {
            None => self.emit(&[token], self.pos, head)?,
            Some(plan) => self.run_plan(&plan, token, head)?,
        };
        self.pos += 1;
        Ok(best)
    }

    /// Runs the recorded step for `token` at the current position, as [`Model::dispatch`] says.
    fn run_plan(&mut self, plan: &Plan, token: u32, mode: Head) -> Result<(usize, i32)> {
        let pos = self.pos as u32;
        let head = plan
            .entries
            .last()
            .expect("a recorded plan ends with the head");
        let screened = mode == Head::Argmax && self.screened;
        if self.dispatch == Dispatch::Kernel {
            // With the screened head, the kernel runs everything before the head and the
            // screen follows from user space (its activation norms are computed there).
            let n = plan.entries.len();
            let n_run = if screened || mode == Head::Skip {
                n - 1
            } else {
                n
            };
            match self
                .ops
                .run_plan(self.b.plan, n, n_run, plan.threads, token, pos)
            {
                Ok(_) if mode == Head::Skip => return Ok((0, 0)),
                Ok(_) if screened => {
                    return self.store.lm_head_argmax(
                        &mut self.ops,
                        self.b.xn,
                        0..self.cfg.vocab_size,
                    )
                }
                // threads past the head's parts ran no part of it
                Ok(best) => return Ok(first_best(0, best.into_iter().take(head.parts.len()))),
                Err(PlanFailure::TimedOut) => self.fallbacks += 1,
                Err(PlanFailure::Error(e)) => return Err(e),
            }
        }
        let body = &plan.entries[..plan.entries.len() - 1];
        for e in body {
            self.ops.run_entry(e, token, pos)?;
        }
        if mode == Head::Skip {
            return Ok((0, 0));
        }
        if screened {
            return self
                .store
                .lm_head_argmax(&mut self.ops, self.b.xn, 0..self.cfg.vocab_size);
        }
        let parts = self.ops.run_entry(head, token, pos)?;
        let fields = head.head.expect("the last entry is the head");
        Ok(first_best(0, parts.iter().map(|a| fields.read(a))))
    }
}
