//! The backlog of one direction: frames waiting for their due time.
//!
//! A BDP of 10 Gbit/s × 200 ms is 250 MB in flight, some hundred thousand
//! frames. They live in one byte buffer used as a ring, each frame stored
//! contiguously (a frame that would straddle the end starts over at 0 and
//! the tail gap is skipped), with a ring of small descriptors (offset,
//! length, due time) beside it. Nothing is allocated per frame, and the
//! driver reads from the TUN device straight into the ring's free space.
//! Frames leave in the order they entered, which is also due-time order
//! because the link model never reorders.

use std::collections::VecDeque;

use crate::model::Nanos;

#[derive(Debug, Clone, Copy)]
struct Desc {
    off: usize,
    len: usize,
    due: Nanos,
}

/// A FIFO of frames with due times, in one preallocated byte buffer.
#[derive(Debug)]
pub struct PacketRing {
    buf: Vec<u8>,
    descs: VecDeque<Desc>,
    /// Where the next frame goes if it fits.
    w: usize,
    /// Start of the slot handed out by the last `reserve`.
    reserved: Option<(usize, usize)>,
    bytes: usize,
}

impl PacketRing {
    /// A ring of `capacity` bytes. The memory is zeroed lazily by the OS, so
    /// a large ring costs only what it has held so far.
    pub fn new(capacity: usize) -> PacketRing {
        PacketRing {
            buf: vec![0; capacity],
            descs: VecDeque::with_capacity(4096),
            w: 0,
            reserved: None,
            bytes: 0,
        }
    }

    /// Bytes of buffer.
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Bytes of frames held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Frames held.
    pub fn len(&self) -> usize {
        self.descs.len()
    }

    /// True when no frame is held.
    pub fn is_empty(&self) -> bool {
        self.descs.is_empty()
    }

    /// A contiguous free slot of at least `max` bytes for the next frame, or
    /// `None` if the ring is too full. Only the latest reservation counts.
    pub fn reserve(&mut self, max: usize) -> Option<&mut [u8]> {
        let cap = self.buf.len();
        let pos = match self.descs.front() {
            None => (max <= cap).then_some(0),
            Some(front) => {
                let r = front.off;
                if self.w > r {
                    if cap - self.w >= max {
                        Some(self.w)
                    } else if r > max {
                        Some(0)
                    } else {
                        None
                    }
                } else if r - self.w > max {
                    Some(self.w)
                } else {
                    None
                }
            }
        }?;
        self.reserved = Some((pos, max));
        Some(&mut self.buf[pos..pos + max])
    }

    /// The slot of the latest reservation (to read back what was put there).
    pub fn reserved(&self) -> Option<&[u8]> {
        self.reserved.map(|(p, m)| &self.buf[p..p + m])
    }

    /// The slot of the latest reservation, mutable.
    pub fn reserved_mut(&mut self) -> Option<&mut [u8]> {
        self.reserved.map(|(p, m)| &mut self.buf[p..p + m])
    }

    /// Keeps the first `len` bytes of the reserved slot as a frame due at
    /// `due`. Returns false (and keeps nothing) without a fitting reservation.
    pub fn commit(&mut self, len: usize, due: Nanos) -> bool {
        match self.reserved.take() {
            Some((off, max)) if len <= max => {
                self.descs.push_back(Desc { off, len, due });
                self.w = off + len;
                self.bytes += len;
                true
            }
            _ => false,
        }
    }

    /// The due time of the oldest frame.
    pub fn next_due(&self) -> Option<Nanos> {
        self.descs.front().map(|d| d.due)
    }

    /// The oldest frame and its due time.
    pub fn front(&self) -> Option<(&[u8], Nanos)> {
        self.descs
            .front()
            .map(|d| (&self.buf[d.off..d.off + d.len], d.due))
    }

    /// Removes the oldest frame.
    pub fn pop(&mut self) {
        if let Some(d) = self.descs.pop_front() {
            self.bytes -= d.len;
            if self.descs.is_empty() {
                self.w = 0;
            }
        }
        self.reserved = None;
    }

    /// Moves everything into a buffer of `capacity` bytes if that is larger
    /// (a live `lab set` raised the rate, delay or queue).
    pub fn grow(&mut self, capacity: usize) {
        if capacity <= self.buf.len() {
            return;
        }
        let mut next = PacketRing::new(capacity);
        while let Some((frame, due)) = self.front() {
            let len = frame.len();
            if let Some(slot) = next.reserve(len) {
                slot.copy_from_slice(frame);
                next.commit(len, due);
            }
            self.pop();
        }
        *self = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(r: &mut PacketRing, len: usize, max: usize, due: Nanos) -> bool {
        match r.reserve(max) {
            Some(slot) => {
                slot[..len].fill(due as u8);
                r.commit(len, due)
            }
            None => false,
        }
    }

    #[test]
    fn fifo_with_wraparound_never_overlaps() {
        let mut r = PacketRing::new(10_000);
        let mut expect = VecDeque::new();
        let mut due = 0u64;
        // A long run of pushes and pops of varying sizes: every frame must
        // come back intact, in order.
        for round in 0..20_000u64 {
            let len = 1 + (round * 7919 % 1500) as usize;
            if push(&mut r, len, 1600, due) {
                expect.push_back((len, due));
                due += 1;
            }
            if round % 3 != 0 {
                if let Some((frame, d)) = r.front() {
                    let (len, want) = expect.pop_front().expect("ring has no extra frame");
                    assert_eq!((frame.len(), d), (len, want));
                    assert!(
                        frame.iter().all(|&b| b == want as u8),
                        "frame {want} overwritten"
                    );
                    r.pop();
                }
            }
            assert!(r.bytes() <= r.capacity());
        }
        assert_eq!(r.len(), expect.len());
    }

    #[test]
    fn full_ring_refuses_and_recovers() {
        let mut r = PacketRing::new(4000);
        assert!(push(&mut r, 1500, 1500, 1));
        assert!(push(&mut r, 1500, 1500, 2));
        assert!(!push(&mut r, 1500, 1500, 3), "only 1000 bytes left");
        r.pop();
        assert!(push(&mut r, 1000, 1400, 3), "wraps to the freed start");
        assert_eq!(r.front().map(|(_, d)| d), Some(2));
        r.pop();
        r.pop();
        assert!(r.is_empty());
        assert!(push(&mut r, 4000, 4000, 4), "empty ring restarts at 0");
    }

    #[test]
    fn grow_keeps_order_and_content() {
        let mut r = PacketRing::new(5000);
        for d in 0..3 {
            assert!(push(&mut r, 1500, 1500, d));
        }
        r.grow(100_000);
        assert_eq!(r.capacity(), 100_000);
        for d in 0..3 {
            let (f, due) = r.front().expect("frame");
            assert_eq!(due, d);
            assert!(f.iter().all(|&b| b == d as u8));
            r.pop();
        }
        for d in 0..60 {
            assert!(push(&mut r, 1500, 1500, d));
        }
    }
}
