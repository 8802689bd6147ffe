//! Socket buffer sizing: ask, then report what the kernel actually granted.
//!
//! On a long fat network the socket buffer bounds the window, so the size a
//! user asks for (`-w 64M`) is worthless unless we also say what the host
//! allowed. Linux silently caps `SO_SNDBUF`/`SO_RCVBUF` at
//! `net.core.wmem_max`/`rmem_max` and then *doubles* the value to leave room
//! for its own bookkeeping, reporting the doubled figure. [`BufferGrant`]
//! hides that quirk: `granted` is always in the caller's units (the kernel's
//! figure divided by two on Linux), so `granted < requested` means "capped"
//! on every platform. The raw kernel figure is kept in `kernel_bytes`.
//!
//! Setting a buffer explicitly turns off Linux receive/send autotuning for
//! that socket; callers that want autotuning simply do not call these.

use std::io;
use std::os::fd::AsFd;

use crate::platform;

/// The largest request the kernel accepts without overflowing its doubled
/// `int`; bigger requests are clamped to this and reported as capped.
const MAX_REQUEST: u64 = (i32::MAX / 2) as u64;

/// What a socket-buffer request turned into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferGrant {
    /// Bytes the caller asked for.
    pub requested: u64,
    /// Bytes the kernel granted, in the caller's units (Linux's doubled
    /// figure halved), read back after setting.
    pub granted: u64,
    /// The raw value `getsockopt` reported (twice `granted` on Linux).
    pub kernel_bytes: u64,
    /// The privileged `SO_*BUFFORCE` option took effect (so host caps were
    /// bypassed).
    pub forced: bool,
    /// The host limit (or the kernel's maximum) held the grant below the
    /// request.
    pub capped: bool,
}

/// Sets the send buffer (`SO_SNDBUF`) to `bytes` and reports the grant.
///
/// With `force`, tries `SO_SNDBUFFORCE` first, which ignores
/// `net.core.wmem_max` but needs `CAP_NET_ADMIN`; when refused it falls back
/// to the plain option and `forced` is false.
pub fn set_send_buffer(fd: impl AsFd, bytes: u64, force: bool) -> io::Result<BufferGrant> {
    set_buffer(&fd, true, bytes, force)
}

/// Sets the receive buffer (`SO_RCVBUF`) to `bytes` and reports the grant.
///
/// With `force`, tries `SO_RCVBUFFORCE` first (needs `CAP_NET_ADMIN`,
/// bypasses `net.core.rmem_max`) and falls back to the plain option.
pub fn set_recv_buffer(fd: impl AsFd, bytes: u64, force: bool) -> io::Result<BufferGrant> {
    set_buffer(&fd, false, bytes, force)
}

/// Holds a TCP receive window at a size while data flows, with
/// `TCP_WINDOW_CLAMP`: a receive loop calls [`WindowHold::tick`] after each
/// read. Set the buffer first ([`set_recv_buffer`]): the hold is the smaller
/// of the two.
///
/// Without the clamp the window is a kernel-dependent multiple of the
/// buffer: Linux doubles it and, since 6.x, advertises that space times the
/// payload-to-memory ratio it measures (about 0.66 for 1500-byte packets),
/// so a 3.8 MiB buffer let 5.2 MB be in flight. A plan meant as 1.5 BDP
/// over 11 streams then put 2 BDP in flight, over-filled the 1-BDP queue of
/// a 1 Gbit/s × 228 ms lab link and lost ~10k segments in BBR's start-up;
/// held, it lost none.
///
/// Linux recomputes `TCP_WINDOW_CLAMP` from the buffer whenever it
/// re-measures the payload-to-memory ratio of arriving segments (with the
/// first full-sized segments, and whenever the segment size changes), so a
/// clamp set at connect time is gone once data arrives. The hold re-applies
/// it every 10 ms for the first second of data (when the ratio settles and
/// slow start would otherwise overshoot), then once a second; re-applying an
/// unchanged clamp costs one cheap `setsockopt`.
///
/// [`WindowHold::starting_at`] holds a smaller window first, for the
/// sender's start-up (see there).
#[derive(Debug)]
pub struct WindowHold {
    window: libc::c_int,
    /// A smaller window held until this long after the first tick.
    start: Option<(libc::c_int, std::time::Duration)>,
    first: Option<std::time::Instant>,
    next: std::time::Instant,
}

impl WindowHold {
    /// Time between re-applications while the window settles.
    const FAST: std::time::Duration = std::time::Duration::from_millis(10);
    /// How long after the first tick re-application stays fast.
    const SETTLE: std::time::Duration = std::time::Duration::from_secs(1);
    /// Time between re-applications afterwards.
    const SLOW: std::time::Duration = std::time::Duration::from_secs(1);
    /// The longest a start window holds (whatever a peer asked for).
    pub const MAX_START: std::time::Duration = std::time::Duration::from_secs(60);

    /// A hold at `window` bytes, or at the socket's receive buffer if that
    /// is smaller (a host cap held the buffer back). `None` where clamping
    /// is unsupported (not Linux: the buffer alone bounds the window).
    pub fn new(fd: impl AsFd, window: u64) -> Option<WindowHold> {
        let granted = get_recv_buffer(&fd).map_or(window, |g| g.min(window));
        let clamp = granted.min(MAX_REQUEST) as libc::c_int;
        platform::set_window_clamp(&fd, clamp).ok()?;
        let now = std::time::Instant::now();
        Some(WindowHold {
            window: clamp,
            start: None,
            first: None,
            next: now,
        })
    }

    /// With `start = Some((window, for_))`, holds `window` bytes instead
    /// (when smaller than the hold's) from the first tick until `for_`
    /// later (at most [`MAX_START`](Self::MAX_START)), then the full window.
    ///
    /// For a sender's start-up on a lossy path: a plan that widens the
    /// windows to keep streams sending through loss recovery (3 × BDP at
    /// 0.1 %) lets BBR's start-up put all of it in flight, which over-filled
    /// the 1-BDP queue of a 1 Gbit/s × 228 ms lab link and lost 3000–6000
    /// segments at once; held at the clean plan's 1.5 × BDP until start-up
    /// is over, it lost none.
    pub fn starting_at(mut self, start: Option<(u64, std::time::Duration)>) -> WindowHold {
        self.start = start.and_then(|(window, for_)| {
            let w = window.min(MAX_REQUEST) as libc::c_int;
            (w > 0 && w < self.window && !for_.is_zero()).then_some((w, for_.min(Self::MAX_START)))
        });
        self
    }

    /// The window held, in bytes.
    pub fn window(&self) -> u64 {
        u64::try_from(self.window).unwrap_or(0)
    }

    /// Re-applies the clamp when it is due (see the type's notes).
    pub fn tick(&mut self, fd: impl AsFd) {
        let now = std::time::Instant::now();
        if now < self.next {
            return;
        }
        let first = *self.first.get_or_insert(now);
        let since = now.duration_since(first);
        let (window, starting) = match self.start {
            Some((w, until)) if since < until => (w, true),
            _ => (self.window, false),
        };
        let _ = platform::set_window_clamp(&fd, window);
        let step = if starting || since < Self::SETTLE {
            Self::FAST
        } else {
            Self::SLOW
        };
        self.next = now + step;
    }
}

/// The current send buffer in the caller's units (see [`BufferGrant::granted`]).
pub fn get_send_buffer(fd: impl AsFd) -> io::Result<u64> {
    read_buffer(&fd, libc::SO_SNDBUF).map(|raw| raw / platform::BUFFER_SCALE)
}

/// The current receive buffer in the caller's units (see [`BufferGrant::granted`]).
pub fn get_recv_buffer(fd: impl AsFd) -> io::Result<u64> {
    read_buffer(&fd, libc::SO_RCVBUF).map(|raw| raw / platform::BUFFER_SCALE)
}

fn set_buffer(fd: &impl AsFd, send: bool, bytes: u64, force: bool) -> io::Result<BufferGrant> {
    let name = if send {
        libc::SO_SNDBUF
    } else {
        libc::SO_RCVBUF
    };
    let clamped = bytes.min(MAX_REQUEST);
    let value = clamped as libc::c_int;
    let forced = force && platform::set_buffer_force(fd, send, value).is_ok();
    if !forced {
        platform::setsockopt(fd, libc::SOL_SOCKET, name, value)?;
    }
    let kernel_bytes = read_buffer(fd, name)?;
    let granted = kernel_bytes / platform::BUFFER_SCALE;
    Ok(BufferGrant {
        requested: bytes,
        granted,
        kernel_bytes,
        forced,
        capped: granted < bytes,
    })
}

fn read_buffer(fd: &impl AsFd, name: libc::c_int) -> io::Result<u64> {
    let raw = platform::getsockopt_int(fd, libc::SOL_SOCKET, name)?;
    Ok(u64::try_from(raw).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream, UdpSocket};
    use std::time::Duration;

    /// A `/proc/sys/net/core` buffer cap, where the host has one.
    fn core_cap(name: &str) -> Option<u64> {
        let text = std::fs::read_to_string(format!("/proc/sys/net/core/{name}")).ok()?;
        text.trim().parse().ok()
    }

    fn window_clamp(fd: &impl AsFd) -> u64 {
        let clamp = platform::get_window_clamp(fd).unwrap();
        u64::try_from(clamp).unwrap_or(0)
    }

    fn is_root() -> bool {
        crate::process::is_root()
    }

    #[test]
    fn small_request_is_granted_in_callers_units() {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let g = set_send_buffer(&sock, 256 * 1024, false).unwrap();
        assert_eq!(g.requested, 256 * 1024);
        // Only assert the full grant when the host cap allows it.
        let cap = core_cap("wmem_max").unwrap_or(u64::MAX);
        if cap >= 256 * 1024 {
            assert!(g.granted >= 256 * 1024, "{g:?}");
            assert!(!g.capped);
        }
        assert_eq!(g.kernel_bytes / crate::platform::BUFFER_SCALE, g.granted);
        assert_eq!(get_send_buffer(&sock).unwrap(), g.granted);
    }

    #[test]
    fn request_over_host_cap_is_capped_unless_forced() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let sock = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let huge = 1u64 << 40; // 1 TiB: over every cap, including the kernel's
        let g = set_recv_buffer(&sock, huge, false).unwrap();
        assert!(g.capped, "{g:?}");
        assert!(!g.forced);
        assert!(g.granted < huge);
        assert_eq!(get_recv_buffer(&sock).unwrap(), g.granted);
    }

    #[test]
    fn force_bypasses_host_cap_when_privileged() {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let Some(cap) = core_cap("rmem_max") else {
            crate::skip_test("rmem_max unreadable");
            return;
        };
        let want = (cap * 2).clamp(4 << 20, MAX_REQUEST);
        let g = set_recv_buffer(&sock, want, true).unwrap();
        if is_root() && cfg!(all(target_os = "linux", not(fatpipe_sys_fallback))) {
            assert!(g.forced, "{g:?}");
            assert!(g.granted >= want, "{g:?}");
            assert!(!g.capped);
        } else {
            // Unprivileged: the fallback to the plain option must still work.
            assert!(!g.forced, "{g:?}");
            assert!(g.granted > 0);
            assert_eq!(g.capped, g.granted < want);
        }
    }

    #[test]
    fn a_hold_is_never_wider_than_the_buffer() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (receiver, _) = listener.accept().unwrap();
        let g = set_recv_buffer(&receiver, 1 << 40, false).unwrap();
        assert!(g.capped, "{g:?}");
        if let Some(hold) = WindowHold::new(&receiver, 1 << 40) {
            assert_eq!(hold.window(), g.granted);
            assert_eq!(window_clamp(&receiver), g.granted);
        }
    }

    #[test]
    fn a_start_window_holds_first_then_the_full_one() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (receiver, _) = listener.accept().unwrap();
        let want = 1 << 20;
        set_recv_buffer(&receiver, want, false).unwrap();
        let Some(hold) = WindowHold::new(&receiver, want) else {
            crate::skip_test("no TCP_WINDOW_CLAMP here");
            return;
        };
        let full = hold.window();
        let start = full / 4;
        let mut hold = hold.starting_at(Some((start, Duration::from_millis(200))));
        hold.tick(&receiver);
        assert_eq!(window_clamp(&receiver), start);
        std::thread::sleep(Duration::from_millis(250));
        hold.tick(&receiver);
        assert_eq!(window_clamp(&receiver), full);
        // However long a peer asks for, the start holds at most MAX_START.
        let long = WindowHold::new(&receiver, want)
            .unwrap()
            .starting_at(Some((start, Duration::from_secs(3600))));
        assert_eq!(long.start.map(|s| s.1), Some(WindowHold::MAX_START));
        // A start window as wide as the hold is no start.
        let hold = WindowHold::new(&receiver, want).unwrap();
        let mut wide = hold.starting_at(Some((full * 2, Duration::from_secs(5))));
        wide.tick(&receiver);
        assert_eq!(window_clamp(&receiver), full);
    }

    #[test]
    fn held_window_keeps_the_peer_to_the_grant_while_data_flows() {
        use std::io::{Read, Write};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut sender = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut receiver, _) = listener.accept().unwrap();
        let want = 512 * 1024;
        set_recv_buffer(&receiver, want, false).unwrap();
        let Some(mut hold) = WindowHold::new(&receiver, want) else {
            crate::skip_test("no TCP_WINDOW_CLAMP here");
            return;
        };
        let window = hold.window();
        assert!(window > 0 && window <= want);
        // A reader that keeps up and ticks the hold, as the receive loops
        // do: the kernel resets the clamp when the first segments arrive.
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; 256 * 1024];
            let mut total = 0u64;
            while let Ok(n) = receiver.read(&mut buf) {
                if n == 0 {
                    break;
                }
                hold.tick(&receiver);
                total += n as u64;
            }
            (total, window_clamp(&receiver))
        });
        // A window already offered is never taken back, so the first
        // megabytes may still see a wider one; judge the second half.
        let block = vec![7u8; 64 * 1024];
        let mut widest = 0u32;
        for i in 0..256 {
            sender.write_all(&block).unwrap();
            if i >= 128 {
                let w = crate::tcp_info(&sender).unwrap().snd_wnd;
                widest = widest.max(w.unwrap_or(0));
            }
        }
        drop(sender);
        let (total, clamp) = reader.join().unwrap();
        assert_eq!(total, 256 * 64 * 1024);
        assert_eq!(clamp, window);
        if widest == 0 {
            crate::skip_test("tcp_info has no snd_wnd here");
            return;
        }
        // The window scale rounds the advertised window up by < 2^wscale.
        let slack = 16 * 1024;
        assert!(
            u64::from(widest) <= window + slack,
            "peer saw a {widest} B window for a {window} B hold"
        );
    }
}
