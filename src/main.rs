//! The `tandem` binary: parses the command line, runs the command, reports an error with its
//! causes. The commands themselves live in `cli/`.

mod cli;

use clap::Parser;

fn main() -> anyhow::Result<()> {
    cli::run(cli::Cli::parse())?;
    Ok(())
}
