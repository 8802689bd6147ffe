//! Where an archive lives: a SQLite file or a PostgreSQL URL.
//!
//! One string names either, as `--archive` and `FATPIPE_ARCHIVE` take it:
//! `postgres://…` or `postgresql://…` is a server (a fleet of hosts sharing
//! one archive), anything else a SQLite file path. With nothing given the
//! archive is the user's own SQLite file under the XDG data directory,
//! `$XDG_DATA_HOME/fatpipe/archive.sqlite` (`~/.local/share/…` when unset),
//! so a first `--archive` works without any set-up.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{ArchiveError, Result};

/// The environment variable that turns archiving on and names the archive.
pub const ARCHIVE_ENV: &str = "FATPIPE_ARCHIVE";

/// An archive's location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A SQLite file (created on first open).
    Sqlite(PathBuf),
    /// A PostgreSQL connection URL.
    Postgres(String),
}

impl Location {
    /// Reads `s`: a `postgres://` or `postgresql://` URL, else a file path.
    pub fn parse(s: &str) -> Location {
        let lower = s.get(..13).unwrap_or(s).to_ascii_lowercase();
        if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
            Location::Postgres(s.to_owned())
        } else {
            Location::Sqlite(PathBuf::from(s))
        }
    }

    /// The default archive: `$XDG_DATA_HOME/fatpipe/archive.sqlite`, or
    /// `$HOME/.local/share/fatpipe/archive.sqlite` when `XDG_DATA_HOME` is
    /// unset or not absolute (as the XDG spec says to treat it).
    pub fn default_sqlite() -> Result<Location> {
        default_path(
            std::env::var_os("XDG_DATA_HOME").as_deref().map(Path::new),
            std::env::var_os("HOME").as_deref().map(Path::new),
        )
        .map(Location::Sqlite)
    }

    /// The archive a command should use: `flag` (an `--archive` value) if
    /// given and not empty, else `$FATPIPE_ARCHIVE` if set and not empty,
    /// else the default.
    pub fn resolve(flag: Option<&str>) -> Result<Location> {
        if let Some(f) = flag.filter(|f| !f.is_empty()) {
            return Ok(Location::parse(f));
        }
        match std::env::var(ARCHIVE_ENV) {
            Ok(v) if !v.is_empty() => Ok(Location::parse(&v)),
            _ => Location::default_sqlite(),
        }
    }
}

impl fmt::Display for Location {
    /// The path, or the URL with any password replaced by `***` (this
    /// string goes into error messages).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Sqlite(p) => write!(f, "{}", p.display()),
            Location::Postgres(url) => f.write_str(&redact(url)),
        }
    }
}

fn default_path(xdg_data_home: Option<&Path>, home: Option<&Path>) -> Result<PathBuf> {
    let base = match (xdg_data_home, home) {
        (Some(x), _) if x.is_absolute() => x.to_path_buf(),
        (_, Some(h)) if h.is_absolute() => h.join(".local").join("share"),
        _ => return Err(ArchiveError::NoDataDir),
    };
    Ok(base.join("fatpipe").join("archive.sqlite"))
}

/// `postgres://user:secret@host/db` → `postgres://user:***@host/db`.
pub(crate) fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let auth_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let Some(at) = rest[..auth_end].rfind('@') else {
        return url.to_owned();
    };
    match rest[..at].find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &url[..scheme_end],
            &rest[..colon],
            &rest[at..]
        ),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_paths() {
        assert_eq!(
            Location::parse("postgres://u@h/db"),
            Location::Postgres("postgres://u@h/db".into())
        );
        assert_eq!(
            Location::parse("PostgreSQL://h/db"),
            Location::Postgres("PostgreSQL://h/db".into())
        );
        assert_eq!(
            Location::parse("runs.sqlite"),
            Location::Sqlite("runs.sqlite".into())
        );
        assert_eq!(
            Location::parse("./postgres://x"),
            Location::Sqlite("./postgres://x".into())
        );
    }

    #[test]
    fn default_follows_xdg() {
        let p = default_path(Some(Path::new("/x/data")), Some(Path::new("/home/u"))).unwrap();
        assert_eq!(p, Path::new("/x/data/fatpipe/archive.sqlite"));
        // A relative XDG_DATA_HOME is invalid and ignored.
        let p = default_path(Some(Path::new("rel")), Some(Path::new("/home/u"))).unwrap();
        assert_eq!(p, Path::new("/home/u/.local/share/fatpipe/archive.sqlite"));
        assert!(matches!(
            default_path(None, None),
            Err(ArchiveError::NoDataDir)
        ));
    }

    #[test]
    fn passwords_do_not_reach_messages() {
        assert_eq!(
            Location::parse("postgres://fp:s3cret@db:5432/a?sslmode=x").to_string(),
            "postgres://fp:***@db:5432/a?sslmode=x"
        );
        assert_eq!(redact("postgres://fp@db/a"), "postgres://fp@db/a");
    }
}
