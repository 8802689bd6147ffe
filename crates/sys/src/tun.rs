//! TUN devices for the lab's emulated link.
//!
//! The lab's forwarder moves packets between a TUN device in each of two
//! network namespaces. The devices carry virtio-net headers and accept
//! checksum and TSO offloads, so the kernels hand over TCP super-packets of
//! up to 64 KB (which is how the forwarder reaches multi-gigabit rates),
//! and, where the kernel has it (Linux 6.2+), UDP segmentation offload, so
//! a UDP GSO send crosses as one super-packet too instead of being cut
//! into datagrams before the device. They are non-blocking so one thread
//! can serve both. Linux only: elsewhere [`open`] fails with `Unsupported`.

use std::fs::File;
use std::io;

use crate::platform;

/// A TUN device as [`open`] set it up.
#[derive(Debug)]
pub struct Tun {
    /// Reads and writes move one frame (virtio-net header and IP packet).
    pub file: File,
    /// UDP segmentation offload is on: the kernel may hand over UDP GSO
    /// super-packets (`VIRTIO_NET_HDR_GSO_UDP_L4`). Off on kernels before
    /// 6.2, which refuse it.
    pub udp_gso: bool,
}

/// Creates TUN device `name` in the calling thread's network namespace,
/// with virtio-net headers, checksum/TSO offloads and, if `udp_gso`, UDP
/// segmentation offload where the kernel allows it, non-blocking.
pub fn open(name: &str, udp_gso: bool) -> io::Result<Tun> {
    platform::open_tun(name, udp_gso).map(|(fd, udp_gso)| Tun {
        file: File::from(fd),
        udp_gso,
    })
}
