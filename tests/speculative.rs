//! Greedy speculative decoding equals plain greedy decoding token for token, for both drafters
//! and every γ in 1..8, on tiny random models and on the real default model over Spec-Bench dev
//! prompts; stop conditions and the context limit hold inside rounds.

use crate::common;

use common::{greedy_request, plain_output};
use tandem::draft::{ModelDrafter, PromptLookup, Proposer};
use tandem::engine::{
    generate_speculative, FinishReason, FixedSpeculation, Gamma, GenerationOutput,
    GenerationRequest,
};
use tandem::model::{Decoder, WeightsDtype};
use tandem::sampling::Lenience;

fn plain(target: &Decoder, req: &GenerationRequest) -> (Vec<u32>, FinishReason) {
    let out = plain_output(target, req);
    (out.tokens, out.finish)
}

fn speculative(
    target: &Decoder,
    drafter: &mut dyn Proposer,
    req: &GenerationRequest,
    gamma: usize,
) -> (Vec<u32>, FinishReason, tandem::engine::SpeculationStats) {
    let (out, stats) = speculative_output(target, drafter, req, gamma);
    (out.tokens, out.finish, stats)
}

/// Speculative output plus the text streamed through the callback.
fn speculative_output(
    target: &Decoder,
    drafter: &mut dyn Proposer,
    req: &GenerationRequest,
    gamma: usize,
) -> (GenerationOutput, tandem::engine::SpeculationStats) {
    let mut cache = target.new_cache(1);
    let spec = FixedSpeculation {
        gamma: Gamma::try_from(gamma).unwrap(),
        lenience: Lenience::EXACT,
    };
    let mut streamed = String::new();
    let mut streamed_tokens = Vec::new();
    let (out, stats) = generate_speculative(target, &mut cache, drafter, req, spec, &mut |p| {
        streamed.push_str(p.text);
        streamed_tokens.extend(p.token);
        true
    })
    .unwrap();
    assert_eq!(cache.free_slots(), 1);
    assert!(stats.accepted_tokens <= stats.draft_tokens);
    assert_eq!(
        streamed_tokens, out.tokens,
        "streamed tokens = returned tokens"
    );
    if let Some(text) = &out.text {
        assert_eq!(&streamed, text, "streamed text = returned text");
    }
    (out, stats)
}

/// Untied output head: with tied embeddings a random tiny model's greedy output just repeats its
/// input token (its own embedding scores highest), which would accept every draft trivially.
fn spec(seed: u64) -> common::TinySpec {
    common::TinySpec {
        tied: false,
        seed,
        ..Default::default()
    }
}

/// A prompt with repeated stretches so prompt lookup finds matches.
fn repetitive_prompt(seed: u64, vocab: usize) -> Vec<u32> {
    let a = common::random_tokens(seed, 12, vocab);
    let b = common::random_tokens(seed + 1, 7, vocab);
    [a.clone(), b.clone(), a, b].concat()
}

#[test]
fn tiny_models_every_gamma_both_drafters() {
    let dir = tempfile::tempdir().unwrap();
    common::write_tiny_llama(dir.path(), &spec(7));
    let draft_dir = tempfile::tempdir().unwrap();
    // Weights partly another model's: a drafter that often disagrees with the target.
    common::write_tiny_blend(dir.path(), &spec(99), 0.3, draft_dir.path());
    let target = common::load_tiny(dir.path(), WeightsDtype::F32);
    let draft = common::load_tiny(draft_dir.path(), WeightsDtype::Q8_0);
    let self_draft = common::load_tiny(dir.path(), WeightsDtype::Q4_0);
    // Per drafter: drafts accepted, drafts rejected.
    let mut seen: std::collections::BTreeMap<String, (usize, usize)> = Default::default();
    for seed in 0..3u64 {
        let req = greedy_request(repetitive_prompt(seed * 10, 256), 40, &[]);
        let (want, _) = plain(&target.model, &req);
        for gamma in 1..=8 {
            let drafters: Vec<Box<dyn Proposer + '_>> = vec![
                Box::new(ModelDrafter::new(&draft.model, "tiny-other")),
                Box::new(ModelDrafter::new(&self_draft.model, "tiny-self-q4_0")),
                Box::new(PromptLookup::default()),
            ];
            for mut d in drafters {
                let (got, _, stats) = speculative(&target.model, d.as_mut(), &req, gamma);
                assert_eq!(got, want, "drafter {} γ={gamma} seed={seed}", d.name());
                let s = seen.entry(d.name()).or_default();
                s.0 += stats.accepted_tokens;
                s.1 += stats.draft_tokens - stats.accepted_tokens;
            }
        }
    }
    // Each drafter's output was checked through both branches of the rule, not just one.
    assert_eq!(seen.len(), 3);
    for (name, (accepted, rejected)) in &seen {
        assert!(
            *accepted > 0 && *rejected > 0,
            "{name}: {accepted} drafts accepted, {rejected} rejected"
        );
    }
}

#[test]
fn stops_inside_rounds_and_respects_limits() {
    let dir = tempfile::tempdir().unwrap();
    common::write_tiny_llama(dir.path(), &spec(7));
    let target = common::load_tiny(dir.path(), WeightsDtype::F32);
    let self_draft = common::load_tiny(dir.path(), WeightsDtype::F32);
    let prompt = repetitive_prompt(5, 256);
    let (free_run, _) = plain(&target.model, &greedy_request(prompt.clone(), 30, &[]));
    // An EOS in the middle of the output: everything after it is never emitted, even though an
    // identical self-drafter gets whole rounds accepted.
    let eos = free_run[9];
    let first = free_run.iter().position(|&t| t == eos).unwrap();
    let req = greedy_request(prompt.clone(), 30, &[eos]);
    for gamma in [1, 4, 8] {
        let mut d = ModelDrafter::new(&self_draft.model, "self");
        let (got, finish, stats) = speculative(&target.model, &mut d, &req, gamma);
        assert_eq!(got, free_run[..=first].to_vec(), "γ={gamma}");
        assert_eq!(finish, FinishReason::Stop);
        assert!(
            stats.acceptance_rate() > 0.99,
            "identical drafter accepts everything: {stats:?} {free_run:?}"
        );
    }
    // max_tokens is never exceeded, whatever γ.
    for (max, gamma) in [(1, 8), (3, 8), (7, 4)] {
        let mut d = ModelDrafter::new(&self_draft.model, "self");
        let (got, finish, _) = speculative(
            &target.model,
            &mut d,
            &greedy_request(prompt.clone(), max, &[]),
            gamma,
        );
        assert_eq!(got, free_run[..max].to_vec());
        assert_eq!(finish, FinishReason::Length);
    }
    // Near the context limit γ shrinks instead of overflowing (tiny context: 256).
    let long = common::random_tokens(8, 240, 256);
    let req = greedy_request(long, 100, &[]);
    let (want, want_finish) = plain(&target.model, &req);
    let mut d = ModelDrafter::new(&self_draft.model, "self");
    let (got, finish, _) = speculative(&target.model, &mut d, &req, 8);
    assert_eq!((got, finish), (want, want_finish));
    assert_eq!(finish, FinishReason::ContextFull);
}

/// Greedy speculative output equals plain greedy output on ten Spec-Bench dev prompts (the
/// first of each category, in the model's chat template), for both drafters and every γ.
#[test]
fn real_model_greedy_parity_on_spec_bench() {
    // The documented pair: an f16 target with a q8_0 self-drafter (it disagrees now and then).
    let target = common::load_default(WeightsDtype::F16);
    let draft = common::load_default(WeightsDtype::Q8_0);
    let (mut drafted, mut accepted) = (0, 0);
    for (i, prompt) in common::spec_bench_prompts(&target, 10)
        .into_iter()
        .enumerate()
    {
        let req = greedy_request(prompt, 64, target.tokenizer.eos_ids());
        let (want, _) = plain(&target.model, &req);
        // Every γ from 1 to 8 on two or three prompts each (prompt i runs γ = 1 + i mod 4
        // and 5 + i mod 4): each prompt's prefill is most of a run's time.
        for gamma in [1 + i % 4, 5 + i % 4] {
            let mut model_drafter = ModelDrafter::new(&draft.model, "q8_0 self-draft");
            let (got, _, stats) = speculative(&target.model, &mut model_drafter, &req, gamma);
            assert_eq!(got, want, "draft model, prompt {i}, γ={gamma}");
            drafted += stats.draft_tokens;
            accepted += stats.accepted_tokens;
            let (got, _, _) = speculative(&target.model, &mut PromptLookup::default(), &req, gamma);
            assert_eq!(got, want, "prompt lookup, prompt {i}, γ={gamma}");
        }
    }
    assert!(
        accepted > 0 && accepted < drafted,
        "accepted {accepted} of {drafted}"
    );
}

/// A q8_0 cache keeps greedy speculation exact: both models' caches q8_0, on three dev prompts
/// and one past two attention segments (the prompts joined), both drafters.
#[test]
fn real_model_greedy_parity_with_q8_0_caches() {
    use tandem::model::{KvDtype, LoadOptions};
    let load = |weights_dtype| {
        common::load_default_with(&LoadOptions {
            weights_dtype,
            kv_dtype: KvDtype::Q8_0,
            ..Default::default()
        })
    };
    let (target, draft) = (load(WeightsDtype::AsIs), load(WeightsDtype::Q8_0));
    let mut prompts = common::spec_bench_prompts(&target, 6);
    let deep: Vec<u32> = prompts.concat().into_iter().take(1000).collect();
    assert!(deep.len() > 512, "{} tokens", deep.len());
    prompts.truncate(3);
    prompts.push(deep);
    for (i, prompt) in prompts.into_iter().enumerate() {
        let req = greedy_request(prompt, 24, target.tokenizer.eos_ids());
        let (want, _) = plain(&target.model, &req);
        let mut model_drafter = ModelDrafter::new(&draft.model, "q8_0 self-draft");
        let (got, _, _) = speculative(&target.model, &mut model_drafter, &req, 4);
        assert_eq!(got, want, "draft model, prompt {i}");
        let (got, _, _) = speculative(&target.model, &mut PromptLookup::default(), &req, 5);
        assert_eq!(got, want, "prompt lookup, prompt {i}");
    }
}

/// A stop string that completes inside a round ends the output exactly where plain decoding
/// ends it: same tokens, same text (stop string excluded), nothing past it streamed.
#[test]
fn real_model_stop_strings_end_speculative_output_like_plain() {
    // The documented pair: an f16 target with a q8_0 self-drafter (it disagrees now and then).
    let target = common::load_default(WeightsDtype::F16);
    let draft = common::load_default(WeightsDtype::Q8_0);
    let detok = Some(std::sync::Arc::clone(&target.tokenizer));
    for prompt in common::spec_bench_prompts(&target, 2) {
        let free = plain_output(
            &target.model,
            &GenerationRequest {
                detokenizer: detok.clone(),
                ..greedy_request(prompt.clone(), 48, &[])
            },
        );
        let text = free.text.unwrap();
        // A stop string taken from the middle of the model's own output, so it spans whatever
        // token boundaries fall there.
        let chars: Vec<(usize, char)> = text.char_indices().collect();
        assert!(chars.len() > 20, "output too short: {text:?}");
        let (from, to) = (chars[chars.len() / 2].0, chars[chars.len() / 2 + 3].0);
        let stop = text[from..to].to_owned();
        let cut = text.find(&stop).unwrap();
        let req = GenerationRequest {
            stop_strings: vec!["\u{0}never".into(), stop.clone()],
            detokenizer: detok.clone(),
            ..greedy_request(prompt, 48, &[])
        };
        let want = plain_output(&target.model, &req);
        assert_eq!(want.finish, FinishReason::Stop);
        assert_eq!(want.text.as_deref(), Some(&text[..cut]), "stop {stop:?}");
        assert!(free.tokens.starts_with(&want.tokens));
        assert!(want.tokens.len() < free.tokens.len());
        for gamma in [1, 2, 4, 8] {
            let mut model_drafter = ModelDrafter::new(&draft.model, "q8_0 self-draft");
            let drafters: [&mut dyn Proposer; 2] =
                [&mut model_drafter, &mut PromptLookup::default()];
            for d in drafters {
                let (got, _) = speculative_output(&target.model, d, &req, gamma);
                assert_eq!(
                    (&got.tokens, &got.text, got.finish),
                    (&want.tokens, &want.text, want.finish),
                    "γ={gamma}, stop {stop:?}"
                );
            }
        }
    }
}

#[test]
fn cli_compare_reports_identical_greedy_outputs_for_both_drafters() {
    common::default_model();
    // Prompt lookup (default and other n-gram sizes), the quantized self-drafter, and the
    // target's own first 8 layers.
    for draft in ["prompt-lookup", "prompt-lookup:2-4", "default", "self:8"] {
        let out = common::tandem_command()
            .args([
                "generate",
                "--prompt",
                "List three colors, then list them again.",
                "--max-tokens",
                "24",
            ])
            .args([
                "--draft-model",
                draft,
                "--draft-weights-dtype",
                "q4_0",
                "--gamma",
                "3",
                "--compare",
                "--json",
            ])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{draft}: {stderr}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["outputs_match"], true, "{draft}: {v}");
        let s = &v["speculative"];
        let (drafted, accepted) = (
            s["draft_tokens"].as_u64().unwrap(),
            s["accepted_tokens"].as_u64().unwrap(),
        );
        // Fixed γ: the speculative run really drafted. The model's own Q4_0 weights agree
        // with it often, so their drafts must be kept too (prompt lookup finds little to reuse
        // in so short an answer, and the first 8 of 30 layers rarely guess right).
        assert!(0 < drafted && accepted <= drafted, "{draft}: {v}");
        if draft == "default" {
            assert!(accepted > 0, "{draft}: {v}");
        }
        // The speedup printed is the ratio of the two runs' decode rates, not a figure apart.
        let ratio = v["decode_tokens_per_s"].as_f64().unwrap()
            / v["plain_decode_tokens_per_s"].as_f64().unwrap();
        let speedup = v["speedup"].as_f64().unwrap();
        assert!((speedup - ratio).abs() <= 1e-9 * ratio, "{draft}: {v}");
        // Three timed runs of each mode (after a warm-up), and the range of their speedups.
        assert_eq!(v["compare_runs"], 3, "{draft}: {v}");
        let spread: Vec<f64> = v["speedup_spread"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert!(
            spread.len() == 2 && 0.0 < spread[0] && spread[0] <= spread[1],
            "{v}"
        );
        assert!(
            stderr.contains("speculative: draft tokens:")
                && stderr.contains("compare (3 timed runs"),
            "{stderr}"
        );
    }
}

/// `generate` with a drafter and no `--gamma` runs through the engine's governor: with a
/// drafter that is rarely right (the target's first 8 of 30 layers) it drafts a fraction of
/// what a fixed γ drafts, and its output is plain decoding's, whether `--compare`'s plain runs
/// go through the engine or the reference loop (`--compare-plain`).
#[test]
fn generate_with_a_drafter_is_governed_unless_gamma_is_fixed() {
    common::default_model();
    let run = |extra: &[&str]| -> serde_json::Value {
        let out = common::tandem_command()
            .args(["generate", "--prompt", "Describe a quiet harbour at dawn."])
            .args(["--max-tokens", "48", "--draft-model", "self:8", "--json"])
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{extra:?}: {stderr}");
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let drafted = |v: &serde_json::Value| v["speculative"]["draft_tokens"].as_u64().unwrap();
    let governed = run(&["--compare", "--compare-runs", "1"]);
    let fixed = run(&["--gamma", "4"]);
    assert_eq!(governed["outputs_match"], true, "{governed}");
    assert_eq!(governed["tokens"], fixed["tokens"], "{governed} {fixed}");
    assert_eq!(governed["compare_plain"], "engine", "{governed}");
    // Plain runs in the reference loop, as `--draft-model none` decodes: the same output.
    let loop_flags = [
        "--compare",
        "--compare-runs",
        "1",
        "--compare-plain",
        "loop",
    ];
    let against_loop = run(&loop_flags);
    assert_eq!(against_loop["compare_plain"], "loop", "{against_loop}");
    assert_eq!(against_loop["outputs_match"], true, "{against_loop}");
    assert_eq!(against_loop["tokens"], fixed["tokens"], "{against_loop}");
    // With --gamma nothing runs in the engine: asking for it there is refused, naming the flag.
    let refused = common::tandem_command()
        .args(["generate", "--prompt", "hi", "--draft-model", "self:8"])
        .args(["--gamma", "4", "--compare", "--compare-plain", "engine"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && said.contains("--compare-plain"),
        "{said}"
    );
    assert!(
        drafted(&fixed) >= 40 && 2 * drafted(&governed) <= drafted(&fixed),
        "governed drafted {}, fixed γ = 4 drafted {}",
        drafted(&governed),
        drafted(&fixed)
    );
}

/// `TANDEM_LOG` opens the governor's log to `generate` as to `serve`: every round's forecast
/// against its measured cost and, when the request ends, what drafting saved it, on stderr,
/// with stdout's JSON untouched; without it, nothing of the kind.
#[test]
fn governed_generate_logs_its_rounds_on_stderr_only_when_asked() {
    common::default_model();
    let run = |log: Option<&str>| {
        let mut c = common::tandem_command();
        c.env_remove("TANDEM_LOG");
        if let Some(filter) = log {
            c.env("TANDEM_LOG", filter);
        }
        let out = c
            .args(["generate", "--prompt", "Count from one to ten, then again."])
            .args([
                "--max-tokens",
                "24",
                "--draft-model",
                "prompt-lookup",
                "--json",
            ])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{log:?}: {stderr}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{log:?}: stdout is not one JSON object: {e}"));
        (v, stderr)
    };
    let (logged, stderr) = run(Some("warn,tandem::engine=debug"));
    assert!(
        stderr.contains("forecast_verify_ms=") && stderr.contains("round_ms="),
        "{stderr}"
    );
    let net = stderr
        .lines()
        .find(|l| l.contains("what drafting saved the request"))
        .unwrap_or_else(|| panic!("no request ledger line: {stderr}"));
    assert!(
        net.contains("drafting_net_ms=") && net.contains("may_draft="),
        "{net}"
    );
    let (quiet, stderr) = run(None);
    assert!(!stderr.contains("forecast_verify_ms"), "{stderr}");
    assert_eq!(logged["tokens"], quiet["tokens"]);
}

#[test]
fn governed_generate_remembers_its_prices_and_checks_them_before_trusting_them() {
    let model = common::default_model();
    let cache = tempfile::tempdir().unwrap();
    let run = |remember: &str| -> (serde_json::Value, String) {
        let out = common::tandem_command()
            .env("TANDEM_CACHE", cache.path())
            .args(["generate", "--model", model.to_str().unwrap()])
            .args([
                "--prompt",
                "Name the days of the week, then name them again.",
            ])
            .args([
                "--max-tokens",
                "32",
                "--draft-model",
                "prompt-lookup",
                "--json",
            ])
            .args(["--remember-prices", remember])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        (serde_json::from_slice(&out.stdout).unwrap(), stderr)
    };
    let (first, log) = run("true");
    assert!(log.contains("governor: prices measured"), "{log}");
    let files: Vec<_> = std::fs::read_dir(cache.path().join("governor"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let file = &files[0];
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
    let version = saved["version"].clone();
    let identity = saved["identity"].as_str().unwrap();
    assert!(
        identity.contains("SmolLM2-135M-Instruct.Q4_1.gguf") && identity.contains("cores"),
        "{identity}"
    );
    assert!(
        saved["remembered"]["reference"].as_array().unwrap().len() == 2,
        "{saved}"
    );

    // Checked and trusted, or found off on a busy machine and measured again: either way the
    // file was read, and the output is the same.
    let (second, log) = run("true");
    assert!(log.contains("governor: prices remembered"), "{log}");
    assert_eq!(second["tokens"], first["tokens"]);

    // A damaged file is measured over, and replaced with a whole one.
    std::fs::write(file, format!("{{\"version\": {version}, \"identity\": ")).unwrap();
    let (third, log) = run("true");
    assert!(log.contains("governor: prices measured"), "{log}");
    assert_eq!(third["tokens"], first["tokens"]);
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
    assert_eq!(saved["version"], version);

    // Off: neither read nor written.
    let before = std::fs::read(file).unwrap();
    let (fourth, log) = run("false");
    assert!(log.contains("governor: prices measured"), "{log}");
    assert_eq!(fourth["tokens"], first["tokens"]);
    assert_eq!(std::fs::read(file).unwrap(), before);
}

#[test]
fn a_self_drafter_must_have_fewer_layers_than_the_target() {
    common::default_model();
    let out = common::tandem_command()
        .args(["generate", "--prompt", "Hi", "--max-tokens", "4"])
        .args(["--draft-model", "self:30"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("self:30") && stderr.contains("30 layers"),
        "{stderr}"
    );
}

#[test]
fn a_draft_model_with_another_vocabulary_is_refused() {
    common::default_model();
    let dir = tempfile::tempdir().unwrap();
    common::write_tiny_llama(dir.path(), &spec(1));
    let out = common::tandem_command()
        .args([
            "generate",
            "--prompt",
            "hi",
            "--draft-model",
            dir.path().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("different vocabularies") && stderr.contains("SmolLM2"),
        "{stderr}"
    );
}
