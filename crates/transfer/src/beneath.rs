//! File-system operations that cannot leave a directory.
//!
//! Every file the transfer touches on a server, and every path a peer names,
//! is reached from a directory file descriptor ([`Dir`]) — the export root or
//! the destination base — never from a joined path string. Multi-component
//! paths are resolved by `fatpipe_sys::open_beneath`: `openat2(RESOLVE_BENEATH
//! | RESOLVE_NO_MAGICLINKS)` where the kernel has it, so `..` and symlinks
//! that point out of the tree fail, and one `O_NOFOLLOW` component at a time
//! on older kernels (stricter, never looser). A trailing symlink is never
//! followed. Single-name operations (`mkdirat`, `renameat`, `symlinkat`,
//! `readdir`, ...) take a name already validated to contain no `/`, relative
//! to a directory resolved this way, through `fatpipe_sys::dir`.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use fatpipe_sys::{dir, OFlags};

use crate::relpath::RelPath;

/// Why a path could not be resolved beneath its root.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// A symlink or `..` would lead outside the root.
    #[error("path leads outside its root (symlink or '..')")]
    Escapes,
    /// Any other failure (not found, permission, ...).
    #[error("{0}")]
    Io(#[from] io::Error),
}

impl ResolveError {
    /// Turns the error into an `io::Error` (escapes become `PermissionDenied`).
    pub fn into_io(self) -> io::Error {
        match self {
            ResolveError::Escapes => io::Error::new(
                io::ErrorKind::PermissionDenied,
                "path leads outside its root (symlink or '..')",
            ),
            ResolveError::Io(e) => e,
        }
    }
}

pub use fatpipe_sys::dir::{Kind, Meta};

/// An open directory; all operations are relative to it.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
}

impl std::os::fd::AsFd for Dir {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Dir {
    /// Opens a directory by ordinary path (a user's own argument).
    pub fn open(path: &Path) -> io::Result<Dir> {
        Ok(Dir {
            fd: dir::open_dir(path)?,
        })
    }

    /// Free space and mount of the file system this directory is on.
    pub fn space(&self) -> io::Result<fatpipe_sys::files::FsSpace> {
        fatpipe_sys::files::fs_space(&self.fd)
    }

    /// A second handle on the same directory.
    pub fn try_clone(&self) -> io::Result<Dir> {
        Ok(Dir {
            fd: self.fd.try_clone()?,
        })
    }

    /// Resolves a directory beneath this one (`None` is this directory).
    pub fn dir_beneath(&self, rel: Option<&RelPath>) -> Result<Dir, ResolveError> {
        match rel {
            None => Ok(self.try_clone()?),
            Some(rel) => {
                let fd = self.open_beneath(rel, OFlags::RDONLY | OFlags::DIRECTORY, 0)?;
                Ok(Dir { fd })
            }
        }
    }

    /// Opens `rel` beneath this directory with `flags` (and `mode` if creating).
    /// A trailing symlink is never followed (and counts as an escape).
    pub fn open_beneath(
        &self,
        rel: &RelPath,
        flags: OFlags,
        mode: u32,
    ) -> Result<OwnedFd, ResolveError> {
        let flags = flags | OFlags::NOFOLLOW;
        match fatpipe_sys::open_beneath(&self.fd, rel.as_path(), flags, mode) {
            Ok(f) => Ok(f.into()),
            Err(e) if fatpipe_sys::is_escape(&e) => Err(ResolveError::Escapes),
            Err(e) if e.kind() == io::ErrorKind::NotADirectory => {
                // O_DIRECTORY on a trailing symlink says ENOTDIR: tell "a
                // link we refuse to follow" from "a plain file".
                let probe = fatpipe_sys::open_beneath(
                    &self.fd,
                    rel.as_path(),
                    OFlags::PATH | OFlags::NOFOLLOW,
                    0,
                );
                if let Ok(f) = probe {
                    if matches!(fstat(&f), Ok(m) if m.kind == Kind::Symlink) {
                        return Err(ResolveError::Escapes);
                    }
                }
                Err(ResolveError::Io(e))
            }
            Err(e) => Err(ResolveError::Io(e)),
        }
    }

    /// Opens a single name in this directory, never following a symlink.
    pub fn open_at(&self, name: &[u8], flags: OFlags, mode: u32) -> io::Result<File> {
        dir::open_at(&self.fd, name, flags, mode)
    }

    /// Opens a subdirectory by single name, never following a symlink.
    pub fn subdir(&self, name: &[u8]) -> io::Result<Dir> {
        let f = self.open_at(name, OFlags::RDONLY | OFlags::DIRECTORY, 0)?;
        Ok(Dir { fd: f.into() })
    }

    /// Metadata of `name` (not following symlinks); `None` if it does not exist.
    pub fn stat_at(&self, name: &[u8]) -> io::Result<Option<Meta>> {
        dir::stat_at(&self.fd, name)
    }

    /// Metadata of this directory itself.
    pub fn stat_self(&self) -> io::Result<Meta> {
        fstat(&self.fd)
    }

    /// Creates a directory; an existing directory is fine.
    pub fn mkdir_at(&self, name: &[u8], mode: u32) -> io::Result<()> {
        let e = match dir::mkdir_at(&self.fd, name, mode) {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if e.kind() == io::ErrorKind::AlreadyExists {
            match self.stat_at(name)? {
                Some(m) if m.kind == Kind::Dir => return Ok(()),
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        "exists and is not a directory",
                    ))
                }
            }
        }
        Err(e)
    }

    /// Creates a symlink `name` -> `target`.
    pub fn symlink_at(&self, target: &[u8], name: &[u8]) -> io::Result<()> {
        dir::symlink_at(&self.fd, target, name)
    }

    /// Reads the target of symlink `name`.
    pub fn readlink_at(&self, name: &[u8]) -> io::Result<Vec<u8>> {
        dir::readlink_at(&self.fd, name)
    }

    /// Atomically renames `from` to `to` within this directory.
    pub fn rename_at(&self, from: &[u8], to: &[u8]) -> io::Result<()> {
        dir::rename_at(&self.fd, from, to)
    }

    /// Opens a new file without a name in this directory for writing
    /// (`O_TMPFILE`, Linux), to be named by [`Dir::link_fd_at`].
    pub fn open_unnamed(&self, mode: u32) -> io::Result<File> {
        dir::open_unnamed(&self.fd, mode)
    }

    /// Gives the unnamed (`O_TMPFILE`) file `file` the name `name` in this
    /// directory; fails with `AlreadyExists` if the name is taken.
    pub fn link_fd_at(&self, file: &File, name: &[u8]) -> io::Result<()> {
        dir::link_unnamed(file, &self.fd, name)
    }

    /// Renames `from` in this directory to `to` in `dest` (the same file
    /// system); with `replace` false an existing `to` fails with
    /// `AlreadyExists`.
    pub fn rename_to(&self, from: &[u8], dest: &Dir, to: &[u8], replace: bool) -> io::Result<()> {
        dir::rename_between(&self.fd, from, &dest.fd, to, replace)
    }

    /// Removes the empty directory `name`.
    pub fn rmdir_at(&self, name: &[u8]) -> io::Result<()> {
        dir::rmdir_at(&self.fd, name)
    }

    /// Removes the file (not directory) `name`; a missing name is fine.
    pub fn unlink_at(&self, name: &[u8]) -> io::Result<()> {
        match dir::unlink_at(&self.fd, name) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Sets the modification time of `name` (the link itself for symlinks).
    pub fn set_mtime_at(&self, name: &[u8], sec: i64, nsec: u32) -> io::Result<()> {
        dir::set_mtime_at(&self.fd, name, sec, nsec)
    }

    /// Sets the permission bits of this directory.
    pub fn chmod_self(&self, mode: u32) -> io::Result<()> {
        dir::set_mode(&self.fd, mode)
    }

    /// Sets this directory's modification time.
    pub fn set_mtime_self(&self, sec: i64, nsec: u32) -> io::Result<()> {
        set_file_mtime(&self.fd, sec, nsec)
    }

    /// Flushes the directory (makes renames inside it durable).
    pub fn sync(&self) -> io::Result<()> {
        dir::sync(&self.fd)
    }

    /// The names in this directory (without `.` and `..`), unsorted.
    pub fn read_dir(&self) -> io::Result<Vec<Vec<u8>>> {
        dir::read_dir(&self.fd)
    }
}

/// Metadata of an open file.
pub fn fstat(fd: impl AsFd) -> io::Result<Meta> {
    dir::stat(fd)
}

/// Sets an open file's modification time.
pub fn set_file_mtime(fd: impl AsFd, sec: i64, nsec: u32) -> io::Result<()> {
    dir::set_mtime(fd, sec, nsec)
}

/// Sets an open file's permission bits.
pub fn set_file_mode(fd: impl AsFd, mode: u32) -> io::Result<()> {
    dir::set_mode(fd, mode)
}

/// Reserves `len` bytes for a file about to be written (`fallocate` via
/// the system-call crate; file systems without it get the length set).
/// `ENOSPC` is reported.
pub fn preallocate(file: &std::fs::File, len: u64) -> io::Result<()> {
    fatpipe_sys::preallocate(file, len).map(drop)
}

/// Sets a file's length (holes where nothing was written).
pub fn set_len(file: &File, len: u64) -> io::Result<()> {
    file.set_len(len)
}

/// The offset of the next byte of data at or after `off`, or `None` if the
/// rest of the file is a hole (`SEEK_DATA`).
pub fn next_data(fd: impl AsFd, off: u64) -> io::Result<Option<u64>> {
    fatpipe_sys::next_data(fd, off)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn rel(s: &str) -> RelPath {
        RelPath::new(s.as_bytes()).unwrap()
    }

    #[test]
    fn resolves_inside_refuses_outside() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"s").unwrap();
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("d")).unwrap();
        std::fs::write(root.path().join("d/f"), b"hello").unwrap();
        symlink(outside.path(), root.path().join("out")).unwrap();
        symlink("/etc/passwd", root.path().join("abs")).unwrap();
        let dir = Dir::open(root.path()).unwrap();
        assert!(dir.open_beneath(&rel("d/f"), OFlags::RDONLY, 0).is_ok());
        for bad in ["out/secret", "abs"] {
            match dir.open_beneath(&rel(bad), OFlags::RDONLY, 0) {
                Err(ResolveError::Escapes) => {}
                other => panic!("{bad}: expected Escapes, got {other:?}"),
            }
        }
        assert!(matches!(
            dir.dir_beneath(Some(&rel("out"))),
            Err(ResolveError::Escapes)
        ));
    }

    #[test]
    fn single_name_operations() {
        let root = tempfile::tempdir().unwrap();
        let dir = Dir::open(root.path()).unwrap();
        dir.mkdir_at(b"sub", 0o755).unwrap();
        dir.mkdir_at(b"sub", 0o755).unwrap();
        dir.symlink_at(b"sub", b"link").unwrap();
        assert_eq!(dir.readlink_at(b"link").unwrap(), b"sub");
        assert_eq!(dir.stat_at(b"link").unwrap().unwrap().kind, Kind::Symlink);
        assert!(dir.stat_at(b"missing").unwrap().is_none());
        // open_at never follows the link.
        assert!(dir.open_at(b"link", OFlags::RDONLY, 0).is_err());
        let f = dir
            .open_at(
                b"tmp",
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
                0o600,
            )
            .unwrap();
        set_file_mtime(&f, 1_000_000, 5).unwrap();
        dir.rename_at(b"tmp", b"final").unwrap();
        let m = dir.stat_at(b"final").unwrap().unwrap();
        assert_eq!((m.kind, m.mtime_s, m.mtime_ns), (Kind::File, 1_000_000, 5));
        let mut names = dir.read_dir().unwrap();
        names.sort();
        assert_eq!(
            names,
            vec![b"final".to_vec(), b"link".to_vec(), b"sub".to_vec()]
        );
        dir.unlink_at(b"final").unwrap();
        dir.unlink_at(b"final").unwrap();
    }
}
