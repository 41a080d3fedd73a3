//! EAGLE-3 heads as SpecForge and EAGLE's `traineagle3` write them and vLLM and SGLang serve
//! them: the head reads three of the target's layers (the residual stream entering layers 2,
//! L/2 and L-3 unless the config names others), `fc` turns their concatenation into one hidden
//! state `g`, and its one layer attends over `[input_layernorm(embed(x)), hidden_norm(g)]`
//! (twice the hidden size) with `g` itself as the residual. Its output state, before its own
//! final `norm`, is the next step's `g` (no `fc` then), and its own `lm_head` projects onto a
//! draft vocabulary of its own whose columns `d2t` maps to target ids.
//!
//! | key | shape |
//! |---|---|
//! | `fc.weight` | `(hidden, 3·hidden)` over the three taps in order |
//! | `midlayer.input_layernorm.weight`, `midlayer.hidden_norm.weight` | `(hidden)` |
//! | `midlayer.self_attn.{q,k,v}_proj.weight` | `(heads·head_dim, 2·hidden)` over `[embedding, g]` |
//! | `midlayer.self_attn.o_proj.weight` | `(hidden, heads·head_dim)` |
//! | `midlayer.post_attention_layernorm.weight`, `norm.weight` | `(hidden)` |
//! | `midlayer.mlp.{gate,up,down}_proj.weight` | a Llama layer's |
//! | `lm_head.weight` | `(draft_vocab_size, hidden)` |
//! | `d2t` | `(draft_vocab_size)` i64: draft column `i` is target token `i + d2t[i]` |
//! | `t2d` | `(vocab_size)`: which target tokens are draft tokens; written (as u8), not read (vLLM and SGLang skip it too) |
//!
//! The embedding is the target's (published heads leave it out; an `embed_tokens.weight` in the
//! file is ignored, as SGLang replaces it). RoPE is the head's own config's (`rope_theta`,
//! default 10000, and `rope_scaling`), not the target's. `eagle_config.
//! eagle_aux_hidden_state_layer_ids` names layers whose *output* is tapped, as SpecForge writes
//! and SGLang reads them (vLLM reads the same list one layer earlier; the defaults agree).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use crate::model::load::hf_config::rope_scaling_from_hf;
use crate::model::spec::rope::RopeScaling;
use crate::model::{ModelError, Result};

/// What an EAGLE-3 head has beyond an EAGLE head's tensors.
#[derive(Clone, Debug)]
pub struct Eagle3Parts {
    /// RMSNorm weights over the token embedding, over the hidden input `g`, and over the
    /// output before `lm_head`.
    pub input_norm: Tensor,
    pub hidden_norm: Tensor,
    pub final_norm: Tensor,
    /// `(draft_vocab_size, hidden)`.
    pub lm_head: Tensor,
    /// The target id of each draft column.
    pub draft_ids: Vec<u32>,
    /// Target layers whose input (the residual stream before the layer) `fc` reads, in order;
    /// empty: the default (2, L/2, L-3) of the target it drafts for.
    pub taps: Vec<usize>,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
}

pub(super) const MID: &str = "midlayer.";

/// The layer's key for a Llama layer key (`self_attn.q_proj.weight` ...).
pub(super) fn mid_key(k: &str) -> String {
    format!("{MID}{k}")
}

/// The default taps for a target of `layers` layers.
pub fn default_taps(layers: usize) -> Vec<usize> {
    vec![2.min(layers - 1), layers / 2, layers.saturating_sub(3)]
}

/// Whether the tensors of a head folder are EAGLE-3's (its layer, or its vocabulary map).
pub(super) fn is_eagle3(all: &HashMap<String, Tensor>) -> bool {
    all.contains_key("d2t") || all.keys().any(|k| k.starts_with(MID))
}

/// The EAGLE-3 parts of a head: its config's fields and the tensors only EAGLE-3 has (taken
/// out of `all`).
pub(super) fn take_parts(
    config: &serde_json::Value,
    all: &mut HashMap<String, Tensor>,
    dir: &Path,
) -> Result<Eagle3Parts> {
    let mut take = |key: &str| -> Result<Tensor> {
        let t = all.remove(key).ok_or_else(|| {
            ModelError::MissingTensor(format!("{key} in the EAGLE-3 head {}", dir.display()))
        })?;
        Ok(t.to_dtype(DType::F32)?)
    };
    let input_norm = take(&mid_key("input_layernorm.weight"))?;
    let hidden_norm = take(&mid_key("hidden_norm.weight"))?;
    let final_norm = take("norm.weight")?;
    let lm_head = take("lm_head.weight")?;
    let columns = lm_head.dim(0)?;
    if let Some(n) = config.get("draft_vocab_size").and_then(|v| v.as_u64()) {
        if n as usize != columns {
            return Err(ModelError::BadConfig(format!(
                "head config draft_vocab_size = {n}, but lm_head.weight has {columns} rows"
            )));
        }
    }
    let draft_ids: Vec<u32> = match all.remove("d2t") {
        Some(t) => {
            let offsets = t
                .to_dtype(DType::I64)
                .and_then(|t| t.to_vec1::<i64>())
                .map_err(|e| ModelError::BadConfig(format!("head tensor d2t: {e}")))?;
            if offsets.len() != columns {
                return Err(ModelError::BadConfig(format!(
                    "head tensor d2t has {} entries for {columns} lm_head.weight rows",
                    offsets.len()
                )));
            }
            offsets
                .iter()
                .enumerate()
                .map(|(i, &d)| {
                    u32::try_from(i as i64 + d).map_err(|_| {
                        ModelError::BadConfig(format!(
                            "head tensor d2t[{i}] = {d} maps draft token {i} below token 0"
                        ))
                    })
                })
                .collect::<Result<_>>()?
        }
        // A head over the whole vocabulary may leave the map out (EAGLE deletes it then).
        None => (0..columns as u32).collect(),
    };
    let taps = match config
        .get("eagle_config")
        .and_then(|c| c.get("eagle_aux_hidden_state_layer_ids"))
    {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(v) => {
            let ids: Vec<usize> = serde_json::from_value(v.clone()).map_err(|e| {
                ModelError::BadConfig(format!(
                    "head config eagle_config.eagle_aux_hidden_state_layer_ids: {e}"
                ))
            })?;
            if ids.len() != 3 {
                return Err(ModelError::BadConfig(format!(
                    "head config eagle_config.eagle_aux_hidden_state_layer_ids names {} layers; \
                     fc reads 3",
                    ids.len()
                )));
            }
            ids.into_iter().map(|i| i + 1).collect()
        }
    };
    let rope_theta = config
        .get("rope_theta")
        .and_then(|v| v.as_f64())
        .unwrap_or(10_000.0) as f32;
    let rope_scaling = match config.get("rope_scaling") {
        None | Some(serde_json::Value::Null) => RopeScaling::None,
        Some(v) => rope_scaling_from_hf(v)?,
    };
    Ok(Eagle3Parts {
        input_norm,
        hidden_norm,
        final_norm,
        lm_head,
        draft_ids,
        taps,
        rope_theta,
        rope_scaling,
    })
}

/// Every EAGLE-3 part's shape against a head of hidden size `h` drafting for a target of
/// `vocab` tokens and `layers` layers, naming the first key that does not fit.
pub(super) fn check_parts(p: &Eagle3Parts, h: usize, vocab: usize, layers: usize) -> Result<()> {
    for (key, t) in [
        (mid_key("input_layernorm.weight"), &p.input_norm),
        (mid_key("hidden_norm.weight"), &p.hidden_norm),
        ("norm.weight".to_string(), &p.final_norm),
    ] {
        if t.dims() != [h] {
            return Err(ModelError::BadConfig(format!(
                "head tensor {key} is {:?}, the target (hidden size {h}) needs [{h}]",
                t.dims()
            )));
        }
    }
    let (rows, cols) = p.lm_head.dims2()?;
    if cols != h || rows == 0 || rows > vocab {
        return Err(ModelError::BadConfig(format!(
            "head tensor lm_head.weight is [{rows}, {cols}], the target needs [1..={vocab}, {h}]"
        )));
    }
    if p.draft_ids.len() != rows {
        return Err(ModelError::BadConfig(format!(
            "head tensor d2t maps {} draft tokens for {rows} lm_head.weight rows",
            p.draft_ids.len()
        )));
    }
    let mut seen = vec![false; vocab];
    for (i, &id) in p.draft_ids.iter().enumerate() {
        let Some(s) = seen.get_mut(id as usize) else {
            return Err(ModelError::BadConfig(format!(
                "head tensor d2t maps draft token {i} to {id}, outside the target's vocabulary \
                 ({vocab})"
            )));
        };
        if std::mem::replace(s, true) {
            return Err(ModelError::BadConfig(format!(
                "head tensor d2t maps two draft tokens to target token {id}"
            )));
        }
    }
    if let Some(&bad) = p.taps.iter().find(|&&l| l >= layers) {
        return Err(ModelError::BadConfig(format!(
            "head config eagle_config.eagle_aux_hidden_state_layer_ids taps layer {bad}'s input; \
             the target has {layers} layers"
        )));
    }
    Ok(())
}

/// The config.json fields an EAGLE-3 head has beyond an EAGLE head's (its taps in the
/// output-of-layer numbering its readers share; none when it taps the default layers).
pub(super) fn describe(p: &Eagle3Parts, config: &mut serde_json::Value) -> Result<()> {
    config["architectures"] = serde_json::json!(["LlamaForCausalLMEagle3"]);
    config["draft_vocab_size"] = serde_json::json!(p.draft_ids.len());
    config["tie_word_embeddings"] = serde_json::json!(false);
    config["rope_theta"] = serde_json::json!(p.rope_theta);
    config["rope_scaling"] = match &p.rope_scaling {
        RopeScaling::None => serde_json::Value::Null,
        RopeScaling::Linear { factor } => {
            serde_json::json!({ "rope_type": "linear", "factor": factor })
        }
        RopeScaling::LongRope {
            short_factor,
            long_factor,
            original_max_position_embeddings,
            attention_factor,
        } => serde_json::json!({
            "rope_type": "longrope",
            "short_factor": short_factor,
            "long_factor": long_factor,
            "original_max_position_embeddings": original_max_position_embeddings,
            "attention_factor": attention_factor,
        }),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => serde_json::json!({
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor,
            "original_max_position_embeddings": original_max_position_embeddings,
        }),
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            attention_factor,
            truncate,
        } => serde_json::json!({
            "rope_type": "yarn",
            "factor": factor,
            "original_max_position_embeddings": original_max_position_embeddings,
            "beta_fast": beta_fast,
            "beta_slow": beta_slow,
            "attention_factor": attention_factor,
            "truncate": truncate,
        }),
    };
    if !p.taps.is_empty() {
        let ids = p
            .taps
            .iter()
            .map(|&l| {
                l.checked_sub(1).ok_or_else(|| {
                    ModelError::BadConfig(
                        "an EAGLE-3 head that taps the embedding (layer 0's input) cannot be \
                         written: eagle_aux_hidden_state_layer_ids numbers layer outputs"
                            .into(),
                    )
                })
            })
            .collect::<Result<Vec<usize>>>()?;
        config["eagle_config"] = serde_json::json!({
            "use_aux_hidden_state": true,
            "eagle_aux_hidden_state_layer_ids": ids,
        });
    }
    Ok(())
}

/// The tensors an EAGLE-3 head file holds beyond the layer's: f16 weights, `d2t` as offsets
/// and `t2d` as the set of draft tokens over the target's `vocab`.
pub(super) fn part_tensors(p: &Eagle3Parts, vocab: usize) -> Result<Vec<(String, Tensor)>> {
    let half = |w: &Tensor| w.to_dtype(DType::F16);
    let offsets: Vec<i64> = p
        .draft_ids
        .iter()
        .enumerate()
        .map(|(i, &id)| id as i64 - i as i64)
        .collect();
    let mut t2d = vec![0u8; vocab];
    for &id in &p.draft_ids {
        t2d[id as usize] = 1;
    }
    let n = offsets.len();
    Ok(vec![
        (mid_key("input_layernorm.weight"), half(&p.input_norm)?),
        (mid_key("hidden_norm.weight"), half(&p.hidden_norm)?),
        ("norm.weight".into(), half(&p.final_norm)?),
        ("lm_head.weight".into(), half(&p.lm_head)?),
        ("d2t".into(), Tensor::from_vec(offsets, n, &Device::Cpu)?),
        ("t2d".into(), Tensor::from_vec(t2d, vocab, &Device::Cpu)?),
    ])
}
