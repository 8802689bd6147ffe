//! `fatpipe archive`: list, show, export, import and annotate the runs
//! that `sweep`, and `test`/`copy`/`path` with `--archive`, stored; and the
//! [`Recorder`] those commands store through.
//!
//! The archive itself (SQLite or PostgreSQL, one interface) is
//! `fatpipe_archive`; this module parses flags into its filters, renders
//! runs for people, and collects the host facts a run is stored with
//! ([`host_facts`]: kernel, CPU, the sysctls that decide throughput, NICs,
//! read through `fatpipe_audit`'s collectors). `archive facts` (hidden)
//! prints them as JSON, so a sweep can read them inside a lab namespace,
//! whose TCP sysctls are its own.

use std::cell::{Cell, RefCell};
use std::io::{BufReader, Write};
use std::path::PathBuf;

use anyhow::Context;
use chrono::{DateTime, NaiveDate, Utc};
use clap::Subcommand;
use fatpipe_archive::{
    Annotation, HostFacts, Location, NicFacts, Run, RunFilter, RunKind, RunStatus, Store,
    ARCHIVE_ENV,
};
use fatpipe_audit::host::Host;
use fatpipe_schema::units;

use crate::exit::usage;

/// Arguments of `fatpipe archive`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// List stored runs (oldest first), one line each.
    List {
        #[command(flatten)]
        select: Select,
        /// Print JSON lines (one run per line, documents left out).
        #[arg(long)]
        json: bool,
    },
    /// Show one run: its facts and its full result document.
    Show {
        /// The run's id (from `archive list`).
        id: i64,
        /// Print the stored run as JSON.
        #[arg(long)]
        json: bool,
        /// The archive (file or postgres:// URL) [default: $FATPIPE_ARCHIVE, then the user's data directory].
        #[arg(long, value_name = "LOCATION")]
        archive: Option<String>,
    },
    /// Write runs and annotations as JSON lines (to move them to another archive).
    Export {
        #[command(flatten)]
        select: Select,
        /// Write here instead of stdout.
        #[arg(short = 'o', long)]
        output: Option<PathBuf>,
    },
    /// Read JSON lines written by `archive export` (a file, or - for stdin).
    Import {
        /// The export file.
        file: PathBuf,
        /// The archive (file or postgres:// URL) [default: $FATPIPE_ARCHIVE, then the user's data directory].
        #[arg(long, value_name = "LOCATION")]
        archive: Option<String>,
    },
    /// Put a dated note on a path ("link upgraded to 622 Mbit/s").
    Annotate {
        /// The path key (as `archive list` shows it).
        path: String,
        /// The note.
        note: String,
        /// When (RFC 3339 or YYYY-MM-DD, UTC) [default: now].
        #[arg(long)]
        at: Option<String>,
        /// The archive (file or postgres:// URL) [default: $FATPIPE_ARCHIVE, then the user's data directory].
        #[arg(long, value_name = "LOCATION")]
        archive: Option<String>,
    },
    /// List the annotations, on one path or all.
    Notes {
        /// The path key.
        path: Option<String>,
        /// The archive (file or postgres:// URL) [default: $FATPIPE_ARCHIVE, then the user's data directory].
        #[arg(long, value_name = "LOCATION")]
        archive: Option<String>,
    },
    /// This host's facts as JSON (what runs are stored with).
    #[command(hide = true)]
    Facts,
}

/// Which runs: the selection flags `list`, `export` and `report` share.
#[derive(Debug, Default, clap::Args)]
pub struct Select {
    /// The archive (file or postgres:// URL) [default: $FATPIPE_ARCHIVE, then the user's data directory].
    #[arg(long, value_name = "LOCATION")]
    pub archive: Option<String>,
    /// Runs of this sweep.
    #[arg(long)]
    pub sweep: Option<String>,
    /// Runs over this path key.
    #[arg(long)]
    pub path: Option<String>,
    /// Runs of this command: test, copy or path.
    #[arg(long)]
    pub kind: Option<String>,
    /// Runs started at or after this (RFC 3339 or YYYY-MM-DD, UTC).
    #[arg(long)]
    pub since: Option<String>,
    /// Runs started before this (RFC 3339 or YYYY-MM-DD, UTC).
    #[arg(long)]
    pub until: Option<String>,
    /// Only failed runs.
    #[arg(long, conflicts_with = "ok")]
    pub failed: bool,
    /// Only successful runs.
    #[arg(long)]
    pub ok: bool,
    /// At most this many runs.
    #[arg(long)]
    pub limit: Option<u64>,
}

/// Runs `fatpipe archive`.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.cmd {
        Cmd::List { select, json } => list(&select, json),
        Cmd::Show { id, json, archive } => show(id, json, archive.as_deref()),
        Cmd::Export { select, output } => export(&select, output),
        Cmd::Import { file, archive } => import(&file, archive.as_deref()),
        Cmd::Annotate {
            path,
            note,
            at,
            archive,
        } => annotate(&path, &note, at.as_deref(), archive.as_deref()),
        Cmd::Notes { path, archive } => notes(path.as_deref(), archive.as_deref()),
        Cmd::Facts => {
            let mut out = std::io::stdout().lock();
            serde_json::to_writer(&mut out, &host_facts())?;
            writeln!(out)?;
            Ok(())
        }
    }
}

/// Opens the archive an `--archive` value (or its absence) names.
pub fn open(flag: Option<&str>) -> anyhow::Result<Box<dyn Store>> {
    let loc = Location::resolve(flag).map_err(|e| usage(e.to_string()))?;
    fatpipe_archive::open(&loc).map_err(|e| {
        if e.is_usage() {
            usage(format!("archive {loc}: {e}"))
        } else {
            anyhow::anyhow!("archive {loc}: {e}")
        }
    })
}

impl Select {
    /// The archive filter these flags ask for.
    pub fn filter(&self) -> anyhow::Result<RunFilter> {
        Ok(RunFilter {
            sweep: self.sweep.clone(),
            path: self.path.clone(),
            kind: self
                .kind
                .as_deref()
                .map(|k| {
                    RunKind::parse(k)
                        .ok_or_else(|| usage(format!("--kind: '{k}' is not test, copy or path")))
                })
                .transpose()?,
            ok: match (self.ok, self.failed) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            },
            since: self
                .since
                .as_deref()
                .map(|t| time("--since", t))
                .transpose()?,
            until: self
                .until
                .as_deref()
                .map(|t| time("--until", t))
                .transpose()?,
            limit: self.limit,
            ..RunFilter::default()
        })
    }
}

/// Parses an RFC 3339 time or a UTC date.
pub fn time(flag: &str, s: &str) -> anyhow::Result<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    if let Ok(d) = NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        if let Some(t) = d.and_hms_opt(0, 0, 0) {
            return Ok(t.and_utc());
        }
    }
    Err(usage(format!(
        "{flag}: '{s}' is not a time; give RFC 3339 (2026-11-23T08:00:00Z) or a date (2026-11-23)"
    )))
}

/// Stores the run of one `test`, `copy` or `path` when `--archive` or
/// `FATPIPE_ARCHIVE` asks for it. The archive is opened before the command
/// measures anything, so a wrong location fails at once, not after a long
/// run whose result would then be lost.
pub struct Recorder {
    store: RefCell<Box<dyn Store>>,
    kind: RunKind,
    path: String,
    peer: String,
    started: DateTime<Utc>,
    stored: Cell<bool>,
}

impl Recorder {
    /// A recorder if the user asked for one: `flag` is `--archive`'s value
    /// (`Some("")` for the flag without one), `peer` the server as given.
    pub fn new(flag: Option<&str>, kind: RunKind, peer: &str) -> anyhow::Result<Option<Recorder>> {
        let wanted = flag.is_some() || std::env::var_os(ARCHIVE_ENV).is_some_and(|v| !v.is_empty());
        if !wanted {
            return Ok(None);
        }
        let store = open(flag)?;
        Ok(Some(Recorder {
            store: RefCell::new(store),
            kind,
            path: path_key(peer),
            peer: peer.to_string(),
            started: Utc::now(),
            stored: Cell::new(false),
        }))
    }

    /// Stores a finished run.
    pub fn store(&self, run: fatpipe_archive::Result<Run>) -> anyhow::Result<()> {
        let run = run
            .map_err(|e| anyhow::anyhow!("archive: {e}"))?
            .with_peer(self.peer.clone());
        self.insert(run)
    }

    /// A test's report.
    pub fn test(&self, r: &fatpipe_schema::test::TestReport) -> anyhow::Result<()> {
        self.store(Run::from_test(r, &self.path, host_facts(), Utc::now()))
    }

    /// A `test -u --find-max` report: one run per length, each filed as a
    /// repetition of its length's cell under the sweep name `find-max`
    /// (see `fatpipe_archive::find_max_cell`), so `fatpipe report` sets
    /// the loss-free rate against the length.
    pub fn find_max(&self, r: &fatpipe_schema::test::FindMaxReport) -> anyhow::Result<()> {
        let runs = Run::from_find_max(r, &self.path, host_facts(), Utc::now())
            .map_err(|e| anyhow::anyhow!("archive: {e}"))?;
        let done = {
            let mut store = self.store.borrow_mut();
            let loc = store.location();
            store
                .done_runs(fatpipe_archive::FIND_MAX_SWEEP)
                .with_context(|| format!("archive {loc}: the result was printed but not stored"))?
        };
        let runs: Vec<Run> = runs
            .into_iter()
            .zip(&r.lengths)
            .map(|(run, l)| {
                let cell = fatpipe_archive::find_max_cell(r, l);
                let rep = done
                    .iter()
                    .filter(|d| d.cell == cell)
                    .map(|d| d.repetition + 1)
                    .max()
                    .unwrap_or(0);
                run.with_peer(self.peer.clone()).with_sweep(
                    fatpipe_archive::FIND_MAX_SWEEP,
                    cell,
                    rep,
                )
            })
            .collect();
        self.insert_all(&runs)
    }

    /// A copy's report.
    pub fn copy(&self, r: &fatpipe_schema::copy::CopyReport) -> anyhow::Result<()> {
        self.store(Run::from_copy(r, &self.path, host_facts(), Utc::now()))
    }

    /// A path probe's report.
    pub fn path(&self, r: &fatpipe_schema::path::PathReport) -> anyhow::Result<()> {
        self.store(Run::from_path(r, &self.path, host_facts(), Utc::now()))
    }

    /// Stores the command's failure unless its run is stored already. A
    /// failure to store is said, not raised: the command's own error is
    /// the one to report.
    pub fn failed(&self, err: &anyhow::Error) {
        // A mistake in the flags measured nothing: not a run.
        if self.stored.get() || err.chain().any(|e| e.is::<crate::exit::UsageError>()) {
            return;
        }
        let run = Run::failed(
            self.kind,
            &self.path,
            host_facts(),
            self.started,
            Utc::now(),
            crate::exit::one_line(err),
        )
        .with_peer(self.peer.clone());
        if let Err(e) = self.insert(run) {
            eprintln!("fatpipe: warning: {}", crate::exit::one_line(&e));
        }
    }

    fn insert(&self, run: Run) -> anyhow::Result<()> {
        self.insert_all(std::slice::from_ref(&run))
    }

    fn insert_all(&self, runs: &[Run]) -> anyhow::Result<()> {
        let mut store = self.store.borrow_mut();
        let loc = store.location();
        store
            .insert_runs(runs)
            .with_context(|| format!("archive {loc}: the result was printed but not stored"))?;
        self.stored.set(true);
        Ok(())
    }
}

/// The archive's path key for a run from this host to `peer` (HOST,
/// HOST:PORT, [v6]:PORT, or a copy's HOST:EXPORT/PATH): `thishost→peer`,
/// without the port, so runs on one path group whatever port was used.
pub fn path_key(peer: &str) -> String {
    let host = if let Some(rest) = peer.strip_prefix('[') {
        rest.split(']').next().unwrap_or(rest)
    } else {
        peer.split(':').next().unwrap_or(peer)
    };
    format!("{}→{host}", hostname())
}

/// What explains a result and is not in it: this host's kernel, CPU, the
/// sysctls that decide throughput (as this network namespace sees them)
/// and its NICs.
pub fn host_facts() -> HostFacts {
    let host = Host::live();
    let facts = host.collect(None);
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    HostFacts {
        hostname: hostname(),
        os: std::env::consts::OS.to_string(),
        kernel: host
            .sysctl("kernel.osrelease")
            .known()
            .cloned()
            .unwrap_or_default(),
        fatpipe_version: env!("CARGO_PKG_VERSION").to_string(),
        cpu_model: cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default(),
        cpu_count: std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(0),
        sysctls: facts
            .sysctls
            .iter()
            .filter_map(|(k, v)| v.known().map(|v| (k.clone(), v.clone())))
            .collect(),
        nics: facts
            .nics
            .iter()
            .map(|n| NicFacts {
                name: n.name.clone(),
                driver: n.driver.known().cloned(),
                speed_mbps: n.speed_mbps.known().copied(),
                mtu: n.mtu.known().copied(),
            })
            .collect(),
    }
}

fn hostname() -> String {
    Host::live()
        .sysctl("kernel.hostname")
        .known()
        .cloned()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

fn list(select: &Select, json: bool) -> anyhow::Result<()> {
    let mut store = open(select.archive.as_deref())?;
    let filter = select.filter()?;
    let mut out = std::io::stdout().lock();
    let runs = store.runs(&filter)?;
    if json {
        for mut r in runs {
            r.document = None;
            writeln!(out, "{}", serde_json::to_string(&r)?)?;
        }
        return Ok(out.flush()?);
    }
    if runs.is_empty() {
        writeln!(out, "no runs in {} match", store.location())?;
        return Ok(());
    }
    writeln!(
        out,
        "{:>6}  {:<19}  {:<4}  {:<24}  {:<34}  result",
        "id", "started (UTC)", "cmd", "path", "sweep cell #rep"
    )?;
    for r in &runs {
        let place = match &r.sweep {
            Some(s) => format!("{} {} #{}", s.sweep, short_cell(&s.cell), s.repetition),
            None => "-".into(),
        };
        let result = match &r.status {
            RunStatus::Ok => r
                .metrics
                .throughput_bps
                .map(units::format_rate)
                .unwrap_or_else(|| "ok".into()),
            RunStatus::Failed(e) => format!("failed: {e}"),
        };
        writeln!(
            out,
            "{:>6}  {:<19}  {:<4}  {:<24}  {:<34}  {}",
            r.id.unwrap_or(0),
            r.started.format("%Y-%m-%d %H:%M:%S"),
            r.kind.as_str(),
            r.path,
            place,
            result
        )?;
    }
    Ok(out.flush()?)
}

/// A cell key for one line: `mtu=9000 window=1M`.
fn short_cell(key: &str) -> String {
    let params = fatpipe_sweep::key_params(key);
    if params.is_empty() {
        return key.to_string();
    }
    params
        .iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => format!("{k}={s}"),
            other => format!("{k}={other}"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn show(id: i64, json: bool, archive: Option<&str>) -> anyhow::Result<()> {
    let mut store = open(archive)?;
    let filter = RunFilter {
        after_id: Some(id - 1),
        limit: Some(1),
        ..RunFilter::default()
    };
    let run = store
        .runs(&filter)?
        .into_iter()
        .find(|r| r.id == Some(id))
        .ok_or_else(|| usage(format!("archive {}: no run {id}", store.location())))?;
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&run)?)?;
        return Ok(out.flush()?);
    }
    writeln!(out, "run {id} ({})", run.uuid)?;
    writeln!(out, "  command   {}", run.kind.as_str())?;
    writeln!(
        out,
        "  time      {} → {} UTC",
        run.started.format("%Y-%m-%d %H:%M:%S%.3f"),
        run.finished.format("%H:%M:%S%.3f")
    )?;
    match &run.status {
        RunStatus::Ok => writeln!(out, "  status    ok")?,
        RunStatus::Failed(e) => writeln!(out, "  status    failed: {e}")?,
    }
    writeln!(out, "  path      {}", run.path)?;
    if let Some(p) = &run.peer {
        writeln!(out, "  peer      {p}")?;
    }
    if let Some(s) = &run.sweep {
        writeln!(
            out,
            "  sweep     {} cell {} repetition {}",
            s.sweep,
            short_cell(&s.cell),
            s.repetition
        )?;
    }
    let h = &run.host;
    writeln!(
        out,
        "  host      {} ({} {}, {} × {}, fatpipe {})",
        h.hostname, h.os, h.kernel, h.cpu_count, h.cpu_model, h.fatpipe_version
    )?;
    for (k, v) in &h.sysctls {
        writeln!(out, "            {k} = {v}")?;
    }
    for n in &h.nics {
        writeln!(
            out,
            "  nic       {} driver {} speed {} mtu {}",
            n.name,
            n.driver.as_deref().unwrap_or("-"),
            n.speed_mbps
                .map(|s| format!("{s} Mbit/s"))
                .unwrap_or_else(|| "-".into()),
            n.mtu.map(|m| m.to_string()).unwrap_or_else(|| "-".into())
        )?;
    }
    if let Some(l) = &run.link {
        writeln!(out, "  link      {l}")?;
    }
    if let Some(d) = &run.document {
        let v: serde_json::Value = d.parse()?;
        writeln!(out, "  document:")?;
        // Written as one string so that a closed pipe (`| head`) is an
        // io::Error, which exits quietly, not a serde error.
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
    }
    Ok(out.flush()?)
}

fn export(select: &Select, output: Option<PathBuf>) -> anyhow::Result<()> {
    let mut store = open(select.archive.as_deref())?;
    let filter = select.filter()?;
    let n = match &output {
        Some(path) => {
            let f = std::fs::File::create(path)
                .with_context(|| format!("export: create {}", path.display()))?;
            let mut w = std::io::BufWriter::new(f);
            let n = fatpipe_archive::export_jsonl(store.as_mut(), &filter, &mut w)?;
            w.into_inner()
                .map_err(|e| e.into_error())
                .and_then(|f| f.sync_all())
                .with_context(|| format!("export: write {}", path.display()))?;
            n
        }
        None => {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            fatpipe_archive::export_jsonl(store.as_mut(), &filter, &mut out)?
        }
    };
    eprintln!("fatpipe: exported {n} runs from {}", store.location());
    Ok(())
}

fn import(file: &std::path::Path, archive: Option<&str>) -> anyhow::Result<()> {
    let mut store = open(archive)?;
    let summary = if file.as_os_str() == "-" {
        let mut input = std::io::stdin().lock();
        fatpipe_archive::import_jsonl(store.as_mut(), &mut input)
    } else {
        let f = std::fs::File::open(file)
            .map_err(|e| usage(format!("import: {}: {e}", file.display())))?;
        fatpipe_archive::import_jsonl(store.as_mut(), &mut BufReader::new(f))
    }
    .map_err(|e| {
        if e.is_usage() {
            usage(format!("import {}: {e}", file.display()))
        } else {
            anyhow::anyhow!("import {}: {e}", file.display())
        }
    })?;
    println!(
        "imported into {}: {} runs added, {} already there; {} annotations added, {} already there",
        store.location(),
        summary.runs_added,
        summary.runs_present,
        summary.annotations_added,
        summary.annotations_present
    );
    Ok(())
}

fn annotate(path: &str, note: &str, at: Option<&str>, archive: Option<&str>) -> anyhow::Result<()> {
    if path.trim().is_empty() || note.trim().is_empty() {
        return Err(usage("annotate: give a path key and a note"));
    }
    let at = at
        .map(|t| time("--at", t))
        .transpose()?
        .unwrap_or_else(Utc::now);
    let mut store = open(archive)?;
    let a = Annotation::new(path, at, note);
    let ids = store.add_annotations(std::slice::from_ref(&a))?;
    match ids.ids.first().copied().flatten() {
        Some(id) => println!(
            "note {id} on {path} at {}: {note}",
            a.at.format("%Y-%m-%d %H:%M:%S UTC")
        ),
        None => println!("the same note is already on {path} at that time"),
    }
    Ok(())
}

fn notes(path: Option<&str>, archive: Option<&str>) -> anyhow::Result<()> {
    let mut store = open(archive)?;
    let mut out = std::io::stdout().lock();
    for a in store.annotations(path)? {
        writeln!(
            out,
            "{:>5}  {}  {}  {}",
            a.id.unwrap_or(0),
            a.at.format("%Y-%m-%d %H:%M:%S"),
            a.path,
            a.note
        )?;
    }
    Ok(out.flush()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_keys_drop_the_port_and_keep_the_host() {
        let me = hostname();
        assert_eq!(path_key("dtn2:5202"), format!("{me}→dtn2"));
        assert_eq!(path_key("[2001:2::2]:5202"), format!("{me}→2001:2::2"));
        assert_eq!(path_key("dtn2"), format!("{me}→dtn2"));
        assert_eq!(path_key("dtn2:data/x"), format!("{me}→dtn2"));
    }

    #[test]
    fn times_are_rfc3339_or_dates() {
        assert_eq!(
            time("--since", "2026-11-23").unwrap().to_rfc3339(),
            "2026-11-23T00:00:00+00:00"
        );
        assert_eq!(
            time("--since", "2026-11-23T08:00:00+01:00")
                .unwrap()
                .to_rfc3339(),
            "2026-11-23T07:00:00+00:00"
        );
        assert!(time("--since", "yesterday").is_err());
    }

    #[test]
    fn host_facts_name_this_host() {
        let f = host_facts();
        assert!(!f.hostname.is_empty());
        assert!(!f.kernel.is_empty());
        assert!(f.cpu_count >= 1);
        assert!(
            f.sysctls.contains_key("net.core.rmem_max"),
            "{:?}",
            f.sysctls
        );
    }
}
