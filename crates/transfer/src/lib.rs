//! fatpipe-transfer: bulk file copy that fills the pipe, resumes and proves
//! every byte.
//!
//! The pieces, bottom up:
//!
//! * [`relpath`] and [`beneath`]: paths from peers are validated lexically,
//!   then every file operation goes through a directory descriptor with
//!   `RESOLVE_BENEATH`, so nothing escapes an export.
//! * [`hash`]: per-chunk checksums (xxh3-128, or BLAKE3 for `--verify=strong`).
//! * [`wire`]: the copy protocol's messages, a size-capped sans-IO codec.
//! * [`manifest`]: walking a tree into entries (files, dirs, symlinks as links).
//! * [`plan`]: chunk math and the work queue all data streams share; small
//!   files are batched so thousands of them need no round trip each.
//! * [`journal`]: the receiver's record of verified chunks, for resume.
//! * [`source`] and [`sink`]: the sending and receiving halves of a session,
//!   written against `fatpipe_secure::Stream`s (plain or TLS) so they run the same on either side.
//! * [`session`]: the client's reconnecting driver and the server's handler.
//! * [`live`]: a session's connections, and the handle an in-flight tuner
//!   uses to sample them and add streams while data flows.
//! * [`tuner`]: that handle as what `fatpipe_tune::steer::Driver` steers,
//!   and one driver kept across a copy's reconnects.
//! * [`service`]: the copy service on the engine: the server's
//!   `CopyService`, the client's `EngineLink`, and where auto-tuning's
//!   socket settings go at each end.
//!
//! The transport (authentication, cookies, the engine's sessions) is behind
//! the small [`session::Link`] trait so everything but [`service`] is
//! testable over loopback without the server.

pub mod beneath;
pub mod grant;
pub mod hash;
pub mod io;
pub mod journal;
pub mod live;
pub mod manifest;
pub mod plan;
pub mod relpath;
pub mod service;
pub mod session;
pub mod sink;
pub mod source;
pub mod tuner;
pub mod wire;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// Live counters for a progress display; both halves update them.
#[derive(Debug, Default)]
pub struct Progress {
    /// Bytes sent (sender) or verified and written (receiver), this run
    /// plus what an earlier run had already completed.
    pub bytes: AtomicU64,
    /// Files sent or completed.
    pub files: AtomicU64,
    /// Bytes in the manifest.
    pub total_bytes: AtomicU64,
    /// Files in the manifest.
    pub total_files: AtomicU64,
    /// When this run moved its first payload byte: the sender's first
    /// write to a data socket, or the receiver's first chunk verified and
    /// on disk (for the copy's start-up timeline).
    pub first_at: OnceLock<Instant>,
    /// When a sending stream first found no work left to take (the queue
    /// had handed out units and was empty): from then on the path runs
    /// below its rate while the last chunks and windows drain. Only the
    /// sending end sees it.
    pub first_idle_at: OnceLock<Instant>,
}

impl Progress {
    /// Counts `n` bytes this run moved (not ones an earlier run had
    /// completed), and the time of the first.
    pub fn moved(&self, n: u64) {
        if n > 0 {
            self.started();
        }
        self.bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// Marks the first payload byte now, if none was marked: a sender calls
    /// it before its first write, because a write returns only once the
    /// socket took the whole piece, which on a fresh connection with a
    /// small send buffer takes round trips of slow start.
    pub fn started(&self) {
        if self.first_at.get().is_none() {
            let _ = self.first_at.set(Instant::now());
        }
    }

    /// Marks now as when a sending stream first ran out of work, if none
    /// was marked.
    pub fn ran_dry(&self) {
        if self.first_idle_at.get().is_none() {
            let _ = self.first_idle_at.set(Instant::now());
        }
    }
}

/// One file that could not be copied, and why (one line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The file's path relative to the copy's destination.
    pub path: String,
    /// What went wrong and what to do.
    pub message: String,
    /// What kind of failure: what a caller acts on, instead of reading
    /// `message`.
    pub kind: FailureKind,
}

/// What kind of failure a file's is, decided where the error happened
/// (the end that writes) and carried to the other end with it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum FailureKind {
    /// The destination's file system is full; `on` names it as the
    /// message does ("/data (xfs)", or "device" when its mount is unknown).
    NoSpace {
        /// The file system.
        on: String,
    },
    /// The user's disk quota is exhausted.
    Quota,
    /// The file system refused the access.
    Permission,
    /// Anything else.
    #[default]
    Other,
}

/// Why one file failed, as it travels (`FileFailed`): its kind and the
/// one line the user reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reason {
    /// What kind of failure.
    pub kind: FailureKind,
    /// What went wrong and what to do.
    pub text: String,
}

impl From<String> for Reason {
    /// A failure of no particular kind.
    fn from(text: String) -> Reason {
        Reason {
            kind: FailureKind::Other,
            text,
        }
    }
}

impl Failure {
    /// File `path` failed for `why`.
    pub fn new(path: String, why: Reason) -> Failure {
        Failure {
            path,
            message: why.text,
            kind: why.kind,
        }
    }
}

/// A test hook's value: the environment variable `name` (a
/// `FATPIPE_TEST_*` knob that makes this end misbehave on purpose), read
/// only in builds with the `test-hooks` feature. The one gate for every
/// hook of the copy, so no hook can be read by an ordinary build.
#[cfg(feature = "test-hooks")]
pub(crate) fn test_hook(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Without the `test-hooks` feature no test hook is ever set.
#[cfg(not(feature = "test-hooks"))]
#[inline(always)]
pub(crate) fn test_hook(_name: &str) -> Option<String> {
    None
}

/// The test hook `FATPIPE_TEST_STALL=PHASE[=N]`: this end stops, as if
/// hung, at a named point of a session, so a test can kill a copy there
/// (by PID) without racing a sleep. Phases: `manifest` (the sender has sent
/// part of its manifest), `bytes=N` (the sender has moved N payload bytes;
/// checked before each unit), `rename=N` (the receiver is about to put its
/// N-th file under its final name). On stalling it creates the file
/// `FATPIPE_TEST_STALL_MARK` names (if set) and prints one line on stderr,
/// then every thread of that session that reaches the point sleeps 30 s.
/// Only the first session of a process stalls, so a server's next session
/// (the test's rerun) runs normally. Without the `test-hooks` feature it
/// is never armed.
#[derive(Debug, Default)]
pub(crate) struct Stall {
    fired: OnceLock<()>,
}

impl Stall {
    /// True when the hook names `phase` (so a caller may flush first).
    pub(crate) fn armed(phase: &str) -> bool {
        stall_spec().is_some_and(|(p, _)| p == phase)
    }

    /// Stalls here when the hook names `phase` and `count` reached its N.
    pub(crate) fn check(&self, phase: &str, count: u64) {
        use std::sync::atomic::AtomicBool;
        static FIRED: AtomicBool = AtomicBool::new(false);
        let Some((p, n)) = stall_spec() else {
            return;
        };
        if p != phase || count < *n {
            return;
        }
        if self.fired.get().is_none() {
            if FIRED.swap(true, Ordering::SeqCst) {
                return;
            }
            let _ = self.fired.set(());
            if let Some(mark) = test_hook("FATPIPE_TEST_STALL_MARK") {
                let _ = std::fs::write(mark, phase);
            }
            eprintln!("fatpipe: test hook: stalled at {phase}");
        }
        std::thread::sleep(std::time::Duration::from_secs(30));
    }
}

/// `FATPIPE_TEST_STALL`, parsed once: the phase and its count (0 if none).
fn stall_spec() -> Option<&'static (String, u64)> {
    static SPEC: OnceLock<Option<(String, u64)>> = OnceLock::new();
    SPEC.get_or_init(|| {
        let v = test_hook("FATPIPE_TEST_STALL")?;
        Some(match v.split_once('=') {
            Some((p, n)) => (p.to_string(), n.parse().ok()?),
            None => (v, 0),
        })
    })
    .as_ref()
}

/// For tests: a test that cannot run on this host says why and returns;
/// in CI (CI=true), whose host has everything, it fails instead.
#[cfg(test)]
pub(crate) fn skip_test(why: &str) {
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("cannot run here, and CI must: {why}");
    }
    eprintln!("skipping: {why}");
}
