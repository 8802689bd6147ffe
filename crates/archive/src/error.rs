//! The archive's one error type.
//!
//! Every failure the archive can report, with enough context for the CLI to
//! print one line that says what to do. Database errors keep the driver's
//! error as their source and name the operation that failed, because a bare
//! "constraint failed" says nothing about which step of which command it was.

use std::path::PathBuf;

/// Anything that can go wrong opening, migrating, writing, reading,
/// exporting or importing an archive.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The SQLite library refused an operation (`what` names it).
    #[error("SQLite archive: {what}: {source}")]
    Sqlite {
        /// The operation that failed, e.g. "insert runs".
        what: &'static str,
        /// The driver's error.
        #[source]
        source: rusqlite::Error,
    },
    /// The PostgreSQL server or driver refused an operation (`what` names it).
    #[error("PostgreSQL archive: {what}: {source}")]
    Postgres {
        /// The operation that failed, e.g. "connect".
        what: &'static str,
        /// The driver's error.
        #[source]
        source: postgres::Error,
    },
    /// The database was written by a newer fatpipe whose schema this build
    /// does not know; it is left untouched.
    #[error(
        "the archive {location} has schema version {found}, newer than this fatpipe knows ({known}); \
         use a newer fatpipe or another archive"
    )]
    NewerSchema {
        /// Where the archive is (path, or URL without password).
        location: String,
        /// The version found in the database.
        found: u32,
        /// The newest version this build can migrate to.
        known: u32,
    },
    /// A file or directory (the SQLite file's folder, an export file) could
    /// not be created, read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// Neither `$XDG_DATA_HOME` nor `$HOME` is set to an absolute path, so
    /// there is no default place for the archive.
    #[error("no default archive location: set XDG_DATA_HOME or HOME, or give --archive PATH")]
    NoDataDir,
    /// A value read back from the database does not fit the record type
    /// (an unknown kind, a malformed UUID or JSON); the row names it.
    #[error("archive row {id}: {what}")]
    BadRow {
        /// The row's id.
        id: i64,
        /// What is wrong with it.
        what: String,
    },
    /// A record could not be turned into JSON (it holds a non-finite
    /// number where JSON has none, for instance).
    #[error("cannot encode {what} as JSON: {source}")]
    Encode {
        /// What was being encoded.
        what: &'static str,
        /// serde_json's error.
        #[source]
        source: serde_json::Error,
    },
    /// Reading an import or writing an export stream failed.
    #[error("{what}: {source}")]
    Stream {
        /// "read import" or "write export".
        what: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A PostgreSQL schema name (for [`crate::PgStore::open_with`]) that
    /// is not a plain lower-case identifier.
    #[error("bad PostgreSQL schema name {0:?}: use lower-case letters, digits and _")]
    BadSchemaName(String),
    /// A line of a JSON-lines import is not a record of the archive format.
    #[error("import line {line}: {what}")]
    Import {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        what: String,
    },
    /// A result document cannot be stored as given (its schema name or
    /// version is not the one its constructor reads).
    #[error("result document: {0}")]
    Document(String),
}

/// Short for `Result<T, ArchiveError>`.
pub type Result<T, E = ArchiveError> = std::result::Result<T, E>;

impl ArchiveError {
    /// True for what the user must fix: an archive from a newer fatpipe,
    /// no data directory for the default, an import file that is not an
    /// export (exit code 2). A database that fails is not.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            ArchiveError::NewerSchema { .. }
                | ArchiveError::NoDataDir
                | ArchiveError::BadSchemaName(_)
                | ArchiveError::Import { .. }
        )
    }

    pub(crate) fn sqlite(what: &'static str) -> impl FnOnce(rusqlite::Error) -> Self {
        move |source| ArchiveError::Sqlite { what, source }
    }

    pub(crate) fn postgres(what: &'static str) -> impl FnOnce(postgres::Error) -> Self {
        move |source| ArchiveError::Postgres { what, source }
    }
}
