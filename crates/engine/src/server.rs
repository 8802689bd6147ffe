//! The server: the fatpipe protocol's front end (handshakes, dispatch to
//! registered services, data connections routed by cookie) and the
//! [`Server`] that runs it beside the other front ends.
//!
//! Every port, this one included, is a [`FrontEnd`] behind the accept
//! framework of [`crate::front`], which owns the caps, the observer's
//! session counts, the log and the drain; this module is what is
//! particular to the fatpipe protocol. [`ServerBuilder::front_end`] adds
//! another port (iperf3, metrics, HTTP) to the same server.
//!
//! A connection's first frame says what it is: a control connection runs
//! the handshake (under the pre-auth deadline) and, once the client opens
//! a service, gets a thread that is that session's for as long as
//! [`Service::serve`] runs (blocking I/O); a data connection presents a
//! cookie and is handed, already acknowledged, to the session holding it.
//! Before that a connection has no thread of its own: a data hello that
//! is there at accept is attached on the accept thread, and everything
//! else (its first byte, the TLS handshake, the protocol's handshake) is
//! a state machine on one of a few pre-authentication lanes (`preauth`,
//! one mio poll per core, at most 4), so a client dialling a thousand
//! connections at once costs no thousand threads. Nothing one connection
//! does (garbage, giant frames, stalling, vanishing) can block another:
//! each has its own deadline and buffers, the lanes never wait on one
//! socket, and the shared state is a session counter and the cookie table.
//!
//! Shutting down ([`Shutdown::trigger`], which `fatpipe server` calls on
//! SIGTERM or SIGINT) is a drain of every port, not a cut: the accept
//! loops go on so that running sessions still get their data connections,
//! but every new session is refused with "the server is shutting down";
//! services see the flag (the test and probe services end their sessions
//! at once and tell the client why); sessions still running after the
//! drain time get a `Close` with that reason and their control connection
//! shut (a front end's, its `Session::on_abort`); then [`Server::run`]
//! returns.
//!
//! # What a peer can make it spend
//!
//! Every session costs a thread (with a [`CONN_STACK`] stack); every
//! connection, before authentication, at most one frame of buffer (4 bytes more than
//! [`fatpipe_proto::MAX_FRAME`]). Connections still handshaking are capped in total
//! (`max_handshakes`) and per source address (`max_handshakes_per_source`;
//! IPv6 sources count by /64, since one host holds a whole /64), so one
//! host cannot fill the server's handshake slots: past its cap a
//! connection is closed unread, which costs an `accept` and a `close`.
//! The pre-auth deadline covers the whole handshake from `accept`, so a
//! peer sending a byte a second cannot stretch it. Sessions are capped in
//! total and per source the same way, and a session the client opened but
//! never started (no data connection, no control message within
//! `start_timeout`) is ended by the watchdog thread. Data connections
//! attached at once are capped over all sessions (`max_streams`): each
//! carries its slot inside its [`Stream`], so whichever thread the service
//! hands it to, the slot is freed when the last clone closes. The session
//! and stream caps are the server's, shared with every other front end.
//! Timeouts, failed handshakes and refusals at a cap are logged as
//! rate-limited summaries ([`crate::logsum`]), never a line each.
//! docs/security.md lists every bound with its value and flag.
//!
//! Whoever watches the server (the Prometheus metrics) hears of sessions,
//! refusals and failed authentication through an [`Observer`]; services
//! add their bytes, streams and results through their session's
//! [`ServerSession::report`].

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fatpipe_proto::{Cookie, ErrorCode, Key, ServerConfig, ServerConn, ServerEvent};
use fatpipe_secure::tls::ServerTls;
use fatpipe_secure::{Encryption, Stream};

mod preauth;

use crate::control::{is_timeout, lock, Control};
use crate::error::{EngineError, Result};
use crate::front::{
    accept_loop, watchdog, Conn, FrontEnd, Gate, GateCaps, Listening, Port, PortCaps, SHUTTING_DOWN,
};
use crate::keyed::{Keyed, Running};
use crate::logsum::Event;
use crate::observe::{NoObserver, Observer, Outcome, Refusal, Report};

/// What a service returns; any error type will do, it is logged.
pub type ServiceResult = std::result::Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Something the server offers to authenticated clients, e.g. `test` or
/// `copy`. Register it with [`ServerBuilder::service`].
pub trait Service: Send + Sync + 'static {
    /// The name clients open it by (ASCII letters, digits, `-`, `_`).
    fn name(&self) -> &'static str;

    /// Looks at the client's parameters before the session is accepted; an
    /// `Err` refuses it and the client sees the text. The default accepts.
    fn check(&self, params: &[u8]) -> std::result::Result<(), String> {
        let _ = params;
        Ok(())
    }

    /// True if a client without the key may open this service on a keyed
    /// server (its session then says [`ServerSession::authenticated`] is
    /// false, and the service must serve it only what is public). The
    /// default: no.
    fn open_without_key(&self) -> bool {
        false
    }

    /// Runs one session on the calling (per-connection) thread. When it
    /// returns, the server closes the control connection, with the error's
    /// text as the reason if it failed.
    fn serve(&self, session: ServerSession) -> ServiceResult;
}

/// A data connection that presented this session's cookie; the data hello
/// is acknowledged and everything after it is the service's.
#[derive(Debug)]
pub struct DataConn {
    /// The connection (encrypted if the session is).
    pub stream: Stream,
    /// The label the client gave it (e.g. a stream index).
    pub tag: u32,
    /// Where it came from.
    pub peer: SocketAddr,
}

/// One authenticated session, as a service sees it.
#[derive(Debug)]
pub struct ServerSession {
    control: Control,
    params: Vec<u8>,
    peer: SocketAddr,
    local: SocketAddr,
    /// Behind a lock so that several threads of a service may wait for
    /// data connections (a copy takes its late ones on a thread of their
    /// own while it grows on another).
    data: Mutex<Receiver<DataConn>>,
    shutdown: Shutdown,
    cookie: Cookie,
    report: Report,
    /// Set on the first data connection or control message.
    started: Arc<AtomicBool>,
    /// Set by the watchdog when the session did not start in time.
    expired: Arc<AtomicBool>,
    authenticated: bool,
    ticket: Option<Vec<u8>>,
}

impl ServerSession {
    /// What the one-time ticket that opened this session grants (the
    /// issuer's bytes; docs/protocol.md "Tickets"); `None` for a session
    /// opened with the key or without one.
    pub fn ticket(&self) -> Option<&[u8]> {
        self.ticket.as_deref()
    }

    /// True if `bytes` is this session's cookie (for services that accept
    /// cookie-bearing hellos elsewhere, e.g. over UDP). Constant time.
    pub fn cookie_matches(&self, bytes: &[u8]) -> bool {
        bytes.len() == self.cookie.len()
            && bytes
                .iter()
                .zip(&self.cookie)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }

    /// True if the client proved the key, or the server has none; false
    /// for a keyless client of a keyed server (only services that
    /// [`Service::open_without_key`] get such sessions).
    pub fn authenticated(&self) -> bool {
        self.authenticated
    }

    /// The parameters the client opened the service with.
    pub fn params(&self) -> &[u8] {
        &self.params
    }

    /// The control channel (send and receive framed payloads).
    pub fn control(&self) -> &Control {
        &self.control
    }

    /// What encrypts the session (`--encrypt`), if anything: its control
    /// connection and every data connection alike.
    pub fn encryption(&self) -> Option<&Encryption> {
        self.control.encryption()
    }

    /// The client's control-connection address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The server's address on the control connection (bind UDP sockets to
    /// its IP so the client reaches them the same way).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Waits up to `timeout` for the next data connection of this session
    /// (one waiter at a time: the others wait for it first).
    pub fn accept_data(&self, timeout: Duration) -> Result<DataConn> {
        self.poll_data(timeout)?
            .ok_or_else(|| EngineError::Timeout("waiting for a data connection".into()))
    }

    /// As [`accept_data`](Self::accept_data), but a wait that merely ran
    /// out is `Ok(None)`, told apart from a session that can get no more
    /// (for services that wait in slices, checking their own state).
    pub fn poll_data(&self, timeout: Duration) -> Result<Option<DataConn>> {
        let data = self.data.lock().unwrap_or_else(|p| p.into_inner());
        match data.recv_timeout(timeout) {
            Ok(d) => {
                self.started.store(true, Ordering::Relaxed);
                Ok(Some(d))
            }
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) if self.expired.load(Ordering::Relaxed) => {
                Err(EngineError::Timeout(NOT_STARTED.into()))
            }
            Err(RecvTimeoutError::Disconnected) => {
                Err(EngineError::Service("the server is shutting down".into()))
            }
        }
    }

    /// Set when the server is shutting down; long services should poll it.
    pub fn shutdown(&self) -> &Shutdown {
        &self.shutdown
    }

    /// Where this session reports bytes, streams and results (to the
    /// server's [`Observer`]).
    pub fn report(&self) -> &Report {
        &self.report
    }
}

/// A flag that stops the server (and tells services to finish).
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    flag: Arc<AtomicBool>,
    /// Every port's address, to wake its blocking accept.
    wake: Arc<Mutex<Vec<SocketAddr>>>,
}

impl Shutdown {
    /// True once shutdown was asked for.
    pub fn is_set(&self) -> bool {
        self.flag.load(Ordering::Relaxed)
    }

    /// Asks the server to stop accepting and its services to finish.
    pub fn trigger(&self) {
        self.flag.store(true, Ordering::Relaxed);
        self.wake_all();
    }

    /// Wakes every port's blocking accept with a connection of our own.
    pub(crate) fn wake_all(&self) {
        let addrs = lock(&self.wake).clone();
        for addr in addrs {
            let _ = TcpStream::connect_timeout(&wake_addr(addr), Duration::from_secs(1));
        }
    }
}

/// Called with one line per notable event (session start/end, refusals).
pub type Logger = Arc<dyn Fn(&str) + Send + Sync>;

/// Configures and binds a [`Server`].
pub struct ServerBuilder {
    services: Vec<Arc<dyn Service>>,
    key: Option<Key>,
    max_sessions: usize,
    max_streams: usize,
    preauth_timeout: Duration,
    max_handshakes: usize,
    limits: SourceLimits,
    start_timeout: Duration,
    logger: Logger,
    observer: Arc<dyn Observer>,
    drain_timeout: Duration,
    fronts: Vec<(TcpListener, Arc<dyn FrontEnd>, PortCaps)>,
    tickets: Option<Arc<dyn fatpipe_proto::Tickets>>,
}

/// Caps per source address (IPv4 address, or IPv6 /64).
#[derive(Debug, Clone, Copy)]
struct SourceLimits {
    handshakes: usize,
    sessions: usize,
}

/// Defaults: 5 s to authenticate, 1000 concurrent sessions.
pub const DEFAULT_PREAUTH_TIMEOUT: Duration = Duration::from_secs(5);
/// Default cap on concurrent sessions.
pub const DEFAULT_MAX_SESSIONS: usize = 1000;
/// Default cap on connections still handshaking, in total.
pub const DEFAULT_MAX_HANDSHAKES: usize = 1024;
/// Default cap on connections still handshaking from one source address:
/// a quarter of the total, so one host never holds more than that, and
/// still far above what a 1000-stream test's burst of data hellos keeps in
/// flight at once.
pub const DEFAULT_MAX_HANDSHAKES_PER_SOURCE: usize = 256;
/// Default cap on sessions from one source address: a quarter of the
/// total, like the handshakes; a site behind one NAT address running
/// fifty tests at once (each with its probe session) stays well inside.
pub const DEFAULT_MAX_SESSIONS_PER_SOURCE: usize = 256;
/// Default cap on data connections attached at once, over all sessions.
/// Each is served by a thread or two (a `test` stream's has a 256 KiB
/// stack, a copy stream's 1 MiB reserved, a few pages touched) plus its
/// socket buffers, so 4,096 keep the server's address space to a few GiB
/// and its memory far below that, while four full 1,024-stream tests, or
/// sixteen 256-stream copies, still run at once. Without it the per-session
/// caps multiply: 256 sessions × 256 streams from one keyless address.
pub const DEFAULT_MAX_STREAMS: usize = 4096;
/// Default time an opened session has to start (a data connection or a
/// control message): no less than the services' own set-up waits, so it
/// ends no session that would otherwise have started.
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(30);
/// Stack of each connection thread (the session's service runs on it).
/// Half Rust's default: services keep large buffers on the heap, and a
/// thousand idle threads reserve 1 GiB of address space, not of memory.
pub const CONN_STACK: usize = 1 << 20;
/// The port a server listens on, and clients dial, unless told otherwise:
/// one port for every service (sessions name theirs when they open).
pub const DEFAULT_PORT: u16 = 5301;
/// How long a shutting-down server lets running sessions end by themselves.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for ServerBuilder {
    fn default() -> Self {
        ServerBuilder {
            services: Vec::new(),
            key: None,
            max_sessions: DEFAULT_MAX_SESSIONS,
            max_streams: DEFAULT_MAX_STREAMS,
            preauth_timeout: DEFAULT_PREAUTH_TIMEOUT,
            max_handshakes: DEFAULT_MAX_HANDSHAKES,
            limits: SourceLimits {
                handshakes: DEFAULT_MAX_HANDSHAKES_PER_SOURCE,
                sessions: DEFAULT_MAX_SESSIONS_PER_SOURCE,
            },
            start_timeout: DEFAULT_START_TIMEOUT,
            logger: Arc::new(|_| {}),
            observer: Arc::new(NoObserver),
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            fronts: Vec::new(),
            tickets: None,
        }
    }
}

impl ServerBuilder {
    /// Registers a service; a later one with the same name replaces it.
    pub fn service(mut self, service: impl Service) -> Self {
        self.services.push(Arc::new(service));
        self
    }

    /// Requires clients to prove this key.
    pub fn key(mut self, key: Option<Key>) -> Self {
        self.key = key;
        self
    }

    /// Accepts one-time tickets from this book instead of the key
    /// (`TicketAuth`, docs/protocol.md "Tickets"): each opens one session
    /// of the service it names, which sees what it grants in
    /// [`ServerSession::ticket`].
    pub fn tickets(mut self, book: Arc<dyn fatpipe_proto::Tickets>) -> Self {
        self.tickets = Some(book);
        self
    }

    /// Refuses sessions beyond `n` at once ("busy").
    pub fn max_sessions(mut self, n: usize) -> Self {
        self.max_sessions = n.max(1);
        self
    }

    /// Refuses data connections beyond `n` attached at once, over all
    /// sessions; the session that asked goes on with the ones it has.
    pub fn max_streams(mut self, n: usize) -> Self {
        self.max_streams = n.max(1);
        self
    }

    /// Deadline for a connection to authenticate and open a service, or to
    /// present its data hello.
    pub fn preauth_timeout(mut self, t: Duration) -> Self {
        self.preauth_timeout = t;
        self
    }

    /// Caps connections still handshaking: `total` at once, `per_source`
    /// from one address (IPv6: one /64). Past either a connection is
    /// closed unread.
    pub fn max_handshakes(mut self, total: usize, per_source: usize) -> Self {
        self.max_handshakes = total.max(1);
        self.limits.handshakes = per_source.max(1);
        self
    }

    /// Refuses sessions beyond `n` at once from one source address
    /// (IPv6: one /64).
    pub fn max_sessions_per_source(mut self, n: usize) -> Self {
        self.limits.sessions = n.max(1);
        self
    }

    /// Ends a session that neither presented a data connection nor sent a
    /// control message within `t` of being accepted.
    pub fn start_timeout(mut self, t: Duration) -> Self {
        self.start_timeout = t;
        self
    }

    /// Where session events are reported (default: nowhere).
    pub fn logger(mut self, logger: Logger) -> Self {
        self.logger = logger;
        self
    }

    /// Where sessions, refusals and failed authentications are reported
    /// (default: nowhere).
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = observer;
        self
    }

    /// How long a shutting-down server waits for running sessions before
    /// it aborts them.
    pub fn drain_timeout(mut self, t: Duration) -> Self {
        self.drain_timeout = t;
        self
    }

    /// Serves another front end on `listener` (bound by the caller, who
    /// knows what else the port needs, e.g. iperf3's UDP socket): its
    /// connections meet `caps` before admission and the server's session
    /// and stream caps, observer, log and drain after.
    pub fn front_end(
        mut self,
        listener: TcpListener,
        front: Arc<dyn FrontEnd>,
        caps: PortCaps,
    ) -> Self {
        self.fronts.push((listener, front, caps));
        self
    }

    /// Binds the fatpipe protocol's listening socket; the other front
    /// ends' are bound already.
    pub fn bind(self, addr: SocketAddr) -> Result<Server> {
        let listener =
            TcpListener::bind(addr).map_err(|e| EngineError::io(format!("bind {addr}"), e))?;
        let local = listener
            .local_addr()
            .map_err(|e| EngineError::io("read bound address", e))?;
        let shutdown = Shutdown::default();
        lock(&shutdown.wake).push(local);
        let services = self
            .services
            .into_iter()
            .map(|s| (s.name(), s))
            .collect::<HashMap<_, _>>();
        let tls = match &self.key {
            Some(k) => Some(ServerTls::new(k.as_bytes())?),
            None => None,
        };
        let mut keyless_services: Vec<String> = services
            .values()
            .filter(|s| s.open_without_key())
            .map(|s| s.name().to_string())
            .collect();
        keyless_services.sort();
        let gate = Arc::new(Gate::new(
            GateCaps {
                max_sessions: self.max_sessions,
                sessions_per_source: self.limits.sessions,
                max_streams: self.max_streams,
                preauth_timeout: self.preauth_timeout,
                drain_timeout: self.drain_timeout,
            },
            shutdown,
            self.logger,
            self.observer,
        ));
        let lanes = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(preauth::LANES);
        let protocol = Arc::new_cyclic(|me| Protocol {
            me: me.clone(),
            preauth: (0..lanes).map(|_| Mutex::new(None)).collect(),
            next_lane: std::sync::atomic::AtomicUsize::new(0),
            gate: Arc::clone(&gate),
            tls,
            services,
            config: ServerConfig {
                key: self.key,
                preauth_timeout: self.preauth_timeout,
                keyless_services,
                tickets: self.tickets,
            },
            start_timeout: self.start_timeout,
            cookies: Mutex::new(HashMap::new()),
            live: Mutex::new(HashMap::new()),
            running: Running::default(),
        });
        let mut ports = vec![Listening {
            listener,
            port: Arc::new(Port::new(
                PROTOCOL,
                "",
                PortCaps::new(self.max_handshakes, self.limits.handshakes),
            )),
            front: protocol.clone(),
        }];
        for (listener, front, caps) in self.fronts {
            let bound = listener
                .local_addr()
                .map_err(|e| EngineError::io("read a front end's bound address", e))?;
            lock(&gate.shutdown.wake).push(bound);
            let name = front.name();
            ports.push(Listening {
                listener,
                port: Arc::new(Port::new(name, name, caps)),
                front,
            });
        }
        Ok(Server {
            local,
            gate,
            protocol,
            ports,
        })
    }
}

/// The fatpipe protocol's name as a front end (its threads are `fatpipe
/// ADDR`; its summary lines name no port).
const PROTOCOL: &str = "fatpipe";

/// A bound server; [`run`](Server::run) serves until shutdown.
pub struct Server {
    local: SocketAddr,
    gate: Arc<Gate>,
    protocol: Arc<Protocol>,
    /// The fatpipe protocol's port first, then the other front ends'.
    ports: Vec<Listening>,
}

/// The fatpipe protocol as a front end: the handshake, services by name,
/// cookies routing data connections to their sessions, and the deadline
/// for a session to start.
struct Protocol {
    /// Itself, for the pre-authentication lanes' threads.
    me: std::sync::Weak<Protocol>,
    /// Connections not yet a session or a data connection, a few
    /// threads' polls ([`preauth`]); each started on first use.
    preauth: Vec<Mutex<Option<preauth::Lane>>>,
    next_lane: std::sync::atomic::AtomicUsize,
    gate: Arc<Gate>,
    /// The TLS identity of the key, for clients that `--encrypt`.
    tls: Option<ServerTls>,
    services: HashMap<&'static str, Arc<dyn Service>>,
    config: ServerConfig,
    start_timeout: Duration,
    /// Each session's data queue, and whether the session is encrypted
    /// (its data connections must be too).
    cookies: Mutex<HashMap<Cookie, Route>>,
    /// Every running session, to end it if it does not start in time
    /// (at most `max_sessions`).
    live: Mutex<HashMap<Cookie, Live>>,
    /// The TLS identities of one-time tickets whose sessions run (their
    /// data connections are keyed by them; [`crate::keyed`]).
    running: Running,
}

impl FrontEnd for Protocol {
    fn name(&self) -> &'static str {
        PROTOCOL
    }

    fn serve(&self, tcp: TcpStream, conn: Conn) {
        handle_conn(self, conn, tcp);
    }

    fn serve_inline(&self, tcp: TcpStream, conn: Conn) -> Option<(TcpStream, Conn)> {
        // A data hello already here is attached at once; anything else
        // waits on a pre-authentication lane (a thread of its own only if
        // none can take it).
        let (tcp, conn) = attach_inline(self, tcp, conn)?;
        preauth::hand_over(self, tcp, conn)
    }

    fn tick(&self, now: Instant) {
        end_overdue(self, now);
    }
}

/// Where a session's data connections go: its queue, whether the session
/// is encrypted, and the lock that keeps acknowledgements and queueing in
/// one order (see `attach_data`).
#[derive(Clone)]
struct Route {
    queue: SyncSender<DataConn>,
    encrypted: bool,
    /// The ticket whose TLS identity keyed the session's control
    /// connection: its data connections must be keyed by it too.
    keyed: Option<fatpipe_proto::TicketId>,
    order: Arc<Mutex<()>>,
}

/// Data connections a session may have waiting before more are refused.
const DATA_BACKLOG: usize = 4096;

/// A running session as the start watchdog sees it.
struct Live {
    control: Control,
    peer: SocketAddr,
    started: Arc<AtomicBool>,
    expired: Arc<AtomicBool>,
    start_by: Instant,
}

/// What a session that did not start in time is told.
const NOT_STARTED: &str = "the client did not start the session in time";

impl Server {
    /// Starts configuring a server.
    pub fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }

    /// The bound address of the fatpipe protocol (the real port when
    /// bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Every front end's name and bound address, the fatpipe protocol's
    /// first.
    pub fn front_ends(&self) -> Vec<(&'static str, SocketAddr)> {
        self.ports
            .iter()
            .filter_map(|l| Some((l.port.name, l.listener.local_addr().ok()?)))
            .collect()
    }

    /// A handle that stops [`run`](Server::run) from another thread.
    pub fn shutdown_handle(&self) -> Shutdown {
        self.gate.shutdown.clone()
    }

    /// The names of the registered services, sorted.
    pub fn services(&self) -> Vec<&'static str> {
        let mut names: Vec<_> = self.protocol.services.keys().copied().collect();
        names.sort_unstable();
        names
    }

    /// Sessions running right now, on every port.
    pub fn active_sessions(&self) -> usize {
        self.gate.running()
    }

    /// Accepts connections on every port until shutdown, one thread each
    /// (the fatpipe protocol's on the calling thread, each other port's
    /// accept loop on one of its own); after [`Shutdown::trigger`], drains
    /// every port (see the module docs) and returns.
    pub fn run(&self) -> Result<()> {
        let stop = Arc::new(AtomicBool::new(false));
        let _stop_watchdog = StopOnDrop(Arc::clone(&stop), Arc::clone(&self.gate));
        {
            let gate = Arc::clone(&self.gate);
            let stop = Arc::clone(&stop);
            let fronts: Vec<Arc<dyn FrontEnd>> =
                self.ports.iter().map(|l| Arc::clone(&l.front)).collect();
            std::thread::Builder::new()
                .name("watchdog".into())
                .spawn(move || watchdog(&gate, &fronts, &stop))
                .map_err(|e| EngineError::io("start the watchdog thread", e))?;
        }
        for l in &self.ports[1..] {
            let listening = Listening {
                listener: l
                    .listener
                    .try_clone()
                    .map_err(|e| EngineError::io("share a front end's listener", e))?,
                port: Arc::clone(&l.port),
                front: Arc::clone(&l.front),
            };
            let gate = Arc::clone(&self.gate);
            std::thread::Builder::new()
                .name(format!("{} accept", l.port.name))
                .spawn(move || accept_loop(&gate, &listening))
                .map_err(|e| EngineError::io("start a front end's accept loop", e))?;
        }
        accept_loop(&self.gate, &self.ports[0]);
        Ok(())
    }
}

/// A plain data connection whose whole `DataHello` has already arrived
/// (its client sends it right after connecting, and the server says
/// nothing first): attached on the accept thread, so a thousand streams
/// connecting together need no thread each and hold no handshake slot
/// while they wait for one. Anything else (a session's control connection,
/// TLS, a hello still on its way, garbage) goes back unread, to be served
/// on a thread from its first byte.
fn attach_inline(shared: &Protocol, tcp: TcpStream, ticket: Conn) -> Option<(TcpStream, Conn)> {
    let mut peeked = [0u8; INLINE_PEEK];
    let n = match fatpipe_sys::tcp::peek_now(&tcp, &mut peeked) {
        Ok(n) if n > 0 && !fatpipe_secure::is_tls_start(peeked[0]) => n,
        _ => return Some((tcp, ticket)),
    };
    let mut conn = ServerConn::new(&shared.config, ticket.accepted(), random_bytes());
    let mut used = 0;
    let hello = loop {
        // Never past the hello's frame: what follows is the service's.
        let room = conn.read_limit().min(n - used);
        if room == 0 {
            break None;
        }
        conn.handle_input(Instant::now(), &peeked[used..used + room]);
        used += room;
        match conn.poll_event() {
            Some(ServerEvent::DataHello { cookie, tag }) => break Some((cookie, tag)),
            Some(_) => break None,
            None => {}
        }
    };
    let Some((cookie, tag)) = hello else {
        return Some((tcp, ticket));
    };
    // Peeked whole, so this read takes exactly the hello without waiting.
    let mut tcp = tcp;
    if tcp.read_exact(&mut peeked[..used]).is_err() {
        return None;
    }
    let stream = Stream::plain_tcp(tcp);
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(shared.config.preauth_timeout));
    attach_data(shared, ticket, conn, stream, cookie, tag, None);
    None
}

/// Bytes peeked at accept for a data hello (a `DataHello` frame is far
/// smaller).
const INLINE_PEEK: usize = 512;

/// Runs one connection from its first byte to its end.
fn handle_conn(shared: &Protocol, ticket: Conn, stream: TcpStream) {
    let peer = ticket.peer();
    let started = ticket.accepted();
    let Some((mut stream, keyed)) = secure_or_plain(shared, stream, peer, started) else {
        return;
    };
    // Keyed by a ticket: that ticket's proof is the only way in; not
    // keyed: no ticket that opens only sessions encrypted with its key.
    let mut conn = server_conn(shared, keyed.as_ref(), started);
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(shared.config.preauth_timeout));
    let mut buf = [0u8; 4096];
    loop {
        if flush(&mut conn, &mut stream).is_err() {
            return;
        }
        while let Some(ev) = conn.poll_event() {
            match ev {
                ServerEvent::Open {
                    service,
                    params,
                    authenticated,
                    ticket: grant,
                } => {
                    let open = Opened {
                        name: &service,
                        params,
                        authenticated,
                        ticket: grant,
                        keyed,
                    };
                    return open_session(shared, ticket, conn, stream, open);
                }
                ServerEvent::DataHello { cookie, tag } => {
                    let keyed = keyed.map(|k| k.id);
                    return attach_data(shared, ticket, conn, stream, cookie, tag, keyed);
                }
                ServerEvent::Closed(err) => {
                    let _ = flush(&mut conn, &mut stream);
                    handshake_closed(&ticket, &err);
                    return;
                }
                ServerEvent::Payload(_) => {}
            }
        }
        if conn.is_closed() {
            let _ = flush(&mut conn, &mut stream);
            return;
        }
        let now = Instant::now();
        let wait = match conn.poll_timeout() {
            Some(d) if d <= now => {
                conn.handle_timeout(now);
                continue;
            }
            Some(d) => d - now,
            None => shared.config.preauth_timeout,
        };
        if stream.set_read_timeout(Some(wait)).is_err() {
            return;
        }
        // Never past the frame being read: bytes behind a data hello
        // belong to the service (`ClientSession::open_data_early`).
        let room = conn.read_limit().min(buf.len());
        match stream.read(&mut buf[..room]) {
            Ok(0) => conn.handle_eof(Instant::now()),
            Ok(n) => conn.handle_input(Instant::now(), &buf[..n]),
            Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {
                conn.handle_timeout(Instant::now())
            }
            Err(_) => return,
        }
    }
}

/// What a client asked to open.
struct Opened<'a> {
    name: &'a str,
    params: Vec<u8>,
    authenticated: bool,
    ticket: Option<Vec<u8>>,
    /// The ticket whose TLS identity the connection has, if any.
    keyed: Option<Keyed>,
}

fn open_session(
    shared: &Protocol,
    mut ticket: Conn,
    mut conn: ServerConn,
    mut stream: Stream,
    open: Opened<'_>,
) {
    let peer = ticket.peer();
    let Opened {
        name,
        params,
        authenticated,
        ticket: grant,
        keyed,
    } = open;
    if keyed.is_some() && grant.is_none() {
        conn.reject(
            ErrorCode::AuthRequired,
            "a connection encrypted for a one-time ticket opens only that ticket's session",
        );
        let _ = flush(&mut conn, &mut stream);
        ticket.observer().auth_failed();
        return;
    }
    let Some(service) = shared.services.get(name).cloned() else {
        let mut names: Vec<_> = shared.services.keys().copied().collect();
        names.sort_unstable();
        let reason = format!(
            "no service '{}' (offered: {})",
            fatpipe_proto::escape(name),
            names.join(", ")
        );
        conn.reject(ErrorCode::UnknownService, &reason);
        let _ = flush(&mut conn, &mut stream);
        ticket.observer().refused(Refusal::UnknownService);
        return;
    };
    if ticket.shutdown().is_set() {
        conn.reject(ErrorCode::Busy, SHUTTING_DOWN);
        let _ = flush(&mut conn, &mut stream);
        ticket.observer().refused(Refusal::ShuttingDown);
        ticket.log(&format!("{peer}: {name} refused: shutting down"));
        return;
    }
    if let Err(reason) = service.check(&params) {
        ticket.observer().refused(Refusal::BadParameters);
        conn.reject(ErrorCode::Service, &reason);
        let _ = flush(&mut conn, &mut stream);
        ticket.log(&format!("{peer}: {name} refused: {reason}"));
        return;
    }
    let service_name = service.name();
    // The session's slot (the observer hears of it here, and of its end
    // when it drops, after the service returned).
    let slot = match ticket.admit_session(service_name) {
        Ok(slot) => slot,
        Err(refused) => {
            conn.reject(ErrorCode::Busy, &refused.reason);
            let _ = flush(&mut conn, &mut stream);
            return;
        }
    };
    let cookie: Cookie = random_bytes();
    let (tx, rx) = mpsc::sync_channel(DATA_BACKLOG);
    let encrypted = stream.is_encrypted();
    lock(&shared.cookies).insert(
        cookie,
        Route {
            queue: tx,
            encrypted,
            keyed: keyed.as_ref().map(|k| k.id),
            order: Arc::new(Mutex::new(())),
        },
    );
    let _cookie_guard = CookieGuard(shared, cookie);
    // The ticket's identity stays for the data connections while the
    // session runs (the ticket itself may expire meanwhile).
    let _held = keyed.as_ref().map(|k| shared.running.hold(k));
    conn.accept(Instant::now(), cookie);
    if flush(&mut conn, &mut stream).is_err() {
        return;
    }
    let _ = stream.set_read_timeout(None);
    let local = stream.local_addr().unwrap_or(peer);
    let control = match Control::new(stream, &conn.take_buffered(), Vec::new()) {
        Ok(c) => c,
        Err(e) => {
            ticket.log(&format!("{peer}: {name}: {e}"));
            return;
        }
    };
    let started = control.started_flag();
    let expired = Arc::new(AtomicBool::new(false));
    let session = ServerSession {
        control: control.clone(),
        params,
        peer,
        local,
        data: Mutex::new(rx),
        shutdown: ticket.shutdown().clone(),
        cookie,
        report: slot.report().clone(),
        started: Arc::clone(&started),
        expired: Arc::clone(&expired),
        authenticated,
        ticket: grant,
    };
    lock(&shared.live).insert(
        cookie,
        Live {
            control: control.clone(),
            peer,
            started,
            expired: Arc::clone(&expired),
            start_by: Instant::now() + shared.start_timeout,
        },
    );
    let _live_guard = LiveGuard(shared, cookie);
    {
        // What the drain does to a session still running at its end.
        let control = control.clone();
        slot.on_abort(move |reason| {
            control.close(reason);
            control.abort();
        });
    }
    let by = match (&session.ticket, &keyed) {
        (Some(_), Some(_)) => " (one-time ticket, encrypted with its key)",
        (Some(_), None) => " (one-time ticket)",
        _ => "",
    };
    ticket.log(&format!("{peer}: {name} session started{by}"));
    let started = Instant::now();
    let outcome = match service.serve(session) {
        Ok(()) => {
            control.close("");
            ticket.log(&format!(
                "{peer}: {name} session ended after {:.1} s",
                started.elapsed().as_secs_f64()
            ));
            Outcome::Ok
        }
        Err(_) if expired.load(Ordering::Relaxed) => {
            // The watchdog closed it and counted it in its summary.
            Outcome::Failed
        }
        Err(e) => {
            control.close(&e.to_string());
            ticket.log(&format!("{peer}: {name} session failed: {e}"));
            if ticket.shutdown().is_set() {
                Outcome::Aborted
            } else {
                Outcome::Failed
            }
        }
    };
    slot.finish(outcome);
}

fn attach_data(
    shared: &Protocol,
    mut ticket: Conn,
    mut conn: ServerConn,
    mut stream: Stream,
    cookie: Cookie,
    tag: u32,
    keyed: Option<fatpipe_proto::TicketId>,
) {
    let peer = ticket.peer();
    let route = lock(&shared.cookies).get(&cookie).cloned();
    let Some(Route {
        queue: tx,
        encrypted,
        keyed: session_keyed,
        order,
    }) = route
    else {
        conn.reject(ErrorCode::BadCookie, "no live session holds this cookie");
        let _ = flush(&mut conn, &mut stream);
        return;
    };
    if encrypted && !stream.is_encrypted() {
        conn.reject(
            ErrorCode::Protocol,
            "the session is encrypted: its data connections must be too",
        );
        let _ = flush(&mut conn, &mut stream);
        return;
    }
    if keyed != session_keyed {
        conn.reject(
            ErrorCode::Protocol,
            "a data connection must be encrypted with the key its session's was",
        );
        let _ = flush(&mut conn, &mut stream);
        return;
    }
    if !conn.take_buffered().is_empty() {
        conn.reject(
            ErrorCode::Protocol,
            "data sent before the data hello was acknowledged",
        );
        let _ = flush(&mut conn, &mut stream);
        return;
    }
    let slot = match ticket.take_stream() {
        Ok(slot) => slot,
        Err(reason) => {
            conn.reject(ErrorCode::Busy, &reason);
            let _ = flush(&mut conn, &mut stream);
            return;
        }
    };
    // The acknowledgement goes out before the connection is queued (the
    // service may write to it at once), so without this lock a connection
    // the client dialled after reading another's acknowledgement could be
    // queued first, and a service that takes its first connection as its
    // control connection would take a data one (seen on a loaded host).
    // Held from this ack until the queueing below: whatever the client
    // dials after reading it queues behind.
    let _order = lock(&order);
    conn.attach();
    if flush(&mut conn, &mut stream).is_err() {
        return;
    }
    // The slot goes with the stream, to whichever thread the service
    // hands it (and its clones): it is freed when the last one closes.
    let stream = stream.hold(Arc::new(slot));
    let _ = stream.set_read_timeout(None);
    let _ = stream.set_write_timeout(None);
    let _ = stream.set_nodelay(false);
    match tx.try_send(DataConn { stream, tag, peer }) {
        Ok(()) => {}
        Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
            ticket.log(&format!(
                "{peer}: data connection dropped: session full or gone"
            ));
        }
    }
}

/// A new connection as a [`Stream`]: through the TLS handshake (by the
/// pre-auth deadline) if its first byte starts one, plain otherwise (a
/// fatpipe frame starts with 0; docs/encryption.md). The TLS identity is
/// the pre-shared key's, or a one-time ticket's when the `ClientHello`
/// names one ([`crate::keyed`]; then the ticket is returned too). `None`
/// if the handshake failed; that is logged.
fn secure_or_plain(
    shared: &Protocol,
    tcp: TcpStream,
    peer: SocketAddr,
    started: Instant,
) -> Option<(Stream, Option<Keyed>)> {
    let _ = tcp.set_read_timeout(Some(shared.config.preauth_timeout));
    let mut first = [0u8; 1];
    let peeked = loop {
        match tcp.peek(&mut first) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            other => break other,
        }
    };
    // Silence, an error or the end: the plain path reports it as before.
    if !matches!(peeked, Ok(1)) || !fatpipe_secure::is_tls_start(first[0]) {
        return Some((Stream::plain_tcp(tcp), None));
    }
    let deadline = started + shared.config.preauth_timeout;
    let mut keyed = None;
    let mut why = None;
    let chosen =
        fatpipe_secure::ticket::server_handshake_by_name(tcp, deadline, |name| match identity_for(
            shared, name,
        ) {
            Ok((tls, k)) => {
                keyed = k;
                Ok(tls)
            }
            Err(w) => {
                let e = w.error();
                why = Some(w);
                Err(e)
            }
        });
    match chosen {
        Ok(s) => Some((s, keyed)),
        Err(e) => {
            tls_refused(shared, peer, &e, why.as_ref());
            None
        }
    }
}

/// Counts a connection whose protocol handshake ended with `err` before
/// it was a session or a data connection. A flood makes thousands of
/// these: summaries, not lines.
fn handshake_closed(ticket: &Conn, err: &fatpipe_proto::ConnError) {
    if err.is_auth() {
        ticket.observer().auth_failed();
    }
    match err {
        fatpipe_proto::ConnError::Eof => {}
        fatpipe_proto::ConnError::Timeout(_) => ticket.summarise(Event::PreauthTimeout),
        _ => ticket.summarise(Event::HandshakeFailed),
    }
}

/// Why a connection's `ClientHello` got no TLS identity.
enum NoIdentity {
    /// No ticket named, and the server has no key.
    Keyless,
    /// It named a ticket that is neither live nor running.
    UnknownTicket(fatpipe_secure::TlsError),
}

impl NoIdentity {
    fn error(&self) -> fatpipe_secure::TlsError {
        match self {
            NoIdentity::Keyless => fatpipe_secure::TlsError::Identity("no key".into()),
            NoIdentity::UnknownTicket(e) => fatpipe_secure::TlsError::Identity(e.to_string()),
        }
    }
}

/// The TLS identity for a `ClientHello` that asked for server name
/// `name`: a one-time ticket's when it names one ([`crate::keyed`]; the
/// ticket comes back too), else the pre-shared key's.
fn identity_for(
    shared: &Protocol,
    name: Option<&str>,
) -> std::result::Result<(ServerTls, Option<Keyed>), NoIdentity> {
    if let Some(id) = name.and_then(fatpipe_secure::ticket::parse_name) {
        let tls = shared
            .running
            .identity(shared.config.tickets.as_ref(), &id, Instant::now())
            .map_err(NoIdentity::UnknownTicket)?;
        return Ok((tls.clone(), Some(Keyed { id, tls })));
    }
    shared
        .tls
        .clone()
        .map(|t| (t, None))
        .ok_or(NoIdentity::Keyless)
}

/// Logs (and counts) a TLS handshake that failed with `e`; `why` when no
/// identity could be chosen for it.
fn tls_refused(
    shared: &Protocol,
    peer: SocketAddr,
    e: &fatpipe_secure::TlsError,
    why: Option<&NoIdentity>,
) {
    if matches!(why, Some(NoIdentity::Keyless)) {
        shared.gate.log(&format!(
            "{peer}: encrypted connection refused: the server has no key (--key-file) to prove"
        ));
        return;
    }
    // The client refused our identity (it holds another key), or named a
    // ticket the server does not have.
    if matches!(why, Some(NoIdentity::UnknownTicket(_)))
        || matches!(e, fatpipe_secure::TlsError::PeerAlert(_))
    {
        shared.gate.observer.auth_failed();
    }
    if !matches!(e, fatpipe_secure::TlsError::Timeout) {
        shared
            .gate
            .log(&format!("{peer}: TLS handshake failed: {e}"));
    }
}

/// The protocol's server side for a connection keyed by `keyed` (or by
/// none): a ticket's connection may prove only that ticket, any other
/// none that opens only sessions encrypted with its key.
fn server_conn(shared: &Protocol, keyed: Option<&Keyed>, started: Instant) -> ServerConn {
    let narrowed = match keyed {
        Some(k) => Some(crate::keyed::only(&shared.config, k.id)),
        None => crate::keyed::unkeyed(&shared.config),
    };
    let config = narrowed.as_ref().unwrap_or(&shared.config);
    ServerConn::new(config, started, random_bytes())
}

fn flush(conn: &mut ServerConn, stream: &mut Stream) -> io::Result<()> {
    while let Some(bytes) = conn.poll_transmit() {
        stream.write_all(&bytes)?;
    }
    Ok(())
}

/// Fresh random bytes from the OS. If the OS has no randomness to give,
/// nothing about the session can be trusted, so the process stops.
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    if let Err(e) = getrandom::fill(&mut b) {
        panic!("the operating system has no randomness to give: {e}");
    }
    b
}

fn wake_addr(bound: SocketAddr) -> SocketAddr {
    let mut a = bound;
    if a.ip().is_unspecified() {
        a.set_ip(match a {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    a
}

/// The address a source's caps are counted by: an IPv4 address (also
/// when mapped into IPv6), or the /64 of an IPv6 address, which one host
/// usually holds whole.
pub fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut s = v6.segments();
                s[4..].fill(0);
                IpAddr::V6(s.into())
            }
        },
    }
}

/// Ends the fatpipe sessions that did not start in time (the watchdog's
/// tick of the protocol's front end).
fn end_overdue(shared: &Protocol, now: Instant) {
    let overdue: Vec<(Cookie, Control, SocketAddr)> = lock(&shared.live)
        .iter()
        .filter(|(_, l)| {
            now >= l.start_by
                && !l.started.load(Ordering::Relaxed)
                && !l.expired.swap(true, Ordering::Relaxed)
        })
        .map(|(c, l)| (*c, l.control.clone(), l.peer))
        .collect();
    for (cookie, control, peer) in overdue {
        // Dropping the data queue's sender wakes a service waiting in
        // `accept_data`; shutting the socket wakes one in `recv`.
        lock(&shared.cookies).remove(&cookie);
        control.close(&format!(
            "{NOT_STARTED} ({:.1} s)",
            shared.start_timeout.as_secs_f64()
        ));
        control.abort();
        shared.gate.summarise("", Event::NeverStarted, peer.ip());
    }
}

/// When `run` returns: stops the watchdog and writes what the summaries
/// counted so far (here, not on the watchdog, which the exiting process
/// would not wait for).
struct StopOnDrop(Arc<AtomicBool>, Arc<Gate>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        self.1.flush_summaries();
    }
}

/// Takes a session off the list the drain aborts.
struct LiveGuard<'a>(&'a Protocol, Cookie);

impl Drop for LiveGuard<'_> {
    fn drop(&mut self) {
        lock(&self.0.live).remove(&self.1);
    }
}

/// Removes a session's cookie when the session ends, so late data
/// connections are refused.
struct CookieGuard<'a>(&'a Protocol, Cookie);

impl Drop for CookieGuard<'_> {
    fn drop(&mut self) {
        lock(&self.0.cookies).remove(&self.1);
    }
}
