//! The result of `fatpipe path`: what `--json` prints and the archive stores.
//!
//! One [`PathReport`] per probe: round-trip statistics, the path MTU, the
//! bottleneck estimate with its confidence, the loss seen, the BDP and the
//! window one stream would need, and the auto-tuning plan those facts lead
//! to. The [`PathFacts`] the planner was given are included as they are, so
//! a reader can rerun the planner with other host limits.
//!
//! Rates are bit/s and sizes bytes as plain integers; durations are seconds
//! as `f64`. Documented field by field in docs/json-schema.md. Bump
//! [`PATH_SCHEMA_VERSION`] on any change that breaks a reader; adding an
//! optional field does not.

use serde::{Deserialize, Serialize};

use crate::tune::{PathFacts, Plan};

/// Names this schema in every report.
pub const PATH_SCHEMA: &str = "fatpipe.path";
/// The schema's version.
pub const PATH_SCHEMA_VERSION: u32 = 1;

/// A whole probe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathReport {
    /// Always [`PATH_SCHEMA`].
    pub schema: String,
    /// Always [`PATH_SCHEMA_VERSION`] for this layout.
    pub version: u32,
    /// The server as the user wrote it.
    pub server: String,
    /// The address probed (`IP:PORT` of the control connection).
    pub remote: String,
    /// True when the trains ran server → client (`fatpipe path
    /// --reverse`): `bottleneck` and the train counts in `loss` describe
    /// that direction. Absent (false) in reports from before it existed.
    #[serde(default)]
    pub reverse: bool,
    /// Round-trip times of UDP echoes.
    pub rtt: RttReport,
    /// Path MTU.
    pub mtu: MtuReport,
    /// Bottleneck rate from packet trains; `None` when no train gave one.
    pub bottleneck: Option<BottleneckReport>,
    /// Packets lost while probing.
    pub loss: LossReport,
    /// Bandwidth-delay product (bytes) from the bottleneck estimate and the
    /// minimum RTT; `None` without an estimate.
    pub bdp: Option<u64>,
    /// Window (bytes in flight) one TCP stream needs to fill the path: the
    /// BDP.
    pub single_stream_window: Option<u64>,
    /// Socket buffer limit (`tcp_rmem[2]`/`tcp_wmem[2]`) at both ends that
    /// lets kernel autotuning reach that window: about twice the window,
    /// since roughly half of a socket's buffer is window.
    pub single_stream_buffer: Option<u64>,
    /// What the planner was given.
    pub facts: PathFacts,
    /// What auto-tuning would choose for a test from this host to the
    /// server (with `reverse`, from the server to this host); `None` when
    /// neither end's host limits could be read.
    pub plan: Option<Plan>,
    /// Things the reader should know (a lower-bound estimate, a guessed
    /// limit, a missing capability), one line each.
    pub warnings: Vec<String>,
    /// Seconds the probe took.
    pub duration_secs: f64,
}

/// Round-trip statistics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RttReport {
    /// Echoes sent.
    pub sent: u32,
    /// Echoes answered.
    pub received: u32,
    /// Smallest RTT (seconds): the path without queueing.
    pub min_secs: f64,
    /// Mean RTT (seconds).
    pub avg_secs: f64,
    /// Largest RTT (seconds).
    pub max_secs: f64,
    /// Population standard deviation (seconds), like ping's mdev.
    pub stddev_secs: f64,
}

/// Path MTU: the largest IP packet that passed with Don't Fragment set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MtuReport {
    /// Largest IP packet size (bytes) echoed by the server; `None` when no
    /// probe passed or probing was impossible.
    pub path_mtu: Option<u32>,
    /// MTU of the local route toward the server (the upper bound searched).
    pub route_mtu: Option<u32>,
    /// Why `route_mtu` is unknown.
    pub route_mtu_error: Option<String>,
    /// Probes sent by the search.
    pub probes: u32,
}

/// The bottleneck estimate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BottleneckReport {
    /// Estimated rate in bit/s of IP packets (the median of the trains kept).
    pub rate: u64,
    /// Smallest estimate among the trains kept (bit/s).
    pub low: u64,
    /// Largest estimate among the trains kept (bit/s).
    pub high: u64,
    /// 0 (no idea) to 1 (every train agrees).
    pub confidence: f64,
    /// `high` (≥ 0.75), `medium` (≥ 0.4) or `low`.
    pub confidence_label: String,
    /// True when the sender could not outpace the path: `rate` is then only
    /// a lower bound.
    pub lower_bound: bool,
    /// Trains sent.
    pub trains: u32,
    /// Trains whose estimate was kept.
    pub used: u32,
    /// Trains dropped as outliers.
    pub outliers: u32,
    /// Trains that gave no estimate.
    pub rejected: u32,
    /// IP size of each train packet (bytes).
    pub packet_bytes: u32,
    /// Packets per train.
    pub packets_per_train: u32,
    /// True when the receiver timed every packet in the kernel
    /// (`SO_TIMESTAMPNS`); false when in user space (less precise).
    pub kernel_timestamps: bool,
}

/// Loss seen while probing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LossReport {
    /// Echoes sent.
    pub echo_sent: u64,
    /// Echoes not answered in time.
    pub echo_lost: u64,
    /// Train packets sent.
    pub train_sent: u64,
    /// Train packets that did not arrive. Trains are sent at full speed, so
    /// this includes drops at a bottleneck queue shorter than a train.
    pub train_lost: u64,
    /// `(echo_lost + train_lost) / (echo_sent + train_sent)`.
    pub rate: f64,
}
