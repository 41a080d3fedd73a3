//! Rendering chat templates where no template can hurt the server: on threads of their own, a
//! few at a time, with a deadline, each render bounded by fuel, output size and memory.
//!
//! Why it exists: a chat template is code from a model file (or `--chat-template`). On a
//! tokio worker a template that loops for long froze `/health` and every other request. Here
//! the caller waits at most `server.template_timeout_ms`; a render past it fails only its own
//! request, and the thread it ran on is freed by the template's fuel soon after. At most
//! [`RENDER_THREADS`] renders run at once, so runaway renders cannot take every blocking thread.
//! A render that asks for more than [`RENDER_MEMORY`] is parked for good by the allocator
//! (`memory_budget`); its place is given back, and after [`MAX_STOPPED`] such renders the
//! template is not run again (every chat request is then a 500 saying why).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use crate::model::text::chat_template::TemplateOptions;
use crate::model::{ChatMessage, ChatTemplateError, TextTokenizer};

/// Renders at once.
pub const RENDER_THREADS: usize = 2;

/// Most memory one render may hold: eight times the longest prompt it may write.
pub const RENDER_MEMORY: usize = 128 << 20;

/// Renders stopped for their memory after which the template is no longer run: what they keep
/// stays bounded (`MAX_STOPPED` × [`RENDER_MEMORY`]).
pub const MAX_STOPPED: usize = 4;

/// Why a render gave no prompt.
#[derive(Debug, thiserror::Error)]
pub enum RenderFailure {
    #[error(transparent)]
    Template(#[from] ChatTemplateError),
    #[error("the chat template took longer than {0} ms to render (server.template_timeout_ms)")]
    TimedOut(u64),
    #[error(
        "the chat template asked for more than {} MiB rendering a conversation and was stopped",
        RENDER_MEMORY >> 20
    )]
    OutOfMemory,
    #[error(
        "the chat template is no longer run: {0} of its renders were stopped for taking more \
         than their memory; restart the server with a fixed template"
    )]
    Disabled(usize),
    #[error("the chat template render panicked, or no thread could be started for it")]
    Panicked,
}

/// The server's chat template renders.
#[derive(Debug)]
pub struct ChatRenderer {
    permits: Arc<Semaphore>,
    timeout: Duration,
    /// Renders parked for their memory whose places were given back.
    replaced: AtomicUsize,
}

impl ChatRenderer {
    pub fn new(timeout: Duration) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(RENDER_THREADS)),
            timeout,
            replaced: AtomicUsize::new(0),
        }
    }

    /// The prompt text of `messages` through the tokenizer's chat template (which the caller
    /// has checked exists), within the deadline (waiting for a free render included).
    pub async fn render(
        &self,
        tokenizer: &Arc<TextTokenizer>,
        messages: Vec<ChatMessage>,
        add_generation_prompt: bool,
        options: TemplateOptions,
    ) -> Result<String, RenderFailure> {
        let stopped = crate::memory_budget::stopped_threads();
        if stopped >= MAX_STOPPED {
            return Err(RenderFailure::Disabled(stopped));
        }
        let started = Instant::now();
        let timed_out = || RenderFailure::TimedOut(self.timeout.as_millis() as u64);
        let permit = tokio::time::timeout(self.timeout, Arc::clone(&self.permits).acquire_owned())
            .await
            .map_err(|_| timed_out())?
            .map_err(|_| RenderFailure::Panicked)?;
        let tokenizer = Arc::clone(tokenizer);
        let (reply, job) = tokio::sync::oneshot::channel();
        // A thread of its own, not tokio's blocking pool: a render parked for its memory must
        // not hold the runtime's shutdown (tokio waits for its blocking tasks; a process
        // ends its own threads).
        std::thread::Builder::new()
            .name("tandem-template".into())
            .spawn(move || {
                // Held until the render ends, past the caller's deadline too: a runaway render
                // keeps its place until its fuel runs out.
                let _permit = permit;
                let rendered = catch_unwind(AssertUnwindSafe(|| {
                    let template = tokenizer.chat_template().ok_or_else(|| {
                        ChatTemplateError::Render("the model has no chat template".into())
                    })?;
                    crate::memory_budget::with_budget(RENDER_MEMORY, || {
                        template.render_with(&messages, add_generation_prompt, &options)
                    })
                }));
                let _ = reply.send(rendered);
            })
            .map_err(|_| RenderFailure::Panicked)?;
        let left = self.timeout.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, job).await {
            Err(_) if self.replace_stopped() => {
                tracing::error!(
                    memory_mib = RENDER_MEMORY >> 20,
                    "a chat template render asked for more than its memory and was stopped"
                );
                Err(RenderFailure::OutOfMemory)
            }
            Err(_) => {
                tracing::warn!(
                    timeout_ms = self.timeout.as_millis() as u64,
                    "a chat template render ran past its deadline"
                );
                Err(timed_out())
            }
            Ok(Err(_)) | Ok(Ok(Err(_))) => Err(RenderFailure::Panicked),
            Ok(Ok(Ok(rendered))) => Ok(rendered?),
        }
    }

    /// Gives back the places of renders the allocator parked since last asked; whether any.
    /// (A render that timed out while another was parked may be told it was the one: both
    /// ran past a bound.)
    fn replace_stopped(&self) -> bool {
        let stopped = crate::memory_budget::stopped_threads();
        let before = self.replaced.fetch_max(stopped, Ordering::Relaxed);
        if stopped <= before {
            return false;
        }
        self.permits.add_permits(stopped - before);
        true
    }
}
