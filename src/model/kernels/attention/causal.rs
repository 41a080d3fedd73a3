//! Causal attention of one sequence's new tokens against its cache: the public call, which
//! groups (query, head) units that read the same keys into runs, splits the runs and a deep
//! context's segments over threads (a deep step's runs of every key-value head together, so
//! a thread reads whole cache rows in order), and merges the segments; the loops each run is
//! built of are in `loops`.

use super::bf16_pairs::WeightBits;
use super::loops::{
    accumulate_paired, accumulate_values_bf16, accumulate_values_heads, bf16_rounded_for,
    finish_values, pair_rows, round_bf16, scaled_dots_heads, scaled_dots_heads_bf16, softmax_sum,
    softmax_weights, vertical_scores, vertical_scores_bf16, widen_rows, SHARED_HEADS,
};
use super::q8_query::{rounded_for, Q8Queries};
use super::q8_scores;
use super::segments::{merge_segments, SegmentPart, SEGMENT};
use super::shared::{KvForm, KvRows};

/// Members of a run computed together over each key chunk: the heads of one query, which see
/// the same keys.
#[derive(Clone, Copy, Default)]
struct Group {
    /// The first member's row in its item.
    row: usize,
    heads: usize,
    /// Keys the query sees (its position plus one).
    seen: usize,
    /// Where the first member's query starts in `q`.
    q_at: usize,
    /// Where its key-value head starts in a cache row.
    kv_off: usize,
}

/// A thread's buffers for [`causal_attention`]: scores (then softmax weights), value sums,
/// transposed keys or widened values, and bf16 weights' bits.
type Buffers = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<u16>);

/// Shapes of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl AttnShape {
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
}

/// The fewest units of a run that widen its f16 or q8 values to f32 once for all of them: a
/// step's few heads of one query already share each widened register
/// ([`accumulate_values_heads`]).
const WIDEN_UNITS: usize = 8;

/// Keys an interleaved item's runs take in turn (`interleaved` in [`causal_attention`]), each
/// reading its head's part of a chunk's cache rows: 64 at a time per head, a thread read a
/// third of each row, then the next third of the same rows, which the prefetchers follow
/// poorly. Measured on Zen 5 at depths 2048 and 8184 with the chunk sizes taking turns in one
/// process, 32 beat 16, 24, 48 and 64 for a step and a 2-token verification. Even (see
/// [`KEY_CHUNK`]).
const ROW_CHUNK: usize = 32;

/// Runs of this many units or more are not interleaved: their arithmetic per row, not the
/// reads, bounds them. An 8-token verification (24 units a run) read 0.97-1.04x its time
/// interleaved, where 4 tokens (12 units) read 0.88-0.99x and a step 0.71-0.79x.
const WIDE_RUN: usize = 16;

/// The most units a call may have for its items to be interleaved: the rows an item holds.
const MAX_ITEM_UNITS: usize = 96;

/// Keys taken at a time by every head of a group before the next ones: 64 keys of 64 values
/// are 16 KiB, read from memory once and from L1 by the group's other heads. Even, so each
/// chunk starts at an even key (see `loops::accumulate_values`).
const KEY_CHUNK: usize = 64;

/// Attention for queries at absolute positions `start_pos..start_pos + n_new`.
///
/// `q`: `n_new * q_dim` (already rotated); `keys`/`values`: the sequence's whole cache,
/// `(start_pos + n_new) * kv_dim`, new tokens included; `out`: `n_new * q_dim`.
/// Work is split over (run, segment) items on candle's thread pool: (query, head) units are
/// ordered by key-value head first, then query, then head, and runs of up to [`MAX_GROUP`]
/// consecutive units sharing a key-value head (as even as they divide) are computed together,
/// key chunk by key chunk, so each key and value row of a segment is read from memory once
/// per run instead of once per query and head. The reads, not the arithmetic, bound attention
/// at depth: a depth-800 cache is 37 MB of keys and values, and each extra query token of a
/// verification re-read it, ~0.6 ms a token (measured with `forward-bench`), before queries
/// shared a run. A query that sees more than one segment ([`SEGMENT`]) has each segment's
/// softmax kept apart and merged after every segment is done. Neither the split nor the
/// grouping changes a unit's arithmetic.
///
/// `sinks` (gpt-oss): one logit per query head that joins each softmax's denominator with no
/// value, so a head may attend to nothing.
pub fn causal_attention<K: KvRows>(
    shape: AttnShape,
    q: &[f32],
    keys: K,
    values: K,
    (start_pos, sinks): (usize, Option<&[f32]>),
    out: &mut [f32],
) {
    rounded_for::<K, _>(q, |q8| {
        bf16_rounded_for::<K, _>(q, |qb| {
            attend_all(shape, (q, q8, qb), (keys, values), (start_pos, sinks), out)
        })
    })
}

/// [`causal_attention`] with the queries rounded once as the keys are where they are q8
/// (`q8`, see `q8_scores`) or bf16 (`qb`, bits; the softmax weights are then rounded once a
/// row as well, see `bf16_pairs`).
fn attend_all<K: KvRows>(
    shape: AttnShape,
    (q, q8, qb): (&[f32], Option<&Q8Queries>, Option<&[u16]>),
    (keys, values): (K, K),
    (start_pos, sinks): (usize, Option<&[f32]>),
    out: &mut [f32],
) {
    let AttnShape {
        num_heads,
        num_kv_heads,
        head_dim,
    } = shape;
    let q_dim = shape.q_dim();
    let kv_dim = shape.kv_dim();
    let n_new = q.len() / q_dim;
    debug_assert_eq!(out.len(), q.len());
    debug_assert!(keys.elements() >= (start_pos + n_new) * kv_dim);
    let group = num_heads / num_kv_heads;
    let scale = 1f32 / (head_dim as f32).sqrt();
    let units = n_new * num_heads;
    let per_kv_head = n_new * group;
    // Unit `u` is query `i`, head `h`: key-value head first, then query, then head.
    let unit = |u: usize| {
        let (kvh, r) = (u / per_kv_head, u % per_kv_head);
        (r / group, kvh * group + r % group)
    };
    let seen_of = |u: usize| start_pos + unit(u).0 + 1;
    let segments = (start_pos + n_new).div_ceil(SEGMENT);
    let out_ptr = out.as_mut_ptr() as usize;
    // Each unit's segments' softmaxes, `[max, sum, value sums...]`, where it has more than one.
    let part_len = head_dim + 2;
    let part_at = |u: usize, g: usize| (u * segments + g) * part_len;

    thread_local! {
        // Per-thread score and value-sum buffers, kept across calls so decoding does not
        // allocate per layer; and the calling thread's segment parts.
        // bf16 keys: the weights' bits too.
        static BUFFERS: std::cell::RefCell<Buffers> =
            const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new(), Vec::new())) };
        static PARTS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    // Run `r`: key-value head `r / runs_per_kv`'s units, `run_len` at a time, in order (so the
    // last query sees the most keys): the fewest runs of at most MAX_GROUP, as even as they
    // divide.
    let small = units * (start_pos + n_new) < PARALLEL_WORK;
    // A call of fewer items than threads splits its runs further, so that every thread takes
    // some of the heads: Gemma-3's step over a windowed layer's one segment is one key-value
    // head's four units, which as one run left the other thread waiting (a unit's bits do not
    // depend on the run it is in).
    let spare = if small {
        1
    } else {
        crate::model::kernels::parallel::threads().div_ceil(num_kv_heads * segments)
    };
    let asked = per_kv_head
        .div_ceil(MAX_GROUP)
        .max(spare)
        .clamp(1, per_kv_head.max(1));
    let run_len = per_kv_head.div_ceil(asked);
    // As many runs as that length needs (fewer than asked where the last would be empty).
    let runs_per_kv = per_kv_head.div_ceil(run_len.max(1));
    let runs = num_kv_heads * runs_per_kv;
    let run_members = |r: usize| {
        let (kvh, i) = (r / runs_per_kv, r % runs_per_kv);
        let start = kvh * per_kv_head + i * run_len;
        start..(start + run_len).min((kvh + 1) * per_kv_head)
    };
    // Every key-value head's runs in one item, so a thread reads whole cache rows in order
    // ([`ROW_CHUNK`]), where the context gives each thread two items or more (one key-value
    // head's rows are read in order already).
    let interleaved = num_kv_heads > 1
        && per_kv_head < WIDE_RUN
        && units <= MAX_ITEM_UNITS
        && segments >= 2 * crate::model::kernels::parallel::threads();
    let chunk = if interleaved { ROW_CHUNK } else { KEY_CHUNK };
    // Runs `item_runs` over segment `g`'s keys. The runs of one item have as many units, of
    // the same queries, so they see the same keys; the `m`th member of the item's `k`th run is
    // its row `k * nm + m`, whose scores start at `row * stride`.
    let attend = |(item_runs, g): (std::ops::Range<usize>, usize),
                  parts: usize,
                  (scores, acc, kt, wb): &mut Buffers| {
        let lead = run_members(item_runs.start);
        let nm = lead.len();
        let rows = item_runs.len() * nm;
        let kv_off = |u: usize| (u / per_kv_head) * head_dim;
        let first = g * SEGMENT;
        // Keys of the segment unit `u` sees.
        let in_segment = |u: usize| seen_of(u).min(first + SEGMENT).saturating_sub(first);
        let stride = in_segment(lead.end - 1);
        if stride == 0 {
            return;
        }
        // Each row with its unit, run by run.
        let each_row = || item_runs.clone().flat_map(run_members).enumerate();
        // Key chunk by key chunk, so a chunk is read once for all members (and, interleaved,
        // every head's part of a cache row before the next rows), and within a chunk the
        // heads of one query (which see the same keys) side by side: calls `f(first row,
        // heads, its unit, first key, keys in the chunk)` for each run of such members
        // that sees the chunk.
        // The groups are worked out once an item, not again for every chunk.
        let mut groups = [Group::default(); MAX_ITEM_UNITS];
        let mut count = 0;
        // Where each row's query starts in `q`.
        let mut row_q = [0usize; MAX_ITEM_UNITS];
        for (k, r) in item_runs.clone().enumerate() {
            let members = run_members(r);
            let mut m = 0;
            while m < nm {
                let u = members.start + m;
                let (query, h) = unit(u);
                let mut heads = 1;
                while heads < SHARED_HEADS && m + heads < nm && unit(u + heads).0 == query {
                    heads += 1;
                }
                for j in 0..heads {
                    row_q[k * nm + m + j] = query * q_dim + (h + j) * head_dim;
                }
                groups[count] = Group {
                    row: k * nm + m,
                    heads,
                    seen: seen_of(u),
                    q_at: query * q_dim + h * head_dim,
                    kv_off: kv_off(u),
                };
                count += 1;
                m += heads;
            }
        }
        let groups = &groups[..count];
        let each_chunk = |f: &mut dyn FnMut(&Group, usize, usize)| {
            for j0 in (first..first + stride).step_by(chunk) {
                for group in groups.iter().filter(|group| j0 < group.seen) {
                    f(group, j0, chunk.min(group.seen - j0));
                }
            }
        };
        // Every score a row reads is written first: grown, never cleared.
        if scores.len() < rows * stride {
            scores.resize(rows * stride, 0.0);
        }
        // A row's weights as bf16 bits (and a lone last key's partner after them).
        let wstride = stride + 2;
        if qb.is_some() && wb.len() < rows * wstride {
            wb.resize(rows * wstride, 0);
        }
        let end = first + stride;
        // Calls `f(first key, the run's place in the item, its members)` chunk by chunk,
        // every run of a chunk before the next chunk; stops at the first `false`.
        let each_run_chunk = |f: &mut dyn FnMut(usize, usize, std::ops::Range<usize>) -> bool| {
            (first..end).step_by(chunk).all(|j0| {
                item_runs
                    .clone()
                    .enumerate()
                    .all(|(k, r)| f(j0, k, run_members(r)))
            })
        };
        // q8 keys: every member's scores over the whole chunk from the integer kernels
        // (`q8_scores`), whatever the instruction set. Other keys: from keys transposed
        // along the lanes where the runs are long enough (`vertical_scores`), whose false
        // answer comes before any work, from the units and the head size alone, so the
        // first call's stands for every run and chunk.
        let vertical = each_run_chunk(&mut |j0, k, members| {
            let at = (keys.skip(j0 * kv_dim), (kv_dim, kv_off(members.start)));
            let n = chunk.min(end - j0);
            let out = (&mut scores[k * nm * stride + j0 - first..], stride);
            let unit_at = |m: usize| row_q[k * nm + m];
            match (q8, qb) {
                (Some(queries), _) => {
                    let query = |m: usize| queries.query(unit_at(m), head_dim);
                    q8_scores::run_scores(at.0, at.1, n, (nm, &query), scale, out, kt);
                    true
                }
                (None, Some(bits)) => {
                    let query = |m: usize| &bits[unit_at(m)..][..head_dim];
                    vertical_scores_bf16(at.0, at.1, n, (nm, &query), scale, out, kt)
                }
                (None, None) => {
                    let query = |m: usize| &q[unit_at(m)..][..head_dim];
                    vertical_scores(at.0, at.1, n, (nm, &query), scale, out, kt)
                }
            }
        });
        if !vertical {
            each_chunk(&mut |&Group {
                                 row,
                                 heads,
                                 q_at: at,
                                 kv_off,
                                 ..
                             },
                             j0,
                             len| {
                let (keys, kv_at) = (keys.skip(j0 * kv_dim), (kv_dim, kv_off));
                let out = &mut scores[row * stride + j0 - first..];
                match qb {
                    Some(bits) => {
                        let q = &bits[at..][..heads * head_dim];
                        scaled_dots_heads_bf16(q, heads, keys, kv_at, scale, (out, stride), len)
                    }
                    None => {
                        let q = &q[at..][..heads * head_dim];
                        scaled_dots_heads(q, heads, keys, kv_at, scale, out, stride, len)
                    }
                }
            });
        }
        // A unit of one segment: its softmax's inverse sum; of several: its segment's max
        // and sum, into its part.
        let mut inv = [0f32; MAX_ITEM_UNITS];
        for (row, u) in each_row() {
            let s = &mut scores[row * stride..][..in_segment(u)];
            if s.is_empty() {
                continue;
            }
            if seen_of(u) <= SEGMENT {
                inv[row] = 1f32 / softmax_sum(s, sinks.map(|k| k[unit(u).1]));
            } else {
                let (max, sum) = softmax_weights(s);
                // SAFETY: each (unit, segment) part is written by the one item that holds
                // both, and read only after every item is done.
                let part = unsafe {
                    std::slice::from_raw_parts_mut((parts as *mut f32).add(part_at(u, g)), 2)
                };
                part.copy_from_slice(&[max, sum]);
            }
            if qb.is_some() {
                round_bf16(s, &mut wb[row * wstride..][..s.len()]);
            }
        }
        acc.clear();
        acc.resize(rows * 2 * head_dim, 0.0);
        // A run of many units widens each chunk of f16 or q8 values once (into `kt`, free
        // again) for all of them.
        let widen = vertical && nm >= WIDEN_UNITS && K::FORM != KvForm::F32;
        let mut widened = None;
        // bf16 values: a run's chunk of rows paired once for every member (`bf16_pairs`),
        // where it would be widened.
        let mut paired = None;
        each_chunk(&mut |&Group {
                             row, heads, kv_off, ..
                         },
                         j0,
                         len| {
            let weights = &scores[row * stride + j0 - first..];
            let sums = &mut acc[row * 2 * head_dim..][..heads * 2 * head_dim];
            let at = (j0, kv_off);
            if qb.is_some() {
                let bits = &wb[row * wstride + j0 - first..];
                let w = WeightBits {
                    bits,
                    stride: wstride,
                };
                let rows = (values.skip(j0 * kv_dim), (kv_dim, kv_off));
                if widen && paired != Some(at) {
                    let n = chunk.min(end - j0);
                    paired = pair_rows(rows, n, head_dim, kt).then_some(at);
                }
                if paired == Some(at) {
                    accumulate_paired(w, len, heads, kt, sums);
                } else {
                    accumulate_values_bf16(w, len, heads, rows.0, rows.1, sums);
                }
                return;
            }
            if widen && widened != Some(at) {
                let n = chunk.min(end - j0);
                let rows = (values.skip(j0 * kv_dim), (kv_dim, kv_off));
                widened = widen_rows(rows, n, head_dim, kt).then_some(at);
            }
            if widened == Some(at) {
                let rows = &kt[..];
                accumulate_values_heads(weights, stride, len, heads, rows, (head_dim, 0), sums);
            } else {
                let rows = values.skip(j0 * kv_dim);
                accumulate_values_heads(weights, stride, len, heads, rows, (kv_dim, kv_off), sums);
            }
        });
        for (row, u) in each_row() {
            if in_segment(u) == 0 {
                continue;
            }
            let sums = &acc[row * 2 * head_dim..][..2 * head_dim];
            if seen_of(u) <= SEGMENT {
                let (i, h) = unit(u);
                // SAFETY: each (query, head) unit writes only its own head_dim-long span of
                // `out`, and a unit of one segment belongs to exactly one item.
                let o = unsafe {
                    std::slice::from_raw_parts_mut(
                        (out_ptr as *mut f32).add(i * q_dim + h * head_dim),
                        head_dim,
                    )
                };
                finish_values(sums, inv[row], o);
            } else {
                // SAFETY: as for the max and sum above.
                let part = unsafe {
                    std::slice::from_raw_parts_mut(
                        (parts as *mut f32).add(part_at(u, g) + 2),
                        head_dim,
                    )
                };
                let (even, odd) = sums.split_at(head_dim);
                for ((p, e), o) in part.iter_mut().zip(even).zip(odd) {
                    *p = e + o;
                }
            }
        }
    };
    // Items: each run by segment, or, interleaved, each segment with every run. The pool hands
    // out items, not units: handed units (a chunk of a sixteenth of them), a run would only
    // group the few units of one grab, and a step's heads would each read their shared keys
    // apart. Segment first, then key-value head: a grab's items then read whole cache rows,
    // one stretch of memory after another, where key-value head first had each thread read a
    // head's third of every row over the whole depth (a step at depth 8184 took 24-27 ms that
    // way against 19-20 then).
    let item = |it: usize| {
        if interleaved {
            (0..runs, it)
        } else {
            (it % runs..it % runs + 1, it / runs)
        }
    };
    let items = if interleaved {
        segments
    } else {
        runs * segments
    };
    let deep = start_pos + n_new > SEGMENT;
    PARTS.with_borrow_mut(|parts| {
        if deep {
            parts.resize(units * segments * part_len, 0.0);
        }
        let parts = parts.as_mut_ptr() as usize;
        let run = |range: std::ops::Range<usize>| {
            BUFFERS.with_borrow_mut(|buffers| range.for_each(|it| attend(item(it), parts, buffers)))
        };
        if small {
            run(0..items);
        } else {
            crate::model::kernels::parallel::for_each_chunk(items, run);
        }
        if !deep {
            return;
        }
        let merge = |range: std::ops::Range<usize>| {
            for u in range {
                let seen = seen_of(u);
                if seen <= SEGMENT {
                    continue;
                }
                // SAFETY: every item is done; parts are only read now.
                let all = unsafe {
                    std::slice::from_raw_parts(
                        (parts as *const f32).add(part_at(u, 0)),
                        segments * part_len,
                    )
                };
                let each = all
                    .chunks_exact(part_len)
                    .take(seen.div_ceil(SEGMENT))
                    .map(|p| SegmentPart {
                        max: p[0],
                        sum: p[1],
                        values: &p[2..],
                    });
                let (i, h) = unit(u);
                // SAFETY: each unit writes only its own head_dim-long span of `out`.
                let o = unsafe {
                    std::slice::from_raw_parts_mut(
                        (out_ptr as *mut f32).add(i * q_dim + h * head_dim),
                        head_dim,
                    )
                };
                merge_segments(each, sinks.map(|k| k[h]), o);
            }
        };
        if small || units * segments * head_dim < MERGE_ALONE {
            merge(0..units);
        } else {
            crate::model::kernels::parallel::for_each_chunk(units, merge);
        }
    });
}

/// Below this many (unit, segment, element) triples a call's segments are merged on the
/// calling thread: a step's few heads cost less than waking the pool.
const MERGE_ALONE: usize = 1 << 16;

/// The most bytes of keys (and as many of values) [`prefetch_cache`] asks for: a shallow
/// context's whole cache, while a deep one, whose reads the prefetchers follow on their own,
/// would only evict the weights the next matmul streams.
const PREFETCH_BYTES: usize = 64 << 10;

/// Asks for a layer's cached keys and values to be brought into this core's caches: issued
/// before the layer's q/k/v matmul, they arrive while it streams the weights, where attention
/// would otherwise wait on memory for each key row it reads (a forward's other layers have
/// evicted them).
pub fn prefetch_cache<K: KvRows>(keys: K, values: K) {
    #[cfg(target_arch = "x86_64")]
    for rows in [keys, values] {
        let bytes = (rows.elements() * K::FORM.element_bytes()).min(PREFETCH_BYTES);
        let base = rows.base() as *const i8;
        for line in (0..bytes).step_by(64) {
            // SAFETY: a prefetch never faults, and the address is inside `buf`.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                    base.add(line),
                )
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (keys, values);
}

/// Below this many (unit, key) pairs attention runs on the calling thread: a 1-token step at a
/// shallow depth (SmolLM2: 9 units of ~65 keys) costs less than waking the pool, while a
/// verification of 4 tokens at depth 64 (36 units) ran in two thirds of the time on 2 threads
/// (`forward-bench --ops`, 0.72 against 0.48 ms a forward with 4096 as the bound).
const PARALLEL_WORK: usize = 1024;

/// The most (query, head) units computed together: the 4 heads of each of 8 verified tokens
/// on Gemma-3 (one key-value head), the 3 of SmolLM2's in 24. Each run transposes a chunk's
/// keys and pairs or widens its values again, so Gemma's 32 in runs of 24 and 8 did that
/// twice: in one run its 8-token verification at depth 8184 took 0.96x the time with a bf16
/// cache, 0.97x f16, 0.98x q8_0, where SmolLM2's 12 tokens (18 + 18 units, not 24 + 12) and
/// 64-token chunks (runs of 32, not 24) read 0.98-1.00x (Zen 5, both orders of taking turns in
/// one process). At depth 1500 (8 tokens / a 256-token chunk) runs of 12 units took 29.0 /
/// 642 ms, 24 28.6 / 616, 48 30.4 / 631; grouping heads of one query only, 34.1 / 856.
const MAX_GROUP: usize = 32;
