//! The real default model end to end (plain generation, the CLI) and clear errors for models
//! that are missing, truncated, incomplete or of an unsupported architecture.

use crate::common;

use candle_core::quantized::gguf_file;
use tandem::engine::{generate_plain, FinishReason};
use tandem::model::loaded::LoadOptions;
use tandem::model::{LoadedModel, ModelError, ModelSource, WeightsDtype};
use tandem::sampling::SamplingParams;

fn run(
    loaded: &LoadedModel,
    prompt: Vec<u32>,
    max_tokens: usize,
    sampling: SamplingParams,
) -> tandem::engine::GenerationOutput {
    let mut cache = loaded.model.new_cache(1);
    let req = common::generation_request(prompt, max_tokens, sampling, loaded.tokenizer.eos_ids());
    let out = generate_plain(&loaded.model, &mut cache, &req, &mut |_| true).unwrap();
    assert_eq!(cache.free_slots(), 1, "the slot is freed after generation");
    out
}

/// Full precision (f16 holds the file's Q4_1 values exactly): this 135M model's greedy answer is
/// sensitive enough that the 8-bit activations of q8_0/q4_1 matmuls turn it from "Paris" into a
/// list of French landmarks, so the sensibility check runs without activation quantization.
#[test]
fn greedy_chat_answer_is_sensible_and_sampling_is_seeded() {
    let loaded = common::load_default(WeightsDtype::F16);
    let prompt = common::chat_prompt(&loaded, "What is the capital of France?");
    let out = run(&loaded, prompt.clone(), 24, SamplingParams::greedy());
    let text = loaded.tokenizer.decode(&out.tokens).unwrap();
    assert!(text.contains("Paris"), "answer: {text:?}");
    assert!(out.tokens.len() <= 24);
    if out.finish == FinishReason::Stop {
        assert!(loaded
            .tokenizer
            .eos_ids()
            .contains(out.tokens.last().unwrap()));
    }

    let sampled = |seed| {
        let p = SamplingParams {
            temperature: 0.9,
            top_k: 50,
            top_p: 0.95,
            seed: Some(seed),
            ..Default::default()
        };
        run(&loaded, prompt.clone(), 12, p).tokens
    };
    assert_eq!(sampled(1), sampled(1), "same seed, same tokens");
    assert_ne!(
        sampled(1),
        sampled(2),
        "different seeds should diverge within 12 tokens"
    );

    let capped = run(&loaded, prompt, 3, SamplingParams::greedy());
    assert_eq!(capped.tokens.len(), 3);
    assert_eq!(capped.finish, FinishReason::Length);
}

#[test]
fn cli_generate_prints_json_and_stats() {
    common::default_model();
    let out = common::tandem_command()
        .args([
            "generate",
            "--prompt",
            "What is the capital of France?",
            "--max-tokens",
            "16",
            "--json",
            // full precision: see greedy_chat_answer_is_sensible_and_sampling_is_seeded
            "--weights-dtype",
            "f16",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["text"].as_str().unwrap().contains("Paris"), "{v}");
    assert!(v["generated_tokens"].as_u64().unwrap() <= 16);
    assert!(
        stderr.contains("decode:") && stderr.contains("prefill:"),
        "{stderr}"
    );

    // streamed text on stdout, stats line last on stderr
    let out = common::tandem_command()
        .args([
            "generate",
            "--raw",
            "--prompt",
            "The capital of France is",
            "--max-tokens",
            "4",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stdout).trim().is_empty());
    assert!(String::from_utf8_lossy(&out.stderr)
        .lines()
        .last()
        .unwrap()
        .starts_with("prompt tokens: "));
}

#[test]
fn cli_errors_are_clear() {
    let empty = tempfile::tempdir().unwrap();
    let out = common::tandem_command()
        .env("TANDEM_CACHE", empty.path())
        .args(["generate", "--prompt", "hi"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("scripts/fetch-default-model"));

    let out = common::tandem_command()
        .args(["generate", "--prompt", "hi", "--weights-dtype", "q3"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("model.weights_dtype"));
}

fn load_err(source: ModelSource) -> ModelError {
    match LoadedModel::load(&source, &LoadOptions::default()) {
        Ok(_) => panic!("{source:?} should not load"),
        Err(e) => e,
    }
}

#[test]
fn bad_models_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();

    let e = ModelSource::resolve(dir.path().join("nope.gguf").to_str().unwrap()).unwrap_err();
    assert!(matches!(e, ModelError::NotFound(_)), "{e}");

    // a download cut short
    let bytes = std::fs::read(common::default_model()).unwrap();
    let truncated = dir.path().join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() / 3]).unwrap();
    let e = load_err(ModelSource::Gguf(truncated));
    assert!(e.to_string().contains("truncated"), "{e}");
    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, b"definitely not a gguf file").unwrap();
    assert!(load_err(ModelSource::Gguf(garbage))
        .to_string()
        .contains("not a valid GGUF"));

    // a safetensors folder without config.json
    let hf = dir.path().join("hf");
    common::write_tiny_llama(&hf, &common::TinySpec::default());
    std::fs::remove_file(hf.join("config.json")).unwrap();
    let e = ModelSource::resolve(hf.to_str().unwrap()).unwrap_err();
    assert!(e.to_string().contains("config.json"), "{e}");

    // unsupported architectures, both formats, named with the ones tandem runs
    let mamba = dir.path().join("mamba");
    common::write_tiny_llama(&mamba, &common::TinySpec::default());
    let cfg = std::fs::read_to_string(mamba.join("config.json")).unwrap();
    std::fs::write(
        mamba.join("config.json"),
        cfg.replace("LlamaForCausalLM", "MambaForCausalLM"),
    )
    .unwrap();
    let e = load_err(ModelSource::HfDir(mamba.clone()));
    assert!(
        matches!(e, ModelError::Unsupported(_))
            && e.to_string().contains("MambaForCausalLM")
            && e.to_string().contains("Gemma3ForCausalLM"),
        "{e}"
    );
    // A family tandem runs, whose file lacks a weight its block needs: the tensor is named.
    std::fs::write(
        mamba.join("config.json"),
        cfg.replace("LlamaForCausalLM", "Qwen2ForCausalLM"),
    )
    .unwrap();
    let e = load_err(ModelSource::HfDir(mamba));
    assert!(
        e.to_string()
            .contains("model.layers.0.self_attn.q_proj.bias"),
        "{e}"
    );

    let gpt2 = dir.path().join("gpt2.gguf");
    let arch = gguf_file::Value::String("gpt2".into());
    gguf_file::write(
        &mut std::fs::File::create(&gpt2).unwrap(),
        &[("general.architecture", &arch)],
        &[],
    )
    .unwrap();
    let e = load_err(ModelSource::Gguf(gpt2));
    assert!(
        matches!(e, ModelError::Unsupported(_)) && e.to_string().contains("gpt2"),
        "{e}"
    );
}

/// A hub id loads from the local Hugging Face cache (never from the network), and one that is
/// not there gets an error saying how to get it.
#[test]
fn hub_ids_resolve_in_the_local_cache_only() {
    let hub = tempfile::tempdir().unwrap();
    let repo = hub.path().join("models--acme--tiny-llama");
    let snapshot = repo.join("snapshots").join("0123abcd");
    common::write_tiny_llama(&snapshot, &common::TinySpec::default());
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "0123abcd\n").unwrap();

    let out = common::tandem_command()
        .env("HF_HUB_CACHE", hub.path())
        .args([
            "generate",
            "--model",
            "acme/tiny-llama",
            "--raw",
            "--prompt",
            "hi",
        ])
        .args(["--max-tokens", "4", "--json", "--weights-dtype", "f32"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["generated_tokens"].as_u64().unwrap() >= 1, "{v}");

    let out = common::tandem_command()
        .env("HF_HUB_CACHE", hub.path())
        .args(["generate", "--model", "acme/absent", "--prompt", "hi"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("acme/absent") && stderr.contains("huggingface-cli download"),
        "{stderr}"
    );
}

/// The seeds' pair config is valid and names both models by hub id.
#[test]
fn llama_pair_config_is_valid() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/llama-3.2-1b-3b.toml");
    let c = tandem::config::Config::from_file(&path).expect("the pair config validates");
    assert_eq!(c.model.path, "meta-llama/Llama-3.2-3B-Instruct");
    assert_eq!(
        c.speculation.draft_model.to_string(),
        "meta-llama/Llama-3.2-1B-Instruct"
    );
    assert!(c.speculation.settings.enabled);
}

/// The scheduler sizes prompt chunks by what their tokens cost at their depth, priced from
/// the model's own matmul and attention kernels timed at start-up: on the real model a token
/// deep in the context must cost more than one at its start (a failed timing would leave the
/// price flat, every token 1, and one long prompt's chunk would stall other requests again),
/// the more keys it reads the more, and a chunk deep in the context fits fewer tokens.
#[test]
fn prefill_price_grows_with_the_keys_a_token_reads() {
    use tandem::engine::prefill_timing::prefill_price;
    let loaded = common::load_default(WeightsDtype::Auto);
    let price = prefill_price(&loaded.model);
    assert_eq!(price.relative(0), 1.0);
    let (mid, deep) = (price.relative(2047), price.relative(8191));
    assert!(1.0 < mid && mid < deep && deep < 1000.0, "{mid} {deep}");
    let budget = price.chunk(0, 256);
    let (shallow_len, _) = price.fit(0, 10_000, budget);
    let (deep_len, spent) = price.fit(8000, 10_000, budget);
    assert_eq!(shallow_len, 256);
    assert!(
        0 < deep_len && deep_len < 256 && spent <= budget,
        "{deep_len}"
    );
}

/// The binary runs itself again with glibc's heap on transparent huge pages where the kernel
/// grants them on request, keeping its arguments, output and exit status, and says what the
/// heap got; `TANDEM_HUGE_PAGES=false` keeps 4 KiB pages, and a value it does not know is
/// refused. The text is the same either way.
#[test]
fn generate_runs_on_huge_pages_where_the_kernel_grants_them() {
    common::default_model();
    let run = |huge: &str| {
        let out = common::tandem_command()
            .env("TANDEM_HUGE_PAGES", huge)
            .env_remove("GLIBC_TUNABLES")
            .args(["generate", "--raw", "--prompt", "The capital of France is"])
            .args(["--max-tokens", "6", "--temperature", "0"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "stderr: {stderr}");
        let pages = stderr
            .lines()
            .find_map(|l| l.strip_prefix("memory pages: "))
            .unwrap_or_else(|| panic!("no memory pages line: {stderr}"))
            .to_owned();
        (String::from_utf8_lossy(&out.stdout).into_owned(), pages)
    };
    let (on, off) = (run("true"), run("false"));
    assert_eq!(on.0, off.0, "the same text on either page size");
    assert!(!on.0.trim().is_empty());
    let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .ok()
        .and_then(|s| tandem::huge_pages::kernel_mode(&s).map(str::to_owned));
    match mode.as_deref() {
        Some("madvise") => {
            assert_eq!(
                on.1,
                "2 MiB (transparent huge pages, glibc.malloc.hugetlb=1)"
            );
            assert_eq!(off.1, "4 KiB (TANDEM_HUGE_PAGES=false)");
        }
        Some("always") => assert!(on.1.contains("always on") && off.1 == on.1),
        _ => assert!(on.1.starts_with("4 KiB") && off.1 == on.1),
    }
    // A value it does not know stops the start, naming the variable.
    let out = common::tandem_command()
        .env("TANDEM_HUGE_PAGES", "maybe")
        .args(["generate", "--raw", "--prompt", "Hi", "--max-tokens", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("TANDEM_HUGE_PAGES must be true or false") && stderr.contains("maybe"),
        "{stderr}"
    );
}
