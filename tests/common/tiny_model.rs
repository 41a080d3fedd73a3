//! Tiny random Llama models written to disk in Hugging Face layout (and random EAGLE-3 heads
//! for them): models small enough to run every drafter and γ in a debug build, with weights
//! from a seed so every run sees the same ones.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use tandem::model::loaded::LoadOptions;
use tandem::model::{BackendChoice, Decoder, LoadedModel, ModelSource, WeightsDtype};
use tandem::sampling::SeededRng;

/// Shape of a tiny Llama-3.2-style model: GQA, llama3 rope scaling, tied embeddings.
pub struct TinySpec {
    pub vocab: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub tied: bool,
    pub seed: u64,
}

impl Default for TinySpec {
    fn default() -> Self {
        Self {
            vocab: 260,
            hidden: 64,
            intermediate: 128,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            tied: true,
            seed: 7,
        }
    }
}

impl TinySpec {
    /// The default shape with an output head of its own, its weights from `seed`.
    pub fn untied(seed: u64) -> Self {
        Self {
            tied: false,
            seed,
            ..Default::default()
        }
    }
}

/// A random EAGLE-3 head for `target` (MLP of `intermediate`): its draft vocabulary `ids`
/// (columns of its own output head, which start as the target's rows of those tokens where it
/// ties them to its embedding, so that some drafts stand), tapping the inputs of layers `taps`
/// (empty: the default ones).
pub fn random_eagle3_head(
    target: &Decoder,
    intermediate: usize,
    seed: u64,
    ids: Vec<u32>,
    taps: Vec<usize>,
) -> tandem::model::head::HeadTensors {
    let hp = target.hparams();
    let (h, q_dim, kv_dim) = (
        hp.hidden_size,
        hp.num_heads * hp.head_dim,
        hp.num_kv_heads * hp.head_dim,
    );
    let mut rng = SeededRng::new(seed);
    let mut t = tandem::model::head::train::random_head(hp, intermediate, seed).unwrap();
    let mut uniform =
        |rows: usize, cols: usize| random(&mut rng, &[rows, cols], 1.0 / (cols as f32).sqrt());
    t.fc = uniform(h, 3 * h);
    t.q = uniform(q_dim, 2 * h);
    t.k = uniform(kv_dim, 2 * h);
    t.v = uniform(kv_dim, 2 * h);
    // (A target with an output head of its own has no rows to lend: random ones then.)
    let lm_head = target
        .output_rows(&ids)
        .unwrap_or_else(|_| uniform(ids.len(), h));
    let mut norm = || (random(&mut rng, &[h], 0.2) + 1.0).unwrap();
    t.ffn_norm = norm();
    t.eagle3 = Some(tandem::model::head::Eagle3Parts {
        input_norm: norm(),
        hidden_norm: norm(),
        final_norm: norm(),
        lm_head,
        draft_ids: ids,
        taps,
        rope_theta: 10_000.0,
        rope_scaling: tandem::model::spec::hparams::RopeScaling::None,
    });
    t
}

fn random(rng: &mut SeededRng, shape: &[usize], scale: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|_| (rng.next_f64() as f32 * 2.0 - 1.0) * scale)
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

/// A byte-level BPE tokenizer.json with no merges: 256 byte tokens, then `<s>` and `</s>`, then
/// padding tokens up to `vocab`; each pair of `swaps` trades its two byte tokens' ids.
fn tiny_tokenizer_json(vocab: usize, swaps: &[(usize, usize)]) -> String {
    byte_level_tokenizer_json(vocab, swaps, &[("<s>", true), ("</s>", true)])
}

/// A byte-level BPE tokenizer.json with no merges: 256 byte tokens (each pair of `swaps`
/// trading ids), then the `added` tokens (text, whether special) from id 256, then padding
/// tokens up to `vocab`.
pub fn byte_level_tokenizer_json(
    vocab: usize,
    swaps: &[(usize, usize)],
    added: &[(&str, bool)],
) -> String {
    let alphabet = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet();
    let mut chars: Vec<char> = alphabet.into_iter().collect();
    chars.sort();
    for &(a, b) in swaps {
        chars.swap(a, b);
    }
    let mut v = serde_json::Map::new();
    for (i, c) in chars.iter().enumerate() {
        v.insert(c.to_string(), (i as u32).into());
    }
    for (j, (s, _)) in added.iter().enumerate() {
        v.insert(s.to_string(), (256 + j as u32).into());
    }
    for i in 256 + added.len()..vocab {
        v.insert(format!("<pad{i}>"), (i as u32).into());
    }
    let added: Vec<serde_json::Value> = added
        .iter()
        .enumerate()
        .map(|(j, (s, special))| {
            serde_json::json!({"id": 256 + j, "content": s, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": special})
        })
        .collect();
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": v, "merges": []}
    })
    .to_string()
}

/// Writes the tiny byte-level tokenizer (`vocab` ids) into a model folder.
pub fn write_tiny_tokenizer(dir: &Path, vocab: usize) {
    std::fs::write(dir.join("tokenizer.json"), tiny_tokenizer_json(vocab, &[])).unwrap();
}

/// Writes a tiny tokenizer of another vocabulary: the byte tokens of each pair of `swaps`
/// trade ids, so a model whose rows stop between them has tokens the other lacks.
pub fn write_tiny_tokenizer_swapped(dir: &Path, vocab: usize, swaps: &[(usize, usize)]) {
    std::fs::write(
        dir.join("tokenizer.json"),
        tiny_tokenizer_json(vocab, swaps),
    )
    .unwrap();
}

/// Writes config.json, model.safetensors, tokenizer.json and tokenizer_config.json to `dir`.
pub fn write_tiny_llama(dir: &Path, spec: &TinySpec) {
    std::fs::create_dir_all(dir).unwrap();
    let head_dim = spec.hidden / spec.heads;
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": spec.vocab,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.intermediate,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        "max_position_embeddings": 512,
        "tie_word_embeddings": spec.tied,
        "bos_token_id": 256,
        "eos_token_id": 257,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut rng = SeededRng::new(spec.seed);
    let mut t: HashMap<String, Tensor> = HashMap::new();
    let s_in = 1.0 / (spec.hidden as f32).sqrt();
    t.insert(
        "model.embed_tokens.weight".into(),
        random(&mut rng, &[spec.vocab, spec.hidden], 1.0),
    );
    for l in 0..spec.layers {
        let p = format!("model.layers.{l}");
        let ones_ish = |rng: &mut SeededRng| (random(rng, &[spec.hidden], 0.2) + 1.0).unwrap();
        t.insert(format!("{p}.input_layernorm.weight"), ones_ish(&mut rng));
        t.insert(
            format!("{p}.post_attention_layernorm.weight"),
            ones_ish(&mut rng),
        );
        t.insert(
            format!("{p}.self_attn.q_proj.weight"),
            random(&mut rng, &[spec.heads * head_dim, spec.hidden], s_in * 2.0),
        );
        t.insert(
            format!("{p}.self_attn.k_proj.weight"),
            random(
                &mut rng,
                &[spec.kv_heads * head_dim, spec.hidden],
                s_in * 2.0,
            ),
        );
        t.insert(
            format!("{p}.self_attn.v_proj.weight"),
            random(&mut rng, &[spec.kv_heads * head_dim, spec.hidden], s_in),
        );
        t.insert(
            format!("{p}.self_attn.o_proj.weight"),
            random(&mut rng, &[spec.hidden, spec.heads * head_dim], s_in),
        );
        t.insert(
            format!("{p}.mlp.gate_proj.weight"),
            random(&mut rng, &[spec.intermediate, spec.hidden], s_in),
        );
        t.insert(
            format!("{p}.mlp.up_proj.weight"),
            random(&mut rng, &[spec.intermediate, spec.hidden], s_in),
        );
        t.insert(
            format!("{p}.mlp.down_proj.weight"),
            random(
                &mut rng,
                &[spec.hidden, spec.intermediate],
                1.0 / (spec.intermediate as f32).sqrt(),
            ),
        );
    }
    t.insert(
        "model.norm.weight".into(),
        (random(&mut rng, &[spec.hidden], 0.2) + 1.0).unwrap(),
    );
    if !spec.tied {
        t.insert(
            "lm_head.weight".into(),
            random(&mut rng, &[spec.vocab, spec.hidden], s_in * 4.0),
        );
    }
    candle_core::safetensors::save(&t, dir.join("model.safetensors")).unwrap();
    std::fs::write(
        dir.join("tokenizer.json"),
        tiny_tokenizer_json(spec.vocab, &[]),
    )
    .unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::json!({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": true})
            .to_string(),
    )
    .unwrap();
}

/// Writes to `out` the tiny model in `target` with every weight moved `mix` of the way towards
/// those of the random model `other` (same shape): a drafter that agrees with the target some
/// of the time, as a real draft model does, where independent random weights almost never do.
pub fn write_tiny_blend(target: &Path, other: &TinySpec, mix: f32, out: &Path) {
    let other_dir = tempfile::tempdir().unwrap();
    write_tiny_llama(other_dir.path(), other);
    write_tiny_llama(out, other);
    let dev = Device::Cpu;
    let a = candle_core::safetensors::load(target.join("model.safetensors"), &dev).unwrap();
    let b =
        candle_core::safetensors::load(other_dir.path().join("model.safetensors"), &dev).unwrap();
    let blended: HashMap<String, Tensor> = a
        .iter()
        .map(|(name, w)| {
            let mixed =
                ((w * (1.0 - mix as f64)).unwrap() + (&b[name] * mix as f64).unwrap()).unwrap();
            (name.clone(), mixed)
        })
        .collect();
    candle_core::safetensors::save(&blended, out.join("model.safetensors")).unwrap();
}

pub fn load_tiny(dir: &Path, dtype: WeightsDtype) -> LoadedModel {
    load_tiny_on(dir, dtype, BackendChoice::Auto)
}

/// A tiny model on the CPU with the forward `backend` chooses.
pub fn load_tiny_on(dir: &Path, dtype: WeightsDtype, backend: BackendChoice) -> LoadedModel {
    LoadedModel::load(
        &ModelSource::HfDir(dir.to_owned()),
        &LoadOptions {
            weights_dtype: dtype,
            context_len: 256,
            backend,
            ..Default::default()
        },
    )
    .expect("tiny model loads")
}
