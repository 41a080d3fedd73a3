//! How a sampled request's drafts are proposed: drawn from the drafter's distribution `q`, or
//! its likeliest token proposed as a point mass, and what each would have kept at a verified
//! position.
//!
//! Why it exists: under sampling, a draft drawn from `q` stands with probability
//! `Σ_x min(q(x), p(x)/l)`, which is 1 only where `q = p`. A drafter that knows the target's
//! likeliest token but spreads its own mass differently (a smaller model, another family, a
//! head) loses drafts to its own draws: at temperature 0.8, SmolLM2's sampled drafts for
//! Gemma 3 stood 41% of the time. Proposing the drafter's likeliest token `x` instead is a
//! point mass `q = δ(x)`: it stands with probability `min(1, p(x)/l)`, and at `l = 1` a
//! rejection draws the correction from `norm(max(0, p − δ(x)))`, which is `p` without `x`,
//! renormalized. So the round's token is `x` with probability `p(x)` and `y ≠ x` with
//! `(1 − p(x)) · p(y) / (1 − p(x)) = p(y)`: exactly the target's distribution, as for prompt
//! lookup's copies, because the proposal depends only on the context, never on the round's
//! random draws. Neither proposal is better everywhere (a drafter with `q = p` keeps every
//! sampled draft but only `max p` of its likeliest), so both are measured on the same
//! positions and the better is used.

use super::row_scan::first_max;
use super::Lenience;

/// How a sampled request's drafter proposes its drafts (`speculation.sampled_drafts`; greedy
/// requests always propose the likeliest token).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SampledDrafts {
    /// Whichever the request's verified positions say keeps more drafts (starting from what
    /// earlier requests at its temperature said).
    #[default]
    Auto,
    /// Drawn from the drafter's distribution, processed with the request's settings.
    Sample,
    /// The drafter's likeliest token, proposed as a point mass.
    Likeliest,
}

impl std::str::FromStr for SampledDrafts {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "auto" => Ok(Self::Auto),
            "sample" => Ok(Self::Sample),
            "likeliest" => Ok(Self::Likeliest),
            other => Err(format!("must be auto, sample or likeliest, got `{other}`")),
        }
    }
}

impl std::fmt::Display for SampledDrafts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Sample => "sample",
            Self::Likeliest => "likeliest",
        })
    }
}

/// What the verified positions of a round say about the two proposals: at each position the
/// target verified in the same context whichever proposal was made (the round's first, and
/// every one after a draft that stood), the probability that a draft drawn from `q` would
/// have stood and that `q`'s likeliest token would have. Sums over `rows` positions.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProposalEvidence {
    pub rows: u32,
    /// Σ over the positions of `Σ_x min(q(x), p(x)/l)` (0 where `q` is not known).
    pub sampled: f64,
    /// Rows of `sampled`: a proposal made without a distribution gives none.
    pub sampled_rows: u32,
    /// Σ over the positions of `min(1, p(x)/l)` for `q`'s likeliest token `x`.
    pub likeliest: f64,
}

impl ProposalEvidence {
    /// Adds a position where the drafter's distribution was `q` (over the target's ids).
    pub fn add_distribution(&mut self, q: &[f32], p: &[f32], lenience: Lenience) {
        let l = lenience.get();
        let best = first_max(q).map_or(0, |(i, _)| i);
        self.rows += 1;
        self.sampled_rows += 1;
        self.sampled += f64::from(overlap(q, p, 1.0 / l)).min(1.0);
        self.likeliest += f64::from((p.get(best).copied().unwrap_or(0.0) / l).min(1.0));
    }

    /// Adds a position where the likeliest token `x` was proposed without its distribution.
    pub fn add_point(&mut self, x: u32, p: &[f32], lenience: Lenience) {
        self.rows += 1;
        let px = p.get(x as usize).copied().unwrap_or(0.0);
        self.likeliest += f64::from((px / lenience.get()).min(1.0));
    }
}

/// `Σ_x min(q(x), p(x)·scale)`, in lanes the compiler vectorizes: a row of Gemma 3's 262,144
/// tokens is read once per verified position, beside a forward of about 12 ms.
fn overlap(q: &[f32], p: &[f32], scale: f32) -> f32 {
    const LANES: usize = 16;
    let mut acc = [0.0f32; LANES];
    let (qc, pc) = (q.chunks_exact(LANES), p.chunks_exact(LANES));
    let tail: f32 = qc
        .remainder()
        .iter()
        .zip(pc.remainder())
        .map(|(&a, &b)| a.min(b * scale))
        .sum();
    for (a, b) in qc.zip(pc) {
        for i in 0..LANES {
            acc[i] += a[i].min(b[i] * scale);
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drafter_equal_to_the_target_keeps_every_sampled_draft_and_its_best_token_less() {
        let p = [0.5f32, 0.3, 0.2];
        let mut e = ProposalEvidence::default();
        e.add_distribution(&p, &p, Lenience::EXACT);
        assert!((e.sampled - 1.0).abs() < 1e-6);
        assert!((e.likeliest - 0.5).abs() < 1e-6);
        assert_eq!((e.rows, e.sampled_rows), (1, 1));
    }

    #[test]
    fn a_flat_drafter_that_knows_the_best_token_does_better_proposing_it() {
        let p = [0.9f32, 0.05, 0.05];
        let q = [0.4f32, 0.3, 0.3];
        let mut e = ProposalEvidence::default();
        e.add_distribution(&q, &p, Lenience::EXACT);
        // Σ min(q, p) = 0.4 + 0.05 + 0.05; the likeliest (token 0) stands with p = 0.9.
        assert!((e.sampled - 0.5).abs() < 1e-6);
        assert!((e.likeliest - 0.9).abs() < 1e-6);
        e.add_point(1, &p, Lenience::EXACT);
        assert_eq!((e.rows, e.sampled_rows), (2, 1));
        assert!((e.likeliest - 0.95).abs() < 1e-6);
    }

    #[test]
    fn lenience_raises_both_as_the_rule_does() {
        let p = [0.6f32, 0.4];
        let q = [0.2f32, 0.8];
        let l = Lenience::try_from(0.5).unwrap();
        let mut e = ProposalEvidence::default();
        e.add_distribution(&q, &p, l);
        // min(0.2, 1.2) + min(0.8, 0.8); the likeliest (token 1) min(1, 0.8).
        assert!((e.sampled - 1.0).abs() < 1e-6);
        assert!((e.likeliest - 0.8).abs() < 1e-6);
    }

    #[test]
    fn the_overlap_in_lanes_is_the_plain_sum_at_any_length() {
        for n in [1usize, 15, 16, 37, 1000] {
            let q: Vec<f32> = (0..n).map(|i| ((i * 7) % 11) as f32 / 50.0).collect();
            let p: Vec<f32> = (0..n).map(|i| ((i * 3) % 13) as f32 / 60.0).collect();
            let plain: f32 = q.iter().zip(&p).map(|(&a, &b)| a.min(b * 2.0)).sum();
            assert!(
                (overlap(&q, &p, 2.0) - plain).abs() < 1e-4 * plain.max(1.0),
                "{n}"
            );
        }
    }

    #[test]
    fn the_setting_reads_its_three_names_and_refuses_others() {
        for s in [
            SampledDrafts::Auto,
            SampledDrafts::Sample,
            SampledDrafts::Likeliest,
        ] {
            assert_eq!(s.to_string().parse::<SampledDrafts>(), Ok(s));
        }
        assert!("greedy"
            .parse::<SampledDrafts>()
            .unwrap_err()
            .contains("auto"));
    }
}
