//! The accept loop: hyper's own connection settings (header-read timeout, which also ends a
//! kept-alive connection left idle), a bound on open connections, and a graceful drain on
//! SIGTERM or SIGINT that ends with the in-flight requests aborted past a deadline.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::routes::Shared;

/// What the accept loop enforces, from the command line.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// A request's headers must arrive within this; an idle kept-alive connection closes
    /// after it too.
    pub header_timeout: Duration,
    /// Connections open at once; more wait in the kernel's backlog.
    pub max_connections: usize,
    /// How long a shutdown lets in-flight requests run before ending them.
    pub shutdown_timeout: Duration,
}

/// Why the accept loop stopped.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Stop {
    Signal,
    EngineGone,
}

/// Binds `addr`.
pub async fn listen(addr: SocketAddr) -> anyhow::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let bound = listener.local_addr()?;
    Ok((listener, bound))
}

/// Sends each write of a connection at once (`TCP_NODELAY`). A streamed response is many
/// small writes; with Nagle's algorithm one waits for the client's acknowledgement of the
/// one before, which a client on a kept-alive connection may delay by 40 ms: the first
/// token of every request after a connection's first arrived about 30 ms late.
pub fn no_delay(tcp: &TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        super::log(format!("could not set TCP_NODELAY on a connection: {e}"));
    }
}

/// Resolves on SIGTERM (what Docker, Kubernetes and systemd send) or SIGINT (Ctrl-C).
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Serves `router` on `listener` until a stop signal, then drains: no new connections,
/// readiness answers 503, in-flight requests run up to `limits.shutdown_timeout`, then are
/// ended (their streams finish with `finish_reason: "abort"`). If the engine thread ends
/// first (it panicked), returns an error, so that the process exits non-zero.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    state: Shared,
    limits: ConnLimits,
) -> anyhow::Result<()> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(limits.header_timeout));
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let engine = state.engine.clone();
    // A signal drains; the engine thread's end (a panic) leaves nothing to drain for.
    let stop = async {
        tokio::select! {
            _ = stop_signal() => Stop::Signal,
            _ = engine.stopped() => Stop::EngineGone,
        }
    };
    tokio::pin!(stop);
    let why = loop {
        let slot = tokio::select! {
            why = &mut stop => break why,
            slot = slots.clone().acquire_owned() => slot?,
        };
        let (tcp, _) = tokio::select! {
            why = &mut stop => break why,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                // Out of descriptors and alike: wait rather than spin.
                Err(e) => {
                    super::log(format!("accept failed: {e}"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        no_delay(&tcp);
        let service = TowerToHyperService::new(router.clone());
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(tcp), service)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // A client that hangs up or times out ends its connection; nothing to report.
            let _ = conn.await;
            drop(slot);
        });
    };
    drop(listener);
    state.draining.store(true, Ordering::SeqCst);
    if why == Stop::EngineGone {
        // Its streams have ended with an error event; give the connections a moment to
        // write it, then exit non-zero so that a supervisor restarts the server.
        let _ = tokio::time::timeout(Duration::from_secs(5), graceful.shutdown()).await;
        anyhow::bail!("the engine thread stopped; the server cannot go on without it");
    }
    let running = state.engine.status().running;
    super::log(format!(
        "stopping: no new connections; {running} requests running get up to {:.0} s",
        limits.shutdown_timeout.as_secs_f64()
    ));
    let drained = graceful.shutdown();
    tokio::pin!(drained);
    if tokio::time::timeout(limits.shutdown_timeout, &mut drained)
        .await
        .is_err()
    {
        super::log("shutdown timeout: ending the requests still running");
        state.engine.cancel_all();
        // Their last events (finish_reason "abort") need a moment to be written.
        if tokio::time::timeout(Duration::from_secs(5), &mut drained)
            .await
            .is_err()
        {
            super::log("some connections did not close; exiting anyway");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// Every connection the server accepts sends its writes at once (a fresh socket has
    /// Nagle's algorithm on, as the client's side shows).
    #[tokio::test]
    async fn accepted_connections_send_without_delay() {
        let any_port = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let (listener, bound) = super::listen(any_port).await.unwrap();
        let client = tokio::net::TcpStream::connect(bound);
        let (accepted, client) = tokio::join!(listener.accept(), client);
        assert!(
            !client.unwrap().nodelay().unwrap(),
            "Nagle's algorithm is on by default"
        );
        let (accepted, _) = accepted.unwrap();
        super::no_delay(&accepted);
        assert!(accepted.nodelay().unwrap());
    }
}
