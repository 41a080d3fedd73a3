//! Loading the models named by the config and starting the engine on them.
//!
//! Why it exists: the server binds its port first (so `/health` can say "loading") and loads
//! in the background; this is the part that turns a `Config` into a running `Engine`, with the
//! start-up errors a user must see (missing model, vocabularies that differ).

use std::sync::Arc;

use crate::config::Config;
use crate::draft::check_same_vocabulary;
use crate::engine::{DraftSource, Engine, EngineConfig};
use crate::model::loader::LoadOptions;
use crate::model::{LoadedModel, ModelSource, TextTokenizer};

use super::ServerError;

/// What the server needs once the models are up.
pub struct Loaded {
    pub engine: Engine,
    pub tokenizer: Arc<TextTokenizer>,
    /// The id clients use in `model`.
    pub model_name: String,
    /// The drafter, as the admin API reports it.
    pub drafter: String,
}

/// Loads the target and the drafter (blocking work: call it off the async runtime's threads
/// via `spawn_blocking`) and returns what `start_engine` needs.
pub fn load_models(
    config: &Config,
) -> Result<(LoadedModel, Option<DraftSource>, String), ServerError> {
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
            .map_err(|e| ServerError::Draft(e.to_string()))?;
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

/// Loads everything and starts the engine.
pub async fn start(config: Config, threads: usize) -> Result<Loaded, ServerError> {
    let cfg = config.clone();
    let (target, draft, drafter) = tokio::task::spawn_blocking(move || load_models(&cfg))
        .await
        .map_err(|e| ServerError::Startup(format!("model loading panicked: {e}")))??;
    let model_name = if config.server.model_name.is_empty() {
        target.source.display_name()
    } else {
        config.server.model_name.clone()
    };
    let tokenizer = Arc::clone(&target.tokenizer);
    let engine = Engine::start(
        Arc::new(target.model),
        draft,
        engine_config(&config, threads),
    )
    .await?;
    Ok(Loaded {
        engine,
        tokenizer,
        model_name,
        drafter,
    })
}
