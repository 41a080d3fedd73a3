//! Process-wide compute settings that must be fixed before candle runs anything.
//!
//! candle sizes its global thread pools from `CANDLE_NUM_THREADS` / `RAYON_NUM_THREADS` the first
//! time they are used, so `--threads` has to reach the environment first.

/// Sets the compute thread count (0 = all cores) and returns the count in force. Call it once,
/// at start-up, before any tensor work.
pub fn init_threads(threads: usize) -> usize {
    let n = thread_count(threads);
    // Single-threaded at this point of start-up, so mutating the environment is sound.
    std::env::set_var("CANDLE_NUM_THREADS", n.to_string());
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    n
}

/// The compute thread count `threads` stands for (0 = all cores), without setting anything.
pub fn thread_count(threads: usize) -> usize {
    if threads == 0 {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    } else {
        threads
    }
}
