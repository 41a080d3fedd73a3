//! The `tandem` binary: parses the command line, runs the command, reports an error with its
//! causes. The commands themselves live in `cli/`.

mod cli;

use clap::Parser;

/// Every allocation passes the per-thread budgets that bound a chat template's memory.
#[global_allocator]
static ALLOCATOR: tandem::memory_budget::BudgetedAllocator =
    tandem::memory_budget::BudgetedAllocator;

fn main() -> anyhow::Result<()> {
    // First, before any thread or allocation it would lose: the heap on huge pages.
    tandem::huge_pages::run_on_huge_pages()?;
    cli::run(cli::Cli::parse())?;
    Ok(())
}
