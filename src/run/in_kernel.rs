//! Generation inside the kernel ([`crate::Model::generate_in_kernel`]): the prompt and every
//! generated token run in BPF, the argmax of each step fed back in the kernel; user space only
//! starts invocations and reads the tokens from a ring buffer.
//!
//! One invocation of the `generate` program (`src/bpf/generate.bpf.h`; one per thread, meeting at
//! the plan's barriers) runs for at most [`BUDGET`]: a kernel built without preemption lets one
//! BPF program hold its CPU, and its soft-lockup watchdog fires after ~20 s. The invocation then
//! returns where it stopped and the iterator starts the next one, so a generation of N tokens
//! costs `threads × (1 + ceil(time / BUDGET))` `bpf(2)` calls in all: the first invocation
//! returns after the first new token, so that it shows at once and its time is the prompt's. An invocation cannot be
//! interrupted: a signal (Ctrl-C) takes effect when it returns, at most [`BUDGET`] later.

use std::time::Duration;

use crate::run::generate::FinishReason;
use crate::kernel::ops::{GenArgs, PlanFailure};
use crate::kernel::ring::GenToken;
use crate::{Error, Model, Result};

/// The longest one in-kernel generation invocation runs before it returns to user space.
pub const BUDGET: Duration = Duration::from_millis(500);

/// Stop tokens the kernel checks (`GEN_STOPS_MAX`).
pub const STOPS_MAX: usize = 8;

/// Times an invocation is retried when its threads did not run at the same time (a barrier
/// timed out: other work held the CPUs; the first barrier gives up after 20 ms) before the
/// generation fails.
const RETRIES: u32 = 50;

// `status` of `struct gen_args`
const GEN_MORE: i32 = 1;
const GEN_STOP: i32 = 2;
const GEN_MAX: i32 = 3;
const GEN_FULL: i32 = 4;

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
    pub(crate) fn new(model: &'m mut Model, mut args: Vec<GenArgs>) -> Self {
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
        }
    }

    /// For tests: a time budget per invocation other than [`BUDGET`].
    #[doc(hidden)]
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
