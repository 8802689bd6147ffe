//! Sessions: the client's reconnecting driver and the server's handler.
//!
//! Both ends speak the same roles once connected: whoever has the files runs
//! [`run_source`], whoever stores them runs [`run_sink`]. Push makes the
//! client the source; pull makes the server the source. Only the opening
//! differs: the client dials the copy-control connection (tag 0), sends a
//! [`Request`] and, without waiting for the answer, dials the data
//! connections (tags 1..=N); it gets [`Msg::Accept`] or [`Msg::Refuse`]. The
//! manifest and the needs are exchanged while the data connections are still
//! being set up: each end takes them only once it knows what to send.
//! The control connection has `TCP_NODELAY`: its messages are small and each
//! waits for an answer, which Nagle would hold back for a delayed ACK.
//!
//! Connecting does not wait for a pre-flight probe either: [`Prepare`]
//! completes the job (streams, socket settings) once the control connection
//! is open, just before the request that carries them.
//!
//! How connections are made is behind [`Link`] / [`Conn`] on the client and
//! an `accept` function on the server, so the engine (authentication,
//! cookies) plugs in from the binary and tests here run over plain loopback.
//!
//! Resume and reconnect are one mechanism: when a session breaks (a dropped
//! connection, a killed peer), the client waits with exponential backoff
//! and starts a new session with the same request. The receiver's journal
//! and the skip-if-complete check mean only what is missing moves again.
//! Refusals and authentication failures are not retried.

use std::io::{self, Read, Write};
use std::net::Shutdown;

use fatpipe_secure::Stream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::beneath::{Dir, ResolveError};
use crate::hash::Algo;
use crate::io::keepalive;
use crate::live::{congestion_allowed, CtrlSend, Live, Pool};
use crate::manifest::{entry_cost, Limits, Manifest, WalkError, MAX_MANIFEST_BYTES};
use crate::relpath::RelPath;
use crate::sink::{Sink, SinkOptions};
use crate::source::{Source, SourceOptions};
use crate::wire::{
    entries_messages, need_messages, read_msg, write_msg, Accept, Direction, Entry, EntryKind,
    Hello, Msg, Note, Refuse, RefuseClass, Request, SocketTuning, Summary, MAX_NOTES, MAX_TEXT,
    VERSION,
};
use crate::{Failure, Progress};

/// Smallest and largest chunk sizes a server accepts.
pub const CHUNK_LIMITS: (u32, u32) = (64 * 1024, 64 << 20);
/// Most data connections per session.
pub const MAX_STREAMS: u16 = 256;
/// How long the server waits for the request and the data connections
/// (also for connections added mid-session). The client may hold its
/// control connection open this long before its request while a pre-flight
/// probe (a few seconds) runs; past [`PREPARE_REUSE`] it dials afresh.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// A control connection that waited longer than this for [`Prepare`] is
/// not used for the request (the server may be about to give up on it):
/// the client connects again.
pub const PREPARE_REUSE: Duration = Duration::from_secs(15);
/// How often a sending server reports its TCP counters ([`Msg::Stats`]).
pub const STATS_INTERVAL: Duration = Duration::from_secs(1);

/// Why the server got no connection from its [`AcceptFn`].
#[derive(Debug)]
pub enum AcceptError {
    /// None came within the time given.
    Timeout,
    /// None will come: the session or the server is over (one line why).
    Failed(String),
}

/// Yields a server session's next connection, waiting at most the time
/// given; called from several of the session's threads.
pub type AcceptFn<'a> = dyn Fn(Duration) -> Result<Stream, AcceptError> + Sync + 'a;

/// How long one wait for a late data connection lasts before the waiter
/// checks whether the session is over.
const LATE_SLICE: Duration = Duration::from_millis(50);

/// How a running session gets more data connections.
pub enum Grow<'a> {
    /// The server: grants [`Msg::AddStreams`] up to `max` data connections
    /// in all, then accepts the new ones through `accept` (with the
    /// setup timeout and the same data hello as at setup).
    Server {
        /// Yields the session's next connection, waiting at most the time given.
        accept: &'a AcceptFn<'a>,
        /// The most data connections of the session.
        max: u16,
    },
    /// The client: opens the connections the server granted with `open`
    /// (tags continue after the last one) and reports to `live`.
    Client {
        /// Opens data connection `tag` (called from several threads at once).
        open: &'a (dyn Fn(u32) -> Result<Stream, CopyError> + Sync),
        /// The tuner's handle on this session.
        live: Arc<Live>,
    },
}

/// A tuner run on its own thread beside each client session: it watches
/// the session through [`Live`] and returns when [`Live::ended`].
pub type Tuner<'a> = dyn Fn(&Live) + Sync + 'a;

/// Completes the job before the first request: called once, when the first
/// session's control connection is open (or that session failed before),
/// so that connecting overlaps whatever decides the streams and socket
/// settings (the pre-flight probe). Its error ends the copy, and comes
/// before the session's own: a failed probe explains a failed connect.
pub type Prepare<'a> = dyn FnMut(&mut Job) -> Result<(), CopyError> + 'a;

/// A session's data connections, dialled (client) or queued by the engine
/// (server) while the manifest is exchanged, and taken one by one as each
/// is ready: data flows on the first while the others are on their way,
/// so a lost SYN or data hello costs that stream a retransmission, not
/// the whole session its start (on a 228 ms path with 1 % loss one of 32
/// connections usually loses one, and everything waited 0.5–1 s for it).
pub struct DataConns<'a> {
    /// How many the session starts with (at least one).
    pub count: u16,
    /// The next one, waiting as long as set-up may take; `None` once the
    /// flag is set (the session is over and wants no more).
    pub next: NextConn<'a>,
}

/// How [`DataConns`] yields its next connection.
pub type NextConn<'a> =
    Box<dyn FnMut(&AtomicBool) -> Option<Result<Stream, CopyError>> + Send + 'a>;

impl DataConns<'_> {
    /// The first connection, however long set-up takes.
    fn first(&mut self) -> Result<Stream, CopyError> {
        (self.next)(&AtomicBool::new(false))
            .unwrap_or_else(|| Err(CopyError::Failed("no data connection".into())))
    }

    /// Hands the connections after the first to `start` as they come,
    /// until all came or `ended` is set. The first that fails, or that
    /// `start` cannot take, goes to `fail` and stops the rest: the session
    /// ends, as it did when set-up awaited every connection. Once `ended`
    /// is set (the session's outcome is decided) a failure is no longer
    /// one: the peer may be closing what it no longer needs.
    fn feed_late(
        mut self,
        ended: &AtomicBool,
        start: impl Fn(Stream) -> io::Result<()>,
        fail: impl FnOnce(CopyError),
    ) {
        for _ in 1..self.count {
            let failed = match (self.next)(ended) {
                None => return,
                Some(Ok(s)) => match start(s) {
                    Ok(()) => continue,
                    Err(e) => net(e),
                },
                Some(Err(e)) => e,
            };
            if !ended.load(Ordering::SeqCst) {
                fail(failed);
            }
            return;
        }
    }
}

/// How a copy failed.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// The user must fix something: a path, an export, the key (exit 2).
    #[error("{0}")]
    Usage(String),
    /// The connection failed or dropped; the client retries these.
    #[error("{0}")]
    Network(String),
    /// Anything else that retrying would not fix (exit 1).
    #[error("{0}")]
    Failed(String),
    /// A pull whose chunk auto-tuning chose got a manifest of more chunks
    /// than the receiver's bound at that size: the client asks again at
    /// this one, which fits (never returned from [`run_client`]).
    #[error("the manifest needs chunks of {} or more; the client asks again", fatpipe_schema::units::format_bytes_iec(u64::from(*.0)))]
    Rechunk(u32),
}

/// A way to start sessions with a server (the engine, or loopback in tests).
pub trait Link: Send + Sync {
    /// Starts a new session.
    fn connect(&self) -> Result<Box<dyn Conn>, CopyError>;
}

/// One session's way to open connections to the server. Data connections
/// are opened in parallel (each costs round trips), hence `Sync`.
pub trait Conn: Send + Sync {
    /// Opens connection `tag` (0 is copy-control, 1.. are data).
    fn open(&self, tag: u32) -> Result<Stream, CopyError>;

    /// Opens data connection `tag` for sending only, returning as soon as
    /// the bytes written next may follow the opening handshake (a round
    /// trip before [`open`](Self::open) would); a refusal shows as a failed
    /// write. By default the same as `open`.
    fn open_early(&self, tag: u32) -> Result<Stream, CopyError> {
        self.open(tag)
    }

    /// Opens connection `tag` with `hello` (the copy protocol's) sent
    /// right behind the opening handshake, and returns once the server
    /// attached it: a round trip before `open` and then the hello would
    /// let the server read it. By default `open`, then the hello.
    fn open_greeted(&self, tag: u32, hello: &[u8]) -> Result<Stream, CopyError> {
        let mut s = self.open(tag)?;
        s.write_all(hello).map_err(net)?;
        Ok(s)
    }
}

/// What the client was asked to do.
#[derive(Debug, Clone)]
pub struct Job {
    /// Push or pull.
    pub direction: Direction,
    /// The export name.
    pub export: String,
    /// Pull: export-relative sources. Push: one element, the destination
    /// (a trailing `/` means "into this directory").
    pub remote: Vec<Vec<u8>>,
    /// Push: local sources.
    pub local_sources: Vec<PathBuf>,
    /// Pull: local destination.
    pub local_dest: PathBuf,
    /// Copy directories.
    pub recursive: bool,
    /// `--sync`.
    pub sync: bool,
    /// `--direct`.
    pub direct: bool,
    /// Chunk checksum.
    pub algo: Algo,
    /// Data connections.
    pub streams: u16,
    /// Chunk size.
    pub chunk_size: u32,
    /// The chunk size is the path's to choose, not given (`--chunk-size
    /// auto`): a [`Prepare`] sets it from the plan, and a manifest that
    /// would pass [`MAX_SESSION_CHUNKS`] at it has it doubled until it
    /// fits ([`fitting_chunk`]): before a push's request, and on a pull by
    /// asking again once the server's manifest came.
    pub auto_chunk: bool,
    /// Rate cap (bits/s) for the sending side when it is this client.
    pub bwlimit: Option<u64>,
    /// Socket settings the server applies to its data connections.
    pub tuning: SocketTuning,
    /// Reconnects allowed after a drop.
    pub retries: u32,
    /// Use `sendfile` when sending.
    pub sendfile: bool,
    /// Test hook: corrupt this data chunk on the wire when sending.
    pub corrupt_chunk: Option<u64>,
}

/// When the client's first session reached each step of its opening and
/// when the last one ended: the copy's start-up timeline is built from
/// these (reconnects keep the first session's opening).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marks {
    /// The control connection was open: connected, authenticated, the
    /// service named.
    pub connected: Option<Instant>,
    /// The job was complete ([`Prepare`] returned, or there was none).
    pub prepared: Option<Instant>,
    /// The server accepted the request.
    pub accepted: Option<Instant>,
    /// Every data connection the request asked for was open (data flows
    /// on each as it opens, so this may come after the first byte).
    pub data_open: Option<Instant>,
    /// The last session ended with every file verified or failed.
    pub done: Option<Instant>,
}

/// What a finished copy reports.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The opening and end of the sessions, for the start-up timeline.
    pub marks: Marks,
    /// The receiver's counters (from the last session).
    pub summary: Summary,
    /// Files that failed, one line each.
    pub failures: Vec<Failure>,
    /// What the sender's walk skipped or changed (specials, hard links,
    /// unreadable objects), whichever end walked.
    pub notes: Vec<Note>,
    /// Sessions started again after a drop.
    pub reconnects: u32,
    /// This end's I/O path.
    pub local_io: String,
    /// The server's I/O path.
    pub remote_io: String,
    /// What encrypted the sessions' connections (`--encrypt`), if anything.
    pub encryption: Option<fatpipe_secure::Encryption>,
    /// Data connections used.
    pub streams: u16,
    /// The chunk size the sessions used (the job's, or what its
    /// [`Prepare`] chose).
    pub chunk_size: u32,
    /// Files in the manifest.
    pub files_total: u64,
    /// Bytes in the manifest.
    pub bytes_total: u64,
    /// Payload bytes moved across all sessions of this run.
    pub bytes_moved: u64,
    /// Wall-clock time of the run: from the start, or with a [`Prepare`]
    /// from when it returned, to the end.
    pub elapsed: Duration,
}

/// Runs a copy as the client, reconnecting after drops within the budget.
/// `on_retry` is told about each reconnect (one line).
pub fn run_client(
    link: &dyn Link,
    job: &Job,
    progress: Arc<Progress>,
    on_retry: &dyn Fn(&str),
) -> Result<Report, CopyError> {
    run_client_tuned(link, job, progress, on_retry, None)
}

/// [`run_client`] with an in-flight tuner started beside every session.
pub fn run_client_tuned(
    link: &dyn Link,
    job: &Job,
    progress: Arc<Progress>,
    on_retry: &dyn Fn(&str),
    tuner: Option<&Tuner<'_>>,
) -> Result<Report, CopyError> {
    run_client_prepared(link, job, None, progress, on_retry, tuner)
}

/// [`run_client_tuned`] with the job completed by `prepare` once the first
/// control connection is open (see [`Prepare`]); the report's `elapsed`
/// then starts when `prepare` returns. Reconnects reuse the prepared job.
pub fn run_client_prepared(
    link: &dyn Link,
    job: &Job,
    mut prepare: Option<&mut Prepare<'_>>,
    progress: Arc<Progress>,
    on_retry: &dyn Fn(&str),
    tuner: Option<&Tuner<'_>>,
) -> Result<Report, CopyError> {
    let mut started = Instant::now();
    let mut job = job.clone();
    let local = match job.direction {
        Direction::Push => {
            let (m, into_dir) = local_manifest(&job)?;
            // rsync's rule: contents or several sources need a directory
            // at the destination, which the server learns from a '/'.
            if let Some(dest) = job.remote.first_mut() {
                if into_dir && !dest.is_empty() && !dest.ends_with(b"/") {
                    dest.push(b'/');
                }
            }
            Some(m)
        }
        Direction::Pull => None,
    };
    let mut report = Report::default();
    let mut backoff = Duration::from_millis(200);
    let mut attempt = 0u32;
    loop {
        let session = client_session(
            link,
            &mut job,
            &mut prepare,
            &mut started,
            local.as_ref(),
            Arc::clone(&progress),
            &mut report,
            tuner,
        );
        if session.is_err() {
            // Failed before preparing: what prepares (the probe) may
            // explain why, and a retry must not wait for it again.
            if let Some(p) = prepare.take() {
                p(&mut job)?;
                started = Instant::now();
            }
        }
        match session {
            Ok(()) => {
                if let Some(m) = &local {
                    // Capped as a pull's are, so both directions report alike.
                    report.notes = m.notes_to_send();
                }
                report.reconnects = attempt;
                report.elapsed = started.elapsed();
                return Ok(report);
            }
            // Not a failure: nothing was moved at the size that did not fit.
            Err(CopyError::Rechunk(chunk)) if chunk > job.chunk_size => {
                on_retry(&format!(
                    "the server's manifest has more than {MAX_SESSION_CHUNKS} chunks of {}; asking again with {} chunks",
                    fatpipe_schema::units::format_bytes_iec(u64::from(job.chunk_size)),
                    fatpipe_schema::units::format_bytes_iec(u64::from(chunk)),
                ));
                job.chunk_size = chunk;
            }
            Err(CopyError::Network(why)) if attempt < job.retries => {
                attempt += 1;
                on_retry(&format!(
                    "connection lost ({why}); reconnecting in {} ms (attempt {attempt} of {})",
                    backoff.as_millis(),
                    job.retries
                ));
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(CopyError::Network(why)) => {
                // Say which end is missing: a server never reached, or one
                // that went away (stopped, killed, unreachable) mid-copy.
                let what = if report.marks.connected.is_some() {
                    "the server went away"
                } else {
                    "cannot reach the server"
                };
                return Err(CopyError::Failed(format!(
                    "{what} ({why}); gave up after {attempt} reconnect(s) (re-run the same command to resume)"
                )));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Server configuration of one export: `name=path[:ro][:public][:encrypted]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Export {
    /// The name clients use (`HOST:NAME/path`).
    pub name: String,
    /// The directory it publishes.
    pub path: PathBuf,
    /// Refuse pushes.
    pub read_only: bool,
    /// Serve without the pre-shared key.
    pub public: bool,
    /// Serve only encrypted sessions (`--encrypt`).
    pub encrypted: bool,
}

impl std::str::FromStr for Export {
    type Err = String;

    fn from_str(s: &str) -> Result<Export, String> {
        let (name, mut rest) = s
            .split_once('=')
            .ok_or_else(|| format!("export '{s}': expected NAME=PATH[:ro][:public][:encrypted]"))?;
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        {
            return Err(format!(
                "export '{s}': the name may use letters, digits, '-', '_' and '.'"
            ));
        }
        let (mut read_only, mut public, mut encrypted) = (false, false, false);
        loop {
            if let Some(r) = rest.strip_suffix(":ro") {
                read_only = true;
                rest = r;
            } else if let Some(r) = rest.strip_suffix(":rw") {
                rest = r;
            } else if let Some(r) = rest.strip_suffix(":public") {
                public = true;
                rest = r;
            } else if let Some(r) = rest.strip_suffix(":encrypted") {
                encrypted = true;
                rest = r;
            } else {
                break;
            }
        }
        if rest.is_empty() {
            return Err(format!("export '{s}': missing the directory"));
        }
        Ok(Export {
            name: name.to_string(),
            path: PathBuf::from(rest),
            read_only,
            public,
            encrypted,
        })
    }
}

/// What the server's copy service knows.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The exports.
    pub exports: Vec<Export>,
    /// True when the server requires the pre-shared key (every session is
    /// then authenticated); otherwise only public exports are served.
    pub keyed: bool,
    /// Use `sendfile` when sending.
    pub sendfile: bool,
}

/// Serves one copy session. `accept` yields this session's connections
/// (copy-control first), waiting at most the given time.
pub fn serve(cfg: &ServerConfig, accept: &AcceptFn<'_>) -> Result<Summary, CopyError> {
    // The control connection comes first: the client dials the data
    // connections once it is acknowledged, and the engine queues them in
    // that order.
    let mut ctrl = accept(SETUP_TIMEOUT).map_err(accept_failed)?;
    // Small messages each awaiting an answer: Nagle would hold them back.
    ctrl.set_nodelay(true).map_err(net)?;
    // The client may hold the connection open while its pre-flight probe
    // runs (seconds) before the request comes: well within this.
    ctrl.set_read_timeout(Some(SETUP_TIMEOUT)).map_err(net)?;
    expect_hello(&mut ctrl, Hello::Control)?;
    let req = match read_msg(&mut ctrl).map_err(net)? {
        Msg::Request(r) => r,
        other => {
            return Err(CopyError::Failed(format!(
                "expected a request, got {other:?}"
            )))
        }
    };
    let checked = match refuse_plaintext(cfg, &req, ctrl.is_encrypted()) {
        Some(refuse) => Err(refuse),
        None => check_request(cfg, &req),
    };
    let plan = match checked {
        Ok(p) => p,
        Err(refuse) => {
            let _ = write_msg(&mut ctrl, &Msg::Refuse(refuse.clone()));
            drain_after_refusal(&mut ctrl);
            return Err(CopyError::Usage(refuse.message));
        }
    };
    let streams = req.streams.clamp(1, MAX_STREAMS);
    let progress = Arc::new(Progress::default());
    let io_name = match req.direction {
        Direction::Push if req.direct => "pwrite+O_DIRECT",
        Direction::Push => "pwrite",
        // sendfile would bypass TLS: encrypted streams are written.
        Direction::Pull if cfg.sendfile && !ctrl.is_encrypted() => "pread+sendfile",
        Direction::Pull => "pread+write",
    };
    let congestion = fatpipe_sys::get_congestion(ctrl.tcp()).unwrap_or_default();
    write_msg(
        &mut ctrl,
        &Msg::Accept(Accept {
            streams,
            io: io_name.into(),
            max_streams: MAX_STREAMS,
            congestion,
            congestion_allowed: congestion_allowed(),
        }),
    )
    .map_err(net)?;
    // The manifest and needs go first (the sink may take long to plan);
    // the data connections the client dialled meanwhile wait in the
    // engine's queue until the source or sink takes them.
    ctrl.set_read_timeout(None).map_err(net)?;
    // Every data connection, at set-up and added later, gets the plan's
    // socket settings as it is taken: the receiver's window hold takes
    // its size from the buffer set here.
    // Each is tuned before its hello is read: the client sends data right
    // behind the hello (and the needs are already on their way), so the
    // settings are in place before the data comes.
    let tuned_accept = |timeout: Duration| -> Result<Stream, AcceptError> {
        let s = accept(timeout)?;
        apply_tuning(&s, &req.tuning, req.direction);
        Ok(s)
    };
    let data = DataConns {
        count: streams,
        next: Box::new(|ended: &AtomicBool| {
            let end = Instant::now() + SETUP_TIMEOUT;
            // One queued is taken even when the session is over: the
            // client may be waiting for its End (see `feed_late`). Past
            // `ended`, one last wait of zero takes what came meanwhile.
            let mut over = false;
            loop {
                let left = end.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Some(Err(accept_failed(AcceptError::Timeout)));
                }
                let slice = if over {
                    Duration::ZERO
                } else {
                    left.min(LATE_SLICE)
                };
                match tuned_accept(slice) {
                    Ok(mut s) => return Some(greeted(&mut s).map(|()| s)),
                    Err(AcceptError::Timeout) if over => return None,
                    Err(AcceptError::Timeout) => over = ended.load(Ordering::SeqCst),
                    Err(e) => return Some(Err(accept_failed(e))),
                }
            }
        }),
    };
    let grow = Grow::Server {
        accept: &tuned_accept,
        max: MAX_STREAMS,
    };
    match plan {
        ServerPlan::Pull(m) => {
            let notes = m.notes_to_send();
            let src = Arc::new(Source::new(
                m.entries,
                m.origins,
                SourceOptions {
                    chunk_size: req.chunk_size,
                    algo: req.algo,
                    sendfile: cfg.sendfile,
                    bwlimit: (req.bwlimit > 0).then_some(req.bwlimit),
                    corrupt_chunk: SourceOptions::corrupt_from_env(),
                },
                progress,
            ));
            send_manifest(&mut ctrl, src.entries(), &notes)?;
            run_source(src, ctrl, data, &grow)
        }
        ServerPlan::Push {
            root,
            dest,
            into_dir,
        } => {
            let opts = sink_options(&req);
            let map = move |entries: &[Entry]| map_beneath(&root, dest.as_ref(), into_dir, entries);
            run_sink(ctrl, data, opts, progress, &map, &grow, false).map(|r| r.summary)
        }
    }
}

/// After refusing a request: a pushing client has sent its manifest
/// behind it, and closing with those bytes unread would reset the
/// connection, which may destroy the refusal before the client reads it.
/// So the server closes its side and reads until the client closes its own
/// (it does once it has read the refusal), for at most 3 s and 256 MiB.
fn drain_after_refusal(ctrl: &mut Stream) {
    const DRAIN_FOR: Duration = Duration::from_secs(3);
    const DRAIN_MAX: u64 = 256 << 20;
    let _ = ctrl.shutdown(Shutdown::Write);
    let end = Instant::now() + DRAIN_FOR;
    let mut left = DRAIN_MAX;
    let mut buf = [0u8; 64 << 10];
    while left > 0 {
        let now = Instant::now();
        if now >= end || ctrl.set_read_timeout(Some(end - now)).is_err() {
            return;
        }
        match ctrl.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => left = left.saturating_sub(n as u64),
        }
    }
}

/// Takes the needs for the manifest the caller sent ([`send_manifest`]:
/// a pushing client right behind its request, a pulling server behind its
/// answer), then the data connections, and streams until the receiver is
/// done. Streams added mid-session (`grow`) pull from the same queue.
pub fn run_source(
    src: Arc<Source>,
    mut ctrl: Stream,
    mut data: DataConns<'_>,
    grow: &Grow<'_>,
) -> Result<Summary, CopyError> {
    let mut needs = Vec::new();
    loop {
        match read_msg(&mut ctrl).map_err(net)? {
            Msg::Need(n) => needs.extend(n),
            Msg::NeedEnd => break,
            Msg::FileFailed { file, message } => {
                let _ = src.handle(Msg::FileFailed { file, message });
            }
            Msg::Abort { message } => {
                return Err(CopyError::Failed(format!("receiver: {message}")))
            }
            other => return Err(CopyError::Failed(format!("expected needs, got {other:?}"))),
        }
    }
    let first = data.first()?;
    src.plan(&needs);
    src.account_done_before(&needs);
    src.set_control(ctrl.try_clone().map_err(net)?);
    let pool = Arc::new(Pool::new(&ctrl, std::slice::from_ref(&first), data.count).map_err(net)?);
    if let Grow::Client { live, .. } = grow {
        live.attach(Arc::clone(&pool), Arc::clone(&src) as Arc<dyn CtrlSend>);
    }
    let threads = Mutex::new(vec![spawn_sender(&src, &pool, first)]);
    let (ended, late_err) = (AtomicBool::new(false), Mutex::new(None));
    let outcome = std::thread::scope(|scope| {
        scope.spawn(|| {
            data.feed_late(
                &ended,
                |s| {
                    pool.add(&s)?;
                    lock(&threads).push(spawn_sender(&src, &pool, s));
                    Ok(())
                },
                |e| {
                    *lock(&late_err) = Some(e);
                    src.stop();
                    pool.all();
                },
            )
        });
        let outcome = source_loop(&src, &pool, &mut ctrl, grow, &threads);
        ended.store(true, Ordering::SeqCst);
        outcome
    });
    let outcome = match lock(&late_err).take() {
        Some(e) => Err(e),
        None => outcome,
    };
    if outcome.is_err() {
        src.stop();
        pool.all();
    }
    let mut send_err = None;
    for t in threads.into_inner().unwrap_or_else(|p| p.into_inner()) {
        if let Ok(Err(e)) = t.join() {
            send_err.get_or_insert(e);
        }
    }
    outcome?;
    let _ = ctrl.shutdown(Shutdown::Both);
    src.done().ok_or_else(|| {
        CopyError::Network(send_err.map_or("session ended early".into(), |e| e.to_string()))
    })
}

/// The source's control loop: reports its counters (a sending server),
/// grows on request, and hands the receiver's messages to `src` until it
/// is done.
fn source_loop(
    src: &Arc<Source>,
    pool: &Arc<Pool>,
    ctrl: &mut Stream,
    grow: &Grow<'_>,
    threads: &Mutex<Vec<JoinHandle<io::Result<()>>>>,
) -> Result<(), CopyError> {
    keepalive(ctrl.tcp());
    // A sending server reports its counters so the client can tune.
    let stats_stop = Arc::new(AtomicBool::new(false));
    let stats = matches!(grow, Grow::Server { .. }).then(|| {
        let (src, pool, stop) = (Arc::clone(src), Arc::clone(pool), Arc::clone(&stats_stop));
        std::thread::spawn(move || {
            let step = Duration::from_millis(50);
            let mut next = Instant::now() + STATS_INTERVAL;
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(step);
                if Instant::now() < next {
                    continue;
                }
                next += STATS_INTERVAL;
                if src.send_control(&Msg::Stats(pool.sender_stats())).is_err() {
                    return;
                }
            }
        })
    });
    let outcome = loop {
        let msg = match read_msg(ctrl) {
            Ok(m) => m,
            Err(e) => break Err(net(e)),
        };
        let added = match (msg, grow) {
            (Msg::AddStreams { n }, Grow::Server { accept, max }) => {
                server_grow(n, *max, *accept, pool, &**src)
            }
            (Msg::StreamsAdded { n }, Grow::Client { open, live }) => {
                client_grow(n, *open, live, pool)
            }
            (Msg::SetCongestion { name }, Grow::Server { .. }) => {
                // Best effort: the next statistics show what took.
                let _ = pool.set_congestion(&name);
                Ok(Vec::new())
            }
            (msg, _) => match src.handle(msg) {
                Ok(true) => break Ok(()),
                Ok(false) => Ok(Vec::new()),
                Err(why) => break Err(CopyError::Failed(why)),
            },
        };
        match added {
            Ok(new) => lock(threads).extend(new.into_iter().map(|s| spawn_sender(src, pool, s))),
            Err(e) => break Err(e),
        }
    };
    stats_stop.store(true, Ordering::SeqCst);
    if let Some(t) = stats {
        let _ = t.join();
    }
    outcome
}

/// Sends a source's manifest: its entries, what the walk skipped or
/// changed (`notes` as [`Manifest::notes_to_send`] caps them: at most
/// [`MAX_NOTES`] + 1), then the entries' count.
fn send_manifest(ctrl: &mut Stream, entries: &[Entry], notes: &[Note]) -> Result<(), CopyError> {
    // Few large writes rather than one per message (no Nagle here).
    let mut w = io::BufWriter::with_capacity(1 << 20, ctrl);
    let stall = crate::Stall::default();
    for msg in entries_messages(entries) {
        write_msg(&mut w, &msg).map_err(net)?;
        if crate::Stall::armed("manifest") {
            // Part of the manifest is on its way, the rest never comes.
            w.flush().map_err(net)?;
            stall.check("manifest", 0);
        }
    }
    // A note's strings are cut to MAX_TEXT bytes (2 x 4 KiB): 100 notes
    // a frame stay well under its cap.
    let clip = |t: &str| {
        let mut end = t.len().min(MAX_TEXT);
        while !t.is_char_boundary(end) {
            end -= 1;
        }
        t[..end].to_string()
    };
    for batch in notes.chunks(100) {
        let batch = batch
            .iter()
            .map(|n| Note {
                kind: n.kind,
                path: clip(&n.path),
                detail: clip(&n.detail),
            })
            .collect();
        write_msg(&mut w, &Msg::Notes(batch)).map_err(net)?;
    }
    write_msg(
        &mut w,
        &Msg::EntriesEnd {
            count: entries.len() as u32,
        },
    )
    .map_err(net)?;
    w.flush().map_err(net)
}

fn spawn_sender(src: &Arc<Source>, pool: &Arc<Pool>, s: Stream) -> JoinHandle<io::Result<()>> {
    keepalive(s.tcp());
    let (src, pool) = (Arc::clone(src), Arc::clone(pool));
    std::thread::spawn(move || {
        let r = src.send(s);
        if r.is_err() && src.done().is_none() {
            src.stop();
            pool.all();
        }
        r
    })
}

fn spawn_receiver(sink: &Arc<Sink>, pool: &Arc<Pool>, s: Stream) -> JoinHandle<()> {
    keepalive(s.tcp());
    let (sk, pool) = (Arc::clone(sink), Arc::clone(pool));
    std::thread::spawn(move || {
        if let Err(e) = sk.receive(s) {
            if !sk.finished() {
                sk.abort(format!("data connection: {e}"));
                pool.all();
            }
        }
    })
}

/// Server: answers a request for `n` more streams with what the cap
/// allows, then accepts that many with the setup timeout. A connection
/// that does not come fails the session (the client resumes it).
fn server_grow(
    n: u16,
    max: u16,
    accept: &AcceptFn<'_>,
    pool: &Pool,
    ctrl: &dyn CtrlSend,
) -> Result<Vec<Stream>, CopyError> {
    let grant = n.min(max.saturating_sub(pool.streams()));
    pool.promise(grant);
    ctrl.send_control(&Msg::StreamsAdded { n: grant })
        .map_err(net)?;
    let mut out = Vec::new();
    for _ in 0..grant {
        let mut s = accept(SETUP_TIMEOUT).map_err(accept_failed)?;
        greeted(&mut s)?;
        pool.add(&s).map_err(net)?;
        out.push(s);
    }
    Ok(out)
}

/// Client: opens the `n` streams the server granted and tells the tuner.
fn client_grow(
    n: u16,
    open: &(dyn Fn(u32) -> Result<Stream, CopyError> + Sync),
    live: &Live,
    pool: &Pool,
) -> Result<Vec<Stream>, CopyError> {
    let tags: Vec<u32> = (0..n).map(|_| live.next_tag()).collect();
    pool.promise(n);
    let opened = open_data(open, &tags).and_then(|v| {
        for s in &v {
            pool.add(s).map_err(net)?;
        }
        Ok(v)
    });
    live.streams_added(match &opened {
        Ok(_) => Ok(n),
        Err(e) => Err(e.to_string()),
    });
    opened
}

/// Dials the data connections `tags` on threads of `scope` (at most 32 at
/// once), each with its data hello, and yields each as it is ready.
fn dial_each<'scope, 'env>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    open: &'env (dyn Fn(u32) -> Result<Stream, CopyError> + Sync),
    tags: &'env [u32],
) -> mpsc::Receiver<Result<Stream, CopyError>> {
    let (tx, rx) = mpsc::channel();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for _ in 0..tags.len().min(32) {
        let (tx, next) = (tx.clone(), Arc::clone(&next));
        scope.spawn(move || {
            while let Some(&tag) = tags.get(next.fetch_add(1, Ordering::Relaxed)) {
                let r = open(tag);
                // Nobody takes it once the session is over: it is shut.
                if let Err(mpsc::SendError(r)) = tx.send(r) {
                    shut(r);
                }
            }
        });
    }
    rx
}

/// Ends a data connection the session will not use with a FIN (dropping
/// it is not enough while another handle to the socket lives): the server
/// reads its hello, then its end, with nothing to report (a reset could
/// reach it first and read as a failure).
fn shut(r: Result<Stream, CopyError>) {
    if let Ok(s) = r {
        let _ = s.shutdown(Shutdown::Write);
    }
}

/// Opens the data connections `tags` at once ([`dial_each`]), each with
/// its data hello: every one costs a few round trips (connect, the
/// engine's cookie check), which one after another would add seconds on a
/// long path. The first failure is the result; the others are shut.
fn open_data(
    open: &(dyn Fn(u32) -> Result<Stream, CopyError> + Sync),
    tags: &[u32],
) -> Result<Vec<Stream>, CopyError> {
    std::thread::scope(|scope| dial_each(scope, open, tags).into_iter().collect())
}

enum SinkEvent {
    /// More streams: asked for (server) or granted (client).
    Grow(u16),
    /// The sink is complete or aborted.
    Finished(Result<Summary, String>),
}

/// Maps the manifest to a destination directory (and an optional new name
/// for its single top-level item).
pub type MapDest<'a> = dyn Fn(&[Entry]) -> Result<(Dir, Option<Vec<u8>>), CopyError> + 'a;

/// What a receiving session ends with.
#[derive(Debug)]
pub struct SinkResult {
    /// The receiver's counters.
    pub summary: Summary,
    /// Files that failed, one line each.
    pub failures: Vec<Failure>,
    /// What the sender's walk skipped or changed.
    pub notes: Vec<Note>,
}

/// Takes the manifest, plans, sends the needs, then takes the data
/// connections and receives until complete, reports `Done`.
///
/// `chunk_may_grow`: the receiving client of a pull whose chunk auto-tuning
/// chose; a manifest past [`MAX_SESSION_CHUNKS`] at `opts.chunk_size` then
/// ends the session with [`CopyError::Rechunk`] instead of a refusal.
pub fn run_sink(
    mut ctrl: Stream,
    mut data: DataConns<'_>,
    opts: SinkOptions,
    progress: Arc<Progress>,
    map: &MapDest<'_>,
    grow: &Grow<'_>,
    chunk_may_grow: bool,
) -> Result<SinkResult, CopyError> {
    let mut entries = Vec::new();
    let mut notes = Vec::new();
    let mut bytes = 0usize;
    loop {
        match read_msg(&mut ctrl).map_err(net)? {
            Msg::Notes(n) => {
                if notes.len() + n.len() > MAX_NOTES + 1 {
                    return Err(CopyError::Failed(format!(
                        "more than {MAX_NOTES} notes from the sender"
                    )));
                }
                notes.extend(n)
            }
            Msg::Entries(e) => {
                if entries.len() + e.len() > MAX_ENTRIES {
                    return Err(CopyError::Failed(format!(
                        "more than {MAX_ENTRIES} entries"
                    )));
                }
                bytes = add_manifest_cost(bytes, &e)?;
                entries.extend(e)
            }
            Msg::EntriesEnd { count } if count as usize == entries.len() => break,
            other => {
                return Err(CopyError::Failed(format!(
                    "bad manifest from sender: {other:?}"
                )))
            }
        }
    }
    // The receiver keeps a flag per chunk of every file: a manifest naming
    // a 2^60-byte file must not make it allocate gigabytes.
    if let Err(refused) = check_session_chunks(&entries, opts.chunk_size) {
        let fit = Some(fitting_chunk(&entries, opts.chunk_size))
            .filter(|&c| chunk_may_grow && c > opts.chunk_size)
            .filter(|&c| check_session_chunks(&entries, c).is_ok());
        let e = fit.map_or(refused, CopyError::Rechunk);
        let _ = write_msg(
            &mut ctrl,
            &Msg::Abort {
                message: e.to_string(),
            },
        );
        return Err(e);
    }
    let (base, rename) = match map(&entries) {
        Ok(x) => x,
        Err(e) => {
            let _ = write_msg(
                &mut ctrl,
                &Msg::Abort {
                    message: e.to_string(),
                },
            );
            return Err(e);
        }
    };
    if let Some(name) = rename {
        entries = rename_top(entries, &name)?;
    }
    progress.total_files.store(
        entries
            .iter()
            .filter(|e| matches!(e.kind, EntryKind::File { .. }))
            .count() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
    progress.total_bytes.store(
        entries
            .iter()
            .map(|e| match e.kind {
                EntryKind::File { size, .. } => size,
                _ => 0,
            })
            .sum(),
        std::sync::atomic::Ordering::Relaxed,
    );
    let (sink, needs) = Sink::prepare(base, entries, opts, progress)
        .map_err(|e| CopyError::Failed(e.to_string()))?;
    let sink = Arc::new(sink);
    // Failures found while planning go to the sender before the needs.
    sink.set_control(ctrl.try_clone().map_err(net)?);
    {
        let mut w = io::BufWriter::with_capacity(1 << 20, &mut ctrl);
        for msg in need_messages(needs) {
            write_msg(&mut w, &msg).map_err(net)?;
        }
        write_msg(&mut w, &Msg::NeedEnd).map_err(net)?;
        w.flush().map_err(net)?;
    }
    let first = data.first()?;
    let pool = Arc::new(Pool::new(&ctrl, std::slice::from_ref(&first), data.count).map_err(net)?);
    if let Grow::Client { live, .. } = grow {
        live.attach(Arc::clone(&pool), Arc::clone(&sink) as Arc<dyn CtrlSend>);
    }
    let threads = Mutex::new(vec![spawn_receiver(&sink, &pool, first)]);
    let ended = AtomicBool::new(false);
    let looped = std::thread::scope(|scope| {
        scope.spawn(|| {
            data.feed_late(
                &ended,
                |s| {
                    pool.add(&s)?;
                    lock(&threads).push(spawn_receiver(&sink, &pool, s));
                    Ok(())
                },
                |e| {
                    sink.abort(format!("data connection: {e}"));
                    pool.all();
                },
            )
        });
        // `Done` goes out before the late connections are given up (the
        // client shuts those that come after): the sender must know the
        // copy is complete before it sees one close.
        let looped = sink_loop(&sink, &pool, &ctrl, grow, &threads).map(|(result, reader)| {
            let sent = result.map(|summary| {
                let sent = sink.send_done(&summary);
                (summary, sent)
            });
            (sent, reader)
        });
        ended.store(true, Ordering::SeqCst);
        looped
    });
    let threads = threads.into_inner().unwrap_or_else(|p| p.into_inner());
    let (result, reader) = match looped {
        Ok(r) => r,
        Err(e) => {
            pool.all();
            for t in threads {
                let _ = t.join();
            }
            return Err(e);
        }
    };
    match result {
        Ok((summary, sent)) => {
            // Each stream's End follows its last chunk, which has come: the
            // receivers end at once, unless the sender keeps a connection
            // open without its End, which must not hold a thread forever.
            join_within(threads, END_GRACE, || pool.all());
            pool.all();
            let _ = reader.join();
            sent.map_err(net)?;
            Ok(SinkResult {
                summary,
                failures: sink.failures(),
                notes,
            })
        }
        Err(why) => {
            pool.all();
            for t in threads {
                let _ = t.join();
            }
            let _ = reader.join();
            Err(CopyError::Network(why))
        }
    }
}

/// How long a complete sink waits for each stream's End before it shuts
/// the streams that have not ended.
const END_GRACE: Duration = Duration::from_secs(5);

/// Joins `threads`, calling `give_up` (which must make them return) if any
/// is still running after `grace`.
fn join_within(threads: Vec<JoinHandle<()>>, grace: Duration, give_up: impl FnOnce()) {
    let until = Instant::now() + grace;
    while !threads.iter().all(|t| t.is_finished()) {
        if Instant::now() >= until {
            give_up();
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for t in threads {
        let _ = t.join();
    }
}

/// The sink's control loop: reads the sender's messages on a thread of
/// its own, grows on request, and waits until the sink is complete or
/// aborted. Returns how it ended and the reader, to be joined once the
/// connections are shut.
#[allow(clippy::type_complexity)]
fn sink_loop(
    sink: &Arc<Sink>,
    pool: &Arc<Pool>,
    ctrl: &Stream,
    grow: &Grow<'_>,
    threads: &Mutex<Vec<JoinHandle<()>>>,
) -> Result<(Result<Summary, String>, JoinHandle<()>), CopyError> {
    let live = match grow {
        Grow::Client { live, .. } => Some(Arc::clone(live)),
        Grow::Server { .. } => None,
    };
    keepalive(ctrl.tcp());
    let (tx, rx) = mpsc::channel();
    let reader = {
        let sk = Arc::clone(sink);
        let mut c = ctrl.try_clone().map_err(net)?;
        let td = Arc::clone(pool);
        let tx = tx.clone();
        std::thread::spawn(move || loop {
            let stop = |why: String| {
                sk.abort(why);
                td.all();
            };
            match (read_msg(&mut c), &live) {
                (Ok(Msg::FileFailed { file, message }), _) => sk.remote_failure(file, message),
                (Ok(Msg::Abort { message }), _) => {
                    return stop(format!("sender aborted: {message}"));
                }
                // The server is asked for streams; the client is granted them.
                (Ok(Msg::AddStreams { n }), None) | (Ok(Msg::StreamsAdded { n }), Some(_)) => {
                    if tx.send(SinkEvent::Grow(n)).is_err() {
                        return;
                    }
                }
                (Ok(Msg::Stats(st)), Some(l)) => l.set_remote(st),
                (Ok(other), _) => {
                    return stop(format!("unexpected message from sender: {other:?}"));
                }
                (Err(e), _) => {
                    if !sk.finished() {
                        stop(format!("control connection: {e}"));
                    }
                    return;
                }
            }
        })
    };
    let waiter = {
        let sk = Arc::clone(sink);
        std::thread::spawn(move || {
            let _ = tx.send(SinkEvent::Finished(sk.wait()));
        })
    };
    let result = loop {
        match rx.recv() {
            Ok(SinkEvent::Finished(r)) => break r,
            Ok(SinkEvent::Grow(n)) => {
                let added = match grow {
                    Grow::Server { accept, max } => server_grow(n, *max, *accept, pool, &**sink),
                    Grow::Client { open, live } => client_grow(n, *open, live, pool),
                };
                match added {
                    Ok(new) => {
                        lock(threads).extend(new.into_iter().map(|s| spawn_receiver(sink, pool, s)))
                    }
                    Err(e) => {
                        sink.abort(format!("adding streams: {e}"));
                        pool.all();
                    }
                }
            }
            Err(_) => break Err("the session's waiter stopped".into()),
        }
    };
    let _ = waiter.join();
    if let (Ok(_), Grow::Client { open, live }) = (&result, grow) {
        // Finished while asking for streams: the server may already have
        // granted them and be waiting for them (not reading our Done), so
        // open what it grants; they only carry its End.
        let end = Instant::now() + SETUP_TIMEOUT;
        while live.asking() && Instant::now() < end {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(SinkEvent::Grow(n)) => {
                    if let Ok(new) = client_grow(n, *open, live, pool) {
                        lock(threads)
                            .extend(new.into_iter().map(|s| spawn_receiver(sink, pool, s)));
                    }
                    break;
                }
                Ok(SinkEvent::Finished(_)) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
    }
    Ok((result, reader))
}

/// The most manifest entries one session accepts.
pub const MAX_ENTRIES: usize = 16_000_000;

/// The most chunks (over all files) one receiving session tracks: a byte
/// each, so 64 MiB of flags; 128 TiB at the default 2 MiB chunks.
pub const MAX_SESSION_CHUNKS: u64 = 1 << 26;

/// Adds a batch of received entries to the manifest's running cost
/// ([`entry_cost`]); refuses, with one line, past [`MAX_MANIFEST_BYTES`].
fn add_manifest_cost(bytes: usize, batch: &[Entry]) -> Result<usize, CopyError> {
    let bytes = batch
        .iter()
        .map(entry_cost)
        .fold(bytes, usize::saturating_add);
    if bytes > MAX_MANIFEST_BYTES {
        return Err(CopyError::Failed(format!(
            "the manifest is larger than {} MiB (the receiver's bound)",
            MAX_MANIFEST_BYTES >> 20
        )));
    }
    Ok(bytes)
}

/// Checks the chunks over every file a received manifest declares against
/// [`MAX_SESSION_CHUNKS`] (the receiver keeps a flag per chunk: a manifest
/// naming a 2^60-byte file must not make it allocate gigabytes); the
/// count, or the one-line refusal.
fn check_session_chunks(entries: &[Entry], chunk_size: u32) -> Result<u64, CopyError> {
    let chunks = entries
        .iter()
        .map(|e| match e.kind {
            EntryKind::File { size, .. } => crate::plan::chunk_count(size, chunk_size),
            _ => 0,
        })
        .fold(0u64, u64::saturating_add);
    if chunks > MAX_SESSION_CHUNKS {
        return Err(CopyError::Failed(format!(
            "the manifest holds {chunks} chunks, more than the receiver's bound of \
             {MAX_SESSION_CHUNKS} (at {} per chunk); use larger chunks or copy less at once",
            fatpipe_schema::units::format_bytes_iec(u64::from(chunk_size))
        )));
    }
    Ok(chunks)
}

/// `chunk`, doubled until the files of `entries` make at most
/// [`MAX_SESSION_CHUNKS`] chunks, within [`CHUNK_LIMITS`].
fn fitting_chunk(entries: &[Entry], chunk: u32) -> u32 {
    let sizes: Vec<u64> = entries
        .iter()
        .filter_map(|e| match e.kind {
            EntryKind::File { size, .. } => Some(size),
            _ => None,
        })
        .collect();
    crate::plan::chunk_to_fit(&sizes, chunk, MAX_SESSION_CHUNKS, CHUNK_LIMITS.1)
}

enum ServerPlan {
    Pull(Manifest),
    Push {
        root: Dir,
        dest: Option<RelPath>,
        into_dir: bool,
    },
}

/// The largest buffer a client may have the server force past its host
/// caps, per socket: forcing is for long fat paths whose BDP the caps cannot
/// cover, not a way for a client to pin the server's memory.
pub const MAX_FORCED_BUFFER: u64 = 256 << 20;

/// Applies the client's socket settings to one of the server's data
/// connections: the receive buffer on a push; send buffer, congestion
/// control, pacing and the unsent backlog on a pull (the server sends). Best effort, like the
/// client's own: a refused option leaves the kernel's default, which still
/// copies correctly.
fn apply_tuning(s: &Stream, t: &SocketTuning, direction: Direction) {
    if let Some(bytes) = planned_window(t) {
        let _ = match direction {
            Direction::Push => fatpipe_sys::set_recv_buffer(s.tcp(), bytes, t.force),
            Direction::Pull => fatpipe_sys::set_send_buffer(s.tcp(), bytes, t.force),
        };
    }
    if direction == Direction::Pull {
        if !t.congestion.is_empty() {
            let _ = fatpipe_sys::set_congestion(s.tcp(), &t.congestion);
        }
        if t.pacing > 0 {
            let _ = fatpipe_sys::set_max_pacing_rate(s.tcp(), t.pacing / 8);
        }
        if let Some(bytes) = planned_window(t) {
            let _ = fatpipe_sys::set_notsent_lowat(s.tcp(), crate::service::unsent_backlog(bytes));
        }
    }
}

/// The refusal of a plaintext session to an `:encrypted` export: one line
/// telling the client what to add.
fn refuse_plaintext(cfg: &ServerConfig, req: &Request, encrypted: bool) -> Option<Refuse> {
    let export = cfg
        .exports
        .iter()
        .find(|e| e.name.as_bytes() == &req.export[..])?;
    (export.encrypted && !encrypted).then(|| Refuse {
        class: RefuseClass::Usage,
        message: format!(
            "export '{}' requires encryption: add --encrypt (with --key-file)",
            export.name
        ),
    })
}

fn check_request(cfg: &ServerConfig, req: &Request) -> Result<ServerPlan, Refuse> {
    let usage = |m: String| Refuse {
        class: RefuseClass::Usage,
        message: m,
    };
    if req.version != VERSION {
        return Err(usage(format!(
            "copy protocol version {} is not supported (server speaks {VERSION}); use matching fatpipe versions",
            req.version
        )));
    }
    let name = String::from_utf8_lossy(&req.export);
    let Some(export) = cfg
        .exports
        .iter()
        .find(|e| e.name.as_bytes() == &req.export[..])
    else {
        let names: Vec<&str> = cfg.exports.iter().map(|e| e.name.as_str()).collect();
        return Err(usage(format!(
            "no export named '{name}' on this server (exports: {})",
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        )));
    };
    if !export.public && !cfg.keyed {
        return Err(usage(format!(
            "export '{name}' is not public: it needs the server's pre-shared key (the client passes --key-file; a server without a key serves only :public exports)"
        )));
    }
    if !(CHUNK_LIMITS.0..=CHUNK_LIMITS.1).contains(&req.chunk_size) {
        return Err(usage(format!(
            "chunk size {} is out of range",
            req.chunk_size
        )));
    }
    let root = Dir::open(&export.path).map_err(|e| Refuse {
        class: RefuseClass::Failed,
        message: format!("export '{name}' is unavailable: {e}"),
    })?;
    let bad_path =
        |p: &[u8], why: String| usage(format!("{name}/{}: {why}", String::from_utf8_lossy(p)));
    match req.direction {
        Direction::Push => {
            if export.read_only {
                return Err(usage(format!("export '{name}' is read-only")));
            }
            let raw = req.paths.first().cloned().unwrap_or_default();
            let dest = RelPath::parse_optional(&raw).map_err(|e| bad_path(&raw, e.to_string()))?;
            if let Some(d) = &dest {
                // Refuse escapes now, with a clear message, rather than after
                // the manifest: resolve the deepest existing ancestor.
                let (parent, _) = d.split_last();
                match root.dir_beneath(parent.as_ref()) {
                    Err(ResolveError::Escapes) => {
                        return Err(bad_path(&raw, "leads outside the export".into()))
                    }
                    Err(ResolveError::Io(e)) => return Err(bad_path(&raw, e.to_string())),
                    Ok(p) => {
                        if let Err(ResolveError::Escapes) = root.dir_beneath(Some(d)) {
                            return Err(bad_path(&raw, "leads outside the export".into()));
                        }
                        drop(p);
                    }
                }
            }
            Ok(ServerPlan::Push {
                root,
                dest,
                into_dir: raw.ends_with(b"/") && !raw.iter().all(|&b| b == b'/'),
            })
        }
        Direction::Pull => {
            if req.paths.is_empty() {
                return Err(usage("nothing to copy".into()));
            }
            let root = Arc::new(root);
            // The peer chose the tree: the walk is bounded.
            let mut m = Manifest::bounded(Limits {
                entries: MAX_ENTRIES,
                bytes: MAX_MANIFEST_BYTES,
            });
            for raw in &req.paths {
                let p = RelPath::parse_optional(raw).map_err(|e| bad_path(raw, e.to_string()))?;
                let contents = p.is_none() || raw.ends_with(b"/");
                if contents && !req.recursive {
                    return Err(bad_path(
                        raw,
                        "is a directory (use -r to copy directories)".into(),
                    ));
                }
                let walked = match &p {
                    None => m.add_contents(Arc::clone(&root)),
                    Some(p) if contents => {
                        // rsync's "dir/": the directory's contents. It
                        // must resolve as one, beneath the export.
                        match root.dir_beneath(Some(p)) {
                            Ok(d) => m.add_contents(Arc::new(d)),
                            Err(ResolveError::Escapes) => {
                                return Err(bad_path(raw, "leads outside the export".into()))
                            }
                            Err(ResolveError::Io(e)) => return Err(bad_path(raw, e.to_string())),
                        }
                    }
                    Some(p) => {
                        let (parent, last) = p.split_last();
                        let dir = match root.dir_beneath(parent.as_ref()) {
                            Ok(d) => Arc::new(d),
                            Err(ResolveError::Escapes) => {
                                return Err(bad_path(raw, "leads outside the export".into()))
                            }
                            Err(ResolveError::Io(e)) => return Err(bad_path(raw, e.to_string())),
                        };
                        let as_name =
                            RelPath::new(last).map_err(|e| bad_path(raw, e.to_string()))?;
                        m.add(dir, last, &as_name, req.recursive)
                    }
                };
                walked.map_err(|e| usage(format!("{name}/{e}")))?;
                if let Some(bound) = m.exceeded() {
                    return Err(usage(format!(
                        "{name}: the pull lists {bound}, past this server's bound \
                         (docs/security.md); pull a smaller part of the tree"
                    )));
                }
            }
            check_unique_tops(&m.entries).map_err(usage)?;
            Ok(ServerPlan::Pull(m))
        }
    }
}

fn sink_options(req: &Request) -> SinkOptions {
    SinkOptions {
        chunk_size: req.chunk_size,
        algo: req.algo,
        sync: req.sync,
        direct: req.direct,
        max_resends: 5,
        window: planned_window(&req.tuning),
        start: planned_start(&req.tuning),
    }
}

/// The receive window a data connection is held at: the plan's per-stream
/// buffer (capped as [`apply_tuning`] caps it), or none when the kernel's
/// autotuning is left in charge.
fn planned_window(t: &SocketTuning) -> Option<u64> {
    match (t.buffer, t.force) {
        (0, _) => None,
        (b, true) => Some(b.min(MAX_FORCED_BUFFER)),
        (b, false) => Some(b),
    }
}

/// The smaller window held during the sender's start-up, and for how long
/// (`WindowHold::starting_at` ignores one that is not smaller and caps the
/// time); none without a held window.
fn planned_start(t: &SocketTuning) -> Option<(u64, Duration)> {
    planned_window(t)?;
    (t.start_window > 0).then(|| (t.start_window, Duration::from_millis(u64::from(t.start_ms))))
}

/// Server side: where pushed entries go, beneath the export root.
fn map_beneath(
    root: &Dir,
    dest: Option<&RelPath>,
    into_dir: bool,
    entries: &[Entry],
) -> Result<(Dir, Option<Vec<u8>>), CopyError> {
    let Some(d) = dest else {
        return Ok((root.try_clone().map_err(fail)?, None));
    };
    let shown = d.display();
    match root.dir_beneath(Some(d)) {
        Ok(dir) => return Ok((dir, None)),
        Err(ResolveError::Escapes) => {
            return Err(CopyError::Usage(format!(
                "{shown}: leads outside the export"
            )))
        }
        Err(ResolveError::Io(e))
            if e.raw_os_error().is_some()
                && matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) => {}
        Err(ResolveError::Io(e)) => return Err(CopyError::Failed(format!("{shown}: {e}"))),
    }
    let (parent, name) = d.split_last();
    let pdir = match root.dir_beneath(parent.as_ref()) {
        Ok(p) => p,
        Err(ResolveError::Escapes) => {
            return Err(CopyError::Usage(format!(
                "{shown}: leads outside the export"
            )))
        }
        Err(ResolveError::Io(e)) => {
            return Err(CopyError::Usage(format!("{shown}: parent directory: {e}")))
        }
    };
    if renames_single_file(into_dir, entries) {
        return Ok((pdir, Some(name.to_vec())));
    }
    pdir.mkdir_at(name, 0o755)
        .map_err(|e| CopyError::Failed(format!("{shown}: {e}")))?;
    let dir = pdir
        .subdir(name)
        .map_err(|e| CopyError::Failed(format!("{shown}: {e}")))?;
    Ok((dir, None))
}

/// rsync's destination rule, the same at both ends. The destination is
/// a directory (created if missing, its last component only) that the
/// top-level entries go into, unless the copy is one file (or symlink)
/// named as such, not as a directory's contents, and the destination is
/// not an existing directory and has no trailing `/` (`into_dir`): then
/// the file takes the destination's name. A directory without a trailing
/// `/` goes inside the destination, whether or not it exists, so running
/// a command again lands where the first run did.
fn renames_single_file(into_dir: bool, entries: &[Entry]) -> bool {
    let mut tops = entries.iter().filter(|e| e.path.depth() == 1);
    match (tops.next(), tops.next()) {
        (Some(top), None) => !into_dir && !matches!(top.kind, EntryKind::Dir),
        _ => false,
    }
}

/// Client side: where pulled entries go on the local file system
/// (`into_dir`: the sources were contents, or several; see
/// [`renames_single_file`]).
fn map_local(
    dest: &Path,
    into_dir: bool,
    entries: &[Entry],
) -> Result<(Dir, Option<Vec<u8>>), CopyError> {
    let into_dir = into_dir || dest.as_os_str().as_encoded_bytes().ends_with(b"/");
    let shown = dest.display();
    if dest.is_dir() {
        return Ok((
            Dir::open(dest).map_err(|e| CopyError::Usage(format!("{shown}: {e}")))?,
            None,
        ));
    }
    let name = dest
        .file_name()
        .ok_or_else(|| CopyError::Usage(format!("{shown}: not a usable destination")))?;
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let pdir =
        Dir::open(parent).map_err(|e| CopyError::Usage(format!("{}: {e}", parent.display())))?;
    let name = name.as_encoded_bytes();
    if renames_single_file(into_dir, entries) {
        return Ok((pdir, Some(name.to_vec())));
    }
    pdir.mkdir_at(name, 0o755)
        .map_err(|e| CopyError::Usage(format!("{shown}: {e}")))?;
    Ok((
        pdir.subdir(name)
            .map_err(|e| CopyError::Failed(format!("{shown}: {e}")))?,
        None,
    ))
}

fn rename_top(entries: Vec<Entry>, name: &[u8]) -> Result<Vec<Entry>, CopyError> {
    entries
        .into_iter()
        .map(|mut e| {
            let p = match e.path.rest() {
                None => RelPath::new(name),
                Some(rest) => {
                    let mut v = name.to_vec();
                    v.push(b'/');
                    v.extend_from_slice(rest);
                    RelPath::new(&v)
                }
            };
            e.path = p.map_err(|err| {
                CopyError::Usage(format!(
                    "{}: cannot take the destination name '{}': {err}",
                    e.path.display(),
                    String::from_utf8_lossy(name)
                ))
            })?;
            Ok(e)
        })
        .collect()
}

fn check_unique_tops(entries: &[Entry]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for e in entries.iter().filter(|e| e.path.depth() == 1) {
        if !seen.insert(e.path.as_bytes()) {
            return Err(format!(
                "two sources are both named '{}' at the destination",
                e.path.display()
            ));
        }
    }
    Ok(())
}

/// Walks a push's local sources. A source ending in `/` (or `.`, `..`)
/// is its directory's contents (rsync's rule); any other is the item
/// itself under its own name. Also returns whether the destination must
/// be a directory: several sources, or contents.
fn local_manifest(job: &Job) -> Result<(Manifest, bool), CopyError> {
    let mut m = Manifest::default();
    let mut into_dir = job.local_sources.len() > 1;
    for src in &job.local_sources {
        let shown = src.display().to_string();
        if is_contents(src) {
            if !job.recursive {
                return Err(CopyError::Usage(format!(
                    "{shown}: is a directory (use -r to copy directories)"
                )));
            }
            into_dir = true;
            let dir = Dir::open(src).map_err(|e| CopyError::Usage(format!("{shown}: {e}")))?;
            m.add_contents(Arc::new(dir))
                .map_err(|e| CopyError::Failed(format!("{shown}: {e}")))?;
            continue;
        }
        let name = src
            .file_name()
            .ok_or_else(|| CopyError::Usage(format!("{shown}: not a usable source")))?
            .as_encoded_bytes()
            .to_vec();
        let parent = match src.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let dir = Dir::open(&parent).map_err(|e| CopyError::Usage(format!("{shown}: {e}")))?;
        let as_name = RelPath::new(&name).map_err(|e| CopyError::Usage(format!("{shown}: {e}")))?;
        m.add(Arc::new(dir), &name, &as_name, job.recursive)
            .map_err(|e| match e {
                WalkError::Io { .. } => CopyError::Failed(e.to_string()),
                other => CopyError::Usage(other.to_string()),
            })?;
    }
    check_unique_tops(&m.entries).map_err(CopyError::Usage)?;
    Ok((m, into_dir))
}

/// True for a local source that names a directory's contents: a trailing
/// `/`, or a last component `.` or `..` (rsync copies `.` as `./`).
fn is_contents(src: &Path) -> bool {
    let b = src.as_os_str().as_encoded_bytes();
    b.ends_with(b"/") || b == b"." || b == b".." || b.ends_with(b"/.") || b.ends_with(b"/..")
}

/// True for a pull whose sources need a directory at the destination:
/// several of them, or one naming a directory's contents (the export
/// itself, or a path ending in `/`).
fn pull_into_dir(remote: &[Vec<u8>]) -> bool {
    remote.len() > 1 || remote.iter().any(|r| r.is_empty() || r.ends_with(b"/"))
}

/// Connects, opens the control connection and sends its hello.
fn client_open(link: &dyn Link) -> Result<(Box<dyn Conn>, Stream), CopyError> {
    let conn = link.connect()?;
    let ctrl = conn.open_greeted(0, &Hello::Control.encode())?;
    // Small messages each awaiting an answer: Nagle would hold one back
    // until the server's delayed ACK of the one before.
    ctrl.set_nodelay(true).map_err(net)?;
    Ok((conn, ctrl))
}

#[allow(clippy::too_many_arguments)]
fn client_session(
    link: &dyn Link,
    job: &mut Job,
    prepare: &mut Option<&mut Prepare<'_>>,
    started: &mut Instant,
    local: Option<&Manifest>,
    progress: Arc<Progress>,
    report: &mut Report,
    tuner: Option<&Tuner<'_>>,
) -> Result<(), CopyError> {
    let (mut conn, mut ctrl) = client_open(link)?;
    report.marks.connected.get_or_insert_with(Instant::now);
    if let Some(p) = prepare.take() {
        let waited = Instant::now();
        p(job)?;
        *started = Instant::now();
        if waited.elapsed() > PREPARE_REUSE {
            drop(ctrl);
            (conn, ctrl) = client_open(link)?;
        }
    }
    report.marks.prepared.get_or_insert_with(Instant::now);
    if let (true, Direction::Push, Some(m)) = (job.auto_chunk, job.direction, local) {
        job.chunk_size = fitting_chunk(&m.entries, job.chunk_size);
    }
    report.chunk_size = job.chunk_size;
    let job = &*job;
    write_msg(
        &mut ctrl,
        &Msg::Request(Request {
            version: VERSION,
            direction: job.direction,
            recursive: job.recursive,
            sync: job.sync,
            direct: job.direct,
            algo: job.algo,
            streams: job.streams,
            chunk_size: job.chunk_size,
            bwlimit: job.bwlimit.unwrap_or(0),
            export: job.export.as_bytes().to_vec(),
            paths: job.remote.clone(),
            tuning: job.tuning.clone(),
        }),
    )
    .map_err(net)?;
    // A push's manifest follows at once: the server reads it right after
    // answering, so the needs come back with the answer.
    if let (Direction::Push, Some(m)) = (job.direction, local) {
        send_manifest(&mut ctrl, &m.entries, &m.notes_to_send())?;
    }
    // The server grants what it is asked for within its cap, so the data
    // connections are dialled now, while the request travels; each costs
    // round trips (connect, the engine's cookie check).
    let streams = job.streams.clamp(1, MAX_STREAMS);
    let conn = &*conn;
    // Each data connection's hello follows its opening handshake without
    // waiting for the server's acknowledgement, and so does pushed data:
    // the needs are back by then.
    let push = job.direction == Direction::Push;
    let hello = Hello::Data.encode();
    let open = move |tag: u32| {
        if push {
            let mut s = conn.open_early(tag)?;
            s.write_all(&hello).map_err(net)?;
            Ok(s)
        } else {
            conn.open_greeted(tag, &hello)
        }
    };
    let tags: Vec<u32> = (1..=u32::from(streams)).collect();
    let data_open = std::sync::OnceLock::new();
    std::thread::scope(|scope| {
        let dialed = dial_each(scope, &open, &tags);
        // The server may walk a large tree before answering a pull.
        ctrl.set_read_timeout(Some(Duration::from_secs(600)))
            .map_err(net)?;
        let accept = match read_msg(&mut ctrl).map_err(net)? {
            Msg::Accept(a) => a,
            Msg::Refuse(r) => {
                return Err(match r.class {
                    RefuseClass::Usage => CopyError::Usage(r.message),
                    RefuseClass::Failed => CopyError::Failed(r.message),
                })
            }
            other => return Err(CopyError::Failed(format!("unexpected reply {other:?}"))),
        };
        ctrl.set_read_timeout(None).map_err(net)?;
        if accept.streams != streams {
            return Err(CopyError::Failed(format!(
                "protocol error: asked for {streams} streams, the server granted {}",
                accept.streams
            )));
        }
        report.streams = accept.streams;
        report.remote_io = accept.io.clone();
        report.encryption = ctrl.encryption().cloned();
        report.marks.accepted.get_or_insert_with(Instant::now);
        let first_open = report.marks.data_open.is_none();
        let data_open = &data_open;
        let (mut taken, total) = (0, tags.len());
        let data = DataConns {
            count: streams,
            next: Box::new(move |ended: &AtomicBool| loop {
                // A connection that comes once the session is over is
                // shut: the server may no longer take it and send on it,
                // and its receiver there must not wait for an End.
                if ended.load(Ordering::SeqCst) {
                    while let Ok(r) = dialed.try_recv() {
                        shut(r);
                    }
                    return None;
                }
                match dialed.recv_timeout(LATE_SLICE) {
                    Ok(r) => {
                        taken += 1;
                        if taken == total && first_open {
                            let _ = data_open.set(Instant::now());
                        }
                        return Some(r);
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        return Some(Err(CopyError::Failed("a dialing thread stopped".into())))
                    }
                }
            }),
        };
        let live = Arc::new(Live::new(job.direction, accept));
        let grow = Grow::Client {
            open: &open,
            live: Arc::clone(&live),
        };
        let r = std::thread::scope(|scope| {
            if let Some(t) = tuner {
                let l = &*live;
                scope.spawn(move || t(l));
            }
            let r = client_roles(job, local, progress, report, ctrl, data, &grow);
            live.end();
            r
        });
        report.streams = report.streams.max(live.streams());
        if let Some(&at) = data_open.get() {
            report.marks.data_open = Some(at);
        }
        if r.is_ok() {
            report.marks.done = Some(Instant::now());
        }
        r
    })
}

fn client_roles(
    job: &Job,
    local: Option<&Manifest>,
    progress: Arc<Progress>,
    report: &mut Report,
    ctrl: Stream,
    data: DataConns<'_>,
    grow: &Grow<'_>,
) -> Result<(), CopyError> {
    match job.direction {
        Direction::Push => {
            let m = local.ok_or_else(|| CopyError::Failed("no manifest".into()))?;
            report.files_total = m.file_count() as u64;
            report.bytes_total = m.total_bytes();
            progress
                .total_files
                .store(report.files_total, std::sync::atomic::Ordering::Relaxed);
            progress
                .total_bytes
                .store(report.bytes_total, std::sync::atomic::Ordering::Relaxed);
            let src = Arc::new(Source::new(
                m.entries.clone(),
                m.origins.clone(),
                SourceOptions {
                    chunk_size: job.chunk_size,
                    algo: job.algo,
                    sendfile: job.sendfile,
                    bwlimit: job.bwlimit,
                    corrupt_chunk: job.corrupt_chunk,
                },
                progress,
            ));
            let r = run_source(Arc::clone(&src), ctrl, data, grow);
            report.local_io = src.io_path().into();
            merge_failures(&mut report.failures, src.failures());
            let summary = r?;
            report.bytes_moved += summary.bytes_written;
            report.summary = summary;
            Ok(())
        }
        Direction::Pull => {
            let opts = SinkOptions {
                chunk_size: job.chunk_size,
                algo: job.algo,
                sync: job.sync,
                direct: job.direct,
                max_resends: 5,
                window: planned_window(&job.tuning),
                start: planned_start(&job.tuning),
            };
            let dest = job.local_dest.clone();
            let into_dir = pull_into_dir(&job.remote);
            let p2 = Arc::clone(&progress);
            let map = move |entries: &[Entry]| map_local(&dest, into_dir, entries);
            let SinkResult {
                summary,
                failures,
                notes,
            } = run_sink(ctrl, data, opts, p2, &map, grow, job.auto_chunk)?;
            report.notes = notes;
            report.files_total = progress
                .total_files
                .load(std::sync::atomic::Ordering::Relaxed);
            report.bytes_total = progress
                .total_bytes
                .load(std::sync::atomic::Ordering::Relaxed);
            report.local_io = summary.io.clone();
            merge_failures(&mut report.failures, failures);
            report.bytes_moved += summary.bytes_written;
            report.summary = summary;
            Ok(())
        }
    }
}

fn merge_failures(into: &mut Vec<Failure>, new: Vec<Failure>) {
    // A retry reports the same failures again; keep the latest per path.
    into.retain(|f| !new.iter().any(|n| n.path == f.path));
    into.extend(new);
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Reads a data connection's hello, within the set-up timeout.
fn greeted(s: &mut Stream) -> Result<(), CopyError> {
    s.set_read_timeout(Some(SETUP_TIMEOUT)).map_err(net)?;
    expect_hello(s, Hello::Data)?;
    s.set_read_timeout(None).map_err(net)
}

/// The server's error for a connection that did not come.
fn accept_failed(e: AcceptError) -> CopyError {
    CopyError::Network(match e {
        AcceptError::Timeout => "timed out waiting for a connection".into(),
        AcceptError::Failed(why) => why,
    })
}

fn expect_hello(s: &mut Stream, want: Hello) -> Result<(), CopyError> {
    let mut b = [0u8; 8];
    s.read_exact(&mut b).map_err(net)?;
    match Hello::decode(&b) {
        Ok(h) if h == want => Ok(()),
        Ok(h) => Err(CopyError::Failed(format!(
            "expected a {want:?} connection, got {h:?}"
        ))),
        Err(e) => Err(CopyError::Failed(e.to_string())),
    }
}

fn net(e: io::Error) -> CopyError {
    if e.kind() == io::ErrorKind::InvalidData {
        return CopyError::Failed(format!("protocol error: {e}"));
    }
    if e.kind() == io::ErrorKind::UnexpectedEof {
        // read_exact's own words ("failed to fill whole buffer") say
        // nothing to a user: the peer closed the connection mid-message.
        return CopyError::Network("the other end closed the connection".into());
    }
    CopyError::Network(e.to_string())
}

fn fail(e: io::Error) -> CopyError {
    CopyError::Failed(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{journal_name, part_name};
    use std::collections::BTreeMap;
    use std::net::{TcpListener, TcpStream};
    use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    /// Plain-TCP link; records every stream so a test can cut them.
    struct TestLink {
        addr: std::net::SocketAddr,
        opened: Arc<Mutex<Vec<Stream>>>,
        on_connect: Option<Box<dyn Fn() + Send + Sync>>,
        /// A data connection dialled only after a wait (a lost SYN).
        slow_tag: Option<(u32, Duration)>,
    }

    struct TestConn {
        addr: std::net::SocketAddr,
        opened: Arc<Mutex<Vec<Stream>>>,
        slow_tag: Option<(u32, Duration)>,
    }

    impl Link for TestLink {
        fn connect(&self) -> Result<Box<dyn Conn>, CopyError> {
            if let Some(f) = &self.on_connect {
                f();
            }
            Ok(Box::new(TestConn {
                addr: self.addr,
                opened: Arc::clone(&self.opened),
                slow_tag: self.slow_tag,
            }))
        }
    }

    impl Conn for TestConn {
        fn open(&self, tag: u32) -> Result<Stream, CopyError> {
            if let Some((_, wait)) = self.slow_tag.filter(|&(t, _)| t == tag) {
                std::thread::sleep(wait);
            }
            let s = Stream::from(std::net::TcpStream::connect(self.addr).map_err(net)?);
            self.opened.lock().unwrap().push(s.try_clone().unwrap());
            Ok(s)
        }
    }

    struct TestServer {
        link: TestLink,
        stop: Arc<AtomicBool>,
        results: Arc<Mutex<Vec<Result<Summary, String>>>>,
    }

    impl Drop for TestServer {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::SeqCst);
        }
    }

    fn server(cfg: ServerConfig) -> TestServer {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let results = Arc::new(Mutex::new(Vec::new()));
        let (st, rs) = (Arc::clone(&stop), Arc::clone(&results));
        std::thread::spawn(move || {
            // Plain TCP has no cookie to route a connection to its session,
            // as the engine does; the sessions here come one at a time, so
            // the hello does: a session's first connection is its control
            // connection (data connections of the one before, which ended
            // without taking them, are closed), and a control connection
            // that comes while a session takes data ones is the next
            // session's, kept for it.
            let want_control = AtomicBool::new(true);
            let next_control: Mutex<Option<TcpStream>> = Mutex::new(None);
            let hello = |s: &TcpStream| {
                let mut b = [0u8; 8];
                s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                let n = s.peek(&mut b).unwrap_or(0);
                s.set_read_timeout(None).unwrap();
                (n == 8).then(|| Hello::decode(&b).ok()).flatten()
            };
            let accept = |t: Duration| -> Result<Stream, AcceptError> {
                let control = want_control.swap(false, Ordering::SeqCst);
                if control {
                    if let Some(s) = next_control.lock().unwrap().take() {
                        return Ok(Stream::from(s));
                    }
                }
                let end = Instant::now() + t;
                loop {
                    if st.load(Ordering::SeqCst) {
                        return Err(AcceptError::Failed("stopped".into()));
                    }
                    match l.accept() {
                        Ok((s, _)) => {
                            s.set_nonblocking(false).unwrap();
                            match (control, hello(&s)) {
                                (true, Some(Hello::Data)) => continue,
                                (false, Some(Hello::Control)) => {
                                    *next_control.lock().unwrap() = Some(s);
                                    return Err(AcceptError::Timeout);
                                }
                                _ => return Ok(Stream::from(s)),
                            }
                        }
                        Err(e) if e.kind() != io::ErrorKind::WouldBlock => {
                            return Err(AcceptError::Failed(e.to_string()))
                        }
                        Err(_) if Instant::now() < end => {
                            std::thread::sleep(Duration::from_millis(2))
                        }
                        Err(_) => return Err(AcceptError::Timeout),
                    }
                }
            };
            while !st.load(Ordering::SeqCst) {
                want_control.store(true, Ordering::SeqCst);
                let r = serve(&cfg, &accept);
                if st.load(Ordering::SeqCst) {
                    break;
                }
                rs.lock().unwrap().push(r.map_err(|e| e.to_string()));
            }
        });
        TestServer {
            link: TestLink {
                addr,
                opened: Arc::new(Mutex::new(Vec::new())),
                on_connect: None,
                slow_tag: None,
            },
            stop,
            results,
        }
    }

    fn export(name: &str, path: &Path, ro: bool) -> Export {
        Export {
            name: name.into(),
            path: path.to_path_buf(),
            read_only: ro,
            public: false,
            encrypted: false,
        }
    }

    fn job(direction: Direction, export: &str, remote: &[&str]) -> Job {
        Job {
            direction,
            export: export.into(),
            remote: remote.iter().map(|r| r.as_bytes().to_vec()).collect(),
            local_sources: vec![],
            local_dest: PathBuf::new(),
            recursive: true,
            sync: false,
            direct: false,
            algo: Algo::Xxh3,
            streams: 3,
            chunk_size: 64 * 1024,
            auto_chunk: false,
            bwlimit: None,
            tuning: SocketTuning::default(),
            retries: 3,
            sendfile: true,
            corrupt_chunk: None,
        }
    }

    fn pseudo_random(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// A tree with the awkward cases: odd names, empty dir and file, sparse
    /// file, symlinks (one pointing outside), multi-chunk file.
    fn make_tree(root: &Path) {
        let t = root.join("tree");
        std::fs::create_dir_all(t.join("empty dir")).unwrap();
        std::fs::create_dir_all(t.join("ünïcödé/deeper")).unwrap();
        std::fs::write(t.join("ünïcödé/deeper/small file.txt"), b"hello world").unwrap();
        std::fs::write(t.join("zero"), b"").unwrap();
        std::fs::write(t.join("N".repeat(255)), b"long name").unwrap();
        std::fs::write(t.join("big.bin"), pseudo_random(1_000_000, 7)).unwrap();
        let sparse = std::fs::File::create(t.join("sparse")).unwrap();
        sparse.set_len(3 << 20).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&sparse, b"middle", 1 << 20).unwrap();
        symlink("ünïcödé/deeper", t.join("inside-link")).unwrap();
        symlink("/etc/passwd", t.join("outside-link")).unwrap();
        std::fs::set_permissions(t.join("zero"), std::fs::Permissions::from_mode(0o640)).unwrap();
        let ro = t.join("ünïcödé/deeper");
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    }

    /// Everything a copy must reproduce, per relative path.
    fn snapshot(root: &Path) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
            let mut names: Vec<_> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            names.sort();
            for p in names {
                let rel = p.strip_prefix(base).unwrap().display().to_string();
                let m = std::fs::symlink_metadata(&p).unwrap();
                let desc = if m.file_type().is_symlink() {
                    format!("link {}", std::fs::read_link(&p).unwrap().display())
                } else if m.is_dir() {
                    walk(base, &p, out);
                    format!("dir {:o} {}", m.mode() & 0o7777, m.mtime())
                } else {
                    let data = std::fs::read(&p).unwrap();
                    format!(
                        "file {:o} {}.{} {} {:x}",
                        m.mode() & 0o7777,
                        m.mtime(),
                        m.mtime_nsec(),
                        data.len(),
                        xxhash_rust::xxh3::xxh3_64(&data)
                    )
                };
                out.insert(rel, desc);
            }
        }
        walk(root, root, &mut out);
        out
    }

    fn cfg(exports: Vec<Export>) -> ServerConfig {
        ServerConfig {
            exports,
            keyed: true,
            sendfile: true,
        }
    }

    #[test]
    fn a_receiver_whose_stream_never_ends_is_shut_after_the_grace() {
        // One receiver ends at once; the other blocks until it is shut
        // (as a socket read would until `pool.all()`).
        let (shut_tx, shut_rx) = mpsc::channel::<()>();
        let threads = vec![
            std::thread::spawn(|| {}),
            std::thread::spawn(move || {
                let _ = shut_rx.recv();
            }),
        ];
        let started = Instant::now();
        let gave_up = std::cell::Cell::new(false);
        join_within(threads, Duration::from_millis(200), || {
            gave_up.set(true);
            drop(shut_tx);
        });
        assert!(gave_up.get());
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert!(started.elapsed() < Duration::from_secs(5));

        // Receivers that end in time are joined without giving up.
        let threads = vec![std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(20))
        })];
        let gave_up = std::cell::Cell::new(false);
        join_within(threads, Duration::from_secs(5), || gave_up.set(true));
        assert!(!gave_up.get());
    }

    #[test]
    fn push_then_pull_reproduces_the_tree() {
        let src = tempfile::tempdir().unwrap();
        make_tree(src.path());
        let exp = tempfile::tempdir().unwrap();
        let srv = server(cfg(vec![export("data", exp.path(), false)]));
        let mut j = job(Direction::Push, "data", &[""]);
        j.local_sources = vec![src.path().join("tree")];
        let rep = run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
        assert!(rep.failures.is_empty(), "{:?}", rep.failures);
        assert_eq!(rep.summary.files_verified, 5);
        assert_eq!(
            snapshot(&src.path().join("tree")),
            snapshot(&exp.path().join("tree"))
        );
        // Holes stay holes.
        let m = std::fs::metadata(exp.path().join("tree/sparse")).unwrap();
        assert!(
            m.blocks() * 512 < 1 << 20,
            "sparse file was filled: {} blocks",
            m.blocks()
        );
        // No temporary names are left behind.
        assert!(!snapshot(exp.path()).keys().any(|k| k.contains(".fatpipe-")));

        // Same again: everything is skipped.
        let rep = run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
        assert_eq!(
            (rep.summary.files_skipped, rep.summary.bytes_written),
            (5, 0)
        );

        // Pull its contents back under a new name ("tree/": rsync's rule).
        let back = tempfile::tempdir().unwrap();
        let mut j = job(Direction::Pull, "data", &["tree/"]);
        j.local_dest = back.path().join("copy");
        j.algo = Algo::Blake3;
        let rep = run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
        assert!(rep.failures.is_empty(), "{:?}", rep.failures);
        assert_eq!(
            snapshot(&src.path().join("tree")),
            snapshot(&back.path().join("copy"))
        );
    }

    /// rsync's destination rule at both ends: the same command run twice
    /// lands in the same place, whether the destination existed or not.
    #[test]
    fn a_rerun_lands_where_the_first_run_did() {
        let src = tempfile::tempdir().unwrap();
        let exp = tempfile::tempdir().unwrap();
        let tree = src.path().join("tree");
        std::fs::create_dir_all(tree.join("sub")).unwrap();
        std::fs::write(tree.join("sub/only"), b"one file").unwrap();
        std::fs::write(src.path().join("file"), b"a file").unwrap();
        let srv = server(ServerConfig {
            exports: vec![export("data", exp.path(), false)],
            keyed: true,
            sendfile: true,
        });
        let push = |from: PathBuf, to: &str| {
            let mut j = job(Direction::Push, "data", &[to]);
            j.local_sources = vec![from];
            let rep = run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
            assert!(rep.failures.is_empty(), "{:?}", rep.failures);
            rep
        };
        let mut contents = tree.clone().into_os_string();
        contents.push("/");
        for _ in 0..2 {
            // "tree/" -> t: the contents, with or without t existing.
            push(PathBuf::from(&contents), "t");
            // "tree" -> u: the directory inside u.
            push(tree.clone(), "u");
            // "file" -> f: renamed; -> g/: inside g.
            push(src.path().join("file"), "f");
            push(src.path().join("file"), "g/");
        }
        let mut got: Vec<String> = snapshot(exp.path()).into_keys().collect();
        got.sort();
        assert_eq!(
            got,
            [
                "f",
                "g",
                "g/file",
                "t",
                "t/sub",
                "t/sub/only",
                "u",
                "u/tree",
                "u/tree/sub",
                "u/tree/sub/only"
            ]
        );
        // Pull: "t/" -> a new directory holds its contents, twice.
        let back = tempfile::tempdir().unwrap();
        for _ in 0..2 {
            let mut j = job(Direction::Pull, "data", &["t/"]);
            j.local_dest = back.path().join("p");
            run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
            let mut j = job(Direction::Pull, "data", &["t"]);
            j.local_dest = back.path().join("q");
            run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
        }
        let mut got: Vec<String> = snapshot(back.path()).into_keys().collect();
        got.sort();
        assert_eq!(
            got,
            [
                "p",
                "p/sub",
                "p/sub/only",
                "q",
                "q/t",
                "q/t/sub",
                "q/t/sub/only"
            ]
        );
    }

    #[test]
    fn corrupted_chunk_is_detected_and_sent_again() {
        let src = tempfile::tempdir().unwrap();
        std::fs::write(src.path().join("f"), pseudo_random(500_000, 3)).unwrap();
        let exp = tempfile::tempdir().unwrap();
        let srv = server(cfg(vec![export("data", exp.path(), false)]));
        let mut j = job(Direction::Push, "data", &["g"]);
        j.local_sources = vec![src.path().join("f")];
        j.corrupt_chunk = Some(2);
        let rep = run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
        assert_eq!(rep.summary.chunks_resent, 1);
        assert_eq!(rep.summary.files_verified, 1);
        assert_eq!(
            std::fs::read(src.path().join("f")).unwrap(),
            std::fs::read(exp.path().join("g")).unwrap()
        );
    }

    /// A 6 MiB push at ~7.5 MB/s whose connections are all cut once 2 MiB
    /// are in, so the first session drops mid-file.
    struct CutPush {
        _src: tempfile::TempDir,
        exp: tempfile::TempDir,
        srv: TestServer,
        job: Job,
        data: Vec<u8>,
        progress: Arc<Progress>,
        cutter: std::thread::JoinHandle<()>,
    }

    fn cut_push(seed: u64) -> CutPush {
        let src = tempfile::tempdir().unwrap();
        let data = pseudo_random(6 << 20, seed);
        std::fs::write(src.path().join("f"), &data).unwrap();
        let exp = tempfile::tempdir().unwrap();
        let srv = server(cfg(vec![export("data", exp.path(), false)]));
        let mut job = job(Direction::Push, "data", &[""]);
        job.local_sources = vec![src.path().join("f")];
        job.bwlimit = Some(60_000_000); // the first session takes a while
        let progress = Arc::new(Progress::default());
        let opened = Arc::clone(&srv.link.opened);
        let p2 = Arc::clone(&progress);
        let cutter = std::thread::spawn(move || {
            while p2.bytes.load(Ordering::Relaxed) < 2 << 20 {
                std::thread::sleep(Duration::from_millis(5));
            }
            for s in opened.lock().unwrap().drain(..) {
                let _ = s.shutdown(Shutdown::Both);
            }
        });
        CutPush {
            _src: src,
            exp,
            srv,
            job,
            data,
            progress,
            cutter,
        }
    }

    #[test]
    fn prepare_runs_once_with_the_control_connection_open_and_reconnects_skip_it() {
        let CutPush {
            _src,
            exp,
            srv,
            job: mut j,
            data,
            progress,
            cutter,
        } = cut_push(12);
        j.streams = 1;
        let calls = Mutex::new(Vec::new());
        let mut prepare = |job: &mut Job| -> Result<(), CopyError> {
            // Only the control connection is open: nothing waits on the plan.
            calls
                .lock()
                .unwrap()
                .push(srv.link.opened.lock().unwrap().len());
            std::thread::sleep(Duration::from_millis(300));
            job.streams = 3;
            Ok(())
        };
        let wall = Instant::now();
        let rep = run_client_prepared(
            &srv.link,
            &j,
            Some(&mut prepare),
            Arc::clone(&progress),
            &|_| {},
            None,
        )
        .unwrap();
        cutter.join().unwrap();
        assert_eq!(*calls.lock().unwrap(), vec![1]);
        assert_eq!(rep.reconnects, 1);
        assert_eq!(
            rep.streams, 3,
            "the prepared streams, also after the reconnect"
        );
        // The time waited for the plan is not the copy's.
        assert!(wall.elapsed() >= rep.elapsed + Duration::from_millis(300));
        assert_eq!(std::fs::read(exp.path().join("f")).unwrap(), data);
    }

    #[test]
    fn a_failed_prepare_comes_before_the_sessions_own_error() {
        let src = tempfile::tempdir().unwrap();
        std::fs::write(src.path().join("f"), b"x").unwrap();
        // Nothing listens here: the session fails before preparing.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let link = TestLink {
            addr: l.local_addr().unwrap(),
            opened: Arc::default(),
            on_connect: None,
            slow_tag: None,
        };
        drop(l);
        let mut j = job(Direction::Push, "data", &[""]);
        j.local_sources = vec![src.path().join("f")];
        let calls = Mutex::new(0);
        let mut prepare = |_: &mut Job| -> Result<(), CopyError> {
            *calls.lock().unwrap() += 1;
            Err(CopyError::Usage("the probe was refused".into()))
        };
        match run_client_prepared(&link, &j, Some(&mut prepare), Arc::default(), &|_| {}, None) {
            Err(CopyError::Usage(m)) => assert_eq!(m, "the probe was refused"),
            other => panic!("expected the prepare's error, got {other:?}"),
        }
        // A prepare that succeeds leaves the session's own error, retried
        // without preparing again.
        let mut prepare = |_: &mut Job| -> Result<(), CopyError> {
            *calls.lock().unwrap() += 1;
            Ok(())
        };
        j.retries = 2;
        let retried = Mutex::new(0);
        let r = run_client_prepared(
            &link,
            &j,
            Some(&mut prepare),
            Arc::default(),
            &|_| *retried.lock().unwrap() += 1,
            None,
        );
        assert!(matches!(r, Err(CopyError::Failed(_))), "{r:?}");
        assert_eq!(*calls.lock().unwrap(), 2);
        assert_eq!(*retried.lock().unwrap(), 2);
    }

    /// A file that is one chunk at this session's size may still have a
    /// journal and a part from a run that cut it smaller (an auto-tuned
    /// chunk follows the path): they go when the file takes its name, on
    /// both ways a one-chunk file is stored (a small one whole into an
    /// unnamed file, a larger one through its part).
    #[test]
    fn a_one_chunk_file_drops_what_an_earlier_smaller_cut_left() {
        let src = tempfile::tempdir().unwrap();
        let exp = tempfile::tempdir().unwrap();
        std::fs::create_dir(src.path().join("t")).unwrap();
        std::fs::create_dir(exp.path().join("t")).unwrap();
        let mut stale = Vec::new();
        for (name, size) in [("small", 100_000), ("large", 300_000)] {
            std::fs::write(src.path().join("t").join(name), pseudo_random(size, 3)).unwrap();
            for temp in [journal_name(name.as_bytes()), part_name(name.as_bytes())] {
                let p = exp.path().join("t").join(String::from_utf8(temp).unwrap());
                std::fs::write(&p, b"an earlier run's, at 64 KiB chunks").unwrap();
                stale.push(p);
            }
        }
        let srv = server(cfg(vec![export("data", exp.path(), false)]));
        let mut j = job(Direction::Push, "data", &[""]);
        j.local_sources = vec![src.path().join("t")];
        j.chunk_size = 512 << 10;
        let rep = run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
        assert_eq!(rep.summary.files_verified, 2);
        assert_eq!(
            snapshot(&src.path().join("t")),
            snapshot(&exp.path().join("t"))
        );
        for p in stale {
            assert!(!p.exists(), "{} was left", p.display());
        }
    }

    /// A receiving client tracks at most 2^26 chunks: a pull past that at
    /// the auto-tuned size asks again with chunks that fit, as a push fits
    /// its own before asking; a given size is refused with one line.
    #[test]
    fn an_auto_chunked_pull_past_the_chunk_bound_asks_again_with_larger_chunks() {
        let exp = tempfile::tempdir().unwrap();
        std::fs::create_dir(exp.path().join("huge")).unwrap();
        // 33 TiB in sparse files: past 2^26 chunks of 512 KiB (32 TiB),
        // within 2^26 of 1 MiB.
        for name in ["a", "b", "c"] {
            std::fs::File::create(exp.path().join("huge").join(name))
                .unwrap()
                .set_len(11 << 40)
                .unwrap();
        }
        let srv = server(cfg(vec![export("data", exp.path(), true)]));
        let back = tempfile::tempdir().unwrap();
        let mut j = job(Direction::Pull, "data", &["huge"]);
        // Past the manifest's check the destination fails (its parent is
        // missing), so none of the 33 TiB moves.
        j.local_dest = back.path().join("missing/huge");
        j.chunk_size = 512 << 10;
        let said = Mutex::new(Vec::<String>::new());
        let on_retry = |m: &str| said.lock().unwrap().push(m.to_string());
        match run_client(&srv.link, &j, Arc::default(), &on_retry) {
            Err(CopyError::Failed(m)) => {
                assert!(m.contains("use larger chunks"), "{m}")
            }
            other => panic!("a given chunk size must be refused, got {other:?}"),
        }
        assert!(said.lock().unwrap().is_empty());

        j.auto_chunk = true;
        match run_client(&srv.link, &j, Arc::default(), &on_retry) {
            Err(CopyError::Usage(m)) => assert!(m.contains("missing"), "{m}"),
            other => panic!("expected the destination's error, got {other:?}"),
        }
        let said = said.lock().unwrap();
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].ends_with("asking again with 1 MiB chunks"),
            "{said:?}"
        );
    }

    #[test]
    fn a_dropped_session_resumes_where_it_stopped() {
        let CutPush {
            _src,
            exp,
            srv,
            job: j,
            data,
            progress,
            cutter,
        } = cut_push(11);
        let retries = Mutex::new(0);
        let rep = run_client(&srv.link, &j, Arc::clone(&progress), &|_| {
            *retries.lock().unwrap() += 1
        })
        .unwrap();
        cutter.join().unwrap();
        assert_eq!(*retries.lock().unwrap(), 1);
        assert_eq!(rep.reconnects, 1);
        assert!(
            rep.summary.bytes_written < data.len() as u64 - (1 << 20),
            "the second session re-sent {} bytes",
            rep.summary.bytes_written
        );
        assert_eq!(std::fs::read(exp.path().join("f")).unwrap(), data);
        assert!(!snapshot(exp.path()).keys().any(|k| k.contains(".fatpipe-")));
    }

    /// Runs a copy with a tuner that asks for 3 more streams at its 2nd
    /// sample and (pulling) switches the server to reno at its 3rd; returns
    /// the report, what `add_streams` answered and the samples seen.
    fn tuned_copy(
        srv: &TestServer,
        j: &Job,
    ) -> (
        Report,
        Option<Result<u16, String>>,
        Vec<crate::live::LiveSample>,
    ) {
        let added = Mutex::new(None);
        let samples = Mutex::new(Vec::new());
        let tuner = |live: &Live| {
            let mut k = 0;
            while !live.sleep(Duration::from_millis(250)) {
                let Some(s) = live.sample() else { continue };
                samples.lock().unwrap().push(s);
                k += 1;
                if k == 2 {
                    *added.lock().unwrap() = Some(live.add_streams(3, Duration::from_secs(10)));
                }
                if k == 3 && live.direction() == Direction::Pull {
                    live.set_congestion("reno").unwrap();
                }
            }
        };
        let rep = run_client_tuned(&srv.link, j, Arc::default(), &|_| {}, Some(&tuner)).unwrap();
        let a = added.lock().unwrap().clone();
        let s = samples.lock().unwrap().clone();
        (rep, a, s)
    }

    #[test]
    fn streams_added_mid_copy_carry_data_and_the_copy_is_identical() {
        let src = tempfile::tempdir().unwrap();
        let t = src.path().join("t");
        std::fs::create_dir(&t).unwrap();
        std::fs::write(t.join("big"), pseudo_random(24 << 20, 21)).unwrap();
        for i in 0..50 {
            std::fs::write(t.join(format!("s{i}")), pseudo_random(5000 + i, i as u64)).unwrap();
        }
        let exp = tempfile::tempdir().unwrap();
        let srv = server(cfg(vec![export("data", exp.path(), false)]));
        let mut j = job(Direction::Push, "data", &[""]);
        j.local_sources = vec![t.clone()];
        j.streams = 2;
        j.bwlimit = Some(100_000_000); // ~2 s: the streams are added mid-copy
        let (rep, added, samples) = tuned_copy(&srv, &j);
        assert_eq!(added, Some(Ok(3)), "{samples:?}");
        assert_eq!(rep.streams, 5);
        assert!(rep.failures.is_empty(), "{:?}", rep.failures);
        assert_eq!(snapshot(&t), snapshot(&exp.path().join("t")));
        assert_eq!(
            rep.summary.bytes_written,
            (24 << 20) + (0..50).map(|i| 5000 + i).sum::<u64>()
        );
        // Push: the client's own sockets are the senders.
        assert!(samples.iter().all(|s| s.sender.is_some()), "{samples:?}");
        assert!(
            samples.last().is_some_and(|s| s.streams == 5),
            "{samples:?}"
        );
        // Control plus 5 data connections, and the added ones carried data.
        let opened = srv.link.opened.lock().unwrap();
        assert_eq!(opened.len(), 6);
        for s in &opened[3..] {
            let acked = fatpipe_sys::tcp_info(s.tcp())
                .unwrap()
                .bytes_acked
                .unwrap_or(0);
            assert!(acked > 1 << 20, "an added stream moved only {acked} bytes");
        }
        drop(opened);

        // Pull it back the same way: the server sends on the added streams,
        // reports its counters and switches congestion control when asked.
        srv.link.opened.lock().unwrap().clear();
        let back = tempfile::tempdir().unwrap();
        let mut j = job(Direction::Pull, "data", &["t/"]);
        j.local_dest = back.path().join("t");
        j.streams = 2;
        j.bwlimit = Some(100_000_000);
        let (rep, added, samples) = tuned_copy(&srv, &j);
        assert_eq!(added, Some(Ok(3)), "{samples:?}");
        assert_eq!(rep.streams, 5);
        assert_eq!(snapshot(&t), snapshot(&back.path().join("t")));
        let opened = srv.link.opened.lock().unwrap();
        assert_eq!(opened.len(), 6);
        for s in &opened[3..] {
            let got = fatpipe_sys::tcp_info(s.tcp())
                .unwrap()
                .bytes_received
                .unwrap_or(0);
            assert!(got > 1 << 20, "an added stream moved only {got} bytes");
        }
        let stats: Vec<_> = samples.iter().filter_map(|s| s.sender.clone()).collect();
        assert!(stats.iter().any(|s| s.bytes_acked > 0), "{samples:?}");
        assert!(
            stats
                .last()
                .is_some_and(|s| s.streams == 5 && s.congestion == "reno"),
            "{samples:?}"
        );
        let results = srv.results.lock().unwrap();
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    }

    #[test]
    fn the_server_grants_no_more_than_its_cap() {
        let src = tempfile::tempdir().unwrap();
        std::fs::write(src.path().join("f"), pseudo_random(8 << 20, 5)).unwrap();
        let exp = tempfile::tempdir().unwrap();
        let srv = server(cfg(vec![export("data", exp.path(), false)]));
        let mut j = job(Direction::Push, "data", &[""]);
        j.local_sources = vec![src.path().join("f")];
        j.streams = MAX_STREAMS - 1;
        j.bwlimit = Some(50_000_000);
        let (rep, added, _) = tuned_copy(&srv, &j);
        assert_eq!(added, Some(Ok(1)));
        assert_eq!(rep.streams, MAX_STREAMS);
        assert_eq!(
            std::fs::read(src.path().join("f")).unwrap(),
            std::fs::read(exp.path().join("f")).unwrap()
        );
    }

    #[test]
    fn escapes_read_only_and_unknown_exports_are_refused() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"s").unwrap();
        let exp = tempfile::tempdir().unwrap();
        symlink(outside.path(), exp.path().join("out")).unwrap();
        let ro = tempfile::tempdir().unwrap();
        let src = tempfile::tempdir().unwrap();
        std::fs::write(src.path().join("f"), b"x").unwrap();
        let mut exports = vec![
            export("data", exp.path(), false),
            export("pub", ro.path(), true),
        ];
        exports.push(Export {
            name: "open".into(),
            path: ro.path().to_path_buf(),
            read_only: false,
            public: false,
            encrypted: false,
        });
        let mut c = cfg(exports);
        let srv = server(c.clone());
        let usage = |j: &Job, link: &TestLink| {
            let r = run_client(link, j, Arc::default(), &|_| {});
            // The harness's clones of the client's connections go with it,
            // as the client's own did: the server, draining after its
            // refusal until the client closes, must see the close (kept,
            // each refusal cost its 3 s drain limit: 30 s for this test).
            link.opened.lock().unwrap().clear();
            match r {
                Err(CopyError::Usage(m)) => m,
                other => panic!("expected a usage error, got {other:?}"),
            }
        };
        for dest in ["out/x", "out/", "../x", "/etc/x", "a/../../x"] {
            let mut j = job(Direction::Push, "data", &[dest]);
            j.local_sources = vec![src.path().join("f")];
            let m = usage(&j, &srv.link);
            assert!(
                m.contains("outside") || m.contains("..") || m.contains("absolute"),
                "{dest}: {m}"
            );
        }
        // ("out" itself may be pulled: it is copied as a link, not followed.)
        for path in ["out/secret", "out/", "..", "/etc/passwd"] {
            let mut j = job(Direction::Pull, "data", &[path]);
            j.local_dest = src.path().to_path_buf();
            usage(&j, &srv.link);
        }
        assert!(!outside.path().join("x").exists());
        let mut j = job(Direction::Push, "pub", &[""]);
        j.local_sources = vec![src.path().join("f")];
        assert!(usage(&j, &srv.link).contains("read-only"));
        j.export = "nope".into();
        assert!(usage(&j, &srv.link).contains("no export named 'nope'"));
        drop(srv);
        // Without a key, only public exports are served.
        c.keyed = false;
        let srv = server(c);
        j.export = "open".into();
        assert!(usage(&j, &srv.link).contains("not public"));
        assert!(std::fs::read_dir(ro.path()).unwrap().next().is_none());
    }

    #[test]
    fn thousands_of_small_files() {
        let src = tempfile::tempdir().unwrap();
        for d in 0..10 {
            let dir = src.path().join("many").join(format!("d{d}"));
            std::fs::create_dir_all(&dir).unwrap();
            for f in 0..200 {
                std::fs::write(
                    dir.join(format!("f{f}")),
                    pseudo_random(1000 + f, (d * 1000 + f) as u64),
                )
                .unwrap();
            }
        }
        let exp = tempfile::tempdir().unwrap();
        let srv = server(cfg(vec![export("data", exp.path(), false)]));
        let mut j = job(Direction::Push, "data", &["dest/"]);
        j.local_sources = vec![src.path().join("many")];
        let rep = run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
        assert_eq!(rep.summary.files_verified, 2000);
        assert_eq!(
            snapshot(&src.path().join("many")),
            snapshot(&exp.path().join("dest/many"))
        );
        let results = srv.results.lock().unwrap();
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    }

    #[test]
    fn direct_and_sync_writes_are_identical() {
        let src = tempfile::tempdir().unwrap();
        // Aligned chunks go through O_DIRECT, the odd tail through the page cache.
        std::fs::write(src.path().join("f"), pseudo_random(3 * 65536 + 1234, 5)).unwrap();
        let exp = tempfile::tempdir().unwrap();
        let srv = server(cfg(vec![export("data", exp.path(), false)]));
        let mut j = job(Direction::Push, "data", &[""]);
        j.local_sources = vec![src.path().join("f")];
        j.direct = true;
        j.sync = true;
        let rep = run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
        assert_eq!(rep.summary.files_verified, 1);
        assert_eq!(snapshot(src.path()), snapshot(exp.path()));
    }

    #[test]
    fn data_flows_on_the_first_connections_while_a_late_one_is_dialled() {
        // One of three data connections connects only after `LATE`. Half
        // way through that wait, most of the file must have moved (both
        // ends took the first connections as they came), and the copy
        // must complete intact, whichever way it goes.
        const LATE: Duration = Duration::from_secs(4);
        const SIZE: usize = 96 << 20;
        let src = tempfile::tempdir().unwrap();
        std::fs::write(src.path().join("f"), pseudo_random(SIZE, 9)).unwrap();
        for direction in [Direction::Push, Direction::Pull] {
            let exp = tempfile::tempdir().unwrap();
            let dst = tempfile::tempdir().unwrap();
            let (export_dir, mut j) = match direction {
                Direction::Push => {
                    let mut j = job(Direction::Push, "data", &[""]);
                    j.local_sources = vec![src.path().join("f")];
                    (exp.path(), j)
                }
                Direction::Pull => {
                    let mut j = job(Direction::Pull, "data", &["f"]);
                    j.local_dest = dst.path().to_path_buf();
                    (src.path(), j)
                }
            };
            j.chunk_size = 1 << 20;
            let mut srv = server(cfg(vec![export("data", export_dir, false)]));
            srv.link.slow_tag = Some((2, LATE));
            let progress = Arc::new(Progress::default());
            let watch = {
                let p = Arc::clone(&progress);
                std::thread::spawn(move || {
                    std::thread::sleep(LATE / 2);
                    p.bytes.load(Ordering::Relaxed)
                })
            };
            let rep = run_client(&srv.link, &j, progress, &|_| {}).unwrap();
            let moved = watch.join().unwrap();
            assert!(
                moved >= SIZE as u64 / 2,
                "{direction:?}: {moved} bytes moved before the late connection"
            );
            assert_eq!(rep.summary.files_verified, 1, "{direction:?}");
            let landed = match direction {
                Direction::Push => exp.path().join("f"),
                Direction::Pull => dst.path().join("f"),
            };
            assert!(
                std::fs::read(src.path().join("f")).unwrap() == std::fs::read(landed).unwrap(),
                "{direction:?}: the copy differs"
            );
        }
    }

    #[test]
    fn a_vanished_source_fails_alone_with_one_line() {
        let src = tempfile::tempdir().unwrap();
        let t = src.path().join("t");
        std::fs::create_dir(&t).unwrap();
        for n in ["a", "b", "c"] {
            std::fs::write(t.join(n), pseudo_random(200_000, 1)).unwrap();
        }
        let exp = tempfile::tempdir().unwrap();
        let mut srv = server(cfg(vec![export("data", exp.path(), false)]));
        // The manifest is taken before connecting; "b" disappears after.
        let gone = t.join("b");
        srv.link.on_connect = Some(Box::new(move || {
            let _ = std::fs::remove_file(&gone);
        }));
        let mut j = job(Direction::Push, "data", &[""]);
        j.local_sources = vec![t.clone()];
        let rep = run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
        assert_eq!(rep.failures.len(), 1, "{:?}", rep.failures);
        assert_eq!(rep.failures[0].path, "t/b");
        assert!(
            rep.failures[0].message.contains("vanished"),
            "{:?}",
            rep.failures
        );
        assert_eq!(rep.summary.files_verified, 2);
        assert!(exp.path().join("t/a").exists() && exp.path().join("t/c").exists());
        assert!(!exp.path().join("t/b").exists());
    }

    #[test]
    fn a_full_disk_fails_that_file_alone_and_a_rerun_completes() {
        if !fatpipe_sys::process::is_root() {
            crate::skip_test("mounting a small tmpfs needs root");
            return;
        }
        let mnt = tempfile::tempdir().unwrap();
        let m = mnt.path().display().to_string();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=3m", "fatpipe-test", &m])
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            crate::skip_test("cannot mount tmpfs here");
            return;
        }
        struct Unmount(String);
        impl Drop for Unmount {
            fn drop(&mut self) {
                let _ = std::process::Command::new("umount").arg(&self.0).status();
            }
        }
        let _u = Unmount(m.clone());
        let src = tempfile::tempdir().unwrap();
        let t = src.path().join("t");
        std::fs::create_dir(&t).unwrap();
        std::fs::write(t.join("fits"), pseudo_random(500_000, 2)).unwrap();
        std::fs::write(t.join("too big"), pseudo_random(5 << 20, 3)).unwrap();
        let srv = server(cfg(vec![export("data", mnt.path(), false)]));
        let mut j = job(Direction::Push, "data", &[""]);
        j.local_sources = vec![t.clone()];
        let rep = run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
        assert_eq!(rep.failures.len(), 1, "{:?}", rep.failures);
        assert_eq!(rep.failures[0].path, "t/too big");
        assert!(
            rep.failures[0].message.contains("no space left"),
            "{:?}",
            rep.failures
        );
        assert!(mnt.path().join("t/fits").exists());
        assert!(
            !mnt.path().join("t/too big").exists(),
            "a partial file has its final name"
        );
        // Preallocation caught it before any byte moved. Free space (grow
        // the tmpfs) and re-run: the file that fitted is skipped.
        let remount = std::process::Command::new("mount")
            .args(["-o", "remount,size=16m", &m])
            .status()
            .is_ok_and(|s| s.success());
        assert!(remount);
        let rep = run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
        assert!(rep.failures.is_empty(), "{:?}", rep.failures);
        assert_eq!(rep.summary.files_skipped, 1);
        assert_eq!(snapshot(&t), snapshot(&mnt.path().join("t")));
    }

    #[test]
    fn export_syntax() {
        let e: Export = "data=/srv/data:ro:public".parse().unwrap();
        assert_eq!(
            e,
            Export {
                name: "data".into(),
                path: "/srv/data".into(),
                read_only: true,
                public: true,
                encrypted: false
            }
        );
        let e: Export = "med=/srv/med:encrypted:ro".parse().unwrap();
        assert!(e.encrypted && e.read_only && !e.public);
        assert_eq!(e.path, PathBuf::from("/srv/med"));
        let e: Export = "x=/a:b".parse().unwrap();
        assert_eq!(e.path, PathBuf::from("/a:b"));
        assert!("noequals".parse::<Export>().is_err());
        assert!("bad name=/x".parse::<Export>().is_err());
        assert!("n=:ro".parse::<Export>().is_err());
    }

    fn declared_file(path: &str, size: u64) -> Entry {
        Entry {
            path: RelPath::new(path.as_bytes()).unwrap(),
            kind: EntryKind::File {
                size,
                sparse: false,
            },
            mode: 0o644,
            mtime_s: 0,
            mtime_ns: 0,
        }
    }

    #[test]
    fn a_received_manifest_above_2_gib_is_refused_with_one_line() {
        let e = declared_file("some/file", 1);
        let cost = entry_cost(&e);
        let batch = [e.clone(), e.clone()];
        // Exactly at the cap: accepted; one byte over: refused.
        let at = MAX_MANIFEST_BYTES - 2 * cost;
        assert_eq!(add_manifest_cost(at, &batch).unwrap(), MAX_MANIFEST_BYTES);
        for before in [at + 1, MAX_MANIFEST_BYTES, usize::MAX - cost, usize::MAX] {
            let err = add_manifest_cost(before, &batch).unwrap_err().to_string();
            assert_eq!(
                err, "the manifest is larger than 2048 MiB (the receiver's bound)",
                "{before}"
            );
            assert!(!err.contains('\n'));
        }
        assert_eq!(add_manifest_cost(5, &[]).unwrap(), 5);
    }

    #[test]
    fn a_received_manifest_above_2_pow_26_chunks_is_refused_with_one_line() {
        let mib = 1u32 << 20;
        let cap = MAX_SESSION_CHUNKS * u64::from(mib);
        // Exactly 2^26 chunks over two files: accepted.
        let at = [
            declared_file("a", cap - u64::from(mib)),
            declared_file("b", 1),
        ];
        assert_eq!(check_session_chunks(&at, mib).unwrap(), MAX_SESSION_CHUNKS);
        // One byte more starts one chunk more: refused.
        let over = [
            declared_file("a", cap - u64::from(mib) + 1),
            declared_file("b", 1),
        ];
        let err = check_session_chunks(&over, mib).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "the manifest holds {} chunks, more than the receiver's bound of {} \
                 (at 1 MiB per chunk); use larger chunks or copy less at once",
                MAX_SESSION_CHUNKS + 1,
                MAX_SESSION_CHUNKS
            )
        );
        // Declared sizes of u64::MAX, and a chunk size of 0 or 1: the sum
        // saturates and is refused, never wraps to something small.
        let huge = [declared_file("a", u64::MAX), declared_file("b", u64::MAX)];
        for chunk in [0, 1, mib, u32::MAX] {
            let err = check_session_chunks(&huge, chunk).unwrap_err().to_string();
            assert!(err.starts_with("the manifest holds "), "{err}");
            assert!(!err.contains('\n'));
        }
        assert_eq!(check_session_chunks(&[], 0).unwrap(), 0);
    }
}
