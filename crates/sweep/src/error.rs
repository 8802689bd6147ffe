//! The sweep's one error type: a bad experiment file, or what stopped the
//! sweep as a whole (a single failed run is not an error: it is stored as
//! failed and the sweep goes on).

use std::path::PathBuf;

/// Why an experiment could not be read or a sweep could not go on.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// The file is wrong: one line with the file, the line and the key.
    #[error("{}{}: {key}: {message}", file.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
    File {
        /// The experiment file.
        file: PathBuf,
        /// 1-based line, when known.
        line: Option<usize>,
        /// The key at fault (`matrix.window`).
        key: String,
        /// What is wrong with it.
        message: String,
    },
    /// The file could not be read.
    #[error("{}: {source}", file.display())]
    Read {
        /// The experiment file.
        file: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A lab target without root.
    #[error("this experiment's target is a lab, which needs root (network namespaces and TUN devices); run it with sudo")]
    NeedRoot,
    /// Something the sweep cannot do in this set-up.
    #[error("{0}")]
    Unsupported(String),
    /// A local file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The archive failed (the sweep stops: a run it cannot store is lost).
    #[error(transparent)]
    Archive(#[from] fatpipe_archive::ArchiveError),
    /// The lab failed.
    #[error(transparent)]
    Lab(#[from] fatpipe_lab::Error),
}

impl SweepError {
    /// True for mistakes in what the user gave (exit code 2).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            SweepError::File { .. } | SweepError::Read { .. } | SweepError::NeedRoot
        )
    }
}
