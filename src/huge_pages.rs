//! The process's heap on transparent huge pages (2 MiB), where Linux grants them only to memory
//! that asks (`transparent_hugepage/enabled` set to `madvise`, the usual default).
//!
//! Why it exists: a step streams the weights and the KV cache, a few hundred MB, through 4 KiB
//! pages, a TLB miss and a page walk every 4 KiB. On 2 MiB pages a step at depth 2048 took
//! 0.87-0.93x the time (SmolLM2, every cache type, AMD Zen 5; `docs/performance.md`). glibc puts its heap on them when its tunable
//! `glibc.malloc.hugetlb=1` is set, and it reads tunables only as a process starts: so the
//! binary, before anything else, runs itself again with the tunable added to
//! `GLIBC_TUNABLES` (the same process id, arguments and descriptors: `exec`, not a child).
//! `TANDEM_HUGE_PAGES=false` leaves the heap as it is; a value it does not know stops the
//! start, naming it.

/// glibc's tunable that puts its heap on transparent huge pages (2.35 and later).
pub const TUNABLE: &str = "glibc.malloc.hugetlb";

/// Where the heap's pages stand, for the start-up line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeapPages {
    /// glibc was asked for huge pages and the kernel grants them.
    Huge,
    /// Every anonymous page is huge anyway (`enabled` is `always`).
    AlwaysHuge,
    /// 4 KiB pages, with why.
    Small(&'static str),
}

impl std::fmt::Display for HeapPages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeapPages::Huge => write!(f, "2 MiB (transparent huge pages, {TUNABLE}=1)"),
            HeapPages::AlwaysHuge => write!(f, "2 MiB (transparent huge pages always on)"),
            HeapPages::Small(why) => write!(f, "4 KiB ({why})"),
        }
    }
}

/// The value `tunables` (a `GLIBC_TUNABLES` string) gives the huge-page tunable, if any.
fn tunable_value(tunables: &str) -> Option<&str> {
    tunables.split(':').find_map(|kv| match kv.split_once('=') {
        Some((name, value)) if name == TUNABLE => Some(value),
        _ => None,
    })
}

/// `GLIBC_TUNABLES` with the huge-page tunable added, or `None` where it is set already
/// (by us before the `exec`, or by the user, whose value stands).
pub fn tunables_with_huge_pages(current: Option<&str>) -> Option<String> {
    match current {
        Some(t) if tunable_value(t).is_some() => None,
        Some(t) if !t.is_empty() => Some(format!("{t}:{TUNABLE}=1")),
        _ => Some(format!("{TUNABLE}=1")),
    }
}

/// Which of `always`, `madvise` or `never` the kernel's THP setting has chosen (the word in
/// brackets in `/sys/kernel/mm/transparent_hugepage/enabled`).
pub fn kernel_mode(enabled: &str) -> Option<&str> {
    let start = enabled.find('[')? + 1;
    let len = enabled[start..].find(']')?;
    Some(&enabled[start..start + len])
}

fn kernel_setting() -> Option<String> {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()
}

/// `TANDEM_HUGE_PAGES` that is neither true nor false.
#[derive(Debug, thiserror::Error)]
#[error("TANDEM_HUGE_PAGES must be true or false (or 1 or 0), not {0:?}")]
pub struct BadSetting(String);

/// Whether `TANDEM_HUGE_PAGES` asks for huge pages (unset: yes).
pub fn wanted() -> Result<bool, BadSetting> {
    match std::env::var("TANDEM_HUGE_PAGES") {
        Err(std::env::VarError::NotPresent) => Ok(true),
        Ok(v) if v == "true" || v == "1" => Ok(true),
        Ok(v) if v == "false" || v == "0" => Ok(false),
        Ok(v) => Err(BadSetting(v)),
        Err(std::env::VarError::NotUnicode(v)) => Err(BadSetting(v.to_string_lossy().into())),
    }
}

/// The heap's pages in this process, as [`run_on_huge_pages`] left them.
pub fn heap_pages() -> HeapPages {
    match kernel_setting().as_deref().and_then(kernel_mode) {
        Some("always") => HeapPages::AlwaysHuge,
        Some("madvise") => {
            let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
            match tunable_value(&tunables) {
                Some("1" | "2") => HeapPages::Huge,
                _ if matches!(wanted(), Ok(false)) => HeapPages::Small("TANDEM_HUGE_PAGES=false"),
                _ => HeapPages::Small("glibc was not asked for them"),
            }
        }
        Some(_) => HeapPages::Small("transparent huge pages are off in the kernel"),
        None => HeapPages::Small("no transparent huge pages here"),
    }
}

/// Runs this binary again with glibc's heap on huge pages, where the kernel grants them on
/// request and the tunable is not set yet; returns only where it does not (then the heap
/// stays on 4 KiB pages, which works, slower). A `TANDEM_HUGE_PAGES` it does not know is an
/// error.
pub fn run_on_huge_pages() -> Result<(), BadSetting> {
    let wanted = wanted()?;
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::os::unix::process::CommandExt;
        if !wanted || kernel_setting().as_deref().and_then(kernel_mode) != Some("madvise") {
            return Ok(());
        }
        let current = match std::env::var("GLIBC_TUNABLES") {
            Ok(t) => Some(t),
            Err(std::env::VarError::NotPresent) => None,
            // Not text: left alone rather than guessed at.
            Err(std::env::VarError::NotUnicode(_)) => return Ok(()),
        };
        let Some(tunables) = tunables_with_huge_pages(current.as_deref()) else {
            return Ok(());
        };
        let mut args = std::env::args_os();
        let mut command = std::process::Command::new("/proc/self/exe");
        if let Some(arg0) = args.next() {
            command.arg0(arg0);
        }
        // `exec` returns only when it failed; the process then goes on as it is.
        let _failed = command.args(args).env("GLIBC_TUNABLES", tunables).exec();
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = wanted;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tunable_is_added_once_beside_the_users_own() {
        let want = format!("{TUNABLE}=1");
        assert_eq!(tunables_with_huge_pages(None), Some(want.clone()));
        assert_eq!(tunables_with_huge_pages(Some("")), Some(want.clone()));
        assert_eq!(
            tunables_with_huge_pages(Some("glibc.malloc.arena_max=2")),
            Some(format!("glibc.malloc.arena_max=2:{want}"))
        );
        // Set already: by the first run (no second exec), or by the user, whose value holds.
        assert_eq!(tunables_with_huge_pages(Some(&want)), None);
        assert_eq!(
            tunables_with_huge_pages(Some("glibc.malloc.hugetlb=0:glibc.malloc.arena_max=2")),
            None
        );
        // A longer name that starts the same is another tunable.
        assert_eq!(
            tunables_with_huge_pages(Some("glibc.malloc.hugetlbx=1")),
            Some(format!("glibc.malloc.hugetlbx=1:{want}"))
        );
    }

    #[test]
    fn the_kernels_mode_is_the_bracketed_word() {
        assert_eq!(kernel_mode("always [madvise] never\n"), Some("madvise"));
        assert_eq!(kernel_mode("[always] madvise never"), Some("always"));
        assert_eq!(kernel_mode("always madvise [never]"), Some("never"));
        assert_eq!(kernel_mode("garbled"), None);
    }
}
