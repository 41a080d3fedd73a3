//! `tandem forward-bench`: the time of one forward of k new tokens against a cache of a given
//! depth, relative to a 1-token forward, the marginal cost of each extra token, and the first
//! forward against the memory-bandwidth bound.
//!
//! Why it exists: speculation pays off only when verifying γ + 1 tokens costs little more than
//! decoding one; this measures that ratio on the machine and model at hand, with nothing else
//! (no sampling, no scheduler) in the timing, and says how far a step is from what the
//! machine's memory allows.

use clap::Args;

use tandem::config::Config;
use tandem::model::{LogitsRows, SeqInput};

use super::model_args::{load_model, ModelArgs};
use super::stream_bandwidth;
use super::CliError;

#[derive(Args)]
pub struct ForwardBenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// New-token counts to time (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,5,9,16,64")]
    tokens: Vec<usize>,
    /// Tokens already in the cache before each timed forward.
    #[arg(long, default_value_t = 64)]
    depth: usize,
    /// Timed repetitions per count (the median is reported).
    #[arg(long, default_value_t = 10)]
    repeats: usize,
}

pub fn run(config: &Config, args: ForwardBenchArgs) -> Result<(), CliError> {
    let loaded = load_model(config)?;
    let model = &loaded.model;
    let vocab = model.hparams().vocab_size as u32;
    let mut cache = model.new_cache(1);
    let slot = cache.allocate().ok_or(CliError::NoCacheSlot)?;
    // Arbitrary but fixed token ids: the cost does not depend on which tokens they are.
    let ids = |n: usize, salt: usize| -> Vec<u32> {
        (0..n)
            .map(|i| ((i * 7919 + salt * 104_729) as u32) % vocab)
            .collect()
    };
    let max_k = args.tokens.iter().copied().max().unwrap_or(1);
    if args.depth + max_k > model.context_len() {
        return Err(CliError::DepthPastContext(model.context_len()));
    }
    model.forward(
        &mut cache,
        &[SeqInput {
            slot,
            start_pos: 0,
            tokens: &ids(args.depth.max(1), 0),
            logits: LogitsRows::None,
            parents: &[],
        }],
    )?;
    let depth = cache.len(slot)?;
    println!(
        "| new tokens | ms per forward | ms per token | cost vs 1 token | ms per extra token |"
    );
    println!("|---|---|---|---|---|");
    let mut base: Option<(usize, f64)> = None;
    for &k in &args.tokens {
        let mut times = Vec::with_capacity(args.repeats);
        for r in 0..args.repeats + 1 {
            let toks = ids(k, r + 1);
            let t = std::time::Instant::now();
            model.forward(
                &mut cache,
                &[SeqInput {
                    slot,
                    start_pos: depth,
                    tokens: &toks,
                    logits: LogitsRows::All,
                    parents: &[],
                }],
            )?;
            let dt = t.elapsed().as_secs_f64() * 1e3;
            cache.truncate_to(slot, depth)?;
            if r > 0 {
                times.push(dt); // the first run warms caches
            }
        }
        times.sort_by(f64::total_cmp);
        let ms = times[times.len() / 2];
        let (k0, one) = *base.get_or_insert((k, ms));
        // The marginal cost of a verified token: (forward of k - first) / (k - its k).
        let extra = if k > k0 {
            format!("{:.3}", (ms - one) / (k - k0) as f64)
        } else {
            "–".to_string()
        };
        println!(
            "| {k} | {ms:.2} | {:.2} | {:.2}x | {extra} |",
            ms / k as f64,
            ms / one
        );
    }
    if let Some((k0, ms)) = base {
        // Every forward streams the weights once and the cache once.
        let bytes = model.weight_bytes() + (depth + k0) * cache.bytes_per_token();
        let threads = tandem::runtime::thread_count(config.runtime.threads);
        let bandwidth = stream_bandwidth::measure(threads, 3);
        let floor_ms = bytes as f64 / bandwidth * 1e3;
        println!();
        println!(
            "memory bound: a {k0}-token forward reads {:.1} MB (weights {:.1} MB, KV cache at depth \
             {depth}); {threads} thread(s) stream {:.1} GB/s, so it takes at least {floor_ms:.2} ms; \
             the measured {ms:.2} ms runs at {:.0}% of that bound",
            bytes as f64 / 1e6,
            model.weight_bytes() as f64 / 1e6,
            bandwidth / 1e9,
            floor_ms / ms * 100.0
        );
    }
    Ok(())
}
