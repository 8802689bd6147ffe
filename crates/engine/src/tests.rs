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
