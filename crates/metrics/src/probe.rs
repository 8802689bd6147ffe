//! `/probe?target=HOST[:PORT]&…`: a short `fatpipe test` to a target,
//! answered as metrics, so Prometheus schedules a measurement mesh the way
//! it schedules blackbox probes.
//!
//! The query is read into a [`ProbeQuery`] (pure, bounded: the duration
//! and streams a scrape may ask for are capped, since every probe sends
//! real traffic), the test runs through `fatpipe-memtest`'s client with the
//! server's own key, and the result is encoded from a registry made for
//! this one request. A test that fails still answers, with
//! `fatpipe_probe_success 0` and the reason in the server's log, as the
//! blackbox exporter does; only a malformed query is an HTTP error.

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fatpipe_engine::ClientOptions;
use fatpipe_memtest::msg::{Direction as TestDir, Protocol, TestParams};
use fatpipe_memtest::TestPlan;
use fatpipe_schema::test::{Direction, TestReport};
use fatpipe_schema::units;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

/// Measured time of a probe unless the query says otherwise.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(5);
/// The longest probe a query may ask for.
pub const MAX_DURATION: Duration = Duration::from_secs(60);
/// The most streams per direction a probe may ask for.
pub const MAX_STREAMS: u32 = 64;
/// The longest query string read (the listener caps the request anyway).
const MAX_QUERY: usize = 2048;

/// Turns the target text (`HOST`, `HOST:PORT`, `[V6]:PORT`) into an
/// address; the binary passes the one `fatpipe test` uses.
pub type Resolver = Arc<dyn Fn(&str) -> Result<SocketAddr, String> + Send + Sync>;

/// What a probe asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeQuery {
    /// The target as written.
    pub target: String,
    /// Measured time.
    pub duration: Duration,
    /// Streams per direction.
    pub streams: u32,
    /// Server to client instead of client to server.
    pub reverse: bool,
    /// Both ways at once.
    pub bidir: bool,
    /// Socket buffer to request, bytes.
    pub window: Option<u64>,
    /// Congestion control to request.
    pub congestion: Option<String>,
}

/// How probes are run: the key and timeouts, and how targets resolve.
#[derive(Clone)]
pub struct Prober {
    /// Key and timeouts of the test's connections.
    pub options: ClientOptions,
    /// Target text to address.
    pub resolve: Resolver,
}

impl std::fmt::Debug for Prober {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prober").finish_non_exhaustive()
    }
}

/// Reads a probe's query string (without the `?`). One line of text saying
/// what is wrong otherwise.
pub fn parse_query(query: &str) -> Result<ProbeQuery, String> {
    if query.len() > MAX_QUERY {
        return Err(format!("query longer than {MAX_QUERY} bytes"));
    }
    let mut q = ProbeQuery {
        target: String::new(),
        duration: DEFAULT_DURATION,
        streams: 1,
        reverse: false,
        bidir: false,
        window: None,
        congestion: None,
    };
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match &*k {
            "target" => q.target = v.into_owned(),
            "duration" => {
                let d = units::parse_duration(&v).map_err(|e| format!("duration: {e}"))?;
                if d.is_zero() || d > MAX_DURATION {
                    return Err(format!(
                        "duration must be above 0 and at most {}",
                        units::format_duration(MAX_DURATION)
                    ));
                }
                q.duration = d;
            }
            "streams" => {
                q.streams = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_STREAMS).contains(n))
                    .ok_or_else(|| format!("streams must be 1..={MAX_STREAMS}"))?;
            }
            "reverse" => q.reverse = flag(&k, &v)?,
            "bidir" => q.bidir = flag(&k, &v)?,
            "window" => q.window = Some(units::parse_size(&v).map_err(|e| format!("window: {e}"))?),
            "congestion" => q.congestion = Some(v.into_owned()),
            // Prometheus adds its own (e.g. `module`); unknown keys are
            // ignored like the other exporters do.
            _ => {}
        }
    }
    if q.target.is_empty() {
        return Err("give a target: /probe?target=HOST[:PORT]".into());
    }
    Ok(q)
}

/// The test parameters of a probe.
pub fn params(q: &ProbeQuery) -> Result<TestParams, String> {
    let p = TestParams {
        protocol: Protocol::Tcp,
        streams: q.streams,
        direction: if q.bidir {
            TestDir::Both
        } else if q.reverse {
            TestDir::Down
        } else {
            TestDir::Up
        },
        duration_ms: q.duration.as_millis() as u64,
        bytes: None,
        omit_ms: 0,
        interval_ms: 1000,
        window: q.window,
        force_buffers: false,
        start_window: None,
        mss: None,
        congestion: q.congestion.clone(),
        fq_rate: None,
        zerocopy: false,
        length: 128 * 1024,
        bitrate: 0,
        no_batch: false,
    };
    p.validate()?;
    Ok(p)
}

/// Runs the probe and returns the exposition text; `Err` only for a query
/// that cannot become a test (bad parameters, a target that does not
/// resolve). A test that fails is a result: success 0, `log` told why.
pub fn run(prober: &Prober, q: &ProbeQuery, log: &dyn Fn(&str)) -> Result<String, String> {
    let params = params(q)?;
    let addr = (prober.resolve)(&q.target)?;
    let plan = TestPlan {
        server: q.target.clone(),
        addr,
        options: prober.options.clone(),
        params,
    };
    let started = Instant::now();
    let result = fatpipe_memtest::run_client(&plan, &mut |_| {});
    let took = started.elapsed();
    if let Err(e) = &result {
        log(&format!("probe of {}: {e}", q.target));
    }
    Ok(encode(result.as_ref().ok(), took))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirLabel {
    direction: String,
}

/// The probe's registry: success, how long it took, and per direction
/// the bytes, throughput, retransmits and RTT of the test's sums.
fn encode(report: Option<&TestReport>, took: Duration) -> String {
    let mut r = Registry::with_prefix("fatpipe_probe");
    let success = Gauge::<i64>::default();
    success.set(i64::from(report.is_some()));
    r.register("success", "Whether the test ran to its end", success);
    let duration = Gauge::<f64, AtomicU64>::default();
    duration.set(took.as_secs_f64());
    r.register_with_unit(
        "duration",
        "How long the probe took, set-up included",
        Unit::Seconds,
        duration,
    );
    if let Some(report) = report {
        let measured = Gauge::<f64, AtomicU64>::default();
        measured.set(report.end.seconds);
        r.register_with_unit(
            "measured",
            "The test's measured time",
            Unit::Seconds,
            measured,
        );
        let bytes = Family::<DirLabel, Gauge>::default();
        let rate = Family::<DirLabel, Gauge<f64, AtomicU64>>::default();
        let retransmits = Family::<DirLabel, Gauge>::default();
        let rtt = Family::<DirLabel, Gauge<f64, AtomicU64>>::default();
        for sum in &report.end.sums {
            let l = DirLabel {
                direction: match sum.direction {
                    Some(Direction::Down) => "down",
                    _ => "up",
                }
                .into(),
            };
            bytes
                .get_or_create(&l)
                .set(i64::try_from(sum.bytes).unwrap_or(i64::MAX));
            rate.get_or_create(&l).set(sum.bits_per_second / 8.0);
            if let Some(n) = sum.retransmits {
                retransmits
                    .get_or_create(&l)
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
            if let Some(us) = sum.rtt_us {
                rtt.get_or_create(&l).set(f64::from(us) / 1e6);
            }
        }
        r.register_with_unit(
            "received",
            "Bytes the receiver got, by direction (up: prober to target)",
            Unit::Bytes,
            bytes,
        );
        r.register_with_unit(
            "throughput",
            "Receiver throughput, by direction",
            Unit::Other("bytes_per_second".into()),
            rate,
        );
        r.register(
            "retransmits",
            "TCP segments the sender retransmitted, by direction",
            retransmits,
        );
        r.register_with_unit(
            "rtt",
            "Mean smoothed RTT of the sending streams, by direction",
            Unit::Seconds,
            rtt,
        );
    }
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &r).is_err() {
        out.clear();
    }
    out
}

fn flag(key: &str, v: &str) -> Result<bool, String> {
    match v {
        "" | "1" | "true" | "yes" => Ok(true),
        "0" | "false" | "no" => Ok(false),
        _ => Err(format!("{key} must be true or false")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_read_with_defaults_and_caps() {
        let q = parse_query("target=dtn2.example.org%3A5301&module=x").unwrap();
        assert_eq!(q.target, "dtn2.example.org:5301");
        assert_eq!((q.duration, q.streams), (DEFAULT_DURATION, 1));
        assert!(!q.reverse && !q.bidir);
        let q = parse_query("target=h&duration=2s&streams=4&reverse=1&window=4M&congestion=bbr")
            .unwrap();
        assert_eq!(q.duration, Duration::from_secs(2));
        assert_eq!(q.streams, 4);
        assert!(q.reverse);
        assert_eq!(q.window, Some(4 << 20));
        assert_eq!(q.congestion.as_deref(), Some("bbr"));
        let p = params(&q).unwrap();
        assert_eq!(p.direction, TestDir::Down);
        assert_eq!(p.duration_ms, 2000);
    }

    #[test]
    fn bad_queries_say_what_is_wrong() {
        for (query, want) in [
            ("", "give a target"),
            ("duration=1s", "give a target"),
            ("target=h&duration=2h", "at most"),
            ("target=h&duration=0s", "above 0"),
            ("target=h&duration=x", "duration"),
            ("target=h&streams=0", "streams must be"),
            ("target=h&streams=65", "streams must be"),
            ("target=h&reverse=maybe", "reverse must be"),
            ("target=h&window=lots", "window"),
        ] {
            let err = parse_query(query).unwrap_err();
            assert!(err.contains(want), "{query}: {err}");
        }
        let long = format!("target={}", "a".repeat(MAX_QUERY));
        assert!(parse_query(&long).unwrap_err().contains("longer"));
        let q = parse_query("target=h&congestion=no%20such").unwrap();
        assert!(params(&q).is_err());
    }

    #[test]
    fn a_failed_probe_is_success_zero_without_results() {
        let t = encode(None, Duration::from_millis(1500));
        assert!(t.contains("fatpipe_probe_success 0\n"), "{t}");
        assert!(t.contains("fatpipe_probe_duration_seconds 1.5\n"), "{t}");
        assert!(!t.contains("throughput"), "{t}");
    }

    #[test]
    fn extreme_numbers_in_a_query_are_refused_without_overflow() {
        for q in [
            "target=a&streams=4294967296",
            "target=a&streams=18446744073709551616",
            "target=a&streams=0",
            "target=a&streams=-1",
            "target=a&duration=18446744073709551615s",
            "target=a&duration=99999999999999999999999h",
            "target=a&duration=0s",
            "target=a&window=18446744073709551615T",
            "target=a&window=99999999999999999999999",
        ] {
            assert!(parse_query(q).is_err(), "{q}");
        }
        // Off by one at the caps.
        let s = |n: u32| parse_query(&format!("target=a&streams={n}"));
        assert!(s(MAX_STREAMS).is_ok());
        assert!(s(MAX_STREAMS + 1).is_err());
        let d = |secs: u64| parse_query(&format!("target=a&duration={secs}s"));
        assert!(d(MAX_DURATION.as_secs()).is_ok());
        assert!(d(MAX_DURATION.as_secs() + 1).is_err());
    }
}
