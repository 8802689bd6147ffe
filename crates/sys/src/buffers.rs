//! Socket buffer sizing: ask, then report what the kernel actually granted.
//!
//! On a long fat network the socket buffer bounds the window, so the size a
//! user asks for (`-w 64M`) is worthless unless we also say what the host
//! allowed. Linux silently caps `SO_SNDBUF`/`SO_RCVBUF` at
//! `net.core.wmem_max`/`rmem_max` and then *doubles* the value to leave room
//! for its own bookkeeping, reporting the doubled figure. [`BufferGrant`]
//! hides that quirk: `granted` is always in the caller's units (the kernel's
//! figure divided by two on Linux), so `granted < requested` means "capped"
//! on every platform. The raw kernel figure is kept in `kernel_bytes`.
//!
//! Setting a buffer explicitly turns off Linux receive/send autotuning for
//! that socket; callers that want autotuning simply do not call these.

use std::io;
use std::os::fd::AsFd;

use crate::platform;

/// The largest request the kernel accepts without overflowing its doubled
/// `int`; bigger requests are clamped to this and reported as capped.
const MAX_REQUEST: u64 = (i32::MAX / 2) as u64;

/// What a socket-buffer request turned into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferGrant {
    /// Bytes the caller asked for.
    pub requested: u64,
    /// Bytes the kernel granted, in the caller's units (Linux's doubled
    /// figure halved), read back after setting.
    pub granted: u64,
    /// The raw value `getsockopt` reported (twice `granted` on Linux).
    pub kernel_bytes: u64,
    /// The privileged `SO_*BUFFORCE` option took effect (so host caps were
    /// bypassed).
    pub forced: bool,
    /// The host limit (or the kernel's maximum) held the grant below the
    /// request.
    pub capped: bool,
}

/// Sets the send buffer (`SO_SNDBUF`) to `bytes` and reports the grant.
///
/// With `force`, tries `SO_SNDBUFFORCE` first, which ignores
/// `net.core.wmem_max` but needs `CAP_NET_ADMIN`; when refused it falls back
/// to the plain option and `forced` is false.
pub fn set_send_buffer(fd: impl AsFd, bytes: u64, force: bool) -> io::Result<BufferGrant> {
    set_buffer(&fd, true, bytes, force)
}

/// Sets the receive buffer (`SO_RCVBUF`) to `bytes` and reports the grant.
///
/// With `force`, tries `SO_RCVBUFFORCE` first (needs `CAP_NET_ADMIN`,
/// bypasses `net.core.rmem_max`) and falls back to the plain option.
pub fn set_recv_buffer(fd: impl AsFd, bytes: u64, force: bool) -> io::Result<BufferGrant> {
    set_buffer(&fd, false, bytes, force)
}

/// The current send buffer in the caller's units (see [`BufferGrant::granted`]).
pub fn get_send_buffer(fd: impl AsFd) -> io::Result<u64> {
    read_buffer(&fd, libc::SO_SNDBUF).map(|raw| raw / platform::BUFFER_SCALE)
}

/// The current receive buffer in the caller's units (see [`BufferGrant::granted`]).
pub fn get_recv_buffer(fd: impl AsFd) -> io::Result<u64> {
    read_buffer(&fd, libc::SO_RCVBUF).map(|raw| raw / platform::BUFFER_SCALE)
}

fn set_buffer(fd: &impl AsFd, send: bool, bytes: u64, force: bool) -> io::Result<BufferGrant> {
    let name = if send {
        libc::SO_SNDBUF
    } else {
        libc::SO_RCVBUF
    };
    let clamped = bytes.min(MAX_REQUEST);
    let value = clamped as libc::c_int;
    let forced = force && platform::set_buffer_force(fd, send, value).is_ok();
    if !forced {
        platform::setsockopt(fd, libc::SOL_SOCKET, name, value)?;
    }
    let kernel_bytes = read_buffer(fd, name)?;
    let granted = kernel_bytes / platform::BUFFER_SCALE;
    Ok(BufferGrant {
        requested: bytes,
        granted,
        kernel_bytes,
        forced,
        capped: granted < bytes,
    })
}

fn read_buffer(fd: &impl AsFd, name: libc::c_int) -> io::Result<u64> {
    let raw = platform::getsockopt_int(fd, libc::SOL_SOCKET, name)?;
    Ok(u64::try_from(raw).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::host_limits;
    use std::net::{TcpListener, TcpStream, UdpSocket};

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions and touches no memory.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn small_request_is_granted_in_callers_units() {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let g = set_send_buffer(&sock, 256 * 1024, false).unwrap();
        assert_eq!(g.requested, 256 * 1024);
        // Only assert the full grant when the host cap allows it.
        let cap = host_limits().wmem_max.ok().unwrap_or(u64::MAX);
        if cap >= 256 * 1024 {
            assert!(g.granted >= 256 * 1024, "{g:?}");
            assert!(!g.capped);
        }
        assert_eq!(g.kernel_bytes / crate::platform::BUFFER_SCALE, g.granted);
        assert_eq!(get_send_buffer(&sock).unwrap(), g.granted);
    }

    #[test]
    fn request_over_host_cap_is_capped_unless_forced() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let sock = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let huge = 1u64 << 40; // 1 TiB: over every cap, including the kernel's
        let g = set_recv_buffer(&sock, huge, false).unwrap();
        assert!(g.capped, "{g:?}");
        assert!(!g.forced);
        assert!(g.granted < huge);
        assert_eq!(get_recv_buffer(&sock).unwrap(), g.granted);
    }

    #[test]
    fn force_bypasses_host_cap_when_privileged() {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let Ok(cap) = host_limits().rmem_max else {
            eprintln!("skipped: rmem_max unreadable");
            return;
        };
        let want = (cap * 2).clamp(4 << 20, MAX_REQUEST);
        let g = set_recv_buffer(&sock, want, true).unwrap();
        if is_root() && cfg!(all(target_os = "linux", not(fatpipe_sys_fallback))) {
            assert!(g.forced, "{g:?}");
            assert!(g.granted >= want, "{g:?}");
            assert!(!g.capped);
        } else {
            // Unprivileged: the fallback to the plain option must still work.
            assert!(!g.forced, "{g:?}");
            assert!(g.granted > 0);
            assert_eq!(g.capped, g.granted < want);
        }
    }
}
