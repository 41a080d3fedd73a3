//! Configuration: a TOML file (the embedded `config/default.toml` unless one is given), checked
//! at start-up so a bad value fails with a message naming its key.

use std::path::Path;

use serde::Deserialize;

use crate::model::WeightsDtype;

/// The embedded default configuration.
pub const DEFAULT_CONFIG: &str = include_str!("../config/default.toml");

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("config: {0}")]
    Parse(String),
    #[error("config: {key} {reason}")]
    Invalid { key: &'static str, reason: String },
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub model: ModelConfig,
    pub runtime: RuntimeConfig,
    pub generation: GenerationDefaults,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub path: String,
    pub weights_dtype: String,
    pub context_length: usize,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    pub threads: usize,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerationDefaults {
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repetition_penalty: f32,
}

impl Config {
    /// Parses and validates TOML text. Keys left out take the embedded defaults.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let mut base: toml::Table = DEFAULT_CONFIG
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::Parse(format!("embedded default: {e}")))?;
        let user: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::Parse(e.to_string()))?;
        merge(&mut base, user);
        let cfg: Config = toml::Value::Table(base)
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Parse(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Self::from_toml(&text)
    }

    pub fn embedded() -> Self {
        Self::from_toml("").expect("the embedded default config is valid")
    }

    pub fn weights_dtype(&self) -> WeightsDtype {
        self.model.weights_dtype.parse().expect("validated at load")
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, reason: String| Err(ConfigError::Invalid { key, reason });
        if let Err(e) = self.model.weights_dtype.parse::<WeightsDtype>() {
            return invalid("model.weights_dtype", e);
        }
        if self.model.path.trim().is_empty() {
            return invalid("model.path", "must not be empty".into());
        }
        if self.model.context_length < 2 {
            return invalid("model.context_length", "must be >= 2".into());
        }
        let g = &self.generation;
        if g.max_tokens == 0 {
            return invalid("generation.max_tokens", "must be >= 1".into());
        }
        if !(g.temperature >= 0.0 && g.temperature.is_finite()) {
            return invalid(
                "generation.temperature",
                "must be a finite number >= 0".into(),
            );
        }
        if !(g.top_p > 0.0 && g.top_p <= 1.0) {
            return invalid("generation.top_p", "must be in (0, 1]".into());
        }
        if !(0.0..=1.0).contains(&g.min_p) {
            return invalid("generation.min_p", "must be in [0, 1]".into());
        }
        if !(g.repetition_penalty > 0.0 && g.repetition_penalty.is_finite()) {
            return invalid(
                "generation.repetition_penalty",
                "must be a finite number > 0".into(),
            );
        }
        Ok(())
    }
}

/// Overlays `user` on `base`, table by table.
fn merge(base: &mut toml::Table, user: toml::Table) {
    for (k, v) in user {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(u)) => merge(b, u),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_default_is_valid() {
        let c = Config::embedded();
        assert_eq!(c.model.path, "default");
        assert!(c.model.context_length >= 2);
    }

    #[test]
    fn errors_name_the_key() {
        let e = Config::from_toml("[generation]\ntop_p = 0.0").unwrap_err();
        assert!(e.to_string().contains("generation.top_p"), "{e}");
        let e = Config::from_toml("[model]\nweights_dtype = \"q3\"").unwrap_err();
        assert!(e.to_string().contains("model.weights_dtype"), "{e}");
        let e = Config::from_toml("[model]\nbogus = 1").unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
        let e = Config::from_toml("[generation]\nmax_tokens = \"many\"").unwrap_err();
        assert!(e.to_string().contains("max_tokens"), "{e}");
    }

    #[test]
    fn user_values_override_defaults_only_where_given() {
        let c = Config::from_toml("[model]\ncontext_length = 128").unwrap();
        assert_eq!(c.model.context_length, 128);
        assert_eq!(c.model.path, "default");
    }
}
