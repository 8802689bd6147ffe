//! The client against the server on loopback: both ends of this crate,
//! every direction and transport, and counts that agree byte for byte
//! (both ends drain what is in flight).

use std::sync::Arc;
use std::time::Duration;

use fatpipe_schema::test::{Direction, Protocol, TestDirection};

use crate::client::{self, Config};
use crate::server::{Iperf3Port, Options, MAX_HANDSHAKES, MAX_HANDSHAKES_PER_SOURCE};

/// An engine server on loopback with the iperf3 port as its front end
/// (and no fatpipe service); the iperf3 port's address.
fn server() -> std::net::SocketAddr {
    let opts = Options {
        handshake_timeout: Duration::from_secs(5),
        start_timeout: Duration::from_secs(5),
        auth: None,
    };
    let (listener, port) = Iperf3Port::bind(([127, 0, 0, 1], 0).into(), opts).expect("bind");
    let addr = port.local_addr();
    let caps = fatpipe_engine::PortCaps::new(MAX_HANDSHAKES, MAX_HANDSHAKES_PER_SOURCE);
    let server = fatpipe_engine::Server::builder()
        .max_sessions(4)
        .front_end(listener, Arc::new(port), caps)
        .bind(([127, 0, 0, 1], 0).into())
        .expect("bind the engine");
    std::thread::spawn(move || server.run());
    addr
}

fn config(addr: std::net::SocketAddr, protocol: Protocol, direction: TestDirection) -> Config {
    Config {
        server: addr.to_string(),
        addr,
        protocol,
        direction,
        streams: 2,
        time_s: 1,
        bytes: None,
        omit_s: 0,
        interval: Duration::from_millis(500),
        length: if protocol == Protocol::Tcp {
            128 * 1024
        } else {
            1200
        },
        bitrate: 20_000_000,
        window: None,
        mss: None,
        congestion: None,
        local_congestion: None,
        fq_rate: None,
        zerocopy: false,
        connect_timeout: Duration::from_secs(5),
        auth: None,
    }
}

#[test]
fn client_and_server_agree_in_every_direction() {
    let addr = server();
    for protocol in [Protocol::Tcp, Protocol::Udp] {
        for direction in [TestDirection::Up, TestDirection::Down, TestDirection::Both] {
            let cfg = config(addr, protocol, direction);
            let r = client::run(&cfg, &mut |_, _| {}, &mut |_| {})
                .unwrap_or_else(|e| panic!("{protocol:?} {direction:?}: {e}"));
            let want = if direction == TestDirection::Both {
                4
            } else {
                2
            };
            assert_eq!(r.end.streams.len(), want, "{protocol:?} {direction:?}");
            for s in &r.end.sums {
                assert!(s.bytes > 0, "{protocol:?} {direction:?}: {s:?}");
                if protocol == Protocol::Tcp {
                    assert_eq!(
                        s.bytes, s.bytes_sent,
                        "{protocol:?} {direction:?} {:?}",
                        s.direction
                    );
                } else {
                    let lost = s.lost.unwrap_or(0);
                    assert!(lost <= s.packets.unwrap_or(0) / 20, "{s:?}");
                }
            }
            let ids: Vec<u32> = r.end.streams.iter().filter_map(|s| s.id).collect();
            assert_eq!(&ids[..2], &[1, 3]);
            if direction == TestDirection::Both {
                assert_eq!(r.end.streams[2].direction, Some(Direction::Down));
            }
        }
    }
}

#[test]
fn a_byte_count_is_sent_exactly_both_ways() {
    let addr = server();
    for direction in [TestDirection::Up, TestDirection::Down] {
        let mut cfg = config(addr, Protocol::Tcp, direction);
        cfg.bytes = Some(8 << 20);
        let r = client::run(&cfg, &mut |_, _| {}, &mut |_| {}).expect("test");
        assert_eq!(r.end.sums[0].bytes, 8 << 20, "{direction:?}");
    }
}
