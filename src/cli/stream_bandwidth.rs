//! The memory bandwidth one forward can use: how fast `threads` threads stream a buffer far
//! larger than the caches.
//!
//! Why it exists: a decode step on a CPU is bound by reading the weights, so its floor is
//! bytes read over this bandwidth. `forward-bench` prints the step against that floor, which
//! says how much any kernel work could still gain on the machine at hand.

use std::time::Instant;

/// Bytes streamed per pass: far past any last-level cache of the machines we run on.
const BUFFER_BYTES: usize = 512 << 20;

/// A buffer far larger than the caches, mapped once, and the threads that stream it.
pub struct Stream {
    words: Vec<u64>,
    threads: usize,
}

impl Stream {
    /// A 512 MiB buffer, written first so every page is mapped before any timed read, to be
    /// read by `threads` threads.
    pub fn new(threads: usize) -> Self {
        Self {
            words: (0..(BUFFER_BYTES / 8) as u64).collect(),
            threads: threads.max(1),
        }
    }

    /// The best of `passes` timed reads of the buffer split over the threads, in bytes per
    /// second.
    pub fn best_of(&self, passes: usize) -> f64 {
        let chunk = self.words.len().div_ceil(self.threads);
        let mut best = f64::INFINITY;
        let mut sink = 0u64;
        for _ in 0..passes.max(1) {
            let start = Instant::now();
            let sums: Vec<u64> = std::thread::scope(|s| {
                let handles: Vec<_> = self
                    .words
                    .chunks(chunk)
                    .map(|part| s.spawn(move || sum_words(part)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("a reader thread panicked"))
                    .collect()
            });
            best = best.min(start.elapsed().as_secs_f64());
            sink = sink.wrapping_add(sums.iter().fold(0, |a, &b| a.wrapping_add(b)));
        }
        std::hint::black_box(sink);
        BUFFER_BYTES as f64 / best
    }
}

/// Four independent sums, so the loop is bound by loads rather than by one add chain.
fn sum_words(words: &[u64]) -> u64 {
    let mut acc = [0u64; 4];
    let mut quads = words.chunks_exact(4);
    for q in &mut quads {
        for (a, &w) in acc.iter_mut().zip(q) {
            *a = a.wrapping_add(w);
        }
    }
    let tail = quads
        .remainder()
        .iter()
        .fold(0u64, |a, &w| a.wrapping_add(w));
    acc.iter().fold(tail, |a, &w| a.wrapping_add(w))
}

#[cfg(test)]
mod tests {
    #[test]
    fn sums_every_word() {
        let words: Vec<u64> = (1..=10).collect();
        assert_eq!(super::sum_words(&words), 55);
        assert_eq!(super::sum_words(&[]), 0);
    }
}
