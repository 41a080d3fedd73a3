//! The command line as clap reads it: the global `--config`, the commands, and the
//! environment variables `--help` names.
//!
//! Why it exists: the flags a user types are this program's interface; each command's own flags
//! live in its module, and this file only gathers them under one parser and one `--help`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use super::{bench, forward_bench, generate, health, make_model, serve, train_head};

/// The environment variables no flag shows (each flag's own `TANDEM_*` variable is listed
/// beside it).
const ENVIRONMENT_HELP: &str = "Environment:
  TANDEM_ADMIN_TOKEN  bearer token of the admin API (/admin/speculation); overrides
                      server.admin_token; unset and empty in the config, the admin API is off
  TANDEM_API_KEY      an API key of the inference API (/v1/*, /tokenize, /detokenize), beside
                      server.api_keys, --api-key and server.api_keys_file
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
    pub(super) config: Option<PathBuf>,
    #[command(subcommand)]
    pub(super) command: Command,
}

#[derive(Subcommand)]
pub(super) enum Command {
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
    /// Write a Llama GGUF: random weights at a named shape (for timing only), or a model
    /// re-quantized, in any of llama.cpp's weight types or its Q4_K_M/Q5_K_M mixes.
    MakeModel(Box<make_model::MakeModelArgs>),
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
            "TANDEM_API_KEY",
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
