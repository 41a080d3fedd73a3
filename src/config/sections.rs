//! The config file's sections as types: what each table holds, read by `load` and checked
//! there with each key named.

use serde::Deserialize;

use super::speculation::SpeculationSection;
use crate::engine::EngineConfig;

/// The embedded default configuration.
pub const DEFAULT_CONFIG: &str = include_str!("../../config/default.toml");

/// The whole configuration: [`Config::from_toml`] builds and checks it, and
/// [`Config::validate`] checks it again after CLI flags change it.
#[derive(Clone, Debug)]
pub struct Config {
    pub model: ModelConfig,
    pub runtime: RuntimeConfig,
    pub generation: GenerationDefaults,
    pub server: ServerConfig,
    pub speculation: SpeculationSection,
    /// `[engine]`, read into the engine's own type (thread counts of 0 mean `runtime.threads`).
    pub engine: EngineConfig,
    pub logging: LoggingConfig,
    pub structured: StructuredConfig,
}

/// Every table but `[speculation]`, which [`SpeculationSection`] reads on its own.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Sections {
    pub(super) model: ModelConfig,
    pub(super) runtime: RuntimeConfig,
    pub(super) generation: GenerationDefaults,
    pub(super) server: ServerConfig,
    pub(super) engine: EngineConfig,
    pub(super) logging: LoggingConfig,
    pub(super) structured: StructuredConfig,
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
    /// Keys of the inference API (empty, with no file and no `TANDEM_API_KEY`: open).
    pub api_keys: Vec<String>,
    /// A file of keys, one a line ("": none).
    pub api_keys_file: String,
    /// Whether `/metrics` needs an API key too.
    pub metrics_require_key: bool,
    /// Whether `/` serves the web page.
    pub web_page: bool,
    pub shutdown_grace_seconds: u64,
    pub drain_seconds: u64,
    pub header_timeout_seconds: u64,
    pub body_timeout_seconds: u64,
    pub responses_stored: usize,
    pub responses_ttl_seconds: u64,
    /// Most bytes of stored responses kept, all together.
    pub responses_stored_bytes: usize,
    /// Longest a chat template may take to render one conversation.
    pub template_timeout_ms: u64,
}

/// `[structured]`: where and how requests' constraints compile, and JSON's default layout.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StructuredConfig {
    pub compile_threads: usize,
    pub compile_queue: usize,
    pub compile_timeout_ms: u64,
    pub json_whitespace: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub path: String,
    pub weights_dtype: String,
    pub context_length: usize,
    pub kv_cache_dtype: String,
    pub device: String,
    pub backend: String,
    /// A Jinja chat template file used instead of the model's own ("": the model's).
    pub chat_template: String,
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
