//! What memory this process may use, as Linux states it: the machine's (`/proc/meminfo`) and
//! the process's cgroup limit (`memory.max`), the smaller of the two. Read where a size is
//! chosen from memory (the prefix cache's budget) and where a model is checked to fit before
//! its weights are read.

/// All the memory the process may use: the machine's total, or its cgroup's limit if smaller.
pub fn total() -> Option<usize> {
    let machine = meminfo("MemTotal:");
    min_known(machine, cgroup("memory.max"))
}

/// The memory the process could take now: the machine's available memory, or what its
/// cgroup's limit leaves if smaller.
pub fn available() -> Option<usize> {
    let machine = meminfo("MemAvailable:");
    let left = match (cgroup("memory.max"), cgroup("memory.current")) {
        (Some(max), Some(used)) => Some(max.saturating_sub(used)),
        _ => None,
    };
    min_known(machine, left)
}

fn min_known(a: Option<usize>, b: Option<usize>) -> Option<usize> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A `/proc/meminfo` line's value in bytes.
fn meminfo(key: &str) -> Option<usize> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// A cgroup v2 file's number (`max` and absent files: none).
fn cgroup(file: &str) -> Option<usize> {
    std::fs::read_to_string(format!("/sys/fs/cgroup/{file}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn available_memory_is_known_and_within_the_total_here() {
        let (total, available) = (total().unwrap(), available().unwrap());
        assert!(
            available > 0 && available <= total,
            "{available} of {total}"
        );
    }
}
