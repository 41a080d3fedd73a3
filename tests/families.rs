//! Every model family tandem runs, against independent implementations: a tiny random
//! checkpoint per family made by Hugging Face transformers (`tests/fixtures/families/`, with
//! transformers' logits at every position), loaded from its safetensors folder and run on the
//! own kernels, and the same checkpoint converted to GGUF by llama.cpp's converter, against
//! llama.cpp's logits on that file. Logits match transformers' within f32 rounding and
//! llama.cpp's within its f16 arithmetic; the forward stays batch-invariant through each
//! family's block (sliding windows past their width included: token by token, batched, token
//! trees); greedy speculative output equals plain decoding, and sampled speculative output is
//! distributed as plain sampling (chi-square against the exact distribution).

use crate::common;

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file;
use common::{
    batched_equals_alone, forward_rows, greedy_request, plain_output, tree_equals_its_paths,
    TEST_TREE,
};
use tandem::draft::{LoadedDrafter, ModelDrafter, PromptLookup, Proposer};
use tandem::engine::{generate_speculative, FixedSpeculation, Gamma};
use tandem::model::decoder::expert_trace;
use tandem::model::loaded::LoadOptions;
use tandem::model::{BackendChoice, LoadedModel, LogitsRows, ModelSource, WeightsDtype};
use tandem::model::{Decoder, SeqInput};
use tandem::sampling::{probabilities, Lenience, SamplingParams};

/// The fixture folders: one per family, and Phi-3 again with the 128k variants' LongRoPE.
const FAMILIES: &[&str] = &[
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma3",
    "phi3",
    "phi3_longrope",
    "qwen3moe",
    "qwen2moe",
    "olmoe",
    "mixtral",
    "gpt_oss",
];

struct Reference {
    ids: Vec<u32>,
    logits: Vec<Vec<f32>>,
    /// A mixture's experts per layer and position, largest router probability first.
    experts: Option<Vec<Vec<Vec<u32>>>>,
}

fn fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/families/{family}"))
}

fn reference(family: &str) -> Reference {
    let text = std::fs::read_to_string(fixture(family).join("reference.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = v["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    let logits = v["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect();
    let experts =
        (!v["experts"].is_null()).then(|| serde_json::from_value(v["experts"].clone()).unwrap());
    Reference {
        ids,
        logits,
        experts,
    }
}

/// The family's checkpoint in a folder of its own with the tests' tiny tokenizer beside it.
fn load(
    family: &str,
    dtype: WeightsDtype,
    max_layers: Option<usize>,
) -> (LoadedModel, tempfile::TempDir) {
    load_on(family, dtype, max_layers, BackendChoice::Auto)
}

fn load_on(
    family: &str,
    dtype: WeightsDtype,
    max_layers: Option<usize>,
    backend: BackendChoice,
) -> (LoadedModel, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture(family).join(f), dir.path().join(f)).unwrap();
    }
    common::write_tiny_tokenizer(dir.path(), 260);
    let opts = LoadOptions {
        weights_dtype: dtype,
        context_len: 256,
        max_layers,
        backend,
        ..Default::default()
    };
    let loaded = LoadedModel::load(&ModelSource::HfDir(dir.path().to_owned()), &opts)
        .unwrap_or_else(|e| panic!("{family} loads: {e}"));
    (loaded, dir)
}

#[test]
fn logits_match_transformers_at_every_position() {
    for family in FAMILIES {
        let want = reference(family);
        let (loaded, _dir) = load(family, WeightsDtype::F32, None);
        let model = &loaded.model;
        let mut cache = model.new_cache(2);
        let slot = cache.allocate().unwrap();
        expert_trace::record(true);
        let got = forward_rows(model, &mut cache, slot, &want.ids, LogitsRows::All);
        let routes = expert_trace::take();
        expert_trace::record(false);
        match &want.experts {
            Some(experts) => {
                let ours: Vec<Vec<Vec<u32>>> = routes.into_iter().map(|r| r.rows).collect();
                assert_eq!(
                    &ours, experts,
                    "{family}: experts chosen per layer and position"
                );
            }
            None => assert!(routes.is_empty(), "{family} routes nothing"),
        }
        let mut worst = 0f32;
        for (pos, (g, w)) in got.iter().zip(&want.logits).enumerate() {
            let scale = w.iter().fold(1f32, |m, x| m.max(x.abs()));
            let diff = g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            worst = worst.max(diff / scale);
            let argmax = |r: &[f32]| (0..r.len()).max_by(|&a, &b| r[a].total_cmp(&r[b])).unwrap();
            assert!(
                diff <= 2e-5 * scale,
                "{family} position {pos}: logits differ by {diff} (largest {scale})"
            );
            assert_eq!(argmax(g), argmax(w), "{family} position {pos}: argmax");
        }
        eprintln!("{family}: largest difference {worst:.2e} of the row's largest logit");
        // Token by token, the windowed layers see only their window's keys: the same bits.
        let other = cache.allocate().unwrap();
        for (pos, &id) in want.ids.iter().enumerate() {
            let row = forward_rows(model, &mut cache, other, &[id], LogitsRows::Last);
            assert!(
                row[0] == got[pos],
                "{family} position {pos}: one token at a time"
            );
        }
    }
}

/// The 16 largest logits at each position: `(id, logit)`, largest first.
type TopLogits = Vec<Vec<(u32, f32)>>;

/// llama.cpp's ids and top logits on a family's GGUF (fixture README).
fn llama_cpp_top(family: &str) -> Option<(Vec<u32>, TopLogits)> {
    let path = fixture("llama_cpp_gguf.jsonl");
    let text = std::fs::read_to_string(path).unwrap();
    text.lines().find_map(|line| {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        (v["family"] == family).then(|| {
            let ids = v["ids"].as_array().unwrap().iter();
            let top = v["top"].as_array().unwrap().iter().map(|pos| {
                pos.as_array()
                    .unwrap()
                    .iter()
                    .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap() as f32))
                    .collect()
            });
            (
                ids.map(|x| x.as_u64().unwrap() as u32).collect(),
                top.collect(),
            )
        })
    })
}

/// Each family's GGUF, written by llama.cpp's converter: against llama.cpp's logits on the same
/// file, or (Phi-3, which llama.cpp runs without its sliding window and cannot load with the
/// stand-in vocabulary) against transformers'.
#[test]
fn gguf_files_written_by_llama_cpp_match_llama_cpp_and_transformers() {
    for family in FAMILIES {
        let path = fixture(family).join("model.gguf");
        let opts = LoadOptions {
            weights_dtype: WeightsDtype::F32,
            context_len: 256,
            ..Default::default()
        };
        let loaded = LoadedModel::load(&ModelSource::Gguf(path), &opts)
            .unwrap_or_else(|e| panic!("{family} GGUF loads: {e}"));
        let model = &loaded.model;
        assert_eq!(model.hparams().family, *family_in_gguf(family));
        let ids = reference(family).ids;
        let mut cache = model.new_cache(1);
        let slot = cache.allocate().unwrap();
        let got = forward_rows(model, &mut cache, slot, &ids, LogitsRows::All);
        match llama_cpp_top(family) {
            Some((their_ids, top)) => {
                assert_eq!(their_ids, ids);
                for (pos, (row, top)) in got.iter().zip(&top).enumerate() {
                    let scale = top.iter().fold(1f32, |m, p| m.max(p.1.abs()));
                    let diff = top
                        .iter()
                        .fold(0f32, |m, &(id, v)| m.max((row[id as usize] - v).abs()));
                    // llama.cpp multiplies f16 weights by f16-rounded activations.
                    assert!(
                        diff <= 3e-3 * scale,
                        "{family} position {pos}: {diff} from llama.cpp"
                    );
                    assert_eq!(argmax(row), top[0].0, "{family} position {pos}: top token");
                }
            }
            None => {
                for (pos, (g, w)) in got.iter().zip(&reference(family).logits).enumerate() {
                    let scale = w.iter().fold(1f32, |m, x| m.max(x.abs()));
                    let diff = g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                    assert!(
                        diff <= 2e-5 * scale,
                        "{family} position {pos}: {diff} from transformers"
                    );
                }
            }
        }
    }
}

/// GGUF files of Mistral and Mixtral are Llama files.
fn family_in_gguf(family: &str) -> &str {
    match family {
        "mistral" | "mixtral" => "llama",
        "phi3_longrope" => "phi3",
        "gpt_oss" => "gpt-oss",
        f => f,
    }
}

fn argmax(row: &[f32]) -> u32 {
    (0..row.len())
        .max_by(|&a, &b| row[a].total_cmp(&row[b]))
        .unwrap() as u32
}

/// candle's tensor backend (the GPU path, here on candle's CPU device) runs every family's
/// block: logits within f32 rounding of transformers' (a 30-token prefill attends under a
/// mask, the window's included), and greedy speculative output equal to plain decoding
/// (verification widths attend row by row, the bits of single steps).
#[test]
fn the_tensor_backend_runs_every_family() {
    for family in FAMILIES {
        let (loaded, _dir) = load_on(family, WeightsDtype::F32, None, BackendChoice::Candle);
        let model = &loaded.model;
        let want = reference(family);
        let mut cache = model.new_cache(1);
        let slot = cache.allocate().unwrap();
        let got = forward_rows(model, &mut cache, slot, &want.ids, LogitsRows::All);
        for (pos, (g, w)) in got.iter().zip(&want.logits).enumerate() {
            let scale = w.iter().fold(1f32, |m, x| m.max(x.abs()));
            let diff = g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                diff <= 2e-5 * scale,
                "{family} position {pos}: {diff} from transformers"
            );
        }
        let prompt = [&want.ids[..12], &want.ids[4..12], &want.ids[..6]].concat();
        let req = greedy_request(prompt, 24, &[]);
        let plain = plain_output(model, &req).tokens;
        for gamma in [2, 4] {
            let mut cache = model.new_cache(1);
            let spec = FixedSpeculation {
                gamma: Gamma::try_from(gamma).unwrap(),
                lenience: Lenience::EXACT,
            };
            let mut lookup = PromptLookup::default();
            let (out, _) =
                generate_speculative(model, &mut cache, &mut lookup, &req, spec, &mut |_| true)
                    .unwrap();
            assert_eq!(
                out.tokens, plain,
                "{family} γ={gamma} on the tensor backend"
            );
        }
    }
}

#[test]
fn each_family_stays_batch_invariant_past_its_window() {
    for family in FAMILIES {
        let (loaded, _dir) = load(family, WeightsDtype::F32, None);
        let ids = reference(family).ids;
        let seqs = vec![
            (ids[..9].to_vec(), ids[9..14].to_vec()),
            (ids[2..4].to_vec(), ids[4..11].to_vec()),
            (ids[..20].to_vec(), ids[20..21].to_vec()),
        ];
        batched_equals_alone(&loaded.model, &seqs);
        tree_equals_its_paths(
            &loaded.model,
            &ids[..12],
            &ids[12..20],
            &TEST_TREE,
            &|a, b| a == b,
        );
    }
}

#[test]
fn greedy_speculation_equals_plain_decoding_in_every_family() {
    for family in FAMILIES {
        let (target, _dir) = load(family, WeightsDtype::F32, None);
        let (draft, _draft_dir) = load(family, WeightsDtype::Q8_0, Some(1));
        let ids = reference(family).ids;
        let prompt = [&ids[..12], &ids[4..12], &ids[..6]].concat();
        let req = greedy_request(prompt, 40, &[]);
        let (accepted, rejected) = common::speculation_equals_plain(
            &target.model,
            &mut || {
                vec![
                    Box::new(ModelDrafter::new(&draft.model, "self:1")) as Box<dyn Proposer + '_>,
                    Box::new(PromptLookup::default()),
                ]
            },
            &req,
            &[1, 2, 3, 4],
        );
        assert!(
            accepted > 0 && rejected > 0,
            "{family}: {accepted} drafts accepted, {rejected} rejected"
        );
    }
}

/// The exact distribution of plain sampling's next token after `context`.
fn next_distribution(model: &Decoder, params: &SamplingParams, context: &[u32]) -> Vec<f32> {
    let mut cache = model.new_cache(1);
    let slot = cache.allocate().unwrap();
    let input = SeqInput {
        slot,
        start_pos: 0,
        tokens: context,
        logits: LogitsRows::Last,
        parents: &[],
    };
    let row = model
        .forward(&mut cache, &[input])
        .unwrap()
        .seq_rows(0)
        .unwrap()
        .pop()
        .unwrap();
    let mut probs = Vec::new();
    probabilities(&row, params, &mut probs).unwrap();
    probs
}

/// Sampled speculation with the family's own first layer drafting (γ = 3, top-3 sampling so
/// the first three tokens have 27 outcomes) against the exact distribution of plain sampling:
/// 2,000 seeded requests a family, p ≥ 1e-3 / 6 each (a false alarm at most once in a
/// thousand runs of the whole test).
#[test]
fn sampled_speculation_is_plain_sampling_in_every_family() {
    const N: u64 = 2000;
    let threshold = 1e-3 / FAMILIES.len() as f64;
    for family in FAMILIES {
        let (target, _dir) = load(family, WeightsDtype::F32, None);
        let (draft, _draft_dir) = load(family, WeightsDtype::F32, Some(1));
        let (target, draft) = (&target.model, &draft.model);
        // Tied heads of random weights give logits tens apart: a warmer temperature keeps
        // more than one outcome likely.
        let temperature = if matches!(*family, "gemma3" | "qwen3") {
            6.0
        } else {
            1.0
        };
        let params = SamplingParams {
            temperature,
            top_k: 3,
            ..Default::default()
        };
        let prompt = reference(family).ids[..8].to_vec();
        let mut exact = std::collections::BTreeMap::new();
        let p1 = next_distribution(target, &params, &prompt);
        for (a, &pa) in p1.iter().enumerate().filter(|(_, &p)| p > 0.0) {
            let ctx = [&prompt[..], &[a as u32]].concat();
            let p2 = next_distribution(target, &params, &ctx);
            for (b, &pb) in p2.iter().enumerate().filter(|(_, &p)| p > 0.0) {
                let ctx = [&ctx[..], &[b as u32]].concat();
                let p3 = next_distribution(target, &params, &ctx);
                for (c, &pc) in p3.iter().enumerate().filter(|(_, &p)| p > 0.0) {
                    exact.insert([a as u32, b as u32, c as u32], f64::from(pa * pb * pc));
                }
            }
        }
        let mut counts = std::collections::BTreeMap::new();
        let (mut accepted, mut drafted) = (0, 0);
        let mut cache = target.new_cache(1);
        let spec = FixedSpeculation {
            gamma: Gamma::try_from(3).unwrap(),
            lenience: Lenience::EXACT,
        };
        for seed in 0..N {
            let sampling = SamplingParams {
                seed: Some(seed),
                ..params.clone()
            };
            let req = common::generation_request(prompt.clone(), 5, sampling, &[]);
            let mut drafter = ModelDrafter::new(draft, "self:1");
            let (out, stats) =
                generate_speculative(target, &mut cache, &mut drafter, &req, spec, &mut |_| true)
                    .unwrap();
            *counts
                .entry([out.tokens[0], out.tokens[1], out.tokens[2]])
                .or_insert(0u64) += 1;
            accepted += stats.accepted_tokens;
            drafted += stats.draft_tokens;
        }
        let fit = common::stats::goodness_of_fit(&counts, &exact);
        eprintln!(
            "{family}: {} outcomes, chi-square {:.1}, df {}, p {:.2e}; {accepted}/{drafted} drafts accepted",
            exact.len(),
            fit.statistic,
            fit.df,
            fit.p_value
        );
        assert!(
            fit.impossible.is_empty(),
            "{family}: impossible outcomes {:?}",
            fit.impossible
        );
        assert!(fit.p_value >= threshold, "{family}: {fit:?}");
        assert!(
            fit.df >= 3,
            "{family}: too few likely outcomes to test ({fit:?})"
        );
        assert!(
            accepted > 0 && accepted < drafted,
            "{family}: {accepted}/{drafted} accepted"
        );
    }
}

/// The engine with each family as the target: a draft head (EAGLE, a Llama layer over the
/// target's own features and embeddings, Gemma's scaled ones included) and the family's own
/// first layer as a draft model, 4 requests at once, greedy output equal to plain decoding.
#[test]
fn the_engine_drafts_for_every_family_with_a_head_and_a_draft_model() {
    use std::sync::Arc;
    use tandem::engine::{Engine, EngineConfig};
    use tandem::model::head::train::random_head;
    use tandem::model::head::DraftHead;
    let rt = common::runtime();
    for family in FAMILIES {
        let (target, _dir) = load(family, WeightsDtype::F32, None);
        let (draft, _draft_dir) = load(family, WeightsDtype::F32, Some(1));
        let target = Arc::new(target.model);
        let ids = reference(family).ids;
        let prompts: Vec<Vec<u32>> = (0..4).map(|i| ids[i..i + 10].to_vec()).collect();
        let want: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| plain_output(&target, &greedy_request(p.clone(), 16, &[])).tokens)
            .collect();
        let head = DraftHead::new(
            random_head(target.hparams(), 64, 5).unwrap(),
            &target,
            WeightsDtype::F32,
            0,
        )
        .unwrap();
        let sources = [
            LoadedDrafter::Head {
                head: Arc::new(head),
                name: "head".into(),
                lookup: None,
            },
            LoadedDrafter::Model {
                model: Arc::new(draft.model),
                vocab: None,
                translation: None,
                lookup: None,
                name: "self:1".into(),
                self_layers: false,
            },
        ];
        for source in sources {
            let cfg = EngineConfig {
                max_seqs: 4,
                target_threads: 1,
                draft_threads: 1,
                ..Default::default()
            };
            let engine = rt
                .block_on(Engine::start(Arc::clone(&target), Some(source), cfg))
                .unwrap();
            let reqs = prompts
                .iter()
                .map(|p| {
                    common::engine_request(
                        greedy_request(p.clone(), 16, &[]),
                        common::fixed_gamma(3),
                    )
                })
                .collect();
            let done = common::complete_together(&rt, &engine, reqs);
            let drafted: usize = done.iter().map(|c| c.usage.speculative.draft_tokens).sum();
            assert!(drafted > 0, "{family}: nothing drafted");
            let got: Vec<Vec<u32>> = done.into_iter().map(|c| c.tokens).collect();
            assert_eq!(got, want, "{family}");
        }
    }
}

/// The engine's target worker counts the distinct experts each routed layer of a forward read
/// (what the governor prices a mixture's verification by): a step reads its row's experts,
/// rows of one token repeated read no more, varied rows read more; a dense model's forwards
/// count none.
#[test]
fn the_target_worker_counts_the_experts_each_forward_reads() {
    use std::sync::Arc;
    use tandem::engine::verifier::Verifier;
    let rt = common::runtime();
    for family in ["qwen3moe", "mixtral", "llama"] {
        let (loaded, _dir) = load(family, WeightsDtype::F32, None);
        let h = loaded.model.hparams().clone();
        let verifier = Verifier::new(Arc::new(loaded.model), 1, 1, None, 0).unwrap();
        let apart = rt
            .block_on(verifier.calibrate(0, vec![1, 5], (32, 1), false))
            .unwrap();
        let alike = rt
            .block_on(verifier.calibrate(0, vec![5], (32, 1), true))
            .unwrap();
        let Some(e) = h.experts else {
            assert!(apart.iter().chain(&alike).all(|t| t.reads.is_empty()));
            continue;
        };
        for t in apart.iter().chain(&alike) {
            assert_eq!(t.reads.len(), h.num_layers, "{family}: one count a layer");
        }
        let all_used = |reads: &[u16]| reads.iter().all(|&r| r as usize == e.used);
        assert!(all_used(&apart[0].reads), "{family}: {:?}", apart[0].reads);
        assert!(all_used(&alike[0].reads), "{family}: {:?}", alike[0].reads);
        let most = e.count.min(5 * e.used);
        assert!(
            apart[1]
                .reads
                .iter()
                .all(|&r| (e.used..=most).contains(&(r as usize)))
                && apart[1].reads.iter().any(|&r| r as usize > e.used),
            "{family}: {:?}",
            apart[1].reads
        );
    }
}

/// Start-up's depth rounds (`Verifier::time_depths`): every width timed at both depths in each
/// round, the deep context as deep as the cache holds beside the widest forward, and the slot
/// free again afterwards.
#[test]
fn depth_rounds_time_every_width_at_both_depths_and_free_their_slot() {
    use std::sync::Arc;
    use tandem::engine::verifier::Verifier;
    let rt = common::runtime();
    let (loaded, _dir) = load("llama", WeightsDtype::F32, None);
    let verifier = Verifier::new(Arc::new(loaded.model), 1, 1, None, 0).unwrap();
    for _ in 0..2 {
        let rounds = rt
            .block_on(verifier.time_depths(0, vec![1, 3], (8, 100_000), 3))
            .unwrap();
        assert_eq!(rounds.len(), 3);
        for r in &rounds {
            let at = |timed: &[tandem::engine::verifier::TimedForward]| {
                assert!(timed
                    .iter()
                    .all(|t| t.seconds.is_finite() && t.seconds > 0.0));
                let widths: Vec<usize> = timed.iter().map(|t| t.width).collect();
                let depths: Vec<usize> = timed.iter().map(|t| t.depth).collect();
                (widths, depths)
            };
            // A 256-token context beside a 3-token forward: 252 deep.
            assert_eq!(at(&r.shallow), (vec![1, 3], vec![8, 8]));
            assert_eq!(at(&r.deep), (vec![1, 3], vec![252, 252]));
        }
    }
    let after = rt
        .block_on(verifier.calibrate(0, vec![2], (32, 1), false))
        .unwrap();
    assert_eq!((after[0].width, after[0].depth), (2, 32));
}

/// A mixture's rows grouped by expert: a row's bits are the same alone, among rows that share
/// its experts, and on every weight type the own kernels run (f16, Q8_0, Q4_0 here).
#[test]
fn mixtures_give_a_row_the_same_bits_in_any_company() {
    for family in ["qwen3moe", "qwen2moe", "olmoe", "mixtral", "gpt_oss"] {
        for dtype in [WeightsDtype::F16, WeightsDtype::Q8_0, WeightsDtype::Q4_0] {
            let (loaded, _dir) = load(family, dtype, None);
            let ids = reference(family).ids;
            let seqs = vec![
                (ids[..9].to_vec(), ids[9..14].to_vec()),
                (ids[2..4].to_vec(), ids[4..11].to_vec()),
                (ids[..20].to_vec(), ids[20..21].to_vec()),
            ];
            expert_trace::record(true);
            batched_equals_alone(&loaded.model, &seqs);
            let routes = expert_trace::take();
            expert_trace::record(false);
            // Some forward had rows sharing an expert: the grouping was exercised.
            assert!(
                routes
                    .iter()
                    .any(|r| r.distinct() < r.rows.iter().map(Vec::len).sum::<usize>()),
                "{family} {dtype:?}: no expert was shared"
            );
        }
    }
}

/// gpt-oss's experts as llama.cpp quantizes them (`MXFP4_MOE`: MXFP4 experts, Q8_0
/// projections), read as the file states them: in f32, the logits and experts of
/// transformers' forward of the file's dequantized weights (`reference-mxfp4.json`); as the
/// file's types, the experts as Q5_0 on the own 5-bit kernel; a file cut short inside its MXFP4 blocks
/// refused as truncated.
#[test]
fn mxfp4_experts_are_read_exactly_as_the_file_states_them() {
    let path = fixture("gpt_oss").join("model-mxfp4.gguf");
    let text = std::fs::read_to_string(fixture("gpt_oss").join("reference-mxfp4.json")).unwrap();
    let want: serde_json::Value = serde_json::from_str(&text).unwrap();
    let want_logits: Vec<Vec<f32>> = serde_json::from_value(want["logits"].clone()).unwrap();
    let want_experts: Vec<Vec<Vec<u32>>> = serde_json::from_value(want["experts"].clone()).unwrap();
    let ids = reference("gpt_oss").ids;
    for dtype in [WeightsDtype::F32, WeightsDtype::Auto] {
        let opts = LoadOptions {
            weights_dtype: dtype,
            context_len: 256,
            ..Default::default()
        };
        let loaded = LoadedModel::load(&ModelSource::Gguf(path.clone()), &opts)
            .unwrap_or_else(|e| panic!("the MXFP4 file loads: {e}"));
        let model = &loaded.model;
        let mut cache = model.new_cache(1);
        let slot = cache.allocate().unwrap();
        expert_trace::record(true);
        let got = forward_rows(model, &mut cache, slot, &ids, LogitsRows::All);
        let routes: Vec<Vec<Vec<u32>>> = expert_trace::take().into_iter().map(|r| r.rows).collect();
        expert_trace::record(false);
        if dtype == WeightsDtype::Auto {
            assert_eq!(model.linear_dtypes(), ["F32", "Q5_0", "Q8_0"]);
            // Activations rounded to 8 bits on the way into every matmul: close, not exact.
            for (pos, (g, w)) in got.iter().zip(&want_logits).enumerate() {
                let diff = g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                assert!(diff < 0.2, "position {pos}: {diff} from the f32 forward");
            }
            continue;
        }
        assert_eq!(
            routes, want_experts,
            "experts chosen per layer and position"
        );
        for (pos, (g, w)) in got.iter().zip(&want_logits).enumerate() {
            let scale = w.iter().fold(1f32, |m, x| m.max(x.abs()));
            let diff = g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                diff <= 2e-5 * scale,
                "position {pos}: {diff} from transformers"
            );
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("cut.gguf");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).unwrap();
    let err = load_error(cut);
    assert!(err.contains("truncated"), "{err}");
}

/// The Qwen3-MoE fixture's GGUF rewritten: `edit` changes its metadata and tensors.
fn edited_moe_gguf(
    dir: &Path,
    edit: impl Fn(
        &mut Vec<(String, gguf_file::Value)>,
        &mut Vec<(String, candle_core::quantized::QTensor)>,
    ),
) -> PathBuf {
    let src = fixture("qwen3moe").join("model.gguf");
    let mut file = std::fs::File::open(&src).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let mut md: Vec<(String, gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut ts: Vec<(String, candle_core::quantized::QTensor)> = content
        .tensor_infos
        .keys()
        .map(|k| {
            let t = content
                .tensor(&mut file, k, &candle_core::Device::Cpu)
                .unwrap();
            (k.clone(), t)
        })
        .collect();
    edit(&mut md, &mut ts);
    let path = dir.join("edited.gguf");
    let mut out = std::fs::File::create(&path).unwrap();
    let md_refs: Vec<(&str, &gguf_file::Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts_refs: Vec<(&str, &candle_core::quantized::QTensor)> =
        ts.iter().map(|(k, t)| (k.as_str(), t)).collect();
    gguf_file::write(&mut out, &md_refs, &ts_refs).unwrap();
    path
}

fn load_error(path: PathBuf) -> String {
    let opts = LoadOptions {
        weights_dtype: WeightsDtype::F32,
        context_len: 64,
        ..Default::default()
    };
    match LoadedModel::load(&ModelSource::Gguf(path), &opts) {
        Ok(_) => panic!("the edited file loaded"),
        Err(e) => e.to_string(),
    }
}

type Metadata = Vec<(String, gguf_file::Value)>;
type Tensors = Vec<(String, candle_core::quantized::QTensor)>;
type Edit = Box<dyn Fn(&mut Metadata, &mut Tensors)>;

fn edit(f: impl Fn(&mut Metadata, &mut Tensors) + 'static) -> Edit {
    Box::new(f)
}

/// The Qwen3-MoE file's metadata as architecture `arch` states it.
fn as_architecture(md: &mut Metadata, arch: &str) {
    for (k, v) in md.iter_mut() {
        if let Some(rest) = k.strip_prefix("qwen3moe.") {
            *k = format!("{arch}.{rest}");
        }
        if k == "general.architecture" {
            *v = gguf_file::Value::String(arch.into());
        }
    }
}

fn set(md: &mut [(String, gguf_file::Value)], key: &str, value: gguf_file::Value) {
    md.iter_mut().find(|(k, _)| k == key).unwrap().1 = value;
}

/// Mixture files a model server could be handed by mistake or malice: each refused before a
/// forward, the message naming what is wrong rather than a missing tensor or a panic.
#[test]
fn mixture_files_we_cannot_run_are_refused_by_name() {
    use gguf_file::Value;
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "more experts used than there are",
            edit(|md, _| set(md, "qwen3moe.expert_used_count", Value::U32(9))),
            "9 used of 8",
        ),
        (
            "an absurd expert count",
            edit(|md, _| set(md, "qwen3moe.expert_count", Value::U32(1 << 30))),
            "experts per layer",
        ),
        (
            "a sigmoid router",
            edit(|md, _| {
                md.push(("qwen3moe.expert_gating_func".into(), Value::U32(2)));
            }),
            "expert_gating_func",
        ),
        (
            "a shared expert in a family without one",
            edit(|md, _| {
                md.push((
                    "qwen3moe.expert_shared_feed_forward_length".into(),
                    Value::U32(48),
                ));
            }),
            "a shared expert in a 'qwen3moe' model",
        ),
        (
            "more than one shared expert",
            edit(|md, _| {
                md.push(("qwen3moe.expert_shared_count".into(), Value::U32(2)));
            }),
            "at most one shared expert",
        ),
        (
            "experts in a dense family",
            edit(|md, _| as_architecture(md, "qwen3")),
            "a mixture of 8 experts in a 'qwen3' model",
        ),
        (
            "a mixture family we do not run",
            edit(|md, _| as_architecture(md, "deepseek2")),
            "'deepseek2' (a mixture of experts tandem does not run yet)",
        ),
        (
            "a stacked expert tensor of the wrong count",
            edit(|md, _| set(md, "qwen3moe.expert_count", Value::U32(4))),
            "8 experts of 32x64",
        ),
        (
            "no expert tensors",
            edit(|_, ts| ts.retain(|(k, _)| !k.contains("_exps"))),
            "blk.0.ffn_gate_exps.weight",
        ),
    ];
    for (what, edit, want) in cases {
        let err = load_error(edited_moe_gguf(dir.path(), edit));
        assert!(err.contains(want), "{what}: {err}");
    }
}
