//! Draft heads (EAGLE, EAGLE-3): a head saved in EAGLE's or EAGLE-3's layout loads back as
//! exactly what was written; a malformed head is refused at load with the key named; an
//! EAGLE-3 head computes the published forward; the engine drafting with a head
//! (chains and trees, 1 and 4 requests at once, pipelining asked for or not) gives exactly
//! plain greedy decoding; a draft model's reduced draft vocabulary confines its drafts; and
//! `train-head`'s training on the tiny model's own answers lowers
//! its held-out loss and raises its acceptance over the untrained head. (Sampled output with a
//! head: `tests/sampled_distribution.rs`.)

use crate::common;

use std::sync::{Arc, OnceLock};

use candle_core::{DType, Device, Tensor};
use common::{
    complete_together, engine_request, fixed_gamma, greedy_request, one_at_a_time, plain_output,
};
use tandem::draft::LoadedDrafter;
use tandem::draft::PromptLookup;
use tandem::engine::{
    Completion, Engine, EngineConfig, EngineRequest, GammaPolicy, RequestSpeculation,
    SpeculationStats, TreeNodes,
};
use tandem::model::head::train::{random_head, TrainSettings};
use tandem::model::head::{load_head, save_head, DraftHead, HeadTensors};
use tandem::model::{Decoder, FeatureTaps, Kept, WeightsDtype};
use tandem::sampling::SamplingParams;
use tandem::train::{answer_jobs, answer_prompts, train_head, Answer, TrainOptions};

/// The tiny target (its folder kept alive with it).
fn target() -> &'static (tempfile::TempDir, Arc<Decoder>) {
    static T: OnceLock<(tempfile::TempDir, Arc<Decoder>)> = OnceLock::new();
    T.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        common::write_tiny_llama(dir.path(), &common::TinySpec::default());
        let model = Arc::new(common::load_tiny(dir.path(), WeightsDtype::F32).model);
        (dir, model)
    })
}

/// One runtime for every engine of the file (an engine's actors live on the runtime that
/// started it).
fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(common::runtime)
}

/// Prompts with repeats (the tiny model's answers to them are what the head learns).
fn prompts(n: usize, seed: u64) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| {
            let a = common::random_tokens(seed + i as u64, 4 + i % 9, 256);
            [a.clone(), a].concat()
        })
        .collect()
}

/// A head trained on the tiny target's answers, with its training curve and the answers.
struct Trained {
    head: HeadTensors,
    curve: Vec<tandem::train::EpochPoint>,
    answers: Vec<Answer>,
}

/// The options of the trained head's run (the held-out answers are every 8th).
fn train_options(out: &std::path::Path, epochs: usize, learning_rate: f64) -> TrainOptions {
    TrainOptions {
        out: out.to_owned(),
        epochs,
        draft_vocab: 0,
        intermediate: 96,
        holdout: 8,
        init: None,
        eagle3: false,
        settings: TrainSettings {
            learning_rate,
            seed: 11,
            ..TrainSettings::default()
        },
    }
}

/// The tiny target's answers, and a head trained on them (with its training curve), once.
fn trained() -> &'static Trained {
    static H: OnceLock<Trained> = OnceLock::new();
    H.get_or_init(|| {
        let (_, target) = target();
        let answers = rt()
            .block_on(answer_prompts(
                Arc::clone(target),
                &answer_jobs(&prompts(48, 1000), 1, 5),
                (40, &[]),
                0.8,
                (8, 2),
                &mut |_, _| {},
            ))
            .unwrap();
        let out = tempfile::tempdir().unwrap();
        let opts = train_options(out.path(), 6, 3e-3);
        let report = train_head(target, &answers, &opts, &mut |_, _, _| {}).unwrap();
        // The folder holds the head it trained, which loads back.
        let saved = load_head(out.path()).unwrap();
        assert_eq!(saved.token_rank, report.head.token_rank);
        Trained {
            head: report.head,
            curve: report.curve,
            answers,
        }
    })
}

fn untrained() -> HeadTensors {
    let (_, target) = target();
    random_head(target.hparams(), 96, 11).unwrap()
}

fn head_source(t: &HeadTensors, vocab: usize) -> LoadedDrafter {
    let (_, target) = target();
    LoadedDrafter::Head {
        head: Arc::new(DraftHead::new(t.clone(), target, WeightsDtype::F32, vocab).unwrap()),
        name: "tiny head".into(),
        lookup: None,
    }
}

/// The head with prompt lookup drafting first (`head+lookup`).
fn with_lookup(mut source: LoadedDrafter) -> LoadedDrafter {
    if let LoadedDrafter::Head { lookup, .. } = &mut source {
        *lookup = Some(PromptLookup::default());
    }
    source
}

/// Every prompt through `engine`, `at_once` at a time, under `speculation`.
fn run_all(
    engine: &Engine,
    all: &[Vec<u32>],
    at_once: usize,
    speculation: RequestSpeculation,
) -> Vec<Completion> {
    all.chunks(at_once)
        .flat_map(|chunk| {
            let reqs = chunk
                .iter()
                .map(|p| EngineRequest {
                    speculative: speculation,
                    ..engine_request(greedy_request(p.clone(), 24, &[]), speculation.gamma)
                })
                .collect();
            complete_together(rt(), engine, reqs)
        })
        .collect()
}

fn engine_with(source: LoadedDrafter, pipeline: bool) -> Engine {
    let (_, target) = target();
    let cfg = EngineConfig {
        max_seqs: 4,
        prefill_chunk: 16,
        pipeline,
        target_threads: 1,
        draft_threads: 1,
        ..Default::default()
    };
    rt().block_on(Engine::start(Arc::clone(target), Some(source), cfg))
        .unwrap()
}

fn speculation(gamma: GammaPolicy, tree_nodes: usize) -> RequestSpeculation {
    RequestSpeculation {
        gamma,
        tree_nodes: Some(TreeNodes::within(tree_nodes, 8).unwrap()),
        ..Default::default()
    }
}

fn totals(done: &[Completion]) -> SpeculationStats {
    let mut s = SpeculationStats::default();
    for c in done {
        let u = &c.usage.speculative;
        s.rounds += u.rounds;
        s.draft_tokens += u.draft_tokens;
        s.accepted_tokens += u.accepted_tokens;
        s.tree_rounds += u.tree_rounds;
    }
    s
}

/// The layer's tensors of a head as written and as loaded back, side by side.
fn layer_pairs<'a>(a: &'a HeadTensors, b: &'a HeadTensors) -> Vec<(&'a Tensor, &'a Tensor)> {
    vec![
        (&a.fc, &b.fc),
        (&a.q, &b.q),
        (&a.k, &b.k),
        (&a.v, &b.v),
        (&a.o, &b.o),
        (&a.ffn_norm, &b.ffn_norm),
        (&a.gate, &b.gate),
        (&a.up, &b.up),
        (&a.down, &b.down),
    ]
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

/// Written as f16: what loads back is each weight rounded to f16, bit for bit.
fn assert_loaded_as_f16(pairs: &[(&Tensor, &Tensor)]) {
    for (i, (written, loaded)) in pairs.iter().enumerate() {
        let rounded = written
            .to_dtype(DType::F16)
            .and_then(|t| t.to_dtype(DType::F32))
            .unwrap();
        assert_eq!(bits(&rounded), bits(loaded), "tensor {i}");
    }
}

#[test]
fn a_saved_head_loads_back_as_written() {
    let (_, target) = target();
    let mut head = untrained();
    head.token_rank = vec![5, 3, 200, 0];
    let dir = tempfile::tempdir().unwrap();
    save_head(dir.path(), &head, target.hparams()).unwrap();
    let back = load_head(dir.path()).unwrap();
    assert_loaded_as_f16(&layer_pairs(&head, &back));
    assert_eq!(back.token_rank, head.token_rank);
    assert!(back.fc_bias.is_none());
    // Saved again, it loads back unchanged.
    let again = tempfile::tempdir().unwrap();
    save_head(again.path(), &back, target.hparams()).unwrap();
    let twice = load_head(again.path()).unwrap();
    assert_eq!(bits(&twice.down), bits(&back.down));
    // And it drafts for the target it was made for.
    DraftHead::new(back, target, WeightsDtype::F32, 3).unwrap();
}

type Tensors = std::collections::HashMap<String, Tensor>;

/// A copy of the head folder `dir` whose tensors `edit` changed.
fn rewritten(dir: &std::path::Path, edit: &dyn Fn(&mut Tensors)) -> tempfile::TempDir {
    let file = dir.join("model.safetensors");
    let mut all = candle_core::safetensors::load(&file, &Device::Cpu).unwrap();
    edit(&mut all);
    let d = tempfile::tempdir().unwrap();
    std::fs::copy(dir.join("config.json"), d.path().join("config.json")).unwrap();
    candle_core::safetensors::save(&all, d.path().join("model.safetensors")).unwrap();
    d
}

#[test]
fn malformed_heads_are_refused_naming_the_key() {
    let (_, target) = target();
    let dir = tempfile::tempdir().unwrap();
    save_head(dir.path(), &untrained(), target.hparams()).unwrap();
    let rewrite = |edit: &dyn Fn(&mut Tensors)| rewritten(dir.path(), edit);
    let missing = rewrite(&|all| {
        all.remove("layers.0.mlp.up_proj.weight");
    });
    let e = load_head(missing.path()).unwrap_err().to_string();
    assert!(e.contains("layers.0.mlp.up_proj.weight"), "{e}");

    let eagle3 = rewrite(&|all| {
        all.insert(
            "d2t".into(),
            Tensor::zeros(4, DType::I64, &Device::Cpu).unwrap(),
        );
    });
    // A vocabulary map makes it an EAGLE-3 head, whose own keys it then lacks.
    let e = load_head(eagle3.path()).unwrap_err().to_string();
    assert!(e.contains("midlayer.input_layernorm.weight"), "{e}");

    // A head for a target of another hidden size.
    let mut other = target.hparams().clone();
    other.hidden_size = 32;
    other.head_dim = 8;
    let e = DraftHead::new(
        random_head(&other, 96, 1).unwrap(),
        target,
        WeightsDtype::F32,
        0,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("fc.weight"), "{e}");

    // A vocabulary ranking naming a token the target does not have.
    let mut bad_rank = untrained();
    bad_rank.token_rank = vec![1, target.hparams().vocab_size as u32 + 5];
    let e = DraftHead::new(bad_rank, target, WeightsDtype::F32, 0)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("tandem.token_rank"), "{e}");

    // Two layers: not a head tandem reads.
    let layered = rewrite(&|_| {});
    let config = std::fs::read_to_string(layered.path().join("config.json")).unwrap();
    std::fs::write(
        layered.path().join("config.json"),
        config.replace("\"num_hidden_layers\": 1", "\"num_hidden_layers\": 2"),
    )
    .unwrap();
    let e = load_head(layered.path()).unwrap_err().to_string();
    assert!(e.contains("num_hidden_layers"), "{e}");
}

#[test]
fn greedy_output_with_a_head_equals_plain_decoding() {
    let _serial = one_at_a_time();
    let all = prompts(8, 77);
    let want: Vec<Vec<u32>> = all
        .iter()
        .map(|p| plain_output(&target().1, &greedy_request(p.clone(), 24, &[])).tokens)
        .collect();
    let trained = &trained().head;
    // Half the tokens the tiny target wrote.
    let small = trained.token_rank.len() / 2;
    assert!(small >= 1, "the ranking holds {:?}", trained.token_rank);
    // (An engine with a head does not pipeline: asking for it must change nothing.)
    let heads = [
        ("untrained", untrained(), 0, false, false),
        ("trained", trained.clone(), 0, false, false),
        (
            "trained, pipelining asked for",
            trained.clone(),
            0,
            true,
            false,
        ),
        // A reduced draft vocabulary: drafts outside it are never proposed.
        (
            "trained, reduced vocabulary",
            trained.clone(),
            small,
            false,
            false,
        ),
        // Prompt lookup first (the prompts repeat themselves), the head where it finds none.
        (
            "untrained, prompt lookup first",
            untrained(),
            0,
            false,
            true,
        ),
        (
            "trained, prompt lookup first",
            trained.clone(),
            small,
            false,
            true,
        ),
        // EAGLE-3: three taps, its own vocabulary of the tiny target's even tokens.
        (
            "EAGLE-3",
            eagle3_head(41, (0..130).map(|i| i * 2).collect(), vec![]),
            0,
            false,
            false,
        ),
        (
            "EAGLE-3, prompt lookup first",
            eagle3_head(41, (0..130).map(|i| i * 2).collect(), vec![1, 0, 1]),
            0,
            false,
            true,
        ),
    ];
    for (name, head, vocab, pipeline, lookup) in heads {
        let source = head_source(&head, vocab);
        let source = if lookup { with_lookup(source) } else { source };
        let engine = engine_with(source, pipeline);
        for at_once in [1, 4] {
            for (gamma, trees) in [
                (fixed_gamma(3), 0),
                (GammaPolicy::Adaptive, 0),
                (fixed_gamma(3), 4),
            ] {
                let done = run_all(&engine, &all, at_once, speculation(gamma, trees));
                for (i, c) in done.iter().enumerate() {
                    assert_eq!(
                        c.tokens, want[i],
                        "{name}: prompt {i}, {at_once} at once, {gamma:?}, trees {trees}"
                    );
                }
                let s = totals(&done);
                // (The governor may decline an untrained head; a fixed γ drafts.)
                if gamma != GammaPolicy::Adaptive {
                    assert!(s.draft_tokens > 0, "{name}: the head drafted: {s:?}");
                }
                if trees > 0 {
                    assert!(s.tree_rounds > 0, "{name}: trees were verified: {s:?}");
                }
            }
        }
        let stats = rt().block_on(engine.cache_stats()).unwrap();
        assert!(stats.idle(), "every slot returned: {stats:?}");
    }
}

/// A draft model with a reduced draft vocabulary (`speculation.draft_model_vocab`) drafts only its
/// tokens, greedy and sampled (`q` is 0 elsewhere), and greedy output with it is plain
/// decoding's: the tiny target drafting for itself over the even tokens among the first 64.
/// A job drafting 4 tokens after `context` as sequence 0: no gate, no tree, no grammar.
fn four_drafts<'a>(
    context: &'a [u32],
    params: &'a SamplingParams,
    rng: &'a mut tandem::sampling::SeededRng,
    out: &'a mut tandem::draft::Proposal,
    lookup: bool,
) -> tandem::draft::DraftJob<'a> {
    tandem::draft::DraftJob {
        seq: 0,
        scope: 0,
        context,
        generated_from: context.len(),
        gamma: 4,
        params,
        rng,
        out,
        gate: tandem::sampling::DraftGate::OFF,
        min_tokens: 0,
        confidence: false,
        tree_nodes: 0,
        grammar: None,
        lookup,
        likeliest: false,
        result: Ok(()),
    }
}

#[test]
fn a_head_after_lookup_drafts_the_match_unless_told_not_to_look() {
    use tandem::draft::{HeadDrafter, Proposal};
    use tandem::sampling::SeededRng;
    let _serial = one_at_a_time();
    let (_, target) = target();
    let head = Arc::new(DraftHead::new(untrained(), target, WeightsDtype::F32, 0).unwrap());
    // The text ends in a 3-token run it holds earlier: lookup proposes what followed it.
    let mut context = common::random_tokens(77, 12, 256);
    context.extend_from_within(2..5);
    let copied = &context[5..9].to_vec();
    let params = SamplingParams::greedy();
    let draft = |drafter: &mut HeadDrafter, look: bool| {
        let mut rng = SeededRng::new(1);
        let mut out = Proposal::default();
        let mut jobs = [four_drafts(&context, &params, &mut rng, &mut out, look)];
        drafter.propose_batch(&mut jobs);
        let [job] = jobs;
        job.result.unwrap();
        out
    };
    let lookup = Some(PromptLookup::new(1, 3));
    let mut first = HeadDrafter::new(Arc::clone(&head), Arc::clone(target), 1).with_lookup(lookup);
    let matched = draft(&mut first, true);
    assert_eq!(&matched.tokens, copied);
    assert_eq!(matched.confidence_kind, 3);
    // Told not to look, the head drafts its own chain (kind 0), as it does without lookup.
    let own = draft(&mut first, false);
    assert_eq!(own.confidence_kind, 0);
    assert_eq!(own.tokens.len(), 4);
    let mut alone = HeadDrafter::new(head, Arc::clone(target), 1);
    assert_eq!(own.tokens, draft(&mut alone, true).tokens);
}

#[test]
fn a_draft_model_drafts_over_its_reduced_vocabulary() {
    use tandem::draft::{reduced_vocab, ModelDrafter, Proposal};
    use tandem::sampling::SeededRng;
    let _serial = one_at_a_time();
    let (dir, _) = target();
    let draft = common::load_tiny(dir.path(), WeightsDtype::F32).model;
    let ranking: Vec<u32> = (0..64).map(|i| 2 * i).collect();
    let vocab = Arc::new(reduced_vocab(&draft, &ranking, 32).unwrap().unwrap());
    let kept = &ranking[..32];
    assert_eq!(vocab.ids(), kept);
    let mut drafter =
        ModelDrafter::new(&draft, "tiny, reduced").with_draft_vocab(Some(Arc::clone(&vocab)));
    for params in [
        SamplingParams::greedy(),
        SamplingParams {
            temperature: 1.0,
            ..Default::default()
        },
    ] {
        for seed in 0..4 {
            let context = common::random_tokens(300 + seed, 10, 256);
            let mut rng = SeededRng::new(seed);
            let mut out = Proposal::default();
            let mut jobs = [four_drafts(&context, &params, &mut rng, &mut out, true)];
            drafter.propose_batch(&mut jobs);
            let [job] = jobs;
            job.result.unwrap();
            drafter.end(0, false);
            assert_eq!(out.tokens.len(), 4);
            assert!(
                out.tokens.iter().all(|t| kept.contains(t)),
                "{:?}",
                out.tokens
            );
            for row in out.dists.chunks(out.vocab) {
                let outside: f32 = (0..out.vocab as u32)
                    .filter(|t| !kept.contains(t))
                    .map(|t| row[t as usize])
                    .sum();
                assert_eq!(outside, 0.0);
            }
        }
    }
    // In the engine: output is plain decoding's; the target's own tokens outside the
    // vocabulary are never drafted, so some drafts fall.
    let all = prompts(6, 4321);
    let want: Vec<Vec<u32>> = all
        .iter()
        .map(|p| plain_output(&target().1, &greedy_request(p.clone(), 24, &[])).tokens)
        .collect();
    let source = LoadedDrafter::Model {
        model: Arc::new(draft),
        vocab: Some(vocab),
        translation: None,
        lookup: None,
        name: "tiny, reduced".into(),
        self_layers: false,
    };
    let engine = engine_with(source, false);
    let done = run_all(&engine, &all, 3, speculation(fixed_gamma(3), 0));
    for (i, c) in done.iter().enumerate() {
        assert_eq!(c.tokens, want[i], "prompt {i}");
    }
    let s = totals(&done);
    let rate = s.acceptance_rate();
    assert!(s.draft_tokens > 0 && rate > 0.0 && rate < 1.0, "{s:?}");
}

/// A draft model's reduced vocabulary asked for where no ranking ships (a target other than
/// the default model) is refused at start-up with the key named, not ignored.
#[test]
fn a_draft_model_vocabulary_without_a_ranking_is_refused() {
    let (dir, _) = target();
    let path = dir.path().display().to_string();
    let text = format!(
        "[model]\npath = {path:?}\n[speculation]\ndraft_model = {path:?}\ndraft_model_vocab = 64\n"
    );
    let config = tandem::config::Config::from_toml(&text).unwrap();
    let loaded = common::load_tiny(dir.path(), WeightsDtype::F32);
    let spec = config.speculation.draft_model.clone();
    let refused = tandem::setup::load_drafter(&spec, WeightsDtype::F32, &config, &loaded);
    let e = refused.err().expect("refused").to_string();
    assert!(e.contains("speculation.draft_model_vocab"), "{e}");
}

#[test]
fn training_lowers_the_loss_and_raises_acceptance() {
    let _serial = one_at_a_time();
    let Trained { head, curve, .. } = trained();
    let (first, last) = (curve.first().unwrap(), curve.last().unwrap());
    eprintln!("training curve: {curve:#?}");
    assert!(
        last.eval_loss < 0.8 * first.eval_loss,
        "held-out loss fell: {first:?} -> {last:?}"
    );
    // Acceptance on prompts it never saw, a fixed γ of 3, greedy.
    let all = prompts(8, 5000);
    let rate = |t: &HeadTensors| {
        let engine = engine_with(head_source(t, 0), false);
        totals(&run_all(&engine, &all, 4, speculation(fixed_gamma(3), 0))).acceptance_rate()
    };
    let (before, after) = (rate(&untrained()), rate(head));
    eprintln!("acceptance: untrained {before:.3}, trained {after:.3}");
    assert!(
        after > before + 0.15,
        "training raised acceptance: {before:.3} -> {after:.3}"
    );
}

/// `train-head --layout eagle3` on the tiny target's answers: an EAGLE-3 head (three taps, its
/// own norms and output head over the ranked tokens) whose held-out token loss falls, saved in
/// EAGLE-3's layout, and drafting its training prompts' answers with far more acceptance than
/// the same head untrained.
#[test]
fn an_eagle3_head_trains_and_saves_in_its_layout() {
    let _serial = one_at_a_time();
    let (_, target) = target();
    let Trained { answers, .. } = trained();
    let out = tempfile::tempdir().unwrap();
    let opts = TrainOptions {
        eagle3: true,
        ..train_options(out.path(), 6, 3e-3)
    };
    let report = train_head(target, answers, &opts, &mut |_, _, _| {}).unwrap();
    let curve = &report.curve;
    let (first, last) = (curve.first().unwrap(), curve.last().unwrap());
    eprintln!("EAGLE-3 training curve: {curve:#?}");
    assert!(
        last.eval_token < 0.8 * first.eval_token,
        "held-out token loss fell: {first:?} -> {last:?}"
    );
    let saved = load_head(out.path()).unwrap();
    let parts = saved.eagle3.as_ref().expect("saved as an EAGLE-3 head");
    assert!(saved.token_rank.is_empty(), "its vocabulary is d2t's");
    assert!(
        parts.draft_ids.windows(2).all(|w| w[0] < w[1]),
        "ascending ids"
    );
    let file =
        candle_core::safetensors::load(out.path().join("model.safetensors"), &Device::Cpu).unwrap();
    assert!(file.contains_key("midlayer.hidden_norm.weight") && file.contains_key("d2t"));
    // Acceptance on prompts it never saw, a fixed γ of 3, greedy, against the untrained head.
    let untrained =
        tandem::model::head::train::random_eagle3_head(target, 96, 11, parts.draft_ids.clone())
            .unwrap();
    // (On the prompts it trained on: on this toy target it learns them nearly by heart, and on
    // unseen random prompts its first drafts stood 14% of the time where the EAGLE head's
    // generalise further; the EAGLE-3 head sees more of the target's state to memorise.)
    let seen = prompts(8, 1000);
    let rate = |t: &HeadTensors| {
        let engine = engine_with(head_source(t, 0), false);
        totals(&run_all(&engine, &seen, 4, speculation(fixed_gamma(3), 0))).acceptance_rate()
    };
    let (before, after) = (rate(&untrained), rate(&saved));
    eprintln!("EAGLE-3 acceptance on its prompts: untrained {before:.3}, trained {after:.3}");
    assert!(
        after > before + 0.5,
        "training raised acceptance: {before:.3} -> {after:.3}"
    );
}

/// A run started from a trained head (`--init`) starts where that head stands: with a
/// learning rate of zero its evaluation is the trained run's last one (the head saved in f16),
/// far from a random head's.
#[test]
fn a_run_from_a_trained_head_starts_where_it_stands() {
    let _serial = one_at_a_time();
    let (_, target) = target();
    let Trained {
        head,
        curve,
        answers,
    } = trained();
    let from = tempfile::tempdir().unwrap();
    save_head(from.path(), head, target.hparams()).unwrap();
    let evaluate = |init: Option<&std::path::Path>| {
        let out = tempfile::tempdir().unwrap();
        let mut opts = train_options(out.path(), 1, 0.0);
        opts.init = init.map(|p| p.to_owned());
        let report = train_head(target, answers, &opts, &mut |_, _, _| {}).unwrap();
        assert_eq!(
            report.head.token_rank, head.token_rank,
            "ranked again, alike"
        );
        report.curve[0]
    };
    let (random, resumed, last) = (
        evaluate(None),
        evaluate(Some(from.path())),
        curve.last().unwrap(),
    );
    eprintln!(
        "held-out loss: random {random:?}, from the trained head {resumed:?}, trained {last:?}"
    );
    assert!(
        (resumed.eval_loss - last.eval_loss).abs() < 0.02 * last.eval_loss,
        "starts where the trained head stands"
    );
    assert!(resumed.eval_loss < 0.8 * random.eval_loss);
}

/// Training runs the head as drafting does: the trainer's first step over a sequence is the
/// drafter's forward over its standing positions, and its second step (the head fed its own
/// first step's state, EAGLE-3's training-time test) is the drafter's next chain step from
/// each of them.
#[test]
fn training_steps_are_the_drafters_steps() {
    use tandem::model::head::train::{random_eagle3_head, HeadTrainer, TrainSample};
    use tandem::model::{KvCache, LogitsRows, SeqInput};
    let (_, target) = target();
    let h = target.hparams().hidden_size;
    let tokens = common::random_tokens(21, 14, 256);
    let n = tokens.len() - 1;
    let eagle3 = random_eagle3_head(target, 96, 11, (0..100).map(|i| i * 2).collect()).unwrap();
    // EAGLE's rows are the target's normed state; EAGLE-3's its three taps and last output.
    for (name, head, width) in [("EAGLE", untrained(), h), ("EAGLE-3", eagle3, 4 * h)] {
        let features: Vec<f32> = (0..tokens.len() * width)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 1.5)
            .collect();
        let trainer = HeadTrainer::new(head.clone(), target, 0, TrainSettings::default()).unwrap();
        assert_eq!(trainer.feature_width(), width);
        let sample = TrainSample {
            start: 0,
            tokens: tokens.clone(),
            features: features.clone(),
        };
        let (first, second) = trainer.drafting_states(target, &sample).unwrap();
        assert_eq!((first.len(), second.len()), (n * h, (n - 1) * h));
        let drafter = DraftHead::new(head, target, WeightsDtype::F32, 0).unwrap();
        // What the drafter is handed: the verification's features (EAGLE-3: the taps alone).
        let handed: Vec<f32> = features
            .chunks_exact(width)
            .flat_map(|r| &r[..width.min(3 * h)])
            .copied()
            .collect();
        let states = drafter.input_states(&handed).unwrap().into_owned();
        let close = |a: &[f32], b: &[f32], what: String| {
            assert_eq!(a.len(), b.len());
            let worst = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(worst < 1e-3, "{name}: {what} differs by {worst}");
        };
        let run = |cache: &mut KvCache, at: usize, toks: &[u32], feats: &[f32]| {
            let input = SeqInput {
                slot: 0,
                start_pos: at,
                tokens: toks,
                logits: LogitsRows::None,
                parents: &[],
            };
            drafter
                .forward(target, cache, &[input], feats)
                .unwrap()
                .hidden
        };
        let mut cache = drafter.new_cache(1);
        cache.allocate_slot(0).unwrap();
        let standing = run(&mut cache, 0, &tokens[1..], &states[..n * h]);
        close(&standing, &first, "the first step".into());
        for r in 0..n - 1 {
            // The standing positions 0..=r, then the chain's second step after them.
            cache.keep(0, Kept::First(0)).unwrap();
            run(&mut cache, 0, &tokens[1..r + 2], &states[..(r + 1) * h]);
            let next = run(
                &mut cache,
                r + 1,
                &tokens[r + 2..r + 3],
                &first[r * h..(r + 1) * h],
            );
            close(
                &next,
                &second[r * h..(r + 1) * h],
                format!("the second step from {r}"),
            );
        }
    }
}

/// Training's features reuse the part a text shares with the one before it: each text's come
/// out as one forward over it alone gives them.
#[test]
fn features_of_texts_sharing_a_prefix_are_each_texts_own() {
    use tandem::model::{LogitsRows, SeqInput};
    use tandem::train::FeatureRunner;
    let (_, target) = target();
    let base = common::random_tokens(31, 20, 256);
    let texts = [
        base.clone(),
        [&base[..12], &common::random_tokens(32, 9, 256)[..]].concat(),
        base[..12].to_vec(),
        base[..12].to_vec(),
        common::random_tokens(33, 7, 256),
    ];
    let mut runner = FeatureRunner::new(target, FeatureTaps::LastNormed).unwrap();
    for (i, text) in texts.iter().enumerate() {
        let shared = runner.features(text).unwrap().to_vec();
        let mut cache = target.new_cache(1);
        cache.allocate_slot(0).unwrap();
        let input = SeqInput {
            slot: 0,
            start_pos: 0,
            tokens: text,
            logits: LogitsRows::None,
            parents: &[],
        };
        let (_, alone) = target
            .forward_with_features(&mut cache, &[input], &FeatureTaps::LastNormed)
            .unwrap();
        assert_eq!(shared, alone.seq(0), "text {i}");
    }
}

/// The verification's features are the rows the output head reads: projected by it they give
/// the forward's logits bit for bit, and both backends return them.
#[test]
fn features_come_out_of_the_forward_on_both_backends() {
    use tandem::model::{BackendChoice, LogitsRows, SeqInput};
    let (dir, own) = target();
    let tensor = common::load_tiny_on(dir.path(), WeightsDtype::F32, BackendChoice::Candle).model;
    let tokens = common::random_tokens(3, 12, 256);
    let run_taps = |m: &Decoder, taps: &FeatureTaps| {
        let mut cache = m.new_cache(1);
        cache.allocate_slot(0).unwrap();
        let input = SeqInput {
            slot: 0,
            start_pos: 0,
            tokens: &tokens,
            logits: LogitsRows::All,
            parents: &[],
        };
        let (logits, features) = m.forward_with_features(&mut cache, &[input], taps).unwrap();
        (logits.seq_rows(0).unwrap(), features.seq(0).to_vec())
    };
    let run = |m: &Decoder| run_taps(m, &FeatureTaps::LastNormed);
    let (logits, features) = run(own);
    let h = own.hparams().hidden_size;
    assert_eq!(features.len(), tokens.len() * h);
    let projected = own
        .project(&Tensor::from_slice(&features, (tokens.len(), h), &Device::Cpu).unwrap())
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    assert_eq!(
        projected, logits,
        "the output head over the features is the logits"
    );
    let (_, on_tensors) = run(&tensor);
    let worst = features
        .iter()
        .zip(&on_tensors)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        worst < 1e-3,
        "the tensor backend's features differ by {worst}"
    );

    // EAGLE-3's taps: layer inputs side by side in the order asked. Layer 0's input is the
    // embedding; tapping changes no logit.
    let taps = FeatureTaps::LayerInputs(vec![1, 0, 1]);
    let embedded = own.embed(&tokens).unwrap().to_vec2::<f32>().unwrap();
    for (name, m) in [("own", own.as_ref()), ("tensor", &tensor)] {
        let (tapped_logits, tapped) = run_taps(m, &taps);
        assert_eq!(tapped.len(), tokens.len() * 3 * h, "{name}");
        if name == "own" {
            assert_eq!(tapped_logits, logits, "tapping changes no logit");
        }
        for (i, row) in tapped.chunks_exact(3 * h).enumerate() {
            assert_eq!(
                &row[h..2 * h],
                &embedded[i][..],
                "{name}: layer 0's input, row {i}"
            );
            assert_eq!(
                &row[..h],
                &row[2 * h..],
                "{name}: the same layer twice, row {i}"
            );
            assert_ne!(
                &row[..h],
                &row[h..2 * h],
                "{name}: layer 1's input is not the embedding"
            );
        }
    }
}

/// A random EAGLE-3 head for the tiny target (`common::random_eagle3_head`).
fn eagle3_head(seed: u64, ids: Vec<u32>, taps: Vec<usize>) -> HeadTensors {
    common::random_eagle3_head(&target().1, 96, seed, ids, taps)
}

/// An EAGLE-3 head saved by tandem is in the published layout (`midlayer.*`, `fc` over three
/// taps, its own `lm_head` and `norm`, `d2t` offsets, `t2d`, the config's draft vocabulary and
/// taps in the output-of-layer numbering) and loads back as exactly what was written.
#[test]
fn an_eagle3_head_saves_in_the_published_layout_and_loads_back_as_written() {
    let (_, target) = target();
    let hp = target.hparams();
    let h = hp.hidden_size;
    let ids = vec![40, 3, 257, 11];
    let head = eagle3_head(21, ids.clone(), vec![1, 1, 1]);
    let dir = tempfile::tempdir().unwrap();
    save_head(dir.path(), &head, hp).unwrap();

    let file =
        candle_core::safetensors::load(dir.path().join("model.safetensors"), &Device::Cpu).unwrap();
    let dims = |k: &str| {
        file.get(k)
            .unwrap_or_else(|| panic!("{k} written"))
            .dims()
            .to_vec()
    };
    assert_eq!(dims("fc.weight"), [h, 3 * h]);
    assert_eq!(
        dims("midlayer.self_attn.q_proj.weight"),
        [hp.num_heads * hp.head_dim, 2 * h]
    );
    assert_eq!(dims("midlayer.hidden_norm.weight"), [h]);
    assert_eq!(dims("midlayer.input_layernorm.weight"), [h]);
    assert_eq!(dims("lm_head.weight"), [4, h]);
    assert_eq!(dims("norm.weight"), [h]);
    assert!(
        file.keys().all(|k| !k.starts_with("layers.")),
        "{:?}",
        file.keys()
    );
    let d2t = file["d2t"].to_vec1::<i64>().unwrap();
    assert_eq!(d2t, [40, 2, 255, 8], "target id = draft id + d2t");
    let t2d = file["t2d"].to_vec1::<u8>().unwrap();
    assert_eq!(t2d.len(), hp.vocab_size);
    let members: Vec<usize> = (0..t2d.len()).filter(|&i| t2d[i] == 1).collect();
    assert_eq!(members, [3, 11, 40, 257]);
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(config["architectures"][0], "LlamaForCausalLMEagle3");
    assert_eq!(config["draft_vocab_size"], 4);
    assert_eq!(
        config["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
        serde_json::json!([0, 0, 0])
    );

    let back = load_head(dir.path()).unwrap();
    let (a, b) = (head.eagle3.as_ref().unwrap(), back.eagle3.as_ref().unwrap());
    assert_eq!(b.draft_ids, ids);
    assert_eq!(b.taps, [1, 1, 1]);
    assert_eq!(b.rope_theta, a.rope_theta);
    let mut pairs = layer_pairs(&head, &back);
    pairs.extend([
        (&a.input_norm, &b.input_norm),
        (&a.hidden_norm, &b.hidden_norm),
        (&a.final_norm, &b.final_norm),
        (&a.lm_head, &b.lm_head),
    ]);
    assert_loaded_as_f16(&pairs);
    // Saved again, the same file; and it drafts for its target.
    let again = tempfile::tempdir().unwrap();
    save_head(again.path(), &back, hp).unwrap();
    assert_eq!(
        std::fs::read(again.path().join("model.safetensors")).unwrap(),
        std::fs::read(dir.path().join("model.safetensors")).unwrap()
    );
    let drafting = DraftHead::new(back, target, WeightsDtype::F32, 0).unwrap();
    assert_eq!(drafting.vocab_ids(), Some(&ids[..]));
    assert_eq!(
        drafting.feature_taps(),
        FeatureTaps::LayerInputs(vec![1, 1, 1])
    );
}

/// A malformed EAGLE-3 head is refused with the key named: a vocabulary map outside the
/// target's vocabulary or naming a token twice, a missing norm, an output head of another
/// width, a tapped layer the target lacks.
#[test]
fn malformed_eagle3_heads_are_refused_naming_the_key() {
    let (_, target) = target();
    let hp = target.hparams();
    let dir = tempfile::tempdir().unwrap();
    save_head(dir.path(), &eagle3_head(5, vec![1, 2, 3], vec![]), hp).unwrap();
    let rewrite = |edit: &dyn Fn(&mut Tensors)| rewritten(dir.path(), edit);
    let refused = |d: &tempfile::TempDir| -> String {
        match load_head(d.path()) {
            Err(e) => e.to_string(),
            Ok(t) => DraftHead::new(t, target, WeightsDtype::F32, 0)
                .err()
                .expect("refused")
                .to_string(),
        }
    };
    let offsets = |v: Vec<i64>| {
        move |all: &mut Tensors| {
            all.insert(
                "d2t".into(),
                Tensor::from_vec(v.clone(), 3, &Device::Cpu).unwrap(),
            );
        }
    };
    let outside = rewrite(&offsets(vec![1, 1, 400]));
    let e = refused(&outside);
    assert!(e.contains("d2t") && e.contains("outside"), "{e}");
    let twice = rewrite(&offsets(vec![1, 0, 0]));
    let e = refused(&twice);
    assert!(e.contains("d2t") && e.contains("two draft tokens"), "{e}");
    let negative = rewrite(&offsets(vec![-5, 0, 0]));
    assert!(refused(&negative).contains("d2t[0]"));
    let no_norm = rewrite(&|all| {
        all.remove("midlayer.hidden_norm.weight");
    });
    assert!(refused(&no_norm).contains("midlayer.hidden_norm.weight"));
    let narrow = rewrite(&|all| {
        all.insert(
            "lm_head.weight".into(),
            Tensor::zeros((3, 8), DType::F16, &Device::Cpu).unwrap(),
        );
    });
    assert!(refused(&narrow).contains("lm_head.weight"));
    let wide_q = rewrite(&|all| {
        let q = all["midlayer.self_attn.q_proj.weight"].clone();
        all.insert(
            "midlayer.self_attn.q_proj.weight".into(),
            q.narrow(1, 0, hp.hidden_size).unwrap(),
        );
    });
    assert!(refused(&wide_q).contains("midlayer.self_attn.q_proj.weight"));
    // Taps past the target's layers (output of layer 5 is layer 6's input; it has 2).
    let taps = rewrite(&|_| {});
    let config = std::fs::read_to_string(taps.path().join("config.json")).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&config).unwrap();
    config["eagle_config"] = serde_json::json!({"eagle_aux_hidden_state_layer_ids": [0, 5, 0]});
    std::fs::write(taps.path().join("config.json"), config.to_string()).unwrap();
    assert!(refused(&taps).contains("eagle_aux_hidden_state_layer_ids"));
}

/// The EAGLE-3 head computes the forward the published heads define, checked against a
/// reference written here from that definition: `g = fc(taps)`; attention over
/// `[input_norm(embed(x)), hidden_norm(g)]` with the head's own RoPE, `g` as the residual; the
/// MLP; logits of `lm_head(norm(out))` over its draft vocabulary; `out` (before `norm`) the next
/// step's `g`.
#[test]
fn an_eagle3_head_computes_the_published_forward() {
    use tandem::model::{LogitsRows, SeqInput};
    let (_, target) = target();
    let hp = target.hparams().clone();
    let (h, nh, nkv, hd) = (hp.hidden_size, hp.num_heads, hp.num_kv_heads, hp.head_dim);
    let ids: Vec<u32> = (0..40).map(|i| i * 5 + 1).collect();
    let head_t = eagle3_head(31, ids.clone(), vec![1, 0, 1]);
    let p = head_t.eagle3.clone().unwrap();
    let head = DraftHead::new(head_t.clone(), target, WeightsDtype::F32, 0).unwrap();

    // The target's taps over a text, then the head over positions 0..n with the tokens after.
    let text = common::random_tokens(9, 10, 256);
    let mut cache = target.new_cache(1);
    cache.allocate_slot(0).unwrap();
    let (_, features) = target
        .forward_with_features(
            &mut cache,
            &[SeqInput {
                slot: 0,
                start_pos: 0,
                tokens: &text,
                logits: LogitsRows::None,
                parents: &[],
            }],
            &head.feature_taps(),
        )
        .unwrap();
    let n = text.len() - 1;
    let taps = &features.seq(0)[..n * 3 * h];
    let g = head.input_states(taps).unwrap();
    let mut head_cache = head.new_cache(1);
    head_cache.allocate_slot(0).unwrap();
    let step = head
        .forward(
            target,
            &mut head_cache,
            &[SeqInput {
                slot: 0,
                start_pos: 0,
                tokens: &text[1..],
                logits: LogitsRows::All,
                parents: &[],
            }],
            &g,
        )
        .unwrap();

    // The reference, row by row in f64-free plain candle ops.
    let t = |v: &[f32], r: usize, c: usize| Tensor::from_slice(v, (r, c), &Device::Cpu).unwrap();
    let rms =
        |x: &Tensor, w: &Tensor| candle_nn::ops::rms_norm(x, w, hp.rms_norm_eps as f32).unwrap();
    let lin = |x: &Tensor, w: &Tensor| x.matmul(&w.t().unwrap()).unwrap();
    let g_ref = lin(&t(taps, n, 3 * h), &head_t.fc);
    let embeds = target.embed(&text[1..]).unwrap();
    let a = Tensor::cat(
        &[rms(&embeds, &p.input_norm), rms(&g_ref, &p.hidden_norm)],
        1,
    )
    .unwrap();
    let (q, k, v) = (lin(&a, &head_t.q), lin(&a, &head_t.k), lin(&a, &head_t.v));
    let rope = |x: &Tensor, heads: usize| -> Vec<Vec<Vec<f32>>> {
        // Half-split RoPE at theta 10000: (pos, head, dim).
        let x = x.to_vec2::<f32>().unwrap();
        (0..n)
            .map(|pos| {
                (0..heads)
                    .map(|hh| {
                        let row = &x[pos][hh * hd..(hh + 1) * hd];
                        let half = hd / 2;
                        (0..hd)
                            .map(|d| {
                                let i = d % half;
                                let theta =
                                    pos as f32 / p.rope_theta.powf(2.0 * i as f32 / hd as f32);
                                let (c, s) = (theta.cos(), theta.sin());
                                if d < half {
                                    row[d] * c - row[d + half] * s
                                } else {
                                    row[d] * c + row[d - half] * s
                                }
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect()
    };
    let (qr, kr) = (rope(&q, nh), rope(&k, nkv));
    let vv = v.to_vec2::<f32>().unwrap();
    let mut attn = vec![0f32; n * nh * hd];
    for pos in 0..n {
        for hh in 0..nh {
            let kvh = hh / (nh / nkv);
            let scores: Vec<f32> = (0..=pos)
                .map(|j| {
                    (0..hd).map(|d| qr[pos][hh][d] * kr[j][kvh][d]).sum::<f32>()
                        / (hd as f32).sqrt()
                })
                .collect();
            let top = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let w: Vec<f32> = scores.iter().map(|s| (s - top).exp()).collect();
            let total: f32 = w.iter().sum();
            for d in 0..hd {
                attn[(pos * nh + hh) * hd + d] =
                    (0..=pos).map(|j| w[j] / total * vv[j][kvh * hd + d]).sum();
            }
        }
    }
    let x = (&g_ref + lin(&t(&attn, n, nh * hd), &head_t.o)).unwrap();
    let m = rms(&x, &head_t.ffn_norm);
    let act =
        (candle_nn::ops::silu(&lin(&m, &head_t.gate)).unwrap() * lin(&m, &head_t.up)).unwrap();
    let out = (&x + lin(&act, &head_t.down)).unwrap();
    let logits = lin(&rms(&out, &p.final_norm), &p.lm_head);

    let close = |got: &[f32], want: &[f32], what: &str| {
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
        let worst = got
            .iter()
            .zip(want)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(worst <= 1e-4 * scale, "{what}: off by {worst} of {scale}");
    };
    close(
        &g,
        &g_ref.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        "fc of the taps",
    );
    close(
        &step.hidden,
        &out.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        "output state",
    );
    assert_eq!(step.width, ids.len());
    close(
        &step.logits,
        &logits.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        "draft logits",
    );
}
