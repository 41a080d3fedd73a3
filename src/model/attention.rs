//! Causal grouped-query attention of one sequence's new tokens against its KV cache.
//!
//! Written by hand on f32 slices instead of with tensor matmuls so that each (query, head) pair
//! is computed alone, over exactly the keys it may see, in a fixed order: its result is then
//! bitwise independent of how many tokens share the forward pass (batch invariance), which is
//! what keeps greedy speculative decoding identical to plain greedy decoding.

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

/// Dot product with eight independent lanes summed in a fixed order: vectorises without
/// fast-math and gives the same bits for the same inputs wherever it is called.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// Attention for queries at absolute positions `start_pos..start_pos + n_new`.
///
/// `q`: `n_new * q_dim` (already rotated); `keys`/`values`: the sequence's whole cache,
/// `(start_pos + n_new) * kv_dim`, new tokens included; `out`: `n_new * q_dim`.
/// Work is split over (query, head) units on candle's thread pool; the split never changes a
/// unit's arithmetic.
pub fn causal_attention(
    shape: AttnShape,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    start_pos: usize,
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
    debug_assert!(keys.len() >= (start_pos + n_new) * kv_dim);
    let group = num_heads / num_kv_heads;
    let scale = 1f32 / (head_dim as f32).sqrt();
    let units = n_new * num_heads;
    let out_ptr = out.as_mut_ptr() as usize;

    thread_local! {
        // Per-thread score buffer, kept across calls so decoding does not allocate per layer.
        static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let run_units = |range: std::ops::Range<usize>, scores: &mut Vec<f32>| {
        for unit in range {
            let (i, h) = (unit / num_heads, unit % num_heads);
            let kvh = h / group;
            let seen = start_pos + i + 1;
            let qv = &q[i * q_dim + h * head_dim..i * q_dim + (h + 1) * head_dim];
            scores.clear();
            let mut max = f32::NEG_INFINITY;
            for j in 0..seen {
                let k = &keys[j * kv_dim + kvh * head_dim..j * kv_dim + (kvh + 1) * head_dim];
                let s = dot(qv, k) * scale;
                max = max.max(s);
                scores.push(s);
            }
            let mut sum = 0f32;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            let inv = 1f32 / sum;
            // SAFETY: each unit writes only its own head_dim-long span of `out`.
            let o = unsafe {
                std::slice::from_raw_parts_mut(
                    (out_ptr as *mut f32).add(i * q_dim + h * head_dim),
                    head_dim,
                )
            };
            o.fill(0.);
            for (j, &w) in scores.iter().enumerate() {
                let v = &values[j * kv_dim + kvh * head_dim..j * kv_dim + (kvh + 1) * head_dim];
                let w = w * inv;
                for (od, vd) in o.iter_mut().zip(v) {
                    *od += w * vd;
                }
            }
        }
    };
    let run =
        |range: std::ops::Range<usize>| SCORES.with_borrow_mut(|scores| run_units(range, scores));
    if units * (start_pos + n_new) < 4096 {
        run(0..units);
    } else {
        super::parallel::for_each_chunk(units, run);
    }
}
