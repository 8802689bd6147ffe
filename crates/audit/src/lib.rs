//! fatpipe-audit: the host audit behind `fatpipe tune`.
//!
//! Three layers, kept apart so each can be tested without the others:
//!
//! * **Collectors** ([`host`], [`disk`]): read `/proc` and `/sys` under an
//!   injectable root, so tests run against a fake tree; a value that cannot
//!   be read is `Unknown(reason)`, never a guess. [`host::Host::limits`] is
//!   also what the planner and the probe service report as a host's limits.
//! * **Rules and emitters** ([`rules`], [`emit`]) (pure): turn collected facts
//!   and a target rate × RTT into findings and sysctl snippets for Linux,
//!   FreeBSD and macOS; [`apply`] writes them with a backup and reverts;
//!   [`peer`] turns a probed path into the target of `tune --for HOST` and
//!   judges the peer's reported limits.
//!
//! Rendering for people lives in the binary; the serde result types live in
//! `fatpipe_schema::tune` so the protocol and the reports can name them.

use std::path::PathBuf;

pub mod apply;
pub mod disk;
pub mod emit;
mod ethtool;
pub mod host;
pub mod peer;
pub mod rules;

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
