//! A mixture of experts' router as pure logic: from one token's router logits, the experts it
//! reads and their weights. The choice depends on that row's logits alone (ties go to the lower
//! index), so a token routes alike whether it is decoded alone or verified among a draft's
//! tokens.

/// One token's choice: an expert and the weight its output is added with.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Choice {
    pub expert: u32,
    pub weight: f32,
}

/// Writes the `out.len()` experts with the largest logits into `out`, in descending order of
/// logit (equal logits: the lower index first), weighted by their softmax probabilities over
/// all experts; divided by the chosen ones' sum when `renormalize` (Mixtral, Qwen3-MoE).
pub fn route(logits: &[f32], renormalize: bool, out: &mut [Choice]) {
    let k = out.len();
    debug_assert!(k >= 1 && k <= logits.len());
    let mut filled = 0;
    for (e, &l) in logits.iter().enumerate() {
        // Insertion into the kept top-k: strictly greater moves ahead, so ties keep index order.
        let mut at = filled;
        while at > 0 && l > logits[out[at - 1].expert as usize] {
            at -= 1;
        }
        if at >= k {
            continue;
        }
        let end = filled.min(k - 1);
        out.copy_within(at..end, at + 1);
        out[at] = Choice {
            expert: e as u32,
            weight: 0.0,
        };
        filled = (filled + 1).min(k);
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let total: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    for c in out.iter_mut() {
        c.weight = (logits[c.expert as usize] - max).exp() / total;
    }
    if renormalize {
        let chosen: f32 = out.iter().map(|c| c.weight).sum();
        for c in out.iter_mut() {
            c.weight /= chosen;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chosen(logits: &[f32], k: usize, renormalize: bool) -> Vec<Choice> {
        let mut out = vec![Choice::default(); k];
        route(logits, renormalize, &mut out);
        out
    }

    #[test]
    fn the_largest_logits_are_chosen_in_order() {
        let c = chosen(&[0.1, 2.0, -1.0, 3.0, 0.5], 3, false);
        let experts: Vec<u32> = c.iter().map(|c| c.expert).collect();
        assert_eq!(experts, vec![3, 1, 4]);
    }

    #[test]
    fn ties_go_to_the_lower_index() {
        let c = chosen(&[1.0, 2.0, 2.0, 2.0, 0.0], 2, false);
        assert_eq!((c[0].expert, c[1].expert), (1, 2));
        let c = chosen(&[5.0, 5.0, 5.0], 3, false);
        assert_eq!(
            c.iter().map(|c| c.expert).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
    }

    #[test]
    fn weights_are_softmax_probabilities_renormalized_or_not() {
        let logits = [0.0f32, 1.0, 2.0, 3.0];
        let z: f32 = logits.iter().map(|l| (l - 3.0f32).exp()).sum();
        let c = chosen(&logits, 2, false);
        assert!((c[0].weight - 1.0 / z).abs() < 1e-6);
        assert!((c[1].weight - (-1.0f32).exp() / z).abs() < 1e-6);
        let c = chosen(&logits, 2, true);
        assert!((c[0].weight + c[1].weight - 1.0).abs() < 1e-6);
        assert!((c[0].weight / c[1].weight - 1f32.exp()).abs() < 1e-4);
    }

    #[test]
    fn every_expert_chosen_when_k_is_the_count() {
        let c = chosen(&[-3.0, 7.0, 0.0], 3, true);
        assert_eq!(
            c.iter().map(|c| c.expert).collect::<Vec<_>>(),
            vec![1, 2, 0]
        );
        assert!((c.iter().map(|c| c.weight).sum::<f32>() - 1.0).abs() < 1e-6);
    }
}
