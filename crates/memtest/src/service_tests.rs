//! In-process tests of the test service: a real engine server on loopback
//! and the client, both ways, TCP and UDP, and streams added in flight.

use std::net::SocketAddr;

use fatpipe_engine::{Server, ServerBuilder, Shutdown};

use super::*;

fn start(builder: ServerBuilder) -> (SocketAddr, Shutdown) {
    let server = builder.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = server.local_addr();
    let shutdown = server.shutdown_handle();
    std::thread::spawn(move || server.run());
    (addr, shutdown)
}

fn test_params(protocol: crate::msg::Protocol) -> crate::msg::TestParams {
    use crate::msg::{Direction, Protocol, TestParams};
    TestParams {
        protocol,
        streams: 2,
        direction: Direction::Both,
        duration_ms: 300,
        bytes: None,
        omit_ms: 100,
        interval_ms: 100,
        window: None,
        force_buffers: false,
        start_window: None,
        mss: None,
        congestion: None,
        fq_rate: None,
        zerocopy: false,
        length: if protocol == Protocol::Tcp {
            65536
        } else {
            1000
        },
        bitrate: 10_000_000,
        no_batch: false,
    }
}

#[test]
fn memtest_runs_in_process_both_ways_tcp_and_udp() {
    use crate::msg::Protocol;
    use fatpipe_schema::test::Direction;
    let server = Server::builder()
        .service(TestService)
        .bind("127.0.0.1:0".parse().unwrap())
        .unwrap();
    let addr = server.local_addr();
    let stop = server.shutdown_handle();
    std::thread::spawn(move || server.run());
    for protocol in [Protocol::Tcp, Protocol::Udp] {
        let plan = TestPlan {
            server: addr.to_string(),
            addr,
            options: ClientOptions::default(),
            params: test_params(protocol),
        };
        let mut starts = 0;
        let mut intervals = 0;
        let report = run_client(&plan, &mut |p| match p {
            Progress::Start(_) => starts += 1,
            Progress::Interval(_) => intervals += 1,
        })
        .unwrap();
        assert_eq!(starts, 1);
        assert!(intervals >= 3, "{protocol:?}: {intervals} intervals");
        // The first interval is the omitted warm-up.
        assert!(report.intervals[0].omitted);
        assert!(!report.intervals[1].omitted);
        let dirs: Vec<_> = report.end.sums.iter().map(|s| s.direction).collect();
        assert_eq!(dirs, vec![Some(Direction::Up), Some(Direction::Down)]);
        for s in &report.end.streams {
            assert!(s.bytes > 0, "{protocol:?} stream {:?} moved nothing", s.id);
            // Measured after the warm-up: about 300 ms, not 400.
            assert!(
                (0.2..0.39).contains(&s.seconds),
                "{protocol:?} stream {:?}: {} s",
                s.id,
                s.seconds
            );
        }
        if protocol == Protocol::Udp {
            // 10 Mbit/s of 1000-byte datagrams over the measured 0.3 s.
            for s in &report.end.streams {
                let sent = s.packets_sent.unwrap_or(0);
                assert!((340..=420).contains(&sent), "sent {sent}");
            }
        }
    }
    stop.trigger();
}

/// Asks for scripted changes at given interval indices and records what
/// came of them.
struct Script {
    at: Vec<(u32, Adjustment)>,
    results: Vec<(Adjustment, Result<Applied, String>)>,
    streams_seen: Vec<usize>,
    unavailable: Option<String>,
}

impl Adjust for Script {
    fn on_interval(&mut self, iv: &fatpipe_schema::test::TestInterval) -> Option<Adjustment> {
        self.streams_seen.push(iv.streams.len());
        let i = self.at.iter().position(|(k, _)| *k == iv.index)?;
        Some(self.at.remove(i).1)
    }

    fn on_result(&mut self, change: &Adjustment, result: Result<Applied, String>) {
        self.results.push((change.clone(), result));
    }

    fn unavailable(&mut self, why: &str) {
        self.unavailable = Some(why.to_string());
    }
}

fn memtest_server() -> (SocketAddr, Shutdown) {
    start(Server::builder().service(TestService))
}

fn adjusted_run(
    addr: SocketAddr,
    params: crate::msg::TestParams,
    script: &mut Script,
) -> fatpipe_schema::test::TestReport {
    let plan = TestPlan {
        server: addr.to_string(),
        addr,
        options: ClientOptions::default(),
        params,
    };
    run_client_adjusting(&plan, &mut |_| {}, Some(script)).unwrap()
}

#[test]
fn memtest_adds_streams_while_data_flows() {
    use crate::msg::{Direction, Protocol};
    let (addr, stop) = memtest_server();
    let mut params = test_params(Protocol::Tcp);
    params.streams = 1;
    params.direction = Direction::Up;
    params.omit_ms = 0;
    params.duration_ms = 2000;
    params.interval_ms = 200;
    let mut script = Script {
        at: vec![(2, Adjustment::AddStreams(3))],
        results: Vec::new(),
        streams_seen: Vec::new(),
        unavailable: None,
    };
    let report = adjusted_run(addr, params, &mut script);
    assert_eq!(script.results.len(), 1, "{:?}", script.results);
    let applied = script.results[0].1.clone().unwrap();
    assert_eq!(applied.streams, 4);
    assert!(applied.at_s > 0.3 && applied.at_s < 1.5, "{applied:?}");
    // Intervals before the change show one stream, the last ones four.
    assert_eq!(script.streams_seen[0], 1);
    assert_eq!(script.streams_seen.last(), Some(&4));
    let end = &report.end;
    let ids: Vec<_> = end.streams.iter().map(|s| s.id).collect();
    assert_eq!(ids, [Some(0), Some(1), Some(2), Some(3)]);
    for s in &end.streams {
        assert!(s.bytes > 0, "stream {:?} moved nothing", s.id);
        assert!(s.bytes_sent >= s.bytes, "{s:?}");
    }
    let total: u64 = end.streams.iter().map(|s| s.bytes).sum();
    assert_eq!(end.sums.len(), 1);
    assert_eq!(end.sums[0].bytes, total);
    // Every interval's sum is its streams' sum.
    for iv in &report.intervals {
        let b: u64 = iv.streams.iter().map(|s| s.bytes).sum();
        assert_eq!(iv.sums[0].bytes, b);
    }
    // The report lists the added streams' sockets, both ends.
    assert_eq!(report.start.local.len(), 4);
    assert_eq!(report.start.remote.len(), 4);
    stop.trigger();
}

#[test]
fn memtest_adds_streams_both_ways_and_switches_congestion() {
    use crate::msg::{Direction, Protocol};
    use fatpipe_schema::test::Direction as Dir;
    let (addr, stop) = memtest_server();
    let mut params = test_params(Protocol::Tcp);
    params.streams = 1;
    params.direction = Direction::Both;
    params.omit_ms = 0;
    params.duration_ms = 2000;
    params.interval_ms = 200;
    // "reno" is built into every Linux kernel.
    let mut script = Script {
        at: vec![
            (1, Adjustment::AddStreams(2)),
            (4, Adjustment::SetCongestion("reno".into())),
        ],
        results: Vec::new(),
        streams_seen: Vec::new(),
        unavailable: None,
    };
    let report = adjusted_run(addr, params, &mut script);
    assert_eq!(script.results.len(), 2, "{:?}", script.results);
    assert_eq!(script.results[0].1.clone().unwrap().streams, 3);
    assert_eq!(script.results[1].1.clone().unwrap().streams, 3);
    let end = &report.end;
    // Streams 0 up and 1 down from the start, then 2, 3 up and 4, 5 down.
    let dirs: Vec<_> = end.streams.iter().map(|s| (s.id, s.direction)).collect();
    assert_eq!(
        dirs,
        [
            (Some(0), Some(Dir::Up)),
            (Some(1), Some(Dir::Down)),
            (Some(2), Some(Dir::Up)),
            (Some(3), Some(Dir::Up)),
            (Some(4), Some(Dir::Down)),
            (Some(5), Some(Dir::Down)),
        ]
    );
    for s in &end.streams {
        assert!(s.bytes > 0, "stream {:?} moved nothing", s.id);
    }
    for sum in &end.sums {
        let b: u64 = end
            .streams
            .iter()
            .filter(|s| s.direction == sum.direction)
            .map(|s| s.bytes)
            .sum();
        assert_eq!(sum.bytes, b);
    }
    stop.trigger();
}

#[test]
fn memtest_refuses_streams_beyond_the_bound() {
    use crate::msg::{Direction, Protocol, MAX_STREAMS};
    let (addr, stop) = memtest_server();
    let mut params = test_params(Protocol::Tcp);
    params.streams = 1;
    params.direction = Direction::Up;
    params.omit_ms = 0;
    params.duration_ms = 600;
    params.interval_ms = 200;
    let mut script = Script {
        at: vec![(0, Adjustment::AddStreams(MAX_STREAMS))],
        results: Vec::new(),
        streams_seen: Vec::new(),
        unavailable: None,
    };
    let report = adjusted_run(addr, params, &mut script);
    let err = script.results[0].1.clone().unwrap_err();
    assert!(err.contains("at most 1024"), "{err}");
    assert_eq!(report.end.streams.len(), 1);
    stop.trigger();
}

#[test]
fn memtest_udp_is_never_adjusted() {
    use crate::msg::Protocol;
    let (addr, stop) = memtest_server();
    let mut params = test_params(Protocol::Udp);
    params.omit_ms = 0;
    params.duration_ms = 400;
    params.interval_ms = 100;
    let mut script = Script {
        at: vec![(0, Adjustment::AddStreams(1))],
        results: Vec::new(),
        streams_seen: Vec::new(),
        unavailable: None,
    };
    let total = params.total_streams() as usize;
    let report = adjusted_run(addr, params, &mut script);
    assert!(script.unavailable.is_some());
    assert!(script.results.is_empty() && script.streams_seen.is_empty());
    assert_eq!(report.end.streams.len(), total);
    stop.trigger();
}
