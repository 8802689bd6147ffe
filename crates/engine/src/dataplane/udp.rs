//! A UDP test receiver's accounting: loss, order and RFC 3550 jitter,
//! sans-IO (datagrams and `now` in, totals out), wrap-safe.
//!
//! Every data datagram starts with a 16-byte header: its sequence number
//! and its send time in nanoseconds of the sender's test clock, both
//! big-endian `u64`s. Both come from the peer, so nothing here may trust
//! them: a sequence number of `u64::MAX` once overflowed `seq + 1` (a
//! panic with overflow checks, a counter running backwards without).
//!
//! Sequence numbers are compared as serial numbers (RFC 1982): a datagram
//! is ahead of the next expected one when it is less than 2^63 past it,
//! modulo 2^64, and late otherwise. Each datagram that moves the front
//! adds the numbers it spans to `expected` (saturating), so loss is
//! `expected - packets` however the numbers wrap. Transit times are
//! differences of `u64`s taken in `i128`, which cannot overflow.

/// Bytes of the data header: sequence number and send time.
pub const UDP_HEADER: usize = 16;

/// A receiver's running totals (all since the stream started).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct UdpTotals {
    /// Data datagrams received.
    pub packets: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Sequence numbers the front has passed: datagrams the sender sent
    /// as far as this receiver can tell (received or lost).
    pub expected: u64,
    /// Datagrams that arrived behind the front (late or duplicated).
    pub out_of_order: u64,
    /// RFC 3550 interarrival jitter, microseconds.
    pub jitter_us: f64,
}

impl UdpTotals {
    /// Datagrams lost between two totals of the same stream.
    pub fn lost_since(&self, earlier: &UdpTotals) -> u64 {
        let expected = self.expected.saturating_sub(earlier.expected);
        let packets = self.packets.saturating_sub(earlier.packets);
        expected.saturating_sub(packets)
    }
}

/// A UDP receiver's loss, order and jitter state.
#[derive(Debug, Default, Clone)]
pub struct UdpReceiver {
    totals: UdpTotals,
    /// The sequence number after the front (wrapping).
    next_seq: u64,
    last_transit: Option<i128>,
}

impl UdpReceiver {
    /// A receiver that has seen nothing; the sender's first number is 0.
    pub fn new() -> UdpReceiver {
        UdpReceiver::default()
    }

    /// Counts one data datagram received at `now_ns` (the receiver's test
    /// clock). Shorter than the header: not data, ignored; returns
    /// whether it counted.
    pub fn handle_datagram(&mut self, d: &[u8], now_ns: u64) -> bool {
        let (Some(seq), Some(sent)) = (be_u64(d, 0), be_u64(d, 8)) else {
            return false;
        };
        let t = &mut self.totals;
        t.packets = t.packets.saturating_add(1);
        t.bytes = t.bytes.saturating_add(d.len() as u64);
        let ahead = seq.wrapping_sub(self.next_seq);
        if ahead < 1 << 63 {
            // `ahead + 1` cannot overflow below 2^63.
            t.expected = t.expected.saturating_add(ahead + 1);
            self.next_seq = seq.wrapping_add(1);
        } else {
            t.out_of_order = t.out_of_order.saturating_add(1);
        }
        // RFC 3550: the clocks' offset cancels in the transit difference.
        let transit = i128::from(now_ns) - i128::from(sent);
        if let Some(prev) = self.last_transit {
            let d = (transit - prev).unsigned_abs() as f64 / 1e3;
            t.jitter_us += (d - t.jitter_us) / 16.0;
        }
        self.last_transit = Some(transit);
        true
    }

    /// The running totals.
    pub fn totals(&self) -> UdpTotals {
        self.totals
    }
}

/// The big-endian `u64` at `at`, if `d` holds it.
fn be_u64(d: &[u8], at: usize) -> Option<u64> {
    let b: [u8; 8] = d.get(at..at + 8)?.try_into().ok()?;
    Some(u64::from_be_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn datagram(seq: u64, sent_ns: u64) -> Vec<u8> {
        let mut d = vec![0u8; 100];
        d[..8].copy_from_slice(&seq.to_be_bytes());
        d[8..16].copy_from_slice(&sent_ns.to_be_bytes());
        d
    }

    /// Feeds `seqs` (sent 1 ms apart, received 7 ms later) and returns
    /// the totals.
    fn feed(seqs: &[u64]) -> UdpTotals {
        let mut rx = UdpReceiver::new();
        for (i, &seq) in seqs.iter().enumerate() {
            let at = i as u64 * 1_000_000;
            assert!(rx.handle_datagram(&datagram(seq, at), at + 7_000_000));
        }
        rx.totals()
    }

    #[test]
    fn loss_and_order_table() {
        const MAX: u64 = u64::MAX;
        const HALF: u64 = 1 << 63;
        // (sequence numbers, packets, expected, lost, out of order)
        let table: &[(&[u64], u64, u64, u64, u64)] = &[
            (&[], 0, 0, 0, 0),
            (&[0, 1, 2], 3, 3, 0, 0),
            (&[0, 1, 3, 2, 5], 5, 6, 1, 1),
            (&[0, 0, 0], 3, 1, 0, 2),
            (&[1], 1, 2, 1, 0),
            // The bug: u64::MAX right away is 2^64 - 1 behind, i.e. late;
            // it used to overflow `seq + 1`.
            (&[0, MAX], 2, 1, 0, 1),
            (&[MAX], 1, 0, 0, 1),
            // 2^63 or more past the front counts as behind (serial
            // numbers); just under it, as ahead.
            (&[0, HALF + 1], 2, 1, 0, 1),
            (&[0, HALF], 2, HALF + 1, HALF - 1, 0),
            // A sender walking the whole space in jumps below 2^63 wraps
            // through u64::MAX to 0 and keeps counting; expected saturates.
            (&[0, HALF - 1, MAX - 1, MAX, 0, 1], 6, MAX, MAX - 6, 0),
        ];
        for &(seqs, packets, expected, lost, ooo) in table {
            let t = feed(seqs);
            assert_eq!(
                (
                    t.packets,
                    t.expected,
                    t.lost_since(&UdpTotals::default()),
                    t.out_of_order
                ),
                (packets, expected, lost, ooo),
                "{seqs:?}"
            );
        }
    }

    #[test]
    fn u64_max_then_wrap_counts_on() {
        // Front at u64::MAX - 1 (via two jumps), then MAX, 0, 1: all in
        // order, none lost past the jumps.
        let mut rx = UdpReceiver::new();
        for seq in [(1 << 62), (1 << 63) + (1 << 62), u64::MAX - 1] {
            rx.handle_datagram(&datagram(seq, 0), 0);
        }
        let before = rx.totals();
        for seq in [u64::MAX, 0, 1] {
            rx.handle_datagram(&datagram(seq, 0), 0);
        }
        let after = rx.totals();
        assert_eq!(after.out_of_order, 0);
        assert_eq!(after.packets - before.packets, 3);
        assert_eq!(after.lost_since(&before), 0);
    }

    #[test]
    fn jitter_follows_rfc_3550_and_survives_hostile_times() {
        // Constant transit: no jitter.
        let mut rx = UdpReceiver::new();
        for i in 0..10u64 {
            rx.handle_datagram(&datagram(i, i * 1000), i * 1000 + 5_000);
        }
        assert_eq!(rx.totals().jitter_us, 0.0);
        // One 1.6 ms excursion: J = 1600 us / 16.
        rx.handle_datagram(&datagram(10, 10_000), 10_000 + 5_000 + 1_600_000);
        assert!((rx.totals().jitter_us - 100.0).abs() < 1e-9);
        // Send times at both ends of the range: finite, no panic.
        for (seq, sent, now) in [
            (11, u64::MAX, 0),
            (12, 0, u64::MAX),
            (13, u64::MAX, u64::MAX),
        ] {
            rx.handle_datagram(&datagram(seq, sent), now);
        }
        let j = rx.totals().jitter_us;
        assert!(j.is_finite() && j >= 0.0, "{j}");
    }

    #[test]
    fn runts_are_not_data() {
        let mut rx = UdpReceiver::new();
        assert!(!rx.handle_datagram(&[], 0));
        assert!(!rx.handle_datagram(&[0; 15], 0));
        assert!(rx.handle_datagram(&[0; 16], 0));
        assert_eq!(rx.totals().packets, 1);
    }
}
