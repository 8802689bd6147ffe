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

mod client;
mod serve;
mod sink_role;
mod source_role;

pub use client::{run_client, run_client_prepared, run_client_tuned};
pub use serve::{serve, Export, ServerConfig};
pub use sink_role::{run_sink, MapDest, SinkResult};
pub use source_role::run_source;
use {client::*, serve::*, sink_role::*, source_role::*};

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
/// How long a write on a session's control connection may make no
/// progress once data flows: the reports written there (a resend, a
/// failed file) are written from the data plane's shared blocking pool,
/// whose threads a peer that stops reading must not hold. Past it the
/// session ends.
pub const CONTROL_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

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
        /// Opens data connections (one batch at a time).
        open: &'a OpenMany<'a>,
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

    /// Opens the data connections `tags` at once, each with `hello` behind
    /// its opening handshake: for sending only (`push`) as
    /// [`open_early`](Self::open_early) then `hello`, else as
    /// [`open_greeted`](Self::open_greeted). Each is handed to `ready` as
    /// soon as it is ready, in the order they get there; every tag is
    /// answered once. By default up to [`DIALERS`] threads each open one
    /// at a time; the engine's link sets them all up on the calling thread.
    fn open_many(
        &self,
        tags: &[u32],
        push: bool,
        hello: &[u8],
        ready: &mut dyn FnMut(Result<Stream, CopyError>),
    ) {
        let open = |tag: u32| {
            if push {
                let mut s = self.open_early(tag)?;
                s.write_all(hello).map_err(net)?;
                Ok(s)
            } else {
                self.open_greeted(tag, hello)
            }
        };
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|scope| {
            let (tx, rx) = mpsc::channel();
            for _ in 0..tags.len().min(DIALERS) {
                let (tx, next, open) = (tx.clone(), &next, &open);
                scope.spawn(move || {
                    while let Some(&tag) = tags.get(next.fetch_add(1, Ordering::Relaxed)) {
                        if let Err(mpsc::SendError(r)) = tx.send(open(tag)) {
                            shut(r);
                        }
                    }
                });
            }
            drop(tx);
            for r in rx {
                ready(r);
            }
        });
    }
}

/// Most threads [`Conn::open_many`]'s default opens connections on.
pub const DIALERS: usize = 32;

/// Most data connections the engine's link sets up at once (on one
/// thread): 256 streams in two waves of a few round trips each, and half
/// the server's per-source handshake cap (256) left to another client on
/// the same host.
pub const AT_ONCE: usize = 128;

/// Opens data connections `tags` and hands each to the callback as it is
/// ready ([`Conn::open_many`] with the session's direction and hello).
pub type OpenMany<'a> = dyn Fn(&[u32], &mut dyn FnMut(Result<Stream, CopyError>)) + Sync + 'a;

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
fn open_data(open: &OpenMany<'_>, tags: &[u32]) -> Result<Vec<Stream>, CopyError> {
    std::thread::scope(|scope| dial_each(scope, open, tags).into_iter().collect())
}

/// How long a complete sink waits for each stream's End before it shuts
/// the streams that have not ended.
const END_GRACE: Duration = Duration::from_secs(5);

/// The most manifest entries one session accepts.
pub const MAX_ENTRIES: usize = 16_000_000;

/// The most chunks (over all files) one receiving session tracks: a byte
/// each, so 64 MiB of flags; 128 TiB at the default 2 MiB chunks.
pub const MAX_SESSION_CHUNKS: u64 = 1 << 26;

/// The largest buffer a client may have the server force past its host
/// caps, per socket: forcing is for long fat paths whose BDP the caps cannot
/// cover, not a way for a client to pin the server's memory.
pub const MAX_FORCED_BUFFER: u64 = 256 << 20;

fn merge_failures(into: &mut Vec<Failure>, new: Vec<Failure>) {
    // A retry reports the same failures again; keep the latest per path.
    into.retain(|f| !new.iter().any(|n| n.path == f.path));
    into.extend(new);
}

/// A data connection's stream on the engine's runner, and how it ended.
pub(super) struct StreamTask {
    handle: Option<fatpipe_engine::dataplane::runner::TaskHandle>,
    result: Arc<Mutex<Option<io::Result<()>>>>,
}

impl StreamTask {
    /// Hands `stream` to the runner through `spawn` (a role's task), with
    /// `ended` called on the runner's thread with how it ended, before
    /// [`StreamTask::join`] returns. A stream the runner could not take
    /// has ended with that error.
    fn start(
        spawn: impl FnOnce(
            Box<dyn FnOnce(io::Result<()>) + Send>,
        ) -> io::Result<fatpipe_engine::dataplane::runner::TaskHandle>,
        ended: impl Fn(&io::Result<()>) + Send + Sync + 'static,
    ) -> StreamTask {
        let ended = Arc::new(ended);
        let result = Arc::new(Mutex::new(None));
        let (r, e) = (Arc::clone(&result), Arc::clone(&ended));
        match spawn(Box::new(move |out| {
            e(&out);
            *lock(&r) = Some(out);
        })) {
            Ok(h) => StreamTask {
                handle: Some(h),
                result,
            },
            Err(err) => {
                let out = Err(err);
                ended(&out);
                *lock(&result) = Some(out);
                StreamTask {
                    handle: None,
                    result,
                }
            }
        }
    }

    /// Waits until the stream ended; how it did.
    fn join(self) -> io::Result<()> {
        if let Some(h) = &self.handle {
            h.join();
        }
        let out = lock(&self.result).take();
        out.unwrap_or(Ok(()))
    }

    /// True once the stream ended.
    fn is_finished(&self) -> bool {
        self.handle.as_ref().is_none_or(|h| h.is_done())
    }
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

pub(crate) fn net(e: io::Error) -> CopyError {
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
mod tests;
