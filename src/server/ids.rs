//! The ids the server hands out (`chatcmpl-…`, `cmpl-…`, `resp_…`): 128 random bits each.
//!
//! Why it exists: an id is the only handle on a stored response, so it must not be guessable
//! from another: no counter, no process id, nothing shared between two ids but their kind.

/// A fresh id of `kind` with `sep` between, such as `resp_6f1c…` (32 hex digits).
pub(super) fn fresh_id(kind: &str, sep: char) -> String {
    format!("{kind}{sep}{:032x}", random_u128())
}

/// 128 bits from the operating system's generator. Should it ever fail, std's per-process
/// random hash keys over the time and a counter stand in (still unpredictable from outside,
/// if weaker).
fn random_u128() -> u128 {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_ok() {
        return u128::from_le_bytes(bytes);
    }
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static FALLBACK: AtomicU64 = AtomicU64::new(0);
    let n = FALLBACK.fetch_add(1, Ordering::Relaxed);
    let half = |salt: u64| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(n ^ salt);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.finish() as u128
    };
    half(0) << 64 | half(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_128_random_bits_and_no_counter() {
        let a = fresh_id("resp", '_');
        let b = fresh_id("resp", '_');
        assert!(a.starts_with("resp_") && a.len() == 5 + 32, "{a}");
        assert_ne!(a, b);
        // Two consecutive ids share about 16 of 32 hex digits' positions by chance at most,
        // never a common prefix past the kind as a counter's would.
        let same = a[5..]
            .chars()
            .zip(b[5..].chars())
            .filter(|(x, y)| x == y)
            .count();
        assert!(same < 16, "{a} {b}");
        assert_ne!(&a[5..13], &b[5..13]);
    }
}
