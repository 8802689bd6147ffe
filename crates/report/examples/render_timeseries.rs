//! How long a run of 1,024 streams × 300 intervals takes to draw over
//! time (issue 30's target: ≤ 1 s), run by `bench/plots.sh`.
//!
//! Makes the document a `fatpipe test -P 1024 -t 300s --json` would print
//! (every interval's per-stream figures), then times, REPS times (default
//! 5), each step a user's `report --run ID --plot timeseries` takes:
//! parsing the JSON, the recipe (`timeseries::test_data`), drawing SVG,
//! drawing PNG; prints each step's median and the total's, wall clock and
//! this process's CPU time (on a shared machine the CPU time is ours, the
//! wall clock partly the neighbours').
//!
//!     cargo run --release -p fatpipe-report --example render_timeseries [STREAMS INTERVALS]

use std::time::Instant;

use fatpipe_report::plot::{Caption, Plot};
use fatpipe_report::timeseries;
use fatpipe_schema::test::{
    CpuUse, Protocol, StreamStats, TestDirection, TestEnd, TestInterval, TestReport, TestStart,
};

fn main() {
    let mut args = std::env::args().skip(1);
    let streams: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1024);
    let intervals: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(300);
    let reps: usize = std::env::var("REPS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    let json = match serde_json::to_string(&document(streams, intervals)) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("render_timeseries: {e}");
            std::process::exit(2);
        }
    };
    let png = std::env::temp_dir().join(format!("fatpipe-bench-plot-{}.png", std::process::id()));
    let mut rows: Vec<[f64; 5]> = Vec::new();
    let mut cpu = Vec::new();
    let mut svg_bytes = 0;
    for _ in 0..reps {
        let c0 = cpu_secs();
        let t0 = Instant::now();
        let doc: TestReport = match serde_json::from_str(&json) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("render_timeseries: {e}");
                std::process::exit(2);
            }
        };
        let t1 = Instant::now();
        let caption = Caption {
            title: format!("{streams} streams × {intervals} intervals"),
            context: "bench".into(),
        };
        let plot = match timeseries::test_data(&[("run".into(), &doc)], caption) {
            Ok(p) => Plot::Timeseries(p),
            Err(e) => {
                eprintln!("render_timeseries: {e}");
                std::process::exit(2);
            }
        };
        let t2 = Instant::now();
        let svg = plot.svg().map_err(|e| e.to_string());
        let t3 = Instant::now();
        let drawn = plot.png(&png).map_err(|e| e.to_string());
        let t4 = Instant::now();
        match (svg, drawn) {
            (Ok(s), Ok(())) => svg_bytes = s.len(),
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("render_timeseries: {e}");
                std::process::exit(2);
            }
        }
        let s = |a: Instant, b: Instant| (b - a).as_secs_f64();
        rows.push([s(t0, t1), s(t1, t2), s(t2, t3), s(t3, t4), s(t0, t4)]);
        cpu.push(cpu_secs() - c0);
    }
    // Its size, to show it was written (then it goes).
    let png_bytes = std::fs::metadata(&png).map_or(0, |m| m.len());
    let _ = std::fs::remove_file(&png);
    let med = |k: usize| {
        let mut v: Vec<f64> = rows.iter().map(|r| r[k]).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    cpu.sort_by(f64::total_cmp);
    println!(
        "{streams} streams x {intervals} intervals: JSON {:.1} MB, SVG {:.0} kB, PNG {:.0} kB; median of {reps}",
        json.len() as f64 / 1e6,
        svg_bytes as f64 / 1e3,
        png_bytes as f64 / 1e3
    );
    for (k, what) in ["parse JSON", "recipe", "draw SVG", "draw PNG", "total"]
        .iter()
        .enumerate()
    {
        println!("  {what:<11} {:>7.3} s", med(k));
    }
    println!("  total CPU   {:>7.3} s (this process)", cpu[cpu.len() / 2]);
}

/// This process's user + system CPU time, seconds (Linux; 0 elsewhere).
fn cpu_secs() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    let Some(rest) = stat.rsplit(") ").next() else {
        return 0.0;
    };
    // utime and stime are fields 14 and 15 of stat: the 12th and 13th
    // after the command's ")", in clock ticks (100 a second on Linux).
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok());
    match (tick(11), tick(12)) {
        (Some(u), Some(s)) => (u + s) / 100.0,
        _ => 0.0,
    }
}

/// A TCP test of `n` streams over `k` one-second intervals: each stream
/// ramps to its share of 10 Gbit/s, RTT and window per stream.
fn document(n: u32, k: u32) -> TestReport {
    let share = 10e9 / f64::from(n);
    let intervals = (0..k)
        .map(|i| {
            let ramp = (f64::from(i + 1) / 5.0).min(1.0);
            let streams: Vec<StreamStats> = (0..n)
                .map(|s| {
                    let bps = share * ramp * (0.8 + 0.4 * f64::from((s * 7 + i) % 11) / 10.0);
                    StreamStats {
                        id: Some(s),
                        seconds: 1.0,
                        bytes: (bps / 8.0) as u64,
                        bits_per_second: bps,
                        bytes_sent: (bps / 8.0) as u64,
                        retransmits: Some(u64::from((s + i) % 5 == 0)),
                        rtt_us: Some(93_000 + (s * 13 + i) % 4000),
                        rttvar_us: Some(500),
                        cwnd: Some((bps * 0.093 / 8.0) as u64),
                        ..StreamStats::default()
                    }
                })
                .collect();
            let sum = StreamStats {
                bits_per_second: streams.iter().map(|s| s.bits_per_second).sum(),
                ..StreamStats::default()
            };
            TestInterval {
                index: i,
                start_s: f64::from(i),
                end_s: f64::from(i + 1),
                omitted: false,
                streams,
                sums: vec![sum],
            }
        })
        .collect();
    TestReport {
        schema: "fatpipe.test".into(),
        version: 1,
        start: TestStart {
            timestamp: 0.0,
            server: "bench".into(),
            server_addr: "198.18.0.2:5301".into(),
            protocol: Protocol::Tcp,
            direction: TestDirection::Up,
            streams: n,
            duration_s: f64::from(k),
            bytes: None,
            omit_s: 0.0,
            interval_s: 1.0,
            length: 131_072,
            bitrate: None,
            window: None,
            mss: None,
            congestion: None,
            fq_rate: None,
            zerocopy: false,
            local: vec![],
            remote: vec![],
            warnings: vec![],
            auto: None,
            encryption: None,
        },
        intervals,
        end: TestEnd {
            seconds: f64::from(k),
            streams: vec![],
            sums: vec![],
            cpu_local: CpuUse::default(),
            cpu_remote: CpuUse::default(),
            rfc6349: None,
            ramp: None,
        },
    }
}
