//! The actor engine: concurrent requests (joining at different times, mixed prompt lengths,
//! pipeline on and off, both drafters) give exactly each request's plain single-request greedy
//! output; seeded sampling is reproducible whatever else is in the batch; cancellation frees
//! KV slots; overload and oversized prompts are refused up front; the governor, given prices,
//! decodes plainly with a drafter that does not pay and speculates with one that does; drafting
//! a request's next round during its verification (pipelining) keeps greedy output identical.
//! (Sampled output on every engine path: `tests/sampled_distribution.rs`.)

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{
    complete_together, engine_request, fixed_gamma, generation_request, greedy_request,
    one_at_a_time, plain_output,
};
use tandem::draft::LoadedDrafter;
use tandem::draft::PromptLookup;
use tandem::engine::governor::CostModel;
use tandem::engine::{
    Completion, Engine, EngineConfig, EngineError, EngineEvent, FinishReason, GammaPolicy,
    SpeculationKnobs, TreeNodes,
};
use tandem::model::{BackendChoice, Decoder, ForwardKind, LoadedModel, WeightsDtype};
use tandem::sampling::{RequestGate, SamplingParams};

fn load(spec: &common::TinySpec, dtype: WeightsDtype) -> (tempfile::TempDir, LoadedModel) {
    load_on(spec, dtype, BackendChoice::Auto)
}

fn load_on(
    spec: &common::TinySpec,
    dtype: WeightsDtype,
    backend: BackendChoice,
) -> (tempfile::TempDir, LoadedModel) {
    let dir = tempfile::tempdir().unwrap();
    common::write_tiny_llama(dir.path(), spec);
    let m = common::load_tiny_on(dir.path(), dtype, backend);
    (dir, m)
}

/// The tiny target (seed 7) and a tiny model of the same shape with other weights (seed 99),
/// which as a drafter mostly disagrees with it; the directories hold their files.
fn target_and_other() -> ([tempfile::TempDir; 2], Arc<Decoder>, Arc<Decoder>) {
    target_and_other_on(BackendChoice::Auto)
}

fn target_and_other_on(
    backend: BackendChoice,
) -> ([tempfile::TempDir; 2], Arc<Decoder>, Arc<Decoder>) {
    let (d1, target) = load_on(&common::TinySpec::untied(7), WeightsDtype::F32, backend);
    let (d2, other) = load_on(&common::TinySpec::untied(99), WeightsDtype::F32, backend);
    ([d1, d2], Arc::new(target.model), Arc::new(other.model))
}

/// Prompts of mixed lengths with repeats, so prompt lookup finds matches.
fn prompts(n: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| {
            let a = common::random_tokens(100 + i as u64, 5 + 7 * i, 256);
            [a.clone(), a.clone(), a].concat()
        })
        .collect()
}

/// Four sequences at once in small prefill chunks; pipelined engines split the two threads.
fn four_seqs(pipeline: bool) -> EngineConfig {
    EngineConfig {
        max_seqs: 4,
        prefill_chunk: 16,
        pipeline,
        target_threads: if pipeline { 1 } else { 2 },
        draft_threads: if pipeline { 1 } else { 2 },
        ..Default::default()
    }
}

#[test]
fn concurrent_greedy_outputs_equal_plain_single_request_outputs() {
    concurrent_greedy_outputs_equal_plain(BackendChoice::Auto);
}

/// The same engine run over candle's tensor backend (on the CPU device): the engine, drafters
/// and governor do not know which forward runs.
#[test]
fn concurrent_greedy_outputs_equal_plain_on_the_tensor_backend() {
    concurrent_greedy_outputs_equal_plain(BackendChoice::Candle);
}

fn concurrent_greedy_outputs_equal_plain(backend: BackendChoice) {
    let _serial = one_at_a_time();
    let (_dirs, target_model, other) = target_and_other_on(backend);
    assert_eq!(
        target_model.forward_kind(),
        match backend {
            BackendChoice::Candle => ForwardKind::Tensor,
            _ => ForwardKind::Own,
        }
    );
    let rt = common::runtime();
    let all = prompts(8);
    let want: Vec<Vec<u32>> = all
        .iter()
        .enumerate()
        .map(|(i, p)| {
            plain_output(&target_model, &greedy_request(p.clone(), 20 + 3 * i, &[])).tokens
        })
        .collect();
    let sources = [
        None,
        Some(LoadedDrafter::PromptLookup(PromptLookup::default())),
        Some(LoadedDrafter::Model {
            model: other,
            vocab: None,
            translation: None,
            lookup: None,
            name: "tiny-other".into(),
            self_layers: false,
        }),
    ];
    for source in sources {
        for pipeline in [false, true] {
            let cfg = four_seqs(pipeline);
            let engine = rt
                .block_on(Engine::start(
                    Arc::clone(&target_model),
                    source.clone(),
                    cfg,
                ))
                .unwrap();
            for n in [1usize, 4, 8] {
                let got: Vec<Completion> = rt.block_on(async {
                    let mut handles = Vec::new();
                    for (i, p) in all.iter().take(n).enumerate() {
                        let gamma = match i % 3 {
                            0 => fixed_gamma(3),
                            1 => GammaPolicy::Adaptive,
                            _ => fixed_gamma(1 + i % 8),
                        };
                        let stream = engine
                            .submit(engine_request(
                                greedy_request(p.clone(), 20 + 3 * i, &[]),
                                gamma,
                            ))
                            .await
                            .unwrap();
                        handles.push(tokio::spawn(stream.collect()));
                        if i % 3 == 1 {
                            // Later requests join while earlier ones are decoding.
                            tokio::time::sleep(Duration::from_millis(3)).await;
                        }
                    }
                    let mut out = Vec::new();
                    for h in handles {
                        out.push(h.await.unwrap().unwrap());
                    }
                    out
                });
                for (i, c) in got.iter().enumerate() {
                    assert_eq!(
                        c.tokens,
                        want[i],
                        "request {i} of {n}, pipeline {pipeline}, drafter {}",
                        source.as_ref().map_or("none", |s| match s {
                            LoadedDrafter::PromptLookup(_) => "prompt-lookup",
                            LoadedDrafter::Model { .. } => "model",
                            LoadedDrafter::Head { .. } => "head",
                        })
                    );
                    assert_eq!(c.finish, FinishReason::Length);
                    assert_eq!(c.usage.completion_tokens, c.tokens.len());
                }
            }
            let stats = rt.block_on(engine.cache_stats()).unwrap();
            assert!(stats.idle(), "every slot returned: {stats:?}");
        }
    }
}

#[test]
fn seeded_sampling_is_reproducible_whatever_else_is_in_the_batch() {
    let _serial = one_at_a_time();
    let (_dirs, target, other) = target_and_other();
    let rt = common::runtime();
    let engine = rt
        .block_on(Engine::start(
            target,
            Some(LoadedDrafter::Model {
                model: other,
                vocab: None,
                translation: None,
                lookup: None,
                name: "tiny-other".into(),
                self_layers: false,
            }),
            EngineConfig::default(),
        ))
        .unwrap();
    let sampled = |prompt: Vec<u32>, seed| {
        let sampling = SamplingParams {
            temperature: 0.9,
            seed: Some(seed),
            ..Default::default()
        };
        engine_request(
            generation_request(prompt, 24, sampling, &[]),
            fixed_gamma(3),
        )
    };
    let p = prompts(5);
    let alone = rt
        .block_on(async {
            engine
                .submit(sampled(p[0].clone(), 42))
                .await?
                .collect()
                .await
        })
        .unwrap();
    let crowded = rt
        .block_on(async {
            let mut others = Vec::new();
            for (i, q) in p[1..].iter().enumerate() {
                others.push(engine.submit(sampled(q.clone(), i as u64)).await?);
            }
            let mine = engine.submit(sampled(p[0].clone(), 42)).await?;
            let out = mine.collect().await;
            for o in others {
                o.collect().await?;
            }
            out
        })
        .unwrap();
    assert_eq!(alone.tokens, crowded.tokens);
    let other_seed = rt
        .block_on(async {
            engine
                .submit(sampled(p[0].clone(), 43))
                .await?
                .collect()
                .await
        })
        .unwrap();
    assert_ne!(alone.tokens, other_seed.tokens, "the seed matters");
}

#[test]
fn cancelling_frees_slots_and_leaves_others_alone() {
    let _serial = one_at_a_time();
    let (_d1, target) = load(&common::TinySpec::untied(7), WeightsDtype::F32);
    let model = Arc::new(target.model);
    let rt = common::runtime();
    let engine = rt
        .block_on(Engine::start(
            Arc::clone(&model),
            Some(LoadedDrafter::PromptLookup(PromptLookup::default())),
            EngineConfig {
                max_seqs: 2,
                ..Default::default()
            },
        ))
        .unwrap();
    let p = prompts(2);
    let keep_req = greedy_request(p[1].clone(), 40, &[]);
    let want = plain_output(&model, &keep_req).tokens;
    rt.block_on(async {
        let mut doomed = engine
            .submit(engine_request(
                greedy_request(p[0].clone(), 200, &[]),
                fixed_gamma(2),
            ))
            .await
            .unwrap();
        let keep = engine
            .submit(engine_request(keep_req, fixed_gamma(2)))
            .await
            .unwrap();
        // Some output first, then hang up.
        assert!(matches!(
            doomed.next().await,
            Some(EngineEvent::Output { .. })
        ));
        drop(doomed);
        let kept = keep.collect().await.unwrap();
        assert_eq!(kept.tokens, want);
        let mut freed = false;
        for _ in 0..200 {
            let s = engine.cache_stats().await.unwrap();
            if s.idle() {
                freed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(freed, "the cancelled request's slot comes back");
        assert_eq!(engine.stats().await.unwrap().active, 0);
    });
}

#[test]
fn overload_and_oversized_prompts_are_refused_before_any_work() {
    let _serial = one_at_a_time();
    let (_d1, target) = load(&common::TinySpec::untied(7), WeightsDtype::F32);
    let context = target.model.context_len();
    let rt = common::runtime();
    let engine = rt
        .block_on(Engine::start(
            Arc::new(target.model),
            None,
            EngineConfig {
                max_seqs: 1,
                max_queue: 1,
                ..Default::default()
            },
        ))
        .unwrap();
    rt.block_on(async {
        let too_long = engine
            .submit(engine_request(
                greedy_request(vec![1; context], 4, &[]),
                GammaPolicy::Off,
            ))
            .await;
        assert!(matches!(too_long, Err(EngineError::PromptTooLong { .. })));
        // A γ past the engine's limit (8) is refused by name before it is queued.
        let over = engine
            .submit(engine_request(
                greedy_request(vec![1, 2, 3], 4, &[]),
                fixed_gamma(9),
            ))
            .await
            .err()
            .map(|e| e.to_string());
        assert!(
            over.as_deref()
                .is_some_and(|m| m.contains("speculative.gamma must be <= 8")),
            "{over:?}"
        );
        let mut streams = Vec::new();
        let mut overloaded = false;
        for _ in 0..4 {
            match engine
                .submit(engine_request(
                    greedy_request(vec![1, 2, 3], 150, &[]),
                    GammaPolicy::Off,
                ))
                .await
            {
                Ok(s) => streams.push(s),
                Err(EngineError::Overloaded { .. }) => overloaded = true,
                Err(e) => panic!("unexpected {e}"),
            }
        }
        assert!(overloaded, "1 running + 1 queued, then overloaded");
        assert_eq!(
            streams.len(),
            2,
            "room for exactly max_seqs + max_queue sequences"
        );
        // With the queue full, a bad request still gets its own error: it is checked before
        // it reaches the queue.
        let too_long = engine
            .submit(engine_request(
                greedy_request(vec![1; context], 4, &[]),
                GammaPolicy::Off,
            ))
            .await;
        assert!(matches!(too_long, Err(EngineError::PromptTooLong { .. })));
        for s in streams {
            let c = s.collect().await.unwrap();
            assert_eq!(c.tokens.len(), 150);
        }
        // Finished sequences give their room back: two at once fit again, a third does not.
        // The two are long enough that neither can finish before the third is submitted.
        let long = engine_request(greedy_request(vec![1, 2, 3], 150, &[]), GammaPolicy::Off);
        let short = engine_request(greedy_request(vec![1, 2, 3], 4, &[]), GammaPolicy::Off);
        let again = engine.submit_batch(vec![long; 2], 1).await.unwrap();
        assert!(matches!(
            engine.submit(short.clone()).await,
            Err(EngineError::Overloaded { .. })
        ));
        for s in again {
            assert_eq!(s.collect().await.unwrap().tokens.len(), 150);
        }
        // A batch larger than the whole engine is refused as invalid, not as overloaded.
        assert!(matches!(
            engine.submit_batch(vec![short; 3], 1).await,
            Err(EngineError::InvalidRequest(_))
        ));
        assert_eq!(engine.health(), tandem::engine::EngineHealth::Ok);
    });
}

/// A price table for the governor: a target forward of `w` tokens costs `1 + per_token·(w − 1)`
/// ms, a draft step `draft` ms, a drafter's catch-up `draft` ms a token (prompt lookup's are
/// priced at a hundredth of a step: an unpriced drafter is one the governor cannot plan for). Frozen by the engine,
/// so the governor's choices depend on acceptance alone, never on how busy the machine is.
fn price_table(per_token: f64, draft: f64, max_width: usize) -> CostModel {
    let mut costs = CostModel::new(max_width);
    for w in 1..=max_width {
        costs.record_verify(1e-3 * (1.0 + per_token * (w - 1) as f64), w);
    }
    costs.record_draft(3.0 * draft * 1e-3, (draft * 1e-3, 1), 3, 1);
    costs.record_catch_up(64.0 * draft * 1e-3, 64);
    costs
}

/// One greedy request through an engine that prices rounds with `costs`; returns its stats.
fn governed(
    rt: &tokio::runtime::Runtime,
    target: Arc<Decoder>,
    source: LoadedDrafter,
    costs: CostModel,
    prompt: Vec<u32>,
) -> tandem::engine::SpeculationStats {
    let cfg = EngineConfig {
        costs: Some(costs),
        ..Default::default()
    };
    let engine = rt
        .block_on(Engine::start(target, Some(source), cfg))
        .unwrap();
    let done = rt
        .block_on(async {
            engine
                .submit(engine_request(
                    greedy_request(prompt, 120, &[]),
                    GammaPolicy::Adaptive,
                ))
                .await?
                .collect()
                .await
        })
        .unwrap();
    assert_eq!(done.tokens.len(), 120);
    done.usage.speculative
}

/// The governor decides from prices and acceptance: with a table of prices in place of clocks
/// its choices are a function of the tokens, the same on any machine and under any load (each
/// case runs twice and must make the same rounds). Under one table where a draft step costs a
/// tenth of a target step, a drafter that rarely agrees is tried and then dropped, and the
/// target drafting for itself (always right) speculates with long rounds. An always-right free
/// drafter does not speculate where a w-token verification costs w steps: no γ beats plain
/// decoding then.
#[test]
fn governor_speculates_only_where_its_prices_say_it_pays() {
    let _serial = one_at_a_time();
    let rt = common::runtime();
    let max_width = EngineConfig::default().max_seqs * (EngineConfig::default().gamma_limit + 1);
    let (_dirs, target, other) = target_and_other();
    let twice = |source: &dyn Fn() -> LoadedDrafter,
                 target: &Arc<Decoder>,
                 costs: &CostModel,
                 prompt: &[u32]| {
        let runs: Vec<_> = (0..2)
            .map(|_| {
                governed(
                    &rt,
                    Arc::clone(target),
                    source(),
                    costs.clone(),
                    prompt.to_vec(),
                )
            })
            .collect();
        assert_eq!(
            runs[0], runs[1],
            "the same prices and tokens, the same choices"
        );
        runs[0].clone()
    };
    let cheap_drafts = price_table(0.1, 0.1, max_width);
    let prompt = prompts(1)[0].clone();
    let model = |m: &Arc<Decoder>, name: &str| {
        let (m, name) = (Arc::clone(m), name.to_string());
        move || LoadedDrafter::Model {
            model: Arc::clone(&m),
            vocab: None,
            translation: None,
            lookup: None,
            name: name.clone(),
            self_layers: false,
        }
    };
    let bad = twice(
        &model(&other, "tiny-other"),
        &target,
        &cheap_drafts,
        &prompt,
    );
    assert!(
        bad.rounds > 0 && bad.acceptance_rate() < 0.5 && bad.rounds * 8 < 120,
        "a drafter that rarely agrees is tried, then only probes: {bad:?}"
    );
    let good = twice(&model(&target, "itself"), &target, &cheap_drafts, &prompt);
    assert!(
        good.acceptance_rate() == 1.0 && good.mean_accepted_length() > 6.0,
        "an always-right drafter speculates with long rounds: {good:?}"
    );
    // A tied tiny model repeats its input token forever, which prompt lookup predicts.
    let (_d3, repeater) = load(&common::TinySpec::default(), WeightsDtype::F32);
    let repeater = Arc::new(repeater.model);
    let lookup = || LoadedDrafter::PromptLookup(PromptLookup::default());
    let dear = twice(
        &lookup,
        &repeater,
        &price_table(1.0, 0.01, max_width),
        &[5; 12],
    );
    assert!(
        dear.rounds * 8 < 120,
        "no γ pays when w tokens cost w steps: {dear:?}"
    );
}

/// An engine with pipelining on (one thread per worker) and `draft` as its draft model.
fn start_pipelined(
    rt: &tokio::runtime::Runtime,
    target: &Arc<Decoder>,
    draft: Arc<Decoder>,
    name: &str,
) -> Engine {
    let source = LoadedDrafter::Model {
        model: draft,
        vocab: None,
        translation: None,
        lookup: None,
        name: name.into(),
        self_layers: false,
    };
    let cfg = EngineConfig {
        pipeline: true,
        target_threads: 1,
        draft_threads: 1,
        ..Default::default()
    };
    rt.block_on(Engine::start(Arc::clone(target), Some(source), cfg))
        .unwrap()
}

/// A lone request with pipelining on drafts its next round while the current one is verified.
/// With the target itself as the drafter every guess holds and is used; with a drafter that
/// disagrees, guesses are discarded. Either way the output is plain greedy decoding's.
#[test]
fn drafting_ahead_within_a_request_keeps_greedy_output_identical() {
    let _serial = one_at_a_time();
    let (_dirs, target, other) = target_and_other();
    let rt = common::runtime();
    let all = prompts(3);
    for (name, draft, always_right) in [
        ("itself", Arc::clone(&target), true),
        ("tiny-other", other, false),
    ] {
        let engine = start_pipelined(&rt, &target, draft, name);
        for (i, p) in all.iter().enumerate() {
            let req = greedy_request(p.clone(), 30 + 5 * i, &[]);
            let got = rt
                .block_on(async {
                    engine
                        .submit(engine_request(req.clone(), fixed_gamma(1 + i)))
                        .await?
                        .collect()
                        .await
                })
                .unwrap();
            assert_eq!(
                got.tokens,
                plain_output(&target, &req).tokens,
                "drafter {name}, prompt {i}"
            );
        }
        let stats = rt.block_on(engine.stats()).unwrap();
        assert!(stats.drafted_ahead > 10, "{name}: {stats:?}");
        if always_right {
            assert_eq!(stats.ahead_used, stats.drafted_ahead, "{name}: {stats:?}");
        } else {
            assert!(stats.ahead_used < stats.drafted_ahead, "{name}: {stats:?}");
        }
        let cache = rt.block_on(engine.cache_stats()).unwrap();
        assert!(cache.idle(), "every slot returned: {cache:?}");
    }
}

/// Confidence-gated drafting: a draft model that is unsure of its next token (EGAG's smoothed
/// entropy, or a low top probability) ends its round early. Greedy output stays plain
/// decoding's, alone and 4 at once, pipelined or not; a strict gate drafts fewer tokens than
/// none (the tiny drafter is unsure of everything, so it drafts gamma_min = 1 a round); the
/// request's own settings and the live server settings both reach the drafter.
#[test]
fn confidence_gated_drafting_keeps_greedy_output_and_drafts_less() {
    let _serial = one_at_a_time();
    let (_dirs, target_model, other) = target_and_other();
    let rt = common::runtime();
    let all = prompts(4);
    let want: Vec<Vec<u32>> = all
        .iter()
        .map(|p| plain_output(&target_model, &greedy_request(p.clone(), 24, &[])).tokens)
        .collect();
    let strict = RequestGate {
        use_egag: Some(true),
        egag_threshold: Some(0.05),
        egag_ema_beta: Some(0.0),
        ..Default::default()
    };
    let sure = RequestGate {
        draft_p_min: Some(0.99),
        ..Default::default()
    };
    for pipeline in [false, true] {
        let cfg = four_seqs(pipeline);
        let source = LoadedDrafter::Model {
            model: Arc::clone(&other),
            vocab: None,
            translation: None,
            lookup: None,
            name: "tiny-other".into(),
            self_layers: false,
        };
        let engine = rt
            .block_on(Engine::start(Arc::clone(&target_model), Some(source), cfg))
            .unwrap();
        // Every request drafts 4 a round unless its gate stops it; returns the tokens drafted.
        let run = |gate: RequestGate, n: usize| -> usize {
            let reqs = all
                .iter()
                .take(n)
                .map(|p| {
                    let mut req =
                        engine_request(greedy_request(p.clone(), 24, &[]), fixed_gamma(4));
                    req.speculative.gate = gate;
                    req
                })
                .collect();
            let got = complete_together(&rt, &engine, reqs);
            for (i, c) in got.iter().enumerate() {
                assert_eq!(
                    c.tokens, want[i],
                    "request {i} of {n}, {gate:?}, pipeline {pipeline}"
                );
            }
            got.iter().map(|c| c.usage.speculative.draft_tokens).sum()
        };
        let ungated = run(RequestGate::default(), 1);
        let gated = run(strict, 1);
        assert!(
            gated * 2 < ungated,
            "a strict entropy gate drafts less: {gated} vs {ungated} tokens"
        );
        assert!(gated > 0, "gamma_min tokens are still drafted");
        assert!(run(sure, 1) * 2 < ungated, "draft_p_min 0.99 drafts less");
        run(strict, 4);
        run(sure, 4);
        // The same gate from the live server settings, for requests that set none.
        engine
            .settings()
            .update(&SpeculationKnobs {
                use_egag: Some(true),
                egag_threshold: Some(0.05),
                egag_ema_beta: Some(0.0),
                ..Default::default()
            })
            .unwrap();
        assert!(run(RequestGate::default(), 1) * 2 < ungated);
        // A request's own settings override the server's: gate off again for it.
        let off = RequestGate {
            use_egag: Some(false),
            ..Default::default()
        };
        assert_eq!(run(off, 1), ungated);
        let stats = rt.block_on(engine.cache_stats()).unwrap();
        assert!(stats.idle(), "every slot returned: {stats:?}");
    }
}

/// Prompts where an n-gram goes on in several ways, so prompt lookup's matches disagree and it
/// proposes trees: `[1, 2]`, a run, `9`, for three different runs, twice, then `[1, 2]`. The
/// latest match of `[9, 1, 2]` goes on with the third run, which the chain drafts; the first
/// run is made what the target itself says after the whole prompt (found by substituting its
/// output until the prompt reproduces it, or as close as that gets), so an older match's
/// continuation, an alternative, is the one the walk takes.
fn forked_prompts(target: &Decoder, n: usize) -> Vec<Vec<u32>> {
    let build = |runs: &[Vec<u32>]| {
        let mut p = Vec::new();
        for r in runs.iter().chain(runs) {
            p.extend([1, 2]);
            p.extend(r);
            p.push(9);
        }
        p.extend([1, 2]);
        p
    };
    (0..n)
        .map(|i| {
            let len = 4 + i;
            let mut runs: Vec<Vec<u32>> = (0..3)
                .map(|k| common::random_tokens(300 + 10 * i as u64 + k, len, 256))
                .collect();
            for _ in 0..6 {
                let said = plain_output(target, &greedy_request(build(&runs), len, &[])).tokens;
                if said == runs[0] {
                    break;
                }
                runs[0] = said;
            }
            build(&runs)
        })
        .collect()
}

/// Token trees (a chain with alternatives beside it, verified in one forward): greedy output
/// stays plain decoding's for both drafters, alone and 4 at once, pipelined or not, with the
/// drafted trees kept whole (a fixed γ) and priced by the governor (adaptive γ), with and
/// without confidence pricing. The trees are
/// really verified, and some of them accept an alternative over the drafted chain.
#[test]
fn token_trees_keep_greedy_output_identical() {
    let _serial = one_at_a_time();
    let (dirs, target_model, _) = target_and_other();
    // A drafter whose weights are partly another model's: it often disagrees with the target,
    // and then its runner-up is often right.
    let blend_dir = tempfile::tempdir().unwrap();
    common::write_tiny_blend(
        dirs[0].path(),
        &common::TinySpec::untied(99),
        0.4,
        blend_dir.path(),
    );
    let blend = Arc::new(common::load_tiny(blend_dir.path(), WeightsDtype::F32).model);
    let rt = common::runtime();
    let all: Vec<Vec<u32>> = forked_prompts(&target_model, 4)
        .into_iter()
        .chain(prompts(4))
        .collect();
    let want: Vec<Vec<u32>> = all
        .iter()
        .map(|p| plain_output(&target_model, &greedy_request(p.clone(), 24, &[])).tokens)
        .collect();
    let sources = [
        LoadedDrafter::PromptLookup(PromptLookup::default()),
        LoadedDrafter::Model {
            model: blend,
            vocab: None,
            translation: None,
            lookup: None,
            name: "tiny-blend".into(),
            self_layers: false,
        },
    ];
    for source in sources {
        let name = match &source {
            LoadedDrafter::PromptLookup(_) => "prompt-lookup",
            LoadedDrafter::Model { .. } => "model",
            LoadedDrafter::Head { .. } => "head",
        };
        let (mut tree_rounds, mut branch_accepts) = (0, 0);
        for pipeline in [false, true] {
            let engine = rt
                .block_on(Engine::start(
                    Arc::clone(&target_model),
                    Some(source.clone()),
                    four_seqs(pipeline),
                ))
                .unwrap();
            for n in [1usize, 4] {
                for gamma in [fixed_gamma(3), GammaPolicy::Adaptive] {
                    for (ci, chunk) in all.chunks(n).enumerate() {
                        let reqs = chunk
                            .iter()
                            .enumerate()
                            .map(|(j, p)| {
                                let mut req =
                                    engine_request(greedy_request(p.clone(), 24, &[]), gamma);
                                req.speculative.tree_nodes = Some(TreeNodes::within(4, 8).unwrap());
                                // Half of them with their chains cut by confidence too.
                                req.speculative.confidence_pricing = Some(j % 2 == 0);
                                req
                            })
                            .collect();
                        let got = complete_together(&rt, &engine, reqs);
                        for (j, c) in got.iter().enumerate() {
                            let i = ci * n + j;
                            assert_eq!(
                                c.tokens, want[i],
                                "prompt {i}, {n} at once, {gamma:?}, pipeline {pipeline}, {name}"
                            );
                            tree_rounds += c.usage.speculative.tree_rounds;
                            branch_accepts += c.usage.speculative.tree_branch_accepts;
                        }
                    }
                }
            }
            let stats = rt.block_on(engine.cache_stats()).unwrap();
            assert!(stats.idle(), "every slot returned: {stats:?}");
        }
        eprintln!("{name}: {tree_rounds} tree rounds, {branch_accepts} took an alternative");
        assert!(tree_rounds > 0, "{name}: no round was verified as a tree");
        assert!(
            branch_accepts > 0,
            "{name}: no tree round accepted an alternative ({tree_rounds} tree rounds)"
        );
    }
}

/// Confidence pricing: after drafting, the governor cuts a chain where its next tokens, by the
/// drafter's confidence in each (learned rates), are not worth their rows. Under a fixed price
/// table (the same decisions on any machine), a draft model that is often unsure of the
/// tokens it gets wrong verifies fewer drafts with it, at a higher acceptance rate; greedy
/// output stays plain decoding's, for it and for prompt lookup; the same run twice makes the
/// same rounds.
#[test]
fn confidence_pricing_cuts_unsure_chains_and_keeps_greedy_output() {
    let _serial = one_at_a_time();
    let rt = common::runtime();
    let max_width = EngineConfig::default().max_seqs * (EngineConfig::default().gamma_limit + 1);
    let (dirs, target, _) = target_and_other();
    let blend_dir = tempfile::tempdir().unwrap();
    common::write_tiny_blend(
        dirs[0].path(),
        &common::TinySpec::untied(99),
        0.1,
        blend_dir.path(),
    );
    let blend = Arc::new(common::load_tiny(blend_dir.path(), WeightsDtype::F32).model);
    let prompt = prompts(2)[1].clone();
    let want = plain_output(&target, &greedy_request(prompt.clone(), 96, &[])).tokens;
    let run = |source: LoadedDrafter, pricing: bool| {
        let cfg = EngineConfig {
            costs: Some(price_table(0.15, 0.05, max_width)),
            ..Default::default()
        };
        let engine = rt
            .block_on(Engine::start(Arc::clone(&target), Some(source), cfg))
            .unwrap();
        let mut req = engine_request(
            greedy_request(prompt.clone(), 96, &[]),
            GammaPolicy::Adaptive,
        );
        req.speculative.confidence_pricing = Some(pricing);
        let done = rt
            .block_on(async { engine.submit(req).await?.collect().await })
            .unwrap();
        assert_eq!(done.tokens, want, "pricing {pricing}");
        done.usage.speculative
    };
    let sources = [
        LoadedDrafter::Model {
            model: blend,
            vocab: None,
            translation: None,
            lookup: None,
            name: "tiny-blend".into(),
            self_layers: false,
        },
        LoadedDrafter::PromptLookup(PromptLookup::default()),
    ];
    for (i, source) in sources.into_iter().enumerate() {
        let off = run(source.clone(), false);
        let on = run(source.clone(), true);
        assert_eq!(
            on,
            run(source.clone(), true),
            "the same prices, the same rounds"
        );
        eprintln!("without pricing {off:?}\nwith pricing    {on:?}");
        assert!(on.rounds > 0, "still speculates: {on:?}");
        // The draft model is unsure of many tokens it gets wrong; prompt lookup's matches on
        // this prompt agree, and its chains stand as they are.
        if i == 0 {
            assert!(
                on.draft_tokens < off.draft_tokens,
                "unsure drafts are cut: {on:?} vs {off:?}"
            );
            assert!(
                on.acceptance_rate() > off.acceptance_rate(),
                "what is left stands more often: {on:?} vs {off:?}"
            );
        }
    }
}

/// An engine of one sequence at a time (where plain runs happen) over `target`.
fn one_sequence_engine(
    rt: &tokio::runtime::Runtime,
    target: &Arc<Decoder>,
    drafter: Option<LoadedDrafter>,
) -> Engine {
    let cfg = EngineConfig {
        max_seqs: 1,
        ..Default::default()
    };
    rt.block_on(Engine::start(Arc::clone(target), drafter, cfg))
        .unwrap()
}

/// A lone request that drafts nothing decodes in plain runs, several steps a job on the
/// verifier's worker: its tokens, greedy or sampled (seeded), are the reference loop's, a run
/// ends where the loop ends (an end-of-sequence token, `max_tokens`), and the engine did run
/// steps as later steps of runs.
#[test]
fn plain_runs_decode_as_the_reference_loop_does() {
    let _serial = one_at_a_time();
    let (_dirs, target, _) = target_and_other();
    let rt = common::runtime();
    let engine = one_sequence_engine(&rt, &target, None);
    let prompt = common::random_tokens(5, 12, 256);
    let sampled = SamplingParams {
        temperature: 0.8,
        seed: Some(11),
        ..Default::default()
    };
    let free_run = plain_output(&target, &greedy_request(prompt.clone(), 80, &[]));
    let eos = free_run.tokens[40];
    let requests = [
        greedy_request(prompt.clone(), 57, &[]),
        greedy_request(prompt.clone(), 80, &[eos]),
        generation_request(prompt.clone(), 61, sampled.clone(), &[]),
    ];
    for req in requests {
        let want = plain_output(&target, &req);
        let got = complete_together(
            &rt,
            &engine,
            vec![engine_request(req.clone(), GammaPolicy::Adaptive)],
        );
        assert_eq!(got[0].tokens, want.tokens, "{:?}", req.sampling);
        assert_eq!(got[0].finish, want.finish);
    }
    let stats = rt.block_on(engine.stats()).unwrap();
    assert!(
        stats.plain_run_steps > 0,
        "no step ran as part of a plain run: {stats:?}"
    );
}

/// A lone governed request drafting with prompt lookup decodes in plain runs where its text
/// matches nothing, each run stopping before the first context that matches: lookup still
/// drafts (the runs did not step over its matches), and the tokens are the reference loop's.
#[test]
fn plain_runs_stop_where_prompt_lookup_finds_a_match() {
    let _serial = one_at_a_time();
    let (_dirs, target, _) = target_and_other();
    let rt = common::runtime();
    let lookup = LoadedDrafter::PromptLookup(PromptLookup::default());
    let engine = one_sequence_engine(&rt, &target, Some(lookup));
    let mut drafted = 0;
    for prompt in prompts(3) {
        let req = greedy_request(prompt, 150, &[]);
        let want = plain_output(&target, &req);
        let got = complete_together(
            &rt,
            &engine,
            vec![engine_request(req.clone(), GammaPolicy::Adaptive)],
        );
        assert_eq!(got[0].tokens, want.tokens);
        drafted += got[0].usage.speculative.draft_tokens;
    }
    let stats = rt.block_on(engine.stats()).unwrap();
    assert!(
        stats.plain_run_steps > 0 && drafted > 0,
        "runs and drafts both expected: {drafted} drafted, {stats:?}"
    );
}
