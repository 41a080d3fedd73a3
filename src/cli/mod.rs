//! The `tandem` command line: its commands, the errors they end with, and dispatch.
//!
//! Why it exists: every command loads the config, lets its flags override it, and then wires
//! the library's layers together its own way. Keeping each command in its own module, with one
//! typed error for the whole command-line layer, keeps `main.rs` to parsing and reporting.

mod bench;
mod forward_bench;
mod generate;
mod health;
mod model_args;
mod serve;
mod stream_bandwidth;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use tandem::bench::BenchError;
use tandem::config::{Config, ConfigError};
use tandem::engine::EngineError;
use tandem::logging::LoggingError;
use tandem::model::chat_template::ChatTemplateError;
use tandem::model::tokenizer::TokenizerError;
use tandem::model::ModelError;
use tandem::sampling::SamplingError;
use tandem::server::ServerError;
use tandem::setup::SetupError;

#[derive(Parser)]
#[command(
    name = "tandem",
    version,
    about = "LLM inference built around speculative decoding"
)]
pub struct Cli {
    /// TOML config file (default: the embedded config/default.toml).
    #[arg(long, global = true, env = "TANDEM_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OpenAI-compatible HTTP API (and /metrics, /health, the admin API).
    Serve(Box<serve::ServeArgs>),
    /// Generate a completion for one prompt, streaming it to stdout; stats go to stderr.
    Generate(Box<generate::GenerateArgs>),
    /// Benchmark plain vs speculative decoding on Spec-Bench prompts, all modes in one run.
    Bench(Box<bench::BenchArgs>),
    /// Time forwards of k new tokens against a cache of a given depth (the cost a speculative
    /// verification pays), reported against a 1-token forward.
    ForwardBench(forward_bench::ForwardBenchArgs),
    /// Ask a running server's /health; exit 0 only on 200 (a container health check).
    Health(health::HealthArgs),
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A flag's value is out of range; `reason` is the checked type's rule.
    #[error("{flag} {reason}")]
    Flag { flag: &'static str, reason: String },
    #[error(transparent)]
    Logging(#[from] LoggingError),
    #[error("starting the async runtime")]
    AsyncRuntime(#[source] std::io::Error),
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error(transparent)]
    Bench(#[from] BenchError),
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error("loading model {path}")]
    LoadModel {
        path: String,
        #[source]
        source: SetupError,
    },
    #[error("loading draft model {spec}")]
    LoadDraft {
        spec: String,
        #[source]
        source: SetupError,
    },
    #[error(transparent)]
    Setup(#[from] SetupError),
    #[error("give a prompt with --prompt TEXT or --prompt-file FILE")]
    NoPrompt,
    #[error("the model has no chat template; pass --raw to feed the prompt as-is")]
    NoChatTemplate,
    #[error(transparent)]
    ChatTemplate(#[from] ChatTemplateError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("reading prompt file {}", .path.display())]
    ReadPrompt {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {}", .path.display())]
    WriteFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing output")]
    Output(#[source] std::io::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error("no free cache slot")]
    NoCacheSlot,
    #[error("--depth + the largest --tokens exceeds the context length {0}")]
    DepthPastContext(usize),
    #[error("{url}: not healthy: {reason}")]
    Unhealthy { url: String, reason: String },
}

/// Loads the config and runs the command.
pub fn run(cli: Cli) -> Result<(), CliError> {
    let mut config = match &cli.config {
        Some(p) => Config::from_file(p)?,
        None => Config::embedded(),
    };
    match cli.command {
        Command::Serve(args) => {
            args.model.apply(&mut config)?;
            args.apply(&mut config)?;
            serve::run(config, cli.config.clone())
        }
        Command::Generate(args) => {
            args.model.apply(&mut config)?;
            generate::run(&config, *args)
        }
        Command::Bench(args) => {
            args.model.apply(&mut config)?;
            bench::run(config, *args)
        }
        Command::ForwardBench(args) => {
            args.model.apply(&mut config)?;
            forward_bench::run(&config, args)
        }
        Command::Health(args) => health::run(config.server.port, args),
    }
}

/// The async runtime of `serve` and `bench`. It only moves bytes and messages; forward passes
/// run on the engine's own compute threads, so two workers are enough.
fn async_runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(CliError::AsyncRuntime)
}
