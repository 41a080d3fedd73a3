//! K-quant files as users download them: the default model re-quantized to llama.cpp's
//! `Q4_K_M` and `Q6_K` (by `tandem make-model`'s recipes, which give every tensor the type
//! `llama-quantize` gives it) loads with default settings on the own kernels, tracks the
//! forward of its exact weights in f32, and greedy speculative decoding on it equals plain.

use crate::common;

use std::path::{Path, PathBuf};

use common::{greedy_request, plain_output};
use tandem::draft::{ModelDrafter, PromptLookup};
use tandem::engine::{generate_speculative, FixedSpeculation, Gamma};
use tandem::model::loaded::LoadOptions;
use tandem::model::synthetic::{make_model, WeightSource};
use tandem::model::{LoadedModel, LogitsRows, ModelSource, SeqInput, WeightsDtype};
use tandem::sampling::Lenience;

/// The default model re-quantized under `recipe`, written into `dir`.
fn requantized(dir: &Path, recipe: &str) -> PathBuf {
    let src = common::default_model();
    let out = dir.join(format!("smollm2-{recipe}.gguf"));
    make_model(
        WeightSource::Model(&src),
        &src,
        recipe.parse().unwrap(),
        &out,
    )
    .unwrap();
    out
}

fn load(path: &Path, dtype: WeightsDtype) -> LoadedModel {
    LoadedModel::load(
        &ModelSource::Gguf(path.to_owned()),
        &LoadOptions {
            weights_dtype: dtype,
            context_len: 1024,
            ..Default::default()
        },
    )
    .expect("the K-quant file loads")
}

/// The last position's logits after feeding `tokens` at `pos`.
fn step(
    model: &LoadedModel,
    cache: &mut tandem::model::KvCache,
    tokens: &[u32],
    pos: usize,
) -> Vec<f32> {
    let slot = 0;
    model
        .model
        .forward(
            cache,
            &[SeqInput {
                slot,
                start_pos: pos,
                tokens,
                logits: LogitsRows::Last,
                parents: &[],
            }],
        )
        .unwrap()
        .seq_rows(0)
        .unwrap()
        .remove(0)
}

/// How closely a file's forward on the own kernels (activations quantized to 8 bits) tracks
/// the forward of its exact weights in f32 over a prompt and 12 greedy steps (both fed the
/// same tokens): the mean KL divergence of the next-token distributions, the largest logit
/// difference, and at how many positions the greedy token agrees.
fn tracking(file: &Path, types: &[&str]) -> (f64, f32, usize) {
    // `auto`, the config's default: the file's own types, every one on an own kernel.
    let fast = load(file, WeightsDtype::Auto);
    assert_eq!(fast.model.linear_dtypes(), types, "{}", file.display());
    assert!(
        fast.model.types_without_own_kernel().is_empty(),
        "{:?} run on candle's kernel",
        fast.model.types_without_own_kernel()
    );
    let exact = load(file, WeightsDtype::F32);
    let prompt = common::chat_prompt(&fast, "What is the capital of France?");
    let (mut a, mut b) = (fast.model.new_cache(1), exact.model.new_cache(1));
    a.allocate().unwrap();
    b.allocate().unwrap();
    let (mut input, mut pos) = (prompt, 0);
    let (mut kl, mut worst, mut agree) = (0f64, 0f32, 0);
    const STEPS: usize = 12;
    for _ in 0..STEPS {
        let (ours, theirs) = (
            step(&fast, &mut a, &input, pos),
            step(&exact, &mut b, &input, pos),
        );
        let d = ours
            .iter()
            .zip(&theirs)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        worst = worst.max(d);
        kl += common::kl_divergence(&theirs, &ours) / STEPS as f64;
        let token = tandem::sampling::argmax(&ours).unwrap();
        agree += usize::from(token == tandem::sampling::argmax(&theirs).unwrap());
        pos += input.len();
        input = vec![token];
    }
    (kl, worst, agree)
}

/// The K-quant files track their exact weights at least about as closely as the default
/// model's own Q4_1 file tracks its (measured: mean KL 0.017, largest logit difference 2.0,
/// 11 of 12 greedy tokens; Q4_K_M 0.012, 3.0, 11; Q6_K 0.002, 1.8, 12).
#[test]
fn q4_k_m_and_q6_k_files_load_by_default_and_track_their_exact_weights_forward() {
    let dir = tempfile::tempdir().unwrap();
    let (base_kl, _, _) = tracking(&requantized(dir.path(), "q4_1"), &["Q4_1", "Q8_0"]);
    for (recipe, types) in [
        ("q4_k_m", vec!["Q4K", "Q5_0", "Q6K", "Q8_0"]),
        ("q6_k", vec!["Q6K", "Q8_0"]),
    ] {
        let (kl, worst, agree) = tracking(&requantized(dir.path(), recipe), &types);
        eprintln!("{recipe}: mean KL {kl:.4} (Q4_1: {base_kl:.4}), largest difference {worst}, {agree} of 12 tokens agree");
        assert!(
            kl < 0.03 && kl <= 1.5 * base_kl,
            "{recipe}: mean KL {kl} (Q4_1: {base_kl})"
        );
        assert!(worst < 4.0, "{recipe}: logits differ by {worst}");
        assert!(agree >= 10, "{recipe}: {agree} of 12 greedy tokens agree");
    }
}

#[test]
fn greedy_speculative_output_on_a_q4_k_m_file_equals_plain() {
    let dir = tempfile::tempdir().unwrap();
    let target = load(&requantized(dir.path(), "q4_k_m"), WeightsDtype::Auto);
    // The original Q4_1 weights draft: close to the target's, not equal, so drafts are both
    // accepted and rejected.
    let draft = common::load_default(WeightsDtype::AsIs);
    let (mut drafted, mut accepted) = (0, 0);
    for (i, prompt) in common::spec_bench_prompts(&target, 4)
        .into_iter()
        .enumerate()
    {
        let req = greedy_request(prompt, 48, target.tokenizer.eos_ids());
        let want = plain_output(&target.model, &req).tokens;
        for gamma in [1 + i % 2, 4, 8 - i % 2] {
            let spec = FixedSpeculation {
                gamma: Gamma::try_from(gamma).unwrap(),
                lenience: Lenience::EXACT,
            };
            let mut model_drafter = ModelDrafter::new(&draft.model, "q4_1");
            let mut cache = target.model.new_cache(1);
            let (out, stats) = generate_speculative(
                &target.model,
                &mut cache,
                &mut model_drafter,
                &req,
                spec,
                &mut |_| true,
            )
            .unwrap();
            assert_eq!(out.tokens, want, "draft model, prompt {i}, γ={gamma}");
            drafted += stats.draft_tokens;
            accepted += stats.accepted_tokens;
            let mut cache = target.model.new_cache(1);
            let (out, _) = generate_speculative(
                &target.model,
                &mut cache,
                &mut PromptLookup::default(),
                &req,
                spec,
                &mut |_| true,
            )
            .unwrap();
            assert_eq!(out.tokens, want, "prompt lookup, prompt {i}, γ={gamma}");
        }
    }
    assert!(
        accepted > 0 && accepted < drafted,
        "accepted {accepted} of {drafted}"
    );
}

/// `tandem make-model` writes a random-weight file at every named shape (two layers of each,
/// the shape's full widths) that `forward-bench` loads and times, and says what it wrote.
#[test]
fn make_model_writes_files_forward_bench_loads_at_every_shape() {
    let dir = tempfile::tempdir().unwrap();
    for (shape, recipe) in [
        ("135m", "q4_k_m"),
        ("1b", "q4_k_m"),
        ("3b", "q5_k_m"),
        ("8b", "q8_0"),
    ] {
        let file = dir.path().join(format!("{shape}.gguf"));
        let out = common::tandem_command()
            .args([
                "make-model",
                "--shape",
                shape,
                "--layers",
                "2",
                "--type",
                recipe,
                "--out",
            ])
            .arg(&file)
            .output()
            .expect("tandem make-model runs");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{shape}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(said.contains("for timing only"), "{shape}: {said}");
        let out = common::tandem_command()
            .args([
                "forward-bench",
                "--tokens",
                "1,4",
                "--repeats",
                "1",
                "--depth",
                "8",
                "--model",
            ])
            .arg(&file)
            .output()
            .expect("tandem forward-bench runs");
        let report = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{shape}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(report.contains("| 4 |"), "{shape}: {report}");
    }
    // A shape it does not know, and neither source, are refused naming the flag.
    let out = common::tandem_command()
        .args(["make-model", "--shape", "70b", "--type", "q4_k_m", "--out"])
        .arg(dir.path().join("x.gguf"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--shape"));
    // A flag of random weights given with --from would be ignored: refused, named.
    let out = common::tandem_command()
        .args([
            "make-model",
            "--from",
            "x.gguf",
            "--layers",
            "2",
            "--type",
            "q8_0",
            "--out",
        ])
        .arg(dir.path().join("y.gguf"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--layers"));
}
