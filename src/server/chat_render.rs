//! Rendering chat templates where no template can hurt the server: on the blocking pool, a
//! few at a time, with a deadline, each render bounded by fuel and output size.
//!
//! Why it exists: a chat template is code from a model file (or `--chat-template`). On a
//! tokio worker a template that loops for long froze `/health` and every other request. Here
//! the caller waits at most `server.template_timeout_ms`; a render past it fails only its own
//! request, and the thread it ran on is freed by the template's fuel soon after. At most
//! [`RENDER_THREADS`] renders run at once, so runaway renders cannot take every blocking thread.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use crate::model::{ChatMessage, ChatTemplateError, TextTokenizer};

/// Renders at once.
pub const RENDER_THREADS: usize = 2;

/// Why a render gave no prompt.
#[derive(Debug, thiserror::Error)]
pub enum RenderFailure {
    #[error(transparent)]
    Template(#[from] ChatTemplateError),
    #[error("the chat template took longer than {0} ms to render (server.template_timeout_ms)")]
    TimedOut(u64),
    #[error("the chat template render panicked")]
    Panicked,
}

/// The server's chat template renders.
#[derive(Debug)]
pub struct ChatRenderer {
    permits: Arc<Semaphore>,
    timeout: Duration,
}

impl ChatRenderer {
    pub fn new(timeout: Duration) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(RENDER_THREADS)),
            timeout,
        }
    }

    /// The prompt text of `messages` through the tokenizer's chat template (which the caller
    /// has checked exists), within the deadline (waiting for a free render included).
    pub async fn render(
        &self,
        tokenizer: &Arc<TextTokenizer>,
        messages: Vec<ChatMessage>,
        add_generation_prompt: bool,
    ) -> Result<String, RenderFailure> {
        let started = Instant::now();
        let timed_out = || RenderFailure::TimedOut(self.timeout.as_millis() as u64);
        let permit = tokio::time::timeout(self.timeout, Arc::clone(&self.permits).acquire_owned())
            .await
            .map_err(|_| timed_out())?
            .map_err(|_| RenderFailure::Panicked)?;
        let tokenizer = Arc::clone(tokenizer);
        let job = tokio::task::spawn_blocking(move || {
            // Held until the render ends, past the caller's deadline too: a runaway render
            // keeps its place until its fuel runs out.
            let _permit = permit;
            let template = tokenizer.chat_template().ok_or_else(|| {
                ChatTemplateError::Render("the model has no chat template".into())
            })?;
            template.render(&messages, add_generation_prompt)
        });
        let left = self.timeout.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, job).await {
            Err(_) => {
                tracing::warn!(
                    timeout_ms = self.timeout.as_millis() as u64,
                    "a chat template render ran past its deadline"
                );
                Err(timed_out())
            }
            Ok(Err(_)) => Err(RenderFailure::Panicked),
            Ok(Ok(rendered)) => Ok(rendered?),
        }
    }
}
