//! This process and others: who we run as, how many descriptors we may
//! open, signalling and outliving other processes, and how punctually the
//! scheduler serves a thread.
//!
//! The engine opens a descriptor per stream at each end, the lab's
//! forwarder must deliver frames on time on a shared machine and remove
//! itself when its owner dies, and several commands behave differently for
//! root. Each of those needs one system call; they are gathered here so no
//! other crate has to hold one. Where a platform lacks a call (pidfds,
//! real-time classes and timer slack are Linux's) the function says
//! `Unsupported` or does nothing, as documented on each.

use std::io;
use std::time::Duration;

use rustix::process::{Pid, Resource, Rlimit};

use crate::platform;

/// A signal [`kill`] can send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// `SIGTERM`: please exit.
    Term,
    /// `SIGKILL`: exit now.
    Kill,
}

/// Calls `on_signal` on a thread of its own each time the process gets
/// SIGTERM or SIGINT, instead of the default of dying at once: a server
/// uses it to stop cleanly. The handler itself only records the signal
/// (signal-hook's self-pipe); `on_signal` runs as ordinary code. The
/// argument says which signal came ("SIGTERM" or "SIGINT").
pub fn on_termination(on_signal: impl Fn(&'static str) + Send + 'static) -> io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                on_signal(if sig == SIGINT { "SIGINT" } else { "SIGTERM" });
            }
        })?;
    Ok(())
}

/// A user from the user database, to run as ([`drop_to`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// Its name.
    pub name: String,
    /// Its user id.
    pub uid: u32,
    /// Its primary group id.
    pub gid: u32,
}

/// Looks `name` up in the user database (`getpwnam_r`: files, LDAP,
/// whatever NSS is configured with); `Ok(None)` if there is no such user.
pub fn lookup_user(name: &str) -> io::Result<Option<User>> {
    let cname = std::ffi::CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "user name holds a NUL byte"))?;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // SAFETY: passwd is plain data (integers and pointers); all-zero is
        // a valid value for getpwnam_r to overwrite.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call: `cname` is a NUL-
        // terminated string, `pw` and `found` are writable, and `buf` is
        // writable for `buf.len()` bytes; the strings getpwnam_r stores in
        // `pw` point into `buf`, which outlives their use below (none).
        let rc = unsafe {
            libc::getpwnam_r(
                cname.as_ptr(),
                &mut pw,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut found,
            )
        };
        match rc {
            0 if found.is_null() => return Ok(None),
            0 => {
                return Ok(Some(User {
                    name: name.to_string(),
                    uid: pw.pw_uid,
                    gid: pw.pw_gid,
                }))
            }
            libc::ERANGE if buf.len() < 1 << 20 => buf.resize(buf.len() * 4, 0),
            e => return Err(io::Error::from_raw_os_error(e)),
        }
    }
}

/// Runs this process as `user` from now on: supplementary groups cut to
/// its primary group, then the group id, then the user id (in that order:
/// after `setuid` the others are no longer permitted). The C library's
/// wrappers apply each change to every thread of the process. Then
/// checks that root cannot be regained; any failure is an error and the
/// caller must not go on.
pub fn drop_to(user: &User) -> io::Result<()> {
    let gid: libc::gid_t = user.gid;
    // SAFETY: `gid` is one valid gid_t, read by setgroups for the call.
    platform::cvt(unsafe { libc::setgroups(1, &gid) })?;
    // SAFETY: plain integer arguments.
    platform::cvt(unsafe { libc::setgid(user.gid) })?;
    // SAFETY: plain integer argument.
    platform::cvt(unsafe { libc::setuid(user.uid) })?;
    // SAFETY: plain integer argument; this must fail now.
    if user.uid != 0 && unsafe { libc::setuid(0) } == 0 {
        return Err(io::Error::other("root could be regained after dropping it"));
    }
    let (uid, euid) = (rustix::process::getuid(), rustix::process::geteuid());
    if uid.as_raw() != user.uid || euid.as_raw() != user.uid {
        return Err(io::Error::other("the user id did not change"));
    }
    Ok(())
}

/// Whether this process runs with effective user id 0.
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Whether this process may force socket buffers past the host caps
/// (`SO_SNDBUFFORCE`/`SO_RCVBUFFORCE`): root, or `CAP_NET_ADMIN` in its
/// effective set, as a service given only that capability
/// (`AmbientCapabilities=CAP_NET_ADMIN`) has it. `CAP_NET_ADMIN` is
/// Linux's; elsewhere only root.
pub fn may_force_buffers() -> bool {
    is_root() || platform::has_net_admin()
}

/// Raises this process's open-file limit to its hard limit. Best effort:
/// failure leaves the limit as it was.
pub fn raise_fd_limit() {
    let lim = rustix::process::getrlimit(Resource::Nofile);
    // `None` is "unlimited", above every number.
    let below_max = match (lim.current, lim.maximum) {
        (Some(cur), Some(max)) => cur < max,
        (Some(_), None) => true,
        (None, _) => false,
    };
    if below_max {
        let raised = Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        };
        let _ = rustix::process::setrlimit(Resource::Nofile, raised);
    }
}

/// Sends `sig` to process `pid`; false if it does not exist or may not be
/// signalled. A pid of 0 (or one beyond `pid_t`) is refused without a
/// system call: 0 would mean this process group.
pub fn kill(pid: u32, sig: Signal) -> bool {
    let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return false;
    };
    let sig = match sig {
        Signal::Term => rustix::process::Signal::TERM,
        Signal::Kill => rustix::process::Signal::KILL,
    };
    rustix::process::kill_process(pid, sig).is_ok()
}

/// Blocks until process `pid` exits (returns at once if it already has).
/// Watches a pidfd, so a recycled pid cannot fool it. `Unsupported` where
/// there are no pidfds.
pub fn wait_for_exit(pid: u32) -> io::Result<()> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a process id"))?;
    let Some(fd) = platform::pidfd_open(pid)? else {
        return Ok(());
    };
    loop {
        if crate::poll::wait_readable(&[&fd], Duration::from_secs(3600))? {
            return Ok(());
        }
    }
}

/// Moves the calling thread to the real-time FIFO class at `priority`
/// (`sched_setscheduler`). `Unsupported` off Linux.
pub fn set_realtime(priority: i32) -> io::Result<()> {
    platform::set_fifo_priority(priority)
}

/// Asks the kernel to wake this thread's timers on time rather than up to
/// 50 µs late (`PR_SET_TIMERSLACK` of 1 ns). Best effort; nothing happens
/// where the platform has no timer slack.
pub fn tight_timer_slack() {
    platform::set_timer_slack_ns(1);
}

#[cfg(test)]
mod tests {
    #[test]
    fn root_is_uid_0_and_nobody_is_no_one() {
        let root = super::lookup_user("root").unwrap().expect("a root user");
        assert_eq!((root.uid, root.gid), (0, 0));
        assert_eq!(super::lookup_user("no-such-user-fatpipe-x").unwrap(), None);
        assert!(super::lookup_user("a\0b").is_err());
    }

    use super::*;

    /// `CAP_NET_ADMIN` as capget reports it agrees with the kernel's own
    /// account in /proc (bit 12 of `CapEff`).
    #[test]
    fn net_admin_agrees_with_proc_status() {
        let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
            crate::skip_test("no /proc/self/status here");
            return;
        };
        let eff = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .expect("a CapEff line");
        let want =
            cfg!(all(target_os = "linux", not(fatpipe_sys_fallback))) && eff & (1 << 12) != 0;
        assert_eq!(platform::has_net_admin(), want, "CapEff {eff:x}");
        assert_eq!(may_force_buffers(), is_root() || want);
    }

    #[test]
    fn refuses_pid_zero_and_finds_no_ghost() {
        assert!(!kill(0, Signal::Term), "pid 0 would mean our process group");
        assert!(!kill(u32::MAX, Signal::Term));
        raise_fd_limit();
        let lim = rustix::process::getrlimit(Resource::Nofile);
        assert_eq!(lim.current, lim.maximum);
        let _ = is_root();
    }

    #[test]
    fn waits_for_a_child_to_exit() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let t = std::thread::spawn(move || wait_for_exit(pid));
        let _ = child.wait();
        match t.join().unwrap() {
            Ok(()) => {}
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::Unsupported),
        }
    }
}
