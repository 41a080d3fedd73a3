//! Accepting connections: HTTP/1.1 with a deadline for every request's headers, and graceful
//! shutdown.
//!
//! Why it exists: `axum::serve` sets no timer on its connections, so a client that opens a
//! connection and sends half a header (or nothing) holds a socket and a task for ever; a few
//! thousand such clients exhaust the server's file descriptors. Here every connection must
//! deliver a request's headers within `server.header_timeout_seconds`, which also bounds how
//! long a kept-alive connection may sit idle between requests (hyper starts the same clock
//! when it waits for the next request). Bodies have their own deadline where they are read
//! (`read_body`, 408). HTTP/2 is not served: every OpenAI client speaks HTTP/1.1.

use std::pin::pin;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Serves `app` on `listener` until `stop` turns true; then stops accepting, lets open
/// connections finish their requests (each is told to close after its current one), and
/// returns once they have.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    header_timeout: Duration,
    mut stop: watch::Receiver<bool>,
) {
    // Every connection task holds a receiver; `closed()` waits for the last one to go.
    let (open_tx, open_rx) = watch::channel(());
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, say: back off instead of spinning.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stopped(&mut stop) => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let mut stop = stop.clone();
        let open = open_rx.clone();
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout);
            let mut conn = pin!(builder.serve_connection(TokioIo::new(stream), service));
            let mut stopping = false;
            loop {
                tokio::select! {
                    result = conn.as_mut() => {
                        if let Err(e) = result {
                            tracing::debug!(error = %e, "connection ended with an error");
                        }
                        break;
                    }
                    _ = stopped(&mut stop), if !stopping => {
                        stopping = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
            drop(open);
        });
    }
    drop(open_rx);
    drop(listener);
    open_tx.closed().await;
}

/// Resolves once `stop` is true (the guard `wait_for` returns is not kept across awaits).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
