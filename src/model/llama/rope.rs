//! Rotary position embeddings, precomputed per position and applied in place.
//!
//! Applied by hand rather than with `candle_nn::rotary_emb` because every token in a batched
//! forward has its own position (sequences of different lengths share one pass), and a per-token
//! scalar loop keeps the result bitwise identical however tokens are batched.

use crate::model::load::hparams::{LlamaHparams, RopeLayout, RopeScaling};

pub struct RopeTable {
    half: usize,
    layout: RopeLayout,
    /// `cos[pos * half + i]` for frequency pair `i`.
    cos: Vec<f32>,
    sin: Vec<f32>,
}

/// Inverse frequencies, with Llama 3's wavelength-dependent scaling when configured.
pub fn inv_freqs(hp: &LlamaHparams) -> Vec<f32> {
    let d = hp.head_dim;
    let base: Vec<f32> = (0..d)
        .step_by(2)
        .map(|i| 1f32 / hp.rope_theta.powf(i as f32 / d as f32))
        .collect();
    match hp.rope_scaling {
        RopeScaling::None => base,
        RopeScaling::Llama3 {
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
    }
}

/// `cos` and `sin` of every position's angle for every frequency pair, position-major
/// (`half` pairs a position): the tables both backends rotate with.
pub fn angle_tables(hp: &LlamaHparams, max_positions: usize) -> (usize, Vec<f32>, Vec<f32>) {
    let freqs = inv_freqs(hp);
    let half = freqs.len();
    let mut cos = Vec::with_capacity(max_positions * half);
    let mut sin = Vec::with_capacity(max_positions * half);
    for pos in 0..max_positions {
        for &f in &freqs {
            let angle = pos as f32 * f;
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    (half, cos, sin)
}

impl RopeTable {
    pub fn new(hp: &LlamaHparams, max_positions: usize) -> Self {
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
        let half = self.half;
        let cos = &self.cos[pos * half..(pos + 1) * half];
        let sin = &self.sin[pos * half..(pos + 1) * half];
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
