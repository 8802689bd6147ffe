//! fatpipe's result archive: every run of `sweep`, and of `test`, `copy`
//! and `path` with `--archive`, stored where it can be queried and
//! summarised later.
//!
//! Two real databases behind one interface, [`Store`]: a SQLite file (the
//! default, under the user's XDG data directory) and PostgreSQL (one
//! archive for a fleet of hosts). [`open`] picks the backend from one
//! `--archive` string ([`Location`]). Both keep a versioned schema with
//! numbered migrations beside the code (`migrations/{sqlite,postgres}/`),
//! applied in order on open; a database from a newer fatpipe is refused.
//!
//! A stored [`Run`] keeps the command's full result document (the
//! `fatpipe_schema` JSON) verbatim, beside the columns queries need
//! ([`Metrics`]) and the facts that explain a result ([`HostFacts`], the
//! peer, the lab link). [`stats`] computes the per-cell statistics (n, min,
//! median, mean, p10, p90, max, standard deviation) without a database, so
//! they are the same whatever the backend. [`export_jsonl`] and
//! [`import_jsonl`] move runs between archives as JSON lines.
//!
//! Layout: `record` (what is stored), `store` (the trait, filters, export
//! and import), `sqlite` and `postgres` (the backends), `location`,
//! `stats`, `error`.

pub mod error;
pub mod location;
pub mod postgres;
pub mod record;
pub mod sqlite;
pub mod stats;
pub mod store;

pub use error::{ArchiveError, Result};
pub use location::{Location, ARCHIVE_ENV};
pub use postgres::{PgStore, POSTGRES_MIGRATIONS};
pub use record::{
    cell_key, find_max_cell, Annotation, Document, HostFacts, Measurement, Metrics, NicFacts, Run,
    RunKind, RunStatus, SweepRef, FIND_MAX_SWEEP,
};
pub use sqlite::{SqliteStore, SQLITE_MIGRATIONS};
pub use store::{
    export_jsonl, import_jsonl, DoneRun, ImportSummary, Inserted, Migration, RunFilter, Store,
    EXPORT_FORMAT, EXPORT_VERSION, SCHEMA_VERSION,
};

/// Opens the archive at `location`, creating and migrating it as needed.
pub fn open(location: &Location) -> Result<Box<dyn Store>> {
    Ok(match location {
        Location::Sqlite(path) => Box::new(SqliteStore::open(path)?),
        Location::Postgres(url) => Box::new(PgStore::open(url)?),
    })
}
