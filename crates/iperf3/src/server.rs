//! Serving stock iperf3 clients (`fatpipe server --iperf3-port PORT`),
//! many at once, each in its own session: an engine front end
//! ([`fatpipe_engine::FrontEnd`]), so the server's accept framework bounds
//! it as it bounds the fatpipe protocol's port.
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
//! Bounds, from the engine: connections reading their cookie are capped on
//! this port in all and per source and read it by the pre-auth deadline
//! (timeouts and garbage go to the log summaries, never a line each); a
//! session takes one of the server's `--max-sessions` (and per source),
//! refused with iperf3's `ACCESS_DENIED` past it or while the server shuts
//! down; a test's streams, TCP or UDP, take slots of the server's
//! `--max-streams` before they are created, all or none (refused with
//! `ACCESS_DENIED`, which the client prints as "busy"). Its own: every
//! step before the test runs under the handshake timeout, at most 128
//! streams per direction, and a watchdog of the test's length plus 40 s
//! as in iperf3. Sessions, streams and bytes reach the server's observer
//! (`/metrics`) as service `iperf3`. On shutdown a running test ends at
//! once with `SERVER_TERMINATE` (the client says "the server has
//! terminated"), as the fatpipe test service ends its tests. Text a client
//! chose (its version, a congestion control name) is logged escaped. An
//! option this server does not carry out gets iperf3's own `SERVER_ERROR`
//! (with its error number) rather than a hang.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fatpipe_engine::logsum::Event;
use fatpipe_engine::{escape, Conn, Flow, FrontEnd, Outcome, Session, TestSummary};
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

/// Connections reading their cookie at once on this port, in all (the
/// engine closes more unread).
pub const MAX_HANDSHAKES: usize = 256;
/// Connections reading their cookie at once from one address: one client's
/// 128 streams each way can arrive together.
pub const MAX_HANDSHAKES_PER_SOURCE: usize = 128;
/// The service name iperf3 sessions report under (`/metrics`).
pub const SERVICE: &str = "iperf3";
/// Extra time past a test's length before the watchdog ends it (iperf3's
/// grace of four round trips of 1 s times ten transitions).
const GRACE: Duration = Duration::from_secs(40);
/// How often a running test looks at the server's shutdown flag.
const SHUTDOWN_POLL: Duration = Duration::from_millis(100);
/// How long a test ended by shutdown waits for its client to read
/// `SERVER_TERMINATE` and close.
const TERMINATE_WAIT: Duration = Duration::from_secs(2);

/// How the server runs.
#[derive(Clone)]
pub struct Options {
    /// Limit for each step after the cookie: the parameters and stream
    /// setup (the cookie itself is read by the engine's pre-auth deadline).
    pub handshake_timeout: Duration,
    /// Time an admitted session has to connect all of its streams (the
    /// server's `--start-timeout`): iperf3's client connects them one by
    /// one, and 128 of them from a loaded host take longer than one step.
    pub start_timeout: Duration,
    /// iperf3's RSA authentication: when set, every client must present
    /// a token this admits.
    pub auth: Option<Arc<crate::auth::Authorizer>>,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("handshake_timeout", &self.handshake_timeout)
            .field("start_timeout", &self.start_timeout)
            .field("auth", &self.auth.is_some())
            .finish_non_exhaustive()
    }
}

/// The iperf3 port as an engine front end: register it with
/// `ServerBuilder::front_end` and the TCP listener [`Iperf3Port::bind`]
/// returned.
#[derive(Debug)]
pub struct Iperf3Port {
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
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

impl Iperf3Port {
    /// Binds TCP and UDP on `addr` (port 0 picks one free for both) and
    /// starts the thread that routes UDP hellos; returns the TCP listener
    /// for the engine to accept on, and the front end.
    pub fn bind(addr: SocketAddr, opts: Options) -> Result<(TcpListener, Iperf3Port)> {
        let listener =
            TcpListener::bind(addr).map_err(|e| Iperf3Error::io(format!("bind TCP {addr}"), e))?;
        let local = listener
            .local_addr()
            .map_err(|e| Iperf3Error::io("read the bound address", e))?;
        let hellos =
            udp_socket(local).map_err(|e| Iperf3Error::io(format!("bind UDP {local}"), e))?;
        let inner = Arc::new(Inner {
            opts,
            local,
            pending: Mutex::default(),
            active: Mutex::default(),
            udp_waiters: Mutex::default(),
            udp_busy: (Mutex::default(), Condvar::new()),
        });
        {
            let inner = Arc::clone(&inner);
            std::thread::Builder::new()
                .name("iperf3 udp hellos".into())
                .spawn(move || route_hellos(&hellos, &inner))
                .map_err(|e| Iperf3Error::io("start the iperf3 UDP thread", e))?;
        }
        Ok((listener, Iperf3Port { inner }))
    }

    /// The address both sockets are bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local
    }
}

impl FrontEnd for Iperf3Port {
    fn name(&self) -> &'static str {
        SERVICE
    }

    fn serve(&self, tcp: TcpStream, conn: Conn) {
        connection(tcp, conn, &self.inner);
    }

    fn serve_inline(&self, tcp: TcpStream, conn: Conn) -> Option<(TcpStream, Conn)> {
        attach_inline(tcp, conn, &self.inner)
    }
}

/// A data stream whose cookie has already arrived and names a session
/// waiting for its streams: read it and hand the socket over, on the
/// accept thread. Anything else (a control connection, a cookie still on
/// its way) goes back to be served on a thread, unread.
fn attach_inline(mut tcp: TcpStream, mut conn: Conn, inner: &Inner) -> Option<(TcpStream, Conn)> {
    let mut cookie = [0u8; wire::COOKIE_LEN];
    if !matches!(fatpipe_sys::tcp::peek_now(&tcp, &mut cookie), Ok(n) if n == cookie.len()) {
        return Some((tcp, conn));
    }
    let pending = lock(&inner.pending);
    let Some(tx) = pending.get(&cookie) else {
        drop(pending);
        return Some((tcp, conn));
    };
    // Peeked whole, so this read takes exactly the cookie without waiting.
    if tcp.read_exact(&mut cookie).is_err() {
        return None;
    }
    let _ = tcp.set_write_timeout(Some(inner.opts.handshake_timeout));
    conn.admitted();
    let _ = tx.try_send((conn.seq(), tcp));
    None
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

/// Reads the cookie by the pre-auth deadline, however slowly it comes;
/// `None` (counted for the log summary) if it does not come whole.
fn read_cookie(sock: &mut TcpStream, conn: &Conn) -> Option<Cookie> {
    let mut cookie = [0u8; wire::COOKIE_LEN];
    let mut got = 0;
    while got < cookie.len() {
        let left = conn.deadline().saturating_duration_since(Instant::now());
        if left.is_zero() || sock.set_read_timeout(Some(left)).is_err() {
            conn.summarise(Event::PreauthTimeout);
            return None;
        }
        match sock.read(&mut cookie[got..]) {
            // A probe or a client that changed its mind: nothing to say.
            Ok(0) if got == 0 => return None,
            Ok(0) => {
                conn.summarise(Event::HandshakeFailed);
                return None;
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if crate::session::is_timeout(&e) => {}
            Err(_) => {
                conn.summarise(Event::HandshakeFailed);
                return None;
            }
        }
    }
    Some(cookie)
}

/// Reads a connection's cookie and makes it a data stream or a session.
fn connection(mut sock: TcpStream, mut conn: Conn, inner: &Inner) {
    let peer = conn.peer();
    let _ = sock.set_write_timeout(Some(inner.opts.handshake_timeout));
    let Some(cookie) = read_cookie(&mut sock, &conn) else {
        return;
    };
    if let Some(tx) = lock(&inner.pending).get(&cookie) {
        // The session holds this stream's slot (taken for all of its
        // streams before it asked for them).
        conn.admitted();
        let _ = tx.try_send((conn.seq(), sock));
        return;
    }
    if lock(&inner.active).contains(&cookie) {
        let _ = sock.write_all(&[State::AccessDenied.byte()]);
        return;
    }
    let session = match conn.admit_session(SERVICE) {
        Ok(s) => s,
        Err(_) => {
            // The engine counted it (summary, observer); iperf3 has one
            // word for every refusal, which its client prints as "busy".
            let _ = sock.write_all(&[State::AccessDenied.byte()]);
            return;
        }
    };
    lock(&inner.active).insert(cookie);
    if let Ok(s) = sock.try_clone() {
        // Past the drain time: the client is told the server is going
        // away, and the session's reads end.
        session.on_abort(move |_| {
            let _ = (&s).write_all(&[State::ServerTerminate.byte()]);
            let _ = s.shutdown(std::net::Shutdown::Both);
        });
    }
    let mut ctrl = Control::new(sock);
    let mut client = None;
    let r = run_session(&mut ctrl, inner, cookie, &session, &mut client);
    lock(&inner.active).remove(&cookie);
    lock(&inner.pending).remove(&cookie);
    let who = match &client {
        Some(v) => format!("{peer} (client {})", escape(v)),
        None => peer.to_string(),
    };
    let line = match r {
        Ok(summary) => {
            session.finish(Outcome::Ok);
            format!("iperf3: {who} {summary}")
        }
        Err(Refusal {
            i_errno: TERMINATED,
            why,
        }) => {
            session.finish(Outcome::Aborted);
            format!("iperf3: {who} ended: {why}")
        }
        Err(Refusal { i_errno, why }) => {
            // The client prints iperf3's own words for the number.
            let _ = ctrl.write(&wire::encode_server_error(i_errno, 0), "send the error");
            format!("iperf3: {who} refused: {why}")
        }
    };
    session.log(&line);
}

fn show(peer: Option<SocketAddr>) -> String {
    peer.map_or_else(|| "?".into(), |p| p.to_string())
}

/// Why a session ended early: iperf3's error number for the client
/// ([`TERMINATED`]: none, the client was sent `SERVER_TERMINATE`).
struct Refusal {
    i_errno: i32,
    why: String,
}

/// Not an iperf3 error number: the session ended because the server is
/// shutting down, and the client was told so with `SERVER_TERMINATE`.
const TERMINATED: i32 = 0;

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
/// log line's summary. `client` gets the client's version as soon as the
/// parameters say it, for the log line.
fn run_session(
    ctrl: &mut Control,
    inner: &Inner,
    cookie: Cookie,
    session: &Session,
    client: &mut Option<String>,
) -> std::result::Result<String, Refusal> {
    let peer = ctrl.sock.peer_addr().ok();
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
    client.clone_from(&p.client_version);
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
        session.log(&format!("iperf3: {} authenticated as {user:?}", show(peer)));
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
    // Every stream's slot of the server's `--max-streams`, before the
    // client is asked for any: a test runs whole or not at all.
    let _slots = session
        .take_streams(total)
        .map_err(|why| Refusal::new(errno::ACCESSDENIED, why))?;
    let _open = session.report().streams(total as u64);
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
        session,
        &shared,
        &streams,
        &mut sampler,
        congestion,
        cpu_start,
    );
    shared.stop_sending();
    shared.stop_receiving();
    for w in workers {
        w.join();
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
        collect(&rx, total, inner.opts.start_timeout)
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
    let deadline = Instant::now() + inner.opts.start_timeout;
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
            // The name is the client's: escaped wherever this text goes.
            fatpipe_sys::tcp::set_congestion(t, c).map_err(|e| {
                Refusal::new(
                    errno::SETCONGESTION,
                    format!("congestion {}: {e}", escape(c)),
                )
            })?;
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
#[allow(clippy::too_many_arguments)]
fn run(
    ctrl: &mut Control,
    p: &Params,
    session: &Session,
    shared: &Shared,
    streams: &[Stream],
    sampler: &mut Sampler,
    congestion: Option<String>,
    cpu_start: Option<fatpipe_sys::CpuSample>,
) -> std::result::Result<String, Refusal> {
    let limit = if p.time > 0 { p.time } else { wire::MAX_TIME };
    let watchdog = sampler.start + Duration::from_secs(limit + p.omit) + GRACE;
    let mut next = sampler.start + Duration::from_secs(1);
    let mut reported = Moved::default();
    loop {
        let now = Instant::now();
        if session.shutdown().is_set() {
            reported.report(session, streams);
            let _ = ctrl.send_state(State::ServerTerminate);
            // The client reads the state, then closes: until it has, its
            // streams stay open here (a stream reset first would be all it
            // reported).
            let until = Instant::now() + TERMINATE_WAIT;
            while Instant::now() < until
                && ctrl
                    .read(
                        Expect::State,
                        until.saturating_duration_since(Instant::now()),
                        "waiting for the client to go",
                    )
                    .is_ok()
            {}
            return Err(Refusal::new(TERMINATED, "the server is shutting down"));
        }
        if now >= watchdog {
            return Err(Refusal::new(errno::CTRLCLOSE, "the test ran past its time"));
        }
        if now >= next {
            sampler.sample(streams, now);
            reported.report(session, streams);
            next += Duration::from_secs(1);
            continue;
        }
        let wait = next.min(watchdog).min(now + SHUTDOWN_POLL) - now;
        match ctrl.read(Expect::State, wait, "running the test")? {
            None => {}
            Some(Msg::State(State::TestEnd)) => break,
            Some(Msg::State(State::ClientTerminate)) => {
                return Ok("the client ended the test early".into())
            }
            Some(m) => return Err(unexpected(m, "running the test").into()),
        }
    }
    let seconds = sampler.measured_from.elapsed().as_secs_f64();
    shared.stop_sending();
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
    shared.stop_receiving();
    let last_iv = Instant::now();
    if last_iv.duration_since(sampler.start) > Duration::from_millis(50) {
        sampler.sample(streams, last_iv);
    }
    reported.report(session, streams);
    let totals = Totals::take(streams, sampler, cpu_start, seconds);
    let protocol = if matches!(streams.first().map(|s| &s.sock), Some(Sock::Udp(_))) {
        Protocol::Udp
    } else {
        Protocol::Tcp
    };
    let mut ours = our_results(protocol, Direction::Down, congestion, streams, &totals);
    report_result(session, streams, &ours, seconds);
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

/// Bytes of a test reported to the observer so far, by direction.
#[derive(Debug, Default)]
struct Moved {
    received: u64,
    sent: u64,
}

impl Moved {
    /// Reports what the streams moved since the last call (`/metrics`
    /// shows a running test's bytes, not only a finished one's).
    fn report(&mut self, session: &Session, streams: &[Stream]) {
        let count = |d: Direction| -> u64 {
            streams
                .iter()
                .filter(|s| s.direction == d)
                .map(|s| s.counters.snapshot().bytes)
                .sum()
        };
        let (up, down) = (count(Direction::Up), count(Direction::Down));
        let r = session.report();
        r.bytes(Flow::Received, up.saturating_sub(self.received));
        r.bytes(Flow::Sent, down.saturating_sub(self.sent));
        self.received = self.received.max(up);
        self.sent = self.sent.max(down);
    }
}

/// What this end saw of the finished test, per direction with streams,
/// for the observer's last-test gauges of the peer.
fn report_result(session: &Session, streams: &[Stream], ours: &Results, seconds: f64) {
    for (direction, flow) in [
        (Direction::Up, Flow::Received),
        (Direction::Down, Flow::Sent),
    ] {
        let ids: Vec<u32> = streams
            .iter()
            .filter(|s| s.direction == direction)
            .map(|s| s.id)
            .collect();
        if ids.is_empty() {
            continue;
        }
        let mine = || ours.streams.iter().filter(|r| ids.contains(&r.id));
        let bytes: u64 = mine().map(|r| r.bytes).sum();
        // Retransmits are known where this end sent.
        let retransmits = (flow == Flow::Sent).then(|| mine().filter_map(|r| r.retransmits).sum());
        session.report().test_result(&TestSummary {
            flow,
            bytes_per_second: bytes as f64 / seconds.max(1e-9),
            retransmits,
            rtt: None,
        });
    }
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
        "{} x {}, {dir}: {} in {seconds:.2} s = {} (this end's count)",
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
