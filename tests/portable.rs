//! The portable build: one binary for every x86-64 CPU. Kernels pick their instruction set at
//! run time, so a CPU without AVX2 must still run the default model, on portable code, and say
//! so in its log; and speculation must stay exact there too.
//!
//! The binary under test is this test build's `tandem` (the same target features as a release
//! build: none beyond x86-64's baseline), or `$TANDEM_RELEASE_BIN` when set, to try a shipped
//! binary.

use crate::common;

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

const PROMPT: &str = "The capital of France is Paris. The capital of Italy is Rome. The capital of";

fn binary() -> PathBuf {
    std::env::var_os("TANDEM_RELEASE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_tandem")))
}

/// `tandem generate --json` greedy on the raw prompt, with `extra` flags, run by `launcher`
/// (e.g. an emulator) when given.
fn generate(launcher: &[&str], env: &[(&str, &str)], max_tokens: usize, extra: &[&str]) -> Output {
    common::default_model();
    let bin = binary();
    let mut cmd = match launcher.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            // The binary would run itself again for huge pages (`huge_pages`), and an
            // emulator starts that second run on its default CPU, not the one asked for.
            c.args(rest).arg(&bin).env("TANDEM_HUGE_PAGES", "false");
            c
        }
        None => Command::new(&bin),
    };
    cmd.args(["generate", "--json", "--raw", "--threads", "2"])
        .args(["--context-length", "256", "--temperature", "0"])
        .args(["--max-tokens", &max_tokens.to_string(), "--prompt", PROMPT])
        .args(extra)
        .env("TANDEM_LOG", "info");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("tandem generate runs");
    assert!(
        out.status.success(),
        "tandem generate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn tokens(out: &Output) -> Vec<u64> {
    let v: Value = serde_json::from_slice(&out.stdout).expect("generate --json prints JSON");
    v["tokens"]
        .as_array()
        .expect("token ids")
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

fn says_portable(out: &Output) -> bool {
    String::from_utf8_lossy(&out.stderr).contains("CPU kernels: portable")
}

#[test]
fn wide_kernels_switched_off_still_run_the_default_model_exactly() {
    let off = [("TANDEM_DISABLE_AVX2", "1")];
    let plain = generate(&[], &off, 32, &["--ignore-eos"]);
    assert!(
        says_portable(&plain),
        "the portable kernels were not logged"
    );
    let plain_tokens = tokens(&plain);
    assert_eq!(plain_tokens.len(), 32, "{plain_tokens:?}");
    // Speculation is exact on the portable kernels too: prompt lookup at a fixed γ gives the
    // plain output token for token.
    let spec = generate(
        &[],
        &off,
        32,
        &[
            "--ignore-eos",
            "--draft-model",
            "prompt-lookup",
            "--gamma",
            "4",
        ],
    );
    assert_eq!(tokens(&spec), plain_tokens);
    // With the wide kernels on, the log names them.
    let wide = generate(&[], &[], 4, &[]);
    assert!(!says_portable(&wide));
    assert!(String::from_utf8_lossy(&wide.stderr).contains("AVX2+FMA+F16C"));
}

/// On an emulated CPU without AVX (Intel Nehalem, under `qemu-x86_64`): the binary starts,
/// logs that it runs portable code, and generates the same tokens as the switched-off kernels
/// on this machine (the same portable code).
#[test]
fn runs_on_a_cpu_without_avx() {
    let qemu = "qemu-x86_64";
    assert!(
        Command::new(qemu).arg("--version").output().is_ok(),
        "qemu-x86_64 is missing: scripts/test installs Debian's qemu-user"
    );
    let emulated = generate(&[qemu, "-cpu", "Nehalem"], &[], 4, &[]);
    assert!(
        says_portable(&emulated),
        "no portable-kernel warning under Nehalem"
    );
    let here = generate(&[], &[("TANDEM_DISABLE_AVX2", "1")], 4, &[]);
    assert_eq!(tokens(&emulated), tokens(&here));
}
