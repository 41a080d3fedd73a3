//! Reading and writing draft heads in EAGLE's published layout: a folder with a Llama
//! `config.json` (one hidden layer) and safetensors holding
//!
//! | key | shape |
//! |---|---|
//! | `fc.weight` (`fc.bias` optional) | `(hidden, 2·hidden)` over `[embedding, feature]` |
//! | `layers.0.self_attn.{q,k,v,o}_proj.weight` | a Llama layer's |
//! | `layers.0.post_attention_layernorm.weight` | `(hidden)` |
//! | `layers.0.mlp.{gate,up,down}_proj.weight` | a Llama layer's |
//! | `tandem.token_rank` (tandem's, optional) | target ids by frequency, u32 |
//!
//! as EAGLE's `cnets.py` defines them and vLLM's and SGLang's EAGLE loaders read them (a
//! `model.` prefix on every key is accepted; `layers.0.input_layernorm.weight` and
//! `embed_tokens.weight` are ignored: layer 0 takes its input unnormed and the embedding is the
//! target's). EAGLE-3 heads (`midlayer.*`, `d2t`/`t2d`) are recognised and refused.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::HeadTensors;
use crate::model::load::hparams::LlamaHparams;
use crate::model::{ModelError, Result};

const TOKEN_RANK: &str = "tandem.token_rank";

fn key_q(k: &str) -> String {
    format!("layers.0.self_attn.{k}_proj.weight")
}

fn key_mlp(k: &str) -> String {
    format!("layers.0.mlp.{k}_proj.weight")
}

const FFN_NORM: &str = "layers.0.post_attention_layernorm.weight";

/// Reads a head folder written by [`save_head`] or published in EAGLE's layout. Every problem
/// names the key or file it is about.
pub fn load_head(dir: &Path) -> Result<HeadTensors> {
    let config_path = dir.join("config.json");
    let config = std::fs::read_to_string(&config_path).map_err(|e| ModelError::Unreadable {
        path: config_path.clone(),
        reason: e.to_string(),
    })?;
    let config: serde_json::Value = serde_json::from_str(&config)
        .map_err(|e| ModelError::BadConfig(format!("{}: {e}", config_path.display())))?;
    if let Some(n) = config.get("num_hidden_layers").and_then(|v| v.as_u64()) {
        if n != 1 {
            return Err(ModelError::Unsupported(format!(
                "head config num_hidden_layers = {n}: only one-layer heads are read"
            )));
        }
    }
    let files = crate::model::load::weights::safetensors_files(dir)?;
    let mut all: HashMap<String, Tensor> = HashMap::new();
    for f in &files {
        let tensors = candle_core::safetensors::load(f, &Device::Cpu).map_err(|e| {
            ModelError::Unreadable {
                path: f.clone(),
                reason: e.to_string(),
            }
        })?;
        for (k, t) in tensors {
            let k = k.strip_prefix("model.").map(str::to_string).unwrap_or(k);
            all.insert(k, t);
        }
    }
    if all.contains_key("d2t") || all.keys().any(|k| k.starts_with("midlayer.")) {
        return Err(ModelError::Unsupported(
            "an EAGLE-3 head (midlayer.*, d2t): tandem reads EAGLE (one layer over fc) heads"
                .into(),
        ));
    }
    let mut take = |key: &str| -> Result<Tensor> {
        let t = all.remove(key).ok_or_else(|| {
            ModelError::MissingTensor(format!("{key} in the head {}", dir.display()))
        })?;
        Ok(t.to_dtype(DType::F32)?)
    };
    let tensors = HeadTensors {
        fc: take("fc.weight")?,
        q: take(&key_q("q"))?,
        k: take(&key_q("k"))?,
        v: take(&key_q("v"))?,
        o: take(&key_q("o"))?,
        ffn_norm: take(FFN_NORM)?,
        gate: take(&key_mlp("gate"))?,
        up: take(&key_mlp("up"))?,
        down: take(&key_mlp("down"))?,
        fc_bias: all
            .remove("fc.bias")
            .map(|t| t.to_dtype(DType::F32))
            .transpose()?,
        token_rank: match all.remove(TOKEN_RANK) {
            Some(t) => t
                .to_dtype(DType::U32)
                .and_then(|t| t.to_vec1::<u32>())
                .map_err(|e| ModelError::BadConfig(format!("{TOKEN_RANK}: {e}")))?,
            None => Vec::new(),
        },
    };
    Ok(tensors)
}

/// Writes `t` as a head folder for a target of shape `target`: `config.json` and
/// `model.safetensors` in the layout [`load_head`] reads, weights in f16 (as EAGLE heads are
/// published; a head loads back as exactly the f16 values written).
pub fn save_head(dir: &Path, t: &HeadTensors, target: &LlamaHparams) -> Result<()> {
    let io = |e: std::io::Error| ModelError::Unreadable {
        path: dir.to_owned(),
        reason: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let half = |w: &Tensor| w.to_dtype(DType::F16);
    let mut map: HashMap<String, Tensor> = HashMap::new();
    map.insert("fc.weight".into(), half(&t.fc)?);
    if let Some(b) = &t.fc_bias {
        map.insert("fc.bias".into(), half(b)?);
    }
    for (k, w) in [("q", &t.q), ("k", &t.k), ("v", &t.v), ("o", &t.o)] {
        map.insert(key_q(k), half(w)?);
    }
    for (k, w) in [("gate", &t.gate), ("up", &t.up), ("down", &t.down)] {
        map.insert(key_mlp(k), half(w)?);
    }
    map.insert(FFN_NORM.into(), half(&t.ffn_norm)?);
    if !t.token_rank.is_empty() {
        let n = t.token_rank.len();
        map.insert(
            TOKEN_RANK.into(),
            Tensor::from_slice(&t.token_rank, n, &Device::Cpu)?,
        );
    }
    candle_core::safetensors::save(&map, dir.join("model.safetensors"))?;
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": target.hidden_size,
        "intermediate_size": t.gate.dim(0)?,
        "num_hidden_layers": 1,
        "num_attention_heads": target.num_heads,
        "num_key_value_heads": target.num_kv_heads,
        "head_dim": target.head_dim,
        "vocab_size": target.vocab_size,
        "rms_norm_eps": target.rms_norm_eps,
        "rope_theta": target.rope_theta,
        "max_position_embeddings": target.max_position_embeddings,
        "tie_word_embeddings": target.tie_word_embeddings,
    });
    let text = serde_json::to_string_pretty(&config).expect("a JSON value prints");
    std::fs::write(dir.join("config.json"), text).map_err(io)?;
    Ok(())
}

/// Every tensor's shape against the target's (`hp`, the head's shape), naming the first key
/// that does not fit; the token ranking must name target tokens.
pub(super) fn check_shapes(t: &HeadTensors, hp: &LlamaHparams) -> Result<()> {
    let h = hp.hidden_size;
    let (q_dim, kv_dim) = (hp.num_heads * hp.head_dim, hp.num_kv_heads * hp.head_dim);
    let inter = t.gate.dim(0).unwrap_or(0);
    let want: [(&str, &Tensor, &[usize]); 9] = [
        ("fc.weight", &t.fc, &[h, 2 * h]),
        ("layers.0.self_attn.q_proj.weight", &t.q, &[q_dim, h]),
        ("layers.0.self_attn.k_proj.weight", &t.k, &[kv_dim, h]),
        ("layers.0.self_attn.v_proj.weight", &t.v, &[kv_dim, h]),
        ("layers.0.self_attn.o_proj.weight", &t.o, &[h, q_dim]),
        (FFN_NORM, &t.ffn_norm, &[h]),
        ("layers.0.mlp.gate_proj.weight", &t.gate, &[inter, h]),
        ("layers.0.mlp.up_proj.weight", &t.up, &[inter, h]),
        ("layers.0.mlp.down_proj.weight", &t.down, &[h, inter]),
    ];
    for (key, tensor, shape) in want {
        if tensor.dims() != shape {
            return Err(ModelError::BadConfig(format!(
                "head tensor {key} is {:?}, the target (hidden size {h}) needs {shape:?}",
                tensor.dims()
            )));
        }
    }
    if let Some(b) = &t.fc_bias {
        if b.dims() != [h] {
            return Err(ModelError::BadConfig(format!(
                "head tensor fc.bias is {:?}, the target needs [{h}]",
                b.dims()
            )));
        }
    }
    if let Some(&bad) = t
        .token_rank
        .iter()
        .find(|&&id| id as usize >= hp.vocab_size)
    {
        return Err(ModelError::BadConfig(format!(
            "head tensor {TOKEN_RANK} names token {bad}, outside the target's vocabulary ({})",
            hp.vocab_size
        )));
    }
    Ok(())
}
