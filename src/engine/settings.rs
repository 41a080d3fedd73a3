//! Speculation settings that change while the server runs.
//!
//! Why it exists: operators tune lenience and γ under live traffic (the admin API) without a
//! restart. The settings live behind one lock the scheduler reads at the start of every round,
//! so a change applies from the next round to every request that did not pin its own values.
//! Validation is pure and names the key that is wrong.

use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

/// The server-wide speculation policy.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SpeculationSettings {
    /// Speculate at all (requests may still switch it off for themselves).
    pub enabled: bool,
    /// Let the governor pick γ per request and round (between `gamma_min` and `gamma_max`);
    /// otherwise every round drafts `gamma`.
    pub adaptive: bool,
    pub gamma: usize,
    pub gamma_min: usize,
    pub gamma_max: usize,
    /// Relaxed acceptance in (0, 1]; 1 is exact.
    pub lenience: f32,
    /// Above this many waiting requests, `lenience_under_load` replaces `lenience` (0 = off).
    pub under_load_queue_depth: usize,
    pub lenience_under_load: f32,
}

impl Default for SpeculationSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            adaptive: true,
            gamma: 4,
            gamma_min: 1,
            gamma_max: 8,
            lenience: 1.0,
            under_load_queue_depth: 0,
            lenience_under_load: 1.0,
        }
    }
}

/// A bad setting: `key` names it the way the config file and the admin API do.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{key} {reason}")]
pub struct SettingsError {
    pub key: &'static str,
    pub reason: String,
}

fn lenience_ok(l: f32) -> bool {
    l > 0.0 && l <= 1.0
}

impl SpeculationSettings {
    /// Checks every value; `gamma_limit` is the largest γ the engine was started for (its KV
    /// headroom and measured verification costs).
    pub fn validate(&self, gamma_limit: usize) -> Result<(), SettingsError> {
        let bad = |key, reason: String| Err(SettingsError { key, reason });
        if !lenience_ok(self.lenience) {
            return bad(
                "lenience",
                format!("must be in (0, 1], got {}", self.lenience),
            );
        }
        if !lenience_ok(self.lenience_under_load) {
            return bad(
                "lenience_under_load",
                format!("must be in (0, 1], got {}", self.lenience_under_load),
            );
        }
        for (key, v) in [
            ("gamma", self.gamma),
            ("gamma_min", self.gamma_min),
            ("gamma_max", self.gamma_max),
        ] {
            if v == 0 {
                return bad(key, "must be >= 1".into());
            }
            if v > gamma_limit {
                return bad(
                    key,
                    format!("must be <= {gamma_limit} (engine.max_gamma), got {v}"),
                );
            }
        }
        if self.gamma_min > self.gamma_max {
            return bad(
                "gamma_min",
                format!(
                    "must be <= gamma_max ({}), got {}",
                    self.gamma_max, self.gamma_min
                ),
            );
        }
        Ok(())
    }

    /// γ as the `tandem_spec_gamma` gauge shows it: the fixed γ, γmax when adaptive, 0 when off.
    pub fn gamma_gauge(&self) -> usize {
        match (self.enabled, self.adaptive) {
            (false, _) => 0,
            (true, true) => self.gamma_max,
            (true, false) => self.gamma,
        }
    }

    /// The lenience for requests that did not set one, given how many requests wait.
    pub fn lenience_for_queue(&self, queued: usize) -> f32 {
        if self.under_load_queue_depth > 0 && queued > self.under_load_queue_depth {
            self.lenience_under_load
        } else {
            self.lenience
        }
    }
}

/// A partial change, as the admin API's `PUT` body carries it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettingsUpdate {
    pub enabled: Option<bool>,
    pub adaptive: Option<bool>,
    pub gamma: Option<usize>,
    pub gamma_min: Option<usize>,
    pub gamma_max: Option<usize>,
    pub lenience: Option<f32>,
    pub under_load_queue_depth: Option<usize>,
    pub lenience_under_load: Option<f32>,
}

impl SettingsUpdate {
    /// `current` with this update applied, or why the result would be invalid.
    pub fn apply(
        &self,
        current: &SpeculationSettings,
        gamma_limit: usize,
    ) -> Result<SpeculationSettings, SettingsError> {
        let mut s = *current;
        if let Some(v) = self.enabled {
            s.enabled = v;
        }
        if let Some(v) = self.adaptive {
            s.adaptive = v;
        }
        if let Some(v) = self.gamma {
            s.gamma = v;
            // A fixed γ is what an operator who sets only `gamma` means.
            if self.adaptive.is_none() {
                s.adaptive = false;
            }
        }
        if let Some(v) = self.gamma_min {
            s.gamma_min = v;
        }
        if let Some(v) = self.gamma_max {
            s.gamma_max = v;
        }
        if let Some(v) = self.lenience {
            s.lenience = v;
        }
        if let Some(v) = self.under_load_queue_depth {
            s.under_load_queue_depth = v;
        }
        if let Some(v) = self.lenience_under_load {
            s.lenience_under_load = v;
        }
        s.validate(gamma_limit)?;
        Ok(s)
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

    /// Applies a change atomically; on error nothing changes.
    pub fn update(&self, update: &SettingsUpdate) -> Result<SpeculationSettings, SettingsError> {
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
    fn bad_values_name_their_key_and_change_nothing() {
        let live = LiveSettings::new(SpeculationSettings::default(), 8).unwrap();
        let cases: [(SettingsUpdate, &str); 6] = [
            (
                SettingsUpdate {
                    lenience: Some(0.0),
                    ..Default::default()
                },
                "lenience",
            ),
            (
                SettingsUpdate {
                    lenience: Some(1.5),
                    ..Default::default()
                },
                "lenience",
            ),
            (
                SettingsUpdate {
                    gamma: Some(0),
                    ..Default::default()
                },
                "gamma",
            ),
            (
                SettingsUpdate {
                    gamma_max: Some(9),
                    ..Default::default()
                },
                "gamma_max",
            ),
            (
                SettingsUpdate {
                    gamma_min: Some(5),
                    gamma_max: Some(3),
                    ..Default::default()
                },
                "gamma_min",
            ),
            (
                SettingsUpdate {
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
            .update(&SettingsUpdate {
                lenience: Some(0.5),
                gamma: Some(3),
                ..Default::default()
            })
            .unwrap();
        assert_eq!((s.lenience, s.gamma, s.adaptive), (0.5, 3, false));
        assert_eq!(live.get(), s);
        let s = live
            .update(&SettingsUpdate {
                adaptive: Some(true),
                enabled: Some(false),
                ..Default::default()
            })
            .unwrap();
        assert!(s.adaptive && !s.enabled && s.gamma == 3);
    }

    #[test]
    fn lenience_drops_only_above_the_queue_depth() {
        let s = SpeculationSettings {
            lenience: 1.0,
            under_load_queue_depth: 4,
            lenience_under_load: 0.5,
            ..Default::default()
        };
        assert_eq!(s.lenience_for_queue(4), 1.0);
        assert_eq!(s.lenience_for_queue(5), 0.5);
        let off = SpeculationSettings {
            under_load_queue_depth: 0,
            lenience_under_load: 0.5,
            ..Default::default()
        };
        assert_eq!(off.lenience_for_queue(100), 1.0);
    }
}
