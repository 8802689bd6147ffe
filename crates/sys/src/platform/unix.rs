//! The portable fallback platform: POSIX calls only.
//!
//! Everything Linux-specific answers `Unsupported` here, and the public
//! modules turn that into their plain path (a copy loop, a per-datagram
//! send, a refused option reported as such). It is also built on Linux with
//! `--cfg fatpipe_sys_fallback`, which is how its paths are tested.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{Mode, OFlags};

use super::unsupported;
use crate::files::Advice;
use crate::IoPath;

/// Portable systems report socket buffers as set.
pub(crate) const BUFFER_SCALE: u64 = 1;

/// No zero-copy send flag: sends through the fallback are plain sends.
pub(crate) const MSG_ZEROCOPY_FLAG: libc::c_int = 0;

/// No `O_DIRECT`: files are opened buffered.
pub(crate) const O_DIRECT_FLAG: libc::c_int = 0;

/// Forced socket buffers are Linux-only.
pub(crate) fn set_buffer_force(_: &impl AsFd, _: bool, _: libc::c_int) -> io::Result<()> {
    Err(unsupported("SO_SNDBUFFORCE/SO_RCVBUFFORCE"))
}

/// `TCP_WINDOW_CLAMP` is Linux-only: the receive buffer alone bounds the window.
pub(crate) fn set_window_clamp(_: &impl AsFd, _: libc::c_int) -> io::Result<()> {
    Err(unsupported("TCP_WINDOW_CLAMP"))
}

/// `TCP_WINDOW_CLAMP` is Linux-only.
#[cfg(test)]
pub(crate) fn get_window_clamp(_: &impl AsFd) -> io::Result<libc::c_int> {
    Err(unsupported("TCP_WINDOW_CLAMP"))
}

/// Congestion control by name is not portable.
pub(crate) fn set_congestion(_: &impl AsFd, _: &str) -> io::Result<()> {
    Err(unsupported("TCP_CONGESTION"))
}

/// Congestion control by name is not portable.
pub(crate) fn get_congestion(_: &impl AsFd) -> io::Result<String> {
    Err(unsupported("TCP_CONGESTION"))
}

/// Socket pacing is Linux-only.
pub(crate) fn set_max_pacing_rate(_: &impl AsFd, _: u64) -> io::Result<()> {
    Err(unsupported("SO_MAX_PACING_RATE"))
}

/// `TCP_NOTSENT_LOWAT` is not portable.
pub(crate) fn set_notsent_lowat(_: &impl AsFd, _: libc::c_int) -> io::Result<()> {
    Err(unsupported("TCP_NOTSENT_LOWAT"))
}

/// The Linux `tcp_info` layout is Linux-only.
pub(crate) fn tcp_info_raw(_: &impl AsFd, _: &mut [u8]) -> io::Result<usize> {
    Err(unsupported("TCP_INFO"))
}

/// `sendfile` signatures differ across BSDs; the caller copies instead.
pub(crate) fn sendfile(_: &impl AsFd, _: &impl AsFd, _: &mut u64, _: usize) -> io::Result<usize> {
    Err(unsupported("sendfile"))
}

/// No `memfd_create`; the caller uses an unlinked temporary file.
pub(crate) fn memfd(_: &CStr) -> io::Result<OwnedFd> {
    Err(unsupported("memfd_create"))
}

/// `SO_ZEROCOPY` is Linux-only.
pub(crate) fn enable_zerocopy(_: &impl AsFd) -> io::Result<()> {
    Err(unsupported("SO_ZEROCOPY"))
}

/// A `MSG_ZEROCOPY` completion; never produced here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ZcCompletion {
    /// First send sequence number completed (inclusive).
    pub lo: u32,
    /// Last send sequence number completed (inclusive).
    pub hi: u32,
    /// The kernel copied the data after all.
    pub copied: bool,
}

/// No error-queue completions exist here.
pub(crate) fn read_zerocopy_completion(_: &impl AsFd) -> io::Result<Option<ZcCompletion>> {
    Ok(None)
}

/// `MSG_TRUNC` on TCP is a Linux extension.
pub(crate) fn recv_trunc(_: &impl AsFd, _: usize) -> io::Result<usize> {
    Err(unsupported("MSG_TRUNC on TCP"))
}

/// Nothing to keep between batch calls here.
#[derive(Default)]
pub(crate) struct MmsgScratch;

/// One `send` per datagram.
pub(crate) fn send_batch(
    fd: &impl AsFd,
    packets: &[&[u8]],
    _: &mut MmsgScratch,
) -> io::Result<(usize, IoPath)> {
    let mut sent = 0;
    for p in packets {
        match super::send(fd, p, 0) {
            Ok(_) => sent += 1,
            Err(e) if sent > 0 && e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    Ok((sent, IoPath::Copy))
}

/// One `recv` per call: a batch of one datagram.
#[allow(clippy::too_many_arguments)]
pub(crate) fn recv_batch(
    fd: &impl AsFd,
    storage: &mut [u8],
    slot: usize,
    _: &mut [u64],
    _: usize,
    lens: &mut [usize],
    segs: &mut [Option<usize>],
    _: &mut MmsgScratch,
) -> io::Result<(usize, IoPath)> {
    if lens.is_empty() {
        return Ok((0, IoPath::Copy));
    }
    let n = super::recv(fd, &mut storage[..slot], 0)?;
    lens[0] = n;
    segs[0] = None;
    Ok((1, IoPath::Copy))
}

/// No ancillary data is requested here.
pub(crate) fn gro_control_len() -> usize {
    8
}

/// UDP GSO is Linux-only.
pub(crate) fn send_gso(_: &impl AsFd, _: &[u8], _: u16) -> io::Result<usize> {
    Err(unsupported("UDP_SEGMENT"))
}

/// UDP GSO is Linux-only.
pub(crate) fn gso_supported(_: &impl AsFd) -> bool {
    false
}

/// UDP GRO is Linux-only.
pub(crate) fn set_gro(_: &impl AsFd, _: bool) -> io::Result<()> {
    Err(unsupported("UDP_GRO"))
}

/// UDP GRO is Linux-only.
#[cfg(test)]
pub(crate) fn gro_enabled(_: &impl AsFd) -> io::Result<bool> {
    Ok(false)
}

/// `openat2` is Linux-only; the caller walks components instead.
pub(crate) fn openat2_beneath(_: &impl AsFd, _: &CStr, _: OFlags, _: Mode) -> io::Result<OwnedFd> {
    Err(io::Error::from_raw_os_error(libc::ENOSYS))
}

/// Files without a name (`O_TMPFILE`) are Linux's; the caller writes
/// under a temporary name instead.
pub(crate) fn open_tmpfile(_: &impl AsFd, _: Mode) -> io::Result<OwnedFd> {
    Err(unsupported("O_TMPFILE"))
}

/// Never reached: [`open_tmpfile`] gives no file to name here.
pub(crate) fn link_tmpfile(_: &impl AsFd, _: &impl AsFd, _: &CStr) -> io::Result<()> {
    Err(unsupported("O_TMPFILE"))
}

/// Hole punching has no portable call; the caller writes zeros.
pub(crate) fn punch_hole(_: &impl AsFd, _: u64, _: u64) -> io::Result<()> {
    Err(unsupported("FALLOC_FL_PUNCH_HOLE"))
}

/// No portable `fallocate` that reserves blocks without writing them.
pub(crate) fn fallocate(_: &impl AsFd, _: u64, _: u64, _: bool) -> io::Result<()> {
    Err(unsupported("fallocate"))
}

/// Access-pattern advice is optional; ignoring it is correct.
pub(crate) fn fadvise(_: &impl AsFd, _: u64, _: u64, _: Advice) -> io::Result<()> {
    Err(unsupported("posix_fadvise"))
}

/// Path-MTU probing options are Linux's.
pub(crate) fn set_df_probe(_: &impl AsFd, _: bool) -> io::Result<()> {
    Err(unsupported("IP_PMTUDISC_PROBE"))
}

/// The route MTU option is Linux's.
pub(crate) fn route_mtu(_: &impl AsFd, _: bool) -> io::Result<libc::c_int> {
    Err(unsupported("IP_MTU"))
}

/// Kernel receive timestamps are Linux's here.
pub(crate) fn enable_rx_timestamps(_: &impl AsFd) -> io::Result<()> {
    Err(unsupported("SO_TIMESTAMPNS"))
}

/// Timestamped receive is Linux's; the public module falls back to
/// `recv_from` without a timestamp.
pub(crate) fn recv_timestamped(
    _: &impl AsFd,
    _: &mut [u8],
) -> io::Result<(usize, std::net::SocketAddr, Option<u64>)> {
    Err(unsupported("SO_TIMESTAMPNS"))
}

/// `SIOCETHTOOL` is Linux's.
pub(crate) fn ethtool_value(_: &str, _: u32) -> io::Result<u32> {
    Err(unsupported("SIOCETHTOOL"))
}

/// `SIOCETHTOOL` is Linux's.
pub(crate) fn ethtool_rings(_: &str) -> io::Result<[u32; 4]> {
    Err(unsupported("SIOCETHTOOL"))
}

/// Network namespaces are Linux's.
pub(crate) fn enter_netns(_: &impl AsFd) -> io::Result<()> {
    Err(unsupported("setns"))
}

/// The lab's TUN devices (virtio headers, TSO offloads) are Linux's.
pub(crate) fn open_tun(_: &str, _: bool) -> io::Result<(OwnedFd, bool)> {
    Err(unsupported("TUN devices"))
}

/// Capabilities are Linux's; elsewhere only root may force buffers.
pub(crate) fn has_net_admin() -> bool {
    false
}

/// Real-time scheduling classes are left to Linux here.
pub(crate) fn set_fifo_priority(_: i32) -> io::Result<()> {
    Err(unsupported("SCHED_FIFO"))
}

/// No timer slack to tighten.
pub(crate) fn set_timer_slack_ns(_: u64) {}

/// No pidfds.
pub(crate) fn pidfd_open(_: rustix::process::Pid) -> io::Result<Option<OwnedFd>> {
    Err(unsupported("pidfd_open"))
}
