//! The UDP sender's rate pacer: how many datagrams may go now.
//!
//! Pure arithmetic over "nanoseconds since the stream started", so the
//! tests below drive it with a virtual clock and the sender's hot loop
//! (`stream::Sender`) only feeds it `Instant::elapsed`. The schedule is
//! absolute, not a token bucket refilled per call: datagram `k` is due at
//! `k / rate`, so rounding never accumulates and the offered rate over a
//! trial is the asked one to well within 1 % whenever the sender keeps up.
//!
//! Three limits shape bursts. A call never carries more than `burst`
//! datagrams (the batch one `sendmmsg` or GSO send holds). A sender that
//! fell behind (descheduled by a loaded host) makes its debt good at no
//! more than [`CATCH_UP`] times the rate: a second clock, a bucket filled
//! at that rate, lets it send whole batches and no faster. The bucket
//! holds [`BUCKET`] (4 ms at 1.5 times the rate, 6 ms of the schedule, at
//! least a batch): that much debt goes at once, in back-to-back batches,
//! because a sleeping thread on a loaded host wakes hundreds of µs to
//! milliseconds late every time and must send what came due meanwhile;
//! the rest of a longer stall is made good at the catch-up rate, so a
//! 30 ms stall is made good within the next 50 ms rather than as 30 ms of
//! line rate into the path's queue. And debt older than `max_lag` is forgiven and counted, so a
//! sender that cannot keep up at all shows as a lower offered rate (which
//! `--find-max` reads as "the sender is the limit") instead of as an
//! endless catch-up.
//!
//! The catch-up rate is the trade: the path's queue takes the debt either
//! way (any catch-up above a link's rate lands there), and a lower rate
//! only spreads it out, but a sender stalled a fraction `f` of the time
//! keeps its average only if `CATCH_UP` ≥ 1 / (1 − f). At 1.5 it keeps
//! it through stalls of a third of the time, which is what a host loaded
//! well past its cores does to a sleeping sender.

use std::time::Duration;

/// How much faster than the asked rate a sender that fell behind may send
/// while it makes its debt good.
pub const CATCH_UP: f64 = 1.5;

/// How much catch-up the bucket holds, as time at the catch-up rate: what
/// a sleeping sender's wake-up delay on a loaded host costs (hundreds of
/// µs to a few ms), which it must send at once when it wakes or it could
/// never keep up; stalls beyond it are made good at [`CATCH_UP`].
const BUCKET: Duration = Duration::from_millis(4);

/// Datagram schedule of one sending stream.
#[derive(Debug, Clone)]
pub struct Pacer {
    /// Datagrams per second asked for.
    pps: f64,
    /// Most datagrams per call.
    burst: usize,
    /// Most debt caught up, in datagrams.
    max_debt: u64,
    /// Nanoseconds per datagram at the catch-up rate.
    fast_gap_ns: f64,
    /// Datagrams the catch-up bucket holds: [`BUCKET`] at the catch-up
    /// rate, at least a batch.
    depth: u64,
    /// The catch-up bucket as a clock: datagrams may go while this is at
    /// least one gap behind `now`; it is never more than `depth` gaps
    /// behind (a full bucket).
    fast_at_ns: f64,
    /// Datagrams sent so far.
    sent: u64,
    /// Datagrams given up because the sender was too far behind.
    forgiven: u64,
}

impl Pacer {
    /// Paces `length`-byte datagrams at `bitrate` bit/s of UDP payload, at
    /// most `burst` per call, catching up at most `max_lag` of lateness.
    pub fn new(bitrate: u64, length: usize, burst: usize, max_lag: Duration) -> Pacer {
        let pps = bitrate as f64 / (length.max(1) as f64 * 8.0);
        let burst = burst.max(1);
        let max_debt = ((pps * max_lag.as_secs_f64()) as u64).max(burst as u64);
        let fast_gap_ns = 1e9 / (pps * CATCH_UP);
        let depth = ((pps * CATCH_UP * BUCKET.as_secs_f64()) as u64).max(burst as u64);
        Pacer {
            pps,
            burst,
            max_debt,
            fast_gap_ns,
            depth,
            fast_at_ns: -(depth as f64) * fast_gap_ns,
            sent: 0,
            forgiven: 0,
        }
    }

    /// Datagrams that may be sent at `now_ns` (at most `burst`); commit
    /// with [`sent`](Self::sent). The first datagram is due at 0. While
    /// the sender is behind, this is zero until the catch-up bucket holds
    /// all it may send (a batch, or the whole debt if smaller), so catching
    /// up goes in whole batches at the catch-up rate.
    pub fn ready(&mut self, now_ns: u64) -> usize {
        let want = self.debt(now_ns);
        if want == 0 {
            return 0;
        }
        let full = now_ns as f64 - self.depth as f64 * self.fast_gap_ns;
        self.fast_at_ns = self.fast_at_ns.max(full);
        let room = (now_ns as f64 - self.fast_at_ns) / self.fast_gap_ns;
        if room + 1e-9 < want as f64 {
            return 0;
        }
        want
    }

    /// Records `n` datagrams as sent.
    pub fn sent(&mut self, n: usize) {
        self.sent += n as u64;
        self.fast_at_ns += n as f64 * self.fast_gap_ns;
    }

    /// How long from `now_ns` until [`ready`](Self::ready) gives datagrams
    /// (zero if it does already): the next one's due time, or while behind,
    /// when the catch-up bucket holds what may go.
    pub fn wait(&self, now_ns: u64) -> Duration {
        let next = self.sent + self.forgiven;
        let due_ns = next as f64 / self.pps * 1e9;
        let want = self.debt_at(now_ns).clamp(1, self.burst as u64);
        let full = now_ns as f64 - self.depth as f64 * self.fast_gap_ns;
        let room_ns = self.fast_at_ns.max(full) + want as f64 * self.fast_gap_ns;
        let at_ns = due_ns.max(room_ns).ceil() as u64;
        Duration::from_nanos(at_ns.saturating_sub(now_ns))
    }

    /// Datagrams skipped because the sender could not keep up.
    pub fn forgiven(&self) -> u64 {
        self.forgiven
    }

    /// Datagrams due by `now_ns`, counting the one at time 0.
    fn due(&self, now_ns: u64) -> u64 {
        (now_ns as f64 * self.pps / 1e9) as u64 + 1
    }

    /// Forgives debt beyond `max_debt` and returns what may go now if the
    /// catch-up bucket allows: the debt, at most one batch.
    fn debt(&mut self, now_ns: u64) -> usize {
        let debt = self.due(now_ns).saturating_sub(self.sent + self.forgiven);
        if debt > self.max_debt {
            self.forgiven += debt - self.max_debt;
        }
        debt.min(self.max_debt).min(self.burst as u64) as usize
    }

    /// The debt at `now_ns` (capped as [`debt`](Self::debt) would), without
    /// forgiving anything.
    fn debt_at(&self, now_ns: u64) -> u64 {
        let debt = self.due(now_ns).saturating_sub(self.sent + self.forgiven);
        debt.min(self.max_debt)
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

    /// What [`drive_stalled`] saw.
    #[derive(Debug, Default)]
    struct Run {
        /// Datagrams sent.
        sent: u64,
        /// Most datagrams in one call.
        biggest: usize,
        /// Most datagrams sent in any `window_ns` (windows start at calls).
        peak_window: u64,
        /// When the sender had made good every stall's debt: the latest
        /// time, after a stall ended, at which it was still behind.
        last_behind_ns: u64,
    }

    /// [`drive`] with the sender descheduled: `stall(now)` says how long
    /// the sender is off the CPU when it would wake at `now` (0: not).
    /// Also records the peak count over `window_ns` and the catch-up.
    fn drive_stalled(
        p: &mut Pacer,
        secs: f64,
        call_ns: u64,
        per_datagram_ns: u64,
        window_ns: u64,
        mut stall: impl FnMut(u64) -> u64,
    ) -> Run {
        let end = (secs * 1e9) as u64;
        let mut run = Run::default();
        let mut calls: std::collections::VecDeque<(u64, u64)> = Default::default();
        let mut in_window = 0u64;
        let mut now = 0u64;
        while now < end {
            now += stall(now);
            let n = p.ready(now);
            if n == 0 {
                if p.debt_at(now) > 0 {
                    run.last_behind_ns = now;
                }
                now += p.wait(now).as_nanos().max(1) as u64;
                continue;
            }
            if p.debt_at(now) > n as u64 {
                run.last_behind_ns = now;
            }
            p.sent(n);
            run.sent += n as u64;
            run.biggest = run.biggest.max(n);
            calls.push_back((now, n as u64));
            in_window += n as u64;
            while calls.front().is_some_and(|&(t, _)| t + window_ns <= now) {
                in_window -= calls.pop_front().map_or(0, |c| c.1);
            }
            run.peak_window = run.peak_window.max(in_window);
            now += call_ns + per_datagram_ns * n as u64;
        }
        run
    }

    #[test]
    fn a_short_stall_is_caught_up_in_batches_at_the_catch_up_rate() {
        // 125,000 pps: a 30 ms stall at 1 s is 3750 datagrams behind. The
        // bucket's 750 (4 ms at 187,500 pps) go at once, the other 3000 at
        // half the rate above the schedule: made good in 48 ms.
        let lag = Duration::from_millis(100);
        let mut p = Pacer::new(1_000_000_000, 1000, 32, lag);
        let mut stalled = false;
        let run = drive_stalled(&mut p, 2.0, 1_000, 50, 10_000_000, |now| {
            if !stalled && now >= 1_000_000_000 {
                stalled = true;
                30_000_000
            } else {
                0
            }
        });
        assert!(run.biggest <= 32, "burst {}", run.biggest);
        assert_eq!(p.forgiven(), 0, "30 ms is inside the lag");
        let made_good = run.last_behind_ns.saturating_sub(1_030_000_000);
        assert!(
            (45_000_000..=51_000_000).contains(&made_good),
            "made good in {made_good} ns"
        );
        // No 10 ms carries more than 1.5 times the rate and the bucket.
        assert!(run.peak_window <= 1875 + 750, "{}", run.peak_window);
        assert!(run.peak_window >= 1875, "{}", run.peak_window);
        assert!((249_900..=250_001).contains(&run.sent), "{}", run.sent);
    }

    #[test]
    fn a_sender_descheduled_often_still_averages_the_rate_in_batches() {
        // The production lag, rates and batches from 64 B to 64 KB, and
        // stalls of 1-80 ms taking from 3 % to 30 % of the time: every
        // 10 s trial offers the rate within 1 %, no call carries more than
        // a batch, and no 20 ms carries more than the catch-up rate.
        let lag = Duration::from_millis(100);
        for (rate, len, burst) in [
            (200_000_000u64, 64usize, 64usize),
            (1_000_000_000, 1472, 44),
            (3_000_000_000, 8972, 7),
            (10_000_000_000, 65_507, 32),
        ] {
            for (every_ms, stall_ms) in [(100u64, 3u64), (300, 30), (50, 10), (1000, 80), (10, 3)] {
                let mut p = Pacer::new(rate, len, burst, lag);
                let mut next = every_ms * 1_000_000;
                let run = drive_stalled(&mut p, 10.0, 2_000, 100, 20_000_000, |now| {
                    if now >= next {
                        next += every_ms * 1_000_000;
                        stall_ms * 1_000_000
                    } else {
                        0
                    }
                });
                let got = run.sent as f64 * len as f64 * 8.0 / 10.0;
                let err = (got - rate as f64).abs() / rate as f64;
                let what = format!("{rate} bit/s at {len} B, {stall_ms} ms every {every_ms} ms");
                assert!(err < 0.01, "{what}: offered {got}, {err}");
                assert!(run.biggest <= burst, "{what}: burst {}", run.biggest);
                let pps = rate as f64 / (len as f64 * 8.0);
                let per_window = pps * 0.02;
                let depth = (pps * CATCH_UP * BUCKET.as_secs_f64()).max(burst as f64);
                assert!(
                    run.peak_window as f64 <= per_window * CATCH_UP + depth + 1.0,
                    "{what}: {} in 20 ms, at most {}",
                    run.peak_window,
                    per_window * CATCH_UP
                );
            }
        }
    }

    #[test]
    fn a_sender_that_wakes_late_from_every_sleep_keeps_the_rate() {
        // On a loaded host every sleep ends hundreds of µs to ms late; the
        // sender must send what came due meanwhile when it wakes, or its
        // rate is a batch per wake-up (at 3 Gbit/s of 8972 B, 7 datagrams
        // a wake-up: 24 % short at 300 µs late, as measured here before
        // the bucket held more than one batch).
        for (rate, len, burst) in [
            (200_000_000u64, 64usize, 64usize),
            (1_000_000_000, 1472, 44),
            (3_000_000_000, 8972, 7),
        ] {
            for late_ns in [300_000u64, 1_000_000, 2_500_000] {
                let mut p = Pacer::new(rate, len, burst, Duration::from_millis(100));
                let (mut now, mut sent) = (0u64, 0u64);
                while now < 10_000_000_000 {
                    let n = p.ready(now);
                    if n == 0 {
                        now += p.wait(now).as_nanos() as u64 + late_ns;
                        continue;
                    }
                    assert!(n <= burst);
                    p.sent(n);
                    sent += n as u64;
                    now += 2_000;
                }
                let got = sent as f64 * len as f64 * 8.0 / 10.0;
                let err = (got - rate as f64).abs() / rate as f64;
                assert!(
                    err < 0.01,
                    "{rate} bit/s, {len} B, {late_ns} ns late: {got}"
                );
            }
        }
    }

    #[test]
    fn random_stalls_of_a_loaded_host_still_average_the_rate() {
        // Stalls of 0-40 ms at random, a quarter of the time in all: the
        // sender still offers 1 Gbit/s within 1 % over 10 s.
        let lag = Duration::from_millis(100);
        let mut p = Pacer::new(1_000_000_000, 1472, 44, lag);
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut next = 0u64;
        let mut stalled_ns = 0u64;
        let run = drive_stalled(&mut p, 10.0, 2_000, 100, 20_000_000, |now| {
            if now < next {
                return 0;
            }
            let stall = rnd() % 40_000_000;
            // A stall of mean 20 ms every 80 ms on average: 25 %.
            next = now + stall + rnd() % 120_000_000;
            stalled_ns += stall;
            stall
        });
        let got = run.sent as f64 * 1472.0 * 8.0 / 10.0;
        let err = (got - 1e9).abs() / 1e9;
        assert!(err < 0.01, "offered {got}, {err}");
        assert!(run.biggest <= 44);
        assert!(stalled_ns > 2_000_000_000, "stalled {stalled_ns} ns");
    }

    #[test]
    fn a_sender_slower_than_the_rate_is_not_credited() {
        // Asked for 10 Gbit/s of 64-byte datagrams (19.5 Mpps) from a
        // sender that manages one datagram per 500 ns (2 Mpps).
        let mut p = Pacer::new(10_000_000_000, 64, 64, LAG);
        let (sent, _) = drive(&mut p, 1.0, 0, 500);
        assert!((1_990_000..=2_010_000).contains(&sent), "{sent}");
        assert!(p.forgiven() > 17_000_000, "{}", p.forgiven());
        // A long stall forgives its debt beyond the lag, and what is left
        // goes at the catch-up rate, a batch at a time, not at once.
        let mut q = Pacer::new(1_000_000_000, 1000, 32, LAG);
        q.ready(0);
        q.sent(1);
        let t = 1_000_000_000;
        let mut at_once = 0;
        loop {
            let n = q.ready(t);
            if n == 0 {
                break;
            }
            assert_eq!(n, 32);
            q.sent(n);
            at_once += n;
        }
        assert!(q.forgiven() > 120_000);
        // The bucket: 4 ms at 1.5 × 125,000 pps, 750 datagrams, in whole
        // batches; then 32 more each 32 gaps of 5333 ns.
        assert_eq!(at_once, 736);
        let w = q.wait(t);
        assert_eq!(w, Duration::from_nanos(96_000), "{w:?}");
        assert_eq!(q.ready(t + w.as_nanos() as u64 - 1_000), 0);
        assert_eq!(q.ready(t + w.as_nanos() as u64), 32);
        q.sent(32);
        assert_eq!(
            q.wait(t + w.as_nanos() as u64),
            Duration::from_nanos(170_667)
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
