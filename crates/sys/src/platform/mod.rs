//! The platform choice, made once, plus the helpers every platform shares.
//!
//! `imp` is `linux.rs` on Linux and the portable `unix.rs` elsewhere (or on
//! Linux when built with `--cfg fatpipe_sys_fallback`). Both export the same
//! list of items; the public modules call them through `crate::platform::*`
//! and never look at `target_os` themselves, so adding a platform means
//! writing one file that provides:
//!
//! - `BUFFER_SCALE`, `set_buffer_force`: socket-buffer accounting and the
//!   privileged override;
//! - `set_congestion`, `get_congestion`, `set_max_pacing_rate`,
//!   `set_notsent_lowat`, `tcp_info_raw`: TCP controls and statistics;
//! - `sendfile`, `memfd`: stream fast paths;
//! - `enable_zerocopy`, `MSG_ZEROCOPY_FLAG`, `read_zerocopy_completion`,
//!   `recv_trunc`: `MSG_ZEROCOPY` and `MSG_TRUNC`;
//! - `send_batch`, `recv_batch`, `send_gso`, `set_gro`:
//!   UDP batching and offloads;
//! - `openat2_beneath`, `open_tmpfile`, `link_tmpfile`, `fallocate`,
//!   `punch_hole`, `O_DIRECT_FLAG`, `fadvise`: file helpers;
//! - `set_df_probe`, `route_mtu`, `enable_rx_timestamps`,
//!   `recv_timestamped`: the path probe's UDP calls;
//! - `ethtool_value`, `ethtool_rings`: NIC offloads and ring sizes;
//! - `enter_netns`, `open_tun`, `set_fifo_priority`, `set_timer_slack_ns`,
//!   `pidfd_open`: the lab's namespaces, devices and scheduling;
//! - `has_net_admin`: whether buffers may be forced without root.

use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};

#[cfg(all(target_os = "linux", not(fatpipe_sys_fallback)))]
#[path = "linux.rs"]
mod imp;

#[cfg(any(not(target_os = "linux"), fatpipe_sys_fallback))]
#[path = "unix.rs"]
mod imp;

pub(crate) use imp::*;

/// The raw descriptor behind any `AsFd`, for passing to libc.
pub(crate) fn raw(fd: &impl AsFd) -> RawFd {
    fd.as_fd().as_raw_fd()
}

/// Turns a libc `-1`-on-error return value into an `io::Result`.
pub(crate) fn cvt<T: Default + PartialOrd>(ret: T) -> io::Result<T> {
    if ret < T::default() {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Like [`cvt`], retrying while the call was interrupted by a signal.
pub(crate) fn cvt_retry<T: Default + PartialOrd>(mut f: impl FnMut() -> T) -> io::Result<T> {
    loop {
        match cvt(f()) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// An `Unsupported` error naming what is missing.
#[allow(dead_code)] // only the portable platform has things it cannot do
pub(crate) fn unsupported(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("{what} is not supported on this platform"),
    )
}

/// `setsockopt` with a plain-old-data value.
pub(crate) fn setsockopt<T: Copy>(
    fd: &impl AsFd,
    level: libc::c_int,
    name: libc::c_int,
    value: T,
) -> io::Result<()> {
    // SAFETY: `value` lives for the call and its exact size is passed, so the
    // kernel reads only initialised memory we own.
    let ret = unsafe {
        libc::setsockopt(
            raw(fd),
            level,
            name,
            (&value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    cvt(ret).map(drop)
}

/// `setsockopt` with a byte string value (e.g. a congestion-control name).
#[allow(dead_code)] // unused by the portable platform
pub(crate) fn setsockopt_bytes(
    fd: &impl AsFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &[u8],
) -> io::Result<()> {
    // SAFETY: the pointer and length describe the borrowed slice exactly.
    let ret = unsafe {
        libc::setsockopt(
            raw(fd),
            level,
            name,
            value.as_ptr().cast(),
            value.len() as libc::socklen_t,
        )
    };
    cvt(ret).map(drop)
}

/// `getsockopt` of a C `int`.
pub(crate) fn getsockopt_int(
    fd: &impl AsFd,
    level: libc::c_int,
    name: libc::c_int,
) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are valid for writes and `len` tells the
    // kernel how much room `value` has.
    let ret = unsafe {
        libc::getsockopt(
            raw(fd),
            level,
            name,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    cvt(ret)?;
    Ok(value)
}

/// `getsockopt` into a byte buffer; returns how many bytes the kernel wrote.
#[allow(dead_code)] // unused by the portable platform
pub(crate) fn getsockopt_bytes(
    fd: &impl AsFd,
    level: libc::c_int,
    name: libc::c_int,
    buf: &mut [u8],
) -> io::Result<usize> {
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: the pointer and `len` describe `buf`, which is valid for writes.
    let ret = unsafe { libc::getsockopt(raw(fd), level, name, buf.as_mut_ptr().cast(), &mut len) };
    cvt(ret)?;
    Ok((len as usize).min(buf.len()))
}

/// One `recv` into `buf`, retrying on `EINTR`.
pub(crate) fn recv(fd: &impl AsFd, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: the pointer and length describe `buf`, valid for writes.
    cvt_retry(|| unsafe { libc::recv(raw(fd), buf.as_mut_ptr().cast(), buf.len(), flags) })
        .map(|n| n as usize)
}

/// One `send` from `buf`, retrying on `EINTR`.
pub(crate) fn send(fd: &impl AsFd, buf: &[u8], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: the pointer and length describe `buf`, valid for reads.
    cvt_retry(|| unsafe { libc::send(raw(fd), buf.as_ptr().cast(), buf.len(), flags) })
        .map(|n| n as usize)
}

/// One `pread` at `offset`, retrying on `EINTR`.
pub(crate) fn pread(fd: &impl AsFd, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let offset = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
    // SAFETY: the pointer and length describe `buf`, valid for writes.
    cvt_retry(|| unsafe { libc::pread(raw(fd), buf.as_mut_ptr().cast(), buf.len(), offset) })
        .map(|n| n as usize)
}

/// One `pwrite` at `offset`, retrying on `EINTR`.
pub(crate) fn pwrite(fd: &impl AsFd, buf: &[u8], offset: u64) -> io::Result<usize> {
    let offset = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
    // SAFETY: the pointer and length describe `buf`, valid for reads.
    cvt_retry(|| unsafe { libc::pwrite(raw(fd), buf.as_ptr().cast(), buf.len(), offset) })
        .map(|n| n as usize)
}

/// One `write`, retrying on `EINTR`.
pub(crate) fn write(fd: &impl AsFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: the pointer and length describe `buf`, valid for reads.
    cvt_retry(|| unsafe { libc::write(raw(fd), buf.as_ptr().cast(), buf.len()) })
        .map(|n| n as usize)
}

/// Whether an error means "this fast path is not available here", as
/// opposed to a real I/O failure the caller must see.
pub(crate) fn is_refusal(err: &io::Error) -> bool {
    if err.kind() == io::ErrorKind::Unsupported {
        return true;
    }
    matches!(
        err.raw_os_error(),
        Some(libc::EINVAL)
            | Some(libc::ENOSYS)
            | Some(libc::EOPNOTSUPP)
            | Some(libc::ENOPROTOOPT)
            | Some(libc::EPERM)
            | Some(libc::EXDEV)
            | Some(libc::ESPIPE)
    )
}

/// Waits up to `timeout_ms` for `events` (or an error condition) on `fd`;
/// returns the `revents` seen, 0 on timeout.
pub(crate) fn poll_fd(
    fd: &impl AsFd,
    events: libc::c_short,
    timeout_ms: i32,
) -> io::Result<libc::c_short> {
    let mut p = libc::pollfd {
        fd: raw(fd),
        events,
        revents: 0,
    };
    // SAFETY: `p` is one valid pollfd, exclusively borrowed for the call.
    let n = cvt_retry(|| unsafe { libc::poll(&mut p, 1, timeout_ms) })?;
    Ok(if n == 0 { 0 } else { p.revents })
}
