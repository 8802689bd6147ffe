//! Running a sweep: bring up what the runs need, run each as the real
//! `fatpipe` command with `--json`, store every result the moment it
//! exists, and keep going when one fails.
//!
//! Each run is a separate process of this same executable, exactly the
//! command a user would type (the archive keeps the command line), so a
//! sweep measures what `test`, `copy` and `path` measure and a crash or a
//! hang in one run cannot take the sweep with it. A run is stored as soon
//! as it ends, before the next starts: an interrupted sweep loses at most
//! the run in flight, and rerunning the file asks the archive which
//! (cell, repetition) pairs it holds and does only the others.
//!
//! For a lab target the sweep brings up one emulated link per MTU in the
//! matrix (the MTU is fixed when a link comes up), each with a `fatpipe
//! server` in its far end, and changes the link's rate, RTT, loss, queue or
//! jitter between runs with `Lab::set`, which takes effect at once. The
//! labs are owned by this process and removed when it ends, however it
//! ends.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chrono::Utc;
use fatpipe_archive::{Annotation, HostFacts, Run, RunKind, Store};
use fatpipe_lab::{End, Lab, LinkChange, LinkSpec, QueueSpec, UpOptions};
use fatpipe_schema::copy::CopyReport;
use fatpipe_schema::path::PathReport;
use fatpipe_schema::test::{FindMaxReport, TestReport};
use fatpipe_schema::units;

use crate::error::SweepError;
use crate::experiment::{arg, Experiment, Param, Target};
use crate::plan::{self, Cell, Endpoint};

/// A copy cell's dataset size when the file gives none.
pub const DEFAULT_COPY_SIZE: u64 = 256 << 20;
/// Longest a run may take beyond its estimate before it is ended as hung:
/// the estimate times this, plus [`HANG_GRACE`].
const HANG_FACTOR: u32 = 4;
/// See [`HANG_FACTOR`].
const HANG_GRACE: Duration = Duration::from_secs(60);

/// What the caller sees while the sweep runs.
#[derive(Debug)]
pub enum Event<'a> {
    /// A lab link is being brought up (the first run of an MTU).
    LabUp {
        /// The lab's name.
        name: &'a str,
        /// Its link.
        link: String,
    },
    /// A phase's annotation was stored.
    Annotated(&'a Annotation),
    /// A run starts.
    Start {
        /// Runs finished so far (this sweep invocation).
        done: usize,
        /// Runs this invocation will do.
        total: usize,
        /// The cell.
        cell: &'a Cell,
        /// Its repetition.
        repetition: u32,
        /// Estimated time left, this run included.
        eta: Duration,
    },
    /// A run ended and was stored.
    Finish {
        /// Runs finished so far, this one included.
        done: usize,
        /// Runs this invocation will do.
        total: usize,
        /// The cell.
        cell: &'a Cell,
        /// Its repetition.
        repetition: u32,
        /// The stored run.
        run: &'a Run,
        /// How long the command ran.
        took: Duration,
    },
}

/// What a sweep invocation did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Outcome {
    /// The sweep's name.
    pub sweep: String,
    /// Cells in the experiment.
    pub cells: usize,
    /// Runs the experiment asks for in all.
    pub runs_total: usize,
    /// Runs already in the archive when this invocation started.
    pub runs_already: usize,
    /// Runs this invocation did.
    pub runs_done: usize,
    /// Of those, failed (stored with their error).
    pub runs_failed: usize,
    /// Wall-clock seconds of the whole invocation.
    pub seconds: f64,
    /// Seconds the run commands themselves took.
    pub run_seconds: f64,
    /// The rest: lab set-up, link changes, storing, host facts.
    pub overhead_seconds: f64,
    /// The archive's row ids of the runs stored.
    pub run_ids: Vec<i64>,
}

/// Runs what is missing of `e` into `store`; `exe` is the fatpipe binary
/// (this one). `on_event` sees each step.
pub fn run(
    e: &Experiment,
    exe: &Path,
    store: &mut dyn Store,
    on_event: &mut dyn FnMut(Event<'_>),
) -> Result<Outcome, SweepError> {
    let started = Instant::now();
    let (cells, todo) = pending(e, store)?;
    let runs_total = cells.len() * e.repetitions as usize;
    let mut out = Outcome {
        sweep: e.name.clone(),
        cells: cells.len(),
        runs_total,
        runs_already: runs_total - todo.len(),
        runs_done: 0,
        runs_failed: 0,
        seconds: 0.0,
        run_seconds: 0.0,
        overhead_seconds: 0.0,
        run_ids: Vec::new(),
    };
    if todo.is_empty() {
        out.seconds = started.elapsed().as_secs_f64();
        return Ok(out);
    }
    let work = WorkDir::new()?;
    let mut place = Place::new(e, exe, &work)?;
    // Host facts are read once per place and sysctl state.
    let mut facts: BTreeMap<(u32, bool), HostFacts> = BTreeMap::new();
    let mut annotated: BTreeSet<usize> = BTreeSet::new();
    let mut estimate_left = plan::total_estimate(&cells, &todo);
    // Observed run time over estimated, to correct the ETA as runs finish.
    let (mut est_done, mut real_done) = (Duration::ZERO, Duration::ZERO);

    for (i, p) in todo.iter().enumerate() {
        let cell = &cells[p.cell];
        if annotated.insert(cell.phase) {
            if let Some(note) = &e.phases[cell.phase].annotate {
                annotate_once(store, &e.path, note, on_event)?;
            }
        }
        let est = plan::estimate(cell);
        let scale = if est_done.is_zero() {
            1.0
        } else {
            real_done.as_secs_f64() / est_done.as_secs_f64()
        };
        on_event(Event::Start {
            done: i,
            total: todo.len(),
            cell,
            repetition: p.repetition,
            eta: estimate_left.mul_f64(scale.clamp(0.2, 5.0)),
        });
        let endpoint = place.prepare(cell, on_event)?;
        let state = endpoint.lab;
        let host = match facts.get(&state) {
            Some(f) => f.clone(),
            None => {
                let f = place.host_facts(endpoint.lab)?;
                facts.insert(state, f.clone());
                f
            }
        };
        let args = plan::argv(cell, &endpoint.endpoint);
        let t0 = Utc::now();
        let began = Instant::now();
        let result = place.run_command(endpoint.lab, &args, est * HANG_FACTOR + HANG_GRACE);
        let took = began.elapsed();
        let t1 = Utc::now();
        place.after_run(&endpoint);
        let mut run = match result.and_then(|stdout| build_run(cell, &stdout, &e.path, &host, t1)) {
            Ok(r) => r,
            Err(why) => {
                out.runs_failed += 1;
                Run::failed(kind_of(cell), &e.path, host.clone(), t0, t1, why)
            }
        };
        run = run.with_sweep(&e.name, &cell.key, p.repetition);
        run.peer = Some(endpoint.endpoint.server.clone());
        if let Some(link) = endpoint.link {
            run = run.with_link(link);
        }
        let ids = store.insert_runs(std::slice::from_ref(&run))?;
        run.id = ids.ids.first().copied().flatten();
        if let Some(id) = run.id {
            out.run_ids.push(id);
        }
        out.runs_done += 1;
        out.run_seconds += took.as_secs_f64();
        est_done += est;
        real_done += took;
        estimate_left = estimate_left.saturating_sub(est);
        on_event(Event::Finish {
            done: i + 1,
            total: todo.len(),
            cell,
            repetition: p.repetition,
            run: &run,
            took,
        });
    }
    place.shutdown()?;
    out.seconds = started.elapsed().as_secs_f64();
    out.overhead_seconds = (out.seconds - out.run_seconds).max(0.0);
    Ok(out)
}

/// The cells of `e` and, in the order they run, the runs `store` does not
/// hold yet (a repetition whose stored runs all failed is run again).
pub fn pending(
    e: &Experiment,
    store: &mut dyn Store,
) -> Result<(Vec<Cell>, Vec<plan::Planned>), SweepError> {
    let cells = plan::cells(e);
    let done: BTreeSet<(String, u32)> = store
        .done_runs(&e.name)?
        .into_iter()
        .filter(|d| d.ok)
        .map(|d| (d.cell, d.repetition))
        .collect();
    let todo = plan::schedule(e, &cells, &done);
    Ok((cells, todo))
}

/// Which command a cell runs.
pub fn kind_of(cell: &Cell) -> RunKind {
    match arg(&cell.params, "command").as_deref() {
        Some("copy") => RunKind::Copy,
        Some("path") => RunKind::Path,
        _ => RunKind::Test,
    }
}

/// Stores `note` on `path` unless the same note is already there (a
/// resumed sweep must not date the upgrade twice).
fn annotate_once(
    store: &mut dyn Store,
    path: &str,
    note: &str,
    on_event: &mut dyn FnMut(Event<'_>),
) -> Result<(), SweepError> {
    if store
        .annotations(Some(path))?
        .iter()
        .any(|a| a.note == note)
    {
        return Ok(());
    }
    let a = Annotation::new(path, Utc::now(), note);
    store.add_annotations(std::slice::from_ref(&a))?;
    on_event(Event::Annotated(&a));
    Ok(())
}

/// The archive's run from a command's `--json` output.
fn build_run(
    cell: &Cell,
    stdout: &[u8],
    path: &str,
    host: &HostFacts,
    finished: chrono::DateTime<Utc>,
) -> Result<Run, String> {
    let bad = |e: serde_json::Error| format!("unreadable result document: {e}");
    let run = match kind_of(cell) {
        RunKind::Test if arg(&cell.params, "find_max").as_deref() == Some("true") => {
            let r: FindMaxReport = serde_json::from_slice(stdout).map_err(bad)?;
            // A cell has one length (`length` is one size), so one run.
            let runs = Run::from_find_max(&r, path, host.clone(), finished);
            match runs
                .map(Vec::into_iter)
                .map(|mut it| (it.next(), it.next()))
            {
                Ok((Some(run), None)) => Ok(run),
                Ok(_) => {
                    return Err(format!(
                        "a find_max cell searches one length; the result has {}",
                        r.lengths.len()
                    ))
                }
                Err(e) => Err(e),
            }
        }
        RunKind::Test => {
            let r: TestReport = serde_json::from_slice(stdout).map_err(bad)?;
            Run::from_test(&r, path, host.clone(), finished)
        }
        RunKind::Copy => {
            let r: CopyReport = serde_json::from_slice(stdout).map_err(bad)?;
            Run::from_copy(&r, path, host.clone(), finished)
        }
        RunKind::Path => {
            let r: PathReport = serde_json::from_slice(stdout).map_err(bad)?;
            Run::from_path(&r, path, host.clone(), finished)
        }
    };
    run.map_err(|e| e.to_string())
}

/// Where the runs go and what was set up for them.
enum Place {
    /// A remote (or local) `fatpipe server` the user runs.
    Server {
        exe: PathBuf,
        host: String,
        key_file: Option<String>,
        export: Option<String>,
        data: PathBuf,
    },
    /// Emulated links, one per MTU, brought up on first use.
    Lab {
        exe: PathBuf,
        labs: BTreeMap<LabKey, LabEnd>,
        data: PathBuf,
        prefix: String,
        host_tuning: HostTuning,
    },
}

/// A lab is chosen by its MTU (fixed at `lab up`) and whether it was made
/// for tuned runs (a namespace takes its TCP buffer sysctls from the host
/// when it is made).
type LabKey = (u32, bool);

/// One lab link and the server in its far end.
struct LabEnd {
    lab: Lab,
    server: ChildGuard,
    port: u16,
    export: PathBuf,
    spec: LinkSpec,
}

/// What [`Place::prepare`] set up for one run.
struct Prepared {
    endpoint: Endpoint,
    /// Which lab (none for a server target: `(0, false)`).
    lab: LabKey,
    link: Option<serde_json::Value>,
    /// Files the run leaves that the next must not see.
    scratch: Option<PathBuf>,
}

/// A child process ended by PID and reaped when dropped.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The sweep's scratch directory (datasets, lab exports), removed at the end.
struct WorkDir(PathBuf);

impl WorkDir {
    fn new() -> Result<WorkDir, SweepError> {
        let dir = std::env::temp_dir().join(format!("fatpipe-sweep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| SweepError::Io {
            what: format!("create {}", dir.display()),
            source: e,
        })?;
        Ok(WorkDir(dir))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Place {
    fn new(e: &Experiment, exe: &Path, work: &WorkDir) -> Result<Place, SweepError> {
        Ok(match &e.target {
            Target::Server {
                host,
                key_file,
                export,
            } => Place::Server {
                exe: exe.to_path_buf(),
                host: host.clone(),
                key_file: key_file.as_ref().map(|k| k.display().to_string()),
                export: export.clone(),
                data: work.0.clone(),
            },
            Target::Lab => {
                if !fatpipe_sys::process::is_root() {
                    return Err(SweepError::NeedRoot);
                }
                Place::Lab {
                    exe: exe.to_path_buf(),
                    labs: BTreeMap::new(),
                    data: work.0.clone(),
                    prefix: format!("sw{}", std::process::id() % 100_000),
                    host_tuning: HostTuning {
                        tuned: false,
                        backup: std::env::temp_dir()
                            .join(format!("fatpipe-sweep-tune-{}", std::process::id())),
                    },
                }
            }
        })
    }

    /// Makes the place ready for `cell`: the lab of its MTU up with its
    /// link, the dataset of a copy cell generated.
    fn prepare(
        &mut self,
        cell: &Cell,
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<Prepared, SweepError> {
        let copy = kind_of(cell) == RunKind::Copy;
        let pull = arg(&cell.params, "direction").as_deref() == Some("down");
        match self {
            Place::Server {
                host,
                key_file,
                export,
                data,
                ..
            } => {
                let mut copy_paths = None;
                if copy {
                    let export = export.clone().unwrap_or_default();
                    if pull {
                        return Err(SweepError::Unsupported(
                            "copy cells with direction = \"down\" need a lab target (the dataset must be on the server)".into(),
                        ));
                    }
                    let set = dataset(data, &cell.params)?;
                    let dest = format!("{{host}}:{export}/fatpipe-sweep-{}", uuid_like());
                    copy_paths = Some((format!("{}/", set.display()), dest));
                }
                Ok(Prepared {
                    endpoint: Endpoint {
                        server: host.clone(),
                        key_file: key_file.clone(),
                        copy_paths,
                    },
                    lab: (0, false),
                    link: None,
                    scratch: None,
                })
            }
            Place::Lab {
                exe,
                labs,
                data,
                prefix,
                host_tuning,
            } => {
                let want = link_spec(&cell.params)?;
                let tuned = arg(&cell.params, "tuning").as_deref() == Some("tuned");
                // The host first: a lab made for tuned runs must be made
                // while the host is tuned, and the host's net.core limits
                // (not per namespace) must be raised while tuned runs go.
                if tuned != host_tuning.tuned {
                    host_tuning.set(tuned, &want, exe)?;
                }
                let key = (want.mtu, tuned);
                if !labs.contains_key(&key) {
                    let name = format!("{prefix}-{}", labs.len());
                    on_event(Event::LabUp {
                        name: &name,
                        link: want.summary(),
                    });
                    let end = LabEnd::up(&name, &want, exe, data)?;
                    labs.insert(key, end);
                }
                let Some(end) = labs.get_mut(&key) else {
                    return Err(SweepError::Unsupported("lab vanished".into()));
                };
                if end.spec != want {
                    end.spec = end.lab.set(&change_to(&want))?;
                }
                let host = end.lab.addr(End::B).to_string();
                let mut copy_paths = None;
                let mut scratch = None;
                if copy {
                    let run = format!("run-{}", uuid_like());
                    if pull {
                        let set = dataset(&end.export, &cell.params)?;
                        let name = set
                            .file_name()
                            .map(|n| n.to_string_lossy().into_owned())
                            .unwrap_or_default();
                        let local = data.join(&run);
                        copy_paths = Some((
                            format!("{{host}}:sweep/{name}/"),
                            local.display().to_string(),
                        ));
                        scratch = Some(local);
                    } else {
                        let set = dataset(data, &cell.params)?;
                        copy_paths = Some((
                            format!("{}/", set.display()),
                            format!("{{host}}:sweep/{run}"),
                        ));
                        scratch = Some(end.export.join(&run));
                    }
                }
                Ok(Prepared {
                    endpoint: Endpoint {
                        server: format!("{host}:{}", end.port),
                        key_file: None,
                        copy_paths,
                    },
                    lab: key,
                    link: serde_json::to_value(&end.spec).ok(),
                    scratch,
                })
            }
        }
    }

    /// Removes what a run left (a copy's destination tree).
    fn after_run(&self, p: &Prepared) {
        if let Some(dir) = &p.scratch {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    /// This host's facts as seen where the runs start (in a lab, inside its
    /// near namespace, whose TCP sysctls are its own).
    fn host_facts(&self, lab: LabKey) -> Result<HostFacts, SweepError> {
        let out = self
            .command(lab)?
            .args(["archive", "facts"])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .map_err(|e| SweepError::Io {
                what: "run fatpipe archive facts".into(),
                source: e,
            })?;
        serde_json::from_slice(&out.stdout)
            .map_err(|e| SweepError::Unsupported(format!("fatpipe archive facts: {e}")))
    }

    fn command(&self, lab: LabKey) -> Result<Command, SweepError> {
        match self {
            Place::Server { exe, .. } => Ok(Command::new(exe)),
            Place::Lab { exe, labs, .. } => labs
                .get(&lab)
                .map(|l| l.lab.command(End::A, exe))
                .ok_or_else(|| SweepError::Unsupported("no lab for this MTU".into())),
        }
    }

    /// Runs `fatpipe ARGS` where the runs start; its stdout on success, its
    /// error line on failure. A run that outlives `limit` is ended.
    fn run_command(
        &self,
        lab: LabKey,
        args: &[String],
        limit: Duration,
    ) -> Result<Vec<u8>, String> {
        let mut cmd = self.command(lab).map_err(|e| e.to_string())?;
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start fatpipe: {e}"))?;
        // Both pipes are drained on threads so that a chatty child never
        // blocks on a full pipe while we wait for it.
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let out_t = std::thread::spawn(move || drain(stdout));
        let err_t = std::thread::spawn(move || drain(stderr));
        let start = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if start.elapsed() > limit => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(format!("waiting for fatpipe: {e}")),
            }
        };
        let stdout = out_t.join().unwrap_or_default();
        let stderr = err_t.join().unwrap_or_default();
        match status {
            None => Err(format!(
                "ended after {} (hung: its estimate was {})",
                units::format_duration(start.elapsed()),
                units::format_duration(limit)
            )),
            Some(s) if s.success() => Ok(stdout),
            Some(s) => Err(error_line(&stderr).unwrap_or_else(|| format!("fatpipe {s}"))),
        }
    }

    fn shutdown(self) -> Result<(), SweepError> {
        if let Place::Lab {
            labs,
            exe,
            mut host_tuning,
            ..
        } = self
        {
            for (_, end) in labs {
                drop(end.server);
                end.lab.down()?;
            }
            if host_tuning.tuned {
                host_tuning.set(false, &LinkSpec::default(), &exe)?;
            }
            let _ = std::fs::remove_dir_all(&host_tuning.backup);
        }
        Ok(())
    }
}

impl LabEnd {
    fn up(name: &str, spec: &LinkSpec, exe: &Path, data: &Path) -> Result<LabEnd, SweepError> {
        let opts = UpOptions {
            exe: Some(exe.to_path_buf()),
            owner: Some(std::process::id()),
        };
        let lab = Lab::up(name, spec, &opts)?;
        let export = data.join(format!("export-{name}"));
        std::fs::create_dir_all(&export).map_err(|e| SweepError::Io {
            what: format!("create {}", export.display()),
            source: e,
        })?;
        let mut cmd = lab.command(End::B, exe);
        cmd.arg("server")
            .args(["--port", "0", "--export"])
            .arg(format!("sweep={}:public", export.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().map_err(|e| SweepError::Io {
            what: "start fatpipe server in the lab".into(),
            source: e,
        })?;
        let stdout = child.stdout.take();
        let server = ChildGuard(child);
        let mut line = String::new();
        if let Some(s) = stdout {
            let _ = BufReader::new(s).read_line(&mut line);
        }
        let port = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse::<u16>().ok())
            .ok_or_else(|| {
                SweepError::Unsupported(format!(
                    "the lab's server did not say where it listens (got {:?})",
                    line.trim()
                ))
            })?;
        Ok(LabEnd {
            lab,
            server,
            port,
            export,
            spec: spec.clone(),
        })
    }
}

/// The host's side of `tuning = "tuned"`: `fatpipe tune --apply` for the
/// link in the host's own namespace, where `net.core.rmem_max`/`wmem_max`
/// (shared by every namespace) can be written; labs made while it is in
/// force take its TCP buffer sysctls. `--revert` undoes it.
struct HostTuning {
    tuned: bool,
    backup: PathBuf,
}

impl HostTuning {
    fn set(&mut self, tuned: bool, link: &LinkSpec, exe: &Path) -> Result<(), SweepError> {
        let rate = match link.rate_up.max(link.rate_down) {
            0 => 10_000_000_000,
            r => r,
        };
        let rtt = link.rtt.max(Duration::from_millis(1));
        let mut cmd = Command::new(exe);
        cmd.arg("tune");
        if tuned {
            cmd.args([
                "--apply".to_string(),
                "--rate".into(),
                rate.to_string(),
                "--rtt".into(),
                format!("{}us", rtt.as_micros()),
            ]);
        } else {
            cmd.arg("--revert");
        }
        let out = cmd
            .arg("--backup-dir")
            .arg(&self.backup)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| SweepError::Io {
                what: "run fatpipe tune".into(),
                source: e,
            })?;
        if !out.status.success() {
            return Err(SweepError::Unsupported(format!(
                "fatpipe tune --{}: {}",
                if tuned { "apply" } else { "revert" },
                error_line(&out.stderr).unwrap_or_default()
            )));
        }
        self.tuned = tuned;
        Ok(())
    }
}

/// The link a cell asks for: the lab's defaults with the cell's link keys.
fn link_spec(p: &BTreeMap<String, Param>) -> Result<LinkSpec, SweepError> {
    let mut s = LinkSpec::default();
    let bad = |k: &str, e: String| SweepError::Unsupported(format!("{k}: {e}"));
    if let Some(v) = arg(p, "rtt") {
        s.rtt = units::parse_duration(&v).map_err(|e| bad("rtt", e.to_string()))?;
    }
    if let Some(v) = arg(p, "rate") {
        let r = if v.eq_ignore_ascii_case("unlimited") {
            0
        } else {
            units::parse_rate(&v).map_err(|e| bad("rate", e.to_string()))?
        };
        s.rate_up = r;
        s.rate_down = r;
    }
    if let Some(v) = arg(p, "loss") {
        s.loss = units::parse_probability(&v).map_err(|e| bad("loss", e.to_string()))?;
    }
    if let Some(v) = arg(p, "loss_burst") {
        s.loss_burst = v.parse().map_err(|_| bad("loss_burst", v.clone()))?;
    }
    if let Some(v) = arg(p, "jitter") {
        s.jitter = units::parse_duration(&v).map_err(|e| bad("jitter", e.to_string()))?;
    }
    if let Some(v) = arg(p, "queue") {
        s.queue = QueueSpec::parse(&v).map_err(|e| bad("queue", e.to_string()))?;
    }
    if let Some(v) = arg(p, "mtu") {
        s.mtu = v.parse().map_err(|_| bad("mtu", v.clone()))?;
    }
    if let Some(v) = arg(p, "overhead") {
        s.overhead = v.parse().map_err(|_| bad("overhead", v.clone()))?;
    }
    Ok(s)
}

/// The change that turns a running link into `want` (everything but the
/// MTU and the seed, which are fixed at `lab up`).
fn change_to(want: &LinkSpec) -> LinkChange {
    LinkChange {
        rtt: Some(want.rtt),
        rate: Some((want.rate_up, want.rate_down)),
        loss: Some(want.loss),
        loss_burst: Some(want.loss_burst),
        jitter: Some(want.jitter),
        queue: Some(want.queue),
        corrupt: Some(want.corrupt),
        tamper: Some(want.tamper),
        overhead: Some(want.overhead),
        down: None,
    }
}

/// The dataset of a copy cell under `dir` (made once per size and count):
/// `files` files of pseudo-random bytes that do not compress, `size` in all.
fn dataset(dir: &Path, p: &BTreeMap<String, Param>) -> Result<PathBuf, SweepError> {
    let size = arg(p, "size")
        .and_then(|s| units::parse_size(&s).ok())
        .unwrap_or(DEFAULT_COPY_SIZE);
    let files = arg(p, "files")
        .and_then(|f| f.parse::<u64>().ok())
        .unwrap_or(1)
        .max(1);
    let set = dir.join(format!("data-{size}-{files}"));
    // The marker sits beside the set, not in it: copy cells send the set.
    let marker = dir.join(format!(".data-{size}-{files}.complete"));
    if marker.exists() {
        return Ok(set);
    }
    let io = |what: String| move |e: std::io::Error| SweepError::Io { what, source: e };
    std::fs::create_dir_all(&set).map_err(io(format!("create {}", set.display())))?;
    let per = size / files;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ size ^ (files << 32);
    let mut buf = vec![0u8; 1 << 20];
    for i in 0..files {
        let len = if i == files - 1 {
            size - per * (files - 1)
        } else {
            per
        };
        let path = set.join(format!("f{i:06}"));
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(&path).map_err(io(format!("create {}", path.display())))?,
        );
        let mut left = len;
        while left > 0 {
            fill(&mut rng, &mut buf);
            let n = left.min(buf.len() as u64) as usize;
            f.write_all(&buf[..n])
                .map_err(io(format!("write {}", path.display())))?;
            left -= n as u64;
        }
        f.flush().map_err(io(format!("write {}", path.display())))?;
    }
    std::fs::write(&marker, b"").map_err(io(format!("write {}", marker.display())))?;
    Ok(set)
}

/// xorshift64*: fast filler so the dataset does not compress.
fn fill(state: &mut u64, buf: &mut [u8]) {
    for chunk in buf.chunks_mut(8) {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        let v = state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

/// A name unique enough for one run's scratch directory.
fn uuid_like() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

fn drain(pipe: Option<impl Read>) -> Vec<u8> {
    let mut buf = Vec::new();
    if let Some(mut p) = pipe {
        let _ = p.read_to_end(&mut buf);
    }
    buf
}

/// The command's own error line (`fatpipe: <error>`, the last line it
/// prints that is not a warning), else its last line.
fn error_line(stderr: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines
        .iter()
        .rev()
        .find(|l| l.starts_with("fatpipe: ") && !l.starts_with("fatpipe: warning"))
        .or(lines.last())
        .map(|l| {
            let l = l.strip_prefix("fatpipe: ").unwrap_or(l);
            l.chars().take(500).collect()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_line_is_the_commands_own() {
        let err =
            b"auto: 4 streams\nfatpipe: 198.18.0.2:4000: connection refused\nfatpipe: warning: x\n";
        assert_eq!(
            error_line(err).as_deref(),
            Some("198.18.0.2:4000: connection refused")
        );
        assert_eq!(error_line(b"boom\n").as_deref(), Some("boom"));
        assert_eq!(error_line(b""), None);
    }

    #[test]
    fn a_cells_link_keys_make_its_spec() {
        let e = crate::Experiment::parse(
            Path::new("l.toml"),
            "name = \"l\"\ntarget = \"lab\"\n[defaults]\nrtt = \"88ms\"\nrate = \"100M\"\n\
             loss = \"0.1%\"\nqueue = \"50ms\"\nmtu = 9000\n",
        )
        .unwrap();
        let s = link_spec(&plan::cells(&e)[0].params).unwrap();
        assert_eq!(s.rtt, Duration::from_millis(88));
        assert_eq!((s.rate_up, s.rate_down), (100_000_000, 100_000_000));
        assert!((s.loss - 0.001).abs() < 1e-12);
        assert_eq!(s.mtu, 9000);
        assert_eq!(change_to(&s).rtt, Some(Duration::from_millis(88)));
    }

    #[test]
    fn datasets_are_made_once_with_the_asked_size() {
        let dir = std::env::temp_dir().join(format!("fatpipe-sweep-ds-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let e = crate::Experiment::parse(
            Path::new("d.toml"),
            "name = \"d\"\ntarget = \"lab\"\n[defaults]\ncommand = \"copy\"\nsize = 100000\nfiles = 3\n",
        )
        .unwrap();
        let p = &plan::cells(&e)[0].params;
        let set = dataset(&dir, p).unwrap();
        let mut total = 0;
        let mut n = 0;
        for entry in std::fs::read_dir(&set).unwrap() {
            total += entry.unwrap().metadata().unwrap().len();
            n += 1;
        }
        assert_eq!((n, total), (3, 100_000));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
