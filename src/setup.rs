//! Turning a `Config` into loaded models and an engine configuration.
//!
//! Why it exists: `tandem serve` and `tandem bench` start the same engine from the same config
//! keys (the target, the drafter named by `speculation.draft_model`, the `[engine]` section),
//! and the start-up errors a user must see (missing model, vocabularies that differ) should be
//! worded once.

use std::sync::Arc;

use crate::config::Config;
use crate::draft::{check_same_vocabulary, parse_self_draft, PromptLookup};
use crate::engine::{DraftSource, EngineConfig};
use crate::model::loader::LoadOptions;
use crate::model::{LoadedModel, ModelError, ModelSource, WeightsDtype};

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("draft model: {0}")]
    Draft(String),
}

/// Loads the target model named by `model.path` at `model.weights_dtype`.
pub fn load_target(config: &Config) -> Result<LoadedModel, SetupError> {
    let source = ModelSource::resolve(&config.model.path)?;
    let t = std::time::Instant::now();
    let target = LoadedModel::load(&source, &target_options(config))?;
    tracing::info!(
        model = %source.display_name(),
        weights = %target.model.linear_dtypes().join("/"),
        kv_cache = %target.model.kv_dtype(),
        seconds = t.elapsed().as_secs_f64(),
        "loaded the target model"
    );
    Ok(target)
}

fn target_options(config: &Config) -> LoadOptions {
    LoadOptions {
        weights_dtype: config.weights_dtype(),
        context_len: config.model.context_length,
        kv_dtype: config.kv_cache_dtype(),
        ..Default::default()
    }
}

/// Loads a draft model (`default`, a path, or `self:K` for the target's first K layers) at
/// `dtype` and checks that it shares the target's vocabulary token for token; returns it with
/// a display name such as `model.gguf (Q8_0)`.
pub fn load_draft_model(
    spec: &str,
    dtype: WeightsDtype,
    config: &Config,
    target: &LoadedModel,
) -> Result<(LoadedModel, String), SetupError> {
    let layers = parse_self_draft(spec)
        .transpose()
        .map_err(SetupError::Draft)?;
    let source = match layers {
        Some(k) => {
            let n = target.model.hparams().num_layers;
            if k >= n {
                return Err(SetupError::Draft(format!(
                    "`{spec}`: the target has {n} layers; a self-drafter takes fewer"
                )));
            }
            target.source.clone()
        }
        None => ModelSource::resolve(spec)?,
    };
    let opts = LoadOptions {
        weights_dtype: dtype,
        max_layers: layers,
        ..target_options(config)
    };
    let draft = LoadedModel::load(&source, &opts)?;
    check_same_vocabulary(
        &draft.tokenizer,
        &source.display_name(),
        &target.tokenizer,
        &target.source.display_name(),
    )
    .map_err(|e| SetupError::Draft(e.to_string()))?;
    let layers_note = match layers {
        Some(k) => format!(
            ", first {k} of {} layers",
            target.model.hparams().num_layers
        ),
        None => String::new(),
    };
    let name = format!(
        "{} ({}{layers_note})",
        source.display_name(),
        draft.model.linear_dtypes().join("/")
    );
    tracing::info!(draft_model = %name, "loaded the draft model");
    Ok((draft, name))
}

/// Loads the target and the drafter that `speculation.draft_model` names (blocking work: call
/// it off the async runtime's threads via `spawn_blocking`); returns them with the drafter's
/// display name.
pub fn load_models(
    config: &Config,
) -> Result<(LoadedModel, Option<DraftSource>, String), SetupError> {
    let target = load_target(config)?;
    let spec = config.speculation.draft_model.as_str();
    let lookup = PromptLookup::parse_spec(spec)
        .transpose()
        .map_err(SetupError::Draft)?;
    let (draft, name) = match (spec, lookup) {
        ("none", _) => (None, "none".to_string()),
        (_, Some(p)) => {
            let (lo, hi) = p.ngrams();
            (
                Some(DraftSource::PromptLookup(p)),
                format!("prompt-lookup:{lo}-{hi}"),
            )
        }
        (path, None) => {
            let (draft, name) =
                load_draft_model(path, config.draft_weights_dtype(), config, &target)?;
            let source = DraftSource::Model {
                model: Arc::new(draft.model),
                name: name.clone(),
            };
            (Some(source), name)
        }
    };
    Ok((target, draft, name))
}

/// The engine settings from the config; `threads` is the runtime's compute thread count.
pub fn engine_config(config: &Config, threads: usize) -> EngineConfig {
    let e = &config.engine;
    let or_runtime = |n: usize| if n == 0 { threads } else { n };
    EngineConfig {
        max_seqs: e.max_seqs,
        max_queue: e.max_queue,
        prefill_chunk: e.prefill_chunk,
        pipeline: e.pipeline,
        target_threads: or_runtime(e.target_threads),
        draft_threads: or_runtime(e.draft_threads),
        kv_capacity_tokens: None,
        max_gamma: e.max_gamma,
        speculation: config.speculation_settings().expect("validated at load"),
        governor: Default::default(),
    }
}
