//! What rounds cost: measured prices of draft steps, drafter catch-ups and target forwards of
//! each width, and the forecasts built from them. Timing noise on a shared machine only ever adds,
//! so every price is the least of a short window of measurements.

use super::expert_prices::ExpertPrices;
use super::ledger::DraftingLedger;
use super::round_bias::RoundBias;
use super::verify_depth::VerifyDepth;

mod catch_up;
mod drafting;
mod estimate;
mod first_step;
pub use estimate::CostEstimate;
use first_step::FirstStep;

/// Measured costs, in seconds: one draft step by how many sequences draft together, the
/// drafter's catching up per context token by how many tokens it takes in at once, and target
/// forwards by width (new tokens of every sequence in the forward together).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct CostModel {
    /// A round's first draft step, by the tokens fed into it (see `FirstStep`).
    draft_first: FirstStep,
    /// `draft_step[n - 1]`: each later draft step of `n` sequences together.
    draft_step: Vec<CostEstimate>,
    /// `catch_up_token[b]`: seconds per token of catch-ups of `2^b..2^(b+1)` tokens. One price
    /// for all sizes would misprice long catch-ups: a drafter taking in a long prompt pays
    /// attention over a deep context on every token, several times a short one's price.
    catch_up_token: Vec<CostEstimate>,
    /// `catch_up_size[b]`: the tokens of bucket `b`'s latest catch-up, where its price was
    /// measured (catch-ups past the deepest measured bucket are extrapolated from the two
    /// deepest).
    catch_up_size: Vec<usize>,
    /// How a draft step's price grows with the context it attends over, from start-up steps
    /// timed at two depths: the floor under the price of a step at a given depth.
    draft_depth: Option<drafting::DepthLine>,
    /// `verify[w - 1]`: a target forward of `w` new tokens in all, its rows at the depth
    /// `verify_depth` keeps prices at (live forwards are recorded less what their depth added).
    verify: Vec<CostEstimate>,
    /// How a forward's price grows with its rows' context depths, from start-up forwards timed
    /// at two depths (`None` until then: every depth priced alike).
    #[serde(default)]
    verify_depth: Option<VerifyDepth>,
    /// The start-up prices of `verify`, set by [`CostModel::mark_provisional`].
    verify_start_up: Vec<Option<f64>>,
    /// `verify_stamp[w - 1]`: when width `w` was last measured (a count of measurements).
    verify_stamp: Vec<u64>,
    verify_clock: u64,
    /// How far measured drafting has run over its forecast lately (a decayed average of the
    /// ratio, 1 = on the mark): draft prices are the luckiest recent step, and drafting is
    /// noisier than a target forward.
    draft_bias: f64,
    /// How far rounds that draft run over their forecast, against plain rounds.
    round_bias: RoundBias,
    /// What drafting has saved lately, net: the budget exploring spends.
    ledger: DraftingLedger,
    /// A mixture of experts' target: `verify` holds each width's price without its expert
    /// reads, which are priced here by the experts a forward of that width is expected to read.
    experts: Option<ExpertPrices>,
    /// Start-up is over ([`CostModel::mark_provisional`]): forwards recorded now are live.
    /// Not remembered: a remembered table starts provisional again.
    #[serde(skip)]
    live: bool,
    /// Set by [`CostModel::freeze`]: measurements no longer change any price.
    #[serde(skip)]
    frozen: bool,
}

impl CostModel {
    /// A model for target forwards of up to `max_width` tokens (wider ones are extrapolated).
    pub fn new(max_width: usize) -> Self {
        Self {
            draft_first: FirstStep::default(),
            draft_step: Vec::new(),
            catch_up_token: Vec::new(),
            catch_up_size: Vec::new(),
            draft_depth: None,
            verify: vec![CostEstimate::default(); max_width.max(1)],
            verify_depth: None,
            verify_start_up: Vec::new(),
            verify_stamp: vec![0; max_width.max(1)],
            verify_clock: 0,
            draft_bias: 1.0,
            round_bias: RoundBias::default(),
            ledger: DraftingLedger::default(),
            experts: None,
            live: false,
            frozen: false,
        }
    }

    /// A price table that measurements no longer change: the engine takes one in
    /// `EngineConfig::costs` instead of timing forwards, so the governor's choices depend on
    /// acceptance alone, not on how fast or busy the machine is (tests, simulations).
    pub fn freeze(mut self) -> Self {
        self.frozen = true;
        self
    }

    pub fn is_frozen(&self) -> bool {
        self.frozen
    }

    /// Marks every price so far as provisional: start-up measurements run on a short context
    /// and an idle machine, so they are kept only until live rounds measure the same thing (a
    /// minimum over a window would otherwise hold the flattering start-up figure for a whole
    /// window of rounds).
    pub fn mark_provisional(&mut self) {
        if self.frozen {
            return;
        }
        self.live = true;
        self.verify_start_up = self.verify.iter().map(CostEstimate::get).collect();
        for c in self
            .draft_first
            .estimates_mut()
            .chain(&mut self.draft_step)
            .chain(&mut self.catch_up_token)
            .chain(&mut self.verify)
        {
            c.provisional = c.len > 0;
        }
    }

    /// The table worth keeping past a restart: as live rounds left it, but the target's
    /// forwards at their start-up prices. Live rounds price each width at whatever depth it
    /// last ran (a 2-token verification of Gemma 3 beside an 800-token prompt cost 1.7 steps),
    /// and a width not run again keeps that price: remembered, it priced drafting for a fresh
    /// server's short requests at another request's depth, and 30 first requests drafted
    /// nothing. Start-up times every width on one short context, as a later start times its
    /// check forwards. The round bias is measured against live prices, so it starts afresh.
    pub fn to_remember(&self) -> CostModel {
        let mut kept = self.clone();
        if !self.verify_start_up.is_empty() {
            for (c, start) in kept.verify.iter_mut().zip(&self.verify_start_up) {
                *c = CostEstimate::default();
                if let Some(v) = start {
                    c.record(*v);
                }
            }
            kept.verify_stamp.iter_mut().for_each(|s| *s = 0);
            kept.verify_clock = 0;
        }
        kept.round_bias = RoundBias::default();
        kept
    }

    /// Forwards as wide as this table prices by measurement (wider ones are extrapolated): a
    /// remembered table is taken only for an engine of the same widths.
    pub fn max_width(&self) -> usize {
        self.verify.len()
    }

    /// A decoding round (no prompt chunk in it, nor a catch-up beyond a routine one) whose
    /// draft steps and verification were forecast at `forecast` seconds took `measured`.
    pub fn record_round_forecast(&mut self, drafting: bool, forecast: f64, measured: f64) {
        if !self.frozen {
            self.round_bias.record(drafting, forecast, measured);
        }
    }

    /// How many times its forecast seconds a round that drafts costs, as measured against
    /// plain rounds (1 for a frozen price table): see `RoundBias`.
    pub fn drafting_bias(&self) -> f64 {
        self.round_bias.get()
    }

    /// A decoding round (no prompt chunk) of `seconds` that gave `tokens` tokens to the
    /// sequences of `rows` (each one's `(tokens verified, context tokens before them)`),
    /// `drafted` or not, into the ledger of what drafting saved: the round's tokens at what a
    /// plain round of those sequences costs as it runs at their depths, less its seconds
    /// (catch-ups included: they are what exploring spends).
    pub fn record_decode_round(
        &mut self,
        drafted: bool,
        (tokens, rows): (usize, &[(usize, usize)]),
        seconds: f64,
    ) {
        if self.frozen || rows.is_empty() {
            return;
        }
        let gain = match (drafted, self.plain_token_seconds(rows)) {
            (true, Some(per_token)) => tokens as f64 * per_token - seconds,
            _ => 0.0,
        };
        self.ledger.record(seconds, gain);
    }

    /// What a plain round of the sequences of `rows` (as in [`Self::record_decode_round`])
    /// costs per sequence, as plain rounds run at their depths: the price a drafting round's
    /// tokens are weighed at. `None` for a frozen table (its prices are not this machine's)
    /// or before the widths are measured.
    pub fn plain_token_seconds(&self, rows: &[(usize, usize)]) -> Option<f64> {
        if self.frozen || rows.is_empty() {
            return None;
        }
        let plain = self.verify_seconds_with(rows.len(), rows.iter().map(|&(_, d)| (1, d)))?;
        Some(plain * self.round_bias.plain() / rows.len() as f64)
    }

    /// Net seconds drafting saved lately against plain decoding (negative: lost).
    pub fn drafting_net(&self) -> f64 {
        self.ledger.net()
    }

    /// Whether exploring (a probe, a drafter catching up on text it missed) may be priced on
    /// hope now: drafting has not lately cost more than it saved beyond a small budget
    /// (always, for a frozen table). See `DraftingLedger`.
    pub fn may_explore(&self) -> bool {
        self.ledger.may_explore()
    }

    /// How target forwards' prices grow with their rows' depth (see `VerifyDepth`), from
    /// start-up timings, for every forward priced from now on (`None`: every depth alike).
    /// Width prices are kept at the line's shallow depth, where start-up times them.
    pub fn set_verify_depth(&mut self, line: Option<VerifyDepth>) {
        if !self.frozen {
            self.verify_depth = line;
        }
    }

    /// What `rows` (each sequence's `(new tokens, context tokens before them)`) add to a
    /// forward's price over the same widths at the depth width prices are kept at (0 when not
    /// measured; negative for shallower rows).
    fn depth_seconds(&self, rows: impl IntoIterator<Item = (usize, usize)>) -> f64 {
        self.verify_depth
            .as_ref()
            .map_or(0.0, |d| d.extra_seconds(rows))
    }

    /// Seconds of a target forward of `width` new tokens in all, of which `rows` (each
    /// sequence's `(new tokens, context tokens before them)`) attend over known depths: the
    /// width's price with what the rows' depths add, never less than half the width's price
    /// (a forward cannot get much cheaper than its weights).
    pub fn verify_seconds_with(
        &self,
        width: usize,
        rows: impl IntoIterator<Item = (usize, usize)>,
    ) -> Option<f64> {
        let base = self.verify_seconds(width)?;
        Some((base + self.depth_seconds(rows)).max(0.5 * base))
    }

    /// Time of a target forward of `width` new tokens. A forward of `width` tokens slower than
    /// `width` one-token forwards is noise (it could have run as that many single steps), and
    /// is not kept: it would be the width's only live price until the width runs again, and a
    /// plan never picks a width it prices that high, so it would never be re-measured (one
    /// preempted forward could stop an always-right drafter for the rest of its request).
    pub fn record_verify(&mut self, seconds: f64, width: usize) {
        if self.frozen {
            return;
        }
        let single = self
            .verify
            .first()
            .and_then(|c| c.get().filter(|_| !c.provisional));
        if width > 1 && single.is_some_and(|one| seconds > one * width as f64) {
            return;
        }
        if let Some(c) = width.checked_sub(1).and_then(|i| self.verify.get_mut(i)) {
            c.record(seconds);
            self.verify_clock += 1;
            self.verify_stamp[width - 1] = self.verify_clock;
        }
    }

    /// Prices a mixture's target forwards by the experts they read from now on (start-up, before
    /// any forward is recorded).
    pub fn price_experts(&mut self, prices: ExpertPrices) {
        self.experts = Some(prices);
    }

    pub fn expert_prices(&self) -> Option<&ExpertPrices> {
        self.experts.as_ref()
    }

    /// A target forward of `rows` (each sequence's `(new tokens, context tokens before them)`)
    /// that took `seconds` and read `reads[l]` distinct experts in routed layer `l` (empty for
    /// a dense model): a mixture's routing is learned from it, and its width's price kept
    /// without the reads it happened to make, and at the reference depth.
    pub fn record_forward(&mut self, seconds: f64, rows: &[(usize, usize)], reads: &[u16]) {
        if self.frozen {
            return;
        }
        let width = rows.iter().map(|&(w, _)| w).sum();
        // Reads not counted (a forward run where nothing counts them) are taken as expected.
        let seconds = match &mut self.experts {
            Some(e) if !reads.is_empty() => {
                e.record(width, reads, self.live);
                (seconds - e.seconds_of(reads)).max(0.0)
            }
            Some(e) => (seconds - e.seconds(width)).max(0.0),
            None => seconds,
        };
        let at_reference = seconds - self.depth_seconds(rows.iter().copied());
        self.record_verify(
            at_reference.max(self.reference_floor(width, seconds)),
            width,
        );
    }

    /// The least a forward of `width` that took `seconds` is kept as at the reference depth:
    /// half its width's start-up price there (what its weights cost), or half of what it took
    /// before start-up ends. A depth line steeper than this machine's forwards could otherwise
    /// take a deep forward's whole price away. Half of what it took instead priced a step deep in
    /// a context high wherever attention was most of it: kept at half and the depth's share
    /// added back, a step at depth 8184 whose attention is four fifths of it was priced 1.3x.
    fn reference_floor(&self, width: usize, seconds: f64) -> f64 {
        let start_up = width
            .checked_sub(1)
            .and_then(|i| self.verify_start_up.get(i).copied().flatten());
        0.5 * start_up.map_or(seconds, |p| p.min(seconds))
    }

    /// Seconds of a target forward of `width` new tokens (0 for none); unmeasured widths are
    /// interpolated linearly between the nearest measured ones, or extrapolated per token past
    /// the widest. A width measured more recently than this one bounds it: never more than a
    /// fresher wider forward, never less than a fresher narrower one. Each width's price is
    /// its own recent minimum, and a width not run lately keeps what it cost at another context
    /// depth: priced from long-prompt rounds beside a neighbour priced on short ones, a wider
    /// forward could look cheaper than a narrower one, and a batch would draft at a loss.
    pub fn verify_seconds(&self, width: usize) -> Option<f64> {
        if width == 0 {
            return Some(0.0);
        }
        let own = self.verify_interpolated(width)?;
        let stamp = self.verify_stamp.get(width - 1).copied().unwrap_or(0);
        let fresher = |w: usize| {
            (self.verify_stamp[w - 1] > stamp)
                .then(|| self.verify_at(w))
                .flatten()
        };
        let n = self.verify.len();
        let cap = (width + 1..=n).filter_map(fresher).fold(own, f64::min);
        let floor = (1..width.min(n + 1))
            .filter_map(fresher)
            .fold(0.0, f64::max);
        let experts = self.experts.as_ref().map_or(0.0, |e| e.seconds(width));
        Some(cap.max(floor) + experts)
    }

    fn verify_interpolated(&self, width: usize) -> Option<f64> {
        let measured = |w: usize| self.verify_at(w);
        if let Some(v) = measured(width) {
            return Some(v);
        }
        let below = (1..width.min(self.verify.len() + 1))
            .rev()
            .find_map(|w| measured(w).map(|c| (w, c)))?;
        let above = (width + 1..=self.verify.len()).find_map(|w| measured(w).map(|c| (w, c)));
        Some(match above {
            Some((wa, ca)) => {
                let t = (width - below.0) as f64 / (wa - below.0) as f64;
                below.1 + t * (ca - below.1)
            }
            // Past the widest measured forward: each extra token costs what the last one did
            // on average, never less than nothing.
            None => below.1 * width as f64 / below.0 as f64,
        })
    }

    /// The price of a `w`-token forward if measured. A start-up price is scaled by how far live
    /// rounds found the nearest width they measured from its start-up price: live rounds run
    /// deeper in the context than start-up's, and pricing one width live and its neighbour at
    /// start-up would make the wider one look cheaper than it is.
    fn verify_at(&self, w: usize) -> Option<f64> {
        let c = self.verify.get(w.checked_sub(1)?)?;
        let v = c.get()?;
        if !c.provisional {
            return Some(v);
        }
        let drift = (1..=self.verify.len())
            .filter_map(|r| {
                let live = &self.verify[r - 1];
                let start = self.verify_start_up.get(r - 1).copied().flatten()?;
                let now = live.get().filter(|_| !live.provisional && start > 0.0)?;
                Some((r.abs_diff(w), now / start))
            })
            .min_by_key(|&(d, _)| d)
            .map_or(1.0, |(_, ratio)| ratio);
        Some(v * drift)
    }

    /// Cost of one sequence's round of γ relative to one plain step, alone in the batch.
    pub fn round_cost(&self, gamma: usize) -> Option<f64> {
        let plain = self.verify_seconds(1)?;
        Some((self.draft_seconds(gamma, 1)? + self.verify_seconds(gamma + 1)?) / plain)
    }
}

#[cfg(test)]
mod tests;
