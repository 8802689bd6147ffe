//! The authenticated control channel of an established session.
//!
//! After the handshake the control connection carries service messages as
//! `Payload` frames (at most [`MAX_PAYLOAD`] bytes each). A service usually
//! reads on one thread while another reports (intervals, progress), so
//! [`Control`] is a cheap clonable handle whose reading and writing halves
//! lock separately. Reads take a timeout so that no service ever blocks
//! forever on a peer that vanished; writes carry a long timeout for the same
//! reason.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fatpipe_proto::{FrameDecoder, Message, MAX_PAYLOAD};
use fatpipe_secure::Stream;

use crate::error::{EngineError, Result};
use fatpipe_proto::ConnError;

/// How long a control write may block before the peer counts as gone.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// A handle on a session's control channel. Clones share the connection.
#[derive(Debug, Clone)]
pub struct Control {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    reader: Mutex<ReadHalf>,
    writer: Mutex<Stream>,
    encryption: Option<fatpipe_secure::Encryption>,
    /// Set on the first service message received: the server's watchdog
    /// reads it to tell a session that started from one that never did.
    started: Arc<AtomicBool>,
}

#[derive(Debug)]
struct ReadHalf {
    stream: Stream,
    /// Messages decoded during the handshake, delivered first.
    early: VecDeque<std::result::Result<Vec<u8>, ConnError>>,
    decoder: FrameDecoder,
    buf: Vec<u8>,
}

impl Control {
    /// Wraps an established control connection; `buffered` holds bytes the
    /// handshake machine had already read past its last frame.
    pub(crate) fn new(
        stream: Stream,
        buffered: &[u8],
        early: Vec<std::result::Result<Vec<u8>, ConnError>>,
    ) -> Result<Control> {
        let writer = stream
            .try_clone()
            .map_err(|e| EngineError::io("clone control socket", e))?;
        writer
            .set_write_timeout(Some(WRITE_TIMEOUT))
            .map_err(|e| EngineError::io("set control write timeout", e))?;
        let _ = stream.set_nodelay(true);
        let encryption = stream.encryption().cloned();
        let mut decoder = FrameDecoder::new();
        decoder.push(buffered);
        Ok(Control {
            inner: Arc::new(Inner {
                reader: Mutex::new(ReadHalf {
                    stream,
                    early: early.into(),
                    decoder,
                    buf: vec![0; 16 * 1024],
                }),
                writer: Mutex::new(writer),
                encryption,
                started: Arc::new(AtomicBool::new(false)),
            }),
        })
    }

    /// What encrypts the control connection (`--encrypt`), if anything.
    pub fn encryption(&self) -> Option<&fatpipe_secure::Encryption> {
        self.inner.encryption.as_ref()
    }

    /// Sends one service message (at most [`MAX_PAYLOAD`] bytes).
    pub fn send(&self, payload: &[u8]) -> Result<()> {
        if payload.len() > MAX_PAYLOAD {
            return Err(ConnError::PayloadTooLarge(payload.len()).into());
        }
        let mut wire = Vec::with_capacity(payload.len() + 5);
        Message::Payload(payload.to_vec()).encode(&mut wire)?;
        self.write(&wire)
    }

    /// Receives one service message, waiting at most `timeout` (forever if
    /// `None`). `Ok(None)` means the time ran out; the channel stays usable.
    /// A `Close` from the peer or end of file is an error
    /// ([`ConnError::Closed`] / [`ConnError::Eof`]).
    pub fn recv(&self, timeout: Option<Duration>) -> Result<Option<Vec<u8>>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut half = lock(&self.inner.reader);
        let ReadHalf {
            stream,
            early,
            decoder,
            buf,
        } = &mut *half;
        if let Some(first) = early.pop_front() {
            return first.map(Some).map_err(EngineError::from);
        }
        loop {
            if let Some(body) = decoder.next_frame()? {
                return match Message::decode(&body)? {
                    Message::Payload(p) => {
                        self.inner.started.store(true, Ordering::Relaxed);
                        Ok(Some(p))
                    }
                    Message::Close { reason } => Err(ConnError::Closed(reason).into()),
                    Message::Reject { code, reason } => {
                        Err(ConnError::Rejected { code, reason }.into())
                    }
                    _ => Err(ConnError::Unexpected {
                        got: "a handshake message",
                        state: "established",
                    }
                    .into()),
                };
            }
            let wait = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(None);
                    }
                    Some(left)
                }
                None => None,
            };
            stream
                .set_read_timeout(wait)
                .map_err(|e| EngineError::io("set control read timeout", e))?;
            match stream.read(buf) {
                Ok(0) => return Err(ConnError::Eof.into()),
                Ok(n) => decoder.push(&buf[..n]),
                Err(e) if is_timeout(&e) => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(EngineError::io("read control connection", e)),
            }
        }
    }

    /// The flag set once a service message has been received.
    pub(crate) fn started_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.inner.started)
    }

    /// Ends the session: sends `Close` with `reason` (empty for a normal end)
    /// and shuts the write side. Errors are ignored: the peer may be gone.
    pub fn close(&self, reason: &str) {
        let mut wire = Vec::new();
        if (Message::Close {
            reason: reason.into(),
        })
        .encode(&mut wire)
        .is_ok()
        {
            let _ = self.write(&wire);
        }
        let _ = lock(&self.inner.writer).shutdown(Shutdown::Write);
    }

    /// Shuts the connection in both directions, waking a blocked `recv`.
    pub fn abort(&self) {
        let _ = lock(&self.inner.writer).shutdown(Shutdown::Both);
    }

    fn write(&self, wire: &[u8]) -> Result<()> {
        lock(&self.inner.writer)
            .write_all(wire)
            .map_err(|e| EngineError::io("write control connection", e))
    }
}

/// True for the errors a socket timeout produces.
pub(crate) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Locks a mutex, recovering from a thread that panicked while holding it:
/// the guarded socket state is still valid.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
