//! Encrypted (`--encrypt`) TCP streams on the runner.
//!
//! An encrypted stream had a thread of its own, its record layer driven
//! through blocking reads and writes with short timeouts (a stop was seen
//! within 200 ms): `test --encrypt -P 256` was 256 more threads at each
//! end. Here it is a runner task like a plain stream, over the same
//! non-blocking socket: `fatpipe_secure::Stream` keeps the sealed bytes a
//! full socket did not take and writes them first on the next write (a
//! `WouldBlock` then means nothing of the new data was taken), and keeps
//! a partly received record for the next read.
//!
//! A sender writes the process's one shared pattern through the record
//! layer, paced and budgeted by the same sans-IO sender as a plain one;
//! its end waits (runner turns, never a blocked thread) until the last
//! sealed bytes and close_notify are out (`Stream::close_write`), so the
//! receiver never sees a cut record. A receiver opens (authenticates) and
//! counts what arrives without copying it out (`Stream::discard`): it
//! needs no plaintext buffer of its own, only the record layer's.

use super::*;
use fatpipe_secure::record::MAX_CONTENT;

/// Most reads a receiver makes in one turn: a read returns at most one
/// record's plaintext, and the record layer receives several records per
/// system call, so this is about a quantum of bytes in a few calls.
const READS: usize = runner::QUANTUM_BYTES / MAX_CONTENT;

/// An encrypted stream's state on the runner.
pub(super) enum Tls {
    Send {
        st: StreamSender,
        clock: SendClock,
        buf: payload::Payload,
        /// The sender is done: its write side is being closed.
        closing: bool,
    },
    Recv {
        hold: Option<fatpipe_sys::WindowHold>,
    },
}

impl Tls {
    /// Makes `s` non-blocking and sets up `role`.
    pub(super) fn new(s: &Conn, role: Role, sh: &Shared) -> io::Result<Tls> {
        s.tcp().set_nonblocking(true)?;
        Ok(match role {
            Role::Send => {
                limit_notsent(s.tcp(), sh);
                // Every sender of the process writes from the one shared
                // pattern.
                let buf = payload::pattern(sh.params.length as usize);
                let (st, clock) = new_sender(sh, buf.len(), None);
                Tls::Send {
                    st,
                    clock,
                    buf,
                    closing: false,
                }
            }
            Role::Recv => {
                let (_, hold, _) = tcp_recv_setup(s.tcp(), sh);
                Tls::Recv { hold }
            }
        })
    }

    pub(super) fn wants(&self) -> runner::Wants {
        match self {
            Tls::Send { .. } => runner::Wants::Write,
            Tls::Recv { .. } => runner::Wants::Read,
        }
    }

    /// One turn: at most a quantum; `Done` once the stream has ended
    /// (a sender's write side closed).
    pub(super) fn step(&mut self, s: &Conn, sh: &Shared, c: &Counters) -> io::Result<Step> {
        match self {
            Tls::Send {
                st,
                clock,
                buf,
                closing,
            } => {
                if !*closing {
                    let step = runner::send_turn(
                        st,
                        *clock,
                        &sh.budget,
                        sh.stopped(),
                        |action| {
                            let SendAction::Write { bytes, .. } = *action else {
                                return Ok(Wrote::Took(0, 0));
                            };
                            match (&*s).write(&buf[..bytes]) {
                                Ok(n) => Ok(Wrote::Took(n, 0)),
                                // What an earlier write sealed is still
                                // queued: nothing of this one was taken.
                                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                    Ok(Wrote::Blocked)
                                }
                                Err(e) if is_retry(&e) => Ok(Wrote::Took(0, 0)),
                                Err(e) => Err(e),
                            }
                        },
                        |t, ns| publish_sent(c, t, ns),
                    )?;
                    if step != Step::Done {
                        return Ok(step);
                    }
                    *closing = true;
                }
                if sh.stopped() {
                    // Stopping: no waiting for the peer to read.
                    let _ = s.shutdown(Shutdown::Write);
                    return Ok(Step::Done);
                }
                // The receiver's end of file marks the end of this
                // stream: what a full socket left, then close_notify.
                match s.close_write() {
                    Ok(()) => Ok(Step::Done),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Step::Blocked(None)),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(Step::Again),
                    Err(e) => Err(e),
                }
            }
            Tls::Recv { hold } => {
                let mut moved = 0usize;
                for _ in 0..READS {
                    if sh.stopped() {
                        return Ok(Step::Done);
                    }
                    match s.discard(runner::QUANTUM_BYTES) {
                        Ok(0) => return Ok(Step::Done),
                        Ok(n) => {
                            if let Some(h) = hold.as_mut() {
                                h.tick(s.tcp());
                            }
                            c.bytes.fetch_add(n as u64, Ordering::Relaxed);
                            c.last_ns.store(sh.now_ns(), Ordering::Relaxed);
                            moved += n;
                            if moved >= runner::QUANTUM_BYTES {
                                break;
                            }
                        }
                        // Data (past the low-water mark) or the tick
                        // wakes the stream, as a plain receiver.
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            return Ok(Step::Blocked(Some(Instant::now() + RECV_TICK)));
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(Step::Again)
            }
        }
    }
}
