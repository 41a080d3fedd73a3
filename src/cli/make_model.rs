//! `tandem make-model`: writes a Llama GGUF with random weights at a named shape, or an
//! existing model re-quantized, in any of llama.cpp's weight types or mixes.
//!
//! Why it exists: the shapes and files users run (a 1B or 3B Llama as `Q4_K_M`) do not reach
//! our machines; this makes them here, for `forward-bench` and `bench` to time, and a
//! re-quantized default model gives real weights in any type. Random weights are for timing
//! only.

use std::path::PathBuf;

use clap::Args;

use tandem::model::default_model_path;
use tandem::model::synthetic::{make_model, Recipe, Shape, WeightSource};

use super::CliError;

#[derive(Args)]
pub struct MakeModelArgs {
    /// Random weights at this shape: 135m (the default model's), 1b, 3b or 8b (Llama 3.2 1B
    /// and 3B, Llama 3.1 8B), all with the default model's vocabulary [default: none; one of
    /// --shape and --from is required].
    #[arg(long, conflicts_with = "from")]
    shape: Option<String>,
    /// Re-quantize this Llama GGUF's weights instead, its tokenizer and settings kept
    /// [default: none; one of --shape and --from is required].
    #[arg(long)]
    from: Option<PathBuf>,
    /// Weight types, as llama-quantize names them: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0,
    /// q5_1, q4_k, q5_k, q6_k, or the mixes q4_k_m and q5_k_m (llama.cpp's rules); required.
    #[arg(long = "type", required = true)]
    recipe: String,
    /// The file to write (required).
    #[arg(long, required = true)]
    out: PathBuf,
    /// With --shape only: this many layers instead of the shape's own (every matrix keeps the
    /// shape's widths; a quick file for a check, not for timing a whole model) [default: the
    /// shape's].
    #[arg(long, conflicts_with = "from")]
    layers: Option<usize>,
    /// Seed of the random weights (with --shape only).
    #[arg(long, default_value_t = 1, conflicts_with = "from")]
    seed: u64,
    /// The GGUF whose tokenizer a random-weight model takes, with --shape only [default: the
    /// default model, which must have been fetched].
    #[arg(long, conflicts_with = "from")]
    tokenizer_from: Option<PathBuf>,
}

pub fn run(args: MakeModelArgs) -> Result<(), CliError> {
    let flag = |flag: &'static str| move |reason: String| CliError::Flag { flag, reason };
    let recipe: Recipe = args.recipe.parse().map_err(flag("--type"))?;
    let tokenizer = args.tokenizer_from.unwrap_or_else(default_model_path);
    let source = match (&args.shape, &args.from) {
        (Some(s), None) => {
            let mut shape = Shape::named(s).map_err(flag("--shape"))?;
            if let Some(layers) = args.layers {
                if layers == 0 {
                    return Err(flag("--layers")("must be at least 1".into()));
                }
                shape.layers = layers;
            }
            WeightSource::Random {
                shape,
                seed: args.seed,
            }
        }
        (None, Some(p)) => WeightSource::Model(p),
        _ => return Err(flag("--shape")("or --from is needed (one of them)".into())),
    };
    let made = make_model(source, &tokenizer, recipe, &args.out).map_err(|source| {
        CliError::MakeModel {
            path: args.out.display().to_string(),
            source,
        }
    })?;
    let types: Vec<String> = made.types.iter().map(|(t, n)| format!("{n} {t}")).collect();
    println!(
        "wrote {} ({:.1} MB): {}{}",
        args.out.display(),
        made.bytes as f64 / 1e6,
        types.join(", "),
        if args.shape.is_some() {
            " (random weights: for timing only)"
        } else {
            ""
        }
    );
    Ok(())
}
