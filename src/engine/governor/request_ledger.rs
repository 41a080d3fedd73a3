//! What drafting has gained one request, net: the cap on what a request that turns out not to
//! pay may lose before it decodes plainly.
//!
//! Why it exists: the planner drafts where the request's acceptance estimate says a round
//! pays, and that estimate starts from other requests' (pooled, per kind of draft) and moves
//! with the request's own few drafts. A request whose drafts stand far less often than its
//! estimate says (prompt lookup on a summary: the text matches the article, the continuation
//! does not) keeps drafting at a loss while the estimate catches up, and a short answer ends
//! before it does. The request's own rounds say what drafting did: the tokens a drafting round
//! gave beyond the one a plain round gives, at the plain price per token, less what the round
//! cost beyond a plain round. While that net stands further behind than a small share of the
//! request's decoding time (plus a round), the request decodes plainly; it may try
//! again once its decoding time has worn the loss down to that share. Where drafting pays the
//! net stays ahead and the cap never binds.
//!
//! A drafter's catch-up on text it has not seen (a probe's) is not counted: it is a one-off
//! the planner prices against the whole rest of the request (`probe_pays`), and the server's
//! [`DraftingLedger`](super::ledger::DraftingLedger) bounds what such exploring spends.

/// A request's net seconds saved by drafting (negative: lost) and its decoding seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RequestLedger {
    net: f64,
    decoded: f64,
    rounds: u32,
}

impl RequestLedger {
    /// The share of a request's decoding time its drafting may lose net.
    pub const SHARE: f64 = 0.02;
    /// Rounds' worth of time (at the request's mean round) it may lose beyond that share: one
    /// unlucky round of a drafter that pays must not stop it.
    pub const ALLOWANCE_ROUNDS: f64 = 1.0;

    /// A decoding round of `seconds` in which drafting saved this request `gain` seconds
    /// against plain decoding (negative: cost; 0 for a plain round).
    pub fn record(&mut self, seconds: f64, gain: f64) {
        if !(seconds.is_finite() && seconds >= 0.0 && gain.is_finite()) {
            return;
        }
        self.net += gain;
        self.decoded += seconds;
        self.rounds += 1;
    }

    /// Net seconds drafting saved this request (negative: lost).
    pub fn net(&self) -> f64 {
        self.net
    }

    /// Whether the request may draft: its drafting has lost no more than [`Self::SHARE`] of
    /// its decoding time and [`Self::ALLOWANCE_ROUNDS`] mean rounds.
    pub fn may_draft(&self) -> bool {
        let mean_round = self.decoded / f64::from(self.rounds.max(1));
        self.net >= -(Self::SHARE * self.decoded + Self::ALLOWANCE_ROUNDS * mean_round)
    }
}

/// One sequence of a decoding round, for [`round_gains`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoundShare {
    /// Tokens the round gave it (drafts that stood and the target's own).
    pub tokens: usize,
    /// Drafts it sent to be verified.
    pub drafted: usize,
}

/// What a decoding round that drafted gained each of its sequences against a plain round of
/// the same sequences: the tokens beyond the one a plain round gives each, at `per_token` (a
/// plain round's seconds per sequence), less a share of what the round cost beyond the plain
/// round (`seconds` against `per_token` times the sequences), shared by the drafts each sent
/// (evenly where none was sent). The gains add up to the round's.
pub fn round_gains(per_token: f64, seconds: f64, shares: &[RoundShare]) -> Vec<f64> {
    let extra = seconds - per_token * shares.len() as f64;
    let drafted: usize = shares.iter().map(|s| s.drafted).sum();
    shares
        .iter()
        .map(|s| {
            let part = if drafted > 0 {
                s.drafted as f64 / drafted as f64
            } else {
                1.0 / shares.len() as f64
            };
            (s.tokens as f64 - 1.0) * per_token - extra * part
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_whose_drafts_do_not_pay_stops_within_a_few_rounds() {
        // Plain steps of 6 ms; a round of 3 drafts costs 8.4 ms and, at 18% acceptance,
        // mostly gives one token: 2.4 ms lost a round.
        let mut l = RequestLedger::default();
        let mut drafting_rounds = 0;
        while l.may_draft() {
            l.record(0.0084, 1.0 * 0.006 - 0.0084);
            drafting_rounds += 1;
        }
        assert!((3..=5).contains(&drafting_rounds), "{drafting_rounds}");
        // Its plain steps wear the loss down to the share: it may try again after a couple
        // of dozen steps, not at once.
        let mut steps = 0;
        while !l.may_draft() {
            l.record(0.006, 0.0);
            steps += 1;
        }
        assert!((15..=60).contains(&steps), "{steps} steps");
        // Trying and losing again stops it again, for longer: over a long request the loss
        // stays near the share of its decoding time.
        for _ in 0..2000 {
            if l.may_draft() {
                l.record(0.0084, 0.006 - 0.0084);
            } else {
                l.record(0.006, 0.0);
            }
        }
        let lost = -l.net() / l.decoded;
        assert!(lost > 0.01 && lost < 0.03, "{lost}");
    }

    #[test]
    fn a_request_whose_drafts_pay_is_never_stopped_by_an_unlucky_round() {
        let mut l = RequestLedger::default();
        // Its first round loses: the allowance covers it.
        l.record(0.0084, 0.006 - 0.0084);
        assert!(l.may_draft());
        for i in 0..200 {
            // Three tokens from most rounds, one from every fourth.
            let tokens = if i % 4 == 3 { 1.0 } else { 3.0 };
            l.record(0.0084, tokens * 0.006 - 0.0084);
            assert!(l.may_draft(), "round {i}: net {}", l.net());
        }
        assert!(l.net() > 0.0);
    }

    #[test]
    fn plain_rounds_and_bad_measurements_move_nothing_but_the_clock() {
        let mut l = RequestLedger::default();
        l.record(f64::NAN, -1.0);
        l.record(0.01, f64::INFINITY);
        l.record(-0.01, 0.0);
        assert_eq!(l, RequestLedger::default());
        l.record(0.006, 0.0);
        assert_eq!(l.net(), 0.0);
        assert!(l.may_draft());
    }

    #[test]
    fn a_round_is_shared_by_the_drafts_each_sequence_sent() {
        // Two sequences at 5 ms a token in a plain round of 10 ms; the round took 14 ms.
        let shares = [
            RoundShare {
                tokens: 4,
                drafted: 3,
            },
            RoundShare {
                tokens: 1,
                drafted: 1,
            },
        ];
        let g = round_gains(0.005, 0.014, &shares);
        // 4 ms over plain: 3 of it to the first, 1 to the second.
        assert!((g[0] - (3.0 * 0.005 - 0.003)).abs() < 1e-12, "{g:?}");
        assert!((g[1] - (-0.001)).abs() < 1e-12, "{g:?}");
        // The shares add up to the round's gain: its tokens at the plain price less its time.
        let whole = 5.0 * 0.005 - 0.014;
        assert!((g.iter().sum::<f64>() - whole).abs() < 1e-12);
        // A round that drafted ahead but sent nothing shares its cost evenly.
        let none = [RoundShare {
            tokens: 1,
            drafted: 0,
        }; 2];
        let g = round_gains(0.005, 0.012, &none);
        assert!(
            (g[0] + 0.001).abs() < 1e-12 && (g[1] + 0.001).abs() < 1e-12,
            "{g:?}"
        );
    }
}
