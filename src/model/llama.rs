//! The Llama forward pass: one call runs new tokens of many sequences at once, each against its
//! own KV cache slot and start position, and returns only the logits rows the caller asks for.
//!
//! Linear layers and the MLP run on all new tokens of all sequences flattened into one matrix;
//! attention runs per sequence (see `attention`). Every step is row-independent, so a token's
//! logits are the same bits whether it is decoded alone, verified with γ drafts, or batched
//! with other sequences.

use std::ops::Range;

use candle_core::{DType, Device, Tensor};

use super::attention::{causal_attention, AttnShape};
use super::hparams::LlamaHparams;
use super::kv_cache::{KvCache, KvDtype, LayerKv};
use super::linear::{Linear, WeightsDtype};
use super::rope::RopeTable;
use super::weights::{WeightName, WeightReader};
use super::{ModelError, Result};

/// Which logits rows a sequence wants back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsRows {
    /// None (e.g. a prefill chunk that is not the prompt's last).
    None,
    /// The last new token's (prefill, plain decoding).
    Last,
    /// Every new token's (speculative verification).
    All,
}

/// One sequence's part of a batched forward.
#[derive(Clone, Copy, Debug)]
pub struct SeqInput<'a> {
    pub slot: usize,
    /// Position of `tokens[0]`; must equal the tokens already in the slot.
    pub start_pos: usize,
    pub tokens: &'a [u32],
    pub logits: LogitsRows,
}

/// Logits of a batched forward: `(rows, vocab)` with each sequence's rows contiguous.
pub struct BatchLogits {
    logits: Option<Tensor>,
    ranges: Vec<Range<usize>>,
}

impl BatchLogits {
    /// Sequence `i`'s logits as `(rows, vocab)`, or `None` if it asked for none.
    pub fn seq(&self, i: usize) -> Result<Option<Tensor>> {
        let r = self.ranges[i].clone();
        match &self.logits {
            Some(t) if !r.is_empty() => Ok(Some(t.narrow(0, r.start, r.len())?)),
            _ => Ok(None),
        }
    }

    /// Sequence `i`'s logits rows as plain vectors.
    pub fn seq_rows(&self, i: usize) -> Result<Vec<Vec<f32>>> {
        Ok(match self.seq(i)? {
            Some(t) => t.to_vec2::<f32>()?,
            None => Vec::new(),
        })
    }
}

struct Layer {
    attn_norm: Tensor,
    qkv: Linear,
    o: Linear,
    ffn_norm: Tensor,
    gate_up: Linear,
    down: Linear,
}

pub struct Llama {
    hp: LlamaHparams,
    device: Device,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Linear,
    rope: RopeTable,
    context_len: usize,
    weights_dtype: WeightsDtype,
    kv_dtype: KvDtype,
}

impl Llama {
    /// Builds the model, converting every linear weight to `weights_dtype`. `context_len` caps
    /// the positions (and so the KV cache) this instance supports.
    pub fn load(
        reader: &mut WeightReader,
        hp: LlamaHparams,
        weights_dtype: WeightsDtype,
        context_len: usize,
    ) -> Result<Self> {
        let device = reader.device().clone();
        let context_len = context_len.min(hp.max_position_embeddings).max(1);
        let embed = reader.dense_f32(WeightName::Embed)?;
        let (vocab, hidden) = embed.dims2()?;
        if vocab != hp.vocab_size || hidden != hp.hidden_size {
            return Err(ModelError::BadConfig(format!(
                "embedding is {vocab}x{hidden}, config says {}x{}",
                hp.vocab_size, hp.hidden_size
            )));
        }
        // Large vocabularies (Llama 3: 128k x 3072) would take GiBs in f32.
        let embed = if vocab * hidden > (1 << 28) {
            embed.to_dtype(DType::F16)?
        } else {
            embed
        };
        let mut layers = Vec::with_capacity(hp.num_layers);
        for l in 0..hp.num_layers {
            let qkv = vec![
                reader.raw(WeightName::Q(l))?,
                reader.raw(WeightName::K(l))?,
                reader.raw(WeightName::V(l))?,
            ];
            let gate_up = vec![
                reader.raw(WeightName::Gate(l))?,
                reader.raw(WeightName::Up(l))?,
            ];
            let layer = Layer {
                attn_norm: reader.dense_f32(WeightName::AttnNorm(l))?,
                qkv: Linear::fuse(qkv, weights_dtype, &device)?,
                o: Linear::convert(reader.raw(WeightName::O(l))?, weights_dtype, &device)?,
                ffn_norm: reader.dense_f32(WeightName::FfnNorm(l))?,
                gate_up: Linear::fuse(gate_up, weights_dtype, &device)?,
                down: Linear::convert(reader.raw(WeightName::Down(l))?, weights_dtype, &device)?,
            };
            let q_out = hp.num_heads * hp.head_dim + 2 * hp.num_kv_heads * hp.head_dim;
            if layer.qkv.out_features() != q_out
                || layer.gate_up.out_features() != 2 * hp.intermediate_size
            {
                return Err(ModelError::BadConfig(format!(
                    "layer {l} projection sizes do not match the config"
                )));
            }
            layers.push(layer);
        }
        let head_src = if reader.has(WeightName::Output) {
            WeightName::Output
        } else {
            WeightName::Embed
        };
        let lm_head = Linear::convert(reader.raw(head_src)?, weights_dtype, &device)?;
        let norm = reader.dense_f32(WeightName::OutputNorm)?;
        let rope = RopeTable::new(&hp, context_len);
        Ok(Self {
            hp,
            device,
            embed,
            layers,
            norm,
            lm_head,
            rope,
            context_len,
            weights_dtype,
            kv_dtype: KvDtype::F32,
        })
    }

    /// Sets the element type of the caches [`Llama::new_cache`] makes.
    pub fn with_kv_dtype(mut self, kv_dtype: KvDtype) -> Self {
        self.kv_dtype = kv_dtype;
        self
    }

    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    pub fn hparams(&self) -> &LlamaHparams {
        &self.hp
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn context_len(&self) -> usize {
        self.context_len
    }

    pub fn weights_dtype(&self) -> WeightsDtype {
        self.weights_dtype
    }

    /// Bytes of every linear weight (the output head included) in its ggml type: what one
    /// forward streams at least, whatever its width.
    pub fn weight_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| {
                l.qkv.weight_bytes()
                    + l.o.weight_bytes()
                    + l.gate_up.weight_bytes()
                    + l.down.weight_bytes()
            })
            .sum::<usize>()
            + self.lm_head.weight_bytes()
    }

    /// The ggml types the linear weights ended up as (after any fallback), for reporting.
    pub fn linear_dtypes(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .layers
            .iter()
            .flat_map(|l| {
                [
                    l.qkv.dtype(),
                    l.o.dtype(),
                    l.gate_up.dtype(),
                    l.down.dtype(),
                ]
            })
            .chain(std::iter::once(self.lm_head.dtype()))
            .map(|d| format!("{d:?}"))
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// A cache with `num_slots` sequence slots of up to `context_len` tokens each.
    pub fn new_cache(&self, num_slots: usize) -> KvCache {
        KvCache::new(
            self.hp.num_layers,
            self.hp.num_kv_heads * self.hp.head_dim,
            num_slots,
            self.context_len,
            self.kv_dtype,
        )
    }

    fn attn_shape(&self) -> AttnShape {
        AttnShape {
            num_heads: self.hp.num_heads,
            num_kv_heads: self.hp.num_kv_heads,
            head_dim: self.hp.head_dim,
        }
    }

    fn validate(&self, cache: &KvCache, batch: &[SeqInput]) -> Result<()> {
        if batch.is_empty() {
            return Err(ModelError::BadInput("empty batch".into()));
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
                    "slot {} holds {held} tokens but the input starts at {}; truncate_to first",
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
            if let Some(&bad) = s.tokens.iter().find(|&&t| t as usize >= self.hp.vocab_size) {
                return Err(ModelError::BadInput(format!(
                    "token id {bad} is outside the vocabulary ({})",
                    self.hp.vocab_size
                )));
            }
        }
        Ok(())
    }

    /// Runs new tokens of every sequence in `batch` through the model, appending their keys and
    /// values to the cache, and returns the logits rows each sequence asked for.
    pub fn forward(&self, cache: &mut KvCache, batch: &[SeqInput]) -> Result<BatchLogits> {
        self.validate(cache, batch)?;
        let result = self.forward_unchecked(cache, batch);
        match result {
            Ok(out) => {
                for s in batch {
                    cache.commit_len(s.slot, s.start_pos + s.tokens.len())?;
                }
                Ok(out)
            }
            Err(e) => {
                for s in batch {
                    cache.rollback_uncommitted(s.slot)?;
                }
                Err(e)
            }
        }
    }

    fn forward_unchecked(&self, cache: &mut KvCache, batch: &[SeqInput]) -> Result<BatchLogits> {
        let shape = self.attn_shape();
        let (q_dim, kv_dim) = (shape.q_dim(), shape.kv_dim());
        let row = q_dim + 2 * kv_dim;
        let hd = self.hp.head_dim;
        let eps = self.hp.rms_norm_eps as f32;
        let inter = self.hp.intermediate_size;

        let ids: Vec<u32> = batch
            .iter()
            .flat_map(|s| s.tokens.iter().copied())
            .collect();
        let total = ids.len();
        let ids_t = Tensor::from_vec(ids, total, &self.device)?;
        let mut x = self.embed.index_select(&ids_t, 0)?.to_dtype(DType::F32)?;
        let mut attn_out = vec![0f32; total * q_dim];

        for (l, layer) in self.layers.iter().enumerate() {
            let h = candle_nn::ops::rms_norm(&x, &layer.attn_norm, eps)?;
            let mut qkv: Vec<f32> = layer.qkv.forward(&h)?.flatten_all()?.to_vec1()?;
            let mut offset = 0;
            for s in batch {
                let n = s.tokens.len();
                for (i, r) in qkv[offset * row..(offset + n) * row]
                    .chunks_exact_mut(row)
                    .enumerate()
                {
                    let pos = s.start_pos + i;
                    let (q, kv) = r.split_at_mut(q_dim);
                    self.rope.apply(q, pos, hd);
                    self.rope.apply(&mut kv[..kv_dim], pos, hd);
                }
                for r in qkv[offset * row..(offset + n) * row].chunks_exact(row) {
                    cache.append_layer(
                        s.slot,
                        l,
                        &r[q_dim..q_dim + kv_dim],
                        &r[q_dim + kv_dim..],
                    )?;
                }
                offset += n;
            }
            // Queries are strided inside the fused rows; pack them once per layer.
            let q: Vec<f32> = qkv
                .chunks_exact(row)
                .flat_map(|r| &r[..q_dim])
                .copied()
                .collect();
            let mut offset = 0;
            for s in batch {
                let n = s.tokens.len();
                let (q, out) = (
                    &q[offset * q_dim..(offset + n) * q_dim],
                    &mut attn_out[offset * q_dim..(offset + n) * q_dim],
                );
                match cache.layer(s.slot, l)? {
                    LayerKv::F32 { keys, values } => {
                        causal_attention(shape, q, keys, values, s.start_pos, out)
                    }
                    LayerKv::F16 { keys, values } => {
                        causal_attention(shape, q, keys, values, s.start_pos, out)
                    }
                }
                offset += n;
            }
            let attn = Tensor::from_slice(&attn_out, (total, q_dim), &self.device)?;
            x = (x + layer.o.forward(&attn)?)?;
            let h = candle_nn::ops::rms_norm(&x, &layer.ffn_norm, eps)?;
            let gu = layer.gate_up.forward(&h)?;
            let act =
                (candle_nn::ops::silu(&gu.narrow(1, 0, inter)?)? * gu.narrow(1, inter, inter)?)?;
            x = (x + layer.down.forward(&act)?)?;
        }

        let mut rows: Vec<u32> = Vec::new();
        let mut ranges = Vec::with_capacity(batch.len());
        let mut offset = 0u32;
        for s in batch {
            let n = s.tokens.len() as u32;
            let start = rows.len();
            match s.logits {
                LogitsRows::None => {}
                LogitsRows::Last => rows.push(offset + n - 1),
                LogitsRows::All => rows.extend(offset..offset + n),
            }
            ranges.push(start..rows.len());
            offset += n;
        }
        let logits = if rows.is_empty() {
            None
        } else {
            let n = rows.len();
            let idx = Tensor::from_vec(rows, n, &self.device)?;
            let x = x.index_select(&idx, 0)?;
            let x = candle_nn::ops::rms_norm(&x, &self.norm, eps)?;
            Some(self.lm_head.forward(&x)?)
        };
        Ok(BatchLogits { logits, ranges })
    }
}
