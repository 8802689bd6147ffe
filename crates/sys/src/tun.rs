//! TUN devices for the lab's emulated link.
//!
//! The lab's forwarder moves packets between a TUN device in each of two
//! network namespaces. The devices carry virtio-net headers and accept
//! checksum and TSO offloads, so the kernels hand over TCP super-packets of
//! up to 64 KB (which is how the forwarder reaches multi-gigabit rates),
//! and are non-blocking so one thread can serve both. Linux only: elsewhere
//! [`open`] fails with `Unsupported`.

use std::fs::File;
use std::io;

use crate::platform;

/// Creates TUN device `name` in the calling thread's network namespace,
/// with virtio-net headers and checksum/TSO offloads, non-blocking. Reads
/// and writes on the returned file move one frame each.
pub fn open(name: &str) -> io::Result<File> {
    platform::open_tun(name).map(File::from)
}
