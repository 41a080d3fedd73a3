//! Configuration: a TOML file (the embedded `config/default.toml` unless one is given), checked
//! at start-up so a bad value fails with a message naming its key.

use std::path::Path;

use serde::Deserialize;

use crate::engine::{SettingsUpdate, SpeculationSettings};
use crate::model::{KvDtype, WeightsDtype};

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
    pub server: ServerConfig,
    pub speculation: SpeculationConfig,
    pub engine: EngineSection,
    pub logging: LoggingConfig,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggingConfig {
    pub level: String,
    pub format: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    pub model_name: String,
    pub max_body_bytes: usize,
    pub admin_token: String,
    pub shutdown_grace_seconds: u64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeculationConfig {
    pub enabled: bool,
    pub draft_model: String,
    pub draft_weights_dtype: String,
    pub adaptive: bool,
    pub gamma: usize,
    pub gamma_min: usize,
    pub gamma_max: usize,
    pub lenience: f32,
    pub under_load_queue_depth: usize,
    pub lenience_under_load: f32,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSection {
    pub max_seqs: usize,
    pub max_queue: usize,
    pub prefill_chunk: usize,
    pub pipeline: bool,
    pub target_threads: usize,
    pub draft_threads: usize,
    pub max_gamma: usize,
}

/// The seeds' names for speculation keys, accepted as aliases.
const SPECULATION_ALIASES: [(&str, &str); 2] = [
    ("spec_length", "gamma"),
    ("use_speculative_decoding", "enabled"),
];

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub path: String,
    pub weights_dtype: String,
    pub context_length: usize,
    pub kv_cache_dtype: String,
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
        let mut user: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::Parse(e.to_string()))?;
        resolve_aliases(&mut user)?;
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

    pub fn kv_cache_dtype(&self) -> KvDtype {
        self.model
            .kv_cache_dtype
            .parse()
            .expect("validated at load")
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, reason: String| Err(ConfigError::Invalid { key, reason });
        if let Err(e) = self.model.weights_dtype.parse::<WeightsDtype>() {
            return invalid("model.weights_dtype", e);
        }
        if let Err(e) = self.model.kv_cache_dtype.parse::<KvDtype>() {
            return invalid("model.kv_cache_dtype", e);
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
        if let Err(e) = crate::logging::validate(&self.logging.level, &self.logging.format) {
            return match e {
                crate::logging::LoggingError::Format(f) => {
                    invalid("logging.format", format!("must be text or json, got `{f}`"))
                }
                other => invalid(
                    "logging.level",
                    format!("is not a valid level or filter: {other}"),
                ),
            };
        }
        if self.server.host.trim().is_empty() {
            return invalid("server.host", "must not be empty".into());
        }
        if self.server.max_body_bytes < 1024 {
            return invalid("server.max_body_bytes", "must be >= 1024".into());
        }
        let e = &self.engine;
        for (key, v) in [
            ("engine.max_seqs", e.max_seqs),
            ("engine.max_queue", e.max_queue),
            ("engine.prefill_chunk", e.prefill_chunk),
            ("engine.max_gamma", e.max_gamma),
        ] {
            if v == 0 {
                return invalid(key, "must be >= 1".into());
            }
        }
        if e.max_gamma > 32 {
            return invalid("engine.max_gamma", "must be <= 32".into());
        }
        let sp = &self.speculation;
        if sp.draft_model.trim().is_empty() {
            return invalid(
                "speculation.draft_model",
                "must be none, prompt-lookup[:MIN-MAX], default, self:K or a model path".into(),
            );
        }
        if let Some(Err(e)) = crate::draft::PromptLookup::parse_spec(&sp.draft_model) {
            return invalid("speculation.draft_model", e);
        }
        if let Some(Err(e)) = crate::draft::parse_self_draft(&sp.draft_model) {
            return invalid("speculation.draft_model", e);
        }
        if let Err(e) = sp.draft_weights_dtype.parse::<WeightsDtype>() {
            return invalid("speculation.draft_weights_dtype", e);
        }
        self.speculation_settings()?;
        Ok(())
    }

    /// The live speculation settings the engine starts with, checked as the admin API checks a
    /// change.
    pub fn speculation_settings(&self) -> Result<SpeculationSettings, ConfigError> {
        let sp = &self.speculation;
        SettingsUpdate {
            enabled: Some(sp.enabled),
            adaptive: Some(sp.adaptive),
            gamma: Some(sp.gamma),
            gamma_min: Some(sp.gamma_min),
            gamma_max: Some(sp.gamma_max),
            lenience: Some(sp.lenience),
            under_load_queue_depth: Some(sp.under_load_queue_depth),
            lenience_under_load: Some(sp.lenience_under_load),
        }
        .apply(&SpeculationSettings::default(), self.engine.max_gamma)
        .map_err(|e| ConfigError::Invalid {
            key: match e.key {
                "lenience" => "speculation.lenience",
                "lenience_under_load" => "speculation.lenience_under_load",
                "gamma" => "speculation.gamma",
                "gamma_min" => "speculation.gamma_min",
                _ => "speculation.gamma_max",
            },
            reason: e.reason,
        })
    }

    pub fn draft_weights_dtype(&self) -> WeightsDtype {
        self.speculation
            .draft_weights_dtype
            .parse()
            .expect("validated at load")
    }
}

/// Renames the seeds' alias keys to ours; giving both names is an error.
fn resolve_aliases(user: &mut toml::Table) -> Result<(), ConfigError> {
    let Some(toml::Value::Table(spec)) = user.get_mut("speculation") else {
        return Ok(());
    };
    for (alias, key) in SPECULATION_ALIASES {
        if let Some(v) = spec.remove(alias) {
            if spec.contains_key(key) {
                return Err(ConfigError::Parse(format!(
                    "speculation.{alias} is an alias of speculation.{key}; give only one"
                )));
            }
            spec.insert(key.to_string(), v);
        }
    }
    Ok(())
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
        let e = Config::from_toml("[model]\nkv_cache_dtype = \"q8\"").unwrap_err();
        assert!(e.to_string().contains("model.kv_cache_dtype"), "{e}");
        let c = Config::from_toml("[model]\nkv_cache_dtype = \"F32\"").unwrap();
        assert_eq!(c.kv_cache_dtype(), KvDtype::F32);
        let e = Config::from_toml("[model]\nbogus = 1").unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
        let e = Config::from_toml("[generation]\nmax_tokens = \"many\"").unwrap_err();
        assert!(e.to_string().contains("max_tokens"), "{e}");
    }

    #[test]
    fn speculation_keys_are_checked_and_aliases_work() {
        let e = Config::from_toml("[speculation]\ngamma = 0").unwrap_err();
        assert_eq!(
            e.to_string(),
            "config: speculation.gamma must be in 1..=32, got 0"
        );
        let e = Config::from_toml("[speculation]\nlenience = 1.5").unwrap_err();
        assert!(e.to_string().contains("speculation.lenience"), "{e}");
        let e = Config::from_toml("[engine]\nmax_seqs = 0").unwrap_err();
        assert!(e.to_string().contains("engine.max_seqs"), "{e}");
        let e = Config::from_toml("[speculation]\ngamma_max = 9").unwrap_err();
        assert!(e.to_string().contains("speculation.gamma_max"), "{e}");
        let c = Config::from_toml(
            "[speculation]\nspec_length = 3\nuse_speculative_decoding = false\ndraft_model = \"default\"",
        )
        .unwrap();
        assert_eq!((c.speculation.gamma, c.speculation.enabled), (3, false));
        let e = Config::from_toml("[speculation]\nspec_length = 3\ngamma = 2").unwrap_err();
        assert!(e.to_string().contains("alias"), "{e}");
        let e =
            Config::from_toml("[speculation]\ndraft_model = \"prompt-lookup:3-1\"").unwrap_err();
        assert!(
            e.to_string().contains("speculation.draft_model") && e.to_string().contains("n-gram"),
            "{e}"
        );
        Config::from_toml("[speculation]\ndraft_model = \"prompt-lookup:2-4\"").unwrap();
        let e = Config::from_toml("[speculation]\ndraft_model = \"self:0\"").unwrap_err();
        assert!(e.to_string().contains("speculation.draft_model"), "{e}");
        Config::from_toml("[speculation]\ndraft_model = \"self:8\"").unwrap();
    }

    #[test]
    fn user_values_override_defaults_only_where_given() {
        let c = Config::from_toml("[model]\ncontext_length = 128").unwrap();
        assert_eq!(c.model.context_length, 128);
        assert_eq!(c.model.path, "default");
    }
}
