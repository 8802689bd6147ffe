//! `fatpipe copy` with http(s):// and dav(s):// URLs: the client side of
//! issue 31, against fatpipe's own `server --http` (plain and HTTPS with a
//! test CA) and against Debian's XRootD 5.5.3 HTTP port (started here on
//! loopback, stopped by PID). Every check compares the bytes that arrived
//! with the source's, so a wrong byte, a missed range or a checksum not
//! compared fails a test.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::util::{
    assert_exit, free_port, have, json, mkdir, random_file, run, setup, skip, stderr, within, Dir,
    Guard, Lines,
};

/// A fatpipe server with `--http 127.0.0.1:0` and `extra`: its guard and
/// the HTTP address.
fn server(dir: &Dir, extra: &[&str]) -> (Guard, String, Lines) {
    let mut cmd = dir.cmd();
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0"])
        .args(["--http", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn fatpipe server");
    let stdout = child.stdout.take().expect("stdout");
    let stderr = child.stderr.take().expect("stderr");
    let guard = Guard(child);
    let mut addr = String::new();
    for line in BufReader::new(stdout).lines().take(4) {
        let line = line.unwrap_or_default();
        if let Some(a) = line.strip_prefix("http listening on ") {
            addr = a.split(' ').next().unwrap_or_default().to_string();
            break;
        }
    }
    assert!(
        !addr.is_empty(),
        "the server printed no 'http listening on' line"
    );
    (guard, addr, Lines::read(stderr))
}

fn same(a: &Path, b: &Path) {
    let (x, y) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    assert!(
        x == y,
        "{} and {} differ ({} vs {} bytes)",
        a.display(),
        b.display(),
        x.len(),
        y.len()
    );
}
/// XRootD 5.5.3 serving `data` (under `root/xrd`) on an HTTP port with TLS
/// configured (a test CA's certificate), and with `tpc` its HTTP-TPC
/// handler (which loads only with TLS): its guard, HTTP port and the test
/// CA's certificate. Its two
/// ports are picked free before it starts, so another process may take one
/// first: if it exits, it is started again on two others (three tries); a
/// failure shows its log (`xrd/NAME/log`, where `-l xrd/log -n NAME` puts it).
pub(crate) fn xrootd(root: &Path, data: &Path, tpc: bool) -> (Guard, u16, PathBuf) {
    const NAME: &str = "fatpipe-test";
    let adm = mkdir(&root.join("xrd/adm"));
    let (ca, cert, key) = test_ca(root);
    let log =
        || std::fs::read_to_string(root.join("xrd").join(NAME).join("log")).unwrap_or_default();
    // XRootD refuses to run as root: as root it runs as nobody, which must
    // reach its files.
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let mut last = String::new();
    for _ in 0..3 {
        let (http, xrd) = (free_port(), free_port());
        let cfg = root.join("xrd/x.cfg");
        std::fs::write(
            &cfg,
            format!(
                "all.export /\noss.localroot {}\nall.adminpath {}\nall.pidpath {}\nxrd.port {xrd}\n\
                 xrd.allow host localhost\nxrd.tls {} {}\nxrd.tlsca certfile {}\n\
                 xrd.protocol XrdHttp:{http} libXrdHttp.so\n{}xrootd.chksum adler32\n",
                data.display(),
                adm.display(),
                adm.display(),
                cert.display(),
                key.display(),
                ca.display(),
                if tpc {
                    "http.exthandler xrdtpc libXrdHttpTPC.so\n"
                } else {
                    ""
                }
            ),
        )
        .unwrap();
        let mut cmd = Command::new("xrootd");
        cmd.arg("-l")
            .arg(root.join("xrd/log"))
            .args(["-n", NAME, "-c"])
            .arg(&cfg);
        if is_root {
            cmd.args(["-R", "nobody"]);
            assert_exit(
                &run(Command::new("chown")
                    .args(["-R", "nobody"])
                    .arg(root.join("xrd"))
                    .arg(data)
                    .arg(&key)),
                0,
            );
            let mut p = root.to_path_buf();
            loop {
                let mode = std::fs::metadata(&p).unwrap().permissions().mode();
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode | 0o711))
                    .unwrap();
                if !p.pop() || p.as_os_str().len() <= 1 {
                    break;
                }
            }
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut guard = Guard(child);
        let mut exited = false;
        let up = within(Duration::from_secs(30), || {
            exited = matches!(guard.0.try_wait(), Ok(Some(_)));
            exited || TcpStream::connect(("127.0.0.1", http)).is_ok()
        });
        if up && !exited {
            return (guard, http, ca);
        }
        last = log();
        if !exited {
            break;
        }
    }
    panic!("XRootD did not listen on its HTTP port: {last}");
}

/// A test CA and a certificate it signed for localhost and 127.0.0.1:
/// (ca.crt, leaf.crt, leaf.key).
pub(crate) fn test_ca(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let p = |n: &str| dir.join(n);
    let ok = |c: &mut Command| assert_exit(&run(c), 0);
    ok(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ])
        .args(["-days", "2", "-subj", "/CN=fatpipe test CA", "-keyout"])
        .arg(p("ca.key"))
        .arg("-out")
        .arg(p("ca.crt")));
    ok(Command::new("openssl")
        .args([
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ])
        .args(["-subj", "/CN=localhost", "-keyout"])
        .arg(p("leaf.key"))
        .arg("-out")
        .arg(p("leaf.csr")));
    std::fs::write(
        p("ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    ok(Command::new("openssl")
        .args(["x509", "-req", "-days", "2", "-set_serial", "7", "-in"])
        .arg(p("leaf.csr"))
        .arg("-CA")
        .arg(p("ca.crt"))
        .arg("-CAkey")
        .arg(p("ca.key"))
        .arg("-extfile")
        .arg(p("ext"))
        .arg("-out")
        .arg(p("leaf.crt")));
    (p("ca.crt"), p("leaf.crt"), p("leaf.key"))
}

#[test]
fn http_client_pulls_in_parallel_ranges_and_pushes_plain_and_https() {
    if !have("openssl") {
        return skip("openssl is not installed");
    }
    let dir = setup();
    let export = mkdir(&dir.path().join("pub"));
    random_file(&export.join("f.bin"), 30_000_017, 3);
    std::fs::write(export.join("empty"), b"").unwrap();
    std::fs::write(export.join("a b é.txt"), b"spaces and UTF-8\n").unwrap();
    let spec = format!("pub={}:public", export.display());
    let (_g, addr, _log) = server(&dir, &["--export", &spec]);
    let out_dir = mkdir(&dir.path().join("out"));

    // Ranged, parallel: 30 MB is four 8 MiB blocks over three connections.
    let out = run(dir
        .cmd()
        .args(["copy", "--json", "-P", "3"])
        .arg(format!("http://{addr}/pub/f.bin"))
        .arg(&out_dir));
    assert_exit(&out, 0);
    let j = json(&out);
    assert_eq!(j["direction"], "pull");
    assert_eq!(j["streams"], 3);
    assert_eq!(j["bytes_transferred"], 30_000_017);
    assert!(
        j["checksum"].as_str().unwrap().starts_with("adler32="),
        "{j}"
    );
    same(&export.join("f.bin"), &out_dir.join("f.bin"));
    // dav:// is http://; a percent-encoded name; an empty file.
    let out = run(dir
        .cmd()
        .args(["copy", "-q"])
        .arg(format!("dav://{addr}/pub/a%20b%20%C3%A9.txt"))
        .arg(&out_dir));
    assert_exit(&out, 0);
    same(&export.join("a b é.txt"), &out_dir.join("a b é.txt"));
    let out = run(dir
        .cmd()
        .args(["copy", "-q"])
        .arg(format!("http://{addr}/pub/empty"))
        .arg(out_dir.join("e")));
    assert_exit(&out, 0);
    assert_eq!(std::fs::metadata(out_dir.join("e")).unwrap().len(), 0);
    // No partial file or journal is left behind.
    let left: Vec<_> = std::fs::read_dir(&out_dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(".fatpipe-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");

    // Push into a collection, verified by the server's checksum.
    mkdir(&export.join("in"));
    let src = dir.path().join("up.bin");
    random_file(&src, 5_000_001, 4);
    let out = run(dir
        .cmd()
        .args(["copy", "--json"])
        .arg(&src)
        .arg(format!("http://{addr}/pub/in/")));
    assert_exit(&out, 0);
    let j = json(&out);
    assert_eq!(j["direction"], "push");
    assert!(
        j["checksum"].as_str().unwrap().starts_with("adler32="),
        "{j}"
    );
    same(&src, &export.join("in/up.bin"));
    // A tree with -r: MKCOL per directory, a verified PUT per file.
    let tree = mkdir(&dir.path().join("tree"));
    random_file(&mkdir(&tree.join("a/b")).join("x.bin"), 2_000_000, 6);
    std::fs::write(mkdir(&tree.join("c d")).join("é.txt"), b"hi\n").unwrap();
    std::fs::write(tree.join("t.txt"), b"top\n").unwrap();
    let out = run(dir
        .cmd()
        .args(["copy", "--json", "-r"])
        .arg(&tree)
        .arg(format!("http://{addr}/pub/in/")));
    assert_exit(&out, 0);
    let j = json(&out);
    assert_eq!(
        (j["files_total"].as_u64(), j["files_verified"].as_u64()),
        (Some(3), Some(3)),
        "{j}"
    );
    for f in ["a/b/x.bin", "c d/é.txt", "t.txt"] {
        same(&tree.join(f), &export.join("in/tree").join(f));
    }
    // A rerun sends only what the server lacks (same path and size).
    std::fs::remove_file(export.join("in/tree/c d/é.txt")).unwrap();
    let out = run(dir
        .cmd()
        .args(["copy", "--json", "-r"])
        .arg(&tree)
        .arg(format!("http://{addr}/pub/in/")));
    assert_exit(&out, 0);
    let j = json(&out);
    assert_eq!(
        (j["files_skipped"].as_u64(), j["files_verified"].as_u64()),
        (Some(2), Some(1)),
        "{j}"
    );
    assert_eq!(j["bytes_transferred"], 3, "{j}");
    same(&tree.join("c d/é.txt"), &export.join("in/tree/c d/é.txt"));
    let out = run(dir
        .cmd()
        .arg("copy")
        .arg(&tree)
        .arg(format!("http://{addr}/pub/in/")));
    assert_exit(&out, 2);
    // A missing parent is the server's 409, said in one line, exit 1.
    let out = run(dir
        .cmd()
        .arg("copy")
        .arg(&src)
        .arg(format!("http://{addr}/pub/nodir/x")));
    assert_exit(&out, 1);
    assert!(stderr(&out).contains("409"), "{}", stderr(&out));

    // HTTPS with a test CA.
    let (ca, cert, key) = test_ca(dir.path());
    let (_g2, taddr, _log2) = server(
        &dir,
        &[
            "--export",
            &spec,
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    let port = taddr.rsplit_once(':').unwrap().1;
    let out = run(dir
        .cmd()
        .args(["copy", "-q", "--ca"])
        .arg(&ca)
        .arg(format!("davs://localhost:{port}/pub/f.bin"))
        .arg(out_dir.join("tls.bin")));
    assert_exit(&out, 0);
    same(&export.join("f.bin"), &out_dir.join("tls.bin"));
    let out = run(dir
        .cmd()
        .args(["copy", "-q", "--ca"])
        .arg(&ca)
        .arg(&src)
        .arg(format!("https://127.0.0.1:{port}/pub/in/tls-up.bin")));
    assert_exit(&out, 0);
    same(&src, &export.join("in/tls-up.bin"));
    // Without the CA the certificate is not trusted: exit 2, and the hint.
    let out = run(dir
        .cmd()
        .arg("copy")
        .arg(format!("https://localhost:{port}/pub/f.bin"))
        .arg(out_dir.join("no.bin")));
    assert_exit(&out, 2);
    assert!(stderr(&out).contains("--ca"), "{}", stderr(&out));
}

#[test]
fn http_client_resumes_a_killed_download_fetching_only_what_is_missing() {
    let dir = setup();
    let export = mkdir(&dir.path().join("pub"));
    let size: u64 = 160 << 20;
    random_file(&export.join("big.bin"), size, 11);
    let spec = format!("pub={}:public", export.display());
    let (_g, addr, _log) = server(&dir, &["--export", &spec]);
    let out_dir = mkdir(&dir.path().join("out"));
    let url = format!("http://{addr}/pub/big.bin");
    // 40 MB/s: 4 s for the file; killed once 5 blocks (40 MiB) are journaled.
    let mut child = dir
        .cmd()
        .args(["copy", "-q", "-P", "2", "--bwlimit", "320M"])
        .arg(&url)
        .arg(&out_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let journal_records = || -> usize {
        std::fs::read_dir(&out_dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".journal"))
            .map(|e| {
                std::fs::read(e.path())
                    .unwrap_or_default()
                    .iter()
                    .filter(|&&b| b == b'\n')
                    .count()
                    .saturating_sub(1)
            })
            .sum()
    };
    let started = within(Duration::from_secs(60), || journal_records() >= 5);
    // Killed by PID, mid-transfer.
    let _ = child.kill();
    let _ = child.wait();
    assert!(started, "no 5 blocks journaled within 60 s");
    let had = journal_records() as u64;
    assert!(
        had < size.div_ceil(8 << 20),
        "the download finished before the kill"
    );
    assert!(
        !out_dir.join("big.bin").exists(),
        "nothing under the final name until complete"
    );

    let out = run(dir.cmd().args(["copy", "--json"]).arg(&url).arg(&out_dir));
    assert_exit(&out, 0);
    assert!(stderr(&out).contains("resuming"), "{}", stderr(&out));
    let j = json(&out);
    let moved = j["bytes_transferred"].as_u64().unwrap();
    assert!(
        moved <= size - had * (8 << 20),
        "moved {moved} of {size}, {had} blocks were journaled"
    );
    assert!(
        j["checksum"].as_str().unwrap().starts_with("adler32="),
        "{j}"
    );
    same(&export.join("big.bin"), &out_dir.join("big.bin"));
}

#[test]
fn http_client_detects_a_file_that_does_not_match_the_servers_checksum() {
    let dir = setup();
    let export = mkdir(&dir.path().join("pub"));
    let spec = format!("pub={}:public", export.display());
    let (_g, addr, _log) = server(&dir, &["--export", &spec]);
    let src = dir.path().join("f.bin");
    random_file(&src, 3_000_000, 21);
    // The server computes adler32 while the PUT writes and keeps it.
    let out = run(dir
        .cmd()
        .args(["copy", "-q"])
        .arg(&src)
        .arg(format!("http://{addr}/pub/f.bin")));
    assert_exit(&out, 0);
    // One byte changes on disk behind the server's back, with the same size
    // and modification time: the kept checksum is now the old content's.
    let served = export.join("f.bin");
    let mtime = std::fs::metadata(&served).unwrap().modified().unwrap();
    let mut data = std::fs::read(&served).unwrap();
    data[1_234_567] ^= 0x40;
    std::fs::write(&served, &data).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&served)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let dest = dir.path().join("got.bin");
    let out = run(dir
        .cmd()
        .arg("copy")
        .arg(format!("http://{addr}/pub/f.bin"))
        .arg(&dest));
    assert_exit(&out, 1);
    assert!(
        stderr(&out).contains("checksum mismatch"),
        "{}",
        stderr(&out)
    );
    assert!(
        !dest.exists(),
        "a file that failed its checksum is not kept"
    );
}

#[test]
fn http_client_says_401_and_403_and_exits_2() {
    let dir = setup();
    let key = dir.path().join("key");
    crate::util::write_key(&key, "a test key of enough length\n");
    let export = mkdir(&dir.path().join("data"));
    random_file(&export.join("f.bin"), 100_000, 5);
    let spec = format!("data={}", export.display());
    let (_g, addr, _log) = server(
        &dir,
        &["--key-file", key.to_str().unwrap(), "--export", &spec],
    );
    let mint = |scope: &str| {
        let out = run(dir
            .cmd()
            .args(["token", "--key-file"])
            .arg(&key)
            .args(["--scope", scope]));
        assert_exit(&out, 0);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let url = format!("http://{addr}/data/f.bin");
    let out = run(dir.cmd().arg("copy").arg(&url).arg(dir.path().join("a")));
    assert_exit(&out, 2);
    assert!(stderr(&out).contains("401"), "{}", stderr(&out));
    assert!(stderr(&out).contains("token"), "{}", stderr(&out));

    let other = dir.path().join("other.tok");
    std::fs::write(&other, mint("storage.read:/data/elsewhere")).unwrap();
    let out = run(dir
        .cmd()
        .args(["copy", "--token"])
        .arg(&other)
        .arg(&url)
        .arg(dir.path().join("a")));
    assert_exit(&out, 2);
    assert!(stderr(&out).contains("403"), "{}", stderr(&out));

    // The right scope, from BEARER_TOKEN as WLCG tools read it.
    let read = mint("storage.read:/data");
    let out = run(dir
        .cmd()
        .env("BEARER_TOKEN", &read)
        .args(["copy", "-q"])
        .arg(&url)
        .arg(dir.path().join("a")));
    assert_exit(&out, 0);
    same(&export.join("f.bin"), &dir.path().join("a"));
    // A read token cannot write: 403 before any byte is sent.
    let out = run(dir
        .cmd()
        .env("BEARER_TOKEN", &read)
        .arg("copy")
        .arg(dir.path().join("a"))
        .arg(format!("http://{addr}/data/new.bin")));
    assert_exit(&out, 2);
    assert!(stderr(&out).contains("403"), "{}", stderr(&out));
    assert!(!export.join("new.bin").exists());
}

#[test]
fn http_client_pulls_from_and_pushes_to_xrootd() {
    if !have("xrootd") || !have("openssl") {
        return skip("xrootd is not installed (Debian: xrootd-server xrootd-server-plugins)");
    }
    let dir = setup();
    let root = dir.path();
    let data = mkdir(&root.join("xrd/data"));
    let (_xrootd, http, ca) = xrootd(root, &data, false);

    let src = root.join("src.bin");
    random_file(&src, 20_000_003, 8);
    let out = run(Command::new(crate::util::bin())
        .current_dir(root)
        .args(["copy", "--json"])
        .arg(&src)
        .arg(format!("http://127.0.0.1:{http}/pushed.bin")));
    assert_exit(&out, 0);
    let j = json(&out);
    assert_eq!(
        j["checksum"].as_str().unwrap_or_default().len(),
        "adler32=".len() + 8,
        "{j}"
    );
    same(&src, &data.join("pushed.bin"));

    let out = run(Command::new(crate::util::bin())
        .current_dir(root)
        .args(["copy", "--json", "-P", "3"])
        .arg(format!("http://127.0.0.1:{http}/pushed.bin"))
        .arg(root.join("pulled.bin")));
    assert_exit(&out, 0);
    let j = json(&out);
    assert_eq!(j["streams"], 3);
    assert!(
        j["checksum"].as_str().unwrap().starts_with("adler32="),
        "{j}"
    );
    assert!(j["io_remote"].as_str().unwrap().contains("XrootD"), "{j}");
    same(&src, &root.join("pulled.bin"));

    // HTTPS on the same port, with the test CA.
    let out = run(Command::new(crate::util::bin())
        .current_dir(root)
        .args(["copy", "-q", "--ca"])
        .arg(&ca)
        .arg(format!("davs://localhost:{http}/pushed.bin"))
        .arg(root.join("pulled-tls.bin")));
    assert_exit(&out, 0);
    same(&src, &root.join("pulled-tls.bin"));
    let out = run(Command::new(crate::util::bin())
        .current_dir(root)
        .args(["copy", "-q", "--ca"])
        .arg(&ca)
        .arg(&src)
        .arg(format!("https://localhost:{http}/pushed-tls.bin")));
    assert_exit(&out, 0);
    same(&src, &data.join("pushed-tls.bin"));

    // A tree up (MKCOL, PUT) and down again (PROPFIND walks, GETs).
    let tree = mkdir(&root.join("tree"));
    let sub = mkdir(&tree.join("sub dir"));
    random_file(&tree.join("t1.bin"), 3_000_001, 9);
    random_file(&sub.join("t2 é.bin"), 100_003, 10);
    let out = run(Command::new(crate::util::bin())
        .current_dir(root)
        .args(["copy", "-q", "-r"])
        .arg(&tree)
        .arg(format!("http://127.0.0.1:{http}/")));
    assert_exit(&out, 0);
    same(&sub.join("t2 é.bin"), &data.join("tree/sub dir/t2 é.bin"));
    let back = root.join("back");
    let out = run(Command::new(crate::util::bin())
        .current_dir(root)
        .args(["copy", "--json", "-r"])
        .arg(format!("http://127.0.0.1:{http}/tree/"))
        .arg(&back));
    assert_exit(&out, 0);
    let j = json(&out);
    assert_eq!(j["files_total"], 2, "{j}");
    same(&tree.join("t1.bin"), &back.join("t1.bin"));
    same(&sub.join("t2 é.bin"), &back.join("sub dir/t2 é.bin"));
}

/// `copy -r URL DIR`: a tree (nested collections, an empty one, an empty
/// file, names with spaces, UTF-8 and `%`) pulled with PROPFIND walks,
/// every file verified; the collection itself without a trailing `/`,
/// its contents with one; a rerun fetches nothing that is already here.
#[test]
fn http_client_pulls_a_tree_and_a_rerun_fetches_only_what_is_missing() {
    let dir = setup();
    let export = mkdir(&dir.path().join("pub"));
    let top = mkdir(&export.join("top"));
    let sub = mkdir(&top.join("sub dir"));
    let deep = mkdir(&sub.join("ünï %41"));
    mkdir(&top.join("empty"));
    random_file(&top.join("big.bin"), 20_000_003, 5);
    random_file(&deep.join("z.bin"), 70_001, 6);
    std::fs::write(top.join("zero"), b"").unwrap();
    std::fs::write(sub.join("a b%c.txt"), b"text\n").unwrap();
    let spec = format!("pub={}:public", export.display());
    let (_g, addr, _log) = server(&dir, &["--export", &spec]);
    let files = [
        PathBuf::from("big.bin"),
        PathBuf::from("zero"),
        PathBuf::from("sub dir/a b%c.txt"),
        PathBuf::from("sub dir/ünï %41/z.bin"),
    ];

    // Without a trailing /: the collection itself, under its name.
    let out_dir = mkdir(&dir.path().join("out"));
    let out = run(dir
        .cmd()
        .args(["copy", "--json", "-r"])
        .arg(format!("http://{addr}/pub/top"))
        .arg(&out_dir));
    assert_exit(&out, 0);
    let j = json(&out);
    assert_eq!(j["direction"], "pull");
    assert_eq!(
        (j["files_total"].as_u64(), j["files_verified"].as_u64()),
        (Some(4), Some(4)),
        "{j}"
    );
    assert_eq!(j["bytes_transferred"], 20_000_003 + 70_001 + 5);
    for f in &files {
        same(&top.join(f), &out_dir.join("top").join(f));
    }
    assert!(out_dir.join("top/empty").is_dir());

    // A rerun after a file went missing fetches that file only.
    std::fs::remove_file(out_dir.join("top/sub dir/ünï %41/z.bin")).unwrap();
    let out = run(dir
        .cmd()
        .args(["copy", "--json", "-r"])
        .arg(format!("http://{addr}/pub/top"))
        .arg(&out_dir));
    assert_exit(&out, 0);
    let j = json(&out);
    assert_eq!(
        (j["files_skipped"].as_u64(), j["files_verified"].as_u64()),
        (Some(3), Some(1)),
        "{j}"
    );
    assert_eq!(j["bytes_transferred"], 70_001);
    same(
        &deep.join("z.bin"),
        &out_dir.join("top/sub dir/ünï %41/z.bin"),
    );

    // With a trailing /: the contents, into DEST (created).
    let into = dir.path().join("flat");
    let out = run(dir
        .cmd()
        .args(["copy", "-q", "-r"])
        .arg(format!("dav://{addr}/pub/top/"))
        .arg(&into));
    assert_exit(&out, 0);
    for f in &files {
        same(&top.join(f), &into.join(f));
    }

    // A collection that is not there: one line, exit 1.
    let out = run(dir
        .cmd()
        .args(["copy", "-r"])
        .arg(format!("http://{addr}/pub/nothing/"))
        .arg(dir.path().join("none")));
    assert_exit(&out, 1);
    assert!(stderr(&out).contains("404"), "{}", stderr(&out));
}
