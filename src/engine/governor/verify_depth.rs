//! How a target forward's price grows with the context its rows attend over.
//!
//! Why it exists: a forward's weights cost the same at any depth, but its attention reads
//! every cached key and value once per row group, so a verification's price depends on how
//! deep its sequence is, and not in proportion to a plain step's: an 8-token verification of
//! SmolLM2 costs 2.9x a step at depth 1000 and 3.1x at depth 2000, against about 1.5x near
//! depth 0. Prices taken per width alone carry whatever depth each width last ran at (a
//! 2-token verification measured beside an 800-token prompt cost 1.4 steps, and priced a
//! short request's drafting at that), so the cost model keeps each width's price at one
//! reference depth and adds, for each row of a forward, its width's slope times how far its
//! sequence sits from that depth. The slopes come from start-up forwards timed at a shallow
//! and a deep context.

/// Seconds per context token that each sequence's forward of `width` tokens adds, from the
/// start-up forwards timed at two depths: a straight line over the width, `base + per_width ·
/// width`, fitted to every width timed at both depths.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct VerifyDepth {
    /// The depth the width prices are kept at (where start-up timed them).
    depth: f64,
    base: f64,
    per_width: f64,
}

impl VerifyDepth {
    /// From widths timed at depth `shallow.0` and again at `deep.0`: `(width, seconds)` each.
    /// Each width's growth per context token is a difference of two timings, and one noisy
    /// timing (a step that ran cold, another process's burst) would move its width a lot: a
    /// line through all of them that one width cannot pull is what is kept, never falling
    /// with the width (a wider forward reads at least what a narrower one does). A width timed at one depth
    /// only is left out. `None` without a width timed at both depths, or with the depths out
    /// of order.
    pub fn from_timings(
        shallow: (usize, &[(usize, f64)]),
        deep: (usize, &[(usize, f64)]),
    ) -> Option<Self> {
        if deep.0 <= shallow.0 {
            return None;
        }
        let span = (deep.0 - shallow.0) as f64;
        let points: Vec<(f64, f64)> = shallow
            .1
            .iter()
            .filter_map(|&(w, s0)| {
                let &(_, s1) = deep.1.iter().find(|&&(dw, _)| dw == w)?;
                (w > 0 && s0.is_finite() && s1.is_finite()).then_some((w as f64, (s1 - s0) / span))
            })
            .collect();
        if points.is_empty() {
            return None;
        }
        // Theil-Sen: the median of the slopes between every two widths, then the median
        // intercept under it. Half the widths would have to be off to move it far, where a
        // least-squares line follows one cold timing (a step 5 ms slow made every width's
        // growth 2-3x its own).
        let mut pair_slopes: Vec<f64> = points
            .iter()
            .enumerate()
            .flat_map(|(i, a)| {
                points[i + 1..]
                    .iter()
                    .map(move |b| (b.1 - a.1) / (b.0 - a.0))
            })
            .collect();
        let per_width = median(&mut pair_slopes).unwrap_or(0.0).max(0.0);
        let mut intercepts: Vec<f64> = points.iter().map(|p| p.1 - per_width * p.0).collect();
        let base = median(&mut intercepts).unwrap_or(0.0);
        Some(Self {
            depth: shallow.0 as f64,
            base,
            per_width,
        })
    }

    /// From the widths' prices at depth `shallow.0` (`(width, seconds)`, the prices the cost
    /// model keeps) and forwards timed in pairs, `(width, seconds at shallow.0, seconds at
    /// deep)`, each pair moments apart: a width's deep price is its shallow price times the
    /// median over its pairs of deep over shallow. A shared machine's speed changes from one
    /// second to the next, and a slow spell multiplies both timings of a pair alike: as a ratio
    /// it cancels, where a deep burst timed in a spell after shallow prices timed outside it
    /// reads the spell as growth (a SmolLM2 step's growth from depth 32 to 512 read 0.4-2.4 ms
    /// over fresh starts, against 0.8 ms in back-to-back decoding). A width without a price
    /// takes its pairs' best shallow time. Then as [`VerifyDepth::from_timings`].
    pub fn from_pairs(
        shallow: (usize, &[(usize, f64)]),
        deep: usize,
        pairs: &[(usize, f64, f64)],
    ) -> Option<Self> {
        let mut widths: Vec<usize> = pairs.iter().map(|p| p.0).collect();
        widths.sort_unstable();
        widths.dedup();
        let mut near = Vec::with_capacity(widths.len());
        let mut far = Vec::with_capacity(widths.len());
        for w in widths {
            let own = pairs
                .iter()
                .filter(|p| p.0 == w && p.1 > 0.0 && p.1.is_finite() && p.2.is_finite());
            let priced = shallow.1.iter().find(|p| p.0 == w).map(|p| p.1);
            let best = priced.or_else(|| own.clone().map(|p| p.1).reduce(f64::min));
            let mut ratios: Vec<f64> = own.map(|p| p.2 / p.1).collect();
            if let (Some(best), Some(ratio)) = (best, median(&mut ratios)) {
                near.push((w, best));
                far.push((w, best * ratio));
            }
        }
        Self::from_timings((shallow.0, &near), (deep, &far))
    }

    /// Seconds per context token of one sequence's forward of `width` tokens (never below
    /// nothing).
    pub fn slope(&self, width: usize) -> f64 {
        (self.base + self.per_width * width as f64).max(0.0)
    }

    /// What a forward's `rows` (each sequence's `(new tokens, context tokens before them)`)
    /// cost over the same widths at the reference depth: negative for shallower ones.
    pub fn extra_seconds(&self, rows: impl IntoIterator<Item = (usize, usize)>) -> f64 {
        rows.into_iter()
            .filter(|&(w, _)| w > 0)
            .map(|(w, d)| self.slope(w) * (d as f64 - self.depth))
            .sum()
    }
}

/// The middle of `v` (the mean of the middle two for an even count); `None` when empty.
fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line() -> VerifyDepth {
        VerifyDepth::from_timings(
            (32, &[(1, 1.0), (5, 1.4)]),
            (544, &[(1, 1.512), (5, 3.448)]),
        )
        .unwrap()
    }

    #[test]
    fn slopes_are_read_off_two_depths_along_a_line_over_the_width() {
        let l = line();
        assert!((l.slope(1) - 0.001).abs() < 1e-12);
        assert!((l.slope(5) - 0.004).abs() < 1e-12);
        assert!((l.slope(3) - 0.0025).abs() < 1e-12);
        assert!((l.slope(9) - 0.007).abs() < 1e-12);
    }

    #[test]
    fn each_row_pays_its_own_distance_from_the_reference_depth() {
        let l = line();
        // One 5-token row 1000 tokens deeper than start-up, one 1-token row 32 shallower.
        let extra = l.extra_seconds([(5, 1032), (1, 0), (0, 5000)]);
        assert!((extra - (0.004 * 1000.0 - 0.001 * 32.0)).abs() < 1e-9);
        assert_eq!(l.extra_seconds([(3, 32)]), 0.0);
    }

    #[test]
    fn one_noisy_timing_moves_the_line_little_and_never_makes_width_cheaper() {
        // Nine widths growing 1 µs + 0.5 µs a width per context token; the step's deep
        // timing ran 5 ms slow (a cold cache), as a real start-up's did.
        let truth = |w: usize| 1e-6 + 0.5e-6 * w as f64;
        let shallow: Vec<(usize, f64)> = (1..=9).map(|w| (w, 0.008 + 0.0003 * w as f64)).collect();
        let deep: Vec<(usize, f64)> = shallow
            .iter()
            .map(|&(w, s)| (w, s + truth(w) * 480.0 + if w == 1 { 0.005 } else { 0.0 }))
            .collect();
        let l = VerifyDepth::from_timings((32, &shallow), (512, &deep)).unwrap();
        for w in 1..=9 {
            let off = (l.slope(w) - truth(w)).abs() / truth(w);
            assert!(off < 0.01, "width {w}: {} against {}", l.slope(w), truth(w));
        }
        // Deep forwards that ran faster than shallow ones are noise: no width gets cheaper
        // with depth, and wider ones not cheaper than narrower ones.
        let faster: Vec<(usize, f64)> = shallow
            .iter()
            .map(|&(w, s)| (w, s - 0.001 * w as f64))
            .collect();
        let l = VerifyDepth::from_timings((32, &shallow), (512, &faster)).unwrap();
        assert!((1..=9).all(|w| l.slope(w) == 0.0 || l.slope(w + 1) >= l.slope(w)));
        assert!((1..=9).all(|w| l.slope(w) >= 0.0));
    }

    #[test]
    fn a_slow_spell_over_the_depth_timings_is_not_read_as_growth() {
        // Widths 1-5 cost 3 ms + 0.3 ms a width at depth 32 (the prices kept) and grow 1.7 µs
        // + 0.4 µs a width per context token. The pairs ran in a spell 1.4x-2.2x slow, its
        // speed changing from one round to the next; in one round the deep step alone was
        // preempted (+6 ms).
        let truth = |w: usize| 1.7e-6 + 0.4e-6 * w as f64;
        let near = |w: usize| 0.003 + 0.0003 * w as f64;
        let prices: Vec<(usize, f64)> = (1..=5).map(|w| (w, near(w))).collect();
        let speeds = [1.4, 1.9, 1.5, 2.2, 1.6, 1.5, 1.7, 1.8];
        let mut pairs = Vec::new();
        for (r, &k) in speeds.iter().enumerate() {
            for w in 1..=5 {
                let preempted = if r == 2 && w == 1 { 0.006 } else { 0.0 };
                let deep = (near(w) + truth(w) * 480.0) * k + preempted;
                pairs.push((w, near(w) * k, deep));
            }
        }
        let l = VerifyDepth::from_pairs((32, &prices), 512, &pairs).unwrap();
        for w in 1..=5 {
            let off = (l.slope(w) - truth(w)).abs() / truth(w);
            assert!(off < 0.01, "width {w}: {} against {}", l.slope(w), truth(w));
        }
        // The least deep timing against the prices kept reads the spell as growth.
        let least = |w: usize| {
            let deep = pairs.iter().filter(|p| p.0 == w).map(|p| p.2);
            (w, deep.reduce(f64::min).unwrap())
        };
        let burst: Vec<(usize, f64)> = (1..=5).map(least).collect();
        let read = VerifyDepth::from_timings((32, &prices), (512, &burst)).unwrap();
        assert!(read.slope(1) > 2.0 * truth(1), "{}", read.slope(1));
        // Without prices, a width's best shallow timing stands in (here the spell's, so the
        // growth is read at its speed: 1.4x).
        let l = VerifyDepth::from_pairs((32, &[]), 512, &pairs).unwrap();
        assert!((l.slope(3) / truth(3) - 1.4).abs() < 0.02, "{}", l.slope(3));
        // Unusable pairs are left out; a width with none is not timed.
        let bad = [
            (1, 0.0, 0.004),
            (2, f64::NAN, 0.004),
            (3, 0.003, f64::INFINITY),
        ];
        assert!(VerifyDepth::from_pairs((32, &prices), 512, &bad).is_none());
    }

    #[test]
    fn nothing_is_learned_without_a_width_timed_at_both_depths() {
        assert!(VerifyDepth::from_timings((32, &[(1, 1.0)]), (544, &[(2, 2.0)])).is_none());
        assert!(VerifyDepth::from_timings((544, &[(1, 1.0)]), (32, &[(1, 2.0)])).is_none());
        assert!(VerifyDepth::from_timings((32, &[(1, 1.0)]), (32, &[(1, 2.0)])).is_none());
        // One width alone: its own growth for every width.
        let one = VerifyDepth::from_timings((32, &[(1, 1.0)]), (544, &[(1, 1.512)])).unwrap();
        assert!((one.slope(4) - 0.001).abs() < 1e-12);
    }
}
