//! A fresh head's weights, EAGLE's or EAGLE-3's, from a seed: where `train-head` starts when it
//! has no head to continue, and the tests' untrained heads.

use candle_core::{DType, Device, Tensor};

use super::{eagle3::Eagle3Parts, head_hparams, HeadTensors};
use crate::model::spec::hparams::Hparams;
use crate::model::{Decoder, Result};

/// `(rows, cols)` uniform in ±1/√cols (PyTorch's default for a linear layer, as EAGLE starts).
fn uniform(state: &mut u64, rows: usize, cols: usize) -> Result<Tensor> {
    let bound = 1.0 / (cols as f32).sqrt();
    let v: Vec<f32> = (0..rows * cols)
        .map(|_| (unit(state) * 2.0 - 1.0) * bound)
        .collect();
    Ok(Tensor::from_vec(v, (rows, cols), &Device::Cpu)?)
}

/// A fresh head for `target`: every matrix uniform in ±1/√in, the norm at one.
pub fn random_head(target: &Hparams, intermediate: usize, seed: u64) -> Result<HeadTensors> {
    let hp = head_hparams(target);
    let h = hp.hidden_size;
    let (q_dim, kv_dim) = (hp.num_heads * hp.head_dim, hp.num_kv_heads * hp.head_dim);
    let state = &mut (seed ^ 0x9e37_79b9_7f4a_7c15);
    Ok(HeadTensors {
        fc: uniform(state, h, 2 * h)?,
        fc_bias: None,
        q: uniform(state, q_dim, h)?,
        k: uniform(state, kv_dim, h)?,
        v: uniform(state, kv_dim, h)?,
        o: uniform(state, h, q_dim)?,
        ffn_norm: Tensor::ones(h, DType::F32, &Device::Cpu)?,
        gate: uniform(state, intermediate, h)?,
        up: uniform(state, intermediate, h)?,
        down: uniform(state, h, intermediate)?,
        token_rank: Vec::new(),
        eagle3: None,
    })
}

/// A fresh EAGLE-3 head for `target`, drafting over `draft_ids` (its output head starts as the
/// target's rows of them), tapping the default layers: `fc` over three taps and q/k/v over
/// `[embedding, g]` uniform as [`random_head`]'s matrices, the norms at one.
pub fn random_eagle3_head(
    target: &Decoder,
    intermediate: usize,
    seed: u64,
    draft_ids: Vec<u32>,
) -> Result<HeadTensors> {
    let hp = head_hparams(target.hparams());
    let h = hp.hidden_size;
    let (q_dim, kv_dim) = (hp.num_heads * hp.head_dim, hp.num_kv_heads * hp.head_dim);
    let mut head = random_head(target.hparams(), intermediate, seed)?;
    let state = &mut (seed ^ 0x3c6e_f372_fe94_f82b);
    head.fc = uniform(state, h, 3 * h)?;
    head.q = uniform(state, q_dim, 2 * h)?;
    head.k = uniform(state, kv_dim, 2 * h)?;
    head.v = uniform(state, kv_dim, 2 * h)?;
    let ones = || Tensor::ones(h, DType::F32, &Device::Cpu);
    head.eagle3 = Some(Eagle3Parts {
        input_norm: ones()?,
        hidden_norm: ones()?,
        final_norm: ones()?,
        lm_head: target.output_rows(&draft_ids)?,
        draft_ids,
        // The default taps, which its config then leaves unnamed as published heads do.
        taps: Vec::new(),
        rope_theta: hp.rope_theta,
        rope_scaling: hp.rope_scaling.clone(),
    });
    Ok(head)
}

/// A uniform number in [0, 1) from a splitmix64 state (training's own seeded stream).
pub(super) fn unit(state: &mut u64) -> f32 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 40) as f32 / (1u64 << 24) as f32
}
