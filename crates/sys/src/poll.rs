//! Waiting for descriptors to become readable, with a nanosecond timeout.
//!
//! The lab's forwarder sleeps until the next frame is due or a device has
//! one to read, and a frame due in 30 µs cannot wait for a millisecond
//! `poll` timeout; `ppoll` (what rustix's `poll` with a `Timespec` is on
//! Linux) takes nanoseconds.

use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, Timespec};

/// Waits until one of `fds` is readable or `timeout` passes; true if one
/// is. An interrupting signal counts as a timeout. For a loop that waits
/// on the same descriptors again and again, build a [`Readable`] once.
pub fn wait_readable(fds: &[&impl AsFd], timeout: Duration) -> io::Result<bool> {
    Readable::new(fds).wait(timeout)
}

/// A set of descriptors to wait on, built once: the lab's forwarder waits
/// between frames tens of thousands of times a second, and the poll array
/// is the same every time (`ppoll` rewrites only `revents`).
pub struct Readable<'fd> {
    fds: Vec<PollFd<'fd>>,
}

impl<'fd> Readable<'fd> {
    /// The set of `fds`, each waited on for input.
    pub fn new(fds: &[&'fd impl AsFd]) -> Readable<'fd> {
        Readable {
            fds: fds
                .iter()
                .map(|fd| PollFd::new(*fd, PollFlags::IN))
                .collect(),
        }
    }

    /// Waits until one is readable or `timeout` passes; true if one is.
    /// An interrupting signal counts as a timeout.
    pub fn wait(&mut self, timeout: Duration) -> io::Result<bool> {
        let ts = Timespec {
            tv_sec: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        match rustix::event::poll(&mut self.fds, Some(&ts)) {
            Ok(n) => Ok(n > 0 && self.fds.iter().any(|p| p.revents().contains(PollFlags::IN))),
            Err(rustix::io::Errno::INTR) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    #[test]
    fn sees_data_and_times_out() {
        let (mut a, b) = UnixStream::pair().unwrap();
        assert!(!wait_readable(&[&b], Duration::from_micros(200)).unwrap());
        a.write_all(b"x").unwrap();
        assert!(wait_readable(&[&b], Duration::from_secs(5)).unwrap());
    }
}
