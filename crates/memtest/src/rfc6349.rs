//! RFC 6349 (Framework for TCP Throughput Testing) metrics for a finished
//! `fatpipe test`.
//!
//! The RFC judges a TCP transfer against the path it ran over:
//!
//! * **Baseline RTT** and **bottleneck bandwidth** (BB), measured before
//!   the transfer: here, the probe's minimum echo RTT and its packet-train
//!   rate ([`Baseline`]);
//! * **BDP** = BB × baseline RTT, the smallest window that fills the path;
//! * **maximum achievable TCP throughput**: BB less the framing and the
//!   IP and TCP headers of full-sized segments ([`max_tcp_throughput`]);
//! * **transfer time ratio** = actual TCP transfer time / ideal TCP
//!   transfer time, the ideal being the bytes moved at the maximum
//!   achievable throughput (§3.3.1);
//! * **TCP efficiency %** = (transmitted − retransmitted bytes) /
//!   transmitted bytes × 100 (§3.3.2);
//! * **buffer delay %** = (average RTT during the transfer − baseline RTT)
//!   / baseline RTT × 100 (§3.3.3).
//!
//! Choices the RFC leaves open, each stated in the report's `notes`:
//!
//! * The probe's rate counts IP bytes (it times IP packets), so the framing
//!   below IP is already out of it and only the IP and TCP headers come
//!   off: max = BB × MSS / packet. The RFC's worked example starts from an
//!   Ethernet line rate instead, which [`max_tcp_throughput`] also covers
//!   ([`ETHERNET_FRAMING`]), and the two agree for the same link.
//! * The test reports retransmitted segments, not bytes, so retransmitted
//!   bytes are estimated as segments × MSS.
//! * The average RTT is the sender's smoothed RTT (`TCP_INFO`) of each
//!   stream at the end of each measured interval, weighted by the bytes the
//!   stream carried in that interval ([`mean_rtt_us`]).
//!
//! Everything but [`probe`] is pure. A figure that cannot be known (no
//! probe, a rate that is only a lower bound) is left out with the reason,
//! never guessed.

use std::net::SocketAddr;

use fatpipe_engine::ClientOptions;
use fatpipe_schema::test::{Direction, Protocol, Rfc6349, TestDirection, TestInterval, TestReport};
use fatpipe_schema::units::format_rate;

use fatpipe_probe::{self as probe, ProbeConfig, ProbeError, ProbeOutcome};
use fatpipe_tune::auto::Preflight;

/// Bytes an Ethernet frame adds to an IP packet on the wire: preamble and
/// start delimiter 8, header 14, FCS 4, inter-frame gap 12 (RFC 6349
/// §3.3.1 counts 1538 bytes for a 1500-byte MTU).
pub const ETHERNET_FRAMING: u32 = 38;
/// IPv4 header without options.
pub const IPV4_HEADER: u32 = 20;
/// IPv6 header without extension headers.
pub const IPV6_HEADER: u32 = 40;
/// TCP header without options.
pub const TCP_HEADER: u32 = 20;
/// The TCP timestamp option as Linux sends it (10 bytes padded to 12).
pub const TCP_TIMESTAMPS: u32 = 12;
/// MTU assumed when the probe could not find the path's.
pub const DEFAULT_MTU: u32 = 1500;

/// What the probe found out about the path before the transfer.
#[derive(Debug, Clone, PartialEq)]
pub struct Baseline {
    /// Minimum round trip, seconds.
    pub rtt_secs: f64,
    /// Bottleneck rate, bit/s of IP packets; `None` when no train gave one.
    pub bottleneck_bps: Option<u64>,
    /// The rate is only a lower bound (the sender was the limit).
    pub lower_bound: bool,
    /// Path MTU, bytes; 0 when unknown.
    pub mtu: u32,
}

impl Baseline {
    /// From a probe run for this purpose.
    pub fn from_outcome(o: &ProbeOutcome) -> Baseline {
        let facts = probe::facts(o);
        Baseline {
            rtt_secs: facts.rtt_secs,
            bottleneck_bps: facts.bottleneck_rate,
            lower_bound: o.rate.as_ref().is_some_and(|r| r.sender_limited),
            mtu: if facts.mtu > 0 {
                facts.mtu
            } else {
                o.route_mtu.as_ref().map_or(0, |m| *m)
            },
        }
    }

    /// From auto-tuning's pre-flight probe, so a tuned test probes once.
    pub fn from_preflight(p: &Preflight) -> Baseline {
        Baseline {
            rtt_secs: p.facts.rtt_secs,
            bottleneck_bps: p.facts.bottleneck_rate,
            lower_bound: p.rate_lower_bound,
            mtu: p.facts.mtu,
        }
    }
}

/// Probes the path as auto-tuning's pre-flight does (5 echoes, 6 trains),
/// for a test that is not auto-tuned.
pub fn probe(addr: SocketAddr, options: ClientOptions) -> Result<Baseline, ProbeError> {
    let mut cfg = ProbeConfig::new(addr, options);
    cfg.echoes = 5;
    cfg.trains = 6;
    probe::run(&cfg).map(|o| Baseline::from_outcome(&o))
}

/// Maximum achievable TCP throughput (bit/s) over a bottleneck of
/// `rate_bps`, for full segments of `mss` payload bytes in IP packets of
/// `packet` bytes, with `framing` bytes per packet counted in the rate
/// below IP (0 when the rate counts IP bytes, [`ETHERNET_FRAMING`] for an
/// Ethernet line rate). `None` for an empty packet.
pub fn max_tcp_throughput(rate_bps: f64, packet: u32, mss: u32, framing: u32) -> Option<f64> {
    let wire = f64::from(packet) + f64::from(framing);
    (wire > 0.0 && mss <= packet).then(|| rate_bps * f64::from(mss) / wire)
}

/// The IP packet size and payload of a full segment: `mss` is the sender's
/// (0 when unknown), `mtu` the path's (0 when unknown), `ip_header` 20 or
/// 40. Linux sends timestamps by default, so a segment carries
/// [`TCP_TIMESTAMPS`] of options unless that would not fit the MTU (then
/// the MSS already left them out). Returns `(packet, mss, notes)`.
pub fn segment(mss: u32, mtu: u32, ip_header: u32) -> (u32, u32, Vec<String>) {
    let mut notes = Vec::new();
    let mtu = if mtu == 0 {
        notes.push(format!("path MTU unknown: {DEFAULT_MTU} assumed"));
        DEFAULT_MTU
    } else {
        mtu
    };
    let headers = ip_header + TCP_HEADER + TCP_TIMESTAMPS;
    if mss == 0 {
        notes.push("sender's MSS unknown: taken from the MTU".into());
        let mss = mtu.saturating_sub(headers).max(1);
        return (mss + headers, mss, notes);
    }
    let packet = (mss + headers).min(mtu.max(mss + ip_header + TCP_HEADER));
    (packet, mss, notes)
}

/// TCP efficiency (percent): of the bytes transmitted (originals plus
/// retransmissions), the share that were not retransmissions. `None`
/// when nothing was sent.
pub fn tcp_efficiency_percent(bytes_sent: u64, retransmitted: u64) -> Option<f64> {
    let transmitted = bytes_sent as f64 + retransmitted as f64;
    (transmitted > 0.0).then(|| bytes_sent as f64 / transmitted * 100.0)
}

/// Buffer delay (percent): how much longer the average RTT during the
/// transfer was than the baseline. `None` without a baseline.
pub fn buffer_delay_percent(avg_rtt_secs: f64, baseline_rtt_secs: f64) -> Option<f64> {
    (baseline_rtt_secs > 0.0 && avg_rtt_secs.is_finite())
        .then(|| (avg_rtt_secs - baseline_rtt_secs) / baseline_rtt_secs * 100.0)
}

/// Ideal TCP transfer time (seconds) of `bytes` at `max_bps`.
pub fn ideal_transfer_secs(bytes: u64, max_bps: f64) -> Option<f64> {
    (max_bps > 0.0 && bytes > 0).then(|| bytes as f64 * 8.0 / max_bps)
}

/// Transfer time ratio: actual over ideal transfer time.
pub fn transfer_time_ratio(actual_secs: f64, ideal_secs: f64) -> Option<f64> {
    (ideal_secs > 0.0 && actual_secs > 0.0).then(|| actual_secs / ideal_secs)
}

/// Average RTT during the transfer (microseconds) in direction `dir`: each
/// stream's smoothed RTT at the end of each measured (not omitted)
/// interval, weighted by the bytes the stream carried in it, so that idle
/// streams and empty intervals do not count. `None` without a sample.
pub fn mean_rtt_us(intervals: &[TestInterval], dir: Direction) -> Option<f64> {
    let (mut sum, mut weight) = (0.0, 0.0);
    for s in intervals
        .iter()
        .filter(|iv| !iv.omitted)
        .flat_map(|iv| &iv.streams)
        .filter(|s| s.direction == Some(dir) && s.bytes > 0)
    {
        if let Some(rtt) = s.rtt_us.filter(|r| *r > 0) {
            sum += f64::from(rtt) * s.bytes as f64;
            weight += s.bytes as f64;
        }
    }
    (weight > 0.0).then(|| sum / weight)
}

/// The RFC 6349 metrics of a TCP test. `baseline` is the probe's finding
/// or why there is none. `None` for a UDP test or one with no totals.
pub fn assess(baseline: &Result<Baseline, String>, r: &TestReport) -> Option<Rfc6349> {
    if r.start.protocol != Protocol::Tcp {
        return None;
    }
    let mut notes = Vec::new();
    let mut unavailable = Vec::new();
    // One direction: the probe times client-to-server trains.
    let dir = if r.start.direction == TestDirection::Down {
        notes.push(
            "the probe measures the client-to-server rate; it is taken as the server-to-client bottleneck"
                .into(),
        );
        Direction::Down
    } else {
        if r.start.direction == TestDirection::Both {
            notes.push("bidirectional test: the client-to-server direction is assessed".into());
        }
        Direction::Up
    };
    let sum = r.end.sums.iter().find(|s| s.direction == Some(dir))?;
    // The sender's sockets: this end's going up, the server's coming down.
    let senders = if dir == Direction::Up {
        &r.start.local
    } else {
        &r.start.remote
    };
    let mss = senders
        .iter()
        .find(|s| s.direction == dir && s.mss > 0)
        .map_or(0, |s| s.mss);
    let ip_header = match r.start.server_addr.parse::<SocketAddr>() {
        Ok(SocketAddr::V6(a)) if a.ip().to_ipv4_mapped().is_none() => IPV6_HEADER,
        _ => IPV4_HEADER,
    };
    let (base, why_no_base) = match baseline {
        Ok(b) => (Some(b), None),
        Err(e) => (None, Some(format!("no path probe ({e})"))),
    };
    let (packet, mss, seg_notes) = segment(mss, base.map_or(0, |b| b.mtu), ip_header);
    notes.extend(seg_notes);

    let seconds = sum.seconds;
    let actual_bps = if seconds > 0.0 {
        sum.bytes as f64 * 8.0 / seconds
    } else {
        0.0
    };
    let rate = base.and_then(|b| b.bottleneck_bps);
    let lower_bound = base.is_some_and(|b| b.lower_bound && rate.is_some());
    let rtt_secs = base.map(|b| b.rtt_secs).filter(|r| *r > 0.0);
    let bdp_bytes = match (rate, rtt_secs) {
        (Some(bps), Some(rtt)) => Some((bps as f64 / 8.0 * rtt).round() as u64),
        _ => None,
    };
    let max_tcp_bps = rate.and_then(|bps| max_tcp_throughput(bps as f64, packet, mss, 0));
    if rate.is_some() {
        notes.push(format!(
            "maximum TCP throughput = bottleneck × {mss} / {packet} (the probe counts IP bytes; IP and TCP headers with timestamps come off)"
        ));
    }
    let why_no_rate = match (&why_no_base, rate, lower_bound) {
        (Some(w), _, _) => Some(w.clone()),
        (None, None, _) => Some("the probe gave no bottleneck rate estimate".to_string()),
        (None, Some(bps), true) => Some(format!(
            "the bottleneck estimate is only a lower bound (this host could not send probe trains faster than {}), so the ideal time is unknown",
            format_rate(bps as f64)
        )),
        (None, Some(_), false) => None,
    };
    let ideal_seconds = match (&why_no_rate, max_tcp_bps) {
        (None, Some(max)) => ideal_transfer_secs(sum.bytes, max),
        _ => None,
    };
    let transfer_time_ratio = ideal_seconds.and_then(|i| transfer_time_ratio(seconds, i));
    if let Some(ratio) = transfer_time_ratio.filter(|r| *r < 1.0) {
        notes.push(format!(
            "transfer time ratio below 1: the transfer beat the computed ceiling, so the bottleneck estimate is at least {:.1}% low",
            (1.0 / ratio - 1.0) * 100.0
        ));
    }
    if transfer_time_ratio.is_none() {
        let why = why_no_rate
            .clone()
            .unwrap_or_else(|| "no bytes were received".into());
        unavailable.push(format!("transfer_time_ratio: {why}"));
    }
    if bdp_bytes.is_none() {
        let why = why_no_rate
            .clone()
            .unwrap_or_else(|| "no baseline RTT".into());
        unavailable.push(format!("bdp_bytes: {why}"));
    }

    let retransmits = sum.retransmits.unwrap_or(0);
    let retransmitted_bytes = retransmits.saturating_mul(u64::from(mss));
    notes.push(format!(
        "retransmitted bytes estimated as retransmitted segments × MSS ({mss})"
    ));
    let tcp_efficiency_percent = tcp_efficiency_percent(sum.bytes_sent, retransmitted_bytes);
    if tcp_efficiency_percent.is_none() {
        unavailable.push("tcp_efficiency_percent: the sender sent nothing".into());
    }

    let avg_rtt = mean_rtt_us(&r.intervals, dir);
    notes.push(
        "average RTT: the sender's smoothed RTT per stream at each measured interval's end, weighted by the bytes the stream carried"
            .into(),
    );
    let buffer_delay_percent = match (avg_rtt, rtt_secs) {
        (Some(avg), Some(base)) => buffer_delay_percent(avg / 1e6, base),
        _ => None,
    };
    if buffer_delay_percent.is_none() {
        let why = match (avg_rtt, &why_no_base) {
            (None, _) => "no RTT sample during the transfer".to_string(),
            (_, Some(w)) => w.clone(),
            (_, None) => "no baseline RTT".to_string(),
        };
        unavailable.push(format!("buffer_delay_percent: {why}"));
    }

    Some(Rfc6349 {
        direction: dir,
        baseline_rtt_us: rtt_secs.map(|r| (r * 1e6).round() as u64),
        bottleneck_bps: rate,
        bottleneck_lower_bound: lower_bound,
        packet_bytes: packet,
        mss,
        bdp_bytes,
        max_tcp_bps,
        bytes: sum.bytes,
        seconds,
        actual_bps,
        ideal_seconds,
        transfer_time_ratio,
        bytes_sent: sum.bytes_sent,
        retransmits,
        retransmitted_bytes,
        tcp_efficiency_percent,
        avg_rtt_us: avg_rtt.map(|r| r.round() as u64),
        buffer_delay_percent,
        unavailable,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use fatpipe_schema::test::{CpuUse, SocketInfo, StreamStats, TestEnd, TestStart};

    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn max_throughput_table() {
        // (rate, packet, mss, framing, expected bit/s, tolerance)
        let cases = [
            // RFC 6349 §3.3.1: 1 Gbit/s Ethernet, MTU 1500, 1460-byte
            // payload: 81,274 frames/s of 1538 bytes, 949.3 Mbit/s.
            (1e9, 1500, 1460, ETHERNET_FRAMING, 949.28e6, 0.01e6),
            // Same with timestamps (1448 payload).
            (1e9, 1500, 1448, ETHERNET_FRAMING, 941.48e6, 0.01e6),
            // The probe's view of that link counts IP bytes: 1e9 × 1500 /
            // 1538 = 975.29 Mbit/s of packets, and the same TCP ceiling.
            (1e9 * 1500.0 / 1538.0, 1500, 1460, 0, 949.28e6, 0.01e6),
            // A lab link counting IP bytes at 1 Gbit/s, timestamps on.
            (1e9, 1500, 1448, 0, 965.33e6, 0.01e6),
            // Jumbo frames, 10 Gbit/s Ethernet: 8960 / 9038.
            (10e9, 9000, 8960, ETHERNET_FRAMING, 9913.7e6, 0.1e6),
            // A T3's 44.21 Mbit/s counted in IP bytes, no timestamps.
            (44.21e6, 1500, 1460, 0, 43.03e6, 0.01e6),
        ];
        for (rate, packet, mss, framing, want, tol) in cases {
            let got = max_tcp_throughput(rate, packet, mss, framing).unwrap();
            assert!(close(got, want, tol), "{rate} {packet} {mss}: {got}");
        }
        assert_eq!(max_tcp_throughput(1e9, 0, 0, 0), None);
        assert_eq!(max_tcp_throughput(1e9, 100, 200, 0), None);
    }

    #[test]
    fn segment_table() {
        // (mss, mtu, ip header) -> (packet, mss)
        let cases = [
            ((1448, 1500, IPV4_HEADER), (1500, 1448)),
            // Timestamps off: the MSS is 1460 and the packet the MTU.
            ((1460, 1500, IPV4_HEADER), (1500, 1460)),
            ((1428, 1500, IPV6_HEADER), (1500, 1428)),
            // -M 1000: small segments, more header per byte.
            ((1000, 1500, IPV4_HEADER), (1052, 1000)),
            // Unknown MSS: from the MTU.
            ((0, 9000, IPV4_HEADER), (9000, 8948)),
            // Unknown MTU: 1500.
            ((1448, 0, IPV4_HEADER), (1500, 1448)),
            // Loopback.
            ((65483, 65535, IPV4_HEADER), (65535, 65483)),
        ];
        for ((mss, mtu, ip), want) in cases {
            let (packet, m, _) = segment(mss, mtu, ip);
            assert_eq!((packet, m), want, "{mss} {mtu} {ip}");
        }
        assert!(!segment(1448, 0, IPV4_HEADER).2.is_empty());
        assert!(segment(1448, 1500, IPV4_HEADER).2.is_empty());
    }

    #[test]
    fn efficiency_delay_and_ratio_tables() {
        // (bytes sent, retransmitted bytes, efficiency %)
        for (sent, retr, want) in [
            (1_000_000, 0, Some(100.0)),
            (990_000, 10_000, Some(99.0)),
            // RFC §3.3.2 example: 102,000 transmitted, 2,000 retransmitted.
            (100_000, 2_000, Some(98.039)),
            (0, 0, None),
        ] {
            let got = tcp_efficiency_percent(sent, retr);
            match (got, want) {
                (Some(g), Some(w)) => assert!(close(g, w, 1e-3), "{sent} {retr}: {g}"),
                (g, w) => assert_eq!(g, w),
            }
        }
        // (average RTT, baseline RTT, buffer delay %)
        for (avg, base, want) in [
            (0.050, 0.040, Some(25.0)),
            (0.040, 0.040, Some(0.0)),
            // RFC §3.3.3 example: 25 ms baseline, 32 ms average: 28%.
            (0.032, 0.025, Some(28.0)),
            (0.050, 0.0, None),
        ] {
            let got = buffer_delay_percent(avg, base);
            match (got, want) {
                (Some(g), Some(w)) => assert!(close(g, w, 1e-9), "{avg} {base}: {g}"),
                (g, w) => assert_eq!(g, w),
            }
        }
        // 100 MB at 949.28 Mbit/s: 0.8427 s ideal; taking 1.0535 s is 1.25.
        let ideal = ideal_transfer_secs(100_000_000, 949.28e6).unwrap();
        assert!(close(ideal, 0.84275, 1e-4), "{ideal}");
        let ratio = transfer_time_ratio(ideal * 1.25, ideal).unwrap();
        assert!(close(ratio, 1.25, 1e-12));
        assert_eq!(ideal_transfer_secs(0, 1e9), None);
        assert_eq!(ideal_transfer_secs(1, 0.0), None);
        assert_eq!(transfer_time_ratio(1.0, 0.0), None);
    }

    fn stream(id: u32, dir: Direction, bytes: u64, rtt_us: u32) -> StreamStats {
        StreamStats {
            id: Some(id),
            direction: Some(dir),
            seconds: 1.0,
            bytes,
            bits_per_second: bytes as f64 * 8.0,
            bytes_sent: bytes,
            retransmits: Some(0),
            rtt_us: Some(rtt_us),
            ..Default::default()
        }
    }

    fn interval(index: u32, omitted: bool, streams: Vec<StreamStats>) -> TestInterval {
        TestInterval {
            index,
            start_s: f64::from(index),
            end_s: f64::from(index + 1),
            omitted,
            streams,
            sums: vec![],
        }
    }

    #[test]
    fn mean_rtt_is_byte_weighted_over_measured_intervals() {
        let up = Direction::Up;
        let ivs = [
            // Omitted: left out whatever it says.
            interval(0, true, vec![stream(1, up, 1000, 999_000)]),
            // 3 parts at 40 ms, 1 part at 60 ms: 45 ms.
            interval(
                1,
                false,
                vec![stream(1, up, 300, 40_000), stream(2, up, 100, 60_000)],
            ),
            // An idle stream and a stream without RTT do not count.
            interval(
                2,
                false,
                vec![stream(1, up, 0, 500_000), stream(2, up, 400, 0)],
            ),
            // Other direction: not counted.
            interval(3, false, vec![stream(3, Direction::Down, 400, 1)]),
        ];
        assert!(close(mean_rtt_us(&ivs, up).unwrap(), 45_000.0, 1e-9));
        assert_eq!(mean_rtt_us(&ivs[..1], up), None);
        assert!(close(
            mean_rtt_us(&ivs, Direction::Down).unwrap(),
            1.0,
            1e-9
        ));
    }

    /// A 10 s test over a 1 Gbit/s (IP bytes) × 40 ms path.
    fn report(bytes: u64, seconds: f64, retransmits: u64, rtt_us: u32) -> TestReport {
        let mut sum = stream(0, Direction::Up, bytes, rtt_us);
        sum.id = None;
        sum.seconds = seconds;
        sum.retransmits = Some(retransmits);
        TestReport {
            schema: "fatpipe.test".into(),
            version: 1,
            start: TestStart {
                timestamp: 0.0,
                server: "h".into(),
                server_addr: "10.0.0.2:5301".into(),
                protocol: Protocol::Tcp,
                direction: TestDirection::Up,
                streams: 1,
                duration_s: seconds,
                bytes: None,
                omit_s: 0.0,
                interval_s: 1.0,
                length: 131072,
                bitrate: None,
                window: None,
                mss: None,
                congestion: None,
                fq_rate: None,
                zerocopy: false,
                local: vec![SocketInfo {
                    id: 1,
                    direction: Direction::Up,
                    sndbuf: 0,
                    rcvbuf: 0,
                    mss: 1448,
                    congestion: "cubic".into(),
                    send_path: "copy".into(),
                    recv_path: "copy".into(),
                }],
                remote: vec![],
                warnings: vec![],
                auto: None,
                encryption: None,
            },
            intervals: vec![interval(
                0,
                false,
                vec![stream(1, Direction::Up, bytes, rtt_us)],
            )],
            end: TestEnd {
                seconds,
                streams: vec![],
                sums: vec![sum],
                cpu_local: CpuUse::default(),
                cpu_remote: CpuUse::default(),
                rfc6349: None,
                ramp: None,
            },
        }
    }

    fn lab_baseline() -> Baseline {
        Baseline {
            rtt_secs: 0.040,
            bottleneck_bps: Some(1_000_000_000),
            lower_bound: false,
            mtu: 1500,
        }
    }

    #[test]
    fn assess_a_clean_and_a_lossy_transfer() {
        // 965.33 Mbit/s is the ceiling: moving 965.33 Mbit/s × 8 s worth
        // of bytes in 10 s is a ratio of 1.25.
        let max = 1e9 * 1448.0 / 1500.0;
        let bytes = (max * 8.0 / 8.0) as u64;
        let r = assess(&Ok(lab_baseline()), &report(bytes, 10.0, 0, 50_000)).unwrap();
        assert_eq!(r.direction, Direction::Up);
        assert_eq!((r.packet_bytes, r.mss), (1500, 1448));
        assert_eq!(r.bdp_bytes, Some(5_000_000));
        assert!(close(r.max_tcp_bps.unwrap(), max, 1.0));
        assert!(close(r.ideal_seconds.unwrap(), 8.0, 1e-6));
        assert!(close(r.transfer_time_ratio.unwrap(), 1.25, 1e-6));
        assert_eq!(r.tcp_efficiency_percent, Some(100.0));
        assert_eq!(r.baseline_rtt_us, Some(40_000));
        assert_eq!(r.avg_rtt_us, Some(50_000));
        assert!(close(r.buffer_delay_percent.unwrap(), 25.0, 1e-9));
        assert!(r.unavailable.is_empty(), "{:?}", r.unavailable);

        // 1000 retransmitted segments of 1448 in 144.8 MB written: 99.01%.
        let r = assess(
            &Ok(lab_baseline()),
            &report(144_800_000, 10.0, 1000, 40_000),
        )
        .unwrap();
        assert_eq!(r.retransmitted_bytes, 1_448_000);
        assert!(close(r.tcp_efficiency_percent.unwrap(), 99.0099, 1e-3));
        assert!(close(r.buffer_delay_percent.unwrap(), 0.0, 1e-9));
        assert!(!r.notes.iter().any(|n| n.contains("below 1")));

        // Faster than the ceiling: the estimate was low, and it says so.
        let r = assess(&Ok(lab_baseline()), &report(bytes, 8.0 / 1.05, 0, 40_000)).unwrap();
        assert!(close(r.transfer_time_ratio.unwrap(), 1.0 / 1.05, 1e-6));
        assert!(
            r.notes.iter().any(|n| n.contains("at least 5.0% low")),
            "{:?}",
            r.notes
        );
    }

    #[test]
    fn no_ratio_from_a_lower_bound_or_no_probe() {
        let lb = Baseline {
            lower_bound: true,
            ..lab_baseline()
        };
        let r = assess(&Ok(lb), &report(1_000_000, 1.0, 0, 40_000)).unwrap();
        assert!(r.bottleneck_lower_bound);
        assert_eq!((r.ideal_seconds, r.transfer_time_ratio), (None, None));
        assert!(
            r.unavailable[0]
                .starts_with("transfer_time_ratio: the bottleneck estimate is only a lower bound"),
            "{:?}",
            r.unavailable
        );
        // The other metrics do not need the rate.
        assert_eq!(r.tcp_efficiency_percent, Some(100.0));
        assert_eq!(r.buffer_delay_percent, Some(0.0));

        let no_rate = Baseline {
            bottleneck_bps: None,
            ..lab_baseline()
        };
        let r = assess(&Ok(no_rate), &report(1_000_000, 1.0, 0, 40_000)).unwrap();
        assert_eq!(
            (r.transfer_time_ratio, r.max_tcp_bps, r.bdp_bytes),
            (None, None, None)
        );
        assert!(!r.bottleneck_lower_bound);
        assert!(
            r.unavailable[0].contains("no bottleneck rate"),
            "{:?}",
            r.unavailable
        );

        let r = assess(&Err("timed out".into()), &report(1_000_000, 1.0, 0, 40_000)).unwrap();
        assert_eq!((r.baseline_rtt_us, r.buffer_delay_percent), (None, None));
        assert_eq!(r.transfer_time_ratio, None);
        assert_eq!(r.tcp_efficiency_percent, Some(100.0));
        assert_eq!(r.unavailable.len(), 3, "{:?}", r.unavailable);
        assert!(r
            .unavailable
            .iter()
            .all(|u| u.contains("no path probe (timed out)")));
    }

    #[test]
    fn udp_and_reverse() {
        let mut udp = report(1, 1.0, 0, 1);
        udp.start.protocol = Protocol::Udp;
        assert_eq!(assess(&Ok(lab_baseline()), &udp), None);
        // Reverse: the down sum and the server's MSS.
        let mut rev = report(1_000_000, 1.0, 0, 40_000);
        rev.start.direction = TestDirection::Down;
        assert_eq!(assess(&Ok(lab_baseline()), &rev), None, "no down sum");
        rev.end.sums[0].direction = Some(Direction::Down);
        rev.intervals[0].streams[0].direction = Some(Direction::Down);
        let mut info = rev.start.local[0].clone();
        info.direction = Direction::Down;
        info.mss = 1000;
        rev.start.remote = vec![info];
        let r = assess(&Ok(lab_baseline()), &rev).unwrap();
        assert_eq!(r.direction, Direction::Down);
        assert_eq!((r.mss, r.packet_bytes), (1000, 1052));
        assert!(r.notes[0].contains("taken as the server-to-client"));
    }
}
