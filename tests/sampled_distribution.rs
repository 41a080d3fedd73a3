//! Sampled speculation is distributed exactly as plain sampling, end to end, on every path a
//! request can take: the single-request loop, the batched engine, the pipelined engine, the
//! batched engine with four requests at once, that engine verifying token trees (the
//! drafter's runners-up beside its sampled chain, walked by the multi-draft rule), and a draft
//! head (EAGLE, drafting from the target's own features; alone, after prompt lookup, and an
//! EAGLE-3 head over its own reduced vocabulary) four at once, and a draft model of another
//! vocabulary (two of the six tokens only the target has, two others only the drafter: it
//! proposes the four shared ones, by token-level intersection), and drafters proposing their
//! likeliest tokens as point masses instead of draws (the draft model, the draft head, and
//! the drafter of another vocabulary string-level: its own likeliest tokens' text in the
//! target's tokens), for γ = 1, 3 and 5, with
//! temperature alone and with every processor together (top-k, top-p, min-p, a repetition
//! penalty, a logit bias).
//!
//! The model is a tiny random Llama with a 6-token vocabulary, so the exact distribution of the
//! first three generated tokens under plain sampling (216 sequences) is computed from the
//! model's own logits and the request's processors; each path's seeded requests are compared
//! with it by a chi-square goodness-of-fit test. The drafter is a model of the same shape with
//! other weights, which disagrees with the target often (the test asserts its acceptance rate
//! is between 20% and 90%), so a round that keeps a wrong draft or draws a correction from the
//! wrong distribution moves the output. Every request asks for 7 tokens, so its first round
//! (which makes tokens 2 and 3, after the prefill's token 1) drafts the whole γ: the test
//! asserts every request drafted at least γ tokens.
//!
//! Structured outputs: the same requests under a small grammar over the six tokens (after one
//! of them it leaves a single token, which the engine proposes as a forced draft), on the engine with speculation off, pipelined and 4 at once (γ = 3), compared
//! with the exact distribution of constrained plain sampling (each row masked by the grammar
//! state after the tokens before it).
//!
//! Statistics. Each comparison pools sequences expected fewer than 5 times and takes Pearson's
//! chi-square p-value. All 77 comparisons (69 speculative arms, the two plain ones that check
//! the reference itself, and the six constrained arms below) must have p ≥ 1e-3 / 77, so the whole test raises a false alarm with
//! probability at most 1e-3 per draw of seeds (Bonferroni). With N = 3000 requests an arm, about
//! 74 cells remain after pooling with temperature alone and 17 with every processor; at that
//! threshold each comparison then detects, with probability ≥ 0.99, any deviation whose
//! noncentrality λ = N·Σ Δ²/p reaches 111 (resp. 70): e.g. 3 points of probability moved
//! between two sequences of probability 0.05 (noncentral chi-square, computed with SciPy).
//! Lenience 0.2, inexact by design, must fail the same comparison (p below the threshold) on
//! both processor settings: the check can fail. `TANDEM_TEST_SEED` picks another draw of seeds.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::stats::{goodness_of_fit, Fit};
use common::{engine_request, fixed_gamma, generation_request, plain_output};
use tandem::constraint::{CompiledConstraint, ConstraintSpec, ConstraintVocabulary};
use tandem::draft::{GreedyAcross, ModelDrafter};
use tandem::engine::{
    generate_speculative, Engine, EngineConfig, EngineRequest, FixedSpeculation, Gamma,
    GammaPolicy, SpeculationStats,
};
use tandem::model::head::train::random_head;
use tandem::model::head::DraftHead;
use tandem::model::{Decoder, LogitsRows, SeqInput, WeightsDtype};
use tandem::sampling::{apply_penalties, probabilities, Lenience, SampledDrafts, SamplingParams};

const VOCAB: usize = 6;
const PROMPT: [u32; 4] = [1, 5, 3, 2];
/// Requests per arm.
const N: u64 = 3000;
/// One prefill token, then a first round of up to γ = 5 drafts and its correction or bonus.
const MAX_TOKENS: usize = 7;
const GAMMAS: [usize; 3] = [1, 3, 5];
/// 12 paths (trees, the head alone and after prompt lookup, an EAGLE-3 head, another
/// vocabulary, three of them, and three proposing likeliest tokens) × 3 γ × 2 processor
/// settings but string-level likeliest tokens under every processor, plain sampling under both
/// settings, and 3 constrained arms (the plain reference, pipelined, 4 at once) under both.
const COMPARISONS: usize = 77;
const FALSE_ALARM: f64 = 1e-3;

type Triple = [u32; 3];

fn seed_base() -> u64 {
    std::env::var("TANDEM_TEST_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0)
        .wrapping_mul(1 << 40)
}

fn tiny(seed: u64) -> common::TinySpec {
    common::TinySpec {
        vocab: VOCAB,
        hidden: 32,
        intermediate: 64,
        layers: 2,
        heads: 2,
        kv_heads: 1,
        tied: false,
        seed,
    }
}

/// How far the drafter's weights are from the target's, towards another random model's.
const DRAFT_MIX: f32 = 0.35;

fn processors() -> [(&'static str, SamplingParams); 2] {
    [
        (
            "temperature",
            SamplingParams {
                temperature: 1.0,
                ..Default::default()
            },
        ),
        (
            "every processor",
            SamplingParams {
                temperature: 0.8,
                top_k: 5,
                top_p: 0.95,
                min_p: 0.05,
                repetition_penalty: 1.3,
                logit_bias: vec![(0, 0.8), (4, -0.6)],
                ..Default::default()
            },
        ),
    ]
}

/// The target's processed distribution after `generated`, exactly as plain sampling sees it
/// (under `grammar`'s mask after `generated`, when constrained).
fn next_distribution(
    target: &Decoder,
    params: &SamplingParams,
    generated: &[u32],
    grammar: Option<&CompiledConstraint>,
) -> Vec<f32> {
    let context = [&PROMPT[..], generated].concat();
    let mut cache = target.new_cache(1);
    let slot = cache.allocate().unwrap();
    let logits = target
        .forward(
            &mut cache,
            &[SeqInput {
                slot,
                start_pos: 0,
                tokens: &context,
                logits: LogitsRows::Last,
                parents: &[],
            }],
        )
        .unwrap();
    let mut row = logits.seq_rows(0).unwrap().pop().unwrap();
    apply_penalties(&mut row, params, &context, generated);
    if let Some(g) = grammar {
        let mut state = g.start();
        state.advance(generated).unwrap();
        state.mask().unwrap().apply(&mut row);
    }
    let mut probs = Vec::new();
    probabilities(&row, params, &mut probs).unwrap();
    probs
}

/// The exact distribution of the first three tokens of plain sampling (constrained by
/// `grammar`, when given).
fn exact_plain(
    target: &Decoder,
    params: &SamplingParams,
    grammar: Option<&CompiledConstraint>,
) -> BTreeMap<Triple, f64> {
    let mut out = BTreeMap::new();
    let p1 = next_distribution(target, params, &[], grammar);
    for (a, &pa) in p1.iter().enumerate().filter(|(_, &p)| p > 0.0) {
        let p2 = next_distribution(target, params, &[a as u32], grammar);
        for (b, &pb) in p2.iter().enumerate().filter(|(_, &p)| p > 0.0) {
            let p3 = next_distribution(target, params, &[a as u32, b as u32], grammar);
            for (c, &pc) in p3.iter().enumerate().filter(|(_, &p)| p > 0.0) {
                out.insert(
                    [a as u32, b as u32, c as u32],
                    pa as f64 * pb as f64 * pc as f64,
                );
            }
        }
    }
    let total: f64 = out.values().sum();
    assert!(
        (total - 1.0).abs() < 1e-4,
        "exact distribution sums to {total}"
    );
    out
}

/// Counts of the first three tokens, and the speculation counters summed over the arm.
#[derive(Default)]
struct Arm {
    counts: BTreeMap<Triple, u64>,
    stats: SpeculationStats,
    /// Each request's drafted tokens (engine arms).
    drafted_each: Vec<usize>,
}

impl Arm {
    fn add(&mut self, tokens: &[u32], stats: &SpeculationStats, gamma: usize) {
        assert!(
            stats.draft_tokens >= gamma,
            "the first round drafts the whole γ = {gamma}: {stats:?}"
        );
        self.add_any(tokens, stats);
    }

    /// Every request's first round drafted the whole γ (an unconstrained arm: a constrained
    /// request's rounds may be forced tokens instead).
    fn check_drafted(self, gamma: usize) -> Self {
        for &d in &self.drafted_each {
            assert!(
                d >= gamma,
                "the first round drafts the whole γ = {gamma}: {d} drafted"
            );
        }
        self
    }

    fn add_any(&mut self, tokens: &[u32], stats: &SpeculationStats) {
        assert_eq!(tokens.len(), MAX_TOKENS, "no end token in this vocabulary");
        *self
            .counts
            .entry([tokens[0], tokens[1], tokens[2]])
            .or_default() += 1;
        self.stats.rounds += stats.rounds;
        self.stats.draft_tokens += stats.draft_tokens;
        self.stats.accepted_tokens += stats.accepted_tokens;
        self.stats.tree_rounds += stats.tree_rounds;
        self.stats.tree_branch_accepts += stats.tree_branch_accepts;
        self.stats.forced_tokens += stats.forced_tokens;
        self.stats.forced_accepted += stats.forced_accepted;
    }
}

fn plain_arm(target: &Decoder, params: &SamplingParams, seeds: u64) -> Arm {
    let mut arm = Arm::default();
    for i in 0..N {
        let sampling = SamplingParams {
            seed: Some(seeds + i),
            ..params.clone()
        };
        let out = plain_output(
            target,
            &generation_request(PROMPT.to_vec(), MAX_TOKENS, sampling, &[]),
        );
        arm.add(&out.tokens, &SpeculationStats::default(), 0);
    }
    arm
}

fn loop_arm(
    target: &Decoder,
    draft: &Decoder,
    params: &SamplingParams,
    gamma: usize,
    lenience: f32,
    seeds: u64,
) -> Arm {
    let spec = FixedSpeculation {
        gamma: Gamma::try_from(gamma).unwrap(),
        lenience: Lenience::try_from(lenience).unwrap(),
    };
    let mut arm = Arm::default();
    let mut cache = target.new_cache(1);
    for i in 0..N {
        let mut drafter = ModelDrafter::new(draft, "tiny-other");
        let sampling = SamplingParams {
            seed: Some(seeds + i),
            ..params.clone()
        };
        let req = generation_request(PROMPT.to_vec(), MAX_TOKENS, sampling, &[]);
        let (out, stats) =
            generate_speculative(target, &mut cache, &mut drafter, &req, spec, &mut |_| true)
                .unwrap();
        arm.add(&out.tokens, &stats, gamma);
    }
    arm
}

/// `N` requests through `engine`, `at_once` in flight together, each with up to `tree_nodes`
/// alternatives beside its chain, its drafts drawn from the drafter's distribution (the
/// caller checks how much first rounds drafted).
async fn engine_arm(
    engine: &Engine,
    params: &SamplingParams,
    (gamma, tree_nodes): (usize, usize),
    at_once: u64,
    seeds: u64,
) -> Arm {
    let speculation = tandem::engine::RequestSpeculation {
        gamma: fixed_gamma(gamma),
        lenience: Some(Lenience::EXACT),
        tree_nodes: Some(tandem::engine::TreeNodes::within(tree_nodes, 8).unwrap()),
        sampled_drafts: Some(SampledDrafts::Sample),
        ..Default::default()
    };
    requests_arm(engine, params, (speculation, None), at_once, seeds).await
}

/// `N` requests through `engine`, 4 in flight together, whose drafter proposes its likeliest
/// tokens as point masses rather than draws from its distribution.
async fn likeliest_arm(engine: &Engine, params: &SamplingParams, gamma: usize, seeds: u64) -> Arm {
    let speculation = tandem::engine::RequestSpeculation {
        gamma: fixed_gamma(gamma),
        lenience: Some(Lenience::EXACT),
        sampled_drafts: Some(SampledDrafts::Likeliest),
        ..Default::default()
    };
    requests_arm(engine, params, (speculation, None), 4, seeds).await
}

/// `N` constrained requests through `engine`, `at_once` in flight together, under `gamma`
/// (`GammaPolicy::Off`: constrained plain sampling on the engine).
async fn constrained_arm(
    engine: &Engine,
    params: &SamplingParams,
    (gamma, grammar): (GammaPolicy, &CompiledConstraint),
    at_once: u64,
    seeds: u64,
) -> Arm {
    let speculation = tandem::engine::RequestSpeculation {
        gamma,
        lenience: Some(Lenience::EXACT),
        ..Default::default()
    };
    requests_arm(engine, params, (speculation, Some(grammar)), at_once, seeds).await
}

/// `N` requests through `engine` under `speculation` (and `grammar`), `at_once` in flight.
async fn requests_arm(
    engine: &Engine,
    params: &SamplingParams,
    (speculation, grammar): (
        tandem::engine::RequestSpeculation,
        Option<&CompiledConstraint>,
    ),
    at_once: u64,
    seeds: u64,
) -> Arm {
    let mut arm = Arm::default();
    for batch in 0..N / at_once {
        let mut streams = Vec::new();
        for j in 0..at_once {
            let sampling = SamplingParams {
                seed: Some(seeds + batch * at_once + j),
                ..params.clone()
            };
            let generation = generation_request(PROMPT.to_vec(), MAX_TOKENS, sampling, &[]);
            let req = EngineRequest {
                speculative: speculation,
                constraint: grammar.cloned(),
                ..engine_request(generation, speculation.gamma)
            };
            streams.push(engine.submit(req).await.unwrap());
        }
        for s in streams {
            let done = s.collect().await.unwrap();
            arm.add_any(&done.tokens, &done.usage.speculative);
            arm.drafted_each.push(done.usage.speculative.draft_tokens);
        }
    }
    arm
}

/// A grammar over the tiny vocabulary's six tokens (`!"#$%&`): pairs, the first of `!#$%` and
/// the second of `!#$%&`, or `"` and then `&` (forced). Its masks alternate with the position,
/// so a drafter's unmasked choices are sometimes forbidden (the draft model drafts from its
/// masked distribution), and after `"` the mask leaves a single token, which the engine
/// proposes as a forced draft.
fn tiny_grammar(tokenizer: &Arc<tandem::model::TextTokenizer>) -> CompiledConstraint {
    let vocab = ConstraintVocabulary::new(Arc::clone(tokenizer), VOCAB).unwrap();
    vocab
        .compile(&ConstraintSpec::Lark(
            r#"start: /([!#$%][!#$%&]|"&)+/"#.into(),
        ))
        .unwrap()
}

fn start_engine(
    rt: &tokio::runtime::Runtime,
    target: &Arc<Decoder>,
    draft: &Arc<Decoder>,
    pipeline: bool,
    max_seqs: usize,
) -> Engine {
    start_engine_across(rt, target, (draft, None), pipeline, max_seqs)
}

/// An engine whose draft model drafts through `translation` (`None`: the same vocabulary).
fn start_engine_across(
    rt: &tokio::runtime::Runtime,
    target: &Arc<Decoder>,
    (draft, translation): (&Arc<Decoder>, Option<Arc<tandem::draft::Translation>>),
    pipeline: bool,
    max_seqs: usize,
) -> Engine {
    let source = tandem::draft::LoadedDrafter::Model {
        model: Arc::clone(draft),
        vocab: None,
        translation,
        lookup: None,
        name: "tiny-other".into(),
        self_layers: false,
    };
    let cfg = EngineConfig {
        max_seqs,
        pipeline,
        target_threads: 1,
        draft_threads: 1,
        ..Default::default()
    };
    rt.block_on(Engine::start(Arc::clone(target), Some(source), cfg))
        .unwrap()
}

#[test]
fn sampled_speculation_is_plain_sampling_on_every_engine_path() {
    // Candle's pool with no workers: its tensor operations (the tiny model's) run on the
    // thread that calls them. The pool serves one caller at a time and its callers spin while
    // they wait, so the engines' workers, running their arms at once, would spend their time
    // waiting on each other there (measured: two thirds of the test's CPU time). Set before
    // anything starts the pool; this binary's only test.
    std::env::set_var("CANDLE_NUM_THREADS", "1");
    // The loops on this thread run the tiny model's forwards here rather than on candle's
    // spinning pool, which the engines' own compute threads would be competing with.
    tandem::model::kernels::parallel::set_inline(true);
    let d1 = tempfile::tempdir().unwrap();
    let d2 = tempfile::tempdir().unwrap();
    common::write_tiny_llama(d1.path(), &tiny(3));
    common::write_tiny_blend(d1.path(), &tiny(4), DRAFT_MIX, d2.path());
    let loaded = common::load_tiny(d1.path(), WeightsDtype::F32);
    let grammar = tiny_grammar(&loaded.tokenizer);
    let target = Arc::new(loaded.model);
    let draft = Arc::new(common::load_tiny(d2.path(), WeightsDtype::F32).model);
    // The same drafter reading another vocabulary: its ids 4 and 5 are two bytes the target
    // has past its six rows, and the target's 4 and 5 (`%&`) are past the drafter's.
    let d3 = tempfile::tempdir().unwrap();
    common::write_tiny_blend(d1.path(), &tiny(4), DRAFT_MIX, d3.path());
    common::write_tiny_tokenizer_swapped(d3.path(), VOCAB, &[(4, 6), (5, 7)]);
    let across = common::load_tiny(d3.path(), WeightsDtype::F32);
    let translation = tandem::draft::Translation::between(
        Arc::clone(&across.tokenizer),
        VOCAB,
        Arc::clone(&loaded.tokenizer),
        VOCAB,
    )
    .unwrap();
    assert_eq!(translation.columns().target_ids(), [0, 1, 2, 3]);
    let across_model = Arc::new(across.model);
    // String-level: the drafter's own likeliest tokens, their text in the target's tokens.
    let string_level = translation.clone().with_greedy(GreedyAcross::StringLevel);
    let across = (&across_model, Some(Arc::new(translation)));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let engines = [
        (
            "batched engine",
            start_engine(&rt, &target, &draft, false, 1),
            1,
        ),
        (
            "pipelined engine",
            start_engine(&rt, &target, &draft, true, 1),
            1,
        ),
        ("4 at once", start_engine(&rt, &target, &draft, false, 4), 4),
        (
            "4 at once, a draft model of another vocabulary",
            start_engine_across(&rt, &target, across, false, 4),
            4,
        ),
    ];
    let string_level_engine = start_engine_across(
        &rt,
        &target,
        (&across_model, Some(Arc::new(string_level))),
        false,
        4,
    );
    // A draft head (untrained: it disagrees with the target often) on the target's features.
    let head_tensors = random_head(target.hparams(), 64, 21).unwrap();
    let head = Arc::new(DraftHead::new(head_tensors, &target, WeightsDtype::F32, 0).unwrap());
    // With `lookup`, prompt lookup drafts first (a point mass) and the head where it finds
    // no match (`head+lookup`).
    let start_head_engine = |head: &Arc<DraftHead>, lookup: bool| {
        let source = tandem::draft::LoadedDrafter::Head {
            head: Arc::clone(head),
            name: "tiny head".into(),
            lookup: lookup.then(tandem::draft::PromptLookup::default),
        };
        let cfg = EngineConfig {
            max_seqs: 4,
            target_threads: 1,
            draft_threads: 1,
            ..Default::default()
        };
        rt.block_on(Engine::start(Arc::clone(&target), Some(source), cfg))
            .unwrap()
    };
    let head_engine = start_head_engine(&head, false);
    let hybrid_engine = start_head_engine(&head, true);
    // An EAGLE-3 head (three taps, its own output head) over four of the six tokens: q is 0
    // outside them.
    let eagle3 = common::random_eagle3_head(&target, 64, 23, vec![5, 0, 3, 2], vec![]);
    let eagle3 = Arc::new(DraftHead::new(eagle3, &target, WeightsDtype::F32, 0).unwrap());
    let eagle3_engine = start_head_engine(&eagle3, false);
    let threshold = FALSE_ALARM / COMPARISONS as f64;
    let mut seeds = seed_base();
    let mut next_seeds = || {
        seeds += 1 << 24;
        seeds
    };
    let mut failures = Vec::new();
    let mut check = |what: String, fit: &Fit| {
        eprintln!(
            "{what}: chi-square {:.1}, df {}, p {:.2e}",
            fit.statistic, fit.df, fit.p_value
        );
        if !fit.impossible.is_empty() || fit.p_value < threshold {
            failures.push(format!("{what}: {fit:?}"));
        }
    };
    for (name, params) in processors() {
        let exact = exact_plain(&target, &params, None);
        let plain = plain_arm(&target, &params, next_seeds());
        check(
            format!("{name}, plain"),
            &goodness_of_fit(&plain.counts, &exact),
        );
        for gamma in GAMMAS {
            // Every arm's seeds first, in a fixed order; then the arms on different engines
            // run at once (each engine's own arms one after another): a tiny model's requests
            // wait on the actors' hand-offs far more than on the cores, and one arm at a time
            // left them idle most of the time.
            let s: [u64; 12] = std::array::from_fn(|_| next_seeds());
            let p = &params;
            let across_arm = async {
                // (Its text in the target's tokens may come to fewer tokens than it drafted,
                // or none: two of its bytes are tokens past the target's rows. The acceptance
                // check below sees that it drafted. Its own likeliest tokens know nothing of
                // the request's processors, whose masks and bias refuse nearly all of them (2%
                // stood at γ = 3): an arm that never rejects proves nothing, so temperature
                // alone.)
                match name {
                    "temperature" => {
                        Some(likeliest_arm(&string_level_engine, p, gamma, s[10]).await)
                    }
                    _ => None,
                }
            };
            // (The loop runs the model on this thread, where candle's own tensor operations
            // wake its pool, whose spinning workers would take a core from the engines.)
            let looped = loop_arm(&target, &draft, p, gamma, 1.0, s[0]);
            let ((batched, pipelined, other_vocab, (four, (trees, likeliest))), more) = rt
                .block_on(async {
                    tokio::join!(
                        async {
                            tokio::join!(
                                engine_arm(&engines[0].1, p, (gamma, 0), 1, s[1]),
                                engine_arm(&engines[1].1, p, (gamma, 0), 1, s[2]),
                                engine_arm(&engines[3].1, p, (gamma, 0), 4, s[4]),
                                // The "4 at once" engine's chains, then token trees, then
                                // likeliest tokens.
                                async {
                                    let e = &engines[2].1;
                                    let chains = engine_arm(e, p, (gamma, 0), 4, s[3]).await;
                                    let trees = engine_arm(e, p, (gamma, 2), 4, s[5]).await;
                                    let likeliest = likeliest_arm(e, p, gamma, s[6]).await;
                                    (chains, (trees, likeliest))
                                },
                            )
                        },
                        async {
                            tokio::join!(
                                async {
                                    let head =
                                        engine_arm(&head_engine, p, (gamma, 0), 4, s[7]).await;
                                    (head, likeliest_arm(&head_engine, p, gamma, s[8]).await)
                                },
                                engine_arm(&hybrid_engine, p, (gamma, 0), 4, s[9]),
                                engine_arm(&eagle3_engine, p, (gamma, 0), 4, s[11]),
                                across_arm,
                            )
                        },
                    )
                });
            let ((head, likeliest_head), hybrid, eagle3, string_level) = more;
            let trees = trees.check_drafted(gamma);
            assert!(
                trees.stats.tree_rounds > 0 && trees.stats.tree_branch_accepts > 0,
                "{name}, γ = {gamma}: trees verified and alternatives taken: {:?}",
                trees.stats
            );
            let mut arms = vec![
                ("single-request loop", looped),
                (engines[0].0, batched.check_drafted(gamma)),
                (engines[1].0, pipelined.check_drafted(gamma)),
                (engines[2].0, four.check_drafted(gamma)),
                (engines[3].0, other_vocab.check_drafted(gamma)),
                ("4 at once, token trees", trees),
                ("4 at once, draft head", head.check_drafted(gamma)),
                // (Prompt lookup's match may be shorter than γ: its first rounds draft at
                // least one.)
                (
                    "4 at once, draft head after prompt lookup",
                    hybrid.check_drafted(1),
                ),
                ("4 at once, EAGLE-3 head", eagle3.check_drafted(gamma)),
                // The drafter's likeliest tokens, proposed as point masses.
                (
                    "4 at once, likeliest tokens",
                    likeliest.check_drafted(gamma),
                ),
                (
                    "4 at once, draft head's likeliest tokens",
                    likeliest_head.check_drafted(gamma),
                ),
            ];
            if let Some(string_level) = string_level {
                arms.push((
                    "4 at once, another vocabulary's likeliest tokens, string-level",
                    string_level,
                ));
            }
            for (path, arm) in arms {
                let rate = arm.stats.acceptance_rate();
                // (A tree's alternatives count as drafts too: its rate is lower by design. The
                // untrained head's chains drift from the target as they grow: 0.1 at γ = 5. On
                // this tiny random pair the likeliest token is the target's less often than a
                // draw is at temperature alone (0.17 at γ = 3), and more often under every
                // processor, whose target rows are peaked (0.92): a rejection there still
                // comes every dozen drafts.)
                let least = if path.contains("head") || path.contains("likeliest") {
                    0.1
                } else {
                    0.2
                };
                let most = if path.contains("likeliest") {
                    0.97
                } else {
                    0.9
                };
                assert!(
                    arm.stats.tree_rounds > 0 || (least..most).contains(&rate),
                    "{name}, γ = {gamma}, {path}: the drafter must disagree often but not \
                     always, acceptance {rate:.2}"
                );
                check(
                    format!("{name}, γ = {gamma}, {path} (acceptance {rate:.2})"),
                    &goodness_of_fit(&arm.counts, &exact),
                );
            }
        }
        // Constrained: every row masked by the grammar, forced tokens drafted as point masses,
        // the draft model's chain verified whole (γ = 3), against exact constrained sampling.
        let exact_constrained = exact_plain(&target, &params, Some(&grammar));
        let arms = [
            ("constrained, plain", GammaPolicy::Off),
            ("constrained, pipelined engine", fixed_gamma(3)),
            ("constrained, 4 at once", fixed_gamma(3)),
        ];
        let seeds3: [u64; 3] = std::array::from_fn(|_| next_seeds());
        let p = &params;
        let g = &grammar;
        let (pipelined, (plain, four)) = rt.block_on(async {
            tokio::join!(
                constrained_arm(&engines[1].1, p, (fixed_gamma(3), g), 1, seeds3[1]),
                async {
                    let plain =
                        constrained_arm(&engines[2].1, p, (GammaPolicy::Off, g), 4, seeds3[0])
                            .await;
                    let four =
                        constrained_arm(&engines[2].1, p, (fixed_gamma(3), g), 4, seeds3[2]).await;
                    (plain, four)
                },
            )
        });
        let done = [plain, pipelined, four];
        for ((path, gamma), arm) in arms.into_iter().zip(done) {
            if gamma != GammaPolicy::Off {
                let s = &arm.stats;
                // (With every processor, `"` is too unlikely for the forced `&` to come up.)
                let forced_seen = name != "temperature" || s.forced_accepted > 0;
                assert!(
                    forced_seen && s.accepted_tokens > s.forced_accepted,
                    "{name}, {path}: forced and drafted tokens both stood: {s:?}"
                );
            }
            check(
                format!(
                    "{name}, {path} (acceptance {:.2})",
                    arm.stats.acceptance_rate()
                ),
                &goodness_of_fit(&arm.counts, &exact_constrained),
            );
        }
        // Lenience 0.2 keeps drafts the exact rule rejects: the same comparison must see it.
        let lenient = loop_arm(&target, &draft, &params, 3, 0.2, next_seeds());
        let fit = goodness_of_fit(&lenient.counts, &exact);
        eprintln!(
            "{name}, lenience 0.2: chi-square {:.1}, df {}, p {:.2e}",
            fit.statistic, fit.df, fit.p_value
        );
        assert!(
            fit.p_value < threshold,
            "{name}: inexact acceptance went unnoticed: {fit:?}"
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The pipelined engine drafted rounds ahead, and both kept and dropped such guesses.
    let ahead = rt.block_on(engines[1].1.stats()).unwrap();
    assert!(
        ahead.ahead_used > 0 && ahead.ahead_used < ahead.drafted_ahead,
        "drafts made ahead must be both used and dropped: {ahead:?}"
    );
}
