//! Live settings from the config file: the `[speculation]` table is reloaded when the file
//! changes (a Kubernetes ConfigMap update) or on SIGHUP.
//!
//! Why it exists: the admin API changes one process's settings; a fleet of replicas shares one
//! config file, which is then the source of truth. The whole file is parsed and checked as at
//! start-up, and its speculation settings are applied at once, like `PUT /admin/speculation`:
//! a bad file changes nothing, and is logged and counted.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::Config;
use crate::engine::{LiveSpeculation, SpeculationSettings};
use crate::telemetry;

/// How often the file is read for changes (a ConfigMap update lands within about a minute).
const POLL: Duration = Duration::from_secs(1);

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    #[error("speculation.{0}")]
    Settings(#[from] crate::engine::SettingsError),
    #[error("model.path: {0} (the next start would fail on it)")]
    MissingModel(String),
}

/// Reads `path` and makes its `[speculation]` table the live settings.
pub fn reload(path: &Path, live: &LiveSpeculation) -> Result<SpeculationSettings, ReloadError> {
    let config = Config::from_file(path)?;
    // Only the speculation settings apply now, but the file is the one the next start reads:
    // a model that is not there would fail that start, so the file is refused now.
    crate::model::ModelSource::resolve(&config.model.path)
        .map_err(|e| ReloadError::MissingModel(e.to_string()))?;
    Ok(live.replace(config.speculation.settings)?)
}

/// Reloads and says how it went; returns the settings it made live.
fn reload_and_report(
    path: &Path,
    live: &LiveSpeculation,
    why: &str,
) -> Option<SpeculationSettings> {
    let before = live.get();
    match reload(path, live) {
        Ok(after) => {
            telemetry::record_config_reload(true);
            telemetry::set_speculation(after.lenience.get(), after.gamma_gauge());
            tracing::info!(
                path = %path.display(),
                why,
                change = %crate::engine::speculation_settings::describe_change(&before, &after),
                "speculation settings reloaded"
            );
            Some(after)
        }
        Err(e) => {
            telemetry::record_config_reload(false);
            tracing::warn!(path = %path.display(), why, error = %e, "config reload failed; settings unchanged");
            None
        }
    }
}

/// Watches the config file (when there is one) and SIGHUP for as long as the server runs.
/// The SIGHUP handler is installed at once, before the models load, so a SIGHUP never
/// terminates the process.
pub fn spawn(path: Option<PathBuf>, live: impl Fn() -> Option<LiveSpeculation> + Send + 'static) {
    #[cfg(unix)]
    let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP");
            None
        }
    };
    tokio::spawn(async move {
        let mut seen = path.as_ref().and_then(|p| std::fs::read(p).ok());
        // The settings the last successful reload made live.
        let mut applied: Option<SpeculationSettings> = None;
        loop {
            #[cfg(unix)]
            let hup = async {
                match hangup.as_mut() {
                    Some(s) => s.recv().await,
                    None => std::future::pending().await,
                }
            };
            #[cfg(not(unix))]
            let hup = std::future::pending::<Option<()>>();
            let why = tokio::select! {
                _ = hup => "SIGHUP",
                _ = tokio::time::sleep(POLL) => "file changed",
            };
            let Some(p) = &path else {
                if why == "SIGHUP" {
                    tracing::info!("SIGHUP: no config file to reload (start with --config)");
                }
                continue;
            };
            // One change is one reload, whichever of the watcher and a SIGHUP sees it first. A
            // SIGHUP of content already applied reloads only where the live settings moved
            // since (the admin API changed them: the file puts its settings back) or the last
            // reload failed.
            let now = std::fs::read(p).ok();
            let Some(settings) = live() else {
                // A change made while loading is applied once the models are up.
                if why == "SIGHUP" {
                    tracing::info!("SIGHUP: models still loading; the config is read when ready");
                }
                continue;
            };
            if now == seen {
                let current = applied.is_some_and(|a| a == settings.get());
                if why == "file changed" || current {
                    if why == "SIGHUP" {
                        tracing::info!("SIGHUP: the config file's settings are already live");
                    }
                    continue;
                }
            }
            seen = now;
            applied = reload_and_report(p, &settings, why);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_file_changes_nothing_and_a_good_one_applies_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tandem.toml");
        let live = LiveSpeculation::new(SpeculationSettings::default(), 8).unwrap();
        std::fs::write(&path, "[speculation]\nlenience = 0.5\ngamma = 3\n").unwrap();
        let after = reload(&path, &live).unwrap();
        assert_eq!(after.lenience.get(), 0.5);
        assert_eq!(live.get(), after);
        for bad in [
            "[speculation]\nlenience = 7\n",
            "[speculation]\ngamma = 99\n",
            "[speculation\n",
            "[engine]\nmax_seqs = 0\n",
            "[speculation]\nlenience = 0.9\nunknown_key = 1\n",
            "[model]\npath = \"/no/such/model.gguf\"\n[speculation]\nlenience = 0.9\n",
        ] {
            std::fs::write(&path, bad).unwrap();
            assert!(reload(&path, &live).is_err(), "{bad}");
            assert_eq!(live.get(), after, "{bad} changed the settings");
        }
        std::fs::remove_file(&path).unwrap();
        assert!(reload(&path, &live).is_err());
    }
}
