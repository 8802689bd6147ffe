//! What a one-time ticket grants a copy session: one file of one export,
//! in one direction (docs/protocol.md, "Tickets"; the HTTP port issues
//! them for the leg of a third-party copy, docs/http.md).
//!
//! The issuer encodes it; the engine carries it opaque from the ticket
//! book to [`crate::service::CopyService`], which refuses any request
//! outside it. Never read from the network: the ticket book holds it.

use crate::wire::{Direction, Request};

/// One file of one export, in one direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Pull: the session may read the file; push: write it.
    pub direction: Direction,
    /// The export's name.
    pub export: String,
    /// The file, relative to the export (no trailing `/`).
    pub path: Vec<u8>,
}

impl Grant {
    /// The bytes the ticket book holds.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = match self.direction {
            Direction::Pull => b"pull\0".to_vec(),
            Direction::Push => b"push\0".to_vec(),
        };
        out.extend_from_slice(self.export.as_bytes());
        out.push(0);
        out.extend_from_slice(&self.path);
        out
    }

    /// Reads [`Grant::encode`]'s bytes.
    pub fn decode(b: &[u8]) -> Option<Grant> {
        let mut parts = b.splitn(3, |&c| c == 0);
        let direction = match parts.next()? {
            b"pull" => Direction::Pull,
            b"push" => Direction::Push,
            _ => return None,
        };
        let export = String::from_utf8(parts.next()?.to_vec()).ok()?;
        let path = parts.next()?.to_vec();
        (!export.is_empty() && !path.is_empty()).then_some(Grant {
            direction,
            export,
            path,
        })
    }

    /// Whether `req` stays inside the grant: the same direction, export
    /// and one path, nothing recursive.
    pub fn allows(&self, req: &Request) -> bool {
        req.direction == self.direction
            && req.export == self.export.as_bytes()
            && req.paths.len() == 1
            && req.paths[0] == self.path
            && !req.recursive
    }

    /// The refusal of a request outside it, one line.
    pub fn refusal(&self) -> String {
        let what = match self.direction {
            Direction::Pull => "reading",
            Direction::Push => "writing",
        };
        format!(
            "this session's ticket grants only {what} {}/{}",
            self.export,
            String::from_utf8_lossy(&self.path)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(direction: Direction, export: &str, paths: &[&str], recursive: bool) -> Request {
        Request {
            version: crate::wire::VERSION,
            direction,
            recursive,
            sync: false,
            direct: false,
            algo: crate::hash::Algo::Xxh3,
            streams: 1,
            chunk_size: 1 << 20,
            bwlimit: 0,
            export: export.as_bytes().to_vec(),
            paths: paths.iter().map(|p| p.as_bytes().to_vec()).collect(),
            tuning: Default::default(),
        }
    }

    #[test]
    fn round_trips_and_allows_only_its_file_and_direction() {
        let g = Grant {
            direction: Direction::Pull,
            export: "data".into(),
            path: b"a/b.bin".to_vec(),
        };
        assert_eq!(Grant::decode(&g.encode()), Some(g.clone()));
        assert!(g.allows(&req(Direction::Pull, "data", &["a/b.bin"], false)));
        assert!(!g.allows(&req(Direction::Push, "data", &["a/b.bin"], false)));
        assert!(!g.allows(&req(Direction::Pull, "other", &["a/b.bin"], false)));
        assert!(!g.allows(&req(Direction::Pull, "data", &["a/c.bin"], false)));
        assert!(!g.allows(&req(Direction::Pull, "data", &["a/b.bin", "x"], false)));
        assert!(!g.allows(&req(Direction::Pull, "data", &["a/b.bin"], true)));
        assert!(!g.allows(&req(Direction::Pull, "data", &[], false)));
        assert_eq!(Grant::decode(b"read\0data\0x"), None);
        assert_eq!(Grant::decode(b"pull\0data"), None);
        assert_eq!(Grant::decode(b"pull\0\0x"), None);
        // A ticket to write (a push over the leg) does not read, nor
        // write into its name as a directory, nor another file.
        let w = Grant {
            direction: Direction::Push,
            ..g
        };
        assert_eq!(Grant::decode(&w.encode()), Some(w.clone()));
        assert!(w.allows(&req(Direction::Push, "data", &["a/b.bin"], false)));
        assert!(!w.allows(&req(Direction::Pull, "data", &["a/b.bin"], false)));
        assert!(!w.allows(&req(Direction::Push, "data", &["a/b.bin/"], false)));
        assert!(!w.allows(&req(Direction::Push, "data", &["a/c.bin"], false)));
    }
}
