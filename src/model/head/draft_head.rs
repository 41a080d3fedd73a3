//! The loaded head ([`DraftHead`]): built for a target from its tensors, its input states
//! from the target's features, and its forward over its one-layer cache ([`HeadStep`]).

use std::borrow::Cow;

use candle_core::{Device, Tensor};

use super::tensors::{head_hparams, HeadTensors};
use super::{checkpoint, eagle3};
use crate::model::cache::kv_cache::{KvCache, KvDtype};
use crate::model::decoder::batch::{logits_rows, FeatureTaps, SeqInput};
use crate::model::decoder::device::ForwardKind;
use crate::model::decoder::ffn::{Ffn, GatedMlp};
use crate::model::decoder::layer::{Layer, LayerExtras};
use crate::model::decoder::linear::{Linear, RawWeight, WeightsDtype};
use crate::model::decoder::own_forward::{run_layers, LayerIo};
use crate::model::decoder::rope::Ropes;
use crate::model::draft_vocab::DraftVocab;
use crate::model::spec::hparams::Hparams;
use crate::model::{Decoder, ModelError, Result};

/// A loaded head, ready to draft for a target.
pub struct DraftHead {
    hp: Hparams,
    tensors: HeadTensors,
    fc: Linear,
    layers: Vec<Layer>,
    rope: Ropes,
    context_len: usize,
    vocab: Option<DraftVocab>,
}

/// One head forward's results: every input row's output state (the next position's feature)
/// and the draft logits of the rows asked for (over the draft vocabulary when there is one).
pub struct HeadStep {
    pub hidden: Vec<f32>,
    pub logits: Vec<f32>,
    /// Logits columns: the draft vocabulary's size, or the target's.
    pub width: usize,
    /// Each sequence's logits rows.
    pub ranges: Vec<std::ops::Range<usize>>,
}

impl HeadStep {
    pub fn row(&self, r: usize) -> &[f32] {
        &self.logits[r * self.width..(r + 1) * self.width]
    }
}

impl DraftHead {
    /// Builds the head for `target`, its matmuls in `dtype`, with a reduced draft vocabulary of
    /// the `draft_vocab` most frequent tokens (all the ranking holds when it holds fewer; 0, or
    /// a head with no ranking: the full vocabulary). The target's shape must match the head's
    /// tensors.
    pub fn new(
        mut tensors: HeadTensors,
        target: &Decoder,
        dtype: WeightsDtype,
        draft_vocab: usize,
    ) -> Result<Self> {
        let mut hp = head_hparams(target.hparams());
        hp.intermediate_size = tensors.gate.dim(0)?;
        if let Some(p) = &mut tensors.eagle3 {
            // Its own RoPE (EAGLE-3 heads are trained with their config's, not the target's).
            hp.rope_theta = p.rope_theta;
            hp.rope_scaling = p.rope_scaling.clone();
            if p.taps.is_empty() {
                p.taps = eagle3::default_taps(target.hparams().num_layers);
            }
        }
        checkpoint::check_shapes(&tensors, &hp)?;
        if let Some(p) = &tensors.eagle3 {
            eagle3::check_parts(
                p,
                hp.hidden_size,
                hp.vocab_size,
                target.hparams().num_layers,
            )?;
        }
        let linear = |parts: Vec<&Tensor>| -> Result<Linear> {
            let raw = parts
                .into_iter()
                .map(|t| RawWeight::Dense(t.clone()))
                .collect();
            Linear::fuse(raw, dtype, &Device::Cpu, ForwardKind::Own)
        };
        let layer = Layer {
            attn_norm: tensors.eagle3.as_ref().map(|p| p.hidden_norm.clone()),
            qkv: linear(vec![&tensors.q, &tensors.k, &tensors.v])?,
            o: linear(vec![&tensors.o])?,
            ffn_norm: tensors.ffn_norm.clone(),
            ffn: Ffn::Dense(GatedMlp {
                gate_up: linear(vec![&tensors.gate, &tensors.up])?,
                down: linear(vec![&tensors.down])?,
                act: crate::model::spec::block::Activation::Silu,
                biases: None,
            }),
            extras: LayerExtras::default(),
        };
        // An EAGLE-3 head drafts over its own vocabulary with its own output head.
        let ranked = DraftVocab::ids_of(&tensors.token_rank, draft_vocab, hp.vocab_size);
        let vocab = match (&tensors.eagle3, ranked) {
            (Some(p), _) => Some(DraftVocab::new(
                p.draft_ids.clone(),
                p.lm_head.clone(),
                dtype,
            )?),
            (None, Some(ids)) => {
                let rows = target.output_rows(&ids)?;
                Some(DraftVocab::new(ids, rows, dtype)?)
            }
            (None, None) => None,
        };
        let context_len = target.context_len();
        Ok(Self {
            fc: linear(vec![&tensors.fc])?,
            layers: vec![layer],
            rope: Ropes::new(&hp, context_len),
            hp,
            tensors,
            context_len,
            vocab,
        })
    }

    pub fn hidden_size(&self) -> usize {
        self.hp.hidden_size
    }

    /// The target's hidden states this head drafts from.
    pub fn feature_taps(&self) -> FeatureTaps {
        match &self.tensors.eagle3 {
            Some(p) => FeatureTaps::LayerInputs(p.taps.clone()),
            None => FeatureTaps::LastNormed,
        }
    }

    /// The head's input state for rows of the target's features (as [`Self::feature_taps`]
    /// names them): an EAGLE head reads the features as they are, an EAGLE-3 head reads `fc`
    /// of its three taps. What [`Self::forward`] takes, a hidden size a row.
    pub fn input_states<'a>(&self, features: &'a [f32]) -> Result<Cow<'a, [f32]>> {
        let Some(_) = &self.tensors.eagle3 else {
            return Ok(Cow::Borrowed(features));
        };
        let width = self.fc.in_features();
        if !features.len().is_multiple_of(width) {
            return Err(ModelError::BadInput(format!(
                "{} feature values are not rows of {width}",
                features.len()
            )));
        }
        let rows = features.len() / width;
        let x = Tensor::from_slice(features, (rows, width), &Device::Cpu)?;
        Ok(Cow::Owned(
            self.fc.forward(&x)?.flatten_all()?.to_vec1::<f32>()?,
        ))
    }

    /// The target ids of the draft vocabulary's columns (`None`: the full vocabulary).
    pub fn vocab_ids(&self) -> Option<&[u32]> {
        self.vocab.as_ref().map(|v| v.ids())
    }

    /// A cache for the head's layer with `slots` sequences.
    pub fn new_cache(&self, slots: usize) -> KvCache {
        KvCache::new(
            1,
            self.hp.num_kv_heads * self.hp.head_dim,
            slots,
            self.context_len,
            KvDtype::F32,
        )
    }

    /// Runs the head over new positions of every sequence in `batch`: row `i` of `features`
    /// (`tokens × hidden`, in batch order) is the input state at the position of input token
    /// `i` ([`Self::input_states`] of the target's features, or the head's own output state
    /// while a chain is drafted), and the token is the one that follows that position. Appends
    /// to the head's cache. Each row's output state (EAGLE-3: before its final norm) comes back
    /// as the next position's input state.
    pub fn forward(
        &self,
        target: &Decoder,
        cache: &mut KvCache,
        batch: &[SeqInput],
        features: &[f32],
    ) -> Result<HeadStep> {
        let h = self.hp.hidden_size;
        let ids: Vec<u32> = batch
            .iter()
            .flat_map(|s| s.tokens.iter().copied())
            .collect();
        let total = ids.len();
        if features.len() != total * h {
            return Err(ModelError::BadInput(format!(
                "{} feature values for {total} head inputs of {h}",
                features.len()
            )));
        }
        for s in batch {
            let held = cache.len(s.slot)?;
            if s.start_pos != held || s.start_pos + s.tokens.len() > self.context_len {
                return Err(ModelError::BadInput(format!(
                    "head slot {} holds {held} tokens; an input at {} of {} does not fit",
                    s.slot,
                    s.start_pos,
                    s.tokens.len()
                )));
            }
        }
        let embeds = target.embed(&ids)?;
        let feats = Tensor::from_slice(features, (total, h), &Device::Cpu)?;
        let eps = self.hp.rms_norm_eps as f32;
        // EAGLE: the layer reads fc([embedding, feature]) as it is. EAGLE-3: the state `g` is
        // the residual, and attention reads [input_norm(embedding), hidden_norm(g)].
        let (x, prefix) = match &self.tensors.eagle3 {
            None => {
                let mut x = self.fc.forward(&Tensor::cat(&[&embeds, &feats], 1)?)?;
                if let Some(b) = &self.tensors.fc_bias {
                    x = x.broadcast_add(b)?;
                }
                (x, None)
            }
            Some(p) => (
                feats,
                Some(candle_nn::ops::rms_norm(&embeds, &p.input_norm, eps)?),
            ),
        };
        let io = LayerIo {
            prefix: prefix.as_ref(),
            taps: &[],
        };
        let result = run_layers(&self.layers, &self.hp, &self.rope, cache, batch, x, io);
        let x = match result {
            Ok((x, _)) => x,
            Err(e) => {
                for s in batch {
                    cache.undo_partial_append(s.slot)?;
                }
                return Err(e);
            }
        };
        for s in batch {
            cache.commit_len(s.slot, s.start_pos + s.tokens.len())?;
        }
        let (rows, ranges) = logits_rows(batch);
        let (logits, width) = if rows.is_empty() {
            (Vec::new(), 0)
        } else {
            let idx = Tensor::from_vec(rows.clone(), rows.len(), &Device::Cpu)?;
            let mut picked = x.index_select(&idx, 0)?;
            if let Some(p) = &self.tensors.eagle3 {
                picked = candle_nn::ops::rms_norm(&picked, &p.final_norm, eps)?;
            }
            let t = match &self.vocab {
                Some(v) => v.project(&picked)?,
                None => target.project(&picked)?,
            };
            let width = t.dim(1)?;
            (t.flatten_all()?.to_vec1::<f32>()?, width)
        };
        Ok(HeadStep {
            hidden: x.flatten_all()?.to_vec1::<f32>()?,
            logits,
            width,
            ranges,
        })
    }
}
