//! Every model family tandem runs, against an independent implementation: a tiny random
//! checkpoint per family made by Hugging Face transformers (`tests/fixtures/families/`, with
//! transformers' logits at every position), loaded from its safetensors folder and run on the
//! own kernels. Logits match transformers' within f32 rounding; the forward stays
//! batch-invariant through each family's block (sliding windows past their width included:
//! token by token, batched, token trees); greedy speculative output equals plain decoding.

mod common;

use std::path::{Path, PathBuf};

use common::{
    batched_equals_alone, forward_rows, greedy_request, plain_output, tree_equals_its_paths,
    TEST_TREE,
};
use tandem::draft::{ModelDrafter, PromptLookup, Proposer};
use tandem::engine::{generate_speculative, FixedSpeculation, Gamma};
use tandem::model::load::loader::LoadOptions;
use tandem::model::{LoadedModel, LogitsRows, ModelSource, WeightsDtype};
use tandem::sampling::Lenience;

const FAMILIES: &[&str] = &["llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3"];

struct Reference {
    ids: Vec<u32>,
    logits: Vec<Vec<f32>>,
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
    Reference { ids, logits }
}

/// The family's checkpoint in a folder of its own with the tests' tiny tokenizer beside it.
fn load(
    family: &str,
    dtype: WeightsDtype,
    max_layers: Option<usize>,
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
        let got = forward_rows(model, &mut cache, slot, &want.ids, LogitsRows::All);
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
        let want = plain_output(&target.model, &req).tokens;
        let (mut accepted, mut rejected) = (0, 0);
        for gamma in 1..=4 {
            let drafters: Vec<Box<dyn Proposer + '_>> = vec![
                Box::new(ModelDrafter::new(&draft.model, "self:1")),
                Box::new(PromptLookup::default()),
            ];
            for mut d in drafters {
                let mut cache = target.model.new_cache(1);
                let spec = FixedSpeculation {
                    gamma: Gamma::try_from(gamma).unwrap(),
                    lenience: Lenience::EXACT,
                };
                let (out, stats) = generate_speculative(
                    &target.model,
                    &mut cache,
                    d.as_mut(),
                    &req,
                    spec,
                    &mut |_| true,
                )
                .unwrap();
                assert_eq!(out.tokens, want, "{family}: {} γ={gamma}", d.name());
                accepted += stats.accepted_tokens;
                rejected += stats.draft_tokens - stats.accepted_tokens;
            }
        }
        assert!(
            accepted > 0 && rejected > 0,
            "{family}: {accepted} drafts accepted, {rejected} rejected"
        );
    }
}
