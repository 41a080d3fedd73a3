//! The speed governor (docs/speculation.md, "The governor"): each round, choose how many tokens every request drafts.
//!
//! Why it exists: speculation only pays when the drafter agrees with the target often enough to
//! cover what drafting and a wider verification cost, and on a compute-bound CPU a γ+1-token
//! verification is far from free. The governor tracks the request's acceptance rate α (a
//! decaying average) and the measured costs of a draft step and of target forwards of each
//! width, picks the γ that maximises the expected speedup, and decodes plainly when no γ beats
//! plain decoding, probing again now and then so a request that becomes predictable gets
//! speculation back. Pure arithmetic: no clocks, no I/O; the caller feeds it measurements.

mod branches;
mod config;
mod costs;
mod expert_prices;
mod governor_state;
mod ledger;
mod planner;
mod pooled;
mod proposal_rates;
mod remembered;
mod request_ledger;
mod round_bias;
mod speedup;
mod text_coverage;
mod verify_depth;

pub use branches::{
    acceptance_by_node, keep_alternatives, keep_chain, ConfidenceRates, RoundPrice, TreeOffer,
};
pub use config::GovernorConfig;
pub use costs::{CostEstimate, CostModel};
pub use expert_prices::ExpertPrices;
pub use governor_state::{
    AcceptanceRate, DraftChances, Governor, KindRates, PooledClass, DRAFT_KINDS,
};
pub use planner::{
    expected_speedup, expected_tokens, forecast_round, plan_round, recheck_prices, solo_rate,
    Candidate, Choice, RoundForecast, RECHECK_AFTER_ROUNDS,
};
pub use pooled::{PooledAcceptance, TEMPERATURE_CLASSES};
pub use proposal_rates::ProposalRates;
pub use remembered::{check_widths, still_holds, Remembered, PRICE_TOLERANCE};
pub use request_ledger::{round_gains, RequestLedger, RoundShare};
pub use speedup::SpeedupEstimate;
pub use text_coverage::{PooledCoverage, PromptCoverage};
pub use verify_depth::VerifyDepth;

#[cfg(test)]
pub(crate) mod test_support;
