//! The one interface every archive backend implements, and what is built
//! on it once for all of them: export and import as JSON lines.
//!
//! [`Store`] is a trait object (`Box<dyn Store>` from [`crate::open`]) so
//! the CLI picks SQLite or PostgreSQL at run time from one `--archive`
//! string, and so the test suite is one set of functions run against both.
//! Its methods are the operations the commands need, each one statement or
//! one transaction; filtering happens in SQL ([`RunFilter`]) so an archive
//! of millions of runs is never loaded to be searched.
//!
//! The export format (`fatpipe.archive`, version 1) is one JSON object per
//! line, each with a `record` field: first a `header` naming the format
//! and its version, then `annotation`s, then `run`s (fields as [`Run`] and
//! [`Annotation`] serialise; a run's `document` is the result JSON inline,
//! as the command printed it). Import assigns new row ids and skips runs
//! whose UUID the archive already holds and annotations identical to one it
//! holds, so importing the same file twice adds nothing the second time.

use std::io::{BufRead, Write};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{ArchiveError, Result};
use crate::record::{Annotation, Measurement, Run, RunKind};

/// The schema version this build migrates to.
pub const SCHEMA_VERSION: u32 = 2;
/// The export format's name, in its header line.
pub const EXPORT_FORMAT: &str = "fatpipe.archive";
/// The export format's version.
pub const EXPORT_VERSION: u32 = 1;

/// One numbered schema change, as SQL for one backend. Applied in order,
/// each in the transaction that records it in `schema_version`.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// 1, 2, …: the schema version after it.
    pub version: u32,
    /// What it does, stored beside the version.
    pub name: &'static str,
    /// The statements.
    pub sql: &'static str,
}

/// Which runs a query selects; every field that is `Some` must match.
/// Runs come back in the order they were stored (row id).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunFilter {
    /// Runs of this sweep.
    pub sweep: Option<String>,
    /// Runs of this cell (with `sweep`, of that sweep's cell).
    pub cell: Option<String>,
    /// Runs over this path key.
    pub path: Option<String>,
    /// Runs of this command.
    pub kind: Option<RunKind>,
    /// Only successful (`true`) or only failed (`false`) runs.
    pub ok: Option<bool>,
    /// Runs started at or after this.
    pub since: Option<DateTime<Utc>>,
    /// Runs started before this.
    pub until: Option<DateTime<Utc>>,
    /// Runs with a row id above this (paging).
    pub after_id: Option<i64>,
    /// At most this many runs.
    pub limit: Option<u64>,
}

/// A (cell, repetition) of a sweep that the archive holds: what resume
/// asks for, so no run is done twice.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DoneRun {
    /// The cell key.
    pub cell: String,
    /// The repetition.
    pub repetition: u32,
    /// True when at least one stored run of it succeeded; a sweep may run
    /// again a repetition that only failed.
    pub ok: bool,
}

/// The row ids an insert gave, one per record given, `None` where the
/// archive already held it (same run UUID, or an identical annotation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inserted {
    /// Per record, in the order given.
    pub ids: Vec<Option<i64>>,
}

/// What an import added and what it found already there.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImportSummary {
    /// Runs added.
    pub runs_added: usize,
    /// Runs skipped: their UUID was already in the archive.
    pub runs_present: usize,
    /// Annotations added.
    pub annotations_added: usize,
    /// Annotations skipped: an identical one was there.
    pub annotations_present: usize,
}

/// An open, migrated archive. Every method is one transaction.
pub trait Store {
    /// `"sqlite"` or `"postgres"`.
    fn backend(&self) -> &'static str;

    /// The archive's location for messages (a URL's password hidden).
    fn location(&self) -> String;

    /// The schema version the database is at.
    fn schema_version(&mut self) -> Result<u32>;

    /// Stores `runs` in one transaction (all or none); runs whose UUID is
    /// already stored are skipped, not duplicated. Their `id` is ignored.
    fn insert_runs(&mut self, runs: &[Run]) -> Result<Inserted>;

    /// The runs `filter` selects, documents and host facts included.
    fn runs(&mut self, filter: &RunFilter) -> Result<Vec<Run>>;

    /// The same selection as [`Store::runs`] without the JSON: what
    /// statistics need, fast over many runs.
    fn measurements(&mut self, filter: &RunFilter) -> Result<Vec<Measurement>>;

    /// The (cell, repetition) pairs of `sweep` with at least one stored
    /// run, ordered by cell then repetition.
    fn done_runs(&mut self, sweep: &str) -> Result<Vec<DoneRun>>;

    /// Stores annotations in one transaction; one identical to a stored
    /// one (same path, time and note) is skipped.
    fn add_annotations(&mut self, notes: &[Annotation]) -> Result<Inserted>;

    /// The annotations on `path` (all when `None`), oldest first.
    fn annotations(&mut self, path: Option<&str>) -> Result<Vec<Annotation>>;
}

impl RunFilter {
    /// Everything.
    pub fn all() -> RunFilter {
        RunFilter::default()
    }

    /// Narrows to runs on the annotation's path started at or after it.
    pub fn after(mut self, note: &Annotation) -> RunFilter {
        self.path = Some(note.path.clone());
        self.since = Some(note.at);
        self
    }

    /// Narrows to runs on the annotation's path started before it.
    pub fn before(mut self, note: &Annotation) -> RunFilter {
        self.path = Some(note.path.clone());
        self.until = Some(note.at);
        self
    }
}

impl Inserted {
    /// How many records were new.
    pub fn added(&self) -> usize {
        self.ids.iter().filter(|i| i.is_some()).count()
    }

    /// How many were already there.
    pub fn present(&self) -> usize {
        self.ids.len() - self.added()
    }
}

/// Writes the runs `filter` selects, and the annotations on its path (all
/// when it names none), to `out` as JSON lines; returns how many runs.
/// Runs are read a page at a time, so an export of a large archive does
/// not hold it all in memory.
pub fn export_jsonl(
    store: &mut dyn Store,
    filter: &RunFilter,
    out: &mut dyn Write,
) -> Result<usize> {
    const PAGE: u64 = 1000;
    let header = Header {
        record: "header",
        format: EXPORT_FORMAT,
        version: EXPORT_VERSION,
    };
    write_line(out, &header, "export header")?;
    for note in store.annotations(filter.path.as_deref())? {
        write_line(
            out,
            &Tagged {
                record: "annotation",
                inner: &note,
            },
            "annotation",
        )?;
    }
    let mut written = 0usize;
    let mut page = filter.clone();
    loop {
        let remaining = filter.limit.map(|l| l.saturating_sub(written as u64));
        if remaining == Some(0) {
            break;
        }
        page.limit = Some(remaining.map_or(PAGE, |r| r.min(PAGE)));
        let runs = store.runs(&page)?;
        for run in &runs {
            write_line(
                out,
                &Tagged {
                    record: "run",
                    inner: run,
                },
                "run",
            )?;
        }
        written += runs.len();
        match runs.last().and_then(|r| r.id) {
            Some(last) if runs.len() as u64 == page.limit.unwrap_or(PAGE) => {
                page.after_id = Some(last)
            }
            _ => break,
        }
    }
    out.flush().map_err(|source| ArchiveError::Stream {
        what: "write export",
        source,
    })?;
    Ok(written)
}

/// Reads JSON lines written by [`export_jsonl`] into `store`, in batches
/// of 1,000 records per transaction. The header must come first and name
/// a format version this build reads; blank lines are ignored.
pub fn import_jsonl(store: &mut dyn Store, input: &mut dyn BufRead) -> Result<ImportSummary> {
    const BATCH: usize = 1000;
    let mut summary = ImportSummary::default();
    let mut runs: Vec<Run> = Vec::with_capacity(BATCH);
    let mut notes: Vec<Annotation> = Vec::new();
    let mut seen_header = false;
    let mut line = String::new();
    let mut number = 0usize;
    loop {
        line.clear();
        let n = input
            .read_line(&mut line)
            .map_err(|source| ArchiveError::Stream {
                what: "read import",
                source,
            })?;
        if n == 0 {
            break;
        }
        number += 1;
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        let bad = |what: String| ArchiveError::Import { line: number, what };
        let tag: Tag = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        match (tag.record.as_str(), seen_header) {
            ("header", false) => {
                let h: HeaderIn = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
                if h.format != EXPORT_FORMAT || h.version > EXPORT_VERSION {
                    return Err(bad(format!(
                        "format {} version {}; this build reads {EXPORT_FORMAT} up to version {EXPORT_VERSION}",
                        h.format, h.version
                    )));
                }
                seen_header = true;
            }
            (_, false) => return Err(bad(format!("expected the {EXPORT_FORMAT} header first"))),
            ("run", true) => {
                let mut run: Run = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
                run.id = None;
                runs.push(run);
                if runs.len() == BATCH {
                    let ins = store.insert_runs(&runs)?;
                    summary.runs_added += ins.added();
                    summary.runs_present += ins.present();
                    runs.clear();
                }
            }
            ("annotation", true) => {
                let mut note: Annotation =
                    serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
                note.id = None;
                notes.push(note);
            }
            (other, true) => return Err(bad(format!("unknown record {other:?}"))),
        }
    }
    if !seen_header {
        return Err(ArchiveError::Import {
            line: number,
            what: "empty: no header".into(),
        });
    }
    if !runs.is_empty() {
        let ins = store.insert_runs(&runs)?;
        summary.runs_added += ins.added();
        summary.runs_present += ins.present();
    }
    for chunk in notes.chunks(BATCH) {
        let ins = store.add_annotations(chunk)?;
        summary.annotations_added += ins.added();
        summary.annotations_present += ins.present();
    }
    Ok(summary)
}

/// A value in a WHERE clause, converted by each backend to its own type.
#[derive(Debug, Clone)]
pub(crate) enum Param {
    Text(String),
    Int(i64),
    Bool(bool),
    Time(DateTime<Utc>),
}

/// How a backend spells what differs in SQL.
pub(crate) struct Dialect {
    /// `?1` or `$1` for parameter `n` (1-based).
    pub placeholder: fn(usize) -> String,
    /// The start-time column (`started_us` or `started`).
    pub started: &'static str,
}

/// ` WHERE … ORDER BY id [LIMIT n]` for `filter`, with its parameters.
pub(crate) fn where_clause(filter: &RunFilter, d: &Dialect) -> (String, Vec<Param>) {
    let mut conds: Vec<String> = Vec::new();
    let mut params: Vec<Param> = Vec::new();
    let mut add = |cond: &str, p: Param| {
        params.push(p);
        conds.push(cond.replace('#', &(d.placeholder)(params.len())));
    };
    if let Some(s) = &filter.sweep {
        add("sweep = #", Param::Text(s.clone()));
    }
    if let Some(c) = &filter.cell {
        add("cell = #", Param::Text(c.clone()));
    }
    if let Some(p) = &filter.path {
        add("path_key = #", Param::Text(p.clone()));
    }
    if let Some(k) = filter.kind {
        add("kind = #", Param::Text(k.as_str().to_owned()));
    }
    if let Some(ok) = filter.ok {
        add("ok = #", Param::Bool(ok));
    }
    if let Some(t) = filter.since {
        add(&format!("{} >= #", d.started), Param::Time(t));
    }
    if let Some(t) = filter.until {
        add(&format!("{} < #", d.started), Param::Time(t));
    }
    if let Some(id) = filter.after_id {
        add("id > #", Param::Int(id));
    }
    let mut sql = String::new();
    if !conds.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&conds.join(" AND "));
    }
    sql.push_str(" ORDER BY id");
    if let Some(l) = filter.limit {
        sql.push_str(&format!(" LIMIT {}", l.min(i64::MAX as u64)));
    }
    (sql, params)
}

#[derive(Serialize)]
struct Header {
    record: &'static str,
    format: &'static str,
    version: u32,
}

#[derive(Deserialize)]
struct HeaderIn {
    format: String,
    version: u32,
}

#[derive(Serialize)]
struct Tagged<'a, T: Serialize> {
    record: &'static str,
    #[serde(flatten)]
    inner: &'a T,
}

#[derive(Deserialize)]
struct Tag {
    record: String,
}

fn write_line<T: Serialize>(out: &mut dyn Write, value: &T, what: &'static str) -> Result<()> {
    let mut text =
        serde_json::to_string(value).map_err(|source| ArchiveError::Encode { what, source })?;
    text.push('\n');
    out.write_all(text.as_bytes())
        .map_err(|source| ArchiveError::Stream {
            what: "write export",
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn where_clause_numbers_placeholders_in_order() {
        let d = Dialect {
            placeholder: |n| format!("${n}"),
            started: "started",
        };
        let f = RunFilter {
            sweep: Some("s".into()),
            kind: Some(RunKind::Copy),
            since: Some(DateTime::<Utc>::UNIX_EPOCH),
            limit: Some(5),
            ..RunFilter::default()
        };
        let (sql, params) = where_clause(&f, &d);
        assert_eq!(
            sql,
            " WHERE sweep = $1 AND kind = $2 AND started >= $3 ORDER BY id LIMIT 5"
        );
        assert_eq!(params.len(), 3);
        assert_eq!(where_clause(&RunFilter::all(), &d).0, " ORDER BY id");
    }
}
