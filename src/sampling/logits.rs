//! The logits pipeline: a request's sampling settings and their ranges, then logit bias and
//! penalties on raw logits, temperature, softmax, top-k, top-p and min-p, and the draw.
//!
//! Why it exists: plain decoding, the draft model and the verifier all turn logits into a token
//! through these same functions, so a speculative round compares like with like.

use super::row_scan::{first_invalid, first_max, max_value};
use super::{SamplingError, SeededRng};

/// OpenAI's range for `presence_penalty` and `frequency_penalty`. Within it a penalised logit
/// stays finite however often a token repeats (the context bounds the count).
pub const PENALTY_RANGE: std::ops::RangeInclusive<f32> = -2.0..=2.0;
/// The multiplicative repetition penalty's range: wide enough for any use (1.0-1.5 is usual),
/// narrow enough that dividing or multiplying a logit by it cannot overflow.
pub const REPETITION_PENALTY_RANGE: std::ops::RangeInclusive<f32> = 0.01..=100.0;
/// OpenAI's range for `logit_bias` values.
pub const LOGIT_BIAS_RANGE: std::ops::RangeInclusive<f32> = -100.0..=100.0;

/// A request's sampling settings.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1 disables.
    pub top_p: f32,
    /// 0 disables.
    pub min_p: f32,
    /// HF-style multiplicative penalty on tokens already seen; 1 disables.
    pub repetition_penalty: f32,
    /// OpenAI-style additive penalties on generated tokens; 0 disables.
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: None,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self::default()
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    pub fn validate(&self) -> Result<(), SamplingError> {
        let bad = |name, reason: &str| {
            Err(SamplingError::InvalidParam {
                name,
                reason: reason.into(),
            })
        };
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad("temperature", "must be a finite number >= 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", "must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", "must be in [0, 1]");
        }
        if !REPETITION_PENALTY_RANGE.contains(&self.repetition_penalty) {
            return bad(
                "repetition_penalty",
                &format!(
                    "must be in [{}, {}], got {}",
                    REPETITION_PENALTY_RANGE.start(),
                    REPETITION_PENALTY_RANGE.end(),
                    self.repetition_penalty
                ),
            );
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !PENALTY_RANGE.contains(&v) {
                return bad(
                    name,
                    &format!(
                        "must be in [{}, {}], got {v}",
                        PENALTY_RANGE.start(),
                        PENALTY_RANGE.end()
                    ),
                );
            }
        }
        for &(_, bias) in &self.logit_bias {
            if !LOGIT_BIAS_RANGE.contains(&bias) {
                return bad(
                    "logit_bias",
                    &format!("values must be in [-100, 100], got {bias}"),
                );
            }
        }
        Ok(())
    }

    /// Whether the request changes the model's logits before sampling (bias or penalties).
    pub fn modifies_logits(&self) -> bool {
        !self.logit_bias.is_empty() || self.has_penalties()
    }

    fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }
}

/// Applies logit bias and penalties in place. `history` is every token the repetition penalty
/// looks at (prompt and output); `generated` is the output alone (presence/frequency, as OpenAI
/// defines them).
pub fn apply_penalties(
    logits: &mut [f32],
    params: &SamplingParams,
    history: &[u32],
    generated: &[u32],
) {
    for &(tok, bias) in &params.logit_bias {
        if let Some(l) = logits.get_mut(tok as usize) {
            *l += bias;
        }
    }
    if !params.has_penalties() {
        return;
    }
    if params.repetition_penalty != 1.0 {
        let mut seen = history.to_vec();
        seen.sort_unstable();
        seen.dedup();
        for tok in seen {
            if let Some(l) = logits.get_mut(tok as usize) {
                *l = if *l > 0.0 {
                    *l / params.repetition_penalty
                } else {
                    *l * params.repetition_penalty
                };
            }
        }
    }
    if params.presence_penalty != 0.0 || params.frequency_penalty != 0.0 {
        let mut counts = generated.to_vec();
        counts.sort_unstable();
        for run in counts.chunk_by(|a, b| a == b) {
            if let Some(l) = logits.get_mut(run[0] as usize) {
                *l -= params.presence_penalty + params.frequency_penalty * run.len() as f32;
            }
        }
    }
}

/// Index of the largest logit (the lowest index among ties, so greedy is deterministic).
pub fn argmax(logits: &[f32]) -> Result<u32, SamplingError> {
    if let Some(i) = first_invalid(logits) {
        return Err(SamplingError::InvalidLogits(i));
    }
    match first_max(logits) {
        Some((i, v)) if v != f32::NEG_INFINITY => Ok(i as u32),
        _ => Err(SamplingError::Empty),
    }
}

/// Turns (already penalised) logits into the sampling distribution in `probs`: temperature,
/// softmax, then top-k, top-p and min-p masks, renormalised. Tokens masked out get exactly 0.
pub fn probabilities(
    logits: &[f32],
    params: &SamplingParams,
    probs: &mut Vec<f32>,
) -> Result<(), SamplingError> {
    probs.clear();
    let t = if params.temperature > 0.0 {
        params.temperature
    } else {
        1.0
    };
    if let Some(i) = first_invalid(logits) {
        return Err(SamplingError::InvalidLogits(i));
    }
    let max = max_value(logits);
    if max == f32::NEG_INFINITY {
        return Err(SamplingError::Empty);
    }
    // Every argument is at most 0; a masked token (-inf) gets exactly 0.
    crate::model::kernels::elementwise::softmax_numerators(logits, max, t, probs);
    let vocab = probs.len();
    let k = if params.top_k == 0 {
        vocab
    } else {
        params.top_k.min(vocab)
    };
    if k < vocab || params.top_p < 1.0 {
        let (order, total) = ranked_candidates(probs, k, params.top_p);
        let mut keep = order.len();
        if params.top_p < 1.0 {
            let mut cum = 0f64;
            for (n, &i) in order.iter().enumerate() {
                cum += probs[i as usize] as f64;
                if cum >= params.top_p as f64 * total {
                    keep = n + 1;
                    break;
                }
            }
        }
        let mut mask = vec![false; vocab];
        for &i in &order[..keep] {
            mask[i as usize] = true;
        }
        for (p, m) in probs.iter_mut().zip(mask) {
            if !m {
                *p = 0.0;
            }
        }
    }
    if params.min_p > 0.0 {
        let top = probs.iter().copied().fold(0f32, f32::max);
        let floor = params.min_p * top;
        for p in probs.iter_mut() {
            if *p < floor {
                *p = 0.0;
            }
        }
    }
    let inv = (1.0 / sum_f64(probs)) as f32;
    for p in probs.iter_mut() {
        *p *= inv;
    }
    Ok(())
}

/// The sum of `xs` in f64, over eight running sums (so it vectorizes; the order is fixed, so
/// the bits are too).
/// The tokens top-k and top-p may keep, most probable first (the lower index first among
/// equals), and the mass top-p takes its share of: every top-k candidate's, or the whole row's.
///
/// Without top-k, top-p keeps the fewest most probable tokens holding its share: a few dozen
/// of Gemma 3's 262,144 tokens, whose full sort cost about 25 ms a row, two target steps. So
/// only the tokens at or above a floor are sorted, the floor lowered sixteenfold until they
/// hold the share with room to spare (each try one pass over the row). Every token above the
/// floor comes before every token below it in the full order, so these are the sorted row's
/// first tokens, and top-p's cut falls among them.
fn ranked_candidates(probs: &[f32], k: usize, top_p: f32) -> (Vec<u32>, f64) {
    let cmp = |a: &u32, b: &u32| {
        probs[*b as usize]
            .total_cmp(&probs[*a as usize])
            .then(a.cmp(b))
    };
    if k < probs.len() {
        let mut order: Vec<u32> = (0..probs.len() as u32).collect();
        order.select_nth_unstable_by(k - 1, cmp);
        order.truncate(k);
        order.sort_unstable_by(cmp);
        let total = order.iter().map(|&i| f64::from(probs[i as usize])).sum();
        return (order, total);
    }
    let total = sum_f64(probs);
    // The margin keeps the cut inside the candidates whatever order their sum is taken in.
    let want = f64::from(top_p) * total * (1.0 + 1e-9);
    let mut floor = max_value(probs);
    let mut order = Vec::new();
    loop {
        floor /= 16.0;
        order.clear();
        let mut mass = 0f64;
        for (i, &p) in probs.iter().enumerate() {
            if p >= floor {
                order.push(i as u32);
                mass += f64::from(p);
            }
        }
        if mass >= want || floor == 0.0 {
            break;
        }
    }
    order.sort_unstable_by(cmp);
    (order, total)
}

fn sum_f64(xs: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    let chunks = xs.chunks_exact(8);
    let tail: f64 = chunks.remainder().iter().map(|&x| f64::from(x)).sum();
    for c in chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l += f64::from(x);
        }
    }
    lanes.iter().sum::<f64>() + tail
}

/// Inverse-CDF draw from a normalised distribution with `u` uniform in `[0, 1)`. Never returns
/// a zero-probability token.
pub fn sample_from(probs: &[f32], u: f64) -> u32 {
    let total = sum_f64(probs);
    let target = u * total;
    let mut cum = 0f64;
    let mut last_nonzero = 0;
    for (i, &p) in probs.iter().enumerate() {
        if p > 0.0 {
            cum += p as f64;
            last_nonzero = i;
            if cum > target {
                return i as u32;
            }
        }
    }
    last_nonzero as u32
}

/// Reusable scratch for picking tokens without reallocating per step.
#[derive(Default)]
pub struct Sampler {
    logits: Vec<f32>,
    probs: Vec<f32>,
}

impl Sampler {
    /// Picks the next token from one logits row under `params`.
    pub fn pick(
        &mut self,
        logits: &[f32],
        params: &SamplingParams,
        history: &[u32],
        generated: &[u32],
        rng: &mut SeededRng,
    ) -> Result<u32, SamplingError> {
        self.logits.clear();
        self.logits.extend_from_slice(logits);
        apply_penalties(&mut self.logits, params, history, generated);
        if params.is_greedy() {
            return argmax(&self.logits);
        }
        probabilities(&self.logits, params, &mut self.probs)?;
        Ok(sample_from(&self.probs, rng.next_f64()))
    }
}
