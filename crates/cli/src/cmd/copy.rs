//! `fatpipe copy`: bulk file transfer to or from a `fatpipe server`.
//!
//! Two phases, as in the rest of the binary: clap parses raw [`Args`], then
//! [`plan`] validates them into a [`Plan`] (scp-style `HOST:EXPORT/PATH`
//! split, push or pull decided, sizes and rates parsed through
//! `fatpipe_schema::units`), tested below without a socket. The transfer
//! itself is `fatpipe_transfer::session::run_client_prepared` over the
//! engine-backed `fatpipe_transfer::service::EngineLink`; this module wires
//! it up: it runs the auto-tuning pre-flight (`fatpipe_tune::auto::run`) on
//! a thread beside it (the copy connects while the probe runs and takes the
//! plan just before its request), hands each session to the in-flight
//! tuner (`fatpipe_transfer::tuner`), and renders: the `auto:` lines, the
//! tuner's changes (and its trace behind `FATPIPE_COPY_TRACE`), the
//! progress bar on a terminal, and the report (text or `--json`).
//!
//! The server side is `fatpipe_transfer::service::CopyService`, registered
//! by `fatpipe server`.

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use fatpipe_archive::RunKind;
use fatpipe_engine::server::DEFAULT_PORT;
use fatpipe_proto::escape;
use fatpipe_schema::copy::{
    CopyDirection, CopyFailure, CopyNote, CopyReport, CopyTimeline, COPY_SCHEMA,
    COPY_SCHEMA_VERSION,
};
use fatpipe_schema::tune::{Action, AutoTune};
use fatpipe_schema::units;
use fatpipe_transfer::hash::Algo;
use fatpipe_transfer::live::Live;
use fatpipe_transfer::service::{self, CopyTuning, DataOpts, EngineLink};
use fatpipe_transfer::session::{self, CopyError, Job};
use fatpipe_transfer::tuner::CopyTuner;
use fatpipe_transfer::wire::{Direction, NoteKind, SocketTuning};
use fatpipe_transfer::{FailureKind, Progress};
use fatpipe_tune::auto;
use fatpipe_tune::steer::Event;

use super::archive::Recorder;

/// Streams without auto-tuning and without `-P`.
const DEFAULT_STREAMS: u16 = 4;
/// Chunks big files are cut into. A stream sends a whole chunk, so when the
/// queue runs dry each stream still has up to one chunk to finish and the
/// streams run out one by one over about `chunk × streams / rate`
/// (`fatpipe_tune::ramp::tail_secs`): 8 MiB × 26 streams at 941 Mbit/s
/// would idle the link for about 0.9 s of a 2 GiB copy's 18 s, 2 MiB for
/// 0.23 s. Copies plan more streams than tests (enough for slow start to
/// fill the path in 5 round trips), so the chunk is small. Not derived
/// from the plan: a rerun must cut the same chunks to resume from the
/// journal. A receiving session tracks at most 2^26 chunks, so one copy
/// of 2 MiB chunks takes at most 128 TiB (`--chunk-size 8M`: 512 TiB).
const DEFAULT_CHUNK_SIZE: &str = "auto";
/// Debug hook: print every sample and the adjuster's answer on stderr.
const TRACE_ENV: &str = "FATPIPE_COPY_TRACE";

/// Arguments of `fatpipe copy`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Sources then destination; exactly one side is remote,
    /// HOST:EXPORT/PATH (e.g. `-r run42/ dtn2:data/in` or `dtn2:data/x .`),
    /// or an http(s):// or dav(s):// URL of any WebDAV server (one file:
    /// ranged GETs over several connections, or one PUT; docs/http.md).
    /// Destinations follow rsync: a source directory with a trailing `/`
    /// (or an export, HOST:EXPORT) copies its contents into DEST; without
    /// the `/` the directory itself goes inside DEST. DEST is created if
    /// missing. One file to a DEST that is not a directory and has no
    /// trailing `/` takes DEST's name. So rerunning a command lands where
    /// the first run did and resumes it.
    #[arg(required = true, num_args = 2.., value_name = "SRC... DEST")]
    pub paths: Vec<OsString>,
    /// Copy directories recursively.
    #[arg(short = 'r', long)]
    pub recursive: bool,
    /// Parallel data streams, 1..=256 [default: auto-tuned, 4 with --no-auto].
    #[arg(short = 'P', long)]
    pub parallel: Option<u16>,
    /// Do not auto-tune: 4 streams (unless -P) with the kernel's buffers.
    #[arg(long)]
    pub no_auto: bool,
    /// Server port.
    #[arg(short = 'p', long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Pre-shared key file (must match the server's).
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// Encrypt and authenticate every connection with TLS 1.3 keyed by
    /// --key-file (docs/encryption.md).
    #[arg(long)]
    pub encrypt: bool,
    /// Chunk checksum: `fast` (xxh3-128) or `strong` (BLAKE3).
    #[arg(long, default_value = "fast", value_parser = ["fast", "strong"])]
    pub verify: String,
    /// Chunk size (64K..64M): big files are cut into chunks all streams
    /// share. `auto`: 512K to 2M by the probed rate per stream (2M when
    /// auto-tuning is off); an interrupted copy resumes at any size.
    #[arg(long, default_value = DEFAULT_CHUNK_SIZE)]
    pub chunk_size: String,
    /// Cap the sending rate, e.g. 500M or 2g (bits per second).
    #[arg(long)]
    pub bwlimit: Option<String>,
    /// Big files (more than one chunk) are written with O_DIRECT on the
    /// receiving side by default, where the file system allows it: several
    /// streams writing one file through the page cache contend for its
    /// lock and hit dirty-page throttling (measured 2-5x slower, twice the
    /// CPU). This flag writes through the page cache instead.
    #[arg(long, conflicts_with = "direct")]
    pub buffered: bool,
    /// O_DIRECT for big files (the default; kept for scripts).
    #[arg(long, hide = true)]
    pub direct: bool,
    /// Flush data to disk before journaling a chunk and before renaming a file.
    #[arg(long)]
    pub sync: bool,
    /// Reconnects allowed after a dropped connection before giving up.
    #[arg(long, default_value_t = 8)]
    pub retries: u32,
    /// Send with read+write instead of sendfile.
    #[arg(long)]
    pub no_sendfile: bool,
    /// Print one JSON document (schema fatpipe.copy) instead of text.
    #[arg(long)]
    pub json: bool,
    /// No progress bar and no summary (errors still go to stderr).
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Store the result in the archive: this SQLite file or postgres://
    /// URL, or with no value $FATPIPE_ARCHIVE, else the user's data
    /// directory (also on whenever FATPIPE_ARCHIVE is set). Give it after
    /// the paths, or as --archive=LOCATION.
    #[arg(long, value_name = "LOCATION", num_args = 0..=1, default_missing_value = "")]
    pub archive: Option<String>,
    /// Print auto-tuning's whole reasoning and every pre-flight warning,
    /// not only the one-line choice.
    #[arg(short = 'v', long, conflicts_with = "quiet")]
    pub verbose: bool,
    /// When the copy ends, draw its bytes over time against the path's
    /// capacity, with its timeline marked, into FILE.svg or FILE.png.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// HTTP(S) URLs: a file holding the bearer token sent as
    /// `Authorization: Bearer` (else $BEARER_TOKEN, else the file
    /// $BEARER_TOKEN_FILE names). Never give a token on the command line.
    #[arg(long, value_name = "FILE")]
    pub token: Option<PathBuf>,
    /// HTTPS URLs: trust only the CA certificate(s) in FILE (PEM), as
    /// curl's --cacert (default: the Mozilla roots built in).
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// Two URLs: an HTTP third-party copy (WebDAV COPY, as FTS and
    /// gfal-copy do): `pull` (default) asks the destination to fetch the
    /// file, `push` asks the source to send it.
    #[arg(long, value_name = "pull|push", value_parser = ["pull", "push"])]
    pub tpc: Option<String>,
}

/// A validated copy request.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Server host name or address.
    pub host: String,
    /// Server port.
    pub port: u16,
    /// What the transfer crate runs.
    pub job: JobSpec,
}

/// The part of the plan the transfer crate needs (kept comparable for tests).
#[derive(Debug, Clone, PartialEq)]
pub struct JobSpec {
    /// Push or pull.
    pub push: bool,
    /// Export name.
    pub export: String,
    /// Remote paths (pull: sources; push: the destination).
    pub remote: Vec<Vec<u8>>,
    /// Local sources (push).
    pub local_sources: Vec<PathBuf>,
    /// Local destination (pull).
    pub local_dest: PathBuf,
    /// Chunk size (the auto size's start when `auto_chunk`).
    pub chunk_size: u32,
    /// The plan chooses the chunk size (`--chunk-size auto`).
    pub auto_chunk: bool,
    /// Rate cap, bit/s.
    pub bwlimit: Option<u64>,
    /// Checksum.
    pub strong: bool,
}

/// A `HOST:EXPORT/PATH` argument, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    /// Host (brackets removed from IPv6).
    pub host: String,
    /// Export name.
    pub export: String,
    /// Path inside the export, as typed (may be empty, may end with `/`).
    pub path: Vec<u8>,
}

/// Splits `HOST:EXPORT/PATH`; `None` for a local path. As with scp, a
/// colon counts only before the first slash (`./a:b` is local).
pub fn parse_remote(arg: &[u8]) -> Option<Result<Remote, String>> {
    let (host, rest) = if arg.first() == Some(&b'[') {
        let end = arg.windows(2).position(|w| w == b"]:")?;
        (&arg[1..end], &arg[end + 2..])
    } else {
        let colon = arg.iter().position(|&b| b == b':')?;
        if arg[..colon].contains(&b'/') {
            return None;
        }
        (&arg[..colon], &arg[colon + 1..])
    };
    let shown = String::from_utf8_lossy(arg);
    if host.is_empty() {
        return Some(Err(format!("'{shown}': missing the host before ':'")));
    }
    let Ok(host) = std::str::from_utf8(host) else {
        return Some(Err(format!("'{shown}': the host is not valid text")));
    };
    let (export, path) = match rest.iter().position(|&b| b == b'/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &rest[rest.len()..]),
    };
    if export.is_empty() {
        return Some(Err(format!(
            "'{shown}': name an export after the host (HOST:EXPORT/PATH)"
        )));
    }
    Some(Ok(Remote {
        host: host.to_string(),
        export: String::from_utf8_lossy(export).into_owned(),
        path: path.to_vec(),
    }))
}

/// Validates the arguments into a plan (no I/O).
pub fn plan(args: &Args) -> anyhow::Result<Plan> {
    let usage = |m: String| crate::exit::usage(m);
    let (dest_arg, srcs) = args
        .paths
        .split_last()
        .ok_or_else(|| usage("give at least one source and a destination".into()))?;
    if srcs.is_empty() {
        return Err(usage("give at least one source and a destination".into()));
    }
    if !(1..=session::MAX_STREAMS).contains(&args.parallel.unwrap_or(DEFAULT_STREAMS)) {
        return Err(usage(format!(
            "-P/--parallel must be 1..={}",
            session::MAX_STREAMS
        )));
    }
    let auto_chunk = args.chunk_size == "auto";
    let chunk = if auto_chunk {
        u64::from(fatpipe_tune::plan::AUTO_CHUNK_RANGE.1)
    } else {
        units::parse_size(&args.chunk_size).map_err(|e| usage(e.to_string()))?
    };
    let (lo, hi) = session::CHUNK_LIMITS;
    if chunk < u64::from(lo) || chunk > u64::from(hi) {
        return Err(usage(format!(
            "--chunk-size must be between {} and {}",
            units::format_bytes_iec(u64::from(lo)),
            units::format_bytes_iec(u64::from(hi))
        )));
    }
    let bwlimit = match &args.bwlimit {
        Some(r) => {
            let v = units::parse_rate(r).map_err(|e| usage(e.to_string()))?;
            if v == 0 {
                return Err(usage("--bwlimit must be above 0".into()));
            }
            Some(v)
        }
        None => None,
    };
    let parse = |a: &OsString| {
        parse_remote(a.as_encoded_bytes())
            .transpose()
            .map_err(usage)
    };
    let dest = parse(dest_arg)?;
    let remote_srcs: Vec<Option<Remote>> = srcs.iter().map(parse).collect::<Result<_, _>>()?;
    let mut job = JobSpec {
        push: dest.is_some(),
        export: String::new(),
        remote: vec![],
        local_sources: vec![],
        local_dest: PathBuf::new(),
        chunk_size: chunk as u32,
        auto_chunk,
        bwlimit,
        strong: args.verify == "strong",
    };
    let host;
    match dest {
        Some(d) => {
            if remote_srcs.iter().any(Option::is_some) {
                return Err(usage(
                    "both sides are remote: copy between a local path and one server".into(),
                ));
            }
            host = d.host;
            job.export = d.export;
            job.remote = vec![d.path];
            job.local_sources = srcs.iter().map(PathBuf::from).collect();
        }
        None => {
            let mut first: Option<Remote> = None;
            for r in remote_srcs {
                let Some(r) = r else {
                    return Err(usage(
                        "neither side is remote: name the server as HOST:EXPORT/PATH".into(),
                    ));
                };
                if let Some(f) = &first {
                    if f.host != r.host || f.export != r.export {
                        return Err(usage(
                            "all remote sources must be on the same server and export".into(),
                        ));
                    }
                }
                job.remote.push(r.path.clone());
                first.get_or_insert(r);
            }
            let Some(f) = first else {
                return Err(usage("nothing to copy".into()));
            };
            host = f.host;
            job.export = f.export;
            job.local_dest = PathBuf::from(dest_arg);
        }
    }
    Ok(Plan {
        host,
        port: args.port,
        job,
    })
}

/// Runs `fatpipe copy`; stores it when `--archive` or FATPIPE_ARCHIVE
/// asks (a failed copy too, with its error).
pub fn run(args: Args) -> anyhow::Result<()> {
    if super::httpcopy::applies(&args) {
        return super::httpcopy::run(args);
    }
    if args.token.is_some() || args.ca.is_some() {
        return Err(crate::exit::usage(
            "--token and --ca are for http(s):// and dav(s):// URLs",
        ));
    }
    let host = plan(&args)?.host;
    let rec = Recorder::new(args.archive.as_deref(), RunKind::Copy, &host)?;
    let result = transfer(args, rec.as_ref());
    if let (Some(r), Err(e)) = (&rec, &result) {
        r.failed(e);
    }
    result
}

fn transfer(args: Args, rec: Option<&Recorder>) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let plan = plan(&args)?;
    if let Some(f) = &args.plot {
        super::report::check_plot_file(f)?;
    }
    let addr = super::common::resolve(&plan.host, plan.port)?;
    let key = match &args.key_file {
        Some(path) => {
            Some(fatpipe_engine::load_key(path).map_err(|e| crate::exit::usage(e.to_string()))?)
        }
        None => None,
    };
    super::common::check_encrypt(args.encrypt, key.is_some(), false)?;
    // Auto-tuning probes the path while the copy connects: the request,
    // which carries the streams and socket settings, waits for the plan
    // (session::Prepare); the connections before it do not.
    let auto_on = !(args.no_auto || args.parallel.is_some());
    let spec = &plan.job;
    let algo = if spec.strong {
        Algo::Blake3
    } else {
        Algo::Xxh3
    };
    let job = Job {
        direction: if spec.push {
            Direction::Push
        } else {
            Direction::Pull
        },
        export: spec.export.clone(),
        remote: spec.remote.clone(),
        local_sources: spec.local_sources.clone(),
        local_dest: spec.local_dest.clone(),
        recursive: args.recursive,
        sync: args.sync,
        direct: !args.buffered,
        algo,
        streams: args.parallel.unwrap_or(DEFAULT_STREAMS),
        chunk_size: spec.chunk_size,
        auto_chunk: spec.auto_chunk,
        bwlimit: spec.bwlimit,
        tuning: SocketTuning::default(),
        retries: args.retries,
        sendfile: !args.no_sendfile,
        corrupt_chunk: fatpipe_transfer::source::SourceOptions::corrupt_from_env(),
    };
    let link = EngineLink::new(addr, key.clone()).encrypted(args.encrypt);
    if !auto_on {
        link.set_data(DataOpts::default());
    }
    let progress = Arc::new(Progress::default());
    let show_bar = !args.quiet && !args.json && std::io::stderr().is_terminal();
    let stop = Arc::new(AtomicBool::new(false));
    let bar = Mutex::new(None);
    // After the `auto:` line, which it would otherwise overwrite.
    let start_bar = || {
        if show_bar {
            let (p, s) = (Arc::clone(&progress), Arc::clone(&stop));
            *lock(&bar) = Some(std::thread::spawn(move || progress_bar(&p, &s)));
        }
    };
    let quiet = args.quiet;
    let on_retry = |line: &str| {
        if !quiet {
            // The reason may quote the server: escaped.
            eprintln!("{}fatpipe: copy: {}", clear_line(), escape(line));
        }
    };
    // Only when auto-tuning chose the streams does it adjust them in flight.
    let tuning: OnceLock<CopyTuner> = OnceLock::new();
    let auto: Mutex<Option<AutoTune>> = Mutex::new(None);
    let trace = std::env::var_os(TRACE_ENV).is_some();
    let tuner = |live: &Live| {
        if let Some(t) = tuning.get() {
            t.run(live, &mut |e| print_tuner_event(&e, quiet, trace));
        }
    };
    // Progress every 100 ms, for the timeline's ramp.
    let samples = Sampler::start(Arc::clone(&progress), t0);
    let planned: OnceLock<Instant> = OnceLock::new();
    let result = std::thread::scope(|scope| {
        let mut prepare = auto_on.then(|| {
            let (planned, args, plan, key) = (&planned, &args, &plan, key.clone());
            let mut probe = Some(scope.spawn(move || {
                let t = auto_tune(args, plan, addr, key);
                let _ = planned.set(Instant::now());
                t
            }));
            let (tuning, link, auto, start_bar) = (&tuning, &link, &auto, &start_bar);
            move |job: &mut Job| -> Result<(), CopyError> {
                let tuned = probe
                    .take()
                    .ok_or_else(|| CopyError::Failed("auto-tuning ran twice".into()))?
                    .join()
                    .map_err(|_| CopyError::Failed("the auto-tuning thread panicked".into()))?
                    .map_err(CopyError::Usage)?;
                match tuned {
                    Some(t) => {
                        let _ = tuning.set(CopyTuner::new(&t, job.bwlimit));
                        job.streams = t.streams;
                        if job.auto_chunk {
                            job.chunk_size = t.chunk_size;
                        }
                        job.tuning = t.server;
                        link.set_data(t.data);
                        *lock(auto) = Some(t.record);
                    }
                    // A failed probe leaves the copy untuned.
                    None => {
                        job.streams = DEFAULT_STREAMS;
                        job.tuning = SocketTuning::default();
                        link.set_data(DataOpts::default());
                    }
                }
                start_bar();
                Ok(())
            }
        });
        if !auto_on {
            start_bar();
        }
        session::run_client_prepared(
            &link,
            &job,
            prepare.as_mut().map(|p| p as &mut session::Prepare<'_>),
            Arc::clone(&progress),
            &on_retry,
            auto_on.then_some(&tuner as &session::Tuner<'_>),
        )
    });
    stop.store(true, Ordering::SeqCst);
    if let Some(b) = lock(&bar).take() {
        let _ = b.join();
    }
    let samples = samples.finish();
    let report = match result {
        Ok(r) => r,
        Err(CopyError::Usage(m)) => return Err(crate::exit::usage(m)),
        Err(e) => return Err(anyhow::anyhow!(e)).context("copy"),
    };
    let mut auto = lock(&auto).take();
    let tuning = tuning.get();
    let mut out = to_schema(&args, &plan, &job, &report);
    if let (Some(rec), Some(t)) = (auto.as_mut(), tuning) {
        rec.decisions = t.decisions();
        rec.streams = rec.streams.max(out.streams);
    }
    out.timeline = Some(timeline(
        t0,
        &report.marks,
        planned.get().copied(),
        &progress,
        &samples,
        plan.job.push,
        auto.as_ref(),
    ));
    out.auto = auto;
    if args.json {
        let mut stdout = std::io::stdout().lock();
        crate::cmd::common::json_pretty(&mut stdout, &out)?;
    } else if !args.quiet {
        print_summary(&out);
    }
    if let Some(r) = rec {
        r.copy(&out)?;
    }
    if let Some(file) = &args.plot {
        super::plots::copy(&out, file)?;
    }
    for line in failure_lines(&report.failures) {
        eprintln!("fatpipe: copy: {line}");
    }
    // Names and reasons from the sender (the server, on a pull): escaped.
    for p in &out.problems {
        eprintln!("fatpipe: copy: not copied: {}", escape(p));
    }
    if out.files_failed > 0 || !out.failures.is_empty() {
        anyhow::bail!(
            "copy: {} of {} files failed (the journal is kept: re-run the same command to resume)",
            out.failures.len().max(out.files_failed as usize),
            out.files_total
        );
    }
    if !out.problems.is_empty() {
        anyhow::bail!(
            "copy: {} source objects could not be read and were not copied",
            out.problems.len()
        );
    }
    Ok(())
}

/// The pre-flight: probe, plan, print the `auto:` line, and return the
/// streams and socket settings (this end's and the server's) to copy with.
/// A failed probe is a warning (`None`: the copy runs untuned); a refused
/// key is a usage error (its message is returned).
fn auto_tune(
    args: &Args,
    plan: &Plan,
    addr: SocketAddr,
    key: Option<fatpipe_proto::Key>,
) -> Result<Option<CopyTuning>, String> {
    let keyless = key.is_none();
    let options = fatpipe_engine::ClientOptions {
        key,
        encrypt: args.encrypt,
        ..fatpipe_engine::ClientOptions::default()
    };
    let (push, bwlimit) = (plan.job.push, plan.job.bwlimit);
    let tuned = match auto::run(&service::preflight_request(addr, options, push, bwlimit)) {
        Ok(t) => t,
        // A keyed server probes only for key holders, but may still serve
        // its `:public` exports to this keyless client: copy untuned, and
        // let the copy's own request be refused if the export is not.
        Err(e) if e.is_auth() && keyless => {
            if args.verbose {
                eprintln!(
                    "fatpipe: copy: auto-tuning off: the server probes only for clients with its key"
                );
            }
            return Ok(None);
        }
        Err(e) if e.is_auth() => return Err(format!("{}: {e}", plan.host)),
        Err(e) => {
            if !args.quiet {
                eprintln!("fatpipe: copy: warning: auto-tuning off: {e}");
            }
            return Ok(None);
        }
    };
    // One line by default: what was chosen for which path. The planner's
    // reasoning and the warnings that only explain it are for -v (and are
    // in the JSON); a warning the user should act on is always shown.
    if args.verbose {
        eprintln!("{}", tuned.line);
        for w in &tuned.record.warnings {
            eprintln!("fatpipe: copy: warning: auto: {w}");
        }
    } else if !args.quiet {
        eprintln!("{}", tuned.short);
        for w in &tuned.act_on {
            eprintln!("fatpipe: copy: warning: auto: {w}");
        }
    }
    Ok(Some(CopyTuning::new(tuned, push, bwlimit)))
}

/// What the in-flight tuner reports: each change on one line (unless
/// `-q`), and with `FATPIPE_COPY_TRACE` every sample and the adjuster's
/// answer.
fn print_tuner_event(e: &Event<'_>, quiet: bool, trace: bool) {
    match e {
        Event::Sampled {
            index,
            reading,
            decision,
        } => {
            let Some(sample) = reading.sample.filter(|_| trace) else {
                return;
            };
            eprintln!(
                "auto: sample {index} at {:.1} s: {} streams, {}, {} retransmits, RTT {} ({}): {:?} {}",
                sample.now.as_secs_f64(),
                reading.streams,
                units::format_rate(sample.throughput as f64),
                sample.retransmits,
                units::format_duration(sample.rtt),
                reading.congestion.as_deref().unwrap_or_default(),
                decision.action,
                decision.reason
            );
        }
        Event::Changed(step) if !quiet => {
            let d = &step.decision;
            let what = match &d.action {
                Action::AddStreams { n } => format!("+{n} streams"),
                Action::SwitchCongestion { to } => format!("congestion control → {to}"),
                Action::Hold => String::new(),
            };
            eprintln!(
                "{}auto: {what} at {:.1} s: {}",
                clear_line(),
                d.at_secs,
                d.reason
            );
        }
        Event::Changed(_) => {}
    }
}

/// What starts a line printed over the progress bar: return and erase
/// on a terminal, nothing when stderr is a file or a pipe (where the
/// codes would only be noise in a log).
pub(super) fn clear_line() -> &'static str {
    if std::io::stderr().is_terminal() {
        "\r\x1b[K"
    } else {
        ""
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn to_schema(args: &Args, plan: &Plan, job: &Job, r: &session::Report) -> CopyReport {
    let secs = r.elapsed.as_secs_f64().max(1e-9);
    let n = args.paths.len();
    let show = |p: &OsString| p.to_string_lossy().into_owned();
    CopyReport {
        schema: COPY_SCHEMA.into(),
        version: COPY_SCHEMA_VERSION,
        direction: if plan.job.push {
            CopyDirection::Push
        } else {
            CopyDirection::Pull
        },
        server: format!("{}:{}", plan.host, plan.port),
        export: plan.job.export.clone(),
        sources: args.paths[..n - 1].iter().map(show).collect(),
        destination: show(&args.paths[n - 1]),
        streams: u32::from(r.streams),
        chunk_size: u64::from(r.chunk_size),
        checksum: job.algo.name().into(),
        sync: job.sync,
        direct: job.direct,
        bwlimit: job.bwlimit,
        files_total: r.files_total,
        files_verified: r.summary.files_verified,
        files_skipped: r.summary.files_skipped,
        files_failed: r.summary.files_failed.max(r.failures.len() as u64),
        bytes_total: r.bytes_total,
        bytes_transferred: r.bytes_moved,
        chunks_resent: r.summary.chunks_resent,
        reconnects: r.reconnects,
        seconds: secs,
        rate: (r.bytes_moved as f64 * 8.0 / secs) as u64,
        files_per_sec: r.summary.files_verified as f64 / secs,
        io_local: r.local_io.clone(),
        io_remote: r.remote_io.clone(),
        peak_rss_local: peak_rss(),
        failures: r
            .failures
            .iter()
            .map(|f| CopyFailure {
                path: f.path.clone(),
                message: f.message.clone(),
            })
            .collect(),
        problems: notes(r, NoteKind::Problem)
            .map(|n| format!("{}: {}", n.path, n.detail))
            .collect(),
        skipped: notes(r, NoteKind::Skipped).collect(),
        hard_links: notes(r, NoteKind::HardLink).collect(),
        notes_not_listed: notes(r, NoteKind::More)
            .filter_map(|n| n.detail.parse::<u64>().ok())
            .sum(),
        auto: None,
        timeline: None,
        encryption: r.encryption.as_ref().map(|e| fatpipe_schema::Encryption {
            protocol: e.protocol.into(),
            suite: e.suite.into(),
        }),
    }
}

/// The sender's notes of one kind, as the report lists them.
fn notes(r: &session::Report, kind: NoteKind) -> impl Iterator<Item = CopyNote> + '_ {
    r.notes
        .iter()
        .filter(move |n| n.kind == kind)
        .map(|n| CopyNote {
            path: n.path.clone(),
            detail: n.detail.clone(),
        })
}

/// One line on what the copy left out or changed by policy (special files
/// skipped, hard links copied as separate files), naming the first few;
/// `None` when there is nothing to say. The same for push and pull.
/// One line per failed file, except that a full file system is said once:
/// the first file it failed is named with the line that says where and by
/// how much, the others on it are counted in one more line (a full disk
/// in a tree copy fails every file after it, and a wall of identical lines
/// would bury the one that matters).
fn failure_lines(failures: &[fatpipe_transfer::Failure]) -> Vec<String> {
    let mut lines = Vec::new();
    let mut full: Vec<(String, usize)> = Vec::new();
    for f in failures {
        if let FailureKind::NoSpace { on } = &f.kind {
            if let Some(seen) = full.iter_mut().find(|(k, _)| k == on) {
                seen.1 += 1;
                continue;
            }
            full.push((on.clone(), 0));
        }
        lines.push(format!("{}: {}", escape(&f.path), escape(&f.message)));
    }
    for (d, more) in full {
        if more > 0 {
            lines.push(format!(
                "{more} more files failed for lack of space on {}",
                escape(&d)
            ));
        }
    }
    lines
}

fn notes_line(r: &CopyReport) -> Option<String> {
    fn some(v: &[CopyNote], shown: impl Fn(&CopyNote) -> String) -> String {
        let mut names: Vec<String> = v.iter().take(3).map(shown).collect();
        if v.len() > 3 {
            names.push(format!("{} more", v.len() - 3));
        }
        names.join(", ")
    }
    let mut parts = Vec::new();
    if !r.skipped.is_empty() {
        parts.push(format!(
            "skipped {} special file(s), not copied: {}",
            r.skipped.len(),
            some(&r.skipped, |n| format!("{} ({})", n.path, n.detail))
        ));
    }
    if !r.hard_links.is_empty() {
        parts.push(format!(
            "{} hard link(s) arrived as separate files: {}",
            r.hard_links.len(),
            some(&r.hard_links, |n| format!("{} = {}", n.path, n.detail))
        ));
    }
    if r.notes_not_listed > 0 {
        parts.push(format!("{} more not listed", r.notes_not_listed));
    }
    // File names come from the sender (the server, on a pull): escaped.
    (!parts.is_empty()).then(|| escape(&parts.join("; ")).into_owned())
}

/// Samples a copy's progress (seconds since `t0`, bytes so far) every
/// 100 ms on a thread of its own, until [`Sampler::finish`].
pub(super) struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(f64, u64)>>,
}

impl Sampler {
    pub(super) fn start(p: Arc<Progress>, t0: Instant) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut out = Vec::new();
            loop {
                let done = s.load(Ordering::SeqCst);
                out.push((t0.elapsed().as_secs_f64(), p.bytes.load(Ordering::Relaxed)));
                if done {
                    return out;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Sampler { stop, thread }
    }

    pub(super) fn finish(self) -> Vec<(f64, u64)> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap_or_default()
    }
}

/// Where the seconds went (docs/json-schema.md, `timeline`): the session's
/// marks, the plan's arrival and the progress samples turned into seconds
/// since the command started, and the ramp measured on the samples.
fn timeline(
    t0: Instant,
    marks: &session::Marks,
    planned: Option<Instant>,
    progress: &Progress,
    samples: &[(f64, u64)],
    push: bool,
    auto: Option<&AutoTune>,
) -> CopyTimeline {
    let at = |i: Option<Instant>| i.map(|i| i.saturating_duration_since(t0).as_secs_f64());
    let first = at(progress.first_at.get().copied());
    let ramp = first.and_then(|f| fatpipe_tune::ramp::measure(samples, f, 0.9, 1.0));
    let accepted = at(marks.accepted);
    let last = samples
        .last()
        .and_then(|&(_, total)| samples.iter().find(|s| s.1 >= total && total > 0))
        .map(|s| s.0);
    CopyTimeline {
        wall_secs: t0.elapsed().as_secs_f64(),
        plan_at: at(planned),
        probe_secs: auto.map(|a| a.probe_secs),
        connected_at: at(marks.connected),
        request_at: at(marks.prepared),
        accepted_at: accepted,
        data_open_at: at(marks.data_open),
        first_byte_sent_at: first.filter(|_| push),
        first_byte_on_disk_at: first.filter(|_| !push),
        ramp_secs: ramp.and_then(|r| r.secs),
        final_rate: ramp.map(|r| r.final_rate as u64),
        first_stream_idle_at: at(progress.first_idle_at.get().copied()).filter(|_| push),
        last_byte_at: last,
        done_at: at(marks.done),
        adjust_at: auto
            .map(|a| {
                a.decisions
                    .iter()
                    .map(|d| accepted.unwrap_or(0.0) + d.at_secs)
                    .collect()
            })
            .unwrap_or_default(),
        progress: thin(samples, fatpipe_schema::copy::PROGRESS_SAMPLES_MAX),
    }
}

/// At most `max` of `samples`, evenly spaced, the first and the last kept:
/// the shape of the copy for a plot, without 36,000 points an hour.
pub(super) fn thin(samples: &[(f64, u64)], max: usize) -> Vec<(f64, u64)> {
    if samples.len() <= max || max < 2 {
        return samples.to_vec();
    }
    let step = (samples.len() - 1) as f64 / (max - 1) as f64;
    (0..max)
        .map(|i| samples[((i as f64 * step).round() as usize).min(samples.len() - 1)])
        .collect()
}

fn print_summary(r: &CopyReport) {
    let dur = Duration::from_secs_f64(r.seconds);
    let notes = notes_line(r);
    if r.files_verified == 0 && r.files_failed == 0 && r.files_skipped == r.files_total {
        println!(
            "nothing to copy: all {} files ({}) are already up to date (checked in {})",
            r.files_total,
            units::format_bytes(r.bytes_total),
            units::format_duration(dur)
        );
        if let Some(n) = notes {
            println!("{n}");
        }
        return;
    }
    println!(
        "copied {} of {} files ({} of {}) in {}: {}, {:.0} files/s",
        r.files_verified,
        r.files_total,
        units::format_bytes(r.bytes_transferred),
        units::format_bytes(r.bytes_total),
        units::format_duration(dur),
        units::format_rate(r.rate as f64),
        r.files_per_sec
    );
    println!(
        "verified {} files chunk by chunk ({}); {} already up to date; {} failed; {} chunks re-sent; {} reconnects",
        r.files_verified, r.checksum, r.files_skipped, r.files_failed, r.chunks_resent, r.reconnects
    );
    if let Some(n) = notes {
        println!("{n}");
    }
    let encryption = match &r.encryption {
        Some(e) => format!("encrypted ({}, {})", e.protocol, e.suite),
        None => "not encrypted".into(),
    };
    println!(
        "{} streams, {} chunks; I/O here: {}, on the server: {}; {encryption}",
        r.streams,
        units::format_bytes_iec(r.chunk_size),
        r.io_local,
        escape(&r.io_remote)
    );
}

pub(super) fn progress_bar(p: &Progress, stop: &AtomicBool) {
    let start = Instant::now();
    let mut last = (Instant::now(), 0u64);
    let mut rate = 0.0f64;
    let mut err = std::io::stderr();
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(250));
        let bytes = p.bytes.load(Ordering::Relaxed);
        let total = p.total_bytes.load(Ordering::Relaxed);
        let files = p.files.load(Ordering::Relaxed);
        let tfiles = p.total_files.load(Ordering::Relaxed);
        let now = Instant::now();
        let dt = now.duration_since(last.0).as_secs_f64();
        if dt >= 0.5 {
            let inst = bytes.saturating_sub(last.1) as f64 * 8.0 / dt;
            rate = if rate == 0.0 {
                inst
            } else {
                0.5 * rate + 0.5 * inst
            };
            last = (now, bytes);
        }
        let avg = bytes as f64 * 8.0 / start.elapsed().as_secs_f64().max(1e-3);
        let pct = if total > 0 {
            bytes as f64 * 100.0 / total as f64
        } else {
            0.0
        };
        let eta = if rate > 0.0 && total > bytes {
            units::format_duration(Duration::from_secs_f64((total - bytes) as f64 * 8.0 / rate))
        } else {
            "-".into()
        };
        let _ = write!(
            err,
            "\r\x1b[K{} / {} ({pct:.0}%)  {files}/{tfiles} files  {} now  {} avg  ETA {eta}",
            units::format_bytes(bytes),
            units::format_bytes(total),
            units::format_rate(rate),
            units::format_rate(avg),
        );
        let _ = err.flush();
    }
    let _ = write!(err, "\r\x1b[K");
}

pub(super) fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_full_disk_is_said_once_with_the_others_counted() {
        let f = |path: &str, message: &str, kind: FailureKind| fatpipe_transfer::Failure {
            path: path.into(),
            message: message.into(),
            kind,
        };
        let full = |need: &str| {
            format!("no space left on /data (xfs): 1 MiB free of 6 MiB, this file needs {need} (free space and re-run the same command to resume)")
        };
        let data = || FailureKind::NoSpace {
            on: "/data (xfs)".into(),
        };
        let lines = failure_lines(&[
            f("big.bin", &full("12 MiB"), data()),
            f(
                "a/b",
                "permission denied (os error 13)",
                FailureKind::Permission,
            ),
            f("small/1", &full("20 KiB"), data()),
            f(
                "other",
                "no space left on device (free space and re-run the same command to resume)",
                FailureKind::NoSpace {
                    on: "device".into(),
                },
            ),
            f("small/2", &full("4 KiB"), data()),
            // The kind decides, not the words: a message that reads like a
            // full disk but is not one is listed as it is.
            f(
                "odd",
                "no space left on the label (a file named so)",
                FailureKind::Other,
            ),
        ]);
        assert_eq!(
            lines,
            [
                format!("big.bin: {}", full("12 MiB")),
                "a/b: permission denied (os error 13)".to_string(),
                "other: no space left on device (free space and re-run the same command to resume)"
                    .to_string(),
                "odd: no space left on the label (a file named so)".to_string(),
                "2 more files failed for lack of space on /data (xfs)".to_string(),
            ]
        );
    }
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        args: Args,
    }

    fn args(v: &[&str]) -> Args {
        let mut all = vec!["copy"];
        all.extend_from_slice(v);
        T::try_parse_from(all).unwrap().args
    }

    fn is_usage(e: &anyhow::Error) -> bool {
        e.chain().any(|c| c.is::<crate::exit::UsageError>())
    }

    #[test]
    fn verbose_and_quiet_exclude_each_other() {
        assert!(args(&["-v", "a", "h:x/"]).verbose);
        assert!(!args(&["a", "h:x/"]).verbose);
        assert!(T::try_parse_from(["copy", "-v", "-q", "a", "h:x/"]).is_err());
    }

    #[test]
    fn parallel_and_no_auto_parse() {
        // -P and --no-auto parse; -P 0 is still refused.
        assert_eq!(args(&["-P", "2", "a", "h:x/"]).parallel, Some(2));
        assert!(args(&["--no-auto", "a", "h:x/"]).no_auto);
        assert!(plan(&args(&["-P", "0", "a", "h:x/"])).is_err());
        assert!(plan(&args(&["a", "h:x/"])).is_ok());
    }

    #[test]
    fn remote_syntax() {
        let r = parse_remote(b"dtn2:data/in/x").unwrap().unwrap();
        assert_eq!(
            (r.host.as_str(), r.export.as_str(), &r.path[..]),
            ("dtn2", "data", &b"in/x"[..])
        );
        let r = parse_remote(b"[::1]:pub").unwrap().unwrap();
        assert_eq!((r.host.as_str(), &r.path[..]), ("::1", &b""[..]));
        let r = parse_remote(b"h:data/").unwrap().unwrap();
        assert_eq!(r.path, b"");
        let r = parse_remote(b"h:data/dir/").unwrap().unwrap();
        assert_eq!(r.path, b"dir/");
        assert!(parse_remote(b"./a:b").is_none());
        assert!(parse_remote(b"plain/path").is_none());
        assert!(parse_remote(b":data/x").unwrap().is_err());
        assert!(parse_remote(b"host:").unwrap().is_err());
        assert!(parse_remote(b"host:/abs").unwrap().is_err());
    }

    #[test]
    fn push_and_pull_plans() {
        let p = plan(&args(&["-r", "a", "b/", "dtn:data/in/"])).unwrap();
        assert!(p.job.push);
        assert_eq!(p.host, "dtn");
        assert_eq!(p.port, DEFAULT_PORT);
        assert_eq!(p.job.remote, vec![b"in/".to_vec()]);
        assert_eq!(
            p.job.local_sources,
            vec![PathBuf::from("a"), PathBuf::from("b/")]
        );
        assert_eq!(p.job.chunk_size, 2 << 20);
        assert!(p.job.auto_chunk);

        let p = plan(&args(&[
            "dtn:data/x",
            "dtn:data/y",
            "out",
            "--verify",
            "strong",
        ]))
        .unwrap();
        assert!(!p.job.push);
        assert!(p.job.strong);
        assert_eq!(p.job.remote, vec![b"x".to_vec(), b"y".to_vec()]);
        assert_eq!(p.job.local_dest, PathBuf::from("out"));

        let p = plan(&args(&[
            "a",
            "h:d",
            "--bwlimit",
            "500M",
            "--chunk-size",
            "1M",
        ]))
        .unwrap();
        assert_eq!(p.job.bwlimit, Some(500_000_000));
        assert_eq!(p.job.chunk_size, 1 << 20);
        assert!(!p.job.auto_chunk);
    }

    #[test]
    fn bad_plans_are_usage_errors() {
        for bad in [
            &["a", "b"][..],
            &["h:d/x", "g:d/y"],
            &["h:d/x", "h:e/y", "out"],
            &["h:d/x", "a", "out"],
            &["a", "h:d", "--chunk-size", "1K"],
            &["a", "h:d", "--chunk-size", "1G"],
            &["a", "h:d", "--bwlimit", "fast"],
            &["a", "h:d", "--bwlimit", "0"],
            &["a", "h:d", "-P", "0"],
            &["a", "h:d", "-P", "300"],
            &["a", ":d"],
        ] {
            let e = plan(&args(bad)).expect_err(&format!("{bad:?}"));
            assert!(is_usage(&e), "{bad:?}: {e}");
        }
        assert!(T::try_parse_from(["copy", "a", "h:d", "--verify", "sloppy"]).is_err());
        assert!(T::try_parse_from(["copy", "a", "h:d", "--buffered", "--direct"]).is_err());
    }

    #[test]
    fn progress_is_thinned_evenly_keeping_both_ends() {
        let samples: Vec<(f64, u64)> = (0..36_001)
            .map(|i| (f64::from(i) / 10.0, 1000 * u64::from(i as u32)))
            .collect();
        let t = thin(&samples, 1000);
        assert_eq!(t.len(), 1000);
        assert_eq!(t[0], samples[0]);
        assert_eq!(t[999], samples[36_000]);
        assert!(t.windows(2).all(|w| w[1].0 > w[0].0));
        let short = &samples[..10];
        assert_eq!(thin(short, 1000), short);
    }
}
