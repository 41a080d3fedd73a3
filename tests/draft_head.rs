//! Draft heads (EAGLE): a head saved in EAGLE's layout loads back as exactly what was written;
//! a malformed head is refused at load with the key named; the engine drafting with a head
//! (chains and trees, 1 and 4 requests at once, pipelining asked for or not) gives exactly
//! plain greedy decoding; a draft model's reduced draft vocabulary confines its drafts; and
//! `train-head`'s training on the tiny model's own answers lowers
//! its held-out loss and raises its acceptance over the untrained head. (Sampled output with a
//! head: `tests/sampled_distribution.rs`.)

mod common;

use std::sync::{Arc, OnceLock};

use candle_core::{DType, Device, Tensor};
use tandem::draft::PromptLookup;
use tandem::engine::{
    generate_plain, Completion, DraftSource, Engine, EngineConfig, EngineRequest, Gamma,
    GammaPolicy, GenerationRequest, RequestSpeculation, SpeculationStats, TreeNodes,
};
use tandem::model::head::train::{random_head, TrainSettings};
use tandem::model::head::{load_head, save_head, DraftHead, HeadTensors};
use tandem::model::{Llama, WeightsDtype};
use tandem::sampling::SamplingParams;
use tandem::train::{answer_jobs, answer_prompts, train_head, Answer, TrainOptions};

/// The tiny target (its folder kept alive with it).
fn target() -> &'static (tempfile::TempDir, Arc<Llama>) {
    static T: OnceLock<(tempfile::TempDir, Arc<Llama>)> = OnceLock::new();
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

/// Tests here run one at a time: each runs engines with two compute threads.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
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

fn head_source(t: &HeadTensors, vocab: usize) -> DraftSource {
    let (_, target) = target();
    DraftSource::Head {
        head: Arc::new(DraftHead::new(t.clone(), target, WeightsDtype::F32, vocab).unwrap()),
        name: "tiny head".into(),
        lookup: None,
    }
}

/// The head with prompt lookup drafting first (`head+lookup`).
fn with_lookup(mut source: DraftSource) -> DraftSource {
    if let DraftSource::Head { lookup, .. } = &mut source {
        *lookup = Some(PromptLookup::default());
    }
    source
}

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        prompt,
        max_tokens,
        sampling: SamplingParams::greedy(),
        ..Default::default()
    }
}

fn plain(req: &GenerationRequest) -> Vec<u32> {
    let (_, target) = target();
    let mut cache = target.new_cache(1);
    generate_plain(target, &mut cache, req, &mut |_| true)
        .unwrap()
        .tokens
}

/// Every prompt through `engine`, `at_once` at a time, under `speculation`.
fn run_all(
    engine: &Engine,
    all: &[Vec<u32>],
    at_once: usize,
    speculation: RequestSpeculation,
) -> Vec<Completion> {
    rt().block_on(async {
        let mut out = Vec::new();
        for chunk in all.chunks(at_once) {
            let mut handles = Vec::new();
            for p in chunk {
                let req = EngineRequest {
                    generation: greedy(p.clone(), 24),
                    speculation,
                    logprobs: None,
                    prompt_logprobs: None,
                    constraint: None,
                };
                let stream = engine.submit(req).await.unwrap();
                handles.push(tokio::spawn(stream.collect()));
            }
            for h in handles {
                out.push(h.await.unwrap().unwrap());
            }
        }
        out
    })
}

fn engine_with(source: DraftSource, pipeline: bool) -> Engine {
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

fn fixed(g: usize) -> GammaPolicy {
    GammaPolicy::Fixed(Gamma::try_from(g).unwrap())
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

#[test]
fn a_saved_head_loads_back_as_written() {
    let (_, target) = target();
    let mut head = untrained();
    head.token_rank = vec![5, 3, 200, 0];
    let dir = tempfile::tempdir().unwrap();
    save_head(dir.path(), &head, target.hparams()).unwrap();
    let back = load_head(dir.path()).unwrap();
    // Written as f16: what loads back is each weight rounded to f16, bit for bit.
    let f16 = |t: &Tensor| {
        t.to_dtype(DType::F16)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
    };
    let bits = |t: &Tensor| -> Vec<u32> {
        t.flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    };
    let pairs = [
        (&head.fc, &back.fc),
        (&head.q, &back.q),
        (&head.k, &back.k),
        (&head.v, &back.v),
        (&head.o, &back.o),
        (&head.ffn_norm, &back.ffn_norm),
        (&head.gate, &back.gate),
        (&head.up, &back.up),
        (&head.down, &back.down),
    ];
    for (i, (a, b)) in pairs.into_iter().enumerate() {
        assert_eq!(bits(&f16(a)), bits(b), "tensor {i}");
    }
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

#[test]
fn malformed_heads_are_refused_naming_the_key() {
    let (_, target) = target();
    let dir = tempfile::tempdir().unwrap();
    save_head(dir.path(), &untrained(), target.hparams()).unwrap();
    let file = dir.path().join("model.safetensors");
    let rewrite = |edit: &dyn Fn(&mut std::collections::HashMap<String, Tensor>)| {
        let mut all = candle_core::safetensors::load(&file, &Device::Cpu).unwrap();
        edit(&mut all);
        let d = tempfile::tempdir().unwrap();
        std::fs::copy(dir.path().join("config.json"), d.path().join("config.json")).unwrap();
        candle_core::safetensors::save(&all, d.path().join("model.safetensors")).unwrap();
        d
    };
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
    let e = load_head(eagle3.path()).unwrap_err().to_string();
    assert!(e.contains("EAGLE-3"), "{e}");

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
    let want: Vec<Vec<u32>> = all.iter().map(|p| plain(&greedy(p.clone(), 24))).collect();
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
    ];
    for (name, head, vocab, pipeline, lookup) in heads {
        let source = head_source(&head, vocab);
        let source = if lookup { with_lookup(source) } else { source };
        let engine = engine_with(source, pipeline);
        for at_once in [1, 4] {
            for (gamma, trees) in [(fixed(3), 0), (GammaPolicy::Adaptive, 0), (fixed(3), 4)] {
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
#[test]
fn a_draft_model_drafts_over_its_reduced_vocabulary() {
    use tandem::draft::{DraftJob, ModelDrafter, Proposal};
    use tandem::sampling::{DraftGate, SeededRng};
    let _serial = one_at_a_time();
    let (dir, _) = target();
    let mut draft = common::load_tiny(dir.path(), WeightsDtype::F32).model;
    let ranking: Vec<u32> = (0..64).map(|i| 2 * i).collect();
    draft.set_draft_vocab(&ranking, 32).unwrap();
    let kept = &ranking[..32];
    assert_eq!(draft.draft_vocab().unwrap().ids(), kept);
    let mut drafter = ModelDrafter::new(&draft, "tiny, reduced");
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
            let mut jobs = [DraftJob {
                seq: 0,
                context: &context,
                generated_from: context.len(),
                gamma: 4,
                params: &params,
                rng: &mut rng,
                out: &mut out,
                gate: DraftGate::OFF,
                min_tokens: 0,
                confidence: false,
                tree_nodes: 0,
                grammar: None,
                result: Ok(()),
            }];
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
    let want: Vec<Vec<u32>> = all.iter().map(|p| plain(&greedy(p.clone(), 24))).collect();
    let source = DraftSource::Model {
        model: Arc::new(draft),
        name: "tiny, reduced".into(),
    };
    let engine = engine_with(source, false);
    let done = run_all(&engine, &all, 3, speculation(fixed(3), 0));
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
        totals(&run_all(&engine, &all, 4, speculation(fixed(3), 0))).acceptance_rate()
    };
    let (before, after) = (rate(&untrained()), rate(head));
    eprintln!("acceptance: untrained {before:.3}, trained {after:.3}");
    assert!(
        after > before + 0.15,
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
    use tandem::model::head::train::{HeadTrainer, TrainSample};
    use tandem::model::{KvCache, LogitsRows, SeqInput};
    let (_, target) = target();
    let h = target.hparams().hidden_size;
    let tokens = common::random_tokens(21, 14, 256);
    let features: Vec<f32> = (0..tokens.len() * h)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 1.5)
        .collect();
    let head = untrained();
    let trainer = HeadTrainer::new(head.clone(), target, 0, TrainSettings::default()).unwrap();
    let sample = TrainSample {
        start: 0,
        tokens: tokens.clone(),
        features: features.clone(),
    };
    let (first, second) = trainer.drafting_states(target, &sample).unwrap();
    let n = tokens.len() - 1;
    assert_eq!((first.len(), second.len()), (n * h, (n - 1) * h));
    let drafter = DraftHead::new(head, target, WeightsDtype::F32, 0).unwrap();
    let close = |a: &[f32], b: &[f32], what: String| {
        assert_eq!(a.len(), b.len());
        let worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-3, "{what} differs by {worst}");
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
    let standing = run(&mut cache, 0, &tokens[1..], &features[..n * h]);
    close(&standing, &first, "the first step".into());
    for r in 0..n - 1 {
        // The standing positions 0..=r, then the chain's second step after them.
        cache.truncate_to(0, 0).unwrap();
        run(&mut cache, 0, &tokens[1..r + 2], &features[..(r + 1) * h]);
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
    let mut runner = FeatureRunner::new(target).unwrap();
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
        let (_, alone) = target.forward_with_features(&mut cache, &[input]).unwrap();
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
    let run = |m: &Llama| {
        let mut cache = m.new_cache(1);
        cache.allocate_slot(0).unwrap();
        let input = SeqInput {
            slot: 0,
            start_pos: 0,
            tokens: &tokens,
            logits: LogitsRows::All,
            parents: &[],
        };
        let (logits, features) = m.forward_with_features(&mut cache, &[input]).unwrap();
        (logits.seq_rows(0).unwrap(), features.seq(0).to_vec())
    };
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
}
