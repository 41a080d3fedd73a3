//! `tandem serve`: the flags that override the server, engine and speculation keys, and starting
//! the HTTP server.
//!
//! Why it exists: serving is configured mostly by the config file; these flags (and their
//! `TANDEM_*` variables) change single keys for one run. The speculation flags are a
//! [`SpeculationKnobs`], applied by the engine's own rule (a fixed γ means adaptive off unless
//! `--adaptive` says otherwise) exactly as a config file or an admin API change is.

use clap::Args;

use tandem::config::{Config, ConfigError};
use tandem::draft::DraftSpec;
use tandem::engine::{SettingsError, SpeculationKnobs};
use tandem::model::WeightsDtype;

use super::model_args::ModelArgs;
use super::CliError;

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on; 0.0.0.0 for every interface [default: server.host, 127.0.0.1].
    #[arg(long, env = "TANDEM_HOST")]
    host: Option<String>,
    /// Port to listen on; 0 picks a free port and logs it [default: server.port, 8080].
    #[arg(long, env = "TANDEM_PORT")]
    port: Option<u16>,
    /// The model id clients send and /v1/models lists [default: server.model_name, "": the
    /// model file's name].
    #[arg(long, env = "TANDEM_MODEL_NAME")]
    model_name: Option<String>,
    /// The drafter: `prompt-lookup[:MIN-MAX]`, `suffix[:MIN-MAX]` (prompt lookup in earlier
    /// requests too), `self:K` (the target's first K layers), `default` (the default model),
    /// a model path (of the target's vocabulary or another), `head[:PATH]`,
    /// `head+lookup[:PATH]`, `draft+lookup:MODEL` (prompt lookup first), or `none` [default:
    /// speculation.draft_model, prompt-lookup].
    #[arg(long, env = "TANDEM_DRAFT_MODEL")]
    draft_model: Option<DraftSpec>,
    /// Weight type of a draft model: as-is, f32, f16, bf16, q8_0, q4_0, q4_1, q4k (the
    /// target's own file at another type is a quantized self-drafter)
    /// [default: speculation.draft_weights_dtype, as-is].
    #[arg(long, env = "TANDEM_DRAFT_WEIGHTS_DTYPE")]
    draft_weights_dtype: Option<WeightsDtype>,
    /// Speculate at all; requests may still opt out [default: speculation.enabled, true].
    #[arg(long, env = "TANDEM_SPECULATIVE_DECODING")]
    speculative_decoding: Option<bool>,
    /// Draft this many tokens every round, a fixed γ that turns the governor off (alias
    /// --spec-length) [default: speculation.gamma, 4, used only with --adaptive false].
    #[arg(long, alias = "spec-length", env = "TANDEM_GAMMA")]
    gamma: Option<usize>,
    /// Let the governor choose γ per request and round, and decode plainly where drafting
    /// would not pay [default: speculation.adaptive, true].
    #[arg(long, env = "TANDEM_ADAPTIVE")]
    adaptive: Option<bool>,
    /// Server-wide relaxed acceptance in (0, 1]; 1 keeps the target's distribution exactly
    /// [default: speculation.lenience, 1].
    #[arg(long, env = "TANDEM_LENIENCE")]
    lenience: Option<f64>,
    /// Sequences decoded together in one batched forward [default: engine.max_seqs, 8].
    #[arg(long, env = "TANDEM_MAX_SEQS")]
    max_seqs: Option<usize>,
    /// Sequences that may wait beyond the running ones before requests get 429
    /// [default: engine.max_queue, 64].
    #[arg(long, env = "TANDEM_MAX_QUEUE")]
    max_queue: Option<usize>,
    /// Draft one group of sequences while the other is verified (slower on 2 cores)
    /// [default: engine.pipeline, false].
    #[arg(long, env = "TANDEM_PIPELINE")]
    pipeline: Option<bool>,
    /// Keep the speculation governor's prices and acceptance in the cache directory and start
    /// from them next time (checked first) [default: engine.remember_prices, true].
    #[arg(long, env = "TANDEM_REMEMBER_PRICES")]
    remember_prices: Option<bool>,
    /// An API key the inference API takes (`Authorization: Bearer KEY`); repeat for more.
    /// Added to server.api_keys and TANDEM_API_KEY; prefer those or --api-keys-file, since
    /// a flag shows in the process list [default: none, the API is open].
    #[arg(long = "api-key", value_name = "KEY")]
    api_keys: Vec<String>,
    /// A file of API keys, one a line (`#` lines skipped), such as a mounted Kubernetes
    /// Secret [default: server.api_keys_file, "": none].
    #[arg(long, env = "TANDEM_API_KEYS_FILE")]
    api_keys_file: Option<String>,
    /// Largest request body accepted, in bytes; larger ones get 413
    /// [default: server.max_body_bytes, 1048576].
    #[arg(long, env = "TANDEM_MAX_BODY_BYTES")]
    max_body_bytes: Option<usize>,
    /// Seconds between SIGTERM (when /health turns 503) and no longer accepting connections
    /// [default: server.drain_seconds, 0].
    #[arg(long, env = "TANDEM_DRAIN_SECONDS")]
    drain_seconds: Option<u64>,
    /// Serve the web page at / (chat with each token marked by who wrote it)
    /// [default: server.web_page, true].
    #[arg(long, env = "TANDEM_WEB_PAGE")]
    web_page: Option<bool>,
    /// Seconds a connection may take to send a request's headers, and may sit idle between
    /// requests, before it is closed [default: server.header_timeout_seconds, 10].
    #[arg(long, env = "TANDEM_HEADER_TIMEOUT_SECONDS")]
    header_timeout_seconds: Option<u64>,
    /// Seconds a client may take to send a request's body, 408 after
    /// [default: server.body_timeout_seconds, 30].
    #[arg(long, env = "TANDEM_BODY_TIMEOUT_SECONDS")]
    body_timeout_seconds: Option<u64>,
    /// Seconds work may wait with no engine round before /health says "stalled", 0 = never
    /// [default: engine.stall_timeout_seconds, 60].
    #[arg(long, env = "TANDEM_STALL_TIMEOUT_SECONDS")]
    stall_timeout_seconds: Option<u64>,
}

impl ServeArgs {
    /// Overrides the config's keys with the flags given, then checks the result.
    pub fn apply(&self, config: &mut Config) -> Result<(), CliError> {
        let srv = &mut config.server;
        if let Some(v) = &self.host {
            srv.host = v.clone();
        }
        if let Some(v) = self.port {
            srv.port = v;
        }
        if let Some(v) = &self.model_name {
            srv.model_name = v.clone();
        }
        srv.api_keys.extend(self.api_keys.iter().cloned());
        if let Some(v) = &self.api_keys_file {
            srv.api_keys_file = v.clone();
        }
        if let Some(v) = self.max_body_bytes {
            srv.max_body_bytes = v;
        }
        if let Some(v) = self.drain_seconds {
            srv.drain_seconds = v;
        }
        if let Some(v) = self.web_page {
            srv.web_page = v;
        }
        if let Some(v) = self.header_timeout_seconds {
            srv.header_timeout_seconds = v;
        }
        if let Some(v) = self.body_timeout_seconds {
            srv.body_timeout_seconds = v;
        }
        let eng = &mut config.engine;
        if let Some(v) = self.max_seqs {
            eng.max_seqs = v;
        }
        if let Some(v) = self.max_queue {
            eng.max_queue = v;
        }
        if let Some(v) = self.pipeline {
            eng.pipeline = v;
        }
        if let Some(v) = self.remember_prices {
            eng.remember_prices = v;
        }
        if let Some(v) = self.stall_timeout_seconds {
            eng.stall_timeout_seconds = v;
        }
        let sp = &mut config.speculation;
        if let Some(v) = &self.draft_model {
            sp.draft_model = v.clone();
        }
        if let Some(v) = self.draft_weights_dtype {
            sp.draft_weights_dtype = v;
        }
        sp.settings = self
            .settings_update()
            .apply(&sp.settings, config.engine.gamma_limit)
            .map_err(flag_error)?;
        config.validate()?;
        Ok(())
    }

    /// The speculation flags given, as the change they make to the live settings.
    fn settings_update(&self) -> SpeculationKnobs {
        SpeculationKnobs {
            enabled: self.speculative_decoding,
            adaptive: self.adaptive,
            gamma: self.gamma,
            lenience: self.lenience,
            ..Default::default()
        }
    }
}

/// A settings error, naming the flag that carried the value (or the config key, for a setting
/// no flag changes).
fn flag_error(e: SettingsError) -> CliError {
    let flag = match e.key {
        "enabled" => "--speculative-decoding",
        "adaptive" => "--adaptive",
        "gamma" => "--gamma",
        "lenience" => "--lenience",
        other => {
            return CliError::Config(ConfigError::Invalid {
                key: format!("speculation.{other}"),
                reason: e.reason,
            })
        }
    };
    CliError::Flag {
        flag,
        reason: e.reason,
    }
}

pub fn run(config: Config, config_path: Option<std::path::PathBuf>) -> Result<(), CliError> {
    tandem::logging::init(&config.logging.level, &config.logging.format)?;
    let threads = tandem::runtime::init_threads(config.runtime.threads);
    super::async_runtime()?.block_on(tandem::server::run(config, threads, config_path))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::super::{Cli, Command};
    use super::*;

    fn serve_config(flags: &[&str]) -> Result<Config, CliError> {
        let cli = Cli::try_parse_from(["tandem", "serve"].iter().chain(flags)).unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("not serve")
        };
        let mut config = Config::embedded();
        args.apply(&mut config)?;
        Ok(config)
    }

    #[test]
    fn a_gamma_flag_fixes_gamma_unless_adaptive_is_given_too() {
        let s = serve_config(&["--gamma", "3"])
            .unwrap()
            .speculation
            .settings;
        assert_eq!((s.gamma.get(), s.adaptive), (3, false));
        let s = serve_config(&["--spec-length", "3", "--adaptive", "true"])
            .unwrap()
            .speculation
            .settings;
        assert_eq!((s.gamma.get(), s.adaptive), (3, true));
        let s = serve_config(&["--speculative-decoding", "false", "--lenience", "0.5"])
            .unwrap()
            .speculation
            .settings;
        assert_eq!((s.enabled, s.lenience.get()), (false, 0.5));
    }

    #[test]
    fn bad_values_name_the_flag_or_key() {
        let e = serve_config(&["--gamma", "0"]).unwrap_err();
        assert_eq!(e.to_string(), "--gamma must be in 1..=32, got 0");
        let e = serve_config(&["--gamma", "9"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--gamma must be <= 8 (engine.max_gamma), got 9"
        );
        let e = serve_config(&["--lenience", "1.5"]).unwrap_err();
        assert!(
            e.to_string().starts_with("--lenience must be in (0, 1]"),
            "{e}"
        );
        let e = serve_config(&["--max-seqs", "0"]).unwrap_err();
        assert!(e.to_string().contains("engine.max_seqs"), "{e}");
        let bad = Cli::try_parse_from(["tandem", "serve", "--draft-model", "self:0"]);
        assert!(bad.is_err());
    }

    #[test]
    fn draft_flags_are_parsed_once() {
        let c =
            serve_config(&["--draft-model", "self:4", "--draft-weights-dtype", "q8_0"]).unwrap();
        assert_eq!(c.speculation.draft_model, DraftSpec::SelfLayers(4));
        assert_eq!(c.speculation.draft_weights_dtype, WeightsDtype::Q8_0);
    }
}
