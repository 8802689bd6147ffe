//! Walking the source tree into a manifest.
//!
//! The sender describes everything it will send before any data moves: one
//! [`Entry`] per directory (empty ones too), regular file and symlink, parents
//! before children, names sorted so two walks of the same tree agree. The
//! receiver plans from this list alone (what exists, what is partly there,
//! what to create), which is what lets thousands of small files stream with
//! no per-file round trip.
//!
//! The walk never follows a symlink: every name is `lstat`ed relative to its
//! directory's descriptor and subdirectories are opened with `O_NOFOLLOW`, so
//! a link is recorded as a link and the walk cannot leave the tree. Each file
//! remembers how to open it again ([`Origin`]: the top item's directory plus
//! the path beneath it), resolved with `RESOLVE_BENEATH` when it is sent.
//!
//! Problems with single objects (permission denied, vanished, a device node)
//! do not stop the walk; they are collected in [`Manifest::notes`] so the
//! user gets one line per object, whichever end walked. So are hard links:
//! a file whose inode was already listed is copied again as a separate
//! file (the receiver never links two names), and a note says so.
//!
//! A source is either an item (its name is kept at the destination) or a
//! directory's contents ([`Manifest::add_contents`]: rsync's `dir/`), whose
//! children become top-level entries.

use std::collections::HashMap;
use std::sync::Arc;

use crate::beneath::{Dir, Kind, Meta, ResolveError};
use crate::relpath::{PathError, RelPath};
use crate::wire::{Entry, EntryKind, Note, NoteKind, MAX_NOTES};

/// Deeper trees are refused rather than risking the stack.
pub const MAX_DEPTH: usize = 512;

/// The most bytes of manifest one session holds (a walk builds, or a
/// receiver accepts), counted by [`entry_cost`]: 2 GiB, room for 16
/// million entries with 100-byte paths, while a peer cannot make the
/// server hold 16 million 4 KiB paths (64 GiB).
pub const MAX_MANIFEST_BYTES: usize = 2 << 30;

/// The memory one entry holds, as [`MAX_MANIFEST_BYTES`] counts it: the
/// entry, its origin slot, its path (twice for a file: the origin keeps
/// one too) and a symlink's target.
pub fn entry_cost(e: &Entry) -> usize {
    let fixed = std::mem::size_of::<Entry>() + std::mem::size_of::<Option<Origin>>();
    let path = e.path.as_bytes().len();
    let extra = match &e.kind {
        EntryKind::File { .. } => path,
        EntryKind::Symlink { target } => target.len(),
        _ => 0,
    };
    fixed.saturating_add(path).saturating_add(extra)
}

/// Why a top-level source could not be walked at all.
#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    /// A directory was named without `-r`.
    #[error("{0}: is a directory (use -r to copy directories)")]
    IsDir(String),
    /// The source does not exist.
    #[error("{0}: no such file or directory")]
    NotFound(String),
    /// The source leads outside its root.
    #[error("{0}: path leads outside the export (symlink or '..')")]
    Escapes(String),
    /// A special file (device, FIFO, socket) named directly.
    #[error("{0}: not a regular file, directory or symlink")]
    Special(String),
    /// Any other I/O failure on the top item.
    #[error("{path}: {err}")]
    Io {
        /// The source as named.
        path: String,
        /// What failed.
        err: std::io::Error,
    },
    /// A name that cannot be sent.
    #[error("{path}: {err}")]
    Path {
        /// The source as named.
        path: String,
        /// Why.
        err: PathError,
    },
}

/// Where the sender reopens a file.
#[derive(Debug, Clone)]
pub struct Origin {
    /// The directory holding the top-level item this file came from.
    pub root: Arc<Dir>,
    /// Path beneath `root` (starting with the top item's real name).
    pub rel: RelPath,
}

/// The walked tree.
#[derive(Debug, Default)]
pub struct Manifest {
    /// Entries in send order.
    pub entries: Vec<Entry>,
    /// For each entry, where to read it (files only).
    pub origins: Vec<Option<Origin>>,
    /// What the walk skipped or changed, one note per object.
    pub notes: Vec<Note>,
    /// The first destination path of each multiply linked file, by
    /// (device, inode).
    links: HashMap<(u64, u64), RelPath>,
    /// Bounds of a walk a peer asked for; `None`: the user's own walk.
    limits: Option<Limits>,
    /// [`entry_cost`] of the entries so far.
    bytes: usize,
    /// Set when the walk stopped at a bound: which one.
    exceeded: Option<String>,
    /// Notes past [`MAX_NOTES`] + 1, counted, not kept.
    notes_dropped: usize,
}

/// How much a walk may list.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Entries.
    pub entries: usize,
    /// Bytes, as [`entry_cost`] counts them.
    pub bytes: usize,
}

impl Manifest {
    /// An empty manifest whose walk stops at `limits` (the server walking
    /// for a peer's pull); [`exceeded`](Self::exceeded) then says which.
    pub fn bounded(limits: Limits) -> Manifest {
        Manifest {
            limits: Some(limits),
            ..Manifest::default()
        }
    }

    /// The bound the walk stopped at, if it did: the manifest is then
    /// incomplete and must not be sent.
    pub fn exceeded(&self) -> Option<&str> {
        self.exceeded.as_deref()
    }

    /// Adds `name` in `parent` (and, with `recursive`, everything under it),
    /// calling it `as_name` at the destination.
    pub fn add(
        &mut self,
        parent: Arc<Dir>,
        name: &[u8],
        as_name: &RelPath,
        recursive: bool,
    ) -> Result<(), WalkError> {
        let shown = String::from_utf8_lossy(name).into_owned();
        let rel = RelPath::new(name).map_err(|err| WalkError::Path {
            path: shown.clone(),
            err,
        })?;
        let meta = match parent.stat_at(name) {
            Ok(Some(m)) => m,
            Ok(None) => return Err(WalkError::NotFound(shown)),
            Err(err) => return Err(WalkError::Io { path: shown, err }),
        };
        match meta.kind {
            Kind::Dir if !recursive => Err(WalkError::IsDir(shown)),
            Kind::Other => Err(WalkError::Special(shown)),
            Kind::Dir => {
                let dir = parent
                    .subdir(name)
                    .map_err(|err| WalkError::Io { path: shown, err })?;
                self.push(&parent, &rel, as_name.clone(), meta, None);
                self.walk_dir(&parent, &dir, &rel, as_name, 1);
                Ok(())
            }
            _ => {
                let target = self.link_target(&parent, name, meta, as_name)?;
                self.push(&parent, &rel, as_name.clone(), meta, target);
                Ok(())
            }
        }
    }

    /// Adds the children of `dir` (and, recursively, everything under
    /// them) as top-level entries: rsync's `dir/`, and an export's root.
    pub fn add_contents(&mut self, dir: Arc<Dir>) -> Result<(), WalkError> {
        // Children are opened relative to the directory itself.
        let me = dir.try_clone().map_err(|err| WalkError::Io {
            path: ".".into(),
            err,
        })?;
        self.walk_children(&dir, &me, None, None, 1);
        Ok(())
    }

    /// The notes as sent to a receiver: at most [`MAX_NOTES`], the last
    /// saying how many more there were.
    pub fn notes_to_send(&self) -> Vec<Note> {
        if self.notes.len() <= MAX_NOTES {
            return self.notes.clone();
        }
        let mut v = self.notes[..MAX_NOTES].to_vec();
        v.push(Note {
            kind: NoteKind::More,
            path: String::new(),
            detail: (self.notes.len() - MAX_NOTES + self.notes_dropped).to_string(),
        });
        v
    }

    /// Total bytes of regular files.
    pub fn total_bytes(&self) -> u64 {
        self.entries
            .iter()
            .map(|e| match e.kind {
                EntryKind::File { size, .. } => size,
                _ => 0,
            })
            .sum()
    }

    /// Number of regular files.
    pub fn file_count(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| matches!(e.kind, EntryKind::File { .. }))
            .count()
    }

    fn walk_dir(
        &mut self,
        root: &Arc<Dir>,
        dir: &Dir,
        rel: &RelPath,
        as_path: &RelPath,
        depth: usize,
    ) {
        self.walk_children(root, dir, Some(rel), Some(as_path), depth);
    }

    fn note(&mut self, kind: NoteKind, path: String, detail: String) {
        // One past what is sent, so `notes_to_send` knows there were more;
        // beyond that only the count grows (a tree of a million FIFOs).
        if self.notes.len() <= MAX_NOTES {
            self.notes.push(Note { kind, path, detail });
        } else {
            self.notes_dropped = self.notes_dropped.saturating_add(1);
        }
    }

    /// Lists `dir` (which is `rel` beneath `root`, or `root` itself when
    /// `rel` is `None`) and adds its children, depth first, as `as_path`'s
    /// children (top-level entries when `None`).
    fn walk_children(
        &mut self,
        root: &Arc<Dir>,
        dir: &Dir,
        rel: Option<&RelPath>,
        as_path: Option<&RelPath>,
        depth: usize,
    ) {
        let here = || as_path.map_or_else(|| ".".to_string(), RelPath::display);
        if depth > MAX_DEPTH {
            self.note(
                NoteKind::Problem,
                here(),
                format!("tree deeper than {MAX_DEPTH} levels, not copied"),
            );
            return;
        }
        let mut names = match dir.read_dir() {
            Ok(n) => n,
            Err(e) => {
                self.note(NoteKind::Problem, here(), format!("cannot list: {e}"));
                return;
            }
        };
        names.sort();
        for name in names {
            if self.exceeded.is_some() {
                return;
            }
            let (child_rel, child_as) = match (
                rel.map_or_else(|| RelPath::new(&name), |r| r.join(&name)),
                as_path.map_or_else(|| RelPath::new(&name), |a| a.join(&name)),
            ) {
                (Ok(a), Ok(b)) => (a, b),
                (Err(e), _) | (_, Err(e)) => {
                    let shown = match as_path {
                        Some(a) => format!("{}/{}", a.display(), String::from_utf8_lossy(&name)),
                        None => String::from_utf8_lossy(&name).into_owned(),
                    };
                    self.note(NoteKind::Problem, shown, format!("{e}, not copied"));
                    continue;
                }
            };
            let meta = match dir.stat_at(&name) {
                Ok(Some(m)) => m,
                Ok(None) => continue, // vanished between listing and stat
                Err(e) => {
                    self.note(NoteKind::Problem, child_as.display(), e.to_string());
                    continue;
                }
            };
            match meta.kind {
                Kind::Other => self.note(
                    NoteKind::Skipped,
                    child_as.display(),
                    meta.special().unwrap_or("special file").to_string(),
                ),
                Kind::Dir => match dir.subdir(&name) {
                    Ok(sub) => {
                        self.push(root, &child_rel, child_as.clone(), meta, None);
                        self.walk_dir(root, &sub, &child_rel, &child_as, depth + 1);
                    }
                    Err(e) => self.note(
                        NoteKind::Problem,
                        child_as.display(),
                        format!("cannot open directory: {e}"),
                    ),
                },
                Kind::File => self.push(root, &child_rel, child_as, meta, None),
                Kind::Symlink => match dir.readlink_at(&name) {
                    Ok(t) if !t.is_empty() => self.push(root, &child_rel, child_as, meta, Some(t)),
                    Ok(_) => {}
                    Err(e) => self.note(
                        NoteKind::Problem,
                        child_as.display(),
                        format!("cannot read link: {e}"),
                    ),
                },
            }
        }
    }

    fn link_target(
        &self,
        parent: &Dir,
        name: &[u8],
        meta: Meta,
        as_name: &RelPath,
    ) -> Result<Option<Vec<u8>>, WalkError> {
        if meta.kind != Kind::Symlink {
            return Ok(None);
        }
        parent
            .readlink_at(name)
            .map(Some)
            .map_err(|err| WalkError::Io {
                path: as_name.display(),
                err,
            })
    }

    fn push(
        &mut self,
        root: &Arc<Dir>,
        rel: &RelPath,
        path: RelPath,
        meta: Meta,
        target: Option<Vec<u8>>,
    ) {
        let (kind, origin) = match (meta.kind, target) {
            (Kind::Symlink, Some(target)) => (EntryKind::Symlink { target }, None),
            (Kind::Dir, _) => (EntryKind::Dir, None),
            _ => {
                if meta.nlink > 1 {
                    match self.links.get(&(meta.dev, meta.ino)) {
                        Some(first) => {
                            let first = first.display();
                            self.note(NoteKind::HardLink, path.display(), first);
                        }
                        None => {
                            self.links.insert((meta.dev, meta.ino), path.clone());
                        }
                    }
                }
                (
                    EntryKind::File {
                        size: meta.size,
                        sparse: meta.size > 0 && meta.blocks.saturating_mul(512) < meta.size,
                    },
                    Some(Origin {
                        root: Arc::clone(root),
                        rel: rel.clone(),
                    }),
                )
            }
        };
        let entry = Entry {
            path,
            kind,
            mode: meta.mode,
            mtime_s: meta.mtime_s,
            mtime_ns: meta.mtime_ns,
        };
        let bytes = self.bytes.saturating_add(entry_cost(&entry));
        if let Some(l) = self.limits {
            if self.entries.len() >= l.entries {
                self.exceeded = Some(format!("more than {} entries", l.entries));
                return;
            }
            if bytes > l.bytes {
                self.exceeded = Some(format!("more than {} MiB of manifest", l.bytes >> 20));
                return;
            }
        }
        self.bytes = bytes;
        self.entries.push(entry);
        self.origins.push(origin);
    }
}

/// Opens a file named by an [`Origin`] for reading.
pub fn open_origin(o: &Origin) -> Result<std::fs::File, ResolveError> {
    let fd = o
        .root
        .open_beneath(&o.rel, fatpipe_sys::OFlags::RDONLY, 0)?;
    Ok(std::fs::File::from(fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn rp(s: &str) -> RelPath {
        RelPath::new(s.as_bytes()).unwrap()
    }

    fn tree_of(n: usize) -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        for i in 0..n {
            std::fs::write(t.path().join(format!("f{i:03}")), b"x").unwrap();
        }
        t
    }

    #[test]
    fn a_bounded_walk_stops_at_its_entry_bound() {
        let t = tree_of(20);
        let root = Arc::new(Dir::open(t.path()).unwrap());
        let mut m = Manifest::bounded(Limits {
            entries: 5,
            bytes: usize::MAX,
        });
        m.add_contents(root).unwrap();
        assert_eq!(m.entries.len(), 5);
        assert_eq!(m.exceeded(), Some("more than 5 entries"));
    }

    #[test]
    fn a_bounded_walk_stops_at_its_byte_bound() {
        let t = tree_of(20);
        let root = Arc::new(Dir::open(t.path()).unwrap());
        let one = entry_cost(&Entry {
            path: rp("f000"),
            kind: EntryKind::File {
                size: 1,
                sparse: false,
            },
            mode: 0,
            mtime_s: 0,
            mtime_ns: 0,
        });
        let mut m = Manifest::bounded(Limits {
            entries: usize::MAX,
            bytes: 3 << 20,
        });
        m.add_contents(Arc::clone(&root)).unwrap();
        assert_eq!(m.exceeded(), None, "20 small entries fit in 3 MiB");
        let mut m = Manifest::bounded(Limits {
            entries: usize::MAX,
            bytes: one * 7 + 1,
        });
        m.add_contents(root).unwrap();
        assert_eq!(m.entries.len(), 7);
        assert!(m.exceeded().is_some());
    }

    #[test]
    fn an_unbounded_walk_keeps_one_note_past_the_cap_and_counts_the_rest() {
        let mut m = Manifest::default();
        for i in 0..MAX_NOTES + 50 {
            m.note(NoteKind::Skipped, format!("p{i}"), "fifo".into());
        }
        assert_eq!(m.notes.len(), MAX_NOTES + 1);
        let sent = m.notes_to_send();
        assert_eq!(sent.len(), MAX_NOTES + 1);
        assert_eq!(sent[MAX_NOTES].detail, "50");
    }

    #[test]
    fn walks_tree_without_following_links() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"s").unwrap();
        let t = tempfile::tempdir().unwrap();
        let top = t.path().join("top");
        std::fs::create_dir_all(top.join("empty")).unwrap();
        std::fs::create_dir_all(top.join("sub dir/ünï")).unwrap();
        std::fs::write(top.join("sub dir/ünï/f"), b"hello").unwrap();
        std::fs::write(top.join("zero"), b"").unwrap();
        let long = "L".repeat(250);
        std::fs::write(top.join(&long), b"x").unwrap();
        symlink(outside.path(), top.join("out")).unwrap();
        let sparse = std::fs::File::create(top.join("sparse")).unwrap();
        sparse.set_len(64 << 20).unwrap();

        let parent = Arc::new(Dir::open(t.path()).unwrap());
        let mut m = Manifest::default();
        m.add(Arc::clone(&parent), b"top", &rp("renamed"), true)
            .unwrap();
        let paths: Vec<String> = m.entries.iter().map(|e| e.path.display()).collect();
        assert_eq!(
            paths,
            vec![
                "renamed".to_string(),
                format!("renamed/{long}"),
                "renamed/empty".into(),
                "renamed/out".into(),
                "renamed/sparse".into(),
                "renamed/sub dir".into(),
                "renamed/sub dir/ünï".into(),
                "renamed/sub dir/ünï/f".into(),
                "renamed/zero".into(),
            ]
        );
        let out = &m.entries[3];
        assert_eq!(
            out.kind,
            EntryKind::Symlink {
                target: outside.path().as_os_str().as_encoded_bytes().to_vec()
            }
        );
        assert_eq!(
            m.entries[4].kind,
            EntryKind::File {
                size: 64 << 20,
                sparse: true
            }
        );
        assert_eq!(m.file_count(), 4);
        assert_eq!(m.total_bytes(), (64 << 20) + 6);
        // Origins reopen the file by its real name, beneath the parent.
        let o = m.origins[7].as_ref().unwrap();
        assert_eq!(o.rel.display(), "top/sub dir/ünï/f");
        let mut s = String::new();
        std::io::Read::read_to_string(&mut open_origin(o).unwrap(), &mut s).unwrap();
        assert_eq!(s, "hello");
        assert!(m.notes.is_empty(), "{:?}", m.notes);
    }

    #[test]
    fn top_level_errors() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("d")).unwrap();
        let parent = Arc::new(Dir::open(t.path()).unwrap());
        let mut m = Manifest::default();
        assert!(matches!(
            m.add(Arc::clone(&parent), b"d", &rp("d"), false),
            Err(WalkError::IsDir(_))
        ));
        assert!(matches!(
            m.add(Arc::clone(&parent), b"nope", &rp("nope"), true),
            Err(WalkError::NotFound(_))
        ));
        let mut m = Manifest::default();
        std::fs::write(t.path().join("d/f"), b"1").unwrap();
        m.add_contents(Arc::new(Dir::open(&t.path().join("d")).unwrap()))
            .unwrap();
        assert_eq!(m.entries.len(), 1);
        assert_eq!(m.entries[0].path.display(), "f");
        assert_eq!(m.origins[0].as_ref().unwrap().rel.display(), "f");
    }

    #[test]
    fn contents_fifos_and_hard_links_are_noted() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("d");
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::write(d.join("a"), b"linked").unwrap();
        std::fs::hard_link(d.join("a"), d.join("sub/b")).unwrap();
        let fifo = std::process::Command::new("mkfifo")
            .arg(d.join("pipe"))
            .status()
            .unwrap();
        assert!(fifo.success());
        let mut m = Manifest::default();
        m.add_contents(Arc::new(Dir::open(&d).unwrap())).unwrap();
        let paths: Vec<String> = m.entries.iter().map(|e| e.path.display()).collect();
        assert_eq!(paths, ["a", "sub", "sub/b"]);
        let notes: Vec<(NoteKind, &str, &str)> = m
            .notes
            .iter()
            .map(|n| (n.kind, n.path.as_str(), n.detail.as_str()))
            .collect();
        assert_eq!(
            notes,
            [
                (NoteKind::Skipped, "pipe", "FIFO"),
                (NoteKind::HardLink, "sub/b", "a"),
            ]
        );
        assert!(m.notes.iter().all(|n| n.kind != NoteKind::Problem));
        assert_eq!(m.notes_to_send().len(), 2);
    }
}
