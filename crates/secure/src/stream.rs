//! [`Stream`]: a TCP connection, plain or TLS-protected, with the interface
//! of `TcpStream` that the services use (Read/Write on `&Stream` too,
//! `try_clone`, `shutdown`, timeouts).
//!
//! An encrypted stream keeps its [`Sealer`] and [`Opener`] behind one lock
//! each, shared by its clones: one thread can block reading while another
//! writes, as on a `TcpStream`. The TCP socket stays reachable through
//! [`Stream::tcp`] for socket options and TCP_INFO; only
//! [`Stream::plain`] hands it out for zero-copy I/O (sendfile, splice,
//! MSG_TRUNC), and only when the stream is not encrypted.

use std::any::Any;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::Duration;

use crate::record::{Opener, Sealer, MAX_CONTENT};

/// Content bytes sealed per system call: sixteen full records.
const WRITE_BATCH: usize = 16 * MAX_CONTENT;

/// What protects an encrypted connection (the JSON's `encryption`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encryption {
    /// `TLS 1.3`.
    pub protocol: &'static str,
    /// The cipher suite's IANA name, e.g. `TLS13_AES_128_GCM_SHA256`.
    pub suite: &'static str,
}

/// A TCP connection, encrypted or not. Clones share the connection.
pub struct Stream {
    tcp: TcpStream,
    tls: Option<Arc<Tls>>,
    /// Something kept alive as long as any clone of the stream is (the
    /// server's slot in its cap on data connections, [`Stream::hold`]).
    held: Option<Arc<dyn Any + Send + Sync>>,
}

struct Tls {
    sealer: Mutex<SealHalf>,
    opener: Mutex<Opener>,
    encryption: Encryption,
}

struct SealHalf {
    sealer: Sealer,
    /// Sealed records; `out[sent..]` is not on the wire yet (a write that
    /// timed out part-way leaves it for the next write or flush).
    out: Vec<u8>,
    sent: usize,
    /// A write failed for good, or close_notify went out: nothing more
    /// may follow.
    broken: bool,
    /// close_notify is sealed in `out` ([`Stream::close_write`]): nothing
    /// more may be sealed.
    closing: bool,
}

impl SealHalf {
    /// Writes what is left of `out`. A timeout keeps the rest for later;
    /// any other failure breaks the stream (a record was cut).
    fn push(&mut self, tcp: &TcpStream) -> io::Result<()> {
        while self.sent < self.out.len() {
            match (&*tcp).write(&self.out[self.sent..]) {
                Ok(0) => {
                    self.broken = true;
                    return Err(io::ErrorKind::WriteZero.into());
                }
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) => return Err(e),
                Err(e) => {
                    self.broken = true;
                    return Err(e);
                }
            }
        }
        self.out.clear();
        self.sent = 0;
        Ok(())
    }
}

impl Stream {
    /// A plain (unencrypted) stream.
    pub fn plain_tcp(tcp: TcpStream) -> Stream {
        Stream {
            tcp,
            tls: None,
            held: None,
        }
    }

    /// An encrypted stream from the halves the handshake produced.
    pub(crate) fn tls(
        tcp: TcpStream,
        sealer: Sealer,
        opener: Opener,
        encryption: Encryption,
    ) -> Stream {
        Stream {
            tcp,
            tls: Some(Arc::new(Tls {
                sealer: Mutex::new(SealHalf {
                    sealer,
                    out: Vec::with_capacity(WRITE_BATCH + WRITE_BATCH / 64),
                    sent: 0,
                    broken: false,
                    closing: false,
                }),
                opener: Mutex::new(opener),
                encryption,
            })),
            held: None,
        }
    }

    /// What encrypts this stream, or `None` for a plain one.
    pub fn encryption(&self) -> Option<&Encryption> {
        self.tls.as_ref().map(|t| &t.encryption)
    }

    /// True if the stream is encrypted.
    pub fn is_encrypted(&self) -> bool {
        self.tls.is_some()
    }

    /// The TCP socket, for socket options and TCP_INFO. Never read or
    /// write it directly: on an encrypted stream that bypasses TLS.
    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// The TCP socket for zero-copy I/O, only if the stream is plain.
    pub fn plain(&self) -> Option<&TcpStream> {
        match self.tls {
            None => Some(&self.tcp),
            Some(_) => None,
        }
    }

    /// Another handle on the same connection (and the same TLS state).
    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(Stream {
            tcp: self.tcp.try_clone()?,
            tls: self.tls.clone(),
            held: self.held.clone(),
        })
    }

    /// Keeps `guard` alive until this stream and every clone of it are
    /// dropped: whoever takes the stream keeps the guard with it (the
    /// server releases a data connection's slot in its cap this way).
    pub fn hold(mut self, guard: Arc<dyn Any + Send + Sync>) -> Stream {
        self.held = Some(guard);
        self
    }

    /// Shuts the connection down as `TcpStream::shutdown` does. Shutting
    /// the write side of an encrypted stream (the graceful end) first sends
    /// close_notify when no writer is busy; `Both` is an abort (it wakes
    /// blocked threads) and sends nothing that could block.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        if let (Some(tls), Shutdown::Write) = (&self.tls, how) {
            // Never wait for a writer (shutting down is how a blocked one is
            // woken); the peer then sees the end of the TCP stream instead.
            let half = match tls.sealer.try_lock() {
                Ok(h) => Some(h),
                Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
                Err(TryLockError::WouldBlock) => None,
            };
            if let Some(mut half) = half {
                if half.closing {
                    // close_write sealed it already: only what is left goes.
                    let _ = half.push(&self.tcp);
                } else if !half.broken && half.push(&self.tcp).is_ok() {
                    let SealHalf { sealer, out, .. } = &mut *half;
                    if sealer.close_notify(out).is_ok() {
                        let _ = half.push(&self.tcp);
                    }
                }
                half.broken = true;
            }
        }
        self.tcp.shutdown(how)
    }

    /// Ends the write side gracefully on a non-blocking socket, never
    /// cutting a record: what earlier writes left goes out, then
    /// close_notify, then the TCP write side is shut. `WouldBlock` means
    /// call again once the socket is writable (nothing is lost); `Ok`
    /// means the write side is shut. A plain stream shuts at once.
    /// ([`Stream::shutdown`] with `Write` sends close_notify only if the
    /// socket takes it at once, and cuts the record otherwise.)
    pub fn close_write(&self) -> io::Result<()> {
        let Some(tls) = &self.tls else {
            return self.tcp.shutdown(Shutdown::Write);
        };
        let mut half = relock(&tls.sealer);
        if !half.broken && !half.closing {
            half.push(&self.tcp)?;
            let SealHalf { sealer, out, .. } = &mut *half;
            sealer.close_notify(out).map_err(invalid)?;
            half.closing = true;
        }
        if !half.broken {
            half.push(&self.tcp)?;
            half.broken = true;
        }
        drop(half);
        self.tcp.shutdown(Shutdown::Write)
    }

    /// See `TcpStream::peer_addr`.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.peer_addr()
    }

    /// See `TcpStream::local_addr`.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// See `TcpStream::set_read_timeout`.
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.tcp.set_read_timeout(t)
    }

    /// See `TcpStream::set_write_timeout`.
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.tcp.set_write_timeout(t)
    }

    /// See `TcpStream::set_nodelay`.
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.tcp.set_nodelay(on)
    }

    /// Receives and opens up to `max` bytes of content and passes over
    /// them instead of copying them out (a reader that only counts what
    /// arrives); as `read` otherwise: `Ok(0)` at the end, `WouldBlock` on
    /// a non-blocking socket with nothing to open. A plain stream reads
    /// into a small scratch buffer.
    pub fn discard(&self, max: usize) -> io::Result<usize> {
        let Some(tls) = &self.tls else {
            let mut scratch = [0u8; 4096];
            let n = max.min(scratch.len());
            return (&self.tcp).read(&mut scratch[..n]);
        };
        self.open_with(tls, |o| o.discard(max))
    }

    fn read_tls(&self, tls: &Tls, buf: &mut [u8]) -> io::Result<usize> {
        self.open_with(tls, |o| o.read(buf))
    }

    /// Opens records until `take` gets content (or the end).
    fn open_with(
        &self,
        tls: &Tls,
        mut take: impl FnMut(&mut Opener) -> Result<Option<usize>, crate::RecordError>,
    ) -> io::Result<usize> {
        let mut opener = relock(&tls.opener);
        loop {
            if let Some(n) = take(&mut opener).map_err(invalid)? {
                return Ok(n);
            }
            let n = (&self.tcp).read(opener.spare())?;
            if n == 0 {
                if opener.mid_record() {
                    return Err(invalid(crate::RecordError::Truncated));
                }
                return Ok(0);
            }
            opener.filled(n);
        }
    }

    fn write_tls(&self, tls: &Tls, buf: &[u8]) -> io::Result<usize> {
        let mut half = relock(&tls.sealer);
        if half.broken || half.closing {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "TLS stream closed or broken by an earlier failed write",
            ));
        }
        // What an earlier, timed-out write left goes first; if it times
        // out again, nothing of `buf` was taken.
        half.push(&self.tcp)?;
        let take = buf.len().min(WRITE_BATCH);
        let SealHalf { sealer, out, .. } = &mut *half;
        sealer.seal(&buf[..take], out).map_err(invalid)?;
        match half.push(&self.tcp) {
            // Sealed is taken: the rest goes out with the next write or flush.
            Err(e) if is_timeout(&e) && !half.broken => Ok(take),
            Err(e) => Err(e),
            Ok(()) => Ok(take),
        }
    }

    fn flush_tls(&self, tls: &Tls) -> io::Result<()> {
        let mut half = relock(&tls.sealer);
        if half.broken {
            return Ok(());
        }
        half.push(&self.tcp)
    }
}

impl From<TcpStream> for Stream {
    fn from(tcp: TcpStream) -> Stream {
        Stream::plain_tcp(tcp)
    }
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream")
            .field("tcp", &self.tcp)
            .field("encryption", &self.encryption())
            .finish()
    }
}

impl Read for &Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &self.tls {
            None => (&self.tcp).read(buf),
            Some(tls) => self.read_tls(tls, buf),
        }
    }
}

impl Write for &Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &self.tls {
            None => (&self.tcp).write(buf),
            Some(tls) => self.write_tls(tls, buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &self.tls {
            None => Ok(()),
            Some(tls) => self.flush_tls(tls),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        (&*self).flush()
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// A record-layer failure as the `io::Error` the data paths see; its text
/// names the cause ("failed authentication").
fn invalid(e: crate::RecordError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Locks a half, recovering from a thread that panicked holding it (the
/// half is then marked broken by the failed write, or is still valid).
fn relock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
