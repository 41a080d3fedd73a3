//! The speed governor (DESIGN.md §4): each round, choose how many tokens every request drafts.
//!
//! Why it exists: speculation only pays when the drafter agrees with the target often enough to
//! cover what drafting and a wider verification cost, and on a compute-bound CPU a γ+1-token
//! verification is far from free. The governor tracks the request's acceptance rate α (a
//! decaying average) and the measured costs of a draft step and of target forwards of each
//! width, picks the γ that maximises the expected speedup, and decodes plainly when no γ beats
//! plain decoding, probing again now and then so a request that becomes predictable gets
//! speculation back. Pure arithmetic: no clocks, no I/O; the caller feeds it measurements.

/// Governor settings. The γ range it chooses from is live (`SpeculationSettings`), so it is
/// passed in each round instead.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GovernorConfig {
    /// Weight of the past in the acceptance average, per drafted token (0.97 ≈ the last ~30
    /// drafts). Per token, not per round: decayed per round, a request drafting 1 token a round
    /// kept ~10 observations, so with the one-each-way prior its estimate could not pass
    /// 11/12 even at 100% acceptance, which made longer drafts look unprofitable and held
    /// it at γ = 1 (measured: 2.00 tokens a round at 100% acceptance, where γ = 3 won 1.09x).
    pub decay: f64,
    /// While decoding plainly, draft one probing round after this many steps; each probe that
    /// does not bring speculation back doubles the wait (up to 16 times this).
    pub probe_every: usize,
    /// Speculate only if the round's plan is expected to beat plain decoding by this factor:
    /// the margin for forecast error. At 1.02, prompt lookup beside 7 other requests was
    /// forecast 4% faster (6.8 tokens in 18.9 ms against 6 in 17.4) and ran 2–5% slower;
    /// 1.05 declines it there and changed nothing measurable for one request (run S).
    pub min_gain: f64,
}

impl Default for GovernorConfig {
    fn default() -> Self {
        Self {
            decay: 0.97,
            probe_every: 16,
            min_gain: 1.05,
        }
    }
}

/// A measured cost: the least of the last few measurements. Timing noise on a shared machine
/// only ever adds (preemption, another process's burst can turn a 40 µs forward into 5 ms),
/// so the minimum of a short window tracks the real cost, and the window lets it follow slow
/// drifts such as attention growing with the context. (The median was tried: it priced draft
/// steps closer to their typical cost, but after long prompts it held their deep-context price
/// for several rounds, rounds it then declined to draft, so it was never re-measured: 1.40x →
/// 1.24x on short questions after a summarization batch.)
#[derive(Clone, Copy, Debug, Default)]
pub struct CostEstimate {
    recent: [f64; Self::WINDOW],
    len: usize,
    next: usize,
    /// Holds only start-up measurements, which the first live one replaces.
    provisional: bool,
}

impl CostEstimate {
    const WINDOW: usize = 8;

    pub fn record(&mut self, seconds: f64) {
        if !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        if std::mem::take(&mut self.provisional) {
            self.len = 0;
            self.next = 0;
        }
        self.recent[self.next] = seconds;
        self.next = (self.next + 1) % Self::WINDOW;
        self.len = (self.len + 1).min(Self::WINDOW);
    }

    pub fn get(&self) -> Option<f64> {
        self.recent[..self.len].iter().copied().reduce(f64::min)
    }
}

/// Measured costs, in seconds: one draft step by how many sequences draft together, the
/// drafter's catching up per context token by how many tokens it takes in at once, and target
/// forwards by width (new tokens of every sequence in the forward together).
#[derive(Clone, Debug)]
pub struct CostModel {
    /// `draft_first[n - 1]`: the first draft step of a round of `n` sequences together.
    draft_first: Vec<CostEstimate>,
    /// `draft_step[n - 1]`: each later draft step of `n` sequences together.
    draft_step: Vec<CostEstimate>,
    /// `catch_up_token[b]`: seconds per token of catch-ups of `2^b..2^(b+1)` tokens. One price
    /// for all sizes was off by 4x: a drafter taking in a 900-token prompt pays attention over
    /// a deep context on every token, so it costs ~2 ms a token where a 32-token one costs 0.5.
    catch_up_token: Vec<CostEstimate>,
    /// `catch_up_size[b]`: the tokens of bucket `b`'s latest catch-up, where its price was
    /// measured (catch-ups past the deepest measured bucket are extrapolated from the two
    /// deepest).
    catch_up_size: Vec<usize>,
    /// How a draft step's price grows with the context it attends over, from start-up steps
    /// timed at two depths: the floor under the price of a step at a given depth.
    draft_depth: Option<DepthLine>,
    /// `verify[w - 1]`: a target forward of `w` new tokens in all.
    verify: Vec<CostEstimate>,
    /// The start-up prices of `verify`, set by [`CostModel::mark_provisional`].
    verify_start_up: Vec<Option<f64>>,
    /// `verify_stamp[w - 1]`: when width `w` was last measured (a count of measurements).
    verify_stamp: Vec<u64>,
    verify_clock: u64,
    /// How far measured drafting has run over its forecast lately (a decayed average of the
    /// ratio, 1 = on the mark): draft prices are the luckiest recent step, and drafting is
    /// noisier than a target forward (measured: 11% over its forecast, median, against 2%).
    draft_bias: f64,
}

impl CostModel {
    /// A model for target forwards of up to `max_width` tokens (wider ones are extrapolated).
    pub fn new(max_width: usize) -> Self {
        Self {
            draft_first: Vec::new(),
            draft_step: Vec::new(),
            catch_up_token: Vec::new(),
            catch_up_size: Vec::new(),
            draft_depth: None,
            verify: vec![CostEstimate::default(); max_width.max(1)],
            verify_start_up: Vec::new(),
            verify_stamp: vec![0; max_width.max(1)],
            verify_clock: 0,
            draft_bias: 1.0,
        }
    }

    /// Marks every price so far as provisional: start-up measurements run on a short context
    /// and an idle machine, so they are kept only until live rounds measure the same thing (a
    /// minimum over a window would otherwise hold the flattering start-up figure for 8 more
    /// rounds: 6.8 ms for a draft step that took 9.7 at real depths).
    pub fn mark_provisional(&mut self) {
        self.verify_start_up = self.verify.iter().map(CostEstimate::get).collect();
        for c in self
            .draft_first
            .iter_mut()
            .chain(&mut self.draft_step)
            .chain(&mut self.catch_up_token)
            .chain(&mut self.verify)
        {
            c.provisional = c.len > 0;
        }
    }

    /// Time spent on `steps` draft steps of `seqs` sequences together, `first` of it on the
    /// first step (0 = not timed apart).
    pub fn record_draft(&mut self, seconds: f64, first: f64, steps: usize, seqs: usize) {
        if steps == 0 || seqs == 0 {
            return;
        }
        if self.draft_step.len() < seqs {
            self.draft_step.resize(seqs, CostEstimate::default());
            self.draft_first.resize(seqs, CostEstimate::default());
        }
        if first <= 0.0 || first > seconds {
            let each = seconds / steps as f64;
            self.draft_first[seqs - 1].record(each);
            self.draft_step[seqs - 1].record(each);
            return;
        }
        self.draft_first[seqs - 1].record(first);
        if steps > 1 {
            self.draft_step[seqs - 1].record((seconds - first) / (steps - 1) as f64);
        }
    }

    /// A round's drafting took `measured` seconds where `forecast` (from [`Self::draft_seconds`],
    /// bias included) was expected: later forecasts are scaled by the recent ratio.
    pub fn record_draft_forecast(&mut self, forecast: f64, measured: f64) {
        if !(forecast > 0.0 && measured.is_finite() && measured > 0.0) {
            return;
        }
        let ratio = (measured / (forecast / self.draft_bias)).clamp(0.5, 3.0);
        self.draft_bias = 0.9 * self.draft_bias + 0.1 * ratio;
    }

    /// Time the drafter spent taking in `tokens` context tokens it had not seen.
    pub fn record_catch_up(&mut self, seconds: f64, tokens: usize) {
        if tokens > 0 {
            let b = catch_up_bucket(tokens);
            if self.catch_up_token.len() <= b {
                self.catch_up_token.resize(b + 1, CostEstimate::default());
                self.catch_up_size.resize(b + 1, 0);
            }
            self.catch_up_token[b].record(seconds / tokens as f64);
            self.catch_up_size[b] = tokens;
        }
    }

    /// A draft step's seconds measured at two context depths (tokens): a step attends over
    /// the whole context, so at depth it costs more than the shallow steps that price it
    /// until drafting runs there (measured: 3.5 ms at 31 tokens, 4.3 at 255, 6.5 at 800).
    pub fn record_draft_depths(&mut self, shallow: (usize, f64), deep: (usize, f64)) {
        let (d0, s0) = (shallow.0 as f64, shallow.1);
        let (d1, s1) = (deep.0 as f64, deep.1);
        if d1 > d0 && s0.is_finite() && s1.is_finite() && s0 > 0.0 {
            self.draft_depth = Some(DepthLine {
                depth: d0,
                step: s0,
                slope: ((s1 - s0) / (d1 - d0)).max(0.0),
            });
        }
    }

    /// The least a draft step costs with `depth` context tokens: the start-up line through
    /// its two depths, from its shallower one on (0 when not measured, or shallower).
    pub fn draft_step_floor(&self, depth: usize) -> f64 {
        match self.draft_depth {
            Some(l) if depth as f64 > l.depth => l.step + l.slope * (depth as f64 - l.depth),
            _ => 0.0,
        }
    }

    /// Time of a target forward of `width` new tokens. A forward of `width` tokens slower than
    /// `width` one-token forwards is noise (it could have run as that many single steps), and
    /// is not kept: it would be the width's only live price until the width runs again, and a
    /// plan never picks a width it prices that high, so it would never be re-measured (seen on
    /// a 35 µs tiny model: one preempted 2-token forward at 2.4 times a step stopped an
    /// always-right drafter for the rest of its request).
    pub fn record_verify(&mut self, seconds: f64, width: usize) {
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

    /// Seconds of `steps` draft steps of `seqs` sequences together, once any step is measured:
    /// the first step at its own price, the rest at the later steps' (each standing in for the
    /// other until measured). A batch size not measured yet is interpolated between its nearest
    /// measured neighbours, or priced as the nearest one (the first round at that size then
    /// measures it).
    pub fn draft_seconds(&self, steps: usize, seqs: usize) -> Option<f64> {
        if steps == 0 || seqs == 0 {
            return Some(0.0);
        }
        let first = by_batch_size(&self.draft_first, seqs);
        let later = by_batch_size(&self.draft_step, seqs);
        let (first, later) = match (first, later) {
            (Some(f), Some(l)) => (f, l),
            (Some(c), None) | (None, Some(c)) => (c, c),
            (None, None) => return None,
        };
        Some((first + later * (steps - 1) as f64) * self.draft_bias)
    }

    /// Seconds for the drafter to take in `tokens` unseen context tokens (nothing until
    /// measured: prompt lookup never has any), priced per token at the nearest measured size
    /// (the larger one on a tie: deeper catch-ups cost more per token, and guessing low is what
    /// lets an unpayable catch-up through). Past the deepest measured size the per-token price
    /// is extrapolated along the line through the two deepest: every token of a long prompt
    /// attends over the ones before it (measured: 0.92 ms a token at 31 tokens, 1.03 at 255,
    /// 1.22 at 782, which the 255-token price put at 0.8 s instead of 0.95).
    pub fn catch_up_seconds(&self, tokens: usize) -> f64 {
        if tokens == 0 {
            return 0.0;
        }
        let want = catch_up_bucket(tokens);
        let measured: Vec<(usize, f64)> = self
            .catch_up_token
            .iter()
            .enumerate()
            .filter_map(|(b, c)| c.get().map(|v| (b, v)))
            .collect();
        let per_token = match measured.as_slice() {
            [.., (b0, p0), (b1, p1)] if want > *b1 => {
                let (n0, n1) = (self.catch_up_size[*b0], self.catch_up_size[*b1]);
                let slope = ((p1 - p0) / (n1 as f64 - n0 as f64)).max(0.0);
                p1 + slope * (tokens - n1) as f64
            }
            _ => measured
                .iter()
                .min_by_key(|&&(b, _)| (b.abs_diff(want), std::cmp::Reverse(b)))
                .map_or(0.0, |&(_, v)| v),
        };
        per_token * tokens as f64
    }

    /// Seconds of a target forward of `width` new tokens (0 for none); unmeasured widths are
    /// interpolated linearly between the nearest measured ones, or extrapolated per token past
    /// the widest. A width measured more recently than this one bounds it: never more than a
    /// fresher wider forward, never less than a fresher narrower one. Each width's price is
    /// its own recent minimum, and a width not run lately keeps what it cost at another context
    /// depth (measured: width 3 priced at 15.9 ms from long-prompt rounds while width 4 ran at
    /// 14.2 on short ones, so one request drafting looked cheaper than none and a batch of
    /// four drafted at a loss, 0.77x).
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
        Some(cap.max(floor))
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

/// A straight line of draft-step seconds over context depth, from `depth` on.
#[derive(Clone, Copy, Debug)]
struct DepthLine {
    depth: f64,
    step: f64,
    slope: f64,
}

/// A per-batch-size price for `seqs` sequences: measured, interpolated between the nearest
/// measured sizes, or the nearest one's.
fn by_batch_size(prices: &[CostEstimate], seqs: usize) -> Option<f64> {
    let measured = |n: usize| prices.get(n - 1).and_then(CostEstimate::get);
    let below = (1..=seqs.min(prices.len()))
        .rev()
        .find_map(|n| measured(n).map(|c| (n, c)));
    let above = (seqs + 1..=prices.len()).find_map(|n| measured(n).map(|c| (n, c)));
    match (below, above) {
        (Some((nb, cb)), Some((na, ca))) if nb < seqs => {
            Some(cb + (seqs - nb) as f64 / (na - nb) as f64 * (ca - cb))
        }
        (Some((_, c)), _) | (None, Some((_, c))) => Some(c),
        (None, None) => None,
    }
}

/// The size class of a catch-up of `tokens` tokens: ⌊log2 tokens⌋.
fn catch_up_bucket(tokens: usize) -> usize {
    tokens.max(1).ilog2() as usize
}

/// The expected speedup of drafting γ with acceptance rate α and a round costing `round_cost`
/// plain steps: expected tokens per round `(1 − α^(γ+1)) / (1 − α)` over the round's cost.
pub fn expected_speedup(alpha: f64, gamma: usize, round_cost: f64) -> f64 {
    expected_tokens(alpha, gamma) / round_cost
}

/// Expected tokens a round of γ drafts yields at acceptance rate α (the accepted drafts and
/// the one token the target always adds).
pub fn expected_tokens(alpha: f64, gamma: usize) -> f64 {
    if alpha >= 1.0 {
        (gamma + 1) as f64
    } else {
        (1.0 - alpha.powi(gamma as i32 + 1)) / (1.0 - alpha)
    }
}

/// A decayed acceptance rate: accepted / (accepted + rejected) over recent drafts, with two
/// pseudo-drafts at a prior rate so a first round does not decide everything.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AcceptanceRate {
    accepted: f64,
    rejected: f64,
    prior: f64,
}

impl AcceptanceRate {
    /// An estimate that starts at `prior` (clamped to [0, 1]).
    pub fn new(prior: f64) -> Self {
        Self {
            accepted: 0.0,
            rejected: 0.0,
            prior: if prior.is_finite() {
                prior.clamp(0.0, 1.0)
            } else {
                0.5
            },
        }
    }

    pub fn get(&self) -> f64 {
        (self.accepted + 2.0 * self.prior) / (self.accepted + self.rejected + 2.0)
    }

    /// A round in which `accepted` of `drafted` drafts stood (a round stops at its first
    /// rejection, so a short count means exactly one rejection); the past weighs `decay` per
    /// drafted token.
    pub fn record(&mut self, drafted: usize, accepted: usize, decay: f64) {
        if drafted == 0 {
            return;
        }
        let d = decay.powi(drafted as i32);
        self.accepted = d * self.accepted + accepted as f64;
        self.rejected = d * self.rejected + f64::from(u8::from(accepted < drafted));
    }
}

/// One request's governor: its acceptance rate, and when it last speculated.
#[derive(Clone, Debug)]
pub struct Governor {
    cfg: GovernorConfig,
    rate: AcceptanceRate,
    plain_steps: usize,
    /// Plain steps before the next probe.
    probe_wait: usize,
    /// The last round was a probe.
    probed: bool,
}

impl Governor {
    /// A governor with no idea yet how well its drafter does (a prior rate of one half).
    pub fn new(cfg: GovernorConfig) -> Self {
        Self::with_prior(cfg, 0.5)
    }

    /// A governor whose acceptance estimate starts at `prior`: what the drafter achieved
    /// lately on other requests. Starting every request at one half made each one decode
    /// plainly until probes proved the drafter (measured: the first ~45 of 128 tokens, two
    /// probes and two catch-ups, with a drafter accepted 98% of the time).
    pub fn with_prior(cfg: GovernorConfig, prior: f64) -> Self {
        Self {
            cfg,
            rate: AcceptanceRate::new(prior),
            plain_steps: 0,
            probe_wait: cfg.probe_every.max(1),
            probed: false,
        }
    }

    /// The acceptance rate estimate (see [`AcceptanceRate`]).
    pub fn alpha(&self) -> f64 {
        self.rate.get()
    }

    /// Records a round: `accepted` of `drafted` drafts stood (a round stops at its first
    /// rejection, so a short count means exactly one rejection).
    pub fn record_round(&mut self, drafted: usize, accepted: usize) {
        let base = self.cfg.probe_every.max(1);
        if std::mem::take(&mut self.probed) {
            // The round after a probe tells whether the probe brought speculation back.
            self.probe_wait = if drafted == 0 {
                (self.probe_wait * 2).min(base * 16)
            } else {
                base
            };
        }
        if drafted == 0 {
            self.plain_steps += 1;
            return;
        }
        self.probed = self.plain_steps > 0 && self.plain_steps + 1 >= self.probe_wait;
        self.plain_steps = 0;
        self.rate.record(drafted, accepted, self.cfg.decay);
    }

    /// This request's say in the next round's plan, γ in `gamma_min..=gamma_max` or plain:
    /// free, or a probe at `gamma_min` after enough plain steps so α stays current.
    pub fn candidate(
        &self,
        gamma_min: usize,
        gamma_max: usize,
        catch_up: usize,
        remaining: usize,
    ) -> Candidate {
        let gamma_min = gamma_min.max(1).min(gamma_max);
        let choice = if gamma_max == 0 {
            Choice::Fixed(0)
        } else if self.plain_steps + 1 >= self.probe_wait {
            Choice::Probe {
                gamma: gamma_min,
                max: gamma_max,
            }
        } else {
            Choice::Free {
                min: gamma_min,
                max: gamma_max,
            }
        };
        Candidate {
            alpha: self.alpha(),
            choice,
            catch_up,
            remaining,
            depth: 0,
        }
    }
}

/// How a sequence's γ is set for a round.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Choice {
    /// Set by the request or a probe (0 = a plain step).
    Fixed(usize),
    /// The planner picks 0 or a γ in `min..=max`.
    Free { min: usize, max: usize },
    /// A probe of `gamma` drafts, made only if what speculation could save over the rest of
    /// the request (at best, every draft accepted, up to `max` drafts a round) outweighs the
    /// drafter catching up first.
    Probe { gamma: usize, max: usize },
}

/// One decoding sequence as the round planner sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub alpha: f64,
    pub choice: Choice,
    /// Context tokens its drafter has not seen yet (taken in before drafting).
    pub catch_up: usize,
    /// Tokens it may still generate (its one-off catch-up is spread over them).
    pub remaining: usize,
    /// Context tokens its draft steps attend over (0 = not known: priced as measured).
    pub depth: usize,
}

/// Chooses every sequence's γ for one round (DESIGN.md §4) to maximise the round's expected
/// tokens per second: expected tokens over the round's cost, which is the draft steps (shared
/// by every drafting sequence), each drafter's catch-up spread over what its sequence may
/// still generate, and one target forward as wide as everyone's tokens plus `base_width`
/// (prompt chunks in the same forward). A lone sequence gets the γ with the best expected
/// speedup; in a batch, where a plain step already shares the weights, extra verification
/// width is weighed against everyone's time. Free sequences speculate only if the plan beats
/// all-plain by `min_gain`. Until costs are measured, free sequences draft `min`.
pub fn plan_round(
    candidates: &[Candidate],
    base_width: usize,
    costs: &CostModel,
    min_gain: f64,
) -> Vec<usize> {
    let mut plan: Vec<usize> = candidates
        .iter()
        .map(|c| match c.choice {
            Choice::Fixed(g) => g,
            Choice::Probe { .. } | Choice::Free { .. } => 0,
        })
        .collect();
    let fixed = plan.clone();
    for (i, c) in candidates.iter().enumerate() {
        if let Choice::Probe { gamma, max } = c.choice {
            if probe_pays(candidates, i, &fixed, max, costs) {
                plan[i] = gamma;
            }
        }
    }
    let rate = |plan: &[usize]| round_rate(candidates, plan, base_width, costs);
    if rate(&plan).is_none() {
        for (g, c) in plan.iter_mut().zip(candidates) {
            if let Choice::Free { min, .. } = c.choice {
                *g = min;
            }
        }
        return plan;
    }
    let plain_rate = rate(&plan).unwrap_or(0.0);
    // Coordinate ascent: each free sequence in turn takes its best γ given the others, until
    // nothing changes (a few passes at most; every move strictly raises the rate).
    for _ in 0..4 {
        let mut changed = false;
        for i in 0..candidates.len() {
            let Choice::Free { min, max } = candidates[i].choice else {
                continue;
            };
            // A drafter that must first catch up on a long prompt is worth it only if
            // speculation could win that time back over the rest of the request: the round's
            // share of the catch-up looks small, but it is paid in full now.
            if candidates[i].catch_up > 0 && !probe_pays(candidates, i, &plan, max, costs) {
                continue;
            }
            let before = plan[i];
            let mut best = (before, rate(&plan).unwrap_or(0.0));
            for g in std::iter::once(0).chain(min..=max) {
                plan[i] = g;
                let r = rate(&plan).unwrap_or(0.0);
                if r > best.1 * (1.0 + 1e-9) {
                    best = (g, r);
                }
            }
            changed |= best.0 != before;
            plan[i] = best.0;
        }
        if !changed {
            break;
        }
    }
    if rate(&plan).unwrap_or(0.0) < plain_rate * min_gain {
        for (g, c) in plan.iter_mut().zip(candidates) {
            if matches!(c.choice, Choice::Free { .. }) {
                *g = 0;
            }
        }
    }
    plan
}

/// Whether speculating could pay for `candidates[i]`'s drafter catching up on what it missed:
/// what its speculation could save over the request's remaining tokens (the best γ up to
/// `max`, the others as in `plan`) against the catch-up.
///
/// A sequence free to speculate is priced at full acceptance: pricing a first round at its
/// estimate declined catch-ups the rounds after them repaid (run P: 1.13x → 1.10x, the losses
/// where turn-two prompts are long). A probe is priced halfway between its estimate and full
/// acceptance: hopeful, since its estimate is stale and finding out is what it is for, but not
/// blind. Priced at full acceptance, a drafter accepted 16–40% of the time kept probing, and
/// each probe first took in everything decoded since the last (up to 256 tokens, 200 ms): 930
/// ms of catch-ups in 1.2 s of drafting rounds, 0.85x. A drafter that loses even at full
/// acceptance is never probed.
///
/// Savings are priced in the batch the request is in, not as if it were alone: beside other
/// sequences a plain step already yields several tokens per weight pass, so one request's
/// drafts save far less (measured, two requests: a plain step 13 ms for 2 tokens; both
/// drafting 2 tokens, 38–41 ms for ~5.8). Priced alone, probes paid 100–200 ms catch-ups in
/// batches where the next round found speculation did not pay.
fn probe_pays(
    candidates: &[Candidate],
    i: usize,
    plan: &[usize],
    max: usize,
    costs: &CostModel,
) -> bool {
    let c = &candidates[i];
    let alpha = match c.choice {
        Choice::Probe { .. } => (c.alpha + 1.0) / 2.0,
        _ => 1.0,
    };
    let Some(save) = could_save(candidates, i, plan, (alpha, max), costs) else {
        return true;
    };
    save > 0.0 && costs.catch_up_seconds(c.catch_up) < save
}

/// The most time `candidates[i]` speculating could save over its remaining tokens at
/// acceptance rate `alpha`, the others keeping `plan`, outside any prompt chunk (a chunk is one
/// round; the savings come in the rounds after): per round, what the round's tokens would cost
/// at the batch's plain price per token less what the round costs, times the rounds its
/// remaining tokens take. `None` until costs are measured.
fn could_save(
    candidates: &[Candidate],
    i: usize,
    plan: &[usize],
    (alpha, max): (f64, usize),
    costs: &CostModel,
) -> Option<f64> {
    let mut at = candidates.to_vec();
    at[i].alpha = alpha;
    at[i].catch_up = 0;
    let mut plan = plan.to_vec();
    plan[i] = 0;
    let plain = forecast_round(&at, &plan, 0, costs)?;
    let per_token = plain.seconds() / plain.tokens;
    let mut best = 0.0_f64;
    for g in 1..=max.max(1) {
        plan[i] = g;
        let f = forecast_round(&at, &plan, 0, costs)?;
        let rounds = candidates[i].remaining as f64 / expected_tokens(alpha, g);
        best = best.max(rounds * (f.tokens * per_token - f.seconds()));
    }
    Some(best)
}

/// What a round run with a plan is expected to yield and cost, by part, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RoundForecast {
    pub tokens: f64,
    pub draft: f64,
    pub catch_up: f64,
    pub verify: f64,
    /// Sequences drafting, draft steps, and the target forward's width.
    pub drafting: usize,
    pub steps: usize,
    pub width: usize,
}

impl RoundForecast {
    pub fn seconds(&self) -> f64 {
        self.draft + self.catch_up + self.verify
    }
}

/// The forecast of a round run with `plan`, once costs are measured. A catch-up is charged
/// only the share of it this round's expected tokens carry of what the request may still
/// generate.
pub fn forecast_round(
    candidates: &[Candidate],
    plan: &[usize],
    base_width: usize,
    costs: &CostModel,
) -> Option<RoundForecast> {
    let mut f = RoundForecast {
        width: base_width,
        ..RoundForecast::default()
    };
    for (c, &g) in candidates.iter().zip(plan) {
        let t = expected_tokens(c.alpha, g);
        f.tokens += t;
        f.width += g + 1;
        f.steps = f.steps.max(g);
        f.drafting += usize::from(g > 0);
        if g > 0 && c.catch_up > 0 {
            f.catch_up +=
                costs.catch_up_seconds(c.catch_up) * (t / c.remaining.max(1) as f64).min(1.0);
        }
    }
    f.draft = costs.draft_seconds(f.steps, f.drafting)?;
    // Prices measured on shallower contexts (start-up's, other requests') would make drafting
    // beside a deep context look cheap: a step costs at least the start-up line at the depth
    // of the deepest drafting sequence.
    let deepest = candidates
        .iter()
        .zip(plan)
        .filter(|&(_, &g)| g > 0)
        .map(|(c, _)| c.depth)
        .max()
        .unwrap_or(0);
    f.draft = f
        .draft
        .max(f.steps as f64 * costs.draft_step_floor(deepest));
    f.verify = costs.verify_seconds(f.width)?;
    Some(f)
}

/// Expected decoding tokens per second of a round run with `plan`, once costs are measured.
/// A prompt chunk in the same forward is charged to its prompt, not to decoding: its part of
/// the forward (what the forward costs with it over what it costs without) is taken off the
/// round, so plans are compared at the prices they have between prefills. Charged to decoding,
/// the chunk made any round look slow, so drafting and catch-ups beside it looked nearly free
/// (measured: a 164-token chunk beside a 171-token catch-up and 8 draft steps, a 473 ms round
/// where the chunk alone took 188, which the new request waited for its first token).
fn round_rate(
    candidates: &[Candidate],
    plan: &[usize],
    base_width: usize,
    costs: &CostModel,
) -> Option<f64> {
    let f = forecast_round(candidates, plan, base_width, costs)?;
    let n = candidates.len();
    let chunk = costs.verify_seconds(base_width + n)? - costs.verify_seconds(n)?;
    let seconds = f.seconds() - chunk;
    (seconds > 0.0).then(|| f.tokens / seconds)
}

/// The server-wide estimate of how much faster decoding runs than plain decoding would: tokens
/// emitted per round over the round's measured cost in plain steps, decayed over recent decode
/// rounds of every request (a plain round counts as 1 token for 1 step). Below 1, speculation
/// is losing time: the `tandem_spec_speedup_estimate` gauge and its alert.
#[derive(Clone, Copy, Debug, Default)]
pub struct SpeedupEstimate {
    tokens: f64,
    cost: f64,
}

impl SpeedupEstimate {
    /// Weight of the past per recorded round (≈ the last few hundred rounds).
    const DECAY: f64 = 0.995;

    /// A decode round that drafted `drafted` tokens of which `accepted` stood.
    pub fn record(&mut self, drafted: usize, accepted: usize, costs: &CostModel) {
        let (tokens, cost) = if drafted == 0 {
            (1.0, 1.0)
        } else {
            match costs.round_cost(drafted) {
                Some(c) => ((accepted + 1) as f64, c),
                None => return,
            }
        };
        self.tokens = Self::DECAY * self.tokens + tokens;
        self.cost = Self::DECAY * self.cost + cost;
    }

    /// The estimate, once any round was recorded.
    pub fn get(&self) -> Option<f64> {
        (self.cost > 0.0).then(|| self.tokens / self.cost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(draft: f64, verify: &[f64]) -> CostModel {
        let mut c = CostModel::new(verify.len());
        c.record_draft(draft * 3.0, 0.0, 3, 1);
        for (i, &v) in verify.iter().enumerate() {
            c.record_verify(v, i + 1);
        }
        c
    }

    /// The plan for one request alone, as its governor sees it.
    fn solo(g: &Governor, c: &CostModel) -> usize {
        plan_round(&[g.candidate(1, 8, 0, 1000)], 0, c, 1.02)[0]
    }

    #[test]
    fn expected_speedup_matches_the_paper() {
        // α = 0: every round yields one token at the round's cost.
        assert!((expected_speedup(0.0, 4, 2.0) - 0.5).abs() < 1e-12);
        // α = 1: γ + 1 tokens.
        assert!((expected_speedup(1.0, 3, 2.0) - 2.0).abs() < 1e-12);
        // α = 0.5, γ = 2: 1 + 0.5 + 0.25 tokens.
        assert!((expected_speedup(0.5, 2, 1.0) - 1.75).abs() < 1e-12);
    }

    #[test]
    fn bad_drafter_means_plain_good_drafter_means_speculation() {
        // Draft step 20% of a target step; verifying 2-9 tokens costs 1.2x-3x a step.
        let c = costs(0.2, &[1.0, 1.2, 1.4, 1.6, 1.9, 2.2, 2.5, 2.8, 3.0]);
        let mut bad = Governor::new(GovernorConfig::default());
        let mut good = Governor::new(GovernorConfig::default());
        for _ in 0..30 {
            bad.record_round(4, 0);
            good.record_round(4, 4);
        }
        assert_eq!(solo(&bad, &c), 0, "α ≈ {}", bad.alpha());
        assert!(solo(&good, &c) >= 4, "α ≈ {}", good.alpha());
    }

    #[test]
    fn a_short_gamma_that_always_agrees_does_not_hold_speculation_back() {
        // Run N's costs (f16 target, as-is drafter, in target steps): a draft step 0.65, a
        // 2-5 token verification 1.27-1.75. At γ = 1 every draft stood for 50 rounds: γ = 1
        // barely beats plain (2 tokens for 1.92 steps), γ = 3 or 4 wins ~1.1x. Decayed per
        // round, α stayed at 11/12 and the plan never left γ = 1.
        let c = costs(0.65, &[1.0, 1.27, 1.45, 1.59, 1.75]);
        let mut g = Governor::new(GovernorConfig::default());
        for _ in 0..50 {
            g.record_round(1, 1);
        }
        assert!(g.alpha() > 0.96, "α ≈ {}", g.alpha());
        assert!(solo(&g, &c) >= 3, "γ = {}, α ≈ {}", solo(&g, &c), g.alpha());
    }

    #[test]
    fn a_rounds_first_draft_step_is_priced_apart_from_the_rest() {
        let mut c = CostModel::new(5);
        // A γ = 3 round: its first step took in two tokens (8 ms), the later ones one (5 ms).
        c.record_draft(0.018, 0.008, 3, 1);
        assert!((c.draft_seconds(1, 1).unwrap() - 0.008).abs() < 1e-12);
        assert!((c.draft_seconds(4, 1).unwrap() - 0.023).abs() < 1e-12);
        // γ = 1 rounds measure only first steps; the later-step price stands.
        c.record_draft(0.009, 0.009, 1, 1);
        assert!((c.draft_seconds(3, 1).unwrap() - 0.018).abs() < 1e-12);
        // Untimed first steps count as average ones.
        let mut u = CostModel::new(5);
        u.record_draft(0.012, 0.0, 3, 1);
        assert!((u.draft_seconds(2, 1).unwrap() - 0.008).abs() < 1e-12);
    }

    #[test]
    fn a_new_request_starts_from_what_the_drafter_achieved_lately() {
        let c = costs(0.45, &[1.0, 1.1, 1.2, 1.3, 1.4, 1.5]);
        let cfg = GovernorConfig::default();
        // Knowing nothing, a request decodes plainly first (it will probe).
        assert_eq!(solo(&Governor::new(cfg), &c), 0);
        // After other requests' drafts mostly stood, a new one speculates from its first round.
        let mut pooled = AcceptanceRate::new(0.5);
        for _ in 0..40 {
            pooled.record(4, 4, 0.99);
        }
        pooled.record(4, 1, 0.99);
        assert!(pooled.get() > 0.9, "{}", pooled.get());
        let g = Governor::with_prior(cfg, pooled.get());
        assert!(solo(&g, &c) >= 3, "γ = {}", solo(&g, &c));
        // The prior weighs two drafts: a request whose own drafts fail leaves it quickly.
        let mut g = g;
        for _ in 0..3 {
            g.record_round(2, 0);
        }
        assert_eq!(solo(&g, &c), 0, "α ≈ {}", g.alpha());
    }

    #[test]
    fn costly_drafter_is_refused_even_when_it_agrees() {
        // A drafter as slow as the target cannot win at any α on this cost curve.
        let c = costs(1.0, &[1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0]);
        let mut g = Governor::new(GovernorConfig::default());
        for _ in 0..30 {
            g.record_round(3, 3);
        }
        assert_eq!(solo(&g, &c), 0);
    }

    #[test]
    fn a_wide_forward_slower_than_as_many_steps_is_not_kept() {
        let mut c = CostModel::new(4);
        c.record_verify(1.0, 1);
        c.record_verify(1.5, 2);
        c.mark_provisional();
        c.record_verify(1.0, 1);
        // Kept, it would replace the start-up price as the width's only live one.
        c.record_verify(2.4, 2);
        assert_eq!(
            c.verify_seconds(2),
            Some(1.5),
            "2.4 > 2 steps of 1.0: noise"
        );
        c.record_verify(1.8, 2);
        assert_eq!(
            c.verify_seconds(2),
            Some(1.8),
            "a plausible live price replaces it"
        );
        // Before a live one-token price, nothing is judged.
        let mut fresh = CostModel::new(4);
        fresh.record_verify(9.0, 3);
        assert_eq!(fresh.verify_seconds(3), Some(9.0));
    }

    #[test]
    fn plain_decoding_probes_again_and_recovers() {
        let c = costs(0.1, &[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]);
        let cfg = GovernorConfig::default();
        let mut g = Governor::new(cfg);
        for _ in 0..40 {
            g.record_round(2, 0);
        }
        assert_eq!(solo(&g, &c), 0);
        let mut probed = false;
        for _ in 0..cfg.probe_every {
            let gamma = solo(&g, &c);
            if gamma > 0 {
                probed = true;
                g.record_round(gamma, gamma);
            } else {
                g.record_round(0, 0);
            }
        }
        assert!(probed, "a probe within probe_every plain steps");
        for _ in 0..30 {
            g.record_round(4, 4);
        }
        assert!(solo(&g, &c) > 0, "speculation comes back once drafts agree");
    }

    #[test]
    fn probes_that_fail_wait_longer_each_time() {
        let c = costs(0.1, &[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]);
        let cfg = GovernorConfig::default();
        let mut g = Governor::new(cfg);
        for _ in 0..40 {
            g.record_round(2, 0);
        }
        // Every probe is rejected: the gaps between probes grow 16, 32, 64.
        let mut probes = Vec::new();
        for step in 0..200 {
            let gamma = solo(&g, &c);
            if gamma > 0 {
                probes.push(step);
            }
            g.record_round(gamma, 0);
        }
        let gaps: Vec<usize> = probes.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.len() >= 2, "{probes:?}");
        assert!(gaps.windows(2).all(|w| w[1] >= 2 * w[0] - 1), "{gaps:?}");
    }

    #[test]
    fn no_probe_when_catching_up_costs_more_than_it_could_save() {
        let mut c = costs(0.5, &[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]);
        c.record_catch_up(10.0, 100);
        let probe = |catch_up, remaining| Candidate {
            alpha: 0.5,
            choice: Choice::Probe { gamma: 1, max: 8 },
            catch_up,
            remaining,
            depth: 0,
        };
        // At best (all accepted, γ = 8) rounds cost 5.8 steps for 9 tokens: 1.55x, saving a
        // third of a step per token; catching up on 100 tokens costs 10 steps.
        assert_eq!(plan_round(&[probe(100, 20)], 0, &c, 1.02), vec![0]);
        assert_eq!(plan_round(&[probe(100, 200)], 0, &c, 1.02), vec![1]);
        // A drafter that loses even when always right is never probed.
        let slow = costs(2.0, &[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]);
        assert_eq!(plan_round(&[probe(0, 10_000)], 0, &slow, 1.02), vec![0]);
    }

    #[test]
    fn a_probe_beside_other_requests_is_priced_in_their_batch() {
        // A forward costs 0.9 steps plus 0.1 a token; a draft step 0.3; catching up on the
        // 100-token prompt 20 steps.
        let verify: Vec<f64> = (1..=16).map(|w| 0.9 + 0.1 * w as f64).collect();
        let mut c = costs(0.3, &verify);
        c.record_catch_up(20.0, 100);
        // A probe is priced at 95% acceptance (halfway from its 90% estimate to all).
        let probe = Candidate {
            alpha: 0.9,
            choice: Choice::Probe { gamma: 1, max: 8 },
            catch_up: 100,
            remaining: 60,
            depth: 0,
        };
        // Alone, a round of 8 drafts yields 7.4 tokens for 4.2 steps: it could save 26 steps
        // over 60 tokens, so the catch-up is worth trying.
        assert_eq!(plan_round(&[probe], 0, &c, 1.02), vec![1]);
        // Beside a request decoding plainly, a plain step already yields 2 tokens for 1.1
        // steps; drafting 8 saves 0.3 steps a round, 2.5 over the request: not worth 20.
        let plain = Candidate {
            choice: Choice::Fixed(0),
            catch_up: 0,
            ..probe
        };
        assert_eq!(plan_round(&[probe, plain], 0, &c, 1.02), vec![0, 0]);
        // With no catch-up to pay, the probe goes ahead in the batch too.
        let caught_up = Candidate {
            catch_up: 0,
            ..probe
        };
        assert_eq!(plan_round(&[caught_up, plain], 0, &c, 1.02), vec![1, 0]);
    }

    #[test]
    fn a_drafter_that_keeps_failing_is_not_probed_at_the_price_of_a_catch_up() {
        let verify: Vec<f64> = (1..=16).map(|w| 0.9 + 0.1 * w as f64).collect();
        let mut c = costs(0.3, &verify);
        // Catching up on the 100 tokens decoded since the last probe: 10 steps.
        c.record_catch_up(10.0, 100);
        let probe = |alpha| Candidate {
            alpha,
            choice: Choice::Probe { gamma: 1, max: 8 },
            catch_up: 100,
            remaining: 60,
            depth: 0,
        };
        // Every draft accepted would save 32 steps; at 60% (halfway from its 20%) under 8.
        assert_eq!(plan_round(&[probe(0.2)], 0, &c, 1.05), vec![0]);
        assert_eq!(plan_round(&[probe(0.9)], 0, &c, 1.05), vec![1]);
        // With nothing to catch up on (prompt lookup), probing costs a draft and is made.
        let free = Candidate {
            catch_up: 0,
            ..probe(0.2)
        };
        assert_eq!(plan_round(&[free], 0, &c, 1.05), vec![1]);
    }

    #[test]
    fn unmeasured_costs_start_with_the_smallest_gamma() {
        let g = Governor::new(GovernorConfig::default());
        let plan = plan_round(&[g.candidate(2, 8, 0, 100)], 0, &CostModel::new(9), 1.02);
        assert_eq!(plan, vec![2]);
    }

    #[test]
    fn verify_costs_are_interpolated_between_measured_widths() {
        let mut c = CostModel::new(9);
        c.record_draft(0.0, 0.0, 1, 1);
        c.record_verify(1.0, 1);
        c.record_verify(2.0, 3);
        // Width 2 halfway between widths 1 and 3; width 6 extrapolated per token, and so is a
        // width past the model's range.
        assert!((c.round_cost(1).unwrap() - 1.5).abs() < 1e-12);
        assert!((c.round_cost(5).unwrap() - 4.0).abs() < 1e-12);
        assert!((c.verify_seconds(30).unwrap() - 20.0).abs() < 1e-12);
        assert_eq!(c.verify_seconds(0), Some(0.0));
    }

    #[test]
    fn fresher_prices_of_other_widths_bound_a_stale_one() {
        let mut c = CostModel::new(8);
        c.record_verify(1.0, 1);
        // Width 3 last ran deep in long prompts; width 4 runs now, on short ones.
        c.record_verify(1.6, 3);
        c.record_verify(1.4, 4);
        assert_eq!(c.verify_seconds(3), Some(1.4));
        assert_eq!(c.verify_seconds(4), Some(1.4));
        assert!(c.verify_seconds(2).unwrap() <= 1.4);
        assert_eq!(c.verify_seconds(1), Some(1.0));
        // And a wide forward priced on short contexts is not cheaper than a narrow one that
        // ran since, deeper in.
        c.record_verify(1.5, 2);
        assert_eq!(c.verify_seconds(3), Some(1.5));
        assert_eq!(c.verify_seconds(4), Some(1.5));
        c.record_verify(1.4, 4);
        c.record_verify(1.3, 3);
        assert_eq!(c.verify_seconds(3), Some(1.3));
        // So one of three requests drafting a token is not mistaken for free.
        let mut g = Governor::new(GovernorConfig::default());
        for _ in 0..30 {
            g.record_round(4, 4);
        }
        c.record_draft(0.5, 0.0, 1, 1);
        let three = [g.candidate(1, 1, 0, 100); 3];
        assert_eq!(plan_round(&three, 0, &c, 1.02), vec![0, 0, 0]);
    }

    #[test]
    fn drafting_that_runs_over_its_forecast_is_priced_higher() {
        let mut c = CostModel::new(4);
        c.record_draft(1.0, 0.0, 1, 1);
        c.record_verify(1.0, 1);
        assert_eq!(c.draft_seconds(1, 1), Some(1.0));
        for _ in 0..50 {
            let f = c.draft_seconds(2, 1).unwrap();
            c.record_draft_forecast(f, 2.0 * 1.5);
        }
        assert!((c.draft_seconds(1, 1).unwrap() - 1.5).abs() < 0.01);
        // A drafter whose steps cost 0.5 of a target step when lucky and 0.75 typically, at
        // 70% acceptance: worth it by the luckiest price, not by the typical one.
        let g = Governor::with_prior(GovernorConfig::default(), 0.7);
        let mut lucky = CostModel::new(4);
        lucky.record_draft(0.5, 0.0, 1, 1);
        for w in 1..=4 {
            lucky.record_verify(1.0 + 0.05 * (w - 1) as f64, w);
        }
        let one = [g.candidate(1, 3, 0, 100)];
        assert!(plan_round(&one, 0, &lucky, 1.05)[0] > 0);
        for _ in 0..50 {
            let f = lucky.draft_seconds(1, 1).unwrap();
            lucky.record_draft_forecast(f, 0.75);
        }
        assert_eq!(plan_round(&one, 0, &lucky, 1.05), vec![0]);
    }

    #[test]
    fn draft_steps_are_priced_by_how_many_sequences_draft() {
        let mut c = CostModel::new(8);
        c.record_draft(3.0, 0.0, 3, 1);
        c.record_draft(6.0, 0.0, 2, 4);
        assert_eq!(c.draft_seconds(2, 1), Some(2.0));
        assert_eq!(c.draft_seconds(1, 4), Some(3.0));
        // Between measured sizes: interpolated; past the largest: the largest's price.
        assert!((c.draft_seconds(1, 2).unwrap() - 5.0 / 3.0).abs() < 1e-12);
        assert_eq!(c.draft_seconds(1, 8), Some(3.0));
        assert_eq!(c.draft_seconds(0, 8), Some(0.0));
        assert_eq!(CostModel::new(8).draft_seconds(1, 1), None);
    }

    #[test]
    fn a_batch_speculates_less_when_verification_width_is_not_free() {
        // Forwards of up to 4 tokens cost about one step (weights streamed once), wider ones
        // pay per token; prompt lookup drafts for free.
        let verify: Vec<f64> = (1..=72)
            .map(|w: usize| 1.0 + 0.02 * w.min(4) as f64 + 0.3 * w.saturating_sub(4) as f64)
            .collect();
        let c = costs(0.0, &verify);
        let mut g = Governor::new(GovernorConfig::default());
        for _ in 0..30 {
            g.record_round(4, 2);
            g.record_round(4, 4);
        }
        let one = g.candidate(1, 8, 0, 1000);
        let alone = plan_round(&[one], 0, &c, 1.02);
        assert!(alone[0] >= 2, "alone it speculates: {alone:?}");
        let batch = plan_round(&[one; 8], 0, &c, 1.02);
        assert!(
            batch.iter().sum::<usize>() < 8 * alone[0],
            "eight at once draft less each: {batch:?} vs {alone:?}"
        );
        let rate = |plan: &[usize]| round_rate(&[one; 8], plan, 0, &c).unwrap();
        assert!(rate(&batch) >= rate(&[0; 8]) && rate(&batch) >= rate(&[alone[0]; 8]));
        // Beside a prompt chunk the forward is wide anyway: a few more tokens cost little next
        // to the whole round, so drafting still pays.
        let with_prefill = plan_round(&[one], 64, &c, 1.02);
        assert!(with_prefill[0] > 0, "{with_prefill:?}");
    }

    #[test]
    fn a_drafter_far_behind_speculates_only_if_enough_output_is_left() {
        let mut c = costs(0.2, &[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]);
        // Taking in a context token costs a tenth of a step.
        c.record_catch_up(50.0, 500);
        let mut g = Governor::new(GovernorConfig::default());
        for _ in 0..30 {
            g.record_round(4, 4);
        }
        let near_end = plan_round(&[g.candidate(1, 8, 500, 3)], 0, &c, 1.02);
        assert_eq!(
            near_end,
            vec![0],
            "500 tokens to catch up for 3 tokens of output"
        );
        let lots_left = plan_round(&[g.candidate(1, 8, 500, 2000)], 0, &c, 1.02);
        assert!(lots_left[0] > 0, "{lots_left:?}");
    }

    #[test]
    fn a_long_catch_up_is_not_hidden_beside_a_prompt_chunk() {
        let mut c = costs(0.5, &[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]);
        // Taking in a context token costs 0.15 steps: a 900-token prompt costs 135 steps,
        // more than speculation could save over 64 tokens even if every draft stood.
        c.record_catch_up(15.0, 100);
        let mut good = Governor::new(GovernorConfig::default());
        for _ in 0..30 {
            good.record_round(4, 4);
        }
        // Beside a 200-token prompt chunk the round is long anyway, so this round's share of
        // the catch-up looks cheap; it is paid in full all the same.
        let far_behind = plan_round(&[good.candidate(1, 8, 900, 64)], 200, &c, 1.02);
        assert_eq!(far_behind, vec![0]);
        let close = plan_round(&[good.candidate(1, 8, 20, 64)], 200, &c, 1.02);
        assert!(close[0] > 0, "{close:?}");
    }

    #[test]
    fn drafting_beside_a_prompt_chunk_is_priced_as_between_prefills() {
        // A forward costs 0.9 steps plus 0.1 a token; a draft step half a step.
        let verify: Vec<f64> = (1..=256).map(|w| 0.9 + 0.1 * w as f64).collect();
        let c = costs(0.5, &verify);
        // At 60% acceptance a round of one draft yields 1.6 tokens for 1.6 steps: no gain.
        let so_so = Governor::with_prior(GovernorConfig::default(), 0.6).candidate(1, 8, 0, 100);
        assert_eq!(plan_round(&[so_so], 0, &c, 1.02), vec![0]);
        // Beside a 164-token chunk the forward costs 17.4 steps whatever this request does;
        // charged to decoding, drafting looked 1.5x faster, yet it only makes the chunk's
        // prompt wait longer for its first token.
        assert_eq!(plan_round(&[so_so], 164, &c, 1.02), vec![0]);
        // A drafter that pays between prefills still drafts beside one.
        let good = Governor::with_prior(GovernorConfig::default(), 0.95).candidate(1, 8, 0, 100);
        assert!(plan_round(&[good], 0, &c, 1.02)[0] > 0);
        assert!(plan_round(&[good], 164, &c, 1.02)[0] > 0);
    }

    #[test]
    fn live_measurements_replace_start_up_ones() {
        let mut c = CostModel::new(2);
        c.record_verify(1.0, 1);
        c.record_verify(2.0, 2);
        c.record_draft(0.5, 0.0, 1, 1);
        c.mark_provisional();
        assert_eq!(c.verify_seconds(1), Some(1.0));
        c.record_verify(1.3, 1);
        c.record_draft(0.7, 0.0, 1, 1);
        assert_eq!(c.verify_seconds(1), Some(1.3));
        assert_eq!(c.draft_seconds(1, 1), Some(0.7));
        // Live ones then keep the minimum of the window; a width measured only at start-up
        // drifts as its nearest live-measured neighbour did (1.0 -> 1.3).
        c.record_verify(1.5, 1);
        assert_eq!(c.verify_seconds(1), Some(1.3));
        assert!((c.verify_seconds(2).unwrap() - 2.6).abs() < 1e-12);
        c.record_verify(2.1, 2);
        assert_eq!(c.verify_seconds(2), Some(2.1));
    }

    #[test]
    fn catch_ups_are_priced_by_size() {
        let mut c = CostModel::new(4);
        assert_eq!(c.catch_up_seconds(100), 0.0);
        c.record_catch_up(0.5, 32);
        c.record_catch_up(2.0, 256);
        // Each size class at its own price per token; an unmeasured one at the nearest
        // measured class, the dearer one on a tie.
        assert!((c.catch_up_seconds(40) - 40.0 * 0.5 / 32.0).abs() < 1e-12);
        assert!((c.catch_up_seconds(300) - 300.0 * 2.0 / 256.0).abs() < 1e-12);
        assert!((c.catch_up_seconds(1000) - 1000.0 * 2.0 / 256.0).abs() < 1e-12);
        assert!((c.catch_up_seconds(3) - 3.0 * 0.5 / 32.0).abs() < 1e-12);
        assert!((c.catch_up_seconds(100) - 100.0 * 0.5 / 32.0).abs() < 1e-12);
        assert_eq!(c.catch_up_seconds(0), 0.0);
        let mut tie = CostModel::new(4);
        tie.record_catch_up(0.5, 32);
        tie.record_catch_up(1.0, 128);
        assert!((tie.catch_up_seconds(64) - 64.0 / 128.0).abs() < 1e-12);
    }

    #[test]
    fn catch_ups_past_the_deepest_measured_size_are_extrapolated() {
        let mut c = CostModel::new(4);
        c.record_catch_up(31.0 * 0.9e-3, 31);
        c.record_catch_up(255.0 * 1.0e-3, 255);
        // 0.1 ms a token dearer over 224 more tokens: a 767-token prompt at 1.0 ms a token
        // plus 512/224 of that.
        let want = 767.0 * (1.0e-3 + 0.1e-3 * 512.0 / 224.0);
        assert!((c.catch_up_seconds(767) - want).abs() < 1e-9);
        // Sizes measured, or below the deepest, keep their class's price.
        assert!((c.catch_up_seconds(200) - 0.2).abs() < 1e-9);
        assert!((c.catch_up_seconds(40) - 40.0 * 0.9e-3).abs() < 1e-9);
    }

    #[test]
    fn draft_steps_at_depth_cost_at_least_the_start_up_line() {
        let verify = [
            0.012, 0.0125, 0.013, 0.0135, 0.014, 0.0145, 0.015, 0.0155, 0.016,
        ];
        let mut c = costs(0.003, &verify);
        c.record_catch_up(0.6, 600);
        // Start-up: 3 ms a step at 30 tokens of context, 4 ms at 250.
        c.record_draft_depths((30, 0.003), (250, 0.004));
        assert_eq!(c.draft_step_floor(10), 0.0);
        let deep = 0.003 + 0.001 * 1970.0 / 220.0;
        assert!((c.draft_step_floor(2000) - deep).abs() < 1e-12);
        let free = |depth| Candidate {
            alpha: 0.9,
            choice: Choice::Free { min: 1, max: 8 },
            catch_up: 600,
            remaining: 200,
            depth,
        };
        // Shallow, a draft step is a quarter of a plain step and the catch-up repays itself;
        // at a depth of 2000 a step costs as much as the plain step it should save.
        assert!(plan_round(&[free(40)], 0, &c, 1.05)[0] > 0);
        assert_eq!(plan_round(&[free(2000)], 0, &c, 1.05), vec![0]);
        let f = forecast_round(&[free(2000)], &[4], 0, &c).unwrap();
        assert!((f.draft - 4.0 * deep).abs() < 1e-12, "{f:?}");
    }

    #[test]
    fn fixed_choices_are_kept() {
        let c = costs(1.0, &[1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0]);
        let fixed = Candidate {
            alpha: 0.0,
            choice: Choice::Fixed(3),
            catch_up: 0,
            remaining: 100,
            depth: 0,
        };
        assert_eq!(plan_round(&[fixed], 0, &c, 1.02), vec![3]);
    }

    #[test]
    fn speedup_estimate_weighs_tokens_against_round_costs() {
        let mut c = CostModel::new(4);
        c.record_verify(0.010, 1);
        c.record_verify(0.015, 4);
        c.record_draft(0.002, 0.0, 1, 1);
        let mut e = SpeedupEstimate::default();
        assert_eq!(e.get(), None);
        e.record(0, 0, &c);
        assert!(
            (e.get().unwrap() - 1.0).abs() < 1e-12,
            "plain rounds are 1x"
        );
        let mut e = SpeedupEstimate::default();
        // γ = 3: 3 drafts (0.006 s) + a 4-token verify (0.015 s) = 2.1 plain steps.
        e.record(3, 3, &c);
        assert!((e.get().unwrap() - 4.0 / 2.1).abs() < 1e-9);
        let mut e = SpeedupEstimate::default();
        e.record(3, 0, &c);
        assert!(
            e.get().unwrap() < 1.0,
            "every draft rejected: slower than plain"
        );
    }
}
