//! Choosing the next token from logits: [`SamplingParams`] and the [`Sampler`] that applies them
//! (its documentation lists the stages).

use std::collections::HashMap;

use rand::{Rng, SeedableRng, TryRngCore};
use rand_chacha::ChaCha8Rng;

use crate::num::sample::{self as int, Params};
use crate::{Error, Result};

/// How to choose each next token. The default is greedy decoding (temperature 0, no filter, no
/// penalty); see [`Sampler`] for the order the stages run in.
///
/// Build one with [`SamplingParams::greedy`] or [`SamplingParams::new`] and the `with_*` methods:
///
/// ```
/// use qwen_bpf::SamplingParams;
/// let p = SamplingParams::new(0.8).with_top_k(40).with_top_p(0.95).with_seed(7);
/// assert!(p.validate().is_ok());
/// assert!(SamplingParams::default().is_greedy());
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SamplingParams {
    /// Divides the logits before the draw; 0 is greedy (argmax). Finite and ≥ 0.
    pub temperature: f32,
    /// Keep only the `top_k` highest logits; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens with probability mass ≥ `top_p`; in (0, 1],
    /// 1 keeps all.
    pub top_p: f32,
    /// Keep the tokens at least `min_p` times as likely as the most likely one; in [0, 1], 0 keeps
    /// all.
    pub min_p: f32,
    /// Repetition penalty over the tokens seen (prompt and generated): a seen token's positive
    /// logit is divided by it, a negative one multiplied. Finite and > 0; 1 is off.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token seen at least once. Finite; 0 is off.
    pub presence_penalty: f32,
    /// Subtracted from a seen token's logit once per time it was seen. Finite; 0 is off.
    pub frequency_penalty: f32,
    /// Seed of the random generator; `None` takes one from the operating system.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding: always the most likely token (the default).
    pub fn greedy() -> Self {
        Self::default()
    }

    /// Sampling at `temperature` with no filter and no penalty (0 is greedy).
    pub fn new(temperature: f32) -> Self {
        SamplingParams {
            temperature,
            ..Self::default()
        }
    }

    /// With this temperature (0 is greedy).
    pub fn with_temperature(mut self, temperature: f32) -> Self {
        self.temperature = temperature;
        self
    }

    /// With top-k filtering (0 keeps all).
    pub fn with_top_k(mut self, top_k: usize) -> Self {
        self.top_k = top_k;
        self
    }

    /// With top-p (nucleus) filtering (1 keeps all).
    pub fn with_top_p(mut self, top_p: f32) -> Self {
        self.top_p = top_p;
        self
    }

    /// With min-p filtering (0 keeps all).
    pub fn with_min_p(mut self, min_p: f32) -> Self {
        self.min_p = min_p;
        self
    }

    /// With this repetition penalty (1 is off).
    pub fn with_repetition_penalty(mut self, penalty: f32) -> Self {
        self.repetition_penalty = penalty;
        self
    }

    /// With this presence penalty (0 is off).
    pub fn with_presence_penalty(mut self, penalty: f32) -> Self {
        self.presence_penalty = penalty;
        self
    }

    /// With this frequency penalty (0 is off).
    pub fn with_frequency_penalty(mut self, penalty: f32) -> Self {
        self.frequency_penalty = penalty;
        self
    }

    /// With a fixed seed: the same seed, logits and history give the same tokens.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Temperature 0: the argmax of the (penalised) logits, no random draw.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Whether any of the three penalties is on.
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }

    /// Checks every parameter's range; the first bad one is [`Error::InvalidParameter`] naming
    /// it, with its value. NaN is always refused.
    pub fn validate(&self) -> Result<()> {
        let bad = |name: &'static str, value: f64, expected: &'static str| {
            Err(Error::InvalidParameter {
                name,
                value,
                expected,
            })
        };
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return bad("temperature", t.into(), "a finite number >= 0 (0 = greedy)");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", self.top_p.into(), "a number in (0, 1] (1 = off)");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", self.min_p.into(), "a number in [0, 1] (0 = off)");
        }
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0) {
            return bad(
                "repetition_penalty",
                r.into(),
                "a finite number > 0 (1 = off)",
            );
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !v.is_finite() {
                return bad(name, v.into(), "a finite number (0 = off)");
            }
        }
        Ok(())
    }
}

impl SamplingParams {
    /// The parameters in the integer sampler's fixed point (Q16, `src/bpf/sample.inc.c`):
    /// [`SamplingParams::validate`], then each value rounded to Q16 and checked against the
    /// kernel's ranges (temperature 0 or 0.01..=100, top-p at least 2^-16, repetition penalty
    /// 0.01..=100, presence and frequency penalties within ±64), else
    /// [`Error::InvalidParameter`] naming the parameter with the value given.
    pub(crate) fn to_fixed(&self) -> Result<Params> {
        self.validate()?;
        let q16 = |v: f32| (f64::from(v) * f64::from(int::ONE)).round();
        let p = Params {
            temp_q16: q16(self.temperature) as u32,
            top_k: self.top_k.min(u32::MAX as usize) as u32,
            top_p_q16: q16(self.top_p) as u32,
            min_p_q16: q16(self.min_p) as u32,
            rep_q16: q16(self.repetition_penalty) as u32,
            presence_q16: q16(self.presence_penalty) as i32,
            frequency_q16: q16(self.frequency_penalty) as i32,
        };
        // report the value as given, not its Q16 rounding (nor a saturated cast)
        p.check().map(|()| p).map_err(|e| match e {
            Error::InvalidParameter { name, expected, .. } => Error::InvalidParameter {
                name,
                value: match name {
                    "temperature" => self.temperature,
                    "top_p" => self.top_p,
                    "min_p" => self.min_p,
                    "repetition_penalty" => self.repetition_penalty,
                    "presence_penalty" => self.presence_penalty,
                    _ => self.frequency_penalty,
                }
                .into(),
                expected,
            },
            e => e,
        })
    }
}

/// The integer sampler ([`crate::num::sample`]) on user-space logits, with its state: the
/// generator, the counts of the tokens seen. What [`Model::generate`](crate::Model::generate)
/// samples with, so that its tokens are the kernel's (`generate_in_kernel`) for one seed.
#[derive(Clone)]
pub(crate) struct IntSampler {
    params: Params,
    seed: u64,
    rng: u64,
    /// Times each token was accepted.
    counts: Vec<u32>,
    /// The logits copied, penalised in place by the draw.
    scratch: Vec<i32>,
    tab: [u32; 257],
}

impl std::fmt::Debug for IntSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntSampler")
            .field("params", &self.params)
            .field("seed", &self.seed)
            .finish()
    }
}

impl IntSampler {
    /// A sampler over `vocab` tokens; the generator starts at `params.seed` (or one from the
    /// operating system). Parameters as [`SamplingParams::to_fixed`].
    pub(crate) fn new(params: &SamplingParams, vocab: usize) -> Result<IntSampler> {
        let fixed = params.to_fixed()?;
        crate::num::limits::check_sampler_vocab(vocab)?;
        let seed = params.seed.unwrap_or_else(random_seed);
        Ok(IntSampler {
            params: fixed,
            seed,
            rng: seed,
            counts: vec![0; vocab],
            scratch: Vec::with_capacity(vocab),
            tab: crate::num::fixed::exp2_table(),
        })
    }

    /// The seed: the generator's first state.
    pub(crate) fn seed(&self) -> u64 {
        self.seed
    }

    /// Counts `token` as seen, for the penalties (ids past the vocabulary are ignored).
    pub(crate) fn accept(&mut self, token: u32) {
        if let Some(c) = self.counts.get_mut(token as usize) {
            *c = c.wrapping_add(1);
        }
    }

    /// Draws the next token from the Q16 `logits` (not recorded: see [`IntSampler::accept`]).
    pub(crate) fn sample(&mut self, logits: &[i32]) -> Result<u32> {
        self.scratch.clear();
        self.scratch.extend_from_slice(logits);
        int::sample(
            &self.params,
            &mut self.scratch,
            Some(&self.counts),
            &self.tab,
            &mut self.rng,
        )
    }
}

/// One token of the distribution a [`Sampler`] draws from.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Candidate {
    /// The token id (the index of its logit).
    pub id: u32,
    /// Its logit after the penalties and the temperature.
    pub logit: f64,
    /// Its probability; a [`Sampler::candidates`] list sums to 1.
    pub prob: f64,
}

/// Draws tokens from logits by [`SamplingParams`]; remembers the tokens seen for the penalties.
///
/// # Stages
///
/// The sampler works in llama.cpp's order, each stage on what the previous one kept:
///
/// 1. **penalties** over the tokens seen so far ([`Sampler::accept`]): the repetition penalty
///    `r` divides a seen token's logit by `r` if it is positive and multiplies it by `r` otherwise
///    (Hugging Face's `RepetitionPenaltyLogitsProcessor`, llama.cpp's `penalty_repeat`); then the
///    presence and frequency penalties subtract `presence + count · frequency` from the logit of
///    a token seen `count > 0` times (OpenAI's definition, llama.cpp's `penalty_present` and
///    `penalty_freq`). Each token counts once per occurrence, however often it was seen.
/// 2. **top-k**: the `k` highest logits (ties: the lower id first).
/// 3. **top-p** (nucleus): the softmax of the kept logits at temperature 1, renormalised over
///    what top-k kept; the smallest set of most likely tokens whose probabilities add up to at
///    least `p` (always at least one token).
/// 4. **min-p**: the tokens whose probability is at least `min_p` times the most likely one's
///    (again at temperature 1, which is `logit ≥ max_logit + ln(min_p)`).
/// 5. **temperature**: the kept logits divided by `T`, and their softmax is the distribution
///    drawn from. Top-p and min-p thus see the untempered distribution, as in llama.cpp;
///    temperature only reshapes the set they kept.
/// 6. **draw**: one uniform number from a ChaCha8 generator ([`rand_chacha::ChaCha8Rng`]) seeded
///    with [`SamplingParams::seed`], so a seed fixes the whole sequence of draws. Without a seed
///    one is taken from the operating system (or, failing that, the clock) and reported by
///    [`Sampler::seed`], so any run can be replayed.
///
/// Temperature 0 is greedy decoding: the argmax of the penalised logits (ties: the lowest id),
/// no filter and no random draw.
///
/// This is the f32 reference sampler: [`Model::generate`](crate::Model::generate) and
/// [`Model::generate_in_kernel`](crate::Model::generate_in_kernel) draw with the integer sampler
/// instead (the same stages in Q16 arithmetic with a splitmix64 generator, in BPF and in its Rust
/// twin, so that both paths give the same tokens for a seed; docs/sampling.md), whose
/// distribution agrees with this one's to a total variation of a few 10^-6. Use this one for
/// logits from elsewhere, such as the f32 [`Reference`](crate::Reference).
///
///
/// ```
/// use qwen_bpf::{Sampler, SamplingParams};
/// let mut s = Sampler::new(&SamplingParams::new(1.0).with_top_k(2).with_seed(1))?;
/// let logits = [0.0, 3.0, 1.0, 2.9];
/// let id = s.sample(&logits)?;
/// assert!(id == 1 || id == 3);
/// s.accept(id); // count it for the penalties
/// # Ok::<(), qwen_bpf::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    rng: ChaCha8Rng,
    /// How often each token was seen (accepted).
    counts: HashMap<u32, u32>,
}

impl Sampler {
    /// A sampler for `params`, which are [validated](SamplingParams::validate) first. Its random
    /// generator is seeded with `params.seed`, or with a seed from the operating system.
    pub fn new(params: &SamplingParams) -> Result<Sampler> {
        params.validate()?;
        let seed = params.seed.unwrap_or_else(random_seed);
        Ok(Sampler {
            params: params.clone(),
            seed,
            rng: ChaCha8Rng::seed_from_u64(seed),
            counts: HashMap::new(),
        })
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The seed in use: [`SamplingParams::seed`], or the one drawn when it is `None` (pass it
    /// back as the seed to replay a run).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Records `token` as seen, for the penalties. [`Sampler::sample`] does not record what it
    /// draws: accept each token that is actually used (prompt tokens included, if they are to be
    /// penalised too, as [`Model::generate`](crate::Model::generate) does).
    pub fn accept(&mut self, token: u32) {
        *self.counts.entry(token).or_insert(0) += 1;
    }

    /// [`Sampler::accept`]s every token of `tokens`.
    pub fn accept_all(&mut self, tokens: &[u32]) {
        for &t in tokens {
            self.accept(t);
        }
    }

    /// Forgets the tokens seen.
    pub fn clear_history(&mut self) {
        self.counts.clear();
    }

    /// How often `token` was accepted.
    pub fn seen(&self, token: u32) -> u32 {
        self.counts.get(&token).copied().unwrap_or(0)
    }

    /// Applies the repetition, presence and frequency penalties to `logits` in place (stage 1;
    /// a no-op when they are off). Tokens seen beyond `logits.len()` are ignored.
    pub fn apply_penalties(&self, logits: &mut [f32]) {
        let p = &self.params;
        if !p.has_penalties() {
            return;
        }
        let (rep, pres, freq) = (
            p.repetition_penalty,
            p.presence_penalty,
            p.frequency_penalty,
        );
        for (&id, &count) in &self.counts {
            let Some(l) = logits.get_mut(id as usize) else {
                continue;
            };
            if count == 0 {
                continue;
            }
            if rep != 1.0 {
                *l = if *l > 0.0 { *l / rep } else { *l * rep };
            }
            *l -= count as f32 * freq + pres;
        }
    }

    /// The distribution [`Sampler::sample`] draws from for `logits` (stages 1-5), most likely
    /// first (ties: the lower id first). At temperature 0 it is the one greedy token with
    /// probability 1. Empty logits, or any NaN or +∞ logit, are [`Error::Invalid`].
    pub fn candidates(&self, logits: &[f32]) -> Result<Vec<Candidate>> {
        let mut c = self.distribution(logits)?;
        c.sort_unstable_by(|a, b| b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id)));
        Ok(c)
    }

    /// Draws the next token from `logits` (stages 1-6; at temperature 0 the argmax, without a
    /// draw). The token is not recorded: see [`Sampler::accept`]. Errors as
    /// [`Sampler::candidates`].
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32> {
        let cands = self.distribution(logits)?;
        if self.params.is_greedy() {
            return Ok(cands[0].id);
        }
        let u: f64 = self.rng.random();
        let mut cum = 0.0;
        for c in &cands {
            cum += c.prob;
            if u < cum {
                return Ok(c.id);
            }
        }
        // Rounding left the total just below u: the last candidate.
        Ok(cands[cands.len() - 1].id)
    }

    /// Stages 1-5 in no particular order (sorting the whole vocabulary only when top-p needs
    /// it), deterministic for given logits and history. Never empty.
    fn distribution(&self, logits: &[f32]) -> Result<Vec<Candidate>> {
        let kept = self.filtered(logits)?;
        if self.params.is_greedy() {
            return Ok(vec![Candidate {
                id: kept[0].0,
                logit: kept[0].1.into(),
                prob: 1.0,
            }]);
        }
        let t = f64::from(self.params.temperature);
        let scaled: Vec<f64> = kept.iter().map(|&(_, l)| f64::from(l) / t).collect();
        let probs = softmax(&scaled);
        Ok(kept
            .iter()
            .zip(scaled.iter().zip(probs))
            .map(|(&(id, _), (&logit, prob))| Candidate { id, logit, prob })
            .collect())
    }

    /// Stages 1-4: the kept (id, penalised logit) pairs; at temperature 0 only the argmax.
    /// Never empty.
    fn filtered(&self, logits: &[f32]) -> Result<Vec<(u32, f32)>> {
        if logits.is_empty() {
            return Err(Error::Invalid(
                "sampling from an empty logits vector".into(),
            ));
        }
        if let Some((i, &l)) = logits
            .iter()
            .enumerate()
            .find(|&(_, l)| l.is_nan() || *l == f32::INFINITY)
        {
            return Err(Error::Invalid(format!(
                "sampling: logit {i} is {l}; logits must be finite (or -inf)"
            )));
        }
        let mut pen = logits.to_vec();
        self.apply_penalties(&mut pen);
        let p = &self.params;
        // Highest logit first; ties: the lower id first.
        let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let mut c: Vec<(u32, f32)> = pen
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        if p.is_greedy() {
            let best = c.into_iter().min_by(order).expect("logits are non-empty");
            return Ok(vec![best]);
        }
        // 2. top-k (the k best, in no particular order)
        if p.top_k > 0 && p.top_k < c.len() {
            c.select_nth_unstable_by(p.top_k - 1, order);
            c.truncate(p.top_k);
        }
        // Tokens masked to -inf have probability 0: never candidates.
        c.retain(|x| x.1 > f32::NEG_INFINITY);
        if c.is_empty() {
            return Err(Error::Invalid(
                "sampling: every logit is -inf, nothing to draw".into(),
            ));
        }
        // 3. top-p, at temperature 1 over what top-k kept
        if p.top_p < 1.0 {
            c.sort_unstable_by(order);
            let logits: Vec<f64> = c.iter().map(|x| f64::from(x.1)).collect();
            let mut cum = 0.0;
            let mut keep = c.len();
            for (i, q) in softmax(&logits).into_iter().enumerate() {
                cum += q;
                if cum >= f64::from(p.top_p) {
                    keep = i + 1;
                    break;
                }
            }
            c.truncate(keep);
        }
        // 4. min-p: p_i / p_max = exp(l_i - l_max) ≥ min_p (the best always stays: min_p ≤ 1)
        if p.min_p > 0.0 {
            let max = c
                .iter()
                .map(|x| f64::from(x.1))
                .fold(f64::NEG_INFINITY, f64::max);
            let min_p = f64::from(p.min_p);
            c.retain(|x| (f64::from(x.1) - max).exp() >= min_p);
        }
        Ok(c)
    }
}

/// The softmax of `logits` (the first need not be the largest).
fn softmax(logits: &[f64]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let exp: Vec<f64> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f64 = exp.iter().sum();
    exp.into_iter().map(|e| e / sum).collect()
}

/// A seed from the operating system's random source, or from the clock and process id if that
/// fails.
pub(crate) fn random_seed() -> u64 {
    rand::rngs::OsRng.try_next_u64().unwrap_or_else(|_| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        nanos ^ (u64::from(std::process::id()) << 32)
    })
}
