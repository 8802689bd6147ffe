//! HTTP third-party copy (`COPY`, issue 33) between real `fatpipe server
//! --http` processes on loopback, driven by curl, Debian's gfal-copy and
//! davix-cp, and against a scripted passive peer for the failures (a
//! source that errors mid-body, one that stalls, a client that goes
//! away). Every success is checked byte for byte against the source and
//! its adler32; every failure checks that nothing was left under the
//! final name (nor a temporary beside it).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::http::{adler32, curl, gfal, header, mint, server, Http};
use crate::util::{assert_exit, have, random_file, run, setup, skip, Dir};

/// Source server A (export `a`) and destination server B (export `b`),
/// both allowed to reach loopback, markers every second.
fn pair(
    dir: &Dir,
    extra_a: &[&str],
    extra_b: &[&str],
) -> (Http, Http, std::path::PathBuf, std::path::PathBuf) {
    let a = crate::util::mkdir(&dir.path().join("a"));
    let b = crate::util::mkdir(&dir.path().join("b"));
    let spec_a = format!("a={}:public", a.display());
    let spec_b = format!("b={}:public", b.display());
    let common = ["--http-tpc-allow", "loopback", "--http-tpc-markers", "1s"];
    let sa = server(
        dir,
        &[&["--export", &spec_a][..], &common, extra_a].concat(),
    );
    let sb = server(
        dir,
        &[&["--export", &spec_b][..], &common, extra_b].concat(),
    );
    (sa, sb, a, b)
}

/// The names in a directory (temporaries included).
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Checks a marker body: a first marker, each `Key: value` with a space
/// after the colon, `RemoteConnections`, the last marker at `size`, and
/// the last line.
fn check_markers(body: &str, size: u64, last: &str) {
    assert!(body.starts_with("Perf Marker\n"), "{body}");
    assert!(body.contains("RemoteConnections: tcp:127.0.0.1:"), "{body}");
    let sizes: Vec<u64> = body
        .lines()
        .filter_map(|l| l.strip_prefix("Stripe Bytes Transferred: "))
        .map(|v| v.parse().unwrap())
        .collect();
    assert!(!sizes.is_empty(), "{body}");
    assert!(sizes.windows(2).all(|w| w[0] <= w[1]), "{body}");
    assert_eq!(*sizes.last().unwrap(), size, "{body}");
    assert_eq!(body.lines().last().unwrap_or_default(), last, "{body}");
    for l in body.lines().filter(|l| l.contains(':')) {
        let (_, v) = l.split_once(':').unwrap();
        assert!(v.starts_with(' '), "no space after the colon: {l}");
    }
}

/// `curl -X COPY` of `url` with `headers`: the status and the body (the
/// markers).
pub(crate) fn copy_curl(url: &str, headers: &[&str]) -> (u16, String) {
    let mut args = vec!["-X", "COPY"];
    for h in headers {
        args.push("-H");
        args.push(h);
    }
    args.push(url);
    let (code, body) = curl(&args);
    (code, String::from_utf8_lossy(&body).into_owned())
}

#[test]
fn tpc_curl_pulls_and_pushes_between_two_fatpipe_servers_with_markers() {
    if !have("curl") {
        return skip("curl is not installed");
    }
    let dir = setup();
    let (sa, mut sb, a, b) = pair(&dir, &[], &[]);
    random_file(&a.join("f.bin"), 33_554_433, 5);
    let data = std::fs::read(a.join("f.bin")).unwrap();
    let src = format!("http://{}/a/f.bin", sa.addr);
    // Pull over 4 ranged connections, verified against the source's adler32.
    let (code, body) = copy_curl(
        &format!("http://{}/b/pull.bin", sb.addr),
        &[
            &format!("Source: {src}"),
            "X-Number-Of-Streams: 4",
            "Credential: none",
        ],
    );
    assert_eq!(code, 202, "{body}");
    check_markers(&body, data.len() as u64, "success: Created");
    assert_eq!(std::fs::read(b.join("pull.bin")).unwrap(), data);
    sb.log.wait_for(
        Duration::from_secs(10),
        &format!("over 4 connection(s), adler32={} verified", adler32(&data)),
    );
    // The digest was kept while writing: HEAD answers it at once.
    let (code, head) = curl(&[
        "-I",
        "-H",
        "Want-Digest: adler32",
        &format!("http://{}/b/pull.bin", sb.addr),
    ]);
    assert_eq!(code, 200);
    assert_eq!(
        header(&String::from_utf8_lossy(&head), "digest"),
        Some(format!("adler32={}", adler32(&data)).as_str())
    );
    // Push from A to B, one PUT.
    let (code, body) = copy_curl(
        &src,
        &[&format!("Destination: http://{}/b/push.bin", sb.addr)],
    );
    assert_eq!(code, 202, "{body}");
    check_markers(&body, data.len() as u64, "success: Created");
    assert_eq!(std::fs::read(b.join("push.bin")).unwrap(), data);
    // An empty file, pulled and pushed.
    std::fs::write(a.join("empty"), b"").unwrap();
    let (code, body) = copy_curl(
        &format!("http://{}/b/empty", sb.addr),
        &[&format!("Source: http://{}/a/empty", sa.addr)],
    );
    assert_eq!(
        (code, body.lines().last()),
        (202, Some("success: Created")),
        "{body}"
    );
    assert_eq!(std::fs::read(b.join("empty")).unwrap(), b"");
    let (code, body) = copy_curl(
        &format!("http://{}/a/empty", sa.addr),
        &[&format!("Destination: http://{}/b/empty2", sb.addr)],
    );
    assert_eq!(
        (code, body.lines().last()),
        (202, Some("success: Created")),
        "{body}"
    );
    assert_eq!(std::fs::read(b.join("empty2")).unwrap(), b"");
    // Overwrite: F onto an existing file: 412, untouched.
    std::fs::write(b.join("keep"), b"old").unwrap();
    let (code, _) = copy_curl(
        &format!("http://{}/b/keep", sb.addr),
        &[&format!("Source: {src}"), "Overwrite: F"],
    );
    assert_eq!(code, 412);
    assert_eq!(std::fs::read(b.join("keep")).unwrap(), b"old");
    // The same for a push: the destination's 412, as a failure line.
    let (code, body) = copy_curl(
        &src,
        &[
            &format!("Destination: http://{}/b/keep", sb.addr),
            "Overwrite: F",
        ],
    );
    assert_eq!(code, 202);
    let last = body.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("failure: ") && last.contains("412"),
        "{body}"
    );
    assert_eq!(std::fs::read(b.join("keep")).unwrap(), b"old");
    // Overwrite: T (the default) replaces it.
    let (code, body) = copy_curl(
        &format!("http://{}/b/keep", sb.addr),
        &[&format!("Source: {src}"), "Overwrite: T"],
    );
    assert_eq!(
        (code, body.lines().last()),
        (202, Some("success: Created")),
        "{body}"
    );
    assert_eq!(std::fs::read(b.join("keep")).unwrap(), data);
    // A missing parent: 409, before any transfer.
    let (code, _) = copy_curl(
        &format!("http://{}/b/no/such/dir/f", sb.addr),
        &[&format!("Source: {src}")],
    );
    assert_eq!(code, 409);
    // What is refused at once with 400: gfal2 then falls back.
    for (hs, why) in [
        (
            vec![format!("Source: {src}"), "Credential: gridsite".into()],
            "Credential",
        ),
        (
            vec![format!("Source: {src}"), format!("Destination: {src}")],
            "both",
        ),
        (vec![], "Source"),
        (vec!["Source: file:///etc/passwd".into()], "scheme"),
        (vec!["Source: root://h//x".into()], "scheme"),
        (
            vec![format!("Source: {src}"), "X-Number-Of-Streams: 101".into()],
            "X-Number-Of-Streams",
        ),
    ] {
        let hs: Vec<&str> = hs.iter().map(String::as_str).collect();
        let (code, body) = copy_curl(&format!("http://{}/b/x", sb.addr), &hs);
        assert_eq!(code, 400, "{hs:?}: {body}");
        assert!(body.contains(why), "{hs:?}: {body}");
    }
    // A missing source: its 404, with a failure line.
    let (code, body) = copy_curl(
        &format!("http://{}/b/x", sb.addr),
        &[&format!("Source: http://{}/a/missing", sa.addr)],
    );
    assert_eq!(code, 404, "{body}");
    assert!(body.starts_with("failure: "), "{body}");
    assert_eq!(
        names(&b),
        ["empty", "empty2", "keep", "pull.bin", "push.bin"]
    );
}

#[test]
fn tpc_loopback_is_refused_unless_allowed() {
    if !have("curl") {
        return skip("curl is not installed");
    }
    let dir = setup();
    let b = crate::util::mkdir(&dir.path().join("b"));
    let spec = format!("b={}:public", b.display());
    let s = server(&dir, &["--export", &spec]);
    let (code, body) = copy_curl(
        &format!("http://{}/b/x", s.addr),
        &[&format!("Source: http://{}/b/y", s.addr)],
    );
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("loopback"), "{body}");
    assert!(names(&b).is_empty());
}

#[test]
fn tpc_gfal_copy_and_davix_cp_pull_and_push_with_adler32() {
    if !have("gfal-copy") || !have("davix-cp") {
        return skip("gfal-copy or davix-cp is not installed (Debian: gfal2-util-scripts gfal2-plugin-http davix)");
    }
    let dir = setup();
    let (sa, mut sb, a, b) = pair(&dir, &[], &[]);
    random_file(&a.join("f.bin"), 12_000_000, 9);
    let data = std::fs::read(a.join("f.bin")).unwrap();
    let src = format!("http://{}/a/f.bin", sa.addr);
    for mode in ["pull", "push"] {
        for n in ["1", "4"] {
            let name = format!("{mode}{n}.bin");
            let out = gfal(
                &[
                    "--copy-mode",
                    mode,
                    "-n",
                    n,
                    "-K",
                    "adler32",
                    &src,
                    &format!("http://{}/b/{name}", sb.addr),
                ],
                None,
            );
            assert_exit(&out, 0);
            assert_eq!(std::fs::read(b.join(&name)).unwrap(), data, "{name}");
        }
        let name = format!("davix-{mode}.bin");
        let out = run(Command::new("davix-cp").args([
            "--copy-mode",
            mode,
            &src,
            &format!("http://{}/b/{name}", sb.addr),
        ]));
        assert_exit(&out, 0);
        assert_eq!(std::fs::read(b.join(&name)).unwrap(), data, "{name}");
    }
    // gfal2 really did a third-party copy (not a streamed fallback: the
    // copy mode turns fallback off) with FTS's one stream: the server chose.
    sb.log
        .wait_for(Duration::from_secs(10), "COPY /b/pull1.bin pull from");
}

#[test]
fn tpc_transfer_header_authorization_reaches_the_other_end_as_authorization() {
    if !have("curl") {
        return skip("curl is not installed");
    }
    let dir = setup();
    let key = dir.path().join("key");
    crate::util::write_key(&key, "a test key of enough length\n");
    let a = crate::util::mkdir(&dir.path().join("a"));
    let b = crate::util::mkdir(&dir.path().join("b"));
    // A: a token-protected export; B: public.
    let spec_a = format!("a={}", a.display());
    let spec_b = format!("b={}:public", b.display());
    let sa = server(
        &dir,
        &["--key-file", key.to_str().unwrap(), "--export", &spec_a],
    );
    let sb = server(&dir, &["--export", &spec_b, "--http-tpc-allow", "loopback"]);
    let token = mint(
        &dir,
        &key,
        &["--scope", "storage.read:/a", "--scope", "storage.modify:/a"],
    );
    random_file(&a.join("f.bin"), 3_000_000, 2);
    let data = std::fs::read(a.join("f.bin")).unwrap();
    let src = format!("Source: http://{}/a/f.bin", sa.addr);
    // Without the token the source refuses: its 401 comes back.
    let (code, body) = copy_curl(&format!("http://{}/b/f.bin", sb.addr), &[&src]);
    assert_eq!(code, 401, "{body}");
    // With it, forwarded: done.
    let auth = format!("TransferHeaderAuthorization: Bearer {token}");
    let (code, body) = copy_curl(&format!("http://{}/b/f.bin", sb.addr), &[&src, &auth]);
    assert_eq!(
        (code, body.lines().last()),
        (202, Some("success: Created")),
        "{body}"
    );
    assert_eq!(std::fs::read(b.join("f.bin")).unwrap(), data);
    // Push from B into A's protected export, the token forwarded on the PUT.
    let dest = format!("Destination: http://{}/a/back.bin", sa.addr);
    let (code, body) = copy_curl(&format!("http://{}/b/f.bin", sb.addr), &[&dest]);
    assert_eq!(code, 202);
    assert!(
        body.lines().last().unwrap().starts_with("failure: "),
        "{body}"
    );
    assert!(body.contains("401"), "{body}");
    let (code, body) = copy_curl(&format!("http://{}/b/f.bin", sb.addr), &[&dest, &auth]);
    assert_eq!(
        (code, body.lines().last()),
        (202, Some("success: Created")),
        "{body}"
    );
    assert_eq!(std::fs::read(a.join("back.bin")).unwrap(), data);
}

/// How the scripted source misbehaves after half the body.
#[derive(Clone, Copy, PartialEq)]
enum Bad {
    /// Closes the connection.
    Cut,
    /// Holds it open, sending nothing.
    Stall,
}

/// A passive source on loopback: `HEAD` says `size` bytes (no ranges, no
/// digest), `GET` sends half of them and then misbehaves. Stops when
/// `stop` is set.
fn bad_source(size: usize, bad: Bad, stop: Arc<AtomicBool>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut r = BufReader::new(c.try_clone().unwrap());
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let head = line.starts_with("HEAD");
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                            break;
                        }
                    }
                    let _ = write!(
                        c,
                        "HTTP/1.1 200 OK\r\nContent-Length: {size}\r\nContent-Type: application/octet-stream\r\n\r\n"
                    );
                    if head {
                        continue;
                    }
                    let _ = c.write_all(&vec![1u8; size / 2]);
                    if bad == Bad::Stall {
                        while !stop.load(Ordering::Relaxed) {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                    return;
                }
            });
        }
    });
    addr
}

#[test]
fn tpc_a_source_that_fails_stalls_or_a_client_that_leaves_keeps_nothing() {
    if !have("curl") {
        return skip("curl is not installed");
    }
    let dir = setup();
    let b = crate::util::mkdir(&dir.path().join("b"));
    let spec = format!("b={}:public", b.display());
    let s = server(
        &dir,
        &[
            "--export",
            &spec,
            "--http-tpc-allow",
            "loopback",
            "--http-tpc-markers",
            "1s",
            "--http-tpc-timeout",
            "2s,2s",
        ],
    );
    std::fs::write(b.join("old"), b"old").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let no_verify = "RequireChecksumVerification: false";
    // Errors mid-body: a failure line, the old file untouched.
    let cut = bad_source(1_000_000, Bad::Cut, Arc::clone(&stop));
    let (code, body) = copy_curl(
        &format!("http://{}/b/old", s.addr),
        &[&format!("Source: http://{cut}/f"), no_verify],
    );
    assert_eq!(code, 202);
    let last = body.lines().last().unwrap_or_default();
    assert!(last.starts_with("failure: "), "{body}");
    // Stalls: failed after the progress timeout.
    let stall = bad_source(1_000_000, Bad::Stall, Arc::clone(&stop));
    let (code, body) = copy_curl(
        &format!("http://{}/b/stalled", s.addr),
        &[&format!("Source: http://{stall}/f"), no_verify],
    );
    assert_eq!(code, 202);
    let last = body.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("failure: no progress for 2 seconds"),
        "{body}"
    );
    // The source's checksum is required by default: none offered, failed.
    let (code, body) = copy_curl(
        &format!("http://{}/b/unverified", s.addr),
        &[&format!("Source: http://{cut}/f")],
    );
    assert_eq!(code, 202);
    assert!(
        body.lines()
            .last()
            .unwrap_or_default()
            .starts_with("failure: "),
        "{body}"
    );
    // The client goes away mid-COPY: the copy is cancelled (a server
    // whose stall timeout cannot come first).
    let b2 = crate::util::mkdir(&dir.path().join("b2"));
    let spec2 = format!("b={}:public", b2.display());
    let mut s = server(
        &dir,
        &[
            "--export",
            &spec2,
            "--http-tpc-allow",
            "loopback",
            "--http-tpc-markers",
            "1s",
        ],
    );
    let mut c = TcpStream::connect(&s.addr).unwrap();
    write!(
        c,
        "COPY /b/gone HTTP/1.1\r\nHost: x\r\nSource: http://{stall}/f\r\n{no_verify}\r\n\r\n"
    )
    .unwrap();
    let mut first = [0u8; 64];
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let n = c.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 202"));
    drop(c);
    s.log
        .wait_for(Duration::from_secs(20), "COPY /b/gone pull from");
    s.log
        .wait_for(Duration::from_secs(20), "the client closed the connection");
    stop.store(true, Ordering::Relaxed);
    // Nothing under the final names, and no temporary left.
    crate::util::wait_for(Duration::from_secs(10), "no temporaries", || {
        names(&b) == ["old"] && names(&b2).is_empty()
    });
    assert_eq!(std::fs::read(b.join("old")).unwrap(), b"old");
}

#[test]
fn tpc_a_file_over_4_gib_is_pulled_exactly() {
    if !have("curl") {
        return skip("curl is not installed");
    }
    let dir = setup();
    let (sa, sb, a, b) = pair(&dir, &[], &[]);
    // A sparse source with markers around the 4 GiB boundary.
    let size: u64 = (1 << 32) + (1 << 20) + 7;
    let f = std::fs::File::create(a.join("big")).unwrap();
    f.set_len(size).unwrap();
    use std::os::unix::fs::FileExt;
    let at: u64 = (1 << 32) - 5;
    f.write_all_at(b"across four gibibytes", at).unwrap();
    f.write_all_at(b"END", size - 3).unwrap();
    drop(f);
    let (code, body) = copy_curl(
        &format!("http://{}/b/big", sb.addr),
        &[
            &format!("Source: http://{}/a/big", sa.addr),
            "X-Number-Of-Streams: 4",
            // Not verified: the source would read 4 GiB to compute it.
            "RequireChecksumVerification: false",
            "SciTag: 313",
            "ClientInfo: job-id=7;file-id=8;retry=0",
        ],
    );
    assert_eq!(code, 202, "{body}");
    check_markers(&body, size, "success: Created");
    let g = std::fs::File::open(b.join("big")).unwrap();
    assert_eq!(g.metadata().unwrap().len(), size);
    let mut buf = [0u8; 21];
    g.read_exact_at(&mut buf, at).unwrap();
    assert_eq!(&buf, b"across four gibibytes");
    g.read_exact_at(&mut buf[..3], size - 3).unwrap();
    assert_eq!(&buf[..3], b"END");
    // SciTag and ClientInfo are recorded with the copy.
    let mut log = sb.log;
    log.wait_for(
        Duration::from_secs(10),
        "scitag=313 clientinfo=job-id=7;file-id=8;retry=0: done",
    );
}

#[test]
fn tpc_xrootd_in_all_four_directions_with_adler32_end_to_end() {
    if !have("xrootd") || !have("openssl") {
        return skip("xrootd is not installed (Debian: xrootd-server xrootd-server-plugins)");
    }
    let dir = setup();
    let root = dir.path();
    let xdata = crate::util::mkdir(&root.join("xrd/data"));
    let (_xrootd, xport, _) = crate::http_client::xrootd(root, &xdata, true);
    let (sa, sb, a, b) = pair(&dir, &[], &[]);
    random_file(&a.join("f.bin"), 20_000_003, 21);
    let data = std::fs::read(a.join("f.bin")).unwrap();
    let sum = format!("adler32={}", adler32(&data));
    let x = format!("http://127.0.0.1:{xport}");
    let copy = |args: &[&str]| {
        let out = run(Command::new(crate::util::bin())
            .current_dir(root)
            .args(["copy", "--json"])
            .args(args));
        assert_exit(&out, 0);
        let j = crate::util::json(&out);
        assert_eq!(j["checksum"], sum.as_str(), "{j}");
        j
    };
    // XRootD pulls from fatpipe (COPY to XRootD with Source).
    copy(&[
        &format!("http://{}/a/f.bin", sa.addr),
        &format!("{x}/x-pulled.bin"),
    ]);
    assert_eq!(std::fs::read(xdata.join("x-pulled.bin")).unwrap(), data);
    // XRootD pushes to fatpipe (COPY to XRootD with Destination).
    copy(&[
        "--tpc",
        "push",
        &format!("{x}/x-pulled.bin"),
        &format!("http://{}/b/x-pushed.bin", sb.addr),
    ]);
    assert_eq!(std::fs::read(b.join("x-pushed.bin")).unwrap(), data);
    // fatpipe pulls from XRootD (4 ranged connections).
    copy(&[
        "-P",
        "4",
        &format!("{x}/x-pulled.bin"),
        &format!("http://{}/b/f-pulled.bin", sb.addr),
    ]);
    assert_eq!(std::fs::read(b.join("f-pulled.bin")).unwrap(), data);
    // fatpipe pushes to XRootD.
    copy(&[
        "--tpc",
        "push",
        &format!("http://{}/a/f.bin", sa.addr),
        &format!("{x}/f-pushed.bin"),
    ]);
    assert_eq!(std::fs::read(xdata.join("f-pushed.bin")).unwrap(), data);
}

#[test]
fn tpc_consecutive_copies_from_one_peer_reuse_its_connections() {
    if !have("curl") {
        return skip("curl is not installed");
    }
    let dir = setup();
    let (sa, sb, a, b) = pair(&dir, &[], &[]);
    for i in 0..5 {
        random_file(&a.join(format!("s{i}")), 1_000_000 + i, 40 + i);
    }
    for i in 0..5 {
        let (code, body) = copy_curl(
            &format!("http://{}/b/s{i}", sb.addr),
            &[&format!("Source: http://{}/a/s{i}", sa.addr)],
        );
        assert_eq!(
            (code, body.lines().last()),
            (202, Some("success: Created")),
            "{body}"
        );
        assert_eq!(
            std::fs::read(b.join(format!("s{i}"))).unwrap(),
            std::fs::read(a.join(format!("s{i}"))).unwrap()
        );
    }
    // Five copies, one connection to the source, still open: the first
    // copy's, kept for the next.
    let m = crate::http::metrics_text(&sa.metrics);
    assert!(
        m.contains("fatpipe_active_sessions{service=\"http\"} 1\n"),
        "{m}"
    );
    for outcome in ["ok", "failed", "aborted"] {
        let ended = format!("fatpipe_sessions_total{{service=\"http\",outcome=\"{outcome}\"}} 0\n");
        assert!(m.contains(&ended), "{m}");
    }
}
