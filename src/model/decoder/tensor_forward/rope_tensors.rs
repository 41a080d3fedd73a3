//! Rotary embeddings on a candle device: the angle tables, and rotation of query and key
//! heads with each token's own row gathered (sequences at different positions share a pass).

use candle_core::{Device, Tensor};

use crate::model::decoder::rope::angle_tables;
use crate::model::spec::hparams::{Hparams, LayerRope, RopeLayout};
use crate::model::Result;

/// Rotary tables on the device: `cos[pos][i]`, `sin[pos][i]` for frequency pair `i`.
pub(crate) struct TensorRope {
    pub(super) cos: Tensor,
    pub(super) sin: Tensor,
    layout: RopeLayout,
}

impl TensorRope {
    pub fn new(hp: &Hparams, max_positions: usize, device: &Device) -> Result<Self> {
        let (half, cos, sin) = angle_tables(hp, max_positions);
        Ok(Self {
            cos: Tensor::from_vec(cos, (max_positions, half), device)?,
            sin: Tensor::from_vec(sin, (max_positions, half), device)?,
            layout: hp.rope_layout,
        })
    }

    /// Rotates `x` (`(tokens, heads, 1, head_dim)`) with `cos`/`sin` rows gathered per token.
    pub(super) fn apply(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        Ok(match self.layout {
            RopeLayout::Interleaved => candle_nn::rotary_emb::rope_i(x, cos, sin)?,
            RopeLayout::HalfSplit => candle_nn::rotary_emb::rope(x, cos, sin)?,
        })
    }
}

/// A model's rotary tables on the device: the global one, and the windowed layers' where they
/// rotate at their own base (Gemma 3's local layers).
pub(crate) struct TensorRopes {
    pub(super) global: TensorRope,
    pub(super) local: Option<TensorRope>,
}

impl TensorRopes {
    pub fn new(hp: &Hparams, max_positions: usize, device: &Device) -> Result<Self> {
        Ok(Self {
            global: TensorRope::new(hp, max_positions, device)?,
            local: hp
                .local_rope()
                .map(|l| TensorRope::new(&l, max_positions, device))
                .transpose()?,
        })
    }

    /// Whether layer `l` rotates with the local table.
    pub(super) fn is_local(&self, hp: &Hparams, l: usize) -> bool {
        self.local.is_some() && hp.layer_rope(l) == LayerRope::Local
    }
}
