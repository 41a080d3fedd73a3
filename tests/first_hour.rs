//! What a newcomer meets first: `scripts/serve-default` says it is building before cargo's
//! long first build starts, instead of minutes of silence.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

#[test]
fn serve_default_says_it_is_building_before_it_builds() {
    let model = common::default_model();
    let cache = model
        .parent()
        .and_then(Path::parent)
        .expect("<cache>/models/<file>");
    // A stand-in `cargo` that says it ran and fails, so the script stops right there.
    let bin = tempfile::tempdir().unwrap();
    let cargo = bin.path().join("cargo");
    std::fs::write(&cargo, "#!/bin/sh\necho \"FAKE CARGO $*\" >&2\nexit 3\n").unwrap();
    std::fs::set_permissions(&cargo, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/serve-default"))
        .env("PATH", path)
        .env("TANDEM_CACHE", cache)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "the script stops where cargo failed"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let said = stderr
        .find("serve-default: building tandem (release)")
        .unwrap_or_else(|| panic!("no word of the build: {stderr}"));
    let built = stderr
        .find("FAKE CARGO build --release")
        .expect("cargo builds");
    assert!(said < built, "{stderr}");
    // Cargo's own progress is shown (no --quiet).
    assert!(!stderr.contains("--quiet"), "{stderr}");
}
