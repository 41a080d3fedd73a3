//! The decoder as the layers above see it: one forward that runs new tokens of many
//! sequences at once, each against its own KV cache slot and start position, and returns only
//! the logits rows the caller asks for.
//!
//! Two backends run it. The own CPU kernels (`own_forward`) are the default on a CPU; candle's
//! tensors (`tensor_forward`) run it on any candle device, a GPU included. Both take the same
//! inputs, fill the same [`KvCache`] type and give logits on the host, so the engine, drafters
//! and governor do not know which one runs.

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};

use super::{own_forward, tensor_forward};
use crate::model::cache::kv_cache::{KvCache, KvDtype};
use crate::model::decoder::batch::{BatchFeatures, BatchLogits, FeatureTaps, SeqInput};
use crate::model::decoder::device::ForwardKind;
use crate::model::decoder::linear::WeightsDtype;
use crate::model::decoder::rope::Ropes;
use crate::model::decoder::tensor_forward::TensorRopes;
use crate::model::decoder::weights::DecoderWeights;
use crate::model::load::weight_roles::WeightReader;
use crate::model::spec::hparams::Hparams;
use crate::model::{ModelError, Result};

/// The per-backend state beside the weights.
enum Backend {
    Own(Ropes),
    Tensor(TensorRopes),
}

pub struct Decoder {
    hp: Hparams,
    device: Device,
    weights: DecoderWeights,
    backend: Backend,
    context_len: usize,
    weights_dtype: WeightsDtype,
    kv_dtype: KvDtype,
}

impl Decoder {
    /// Builds the model on the CPU's own kernels, converting every linear weight to
    /// `weights_dtype`. `context_len` caps the positions (and so the KV cache) this instance
    /// supports; 0 takes the model's own maximum.
    pub fn load(
        reader: &mut WeightReader,
        hp: Hparams,
        weights_dtype: WeightsDtype,
        context_len: usize,
    ) -> Result<Self> {
        Self::load_on(
            reader,
            hp,
            weights_dtype,
            context_len,
            &Device::Cpu,
            ForwardKind::Own,
        )
    }

    /// Builds the model for the forward `kind` on `device` (the own kernels need the CPU).
    pub fn load_on(
        reader: &mut WeightReader,
        hp: Hparams,
        weights_dtype: WeightsDtype,
        context_len: usize,
        device: &Device,
        kind: ForwardKind,
    ) -> Result<Self> {
        if kind == ForwardKind::Own && !device.is_cpu() {
            return Err(ModelError::Device(
                "the own kernels run on the CPU only; use the candle backend on a GPU".into(),
            ));
        }
        let context_len = match context_len {
            0 => hp.max_position_embeddings,
            n => n.min(hp.max_position_embeddings),
        }
        .max(1);
        // On a GPU candle's quantized matmuls are not batch-invariant: measured on an H200, a
        // 5-token forward's rows differ from single steps, and greedy speculative output left
        // plain decoding's on 7 of 13 categories. Dense f16 through cuBLAS kept them equal and
        // a step of a small model costs the same (launches, not bytes, bound it there).
        let weights_dtype = match weights_dtype {
            WeightsDtype::Auto if !device.is_cpu() => WeightsDtype::F16,
            dtype => dtype,
        };
        let weights = DecoderWeights::load(reader, &hp, weights_dtype, device, kind)?;
        let quantized = weights.layers.first().is_some_and(|l| {
            l.qkv
                .dtypes()
                .iter()
                .any(|t| !matches!(t, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16))
        });
        if !device.is_cpu() && quantized {
            tracing::warn!(
                "quantized weights ({weights_dtype}) on a GPU: candle's quantized kernels there \
                 give a verified token other bits than a single step, so greedy speculative \
                 output can leave plain decoding's at near-ties (weights_dtype auto takes f16 on \
                 a GPU)"
            );
        }
        let backend = match kind {
            ForwardKind::Own => Backend::Own(Ropes::new(&hp, context_len)),
            ForwardKind::Tensor => Backend::Tensor(TensorRopes::new(&hp, context_len, device)?),
        };
        Ok(Self {
            hp,
            device: device.clone(),
            weights,
            backend,
            context_len,
            weights_dtype,
            kv_dtype: KvDtype::F32,
        })
    }

    /// Sets the element type of the caches [`Decoder::new_cache`] makes.
    pub fn with_kv_dtype(mut self, kv_dtype: KvDtype) -> Self {
        self.kv_dtype = kv_dtype;
        self
    }

    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    pub fn hparams(&self) -> &Hparams {
        &self.hp
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Which forward runs this model.
    pub fn forward_kind(&self) -> ForwardKind {
        match self.backend {
            Backend::Own(_) => ForwardKind::Own,
            Backend::Tensor(_) => ForwardKind::Tensor,
        }
    }

    /// Where and how the model runs, for logs and start-up lines: `cpu (own CPU kernels)`.
    pub fn placement(&self) -> String {
        let device = match &self.device {
            Device::Cpu => "cpu".to_string(),
            Device::Cuda(_) => "cuda".to_string(),
            Device::Metal(_) => "metal".to_string(),
        };
        format!("{device} ({})", self.forward_kind())
    }

    pub fn context_len(&self) -> usize {
        self.context_len
    }

    pub fn weights_dtype(&self) -> WeightsDtype {
        self.weights_dtype
    }

    /// Bytes of every linear weight (the output head included) in its ggml type: what the
    /// model holds.
    pub fn weight_bytes(&self) -> usize {
        self.weights.weight_bytes()
    }

    /// Bytes of the linear weights one token reads: [`Self::weight_bytes`] for a dense model,
    /// a mixture's router and chosen experts only (what a 1-token forward streams at least).
    pub fn bytes_per_token(&self) -> usize {
        self.weights.bytes_per_token()
    }

    /// Multiply-adds per token of each kind of matmul, summed over the layers.
    pub fn macs_per_token(&self) -> Vec<(crate::model::decoder::op_profile::Op, usize)> {
        self.weights.macs_per_token()
    }

    /// The multiply-add rate of this model's matmul kernel on weights that stay in cache:
    /// layer 0's q/k/v projection (a few hundred KB at 4 bits, inside a core's L2 on a small
    /// model) timed at 1 and at 17 rows, best of `repeats`; the 16 extra rows' multiply-adds
    /// over the time they add. This is the kernel's inner loop at full speed, the floor under
    /// what one more verified token costs in the matmuls.
    pub fn matmul_peak_macs_per_s(&self, repeats: usize) -> Result<f64> {
        let layer = &self.weights.layers[0];
        let (k, n) = (layer.qkv.in_features(), layer.qkv.out_features());
        let input = |rows: usize| -> Result<candle_core::Tensor> {
            let v: Vec<f32> = (0..rows * k)
                .map(|i| ((i % 97) as f32 - 48.0) / 50.0)
                .collect();
            Ok(candle_core::Tensor::from_vec(v, (rows, k), &self.device)?)
        };
        let (one, wide) = (input(1)?, input(17)?);
        let best = |x: &candle_core::Tensor| -> Result<f64> {
            let mut best = f64::INFINITY;
            for _ in 0..repeats.max(2) {
                let t = std::time::Instant::now();
                layer.qkv.forward(x)?;
                best = best.min(t.elapsed().as_secs_f64());
            }
            Ok(best)
        };
        let (t1, t17) = (best(&one)?, best(&wide)?);
        Ok((16 * k * n) as f64 / (t17 - t1).max(1e-9))
    }

    /// The ggml types the linear weights ended up as (after any fallback), for reporting.
    pub fn linear_dtypes(&self) -> Vec<String> {
        self.weights.linear_dtypes()
    }

    /// The linear weights' types that no own kernel runs on this CPU (candle's generic
    /// quantized matmul multiplies them), sorted; empty when every matmul is ours.
    pub fn types_without_own_kernel(&self) -> Vec<String> {
        self.weights.types_without_own_kernel()
    }

    /// A cache with `num_slots` sequence slots of up to `context_len` tokens each, where this
    /// model's forward keeps it (host buffers or device tensors).
    pub fn new_cache(&self, num_slots: usize) -> KvCache {
        let hp = &self.hp;
        match self.backend {
            Backend::Own(_) => KvCache::new(
                hp.num_layers,
                hp.num_kv_heads * hp.head_dim,
                num_slots,
                self.context_len,
                self.kv_dtype,
            ),
            Backend::Tensor(_) => KvCache::on_device(
                hp.num_layers,
                hp.num_kv_heads,
                hp.head_dim,
                num_slots,
                self.context_len,
                self.kv_dtype,
                &self.device,
            ),
        }
    }

    fn validate(&self, cache: &KvCache, batch: &[SeqInput]) -> Result<()> {
        if batch.is_empty() {
            return Err(ModelError::BadInput("empty batch".into()));
        }
        if cache.is_on_device() != matches!(self.backend, Backend::Tensor(_)) {
            return Err(ModelError::BadInput(
                "the cache was made by a model on another backend".into(),
            ));
        }
        for (i, s) in batch.iter().enumerate() {
            if s.tokens.is_empty() {
                return Err(ModelError::BadInput(format!("sequence {i} has no tokens")));
            }
            if batch[..i].iter().any(|o| o.slot == s.slot) {
                return Err(ModelError::BadInput(format!(
                    "slot {} appears twice",
                    s.slot
                )));
            }
            let held = cache.len(s.slot)?;
            if s.start_pos != held {
                return Err(ModelError::BadInput(format!(
                    "slot {} holds {held} tokens but the input starts at {}: keep only that many first (`KvCache::keep`)",
                    s.slot, s.start_pos
                )));
            }
            if s.start_pos + s.tokens.len() > self.context_len {
                return Err(ModelError::BadInput(format!(
                    "slot {} would hold {} tokens, past the context length {}",
                    s.slot,
                    s.start_pos + s.tokens.len(),
                    self.context_len
                )));
            }
            if !s.parents.is_empty() {
                let ordered = s.parents.len() == s.tokens.len()
                    && s.parents[0] == crate::model::decoder::batch::TREE_ROOT
                    && s.parents
                        .iter()
                        .enumerate()
                        .skip(1)
                        .all(|(k, &p)| (p as usize) < k);
                if !ordered {
                    return Err(ModelError::BadInput(format!(
                        "slot {}: a tree input needs one parent per token, the first {} and \
                         each other an earlier token's index",
                        s.slot,
                        crate::model::decoder::batch::TREE_ROOT
                    )));
                }
            }
            self.check_ids(s.tokens)?;
        }
        Ok(())
    }

    /// Runs new tokens of every sequence in `batch` through the model, appending their keys and
    /// values to the cache, and returns the logits rows each sequence asked for.
    pub fn forward(&self, cache: &mut KvCache, batch: &[SeqInput]) -> Result<BatchLogits> {
        Ok(self.forward_inner(cache, batch, &[])?.0)
    }

    /// [`Decoder::forward`], and every new token's hidden states that `taps` names: the features
    /// a draft head drafts from.
    pub fn forward_with_features(
        &self,
        cache: &mut KvCache,
        batch: &[SeqInput],
        taps: &FeatureTaps,
    ) -> Result<(BatchLogits, BatchFeatures)> {
        let features = match taps {
            FeatureTaps::LastNormed => {
                let (logits, x, _) = self.forward_inner(cache, batch, &[])?;
                (logits, self.final_norm(&x)?)
            }
            FeatureTaps::LayerInputs(layers) => {
                let (logits, _, tapped) = self.forward_inner(cache, batch, layers)?;
                (logits, Tensor::cat(&tapped, 1)?)
            }
        };
        Ok((features.0, BatchFeatures::new(features.1, batch)?))
    }

    /// The final norm over rows of the last layer's output.
    pub fn final_norm(&self, x: &Tensor) -> Result<Tensor> {
        let eps = self.hp.rms_norm_eps as f32;
        Ok(crate::model::kernels::rms_norm::rms_norm(
            x,
            &self.weights.norm,
            eps,
        )?)
    }

    fn forward_inner(
        &self,
        cache: &mut KvCache,
        batch: &[SeqInput],
        taps: &[usize],
    ) -> Result<(BatchLogits, Tensor, Vec<Tensor>)> {
        self.validate(cache, batch)?;
        let result = match &self.backend {
            Backend::Own(rope) => {
                own_forward::forward(&self.weights, &self.hp, rope, cache, batch, taps)
            }
            Backend::Tensor(rope) => {
                tensor_forward::forward(&self.weights, &self.hp, rope, cache, batch, taps)
            }
        };
        match result {
            Ok(out) => {
                for s in batch {
                    cache.commit_len(s.slot, s.start_pos + s.tokens.len())?;
                }
                Ok(out)
            }
            Err(e) => {
                for s in batch {
                    cache.undo_partial_append(s.slot)?;
                }
                Err(e)
            }
        }
    }

    /// The input embeddings of `ids` in f32 as the first layer gets them (a draft head's token
    /// input): scaled where the family scales them.
    pub fn embed(&self, ids: &[u32]) -> Result<Tensor> {
        self.check_ids(ids)?;
        self.weights.input_rows(&self.hp, ids, &Device::Cpu)
    }

    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        match ids.iter().find(|&&t| t as usize >= self.hp.vocab_size) {
            Some(&bad) => Err(ModelError::BadInput(format!(
                "token id {bad} is outside the vocabulary ({})",
                self.hp.vocab_size
            ))),
            None => Ok(()),
        }
    }

    /// The output head over rows of normed hidden states `(rows, hidden)` on the host: full
    /// logits in f32.
    pub fn project(&self, hidden: &Tensor) -> Result<Tensor> {
        let x = hidden.to_device(&self.device)?;
        Ok(self
            .weights
            .lm_head
            .forward(&x)?
            .to_dtype(DType::F32)?
            .to_device(&Device::Cpu)?)
    }

    /// Rows `ids` of the output head's weight in f32 (a reduced draft vocabulary's head),
    /// read from the embedding when the model ties the two.
    pub fn output_rows(&self, ids: &[u32]) -> Result<Tensor> {
        if !self.weights.output_tied {
            return Err(ModelError::Unsupported(
                "a reduced draft vocabulary (speculation.draft_vocab) needs a target whose output \
                 head is its embedding (tie_word_embeddings); set draft_vocab = 0 for this one"
                    .into(),
            ));
        }
        self.check_ids(ids)?;
        self.weights.embed.rows(ids, &Device::Cpu)
    }
}
