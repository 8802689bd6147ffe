//! Many data connections set up at once on one thread (issue 34).
//!
//! Each data connection costs round trips before it carries data: the TCP
//! connect (dialled again when slow, see [`Racing`]), the TLS handshake
//! with `--encrypt`, the data hello and, where the caller waits for it,
//! the server's acknowledgement. A blocking set-up needs a thread per
//! connection in flight to overlap them (a `copy -P 256` client ran 32
//! dialer threads, `test -P 1024` 64). [`ClientSession::open_data_many`]
//! drives every connection in flight as a state machine on one mio poll
//! on the calling thread: non-blocking connects (socket options applied
//! before connecting), [`Handshake`], the hello written and the
//! acknowledgement read as the socket allows, each step with the time
//! limit and the error of its blocking twin in `client.rs`.
//!
//! The decisions are sans-IO and tested on a virtual clock: [`Racing`]
//! (when a connect is dialled again and when it gives up) and
//! [`AckReader`] (the server's one-frame answer, read piecewise).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use fatpipe_proto::{ConnError, Message, VERSION};
use fatpipe_secure::{Handshake, Stream, TlsError, Want};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use socket2::{Domain, Protocol, Socket, Type};

use crate::client::{redial_after, redial_wait, ClientSession, Early, MAX_DIALS};
use crate::error::{EngineError, Result};

/// What follows a data connection's hello.
#[derive(Debug, Clone, Copy)]
pub enum Attach<'a> {
    /// Wait for the server's acknowledgement, as
    /// [`ClientSession::open_data`] does.
    Acked,
    /// Send these bytes right behind the hello, then wait for the
    /// acknowledgement, as [`ClientSession::open_data_then`] does.
    Then(&'a [u8]),
    /// Hand the connection over once its hello is sent; the session's
    /// attach watcher reads the answer, as with
    /// [`ClientSession::open_data_early`].
    Early,
}

/// Sets a data socket's options before its connect (called again for a
/// redial of the same tag).
pub type Configure<'a> = dyn Fn(u32, &Socket) -> io::Result<()> + Sync + 'a;

/// A batch of data connections to set up ([`ClientSession::open_data_many`]).
pub struct DataDial<'a> {
    /// The connections' tags, dialled in this order.
    pub tags: &'a [u32],
    /// What follows each hello.
    pub attach: Attach<'a>,
    /// Socket options set before each connect.
    pub configure: Option<&'a Configure<'a>>,
    /// Most connections being set up at once (at least 1).
    pub at_once: usize,
}

impl ClientSession {
    /// Sets up the data connections `dial.tags`, up to `dial.at_once` at a
    /// time, all on the calling thread; each is handed to `ready` with its
    /// tag as soon as it is ready (or failed), in the order they get
    /// there. Every tag is answered exactly once. Each connection behaves
    /// as one of [`open_data`](Self::open_data),
    /// [`open_data_then`](Self::open_data_then) or
    /// [`open_data_early`](Self::open_data_early) would (with
    /// `configure`, as [`open_data_with`](Self::open_data_with)), with
    /// the same time limits and errors, and a slow connect is dialled
    /// again as theirs are.
    pub fn open_data_many(&self, dial: &DataDial<'_>, ready: &mut dyn FnMut(u32, Result<Stream>)) {
        let mut driver = match Driver::new(self, dial) {
            Ok(d) => d,
            Err(e) => {
                for &tag in dial.tags {
                    ready(
                        tag,
                        Err(EngineError::io("start the data dialer", clone_err(&e))),
                    );
                }
                return;
            }
        };
        driver.run(ready);
    }

    /// The data hello of connection `tag`.
    pub(crate) fn data_hello(&self, tag: u32) -> Result<Vec<u8>> {
        let mut hello = Vec::new();
        Message::DataHello {
            version: VERSION,
            cookie: self.cookie,
            tag,
        }
        .encode(&mut hello)?;
        Ok(hello)
    }
}

fn clone_err(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}

/// When a racing connect starts its next attempt and when it gives up:
/// attempt n + 1 starts [`redial_wait`]`(n)` after attempt n while none
/// has completed, at once after a failure, at most [`MAX_DIALS`] in all;
/// over when every attempt failed or at the connect time limit. (The
/// blocking `race` in `client.rs` follows the same rule.)
#[derive(Debug, Clone)]
pub(crate) struct Racing {
    started: u32,
    running: u32,
    next_at: Instant,
    deadline: Instant,
    redial: Duration,
}

impl Racing {
    pub(crate) fn new(now: Instant, redial: Duration, limit: Duration) -> Racing {
        Racing {
            started: 0,
            running: 0,
            next_at: now,
            deadline: now + limit,
            redial,
        }
    }

    /// True if an attempt should start now.
    pub(crate) fn start_due(&self, now: Instant) -> bool {
        self.started < MAX_DIALS && now >= self.next_at && now < self.deadline
    }

    /// An attempt started (its connect is under way).
    pub(crate) fn started(&mut self, now: Instant) {
        self.started += 1;
        self.running += 1;
        self.next_at = now + redial_wait(self.started, self.redial);
    }

    /// An attempt could not even start: the next goes at once.
    pub(crate) fn start_failed(&mut self, now: Instant) {
        self.started += 1;
        self.next_at = now;
    }

    /// A running attempt failed: the next goes at once.
    pub(crate) fn failed(&mut self, now: Instant) {
        self.running = self.running.saturating_sub(1);
        self.next_at = now;
    }

    /// True once nothing can connect any more: every attempt failed, or
    /// the time limit passed.
    pub(crate) fn gave_up(&self, now: Instant) -> bool {
        (self.running == 0 && self.started >= MAX_DIALS) || now >= self.deadline
    }

    /// When to look again if no socket event comes first.
    pub(crate) fn wake(&self) -> Instant {
        if self.started < MAX_DIALS {
            self.next_at.min(self.deadline)
        } else {
            self.deadline
        }
    }
}

/// Reads the server's one-frame answer to a data hello piecewise, never
/// past it (what follows belongs to the service): ask [`want`](Self::want)
/// bytes, [`feed`](Self::feed) what came.
#[derive(Debug, Default)]
pub(crate) struct AckReader {
    buf: Vec<u8>,
    need: usize,
}

impl AckReader {
    pub(crate) fn new() -> AckReader {
        AckReader {
            buf: Vec::with_capacity(16),
            need: 4,
        }
    }

    /// How many bytes to read next (never past the frame).
    pub(crate) fn want(&self) -> usize {
        self.need - self.buf.len()
    }

    /// Takes bytes read (at most [`want`](Self::want)); the answer once
    /// the frame is whole: `Ok` for `DataAck`, the refusal or the
    /// decoding error otherwise.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Option<Result<()>> {
        let take = bytes.len().min(self.want());
        self.buf.extend_from_slice(&bytes[..take]);
        if self.buf.len() < self.need {
            return None;
        }
        if self.need == 4 {
            let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
            let len = len as usize;
            if len == 0 || len > fatpipe_proto::MAX_FRAME {
                return Some(Err(fatpipe_proto::DecodeError::TooLarge {
                    len,
                    max: fatpipe_proto::MAX_FRAME,
                }
                .into()));
            }
            self.need = 4 + len;
            return None;
        }
        Some(crate::client::ack_of(&self.buf[4..]))
    }
}

/// A token's connection slot and what it names: a connect attempt
/// (0..[`MAX_DIALS`]) or the connected socket ([`SOCKET`]).
const PER_SLOT: usize = MAX_DIALS as usize + 1;
const SOCKET: usize = MAX_DIALS as usize;

/// One data connection being set up.
struct Dialing {
    tag: u32,
    step: Step,
}

enum Step {
    Connecting {
        race: Racing,
        attempts: Vec<Option<mio::net::TcpStream>>,
        last_err: Option<io::Error>,
    },
    Tls {
        tcp: TcpStream,
        hs: Box<Handshake>,
        deadline: Instant,
    },
    Hello {
        stream: Stream,
        /// The hello, then what follows it (`Attach::Then`).
        out: Vec<Vec<u8>>,
        /// `out[part][pos..]` is what is left to write.
        part: usize,
        pos: usize,
        deadline: Instant,
    },
    Ack {
        stream: Stream,
        ack: AckReader,
        deadline: Instant,
    },
}

/// What a step of a connection came to.
enum Outcome {
    /// On to the next step, which starts at once.
    Next(Step),
    /// Waiting in this step for its socket or a timer.
    Wait(Step),
    /// Done: ready, or failed.
    Done(Result<Stream>),
}
use Outcome::{Done, Next, Wait};

struct Driver<'s, 'd> {
    session: &'s ClientSession,
    dial: &'d DataDial<'d>,
    poll: Poll,
    slots: Vec<Option<Dialing>>,
    redial: Duration,
}

impl<'s, 'd> Driver<'s, 'd> {
    fn new(session: &'s ClientSession, dial: &'d DataDial<'d>) -> io::Result<Self> {
        Ok(Driver {
            session,
            dial,
            poll: Poll::new()?,
            slots: Vec::new(),
            redial: redial_after(session.connect_rtt),
        })
    }

    fn run(&mut self, ready: &mut dyn FnMut(u32, Result<Stream>)) {
        let at_once = self.dial.at_once.max(1);
        let mut events = Events::with_capacity(256);
        let mut next = 0;
        let mut active = 0usize;
        loop {
            // Start connections while there is room.
            while active < at_once && next < self.dial.tags.len() {
                let tag = self.dial.tags[next];
                next += 1;
                let now = Instant::now();
                let slot = match self.slots.iter().position(Option::is_none) {
                    Some(i) => i,
                    None => {
                        self.slots.push(None);
                        self.slots.len() - 1
                    }
                };
                let limit = self.session.options.connect_timeout;
                self.slots[slot] = Some(Dialing {
                    tag,
                    step: Step::Connecting {
                        race: Racing::new(now, self.redial, limit),
                        attempts: Vec::new(),
                        last_err: None,
                    },
                });
                active += 1;
                if let Some(r) = self.drive(slot, now) {
                    active -= 1;
                    ready(tag, r);
                }
            }
            if active == 0 {
                return;
            }
            let now = Instant::now();
            let wake = self
                .slots
                .iter()
                .flatten()
                .map(|d| d.step.wake())
                .min()
                .unwrap_or(now);
            let wait = wake.saturating_duration_since(now);
            if let Err(e) = self.poll.poll(&mut events, Some(wait)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    // No way to wait: every connection in flight fails.
                    for slot in 0..self.slots.len() {
                        if let Some(d) = self.slots[slot].take() {
                            self.forget(&d.step);
                            active -= 1;
                            ready(
                                d.tag,
                                Err(EngineError::io("wait for data sockets", clone_err(&e))),
                            );
                        }
                    }
                }
                continue;
            }
            let mut touched: Vec<usize> = events.iter().map(|ev| ev.token().0 / PER_SLOT).collect();
            let now = Instant::now();
            for (i, d) in self.slots.iter().enumerate() {
                if d.as_ref().is_some_and(|d| d.step.wake() <= now) {
                    touched.push(i);
                }
            }
            touched.sort_unstable();
            touched.dedup();
            for slot in touched {
                let Some(tag) = self.slots.get(slot).and_then(|d| d.as_ref()).map(|d| d.tag) else {
                    continue;
                };
                if let Some(r) = self.drive(slot, Instant::now()) {
                    active -= 1;
                    ready(tag, r);
                }
            }
        }
    }

    /// Takes connection `slot` as far as it goes now; its result once it
    /// is done (the slot is then free).
    fn drive(&mut self, slot: usize, now: Instant) -> Option<Result<Stream>> {
        let Dialing { tag, mut step } = self.slots.get_mut(slot)?.take()?;
        loop {
            match self.step(slot, tag, step, now) {
                Next(next) => step = next,
                Wait(same) => {
                    self.slots[slot] = Some(Dialing { tag, step: same });
                    return None;
                }
                Done(r) => return Some(r),
            }
        }
    }

    /// Takes connection `slot` (of `tag`) one step on from `step`. A step
    /// that ends takes its socket out of the poll first.
    fn step(&mut self, slot: usize, tag: u32, step: Step, now: Instant) -> Outcome {
        let timeout = self.session.options.handshake_timeout;
        match step {
            Step::Connecting {
                mut race,
                mut attempts,
                mut last_err,
            } => {
                // A finished attempt: connected, or failed.
                let mut won = None;
                for a in attempts.iter_mut() {
                    let Some(s) = a.as_mut() else { continue };
                    match s.take_error() {
                        Ok(None) => {}
                        Ok(Some(e)) | Err(e) => {
                            let _ = self.poll.registry().deregister(s);
                            *a = None;
                            last_err = Some(e);
                            race.failed(now);
                            continue;
                        }
                    }
                    // Writable and no error: connected (a spurious
                    // wake-up reads as not connected yet).
                    if s.peer_addr().is_ok() {
                        won = a.take();
                        break;
                    }
                }
                if let Some(mut won) = won {
                    for mut other in attempts.into_iter().flatten() {
                        let _ = self.poll.registry().deregister(&mut other);
                    }
                    let _ = self.poll.registry().deregister(&mut won);
                    let tcp = TcpStream::from(std::os::fd::OwnedFd::from(won));
                    return self.connected(slot, tag, tcp, now);
                }
                while race.start_due(now) {
                    match self.attempt(slot, attempts.len(), tag) {
                        Ok(s) => {
                            attempts.push(Some(s));
                            race.started(now);
                        }
                        Err(Fatal(e)) => {
                            self.forget_attempts(&mut attempts);
                            return Done(Err(e));
                        }
                        Err(Failed(e)) => {
                            attempts.push(None);
                            last_err = Some(e);
                            race.start_failed(now);
                        }
                    }
                }
                if race.gave_up(now) {
                    self.forget_attempts(&mut attempts);
                    let e = last_err.unwrap_or_else(|| io::Error::from(io::ErrorKind::TimedOut));
                    let peer = self.session.peer;
                    return Done(Err(EngineError::io(
                        format!("connect data stream to {peer}"),
                        e,
                    )));
                }
                Wait(Step::Connecting {
                    race,
                    attempts,
                    last_err,
                })
            }
            Step::Tls {
                tcp,
                mut hs,
                deadline,
            } => match hs.advance(&tcp) {
                Ok(Want::Done) => match hs.into_stream(tcp) {
                    // The stream keeps the socket (and its registration).
                    Ok(stream) => self.hello(tag, stream, now),
                    Err(e) => Done(Err(e.into())),
                },
                Ok(_) if now >= deadline => {
                    self.deregister(tcp.as_raw_fd());
                    Done(Err(TlsError::Timeout.into()))
                }
                Ok(_) => Wait(Step::Tls { tcp, hs, deadline }),
                Err(e) => {
                    self.deregister(tcp.as_raw_fd());
                    Done(Err(e.into()))
                }
            },
            Step::Hello {
                stream,
                out,
                mut part,
                mut pos,
                deadline,
            } => {
                let fd = stream.tcp().as_raw_fd();
                while part < out.len() {
                    let what = if part == 0 {
                        "send data hello"
                    } else {
                        "send after the data hello"
                    };
                    let buf = &out[part];
                    let r = if pos < buf.len() {
                        (&stream).write(&buf[pos..])
                    } else {
                        (&stream).flush().map(|()| 0)
                    };
                    let e = match r {
                        Ok(0) if pos < buf.len() => io::Error::from(io::ErrorKind::WriteZero),
                        Ok(0) => {
                            part += 1;
                            pos = 0;
                            continue;
                        }
                        Ok(n) => {
                            pos += n;
                            continue;
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock && now < deadline => {
                            return Wait(Step::Hello {
                                stream,
                                out,
                                part,
                                pos,
                                deadline,
                            });
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            io::Error::from(io::ErrorKind::TimedOut)
                        }
                        Err(e) => e,
                    };
                    self.deregister(fd);
                    return Done(Err(EngineError::io(what, e)));
                }
                if matches!(self.dial.attach, Attach::Then(_)) {
                    let _ = stream.set_nodelay(false);
                }
                match self.dial.attach {
                    Attach::Early => {
                        self.deregister(fd);
                        Done(self.early(stream, now))
                    }
                    Attach::Acked | Attach::Then(_) => Next(Step::Ack {
                        stream,
                        ack: AckReader::new(),
                        deadline: now + timeout,
                    }),
                }
            }
            Step::Ack {
                stream,
                mut ack,
                deadline,
            } => {
                let fd = stream.tcp().as_raw_fd();
                let mut buf = [0u8; 64];
                let r = loop {
                    let want = ack.want().min(buf.len());
                    match (&stream).read(&mut buf[..want]) {
                        Ok(0) => break Err(EngineError::Conn(ConnError::Eof)),
                        Ok(n) => {
                            if let Some(r) = ack.feed(&buf[..n]) {
                                break r;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock && now < deadline => {
                            return Wait(Step::Ack {
                                stream,
                                ack,
                                deadline,
                            });
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            break Err(EngineError::Timeout(
                                "waiting for the data connection to be attached".into(),
                            ))
                        }
                        Err(e) => break Err(EngineError::io("read data hello reply", e)),
                    }
                };
                self.deregister(fd);
                Done(r.and_then(|()| {
                    blocking(&stream)?;
                    Ok(stream)
                }))
            }
        }
    }

    /// Starts connect attempt `k` of `slot` for `tag`.
    fn attempt(
        &self,
        slot: usize,
        k: usize,
        tag: u32,
    ) -> std::result::Result<mio::net::TcpStream, AttemptError> {
        let peer = self.session.peer;
        let socket = Socket::new(Domain::for_address(peer), Type::STREAM, Some(Protocol::TCP))
            .map_err(|e| Fatal(EngineError::io("create data socket", e)))?;
        if let Some(configure) = self.dial.configure {
            configure(tag, &socket)
                .map_err(|e| Fatal(EngineError::io("configure data socket", e)))?;
        }
        socket
            .set_nonblocking(true)
            .map_err(|e| Fatal(EngineError::io("set data socket non-blocking", e)))?;
        match socket.connect(&peer.into()) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(Failed(e)),
        }
        let mut s = mio::net::TcpStream::from_std(socket.into());
        self.poll
            .registry()
            .register(&mut s, Token(slot * PER_SLOT + k), Interest::WRITABLE)
            .map_err(Failed)?;
        Ok(s)
    }

    /// The connect of `slot` won with `tcp`: on to TLS or the hello.
    fn connected(&self, slot: usize, tag: u32, tcp: TcpStream, now: Instant) -> Outcome {
        let fd = tcp.as_raw_fd();
        if let Err(e) = self.poll.registry().register(
            &mut SourceFd(&fd),
            Token(slot * PER_SLOT + SOCKET),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            return Done(Err(EngineError::io("watch a data socket", e)));
        }
        if matches!(self.dial.attach, Attach::Then(_)) {
            // Without it Nagle holds a small `first` back until the hello
            // is acknowledged, the round trip it saves.
            let _ = tcp.set_nodelay(true);
        }
        match &self.session.tls {
            None => self.hello(tag, Stream::plain_tcp(tcp), now),
            Some(tls) => match Handshake::client(tls) {
                Ok(hs) => Next(Step::Tls {
                    tcp,
                    hs: Box::new(hs),
                    deadline: now + self.session.options.handshake_timeout,
                }),
                Err(e) => {
                    self.deregister(fd);
                    Done(Err(e.into()))
                }
            },
        }
    }

    /// The hello step of `tag` on `stream`.
    fn hello(&self, tag: u32, stream: Stream, now: Instant) -> Outcome {
        let hello = match self.session.data_hello(tag) {
            Ok(h) => h,
            Err(e) => {
                self.deregister(stream.tcp().as_raw_fd());
                return Done(Err(e));
            }
        };
        let mut out = vec![hello];
        if let Attach::Then(first) = self.dial.attach {
            out.push(first.to_vec());
        }
        Next(Step::Hello {
            stream,
            out,
            part: 0,
            pos: 0,
            deadline: now + self.session.options.handshake_timeout,
        })
    }

    /// Hands an early connection (out of the poll) to the session's
    /// attach watcher.
    fn early(&self, stream: Stream, now: Instant) -> Result<Stream> {
        blocking(&stream)?;
        let _ = stream.set_read_timeout(Some(self.session.options.handshake_timeout));
        let reader = stream
            .try_clone()
            .map_err(|e| EngineError::io("clone data socket", e))?;
        self.session.watch_attach(Early {
            stream: reader,
            deadline: now + self.session.options.handshake_timeout,
        })?;
        Ok(stream)
    }

    fn deregister(&self, fd: std::os::fd::RawFd) {
        let _ = self.poll.registry().deregister(&mut SourceFd(&fd));
    }

    fn forget_attempts(&self, attempts: &mut [Option<mio::net::TcpStream>]) {
        for a in attempts.iter_mut().flatten() {
            let _ = self.poll.registry().deregister(a);
        }
    }

    /// Takes `step`'s sockets out of the poll (before they close).
    fn forget(&self, step: &Step) {
        let fd = match step {
            Step::Connecting { attempts, .. } => {
                for a in attempts.iter().flatten() {
                    self.deregister(a.as_raw_fd());
                }
                return;
            }
            Step::Tls { tcp, .. } => tcp.as_raw_fd(),
            Step::Hello { stream, .. } | Step::Ack { stream, .. } => stream.tcp().as_raw_fd(),
        };
        self.deregister(fd);
    }
}

impl Step {
    /// When this step must be looked at if its socket says nothing.
    fn wake(&self) -> Instant {
        match self {
            Step::Connecting { race, .. } => race.wake(),
            Step::Tls { deadline, .. }
            | Step::Hello { deadline, .. }
            | Step::Ack { deadline, .. } => *deadline,
        }
    }
}

enum AttemptError {
    /// This attempt failed; another may do better.
    Failed(io::Error),
    /// No attempt can work (the socket cannot be made or configured).
    Fatal(EngineError),
}
use AttemptError::{Failed, Fatal};

/// Back to a blocking socket without timeouts, as a blocking set-up
/// leaves it.
fn blocking(stream: &Stream) -> Result<()> {
    stream
        .tcp()
        .set_nonblocking(false)
        .map_err(|e| EngineError::io("set data socket blocking", e))?;
    let _ = stream.set_read_timeout(None);
    let _ = stream.set_write_timeout(None);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn frame(m: &Message) -> Vec<u8> {
        let mut out = Vec::new();
        m.encode(&mut out).unwrap();
        out
    }

    #[test]
    fn a_racing_connect_redials_at_one_then_two_redial_times_and_stops_at_three() {
        let t0 = Instant::now();
        let mut r = Racing::new(t0, 100 * MS, 10_000 * MS);
        assert!(r.start_due(t0));
        r.started(t0);
        assert!(!r.start_due(t0 + 99 * MS));
        assert_eq!(r.wake(), t0 + 100 * MS);
        assert!(r.start_due(t0 + 100 * MS));
        r.started(t0 + 100 * MS);
        // The third twice as long after the second.
        assert_eq!(r.wake(), t0 + 300 * MS);
        assert!(!r.start_due(t0 + 299 * MS));
        r.started(t0 + 300 * MS);
        // No fourth: the deadline is all that is left to wait for.
        assert!(!r.start_due(t0 + 5_000 * MS));
        assert_eq!(r.wake(), t0 + 10_000 * MS);
        assert!(!r.gave_up(t0 + 9_999 * MS));
        assert!(r.gave_up(t0 + 10_000 * MS));
    }

    #[test]
    fn a_failed_attempt_is_followed_at_once_and_three_failures_give_up() {
        let t0 = Instant::now();
        let mut r = Racing::new(t0, 500 * MS, 10_000 * MS);
        r.started(t0);
        r.failed(t0 + 5 * MS);
        assert!(r.start_due(t0 + 5 * MS), "the next goes at once");
        r.start_failed(t0 + 5 * MS);
        assert!(r.start_due(t0 + 5 * MS));
        r.started(t0 + 5 * MS);
        assert!(!r.gave_up(t0 + 6 * MS), "one still running");
        r.failed(t0 + 7 * MS);
        assert!(r.gave_up(t0 + 7 * MS));
        assert!(!r.start_due(t0 + 7 * MS));
    }

    #[test]
    fn nothing_starts_at_or_after_the_connect_limit() {
        let t0 = Instant::now();
        let mut r = Racing::new(t0, 500 * MS, 200 * MS);
        r.started(t0);
        assert_eq!(r.wake(), t0 + 200 * MS);
        assert!(!r.start_due(t0 + 200 * MS));
        assert!(r.gave_up(t0 + 200 * MS));
    }

    #[test]
    fn the_acknowledgement_is_read_piecewise_and_never_past_its_frame() {
        let mut wire = frame(&Message::DataAck);
        wire.extend_from_slice(b"the service's bytes");
        let mut a = AckReader::new();
        let mut at = 0;
        let answer = loop {
            // One byte at a time, as a trickling socket gives them.
            assert!(a.want() >= 1);
            let n = a.want().min(1);
            let got = a.feed(&wire[at..at + n]);
            at += n;
            if let Some(r) = got {
                break r;
            }
        };
        assert!(answer.is_ok(), "{answer:?}");
        assert_eq!(&wire[at..], b"the service's bytes");
    }

    #[test]
    fn a_refusal_an_oversized_frame_and_another_message_are_errors() {
        let refuse = frame(&Message::Reject {
            code: fatpipe_proto::ErrorCode::Busy,
            reason: "too many".into(),
        });
        let mut a = AckReader::new();
        assert!(a.feed(&refuse[..4]).is_none());
        let r = a.feed(&refuse[4..]).unwrap();
        assert!(r.unwrap_err().to_string().contains("too many"));

        let mut a = AckReader::new();
        let huge = (fatpipe_proto::MAX_FRAME as u32 + 1).to_be_bytes();
        assert!(a.feed(&huge).unwrap().is_err());
        let mut a = AckReader::new();
        assert!(a.feed(&[0, 0, 0, 0]).unwrap().is_err(), "an empty frame");

        let mut a = AckReader::new();
        let other = frame(&Message::DataHello {
            version: VERSION,
            cookie: [0; 32],
            tag: 1,
        });
        assert!(a.feed(&other).is_none(), "the header alone is taken");
        let r = a.feed(&other[4..]).unwrap();
        assert!(r.is_err());
    }
}
