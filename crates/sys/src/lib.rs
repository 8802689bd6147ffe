//! fatpipe-sys: the one place where fatpipe talks to the kernel.
//!
//! Everything above this crate (engine, transfer, lab, tune, the binary) is
//! plain safe Rust over blocking sockets and files and forbids `unsafe`;
//! everything that needs `libc`, an `unsafe` block or a platform `#[cfg]`
//! lives here. Where rustix already wraps a call safely, it is used instead
//! of hand-written `libc`. The crate is shaped by three rules:
//!
//! 1. **Every fast path says which path it took.** Zero-copy calls return a
//!    [`Transfer`] carrying an [`IoPath`], so the engine can print
//!    "sendfile" or "copy (kernel refused MSG_ZEROCOPY)" instead of guessing.
//! 2. **Fallbacks are clean.** When the kernel refuses a fast path (old
//!    kernel, wrong file type, missing capability) the call falls back to
//!    the plain path and reports it; it only fails when the plain path fails.
//! 3. **One platform module, chosen in one place.** `platform/mod.rs` picks
//!    `platform/linux.rs` or the portable `platform/unix.rs`; the public
//!    modules hold types, fallback logic and tests, and never `#[cfg]` on
//!    the OS themselves.
//!
//! Functions take `impl AsFd` (so `&TcpStream`, `&File`, `BorrowedFd` all
//! work) and return `io::Result`; an operation a platform cannot do at all
//! fails with [`std::io::ErrorKind::Unsupported`].
//!
//! # What each platform must provide
//!
//! | capability | Linux | other unix (fallback) |
//! |---|---|---|
//! | `SO_SNDBUF`/`SO_RCVBUF` | yes; kernel doubles the value, reported halved | yes, as reported |
//! | `SO_SNDBUFFORCE`/`SO_RCVBUFFORCE` | yes (CAP_NET_ADMIN) | plain option only |
//! | `TCP_NODELAY`, `TCP_MAXSEG` | yes | yes |
//! | `TCP_CONGESTION` | yes | `Unsupported` |
//! | `SO_MAX_PACING_RATE` | yes | `Unsupported` |
//! | `TCP_INFO` | yes, length-checked | `Unsupported` |
//! | `sendfile` | yes | `pread` + `write` copy |
//! | `MSG_ZEROCOPY` | yes (`SO_ZEROCOPY`, error-queue completions) | plain `send` |
//! | `MSG_TRUNC` discard on TCP | yes (verified on first use) | scratch-buffer read |
//! | `memfd_create` | yes | unlinked temporary file |
//! | `sendmmsg`/`recvmmsg` | yes | one `send`/`recv` per datagram |
//! | UDP GSO/GRO | yes (`UDP_SEGMENT`, `UDP_GRO`) | per-segment sends, no GRO |
//! | path probe: DF probing, route MTU, `SO_TIMESTAMPNS` | yes | `Unsupported`; receive without a timestamp |
//! | NIC offloads and rings (`SIOCETHTOOL`) | yes | `Unsupported` |
//! | `openat2(RESOLVE_BENEATH)` | yes, walk on `ENOSYS` | component walk with `O_NOFOLLOW` |
//! | `openat`/`statat`/`mkdirat`/`renameat`/... on one name (`dir`) | yes | yes |
//! | `O_TMPFILE` and naming it through `/proc/self/fd` | yes | `Unsupported` (caller uses a temporary name) |
//! | `fallocate`, `posix_fadvise`, hole punching | yes | size-only / no-op / `Unsupported` |
//! | `fgetxattr`/`fsetxattr` (user.* extended attributes) | yes (rustix) | yes where the file system keeps them, else `Unsupported` |
//! | `O_DIRECT` (`open_direct`) | yes, buffered on `EINVAL` | buffered |
//! | `SEEK_DATA`, `flock`, `fsync` | yes | yes (where the system has `SEEK_DATA`) |
//! | free space and mount of a directory (`fs_space`: `fstatvfs`, mountinfo) | yes | yes, without the mount where there is no `/proc/self/mountinfo` |
//! | keepalive timers, `SO_RCVLOWAT` | yes | yes |
//! | `TCP_NOTSENT_LOWAT` | yes | `Unsupported` |
//! | euid, `RLIMIT_NOFILE`, `kill`, nanosecond `ppoll` | yes | yes |
//! | `CAP_NET_ADMIN` in the effective set (`capget`) | yes | `false` (root only) |
//! | SIGTERM/SIGINT to a thread (`on_termination`, signal-hook) | yes | yes |
//! | pidfd wait, `SCHED_FIFO`, timer slack | yes | `Unsupported` / `Unsupported` / no-op |
//! | TUN devices, `setns` (the lab) | yes | `Unsupported` |
//! | `getrusage`, monotonic clock | yes | yes |
//!
//! Building with `RUSTFLAGS="--cfg fatpipe_sys_fallback"` selects the
//! fallback platform on Linux too, so its paths compile and its tests run
//! on a Linux machine.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

mod platform;

pub mod buffers;
pub mod cpu;
pub mod dir;
pub mod discard;
pub mod ethtool;
pub mod files;
pub mod netns;
pub mod poll;
pub mod probe;
pub mod process;
pub mod send;
pub mod tcp;
pub mod tun;
pub mod udp;
pub mod zerocopy;

pub use buffers::{
    get_recv_buffer, get_send_buffer, set_recv_buffer, set_send_buffer, BufferGrant, WindowHold,
};
pub use cpu::{CpuSample, CpuUsage};
pub use discard::Discarder;
pub use files::{
    fadvise, is_escape, lock_exclusive, next_data, open_beneath, open_direct, preallocate,
    punch_hole, Advice, Preallocation,
};
/// `open(2)` flags, as [`open_beneath`] and [`dir::open_at`] take them.
pub use rustix::fs::OFlags;
pub use send::{pattern_byte, pattern_memfd, sendfile, sendfile_all, PATTERN_PERIOD};
pub use tcp::{
    get_congestion, get_mss, set_congestion, set_keepalive, set_max_pacing_rate, set_mss,
    set_nodelay, set_notsent_lowat, set_recv_lowat, tcp_info, TcpInfo,
};
pub use udp::{
    gso_supported, send_gso, set_gro, Batch, RecvBatch, SendBatch, UDP_MAX_GSO_SEGMENTS,
};
pub use zerocopy::{ZeroCopySender, ZeroCopyStats};

/// Which kernel path actually moved the bytes of an I/O call.
///
/// Reported by every fast-path function so the engine and the CLI can say
/// what happened rather than what was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IoPath {
    /// Plain `read`/`write`/`send`/`recv` through a user-space buffer.
    Copy,
    /// `sendfile(2)`: page-cache pages handed to the socket without a user copy.
    Sendfile,
    /// `send(MSG_ZEROCOPY)`: user pages pinned and sent, completions reaped
    /// from the error queue.
    MsgZerocopy,
    /// `recv(MSG_TRUNC)` on TCP: the kernel drops the data without copying.
    RecvTrunc,
    /// `sendmmsg`/`recvmmsg`: many datagrams per system call.
    Mmsg,
    /// UDP generic segmentation offload (`UDP_SEGMENT`) on send, or generic
    /// receive offload (`UDP_GRO`) coalescing on receive.
    Gso,
}

impl IoPath {
    /// A short lower-case name for tables and JSON (`"sendfile"`, `"copy"`, …).
    pub fn name(self) -> &'static str {
        match self {
            IoPath::Copy => "copy",
            IoPath::Sendfile => "sendfile",
            IoPath::MsgZerocopy => "msg_zerocopy",
            IoPath::RecvTrunc => "recv_trunc",
            IoPath::Mmsg => "mmsg",
            IoPath::Gso => "gso",
        }
    }
}

impl std::fmt::Display for IoPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The outcome of one fast-path I/O call: how much moved and by which path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    /// Bytes moved (or, for batch calls, see the call's documentation).
    pub bytes: usize,
    /// The path the kernel actually used.
    pub path: IoPath,
}

impl Transfer {
    pub(crate) fn new(bytes: usize, path: IoPath) -> Self {
        Transfer { bytes, path }
    }
}

/// For tests: a test that cannot run on this host says why and returns;
/// in CI (CI=true), whose host has everything, it fails instead.
#[cfg(test)]
pub(crate) fn skip_test(why: &str) {
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("cannot run here, and CI must: {why}");
    }
    eprintln!("skipping: {why}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_path_names_are_distinct() {
        let all = [
            IoPath::Copy,
            IoPath::Sendfile,
            IoPath::MsgZerocopy,
            IoPath::RecvTrunc,
            IoPath::Mmsg,
            IoPath::Gso,
        ];
        let names: std::collections::HashSet<_> = all.iter().map(|p| p.name()).collect();
        assert_eq!(names.len(), all.len());
        assert_eq!(IoPath::Sendfile.to_string(), "sendfile");
    }
}
