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

/// The shared work queue.
#[derive(Debug, Default)]
pub struct Queue {
    state: Mutex<QState>,
    ready: Condvar,
}

#[derive(Debug, Default)]
struct QState {
    units: VecDeque<Unit>,
    closed: bool,
}

impl Queue {
    /// A queue holding `units`.
    pub fn new(units: Vec<Unit>) -> Queue {
        Queue {
            state: Mutex::new(QState {
                units: units.into(),
                closed: false,
            }),
            ready: Condvar::new(),
        }
    }

    /// Puts a unit at the front (a resend goes before new work).
    pub fn push_front(&self, unit: Unit) {
        let mut s = lock(&self.state);
        s.units.push_front(unit);
        self.ready.notify_one();
    }

    /// The next unit; waits while the queue is empty but open. `None` once
    /// closed.
    pub fn pop(&self) -> Option<Unit> {
        let mut s = lock(&self.state);
        loop {
            if s.closed {
                return None;
            }
            if let Some(u) = s.units.pop_front() {
                return Some(u);
            }
            s = self.ready.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Ends the queue: every waiting and later `pop` returns `None`.
    pub fn close(&self) {
        lock(&self.state).closed = true;
        self.ready.notify_all();
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
}
