//! Loading the models named by the config and starting the engine on them.
//!
//! Why it exists: the server binds its port first (so `/health` can say "loading") and loads
//! in the background; this is the part that turns a `Config` into a running `Engine`, with the
//! start-up errors a user must see (missing model, vocabularies that differ).

use std::sync::Arc;

use crate::config::Config;
use crate::constraint::{CompilePool, ConstraintVocabulary};
use crate::engine::Engine;
use crate::model::{ChatMessage, TextTokenizer};
use crate::setup::{engine_config, load_models, SetupError};

use super::chat_render::ChatRenderer;
use super::structured::Compiler;
use super::ServerError;

/// What the server needs once the models are up.
pub struct Loaded {
    pub engine: Engine,
    pub tokenizer: Arc<TextTokenizer>,
    /// The id clients use in `model`.
    pub model_name: String,
    /// The drafter, as the admin API reports it.
    pub drafter: String,
    /// When the model was loaded and began to be served (Unix seconds): `/v1/models`'
    /// `created`.
    pub created: u64,
    /// Where chat templates render.
    pub templates: ChatRenderer,
    /// Where structured outputs compile, against the model's vocabulary; `None` (with the
    /// reason logged at start-up) for a model that cannot end a constrained output.
    pub compiler: Option<Compiler>,
}

/// Loads everything and starts the engine.
pub async fn start(config: Config, threads: usize) -> Result<Loaded, ServerError> {
    let cfg = config.clone();
    let (target, draft, drafter) = tokio::task::spawn_blocking(move || load_models(&cfg))
        .await
        .map_err(|e| ServerError::Startup(format!("model loading panicked: {e}")))?
        .map_err(|e| match e {
            SetupError::Model(m) => ServerError::Model(m),
            SetupError::Draft(d) => ServerError::Draft(d),
        })?;
    let model_name = if config.server.model_name.is_empty() {
        target.source.display_name()
    } else {
        config.server.model_name.clone()
    };
    let tokenizer = Arc::clone(&target.tokenizer);
    let templates = ChatRenderer::new(std::time::Duration::from_millis(
        config.server.template_timeout_ms,
    ));
    check_chat_template(&templates, &tokenizer).await?;
    let vocab = target.model.hparams().vocab_size;
    let for_constraints = Arc::clone(&tokenizer);
    let constraints =
        tokio::task::spawn_blocking(move || ConstraintVocabulary::new(for_constraints, vocab))
            .await
            .map_err(|e| ServerError::Startup(format!("constraint vocabulary panicked: {e}")))?
            .inspect_err(|e| tracing::warn!(error = %e, "structured outputs are unavailable"))
            .ok()
            .map(Arc::new);
    let compiler = match constraints {
        Some(vocab) => {
            let st = &config.structured;
            let pool = CompilePool::new(vocab, st.compile_threads, st.compile_queue)
                .map_err(|e| ServerError::Startup(format!("constraint compile threads: {e}")))?;
            Some(Compiler {
                pool,
                timeout: std::time::Duration::from_millis(st.compile_timeout_ms),
                json_whitespace: config.json_whitespace(),
            })
        }
        None => None,
    };
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
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        compiler,
        templates,
    })
}

/// Renders a one-message conversation through the chat template, as a request would: a
/// template that fails it (an error, a runaway loop, a prompt past its bounds, an empty
/// prompt) would fail every chat request, so start-up stops with the reason instead.
async fn check_chat_template(
    templates: &ChatRenderer,
    tokenizer: &Arc<TextTokenizer>,
) -> Result<(), ServerError> {
    if tokenizer.chat_template().is_none() {
        return Ok(());
    }
    let hello = vec![ChatMessage::new("user", "Hello!")];
    match templates
        .render(tokenizer, hello, true, Default::default())
        .await
    {
        Ok(text) if !text.is_empty() => Ok(()),
        Ok(_) => Err(ServerError::Startup(
            "the chat template renders an empty prompt for a one-message conversation".into(),
        )),
        Err(e) => Err(ServerError::Startup(format!(
            "the chat template fails on a one-message conversation: {e}"
        ))),
    }
}
