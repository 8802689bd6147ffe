//! The estimators behind `fatpipe path`: round-trip statistics and the
//! bottleneck rate from the dispersion of packet trains.
//!
//! Both are pure functions of timestamps, so they are tested with synthetic
//! ones; the probe client only collects the timestamps and calls them.
//!
//! **Why trains, timed at the receiver.** A burst of back-to-back packets
//! leaves the narrowest link spaced by that link's serialisation time, and
//! stays spaced (links after it are faster). Timing a pair of packets would
//! be enough on an ideal path, but real receivers, and the lab's user-space
//! forwarder, deliver packets in small clumps (interrupt coalescing, timer
//! wake-ups), which makes single-pair gaps noisy by tens of microseconds —
//! as much as a whole 1500-byte gap at 1 Gbit/s. A train of a few hundred
//! packets spans milliseconds, so the same clumping shifts its *span* by a
//! percent or so. Each train gives one estimate (the least-squares slope
//! of arrival time over bytes delivered); several trains give a spread, from
//! which outliers (a train that met cross traffic, a clock hiccup) are
//! dropped by a median/MAD rule before the median is reported.
//!
//! **Why windows inside a train.** At multi-gigabit rates a train spans a
//! millisecond or two, as long as one time slice of a busy host: a sender,
//! forwarder or receiver descheduled for part of it puts a gap (or, when a
//! backlog is then delivered at once, a burst) into the arrivals that has
//! nothing to do with the link. One slope through the whole train takes
//! the gap in (a 5 Gbit/s lab link read as 1.2 to 3 Gbit/s on a loaded
//! 2-core host). So a long train is cut into overlapping windows of a
//! quarter of its packets, each gets its own slope, and the train's rate
//! is their median: one gap or burst spoils at most about a third of the
//! windows, while each window is still long enough to average clumped
//! timestamps out.
//!
//! **Why a confidence.** The spread of the surviving estimates and the share
//! of trains that survived say how far to trust the number; the planner
//! then knows whether to lean on it (see `Policy::pacing_gain`). A train the
//! sender could not push faster than it arrived measured the sender, not
//! the path: it still counts, but the result is flagged as a lower bound.

use std::time::Duration;

/// Minimum, mean, maximum and standard deviation of round-trip samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RttStats {
    /// Echoes sent.
    pub sent: u32,
    /// Echoes answered in time.
    pub received: u32,
    /// Smallest sample.
    pub min: Duration,
    /// Mean.
    pub avg: Duration,
    /// Largest sample.
    pub max: Duration,
    /// Population standard deviation (what `ping` calls mdev).
    pub stddev: Duration,
}

/// Statistics of `samples` out of `sent` echoes; `None` without samples.
pub fn rtt_stats(sent: u32, samples: &[Duration]) -> Option<RttStats> {
    let first = *samples.first()?;
    let secs: Vec<f64> = samples.iter().map(Duration::as_secs_f64).collect();
    let n = secs.len() as f64;
    let mean = secs.iter().sum::<f64>() / n;
    let var = secs.iter().map(|s| (s - mean) * (s - mean)).sum::<f64>() / n;
    let (min, max) = samples
        .iter()
        .fold((first, first), |(lo, hi), &s| (lo.min(s), hi.max(s)));
    Some(RttStats {
        sent: sent.max(samples.len() as u32),
        received: samples.len() as u32,
        min,
        avg: Duration::from_secs_f64(mean),
        max,
        stddev: Duration::from_secs_f64(var.max(0.0).sqrt()),
    })
}

/// One packet of a train as the receiver saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    /// Position in the train (0-based, as sent).
    pub index: u32,
    /// Receive time in nanoseconds on the receiver's clock (any epoch).
    pub at_ns: u64,
    /// IP packet size in bytes (what the bottleneck serialises).
    pub ip_bytes: u32,
}

/// One train: what was sent and what arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrainObs {
    /// Packets sent.
    pub sent: u32,
    /// IP size of each packet sent.
    pub ip_bytes: u32,
    /// How long the sender took to hand the whole train to its kernel (ns);
    /// 0 when unknown.
    pub send_span_ns: u64,
    /// The part of `send_span_ns` the sender was actually sending (ns): a
    /// system call in which it was descheduled (≥ 0.5 ms and 10 × the
    /// median call) counts as a typical one, so a stalled sender is not
    /// mistaken for a slow one; 0 when unknown (`send_span_ns` is used).
    pub send_busy_ns: u64,
    /// The packets that arrived, in any order.
    pub arrivals: Vec<Arrival>,
}

/// Why a train gave no estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrainReject {
    /// Fewer than [`MIN_ARRIVALS`] packets arrived.
    TooFewArrivals,
    /// All arrivals carry (nearly) the same timestamp: they were timed in a
    /// batch, so the span says nothing about the link.
    NoSpan,
}

/// One train's estimate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainRate {
    /// Bit/s at the receiver.
    pub rate: f64,
    /// True when the sender handed the train over no faster than it arrived
    /// (within 10 %): the estimate is then a lower bound on the path.
    pub sender_limited: bool,
}

/// The combined estimate over all trains.
#[derive(Debug, Clone, PartialEq)]
pub struct RateEstimate {
    /// Median of the trains kept, bit/s.
    pub rate: f64,
    /// Smallest kept estimate, bit/s.
    pub low: f64,
    /// Largest kept estimate, bit/s.
    pub high: f64,
    /// 0 (no idea) to 1 (tight agreement of every train).
    pub confidence: f64,
    /// Trains sent.
    pub trains: u32,
    /// Trains whose estimate was kept.
    pub used: u32,
    /// Trains dropped as outliers.
    pub outliers: u32,
    /// Trains that gave no estimate (lost packets, no span).
    pub rejected: u32,
    /// True when most kept trains were sender-limited: `rate` is then only
    /// a lower bound on the bottleneck.
    pub sender_limited: bool,
}

/// A train needs at least this many arrivals to give a span.
pub const MIN_ARRIVALS: usize = 4;

/// Arrival spans shorter than this (ns) are batch timestamps, not a link.
const MIN_SPAN_NS: u64 = 2_000;

/// Scale of the MAD that makes it comparable to a standard deviation for
/// normally distributed estimates.
const MAD_SCALE: f64 = 1.4826;

/// Estimates kept lie within this many (scaled) MADs of the median.
const OUTLIER_MADS: f64 = 3.0;

/// Estimates also survive within this relative distance of the median,
/// so that near-identical trains (MAD ≈ 0) do not reject a 1 % neighbour.
const OUTLIER_FLOOR: f64 = 0.03;

/// One train's rate: bytes delivered per unit of arrival time, as the
/// least-squares slope through every arrival.
///
/// Packets lost in between are not counted: a drop-tail queue in front of
/// the bottleneck drops them before they take any of its time.
pub fn train_rate(train: &TrainObs) -> Result<TrainRate, TrainReject> {
    if train.arrivals.len() < MIN_ARRIVALS {
        return Err(TrainReject::TooFewArrivals);
    }
    let mut arr = train.arrivals.clone();
    arr.sort_by_key(|a| (a.at_ns, a.index));
    let (first, last) = match (arr.first(), arr.last()) {
        (Some(f), Some(l)) => (f.at_ns, l.at_ns),
        _ => return Err(TrainReject::TooFewArrivals),
    };
    let span = last.saturating_sub(first);
    if span < MIN_SPAN_NS {
        return Err(TrainReject::NoSpan);
    }
    // Least-squares slope of arrival time over bytes delivered: unlike the
    // first-to-last span it is not thrown off when the first or last packet
    // was timed early or late inside a clump.
    let mut points = Vec::with_capacity(arr.len());
    let mut cum = 0u64;
    for a in &arr {
        points.push((cum as f64, (a.at_ns - first) as f64));
        cum += u64::from(a.ip_bytes);
    }
    let whole = slope(&points).ok_or(TrainReject::NoSpan)?;
    // Long trains: the median of the windows' slopes, so that one stall or
    // burst inside the train does not move it (see the module docs).
    let ns_per_byte = windowed_slope(&points).unwrap_or(whole);
    let rate = 8.0 / (ns_per_byte * 1e-9);
    let send_ns = match (train.send_busy_ns, train.send_span_ns) {
        (0, span) => span,
        (busy, 0) => busy,
        (busy, span) => busy.min(span),
    };
    let sender_limited = if send_ns > 0 && train.sent > 1 {
        let sent_bytes = u64::from(train.sent - 1) * u64::from(train.ip_bytes);
        let send_rate = sent_bytes as f64 * 8.0 / (send_ns as f64 * 1e-9);
        send_rate < rate * 1.1
    } else {
        false
    };
    Ok(TrainRate {
        rate,
        sender_limited,
    })
}

/// Trains the sender pushed faster than they arrived needed to ignore the
/// sender-limited ones.
const MIN_FREE_TRAINS: usize = 3;

/// Combines the trains: drops outliers, takes the median of the rest and
/// says how confident it is. `None` when no train gave an estimate.
///
/// Sender-limited trains count only when fewer than [`MIN_FREE_TRAINS`]
/// others got out at full speed; the estimate is then a lower bound.
///
/// Confidence is `(1 − 5 × relative spread) × share of trains used`, where
/// the spread is the scaled MAD of the kept estimates over their median:
/// trains that agree within 2 % give about 0.9, within 10 % about 0.5.
pub fn combine(trains: &[TrainObs]) -> Option<RateEstimate> {
    let mut rates = Vec::new();
    let mut rejected = 0u32;
    for t in trains {
        match train_rate(t) {
            Ok(r) => rates.push(r),
            Err(_) => rejected += 1,
        }
    }
    if rates.is_empty() {
        return None;
    }
    // A train the sender could not push faster than it arrived measured
    // the sender (a descheduled thread, a full device queue), not the path.
    // When enough trains did get out fast, they alone speak for the path.
    let free = rates.iter().filter(|r| !r.sender_limited).count();
    if free >= MIN_FREE_TRAINS && free < rates.len() {
        rejected += (rates.len() - free) as u32;
        rates.retain(|r| !r.sender_limited);
    }
    let values: Vec<f64> = rates.iter().map(|r| r.rate).collect();
    let m = median(&values);
    let mad = median(&values.iter().map(|v| (v - m).abs()).collect::<Vec<_>>());
    let limit = (OUTLIER_MADS * MAD_SCALE * mad).max(OUTLIER_FLOOR * m);
    let kept: Vec<&TrainRate> = rates
        .iter()
        .filter(|r| (r.rate - m).abs() <= limit)
        .collect();
    let kept_values: Vec<f64> = kept.iter().map(|r| r.rate).collect();
    let rate = median(&kept_values);
    let kept_mad = median(
        &kept_values
            .iter()
            .map(|v| (v - rate).abs())
            .collect::<Vec<_>>(),
    );
    let spread = if rate > 0.0 {
        MAD_SCALE * kept_mad / rate
    } else {
        1.0
    };
    let total = trains.len().max(1) as f64;
    // One train alone has no spread to judge by: cap what it can claim.
    let single = if kept.len() < 3 { 0.5 } else { 1.0 };
    let confidence =
        ((1.0 - 5.0 * spread).clamp(0.0, 1.0) * kept.len() as f64 / total * single).clamp(0.0, 1.0);
    let limited = kept.iter().filter(|r| r.sender_limited).count();
    Some(RateEstimate {
        rate,
        low: kept_values.iter().copied().fold(f64::INFINITY, f64::min),
        high: kept_values.iter().copied().fold(0.0, f64::max),
        confidence,
        trains: trains.len() as u32,
        used: kept.len() as u32,
        outliers: (rates.len() - kept.len()) as u32,
        rejected,
        sender_limited: limited * 2 > kept.len(),
    })
}

/// Below this confidence a rate is "low" and the report says to treat it
/// as rough: the trains disagreed too much to trust one figure.
pub const ROUGH_BELOW: f64 = 0.4;

/// A word for a confidence, for people: high, medium or low.
pub fn confidence_label(confidence: f64) -> &'static str {
    if confidence >= 0.75 {
        "high"
    } else if confidence >= ROUGH_BELOW {
        "medium"
    } else {
        "low"
    }
}

/// Trains with fewer arrivals than this are fitted whole: their windows
/// would be too short to average clumped timestamps out.
pub const MIN_WINDOWED: usize = 128;

/// Least-squares slope (ns per byte) of `(bytes, ns)` points; `None` when
/// the points have no spread or time runs backwards.
fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    (sxx > 0.0 && sxy > 0.0).then(|| sxy / sxx)
}

/// The median slope of overlapping windows of a quarter of the points
/// (started every eighth of a window); `None` for trains shorter than
/// [`MIN_WINDOWED`] or when no window has a slope.
fn windowed_slope(points: &[(f64, f64)]) -> Option<f64> {
    if points.len() < MIN_WINDOWED {
        return None;
    }
    let width = points.len() / 4;
    let step = (width / 8).max(1);
    let slopes: Vec<f64> = (0..=points.len() - width)
        .step_by(step)
        .filter_map(|start| slope(&points[start..start + width]))
        .collect();
    (!slopes.is_empty()).then(|| median(&slopes))
}

/// Median of a non-empty slice (mean of the middle two for even lengths);
/// 0 for an empty one.
fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(x: f64) -> Duration {
        Duration::from_secs_f64(x / 1e3)
    }

    /// A train of `n` packets of `size` bytes leaving a `rate` link, each
    /// arrival shifted by `jitter(i)` ns.
    fn train(n: u32, size: u32, rate: f64, jitter: impl Fn(u32) -> i64) -> TrainObs {
        let gap = f64::from(size) * 8.0 / rate * 1e9;
        TrainObs {
            sent: n,
            ip_bytes: size,
            send_span_ns: (gap * f64::from(n) / 10.0) as u64,
            send_busy_ns: 0,
            arrivals: (0..n)
                .map(|i| Arrival {
                    index: i,
                    at_ns: (1_000_000_000.0 + gap * f64::from(i)) as u64 + jitter(i) as u64,
                    ip_bytes: size,
                })
                .collect(),
        }
    }

    #[test]
    fn rtt_stats_like_ping() {
        let s = rtt_stats(5, &[ms(10.0), ms(12.0), ms(14.0), ms(12.0)]).unwrap();
        assert_eq!(s.sent, 5);
        assert_eq!(s.received, 4);
        assert_eq!(s.min, ms(10.0));
        assert_eq!(s.max, ms(14.0));
        assert!((s.avg.as_secs_f64() - 0.012).abs() < 1e-9);
        // population stddev of 10,12,14,12 = sqrt(2) ms
        assert!((s.stddev.as_secs_f64() - 2f64.sqrt() / 1e3).abs() < 1e-9);
        assert!(rtt_stats(3, &[]).is_none());
        let one = rtt_stats(1, &[ms(40.0)]).unwrap();
        assert_eq!(one.stddev, Duration::ZERO);
    }

    #[test]
    fn clean_train_gives_the_link_rate() {
        let r = train_rate(&train(200, 1500, 1e9, |_| 0)).unwrap();
        assert!((r.rate / 1e9 - 1.0).abs() < 1e-3, "{}", r.rate);
        assert!(!r.sender_limited);
    }

    #[test]
    fn clumped_arrivals_still_give_the_span() {
        // Arrivals delivered in clumps of 8 at the time of the clump's last
        // packet (a forwarder waking every 8 gaps): pair gaps are 0 or 8×,
        // the train's span is still right within a clump.
        let gap = 12_000.0; // 1500 B at 1 Gbit/s
        let r = train_rate(&train(240, 1500, 1e9, |i| {
            ((7 - i64::from(i % 8)) as f64 * gap) as i64
        }))
        .unwrap();
        assert!((r.rate / 1e9 - 1.0).abs() < 0.01, "{}", r.rate);
    }

    #[test]
    fn lost_packets_are_not_counted_and_order_does_not_matter() {
        let mut t = train(100, 1500, 200e6, |_| 0);
        t.arrivals.retain(|a| a.index % 10 != 5);
        // Survivors were queued back to back: close the gaps the drops left.
        let gap = 1500.0 * 8.0 / 200e6 * 1e9;
        for (k, a) in t.arrivals.iter_mut().enumerate() {
            a.at_ns = 5_000 + (gap * k as f64) as u64;
        }
        t.arrivals.reverse();
        let r = train_rate(&t).unwrap();
        assert!((r.rate / 200e6 - 1.0).abs() < 1e-3, "{}", r.rate);
    }

    #[test]
    fn degenerate_trains_are_rejected() {
        let mut t = train(3, 1500, 1e9, |_| 0);
        assert_eq!(train_rate(&t), Err(TrainReject::TooFewArrivals));
        t = train(50, 1500, 1e9, |_| 0);
        for a in &mut t.arrivals {
            a.at_ns = 42;
        }
        assert_eq!(train_rate(&t), Err(TrainReject::NoSpan));
        assert!(combine(&[t]).is_none());
    }

    #[test]
    fn sender_limited_train_is_flagged() {
        let mut t = train(100, 1500, 1e9, |_| 0);
        // The sender needed as long as the arrivals took.
        t.send_span_ns = t.arrivals[99].at_ns - t.arrivals[0].at_ns;
        assert!(train_rate(&t).unwrap().sender_limited);
        let e = combine(&[t.clone(), t.clone(), t.clone()]).unwrap();
        assert!(e.sender_limited);
        // Three trains that got out fast outvote five slow ones: the slow
        // sender measured itself (0.3 Gbit/s), the fast ones the path.
        let mut slow = train(100, 1500, 0.3e9, |_| 0);
        slow.send_span_ns = slow.arrivals[99].at_ns - slow.arrivals[0].at_ns;
        let fast = train(100, 1500, 1e9, |_| 0);
        let mut mixed = vec![slow.clone(); 5];
        mixed.extend(vec![fast.clone(); 3]);
        let e = combine(&mixed).unwrap();
        assert!(!e.sender_limited, "{e:?}");
        assert!((e.rate / 1e9 - 1.0).abs() < 0.01, "{e:?}");
        assert_eq!((e.used, e.rejected), (3, 5));
        // Two fast trains are not enough to outvote them.
        let mut few = vec![slow; 5];
        few.extend(vec![fast; 2]);
        assert!(combine(&few).unwrap().sender_limited);
    }

    #[test]
    fn outlier_trains_are_dropped() {
        let mut trains: Vec<TrainObs> = (0..8)
            .map(|k| train(200, 1500, 1e9 * (1.0 + 0.004 * f64::from(k)), |_| 0))
            .collect();
        // One train met cross traffic (half rate), one a batched clock (4×).
        trains.push(train(200, 1500, 0.5e9, |_| 0));
        trains.push(train(200, 1500, 4e9, |_| 0));
        let e = combine(&trains).unwrap();
        assert_eq!(e.outliers, 2);
        assert_eq!(e.used, 8);
        assert!((e.rate / 1e9 - 1.014).abs() < 0.01, "{}", e.rate);
        assert!(e.low > 0.999e9 && e.high < 1.03e9, "{e:?}");
        assert!(e.confidence > 0.7, "{}", e.confidence);
        assert_eq!(confidence_label(e.confidence), "high");
    }

    #[test]
    fn spread_lowers_confidence() {
        let tight: Vec<TrainObs> = (0..6).map(|_| train(100, 1500, 1e9, |_| 0)).collect();
        let loose: Vec<TrainObs> = [0.85, 0.93, 1.0, 1.08, 1.15, 0.9]
            .iter()
            .map(|f| train(100, 1500, 1e9 * f, |_| 0))
            .collect();
        let a = combine(&tight).unwrap();
        let b = combine(&loose).unwrap();
        assert!(a.confidence > 0.99, "{}", a.confidence);
        assert!(b.confidence < a.confidence - 0.2, "{}", b.confidence);
        assert_eq!(b.outliers, 0);
    }

    #[test]
    fn rejected_and_single_trains_cost_confidence() {
        let good = train(100, 1500, 1e9, |_| 0);
        let mut empty = good.clone();
        empty.arrivals.truncate(2);
        let all = combine(&[good.clone(), good.clone(), good.clone(), good.clone()]).unwrap();
        let half = combine(&[
            good.clone(),
            good.clone(),
            good.clone(),
            empty.clone(),
            empty,
        ])
        .unwrap();
        assert_eq!(half.rejected, 2);
        assert!(half.confidence < all.confidence);
        let one = combine(&[good]).unwrap();
        assert!(one.confidence <= 0.5);
        assert_eq!(confidence_label(one.confidence), "medium");
        assert_eq!(confidence_label(0.1), "low");
    }

    /// A 5 Gbit/s train of 1024 packets of 1500 bytes (2.5 ms), the most
    /// a train may hold (the probe's default trains stop at 400).
    fn fast_train(jitter: impl Fn(u32) -> i64) -> TrainObs {
        train(1024, 1500, 5e9, jitter)
    }

    /// A small deterministic pseudo-random number in [-1, 1) for packet `i`.
    fn noise(i: u32) -> f64 {
        let x = (u64::from(i) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
        x as f64 / (1u64 << 23) as f64 - 1.0
    }

    #[test]
    fn a_stall_inside_a_fast_train_does_not_lower_its_rate() {
        // The forwarder (or the sender) was descheduled for 1 ms after the
        // 600th packet: every later arrival is 1 ms late.
        let t = fast_train(|i| if i >= 600 { 1_000_000 } else { 0 });
        let r = train_rate(&t).unwrap();
        assert!((r.rate / 5e9 - 1.0).abs() < 0.02, "{}", r.rate);
        // One slope through the whole train would have said ~3.5 Gbit/s.
        let mut points = Vec::new();
        let mut sorted = t.arrivals.clone();
        sorted.sort_by_key(|a| a.at_ns);
        for (k, a) in sorted.iter().enumerate() {
            points.push(((k * 1500) as f64, (a.at_ns - sorted[0].at_ns) as f64));
        }
        let whole = 8.0 / (slope(&points).unwrap() * 1e-9);
        assert!(whole < 4e9, "{whole}");
    }

    #[test]
    fn a_burst_after_a_stall_does_not_raise_a_fast_trains_rate() {
        // Packets 300..500 held back and then delivered at once (a
        // forwarder catching up on its backlog): their timestamps bunch up
        // at the 500th packet's time.
        let gap = 1500.0 * 8.0 / 5e9 * 1e9;
        let t = fast_train(|i| {
            if (300..500).contains(&i) {
                (f64::from(500 - i) * gap) as i64
            } else {
                0
            }
        });
        let r = train_rate(&t).unwrap();
        assert!((r.rate / 5e9 - 1.0).abs() < 0.03, "{}", r.rate);
    }

    #[test]
    fn gro_like_coalescing_and_jitter_at_5g_still_give_the_rate() {
        // Timestamps in clumps of 44 (one 64 kB GSO/GRO unit, all stamped
        // at its last packet) plus ±20 µs of jitter on every arrival.
        let gap = 1500.0 * 8.0 / 5e9 * 1e9;
        let t = fast_train(|i| {
            let clump = (43 - i64::from(i % 44)) as f64 * gap;
            (clump + 20_000.0 + 20_000.0 * noise(i)) as i64
        });
        let r = train_rate(&t).unwrap();
        assert!((r.rate / 5e9 - 1.0).abs() < 0.03, "{}", r.rate);
        // Six such trains, each with its own stall or none, agree.
        let trains: Vec<TrainObs> = (0..6u32)
            .map(|k| {
                fast_train(move |i| {
                    let stall = if k % 2 == 1 && i >= 200 * k {
                        800_000
                    } else {
                        0
                    };
                    stall + (20_000.0 * noise(i * 7 + k)) as i64 + 20_000
                })
            })
            .collect();
        let e = combine(&trains).unwrap();
        assert!((e.rate / 5e9 - 1.0).abs() < 0.03, "{e:?}");
        assert!(e.low > 4.7e9 && e.high < 5.3e9, "{e:?}");
        assert_eq!(confidence_label(e.confidence), "high", "{e:?}");
    }

    #[test]
    fn a_sender_descheduled_between_calls_is_not_sender_limited() {
        let mut t = fast_train(|_| 0);
        let span = t.arrivals[1023].at_ns - t.arrivals[0].at_ns;
        // The send took longer than the arrivals (a 3 ms stall between two
        // system calls), but its calls took a tenth of the train's time.
        t.send_span_ns = span + 3_000_000;
        t.send_busy_ns = span / 10;
        assert!(!train_rate(&t).unwrap().sender_limited);
        // Busy the whole time: the sender, not the path, set the pace.
        t.send_busy_ns = span;
        assert!(train_rate(&t).unwrap().sender_limited);
        // Unknown busy time: the span decides, as before.
        t.send_busy_ns = 0;
        assert!(train_rate(&t).unwrap().sender_limited);
    }

    #[test]
    fn short_trains_are_fitted_whole() {
        // Below MIN_WINDOWED arrivals the windows would be too short: the
        // whole-train slope is used, so a clump pattern still averages out.
        let gap = 12_000.0;
        let t = train(100, 1500, 1e9, |i| {
            ((3 - i64::from(i % 4)) as f64 * gap) as i64
        });
        assert!(t.arrivals.len() < MIN_WINDOWED);
        let r = train_rate(&t).unwrap();
        assert!((r.rate / 1e9 - 1.0).abs() < 0.01, "{}", r.rate);
    }

    #[test]
    fn median_of_even_and_odd() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }
}
