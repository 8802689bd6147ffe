//! Linux system calls behind the public modules.
//!
//! Thin, individually `unsafe`-wrapped calls: no policy and no fallback
//! logic lives here (that is in the public modules, where it is shared with
//! the portable platform and tested). Constants that some libc targets do
//! not export are defined locally with their uapi values, which are the same
//! on every architecture fatpipe builds for (x86_64, aarch64).

use std::ffi::CStr;
use std::io;
use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};

use rustix::fs::{AtFlags, FallocateFlags, Mode, OFlags, ResolveFlags};

use super::{cvt, cvt_retry, getsockopt_bytes, getsockopt_int, raw, setsockopt, setsockopt_bytes};
use crate::files::Advice;
use crate::IoPath;

/// Linux doubles `SO_SNDBUF`/`SO_RCVBUF` requests to leave room for its own
/// bookkeeping and reports the doubled value; dividing by this gives the
/// size the caller asked for.
pub(crate) const BUFFER_SCALE: u64 = 2;

/// The `send` flag for `MSG_ZEROCOPY`.
pub(crate) const MSG_ZEROCOPY_FLAG: libc::c_int = libc::MSG_ZEROCOPY;

/// The `open` flag for `O_DIRECT`.
pub(crate) const O_DIRECT_FLAG: libc::c_int = libc::O_DIRECT;

const SO_SNDBUFFORCE: libc::c_int = 32;
const SO_RCVBUFFORCE: libc::c_int = 33;
const SO_MAX_PACING_RATE: libc::c_int = 47;
const SO_ZEROCOPY: libc::c_int = 60;
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;
const SO_EE_ORIGIN_ZEROCOPY: u8 = 5;
const SO_EE_CODE_ZEROCOPY_COPIED: u8 = 1;
/// Kernel `TCP_CA_NAME_MAX`.
const TCP_CA_NAME_MAX: usize = 16;

/// Sets a socket buffer with the privileged `SO_*BUFFORCE` option, which
/// ignores `net.core.[rw]mem_max` (needs `CAP_NET_ADMIN`).
pub(crate) fn set_buffer_force(fd: &impl AsFd, send: bool, bytes: libc::c_int) -> io::Result<()> {
    let name = if send { SO_SNDBUFFORCE } else { SO_RCVBUFFORCE };
    setsockopt(fd, libc::SOL_SOCKET, name, bytes)
}

/// Sets `TCP_WINDOW_CLAMP`: the most this socket's receiver advertises.
pub(crate) fn set_window_clamp(fd: &impl AsFd, bytes: libc::c_int) -> io::Result<()> {
    setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_WINDOW_CLAMP, bytes)
}

/// Reads `TCP_WINDOW_CLAMP`.
#[cfg(test)]
pub(crate) fn get_window_clamp(fd: &impl AsFd) -> io::Result<libc::c_int> {
    getsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_WINDOW_CLAMP)
}

/// Sets `TCP_CONGESTION` by name.
pub(crate) fn set_congestion(fd: &impl AsFd, name: &str) -> io::Result<()> {
    setsockopt_bytes(fd, libc::IPPROTO_TCP, libc::TCP_CONGESTION, name.as_bytes())
}

/// Reads `TCP_CONGESTION`.
pub(crate) fn get_congestion(fd: &impl AsFd) -> io::Result<String> {
    let mut buf = [0u8; TCP_CA_NAME_MAX];
    let len = getsockopt_bytes(fd, libc::IPPROTO_TCP, libc::TCP_CONGESTION, &mut buf)?;
    let name = &buf[..len];
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Ok(String::from_utf8_lossy(&name[..end]).into_owned())
}

/// Sets `SO_MAX_PACING_RATE` in bytes per second (64-bit form, Linux 4.20+;
/// older kernels take the 32-bit form, tried when the first is refused).
pub(crate) fn set_max_pacing_rate(fd: &impl AsFd, bytes_per_sec: u64) -> io::Result<()> {
    match setsockopt(fd, libc::SOL_SOCKET, SO_MAX_PACING_RATE, bytes_per_sec) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            let narrow = u32::try_from(bytes_per_sec).unwrap_or(u32::MAX);
            setsockopt(fd, libc::SOL_SOCKET, SO_MAX_PACING_RATE, narrow)
        }
        other => other,
    }
}

/// Sets `TCP_NOTSENT_LOWAT`.
pub(crate) fn set_notsent_lowat(fd: &impl AsFd, bytes: libc::c_int) -> io::Result<()> {
    setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT, bytes)
}

/// Reads `TCP_INFO` into `buf`; returns the length the kernel filled.
pub(crate) fn tcp_info_raw(fd: &impl AsFd, buf: &mut [u8]) -> io::Result<usize> {
    getsockopt_bytes(fd, libc::IPPROTO_TCP, libc::TCP_INFO, buf)
}

/// One `sendfile(2)` call from `input` at `*offset`; advances `*offset`.
pub(crate) fn sendfile(
    out: &impl AsFd,
    input: &impl AsFd,
    offset: &mut u64,
    len: usize,
) -> io::Result<usize> {
    let mut off = libc::off64_t::try_from(*offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
    // SAFETY: both descriptors are borrowed for the call and `off` is a
    // valid, exclusively borrowed off64_t the kernel may update.
    let n = cvt_retry(|| unsafe { libc::sendfile64(raw(out), raw(input), &mut off, len) })?;
    *offset = off as u64;
    Ok(n as usize)
}

/// An anonymous memory-backed file (`memfd_create`).
pub(crate) fn memfd(name: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: `name` is a valid NUL-terminated string for the call.
    let fd = cvt(unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) })?;
    // SAFETY: memfd_create returned a new descriptor that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Turns on `SO_ZEROCOPY` so `send(MSG_ZEROCOPY)` is honoured.
pub(crate) fn enable_zerocopy(fd: &impl AsFd) -> io::Result<()> {
    setsockopt(fd, libc::SOL_SOCKET, SO_ZEROCOPY, 1 as libc::c_int)
}

/// One `MSG_ZEROCOPY` completion notification from the socket error queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ZcCompletion {
    /// First send sequence number completed (inclusive).
    pub lo: u32,
    /// Last send sequence number completed (inclusive).
    pub hi: u32,
    /// The kernel copied the data after all (e.g. loopback delivery).
    pub copied: bool,
}

/// Reads one notification from the error queue without blocking.
/// `Ok(None)` when the queue is empty or the message was not a zero-copy
/// completion.
pub(crate) fn read_zerocopy_completion(fd: &impl AsFd) -> io::Result<Option<ZcCompletion>> {
    // u64 elements keep the control buffer aligned for cmsghdr.
    let mut control = [0u64; 16];
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: `msg` points only at `control`, which outlives the call.
    let ret = unsafe { libc::recvmsg(raw(fd), &mut msg, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
    if ret < 0 {
        let err = io::Error::last_os_error();
        return match err.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(err),
        };
    }
    // SAFETY: the kernel filled `msg`/`control`; CMSG_* walk only within
    // msg_controllen, and each sock_extended_err read is bounds-checked
    // against the cmsg length and done unaligned.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            let c = &*cmsg;
            let is_recverr = (c.cmsg_level == libc::SOL_IP && c.cmsg_type == libc::IP_RECVERR)
                || (c.cmsg_level == libc::SOL_IPV6 && c.cmsg_type == libc::IPV6_RECVERR);
            let need = libc::CMSG_LEN(std::mem::size_of::<libc::sock_extended_err>() as u32);
            if is_recverr && c.cmsg_len as usize >= need as usize {
                let ee: libc::sock_extended_err =
                    std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast());
                if ee.ee_errno == 0 && ee.ee_origin == SO_EE_ORIGIN_ZEROCOPY {
                    return Ok(Some(ZcCompletion {
                        lo: ee.ee_info,
                        hi: ee.ee_data,
                        copied: ee.ee_code & SO_EE_CODE_ZEROCOPY_COPIED != 0,
                    }));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok(None)
}

/// `recv(MSG_TRUNC)` with no buffer: on TCP, Linux drops up to `len` bytes
/// from the receive queue without copying them and returns the count.
pub(crate) fn recv_trunc(fd: &impl AsFd, len: usize) -> io::Result<usize> {
    // SAFETY: with MSG_TRUNC on a TCP socket the kernel never writes to the
    // buffer, and a null pointer with a non-zero length is its documented
    // way of asking to discard; other socket types fail with EFAULT, which
    // the caller treats as "not supported".
    cvt_retry(|| unsafe { libc::recv(raw(fd), std::ptr::null_mut(), len, libc::MSG_TRUNC) })
        .map(|n| n as usize)
}

/// Reusable `mmsghdr`/`iovec` arrays for `sendmmsg`/`recvmmsg`, so batch
/// calls do not allocate after warm-up.
#[derive(Default)]
pub(crate) struct MmsgScratch {
    headers: Vec<libc::mmsghdr>,
    iovecs: Vec<libc::iovec>,
}

// SAFETY: the raw pointers inside are rebuilt before every call and point
// only at buffers borrowed for that call; between calls they are dead data.
unsafe impl Send for MmsgScratch {}

/// Sends each packet as one datagram on a connected socket with
/// `sendmmsg`; returns how many datagrams the kernel accepted.
pub(crate) fn send_batch(
    fd: &impl AsFd,
    packets: &[&[u8]],
    scratch: &mut MmsgScratch,
) -> io::Result<(usize, IoPath)> {
    if packets.is_empty() {
        return Ok((0, IoPath::Mmsg));
    }
    scratch.iovecs.clear();
    scratch.headers.clear();
    for p in packets {
        scratch.iovecs.push(libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        });
    }
    for iov in scratch.iovecs.iter_mut() {
        // SAFETY: mmsghdr is plain data; all-zero is a valid empty header.
        let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
        h.msg_hdr.msg_iov = iov;
        h.msg_hdr.msg_iovlen = 1;
        scratch.headers.push(h);
    }
    let count = libc::c_uint::try_from(scratch.headers.len()).unwrap_or(libc::c_uint::MAX);
    // SAFETY: each header points at one iovec in `scratch.iovecs`, each iovec
    // at a packet borrowed for this call; the kernel only reads them.
    let n =
        cvt_retry(|| unsafe { libc::sendmmsg(raw(fd), scratch.headers.as_mut_ptr(), count, 0) })?;
    Ok((n as usize, IoPath::Mmsg))
}

/// Receives up to `lens.len()` datagrams with `recvmmsg` into fixed-size
/// slots of `storage` (`slot` bytes each). Fills `lens` with each datagram's
/// length and `segs` with its GRO segment size (if the kernel coalesced).
/// `control` holds `ctl_slot` bytes of ancillary space per datagram.
/// `nonblocking` returns what is queued instead of waiting for a full batch
/// (the first datagram is always waited for on a blocking socket).
#[allow(clippy::too_many_arguments)]
pub(crate) fn recv_batch(
    fd: &impl AsFd,
    storage: &mut [u8],
    slot: usize,
    control: &mut [u64],
    ctl_slot: usize,
    lens: &mut [usize],
    segs: &mut [Option<usize>],
    scratch: &mut MmsgScratch,
) -> io::Result<(usize, IoPath)> {
    let count = lens.len();
    let ctl_bytes = control.len() * 8;
    debug_assert!(storage.len() >= slot * count && ctl_bytes >= ctl_slot * count);
    scratch.iovecs.clear();
    scratch.headers.clear();
    for chunk in storage.chunks_mut(slot).take(count) {
        scratch.iovecs.push(libc::iovec {
            iov_base: chunk.as_mut_ptr().cast(),
            iov_len: chunk.len(),
        });
    }
    let ctl_base: *mut u8 = control.as_mut_ptr().cast();
    for (i, iov) in scratch.iovecs.iter_mut().enumerate() {
        // SAFETY: mmsghdr is plain data; all-zero is a valid empty header.
        let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
        h.msg_hdr.msg_iov = iov;
        h.msg_hdr.msg_iovlen = 1;
        // SAFETY: i * ctl_slot + ctl_slot <= ctl_bytes (asserted above), so
        // the pointer stays inside `control`.
        h.msg_hdr.msg_control = unsafe { ctl_base.add(i * ctl_slot) }.cast();
        h.msg_hdr.msg_controllen = ctl_slot as _;
        scratch.headers.push(h);
    }
    let n_hdrs = libc::c_uint::try_from(scratch.headers.len()).unwrap_or(libc::c_uint::MAX);
    // SAFETY: every header points at an iovec over its own slot of `storage`
    // and at its own slot of `control`, all exclusively borrowed for the
    // call; a null timeout means "no timeout".
    let n = cvt_retry(|| unsafe {
        libc::recvmmsg(
            raw(fd),
            scratch.headers.as_mut_ptr(),
            n_hdrs,
            libc::MSG_WAITFORONE,
            std::ptr::null_mut(),
        )
    })? as usize;
    let mut any_gro = false;
    for i in 0..n {
        let h = &scratch.headers[i];
        lens[i] = h.msg_len as usize;
        segs[i] = None;
        // SAFETY: the kernel wrote msg_controllen bytes of well-formed cmsgs
        // into this header's control slot; CMSG_* stay within it and the
        // int payload is read unaligned after a length check.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&h.msg_hdr);
            while !cmsg.is_null() {
                let c = &*cmsg;
                let need = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as usize;
                if c.cmsg_level == libc::SOL_UDP
                    && c.cmsg_type == UDP_GRO
                    && c.cmsg_len as usize >= need
                {
                    let seg: libc::c_int = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast());
                    if seg > 0 {
                        segs[i] = Some(seg as usize);
                        any_gro = true;
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&h.msg_hdr, cmsg);
            }
        }
    }
    Ok((n, if any_gro { IoPath::Gso } else { IoPath::Mmsg }))
}

/// Ancillary space one datagram needs for a `UDP_GRO` segment size.
pub(crate) fn gro_control_len() -> usize {
    // SAFETY: CMSG_SPACE is a pure size computation.
    unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as usize }
}

/// Sends `buf` as datagrams of `segment` bytes in one call with a
/// `UDP_SEGMENT` control message.
pub(crate) fn send_gso(fd: &impl AsFd, buf: &[u8], segment: u16) -> io::Result<usize> {
    let mut control = [0u64; 4];
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is a pure size computation; 32 bytes of `control`
    // exceed CMSG_SPACE(2) on every target.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(2) } as _;
    // SAFETY: `control` is aligned (u64) and large enough for one cmsg with
    // a u16 payload, which is what we write through CMSG_FIRSTHDR/DATA.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_UDP;
        (*cmsg).cmsg_type = UDP_SEGMENT;
        (*cmsg).cmsg_len = libc::CMSG_LEN(2) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u16>(), segment);
    }
    // SAFETY: `msg` points at `iov` (over `buf`) and `control`, all live for
    // the call; the kernel only reads them.
    cvt_retry(|| unsafe { libc::sendmsg(raw(fd), &msg, 0) }).map(|n| n as usize)
}

/// Whether the socket accepts `UDP_SEGMENT` (UDP GSO, Linux 4.18+).
pub(crate) fn gso_supported(fd: &impl AsFd) -> bool {
    super::getsockopt_int(fd, libc::SOL_UDP, UDP_SEGMENT).is_ok()
}

/// Turns `UDP_GRO` receive coalescing on or off.
pub(crate) fn set_gro(fd: &impl AsFd, on: bool) -> io::Result<()> {
    setsockopt(fd, libc::SOL_UDP, UDP_GRO, libc::c_int::from(on))
}

/// Whether `UDP_GRO` is on for this socket.
#[cfg(test)]
pub(crate) fn gro_enabled(fd: &impl AsFd) -> io::Result<bool> {
    super::getsockopt_int(fd, libc::SOL_UDP, UDP_GRO).map(|v| v != 0)
}

/// `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`.
pub(crate) fn openat2_beneath(
    dirfd: &impl AsFd,
    path: &CStr,
    flags: OFlags,
    mode: Mode,
) -> io::Result<OwnedFd> {
    // The kernel refuses a mode unless the call may create a file.
    let mode = if flags.intersects(OFlags::CREATE | OFlags::TMPFILE) {
        mode
    } else {
        Mode::empty()
    };
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
    loop {
        match rustix::fs::openat2(dirfd, path, flags | OFlags::CLOEXEC, mode, resolve) {
            Err(rustix::io::Errno::INTR) => continue,
            other => return Ok(other?),
        }
    }
}

/// A new file without a name in `dir` (`O_TMPFILE`), open for writing.
pub(crate) fn open_tmpfile(dir: &impl AsFd, mode: Mode) -> io::Result<OwnedFd> {
    let flags = OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC;
    Ok(rustix::fs::openat(dir, c".", flags, mode)?)
}

/// Names an `O_TMPFILE` file. Goes through `/proc/self/fd`, which needs no
/// privilege (`AT_EMPTY_PATH` would need CAP_DAC_READ_SEARCH).
pub(crate) fn link_tmpfile(file: &impl AsFd, dir: &impl AsFd, name: &CStr) -> io::Result<()> {
    let src = format!("/proc/self/fd/{}", raw(file));
    Ok(rustix::fs::linkat(
        rustix::fs::CWD,
        src.as_str(),
        dir,
        name,
        AtFlags::SYMLINK_FOLLOW,
    )?)
}

/// `fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)`.
pub(crate) fn punch_hole(fd: &impl AsFd, offset: u64, len: u64) -> io::Result<()> {
    let mode = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
    Ok(rustix::fs::fallocate(fd, mode, offset, len)?)
}

/// `fallocate(2)`; `keep_size` leaves the file size alone.
pub(crate) fn fallocate(fd: &impl AsFd, offset: u64, len: u64, keep_size: bool) -> io::Result<()> {
    let off = libc::off64_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
    let len = libc::off64_t::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "length too large"))?;
    let mode = if keep_size {
        libc::FALLOC_FL_KEEP_SIZE
    } else {
        0
    };
    // SAFETY: fallocate takes only integers and touches no memory of ours.
    cvt_retry(|| unsafe { libc::fallocate64(raw(fd), mode, off, len) }).map(drop)
}

/// `posix_fadvise(2)`.
pub(crate) fn fadvise(fd: &impl AsFd, offset: u64, len: u64, advice: Advice) -> io::Result<()> {
    let advice = match advice {
        Advice::Normal => libc::POSIX_FADV_NORMAL,
        Advice::Sequential => libc::POSIX_FADV_SEQUENTIAL,
        Advice::Random => libc::POSIX_FADV_RANDOM,
        Advice::WillNeed => libc::POSIX_FADV_WILLNEED,
        Advice::DontNeed => libc::POSIX_FADV_DONTNEED,
        Advice::NoReuse => libc::POSIX_FADV_NOREUSE,
    };
    let off = libc::off64_t::try_from(offset).unwrap_or(libc::off64_t::MAX);
    let len = libc::off64_t::try_from(len).unwrap_or(0);
    // SAFETY: posix_fadvise takes only integers; it returns the error number
    // itself instead of setting errno.
    let ret = unsafe { libc::posix_fadvise64(raw(fd), off, len, advice) };
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(ret))
    }
}

/// Don't Fragment on every datagram, ignoring the cached path MTU
/// (`IP_PMTUDISC_PROBE` / `IPV6_PMTUDISC_PROBE`).
pub(crate) fn set_df_probe(fd: &impl AsFd, v6: bool) -> io::Result<()> {
    if v6 {
        setsockopt(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_PROBE as libc::c_int,
        )
    } else {
        setsockopt(
            fd,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_PROBE as libc::c_int,
        )
    }
}

/// `IP_MTU` / `IPV6_MTU` of a connected socket.
pub(crate) fn route_mtu(fd: &impl AsFd, v6: bool) -> io::Result<libc::c_int> {
    if v6 {
        getsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_MTU)
    } else {
        getsockopt_int(fd, libc::IPPROTO_IP, libc::IP_MTU)
    }
}

/// `SO_TIMESTAMPNS`: the kernel stamps every received datagram.
pub(crate) fn enable_rx_timestamps(fd: &impl AsFd) -> io::Result<()> {
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1 as libc::c_int)
}

/// One datagram with its sender and `SCM_TIMESTAMPNS` receive time (ns).
pub(crate) fn recv_timestamped(
    fd: &impl AsFd,
    buf: &mut [u8],
) -> io::Result<(usize, SocketAddr, Option<u64>)> {
    // SAFETY: all-zero is a valid sockaddr_storage and msghdr.
    let mut name: libc::sockaddr_storage = unsafe { mem::zeroed() };
    // u64 elements keep the control buffer aligned for cmsghdr.
    let mut control = [0u64; 16];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: as above.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
    msg.msg_namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = mem::size_of_val(&control) as _;
    // SAFETY: every pointer in `msg` refers to a live buffer of the
    // length given next to it, all outliving the call.
    let n = unsafe { libc::recvmsg(raw(fd), &mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut stamp = None;
    // SAFETY: the CMSG_* walk stays within `msg_controllen` bytes of
    // `control`, which the kernel filled; the timespec is read unaligned.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts: libc::timespec =
                    std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::timespec>());
                if ts.tv_sec >= 0 && ts.tv_nsec >= 0 {
                    stamp = Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    let from = to_socket_addr(&name)?;
    Ok((n as usize, from, stamp))
}

fn to_socket_addr(s: &libc::sockaddr_storage) -> io::Result<SocketAddr> {
    match i32::from(s.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in,
            // and sockaddr_storage is large and aligned enough for it.
            let a: libc::sockaddr_in = unsafe { *(s as *const _ as *const libc::sockaddr_in) };
            Ok(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let a: libc::sockaddr_in6 = unsafe { *(s as *const _ as *const libc::sockaddr_in6) };
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => Err(io::Error::other("datagram from an unknown address family")),
    }
}

// ethtool: NIC offloads and ring sizes through SIOCETHTOOL.

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GRINGPARAM: u32 = 0x10;

/// `struct ifreq` with the `ifr_data` member of its union; padded to the
/// kernel's 40 bytes.
#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

#[repr(C)]
#[derive(Default)]
struct EthtoolRingParam {
    cmd: u32,
    rx_max_pending: u32,
    rx_mini_max_pending: u32,
    rx_jumbo_max_pending: u32,
    tx_max_pending: u32,
    rx_pending: u32,
    rx_mini_pending: u32,
    rx_jumbo_pending: u32,
    tx_pending: u32,
}

/// One `ETHTOOL_G*` value command (offload flags and the like).
pub(crate) fn ethtool_value(ifname: &str, cmd: u32) -> io::Result<u32> {
    let mut v = EthtoolValue { cmd, data: 0 };
    ethtool_ioctl(ifname, (&mut v as *mut EthtoolValue).cast())?;
    Ok(v.data)
}

/// `ETHTOOL_GRINGPARAM`: rx, rx max, tx, tx max.
pub(crate) fn ethtool_rings(ifname: &str) -> io::Result<[u32; 4]> {
    let mut r = EthtoolRingParam {
        cmd: ETHTOOL_GRINGPARAM,
        ..Default::default()
    };
    ethtool_ioctl(ifname, (&mut r as *mut EthtoolRingParam).cast())?;
    Ok([
        r.rx_pending,
        r.rx_max_pending,
        r.tx_pending,
        r.tx_max_pending,
    ])
}

fn ethtool_ioctl(ifname: &str, data: *mut libc::c_void) -> io::Result<()> {
    let bytes = ifname.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a valid interface name",
        ));
    }
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        data,
        _pad: [0; 16],
    };
    for (d, s) in req.name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: plain socket(2); the descriptor is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `req` is a valid ifreq whose data points at a live ethtool
    // command struct of the layout the command number names; both
    // outlive the call.
    let rc = unsafe { libc::ioctl(fd, SIOCETHTOOL as _, &mut req as *mut IfReq) };
    let err = io::Error::last_os_error();
    // SAFETY: fd is ours and closed once.
    unsafe { libc::close(fd) };
    if rc < 0 {
        return Err(err);
    }
    Ok(())
}

// The lab's calls: namespaces, TUN devices, scheduling, pidfds.

const TUN_F_TSO4: libc::c_uint = 0x02;
const TUN_F_TSO6: libc::c_uint = 0x04;
const TUN_F_TSO_ECN: libc::c_uint = 0x08;
const TUN_F_USO4: libc::c_uint = 0x20;
const TUN_F_USO6: libc::c_uint = 0x40;

/// `struct ifreq` as TUNSETIFF reads it: a name and the flags, padded to
/// the kernel's 40 bytes.
#[repr(C)]
struct TunReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// `setns(CLONE_NEWNET)` for the calling thread.
pub(crate) fn enter_netns(ns: &impl AsFd) -> io::Result<()> {
    use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};
    Ok(move_into_link_name_space(
        ns.as_fd(),
        Some(LinkNameSpaceType::Network),
    )?)
}

/// Opens `/dev/net/tun` as device `name` with `IFF_TUN | IFF_NO_PI |
/// IFF_VNET_HDR`, checksum and TSO offloads, non-blocking. UDP segmentation
/// offload (USO, Linux 6.2+) is asked for too if `uso`; a kernel that does
/// not know it refuses the whole request with `EINVAL`, and then the device
/// is set up without it. Returns the device and whether USO is on.
pub(crate) fn open_tun(name: &str, uso: bool) -> io::Result<(OwnedFd, bool)> {
    let bytes = name.as_bytes();
    if bytes.len() >= libc::IFNAMSIZ {
        return Err(io::Error::other("device name too long"));
    }
    let fd = rustix::fs::open(
        c"/dev/net/tun",
        OFlags::RDWR | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut req = TunReq {
        name: [0; libc::IFNAMSIZ],
        flags: (libc::IFF_TUN | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short,
        _pad: [0; 22],
    };
    req.name[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: TUNSETIFF reads (and may update) a `struct ifreq`, which
    // `TunReq` lays out at its full size; `req` outlives the call.
    if unsafe { libc::ioctl(raw(&fd), libc::TUNSETIFF, &mut req as *mut TunReq) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let offload = libc::TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN;
    let set = |flags: libc::c_uint| {
        // SAFETY: TUNSETOFFLOAD takes the flags by value and touches no memory.
        if unsafe { libc::ioctl(raw(&fd), libc::TUNSETOFFLOAD, flags as libc::c_ulong) } < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    // The kernel turns USO on only with both bits (and checksum offload).
    let uso = match uso.then(|| set(offload | TUN_F_USO4 | TUN_F_USO6)) {
        Some(Ok(())) => true,
        None => {
            set(offload)?;
            false
        }
        Some(Err(e)) if e.raw_os_error() == Some(libc::EINVAL) => {
            set(offload)?;
            false
        }
        Some(Err(e)) => return Err(e),
    };
    let flags = rustix::fs::fcntl_getfl(&fd)?;
    rustix::fs::fcntl_setfl(&fd, flags | OFlags::NONBLOCK)?;
    Ok((fd, uso))
}

/// Whether `CAP_NET_ADMIN` is in this thread's effective set (`capget`).
pub(crate) fn has_net_admin() -> bool {
    rustix::thread::capabilities(None).is_ok_and(|c| {
        c.effective
            .contains(rustix::thread::CapabilitySet::NET_ADMIN)
    })
}

/// `sched_setscheduler(SCHED_FIFO)` for the calling thread.
pub(crate) fn set_fifo_priority(priority: i32) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: pid 0 means the calling thread; `param` is a valid struct
    // that outlives the call and is only read.
    cvt(unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) }).map(drop)
}

/// `PR_SET_TIMERSLACK` for the calling thread; errors are ignored (the
/// default slack only makes timers later).
pub(crate) fn set_timer_slack_ns(ns: u64) {
    let _ = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(ns));
}

/// A pidfd for `pid`, or `None` if it has already gone (`ESRCH`).
pub(crate) fn pidfd_open(pid: rustix::process::Pid) -> io::Result<Option<OwnedFd>> {
    match rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(rustix::io::Errno::SRCH) => Ok(None),
        Err(e) => Err(e.into()),
    }
}
