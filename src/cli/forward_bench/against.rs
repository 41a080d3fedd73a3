//! `forward-bench --against-kv-cache-dtype`: the same widths timed on a second cache type, the
//! two taking turns one forward at a time in one process, so a VM whose speed drifts between
//! processes (40% here) still compares them fairly.

use tandem::config::Config;

use super::bound::{self, in_sampled_rounds, Bandwidth};
use super::{finish, print_widths, ForwardBenchArgs, ForwardTimer, WidthTimes};
use crate::cli::model_args::load_model;
use crate::cli::stream_bandwidth::Stream;
use crate::cli::CliError;

/// `--against-kv-cache-dtype`: the widths timed on the configured cache type and on `other`
/// (the model loaded again with it), taking turns, each type's table and their ratios.
pub(super) fn compare_cache_types(
    config: &Config,
    args: &ForwardBenchArgs,
    timer: &mut ForwardTimer<'_>,
    other: &str,
) -> Result<(), CliError> {
    let mut against_config = config.clone();
    against_config.model.kv_cache_dtype = other.to_string();
    against_config.validate().map_err(|e| CliError::Flag {
        flag: "--against-kv-cache-dtype",
        reason: e.to_string(),
    })?;
    let against_loaded = load_model(&against_config)?;
    let mut against = ForwardTimer::fill(&against_loaded.model, args)?;
    let stream = bound::stream(config);
    let (mut times, mut other_times, bandwidth) =
        time_in_turns(timer, &mut against, &args.tokens, &stream)?;
    let header =
        "| new tokens | ms per forward | ms per token | cost vs 1 token | ms per extra token |";
    let mine = timer.model.kv_dtype();
    println!("KV cache {mine}:\n\n{header}\n|---|---|---|---|---|");
    let base = print_widths(&args.tokens, &mut times, None);
    println!("\nKV cache {other}, taking turns with the forwards above:\n\n{header}");
    println!("|---|---|---|---|---|");
    print_widths(&args.tokens, &mut other_times, None);
    println!("\n| new tokens | {other} against {mine} (medians) |\n|---|---|");
    for ((k, a), b) in args.tokens.iter().zip(&times).zip(&other_times) {
        println!("| {k} | {:.3}x |", b[b.len() / 2] / a[a.len() / 2]);
    }
    finish(config, args, timer, base.map(|b| (b, bandwidth)))
}

/// Each width's forward times in ms on two timers (two cache types), every width's forward on
/// one then the other each round, so a drifting machine moves both alike; and the bandwidth
/// `stream` measured across them.
fn time_in_turns(
    a: &mut ForwardTimer<'_>,
    b: &mut ForwardTimer<'_>,
    widths: &[usize],
    stream: &Stream,
) -> Result<(WidthTimes, WidthTimes, Bandwidth), CliError> {
    let (mut ta, mut tb) = (
        vec![Vec::new(); widths.len()],
        vec![Vec::new(); widths.len()],
    );
    let bandwidth = in_sampled_rounds(a.repeats, stream, |salt, timed| {
        for (i, &k) in widths.iter().enumerate() {
            let (x, y) = (a.time_one(k, salt)?, b.time_one(k, salt)?);
            if timed {
                ta[i].push(x);
                tb[i].push(y);
            }
        }
        Ok(())
    })?;
    Ok((ta, tb, bandwidth))
}
