//! Log-probabilities reported to clients (OpenAI's `logprobs` / `top_logprobs`).
//!
//! Why it exists: the number a client gets must be the same whichever path produced the token
//! (a plain step, a verified draft, a bonus token), so it is computed in one place, from the
//! logits after the request's logit bias and penalties (the processors that change logits),
//! before temperature and top-k/top-p/min-p: a greedy request then still gets the model's
//! distribution rather than a point mass. Pure, so it is unit-tested on its own.

/// One position's log-probability of the token there, and the most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    /// The `n` most likely tokens, most likely first (ties: lower id first).
    pub top: Vec<(u32, f32)>,
}

/// `log_softmax(logits)[token]` and the `top_n` largest entries, accumulated in f64.
pub fn token_logprob(logits: &[f32], token: u32, top_n: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_norm = if max.is_finite() {
        let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
        f64::from(max) + sum.ln()
    } else {
        // Every logit masked: nothing has probability; report -inf throughout.
        f64::INFINITY
    };
    let logprob = |l: f32| (f64::from(l) - log_norm) as f32;
    TokenLogprob {
        token,
        logprob: logits
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&l| logprob(l)),
        top: top_entries(logits, top_n)
            .into_iter()
            .map(|(id, l)| (id, logprob(l)))
            .collect(),
    }
}

/// The `n` largest logits with their ids, largest first, ties by lower id.
fn top_entries(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return top;
    }
    for (id, &l) in logits.iter().enumerate() {
        if top.len() == n && l.partial_cmp(&top[n - 1].1) != Some(std::cmp::Ordering::Greater) {
            continue;
        }
        // After every entry at least as large: equal logits keep the lower id first.
        let at = top.partition_point(|&(_, t)| t >= l);
        top.insert(at, (id as u32, l));
        top.truncate(n);
    }
    top
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_the_log_softmax_and_sum_to_one() {
        let logits = [1.0f32, 3.0, -2.0, 3.0, 0.5];
        let lp = token_logprob(&logits, 4, 5);
        let total: f64 = logits
            .iter()
            .enumerate()
            .map(|(i, _)| f64::from(token_logprob(&logits, i as u32, 0).logprob).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        assert!((f64::from(lp.logprob) - (0.5 - z.ln())).abs() < 1e-6);
        // Largest first; the tie between ids 1 and 3 keeps id order.
        let ids: Vec<u32> = lp.top.iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, vec![1, 3, 0, 4, 2]);
        assert_eq!(lp.top[0].1, lp.top[1].1);
    }

    #[test]
    fn top_n_keeps_only_the_largest() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 101) as f32).collect();
        let lp = token_logprob(&logits, 0, 3);
        let mut sorted: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        sorted.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let ids: Vec<u32> = lp.top.iter().map(|&(id, _)| id).collect();
        let want: Vec<u32> = sorted[..3].iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, want);
        assert!(token_logprob(&logits, 0, 0).top.is_empty());
    }

    #[test]
    fn masked_tokens_get_minus_infinity() {
        let logits = [f32::NEG_INFINITY, 0.0, 0.0];
        let lp = token_logprob(&logits, 0, 3);
        assert_eq!(lp.logprob, f32::NEG_INFINITY);
        assert!((lp.top[0].1 - 0.5f32.ln()).abs() < 1e-6);
        assert_eq!(lp.top[2], (0, f32::NEG_INFINITY));
    }
}
