//! The `tandem` binary as the command-line tests run it.

use std::process::Command;

/// `tandem` with no `TANDEM_MODEL` from the caller's environment (the tests name the model, or
/// mean the default), 2 compute threads, like the machine's cores, and no remembered governor
/// prices: each run measures its own and learns from nothing earlier, so what one test's
/// drafts did never steers another's (a test that means to remember says so).
pub fn tandem_command() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tandem"));
    c.env_remove("TANDEM_MODEL")
        .env("TANDEM_THREADS", "2")
        .env("TANDEM_REMEMBER_PRICES", "false");
    c
}
