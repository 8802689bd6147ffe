//! The few system calls the driver needs, each wrapped once.
//!
//! TUN devices with virtio-net headers and TSO offloads, entering a network
//! namespace on a helper thread, waiting on a descriptor with a nanosecond
//! timeout, watching another process through a pidfd. Everything here is
//! Linux-only, like the namespaces it serves; the rest of the crate sees
//! safe functions returning `io::Result`.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::Error;

const TUN_F_TSO4: libc::c_uint = 0x02;
const TUN_F_TSO6: libc::c_uint = 0x04;
const TUN_F_TSO_ECN: libc::c_uint = 0x08;

/// `struct ifreq` as TUNSETIFF reads it: a name and the flags.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

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
        // SAFETY: `file` is an open namespace descriptor for the duration of
        // the call; setns only changes this (helper) thread's namespace.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        f()
    })
    .join()
    .map_err(|_| Error::Forwarder(format!("{what}: helper thread panicked")))?
    .map_err(|e| Error::io(what, e))
}

/// Creates TUN device `name` in the calling thread's namespace, with
/// virtio-net headers and checksum/TSO offloads, non-blocking.
pub fn open_tun(name: &str) -> io::Result<OwnedFd> {
    let path = CString::new("/dev/net/tun").map_err(io::Error::other)?;
    // SAFETY: `path` is a valid NUL-terminated string.
    let raw = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor we just opened and own from here on.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: (libc::IFF_TUN | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short,
        _pad: [0; 22],
    };
    let bytes = name.as_bytes();
    if bytes.len() >= libc::IFNAMSIZ {
        return Err(io::Error::other("device name too long"));
    }
    req.name[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: TUNSETIFF reads a `struct ifreq`, which `IfReq` lays out.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut req as *mut IfReq) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let offload = libc::TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN;
    // SAFETY: TUNSETOFFLOAD takes the flags by value.
    if unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::TUNSETOFFLOAD,
            offload as libc::c_ulong,
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    set_nonblocking(fd.as_raw_fd())?;
    Ok(fd)
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own, with integer arguments.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One `read(2)`; `Ok(None)` when nothing is waiting.
pub fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: `buf` is valid for `buf.len()` writable bytes.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n >= 0 {
        return Ok(Some(n as usize));
    }
    let e = io::Error::last_os_error();
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
        _ => Err(e),
    }
}

/// One `write(2)` of a whole frame.
pub fn write(fd: RawFd, buf: &[u8]) -> io::Result<()> {
    // SAFETY: `buf` is valid for `buf.len()` readable bytes.
    let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Waits until one of `fds` is readable or `timeout` passes; true if one is.
pub fn wait_readable(fds: &[RawFd], timeout: Duration) -> io::Result<bool> {
    let mut pfds = [libc::pollfd {
        fd: -1,
        events: libc::POLLIN,
        revents: 0,
    }; 2];
    let n = fds.len().min(pfds.len());
    for (p, &fd) in pfds.iter_mut().zip(fds) {
        p.fd = fd;
    }
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `n` valid pollfds, a valid timespec, no signal mask change.
    let r = unsafe { libc::ppoll(pfds.as_mut_ptr(), n as libc::nfds_t, &ts, std::ptr::null()) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(e)
        };
    }
    Ok(r > 0 && pfds[..n].iter().any(|p| p.revents & libc::POLLIN != 0))
}

/// Asks the kernel to wake this thread's timers on time, not up to 50 us
/// late: delivery times are the product here.
pub fn tight_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes an integer and affects this thread only.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}

/// Moves the calling thread to the real-time FIFO class at `priority`, so
/// that compilers and benchmarks sharing the machine cannot make frames
/// late. The thread sleeps whenever it has nothing due, and the kernel's
/// real-time throttling still leaves others their share.
pub fn realtime(priority: i32) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: pid 0 means the calling thread; `param` is a valid struct.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Blocks until process `pid` exits (returns at once if it already has).
pub fn wait_for_exit(pid: u32) -> io::Result<()> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if raw < 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ESRCH) {
            Ok(())
        } else {
            Err(e)
        };
    }
    // SAFETY: `raw` is a pidfd we own from here on.
    let fd = unsafe { OwnedFd::from_raw_fd(raw as RawFd) };
    loop {
        if wait_readable(&[fd.as_raw_fd()], Duration::from_secs(3600))? {
            return Ok(());
        }
    }
}

/// Sends `sig` to process `pid`; false if it does not exist.
pub fn kill(pid: u32, sig: libc::c_int) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill with a positive pid signals that one process only.
    unsafe { libc::kill(pid, sig) == 0 }
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
        assert!(!kill(0, 0), "pid 0 would mean our process group");
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
