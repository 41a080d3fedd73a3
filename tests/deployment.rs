//! The config files tandem ships for deployment load with tandem's own config loader, exactly
//! as `tandem serve --config FILE` reads them: the Kubernetes ConfigMaps' TOML (deploy/) and the
//! example configs (config/). `scripts/check-deploy` validates the manifests around them.

use std::path::{Path, PathBuf};

use tandem::config::Config;

fn shipped_configs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![
        root.join("config/default.toml"),
        root.join("config/llama-3.2-1b-3b.toml"),
        root.join("deploy/base/tandem.toml"),
    ];
    for overlay in std::fs::read_dir(root.join("deploy/overlays")).unwrap() {
        let path = overlay.unwrap().path().join("tandem.toml");
        if path.exists() {
            files.push(path);
        }
    }
    files
}

#[test]
fn every_shipped_config_file_loads() {
    let files = shipped_configs();
    assert!(files.len() >= 4, "{files:?}");
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let config = Config::from_toml(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if path.components().any(|c| c.as_os_str() == "deploy") {
            // In a pod the server must listen beyond loopback, and Kubernetes' preStop does
            // the draining.
            assert_eq!(config.server.host, "0.0.0.0", "{}", path.display());
            assert_eq!(config.server.drain_seconds, 0, "{}", path.display());
            assert_eq!(config.logging.format, "json", "{}", path.display());
        }
    }
}

#[test]
fn the_prometheus_rule_is_generated_from_the_alert_rules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(root.join("scripts/render-prometheus-rule"))
        .arg("--check")
        .output()
        .expect("the script runs");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
