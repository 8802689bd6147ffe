//! The HTTP listener of `--metrics`: `GET /metrics`, `GET /probe?…`, and a
//! short index on `/`.
//!
//! Two read-only routes without request bodies do not need a web framework
//! and its async runtime; a maintained parser does (`httparse`, hyper's).
//! The port is an engine front end ([`MetricsPort`]): the server's accept
//! framework bounds it as it bounds the fatpipe protocol's port. A
//! connection here never authenticates, so it holds one of the port's
//! [`CAPS`] for its whole life: at most [`MAX_CONNECTIONS`] at once and
//! [`MAX_CONNECTIONS_PER_SOURCE`] from one address (more are closed
//! unread); the request head, at most [`MAX_REQUEST`] bytes, must arrive
//! by the server's pre-auth deadline (`--preauth-timeout`, from accept,
//! for the whole head); timeouts and malformed requests go to the log
//! summaries. Answers are written within [`WRITE_TIMEOUT`], one request per
//! connection, and at most [`MAX_PROBES`] probes run at once (each sends
//! real traffic; more get 503). [`parse_request`] is the decoder of what a
//! peer sends, and has a fuzz target.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fatpipe_engine::logsum::Event;
use fatpipe_engine::{Conn, FrontEnd, PortCaps};

use crate::probe::{self, Prober};
use crate::{Metrics, CONTENT_TYPE};

/// Connections served at once; more are closed without a word.
pub const MAX_CONNECTIONS: usize = 32;
/// Connections served at once to one address (IPv6: one /64): a scraper
/// and a few probes, not the whole port.
pub const MAX_CONNECTIONS_PER_SOURCE: usize = 8;
/// The port's caps in the engine's accept framework.
pub const CAPS: PortCaps = PortCaps {
    handshakes: MAX_CONNECTIONS,
    handshakes_per_source: MAX_CONNECTIONS_PER_SOURCE,
};
/// The largest request head read (the request line and headers).
pub const MAX_REQUEST: usize = 8 * 1024;
/// Time an answer may take to be written.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Probes running at once.
pub const MAX_PROBES: usize = 2;
/// Headers parsed per request.
const MAX_HEADERS: usize = 32;

/// Why a request could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HttpError {
    /// The request head is larger than [`MAX_REQUEST`].
    #[error("request larger than {MAX_REQUEST} bytes")]
    TooLarge,
    /// Not HTTP.
    #[error("malformed request: {0}")]
    Malformed(String),
    /// A method other than GET or HEAD.
    #[error("method {0} not allowed")]
    Method(String),
}

/// A request head that parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `GET` or `HEAD`.
    pub head_only: bool,
    /// The path, without the query.
    pub path: String,
    /// The query string, without the `?` (empty if none).
    pub query: String,
}

/// What the listener serves.
#[derive(Clone)]
pub struct Exporter {
    /// The server's metrics.
    pub metrics: Arc<Metrics>,
    /// How `/probe` runs tests; `None` turns the route off.
    pub prober: Option<Prober>,
    /// Where a failed probe's reason goes (the server's log).
    pub log: Arc<dyn Fn(&str) + Send + Sync>,
}

/// Parses a request head from the bytes read so far: `Ok(None)` while it
/// is incomplete. Caps the size at [`MAX_REQUEST`].
pub fn parse_request(buf: &[u8]) -> Result<Option<Request>, HttpError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let status = req
        .parse(buf)
        .map_err(|e| HttpError::Malformed(e.to_string()))?;
    if status.is_partial() {
        return if buf.len() >= MAX_REQUEST {
            Err(HttpError::TooLarge)
        } else {
            Ok(None)
        };
    }
    let method = req.method.unwrap_or("");
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        other => return Err(HttpError::Method(other.chars().take(16).collect())),
    };
    let target = req.path.unwrap_or("/");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    Ok(Some(Request {
        head_only,
        path: path.to_string(),
        query: query.to_string(),
    }))
}

/// The metrics port as an engine front end: register it with
/// `ServerBuilder::front_end`, its listener and [`CAPS`].
pub struct MetricsPort {
    exporter: Exporter,
    probes: Arc<AtomicUsize>,
}

impl MetricsPort {
    /// The front end serving `exporter`.
    pub fn new(exporter: Exporter) -> MetricsPort {
        MetricsPort {
            exporter,
            probes: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl FrontEnd for MetricsPort {
    fn name(&self) -> &'static str {
        "metrics"
    }

    fn serve(&self, tcp: TcpStream, conn: Conn) {
        let _ = handle(self, tcp, &conn);
    }
}

/// One of a bounded number of places (connections, probes), given back
/// when dropped.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(counter: &Arc<AtomicUsize>, max: usize) -> Option<Slot> {
        counter
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(Arc::clone(counter)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn handle(shared: &MetricsPort, mut stream: TcpStream, conn: &Conn) -> io::Result<()> {
    let peer = conn.peer();
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    // One deadline for the whole request, not per read: a peer sending a
    // byte now and then must not hold its slot for long.
    let deadline = conn.deadline();
    let timed_out = |stream: &mut TcpStream| {
        conn.summarise(Event::PreauthTimeout);
        respond(stream, 408, "text/plain", "request timed out\n", false)
    };
    let bad = |stream: &mut TcpStream, code: u16, text: &str| {
        conn.summarise(Event::HandshakeFailed);
        respond(stream, code, "text/plain", text, false)
    };
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let req = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return timed_out(&mut stream);
        }
        stream.set_read_timeout(Some(left))?;
        let room = MAX_REQUEST.saturating_sub(buf.len()).min(chunk.len());
        let n = match stream.read(&mut chunk[..room.max(1)]) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return timed_out(&mut stream),
        };
        buf.extend_from_slice(&chunk[..n]);
        match parse_request(&buf) {
            Ok(Some(r)) => break r,
            Ok(None) => {}
            Err(HttpError::TooLarge) => return bad(&mut stream, 431, "request too large\n"),
            Err(e @ HttpError::Method(_)) => return bad(&mut stream, 405, &format!("{e}\n")),
            Err(e) => return bad(&mut stream, 400, &format!("{e}\n")),
        }
    };
    let head = req.head_only;
    match req.path.as_str() {
        "/metrics" => {
            let body = shared.exporter.metrics.encode();
            respond(&mut stream, 200, CONTENT_TYPE, &body, head)
        }
        "/probe" => {
            let Some(prober) = &shared.exporter.prober else {
                return respond(&mut stream, 404, "text/plain", "probes are off\n", head);
            };
            let q = match probe::parse_query(&req.query) {
                Ok(q) => q,
                Err(e) => return respond(&mut stream, 400, "text/plain", &format!("{e}\n"), head),
            };
            let Some(_probe) = Slot::take(&shared.probes, MAX_PROBES) else {
                let busy = format!("{MAX_PROBES} probes are running; retry later\n");
                return respond(&mut stream, 503, "text/plain", &busy, head);
            };
            let log = |line: &str| (shared.exporter.log)(&format!("{peer}: {line}"));
            match probe::run(prober, &q, &log) {
                Ok(body) => respond(&mut stream, 200, CONTENT_TYPE, &body, head),
                Err(e) => respond(&mut stream, 400, "text/plain", &format!("{e}\n"), head),
            }
        }
        "/" => respond(&mut stream, 200, "text/html; charset=utf-8", INDEX, head),
        _ => respond(&mut stream, 404, "text/plain", "not found\n", head),
    }
}

const INDEX: &str = "<html><head><title>fatpipe server</title></head><body>\
<h1>fatpipe server</h1><p><a href=\"/metrics\">/metrics</a> \
&middot; /probe?target=HOST[:PORT]&amp;duration=5s&amp;streams=1&amp;reverse=0</p>\
</body></html>\n";

fn respond(
    stream: &mut TcpStream,
    code: u16,
    content_type: &str,
    body: &str,
    head_only: bool,
) -> io::Result<()> {
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "",
    };
    let mut out = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if !head_only {
        out.push_str(body);
    }
    stream.write_all(out.as_bytes())?;
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{SocketAddr, TcpListener};

    #[test]
    fn requests_parse_in_pieces_and_are_capped() {
        let full = b"GET /probe?target=h&duration=1s HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(parse_request(&full[..20]), Ok(None));
        let r = parse_request(full).unwrap().unwrap();
        assert_eq!(r.path, "/probe");
        assert_eq!(r.query, "target=h&duration=1s");
        assert!(!r.head_only);
        let r = parse_request(b"HEAD /metrics HTTP/1.0\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(r.head_only);
        assert_eq!((r.path.as_str(), r.query.as_str()), ("/metrics", ""));
        let err = parse_request(b"POST /metrics HTTP/1.1\r\n\r\n").unwrap_err();
        assert_eq!(err, HttpError::Method("POST".into()));
        assert!(matches!(
            parse_request(b"\x00\x01garbage\r\n\r\n"),
            Err(HttpError::Malformed(_))
        ));
        let mut big = b"GET /metrics HTTP/1.1\r\nX-Pad: ".to_vec();
        big.resize(MAX_REQUEST, b'a');
        assert_eq!(parse_request(&big), Err(HttpError::TooLarge));
    }

    /// The pre-auth deadline the test servers give a request.
    const READ_TIMEOUT: Duration = Duration::from_secs(5);

    /// Starts an engine server whose only front end is the metrics port
    /// (without probes); returns the port's address.
    fn listener() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let exporter = Exporter {
            metrics: Arc::new(Metrics::new()),
            prober: None,
            log: Arc::new(|_| {}),
        };
        let server = fatpipe_engine::Server::builder()
            .preauth_timeout(READ_TIMEOUT)
            .front_end(l, Arc::new(MetricsPort::new(exporter)), CAPS)
            .bind("127.0.0.1:0".parse().unwrap())
            .unwrap();
        std::thread::spawn(move || server.run());
        addr
    }

    /// A connection to `addr` from the loopback address `from`.
    fn connect_from(from: &str, addr: SocketAddr) -> TcpStream {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        let local: SocketAddr = format!("{from}:0").parse().unwrap();
        s.bind(&local.into()).unwrap();
        s.connect(&addr.into()).unwrap();
        s.into()
    }

    /// What `from` is answered for one request.
    fn ask_from(from: &str, addr: SocketAddr) -> String {
        let mut s = connect_from(from, addr);
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    /// Asks until `from` is closed unanswered (its idle connections, which
    /// the server accepts on its own time, hold their slots by then).
    fn refused_soon(from: &str, addr: SocketAddr) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if ask_from(from, addr).is_empty() {
                return true;
            }
        }
        false
    }

    fn ask(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn the_listener_answers_each_route_and_refuses_what_it_must() {
        let addr = listener();
        let ok = ask(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains(CONTENT_TYPE), "{ok}");
        assert!(ok.contains("fatpipe_auth_failures_total 0"), "{ok}");
        assert!(ok.ends_with("# EOF\n"), "{ok}");
        let head = ask(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(
            head.starts_with("HTTP/1.1 200") && head.ends_with("\r\n\r\n"),
            "{head}"
        );
        for (req, code) in [
            (&b"GET /nope HTTP/1.1\r\n\r\n"[..], "404"),
            (b"GET /probe?target=h HTTP/1.1\r\n\r\n", "404"),
            (b"DELETE /metrics HTTP/1.1\r\n\r\n", "405"),
            (b"\x16\x03\x01 tls hello\r\n\r\n", "400"),
        ] {
            let got = ask(addr, req);
            assert!(
                got.starts_with(&format!("HTTP/1.1 {code}")),
                "{req:?}: {got}"
            );
        }
        let mut big = b"GET /metrics HTTP/1.1\r\nX-Pad: ".to_vec();
        big.resize(MAX_REQUEST, b'a');
        let got = ask(addr, &big);
        assert!(got.starts_with("HTTP/1.1 431"), "{got}");
    }

    #[test]
    fn a_client_trickling_its_request_is_cut_at_one_deadline() {
        let addr = listener();
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let t0 = Instant::now();
        // A byte a second for most of the read timeout, never finishing
        // the request: the deadline holds for the whole of it, so the
        // answer comes at READ_TIMEOUT, not READ_TIMEOUT after the last byte.
        let mut answer = String::new();
        for b in b"GET /metrics HTTP/1.1\r\n".iter().take(4) {
            s.write_all(&[*b]).unwrap();
            std::thread::sleep(Duration::from_millis(1000));
        }
        let _ = s.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
        assert!(
            t0.elapsed() < READ_TIMEOUT + Duration::from_secs(3),
            "{:?}",
            t0.elapsed()
        );
    }

    #[test]
    fn connections_beyond_the_per_source_and_total_caps_are_closed_and_slots_come_back() {
        let addr = listener();
        // One address fills its share; another is still answered.
        let mut idle: Vec<TcpStream> = (0..MAX_CONNECTIONS_PER_SOURCE)
            .map(|_| connect_from("127.0.0.1", addr))
            .collect();
        assert!(
            refused_soon("127.0.0.1", addr),
            "answered past the per-source cap"
        );
        assert!(ask_from("127.0.0.2", addr).starts_with("HTTP/1.1 200"));
        // Addresses enough to fill the port: one more is closed, whoever.
        for i in 2..2 + (MAX_CONNECTIONS / MAX_CONNECTIONS_PER_SOURCE) - 1 {
            let from = format!("127.0.0.{i}");
            idle.extend((0..MAX_CONNECTIONS_PER_SOURCE).map(|_| connect_from(&from, addr)));
        }
        assert!(
            refused_soon("127.0.0.99", addr),
            "answered past the port's cap"
        );
        drop(idle);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut answered = false;
        while !answered && Instant::now() < deadline {
            answered = ask_from("127.0.0.1", addr).starts_with("HTTP/1.1 200")
                && ask_from("127.0.0.99", addr).starts_with("HTTP/1.1 200");
        }
        assert!(answered, "the slots were not given back");
    }
}
