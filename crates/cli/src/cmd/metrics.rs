//! `fatpipe server --metrics ADDR`: the flags of the Prometheus listener
//! and its wiring (the registry and listener are `fatpipe-metrics`'s).
//!
//! Kept apart from `server.rs` so the server's own flags and the services
//! it registers stay in one short file; this adds an observer to the
//! builder and a listener thread beside the server.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use fatpipe_engine::server::DEFAULT_PORT;
use fatpipe_engine::ClientOptions;
use fatpipe_metrics::probe::Prober;
use fatpipe_metrics::{Exporter, Metrics};

/// The metrics flags of `fatpipe server`.
#[derive(Debug, clap::Args)]
pub struct MetricsArgs {
    /// Serve Prometheus metrics on ADDR (`/metrics`, and `/probe?target=HOST`
    /// which runs a short test to HOST), e.g. 127.0.0.1:9301; port 0 picks
    /// one (printed as `metrics on IP:PORT`, the second stdout line).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// Serve `/metrics` only: no `/probe`, so scrapers cannot make this
    /// host send test traffic.
    #[arg(long, requires = "metrics")]
    pub no_probe: bool,
}

/// Binds the listener (before the server runs, so a bad address is a
/// usage error) and serves it on a thread. Returns the registry to
/// observe the server with and the bound address, if `--metrics` asked.
pub fn start(
    args: &MetricsArgs,
    key: Option<fatpipe_proto::Key>,
    log: Arc<dyn Fn(&str) + Send + Sync>,
) -> anyhow::Result<Option<(Arc<Metrics>, SocketAddr)>> {
    let Some(addr) = args.metrics else {
        return Ok(None);
    };
    let listener = TcpListener::bind(addr)
        .map_err(|e| crate::exit::usage(format!("--metrics: bind {addr}: {e}")))?;
    let bound = listener.local_addr()?;
    let metrics = Arc::new(Metrics::new());
    let prober = (!args.no_probe).then(|| Prober {
        options: ClientOptions {
            key,
            ..ClientOptions::default()
        },
        resolve: Arc::new(|target: &str| {
            super::common::resolve(target, DEFAULT_PORT).map_err(|e| crate::exit::one_line(&e))
        }),
    });
    let exporter = Exporter {
        metrics: Arc::clone(&metrics),
        prober,
        log,
    };
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || fatpipe_metrics::serve(listener, exporter))?;
    Ok(Some((metrics, bound)))
}
