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
/// is. An interrupting signal counts as a timeout.
pub fn wait_readable(fds: &[&impl AsFd], timeout: Duration) -> io::Result<bool> {
    let mut pfds: Vec<PollFd<'_>> = fds
        .iter()
        .map(|fd| PollFd::new(*fd, PollFlags::IN))
        .collect();
    let ts = Timespec {
        tv_sec: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    match rustix::event::poll(&mut pfds, Some(&ts)) {
        Ok(n) => Ok(n > 0 && pfds.iter().any(|p| p.revents().contains(PollFlags::IN))),
        Err(rustix::io::Errno::INTR) => Ok(false),
        Err(e) => Err(e.into()),
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
