//! Compiling requests' constraints where no request can hurt the server: on a few threads of
//! their own, never a tokio worker nor the scheduler.
//!
//! Why it exists: compiling a schema or grammar can take seconds and recurse deeply. On the
//! async runtime it stalled every other request and `/health`; on a worker's 2 MiB stack one
//! 30 KB schema aborted the process. Here each compile thread has a stack sized for the depth
//! `limits` allows (with a wide margin, committed only as it is touched), at most `queue` jobs
//! wait for a thread (a full pool answers at once instead of queueing without end), and a
//! panic inside the compiler is one request's error, not a lost thread. The caller waits with
//! its own deadline; a job whose caller stopped waiting before it started is skipped.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use crossbeam_channel::{Sender, TrySendError};
use tokio::sync::oneshot;

use super::{CompiledConstraint, ConstraintError, ConstraintSpec, ConstraintVocabulary};

/// Each compile thread's stack. llguidance used about 7 KB a link of a `$ref` chain (300
/// links overflowed 2 MiB, 1,000 fit in 16 MiB) and a chain of 1,000 Lark rules fit in 8 MiB;
/// the deepest inputs `limits` lets through need less than that, and the rest is margin:
/// reserved address space, which costs memory only where it is touched.
pub const COMPILE_STACK_BYTES: usize = 64 << 20;

/// What a compile answers: the constraint, or why it cannot be used.
pub type CompileResult = Result<CompiledConstraint, ConstraintError>;

/// Why a compile could not be started.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CompilePoolError {
    #[error("every constraint compile thread is busy and {queue} compiles are waiting")]
    Full { queue: usize },
    #[error("the constraint compile threads have stopped")]
    Stopped,
}

struct Job {
    spec: ConstraintSpec,
    reply: oneshot::Sender<CompileResult>,
}

/// The compile threads of one model's vocabulary.
pub struct CompilePool {
    jobs: Sender<Job>,
    queue: usize,
}

impl std::fmt::Debug for CompilePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompilePool")
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

impl CompilePool {
    /// Starts `threads` compile threads (at least one) for `vocab`, with at most `queue`
    /// compiles waiting beyond the running ones.
    pub fn new(
        vocab: Arc<ConstraintVocabulary>,
        threads: usize,
        queue: usize,
    ) -> std::io::Result<Self> {
        let (tx, rx) = crossbeam_channel::bounded::<Job>(queue);
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            let vocab = Arc::clone(&vocab);
            std::thread::Builder::new()
                .name(format!("tandem-compile-{i}"))
                .stack_size(COMPILE_STACK_BYTES)
                .spawn(move || {
                    for job in rx {
                        if job.reply.is_closed() {
                            continue;
                        }
                        let _ = job.reply.send(compile_guarded(&vocab, &job.spec));
                    }
                })?;
        }
        Ok(Self { jobs: tx, queue })
    }

    /// Queues `spec`; the answer comes on the returned receiver. Dropping the receiver before
    /// a thread takes the job skips it.
    pub fn submit(
        &self,
        spec: ConstraintSpec,
    ) -> Result<oneshot::Receiver<CompileResult>, CompilePoolError> {
        let (reply, answer) = oneshot::channel();
        match self.jobs.try_send(Job { spec, reply }) {
            Ok(()) => Ok(answer),
            Err(TrySendError::Full(_)) => Err(CompilePoolError::Full { queue: self.queue }),
            Err(TrySendError::Disconnected(_)) => Err(CompilePoolError::Stopped),
        }
    }
}

/// Compiles, turning a panic inside the compiler into this request's error.
fn compile_guarded(vocab: &ConstraintVocabulary, spec: &ConstraintSpec) -> CompileResult {
    catch_unwind(AssertUnwindSafe(|| vocab.compile(spec))).unwrap_or_else(|panic| {
        let why = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        tracing::warn!(kind = spec.kind(), panic = %super::reasons::first_line(&why), "the constraint compiler panicked");
        Err(ConstraintError::TooComplex(
            "the constraint compiler could not build it".into(),
        ))
    })
}
