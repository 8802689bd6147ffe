//! Writes synthetic results into an archive and summarises them: the
//! program behind `bench/archive.sh` (issue 13's targets: at least 5,000
//! results/s written to SQLite, a report over 100,000 results in at most
//! 2 s).
//!
//! Each result is a realistic `fatpipe test` run: a full `fatpipe.test`
//! document (four streams, ten intervals, about 9 KB of JSON) and its
//! columns, placed in one of `--cells` sweep cells. Only the inserts are
//! timed for the write rate (building the runs is the CLI's cost, not the
//! archive's); the report is timed whole: query the columns, group by
//! cell, compute the statistics and render a text table.
//!
//! Usage: archive_bench [--archive PATH|postgres://URL] [--runs N]
//!                      [--batch N] [--cells N]
//! A SQLite archive is a fresh file (default in a temporary directory,
//! removed afterwards); a PostgreSQL one a fresh schema, dropped afterwards.
//! Prints one line of `key=value` pairs; `write_per_cpu_s` is the write rate
//! per second of this process's CPU time (the server's, for PostgreSQL, is
//! not in it), which a busy machine does not distort.

use std::fmt::Write as _;
use std::time::Instant;

use chrono::{TimeDelta, TimeZone, Utc};
use fatpipe_archive::stats::{by_cell, Summary};
use fatpipe_archive::{HostFacts, Location, PgStore, Run, RunFilter, SqliteStore, Store};
use fatpipe_schema::test::{
    CpuUse, Direction, StreamStats, TestEnd, TestInterval, TestReport, TestStart,
};

fn main() {
    if let Err(e) = run() {
        eprintln!("archive_bench: {e}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut archive: Option<String> = None;
    let (mut runs, mut batch, mut cells) = (100_000usize, 1_000usize, 100usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--archive" => archive = Some(value()?),
            "--runs" => runs = value()?.parse()?,
            "--batch" => batch = value()?.parse::<usize>()?.max(1),
            "--cells" => cells = value()?.parse::<usize>()?.max(1),
            _ => return Err(format!("unknown argument {a}").into()),
        }
    }

    let tmp = tempfile::tempdir()?;
    let location = match archive {
        Some(a) => Location::parse(&a),
        None => Location::Sqlite(tmp.path().join("bench.sqlite")),
    };
    let schema = format!("bench_{}", std::process::id());
    let mut store: Box<dyn Store> = match &location {
        Location::Sqlite(p) => {
            if p.exists() {
                return Err(format!("{} exists; give a new file", p.display()).into());
            }
            Box::new(SqliteStore::open(p)?)
        }
        Location::Postgres(url) => Box::new(PgStore::open_with(
            url,
            Some(&schema),
            fatpipe_archive::SCHEMA_VERSION,
        )?),
    };

    let template = sample_report();
    let host = HostFacts {
        hostname: "bench".into(),
        kernel: "6.1.0".into(),
        fatpipe_version: env!("CARGO_PKG_VERSION").into(),
        cpu_count: 2,
        ..HostFacts::default()
    };
    let t0 = Utc.timestamp_opt(1_750_000_000, 0).single().ok_or("time")?;
    let mut doc_bytes = 0usize;
    let mut write_secs = 0.0f64;
    let mut write_cpu = 0.0f64;
    let mut done = 0usize;
    while done < runs {
        let n = batch.min(runs - done);
        let mut chunk = Vec::with_capacity(n);
        for i in done..done + n {
            let mut report = template.clone();
            // Vary the figures so the statistics have work to do.
            let f = 1.0 + ((i * 7919) % 1000) as f64 / 1000.0;
            for s in &mut report.end.sums {
                s.bits_per_second *= f;
                s.retransmits = Some((i % 97) as u64);
            }
            let finished = t0 + TimeDelta::seconds(i as i64 * 12);
            report.start.timestamp = (finished - TimeDelta::seconds(11)).timestamp() as f64;
            let cell = format!(
                "{{\"streams\":{},\"window\":\"{}M\"}}",
                1 + i % cells % 8,
                1 << (i % cells / 8)
            );
            let r = Run::from_test(&report, "bench→peer", host.clone(), finished)?.with_sweep(
                "bench",
                cell,
                (i / cells) as u32,
            );
            doc_bytes += r.document.as_ref().map_or(0, |d| d.as_str().len());
            chunk.push(r);
        }
        let start = Instant::now();
        let cpu0 = cpu_secs();
        let ins = store.insert_runs(&chunk)?;
        write_secs += start.elapsed().as_secs_f64();
        write_cpu += cpu_secs() - cpu0;
        if ins.added() != n {
            return Err("some runs were not stored".into());
        }
        done += n;
    }

    let start = Instant::now();
    let measured = store.measurements(&RunFilter::all())?;
    let query_secs = start.elapsed().as_secs_f64();
    let stats = by_cell(&measured);
    let table = render(&stats);
    let report_secs = start.elapsed().as_secs_f64();
    if measured.len() != runs {
        return Err(format!("read {} runs back, wrote {runs}", measured.len()).into());
    }

    println!(
        "backend={} runs={runs} batch={batch} cells={} doc_bytes_avg={} write_s={:.3} \
         write_per_s={:.0} write_per_cpu_s={:.0} query_s={:.3} report_s={:.3} table_lines={}",
        store.backend(),
        stats.len(),
        doc_bytes / runs.max(1),
        write_secs,
        runs as f64 / write_secs,
        runs as f64 / write_cpu,
        query_secs,
        report_secs,
        table.lines().count(),
    );

    if let Location::Postgres(url) = &location {
        drop(store);
        let mut c = postgres::Client::connect(url, postgres::NoTls)?;
        c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))?;
    }
    Ok(())
}

/// CPU time this thread has run, seconds (Linux `/proc/thread-self/schedstat`;
/// NaN elsewhere). On a shared machine the wall-clock rate depends on the
/// neighbours; the rate per CPU second does not.
fn cpu_secs() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .next()
                .and_then(|ns| ns.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |ns| ns / 1e9)
}

/// The text table a report would print: one line per cell.
fn render(stats: &[fatpipe_archive::stats::CellStats]) -> String {
    let mut out =
        String::from("cell  n  median  p10  p90  mean  sd  retr-median  rtt-avg-median\n");
    let g = |s: Option<Summary>, f: fn(&Summary) -> f64| {
        s.map_or("n/a".to_owned(), |s| format!("{:.3}", f(&s) / 1e9))
    };
    for c in stats {
        let tp = c.throughput_bps;
        let _ = writeln!(
            out,
            "{}  {}  {}  {}  {}  {}  {}  {}  {}",
            c.key.cell.as_deref().unwrap_or("-"),
            tp.map_or(0, |s| s.n),
            g(tp, |s| s.median),
            g(tp, |s| s.p10),
            g(tp, |s| s.p90),
            g(tp, |s| s.mean),
            g(tp, |s| s.stddev.unwrap_or(f64::NAN)),
            c.retransmits.map_or(f64::NAN, |s| s.median),
            c.rtt_avg_us.map_or(f64::NAN, |s| s.median),
        );
    }
    out
}

/// A 4-stream, 10-interval TCP test like `fatpipe test -P 4 -t 10` prints.
fn sample_report() -> TestReport {
    let stream = |id: u32| StreamStats {
        id: Some(id),
        direction: Some(Direction::Up),
        seconds: 1.0,
        bytes: 29_000_000,
        bits_per_second: 232e6,
        bytes_sent: 29_100_000,
        retransmits: Some(3),
        rtt_us: Some(93_000 + id * 500),
        rttvar_us: Some(800),
        cwnd: Some(12_000_000),
        ..StreamStats::default()
    };
    let sum = StreamStats {
        id: None,
        direction: Some(Direction::Up),
        seconds: 10.0,
        bytes: 1_160_000_000,
        bits_per_second: 928e6,
        bytes_sent: 1_164_000_000,
        retransmits: Some(12),
        rtt_us: Some(94_250),
        cwnd: Some(48_000_000),
        ..StreamStats::default()
    };
    TestReport {
        schema: "fatpipe.test".into(),
        version: 1,
        start: TestStart {
            timestamp: 0.0,
            server: "peer:5301".into(),
            server_addr: "198.18.0.2:5301".into(),
            protocol: fatpipe_schema::test::Protocol::Tcp,
            direction: fatpipe_schema::test::TestDirection::Up,
            streams: 4,
            duration_s: 10.0,
            bytes: None,
            omit_s: 0.0,
            interval_s: 1.0,
            length: 131_072,
            bitrate: None,
            window: Some(32 << 20),
            mss: None,
            congestion: Some("bbr".into()),
            fq_rate: None,
            zerocopy: false,
            local: vec![],
            remote: vec![],
            warnings: vec![],
            auto: None,
            encryption: None,
        },
        intervals: (0..10)
            .map(|i| TestInterval {
                index: i,
                start_s: i as f64,
                end_s: i as f64 + 1.0,
                omitted: false,
                streams: (1..=4).map(stream).collect(),
                sums: vec![StreamStats {
                    seconds: 1.0,
                    ..sum.clone()
                }],
            })
            .collect(),
        end: TestEnd {
            seconds: 10.0,
            streams: (1..=4).map(stream).collect(),
            sums: vec![sum],
            cpu_local: CpuUse {
                total_percent: 38.0,
                user_percent: 3.0,
                system_percent: 35.0,
            },
            cpu_remote: CpuUse {
                total_percent: 55.0,
                user_percent: 5.0,
                system_percent: 50.0,
            },
            rfc6349: None,
            ramp: None,
        },
    }
}
