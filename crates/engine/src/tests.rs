//! Server and client over real loopback sockets with a small echo service.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use fatpipe_proto::{ConnError, ErrorCode, Key};

use super::*;

/// Echoes control payloads until "bye"; on "data", echoes one data
/// connection's bytes back with its tag prepended.
struct Echo;

impl Service for Echo {
    fn name(&self) -> &'static str {
        "echo"
    }

    fn check(&self, params: &[u8]) -> Result<(), String> {
        if params == b"refuse" {
            return Err("refused as asked".into());
        }
        Ok(())
    }

    fn serve(&self, session: ServerSession) -> ServiceResult {
        let control = session.control();
        control.send(session.params())?;
        while let Some(msg) = control.recv(Some(Duration::from_secs(5)))? {
            match &msg[..] {
                b"bye" => return Ok(()),
                b"data" => {
                    let mut d = session.accept_data(Duration::from_secs(5))?;
                    let mut buf = [0u8; 5];
                    d.stream.read_exact(&mut buf)?;
                    d.stream.write_all(&d.tag.to_be_bytes())?;
                    d.stream.write_all(&buf)?;
                }
                b"sleep" => std::thread::sleep(Duration::from_millis(500)),
                _ => control.send(&msg)?,
            }
        }
        Err("client went quiet".into())
    }
}

fn start(builder: ServerBuilder) -> (SocketAddr, Shutdown) {
    let server = builder
        .service(Echo)
        .bind("127.0.0.1:0".parse().unwrap())
        .unwrap();
    let addr = server.local_addr();
    let stop = server.shutdown_handle();
    std::thread::spawn(move || server.run());
    (addr, stop)
}

fn key(k: &[u8]) -> Key {
    Key::new(k).unwrap()
}

/// A keyless echo session whose service is waiting for a data connection.
fn echo_awaiting_data(addr: SocketAddr) -> ClientSession {
    let s = connect(addr, None, "echo", b"x").unwrap();
    let c = s.control();
    assert_eq!(c.recv(Some(Duration::from_secs(5))).unwrap().unwrap(), b"x");
    c.send(b"data").unwrap();
    s
}

/// Reads the echo service's answer on a data connection: its tag, then the
/// 5 bytes it was sent.
fn expect_echo(d: &mut TcpStream, tag: u32, sent: &[u8; 5]) {
    d.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut back = [0u8; 9];
    d.read_exact(&mut back).unwrap();
    assert_eq!(&back[..4], &tag.to_be_bytes());
    assert_eq!(&back[4..], sent);
}

#[test]
fn echo_session_with_key_and_data_connection() {
    let (addr, stop) = start(Server::builder().key(Some(key(b"sesame-sesame"))));
    let s = connect(addr, Some(&key(b"sesame-sesame")), "echo", b"hi").unwrap();
    let c = s.control();
    assert_eq!(
        c.recv(Some(Duration::from_secs(5))).unwrap().unwrap(),
        b"hi"
    );
    c.send(b"ping").unwrap();
    assert_eq!(
        c.recv(Some(Duration::from_secs(5))).unwrap().unwrap(),
        b"ping"
    );
    c.send(b"data").unwrap();
    let mut d = s.open_data(42).unwrap();
    d.write_all(b"hello").unwrap();
    expect_echo(&mut d, 42, b"hello");
    c.send(b"bye").unwrap();
    // The server closes normally once the service returns.
    let end = c.recv(Some(Duration::from_secs(5))).unwrap_err();
    assert!(
        matches!(end, EngineError::Conn(ConnError::Closed(ref r)) if r.is_empty()),
        "{end:?}"
    );
    stop.trigger();
}

/// Bytes a client sends right behind its data hello (in the same write)
/// reach the service: the server's handshake never reads past the hello.
#[test]
fn bytes_right_behind_the_data_hello_reach_the_service() {
    let (addr, stop) = start(Server::builder());
    let s = echo_awaiting_data(addr);
    let mut wire = Vec::new();
    fatpipe_proto::Message::DataHello {
        version: fatpipe_proto::VERSION,
        cookie: s.cookie,
        tag: 7,
    }
    .encode(&mut wire)
    .unwrap();
    wire.extend_from_slice(b"early");
    let mut d = TcpStream::connect(addr).unwrap();
    d.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    d.write_all(&wire).unwrap();
    // The acknowledgement, then the service's echo of the early bytes.
    let mut header = [0u8; 4];
    d.read_exact(&mut header).unwrap();
    let mut body = vec![0u8; u32::from_be_bytes(header) as usize];
    d.read_exact(&mut body).unwrap();
    assert_eq!(
        fatpipe_proto::Message::decode(&body).unwrap(),
        fatpipe_proto::Message::DataAck
    );
    expect_echo(&mut d, 7, b"early");
    s.control().send(b"bye").unwrap();
    stop.trigger();
}

/// `open_data_early` returns before the acknowledgement; the data written
/// at once arrives, and a refused connection is shut down so that writing
/// fails instead of going nowhere.
#[test]
fn early_data_connections_carry_data_and_fail_fast_when_refused() {
    let (addr, stop) = start(Server::builder());
    let s = echo_awaiting_data(addr);
    let mut d = s.open_data_early(9).unwrap();
    d.write_all(b"quick").unwrap();
    // The watcher takes the acknowledgement off the socket (loopback: well
    // within this); what is left to read is the echo alone.
    std::thread::sleep(Duration::from_millis(300));
    expect_echo(&mut d, 9, b"quick");

    let mut fake = connect(addr, None, "echo", b"z").unwrap();
    fake.cookie = [0; 32];
    let mut refused = fake.open_data_early(1).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let failed = loop {
        if refused.write_all(&[0u8; 4096]).is_err() {
            break true;
        }
        if std::time::Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        failed,
        "writes into a refused data connection keep succeeding"
    );
    s.control().send(b"bye").unwrap();
    stop.trigger();
}

#[test]
fn wrong_or_missing_key_is_an_auth_error() {
    let (addr, stop) = start(Server::builder().key(Some(key(b"sesame-sesame"))));
    let err = connect(addr, Some(&key(b"not-the-key")), "echo", b"").unwrap_err();
    assert!(err.is_auth(), "{err}");
    let err = connect(addr, None, "echo", b"").unwrap_err();
    assert!(err.is_auth(), "{err}");
    stop.trigger();
}

#[test]
fn refusals_carry_their_reason() {
    let (addr, stop) = start(Server::builder().max_sessions(1));
    let err = connect(addr, None, "nope", b"").unwrap_err();
    assert!(err.to_string().contains("offered: echo"), "{err}");
    let err = connect(addr, None, "echo", b"refuse").unwrap_err();
    assert!(err.to_string().contains("refused as asked"), "{err}");
    let first = connect(addr, None, "echo", b"").unwrap();
    let err = connect(addr, None, "echo", b"").unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::Conn(ConnError::Rejected {
                code: ErrorCode::Busy,
                ..
            })
        ),
        "{err}"
    );
    drop(first);
    stop.trigger();
}

#[test]
fn hostile_connections_do_not_disturb_a_session() {
    let (addr, stop) = start(Server::builder().preauth_timeout(Duration::from_millis(300)));
    let s = connect(addr, None, "echo", b"x").unwrap();
    let c = s.control();
    assert_eq!(c.recv(Some(Duration::from_secs(5))).unwrap().unwrap(), b"x");
    // Garbage, a giant frame header, a stalled handshake, a bad cookie.
    let mut garbage = TcpStream::connect(addr).unwrap();
    garbage.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut giant = TcpStream::connect(addr).unwrap();
    giant.write_all(&u32::MAX.to_be_bytes()).unwrap();
    let stalled = TcpStream::connect(addr).unwrap();
    let other = connect(addr, None, "echo", b"y").unwrap();
    let mut fake = connect(addr, None, "echo", b"z").unwrap();
    fake.cookie = [0; 32];
    let err = fake.open_data(1).unwrap_err();
    assert!(matches!(
        err,
        EngineError::Conn(ConnError::Rejected {
            code: ErrorCode::BadCookie,
            ..
        })
    ));
    // The stalled one is cut at the pre-auth deadline.
    let mut stalled = stalled;
    stalled
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let mut sink = Vec::new();
    let _ = stalled.read_to_end(&mut sink);
    assert!(!sink.is_empty(), "the server explains the timeout");
    // Both real sessions still work.
    c.send(b"still here").unwrap();
    assert_eq!(
        c.recv(Some(Duration::from_secs(5))).unwrap().unwrap(),
        b"still here"
    );
    let oc = other.control();
    assert_eq!(
        oc.recv(Some(Duration::from_secs(5))).unwrap().unwrap(),
        b"y"
    );
    stop.trigger();
}

#[test]
fn recv_times_out_without_losing_the_channel() {
    let (addr, stop) = start(Server::builder());
    let s = connect(addr, None, "echo", b"p").unwrap();
    let c = s.control();
    assert_eq!(c.recv(Some(Duration::from_secs(5))).unwrap().unwrap(), b"p");
    c.send(b"sleep").unwrap();
    c.send(b"after").unwrap();
    assert_eq!(c.recv(Some(Duration::from_millis(50))).unwrap(), None);
    assert_eq!(
        c.recv(Some(Duration::from_secs(5))).unwrap().unwrap(),
        b"after"
    );
    stop.trigger();
}

fn test_params(protocol: fatpipe_proto::testmsg::Protocol) -> fatpipe_proto::testmsg::TestParams {
    use fatpipe_proto::testmsg::{Direction, Protocol, TestParams};
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
    }
}

#[test]
fn memtest_runs_in_process_both_ways_tcp_and_udp() {
    use fatpipe_proto::testmsg::Protocol;
    use fatpipe_schema::test::Direction;
    let server = Server::builder()
        .service(memtest::TestService)
        .bind("127.0.0.1:0".parse().unwrap())
        .unwrap();
    let addr = server.local_addr();
    let stop = server.shutdown_handle();
    std::thread::spawn(move || server.run());
    for protocol in [Protocol::Tcp, Protocol::Udp] {
        let plan = memtest::TestPlan {
            server: addr.to_string(),
            addr,
            options: ClientOptions::default(),
            params: test_params(protocol),
        };
        let mut starts = 0;
        let mut intervals = 0;
        let report = memtest::run_client(&plan, &mut |p| match p {
            memtest::Progress::Start(_) => starts += 1,
            memtest::Progress::Interval(_) => intervals += 1,
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
    at: Vec<(u32, memtest::Adjustment)>,
    results: Vec<(memtest::Adjustment, Result<memtest::Applied, String>)>,
    streams_seen: Vec<usize>,
    unavailable: Option<String>,
}

impl memtest::Adjust for Script {
    fn on_interval(
        &mut self,
        iv: &fatpipe_schema::test::TestInterval,
    ) -> Option<memtest::Adjustment> {
        self.streams_seen.push(iv.streams.len());
        let i = self.at.iter().position(|(k, _)| *k == iv.index)?;
        Some(self.at.remove(i).1)
    }

    fn on_result(
        &mut self,
        change: &memtest::Adjustment,
        result: Result<memtest::Applied, String>,
    ) {
        self.results.push((change.clone(), result));
    }

    fn unavailable(&mut self, why: &str) {
        self.unavailable = Some(why.to_string());
    }
}

fn memtest_server() -> (SocketAddr, Shutdown) {
    start(Server::builder().service(memtest::TestService))
}

fn adjusted_run(
    addr: SocketAddr,
    params: fatpipe_proto::testmsg::TestParams,
    script: &mut Script,
) -> fatpipe_schema::test::TestReport {
    let plan = memtest::TestPlan {
        server: addr.to_string(),
        addr,
        options: ClientOptions::default(),
        params,
    };
    memtest::run_client_adjusting(&plan, &mut |_| {}, Some(script)).unwrap()
}

#[test]
fn memtest_adds_streams_while_data_flows() {
    use fatpipe_proto::testmsg::{Direction, Protocol};
    let (addr, stop) = memtest_server();
    let mut params = test_params(Protocol::Tcp);
    params.streams = 1;
    params.direction = Direction::Up;
    params.omit_ms = 0;
    params.duration_ms = 2000;
    params.interval_ms = 200;
    let mut script = Script {
        at: vec![(2, memtest::Adjustment::AddStreams(3))],
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
    use fatpipe_proto::testmsg::{Direction, Protocol};
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
            (1, memtest::Adjustment::AddStreams(2)),
            (4, memtest::Adjustment::SetCongestion("reno".into())),
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
    use fatpipe_proto::testmsg::{Direction, Protocol, MAX_STREAMS};
    let (addr, stop) = memtest_server();
    let mut params = test_params(Protocol::Tcp);
    params.streams = 1;
    params.direction = Direction::Up;
    params.omit_ms = 0;
    params.duration_ms = 600;
    params.interval_ms = 200;
    let mut script = Script {
        at: vec![(0, memtest::Adjustment::AddStreams(MAX_STREAMS))],
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
    use fatpipe_proto::testmsg::Protocol;
    let (addr, stop) = memtest_server();
    let mut params = test_params(Protocol::Udp);
    params.omit_ms = 0;
    params.duration_ms = 400;
    params.interval_ms = 100;
    let mut script = Script {
        at: vec![(0, memtest::Adjustment::AddStreams(1))],
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
