//! File helpers for the copy engine: opens that cannot escape an export
//! root, preallocation and access-pattern advice.
//!
//! The safety-critical piece is [`open_beneath`]. A server exporting
//! `/srv/data` must never open `/srv/data/../../etc/passwd` or follow a
//! symlink inside the export that points outside it, and checking a path
//! string first and opening it later is racy (the tree can change between
//! the two). Linux's `openat2(RESOLVE_BENEATH)` resolves the whole path in
//! the kernel and fails with `EXDEV` if resolution would leave the
//! directory. Where `openat2` is missing (Linux < 5.6, other systems,
//! seccomp filters that answer `ENOSYS`) we walk the path one component at a
//! time with `openat(O_NOFOLLOW)`, which refuses every symlink — stricter
//! than the kernel (a link that stays inside is also refused) but never
//! weaker. Both paths refuse absolute paths and every `..` component up
//! front, so callers see the same answer on every kernel; [`is_escape`]
//! recognises the errors.

use std::ffi::{CString, OsStr};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path};

use rustix::fs::{AtFlags, FileType, FlockOperation, Mode, OFlags};

use crate::dir::mode_bits;
use crate::platform;

/// Access-pattern advice for [`fadvise`] (`posix_fadvise`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advice {
    /// No special treatment.
    Normal,
    /// Read front to back: the kernel reads ahead aggressively.
    Sequential,
    /// Random access: read-ahead off.
    Random,
    /// Start reading this range into the page cache now.
    WillNeed,
    /// Drop this range from the page cache (after writing it back).
    DontNeed,
    /// Data will be touched once.
    NoReuse,
}

/// What [`preallocate`] achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preallocation {
    /// Blocks are reserved (`fallocate`): later writes cannot hit `ENOSPC`.
    Reserved,
    /// The file system cannot reserve; the file was only extended (sparse)
    /// to the size, so a full disk shows up during writes instead.
    SizeOnly,
}

/// Opens `path` relative to the directory `dirfd`, refusing to resolve
/// outside it: absolute paths, any `..` component, and symlinks that lead
/// out (magic links like `/proc/self/fd/*` too) fail with an error for
/// which [`is_escape`] is true. `flags` are `open(2)` flags (`O_CLOEXEC` is
/// always added); `mode` is used with `O_CREAT`.
pub fn open_beneath(
    dirfd: impl AsFd,
    path: impl AsRef<Path>,
    flags: OFlags,
    mode: u32,
) -> io::Result<File> {
    let path = path.as_ref();
    let parts = checked_components(path)?;
    let cpath = cstring(path.as_os_str())?;
    let mode = mode_bits(mode);
    match platform::openat2_beneath(&dirfd, &cpath, flags, mode) {
        Ok(fd) => Ok(File::from(fd)),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EPERM)) => {
            walk_beneath(dirfd.as_fd(), &parts, flags, mode).map(File::from)
        }
        Err(e) => Err(e),
    }
}

/// Whether an error from [`open_beneath`] means
/// "the path tried to leave the directory" (`EXDEV`) or "went through a
/// refused symlink" (`ELOOP`).
pub fn is_escape(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::EXDEV) | Some(libc::ELOOP))
}

/// Makes `file` `len` bytes long with its blocks reserved (`fallocate`),
/// so a full disk is found now rather than mid-transfer. Where the file
/// system cannot reserve, extends the size only and says so. A real
/// `ENOSPC` is returned as an error.
pub fn preallocate(file: impl AsFd, len: u64) -> io::Result<Preallocation> {
    if len == 0 {
        return Ok(Preallocation::Reserved);
    }
    match platform::fallocate(&file, 0, len, false) {
        Ok(()) => Ok(Preallocation::Reserved),
        Err(e) if platform::is_refusal(&e) => {
            let size = crate::dir::stat(&file)?.size;
            if i64::try_from(len).is_err() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "length too large",
                ));
            }
            if size < len {
                retry(|| rustix::fs::ftruncate(&file, len))?;
            }
            Ok(Preallocation::SizeOnly)
        }
        Err(e) => Err(e),
    }
}

/// The file system a directory lives on, as a full disk is reported: its
/// mount point and type and the bytes an unprivileged writer can still use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsSpace {
    /// Bytes available to an unprivileged writer (`f_bavail`).
    pub free: u64,
    /// Size of the file system in bytes.
    pub size: u64,
    /// Where it is mounted and its type (`tmpfs`, `xfs`, ...), from
    /// `/proc/self/mountinfo`; `None` where that cannot be read.
    pub mount: Option<(std::path::PathBuf, String)>,
}

/// The space left on the file system holding `dir` and where it is
/// mounted (`fstatvfs`, then the longest mount point above the directory's
/// path in `/proc/self/mountinfo`).
pub fn fs_space(dir: impl AsFd) -> io::Result<FsSpace> {
    let st = retry(|| rustix::fs::fstatvfs(&dir))?;
    let mount = std::fs::read_link(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&dir.as_fd())
    ))
    .ok()
    .and_then(|path| {
        let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        mount_of(&info, &path)
    });
    Ok(FsSpace {
        free: st.f_bavail.saturating_mul(st.f_frsize),
        size: st.f_blocks.saturating_mul(st.f_frsize),
        mount,
    })
}

/// The mount point and file system type that hold `path`, from the text of
/// `/proc/self/mountinfo`: the longest mount point above it (the last one
/// listed wins among equals, as the later mount hides the earlier).
pub fn mount_of(mountinfo: &str, path: &Path) -> Option<(std::path::PathBuf, String)> {
    let mut best: Option<(std::path::PathBuf, String)> = None;
    for line in mountinfo.lines() {
        let mut f = line.split(' ');
        let Some(point) = f.nth(4) else { continue };
        let Some(fstype) = f.skip_while(|x| *x != "-").nth(1) else {
            continue;
        };
        let point = std::path::PathBuf::from(unescape_mount(point));
        let longer = best
            .as_ref()
            .is_none_or(|(b, _)| point.components().count() >= b.components().count());
        if path.starts_with(&point) && longer {
            best = Some((point, fstype.to_string()));
        }
    }
    best
}

/// Mount points in mountinfo escape space, tab, newline and backslash as
/// three octal digits (`\040`).
fn unescape_mount(s: &str) -> std::ffi::OsString {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match oct {
            Some(d) if b[i] == b'\\' => {
                let v = d.iter().fold(0u32, |a, c| a * 8 + u32::from(c - b'0'));
                out.push(v as u8);
                i += 4;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    OsStr::from_bytes(&out).to_os_string()
}

/// Gives the kernel access-pattern advice for `len` bytes at `offset`
/// (`len` 0 means "to the end"). Advice is optional: where the platform has
/// none this returns `Ok` and does nothing, so callers need not care.
pub fn fadvise(fd: impl AsFd, offset: u64, len: u64, advice: Advice) -> io::Result<()> {
    match platform::fadvise(&fd, offset, len, advice) {
        Err(e) if e.kind() == io::ErrorKind::Unsupported => Ok(()),
        other => other,
    }
}

/// Makes `[offset, offset + len)` of `file` read as zeros and frees its
/// blocks, leaving the size alone (`FALLOC_FL_PUNCH_HOLE`). `Unsupported`
/// where the platform cannot; the kernel's error where the file system
/// cannot. The caller decides whether writing zeros instead will do.
pub fn punch_hole(file: impl AsFd, offset: u64, len: u64) -> io::Result<()> {
    platform::punch_hole(&file, offset, len)
}

/// The offset of the next byte of data at or after `offset`, or `None` if
/// the rest of the file is a hole (`lseek(SEEK_DATA)`).
pub fn next_data(file: impl AsFd, offset: u64) -> io::Result<Option<u64>> {
    match rustix::fs::seek(&file, rustix::fs::SeekFrom::Data(offset)) {
        Ok(at) => Ok(Some(at)),
        Err(rustix::io::Errno::NXIO) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The value of extended attribute `name` of an open file (`fgetxattr`),
/// at most `max` bytes; `None` when the file has no such attribute.
/// `Unsupported` where the file system keeps no extended attributes (the
/// caller keeps the value elsewhere).
pub fn get_xattr(file: impl AsFd, name: &str, max: usize) -> io::Result<Option<Vec<u8>>> {
    let mut buf = vec![0u8; max];
    match retry(|| rustix::fs::fgetxattr(&file, name, &mut buf[..])) {
        Ok(n) => {
            buf.truncate(n);
            Ok(Some(buf))
        }
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NODATA.raw_os_error()) => Ok(None),
        Err(e) if is_unsupported(&e) => Err(io::Error::new(io::ErrorKind::Unsupported, e)),
        Err(e) => Err(e),
    }
}

/// Sets extended attribute `name` of an open file to `value`
/// (`fsetxattr`, created or replaced). `Unsupported` where the file
/// system keeps none.
pub fn set_xattr(file: impl AsFd, name: &str, value: &[u8]) -> io::Result<()> {
    match retry(|| rustix::fs::fsetxattr(&file, name, value, rustix::fs::XattrFlags::empty())) {
        Err(e) if is_unsupported(&e) => Err(io::Error::new(io::ErrorKind::Unsupported, e)),
        other => other,
    }
}

/// `ENOTSUP`/`EOPNOTSUPP`: the file system has no (user) extended
/// attributes.
fn is_unsupported(e: &io::Error) -> bool {
    e.raw_os_error() == Some(rustix::io::Errno::NOTSUP.raw_os_error())
        || e.raw_os_error() == Some(rustix::io::Errno::OPNOTSUPP.raw_os_error())
}

/// Takes an exclusive advisory lock on the whole file (`flock`), released
/// when its last descriptor closes. With `wait` false a lock held
/// elsewhere fails at once with `WouldBlock`.
pub fn lock_exclusive(file: impl AsFd, wait: bool) -> io::Result<()> {
    let op = if wait {
        FlockOperation::LockExclusive
    } else {
        FlockOperation::NonBlockingLockExclusive
    };
    Ok(rustix::fs::flock(file, op)?)
}

/// Opens `path` with `options` plus `O_DIRECT` (bypassing the page cache);
/// where the platform or the file system refuses direct I/O (tmpfs, some
/// FUSE and network file systems answer `EINVAL`) it opens with `options`
/// alone. The flag says which it got.
pub fn open_direct(options: &OpenOptions, path: &Path) -> io::Result<(File, bool)> {
    if platform::O_DIRECT_FLAG != 0 {
        let mut direct = options.clone();
        direct.custom_flags(platform::O_DIRECT_FLAG);
        match direct.open(path) {
            Ok(f) => return Ok((f, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(e),
        }
    }
    options.open(path).map(|f| (f, false))
}

/// Splits `path` into normal components, refusing empty and absolute
/// paths and `..`.
fn checked_components(path: &Path) -> io::Result<Vec<&OsStr>> {
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => parts.push(p),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return Err(escape()),
            Component::ParentDir => return Err(escape()),
        }
    }
    if parts.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty path"));
    }
    Ok(parts)
}

/// The component-by-component fallback: every step `O_NOFOLLOW`.
fn walk_beneath(
    dirfd: BorrowedFd<'_>,
    parts: &[&OsStr],
    flags: OFlags,
    mode: Mode,
) -> io::Result<OwnedFd> {
    let Some((last, dirs)) = parts.split_last() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty path"));
    };
    let mut held: Option<OwnedFd> = None;
    for d in dirs {
        let at = held.as_ref().map_or(dirfd, |f| f.as_fd());
        let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW;
        let fd = match openat(at, d, dir_flags, Mode::empty()) {
            Ok(fd) => fd,
            // O_DIRECTORY|O_NOFOLLOW on a symlink says ENOTDIR; report it as
            // the refused symlink it is, as openat2 would.
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) && is_symlink(at, d) => {
                return Err(io::Error::from_raw_os_error(libc::ELOOP))
            }
            Err(e) => return Err(e),
        };
        held = Some(fd);
    }
    let at = held.as_ref().map_or(dirfd, |f| f.as_fd());
    match openat(at, last, flags | OFlags::NOFOLLOW, mode) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) && is_symlink(at, last) => {
            Err(io::Error::from_raw_os_error(libc::ELOOP))
        }
        other => other,
    }
}

fn openat(at: BorrowedFd<'_>, name: &OsStr, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
    let c = cstring(name)?;
    retry(|| rustix::fs::openat(at, c.as_c_str(), flags | OFlags::CLOEXEC, mode))
}

fn is_symlink(at: BorrowedFd<'_>, name: &OsStr) -> bool {
    let Ok(c) = cstring(name) else {
        return false;
    };
    rustix::fs::statat(at, c.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|st| FileType::from_raw_mode(st.st_mode as _) == FileType::Symlink)
}

/// Runs a rustix call again while it is interrupted by a signal.
fn retry<T>(mut f: impl FnMut() -> rustix::io::Result<T>) -> io::Result<T> {
    loop {
        match f() {
            Err(rustix::io::Errno::INTR) => continue,
            other => return Ok(other?),
        }
    }
}

fn cstring(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// The error `openat2(RESOLVE_BENEATH)` gives for an escape, so both paths
/// and every refusal look the same to callers.
fn escape() -> io::Error {
    io::Error::from_raw_os_error(libc::EXDEV)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_of_picks_the_longest_mount_above_a_path() {
        let info = "22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
                    30 22 0:30 / /tmp rw shared:2 - tmpfs tmpfs rw\n\
                    31 30 0:31 / /tmp/x\\040y rw - tmpfs fatpipe-full rw,size=6144k\n\
                    32 22 0:32 / /tmpfoo rw - xfs /dev/sdb rw\n";
        let at = |p: &str| mount_of(info, Path::new(p)).map(|(m, t)| (m.display().to_string(), t));
        assert_eq!(
            at("/tmp/x y/export/t"),
            Some(("/tmp/x y".into(), "tmpfs".into()))
        );
        assert_eq!(at("/tmp/other"), Some(("/tmp".into(), "tmpfs".into())));
        assert_eq!(at("/tmpfoo/a"), Some(("/tmpfoo".into(), "xfs".into())));
        assert_eq!(at("/home"), Some(("/".into(), "ext4".into())));
        assert_eq!(mount_of("garbage\n1 2 3\n", Path::new("/")), None);
    }

    #[test]
    fn fs_space_of_a_real_directory() {
        let dir = File::open(std::env::temp_dir()).unwrap();
        let s = fs_space(&dir).unwrap();
        assert!(s.size > 0 && s.free <= s.size, "{s:?}");
        if Path::new("/proc/self/mountinfo").exists() {
            assert!(s.mount.is_some(), "{s:?}");
        }
    }
    use std::io::Read;
    use std::os::unix::fs::symlink;

    fn linux() -> bool {
        cfg!(all(target_os = "linux", not(fatpipe_sys_fallback)))
    }

    /// root/ (the export) with root/sub/f, root/in -> sub/f, root/out ->
    /// ../secret, root/abs -> /etc/passwd; and secret beside root.
    fn tree() -> (tempfile::TempDir, File) {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/f"), b"inside").unwrap();
        std::fs::write(t.path().join("secret"), b"secret").unwrap();
        symlink("sub/f", root.join("in")).unwrap();
        symlink("../secret", root.join("out")).unwrap();
        symlink("/etc/passwd", root.join("abs")).unwrap();
        symlink("..", root.join("sub/up")).unwrap();
        let dir = File::open(&root).unwrap();
        (t, dir)
    }

    fn read(mut f: File) -> String {
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        s
    }

    #[test]
    fn opens_inside_and_refuses_escapes() {
        let (_t, dir) = tree();
        assert_eq!(
            read(open_beneath(&dir, "sub/f", OFlags::RDONLY, 0).unwrap()),
            "inside"
        );
        assert_eq!(
            read(open_beneath(&dir, "./sub/./f", OFlags::RDONLY, 0).unwrap()),
            "inside"
        );
        for bad in [
            "../secret",
            "sub/../../secret",
            "/etc/passwd",
            "out",
            "abs",
            "sub/up/../secret",
        ] {
            let e = open_beneath(&dir, bad, OFlags::RDONLY, 0).unwrap_err();
            assert!(is_escape(&e), "{bad}: {e}");
        }
        // sub/up -> .. resolves to root itself: inside, but a symlink.
        let e = open_beneath(&dir, "sub/up/sub/f", OFlags::RDONLY, 0);
        // openat2 (Linux 5.6+) follows links that stay inside; the
        // fallback walk refuses every link.
        let openat2 = platform::openat2_beneath(&dir, c".", OFlags::RDONLY, Mode::empty()).is_ok();
        if openat2 {
            assert_eq!(read(e.unwrap()), "inside");
        } else {
            assert!(is_escape(&e.unwrap_err()));
        }
        assert_eq!(
            open_beneath(&dir, "", OFlags::RDONLY, 0)
                .unwrap_err()
                .kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            open_beneath(&dir, "nope", OFlags::RDONLY, 0)
                .unwrap_err()
                .kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn fallback_walk_refuses_every_symlink() {
        let (_t, dir) = tree();
        let parts = |p: &'static str| -> Vec<&'static OsStr> { Path::new(p).iter().collect() };
        let f = walk_beneath(dir.as_fd(), &parts("sub/f"), OFlags::RDONLY, Mode::empty()).unwrap();
        assert_eq!(read(File::from(f)), "inside");
        for link in ["in", "out", "abs", "sub/up/sub/f"] {
            let e =
                walk_beneath(dir.as_fd(), &parts(link), OFlags::RDONLY, Mode::empty()).unwrap_err();
            assert!(
                is_escape(&e) || e.raw_os_error() == Some(libc::ENOTDIR),
                "{link}: {e}"
            );
        }
    }

    #[test]
    fn preallocate_and_fadvise() {
        let t = tempfile::tempdir().unwrap();
        let dir = File::open(t.path()).unwrap();
        let f = open_beneath(&dir, "big", OFlags::RDWR | OFlags::CREATE, 0o600).unwrap();
        let p = preallocate(&f, 10 << 20).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 10 << 20);
        if !linux() {
            assert_eq!(p, Preallocation::SizeOnly);
        }
        fadvise(&f, 0, 0, Advice::Sequential).unwrap();
        fadvise(&f, 0, 4096, Advice::DontNeed).unwrap();
    }
}
