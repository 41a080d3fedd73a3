//! The multiply-add rate of this model's attention kernel, measured on its own shape.
//!
//! Why it exists: deep in a context a prompt token's attention, not its matmuls, decides what
//! it costs (SmolLM2 at depth 7900: about 7 ms a token against 0.7 near depth 0, 2 threads),
//! so a scheduler that hands out prefill by tokens alone lets one chunk stall every other
//! sequence's decoding for seconds. What a key costs against what a token's weights cost is a
//! property of the two kernels on this machine (attention's f32 fused multiply-adds against
//! the matmuls' int8 dot products on quantized weights), so it is timed, beside
//! [`Decoder::matmul_peak_macs_per_s`], rather than assumed.

use super::model::Decoder;
use crate::model::cache::kv_cache::KvDtype;
use crate::model::kernels::attention::{causal_attention, AttnShape, KvRows, Q8Rows};

/// Queries and keys of the timed call: 16 tokens after 1008, so the keys span two of the
/// kernel's segments and its queries form whole runs, as a prefill chunk's do.
const QUERIES: usize = 16;
const KEYS: usize = 1024;

impl Decoder {
    /// Multiply-adds a second of [`causal_attention`] on this model's head shape and cache
    /// type (a key and a value multiply-add per head dimension), best of `repeats` calls of
    /// 16 queries over about 1000 keys on the forward's threads.
    pub fn attention_macs_per_s(&self, repeats: usize) -> f64 {
        let hp = self.hparams();
        let shape = AttnShape {
            num_heads: hp.num_heads,
            num_kv_heads: hp.num_kv_heads,
            head_dim: hp.head_dim,
        };
        let q: Vec<f32> = (0..QUERIES * shape.q_dim())
            .map(|i| ((i % 89) as f32 - 44.0) / 60.0)
            .collect();
        let kv = KEYS * shape.kv_dim();
        let mut out = vec![0f32; q.len()];
        let mut time = |call: &mut dyn FnMut(&mut [f32])| {
            let mut best = f64::INFINITY;
            for _ in 0..repeats.max(2) {
                let t = std::time::Instant::now();
                call(&mut out);
                best = best.min(t.elapsed().as_secs_f64());
            }
            best
        };
        let seconds = match self.kv_dtype() {
            KvDtype::F32 => {
                let rows = vec![0.01f32; kv];
                time(&mut |o| timed_call(shape, &q, rows.as_slice(), o))
            }
            KvDtype::F16 => {
                let rows = vec![half::f16::from_f32(0.01); kv];
                time(&mut |o| timed_call(shape, &q, rows.as_slice(), o))
            }
            KvDtype::Bf16 => {
                let rows = vec![half::bf16::from_f32(0.01); kv];
                time(&mut |o| timed_call(shape, &q, rows.as_slice(), o))
            }
            KvDtype::Q8_0 => {
                let quants = vec![1i8; kv];
                let scales = vec![0.01f32; kv.div_ceil(Q8Rows::BLOCK)];
                let rows = Q8Rows::new(&quants, &scales);
                time(&mut |o| timed_call(shape, &q, rows, o))
            }
        };
        // Query i (from 0) sees KEYS - QUERIES + i + 1 keys.
        let pairs: usize = (0..QUERIES).map(|i| KEYS - QUERIES + i + 1).sum();
        let macs = 2 * pairs * shape.num_heads * shape.head_dim;
        macs as f64 / seconds.max(1e-9)
    }
}

fn timed_call<K: KvRows>(shape: AttnShape, q: &[f32], rows: K, out: &mut [f32]) {
    causal_attention(shape, q, rows, rows, (KEYS - QUERIES, None), out);
}
