//! fatpipe-tune: the auto-tuning planners and the host audit.
//!
//! Three layers, kept apart so each can be tested without the others:
//!
//! * **Planners** (pure): [`plan()`] turns path facts and both ends' limits
//!   into streams, buffers, congestion control and pacing before data flows;
//!   [`adjust`] is a state machine fed one sample per interval while data
//!   flows, which adds streams or switches to BBR when loss holds a transfer
//!   below the path rate. Neither reads a clock or a file.
//! * **Collectors** ([`host`], [`disk`]): read `/proc` and `/sys` under an
//!   injectable root, so tests run against a fake tree; a value that cannot
//!   be read is `Unknown(reason)`, never a guess.
//! * **Rules and emitters** ([`rules`], [`emit`]) (pure): turn collected facts
//!   and a target rate × RTT into findings and sysctl snippets for Linux,
//!   FreeBSD and macOS; [`apply`] writes them with a backup and reverts;
//!   [`peer`] turns a probe into the target of `tune --for HOST` and judges
//!   the peer's reported limits.
//!
//! Rendering for people lives in the binary; the serde result types live in
//! `fatpipe_schema::tune` so the engine and the protocol can name them.

use std::path::PathBuf;

pub mod adjust;
pub mod apply;
pub mod auto;
pub mod disk;
pub mod emit;
mod ethtool;
pub mod host;
pub mod peer;
pub mod plan;
pub mod probe;
pub mod rfc6349;
pub mod rules;

pub use adjust::{AdjustConfig, Adjuster, Sample};
pub use fatpipe_schema::tune::{Action, Decision, HostLimits, PathFacts, Plan};
pub use plan::{plan, Policy};

/// What can go wrong reading, changing or measuring the host.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A sysctl to be changed could not be read, so nothing was written.
    #[error("cannot read {key} before changing it ({why}); nothing was changed")]
    Unreadable {
        /// The sysctl.
        key: String,
        /// Why it could not be read.
        why: String,
    },
    /// Writing a sysctl failed; `rollback` says what became of the others.
    #[error("writing {key} = {value} failed: {source}; {rollback}")]
    Write {
        /// The sysctl.
        key: String,
        /// The value refused.
        value: String,
        /// The kernel's answer.
        source: std::io::Error,
        /// What happened to the settings written before it.
        rollback: String,
    },
    /// Restoring a backup failed for some settings.
    #[error("restoring {path} failed for {failed}; the backup is left in place")]
    Revert {
        /// The backup file.
        path: PathBuf,
        /// Each setting that failed, with its error.
        failed: String,
    },
    /// A backup file or its directory could not be written or read.
    #[error("backup {path}: {source}")]
    Backup {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// There is no backup to revert to.
    #[error("no backup in {0} to revert to (fatpipe tune --apply writes one)")]
    NoBackup(PathBuf),
    /// A backup file has a line fatpipe would not have written.
    #[error("{path}:{line}: {why}")]
    BadBackup {
        /// The backup file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        why: String,
    },
    /// The disk measurement failed.
    #[error("disk test in {path}: {source}")]
    Disk {
        /// The directory measured.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}
