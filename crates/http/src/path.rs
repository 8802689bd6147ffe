//! Request paths: from the URL a peer sent to an export and a path beneath
//! it that the copy service's confinement accepts.
//!
//! The path is split on `/` *before* any percent-decoding, so `%2f` can
//! never become a separator (a decoded segment holding `/` is refused, as
//! is one holding NUL); empty segments (`a//b`) are dropped; `.` and `..`,
//! spelt plainly or encoded, are refused rather than resolved (a client
//! that means them resolves them itself, as curl does). What remains goes
//! through `fatpipe_transfer::relpath::RelPath` (the lexical rules the copy
//! service applies to every peer path) and is then opened with
//! `beneath::Dir` (`RESOLVE_BENEATH`, no symlink followed). The segments
//! are capped in number and length ([`MAX_PATH`]).

use fatpipe_transfer::relpath::RelPath;
use percent_encoding::{percent_decode, AsciiSet, CONTROLS};

/// The longest request path considered (encoded), in bytes.
pub const MAX_PATH: usize = 16 * 1024;

/// Why a path is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Not a path this server could serve (400).
    #[error("{0}")]
    Bad(&'static str),
}

/// A request path, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The export's name (`None`: the server's root, `/`).
    pub export: Option<String>,
    /// The path beneath the export (`None`: the export itself).
    pub rel: Option<RelPath>,
    /// The URL ended in `/`.
    pub slash: bool,
}

impl Target {
    /// The path as tokens' scopes name it: `/EXPORT/a/b` (lossy UTF-8).
    pub fn scope_path(&self) -> String {
        let mut s = String::from("/");
        if let Some(e) = &self.export {
            s.push_str(e);
            if let Some(r) = &self.rel {
                s.push('/');
                s.push_str(&r.display());
            }
        }
        s
    }

    /// The URL path of this target, percent-encoded (a collection with a
    /// trailing `/`).
    pub fn href(&self, collection: bool) -> String {
        let mut s = String::from("/");
        if let Some(e) = &self.export {
            s.push_str(&encode(e.as_bytes()));
            if let Some(r) = &self.rel {
                for seg in r.as_bytes().split(|&b| b == b'/') {
                    s.push('/');
                    s.push_str(&encode(seg));
                }
            }
            if collection {
                s.push('/');
            }
        }
        s
    }

    /// The target of the entry `name` inside this one.
    pub fn child(&self, name: &[u8]) -> Option<Target> {
        let export = self.export.clone()?;
        let rel = match &self.rel {
            Some(r) => r.join(name).ok()?,
            None => RelPath::new(name).ok()?,
        };
        Some(Target {
            export: Some(export),
            rel: Some(rel),
            slash: false,
        })
    }
}

/// Decodes the path of a request URL (without its query).
pub fn parse(raw: &str) -> Result<Target, PathError> {
    if raw.len() > MAX_PATH {
        return Err(PathError::Bad("path too long"));
    }
    if !raw.starts_with('/') {
        return Err(PathError::Bad("the path must start with '/'"));
    }
    let slash = raw.len() > 1 && raw.ends_with('/');
    let mut segs: Vec<Vec<u8>> = Vec::new();
    for seg in raw.split('/').filter(|s| !s.is_empty()) {
        let d: Vec<u8> = percent_decode(seg.as_bytes()).collect();
        if d.contains(&b'/') {
            return Err(PathError::Bad("an encoded '/' (%2f) inside a path segment"));
        }
        if d.contains(&0) {
            return Err(PathError::Bad("a NUL byte in the path"));
        }
        if d == b"." || d == b".." {
            return Err(PathError::Bad("'.' and '..' are not allowed in paths"));
        }
        if d.is_empty() {
            continue;
        }
        segs.push(d);
    }
    let mut it = segs.into_iter();
    let Some(first) = it.next() else {
        return Ok(Target {
            export: None,
            rel: None,
            slash,
        });
    };
    let export = String::from_utf8(first).map_err(|_| PathError::Bad("no such export"))?;
    let rest: Vec<Vec<u8>> = it.collect();
    let rel =
        if rest.is_empty() {
            None
        } else {
            let joined = rest.join(&b'/');
            Some(RelPath::new(&joined).map_err(|_| {
                PathError::Bad("path refused: too long or not a plain relative path")
            })?)
        };
    Ok(Target {
        export: Some(export),
        rel,
        slash,
    })
}

/// The path of a `Destination` header (MOVE): an absolute URL's path, or
/// an absolute path; the query and fragment are dropped.
pub fn destination(value: &[u8]) -> Option<String> {
    if value.len() > MAX_PATH {
        return None;
    }
    let v = std::str::from_utf8(value).ok()?.trim();
    let path = if let Some(rest) = v
        .strip_prefix("http://")
        .or_else(|| v.strip_prefix("https://"))
        .or_else(|| v.strip_prefix("davs://"))
        .or_else(|| v.strip_prefix("dav://"))
    {
        &rest[rest.find('/')?..]
    } else if v.starts_with('/') {
        v
    } else {
        return None;
    };
    let end = path.find(['?', '#']).unwrap_or(path.len());
    Some(path[..end].to_string())
}

/// What is percent-encoded in an href: controls, space, and every
/// character with a meaning in URLs or XML.
const HREF: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'&')
    .add(b'\'')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'[')
    .add(b'\\')
    .add(b']')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}')
    .add(b'/')
    .add(b';')
    .add(b'=')
    .add(b'+')
    .add(b':');

/// One path segment (raw bytes) as it goes in a URL.
pub fn encode(seg: &[u8]) -> String {
    percent_encoding::percent_encode(seg, HREF).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(t: &Target) -> Option<String> {
        t.rel.as_ref().map(|r| r.display())
    }

    #[test]
    fn exports_and_paths_decode_per_segment() {
        let t = parse("/data/a%20b/c%C3%A9.bin").unwrap();
        assert_eq!(t.export.as_deref(), Some("data"));
        assert_eq!(rel(&t).as_deref(), Some("a b/cé.bin"));
        assert!(!t.slash);
        let t = parse("/data//sub/").unwrap();
        assert_eq!(rel(&t).as_deref(), Some("sub"));
        assert!(t.slash);
        let t = parse("/data").unwrap();
        assert_eq!((t.export.as_deref(), t.rel.clone()), (Some("data"), None));
        let t = parse("/").unwrap();
        assert_eq!((t.export, t.rel), (None, None));
        assert_eq!(rel(&parse("/d/100%25").unwrap()).as_deref(), Some("100%"));
    }

    #[test]
    fn climbing_and_smuggled_separators_are_refused() {
        for bad in [
            "/data/../etc/passwd",
            "/data/%2e%2e/x",
            "/data/a%2fb",
            "/data/a%2F..%2Fb",
            "/data/./x",
            "/data/a%00b",
            "relative",
            "",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(parse(&format!("/d/{}", "a".repeat(MAX_PATH))).is_err());
        assert!(
            parse(&format!("/d/{}", "a".repeat(300))).is_err(),
            "NAME_MAX"
        );
    }

    #[test]
    fn hrefs_and_scope_paths_round_trip() {
        let t = parse("/data/a%20b/x%3Fy%23z%25").unwrap();
        assert_eq!(t.scope_path(), "/data/a b/x?y#z%");
        let href = t.href(false);
        assert_eq!(href, "/data/a%20b/x%3Fy%23z%25");
        assert_eq!(
            parse(&href).unwrap(),
            Target {
                slash: false,
                ..t.clone()
            }
        );
        assert_eq!(parse("/data/").unwrap().href(true), "/data/");
        assert_eq!(parse("/").unwrap().scope_path(), "/");
        let c = parse("/data").unwrap().child(b"f g").unwrap();
        assert_eq!(c.href(false), "/data/f%20g");
    }

    #[test]
    fn destinations_are_urls_or_absolute_paths() {
        assert_eq!(
            destination(b"http://h:8080/data/x%20y?q=1").as_deref(),
            Some("/data/x%20y")
        );
        assert_eq!(destination(b"https://h/d/x#f").as_deref(), Some("/d/x"));
        assert_eq!(destination(b"/d/x").as_deref(), Some("/d/x"));
        assert_eq!(destination(b"ftp://h/d/x"), None);
        assert_eq!(destination(b"http://host-only"), None);
        assert_eq!(destination(b"d/x"), None);
    }
}
