//! The speculation knobs as they arrive (`SpeculationKnobs`), and a request's share of them
//! once checked (`RequestSpeculation`).
//!
//! Why it exists: the admin API, the config file, CLI flags and a request's `speculative`
//! object all set the same knobs; written once here, each is checked by one rule with its key
//! named, whichever way it came in.

use serde::de::value::MapAccessDeserializer;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use super::gamma::{Gamma, GammaPolicy};
use super::speculation_settings::{
    LiveSpeculation, RequestSpeculation, SettingsError, SpeculationSettings,
};
use super::tree_nodes::TreeNodes;
use crate::sampling::{DraftGate, FloatRule, Lenience, RequestGate, SampledDrafts};

/// The speculation knobs, written once for every place that sets them: the admin API's `PUT`
/// body, the config file's `[speculation]` table, the CLI's flags, and a request's
/// `speculative` object. Raw values as they arrive; [`SpeculationKnobs::apply`] checks a
/// server-wide change and [`SpeculationKnobs::for_request`] a request's, each rule once,
/// with the key named. A request may set every knob but the server's policy
/// ([`SpeculationKnobs::SERVER_ONLY`]). Float knobs stay `f64` until checked, so a
/// refusal quotes the number sent rather than its `f32` (1e-300 would be 0).
///
/// Only an object deserializes into it: serde's derive would also take an array, by position,
/// and name the first field's type in its refusal ("expected a boolean").
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub struct SpeculationKnobs {
    pub enabled: Option<bool>,
    pub adaptive: Option<bool>,
    pub gamma: Option<usize>,
    pub gamma_min: Option<usize>,
    pub gamma_max: Option<usize>,
    pub lenience: Option<f64>,
    pub under_load_queue_depth: Option<usize>,
    pub lenience_under_load: Option<f64>,
    pub use_egag: Option<bool>,
    pub egag_threshold: Option<f64>,
    pub egag_ema_beta: Option<f64>,
    pub draft_p_min: Option<f64>,
    pub confidence_pricing: Option<bool>,
    pub tree_nodes: Option<usize>,
    /// `auto`, `sample` or `likeliest` (see [`SampledDrafts`]).
    pub sampled_drafts: Option<String>,
    /// A request's output option, not a setting: report who wrote each output token.
    pub token_sources: Option<bool>,
}

impl<'de> Deserialize<'de> for SpeculationKnobs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectOnly;

        impl<'de> Visitor<'de> for ObjectOnly {
            type Value = SpeculationKnobs;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "an object of speculation settings, such as {\"gamma\": 3} or \
                     {\"enabled\": false}",
                )
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                // The derived (`remote = "Self"`) reader, which names an unknown key.
                SpeculationKnobs::deserialize(MapAccessDeserializer::new(map))
            }
        }

        deserializer.deserialize_map(ObjectOnly)
    }
}

impl SpeculationKnobs {
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
        let gate = self.gate_override()?;
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
            sampled_drafts: self.sampled_drafts()?,
            token_sources: self.token_sources.unwrap_or(false),
        })
    }

    /// `current` with this update applied, or why the result would be invalid.
    pub fn apply(
        &self,
        current: &SpeculationSettings,
        gamma_limit: usize,
    ) -> Result<SpeculationSettings, SettingsError> {
        if self.token_sources.is_some() {
            return Err(SettingsError::new(
                "token_sources",
                "is a request's output option (its `speculative` object sets it), not a server \
                 setting",
            ));
        }
        let gamma = |key, v: usize| Gamma::try_from(v).map_err(|e| SettingsError::new(key, e));
        let lenience = |key, v: f64| Lenience::try_from(v).map_err(|e| SettingsError::new(key, e));
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
        s.gate = self.gate_override()?.over(s.gate);
        if let Some(v) = self.confidence_pricing {
            s.confidence_pricing = v;
        }
        if let Some(v) = self.tree_nodes {
            s.tree_nodes = TreeNodes::within(v, gamma_limit)
                .map_err(|e| SettingsError::new("tree_nodes", e))?;
        }
        if let Some(v) = self.sampled_drafts()? {
            s.sampled_drafts = v;
        }
        s.validate(gamma_limit)?;
        Ok(s)
    }
}

impl SpeculationKnobs {
    fn sampled_drafts(&self) -> Result<Option<SampledDrafts>, SettingsError> {
        self.sampled_drafts
            .as_deref()
            .map(str::parse)
            .transpose()
            .map_err(|e| SettingsError::new("sampled_drafts", e))
    }

    /// The confidence gate's knobs as an override of a gate, each given one checked by its
    /// rule as sent and as narrowed.
    fn gate_override(&self) -> Result<RequestGate, SettingsError> {
        let narrow = |key, rule: FloatRule, sent: Option<f64>| {
            sent.map(|v| rule.narrow(v))
                .transpose()
                .map_err(|e| SettingsError::new(key, e))
        };
        Ok(RequestGate {
            use_egag: self.use_egag,
            egag_threshold: narrow(
                "egag_threshold",
                DraftGate::THRESHOLD_RULE,
                self.egag_threshold,
            )?,
            egag_ema_beta: narrow(
                "egag_ema_beta",
                DraftGate::EMA_BETA_RULE,
                self.egag_ema_beta,
            )?,
            draft_p_min: narrow("draft_p_min", DraftGate::P_MIN_RULE, self.draft_p_min)?,
        })
    }
}

impl LiveSpeculation {
    /// Applies a change atomically; on error nothing changes.
    pub fn update(&self, update: &SpeculationKnobs) -> Result<SpeculationSettings, SettingsError> {
        self.update_with(|current, gamma_limit| update.apply(current, gamma_limit))
    }
}
