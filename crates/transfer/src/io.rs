//! Small I/O helpers shared by the sender and the receiver: an aligned
//! buffer (O_DIRECT needs 4 KiB alignment), positioned reads that report a
//! shrinking file, hole punching, flushing, TCP keepalive, and a shared rate
//! limiter for `--bwlimit`. (The system calls, hole punching and keepalive
//! among them, are `fatpipe-sys`'s; what is here is the policy around them:
//! zeros where no hole can be punched, the keepalive timers.)

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Alignment that satisfies O_DIRECT on every common file system.
pub const ALIGN: usize = 4096;

/// A zeroed heap buffer aligned to [`ALIGN`]: a plain vector one page
/// longer than asked, used from its first aligned byte on.
pub struct AlignedBuf {
    mem: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// Allocates `len` bytes (rounded up to the alignment, at least one page).
    pub fn new(len: usize) -> AlignedBuf {
        let len = len.max(ALIGN).div_ceil(ALIGN) * ALIGN;
        let mem = vec![0u8; len + ALIGN];
        let start = (ALIGN - mem.as_ptr() as usize % ALIGN) % ALIGN;
        AlignedBuf { mem, start, len }
    }

    /// Capacity in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if empty (never: at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The whole buffer.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.mem[self.start..self.start + self.len]
    }

    /// Grows to at least `len` bytes (contents are not kept).
    pub fn ensure(&mut self, len: usize) {
        if len > self.len {
            *self = AlignedBuf::new(len);
        }
    }
}

/// Reads exactly `buf.len()` bytes at `off`; a file that ends early is an
/// `UnexpectedEof` saying it shrank.
pub fn pread_exact(file: &File, buf: &mut [u8], off: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], off + done as u64) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "file shrank while being copied",
                ))
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Makes `[off, off+len)` read as zeros without allocating (a hole); file
/// systems that cannot punch holes get zeros written.
pub fn punch_hole(file: &File, off: u64, len: u64) -> io::Result<()> {
    if fatpipe_sys::punch_hole(file, off, len).is_ok() {
        return Ok(());
    }
    let zeros = vec![0u8; 1 << 20];
    let mut pos = 0;
    while pos < len {
        let n = (len - pos).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..n], off + pos)?;
        pos += n as u64;
    }
    Ok(())
}

/// `fdatasync(2)`.
pub fn datasync(file: &File) -> io::Result<()> {
    file.sync_data()
}

/// Enables TCP keepalive with short timers, so a peer that vanished without
/// a reset (power loss, cable) is noticed in about half a minute even when
/// this side is only waiting.
pub fn keepalive(sock: impl AsFd) {
    let _ = fatpipe_sys::set_keepalive(sock, Duration::from_secs(10), Duration::from_secs(5), 4);
}

/// A rate cap shared by all streams: each asks for bytes before sending and
/// sleeps until the average since the start is back under the rate.
#[derive(Debug)]
pub struct Limiter {
    bytes_per_sec: f64,
    state: Mutex<(Instant, u64)>,
}

impl Limiter {
    /// A limiter for `bits_per_sec`.
    pub fn new(bits_per_sec: u64) -> Limiter {
        Limiter {
            bytes_per_sec: (bits_per_sec as f64 / 8.0).max(1.0),
            state: Mutex::new((Instant::now(), 0)),
        }
    }

    /// Accounts `n` bytes, sleeping as needed.
    pub fn take(&self, n: u64) {
        let wait = self.reserve(n).saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }

    /// Accounts `n` bytes without waiting: the time before which they
    /// may not be sent (a stream on the runner sleeps until then; a
    /// thread of the shared blocking pool must never sleep for a peer's
    /// rate cap).
    pub fn reserve(&self, n: u64) -> Instant {
        let mut s = crate::plan::lock(&self.state);
        s.1 += n;
        s.0 + Duration::from_secs_f64(s.1 as f64 / self.bytes_per_sec)
    }
}

/// Called once with how a data connection's runner task ended, on the
/// runner's thread.
pub(crate) type End = Box<dyn FnOnce(std::io::Result<()>) + Send>;

/// A runner task's [`End`], called exactly once: by [`Ending::finish`], or
/// with a failure when the task is dropped without it (a turn panicked),
/// so its session always hears of it.
pub(crate) struct Ending {
    end: Option<End>,
    /// The failure said when dropped unfinished.
    failed: &'static str,
}

impl Ending {
    pub(crate) fn new(end: End, failed: &'static str) -> Ending {
        Ending {
            end: Some(end),
            failed,
        }
    }

    /// Says how the task ended (only the first call counts).
    pub(crate) fn finish(&mut self, r: std::io::Result<()>) {
        if let Some(end) = self.end.take() {
            end(r);
        }
    }
}

impl Drop for Ending {
    fn drop(&mut self) {
        let failed = self.failed;
        self.finish(Err(std::io::Error::other(failed)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn aligned_buffer() {
        let mut b = AlignedBuf::new(10);
        assert_eq!(b.len(), ALIGN);
        assert_eq!(b.bytes_mut().as_ptr() as usize % ALIGN, 0);
        b.ensure(3 * ALIGN + 1);
        assert_eq!(b.len(), 4 * ALIGN);
        assert!(b.bytes_mut().iter().all(|&x| x == 0));
    }

    #[test]
    fn pread_and_holes() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&[7u8; 10000]).unwrap();
        let mut buf = [0u8; 100];
        pread_exact(&f, &mut buf, 50).unwrap();
        assert!(buf.iter().all(|&x| x == 7));
        let e = pread_exact(&f, &mut buf, 9950).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        punch_hole(&f, 4096, 4096).unwrap();
        pread_exact(&f, &mut buf, 4096).unwrap();
        assert!(buf.iter().all(|&x| x == 0));
        pread_exact(&f, &mut buf, 8192).unwrap();
        assert!(buf.iter().all(|&x| x == 7));
    }

    #[test]
    fn limiter_paces() {
        let l = Limiter::new(8 * 1_000_000); // 1 MB/s
        let t = Instant::now();
        l.take(100_000);
        l.take(100_000);
        let el = t.elapsed();
        assert!(el >= Duration::from_millis(180), "{el:?}");
    }
}
