//! Entering a network namespace.
//!
//! The lab creates its devices and sockets inside its two namespaces from a
//! helper thread that has joined the namespace, so the process's own
//! namespace never changes; what is created there stays there when used
//! from any thread. Linux only: elsewhere [`enter`] fails with
//! `Unsupported`.

use std::io;
use std::os::fd::AsFd;

use crate::platform;

/// Moves the calling thread into the network namespace `ns` (an open
/// `/run/netns/NAME` file, as `ip netns add` makes), with `setns`.
pub fn enter(ns: impl AsFd) -> io::Result<()> {
    platform::enter_netns(&ns)
}
