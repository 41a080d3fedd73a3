//! The governor's remembered prices and acceptance on disk: one JSON file per model files,
//! machine and settings, under the cache directory.
//!
//! Why it exists: a fresh `tandem serve` or `tandem generate` would otherwise time every
//! verification width and the drafter's steps before its first request, and plan that
//! request on a pooled guess of acceptance. With a file here, start-up times two forwards to
//! check the remembered prices still hold, and new requests start from what earlier
//! processes' drafts did. The file names a hash of its identity and holds the identity in
//! full: a file whose identity differs (a hash collision, another build's format) or that
//! does not parse is ignored, never trusted.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::governor::Remembered;

/// Where the governor's learning is kept and what it is kept for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PriceMemory {
    /// The folder of memory files (`<cache>/governor`).
    pub dir: PathBuf,
    /// What the prices and rates depend on outside the engine: the model files, the machine,
    /// the build and the settings, as text.
    pub identity: String,
}

/// The file layout's version, or how its prices are measured (6: first draft steps priced by
/// the tokens fed into them): a file of another version is ignored.
const VERSION: u32 = 6;

/// Saved at most this often while requests finish (always after the first).
const SAVE_EVERY: Duration = Duration::from_secs(30);

#[derive(Serialize)]
struct Saving<'a> {
    version: u32,
    identity: &'a str,
    remembered: &'a Remembered,
}

#[derive(Deserialize)]
struct Saved {
    version: u32,
    identity: String,
    remembered: Remembered,
}

/// One engine's memory file.
#[derive(Debug)]
pub struct MemoryFile {
    path: PathBuf,
    identity: String,
    last_saved: Option<Instant>,
    /// The check forwards of the prices in use (see [`Remembered::reference`]), saved with
    /// them.
    reference: Vec<(usize, f64)>,
    /// A save has failed: later failures are not warned about again (a read-only cache
    /// folder would otherwise warn every half minute).
    failed: bool,
}

impl MemoryFile {
    /// The file for `memory` and the engine's own settings (`engine`, as text).
    pub fn new(memory: &PriceMemory, engine: &str) -> Self {
        let identity = format!("{}\n{engine}", memory.identity);
        let path = memory
            .dir
            .join(format!("{:016x}.json", fnv1a(identity.as_bytes())));
        Self {
            path,
            identity,
            last_saved: None,
            reference: Vec::new(),
            failed: false,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the file remembers, if it is there, reads, and was saved for this identity.
    pub fn load(&self) -> Option<Remembered> {
        let text = match std::fs::read(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "governor memory unreadable; measuring prices");
                return None;
            }
        };
        match serde_json::from_slice::<Saved>(&text) {
            Ok(s) if s.version == VERSION && s.identity == self.identity => Some(s.remembered),
            Ok(_) => {
                tracing::info!(path = %self.path.display(), "governor memory is for another build or setup; measuring prices");
                None
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "governor memory does not parse; measuring prices");
                None
            }
        }
    }

    /// The check forwards the prices in use were measured with, for saving with them.
    pub fn set_reference(&mut self, reference: Vec<(usize, f64)>) {
        self.reference = reference;
    }

    pub fn reference(&self) -> &[(usize, f64)] {
        &self.reference
    }

    /// Saves prices just measured at start-up, before any request has run: a server that is
    /// stopped before its first request ends still starts faster next time. It does not count
    /// as a save for [`MemoryFile::due`]: the first request's end saves what it taught.
    pub fn save_start_up(&mut self, remembered: &Remembered) {
        let last = self.last_saved;
        self.save(remembered, Instant::now());
        self.last_saved = last;
    }

    /// Whether it is time to save again.
    pub fn due(&self, now: Instant) -> bool {
        self.last_saved
            .is_none_or(|t| now.duration_since(t) >= SAVE_EVERY)
    }

    /// Writes `remembered` whole, logging a failure (a warning the first time only).
    pub fn save(&mut self, remembered: &Remembered, now: Instant) {
        self.last_saved = Some(now);
        match self.write(remembered) {
            Ok(()) => tracing::debug!(path = %self.path.display(), "governor memory saved"),
            Err(e) if !self.failed => {
                self.failed = true;
                tracing::warn!(path = %self.path.display(), error = %e, "governor memory not saved; running without it");
            }
            Err(e) => {
                tracing::debug!(path = %self.path.display(), error = %e, "governor memory not saved")
            }
        }
    }

    /// Writes `remembered` to a temporary file renamed over the old one, so a reader (or a
    /// crash) never sees half a file.
    fn write(&self, remembered: &Remembered) -> std::io::Result<()> {
        let text = serde_json::to_vec(&Saving {
            version: VERSION,
            identity: &self.identity,
            remembered,
        })
        .map_err(std::io::Error::other)?;
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = self
            .path
            .with_extension(format!("tmp{}", std::process::id()));
        std::fs::File::create(&tmp)?.write_all(&text)?;
        std::fs::rename(&tmp, &self.path).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    }
}

/// FNV-1a, 64 bits: a stable name for an identity (the file holds the identity in full, so
/// a collision is caught on reading).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::governor::{ConfidenceRates, CostModel, PooledAcceptance};

    fn remembered(step: f64) -> Remembered {
        let mut costs = CostModel::new(4);
        costs.record_forward(step, &[(1, 0)], &[]);
        Remembered {
            costs,
            reference: vec![(1, step)],
            acceptance: PooledAcceptance::new(0.3),
            chain_rates: ConfidenceRates::default(),
            branch_rates: ConfidenceRates::default(),
        }
    }

    fn memory(dir: &Path, identity: &str) -> PriceMemory {
        PriceMemory {
            dir: dir.join("governor"),
            identity: identity.into(),
        }
    }

    #[test]
    fn what_is_saved_loads_back_for_the_same_identity_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut file = MemoryFile::new(&memory(dir.path(), "model a"), "engine 1");
        assert!(file.load().is_none(), "nothing saved yet");
        assert!(file.due(Instant::now()));
        file.save(&remembered(0.004), Instant::now());
        assert!(!file.due(Instant::now()), "saved just now");
        let back = file.load().expect("loads");
        assert_eq!(back.costs.verify_seconds(1), Some(0.004));
        assert_eq!(back.acceptance, PooledAcceptance::new(0.3));

        let other = MemoryFile::new(&memory(dir.path(), "model b"), "engine 1");
        assert_ne!(other.path(), file.path());
        assert!(other.load().is_none());
        let other = MemoryFile::new(&memory(dir.path(), "model a"), "engine 2");
        assert!(other.load().is_none(), "another engine setting");

        // Saving again replaces the file whole; nothing temporary is left behind.
        file.save(&remembered(0.005), Instant::now());
        assert_eq!(file.load().unwrap().costs.verify_seconds(1), Some(0.005));
        let names: Vec<_> = std::fs::read_dir(dir.path().join("governor"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn a_damaged_or_foreign_file_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let mut file = MemoryFile::new(&memory(dir.path(), "model a"), "engine 1");
        file.save(&remembered(0.004), Instant::now());
        let text = std::fs::read_to_string(file.path()).unwrap();
        std::fs::write(file.path(), &text[..text.len() / 2]).unwrap();
        assert!(file.load().is_none(), "half a file");
        std::fs::write(file.path(), text.replace("model a", "model b")).unwrap();
        assert!(file.load().is_none(), "another identity under this name");
        let (now, before) = (
            format!("\"version\":{VERSION}"),
            format!("\"version\":{}", VERSION - 1),
        );
        assert!(text.contains(&now), "{text}");
        std::fs::write(file.path(), text.replace(&now, &before)).unwrap();
        assert!(file.load().is_none(), "another version");
        std::fs::write(file.path(), &text).unwrap();
        assert!(file.load().is_some());
    }

    #[test]
    fn a_folder_that_cannot_be_written_loses_nothing_but_the_memory() {
        let dir = tempfile::tempdir().unwrap();
        // A file where the folder should be: nothing can be created under it.
        std::fs::write(dir.path().join("governor"), b"not a folder").unwrap();
        let mut file = MemoryFile::new(&memory(dir.path(), "model a"), "engine 1");
        file.save(&remembered(0.004), Instant::now());
        assert!(file.failed);
        assert!(!file.due(Instant::now()), "not retried at once");
        assert!(file.load().is_none());
    }

    #[test]
    fn names_are_stable() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
