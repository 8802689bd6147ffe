//! A side's own bookkeeping: totals of idle streams and the final merge.

use super::*;

/// A finished end whose streams never moved a byte and whose sockets
/// give no TCP_INFO (UDP sockets on loopback, no workers): its totals
/// are all zero, so every number comes from the peer's samples.
fn idle_side(p: &TestParams, streams: &[(u32, Role)]) -> Side {
    let (tx, rx) = mpsc::channel();
    let streams: Vec<Stream> = streams
        .iter()
        .map(|&(id, role)| Stream {
            id,
            role,
            sock: Arc::new(Sock::Udp(
                UdpSocket::bind("127.0.0.1:0").expect("bind a loopback UDP socket"),
            )),
            counters: Arc::default(),
            setup: SocketSetup::default(),
        })
        .collect();
    let n = streams.len();
    let now = Instant::now();
    Side {
        shared: Arc::new(data::Shared::new(p.clone())),
        streams,
        workers: Vec::new(),
        rx,
        tx,
        config: p.clone(),
        sent_done: true,
        peer_sent_done: true,
        running: 0,
        senders_running: 0,
        interval: Duration::from_millis(p.interval_ms),
        omit: Duration::ZERO,
        next_tick: now,
        tick_index: 0,
        last: vec![data::Snapshot::default(); n],
        at_omit: vec![data::Snapshot::default(); n],
        omit_ns: 0,
        udp_drain_at: None,
        closed: true,
        moved: 0,
        last_progress: now,
        stall_limit: Duration::from_secs(60),
        ramp: None,
    }
}

#[test]
fn totals_of_idle_streams_keep_ids_and_roles() {
    let side = idle_side(
        &tcp(Direction::Both, 1),
        &[(0, Role::Send), (1, Role::Recv), (5, Role::Send)],
    );
    assert_eq!(side.totals(), vec![send(0), recv(1), send(5)]);
}

#[test]
fn merge_final_times_each_stream_by_its_receiver() {
    struct Row {
        name: &'static str,
        p: TestParams,
        local: Vec<(u32, Role)>,
        remote: Vec<StreamSample>,
        want_seconds: f64,
        want_streams: Vec<StreamStats>,
        want_sums: Vec<StreamStats>,
    }
    let rows = [
        Row {
            name: "tcp up: the server receives, its elapsed time is the period",
            p: tcp(Direction::Up, 2),
            local: vec![(0, Role::Send), (1, Role::Send)],
            remote: vec![
                StreamSample {
                    bytes: 5_000_000,
                    elapsed_us: 2_000_000,
                    ..recv(0)
                },
                StreamSample {
                    bytes: 2_500_000,
                    elapsed_us: 1_000_000,
                    ..recv(1)
                },
            ],
            want_seconds: 2.0,
            // 5 MB * 8 / 2 s = 20 Mbit/s; 2.5 MB * 8 / 1 s = 20 Mbit/s
            want_streams: vec![
                tcp_stats(Some(0), UP, 2.0, 5_000_000, 20e6, 0, (0, 0, 0, 0)),
                tcp_stats(Some(1), UP, 1.0, 2_500_000, 20e6, 0, (0, 0, 0, 0)),
            ],
            want_sums: vec![tcp_stats(None, UP, 2.0, 7_500_000, 40e6, 0, (0, 0, 0, 0))],
        },
        Row {
            name: "tcp reverse: the client receives; the server's time is not used",
            p: tcp(Direction::Down, 1),
            local: vec![(0, Role::Recv)],
            remote: vec![StreamSample {
                bytes: 9_000_000,
                retransmits: 12,
                rtt_us: 50_000,
                rttvar_us: 5_000,
                cwnd: 2_000_000,
                elapsed_us: 3_000_000,
                ..send(0)
            }],
            want_seconds: 0.0,
            want_streams: vec![tcp_stats(
                Some(0),
                DOWN,
                0.0,
                0,
                0.0,
                9_000_000,
                (12, 50_000, 5_000, 2_000_000),
            )],
            want_sums: vec![tcp_stats(
                None,
                DOWN,
                0.0,
                0,
                0.0,
                9_000_000,
                (12, 50_000, 5_000, 2_000_000),
            )],
        },
        Row {
            name: "udp reverse: the sender's count is the truth (all lost)",
            p: udp(Direction::Down, 1),
            local: vec![(0, Role::Recv)],
            remote: vec![StreamSample {
                bytes: 588_000,
                packets: 400,
                elapsed_us: 4_000_000,
                ..send(0)
            }],
            want_seconds: 0.0,
            // 400 sent, 0 received: 400 lost, 400 / 400 = 100 %
            want_streams: vec![udp_stats(
                Some(0),
                DOWN,
                0.0,
                0,
                0.0,
                588_000,
                (400, 0, 400, 100.0),
                (0, 0.0),
            )],
            want_sums: vec![udp_stats(
                None,
                DOWN,
                0.0,
                0,
                0.0,
                588_000,
                (400, 0, 400, 100.0),
                (0, 0.0),
            )],
        },
        Row {
            name: "udp up: the receiver's own loss count is replaced (0 sent here)",
            p: udp(Direction::Up, 1),
            local: vec![(0, Role::Send)],
            remote: vec![StreamSample {
                bytes: 14_700,
                packets: 10,
                lost: 2,
                out_of_order: 1,
                jitter_us: 300.0,
                elapsed_us: 500_000,
                ..recv(0)
            }],
            want_seconds: 0.5,
            // 14 700 B * 8 / 0.5 s = 235 200 bit/s; lost = 0 sent - 10
            // received, saturated to 0; 0 % of 0 sent
            want_streams: vec![udp_stats(
                Some(0),
                UP,
                0.5,
                14_700,
                235_200.0,
                0,
                (0, 10, 0, 0.0),
                (1, 0.3),
            )],
            want_sums: vec![udp_stats(
                None,
                UP,
                0.5,
                14_700,
                235_200.0,
                0,
                (0, 10, 0, 0.0),
                (1, 0.3),
            )],
        },
        Row {
            name: "udp with zero packets at both ends: 0 % lost",
            p: udp(Direction::Up, 1),
            local: vec![(0, Role::Send)],
            remote: vec![recv(0)],
            want_seconds: 0.0,
            want_streams: vec![udp_stats(
                Some(0),
                UP,
                0.0,
                0,
                0.0,
                0,
                (0, 0, 0, 0.0),
                (0, 0.0),
            )],
            want_sums: vec![udp_stats(
                None,
                UP,
                0.0,
                0,
                0.0,
                0,
                (0, 0, 0, 0.0),
                (0, 0.0),
            )],
        },
        Row {
            name: "tcp bidir: a stream missing from the server's totals has no \
                   time; one only the server has is dropped; sums apart",
            p: tcp(Direction::Both, 1),
            local: vec![(0, Role::Send), (1, Role::Recv)],
            remote: vec![
                StreamSample {
                    bytes: 1_000_000,
                    retransmits: 3,
                    rtt_us: 25_000,
                    cwnd: 500_000,
                    elapsed_us: 4_000_000,
                    ..send(1)
                },
                StreamSample {
                    bytes: 77,
                    elapsed_us: 9_000_000,
                    ..recv(9)
                },
            ],
            want_seconds: 0.0,
            want_streams: vec![
                tcp_stats(Some(0), UP, 0.0, 0, 0.0, 0, (0, 0, 0, 0)),
                tcp_stats(
                    Some(1),
                    DOWN,
                    0.0,
                    0,
                    0.0,
                    1_000_000,
                    (3, 25_000, 0, 500_000),
                ),
            ],
            want_sums: vec![
                tcp_stats(None, UP, 0.0, 0, 0.0, 0, (0, 0, 0, 0)),
                tcp_stats(None, DOWN, 0.0, 0, 0.0, 1_000_000, (3, 25_000, 0, 500_000)),
            ],
        },
    ];
    let cpu_local = schema::CpuUse {
        total_percent: 30.0,
        user_percent: 10.0,
        system_percent: 20.0,
    };
    let cpu_remote = schema::CpuUse {
        total_percent: 5.0,
        user_percent: 4.0,
        system_percent: 1.0,
    };
    for (i, r) in rows.iter().enumerate() {
        let name = format!("row {i}: {}", r.name);
        let side = idle_side(&r.p, &r.local);
        let end = merge_final(&r.p, &side, &r.remote, cpu_local, cpu_remote);
        assert!(
            close(end.seconds, r.want_seconds),
            "{name}: {}",
            end.seconds
        );
        assert_all(&format!("{name}: streams"), &end.streams, &r.want_streams);
        assert_all(&format!("{name}: sums"), &end.sums, &r.want_sums);
        assert_eq!(end.cpu_local, cpu_local, "{name}");
        assert_eq!(end.cpu_remote, cpu_remote, "{name}");
        assert_eq!(end.rfc6349, None, "{name}");
    }
}
