//! Rotary position embeddings, precomputed per position and applied in place.
//!
//! Applied by hand rather than with `candle_nn::rotary_emb` because every token in a batched
//! forward has its own position (sequences of different lengths share one pass), and a per-token
//! scalar loop keeps the result bitwise identical however tokens are batched.

use crate::model::spec::hparams::{Hparams, LayerRope, RopeLayout, RopeScaling};

/// A model's rope tables: the global one, and the windowed layers' where they rotate at their
/// own base (Gemma 3's local layers).
pub struct Ropes {
    global: RopeTable,
    local: Option<RopeTable>,
}

impl Ropes {
    pub fn new(hp: &Hparams, max_positions: usize) -> Self {
        Self {
            global: RopeTable::new(hp, max_positions),
            local: hp.local_rope().map(|l| RopeTable::new(&l, max_positions)),
        }
    }

    /// The table layer `l` rotates with.
    pub fn for_layer(&self, hp: &Hparams, l: usize) -> &RopeTable {
        match (hp.layer_rope(l), &self.local) {
            (LayerRope::Local, Some(local)) => local,
            _ => &self.global,
        }
    }
}

pub struct RopeTable {
    half: usize,
    layout: RopeLayout,
    /// `cos[pos * half + i]` for frequency pair `i`.
    cos: Vec<f32>,
    sin: Vec<f32>,
}

/// Inverse frequencies for a model instance of `max_positions`, with the configured scaling
/// (Llama 3's wavelength-dependent one, linear, or LongRoPE's per-frequency factors).
pub fn inv_freqs(hp: &Hparams, max_positions: usize) -> Vec<f32> {
    let d = hp.head_dim;
    let base: Vec<f32> = (0..d)
        .step_by(2)
        .map(|i| 1f32 / hp.rope_theta.powf(i as f32 / d as f32))
        .collect();
    match &hp.rope_scaling {
        RopeScaling::None => base,
        &RopeScaling::Linear { factor } => base.into_iter().map(|f| f / factor).collect(),
        RopeScaling::LongRope {
            short_factor,
            long_factor,
            original_max_position_embeddings,
            ..
        } => {
            let factors = match max_positions > *original_max_position_embeddings {
                true => long_factor,
                false => short_factor,
            };
            base.into_iter()
                .zip(factors.iter().chain(std::iter::repeat(&1.0)))
                .map(|(f, s)| f / s)
                .collect()
        }
        &RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let old = original_max_position_embeddings as f32;
            let low_wavelen = old / low_freq_factor;
            let high_wavelen = old / high_freq_factor;
            base.into_iter()
                .map(|freq| {
                    let wavelen = 2. * std::f32::consts::PI / freq;
                    if wavelen < high_wavelen {
                        freq
                    } else if wavelen > low_wavelen {
                        freq / factor
                    } else {
                        let smooth = (old / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1. - smooth) * freq / factor + smooth * freq
                    }
                })
                .collect()
        }
        &RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            truncate,
            ..
        } => yarn_freqs(
            &base,
            (hp.rope_theta, d),
            factor,
            original_max_position_embeddings,
            (beta_fast, beta_slow, truncate),
        ),
    }
}

/// YaRN's frequencies (transformers' `_compute_yarn_parameters`, llama.cpp's
/// `ggml_rope_yarn_corr_dims` and ramp): dimension pair `i` keeps its frequency below the
/// correction range `[low, high]`, takes it divided by `factor` above it, and a linear blend
/// in between.
fn yarn_freqs(
    base: &[f32],
    (theta, dim): (f32, usize),
    factor: f32,
    original: usize,
    (beta_fast, beta_slow, truncate): (f32, f32, bool),
) -> Vec<f32> {
    // The dimension at which a frequency turns `rotations` times over the original context.
    let correction_dim = |rotations: f32| {
        dim as f32 * (original as f32 / (rotations * 2.0 * std::f32::consts::PI)).ln()
            / (2.0 * theta.ln())
    };
    let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
    if truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, high) = (low.max(0.0), high.min(dim as f32 - 1.0));
    let span = if high == low { 0.001 } else { high - low };
    base.iter()
        .enumerate()
        .map(|(i, &freq)| {
            let ramp = ((i as f32 - low) / span).clamp(0.0, 1.0);
            let extrapolation = 1.0 - ramp;
            freq / factor * (1.0 - extrapolation) + freq * extrapolation
        })
        .collect()
}

/// `cos` and `sin` of every position's angle for every frequency pair, position-major
/// (`half` pairs a position): the tables both backends rotate with.
pub fn angle_tables(hp: &Hparams, max_positions: usize) -> (usize, Vec<f32>, Vec<f32>) {
    let freqs = inv_freqs(hp, max_positions);
    let half = freqs.len();
    let mscale = match hp.rope_scaling {
        RopeScaling::LongRope {
            attention_factor, ..
        }
        | RopeScaling::Yarn {
            attention_factor, ..
        } => attention_factor,
        _ => 1.0,
    };
    let mut cos = Vec::with_capacity(max_positions * half);
    let mut sin = Vec::with_capacity(max_positions * half);
    for pos in 0..max_positions {
        for &f in &freqs {
            let angle = pos as f32 * f;
            cos.push(angle.cos() * mscale);
            sin.push(angle.sin() * mscale);
        }
    }
    (half, cos, sin)
}

impl RopeTable {
    pub fn new(hp: &Hparams, max_positions: usize) -> Self {
        let (half, cos, sin) = angle_tables(hp, max_positions);
        Self {
            half,
            layout: hp.rope_layout,
            cos,
            sin,
        }
    }

    pub fn max_positions(&self) -> usize {
        self.cos.len() / self.half.max(1)
    }

    /// Rotates every head of one token (`x` holds `n_heads * head_dim` values) to `pos`.
    pub fn apply(&self, x: &mut [f32], pos: usize, head_dim: usize) {
        #[cfg(target_arch = "x86_64")]
        if self.layout == RopeLayout::Interleaved
            && self.half.is_multiple_of(4)
            && head_dim == 2 * self.half
            && crate::model::kernels::fast_exp::vector_available()
        {
            let (cos, sin) = self.angles(pos);
            // SAFETY: AVX2 was checked; the kernel reads whole heads of `x` and `half` angles.
            unsafe { rotate_interleaved_avx2(x, cos, sin) };
            return;
        }
        self.apply_scalar(x, pos, head_dim)
    }

    fn angles(&self, pos: usize) -> (&[f32], &[f32]) {
        let half = self.half;
        (
            &self.cos[pos * half..(pos + 1) * half],
            &self.sin[pos * half..(pos + 1) * half],
        )
    }

    /// The definition every path computes: per pair `(a, b)`, `a · cos − b · sin` and
    /// `a · sin + b · cos`, each product rounded, then the sum.
    fn apply_scalar(&self, x: &mut [f32], pos: usize, head_dim: usize) {
        let half = self.half;
        let (cos, sin) = self.angles(pos);
        for head in x.chunks_exact_mut(head_dim) {
            match self.layout {
                RopeLayout::Interleaved => {
                    for (i, pair) in head.chunks_exact_mut(2).enumerate() {
                        let (a, b) = (pair[0], pair[1]);
                        pair[0] = a * cos[i] - b * sin[i];
                        pair[1] = a * sin[i] + b * cos[i];
                    }
                }
                RopeLayout::HalfSplit => {
                    let (lo, hi) = head.split_at_mut(half);
                    for i in 0..half {
                        let (a, b) = (lo[i], hi[i]);
                        lo[i] = a * cos[i] - b * sin[i];
                        hi[i] = a * sin[i] + b * cos[i];
                    }
                }
            }
        }
    }
}

/// [`RopeTable::apply_scalar`] for the interleaved layout, four pairs a 256-bit vector: the
/// pairs' values swapped in place, each angle duplicated across its pair, and the same products
/// and sums (`a · cos + (−(b · sin))` is `a · cos − b · sin` exactly, and the odd lane's sum
/// is the scalar one with its terms commuted), so the same bits. The scalar loop compiled to a
/// value at a time, and at a verification's 9 rows rotating took as long as the cache writes
/// and norms together.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn rotate_interleaved_avx2(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    use std::arch::x86_64::*;
    let half = cos.len();
    debug_assert!(half.is_multiple_of(4) && sin.len() == half);
    let dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    let negate_even = _mm256_setr_ps(-0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0);
    for head in x.chunks_exact_mut(2 * half) {
        let hp = head.as_mut_ptr();
        for i in (0..half).step_by(4) {
            let angle = |t: &[f32]| {
                _mm256_permutevar8x32_ps(
                    _mm256_castps128_ps256(_mm_loadu_ps(t.as_ptr().add(i))),
                    dup,
                )
            };
            let (c, s) = (angle(cos), angle(sin));
            let v = _mm256_loadu_ps(hp.add(2 * i));
            let swapped = _mm256_permute_ps::<0b10_11_00_01>(v);
            let cross = _mm256_xor_ps(_mm256_mul_ps(swapped, s), negate_even);
            _mm256_storeu_ps(hp.add(2 * i), _mm256_add_ps(_mm256_mul_ps(v, c), cross));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vector_rotation_gives_the_scalar_bits() {
        let (half, positions) = (32usize, 300usize);
        let freqs: Vec<f32> = (0..half)
            .map(|i| 1f32 / 10000f32.powf(2.0 * i as f32 / (2 * half) as f32))
            .collect();
        let mut cos = Vec::new();
        let mut sin = Vec::new();
        for pos in 0..positions {
            for &f in &freqs {
                cos.push((pos as f32 * f).cos());
                sin.push((pos as f32 * f).sin());
            }
        }
        let table = RopeTable {
            half,
            layout: RopeLayout::Interleaved,
            cos,
            sin,
        };
        // 3 heads of 64, values of both signs, a zero and a negative zero.
        let mut x: Vec<f32> = (0..3 * 2 * half)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.013)
            .collect();
        x[5] = 0.0;
        x[6] = -0.0;
        for pos in [0, 1, 17, 299] {
            let (mut fast, mut slow) = (x.clone(), x.clone());
            table.apply(&mut fast, pos, 2 * half);
            table.apply_scalar(&mut slow, pos, 2 * half);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fast), bits(&slow), "position {pos}");
            if pos > 0 {
                assert_ne!(bits(&fast), bits(&x), "position {pos} rotates");
            }
        }
    }
}
