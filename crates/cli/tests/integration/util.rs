//! Shared harness: a temp dir per test, the binary under test, process
//! guards, and the file-tree helpers of the copy tests (pseudo-random files,
//! tree digests, the copy journal).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::hash::Hasher;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The fatpipe binary Cargo built for these tests, or the one
/// `FATPIPE_BIN` names (test.sh points the hook-free test at a build
/// without the test hooks that way, rather than compiling these tests a
/// second time).
pub fn bin() -> PathBuf {
    std::env::var_os("FATPIPE_BIN")
        .filter(|p| !p.is_empty())
        .map_or_else(
            || PathBuf::from(env!("CARGO_BIN_EXE_fatpipe")),
            PathBuf::from,
        )
}

/// A fresh temporary directory that is removed when dropped.
pub struct Dir {
    tmp: tempfile::TempDir,
}

impl Dir {
    pub fn path(&self) -> &Path {
        self.tmp.path()
    }

    /// A `fatpipe` command that runs in this directory.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new(bin());
        c.current_dir(self.path());
        // The user's own archive (and anything else under their data
        // directory) is never touched by a test.
        c.env("XDG_DATA_HOME", self.path().join(".data"))
            .env_remove("FATPIPE_ARCHIVE");
        c
    }
}

/// Creates the per-test temporary directory.
pub fn setup() -> Dir {
    Dir {
        tmp: tempfile::Builder::new()
            .prefix("fatpipe-it-")
            .tempdir()
            .expect("create temp dir"),
    }
}

/// How long one command of a test may run before [`run`] kills it: far
/// above any command's need (the longest, a lab copy, takes ~25 s), below
/// nextest's per-test limit, so a hung command fails with its own name and
/// output rather than the test's.
pub const COMMAND_DEADLINE: Duration = Duration::from_secs(90);

/// Runs a command and returns its output, whatever its exit status; a
/// command still running after [`COMMAND_DEADLINE`] is killed (by PID) and
/// the test fails with the command line and what it printed.
pub fn run(cmd: &mut Command) -> Output {
    run_within(cmd, COMMAND_DEADLINE)
}

/// [`run`] with a deadline of its own.
pub fn run_within(cmd: &mut Command, deadline: Duration) -> Output {
    use std::sync::mpsc;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let pid = child.id();
    // Each pipe is read on a thread of its own (a full pipe would block
    // the child), and the exit is awaited on a third, so this thread can
    // wait for all of it with a deadline.
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = match rx.recv_timeout(deadline) {
        Ok(status) => status.expect("wait for the command"),
        Err(_) => {
            fatpipe_sys::process::kill(pid, fatpipe_sys::process::Signal::Kill);
            let _ = rx.recv();
            panic!(
                "{cmd:?} was still running after {deadline:?} and was killed\n--- stdout ---\n{}\n--- stderr ---\n{}",
                String::from_utf8_lossy(&out.join().unwrap_or_default()),
                String::from_utf8_lossy(&err.join().unwrap_or_default())
            );
        }
    };
    Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// Asserts that a command exited with `code`, printing stdout/stderr if not.
pub fn assert_exit(out: &Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "expected exit {code}, got {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A child process killed (by PID) and reaped when dropped, so a failing test
/// never leaves a server behind.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Spawns a `fatpipe server` command and reads its port from its first
/// stdout line, `listening on IP:PORT`. The server is ended when the guard drops.
pub fn spawn_server(mut cmd: Command) -> (Guard, u16) {
    cmd.stderr(Stdio::null());
    spawn_server_with(cmd)
}

/// [`spawn_server`] with stderr as the caller set it.
fn spawn_server_with(mut cmd: Command) -> (Guard, u16) {
    cmd.stdout(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn fatpipe server");
    let stdout = child.stdout.take().expect("server stdout");
    let guard = Guard(child);
    let mut line = String::new();
    let mut out = BufReader::new(stdout);
    out.read_line(&mut line)
        .expect("read the server's first line");
    // The rest is drained, never closed on the server: a server that prints
    // more (`http listening on …`, `metrics on …`) after the pipe's reader
    // went away would die of the write error.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let port = line
        .trim()
        .strip_prefix("listening on ")
        .and_then(|a| a.rsplit_once(':'))
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"));
    (guard, port)
}

/// A process's output, line by line, read on a thread of its own, so a
/// test can wait for a line (a server's "session started") with a deadline
/// instead of sleeping for it.
pub struct Lines {
    rx: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Lines {
    /// Reads `r` until it closes.
    pub fn read(r: impl Read + Send + 'static) -> Lines {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(r).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines {
            rx,
            seen: Vec::new(),
        }
    }

    /// The next line containing `pat`, waiting up to `limit` (panics with
    /// every line seen so far if none comes).
    pub fn wait_for(&mut self, limit: Duration, pat: &str) -> String {
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(pat) {
                        return line;
                    }
                }
                Err(e) => panic!(
                    "no line with {pat:?} within {limit:?} ({e}); seen:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }
}

/// [`spawn_server`] for a server that logs (no `--quiet`): its stderr
/// lines too, to wait on.
pub fn spawn_server_logged(mut cmd: Command) -> (Guard, u16, Lines) {
    cmd.stderr(Stdio::piped());
    let (mut guard, port) = spawn_server_with(cmd);
    let err = guard.0.stderr.take().expect("server stderr");
    (guard, port, Lines::read(err))
}

/// Waits up to `limit` for process `pid` (a child of this test) to exit,
/// on its pidfd: true if it did.
pub fn exits_within(pid: u32, limit: Duration) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(fatpipe_sys::process::wait_for_exit(pid));
    });
    matches!(rx.recv_timeout(limit), Ok(Ok(())))
}

/// A lab `name` (taken down first if a crashed run left it) that goes down
/// when this test process exits, and a `fatpipe server` in its namespace b
/// with `server_args` added. Returns the lab, the server's guard, and the
/// server's `ADDR:PORT` and port. Bind as `let (lab, _srv, ..)`: locals drop
/// in reverse, so the server ends before the lab goes down.
pub fn lab_with_server(
    name: &str,
    spec: &fatpipe_lab::LinkSpec,
    server_args: &[&str],
) -> (fatpipe_lab::Lab, Guard, String, u16) {
    use fatpipe_lab::{End, Lab, UpOptions};
    let _ = fatpipe_lab::down(name);
    let opts = UpOptions {
        exe: Some(bin()),
        owner: Some(std::process::id()),
    };
    let lab = Lab::up(name, spec, &opts).expect("lab up");
    let (srv, port) = lab_server(&lab, 0, server_args);
    let host = format!("{}:{port}", lab.addr(End::B));
    (lab, srv, host, port)
}

/// A `fatpipe server` in `lab`'s end b on `port` (0: any), with
/// `server_args` added; its guard and port. `ip netns exec` execs the
/// server, so the guard's child is the server's own PID.
pub fn lab_server(lab: &fatpipe_lab::Lab, port: u16, server_args: &[&str]) -> (Guard, u16) {
    let mut cmd = lab.command(fatpipe_lab::End::B, bin());
    cmd.args(["server", "--port", &port.to_string(), "--quiet"])
        .args(server_args);
    spawn_server(cmd)
}

/// `fatpipe copy --port PORT ARGS` run from `lab`'s end a (its PID is the
/// client's own, as with [`lab_server`]).
pub fn lab_copy(lab: &fatpipe_lab::Lab, port: u16, args: &[&str]) -> Command {
    let mut c = lab.command(fatpipe_lab::End::A, bin());
    c.args(["copy", "--port", &port.to_string()]).args(args);
    c
}

/// True when the test may use root-only facilities. Outside CI a test without
/// root skips with a message; in CI (CI=true) missing root is a failure,
/// because lab tests must run there.
pub fn need_root(test: &str) -> bool {
    let root = fatpipe_sys::process::is_root();
    if root {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: needs root (network namespaces, TUN) and CI must run it as root");
    }
    eprintln!("skipping {test}: needs root for network namespaces and TUN devices");
    false
}

/// A test that cannot run on this host says why and returns (the caller
/// returns after this); in CI (CI=true) it fails instead, since CI installs
/// everything the tests need and must run them all.
pub fn skip(why: &str) {
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("cannot run here, and CI must: {why}");
    }
    eprintln!("skipping: {why}");
}

/// Creates `p` and its parents; returns it.
pub fn mkdir(p: &Path) -> PathBuf {
    std::fs::create_dir_all(p).unwrap();
    p.to_path_buf()
}

/// Fast pseudo-random bytes (xorshift64*), so data is neither zeros nor
/// repetitive.
pub fn random_file(path: &Path, len: u64, seed: u64) {
    let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path).unwrap());
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        for w in buf.chunks_exact_mut(8) {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            w.copy_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n]).unwrap();
        left -= n as u64;
    }
    f.flush().unwrap();
}

/// What a copy must reproduce, per relative path: kind, mode, mtime (files),
/// size and a content digest, link targets. Leftover temporaries show up too.
pub fn digest_tree(root: &Path) -> BTreeMap<String, String> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for p in names {
            let rel = p.strip_prefix(base).unwrap().to_string_lossy().into_owned();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let desc = if m.file_type().is_symlink() {
                format!("link -> {}", std::fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                walk(base, &p, out);
                format!("dir {:o}", m.mode() & 0o7777)
            } else {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                let mut f = std::fs::File::open(&p).unwrap();
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let n = f.read(&mut buf).unwrap();
                    if n == 0 {
                        break;
                    }
                    h.write(&buf[..n]);
                }
                format!(
                    "file {:o} {}.{:09} {} {:016x}",
                    m.mode() & 0o7777,
                    m.mtime(),
                    m.mtime_nsec(),
                    m.len(),
                    h.finish()
                )
            };
            out.insert(rel, desc);
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// Panics with the differing entries unless the trees under `a` and `b`
/// digest alike (see [`digest_tree`]).
pub fn assert_same_tree(a: &Path, b: &Path) {
    let (da, db) = (digest_tree(a), digest_tree(b));
    if da != db {
        let mut diff = String::new();
        for k in da.keys().chain(db.keys()) {
            if da.get(k) != db.get(k) {
                diff.push_str(&format!("  {k}: {:?} vs {:?}\n", da.get(k), db.get(k)));
            }
        }
        panic!("trees differ ({} vs {}):\n{diff}", a.display(), b.display());
    }
}

/// The command's stdout as JSON (panics with stdout and stderr if it is not).
pub fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Waits until `cond` holds (or panics after `limit`).
pub fn wait_for(limit: Duration, what: &str, cond: impl FnMut() -> bool) {
    assert!(within(limit, cond), "timed out waiting for {what}");
}

/// True once `cond` holds, false if it still does not after `limit`.
/// Where no event announces a state (a file's size, a listening port, a
/// process gone), this is how a test waits for it: a check every 10 ms
/// with a deadline. It is the suite's one poll; every other wait is on a
/// line, a channel or a pidfd.
pub fn within(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        // The poll interval of a condition with a deadline (see above).
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// True once some chunks of an in-flight file are journaled under `dir`.
pub fn journal_has_records(dir: &Path) -> bool {
    journal_records(dir) > 3
}

/// The most chunk records any journal directly under `dir` holds (the
/// journal: a 36-byte header, then 41 bytes per verified chunk).
pub fn journal_records(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".journal"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len().saturating_sub(36) / 41)
        .max()
        .unwrap_or(0)
}

/// Files under their final names in `dest` (and their bytes): what a
/// killed or failed run had completed. Each must already equal its source
/// (a final name never holds a partial file); temporaries are left out.
pub fn complete_files(src: &Path, dest: &Path) -> (u64, u64) {
    let (mut n, mut bytes) = (0, 0);
    let mine = digest_tree(src);
    for (rel, desc) in digest_tree(dest) {
        if !desc.starts_with("file") || rel.contains(".fatpipe-") {
            continue;
        }
        assert_eq!(
            mine.get(&rel),
            Some(&desc),
            "{rel}: a final name holds a partial file"
        );
        n += 1;
        bytes += std::fs::metadata(dest.join(&rel)).unwrap().len();
    }
    (n, bytes)
}

/// Writes a pre-shared key file the way `fatpipe key new` does: mode 0600
/// from its creation (the server and clients refuse one others can read).
pub fn write_key(path: impl AsRef<std::path::Path>, text: &str) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = path.as_ref();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .unwrap_or_else(|e| panic!("create key {}: {e}", path.display()));
    f.write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("write key {}: {e}", path.display()));
}

/// A command's stderr as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// True when `tool` is on PATH.
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A loopback port nothing listens on right now, for TCP and UDP (bound,
/// then released for the process under test to take).
pub fn free_port() -> u16 {
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        if std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}
