//! Queries rounded to q8 blocks, as q8_0 keys are, for the integer scores (`q8_scores`): the
//! rounding and the buffer a thread keeps for it. A leaf beside `shared`, so that the scores'
//! definition and their x86 kernels both read a rounded query without importing each other.

use super::shared::{KvForm, KvRows, Q8Rows};

/// Elements per query scale: the keys' block.
const BLOCK: usize = Q8Rows::BLOCK;

/// Queries rounded to q8 blocks: per block of 32, a scale (the largest magnitude over 127, in
/// f32: it is never stored), bytes (`x / scale` rounded to the nearest, ties to even) and their
/// sum (what the unsigned-byte kernels subtract again). Kept by a thread and reused, so
/// rounding a forward's queries allocates nothing once it has grown.
#[derive(Default)]
pub(super) struct Q8Queries {
    quants: Vec<i8>,
    scales: Vec<f32>,
    sums: Vec<i32>,
}

/// One query's blocks from [`Q8Queries`].
#[derive(Clone, Copy)]
pub(super) struct Q8Query<'a> {
    pub(super) quants: &'a [i8],
    pub(super) scales: &'a [f32],
    pub(super) sums: &'a [i32],
}

impl Q8Query<'_> {
    pub(super) fn dim(&self) -> usize {
        self.quants.len()
    }
}

impl Q8Queries {
    /// Rounds `q` (a multiple of 32 long), replacing what was held.
    pub(super) fn quantize(&mut self, q: &[f32]) {
        assert!(q.len().is_multiple_of(BLOCK), "q8 queries are whole blocks");
        self.quants.clear();
        self.scales.clear();
        self.sums.clear();
        for block in q.chunks_exact(BLOCK) {
            let (scale, sum) = quantize_block(block, &mut self.quants);
            self.scales.push(scale);
            self.sums.push(sum);
        }
    }

    /// The query of `dim` elements (a multiple of 32) from element `at` (a block start).
    pub(super) fn query(&self, at: usize, dim: usize) -> Q8Query<'_> {
        debug_assert!(at.is_multiple_of(BLOCK) && dim.is_multiple_of(BLOCK));
        Q8Query {
            quants: &self.quants[at..][..dim],
            scales: &self.scales[at / BLOCK..][..dim / BLOCK],
            sums: &self.sums[at / BLOCK..][..dim / BLOCK],
        }
    }
}

/// Calls `f` with `q` rounded ([`Q8Queries::quantize`]) where keys of form `K` are q8 (their
/// scores need it), else with `None`. The rounding goes into the calling thread's buffer: a
/// forward's layers reuse it, so it allocates only while it grows.
pub(super) fn rounded_for<K: KvRows, R>(q: &[f32], f: impl FnOnce(Option<&Q8Queries>) -> R) -> R {
    thread_local! {
        static QUERIES: std::cell::RefCell<Q8Queries> =
            std::cell::RefCell::new(Q8Queries::default());
    }
    if K::FORM != KvForm::Q8 {
        return f(None);
    }
    QUERIES.with_borrow_mut(|queries| {
        queries.quantize(q);
        f(Some(queries))
    })
}

/// Appends a block's bytes to `out`; returns its scale and the bytes' sum. A block holding a
/// non-finite value gets a NaN scale (its scores are NaN, which the forward's check sees); a
/// block of zeros scale 0 and zero bytes.
fn quantize_block(block: &[f32], out: &mut Vec<i8>) -> (f32, i32) {
    // Adding and taking away 1.5 · 2^23 rounds an f32 below 2^22 in magnitude to the nearest
    // integer, ties to even (`round_ties_even`, which a portable build calls libm for).
    const ROUND: f32 = 12_582_912.0;
    let amax = block.iter().fold(0f32, |m, &x| m.max(x.abs()));
    let finite = block.iter().all(|x| x.is_finite());
    let scale = if finite { amax / 127.0 } else { f32::NAN };
    let start = out.len();
    out.resize(start + block.len(), 0);
    if scale != 0.0 && finite {
        for (o, &x) in out[start..].iter_mut().zip(block) {
            *o = ((x / scale + ROUND) - ROUND).clamp(-127.0, 127.0) as i8;
        }
    }
    let sum = out[start..].iter().map(|&q| i32::from(q)).sum();
    (scale, sum)
}
