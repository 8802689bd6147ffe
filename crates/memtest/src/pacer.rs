//! The UDP sender's rate pacer: how many datagrams may go now.
//!
//! Pure arithmetic over "nanoseconds since the stream started", so the
//! tests below drive it with a virtual clock and the sender's hot loop
//! (`data::udp_send`) only feeds it `Instant::elapsed`. The schedule is
//! absolute, not a token bucket refilled per call: datagram `k` is due at
//! `k / rate`, so rounding never accumulates and the offered rate over a
//! trial is the asked one to well within 1 % whenever the sender keeps up.
//!
//! Two limits shape bursts. A call never carries more than `burst`
//! datagrams (the batch one `sendmmsg` or GSO send holds), and a sender
//! that fell behind (descheduled, or simply slower than the rate) catches
//! up at most `max_lag` worth of datagrams: older debt is forgiven and
//! counted, so a sender that cannot keep up shows as a lower offered rate
//! (which `--find-max` reads as "the sender is the limit") instead of as a
//! long line-rate burst.

use std::time::Duration;

/// Datagram schedule of one sending stream.
#[derive(Debug, Clone)]
pub(crate) struct Pacer {
    /// Datagrams per second asked for.
    pps: f64,
    /// Most datagrams per call.
    burst: usize,
    /// Most debt caught up, in datagrams.
    max_debt: u64,
    /// Datagrams sent so far.
    sent: u64,
    /// Datagrams given up because the sender was too far behind.
    forgiven: u64,
}

impl Pacer {
    /// Paces `length`-byte datagrams at `bitrate` bit/s of UDP payload, at
    /// most `burst` per call, catching up at most `max_lag` of lateness.
    pub(crate) fn new(bitrate: u64, length: usize, burst: usize, max_lag: Duration) -> Pacer {
        let pps = bitrate as f64 / (length.max(1) as f64 * 8.0);
        let burst = burst.max(1);
        let max_debt = ((pps * max_lag.as_secs_f64()) as u64).max(burst as u64);
        Pacer {
            pps,
            burst,
            max_debt,
            sent: 0,
            forgiven: 0,
        }
    }

    /// Datagrams that may be sent at `now_ns` (at most `burst`); commit
    /// with [`sent`](Self::sent). The first datagram is due at 0.
    pub(crate) fn ready(&mut self, now_ns: u64) -> usize {
        let due = self.due(now_ns);
        let done = self.sent + self.forgiven;
        let debt = due.saturating_sub(done);
        if debt > self.max_debt {
            self.forgiven += debt - self.max_debt;
        }
        debt.min(self.max_debt).min(self.burst as u64) as usize
    }

    /// Records `n` datagrams as sent.
    pub(crate) fn sent(&mut self, n: usize) {
        self.sent += n as u64;
    }

    /// How long from `now_ns` until the next datagram is due (zero if one
    /// is due already).
    pub(crate) fn wait(&self, now_ns: u64) -> Duration {
        let next = self.sent + self.forgiven;
        let at_ns = (next as f64 / self.pps * 1e9) as u64;
        Duration::from_nanos(at_ns.saturating_sub(now_ns))
    }

    /// Datagrams skipped because the sender could not keep up.
    #[cfg(test)]
    pub(crate) fn forgiven(&self) -> u64 {
        self.forgiven
    }

    /// Datagrams due by `now_ns`, counting the one at time 0.
    fn due(&self, now_ns: u64) -> u64 {
        (now_ns as f64 * self.pps / 1e9) as u64 + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAG: Duration = Duration::from_millis(20);

    /// Drives a pacer on a virtual clock for `secs`: each call costs
    /// `call_ns` plus `per_datagram_ns` per datagram, then the sender
    /// sleeps until the next one is due. Returns (datagrams sent, most in
    /// one call).
    fn drive(p: &mut Pacer, secs: f64, call_ns: u64, per_datagram_ns: u64) -> (u64, usize) {
        let end = (secs * 1e9) as u64;
        let (mut now, mut total, mut biggest) = (0u64, 0u64, 0usize);
        while now < end {
            let n = p.ready(now);
            if n == 0 {
                now += p.wait(now).as_nanos().max(1) as u64;
                continue;
            }
            p.sent(n);
            total += n as u64;
            biggest = biggest.max(n);
            now += call_ns + per_datagram_ns * n as u64;
        }
        (total, biggest)
    }

    #[test]
    fn offered_rate_is_within_one_percent_over_ten_seconds() {
        // (bit/s, datagram bytes, burst)
        for (rate, len, burst) in [
            (1_000_000u64, 1460usize, 44usize),
            (200_000_000, 1472, 44),
            (1_000_000_000, 64, 64),
            (1_500_000_000, 64, 64),
            (10_000_000_000, 8972, 7),
            (40_000_000_000, 65_507, 32),
        ] {
            let mut p = Pacer::new(rate, len, burst, LAG);
            // A fast sender: 1 µs per call and 50 ns per datagram.
            let (sent, biggest) = drive(&mut p, 10.0, 1_000, 50);
            let got = sent as f64 * len as f64 * 8.0 / 10.0;
            let err = (got - rate as f64).abs() / rate as f64;
            assert!(err < 0.01, "{rate} bit/s at {len} B: offered {got}, {err}");
            assert!(biggest <= burst, "burst {biggest} > {burst}");
            assert_eq!(p.forgiven(), 0, "{rate} bit/s: kept up");
        }
    }

    #[test]
    fn a_slow_rate_sends_one_datagram_per_call() {
        let mut p = Pacer::new(1_000_000, 1000, 64, LAG);
        let (sent, biggest) = drive(&mut p, 2.0, 1_000, 50);
        assert_eq!(biggest, 1, "no bursts when the sender keeps up");
        assert!((249..=251).contains(&sent), "{sent}");
    }

    #[test]
    fn a_short_stall_is_caught_up_in_bursts() {
        let mut p = Pacer::new(1_000_000_000, 1000, 32, LAG);
        // 125,000 pps: 10 ms of stall is 1250 datagrams, inside the lag.
        assert_eq!(p.ready(0), 1);
        p.sent(1);
        let n = p.ready(10_000_000);
        assert_eq!(n, 32, "capped at the burst");
        let mut total = 1;
        let mut now = 10_000_000;
        while p.ready(now) > 0 {
            let n = p.ready(now);
            p.sent(n);
            total += n;
            now += 1_000;
        }
        assert!(total >= 1250, "caught up: {total}");
        assert_eq!(p.forgiven(), 0);
    }

    #[test]
    fn a_sender_slower_than_the_rate_is_not_credited() {
        // Asked for 10 Gbit/s of 64-byte datagrams (19.5 Mpps) from a
        // sender that manages one datagram per 500 ns (2 Mpps).
        let mut p = Pacer::new(10_000_000_000, 64, 64, LAG);
        let (sent, _) = drive(&mut p, 1.0, 0, 500);
        assert!((1_990_000..=2_010_000).contains(&sent), "{sent}");
        assert!(p.forgiven() > 17_000_000, "{}", p.forgiven());
        // A long stall forgives its debt rather than bursting it later.
        let mut q = Pacer::new(1_000_000_000, 1000, 32, LAG);
        q.ready(0);
        q.sent(1);
        q.ready(1_000_000_000);
        assert!(q.forgiven() > 120_000);
        let mut burst_total = 0;
        while q.ready(1_000_000_000) > 0 {
            let n = q.ready(1_000_000_000);
            q.sent(n);
            burst_total += n;
        }
        assert!(
            burst_total <= 2500 + 32,
            "at most 20 ms of debt: {burst_total}"
        );
    }

    #[test]
    fn wait_points_at_the_next_datagram() {
        let mut p = Pacer::new(8_000_000, 1000, 8, LAG); // 1000 pps
        assert_eq!(p.wait(0), Duration::ZERO);
        let first = p.ready(0);
        p.sent(first);
        assert_eq!(p.wait(0), Duration::from_millis(1));
        assert_eq!(p.wait(400_000), Duration::from_micros(600));
        assert_eq!(p.ready(999_999), 0);
        assert_eq!(p.ready(1_000_000), 1);
    }
}
