//! The result of `fatpipe test`: what `--json` prints and the archive stores.
//!
//! One [`TestReport`] per run: a [`TestStart`] (what was asked and what each
//! end actually got), the [`TestInterval`]s, and a [`TestEnd`] with totals
//! over the measured period (after the omitted warm-up). `--json-stream`
//! prints the same three parts as separate lines, each wrapped in a
//! [`TestStreamLine`]. Throughput is always the receiver's: bytes that
//! arrived over the receiver's time. TCP window, RTT and retransmits come
//! from the *sender's* `TCP_INFO`, which is where they mean something.
//!
//! Documented field by field in docs/json-schema.md. Bump
//! [`TEST_SCHEMA_VERSION`] on any change that breaks a reader; adding an
//! optional field does not.

use serde::{Deserialize, Serialize};

/// Names this schema in every report.
pub const TEST_SCHEMA: &str = "fatpipe.test";
/// The schema's version.
pub const TEST_SCHEMA_VERSION: u32 = 1;

/// A whole test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestReport {
    /// Always [`TEST_SCHEMA`].
    pub schema: String,
    /// Always [`TEST_SCHEMA_VERSION`] for this layout.
    pub version: u32,
    /// Settings and what each end got.
    pub start: TestStart,
    /// One per interval, in order (omitted ones included, flagged).
    pub intervals: Vec<TestInterval>,
    /// Totals.
    pub end: TestEnd,
}

/// Transport under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// One TCP connection per stream (`"tcp"`).
    Tcp,
    /// One UDP flow per stream, paced at a bitrate (`"udp"`).
    Udp,
}

/// Which way a whole test sends: the `test` service's request
/// (`fatpipe_memtest::msg::TestParams`) and [`TestStart::direction`] share
/// this one type, so the JSON text is the same on the wire and in results.
///
/// Not [`Direction`]: a test may send both ways at once, a stream only one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TestDirection {
    /// Client sends, server receives (the default; `"up"`).
    Up,
    /// Server sends (`-R`; `"down"`).
    Down,
    /// Both at once (`--bidir`; `"both"`): streams `0..n` up, `n..2n` down.
    Both,
}

/// Which way data flows on one stream (or one direction's sum), seen from
/// the client. Not [`TestDirection`]: a stream cannot go both ways.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Client to server (`"up"`).
    Up,
    /// Server to client (`"down"`).
    Down,
}

json_text!(Protocol { Tcp => "tcp", Udp => "udp" });
json_text!(TestDirection { Up => "up", Down => "down", Both => "both" });
json_text!(Direction { Up => "up", Down => "down" });

/// What was asked for, and what the hosts granted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestStart {
    /// Unix time the test started, seconds.
    pub timestamp: f64,
    /// The server as given (host:port).
    pub server: String,
    /// The server's address actually used.
    pub server_addr: String,
    /// TCP or UDP.
    pub protocol: Protocol,
    /// Up, down (reverse) or both (bidirectional).
    pub direction: TestDirection,
    /// Streams per direction.
    pub streams: u32,
    /// Measured time asked for, seconds (0 with a byte count).
    pub duration_s: f64,
    /// Byte count asked for (`-n`), per direction.
    pub bytes: Option<u64>,
    /// Warm-up excluded from totals, seconds.
    pub omit_s: f64,
    /// Interval length, seconds.
    pub interval_s: f64,
    /// Write or datagram size, bytes.
    pub length: u32,
    /// UDP bitrate per stream, bit/s.
    pub bitrate: Option<u64>,
    /// Requested socket buffer, bytes.
    pub window: Option<u64>,
    /// Requested MSS, bytes.
    pub mss: Option<u32>,
    /// Requested congestion control.
    pub congestion: Option<String>,
    /// Requested pacing cap per stream, bit/s.
    pub fq_rate: Option<u64>,
    /// Zero-copy send asked for.
    pub zerocopy: bool,
    /// Per stream, this (client) end's sockets.
    pub local: Vec<SocketInfo>,
    /// Per stream, the server's sockets.
    pub remote: Vec<SocketInfo>,
    /// Things the user should know (buffers capped, options refused).
    pub warnings: Vec<String>,
    /// What auto-tuning probed, planned and applied; absent when it was
    /// off (`--no-auto`, UDP, or every tunable part given as a flag).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto: Option<crate::tune::AutoTune>,
    /// What encrypted the test's connections (`--encrypt`); null when
    /// they were not (and in documents from before it existed).
    #[serde(default)]
    pub encryption: Option<crate::Encryption>,
}

/// One socket's effective settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketInfo {
    /// Stream id.
    pub id: u32,
    /// Which way the stream carries data.
    pub direction: Direction,
    /// Send buffer granted, bytes.
    pub sndbuf: u64,
    /// Receive buffer granted, bytes.
    pub rcvbuf: u64,
    /// MSS in use, bytes (0 for UDP).
    pub mss: u32,
    /// Congestion control in use ("" for UDP).
    pub congestion: String,
    /// Send path used at this end ("copy", "sendfile", "msg_zerocopy", ...).
    pub send_path: String,
    /// Receive path used at this end ("copy", "recv_trunc", ...).
    pub recv_path: String,
}

/// One stream's (or one direction's sum of) numbers over a period.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamStats {
    /// Stream id; absent on a sum.
    pub id: Option<u32>,
    /// Which way.
    pub direction: Option<Direction>,
    /// Period length, seconds.
    pub seconds: f64,
    /// Bytes the receiver got.
    pub bytes: u64,
    /// Receiver throughput, bit/s.
    pub bits_per_second: f64,
    /// Bytes the sender wrote.
    pub bytes_sent: u64,
    /// TCP: segments retransmitted (sender).
    pub retransmits: Option<u64>,
    /// TCP: smoothed RTT, microseconds (sender; mean over streams in a sum).
    pub rtt_us: Option<u32>,
    /// TCP: RTT variance, microseconds (sender).
    pub rttvar_us: Option<u32>,
    /// TCP: congestion window, bytes (sender; total in a sum).
    pub cwnd: Option<u64>,
    /// UDP: datagrams sent.
    pub packets_sent: Option<u64>,
    /// UDP: datagrams received.
    pub packets: Option<u64>,
    /// UDP: datagrams lost.
    pub lost: Option<u64>,
    /// UDP: lost as a percentage of sent.
    pub lost_percent: Option<f64>,
    /// UDP: datagrams out of order.
    pub out_of_order: Option<u64>,
    /// UDP: jitter (RFC 3550), milliseconds (mean over streams in a sum).
    pub jitter_ms: Option<f64>,
}

/// One reporting interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestInterval {
    /// From 0.
    pub index: u32,
    /// Start, seconds after the test started.
    pub start_s: f64,
    /// End, seconds after the test started.
    pub end_s: f64,
    /// Part of the warm-up excluded from totals.
    pub omitted: bool,
    /// Per stream.
    pub streams: Vec<StreamStats>,
    /// Per direction ("up" first).
    pub sums: Vec<StreamStats>,
}

/// CPU utilisation of one end's process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuUse {
    /// User + system, percent of one core.
    pub total_percent: f64,
    /// User, percent of one core.
    pub user_percent: f64,
    /// System, percent of one core.
    pub system_percent: f64,
}

/// Totals over the measured period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestEnd {
    /// Measured time, seconds.
    pub seconds: f64,
    /// Per stream.
    pub streams: Vec<StreamStats>,
    /// Per direction ("up" first).
    pub sums: Vec<StreamStats>,
    /// This (client) process.
    pub cpu_local: CpuUse,
    /// The server process.
    pub cpu_remote: CpuUse,
    /// RFC 6349 metrics (`--rfc6349`); absent without the flag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rfc6349: Option<Rfc6349>,
    /// How long the test took to reach its steady rate (TCP); null for
    /// UDP, a test too short to tell, an iperf3 peer, or documents from
    /// before it existed.
    #[serde(default)]
    pub ramp: Option<TestRamp>,
}

/// The start-up cost of a TCP test: from its start until the data arrived,
/// over one second, at 90 % of the rate of its second half (the copy's
/// `ramp_secs` and `final_rate` are the same measure).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TestRamp {
    /// Seconds from the test's start to 90 % of `final_rate`; null when
    /// it never got there.
    pub secs: Option<f64>,
    /// Bit/s delivered over the second half of the test's time (both
    /// directions together for `--bidir`), what the ramp is measured
    /// against.
    pub final_rate: u64,
}

/// The RFC 6349 (Framework for TCP Throughput Testing) view of a TCP test,
/// for one direction: the path's baseline RTT and bottleneck rate from the
/// probe, and how the transfer compares to what they allow.
///
/// A metric that cannot be computed is `None`, with the reason in
/// [`Rfc6349::unavailable`]; none is ever guessed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rfc6349 {
    /// The direction assessed (the sender's TCP counters are used).
    pub direction: Direction,
    /// Baseline RTT: the probe's minimum round trip, microseconds.
    pub baseline_rtt_us: Option<u64>,
    /// Bottleneck bandwidth from the probe's packet trains, bit/s of IP
    /// packets (headers included, link framing not).
    pub bottleneck_bps: Option<u64>,
    /// True when the probe could only show that the path is at least
    /// `bottleneck_bps` fast: `bdp_bytes` and `max_tcp_bps` are then lower
    /// bounds and no transfer time ratio is computed.
    pub bottleneck_lower_bound: bool,
    /// IP packet size of a full segment used for the overhead, bytes.
    pub packet_bytes: u32,
    /// TCP payload of a full segment (the sender's MSS), bytes.
    pub mss: u32,
    /// Bandwidth-delay product, bottleneck × baseline RTT, bytes: the
    /// smallest window (summed over streams) that can fill the path.
    pub bdp_bytes: Option<u64>,
    /// Maximum achievable TCP throughput: the bottleneck rate less the
    /// IP and TCP headers of full-sized segments, bit/s.
    pub max_tcp_bps: Option<f64>,
    /// Bytes the receiver got over the measured period.
    pub bytes: u64,
    /// Actual TCP transfer time: the measured period, seconds.
    pub seconds: f64,
    /// Actual TCP throughput, `bytes` × 8 / `seconds`, bit/s.
    pub actual_bps: f64,
    /// Ideal TCP transfer time: `bytes` at `max_tcp_bps`, seconds.
    pub ideal_seconds: Option<f64>,
    /// Transfer time ratio: actual / ideal transfer time (1.0 is ideal).
    pub transfer_time_ratio: Option<f64>,
    /// Bytes the sender wrote (each sent at least once).
    pub bytes_sent: u64,
    /// Segments the sender retransmitted.
    pub retransmits: u64,
    /// Retransmitted bytes, estimated as `retransmits` × `mss`.
    pub retransmitted_bytes: u64,
    /// TCP efficiency: (transmitted − retransmitted) / transmitted × 100,
    /// where transmitted = `bytes_sent` + `retransmitted_bytes`.
    pub tcp_efficiency_percent: Option<f64>,
    /// Average RTT during the transfer: the sender's smoothed RTT per
    /// stream and interval, weighted by the bytes each carried,
    /// microseconds.
    pub avg_rtt_us: Option<u64>,
    /// Buffer delay: (average RTT − baseline RTT) / baseline RTT × 100.
    pub buffer_delay_percent: Option<f64>,
    /// One line per metric left out: "name: reason".
    pub unavailable: Vec<String>,
    /// How figures were obtained where the RFC leaves a choice.
    pub notes: Vec<String>,
}

/// One line of `--json-stream`.
// Built once per printed line; boxing would only add noise to the schema type.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", content = "data", rename_all = "snake_case")]
pub enum TestStreamLine {
    /// First line.
    Start(TestStart),
    /// One per interval.
    Interval(TestInterval),
    /// A change the in-flight adjuster made (auto-tuned tests), right after
    /// the interval it was decided on and once both ends carried it out.
    Adjust(crate::tune::Decision),
    /// Last line.
    End(TestEnd),
}

/// Names the result of `fatpipe test -u --find-max`, a member of the
/// `fatpipe.test` family.
pub const FIND_MAX_SCHEMA: &str = "fatpipe.test.find_max";
/// Its version.
pub const FIND_MAX_SCHEMA_VERSION: u32 = 1;

/// `fatpipe test -u --find-max`: per datagram length, the highest rate
/// with no loss and the highest with at most the allowed loss, found by
/// an RFC 2544-style search of short trials and confirmed by one
/// full-length trial.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FindMaxReport {
    /// Always [`FIND_MAX_SCHEMA`].
    pub schema: String,
    /// Always [`FIND_MAX_SCHEMA_VERSION`] for this layout.
    pub version: u32,
    /// Unix time the search started, seconds.
    pub timestamp: f64,
    /// The server as given (host:port).
    pub server: String,
    /// The server's address actually used.
    pub server_addr: String,
    /// Up (client sends) or down (`-R`).
    pub direction: TestDirection,
    /// Streams; every rate is their sum.
    pub streams: u32,
    /// Loss allowed for [`FindMaxLength::with_loss`], percent.
    pub loss_max_percent: f64,
    /// The search stops when the highest passing and lowest failing
    /// rates are this close, percent of the failing one.
    pub precision_percent: f64,
    /// Length of each searching trial, seconds.
    pub trial_s: f64,
    /// Length of the confirming trial, seconds.
    pub confirm_s: f64,
    /// Route MTU towards the server, bytes: what the on-the-wire rates
    /// assume each datagram is cut into (IP fragments above it).
    pub mtu: u32,
    /// Per-frame bytes beyond the IP packet in the on-the-wire rates: 38
    /// for Ethernet (preamble 8, header 14, FCS 4, inter-frame gap 12).
    pub framing_bytes: u32,
    /// One per datagram length, in the order asked.
    pub lengths: Vec<FindMaxLength>,
    /// Things the user should know (buffers capped, old server).
    pub warnings: Vec<String>,
}

/// The search's result for one datagram length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FindMaxLength {
    /// UDP payload per datagram, bytes.
    pub length: u32,
    /// The highest rate with no datagram lost, as confirmed (or, when the
    /// confirmation failed every time, as the short trials found it);
    /// absent when even the lowest rate tried lost datagrams.
    pub loss_free: Option<RatePoint>,
    /// True when the full-length trial at `loss_free` lost nothing.
    pub confirmed: bool,
    /// The highest rate whose loss stayed within the allowed loss (short
    /// trials); absent when none did.
    pub with_loss: Option<RatePoint>,
    /// True when the sender could not offer more than it did without
    /// loss: `loss_free` (and `with_loss`) are then lower bounds on what
    /// the path and receiver carry, not their limit.
    pub lower_bound: bool,
    /// The most the sender offered in any trial.
    pub sender_max: RatePoint,
    /// Trials run, the confirming ones included.
    pub trial_count: u32,
    /// Every trial, in order.
    pub trials: Vec<FindMaxTrial>,
    /// The sender's I/O path ("plain", "mmsg", "gso").
    pub send_path: String,
    /// The receiver's I/O path ("plain", "mmsg", "gro").
    pub recv_path: String,
    /// Most datagrams the sender puts in one system call (the pacer's
    /// burst); 1 with `--no-batch`.
    pub burst: u32,
    /// One sentence on how the search ended.
    pub statement: String,
}

/// One rate, in the units people compare.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RatePoint {
    /// UDP payload, bit/s.
    pub payload_bps: f64,
    /// On the wire: IP packets (fragments above the MTU) with
    /// `framing_bytes` each, bit/s.
    pub wire_bps: f64,
    /// Datagrams per second.
    pub packets_per_second: f64,
}

/// One trial of the search.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FindMaxTrial {
    /// Rate asked of the sender, UDP payload bit/s; absent for the first
    /// trial, which sends as fast as the sender can (or at `-b`).
    pub requested_bps: Option<f64>,
    /// Rate the sender offered (datagrams sent over the trial).
    pub offered: RatePoint,
    /// Rate the receiver got.
    pub received: RatePoint,
    /// Datagrams sent.
    pub packets_sent: u64,
    /// Datagrams lost (sent but never received).
    pub lost: u64,
    /// `lost` as a percentage of `packets_sent`.
    pub loss_percent: f64,
    /// Length, seconds.
    pub seconds: f64,
    /// The full-length confirming trial.
    pub confirm: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::pins;

    #[test]
    fn protocol_json_text() {
        pins(Protocol::Tcp, "tcp");
        pins(Protocol::Udp, "udp");
        assert!(serde_json::from_str::<Protocol>("\"TCP\"").is_err());
    }

    #[test]
    fn test_direction_json_text() {
        pins(TestDirection::Up, "up");
        pins(TestDirection::Down, "down");
        pins(TestDirection::Both, "both");
    }

    #[test]
    fn stream_direction_json_text() {
        pins(Direction::Up, "up");
        pins(Direction::Down, "down");
        assert!(serde_json::from_str::<Direction>("\"both\"").is_err());
    }

    #[test]
    fn stream_lines_are_tagged() {
        let line = TestStreamLine::End(TestEnd {
            seconds: 1.0,
            streams: vec![],
            sums: vec![StreamStats {
                direction: Some(Direction::Up),
                ..Default::default()
            }],
            cpu_local: CpuUse::default(),
            cpu_remote: CpuUse::default(),
            rfc6349: None,
            ramp: None,
        });
        let text = serde_json::to_string(&line).unwrap();
        assert!(text.starts_with("{\"event\":\"end\",\"data\":{"), "{text}");
        assert!(text.contains("\"direction\":\"up\""), "{text}");
        let back: TestStreamLine = serde_json::from_str(&text).unwrap();
        assert_eq!(back, line);
    }
}
