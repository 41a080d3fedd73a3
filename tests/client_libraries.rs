//! The client libraries people build on (LangChain, LiteLLM, instructor; pinned, installed by
//! `scripts/test` under `target/client-libraries`), unchanged, against a live server on the
//! default model: `tests/client_libraries.py` says what each must do.

use crate::common;

use std::process::Command;

use common::http::Server;

#[test]
fn langchain_litellm_and_instructor_work_unchanged() {
    let server = Server::start(&["--draft-model", "prompt-lookup"], &[]);
    let libs = concat!(env!("CARGO_MANIFEST_DIR"), "/target/client-libraries");
    let path = match std::env::var("PYTHONPATH") {
        Ok(p) if !p.is_empty() => format!("{libs}:{p}"),
        _ => libs.to_string(),
    };
    let out = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/client_libraries.py"
        ))
        .arg(format!("http://{}/v1", server.addr))
        .env("PYTHONPATH", path)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "client libraries failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("client libraries: ok"));
}
