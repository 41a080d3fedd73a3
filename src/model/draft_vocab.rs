//! A reduced draft vocabulary: the K tokens a target writes most often, and an output head
//! over just their rows.
//!
//! Why it exists: a drafter's output head over a whole vocabulary (49,152 tokens on the
//! default model) is a large share of a small model's step, and drafts are almost always
//! frequent tokens. Projecting onto the K most frequent rows cuts that share by the vocabulary's
//! ratio; the draft distribution is then over those K tokens (0 elsewhere), which the
//! acceptance rule handles like any other, so output stays exact. A draft head and a draft
//! model (or `self:K`) build one the same way, each from its own output head's rows, and hold
//! it themselves: the model that drafts never knows it drafts.

use candle_core::{Device, Tensor};

use super::decoder::batch::BatchFeatures;
use super::decoder::device::ForwardKind;
use super::decoder::linear::{Linear, RawWeight, WeightsDtype};
use super::{ModelError, Result};

/// The target ids of a reduced draft vocabulary (in rank order) and the output head's rows for
/// them.
pub struct DraftVocab {
    ids: Vec<u32>,
    head: Linear,
}

impl DraftVocab {
    /// The first `k` tokens of `ranking` (all it holds when it holds fewer), or `None` for the
    /// whole vocabulary: `k` of 0, an empty ranking, or one covering all `vocab` tokens.
    pub fn ids_of(ranking: &[u32], k: usize, vocab: usize) -> Option<Vec<u32>> {
        let n = k.min(ranking.len());
        (k > 0 && n > 0 && n < vocab).then(|| ranking[..n].to_vec())
    }

    /// A draft vocabulary of `ids` whose output-head rows are `rows` (`(ids, hidden)`), its
    /// matmul in `dtype`.
    pub fn new(ids: Vec<u32>, rows: Tensor, dtype: WeightsDtype) -> Result<Self> {
        let head = Linear::convert(
            RawWeight::Dense(rows),
            dtype,
            &Device::Cpu,
            ForwardKind::Own,
        )?;
        Ok(Self { ids, head })
    }

    /// The target ids of the logits' columns.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Each of a batch's `seqs` sequences' last row of `features` (the final normed states,
    /// [`FeatureTaps::LastNormed`](crate::model::FeatureTaps::LastNormed)) projected onto the draft vocabulary: rows of `ids().len()`
    /// values in batch order, and that width.
    pub fn logits_of_last(
        &self,
        features: &BatchFeatures,
        seqs: usize,
    ) -> Result<(Vec<f32>, usize)> {
        let h = features.hidden();
        let mut last = Vec::with_capacity(seqs * h);
        for i in 0..seqs {
            let rows = features.seq(i);
            let Some(from) = rows.len().checked_sub(h) else {
                return Err(ModelError::BadInput(format!(
                    "sequence {i} of a draft step has no tokens"
                )));
            };
            last.extend_from_slice(&rows[from..]);
        }
        let x = Tensor::from_vec(last, (seqs, h), &Device::Cpu)?;
        let logits = self.project(&x)?;
        let width = logits.dim(1)?;
        Ok((logits.flatten_all()?.to_vec1::<f32>()?, width))
    }

    /// Logits over the draft vocabulary of output states `x` (`(rows, hidden)`, after the final
    /// norm): `(rows, ids)`.
    pub fn project(&self, x: &Tensor) -> Result<Tensor> {
        self.head.forward(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vocabulary_is_the_rankings_first_k_or_none() {
        let ranking = [5u32, 2, 9, 1];
        assert_eq!(DraftVocab::ids_of(&ranking, 2, 10), Some(vec![5, 2]));
        assert_eq!(DraftVocab::ids_of(&ranking, 8, 10), Some(vec![5, 2, 9, 1]));
        assert_eq!(DraftVocab::ids_of(&ranking, 0, 10), None, "0 = all");
        assert_eq!(DraftVocab::ids_of(&[], 4, 10), None, "no ranking");
        assert_eq!(DraftVocab::ids_of(&ranking, 4, 4), None, "every token");
    }
}
