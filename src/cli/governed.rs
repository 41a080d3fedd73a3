//! `tandem generate`'s governed runs: one request through the engine (scheduler, governor and
//! start-up calibration), as `serve` runs it.
//!
//! Why it exists: a drafter left to a fixed γ drafts every round whether or not its drafts
//! stand, and a request whose drafts mostly fail then decodes slower than plain (0.56x on a
//! mixture-of-experts target, where each rejected row brings its own experts). The governor
//! drafts only where the measured prices and the request's own acceptance say it pays, so
//! `generate` with a drafter runs through it unless `--gamma` fixes γ (the reference loop).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tandem::config::Config;
use tandem::draft::LoadedDrafter;
use tandem::engine::{
    Engine, EngineEvent, EngineRequest, FinishReason, GammaPolicy, GenerationOutput,
    GenerationRequest, GenerationStats, OutputPiece, RequestSpeculation, SpeculationStats,
};
use tandem::model::Decoder;
use tandem::sampling::Lenience;

use super::CliError;

/// An engine for one request at a time, and the runtime its actors live on.
pub struct GovernedEngine {
    engine: Engine,
    runtime: tokio::runtime::Runtime,
    lenience: Lenience,
}

impl GovernedEngine {
    /// Starts the engine with the config's engine and speculation settings for a single
    /// sequence (start-up calibration then times only the widths one request verifies).
    pub fn start(
        config: &Config,
        threads: usize,
        target: Arc<Decoder>,
        drafter: LoadedDrafter,
        lenience: Lenience,
    ) -> Result<Self, CliError> {
        let runtime = super::async_runtime()?;
        let cfg = tandem::engine::EngineConfig {
            max_seqs: 1,
            max_queue: 1,
            // No later request reuses a prompt here, and a request ends only once its cache is
            // stored: on a fresh process's 66-token answer to a 769-token prompt, storing it
            // took 8 ms of the decode's 0.28 s, a cost the plain reference loop never pays.
            prefix_cache: false,
            ..tandem::setup::engine_config(config, threads)
        };
        let engine = runtime.block_on(Engine::start(target, Some(drafter), cfg))?;
        Ok(Self {
            engine,
            runtime,
            lenience,
        })
    }

    /// Where the governor's first prices came from.
    pub fn start_up_prices(&self) -> tandem::engine::StartUpPrices {
        self.engine.start_up_prices()
    }

    /// Runs `req`, speculating (`speculate`) as the governor decides or decoding plainly, with
    /// its text handed to `on_output` as it is released; the output, its timing (prefill: to
    /// the first token; decode: the rest) and the speculation counters.
    pub fn generate(
        &self,
        req: &GenerationRequest,
        speculate: bool,
        on_output: &mut dyn FnMut(OutputPiece<'_>) -> bool,
    ) -> Result<(GenerationOutput, SpeculationStats), CliError> {
        let request = EngineRequest {
            generation: req.clone(),
            speculative: RequestSpeculation {
                gamma: if speculate {
                    GammaPolicy::On
                } else {
                    GammaPolicy::Off
                },
                lenience: Some(self.lenience),
                ..RequestSpeculation::default()
            },
            logprobs: None,
            prompt_logprobs: None,
            constraint: None,
        };
        self.runtime.block_on(async {
            let started = Instant::now();
            let mut events = self.engine.submit(request).await?;
            let (mut tokens, mut text) = (Vec::new(), String::new());
            // When the first and the latest tokens came.
            let mut came: Option<(Instant, Instant)> = None;
            loop {
                match events.next().await {
                    Some(EngineEvent::Output {
                        tokens: t,
                        text: piece,
                        ..
                    }) => {
                        if !t.is_empty() {
                            let now = Instant::now();
                            came = Some((came.map_or(now, |(first, _)| first), now));
                        }
                        tokens.extend_from_slice(&t);
                        text.push_str(&piece);
                        let more = on_output(OutputPiece {
                            token: t.last().copied(),
                            text: &piece,
                        });
                        if !more {
                            // Dropping the stream cancels the request (a closed stdout).
                            let stats = timing(0, tokens.len(), started, came);
                            let output = GenerationOutput {
                                tokens,
                                text: req.detokenizer.as_ref().map(|_| text),
                                finish: FinishReason::Cancelled,
                                stats,
                            };
                            return Ok((output, SpeculationStats::default()));
                        }
                    }
                    Some(EngineEvent::Done { finish, usage }) => {
                        let stats = timing(usage.prompt_tokens, tokens.len(), started, came);
                        let output = GenerationOutput {
                            tokens,
                            text: req.detokenizer.as_ref().map(|_| text),
                            finish,
                            stats,
                        };
                        return Ok((output, usage.speculative));
                    }
                    Some(EngineEvent::Failed(f)) => {
                        return Err(CliError::Generation(f.message));
                    }
                    None => {
                        return Err(CliError::Generation(
                            "the engine stopped before the request finished".into(),
                        ))
                    }
                }
            }
        })
    }
}

/// A run's timing as the reference loops report it: prefill to the first token, decode from
/// there to the last (what the engine does after it, before saying the request is done, is
/// no part of decoding).
fn timing(
    prompt_tokens: usize,
    generated_tokens: usize,
    started: Instant,
    came: Option<(Instant, Instant)>,
) -> GenerationStats {
    let (first, last) = came.unwrap_or_else(|| (Instant::now(), Instant::now()));
    GenerationStats {
        prompt_tokens,
        generated_tokens,
        prefill: first - started,
        decode: (last - first).max(Duration::from_nanos(1)),
    }
}
