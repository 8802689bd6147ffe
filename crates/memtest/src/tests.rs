//! Table tests for the arithmetic behind every number `fatpipe test`
//! prints: each row is a hand-built pair of samples and the stats
//! worked out by hand (the sums in the comments), never by calling the
//! code under test.

use super::*;
use crate::msg::SocketSetup;
use schema::StreamStats;

fn params(protocol: Protocol, direction: Direction, streams: u32) -> TestParams {
    TestParams {
        protocol,
        streams,
        direction,
        duration_ms: 10_000,
        bytes: None,
        omit_ms: 0,
        interval_ms: 1000,
        window: None,
        force_buffers: false,
        start_window: None,
        mss: None,
        congestion: None,
        fq_rate: None,
        zerocopy: false,
        length: 1470,
        bitrate: 10_000_000,
        no_batch: false,
    }
}

fn tcp(direction: Direction, streams: u32) -> TestParams {
    params(Protocol::Tcp, direction, streams)
}

fn udp(direction: Direction, streams: u32) -> TestParams {
    params(Protocol::Udp, direction, streams)
}

fn send(id: u32) -> StreamSample {
    StreamSample {
        id,
        role: Some(Role::Send),
        ..Default::default()
    }
}

fn recv(id: u32) -> StreamSample {
    StreamSample {
        id,
        role: Some(Role::Recv),
        ..Default::default()
    }
}

const UP: Option<schema::Direction> = Some(schema::Direction::Up);
const DOWN: Option<schema::Direction> = Some(schema::Direction::Down);

/// Equal within rounding of the last bits (rates over 0.1 s, means).
fn close(a: f64, b: f64) -> bool {
    a == b || (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
}

fn close_opt(a: Option<f64>, b: Option<f64>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => close(a, b),
        (a, b) => a == b,
    }
}

/// Every field equal, the floating-point ones within rounding.
fn assert_stats(row: &str, got: &StreamStats, want: &StreamStats) {
    let exact = |s: &StreamStats| StreamStats {
        seconds: 0.0,
        bits_per_second: 0.0,
        lost_percent: s.lost_percent.map(|_| 0.0),
        jitter_ms: s.jitter_ms.map(|_| 0.0),
        ..s.clone()
    };
    assert_eq!(exact(got), exact(want), "{row}");
    assert!(close(got.seconds, want.seconds), "{row}: seconds\n{got:?}");
    assert!(
        close(got.bits_per_second, want.bits_per_second),
        "{row}: bits_per_second {} != {}",
        got.bits_per_second,
        want.bits_per_second
    );
    assert!(
        close_opt(got.lost_percent, want.lost_percent),
        "{row}: lost_percent {:?} != {:?}",
        got.lost_percent,
        want.lost_percent
    );
    assert!(
        close_opt(got.jitter_ms, want.jitter_ms),
        "{row}: jitter_ms {:?} != {:?}",
        got.jitter_ms,
        want.jitter_ms
    );
}

fn assert_all(row: &str, got: &[StreamStats], want: &[StreamStats]) {
    assert_eq!(got.len(), want.len(), "{row}: count\n{got:#?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_stats(&format!("{row} [{i}]"), g, w);
    }
}

/// A TCP stream's stats; the UDP fields stay `None`.
fn tcp_stats(
    id: Option<u32>,
    direction: Option<schema::Direction>,
    seconds: f64,
    bytes: u64,
    bits_per_second: f64,
    bytes_sent: u64,
    (retransmits, rtt_us, rttvar_us, cwnd): (u64, u32, u32, u64),
) -> StreamStats {
    StreamStats {
        id,
        direction,
        seconds,
        bytes,
        bits_per_second,
        bytes_sent,
        retransmits: Some(retransmits),
        rtt_us: Some(rtt_us),
        rttvar_us: Some(rttvar_us),
        cwnd: Some(cwnd),
        ..Default::default()
    }
}

/// A UDP stream's stats; the TCP fields stay `None`.
#[allow(clippy::too_many_arguments)]
fn udp_stats(
    id: Option<u32>,
    direction: Option<schema::Direction>,
    seconds: f64,
    bytes: u64,
    bits_per_second: f64,
    bytes_sent: u64,
    (packets_sent, packets, lost, lost_percent): (u64, u64, u64, f64),
    (out_of_order, jitter_ms): (u64, f64),
) -> StreamStats {
    StreamStats {
        id,
        direction,
        seconds,
        bytes,
        bits_per_second,
        bytes_sent,
        packets_sent: Some(packets_sent),
        packets: Some(packets),
        lost: Some(lost),
        lost_percent: Some(lost_percent),
        out_of_order: Some(out_of_order),
        jitter_ms: Some(jitter_ms),
        ..Default::default()
    }
}

#[test]
fn percent_of_a_whole() {
    let rows: &[(u64, u64, f64)] = &[
        (0, 0, 0.0), // nothing sent: 0, not NaN
        (5, 0, 0.0), // an impossible whole: still 0
        (0, 10, 0.0),
        (1, 4, 25.0),
        (1, 3, 33.333_333_333_333_336), // 100/3, unrounded
        (7, 7, 100.0),
        (1, 1_000_000, 0.0001),
    ];
    for &(part, whole, want) in rows {
        let got = percent(part, whole);
        assert!(
            close(got, want),
            "percent({part}, {whole}) = {got}, not {want}"
        );
    }
}

#[test]
fn client_sends_follows_the_role_then_the_id_split() {
    let no_role = |id| StreamSample {
        id,
        ..Default::default()
    };
    let rows = [
        // The sample's role wins over the test's direction (streams
        // added mid-test do not follow the --bidir id split).
        (tcp(Direction::Down, 1), send(0), true),
        (tcp(Direction::Up, 1), recv(0), false),
        (tcp(Direction::Both, 1), send(5), true),
        (tcp(Direction::Both, 1), recv(0), false),
        // Without one: the direction, and for bidir ids below
        // `streams` are the client's.
        (tcp(Direction::Up, 2), no_role(1), true),
        (tcp(Direction::Down, 2), no_role(0), false),
        (tcp(Direction::Both, 2), no_role(1), true),
        (tcp(Direction::Both, 2), no_role(2), false),
    ];
    for (i, (p, s, want)) in rows.iter().enumerate() {
        assert_eq!(
            client_sends(p, s),
            *want,
            "row {i}: {:?} {s:?}",
            p.direction
        );
    }
}

#[test]
fn cpu_use_is_percent_of_one_core() {
    // user, system, wall seconds -> total, user, system percent
    let rows: &[([f64; 3], [f64; 3])] = &[
        ([0.5, 0.25, 2.0], [37.5, 25.0, 12.5]),
        // Two busy cores: over 100 %.
        ([3.0, 1.0, 2.0], [200.0, 150.0, 50.0]),
        // 1 s of user time in 3 s: 100 / 3 %, unrounded.
        (
            [1.0, 0.0, 3.0],
            [33.333_333_333_333_336, 33.333_333_333_333_336, 0.0],
        ),
        // No wall time (the peer could not read its clock): zeros.
        ([1.0, 1.0, 0.0], [0.0, 0.0, 0.0]),
        ([1.0, 1.0, -1.0], [0.0, 0.0, 0.0]),
    ];
    for &([user_s, system_s, wall_s], [total, user, system]) in rows {
        let got = cpu_use(&CpuSample {
            user_s,
            system_s,
            wall_s,
        });
        assert!(
            close(got.total_percent, total)
                && close(got.user_percent, user)
                && close(got.system_percent, system),
            "{user_s}/{system_s}/{wall_s}: {got:?}"
        );
    }
}

#[test]
fn merge_stream_takes_bytes_from_the_receiver_and_state_from_the_sender() {
    struct Row {
        name: &'static str,
        p: TestParams,
        up: bool,
        local: Option<StreamSample>,
        remote: Option<StreamSample>,
        seconds: f64,
        want: StreamStats,
    }
    let rows = [
        Row {
            name: "tcp up: client sends, server receives",
            p: tcp(Direction::Up, 1),
            up: true,
            local: Some(StreamSample {
                bytes: 1_300_000,
                retransmits: 4,
                rtt_us: 20_000,
                rttvar_us: 3_000,
                cwnd: 262_144,
                ..send(0)
            }),
            // The receiver's own TCP_INFO is not the path's: ignored.
            remote: Some(StreamSample {
                bytes: 1_250_000,
                retransmits: 9,
                rtt_us: 150,
                cwnd: 14_480,
                ..recv(0)
            }),
            seconds: 1.0,
            // 1_250_000 B * 8 / 1 s = 10 Mbit/s
            want: tcp_stats(
                Some(0),
                UP,
                1.0,
                1_250_000,
                10_000_000.0,
                1_300_000,
                (4, 20_000, 3_000, 262_144),
            ),
        },
        Row {
            name: "tcp reverse: server sends, client receives",
            p: tcp(Direction::Down, 1),
            up: false,
            local: Some(StreamSample {
                bytes: 500_000,
                rtt_us: 99,
                ..recv(3)
            }),
            remote: Some(StreamSample {
                bytes: 600_000,
                retransmits: 7,
                rtt_us: 40_000,
                rttvar_us: 10_000,
                cwnd: 1_048_576,
                ..send(3)
            }),
            seconds: 0.5,
            // 500_000 B * 8 / 0.5 s = 8 Mbit/s
            want: tcp_stats(
                Some(3),
                DOWN,
                0.5,
                500_000,
                8_000_000.0,
                600_000,
                (7, 40_000, 10_000, 1_048_576),
            ),
        },
        Row {
            name: "zero-length interval: bytes counted, no rate (not inf/NaN)",
            p: tcp(Direction::Up, 1),
            up: true,
            local: Some(StreamSample {
                bytes: 4096,
                ..send(0)
            }),
            remote: Some(StreamSample {
                bytes: 1000,
                ..recv(0)
            }),
            seconds: 0.0,
            want: tcp_stats(Some(0), UP, 0.0, 1000, 0.0, 4096, (0, 0, 0, 0)),
        },
        Row {
            name: "rates are not rounded: 1000 B in 0.3 s",
            p: tcp(Direction::Up, 1),
            up: true,
            local: Some(StreamSample {
                bytes: 1000,
                ..send(0)
            }),
            remote: Some(StreamSample {
                bytes: 1000,
                ..recv(0)
            }),
            seconds: 0.3,
            // 8000 bit / 0.3 s = 26 666.666… bit/s
            want: tcp_stats(
                Some(0),
                UP,
                0.3,
                1000,
                26_666.666_666_666_668,
                1000,
                (0, 0, 0, 0),
            ),
        },
        Row {
            name: "receiver's sample missing: nothing received, sender's state kept",
            p: tcp(Direction::Up, 1),
            up: true,
            local: Some(StreamSample {
                bytes: 65_536,
                retransmits: 1,
                rtt_us: 12_000,
                rttvar_us: 600,
                cwnd: 43_440,
                ..send(1)
            }),
            remote: None,
            seconds: 1.0,
            want: tcp_stats(Some(1), UP, 1.0, 0, 0.0, 65_536, (1, 12_000, 600, 43_440)),
        },
        Row {
            name: "sender's sample missing: bytes received, TCP state all 0",
            p: tcp(Direction::Down, 1),
            up: false,
            local: Some(StreamSample {
                bytes: 250_000,
                ..recv(1)
            }),
            remote: None,
            seconds: 2.0,
            // 250_000 B * 8 / 2 s = 1 Mbit/s
            want: tcp_stats(Some(1), DOWN, 2.0, 250_000, 1_000_000.0, 0, (0, 0, 0, 0)),
        },
        Row {
            name: "sender without TCP_INFO: 0 RTT, cwnd, retransmits (Some, for TCP)",
            p: tcp(Direction::Up, 1),
            up: true,
            local: Some(StreamSample {
                bytes: 2_000_000,
                ..send(0)
            }),
            remote: Some(StreamSample {
                bytes: 2_000_000,
                rtt_us: 300,
                ..recv(0)
            }),
            seconds: 1.0,
            want: tcp_stats(
                Some(0),
                UP,
                1.0,
                2_000_000,
                16_000_000.0,
                2_000_000,
                (0, 0, 0, 0),
            ),
        },
        Row {
            name: "udp up: packets, loss, order, jitter from the receiver",
            p: udp(Direction::Up, 1),
            up: true,
            // 1000 datagrams of 1470 B sent.
            local: Some(StreamSample {
                bytes: 1_470_000,
                packets: 1000,
                ..send(0)
            }),
            // 960 arrived, 40 missing, 2 late.
            remote: Some(StreamSample {
                bytes: 1_411_200,
                packets: 960,
                lost: 40,
                out_of_order: 2,
                jitter_us: 1_250.0,
                rtt_us: 5,
                ..recv(0)
            }),
            seconds: 1.0,
            // 960 * 1470 B * 8 / 1 s = 11 289 600 bit/s;
            // lost 40 / (40 + 960) = 4 %; 1250 µs = 1.25 ms
            want: udp_stats(
                Some(0),
                UP,
                1.0,
                1_411_200,
                11_289_600.0,
                1_470_000,
                (1000, 960, 40, 4.0),
                (2, 1.25),
            ),
        },
        Row {
            name: "udp reverse: everything lost",
            p: udp(Direction::Down, 1),
            up: false,
            local: Some(StreamSample {
                lost: 25,
                ..recv(0)
            }),
            remote: Some(StreamSample {
                bytes: 36_750,
                packets: 25,
                ..send(0)
            }),
            seconds: 1.0,
            // 25 / (25 + 0) = 100 %
            want: udp_stats(
                Some(0),
                DOWN,
                1.0,
                0,
                0.0,
                36_750,
                (25, 0, 25, 100.0),
                (0, 0.0),
            ),
        },
        Row {
            name: "udp with zero packets: 0 % lost, not NaN",
            p: udp(Direction::Up, 1),
            up: true,
            local: Some(send(0)),
            remote: Some(recv(0)),
            seconds: 1.0,
            want: udp_stats(Some(0), UP, 1.0, 0, 0.0, 0, (0, 0, 0, 0.0), (0, 0.0)),
        },
        Row {
            name: "udp, neither sample: all zero",
            p: udp(Direction::Both, 1),
            up: false,
            local: None,
            remote: None,
            seconds: 0.25,
            want: udp_stats(Some(2), DOWN, 0.25, 0, 0.0, 0, (0, 0, 0, 0.0), (0, 0.0)),
        },
    ];
    for (i, r) in rows.iter().enumerate() {
        let id = r.want.id.unwrap_or(0);
        let got = merge_stream(
            &r.p,
            id,
            r.up,
            r.local.as_ref(),
            r.remote.as_ref(),
            r.seconds,
        );
        assert_stats(&format!("row {i}: {}", r.name), &got, &r.want);
    }
}

#[test]
fn sums_add_per_direction() {
    struct Row {
        name: &'static str,
        p: TestParams,
        streams: Vec<StreamStats>,
        want: Vec<StreamStats>,
    }
    let t = |id, dir, seconds, bytes, bps, sent, tcp| {
        tcp_stats(Some(id), dir, seconds, bytes, bps, sent, tcp)
    };
    let rows = [
        Row {
            name: "tcp, two streams up: counts add, RTT is the mean",
            p: tcp(Direction::Up, 2),
            streams: vec![
                t(
                    0,
                    UP,
                    1.0,
                    1_000_000,
                    8e6,
                    1_100_000,
                    (2, 10_000, 1_000, 100_000),
                ),
                t(
                    1,
                    UP,
                    1.0,
                    3_000_000,
                    24e6,
                    3_000_000,
                    (0, 30_000, 3_000, 300_000),
                ),
            ],
            // rtt (10 000 + 30 000) / 2, rttvar (1000 + 3000) / 2,
            // cwnd 100 000 + 300 000
            want: vec![tcp_stats(
                None,
                UP,
                1.0,
                4_000_000,
                32e6,
                4_100_000,
                (2, 20_000, 2_000, 400_000),
            )],
        },
        Row {
            name: "periods differ: the longest; rates add (not bytes / longest)",
            p: tcp(Direction::Up, 2),
            streams: vec![
                t(0, UP, 2.0, 1_000_000, 4e6, 1_000_000, (0, 0, 0, 0)),
                t(1, UP, 1.0, 1_000_000, 8e6, 1_000_000, (0, 0, 0, 0)),
            ],
            // 4 + 8 Mbit/s = 12 Mbit/s, where 2 MB / 2 s would be 8.
            want: vec![tcp_stats(
                None,
                UP,
                2.0,
                2_000_000,
                12e6,
                2_000_000,
                (0, 0, 0, 0),
            )],
        },
        Row {
            name: "RTT mean truncates to whole µs",
            p: tcp(Direction::Down, 2),
            streams: vec![
                t(0, DOWN, 1.0, 1, 8.0, 1, (0, 10_001, 3, 1)),
                t(1, DOWN, 1.0, 1, 8.0, 1, (0, 10_000, 0, 1)),
            ],
            // (10 001 + 10 000) / 2 = 10 000.5 -> 10 000;
            // (3 + 0) / 2 = 1.5 -> 1
            want: vec![tcp_stats(None, DOWN, 1.0, 2, 16.0, 2, (0, 10_000, 1, 2))],
        },
        Row {
            name: "a sender without TCP_INFO (RTT 0, unknown) is not in the RTT mean",
            p: tcp(Direction::Up, 3),
            streams: vec![
                t(
                    0,
                    UP,
                    1.0,
                    1_000_000,
                    8e6,
                    1_000_000,
                    (1, 40_000, 4_000, 100_000),
                ),
                t(1, UP, 1.0, 1_000_000, 8e6, 1_000_000, (0, 0, 0, 0)),
                t(
                    2,
                    UP,
                    1.0,
                    1_000_000,
                    8e6,
                    1_000_000,
                    (2, 20_000, 2_000, 50_000),
                ),
            ],
            // rtt (40 000 + 20 000) / 2 streams that know it, not / 3;
            // rttvar (4000 + 2000) / 2
            want: vec![tcp_stats(
                None,
                UP,
                1.0,
                3_000_000,
                24e6,
                3_000_000,
                (3, 30_000, 3_000, 150_000),
            )],
        },
        Row {
            name: "bidir: one sum per direction, up first, never mixed",
            p: tcp(Direction::Both, 2),
            streams: vec![
                t(
                    2,
                    DOWN,
                    1.0,
                    500_000,
                    4e6,
                    600_000,
                    (5, 40_000, 4_000, 80_000),
                ),
                t(
                    0,
                    UP,
                    1.0,
                    1_000_000,
                    8e6,
                    1_000_000,
                    (1, 10_000, 1_000, 50_000),
                ),
                t(
                    3,
                    DOWN,
                    1.0,
                    1_500_000,
                    12e6,
                    1_500_000,
                    (0, 60_000, 2_000, 20_000),
                ),
                t(
                    1,
                    UP,
                    0.5,
                    250_000,
                    4e6,
                    300_000,
                    (2, 30_000, 3_000, 70_000),
                ),
            ],
            want: vec![
                // 1 MB + 0.25 MB, 8 + 4 Mbit/s, rtt (10 + 30 ms) / 2
                tcp_stats(
                    None,
                    UP,
                    1.0,
                    1_250_000,
                    12e6,
                    1_300_000,
                    (3, 20_000, 2_000, 120_000),
                ),
                // 0.5 MB + 1.5 MB, 4 + 12 Mbit/s, rtt (40 + 60 ms) / 2
                tcp_stats(
                    None,
                    DOWN,
                    1.0,
                    2_000_000,
                    16e6,
                    2_100_000,
                    (5, 50_000, 3_000, 100_000),
                ),
            ],
        },
        Row {
            name: "reverse only: a single down sum",
            p: tcp(Direction::Down, 1),
            streams: vec![t(0, DOWN, 1.0, 10, 80.0, 10, (0, 1, 1, 1))],
            want: vec![tcp_stats(None, DOWN, 1.0, 10, 80.0, 10, (0, 1, 1, 1))],
        },
        Row {
            name: "no streams: no sums",
            p: tcp(Direction::Both, 1),
            streams: vec![],
            want: vec![],
        },
        Row {
            name: "udp: counts add, loss % of all packets, jitter the mean",
            p: udp(Direction::Up, 2),
            streams: vec![
                udp_stats(
                    Some(0),
                    UP,
                    1.0,
                    1_455_300,
                    11_642_400.0,
                    1_470_000,
                    (1000, 990, 10, 1.0),
                    (1, 0.5),
                ),
                udp_stats(
                    Some(1),
                    UP,
                    1.0,
                    1_425_900,
                    11_407_200.0,
                    1_470_000,
                    (1000, 970, 30, 3.0),
                    (0, 1.5),
                ),
            ],
            // lost 10 + 30 = 40 of 40 + 1960 = 2 %; jitter (0.5 + 1.5) / 2
            want: vec![udp_stats(
                None,
                UP,
                1.0,
                2_881_200,
                23_049_600.0,
                2_940_000,
                (2000, 1960, 40, 2.0),
                (1, 1.0),
            )],
        },
        Row {
            name: "udp: loss % weighs packets, not the streams' percentages",
            p: udp(Direction::Down, 2),
            streams: vec![
                udp_stats(Some(0), DOWN, 1.0, 0, 0.0, 0, (10, 9, 1, 10.0), (0, 0.0)),
                udp_stats(Some(1), DOWN, 1.0, 0, 0.0, 0, (90, 90, 0, 0.0), (0, 0.0)),
            ],
            // 1 of 1 + 99 = 1 %, where the mean of 10 % and 0 % is 5 %.
            want: vec![udp_stats(
                None,
                DOWN,
                1.0,
                0,
                0.0,
                0,
                (100, 99, 1, 1.0),
                (0, 0.0),
            )],
        },
        Row {
            name: "udp with zero packets: 0 %, not NaN",
            p: udp(Direction::Both, 1),
            streams: vec![
                udp_stats(Some(0), UP, 0.0, 0, 0.0, 0, (0, 0, 0, 0.0), (0, 0.0)),
                udp_stats(Some(1), DOWN, 0.0, 0, 0.0, 0, (0, 0, 0, 0.0), (0, 0.0)),
            ],
            want: vec![
                udp_stats(None, UP, 0.0, 0, 0.0, 0, (0, 0, 0, 0.0), (0, 0.0)),
                udp_stats(None, DOWN, 0.0, 0, 0.0, 0, (0, 0, 0, 0.0), (0, 0.0)),
            ],
        },
    ];
    for (i, r) in rows.iter().enumerate() {
        assert_all(
            &format!("row {i}: {}", r.name),
            &sums(&r.p, &r.streams),
            &r.want,
        );
    }
}

#[test]
fn merge_interval_pairs_the_ends_by_stream_id() {
    struct Row {
        name: &'static str,
        p: TestParams,
        index: u32,
        begin_ms: u64,
        end_ms: u64,
        omitted: bool,
        local: Vec<StreamSample>,
        remote: Vec<StreamSample>,
        want_streams: Vec<StreamStats>,
        want_sums: Vec<StreamStats>,
    }
    let rows = [
        Row {
            name: "tcp bidir: the server's samples in another order",
            p: tcp(Direction::Both, 1),
            index: 2,
            begin_ms: 2000,
            end_ms: 3000,
            omitted: false,
            local: vec![
                StreamSample {
                    bytes: 2_000_000,
                    retransmits: 1,
                    rtt_us: 10_000,
                    rttvar_us: 500,
                    cwnd: 200_000,
                    ..send(0)
                },
                StreamSample {
                    bytes: 750_000,
                    ..recv(1)
                },
            ],
            remote: vec![
                StreamSample {
                    bytes: 800_000,
                    retransmits: 5,
                    rtt_us: 30_000,
                    rttvar_us: 1_500,
                    cwnd: 90_000,
                    ..send(1)
                },
                StreamSample {
                    bytes: 1_900_000,
                    ..recv(0)
                },
            ],
            // 1.9 MB * 8 / 1 s = 15.2 Mbit/s; 0.75 MB * 8 / 1 s = 6
            want_streams: vec![
                tcp_stats(
                    Some(0),
                    UP,
                    1.0,
                    1_900_000,
                    15_200_000.0,
                    2_000_000,
                    (1, 10_000, 500, 200_000),
                ),
                tcp_stats(
                    Some(1),
                    DOWN,
                    1.0,
                    750_000,
                    6_000_000.0,
                    800_000,
                    (5, 30_000, 1_500, 90_000),
                ),
            ],
            want_sums: vec![
                tcp_stats(
                    None,
                    UP,
                    1.0,
                    1_900_000,
                    15_200_000.0,
                    2_000_000,
                    (1, 10_000, 500, 200_000),
                ),
                tcp_stats(
                    None,
                    DOWN,
                    1.0,
                    750_000,
                    6_000_000.0,
                    800_000,
                    (5, 30_000, 1_500, 90_000),
                ),
            ],
        },
        Row {
            name: "udp reverse, omitted warm-up, half a second",
            p: udp(Direction::Down, 2),
            index: 0,
            begin_ms: 0,
            end_ms: 500,
            omitted: true,
            local: vec![
                StreamSample {
                    bytes: 147_000,
                    packets: 100,
                    jitter_us: 200.0,
                    ..recv(0)
                },
                StreamSample {
                    bytes: 132_300,
                    packets: 90,
                    lost: 10,
                    out_of_order: 3,
                    jitter_us: 600.0,
                    ..recv(1)
                },
            ],
            remote: vec![
                StreamSample {
                    bytes: 147_000,
                    packets: 100,
                    ..send(0)
                },
                StreamSample {
                    bytes: 147_000,
                    packets: 100,
                    ..send(1)
                },
            ],
            // 147 000 B * 8 / 0.5 s = 2 352 000 bit/s;
            // 132 300 B * 8 / 0.5 s = 2 116 800 bit/s, 10 of 100 lost
            want_streams: vec![
                udp_stats(
                    Some(0),
                    DOWN,
                    0.5,
                    147_000,
                    2_352_000.0,
                    147_000,
                    (100, 100, 0, 0.0),
                    (0, 0.2),
                ),
                udp_stats(
                    Some(1),
                    DOWN,
                    0.5,
                    132_300,
                    2_116_800.0,
                    147_000,
                    (100, 90, 10, 10.0),
                    (3, 0.6),
                ),
            ],
            // 10 of 10 + 190 = 5 %; jitter (0.2 + 0.6) / 2 = 0.4 ms
            want_sums: vec![udp_stats(
                None,
                DOWN,
                0.5,
                279_300,
                4_468_800.0,
                294_000,
                (200, 190, 10, 5.0),
                (3, 0.4),
            )],
        },
        Row {
            name: "tcp reverse, a stream just added the server has not reported: \
                   its unknown RTT does not halve the sum's",
            p: tcp(Direction::Down, 1),
            index: 3,
            begin_ms: 3000,
            end_ms: 4000,
            omitted: false,
            local: vec![
                StreamSample {
                    bytes: 1_000_000,
                    ..recv(0)
                },
                StreamSample {
                    bytes: 10_000,
                    ..recv(1)
                },
            ],
            remote: vec![StreamSample {
                bytes: 1_000_000,
                rtt_us: 30_000,
                rttvar_us: 900,
                cwnd: 400_000,
                ..send(0)
            }],
            // 1 MB * 8 / 1 s = 8 Mbit/s; 10 kB * 8 / 1 s = 80 kbit/s
            want_streams: vec![
                tcp_stats(
                    Some(0),
                    DOWN,
                    1.0,
                    1_000_000,
                    8e6,
                    1_000_000,
                    (0, 30_000, 900, 400_000),
                ),
                tcp_stats(Some(1), DOWN, 1.0, 10_000, 80_000.0, 0, (0, 0, 0, 0)),
            ],
            // rtt and rttvar: stream 0's alone (stream 1's are unknown)
            want_sums: vec![tcp_stats(
                None,
                DOWN,
                1.0,
                1_010_000,
                8_080_000.0,
                1_000_000,
                (0, 30_000, 900, 400_000),
            )],
        },
        Row {
            name: "zero-length closing interval: bytes, no rate",
            p: tcp(Direction::Up, 1),
            index: 4,
            begin_ms: 4000,
            end_ms: 4000,
            omitted: false,
            local: vec![StreamSample {
                bytes: 8192,
                rtt_us: 1000,
                ..send(0)
            }],
            remote: vec![StreamSample {
                bytes: 4096,
                ..recv(0)
            }],
            want_streams: vec![tcp_stats(
                Some(0),
                UP,
                0.0,
                4096,
                0.0,
                8192,
                (0, 1000, 0, 0),
            )],
            want_sums: vec![tcp_stats(None, UP, 0.0, 4096, 0.0, 8192, (0, 1000, 0, 0))],
        },
        Row {
            name: "a stream only at the client (just added) counts 0 received; \
                   one only at the server is dropped; roles beat the id split",
            p: tcp(Direction::Both, 1),
            index: 7,
            begin_ms: 7000,
            end_ms: 7250,
            omitted: false,
            local: vec![
                StreamSample {
                    bytes: 250_000,
                    rtt_us: 20_000,
                    cwnd: 100_000,
                    ..send(0)
                },
                StreamSample {
                    bytes: 125_000,
                    ..recv(1)
                },
                // Added mid-test as an up stream: id 2 >= streams, yet up.
                StreamSample {
                    bytes: 65_536,
                    rtt_us: 30_000,
                    cwnd: 20_000,
                    ..send(2)
                },
            ],
            remote: vec![
                StreamSample {
                    bytes: 250_000,
                    ..recv(0)
                },
                StreamSample {
                    bytes: 125_000,
                    rtt_us: 8_000,
                    cwnd: 64_000,
                    ..send(1)
                },
                StreamSample {
                    bytes: 999,
                    ..recv(9)
                },
            ],
            // 250 000 B * 8 / 0.25 s = 8 Mbit/s; 125 000 -> 4 Mbit/s
            want_streams: vec![
                tcp_stats(
                    Some(0),
                    UP,
                    0.25,
                    250_000,
                    8e6,
                    250_000,
                    (0, 20_000, 0, 100_000),
                ),
                tcp_stats(
                    Some(1),
                    DOWN,
                    0.25,
                    125_000,
                    4e6,
                    125_000,
                    (0, 8_000, 0, 64_000),
                ),
                tcp_stats(Some(2), UP, 0.25, 0, 0.0, 65_536, (0, 30_000, 0, 20_000)),
            ],
            // up: 250 000 B, 250 000 + 65 536 sent, rtt (20 + 30 ms) / 2,
            // cwnd 100 000 + 20 000
            want_sums: vec![
                tcp_stats(
                    None,
                    UP,
                    0.25,
                    250_000,
                    8e6,
                    315_536,
                    (0, 25_000, 0, 120_000),
                ),
                tcp_stats(
                    None,
                    DOWN,
                    0.25,
                    125_000,
                    4e6,
                    125_000,
                    (0, 8_000, 0, 64_000),
                ),
            ],
        },
    ];
    for (i, r) in rows.iter().enumerate() {
        let name = format!("row {i}: {}", r.name);
        let iv = merge_interval(
            &r.p,
            r.index,
            Duration::from_millis(r.begin_ms),
            Duration::from_millis(r.end_ms),
            r.omitted,
            &r.local,
            &r.remote,
        );
        assert_eq!(iv.index, r.index, "{name}");
        assert_eq!(iv.start_s, r.begin_ms as f64 / 1e3, "{name}");
        assert_eq!(iv.end_s, r.end_ms as f64 / 1e3, "{name}");
        assert_eq!(iv.omitted, r.omitted, "{name}");
        assert_all(&format!("{name}: streams"), &iv.streams, &r.want_streams);
        assert_all(&format!("{name}: sums"), &iv.sums, &r.want_sums);
    }
}

mod side;
