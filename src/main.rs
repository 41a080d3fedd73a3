//! The `tandem` command line: loads config, wires the layers together, reports errors.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};

use tandem::config::Config;
use tandem::engine::{generate_plain, GenerationRequest};
use tandem::model::loader::LoadOptions;
use tandem::model::{ChatMessage, IncrementalDecoder, LoadedModel, ModelSource};
use tandem::sampling::SamplingParams;

#[derive(Parser)]
#[command(
    name = "tandem",
    version,
    about = "LLM inference built around speculative decoding"
)]
struct Cli {
    /// TOML config file (default: the embedded config/default.toml).
    #[arg(long, global = true, env = "TANDEM_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a completion for one prompt, streaming it to stdout; stats go to stderr.
    Generate(GenerateArgs),
    /// Time forwards of k new tokens against a cache of a given depth (the cost a speculative
    /// verification pays), reported against a 1-token forward.
    ForwardBench(ForwardBenchArgs),
}

#[derive(Args)]
struct ForwardBenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// New-token counts to time (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,5,9,16,64")]
    tokens: Vec<usize>,
    /// Tokens already in the cache before each timed forward.
    #[arg(long, default_value_t = 64)]
    depth: usize,
    /// Timed repetitions per count (the median is reported).
    #[arg(long, default_value_t = 10)]
    repeats: usize,
}

/// Model and runtime overrides shared by commands that load a model.
#[derive(Args)]
struct ModelArgs {
    /// `default`, a .gguf file, or a Hugging Face model folder.
    #[arg(long, env = "TANDEM_MODEL")]
    model: Option<String>,
    /// Linear weight type after loading: as-is, f32, f16, bf16, q8_0, q4_0, q4k.
    #[arg(long, env = "TANDEM_WEIGHTS_DTYPE")]
    weights_dtype: Option<String>,
    /// Compute threads (0 = all cores).
    #[arg(long, env = "TANDEM_THREADS")]
    threads: Option<usize>,
    /// Context length (prompt + output tokens).
    #[arg(long, env = "TANDEM_CONTEXT_LENGTH")]
    context_length: Option<usize>,
}

#[derive(Args)]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt (a user message unless --raw).
    #[arg(long, conflicts_with = "prompt_file")]
    prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// Feed the prompt as-is instead of through the model's chat template.
    #[arg(long)]
    raw: bool,
    /// A system message for the chat template.
    #[arg(long)]
    system: Option<String>,
    #[arg(long)]
    max_tokens: Option<usize>,
    /// 0 = greedy.
    #[arg(long)]
    temperature: Option<f32>,
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long)]
    top_p: Option<f32>,
    #[arg(long)]
    min_p: Option<f32>,
    #[arg(long)]
    repetition_penalty: Option<f32>,
    #[arg(long)]
    seed: Option<u64>,
    /// Keep generating past end-of-sequence tokens (for benchmarks).
    #[arg(long)]
    ignore_eos: bool,
    /// Print only the stats line (no streamed text).
    #[arg(long)]
    quiet: bool,
    /// Print the result (token ids, text, stats) as one JSON object on stdout instead.
    #[arg(long)]
    json: bool,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let mut config = match &cli.config {
        Some(p) => Config::from_file(p)?,
        None => Config::embedded(),
    };
    match cli.command {
        Command::Generate(args) => {
            apply_model_args(&mut config, &args.model)?;
            generate(&config, args)
        }
        Command::ForwardBench(args) => {
            apply_model_args(&mut config, &args.model)?;
            forward_bench(&config, args)
        }
    }
}

fn apply_model_args(config: &mut Config, args: &ModelArgs) -> Result<()> {
    if let Some(m) = &args.model {
        config.model.path = m.clone();
    }
    if let Some(d) = &args.weights_dtype {
        config.model.weights_dtype = d.clone();
    }
    if let Some(t) = args.threads {
        config.runtime.threads = t;
    }
    if let Some(c) = args.context_length {
        config.model.context_length = c;
    }
    config.validate()?;
    Ok(())
}

fn load_model(config: &Config) -> Result<LoadedModel> {
    let threads = tandem::runtime::init_threads(config.runtime.threads);
    let source = ModelSource::resolve(&config.model.path)?;
    let opts = LoadOptions {
        weights_dtype: config.weights_dtype(),
        context_len: config.model.context_length,
        ..Default::default()
    };
    let t = std::time::Instant::now();
    let loaded = LoadedModel::load(&source, &opts)
        .with_context(|| format!("loading model {}", source.path().display()))?;
    eprintln!(
        "loaded {} (--weights-dtype {}: linear weights as {}) in {:.2}s on {threads} thread(s)",
        source.display_name(),
        opts.weights_dtype,
        loaded.model.linear_dtypes().join("/"),
        t.elapsed().as_secs_f64()
    );
    Ok(loaded)
}

fn generate(config: &Config, args: GenerateArgs) -> Result<()> {
    let prompt_text = match (&args.prompt, &args.prompt_file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("reading prompt file {}", f.display()))?,
        (None, None) => bail!("give a prompt with --prompt TEXT or --prompt-file FILE"),
    };
    let g = &config.generation;
    let sampling = SamplingParams {
        temperature: args.temperature.unwrap_or(g.temperature),
        top_k: args.top_k.unwrap_or(g.top_k),
        top_p: args.top_p.unwrap_or(g.top_p),
        min_p: args.min_p.unwrap_or(g.min_p),
        repetition_penalty: args.repetition_penalty.unwrap_or(g.repetition_penalty),
        seed: args.seed,
        ..Default::default()
    };
    sampling.validate()?;
    let loaded = load_model(config)?;
    let tok = &loaded.tokenizer;
    let text = if args.raw {
        prompt_text
    } else {
        let template = tok
            .chat_template()
            .context("the model has no chat template; pass --raw to feed the prompt as-is")?;
        let mut messages = Vec::new();
        if let Some(s) = &args.system {
            messages.push(ChatMessage {
                role: "system".into(),
                content: s.clone(),
            });
        }
        messages.push(ChatMessage {
            role: "user".into(),
            content: prompt_text,
        });
        template.render(&messages, true)?
    };
    let prompt = tok.encode(&text, true)?;
    let req = GenerationRequest {
        prompt,
        max_tokens: args.max_tokens.unwrap_or(g.max_tokens),
        sampling,
        eos_ids: if args.ignore_eos {
            Vec::new()
        } else {
            tok.eos_ids().to_vec()
        },
    };
    let mut cache = loaded.model.new_cache(1);
    let mut decoder = IncrementalDecoder::new();
    let stream = !args.quiet && !args.json;
    let mut stdout = std::io::stdout().lock();
    let mut write_err = None;
    let out = generate_plain(&loaded.model, &mut cache, &req, &mut |id| {
        if stream && !tok.eos_ids().contains(&id) {
            match decoder.push(tok, id) {
                Ok(Some(piece)) => {
                    if let Err(e) = stdout
                        .write_all(piece.as_bytes())
                        .and_then(|_| stdout.flush())
                    {
                        write_err = Some(e);
                        return false;
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    write_err = Some(std::io::Error::other(e.to_string()));
                    return false;
                }
            }
        }
        true
    })?;
    if let Some(e) = write_err {
        return Err(e).context("writing output");
    }
    if stream {
        if let Some(rest) = decoder.flush(tok)? {
            stdout.write_all(rest.as_bytes())?;
        }
        writeln!(stdout)?;
    }
    let s = &out.stats;
    if args.json {
        let text = tok.decode(&out.tokens)?;
        let v = serde_json::json!({
            "text": text,
            "tokens": out.tokens,
            "finish_reason": out.finish.as_openai(),
            "prompt_tokens": s.prompt_tokens,
            "generated_tokens": s.generated_tokens,
            "prefill_tokens_per_s": s.prefill_tokens_per_s(),
            "decode_tokens_per_s": s.decode_tokens_per_s(),
        });
        writeln!(stdout, "{v}")?;
    }
    eprintln!(
        "prompt tokens: {} | generated tokens: {} | prefill: {:.1} tok/s | decode: {:.1} tok/s | finish: {:?}",
        s.prompt_tokens,
        s.generated_tokens,
        s.prefill_tokens_per_s(),
        s.decode_tokens_per_s(),
        out.finish
    );
    Ok(())
}

fn forward_bench(config: &Config, args: ForwardBenchArgs) -> Result<()> {
    use tandem::model::{LogitsRows, SeqInput};
    let loaded = load_model(config)?;
    let model = &loaded.model;
    let vocab = model.hparams().vocab_size as u32;
    let mut cache = model.new_cache(1);
    let slot = cache.allocate().context("a cache slot")?;
    // Arbitrary but fixed token ids: the cost does not depend on which tokens they are.
    let ids = |n: usize, salt: usize| -> Vec<u32> {
        (0..n)
            .map(|i| ((i * 7919 + salt * 104_729) as u32) % vocab)
            .collect()
    };
    let max_k = args.tokens.iter().copied().max().unwrap_or(1);
    if args.depth + max_k > model.context_len() {
        bail!(
            "--depth + the largest --tokens exceeds the context length {}",
            model.context_len()
        );
    }
    model.forward(
        &mut cache,
        &[SeqInput {
            slot,
            start_pos: 0,
            tokens: &ids(args.depth.max(1), 0),
            logits: LogitsRows::None,
        }],
    )?;
    let depth = cache.len(slot)?;
    println!("| new tokens | ms per forward | ms per token | cost vs 1 token |");
    println!("|---|---|---|---|");
    let mut base = None;
    for &k in &args.tokens {
        let mut times = Vec::with_capacity(args.repeats);
        for r in 0..args.repeats + 1 {
            let toks = ids(k, r + 1);
            let t = std::time::Instant::now();
            model.forward(
                &mut cache,
                &[SeqInput {
                    slot,
                    start_pos: depth,
                    tokens: &toks,
                    logits: LogitsRows::All,
                }],
            )?;
            let dt = t.elapsed().as_secs_f64() * 1e3;
            cache.truncate_to(slot, depth)?;
            if r > 0 {
                times.push(dt); // the first run warms caches
            }
        }
        times.sort_by(f64::total_cmp);
        let ms = times[times.len() / 2];
        let one = *base.get_or_insert(ms);
        println!(
            "| {k} | {ms:.2} | {:.2} | {:.2}x |",
            ms / k as f64,
            ms / one
        );
    }
    Ok(())
}
