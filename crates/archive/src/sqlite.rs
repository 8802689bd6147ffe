//! The SQLite backend: the default archive, one file per user.
//!
//! Built with rusqlite's `bundled` SQLite, so fatpipe needs no system
//! library at run time. The file is opened in WAL mode with
//! `synchronous=NORMAL`: readers (a report) do not block the writer (a
//! sweep), and a commit costs no fsync of the main file, which is what
//! lets a batch of results be written in one cheap transaction; a crash
//! can lose at most the last commits, never corrupt the file. Times are
//! stored as integer microseconds since the Unix epoch (UTC) so range
//! queries compare integers; UUIDs and JSON as text.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::types::{ToSqlOutput, Value};
use rusqlite::{params, Connection, OptionalExtension, Row, ToSql, TransactionBehavior};

use crate::error::{ArchiveError, Result};
use crate::record::{
    from_micros, Annotation, Document, HostFacts, Measurement, Metrics, Run, RunKind, RunStatus,
    SweepRef,
};
use crate::store::{
    where_clause, Dialect, DoneRun, Inserted, Migration, Param, RunFilter, Store, SCHEMA_VERSION,
};

/// The SQLite schema's migrations, in order.
pub const SQLITE_MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "runs",
        sql: include_str!("../migrations/sqlite/0001_runs.sql"),
    },
    Migration {
        version: 2,
        name: "annotations and indexes",
        sql: include_str!("../migrations/sqlite/0002_annotations.sql"),
    },
];

/// Page size of a new archive file. A run's document is 5–50 KB of JSON;
/// with SQLite's default 4 KB pages each row spills over a chain of
/// overflow pages, and every page is a separate write to the WAL and again
/// at checkpoint. 16 KB pages hold most of a row in one or two, which
/// (measured with bench/archive.sh) cuts the system time of writing a
/// result about in half.
const PAGE_SIZE: u32 = 16384;

/// An open SQLite archive.
pub struct SqliteStore {
    conn: Connection,
    path: PathBuf,
}

impl SqliteStore {
    /// Opens (creating it and its folder if need be) and migrates to the
    /// newest schema the file at `path`.
    pub fn open(path: &Path) -> Result<SqliteStore> {
        SqliteStore::open_at_version(path, SCHEMA_VERSION)
    }

    /// Like [`SqliteStore::open`] but migrates no further than `version`:
    /// for tests of migrations, which need a database of an older layout.
    pub fn open_at_version(path: &Path, version: u32) -> Result<SqliteStore> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| ArchiveError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        let conn = Connection::open(path).map_err(ArchiveError::sqlite("open"))?;
        conn.busy_timeout(Duration::from_secs(10))
            .map_err(ArchiveError::sqlite("set busy timeout"))?;
        // Only takes effect while the file is still empty.
        conn.pragma_update(None, "page_size", PAGE_SIZE)
            .map_err(ArchiveError::sqlite("set page size"))?;
        conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0))
            .map_err(ArchiveError::sqlite("switch to WAL"))?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(ArchiveError::sqlite("set synchronous"))?;
        let mut store = SqliteStore {
            conn,
            path: path.to_path_buf(),
        };
        store.migrate(version)?;
        Ok(store)
    }

    fn migrate(&mut self, target: u32) -> Result<()> {
        let location = self.path.display().to_string();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(ArchiveError::sqlite("begin migration"))?;
        tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS schema_version (
                 version    INTEGER PRIMARY KEY,
                 name       TEXT    NOT NULL,
                 applied_us INTEGER NOT NULL
             )",
        )
        .map_err(ArchiveError::sqlite("create schema_version"))?;
        let current: u32 = tx
            .query_row(
                "SELECT COALESCE(MAX(version), 0) FROM schema_version",
                [],
                |r| r.get(0),
            )
            .map_err(ArchiveError::sqlite("read schema version"))?;
        if current > SCHEMA_VERSION {
            return Err(ArchiveError::NewerSchema {
                location,
                found: current,
                known: SCHEMA_VERSION,
            });
        }
        let now = chrono::Utc::now().timestamp_micros();
        for m in SQLITE_MIGRATIONS
            .iter()
            .filter(|m| m.version > current && m.version <= target)
        {
            tx.execute_batch(m.sql)
                .map_err(ArchiveError::sqlite("apply migration"))?;
            tx.execute(
                "INSERT INTO schema_version (version, name, applied_us) VALUES (?1, ?2, ?3)",
                params![m.version, m.name, now],
            )
            .map_err(ArchiveError::sqlite("record migration"))?;
        }
        tx.commit()
            .map_err(ArchiveError::sqlite("commit migration"))
    }
}

const RUN_COLUMNS: &str = "id, uuid, kind, started_us, finished_us, ok, error, sweep, cell, \
    repetition, path_key, peer, host, link, throughput_bps, retransmits, rtt_min_us, rtt_avg_us, \
    rtt_max_us, rtt_std_us, loss_percent, jitter_ms, cpu_local_percent, cpu_remote_percent, bytes, \
    document";

const MEASUREMENT_COLUMNS: &str = "id, kind, started_us, ok, sweep, cell, repetition, path_key, \
    throughput_bps, retransmits, rtt_min_us, rtt_avg_us, rtt_max_us, rtt_std_us, loss_percent, \
    jitter_ms, cpu_local_percent, cpu_remote_percent, bytes";

const DIALECT: Dialect = Dialect {
    placeholder: |n| format!("?{n}"),
    started: "started_us",
};

impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn location(&self) -> String {
        self.path.display().to_string()
    }

    fn schema_version(&mut self) -> Result<u32> {
        self.conn
            .query_row(
                "SELECT COALESCE(MAX(version), 0) FROM schema_version",
                [],
                |r| r.get(0),
            )
            .map_err(ArchiveError::sqlite("read schema version"))
    }

    fn insert_runs(&mut self, runs: &[Run]) -> Result<Inserted> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(ArchiveError::sqlite("begin insert"))?;
        let mut ids = Vec::with_capacity(runs.len());
        {
            let mut stmt = tx
                .prepare_cached(
                    "INSERT INTO runs (uuid, kind, started_us, finished_us, ok, error, sweep, cell, \
                     repetition, path_key, peer, host_name, fatpipe_version, host, link, \
                     throughput_bps, retransmits, rtt_min_us, rtt_avg_us, rtt_max_us, rtt_std_us, \
                     loss_percent, jitter_ms, cpu_local_percent, cpu_remote_percent, bytes, document) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, \
                     ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27) \
                     ON CONFLICT (uuid) DO NOTHING RETURNING id",
                )
                .map_err(ArchiveError::sqlite("prepare insert"))?;
            for run in runs {
                let host = encode(&run.host, "host facts")?;
                let link = run
                    .link
                    .as_ref()
                    .map(|l| encode(l, "link spec"))
                    .transpose()?;
                let m = &run.metrics;
                let id: Option<i64> = stmt
                    .query_row(
                        params![
                            run.uuid.hyphenated().to_string(),
                            run.kind.as_str(),
                            run.started.timestamp_micros(),
                            run.finished.timestamp_micros(),
                            run.status.is_ok(),
                            run.status.error(),
                            run.sweep.as_ref().map(|s| &s.sweep),
                            run.sweep.as_ref().map(|s| &s.cell),
                            run.sweep.as_ref().map(|s| s.repetition),
                            run.path,
                            run.peer,
                            run.host.hostname,
                            run.host.fatpipe_version,
                            host,
                            link,
                            m.throughput_bps,
                            m.retransmits.map(to_i64),
                            m.rtt_min_us,
                            m.rtt_avg_us,
                            m.rtt_max_us,
                            m.rtt_std_us,
                            m.loss_percent,
                            m.jitter_ms,
                            m.cpu_local_percent,
                            m.cpu_remote_percent,
                            m.bytes.map(to_i64),
                            run.document.as_ref().map(Document::as_str),
                        ],
                        |r| r.get(0),
                    )
                    .optional()
                    .map_err(ArchiveError::sqlite("insert run"))?;
                ids.push(id);
            }
        }
        tx.commit().map_err(ArchiveError::sqlite("commit runs"))?;
        Ok(Inserted { ids })
    }

    fn runs(&mut self, filter: &RunFilter) -> Result<Vec<Run>> {
        let (clause, params) = where_clause(filter, &DIALECT);
        let sql = format!("SELECT {RUN_COLUMNS} FROM runs{clause}");
        let mut stmt = self
            .conn
            .prepare_cached(&sql)
            .map_err(ArchiveError::sqlite("prepare run query"))?;
        let mut rows = stmt
            .query(rusqlite::params_from_iter(params.iter()))
            .map_err(ArchiveError::sqlite("query runs"))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(ArchiveError::sqlite("read runs"))? {
            out.push(run_from_row(row)?);
        }
        Ok(out)
    }

    fn measurements(&mut self, filter: &RunFilter) -> Result<Vec<Measurement>> {
        let (clause, params) = where_clause(filter, &DIALECT);
        let sql = format!("SELECT {MEASUREMENT_COLUMNS} FROM runs{clause}");
        let mut stmt = self
            .conn
            .prepare_cached(&sql)
            .map_err(ArchiveError::sqlite("prepare measurement query"))?;
        let mut rows = stmt
            .query(rusqlite::params_from_iter(params.iter()))
            .map_err(ArchiveError::sqlite("query measurements"))?;
        let mut out = Vec::new();
        while let Some(row) = rows
            .next()
            .map_err(ArchiveError::sqlite("read measurements"))?
        {
            out.push(measurement_from_row(row)?);
        }
        Ok(out)
    }

    fn done_runs(&mut self, sweep: &str) -> Result<Vec<DoneRun>> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT cell, repetition, MAX(ok) FROM runs \
                 WHERE sweep = ?1 AND cell IS NOT NULL AND repetition IS NOT NULL \
                 GROUP BY cell, repetition ORDER BY cell, repetition",
            )
            .map_err(ArchiveError::sqlite("prepare done-runs query"))?;
        let rows = stmt
            .query_map([sweep], |r| {
                Ok(DoneRun {
                    cell: r.get(0)?,
                    repetition: r.get(1)?,
                    ok: r.get(2)?,
                })
            })
            .map_err(ArchiveError::sqlite("query done runs"))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(ArchiveError::sqlite("read done runs"))
    }

    fn add_annotations(&mut self, notes: &[Annotation]) -> Result<Inserted> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(ArchiveError::sqlite("begin annotations"))?;
        let mut ids = Vec::with_capacity(notes.len());
        {
            let mut stmt = tx
                .prepare_cached(
                    "INSERT INTO annotations (path_key, at_us, note) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (path_key, at_us, note) DO NOTHING RETURNING id",
                )
                .map_err(ArchiveError::sqlite("prepare annotation insert"))?;
            for n in notes {
                let id: Option<i64> = stmt
                    .query_row(params![n.path, n.at.timestamp_micros(), n.note], |r| {
                        r.get(0)
                    })
                    .optional()
                    .map_err(ArchiveError::sqlite("insert annotation"))?;
                ids.push(id);
            }
        }
        tx.commit()
            .map_err(ArchiveError::sqlite("commit annotations"))?;
        Ok(Inserted { ids })
    }

    fn annotations(&mut self, path: Option<&str>) -> Result<Vec<Annotation>> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT id, path_key, at_us, note FROM annotations \
                 WHERE ?1 IS NULL OR path_key = ?1 ORDER BY at_us, id",
            )
            .map_err(ArchiveError::sqlite("prepare annotation query"))?;
        let mut rows = stmt
            .query([path])
            .map_err(ArchiveError::sqlite("query annotations"))?;
        let mut out = Vec::new();
        while let Some(r) = rows
            .next()
            .map_err(ArchiveError::sqlite("read annotations"))?
        {
            let id: i64 = r.get(0).map_err(ArchiveError::sqlite("read annotation"))?;
            let at_us: i64 = r.get(2).map_err(ArchiveError::sqlite("read annotation"))?;
            out.push(Annotation {
                id: Some(id),
                path: r.get(1).map_err(ArchiveError::sqlite("read annotation"))?,
                at: time(id, at_us)?,
                note: r.get(3).map_err(ArchiveError::sqlite("read annotation"))?,
            });
        }
        Ok(out)
    }
}

impl ToSql for Param {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Owned(match self {
            Param::Text(s) => Value::Text(s.clone()),
            Param::Int(i) => Value::Integer(*i),
            Param::Bool(b) => Value::Integer(i64::from(*b)),
            Param::Time(t) => Value::Integer(t.timestamp_micros()),
        }))
    }
}

fn run_from_row(r: &Row<'_>) -> Result<Run> {
    let get_err = ArchiveError::sqlite;
    let id: i64 = r.get(0).map_err(get_err("read run"))?;
    let bad = |what: String| ArchiveError::BadRow { id, what };
    let uuid: String = r.get(1).map_err(get_err("read run"))?;
    let kind: String = r.get(2).map_err(get_err("read run"))?;
    let ok: bool = r.get(5).map_err(get_err("read run"))?;
    let error: Option<String> = r.get(6).map_err(get_err("read run"))?;
    let host: String = r.get(12).map_err(get_err("read run"))?;
    let link: Option<String> = r.get(13).map_err(get_err("read run"))?;
    let document: Option<String> = r.get(25).map_err(get_err("read run"))?;
    Ok(Run {
        id: Some(id),
        uuid: uuid::Uuid::parse_str(&uuid).map_err(|e| bad(format!("uuid: {e}")))?,
        kind: RunKind::parse(&kind).ok_or_else(|| bad(format!("unknown kind {kind:?}")))?,
        started: time(id, r.get(3).map_err(get_err("read run"))?)?,
        finished: time(id, r.get(4).map_err(get_err("read run"))?)?,
        status: if ok {
            RunStatus::Ok
        } else {
            RunStatus::Failed(error.unwrap_or_default())
        },
        sweep: sweep_ref(
            r.get(7).map_err(get_err("read run"))?,
            r.get(8).map_err(get_err("read run"))?,
            r.get(9).map_err(get_err("read run"))?,
        ),
        path: r.get(10).map_err(get_err("read run"))?,
        peer: r.get(11).map_err(get_err("read run"))?,
        host: serde_json::from_str::<HostFacts>(&host).map_err(|e| bad(format!("host: {e}")))?,
        link: link
            .map(|l| serde_json::from_str(&l))
            .transpose()
            .map_err(|e| bad(format!("link: {e}")))?,
        metrics: metrics(r, 14).map_err(get_err("read run"))?,
        document: document
            .map(Document::from_json)
            .transpose()
            .map_err(|e| bad(e.to_string()))?,
    })
}

fn measurement_from_row(r: &Row<'_>) -> Result<Measurement> {
    let get_err = ArchiveError::sqlite;
    let id: i64 = r.get(0).map_err(get_err("read measurement"))?;
    let kind: String = r.get(1).map_err(get_err("read measurement"))?;
    Ok(Measurement {
        id,
        kind: RunKind::parse(&kind).ok_or_else(|| ArchiveError::BadRow {
            id,
            what: format!("unknown kind {kind:?}"),
        })?,
        started: time(id, r.get(2).map_err(get_err("read measurement"))?)?,
        ok: r.get(3).map_err(get_err("read measurement"))?,
        sweep: sweep_ref(
            r.get(4).map_err(get_err("read measurement"))?,
            r.get(5).map_err(get_err("read measurement"))?,
            r.get(6).map_err(get_err("read measurement"))?,
        ),
        path: r.get(7).map_err(get_err("read measurement"))?,
        metrics: metrics(r, 8).map_err(get_err("read measurement"))?,
    })
}

/// The eleven metric columns starting at `first`, in [`Metrics`] order.
fn metrics(r: &Row<'_>, first: usize) -> rusqlite::Result<Metrics> {
    Ok(Metrics {
        throughput_bps: r.get(first)?,
        retransmits: r.get::<_, Option<i64>>(first + 1)?.map(to_u64),
        rtt_min_us: r.get(first + 2)?,
        rtt_avg_us: r.get(first + 3)?,
        rtt_max_us: r.get(first + 4)?,
        rtt_std_us: r.get(first + 5)?,
        loss_percent: r.get(first + 6)?,
        jitter_ms: r.get(first + 7)?,
        cpu_local_percent: r.get(first + 8)?,
        cpu_remote_percent: r.get(first + 9)?,
        bytes: r.get::<_, Option<i64>>(first + 10)?.map(to_u64),
    })
}

pub(crate) fn sweep_ref(
    sweep: Option<String>,
    cell: Option<String>,
    repetition: Option<u32>,
) -> Option<SweepRef> {
    Some(SweepRef {
        sweep: sweep?,
        cell: cell?,
        repetition: repetition?,
    })
}

fn time(id: i64, us: i64) -> Result<chrono::DateTime<chrono::Utc>> {
    from_micros(us).ok_or_else(|| ArchiveError::BadRow {
        id,
        what: format!("time {us} µs out of range"),
    })
}

pub(crate) fn encode<T: serde::Serialize>(value: &T, what: &'static str) -> Result<String> {
    serde_json::to_string(value).map_err(|source| ArchiveError::Encode { what, source })
}

/// Counts above i64::MAX (none real) are stored as i64::MAX.
pub(crate) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A negative count (none written by fatpipe) reads as 0.
pub(crate) fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}
