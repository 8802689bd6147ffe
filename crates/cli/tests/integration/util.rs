//! Shared harness: a temp dir per test, the binary under test, process guards.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// The fatpipe binary Cargo built for these tests.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fatpipe"))
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

/// Runs a command and returns its output, whatever its exit status.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("spawn fatpipe")
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
    cmd.stdout(Stdio::piped()).stderr(Stdio::null());
    let mut child = cmd.spawn().expect("spawn fatpipe server");
    let stdout = child.stdout.take().expect("server stdout");
    let guard = Guard(child);
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the server's first line");
    let port = line
        .trim()
        .strip_prefix("listening on ")
        .and_then(|a| a.rsplit_once(':'))
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"));
    (guard, port)
}

/// True when the test may use root-only facilities. Outside CI a test without
/// root skips with a message; in CI (CI=true) missing root is a failure,
/// because lab tests must run there.
pub fn need_root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc_geteuid() } == 0;
    if root {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: needs root (network namespaces, TUN) and CI must run it as root");
    }
    eprintln!("skipping {test}: needs root for network namespaces and TUN devices");
    false
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}
