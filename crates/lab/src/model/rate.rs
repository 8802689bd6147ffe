//! The bottleneck: a drop-tail queue in front of a serializer at the link rate.
//!
//! No packet is stored here. The serializer's state is one number, the time
//! until which it is booked (`busy_until`); a segment starts transmitting at
//! `max(arrival, busy_until)` and finishes `len * 8 / rate` later. The queue
//! fill at an arrival is exactly the booked time ahead converted to bytes,
//! so the drop-tail decision needs no list of queued packets either. That is
//! what lets the driver hold a BDP-sized backlog without bookkeeping per
//! packet beyond its bytes and due time.
//!
//! A segment costs the serializer its IP bytes plus the per-packet framing
//! (`overhead`, 38 bytes for Ethernet): a TUN device never sees the frame,
//! but a real line spends time on it, and charging it here is what makes a
//! lab "1 Gbit/s" carry what a 1 Gbit/s NIC carries. The queue is counted
//! in the same wire bytes, as the serializer's booked time says.

use super::{Counters, DirConfig, DropReason, Nanos, Segment, Stage, Verdict};

const NS_PER_S: u128 = 1_000_000_000;

/// Rate limiter with a byte-limited drop-tail queue.
#[derive(Debug, Default)]
pub struct Bottleneck {
    rate_bps: u64,
    overhead: u32,
    queue_bytes: u64,
    busy_until: Nanos,
    /// Remainder of `bits * 1e9 / rate` not yet turned into a nanosecond,
    /// so long runs do not drift from the exact rate.
    carry: u128,
    peak: u64,
}

impl Bottleneck {
    /// Bytes waiting for (or in) the serializer at time `now`.
    pub fn backlog(&self, now: Nanos) -> u64 {
        if self.rate_bps == 0 || self.busy_until <= now {
            return 0;
        }
        let ahead = u128::from(self.busy_until - now);
        (ahead * u128::from(self.rate_bps) / (8 * NS_PER_S)) as u64
    }
}

impl Stage for Bottleneck {
    fn process(&mut self, seg: &mut Segment) -> Verdict {
        if self.rate_bps == 0 {
            return Verdict::Pass;
        }
        let backlog = self.backlog(seg.at);
        let wire = u64::from(seg.len) + u64::from(self.overhead);
        // The segment in transmission counts towards the queue, as in a
        // byte-limited pfifo: a queue of N bytes holds N bytes in total.
        if backlog + wire > self.queue_bytes {
            return Verdict::Drop(DropReason::Queue);
        }
        let start = if self.busy_until > seg.at {
            self.busy_until
        } else {
            // The serializer went idle: a fresh start owes no fraction.
            self.carry = 0;
            seg.at
        };
        let total = u128::from(wire) * 8 * NS_PER_S + self.carry;
        let rate = u128::from(self.rate_bps);
        let tx = (total / rate) as Nanos;
        self.carry = total % rate;
        self.busy_until = start + tx;
        self.peak = self.peak.max(backlog + wire);
        seg.at = self.busy_until;
        Verdict::Pass
    }

    fn configure(&mut self, cfg: &DirConfig) {
        if cfg.rate_bps != self.rate_bps {
            self.carry = 0;
        }
        self.rate_bps = cfg.rate_bps;
        self.overhead = cfg.overhead;
        self.queue_bytes = cfg.queue_bytes;
    }

    fn report(&self, c: &mut Counters) {
        c.peak_queue_bytes = c.peak_queue_bytes.max(self.peak);
    }
}
