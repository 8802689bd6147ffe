//! The process-wide budget for streams' private buffers.
//!
//! A stream that cannot share the payload pattern still needs some memory
//! of its own: a UDP sender's batch of datagrams (each carries its own
//! sequence number), a UDP receiver's `recvmmsg` slots, an encrypted
//! receiver's plaintext buffer. Each is worth having large for a few fast
//! streams and worthless a thousand times over. So a stream asks for what
//! it would like, its session's share ([`share`]) caps that, and the
//! process-wide budget ([`SERVER_BUFFERS`]) caps what all streams hold
//! together; a stream always gets its minimum (one datagram, one record),
//! so what the process holds is at most [`SERVER_BUFFERS`] plus one
//! minimum per stream, and streams are capped (`--max-streams`).
//!
//! A [`Grant`] returns its bytes to the budget when dropped.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes of private stream buffers all streams of one session share
/// before each is cut towards its minimum.
pub const SESSION_BUFFERS: usize = 64 << 20;

/// Bytes of private stream buffers all streams of the process hold above
/// their minimums.
pub const SERVER_BUFFERS: usize = 128 << 20;

static USED: AtomicUsize = AtomicUsize::new(0);

/// Bytes reserved from the process-wide budget; returned when dropped.
#[derive(Debug)]
pub struct Grant {
    bytes: usize,
    counted: usize,
    from: &'static AtomicUsize,
}

impl Grant {
    /// The bytes the stream may allocate.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        self.from.fetch_sub(self.counted, Ordering::AcqRel);
    }
}

/// What one of `streams` streams of a session may ask for when it would
/// like `want` bytes and needs `min`: its share of [`SESSION_BUFFERS`].
pub fn share(want: usize, min: usize, streams: usize) -> usize {
    want.min(SESSION_BUFFERS / streams.max(1)).max(min)
}

/// Reserves up to `want` bytes (at least `min`) from the process-wide
/// budget. Only what exceeds `min` is counted against it: the minimums
/// are bounded by the stream caps instead.
pub fn reserve(want: usize, min: usize) -> Grant {
    reserve_from(&USED, SERVER_BUFFERS, want, min)
}

/// Bytes of the process-wide budget in use (above the minimums).
pub fn in_use() -> usize {
    USED.load(Ordering::Acquire)
}

fn reserve_from(used: &'static AtomicUsize, cap: usize, want: usize, min: usize) -> Grant {
    let extra = want.saturating_sub(min);
    let mut took = 0;
    let _ = used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
        took = extra.min(cap.saturating_sub(u));
        Some(u + took)
    });
    Grant {
        bytes: min + took,
        counted: took,
        from: used,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_share_shrinks_with_streams_down_to_the_minimum() {
        // (want, min, streams, share)
        for (want, min, streams, got) in [
            (1 << 20, 65_536, 1, 1 << 20),
            (1 << 20, 65_536, 64, 1 << 20),
            (1 << 20, 65_536, 128, 512 << 10),
            (1 << 20, 65_536, 1024, 65_536),
            (1 << 20, 65_536, 4096, 65_536),
            (1 << 20, 65_536, 0, 1 << 20),
        ] {
            assert_eq!(share(want, min, streams), got, "{want} {min} {streams}");
        }
    }

    #[test]
    fn the_process_budget_caps_what_streams_hold_above_their_minimums() {
        static USED: AtomicUsize = AtomicUsize::new(0);
        let a = reserve_from(&USED, 1000, 700, 100);
        assert_eq!(a.bytes(), 700);
        let b = reserve_from(&USED, 1000, 700, 100);
        assert_eq!(b.bytes(), 100 + 400, "only 400 left above the minimum");
        let c = reserve_from(&USED, 1000, 700, 100);
        assert_eq!(c.bytes(), 100, "the minimum always");
        assert_eq!(USED.load(Ordering::Acquire), 1000);
        drop((a, b, c));
        assert_eq!(USED.load(Ordering::Acquire), 0, "all given back");
        assert_eq!(reserve_from(&USED, 1000, 50, 100).bytes(), 100);
    }
}
