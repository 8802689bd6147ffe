//! `MSG_ZEROCOPY` sends of an immutable payload, with bounded outstanding
//! completions.
//!
//! With `SO_ZEROCOPY` on, `send(MSG_ZEROCOPY)` pins the caller's pages and
//! the NIC reads them later; the kernel reports when it is done through the
//! socket's error queue as ranges of send sequence numbers. Two things make
//! this awkward to expose safely, and shape [`ZeroCopySender`]:
//!
//! - The bytes must not change until their completion arrives. So the
//!   sender owns its payload as an `Arc<[u8]>` that nobody can mutate, and
//!   only sends slices of it. (Pinned pages stay valid in the kernel even
//!   if the process frees the memory, so dropping early is safe, merely
//!   pointless.)
//! - Completions must be reaped or the socket's option memory fills and
//!   sends fail with `ENOBUFS`. The sender counts sends minus completed
//!   sends and reaps (waiting if it must) before exceeding its bound.
//!
//! When the kernel delivers the data locally (loopback, veth into another
//! namespace) it copies anyway and marks the completion "copied"; zero-copy
//! then costs more than a plain send. The sender notices that and switches
//! itself to plain sends, reporting [`IoPath::Copy`] and the reason in its
//! [`ZeroCopyStats`]. A kernel or platform that refuses `SO_ZEROCOPY`
//! starts in that mode.

use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{platform, IoPath, Transfer};

/// After this many completed sends that were all copied, give up on
/// zero-copy for the socket.
const COPIED_BEFORE_SWITCH: u64 = 64;

/// Counters of what a [`ZeroCopySender`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ZeroCopyStats {
    /// Sends issued with `MSG_ZEROCOPY`.
    pub zerocopy_sends: u64,
    /// Sends issued as plain copies.
    pub copy_sends: u64,
    /// Zero-copy sends whose completion has been reaped.
    pub completed: u64,
    /// Of those, how many the kernel reported it copied after all.
    pub copied: u64,
    /// Why the sender is (now) sending plain copies, if it is.
    pub fallback_reason: Option<String>,
}

/// Sends slices of one immutable payload with `MSG_ZEROCOPY`, keeping at
/// most `max_outstanding` sends awaiting completion. One per socket.
#[derive(Debug)]
pub struct ZeroCopySender {
    payload: Arc<[u8]>,
    max_outstanding: u64,
    zerocopy: bool,
    stats: ZeroCopyStats,
}

impl ZeroCopySender {
    /// Enables `SO_ZEROCOPY` on `fd` and prepares to send from `payload`.
    /// Never fails because zero-copy is unavailable: the sender then sends
    /// plain copies and says why in [`Self::stats`].
    pub fn new(fd: impl AsFd, payload: Arc<[u8]>, max_outstanding: usize) -> ZeroCopySender {
        let (zerocopy, fallback_reason) = match platform::enable_zerocopy(&fd) {
            Ok(()) => (true, None),
            Err(e) => (false, Some(format!("SO_ZEROCOPY refused: {e}"))),
        };
        ZeroCopySender {
            payload,
            max_outstanding: max_outstanding.max(1) as u64,
            zerocopy,
            stats: ZeroCopyStats {
                fallback_reason,
                ..ZeroCopyStats::default()
            },
        }
    }

    /// The path the next send will take.
    pub fn path(&self) -> IoPath {
        if self.zerocopy {
            IoPath::MsgZerocopy
        } else {
            IoPath::Copy
        }
    }

    /// What has happened so far.
    pub fn stats(&self) -> &ZeroCopyStats {
        &self.stats
    }

    /// The payload this sender sends from.
    pub fn payload(&self) -> &Arc<[u8]> {
        &self.payload
    }

    /// Sends up to `len` bytes of the payload starting at `start` (clamped
    /// to the payload) in one `send`, reaping completions first if the
    /// outstanding bound is reached. Returns the bytes accepted. If no
    /// completion arrives for a second while at the bound (the peer stopped
    /// reading), fails with `TimedOut`, which callers may simply retry.
    pub fn send(&mut self, fd: impl AsFd, start: usize, len: usize) -> io::Result<Transfer> {
        let start = start.min(self.payload.len());
        let end = start.saturating_add(len).min(self.payload.len());
        if start == end {
            return Ok(Transfer::new(0, self.path()));
        }
        if !self.zerocopy {
            return self.send_copy(&fd, start, end);
        }
        self.reap(&fd)?;
        while self.outstanding() >= self.max_outstanding {
            self.wait_completion(&fd, Duration::from_secs(1))?;
        }
        if !self.zerocopy {
            return self.send_copy(&fd, start, end);
        }
        loop {
            match platform::send(&fd, &self.payload[start..end], platform::MSG_ZEROCOPY_FLAG) {
                Ok(n) => {
                    self.stats.zerocopy_sends += 1;
                    return Ok(Transfer::new(n, IoPath::MsgZerocopy));
                }
                // Option memory for notifications is full: reap and retry.
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) && self.outstanding() > 0 => {
                    self.wait_completion(&fd, Duration::from_secs(1))?;
                }
                Err(e) if platform::is_refusal(&e) && self.stats.zerocopy_sends == 0 => {
                    self.switch_to_copy(format!("MSG_ZEROCOPY refused: {e}"));
                    return self.send_copy(&fd, start, end);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Reaps every completion already queued, without blocking.
    pub fn reap(&mut self, fd: impl AsFd) -> io::Result<()> {
        while let Some(c) = platform::read_zerocopy_completion(&fd)? {
            let n = u64::from(c.hi.wrapping_sub(c.lo)) + 1;
            self.stats.completed += n;
            if c.copied {
                self.stats.copied += n;
            }
        }
        if self.zerocopy
            && self.stats.completed >= COPIED_BEFORE_SWITCH
            && self.stats.copied == self.stats.completed
        {
            self.switch_to_copy(
                "kernel copied every zero-copy send (local delivery: loopback or veth)".into(),
            );
        }
        Ok(())
    }

    /// Waits up to `timeout` for every outstanding send to complete (call
    /// before closing the socket when exact accounting matters). Returns
    /// whether all completed.
    pub fn finish(&mut self, fd: impl AsFd, timeout: Duration) -> io::Result<bool> {
        let deadline = Instant::now() + timeout;
        self.reap(&fd)?;
        while self.outstanding() > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            self.wait_completion(&fd, left)?;
        }
        Ok(true)
    }

    /// Zero-copy sends not yet completed.
    fn outstanding(&self) -> u64 {
        self.stats
            .zerocopy_sends
            .saturating_sub(self.stats.completed)
    }

    fn wait_completion(&mut self, fd: &impl AsFd, timeout: Duration) -> io::Result<()> {
        let before = self.stats.completed;
        let ms = i32::try_from(timeout.as_millis())
            .unwrap_or(i32::MAX)
            .max(1);
        // A pending error-queue entry shows as POLLERR even with no events.
        platform::poll_fd(fd, 0, ms)?;
        self.reap(fd)?;
        if self.stats.completed == before && self.outstanding() >= self.max_outstanding {
            // Nothing arrived within the timeout: the peer is not reading
            // or the path stalled. Say so instead of spinning silently.
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no MSG_ZEROCOPY completion arrived in time",
            ));
        }
        Ok(())
    }

    fn send_copy(&mut self, fd: &impl AsFd, start: usize, end: usize) -> io::Result<Transfer> {
        let n = platform::send(fd, &self.payload[start..end], 0)?;
        self.stats.copy_sends += 1;
        Ok(Transfer::new(n, IoPath::Copy))
    }

    fn switch_to_copy(&mut self, reason: String) {
        self.zerocopy = false;
        self.stats.fallback_reason = Some(reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::os::unix::net::UnixStream;

    fn linux() -> bool {
        cfg!(all(target_os = "linux", not(fatpipe_sys_fallback)))
    }

    fn payload(n: usize) -> Arc<[u8]> {
        (0..n).map(|i| (i % 251) as u8).collect::<Vec<_>>().into()
    }

    #[test]
    fn zerocopy_sends_correct_bytes_or_reports_fallback() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let reader = std::thread::spawn(move || {
            let mut v = Vec::new();
            s.read_to_end(&mut v).unwrap();
            v
        });
        let p = payload(256 * 1024);
        let mut z = ZeroCopySender::new(&c, p.clone(), 8);
        let mut paths = Vec::new();
        let mut total = 0usize;
        let mut expect = Vec::new();
        for round in 0..200 {
            let start = (round * 977) % 1000;
            let t = z.send(&c, start, 64 * 1024).unwrap();
            assert!(t.bytes > 0);
            expect.extend_from_slice(&p[start..start + t.bytes]);
            total += t.bytes;
            paths.push(t.path);
            assert!(z.outstanding() <= 8, "bound respected");
        }
        assert!(z.finish(&c, Duration::from_secs(5)).unwrap());
        drop(c);
        let got = reader.join().unwrap();
        assert_eq!(got.len(), total);
        assert!(got == expect, "payload corrupted");
        let st = z.stats().clone();
        eprintln!("zerocopy on loopback: {st:?}");
        assert_eq!(st.zerocopy_sends + st.copy_sends, 200);
        let refused = st
            .fallback_reason
            .as_deref()
            .is_some_and(|r| r.contains("refused"));
        if linux() && !refused {
            assert!(st.zerocopy_sends > 0, "{st:?}");
            assert_eq!(st.completed, st.zerocopy_sends);
            // Loopback delivery is local, so the kernel copies; once it has
            // seen enough of that the sender switches to plain sends.
            if st.copied == st.completed && st.completed >= COPIED_BEFORE_SWITCH {
                assert_eq!(z.path(), IoPath::Copy);
                assert!(st.fallback_reason.unwrap().contains("copied"));
                assert_eq!(*paths.last().unwrap(), IoPath::Copy);
            }
            assert_eq!(paths[0], IoPath::MsgZerocopy);
        } else {
            // No SO_ZEROCOPY (non-Linux, or Linux < 4.14): plain sends only.
            assert!(refused, "{st:?}");
            assert_eq!(z.path(), IoPath::Copy);
            assert_eq!(st.zerocopy_sends, 0);
            assert!(paths.iter().all(|&p| p == IoPath::Copy));
        }
    }

    #[test]
    fn refused_socket_type_falls_back_to_copy() {
        // Unix sockets do not support SO_ZEROCOPY.
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut z = ZeroCopySender::new(&a, payload(1000), 4);
        assert_eq!(z.path(), IoPath::Copy);
        assert!(z
            .stats()
            .fallback_reason
            .as_ref()
            .unwrap()
            .contains("SO_ZEROCOPY"));
        let t = z.send(&a, 10, 20).unwrap();
        assert_eq!((t.bytes, t.path), (20, IoPath::Copy));
        assert_eq!(z.send(&a, 5000, 20).unwrap().bytes, 0, "start past the end");
        drop(a);
        let mut got = Vec::new();
        b.read_to_end(&mut got).unwrap();
        assert_eq!(got, (10..30).map(|i| i as u8).collect::<Vec<_>>());
    }
}
