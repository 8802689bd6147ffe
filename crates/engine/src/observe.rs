//! What the server tells whoever watches it: the interface between the
//! server (and its services) and the Prometheus metrics.
//!
//! The engine knows nothing of Prometheus: it calls an [`Observer`] at the
//! few moments that matter (a session opened, refused or ended, a failed
//! authentication), and hands each service a [`Report`] through which the
//! service adds what only it knows (bytes moved, streams open, the result
//! of a test). `fatpipe-metrics` implements the trait over a registry; any
//! other front end of the server (a future iperf3 listener) reports into
//! the same observer with its own service name. Every method has an empty
//! default, and a server built without an observer uses [`NoObserver`], so
//! a service reports unconditionally and costs nothing when nobody listens.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The service returned without an error.
    Ok,
    /// The service failed (the peer vanished, bad input, an I/O error).
    Failed,
    /// The server was shutting down and ended it.
    Aborted,
}

impl Outcome {
    /// The label text: `ok`, `failed`, `aborted`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Failed => "failed",
            Outcome::Aborted => "aborted",
        }
    }
}

/// Why a session was refused before it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The client named a service this server does not offer.
    UnknownService,
    /// The service's `check` refused the parameters.
    BadParameters,
    /// The server was at its session limit.
    Busy,
    /// The server is shutting down.
    ShuttingDown,
    /// Too many connections were still handshaking (a flood); dropped unread.
    HandshakeLimit,
}

impl Refusal {
    /// The label text.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::UnknownService => "unknown_service",
            Refusal::BadParameters => "bad_parameters",
            Refusal::Busy => "busy",
            Refusal::ShuttingDown => "shutting_down",
            Refusal::HandshakeLimit => "handshake_limit",
        }
    }
}

/// Which way bytes moved, seen from the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flow {
    /// The server sent them.
    Sent,
    /// The server received them.
    Received,
}

impl Flow {
    /// The label text: `sent`, `received`.
    pub fn as_str(self) -> &'static str {
        match self {
            Flow::Sent => "sent",
            Flow::Received => "received",
        }
    }
}

/// What the server saw of one finished test, one direction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TestSummary {
    /// The direction, seen from the server.
    pub flow: Flow,
    /// Bytes per second over the measured period.
    pub bytes_per_second: f64,
    /// Segments retransmitted; only known where the server sent.
    pub retransmits: Option<u64>,
    /// Mean smoothed RTT of the streams, where TCP knew it.
    pub rtt: Option<Duration>,
}

/// Receives the server's events. Called from many session threads at once;
/// every method must be quick and must not block.
pub trait Observer: Send + Sync + 'static {
    /// An authenticated session of `service` started.
    fn session_started(&self, service: &'static str) {
        let _ = service;
    }
    /// A session of `service` ended.
    fn session_ended(&self, service: &'static str, outcome: Outcome) {
        let _ = (service, outcome);
    }
    /// A session was refused (the service name is not given: a refused
    /// client may have named any string).
    fn refused(&self, why: Refusal) {
        let _ = why;
    }
    /// A client failed to prove the key.
    fn auth_failed(&self) {}
    /// A session of `service` moved `n` bytes one way.
    fn bytes(&self, service: &'static str, flow: Flow, n: u64) {
        let _ = (service, flow, n);
    }
    /// `delta` data streams of `service` opened (positive) or closed.
    fn streams(&self, service: &'static str, delta: i64) {
        let _ = (service, delta);
    }
    /// The HTTP port answered a request: its method (one of a fixed set,
    /// `other` for the rest) and status code.
    fn http_request(&self, method: &'static str, status: u16) {
        let _ = (method, status);
    }
    /// A test with `peer` finished; what the server saw of it.
    fn test_result(&self, service: &'static str, peer: IpAddr, summary: &TestSummary) {
        let _ = (service, peer, summary);
    }
}

/// The observer of a server nobody watches.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoObserver;

impl Observer for NoObserver {}

/// A session's handle on the observer: the service name and the peer are
/// filled in, so a service reports only what it knows.
#[derive(Clone)]
pub struct Report {
    observer: Arc<dyn Observer>,
    service: &'static str,
    peer: IpAddr,
}

impl std::fmt::Debug for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Report")
            .field("service", &self.service)
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl Report {
    /// A report for one session of `service` with `peer`.
    pub fn new(observer: Arc<dyn Observer>, service: &'static str, peer: IpAddr) -> Report {
        Report {
            observer,
            service,
            peer,
        }
    }

    /// Adds `n` bytes moved one way.
    pub fn bytes(&self, flow: Flow, n: u64) {
        if n > 0 {
            self.observer.bytes(self.service, flow, n);
        }
    }

    /// Counts `n` data streams as open until the returned guard drops
    /// (or is told of more with [`Streams::add`]).
    pub fn streams(&self, n: u64) -> Streams {
        let s = Streams {
            report: self.clone(),
            open: AtomicU64::new(0),
        };
        s.add(n);
        s
    }

    /// The result of a finished test with this session's peer.
    pub fn test_result(&self, summary: &TestSummary) {
        self.observer.test_result(self.service, self.peer, summary);
    }
}

/// Data streams counted as open; dropping it counts them closed.
#[derive(Debug)]
pub struct Streams {
    report: Report,
    open: AtomicU64,
}

impl Streams {
    /// `n` more streams are open.
    pub fn add(&self, n: u64) {
        if n > 0 {
            self.open.fetch_add(n, Ordering::Relaxed);
            self.report
                .observer
                .streams(self.report.service, i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
}

impl Drop for Streams {
    fn drop(&mut self) {
        let n = self.open.swap(0, Ordering::Relaxed);
        if n > 0 {
            self.report
                .observer
                .streams(self.report.service, -i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
}
