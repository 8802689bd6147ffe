//! Receiving and throwing away: the receive side of memory-to-memory tests.
//!
//! A throughput test's receiver does not want the bytes, only their count.
//! On TCP, Linux honours `recv(MSG_TRUNC)` by dropping queued data without
//! copying it to user space, which removes the receiver's biggest CPU cost
//! (the copy) and lets one core sink far more than iperf's `read` loop. The
//! flag means something else on other socket types and other systems, so
//! [`Discarder`] tries it once per socket, and on refusal (`EFAULT` for the
//! null buffer, `EINVAL`, `Unsupported`) falls back to reading into a
//! scratch buffer for the rest of that socket's life.

use std::io;
use std::os::fd::AsFd;

use crate::{platform, IoPath, Transfer};

/// Scratch buffer size for the copying fallback.
const SCRATCH: usize = 256 * 1024;

/// Discards received stream data, remembering whether `MSG_TRUNC` works.
/// Keep one per socket (the answer can differ between socket types).
#[derive(Debug)]
pub struct Discarder {
    scratch: Vec<u8>,
    trunc: Option<bool>,
}

impl Default for Discarder {
    fn default() -> Self {
        Discarder::new()
    }
}

impl Discarder {
    /// A discarder that has not yet tried `MSG_TRUNC`.
    pub fn new() -> Self {
        Discarder {
            scratch: Vec::new(),
            trunc: None,
        }
    }

    /// Receives and drops up to `len` bytes; `bytes == 0` means the peer
    /// closed. Blocks like `recv` on a blocking socket. The path is
    /// [`IoPath::RecvTrunc`] when the kernel dropped the data without
    /// copying, [`IoPath::Copy`] when it went through the scratch buffer.
    pub fn recv(&mut self, fd: impl AsFd, len: usize) -> io::Result<Transfer> {
        if self.trunc != Some(false) {
            match platform::recv_trunc(&fd, len) {
                Ok(n) => {
                    self.trunc = Some(true);
                    return Ok(Transfer::new(n, IoPath::RecvTrunc));
                }
                Err(e) if self.trunc.is_none() && refused(&e) => self.trunc = Some(false),
                Err(e) => return Err(e),
            }
        }
        if self.scratch.is_empty() {
            self.scratch = vec![0; SCRATCH];
        }
        let want = len.min(self.scratch.len());
        let n = platform::recv(&fd, &mut self.scratch[..want], 0)?;
        Ok(Transfer::new(n, IoPath::Copy))
    }
}

fn refused(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EFAULT) || platform::is_refusal(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::os::unix::net::UnixStream;

    fn linux() -> bool {
        cfg!(all(target_os = "linux", not(fatpipe_sys_fallback)))
    }

    #[test]
    fn discards_and_counts_every_tcp_byte() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let total = 8 << 20;
        let w = std::thread::spawn(move || {
            let block = vec![0x5au8; 1 << 16];
            for _ in 0..total / block.len() {
                c.write_all(&block).unwrap();
            }
            // Then a marker the receiver must still see after discarding.
            c.write_all(b"END").unwrap();
        });
        let mut d = Discarder::new();
        let mut got = 0;
        while got < total {
            let t = d.recv(&s, total - got).unwrap();
            assert!(t.bytes > 0, "early EOF at {got}");
            let want = if linux() {
                IoPath::RecvTrunc
            } else {
                IoPath::Copy
            };
            assert_eq!(t.path, want);
            got += t.bytes;
        }
        assert_eq!(got, total, "discarded exactly what was asked");
        assert_eq!(d.trunc, Some(linux()));
        w.join().unwrap();
        let mut end = [0u8; 3];
        let mut n = 0;
        while n < 3 {
            n += platform::recv(&s, &mut end[n..], 0).unwrap();
        }
        assert_eq!(&end, b"END");
        assert_eq!(d.recv(&s, 100).unwrap().bytes, 0, "EOF after close");
    }

    #[test]
    fn non_tcp_socket_falls_back_to_copy() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&[1u8; 1000]).unwrap();
        drop(a);
        let mut d = Discarder::new();
        let mut got = 0;
        loop {
            let t = d.recv(&b, 300).unwrap();
            if t.bytes == 0 {
                break;
            }
            assert!(t.bytes <= 300);
            got += t.bytes;
            // MSG_TRUNC on a Unix stream either refuses the null buffer
            // (then we copy) or, on kernels that discard there too, works.
            assert!(t.path == IoPath::Copy || t.path == IoPath::RecvTrunc);
        }
        assert_eq!(got, 1000);
    }
}
