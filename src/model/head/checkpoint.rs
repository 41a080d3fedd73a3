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
//! target's). EAGLE-3 heads (`midlayer.*`, `d2t`/`t2d`) are read and written in their own
//! layout (`eagle3`).

use std::collections::HashMap;
use std::path::Path;

use candle_core::safetensors::Load;
use candle_core::{DType, Device, Tensor};

use super::{eagle3, HeadTensors};
use crate::model::spec::hparams::Hparams;
use crate::model::{ModelError, Result};

const TOKEN_RANK: &str = "tandem.token_rank";

/// Where a head's layer keeps its tensors: `layers.0.` (EAGLE) or `midlayer.` (EAGLE-3).
fn layer_prefix(eagle3: bool) -> &'static str {
    if eagle3 {
        eagle3::MID
    } else {
        "layers.0."
    }
}

fn key_q(prefix: &str, k: &str) -> String {
    format!("{prefix}self_attn.{k}_proj.weight")
}

fn key_mlp(prefix: &str, k: &str) -> String {
    format!("{prefix}mlp.{k}_proj.weight")
}

fn key_ffn_norm(prefix: &str) -> String {
    format!("{prefix}post_attention_layernorm.weight")
}

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
    let files = crate::model::load::weight_roles::safetensors_files(dir)?;
    let mut all: HashMap<String, Tensor> = HashMap::new();
    for f in &files {
        let unreadable = |reason: String| ModelError::Unreadable {
            path: f.clone(),
            reason,
        };
        let data = std::fs::read(f).map_err(|e| unreadable(e.to_string()))?;
        let file = candle_core::safetensors::SliceSafetensors::new(&data)
            .map_err(|e| unreadable(e.to_string()))?;
        for (k, view) in file.tensors() {
            let k = k.strip_prefix("model.").map(str::to_string).unwrap_or(k);
            // EAGLE-3's `t2d` is a bool tensor, which candle cannot hold; it is not read.
            if k == "t2d" {
                continue;
            }
            let t = view
                .load(&Device::Cpu)
                .map_err(|e| unreadable(format!("{k}: {e}")))?;
            all.insert(k, t);
        }
    }
    let is_eagle3 = eagle3::is_eagle3(&all);
    let parts = if is_eagle3 {
        Some(eagle3::take_parts(&config, &mut all, dir)?)
    } else {
        None
    };
    let prefix = layer_prefix(is_eagle3);
    let mut take = |key: &str| -> Result<Tensor> {
        let t = all.remove(key).ok_or_else(|| {
            ModelError::MissingTensor(format!("{key} in the head {}", dir.display()))
        })?;
        Ok(t.to_dtype(DType::F32)?)
    };
    let tensors = HeadTensors {
        fc: take("fc.weight")?,
        q: take(&key_q(prefix, "q"))?,
        k: take(&key_q(prefix, "k"))?,
        v: take(&key_q(prefix, "v"))?,
        o: take(&key_q(prefix, "o"))?,
        ffn_norm: take(&key_ffn_norm(prefix))?,
        gate: take(&key_mlp(prefix, "gate"))?,
        up: take(&key_mlp(prefix, "up"))?,
        down: take(&key_mlp(prefix, "down"))?,
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
        eagle3: parts,
    };
    Ok(tensors)
}

/// Writes `t` as a head folder for a target of shape `target`: `config.json` and
/// `model.safetensors` in the layout [`load_head`] reads, weights in f16 (as EAGLE heads are
/// published; a head loads back as exactly the f16 values written).
pub fn save_head(dir: &Path, t: &HeadTensors, target: &Hparams) -> Result<()> {
    let io = |e: std::io::Error| ModelError::Unreadable {
        path: dir.to_owned(),
        reason: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let half = |w: &Tensor| w.to_dtype(DType::F16);
    let prefix = layer_prefix(t.eagle3.is_some());
    let mut map: HashMap<String, Tensor> = HashMap::new();
    map.insert("fc.weight".into(), half(&t.fc)?);
    if let Some(b) = &t.fc_bias {
        map.insert("fc.bias".into(), half(b)?);
    }
    for (k, w) in [("q", &t.q), ("k", &t.k), ("v", &t.v), ("o", &t.o)] {
        map.insert(key_q(prefix, k), half(w)?);
    }
    for (k, w) in [("gate", &t.gate), ("up", &t.up), ("down", &t.down)] {
        map.insert(key_mlp(prefix, k), half(w)?);
    }
    map.insert(key_ffn_norm(prefix), half(&t.ffn_norm)?);
    if let Some(p) = &t.eagle3 {
        map.extend(eagle3::part_tensors(p, target.vocab_size)?);
    }
    if !t.token_rank.is_empty() {
        let n = t.token_rank.len();
        map.insert(
            TOKEN_RANK.into(),
            Tensor::from_slice(&t.token_rank, n, &Device::Cpu)?,
        );
    }
    candle_core::safetensors::save(&map, dir.join("model.safetensors"))?;
    let mut config = serde_json::json!({
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
    if let Some(p) = &t.eagle3 {
        eagle3::describe(p, &mut config)?;
    }
    let text = serde_json::to_string_pretty(&config).expect("a JSON value prints");
    std::fs::write(dir.join("config.json"), text).map_err(io)?;
    Ok(())
}

/// Every tensor's shape against the target's (`hp`, the head's shape), naming the first key
/// that does not fit; the token ranking must name target tokens.
pub(super) fn check_shapes(t: &HeadTensors, hp: &Hparams) -> Result<()> {
    let h = hp.hidden_size;
    let (q_dim, kv_dim) = (hp.num_heads * hp.head_dim, hp.num_kv_heads * hp.head_dim);
    let inter = t.gate.dim(0).unwrap_or(0);
    let e3 = t.eagle3.is_some();
    let p = layer_prefix(e3);
    // EAGLE-3: fc reads three taps, attention reads [embedding, g].
    let (fc_in, attn_in) = if e3 { (3 * h, 2 * h) } else { (2 * h, h) };
    let want: [(String, &Tensor, Vec<usize>); 9] = [
        ("fc.weight".into(), &t.fc, vec![h, fc_in]),
        (key_q(p, "q"), &t.q, vec![q_dim, attn_in]),
        (key_q(p, "k"), &t.k, vec![kv_dim, attn_in]),
        (key_q(p, "v"), &t.v, vec![kv_dim, attn_in]),
        (key_q(p, "o"), &t.o, vec![h, q_dim]),
        (key_ffn_norm(p), &t.ffn_norm, vec![h]),
        (key_mlp(p, "gate"), &t.gate, vec![inter, h]),
        (key_mlp(p, "up"), &t.up, vec![inter, h]),
        (key_mlp(p, "down"), &t.down, vec![h, inter]),
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
