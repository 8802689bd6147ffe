//! Path probing: what `fatpipe path` measures and auto-tuning starts from.
//!
//! A `probe` service on the server ([`ProbeService`]) and its client
//! ([`run`]) exchange UDP echoes, Don't-Fragment MTU probes and packet
//! trains over the same authenticated session as every other service; the
//! server timestamps the trains in the kernel and reports the timestamps,
//! so all arithmetic happens on the client in pure code:
//!
//! * [`estimate`]: round-trip statistics, and the bottleneck rate from the
//!   dispersion of the trains with outlier filtering and a confidence;
//! * [`mtu`]: the path-MTU search as a state machine;
//! * [`wire`]: the UDP packets and control messages (size-capped, fuzzed);
//! * [`report`]: the measured outcome turned into the versioned
//!   [`PathReport`] with the planner's choice for this path.
//!
//! The socket plumbing ([`client`], [`server`], and `fatpipe_sys::probe` for
//! the calls `std` lacks) is kept thin so that what can be wrong in the
//! numbers is in the pure modules, where tests feed them synthetic
//! timestamps.

pub mod client;
pub mod estimate;
pub mod mtu;
pub mod server;
pub mod wire;

use std::net::SocketAddr;

use fatpipe_audit::peer::Probed;
use fatpipe_schema::path::{
    BottleneckReport, LossReport, MtuReport, PathReport, RttReport, PATH_SCHEMA,
    PATH_SCHEMA_VERSION,
};
use fatpipe_schema::tune::{HostLimits, PathFacts, Plan, RateConfidence};
use fatpipe_schema::units::{bdp_bytes, format_rate};

pub use client::{run, ProbeConfig, ProbeOutcome};
pub use server::ProbeService;

/// Why a probe failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The session could not be set up or broke (includes auth failures:
    /// see [`ProbeError::is_auth`]).
    #[error(transparent)]
    Engine(#[from] fatpipe_engine::EngineError),
    /// A socket operation failed. (The error is shown, not chained, so a
    /// one-line report does not print it twice.)
    #[error("{context}: {error}")]
    Io {
        /// What was being done.
        context: String,
        /// The system's error.
        error: std::io::Error,
    },
    /// The peer sent a message that does not decode.
    #[error("malformed probe message: {0}")]
    Decode(fatpipe_proto::DecodeError),
    /// The peer broke the exchange (a message out of order).
    #[error("{0}")]
    Protocol(String),
    /// A phase got no answer in time.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The server's probe service reported a failure.
    #[error("server: {0}")]
    Peer(String),
    /// The server cannot do what was asked (an older version).
    #[error("{0}")]
    Unsupported(String),
}

impl ProbeError {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, error: std::io::Error) -> Self {
        ProbeError::Io {
            context: context.into(),
            error,
        }
    }

    /// True if the keys are missing or do not match (the user's to fix).
    pub fn is_auth(&self) -> bool {
        matches!(self, ProbeError::Engine(e) if e.is_auth())
    }
}

impl From<fatpipe_proto::DecodeError> for ProbeError {
    fn from(e: fatpipe_proto::DecodeError) -> Self {
        ProbeError::Decode(e)
    }
}

/// Bytes of IP and UDP header in front of a probe's payload to `addr`.
pub(crate) fn ip_overhead(addr: SocketAddr) -> usize {
    match addr {
        SocketAddr::V4(_) => 28,
        SocketAddr::V6(a) if a.ip().to_ipv4_mapped().is_some() => 28,
        SocketAddr::V6(_) => 48,
    }
}

/// Sends train number `train` on the connected socket `udp`: `len`
/// packets padded to `payload` bytes, as fast as the kernel takes them
/// (the client's forward trains and the server's reverse ones). Returns
/// how long sending took (ns) and how much of that the sender was busy
/// (ns, [`busy_ns`]): a call in which the thread was descheduled counts as
/// a typical one.
///
/// The packets go out as UDP GSO super-packets of up to
/// [`gso_segments`] datagrams, and at most a sixteenth of the train, where
/// the kernel can (one system call and
/// one trip through the stack per ~64 kB, segmented at the device or by a
/// NIC with UDP segmentation offload), else as `sendmmsg` batches. One
/// datagram per trip through the stack cost a busy 2-core host more time
/// than a 5 Gbit/s link takes to carry it: the trains then measured the
/// sender (1.2 to 3 Gbit/s on a 5 Gbit/s lab link) and the estimate was
/// only a lower bound.
pub(crate) fn send_train(
    udp: &std::net::UdpSocket,
    batch: &mut fatpipe_sys::udp::SendBatch,
    train: u32,
    len: u32,
    payload: usize,
) -> Result<(u64, u64), ProbeError> {
    let packets: Vec<Vec<u8>> = (0..len)
        .map(|index| {
            let mut buf = Vec::with_capacity(payload);
            wire::Packet::Train {
                train,
                index,
                count: len,
            }
            .encode(&mut buf, payload);
            buf
        })
        .collect();
    // GSO cuts at a fixed segment size: every packet must be `payload`
    // bytes (the header is far shorter than any probe size, so they are).
    let per_call = gso_per_call(payload, len);
    let gso = per_call > 1 && packets.iter().all(|p| p.len() == payload);
    let joined: Vec<Vec<u8>> = if gso {
        packets.chunks(per_call).map(|c| c.concat()).collect()
    } else {
        Vec::new()
    };
    let refs: Vec<&[u8]> = packets.iter().map(Vec::as_slice).collect();
    let t0 = std::time::Instant::now();
    if gso {
        let mut calls = Vec::with_capacity(joined.len());
        let mut last = t0;
        for chunk in &joined {
            let b = fatpipe_sys::udp::send_gso(udp, chunk, payload)
                .map_err(|e| ProbeError::io("send packet train", e))?;
            if b.datagrams == 0 {
                return Err(ProbeError::Protocol(
                    "the kernel accepted no train packet".into(),
                ));
            }
            let now = std::time::Instant::now();
            calls.push(now.duration_since(last).as_nanos() as u64);
            last = now;
        }
        let span = t0.elapsed().as_nanos() as u64;
        return Ok((span, busy_ns(&calls).min(span)));
    }
    let mut done = 0;
    while done < refs.len() {
        let b = batch
            .send(udp, &refs[done..])
            .map_err(|e| ProbeError::io("send packet train", e))?;
        if b.datagrams == 0 {
            return Err(ProbeError::Protocol(
                "the kernel accepted no train packet".into(),
            ));
        }
        done += b.datagrams;
    }
    let span = t0.elapsed().as_nanos() as u64;
    Ok((span, span))
}

/// The time a sender of these calls (ns each) was busy: their sum, with
/// each call that took both [`STALL_NS`] and ten times the median counted
/// as the median: the thread was descheduled in it. Uneven work (a call
/// that also ran the receive path, as on loopback) stays counted: it takes
/// microseconds, a time slice lost to another process milliseconds.
fn busy_ns(calls: &[u64]) -> u64 {
    let mut sorted = calls.to_vec();
    sorted.sort_unstable();
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0);
    let stall = median.saturating_mul(10).max(STALL_NS);
    calls
        .iter()
        .map(|&d| if d > stall { median } else { d })
        .sum()
}

/// A send call at least this long (and ten times the median) was a stall.
const STALL_NS: u64 = 500_000;

/// Datagrams per GSO call in a train of `len` datagrams of `payload`
/// bytes (1: no GSO): what one call may carry, and at most a sixteenth of
/// the train. A super-packet that travels whole (the lab's forwarder, a
/// receiver with GRO) arrives as one clump of timestamps, and a train needs
/// many clumps to give a slope (a 33-packet train at 100 Mbit/s in one
/// clump read 32 % high).
pub(crate) fn gso_per_call(payload: usize, len: u32) -> usize {
    gso_segments(payload).min(len as usize / 16).max(1)
}

/// Datagrams of `payload` bytes one GSO send carries: the kernel's segment
/// limit and the 64 kB of one UDP datagram bound it.
pub(crate) fn gso_segments(payload: usize) -> usize {
    if payload == 0 {
        return 1;
    }
    (65_507 / payload).clamp(1, fatpipe_sys::udp::UDP_MAX_GSO_SEGMENTS)
}

/// The path facts a probe gives the planner: minimum RTT, the estimate
/// (even a lower bound: better than none), the loss seen, the path MTU.
pub fn facts(o: &ProbeOutcome) -> PathFacts {
    let (sent, lost) = loss_counts(o);
    PathFacts {
        rtt_secs: o.rtt.min.as_secs_f64(),
        bottleneck_rate: o.rate.as_ref().map(|r| r.rate.round() as u64),
        loss_rate: if sent == 0 {
            0.0
        } else {
            lost as f64 / sent as f64
        },
        mtu: o.mtu.path_mtu.unwrap_or(0),
        loss_packets: sent,
    }
}

/// How sure the probe is of its rate, for the planner and the JSON plan;
/// `None` when no train gave an estimate.
pub fn rate_confidence(o: &ProbeOutcome) -> Option<RateConfidence> {
    o.rate.as_ref().map(confidence_of)
}

/// An estimate's rate, interval and confidence as the planner and the
/// `path` report both give them: whole bit/s, confidence to 0.01.
fn confidence_of(r: &estimate::RateEstimate) -> RateConfidence {
    RateConfidence {
        rate: r.rate.round() as u64,
        low: r.low.round() as u64,
        high: r.high.round() as u64,
        confidence: (r.confidence * 100.0).round() / 100.0,
        label: estimate::confidence_label(r.confidence).into(),
        lower_bound: r.sender_limited,
    }
}

/// The parts of a finished probe the host audit (`tune --for HOST`) uses.
pub fn probed(o: &ProbeOutcome) -> Probed {
    let facts = facts(o);
    Probed {
        remote: o.remote.to_string(),
        rtt: o.rtt.min,
        rate: o.rate.as_ref().map(|r| r.rate),
        lower_bound: o.rate.as_ref().is_some_and(|r| r.sender_limited),
        confidence: o.rate.as_ref().map(|r| r.confidence),
        loss_rate: facts.loss_rate,
        mtu: match (o.mtu.path_mtu, &o.route_mtu) {
            (Some(m), _) => Ok(m),
            (None, Err(e)) => Err(format!("not probed: {e}")),
            (None, Ok(_)) => Err("no MTU probe reached the peer".to_string()),
        },
        probe_secs: o.elapsed.as_secs_f64(),
    }
}

/// Turns a probe into the report `fatpipe path` prints: statistics, BDP,
/// the window one stream needs, and what the planner would choose for a
/// test from this host (`local`, the sender) to the server (the receiver).
///
/// `planner` is called as `planner(facts, sender, receiver)`. The caller
/// passes the auto-tuning planner (`fatpipe_tune::plan`); taking it as an
/// argument keeps this service crate below the policy that runs it.
pub fn report(
    o: &ProbeOutcome,
    server: &str,
    local: Result<HostLimits, String>,
    planner: impl Fn(&PathFacts, &HostLimits, &HostLimits) -> Plan,
) -> PathReport {
    let facts = facts(o);
    let mut warnings = Vec::new();
    let (sender, receiver) = if o.reverse {
        ("the server", "this host")
    } else {
        ("this host", "the server")
    };
    let bottleneck = o.rate.as_ref().map(|r| {
        if r.sender_limited {
            warnings.push(format!(
                "{sender} could not send trains faster than they arrived: the rate is a lower bound"
            ));
        }
        if r.confidence < estimate::ROUGH_BELOW {
            warnings.push(format!(
                "the trains disagree ({} to {}): treat the rate as rough",
                format_rate(r.low),
                format_rate(r.high)
            ));
        }
        let c = confidence_of(r);
        BottleneckReport {
            rate: c.rate,
            low: c.low,
            high: c.high,
            confidence: c.confidence,
            confidence_label: c.label,
            lower_bound: c.lower_bound,
            trains: r.trains,
            used: r.used,
            outliers: r.outliers,
            rejected: r.rejected,
            packet_bytes: o.train_packet,
            packets_per_train: o.train_len,
            kernel_timestamps: o.kernel_clock,
        }
    });
    if o.rate.is_none() {
        warnings.push("no packet train gave a rate estimate (too much loss?)".into());
    }
    if !o.kernel_clock {
        warnings.push(format!(
            "{receiver} timed packets in user space: the rate is less precise"
        ));
    }
    if let Err(e) = &o.route_mtu {
        warnings.push(format!("path MTU not probed: {e}"));
    }
    let bdp = facts.bottleneck_rate.map(|rate| bdp_bytes(rate, o.rtt.min));
    let plan = match (local, o.peer_limits.clone()) {
        // Reverse: the direction measured is the server sending.
        (Ok(l), Ok(p)) if o.reverse => Some(planner(&facts, &p, &l)),
        (Ok(s), Ok(r)) => Some(planner(&facts, &s, &r)),
        (Ok(s), Err(why)) => {
            warnings.push(format!(
                "server's host limits unknown ({why}): planned as if they were this host's"
            ));
            Some(planner(&facts, &s, &s))
        }
        (Err(why), Ok(r)) => {
            warnings.push(format!(
                "this host's limits unknown ({why}): planned as if they were the server's"
            ));
            Some(planner(&facts, &r, &r))
        }
        (Err(a), Err(b)) => {
            warnings.push(format!(
                "no plan: host limits unknown here ({a}) and at the server ({b})"
            ));
            None
        }
    };
    let (sent, lost) = loss_counts(o);
    PathReport {
        schema: PATH_SCHEMA.into(),
        version: PATH_SCHEMA_VERSION,
        server: server.into(),
        remote: o.remote.to_string(),
        reverse: o.reverse,
        rtt: RttReport {
            sent: o.rtt.sent,
            received: o.rtt.received,
            min_secs: o.rtt.min.as_secs_f64(),
            avg_secs: o.rtt.avg.as_secs_f64(),
            max_secs: o.rtt.max.as_secs_f64(),
            stddev_secs: o.rtt.stddev.as_secs_f64(),
        },
        mtu: MtuReport {
            path_mtu: o.mtu.path_mtu,
            route_mtu: o.route_mtu.as_ref().ok().copied(),
            route_mtu_error: o.route_mtu.as_ref().err().cloned(),
            probes: o.mtu.probes,
        },
        bottleneck,
        loss: LossReport {
            echo_sent: u64::from(o.rtt.sent),
            echo_lost: u64::from(o.rtt.sent - o.rtt.received),
            train_sent: o.train_packets.0,
            train_lost: o.train_packets.0.saturating_sub(o.train_packets.1),
            rate: if sent == 0 {
                0.0
            } else {
                lost as f64 / sent as f64
            },
        },
        bdp,
        single_stream_window: bdp,
        single_stream_buffer: bdp.map(|b| b.saturating_mul(2)),
        facts,
        plan,
        warnings,
        duration_secs: o.elapsed.as_secs_f64(),
    }
}

/// Probe packets sent and lost, echoes and trains together.
fn loss_counts(o: &ProbeOutcome) -> (u64, u64) {
    let echo_lost = u64::from(o.rtt.sent.saturating_sub(o.rtt.received));
    let train_lost = o.train_packets.0.saturating_sub(o.train_packets.1);
    (
        u64::from(o.rtt.sent) + o.train_packets.0,
        echo_lost + train_lost,
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::estimate::{RateEstimate, RttStats};
    use super::mtu::MtuResult;
    use super::*;

    fn limits(max: u64) -> HostLimits {
        HostLimits {
            rmem_max: max,
            wmem_max: max,
            tcp_rmem: [4096, 131072, max],
            tcp_wmem: [4096, 16384, max],
            congestion: vec!["cubic".into(), "bbr".into()],
            privileged: false,
        }
    }

    /// A stand-in for the planner: sizes one stream to the BDP and names
    /// which end sent (the smaller `rmem_max` marks this host in tests).
    fn planner(facts: &PathFacts, sender: &HostLimits, receiver: &HostLimits) -> Plan {
        let bdp = facts
            .bottleneck_rate
            .map(|r| bdp_bytes(r, std::time::Duration::from_secs_f64(facts.rtt_secs)));
        Plan {
            streams: 1,
            per_stream_buffer: bdp.unwrap_or(0),
            set_buffers: false,
            forced_buffers: false,
            congestion: "cubic".into(),
            pacing_rate: None,
            bdp,
            reason: format!("sender {} receiver {}", sender.rmem_max, receiver.rmem_max),
            estimate: None,
            window_rate: None,
        }
    }

    fn outcome() -> ProbeOutcome {
        let ms = Duration::from_millis;
        ProbeOutcome {
            remote: "198.18.0.2:5301".parse().unwrap(),
            rtt: RttStats {
                sent: 10,
                received: 9,
                min: ms(93),
                avg: ms(94),
                max: ms(97),
                stddev: ms(1),
            },
            route_mtu: Ok(1500),
            mtu: MtuResult {
                path_mtu: Some(1500),
                probes: 1,
            },
            train_packet: 1500,
            train_len: 333,
            rate: Some(RateEstimate {
                rate: 1e9,
                low: 0.99e9,
                high: 1.01e9,
                confidence: 0.93,
                trains: 10,
                used: 10,
                outliers: 0,
                rejected: 0,
                sender_limited: false,
            }),
            kernel_clock: true,
            train_packets: (990, 980),
            peer_limits: Ok(limits(64 << 20)),
            reverse: false,
            elapsed: Duration::from_secs(1),
        }
    }

    #[test]
    fn only_a_stalled_send_call_is_left_out_of_the_busy_time() {
        // Even calls: all of it.
        assert_eq!(busy_ns(&[20_000; 10]), 200_000);
        // Uneven work of tens of microseconds (loopback runs the receiver
        // inside some calls): all of it, so loopback stays a lower bound.
        let uneven = [10_000, 90_000, 10_000, 80_000, 10_000, 10_000];
        assert_eq!(busy_ns(&uneven), uneven.iter().sum::<u64>());
        // A 3 ms stall in one call counts as a typical call.
        assert_eq!(busy_ns(&[20_000, 20_000, 3_000_000, 20_000]), 80_000);
        assert_eq!(busy_ns(&[]), 0);
    }

    #[test]
    fn gso_trains_are_cut_into_at_least_sixteen_calls() {
        // 1500-byte packets (1472 bytes of UDP payload): 44 fit one call.
        assert_eq!(gso_segments(1472), 44);
        assert_eq!(gso_per_call(1472, 1024), 44);
        assert_eq!(gso_per_call(1472, 400), 25);
        assert_eq!(gso_per_call(1472, 64), 4);
        assert_eq!(gso_per_call(1472, 33), 2);
        // Too short to cut into sixteen clumps of two: no GSO.
        assert_eq!(gso_per_call(1472, 31), 1);
        // 9000-byte packets: 7 per call at most.
        assert_eq!(gso_per_call(8972, 400), 7);
        assert_eq!(gso_per_call(0, 400), 1);
    }

    #[test]
    fn report_has_bdp_window_loss_and_the_plan() {
        let r = report(&outcome(), "lab", Ok(limits(32 << 20)), planner);
        // 1 Gbit/s × 93 ms = 11.625 MB
        assert_eq!(r.bdp, Some(11_625_000));
        assert_eq!(r.single_stream_window, Some(11_625_000));
        assert_eq!(r.single_stream_buffer, Some(23_250_000));
        assert_eq!((r.loss.echo_lost, r.loss.train_lost), (1, 10));
        assert!((r.loss.rate - 11.0 / 1000.0).abs() < 1e-12);
        assert_eq!(r.facts.loss_rate, r.loss.rate);
        assert_eq!(r.facts.mtu, 1500);
        assert_eq!(r.facts.bottleneck_rate, Some(1_000_000_000));
        let b = r.bottleneck.as_ref().unwrap();
        assert_eq!(b.confidence_label, "high");
        assert!(!b.lower_bound);
        let plan = r.plan.as_ref().unwrap();
        assert_eq!(plan.bdp, Some(11_625_000));
        // This host sends, the server receives.
        assert_eq!(
            plan.reason,
            format!("sender {} receiver {}", 32 << 20, 64 << 20)
        );
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
        assert_eq!(r.schema, PATH_SCHEMA);
    }

    #[test]
    fn report_says_what_it_could_not_know() {
        let mut o = outcome();
        o.peer_limits = Err("no /proc".into());
        o.kernel_clock = false;
        o.route_mtu = Err("cannot set Don't Fragment".into());
        if let Some(rate) = o.rate.as_mut() {
            rate.sender_limited = true;
            rate.confidence = 0.1;
        }
        let r = report(&o, "lab", Ok(limits(4 << 20)), planner);
        // The server's limits are unknown: planned with this host's twice.
        assert_eq!(
            r.plan.as_ref().map(|p| p.reason.clone()),
            Some(format!("sender {} receiver {}", 4 << 20, 4 << 20))
        );
        let all = r.warnings.join("\n");
        for want in [
            "lower bound",
            "disagree",
            "user space",
            "MTU not probed",
            "server's host limits",
        ] {
            assert!(all.contains(want), "no {want:?} in {all}");
        }
        assert!(r.bottleneck.as_ref().unwrap().lower_bound);
        assert!(!r.reverse);
        // Reverse: the server sent and this host timed.
        o.reverse = true;
        let r = report(&o, "lab", Ok(limits(4 << 20)), planner);
        assert!(r.reverse);
        let all = r.warnings.join("\n");
        assert!(
            all.contains("the server could not send trains faster"),
            "{all}"
        );
        assert!(
            all.contains("this host timed packets in user space"),
            "{all}"
        );
        o.reverse = false;

        o.rate = None;
        let r = report(&o, "lab", Err("no /proc here".into()), planner);
        assert_eq!((r.bdp, r.single_stream_window), (None, None));
        assert!(r.plan.is_none());
        assert!(r.warnings.iter().any(|w| w.starts_with("no plan")));
        assert!(r.warnings.iter().any(|w| w.contains("no packet train")));
    }

    #[test]
    fn ip_overhead_by_family() {
        assert_eq!(ip_overhead("1.2.3.4:5".parse().unwrap()), 28);
        assert_eq!(ip_overhead("[::ffff:1.2.3.4]:5".parse().unwrap()), 28);
        assert_eq!(ip_overhead("[2001:2::2]:5".parse().unwrap()), 48);
    }
}
