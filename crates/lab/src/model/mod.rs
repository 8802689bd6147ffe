//! The pure link model: what happens to each MTU-sized segment on the wire.
//!
//! A direction of the emulated link is a [`Link`]: a fixed stack of stages
//! that all implement [`Stage`]. A segment enters with the time it reached
//! the link (`at`) and its size on the wire; each stage either drops it or
//! moves its `at` later (the bottleneck and the delay line) or marks it for
//! corruption. What leaves the last stage is the time the driver must hand
//! the segment to the far namespace.
//!
//! The model never reads a clock and never touches a packet's bytes: time is
//! a plain [`Nanos`] passed in and randomness comes from seeded generators,
//! so tests drive it with a virtual clock and get the same answer every run.
//! The TUN driver (`forward.rs`) is a thin loop around it.
//!
//! Stage order, and why:
//! 1. [`Outage`]: a cut link takes nothing in (`lab set --down`).
//! 2. [`Bottleneck`]: the drop-tail queue in front of the serializer, then
//!    transmission at the link rate. Queue and rate are one stage because
//!    the queue's fill level *is* how far the serializer is booked ahead.
//!    Each segment is charged its IP bytes plus the link's per-packet
//!    framing ([`DirConfig::overhead`]), as a NIC's line rate is.
//! 3. [`Loss`]: random loss on the wire (Bernoulli or Gilbert–Elliott); a
//!    lost segment still used its slot on the bottleneck, as on a real path.
//! 4. [`DelayLine`]: propagation delay plus jitter that never reorders.
//! 5. [`Corrupt`]: bit errors at a given bit error rate, which the
//!    receiver's checksum catches.
//! 6. [`Tamper`]: payload bit errors the checksum does not catch (the
//!    driver fixes it up), as a faulty NIC or middlebox makes them.

mod corrupt;
mod delay;
mod loss;
mod outage;
mod rate;
pub mod rng;
mod tamper;

pub use corrupt::Corrupt;
pub use delay::DelayLine;
pub use loss::Loss;
pub use outage::Outage;
pub use rate::Bottleneck;
pub use tamper::Tamper;

use serde::{Deserialize, Serialize};

/// Bytes Ethernet puts on the wire around each IP packet: preamble and
/// start delimiter (8), MAC header (14), frame check sequence (4) and the
/// inter-frame gap (12). A 1500-byte packet occupies 1538 bytes of a line's
/// time, so TCP at MTU 1500 gets at most 1448/1538 of a 1 Gbit/s NIC.
pub const ETHERNET_OVERHEAD: u32 = 38;

/// Nanoseconds on the driver's monotonic clock (or a test's virtual one).
pub type Nanos = u64;

/// One MTU-sized segment as the model sees it: a size and a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Bytes on the wire (the IP packet: headers and payload).
    pub len: u32,
    /// Of those, the transport payload bytes (what [`Tamper`] may change);
    /// `len` when the driver does not know the headers.
    pub payload: u32,
    /// When the segment reaches the current stage; after the last stage,
    /// when it is due at the far end.
    pub at: Nanos,
    /// Set by [`Corrupt`]: which bit of the segment to flip, counted from
    /// the first byte, in `0..len * 8`.
    pub corrupt_bit: Option<u32>,
    /// Set by [`Tamper`]: which payload bit to flip without the checksum
    /// noticing, counted from the first payload byte, in `0..payload * 8`.
    pub tamper_bit: Option<u32>,
}

impl Segment {
    /// A segment of `len` bytes arriving at `at`.
    pub fn new(len: u32, at: Nanos) -> Segment {
        Segment::with_payload(len, len, at)
    }

    /// A segment of `len` bytes of which `payload` are transport payload.
    pub fn with_payload(len: u32, payload: u32, at: Nanos) -> Segment {
        Segment {
            len,
            payload: payload.min(len),
            at,
            corrupt_bit: None,
            tamper_bit: None,
        }
    }
}

/// Why a segment did not make it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The link was down (fault injection).
    Down,
    /// The drop-tail queue was full.
    Queue,
    /// Random loss on the wire.
    Random,
}

/// What a stage decided for one segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Keep going (possibly with a later `at` or a corrupt bit set).
    Pass,
    /// The segment is gone.
    Drop(DropReason),
}

/// The parameters of one direction of the link, already resolved to bytes
/// and nanoseconds. Stages read the fields they need in [`Stage::configure`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DirConfig {
    /// Bottleneck rate in bit/s; 0 means no rate limit (and no queue).
    pub rate_bps: u64,
    /// Bytes the bottleneck charges per segment on top of its IP bytes: the
    /// framing a TUN device never sees (Ethernet: [`ETHERNET_OVERHEAD`]).
    /// Counted in the serialization time and the queue, not in `len`.
    pub overhead: u32,
    /// One-way propagation delay.
    pub delay: Nanos,
    /// Jitter amplitude: the delay varies within `delay ± jitter`.
    pub jitter: Nanos,
    /// Long-run random loss probability per segment.
    pub loss: f64,
    /// Mean length of a loss burst in segments; at most 1 means independent
    /// (Bernoulli) loss, more means Gilbert–Elliott.
    pub loss_burst: f64,
    /// Drop-tail queue limit in bytes in front of the bottleneck.
    pub queue_bytes: u64,
    /// Bit error rate: each bit is flipped with this probability.
    pub ber: f64,
    /// Undetected payload bit error rate: each payload bit is flipped with
    /// this probability and the checksum made to match.
    #[serde(default)]
    pub tamper: f64,
    /// The link takes nothing in during `[start, end)`.
    pub down: Option<(Nanos, Nanos)>,
    /// Seed of every stage's generator.
    pub seed: u64,
}

impl Default for DirConfig {
    fn default() -> DirConfig {
        DirConfig {
            rate_bps: 0,
            overhead: 0,
            delay: 0,
            jitter: 0,
            loss: 0.0,
            loss_burst: 1.0,
            queue_bytes: u64::MAX,
            ber: 0.0,
            tamper: 0.0,
            down: None,
            seed: 1,
        }
    }
}

/// Counters of one direction, kept by [`Link`] from the verdicts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Segments offered to the link.
    pub segments: u64,
    /// Bytes offered to the link.
    pub bytes: u64,
    /// Segments that came out of the last stage.
    pub delivered: u64,
    /// Bytes that came out of the last stage.
    pub delivered_bytes: u64,
    /// Segments lost at random.
    pub random_losses: u64,
    /// Segments dropped by the full queue.
    pub queue_drops: u64,
    /// Segments dropped while the link was down.
    pub down_drops: u64,
    /// Segments delivered with a flipped bit.
    pub corrupted: u64,
    /// Segments delivered with a payload bit flipped and a checksum that
    /// still verifies.
    #[serde(default)]
    pub tampered: u64,
    /// The most bytes the queue ever held.
    pub peak_queue_bytes: u64,
}

/// One stage of the link. Stages are stacked in a fixed order by [`Link`];
/// each sees the segment after the previous one has moved its time.
pub trait Stage: Send + std::fmt::Debug {
    /// Decides the fate of one segment, moving `seg.at` forward if the
    /// stage holds it. Segments arrive in order of their arrival at the link.
    fn process(&mut self, seg: &mut Segment) -> Verdict;

    /// Takes new parameters while keeping state that must survive a change
    /// (the serializer's booking, the last delivery time, the loss state).
    fn configure(&mut self, cfg: &DirConfig);

    /// Adds what the stage measures itself (e.g. the peak queue) to `c`.
    fn report(&self, _c: &mut Counters) {}
}

/// One direction of the emulated link: the stages in their order.
#[derive(Debug)]
pub struct Link {
    stages: Vec<Box<dyn Stage>>,
    counters: Counters,
}

impl Link {
    /// A link with the standard stage stack, configured by `cfg`.
    pub fn new(cfg: &DirConfig) -> Link {
        let mut stages: Vec<Box<dyn Stage>> = vec![
            Box::new(Outage::default()),
            Box::new(Bottleneck::default()),
            Box::new(Loss::new(cfg.seed)),
            Box::new(DelayLine::new(cfg.seed)),
            Box::new(Corrupt::new(cfg.seed)),
            Box::new(Tamper::new(cfg.seed)),
        ];
        for s in &mut stages {
            s.configure(cfg);
        }
        Link {
            stages,
            counters: Counters::default(),
        }
    }

    /// Applies new parameters to every stage (a live `lab set`).
    pub fn configure(&mut self, cfg: &DirConfig) {
        for s in &mut self.stages {
            s.configure(cfg);
        }
    }

    /// Runs one segment through the stages. On `Pass`, `seg.at` is the due
    /// time at the far end, `seg.corrupt_bit` says whether to flip a bit and
    /// `seg.tamper_bit` whether to flip a payload bit undetected.
    pub fn process(&mut self, seg: &mut Segment) -> Verdict {
        self.counters.segments += 1;
        self.counters.bytes += u64::from(seg.len);
        for s in &mut self.stages {
            if let Verdict::Drop(reason) = s.process(seg) {
                match reason {
                    DropReason::Down => self.counters.down_drops += 1,
                    DropReason::Queue => self.counters.queue_drops += 1,
                    DropReason::Random => self.counters.random_losses += 1,
                }
                return Verdict::Drop(reason);
            }
        }
        self.counters.delivered += 1;
        self.counters.delivered_bytes += u64::from(seg.len);
        if seg.corrupt_bit.is_some() {
            self.counters.corrupted += 1;
        }
        if seg.tamper_bit.is_some() {
            self.counters.tampered += 1;
        }
        Verdict::Pass
    }

    /// The counters so far, including what stages measure themselves.
    pub fn counters(&self) -> Counters {
        let mut c = self.counters;
        for s in &self.stages {
            s.report(&mut c);
        }
        c
    }
}

#[cfg(test)]
mod tests;
