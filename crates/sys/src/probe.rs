//! The few socket calls the probe needs that `std` lacks: Don't-Fragment
//! probing, the route MTU, and kernel receive timestamps.
//!
//! Linux only: elsewhere the options fail with `Unsupported` and
//! [`recv_timestamped`] receives without a timestamp, so the probe falls
//! back (no MTU search beyond 1500, user-space receive timestamps).
//!
//! Why kernel timestamps: the bottleneck estimate is read from gaps of ~12 µs
//! per 1500-byte packet at 1 Gbit/s. A receive thread that stamps packets
//! after `recv` adds its own scheduling delay and, worse, stamps a backlog of
//! queued packets all at once; `SO_TIMESTAMPNS` records when each packet
//! entered the stack, which is what the dispersion is about.

use std::io;
use std::net::{SocketAddr, UdpSocket};

use crate::platform;

/// Sets Don't Fragment on every datagram and ignores the cached path MTU
/// (`IP_PMTUDISC_PROBE`), so a probe larger than the local device fails
/// with `EMSGSIZE` at once and one larger than some hop's MTU is dropped
/// on the way (never fragmented).
pub fn set_df_probe(sock: &UdpSocket, v6: bool) -> io::Result<()> {
    platform::set_df_probe(sock, v6)
}

/// Whether a send failed because the datagram is larger than the local
/// device (or the route) allows with Don't Fragment set (`EMSGSIZE`).
pub fn is_too_big(err: &io::Error) -> bool {
    err.raw_os_error() == Some(libc::EMSGSIZE)
}

/// The MTU of the route to the connected peer (the local device's MTU or a
/// smaller cached path MTU).
pub fn route_mtu(sock: &UdpSocket, v6: bool) -> io::Result<u32> {
    let mtu = platform::route_mtu(sock, v6)?;
    u32::try_from(mtu).map_err(|_| io::Error::other("negative MTU"))
}

/// Asks the kernel to timestamp every received datagram (`SO_TIMESTAMPNS`).
pub fn enable_rx_timestamps(sock: &UdpSocket) -> io::Result<()> {
    platform::enable_rx_timestamps(sock)
}

/// Receives one datagram into `buf`: its length, sender and the kernel's
/// receive time in ns (`None` when the kernel attached none, or the
/// platform cannot).
pub fn recv_timestamped(
    sock: &UdpSocket,
    buf: &mut [u8],
) -> io::Result<(usize, SocketAddr, Option<u64>)> {
    match platform::recv_timestamped(sock, buf) {
        Err(e) if e.kind() == io::ErrorKind::Unsupported => {
            let (n, from) = sock.recv_from(buf)?;
            Ok((n, from, None))
        }
        other => other,
    }
}

/// Now on the realtime clock in ns since the Unix epoch: the clock of
/// `SO_TIMESTAMPNS`, so it can be compared with receive timestamps.
pub fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_route_mtu_and_timestamps() {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        a.connect(b.local_addr().unwrap()).unwrap();
        let mut buf = [0u8; 64];
        match set_df_probe(&a, false) {
            Ok(()) => {}
            // The portable platform: no options, receives without a stamp.
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                assert!(route_mtu(&a, false).is_err());
                assert!(enable_rx_timestamps(&b).is_err());
                a.send(&[1, 2, 3]).unwrap();
                let (n, from, ts) = recv_timestamped(&b, &mut buf).unwrap();
                assert_eq!((n, from, ts), (3, a.local_addr().unwrap(), None));
                return;
            }
            Err(e) => panic!("{e}"),
        }
        // loopback's MTU is 65536 on Linux (16436 on old kernels).
        assert!(route_mtu(&a, false).unwrap() >= 16436);
        enable_rx_timestamps(&b).unwrap();
        a.send(&[1, 2, 3]).unwrap();
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
