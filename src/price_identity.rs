//! What a remembered price table and acceptance depend on, written out as text: the model
//! files, the machine, the build and the settings.
//!
//! Why it exists: the governor's prices are this machine's, for these files at these types
//! and thread counts, and its acceptance is this drafter's on this target. A table kept in the
//! cache directory must never be reused for anything else, so its file is named by, and holds,
//! everything it was learned under. Files are named by path, size and modification time (a
//! content hash of a multi-gigabyte model would cost more than the calibration it saves).

use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::draft::DraftSpec;
use crate::engine::PriceMemory;
use crate::model::loaded::cache_dir;
use crate::model::ModelSource;

/// Where and under what identity the governor keeps its learning for `config`, or none when
/// `engine.remember_prices` is off.
pub fn price_memory(config: &Config) -> Option<PriceMemory> {
    if !config.engine.remember_prices {
        return None;
    }
    let mut lines = vec![
        format!("tandem {}", env!("CARGO_PKG_VERSION")),
        format!("cpu {}", machine()),
    ];
    if let Ok(exe) = std::env::current_exe() {
        lines.push(format!("build {}", file_identity(&exe)));
    }
    for spec in std::iter::once(config.model.path.as_str())
        .chain(draft_models(&config.speculation.draft_model))
    {
        lines.extend(
            model_files(spec)
                .iter()
                .map(|p| format!("file {}", file_identity(p))),
        );
    }
    lines.push(format!("model {:?}", config.model));
    lines.push(format!("runtime {:?}", config.runtime));
    lines.push(format!("speculation {:?}", config.speculation));
    Some(PriceMemory {
        dir: cache_dir().join("governor"),
        identity: lines.join("\n"),
    })
}

/// The CPU's model name, the vector instructions the kernels use, and the cores.
fn machine() -> String {
    let name = crate::model::kernels::cpu_kernels::cpu_name();
    let level =
        crate::model::kernels::cpu_kernels::vector_level().unwrap_or_else(|| "portable".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{name} | {level} | {cores} cores")
}

/// The model names a drafter loads (none for prompt lookup or `self:K`).
fn draft_models(spec: &DraftSpec) -> Vec<&str> {
    match spec {
        DraftSpec::Model(m) => vec![m.as_str()],
        DraftSpec::Head { path: Some(p), .. } => vec![p.as_str()],
        DraftSpec::LookupThen(_, inner) => draft_models(inner),
        _ => Vec::new(),
    }
}

/// The files a model name stands for: its file, or every file of its folder.
fn model_files(spec: &str) -> Vec<PathBuf> {
    let path = ModelSource::resolve(spec)
        .map(|s| s.path().to_owned())
        .unwrap_or_else(|_| PathBuf::from(spec));
    if !path.is_dir() {
        return vec![path];
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(&path)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// A file named by its path, size and modification time.
fn file_identity(path: &Path) -> String {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    match std::fs::metadata(&path) {
        Ok(m) => {
            let modified = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            format!("{} {} {modified}", path.display(), m.len())
        }
        Err(_) => format!("{} missing", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_names_the_files_the_machine_and_the_settings() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.gguf");
        std::fs::write(&model, b"GGUF").unwrap();
        let mut config = Config::embedded();
        config.model.path = model.display().to_string();
        let a = price_memory(&config).expect("on by default");
        assert!(
            a.identity
                .contains(&format!("{} 4 ", model.canonicalize().unwrap().display())),
            "{}",
            a.identity
        );
        assert!(a.identity.contains("cores"));
        assert!(a.dir.ends_with("governor"));

        std::fs::write(&model, b"GGUF, longer").unwrap();
        let b = price_memory(&config).unwrap();
        assert_ne!(a.identity, b.identity, "another file under the same name");

        config.runtime.threads = 7;
        assert_ne!(
            price_memory(&config).unwrap().identity,
            b.identity,
            "other settings"
        );

        config.engine.remember_prices = false;
        assert!(price_memory(&config).is_none());
    }

    #[test]
    fn a_draft_models_files_are_named_too() {
        let spec: DraftSpec = "draft+prompt-lookup:/x/d.gguf".parse().unwrap();
        assert_eq!(draft_models(&spec), vec!["/x/d.gguf"]);
        assert!(draft_models(&"prompt-lookup".parse().unwrap()).is_empty());
    }
}
