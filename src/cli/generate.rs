//! `tandem generate`: one prompt, plain or speculative, streamed to stdout with stats on stderr.
//!
//! Why it exists: it is the quickest way to see a model and a drafter work, and the reference
//! the server's output is checked against. With a drafter it runs the request through the
//! engine and its governor, as `serve` does (`governed`); with a fixed `--gamma`, or without a
//! drafter, the engine's reference loops directly (no scheduler). `--compare` runs plain
//! decoding of the same prompt the same way in the same process, so the speedup and the
//! outputs' equality are measured side by side; `--compare-plain loop` runs the plain side in
//! the reference loop instead, as a user's `--draft-model none` decodes, so the comparison
//! also charges what running through the engine costs.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use tandem::config::Config;
use tandem::draft::{DraftSpec, LoadedDrafter};
use tandem::engine::{
    FixedSpeculation, Gamma, GenerationOutput, GenerationRequest, PricesFrom, SpeculationStats,
    StartUpPrices,
};
use tandem::model::{ChatMessage, LoadedModel, WeightsDtype};
use tandem::sampling::{Lenience, SamplingParams};

use super::governed::GovernedEngine;
use super::model_args::{load_model, ModelArgs};
use super::runner::Runner;
use super::CliError;

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt (a user message unless --raw); this or --prompt-file is required.
    #[arg(long, conflicts_with = "prompt_file")]
    prompt: Option<String>,
    /// Read the prompt from a file (instead of --prompt; one of the two is required).
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// Feed the prompt as-is instead of through the model's chat template.
    #[arg(long)]
    raw: bool,
    /// A system message for the chat template [default: none].
    #[arg(long)]
    system: Option<String>,
    /// Tokens to generate at most [default: generation.max_tokens, 256].
    #[arg(long)]
    max_tokens: Option<usize>,
    /// Sampling temperature, 0 = greedy [default: generation.temperature, 0].
    #[arg(long)]
    temperature: Option<f32>,
    /// Sample among the k likeliest tokens, 0 = off [default: generation.top_k, 0].
    #[arg(long)]
    top_k: Option<usize>,
    /// Nucleus sampling in (0, 1], 1 = off [default: generation.top_p, 1].
    #[arg(long)]
    top_p: Option<f32>,
    /// Drop tokens below this share of the top token's probability, 0 = off
    /// [default: generation.min_p, 0].
    #[arg(long)]
    min_p: Option<f32>,
    /// Multiplicative penalty on tokens already seen, in [0.01, 100], 1 = off
    /// [default: generation.repetition_penalty, 1].
    #[arg(long)]
    repetition_penalty: Option<f32>,
    /// Seed of a sampled run [default: a random seed].
    #[arg(long)]
    seed: Option<u64>,
    /// Stop when the output contains this text (repeatable); the text stops right before it
    /// [default: none].
    #[arg(long)]
    stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens (for benchmarks).
    #[arg(long)]
    ignore_eos: bool,
    /// Print only the stats line (no streamed text).
    #[arg(long)]
    quiet: bool,
    /// Print the result (token ids, text, stats) as one JSON object on stdout instead.
    #[arg(long)]
    json: bool,
    /// Speculative decoding drafter: `none`, `prompt-lookup[:MIN-MAX]`, `suffix[:MIN-MAX]`,
    /// `self:K`, `default`, a model path (of the target's vocabulary or another) or
    /// `draft+lookup:MODEL` (prompt lookup first).
    #[arg(long, env = "TANDEM_DRAFT_MODEL", default_value = "none")]
    draft_model: DraftSpec,
    /// Linear weight type of a draft model (the same file at another type is a self-drafter).
    #[arg(long, env = "TANDEM_DRAFT_WEIGHTS_DTYPE", default_value = "as-is")]
    draft_weights_dtype: WeightsDtype,
    /// Drafted tokens per round (γ; alias --spec-length): every round drafts this many, in the
    /// reference loop [default: the governor picks γ per round, or none where drafting does
    /// not pay, as `serve` does]
    #[arg(long, alias = "spec-length")]
    gamma: Option<usize>,
    /// Relaxed acceptance in (0, 1]; 1 keeps the target's distribution exactly.
    #[arg(long, default_value_t = 1.0)]
    lenience: f64,
    /// Also run plain decoding of the same prompt in this process and print the speedup and
    /// whether the outputs are identical. Both are run once untimed (warm-up), then
    /// `--compare-runs` times each, alternating, and the medians and the spread are printed.
    #[arg(long)]
    compare: bool,
    /// With the governor (no --gamma): keep its prices and acceptance in the cache directory
    /// and start from them next time (checked first) [default: engine.remember_prices, true].
    #[arg(long, env = "TANDEM_REMEMBER_PRICES")]
    remember_prices: Option<bool>,
    /// Timed runs of each mode for `--compare` (after one warm-up run of each).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    compare_runs: u32,
    /// Where `--compare`'s plain runs decode: `engine` (the governed engine with drafting off,
    /// as `serve` decodes a plain request) or `loop` (the reference loop, as `generate
    /// --draft-model none` decodes) [default: where the speculative runs go: the engine, or
    /// the loop with --gamma]
    #[arg(long, value_enum, requires = "compare")]
    compare_plain: Option<PlainPath>,
}

/// Where `--compare`'s plain runs decode.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PlainPath {
    Engine,
    Loop,
}

pub fn run(config: &Config, args: GenerateArgs) -> Result<(), CliError> {
    // The engine's per-round debug lines are opt-in, as in `bench`: the run's own output stays
    // clean unless TANDEM_LOG asks for them (on stderr).
    if std::env::var_os("TANDEM_LOG").is_some() {
        tandem::logging::init(&config.logging.level, &config.logging.format)?;
    }
    let prompt_text = read_prompt(&args)?;
    let sampling = sampling_params(config, &args)?;
    let spec = speculation(&args)?;
    let loaded = load_model(config)?;
    let req = generation_request(config, &args, &loaded, prompt_text, sampling)?;
    let drafter = load_drafter(config, &args, &loaded)?;
    let speculative = drafter.is_some();
    let stream = !args.quiet && !args.json;
    let target = Arc::new(loaded.model);
    let runner = match (drafter, spec) {
        (Some(d), Speculation::Governed(lenience)) => {
            let threads = tandem::runtime::thread_count(config.runtime.threads);
            let mut config = config.clone();
            if let Some(v) = args.remember_prices {
                config.engine.remember_prices = v;
            }
            let governed =
                GovernedEngine::start(&config, threads, Arc::clone(&target), d, lenience)?;
            print_start_up(governed.start_up_prices());
            Runner::Governed {
                engine: governed,
                target: &target,
                plain_in_loop: args.compare_plain == Some(PlainPath::Loop),
            }
        }
        (_, _) if args.compare_plain == Some(PlainPath::Engine) => {
            return Err(CliError::Flag {
                flag: "--compare-plain",
                reason: "`engine` needs a drafter governed by the engine (no --gamma): \
                         without one, nothing runs in the engine"
                    .into(),
            })
        }
        (Some(d), Speculation::Fixed(spec)) => Runner::Reference {
            target: &target,
            fixed: Some((d, spec)),
        },
        (None, _) => Runner::Reference {
            target: &target,
            fixed: None,
        },
    };
    // The run whose output is shown (streamed, its stats printed): the speculative one when
    // there is a drafter.
    let (out, spec_stats) = runner.run(&req, speculative, stream)?;
    let compare = if args.compare && speculative {
        Some(compare_runs(&runner, &req, args.compare_runs)?)
    } else {
        None
    };
    let decode_rate = compare
        .as_ref()
        .map_or(out.stats.decode_tokens_per_s(), |c| c.speculative_rate);
    if args.json {
        print_json(
            &args,
            &req,
            &out,
            decode_rate,
            spec_stats.as_ref(),
            compare.as_ref(),
        );
    }
    print_stats(
        &args,
        &out,
        decode_rate,
        spec_stats.as_ref(),
        compare.as_ref(),
    );
    Ok(())
}

/// The prompt's text, from the flag or its file.
fn read_prompt(args: &GenerateArgs) -> Result<String, CliError> {
    match (&args.prompt, &args.prompt_file) {
        (Some(p), _) => Ok(p.clone()),
        (None, Some(f)) => std::fs::read_to_string(f).map_err(|source| CliError::ReadPrompt {
            path: f.clone(),
            source,
        }),
        (None, None) => Err(CliError::NoPrompt),
    }
}

/// The flags' sampling over the config's `[generation]`, checked.
fn sampling_params(config: &Config, args: &GenerateArgs) -> Result<SamplingParams, CliError> {
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
    Ok(sampling)
}

/// How a run with a drafter speculates: governed by the engine, or a fixed γ every round.
#[derive(Clone, Copy)]
enum Speculation {
    Governed(Lenience),
    Fixed(FixedSpeculation),
}

fn speculation(args: &GenerateArgs) -> Result<Speculation, CliError> {
    let lenience = Lenience::try_from(args.lenience).map_err(|e| CliError::Flag {
        flag: "--lenience",
        reason: e.to_string(),
    })?;
    let Some(gamma) = args.gamma else {
        return Ok(Speculation::Governed(lenience));
    };
    Ok(Speculation::Fixed(FixedSpeculation {
        gamma: Gamma::try_from(gamma).map_err(|e| CliError::Flag {
            flag: "--gamma",
            reason: e.to_string(),
        })?,
        lenience,
    }))
}

/// The request: the prompt through the chat template (unless `--raw`), tokenized, with the
/// flags' limits and stops.
fn generation_request(
    config: &Config,
    args: &GenerateArgs,
    loaded: &LoadedModel,
    prompt_text: String,
    sampling: SamplingParams,
) -> Result<GenerationRequest, CliError> {
    let tok = &loaded.tokenizer;
    let text = if args.raw {
        prompt_text
    } else {
        let template = tok.chat_template().ok_or(CliError::NoChatTemplate)?;
        let mut messages = Vec::new();
        if let Some(s) = &args.system {
            messages.push(ChatMessage::new("system", s.clone()));
        }
        messages.push(ChatMessage::new("user", prompt_text));
        template.render(&messages, true)?
    };
    let prompt = tok.encode(&text, true)?;
    Ok(GenerationRequest {
        prompt,
        max_tokens: args.max_tokens.unwrap_or(config.generation.max_tokens),
        sampling,
        eos_ids: if args.ignore_eos {
            Vec::new()
        } else {
            tok.eos_ids().to_vec()
        },
        stop_strings: args.stop.clone(),
        detokenizer: Some(std::sync::Arc::clone(tok)),
        cache_scope: 0,
    })
}

/// The drafter `--draft-model` names; a head is refused at a fixed γ, as the reference loop
/// has no hidden states.
fn load_drafter(
    config: &Config,
    args: &GenerateArgs,
    loaded: &LoadedModel,
) -> Result<Option<LoadedDrafter>, CliError> {
    if matches!(args.draft_model, DraftSpec::Head { .. }) && args.gamma.is_some() {
        return Err(CliError::Flag {
            flag: "--draft-model",
            reason: "head: a draft head drafts from the engine's verifications; drop --gamma \
                     (a fixed γ runs the reference loop, which has no hidden states)"
                .into(),
        });
    }
    let drafter =
        tandem::setup::load_drafter(&args.draft_model, args.draft_weights_dtype, config, loaded)
            .map_err(|source| CliError::LoadDraft {
                spec: args.draft_model.to_string(),
                source,
            })?;
    if let Some(LoadedDrafter::Model { name, .. }) = &drafter {
        eprintln!(
            "draft model {name} (--draft-weights-dtype {})",
            args.draft_weights_dtype
        );
    }
    Ok(drafter)
}

/// `--json`: the result as one object on stdout.
fn print_json(
    args: &GenerateArgs,
    req: &GenerationRequest,
    out: &GenerationOutput,
    decode_rate: f64,
    spec_stats: Option<&SpeculationStats>,
    compare: Option<&Comparison>,
) {
    let s = &out.stats;
    let text = out.text.clone().unwrap_or_default();
    let mut v = serde_json::json!({
        "text": text,
        "tokens": out.tokens,
        "prompt_token_ids": req.prompt,
        "finish_reason": out.finish.as_openai(),
        "prompt_tokens": s.prompt_tokens,
        "generated_tokens": s.generated_tokens,
        "prefill_tokens_per_s": s.prefill_tokens_per_s(),
        "decode_tokens_per_s": decode_rate,
    });
    if let Some(st) = spec_stats {
        v["speculative"] = serde_json::json!({
            "draft_tokens": st.draft_tokens,
            "accepted_tokens": st.accepted_tokens,
            "acceptance_rate": st.acceptance_rate(),
            "mean_accepted_length": st.mean_accepted_length(),
            "rounds": st.rounds,
        });
    }
    if let Some(c) = compare {
        v["plain_decode_tokens_per_s"] = c.plain_rate.into();
        v["speedup"] = (c.speculative_rate / c.plain_rate).into();
        v["speedup_spread"] = serde_json::json!([c.spread.0, c.spread.1]);
        v["compare_runs"] = args.compare_runs.into();
        v["compare_plain"] = c.plain_path.into();
        v["outputs_match"] = (c.plain_tokens == out.tokens).into();
    }
    println!("{v}");
}

/// Where the governor's prices came from, and what start-up spent on them.
fn print_start_up(p: StartUpPrices) {
    let how = match p.from {
        PricesFrom::Table => "given as a table",
        PricesFrom::Measured => "measured",
        PricesFrom::Remembered => "remembered, checked",
        PricesFrom::Remeasured => "remembered but off on this machine now, measured",
    };
    eprintln!("governor: prices {how} in {:.2} s", p.seconds);
}

/// The stats lines on stderr: the run's, speculation's and the comparison's.
fn print_stats(
    args: &GenerateArgs,
    out: &GenerationOutput,
    decode_rate: f64,
    spec_stats: Option<&SpeculationStats>,
    compare: Option<&Comparison>,
) {
    let s = &out.stats;
    eprintln!(
        "prompt tokens: {} | generated tokens: {} | prefill: {:.1} tok/s | decode: {:.1} tok/s | finish: {:?}",
        s.prompt_tokens,
        s.generated_tokens,
        s.prefill_tokens_per_s(),
        decode_rate,
        out.finish
    );
    if let Some(st) = spec_stats {
        eprintln!(
            "speculative: draft tokens: {} | accepted tokens: {} | acceptance rate: {:.1}% | mean tokens per round: {:.2} | rounds: {}",
            st.draft_tokens,
            st.accepted_tokens,
            100.0 * st.acceptance_rate(),
            st.mean_accepted_length(),
            st.rounds
        );
    }
    if let Some(c) = compare {
        eprintln!(
            "compare ({} timed runs each, after a warm-up, alternating; medians): plain decode ({}) {:.1} tok/s | speculative {:.1} tok/s | speedup {:.2}x (runs {:.2}x to {:.2}x) | outputs {}",
            args.compare_runs,
            c.plain_path,
            c.plain_rate,
            c.speculative_rate,
            c.speculative_rate / c.plain_rate,
            c.spread.0,
            c.spread.1,
            if c.plain_tokens == out.tokens { "identical" } else { "differ" }
        );
    }
}

/// Plain against speculative decoding of one request, each measured `runs` times.
struct Comparison {
    /// Median decode rates (tokens/s).
    plain_rate: f64,
    speculative_rate: f64,
    /// The least and the greatest speedup of one speculative run over the plain run before it.
    spread: (f64, f64),
    /// Plain decoding's output (the same in every run when greedy or seeded).
    plain_tokens: Vec<u32>,
    /// Where the plain runs decoded: `engine` or `loop`.
    plain_path: &'static str,
}

/// The shown speculative run warmed the caches and the drafter; a plain run warms plain
/// decoding's, then timed runs alternate (plain, speculative) so a stall of the machine hits
/// both modes alike instead of one, and a single slow run moves neither median far.
fn compare_runs(
    runner: &Runner<'_>,
    req: &GenerationRequest,
    runs: u32,
) -> Result<Comparison, CliError> {
    let (plain, _) = runner.run(req, false, false)?;
    let (mut plain_rates, mut spec_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let (p, _) = runner.run(req, false, false)?;
        let (s, _) = runner.run(req, true, false)?;
        let (p, s) = (p.stats.decode_tokens_per_s(), s.stats.decode_tokens_per_s());
        plain_rates.push(p);
        spec_rates.push(s);
        ratios.push(s / p);
    }
    let spread = ratios
        .iter()
        .fold((f64::INFINITY, 0f64), |(lo, hi), &r| (lo.min(r), hi.max(r)));
    Ok(Comparison {
        plain_rate: median(&mut plain_rates),
        speculative_rate: median(&mut spec_rates),
        spread,
        plain_tokens: plain.tokens,
        plain_path: runner.plain_path(),
    })
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}
