//! `tandem forward-bench`: the time of one forward of k new tokens (for each of N sequences)
//! against a cache of a given depth, relative to a 1-token forward, the marginal cost of each
//! extra token, and the first forward against the memory-bandwidth bound.
//!
//! Why it exists: speculation pays off only when verifying γ + 1 tokens costs little more than
//! decoding one; this measures that ratio on the machine and model at hand, with nothing else
//! (no sampling, no scheduler) in the timing, and says how far a step is from what the
//! machine's memory allows.

mod against;
mod bound;

use clap::Args;

use tandem::config::Config;
use tandem::model::decoder::expert_trace;
use tandem::model::decoder::op_profile::{self, Op};
use tandem::model::{Decoder, Kept, KvCache, LogitsRows, SeqInput};
use tandem::sampling::rejection::{accept_sampled, DraftDist};
use tandem::sampling::{probabilities, Lenience, SamplingParams, SeededRng};

use super::model_args::{load_model, ModelArgs};
use super::CliError;
use crate::cli::stream_bandwidth::Stream;
use bound::{in_sampled_rounds, print_memory_bound, Bandwidth};

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
    /// Sequences in each timed forward, each with its own cache at the depth and the width's
    /// new tokens: a server's batched step of that many requests.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    sequences: u16,
    /// Timed repetitions per count (the median is reported); the counts take turns, one
    /// forward each a round.
    #[arg(long, default_value_t = 10)]
    repeats: usize,
    /// Also break the forward down by operation: each one's time at 1 and at this many new
    /// tokens, the marginal cost of a token in each, and the matmuls against the multiply-add
    /// rate of the kernel's inner loop (0 = no breakdown).
    #[arg(long, default_value_t = 0)]
    ops: usize,
    /// Also time a draft step of this draft head (a head folder, or `default` for the default
    /// model's) against the 1-token forward [default: none].
    #[arg(long)]
    head: Option<String>,
    /// The head's reduced vocabulary for --head (0 = the whole vocabulary).
    #[arg(long, default_value_t = 8192)]
    draft_vocab: usize,
    /// Also time every count with this KV cache type (the model loaded a second time), the two
    /// types taking turns one forward at a time in this process, and print each count's time
    /// against the first type's [default: none].
    #[arg(long)]
    against_kv_cache_dtype: Option<String>,
}

pub fn run(config: &Config, args: ForwardBenchArgs) -> Result<(), CliError> {
    let loaded = load_model(config)?;
    let model = &loaded.model;
    let mut timer = ForwardTimer::fill(model, &args)?;
    if let Some(other) = &args.against_kv_cache_dtype {
        return against::compare_cache_types(config, &args, &mut timer, other);
    }
    let routed = model.hparams().experts;
    match routed {
        None => {
            println!(
                "| new tokens | ms per forward | ms per token | cost vs 1 token | ms per extra token |"
            );
            println!("|---|---|---|---|---|");
        }
        Some(_) => {
            println!(
                "| new tokens | ms per forward | ms per token | cost vs 1 token | ms per extra token \
                 | experts read per layer |"
            );
            println!("|---|---|---|---|---|---|");
        }
    }
    let stream = bound::stream(config);
    let (mut times, experts, bandwidth) = timer.time_widths(&args.tokens, &stream)?;
    let experts = routed.map(|_| experts);
    let base = print_widths(&args.tokens, &mut times, experts.as_deref());
    finish(config, &args, &mut timer, base.map(|b| (b, bandwidth)))
}

/// What follows the widths' table: the breakdown, the head's step and the memory bound
/// (`timed`: the first width's median ms, and the bandwidth sampled while it was timed).
fn finish(
    config: &Config,
    args: &ForwardBenchArgs,
    timer: &mut ForwardTimer<'_>,
    timed: Option<((usize, f64), Bandwidth)>,
) -> Result<(), CliError> {
    let base = timed.as_ref().map(|(b, _)| *b);
    let (model, depth) = (timer.model, timer.depth);
    if args.ops > 1 {
        print_breakdown(timer, args.ops)?;
    }
    if let (Some(dir), Some((_, one))) = (&args.head, base) {
        let step = time_head_step(model, dir, args.draft_vocab, depth, args.repeats)?;
        println!();
        println!(
            "draft head step (1 token, depth {depth}): {step:.3} ms, {:.0}% of a 1-token target \
             forward",
            step / one * 100.0
        );
    }
    if let Some((first, bandwidth)) = timed {
        print_memory_bound(config, timer, first, &bandwidth);
    }
    Ok(())
}

/// Per width, its forward times in ms.
type WidthTimes = Vec<Vec<f64>>;

/// A cache filled to `depth` in each of `--sequences` slots: every timed forward runs against
/// them all and is rolled back to them.
struct ForwardTimer<'a> {
    model: &'a Decoder,
    cache: KvCache,
    slots: Vec<usize>,
    depth: usize,
    /// Timed repetitions of each measurement (after one that warms caches).
    repeats: usize,
}

impl<'a> ForwardTimer<'a> {
    /// A cache with `--depth` tokens in each sequence's slot (other tokens in each), once the
    /// widest forward is known to fit after them.
    fn fill(model: &'a Decoder, args: &ForwardBenchArgs) -> Result<Self, CliError> {
        let sequences = usize::from(args.sequences);
        let mut cache = model.new_cache(sequences);
        let slots = (0..sequences)
            .map(|_| cache.allocate().ok_or(CliError::NoCacheSlot))
            .collect::<Result<Vec<_>, _>>()?;
        let max_k = args.tokens.iter().copied().max().unwrap_or(1);
        if args.depth + max_k > model.context_len() {
            return Err(CliError::DepthPastContext(model.context_len()));
        }
        // Every sequence's cache, filled before the first forward is timed: refused here, not
        // by the allocator (or the kernel's OOM killer) minutes into the filling.
        let need = sequences * (args.depth + max_k) * cache.bytes_per_token();
        if let Some(available) = tandem::model::load::host_memory::available() {
            if need > available {
                return Err(CliError::CachesPastMemory {
                    sequences,
                    need_gb: need as f64 / 1e9,
                    available_gb: available as f64 / 1e9,
                });
            }
        }
        let mut timer = ForwardTimer {
            model,
            cache,
            slots,
            depth: 0,
            repeats: args.repeats,
        };
        for s in 0..sequences {
            let toks = timer.ids(args.depth.max(1), s * 7);
            let slot = timer.slots[s];
            // Room for the depth and the widest forward up front, as a request's slot gets it
            // for its prompt and its tokens: the cache is then not grown (and copied) as it
            // fills, and its memory is laid out as a server's is.
            timer.cache.reserve(slot, args.depth.max(1) + max_k)?;
            timer.model.forward(
                &mut timer.cache,
                &[SeqInput {
                    slot,
                    start_pos: 0,
                    tokens: &toks,
                    logits: LogitsRows::None,
                    parents: &[],
                }],
            )?;
        }
        timer.depth = timer.cache.len(timer.slots[0])?;
        Ok(timer)
    }

    /// Arbitrary but fixed token ids: the cost does not depend on which tokens they are.
    fn ids(&self, n: usize, salt: usize) -> Vec<u32> {
        let vocab = self.model.hparams().vocab_size as u32;
        (0..n)
            .map(|i| ((i * 7919 + salt * 104_729) as u32) % vocab)
            .collect()
    }

    /// Every sequence's `k` new tokens (ids salted by `salt` and the sequence) at the depth,
    /// in one forward, then rolled back to the depth.
    fn step(&mut self, k: usize, salt: usize) -> Result<(), CliError> {
        let toks: Vec<Vec<u32>> = (0..self.slots.len())
            .map(|s| self.ids(k, salt + s * 7))
            .collect();
        let batch: Vec<SeqInput> = self
            .slots
            .iter()
            .zip(&toks)
            .map(|(&slot, tokens)| SeqInput {
                slot,
                start_pos: self.depth,
                tokens,
                logits: LogitsRows::All,
                parents: &[],
            })
            .collect();
        let done = self.model.forward(&mut self.cache, &batch);
        for &slot in &self.slots {
            self.cache.keep(slot, Kept::First(self.depth))?;
        }
        done?;
        Ok(())
    }

    /// One forward of `k` new tokens (ids salted by `salt`) at the depth, rolled back: its ms.
    fn time_one(&mut self, k: usize, salt: usize) -> Result<f64, CliError> {
        let t = std::time::Instant::now();
        self.step(k, salt)?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    }

    /// Each width's forward times in ms, `repeats` of them, (a mixture of experts) the distinct
    /// experts its forwards read per routed layer on average, and the memory bandwidth
    /// `stream` measured across them.
    fn time_widths(
        &mut self,
        widths: &[usize],
        stream: &Stream,
    ) -> Result<(WidthTimes, Vec<f64>, Bandwidth), CliError> {
        // Widths take turns, one forward each per round, so a machine whose speed drifts during
        // the run (a shared VM) moves every width alike and their ratios stay fair.
        let mut times = vec![Vec::with_capacity(self.repeats); widths.len()];
        let mut read = vec![(0usize, 0usize); widths.len()];
        let bandwidth = in_sampled_rounds(self.repeats, stream, |salt, timed| {
            for ((&k, times), read) in widths.iter().zip(&mut times).zip(&mut read) {
                expert_trace::record(true);
                let t = std::time::Instant::now();
                let done = self.step(k, salt);
                let dt = t.elapsed().as_secs_f64() * 1e3;
                let routes = expert_trace::take();
                expert_trace::record(false);
                done?;
                if timed {
                    times.push(dt);
                    read.0 += routes.iter().map(|l| l.distinct()).sum::<usize>();
                    read.1 += routes.len();
                }
            }
            Ok(())
        })?;
        let read = read
            .iter()
            .map(|&(sum, n)| sum as f64 / n.max(1) as f64)
            .collect();
        Ok((times, read, bandwidth))
    }

    /// Per operation, its median time in seconds over `repeats` forwards of `k` new tokens.
    fn time_ops(&mut self, k: usize) -> Result<Vec<(Op, f64)>, CliError> {
        let mut runs: Vec<Vec<(Op, f64)>> = Vec::with_capacity(self.repeats);
        for r in 0..self.repeats + 1 {
            op_profile::enable(true);
            let done = self.step(k, r + 1);
            let t = op_profile::take();
            op_profile::enable(false);
            done?;
            if r > 0 {
                runs.push(t);
            }
        }
        Ok(Op::ALL
            .iter()
            .enumerate()
            .map(|(i, &op)| {
                let mut v: Vec<f64> = runs.iter().map(|r| r[i].1).collect();
                v.sort_by(f64::total_cmp);
                (op, v[v.len() / 2])
            })
            .collect())
    }
}

/// The widths' table rows from their times (sorted here) and, for a mixture of experts, the
/// experts each width read per layer; returns the first width and its median ms, the base
/// every other width is compared with.
fn print_widths(
    widths: &[usize],
    times: &mut [Vec<f64>],
    experts: Option<&[f64]>,
) -> Option<(usize, f64)> {
    let mut base: Option<(usize, f64)> = None;
    for (i, (&k, times)) in widths.iter().zip(times).enumerate() {
        times.sort_by(f64::total_cmp);
        let ms = times[times.len() / 2];
        let (k0, one) = *base.get_or_insert((k, ms));
        // The marginal cost of a verified token: (forward of k - first) / (k - its k).
        let extra = if k > k0 {
            format!("{:.3}", (ms - one) / (k - k0) as f64)
        } else {
            "–".to_string()
        };
        let read = experts.map_or(String::new(), |e| format!(" {:.1} |", e[i]));
        println!(
            "| {k} | {ms:.2} | {:.2} | {:.2}x | {extra} |{read}",
            ms / k as f64,
            ms / one
        );
    }
    base
}

/// Per operation: its time in a forward of 1 and of `wide` new tokens (medians of `repeats`),
/// what one more token adds to it, and for the matmuls that against the multiply-add rate of
/// the kernel's own inner loop; then sampling and the acceptance rule over `wide` rows.
fn print_breakdown(timer: &mut ForwardTimer<'_>, wide: usize) -> Result<(), CliError> {
    let (one, many) = (timer.time_ops(1)?, timer.time_ops(wide)?);
    let (model, depth) = (timer.model, timer.depth);
    let peak = model.matmul_peak_macs_per_s(50)?;
    println!();
    println!(
        "per operation, 1 vs {wide} new tokens at depth {depth} (matmul kernel: {:.1} G \
         multiply-adds/s on cache-resident weights):",
        peak / 1e9
    );
    println!();
    println!(
        "| operation | ms at 1 | ms at {wide} | ms per extra token | share of it | \
         at the kernel's rate | measured / that |"
    );
    println!("|---|---|---|---|---|---|---|");
    print_op_rows(model, &one, &many, wide, peak);
    let best = time_sampling(model, wide, timer.repeats)?;
    println!(
        "| sampling and acceptance ({wide} rows) | – | {:.3} | {:.3} | – | – | – |",
        best * 1e3,
        best * 1e3 / wide as f64
    );
    Ok(())
}

/// One row per operation: its times at 1 and `wide` tokens, a token's marginal cost and its
/// share, and a matmul's against the kernel's `peak` multiply-add rate.
fn print_op_rows(model: &Decoder, one: &[(Op, f64)], many: &[(Op, f64)], wide: usize, peak: f64) {
    let macs = model.macs_per_token();
    let extra_total: f64 = one
        .iter()
        .zip(many)
        .map(|((_, a), (_, b))| (b - a).max(0.0))
        .sum::<f64>()
        / (wide - 1) as f64;
    for ((op, a), (_, b)) in one.iter().zip(many) {
        let extra = (b - a) / (wide - 1) as f64;
        // An operation the model has no multiply-adds of (a dense model's expert routing)
        // has no rate to be measured against.
        let (floor, ratio) = match macs.iter().find(|&&(o, m)| o == *op && m > 0) {
            Some(&(_, m)) => {
                let floor = m as f64 / peak;
                (
                    format!("{:.3}", floor * 1e3),
                    format!("{:.1}x", extra.max(0.0) / floor),
                )
            }
            None => ("–".into(), "–".into()),
        };
        println!(
            "| {} | {:.3} | {:.3} | {:.3} | {:.0}% | {floor} | {ratio} |",
            op.name(),
            a * 1e3,
            b * 1e3,
            extra * 1e3,
            extra.max(0.0) / extra_total.max(1e-12) * 100.0
        );
    }
}

/// The best time in seconds of sampling (softmax at temperature 1 over each row) and the
/// acceptance rule, on `wide` rows of the vocabulary's size: what the verifier adds after the
/// forward.
fn time_sampling(model: &Decoder, wide: usize, repeats: usize) -> Result<f64, CliError> {
    let vocab = model.hparams().vocab_size;
    let rows: Vec<Vec<f32>> = (0..wide)
        .map(|r| {
            (0..vocab)
                .map(|i| ((i * 31 + r * 17) % 101) as f32 / 10.0)
                .collect()
        })
        .collect();
    let params = SamplingParams {
        temperature: 1.0,
        ..SamplingParams::default()
    };
    let mut best = f64::INFINITY;
    let mut probs: Vec<Vec<f32>> = vec![Vec::new(); wide];
    let mut scratch = Vec::new();
    for _ in 0..repeats.max(3) {
        let t = std::time::Instant::now();
        for (row, p) in rows.iter().zip(probs.iter_mut()) {
            probabilities(row, &params, p)?;
        }
        let p: Vec<&[f32]> = probs.iter().map(Vec::as_slice).collect();
        let drafts: Vec<u32> = (0..wide as u32 - 1).collect();
        let q = vec![DraftDist::PointMass; drafts.len()];
        let mut rng = SeededRng::new(1);
        accept_sampled(&drafts, &q, &p, Lenience::EXACT, &mut rng, &mut scratch)
            .map_err(tandem::engine::EngineError::from)?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best)
}

/// The median time of one draft step of the head in `dir` (`default`: the default model's)
/// after `depth` positions, in ms: one position in, its draft logits out.
fn time_head_step(
    model: &Decoder,
    dir: &str,
    draft_vocab: usize,
    depth: usize,
    repeats: usize,
) -> Result<f64, CliError> {
    let dir = match dir {
        "default" => tandem::model::head::default_head_dir(),
        d => std::path::PathBuf::from(d),
    };
    let tensors = tandem::model::head::load_head(&dir)?;
    let head = tandem::model::head::DraftHead::new(
        tensors,
        model,
        tandem::model::WeightsDtype::Auto,
        draft_vocab,
    )?;
    let mut cache = head.new_cache(1);
    let slot = cache.allocate().ok_or(CliError::NoCacheSlot)?;
    let h = head.hidden_size();
    let vocab = model.hparams().vocab_size as u32;
    let tokens: Vec<u32> = (0..depth.max(1) as u32)
        .map(|i| (i * 7919) % vocab)
        .collect();
    let input = |start_pos, tokens| SeqInput {
        slot,
        start_pos,
        tokens,
        logits: LogitsRows::Last,
        parents: &[],
    };
    head.forward(
        model,
        &mut cache,
        &[input(0, &tokens)],
        &vec![0.1; tokens.len() * h],
    )?;
    let base = cache.len(slot)?;
    let feature = vec![0.1f32; h];
    let mut times = Vec::with_capacity(repeats);
    for r in 0..repeats + 1 {
        let t = std::time::Instant::now();
        head.forward(model, &mut cache, &[input(base, &tokens[..1])], &feature)?;
        let dt = t.elapsed().as_secs_f64() * 1e3;
        cache.keep(slot, Kept::First(base))?;
        if r > 0 {
            times.push(dt);
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}
