//! The result of `fatpipe copy`: what `--json` prints and the archive stores.
//!
//! One [`CopyReport`] per run, written when the copy ends (successfully or
//! with per-file failures). Counts are of regular files; directories and
//! symlinks are created but not counted. `bytes_transferred` is what moved
//! in this run (a resumed copy moves only what was missing), and `rate` is
//! that over the whole run's wall-clock time, in bits per second.
//!
//! Documented field by field in docs/json-schema.md ("copy"). Bump
//! [`COPY_SCHEMA_VERSION`] on any change that breaks a reader; adding an
//! optional field does not.

use serde::{Deserialize, Serialize};

/// Names this schema in every report.
pub const COPY_SCHEMA: &str = "fatpipe.copy";
/// The schema's version.
pub const COPY_SCHEMA_VERSION: u32 = 1;

/// Which way the files went, seen from the client.
///
/// The copy protocol has its own push/pull (`fatpipe_transfer::wire::Direction`,
/// a byte on the wire of a crate that depends on no result types); this is
/// the report's JSON text, `"push"` or `"pull"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CopyDirection {
    /// Client to server.
    Push,
    /// Server to client.
    Pull,
}

/// A whole copy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CopyReport {
    /// Always [`COPY_SCHEMA`].
    pub schema: String,
    /// Always [`COPY_SCHEMA_VERSION`] for this layout.
    pub version: u32,
    /// Push or pull.
    pub direction: CopyDirection,
    /// The server, as `host:port`.
    pub server: String,
    /// The export used.
    pub export: String,
    /// Sources as given.
    pub sources: Vec<String>,
    /// Destination as given.
    pub destination: String,
    /// Data connections used.
    pub streams: u32,
    /// Chunk size, bytes.
    pub chunk_size: u64,
    /// Per-chunk checksum: `xxh3-128` or `blake3`.
    pub checksum: String,
    /// `--sync` was in force.
    pub sync: bool,
    /// `--direct` was in force.
    pub direct: bool,
    /// `--bwlimit` in bit/s, if any.
    pub bwlimit: Option<u64>,
    /// Regular files in the source tree.
    pub files_total: u64,
    /// Files written and verified chunk by chunk in this run.
    pub files_verified: u64,
    /// Files already complete at the destination (same size and mtime).
    pub files_skipped: u64,
    /// Files that could not be copied (see `failures`).
    pub files_failed: u64,
    /// Bytes of regular files in the source tree.
    pub bytes_total: u64,
    /// Payload bytes moved and verified in this run.
    pub bytes_transferred: u64,
    /// Chunks that failed their checksum on arrival and were sent again.
    pub chunks_resent: u64,
    /// Times the client reconnected after a dropped session.
    pub reconnects: u32,
    /// Wall-clock seconds of the whole run.
    pub seconds: f64,
    /// `bytes_transferred` over `seconds`, in bit/s.
    pub rate: u64,
    /// Files verified per second.
    pub files_per_sec: f64,
    /// How this end read or wrote (e.g. `pread+sendfile`, `pwrite`).
    pub io_local: String,
    /// How the server read or wrote.
    pub io_remote: String,
    /// Peak resident memory of the client process, bytes.
    pub peak_rss_local: u64,
    /// One entry per failed file.
    pub failures: Vec<CopyFailure>,
    /// Source objects not copied because of an error while walking
    /// (unreadable or unlistable), as `path: error`; the copy exits 1.
    pub problems: Vec<String>,
    /// Source objects not copied by policy: FIFOs, sockets and devices
    /// (`detail` says which). Either direction; the copy exits 0.
    #[serde(default)]
    pub skipped: Vec<CopyNote>,
    /// Files that were hard links of a file listed before them (`detail`):
    /// each arrived as a separate file with its own copy of the data.
    #[serde(default)]
    pub hard_links: Vec<CopyNote>,
    /// Notes beyond the 10,000 a sender lists (counted, not named).
    #[serde(default)]
    pub notes_not_listed: u64,
    /// What auto-tuning probed, planned and applied; absent when it was
    /// off (`--no-auto`, `-P` given, or the probe failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto: Option<crate::tune::AutoTune>,
    /// Where the command's seconds went before and while data flowed.
    /// Absent in documents from before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<CopyTimeline>,
    /// What encrypted the copy's connections (`--encrypt`); null when
    /// they were not (and in documents from before it existed).
    #[serde(default)]
    pub encryption: Option<crate::Encryption>,
}

/// The copy's start-up timeline: every time in seconds since the command
/// started, `None` when that step did not happen or this end cannot see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct CopyTimeline {
    /// Wall-clock seconds of the whole command, pre-flight, set-up and
    /// verification included.
    pub wall_secs: f64,
    /// When the pre-flight had its plan (it starts at 0, beside the
    /// connection set-up).
    pub plan_at: Option<f64>,
    /// Seconds the pre-flight's probe took.
    pub probe_secs: Option<f64>,
    /// The control connection was open: connected, authenticated, service
    /// named.
    pub connected_at: Option<f64>,
    /// The request went out (after the plan, which it carries).
    pub request_at: Option<f64>,
    /// The server accepted the request.
    pub accepted_at: Option<f64>,
    /// Every data connection asked for was open (data flows on each as it
    /// opens, so this may come after `first_byte_sent_at`); `None` when
    /// the data was all moved before the last one opened.
    pub data_open_at: Option<f64>,
    /// Push: this end began writing its first chunk to a data socket.
    pub first_byte_sent_at: Option<f64>,
    /// Pull: the first chunk was verified and on this end's disk (a push's
    /// server writes; the wire does not report when).
    pub first_byte_on_disk_at: Option<f64>,
    /// Seconds from the first byte until the rate over one second reached
    /// 90 % of `final_rate`; `None` for a copy under two seconds of data.
    pub ramp_secs: Option<f64>,
    /// The rate of the data's second half (bit/s), what the ramp is
    /// measured against.
    pub final_rate: Option<u64>,
    /// Push: when a data stream first found no chunk left to send; from
    /// then on streams run dry one by one and drain their windows, so the
    /// path runs below its rate until `done_at` (the sender is the server
    /// on a pull, and the wire does not report it).
    pub first_stream_idle_at: Option<f64>,
    /// When the last payload byte moved (sent, or verified on disk).
    pub last_byte_at: Option<f64>,
    /// When the session ended with every file verified or failed.
    pub done_at: Option<f64>,
    /// When each of the in-flight adjuster's changes was made.
    pub adjust_at: Vec<f64>,
    /// Bytes moved so far, sampled while data flowed: `[seconds since the
    /// command started, bytes]` pairs in time order, at most
    /// [`PROGRESS_SAMPLES_MAX`] (every 100 ms, thinned evenly for a long
    /// copy), so a plot can show the copy over time. Empty in documents
    /// from before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub progress: Vec<(f64, u64)>,
}

/// The most progress samples a [`CopyTimeline`] keeps: a point per pixel
/// of a plot's width, and a few tens of kilobytes of JSON at most.
pub const PROGRESS_SAMPLES_MAX: usize = 1000;

/// One object the copy skipped or changed, and how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyNote {
    /// Path relative to the destination, as the sender named it.
    pub path: String,
    /// Skipped: what the object is (`FIFO`, `socket`, `device`); hard
    /// link: the path of the file it is linked with.
    pub detail: String,
}

/// A file that could not be copied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyFailure {
    /// Path relative to the destination.
    pub path: String,
    /// What went wrong, and what to do.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direction_is_lowercase_and_round_trips() {
        assert_eq!(
            serde_json::to_string(&CopyDirection::Pull).unwrap(),
            "\"pull\""
        );
        let f = CopyFailure {
            path: "a/b".into(),
            message: "no space left on device".into(),
        };
        let back: CopyFailure = serde_json::from_str(&serde_json::to_string(&f).unwrap()).unwrap();
        assert_eq!(back, f);
    }
}
