//! The PostgreSQL backend: one archive shared by a fleet of hosts.
//!
//! The sync `postgres` client, without TLS (`NoTls`): the archive server is
//! expected on a trusted network or through a local tunnel; TLS can be added
//! behind the same `open` later without touching callers. Several hosts may
//! open the archive at once, so migrations take a transaction-scoped
//! advisory lock before looking at `schema_version`: the first host
//! migrates, the others wait and then find nothing to do.
//!
//! Types are PostgreSQL's own: `timestamptz`, `uuid`, `jsonb` for host facts
//! and link specs (a fleet queries them), `json` for the result document
//! (kept as written). JSON crosses the wire as text (`$n::text::jsonb`),
//! which needs no extra driver feature. [`PgStore::open_with`] can place the
//! archive in its own schema, so one database can hold several archives
//! (the test suite uses one per test).

use chrono::{DateTime, Utc};
use postgres::types::ToSql;
use postgres::{Client, NoTls, Row};
use uuid::Uuid;

use crate::error::{ArchiveError, Result};
use crate::location::redact;
use crate::record::{
    Annotation, Document, HostFacts, Measurement, Metrics, Run, RunKind, RunStatus,
};
use crate::sqlite::{encode, sweep_ref, to_i64, to_u64};
use crate::store::{
    where_clause, Dialect, DoneRun, Inserted, Migration, Param, RunFilter, Store, SCHEMA_VERSION,
};

/// The PostgreSQL schema's migrations, in order.
pub const POSTGRES_MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "runs",
        sql: include_str!("../migrations/postgres/0001_runs.sql"),
    },
    Migration {
        version: 2,
        name: "annotations and indexes",
        sql: include_str!("../migrations/postgres/0002_annotations.sql"),
    },
];

/// Key of the advisory lock migrations hold ("fatp").
const MIGRATION_LOCK: i64 = 0x6661_7470;

/// An open PostgreSQL archive.
pub struct PgStore {
    client: Client,
    location: String,
}

impl PgStore {
    /// Connects to `url` and migrates to the newest schema.
    pub fn open(url: &str) -> Result<PgStore> {
        PgStore::open_with(url, None, SCHEMA_VERSION)
    }

    /// Connects to `url`; with `schema`, creates that PostgreSQL schema if
    /// missing and keeps the archive's tables in it; migrates no further
    /// than `version` (tests of migrations need older layouts).
    pub fn open_with(url: &str, schema: Option<&str>, version: u32) -> Result<PgStore> {
        let mut client = Client::connect(url, NoTls).map_err(ArchiveError::postgres("connect"))?;
        let mut location = redact(url);
        if let Some(schema) = schema {
            let plain = !schema.is_empty()
                && schema.len() <= 63
                && schema
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                && !schema.as_bytes()[0].is_ascii_digit();
            if !plain {
                return Err(ArchiveError::BadSchemaName(schema.to_owned()));
            }
            // Checked above to be a plain identifier, so quoting is enough.
            client
                .batch_execute(&format!(
                    "CREATE SCHEMA IF NOT EXISTS \"{schema}\"; SET search_path TO \"{schema}\""
                ))
                .map_err(ArchiveError::postgres("select schema"))?;
            location = format!("{location} (schema {schema})");
        }
        let mut store = PgStore { client, location };
        store.migrate(version)?;
        Ok(store)
    }

    fn migrate(&mut self, target: u32) -> Result<()> {
        let mut tx = self
            .client
            .transaction()
            .map_err(ArchiveError::postgres("begin migration"))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .map_err(ArchiveError::postgres("lock for migration"))?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS schema_version (
                 version INTEGER     PRIMARY KEY,
                 name    TEXT        NOT NULL,
                 applied TIMESTAMPTZ NOT NULL DEFAULT now()
             )",
        )
        .map_err(ArchiveError::postgres("create schema_version"))?;
        let current = read_version(&mut tx)?;
        if current > SCHEMA_VERSION {
            return Err(ArchiveError::NewerSchema {
                location: self.location.clone(),
                found: current,
                known: SCHEMA_VERSION,
            });
        }
        for m in POSTGRES_MIGRATIONS
            .iter()
            .filter(|m| m.version > current && m.version <= target)
        {
            tx.batch_execute(m.sql)
                .map_err(ArchiveError::postgres("apply migration"))?;
            tx.execute(
                "INSERT INTO schema_version (version, name) VALUES ($1, $2)",
                &[&(m.version as i32), &m.name],
            )
            .map_err(ArchiveError::postgres("record migration"))?;
        }
        tx.commit()
            .map_err(ArchiveError::postgres("commit migration"))
    }
}

const RUN_COLUMNS: &str = "id, uuid, kind, started, finished, ok, error, sweep, cell, repetition, \
    path_key, peer, host::text, link::text, throughput_bps, retransmits, rtt_min_us, rtt_avg_us, \
    rtt_max_us, rtt_std_us, loss_percent, jitter_ms, cpu_local_percent, cpu_remote_percent, bytes, \
    document::text";

const MEASUREMENT_COLUMNS: &str = "id, kind, started, ok, sweep, cell, repetition, path_key, \
    throughput_bps, retransmits, rtt_min_us, rtt_avg_us, rtt_max_us, rtt_std_us, loss_percent, \
    jitter_ms, cpu_local_percent, cpu_remote_percent, bytes";

const DIALECT: Dialect = Dialect {
    placeholder: |n| format!("${n}"),
    started: "started",
};

impl Store for PgStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    fn location(&self) -> String {
        self.location.clone()
    }

    fn schema_version(&mut self) -> Result<u32> {
        read_version(&mut self.client)
    }

    fn insert_runs(&mut self, runs: &[Run]) -> Result<Inserted> {
        let mut tx = self
            .client
            .transaction()
            .map_err(ArchiveError::postgres("begin insert"))?;
        let stmt = tx
            .prepare(
                "INSERT INTO runs (uuid, kind, started, finished, ok, error, sweep, cell, \
                 repetition, path_key, peer, host_name, fatpipe_version, host, link, \
                 throughput_bps, retransmits, rtt_min_us, rtt_avg_us, rtt_max_us, rtt_std_us, \
                 loss_percent, jitter_ms, cpu_local_percent, cpu_remote_percent, bytes, document) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14::text::jsonb, \
                 $15::text::jsonb, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, \
                 $27::text::json) \
                 ON CONFLICT (uuid) DO NOTHING RETURNING id",
            )
            .map_err(ArchiveError::postgres("prepare insert"))?;
        let mut ids = Vec::with_capacity(runs.len());
        for run in runs {
            let host = encode(&run.host, "host facts")?;
            let link = run
                .link
                .as_ref()
                .map(|l| encode(l, "link spec"))
                .transpose()?;
            let m = &run.metrics;
            let repetition = run
                .sweep
                .as_ref()
                .map(|s| i32::try_from(s.repetition).unwrap_or(i32::MAX));
            let row = tx
                .query_opt(
                    &stmt,
                    &[
                        &run.uuid,
                        &run.kind.as_str(),
                        &run.started,
                        &run.finished,
                        &run.status.is_ok(),
                        &run.status.error(),
                        &run.sweep.as_ref().map(|s| s.sweep.as_str()),
                        &run.sweep.as_ref().map(|s| s.cell.as_str()),
                        &repetition,
                        &run.path,
                        &run.peer,
                        &run.host.hostname,
                        &run.host.fatpipe_version,
                        &host,
                        &link,
                        &m.throughput_bps,
                        &m.retransmits.map(to_i64),
                        &m.rtt_min_us,
                        &m.rtt_avg_us,
                        &m.rtt_max_us,
                        &m.rtt_std_us,
                        &m.loss_percent,
                        &m.jitter_ms,
                        &m.cpu_local_percent,
                        &m.cpu_remote_percent,
                        &m.bytes.map(to_i64),
                        &run.document.as_ref().map(Document::as_str),
                    ],
                )
                .map_err(ArchiveError::postgres("insert run"))?;
            ids.push(match row {
                Some(r) => Some(
                    r.try_get(0)
                        .map_err(ArchiveError::postgres("read run id"))?,
                ),
                None => None,
            });
        }
        tx.commit().map_err(ArchiveError::postgres("commit runs"))?;
        Ok(Inserted { ids })
    }

    fn runs(&mut self, filter: &RunFilter) -> Result<Vec<Run>> {
        let (clause, params) = where_clause(filter, &DIALECT);
        let sql = format!("SELECT {RUN_COLUMNS} FROM runs{clause}");
        let values = pg_params(&params);
        let refs: Vec<&(dyn ToSql + Sync)> = values.iter().map(|b| b.as_ref()).collect();
        let rows = self
            .client
            .query(&sql, &refs)
            .map_err(ArchiveError::postgres("query runs"))?;
        rows.iter().map(run_from_row).collect()
    }

    fn measurements(&mut self, filter: &RunFilter) -> Result<Vec<Measurement>> {
        let (clause, params) = where_clause(filter, &DIALECT);
        let sql = format!("SELECT {MEASUREMENT_COLUMNS} FROM runs{clause}");
        let values = pg_params(&params);
        let refs: Vec<&(dyn ToSql + Sync)> = values.iter().map(|b| b.as_ref()).collect();
        let rows = self
            .client
            .query(&sql, &refs)
            .map_err(ArchiveError::postgres("query measurements"))?;
        rows.iter().map(measurement_from_row).collect()
    }

    fn done_runs(&mut self, sweep: &str) -> Result<Vec<DoneRun>> {
        let rows = self
            .client
            .query(
                "SELECT cell, repetition, bool_or(ok) FROM runs \
                 WHERE sweep = $1 AND cell IS NOT NULL AND repetition IS NOT NULL \
                 GROUP BY cell, repetition ORDER BY cell COLLATE \"C\", repetition",
                &[&sweep],
            )
            .map_err(ArchiveError::postgres("query done runs"))?;
        rows.iter()
            .map(|r| {
                let repetition: i32 = r
                    .try_get(1)
                    .map_err(ArchiveError::postgres("read done run"))?;
                Ok(DoneRun {
                    cell: r
                        .try_get(0)
                        .map_err(ArchiveError::postgres("read done run"))?,
                    repetition: u32::try_from(repetition).unwrap_or(0),
                    ok: r
                        .try_get(2)
                        .map_err(ArchiveError::postgres("read done run"))?,
                })
            })
            .collect()
    }

    fn add_annotations(&mut self, notes: &[Annotation]) -> Result<Inserted> {
        let mut tx = self
            .client
            .transaction()
            .map_err(ArchiveError::postgres("begin annotations"))?;
        let stmt = tx
            .prepare(
                "INSERT INTO annotations (path_key, at, note) VALUES ($1, $2, $3) \
                 ON CONFLICT (path_key, at, note) DO NOTHING RETURNING id",
            )
            .map_err(ArchiveError::postgres("prepare annotation insert"))?;
        let mut ids = Vec::with_capacity(notes.len());
        for n in notes {
            let row = tx
                .query_opt(&stmt, &[&n.path, &n.at, &n.note])
                .map_err(ArchiveError::postgres("insert annotation"))?;
            ids.push(match row {
                Some(r) => Some(
                    r.try_get(0)
                        .map_err(ArchiveError::postgres("read annotation id"))?,
                ),
                None => None,
            });
        }
        tx.commit()
            .map_err(ArchiveError::postgres("commit annotations"))?;
        Ok(Inserted { ids })
    }

    fn annotations(&mut self, path: Option<&str>) -> Result<Vec<Annotation>> {
        let rows = self
            .client
            .query(
                "SELECT id, path_key, at, note FROM annotations \
                 WHERE $1::text IS NULL OR path_key = $1 ORDER BY at, id",
                &[&path],
            )
            .map_err(ArchiveError::postgres("query annotations"))?;
        rows.iter()
            .map(|r| {
                let e = ArchiveError::postgres;
                Ok(Annotation {
                    id: Some(r.try_get(0).map_err(e("read annotation"))?),
                    path: r.try_get(1).map_err(e("read annotation"))?,
                    at: r.try_get(2).map_err(e("read annotation"))?,
                    note: r.try_get(3).map_err(e("read annotation"))?,
                })
            })
            .collect()
    }
}

fn read_version(client: &mut impl postgres::GenericClient) -> Result<u32> {
    let row = client
        .query_one("SELECT COALESCE(MAX(version), 0) FROM schema_version", &[])
        .map_err(ArchiveError::postgres("read schema version"))?;
    let v: i32 = row
        .try_get(0)
        .map_err(ArchiveError::postgres("read schema version"))?;
    Ok(u32::try_from(v).unwrap_or(0))
}

fn pg_params(params: &[Param]) -> Vec<Box<dyn ToSql + Sync>> {
    params
        .iter()
        .map(|p| -> Box<dyn ToSql + Sync> {
            match p {
                Param::Text(s) => Box::new(s.clone()),
                Param::Int(i) => Box::new(*i),
                Param::Bool(b) => Box::new(*b),
                Param::Time(t) => Box::new(*t),
            }
        })
        .collect()
}

fn run_from_row(r: &Row) -> Result<Run> {
    let e = ArchiveError::postgres;
    let id: i64 = r.try_get(0).map_err(e("read run"))?;
    let bad = |what: String| ArchiveError::BadRow { id, what };
    let kind: String = r.try_get(2).map_err(e("read run"))?;
    let ok: bool = r.try_get(5).map_err(e("read run"))?;
    let error: Option<String> = r.try_get(6).map_err(e("read run"))?;
    let host: String = r.try_get(12).map_err(e("read run"))?;
    let link: Option<String> = r.try_get(13).map_err(e("read run"))?;
    let document: Option<String> = r.try_get(25).map_err(e("read run"))?;
    let repetition: Option<i32> = r.try_get(9).map_err(e("read run"))?;
    Ok(Run {
        id: Some(id),
        uuid: r.try_get::<_, Uuid>(1).map_err(e("read run"))?,
        kind: RunKind::parse(&kind).ok_or_else(|| bad(format!("unknown kind {kind:?}")))?,
        started: r.try_get::<_, DateTime<Utc>>(3).map_err(e("read run"))?,
        finished: r.try_get::<_, DateTime<Utc>>(4).map_err(e("read run"))?,
        status: if ok {
            RunStatus::Ok
        } else {
            RunStatus::Failed(error.unwrap_or_default())
        },
        sweep: sweep_ref(
            r.try_get(7).map_err(e("read run"))?,
            r.try_get(8).map_err(e("read run"))?,
            repetition.map(|v| u32::try_from(v).unwrap_or(0)),
        ),
        path: r.try_get(10).map_err(e("read run"))?,
        peer: r.try_get(11).map_err(e("read run"))?,
        host: serde_json::from_str::<HostFacts>(&host).map_err(|e| bad(format!("host: {e}")))?,
        link: link
            .map(|l| serde_json::from_str(&l))
            .transpose()
            .map_err(|e| bad(format!("link: {e}")))?,
        metrics: metrics(r, 14).map_err(e("read run"))?,
        document: document
            .map(Document::from_json)
            .transpose()
            .map_err(|e| bad(e.to_string()))?,
    })
}

fn measurement_from_row(r: &Row) -> Result<Measurement> {
    let e = ArchiveError::postgres;
    let id: i64 = r.try_get(0).map_err(e("read measurement"))?;
    let kind: String = r.try_get(1).map_err(e("read measurement"))?;
    let repetition: Option<i32> = r.try_get(6).map_err(e("read measurement"))?;
    Ok(Measurement {
        id,
        kind: RunKind::parse(&kind).ok_or_else(|| ArchiveError::BadRow {
            id,
            what: format!("unknown kind {kind:?}"),
        })?,
        started: r.try_get(2).map_err(e("read measurement"))?,
        ok: r.try_get(3).map_err(e("read measurement"))?,
        sweep: sweep_ref(
            r.try_get(4).map_err(e("read measurement"))?,
            r.try_get(5).map_err(e("read measurement"))?,
            repetition.map(|v| u32::try_from(v).unwrap_or(0)),
        ),
        path: r.try_get(7).map_err(e("read measurement"))?,
        metrics: metrics(r, 8).map_err(e("read measurement"))?,
    })
}

/// The eleven metric columns starting at `first`, in [`Metrics`] order.
fn metrics(r: &Row, first: usize) -> Result<Metrics, postgres::Error> {
    Ok(Metrics {
        throughput_bps: r.try_get(first)?,
        retransmits: r.try_get::<_, Option<i64>>(first + 1)?.map(to_u64),
        rtt_min_us: r.try_get(first + 2)?,
        rtt_avg_us: r.try_get(first + 3)?,
        rtt_max_us: r.try_get(first + 4)?,
        rtt_std_us: r.try_get(first + 5)?,
        loss_percent: r.try_get(first + 6)?,
        jitter_ms: r.try_get(first + 7)?,
        cpu_local_percent: r.try_get(first + 8)?,
        cpu_remote_percent: r.try_get(first + 9)?,
        bytes: r.try_get::<_, Option<i64>>(first + 10)?.map(to_u64),
    })
}
