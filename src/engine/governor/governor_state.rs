//! Per-request acceptance: a decayed estimate of how often the drafter's tokens stand, kept
//! apart by the kind of draft (a model's, or prompt lookup's by the length of its match), and
//! when a request decoding plainly should probe speculation again.

use super::config::GovernorConfig;
use super::planner::{Candidate, Choice};
use super::proposal_rates::{a_rate, ProposalRates};
use super::request_ledger::RequestLedger;
use super::text_coverage::{PooledCoverage, PromptCoverage};
use crate::draft::Rehearsal;
use crate::sampling::ProposalEvidence;

/// A decayed acceptance rate: accepted / (accepted + rejected) over recent drafts, with two
/// pseudo-drafts at a prior rate so a first round does not decide everything.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
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
            prior: a_rate(prior),
        }
    }

    pub fn get(&self) -> f64 {
        (self.accepted + 2.0 * self.prior) / (self.accepted + self.rejected + 2.0)
    }

    /// An estimate that starts at `prior` with `stood` of `tried` rehearsed drafts as evidence,
    /// weighing at most [`REHEARSAL_WEIGHT`] drafts: text the request has not written yet may
    /// copy more or less than its prompt does, so its own drafts soon outweigh the rehearsal.
    fn rehearsed(prior: f64, tried: u32, stood: u32) -> Self {
        let mut rate = Self::new(prior);
        if tried > 0 {
            let scale = (REHEARSAL_WEIGHT / f64::from(tried)).min(1.0);
            rate.accepted = f64::from(stood.min(tried)) * scale;
            rate.rejected = f64::from(tried - stood.min(tried)) * scale;
        }
        rate
    }

    /// A round in which `accepted` of `drafted` drafts stood (a round stops at its first
    /// rejection, so a short count means exactly one rejection); the past weighs `decay` per
    /// drafted token.
    pub fn record(&mut self, drafted: usize, accepted: usize, decay: f64) {
        let fell = f64::from(u8::from(accepted < drafted));
        self.add(drafted, accepted as f64, fell, decay);
    }

    /// A sampled round of `drafted` drafts measured by its [`DraftChances`]: each tested draft
    /// adds its chance of standing where [`record`](Self::record) adds whether it stood.
    pub fn record_chances(&mut self, drafted: usize, chances: DraftChances, decay: f64) {
        let tested = chances.tested as f64;
        let stood = chances.sum.clamp(0.0, tested);
        self.add(drafted, stood, tested - stood, decay);
    }

    fn add(&mut self, drafted: usize, stood: f64, fell: f64, decay: f64) {
        if drafted == 0 || !(stood.is_finite() && fell.is_finite()) {
            return;
        }
        let d = decay.powi(drafted as i32);
        self.accepted = d * self.accepted + stood;
        self.rejected = d * self.rejected + fell;
    }
}

/// A sampled chain round's drafts as the acceptance rule saw them: the drafts it tested (up to
/// and including the first rejection) and the sum of each one's chance of standing,
/// `min(1, p(x) / (l · q(x)))` (q = 1 for a draft proposed without a distribution), which the
/// verification computed anyway. The sum's expectation is the number that stood, and it
/// spreads less: at T = 0.8 a prompt-lookup draft stands about a quarter of the time, and
/// counting coin flips, a request's first rounds could not tell a quarter from a half.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DraftChances {
    pub tested: usize,
    pub sum: f64,
}

/// Drafts a rehearsal on the prompt weighs at most, per kind, against the pooled prior's two.
/// A prompt predicts its answer's copying only loosely: on the development prompts, the
/// acceptance predicted with the rehearsal at this weight is off by 0.205 (root mean square)
/// against 0.220 without it, and at 2 and 4 drafts by 0.219 and 0.244.
pub const REHEARSAL_WEIGHT: f64 = 1.0;

/// Kinds of draft whose acceptance is kept apart (`Proposal::confidence_kind`): 0 for a
/// model's or a head's draft, 1 to 3 for prompt lookup's after a match of that many tokens (3
/// or more). A 3-token match goes on as the target does most of the time, a 1-token match
/// rarely: one rate for both plans every round as if it were the average one.
pub const DRAFT_KINDS: usize = 4;

/// An acceptance rate over every draft, and one per kind of draft.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct KindRates {
    all: AcceptanceRate,
    by_kind: [AcceptanceRate; DRAFT_KINDS],
}

impl KindRates {
    /// Rates that start at `prior`, every kind alike.
    pub fn new(prior: f64) -> Self {
        Self {
            all: AcceptanceRate::new(prior),
            by_kind: [AcceptanceRate::new(prior); DRAFT_KINDS],
        }
    }

    /// Rates that start where `pooled` stands now, each kind at its own, moved by how prompt
    /// lookup fared when `rehearsed` on the request's own prompt (for a drafter that drafts
    /// lookup's matches), and for a drafter of another vocabulary the model's drafts scaled by
    /// how much of the prompt it covers against the pooled text (`coverage`). The rate of all
    /// drafts is scaled too where every draft is the model's (nothing rehearsed).
    pub fn starting_from(
        pooled: &KindRates,
        rehearsed: Option<&Rehearsal>,
        coverage: Option<PromptCoverage>,
    ) -> Self {
        let r = rehearsed.copied().unwrap_or_default();
        let sum = |a: [u32; DRAFT_KINDS]| a.iter().sum::<u32>();
        let scale = coverage.map_or(1.0, |c| c.scale());
        let model_only = if rehearsed.is_none() { scale } else { 1.0 };
        let mut by_kind = [AcceptanceRate::new(0.5); DRAFT_KINDS];
        for (k, rate) in by_kind.iter_mut().enumerate() {
            let prior = pooled.by_kind[k].get() * if k == 0 { scale } else { 1.0 };
            *rate = AcceptanceRate::rehearsed(prior, r.tried[k], r.stood[k]);
        }
        Self {
            all: AcceptanceRate::rehearsed(
                pooled.all.get() * model_only,
                sum(r.tried),
                sum(r.stood),
            ),
            by_kind,
        }
    }

    /// The rate of drafts of `kind`, or of every draft when the kind is not known beforehand.
    pub fn get(&self, kind: Option<u8>) -> f64 {
        match kind.and_then(|k| self.by_kind.get(usize::from(k))) {
            Some(r) => r.get(),
            None => self.all.get(),
        }
    }

    /// A round in which `accepted` of `drafted` drafts of `kind` stood (see
    /// [`AcceptanceRate::record`]).
    pub fn record(&mut self, kind: u8, drafted: usize, accepted: usize, decay: f64) {
        self.all.record(drafted, accepted, decay);
        if let Some(r) = self.by_kind.get_mut(usize::from(kind)) {
            r.record(drafted, accepted, decay);
        }
    }

    /// A sampled round of `drafted` drafts of `kind` measured by its chances (see
    /// [`AcceptanceRate::record_chances`]).
    pub fn record_chances(&mut self, kind: u8, drafted: usize, chances: DraftChances, decay: f64) {
        self.all.record_chances(drafted, chances, decay);
        if let Some(r) = self.by_kind.get_mut(usize::from(kind)) {
            r.record_chances(drafted, chances, decay);
        }
    }
}

/// What every request of one temperature class drafted lately.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PooledClass {
    /// Acceptance by kind of draft: where a new request's governor starts.
    pub rates: KindRates,
    /// Where a new request's choice of proposal starts (sampled classes).
    pub proposals: ProposalRates,
    /// The prompt coverage of the requests behind `rates`' model drafts, for a drafter of
    /// another vocabulary (absent from tables remembered before it was kept).
    #[serde(default)]
    pub coverage: PooledCoverage,
}

/// One request's governor: its acceptance rates, and when it last speculated.
#[derive(Clone, Debug)]
pub struct Governor {
    cfg: GovernorConfig,
    rates: KindRates,
    /// Under sampling: how often drawn drafts and the drafter's likeliest tokens stand.
    proposals: ProposalRates,
    plain_steps: usize,
    /// Plain steps before the next probe.
    probe_wait: usize,
    /// The last round was a probe.
    probed: bool,
    /// The share of the prompt a drafter of another vocabulary could propose.
    prompt_coverage: Option<f64>,
    /// The most of its drafts a probe hopes will stand ([`PromptCoverage::ceiling`]).
    ceiling: f64,
    /// What drafting has gained this request: while it stands too far behind, it decodes
    /// plainly.
    own: RequestLedger,
}

impl Governor {
    /// A governor with no idea yet how well its drafter does (a prior rate of one half).
    pub fn new(cfg: GovernorConfig) -> Self {
        Self::with_prior(cfg, 0.5)
    }

    /// A governor whose acceptance estimate starts at `prior`: what the drafter achieved
    /// lately on other requests. Starting every request at one half would make each one
    /// decode plainly until probes proved the drafter, even when it is nearly always right.
    pub fn with_prior(cfg: GovernorConfig, prior: f64) -> Self {
        let pooled = PooledClass {
            rates: KindRates::new(prior),
            proposals: ProposalRates::default(),
            coverage: PooledCoverage::default(),
        };
        Self::starting_from(cfg, &pooled, None, None)
    }

    /// A governor whose estimates start where the server's pooled ones for the request's
    /// temperature class stand (each kind of draft at its own rate), moved by what the prompt
    /// shows (see [`KindRates::starting_from`]).
    pub fn starting_from(
        cfg: GovernorConfig,
        pooled: &PooledClass,
        rehearsed: Option<&Rehearsal>,
        coverage: Option<PromptCoverage>,
    ) -> Self {
        Self {
            cfg,
            rates: KindRates::starting_from(&pooled.rates, rehearsed, coverage),
            proposals: ProposalRates::starting_from(&pooled.proposals),
            plain_steps: 0,
            probe_wait: cfg.probe_every.max(1),
            probed: false,
            prompt_coverage: coverage.map(|c| c.prompt),
            ceiling: coverage.map_or(1.0, |c| c.ceiling()),
            own: RequestLedger::default(),
        }
    }

    /// The share of the prompt a drafter of another vocabulary could propose (`None` for a
    /// drafter of the target's vocabulary): what the pooled coverage records beside this
    /// request's drafts.
    pub fn prompt_coverage(&self) -> Option<f64> {
        self.prompt_coverage
    }

    /// The acceptance rate estimate over every kind of draft (see [`AcceptanceRate`]).
    pub fn alpha(&self) -> f64 {
        self.rates.get(None)
    }

    /// The estimate for drafts of `kind` (every draft's when `None`: not known beforehand).
    pub fn alpha_of(&self, kind: Option<u8>) -> f64 {
        self.rates.get(kind)
    }

    /// A sampled round's measure of both proposals (see [`ProposalRates`]).
    pub fn record_proposals(&mut self, e: &ProposalEvidence) {
        self.proposals.record(e, self.cfg.decay);
    }

    /// How often a drawn draft and the drafter's likeliest token would stand, by this request's
    /// positions so far.
    pub fn proposal_rates(&self) -> (f64, f64) {
        self.proposals.rates()
    }

    /// Whether a sampled request's drafter should propose its likeliest tokens.
    pub fn prefers_likeliest(&self) -> bool {
        self.proposals.prefers_likeliest()
    }

    /// A decoding round of `seconds` in which drafting saved this request `gain` seconds
    /// (negative: cost; 0 for a plain round): see [`RequestLedger`].
    pub fn record_gain(&mut self, seconds: f64, gain: f64) {
        self.own.record(seconds, gain);
    }

    /// Net seconds drafting saved this request so far (negative: lost).
    pub fn drafting_net(&self) -> f64 {
        self.own.net()
    }

    /// Whether its drafting has lost no more than its ledger allows (else it decodes plainly).
    pub fn may_draft(&self) -> bool {
        self.own.may_draft()
    }

    /// Records a round of a drafter with one kind of draft (kind 0): see
    /// [`Governor::record_round_of`].
    pub fn record_round(&mut self, drafted: usize, accepted: usize) {
        self.record_round_of(0, drafted, accepted);
    }

    /// Records a round: `accepted` of `drafted` drafts of `kind` stood (a round stops at its
    /// first rejection, so a short count means exactly one rejection).
    pub fn record_round_of(&mut self, kind: u8, drafted: usize, accepted: usize) {
        if self.count_round(drafted) {
            self.rates.record(kind, drafted, accepted, self.cfg.decay);
        }
    }

    /// Records a sampled chain round by its drafts' chances of standing (see
    /// [`DraftChances`]) rather than by which of them stood.
    pub fn record_round_chances(&mut self, kind: u8, drafted: usize, chances: DraftChances) {
        if self.count_round(drafted) {
            self.rates
                .record_chances(kind, drafted, chances, self.cfg.decay);
        }
    }

    /// A round's part in when to probe again; whether it drafted.
    fn count_round(&mut self, drafted: usize) -> bool {
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
            return false;
        }
        self.probed = self.plain_steps > 0 && self.plain_steps + 1 >= self.probe_wait;
        self.plain_steps = 0;
        true
    }

    /// This request's say in the next round's plan, γ in `gamma_min..=gamma_max` or plain:
    /// free, or a probe at `gamma_min` after enough plain steps so α stays current; plain
    /// while its drafting has lost more than its ledger allows ([`RequestLedger::may_draft`]).
    /// `kind`: the kind of draft the round will make, when known beforehand (its α is that
    /// kind's).
    pub fn candidate(
        &self,
        gamma_min: usize,
        gamma_max: usize,
        (catch_up, remaining): (usize, usize),
        kind: Option<u8>,
    ) -> Candidate {
        let gamma_min = gamma_min.max(1).min(gamma_max);
        let choice = if gamma_max == 0 || !self.own.may_draft() {
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
            alpha: self.alpha_of(kind),
            choice,
            catch_up,
            remaining,
            depth: 0,
            ceiling: self.ceiling,
        }
    }
}

#[cfg(test)]
mod tests;
