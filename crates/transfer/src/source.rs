//! The sending half of a session: stream the chunks the receiver needs.
//!
//! One thread per data connection pops [`Unit`]s from the shared queue and
//! sends each chunk as header, payload, digest. The digest is computed while
//! sending, piece by piece (256 KiB, so the piece is still in cache when it
//! is hashed and written): with `sendfile` the piece is read once with
//! `pread` for the hash and handed to the socket from the page cache without
//! another user-space copy; without it, the same buffer is hashed and
//! written. Small writes (headers, digests, small files) go through a
//! buffered writer so a run of small files costs few system calls.
//!
//! Holes in sparse files are found with `SEEK_DATA` and sent as `Hole`
//! chunks with no payload. A file that vanishes, shrinks or changes while
//! being sent fails alone (`FileFailed` to the receiver); a broken
//! connection fails the session, which the client's driver retries.
//!
//! A test hook, `FATPIPE_TEST_CORRUPT_CHUNK=n`, flips one bit of the n-th
//! data chunk on the wire (after its digest was computed), so tests can show
//! that the receiver detects it and the chunk is sent again. It is read only
//! in builds with the `test-hooks` feature; others ignore the variable.

use fatpipe_secure::Stream;
use std::collections::HashSet;
use std::io::{self, BufWriter, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::beneath;
use crate::hash::Algo;
use crate::io::{pread_exact, AlignedBuf, Limiter};
use crate::manifest::{open_origin, Origin};
use crate::plan::{chunk_range, lock, ChunkRef, Queue};
use crate::wire::{write_msg, ChunkHeader, ChunkKind, Entry, EntryKind, Msg, Summary};
use crate::{Failure, Progress, Reason};

/// The size of one read-hash-send step.
pub const PIECE: usize = 256 * 1024;

/// How the sender reads and sends.
#[derive(Debug, Clone, Copy)]
pub struct SourceOptions {
    /// Chunk size in force.
    pub chunk_size: u32,
    /// Checksum in force.
    pub algo: Algo,
    /// Use `sendfile` for payloads.
    pub sendfile: bool,
    /// Rate cap in bits per second for all streams together.
    pub bwlimit: Option<u64>,
    /// Test hook: flip a bit in this data chunk (1-based count).
    pub corrupt_chunk: Option<u64>,
}

impl SourceOptions {
    /// Reads the corruption test hook from the environment.
    pub fn corrupt_from_env() -> Option<u64> {
        crate::test_hook("FATPIPE_TEST_CORRUPT_CHUNK")?.parse().ok()
    }
}

/// The sender's shared state.
pub struct Source {
    entries: Vec<Entry>,
    origins: Vec<Option<Origin>>,
    opts: SourceOptions,
    queue: Queue,
    failed: Mutex<HashSet<u32>>,
    failures: Mutex<Vec<Failure>>,
    ctrl: Mutex<Option<Stream>>,
    limiter: Option<Limiter>,
    chunks_sent: AtomicU64,
    used_sendfile: AtomicBool,
    done: Mutex<Option<Summary>>,
    progress: Arc<Progress>,
    stall: crate::Stall,
}

enum SendError {
    /// The file could not be read: fail this file only.
    File(String),
    /// The connection broke: fail the session.
    Net(io::Error),
}

impl Source {
    /// A sender for `entries` (with their `origins`), with nothing queued.
    pub fn new(
        entries: Vec<Entry>,
        origins: Vec<Option<Origin>>,
        opts: SourceOptions,
        progress: Arc<Progress>,
    ) -> Source {
        Source {
            entries,
            origins,
            limiter: opts.bwlimit.map(Limiter::new),
            opts,
            queue: Queue::default(),
            failed: Mutex::new(HashSet::new()),
            failures: Mutex::new(Vec::new()),
            ctrl: Mutex::new(None),
            chunks_sent: AtomicU64::new(0),
            used_sendfile: AtomicBool::new(false),
            done: Mutex::new(None),
            progress,
            stall: crate::Stall::default(),
        }
    }

    /// The manifest entries.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Queues the receiver's needs.
    pub fn plan(&self, needs: &[crate::wire::Need]) {
        let units = crate::plan::plan(needs, self.opts.chunk_size, |f| self.size_of(f));
        for u in units.into_iter().rev() {
            self.queue.push_front(u);
        }
    }

    /// Counts what the receiver already has (skipped files, resumed chunks)
    /// as done, so a progress display of a resumed copy ends at 100%.
    pub fn account_done_before(&self, needs: &[crate::wire::Need]) {
        let mut needed_bytes = 0u64;
        let mut needed_files = 0u64;
        for n in needs {
            let size = self.size_of(n.file);
            needed_files += 1;
            for &(a, b) in &n.ranges {
                for c in a..b {
                    needed_bytes +=
                        chunk_range(size, self.opts.chunk_size, c).map_or(0, |r| u64::from(r.1));
                }
            }
        }
        let files = self
            .entries
            .iter()
            .filter(|e| matches!(e.kind, EntryKind::File { .. }))
            .count() as u64;
        let total: u64 = (0..self.entries.len() as u32)
            .map(|f| self.size_of(f))
            .sum();
        self.progress
            .bytes
            .store(total.saturating_sub(needed_bytes), Ordering::Relaxed);
        self.progress
            .files
            .store(files.saturating_sub(needed_files), Ordering::Relaxed);
    }

    /// Gives the sender the control connection it reports failures on.
    pub fn set_control(&self, ctrl: Stream) {
        *lock(&self.ctrl) = Some(ctrl);
    }

    /// Writes one control message under the same lock as every other
    /// report, so frames never interleave.
    pub fn send_control(&self, msg: &Msg) -> io::Result<()> {
        match lock(&self.ctrl).as_mut() {
            Some(c) => write_msg(c, msg),
            None => Err(io::Error::from(io::ErrorKind::NotConnected)),
        }
    }

    /// Handles one control message from the receiver. Returns true when the
    /// receiver said it is done.
    pub fn handle(&self, msg: Msg) -> Result<bool, String> {
        match msg {
            Msg::Resend { file, chunk } => {
                if chunk_range(self.size_of(file), self.opts.chunk_size, chunk).is_none() {
                    return Err(format!("resend of unknown chunk {chunk} of file {file}"));
                }
                self.queue.push_front(crate::plan::Unit {
                    chunks: vec![ChunkRef { file, chunk }],
                });
                Ok(false)
            }
            Msg::FileFailed { file, message } => {
                if lock(&self.failed).insert(file) {
                    let path = self
                        .entries
                        .get(file as usize)
                        .map(|e| e.path.display())
                        .unwrap_or_else(|| format!("#{file}"));
                    lock(&self.failures).push(Failure::new(path, message));
                }
                Ok(false)
            }
            Msg::Done(summary) => {
                *lock(&self.done) = Some(summary);
                self.queue.close();
                Ok(true)
            }
            Msg::Abort { message } => Err(format!("the receiver aborted: {message}")),
            other => Err(format!("unexpected message {other:?}")),
        }
    }

    /// Stops all sending threads (session over or broken).
    pub fn stop(&self) {
        self.queue.close();
    }

    /// The receiver's summary, once it said done.
    pub fn done(&self) -> Option<Summary> {
        lock(&self.done).clone()
    }

    /// Files that failed on either side.
    pub fn failures(&self) -> Vec<Failure> {
        lock(&self.failures).clone()
    }

    /// The read/send path used.
    pub fn io_path(&self) -> &'static str {
        if self.used_sendfile.load(Ordering::Relaxed) {
            "pread+sendfile"
        } else {
            "pread+write"
        }
    }

    /// Sends queued units on `stream` until the queue closes, then `End`.
    pub fn send(&self, stream: Stream) -> io::Result<()> {
        let mut w = BufWriter::with_capacity(PIECE, stream);
        let mut buf = AlignedBuf::new(PIECE);
        while let Some(unit) = self.queue.pop_or_idle(|| self.progress.ran_dry()) {
            self.stall
                .check("bytes", self.progress.bytes.load(Ordering::Relaxed));
            for c in unit.chunks {
                if lock(&self.failed).contains(&c.file) {
                    continue;
                }
                match self.send_chunk(&mut w, c, &mut buf) {
                    Ok(()) => {}
                    Err(SendError::Net(e)) => return Err(e),
                    Err(SendError::File(message)) => self.fail_local(c.file, message),
                }
            }
            w.flush()?;
        }
        w.write_all(&ChunkHeader::end().encode())?;
        w.flush()
    }

    fn size_of(&self, file: u32) -> u64 {
        match self.entries.get(file as usize).map(|e| &e.kind) {
            Some(EntryKind::File { size, .. }) => *size,
            _ => 0,
        }
    }

    fn fail_local(&self, file: u32, message: String) {
        if !lock(&self.failed).insert(file) {
            return;
        }
        let path = self.entries[file as usize].path.display();
        let message = Reason::from(message);
        lock(&self.failures).push(Failure::new(path, message.clone()));
        if let Some(c) = lock(&self.ctrl).as_mut() {
            let _ = write_msg(c, &Msg::FileFailed { file, message });
        }
    }

    fn send_chunk(
        &self,
        w: &mut BufWriter<Stream>,
        c: ChunkRef,
        buf: &mut AlignedBuf,
    ) -> Result<(), SendError> {
        let fi = c.file as usize;
        let (Some(entry), Some(Some(origin))) = (self.entries.get(fi), self.origins.get(fi)) else {
            return Err(SendError::File("not a regular file".into()));
        };
        let EntryKind::File { size, sparse } = entry.kind else {
            return Err(SendError::File("not a regular file".into()));
        };
        let Some((off, len)) = chunk_range(size, self.opts.chunk_size, c.chunk) else {
            return Err(SendError::File(format!("no chunk {}", c.chunk)));
        };
        let file = open_origin(origin).map_err(|e| SendError::File(describe_open(e)))?;
        let now = beneath::fstat(&file).map_err(|e| SendError::File(e.to_string()))?;
        if now.size != size || now.mtime_s != entry.mtime_s || now.mtime_ns != entry.mtime_ns {
            return Err(SendError::File(
                "changed while being copied (re-run to copy the new version)".into(),
            ));
        }
        let net = SendError::Net;
        if sparse {
            let next =
                beneath::next_data(&file, off).map_err(|e| SendError::File(e.to_string()))?;
            if next.is_none_or(|d| d >= off + u64::from(len)) {
                let h = ChunkHeader {
                    kind: ChunkKind::Hole,
                    file: c.file,
                    offset: off,
                    len,
                };
                w.write_all(&h.encode()).map_err(net)?;
                self.progress
                    .bytes
                    .fetch_add(u64::from(len), Ordering::Relaxed);
                self.count_file(size, off, len);
                return Ok(());
            }
        }
        if len as usize > PIECE {
            // Start reading the whole chunk now (cold cache, disk arrays):
            // the pieces below then find it in memory. Advice only.
            let _ = fatpipe_sys::fadvise(&file, off, u64::from(len), fatpipe_sys::Advice::WillNeed);
        }
        let n = self.chunks_sent.fetch_add(1, Ordering::Relaxed) + 1;
        let corrupt = self.opts.corrupt_chunk == Some(n);
        let use_sendfile = self.opts.sendfile
            && !corrupt
            && len as usize >= PIECE
            && w.get_ref().plain().is_some();
        let h = ChunkHeader {
            kind: ChunkKind::Data,
            file: c.file,
            offset: off,
            len,
        };
        self.progress.started();
        w.write_all(&h.encode()).map_err(net)?;
        if use_sendfile {
            w.flush().map_err(net)?;
        }
        let mut hasher = self.opts.algo.start(off, u64::from(len));
        let mut pos = 0u64;
        let mut first = true;
        while pos < u64::from(len) {
            let p = (u64::from(len) - pos).min(PIECE as u64) as usize;
            let piece = &mut buf.bytes_mut()[..p];
            pread_exact(&file, piece, off + pos).map_err(|e| SendError::File(e.to_string()))?;
            hasher.update(piece);
            if let Some(l) = &self.limiter {
                l.take(p as u64);
            }
            if use_sendfile {
                // `use_sendfile` holds only for plain streams: sendfile
                // would put the file's bytes on the wire past TLS.
                let Some(tcp) = w.get_ref().plain() else {
                    return Err(SendError::Net(io::Error::other(
                        "sendfile on an encrypted stream",
                    )));
                };
                match fatpipe_sys::sendfile_all(tcp, &file, off + pos, p as u64) {
                    Ok(t) => {
                        if t.path == fatpipe_sys::IoPath::Sendfile {
                            self.used_sendfile.store(true, Ordering::Relaxed);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        // The file shrank after the first check: the bytes
                        // already on the wire no longer add up; the session
                        // cannot resynchronise this connection.
                        return Err(SendError::Net(e));
                    }
                    Err(e) => return Err(SendError::Net(e)),
                }
            } else {
                if corrupt && first {
                    piece[0] ^= 0x01;
                }
                w.write_all(piece).map_err(net)?;
            }
            first = false;
            pos += p as u64;
            self.progress.moved(p as u64);
        }
        w.write_all(hasher.finish().as_bytes()).map_err(net)?;
        self.count_file(size, off, len);
        Ok(())
    }

    fn count_file(&self, size: u64, off: u64, len: u32) {
        if off + u64::from(len) >= size {
            self.progress.files.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn describe_open(e: beneath::ResolveError) -> String {
    match e {
        beneath::ResolveError::Io(e) if e.kind() == io::ErrorKind::NotFound => {
            "vanished before it could be sent".into()
        }
        other => other.to_string(),
    }
}
