//! Result types of auto-tuning and of the host audit (`fatpipe tune`).
//!
//! The planners in `fatpipe-tune` compute these; `test` and `copy` embed the
//! [`Plan`] and the in-flight [`Decision`]s in their JSON results, and
//! `fatpipe tune --json` prints an [`Audit`]. They live here, not in the tune
//! crate, so the engine's result types and the control protocol (which must
//! carry each end's [`HostLimits`] to the other) can name them without
//! depending on the planner.
//!
//! Rates are bits per second and sizes bytes, as plain integers, so machines
//! never parse "941 Mbit/s"; durations are seconds as `f64`.

use serde::{Deserialize, Serialize};

/// What is known about the network path before data flows (from `fatpipe
/// path` or the probe that precedes an auto-tuned test or copy).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathFacts {
    /// Round-trip time (seconds): the minimum seen, which excludes queueing.
    pub rtt_secs: f64,
    /// Bottleneck rate in bit/s; `None` when the probe could not estimate it.
    pub bottleneck_rate: Option<u64>,
    /// Packet loss probability in [0, 1] seen while probing.
    pub loss_rate: f64,
    /// Path MTU in bytes (IP packet size); 0 when unknown (1500 is assumed).
    pub mtu: u32,
    /// Probe packets `loss_rate` was counted over; 0 when unknown (a
    /// rate given as a flag, or a result from before this field). The
    /// planner sizes windows for the most loss so few packets cannot rule
    /// out.
    #[serde(default)]
    pub loss_packets: u64,
}

/// One end's limits on what a TCP socket may buffer and which congestion
/// controls it may pick; read from `/proc/sys` on Linux.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostLimits {
    /// `net.core.rmem_max`: the cap on `SO_RCVBUF` (bytes).
    pub rmem_max: u64,
    /// `net.core.wmem_max`: the cap on `SO_SNDBUF` (bytes).
    pub wmem_max: u64,
    /// `net.ipv4.tcp_rmem`: receive autotuning min, default, max (bytes).
    pub tcp_rmem: [u64; 3],
    /// `net.ipv4.tcp_wmem`: send autotuning min, default, max (bytes).
    pub tcp_wmem: [u64; 3],
    /// Congestion controls this process may select with `TCP_CONGESTION`
    /// (the allowed list, or every loaded one when privileged).
    pub congestion: Vec<String>,
    /// True when the process may use `SO_SNDBUFFORCE`/`SO_RCVBUFFORCE`
    /// (CAP_NET_ADMIN) and so exceed `rmem_max`/`wmem_max`.
    pub privileged: bool,
}

/// The most streams auto-tuning ever plans (`Policy::max_streams`'s
/// default): beyond it streams cost more in CPU and queueing than they
/// win. The host audit judges buffer caps against the same bound.
pub const MAX_PLANNED_STREAMS: u32 = 64;

/// What auto-tuning chose before data flows, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Number of parallel TCP streams.
    pub streams: u32,
    /// Bytes each stream's window should reach at both ends: the value for
    /// `SO_SNDBUF`/`SO_RCVBUF` when `set_buffers` is true (the kernel doubles
    /// it to cover its own overhead).
    pub per_stream_buffer: u64,
    /// False when kernel autotuning at both ends already reaches
    /// `per_stream_buffer`; autotuning is then better than a fixed buffer
    /// because it starts small and grows only as needed.
    pub set_buffers: bool,
    /// True when the buffers exceed the host caps and must be set with
    /// `SO_SNDBUFFORCE`/`SO_RCVBUFFORCE` (both ends privileged).
    pub forced_buffers: bool,
    /// Congestion control for every stream (`TCP_CONGESTION`).
    pub congestion: String,
    /// Per-stream pacing in bit/s (`SO_MAX_PACING_RATE` takes bytes/s);
    /// `None` leaves pacing to the congestion control.
    pub pacing_rate: Option<u64>,
    /// Bandwidth-delay product the plan was sized for (bytes); `None` when
    /// the rate was unknown.
    pub bdp: Option<u64>,
    /// One line saying what was chosen and why, for people.
    pub reason: String,
    /// How sure the probe was of the rate the plan started from; absent
    /// when no probe rate was planned from (unknown, or a given rate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<RateConfidence>,
    /// The rate (bit/s) the windows, streams and pacing were sized for when
    /// it is above the estimate: the largest rate the probe could not rule
    /// out (a rough estimate or a lower bound). Absent when the plan is
    /// sized for the estimate itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_rate: Option<u64>,
}

/// How sure a probe was of the bottleneck rate: its trains' spread and a
/// confidence, as the planner used them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RateConfidence {
    /// The estimate (bit/s): the median of the trains kept.
    pub rate: u64,
    /// The slowest train kept (bit/s).
    pub low: u64,
    /// The fastest train kept (bit/s).
    pub high: u64,
    /// 0 (no idea) to 1 (every train agreed tightly).
    pub confidence: f64,
    /// The confidence in a word: "high", "medium" or "low".
    pub label: String,
    /// True when the sender could not outpace the path: `rate` is then
    /// only a lower bound.
    pub lower_bound: bool,
}

/// What the pre-flight of an auto-tuned `test` or `copy` measured, what the
/// planner chose, and what was applied after explicit flags had their say.
/// Absent from a result when auto-tuning was off (`--no-auto`, UDP, or
/// every tunable part given as a flag).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AutoTune {
    /// What the short probe found (rate `None` when it gave no estimate).
    pub facts: PathFacts,
    /// The planner's choice for those facts and both ends' limits; its
    /// `reason` is the line printed on stderr.
    pub plan: Plan,
    /// Streams used.
    pub streams: u32,
    /// Socket buffer requested per stream (bytes); `None` leaves the
    /// kernel's autotuning in charge.
    pub buffer: Option<u64>,
    /// True when the buffer is requested with `SO_SNDBUFFORCE`/`SO_RCVBUFFORCE`.
    pub forced_buffers: bool,
    /// Congestion control requested; `None` keeps the host default.
    pub congestion: Option<String>,
    /// Pacing cap per stream in bit/s; `None` for none.
    pub pacing_rate: Option<u64>,
    /// Flags the user gave that replaced parts of the plan (e.g. "-P").
    #[serde(default)]
    pub overridden: Vec<String>,
    /// Seconds the probe took before data flowed.
    pub probe_secs: f64,
    /// The probe's sender could not outpace the path, so `facts`'
    /// bottleneck rate is only a lower bound (the in-flight adjuster then
    /// treats the rate as unknown).
    #[serde(default)]
    pub rate_lower_bound: bool,
    /// True when the in-flight adjuster ran; `decisions` holds its changes.
    pub adjusting: bool,
    /// Changes the in-flight adjuster made, in order.
    #[serde(default)]
    pub decisions: Vec<Decision>,
    /// What the pre-flight could not know or could not apply.
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// What the in-flight adjuster decided at one interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Action {
    /// Keep the current streams and congestion control.
    Hold,
    /// Open `n` more streams.
    AddStreams {
        /// How many streams to add.
        n: u32,
    },
    /// Switch every stream to another congestion control.
    SwitchCongestion {
        /// The congestion control to switch to (e.g. "bbr").
        to: String,
    },
}

/// One decision of the in-flight adjuster, as recorded in the JSON output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// Seconds since data started flowing.
    pub at_secs: f64,
    /// What to do.
    #[serde(flatten)]
    pub action: Action,
    /// Streams after the action is carried out.
    pub streams: u32,
    /// Why, in one line.
    pub reason: String,
}

impl Decision {
    /// True for decisions that change something; results record only these
    /// (a hold every interval would drown them).
    pub fn is_change(&self) -> bool {
        self.action != Action::Hold
    }
}

/// How much a finding of the host audit matters for the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// As recommended.
    Ok,
    /// Worth knowing; unlikely to limit the target.
    Info,
    /// Likely to cost throughput at the target rate × RTT.
    Warn,
    /// Will keep the host well below the target.
    Critical,
}

/// A value the audit read from the host, or why it could not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Observed {
    /// The value as read (normalised text, e.g. "4096 131072 33554432").
    Known(String),
    /// Why it could not be read; never replaced by a guess.
    Unknown(String),
}

impl Observed {
    /// The value, if it was read.
    pub fn known(&self) -> Option<&String> {
        match self {
            Observed::Known(v) => Some(v),
            Observed::Unknown(_) => None,
        }
    }
}

/// One line of the host audit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// Area: "buffers", "tcp", "nic", "cpu", "disk".
    pub area: String,
    /// What was checked, e.g. "net.core.rmem_max" or "eth0 mtu".
    pub item: String,
    /// The current value, or why it is unknown.
    pub current: Observed,
    /// The recommended value; `None` when nothing better can be said.
    pub recommended: Option<String>,
    /// Why, in one line.
    pub why: String,
    /// How much it matters.
    pub severity: Severity,
}

/// Sequential throughput of a directory's file system (`tune --disk DIR`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiskResult {
    /// The directory measured.
    pub dir: String,
    /// Bytes written and then read.
    pub bytes: u64,
    /// Write throughput in bit/s.
    pub write_rate: u64,
    /// Read throughput in bit/s.
    pub read_rate: u64,
    /// True when O_DIRECT bypassed the page cache; false when the file system
    /// refused it and the cache was flushed and dropped instead.
    pub direct_io: bool,
}

/// The whole report of `fatpipe tune --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Audit {
    /// Target rate in bit/s.
    pub target_rate: u64,
    /// Target round-trip time in seconds.
    pub target_rtt_secs: f64,
    /// Their bandwidth-delay product in bytes.
    pub bdp: u64,
    /// Every check, in a stable order.
    pub findings: Vec<Finding>,
    /// The disk measurement when `--disk` was given.
    pub disk: Option<DiskResult>,
    /// What auto-tuning would choose for the target with this host's
    /// limits at both ends (with `--for`, this host sending to the peer
    /// with the peer's limits); `None` when the limits could not be read.
    pub plan: Option<Plan>,
    /// Where the target's values came from (flags, their defaults, or a
    /// probe of a peer with `--for`). Absent in reports from before it
    /// existed.
    #[serde(default)]
    pub target: Option<AuditTarget>,
    /// The peer's limits as its probe service reported them, judged
    /// against the target (`--for` only; `None` otherwise).
    #[serde(default)]
    pub peer: Option<PeerAudit>,
}

/// Where the audit's target came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditTarget {
    /// `"probe"` when `--for HOST` probed a peer (parts may still come
    /// from flags: see `rate_source`, `rtt_source`); `"flags"` otherwise.
    pub source: TargetSource,
    /// Where `target_rate` came from: `"probe"`, `"flag"` (`--rate`) or
    /// `"default"` (the `--rate` default, 10 Gbit/s).
    pub rate_source: ValueSource,
    /// Where `target_rtt_secs` came from: `"probe"`, `"flag"` or `"default"`.
    pub rtt_source: ValueSource,
    /// The peer as the user wrote it (`--for`).
    pub peer: Option<String>,
    /// The address probed (`IP:PORT` of the control connection).
    pub remote: Option<String>,
    /// The probe's minimum RTT (seconds), also when `--rtt` replaced it.
    pub probed_rtt_secs: Option<f64>,
    /// The probe's bottleneck estimate (bit/s), also when it was not used.
    pub probed_rate: Option<u64>,
    /// True when that estimate is only a lower bound.
    #[serde(default)]
    pub rate_lower_bound: bool,
    /// The estimate's confidence, 0 to 1.
    pub rate_confidence: Option<f64>,
    /// Loss seen while probing, 0 to 1.
    pub loss_rate: Option<f64>,
    /// Path MTU found by the probe (bytes); `None` when unknown.
    pub mtu: Option<u32>,
    /// Seconds the probe took.
    pub probe_secs: Option<f64>,
    /// What the reader should know about the target, one line each (a
    /// rate that is only a lower bound, a default used instead).
    #[serde(default)]
    pub notes: Vec<String>,
}

/// How the audit's target as a whole was found ([`AuditTarget::source`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetSource {
    /// `--for HOST` probed a peer (`"probe"`).
    Probe,
    /// Only flags and their defaults (`"flags"`).
    Flags,
}

/// Where one target value came from ([`AuditTarget::rate_source`],
/// [`AuditTarget::rtt_source`]). Not [`TargetSource`]: a single value may
/// also be a default, and its flag is named in the singular.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueSource {
    /// Measured by the probe (`"probe"`).
    Probe,
    /// Given as a flag, which wins over the probe (`"flag"`).
    Flag,
    /// The flag's default (`"default"`).
    Default,
}

json_text!(Severity { Ok => "ok", Info => "info", Warn => "warn", Critical => "critical" });
json_text!(TargetSource { Probe => "probe", Flags => "flags" });
json_text!(ValueSource { Probe => "probe", Flag => "flag", Default => "default" });

/// The peer's side of `fatpipe tune --for HOST`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerAudit {
    /// The peer as the user wrote it.
    pub server: String,
    /// The address probed.
    pub remote: String,
    /// One finding per limit (area `"peer"`); a limit the peer could not
    /// report is `unknown` with its reason.
    pub findings: Vec<Finding>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::pins;

    #[test]
    fn severity_json_text() {
        pins(Severity::Ok, "ok");
        pins(Severity::Info, "info");
        pins(Severity::Warn, "warn");
        pins(Severity::Critical, "critical");
    }

    #[test]
    fn target_source_json_text() {
        pins(TargetSource::Probe, "probe");
        pins(TargetSource::Flags, "flags");
    }

    #[test]
    fn value_source_json_text() {
        pins(ValueSource::Probe, "probe");
        pins(ValueSource::Flag, "flag");
        pins(ValueSource::Default, "default");
    }
}
