//! Speculation settings that change while the server runs.
//!
//! Why it exists: operators tune lenience and γ under live traffic (the admin API) without a
//! restart. The settings live behind one lock the scheduler reads at the start of every round,
//! so a change applies from the next round to every request that did not pin its own values.
//! Validation is pure and names the key that is wrong; the config file and the CLI go through
//! the same [`SpeculationOverride`], so every boundary checks the same way.

use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

use super::gamma::{Gamma, GammaPolicy, RoundGamma};
use super::tree_nodes::TreeNodes;
use crate::sampling::{DraftGate, GateOverride, Lenience};

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
        }
    }
}

/// What one request speculates under in one round: its own settings over the live ones, with
/// the lenience the queue's depth gives a request that set none. Resolved by one function,
/// [`SpeculationSettings::for_request`], so drafting, verification and the shaping of token
/// trees read the same values (a tree is drafted only where it can be verified: under exact
/// acceptance).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoundSettings {
    /// The request's γ policy under the live settings (before the context and token caps).
    pub gamma: RoundGamma,
    pub lenience: Lenience,
    pub gate: DraftGate,
    pub confidence_pricing: bool,
    /// Alternative nodes a round may add beside its chain (0 under lenient acceptance).
    pub tree_nodes: usize,
}

/// A bad setting: `key` names it the way the config file and the admin API do.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{key} {reason}")]
pub struct SettingsError {
    pub key: &'static str,
    pub reason: String,
}

impl SettingsError {
    fn new(key: &'static str, reason: impl ToString) -> Self {
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

    /// The settings a request with these overrides speculates under in a round while `queued`
    /// requests wait (see [`RoundSettings`]).
    pub fn for_request(&self, request: &RequestSpeculation, queued: usize) -> RoundSettings {
        let lenience = request
            .lenience
            .unwrap_or_else(|| self.lenience_for_queue(queued));
        RoundSettings {
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

/// The speculation knobs, written once for every place that sets them: the admin API's `PUT`
/// body, the config file's `[speculation]` table, the CLI's flags, and a request's
/// `speculative` object. Raw values as they arrive; [`SpeculationOverride::apply`] checks a
/// server-wide change and [`SpeculationOverride::for_request`] a request's, each rule once,
/// with the key named. A request may set every knob but the server's policy
/// ([`SpeculationOverride::SERVER_ONLY`]).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeculationOverride {
    pub enabled: Option<bool>,
    pub adaptive: Option<bool>,
    pub gamma: Option<usize>,
    pub gamma_min: Option<usize>,
    pub gamma_max: Option<usize>,
    pub lenience: Option<f32>,
    pub under_load_queue_depth: Option<usize>,
    pub lenience_under_load: Option<f32>,
    pub use_egag: Option<bool>,
    pub egag_threshold: Option<f32>,
    pub egag_ema_beta: Option<f32>,
    pub draft_p_min: Option<f32>,
    pub confidence_pricing: Option<bool>,
    pub tree_nodes: Option<usize>,
}

/// A request's own speculation settings, checked: what its `speculative` object set.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RequestSpeculation {
    pub gamma: GammaPolicy,
    /// 1 is exact; `None` follows the server's live setting, round by round.
    pub lenience: Option<Lenience>,
    pub gate: GateOverride,
    pub confidence_pricing: Option<bool>,
    pub tree_nodes: Option<TreeNodes>,
}

impl SpeculationOverride {
    /// The knobs of the server's policy, which only an operator sets.
    pub const SERVER_ONLY: [&'static str; 5] = [
        "adaptive",
        "gamma_min",
        "gamma_max",
        "under_load_queue_depth",
        "lenience_under_load",
    ];

    /// A request's settings from these knobs, in an engine whose largest γ is `gamma_limit`:
    /// `enabled: false` decodes plainly, a `gamma` is fixed, `enabled: true` speculates even
    /// where the server does not; the server's policy knobs are refused.
    pub fn for_request(&self, gamma_limit: usize) -> Result<RequestSpeculation, SettingsError> {
        let server_only = [
            self.adaptive.is_some(),
            self.gamma_min.is_some(),
            self.gamma_max.is_some(),
            self.under_load_queue_depth.is_some(),
            self.lenience_under_load.is_some(),
        ];
        if let Some(i) = server_only.iter().position(|&set| set) {
            return Err(SettingsError::new(
                Self::SERVER_ONLY[i],
                "is the server's policy (the admin API and the config file set it), not a \
                 request's",
            ));
        }
        let gamma = match (self.enabled, self.gamma) {
            (Some(false), _) => GammaPolicy::Off,
            (_, Some(g)) => GammaPolicy::Fixed(
                Gamma::within(g, gamma_limit).map_err(|e| SettingsError::new("gamma", e))?,
            ),
            (Some(true), None) => GammaPolicy::On,
            (None, None) => GammaPolicy::Server,
        };
        let lenience = self
            .lenience
            .map(Lenience::try_from)
            .transpose()
            .map_err(|e| SettingsError::new("lenience", e))?;
        let gate = self.gate_override();
        gate.check()
            .map_err(|(key, reason)| SettingsError::new(key, reason))?;
        let tree_nodes = self
            .tree_nodes
            .map(|n| TreeNodes::within(n, gamma_limit))
            .transpose()
            .map_err(|e| SettingsError::new("tree_nodes", e))?;
        Ok(RequestSpeculation {
            gamma,
            lenience,
            gate,
            confidence_pricing: self.confidence_pricing,
            tree_nodes,
        })
    }

    /// `current` with this update applied, or why the result would be invalid.
    pub fn apply(
        &self,
        current: &SpeculationSettings,
        gamma_limit: usize,
    ) -> Result<SpeculationSettings, SettingsError> {
        let gamma = |key, v: usize| Gamma::try_from(v).map_err(|e| SettingsError::new(key, e));
        let lenience = |key, v: f32| Lenience::try_from(v).map_err(|e| SettingsError::new(key, e));
        let mut s = *current;
        if let Some(v) = self.enabled {
            s.enabled = v;
        }
        if let Some(v) = self.adaptive {
            s.adaptive = v;
        }
        if let Some(v) = self.gamma {
            s.gamma = gamma("gamma", v)?;
            // A fixed γ is what an operator who sets only `gamma` means.
            if self.adaptive.is_none() {
                s.adaptive = false;
            }
        }
        if let Some(v) = self.gamma_min {
            s.gamma_min = gamma("gamma_min", v)?;
        }
        if let Some(v) = self.gamma_max {
            s.gamma_max = gamma("gamma_max", v)?;
        }
        if let Some(v) = self.lenience {
            s.lenience = lenience("lenience", v)?;
        }
        if let Some(v) = self.under_load_queue_depth {
            s.under_load_queue_depth = v;
        }
        if let Some(v) = self.lenience_under_load {
            s.lenience_under_load = lenience("lenience_under_load", v)?;
        }
        s.gate = self.gate_override().over(s.gate);
        if let Some(v) = self.confidence_pricing {
            s.confidence_pricing = v;
        }
        if let Some(v) = self.tree_nodes {
            s.tree_nodes = TreeNodes::within(v, gamma_limit)
                .map_err(|e| SettingsError::new("tree_nodes", e))?;
        }
        s.validate(gamma_limit)?;
        Ok(s)
    }
}

impl SpeculationOverride {
    /// The confidence gate's knobs as an override of a gate.
    fn gate_override(&self) -> GateOverride {
        GateOverride {
            use_egag: self.use_egag,
            egag_threshold: self.egag_threshold,
            egag_ema_beta: self.egag_ema_beta,
            draft_p_min: self.draft_p_min,
        }
    }
}

/// The shared, live settings: cheap to read every round, changed by the admin API.
#[derive(Clone, Debug)]
pub struct LiveSettings {
    inner: Arc<RwLock<SpeculationSettings>>,
    gamma_limit: usize,
}

impl LiveSettings {
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

    /// Applies a change atomically; on error nothing changes.
    pub fn update(
        &self,
        update: &SpeculationOverride,
    ) -> Result<SpeculationSettings, SettingsError> {
        let mut guard = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let next = update.apply(&guard, self.gamma_limit)?;
        *guard = next;
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_resolution_for_drafting_verifying_and_trees() {
        let live = SpeculationOverride {
            tree_nodes: Some(3),
            under_load_queue_depth: Some(4),
            lenience_under_load: Some(0.5),
            ..Default::default()
        }
        .apply(&SpeculationSettings::default(), 8)
        .unwrap();
        let none = RequestSpeculation::default();
        // Idle: exact, the server's tree, the server's adaptive γ.
        let idle = live.for_request(&none, 0);
        assert_eq!((idle.lenience, idle.tree_nodes), (Lenience::EXACT, 3));
        assert_eq!(idle.gamma, RoundGamma::Adaptive { min: 1, max: 8 });
        // Under load a request that set no lenience is lenient, and so drafts no tree it could
        // not verify.
        let loaded = live.for_request(&none, 5);
        assert_eq!(loaded.lenience.get(), 0.5);
        assert_eq!(loaded.tree_nodes, 0);
        // A request's own settings win.
        let own = live.for_request(
            &RequestSpeculation {
                lenience: Some(Lenience::EXACT),
                tree_nodes: Some(TreeNodes::within(1, 8).unwrap()),
                ..Default::default()
            },
            5,
        );
        assert_eq!((own.lenience, own.tree_nodes), (Lenience::EXACT, 1));
        let pricing = RequestSpeculation {
            confidence_pricing: Some(true),
            ..Default::default()
        };
        assert!(live.for_request(&pricing, 0).confidence_pricing);
        assert!(!live.for_request(&none, 0).confidence_pricing);
    }

    #[test]
    fn a_request_sets_its_own_knobs_checked_and_never_the_servers_policy() {
        let r = SpeculationOverride {
            gamma: Some(3),
            lenience: Some(0.5),
            tree_nodes: Some(2),
            draft_p_min: Some(0.4),
            ..Default::default()
        }
        .for_request(8)
        .unwrap();
        assert_eq!(r.gamma, GammaPolicy::Fixed(Gamma::try_from(3).unwrap()));
        assert_eq!(r.lenience.map(Lenience::get), Some(0.5));
        assert_eq!(r.tree_nodes.map(TreeNodes::get), Some(2));
        assert_eq!(r.gate.draft_p_min, Some(0.4));
        let off = SpeculationOverride {
            enabled: Some(false),
            gamma: Some(3),
            ..Default::default()
        };
        assert_eq!(off.for_request(8).unwrap().gamma, GammaPolicy::Off);
        for (bad, key) in [
            (
                SpeculationOverride {
                    gamma: Some(9),
                    ..Default::default()
                },
                "gamma",
            ),
            (
                SpeculationOverride {
                    tree_nodes: Some(8),
                    ..Default::default()
                },
                "tree_nodes",
            ),
            (
                SpeculationOverride {
                    egag_threshold: Some(2.0),
                    ..Default::default()
                },
                "egag_threshold",
            ),
            (
                SpeculationOverride {
                    gamma_min: Some(2),
                    ..Default::default()
                },
                "gamma_min",
            ),
            (
                SpeculationOverride {
                    adaptive: Some(false),
                    ..Default::default()
                },
                "adaptive",
            ),
        ] {
            assert_eq!(bad.for_request(8).unwrap_err().key, key);
        }
    }

    #[test]
    fn a_change_is_logged_in_words() {
        let before = SpeculationSettings::default();
        assert_eq!(describe_change(&before, &before), "no change");
        let after = SpeculationOverride {
            lenience: Some(0.5),
            gamma: Some(3),
            ..Default::default()
        }
        .apply(&before, 8)
        .unwrap();
        let words = describe_change(&before, &after);
        assert!(words.contains("lenience 1.0 -> 0.5"), "{words}");
        assert!(words.contains("gamma 4 -> 3"), "{words}");
        assert!(!words.contains("SpeculationSettings"), "{words}");
    }

    #[test]
    fn bad_values_name_their_key_and_change_nothing() {
        let live = LiveSettings::new(SpeculationSettings::default(), 8).unwrap();
        let cases: [(SpeculationOverride, &str); 7] = [
            (
                SpeculationOverride {
                    tree_nodes: Some(8),
                    ..Default::default()
                },
                "tree_nodes",
            ),
            (
                SpeculationOverride {
                    lenience: Some(0.0),
                    ..Default::default()
                },
                "lenience",
            ),
            (
                SpeculationOverride {
                    lenience: Some(1.5),
                    ..Default::default()
                },
                "lenience",
            ),
            (
                SpeculationOverride {
                    gamma: Some(0),
                    ..Default::default()
                },
                "gamma",
            ),
            (
                SpeculationOverride {
                    gamma_max: Some(9),
                    ..Default::default()
                },
                "gamma_max",
            ),
            (
                SpeculationOverride {
                    gamma_min: Some(5),
                    gamma_max: Some(3),
                    ..Default::default()
                },
                "gamma_min",
            ),
            (
                SpeculationOverride {
                    lenience_under_load: Some(f32::NAN),
                    ..Default::default()
                },
                "lenience_under_load",
            ),
        ];
        for (update, key) in cases {
            let e = live.update(&update).unwrap_err();
            assert_eq!(e.key, key, "{e}");
            assert_eq!(live.get(), SpeculationSettings::default());
        }
    }

    #[test]
    fn valid_changes_apply_and_a_lone_gamma_means_fixed() {
        let live = LiveSettings::new(SpeculationSettings::default(), 8).unwrap();
        let s = live
            .update(&SpeculationOverride {
                lenience: Some(0.5),
                gamma: Some(3),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(
            (s.lenience.get(), s.gamma.get(), s.adaptive),
            (0.5, 3, false)
        );
        assert_eq!(live.get(), s);
        let s = live
            .update(&SpeculationOverride {
                adaptive: Some(true),
                enabled: Some(false),
                ..Default::default()
            })
            .unwrap();
        assert!(s.adaptive && !s.enabled && s.gamma.get() == 3);
    }

    #[test]
    fn lenience_drops_only_above_the_queue_depth() {
        let half = Lenience::try_from(0.5).unwrap();
        let s = SpeculationSettings {
            lenience: Lenience::EXACT,
            under_load_queue_depth: 4,
            lenience_under_load: half,
            ..Default::default()
        };
        assert_eq!(s.lenience_for_queue(4), Lenience::EXACT);
        assert_eq!(s.lenience_for_queue(5), half);
        let off = SpeculationSettings {
            under_load_queue_depth: 0,
            lenience_under_load: half,
            ..Default::default()
        };
        assert_eq!(off.lenience_for_queue(100), Lenience::EXACT);
    }

    #[test]
    fn a_policy_comes_to_a_round_gamma_under_the_live_settings() {
        let on = SpeculationSettings::default();
        let fixed = SpeculationSettings {
            adaptive: false,
            ..on
        };
        let off = SpeculationSettings {
            enabled: false,
            ..on
        };
        let adaptive = RoundGamma::Adaptive { min: 1, max: 8 };
        let three = GammaPolicy::Fixed(Gamma::try_from(3).unwrap());
        let cases = [
            (GammaPolicy::Server, on, adaptive),
            (GammaPolicy::Server, fixed, RoundGamma::Fixed(4)),
            (GammaPolicy::Server, off, RoundGamma::Plain),
            (GammaPolicy::On, on, adaptive),
            (GammaPolicy::On, fixed, RoundGamma::Fixed(4)),
            (GammaPolicy::On, off, adaptive),
            (GammaPolicy::Off, on, RoundGamma::Plain),
            (GammaPolicy::Adaptive, off, adaptive),
            (three, off, RoundGamma::Fixed(3)),
        ];
        for (policy, live, want) in cases {
            assert_eq!(live.round_gamma(policy), want, "{policy:?} under {live:?}");
        }
    }
}
