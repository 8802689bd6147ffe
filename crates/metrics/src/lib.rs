//! fatpipe-metrics: what `fatpipe server --metrics ADDR` serves to
//! Prometheus: the server's own metrics on `/metrics`, and `/probe`, which
//! runs a short test to a target and answers with its result as metrics
//! (the blackbox/iperf3 exporters' pattern: Prometheus becomes the
//! scheduler of a measurement mesh).
//!
//! Shaped in three parts:
//! - [`Metrics`], a typed registry of `prometheus-client`, which also
//!   encodes it (no hand-written exposition). It implements the engine's
//!   [`Observer`], the small interface through which the server and its
//!   services report; so any front end of the server (the iperf3 listener
//!   too) reports into the same registry under its own service name.
//! - [`probe`]: the probe's parameters (parsed from the query, bounded) and
//!   the test it runs through `fatpipe-memtest`'s client, encoded into a
//!   registry of its own per request.
//! - [`http`]: the listener, an engine front end ([`MetricsPort`]) whose
//!   connections the server's accept framework bounds (per port and per
//!   source, the pre-auth deadline, log summaries). Two GET routes with no
//!   body need no web framework; `httparse` parses the request, and the
//!   route bounds the rest (request size, write timeout, probes at once).
//!
//! Names follow Prometheus conventions: base units (bytes, seconds),
//! `_total` on counters, a `fatpipe_` prefix. Per-peer gauges keep the
//! [`MAX_PEERS`] most recently seen peers, so a server that meets many
//! clients does not grow its exposition without bound.

pub mod http;
pub mod probe;

use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use fatpipe_engine::{Flow, Observer, Outcome, Refusal, TestSummary};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

pub use http::{Exporter, HttpError, MetricsPort};

/// Peers whose last test is kept as gauges; the least recently updated
/// one is dropped for a new one beyond this.
pub const MAX_PEERS: usize = 1000;

/// The content type of the exposition `prometheus-client` writes
/// (OpenMetrics text, which Prometheus scrapes natively).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The server's metrics; report into it through [`Observer`].
pub struct Metrics {
    registry: Registry,
    sessions: Family<ServiceOutcome, Counter>,
    active_sessions: Family<ServiceLabel, Gauge>,
    refused: Family<ReasonLabel, Counter>,
    auth_failures: Counter,
    bytes: Family<ServiceFlow, Counter>,
    active_streams: Family<ServiceLabel, Gauge>,
    http_requests: Family<MethodCode, Counter>,
    peer_throughput: Family<PeerFlow, Gauge<f64, AtomicU64>>,
    peer_retransmits: Family<PeerFlow, Gauge>,
    peer_rtt: Family<PeerLabel, Gauge<f64, AtomicU64>>,
    peer_time: Family<PeerLabel, Gauge<f64, AtomicU64>>,
    /// (service, peer) pairs with gauges, least recently updated first.
    peers: Mutex<VecDeque<(String, String)>>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceOutcome {
    service: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabel {
    service: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceFlow {
    service: String,
    direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodCode {
    method: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerFlow {
    service: String,
    peer: String,
    direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabel {
    service: String,
    peer: String,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A registry with every metric registered (at zero).
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("fatpipe");
        registry.register(
            "build",
            "The fatpipe version serving these metrics",
            Info::new(VersionLabel {
                version: env!("CARGO_PKG_VERSION").into(),
            }),
        );
        let sessions = Family::<ServiceOutcome, Counter>::default();
        registry.register(
            "sessions",
            "Sessions that ended, by service and outcome (ok, failed, aborted by shutdown)",
            sessions.clone(),
        );
        let active_sessions = Family::<ServiceLabel, Gauge>::default();
        registry.register(
            "active_sessions",
            "Sessions running now, by service",
            active_sessions.clone(),
        );
        let refused = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "refused_sessions",
            "Sessions refused before they started, by reason",
            refused.clone(),
        );
        let auth_failures = Counter::default();
        registry.register(
            "auth_failures",
            "Connections that failed to prove the pre-shared key",
            auth_failures.clone(),
        );
        let bytes = Family::<ServiceFlow, Counter>::default();
        registry.register_with_unit(
            "data",
            "Payload bytes moved by sessions, by service and direction seen from the server",
            Unit::Bytes,
            bytes.clone(),
        );
        let active_streams = Family::<ServiceLabel, Gauge>::default();
        registry.register(
            "active_streams",
            "Data streams open now, by service",
            active_streams.clone(),
        );
        let http_requests = Family::<MethodCode, Counter>::default();
        registry.register(
            "http_requests",
            "Requests the HTTP/WebDAV port answered, by method and status code",
            http_requests.clone(),
        );
        let peer_throughput = Family::<PeerFlow, Gauge<f64, AtomicU64>>::default();
        registry.register_with_unit(
            "peer_last_test_throughput",
            "Throughput of the last test with a peer, as the server measured it, by direction",
            Unit::Other("bytes_per_second".into()),
            peer_throughput.clone(),
        );
        let peer_retransmits = Family::<PeerFlow, Gauge>::default();
        registry.register(
            "peer_last_test_retransmits",
            "TCP segments the server retransmitted in the last test with a peer",
            peer_retransmits.clone(),
        );
        let peer_rtt = Family::<PeerLabel, Gauge<f64, AtomicU64>>::default();
        registry.register_with_unit(
            "peer_last_test_rtt",
            "Mean smoothed RTT of the last test with a peer",
            Unit::Seconds,
            peer_rtt.clone(),
        );
        let peer_time = Family::<PeerLabel, Gauge<f64, AtomicU64>>::default();
        registry.register_with_unit(
            "peer_last_test_timestamp",
            "When the last test with a peer ended, Unix time",
            Unit::Seconds,
            peer_time.clone(),
        );
        Metrics {
            registry,
            sessions,
            active_sessions,
            refused,
            auth_failures,
            bytes,
            active_streams,
            http_requests,
            peer_throughput,
            peer_retransmits,
            peer_rtt,
            peer_time,
            peers: Mutex::new(VecDeque::new()),
        }
    }

    /// Creates every series of `services` that a session may touch, and of
    /// every refusal reason, at zero: a series that appears only at its
    /// first increment hides that increment from `rate()` and leaves a
    /// dashboard empty until then (Prometheus's advice).
    pub fn declare_services(&self, services: &[&'static str]) {
        for refusal in [
            Refusal::UnknownService,
            Refusal::BadParameters,
            Refusal::Busy,
            Refusal::ShuttingDown,
            Refusal::HandshakeLimit,
        ] {
            let _ = self.refused.get_or_create(&ReasonLabel {
                reason: refusal.as_str().into(),
            });
        }
        for &service in services {
            let s = ServiceLabel {
                service: service.into(),
            };
            let _ = self.active_sessions.get_or_create(&s);
            let _ = self.active_streams.get_or_create(&s);
            for outcome in [Outcome::Ok, Outcome::Failed, Outcome::Aborted] {
                let _ = self.sessions.get_or_create(&ServiceOutcome {
                    service: service.into(),
                    outcome: outcome.as_str().into(),
                });
            }
            for flow in [Flow::Sent, Flow::Received] {
                let _ = self.bytes.get_or_create(&ServiceFlow {
                    service: service.into(),
                    direction: flow.as_str().into(),
                });
            }
        }
    }

    /// The exposition text (OpenMetrics, see [`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an encoder error would be a
        // bug in a metric, and an empty answer says so to the scraper.
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }

    /// Marks `peer` as just updated; drops the gauges of the least
    /// recently updated peer beyond [`MAX_PEERS`].
    fn touch_peer(&self, service: &str, peer: &str) {
        let mut peers = lock(&self.peers);
        if let Some(i) = peers.iter().position(|(s, p)| s == service && p == peer) {
            peers.remove(i);
        }
        peers.push_back((service.to_string(), peer.to_string()));
        while peers.len() > MAX_PEERS {
            let Some((old_service, old)) = peers.pop_front() else {
                break;
            };
            self.forget_peer(&old_service, &old);
        }
    }

    fn forget_peer(&self, service: &str, peer: &str) {
        for flow in [Flow::Sent, Flow::Received] {
            let l = peer_flow(service, peer, flow);
            self.peer_throughput.remove(&l);
            self.peer_retransmits.remove(&l);
        }
        let l = PeerLabel {
            service: service.into(),
            peer: peer.into(),
        };
        self.peer_rtt.remove(&l);
        self.peer_time.remove(&l);
    }
}

impl Observer for Metrics {
    fn session_started(&self, service: &'static str) {
        self.active_sessions
            .get_or_create(&ServiceLabel {
                service: service.into(),
            })
            .inc();
    }

    fn session_ended(&self, service: &'static str, outcome: Outcome) {
        self.active_sessions
            .get_or_create(&ServiceLabel {
                service: service.into(),
            })
            .dec();
        self.sessions
            .get_or_create(&ServiceOutcome {
                service: service.into(),
                outcome: outcome.as_str().into(),
            })
            .inc();
    }

    fn refused(&self, why: Refusal) {
        self.refused
            .get_or_create(&ReasonLabel {
                reason: why.as_str().into(),
            })
            .inc();
    }

    fn auth_failed(&self) {
        self.auth_failures.inc();
    }

    fn bytes(&self, service: &'static str, flow: Flow, n: u64) {
        self.bytes
            .get_or_create(&ServiceFlow {
                service: service.into(),
                direction: flow.as_str().into(),
            })
            .inc_by(n);
    }

    fn streams(&self, service: &'static str, delta: i64) {
        self.active_streams
            .get_or_create(&ServiceLabel {
                service: service.into(),
            })
            .inc_by(delta);
    }

    fn http_request(&self, method: &'static str, status: u16) {
        self.http_requests
            .get_or_create(&MethodCode {
                method: method.into(),
                code: status.to_string(),
            })
            .inc();
    }

    fn test_result(&self, service: &'static str, peer: IpAddr, s: &TestSummary) {
        let peer = peer.to_string();
        self.touch_peer(service, &peer);
        let l = peer_flow(service, &peer, s.flow);
        self.peer_throughput
            .get_or_create(&l)
            .set(s.bytes_per_second);
        match s.retransmits {
            Some(n) => {
                self.peer_retransmits
                    .get_or_create(&l)
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
            None => {
                self.peer_retransmits.remove(&l);
            }
        }
        let pl = PeerLabel {
            service: service.into(),
            peer,
        };
        if let Some(rtt) = s.rtt {
            self.peer_rtt.get_or_create(&pl).set(rtt.as_secs_f64());
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.peer_time.get_or_create(&pl).set(now);
    }
}

fn peer_flow(service: &str, peer: &str, flow: Flow) -> PeerFlow {
    PeerFlow {
        service: service.into(),
        peer: peer.into(),
        direction: flow.as_str().into(),
    }
}

/// Locks a mutex, recovering from a panicked holder: the peer list stays
/// valid whatever happened mid-update.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The value of the sample `name{labels}` (labels as written), if any.
    pub(crate) fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn the_exposition_names_follow_prometheus_conventions() {
        let m = Metrics::new();
        m.session_started("test");
        m.session_ended("test", Outcome::Ok);
        m.refused(Refusal::Busy);
        m.auth_failed();
        m.bytes("test", Flow::Received, 1000);
        m.bytes("test", Flow::Received, 500);
        m.streams("test", 4);
        m.streams("test", -1);
        let t = m.encode();
        let want = [
            (
                "fatpipe_sessions_total{service=\"test\",outcome=\"ok\"}",
                1.0,
            ),
            ("fatpipe_active_sessions{service=\"test\"}", 0.0),
            ("fatpipe_refused_sessions_total{reason=\"busy\"}", 1.0),
            ("fatpipe_auth_failures_total", 1.0),
            (
                "fatpipe_data_bytes_total{service=\"test\",direction=\"received\"}",
                1500.0,
            ),
            ("fatpipe_active_streams{service=\"test\"}", 3.0),
            (
                &format!(
                    "fatpipe_build_info{{version=\"{}\"}}",
                    env!("CARGO_PKG_VERSION")
                ),
                1.0,
            ),
        ];
        for (series, value) in want {
            assert_eq!(sample(&t, series), Some(value), "{series} in\n{t}");
        }
        assert!(t.ends_with("# EOF\n"), "{t}");
    }

    #[test]
    fn a_test_result_sets_the_peer_gauges() {
        let m = Metrics::new();
        let peer: IpAddr = "198.18.0.2".parse().unwrap();
        m.test_result(
            "test",
            peer,
            &TestSummary {
                flow: Flow::Sent,
                bytes_per_second: 1.25e8,
                retransmits: Some(3),
                rtt: Some(Duration::from_millis(93)),
            },
        );
        let t = m.encode();
        let pf = "{service=\"test\",peer=\"198.18.0.2\",direction=\"sent\"}";
        let p = "{service=\"test\",peer=\"198.18.0.2\"}";
        assert_eq!(
            sample(
                &t,
                &format!("fatpipe_peer_last_test_throughput_bytes_per_second{pf}")
            ),
            Some(1.25e8),
            "{t}"
        );
        assert_eq!(
            sample(&t, &format!("fatpipe_peer_last_test_retransmits{pf}")),
            Some(3.0)
        );
        assert_eq!(
            sample(&t, &format!("fatpipe_peer_last_test_rtt_seconds{p}")),
            Some(0.093)
        );
        assert!(sample(&t, &format!("fatpipe_peer_last_test_timestamp_seconds{p}")).is_some());
    }

    #[test]
    fn peer_gauges_are_kept_for_the_most_recent_peers_only() {
        let m = Metrics::new();
        let s = TestSummary {
            flow: Flow::Received,
            bytes_per_second: 1.0,
            retransmits: None,
            rtt: None,
        };
        for i in 0..=MAX_PEERS as u32 {
            m.test_result("test", IpAddr::from((0x0a00_0000u32 + i).to_be_bytes()), &s);
        }
        let t = m.encode();
        let series = |ip: &str| {
            format!(
                "fatpipe_peer_last_test_throughput_bytes_per_second{{service=\"test\",peer=\"{ip}\",direction=\"received\"}}"
            )
        };
        assert_eq!(sample(&t, &series("10.0.0.0")), None, "the oldest went");
        assert_eq!(sample(&t, &series("10.0.0.1")), Some(1.0));
        assert_eq!(sample(&t, &series("10.0.3.232")), Some(1.0));
        let peers = t
            .lines()
            .filter(|l| l.starts_with("fatpipe_peer_last_test_throughput_bytes_per_second{"))
            .count();
        assert_eq!(peers, MAX_PEERS);
    }

    #[test]
    fn declared_services_are_exposed_at_zero() {
        let m = Metrics::new();
        m.declare_services(&["copy", "test"]);
        let t = m.encode();
        for series in [
            "fatpipe_sessions_total{service=\"copy\",outcome=\"aborted\"}",
            "fatpipe_active_streams{service=\"test\"}",
            "fatpipe_data_bytes_total{service=\"test\",direction=\"sent\"}",
            "fatpipe_refused_sessions_total{reason=\"handshake_limit\"}",
        ] {
            assert_eq!(sample(&t, series), Some(0.0), "{series} in\n{t}");
        }
    }
}
