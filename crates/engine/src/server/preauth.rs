//! Connections before they are a session or a data connection, driven on
//! a few threads' polls instead of a thread each (issue 34).
//!
//! A client setting up `copy -P 256` or `test -P 1024` opens hundreds of
//! connections within a round trip; a data connection whose hello is not
//! there yet at `accept`, and every encrypted one, had a thread of its own
//! for its first byte, its TLS handshake and its hello: the server's
//! thread peak (40 to 90 on two cores). Here each waits on one of
//! [`LANES`] pre-authentication threads, as a state machine: its first
//! byte (TLS or plain), the non-blocking TLS handshake, then the same
//! sans-IO [`ServerConn`] `handle_conn` runs, under the same pre-auth
//! deadline. A data hello is attached right there (the acknowledgement is
//! one small frame); a control connection that opens a service gets its
//! session's thread then, as it always had one.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::{mpsc, Arc, Weak};
use std::time::Instant;

use fatpipe_proto::{ServerConn, ServerEvent};
use fatpipe_secure::{Handshake, Stream, Want};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};

use super::{
    attach_data, handshake_closed, identity_for, open_session, server_conn, tls_refused, Opened,
    Protocol, CONN_STACK, PROTOCOL,
};
use crate::control::lock;
use crate::front::Conn;
use crate::keyed::Keyed;

/// Pre-authentication threads: one per core, at most this many.
pub(super) const LANES: usize = 4;

/// The poll's token for its waker.
const WAKE: Token = Token(usize::MAX);

/// A lane's handle: new connections go down `tx`, `waker` tells its poll.
pub(super) struct Lane {
    tx: Option<mpsc::Sender<(TcpStream, Conn)>>,
    waker: Arc<Waker>,
}

impl Drop for Lane {
    /// The server is gone: its lane's thread ends once it sees so.
    fn drop(&mut self) {
        drop(self.tx.take());
        let _ = self.waker.wake();
    }
}

/// Hands `tcp` (with its ticket) to a pre-authentication lane, starting
/// it if need be; gives them back if no lane can take them (the caller
/// then runs the connection on a thread of its own).
pub(super) fn hand_over(
    shared: &Protocol,
    tcp: TcpStream,
    ticket: Conn,
) -> Option<(TcpStream, Conn)> {
    let lanes = &shared.preauth;
    if lanes.is_empty() {
        return Some((tcp, ticket));
    }
    let i = shared
        .next_lane
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        % lanes.len();
    let mut lane = lock(&lanes[i]);
    if lane.is_none() {
        *lane = start(shared.me.clone(), i);
    }
    let Some(l) = lane.as_ref() else {
        return Some((tcp, ticket));
    };
    let Some(tx) = l.tx.as_ref() else {
        return Some((tcp, ticket));
    };
    match tx.send((tcp, ticket)) {
        Ok(()) => {
            let _ = l.waker.wake();
            None
        }
        Err(mpsc::SendError(back)) => {
            // Its thread ended (it panicked): a new one next time.
            *lane = None;
            Some(back)
        }
    }
}

fn start(me: Weak<Protocol>, i: usize) -> Option<Lane> {
    let poll = Poll::new().ok()?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKE).ok()?);
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("preauth {i}"))
        .stack_size(CONN_STACK)
        .spawn(move || run(me, poll, rx))
        .ok()?;
    Some(Lane {
        tx: Some(tx),
        waker,
    })
}

/// One connection on a lane.
struct Pending {
    ticket: Conn,
    step: Step,
}

enum Step {
    /// Waiting for the first byte: a TLS handshake or a plain frame.
    First { tcp: TcpStream },
    /// The TLS handshake; its identity is a one-time ticket's (`keyed`)
    /// when the `ClientHello` names one, else the pre-shared key's.
    Tls {
        tcp: TcpStream,
        hs: Box<Handshake>,
        keyed: Option<Keyed>,
    },
    /// The protocol's handshake; `out[sent..]` is still to be written.
    Proto {
        stream: Stream,
        conn: Box<ServerConn>,
        keyed: Option<Keyed>,
        out: Vec<u8>,
        sent: usize,
    },
}

/// What a step came to.
enum Outcome {
    Next(Step),
    Wait(Step),
    /// Over: handed on, or closed (the ticket goes with it).
    Done,
}
use Outcome::{Done, Next, Wait};

/// A lane's thread: drives its connections until the server is gone.
fn run(me: Weak<Protocol>, mut poll: Poll, rx: mpsc::Receiver<(TcpStream, Conn)>) {
    let mut events = Events::with_capacity(256);
    let mut pending: HashMap<usize, Pending> = HashMap::new();
    let mut next = 0usize;
    let mut open = true;
    loop {
        loop {
            match rx.try_recv() {
                Ok((tcp, ticket)) => {
                    next = next.wrapping_add(1) % (usize::MAX - 1);
                    let fd = tcp.as_raw_fd();
                    let watched = tcp.set_nonblocking(true).is_ok()
                        && poll
                            .registry()
                            .register(
                                &mut SourceFd(&fd),
                                Token(next),
                                Interest::READABLE | Interest::WRITABLE,
                            )
                            .is_ok();
                    if !watched {
                        // Closed with its ticket.
                        continue;
                    }
                    pending.insert(
                        next,
                        Pending {
                            ticket,
                            step: Step::First { tcp },
                        },
                    );
                    touch(&me, &poll, &mut pending, next);
                }
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        if !open && pending.is_empty() {
            return;
        }
        let Some(shared) = me.upgrade() else { return };
        let now = Instant::now();
        let wake = pending
            .values()
            .map(|p| wake_at(&shared, p))
            .min()
            .unwrap_or(now + shared.config.preauth_timeout);
        drop(shared);
        let wait = wake.saturating_duration_since(now);
        if let Err(e) = poll.poll(&mut events, Some(wait)) {
            if e.kind() != io::ErrorKind::Interrupted {
                // No way to wait: what is here is closed.
                return;
            }
            continue;
        }
        let mut touched: Vec<usize> = events
            .iter()
            .map(|e| e.token())
            .filter(|&t| t != WAKE)
            .map(|t| t.0)
            .collect();
        if let Some(shared) = me.upgrade() {
            let now = Instant::now();
            touched.extend(
                pending
                    .iter()
                    .filter(|(_, p)| wake_at(&shared, p) <= now)
                    .map(|(k, _)| *k),
            );
        }
        touched.sort_unstable();
        touched.dedup();
        for k in touched {
            touch(&me, &poll, &mut pending, k);
        }
    }
}

/// When connection `p` must be looked at if its socket says nothing.
fn wake_at(shared: &Protocol, p: &Pending) -> Instant {
    let deadline = p.ticket.accepted() + shared.config.preauth_timeout;
    match &p.step {
        Step::First { .. } | Step::Tls { .. } => deadline,
        Step::Proto { conn, .. } => conn.poll_timeout().unwrap_or(deadline),
    }
}

/// Drives connection `k` as far as it goes now.
fn touch(me: &Weak<Protocol>, poll: &Poll, pending: &mut HashMap<usize, Pending>, k: usize) {
    let Some(Pending { ticket, mut step }) = pending.remove(&k) else {
        return;
    };
    let Some(shared) = me.upgrade() else { return };
    let mut ticket = Some(ticket);
    loop {
        let fd = step.fd();
        match advance(&shared, poll, &mut ticket, step, fd) {
            Next(s) => step = s,
            Wait(s) => {
                if let Some(ticket) = ticket {
                    pending.insert(k, Pending { ticket, step: s });
                }
                return;
            }
            Done => return,
        }
    }
}

impl Step {
    fn fd(&self) -> std::os::fd::RawFd {
        match self {
            Step::First { tcp } | Step::Tls { tcp, .. } => tcp.as_raw_fd(),
            Step::Proto { stream, .. } => stream.tcp().as_raw_fd(),
        }
    }
}

/// Takes one step; `ticket` is taken by whatever the connection is handed
/// to. The connection leaves the poll before it is handed on or closed.
fn advance(
    shared: &Protocol,
    poll: &Poll,
    ticket: &mut Option<Conn>,
    step: Step,
    fd: std::os::fd::RawFd,
) -> Outcome {
    let forget = || {
        let _ = poll.registry().deregister(&mut SourceFd(&fd));
    };
    let Some(t) = ticket.as_ref() else {
        forget();
        return Done;
    };
    let (peer, started) = (t.peer(), t.accepted());
    let deadline = started + shared.config.preauth_timeout;
    let now = Instant::now();
    match step {
        Step::First { tcp } => {
            let mut first = [0u8; 1];
            match tcp.peek(&mut first) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => Next(Step::First { tcp }),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && now < deadline => {
                    Wait(Step::First { tcp })
                }
                Ok(1) if fatpipe_secure::is_tls_start(first[0]) => {
                    // The identity waits for the ClientHello's server name.
                    Next(Step::Tls {
                        tcp,
                        hs: Box::new(Handshake::accept()),
                        keyed: None,
                    })
                }
                // A plain frame, silence past the deadline, an error or
                // the end: the protocol's handshake reports it, as the
                // thread of a connection did.
                _ => Next(proto(shared, Stream::plain_tcp(tcp), started, None)),
            }
        }
        Step::Tls { tcp, mut hs, keyed } => match hs.advance(&tcp) {
            Ok(Want::Identity) => match identity_for(shared, hs.server_name().as_deref()) {
                Ok((tls, keyed)) => match hs.choose(&tls, &tcp) {
                    Ok(()) => Next(Step::Tls { tcp, hs, keyed }),
                    Err(e) => {
                        forget();
                        tls_refused(shared, peer, &e, None);
                        Done
                    }
                },
                Err(why) => {
                    forget();
                    tls_refused(shared, peer, &why.error(), Some(&why));
                    Done
                }
            },
            Ok(Want::Done) => match hs.into_stream(tcp) {
                Ok(stream) => Next(proto(shared, stream, started, keyed)),
                Err(e) => {
                    forget();
                    tls_refused(shared, peer, &e, None);
                    Done
                }
            },
            Ok(_) if now < deadline => Wait(Step::Tls { tcp, hs, keyed }),
            Ok(_) => {
                forget();
                Done
            }
            Err(e) => {
                forget();
                tls_refused(shared, peer, &e, None);
                Done
            }
        },
        Step::Proto {
            stream,
            mut conn,
            keyed,
            mut out,
            mut sent,
        } => {
            queue(&mut conn, &mut out);
            match push(&stream, &out, &mut sent) {
                Ok(true) => {
                    out.clear();
                    sent = 0;
                }
                Ok(false) if now < deadline => {
                    return Wait(Step::Proto {
                        stream,
                        conn,
                        keyed,
                        out,
                        sent,
                    })
                }
                _ => {
                    forget();
                    return Done;
                }
            }
            while let Some(ev) = conn.poll_event() {
                match ev {
                    ServerEvent::Open {
                        service,
                        params,
                        authenticated,
                        ticket: grant,
                    } => {
                        forget();
                        let Some(t) = ticket.take() else { return Done };
                        if blocking(shared, &stream).is_err() {
                            return Done;
                        }
                        let Some(shared) = shared.me.upgrade() else {
                            return Done;
                        };
                        // The session's thread, as a connection's was.
                        let spawned = std::thread::Builder::new()
                            .name(format!("{PROTOCOL} {peer}"))
                            .stack_size(CONN_STACK)
                            .spawn(move || {
                                let open = Opened {
                                    name: &service,
                                    params,
                                    authenticated,
                                    ticket: grant,
                                    keyed,
                                };
                                open_session(&shared, t, *conn, stream, open)
                            });
                        // On failure the closure, with the ticket in it,
                        // is dropped: the connection closes.
                        let _ = spawned;
                        return Done;
                    }
                    ServerEvent::DataHello { cookie, tag } => {
                        forget();
                        let Some(t) = ticket.take() else { return Done };
                        if blocking(shared, &stream).is_ok() {
                            let keyed = keyed.map(|k| k.id);
                            attach_data(shared, t, *conn, stream, cookie, tag, keyed);
                        }
                        return Done;
                    }
                    ServerEvent::Closed(err) => {
                        forget();
                        queue(&mut conn, &mut out);
                        let _ = push(&stream, &out, &mut sent);
                        handshake_closed(t, &err);
                        return Done;
                    }
                    ServerEvent::Payload(_) => {}
                }
            }
            if conn.is_closed() {
                forget();
                queue(&mut conn, &mut out);
                let _ = push(&stream, &out, &mut sent);
                return Done;
            }
            if conn.poll_timeout().is_some_and(|d| d <= now) {
                conn.handle_timeout(now);
                return Next(Step::Proto {
                    stream,
                    conn,
                    keyed,
                    out,
                    sent,
                });
            }
            // Never past the frame being read: bytes behind a data hello
            // belong to the service.
            let mut buf = [0u8; 4096];
            let room = conn.read_limit().min(buf.len());
            match (&stream).read(&mut buf[..room]) {
                Ok(0) => conn.handle_eof(Instant::now()),
                Ok(n) => conn.handle_input(Instant::now(), &buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Wait(Step::Proto {
                        stream,
                        conn,
                        keyed,
                        out,
                        sent,
                    })
                }
                Err(_) => {
                    forget();
                    return Done;
                }
            }
            Next(Step::Proto {
                stream,
                conn,
                keyed,
                out,
                sent,
            })
        }
    }
}

/// The protocol's handshake on `stream`, from `started`; keyed by a
/// one-time ticket's TLS identity, or not.
fn proto(shared: &Protocol, stream: Stream, started: Instant, keyed: Option<Keyed>) -> Step {
    let _ = stream.set_nodelay(true);
    Step::Proto {
        stream,
        conn: Box::new(server_conn(shared, keyed.as_ref(), started)),
        keyed,
        out: Vec::new(),
        sent: 0,
    }
}

/// Appends what the protocol has to send to `out`.
fn queue(conn: &mut ServerConn, out: &mut Vec<u8>) {
    while let Some(bytes) = conn.poll_transmit() {
        out.extend_from_slice(&bytes);
    }
}

/// Writes `out[*sent..]` as far as the socket takes it (and, encrypted,
/// flushes the records): `Ok(true)` once all of it is on the wire.
fn push(stream: &Stream, out: &[u8], sent: &mut usize) -> io::Result<bool> {
    loop {
        let r = if *sent < out.len() {
            (&*stream).write(&out[*sent..])
        } else {
            (&*stream).flush().map(|()| 0)
        };
        match r {
            Ok(0) if *sent < out.len() => return Err(io::ErrorKind::WriteZero.into()),
            Ok(0) => return Ok(true),
            Ok(n) => *sent += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
    }
}

/// Back to the blocking socket a connection's thread had, with its
/// pre-auth write limit.
fn blocking(shared: &Protocol, stream: &Stream) -> io::Result<()> {
    stream.tcp().set_nonblocking(false)?;
    let _ = stream.set_write_timeout(Some(shared.config.preauth_timeout));
    Ok(())
}
