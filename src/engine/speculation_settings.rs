//! Speculation settings that change while the server runs.
//!
//! Why it exists: operators tune lenience and γ under live traffic (the admin API) without a
//! restart. The settings live behind one lock the scheduler reads at the start of every round,
//! so a change applies from the next round to every request that did not pin its own values.
//! Validation is pure and names the key that is wrong; the config file and the CLI go through
//! the same [`SpeculationKnobs`], so every boundary checks the same way.

use std::sync::{Arc, RwLock};

use serde::Serialize;

use super::gamma::{Gamma, GammaPolicy, RoundGamma};
use super::tree_nodes::TreeNodes;
use crate::sampling::{DraftGate, Lenience, RequestGate, SampledDrafts};

/// The server-wide speculation policy.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SpeculationSettings {
    /// Speculate at all (requests may still switch it off for themselves).
    pub enabled: bool,
    /// Let the governor pick γ per request and round (between `gamma_min` and `gamma_max`);
    /// otherwise every round drafts `gamma`.
    pub adaptive: bool,
    pub gamma: Gamma,
    pub gamma_min: Gamma,
    pub gamma_max: Gamma,
    pub lenience: Lenience,
    /// Above this many waiting requests, `lenience_under_load` replaces `lenience` (0 = off).
    pub under_load_queue_depth: usize,
    pub lenience_under_load: Lenience,
    /// When a draft model stops a round early because it is unsure ([`DraftGate`]).
    #[serde(flatten)]
    pub gate: DraftGate,
    /// After drafting, the governor cuts the round's chain where the tokens left are, by the
    /// drafter's confidence in each (prompt lookup: its match length and whether earlier
    /// matches agree; a draft model: its probability), not worth their rows of the
    /// verification. A governor setting, for any drafter; requests with a fixed γ keep their
    /// chains.
    pub confidence_pricing: bool,
    /// The most alternative nodes a round may add beside its drafted chain, verified with it
    /// as one token tree (0: chains only). The governor keeps only those forecast to pay.
    pub tree_nodes: TreeNodes,
    /// How a sampled request's draft model or head proposes: drawn from its distribution, its
    /// likeliest tokens as point masses, or whichever its verified positions say keeps more.
    pub sampled_drafts: SampledDrafts,
}

impl Default for SpeculationSettings {
    fn default() -> Self {
        let g = |v| Gamma::try_from(v).expect("a valid default");
        Self {
            enabled: true,
            adaptive: true,
            gamma: g(4),
            gamma_min: g(1),
            gamma_max: g(8),
            lenience: Lenience::EXACT,
            under_load_queue_depth: 0,
            lenience_under_load: Lenience::EXACT,
            gate: DraftGate::OFF,
            confidence_pricing: false,
            tree_nodes: TreeNodes::NONE,
            sampled_drafts: SampledDrafts::Auto,
        }
    }
}

/// What one request speculates under in one round: its own settings over the live ones, with
/// the lenience the queue's depth gives a request that set none. Resolved by one function,
/// [`SpeculationSettings::for_round`], so drafting, verification and the shaping of token
/// trees read the same values (a tree is drafted only where it can be verified: under exact
/// acceptance).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoundSpeculation {
    /// The request's γ policy under the live settings (before the context and token caps).
    pub gamma: RoundGamma,
    pub lenience: Lenience,
    pub gate: DraftGate,
    pub confidence_pricing: bool,
    /// Alternative nodes a round may add beside its chain (0 under lenient acceptance).
    pub tree_nodes: usize,
    pub sampled_drafts: SampledDrafts,
}

/// A bad setting: `key` names it the way the config file and the admin API do.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{key} {reason}")]
pub struct SettingsError {
    pub key: &'static str,
    pub reason: String,
}

impl SettingsError {
    pub(super) fn new(key: &'static str, reason: impl ToString) -> Self {
        Self {
            key,
            reason: reason.to_string(),
        }
    }
}

impl SpeculationSettings {
    /// Checks what the types cannot: γ against the largest the engine was started for (its KV
    /// headroom and measured verification costs), and `gamma_min <= gamma_max`.
    pub fn validate(&self, gamma_limit: usize) -> Result<(), SettingsError> {
        for (key, g) in [
            ("gamma", self.gamma),
            ("gamma_min", self.gamma_min),
            ("gamma_max", self.gamma_max),
        ] {
            Gamma::within(g.get(), gamma_limit).map_err(|e| SettingsError::new(key, e))?;
        }
        self.gate
            .check()
            .map_err(|(key, reason)| SettingsError::new(key, reason))?;
        TreeNodes::within(self.tree_nodes.get(), gamma_limit)
            .map_err(|reason| SettingsError::new("tree_nodes", reason))?;
        if self.gamma_min > self.gamma_max {
            return Err(SettingsError::new(
                "gamma_min",
                format!(
                    "must be <= gamma_max ({}), got {}",
                    self.gamma_max, self.gamma_min
                ),
            ));
        }
        Ok(())
    }

    /// γ as the `tandem_spec_gamma` gauge shows it: the fixed γ, γmax when adaptive, 0 when off.
    pub fn gamma_gauge(&self) -> usize {
        match (self.enabled, self.adaptive) {
            (false, _) => 0,
            (true, true) => self.gamma_max.get(),
            (true, false) => self.gamma.get(),
        }
    }

    /// The lenience for requests that did not set one, given how many requests wait.
    pub fn lenience_for_queue(&self, queued: usize) -> Lenience {
        if self.under_load_queue_depth > 0 && queued > self.under_load_queue_depth {
            self.lenience_under_load
        } else {
            self.lenience
        }
    }

    /// What a request's γ policy comes to in a round run under these settings.
    pub fn round_gamma(&self, policy: GammaPolicy) -> RoundGamma {
        let adaptive = RoundGamma::Adaptive {
            min: self.gamma_min.get(),
            max: self.gamma_max.get(),
        };
        match policy {
            GammaPolicy::Off => RoundGamma::Plain,
            GammaPolicy::Fixed(g) => RoundGamma::Fixed(g.get()),
            GammaPolicy::Adaptive => adaptive,
            GammaPolicy::On if !self.enabled => adaptive,
            GammaPolicy::Server if !self.enabled => RoundGamma::Plain,
            GammaPolicy::Server | GammaPolicy::On if self.adaptive => adaptive,
            GammaPolicy::Server | GammaPolicy::On => RoundGamma::Fixed(self.gamma.get()),
        }
    }
}

/// A settings change in words, for the log: each setting that changed as `key old -> new`
/// (`lenience 1 -> 0.5, gamma 4 -> 3`), or `no change`.
pub fn describe_change(before: &SpeculationSettings, after: &SpeculationSettings) -> String {
    let (Ok(serde_json::Value::Object(b)), Ok(serde_json::Value::Object(a))) =
        (serde_json::to_value(before), serde_json::to_value(after))
    else {
        return format!("{before:?} -> {after:?}");
    };
    let changed: Vec<String> = a
        .iter()
        .filter(|(k, v)| b.get(*k) != Some(v))
        .map(|(k, v)| {
            let old = b.get(k).map_or("unset".to_string(), ToString::to_string);
            format!("{k} {old} -> {v}")
        })
        .collect();
    if changed.is_empty() {
        "no change".into()
    } else {
        changed.join(", ")
    }
}

/// The shared, live settings: cheap to read every round, changed by the admin API.
#[derive(Clone, Debug)]
pub struct LiveSpeculation {
    inner: Arc<RwLock<SpeculationSettings>>,
    gamma_limit: usize,
}

impl LiveSpeculation {
    pub fn new(initial: SpeculationSettings, gamma_limit: usize) -> Result<Self, SettingsError> {
        initial.validate(gamma_limit)?;
        Ok(Self {
            inner: Arc::new(RwLock::new(initial)),
            gamma_limit,
        })
    }

    pub fn get(&self) -> SpeculationSettings {
        // A poisoned lock still holds a validated value: writers validate before writing.
        *self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn gamma_limit(&self) -> usize {
        self.gamma_limit
    }

    /// Replaces every setting at once (a reloaded config file), checked first; on error
    /// nothing changes.
    pub fn replace(&self, next: SpeculationSettings) -> Result<SpeculationSettings, SettingsError> {
        next.validate(self.gamma_limit)?;
        *self.inner.write().unwrap_or_else(|e| e.into_inner()) = next;
        Ok(next)
    }

    /// Applies a change atomically: `change` gets the current settings and the engine's
    /// largest γ; on error nothing changes.
    pub fn update_with(
        &self,
        change: impl FnOnce(&SpeculationSettings, usize) -> Result<SpeculationSettings, SettingsError>,
    ) -> Result<SpeculationSettings, SettingsError> {
        let mut guard = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let next = change(&guard, self.gamma_limit)?;
        *guard = next;
        Ok(next)
    }
}

/// A request's own speculation settings, checked: what its `speculative` object set.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RequestSpeculation {
    pub gamma: GammaPolicy,
    /// 1 is exact; `None` follows the server's live setting, round by round.
    pub lenience: Option<Lenience>,
    pub gate: RequestGate,
    pub confidence_pricing: Option<bool>,
    pub tree_nodes: Option<TreeNodes>,
    pub sampled_drafts: Option<SampledDrafts>,
    /// Report who wrote each output token (`token_sources`): an output option of the request,
    /// which changes nothing it generates.
    pub token_sources: bool,
}

impl SpeculationSettings {
    /// The settings a request with these overrides speculates under in a round while `queued`
    /// requests wait (see [`RoundSpeculation`]).
    pub fn for_round(&self, request: &RequestSpeculation, queued: usize) -> RoundSpeculation {
        let lenience = request
            .lenience
            .unwrap_or_else(|| self.lenience_for_queue(queued));
        RoundSpeculation {
            gamma: self.round_gamma(request.gamma),
            lenience,
            gate: request.gate.over(self.gate),
            confidence_pricing: request
                .confidence_pricing
                .unwrap_or(self.confidence_pricing),
            tree_nodes: if lenience.is_exact() {
                request.tree_nodes.unwrap_or(self.tree_nodes).get()
            } else {
                0
            },
            sampled_drafts: request.sampled_drafts.unwrap_or(self.sampled_drafts),
        }
    }
}

#[cfg(test)]
mod tests;
