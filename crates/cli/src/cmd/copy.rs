//! `fatpipe copy`: bulk file transfer to or from a `fatpipe server`, and the
//! server's `copy` service.
//!
//! Two phases, as in the rest of the binary: clap parses raw [`Args`], then
//! [`plan`] validates them into a [`Plan`] (scp-style `HOST:EXPORT/PATH`
//! split, push or pull decided, sizes and rates parsed through
//! `fatpipe_schema::units`), tested below without a socket. The transfer
//! itself is `fatpipe_transfer::session::run_client_prepared`; this module
//! gives it an engine-backed [`Link`] (authentication, cookies), runs the
//! auto-tuning pre-flight on a thread beside it (the copy connects while the
//! probe runs and takes the plan just before its request), draws the
//! progress bar on a terminal, and renders the report (text or `--json`).
//!
//! The server side is [`CopyService`]: `fatpipe server --export
//! NAME=DIR[:ro][:public]` registers it with the engine, which hands it each
//! authenticated `copy` session.

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use fatpipe_engine::server::DEFAULT_PORT;
use fatpipe_engine::{ClientSession, EngineError, ServerSession, Service, ServiceResult};
use fatpipe_schema::copy::{
    CopyDirection, CopyFailure, CopyReport, COPY_SCHEMA, COPY_SCHEMA_VERSION,
};
use fatpipe_schema::tune::{Action, AutoTune, Decision};
use fatpipe_schema::units;
use fatpipe_transfer::hash::Algo;
use fatpipe_transfer::live::Live;
use fatpipe_transfer::session::{self, Conn, CopyError, Export, Job, Link, ServerConfig};
use fatpipe_transfer::wire::{Direction, SocketTuning};
use fatpipe_transfer::Progress;
use fatpipe_tune::{auto, AdjustConfig, Adjuster, Sample};

/// Streams without auto-tuning and without `-P`.
const DEFAULT_STREAMS: u16 = 4;
/// The most streams the in-flight adjuster may grow a copy to.
const ADJUST_MAX_STREAMS: u32 = 64;
/// How often the in-flight adjuster samples the transfer.
const ADJUST_INTERVAL: Duration = Duration::from_secs(1);
/// Test hook: start an auto-tuned copy with this many streams instead of
/// the plan's (the adjuster then starts from there).
const TEST_STREAMS_ENV: &str = "FATPIPE_TEST_COPY_STREAMS";
/// Test hook `N@K`: add N streams at the adjuster's K-th sample, whatever
/// it would have decided.
const TEST_ADD_ENV: &str = "FATPIPE_TEST_COPY_ADD";
/// Debug hook: print every sample and the adjuster's answer on stderr.
const TRACE_ENV: &str = "FATPIPE_COPY_TRACE";

/// Arguments of `fatpipe copy`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Sources then destination; exactly one side is remote,
    /// HOST:EXPORT/PATH (e.g. `-r data/ dtn2:data/in/` or `dtn2:data/x .`).
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
    /// Chunk checksum: `fast` (xxh3-128) or `strong` (BLAKE3).
    #[arg(long, default_value = "fast", value_parser = ["fast", "strong"])]
    pub verify: String,
    /// Chunk size (64K..64M): big files are cut into chunks all streams share.
    #[arg(long, default_value = "8M")]
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
    /// Chunk size.
    pub chunk_size: u32,
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
    let chunk = units::parse_size(&args.chunk_size).map_err(|e| usage(e.to_string()))?;
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

/// Runs `fatpipe copy`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let plan = plan(&args)?;
    let addr = super::common::resolve(&plan.host, plan.port)?;
    let key = match &args.key_file {
        Some(path) => {
            Some(fatpipe_engine::load_key(path).map_err(|e| crate::exit::usage(e.to_string()))?)
        }
        None => None,
    };
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
        bwlimit: spec.bwlimit,
        tuning: SocketTuning::default(),
        retries: args.retries,
        sendfile: !args.no_sendfile,
        corrupt_chunk: fatpipe_transfer::source::SourceOptions::corrupt_from_env(),
    };
    let link = EngineLink {
        addr,
        key: key.clone(),
        data: Arc::new(OnceLock::new()),
    };
    if !auto_on {
        let _ = link.data.set(DataOpts::default());
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
            eprintln!("\r\x1b[Kfatpipe: copy: {line}");
        }
    };
    // Only when auto-tuning chose the streams does it adjust them in flight.
    let tuning: OnceLock<Tuning> = OnceLock::new();
    let auto: Mutex<Option<AutoTune>> = Mutex::new(None);
    let tuner = |live: &Live| {
        if let Some(t) = tuning.get() {
            t.run(live);
        }
    };
    let result = std::thread::scope(|scope| {
        let mut prepare = auto_on.then(|| {
            let mut probe = Some(scope.spawn(|| auto_tune(&args, &plan, addr, key.clone())));
            let (tuning, link, auto, start_bar) = (&tuning, &link, &auto, &start_bar);
            move |job: &mut Job| -> Result<(), CopyError> {
                let tuned = probe
                    .take()
                    .ok_or_else(|| CopyError::Failed("auto-tuning ran twice".into()))?
                    .join()
                    .map_err(|_| CopyError::Failed("the auto-tuning thread panicked".into()))?
                    .map_err(CopyError::Usage)?;
                let (mut streams, data_opts, server_sockets, mut rec) = tuned;
                if let Some(rec) = rec.as_mut() {
                    if let Some(n) = env_number(TEST_STREAMS_ENV) {
                        streams = u16::try_from(n).unwrap_or(1).clamp(1, session::MAX_STREAMS);
                        rec.streams = u32::from(streams);
                        rec.warnings.push(format!(
                            "{TEST_STREAMS_ENV}: started with {streams} streams"
                        ));
                    }
                    rec.adjusting = true;
                    let _ = tuning.set(Tuning::new(
                        rec,
                        u32::from(streams),
                        data_opts.congestion.clone(),
                        job.bwlimit,
                        quiet,
                    ));
                }
                job.streams = streams;
                job.tuning = server_sockets;
                let _ = link.data.set(data_opts);
                *lock(auto) = rec;
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
    let report = match result {
        Ok(r) => r,
        Err(CopyError::Usage(m)) => return Err(crate::exit::usage(m)),
        Err(e) => return Err(anyhow::anyhow!(e)).context("copy"),
    };
    let mut auto = lock(&auto).take();
    let tuning = tuning.get();
    let mut out = to_schema(&args, &plan, &job, &report);
    if let (Some(rec), Some(t)) = (auto.as_mut(), &tuning) {
        rec.decisions = t.decisions();
        rec.streams = rec.streams.max(out.streams);
    }
    out.auto = auto;
    if args.json {
        let mut stdout = std::io::stdout().lock();
        serde_json::to_writer_pretty(&mut stdout, &out)?;
        writeln!(stdout)?;
    } else if !args.quiet {
        print_summary(&out);
    }
    for f in &out.failures {
        eprintln!("fatpipe: copy: {}: {}", f.path, f.message);
    }
    for p in &out.problems {
        eprintln!("fatpipe: copy: skipped {p}");
    }
    if out.files_failed > 0 || !out.failures.is_empty() {
        anyhow::bail!(
            "copy: {} of {} files failed (the journal is kept: re-run the same command to resume)",
            out.failures.len().max(out.files_failed as usize),
            out.files_total
        );
    }
    if !out.problems.is_empty() {
        anyhow::bail!("copy: {} source objects were skipped", out.problems.len());
    }
    Ok(())
}

/// The server's `copy` service.
pub struct CopyService {
    cfg: ServerConfig,
}

impl CopyService {
    /// Builds the service from `--export NAME=DIR[:ro][:public]` values.
    /// `keyed` is true when the server requires the pre-shared key.
    pub fn new(exports: &[String], keyed: bool) -> anyhow::Result<CopyService> {
        let mut parsed: Vec<Export> = Vec::new();
        for e in exports {
            let ex: Export = e.parse().map_err(crate::exit::usage)?;
            if !ex.path.is_dir() {
                return Err(crate::exit::usage(format!(
                    "--export {e}: {} is not a directory",
                    ex.path.display()
                )));
            }
            if parsed.iter().any(|p| p.name == ex.name) {
                return Err(crate::exit::usage(format!(
                    "--export {e}: the name '{}' is used twice",
                    ex.name
                )));
            }
            if !ex.public && !keyed {
                eprintln!(
                    "fatpipe: server: export '{}' needs the key but the server has none: \
                     add --key-file, or mark it :public",
                    ex.name
                );
            }
            parsed.push(ex);
        }
        Ok(CopyService {
            cfg: ServerConfig {
                exports: parsed,
                keyed,
                sendfile: true,
            },
        })
    }
}

impl Service for CopyService {
    fn name(&self) -> &'static str {
        "copy"
    }

    fn serve(&self, session: ServerSession) -> ServiceResult {
        let accept = |t: Duration| -> Result<TcpStream, String> {
            session
                .accept_data(t)
                .map(|d| d.stream)
                .map_err(|e| e.to_string())
        };
        session::serve(&self.cfg, &accept)
            .map(|_| ())
            .map_err(|e| e.into())
    }
}

struct EngineLink {
    addr: SocketAddr,
    key: Option<fatpipe_proto::Key>,
    /// Set once the plan is known (before any data connection is dialled).
    data: Arc<OnceLock<DataOpts>>,
}

struct EngineConn(ClientSession, Arc<OnceLock<DataOpts>>);

impl Link for EngineLink {
    fn connect(&self) -> Result<Box<dyn Conn>, CopyError> {
        match fatpipe_engine::connect(self.addr, self.key.as_ref(), "copy", &[]) {
            Ok(s) => Ok(Box::new(EngineConn(s, Arc::clone(&self.data)))),
            Err(e) => Err(classify(e)),
        }
    }
}

impl EngineConn {
    /// Applies this end's data socket settings (not to copy-control, tag 0).
    fn tuned(&self, tag: u32, s: TcpStream) -> TcpStream {
        if let (true, Some(opts)) = (tag > 0, self.1.get()) {
            opts.apply(&s);
        }
        s
    }
}

impl Conn for EngineConn {
    fn open(&self, tag: u32) -> Result<TcpStream, CopyError> {
        let s = self.0.open_data(tag).map_err(classify)?;
        Ok(self.tuned(tag, s))
    }

    fn open_early(&self, tag: u32) -> Result<TcpStream, CopyError> {
        let s = self.0.open_data_early(tag).map_err(classify)?;
        Ok(self.tuned(tag, s))
    }
}

/// What auto-tuning sets on this end's data sockets; the server's share
/// travels in the request ([`remote_tuning`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct DataOpts {
    /// This end sends (push): the buffer is SO_SNDBUF, and congestion
    /// control and pacing apply; otherwise SO_RCVBUF only.
    sends: bool,
    buffer: Option<u64>,
    forced: bool,
    congestion: Option<String>,
    pacing_rate: Option<u64>,
}

impl DataOpts {
    /// From merged settings; `--bwlimit` replaces the plan's pacing.
    fn new(s: &auto::Settings, sends: bool, bwlimit: Option<u64>) -> DataOpts {
        DataOpts {
            sends,
            buffer: s.buffer,
            forced: s.forced_buffers,
            congestion: if sends { s.congestion.clone() } else { None },
            pacing_rate: if sends && bwlimit.is_none() {
                s.pacing_rate
            } else {
                None
            },
        }
    }

    /// Best effort: a refused option leaves the kernel's default, which
    /// still copies correctly, so failures are not errors.
    fn apply(&self, s: &TcpStream) {
        if let Some(b) = self.buffer {
            let _ = if self.sends {
                fatpipe_sys::set_send_buffer(s, b, self.forced)
            } else {
                fatpipe_sys::set_recv_buffer(s, b, self.forced)
            };
        }
        if let Some(cc) = &self.congestion {
            let _ = fatpipe_sys::set_congestion(s, cc);
        }
        if let Some(r) = self.pacing_rate {
            let _ = fatpipe_sys::set_max_pacing_rate(s, r / 8);
        }
    }
}

/// What the server sets on its data sockets: the same buffer at the other
/// end of each stream (so the planned window holds there too, instead of
/// kernel autotuning's), and for a pull, where the server sends, the
/// congestion control and pacing (`--bwlimit` replaces the pacing; the
/// server applies it from the request).
fn remote_tuning(s: &auto::Settings, push: bool, bwlimit: Option<u64>) -> SocketTuning {
    SocketTuning {
        buffer: s.buffer.unwrap_or(0),
        force: s.forced_buffers,
        congestion: if push {
            String::new()
        } else {
            s.congestion.clone().unwrap_or_default()
        },
        pacing: if push || bwlimit.is_some() {
            0
        } else {
            s.pacing_rate.unwrap_or(0)
        },
        start_window: 0,
        start_ms: 0,
    }
}

/// The streams, this end's and the server's socket settings and the record
/// of what auto-tuning did.
type Tuned = (u16, DataOpts, SocketTuning, Option<AutoTune>);

/// The pre-flight: probe, plan, print the `auto:` line, and return the
/// streams and socket settings (this end's and the server's) to copy with.
/// A failed probe falls back to the untuned default with a warning; a
/// refused key is a usage error (its message is returned).
fn auto_tune(
    args: &Args,
    plan: &Plan,
    addr: SocketAddr,
    key: Option<fatpipe_proto::Key>,
) -> Result<Tuned, String> {
    let role = if plan.job.push {
        auto::Role::Sender
    } else {
        auto::Role::Receiver
    };
    let options = fatpipe_engine::ClientOptions {
        key,
        ..fatpipe_engine::ClientOptions::default()
    };
    let cfg = auto::PreflightConfig::new(addr, options, role);
    let pre = match auto::preflight(&cfg) {
        Ok(p) => p,
        Err(e) if e.is_auth() => return Err(format!("{}: {e}", plan.host)),
        Err(e) => {
            if !args.quiet {
                eprintln!("fatpipe: copy: warning: auto-tuning off: {e}");
            }
            return Ok((
                DEFAULT_STREAMS,
                DataOpts::default(),
                SocketTuning::default(),
                None,
            ));
        }
    };
    let mut settings = auto::merge(&pre.plan, &auto::Overrides::default());
    // Streams also read, hash and write in parallel, which a short path's
    // single window would leave to one thread.
    settings.at_least(u32::from(DEFAULT_STREAMS));
    let streams = u16::try_from(settings.streams)
        .unwrap_or(session::MAX_STREAMS)
        .clamp(1, session::MAX_STREAMS);
    let opts = DataOpts::new(&settings, plan.job.push, plan.job.bwlimit);
    let mut tuning = remote_tuning(&settings, plan.job.push, plan.job.bwlimit);
    if let Some((window, hold)) = auto::start_window(&pre, &settings, &cfg.policy) {
        tuning.start_window = window;
        tuning.start_ms = u32::try_from(hold.as_millis()).unwrap_or(u32::MAX);
    }
    let mut record = auto::record(&pre, &settings, false);
    record.streams = u32::from(streams);
    if plan.job.bwlimit.is_some() && settings.pacing_rate.is_some() {
        record.pacing_rate = None;
        record.overridden.push("pacing".into());
    }
    if !args.quiet {
        let mut line = auto::line(&pre.plan, &settings);
        if settings.streams > pre.plan.streams {
            line += &format!(
                "; copy uses {} streams (they also read, hash and write in parallel)",
                settings.streams
            );
        }
        eprintln!("{line}");
        for w in &record.warnings {
            eprintln!("fatpipe: copy: warning: auto: {w}");
        }
    }
    Ok((streams, opts, tuning, Some(record)))
}

/// The in-flight adjuster of an auto-tuned copy: once a second it samples
/// the sending end (this end's sockets when pushing, the server's reports
/// when pulling), feeds `fatpipe_tune::Adjuster` and carries out what it
/// decides: more streams, or another congestion control at the sender.
/// It outlives reconnects: a new session is brought back to the streams
/// and congestion control the adjuster had reached.
struct Tuning {
    /// Built at the first session, when the server's answer is known.
    adjuster: Mutex<Option<Adjuster>>,
    plan: fatpipe_schema::tune::Plan,
    /// The window each stream is held at, when the plan sets buffers.
    buffer: Option<u64>,
    facts: fatpipe_schema::tune::PathFacts,
    streams: u32,
    congestion: Option<String>,
    decisions: Mutex<Vec<Decision>>,
    /// When data started flowing (the adjuster's time zero).
    zero: Mutex<Option<Instant>>,
    samples: Mutex<u32>,
    force_add: Option<(u32, u32)>,
    trace: bool,
    quiet: bool,
}

impl Tuning {
    fn new(
        rec: &AutoTune,
        streams: u32,
        congestion: Option<String>,
        bwlimit: Option<u64>,
        quiet: bool,
    ) -> Tuning {
        let mut facts = rec.facts.clone();
        // A rate the probe could not push past (this host sent its trains
        // no faster) is a floor, not the path's rate: the adjuster would
        // take reaching it for "at the path rate" and never act.
        if rec.rate_lower_bound {
            facts.bottleneck_rate = None;
        }
        // A rate cap is the most this copy may reach: below it there is no
        // shortfall to add streams for.
        if let Some(cap) = bwlimit {
            facts.bottleneck_rate = Some(facts.bottleneck_rate.map_or(cap, |r| r.min(cap)));
        }
        let force_add = test_hook(TEST_ADD_ENV).and_then(|v| {
            let (n, k) = v.split_once('@')?;
            Some((n.trim().parse().ok()?, k.trim().parse().ok()?))
        });
        Tuning {
            adjuster: Mutex::new(None),
            plan: rec.plan.clone(),
            buffer: rec.buffer.filter(|_| rec.plan.set_buffers),
            facts,
            streams,
            congestion,
            decisions: Mutex::new(Vec::new()),
            zero: Mutex::new(None),
            samples: Mutex::new(0),
            force_add,
            trace: std::env::var_os(TRACE_ENV).is_some(),
            quiet,
        }
    }

    fn decisions(&self) -> Vec<Decision> {
        lock(&self.decisions).clone()
    }

    /// The adjuster, made at the first session from what the server said
    /// (pulling, the server sends: its congestion control and choices).
    fn adjuster_for(&self, live: &Live) -> Adjuster {
        let acc = live.accepted();
        let (congestion, allowed) = match live.direction() {
            Direction::Push => (
                self.congestion.clone().unwrap_or_default(),
                fatpipe_transfer::live::congestion_allowed(),
            ),
            Direction::Pull => (acc.congestion.clone(), acc.congestion_allowed.clone()),
        };
        let mut plan = self.plan.clone();
        plan.streams = self.streams;
        plan.congestion = congestion;
        let max = ADJUST_MAX_STREAMS
            .max(self.streams)
            .min(u32::from(acc.max_streams.max(1)));
        let bbr = allowed.iter().any(|c| c == "bbr");
        let mut cfg = AdjustConfig::for_plan(&plan, &self.facts, max, bbr);
        // Receivers hold the planned windows, so CUBIC may carry a clean
        // transfer without over-filling the queue (see adjust.rs).
        cfg.cruise = fatpipe_tune::adjust::cruise_control(self.plan.set_buffers, &allowed);
        // Each stream's share of the planned window (copy may use more
        // streams than planned, each with a share): what one more adds.
        cfg.stream_window = self.buffer;
        Adjuster::new(cfg)
    }

    /// Runs beside one session until it ends.
    fn run(&self, live: &Live) {
        let (want, cc) = {
            let mut a = lock(&self.adjuster);
            let adj = a.get_or_insert_with(|| self.adjuster_for(live));
            (adj.streams(), adj.congestion().to_string())
        };
        // A reconnected session starts with the planned streams: restore
        // what the adjuster had reached before the drop.
        let switched = lock(&self.decisions)
            .iter()
            .any(|d| matches!(d.action, Action::SwitchCongestion { .. }));
        let mut restored = false;
        let mut last: Option<(Instant, u64, u64)> = None;
        while !live.sleep(ADJUST_INTERVAL) {
            let Some(s) = live.sample() else { continue };
            if !restored {
                restored = true;
                let have = u32::from(s.streams);
                if want > have {
                    let n = u16::try_from(want - have).unwrap_or(u16::MAX);
                    let _ = live.add_streams(n, SETUP_WAIT);
                }
                if switched {
                    let _ = live.set_congestion(&cc);
                }
            }
            // Pulling, the sender's counters come from the server.
            let Some(sender) = s.sender else { continue };
            let now = Instant::now();
            let Some((t0, bytes0, retrans0)) = last.replace((now, s.bytes, sender.retransmits))
            else {
                continue;
            };
            let dt = now.duration_since(t0).as_secs_f64().max(1e-3);
            let throughput = (s.bytes.saturating_sub(bytes0) as f64 * 8.0 / dt) as u64;
            let zero = *lock(&self.zero).get_or_insert(t0);
            let sample = Sample {
                now: now.duration_since(zero),
                throughput,
                retransmits: sender.retransmits.saturating_sub(retrans0),
                rtt: Duration::from_micros(u64::from(sender.rtt_us)),
            };
            let k = {
                let mut n = lock(&self.samples);
                *n += 1;
                *n
            };
            let decision = match self.force_add {
                Some((n, at)) if at == k => Decision {
                    at_secs: sample.now.as_secs_f64(),
                    action: Action::AddStreams { n },
                    streams: u32::from(s.streams) + n,
                    reason: format!("test hook {TEST_ADD_ENV}: {n} streams at sample {k}"),
                },
                _ => match lock(&self.adjuster).as_mut() {
                    Some(a) => a.handle_sample(sample),
                    None => continue,
                },
            };
            if self.trace {
                eprintln!(
                    "auto: sample {k} at {:.1} s: {} streams, {}, {} retransmits, RTT {} ({}): {:?} {}",
                    sample.now.as_secs_f64(),
                    s.streams,
                    units::format_rate(sample.throughput as f64),
                    sample.retransmits,
                    units::format_duration(sample.rtt),
                    sender.congestion,
                    decision.action,
                    decision.reason
                );
            }
            self.carry_out(live, decision);
        }
    }

    fn carry_out(&self, live: &Live, mut d: Decision) {
        let outcome = match d.action.clone() {
            Action::Hold => return,
            Action::AddStreams { n } => {
                let n16 = u16::try_from(n).unwrap_or(u16::MAX);
                match live.add_streams(n16, SETUP_WAIT) {
                    Ok(got) if got == n16 => Ok(()),
                    Ok(got) => {
                        d.action = Action::AddStreams { n: u32::from(got) };
                        Err(format!("the server granted {got} of {n}"))
                    }
                    Err(e) => Err(e),
                }
            }
            Action::SwitchCongestion { to } => live.set_congestion(&to),
        };
        d.streams = u32::from(live.streams());
        if let Err(why) = &outcome {
            d.reason = format!("{} ({why})", d.reason);
        }
        if !self.quiet {
            let what = match &d.action {
                Action::AddStreams { n } => format!("+{n} streams"),
                Action::SwitchCongestion { to } => format!("congestion control → {to}"),
                Action::Hold => String::new(),
            };
            let clear = if std::io::stderr().is_terminal() {
                "\r\x1b[K"
            } else {
                ""
            };
            eprintln!("{clear}auto: {what} at {:.1} s: {}", d.at_secs, d.reason);
        }
        lock(&self.decisions).push(d);
    }
}

/// How long adding streams may take (the server's own accept timeout
/// plus a margin).
const SETUP_WAIT: Duration = Duration::from_secs(40);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn env_number(name: &str) -> Option<u32> {
    test_hook(name)?.trim().parse().ok()
}

/// A test hook's value: read only with the `test-hooks` feature, so that
/// ordinary builds ignore the FATPIPE_TEST_COPY_* variables.
#[cfg(feature = "test-hooks")]
fn test_hook(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Without the `test-hooks` feature no test hook is set.
#[cfg(not(feature = "test-hooks"))]
fn test_hook(_name: &str) -> Option<String> {
    None
}

fn classify(e: EngineError) -> CopyError {
    if e.is_auth() {
        return CopyError::Usage(format!("{e} (check --key-file)"));
    }
    match e {
        EngineError::Io { .. } | EngineError::Timeout(_) => CopyError::Network(e.to_string()),
        other => CopyError::Failed(other.to_string()),
    }
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
        chunk_size: u64::from(job.chunk_size),
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
        problems: r.problems.clone(),
        auto: None,
    }
}

fn print_summary(r: &CopyReport) {
    let dur = Duration::from_secs_f64(r.seconds);
    if r.files_verified == 0 && r.files_failed == 0 && r.files_skipped == r.files_total {
        println!(
            "nothing to copy: all {} files ({}) are already up to date (checked in {})",
            r.files_total,
            units::format_bytes(r.bytes_total),
            units::format_duration(dur)
        );
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
    println!(
        "{} streams, {} chunks; I/O here: {}, on the server: {}",
        r.streams,
        units::format_bytes_iec(r.chunk_size),
        r.io_local,
        r.io_remote
    );
}

fn progress_bar(p: &Progress, stop: &AtomicBool) {
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

fn peak_rss() -> u64 {
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

    fn record(rate: Option<u64>, lower_bound: bool) -> AutoTune {
        AutoTune {
            facts: fatpipe_schema::tune::PathFacts {
                rtt_secs: 0.093,
                bottleneck_rate: rate,
                loss_rate: 0.0,
                mtu: 1500,
            },
            plan: fatpipe_schema::tune::Plan {
                streams: 4,
                per_stream_buffer: 4 << 20,
                set_buffers: true,
                forced_buffers: false,
                congestion: "cubic".into(),
                pacing_rate: None,
                bdp: None,
                reason: "auto: test".into(),
            },
            streams: 4,
            buffer: None,
            forced_buffers: false,
            congestion: Some("cubic".into()),
            pacing_rate: None,
            overridden: vec![],
            probe_secs: 1.0,
            rate_lower_bound: lower_bound,
            adjusting: true,
            decisions: vec![],
            warnings: vec![],
        }
    }

    #[test]
    fn the_adjuster_gets_a_rate_only_when_it_is_the_paths() {
        const G: u64 = 1_000_000_000;
        let t = Tuning::new(&record(Some(G), false), 4, None, None, true);
        assert_eq!(t.facts.bottleneck_rate, Some(G));
        // A probe that could not outpace the path only bounds its rate.
        let t = Tuning::new(&record(Some(G), true), 4, None, None, true);
        assert_eq!(t.facts.bottleneck_rate, None);
        // --bwlimit is the most this copy may reach.
        let t = Tuning::new(&record(Some(G), true), 4, None, Some(G / 10), true);
        assert_eq!(t.facts.bottleneck_rate, Some(G / 10));
        let t = Tuning::new(&record(Some(G / 20), false), 4, None, Some(G / 10), true);
        assert_eq!(t.facts.bottleneck_rate, Some(G / 20));
    }

    #[test]
    fn auto_settings_go_to_the_sending_end_and_bwlimit_replaces_pacing() {
        let s = auto::Settings {
            streams: 5,
            buffer: Some(3 << 20),
            forced_buffers: false,
            congestion: Some("cubic".into()),
            pacing_rate: Some(200_000_000),
            overridden: vec![],
        };
        let push = DataOpts::new(&s, true, None);
        assert_eq!(push.buffer, Some(3 << 20));
        assert_eq!(push.congestion.as_deref(), Some("cubic"));
        assert_eq!(push.pacing_rate, Some(200_000_000));
        // Pulling, this end receives: only its receive buffer is set.
        let pull = DataOpts::new(&s, false, None);
        assert_eq!(
            (pull.buffer, pull.congestion, pull.pacing_rate),
            (Some(3 << 20), None, None)
        );
        assert_eq!(DataOpts::new(&s, true, Some(1_000_000)).pacing_rate, None);
        // The server's end: on a push it receives (buffer only); on a pull
        // it sends with the plan's congestion control and pacing, unless
        // --bwlimit paces it instead.
        let to_server = |push, bwlimit| {
            let t = remote_tuning(&s, push, bwlimit);
            (t.buffer, t.force, t.congestion, t.pacing)
        };
        assert_eq!(to_server(true, None), (3 << 20, false, String::new(), 0));
        assert_eq!(
            to_server(false, None),
            (3 << 20, false, "cubic".to_string(), 200_000_000)
        );
        assert_eq!(to_server(false, Some(1_000_000)).3, 0);
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
        assert_eq!(p.job.chunk_size, 8 << 20);

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
    fn exports_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        assert!(
            CopyService::new(&[format!("data={d}"), format!("pub={d}:ro:public")], true).is_ok()
        );
        for bad in [
            format!("data={d}/missing"),
            "nodir".to_string(),
            format!("a b={d}"),
        ] {
            let e = CopyService::new(std::slice::from_ref(&bad), true)
                .err()
                .expect(&bad);
            assert!(is_usage(&e), "{bad}");
        }
        let e = CopyService::new(&[format!("x={d}"), format!("x={d}")], true)
            .err()
            .unwrap();
        assert!(e.to_string().contains("twice"));
    }
}
