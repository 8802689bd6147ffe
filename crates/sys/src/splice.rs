//! `splice` through a reusable pipe: socket → file (and file → socket)
//! without copying through user space.
//!
//! `splice(2)` needs a pipe on one side, so moving data socket → file is two
//! calls: socket → pipe, pipe → file. A [`SplicePipe`] owns that pipe, sized
//! once with `F_SETPIPE_SZ` (bigger pipes mean fewer calls per megabyte;
//! unprivileged processes are capped by `fs.pipe-max-size`, so we ask for
//! what we want and keep what we get). Each [`SplicePipe::transfer`] drains
//! the pipe completely before returning, which is what makes it reusable:
//! the next call never finds stale bytes from a previous one.
//!
//! When the kernel refuses `splice` for a descriptor pair (wrong file type,
//! a platform without `splice`) the transfer goes through a user-space
//! buffer instead and reports [`IoPath::Copy`].

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use crate::{platform, IoPath, Transfer};

/// Pipe capacity used when the caller has no opinion: 1 MiB, the default
/// `fs.pipe-max-size`, so it is granted without privileges.
pub const DEFAULT_PIPE_SIZE: usize = 1 << 20;

/// A pipe pair kept for repeated `splice` transfers.
#[derive(Debug)]
pub struct SplicePipe {
    rx: OwnedFd,
    tx: OwnedFd,
    capacity: usize,
    scratch: Vec<u8>,
    splice_ok: Option<bool>,
}

impl SplicePipe {
    /// Creates a pipe and asks for `size` bytes of capacity. The granted
    /// capacity (kernel-rounded, possibly capped) is [`Self::capacity`];
    /// a refused resize keeps the default 64 KiB rather than failing.
    pub fn new(size: usize) -> io::Result<SplicePipe> {
        let (rx, tx) = platform::pipe()?;
        let capacity = match platform::set_pipe_size(&tx, size) {
            Ok(n) => n,
            Err(_) => platform::pipe_size(&tx).unwrap_or(64 * 1024),
        };
        Ok(SplicePipe {
            rx,
            tx,
            capacity,
            scratch: Vec::new(),
            splice_ok: None,
        })
    }

    /// The pipe capacity the kernel granted, in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Moves up to `len` bytes (at most one pipe-full) from `input` to
    /// `output`. Offsets are used for files (`Some`, advanced by the bytes
    /// moved) and must be `None` for sockets and pipes (their own position
    /// is used). Returns `bytes == 0` at end of input.
    ///
    /// Everything read from `input` is written to `output` before this
    /// returns (blocking descriptors are expected), so the pipe is empty for
    /// the next call. If writing fails midway, the bytes still in the pipe
    /// are dropped and the error returned; the stream is then broken and
    /// the caller must give it up, as with any failed write.
    pub fn transfer(
        &mut self,
        input: impl AsFd,
        mut in_off: Option<&mut u64>,
        output: impl AsFd,
        out_off: Option<&mut u64>,
        len: usize,
    ) -> io::Result<Transfer> {
        let want = len.min(self.capacity);
        if want == 0 {
            return Ok(Transfer::new(0, IoPath::Splice));
        }
        if self.splice_ok != Some(false) {
            match platform::splice(&input, in_off.as_deref_mut(), &self.tx, None, want, false) {
                Ok(n) => {
                    self.splice_ok = Some(true);
                    self.drain(&output, out_off, n)?;
                    return Ok(Transfer::new(n, IoPath::Splice));
                }
                Err(e) if self.splice_ok.is_none() && platform::is_refusal(&e) => {
                    self.splice_ok = Some(false);
                }
                Err(e) => return Err(e),
            }
        }
        self.copy(&input, in_off, &output, out_off, want)
    }

    /// Writes `n` bytes sitting in the pipe to `output`.
    fn drain(
        &mut self,
        output: &impl AsFd,
        mut out_off: Option<&mut u64>,
        n: usize,
    ) -> io::Result<()> {
        let mut left = n;
        while left > 0 {
            match platform::splice(&self.rx, None, output, out_off.as_deref_mut(), left, false) {
                Ok(0) => {
                    self.discard_pipe(left);
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "splice wrote nothing",
                    ));
                }
                Ok(w) => left -= w,
                Err(e) if platform::is_refusal(&e) => {
                    // The output refuses splice (e.g. O_APPEND file): move
                    // what is already in the pipe with read/write, and remember
                    // to copy from now on.
                    self.splice_ok = Some(false);
                    return self.drain_by_copy(output, out_off, left);
                }
                Err(e) => {
                    self.discard_pipe(left);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn drain_by_copy(
        &mut self,
        output: &impl AsFd,
        out_off: Option<&mut u64>,
        mut left: usize,
    ) -> io::Result<()> {
        self.ensure_scratch();
        let mut pos = out_off.as_ref().map(|o| **o);
        while left > 0 {
            let want = left.min(self.scratch.len());
            let r = platform::read(&self.rx, &mut self.scratch[..want])?;
            if r == 0 {
                break;
            }
            write_all(output, &self.scratch[..r], pos.as_mut())?;
            left -= r;
        }
        if let (Some(o), Some(p)) = (out_off, pos) {
            *o = p;
        }
        Ok(())
    }

    fn copy(
        &mut self,
        input: &impl AsFd,
        in_off: Option<&mut u64>,
        output: &impl AsFd,
        out_off: Option<&mut u64>,
        want: usize,
    ) -> io::Result<Transfer> {
        self.ensure_scratch();
        let want = want.min(self.scratch.len());
        let n = match in_off {
            Some(off) => {
                let n = platform::pread(input, &mut self.scratch[..want], *off)?;
                *off += n as u64;
                n
            }
            None => platform::read(input, &mut self.scratch[..want])?,
        };
        let mut pos = out_off.as_ref().map(|o| **o);
        write_all(output, &self.scratch[..n], pos.as_mut())?;
        if let (Some(o), Some(p)) = (out_off, pos) {
            *o = p;
        }
        Ok(Transfer::new(n, IoPath::Copy))
    }

    fn ensure_scratch(&mut self) {
        if self.scratch.is_empty() {
            self.scratch = vec![0; self.capacity.clamp(64 * 1024, 1 << 20)];
        }
    }

    /// Best effort: empty the pipe so a later call cannot see stale bytes.
    fn discard_pipe(&mut self, mut left: usize) {
        self.ensure_scratch();
        while left > 0 {
            let want = left.min(self.scratch.len());
            match platform::read(&self.rx, &mut self.scratch[..want]) {
                Ok(0) | Err(_) => break,
                Ok(r) => left -= r,
            }
        }
    }
}

/// Writes all of `buf`, at `*pos` (advanced) when given, else at the
/// descriptor's position.
fn write_all(out: &impl AsFd, mut buf: &[u8], mut pos: Option<&mut u64>) -> io::Result<()> {
    while !buf.is_empty() {
        let w = match pos.as_deref_mut() {
            Some(p) => {
                let w = platform::pwrite(out, buf, *p)?;
                *p += w as u64;
                w
            }
            None => platform::write(out, buf)?,
        };
        if w == 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "write returned 0"));
        }
        buf = &buf[w..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::send::{pattern_byte, pattern_memfd};
    use std::fs::File;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    fn linux() -> bool {
        cfg!(all(target_os = "linux", not(fatpipe_sys_fallback)))
    }

    #[test]
    fn pipe_is_sized() {
        let p = SplicePipe::new(DEFAULT_PIPE_SIZE).unwrap();
        if linux() {
            assert!(p.capacity() >= DEFAULT_PIPE_SIZE, "{}", p.capacity());
        } else {
            assert!(p.capacity() > 0);
        }
        // A silly request never fails construction.
        let small = SplicePipe::new(1).unwrap();
        assert!(small.capacity() >= 4096);
    }

    #[test]
    fn socket_to_file_with_reused_pipe() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let total = 3 << 20;
        let w = std::thread::spawn(move || {
            let data: Vec<u8> = (0..total as u64).map(pattern_byte).collect();
            c.write_all(&data).unwrap();
        });
        let dir = tempfile::tempdir().unwrap();
        let mut out = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("out"))
            .unwrap();
        let mut pipe = SplicePipe::new(256 * 1024).unwrap();
        let mut off = 0u64;
        loop {
            let t = pipe
                .transfer(&s, None, &out, Some(&mut off), usize::MAX)
                .unwrap();
            if t.bytes == 0 {
                break;
            }
            assert_eq!(
                t.path,
                if linux() {
                    IoPath::Splice
                } else {
                    IoPath::Copy
                }
            );
        }
        w.join().unwrap();
        assert_eq!(off, total as u64);
        let mut got = Vec::new();
        out.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), total);
        assert!(got
            .iter()
            .enumerate()
            .all(|(i, &b)| b == pattern_byte(i as u64)));
    }

    #[test]
    fn file_to_socket_and_copy_fallback_agree() {
        let src = pattern_memfd(200_000).unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let r = std::thread::spawn(move || {
            let mut v = Vec::new();
            s.read_to_end(&mut v).unwrap();
            v
        });
        let mut pipe = SplicePipe::new(64 * 1024).unwrap();
        let mut off = 100u64;
        // First half by whatever path the kernel allows, second half forced
        // through the copy path: the receiver must see one seamless stream.
        while off < 100_000 {
            let want = 100_000 - off as usize;
            let t = pipe.transfer(&src, Some(&mut off), &c, None, want).unwrap();
            assert!(t.bytes > 0);
        }
        pipe.splice_ok = Some(false);
        while off < 200_000 {
            let t = pipe
                .transfer(&src, Some(&mut off), &c, None, usize::MAX)
                .unwrap();
            assert_eq!(t.path, IoPath::Copy);
        }
        assert_eq!(
            pipe.transfer(&src, Some(&mut off), &c, None, 10)
                .unwrap()
                .bytes,
            0
        );
        drop(c);
        let got = r.join().unwrap();
        assert_eq!(got.len(), 199_900);
        assert!(got
            .iter()
            .enumerate()
            .all(|(i, &b)| b == pattern_byte(100 + i as u64)));
    }
}
