//! A sending data connection on the engine's data plane: the runner's
//! I/O threads write, the blocking pool reads and hashes.
//!
//! A thread per data connection put 256 threads (2 MiB stacks) in each
//! process of a `copy -P 256`. Here a connection is a runner task
//! ([`SendTask`]) that writes what its [`Fill`] holds without ever
//! blocking; the file reads and hashing that produce the next fill run as
//! one job on the blocking pool ([`Source::fill`]) while the task parks,
//! and the job wakes it when done. A fill holds about one piece (256 KiB,
//! several small files' chunks batched) so the pool's work and the
//! socket's alternate in steps of the size the threaded sender used.
//! With `sendfile` a piece is read once for its hash on the pool and then
//! handed to the socket from the page cache by the runner, as before.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use fatpipe_engine::dataplane::blocking;
use fatpipe_engine::dataplane::runner::{self, Step, Task, TaskWaker, Wants, QUANTUM_BYTES};
use fatpipe_secure::Stream;

use super::{describe_open, SendError, Source, PIECE};
use crate::beneath;
use crate::hash::ChunkHasher;
use crate::io::{pread_exact, End, Ending};
use crate::manifest::open_origin;
use crate::plan::{chunk_range, lock, ChunkRef, Popped};
use crate::wire::{ChunkHeader, ChunkKind, EntryKind};

/// Bytes a sendfile piece is read in for its hash.
const SCRATCH: usize = 64 * 1024;

/// What a sending connection puts on the wire next, filled on the
/// blocking pool and written by the runner.
#[derive(Default)]
pub(crate) struct Fill {
    /// The unit's chunks not yet begun.
    chunks: VecDeque<ChunkRef>,
    /// A unit was taken since the last fill (the stall hook's point).
    new_unit: bool,
    /// The chunk in progress.
    cur: Option<Cur>,
    /// Bytes to write: headers, pieces, digests.
    out: Vec<u8>,
    /// A piece to send from its file (`sendfile`) after `out`:
    /// file, offset, length.
    seg: Option<(Arc<File>, u64, u64)>,
    /// A sendfile piece read for its hash.
    scratch: Vec<u8>,
    /// Payload bytes, hole bytes and files finished in `out` and `seg`,
    /// counted once they are written.
    moved: u64,
    holes: u64,
    files: u64,
    /// The connection cannot go on: bytes on the wire no longer add up.
    broken: Option<io::Error>,
    /// The rate cap's time before which this fill may not go out.
    not_before: Option<std::time::Instant>,
}

/// A chunk being sent.
struct Cur {
    /// Its file's index in the manifest.
    id: u32,
    file: Arc<File>,
    size: u64,
    off: u64,
    len: u32,
    /// Payload bytes of it filled so far.
    pos: u64,
    hasher: ChunkHasher,
    corrupt: bool,
    sendfile: bool,
}

impl Source {
    /// Fills `f` with about a piece of what its unit still has to send:
    /// opens, checks and reads files, hashes (runs on the blocking pool).
    /// A file that cannot be read before its header went out fails alone;
    /// one that fails part-way through a chunk breaks the connection (the
    /// receiver could not find the next header), which the client's
    /// reconnect turns into a clean failure of that file.
    pub(crate) fn fill(&self, f: &mut Fill, plain: bool) {
        if std::mem::take(&mut f.new_unit) {
            self.stall
                .check("bytes", self.progress.bytes.load(Ordering::Relaxed));
        }
        loop {
            if f.out.len() >= PIECE || f.seg.is_some() || f.broken.is_some() {
                return;
            }
            if let Some(cur) = f.cur.as_mut() {
                let len = u64::from(cur.len);
                if cur.pos >= len {
                    if let Some(cur) = f.cur.take() {
                        f.out.extend_from_slice(cur.hasher.finish().as_bytes());
                        if cur.off + len >= cur.size {
                            f.files += 1;
                        }
                    }
                    continue;
                }
                // At most a piece in `out` (plus a header and a digest):
                // what a connection holds stays a piece whatever it sends.
                let room = if cur.sendfile {
                    PIECE
                } else {
                    PIECE.saturating_sub(f.out.len()).max(4096)
                };
                let p = (len - cur.pos).min(room as u64) as usize;
                let at = cur.off + cur.pos;
                let read = if cur.sendfile {
                    // Read for the hash in small steps: the bytes go to
                    // the socket from the page cache, not from here.
                    f.scratch.resize(SCRATCH, 0);
                    let mut r = Ok(());
                    let mut done = 0usize;
                    while done < p && r.is_ok() {
                        let n = (p - done).min(SCRATCH);
                        r = pread_exact(&cur.file, &mut f.scratch[..n], at + done as u64);
                        if r.is_ok() {
                            cur.hasher.update(&f.scratch[..n]);
                        }
                        done += n;
                    }
                    if r.is_ok() {
                        f.seg = Some((Arc::clone(&cur.file), at, p as u64));
                    }
                    r
                } else {
                    let s = f.out.len();
                    f.out.resize(s + p, 0);
                    let r = pread_exact(&cur.file, &mut f.out[s..], at);
                    if r.is_ok() {
                        cur.hasher.update(&f.out[s..]);
                        if cur.corrupt && cur.pos == 0 {
                            f.out[s] ^= 0x01;
                        }
                    } else {
                        f.out.truncate(s);
                    }
                    r
                };
                if let Err(e) = read {
                    // Its header is out: the receiver would read what
                    // follows as this chunk's bytes.
                    self.fail_local(cur.id, e.to_string());
                    f.broken = Some(io::Error::other(format!(
                        "a file could not be read part-way through a chunk: {e}"
                    )));
                    return;
                }
                if let Some(l) = &self.limiter {
                    // The runner holds the fill until then: a pool thread
                    // never sleeps for a peer's `--bwlimit`.
                    let due = l.reserve(p as u64);
                    f.not_before = Some(f.not_before.map_or(due, |d| d.max(due)));
                }
                cur.pos += p as u64;
                f.moved += p as u64;
                continue;
            }
            let Some(c) = f.chunks.pop_front() else {
                return;
            };
            if lock(&self.failed).contains(&c.file) {
                continue;
            }
            match self.begin_chunk(c, f, plain) {
                Ok(()) => {}
                Err(SendError::File(message)) => self.fail_local(c.file, message),
            }
        }
    }

    /// Checks chunk `c`'s file and puts its header in `f` (a hole's whole
    /// chunk), its state in `f.cur`.
    fn begin_chunk(&self, c: ChunkRef, f: &mut Fill, plain: bool) -> Result<(), SendError> {
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
                f.out.extend_from_slice(&h.encode());
                f.holes += u64::from(len);
                if off + u64::from(len) >= size {
                    f.files += 1;
                }
                return Ok(());
            }
        }
        if len as usize > PIECE {
            // Start reading the whole chunk now (cold cache, disk arrays):
            // the pieces then find it in memory. Advice only.
            let _ = fatpipe_sys::fadvise(&file, off, u64::from(len), fatpipe_sys::Advice::WillNeed);
        }
        let n = self.chunks_sent.fetch_add(1, Ordering::Relaxed) + 1;
        let corrupt = self.opts.corrupt_chunk == Some(n);
        // sendfile would put the file's bytes on the wire past TLS: only
        // on plain connections.
        let sendfile = self.opts.sendfile && !corrupt && len as usize >= PIECE && plain;
        let h = ChunkHeader {
            kind: ChunkKind::Data,
            file: c.file,
            offset: off,
            len,
        };
        self.progress.started();
        f.out.extend_from_slice(&h.encode());
        f.cur = Some(Cur {
            id: c.file,
            file: Arc::new(file),
            size,
            off,
            len,
            pos: 0,
            hasher: self.opts.algo.start(off, u64::from(len)),
            corrupt,
            sendfile,
        });
        Ok(())
    }
}

/// Where a sending task is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Its fill is empty: take the next unit from the queue.
    NeedUnit,
    /// Its fill is on the blocking pool.
    Filling,
    /// Writing its fill.
    Writing,
    /// Writing the `End` header; done after it.
    Ending,
}

/// One sending data connection on the runner.
pub(crate) struct SendTask {
    src: Arc<Source>,
    stream: Stream,
    fd: RawFd,
    plain: bool,
    phase: Phase,
    /// The fill, while the task holds it (not on the pool).
    fill: Option<Box<Fill>>,
    /// Bytes of the fill's `out` written.
    written: usize,
    /// Where the pool's job puts the fill back.
    back: Arc<Mutex<Option<Box<Fill>>>>,
    waker: TaskWaker,
    /// A waiter on the empty queue is registered.
    waiting: Arc<AtomicBool>,
    ended: Ending,
}

/// Starts sending units of `src` on `stream` on the runner (the stream is
/// made non-blocking); `end` gets how it ended.
pub(crate) fn spawn(src: Arc<Source>, stream: Stream, end: End) -> io::Result<runner::TaskHandle> {
    stream.tcp().set_nonblocking(true)?;
    let fd = stream.tcp().as_raw_fd();
    let plain = stream.plain().is_some();
    runner::spawn_with_waker(move |waker| {
        Box::new(SendTask {
            src,
            stream,
            fd,
            plain,
            phase: Phase::NeedUnit,
            fill: Some(Box::default()),
            written: 0,
            back: Arc::new(Mutex::new(None)),
            waker,
            waiting: Arc::new(AtomicBool::new(false)),
            ended: Ending::new(end, "the sending stream failed"),
        })
    })
}

impl SendTask {
    /// Hands the fill to the blocking pool.
    fn submit(&mut self) -> io::Result<Step> {
        let Some(mut f) = self.fill.take() else {
            return Err(io::Error::other("no fill to submit"));
        };
        let (src, back, waker, plain) = (
            Arc::clone(&self.src),
            Arc::clone(&self.back),
            self.waker.clone(),
            self.plain,
        );
        self.phase = Phase::Filling;
        // The session's turn: another session's fills are not queued
        // behind all of this one's.
        blocking::submit_as(
            blocking::Owner::of(&src),
            Box::new(move || {
                let filled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    src.fill(&mut f, plain)
                }));
                if filled.is_err() {
                    f.broken = Some(io::Error::other("the sender's reader failed"));
                }
                *lock(&back) = Some(f);
                waker.wake();
            }),
        )?;
        Ok(Step::Blocked(None))
    }

    /// Moves at most a quantum; `None` once the `End` is out.
    fn step(&mut self) -> io::Result<Option<Step>> {
        let mut moved = 0usize;
        loop {
            match self.phase {
                Phase::Filling => {
                    let Some(f) = lock(&self.back).take() else {
                        return Ok(Some(Step::Blocked(None)));
                    };
                    self.fill = Some(f);
                    self.written = 0;
                    self.phase = Phase::Writing;
                }
                Phase::NeedUnit => {
                    let waiting = Arc::clone(&self.waiting);
                    let waker = self.waker.clone();
                    let popped = self.src.queue.try_pop(
                        || self.src.progress.ran_dry(),
                        || {
                            (!waiting.swap(true, Ordering::AcqRel)).then(|| {
                                Box::new(move || {
                                    waiting.store(false, Ordering::Release);
                                    waker.wake();
                                }) as crate::plan::QueueWaiter
                            })
                        },
                    );
                    let Some(f) = self.fill.as_mut() else {
                        return Err(io::Error::other("no fill"));
                    };
                    match popped {
                        Popped::Unit(u) => {
                            f.chunks = u.chunks.into();
                            f.new_unit = true;
                            return self.submit().map(Some);
                        }
                        Popped::Empty => return Ok(Some(Step::Blocked(None))),
                        Popped::Closed => {
                            f.out.extend_from_slice(&ChunkHeader::end().encode());
                            self.written = 0;
                            self.phase = Phase::Ending;
                        }
                    }
                }
                Phase::Writing | Phase::Ending => {
                    if let Some(at) = self.fill.as_mut().and_then(|f| f.not_before) {
                        // A session that is over (or stopping) waits for
                        // no rate cap: what is left goes or fails now.
                        if at > std::time::Instant::now() && !self.src.queue.is_closed() {
                            return Ok(Some(Step::Sleep(at)));
                        }
                        if let Some(f) = self.fill.as_mut() {
                            f.not_before = None;
                        }
                    }
                    if let Some(step) = self.write_fill(&mut moved)? {
                        return Ok(Some(step));
                    }
                    let Some(f) = self.fill.as_mut() else {
                        return Err(io::Error::other("no fill"));
                    };
                    f.out.clear();
                    self.written = 0;
                    let p = &self.src.progress;
                    p.moved(std::mem::take(&mut f.moved));
                    p.bytes
                        .fetch_add(std::mem::take(&mut f.holes), Ordering::Relaxed);
                    p.files
                        .fetch_add(std::mem::take(&mut f.files), Ordering::Relaxed);
                    if let Some(e) = f.broken.take() {
                        return Err(e);
                    }
                    if self.phase == Phase::Ending {
                        return Ok(None);
                    }
                    if f.cur.is_some() || !f.chunks.is_empty() {
                        if moved >= QUANTUM_BYTES {
                            return Ok(Some(Step::Again));
                        }
                        return self.submit().map(Some);
                    }
                    self.phase = Phase::NeedUnit;
                }
            }
        }
    }

    /// Writes what the fill holds; a step to return when it cannot all
    /// go now (the socket is full, or the quantum is used).
    fn write_fill(&mut self, moved: &mut usize) -> io::Result<Option<Step>> {
        let Some(f) = self.fill.as_mut() else {
            return Err(io::Error::other("no fill"));
        };
        while self.written < f.out.len() {
            if *moved >= QUANTUM_BYTES {
                return Ok(Some(Step::Again));
            }
            match (&self.stream).write(&f.out[self.written..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.written += n;
                    *moved += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Ok(Some(Step::Blocked(None)))
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if let Some((file, off, left)) = f.seg.as_mut() {
            let Some(tcp) = self.stream.plain() else {
                return Err(io::Error::other("sendfile on an encrypted stream"));
            };
            while *left > 0 {
                if *moved >= QUANTUM_BYTES {
                    return Ok(Some(Step::Again));
                }
                let want = usize::try_from(*left).unwrap_or(usize::MAX).min(1 << 30);
                match fatpipe_sys::sendfile(tcp, &**file, off, want) {
                    Ok(t) if t.bytes == 0 => {
                        // The file shrank after it was read for the hash:
                        // the bytes on the wire no longer add up.
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("file ended with {left} bytes still to send"),
                        ));
                    }
                    Ok(t) => {
                        if t.path == fatpipe_sys::IoPath::Sendfile {
                            self.src.used_sendfile.store(true, Ordering::Relaxed);
                        }
                        *left -= t.bytes as u64;
                        *moved += t.bytes;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        return Ok(Some(Step::Blocked(None)))
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            f.seg = None;
        }
        // An encrypted stream may hold sealed bytes the socket had no
        // room for.
        match (&self.stream).flush() {
            Ok(()) => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Some(Step::Blocked(None))),
            Err(e) => Err(e),
        }
    }
}

impl Task for SendTask {
    fn fd(&self) -> RawFd {
        self.fd
    }

    fn wants(&self) -> Wants {
        Wants::Write
    }

    fn turn(&mut self) -> Step {
        let r = match self.step() {
            Ok(Some(step)) => return step,
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        self.ended.finish(r);
        Step::Done
    }
}
