//! A draft model of another vocabulary (token-level intersection) on real models: SmolLM2-135M
//! (49,152 tokens, byte-level BPE) drafting for Gemma-3-270M (262,144, SentencePiece). The
//! translation keeps the text, and so does putting the drafter's tokens back in the target's
//! (string-level drafts); greedy speculative output equals plain decoding token for token, over
//! the shared tokens (TLI) and string-level (SLEM), in the single-request loop, in the engine
//! four at once (alone, and behind prompt lookup), and through `tandem generate`; a prompt the
//! drafter covers little starts its drafts from a lower rate than the English ones before it;
//! a pair that shares too little is refused at start-up with both models named. (Sampled
//! exactness is proven by enumeration in `draft::translation` and by the engine's chi-square
//! arm in `tests/sampled_distribution.rs`.)

use crate::common;

use std::sync::Arc;

use common::{
    complete_together, engine_request, fixed_gamma, gemma_path, greedy_request, plain_output,
};
use tandem::draft::{
    GreedyAcross, LoadedDrafter, ModelDrafter, PromptLookup, Proposer, Translation,
};
use tandem::engine::governor::CostModel;
use tandem::engine::{Engine, EngineConfig, GammaPolicy};
use tandem::model::loaded::LoadOptions;
use tandem::model::{LoadedModel, ModelSource, WeightsDtype};

fn gemma() -> LoadedModel {
    let opts = LoadOptions {
        context_len: 1024,
        ..Default::default()
    };
    LoadedModel::load(&ModelSource::Gguf(gemma_path()), &opts).expect("Gemma 3 loads")
}

fn translation(draft: &LoadedModel, target: &LoadedModel) -> Arc<Translation> {
    Arc::new(
        Translation::between(
            Arc::clone(&draft.tokenizer),
            draft.model.hparams().vocab_size,
            Arc::clone(&target.tokenizer),
            target.model.hparams().vocab_size,
        )
        .unwrap(),
    )
}

/// Texts written for this test (never the benchmark's prompts).
const TEXTS: [&str; 4] = [
    "The printing press changed Europe because",
    "Here is a short Python function that reverses a string:\n\ndef reverse(s):",
    "Q: What is the capital of France?\nA: The capital of France is",
    "Once upon a time, in a village by the sea, there lived an old fisherman who",
];

#[test]
fn the_translation_keeps_the_text_and_covers_most_of_it() {
    let target = gemma();
    let draft = common::load_default(WeightsDtype::Auto);
    let t = translation(&draft, &target);
    assert_eq!(t.shared(), 46_145);
    let coverage = t.sample_coverage().unwrap();
    assert!(coverage > 0.9, "{coverage}");
    for text in TEXTS {
        let ids = target.tokenizer.encode(text, false).unwrap();
        let own = t.translate(&ids).unwrap();
        assert_eq!(draft.tokenizer.decode(&own).unwrap(), text);
        // Token by token: a prefix's translation is a prefix of the whole's.
        let half = t.translate(&ids[..ids.len() / 2]).unwrap();
        assert_eq!(half, own[..half.len()]);
    }
}

/// String-level drafts: the drafter's tokens of a text, put back in the target's, are the
/// target's own tokens of it; a draft that ends inside a character is cut before it.
#[test]
fn the_drafters_tokens_of_a_text_become_the_targets() {
    let target = gemma();
    let draft = common::load_default(WeightsDtype::Auto);
    let t = translation(&draft, &target);
    for text in TEXTS.iter().chain(&["naïve café — 東京"]) {
        let own = draft.tokenizer.encode(text, false).unwrap();
        assert_eq!(
            t.retokenize(&own).unwrap(),
            target.tokenizer.encode(text, false).unwrap(),
            "{text}"
        );
        for k in 0..own.len() {
            let ids = t.retokenize(&own[..k]).unwrap();
            let back = target.tokenizer.decode(&ids).unwrap();
            assert!(text.starts_with(&back), "{text:?} starts with {back:?}");
        }
    }
}

#[test]
fn greedy_speculation_across_vocabularies_equals_plain_decoding() {
    for greedy in [GreedyAcross::TokenLevel, GreedyAcross::StringLevel] {
        greedy_speculation_equals_plain(greedy);
    }
}

fn greedy_speculation_equals_plain(greedy: GreedyAcross) {
    let target = gemma();
    let draft = common::load_default(WeightsDtype::Auto);
    let t = Arc::new((*translation(&draft, &target)).clone().with_greedy(greedy));
    let eos = target.tokenizer.eos_ids();
    let prompt = |text: &str| target.tokenizer.encode(text, true).unwrap();
    // The single-request loop, γ 1, 3 and 5.
    let req = greedy_request(prompt(TEXTS[0]), 40, eos);
    let (accepted, rejected) = common::speculation_equals_plain(
        &target.model,
        &mut || {
            vec![Box::new(
                ModelDrafter::new(&draft.model, "SmolLM2").with_translation(Some(Arc::clone(&t))),
            ) as Box<dyn Proposer + '_>]
        },
        &req,
        &[1, 3, 5],
    );
    assert!(
        accepted > 0 && rejected > 0,
        "{greedy:?}: {accepted} accepted, {rejected} rejected"
    );
    // The engine, four at once (one batched draft step for all, each translated apart), at a
    // fixed γ; then with prompt lookup drafting first (`draft+lookup`): lookup's copies and
    // the model's drafts mix, and the model catches up on what lookup copied.
    let target_model = Arc::new(target.model);
    let draft_model = Arc::new(draft.model);
    let reqs: Vec<_> = TEXTS
        .iter()
        .map(|text| greedy_request(prompt(text), 32, eos))
        .collect();
    let rt = common::runtime();
    for lookup in [None, Some(PromptLookup::default())] {
        let source = LoadedDrafter::Model {
            model: Arc::clone(&draft_model),
            vocab: None,
            translation: Some(Arc::clone(&t)),
            lookup,
            name: "SmolLM2".into(),
            self_layers: false,
        };
        let cfg = EngineConfig {
            max_seqs: 4,
            ..Default::default()
        };
        let engine = rt
            .block_on(Engine::start(Arc::clone(&target_model), Some(source), cfg))
            .unwrap();
        let done = complete_together(
            &rt,
            &engine,
            reqs.iter()
                .map(|r| engine_request(r.clone(), fixed_gamma(3)))
                .collect(),
        );
        let mut accepted = 0;
        for (req, c) in reqs.iter().zip(&done) {
            assert_eq!(
                c.tokens,
                plain_output(&target_model, req).tokens,
                "{greedy:?}, lookup {lookup:?}"
            );
            accepted += c.usage.speculative.accepted_tokens;
        }
        assert!(accepted > 0, "the drafter's tokens were accepted");
    }
}

/// A new request's drafts start from the pooled acceptance scaled by how much of its prompt the
/// drafter covers against the text behind that acceptance. Prices frozen (a forward of `w`
/// tokens costs `1 + 0.6·(w − 1)` ms, a draft step and a catch-up token 0.01 ms: drafting
/// pays from about 70% acceptance), so every choice follows from acceptance alone: after an
/// English request's drafts stood at a fixed γ, a German prompt, which SmolLM2 covers far
/// less of, decodes plainly (too few tokens for a probe), and another English one drafts
/// from its first round. Unscaled, the German one would start at the English one's rate.
#[test]
fn a_prompt_the_drafter_covers_little_starts_without_drafting() {
    const PER_TOKEN: f64 = 0.6;
    let target = gemma();
    let draft = common::load_default(WeightsDtype::Auto);
    let t = translation(&draft, &target);
    // Written for this test.
    let english = [
        "The months of the year, in order: January, February, March, April,",
        "The days of the week, in order: Monday, Tuesday, Wednesday,",
    ];
    let german = "Die Monate des Jahres, der Reihe nach: Januar, Februar, März, April,";
    let prompt = |text: &str| target.tokenizer.encode(text, true).unwrap();
    let cover = |text: &str| t.text_coverage(&prompt(text)).unwrap();
    for text in english {
        assert!(cover(text) > 0.9, "{}", cover(text));
    }
    assert!(cover(german) < 0.7, "{}", cover(german));
    // The beginning-of-text token is no text: it counts neither way.
    let bos = prompt(english[0])[0];
    assert!(target.tokenizer.is_special(bos));
    assert_eq!(t.text_coverage(&[bos]), None);
    let eos = target.tokenizer.eos_ids();
    let target_model = Arc::new(target.model);
    let width = EngineConfig::default().max_seqs * (EngineConfig::default().gamma_limit + 1);
    let mut costs = CostModel::new(width);
    for w in 1..=width {
        costs.record_verify(1e-3 * (1.0 + PER_TOKEN * (w - 1) as f64), w);
    }
    costs.record_draft(3e-5, (1e-5, 1), 3, 1);
    costs.record_catch_up(64e-5, 64);
    let source = LoadedDrafter::Model {
        model: Arc::new(draft.model),
        vocab: None,
        translation: Some(Arc::clone(&t)),
        lookup: None,
        name: "SmolLM2".into(),
        self_layers: false,
    };
    let cfg = EngineConfig {
        costs: Some(costs),
        ..Default::default()
    };
    let rt = common::runtime();
    let engine = rt
        .block_on(Engine::start(Arc::clone(&target_model), Some(source), cfg))
        .unwrap();
    let run = |text: &str, gamma: GammaPolicy| {
        let req = greedy_request(prompt(text), 12, eos);
        let done = rt
            .block_on(async {
                engine
                    .submit(engine_request(req.clone(), gamma))
                    .await?
                    .collect()
                    .await
            })
            .unwrap();
        assert_eq!(done.tokens, plain_output(&target_model, &req).tokens);
        done.usage.speculative
    };
    let first = run(english[0], fixed_gamma(3));
    let g = run(german, GammaPolicy::Adaptive);
    let e = run(english[1], GammaPolicy::Adaptive);
    // The pooled rate after it: 8 of 8 drafts stood.
    assert!(first.accepted_tokens > first.draft_tokens / 2, "{first:?}");
    assert_eq!(g.draft_tokens, 0, "the German prompt decodes plainly");
    assert!(e.draft_tokens > 0, "the English prompt drafts");
}

/// `tandem generate --draft-model default` on Gemma: the setup finds the vocabularies differ,
/// drafts over the shared tokens, and the output is plain decoding's.
#[test]
fn generate_drafts_for_gemma_with_the_default_model() {
    let template = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/chat-templates/gemma3.jinja"
    );
    let out = common::tandem_command()
        .args(["generate", "--model"])
        .arg(gemma_path())
        .args(["--chat-template", template, "--draft-model", "default"])
        .args([
            "--prompt",
            "Write two sentences about rivers.",
            "--max-tokens",
            "24",
        ])
        .args(["--compare", "--compare-runs", "1", "--quiet"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("46145 shared tokens"), "{stderr}");
    assert!(stderr.contains("outputs identical"), "{stderr}");
}

/// A drafter that can propose only six characters of a byte-level target's text shares too
/// little to pay: refused at start-up, saying how much it shares.
#[test]
fn a_pair_sharing_too_little_is_refused() {
    let (t, d) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let spec = |vocab| common::TinySpec {
        vocab,
        hidden: 32,
        intermediate: 64,
        layers: 1,
        heads: 2,
        kv_heads: 1,
        tied: false,
        seed: 3,
    };
    common::write_tiny_llama(t.path(), &spec(300));
    common::write_tiny_llama(d.path(), &spec(6));
    let text = format!(
        "[model]\npath = {:?}\n[speculation]\ndraft_model = {:?}\n",
        t.path().display().to_string(),
        d.path().display().to_string()
    );
    let config = tandem::config::Config::from_toml(&text).unwrap();
    let target = common::load_tiny(t.path(), WeightsDtype::F32);
    let spec = config.speculation.draft_model.clone();
    let refused = tandem::setup::load_drafter(&spec, WeightsDtype::F32, &config, &target);
    let e = refused.err().expect("refused").to_string();
    assert!(e.contains("different vocabularies"), "{e}");
    assert!(e.contains("they share 6 tokens"), "{e}");
    assert!(e.contains("at least 50%"), "{e}");
}
