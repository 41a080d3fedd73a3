//! Turning a `Config` into loaded models and an engine configuration.
//!
//! Why it exists: `tandem serve` and `tandem bench` start the same engine from the same config
//! keys (the target, the drafter named by `speculation.draft_model`, the `[engine]` section),
//! and the start-up errors a user must see (missing model, vocabularies that differ) should be
//! worded once.

use std::sync::Arc;

use crate::config::Config;
use crate::draft::check_same_vocabulary;
use crate::engine::{DraftSource, EngineConfig};
use crate::model::loader::LoadOptions;
use crate::model::{LoadedModel, ModelError, ModelSource};

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("draft model: {0}")]
    Draft(String),
}

/// Loads the target and the drafter (blocking work: call it off the async runtime's threads
/// via `spawn_blocking`) and returns what `start_engine` needs.
pub fn load_models(
    config: &Config,
) -> Result<(LoadedModel, Option<DraftSource>, String), SetupError> {
    let source = ModelSource::resolve(&config.model.path)?;
    let opts = LoadOptions {
        weights_dtype: config.weights_dtype(),
        context_len: config.model.context_length,
        ..Default::default()
    };
    let t = std::time::Instant::now();
    let target = LoadedModel::load(&source, &opts)?;
    tracing::info!(
        model = %source.display_name(),
        weights = %target.model.linear_dtypes().join("/"),
        seconds = t.elapsed().as_secs_f64(),
        "loaded the target model"
    );
    let spec = config.speculation.draft_model.as_str();
    let (draft, name) = match spec {
        "none" => (None, "none".to_string()),
        "prompt-lookup" => (Some(DraftSource::PromptLookup), spec.to_string()),
        path => {
            let dsource = ModelSource::resolve(path)?;
            let dopts = LoadOptions {
                weights_dtype: config.draft_weights_dtype(),
                ..opts.clone()
            };
            let draft = LoadedModel::load(&dsource, &dopts)?;
            check_same_vocabulary(
                &draft.tokenizer,
                &dsource.display_name(),
                &target.tokenizer,
                &source.display_name(),
            )
            .map_err(|e| SetupError::Draft(e.to_string()))?;
            let name = format!(
                "{} ({})",
                dsource.display_name(),
                draft.model.linear_dtypes().join("/")
            );
            tracing::info!(draft_model = %name, "loaded the draft model");
            let model = Arc::new(draft.model);
            (
                Some(DraftSource::Model {
                    model,
                    name: name.clone(),
                }),
                name,
            )
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
        speculation: config.speculation_settings(),
        governor: Default::default(),
    }
}
