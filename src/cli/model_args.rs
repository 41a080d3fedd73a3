//! The model and runtime flags every model-loading command shares, and loading the model they
//! name.
//!
//! Why it exists: `serve`, `generate`, `bench` and `forward-bench` take the same `--model`,
//! `--weights-dtype`, `--threads`, `--context-length`, `--kv-cache-dtype`, `--device`,
//! `--backend`, `--chat-template` and `--draft-device` flags. They
//! override the config's `[model]` and `[runtime]` keys and are then checked as the config file
//! is, so a bad value names its config key whichever way it came in.

use clap::Args;

use tandem::config::{Config, ConfigError};
use tandem::model::LoadedModel;

use super::CliError;

/// Model and runtime overrides shared by commands that load a model.
#[derive(Args)]
pub struct ModelArgs {
    /// The target model: `default` (SmolLM2-135M-Instruct), a .gguf file, or a Hugging Face
    /// model folder or hub id [default: the config's model.path, `default`].
    #[arg(long, env = "TANDEM_MODEL")]
    model: Option<String>,
    /// Linear weight type after loading: auto, as-is, f32, f16, bf16, q8_0, q4_0, q4_1, q4k
    /// [default: model.weights_dtype, `auto`: keep a file's quantization, float weights to q8_0; f16 on a GPU].
    #[arg(long, env = "TANDEM_WEIGHTS_DTYPE")]
    weights_dtype: Option<String>,
    /// Compute threads, 0 = every core [default: runtime.threads, 0].
    #[arg(long, env = "TANDEM_THREADS")]
    threads: Option<usize>,
    /// Most tokens (prompt + output) one sequence may hold, capped by the model's own maximum;
    /// 0 = the model's own, as memory allows [default: model.context_length, 0].
    #[arg(long, env = "TANDEM_CONTEXT_LENGTH")]
    context_length: Option<usize>,
    /// KV cache element type of both models: f16, f32, bf16 or q8_0 (bf16 and q8_0: own CPU
    /// kernels only; bf16 needs AVX-512 BF16)
    /// [default: model.kv_cache_dtype, f16].
    #[arg(long, env = "TANDEM_KV_CACHE_DTYPE")]
    kv_cache_dtype: Option<String>,
    /// Where the model runs: cpu, cuda, cuda:N, metal or metal:N [default: model.device, cpu].
    #[arg(long, env = "TANDEM_DEVICE")]
    device: Option<String>,
    /// Which forward runs the models: auto (own kernels on the CPU, candle elsewhere), own or
    /// candle [default: model.backend, auto].
    #[arg(long, env = "TANDEM_BACKEND")]
    backend: Option<String>,
    /// A Jinja chat template file used instead of the model's own (a base model's file has
    /// none) [default: model.chat_template, "": the model's].
    #[arg(long, env = "TANDEM_CHAT_TEMPLATE")]
    chat_template: Option<String>,
    /// Where a draft model runs [default: speculation.draft_device, "": the target's device].
    #[arg(long, env = "TANDEM_DRAFT_DEVICE")]
    draft_device: Option<String>,
}

impl ModelArgs {
    /// Overrides the config's keys with the flags given, then checks the result.
    pub fn apply(&self, config: &mut Config) -> Result<(), ConfigError> {
        if let Some(m) = &self.model {
            config.model.path = m.clone();
        }
        if let Some(d) = &self.weights_dtype {
            config.model.weights_dtype = d.clone();
        }
        if let Some(t) = self.threads {
            config.runtime.threads = t;
        }
        if let Some(c) = self.context_length {
            config.model.context_length = c;
        }
        if let Some(d) = &self.kv_cache_dtype {
            config.model.kv_cache_dtype = d.clone();
        }
        if let Some(d) = &self.device {
            config.model.device = d.clone();
        }
        if let Some(b) = &self.backend {
            config.model.backend = b.clone();
        }
        if let Some(t) = &self.chat_template {
            config.model.chat_template = t.clone();
        }
        if let Some(d) = &self.draft_device {
            config.speculation.draft_device = match d.trim() {
                "" => None,
                d => Some(
                    d.parse()
                        .map_err(|e| ConfigError::invalid_key("speculation.draft_device", e))?,
                ),
            };
        }
        config.validate()
    }
}

/// Loads the target model on the runtime's threads and says on stderr what was loaded.
pub fn load_model(config: &Config) -> Result<LoadedModel, CliError> {
    let threads = tandem::runtime::init_threads(config.runtime.threads);
    let t = std::time::Instant::now();
    let loaded = tandem::setup::load_target(config).map_err(|source| CliError::LoadModel {
        path: config.model.path.clone(),
        source,
    })?;
    let experts = match loaded.model.hparams().experts {
        Some(e) => format!(
            ", {} of {} experts a token ({:.2} GB read per token)",
            e.used,
            e.count,
            loaded.model.bytes_per_token() as f64 / 1e9
        ),
        None => String::new(),
    };
    eprintln!(
        "loaded {} on {} (--weights-dtype {}: linear weights as {}, {:.2} GB{experts}; {} KV \
         cache) in {:.2}s on {threads} thread(s)",
        loaded.source.display_name(),
        loaded.model.placement(),
        config.weights_dtype(),
        loaded.model.linear_dtypes().join("/"),
        loaded.model.weight_bytes() as f64 / 1e9,
        loaded.model.kv_dtype(),
        t.elapsed().as_secs_f64()
    );
    match tandem::model::kernels::cpu_kernels::vector_level() {
        Some(level) => eprintln!("CPU kernels: {level}"),
        None => eprintln!("{}", tandem::model::kernels::cpu_kernels::PORTABLE_WARNING),
    }
    eprintln!("memory pages: {}", tandem::huge_pages::heap_pages());
    Ok(loaded)
}
