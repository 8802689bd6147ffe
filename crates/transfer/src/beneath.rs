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
//! to a directory resolved this way; the system-call crate has no
//! descriptor-relative versions of those, so they live here.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

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

/// What kind of object a name refers to (symlinks are never followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A device, FIFO or socket: not copied.
    Other,
}

/// The metadata a copy cares about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    /// Object kind.
    pub kind: Kind,
    /// Permission bits (`0o7777`).
    pub mode: u32,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, seconds since the epoch.
    pub mtime_s: i64,
    /// Modification time, nanoseconds.
    pub mtime_ns: u32,
    /// Allocated 512-byte blocks (detects sparse files).
    pub blocks: u64,
}

/// An open directory; all operations are relative to it.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
}

impl Dir {
    /// Opens a directory by ordinary path (a user's own argument).
    pub fn open(path: &Path) -> io::Result<Dir> {
        let c = cpath(path.as_os_str().as_bytes())?;
        // SAFETY: valid C string; the returned fd is checked.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        Ok(Dir { fd: owned(fd)? })
    }

    /// The raw descriptor.
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
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
                let fd = self.open_beneath(rel, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
                Ok(Dir { fd })
            }
        }
    }

    /// Opens `rel` beneath this directory with `flags` (and `mode` if creating).
    /// A trailing symlink is never followed (and counts as an escape).
    pub fn open_beneath(
        &self,
        rel: &RelPath,
        flags: i32,
        mode: u32,
    ) -> Result<OwnedFd, ResolveError> {
        let flags = flags | libc::O_NOFOLLOW;
        match fatpipe_sys::open_beneath(&self.fd, rel.as_path(), flags, mode as libc::mode_t) {
            Ok(f) => Ok(f.into()),
            Err(e) if fatpipe_sys::is_escape(&e) => Err(ResolveError::Escapes),
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
                // O_DIRECTORY on a trailing symlink says ENOTDIR: tell "a
                // link we refuse to follow" from "a plain file".
                let probe = fatpipe_sys::open_beneath(
                    &self.fd,
                    rel.as_path(),
                    libc::O_PATH | libc::O_NOFOLLOW,
                    0,
                );
                if let Ok(f) = probe {
                    if matches!(fstat(f.as_raw_fd()), Ok(m) if m.kind == Kind::Symlink) {
                        return Err(ResolveError::Escapes);
                    }
                }
                Err(ResolveError::Io(e))
            }
            Err(e) => Err(ResolveError::Io(e)),
        }
    }

    /// Opens a single name in this directory, never following a symlink.
    pub fn open_at(&self, name: &[u8], flags: i32, mode: u32) -> io::Result<File> {
        let c = cpath(name)?;
        // SAFETY: valid C string and directory fd; the returned fd is checked.
        let fd = unsafe {
            libc::openat(
                self.raw(),
                c.as_ptr(),
                flags | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                mode as libc::c_uint,
            )
        };
        Ok(File::from(owned(fd)?))
    }

    /// Opens a subdirectory by single name, never following a symlink.
    pub fn subdir(&self, name: &[u8]) -> io::Result<Dir> {
        let f = self.open_at(name, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        Ok(Dir { fd: f.into() })
    }

    /// Metadata of `name` (not following symlinks); `None` if it does not exist.
    pub fn stat_at(&self, name: &[u8]) -> io::Result<Option<Meta>> {
        let c = cpath(name)?;
        // SAFETY: zeroed stat is a valid out-parameter.
        let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
        // SAFETY: valid fd, C string and out-pointer.
        let rc =
            unsafe { libc::fstatat64(self.raw(), c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::NotFound {
                return Ok(None);
            }
            return Err(e);
        }
        Ok(Some(meta(&st)))
    }

    /// Metadata of this directory itself.
    pub fn stat_self(&self) -> io::Result<Meta> {
        fstat(self.raw())
    }

    /// Creates a directory; an existing directory is fine.
    pub fn mkdir_at(&self, name: &[u8], mode: u32) -> io::Result<()> {
        let c = cpath(name)?;
        // SAFETY: valid fd and C string.
        let rc = unsafe { libc::mkdirat(self.raw(), c.as_ptr(), mode as libc::mode_t) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
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
        let t = cpath(target)?;
        let c = cpath(name)?;
        // SAFETY: valid fd and C strings.
        check(unsafe { libc::symlinkat(t.as_ptr(), self.raw(), c.as_ptr()) })
    }

    /// Reads the target of symlink `name`.
    pub fn readlink_at(&self, name: &[u8]) -> io::Result<Vec<u8>> {
        let c = cpath(name)?;
        let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
        // SAFETY: buffer valid for its length.
        let n =
            unsafe { libc::readlinkat(self.raw(), c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        Ok(buf)
    }

    /// Atomically renames `from` to `to` within this directory.
    pub fn rename_at(&self, from: &[u8], to: &[u8]) -> io::Result<()> {
        let f = cpath(from)?;
        let t = cpath(to)?;
        // SAFETY: valid fds and C strings.
        check(unsafe { libc::renameat(self.raw(), f.as_ptr(), self.raw(), t.as_ptr()) })
    }

    /// Gives the unnamed (`O_TMPFILE`) file `fd` the name `name` in this
    /// directory; fails with `AlreadyExists` if the name is taken. Goes
    /// through `/proc/self/fd`, which needs no privilege (`AT_EMPTY_PATH`
    /// would need CAP_DAC_READ_SEARCH).
    pub fn link_fd_at(&self, fd: RawFd, name: &[u8]) -> io::Result<()> {
        let src = cpath(format!("/proc/self/fd/{fd}").as_bytes())?;
        let c = cpath(name)?;
        // SAFETY: valid C strings and directory fd.
        check(unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                src.as_ptr(),
                self.raw(),
                c.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        })
    }

    /// Removes the file (not directory) `name`; a missing name is fine.
    pub fn unlink_at(&self, name: &[u8]) -> io::Result<()> {
        let c = cpath(name)?;
        // SAFETY: valid fd and C string.
        let rc = unsafe { libc::unlinkat(self.raw(), c.as_ptr(), 0) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::NotFound {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Sets the modification time of `name` (the link itself for symlinks).
    pub fn set_mtime_at(&self, name: &[u8], sec: i64, nsec: u32) -> io::Result<()> {
        let c = cpath(name)?;
        let ts = times(sec, nsec);
        // SAFETY: valid fd, C string and a two-element timespec array.
        check(unsafe {
            libc::utimensat(
                self.raw(),
                c.as_ptr(),
                ts.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })
    }

    /// Sets the permission bits of this directory.
    pub fn chmod_self(&self, mode: u32) -> io::Result<()> {
        // SAFETY: valid fd.
        check(unsafe { libc::fchmod(self.raw(), mode as libc::mode_t) })
    }

    /// Sets this directory's modification time.
    pub fn set_mtime_self(&self, sec: i64, nsec: u32) -> io::Result<()> {
        set_file_mtime(self.raw(), sec, nsec)
    }

    /// Flushes the directory (makes renames inside it durable).
    pub fn sync(&self) -> io::Result<()> {
        // SAFETY: valid fd.
        check(unsafe { libc::fsync(self.raw()) })
    }

    /// The names in this directory (without `.` and `..`), unsorted.
    pub fn read_dir(&self) -> io::Result<Vec<Vec<u8>>> {
        // A fresh open file description, so the listing position is our own.
        let fresh = self.open_at(b".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        let fd: OwnedFd = fresh.into();
        let raw = std::os::fd::IntoRawFd::into_raw_fd(fd);
        // SAFETY: raw is an open directory fd whose ownership passes to the DIR.
        let dirp = unsafe { libc::fdopendir(raw) };
        if dirp.is_null() {
            let e = io::Error::last_os_error();
            // SAFETY: fdopendir failed, so we still own raw.
            unsafe { libc::close(raw) };
            return Err(e);
        }
        let mut names = Vec::new();
        loop {
            // SAFETY: dirp is a valid DIR*; errno is reset to tell end from error.
            unsafe { *libc::__errno_location() = 0 };
            // SAFETY: as above.
            let ent = unsafe { libc::readdir64(dirp) };
            if ent.is_null() {
                let e = io::Error::last_os_error();
                // SAFETY: dirp valid; closes raw too.
                unsafe { libc::closedir(dirp) };
                if e.raw_os_error().unwrap_or(0) != 0 {
                    return Err(e);
                }
                return Ok(names);
            }
            // SAFETY: d_name is a NUL-terminated array inside the entry.
            let name = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) }.to_bytes();
            if name != b"." && name != b".." {
                names.push(name.to_vec());
            }
        }
    }
}

/// Metadata of an open file.
pub fn fstat(fd: RawFd) -> io::Result<Meta> {
    // SAFETY: zeroed stat is a valid out-parameter.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out-pointer.
    check(unsafe { libc::fstat64(fd, &mut st) })?;
    Ok(meta(&st))
}

/// Sets an open file's modification time.
pub fn set_file_mtime(fd: RawFd, sec: i64, nsec: u32) -> io::Result<()> {
    let ts = times(sec, nsec);
    // SAFETY: valid fd and two-element timespec array.
    check(unsafe { libc::futimens(fd, ts.as_ptr()) })
}

/// Sets an open file's permission bits.
pub fn set_file_mode(fd: RawFd, mode: u32) -> io::Result<()> {
    // SAFETY: valid fd.
    check(unsafe { libc::fchmod(fd, mode as libc::mode_t) })
}

/// Reserves `len` bytes for a file about to be written (`fallocate` via
/// the system-call crate; file systems without it get the length set).
/// `ENOSPC` is reported.
pub fn preallocate(file: &std::fs::File, len: u64) -> io::Result<()> {
    fatpipe_sys::preallocate(file, len).map(drop)
}

/// Sets a file's length (holes where nothing was written).
pub fn set_len(fd: RawFd, len: u64) -> io::Result<()> {
    // SAFETY: valid fd.
    check(unsafe { libc::ftruncate64(fd, len as libc::off64_t) })
}

/// The offset of the next byte of data at or after `off`, or `None` if the
/// rest of the file is a hole (`SEEK_DATA`).
pub fn next_data(fd: RawFd, off: u64) -> io::Result<Option<u64>> {
    // SAFETY: valid fd.
    let r = unsafe { libc::lseek64(fd, off as libc::off64_t, libc::SEEK_DATA) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENXIO) {
            return Ok(None);
        }
        return Err(e);
    }
    Ok(Some(r as u64))
}

fn owned(fd: i32) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a freshly opened descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn check(rc: i32) -> io::Result<()> {
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn cpath(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
}

fn times(sec: i64, nsec: u32) -> [libc::timespec; 2] {
    [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: sec as libc::time_t,
            tv_nsec: nsec as libc::c_long,
        },
    ]
}

fn meta(st: &libc::stat64) -> Meta {
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => Kind::File,
        libc::S_IFDIR => Kind::Dir,
        libc::S_IFLNK => Kind::Symlink,
        _ => Kind::Other,
    };
    Meta {
        kind,
        mode: st.st_mode & 0o7777,
        size: st.st_size as u64,
        mtime_s: st.st_mtime,
        mtime_ns: st.st_mtime_nsec as u32,
        blocks: st.st_blocks as u64,
    }
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
        assert!(dir.open_beneath(&rel("d/f"), libc::O_RDONLY, 0).is_ok());
        for bad in ["out/secret", "abs"] {
            match dir.open_beneath(&rel(bad), libc::O_RDONLY, 0) {
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
        assert!(dir.open_at(b"link", libc::O_RDONLY, 0).is_err());
        let f = dir
            .open_at(b"tmp", libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o600)
            .unwrap();
        set_file_mtime(f.as_raw_fd(), 1_000_000, 5).unwrap();
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
