//! The client side of a session: connect, authenticate, open a service,
//! and dial data connections that carry the session's cookie.
//!
//! [`connect`] drives the sans-IO [`ClientConn`] over a blocking socket
//! until the server accepts (or refuses) the service; what comes back is a
//! [`ClientSession`] with the same [`Control`] channel the server's service
//! sees, and [`ClientSession::open_data_with`] to dial data streams whose
//! socket options (buffers, MSS, congestion control) are set *before*
//! connecting, when they matter for window scaling.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fatpipe_proto::{ClientConfig, ClientConn, ClientEvent, ConnError, Cookie, Key, Message};
use fatpipe_secure::tls::ClientTls;
use fatpipe_secure::{Encryption, Stream};
use socket2::{Domain, Protocol, Socket, Type};

use crate::control::{is_timeout, Control};
use crate::error::{EngineError, Result};
use crate::server::random_bytes;

/// How to reach and authenticate to a server.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Pre-shared key (`--key-file`).
    pub key: Option<Key>,
    /// Limit for the TCP connect of control and data connections.
    pub connect_timeout: Duration,
    /// Limit for the handshake after connecting (and for a data hello).
    pub handshake_timeout: Duration,
    /// Encrypt every connection of the session with TLS 1.3 keyed by
    /// `key` (`--encrypt`; needs the key).
    pub encrypt: bool,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            key: None,
            connect_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            encrypt: false,
        }
    }
}

/// An established session on the client side.
#[derive(Debug)]
pub struct ClientSession {
    control: Control,
    pub(crate) cookie: Cookie,
    pub(crate) peer: SocketAddr,
    local: SocketAddr,
    pub(crate) options: ClientOptions,
    pub(crate) tls: Option<ClientTls>,
    /// How long the control connection's TCP connect took: a round trip,
    /// which times the redials of a data connection's connect.
    pub(crate) connect_rtt: Duration,
    /// Hands early data connections to the session's one attach watcher
    /// ([`ClientSession::open_data_early`]); started on first use.
    attach: std::sync::Mutex<Option<mpsc::Sender<Early>>>,
}

/// Connects to `addr`, authenticates with `key` and opens `service`.
pub fn connect(
    addr: SocketAddr,
    key: Option<&Key>,
    service: &str,
    params: &[u8],
) -> Result<ClientSession> {
    let options = ClientOptions {
        key: key.cloned(),
        ..ClientOptions::default()
    };
    connect_with(addr, &options, service, params)
}

/// [`connect`] with every option.
pub fn connect_with(
    addr: SocketAddr,
    options: &ClientOptions,
    service: &str,
    params: &[u8],
) -> Result<ClientSession> {
    let tls = client_tls(options)?;
    let dialled = Instant::now();
    let limit = options.connect_timeout;
    let tcp = race(addr, SESSION_REDIAL, limit)
        .map_err(|e| EngineError::io(format!("connect to {addr}"), e))?;
    let connect_rtt = dialled.elapsed();
    let _ = tcp.set_nodelay(true);
    let mut stream = secure(tcp, tls.as_ref(), options.handshake_timeout)?;
    let _ = stream.set_write_timeout(Some(options.handshake_timeout));
    let local = stream
        .local_addr()
        .map_err(|e| EngineError::io("read local address", e))?;
    let config = ClientConfig {
        key: options.key.clone(),
        service: service.to_string(),
        params: params.to_vec(),
        handshake_timeout: options.handshake_timeout,
    };
    let mut conn = ClientConn::new(config, Instant::now(), random_bytes());
    let mut buf = [0u8; 4096];
    loop {
        while let Some(bytes) = conn.poll_transmit() {
            stream
                .write_all(&bytes)
                .map_err(|e| EngineError::io("write handshake", e))?;
        }
        while let Some(ev) = conn.poll_event() {
            match ev {
                ClientEvent::Established { cookie, .. } => {
                    let _ = stream.set_read_timeout(None);
                    let _ = stream.set_write_timeout(None);
                    // Messages that arrived with the Accept are the service's.
                    let mut early = Vec::new();
                    while let Some(ev) = conn.poll_event() {
                        match ev {
                            ClientEvent::Payload(p) => early.push(Ok(p)),
                            ClientEvent::Closed(e) => early.push(Err(e)),
                            ClientEvent::Established { .. } => {}
                        }
                    }
                    let control = Control::new(stream, &conn.take_buffered(), early)?;
                    return Ok(ClientSession {
                        control,
                        cookie,
                        peer: addr,
                        local,
                        options: options.clone(),
                        tls,
                        connect_rtt,
                        attach: std::sync::Mutex::new(None),
                    });
                }
                ClientEvent::Closed(err) => {
                    while let Some(bytes) = conn.poll_transmit() {
                        let _ = stream.write_all(&bytes);
                    }
                    return Err(err.into());
                }
                ClientEvent::Payload(_) => {}
            }
        }
        let now = Instant::now();
        let wait = match conn.poll_timeout() {
            Some(d) if d <= now => {
                conn.handle_timeout(now);
                continue;
            }
            Some(d) => d - now,
            None => options.handshake_timeout,
        };
        stream
            .set_read_timeout(Some(wait))
            .map_err(|e| EngineError::io("set read timeout", e))?;
        match stream.read(&mut buf) {
            Ok(0) => conn.handle_eof(Instant::now()),
            Ok(n) => conn.handle_input(Instant::now(), &buf[..n]),
            Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {
                conn.handle_timeout(Instant::now())
            }
            Err(e) => return Err(EngineError::io(format!("read from {addr}"), e)),
        }
    }
}

impl ClientSession {
    /// The control channel.
    pub fn control(&self) -> &Control {
        &self.control
    }

    /// The server's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// This end's address on the control connection.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// What encrypts the session's connections (`--encrypt`), if anything.
    pub fn encryption(&self) -> Option<&Encryption> {
        self.control.encryption()
    }

    /// The session's cookie (services that carry it elsewhere, e.g. in UDP
    /// hellos, need it).
    pub fn cookie(&self) -> &Cookie {
        &self.cookie
    }

    /// Dials a data connection labelled `tag` (a slow connect is dialled
    /// again, see `connect_racing`). Returns once the server has attached
    /// it to this session.
    pub fn open_data(&self, tag: u32) -> Result<Stream> {
        attached(self.hello_data(self.connect_racing()?, tag)?)
    }

    /// Dials a data connection labelled `tag`, letting `configure` set
    /// socket options before the connect. Returns once the server has
    /// attached it to this session.
    pub fn open_data_with(
        &self,
        tag: u32,
        configure: impl FnOnce(&Socket) -> io::Result<()>,
    ) -> Result<Stream> {
        attached(self.dial_data(tag, configure)?)
    }

    /// Dials data connection `tag`, sends `first` right behind its hello
    /// (the service's own greeting, a round trip before it could follow
    /// the acknowledgement), and returns once the server has attached it.
    /// For a server that reads the data hello without reading past it, as
    /// [`open_data_early`](Self::open_data_early).
    pub fn open_data_then(&self, tag: u32, first: &[u8]) -> Result<Stream> {
        let mut stream = self.hello_data(self.connect_racing()?, tag)?;
        // Without it Nagle holds a small `first` back until the hello is
        // acknowledged, the round trip this saves.
        let _ = stream.set_nodelay(true);
        stream
            .write_all(first)
            .map_err(|e| EngineError::io("send after the data hello", e))?;
        let _ = stream.set_nodelay(false);
        attached(stream)
    }

    /// Dials data connection `tag` and returns as soon as its hello is
    /// sent, a round trip before [`open_data`](Self::open_data) would: what
    /// the caller writes next travels right behind the hello. For a
    /// connection this end only writes to, on a server that reads the data
    /// hello without reading past it (this crate's [`Server`](crate::Server)
    /// since the copy protocol's version 3; older ones refuse data that
    /// comes before their acknowledgement).
    ///
    /// The session's one attach watcher (a thread, started with the first
    /// early connection and kept until the session is dropped) reads the
    /// server's reply. If it is anything but the acknowledgement, or does
    /// not come within the handshake timeout, the watcher shuts the
    /// connection down, so the caller's next write fails rather than
    /// sending into a connection nobody reads. (A thread per connection
    /// put 256 threads in a `copy -P 256` client while it dialled.)
    pub fn open_data_early(&self, tag: u32) -> Result<Stream> {
        let stream = self.hello_data(self.connect_racing()?, tag)?;
        let _ = stream.set_write_timeout(None);
        let reader = stream
            .try_clone()
            .map_err(|e| EngineError::io("clone data socket", e))?;
        let deadline = Instant::now() + self.options.handshake_timeout;
        self.watch_attach(Early {
            stream: reader,
            deadline,
        })?;
        Ok(stream)
    }

    /// Hands `early` to the session's attach watcher, starting it if it
    /// is not running.
    pub(crate) fn watch_attach(&self, early: Early) -> Result<()> {
        let mut tx = self.attach.lock().unwrap_or_else(|p| p.into_inner());
        let early = match tx.as_ref() {
            Some(t) => match t.send(early) {
                Ok(()) => return Ok(()),
                // Its thread ended (it panicked): start another.
                Err(mpsc::SendError(e)) => e,
            },
            None => early,
        };
        let (t, rx) = mpsc::channel();
        let _ = t.send(early);
        std::thread::Builder::new()
            .name("data attach".into())
            .stack_size(256 * 1024)
            .spawn(move || watch_attaches(rx))
            .map_err(|e| EngineError::io("start the data attach watcher", e))?;
        *tx = Some(t);
        Ok(())
    }

    /// Connects data connection `tag` and sends its hello; the read and
    /// write timeouts are left at the handshake timeout.
    fn dial_data(
        &self,
        tag: u32,
        configure: impl FnOnce(&Socket) -> io::Result<()>,
    ) -> Result<Stream> {
        let socket = Socket::new(
            Domain::for_address(self.peer),
            Type::STREAM,
            Some(Protocol::TCP),
        )
        .map_err(|e| EngineError::io("create data socket", e))?;
        configure(&socket).map_err(|e| EngineError::io("configure data socket", e))?;
        socket
            .connect_timeout(&self.peer.into(), self.options.connect_timeout)
            .map_err(|e| EngineError::io(format!("connect data stream to {}", self.peer), e))?;
        self.hello_data(socket.into(), tag)
    }

    /// A TCP connection to the server, dialled again when the connect
    /// takes longer than it should ([`redial_after`]): the first connect
    /// that completes wins, the others are closed before any byte is sent
    /// on them (the server drops a connection that never says hello).
    ///
    /// A lost SYN or SYN-ACK costs Linux's initial retransmission timeout,
    /// a whole second, and a copy's data waits for every stream's connect:
    /// on a 228 ms lab path with 1 % loss the first byte of a 32-stream
    /// copy came 1–3 s late. A second dial after two round trips costs the
    /// server at most a half-open connection.
    fn connect_racing(&self) -> Result<TcpStream> {
        let (peer, limit) = (self.peer, self.options.connect_timeout);
        race(peer, redial_after(self.connect_rtt), limit)
            .map_err(|e| EngineError::io(format!("connect data stream to {peer}"), e))
    }

    /// Sends data connection `tag`'s hello on `tcp` (through TLS when the
    /// session is encrypted); the read and write timeouts are left at the
    /// handshake timeout.
    fn hello_data(&self, tcp: TcpStream, tag: u32) -> Result<Stream> {
        let mut stream = secure(tcp, self.tls.as_ref(), self.options.handshake_timeout)?;
        let hello = self.data_hello(tag)?;
        let t = Some(self.options.handshake_timeout);
        let _ = stream.set_read_timeout(t);
        let _ = stream.set_write_timeout(t);
        stream
            .write_all(&hello)
            .map_err(|e| EngineError::io("send data hello", e))?;
        Ok(stream)
    }
}

/// An early data connection whose acknowledgement is awaited.
#[derive(Debug)]
pub(crate) struct Early {
    /// A clone of the caller's stream.
    pub(crate) stream: Stream,
    pub(crate) deadline: Instant,
}

/// Longest the attach watcher waits before looking for new connections
/// on its channel.
const WATCH_SLICE: Duration = Duration::from_millis(20);

/// The attach watcher: waits (one epoll set) until each early connection
/// is readable, reads the server's answer to its hello, shuts the
/// connection down on a refusal or at its deadline. Ends once the session
/// is dropped and nothing is left to watch.
fn watch_attaches(rx: mpsc::Receiver<Early>) {
    use mio::unix::SourceFd;
    use mio::{Events, Interest, Poll, Token};
    use std::os::fd::AsRawFd;

    let Ok(mut poll) = Poll::new() else {
        // No epoll: read each in turn (as a thread of its own would).
        for e in rx {
            settle(&e);
        }
        return;
    };
    let mut events = Events::with_capacity(256);
    let mut pending: std::collections::HashMap<usize, Early> = Default::default();
    let mut next = 0usize;
    let mut open = true;
    loop {
        let mut add = |e: Early, pending: &mut std::collections::HashMap<usize, Early>| {
            next = next.wrapping_add(1);
            let fd = e.stream.tcp().as_raw_fd();
            if poll
                .registry()
                .register(&mut SourceFd(&fd), Token(next), Interest::READABLE)
                .is_err()
            {
                settle(&e);
                return;
            }
            pending.insert(next, e);
        };
        if pending.is_empty() {
            if !open {
                return;
            }
            match rx.recv() {
                Ok(e) => add(e, &mut pending),
                Err(_) => return,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(e) => add(e, &mut pending),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        let now = Instant::now();
        let soonest = pending.values().map(|e| e.deadline).min().unwrap_or(now);
        let wait = soonest.saturating_duration_since(now).min(WATCH_SLICE);
        if poll.poll(&mut events, Some(wait)).is_err() {
            events.clear();
        }
        let readable: Vec<usize> = events.iter().map(|ev| ev.token().0).collect();
        let now = Instant::now();
        let late: Vec<usize> = pending
            .iter()
            .filter(|(k, e)| e.deadline <= now && !readable.contains(k))
            .map(|(k, _)| *k)
            .collect();
        for (k, answered) in readable
            .into_iter()
            .map(|k| (k, true))
            .chain(late.into_iter().map(|k| (k, false)))
        {
            if let Some(e) = pending.remove(&k) {
                // Out of the epoll set before the clone closes: the
                // caller's descriptor keeps the socket open, and epoll
                // would go on reporting it.
                let fd = e.stream.tcp().as_raw_fd();
                let _ = poll.registry().deregister(&mut SourceFd(&fd));
                if answered {
                    settle(&e);
                } else {
                    // No answer in time: never a read that could block
                    // the other connections' watch.
                    let _ = e.stream.shutdown(std::net::Shutdown::Both);
                }
            }
        }
    }
}

/// Reads the answer to `e`'s hello (it is readable): on anything but the
/// acknowledgement the connection is shut. The answer is one small frame
/// (one record with `--encrypt`), so a readable socket holds all of it;
/// a read that still waits is bounded by the deadline (a non-blocking
/// socket) or the handshake timeout left on a blocking one.
fn settle(e: &Early) {
    // The caller may have made the socket non-blocking (the data plane's
    // runner does): wait for the rest of a frame rather than count on a
    // blocking read.
    let mut patient = Patient {
        stream: &e.stream,
        deadline: e.deadline,
    };
    if read_data_ack(&mut patient).is_err() {
        let _ = e.stream.shutdown(std::net::Shutdown::Both);
    } else {
        let _ = e.stream.set_read_timeout(None);
    }
}

/// Waits for the server's acknowledgement of a data hello on `stream`,
/// then clears the handshake timeouts.
fn attached(mut stream: Stream) -> Result<Stream> {
    read_data_ack(&mut stream)?;
    let _ = stream.set_read_timeout(None);
    let _ = stream.set_write_timeout(None);
    Ok(stream)
}

/// When a session's connect is dialled again if it has not completed (a
/// third dial follows twice as long after the second; see [`race`]).
///
/// A lost SYN or SYN-ACK costs Linux's initial retransmission timeout, a
/// whole second, and a second loss three: on a 228 ms path with 1 % loss a
/// copy's control connection once took 4.8 s instead of 1.1. The round
/// trip is not known before the first connect, so this is a fixed time
/// above the round trips of research paths (up to about 300 ms); on a
/// longer path (a satellite hop) every connect dials twice, which costs
/// the server a connection that closes before its hello.
const SESSION_REDIAL: Duration = Duration::from_millis(500);

/// Connect attempts a connection may race (see `connect_racing`).
pub(crate) const MAX_DIALS: u32 = 3;

/// Connects to `peer`: attempt n = 1, 2, … is a non-blocking connect
/// started [`redial_wait`] after the one before while none has completed
/// (at most [`MAX_DIALS`]), all waited on together (one epoll set, on the
/// calling thread: a dial was a thread of its own, up to 3 for each of a
/// copy's 32 dialers); the first to connect wins and the others are
/// closed. A failed attempt is followed by the next at once. The last
/// error when all failed, or `TimedOut` after `limit`. The stream
/// returned is blocking.
fn race(peer: SocketAddr, redial: Duration, limit: Duration) -> io::Result<TcpStream> {
    use mio::{Events, Interest, Poll, Token};

    let deadline = Instant::now() + limit;
    let mut poll = Poll::new()?;
    let mut events = Events::with_capacity(MAX_DIALS as usize);
    let mut dials: Vec<Option<mio::net::TcpStream>> = Vec::new();
    let mut last_err = None;
    let mut next_at = Instant::now();
    loop {
        let now = Instant::now();
        if dials.len() < MAX_DIALS as usize && now >= next_at {
            let attempt = dials.len() as u32 + 1;
            // A non-blocking connect, under way.
            let started = mio::net::TcpStream::connect(peer).and_then(|mut s| {
                poll.registry()
                    .register(&mut s, Token(dials.len()), Interest::WRITABLE)
                    .map(|()| s)
            });
            match started {
                Ok(s) => dials.push(Some(s)),
                Err(e) => {
                    last_err = Some(e);
                    dials.push(None);
                }
            }
            next_at = now + redial_wait(attempt, redial);
        }
        let running = dials.iter().flatten().count();
        if running == 0 {
            if dials.len() >= MAX_DIALS as usize {
                break;
            }
            // Every attempt so far failed: the next goes at once.
            next_at = now;
            continue;
        }
        if now >= deadline {
            break;
        }
        let until = if dials.len() < MAX_DIALS as usize {
            next_at.min(deadline)
        } else {
            deadline
        };
        if let Err(e) = poll.poll(&mut events, Some(until.saturating_duration_since(now))) {
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
            continue;
        }
        for ev in events.iter() {
            let Some(slot) = dials.get_mut(ev.token().0) else {
                continue;
            };
            let Some(s) = slot.as_mut() else { continue };
            match s.take_error() {
                Ok(None) => {}
                Ok(Some(e)) | Err(e) => {
                    let _ = poll.registry().deregister(s);
                    *slot = None;
                    last_err = Some(e);
                    if dials.len() < MAX_DIALS as usize {
                        next_at = Instant::now();
                    }
                    continue;
                }
            }
            // Writable and no error: connected (a spurious wake-up reads
            // as not connected yet).
            if s.peer_addr().is_err() {
                continue;
            }
            let Some(mut s) = slot.take() else { continue };
            let _ = poll.registry().deregister(&mut s);
            let s = TcpStream::from(std::os::fd::OwnedFd::from(s));
            s.set_nonblocking(false)?;
            return Ok(s);
        }
    }
    Err(last_err.unwrap_or_else(|| io::Error::from(io::ErrorKind::TimedOut)))
}

/// How long after attempt `attempt` (1, 2, …) the next is dialled when
/// none has completed: `redial × attempt` (so the third follows twice as
/// long after the second).
pub(crate) fn redial_wait(attempt: u32, redial: Duration) -> Duration {
    redial.saturating_mul(attempt)
}

/// When a data connection's connect is dialled again: two round trips of
/// the control connection's connect, and 100 ms for a busy host.
pub(crate) fn redial_after(rtt: Duration) -> Duration {
    rtt.saturating_mul(2)
        .saturating_add(Duration::from_millis(100))
}

/// Reads the server's one-frame answer to a data hello: `DataAck`, or the
/// reason it refused. Reads exactly that frame: what follows belongs to the
/// service.
/// Reads `stream` whether or not its socket is non-blocking: a read that
/// would block waits for the socket to be readable, until `deadline`
/// (then a time-out, as a blocking read's time-out would be).
struct Patient<'a> {
    stream: &'a Stream,
    deadline: std::time::Instant,
}

impl Read for Patient<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match (&*self.stream).read(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let left = self
                        .deadline
                        .saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return Err(io::ErrorKind::TimedOut.into());
                    }
                    fatpipe_sys::poll::wait_readable(&[self.stream.tcp()], left)?;
                }
                r => return r,
            }
        }
    }
}

fn read_data_ack(stream: &mut impl Read) -> Result<()> {
    let mut header = [0u8; 4];
    read_exact(stream, &mut header)?;
    let len = u32::from_be_bytes(header) as usize;
    if len == 0 || len > fatpipe_proto::MAX_FRAME {
        return Err(fatpipe_proto::DecodeError::TooLarge {
            len,
            max: fatpipe_proto::MAX_FRAME,
        }
        .into());
    }
    let mut body = vec![0u8; len];
    read_exact(stream, &mut body)?;
    ack_of(&body)
}

/// The server's answer to a data hello (a frame's body): `Ok` for
/// `DataAck`, the refusal or the decoding error otherwise.
pub(crate) fn ack_of(body: &[u8]) -> Result<()> {
    match Message::decode(body)? {
        Message::DataAck => Ok(()),
        Message::Reject { code, reason } => Err(ConnError::Rejected { code, reason }.into()),
        _ => Err(ConnError::Unexpected {
            got: "a message other than DataAck",
            state: "attaching a data connection",
        }
        .into()),
    }
}

fn read_exact(stream: &mut impl Read, buf: &mut [u8]) -> Result<()> {
    stream.read_exact(buf).map_err(|e| {
        if is_timeout(&e) {
            EngineError::Timeout("waiting for the data connection to be attached".into())
        } else if e.kind() == io::ErrorKind::UnexpectedEof {
            EngineError::Conn(ConnError::Eof)
        } else {
            EngineError::io("read data hello reply", e)
        }
    })
}

/// The TLS setup `options` ask for: none, or one keyed by the PSK (an
/// error if `--encrypt` came without a key).
fn client_tls(options: &ClientOptions) -> Result<Option<ClientTls>> {
    if !options.encrypt {
        return Ok(None);
    }
    let Some(key) = &options.key else {
        return Err(EngineError::EncryptWithoutKey);
    };
    // A one-time ticket's session: the identity derived from the ticket,
    // named in the ClientHello (docs/protocol.md, "Tickets").
    Ok(Some(match key.ticket_id() {
        Some(id) => ClientTls::ticket(id, key.as_bytes())?,
        None => ClientTls::new(key.as_bytes())?,
    }))
}

/// A connected socket as a [`Stream`]: through the TLS handshake if `tls`.
fn secure(tcp: TcpStream, tls: Option<&ClientTls>, timeout: Duration) -> Result<Stream> {
    match tls {
        None => Ok(Stream::plain_tcp(tcp)),
        Some(tls) => Ok(fatpipe_secure::client_handshake(tls, tcp, timeout)?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_prompt_connect_is_dialled_once() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = l.local_addr().unwrap();
        let s = race(peer, 50 * MS, Duration::from_secs(10)).unwrap();
        assert_eq!(s.peer_addr().unwrap(), peer);
        // Blocking, as a connected std stream is.
        s.set_read_timeout(Some(MS)).unwrap();
        let mut b = [0u8; 1];
        let e = (&s).read(&mut b).unwrap_err();
        assert!(is_timeout(&e), "{e}");
        // Long past the redial time: still the one connection.
        std::thread::sleep(200 * MS);
        l.set_nonblocking(true).unwrap();
        let accepted = std::iter::from_fn(|| l.accept().ok()).count();
        assert_eq!(accepted, 1);
    }

    #[test]
    fn a_connect_whose_syn_is_dropped_is_won_by_a_redial() {
        // A listener whose accept queue is full drops a SYN: the kernel
        // sends it again a second later. A redial after 50 ms that finds
        // room (the queue is emptied at 100 ms) connects long before.
        let l = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        l.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        l.listen(0).unwrap();
        let l: std::net::TcpListener = l.into();
        let peer = l.local_addr().unwrap();
        // Fill the queue (connected, never accepted yet).
        let mut fill = Vec::new();
        while fill.len() < 8 {
            let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
            if s.connect_timeout(&peer.into(), 200 * MS).is_err() {
                break;
            }
            fill.push(s);
        }
        assert!(!fill.is_empty() && fill.len() < 8, "{} filled", fill.len());
        let emptier = std::thread::spawn(move || {
            std::thread::sleep(100 * MS);
            l.set_nonblocking(true).unwrap();
            let n = std::iter::from_fn(|| l.accept().ok()).count();
            (l, n)
        });
        let t0 = Instant::now();
        let got = race(peer, 50 * MS, Duration::from_secs(10));
        let took = t0.elapsed();
        let _ = emptier.join();
        assert!(got.is_ok(), "{got:?}");
        assert!(took < 800 * MS, "connected after {took:?}");
    }

    #[test]
    fn refused_connects_give_up_after_three_with_the_error() {
        let peer = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let t0 = Instant::now();
        let got = race(peer, 500 * MS, Duration::from_secs(10));
        assert_eq!(got.unwrap_err().kind(), io::ErrorKind::ConnectionRefused);
        // A refusal is followed by the next dial at once, not a redial wait.
        assert!(t0.elapsed() < 400 * MS, "{:?}", t0.elapsed());
    }

    #[test]
    fn the_redials_follow_at_one_then_two_redial_times() {
        // Attempt 2 after `redial`, attempt 3 twice as long after it.
        assert_eq!(redial_wait(1, 50 * MS), 50 * MS);
        assert_eq!(redial_wait(2, 50 * MS), 100 * MS);
        assert_eq!(redial_wait(3, Duration::MAX), Duration::MAX);
    }

    #[test]
    fn redials_wait_two_round_trips_and_a_margin() {
        assert_eq!(redial_after(228 * MS), 556 * MS);
        assert_eq!(redial_after(Duration::ZERO), 100 * MS);
        assert_eq!(redial_after(Duration::MAX), Duration::MAX);
    }
}
