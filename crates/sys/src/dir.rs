//! Operations on one name inside an open directory, and on open files'
//! metadata, for the copy engine's safe paths.
//!
//! The transfer reaches every file it touches from a directory descriptor
//! (the export root or the destination base), never from a joined path
//! string, so a tree that changes under it cannot redirect it. Multi-component
//! paths go through [`crate::open_beneath`]; what is here takes a single
//! name the caller has already checked to hold no `/`, relative to such a
//! directory, and never follows a symlink in the last component. Names are
//! bytes (file names need not be UTF-8). The calls are rustix's safe
//! wrappers; only the two halves of "write a file without a name, then give
//! it one" (`O_TMPFILE` and the `/proc/self/fd` link) are Linux's and sit
//! behind the platform split.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timespec, Timestamps, UTIME_OMIT};

use crate::platform;

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

impl Meta {
    /// What a special file is, in words (`"FIFO"`, `"socket"`,
    /// `"device"`); `None` for files, directories and symlinks.
    pub fn special(&self) -> Option<&'static str> {
        (self.kind == Kind::Other).then_some(self.special)
    }
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
    /// Device and inode: the same pair under two names is one file with
    /// two hard links.
    pub dev: u64,
    /// Inode number (see `dev`).
    pub ino: u64,
    /// Hard links to the object.
    pub nlink: u64,
    /// For [`Kind::Other`], what it is (see [`Meta::special`]).
    special: &'static str,
}

/// Opens a directory by ordinary path (a user's own argument).
pub fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    let c = cstring(path.as_os_str().as_encoded_bytes())?;
    Ok(rustix::fs::open(
        c.as_c_str(),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Opens the single name `name` in `dir` with `flags` (and `mode` if
/// creating); `O_CLOEXEC` and `O_NOFOLLOW` are always added.
pub fn open_at(dir: impl AsFd, name: &[u8], flags: OFlags, mode: u32) -> io::Result<File> {
    let c = cstring(name)?;
    let fd = rustix::fs::openat(
        dir,
        c.as_c_str(),
        flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        mode_bits(mode),
    )?;
    Ok(File::from(fd))
}

/// Metadata of `name` in `dir`, not following a symlink; `None` if it
/// does not exist.
pub fn stat_at(dir: impl AsFd, name: &[u8]) -> io::Result<Option<Meta>> {
    let c = cstring(name)?;
    match rustix::fs::statat(dir, c.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(meta(&st))),
        Err(e) => {
            let e = io::Error::from(e);
            if e.kind() == io::ErrorKind::NotFound {
                Ok(None)
            } else {
                Err(e)
            }
        }
    }
}

/// Metadata of an open file or directory.
pub fn stat(fd: impl AsFd) -> io::Result<Meta> {
    Ok(meta(&rustix::fs::fstat(fd)?))
}

/// `mkdirat(2)`: creates directory `name` in `dir`.
pub fn mkdir_at(dir: impl AsFd, name: &[u8], mode: u32) -> io::Result<()> {
    let c = cstring(name)?;
    Ok(rustix::fs::mkdirat(dir, c.as_c_str(), mode_bits(mode))?)
}

/// Creates symlink `name` in `dir` pointing at `target`.
pub fn symlink_at(dir: impl AsFd, target: &[u8], name: &[u8]) -> io::Result<()> {
    let t = cstring(target)?;
    let c = cstring(name)?;
    Ok(rustix::fs::symlinkat(t.as_c_str(), dir, c.as_c_str())?)
}

/// The target of symlink `name` in `dir`.
pub fn readlink_at(dir: impl AsFd, name: &[u8]) -> io::Result<Vec<u8>> {
    let c = cstring(name)?;
    let target = rustix::fs::readlinkat(dir, c.as_c_str(), Vec::new())?;
    Ok(target.into_bytes())
}

/// Atomically renames `from` to `to`, both in `dir`.
pub fn rename_at(dir: impl AsFd, from: &[u8], to: &[u8]) -> io::Result<()> {
    let f = cstring(from)?;
    let t = cstring(to)?;
    let dir = dir.as_fd();
    Ok(rustix::fs::renameat(dir, f.as_c_str(), dir, t.as_c_str())?)
}

/// Atomically renames `from` in `from_dir` to `to` in `to_dir` (same file
/// system); with `replace` false an existing `to` fails with
/// `AlreadyExists` (`RENAME_NOREPLACE`) where the platform can say so,
/// else it is checked first.
pub fn rename_between(
    from_dir: impl AsFd,
    from: &[u8],
    to_dir: impl AsFd,
    to: &[u8],
    replace: bool,
) -> io::Result<()> {
    let f = cstring(from)?;
    let t = cstring(to)?;
    if replace {
        return Ok(rustix::fs::renameat(
            from_dir,
            f.as_c_str(),
            to_dir,
            t.as_c_str(),
        )?);
    }
    match rustix::fs::renameat_with(
        &from_dir,
        f.as_c_str(),
        &to_dir,
        t.as_c_str(),
        rustix::fs::RenameFlags::NOREPLACE,
    ) {
        Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS) => {
            if stat_at(&to_dir, to)?.is_some() {
                return Err(io::ErrorKind::AlreadyExists.into());
            }
            Ok(rustix::fs::renameat(
                from_dir,
                f.as_c_str(),
                to_dir,
                t.as_c_str(),
            )?)
        }
        other => Ok(other?),
    }
}

/// Removes the empty directory `name` from `dir`.
pub fn rmdir_at(dir: impl AsFd, name: &[u8]) -> io::Result<()> {
    let c = cstring(name)?;
    Ok(rustix::fs::unlinkat(dir, c.as_c_str(), AtFlags::REMOVEDIR)?)
}

/// Removes the file (not directory) `name` from `dir`.
pub fn unlink_at(dir: impl AsFd, name: &[u8]) -> io::Result<()> {
    let c = cstring(name)?;
    Ok(rustix::fs::unlinkat(dir, c.as_c_str(), AtFlags::empty())?)
}

/// Sets the modification time of `name` in `dir` (of the link itself for
/// a symlink), leaving the access time alone.
pub fn set_mtime_at(dir: impl AsFd, name: &[u8], sec: i64, nsec: u32) -> io::Result<()> {
    let c = cstring(name)?;
    Ok(rustix::fs::utimensat(
        dir,
        c.as_c_str(),
        &mtime_only(sec, nsec),
        AtFlags::SYMLINK_NOFOLLOW,
    )?)
}

/// Sets an open file's (or directory's) modification time, leaving the
/// access time alone.
pub fn set_mtime(fd: impl AsFd, sec: i64, nsec: u32) -> io::Result<()> {
    Ok(rustix::fs::futimens(fd, &mtime_only(sec, nsec))?)
}

/// Sets an open file's (or directory's) permission bits.
pub fn set_mode(fd: impl AsFd, mode: u32) -> io::Result<()> {
    Ok(rustix::fs::fchmod(fd, mode_bits(mode))?)
}

/// `fsync(2)`: for a directory, makes the renames inside it durable.
pub fn sync(fd: impl AsFd) -> io::Result<()> {
    Ok(rustix::fs::fsync(fd)?)
}

/// The names in `dir` (without `.` and `..`), unsorted. Reads through a
/// fresh open file description, so the listing position is our own.
pub fn read_dir(dir: impl AsFd) -> io::Result<Vec<Vec<u8>>> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(name.to_vec());
        }
    }
    Ok(names)
}

/// Opens a new file without a name in `dir` for writing (`O_TMPFILE`), to
/// be named by [`link_unnamed`] once complete. `Unsupported` where the
/// platform has no such files; other errors (e.g. a file system without
/// them) are the kernel's.
pub fn open_unnamed(dir: impl AsFd, mode: u32) -> io::Result<File> {
    platform::open_tmpfile(&dir, mode_bits(mode)).map(File::from)
}

/// Gives `file` (from [`open_unnamed`]) the name `name` in `dir`; fails
/// with `AlreadyExists` if the name is taken.
pub fn link_unnamed(file: impl AsFd, dir: impl AsFd, name: &[u8]) -> io::Result<()> {
    let c = cstring(name)?;
    platform::link_tmpfile(&file, &dir, &c)
}

/// The permission bits of `mode` in the platform's type.
pub(crate) fn mode_bits(mode: u32) -> Mode {
    Mode::from_bits_truncate(mode as _)
}

/// Times for `utimensat`/`futimens` that set the modification time only.
fn mtime_only(sec: i64, nsec: u32) -> Timestamps {
    Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_OMIT,
        },
        last_modification: Timespec {
            tv_sec: sec as _,
            tv_nsec: nsec as _,
        },
    }
}

// The stat field types differ by target (unsigned on Linux's raw ABI,
// narrower on the BSDs), so each is converted with `as`.
#[allow(clippy::unnecessary_cast)]
fn meta(st: &rustix::fs::Stat) -> Meta {
    let (kind, special) = match FileType::from_raw_mode(st.st_mode as _) {
        FileType::RegularFile => (Kind::File, ""),
        FileType::Directory => (Kind::Dir, ""),
        FileType::Symlink => (Kind::Symlink, ""),
        FileType::Fifo => (Kind::Other, "FIFO"),
        FileType::Socket => (Kind::Other, "socket"),
        FileType::CharacterDevice | FileType::BlockDevice => (Kind::Other, "device"),
        _ => (Kind::Other, "special file"),
    };
    Meta {
        kind,
        mode: st.st_mode as u32 & 0o7777,
        size: st.st_size as u64,
        mtime_s: st.st_mtime as i64,
        mtime_ns: st.st_mtime_nsec as u32,
        blocks: st.st_blocks as u64,
        dev: st.st_dev as u64,
        ino: st.st_ino as u64,
        nlink: st.st_nlink as u64,
        special,
    }
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_name_operations() {
        let root = tempfile::tempdir().unwrap();
        let dir = open_dir(root.path()).unwrap();
        mkdir_at(&dir, b"sub", 0o755).unwrap();
        assert_eq!(
            mkdir_at(&dir, b"sub", 0o755).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        symlink_at(&dir, b"sub", b"link").unwrap();
        assert_eq!(readlink_at(&dir, b"link").unwrap(), b"sub");
        assert_eq!(stat_at(&dir, b"link").unwrap().unwrap().kind, Kind::Symlink);
        assert!(stat_at(&dir, b"missing").unwrap().is_none());
        assert!(open_at(&dir, b"link", OFlags::RDONLY, 0).is_err());
        let f = open_at(
            &dir,
            b"tmp",
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
            0o640,
        )
        .unwrap();
        set_mtime(&f, 1_000_000, 5).unwrap();
        set_mode(&f, 0o604).unwrap();
        rename_at(&dir, b"tmp", b"final").unwrap();
        let m = stat_at(&dir, b"final").unwrap().unwrap();
        assert_eq!(
            (m.kind, m.mode, m.mtime_s, m.mtime_ns),
            (Kind::File, 0o604, 1_000_000, 5)
        );
        set_mtime_at(&dir, b"link", 7, 0).unwrap();
        assert_eq!(stat_at(&dir, b"link").unwrap().unwrap().mtime_s, 7);
        assert_eq!(stat(&dir).unwrap().kind, Kind::Dir);
        sync(&dir).unwrap();
        let mut names = read_dir(&dir).unwrap();
        names.sort();
        assert_eq!(names, [&b"final"[..], b"link", b"sub"]);
        unlink_at(&dir, b"final").unwrap();
        assert_eq!(
            unlink_at(&dir, b"final").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert_eq!(
            open_at(&dir, b"a\0b", OFlags::RDONLY, 0)
                .unwrap_err()
                .kind(),
            io::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn unnamed_files_get_a_name_once() {
        use std::io::Write;
        let root = tempfile::tempdir().unwrap();
        let dir = open_dir(root.path()).unwrap();
        // Only a file system or kernel without O_TMPFILE (EOPNOTSUPP,
        // EISDIR before 3.11) or the fallback platform may skip: any other
        // error means the call itself is wrong, and the sink would quietly
        // fall back to temporary names.
        let mut f = match open_unnamed(&dir, 0o600) {
            Ok(f) => f,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Unsupported | io::ErrorKind::IsADirectory
                ) =>
            {
                crate::skip_test(&format!("no unnamed files here ({e})"));
                return;
            }
            Err(e) => panic!("open_unnamed: {e}"),
        };
        f.write_all(b"x").unwrap();
        link_unnamed(&f, &dir, b"named").unwrap();
        assert_eq!(std::fs::read(root.path().join("named")).unwrap(), b"x");
        let again = open_unnamed(&dir, 0o600).unwrap();
        assert_eq!(
            link_unnamed(&again, &dir, b"named").unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
    }
}
