//! One direction of the emulator's data path, without any I/O.
//!
//! The driver reads a frame from the TUN device into [`Pipe::slot`], calls
//! [`Pipe::admit`] with the time, and later writes out whatever
//! [`Pipe::front`] says is due. In between, this module runs each MTU-sized
//! segment of the frame through the link model and decides whether the frame
//! travels whole (the common case, no copy), is cut into its surviving
//! segments (a loss or bit error hit part of a super-packet), or is gone.
//! A tampered segment does not need a cut: its payload bit is flipped in
//! place and the partial checksum covers it, so the frame still travels
//! whole.
//! Because it takes `now` as an argument, the tests below push hundreds of
//! thousands of segments through it on a virtual clock, GSO cuts included.

use serde::{Deserialize, Serialize};

use crate::model::{Counters, DirConfig, Link, Nanos, Segment, Verdict};
use crate::packet::{self, Layout, VnetHdr, VNET_HDR_LEN};
use crate::ring::PacketRing;

/// The largest frame a TUN device hands over: header plus a 64 KB GSO
/// packet (the legacy GSO limit), with room for an IPv6 header on top of a
/// full 16-bit payload length so nothing is ever read truncated.
pub const MAX_FRAME: usize = VNET_HDR_LEN + 40 + 65_535 + 64;

/// A frame delivered this much after its due time counts as late.
pub const LATE_AFTER: Nanos = 1_000_000;

/// What one direction has seen, for `lab stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirStats {
    /// The link model's per-segment counters.
    pub link: Counters,
    /// Frames (packets or GSO super-packets) read from the sending side.
    pub frames_in: u64,
    /// Frames written to the receiving side.
    pub frames_out: u64,
    /// Super-packets cut into segments because part of them was lost.
    pub split_frames: u64,
    /// Frames dropped because the backlog buffer was full.
    pub overflow_drops: u64,
    /// Frames that could not be parsed (too short for a header).
    pub malformed: u64,
    /// Frames written more than 1 ms after their due time.
    pub late: u64,
    /// Sum over written frames of how long after their due time they were
    /// written, in ns (mean lateness = this / `frames_out`).
    pub lateness_ns: u64,
    /// The largest lateness of any frame, in ns.
    pub max_lateness_ns: u64,
    /// Frames the receiving device refused.
    pub write_errors: u64,
    /// Bytes held in the backlog right now.
    pub backlog_bytes: u64,
}

/// One direction: the link model and the backlog of frames it has timed.
#[derive(Debug)]
pub struct Pipe {
    link: Link,
    ring: PacketRing,
    scratch: Vec<u8>,
    fates: Vec<Option<Fate>>,
    stats: DirStats,
}

/// What the link made of one segment of a super-packet that survived.
#[derive(Debug, Clone, Copy)]
struct Fate {
    due: Nanos,
    corrupt_bit: Option<u32>,
    tamper_bit: Option<u32>,
}

impl Pipe {
    /// A pipe with a backlog buffer sized for `cfg`.
    pub fn new(cfg: &DirConfig) -> Pipe {
        Pipe {
            link: Link::new(cfg),
            ring: PacketRing::new(ring_capacity(cfg)),
            scratch: vec![0; MAX_FRAME],
            fates: Vec::with_capacity(64),
            stats: DirStats::default(),
        }
    }

    /// Applies new parameters; grows the backlog buffer if they need more.
    pub fn configure(&mut self, cfg: &DirConfig) {
        self.link.configure(cfg);
        self.ring.grow(ring_capacity(cfg));
    }

    /// Free space for the next frame, [`MAX_FRAME`] bytes long; `None` when
    /// the backlog is full (read into [`Pipe::overflow_slot`] instead).
    pub fn slot(&mut self) -> Option<&mut [u8]> {
        self.ring.reserve(MAX_FRAME)
    }

    /// A scratch buffer to read a frame into and drop it when
    /// [`Pipe::slot`] has no room; call [`Pipe::overflowed`] if one came.
    pub fn overflow_slot(&mut self) -> &mut [u8] {
        &mut self.scratch
    }

    /// Counts a frame dropped because the backlog buffer was full.
    pub fn overflowed(&mut self) {
        self.stats.frames_in += 1;
        self.stats.overflow_drops += 1;
    }

    /// Runs the `len`-byte frame just read into the slot through the link.
    pub fn admit(&mut self, now: Nanos, len: usize) {
        self.stats.frames_in += 1;
        let Some(frame) = self.ring.reserved().map(|s| &s[..len.min(s.len())]) else {
            return;
        };
        let Some(hdr) = VnetHdr::parse(frame) else {
            self.stats.malformed += 1;
            return;
        };
        let pkt = &frame[VNET_HDR_LEN..];
        let Some(layout) = Layout::of(&hdr, pkt) else {
            let span = packet::payload_span(pkt);
            let payload = span.map_or(0, |(_, n)| n as u32);
            let mut seg = Segment::with_payload(pkt.len() as u32, payload, now);
            if self.link.process(&mut seg) == Verdict::Pass {
                if let (Some(bit), Some((start, _))) = (seg.tamper_bit, span) {
                    if let Some(slot) = self.ring.reserved_mut() {
                        packet::tamper_payload(&mut slot[..len], start, bit);
                    }
                }
                if let Some(bit) = seg.corrupt_bit {
                    // A checksum that cannot be completed here (a super-packet
                    // this module cannot cut) would let the flip through
                    // unseen; the receiver would have dropped it, so drop it.
                    let Some(slot) = self.ring.reserved_mut() else {
                        return;
                    };
                    let f = &mut slot[..len];
                    if hdr.gso_type != packet::GSO_NONE || !packet::complete_checksum(f) {
                        return;
                    }
                    packet::flip_bit(f, bit);
                }
                self.ring.commit(len, seg.at);
            }
            return;
        };
        self.fates.clear();
        let mut whole = true;
        let headers = layout.ip_hdr + layout.tcp_hdr;
        for i in 0..layout.segments() {
            let wire = layout.wire_len(i);
            let mut seg = Segment::with_payload(wire as u32, (wire - headers) as u32, now);
            let fate = match self.link.process(&mut seg) {
                Verdict::Pass => Some(Fate {
                    due: seg.at,
                    corrupt_bit: seg.corrupt_bit,
                    tamper_bit: seg.tamper_bit,
                }),
                Verdict::Drop(_) => None,
            };
            whole &= fate.is_some_and(|f| f.corrupt_bit.is_none());
            self.fates.push(fate);
        }
        if whole {
            let due = self.fates.last().copied().flatten().map_or(now, |f| f.due);
            if let Some(slot) = self.ring.reserved_mut() {
                for (i, fate) in self.fates.iter().enumerate() {
                    if let Some(bit) = fate.and_then(|f| f.tamper_bit) {
                        let first = headers + i * layout.mss;
                        packet::tamper_payload(&mut slot[..len], first, bit);
                    }
                }
            }
            self.ring.commit(len, due);
            return;
        }
        if self.fates.iter().all(Option::is_none) {
            return;
        }
        // Part of the super-packet survives: cut it. The original sits in
        // the reserved slot, which the segments will overwrite, so it moves
        // to scratch first; this path runs only on a loss or bit error.
        self.stats.split_frames += 1;
        self.scratch[..len].copy_from_slice(frame);
        for (i, fate) in self.fates.iter().enumerate() {
            let Some(Fate {
                due,
                corrupt_bit,
                tamper_bit,
            }) = *fate
            else {
                continue;
            };
            let n = VNET_HDR_LEN + layout.wire_len(i);
            let Some(slot) = self.ring.reserve(n) else {
                self.stats.overflow_drops += 1;
                continue;
            };
            layout.write_segment(&self.scratch[VNET_HDR_LEN..len], i, slot);
            if let Some(bit) = tamper_bit {
                packet::tamper_payload(&mut slot[..n], headers, bit);
            }
            if let Some(bit) = corrupt_bit {
                packet::complete_checksum(&mut slot[..n]);
                packet::flip_bit(&mut slot[..n], bit);
            }
            self.ring.commit(n, due);
        }
    }

    /// How many frames are held.
    pub fn held(&self) -> usize {
        self.ring.len()
    }

    /// When the oldest frame is due, if any.
    pub fn next_due(&self) -> Option<Nanos> {
        self.ring.next_due()
    }

    /// The oldest frame and its due time.
    pub fn front(&self) -> Option<(&[u8], Nanos)> {
        self.ring.front()
    }

    /// Removes the oldest frame after the driver wrote it (`ok`) or the
    /// device refused it, at time `now`.
    pub fn delivered(&mut self, now: Nanos, ok: bool) {
        if let Some((_, due)) = self.ring.front() {
            let lateness = now.saturating_sub(due);
            if lateness > LATE_AFTER {
                self.stats.late += 1;
            }
            self.stats.lateness_ns += lateness;
            self.stats.max_lateness_ns = self.stats.max_lateness_ns.max(lateness);
            if ok {
                self.stats.frames_out += 1;
            } else {
                self.stats.write_errors += 1;
            }
        }
        self.ring.pop();
    }

    /// The counters so far.
    pub fn stats(&self) -> DirStats {
        DirStats {
            link: self.link.counters(),
            backlog_bytes: self.ring.bytes() as u64,
            ..self.stats
        }
    }
}

/// Bytes of backlog buffer a direction needs: the queue plus what is in
/// flight on the delay line at full rate, with room for cut super-packets'
/// extra headers. Without a rate limit nothing bounds the flight, so a
/// generous fixed size stands in (overflow is counted, not hidden).
pub fn ring_capacity(cfg: &DirConfig) -> usize {
    const MIN: u64 = 32 << 20;
    const MAX: u64 = 4 << 30;
    let flight = if cfg.rate_bps == 0 {
        256 << 20
    } else {
        let per_s = cfg.rate_bps / 8;
        let queue = cfg.queue_bytes.min(per_s);
        let delay = u128::from(cfg.delay + cfg.jitter);
        queue + (u128::from(per_s) * delay / 1_000_000_000) as u64
    };
    (flight + flight / 4 + (16 << 20)).clamp(MIN, MAX) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::tests::{gso_frame, udp_gso_frame};

    fn push(p: &mut Pipe, now: Nanos, frame: &[u8]) {
        let slot = p.slot().expect("room");
        slot[..frame.len()].copy_from_slice(frame);
        p.admit(now, frame.len());
    }

    /// Drains everything and returns (segments, first seq of each, frames).
    fn drain(p: &mut Pipe) -> (u64, Vec<u32>, u64) {
        let mut segs = 0;
        let mut seqs = Vec::new();
        let mut frames = 0;
        while let Some((f, due)) = p.front() {
            let hdr = VnetHdr::parse(f).expect("header");
            let pkt = &f[VNET_HDR_LEN..];
            let (ip, _, _) = packet::ip_header(pkt).expect("ip");
            seqs.push(u32::from_be_bytes([
                pkt[ip + 4],
                pkt[ip + 5],
                pkt[ip + 6],
                pkt[ip + 7],
            ]));
            segs += Layout::of(&hdr, pkt).map_or(1, |l| l.segments() as u64);
            frames += 1;
            p.delivered(due, true);
        }
        (segs, seqs, frames)
    }

    #[test]
    fn whole_super_packets_travel_uncut_at_the_time_of_their_last_segment() {
        let mut p = Pipe::new(&DirConfig {
            rate_bps: 1_000_000_000,
            delay: 10_000_000,
            ..DirConfig::default()
        });
        let f = gso_frame(false, 44 * 1448, 1448);
        push(&mut p, 0, &f);
        let (frame, due) = p.front().expect("kept");
        assert_eq!(frame, &f[..], "untouched");
        // 44 segments of 1500 bytes at 1 Gbit/s: 528 us, then 10 ms.
        assert_eq!(due, 44 * 12_000 + 10_000_000);
        assert_eq!(p.stats().link.segments, 44);
    }

    #[test]
    fn loss_is_per_segment_when_super_packets_are_cut() {
        // 3000 super-packets of 44 segments: 132,000 segments at 1% loss.
        let p_loss = 0.01;
        let mut p = Pipe::new(&DirConfig {
            loss: p_loss,
            seed: 77,
            ..DirConfig::default()
        });
        let f = gso_frame(true, 44 * 1428, 1428);
        let mut total = 0u64;
        let mut delivered = 0u64;
        for round in 0..3000u64 {
            push(&mut p, round * 1000, &f);
            total += 44;
            let (segs, seqs, _) = drain(&mut p);
            delivered += segs;
            // Survivors keep their order and their own sequence numbers.
            for w in seqs.windows(2) {
                assert!((w[1].wrapping_sub(w[0]) as usize).is_multiple_of(1428) && w[1] != w[0]);
            }
        }
        let lost = total - delivered;
        let s = p.stats();
        assert_eq!(lost, s.link.random_losses);
        assert!(s.split_frames > 0);
        let mean = total as f64 * p_loss;
        let sd = (total as f64 * p_loss * (1.0 - p_loss)).sqrt();
        assert!(
            (lost as f64 - mean).abs() <= 4.5 * sd,
            "lost {lost} of {total}"
        );
        // A whole-packet-drop shortcut would lose about 36% of frames; the
        // cut keeps nearly all frames partly alive.
        assert!(s.split_frames < 3000 * 45 / 100 && s.split_frames > 3000 * 27 / 100);
    }

    #[test]
    fn corrupted_segments_fail_their_checksum_and_the_rest_pass() {
        let mut p = Pipe::new(&DirConfig {
            ber: 2e-6,
            seed: 5,
            ..DirConfig::default()
        });
        let f = gso_frame(false, 44 * 1448, 1448);
        let mut bad = 0;
        for round in 0..500 {
            push(&mut p, round, &f);
            while let Some((frame, due)) = p.front() {
                let mut g = frame.to_vec();
                let hdr = VnetHdr::parse(&g).expect("hdr");
                if hdr.flags & packet::F_NEEDS_CSUM == 0 {
                    // Completed by the corruption path: must not verify.
                    let pkt = &g[VNET_HDR_LEN..];
                    let ip = 20;
                    let pseudo = packet::sum(&pkt[12..20], 0) + (pkt.len() - ip) as u64 + 6;
                    assert_ne!(packet::fold(pseudo + packet::sum(&pkt[ip..], 0)), 0xFFFF);
                    bad += 1;
                } else if Layout::of(&hdr, &g[VNET_HDR_LEN..]).is_none() {
                    // A clean cut segment still verifies once completed.
                    assert!(packet::complete_checksum(&mut g));
                    let pkt = &g[VNET_HDR_LEN..];
                    let pseudo = packet::sum(&pkt[12..20], 0) + (pkt.len() - 20) as u64 + 6;
                    assert_eq!(packet::fold(pseudo + packet::sum(&pkt[20..], 0)), 0xFFFF);
                }
                p.delivered(due, true);
            }
        }
        assert!(bad > 0);
        assert_eq!(bad, p.stats().link.corrupted);
    }

    #[test]
    fn corrupted_plain_packets_fail_their_checksum() {
        // A single-segment frame (no GSO) with a partial checksum, as TCP
        // ACKs and small writes come.
        let mut f = gso_frame(false, 500, 1448);
        f[1] = packet::GSO_NONE;
        // The partial checksum a kernel would leave: the pseudo-header sum.
        let pkt = &f[VNET_HDR_LEN..];
        let pseudo = packet::fold(packet::sum(&pkt[12..20], 0) + (pkt.len() - 20) as u64 + 6);
        f[VNET_HDR_LEN + 36..VNET_HDR_LEN + 38].copy_from_slice(&pseudo.to_be_bytes());
        let mut p = Pipe::new(&DirConfig {
            ber: 1e-3,
            seed: 3,
            ..DirConfig::default()
        });
        let mut bad = 0;
        for round in 0..200 {
            push(&mut p, round, &f);
            while let Some((frame, due)) = p.front() {
                let mut g = frame.to_vec();
                assert!(packet::complete_checksum(&mut g));
                let pkt = &g[VNET_HDR_LEN..];
                let pseudo = packet::sum(&pkt[12..20], 0) + (pkt.len() - 20) as u64 + 6;
                if packet::fold(pseudo + packet::sum(&pkt[20..], 0)) != 0xFFFF {
                    bad += 1;
                }
                p.delivered(due, true);
            }
        }
        assert!(
            bad > 50,
            "a 552-byte packet at BER 1e-3 is hit ~99% of the time: {bad}"
        );
        assert_eq!(bad, p.stats().link.corrupted);
    }

    #[test]
    fn tampered_segments_verify_and_differ_by_their_count_of_bits() {
        // Super-packets of 44 segments with 1% loss (so some are cut) and
        // payload tampering: every segment that comes out, whole or cut,
        // verifies its checksum, and the payload differs from what was sent
        // in exactly as many bits as the link counted tampered segments.
        for v6 in [false, true] {
            let mut p = Pipe::new(&DirConfig {
                loss: 0.01,
                tamper: 2e-6,
                seed: 11,
                ..DirConfig::default()
            });
            let f = gso_frame(v6, 44 * 1448, 1448);
            let hdr = VnetHdr::parse(&f).expect("hdr");
            let layout = Layout::of(&hdr, &f[VNET_HDR_LEN..]).expect("layout");
            let hl = layout.ip_hdr + layout.tcp_hdr;
            let sent = &f[VNET_HDR_LEN + hl..];
            let base = 0xFFFF_FF00u32; // the first sequence number of gso_frame
            let mut flipped = 0u64;
            for round in 0..400 {
                push(&mut p, round, &f);
                while let Some((frame, due)) = p.front() {
                    let h = VnetHdr::parse(frame).expect("hdr");
                    let pkt = &frame[VNET_HDR_LEN..];
                    let segs: Vec<Vec<u8>> = match Layout::of(&h, pkt) {
                        Some(l) => (0..l.segments())
                            .map(|i| {
                                let mut out = vec![0u8; VNET_HDR_LEN + l.wire_len(i)];
                                l.write_segment(pkt, i, &mut out);
                                out
                            })
                            .collect(),
                        None => vec![frame.to_vec()],
                    };
                    for mut s in segs {
                        assert!(packet::complete_checksum(&mut s));
                        let q = &s[VNET_HDR_LEN..];
                        let ip = layout.ip_hdr;
                        let pseudo = if v6 {
                            packet::sum(&q[8..40], 0)
                        } else {
                            packet::sum(&q[12..20], 0)
                        } + (q.len() - ip) as u64
                            + 6;
                        let ok = packet::fold(pseudo + packet::sum(&q[ip..], 0)) == 0xFFFF;
                        assert!(ok, "v6 {v6}: every tampered segment verifies");
                        let seq = u32::from_be_bytes([q[ip + 4], q[ip + 5], q[ip + 6], q[ip + 7]]);
                        let off = seq.wrapping_sub(base) as usize;
                        let got = &q[hl..];
                        flipped += got
                            .iter()
                            .zip(&sent[off..off + got.len()])
                            .map(|(a, b)| u64::from((a ^ b).count_ones()))
                            .sum::<u64>();
                    }
                    p.delivered(due, true);
                }
            }
            let c = p.stats().link;
            assert!(c.tampered > 20, "v6 {v6}: {c:?}");
            assert_eq!(flipped, c.tampered, "v6 {v6}");
            assert!(c.random_losses > 0 && p.stats().split_frames > 0);
        }
    }

    #[test]
    fn tampered_plain_packets_verify_and_acks_are_spared() {
        // A plain TCP packet with 500 payload bytes and a pure ACK (none),
        // both with partial checksums, through a link that hits every bit.
        let mut p = Pipe::new(&DirConfig {
            tamper: 1e-2,
            seed: 4,
            ..DirConfig::default()
        });
        for payload in [500, 0] {
            let mut f = gso_frame(false, payload, 1448);
            f[1] = packet::GSO_NONE;
            let pkt = &f[VNET_HDR_LEN..];
            let pseudo = packet::fold(packet::sum(&pkt[12..20], 0) + (pkt.len() - 20) as u64 + 6);
            f[VNET_HDR_LEN + 36..VNET_HDR_LEN + 38].copy_from_slice(&pseudo.to_be_bytes());
            for round in 0..50 {
                push(&mut p, round, &f);
                let (frame, due) = p.front().expect("delivered");
                let mut g = frame.to_vec();
                assert_eq!(g[..VNET_HDR_LEN + 52], f[..VNET_HDR_LEN + 52], "headers");
                assert_eq!(g == f, payload == 0, "payload {payload}");
                assert!(packet::complete_checksum(&mut g));
                let q = &g[VNET_HDR_LEN..];
                let pseudo = packet::sum(&q[12..20], 0) + (q.len() - 20) as u64 + 6;
                assert_eq!(packet::fold(pseudo + packet::sum(&q[20..], 0)), 0xFFFF);
                p.delivered(due, true);
            }
        }
        assert_eq!(p.stats().link.tampered, 50);
    }

    #[test]
    fn full_backlog_counts_overflow() {
        let cfg = DirConfig {
            rate_bps: 1_000_000,
            ..DirConfig::default()
        };
        let mut p = Pipe::new(&cfg);
        let f = gso_frame(false, 44 * 1448, 1448);
        let mut refused = 0;
        for _ in 0..2000 {
            match p.slot() {
                Some(slot) => {
                    slot[..f.len()].copy_from_slice(&f);
                    p.admit(0, f.len());
                }
                None => {
                    p.overflow_slot();
                    p.overflowed();
                    refused += 1;
                }
            }
        }
        assert!(refused > 0);
        assert_eq!(p.stats().overflow_drops, refused);
    }

    #[test]
    fn ring_is_sized_for_bdp_and_queue() {
        let cfg = DirConfig {
            rate_bps: 10_000_000_000,
            delay: 100_000_000,
            queue_bytes: 125_000_000,
            ..DirConfig::default()
        };
        // 125 MB in flight + 125 MB queue, with headroom.
        assert!(ring_capacity(&cfg) >= 250_000_000);
        assert!(ring_capacity(&DirConfig::default()) >= 256 << 20);
    }

    #[test]
    fn udp_super_packets_are_charged_per_datagram_and_travel_whole() {
        let mut p = Pipe::new(&DirConfig {
            rate_bps: 1_000_000_000,
            delay: 5_000_000,
            ..DirConfig::default()
        });
        // 40 datagrams of 1472 bytes: 1500 bytes each on the link, 12 us
        // each at 1 Gbit/s.
        let f = udp_gso_frame(false, 40 * 1472, 1472);
        push(&mut p, 0, &f);
        let (frame, due) = p.front().expect("kept");
        assert_eq!(frame, &f[..], "untouched, still a GSO frame");
        assert_eq!(due, 40 * 12_000 + 5_000_000);
        let s = p.stats();
        assert_eq!((s.link.segments, s.link.bytes), (40, 40 * 1500));
    }

    #[test]
    fn udp_loss_and_corruption_are_per_datagram_and_survivors_are_exact() {
        // 2000 super-packets of 40 datagrams at 1 % loss and a bit error
        // rate that hits a few hundred datagrams.
        let mut p = Pipe::new(&DirConfig {
            loss: 0.01,
            ber: 2e-7,
            seed: 11,
            ..DirConfig::default()
        });
        for v6 in [false, true] {
            let size = 1200u16;
            let f = udp_gso_frame(v6, 40 * usize::from(size), size);
            let ip = if v6 { 40 } else { 20 };
            let body = &f[VNET_HDR_LEN + ip + 8..];
            for round in 0..1000u64 {
                push(&mut p, round * 1000, &f);
                while let Some((frame, due)) = p.front() {
                    let mut g = frame.to_vec();
                    let hdr = VnetHdr::parse(&g).expect("hdr");
                    if hdr.gso_type == packet::GSO_UDP_L4 {
                        assert_eq!(g, f, "a whole super-packet travels as it came");
                    } else if hdr.flags & packet::F_NEEDS_CSUM == 0 {
                        // Corrupted: the completed checksum no longer fits.
                        let pkt = &g[VNET_HDR_LEN..];
                        let pseudo = if v6 {
                            packet::sum(&pkt[8..40], 0)
                        } else {
                            packet::sum(&pkt[12..20], 0)
                        } + (pkt.len() - ip) as u64
                            + 17;
                        assert_ne!(packet::fold(pseudo + packet::sum(&pkt[ip..], 0)), 0xFFFF);
                    } else {
                        // A clean cut datagram: its payload is its own slice
                        // of the super-packet's, found by the IP length.
                        assert!(packet::complete_checksum(&mut g));
                        let pkt = &g[VNET_HDR_LEN..];
                        let n = pkt.len() - ip - 8;
                        assert_eq!(n, usize::from(size));
                        assert!(
                            body.chunks(n).any(|c| c == &pkt[ip + 8..]),
                            "payload is one of the datagrams'"
                        );
                    }
                    p.delivered(due, true);
                }
            }
        }
        let s = p.stats();
        let total = 2 * 1000 * 40;
        assert_eq!(s.link.segments, total);
        let mean = total as f64 * 0.01;
        let sd = (total as f64 * 0.01 * 0.99).sqrt();
        assert!(
            (s.link.random_losses as f64 - mean).abs() <= 4.5 * sd,
            "{s:?}"
        );
        assert!(s.link.corrupted > 50 && s.split_frames > 0, "{s:?}");
    }
}
