//! A server flooded from one address still serves every other (issue 16).
//!
//! The flood comes from 127.0.0.2 (loopback holds all of 127/8; the
//! flooding sockets are bound to it before they connect) and runs three
//! kinds at once for [`FLOOD`]: 1,000 idle connections, each reopened as
//! the server closes it; 600 connections sending one byte a second; and
//! 1,000 authenticated `copy` sessions that are opened and never started,
//! each reopened as the server ends or refuses it. Meanwhile a real
//! `fatpipe test` and `fatpipe copy` from 127.0.0.1 must succeed within
//! [`REAL_CLIENT_BOUND`], the server's RSS and threads stay under the
//! bounds below, and its log carries summaries, not a line per event.
//!
//! The bound on the real clients: their address has its own handshake
//! and session allowance (256 each), so they wait for nothing the
//! flood holds; alone on this machine a 1 s test takes about 1.3 s and
//! the copy well under 1 s, so 8 s leaves room for a loaded CI host. The
//! server's deadlines are shortened (`--preauth-timeout 1s`,
//! `--start-timeout 1s`) so the reopening really happens within the test.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fatpipe_proto::{ClientConfig, ClientConn, ClientEvent, Key};
use socket2::{Domain, Socket, Type};

use crate::util::{assert_exit, mkdir, random_file, run, setup, Guard};

/// How long the flood lasts; it stops by itself.
const FLOOD: Duration = Duration::from_secs(4);
/// How long a real client may take under the flood (see the module docs).
const REAL_CLIENT_BOUND: Duration = Duration::from_secs(8);
/// The server's RSS bound under this flood: 1,024 handshake threads and
/// 256 sessions from the flooding address, each touching a few pages of
/// stack and at most one small frame of buffer, plus the real clients'
/// buffers. Measured well under half of it (see docs/security.md).
const RSS_BOUND_KIB: u64 = 256 * 1024;
/// Threads: handshakes (1,024) + sessions (1,000) + a few of the server's.
const THREAD_BOUND: u64 = 1024 + 1000 + 16;

const FLOODER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// The server's default cap on connections handshaking at once from one
/// address (`--max-handshakes-per-source`).
const PER_SOURCE_HANDSHAKES: u64 = fatpipe_engine::server::DEFAULT_MAX_HANDSHAKES_PER_SOURCE as u64;
/// The flood's three kinds: idle connections, one-byte-a-second senders,
/// and authenticated sessions never started.
const IDLE: usize = 1000;
const SLOW: usize = 600;
const NEVER_START: usize = 1000;

#[test]
fn a_flood_from_one_address_does_not_lock_out_the_others() {
    fatpipe_sys::process::raise_fd_limit();
    let dir = setup();
    let key_path = dir.path().join("key");
    crate::util::write_key(&key_path, "flood-test-key-0123456789\n");
    let key = Key::new(b"flood-test-key-0123456789").unwrap();
    let export = mkdir(&dir.path().join("export"));
    random_file(&dir.path().join("src.bin"), 4 << 20, 16);
    let log = dir.path().join("server.log");
    let mut cmd = dir.cmd();
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0"])
        .args(["--preauth-timeout", "1s", "--start-timeout", "1s"])
        .args(["--drain-timeout", "1s"])
        .arg("--key-file")
        .arg(&key_path)
        .arg("--export")
        .arg(format!("x={}", export.display()))
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap());
    let (server, port) = spawn(cmd);
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let pid = server.0.id();

    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(Stats::default());
    let floods: Vec<_> = [
        Kind::Idle(IDLE),
        Kind::Slow(SLOW),
        Kind::NeverStart(NEVER_START),
    ]
    .into_iter()
    .map(|kind| {
        let (stop, stats, key) = (Arc::clone(&stop), Arc::clone(&stats), key.clone());
        std::thread::spawn(move || flood(kind, addr, &key, &stop, &stats))
    })
    .collect();
    let t0 = Instant::now();
    let watch = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let (mut rss, mut threads) = (0, 0);
            while !stop.load(Ordering::Relaxed) {
                let (r, t) = proc_status(pid);
                rss = rss.max(r);
                threads = threads.max(t);
                // The sampling period of the server's peak RSS and threads.
                std::thread::sleep(Duration::from_millis(100));
            }
            (rss, threads)
        })
    };
    // The real clients come once the flood fills the server's caps: the
    // flooders hold more pre-auth connections than twice the per-source
    // handshake cap, and sessions have been refused at the per-source cap
    // (or after 3 s, whatever they reached: the checks below judge it).
    crate::util::within(Duration::from_secs(3), || {
        let s = |c: &AtomicU64| c.load(Ordering::Relaxed);
        s(&stats.reopened_idle) + s(&stats.reopened_slow) > 2 * PER_SOURCE_HANDSHAKES
            && s(&stats.refused) > 0
    });
    let real = |args: &[&str]| {
        let t = Instant::now();
        let out = run(dir.cmd().args(args).arg("--key-file").arg(&key_path));
        (out, t.elapsed())
    };
    let (test, test_took) = real(&["test", &format!("127.0.0.1:{port}"), "-t", "1"]);
    let (copy, copy_took) = real(&[
        "copy",
        "--port",
        &port.to_string(),
        "src.bin",
        "127.0.0.1:x/dst.bin",
    ]);
    let flooded_for = t0.elapsed();
    // The flood lasts FLOOD in all (the behaviour under test).
    std::thread::sleep(FLOOD.saturating_sub(t0.elapsed()));
    stop.store(true, Ordering::Relaxed);
    for f in floods {
        f.join().unwrap();
    }
    let (rss_kib, threads) = watch.join().unwrap();
    // SIGTERM: the server drains and writes its last summaries.
    let mut server = server;
    assert!(fatpipe_sys::process::kill(
        pid,
        fatpipe_sys::process::Signal::Term
    ));
    let status = server.0.wait().unwrap();
    let lines = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "server: {status:?}\n{lines}");
    eprintln!(
        "flood: {stats:?}; real test {test_took:?}, copy {copy_took:?} (under the flood for \
         {flooded_for:?}); server peak RSS {rss_kib} KiB, {threads} threads; \
         {} log lines:\n{lines}",
        lines.lines().count()
    );
    assert_exit(&test, 0);
    assert_exit(&copy, 0);
    assert!(test_took < REAL_CLIENT_BOUND, "test took {test_took:?}");
    assert!(copy_took < REAL_CLIENT_BOUND, "copy took {copy_took:?}");
    assert_eq!(
        std::fs::read(dir.path().join("src.bin")).unwrap(),
        std::fs::read(export.join("dst.bin")).unwrap()
    );
    // The flood really happened: the flooders held more pre-auth
    // connections than the server's per-source handshake cap twice over
    // (the server's own summary of its pre-auth timeouts is checked
    // below); sessions were accepted, refused at the per-source cap, and
    // ended. How many the flooding threads open in 4 s depends on the
    // host: one dial at a time, they opened 2,231 in one CI run and 1,393
    // (idle and slow together) in another, short of the 1,600 they aim to
    // hold, so the check is against the cap, not their aim.
    let s = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let preauth = s(&stats.reopened_idle) + s(&stats.reopened_slow);
    assert!(preauth > 2 * PER_SOURCE_HANDSHAKES, "{stats:?}");
    assert!(s(&stats.sessions) >= 256, "{stats:?}");
    assert!(s(&stats.refused) > 0, "{stats:?}");
    assert!(
        rss_kib > 0 && rss_kib < RSS_BOUND_KIB,
        "peak RSS {rss_kib} KiB"
    );
    assert!(threads < THREAD_BOUND, "{threads} threads");
    // Thousands of timeouts and refusals, a handful of summary lines; the
    // other lines are the sessions' own (started/ended), one each.
    let other: Vec<&str> = lines.lines().filter(|l| !l.contains(" session ")).collect();
    assert!(
        other.len() <= 10,
        "{} lines not about sessions",
        other.len()
    );
    assert!(
        other
            .iter()
            .any(|l| l.contains("pre-auth timeouts from 127.0.0.2")),
        "no timeout summary"
    );
}

#[derive(Debug, Default)]
struct Stats {
    reopened_idle: AtomicU64,
    reopened_slow: AtomicU64,
    sessions: AtomicU64,
    refused: AtomicU64,
}

#[derive(Clone, Copy)]
enum Kind {
    Idle(usize),
    Slow(usize),
    NeverStart(usize),
}

/// Keeps `kind`'s connections up until `stop`, reopening each one the
/// server closes; slow senders send one byte a second.
fn flood(kind: Kind, to: SocketAddr, key: &Key, stop: &AtomicBool, stats: &Stats) {
    let (n, counter) = match kind {
        Kind::Idle(n) => (n, &stats.reopened_idle),
        Kind::Slow(n) => (n, &stats.reopened_slow),
        Kind::NeverStart(n) => (n, &stats.sessions),
    };
    let mut conns: Vec<Option<(TcpStream, usize)>> = (0..n).map(|_| None).collect();
    let mut last_byte = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let tick = last_byte.elapsed() >= Duration::from_secs(1);
        if tick {
            last_byte = Instant::now();
        }
        for slot in conns.iter_mut() {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            if let Some((s, sent)) = slot {
                let byte_failed = tick
                    && matches!(kind, Kind::Slow(_))
                    && s.write(&SLOW_FRAME[*sent % SLOW_FRAME.len()..][..1])
                        .is_err();
                let alive = !byte_failed && !closed(s);
                if tick {
                    *sent += 1;
                }
                if alive {
                    continue;
                }
                *slot = None;
            }
            let fresh = match kind {
                Kind::NeverStart(_) => match open_session(to, key) {
                    Some(s) => Some(s),
                    None => {
                        stats.refused.fetch_add(1, Ordering::Relaxed);
                        None
                    }
                },
                _ => dial(to),
            };
            if let Some(s) = fresh {
                let _ = s.set_nonblocking(true);
                counter.fetch_add(1, Ordering::Relaxed);
                *slot = Some((s, 0));
            }
        }
        // The flooders' tick: the slow kind sends a byte a second, each
        // kind redials what the server closed (the behaviour under test).
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A frame header announcing 40 bytes, then the bytes: never complete at
/// one byte a second within the pre-auth deadline.
const SLOW_FRAME: [u8; 44] = {
    let mut f = [7u8; 44];
    f[0] = 0;
    f[1] = 0;
    f[2] = 0;
    f[3] = 40;
    f
};

/// A connection from the flooding address.
fn dial(to: SocketAddr) -> Option<TcpStream> {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).ok()?;
    s.bind(&SocketAddr::new(IpAddr::V4(FLOODER), 0).into())
        .ok()?;
    s.connect_timeout(&to.into(), Duration::from_millis(500))
        .ok()?;
    Some(s.into())
}

/// True once the server closed `s` (what it sent before is read and
/// dropped).
fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return true,
        }
    }
}

/// An authenticated `copy` session from the flooding address, opened and
/// never started; `None` if the server refused it.
fn open_session(to: SocketAddr, key: &Key) -> Option<TcpStream> {
    let mut s = dial(to)?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let config = ClientConfig {
        key: Some(key.clone()),
        service: "copy".into(),
        params: Vec::new(),
        handshake_timeout: Duration::from_secs(2),
    };
    let mut nonce = [0u8; 32];
    getrandom_like(&mut nonce);
    let mut c = ClientConn::new(config, Instant::now(), nonce);
    let mut buf = [0u8; 4096];
    loop {
        while let Some(bytes) = c.poll_transmit() {
            s.write_all(&bytes).ok()?;
        }
        while let Some(ev) = c.poll_event() {
            match ev {
                ClientEvent::Established { .. } => return Some(s),
                ClientEvent::Closed(_) => return None,
                ClientEvent::Payload(_) => {}
            }
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => c.handle_input(Instant::now(), &buf[..n]),
        }
    }
}

/// Distinct nonces without a random-number crate: the clock's nanoseconds
/// and a counter (the test needs them unique, not secret).
fn getrandom_like(out: &mut [u8; 32]) {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    out[..8].copy_from_slice(&n.to_le_bytes());
    out[8..16].copy_from_slice(&t.to_le_bytes());
}

/// Peak-able figures of a process: (VmRSS in KiB, threads).
fn proc_status(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("Threads:"))
}

/// Spawns the server with its stderr where `cmd` says, reading its port.
fn spawn(mut cmd: Command) -> (Guard, u16) {
    use std::io::BufRead;
    let mut child = cmd.spawn().expect("spawn fatpipe server");
    let stdout = child.stdout.take().expect("server stdout");
    let guard = Guard(child);
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the server's first line");
    let port = line
        .trim()
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"));
    (guard, port)
}
