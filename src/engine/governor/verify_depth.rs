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

/// Seconds per context token that each sequence's forward of a given width adds, from the
/// start-up forwards timed at two depths: `slopes` by width, ascending.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct VerifyDepth {
    /// The depth the width prices are kept at (where start-up timed them).
    depth: f64,
    slopes: Vec<(usize, f64)>,
}

impl VerifyDepth {
    /// From widths timed at depth `shallow.0` and again at `deep.0`: `(width, seconds)` each.
    /// A width timed at one depth only is left out; a slope never falls below nothing (noise),
    /// nor below a narrower width's (a wider forward reads at least what a narrower one does).
    /// `None` without a width timed at both depths, or with the depths out of order.
    pub fn from_timings(
        shallow: (usize, &[(usize, f64)]),
        deep: (usize, &[(usize, f64)]),
    ) -> Option<Self> {
        if deep.0 <= shallow.0 {
            return None;
        }
        let span = (deep.0 - shallow.0) as f64;
        let mut slopes: Vec<(usize, f64)> = shallow
            .1
            .iter()
            .filter_map(|&(w, s0)| {
                let &(_, s1) = deep.1.iter().find(|&&(dw, _)| dw == w)?;
                (w > 0 && s0.is_finite() && s1.is_finite()).then_some((w, (s1 - s0) / span))
            })
            .collect();
        slopes.sort_by_key(|&(w, _)| w);
        slopes.dedup_by_key(|&mut (w, _)| w);
        let mut floor = 0.0_f64;
        for (_, s) in slopes.iter_mut() {
            floor = floor.max(*s);
            *s = floor;
        }
        (!slopes.is_empty()).then_some(Self {
            depth: shallow.0 as f64,
            slopes,
        })
    }

    /// Seconds per context token of one sequence's forward of `width` tokens: measured,
    /// interpolated between the nearest timed widths, as the narrowest one's below it, and in
    /// proportion to the widest one's past it.
    pub fn slope(&self, width: usize) -> f64 {
        let Some(&(last_w, last)) = self.slopes.last() else {
            return 0.0;
        };
        if width >= last_w {
            return last * width as f64 / last_w as f64;
        }
        let above = self.slopes.iter().position(|&(w, _)| w >= width);
        match above {
            Some(0) | None => self.slopes[0].1,
            Some(i) => {
                let (w0, s0) = self.slopes[i - 1];
                let (w1, s1) = self.slopes[i];
                s0 + (s1 - s0) * (width - w0) as f64 / (w1 - w0) as f64
            }
        }
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
    fn slopes_are_read_off_two_depths_and_interpolated_between_widths() {
        let l = line();
        assert!((l.slope(1) - 0.001).abs() < 1e-12);
        assert!((l.slope(5) - 0.004).abs() < 1e-12);
        assert!((l.slope(3) - 0.0025).abs() < 1e-12);
        // Past the widest timed width, in proportion to it.
        assert!((l.slope(10) - 0.008).abs() < 1e-12);
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
    fn noise_never_makes_depth_cheaper_or_a_wider_row_cheaper_than_a_narrower() {
        let l = VerifyDepth::from_timings(
            (32, &[(1, 1.0), (2, 1.2), (4, 1.3)]),
            (544, &[(1, 0.9), (2, 1.712), (4, 1.5)]),
        )
        .unwrap();
        assert_eq!(l.slope(1), 0.0);
        assert!((l.slope(2) - 0.001).abs() < 1e-12);
        assert!((l.slope(4) - 0.001).abs() < 1e-12);
    }

    #[test]
    fn nothing_is_learned_without_a_width_timed_at_both_depths() {
        assert!(VerifyDepth::from_timings((32, &[(1, 1.0)]), (544, &[(2, 2.0)])).is_none());
        assert!(VerifyDepth::from_timings((544, &[(1, 1.0)]), (32, &[(1, 2.0)])).is_none());
        assert!(VerifyDepth::from_timings((32, &[(1, 1.0)]), (32, &[(1, 2.0)])).is_none());
    }
}
