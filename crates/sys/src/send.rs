//! `sendfile` from files to sockets, and a pattern-filled memfd so test
//! traffic can use it too.
//!
//! `sendfile` hands page-cache pages to the socket, so the sender never
//! copies payload through user space. The copy engine uses it for file
//! chunks; the test engine uses it with [`pattern_memfd`] — a memory file
//! holding a repeating pattern — to get the same zero-copy send for
//! memory-to-memory tests, which is what `iperf3 -Z` does.
//!
//! When the kernel refuses `sendfile` for a pair of descriptors (a source
//! that cannot be mapped, an old kernel, a non-Linux platform) the call
//! copies through a buffer instead and says so in its [`Transfer`]; each
//! call returns after one write, so the semantics (bytes moved, offset
//! advanced) are the same on both paths.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;

use crate::{platform, IoPath, Transfer};

/// The pattern in [`pattern_memfd`] repeats every this many bytes; a
/// receiver that wants to verify payload can regenerate it from the offset.
pub const PATTERN_PERIOD: usize = 251;

/// Bytes one copy-fallback call moves at most.
const COPY_CHUNK: usize = 256 * 1024;

/// Sends up to `len` bytes of `input` starting at `*offset` to `out` in one
/// call, advancing `*offset` by the bytes sent. Does not move `input`'s
/// file position. Returns `bytes == 0` only at end of file (or `len == 0`).
///
/// Uses `sendfile(2)`; when the kernel refuses it for these descriptors,
/// reads with `pread` and writes once, reporting [`IoPath::Copy`]. Errors
/// from `out` (e.g. `WouldBlock` on a non-blocking socket, a reset peer)
/// are returned as they are.
pub fn sendfile(
    out: impl AsFd,
    input: impl AsFd,
    offset: &mut u64,
    len: usize,
) -> io::Result<Transfer> {
    if len == 0 {
        return Ok(Transfer::new(0, IoPath::Sendfile));
    }
    match platform::sendfile(&out, &input, offset, len) {
        Ok(n) => Ok(Transfer::new(n, IoPath::Sendfile)),
        Err(e) if platform::is_refusal(&e) => copy_once(&out, &input, offset, len),
        Err(e) => Err(e),
    }
}

/// Sends exactly `len` bytes of `input` from `offset` to a blocking `out`,
/// looping over [`sendfile`]. Returns the path of the last call (the path
/// does not change within one descriptor pair). Fails with `UnexpectedEof`
/// if the file ends first.
pub fn sendfile_all(
    out: impl AsFd,
    input: impl AsFd,
    mut offset: u64,
    len: u64,
) -> io::Result<Transfer> {
    let mut left = len;
    let mut path = IoPath::Sendfile;
    while left > 0 {
        let chunk = usize::try_from(left).unwrap_or(usize::MAX).min(1 << 30);
        let t = sendfile(&out, &input, &mut offset, chunk)?;
        path = t.path;
        if t.bytes == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("file ended with {left} bytes still to send"),
            ));
        }
        left -= t.bytes as u64;
    }
    Ok(Transfer::new(
        usize::try_from(len).unwrap_or(usize::MAX),
        path,
    ))
}

/// A read-only-in-spirit memory file of `size` bytes filled with a
/// repeating pattern (byte `i` is `i % PATTERN_PERIOD`), for zero-copy test
/// traffic via [`sendfile`]. A prime period keeps the pattern from lining
/// up with page or segment boundaries, so misplaced data is detectable.
///
/// Uses `memfd_create` on Linux; elsewhere an unlinked temporary file.
pub fn pattern_memfd(size: usize) -> io::Result<File> {
    let file = match platform::memfd(c"fatpipe-pattern") {
        Ok(fd) => File::from(fd),
        Err(e) if e.kind() == io::ErrorKind::Unsupported => unlinked_temp_file()?,
        Err(e) => return Err(e),
    };
    let block: Vec<u8> = (0..COPY_CHUNK - COPY_CHUNK % PATTERN_PERIOD)
        .map(|i| (i % PATTERN_PERIOD) as u8)
        .collect();
    let mut off = 0usize;
    while off < size {
        let n = block.len().min(size - off);
        // Blocks are a whole number of periods, so each starts at phase 0.
        let w = platform::pwrite(&file, &block[..n], off as u64)?;
        if w == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "pattern file full",
            ));
        }
        if w < n {
            // A short write breaks the phase; finish this block byte-exact.
            let mut done = w;
            while done < n {
                done += platform::pwrite(&file, &block[done..n], (off + done) as u64)?;
            }
        }
        off += n;
    }
    Ok(file)
}

/// The pattern byte at `offset` of a [`pattern_memfd`] file.
pub fn pattern_byte(offset: u64) -> u8 {
    (offset % PATTERN_PERIOD as u64) as u8
}

fn copy_once(
    out: &impl AsFd,
    input: &impl AsFd,
    offset: &mut u64,
    len: usize,
) -> io::Result<Transfer> {
    let mut buf = vec![0u8; len.min(COPY_CHUNK)];
    let n = platform::pread(input, &mut buf, *offset)?;
    if n == 0 {
        return Ok(Transfer::new(0, IoPath::Copy));
    }
    // One write: whatever it accepts is what moved; the rest is re-read
    // next call from the advanced offset, exactly like sendfile.
    let w = platform::write(out, &buf[..n])?;
    *offset += w as u64;
    Ok(Transfer::new(w, IoPath::Copy))
}

fn unlinked_temp_file() -> io::Result<File> {
    let dir = std::env::temp_dir();
    for attempt in 0..16u32 {
        let name = dir.join(format!(
            ".fatpipe-pattern-{}-{}-{attempt}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
        ));
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&name)
        {
            Ok(f) => {
                std::fs::remove_file(&name)?;
                return Ok(f);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        "could not create a temporary pattern file",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::unix::net::UnixStream;

    fn linux() -> bool {
        cfg!(all(target_os = "linux", not(fatpipe_sys_fallback)))
    }

    #[test]
    fn pattern_memfd_has_the_pattern() {
        let size = 3 * COPY_CHUNK + 12345;
        let mut f = pattern_memfd(size).unwrap();
        let mut all = Vec::new();
        f.read_to_end(&mut all).unwrap();
        assert_eq!(all.len(), size);
        for (i, b) in all.iter().enumerate() {
            assert_eq!(*b, pattern_byte(i as u64), "byte {i}");
        }
    }

    #[test]
    fn sendfile_really_sends_the_bytes() {
        let size = 5 << 20;
        let f = pattern_memfd(size).unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            got
        });
        // Start mid-file to prove the offset is honoured.
        let start = 1000u64;
        let t = sendfile_all(&c, &f, start, (size as u64) - start).unwrap();
        assert_eq!(t.bytes, size - start as usize);
        assert_eq!(
            t.path,
            if linux() {
                IoPath::Sendfile
            } else {
                IoPath::Copy
            }
        );
        drop(c);
        let got = reader.join().unwrap();
        assert_eq!(got.len(), size - start as usize);
        assert!(got
            .iter()
            .enumerate()
            .all(|(i, &b)| b == pattern_byte(start + i as u64)));
    }

    #[test]
    fn sendfile_reports_eof_and_keeps_offset() {
        let f = pattern_memfd(100).unwrap();
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut off = 60;
        let t = sendfile(&a, &f, &mut off, 1000).unwrap();
        assert_eq!(t.bytes, 40);
        assert_eq!(off, 100);
        assert_eq!(sendfile(&a, &f, &mut off, 1000).unwrap().bytes, 0);
        let e = sendfile_all(&a, &f, 90, 20).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        drop(a);
        let mut got = Vec::new();
        b.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), 50);
    }

    #[test]
    fn refused_sendfile_falls_back_to_copy() {
        // A socket is not a valid sendfile source: the kernel says EINVAL
        // and we must copy instead, with the same result.
        let (rx, mut tx) = UnixStream::pair().unwrap();
        tx.write_all(b"hello socket").unwrap();
        drop(tx);
        // pread on a socket fails (ESPIPE), so the copy path reports that
        // error rather than silently losing data.
        let (a, _b) = UnixStream::pair().unwrap();
        let mut off = 0;
        let e = sendfile(&a, &rx, &mut off, 10).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESPIPE));
        assert_eq!(off, 0);
    }

    #[test]
    fn copy_fallback_moves_the_same_bytes() {
        let f = pattern_memfd(70_000).unwrap();
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut off = 5;
        let t = copy_once(&a, &f, &mut off, 10).unwrap();
        assert_eq!((t.bytes, t.path, off), (10, IoPath::Copy, 15));
        drop(a);
        let mut got = Vec::new();
        b.read_to_end(&mut got).unwrap();
        let want: Vec<u8> = (5..15).map(pattern_byte).collect();
        assert_eq!(got, want);
    }
}
