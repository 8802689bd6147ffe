//! The few socket calls the probe needs that `std` lacks: Don't-Fragment
//! probing, the route MTU, and kernel receive timestamps.
//!
//! They belong in `fatpipe-sys`, next to the other socket options, and can
//! move there unchanged; they live here for now because that crate is being
//! reworked by its owner, as `ethtool.rs` does for the same reason. Linux
//! only: elsewhere every call fails with `Unsupported` and the probe falls
//! back (no MTU search beyond 1500, user-space receive timestamps).
//!
//! Why kernel timestamps: the bottleneck estimate is read from gaps of ~12 µs
//! per 1500-byte packet at 1 Gbit/s. A receive thread that stamps packets
//! after `recv` adds its own scheduling delay and, worse, stamps a backlog of
//! queued packets all at once; `SO_TIMESTAMPNS` records when each packet
//! entered the stack, which is what the dispersion is about.

use std::io;
use std::net::{SocketAddr, UdpSocket};

/// Sets Don't Fragment on every datagram and ignores the cached path MTU
/// (`IP_PMTUDISC_PROBE`), so a probe larger than the local device fails
/// with `EMSGSIZE` at once and one larger than some hop's MTU is dropped
/// on the way (never fragmented).
pub fn set_df_probe(sock: &UdpSocket, v6: bool) -> io::Result<()> {
    imp::set_df_probe(sock, v6)
}

/// The MTU of the route to the connected peer (the local device's MTU or a
/// smaller cached path MTU).
pub fn route_mtu(sock: &UdpSocket, v6: bool) -> io::Result<u32> {
    imp::route_mtu(sock, v6)
}

/// Asks the kernel to timestamp every received datagram (`SO_TIMESTAMPNS`).
pub fn enable_rx_timestamps(sock: &UdpSocket) -> io::Result<()> {
    imp::enable_rx_timestamps(sock)
}

/// Receives one datagram into `buf`: its length, sender and the kernel's
/// receive time in ns (`None` when the kernel attached none).
pub fn recv_timestamped(
    sock: &UdpSocket,
    buf: &mut [u8],
) -> io::Result<(usize, SocketAddr, Option<u64>)> {
    imp::recv_timestamped(sock, buf)
}

/// Now on the realtime clock in ns since the Unix epoch: the clock of
/// `SO_TIMESTAMPNS`, so it can be compared with receive timestamps.
pub fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(target_os = "linux")]
mod imp {
    use std::io;
    use std::mem;
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
    use std::os::fd::AsRawFd;

    fn setsockopt_int(sock: &UdpSocket, level: i32, name: i32, value: i32) -> io::Result<()> {
        // SAFETY: the pointer and length describe `value`, alive for the call.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                level,
                name,
                (&value as *const i32).cast(),
                mem::size_of::<i32>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    pub fn set_df_probe(sock: &UdpSocket, v6: bool) -> io::Result<()> {
        if v6 {
            setsockopt_int(
                sock,
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPV6_PMTUDISC_PROBE,
            )
        } else {
            setsockopt_int(
                sock,
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_PROBE,
            )
        }
    }

    pub fn route_mtu(sock: &UdpSocket, v6: bool) -> io::Result<u32> {
        let (level, name) = if v6 {
            (libc::IPPROTO_IPV6, libc::IPV6_MTU)
        } else {
            (libc::IPPROTO_IP, libc::IP_MTU)
        };
        let mut value: i32 = 0;
        let mut len = mem::size_of::<i32>() as libc::socklen_t;
        // SAFETY: `value` and `len` are valid for writes of their sizes.
        let rc = unsafe {
            libc::getsockopt(
                sock.as_raw_fd(),
                level,
                name,
                (&mut value as *mut i32).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        u32::try_from(value).map_err(|_| io::Error::other("negative MTU"))
    }

    pub fn enable_rx_timestamps(sock: &UdpSocket) -> io::Result<()> {
        setsockopt_int(sock, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)
    }

    pub fn recv_timestamped(
        sock: &UdpSocket,
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
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, 0) };
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
                let a: libc::sockaddr_in6 =
                    unsafe { *(s as *const _ as *const libc::sockaddr_in6) };
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
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::io;
    use std::net::{SocketAddr, UdpSocket};

    fn unsupported() -> io::Error {
        io::Error::new(io::ErrorKind::Unsupported, "not available on this platform")
    }

    pub fn set_df_probe(_: &UdpSocket, _: bool) -> io::Result<()> {
        Err(unsupported())
    }

    pub fn route_mtu(_: &UdpSocket, _: bool) -> io::Result<u32> {
        Err(unsupported())
    }

    pub fn enable_rx_timestamps(_: &UdpSocket) -> io::Result<()> {
        Err(unsupported())
    }

    pub fn recv_timestamped(
        sock: &UdpSocket,
        buf: &mut [u8],
    ) -> io::Result<(usize, SocketAddr, Option<u64>)> {
        let (n, from) = sock.recv_from(buf)?;
        Ok((n, from, None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_route_mtu_and_timestamps() {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        a.connect(b.local_addr().unwrap()).unwrap();
        set_df_probe(&a, false).unwrap();
        // loopback's MTU is 65536 on Linux (16436 on old kernels).
        assert!(route_mtu(&a, false).unwrap() >= 16436);
        enable_rx_timestamps(&b).unwrap();
        a.send(&[1, 2, 3]).unwrap();
        let mut buf = [0u8; 64];
        let (n, from, ts) = recv_timestamped(&b, &mut buf).unwrap();
        assert_eq!((n, from), (3, a.local_addr().unwrap()));
        assert!(ts.is_some_and(|t| t > 1_000_000_000));
        // Oversized with DF: refused locally, never fragmented.
        let big = vec![0u8; 65_507];
        let lo_mtu = route_mtu(&a, false).unwrap();
        if lo_mtu < 65_535 {
            assert!(a.send(&big).is_err());
        }
    }
}
