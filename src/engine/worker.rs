//! A compute worker: an OS thread that owns a model's state and runs forward passes, fed by a
//! crossbeam channel and answering through a oneshot.
//!
//! Why it exists: a forward pass takes milliseconds of CPU and must never run on the async
//! runtime, where it would stall every other task (HTTP, streaming, the other actor). Each of
//! the drafter and the verifier owns one worker, so their passes can run at the same time. A
//! worker with a one-thread budget runs its parallel sections inline (`model::kernels::parallel`); with
//! more it uses candle's shared pool, which serialises concurrent callers.

use std::panic::AssertUnwindSafe;
use std::thread::JoinHandle;

use super::error::EngineError;

type Job<S> = Box<dyn FnOnce(&mut S) + Send>;

pub struct ComputeWorker<S> {
    name: String,
    jobs: Option<crossbeam_channel::Sender<Job<S>>>,
    thread: Option<JoinHandle<()>>,
}

impl<S: Send + 'static> ComputeWorker<S> {
    /// Starts the worker thread with `state`; `threads == 1` keeps its passes on that thread.
    pub fn spawn(name: &str, threads: usize, mut state: S) -> Result<Self, EngineError> {
        let (tx, rx) = crossbeam_channel::unbounded::<Job<S>>();
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                crate::model::kernels::parallel::set_inline(threads == 1);
                for job in rx {
                    job(&mut state);
                }
            })
            .map_err(|e| EngineError::Worker(format!("cannot start {name}: {e}")))?;
        Ok(Self {
            name: name.to_owned(),
            jobs: Some(tx),
            thread: Some(thread),
        })
    }

    /// Runs `f` on the worker's state and waits for its result without blocking the runtime.
    /// A panic inside `f` becomes an error; the worker and its state live on.
    pub async fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut S) -> R + Send + 'static,
    ) -> Result<R, EngineError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job<S> = Box::new(move |state| {
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| f(state)));
            let _ = tx.send(result.map_err(|p| panic_message(&p)));
        });
        self.jobs
            .as_ref()
            .and_then(|j| j.send(job).ok())
            .ok_or_else(|| EngineError::Worker(format!("{} has stopped", self.name)))?;
        rx.await
            .map_err(|_| EngineError::Worker(format!("{} dropped a job", self.name)))?
            .map_err(|msg| EngineError::Worker(format!("{} panicked: {msg}", self.name)))
    }
}

impl<S> Drop for ComputeWorker<S> {
    fn drop(&mut self) {
        self.jobs.take(); // closing the channel ends the thread's loop
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn runs_jobs_in_order_on_its_own_thread_and_survives_panics() {
        let w = ComputeWorker::spawn("test-worker", 1, Vec::<u32>::new()).unwrap();
        let main_thread = std::thread::current().id();
        let (tid, inline) = w
            .run(|_| {
                (
                    std::thread::current().id(),
                    crate::model::kernels::parallel::is_inline(),
                )
            })
            .await
            .unwrap();
        assert_ne!(tid, main_thread);
        assert!(
            inline,
            "a one-thread worker runs its parallel sections inline"
        );
        w.run(|v| v.push(1)).await.unwrap();
        let err = w.run(|_| -> u32 { panic!("boom") }).await.unwrap_err();
        assert!(err.to_string().contains("boom"), "{err}");
        w.run(|v| v.push(2)).await.unwrap();
        assert_eq!(w.run(|v| v.clone()).await.unwrap(), vec![1, 2]);
    }
}
