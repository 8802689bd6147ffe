//! File helpers for the copy engine: safe opens beneath an export root,
//! preallocation, direct I/O, access-pattern advice, in-kernel copies and
//! free space.

use std::io;
use std::os::fd::AsFd;

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

/// Gives the kernel access-pattern advice for `len` bytes at `offset`
/// (`len` 0 means "to the end"). Advice is optional: where the platform has
/// none this returns `Ok` and does nothing, so callers need not care.
pub fn fadvise(fd: impl AsFd, offset: u64, len: u64, advice: Advice) -> io::Result<()> {
    match platform::fadvise(&fd, offset, len, advice) {
        Err(e) if e.kind() == io::ErrorKind::Unsupported => Ok(()),
        other => other,
    }
}
