//! What a mixture of experts' verification costs beyond a dense model's: the experts it reads.
//!
//! Why it exists: a step reads the experts its one token chose; a verification of w tokens reads
//! the union of what its rows chose, once each. That union grows with w by how far the rows'
//! choices differ, which depends on the text (consecutive tokens of real text share experts;
//! uniform random routing, the worst case, shares few), not on w alone, so a dense width curve
//! timed at start-up misprices every width live rounds have not run lately. Here a forward's
//! price is split in two: the rest of the forward (measured per width, as for a dense model)
//! and `per_expert` seconds for each expert weight read, times the distinct experts a forward
//! of w rows is expected to read, learned per routed layer from recent forwards. Pure
//! arithmetic.

/// A routed layer's union of experts as its rows are added: each further row brings
/// `used · share · (1 − read/count)` experts not read yet, in expectation. `share` = 1 is
/// uniform independent routing; 0 is every row choosing what the first chose. The union of
/// `w` rows is then `count · (1 − (1 − used/count) · (1 − used·share/count)^(w−1))`, which
/// this inverts to learn `share` from a forward's width and reads.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
struct LayerShare {
    share: f64,
    /// Learned from live forwards (start-up's forwards run made-up text: replaced by the
    /// first live one).
    live: bool,
}

/// How much of a forward's new rows' expert choices a new row adds, learned with this weight
/// on the latest forward: a few rounds follow a change of text.
const LEARNING_RATE: f64 = 0.25;

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ExpertPrices {
    /// Experts per layer, and how many each row uses.
    count: usize,
    used: usize,
    /// Seconds to read one expert's weights once in a forward (its rows' arithmetic is in the
    /// rest of the forward: every row computes `used` experts whatever the union).
    per_expert: f64,
    layers: Vec<LayerShare>,
}

impl ExpertPrices {
    /// A mixture of `layers` routed layers, each of `count` experts of which a row uses `used`,
    /// routing taken as uniform until forwards are recorded.
    pub fn new(count: usize, used: usize, layers: usize) -> Self {
        Self {
            count: count.max(1),
            used: used.clamp(1, count.max(1)),
            per_expert: 0.0,
            layers: vec![
                LayerShare {
                    share: 1.0,
                    live: false,
                };
                layers
            ],
        }
    }

    /// The price of one expert read, from two forwards of the same width that read `reads`
    /// experts in all (most and fewest) in `seconds`: what the extra experts cost. Nothing
    /// (dense pricing) when the two read about as many, or noise made the larger cheaper.
    pub fn set_per_expert(&mut self, many: (usize, f64), few: (usize, f64)) {
        let extra = many.0.saturating_sub(few.0);
        self.per_expert = if extra >= self.layers.len().max(1) {
            ((many.1 - few.1) / extra as f64).max(0.0)
        } else {
            0.0
        };
    }

    pub fn per_expert(&self) -> f64 {
        self.per_expert
    }

    /// A forward of `width` rows that read `reads[l]` distinct experts in routed layer `l`.
    /// `live`: a forward of the engine's rounds (else start-up's, kept until a live one).
    pub fn record(&mut self, width: usize, reads: &[u16], live: bool) {
        if width < 2 {
            return;
        }
        for (layer, &r) in self.layers.iter_mut().zip(reads) {
            let seen = share_of(self.count, self.used, width, r as usize);
            if live && layer.live {
                layer.share += LEARNING_RATE * (seen - layer.share);
            } else if live || !layer.live {
                layer.share = seen;
                layer.live = live;
            }
        }
    }

    /// Distinct expert reads a forward of `width` rows is expected to make, all layers.
    pub fn expected_reads(&self, width: usize) -> f64 {
        if width == 0 {
            return 0.0;
        }
        let (n, k) = (self.count as f64, self.used as f64);
        self.layers
            .iter()
            .map(|l| {
                let grow = (1.0 - k * l.share / n).max(0.0);
                n * (1.0 - (1.0 - k / n) * grow.powi(width as i32 - 1))
            })
            .sum()
    }

    /// Seconds of expert reads a forward of `width` rows is expected to cost.
    pub fn seconds(&self, width: usize) -> f64 {
        self.per_expert * self.expected_reads(width)
    }

    /// Seconds of the expert reads a forward actually made.
    pub fn seconds_of(&self, reads: &[u16]) -> f64 {
        self.per_expert * reads.iter().map(|&r| r as f64).sum::<f64>()
    }
}

/// The share (see [`LayerShare`]) under which `width` rows' union is `reads` experts. A layer
/// that read every expert is taken at half an expert short of all: the least share that
/// explains it, not the largest.
fn share_of(count: usize, used: usize, width: usize, reads: usize) -> f64 {
    if used >= count {
        return 1.0;
    }
    let (n, k) = (count as f64, used as f64);
    let reads = (reads as f64).min(n - 0.5);
    let left = ((1.0 - reads / n) / (1.0 - k / n)).clamp(0.0, 1.0);
    let grow = left.powf(1.0 / (width - 1) as f64);
    (n / k * (1.0 - grow)).clamp(0.0, n / k)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The union of `w` rows drawn uniformly, `k` of `n` each, exactly.
    fn uniform_union(n: f64, k: f64, w: usize) -> f64 {
        n * (1.0 - (1.0 - k / n).powi(w as i32))
    }

    #[test]
    fn uniform_routing_is_share_one_and_its_union_is_the_textbook_one() {
        let p = ExpertPrices::new(128, 8, 1);
        for w in 1..=9 {
            let want = uniform_union(128.0, 8.0, w);
            assert!((p.expected_reads(w) - want).abs() < 1e-9, "w={w}");
        }
        let share = share_of(128, 8, 5, uniform_union(128.0, 8.0, 5).round() as usize);
        assert!((share - 1.0).abs() < 0.02, "{share}");
    }

    #[test]
    fn rows_that_choose_alike_are_learned_and_priced_cheaper() {
        let mut p = ExpertPrices::new(128, 8, 2);
        p.set_per_expert((300, 0.030), (100, 0.010));
        assert!((p.per_expert() - 1e-4).abs() < 1e-12);
        let uniform = p.seconds(5);
        // Start-up's made-up text reads nearly uniformly; live rounds of real text share: 5
        // rows reading 12 experts a layer, not ~35.
        p.record(5, &[35, 35], false);
        p.record(5, &[12, 12], true);
        assert!(
            (p.expected_reads(5) - 24.0).abs() < 1e-6,
            "{}",
            p.expected_reads(5)
        );
        assert!(p.seconds(5) < uniform * 0.8);
        // A step reads its row's experts whatever the text.
        assert!((p.expected_reads(1) - 16.0).abs() < 1e-9);
        // Widths not run are priced by the same share: between a step and uniform routing.
        let w9 = p.expected_reads(9);
        assert!(w9 > p.expected_reads(5) && w9 < 2.0 * uniform_union(128.0, 8.0, 9));
        // Start-up forwards no longer move a layer once a live one was recorded.
        p.record(5, &[35, 35], false);
        assert!((p.expected_reads(5) - 24.0).abs() < 1e-6);
        // Live forwards move it a step at a time.
        p.record(5, &[35, 35], true);
        let moved = p.expected_reads(5);
        assert!(moved > 24.0 && moved < 70.0, "{moved}");
    }

    #[test]
    fn every_row_choosing_the_same_experts_is_share_zero() {
        assert_eq!(share_of(128, 8, 9, 8), 0.0);
        let mut p = ExpertPrices::new(64, 4, 1);
        p.record(6, &[4], true);
        assert!((p.expected_reads(6) - 4.0).abs() < 1e-9);
    }

    #[test]
    fn a_saturated_layer_reads_every_expert_at_any_width_past_it() {
        // Mixtral: 2 of 8. Five rows reading all 8.
        let mut p = ExpertPrices::new(8, 2, 1);
        p.record(5, &[8], true);
        assert!((p.expected_reads(5) - 7.5).abs() < 1e-9);
        assert!(p.expected_reads(9) <= 8.0 + 1e-9);
        assert!((p.expected_reads(1) - 2.0).abs() < 1e-9);
        // Every expert used by every row: nothing to learn, always all.
        let all = ExpertPrices::new(4, 4, 3);
        assert!((all.expected_reads(7) - 12.0).abs() < 1e-9);
    }

    #[test]
    fn per_expert_price_needs_a_real_difference_and_is_never_negative() {
        let mut p = ExpertPrices::new(128, 8, 4);
        p.set_per_expert((100, 0.010), (98, 0.005));
        assert_eq!(p.per_expert(), 0.0, "two extra reads over 4 layers: noise");
        p.set_per_expert((200, 0.010), (32, 0.012));
        assert_eq!(p.per_expert(), 0.0, "the larger read cheaper: noise");
        p.set_per_expert((200, 0.012), (32, 0.010));
        assert!((p.seconds_of(&[10, 10]) - 20.0 * 0.002 / 168.0).abs() < 1e-12);
    }
}
