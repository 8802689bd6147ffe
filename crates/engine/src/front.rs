//! The accept framework every listener of the server sits behind: the
//! fatpipe protocol's port, `--iperf3-port`, the `--metrics` port, and
//! whatever front end comes next (HTTP/WebDAV).
//!
//! A front end is one [`FrontEnd`]: it names itself and serves one
//! accepted connection on a thread of its own, owning the socket from then
//! on (its protocol, its parser, its threads). What a peer can make the
//! server spend is bounded here, once, the same way on every port:
//!
//! - **Before admission** a connection holds one of its port's handshake
//!   slots ([`PortCaps`]: in all, and per source address, IPv6 sources by
//!   /64); past either cap it is closed unread, which costs an `accept` and
//!   a `close`. The front end reads under [`Conn::deadline`], the pre-auth
//!   deadline counted from `accept` for the whole handshake (a peer sending
//!   a byte a second cannot stretch it).
//! - **Sessions** of every port take slots of the server's one session cap
//!   (`--max-sessions`, and `--max-sessions-per-source`) through
//!   [`Conn::admit_session`], which refuses while the server shuts down,
//!   tells the [`Observer`], and gives the front end a [`Session`]: its
//!   [`Report`] (bytes, streams), its stream slots, and
//!   [`Session::on_abort`], how the drain ends it.
//! - **Streams** of every port take slots of the one `--max-streams` cap
//!   ([`Session::take_streams`], [`Conn::take_stream`]), freed when the
//!   [`StreamSlots`] drop.
//! - **Log lines** go through the server's one logger, escaped
//!   ([`fatpipe_proto::escape`]: peer text cannot forge lines or drive the
//!   operator's terminal); pre-auth timeouts, failed handshakes and
//!   refusals at a cap are counted in the rate-limited summaries
//!   ([`crate::logsum`]), with the port's name.
//! - **Shutdown** ([`Shutdown::trigger`], on SIGTERM) is one drain for all
//!   ports: no port admits a session any more, running sessions of every
//!   port get the drain time to end (front ends see the flag), the rest are
//!   aborted through their [`Session::on_abort`], and every accept loop
//!   returns.
//!
//! The gate's accounting (slots, refusals, the drain's list) is plain
//! state behind locks and counters, so its tests need no
//! socket.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::control::lock;
use crate::logsum::{Event, Summariser};
use crate::observe::{Observer, Outcome, Refusal, Report};
use crate::server::{source_key, Logger, Shutdown, CONN_STACK};

/// A listener's protocol: what the server runs on each connection the
/// port accepts. Register one with
/// [`ServerBuilder::front_end`](crate::ServerBuilder::front_end).
pub trait FrontEnd: Send + Sync + 'static {
    /// Its name: the service its sessions report under (`/metrics`), its
    /// threads' names, and its port in the log summaries.
    fn name(&self) -> &'static str;

    /// Serves one accepted connection on its own thread (with a
    /// [`CONN_STACK`] stack), to its end. `conn` is the connection's ticket
    /// with the server: its pre-auth deadline, admission to a session or a
    /// stream, the log.
    fn serve(&self, tcp: TcpStream, conn: Conn);

    /// Called on the port's accept thread before [`serve`](Self::serve):
    /// a front end may finish here, without a thread of its own, a
    /// connection whose whole first message has already arrived and needs
    /// no answer (a data stream presenting its session's cookie). It must
    /// not block: look with `fatpipe_sys::tcp::peek_now`. Returns the
    /// connection to be served on a thread of its own, as it was (nothing
    /// read from it); the default takes none.
    fn serve_inline(&self, tcp: TcpStream, conn: Conn) -> Option<(TcpStream, Conn)> {
        Some((tcp, conn))
    }

    /// Called every watchdog tick (100 ms) while the server runs: for a
    /// front end's own deadlines (the fatpipe protocol ends sessions that
    /// never start). The default does nothing.
    fn tick(&self, now: Instant) {
        let _ = now;
    }
}

/// What one port lets connections that are not yet admitted (still
/// handshaking) hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortCaps {
    /// Connections still handshaking at once, in all.
    pub handshakes: usize,
    /// Connections still handshaking at once from one address (IPv6: one /64).
    pub handshakes_per_source: usize,
}

impl PortCaps {
    /// Caps of `total` and `per_source` (each at least 1).
    pub fn new(total: usize, per_source: usize) -> PortCaps {
        PortCaps {
            handshakes: total.max(1),
            handshakes_per_source: per_source.max(1),
        }
    }
}

/// Why a session was not admitted: the observer's reason and the text the
/// peer is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The kind, as the observer counts it.
    pub why: Refusal,
    /// One line for the peer, naming the cap and its flag.
    pub reason: String,
}

/// What a client is told when the server ends or refuses its session
/// because it is stopping.
pub const SHUTTING_DOWN: &str = "the server is shutting down";

/// An accepted connection's ticket with the server: who it is, its
/// pre-auth deadline, and admission to a session or a stream. Dropping it
/// frees its handshake slot.
pub struct Conn {
    gate: Arc<Gate>,
    port: Arc<Port>,
    handshake: HandshakeSlot,
    peer: SocketAddr,
    seq: u64,
    accepted: Instant,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("port", &self.port.name)
            .field("peer", &self.peer)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl Conn {
    /// The peer's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// This connection's place in its port's accept order, from 1 (iperf3
    /// tells a stream's role only by the order its streams connected).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// When it was accepted (when its thread began, just after `accept`).
    pub fn accepted(&self) -> Instant {
        self.accepted
    }

    /// The server's pre-auth timeout (`--preauth-timeout`).
    pub fn preauth_timeout(&self) -> Duration {
        self.gate.preauth_timeout
    }

    /// By when the whole handshake must be read: [`accepted`](Self::accepted)
    /// plus the pre-auth timeout. Every read before admission is bounded
    /// by it.
    pub fn deadline(&self) -> Instant {
        self.accepted + self.gate.preauth_timeout
    }

    /// Makes the connection a session of `service`: frees its handshake
    /// slot and takes one of the server's session slots (in all and for
    /// its source). Refused while the server shuts down or at a cap; the
    /// observer, and the log summary for a cap, are told here.
    pub fn admit_session(&mut self, service: &'static str) -> Result<Session, Refused> {
        self.handshake.release();
        self.gate
            .open_session(service, self.peer, self.port.label)
            .inspect_err(|r| {
                if r.why == Refusal::ShuttingDown {
                    self.gate
                        .log(&format!("{}: {service} refused: shutting down", self.peer));
                }
            })
    }

    /// Makes the connection a data stream: frees its handshake slot and
    /// takes one of `--max-streams`. A refusal is counted in the log
    /// summary; the text names the cap for the peer.
    pub fn take_stream(&mut self) -> Result<StreamSlots, String> {
        self.handshake.release();
        self.gate.take_streams(1, self.peer, self.port.label)
    }

    /// Frees the handshake slot: the connection belongs to a session that
    /// already holds what it costs (its streams' slots).
    pub fn admitted(&mut self) {
        self.handshake.release();
    }

    /// Counts a pre-auth event (a timeout, a failed handshake) for the
    /// rate-limited log summary.
    pub fn summarise(&self, event: Event) {
        self.gate.summarise(self.port.label, event, self.peer.ip());
    }

    /// Writes one line to the server's log, escaped.
    pub fn log(&self, line: &str) {
        self.gate.log(line);
    }

    /// The server's observer (for what is not a session: failed
    /// authentication).
    pub fn observer(&self) -> &Arc<dyn Observer> {
        &self.gate.observer
    }

    /// Set when the server is shutting down.
    pub fn shutdown(&self) -> &Shutdown {
        &self.gate.shutdown
    }
}

/// A running session of some front end, holding one of the server's
/// session slots. Dropping it ends the session for the observer (with the
/// outcome set by [`finish`](Self::finish); unset, it failed, or was
/// aborted if the server is shutting down) and frees the slot.
pub struct Session {
    gate: Arc<Gate>,
    service: &'static str,
    peer: SocketAddr,
    label: &'static str,
    id: u64,
    report: Report,
    outcome: Mutex<Option<Outcome>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("service", &self.service)
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Where the session reports its bytes and streams (the server's
    /// observer, under its service name).
    pub fn report(&self) -> &Report {
        &self.report
    }

    /// Set when the server is shutting down; a session should end soon
    /// after, telling its peer why.
    pub fn shutdown(&self) -> &Shutdown {
        &self.gate.shutdown
    }

    /// Writes one line to the server's log, escaped.
    pub fn log(&self, line: &str) {
        self.gate.log(line);
    }

    /// Takes `n` of the server's `--max-streams` slots for this session's
    /// streams, all or none. A refusal is counted in the log summary; the
    /// text names the cap for the peer.
    pub fn take_streams(&self, n: usize) -> Result<StreamSlots, String> {
        self.gate.take_streams(n, self.peer, self.label)
    }

    /// How the drain ends this session if it is still running when the
    /// drain time is up: `abort` is called once with the reason to tell
    /// the peer, from another thread, and must make the session's own
    /// thread return (shut its sockets). A later call replaces it.
    pub fn on_abort(&self, abort: impl Fn(&str) + Send + Sync + 'static) {
        lock(&self.gate.live).insert(self.id, Arc::new(abort));
    }

    /// How the session ended, for the observer.
    pub fn finish(&self, outcome: Outcome) {
        *lock(&self.outcome) = Some(outcome);
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        lock(&self.gate.live).remove(&self.id);
        let outcome = lock(&self.outcome).take().unwrap_or({
            if self.gate.shutdown.is_set() {
                Outcome::Aborted
            } else {
                Outcome::Failed
            }
        });
        self.gate.observer.session_ended(self.service, outcome);
        self.gate.with_source(source_key(self.peer.ip()), |n| {
            *n = n.saturating_sub(1);
            self.gate.sessions.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

/// Slots of `--max-streams`, freed when dropped. Whoever holds a stream
/// holds its slot (the fatpipe protocol puts it inside the stream, so it
/// travels with it to any thread).
#[derive(Debug)]
pub struct StreamSlots {
    counter: Arc<AtomicUsize>,
    n: usize,
}

impl StreamSlots {
    /// How many slots these are.
    pub fn count(&self) -> usize {
        self.n
    }
}

impl Drop for StreamSlots {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.n, Ordering::AcqRel);
    }
}

/// The server-wide bounds and the parts every port shares: session and
/// stream caps, the log and its summaries, the observer, the shutdown
/// flag and the drain's list of running sessions.
pub(crate) struct Gate {
    pub(crate) max_sessions: usize,
    pub(crate) sessions_per_source: usize,
    pub(crate) max_streams: usize,
    pub(crate) preauth_timeout: Duration,
    pub(crate) drain_timeout: Duration,
    /// Sessions running, over every port.
    pub(crate) sessions: AtomicUsize,
    /// Stream slots held, over every port.
    streams: Arc<AtomicUsize>,
    /// Sessions per source; an entry lives while non-zero, so there are
    /// at most `max_sessions`.
    session_sources: Mutex<HashMap<IpAddr, usize>>,
    summary: Mutex<Summariser>,
    pub(crate) shutdown: Shutdown,
    logger: Logger,
    pub(crate) observer: Arc<dyn Observer>,
    /// How to abort each running session that said how (at most
    /// `max_sessions`).
    live: Mutex<HashMap<u64, Abort>>,
    next_id: AtomicU64,
    /// Set by the first accept loop that saw the shutdown.
    draining: AtomicBool,
    /// Set by the drain once every session ended or was aborted.
    pub(crate) drained: AtomicBool,
}

type Abort = Arc<dyn Fn(&str) + Send + Sync>;

/// The server-wide caps of a [`Gate`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct GateCaps {
    pub(crate) max_sessions: usize,
    pub(crate) sessions_per_source: usize,
    pub(crate) max_streams: usize,
    pub(crate) preauth_timeout: Duration,
    pub(crate) drain_timeout: Duration,
}

impl Gate {
    pub(crate) fn new(
        caps: GateCaps,
        shutdown: Shutdown,
        logger: Logger,
        observer: Arc<dyn Observer>,
    ) -> Gate {
        Gate {
            max_sessions: caps.max_sessions.max(1),
            sessions_per_source: caps.sessions_per_source.max(1),
            max_streams: caps.max_streams.max(1),
            preauth_timeout: caps.preauth_timeout,
            drain_timeout: caps.drain_timeout,
            sessions: AtomicUsize::new(0),
            streams: Arc::new(AtomicUsize::new(0)),
            session_sources: Mutex::new(HashMap::new()),
            summary: Mutex::new(Summariser::default()),
            shutdown,
            logger,
            observer,
            live: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            draining: AtomicBool::new(false),
            drained: AtomicBool::new(false),
        }
    }

    /// One line to the log, escaped whatever the front end quoted.
    pub(crate) fn log(&self, line: &str) {
        (self.logger)(&fatpipe_proto::escape(line));
    }

    /// Counts one event for the rate-limited summary of port `label`.
    pub(crate) fn summarise(&self, label: &'static str, event: Event, ip: IpAddr) {
        let lines = lock(&self.summary).record_on(Instant::now(), label, event, ip);
        for line in lines {
            self.log(&line);
        }
    }

    /// Writes the summaries of a window that ended by `now`.
    pub(crate) fn poll_summaries(&self, now: Instant) {
        let lines = lock(&self.summary).poll(now);
        for line in lines {
            self.log(&line);
        }
    }

    /// Writes what the summaries counted so far (when the server stops).
    pub(crate) fn flush_summaries(&self) {
        let lines = lock(&self.summary).flush(Instant::now());
        for line in lines {
            self.log(&line);
        }
    }

    fn with_source<T>(&self, key: IpAddr, f: impl FnOnce(&mut usize) -> T) -> T {
        let mut sources = lock(&self.session_sources);
        let entry = sources.entry(key).or_default();
        let r = f(entry);
        if *entry == 0 {
            sources.remove(&key);
        }
        r
    }

    /// A session slot for `service` with `peer`, or why not.
    pub(crate) fn open_session(
        self: &Arc<Self>,
        service: &'static str,
        peer: SocketAddr,
        label: &'static str,
    ) -> Result<Session, Refused> {
        if self.shutdown.is_set() {
            self.observer.refused(Refusal::ShuttingDown);
            return Err(Refused {
                why: Refusal::ShuttingDown,
                reason: SHUTTING_DOWN.into(),
            });
        }
        let admitted = self.with_source(source_key(peer.ip()), |n| {
            if *n >= self.sessions_per_source {
                return Err(format!(
                    "at its limit of {} sessions from one address \
                     (--max-sessions-per-source); retry later",
                    self.sessions_per_source
                ));
            }
            if self.sessions.load(Ordering::Acquire) >= self.max_sessions {
                return Err(format!(
                    "at its limit of {} sessions (--max-sessions); retry later",
                    self.max_sessions
                ));
            }
            *n += 1;
            self.sessions.fetch_add(1, Ordering::AcqRel);
            Ok(())
        });
        if let Err(reason) = admitted {
            self.observer.refused(Refusal::Busy);
            self.summarise(label, Event::SessionCap, peer.ip());
            return Err(Refused {
                why: Refusal::Busy,
                reason,
            });
        }
        self.observer.session_started(service);
        Ok(Session {
            gate: Arc::clone(self),
            service,
            peer,
            label,
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            report: Report::new(Arc::clone(&self.observer), service, peer.ip()),
            outcome: Mutex::new(None),
        })
    }

    /// `n` stream slots, all or none.
    pub(crate) fn take_streams(
        &self,
        n: usize,
        peer: SocketAddr,
        label: &'static str,
    ) -> Result<StreamSlots, String> {
        let max = self.max_streams;
        let taken = self
            .streams
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(n).filter(|&t| t <= max)
            });
        match taken {
            Ok(_) => Ok(StreamSlots {
                counter: Arc::clone(&self.streams),
                n,
            }),
            Err(_) => {
                self.summarise(label, Event::StreamCap, peer.ip());
                Err(format!(
                    "at its limit of {max} data connections in all \
                     (--max-streams); retry later or with fewer streams"
                ))
            }
        }
    }

    /// Sessions running now, over every port.
    pub(crate) fn running(&self) -> usize {
        self.sessions.load(Ordering::Acquire)
    }

    /// The drain after [`Shutdown::trigger`]: waits for running sessions
    /// of every port to end (front ends see the flag), aborts what is left
    /// after the drain time, then lets the accept loops return.
    pub(crate) fn drain(&self) {
        self.log(&format!(
            "shutting down: refusing new sessions, {} running",
            self.running()
        ));
        let deadline = Instant::now() + self.drain_timeout;
        while self.running() > 0 && Instant::now() < deadline {
            std::thread::sleep(DRAIN_POLL);
        }
        if self.running() > 0 {
            self.log(&format!(
                "shutting down: aborting {} sessions",
                self.running()
            ));
            let aborts: Vec<Abort> = lock(&self.live).values().cloned().collect();
            for abort in aborts {
                abort(SHUTTING_DOWN);
            }
            let deadline = Instant::now() + ABORT_GRACE;
            while self.running() > 0 && Instant::now() < deadline {
                std::thread::sleep(DRAIN_POLL);
            }
        }
        self.drained.store(true, Ordering::Release);
        self.shutdown.wake_all();
    }
}

/// How often the drain looks whether the sessions have ended.
const DRAIN_POLL: Duration = Duration::from_millis(20);
/// How long sessions aborted at the end of the drain get to unwind.
const ABORT_GRACE: Duration = Duration::from_secs(2);

/// One listening port: its front end's name, its caps and who is
/// handshaking on it.
pub(crate) struct Port {
    pub(crate) name: &'static str,
    /// The name in the log summaries (`""` for the fatpipe protocol's).
    pub(crate) label: &'static str,
    caps: PortCaps,
    handshakes: AtomicUsize,
    sources: Mutex<HashMap<IpAddr, usize>>,
}

impl Port {
    pub(crate) fn new(name: &'static str, label: &'static str, caps: PortCaps) -> Port {
        Port {
            name,
            label,
            caps: PortCaps::new(caps.handshakes, caps.handshakes_per_source),
            handshakes: AtomicUsize::new(0),
            sources: Mutex::new(HashMap::new()),
        }
    }

    /// Connections handshaking on this port now.
    #[cfg(test)]
    pub(crate) fn handshaking(&self) -> usize {
        self.handshakes.load(Ordering::Acquire)
    }
}

/// Counts a connection as handshaking on its port (in all and for its
/// source) until released or dropped.
pub(crate) struct HandshakeSlot {
    port: Arc<Port>,
    source: IpAddr,
    held: bool,
}

impl HandshakeSlot {
    pub(crate) fn take(port: &Arc<Port>, ip: IpAddr) -> Option<HandshakeSlot> {
        let source = source_key(ip);
        let mut sources = lock(&port.sources);
        let n = sources.entry(source).or_default();
        let total = port.handshakes.load(Ordering::Acquire);
        if total >= port.caps.handshakes || *n >= port.caps.handshakes_per_source {
            if *n == 0 {
                sources.remove(&source);
            }
            return None;
        }
        *n += 1;
        port.handshakes.fetch_add(1, Ordering::AcqRel);
        Some(HandshakeSlot {
            port: Arc::clone(port),
            source,
            held: true,
        })
    }

    pub(crate) fn release(&mut self) {
        if std::mem::take(&mut self.held) {
            let mut sources = lock(&self.port.sources);
            if let Some(n) = sources.get_mut(&self.source) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    sources.remove(&self.source);
                }
            }
            self.port.handshakes.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        self.release();
    }
}

/// A bound port with its front end, as the server runs it.
pub(crate) struct Listening {
    pub(crate) listener: TcpListener,
    pub(crate) port: Arc<Port>,
    pub(crate) front: Arc<dyn FrontEnd>,
}

/// Accepts on one port until the drain is over, one thread per
/// connection (unless the front end finishes it inline); the first loop to see the shutdown starts the drain.
pub(crate) fn accept_loop(gate: &Arc<Gate>, listening: &Listening) {
    let Listening {
        listener,
        port,
        front,
    } = listening;
    let mut seq = 0u64;
    loop {
        let accepted = listener.accept();
        if gate.shutdown.is_set() {
            if gate.drained.load(Ordering::Acquire) {
                return;
            }
            if !gate.draining.swap(true, Ordering::AcqRel) {
                let g = Arc::clone(gate);
                let spawned = std::thread::Builder::new()
                    .name("drain".into())
                    .spawn(move || g.drain());
                if spawned.is_err() {
                    // No thread for the drain: stop without one.
                    gate.drained.store(true, Ordering::Release);
                    gate.shutdown.wake_all();
                    return;
                }
            }
        }
        let (tcp, peer) = match accepted {
            Ok(x) => x,
            // Out of descriptors or a connection reset before accept:
            // keep serving the others after a breath.
            Err(_) => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        seq += 1;
        let Some(handshake) = HandshakeSlot::take(port, peer.ip()) else {
            // Too many connections still handshaking, from this source or
            // in all: a flood. Close it unread (the cheapest answer).
            drop(tcp);
            gate.observer.refused(Refusal::HandshakeLimit);
            gate.summarise(port.label, Event::HandshakeCap, peer.ip());
            continue;
        };
        let conn = Conn {
            gate: Arc::clone(gate),
            port: Arc::clone(port),
            handshake,
            peer,
            seq,
            accepted: Instant::now(),
        };
        // A stream whose cookie is already here is handed over at once:
        // a thousand of them connecting together cost no thread each, and
        // never wait for one while their handshake slots run out.
        let Some((tcp, conn)) = front.serve_inline(tcp, conn) else {
            continue;
        };
        let front = Arc::clone(front);
        let name = format!("{} {peer}", port.name);
        let spawned = std::thread::Builder::new()
            .name(name)
            .stack_size(CONN_STACK)
            .spawn(move || {
                // The deadline runs from when the connection's thread can
                // read, as it always has: on a loaded host a thread may
                // start late, and that is not the peer's time.
                let conn = Conn {
                    accepted: Instant::now(),
                    ..conn
                };
                front.serve(tcp, conn)
            });
        // On failure the closure, with the slot in it, is dropped.
        let _ = spawned;
    }
}

/// Ticks the front ends and writes the log summaries, every
/// [`WATCHDOG_TICK`] until `stop`.
pub(crate) fn watchdog(gate: &Gate, fronts: &[Arc<dyn FrontEnd>], stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(WATCHDOG_TICK);
        let now = Instant::now();
        for front in fronts {
            front.tick(now);
        }
        gate.poll_summaries(now);
    }
}

/// How often the watchdog ticks.
const WATCHDOG_TICK: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    //! The gate's accounting without sockets: slots of every kind, what
    //! shutdown refuses, and the drain's aborts.

    use super::*;
    use crate::observe::Observer;

    /// Counts what the observer hears.
    #[derive(Default)]
    struct Seen {
        started: AtomicUsize,
        ended: Mutex<Vec<(&'static str, Outcome)>>,
        refused: Mutex<Vec<Refusal>>,
    }

    impl Observer for Seen {
        fn session_started(&self, _: &'static str) {
            self.started.fetch_add(1, Ordering::Relaxed);
        }
        fn session_ended(&self, service: &'static str, outcome: Outcome) {
            lock(&self.ended).push((service, outcome));
        }
        fn refused(&self, why: Refusal) {
            lock(&self.refused).push(why);
        }
    }

    fn gate(max_sessions: usize, per_source: usize, max_streams: usize) -> (Arc<Gate>, Arc<Seen>) {
        let seen = Arc::new(Seen::default());
        let caps = GateCaps {
            max_sessions,
            sessions_per_source: per_source,
            max_streams,
            preauth_timeout: Duration::from_secs(5),
            drain_timeout: Duration::from_millis(50),
        };
        let g = Gate::new(caps, Shutdown::default(), Arc::new(|_| {}), seen.clone());
        (Arc::new(g), seen)
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn sessions_of_every_port_count_against_one_cap_and_one_per_source_cap() {
        let (g, seen) = gate(3, 2, 100);
        let a = g.open_session("test", addr("10.0.0.1:1"), "").unwrap();
        let b = g
            .open_session("iperf3", addr("10.0.0.1:2"), "iperf3")
            .unwrap();
        let refused = g
            .open_session("iperf3", addr("10.0.0.1:3"), "iperf3")
            .unwrap_err();
        assert_eq!(refused.why, Refusal::Busy);
        assert!(
            refused.reason.contains("--max-sessions-per-source"),
            "{refused:?}"
        );
        let c = g.open_session("http", addr("10.0.0.2:1"), "http").unwrap();
        let refused = g.open_session("test", addr("10.0.0.3:1"), "").unwrap_err();
        assert!(refused.reason.contains("--max-sessions)"), "{refused:?}");
        assert_eq!(g.running(), 3);
        a.finish(Outcome::Ok);
        drop((a, b, c));
        assert_eq!(g.running(), 0);
        assert!(
            lock(&g.session_sources).is_empty(),
            "no entry outlives its sessions"
        );
        assert_eq!(seen.started.load(Ordering::Relaxed), 3);
        assert_eq!(
            *lock(&seen.ended),
            [
                ("test", Outcome::Ok),
                ("iperf3", Outcome::Failed),
                ("http", Outcome::Failed)
            ]
        );
        assert_eq!(*lock(&seen.refused), [Refusal::Busy, Refusal::Busy]);
    }

    #[test]
    fn streams_of_every_port_count_against_max_streams_all_or_none() {
        let (g, _) = gate(10, 10, 5);
        let s = g
            .open_session("iperf3", addr("10.0.0.1:1"), "iperf3")
            .unwrap();
        let three = s.take_streams(3).unwrap();
        assert_eq!(three.count(), 3);
        let err = s.take_streams(3).unwrap_err();
        assert!(err.contains("limit of 5 data connections"), "{err}");
        let two = g.take_streams(2, addr("10.0.0.2:1"), "").unwrap();
        assert!(g.take_streams(1, addr("10.0.0.2:1"), "").is_err());
        drop(three);
        assert_eq!(s.take_streams(3).unwrap().count(), 3);
        drop(two);
        assert_eq!(g.streams.load(Ordering::Acquire), 0, "every slot came back");
        assert!(
            g.take_streams(usize::MAX, addr("10.0.0.1:1"), "").is_err(),
            "no overflow"
        );
    }

    #[test]
    fn a_shutting_down_server_admits_no_session_on_any_port() {
        let (g, seen) = gate(10, 10, 10);
        g.shutdown.trigger();
        for (service, label) in [("test", ""), ("iperf3", "iperf3")] {
            let r = g
                .open_session(service, addr("10.0.0.1:1"), label)
                .unwrap_err();
            assert_eq!(r.why, Refusal::ShuttingDown);
            assert_eq!(r.reason, SHUTTING_DOWN);
        }
        assert_eq!(g.running(), 0);
        assert_eq!(seen.started.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn the_drain_aborts_the_sessions_still_running_and_they_end_as_aborted() {
        let (g, seen) = gate(10, 10, 10);
        let s = Arc::new(
            g.open_session("iperf3", addr("10.0.0.1:1"), "iperf3")
                .unwrap(),
        );
        let told = Arc::new(Mutex::new(Vec::<String>::new()));
        {
            // The abort ends the session the way a front end's would: its
            // own thread sees the socket shut and returns.
            let told = Arc::clone(&told);
            let held = Arc::clone(&s);
            let slot = Arc::new(Mutex::new(Some(held)));
            s.on_abort(move |reason| {
                lock(&told).push(reason.to_string());
                drop(lock(&slot).take());
            });
        }
        drop(s);
        g.shutdown.trigger();
        g.drain();
        assert!(g.drained.load(Ordering::Acquire));
        assert_eq!(*lock(&told), [SHUTTING_DOWN]);
        assert_eq!(g.running(), 0);
        assert_eq!(*lock(&seen.ended), [("iperf3", Outcome::Aborted)]);
    }

    #[test]
    fn handshake_slots_are_per_port_in_all_and_per_source() {
        let port = Arc::new(Port::new("iperf3", "iperf3", PortCaps::new(3, 2)));
        let other = Arc::new(Port::new("metrics", "metrics", PortCaps::new(3, 2)));
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let a = HandshakeSlot::take(&port, ip("10.0.0.1")).unwrap();
        let mut b = HandshakeSlot::take(&port, ip("10.0.0.1")).unwrap();
        assert!(
            HandshakeSlot::take(&port, ip("10.0.0.1")).is_none(),
            "per source"
        );
        // IPv6 counts by /64.
        let c = HandshakeSlot::take(&port, ip("2001:db8::1")).unwrap();
        assert!(
            HandshakeSlot::take(&port, ip("10.0.0.9")).is_none(),
            "in all"
        );
        assert!(
            HandshakeSlot::take(&other, ip("10.0.0.1")).is_some(),
            "another port has its own"
        );
        b.release();
        b.release();
        assert_eq!(port.handshaking(), 2, "a release counts once");
        let d = HandshakeSlot::take(&port, ip("2001:db8::2")).unwrap();
        assert!(HandshakeSlot::take(&port, ip("2001:db8::3")).is_none());
        drop((a, b, c, d));
        assert_eq!(port.handshaking(), 0);
        assert!(lock(&port.sources).is_empty());
    }

    #[test]
    fn log_lines_are_escaped_whatever_the_front_end_quoted() {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        let caps = GateCaps {
            max_sessions: 1,
            sessions_per_source: 1,
            max_streams: 1,
            preauth_timeout: Duration::from_secs(1),
            drain_timeout: Duration::from_secs(1),
        };
        let g = Gate::new(
            caps,
            Shutdown::default(),
            Arc::new(move |l: &str| lock(&sink).push(l.to_string())),
            Arc::new(crate::observe::NoObserver),
        );
        g.log("iperf3: client \u{1b}[31mevil\nforged line");
        assert_eq!(
            *lock(&lines),
            ["iperf3: client \\x1b[31mevil\\x0aforged line"]
        );
    }
}
