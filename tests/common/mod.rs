//! Test support: tiny random Llama models written to disk in Hugging Face layout, and the path
//! of the real default model (whose absence fails the test: real-model tests never skip).

#![allow(dead_code)]

pub mod http;
pub mod stats;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use tandem::model::load::loader::LoadOptions;
use tandem::model::{
    BackendChoice, DeviceSpec, Kept, KvCache, Llama, LoadedModel, LogitsRows, ModelSource,
    SeqInput, WeightsDtype,
};
use tandem::sampling::SeededRng;

pub fn default_model() -> PathBuf {
    let p = tandem::model::default_model_path();
    assert!(
        p.is_file(),
        "the default model is missing at {}: run scripts/fetch-default-model",
        p.display()
    );
    p
}

/// The tokio runtime engine tests drive the engine from: two workers, like the machine's cores.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

pub fn load_default(dtype: WeightsDtype) -> LoadedModel {
    load_default_on(dtype, BackendChoice::Auto)
}

/// The default model with the forward `backend` chooses: the tensor backend on
/// `TANDEM_TEST_DEVICE` (`cpu` unless set: scripts/gpu-check sets `cuda`), the own kernels on
/// the CPU.
pub fn load_default_on(dtype: WeightsDtype, backend: BackendChoice) -> LoadedModel {
    load_default_with(&LoadOptions {
        weights_dtype: dtype,
        backend,
        ..Default::default()
    })
}

/// The default model with these options (context 1024), on the test device when the options
/// ask for the tensor backend.
pub fn load_default_with(opts: &LoadOptions) -> LoadedModel {
    let device = match opts.backend {
        BackendChoice::Candle => test_device(),
        _ => DeviceSpec::Cpu,
    };
    LoadedModel::load(
        &ModelSource::Gguf(default_model()),
        &LoadOptions {
            context_len: 1024,
            device,
            ..opts.clone()
        },
    )
    .expect("default model loads")
}

/// Where tests run the tensor backend: `TANDEM_TEST_DEVICE`, else the CPU.
pub fn test_device() -> DeviceSpec {
    std::env::var("TANDEM_TEST_DEVICE")
        .map(|d| d.parse().expect("TANDEM_TEST_DEVICE names a device"))
        .unwrap_or(DeviceSpec::Cpu)
}

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

/// A random EAGLE-3 head for `target` (MLP of `intermediate`): its draft vocabulary `ids`
/// (columns of its own output head, which start as the target's rows of those tokens where it
/// ties them to its embedding, so that some drafts stand), tapping the inputs of layers `taps`
/// (empty: the default ones).
pub fn random_eagle3_head(
    target: &Llama,
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
        rope_scaling: tandem::model::load::hparams::RopeScaling::None,
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
/// padding tokens up to `vocab`.
fn tiny_tokenizer_json(vocab: usize) -> String {
    let alphabet = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet();
    let mut chars: Vec<char> = alphabet.into_iter().collect();
    chars.sort();
    let mut v = serde_json::Map::new();
    for (i, c) in chars.iter().enumerate() {
        v.insert(c.to_string(), (i as u32).into());
    }
    let specials = ["<s>", "</s>"];
    for (j, s) in specials.iter().enumerate() {
        v.insert(s.to_string(), (256 + j as u32).into());
    }
    for i in 258..vocab {
        v.insert(format!("<pad{i}>"), (i as u32).into());
    }
    let added: Vec<serde_json::Value> = specials
        .iter()
        .enumerate()
        .map(|(j, s)| {
            serde_json::json!({"id": 256 + j, "content": s, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
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
    std::fs::write(dir.join("tokenizer.json"), tiny_tokenizer_json(spec.vocab)).unwrap();
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

/// Deterministic pseudo-random token ids below `vocab`.
pub fn random_tokens(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut rng = SeededRng::new(seed);
    (0..n)
        .map(|_| (rng.next_u64() % vocab as u64) as u32)
        .collect()
}

/// The first turns of the first `n` Spec-Bench dev questions of distinct categories, as chat
/// prompts in the model's template.
pub fn spec_bench_prompts(model: &LoadedModel, n: usize) -> Vec<Vec<u32>> {
    let data = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/spec_bench_dev.jsonl"
    ))
    .unwrap();
    let mut seen = std::collections::HashSet::new();
    let template = model.tokenizer.chat_template().unwrap();
    let prompts: Vec<Vec<u32>> = data
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|q| seen.insert(q["category"].as_str().unwrap().to_owned()))
        .take(n)
        .map(|q| {
            let chat = template
                .render(
                    &[tandem::model::ChatMessage::new(
                        "user",
                        q["turns"][0].as_str().unwrap(),
                    )],
                    true,
                )
                .unwrap();
            model.tokenizer.encode(&chat, true).unwrap()
        })
        .collect();
    assert_eq!(prompts.len(), n);
    prompts
}

/// One sequence's forward from its slot's current length; the rows asked for.
pub fn forward_rows(
    model: &Llama,
    cache: &mut KvCache,
    slot: usize,
    tokens: &[u32],
    rows: LogitsRows,
) -> Vec<Vec<f32>> {
    let start_pos = cache.len(slot).unwrap();
    model
        .forward(
            cache,
            &[SeqInput {
                slot,
                start_pos,
                tokens,
                logits: rows,
                parents: &[],
            }],
        )
        .unwrap()
        .seq_rows(0)
        .unwrap()
}

/// One forward over several sequences of different lengths == each sequence alone.
pub fn batched_equals_alone(model: &Llama, seqs: &[(Vec<u32>, Vec<u32>)]) {
    let mut cache = model.new_cache(seqs.len() * 2);
    let mut alone = Vec::new();
    let mut slots = Vec::new();
    for (prefix, new) in seqs {
        let s = cache.allocate().unwrap();
        forward_rows(model, &mut cache, s, prefix, LogitsRows::None);
        alone.push(forward_rows(model, &mut cache, s, new, LogitsRows::All));
        let t = cache.allocate().unwrap();
        forward_rows(model, &mut cache, t, prefix, LogitsRows::None);
        slots.push(t);
    }
    let inputs: Vec<SeqInput> = seqs
        .iter()
        .zip(&slots)
        .map(|((prefix, new), &slot)| SeqInput {
            slot,
            start_pos: prefix.len(),
            tokens: new,
            logits: LogitsRows::All,
            parents: &[],
        })
        .collect();
    let out = model.forward(&mut cache, &inputs).unwrap();
    for (i, want) in alone.iter().enumerate() {
        assert!(
            &out.seq_rows(i).unwrap() == want,
            "sequence {i} differs when batched"
        );
    }
}

/// A test tree over 8 input tokens: the first chain 0 → 1 → 2 → 3, a branch 0 → 4 → 5 and a
/// branch 1 → 6 → 7 (input parents, as `SeqInput::parents` takes them).
pub const TEST_TREE: [u32; 8] = [tandem::model::TREE_ROOT, 0, 1, 2, 0, 4, 1, 6];

/// Node `k`'s path from the first input token down (itself included).
pub fn tree_path(parents: &[u32], k: usize) -> Vec<usize> {
    let mut path = vec![k];
    let mut at = k;
    while at != 0 {
        at = parents[at] as usize;
        path.push(at);
    }
    path.reverse();
    path
}

/// A tree forward after `prefix` gives each node the bits of the linear forward of its path,
/// also beside another sequence in the same forward; keeping a path (`KvCache::keep`) leaves the
/// cache as feeding that path alone would (the next tokens' logits are the same bits).
/// `same` compares two rows (bitwise for the own kernels).
pub fn tree_equals_its_paths(
    model: &Llama,
    prefix: &[u32],
    tokens: &[u32],
    parents: &[u32],
    same: &dyn Fn(&[f32], &[f32]) -> bool,
) {
    let mut cache = model.new_cache(4);
    let (t, other) = (cache.allocate().unwrap(), cache.allocate().unwrap());
    forward_rows(model, &mut cache, t, prefix, LogitsRows::None);
    forward_rows(
        model,
        &mut cache,
        other,
        &prefix[..prefix.len() / 2],
        LogitsRows::None,
    );
    let other_new = &prefix[prefix.len() / 2..prefix.len() / 2 + 3];
    let out = model
        .forward(
            &mut cache,
            &[
                SeqInput {
                    slot: other,
                    start_pos: prefix.len() / 2,
                    tokens: other_new,
                    logits: LogitsRows::All,
                    parents: &[],
                },
                SeqInput {
                    slot: t,
                    start_pos: prefix.len(),
                    tokens,
                    logits: LogitsRows::All,
                    parents,
                },
            ],
        )
        .unwrap();
    let tree_rows = out.seq_rows(1).unwrap();
    assert_eq!(tree_rows.len(), tokens.len());
    assert_eq!(cache.len(t).unwrap(), prefix.len() + tokens.len());
    let lin = cache.allocate().unwrap();
    for k in 0..tokens.len() {
        let path = tree_path(parents, k);
        let path_tokens: Vec<u32> = path.iter().map(|&i| tokens[i]).collect();
        cache.copy_prefix(t, lin, prefix.len()).unwrap();
        let rows = forward_rows(model, &mut cache, lin, &path_tokens, LogitsRows::All);
        for (d, &i) in path.iter().enumerate() {
            assert!(
                same(&rows[d], &tree_rows[i]),
                "tree node {i} (on the path to {k}) differs from the linear forward of its path"
            );
        }
        cache.free(lin).unwrap();
        cache.allocate_slot(lin).unwrap();
    }
    // Keep the deepest path of the last branch, then feed three more tokens.
    let path = tree_path(parents, tokens.len() - 1);
    let path_tokens: Vec<u32> = path.iter().map(|&i| tokens[i]).collect();
    cache
        .keep(
            t,
            Kept::Path {
                start: prefix.len(),
                rows: &path,
            },
        )
        .unwrap();
    assert_eq!(cache.len(t).unwrap(), prefix.len() + path.len());
    let next = [tokens[0], tokens[1], tokens[0]];
    let after_tree = forward_rows(model, &mut cache, t, &next, LogitsRows::All);
    cache.copy_prefix(t, lin, prefix.len()).unwrap();
    forward_rows(model, &mut cache, lin, &path_tokens, LogitsRows::None);
    let after_linear = forward_rows(model, &mut cache, lin, &next, LogitsRows::All);
    for (a, b) in after_tree.iter().zip(&after_linear) {
        assert!(
            same(a, b),
            "the kept path's cache differs from feeding it linearly"
        );
    }
}
