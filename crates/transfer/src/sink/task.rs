//! A receiving data connection on the engine's data plane: the runner's
//! I/O threads read, the blocking pool hashes, writes and verifies.
//!
//! A [`RecvTask`] reads headers and digests through a small buffer and a
//! chunk's data straight into the aligned write buffer (as the threaded
//! receiver did, no extra copy), without ever blocking. Each full write
//! unit (up to [`WRITE_UNIT`]), and each chunk's end with its digest, goes to
//! the blocking pool as one job ([`Sink::absorb`]: hash, gathered write,
//! digest check, journal, rename); the task stops reading until it is
//! back, so a connection holds one buffer whatever the pool's queue, and
//! the peer's sends wait in TCP's window, as they did for a thread.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use fatpipe_engine::dataplane::runner::{self, Step, Task, TaskWaker, Wants, QUANTUM_BYTES};
use fatpipe_engine::dataplane::{blocking, budget};
use fatpipe_secure::Stream;

use super::{Sink, HEADER_BUFFER, WRITE_UNIT};
use crate::hash::{ChunkHasher, Digest};
use crate::io::{punch_hole, AlignedBuf, End, Ending};
use crate::plan::lock;
use crate::source::PIECE;
use crate::wire::{invalid, ChunkHeader, ChunkKind, HEADER_LEN};

/// A connection's chunk data on its way to disk: filled by the runner,
/// absorbed on the blocking pool.
pub(crate) struct Work {
    buf: AlignedBuf,
    /// Bytes of `buf` read and not yet absorbed.
    held: usize,
    /// The chunk they belong to.
    chunk: Option<Chunk>,
    /// Its digest, once read.
    digest: [u8; 32],
    /// All of the chunk is in (`held` is its last part, `digest` read).
    last: bool,
    /// The job failed for a bug: the connection ends.
    broken: Option<io::Error>,
}

/// A part file to write into and its O_DIRECT handle.
type Target = (Arc<File>, Option<Arc<File>>);

/// A chunk being received.
struct Chunk {
    h: ChunkHeader,
    /// A whole small file in one piece: verified in memory first.
    small: bool,
    /// The temporary file and its direct handle, once looked up (`None`
    /// inside: the chunk is not wanted).
    target: Option<Option<Target>>,
    hasher: Option<ChunkHasher>,
    write_err: Option<io::Error>,
    /// Data bytes read from the connection.
    got: usize,
    /// Data bytes absorbed.
    done: usize,
}

impl Sink {
    /// Hashes and writes what `w` holds; at the chunk's end checks its
    /// digest and commits it or asks for it again (runs on the blocking
    /// pool). A chunk that fails its check has written bytes only into
    /// the temporary file, at its own offsets, which the resend
    /// overwrites; it is never journaled.
    pub(crate) fn absorb(&self, w: &mut Work) {
        let Some(c) = w.chunk.as_mut() else {
            return;
        };
        let Ok((slot, chunk)) = self.check_header(&c.h) else {
            // Checked before the chunk was read: cannot happen.
            w.broken = Some(io::Error::other("a chunk header changed"));
            return;
        };
        let idx = c.h.file;
        let dl = self.opts.algo.digest_len();
        if c.h.kind == ChunkKind::Hole {
            if let Some((file, _)) = self.open_for_write(idx, slot, chunk) {
                match punch_hole(&file, c.h.offset, u64::from(c.h.len)) {
                    Ok(()) => self.commit(idx, slot, chunk, &file, None),
                    Err(e) => self.fail(idx, slot, self.describe(idx, e), true),
                }
            }
            w.chunk = None;
            return;
        }
        if c.small {
            let len = c.h.len as usize;
            let data = &w.buf.bytes_mut()[..len];
            let got = self.opts.algo.digest(c.h.offset, data);
            if Digest::from_slice(&w.digest[..dl]) != Some(got) {
                self.bad_chunk(idx, slot, chunk);
            } else if !self.store_small(idx, slot, data) {
                if let Some((file, _)) = self.open_for_write(idx, slot, chunk) {
                    match file.write_all_at(data, 0) {
                        Ok(()) => self.commit(idx, slot, chunk, &file, Some(got)),
                        Err(e) => self.fail(idx, slot, self.describe(idx, e), true),
                    }
                }
            }
            w.held = 0;
            w.chunk = None;
            return;
        }
        let target = c
            .target
            .get_or_insert_with(|| self.open_for_write(idx, slot, chunk));
        let held = w.held;
        let data = &w.buf.bytes_mut()[..held];
        if let Some(hasher) = c.hasher.as_mut() {
            // Piece by piece, each while it is still in cache.
            for piece in data.chunks(PIECE) {
                hasher.update(piece);
            }
        }
        if let (Some((file, direct)), None) = (target.as_ref(), &c.write_err) {
            let off = c.h.offset + c.done as u64;
            c.write_err = self.write_gathered(file, direct.as_ref(), data, off).err();
        }
        c.done += held;
        w.held = 0;
        if !w.last {
            return;
        }
        let Some(c) = w.chunk.take() else { return };
        let Some(Some((file, _))) = c.target else {
            return;
        };
        if let Some(e) = c.write_err {
            self.fail(idx, slot, self.describe(idx, e), true);
            return;
        }
        let Some(got) = c.hasher.map(ChunkHasher::finish) else {
            return;
        };
        if Digest::from_slice(&w.digest[..dl]) != Some(got) {
            self.bad_chunk(idx, slot, chunk);
            return;
        }
        self.commit(idx, slot, chunk, &file, Some(got));
    }
}

/// Where a receiving task is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading the next chunk header.
    Header,
    /// Reading a chunk's data.
    Body,
    /// Reading a chunk's digest.
    Digest,
    /// Its work is on the blocking pool.
    Working,
}

/// One receiving data connection on the runner.
pub(crate) struct RecvTask {
    sink: Arc<Sink>,
    /// The write unit's bytes, held from the data plane's budget.
    _grant: budget::Grant,
    /// Bytes gathered into one write: [`WRITE_UNIT`], less when many
    /// streams share the budget, never below a piece.
    unit: usize,
    stream: Stream,
    fd: RawFd,
    hold: Option<fatpipe_sys::WindowHold>,
    /// Headers, digests and small files come through this.
    inbuf: Box<[u8]>,
    lo: usize,
    hi: usize,
    phase: Phase,
    work: Option<Box<Work>>,
    back: Arc<Mutex<Option<Box<Work>>>>,
    waker: TaskWaker,
    ended: Ending,
}

/// Starts receiving chunks of `sink` from `stream` on the runner until
/// its `End` (the stream is made non-blocking), one of `streams` of its
/// session; `end` gets how it ended.
///
/// Its write buffer comes from the data plane's budget: the session's
/// share for one of `streams` ([`budget::share`]), at most [`WRITE_UNIT`]
/// and at least a piece, so 256 streams hold 256 pieces (64 MiB), not 256
/// write units.
pub(crate) fn spawn(
    sink: Arc<Sink>,
    stream: Stream,
    streams: usize,
    end: End,
) -> io::Result<runner::TaskHandle> {
    let grant = budget::reserve(budget::share(WRITE_UNIT, PIECE, streams), PIECE);
    let unit = (grant.bytes() / PIECE).clamp(1, WRITE_UNIT / PIECE) * PIECE;
    let hold = sink
        .opts
        .window
        .and_then(|w| fatpipe_sys::WindowHold::new(stream.tcp(), w))
        .map(|h| h.starting_at(sink.opts.start));
    stream.tcp().set_nonblocking(true)?;
    let fd = stream.tcp().as_raw_fd();
    runner::spawn_with_waker(move |waker| {
        Box::new(RecvTask {
            sink,
            _grant: grant,
            unit,
            stream,
            fd,
            hold,
            inbuf: vec![0u8; HEADER_BUFFER].into_boxed_slice(),
            lo: 0,
            hi: 0,
            phase: Phase::Header,
            work: Some(Box::new(Work {
                buf: AlignedBuf::new(unit),
                held: 0,
                chunk: None,
                digest: [0; 32],
                last: false,
                broken: None,
            })),
            back: Arc::new(Mutex::new(None)),
            waker,
            ended: Ending::new(end, "the receiving stream failed"),
        })
    })
}

/// What one read found.
enum Got {
    Bytes(usize),
    /// The socket has nothing now.
    Blocked,
}

impl RecvTask {
    fn read(&self, buf: &mut [u8]) -> io::Result<Got> {
        loop {
            match (&self.stream).read(buf) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the other end closed the connection mid-chunk",
                    ))
                }
                Ok(n) => return Ok(Got::Bytes(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Got::Blocked),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Makes `n` bytes available in `inbuf[lo..]`; a step to return when
    /// they cannot be yet.
    fn need(&mut self, n: usize, moved: &mut usize) -> io::Result<Option<Step>> {
        while self.hi - self.lo < n {
            if self.lo > 0 {
                self.inbuf.copy_within(self.lo..self.hi, 0);
                self.hi -= self.lo;
                self.lo = 0;
            }
            if *moved >= QUANTUM_BYTES {
                return Ok(Some(Step::Again));
            }
            let mut spare = std::mem::take(&mut self.inbuf);
            let r = self.read(&mut spare[self.hi..]);
            self.inbuf = spare;
            match r? {
                Got::Bytes(k) => {
                    self.hi += k;
                    *moved += k;
                }
                Got::Blocked => return Ok(Some(Step::Blocked(None))),
            }
        }
        Ok(None)
    }

    /// Hands the work to the blocking pool.
    fn submit(&mut self) -> io::Result<Step> {
        let Some(mut w) = self.work.take() else {
            return Err(io::Error::other("no work to submit"));
        };
        let (sink, back, waker) = (
            Arc::clone(&self.sink),
            Arc::clone(&self.back),
            self.waker.clone(),
        );
        self.phase = Phase::Working;
        // The session's turn: another session's writes are not queued
        // behind all of this one's.
        blocking::submit_as(
            blocking::Owner::of(&sink),
            Box::new(move || {
                let r =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sink.absorb(&mut w)));
                if r.is_err() {
                    w.broken = Some(io::Error::other("the receiver's writer failed"));
                }
                *lock(&back) = Some(w);
                waker.wake();
            }),
        )?;
        Ok(Step::Blocked(None))
    }

    /// Moves at most a quantum; `None` at the connection's `End`.
    fn step(&mut self) -> io::Result<Option<Step>> {
        let mut moved = 0usize;
        loop {
            match self.phase {
                Phase::Working => {
                    let Some(mut w) = lock(&self.back).take() else {
                        return Ok(Some(Step::Blocked(None)));
                    };
                    if let Some(e) = w.broken.take() {
                        return Err(e);
                    }
                    self.phase = if w.chunk.is_some() {
                        Phase::Body
                    } else {
                        Phase::Header
                    };
                    w.last = false;
                    self.work = Some(w);
                }
                Phase::Header => {
                    if let Some(step) = self.need(HEADER_LEN, &mut moved)? {
                        return Ok(Some(step));
                    }
                    let mut hdr = [0u8; HEADER_LEN];
                    hdr.copy_from_slice(&self.inbuf[self.lo..self.lo + HEADER_LEN]);
                    self.lo += HEADER_LEN;
                    let h = ChunkHeader::decode(&hdr).map_err(invalid)?;
                    if h.kind == ChunkKind::End {
                        return Ok(None);
                    }
                    let (slot, _) = self.sink.check_header(&h)?;
                    let small =
                        h.kind == ChunkKind::Data && slot.chunks == 1 && h.len as usize <= PIECE;
                    let hasher = (h.kind == ChunkKind::Data && !small)
                        .then(|| self.sink.opts.algo.start(h.offset, u64::from(h.len)));
                    let Some(w) = self.work.as_mut() else {
                        return Err(io::Error::other("no work"));
                    };
                    w.chunk = Some(Chunk {
                        h,
                        small,
                        target: None,
                        hasher,
                        write_err: None,
                        got: 0,
                        done: 0,
                    });
                    w.held = 0;
                    if h.kind == ChunkKind::Hole {
                        w.last = true;
                        return self.submit().map(Some);
                    }
                    self.phase = Phase::Body;
                }
                Phase::Body => {
                    let Some(w) = self.work.as_mut() else {
                        return Err(io::Error::other("no work"));
                    };
                    let Some(c) = w.chunk.as_mut() else {
                        return Err(io::Error::other("no chunk"));
                    };
                    let len = c.h.len as usize;
                    let want = (len - c.got).min(self.unit - w.held);
                    if want == 0 {
                        if c.got == len {
                            self.phase = Phase::Digest;
                            continue;
                        }
                        if moved >= QUANTUM_BYTES {
                            return Ok(Some(Step::Again));
                        }
                        return self.submit().map(Some);
                    }
                    if moved >= QUANTUM_BYTES {
                        return Ok(Some(Step::Again));
                    }
                    let dst = &mut w.buf.bytes_mut()[w.held..w.held + want];
                    let n = if self.hi > self.lo {
                        let n = (self.hi - self.lo).min(want);
                        dst[..n].copy_from_slice(&self.inbuf[self.lo..self.lo + n]);
                        self.lo += n;
                        n
                    } else {
                        match (&self.stream).read(dst) {
                            Ok(0) => {
                                return Err(io::Error::new(
                                    io::ErrorKind::UnexpectedEof,
                                    "the other end closed the connection mid-chunk",
                                ))
                            }
                            Ok(n) => n,
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                return Ok(Some(Step::Blocked(None)))
                            }
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                            Err(e) => return Err(e),
                        }
                    };
                    c.got += n;
                    w.held += n;
                    moved += n;
                    if let Some(h) = self.hold.as_mut() {
                        h.tick(self.stream.tcp());
                    }
                }
                Phase::Digest => {
                    let dl = self.sink.opts.algo.digest_len();
                    if let Some(step) = self.need(dl, &mut moved)? {
                        return Ok(Some(step));
                    }
                    let Some(w) = self.work.as_mut() else {
                        return Err(io::Error::other("no work"));
                    };
                    w.digest[..dl].copy_from_slice(&self.inbuf[self.lo..self.lo + dl]);
                    self.lo += dl;
                    w.last = true;
                    return self.submit().map(Some);
                }
            }
        }
    }
}

impl Task for RecvTask {
    fn fd(&self) -> RawFd {
        self.fd
    }

    fn wants(&self) -> Wants {
        Wants::Read
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
