//! The few system services the driver needs, in the driver's terms.
//!
//! TUN devices with virtio-net headers and TSO offloads, entering a network
//! namespace on a helper thread, waiting on a descriptor with a nanosecond
//! timeout, watching another process through a pidfd: the system calls are
//! `fatpipe_sys`'s (`tun`, `netns`, `poll`, `process`); what is here maps
//! them to the lab's errors and reads `/proc` for capabilities and process
//! state. Everything here is Linux-only, like the namespaces it serves.

use std::fs::File;
use std::io::{self, Read, Write};

pub use fatpipe_sys::process::Signal;

use crate::Error;

/// True if this process may create namespaces and TUN devices: it has
/// CAP_NET_ADMIN (12) and CAP_SYS_ADMIN (21) in its effective set.
pub fn has_caps() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 12) != 0 && caps & (1 << 21) != 0)
}

/// Runs `f` on a fresh thread that has entered network namespace `ns`
/// (from `ip netns add`), so the caller's own namespace never changes.
/// Sockets and devices created inside stay in `ns` when used from anywhere.
pub fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> Result<T, Error> {
    let path = format!("/run/netns/{ns}");
    let file = File::open(&path).map_err(|e| Error::io(format!("open {path}"), e))?;
    let what = format!("enter namespace {ns}");
    std::thread::spawn(move || {
        fatpipe_sys::netns::enter(&file)?;
        f()
    })
    .join()
    .map_err(|_| Error::Forwarder(format!("{what}: helper thread panicked")))?
    .map_err(|e| Error::io(what, e))
}

/// Creates TUN device `name` in the calling thread's namespace, with
/// virtio-net headers, checksum/TSO offloads and UDP GSO where the kernel
/// has it, non-blocking. Returns the device and whether UDP GSO is on.
/// `FATPIPE_LAB_UDP_GSO=0` leaves UDP GSO off (to compare, or to rule it
/// out): the sending kernel then cuts UDP GSO sends before the device.
pub fn open_tun(name: &str) -> io::Result<(File, bool)> {
    let want = std::env::var("FATPIPE_LAB_UDP_GSO").as_deref() != Ok("0");
    fatpipe_sys::tun::open(name, want).map(|t| (t.file, t.udp_gso))
}

/// One `read(2)`; `Ok(None)` when nothing is waiting.
pub fn read(mut fd: &File, buf: &mut [u8]) -> io::Result<Option<usize>> {
    match fd.read(buf) {
        Ok(n) => Ok(Some(n)),
        Err(e) => match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        },
    }
}

/// One `write(2)` of a whole frame.
pub fn write(mut fd: &File, buf: &[u8]) -> io::Result<()> {
    fd.write(buf).map(drop)
}

/// Asks the kernel to wake this thread's timers on time, not up to 50 us
/// late: delivery times are the product here.
pub fn tight_timer_slack() {
    fatpipe_sys::process::tight_timer_slack();
}

/// Moves the calling thread to the real-time FIFO class at `priority`, so
/// that compilers and benchmarks sharing the machine cannot make frames
/// late. The thread sleeps whenever it has nothing due, and the kernel's
/// real-time throttling still leaves others their share.
pub fn realtime(priority: i32) -> io::Result<()> {
    fatpipe_sys::process::set_realtime(priority)
}

/// Blocks until process `pid` exits (returns at once if it already has).
pub fn wait_for_exit(pid: u32) -> io::Result<()> {
    fatpipe_sys::process::wait_for_exit(pid)
}

/// Sends `sig` to process `pid`; false if it does not exist.
pub fn kill(pid: u32, sig: Signal) -> bool {
    fatpipe_sys::process::kill(pid, sig)
}

/// True if `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// The command line of `pid`, split at NULs.
pub fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// This process's id.
pub fn getpid() -> u32 {
    std::process::id()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sees_itself_alive_and_its_command_line() {
        assert!(alive(getpid()));
        assert!(!cmdline(getpid()).is_empty());
        assert!(!alive(u32::MAX / 2));
        assert!(!kill(0, Signal::Term), "pid 0 would mean our process group");
    }

    #[test]
    fn waits_for_a_child_to_exit() {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        let t = std::thread::spawn(move || wait_for_exit(pid));
        let _ = child.wait();
        assert!(t.join().expect("thread").is_ok());
    }
}
