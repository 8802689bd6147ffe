//! Relative paths as they travel on the wire, validated once.
//!
//! Every path a peer sends (manifest entries, the export-relative source or
//! destination of a request) is turned into a [`RelPath`] before anything
//! touches the file system. The checks are purely lexical — non-empty
//! components, no `.` or `..`, no leading `/`, no NUL, length caps — so that the
//! syscall layer ([`crate::beneath`]) only ever sees names that cannot climb
//! out of a directory by spelling alone. Symlinks are the other way out; those
//! are handled at resolution time (`RESOLVE_BENEATH`, `O_NOFOLLOW`).
//!
//! Paths are bytes, not `String`: Linux file names need not be UTF-8 and a
//! copy must reproduce them exactly.

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The longest relative path accepted (Linux `PATH_MAX`).
pub const MAX_PATH: usize = 4096;
/// The longest single component accepted (Linux `NAME_MAX`).
pub const MAX_NAME: usize = 255;

/// Why a path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The path was empty where a name was required.
    #[error("empty path")]
    Empty,
    /// The path is absolute; only paths relative to an export are allowed.
    #[error("absolute paths are not allowed")]
    Absolute,
    /// A `..` or `.` component (or an empty one, `a//b`).
    #[error("'..', '.' and empty components are not allowed")]
    Climbs,
    /// A NUL byte inside the path.
    #[error("NUL byte in path")]
    Nul,
    /// Longer than [`MAX_PATH`], or a component longer than [`MAX_NAME`].
    #[error("path or file name too long")]
    TooLong,
}

/// A validated, relative, `/`-separated path of at least one component.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RelPath(Vec<u8>);

impl RelPath {
    /// Validates `bytes` as a relative path.
    pub fn new(bytes: &[u8]) -> Result<Self, PathError> {
        validate(bytes)?;
        Ok(RelPath(bytes.to_vec()))
    }

    /// Parses an optional path: empty (or only slashes) means "the root itself".
    /// Trailing slashes are dropped; anything else must be a valid path.
    pub fn parse_optional(bytes: &[u8]) -> Result<Option<Self>, PathError> {
        let mut end = bytes.len();
        while end > 0 && bytes[end - 1] == b'/' {
            end -= 1;
        }
        if end == 0 {
            if bytes.is_empty() {
                return Ok(None);
            }
            return Err(PathError::Absolute);
        }
        Self::new(&bytes[..end]).map(Some)
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// As a `Path` (for display and local joins).
    pub fn as_path(&self) -> &Path {
        Path::new(OsStr::from_bytes(&self.0))
    }

    /// The path as a C string (validated to contain no NUL).
    pub fn to_cstring(&self) -> CString {
        // validate() rejected NUL, so this cannot fail; fall back to an empty
        // name (refused by every syscall) rather than panicking.
        CString::new(self.0.clone()).unwrap_or_default()
    }

    /// `self/name`, validated.
    pub fn join(&self, name: &[u8]) -> Result<Self, PathError> {
        let mut v = self.0.clone();
        v.push(b'/');
        v.extend_from_slice(name);
        Self::new(&v)
    }

    /// Splits into (parent, last component). The parent is `None` at top level.
    pub fn split_last(&self) -> (Option<RelPath>, &[u8]) {
        match self.0.iter().rposition(|&b| b == b'/') {
            Some(i) => (Some(RelPath(self.0[..i].to_vec())), &self.0[i + 1..]),
            None => (None, &self.0[..]),
        }
    }

    /// The first component.
    pub fn first(&self) -> &[u8] {
        match self.0.iter().position(|&b| b == b'/') {
            Some(i) => &self.0[..i],
            None => &self.0,
        }
    }

    /// Everything after the first component, if any.
    pub fn rest(&self) -> Option<&[u8]> {
        self.0
            .iter()
            .position(|&b| b == b'/')
            .map(|i| &self.0[i + 1..])
    }

    /// The number of components.
    pub fn depth(&self) -> usize {
        self.0.iter().filter(|&&b| b == b'/').count() + 1
    }

    /// Lossy UTF-8 form for messages and JSON.
    pub fn display(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }
}

/// Checks that `name` is a single valid component (no `/`).
pub fn validate_name(name: &[u8]) -> Result<(), PathError> {
    if name.contains(&b'/') {
        return Err(PathError::Climbs);
    }
    validate(name)
}

fn validate(bytes: &[u8]) -> Result<(), PathError> {
    if bytes.is_empty() {
        return Err(PathError::Empty);
    }
    if bytes.len() > MAX_PATH {
        return Err(PathError::TooLong);
    }
    if bytes[0] == b'/' {
        return Err(PathError::Absolute);
    }
    if bytes.contains(&0) {
        return Err(PathError::Nul);
    }
    for comp in bytes.split(|&b| b == b'/') {
        if comp.is_empty() || comp == b"." || comp == b".." {
            return Err(PathError::Climbs);
        }
        if comp.len() > MAX_NAME {
            return Err(PathError::TooLong);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_and_odd_names() {
        for ok in [
            &b"a"[..],
            b"a/b/c",
            b"with space/\xc3\xa9t\xc3\xa9",
            b".hidden/..dots../x",
            b"\xff\xfe not utf8",
        ] {
            assert!(RelPath::new(ok).is_ok(), "{ok:?}");
        }
        let long = vec![b'x'; 255];
        assert!(RelPath::new(&long).is_ok());
    }

    #[test]
    fn refuses_escapes() {
        assert_eq!(RelPath::new(b""), Err(PathError::Empty));
        assert_eq!(RelPath::new(b"/etc/passwd"), Err(PathError::Absolute));
        assert_eq!(RelPath::new(b".."), Err(PathError::Climbs));
        assert_eq!(RelPath::new(b"a/../../b"), Err(PathError::Climbs));
        assert_eq!(RelPath::new(b"a/./b"), Err(PathError::Climbs));
        assert_eq!(RelPath::new(b"a//b"), Err(PathError::Climbs));
        assert_eq!(RelPath::new(b"a/"), Err(PathError::Climbs));
        assert_eq!(RelPath::new(b"a\0b"), Err(PathError::Nul));
        assert_eq!(RelPath::new(&[b'x'; 256]), Err(PathError::TooLong));
        assert_eq!(RelPath::new(&vec![b'a'; 4097]), Err(PathError::TooLong));
        assert!(validate_name(b"a/b").is_err());
    }

    #[test]
    fn optional_and_parts() {
        assert_eq!(RelPath::parse_optional(b"").unwrap(), None);
        assert_eq!(RelPath::parse_optional(b"/"), Err(PathError::Absolute));
        let p = RelPath::parse_optional(b"a/b/").unwrap().unwrap();
        assert_eq!(p.as_bytes(), b"a/b");
        let (parent, last) = p.split_last();
        assert_eq!(parent.unwrap().as_bytes(), b"a");
        assert_eq!(last, b"b");
        assert_eq!(p.first(), b"a");
        assert_eq!(p.rest(), Some(&b"b"[..]));
        assert_eq!(p.depth(), 2);
        assert_eq!(p.join(b"c").unwrap().as_bytes(), b"a/b/c");
        assert!(p.join(b"..").is_err());
    }
}
