//! Chunk math and the work queue every data stream pulls from.
//!
//! A file of `size` bytes is cut into chunks of `chunk_size` (the last one
//! shorter); chunk `i` covers `[i * chunk_size, min((i + 1) * chunk_size,
//! size))`. Both ends compute the same cut, so a chunk travels as
//! (file, offset, len) and the receiver checks that the three agree.
//!
//! The sender turns the receiver's needs into [`Unit`]s: each chunk of a big
//! file is a unit of its own, so all streams work on one big file at once;
//! whole small files are batched into units of about one chunk's worth of
//! bytes, so a stream sends a run of small files back to back with no round
//! trip between them. Streams pop units from one shared [`Queue`]; chunks the
//! receiver asks for again go to its front. The queue stays open (streams
//! wait) until the receiver says it is done, because a late resend may still
//! arrive.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};

use crate::wire::Need;

/// The most small files batched into one unit.
pub const MAX_BATCH_FILES: usize = 1024;

/// One chunk of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChunkRef {
    /// Manifest index of the file.
    pub file: u32,
    /// Chunk index within the file.
    pub chunk: u32,
}

/// What one stream sends in one go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    /// Chunks, sent back to back in this order.
    pub chunks: Vec<ChunkRef>,
}

/// How many chunks a file of `size` bytes has (zero for an empty file).
pub fn chunk_count(size: u64, chunk_size: u32) -> u64 {
    size.div_ceil(u64::from(chunk_size.max(1)))
}

/// The `(offset, len)` of chunk `index`; `None` if past the end.
pub fn chunk_range(size: u64, chunk_size: u32, index: u32) -> Option<(u64, u32)> {
    let cs = u64::from(chunk_size.max(1));
    let off = u64::from(index).checked_mul(cs)?;
    if off >= size {
        return None;
    }
    Some((off, (size - off).min(cs) as u32))
}

/// Builds units from needs. `size_of(file)` gives each file's size.
pub fn plan(needs: &[Need], chunk_size: u32, size_of: impl Fn(u32) -> u64) -> Vec<Unit> {
    let mut units = Vec::new();
    let mut batch: Vec<ChunkRef> = Vec::new();
    let mut batch_bytes = 0u64;
    let cs = u64::from(chunk_size);
    for need in needs {
        let size = size_of(need.file);
        let whole_small = size <= cs;
        for &(a, b) in &need.ranges {
            for chunk in a..b {
                let r = ChunkRef {
                    file: need.file,
                    chunk,
                };
                if whole_small {
                    if batch_bytes + size > cs || batch.len() >= MAX_BATCH_FILES {
                        units.push(Unit {
                            chunks: std::mem::take(&mut batch),
                        });
                        batch_bytes = 0;
                    }
                    batch.push(r);
                    batch_bytes += size.max(1);
                } else {
                    units.push(Unit { chunks: vec![r] });
                }
            }
        }
    }
    if !batch.is_empty() {
        units.push(Unit { chunks: batch });
    }
    units
}

/// Collapses sorted chunk indices into half-open ranges.
pub fn to_ranges(indices: impl IntoIterator<Item = u32>) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for i in indices {
        match out.last_mut() {
            Some((_, end)) if *end == i => *end = i + 1,
            _ => out.push((i, i + 1)),
        }
    }
    out
}

/// The chunks of a file cut at `new` bytes that lie wholly within chunks
/// of the same file cut at `old` bytes whose indices are in `verified`:
/// what a resume keeps when the journal was written with another chunk
/// size. A `verified` index past the file's end is ignored.
pub fn rechunk(size: u64, old: u32, verified: &[u32], new: u32) -> Vec<u32> {
    let old_count = chunk_count(size, old);
    let (old, new_cs) = (u64::from(old.max(1)), new.max(1));
    let mut idx: Vec<u32> = verified
        .iter()
        .copied()
        .filter(|&i| u64::from(i) < old_count && i < u32::MAX)
        .collect();
    idx.sort_unstable();
    idx.dedup();
    // Runs of consecutive verified old chunks, as byte ranges.
    let runs: Vec<(u64, u64)> = to_ranges(idx)
        .into_iter()
        .map(|(a, b)| (u64::from(a) * old, (u64::from(b) * old).min(size)))
        .collect();
    let mut out = Vec::new();
    let mut run = runs.iter().peekable();
    let count = u32::try_from(chunk_count(size, new_cs)).unwrap_or(u32::MAX);
    let first = runs.first().map_or(count, |&(a, _)| {
        u32::try_from(a / u64::from(new_cs)).unwrap_or(u32::MAX)
    });
    for c in first..count {
        let Some((off, len)) = chunk_range(size, new_cs, c) else {
            break;
        };
        let end = off + u64::from(len);
        // A run that ends before this chunk does cannot cover it or any
        // later one.
        while run.peek().is_some_and(|&&(_, b)| b < end) {
            run.next();
        }
        match run.peek() {
            Some(&&(a, _)) if a <= off => out.push(c),
            Some(_) => {}
            None => break,
        }
    }
    out
}

/// `chunk`, doubled as often as needed but not past `max`, so that files of
/// `sizes` make at most `bound` chunks: an auto-tuned push raises a chunk
/// chosen for the path rather than have the receiver refuse a manifest
/// past its bound.
pub fn chunk_to_fit(sizes: &[u64], chunk: u32, bound: u64, max: u32) -> u32 {
    let count = |c: u32| {
        sizes
            .iter()
            .map(|&s| chunk_count(s, c))
            .fold(0u64, u64::saturating_add)
    };
    let mut c = chunk.max(1);
    while c < max && count(c) > bound {
        c = c.saturating_mul(2).min(max);
    }
    c
}

/// The shared work queue.
#[derive(Debug, Default)]
pub struct Queue {
    state: Mutex<QState>,
    ready: Condvar,
}

/// Called when a queue that was found empty gets work or closes.
pub type QueueWaiter = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct QState {
    units: VecDeque<Unit>,
    closed: bool,
    handed_out: bool,
    /// Streams on the runner that found it empty, to wake.
    waiters: Vec<QueueWaiter>,
}

impl std::fmt::Debug for QState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QState")
            .field("units", &self.units)
            .field("closed", &self.closed)
            .field("handed_out", &self.handed_out)
            .field("waiters", &self.waiters.len())
            .finish()
    }
}

/// What [`Queue::try_pop`] found.
#[derive(Debug)]
pub enum Popped {
    /// The next unit.
    Unit(Unit),
    /// Nothing now; the waiter given is called when that changes.
    Empty,
    /// The queue is closed: no more work.
    Closed,
}

impl Queue {
    /// A queue holding `units`.
    pub fn new(units: Vec<Unit>) -> Queue {
        Queue {
            state: Mutex::new(QState {
                units: units.into(),
                closed: false,
                handed_out: false,
                waiters: Vec::new(),
            }),
            ready: Condvar::new(),
        }
    }

    /// Puts a unit at the front (a resend goes before new work).
    pub fn push_front(&self, unit: Unit) {
        let mut s = lock(&self.state);
        s.units.push_front(unit);
        let waiters = std::mem::take(&mut s.waiters);
        self.ready.notify_one();
        drop(s);
        waiters.into_iter().for_each(|w| w());
    }

    /// The next unit without waiting (for a stream on the runner, which
    /// must not block): [`Popped::Empty`] registers `waiter`, called once
    /// when work comes or the queue closes. `idle` as in
    /// [`Queue::pop_or_idle`].
    /// `waiter` may give none (the caller has one registered already).
    pub fn try_pop(
        &self,
        idle: impl FnOnce(),
        waiter: impl FnOnce() -> Option<QueueWaiter>,
    ) -> Popped {
        let mut s = lock(&self.state);
        if s.closed {
            return Popped::Closed;
        }
        if let Some(u) = s.units.pop_front() {
            s.handed_out = true;
            return Popped::Unit(u);
        }
        if s.handed_out {
            idle();
        }
        if let Some(w) = waiter() {
            s.waiters.push(w);
        }
        Popped::Empty
    }

    /// The next unit; waits while the queue is empty but open. `None` once
    /// closed.
    pub fn pop(&self) -> Option<Unit> {
        self.pop_or_idle(|| {})
    }

    /// [`Queue::pop`], calling `idle` when it is about to wait on a queue
    /// that has already handed out work (not while it waits for the
    /// first needs): a stream has run out of work.
    pub fn pop_or_idle(&self, idle: impl FnOnce()) -> Option<Unit> {
        let mut idle = Some(idle);
        let mut s = lock(&self.state);
        loop {
            if s.closed {
                return None;
            }
            if let Some(u) = s.units.pop_front() {
                s.handed_out = true;
                return Some(u);
            }
            if s.handed_out {
                if let Some(f) = idle.take() {
                    f();
                }
            }
            s = self.ready.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// True once [`Queue::close`] was called.
    pub fn is_closed(&self) -> bool {
        lock(&self.state).closed
    }

    /// Ends the queue: every waiting and later `pop` returns `None`.
    pub fn close(&self) {
        let mut s = lock(&self.state);
        s.closed = true;
        let waiters = std::mem::take(&mut s.waiters);
        self.ready.notify_all();
        drop(s);
        waiters.into_iter().for_each(|w| w());
    }
}

/// Locks a mutex, ignoring poisoning (a panicked thread's data is still
/// consistent for our counters and queues).
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn chunk_math() {
        assert_eq!(chunk_count(0, 4), 0);
        assert_eq!(chunk_count(1, 4), 1);
        assert_eq!(chunk_count(8, 4), 2);
        assert_eq!(chunk_count(9, 4), 3);
        assert_eq!(chunk_range(9, 4, 0), Some((0, 4)));
        assert_eq!(chunk_range(9, 4, 2), Some((8, 1)));
        assert_eq!(chunk_range(9, 4, 3), None);
        assert_eq!(
            chunk_range(u64::MAX, 4, u32::MAX),
            Some((u64::from(u32::MAX) * 4, 4))
        );
        assert_eq!(to_ranges([0, 1, 2, 5, 7, 8]), vec![(0, 3), (5, 6), (7, 9)]);
        assert_eq!(to_ranges([]), vec![]);
    }

    #[test]
    fn rechunk_keeps_the_new_chunks_wholly_inside_verified_old_ones() {
        // 10 bytes cut at 4: [0,4) [4,8) [8,10); at 2: five chunks.
        assert_eq!(rechunk(10, 4, &[0, 2], 2), vec![0, 1, 4]);
        assert_eq!(
            rechunk(10, 4, &[2, 0, 0], 2),
            vec![0, 1, 4],
            "order, repeats"
        );
        // Larger new chunks need every old chunk they span.
        assert_eq!(rechunk(10, 2, &[0, 1, 3, 4], 4), vec![0, 2]);
        assert_eq!(rechunk(10, 2, &[1, 3, 4], 4), vec![2]);
        assert_eq!(rechunk(10, 2, &[0, 1, 2, 3, 4], 4), vec![0, 1, 2]);
        // Sizes that do not divide each other: [0,3) [3,6) [6,9) [9,10)
        // against verified [0,4) and [8,10).
        assert_eq!(rechunk(10, 4, &[0, 2], 3), vec![0, 3]);
        assert_eq!(rechunk(10, 4, &[0, 1, 2], 3), vec![0, 1, 2, 3]);
        // Indices past the end, and nothing verified.
        assert_eq!(rechunk(10, 4, &[3, 7, u32::MAX], 2), Vec::<u32>::new());
        assert_eq!(rechunk(10, 4, &[], 2), Vec::<u32>::new());
        assert_eq!(rechunk(0, 4, &[0], 2), Vec::<u32>::new());
        // The same size keeps exactly the verified chunks.
        assert_eq!(rechunk(10, 4, &[1], 4), vec![1]);
        // Against a brute-force check of every byte, for many cuts.
        for size in [1u64, 7, 64, 100] {
            for old in [1u32, 3, 8, 16] {
                for new in [1u32, 2, 5, 8, 32] {
                    let verified: Vec<u32> = (0..chunk_count(size, old) as u32)
                        .filter(|i| (i * 7 + old) % 3 != 0)
                        .collect();
                    let good = |b: u64| verified.contains(&((b / u64::from(old)) as u32));
                    let want: Vec<u32> = (0..chunk_count(size, new) as u32)
                        .filter(|&c| {
                            let (off, len) = chunk_range(size, new, c).unwrap();
                            (off..off + u64::from(len)).all(good)
                        })
                        .collect();
                    assert_eq!(
                        rechunk(size, old, &verified, new),
                        want,
                        "{size} {old} {new}"
                    );
                }
            }
        }
    }

    #[test]
    fn chunk_to_fit_doubles_until_the_manifest_is_within_the_bound() {
        // 100 bytes in 4-byte chunks is 25; within 10 at 16 (7 chunks).
        assert_eq!(chunk_to_fit(&[100], 4, 10, 1 << 20), 16);
        // Already within: unchanged; several files count together.
        assert_eq!(chunk_to_fit(&[100], 4, 25, 1 << 20), 4);
        assert_eq!(chunk_to_fit(&[50, 50, 0], 4, 10, 1 << 20), 16);
        // Never past the largest chunk, even if it still does not fit.
        assert_eq!(chunk_to_fit(&[100], 4, 1, 8), 8);
        // 40 TiB at 512 KiB is past 2^26 chunks; 1 MiB fits.
        assert_eq!(
            chunk_to_fit(&[40 << 40], 512 << 10, 1 << 26, 64 << 20),
            1 << 20
        );
    }

    #[test]
    fn big_files_split_small_files_batch() {
        let cs = 1000;
        // file 0: big (3 chunks), files 1..=5: 300 bytes each, file 6: big.
        let sizes = [2500u64, 300, 300, 300, 300, 300, 1500];
        let needs: Vec<Need> = (0..7u32)
            .map(|f| Need {
                file: f,
                ranges: vec![(0, chunk_count(sizes[f as usize], cs) as u32)],
            })
            .collect();
        let units = plan(&needs, cs, |f| sizes[f as usize]);
        let shape: Vec<Vec<(u32, u32)>> = units
            .iter()
            .map(|u| u.chunks.iter().map(|c| (c.file, c.chunk)).collect())
            .collect();
        assert_eq!(
            shape,
            vec![
                vec![(0, 0)],
                vec![(0, 1)],
                vec![(0, 2)],
                vec![(1, 0), (2, 0), (3, 0)],
                vec![(6, 0)],
                vec![(6, 1)],
                vec![(4, 0), (5, 0)],
            ]
        );
        // Thousands of empty-ish files still batch, capped per unit.
        let needs: Vec<Need> = (0..3000u32)
            .map(|f| Need {
                file: f,
                ranges: vec![(0, 1)],
            })
            .collect();
        let units = plan(&needs, 1 << 20, |_| 1);
        assert_eq!(units.len(), 3);
        assert!(units.iter().all(|u| u.chunks.len() <= MAX_BATCH_FILES));
    }

    #[test]
    fn queue_resends_first_and_close_wakes_waiters() {
        let u = |f| Unit {
            chunks: vec![ChunkRef { file: f, chunk: 0 }],
        };
        let q = Arc::new(Queue::new(vec![u(1), u(2)]));
        q.push_front(u(9));
        assert_eq!(q.pop(), Some(u(9)));
        assert_eq!(q.pop(), Some(u(1)));
        assert_eq!(q.pop(), Some(u(2)));
        let q2 = Arc::clone(&q);
        let waiter = std::thread::spawn(move || q2.pop());
        std::thread::sleep(std::time::Duration::from_millis(20));
        q.close();
        assert_eq!(waiter.join().unwrap(), None);
    }

    #[test]
    fn try_pop_never_waits_and_wakes_its_waiter_once_on_work_or_close() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let u = |f| Unit {
            chunks: vec![ChunkRef { file: f, chunk: 0 }],
        };
        let woken = Arc::new(AtomicU32::new(0));
        let waiter = || {
            let w = Arc::clone(&woken);
            Some(Box::new(move || {
                w.fetch_add(1, Ordering::SeqCst);
            }) as QueueWaiter)
        };
        let q = Queue::new(vec![u(1)]);
        assert!(matches!(q.try_pop(|| {}, waiter), Popped::Unit(x) if x == u(1)));
        // Empty: registers the waiter, which work wakes once.
        let mut idle = 0;
        assert!(matches!(q.try_pop(|| idle += 1, waiter), Popped::Empty));
        assert_eq!((idle, woken.load(Ordering::SeqCst)), (1, 0));
        q.push_front(u(2));
        assert_eq!(woken.load(Ordering::SeqCst), 1);
        q.push_front(u(3));
        assert_eq!(woken.load(Ordering::SeqCst), 1, "a waiter is woken once");
        assert!(matches!(q.try_pop(|| {}, waiter), Popped::Unit(x) if x == u(3)));
        assert!(matches!(q.try_pop(|| {}, waiter), Popped::Unit(x) if x == u(2)));
        // A caller with a waiter registered already gives none.
        assert!(matches!(q.try_pop(|| {}, waiter), Popped::Empty));
        assert!(matches!(q.try_pop(|| {}, || None), Popped::Empty));
        q.close();
        assert_eq!(woken.load(Ordering::SeqCst), 2);
        assert!(matches!(q.try_pop(|| {}, waiter), Popped::Closed));
    }

    #[test]
    fn a_stream_is_idle_only_once_the_queue_has_handed_out_work() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let u = |f| Unit {
            chunks: vec![ChunkRef { file: f, chunk: 0 }],
        };
        let idle = Arc::new(AtomicU32::new(0));
        let q = Arc::new(Queue::default());
        // A stream waiting on the queue until `unit` is pushed, counting
        // the times it says it is idle.
        let pop_after_a_while = |unit: Unit| {
            let (q2, i2) = (Arc::clone(&q), Arc::clone(&idle));
            let waiter = std::thread::spawn(move || {
                q2.pop_or_idle(|| {
                    i2.fetch_add(1, Ordering::SeqCst);
                })
            });
            std::thread::sleep(std::time::Duration::from_millis(20));
            q.push_front(unit);
            waiter.join().unwrap()
        };
        // Waiting for the first needs is not idleness.
        assert_eq!(pop_after_a_while(u(1)), Some(u(1)));
        assert_eq!(idle.load(Ordering::SeqCst), 0);
        // Now an empty queue is: the stream says so once, however long it
        // waits, and still gets a later resend.
        assert_eq!(pop_after_a_while(u(2)), Some(u(2)));
        assert_eq!(idle.load(Ordering::SeqCst), 1);
    }
}
