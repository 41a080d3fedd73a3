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
mod train_head;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use tandem::bench::BenchError;
use tandem::config::{Config, ConfigError};
use tandem::engine::EngineError;
use tandem::logging::LoggingError;
use tandem::model::text::chat_template::ChatTemplateError;
use tandem::model::text::tokenizer::TokenizerError;
use tandem::model::ModelError;
use tandem::sampling::SamplingError;
use tandem::server::ServerError;
use tandem::setup::SetupError;

/// The environment variables no flag shows (each flag's own `TANDEM_*` variable is listed
/// beside it).
const ENVIRONMENT_HELP: &str = "Environment:
  TANDEM_ADMIN_TOKEN  bearer token of the admin API (/admin/speculation); overrides
                      server.admin_token; unset and empty in the config, the admin API is off
  TANDEM_LOG          log level or filter, e.g. info,tandem::engine=debug (overrides
                      logging.level)
  TANDEM_CACHE        where the default model lives (default ~/.cache/tandem)
  TANDEM_CONFIG       the config file, as --config
  TANDEM_*            each flag's variable, shown as [env: ...] in a command's --help
Every key of the config file is described in config/default.toml and docs/operations.md.";

#[derive(Parser)]
#[command(
    name = "tandem",
    version,
    about = "LLM inference built around speculative decoding",
    after_help = ENVIRONMENT_HELP
)]
pub struct Cli {
    /// TOML config file; keys it leaves out keep their defaults [default: the embedded
    /// config/default.toml].
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
    ForwardBench(Box<forward_bench::ForwardBenchArgs>),
    /// Train a draft head (EAGLE) for the model on this CPU from its own answers to a prompt
    /// file; `--draft-model head:FOLDER` then drafts with it.
    TrainHead(Box<train_head::TrainHeadArgs>),
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
    #[error("reading {}", .path.display())]
    ReadFile {
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
            forward_bench::run(&config, *args)
        }
        Command::TrainHead(args) => {
            args.model.apply(&mut config)?;
            train_head::run(&config, *args)
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// Every flag of every command says what it does, and where its value does not come from a
    /// default clap shows (`[default: …]`), its help states the default itself.
    #[test]
    fn every_flag_says_what_it_does_and_its_default() {
        fn walk(cmd: &clap::Command, path: &str, problems: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                if help.trim().is_empty() {
                    problems.push(format!("{path} --{id}: no help"));
                    continue;
                }
                let takes_value = arg.get_action().takes_values();
                let shown_default = !arg.get_default_values().is_empty();
                let states_default = help.contains("default") || help.contains("required");
                if takes_value && !shown_default && !states_default {
                    problems.push(format!("{path} --{id}: no default stated: {help}"));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), problems);
            }
        }
        let mut problems = Vec::new();
        walk(&Cli::command(), "tandem", &mut problems);
        assert!(problems.is_empty(), "{problems:#?}");
    }

    #[test]
    fn help_names_the_environment_variables() {
        let help = Cli::command().render_long_help().to_string();
        for var in [
            "TANDEM_ADMIN_TOKEN",
            "TANDEM_LOG",
            "TANDEM_CACHE",
            "TANDEM_CONFIG",
        ] {
            assert!(help.contains(var), "{var} missing from --help:\n{help}");
        }
        let serve = Cli::command()
            .find_subcommand_mut("serve")
            .expect("serve")
            .render_long_help()
            .to_string();
        for flag in [
            "--host",
            "--max-seqs",
            "--max-queue",
            "--pipeline",
            "--max-body-bytes",
        ] {
            let line = serve
                .lines()
                .position(|l| l.trim_start().starts_with(flag))
                .unwrap_or_else(|| panic!("{flag} missing from serve --help"));
            let described = serve.lines().nth(line + 1).unwrap_or("").trim();
            assert!(!described.is_empty(), "{flag} has no description:\n{serve}");
        }
        assert!(serve.contains("suffix"), "--draft-model names suffix");
        assert!(!serve.contains("seeds' name"), "{serve}");
    }
}
