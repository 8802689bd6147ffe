//! Serving stock iperf3 clients (`fatpipe server --iperf3-port PORT`),
//! many at once, each in its own session.
//!
//! iperf3 clients connect every TCP connection, control and data, to one
//! port, and tell them apart only by the 37-byte cookie they send first: a
//! cookie that a session is waiting for makes a data stream of that
//! session, any other starts a new session. UDP streams say only "9876"
//! from their own address, so a hello is given to the session that waits
//! for UDP streams from that IP; sessions from one IP take turns creating
//! UDP streams (the per-IP lock) so that hellos cannot cross. Each UDP
//! stream gets its own socket bound to the same port and connected to the
//! client, which the kernel prefers over the shared hello socket.
//!
//! Bounds: at most `max_sessions` sessions (more get iperf3's
//! `ACCESS_DENIED`), at most [`MAX_HANDSHAKES`] connections reading their
//! cookie at once, every read before the test runs under the handshake
//! timeout, at most 128 streams per direction, and a watchdog of the test's
//! length plus 40 s as in iperf3. An option this server does not carry out
//! gets iperf3's own `SERVER_ERROR` (with its error number) rather than a
//! hang.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fatpipe_schema::test::{Direction, Protocol};
use fatpipe_schema::units;
use socket2::{Domain, Socket, Type};

use crate::data::Shared;
use crate::session::{
    our_results, spawn, unexpected, Control, Sampler, Sock, Stream, Totals, Work, DRAIN, QUIET,
    STEP_TIMEOUT,
};
use crate::wire::{
    self, errno, Cookie, Expect, Msg, Params, Results, State, Transport, WireError,
    MAX_PARAMS_JSON, MAX_RESULTS_JSON,
};
use crate::{Iperf3Error, Result};

/// Most connections reading their first bytes at once.
pub const MAX_HANDSHAKES: usize = 256;
/// Extra time past a test's length before the watchdog ends it (iperf3's
/// grace of four round trips of 1 s times ten transitions).
const GRACE: Duration = Duration::from_secs(40);

/// A line of the server's log.
pub type Logger = Arc<dyn Fn(&str) + Send + Sync>;

/// How the server runs.
#[derive(Clone)]
pub struct Options {
    /// Most sessions at once.
    pub max_sessions: usize,
    /// Limit for a connection's cookie, the parameters and stream setup.
    pub handshake_timeout: Duration,
    /// Where session lines go.
    pub logger: Logger,
    /// iperf3's RSA authentication: when set, every client must present
    /// a token this admits.
    pub auth: Option<Arc<crate::auth::Authorizer>>,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("max_sessions", &self.max_sessions)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("auth", &self.auth.is_some())
            .finish_non_exhaustive()
    }
}

/// A bound iperf3 server.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    hellos: UdpSocket,
    inner: Arc<Inner>,
}

struct Inner {
    opts: Options,
    local: SocketAddr,
    /// Sessions waiting for TCP data streams, by cookie; each stream comes
    /// with its place in the accept order.
    pending: Mutex<HashMap<Cookie, SyncSender<(u64, TcpStream)>>>,
    /// Cookies of running sessions: a late stream is refused.
    active: Mutex<HashSet<Cookie>>,
    /// The session waiting for UDP hellos from each client IP.
    udp_waiters: Mutex<HashMap<IpAddr, SyncSender<SocketAddr>>>,
    /// Client IPs with a session creating UDP streams.
    udp_busy: (Mutex<HashSet<IpAddr>>, Condvar),
    sessions: AtomicUsize,
    handshakes: AtomicUsize,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Binds TCP and UDP on `addr` (port 0 picks one free for both).
    pub fn bind(addr: SocketAddr, opts: Options) -> Result<Server> {
        let listener =
            TcpListener::bind(addr).map_err(|e| Iperf3Error::io(format!("bind TCP {addr}"), e))?;
        let local = listener
            .local_addr()
            .map_err(|e| Iperf3Error::io("read the bound address", e))?;
        let hellos =
            udp_socket(local).map_err(|e| Iperf3Error::io(format!("bind UDP {local}"), e))?;
        Ok(Server {
            listener,
            hellos,
            inner: Arc::new(Inner {
                opts,
                local,
                pending: Mutex::default(),
                active: Mutex::default(),
                udp_waiters: Mutex::default(),
                udp_busy: (Mutex::default(), Condvar::new()),
                sessions: AtomicUsize::new(0),
                handshakes: AtomicUsize::new(0),
            }),
        })
    }

    /// The address both sockets are bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local
    }

    /// Serves on threads of its own; returns at once.
    pub fn spawn(self) -> Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name("iperf3 accept".into())
            .spawn(move || self.run())
            .map_err(|e| Iperf3Error::io("start the iperf3 server", e))
    }

    /// Serves until the process ends.
    pub fn run(self) {
        let inner = Arc::clone(&self.inner);
        let hellos = self.hellos;
        let started = std::thread::Builder::new()
            .name("iperf3 udp hellos".into())
            .spawn(move || route_hellos(&hellos, &inner));
        if let Err(e) = started {
            (self.inner.opts.logger)(&format!("iperf3: no UDP: cannot start its thread: {e}"));
        }
        // Streams are numbered in the order they were accepted: their
        // threads may read the cookies in another order, and iperf3 tells
        // a stream's role and id only by its place.
        for (seq, conn) in (1u64..).zip(self.listener.incoming()) {
            let sock = match conn {
                Ok(s) => s,
                Err(e) => {
                    // Out of descriptors or similar: wait rather than spin.
                    (self.inner.opts.logger)(&format!("iperf3: accept: {e}"));
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            if self.inner.handshakes.fetch_add(1, Ordering::AcqRel) >= MAX_HANDSHAKES {
                self.inner.handshakes.fetch_sub(1, Ordering::AcqRel);
                continue;
            }
            let inner = Arc::clone(&self.inner);
            let r = std::thread::Builder::new()
                .name("iperf3 conn".into())
                .spawn(move || connection(sock, seq, &inner));
            if r.is_err() {
                self.inner.handshakes.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

/// A UDP socket on `addr` that shares the port with the per-stream ones.
fn udp_socket(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    let s = Socket::new(
        Domain::for_address(addr),
        Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.bind(&addr.into())?;
    Ok(s.into())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Hands each UDP hello to the session waiting for its IP; others are
/// dropped (stray datagrams, late data, hellos nobody asked for).
fn route_hellos(sock: &UdpSocket, inner: &Inner) {
    let mut buf = [0u8; 2048];
    loop {
        let Ok((_, peer)) = sock.recv_from(&mut buf) else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        if let Some(tx) = lock(&inner.udp_waiters).get(&peer.ip()) {
            let _ = tx.try_send(peer);
        }
    }
}

/// Counts a handshaking connection until dropped.
struct Handshake<'a>(&'a Inner);

impl Drop for Handshake<'_> {
    fn drop(&mut self) {
        self.0.handshakes.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Reads a connection's cookie and makes it a data stream or a session.
fn connection(mut sock: TcpStream, seq: u64, inner: &Inner) {
    let hs = Handshake(inner);
    let peer = sock.peer_addr().ok();
    let _ = sock.set_read_timeout(Some(inner.opts.handshake_timeout));
    let _ = sock.set_write_timeout(Some(inner.opts.handshake_timeout));
    let mut cookie = [0u8; wire::COOKIE_LEN];
    if sock.read_exact(&mut cookie).is_err() {
        return;
    }
    if let Some(tx) = lock(&inner.pending).get(&cookie) {
        let _ = tx.try_send((seq, sock));
        return;
    }
    if lock(&inner.active).contains(&cookie) {
        let _ = sock.write_all(&[State::AccessDenied.byte()]);
        return;
    }
    if inner.sessions.fetch_add(1, Ordering::AcqRel) >= inner.opts.max_sessions {
        inner.sessions.fetch_sub(1, Ordering::AcqRel);
        let _ = sock.write_all(&[State::AccessDenied.byte()]);
        (inner.opts.logger)(&format!("iperf3: refused {}: busy", show(peer)));
        return;
    }
    drop(hs);
    lock(&inner.active).insert(cookie);
    let mut ctrl = Control::new(sock);
    let r = session(&mut ctrl, inner, cookie, peer);
    lock(&inner.active).remove(&cookie);
    lock(&inner.pending).remove(&cookie);
    inner.sessions.fetch_sub(1, Ordering::AcqRel);
    let line = match r {
        Ok(summary) => format!("iperf3: {} {summary}", show(peer)),
        Err(Refusal { i_errno, why }) => {
            // The client prints iperf3's own words for the number.
            let _ = ctrl.write(&wire::encode_server_error(i_errno, 0), "send the error");
            format!("iperf3: {} refused: {why}", show(peer))
        }
    };
    (inner.opts.logger)(&line);
}

fn show(peer: Option<SocketAddr>) -> String {
    peer.map_or_else(|| "?".into(), |p| p.to_string())
}

/// Why a session ended early: iperf3's error number for the client.
struct Refusal {
    i_errno: i32,
    why: String,
}

impl Refusal {
    fn new(i_errno: i32, why: impl Into<String>) -> Refusal {
        Refusal {
            i_errno,
            why: why.into(),
        }
    }
}

impl From<Iperf3Error> for Refusal {
    fn from(e: Iperf3Error) -> Refusal {
        let i_errno = match &e {
            Iperf3Error::Wire(WireError::Refused { i_errno, .. }) => *i_errno,
            Iperf3Error::Closed(_) => errno::CTRLCLOSE,
            Iperf3Error::Unexpected { .. } => errno::MESSAGE,
            _ => errno::RECVPARAMS,
        };
        Refusal::new(i_errno, e.to_string())
    }
}

/// One client's test, from `PARAM_EXCHANGE` to `IPERF_DONE`; returns the
/// log line's summary.
fn session(
    ctrl: &mut Control,
    inner: &Inner,
    cookie: Cookie,
    peer: Option<SocketAddr>,
) -> std::result::Result<String, Refusal> {
    let step = inner.opts.handshake_timeout;
    ctrl.send_state(State::ParamExchange)?;
    let doc = match ctrl.read(
        Expect::Json(MAX_PARAMS_JSON),
        step,
        "reading the parameters",
    )? {
        Some(Msg::Json(d)) => d,
        Some(m) => return Err(unexpected(m, "reading the parameters").into()),
        None => return Err(Refusal::new(errno::RECVPARAMS, "no parameters in time")),
    };
    let p = Params::parse(&doc).map_err(|e| Refusal::new(errno::RECVPARAMS, e.to_string()))?;
    p.check().map_err(|e| Refusal::from(Iperf3Error::from(e)))?;
    if let Some(a) = &inner.opts.auth {
        // The client hears only iperf3's "test authorization failed"; why
        // goes to this server's log.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let user = a
            .check(p.authtoken.as_deref(), now)
            .map_err(|e| Refusal::new(errno::AUTHTEST, e.to_string()))?;
        (inner.opts.logger)(&format!("iperf3: {} authenticated as {user:?}", show(peer)));
    }
    let protocol = match p.transport {
        Some(Transport::Tcp) => Protocol::Tcp,
        Some(Transport::Udp) => Protocol::Udp,
        Some(Transport::Sctp) => return Err(Refusal::new(errno::UNIMP, "SCTP is not supported")),
        None => {
            return Err(Refusal::new(
                errno::RECVPARAMS,
                "no protocol in the parameters",
            ))
        }
    };
    if let Some(key) = p.unsupported.first() {
        return Err(Refusal::new(
            errno::UNIMP,
            format!("option {key} is not supported"),
        ));
    }
    let n = p.parallel as usize;
    let total = if p.bidirectional { 2 * n } else { n };
    let streams = match protocol {
        Protocol::Tcp => tcp_streams(ctrl, inner, cookie, &p, total)?,
        Protocol::Udp => udp_streams(ctrl, inner, peer, &p, total)?,
    };
    let streams: Vec<Stream> = streams
        .into_iter()
        .enumerate()
        .map(|(i, sock)| {
            let direction = if p.bidirectional {
                if i < n {
                    Direction::Up
                } else {
                    Direction::Down
                }
            } else if p.reverse {
                Direction::Down
            } else {
                Direction::Up
            };
            Stream::new(i, direction, sock)
        })
        .collect();
    let congestion = configure(&streams, &p)?;
    ctrl.send_state(State::TestStart)?;
    ctrl.send_state(State::TestRunning)?;
    let len = p.len.unwrap_or(match protocol {
        Protocol::Tcp => 128 * 1024,
        Protocol::Udp => 1460,
    });
    let sends = streams.iter().any(|s| s.direction == Direction::Down);
    let budget = if !sends {
        None
    } else if p.num > 0 {
        Some(p.num)
    } else if p.blockcount > 0 {
        Some(p.blockcount.saturating_mul(u64::from(len)))
    } else {
        None
    };
    let shared = Shared::new(budget);
    let work = Work {
        sends: Direction::Down,
        length: len,
        zerocopy: false,
        bitrate: match protocol {
            Protocol::Udp => p.bandwidth.unwrap_or(1_000_000),
            Protocol::Tcp => 0,
        },
        wide: p.udp_counters_64bit,
    };
    let cpu_start = fatpipe_sys::CpuSample::now().ok();
    let workers = spawn(work, &streams, &shared).map_err(Refusal::from)?;
    let mut sampler = Sampler::new(protocol, Direction::Down, p.omit, &streams);
    let r = run(
        ctrl,
        &p,
        &shared,
        &streams,
        &mut sampler,
        congestion,
        cpu_start,
    );
    shared.stop_send.store(true, Ordering::Relaxed);
    shared.stop_recv.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.join();
    }
    r
}

/// Waits for the session's TCP streams, each presenting its cookie.
fn tcp_streams(
    ctrl: &mut Control,
    inner: &Inner,
    cookie: Cookie,
    _p: &Params,
    total: usize,
) -> std::result::Result<Vec<Sock>, Refusal> {
    let (tx, rx) = mpsc::sync_channel(total);
    lock(&inner.pending).insert(cookie, tx);
    let r = (|| {
        ctrl.send_state(State::CreateStreams)?;
        collect(&rx, total, inner.opts.handshake_timeout)
    })();
    lock(&inner.pending).remove(&cookie);
    let mut streams = r?;
    streams.sort_by_key(|(seq, _)| *seq);
    Ok(streams
        .into_iter()
        .map(|(_, s)| {
            let _ = s.set_read_timeout(None);
            let _ = s.set_write_timeout(None);
            Sock::Tcp(s)
        })
        .collect())
}

fn collect<T>(rx: &Receiver<T>, total: usize, limit: Duration) -> Result<Vec<T>> {
    let deadline = Instant::now() + limit;
    let mut out = Vec::with_capacity(total);
    while out.len() < total {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(s) => out.push(s),
            Err(_) => {
                return Err(Iperf3Error::Wire(WireError::Refused {
                    i_errno: errno::STREAMACCEPT,
                    what: format!("only {} of {total} streams connected in time", out.len()),
                }))
            }
        }
    }
    Ok(out)
}

/// Takes the client IP's turn, then answers each of its UDP hellos with a
/// socket of its own connected to that stream.
fn udp_streams(
    ctrl: &mut Control,
    inner: &Inner,
    peer: Option<SocketAddr>,
    p: &Params,
    total: usize,
) -> std::result::Result<Vec<Sock>, Refusal> {
    let ip = peer
        .map(|a| a.ip())
        .ok_or_else(|| Refusal::new(errno::STREAMACCEPT, "no peer address"))?;
    let deadline = Instant::now() + inner.opts.handshake_timeout;
    {
        let (m, cv) = &inner.udp_busy;
        let mut busy = lock(m);
        while busy.contains(&ip) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Refusal::new(
                    errno::ACCESSDENIED,
                    "another test from this IP is creating UDP streams",
                ));
            }
            busy = cv
                .wait_timeout(busy, left)
                .map_or_else(|p| p.into_inner().0, |(g, _)| g);
        }
        busy.insert(ip);
    }
    let (tx, rx) = mpsc::sync_channel(total);
    lock(&inner.udp_waiters).insert(ip, tx);
    let r = (|| -> Result<Vec<Sock>> {
        ctrl.send_state(State::CreateStreams)?;
        let mut out = Vec::with_capacity(total);
        let mut seen = HashSet::new();
        while out.len() < total {
            let left = deadline.saturating_duration_since(Instant::now());
            let from = rx.recv_timeout(left).map_err(|_| {
                Iperf3Error::Wire(WireError::Refused {
                    i_errno: errno::STREAMACCEPT,
                    what: format!(
                        "only {} of {total} UDP streams said hello in time",
                        out.len()
                    ),
                })
            })?;
            if !seen.insert(from) {
                continue;
            }
            let s = udp_socket(inner.local).map_err(|e| Iperf3Error::io("bind a UDP stream", e))?;
            if let Some(w) = p.window {
                let _ = fatpipe_sys::set_send_buffer(&s, w, false);
                let _ = fatpipe_sys::set_recv_buffer(&s, w, false);
            }
            s.connect(from)
                .map_err(|e| Iperf3Error::io("connect a UDP stream", e))?;
            s.send(&wire::UDP_REPLY)
                .map_err(|e| Iperf3Error::io("answer a UDP stream", e))?;
            out.push(Sock::Udp(s));
        }
        Ok(out)
    })();
    lock(&inner.udp_waiters).remove(&ip);
    {
        let (m, cv) = &inner.udp_busy;
        lock(m).remove(&ip);
        cv.notify_all();
    }
    Ok(r?)
}

/// Sets what the client asked for on each TCP stream; returns the
/// congestion control in use.
fn configure(streams: &[Stream], p: &Params) -> std::result::Result<Option<String>, Refusal> {
    let mut used = None;
    for s in streams {
        let Sock::Tcp(t) = &s.sock else {
            continue;
        };
        let _ = t.set_nodelay(p.nodelay);
        if let Some(w) = p.window {
            fatpipe_sys::set_send_buffer(t, w, false)
                .and_then(|_| fatpipe_sys::set_recv_buffer(t, w, false))
                .map_err(|e| Refusal::new(errno::SETBUF, format!("window {w}: {e}")))?;
        }
        if let Some(m) = p.mss {
            // The MSS was agreed in the handshake; this caps what we send.
            let _ = fatpipe_sys::tcp::set_mss(t, m);
        }
        if let Some(c) = &p.congestion {
            fatpipe_sys::tcp::set_congestion(t, c)
                .map_err(|e| Refusal::new(errno::SETCONGESTION, format!("congestion {c}: {e}")))?;
        }
        if let Some(r) = p.fqrate {
            let _ = fatpipe_sys::tcp::set_max_pacing_rate(t, r / 8);
        }
        if used.is_none() {
            used = fatpipe_sys::tcp::get_congestion(t).ok();
        }
    }
    Ok(used)
}

/// The running test: intervals until `TEST_END`, then the results.
fn run(
    ctrl: &mut Control,
    p: &Params,
    shared: &Shared,
    streams: &[Stream],
    sampler: &mut Sampler,
    congestion: Option<String>,
    cpu_start: Option<fatpipe_sys::CpuSample>,
) -> std::result::Result<String, Refusal> {
    let limit = if p.time > 0 { p.time } else { wire::MAX_TIME };
    let watchdog = sampler.start + Duration::from_secs(limit + p.omit) + GRACE;
    let mut next = sampler.start + Duration::from_secs(1);
    loop {
        let now = Instant::now();
        if now >= watchdog {
            return Err(Refusal::new(errno::CTRLCLOSE, "the test ran past its time"));
        }
        if now >= next {
            sampler.sample(streams, now);
            next += Duration::from_secs(1);
            continue;
        }
        match ctrl.read(Expect::State, next.min(watchdog) - now, "running the test")? {
            None => {}
            Some(Msg::State(State::TestEnd)) => break,
            Some(Msg::State(State::ClientTerminate)) => {
                return Ok("the client ended the test early".into())
            }
            Some(m) => return Err(unexpected(m, "running the test").into()),
        }
    }
    let seconds = sampler.measured_from.elapsed().as_secs_f64();
    shared.stop_send.store(true, Ordering::Relaxed);
    // As iperf3's server does at TEST_END: its clients read whole blocks
    // and wait for the rest of a torn one unless the stream ends.
    for s in streams.iter().filter(|s| s.direction == Direction::Down) {
        if let Sock::Tcp(t) = &s.sock {
            let _ = t.shutdown(std::net::Shutdown::Write);
        }
    }
    // The client's last bytes are still on their way: count them.
    let got = || -> u64 {
        streams
            .iter()
            .filter(|s| s.direction == Direction::Up)
            .map(|s| s.counters.snapshot().bytes)
            .sum()
    };
    let (t0, mut last, mut quiet) = (Instant::now(), got(), Instant::now());
    while t0.elapsed() < DRAIN {
        std::thread::sleep(Duration::from_millis(10));
        let now = got();
        if now != last {
            (last, quiet) = (now, Instant::now());
        } else if quiet.elapsed() >= QUIET / 2 {
            break;
        }
    }
    shared.stop_recv.store(true, Ordering::Relaxed);
    let last_iv = Instant::now();
    if last_iv.duration_since(sampler.start) > Duration::from_millis(50) {
        sampler.sample(streams, last_iv);
    }
    let totals = Totals::take(streams, sampler, cpu_start, seconds);
    let protocol = if matches!(streams.first().map(|s| &s.sock), Some(Sock::Udp(_))) {
        Protocol::Udp
    } else {
        Protocol::Tcp
    };
    let mut ours = our_results(protocol, Direction::Down, congestion, streams, &totals);
    let summary = summary(protocol, p, &ours, seconds);
    if p.get_server_output {
        ours.server_output_text = Some(output_text(sampler, &summary));
    }
    ctrl.send_state(State::ExchangeResults)?;
    let doc = ctrl.json(MAX_RESULTS_JSON, "reading the client's results")?;
    Results::parse(&doc).map_err(|e| Refusal::new(errno::RECVRESULTS, e.to_string()))?;
    ctrl.write(&wire::encode_json(&ours.to_json()), "send the results")?;
    ctrl.send_state(State::DisplayResults)?;
    // The client's IPERF_DONE (or its close) ends the session.
    let _ = ctrl.read(
        Expect::State,
        STEP_TIMEOUT,
        "waiting for the client to finish",
    );
    Ok(summary)
}

/// One line: what moved.
fn summary(protocol: Protocol, p: &Params, ours: &Results, seconds: f64) -> String {
    let dir = match (p.bidirectional, p.reverse) {
        (true, _) => "both ways",
        (false, true) => "server to client",
        (false, false) => "client to server",
    };
    let bytes: u64 = ours.streams.iter().map(|s| s.bytes).sum();
    format!(
        "client {} {} x {}, {dir}: {} in {seconds:.2} s = {} (this end's count)",
        p.client_version.as_deref().unwrap_or("?"),
        p.parallel,
        protocol.as_str().to_uppercase(),
        units::format_bytes(bytes),
        units::format_rate(bytes as f64 * 8.0 / seconds.max(1e-9)),
    )
}

/// The report `--get-server-output` shows: this end's intervals.
fn output_text(sampler: &Sampler, summary: &str) -> String {
    let mut t = String::from(
        "fatpipe server (iperf3 protocol)\n[ ID] Interval           Transfer     Bitrate\n",
    );
    for iv in &sampler.intervals {
        for s in iv
            .streams
            .iter()
            .chain(iv.sums.iter().filter(|_| iv.streams.len() > 1))
        {
            let id = s.id.map_or("SUM".to_string(), |i| i.to_string());
            let dir = match s.direction {
                Some(Direction::Down) => " sent",
                _ => "",
            };
            t += &format!(
                "[{id:>3}] {:6.2}-{:<6.2} sec  {:<11}  {}{dir}{}\n",
                iv.start_s,
                iv.end_s,
                units::format_bytes(s.bytes),
                units::format_rate(s.bits_per_second),
                if iv.omitted { "  (omitted)" } else { "" },
            );
        }
    }
    t += summary;
    t.push('\n');
    t
}
