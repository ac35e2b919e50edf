//! The packet filter's classifier in user space: a [`Model`] and a [`CompiledRule`] that score
//! each payload's labels with the integers of [`crate::num::classify`], exactly as the kernel
//! computes them (the Rust side the in-kernel filter is checked against).
//!
//! The prompt is `prefix ++ text ++ suffix`; the prefix's KV (positions `0..P`) is computed once,
//! by [`Filter::new`]. Each [`Filter::classify`] rewinds to `P`, feeds the text's and the
//! suffix's tokens in prefill blocks (only the last gets the LM head: the integers of feeding
//! them one by one with the recorded plan, `tests/prefill.rs`), and scores every label from
//! there: a label's first token from those logits, shared by all labels; its later tokens from
//! the logits after feeding its earlier ones at the position after the prompt.

use std::fmt;

use super::rule::{payload_text, Action, CompiledRule, FilterRule};
use crate::hf::tokenizer::Tokenizer;
use crate::model::Model;
use crate::num::classify::{decide, log_prob_q16, lse_q16};
use crate::num::fixed::exp2_table;
use crate::{Error, Result};

/// A payload's classification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The chosen label's index in the rule (the fallback when the margin or threshold was not
    /// met).
    pub label: usize,
    /// Its name.
    pub name: String,
    /// Its action.
    pub action: Action,
    /// Its score: the log-probability of its tokens after the prompt, Q16 nats.
    pub score_q16: i64,
    /// Every label's score, in the rule's order.
    pub scores_q16: Vec<i64>,
    /// The tokens of the payload's text (without the template's).
    pub tokens: usize,
}

impl Verdict {
    /// [`Verdict::score_q16`] in nats.
    pub fn score(&self) -> f64 {
        self.score_q16 as f64 / 65536.0
    }
}

impl fmt::Display for Verdict {
    /// `name score`, the score in nats with 4 decimals.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:.4}", self.name, self.score())
    }
}

/// A model classifying payloads by a rule (see the module's documentation).
///
/// ```no_run
/// use qwen_bpf::filter::{Filter, FilterRule};
/// use qwen_bpf::{Model, ModelOptions, Tokenizer};
///
/// # fn main() -> qwen_bpf::Result<()> {
/// let dir = std::path::Path::new("/path/to/model");
/// let tok = Tokenizer::from_model_dir(dir)?;
/// let rule = FilterRule::load("/path/to/rule")?;
/// let ctx = rule.compile(&tok)?.context_needed();
/// let model = Model::open(dir, &ModelOptions::default().with_max_context(ctx))?;
/// let mut filter = Filter::new(model, &tok, rule)?;
/// println!("{}", filter.classify(b"GET /index.html HTTP/1.1")?);
/// # Ok(())
/// # }
/// ```
pub struct Filter {
    model: Model,
    rule: CompiledRule,
    tok: Tokenizer,
    /// The exp2 table of the scores' `exp_neg`.
    tab: [u32; 257],
    /// The prefix's tokens: positions `0..prefix_len` hold its KV.
    prefix_len: usize,
    /// The kernel side is set up for the rule (`Model::filter_setup`, run/filter/install.rs).
    pub(super) kernel_ready: bool,
}

impl fmt::Debug for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Filter")
            .field("model", &self.model)
            .field("rule", &self.rule)
            .finish()
    }
}

impl Filter {
    /// Compiles `rule` with `tok` ([`FilterRule::compile`]), checks its token ids against the
    /// model's vocabulary ([`Error::TokenOutOfRange`]) and the model's context against
    /// [`CompiledRule::context_needed`] ([`Error::ContextOverflow`]: a model that could not
    /// classify every payload is refused here rather than at some packet), and feeds the
    /// prefix once.
    pub fn new(model: Model, tok: &Tokenizer, rule: FilterRule) -> Result<Filter> {
        let rule = rule.compile(tok)?;
        let vocab = model.config().vocab_size;
        let ids = rule
            .prefix()
            .iter()
            .chain(rule.suffix())
            .chain(rule.labels().iter().flatten());
        if let Some((index, &id)) = ids.enumerate().find(|&(_, &id)| id as usize >= vocab) {
            return Err(Error::TokenOutOfRange { id, index, vocab });
        }
        crate::types::check_room(rule.context_needed(), 0, model.max_context())?;
        let prefix_len = rule.prefix().len();
        let mut f = Filter {
            model,
            rule,
            tok: tok.clone(),
            tab: exp2_table(),
            prefix_len,
            kernel_ready: false,
        };
        f.feed_prefix()?;
        Ok(f)
    }

    /// Feeds the prefix from position 0.
    fn feed_prefix(&mut self) -> Result<()> {
        self.model.reset();
        if self.prefix_len > 0 {
            self.model.prefill_fixed(self.rule.prefix())?;
        }
        Ok(())
    }

    /// Classifies `payload` (the L4 payload's bytes): its text ([`payload_text`]) tokenized,
    /// fed after the prefix with the suffix, every label scored (`num::classify`) and the
    /// decision taken (`num::classify::decide`).
    pub fn classify(&mut self, payload: &[u8]) -> Result<Verdict> {
        let text = payload_text(self.rule.rule(), payload);
        let mut ids = if text.is_empty() {
            Vec::new()
        } else {
            self.tok.encode(text)?
        };
        let tokens = ids.len();
        ids.extend_from_slice(self.rule.suffix());
        // the prefix's KV is kept unless someone reset the model below it (Filter::model_mut)
        if self.model.position() < self.prefix_len {
            self.feed_prefix()?;
        }
        self.model.rewind(self.prefix_len)?;
        let scores = self.score(&ids)?;
        let r = &self.rule;
        let label = decide(&scores, r.margin_q16(), r.threshold_q16(), r.fallback());
        let l = &r.rule().labels[label];
        Ok(Verdict {
            label,
            name: l.name.clone(),
            action: l.action,
            score_q16: scores[label],
            scores_q16: scores,
            tokens,
        })
    }

    /// Feeds `prompt` (text and suffix, non-empty) from the current position and returns every
    /// label's score.
    fn score(&mut self, prompt: &[u32]) -> Result<Vec<i64>> {
        let labels = self.rule.labels();
        // every label's first token, from the prompt's logits
        let logits = self.model.prefill_fixed(prompt)?;
        let lse = lse_q16(logits, &self.tab);
        let mut scores: Vec<i64> = labels
            .iter()
            .map(|t| log_prob_q16(logits, t[0] as usize, lse))
            .collect();
        // a label's later tokens: after its earlier ones, fed at the position after the prompt
        let end = self.model.position();
        for (score, t) in scores.iter_mut().zip(labels).filter(|(_, t)| t.len() > 1) {
            self.model.rewind(end)?;
            for j in 1..t.len() {
                let logits = self.model.forward_fixed(t[j - 1])?;
                let lse = lse_q16(logits, &self.tab);
                *score += log_prob_q16(logits, t[j] as usize, lse);
            }
        }
        Ok(scores)
    }

    /// The compiled rule.
    pub fn rule(&self) -> &CompiledRule {
        &self.rule
    }

    /// The model. Its positions `0..P` hold the prefix's KV, which every classification uses:
    /// feeding tokens from a position below `P` (after a rewind or
    /// [`Model::load_context`]) spoils it. A model reset or rewound below `P` gets the prefix
    /// again at the next classification.
    pub fn model_mut(&mut self) -> &mut Model {
        &mut self.model
    }

    /// The model and the compiled rule: what the kernel is given. The model's context is
    /// rewound to the prefix (positions `0..P` hold its KV), or reset to 0 if it no longer
    /// holds it (reset or rewound below `P` through [`Filter::model_mut`]).
    pub fn into_parts(mut self) -> (Model, CompiledRule) {
        // a rewind to P fails only below P, where the prefix is to be fed again anyway
        if self.model.rewind(self.prefix_len).is_err() {
            self.model.reset();
        }
        (self.model, self.rule)
    }
}
