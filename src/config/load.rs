//! Reading a config: the embedded defaults with the user's file laid over them (aliases
//! resolved), parsed into the typed sections, and every value checked with its key named.

use std::path::Path;

use super::error::ConfigError;
use super::sections::{Config, Sections, ServerConfig, StructuredConfig, DEFAULT_CONFIG};
use super::speculation::{settings_error, SpeculationSection, SPECULATION_ALIASES};
use crate::constraint::JsonWhitespace;
use crate::engine::{EngineConfig, Gamma};
use crate::model::{BackendChoice, DeviceSpec, KvDtype, WeightsDtype};

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
        let Some(toml::Value::Table(speculation)) = base.remove("speculation") else {
            return Err(ConfigError::Parse("[speculation] must be a table".into()));
        };
        let s: Sections = toml::Value::Table(base)
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Parse(e.to_string()))?;
        // γ is checked against engine.max_gamma, so that must be valid first.
        validate_engine(&s.engine)?;
        let speculation = SpeculationSection::from_table(speculation, s.engine.gamma_limit)?;
        let cfg = Config {
            model: s.model,
            runtime: s.runtime,
            generation: s.generation,
            server: s.server,
            speculation,
            engine: s.engine,
            logging: s.logging,
            structured: s.structured,
        };
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

    /// How JSON is laid out unless a request or schema says otherwise
    /// (`structured.json_whitespace`).
    pub fn json_whitespace(&self) -> JsonWhitespace {
        self.structured
            .json_whitespace
            .parse()
            .expect("validated at load")
    }

    /// The target's device (`model.device`).
    pub fn device(&self) -> DeviceSpec {
        self.model.device.parse().expect("validated at load")
    }

    /// The forward the models run (`model.backend`).
    pub fn backend(&self) -> BackendChoice {
        self.model.backend.parse().expect("validated at load")
    }

    /// The draft model's device (`speculation.draft_device`, else the target's).
    pub fn draft_device(&self) -> DeviceSpec {
        self.speculation
            .draft_device
            .unwrap_or_else(|| self.device())
    }

    /// Checks what loading cannot fix in a type: ranges, and values CLI flags may have changed.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, reason: String| Err(ConfigError::invalid(key, reason));
        if let Err(e) = self.model.weights_dtype.parse::<WeightsDtype>() {
            return invalid("model.weights_dtype", e);
        }
        if let Err(e) = self.model.kv_cache_dtype.parse::<KvDtype>() {
            return invalid("model.kv_cache_dtype", e);
        }
        let device = match self.model.device.parse::<DeviceSpec>() {
            Ok(d) => d,
            Err(e) => return invalid("model.device", e),
        };
        let backend = match self.model.backend.parse::<BackendChoice>() {
            Ok(b) => b,
            Err(e) => return invalid("model.backend", e),
        };
        if let Err(e) = backend.resolve(device) {
            return invalid("model.backend", e);
        }
        if let Err(e) = backend.resolve(self.draft_device()) {
            return invalid("speculation.draft_device", e);
        }
        if self.model.path.trim().is_empty() {
            return invalid("model.path", "must not be empty".into());
        }
        if !self.model.chat_template.is_empty() {
            let path = &self.model.chat_template;
            let src = std::fs::read_to_string(path)
                .map_err(|e| ConfigError::invalid("model.chat_template", format!("{path}: {e}")))?;
            if let Err(e) = crate::model::ChatTemplate::new(&src, None, None) {
                return invalid("model.chat_template", format!("{path}: {e}"));
            }
        }
        if self.model.context_length == 1 {
            return invalid(
                "model.context_length",
                "must be 0 (the model's own maximum) or >= 2".into(),
            );
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
        let r = &crate::sampling::REPETITION_PENALTY_RANGE;
        if !r.contains(&g.repetition_penalty) {
            return invalid(
                "generation.repetition_penalty",
                format!("must be in [{}, {}]", r.start(), r.end()),
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
        validate_server(&self.server)?;
        validate_structured(&self.structured)?;
        validate_engine(&self.engine)?;
        self.speculation
            .settings
            .validate(self.engine.gamma_limit)
            .map_err(settings_error)?;
        Ok(())
    }
}

/// What `[server]` must hold beyond its types.
fn validate_server(server: &ServerConfig) -> Result<(), ConfigError> {
    let invalid = |key: &str, reason: String| Err(ConfigError::invalid(key, reason));
    if server.host.trim().is_empty() {
        return invalid("server.host", "must not be empty".into());
    }
    if server.max_body_bytes < 1024 {
        return invalid("server.max_body_bytes", "must be >= 1024".into());
    }
    for (key, v) in [
        (
            "server.header_timeout_seconds",
            server.header_timeout_seconds,
        ),
        ("server.body_timeout_seconds", server.body_timeout_seconds),
    ] {
        if v == 0 {
            return invalid(
                key,
                "must be >= 1 (a client that never finishes would hold its connection for good)"
                    .into(),
            );
        }
    }
    if server.template_timeout_ms == 0 {
        return invalid("server.template_timeout_ms", "must be >= 1".into());
    }
    if server.responses_stored_bytes < 1024 && server.responses_stored > 0 {
        return invalid(
            "server.responses_stored_bytes",
            "must be >= 1024 (turn stored responses off with server.responses_stored = 0)".into(),
        );
    }
    if server.responses_ttl_seconds == 0 {
        return invalid(
            "server.responses_ttl_seconds",
            "must be >= 1 (turn stored responses off with server.responses_stored = 0)".into(),
        );
    }
    Ok(())
}

/// What `[structured]` must hold beyond its types.
fn validate_structured(st: &StructuredConfig) -> Result<(), ConfigError> {
    let invalid = |key: &str, reason: String| Err(ConfigError::invalid(key, reason));
    for (key, v) in [
        ("structured.compile_threads", st.compile_threads as u64),
        ("structured.compile_timeout_ms", st.compile_timeout_ms),
    ] {
        if v == 0 {
            return invalid(key, "must be >= 1".into());
        }
    }
    if let Err(e) = st.json_whitespace.parse::<JsonWhitespace>() {
        return invalid("structured.json_whitespace", e);
    }
    Ok(())
}

/// What `[engine]` must hold beyond its types.
fn validate_engine(e: &EngineConfig) -> Result<(), ConfigError> {
    for (key, v) in [
        ("engine.max_seqs", e.max_seqs),
        ("engine.max_queue", e.max_queue),
        ("engine.prefill_chunk", e.prefill_chunk),
        ("engine.max_gamma", e.gamma_limit),
    ] {
        if v == 0 {
            return Err(ConfigError::invalid(key, "must be >= 1"));
        }
    }
    // The largest γ is a γ: the same rule as every other.
    Gamma::try_from(e.gamma_limit).map_err(|err| ConfigError::invalid("engine.max_gamma", err))?;
    Ok(())
}

/// Renames the alias keys (the names the project's original brief used: `spec_length` for
/// `gamma`, `use_speculative_decoding` for `enabled`) to ours; giving both names is an error.
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
