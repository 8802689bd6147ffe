//! What the archive stores: one [`Run`] per measurement, and dated
//! [`Annotation`]s on paths.
//!
//! A run is the command's full result document (`fatpipe.test`,
//! `fatpipe.copy` or `fatpipe.path`, kept verbatim as [`Document`]) plus the
//! facts that explain it and are not in it: which host ran it ([`HostFacts`]),
//! against which peer, over which path, for which sweep cell, and for lab
//! runs the emulated link. The few figures that queries and statistics need
//! ([`Metrics`]) are copied out of the document into columns when the run is
//! built ([`Run::from_test`], [`Run::from_copy`], [`Run::from_path`]), so a
//! report over 100,000 runs never parses 100,000 documents.
//!
//! Every run has a random UUID made when it is built. Row ids belong to one
//! archive; the UUID follows the run through export and import, which is how
//! an import recognises a run it already holds.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeZone, Utc};
use fatpipe_schema::copy::{CopyReport, COPY_SCHEMA, COPY_SCHEMA_VERSION};
use fatpipe_schema::path::{PathReport, PATH_SCHEMA, PATH_SCHEMA_VERSION};
use fatpipe_schema::test::{
    FindMaxLength, FindMaxReport, StreamStats, TestDirection, TestReport, FIND_MAX_SCHEMA,
    FIND_MAX_SCHEMA_VERSION, TEST_SCHEMA, TEST_SCHEMA_VERSION,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::error::{ArchiveError, Result};

/// Which command produced a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunKind {
    /// `fatpipe test`: memory-to-memory throughput.
    Test,
    /// `fatpipe copy`: a bulk transfer.
    Copy,
    /// `fatpipe path`: a path probe.
    Path,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// It measured what it set out to.
    Ok,
    /// It failed; the one-line error the command printed.
    Failed(String),
}

/// Where a run sits in a sweep: which sweep, which cell of its parameter
/// matrix, which repetition of that cell. Resume asks for these triples.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SweepRef {
    /// The sweep's id or name, unique in the archive.
    pub sweep: String,
    /// The cell's key: a stable string, e.g. [`cell_key`] of its parameters.
    pub cell: String,
    /// Repetition number within the cell, from 0.
    pub repetition: u32,
}

/// The host a run was measured from: what explains a result that the
/// result document does not say. The CLI fills it; every field defaults so
/// that documents from older builds (or other tools) still load.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HostFacts {
    /// Host name.
    pub hostname: String,
    /// Operating system (`linux`, `freebsd`, `macos`).
    pub os: String,
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// fatpipe's version (`CARGO_PKG_VERSION`, plus a git hash if known).
    pub fatpipe_version: String,
    /// CPU model name.
    pub cpu_model: String,
    /// Logical CPUs.
    pub cpu_count: u32,
    /// The sysctls that decide throughput (`net.core.rmem_max`,
    /// `net.ipv4.tcp_congestion_control`, ...), name to value as read.
    pub sysctls: BTreeMap<String, String>,
    /// Network interfaces, the one carrying the run first.
    pub nics: Vec<NicFacts>,
}

/// One network interface.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NicFacts {
    /// Interface name (`eth0`).
    pub name: String,
    /// Driver (`ethtool -i`), if known.
    pub driver: Option<String>,
    /// Link speed in Mbit/s, if known.
    pub speed_mbps: Option<u64>,
    /// MTU in bytes.
    pub mtu: Option<u32>,
}

/// The figures queries and statistics use, copied out of the result
/// document. `None` where the command does not measure it (retransmits in
/// UDP, CPU in copy) or the run failed before measuring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Metrics {
    /// Throughput, bit/s (test: the receivers', summed over directions;
    /// copy: `rate`; path: the bottleneck estimate).
    pub throughput_bps: Option<f64>,
    /// TCP segments retransmitted, summed over directions.
    pub retransmits: Option<u64>,
    /// Smallest RTT seen, microseconds.
    pub rtt_min_us: Option<f64>,
    /// Mean RTT, microseconds.
    pub rtt_avg_us: Option<f64>,
    /// Largest RTT seen, microseconds.
    pub rtt_max_us: Option<f64>,
    /// Population standard deviation of the RTT samples, microseconds.
    pub rtt_std_us: Option<f64>,
    /// UDP (test) or probe (path) loss, percent.
    pub loss_percent: Option<f64>,
    /// UDP jitter (RFC 3550), milliseconds.
    pub jitter_ms: Option<f64>,
    /// CPU of this end's process, percent of one core.
    pub cpu_local_percent: Option<f64>,
    /// CPU of the peer's process, percent of one core.
    pub cpu_remote_percent: Option<f64>,
    /// Bytes moved (test: received, summed over directions; copy:
    /// transferred this run).
    pub bytes: Option<u64>,
}

/// A result document kept verbatim: the JSON text exactly as the command
/// printed it (line breaks, which JSON allows only between tokens, are
/// turned into spaces so a run fits on one line of an export).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Document(Box<RawValue>);

/// One stored (or to-be-stored) run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// Row id in this archive; `None` until stored. Not carried by import.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<i64>,
    /// Stable identity across archives.
    pub uuid: Uuid,
    /// Which command.
    pub kind: RunKind,
    /// When it started (UTC; the archive keeps microseconds).
    pub started: DateTime<Utc>,
    /// When it finished.
    pub finished: DateTime<Utc>,
    /// Ok, or failed with its error line.
    pub status: RunStatus,
    /// Its place in a sweep, if it belongs to one.
    #[serde(default)]
    pub sweep: Option<SweepRef>,
    /// The path measured: a stable key such as `dtn1→dtn2` or a lab link's
    /// name. Annotations attach to it.
    pub path: String,
    /// The peer as given on the command line.
    #[serde(default)]
    pub peer: Option<String>,
    /// The measuring host.
    pub host: HostFacts,
    /// For lab runs, the emulated link's spec.
    #[serde(default)]
    pub link: Option<serde_json::Value>,
    /// The query columns.
    #[serde(default)]
    pub metrics: Metrics,
    /// The full result document; `None` for a run that failed before it
    /// had one.
    #[serde(default)]
    pub document: Option<Document>,
}

/// The columns of a run that statistics need, without the JSON: what
/// [`crate::Store::measurements`] returns, cheap to read by the 100,000.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// Row id.
    pub id: i64,
    /// Which command.
    pub kind: RunKind,
    /// When it started.
    pub started: DateTime<Utc>,
    /// Whether it succeeded.
    pub ok: bool,
    /// Its place in a sweep.
    pub sweep: Option<SweepRef>,
    /// The path key.
    pub path: String,
    /// The figures.
    pub metrics: Metrics,
}

/// A dated note on a path, e.g. "link upgraded to 622 Mbit/s". Runs are
/// selected before or after one with [`crate::RunFilter::before`] and
/// [`crate::RunFilter::after`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Annotation {
    /// Row id in this archive; `None` until stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<i64>,
    /// The path key it is about.
    pub path: String,
    /// When the noted change happened (UTC, microseconds kept).
    pub at: DateTime<Utc>,
    /// The note.
    pub note: String,
}

impl RunKind {
    /// The name stored in the database and printed: `test`, `copy`, `path`.
    pub fn as_str(self) -> &'static str {
        match self {
            RunKind::Test => "test",
            RunKind::Copy => "copy",
            RunKind::Path => "path",
        }
    }

    /// The kind named `s`, if any.
    pub fn parse(s: &str) -> Option<RunKind> {
        match s {
            "test" => Some(RunKind::Test),
            "copy" => Some(RunKind::Copy),
            "path" => Some(RunKind::Path),
            _ => None,
        }
    }
}

impl RunStatus {
    /// True for [`RunStatus::Ok`].
    pub fn is_ok(&self) -> bool {
        matches!(self, RunStatus::Ok)
    }

    /// The error line of a failed run.
    pub fn error(&self) -> Option<&str> {
        match self {
            RunStatus::Ok => None,
            RunStatus::Failed(e) => Some(e),
        }
    }
}

impl Document {
    /// Keeps `text` as the document; it must be one JSON value.
    pub fn from_json(text: impl Into<String>) -> Result<Document> {
        let mut text = text.into();
        if text.contains(['\n', '\r']) {
            // Outside strings (where they are escaped) line breaks are only
            // whitespace, so this changes no value.
            text = text.replace(['\n', '\r'], " ");
        }
        RawValue::from_string(text)
            .map(Document)
            .map_err(|e| ArchiveError::Document(format!("not JSON: {e}")))
    }

    /// Serialises `value` as the document.
    pub fn from_value<T: Serialize>(value: &T) -> Result<Document> {
        serde_json::value::to_raw_value(value)
            .map(Document)
            .map_err(|source| ArchiveError::Encode {
                what: "result document",
                source,
            })
    }

    /// The JSON text.
    pub fn as_str(&self) -> &str {
        self.0.get()
    }

    /// Reads the document as `T` (e.g. [`TestReport`]).
    pub fn parse<T: DeserializeOwned>(&self) -> serde_json::Result<T> {
        serde_json::from_str(self.0.get())
    }
}

impl PartialEq for Document {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Run {
    /// A successful run of `kind` on `path` with no figures or document
    /// yet; times are truncated to the microseconds the archive keeps.
    pub fn new(
        kind: RunKind,
        path: impl Into<String>,
        host: HostFacts,
        started: DateTime<Utc>,
        finished: DateTime<Utc>,
    ) -> Run {
        Run {
            id: None,
            uuid: Uuid::new_v4(),
            kind,
            started: to_micros(started),
            finished: to_micros(finished),
            status: RunStatus::Ok,
            sweep: None,
            path: path.into(),
            peer: None,
            host,
            link: None,
            metrics: Metrics::default(),
            document: None,
        }
    }

    /// A run that failed with `error` (one line) before it had a result.
    pub fn failed(
        kind: RunKind,
        path: impl Into<String>,
        host: HostFacts,
        started: DateTime<Utc>,
        finished: DateTime<Utc>,
        error: impl Into<String>,
    ) -> Run {
        let mut run = Run::new(kind, path, host, started, finished);
        run.status = RunStatus::Failed(error.into());
        run
    }

    /// A `fatpipe test` run: started at the report's timestamp, the peer
    /// is its server, the figures come from its totals (see [`Metrics`];
    /// RTT statistics are over each stream's smoothed RTT at the end of
    /// every measured interval, or at the end when there are none).
    pub fn from_test(
        report: &TestReport,
        path: impl Into<String>,
        host: HostFacts,
        finished: DateTime<Utc>,
    ) -> Result<Run> {
        check_schema(
            &report.schema,
            report.version,
            TEST_SCHEMA,
            TEST_SCHEMA_VERSION,
        )?;
        let started = from_unix_secs(report.start.timestamp).unwrap_or(finished);
        let mut run = Run::new(RunKind::Test, path, host, started, finished);
        run.peer = Some(report.start.server.clone());
        run.metrics = test_metrics(report);
        run.document = Some(Document::from_value(report)?);
        Ok(run)
    }

    /// A `fatpipe test -u --find-max` run, stored as one test run per
    /// datagram length searched, in the report's order, so a report can
    /// set the loss-free rate against the length. Each run's document is
    /// the report narrowed to its length (the same `fatpipe.test.find_max`
    /// schema, with one entry in `lengths`); its throughput is that
    /// length's loss-free rate (UDP payload), absent when no rate was
    /// loss-free; its loss and bytes are the last confirming trial's. A
    /// sweep (one length per cell) files its one run under its cell;
    /// `test --archive` files each under [`find_max_cell`].
    pub fn from_find_max(
        report: &FindMaxReport,
        path: impl Into<String>,
        host: HostFacts,
        finished: DateTime<Utc>,
    ) -> Result<Vec<Run>> {
        check_schema(
            &report.schema,
            report.version,
            FIND_MAX_SCHEMA,
            FIND_MAX_SCHEMA_VERSION,
        )?;
        let started = from_unix_secs(report.timestamp).unwrap_or(finished);
        let path = path.into();
        report
            .lengths
            .iter()
            .map(|l| {
                let mut run =
                    Run::new(RunKind::Test, path.clone(), host.clone(), started, finished);
                run.peer = Some(report.server.clone());
                let confirm = l.trials.iter().rev().find(|t| t.confirm);
                run.metrics = Metrics {
                    throughput_bps: l.loss_free.map(|p| p.payload_bps),
                    loss_percent: confirm.map(|t| t.loss_percent),
                    // Counted, not rebuilt from a rate and a time.
                    bytes: confirm
                        .map(|t| t.packets_sent.saturating_sub(t.lost) * u64::from(l.length)),
                    ..Metrics::default()
                };
                let one = FindMaxReport {
                    lengths: vec![l.clone()],
                    ..report.clone()
                };
                run.document = Some(Document::from_value(&one)?);
                Ok(run)
            })
            .collect()
    }

    /// A `fatpipe copy` run: started `seconds` before `finished`, failed
    /// when any file failed (the error line says how many, and the first).
    pub fn from_copy(
        report: &CopyReport,
        path: impl Into<String>,
        host: HostFacts,
        finished: DateTime<Utc>,
    ) -> Result<Run> {
        check_schema(
            &report.schema,
            report.version,
            COPY_SCHEMA,
            COPY_SCHEMA_VERSION,
        )?;
        let started = before(finished, report.seconds);
        let mut run = Run::new(RunKind::Copy, path, host, started, finished);
        run.peer = Some(report.server.clone());
        if report.files_failed > 0 {
            let first = report
                .failures
                .first()
                .map(|f| format!(": first {}: {}", f.path, f.message))
                .unwrap_or_default();
            run.status = RunStatus::Failed(format!(
                "{} of {} files failed{first}",
                report.files_failed, report.files_total
            ));
        }
        run.metrics = Metrics {
            throughput_bps: Some(report.rate as f64),
            bytes: Some(report.bytes_transferred),
            ..Metrics::default()
        };
        run.document = Some(Document::from_value(report)?);
        Ok(run)
    }

    /// A `fatpipe path` run: started `duration_secs` before `finished`;
    /// throughput is the bottleneck estimate, RTT the echoes' statistics,
    /// loss all probe packets lost.
    pub fn from_path(
        report: &PathReport,
        path: impl Into<String>,
        host: HostFacts,
        finished: DateTime<Utc>,
    ) -> Result<Run> {
        check_schema(
            &report.schema,
            report.version,
            PATH_SCHEMA,
            PATH_SCHEMA_VERSION,
        )?;
        let started = before(finished, report.duration_secs);
        let mut run = Run::new(RunKind::Path, path, host, started, finished);
        run.peer = Some(report.server.clone());
        let rtt = &report.rtt;
        let answered = rtt.received > 0;
        let us = |secs: f64| answered.then_some(secs * 1e6);
        run.metrics = Metrics {
            throughput_bps: report.bottleneck.as_ref().map(|b| b.rate as f64),
            rtt_min_us: us(rtt.min_secs),
            rtt_avg_us: us(rtt.avg_secs),
            rtt_max_us: us(rtt.max_secs),
            rtt_std_us: us(rtt.stddev_secs),
            loss_percent: Some(report.loss.rate * 100.0),
            ..Metrics::default()
        };
        run.document = Some(Document::from_value(report)?);
        Ok(run)
    }

    /// Places the run in a sweep.
    pub fn with_sweep(
        mut self,
        sweep: impl Into<String>,
        cell: impl Into<String>,
        repetition: u32,
    ) -> Run {
        self.sweep = Some(SweepRef {
            sweep: sweep.into(),
            cell: cell.into(),
            repetition,
        });
        self
    }

    /// Records the peer as given.
    pub fn with_peer(mut self, peer: impl Into<String>) -> Run {
        self.peer = Some(peer.into());
        self
    }

    /// Records a lab run's link spec.
    pub fn with_link(mut self, link: serde_json::Value) -> Run {
        self.link = Some(link);
        self
    }
}

impl Annotation {
    /// A note on `path` dated `at` (truncated to microseconds).
    pub fn new(path: impl Into<String>, at: DateTime<Utc>, note: impl Into<String>) -> Annotation {
        Annotation {
            id: None,
            path: path.into(),
            at: to_micros(at),
            note: note.into(),
        }
    }
}

/// A stable key for a sweep cell from its parameters: their JSON with
/// object keys sorted at every level, so the same parameters give the same
/// key whatever order they were written in.
pub fn cell_key(params: &serde_json::Value) -> String {
    canonical(params).to_string()
}

/// The sweep name under which `test --archive` files the runs of a
/// find-max search (one cell per length; see [`find_max_cell`]), as
/// `demo` files its steps under `demo`.
pub const FIND_MAX_SWEEP: &str = "find-max";

/// The cell key of one length of a find-max search stored outside a
/// sweep: the parameters a sweep would give such a cell (`protocol`,
/// `find_max`, `length`, `no_batch`, and `direction` when reversed), so
/// `fatpipe report` groups and plots these runs by length as it does a
/// sweep's.
pub fn find_max_cell(report: &FindMaxReport, length: &FindMaxLength) -> String {
    let mut params = serde_json::json!({
        "protocol": "udp",
        "find_max": true,
        "length": length.length,
        "no_batch": length.send_path == "plain",
    });
    if report.direction == TestDirection::Down {
        params["direction"] = "down".into();
    }
    cell_key(&params)
}

/// `t` truncated to whole microseconds, the archive's resolution.
pub fn to_micros(t: DateTime<Utc>) -> DateTime<Utc> {
    from_micros(t.timestamp_micros()).unwrap_or(t)
}

/// The instant `us` microseconds after the Unix epoch, if representable.
pub fn from_micros(us: i64) -> Option<DateTime<Utc>> {
    Utc.timestamp_micros(us).single()
}

fn canonical(v: &serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            // Inserting in sorted order gives sorted output also when
            // serde_json's `preserve_order` is on somewhere in the build.
            let mut out = serde_json::Map::new();
            for k in keys {
                out.insert(k.clone(), canonical(&map[k]));
            }
            serde_json::Value::Object(out)
        }
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.iter().map(canonical).collect())
        }
        other => other.clone(),
    }
}

fn check_schema(name: &str, version: u32, want: &str, want_version: u32) -> Result<()> {
    if name != want || version != want_version {
        return Err(ArchiveError::Document(format!(
            "is {name} version {version}, expected {want} version {want_version}"
        )));
    }
    Ok(())
}

fn from_unix_secs(secs: f64) -> Option<DateTime<Utc>> {
    if !secs.is_finite() {
        return None;
    }
    from_micros((secs * 1e6).round() as i64)
}

fn before(t: DateTime<Utc>, secs: f64) -> DateTime<Utc> {
    if !secs.is_finite() || secs < 0.0 {
        return t;
    }
    let us = (secs * 1e6).round() as i64;
    t.checked_sub_signed(chrono::TimeDelta::microseconds(us))
        .unwrap_or(t)
}

fn test_metrics(report: &TestReport) -> Metrics {
    let sums = &report.end.sums;
    let opt_sum = |f: fn(&StreamStats) -> Option<u64>| -> Option<u64> {
        sums.iter().filter_map(f).reduce(|a, b| a.saturating_add(b))
    };
    let mean = |values: Vec<f64>| -> Option<f64> {
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    };

    // RTT samples: each stream's smoothed RTT at each measured interval's
    // end shows how the RTT moved during the run; the end's are the
    // fallback for a run without intervals.
    let mut rtts: Vec<f64> = report
        .intervals
        .iter()
        .filter(|i| !i.omitted)
        .flat_map(|i| i.streams.iter().filter_map(|s| s.rtt_us))
        .map(f64::from)
        .collect();
    if rtts.is_empty() {
        rtts = report
            .end
            .streams
            .iter()
            .filter_map(|s| s.rtt_us)
            .map(f64::from)
            .collect();
    }
    let (rtt_min_us, rtt_avg_us, rtt_max_us, rtt_std_us) = match crate::stats::population(&rtts) {
        Some((min, mean, max, std)) => (Some(min), Some(mean), Some(max), Some(std)),
        None => (None, None, None, None),
    };

    // Loss over all directions from the counts; the percentages are the
    // fallback when a sum lacks them.
    let lost = opt_sum(|s| s.lost);
    let sent = opt_sum(|s| s.packets_sent);
    let loss_percent = match (lost, sent) {
        (Some(lost), Some(sent)) if sent > 0 => Some(lost as f64 * 100.0 / sent as f64),
        _ => mean(sums.iter().filter_map(|s| s.lost_percent).collect()),
    };

    Metrics {
        throughput_bps: (!sums.is_empty()).then(|| sums.iter().map(|s| s.bits_per_second).sum()),
        retransmits: opt_sum(|s| s.retransmits),
        rtt_min_us,
        rtt_avg_us,
        rtt_max_us,
        rtt_std_us,
        loss_percent,
        jitter_ms: mean(sums.iter().filter_map(|s| s.jitter_ms).collect()),
        cpu_local_percent: Some(report.end.cpu_local.total_percent),
        cpu_remote_percent: Some(report.end.cpu_remote.total_percent),
        bytes: (!sums.is_empty()).then(|| sums.iter().map(|s| s.bytes).sum()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cell_key_ignores_key_order() {
        let a = serde_json::json!({"streams": 4, "window": "8M", "cc": {"b": 1, "a": 2}});
        let b = serde_json::json!({"cc": {"a": 2, "b": 1}, "window": "8M", "streams": 4});
        assert_eq!(cell_key(&a), cell_key(&b));
        assert_eq!(
            cell_key(&a),
            r#"{"cc":{"a":2,"b":1},"streams":4,"window":"8M"}"#
        );
    }

    #[test]
    fn document_is_kept_verbatim_on_one_line() {
        let d = Document::from_json("{\"b\": 1.50,\n  \"a\": \"x\\ny\"}").unwrap();
        assert_eq!(d.as_str(), "{\"b\": 1.50,   \"a\": \"x\\ny\"}");
        assert!(Document::from_json("{not json").is_err());
    }

    #[test]
    fn a_find_max_run_of_several_lengths_stores_each_length_as_its_own_run() {
        use fatpipe_schema::test::{FindMaxLength, FindMaxTrial, RatePoint};
        let point = |bps: f64| RatePoint {
            payload_bps: bps,
            wire_bps: bps * 1.05,
            packets_per_second: bps / 8000.0,
        };
        let length = |len: u32, free: Option<f64>, sent: u64, path: &str| FindMaxLength {
            length: len,
            loss_free: free.map(point),
            confirmed: free.is_some(),
            with_loss: free.map(point),
            lower_bound: false,
            sender_max: point(5e9),
            trial_count: 1,
            trials: vec![FindMaxTrial {
                requested_bps: Some(1e8),
                offered: point(1e8),
                received: point(1e8),
                packets_sent: sent,
                lost: 10,
                loss_percent: 10.0 / sent as f64 * 100.0,
                seconds: 10.0,
                confirm: true,
            }],
            send_path: path.into(),
            recv_path: path.into(),
            burst: 1,
            statement: format!("{len} B"),
        };
        let mut r = FindMaxReport {
            schema: FIND_MAX_SCHEMA.into(),
            version: FIND_MAX_SCHEMA_VERSION,
            timestamp: 1_700_000_000.0,
            server: "dtn2".into(),
            server_addr: "198.18.0.2:5301".into(),
            direction: TestDirection::Up,
            streams: 1,
            loss_max_percent: 0.5,
            precision_percent: 1.0,
            trial_s: 1.0,
            confirm_s: 10.0,
            mtu: 9000,
            framing_bytes: 38,
            lengths: vec![
                length(64, Some(2e8), 1000, "gso"),
                length(1472, Some(3e9), 2000, "gso"),
                length(65507, None, 3000, "mmsg"),
            ],
            warnings: vec!["w".into()],
        };
        let finished = Utc.timestamp_opt(1_700_000_100, 0).unwrap();
        let runs = Run::from_find_max(&r, "lab:x", HostFacts::default(), finished).unwrap();
        assert_eq!(runs.len(), 3);
        let tp: Vec<Option<f64>> = runs.iter().map(|r| r.metrics.throughput_bps).collect();
        assert_eq!(tp, [Some(2e8), Some(3e9), None]);
        let bytes: Vec<Option<u64>> = runs.iter().map(|r| r.metrics.bytes).collect();
        assert_eq!(
            bytes,
            [Some(990 * 64), Some(1990 * 1472), Some(2990 * 65507)]
        );
        assert_ne!(runs[0].uuid, runs[1].uuid);
        for (run, l) in runs.iter().zip(&r.lengths) {
            // Each document is the report with its own length only.
            let doc: FindMaxReport = run.document.as_ref().unwrap().parse().unwrap();
            assert_eq!(doc.lengths, vec![l.clone()]);
            assert_eq!((doc.mtu, &doc.warnings), (9000, &r.warnings));
            assert_eq!(run.started, from_unix_secs(r.timestamp).unwrap());
        }
        // Outside a sweep, each length is its own cell, keyed as a sweep
        // would key it.
        let keys: Vec<String> = r.lengths.iter().map(|l| find_max_cell(&r, l)).collect();
        assert_eq!(
            keys[0],
            r#"{"find_max":true,"length":64,"no_batch":false,"protocol":"udp"}"#
        );
        assert_ne!(keys[0], keys[1]);
        r.lengths[0].send_path = "plain".into();
        r.direction = TestDirection::Down;
        assert_eq!(
            find_max_cell(&r, &r.lengths[0]),
            r#"{"direction":"down","find_max":true,"length":64,"no_batch":true,"protocol":"udp"}"#
        );
    }

    #[test]
    fn a_find_max_run_is_a_test_whose_throughput_is_the_loss_free_rate() {
        use fatpipe_schema::test::{FindMaxTrial, RatePoint};
        let point = |bps: f64| RatePoint {
            payload_bps: bps,
            wire_bps: bps * 1.05,
            packets_per_second: bps / 11_776.0,
        };
        let confirm = FindMaxTrial {
            requested_bps: Some(9e8),
            offered: point(9e8),
            received: point(9e8),
            packets_sent: 764_266,
            lost: 0,
            loss_percent: 0.0,
            seconds: 10.0,
            confirm: true,
        };
        let mut r = FindMaxReport {
            schema: FIND_MAX_SCHEMA.into(),
            version: FIND_MAX_SCHEMA_VERSION,
            timestamp: 1_700_000_000.0,
            server: "dtn2".into(),
            server_addr: "198.18.0.2:5301".into(),
            direction: TestDirection::Up,
            streams: 1,
            loss_max_percent: 0.5,
            precision_percent: 1.0,
            trial_s: 1.0,
            confirm_s: 10.0,
            mtu: 1500,
            framing_bytes: 38,
            lengths: vec![FindMaxLength {
                length: 1472,
                loss_free: Some(point(9e8)),
                confirmed: true,
                with_loss: Some(point(9.1e8)),
                lower_bound: false,
                sender_max: point(5e9),
                trial_count: 1,
                trials: vec![confirm],
                send_path: "gso".into(),
                recv_path: "gro".into(),
                burst: 44,
                statement: "loss-free up to 900 Mbit/s (confirmed)".into(),
            }],
            warnings: vec![],
        };
        let finished = Utc.timestamp_opt(1_700_000_100, 0).unwrap();
        let mut runs = Run::from_find_max(&r, "lab:x", HostFacts::default(), finished).unwrap();
        assert_eq!(runs.len(), 1);
        let run = runs.remove(0);
        assert_eq!(run.kind, RunKind::Test);
        assert_eq!(run.metrics.throughput_bps, Some(9e8));
        assert_eq!(run.metrics.loss_percent, Some(0.0));
        assert_eq!(run.peer.as_deref(), Some("dtn2"));
        assert!(run
            .document
            .unwrap()
            .as_str()
            .contains("fatpipe.test.find_max"));
        r.version = 2;
        assert!(Run::from_find_max(&r, "lab:x", HostFacts::default(), finished).is_err());
    }

    #[test]
    fn times_keep_microseconds() {
        let t = Utc.timestamp_nanos(1_700_000_000_123_456_789);
        assert_eq!(
            to_micros(t).timestamp_nanos_opt(),
            Some(1_700_000_000_123_456_000)
        );
    }
}
