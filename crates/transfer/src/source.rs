//! The sending half of a session: stream the chunks the receiver needs.
//!
//! Each data connection is a task on the engine's data plane
//! ([`task::SendTask`]) that pops [`Unit`](crate::plan::Unit)s from the
//! shared queue and sends each chunk as header, payload, digest. The
//! digest is computed while sending, piece by piece (256 KiB, so the piece
//! is still in cache when it is hashed and written), on the blocking pool
//! ([`Source::fill`](task)): with `sendfile` the piece is read with `pread`
//! for the hash and handed to the socket from the page cache without
//! another user-space copy; without it, the same buffer is hashed and
//! written. Headers, digests and small files are batched into one fill, so
//! a run of small files costs few system calls.
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
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::beneath;
use crate::hash::Algo;
use crate::io::Limiter;
use crate::manifest::Origin;
use crate::plan::{chunk_range, lock, ChunkRef, Queue};
use crate::wire::{write_msg, Entry, EntryKind, Msg, Summary};
use crate::{Failure, Progress, Reason};

pub(crate) mod task;

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
        let mut c = lock(&self.ctrl);
        if let Some(stream) = c.as_mut() {
            if write_msg(stream, &Msg::FileFailed { file, message }).is_err() {
                // No later report waits on it again; the session's own
                // reads and writes on it fail too.
                *c = None;
            }
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
