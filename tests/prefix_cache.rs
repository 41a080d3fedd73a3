//! The prefix cache on the real default model: greedy output, logprobs and the speculation
//! counters are the same bits with the cache on and off, for plain decoding and both drafters,
//! over a multi-turn conversation and concurrent requests sharing a system prompt; prefixes are
//! really taken (fewer prompt tokens run through the target); the cache holds what its memory
//! budget allows, a shared start once, and never holds a slot or KV room a new request needs.

use crate::common;

use std::sync::Arc;

use common::{engine_request, fixed_gamma, greedy_request};
use tandem::draft::LoadedDrafter;
use tandem::draft::PromptLookup;
use tandem::engine::{Completion, Engine, EngineConfig, EngineRequest, GammaPolicy};
use tandem::model::cache::prefix_store::common_prefix;
use tandem::model::{ChatMessage, Decoder, TextTokenizer, WeightsDtype};
use tandem::sampling::TokenLogprob;

fn render(tok: &TextTokenizer, turns: &[ChatMessage]) -> Vec<u32> {
    let text = tok.chat_template().unwrap().render(turns, true).unwrap();
    tok.encode(&text, true).unwrap()
}

fn start(
    rt: &tokio::runtime::Runtime,
    target: &Arc<Decoder>,
    draft: Option<LoadedDrafter>,
    prefix_cache: bool,
    max_seqs: usize,
) -> Engine {
    rt.block_on(Engine::start(
        Arc::clone(target),
        draft,
        EngineConfig {
            max_seqs,
            prefill_chunk: 64,
            prefix_cache,
            ..Default::default()
        },
    ))
    .unwrap()
}

/// A token's logprob entry as bits: the token, its logprob, the alternatives and theirs.
type LogprobBits = (u32, u32, Vec<(u32, u32)>);

/// What must not change with the cache: tokens, logprob bits, and (at a fixed γ, where the
/// drafts depend only on the draft cache's contents) the speculation counters.
#[derive(Debug, PartialEq)]
struct Outcome {
    tokens: Vec<u32>,
    logprobs: Vec<LogprobBits>,
    speculation: (usize, usize, usize),
}

fn outcome(c: &Completion) -> Outcome {
    let bits = |l: &TokenLogprob| {
        (
            l.token,
            l.logprob.to_bits(),
            l.top.iter().map(|&(t, p)| (t, p.to_bits())).collect(),
        )
    };
    Outcome {
        tokens: c.tokens.clone(),
        logprobs: c.logprobs.iter().map(bits).collect(),
        speculation: (
            c.usage.speculative.rounds,
            c.usage.speculative.draft_tokens,
            c.usage.speculative.accepted_tokens,
        ),
    }
}

/// A three-turn conversation (each turn's prompt holds the previous turns and answers), then
/// four requests at once sharing a long system prompt, then the same four again (now their
/// stored texts are found). Returns each request's outcome and the prompt tokens it took
/// from the cache, and the prompt tokens the target ran.
fn workload(
    rt: &tokio::runtime::Runtime,
    engine: &Engine,
    tok: &TextTokenizer,
    gamma: GammaPolicy,
) -> (Vec<(Outcome, usize)>, u64) {
    let eos = tok.eos_ids();
    let mut results = Vec::new();
    let mut turns = vec![ChatMessage::new(
        "user",
        "Describe the water cycle in a few sentences.",
    )];
    for follow_up in ["Now say it more simply.", "And in one sentence?"] {
        let c = rt
            .block_on(async {
                engine
                    .submit(EngineRequest {
                        logprobs: Some(2),
                        ..engine_request(greedy_request(render(tok, &turns), 40, eos), gamma)
                    })
                    .await?
                    .collect()
                    .await
            })
            .unwrap();
        results.push((outcome(&c), c.usage.cached_tokens));
        turns.push(ChatMessage::new("assistant", c.text.clone()));
        turns.push(ChatMessage::new("user", follow_up));
    }
    let system = "You are a patient teacher who explains science to children, always with an \
                  example from everyday life and never with jargon. "
        .repeat(3);
    let questions = [
        "Why is the sky blue?",
        "Why do leaves fall?",
        "What is a magnet?",
        "How do plants drink?",
    ];
    for _ in 0..2 {
        let done: Vec<Completion> = rt.block_on(async {
            let mut streams = Vec::new();
            for q in questions {
                let prompt = render(
                    tok,
                    &[
                        ChatMessage::new("system", system.clone()),
                        ChatMessage::new("user", q),
                    ],
                );
                streams.push(
                    engine
                        .submit(EngineRequest {
                            logprobs: Some(2),
                            ..engine_request(greedy_request(prompt, 24, eos), gamma)
                        })
                        .await
                        .unwrap(),
                );
            }
            let mut out = Vec::new();
            for s in streams {
                out.push(s.collect().await.unwrap());
            }
            out
        });
        results.extend(done.iter().map(|c| (outcome(c), c.usage.cached_tokens)));
    }
    let prefilled = rt.block_on(engine.stats()).unwrap().prefilled_tokens;
    (results, prefilled)
}

#[test]
fn output_is_the_same_bits_with_the_prefix_cache_on_and_off() {
    let loaded = common::load_default(WeightsDtype::AsIs);
    let tok = Arc::clone(&loaded.tokenizer);
    let target = Arc::new(loaded.model);
    let f16 = Arc::new(common::load_default(WeightsDtype::F16).model);
    let rt = common::runtime();
    let fixed = fixed_gamma(3);
    let cases: [(&str, Option<LoadedDrafter>, GammaPolicy); 3] = [
        ("plain", None, GammaPolicy::Off),
        (
            "prompt lookup",
            Some(LoadedDrafter::PromptLookup(PromptLookup::default())),
            fixed,
        ),
        (
            "draft model",
            Some(LoadedDrafter::Model {
                model: Arc::clone(&f16),
                vocab: None,
                translation: None,
                lookup: None,
                name: "f16 copy".into(),
                self_layers: false,
            }),
            fixed,
        ),
    ];
    for (name, draft, gamma) in cases {
        let off = start(&rt, &target, draft.clone(), false, 4);
        let (want, prefilled_off) = workload(&rt, &off, &tok, gamma);
        drop(off);
        let on = start(&rt, &target, draft, true, 4);
        let (got, prefilled_on) = workload(&rt, &on, &tok, gamma);
        for (i, ((g, cached), (w, none))) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "{name}: request {i}");
            assert_eq!(*none, 0, "{name}: nothing is cached with the cache off");
            // After the first request, every prompt starts with cached text: a later turn from
            // the earlier turn's cache, concurrent requests from each other's system prompt,
            // and the second round from the first round's stored texts.
            if i > 0 {
                assert!(
                    *cached > 0,
                    "{name}: request {i} took nothing from the cache"
                );
            }
        }
        assert!(
            prefilled_on * 2 < prefilled_off,
            "{name}: the target ran {prefilled_on} prompt tokens with the cache, {prefilled_off} without"
        );
        if gamma != GammaPolicy::Off {
            assert!(
                got.iter().any(|(o, _)| o.speculation.2 > 0),
                "{name}: nothing accepted"
            );
        }
        let stats = rt.block_on(on.cache_stats()).unwrap();
        assert!(stats.idle(), "{name}: {stats:?}");
        assert!(stats.prefix_tokens > 0, "{name}: {stats:?}");
        assert!(
            stats.prefix_bytes <= stats.prefix_budget_bytes,
            "{name}: {stats:?}"
        );
    }
}

/// Tokens of a tree holding every text: each distinct prefix once.
fn tree_tokens(texts: &[Vec<u32>]) -> usize {
    let mut prefixes = std::collections::HashSet::new();
    for t in texts {
        for n in 1..=t.len() {
            prefixes.insert(&t[..n]);
        }
    }
    prefixes.len()
}

/// More distinct prompts than slots, all starting alike: the cache stores every finished text
/// with their common start once, finds the most recent and the oldest alike, and gives the same
/// output as without it; a budget of 1 MiB keeps what fits and evicts the rest; clearing it
/// starts cold; a KV budget for one request at a time leaves it whole (its memory is its own).
#[test]
fn the_prefix_cache_holds_what_its_memory_budget_allows() {
    let loaded = common::load_default(WeightsDtype::AsIs);
    let tok = Arc::clone(&loaded.tokenizer);
    let target = Arc::new(loaded.model);
    let rt = common::runtime();
    let prompts: Vec<Vec<u32>> = (0..5)
        .map(|i| {
            render(
                &tok,
                &[ChatMessage::new(
                    "user",
                    format!("Write a line of poetry about the number {i}."),
                )],
            )
        })
        .collect();
    let run = |engine: &Engine, p: &[u32]| -> Completion {
        let req = EngineRequest {
            logprobs: Some(2),
            ..engine_request(greedy_request(p.to_vec(), 12, &[]), GammaPolicy::Off)
        };
        rt.block_on(async { engine.submit(req).await?.collect().await })
            .unwrap()
    };
    let engine = |mib: Option<usize>, kv: Option<usize>| {
        rt.block_on(Engine::start(
            Arc::clone(&target),
            None,
            EngineConfig {
                max_seqs: 2,
                prefix_cache: true,
                prefix_cache_mib: mib,
                kv_capacity_tokens: kv,
                ..Default::default()
            },
        ))
        .unwrap()
    };
    let off = start(&rt, &target, None, false, 2);
    let want: Vec<Vec<u32>> = prompts.iter().map(|p| run(&off, p).tokens).collect();
    // What a finished sequence's cache holds: its prompt and all its output but the last token.
    let texts: Vec<Vec<u32>> = prompts
        .iter()
        .zip(&want)
        .map(|(p, w)| [p.as_slice(), &w[..w.len() - 1]].concat())
        .collect();
    let on = engine(None, None);
    for (i, (p, w)) in prompts.iter().zip(&want).enumerate() {
        assert_eq!(&run(&on, p).tokens, w);
        let stats = rt.block_on(on.cache_stats()).unwrap();
        assert!(stats.idle(), "{stats:?}");
        assert_eq!(stats.prefix_tokens, tree_tokens(&texts[..=i]), "{stats:?}");
    }
    // Two slots, five texts: the most recent and the oldest are both found whole.
    for i in [4, 0] {
        let again = run(&on, &prompts[i]);
        assert_eq!(again.tokens, want[i]);
        assert_eq!(again.usage.cached_tokens, prompts[i].len() - 1);
    }
    // Clearing it (what a benchmark does between modes): the same prompt starts cold.
    rt.block_on(on.clear_prefix_cache()).unwrap();
    let stats = rt.block_on(on.cache_stats()).unwrap();
    assert_eq!(
        (stats.prefix_tokens, stats.prefix_bytes),
        (0, 0),
        "{stats:?}"
    );
    let cold = run(&on, &prompts[0]);
    assert_eq!(
        (cold.tokens.as_slice(), cold.usage.cached_tokens),
        (want[0].as_slice(), 0)
    );

    // 1 MiB holds a few dozen of this model's tokens: what fits is kept, the rest evicted.
    let small = engine(Some(1), None);
    let mut room = usize::MAX;
    for (i, (p, w)) in prompts.iter().zip(&want).enumerate() {
        let got = run(&small, p);
        assert_eq!(&got.tokens, w);
        let stats = rt.block_on(small.cache_stats()).unwrap();
        assert_eq!(stats.prefix_budget_bytes, 1 << 20);
        assert!(stats.prefix_bytes <= stats.prefix_budget_bytes, "{stats:?}");
        room = room.min(stats.prefix_budget_bytes / (stats.prefix_bytes / stats.prefix_tokens));
        assert!(room < texts[0].len(), "the budget is smaller than one text");
        if i > 0 {
            let shared = common_prefix(p, &texts[i - 1]).min(room);
            assert!(
                (shared..=room).contains(&got.usage.cached_tokens),
                "request {i}: {} cached, {shared} shared, room for {room}",
                got.usage.cached_tokens
            );
        }
    }

    // A KV budget for one request at a time: requests wait for each other's room, and the
    // prefix cache still serves every one of them.
    let tight = engine(None, Some(prompts[0].len() + 12 + 8 + 1 + 4));
    for (i, (p, w)) in prompts.iter().zip(&want).enumerate() {
        let got = run(&tight, p);
        assert_eq!(&got.tokens, w);
        if i > 0 {
            assert!(got.usage.cached_tokens >= common_prefix(p, &prompts[i - 1]));
        }
    }
    let stats = rt.block_on(tight.cache_stats()).unwrap();
    assert!(
        stats.idle() && stats.reserved_tokens <= stats.capacity_tokens,
        "{stats:?}"
    );
}

/// The cross-request drafter (`suffix`): a question asked again drafts the earlier answer from
/// the store and has it accepted, where prompt lookup, seeing only the request's own text,
/// drafts far less; every output is plain decoding's.
#[test]
fn a_repeated_request_drafts_the_earlier_answer() {
    let loaded = common::load_default(WeightsDtype::AsIs);
    let tok = Arc::clone(&loaded.tokenizer);
    let target = Arc::new(loaded.model);
    let rt = common::runtime();
    let prompt = render(
        &tok,
        &[ChatMessage::new(
            "user",
            "Give three tips for staying focused while studying.",
        )],
    );
    let plain = start(&rt, &target, None, true, 2);
    let run = |engine: &Engine, gamma: GammaPolicy| -> Completion {
        let req = EngineRequest {
            logprobs: Some(2),
            ..engine_request(greedy_request(prompt.clone(), 64, &[]), gamma)
        };
        rt.block_on(async { engine.submit(req).await?.collect().await })
            .unwrap()
    };
    let want = run(&plain, GammaPolicy::Off).tokens;
    let fixed = fixed_gamma(4);
    let mut accepted = Vec::new();
    for lookup in [
        PromptLookup::default(),
        PromptLookup::default().across_requests(),
    ] {
        let engine = start(
            &rt,
            &target,
            Some(LoadedDrafter::PromptLookup(lookup)),
            true,
            2,
        );
        let first = run(&engine, fixed);
        let again = run(&engine, fixed);
        assert_eq!(first.tokens, want);
        assert_eq!(again.tokens, want);
        accepted.push(again.usage.speculative.accepted_tokens);
    }
    let (own_text, across) = (accepted[0], accepted[1]);
    assert!(
        across >= want.len() * 3 / 4,
        "the earlier answer is drafted and kept: {across} of {} tokens",
        want.len()
    );
    assert!(
        across > own_text,
        "prompt lookup alone accepted {own_text}, across requests {across}"
    );
}
