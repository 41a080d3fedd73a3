//! Logprobs and several choices of one request, through the actor engine on the real default
//! model: the target's log-probabilities of the emitted tokens are the same bits with
//! speculation on and off (greedy and sampled, every drafter, every γ), the prompt's
//! log-probabilities score a text exactly as generating it did, and the choices of one request
//! (sharing its prefill) equal lone requests, seeded ones included.

use crate::common;

use std::sync::Arc;

use common::{chat_prompt, engine_request, fixed_gamma, generation_request, greedy_request};
use tandem::draft::LoadedDrafter;
use tandem::draft::PromptLookup;
use tandem::engine::{Completion, Engine, EngineConfig, EngineRequest, GammaPolicy};
use tandem::model::{Decoder, WeightsDtype};
use tandem::sampling::{SamplingParams, TokenLogprob};

const TOP: usize = 5;

fn start(
    rt: &tokio::runtime::Runtime,
    target: &Arc<Decoder>,
    draft: Option<LoadedDrafter>,
) -> Engine {
    rt.block_on(Engine::start(
        Arc::clone(target),
        draft,
        EngineConfig {
            max_seqs: 4,
            prefill_chunk: 64,
            ..Default::default()
        },
    ))
    .unwrap()
}

fn run(rt: &tokio::runtime::Runtime, engine: &Engine, req: EngineRequest) -> Completion {
    rt.block_on(async { engine.submit(req).await?.collect().await })
        .unwrap()
}

/// Bit for bit: the token, its logprob and every alternative with its logprob.
fn assert_same_logprobs(got: &[TokenLogprob], want: &[TokenLogprob], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.token, w.token, "{what}: token {i}");
        assert_eq!(
            g.logprob.to_bits(),
            w.logprob.to_bits(),
            "{what}: token {i}"
        );
        let bits = |t: &TokenLogprob| -> Vec<(u32, u32)> {
            t.top.iter().map(|&(id, l)| (id, l.to_bits())).collect()
        };
        assert_eq!(bits(g), bits(w), "{what}: alternatives of token {i}");
    }
}

/// Greedy with every processor that changes logits (penalties, a logit bias), every drafter and
/// every γ the engine allows (1..8): the same tokens and the same logprob bits as plain
/// decoding, one entry per token, the alternatives sorted with the chosen token first.
#[test]
fn greedy_logprobs_are_the_same_bits_with_speculation_on_and_off() {
    let loaded = common::load_default(WeightsDtype::AsIs);
    let prompt = chat_prompt(
        &loaded,
        "List the planets of the solar system, then list them again.",
    );
    let target = Arc::new(loaded.model);
    let f16 = Arc::new(common::load_default(WeightsDtype::F16).model);
    let rt = common::runtime();
    let greedy = SamplingParams {
        repetition_penalty: 1.1,
        presence_penalty: 0.3,
        frequency_penalty: 0.2,
        logit_bias: vec![(28, 1.5), (30, -2.0)],
        ..Default::default()
    };
    let plain_engine = start(&rt, &target, None);
    let want = run(
        &rt,
        &plain_engine,
        EngineRequest {
            logprobs: Some(TOP),
            ..engine_request(
                generation_request(prompt.clone(), 48, greedy.clone(), &[]),
                GammaPolicy::Off,
            )
        },
    );
    assert_eq!(want.logprobs.len(), want.tokens.len());
    for (t, lp) in want.tokens.iter().zip(&want.logprobs) {
        assert_eq!(*t, lp.token);
        assert_eq!(lp.top.len(), TOP);
        assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
        assert_eq!(
            lp.top[0],
            (*t, lp.logprob),
            "greedy picks the most likely token"
        );
        assert!(lp.logprob <= 0.0);
    }
    // The processors are in the numbers: the raw model scores the same text otherwise.
    let raw = EngineRequest {
        logprobs: Some(TOP),
        prompt_logprobs: Some(TOP),
        ..engine_request(
            greedy_request([prompt.as_slice(), &want.tokens].concat(), 1, &[]),
            GammaPolicy::Off,
        )
    };
    let raw = run(&rt, &plain_engine, raw);
    let differ = want
        .logprobs
        .iter()
        .zip(&raw.prompt_logprobs[prompt.len() - 1..])
        .filter(|(a, b)| a.logprob != b.logprob)
        .count();
    assert!(
        differ > want.tokens.len() / 2,
        "{differ} differ from the raw model"
    );
    for (name, source) in drafters(&f16) {
        let engine = start(&rt, &target, Some(source));
        let (mut drafted, mut accepted) = (0, 0);
        for g in 1..=8 {
            let got = run(
                &rt,
                &engine,
                EngineRequest {
                    logprobs: Some(TOP),
                    ..engine_request(
                        generation_request(prompt.clone(), 48, greedy.clone(), &[]),
                        fixed_gamma(g),
                    )
                },
            );
            let what = format!("{name}, γ {g}");
            drafted += got.usage.speculative.draft_tokens;
            accepted += got.usage.speculative.accepted_tokens;
            assert_eq!(got.tokens, want.tokens, "{what}");
            assert_same_logprobs(&got.logprobs, &want.logprobs, &what);
        }
        assert!(
            accepted > 0 && accepted < drafted,
            "{name}: {accepted} of {drafted} drafts accepted; both outcomes must occur"
        );
    }
}

/// Prompt lookup, and the same file at f16 drafting for its Q4_1 self (a draft model that
/// mostly agrees with the target, so both accepted and rejected drafts occur).
fn drafters(f16: &Arc<Decoder>) -> [(&'static str, LoadedDrafter); 2] {
    [
        (
            "prompt-lookup",
            LoadedDrafter::PromptLookup(PromptLookup::default()),
        ),
        (
            "f16 copy",
            LoadedDrafter::Model {
                model: Arc::clone(f16),
                vocab: None,
                translation: None,
                lookup: None,
                name: "f16 copy".into(),
                self_layers: false,
            },
        ),
    ]
}

/// Sampled speculative output is its own draw, so its logprobs are checked against scoring
/// that text: a plain prefill of prompt + output reports the prompt's logprobs (another
/// forward width, another code path), which must equal the generated tokens' bits. Without
/// penalties or bias, the two are the same distribution. Temperature and top-k do not enter
/// logprobs.
#[test]
fn sampled_logprobs_equal_scoring_the_output_as_a_prompt() {
    let loaded = common::load_default(WeightsDtype::AsIs);
    let prompt = chat_prompt(&loaded, "Write a short poem about rivers.");
    let target = Arc::new(loaded.model);
    let f16 = Arc::new(common::load_default(WeightsDtype::F16).model);
    let rt = common::runtime();
    let sampled = SamplingParams {
        temperature: 0.8,
        top_k: 40,
        seed: Some(11),
        ..Default::default()
    };
    let plain_engine = start(&rt, &target, None);
    let score = |tokens: &[u32]| -> Vec<TokenLogprob> {
        let req = EngineRequest {
            logprobs: Some(TOP),
            prompt_logprobs: Some(TOP),
            ..engine_request(
                greedy_request([prompt.as_slice(), tokens].concat(), 1, &[]),
                GammaPolicy::Off,
            )
        };
        let scored = run(&rt, &plain_engine, req);
        assert_eq!(
            scored.prompt_logprobs.len(),
            prompt.len() + tokens.len() - 1
        );
        scored.prompt_logprobs[prompt.len() - 1..].to_vec()
    };
    let plain = run(
        &rt,
        &plain_engine,
        EngineRequest {
            logprobs: Some(TOP),
            ..engine_request(
                generation_request(prompt.clone(), 40, sampled.clone(), &[]),
                GammaPolicy::Off,
            )
        },
    );
    assert_same_logprobs(&plain.logprobs, &score(&plain.tokens), "plain");
    for (name, source) in drafters(&f16) {
        let engine = start(&rt, &target, Some(source));
        for g in [1, 3] {
            let got = run(
                &rt,
                &engine,
                EngineRequest {
                    logprobs: Some(TOP),
                    ..engine_request(
                        generation_request(prompt.clone(), 40, sampled.clone(), &[]),
                        fixed_gamma(g),
                    )
                },
            );
            assert!(got.usage.speculative.draft_tokens > 0);
            let what = format!("{name}, γ {g}");
            assert_same_logprobs(&got.logprobs, &score(&got.tokens), &what);
        }
    }
}

/// Three choices of one request: the prompt is prefilled once (the others copy its cache and
/// feed its last token), greedy choices all equal the lone greedy output, seeded choice i
/// equals a lone request seeded `seed + i` token for token and logprob for logprob, prompt
/// logprobs included, and every slot comes back.
#[test]
fn choices_share_the_prefill_and_equal_lone_requests() {
    let loaded = common::load_default(WeightsDtype::AsIs);
    let prompt = chat_prompt(&loaded, "Name three colours and say why you like them.");
    let target = Arc::new(loaded.model);
    let rt = common::runtime();
    let engine = start(
        &rt,
        &target,
        Some(LoadedDrafter::PromptLookup(PromptLookup::default())),
    );
    let sampled = SamplingParams {
        temperature: 0.9,
        seed: Some(40),
        ..Default::default()
    };
    for (sampling, gamma) in [
        (SamplingParams::greedy(), fixed_gamma(2)),
        (sampled.clone(), fixed_gamma(2)),
        (sampled.clone(), GammaPolicy::Off),
    ] {
        let req = EngineRequest {
            logprobs: Some(TOP),
            prompt_logprobs: Some(TOP),
            ..engine_request(
                generation_request(prompt.clone(), 32, sampling.clone(), &[]),
                gamma,
            )
        };
        let before = rt.block_on(engine.stats()).unwrap().prefilled_tokens;
        let choices: Vec<Completion> = rt.block_on(async {
            let streams = engine.submit_choices(req.clone(), 3).await.unwrap();
            let mut out = Vec::new();
            for s in streams {
                out.push(s.collect().await.unwrap());
            }
            out
        });
        let prefilled = rt.block_on(engine.stats()).unwrap().prefilled_tokens - before;
        assert_eq!(
            prefilled,
            prompt.len() as u64 + 2,
            "one prefill, then one token for each other choice"
        );
        for (i, c) in choices.iter().enumerate() {
            let mut lone = req.clone();
            lone.generation.sampling.seed = sampling.seed.map(|s| s + i as u64);
            let want = run(&rt, &engine, lone);
            let what = format!("choice {i}, greedy {}", sampling.is_greedy());
            assert_eq!(c.tokens, want.tokens, "{what}");
            assert_same_logprobs(&c.logprobs, &want.logprobs, &what);
            assert_same_logprobs(&c.prompt_logprobs, &want.prompt_logprobs, &what);
            assert_eq!(c.prompt_logprobs.len(), prompt.len() - 1);
            assert_eq!(c.usage.prompt_tokens, prompt.len());
        }
        if sampling.is_greedy() {
            assert!(choices.iter().all(|c| c.tokens == choices[0].tokens));
        } else {
            assert_ne!(
                choices[0].tokens, choices[1].tokens,
                "each choice draws its own"
            );
        }
    }
    // A request's slots are back before its last event is sent.
    let stats = rt.block_on(engine.cache_stats()).unwrap();
    assert!(stats.idle(), "every slot returned: {stats:?}");
    // More choices than the engine decodes together is refused before any work.
    let err = rt
        .block_on(engine.submit_choices(
            EngineRequest {
                logprobs: Some(TOP),
                ..engine_request(greedy_request(prompt, 4, &[]), fixed_gamma(1))
            },
            5,
        ))
        .err()
        .expect("5 choices on 4 slots");
    assert!(err.to_string().contains("choices"), "{err}");
}
