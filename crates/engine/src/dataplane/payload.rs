//! One shared, read-only payload pattern per process.
//!
//! A sending test stream writes the same bytes over and over. Giving each
//! stream its own buffer of the peer-chosen length (up to 16 MiB) let one
//! keyless `test -R -P 128 -l 16M` commit gigabytes on the server. Here
//! every stream asks for the pattern and gets a slice of one buffer (or one
//! memory file, for `sendfile`) that all of them share.
//!
//! The buffer is sized to a power of two of at least the length asked and
//! at most [`MAX_PAYLOAD`], and kept for the life of the process: a
//! stream that starts after all others ended (a thousand threads on two
//! cores start late) must not build it again, each rebuild leaving 16 MiB
//! resident in a malloc arena. A longer request replaces it with a larger
//! one (streams holding the old one keep it until they end), so at most one
//! buffer of each power of two is alive: below 2 × [`MAX_PAYLOAD`] in all,
//! [`MAX_PAYLOAD`] once they end; the same for each of the
//! [`FILE_STRIPES`] memory files.
//!
//! The pattern is `fatpipe_sys::pattern_byte`'s (byte `i` is `i % 251`),
//! the same in the buffer and the file, so a receiver can check either.

use std::fs::File;
use std::io;
use std::ops::Deref;
use std::sync::{Arc, Mutex, MutexGuard};

/// The longest payload pattern handed out: the test's largest write
/// length. Longer requests get a pattern this long.
pub const MAX_PAYLOAD: usize = 16 << 20;

/// A shared pattern buffer seen as `len` bytes.
#[derive(Debug, Clone)]
pub struct Payload {
    buf: Arc<[u8]>,
    len: usize,
}

impl Deref for Payload {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// A shared pattern memory file of at least `len` bytes, for `sendfile`
/// from offset 0 (concurrent `sendfile`s with their own offsets do not
/// move the file's position, so streams share it freely).
#[derive(Debug, Clone)]
pub struct PayloadFile {
    file: Arc<File>,
    len: usize,
}

impl PayloadFile {
    /// The file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Bytes of the pattern a stream may send from offset 0.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when `len` was 0.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The shared pattern as `len` bytes (at most [`MAX_PAYLOAD`]).
pub fn pattern(len: usize) -> Payload {
    static BUF: Mutex<Option<Arc<[u8]>>> = Mutex::new(None);
    let len = len.min(MAX_PAYLOAD);
    let mut held = lock(&BUF);
    if let Some(buf) = held.as_ref().filter(|b| b.len() >= len) {
        return Payload {
            buf: Arc::clone(buf),
            len,
        };
    }
    let buf: Arc<[u8]> = (0..size_for(len) as u64)
        .map(fatpipe_sys::pattern_byte)
        .collect();
    *held = Some(Arc::clone(&buf));
    Payload { buf, len }
}

/// Memory files the zero-copy senders are spread over. `sendfile` takes a
/// reference on every page it sends, an atomic on the page's own cache
/// line: streams on different cores sending the same pages bounce those
/// lines between them (in alternating runs on a loaded 2-core host, 4
/// `-Z` streams on one file had medians 1-8 % below those on files of
/// their own; noisy). A few copies, taken round robin by stream, keep
/// concurrent streams on different pages for a bounded cost.
pub const FILE_STRIPES: usize = 4;

/// A shared pattern memory file, holding at least `len` bytes (at most
/// [`MAX_PAYLOAD`]): copy `stripe % FILE_STRIPES` of it (pass the stream's
/// number).
pub fn pattern_file(len: usize, stripe: usize) -> io::Result<PayloadFile> {
    // Each copy and its size.
    type Slot = Mutex<Option<(Arc<File>, usize)>>;
    static FILES: [Slot; FILE_STRIPES] = [const { Mutex::new(None) }; FILE_STRIPES];
    let len = len.min(MAX_PAYLOAD);
    let mut held = lock(&FILES[stripe % FILE_STRIPES]);
    if let Some((file, _)) = held.as_ref().filter(|(_, size)| *size >= len) {
        return Ok(PayloadFile {
            file: Arc::clone(file),
            len,
        });
    }
    let size = size_for(len);
    let file = Arc::new(fatpipe_sys::pattern_memfd(size)?);
    *held = Some((Arc::clone(&file), size));
    Ok(PayloadFile { file, len })
}

/// The size a new pattern gets for a request of `len` bytes.
fn size_for(len: usize) -> usize {
    len.max(1).next_power_of_two().min(MAX_PAYLOAD)
}

/// Locks a mutex, taking the value even if a thread panicked holding it:
/// the values are replaced whole, never left half-written.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn streams_share_one_buffer_that_holds_the_pattern() {
        let a = pattern(1000);
        let b = pattern(700);
        assert_eq!((a.len(), b.len()), (1000, 700));
        assert!(Arc::ptr_eq(&a.buf, &b.buf), "one buffer, two views");
        assert!(a
            .iter()
            .enumerate()
            .all(|(i, &x)| x == fatpipe_sys::pattern_byte(i as u64)));
        // A longer request gets a larger buffer; the shorter views keep theirs.
        let c = pattern(5000);
        assert_eq!(c.len(), 5000);
        assert!(c.buf.len() >= 5000);
        assert!(c
            .iter()
            .enumerate()
            .all(|(i, &x)| x == fatpipe_sys::pattern_byte(i as u64)));
        assert!(Arc::ptr_eq(&c.buf, &pattern(10).buf));
        assert_eq!(&a[..], &c[..1000]);
    }

    #[test]
    fn a_request_past_the_cap_gets_the_cap() {
        assert_eq!(size_for(0), 1);
        assert_eq!(size_for(1000), 1024);
        assert_eq!(size_for(MAX_PAYLOAD), MAX_PAYLOAD);
        assert_eq!(size_for(usize::MAX / 2), MAX_PAYLOAD);
    }

    #[test]
    fn streams_share_one_file_that_holds_the_pattern() {
        let a = pattern_file(3000, 1).unwrap();
        let b = pattern_file(100, 1 + FILE_STRIPES).unwrap();
        assert!(Arc::ptr_eq(&a.file, &b.file), "one file per stripe");
        let c = pattern_file(100, 2).unwrap();
        assert!(
            !Arc::ptr_eq(&a.file, &c.file),
            "another stripe, another file"
        );
        assert_eq!(b.len(), 100);
        let mut got = Vec::new();
        (&*a.file).read_to_end(&mut got).unwrap();
        assert!(got.len() >= 3000);
        assert!(got
            .iter()
            .enumerate()
            .all(|(i, &x)| x == fatpipe_sys::pattern_byte(i as u64)));
    }
}
