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
    let mut back = [0u8; 9];
    d.read_exact(&mut back).unwrap();
    assert_eq!(&back[..4], &42u32.to_be_bytes());
    assert_eq!(&back[4..], b"hello");
    c.send(b"bye").unwrap();
    // The server closes normally once the service returns.
    let end = c.recv(Some(Duration::from_secs(5))).unwrap_err();
    assert!(
        matches!(end, EngineError::Conn(ConnError::Closed(ref r)) if r.is_empty()),
        "{end:?}"
    );
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
