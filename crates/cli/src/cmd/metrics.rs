//! `fatpipe server --metrics ADDR`: the flags of the Prometheus listener
//! and its wiring (the registry and listener are `fatpipe-metrics`'s).
//!
//! Kept apart from `server.rs` so the server's own flags and the services
//! it registers stay in one short file; this adds an observer to the
//! builder and the metrics port as one of the server's front ends.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use fatpipe_engine::server::DEFAULT_PORT;
use fatpipe_engine::ClientOptions;
use fatpipe_metrics::probe::Prober;
use fatpipe_metrics::{Exporter, Metrics, MetricsPort};

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

/// The bound metrics port: the registry to observe the server with, the
/// address, and the listener with its front end for the server to run.
pub struct Bound {
    pub metrics: Arc<Metrics>,
    pub addr: SocketAddr,
    pub listener: TcpListener,
    pub port: MetricsPort,
}

/// Binds the listener (before the server runs, so a bad address is a
/// usage error), if `--metrics` asked; the server serves it.
pub fn bind(
    args: &MetricsArgs,
    key: Option<fatpipe_proto::Key>,
    log: Arc<dyn Fn(&str) + Send + Sync>,
) -> anyhow::Result<Option<Bound>> {
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
    Ok(Some(Bound {
        metrics,
        addr: bound,
        listener,
        port: MetricsPort::new(exporter),
    }))
}
