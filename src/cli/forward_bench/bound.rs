//! `forward-bench`'s memory bound: the bandwidth sampled between the timed forwards, and the
//! first width's forward against the least time that bandwidth allows its bytes.
//!
//! Why it exists apart: the bound is a measurement of its own (the machine's stream, beside the
//! forwards) with its own rounds and report; the timing loops only run their rounds through it.

use tandem::config::Config;

use super::ForwardTimer;
use crate::cli::stream_bandwidth::Stream;
use crate::cli::CliError;

/// The stream the bound is measured with: `config`'s threads reading a buffer far past the
/// caches.
pub(super) fn stream(config: &Config) -> Stream {
    Stream::new(tandem::runtime::thread_count(config.runtime.threads))
}

/// The bandwidth samples a run took across its timed forwards, in bytes per second.
pub(super) struct Bandwidth(Vec<f64>);

impl Bandwidth {
    /// Their median (the lower middle one of an even count).
    fn median(&self) -> f64 {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        v.get(v.len().saturating_sub(1) / 2)
            .copied()
            .unwrap_or(f64::NAN)
    }

    fn spread(&self) -> (f64, f64) {
        let lo = self.0.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = self.0.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (lo, hi)
    }
}

/// The timed rounds `0..repeats` in at most [`BANDWIDTH_SAMPLES`] runs of nearly equal length,
/// each of which starts with a bandwidth sample.
fn sampled_blocks(repeats: usize) -> Vec<std::ops::Range<usize>> {
    let n = BANDWIDTH_SAMPLES.min(repeats).max(1);
    (0..n)
        .map(|b| b * repeats / n..(b + 1) * repeats / n)
        .collect()
}

/// Bandwidth samples a run of the widths takes, spread across its timed rounds.
const BANDWIDTH_SAMPLES: usize = 3;

/// Runs `round(salt, timed)` for `repeats` timed rounds, sampling `stream`'s bandwidth before
/// each of [`sampled_blocks`]; what it sampled.
///
/// The bound's bandwidth is sampled between the rounds, as the widths take turns within them:
/// on a shared VM it moved from 29 to 42 GB/s between runs minutes apart, so a bound taken at
/// another moment than the forwards says little of them. A sample evicts the caches, so an
/// untimed round (`timed` false) warms them again after each, the first one included.
pub(super) fn in_sampled_rounds(
    repeats: usize,
    stream: &Stream,
    mut round: impl FnMut(usize, bool) -> Result<(), CliError>,
) -> Result<Bandwidth, CliError> {
    let mut samples = Vec::with_capacity(BANDWIDTH_SAMPLES);
    let mut salt = 0;
    for block in sampled_blocks(repeats) {
        samples.push(stream.best_of(2));
        for timed in std::iter::once(false).chain(block.map(|_| true)) {
            salt += 1;
            round(salt, timed)?;
        }
    }
    Ok(Bandwidth(samples))
}

/// The first width's forward against the least time the machine's memory bandwidth allows it,
/// at the median of the bandwidth sampled across the timed forwards.
pub(super) fn print_memory_bound(
    config: &Config,
    timer: &ForwardTimer<'_>,
    (k0, ms): (usize, f64),
    bandwidth: &Bandwidth,
) {
    let (model, depth) = (timer.model, timer.depth);
    // Every forward streams the weights a token reads (a mixture's chosen experts: a 1-token
    // forward's least) once and the cache once: of a windowed layer (Gemma 3's local ones),
    // only its window.
    let hp = model.hparams();
    let per_layer = timer.cache.bytes_per_token() / hp.num_layers.max(1);
    let seen = depth + k0;
    let kv: usize = (0..hp.num_layers)
        .map(|l| hp.window(l).map_or(seen, |w| w.min(seen)) * per_layer)
        .sum::<usize>()
        * timer.slots.len();
    let bytes = model.bytes_per_token() + kv;
    let threads = tandem::runtime::thread_count(config.runtime.threads);
    let median = bandwidth.median();
    let (lo, hi) = bandwidth.spread();
    let floor_ms = bytes as f64 / median * 1e3;
    println!();
    println!(
        "memory bound: a {k0}-token forward{} reads {:.1} MB (weights {:.1} MB, KV cache at \
         depth {depth}, windowed layers' windows); {threads} thread(s) streamed {:.1} GB/s \
         (the median of {} samples taken between the timed forwards, {:.1}-{:.1}), so it takes \
         at least {floor_ms:.2} ms; the measured {ms:.2} ms runs at {:.0}% of that bound",
        match timer.slots.len() {
            1 => String::new(),
            n => format!(" of {n} sequences"),
        },
        bytes as f64 / 1e6,
        model.bytes_per_token() as f64 / 1e6,
        median / 1e9,
        bandwidth.0.len(),
        lo / 1e9,
        hi / 1e9,
        floor_ms / ms * 100.0
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidth_is_sampled_before_each_third_of_the_timed_rounds() {
        assert_eq!(sampled_blocks(10), vec![0..3, 3..6, 6..10]);
        assert_eq!(sampled_blocks(2), vec![0..1, 1..2]);
        // Nothing timed still samples once, so the bound has a bandwidth.
        assert_eq!(sampled_blocks(0), vec![0..0]);
        let b = Bandwidth(vec![42e9, 29e9, 35e9]);
        assert_eq!(b.median(), 35e9);
        assert_eq!(b.spread(), (29e9, 42e9));
        assert_eq!(Bandwidth(vec![40e9, 30e9]).median(), 30e9);
    }
}
