//! Start-up timing of target forwards on the Verifier's compute worker: each width's price at
//! a shallow context, and paired rounds at a shallow and a deep one for how prices grow with
//! depth. Why it is its own file: it fills and trims a slot with made-up context and times
//! forwards over it, which nothing a request runs does.

use std::time::Instant;

use super::TargetState;
use crate::engine::error::EngineError;
use crate::model::cache::kv_cache::KvRun;
use crate::model::decoder::expert_trace;
use crate::model::{Kept, LogitsRows, SeqInput};

/// A start-up forward: its width, the context tokens before it, its best time, and the distinct
/// experts each routed layer of a mixture read in it.
#[derive(Clone, Debug)]
pub struct TimedForward {
    pub width: usize,
    pub depth: usize,
    pub seconds: f64,
    pub reads: Vec<u16>,
}

/// One round of [`time_depths`]: every width timed once at the shallow depth, then once at
/// the deep one, moments apart.
#[derive(Clone, Debug)]
pub struct DepthRound {
    pub shallow: Vec<TimedForward>,
    pub deep: Vec<TimedForward>,
}

/// The most context tokens a calibration runs through the model; deeper contexts are copies of
/// their keys and values: attention costs the same whatever the keys hold, and a 512-token
/// prefill would add most of a second to start-up.
const PREFILLED: usize = 32;

/// The made-up context and the widths a timing runs on one slot.
struct Bench {
    slot: usize,
    ids: Vec<u32>,
    widths: Vec<usize>,
    /// The first tokens' keys and values, copied to fill a deeper context.
    copies: KvRun,
}

impl Bench {
    /// Runs the first tokens of a context `depth` deep through the model on `slot` (allocated)
    /// and returns the bench with `depth` clamped to what the cache holds beside the widest
    /// forward.
    fn start(
        s: &mut TargetState,
        slot: usize,
        widths: &[usize],
        depth: usize,
        alike: bool,
    ) -> Result<(Self, usize), EngineError> {
        let vocab = s.model.hparams().vocab_size as u32;
        let max_len = s.cache.max_len();
        let widths: Vec<usize> = widths
            .iter()
            .copied()
            .filter(|&w| w > 0 && w < max_len)
            .collect();
        let max_width = widths.iter().copied().max().unwrap_or(0);
        let depth = depth.min(max_len.saturating_sub(max_width + 1)).max(1);
        let ids: Vec<u32> = (0..depth + max_width)
            .map(|i| {
                if alike {
                    13 % vocab
                } else {
                    (i as u32 * 7919 + 13) % vocab
                }
            })
            .collect();
        let computed = depth.min(PREFILLED);
        s.model.forward(
            &mut s.cache,
            &[SeqInput {
                slot,
                start_pos: 0,
                tokens: &ids[..computed],
                logits: LogitsRows::None,
                parents: &[],
            }],
        )?;
        let copies = s.cache.read_run(slot, 0, computed)?;
        let bench = Self {
            slot,
            ids,
            widths,
            copies,
        };
        Ok((bench, depth))
    }

    /// Trims or fills the slot to `depth` tokens (fills repeat the first tokens' keys and
    /// values).
    fn set_depth(&self, s: &mut TargetState, depth: usize) -> Result<(), EngineError> {
        let slot = self.slot;
        if s.cache.len(slot)? > depth {
            s.cache.keep(slot, Kept::First(depth))?;
        }
        while s.cache.len(slot)? < depth {
            let more = (depth - s.cache.len(slot)?).min(self.copies.len());
            s.cache.append_run(slot, &self.copies, more)?;
        }
        Ok(())
    }

    /// Seconds of one forward of `width` tokens after the slot's context, and the experts it
    /// read; the slot is left as it was.
    fn time(&self, s: &mut TargetState, width: usize) -> Result<(f64, Vec<u16>), EngineError> {
        let base = s.cache.len(self.slot)?;
        expert_trace::count_reads();
        let t = Instant::now();
        s.model.forward(
            &mut s.cache,
            &[SeqInput {
                slot: self.slot,
                start_pos: base,
                tokens: &self.ids[base..base + width],
                logits: LogitsRows::All,
                parents: &[],
            }],
        )?;
        let seconds = t.elapsed().as_secs_f64();
        let mut reads = Vec::new();
        expert_trace::take_reads(&mut reads);
        s.cache.keep(self.slot, Kept::First(base))?;
        Ok((seconds, reads))
    }

    /// Every width timed once at the slot's current depth.
    fn time_all(&self, s: &mut TargetState) -> Result<Vec<TimedForward>, EngineError> {
        let depth = s.cache.len(self.slot)?;
        self.widths
            .iter()
            .map(|&width| {
                let (seconds, reads) = self.time(s, width)?;
                Ok(TimedForward {
                    width,
                    depth,
                    seconds,
                    reads,
                })
            })
            .collect()
    }
}

/// Runs `f` on a bench over `slot`, which it allocates and then frees whatever `f` returns
/// (a slot it could not allocate is someone else's, and left alone).
fn on_bench<R>(
    s: &mut TargetState,
    slot: usize,
    widths: &[usize],
    (depth, alike): (usize, bool),
    f: impl FnOnce(&mut TargetState, &Bench, usize) -> Result<R, EngineError>,
) -> Result<R, EngineError> {
    s.cache.allocate_slot(slot)?;
    let result = Bench::start(s, slot, widths, depth, alike).and_then(|(b, d)| f(s, &b, d));
    s.cache.free(slot)?;
    result
}

/// Target forwards of each of `widths` new tokens `depth` context tokens deep (less where the
/// cache is shorter) on `slot`, best of `repeats`.
pub(super) fn calibrate(
    s: &mut TargetState,
    slot: usize,
    widths: &[usize],
    (depth, repeats): (usize, usize),
    alike: bool,
) -> Result<Vec<TimedForward>, EngineError> {
    on_bench(s, slot, widths, (depth, alike), |s, bench, depth| {
        bench.set_depth(s, depth)?;
        let mut best = bench.time_all(s)?;
        for _ in 1..repeats.max(1) {
            for (b, t) in best.iter_mut().zip(bench.time_all(s)?) {
                if t.seconds < b.seconds {
                    *b = t;
                }
            }
        }
        Ok(best)
    })
}

/// `rounds` rounds of `widths` timed at `shallow` context tokens and then at `deep` on `slot`:
/// a change in the machine's speed between rounds (another process, a slow minute of a shared
/// VM) then slows both depths of a round alike, where one burst at each depth would read it as
/// growth with depth. After each refill of the deep context one untimed step runs: the first
/// forward over freshly copied keys and values runs slow.
pub(super) fn time_depths(
    s: &mut TargetState,
    slot: usize,
    widths: &[usize],
    (shallow, deep): (usize, usize),
    rounds: usize,
) -> Result<Vec<DepthRound>, EngineError> {
    on_bench(s, slot, widths, (deep, false), |s, bench, deep| {
        let shallow = shallow.clamp(1, deep);
        (0..rounds)
            .map(|_| {
                bench.set_depth(s, shallow)?;
                let near = bench.time_all(s)?;
                bench.set_depth(s, deep)?;
                bench.time(s, 1)?;
                let far = bench.time_all(s)?;
                Ok(DepthRound {
                    shallow: near,
                    deep: far,
                })
            })
            .collect()
    })
}
