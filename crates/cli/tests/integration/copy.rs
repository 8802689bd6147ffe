//! `fatpipe copy` against a real `fatpipe server` on loopback.
//!
//! Every test starts its own server (`--port 0`, the port read from its
//! first stdout line) with exports in the test's temp dir, runs the real
//! client, and compares source and destination trees by content digest,
//! size, mode, mtime and link target. The big-file test uses 256 MiB by
//! default and the full 2 GiB with `FATPIPE_BIG_TESTS=1`.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{
    self, assert_exit, assert_same_tree, journal_has_records, json, mkdir, random_file, wait_for,
    Dir, Guard,
};

/// A running server and what a client needs to reach it.
struct Server {
    guard: Guard,
    port: u16,
    key: PathBuf,
}

impl Server {
    /// `fatpipe copy` with the port and key of this server.
    fn copy(&self, dir: &Dir) -> Command {
        let mut c = dir.cmd();
        c.arg("copy")
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--key-file")
            .arg(&self.key);
        c
    }

    fn kill(mut self) {
        let _ = self.guard.0.kill();
        let _ = self.guard.0.wait();
    }
}

fn key_file(dir: &Dir) -> PathBuf {
    let key = dir.path().join("key");
    if !key.exists() {
        crate::util::write_key(&key, "copy-test-key-0123456789\n");
    }
    key
}

/// Starts `fatpipe server` with `exports` (NAME=DIR...) on `port` (0: any).
fn server_on(dir: &Dir, exports: &[String], port: u16, env: &[(&str, &str)]) -> Server {
    let key = key_file(dir);
    let mut c = Command::new(util::bin());
    c.current_dir(dir.path())
        .args(["server", "--bind", "127.0.0.1", "--port", &port.to_string()])
        .arg("--key-file")
        .arg(&key)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for e in exports {
        c.arg("--export").arg(e);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.spawn().expect("spawn server");
    let stdout = child.stdout.take().expect("server stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read server's first line");
    let port = line
        .trim()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    Server {
        guard: Guard(child),
        port,
        key,
    }
}

fn server(dir: &Dir, exports: &[String]) -> Server {
    server_on(dir, exports, 0, &[])
}

fn export(name: &str, path: &Path) -> String {
    format!("{name}={}", path.display())
}

/// The awkward cases in one tree.
fn odd_tree(root: &Path) -> PathBuf {
    let t = mkdir(&root.join("tree"));
    mkdir(&t.join("empty dir"));
    let deep = mkdir(&t.join("ünï cödé/ｗｉｄｅ/deeper"));
    std::fs::write(deep.join("small file.txt"), b"hello world\n").unwrap();
    std::fs::write(t.join("zero length"), b"").unwrap();
    std::fs::write(t.join("ä".repeat(127)), b"a 254-byte name").unwrap();
    random_file(&t.join("multi chunk.bin"), 5 << 20, 1);
    let sparse = std::fs::File::create(t.join("sparse")).unwrap();
    sparse.set_len(64 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&sparse, b"data in the middle", 20 << 20).unwrap();
    symlink("ünï cödé/ｗｉｄｅ", t.join("link inside")).unwrap();
    symlink("/etc/hostname", t.join("link outside")).unwrap();
    std::fs::set_permissions(
        t.join("zero length"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::set_permissions(
        deep.join("small file.txt"),
        std::fs::Permissions::from_mode(0o751),
    )
    .unwrap();
    t
}

#[test]
fn push_and_pull_a_tree_with_odd_names() {
    let dir = util::setup();
    let src = odd_tree(&mkdir(&dir.path().join("src")));
    let exp = mkdir(&dir.path().join("export"));
    let srv = server(&dir, &[export("data", &exp)]);

    let out = util::run(
        srv.copy(&dir)
            .args(["-r", "--json", "-P", "3", "--chunk-size", "1M"])
            .arg(&src)
            .arg("127.0.0.1:data/"),
    );
    assert_exit(&out, 0);
    let j = json(&out);
    assert_eq!(j["schema"], "fatpipe.copy");
    assert_eq!(j["direction"], "push");
    assert_eq!(j["files_total"], 5);
    assert_eq!(j["files_verified"], 5);
    assert_eq!(j["files_failed"], 0);
    assert_same_tree(&src, &exp.join("tree"));
    let sparse = std::fs::metadata(exp.join("tree/sparse")).unwrap();
    assert!(sparse.blocks() * 512 < 8 << 20, "holes were filled");

    // A second run finds everything up to date and moves nothing.
    let out = util::run(
        srv.copy(&dir)
            .args(["-r", "--json"])
            .arg(&src)
            .arg("127.0.0.1:data/"),
    );
    assert_exit(&out, 0);
    let j = json(&out);
    assert_eq!(
        (j["files_skipped"].as_u64(), j["bytes_transferred"].as_u64()),
        (Some(5), Some(0))
    );

    // Pull its contents back under a new name, with BLAKE3.
    let back = dir.path().join("back");
    let out = util::run(
        srv.copy(&dir)
            .args(["-r", "-q", "--verify", "strong", "127.0.0.1:data/tree/"])
            .arg(&back),
    );
    assert_exit(&out, 0);
    assert_same_tree(&src, &back);
}

#[test]
fn twenty_thousand_small_files() {
    let dir = util::setup();
    let src = mkdir(&dir.path().join("small"));
    let payload: Vec<u8> = (0..16_384u32).map(|i| (i * 31 % 251) as u8).collect();
    for d in 0..20 {
        let sub = mkdir(&src.join(format!("d{d:02}/inner")));
        for f in 0..1000 {
            let mut p = payload.clone();
            p[..8].copy_from_slice(&((d * 1000 + f) as u64).to_le_bytes());
            std::fs::write(sub.join(format!("f{f:04}")), &p).unwrap();
        }
    }
    let exp = mkdir(&dir.path().join("export"));
    let srv = server(&dir, &[export("data", &exp)]);
    let t = Instant::now();
    let out = util::run(
        srv.copy(&dir)
            .args(["-r", "--json"])
            .arg(&src)
            .arg("127.0.0.1:data"),
    );
    assert_exit(&out, 0);
    let j = json(&out);
    assert_eq!(j["files_verified"], 20_000);
    eprintln!(
        "20,000 x 16 KiB pushed in {:?} ({} files/s)",
        t.elapsed(),
        j["files_per_sec"]
    );
    assert_same_tree(&src, &exp.join("small"));
}

#[test]
fn big_file_push_and_pull() {
    let big = std::env::var("FATPIPE_BIG_TESTS").as_deref() == Ok("1");
    let size: u64 = if big { 2 << 30 } else { 256 << 20 };
    let dir = util::setup();
    let src = mkdir(&dir.path().join("src"));
    random_file(&src.join("big.bin"), size, 42);
    let exp = mkdir(&dir.path().join("export"));
    let srv = server(&dir, &[export("data", &exp)]);
    let out = util::run(
        srv.copy(&dir)
            .arg("--json")
            .arg(src.join("big.bin"))
            .arg("127.0.0.1:data/big.bin"),
    );
    assert_exit(&out, 0);
    let j = json(&out);
    assert_eq!(j["bytes_transferred"].as_u64(), Some(size));
    eprintln!(
        "{} MiB pushed at {} bit/s via {}",
        size >> 20,
        j["rate"],
        j["io_local"]
    );
    let back = mkdir(&dir.path().join("back"));
    let out = util::run(
        srv.copy(&dir)
            .arg("-q")
            .arg("127.0.0.1:data/big.bin")
            .arg(&back),
    );
    assert_exit(&out, 0);
    assert_same_tree(&src, &back);
    assert_same_tree(&src, &exp);
}

/// Starts a push of `src` throttled to ~40 MB/s (so a kill lands mid-file)
/// with `args`, waits until the receiver has journaled `records` chunks
/// (at least 4), and kills the client (SIGKILL).
fn push_killed_mid_file(
    dir: &Dir,
    srv: &Server,
    src: &Path,
    exp: &Path,
    args: &[&str],
    records: u64,
) {
    let mut c = srv.copy(dir);
    c.args(["-r", "-q", "--bwlimit", "320M"])
        .args(args)
        .arg(src)
        .arg("127.0.0.1:data/")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    wait_for(Duration::from_secs(20), "journaled chunks", || {
        util::journal_records(&exp.join("src")) >= records.max(4)
    });
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
}

/// Runs the killed push again with `args` to completion and returns its
/// JSON, having checked the tree arrived whole (a journal or part left
/// behind fails the compare too).
fn rerun_push(dir: &Dir, srv: &Server, src: &Path, exp: &Path, args: &[&str]) -> serde_json::Value {
    let out = util::run(
        srv.copy(dir)
            .args(["-r", "--json"])
            .args(args)
            .arg(src)
            .arg("127.0.0.1:data/"),
    );
    assert_exit(&out, 0);
    assert_same_tree(src, &exp.join("src"));
    json(&out)
}

#[test]
fn resume_after_sigkill_of_the_client() {
    let dir = util::setup();
    let src = mkdir(&dir.path().join("src"));
    random_file(&src.join("f.bin"), 96 << 20, 7);
    std::fs::write(src.join("small"), b"small").unwrap();
    let exp = mkdir(&dir.path().join("export"));
    let srv = server(&dir, &[export("data", &exp)]);
    let args = ["--chunk-size", "1M"];
    push_killed_mid_file(&dir, &srv, &src, &exp, &args, 4);
    assert!(
        !exp.join("src/f.bin").exists(),
        "a partial file is under its final name"
    );

    let j = rerun_push(&dir, &srv, &src, &exp, &args);
    let moved = j["bytes_transferred"].as_u64().unwrap();
    assert!(
        moved < 96 << 20,
        "the re-run sent everything again ({moved} bytes)"
    );
}

/// An auto-tuned copy's chunk size follows the path, so a re-run may cut
/// the file differently: the receiver keeps what the old journal verified
/// (cut at 512 KiB) in the new cut (2 MiB) rather than sending it again.
#[test]
fn resume_keeps_verified_data_when_the_chunk_size_changes() {
    let dir = util::setup();
    let src = mkdir(&dir.path().join("src"));
    random_file(&src.join("f.bin"), 96 << 20, 13);
    let exp = mkdir(&dir.path().join("export"));
    let srv = server(&dir, &[export("data", &exp)]);
    // 40 chunks of 512 KiB (20 MiB): several whole 2 MiB runs of them.
    let args = ["--chunk-size", "512K"];
    push_killed_mid_file(&dir, &srv, &src, &exp, &args, 40);
    let j = rerun_push(&dir, &srv, &src, &exp, &["--chunk-size", "2M"]);
    assert_eq!(j["chunk_size"].as_u64(), Some(2 << 20));
    let moved = j["bytes_transferred"].as_u64().unwrap();
    assert!(
        moved <= (96 << 20) - (4 << 20),
        "the re-run kept less than two new chunks ({moved} bytes sent)"
    );
}

/// `--sync` journals chunks only after a grouped flush: a synced copy
/// killed mid-file has journaled (flushed) chunks, and the re-run resumes
/// from them.
#[test]
fn synced_copy_journals_flushed_groups_and_resumes_after_sigkill() {
    let dir = util::setup();
    let src = mkdir(&dir.path().join("src"));
    random_file(&src.join("f.bin"), 96 << 20, 11);
    let exp = mkdir(&dir.path().join("export"));
    let srv = server(&dir, &[export("data", &exp)]);
    let args = ["--sync", "--chunk-size", "1M"];
    push_killed_mid_file(&dir, &srv, &src, &exp, &args, 4);
    let moved = rerun_push(&dir, &srv, &src, &exp, &args)["bytes_transferred"]
        .as_u64()
        .unwrap();
    assert!(
        moved < 96 << 20,
        "the re-run sent everything again ({moved} bytes)"
    );
}

#[test]
fn resume_after_sigkill_of_the_server() {
    let dir = util::setup();
    let src = mkdir(&dir.path().join("src"));
    random_file(&src.join("f.bin"), 96 << 20, 9);
    let exp = mkdir(&dir.path().join("export"));
    let exports = [export("data", &exp)];
    let srv = server(&dir, &exports);
    let port = srv.port;
    let mut c = srv.copy(&dir);
    c.args([
        "--json",
        "--chunk-size",
        "1M",
        "--bwlimit",
        "320M",
        "--retries",
        "20",
    ])
    .arg(src.join("f.bin"))
    .arg("127.0.0.1:data/f.bin")
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let child = c.spawn().unwrap();
    wait_for(Duration::from_secs(20), "a journal", || {
        journal_has_records(&exp)
    });
    srv.kill(); // SIGKILL
    assert!(!exp.join("f.bin").exists());
    // The client keeps retrying; a new server on the same port lets it finish.
    let _srv2 = server_on(&dir, &exports, port, &[]);
    let out = child.wait_with_output().unwrap();
    assert_exit(&out, 0);
    let j = json(&out);
    assert!(j["reconnects"].as_u64().unwrap() >= 1, "{j}");
    assert_same_tree(&src, &exp);
}

// The hook exists only in builds with the `test-hooks` feature (test.sh
// turns it on); without it the next test shows the variable is ignored.
#[cfg(feature = "test-hooks")]
#[test]
fn corrupted_chunk_is_detected_and_resent() {
    let dir = util::setup();
    let src = mkdir(&dir.path().join("src"));
    random_file(&src.join("f.bin"), 10 << 20, 3);
    let exp = mkdir(&dir.path().join("export"));
    let srv = server_on(
        &dir,
        &[export("data", &exp)],
        0,
        &[("FATPIPE_TEST_CORRUPT_CHUNK", "4")],
    );
    // Push: the client sends, so the hook goes on the client.
    let out = util::run(
        srv.copy(&dir)
            .env("FATPIPE_TEST_CORRUPT_CHUNK", "2")
            .args(["--json", "--chunk-size", "1M"])
            .arg(src.join("f.bin"))
            .arg("127.0.0.1:data/"),
    );
    assert_exit(&out, 0);
    assert_eq!(json(&out)["chunks_resent"], 1);
    assert_same_tree(&src, &exp);
    // Pull: the server sends, and its hook fires.
    let back = mkdir(&dir.path().join("back"));
    let out = util::run(
        srv.copy(&dir)
            .args(["--json", "--chunk-size", "1M", "127.0.0.1:data/f.bin"])
            .arg(&back),
    );
    assert_exit(&out, 0);
    assert_eq!(json(&out)["chunks_resent"], 1);
    assert_same_tree(&src, &back);
}

/// What `cargo build --release` makes: the test hooks are not compiled in,
/// so a server and a client given them copy as usual, auto-tuning included.
/// Built with the hooks, these tests run it only when asked to
/// (`--run-ignored`) and only against a binary built without them, named
/// by `FATPIPE_BIN` (test.sh's last test stage).
#[test]
#[cfg_attr(
    feature = "test-hooks",
    ignore = "needs a fatpipe built without the test hooks: FATPIPE_BIN=PATH, as test.sh runs it"
)]
fn test_hooks_are_ignored_without_the_feature() {
    if cfg!(feature = "test-hooks") {
        assert!(
            std::env::var_os("FATPIPE_BIN").is_some_and(|p| !p.is_empty()),
            "these tests have the test hooks: set FATPIPE_BIN to a fatpipe built without them"
        );
    }
    let dir = util::setup();
    let src = mkdir(&dir.path().join("src"));
    random_file(&src.join("f.bin"), 10 << 20, 3);
    let exp = mkdir(&dir.path().join("export"));
    let srv = server_on(
        &dir,
        &[export("data", &exp)],
        0,
        &[("FATPIPE_TEST_CORRUPT_CHUNK", "4")],
    );
    let hooked = |c: &mut Command| {
        c.env("FATPIPE_TEST_CORRUPT_CHUNK", "2")
            .env("FATPIPE_TEST_COPY_STREAMS", "1")
            .env("FATPIPE_TEST_COPY_ADD", "3@1")
            .args(["--json", "--chunk-size", "1M"]);
    };
    // The rate cap keeps the push running (~4 s) past the adjuster's
    // first sample, where a leaked FATPIPE_TEST_COPY_ADD would add streams
    // and record a "test hook" decision.
    let mut push = srv.copy(&dir);
    hooked(&mut push);
    let out = util::run(
        push.args(["--bwlimit", "20M"])
            .arg(src.join("f.bin"))
            .arg("127.0.0.1:data/"),
    );
    assert_exit(&out, 0);
    let j = json(&out);
    // Auto-tuned and adjusting, so the in-flight tuner did run.
    assert_eq!(j["auto"]["adjusting"], true, "{j}");
    let decisions = j["auto"]["decisions"].as_array().map_or(0, Vec::len);
    assert!(
        !j.to_string().contains("test hook") && decisions == 0,
        "{j}"
    );
    assert!(!j.to_string().contains("FATPIPE_TEST_"), "{j}");
    assert_eq!(j["chunks_resent"], 0, "{j}");
    assert_same_tree(&src, &exp);
    let back = mkdir(&dir.path().join("back"));
    let mut pull = srv.copy(&dir);
    hooked(&mut pull);
    let out = util::run(pull.arg("127.0.0.1:data/f.bin").arg(&back));
    assert_exit(&out, 0);
    let j = json(&out);
    assert_eq!(j["chunks_resent"], 0, "{j}");
    assert_same_tree(&src, &back);
}

#[test]
fn escapes_wrong_keys_and_read_only_are_refused() {
    let dir = util::setup();
    let outside = mkdir(&dir.path().join("outside"));
    std::fs::write(outside.join("secret"), b"secret").unwrap();
    let exp = mkdir(&dir.path().join("export"));
    symlink(&outside, exp.join("out")).unwrap();
    let ro = mkdir(&dir.path().join("ro"));
    std::fs::write(ro.join("readme"), b"public data").unwrap();
    let src = mkdir(&dir.path().join("src"));
    std::fs::write(src.join("f"), b"x").unwrap();
    let srv = server(
        &dir,
        &[export("data", &exp), format!("{}:ro", export("pub", &ro))],
    );

    for dest in [
        "127.0.0.1:data/../x",
        "127.0.0.1:data/out/x",
        "127.0.0.1:data/out/",
    ] {
        let out = util::run(srv.copy(&dir).arg(src.join("f")).arg(dest));
        assert_exit(&out, 2);
    }
    for from in [
        "127.0.0.1:data/out/secret",
        "127.0.0.1:data/../outside/secret",
    ] {
        let out = util::run(srv.copy(&dir).arg(from).arg(dir.path().join("got")));
        assert_exit(&out, 2);
    }
    assert!(!outside.join("x").exists() && !dir.path().join("got").exists());

    let out = util::run(srv.copy(&dir).arg(src.join("f")).arg("127.0.0.1:pub/"));
    assert_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("read-only"));
    assert!(!ro.join("f").exists());
    // Reading a read-only export is fine.
    let out = util::run(
        srv.copy(&dir)
            .arg("127.0.0.1:pub/readme")
            .arg(dir.path().join("readme")),
    );
    assert_exit(&out, 0);

    let bad = dir.path().join("bad-key");
    crate::util::write_key(&bad, "not-the-right-key-at-all");
    let out = util::run(
        dir.cmd()
            .args(["copy", "--port", &srv.port.to_string(), "--key-file"])
            .arg(&bad)
            .arg(src.join("f"))
            .arg("127.0.0.1:data/"),
    );
    assert_exit(&out, 2);
    assert!(!exp.join("f").exists());

    let out = util::run(srv.copy(&dir).arg(src.join("f")).arg("127.0.0.1:nope/"));
    assert_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no export named"));
}

/// The tree the kill-and-rerun tests copy: one 24 MiB file first (in send
/// order), then 300 small files of about 12 KB (batches of up to a 1 MiB
/// chunk: 4 units), a symlink and an empty directory.
/// The resume tree's big file, sent first (its name sorts first).
#[cfg(feature = "test-hooks")]
const BIG: u64 = 24 << 20;

#[cfg(feature = "test-hooks")]
fn resume_tree(root: &Path) -> PathBuf {
    let t = mkdir(&root.join("src"));
    random_file(&t.join("a-big.bin"), BIG, 11);
    let small = mkdir(&t.join("b-small"));
    for i in 0..300u32 {
        std::fs::write(
            small.join(format!("f{i:03}")),
            format!("{i:03}").repeat(4000 + i as usize),
        )
        .unwrap();
    }
    mkdir(&t.join("c-empty"));
    symlink("a-big.bin", t.join("d-link")).unwrap();
    t
}

/// Issue 16: a copy killed (SIGKILL, by PID) at `stall` (a
/// FATPIPE_TEST_STALL phase, reached by the client or the server as
/// `on_server` says) and the identical command run again: the same tree
/// in the same place, nothing complete sent twice, nothing stray left. A
/// server that stalled is killed and started again on its port, so no
/// stalled session of it outlives the kill.
#[cfg(feature = "test-hooks")]
fn kill_at_and_rerun(push: bool, stall: &str, on_server: bool) {
    let dir = util::setup();
    let src = resume_tree(dir.path());
    let exp = mkdir(&dir.path().join("export"));
    let mark = dir.path().join("stalled");
    let mark_s = mark.display().to_string();
    let exports = [export("data", &exp)];
    let hook = [
        ("FATPIPE_TEST_STALL", stall),
        ("FATPIPE_TEST_STALL_MARK", mark_s.as_str()),
    ];
    let srv = server_on(&dir, &exports, 0, if on_server { &hook } else { &[] });
    // The issue's commands: a directory's contents to a name that the
    // first run creates and the rerun finds.
    let (dest, args): (PathBuf, [String; 2]) = if push {
        (
            exp.join("t"),
            [format!("{}/", src.display()), "127.0.0.1:data/t".into()],
        )
    } else {
        std::fs::rename(&src, exp.join("dir")).unwrap();
        let local = dir.path().join("local/t");
        mkdir(local.parent().unwrap());
        (
            local.clone(),
            ["127.0.0.1:data/dir/".into(), local.display().to_string()],
        )
    };
    let src = if push { src } else { exp.join("dir") };
    let command = |c: &mut Command| {
        c.args([
            "-r",
            "--json",
            "-P",
            "2",
            "--chunk-size",
            "1M",
            "--retries",
            "0",
        ])
        .args(&args);
    };
    let mut first = srv.copy(&dir);
    command(&mut first);
    first.stdout(Stdio::null()).stderr(Stdio::null());
    if !on_server {
        first.envs(hook);
    }
    let mut child = first.spawn().unwrap();
    wait_for(
        Duration::from_secs(30),
        &format!("the stall at {stall}"),
        || mark.exists(),
    );
    child.kill().unwrap(); // SIGKILL, by PID
    child.wait().unwrap();
    let _srv = if on_server {
        let port = srv.port;
        srv.kill();
        server_on(&dir, &exports, port, &[])
    } else {
        srv
    };
    let (done_files, done_bytes) = if dest.exists() {
        util::complete_files(&src, &dest)
    } else {
        (0, 0)
    };

    let mut again = _srv.copy(&dir);
    command(&mut again);
    let out = util::run(&mut again);
    assert_exit(&out, 0);
    let j = json(&out);
    assert_same_tree(&src, &dest);
    let total = j["bytes_total"].as_u64().unwrap();
    let moved = j["bytes_transferred"].as_u64().unwrap();
    let skipped = j["files_skipped"].as_u64().unwrap();
    eprintln!(
        "{} killed at {stall}: {done_files} files ({done_bytes} B) were complete; \
         the rerun skipped {skipped} and moved {moved} of {total} B",
        if push { "push" } else { "pull" }
    );
    assert!(
        skipped >= done_files && moved + done_bytes <= total,
        "{stall}: {done_files} files ({done_bytes} bytes) were complete, yet the rerun \
         skipped {skipped} and moved {moved} of {total}"
    );
    assert_eq!(
        j["files_verified"].as_u64().unwrap() + skipped,
        j["files_total"].as_u64().unwrap(),
        "{j}"
    );
    let mid_big = stall
        .strip_prefix("bytes=")
        .and_then(|n| n.parse::<u64>().ok())
        .is_some_and(|n| n < BIG);
    if mid_big {
        // Killed mid big file: its journaled chunks are not sent again.
        assert!(
            moved < total - done_bytes,
            "{stall}: the big file was sent whole again"
        );
    }
}

#[cfg(feature = "test-hooks")]
#[test]
fn issue_16_push_killed_anywhere_resumes_in_place() {
    // During the manifest, mid big file (12 of 24 MiB), mid small files,
    // and during the server's renames (the server is killed there too).
    kill_at_and_rerun(true, "manifest", false);
    kill_at_and_rerun(true, "bytes=12582912", false);
    kill_at_and_rerun(true, &format!("bytes={}", BIG + (3 << 19)), false);
    kill_at_and_rerun(true, "rename=100", true);
}

#[cfg(feature = "test-hooks")]
#[test]
fn issue_16_pull_killed_anywhere_resumes_in_place() {
    // The server sends: it stalls during the manifest and mid data; the
    // client renames, and stalls there.
    kill_at_and_rerun(false, "manifest", true);
    kill_at_and_rerun(false, "bytes=12582912", true);
    kill_at_and_rerun(false, &format!("bytes={}", BIG + (3 << 19)), true);
    kill_at_and_rerun(false, "rename=100", false);
}

/// Issue 16: a FIFO, a socket-free special and hard links are reported the
/// same way by a push and a pull: one summary line, `skipped` and
/// `hard_links` in the JSON, exit 0, and the links arrive as separate files.
#[test]
fn issue_16_skipped_fifos_and_hard_links_are_said_both_ways() {
    let dir = util::setup();
    let src = mkdir(&dir.path().join("src"));
    std::fs::write(src.join("a"), b"linked data").unwrap();
    mkdir(&src.join("sub"));
    std::fs::hard_link(src.join("a"), src.join("sub/b")).unwrap();
    let fifo = Command::new("mkfifo")
        .arg(src.join("pipe"))
        .status()
        .unwrap();
    assert!(fifo.success());
    let exp = mkdir(&dir.path().join("export"));
    // The pull reads the original tree (a pushed copy has no FIFO or link).
    let srv = server(&dir, &[export("data", &exp), export("orig", &src)]);
    let back = dir.path().join("back");
    for push in [true, false] {
        let mut c = srv.copy(&dir);
        if push {
            c.args(["-r"]).arg(&src).arg("127.0.0.1:data/");
        } else {
            c.args(["-r", "127.0.0.1:orig/"]).arg(&back);
        }
        let text = util::run(&mut c);
        assert_exit(&text, 0);
        let out = String::from_utf8_lossy(&text.stdout);
        let line = out
            .lines()
            .find(|l| l.contains("skipped"))
            .unwrap_or_else(|| panic!("push {push}: no line on what was skipped:\n{out}"));
        assert!(
            line.contains("skipped 1 special file(s), not copied: src/pipe (FIFO)")
                || line.contains("skipped 1 special file(s), not copied: pipe (FIFO)"),
            "{line}"
        );
        assert!(
            line.contains("1 hard link(s) arrived as separate files"),
            "{line}"
        );
        // The JSON says the same, and a rerun says it again.
        let j = json(&util::run(c.arg("--json")));
        assert_eq!(j["skipped"][0]["detail"], "FIFO", "{j}");
        assert_eq!(j["hard_links"].as_array().map(Vec::len), Some(1), "{j}");
        assert_eq!(j["problems"].as_array().map(Vec::len), Some(0), "{j}");
    }
    let pushed = exp.join("src");
    for d in [&pushed, &back] {
        assert!(!d.join("pipe").exists());
        let (a, b) = (
            std::fs::metadata(d.join("a")).unwrap(),
            std::fs::metadata(d.join("sub/b")).unwrap(),
        );
        assert_ne!(a.ino(), b.ino(), "{}: hard link kept", d.display());
        assert_eq!(std::fs::read(d.join("sub/b")).unwrap(), b"linked data");
    }
}

/// Issue 16: what a user reads when the server is killed mid-copy and
/// cannot be reached again: that the server went away (not "failed to
/// fill whole buffer"), each OS error once, and with stderr in a file no
/// terminal codes on the reconnect lines.
#[test]
fn issue_16_a_server_that_went_away_is_named_so() {
    for retries in ["0", "1"] {
        let dir = util::setup();
        let src = mkdir(&dir.path().join("src"));
        random_file(&src.join("f.bin"), 96 << 20, 5);
        let exp = mkdir(&dir.path().join("export"));
        let srv = server(&dir, &[export("data", &exp)]);
        let log = std::fs::File::create(dir.path().join("stderr")).unwrap();
        let mut c = srv.copy(&dir);
        c.args(["-P", "2", "--chunk-size", "1M", "--bwlimit", "320M"])
            .args(["--retries", retries])
            .arg(src.join("f.bin"))
            .arg("127.0.0.1:data/")
            .stdout(Stdio::null())
            .stderr(log);
        let mut child = c.spawn().unwrap();
        wait_for(Duration::from_secs(20), "a journal", || {
            journal_has_records(&exp)
        });
        srv.kill(); // SIGKILL
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(1));
        let err = std::fs::read_to_string(dir.path().join("stderr")).unwrap();
        assert!(err.contains("the server went away"), "{err}");
        assert!(!err.contains("fill whole buffer"), "{err}");
        assert!(!err.contains('\x1b') && !err.contains('\r'), "{err:?}");
        for line in err.lines() {
            assert!(line.matches("os error").count() <= 1, "{line}");
        }
        if retries == "1" {
            assert!(err.contains("reconnecting"), "{err}");
        }
    }
}

/// Issue 16: `fatpipe test` and `copy` against a closed port say
/// "Connection refused" once per line.
#[test]
fn issue_16_a_refused_connection_is_said_once() {
    let dir = util::setup();
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = util::run(
        dir.cmd()
            .args(["test", "127.0.0.1", "-p", &port.to_string(), "-t", "1s"]),
    );
    assert_exit(&out, 1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Connection refused"), "{err}");
    for line in err.lines() {
        assert!(line.matches("Connection refused").count() <= 1, "{line}");
    }
    let out = util::run(
        dir.cmd()
            .args(["copy", "--retries", "0", "-p", &port.to_string()])
            .arg(util::bin())
            .arg("127.0.0.1:data/"),
    );
    assert_exit(&out, 1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach the server"), "{err}");
    for line in err.lines() {
        assert!(line.matches("Connection refused").count() <= 1, "{line}");
    }
}

/// Issue 16: a sparse file's holes are not bytes moved: the JSON counts
/// the data and its rate is a rate the machine can reach.
#[test]
fn issue_16_holes_are_not_counted_as_bytes_moved() {
    let dir = util::setup();
    let src = mkdir(&dir.path().join("src"));
    let f = std::fs::File::create(src.join("sparse")).unwrap();
    f.set_len(16 << 30).unwrap(); // 16 GiB, one data block
    std::os::unix::fs::FileExt::write_all_at(&f, b"data", 10 << 30).unwrap();
    drop(f);
    let exp = mkdir(&dir.path().join("export"));
    let srv = server(&dir, &[export("data", &exp)]);
    for pull in [false, true] {
        let mut c = srv.copy(&dir);
        c.args(["--json", "-P", "2"]);
        if pull {
            c.arg("127.0.0.1:data/sparse").arg(dir.path().join("back"));
        } else {
            c.arg(src.join("sparse")).arg("127.0.0.1:data/");
        }
        let out = util::run(&mut c);
        assert_exit(&out, 0);
        let j = json(&out);
        let (moved, rate) = (
            j["bytes_transferred"].as_u64().unwrap(),
            j["rate"].as_u64().unwrap(),
        );
        // The data (8 MiB at most: a chunk or a few), not 16 GiB.
        assert!(moved > 0 && moved <= 8 << 20, "pull {pull}: {j}");
        assert!(rate < 100_000_000_000, "pull {pull}: {rate} bit/s");
    }
    // Size, the data where it was, holes still holes (not read whole).
    for copy in [exp.join("sparse"), dir.path().join("back")] {
        let f = std::fs::File::open(&copy).unwrap();
        let m = f.metadata().unwrap();
        assert_eq!(m.len(), 16 << 30);
        assert!(
            m.blocks() * 512 < 64 << 20,
            "{}: holes filled",
            copy.display()
        );
        let mut got = [0u8; 4];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut got, 10 << 30).unwrap();
        assert_eq!(&got, b"data");
    }
}

/// Issue 16: a pull whose paths would be too long under the destination's
/// name. rsync's rule keeps a directory's paths as they are (it goes inside
/// the destination, never renamed), so a tree 4,000 bytes deep copies;
/// one file given a name the destination cannot take is refused with a
/// line naming both.
#[test]
fn issue_16_a_path_too_long_for_the_destination_is_named() {
    let dir = util::setup();
    let exp = mkdir(&dir.path().join("export"));
    // "d/" then 20 components of 200 bytes: 4,021 bytes, under the 4,096
    // a path may have; renamed to a 250-byte name it would be over.
    let comp = "c".repeat(200);
    let mut deep = PathBuf::from("d");
    for _ in 0..20 {
        deep.push(&comp);
    }
    mkdir(&exp.join(&deep));
    std::fs::write(exp.join(&deep).join("f"), b"deep").unwrap();
    let srv = server(&dir, &[export("data", &exp)]);
    let long = "n".repeat(250);
    let dest = mkdir(&dir.path().join("local")).join(&long);
    let out = util::run(
        srv.copy(&dir)
            .args(["-r", "--json", "127.0.0.1:data/d"])
            .arg(&dest),
    );
    assert_exit(&out, 0);
    assert_eq!(json(&out)["files_verified"], 1);
    // Read it relative to the destination: its absolute path is longer
    // than the kernel takes in one call.
    let cat = Command::new("cat")
        .arg(deep.join("f"))
        .current_dir(&dest)
        .output()
        .unwrap();
    assert_eq!(cat.stdout, b"deep", "{cat:?}");

    std::fs::write(exp.join("file"), b"x").unwrap();
    let out = util::run(
        srv.copy(&dir)
            .arg("127.0.0.1:data/file")
            .arg(dir.path().join("n".repeat(256))),
    );
    assert_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("file: cannot take the destination name 'nnn"),
        "{err}"
    );
}
