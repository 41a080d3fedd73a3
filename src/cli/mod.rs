//! The `tandem` command line: its commands, the errors they end with, and dispatch.
//!
//! Why it exists: every command loads the config, lets its flags override it, and then wires
//! the library's layers together its own way. Keeping each command in its own module, with one
//! typed error for the whole command-line layer, keeps `main.rs` to parsing and reporting.

mod bench;
mod command;
mod error;
mod forward_bench;
mod generate;
mod governed;
mod health;
mod make_model;
mod model_args;
mod runner;
mod serve;
mod stream_bandwidth;
mod train_head;

use tandem::config::Config;

pub use command::Cli;
use command::Command;
pub use error::CliError;

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
        Command::MakeModel(args) => make_model::run(*args),
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
