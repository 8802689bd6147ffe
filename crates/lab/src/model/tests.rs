//! Tests of the link model on a virtual clock: every time here is made up,
//! so the answers are exact and the same on every run.

use super::*;

const MS: Nanos = 1_000_000;
const US: Nanos = 1_000;

fn cfg() -> DirConfig {
    DirConfig::default()
}

/// Runs `n` segments of `len` bytes arriving at `arrive(i)`; returns the
/// verdicts and due times.
fn run(link: &mut Link, n: usize, len: u32, arrive: impl Fn(usize) -> Nanos) -> Vec<Option<Nanos>> {
    (0..n)
        .map(|i| {
            let mut s = Segment::new(len, arrive(i));
            match link.process(&mut s) {
                Verdict::Pass => Some(s.at),
                Verdict::Drop(_) => None,
            }
        })
        .collect()
}

/// A two-sided bound of `z` standard deviations around `n * p`.
fn within_binomial(count: u64, n: u64, p: f64, z: f64) -> bool {
    let mean = n as f64 * p;
    let sd = (n as f64 * p * (1.0 - p)).sqrt();
    (count as f64 - mean).abs() <= z * sd
}

#[test]
fn delivery_time_is_serialization_plus_delay() {
    let mut link = Link::new(&DirConfig {
        rate_bps: 1_000_000_000,
        delay: 10 * MS,
        ..cfg()
    });
    let due = run(&mut link, 3, 1500, |_| 5 * MS);
    // 1500 bytes at 1 Gbit/s take 12 us; back-to-back segments queue.
    assert_eq!(
        due,
        vec![
            Some(15 * MS + 12 * US),
            Some(15 * MS + 24 * US),
            Some(15 * MS + 36 * US)
        ]
    );
}

#[test]
fn framing_overhead_is_charged_per_segment_on_the_wire() {
    // 1500 + 38 bytes at 1 Gbit/s take 12.304 us, not 12.
    let mut link = Link::new(&DirConfig {
        rate_bps: 1_000_000_000,
        overhead: ETHERNET_OVERHEAD,
        delay: 10 * MS,
        ..cfg()
    });
    let due = run(&mut link, 3, 1500, |_| 0);
    assert_eq!(
        due,
        vec![
            Some(10 * MS + 12_304),
            Some(10 * MS + 24_608),
            Some(10 * MS + 36_912)
        ]
    );
    // The counters stay in IP bytes: what the ends sent.
    assert_eq!(link.counters().delivered_bytes, 4500);
}

#[test]
fn ethernet_framing_leaves_a_nic_s_tcp_goodput() {
    // A saturated 1 Gbit/s link of full-sized TCP segments (1448 payload
    // bytes in 1500-byte packets) for one virtual second: with Ethernet's
    // 38 bytes the payload delivered is 1448/1538 of the rate (941.5
    // Mbit/s), without it 1448/1500 (965.3 Mbit/s), to one segment.
    for (overhead, want) in [(ETHERNET_OVERHEAD, 941.48e6), (0, 965.33e6)] {
        let mut link = Link::new(&DirConfig {
            rate_bps: 1_000_000_000,
            overhead,
            ..cfg()
        });
        let mut payload = 0u64;
        for _ in 0..200_000 {
            let mut s = Segment::new(1500, 0);
            link.process(&mut s);
            if s.at > 1_000_000_000 {
                break;
            }
            payload += 1448;
        }
        let got = payload as f64 * 8.0;
        assert!((got - want).abs() <= 1448.0 * 8.0, "{overhead}: {got}");
    }
}

#[test]
fn queue_limit_counts_the_framing_too() {
    // 15,380 bytes hold ten framed 1500-byte segments, not more.
    let mut link = Link::new(&DirConfig {
        rate_bps: 1_000_000_000,
        overhead: ETHERNET_OVERHEAD,
        queue_bytes: 15_380,
        ..cfg()
    });
    let kept = run(&mut link, 20, 1500, |_| 0)
        .iter()
        .filter(|d| d.is_some())
        .count();
    assert_eq!(kept, 10);
    assert_eq!(link.counters().peak_queue_bytes, 15_380);
}

#[test]
fn no_rate_means_pure_delay() {
    let mut link = Link::new(&DirConfig {
        delay: 46_500 * US,
        ..cfg()
    });
    let due = run(&mut link, 2, 65_000, |i| i as Nanos);
    assert_eq!(due, vec![Some(46_500 * US), Some(46_500 * US + 1)]);
}

#[test]
fn rate_is_exact_over_long_runs_even_when_not_a_divisor() {
    // 7 Gbit/s: 1500 bytes take 1714.28 ns, which does not round evenly.
    let mut link = Link::new(&DirConfig {
        rate_bps: 7_000_000_000,
        ..cfg()
    });
    let n = 1_000_000u64;
    let due = run(&mut link, n as usize, 1500, |_| 0);
    let last = due.last().copied().flatten().expect("delivered");
    let exact = n as f64 * 1500.0 * 8.0 / 7e9 * 1e9;
    assert!(
        (last as f64 - exact).abs() <= 1.0,
        "last {last} exact {exact}"
    );
    // And never faster than the rate at any prefix.
    for (i, d) in due.iter().enumerate().step_by(9973) {
        let d = d.expect("no queue limit");
        let min = (i as f64 + 1.0) * 1500.0 * 8.0 / 7e9 * 1e9;
        assert!(d as f64 >= min - 1.0, "segment {i} due {d} before {min}");
    }
}

#[test]
fn offered_load_below_rate_is_not_queued() {
    let mut link = Link::new(&DirConfig {
        rate_bps: 1_000_000_000,
        queue_bytes: 3000,
        ..cfg()
    });
    // One 1500-byte segment every 24 us: half the link.
    let due = run(&mut link, 10_000, 1500, |i| i as Nanos * 24 * US);
    for (i, d) in due.iter().enumerate() {
        assert_eq!(*d, Some(i as Nanos * 24 * US + 12 * US));
    }
    assert_eq!(link.counters().queue_drops, 0);
    assert_eq!(link.counters().peak_queue_bytes, 1500);
}

#[test]
fn drop_tail_queue_holds_its_limit_in_bytes() {
    let mut link = Link::new(&DirConfig {
        rate_bps: 1_000_000_000,
        queue_bytes: 15_000,
        ..cfg()
    });
    let due = run(&mut link, 100, 1500, |_| 0);
    let kept = due.iter().filter(|d| d.is_some()).count();
    assert_eq!(kept, 10, "a 15,000-byte queue holds ten 1500-byte segments");
    assert_eq!(link.counters().queue_drops, 90);
    assert_eq!(link.counters().peak_queue_bytes, 15_000);
    // Once one segment has left (12 us later) there is room for one more.
    let mut s = Segment::new(1500, 12 * US);
    assert_eq!(link.process(&mut s), Verdict::Pass);
    assert_eq!(s.at, 11 * 12 * US);
    let mut s = Segment::new(1500, 12 * US);
    assert_eq!(link.process(&mut s), Verdict::Drop(DropReason::Queue));
}

#[test]
fn queue_limit_in_time_is_bytes_at_the_rate() {
    // 1 ms at 1 Gbit/s is 125,000 bytes: a burst of 1000 keeps 83 segments.
    let mut link = Link::new(&DirConfig {
        rate_bps: 1_000_000_000,
        queue_bytes: 125_000,
        ..cfg()
    });
    let due = run(&mut link, 1000, 1500, |_| 0);
    let kept: Vec<Nanos> = due.iter().flatten().copied().collect();
    assert_eq!(kept.len(), 83);
    // The last kept segment waited less than the 1 ms the queue allows.
    assert!(*kept.last().unwrap_or(&0) <= MS);
}

#[test]
fn bernoulli_loss_within_binomial_bound_over_many_seeds() {
    for seed in 1..=5u64 {
        for p in [1e-4, 1e-3, 0.01, 0.1] {
            let mut link = Link::new(&DirConfig {
                loss: p,
                seed,
                ..cfg()
            });
            let n = 200_000u64;
            run(&mut link, n as usize, 1500, |i| i as Nanos);
            let lost = link.counters().random_losses;
            assert!(
                within_binomial(lost, n, p, 4.5),
                "seed {seed} p {p}: lost {lost} of {n}"
            );
        }
    }
}

#[test]
fn bursty_loss_keeps_its_long_run_rate_and_burst_length() {
    let p = 0.01;
    let burst = 5.0;
    let mut link = Link::new(&DirConfig {
        loss: p,
        loss_burst: burst,
        seed: 9,
        ..cfg()
    });
    let n = 1_000_000usize;
    let due = run(&mut link, n, 1500, |i| i as Nanos);
    let lost = due.iter().filter(|d| d.is_none()).count() as f64;
    // A Markov chain's count varies more than a binomial one: by the factor
    // (1 + l) / (1 - l), with l = 1 - p_gb - p_bg its second eigenvalue.
    let p_bg = 1.0 / burst;
    let p_gb = p / (burst * (1.0 - p));
    let l = 1.0 - p_gb - p_bg;
    let sd = (n as f64 * p * (1.0 - p) * (1.0 + l) / (1.0 - l)).sqrt();
    assert!(
        (lost - n as f64 * p).abs() <= 4.5 * sd,
        "lost {lost}, expected {} ± {}",
        n as f64 * p,
        4.5 * sd
    );
    let mut bursts = 0;
    let mut prev = false;
    for d in &due {
        let now = d.is_none();
        if now && !prev {
            bursts += 1;
        }
        prev = now;
    }
    let mean = lost / bursts as f64;
    assert!((mean - burst).abs() < 0.5, "mean burst {mean}");
}

#[test]
fn jitter_varies_delay_within_bounds_and_never_reorders() {
    let delay = 50 * MS;
    let jitter = 2 * MS;
    let mut link = Link::new(&DirConfig {
        rate_bps: 1_000_000_000,
        delay,
        jitter,
        seed: 4,
        ..cfg()
    });
    let mut rng = rng::Rng::new(11, 0);
    let mut t = 0;
    let mut last_due = 0;
    let mut delays = Vec::new();
    for _ in 0..200_000 {
        // Arrivals 0..30 us apart, often back to back: 0.8 Gbit/s on average.
        t += rng.below(30 * US);
        let mut s = Segment::new(1500, t);
        assert_eq!(link.process(&mut s), Verdict::Pass);
        assert!(s.at >= last_due, "reordered at {t}");
        last_due = s.at;
        delays.push((s.at - t) as f64);
    }
    let n = delays.len() as f64;
    let mean = delays.iter().sum::<f64>() / n;
    let sd = (delays.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / n).sqrt();
    let (lo, hi) = delays
        .iter()
        .fold((f64::MAX, 0.0f64), |(lo, hi), &d| (lo.min(d), hi.max(d)));
    // Queueing adds a little on top of delay + jitter at this load.
    assert!(lo >= (delay - jitter) as f64, "min {lo}");
    assert!(hi <= (delay + jitter + MS) as f64, "max {hi}");
    // The jitter is really there and centred, not collapsed to the maximum.
    assert!(sd > 0.5 * MS as f64, "sd {sd}");
    assert!((mean - delay as f64).abs() < 0.5 * MS as f64, "mean {mean}");
}

#[test]
fn lowering_the_delay_live_keeps_order() {
    let mut c = DirConfig {
        delay: 100 * MS,
        ..cfg()
    };
    let mut link = Link::new(&c);
    let first = run(&mut link, 1, 100, |_| 0)[0].expect("passes");
    c.delay = 10 * MS;
    link.configure(&c);
    let second = run(&mut link, 1, 100, |_| MS)[0].expect("passes");
    assert!(second >= first, "{second} < {first}");
    let third = run(&mut link, 1, 100, |_| 200 * MS)[0].expect("passes");
    assert_eq!(third, 210 * MS);
}

#[test]
fn down_time_drops_only_inside_the_window() {
    let link_cfg = DirConfig {
        delay: 5 * MS,
        down: Some((1000 * MS, 2000 * MS)),
        ..cfg()
    };
    let mut link = Link::new(&link_cfg);
    let due = run(&mut link, 4, 100, |i| [500, 1000, 1999, 2000][i] * MS);
    assert_eq!(due, vec![Some(505 * MS), None, None, Some(2005 * MS)]);
    assert_eq!(link.counters().down_drops, 2);
}

#[test]
fn corruption_follows_the_bit_error_rate() {
    let ber = 1e-6;
    let mut link = Link::new(&DirConfig {
        ber,
        seed: 21,
        ..cfg()
    });
    let n = 200_000u64;
    let mut bits_ok = true;
    for i in 0..n {
        let mut s = Segment::new(1500, i);
        link.process(&mut s);
        if let Some(b) = s.corrupt_bit {
            bits_ok &= b < 12_000;
        }
    }
    assert!(bits_ok);
    let p = 1.0 - (1.0 - ber).powf(12_000.0);
    let c = link.counters().corrupted;
    assert!(within_binomial(c, n, p, 4.5), "corrupted {c} of {n}, p {p}");
}

/// Runs `n` segments of 1500 bytes with `payload` payload bytes each, one
/// per virtual microsecond; returns the tamper marks.
fn tamper_marks(link: &mut Link, n: u64, payload: u32) -> Vec<Option<u32>> {
    (0..n)
        .map(|i| {
            let mut s = Segment::with_payload(1500, payload, i * US);
            link.process(&mut s);
            s.tamper_bit
        })
        .collect()
}

#[test]
fn tampering_follows_its_rate_over_payload_bits_only() {
    let ber = 1e-6;
    let tamper = |seed| DirConfig {
        tamper: ber,
        seed,
        ..cfg()
    };
    let mut link = Link::new(&tamper(21));
    let n = 200_000u64;
    let marks = tamper_marks(&mut link, n, 1448);
    // Only payload bits are named: 1448 bytes, never the 52 of headers.
    assert!(marks.iter().flatten().all(|&b| b < 1448 * 8));
    let p = 1.0 - (1.0 - ber).powf(1448.0 * 8.0);
    let c = link.counters();
    assert!(
        within_binomial(c.tampered, n, p, 4.5),
        "tampered {} of {n}, p {p}",
        c.tampered
    );
    assert_eq!(c.tampered, marks.iter().flatten().count() as u64);
    assert_eq!(
        (c.corrupted, c.delivered),
        (0, n),
        "nothing lost or detected"
    );
    // Pure ACKs carry no payload and are never hit, at any rate.
    let mut acks = Link::new(&DirConfig {
        tamper: 1.0,
        ..cfg()
    });
    assert!(tamper_marks(&mut acks, 1000, 0).iter().all(Option::is_none));
    // Seeded: the same seed marks the same bits, another seed others.
    let again = tamper_marks(&mut Link::new(&tamper(21)), n, 1448);
    assert_eq!(marks, again);
    assert_ne!(marks, tamper_marks(&mut Link::new(&tamper(22)), n, 1448));
}

#[test]
fn tampering_leaves_the_other_stages_alone_and_changes_live() {
    // Loss draws the same sequence with tampering on or off: turning it on
    // in a test changes nothing else about the link.
    let lossy = DirConfig {
        loss: 0.02,
        seed: 9,
        ..cfg()
    };
    let plain = run(&mut Link::new(&lossy), 50_000, 1500, |i| i as Nanos * US);
    let mut link = Link::new(&DirConfig {
        tamper: 1e-5,
        ..lossy.clone()
    });
    let tampered = run(&mut link, 50_000, 1500, |i| i as Nanos * US);
    assert_eq!(plain, tampered);
    let c = link.counters();
    assert!(c.tampered > 0 && c.tampered <= c.delivered);
    // A live change to 0 stops it; lost segments are never counted.
    link.configure(&lossy);
    let before = link.counters().tampered;
    run(&mut link, 10_000, 1500, |i| (50_000 + i as Nanos) * US);
    assert_eq!(link.counters().tampered, before);
}

#[test]
fn counters_add_up() {
    let mut link = Link::new(&DirConfig {
        rate_bps: 1_000_000_000,
        queue_bytes: 30_000,
        loss: 0.05,
        ..cfg()
    });
    run(&mut link, 10_000, 1000, |i| i as Nanos * 4 * US);
    let c = link.counters();
    assert_eq!(c.segments, 10_000);
    assert_eq!(c.bytes, 10_000_000);
    assert_eq!(
        c.delivered + c.random_losses + c.queue_drops + c.down_drops,
        c.segments
    );
    assert!(c.queue_drops > 0 && c.random_losses > 0);
}
