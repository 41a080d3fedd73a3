//! Running requests from tests: the tokio runtime the engine is driven from.

/// The tokio runtime engine tests drive the engine from: two workers, like the machine's cores.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
