//! The leg of HTTP third-party copy (issue 33): between two fatpipe
//! servers a `COPY` pull moves its data over the copy protocol, opened
//! with a one-time ticket the source's HTTP port issues under HTTP's own
//! authorisation. Real `fatpipe server` processes on loopback, Debian's
//! gfal-copy as the client; the fallbacks to HTTP, and the tickets'
//! refusals.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::time::Duration;

use crate::http::{adler32, curl, gfal, header, metrics_text, mint, server};
use crate::tpc::copy_curl;
use crate::util::{assert_exit, have, mkdir, random_file, run, setup, skip, write_key};

/// `HEAD` of `url` asking for a ticket: the status and the headers.
fn head_ticket(url: &str, token: Option<&str>) -> (u16, String) {
    let auth = token.map(|t| format!("Authorization: Bearer {t}"));
    let mut args = vec!["-I", "-H", "Fatpipe-Ticket: read"];
    if let Some(a) = &auth {
        args.extend(["-H", a]);
    }
    args.push(url);
    let (code, h) = curl(&args);
    (code, String::from_utf8_lossy(&h).into_owned())
}

/// A ticket header's `id:key`, for `FATPIPE_TEST_COPY_TICKET`, and its port.
fn ticket_of(headers: &str) -> (String, String) {
    let t = header(headers, "fatpipe-ticket").unwrap_or_else(|| panic!("no ticket: {headers}"));
    let field = |k: &str| {
        t.split("; ")
            .find_map(|p| p.strip_prefix(k))
            .unwrap_or_else(|| panic!("{k} in {t}"))
            .to_string()
    };
    (
        format!("{}:{}", field("id="), field("key=")),
        field("port="),
    )
}

#[test]
fn tpc_leg_gfal_copy_pull_between_two_fatpipe_servers_goes_over_the_leg_with_a_token() {
    if !have("gfal-copy") {
        return skip("gfal-copy is not installed (Debian: gfal2-util-scripts gfal2-plugin-http)");
    }
    let dir = setup();
    let key = dir.path().join("key");
    write_key(&key, "a test key of enough length\n");
    let a = mkdir(&dir.path().join("a"));
    let b = mkdir(&dir.path().join("b"));
    // A: a token-protected export (no :public); B: the active end.
    let spec_a = format!("a={}", a.display());
    let spec_b = format!("b={}:public", b.display());
    let mut sa = server(
        &dir,
        &["--key-file", key.to_str().unwrap(), "--export", &spec_a],
    );
    let mut sb = server(
        &dir,
        &[
            "--export",
            &spec_b,
            "--http-tpc-allow",
            "loopback",
            "--http-tpc-leg-min",
            "1M",
        ],
    );
    let token = mint(&dir, &key, &["--scope", "storage.read:/a"]);
    random_file(&a.join("f.bin"), 24_000_001, 21);
    let data = std::fs::read(a.join("f.bin")).unwrap();
    // As FTS: pull, one stream (the server chooses), adler32 compared by
    // gfal at both ends; the token goes to the source as
    // TransferHeaderAuthorization.
    let out = gfal(
        &[
            "--copy-mode",
            "pull",
            "-n",
            "1",
            "-K",
            "adler32",
            &format!("http://{}/a/f.bin", sa.addr),
            &format!("http://{}/b/f.bin", sb.addr),
        ],
        Some(&token),
    );
    assert_exit(&out, 0);
    assert_eq!(std::fs::read(b.join("f.bin")).unwrap(), data);
    // Over the leg: the source's copy port opened a session by ticket and
    // counted it; the destination's log says so, the digest carried.
    sa.log.wait_for(
        Duration::from_secs(10),
        "copy session started (one-time ticket)",
    );
    sb.log.wait_for(
        Duration::from_secs(10),
        "over the fatpipe leg from 127.0.0.1:",
    );
    let m = metrics_text(&sa.metrics);
    assert!(
        m.contains("fatpipe_sessions_total{service=\"copy\",outcome=\"ok\"} 1\n"),
        "{m}"
    );
    // The destination's digest, as gfal's checksum HEAD reads it.
    let (code, head) = curl(&[
        "-I",
        "-H",
        "Want-Digest: adler32",
        &format!("http://{}/b/f.bin", sb.addr),
    ]);
    assert_eq!(code, 200);
    let head = head_str(&head);
    assert_eq!(
        header(&head, "digest"),
        Some(format!("adler32={}", adler32(&data)).as_str())
    );
    // Nothing else was left beside it (parts, journals).
    let names: Vec<_> = std::fs::read_dir(&b)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["f.bin"]);
}

fn head_str(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A passive HTTP source that offers a ticket `ticket` (a header value) on
/// `HEAD` and serves `body` whole on every `GET` (keep-alive).
fn stub_source(body: Vec<u8>, ticket: String) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            let (body, ticket) = (body.clone(), ticket.clone());
            std::thread::spawn(move || {
                let mut r = BufReader::new(c.try_clone().unwrap());
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                            break;
                        }
                    }
                    let _ = write!(
                        c,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nFatpipe-Copy: v=1; port=1\r\n\
                         Fatpipe-Ticket: {ticket}\r\n\r\n",
                        body.len()
                    );
                    if !line.starts_with("HEAD") && c.write_all(&body).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn tpc_leg_falls_back_to_http_when_the_copy_port_is_unreachable_or_the_leg_is_off() {
    if !have("curl") {
        return skip("curl is not installed");
    }
    let dir = setup();
    let a = mkdir(&dir.path().join("a"));
    let b = mkdir(&dir.path().join("b"));
    let spec_a = format!("a={}:public", a.display());
    let spec_b = format!("b={}:public", b.display());
    let active = |extra: &[&str]| {
        server(
            &dir,
            &[
                &[
                    "--export",
                    &spec_b,
                    "--http-tpc-allow",
                    "loopback",
                    "--http-tpc-leg-min",
                    "1M",
                ][..],
                extra,
            ]
            .concat(),
        )
    };
    random_file(&a.join("f.bin"), 9_000_000, 3);
    let data = std::fs::read(a.join("f.bin")).unwrap();

    // A copy port nobody listens on, and a ticket of another version.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let good = format!(
        "v=1; port={port}; id={}; key={}; export=a; path=f.bin",
        "ab".repeat(16),
        "cd".repeat(32)
    );
    let mut sb = active(&[]);
    for (ticket, why) in [
        (
            good.clone(),
            format!("leg not used: fatpipe leg to 127.0.0.1:{port}"),
        ),
        (
            good.replace("v=1", "v=9"),
            "leg not used: its ticket: ticket version 9".into(),
        ),
    ] {
        let src = stub_source(data.clone(), ticket);
        let (code, body) = copy_curl(
            &format!("http://{}/b/stub.bin", sb.addr),
            &[
                &format!("Source: http://{src}/a/f.bin"),
                "RequireChecksumVerification: false",
            ],
        );
        assert_eq!(
            (code, body.lines().last()),
            (202, Some("success: Created")),
            "{body}"
        );
        assert_eq!(std::fs::read(b.join("stub.bin")).unwrap(), data);
        sb.log.wait_for(Duration::from_secs(10), &why);
        std::fs::remove_file(b.join("stub.bin")).unwrap();
    }

    // The leg off at either end: HTTP, and no session on the copy port.
    for (off_at_source, name) in [(true, "s.bin"), (false, "d.bin")] {
        let off: &[&str] = &["--http-tpc-leg", "off"];
        let sa = server(
            &dir,
            &[
                &["--export", &spec_a][..],
                if off_at_source { off } else { &[] },
            ]
            .concat(),
        );
        let mut sb = active(if off_at_source { &[] } else { off });
        let (code, body) = copy_curl(
            &format!("http://{}/b/{name}", sb.addr),
            &[&format!("Source: http://{}/a/f.bin", sa.addr)],
        );
        assert_eq!(
            (code, body.lines().last()),
            (202, Some("success: Created")),
            "{body}"
        );
        assert_eq!(std::fs::read(b.join(name)).unwrap(), data);
        let done = sb.log.wait_for(Duration::from_secs(10), ": done, ");
        assert!(
            done.contains("connection(s)") && !done.contains("leg"),
            "{done}"
        );
        let m = metrics_text(&sa.metrics);
        assert!(
            !m.contains("fatpipe_sessions_total{service=\"copy\",outcome=\"ok\"} 1"),
            "{m}"
        );
    }
}

#[test]
fn tpc_leg_tickets_follow_the_token_and_open_one_session_for_one_file_and_direction() {
    if !have("curl") {
        return skip("curl is not installed");
    }
    if cfg!(not(feature = "test-hooks")) {
        return skip("needs the test-hooks feature (FATPIPE_TEST_COPY_TICKET)");
    }
    let dir = setup();
    let key = dir.path().join("key");
    write_key(&key, "a test key of enough length\n");
    let a = mkdir(&dir.path().join("a"));
    let spec_a = format!("a={}", a.display());
    let sa = server(
        &dir,
        &["--key-file", key.to_str().unwrap(), "--export", &spec_a],
    );
    random_file(&a.join("f.bin"), 100_000, 4);
    random_file(&a.join("other.bin"), 100_000, 5);
    let url = format!("http://{}/a/f.bin", sa.addr);
    // A token whose scope does not cover the file: refused, no ticket.
    let elsewhere = mint(&dir, &key, &["--scope", "storage.read:/a/other.bin"]);
    let (code, h) = head_ticket(&url, Some(&elsewhere));
    assert_eq!(code, 403, "{h}");
    assert_eq!(header(&h, "fatpipe-ticket"), None, "{h}");
    // No token at all: 401, no ticket.
    let (code, h) = head_ticket(&url, None);
    assert_eq!(code, 401, "{h}");
    assert_eq!(header(&h, "fatpipe-ticket"), None, "{h}");
    // A token that reads it: a ticket; without asking, only Fatpipe-Copy.
    let token = mint(&dir, &key, &["--scope", "storage.read:/a"]);
    let (code, h) = curl(&["-I", "-H", &format!("Authorization: Bearer {token}"), &url]);
    let h = head_str(&h);
    assert_eq!(code, 200);
    assert!(header(&h, "fatpipe-copy").is_some(), "{h}");
    assert_eq!(header(&h, "fatpipe-ticket"), None, "{h}");
    let ticket = || {
        let (code, h) = head_ticket(&url, Some(&token));
        assert_eq!(code, 200, "{h}");
        ticket_of(&h)
    };
    let back = dir.path().join("back");
    let pull = |t: &str, port: &str, what: &str| {
        run(dir
            .cmd()
            .env("FATPIPE_TEST_COPY_TICKET", t)
            .args(["copy", "--retries", "0", "--no-auto", "-q", "--port", port])
            .arg(format!("127.0.0.1:a/{what}"))
            .arg(&back))
    };
    // Another file: refused by the session (its ticket grants f.bin).
    let (t, port) = ticket();
    let out = pull(&t, &port, "other.bin");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ticket grants only reading a/f.bin"), "{err}");
    // The same ticket again, now for its own file: spent.
    let out = pull(&t, &port, "f.bin");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("authentication failed"), "{err}");
    // Another direction: a read ticket does not push.
    let (t, port) = ticket();
    let out = run(dir
        .cmd()
        .env("FATPIPE_TEST_COPY_TICKET", &t)
        .args(["copy", "--retries", "0", "--no-auto", "-q", "--port", &port])
        .arg(a.join("other.bin"))
        .arg("127.0.0.1:a/f.bin"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ticket grants only reading a/f.bin"), "{err}");
    // A fresh ticket pulls its file.
    let (t, port) = ticket();
    let out = pull(&t, &port, "f.bin");
    assert_exit(&out, 0);
    assert_eq!(
        std::fs::read(&back).unwrap(),
        std::fs::read(a.join("f.bin")).unwrap()
    );
}

/// Between two fatpipe servers on HTTPS a pull and a push go over the leg,
/// encrypted with TLS 1.3 keyed by the ticket the source's HTTPS port
/// issued (no pre-shared key between the two): both logs say so, the file
/// and its adler32 are the source's.
#[test]
fn tpc_leg_https_pull_and_push_go_over_the_leg_encrypted_with_the_tickets_key() {
    if !have("curl") || !have("openssl") {
        return skip("curl or openssl is not installed");
    }
    let dir = setup();
    // Both servers present a certificate of a test CA; the active one
    // trusts the CA (--http-tpc-ca), curl too.
    let (ca, leaf, tls_key) = crate::http_client::test_ca(dir.path());
    let (cert, leaf, tls_key) = (
        ca.to_str().unwrap(),
        leaf.to_str().unwrap(),
        tls_key.to_str().unwrap(),
    );
    let key = dir.path().join("key");
    write_key(&key, "a test key of enough length\n");
    let a = mkdir(&dir.path().join("a"));
    let b = mkdir(&dir.path().join("b"));
    let spec_a = format!("a={}", a.display());
    let spec_b = format!("b={}:public", b.display());
    let tls = ["--tls-cert", leaf, "--tls-key", tls_key];
    let active = ["--http-tpc-allow", "loopback", "--http-tpc-leg-min", "1M"];
    let mut sa = server(
        &dir,
        &[
            &["--key-file", key.to_str().unwrap(), "--export", &spec_a][..],
            &active,
            &["--http-tpc-ca", cert],
            &tls,
        ]
        .concat(),
    );
    let mut sb = server(
        &dir,
        &[
            &["--export", &spec_b][..],
            &active,
            &["--http-tpc-ca", cert],
            &tls,
        ]
        .concat(),
    );
    let token = mint(&dir, &key, &["--scope", "storage.read:/a"]);
    random_file(&a.join("f.bin"), 12_000_007, 33);
    let data = std::fs::read(a.join("f.bin")).unwrap();
    let (code, body) = curl(&[
        "--cacert",
        cert,
        "-X",
        "COPY",
        "-H",
        &format!("Source: https://{}/a/f.bin", sa.addr),
        "-H",
        &format!("TransferHeaderAuthorization: Bearer {token}"),
        &format!("https://{}/b/f.bin", sb.addr),
    ]);
    let body = head_str(&body);
    assert_eq!(
        (code, body.lines().last()),
        (202, Some("success: Created")),
        "{body}"
    );
    assert_eq!(std::fs::read(b.join("f.bin")).unwrap(), data);
    sa.log.wait_for(
        Duration::from_secs(10),
        "copy session started (one-time ticket, encrypted with its key)",
    );
    let done = sb.log.wait_for(
        Duration::from_secs(10),
        "keyed by the ticket) from 127.0.0.1:",
    );
    assert!(
        done.contains("over the fatpipe leg (encrypted: TLS 1.3, TLS13_"),
        "{done}"
    );
    assert!(
        done.contains(&format!("adler32={}", adler32(&data))),
        "{done}"
    );
    let m = metrics_text(&sa.metrics);
    assert!(
        m.contains("fatpipe_sessions_total{service=\"copy\",outcome=\"ok\"} 1\n"),
        "{m}"
    );
    let (code, head) = curl(&[
        "--cacert",
        cert,
        "-I",
        "-H",
        "Want-Digest: adler32",
        &format!("https://{}/b/f.bin", sb.addr),
    ]);
    assert_eq!(code, 200);
    assert_eq!(
        header(&head_str(&head), "digest"),
        Some(format!("adler32={}", adler32(&data)).as_str())
    );
    // The push, the other way round: sa pushes its file to sb, over the
    // leg encrypted with sb's write ticket.
    let (code, body) = curl(&[
        "--cacert",
        cert,
        "-X",
        "COPY",
        "-H",
        &format!("Destination: https://{}/b/pushed.bin", sb.addr),
        "-H",
        &format!("Authorization: Bearer {token}"),
        &format!("https://{}/a/f.bin", sa.addr),
    ]);
    let body = head_str(&body);
    assert_eq!(
        (code, body.lines().last()),
        (202, Some("success: Created")),
        "{body}"
    );
    assert_eq!(std::fs::read(b.join("pushed.bin")).unwrap(), data);
    sb.log.wait_for(
        Duration::from_secs(10),
        "copy session started (one-time ticket, encrypted with its key)",
    );
    let done = sa.log.wait_for(
        Duration::from_secs(10),
        "keyed by the ticket) to 127.0.0.1:",
    );
    assert!(
        done.contains("over the fatpipe leg (encrypted: TLS 1.3, TLS13_")
            && done.contains(&format!("adler32={} verified", adler32(&data))),
        "{done}"
    );
}

/// A push between two fatpipe servers goes over the leg: gfal-copy
/// `--copy-mode push` sends the COPY to the source, which asks the
/// destination for a ticket to write the file (`OPTIONS` with
/// `Fatpipe-Ticket: write`, checked as the `PUT` would be) and pushes over
/// the copy protocol; adler32 compared end to end. `Overwrite: F` onto an
/// existing file meets the destination's 412 as over HTTP, and nothing
/// moves; `Overwrite: T` replaces it over the leg.
#[test]
fn tpc_leg_gfal_copy_push_between_two_fatpipe_servers_goes_over_the_leg() {
    if !have("gfal-copy") || !have("curl") {
        return skip(
            "gfal-copy or curl is not installed (Debian: gfal2-util-scripts gfal2-plugin-http)",
        );
    }
    let dir = setup();
    let key = dir.path().join("key");
    write_key(&key, "a test key of enough length\n");
    let a = mkdir(&dir.path().join("a"));
    let b = mkdir(&dir.path().join("b"));
    let spec_a = format!("a={}", a.display());
    let spec_b = format!("b={}", b.display());
    let k = key.to_str().unwrap();
    let mut sa = server(
        &dir,
        &[
            "--key-file",
            k,
            "--export",
            &spec_a,
            "--http-tpc-allow",
            "loopback",
            "--http-tpc-leg-min",
            "1M",
        ],
    );
    let mut sb = server(&dir, &["--key-file", k, "--export", &spec_b]);
    let token = mint(
        &dir,
        &key,
        &[
            "--scope",
            "storage.read:/a",
            // gfal2 first asks whether the destination exists.
            "--scope",
            "storage.read:/b",
            "--scope",
            "storage.create:/b",
            "--scope",
            "storage.modify:/b",
        ],
    );
    random_file(&a.join("f.bin"), 20_000_003, 44);
    let data = std::fs::read(a.join("f.bin")).unwrap();
    let src = format!("http://{}/a/f.bin", sa.addr);
    let out = gfal(
        &[
            "--copy-mode",
            "push",
            "-n",
            "1",
            "-K",
            "adler32",
            &src,
            &format!("http://{}/b/f.bin", sb.addr),
        ],
        Some(&token),
    );
    assert_exit(&out, 0);
    assert_eq!(std::fs::read(b.join("f.bin")).unwrap(), data);
    sb.log.wait_for(
        Duration::from_secs(10),
        "copy session started (one-time ticket)",
    );
    // gfal2 asks for no verification by the server (it compares both
    // ends' adler32 itself, above): every chunk was verified as it landed.
    let done = sa.log.wait_for(
        Duration::from_secs(10),
        "over the fatpipe leg to 127.0.0.1:",
    );
    assert!(done.contains("every chunk verified"), "{done}");
    let m = metrics_text(&sb.metrics);
    assert!(
        m.contains("fatpipe_sessions_total{service=\"copy\",outcome=\"ok\"} 1\n"),
        "{m}"
    );
    let names: Vec<_> = std::fs::read_dir(&b)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["f.bin"], "nothing left beside it");

    let bearer = format!("Authorization: Bearer {token}");
    let forwarded = format!("TransferHeaderAuthorization: Bearer {token}");
    // Overwrite: F onto the existing file: the destination's 412, as a
    // failure line, the file untouched and no session on its copy port.
    std::fs::write(b.join("keep"), b"old").unwrap();
    let (code, body) = copy_curl(
        &src,
        &[
            &format!("Destination: http://{}/b/keep", sb.addr),
            "Overwrite: F",
            &bearer,
            &forwarded,
        ],
    );
    assert_eq!(code, 202);
    let last = body.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("failure: ") && last.contains("412"),
        "{body}"
    );
    assert_eq!(std::fs::read(b.join("keep")).unwrap(), b"old");
    // Overwrite: T replaces it, over the leg.
    let (code, body) = copy_curl(
        &src,
        &[
            &format!("Destination: http://{}/b/keep", sb.addr),
            &bearer,
            &forwarded,
        ],
    );
    assert_eq!(
        (code, body.lines().last()),
        (202, Some("success: Created")),
        "{body}"
    );
    assert_eq!(std::fs::read(b.join("keep")).unwrap(), data);
    // RequireChecksumVerification (default true): the destination's
    // adler32 compared with the source's.
    let done = sa.log.wait_for(
        Duration::from_secs(10),
        "over the fatpipe leg to 127.0.0.1:",
    );
    assert!(
        done.contains(&format!("adler32={} verified", adler32(&data))),
        "{done}"
    );
}

/// A ticket to write follows the token as a `PUT` would (a token that
/// may only read gets its 403 and no ticket), and opens one session that
/// may only write its file: it cannot read it, nor write another.
#[test]
fn tpc_leg_write_tickets_follow_the_token_and_only_write_their_file() {
    if !have("curl") {
        return skip("curl is not installed");
    }
    if cfg!(not(feature = "test-hooks")) {
        return skip("needs the test-hooks feature (FATPIPE_TEST_COPY_TICKET)");
    }
    let dir = setup();
    let key = dir.path().join("key");
    write_key(&key, "a test key of enough length\n");
    let b = mkdir(&dir.path().join("b"));
    let spec_b = format!("b={}", b.display());
    let sb = server(
        &dir,
        &["--key-file", key.to_str().unwrap(), "--export", &spec_b],
    );
    random_file(&b.join("there.bin"), 100_000, 6);
    let url = format!("http://{}/b/new.bin", sb.addr);
    let options = |token: &str| {
        let (code, h) = curl(&[
            "-X",
            "OPTIONS",
            "-i",
            "-H",
            "Fatpipe-Ticket: write",
            "-H",
            &format!("Authorization: Bearer {token}"),
            &url,
        ]);
        (code, head_str(&h))
    };
    let reader = mint(&dir, &key, &["--scope", "storage.read:/b"]);
    let (code, h) = options(&reader);
    assert_eq!(code, 403, "{h}");
    assert_eq!(header(&h, "fatpipe-ticket"), None, "{h}");
    let writer = mint(&dir, &key, &["--scope", "storage.create:/b"]);
    let ticket = || {
        let (code, h) = options(&writer);
        assert_eq!(code, 200, "{h}");
        ticket_of(&h)
    };
    let back = dir.path().join("back");
    // A write ticket does not read (not even its own file, once there).
    let (t, port) = ticket();
    let out = run(dir
        .cmd()
        .env("FATPIPE_TEST_COPY_TICKET", &t)
        .args(["copy", "--retries", "0", "--no-auto", "-q", "--port", &port])
        .arg("127.0.0.1:b/there.bin")
        .arg(&back));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ticket grants only writing b/new.bin"),
        "{err}"
    );
    // Nor writes another file.
    let src = dir.path().join("src.bin");
    random_file(&src, 50_000, 7);
    let (t, port) = ticket();
    let push = |t: &str, port: &str, to: &str| {
        run(dir
            .cmd()
            .env("FATPIPE_TEST_COPY_TICKET", t)
            .args(["copy", "--retries", "0", "--no-auto", "-q", "--port", port])
            .arg(&src)
            .arg(format!("127.0.0.1:b/{to}")))
    };
    let out = push(&t, &port, "other.bin");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ticket grants only writing b/new.bin"),
        "{err}"
    );
    assert!(!b.join("other.bin").exists());
    // A fresh one writes its file.
    let (t, port) = ticket();
    let out = push(&t, &port, "new.bin");
    assert_exit(&out, 0);
    assert_eq!(
        std::fs::read(b.join("new.bin")).unwrap(),
        std::fs::read(&src).unwrap()
    );
}
