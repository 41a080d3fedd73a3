//! Structured outputs in the engine: constrained greedy output is the same token for token
//! with speculation on (both drafters, fixed and governed γ, trees asked for, pipelined or
//! not, alone and 4 at once) as with it off, the output matches its grammar, and the grammar's
//! forced tokens were drafted and stood. On the tiny models and on the real default model.
//! (Sampled constrained output: `tests/sampled_distribution.rs`; the HTTP fields and their
//! refusals: `tests/server.rs` and `tests/openai_client.py`.)

use crate::common;

use std::sync::Arc;

use common::{complete_together, engine_request, fixed_gamma, greedy_request, TinySpec};
use tandem::constraint::{ConstraintSpec, ConstraintVocabulary};
use tandem::draft::LoadedDrafter;
use tandem::draft::PromptLookup;
use tandem::engine::{Engine, EngineConfig, EngineRequest, GammaPolicy, TreeNodes};
use tandem::model::{Decoder, TextTokenizer, WeightsDtype};

fn text(tok: &TextTokenizer, tokens: &[u32], eos: &[u32]) -> String {
    let body: Vec<u32> = tokens
        .iter()
        .copied()
        .filter(|t| !eos.contains(t))
        .collect();
    tok.decode(&body).unwrap()
}

/// Whether `s` is `{"a": N, "b": "W"}` with N 1 to 3 digits and W 1 to 6 lowercase letters.
fn matches_record(s: &str) -> bool {
    let Some(rest) = s.strip_prefix("{\"a\": ") else {
        return false;
    };
    let digits = rest.chars().take_while(char::is_ascii_digit).count();
    let Some(rest) = rest[digits..].strip_prefix(", \"b\": \"") else {
        return false;
    };
    let letters = rest.chars().take_while(char::is_ascii_lowercase).count();
    (1..=3).contains(&digits) && (1..=6).contains(&letters) && &rest[letters..] == "\"}"
}

#[test]
fn constrained_greedy_output_is_identical_with_speculation_and_forced_tokens_stand() {
    let (d1, target) = (tempfile::tempdir().unwrap(), TinySpec::untied(7));
    common::write_tiny_llama(d1.path(), &target);
    let loaded = common::load_tiny(d1.path(), WeightsDtype::F32);
    let blend_dir = tempfile::tempdir().unwrap();
    common::write_tiny_blend(d1.path(), &TinySpec::untied(99), 0.4, blend_dir.path());
    let blend = Arc::new(common::load_tiny(blend_dir.path(), WeightsDtype::F32).model);
    let tok = Arc::clone(&loaded.tokenizer);
    let eos = tok.eos_ids().to_vec();
    let target: Arc<Decoder> = Arc::new(loaded.model);
    let vocab = ConstraintVocabulary::new(Arc::clone(&tok), target.hparams().vocab_size).unwrap();
    let grammar = ConstraintSpec::Lark(
        "start: \"{\\\"a\\\": \" NUM \", \\\"b\\\": \" WORD \"}\"\nNUM: /[0-9]{1,3}/\nWORD: /\"[a-z]{1,6}\"/\n"
            .into(),
    );
    let constraint = vocab.compile(&grammar).unwrap();
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|i| {
            let a = common::random_tokens(300 + i, 6 + 5 * i as usize, 256);
            [a.clone(), a].concat()
        })
        .collect();
    let rt = common::runtime();
    let cfg = |pipeline: bool| EngineConfig {
        max_seqs: 4,
        prefill_chunk: 16,
        pipeline,
        target_threads: if pipeline { 1 } else { 2 },
        draft_threads: if pipeline { 1 } else { 2 },
        ..Default::default()
    };
    // Constrained plain decoding: no drafter, speculation off (no forced drafts either).
    let plain_engine = rt
        .block_on(Engine::start(Arc::clone(&target), None, cfg(false)))
        .unwrap();
    let reqs = prompts
        .iter()
        .map(|p| EngineRequest {
            constraint: Some(constraint.clone()),
            ..engine_request(greedy_request(p.clone(), 48, &eos), GammaPolicy::Off)
        })
        .collect();
    let want = complete_together(&rt, &plain_engine, reqs);
    for c in &want {
        let s = text(&tok, &c.tokens, &eos);
        assert!(matches_record(&s), "plain constrained output {s:?}");
        assert_eq!(c.usage.speculative.forced_tokens, 0);
    }
    // With logprobs, every row's mask is computed before the forward instead of each row's
    // argmax checked against the grammar after it (this random model's argmax is refused at
    // most rows): the same tokens.
    let reqs = prompts
        .iter()
        .map(|p| EngineRequest {
            logprobs: Some(1),
            constraint: Some(constraint.clone()),
            ..engine_request(greedy_request(p.clone(), 48, &eos), GammaPolicy::Off)
        })
        .collect();
    for (c, w) in complete_together(&rt, &plain_engine, reqs)
        .iter()
        .zip(&want)
    {
        assert_eq!(c.tokens, w.tokens, "masked rows against checked argmaxes");
    }
    drop(plain_engine);

    let sources = [
        (
            "prompt-lookup",
            LoadedDrafter::PromptLookup(PromptLookup::default()),
        ),
        (
            "model",
            LoadedDrafter::Model {
                model: blend,
                vocab: None,
                translation: None,
                lookup: None,
                name: "tiny-blend".into(),
                self_layers: false,
            },
        ),
    ];
    for (name, source) in sources {
        for pipeline in [false, true] {
            let engine = rt
                .block_on(Engine::start(
                    Arc::clone(&target),
                    Some(source.clone()),
                    cfg(pipeline),
                ))
                .unwrap();
            for n in [1usize, 4] {
                for gamma in [fixed_gamma(3), GammaPolicy::Adaptive] {
                    let (mut forced, mut forced_accepted) = (0, 0);
                    for (ci, chunk) in prompts.chunks(n).enumerate() {
                        let reqs = chunk
                            .iter()
                            .enumerate()
                            .map(|(j, p)| {
                                let mut r = EngineRequest {
                                    constraint: Some(constraint.clone()),
                                    ..engine_request(greedy_request(p.clone(), 48, &eos), gamma)
                                };
                                // Half the requests' rows are masked before the forward
                                // (logprobs), half have their argmaxes checked after it.
                                if (ci + j) % 2 == 0 {
                                    r.logprobs = Some(0);
                                }
                                if j % 2 == 1 {
                                    r.speculative.tree_nodes =
                                        Some(TreeNodes::within(4, 8).unwrap());
                                }
                                r
                            })
                            .collect();
                        for (j, c) in complete_together(&rt, &engine, reqs).iter().enumerate() {
                            let i = ci * n + j;
                            assert_eq!(
                                c.tokens, want[i].tokens,
                                "prompt {i}, {name}, pipeline {pipeline}, {n} at once, {gamma:?}"
                            );
                            forced += c.usage.speculative.forced_tokens;
                            forced_accepted += c.usage.speculative.forced_accepted;
                        }
                    }
                    // Every forced token stands here: the grammar leaves one token at each.
                    assert!(forced > 0, "{name}: no forced drafts");
                    assert_eq!(forced_accepted, forced, "{name}, {gamma:?}");
                }
            }
            let stats = rt.block_on(engine.cache_stats()).unwrap();
            assert!(stats.idle(), "every slot returned: {stats:?}");
        }
    }
}

/// The real model under a JSON schema: speculation with prompt lookup (and forced tokens)
/// gives the plain constrained output, which parses and has the schema's shape.
#[test]
fn real_model_json_schema_output_is_identical_with_speculation() {
    let loaded = common::load_default(WeightsDtype::Q4_1);
    let tok = Arc::clone(&loaded.tokenizer);
    let eos = tok.eos_ids().to_vec();
    let target = Arc::new(loaded.model);
    let vocab = ConstraintVocabulary::new(Arc::clone(&tok), target.hparams().vocab_size).unwrap();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
        },
        "required": ["name", "age", "pets"],
        "additionalProperties": false,
    });
    let constraint = vocab
        .compile(&ConstraintSpec::JsonSchema(schema, Default::default()))
        .unwrap();
    let template = tok.chat_template().unwrap();
    let prompts: Vec<Vec<u32>> = [
        "Describe Ann, 31, who has a cat, as JSON.",
        "Describe Bob, a 40 year old with two dogs, as JSON.",
    ]
    .iter()
    .map(|q| {
        let text = template
            .render(&[tandem::model::ChatMessage::new("user", *q)], true)
            .unwrap();
        tok.encode(&text, true).unwrap()
    })
    .collect();
    let rt = common::runtime();
    let engine = |source: Option<LoadedDrafter>| {
        rt.block_on(Engine::start(
            Arc::clone(&target),
            source,
            EngineConfig {
                max_seqs: 2,
                ..Default::default()
            },
        ))
        .unwrap()
    };
    let plain = engine(None);
    let reqs = prompts
        .iter()
        .map(|p| EngineRequest {
            constraint: Some(constraint.clone()),
            ..engine_request(greedy_request(p.clone(), 80, &eos), GammaPolicy::Off)
        })
        .collect();
    let want = complete_together(&rt, &plain, reqs);
    // Masked rows (logprobs asked for) and checked argmaxes give the same output.
    let reqs = prompts
        .iter()
        .map(|p| EngineRequest {
            logprobs: Some(0),
            constraint: Some(constraint.clone()),
            ..engine_request(greedy_request(p.clone(), 80, &eos), GammaPolicy::Off)
        })
        .collect();
    for (c, w) in complete_together(&rt, &plain, reqs).iter().zip(&want) {
        assert_eq!(c.tokens, w.tokens, "masked rows against checked argmaxes");
    }
    drop(plain);
    for c in &want {
        let v: serde_json::Value = serde_json::from_str(&text(&tok, &c.tokens, &eos)).unwrap();
        assert!(
            v["name"].is_string() && v["age"].is_u64() && v["pets"].is_array(),
            "{v}"
        );
    }
    let spec = engine(Some(LoadedDrafter::PromptLookup(PromptLookup::default())));
    let reqs = prompts
        .iter()
        .map(|p| EngineRequest {
            constraint: Some(constraint.clone()),
            ..engine_request(greedy_request(p.clone(), 80, &eos), fixed_gamma(3))
        })
        .collect();
    let got = complete_together(&rt, &spec, reqs);
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.tokens, w.tokens);
        let s = &g.usage.speculative;
        assert!(
            s.forced_accepted > 0 && s.forced_accepted <= s.forced_tokens,
            "{s:?}"
        );
    }
}

/// A greedy row checks only its argmax against the grammar (computing the mask where the
/// grammar refuses it), so that check must agree with the mask: for every token of the real
/// vocabulary, at every state along seeded random walks through a JSON schema (flexible
/// whitespace), a tool-call grammar, a regex and choices (which end in the grammar's stop).
#[test]
fn a_single_token_check_agrees_with_the_mask_for_every_token() {
    use tandem::constraint::tools::{Tool, ToolChoice, Tools};
    let loaded = common::load_default(WeightsDtype::Q4_1);
    let tok = Arc::clone(&loaded.tokenizer);
    let vocab_size = loaded.model.hparams().vocab_size;
    let vocab = ConstraintVocabulary::new(Arc::clone(&tok), vocab_size).unwrap();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "topic": {"type": "string", "maxLength": 12},
            "n": {"type": "integer"},
            "level": {"enum": ["low", "high"]},
        },
        "required": ["topic", "n", "level"],
        "additionalProperties": false,
    });
    let tools = Tools::new(
        vec![Tool {
            name: "search".into(),
            description: None,
            parameters: serde_json::json!({"type": "object",
                "properties": {"q": {"type": "string", "maxLength": 8}}, "required": ["q"]}),
        }],
        ToolChoice::Required,
        false,
    );
    let specs = [
        ConstraintSpec::JsonSchema(schema, Default::default()),
        tools.constraint(&Default::default()).unwrap(),
        ConstraintSpec::Regex("[a-c]{2,4}-(x|yz)".into()),
        ConstraintSpec::Choice(vec!["yes".into(), "no".into(), "maybe so".into()]),
    ];
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let (mut states, mut stopped) = (0, 0);
    for spec in &specs {
        let mut g = vocab.compile(spec).unwrap().start();
        for _step in 0..24 {
            let mask = g.mask().unwrap();
            let mut allowed = Vec::new();
            for t in 0..vocab_size as u32 {
                let want = mask.allows(t);
                assert_eq!(g.allows(t).unwrap(), want, "{spec:?}: token {t}");
                if want {
                    allowed.push(t);
                }
            }
            states += 1;
            assert!(!allowed.is_empty(), "{spec:?}: nothing allowed");
            if allowed.iter().all(|t| tok.eos_ids().contains(t)) {
                stopped += 1;
                break;
            }
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let next = allowed[(seed % allowed.len() as u64) as usize];
            g.advance(&[next]).unwrap();
        }
    }
    assert!(states >= 40, "{states} states checked");
    assert!(
        stopped >= 2,
        "walks that reached their grammar's end: {stopped}"
    );
}
