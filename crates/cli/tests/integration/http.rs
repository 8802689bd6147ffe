//! `fatpipe server --http`: the exports over HTTP(S)/WebDAV, driven by the
//! real clients storage users have (curl, Debian's davix), and the bearer
//! tokens `fatpipe token` mints. Every check compares what the client got
//! with the bytes on disk, so a served file that is wrong in any byte, a
//! checksum that is not the file's, or a status a client would misread
//! fails a test. Tests needing a client binary skip without it outside CI
//! (`util::skip`; CI installs them through ./test.sh).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::util::{assert_exit, have, random_file, run, setup, skip, wait_for, Dir, Guard, Lines};

/// A server with `--http 127.0.0.1:0` (and `extra`): its guard, the HTTP
/// address, the metrics address and its log lines.
pub(crate) struct Http {
    _guard: Guard,
    pub(crate) addr: String,
    pub(crate) metrics: String,
    pub(crate) log: Lines,
    pid: u32,
}

pub(crate) fn server(dir: &Dir, extra: &[&str]) -> Http {
    let mut cmd = dir.cmd();
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0"])
        .args(["--metrics", "127.0.0.1:0", "--no-probe"])
        .args(["--http", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn fatpipe server");
    let stdout = child.stdout.take().expect("stdout");
    let stderr = child.stderr.take().expect("stderr");
    let pid = child.id();
    let guard = Guard(child);
    let mut lines = BufReader::new(stdout).lines();
    let mut next = || lines.next().and_then(|l| l.ok()).unwrap_or_default();
    let (first, second, third) = (next(), next(), next());
    assert!(first.starts_with("listening on "), "{first}");
    let metrics = second
        .strip_prefix("metrics on ")
        .unwrap_or_else(|| panic!("{second}"))
        .to_string();
    let addr = third
        .strip_prefix("http listening on ")
        .unwrap_or_else(|| panic!("{third}"))
        .split(' ')
        .next()
        .unwrap_or_default()
        .to_string();
    Http {
        _guard: guard,
        addr,
        metrics,
        log: Lines::read(stderr),
        pid,
    }
}

/// Runs curl with `args` (silent, errors shown, a 60 s cap); returns the
/// status code it printed last and its whole stdout.
pub(crate) fn curl(args: &[&str]) -> (u16, Vec<u8>) {
    let out = run(Command::new("curl")
        .args(["-sS", "--max-time", "60", "-w", "\n%{http_code}"])
        .args(args));
    let text = out.stdout;
    let cut = text.iter().rposition(|&b| b == b'\n').unwrap_or(0);
    let code = String::from_utf8_lossy(&text[cut..])
        .trim()
        .parse()
        .unwrap_or(0);
    (code, text[..cut].to_vec())
}

/// Adler-32 (RFC 1950), as the test's own reference.
pub(crate) fn adler32(data: &[u8]) -> String {
    let (mut a, mut b) = (1u32, 0u32);
    for &x in data {
        a = (a + u32::from(x)) % 65521;
        b = (b + a) % 65521;
    }
    format!("{:08x}", (b << 16) | a)
}

pub(crate) fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

pub(crate) fn mint(dir: &Dir, key: &Path, args: &[&str]) -> String {
    let out = run(dir.cmd().args(["token", "--key-file"]).arg(key).args(args));
    assert_exit(&out, 0);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

pub(crate) fn metrics_text(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut t = String::new();
    s.read_to_string(&mut t).unwrap();
    t
}

#[test]
fn http_curl_put_get_ranges_checksums_and_webdav_on_a_public_export() {
    if !have("curl") {
        return skip("curl is not installed");
    }
    let dir = setup();
    let export = crate::util::mkdir(&dir.path().join("pub"));
    let spec = format!("pub={}:public", export.display());
    let s = server(&dir, &["--export", &spec]);
    let base = format!("http://{}/pub", s.addr);
    let src = dir.path().join("src.bin");
    random_file(&src, 3_000_017, 7);
    let data = std::fs::read(&src).unwrap();
    let srcs = src.to_str().unwrap();

    // PUT with a length, then chunked over it: 201 then 204.
    let (code, _) = curl(&["-T", srcs, &format!("{base}/a.bin")]);
    assert_eq!(code, 201);
    let (code, _) = curl(&[
        "-T",
        srcs,
        "-H",
        "Transfer-Encoding: chunked",
        &format!("{base}/a.bin"),
    ]);
    assert_eq!(code, 204);
    assert_eq!(std::fs::read(export.join("a.bin")).unwrap(), data);
    let (code, _) = curl(&[
        "-T",
        srcs,
        "-H",
        "If-None-Match: *",
        &format!("{base}/a.bin"),
    ]);
    assert_eq!(code, 412, "create-only onto an existing file");
    let (code, _) = curl(&[
        "-T",
        srcs,
        "-H",
        "If-Match: *",
        &format!("{base}/nothing.bin"),
    ]);
    assert_eq!(code, 412, "replace-only onto nothing");
    assert!(!export.join("nothing.bin").exists());
    let (code, body) = curl(&[&format!("{base}/a.bin")]);
    assert_eq!((code, body == data), (200, true));

    // HEAD with Want-Digest: exact length, ranges, an ETag, and the
    // adler32 kept from the upload.
    let (code, head) = curl(&["-I", "-H", "Want-Digest: adler32", &format!("{base}/a.bin")]);
    let head = String::from_utf8_lossy(&head).to_string();
    assert_eq!(code, 200, "{head}");
    assert_eq!(header(&head, "content-length"), Some("3000017"));
    assert_eq!(header(&head, "accept-ranges"), Some("bytes"));
    assert!(header(&head, "etag").is_some() && header(&head, "last-modified").is_some());
    assert_eq!(
        header(&head, "digest"),
        Some(format!("adler32={}", adler32(&data)).as_str())
    );
    // md5 and sha-256 on demand (RFC 3230 and RFC 9530 spellings).
    let out = run(Command::new("sh")
        .arg("-c")
        .arg(format!("openssl dgst -sha256 -binary {srcs} | base64")));
    let sha = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let (_, head) = curl(&[
        "-I",
        "-H",
        "Want-Repr-Digest: sha-256=10, adler=1",
        &format!("{base}/a.bin"),
    ]);
    let head = String::from_utf8_lossy(&head).to_string();
    assert_eq!(
        header(&head, "repr-digest"),
        Some(format!("sha-256=:{sha}:").as_str()),
        "{head}"
    );

    // A Digest sent with the body is checked before the name is given.
    let wrong = "Digest: adler32=00000001";
    let (code, body) = curl(&["-T", srcs, "-H", wrong, &format!("{base}/checked.bin")]);
    assert_eq!(code, 400, "{}", String::from_utf8_lossy(&body));
    assert!(!export.join("checked.bin").exists());
    let right = format!("Digest: adler32={}", adler32(&data));
    let (code, _) = curl(&["-T", srcs, "-H", &right, &format!("{base}/checked.bin")]);
    assert_eq!(code, 201);
    std::fs::remove_file(export.join("checked.bin")).unwrap();

    // One range, several (multipart/byteranges), none satisfiable.
    let (code, body) = curl(&["-r", "1000-1999", &format!("{base}/a.bin")]);
    assert_eq!((code, body.as_slice()), (206, &data[1000..2000]));
    let (code, body) = curl(&["-i", "-r", "0-9,2999990-", &format!("{base}/a.bin")]);
    assert_eq!(code, 206);
    let text = String::from_utf8_lossy(&body).to_string();
    let ctype = header(&text, "content-type").unwrap_or_default();
    let boundary = ctype
        .split("boundary=")
        .nth(1)
        .expect("a boundary")
        .to_string();
    let parts: Vec<&[u8]> = split_parts(&body, boundary.as_bytes());
    assert_eq!(parts.len(), 2, "{text:.400}");
    assert!(String::from_utf8_lossy(parts[0]).contains("Content-Range: bytes 0-9/3000017"));
    assert!(parts[0].ends_with(&data[..10]));
    assert!(parts[1].ends_with(&data[2_999_990..]));
    let (code, _) = curl(&["-r", "5000000-", &format!("{base}/a.bin")]);
    assert_eq!(code, 416);

    // An empty file; names with spaces, UTF-8 and percent escapes.
    let empty = dir.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    let (code, _) = curl(&["-T", empty.to_str().unwrap(), &format!("{base}/empty")]);
    assert_eq!(code, 201);
    let (code, head) = curl(&["-I", &format!("{base}/empty")]);
    assert_eq!(code, 200);
    assert_eq!(
        header(&String::from_utf8_lossy(&head), "content-length"),
        Some("0")
    );
    let (code, _) = curl(&["-T", srcs, &format!("{base}/a%20b%C3%A9%2525.bin")]);
    assert_eq!(code, 201);
    assert_eq!(std::fs::read(export.join("a bé%25.bin")).unwrap(), data);

    // A missing parent; climbing and smuggled separators stay inside.
    let (code, _) = curl(&["-T", srcs, &format!("{base}/no/such/f")]);
    assert_eq!(code, 409);
    for bad in [
        "../escape.bin",
        "%2e%2e/escape.bin",
        "x%2f..%2f..%2fescape.bin",
    ] {
        let (code, _) = curl(&["--path-as-is", "-T", srcs, &format!("{base}/{bad}")]);
        assert!(code == 400 || code == 404, "{bad}: {code}");
    }
    assert!(!dir.path().join("escape.bin").exists());

    // WebDAV: MKCOL, PROPFIND 0/1 (a status in every propstat), MOVE,
    // DELETE, OPTIONS.
    let (code, _) = curl(&["-X", "MKCOL", &format!("{base}/d")]);
    assert_eq!(code, 201);
    let (code, _) = curl(&["-X", "MKCOL", &format!("{base}/d")]);
    assert_eq!(code, 405);
    let (code, body) = curl(&["-X", "PROPFIND", "-H", "Depth: 1", &format!("{base}/")]);
    let xml = String::from_utf8_lossy(&body).to_string();
    assert_eq!(code, 207, "{xml}");
    assert_eq!(xml.matches("<D:response>").count(), 5, "{xml}");
    assert_eq!(
        xml.matches("<D:propstat>").count(),
        xml.matches("<D:status>HTTP/1.1 200 OK</D:status>").count()
    );
    assert!(
        xml.contains("<D:href>/pub/a%20b%C3%A9%2525.bin</D:href>"),
        "{xml}"
    );
    assert!(xml.contains("<D:getcontentlength>3000017</D:getcontentlength>"));
    assert!(xml.contains("<D:href>/pub/d/</D:href>"));
    assert!(
        !xml.contains(".fatpipe-"),
        "the server's own files are hidden: {xml}"
    );
    let (code, _) = curl(&[
        "-X",
        "PROPFIND",
        "-H",
        "Depth: infinity",
        &format!("{base}/"),
    ]);
    assert_eq!(code, 403);
    let dest = format!("Destination: {base}/d/moved.bin");
    let (code, _) = curl(&["-X", "MOVE", "-H", &dest, &format!("{base}/a.bin")]);
    assert_eq!(code, 201);
    assert_eq!(std::fs::read(export.join("d/moved.bin")).unwrap(), data);
    let into_itself = format!("Destination: {base}/d/inner");
    let (code, _) = curl(&["-X", "MOVE", "-H", &into_itself, &format!("{base}/d")]);
    assert_eq!(code, 409, "a directory cannot move into itself");
    let (code, _) = curl(&["-X", "DELETE", &format!("{base}/d")]);
    assert_eq!(code, 204);
    assert!(!export.join("d").exists());
    let (code, head) = curl(&["-i", "-X", "OPTIONS", &format!("{base}/")]);
    let head = String::from_utf8_lossy(&head).to_string();
    assert_eq!(code, 200);
    assert_eq!(header(&head, "dav"), Some("1"));
    assert!(header(&head, "allow").is_some_and(|a| a.contains("PROPFIND") && a.contains("PUT")));

    // /metrics counts the requests and the bytes.
    let m = metrics_text(&s.metrics);
    assert!(
        m.contains(r#"fatpipe_http_requests_total{method="PUT",code="201"} 4"#),
        "{m}"
    );
    let received: u64 = m
        .lines()
        .find(|l| l.starts_with(r#"fatpipe_data_bytes_total{service="http",direction="received"}"#))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0);
    assert!(received >= 5 * 3_000_017, "{received}\n{m}");
}

/// Splits a multipart body into its parts (the bytes between boundaries).
fn split_parts<'a>(body: &'a [u8], boundary: &[u8]) -> Vec<&'a [u8]> {
    let mut marker = b"\r\n--".to_vec();
    marker.extend_from_slice(boundary);
    let mut idx = Vec::new();
    let mut i = 0;
    while i + marker.len() <= body.len() {
        if &body[i..i + marker.len()] == marker.as_slice() {
            idx.push(i);
            i += marker.len();
        } else {
            i += 1;
        }
    }
    idx.windows(2)
        .map(|w| &body[w[0] + marker.len()..w[1]])
        .collect()
}

#[test]
fn http_a_cut_off_put_leaves_nothing_under_the_final_name() {
    let dir = setup();
    let export = crate::util::mkdir(&dir.path().join("pub"));
    let spec = format!("pub={}:public", export.display());
    let mut s = server(&dir, &["--export", &spec]);
    std::fs::write(export.join("keep.bin"), b"the old content").unwrap();
    let mut c = TcpStream::connect(&s.addr).unwrap();
    write!(
        c,
        "PUT /pub/keep.bin HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n"
    )
    .unwrap();
    c.write_all(&vec![7u8; 100_000]).unwrap();
    drop(c);
    s.log
        .wait_for(Duration::from_secs(30), "PUT /pub/keep.bin -> 400");
    assert_eq!(
        std::fs::read(export.join("keep.bin")).unwrap(),
        b"the old content"
    );
    let names: Vec<String> = std::fs::read_dir(&export)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["keep.bin"], "no temporary file is left");
    if have("curl") {
        let src = dir.path().join("new");
        random_file(&src, 200_000, 3);
        let (code, _) = curl(&[
            "-T",
            src.to_str().unwrap(),
            &format!("http://{}/pub/keep.bin", s.addr),
        ]);
        assert_eq!(code, 204);
        assert_eq!(
            std::fs::read(export.join("keep.bin")).unwrap(),
            std::fs::read(&src).unwrap()
        );
    }
}

#[test]
fn http_tokens_grant_their_scope_at_path_boundaries_until_they_expire() {
    if !have("curl") {
        return skip("curl is not installed");
    }
    let dir = setup();
    let key = dir.path().join("key");
    crate::util::write_key(&key, "a test key of enough length\n");
    let export = crate::util::mkdir(&dir.path().join("data"));
    crate::util::mkdir(&export.join("up"));
    crate::util::mkdir(&export.join("upload"));
    let spec = format!("data={}", export.display());
    let s = server(
        &dir,
        &["--key-file", key.to_str().unwrap(), "--export", &spec],
    );
    let url = |p: &str| format!("http://{}/data/{p}", s.addr);
    let src = dir.path().join("f");
    std::fs::write(&src, b"payload").unwrap();
    let put = |token: &str, p: &str| {
        let auth = format!("Authorization: Bearer {token}");
        curl(&["-T", src.to_str().unwrap(), "-H", &auth, &url(p)])
    };

    let (code, body) = curl(&["-T", src.to_str().unwrap(), &url("up/x")]);
    assert_eq!(code, 401, "no token: {}", String::from_utf8_lossy(&body));
    // With `Expect: 100-continue` the refusal comes before the body is sent.
    let big = dir.path().join("big");
    random_file(&big, 3_000_000, 1);
    let out = run(Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code} %{size_upload}"])
        .args(["-H", "Expect: 100-continue", "-T"])
        .arg(&big)
        .arg(url("up/big")));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "401 0");
    let right = mint(
        &dir,
        &key,
        &[
            "--scope",
            "storage.modify:/data/up",
            "--scope",
            "storage.read:/data",
        ],
    );
    assert_eq!(put(&right, "up/x").0, 201);
    let (code, body) = put(&right, "upload/x");
    assert_eq!(code, 403, "a string prefix is not a path prefix");
    assert!(
        String::from_utf8_lossy(&body).contains("does not grant storage.create on /data/upload/x")
    );
    let auth = format!("Authorization: Bearer {right}");
    let (code, body) = curl(&["-H", &auth, &url("up/x")]);
    assert_eq!((code, body.as_slice()), (200, &b"payload"[..]));
    let read_only = mint(&dir, &key, &["--scope", "storage.read:/data"]);
    assert_eq!(put(&read_only, "up/y").0, 403, "wrong scope");
    let create = mint(&dir, &key, &["--scope", "storage.create:/data/up"]);
    assert_eq!(put(&create, "up/new").0, 201);
    assert_eq!(put(&create, "up/new").0, 403, "create does not overwrite");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let old = (now - 7200).to_string();
    let expired = mint(
        &dir,
        &key,
        &[
            "--scope",
            "storage.modify:/",
            "--issued-at",
            &old,
            "--lifetime",
            "1h",
        ],
    );
    let (code, body) = put(&expired, "up/z");
    assert_eq!(code, 401);
    assert!(String::from_utf8_lossy(&body).contains("expired"));
    let other = mint(
        &dir,
        &key,
        &[
            "--scope",
            "storage.modify:/",
            "--aud",
            "https://elsewhere.example",
        ],
    );
    let (code, body) = put(&other, "up/z");
    assert_eq!(code, 401);
    assert!(String::from_utf8_lossy(&body).contains("audience"));
    let other_key = dir.path().join("other-key");
    crate::util::write_key(&other_key, "another key of enough length\n");
    let forged = mint(&dir, &other_key, &["--scope", "storage.modify:/"]);
    assert_eq!(put(&forged, "up/z").0, 401);
    assert!(!export.join("up/z").exists() && !export.join("upload/x").exists());
    let out = run(dir
        .cmd()
        .args(["token", "--key-file"])
        .arg(&key)
        .args(["--scope", "storage.write:/"]));
    assert_exit(&out, 2);
}

#[test]
fn http_https_with_a_test_certificate() {
    if !have("curl") || !have("openssl") {
        return skip("curl or openssl is not installed");
    }
    let dir = setup();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let out = run(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ])
        .args([
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert));
    assert_exit(&out, 0);
    let export = crate::util::mkdir(&dir.path().join("pub"));
    random_file(&export.join("f.bin"), 1_000_003, 5);
    let spec = format!("pub={}:public", export.display());
    let s = server(
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
    let url = format!("https://{}/pub/f.bin", s.addr);
    let (code, body) = curl(&["--cacert", cert.to_str().unwrap(), &url]);
    assert_eq!(code, 200);
    assert_eq!(body, std::fs::read(export.join("f.bin")).unwrap());
    let src = dir.path().join("up");
    random_file(&src, 500_000, 9);
    let (code, _) = curl(&[
        "--cacert",
        cert.to_str().unwrap(),
        "-T",
        src.to_str().unwrap(),
        &format!("https://{}/pub/up.bin", s.addr),
    ]);
    assert_eq!(code, 201);
    assert_eq!(
        std::fs::read(export.join("up.bin")).unwrap(),
        std::fs::read(&src).unwrap()
    );
    // Plain HTTP on the HTTPS port is refused, not served in clear.
    let (code, _) = curl(&[&format!("http://{}/pub/f.bin", s.addr)]);
    assert_ne!(code, 200);
    if have("davix-get") {
        let got = dir.path().join("got.bin");
        let out = run(Command::new("davix-get")
            .arg("-k")
            .arg(format!("davs://{}/pub/f.bin", s.addr))
            .arg(&got));
        assert_exit(&out, 0);
        assert_eq!(
            std::fs::read(&got).unwrap(),
            std::fs::read(export.join("f.bin")).unwrap()
        );
    }
}

#[test]
fn http_davix_put_get_ls_and_its_functional_tests() {
    if !have("davix-put") || !have("davix-tester") {
        return skip("davix or davix-tests is not installed (Debian: davix davix-tests)");
    }
    let dir = setup();
    let export = crate::util::mkdir(&dir.path().join("pub"));
    let spec = format!("pub={}:public", export.display());
    let s = server(&dir, &["--export", &spec]);
    let src = dir.path().join("src.bin");
    random_file(&src, 2_000_000, 11);
    let url = format!("http://{}/pub/dav%20put.bin", s.addr);
    assert_exit(&run(Command::new("davix-put").arg(&src).arg(&url)), 0);
    assert_eq!(
        std::fs::read(export.join("dav put.bin")).unwrap(),
        std::fs::read(&src).unwrap()
    );
    let got = dir.path().join("got.bin");
    assert_exit(&run(Command::new("davix-get").arg(&url).arg(&got)), 0);
    assert_eq!(std::fs::read(&got).unwrap(), std::fs::read(&src).unwrap());
    let out: Output = run(Command::new("davix-ls")
        .arg("-l")
        .arg(format!("dav://{}/pub/", s.addr)));
    assert_exit(&out, 0);
    let ls = String::from_utf8_lossy(&out.stdout);
    // davix 0.8 prints the href's last segment as sent (percent-encoded).
    assert!(
        (ls.contains("dav put.bin") || ls.contains("dav%20put.bin")) && ls.contains("2000000"),
        "{ls}"
    );
    let out = run(Command::new("davix-tester")
        .args(["--auth", "proxy", "--command", "fulltest", "--uri"])
        .arg(format!("http://{}/pub/davix-tests", s.addr)));
    assert_exit(&out, 0);
    wait_for(
        Duration::from_secs(5),
        "the tester's directory to go",
        || !export.join("davix-tests").exists(),
    );
}

#[test]
fn http_sigterm_drains_and_idle_connections_end() {
    let dir = setup();
    let export = crate::util::mkdir(&dir.path().join("pub"));
    let spec = format!("pub={}:public", export.display());
    let mut s = server(&dir, &["--export", &spec, "--drain-timeout", "2s"]);
    // A keep-alive connection that made one request and went quiet.
    let mut c = TcpStream::connect(&s.addr).unwrap();
    write!(c, "OPTIONS /pub/ HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut buf = [0u8; 512];
    let n = c.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let kill = Command::new("kill")
        .arg("-TERM")
        .arg(s.pid.to_string())
        .status()
        .unwrap();
    assert!(kill.success());
    s.log.wait_for(Duration::from_secs(10), "shutting down");
    assert!(
        crate::util::exits_within(s.pid, Duration::from_secs(15)),
        "the server drained and exited"
    );
}

/// gfal-copy runs on Debian's Python; a Python of another installation
/// first on the PATH cannot import gfal2, so it is named.
pub(crate) fn gfal(args: &[&str], token: Option<&str>) -> Output {
    let mut c = Command::new("gfal-copy");
    if Path::new("/usr/bin/python3").exists() {
        c.env("GFAL_PYTHONBIN", "/usr/bin/python3");
    }
    if let Some(t) = token {
        c.env("BEARER_TOKEN", t);
    }
    run(c.args(["-t", "60"]).args(args))
}

#[test]
fn http_gfal_copy_streams_in_and_out_with_adler32_and_a_token() {
    if !have("gfal-copy") {
        return skip("gfal-copy is not installed (Debian: gfal2-util-scripts gfal2-plugin-http gfal2-plugin-file)");
    }
    let dir = setup();
    let key = dir.path().join("key");
    crate::util::write_key(&key, "a test key of enough length\n");
    let export = crate::util::mkdir(&dir.path().join("data"));
    let spec = format!("data={}", export.display());
    let mut s = server(
        &dir,
        &["--key-file", key.to_str().unwrap(), "--export", &spec],
    );
    let token = mint(
        &dir,
        &key,
        &[
            "--scope",
            "storage.modify:/data",
            "--scope",
            "storage.read:/data",
        ],
    );
    let src = dir.path().join("src.bin");
    random_file(&src, 5_000_000, 13);
    let data = std::fs::read(&src).unwrap();
    let src_url = format!("file://{}", src.display());
    // In (creating the parent, as -p does: PROPFIND, MKCOL), verified by
    // adler32 against the server's Digest.
    let dav = format!("dav://{}/data/sub/g.bin", s.addr);
    let out = gfal(&["-p", "-K", "adler32", &src_url, &dav], Some(&token));
    assert_exit(&out, 0);
    assert_eq!(std::fs::read(export.join("sub/g.bin")).unwrap(), data);
    s.log
        .wait_for(Duration::from_secs(10), "MKCOL /data/sub -> 201");
    // Out, verified the same way.
    let back = dir.path().join("back.bin");
    let out = gfal(
        &[
            "-K",
            "adler32",
            &format!("http://{}/data/sub/g.bin", s.addr),
            &format!("file://{}", back.display()),
        ],
        Some(&token),
    );
    assert_exit(&out, 0);
    assert_eq!(std::fs::read(&back).unwrap(), data);
    // Without the token: refused, nothing written.
    let out = gfal(
        &[&src_url, &format!("dav://{}/data/other.bin", s.addr)],
        None,
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(!export.join("other.bin").exists());
}

/// Base64url without padding (RFC 4648 §5), as JWTs use it.
fn b64url(data: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for c in data.chunks(3) {
        let n = c
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..=c.len() {
            out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// An RS256 JWT for `claims`, signed by the RSA key in `pem` with the
/// openssl CLI (the test's independent signer).
fn rs256(dir: &Path, pem: &Path, kid: &str, claims: &str) -> String {
    let signed = format!(
        "{}.{}",
        b64url(format!(r#"{{"alg":"RS256","typ":"JWT","kid":"{kid}"}}"#).as_bytes()),
        b64url(claims.as_bytes())
    );
    let input = dir.join("signed.txt");
    std::fs::write(&input, &signed).unwrap();
    let sig = dir.join("sig.bin");
    let out = run(Command::new("openssl")
        .args(["dgst", "-sha256", "-sign"])
        .arg(pem)
        .arg("-out")
        .arg(&sig)
        .arg(&input));
    assert_exit(&out, 0);
    format!("{signed}.{}", b64url(&std::fs::read(&sig).unwrap()))
}

#[test]
fn http_tokens_of_an_external_issuer_verify_against_its_jwks() {
    if !have("curl") || !have("openssl") {
        return skip("curl or openssl is not installed");
    }
    let dir = setup();
    let (pem, other) = (dir.path().join("rsa.pem"), dir.path().join("other.pem"));
    for p in [&pem, &other] {
        let out = run(Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
            ])
            .arg(p));
        assert_exit(&out, 0);
    }
    let out = run(Command::new("openssl")
        .args(["rsa", "-noout", "-modulus", "-in"])
        .arg(&pem));
    assert_exit(&out, 0);
    let hex = String::from_utf8_lossy(&out.stdout)
        .trim()
        .trim_start_matches("Modulus=")
        .to_string();
    let n: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let jwks = dir.path().join("jwks.json");
    std::fs::write(
        &jwks,
        format!(r#"{{"keys":[{{"kty":"RSA","kid":"t1","alg":"RS256","use":"sig","n":"{}","e":"AQAB"}}]}}"#, b64url(&n)),
    )
    .unwrap();
    let export = crate::util::mkdir(&dir.path().join("data"));
    let spec = format!("data={}", export.display());
    let issuer = format!("https://iam.test/={}", jwks.display());
    let s = server(&dir, &["--export", &spec, "--http-issuer", &issuer]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = |iss: &str, scope: &str| {
        format!(
            r#"{{"iss":"{iss}","sub":"bob","aud":"https://wlcg.cern.ch/jwt/v1/any","exp":{},"iat":{now},"scope":"{scope}","wlcg.ver":"1.0"}}"#,
            now + 600
        )
    };
    let src = dir.path().join("f");
    std::fs::write(&src, b"from an external issuer").unwrap();
    let put = |token: &str, name: &str| {
        let auth = format!("Authorization: Bearer {token}");
        let url = format!("http://{}/data/{name}", s.addr);
        curl(&["-T", src.to_str().unwrap(), "-H", &auth, &url])
    };
    let good = rs256(
        dir.path(),
        &pem,
        "t1",
        &claims("https://iam.test/", "storage.create:/data"),
    );
    assert_eq!(put(&good, "a").0, 201);
    assert_eq!(
        std::fs::read(export.join("a")).unwrap(),
        b"from an external issuer"
    );
    let forged = rs256(
        dir.path(),
        &other,
        "t1",
        &claims("https://iam.test/", "storage.create:/data"),
    );
    assert_eq!(put(&forged, "b").0, 401, "signed by a key not in the JWKS");
    let stranger = rs256(
        dir.path(),
        &pem,
        "t1",
        &claims("https://other.test/", "storage.create:/data"),
    );
    assert_eq!(put(&stranger, "b").0, 401, "an issuer not trusted");
    let narrow = rs256(
        dir.path(),
        &pem,
        "t1",
        &claims("https://iam.test/", "storage.read:/data"),
    );
    assert_eq!(put(&narrow, "b").0, 403);
    assert!(!export.join("b").exists());
}

#[test]
fn http_static_tokens_of_a_token_file() {
    if !have("curl") {
        return skip("curl is not installed");
    }
    let dir = setup();
    let export = crate::util::mkdir(&dir.path().join("data"));
    let file = dir.path().join("tokens");
    std::fs::write(
        &file,
        "# writer of /data/in\nw-4f1c2a9e7b3d8e60 storage.create:/data/in\n",
    )
    .unwrap();
    crate::util::mkdir(&export.join("in"));
    let spec = format!("data={}", export.display());
    let s = server(
        &dir,
        &[
            "--export",
            &spec,
            "--http-token-file",
            file.to_str().unwrap(),
        ],
    );
    let src = dir.path().join("f");
    std::fs::write(&src, b"static").unwrap();
    let put = |token: &str, p: &str| {
        let auth = format!("Authorization: Bearer {token}");
        curl(&[
            "-T",
            src.to_str().unwrap(),
            "-H",
            &auth,
            &format!("http://{}/data/{p}", s.addr),
        ])
        .0
    };
    assert_eq!(put("w-4f1c2a9e7b3d8e60", "in/a"), 201);
    assert_eq!(put("w-4f1c2a9e7b3d8e60", "other"), 403);
    assert_eq!(put("w-4f1c2a9e7b3d8e6X", "in/b"), 401);
    assert!(!export.join("in/b").exists() && !export.join("other").exists());
    let bad = dir.path().join("bad");
    std::fs::write(&bad, "short storage.read:/\n").unwrap();
    let out = run(dir
        .cmd()
        .args([
            "server",
            "--port",
            "0",
            "--http",
            "127.0.0.1:0",
            "--http-token-file",
        ])
        .arg(&bad));
    assert_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 1"));
}

#[test]
fn http_offsets_past_4_gib_are_served_exactly() {
    if !have("curl") {
        return skip("curl is not installed");
    }
    let dir = setup();
    let export = crate::util::mkdir(&dir.path().join("pub"));
    // A sparse 5 GiB file with markers past the 4 GiB boundary.
    let size: u64 = 5 * (1 << 30) + 17;
    let f = std::fs::File::create(export.join("big")).unwrap();
    f.set_len(size).unwrap();
    use std::os::unix::fs::FileExt;
    let at: u64 = (1 << 32) + 1000;
    f.write_all_at(b"past four gibibytes", at).unwrap();
    f.write_all_at(b"END", size - 3).unwrap();
    drop(f);
    let spec = format!("pub={}:public", export.display());
    let s = server(&dir, &["--export", &spec]);
    let url = format!("http://{}/pub/big", s.addr);
    let (code, head) = curl(&["-I", &url]);
    assert_eq!(code, 200);
    assert_eq!(
        header(&String::from_utf8_lossy(&head), "content-length"),
        Some(size.to_string().as_str())
    );
    let r = format!("{at}-{}", at + 18);
    let (code, body) = curl(&["-r", &r, &url]);
    assert_eq!((code, body.as_slice()), (206, &b"past four gibibytes"[..]));
    let (code, body) = curl(&["-r", "-3", &url]);
    assert_eq!((code, body.as_slice()), (206, &b"END"[..]));
    let (code, body) = curl(&["-X", "PROPFIND", "-H", "Depth: 0", &url]);
    assert_eq!(code, 207);
    assert!(String::from_utf8_lossy(&body).contains(&format!("<D:getcontentlength>{size}<")));
}

#[test]
fn http_a_silent_connection_is_closed_at_the_preauth_deadline_and_sessions_are_capped() {
    let dir = setup();
    let export = crate::util::mkdir(&dir.path().join("pub"));
    let spec = format!("pub={}:public", export.display());
    let s = server(
        &dir,
        &[
            "--export",
            &spec,
            "--preauth-timeout",
            "1s",
            "--max-sessions-per-source",
            "1",
        ],
    );
    // Says nothing: closed by the deadline (read sees the end, not our
    // own 20 s timeout).
    let mut quiet = TcpStream::connect(&s.addr).unwrap();
    quiet
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let started = std::time::Instant::now();
    let mut buf = [0u8; 256];
    let n = quiet.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "nothing is answered to silence");
    assert!(started.elapsed() < Duration::from_secs(15));
    // One admitted keep-alive connection from this address; a second one
    // is refused with the cap's name.
    let mut first = TcpStream::connect(&s.addr).unwrap();
    first
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    write!(first, "OPTIONS /pub/ HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let n = first.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let mut second = TcpStream::connect(&s.addr).unwrap();
    second
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    write!(second, "OPTIONS /pub/ HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = second.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("--max-sessions-per-source"), "{answer}");
    drop(first);
}

/// `--archive`: each file transfer (a PUT, a GET, a ranged GET) is a run
/// of the archive with its bytes and peer; a HEAD or a listing is not.
#[test]
fn http_archive_records_each_file_transfer_with_its_bytes_and_peer() {
    if !have("curl") {
        return skip("curl is not installed");
    }
    let dir = setup();
    let export = crate::util::mkdir(&dir.path().join("pub"));
    let spec = format!("pub={}:public", export.display());
    let db = dir.path().join("a.sqlite");
    let archive = format!("--archive={}", db.display());
    let s = server(&dir, &["--export", &spec, &archive]);
    let base = format!("http://{}/pub", s.addr);
    let src = dir.path().join("src.bin");
    random_file(&src, 1_000_003, 11);
    let (code, _) = curl(&["-T", src.to_str().unwrap(), &format!("{base}/f.bin")]);
    assert_eq!(code, 201);
    let (code, body) = curl(&[&format!("{base}/f.bin")]);
    assert_eq!((code, body.len()), (200, 1_000_003));
    let (code, body) = curl(&["-r", "10-109", &format!("{base}/f.bin")]);
    assert_eq!((code, body.len()), (206, 100));
    let (code, _) = curl(&["-I", &format!("{base}/f.bin")]);
    assert_eq!(code, 200);
    let (code, _) = curl(&[&format!("{base}/")]);
    assert_eq!(code, 200);
    let list = || {
        let out = run(dir.cmd().args(["archive", "list", "--json"]).arg(&archive));
        assert_exit(&out, 0);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .collect::<Vec<_>>()
    };
    // The server stores them on a thread of its own: wait for the three.
    wait_for(Duration::from_secs(20), "three runs in the archive", || {
        list().len() >= 3
    });
    let runs = list();
    assert_eq!(runs.len(), 3, "{runs:?}");
    let bytes: Vec<u64> = runs
        .iter()
        .map(|r| r["metrics"]["bytes"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(bytes, [1_000_003, 1_000_003, 100], "{runs:?}");
    for r in &runs {
        assert_eq!(r["kind"], "copy", "{r}");
        assert_eq!(r["status"], "ok", "{r}");
        assert!(
            r["peer"].as_str().unwrap_or("").starts_with("127.0.0.1:"),
            "{r}"
        );
    }
}

/// On a long path the HTTP port sends a large file in about one round trip
/// once the connection's window has opened: the server forces a send
/// buffer sized from the connection's round trip and the body
/// (`fatpipe_tune::respond`), where the host's autotuning (pinned here to
/// Linux's default `tcp_wmem` maximum of 4 MiB) would let an 8 MiB body
/// out in three. Third-party copies of small files (FTS issues one COPY
/// per file) are paid in those round trips. The bound comes from the path:
/// the fastest of four GETs on a warm connection within 2.5 round trips
/// (request, wire time of 67 ms, slack); with autotuning's limit they took
/// 3.3.
#[test]
fn lab_http_a_warm_get_of_8_mib_takes_about_one_round_trip_on_a_long_path() {
    use fatpipe_lab::{End, LinkSpec};
    let test = "lab_http_a_warm_get_of_8_mib_takes_about_one_round_trip_on_a_long_path";
    if !crate::util::need_root(test) {
        return;
    }
    if !have("curl") {
        skip("curl is not installed (test.sh installs it)");
        return;
    }
    let dir = setup();
    let exp = dir.path().join("exp");
    std::fs::create_dir(&exp).unwrap();
    random_file(&exp.join("f.bin"), 8 << 20, 11);
    let rtt = Duration::from_millis(93);
    let name = format!("hsb{}", std::process::id());
    let export = format!("data={}:public", exp.display());
    let (lab, _srv, _, _) = crate::util::lab_with_server(
        &name,
        &LinkSpec::new(rtt, 1_000_000_000),
        &["--export", &export, "--http", "0.0.0.0:8480"],
    );
    // Linux's default, whatever the host's namespaces start with; read by
    // the server at its first file GET.
    let pin = run(lab
        .command(End::B, "sysctl")
        .args(["-qw", "net.ipv4.tcp_wmem=4096 16384 4194304"]));
    assert_exit(&pin, 0);
    let url = format!("http://{}:8480/data/f.bin", lab.addr(End::B));
    let mut curl = lab.command(End::A, "curl");
    curl.args([
        "-sS",
        "--max-time",
        "60",
        "--retry",
        "20",
        "--retry-connrefused",
    ])
    .args(["--retry-delay", "1", "-w", "%{time_total}\n"]);
    for _ in 0..5 {
        curl.args(["-o", "/dev/null", &url]);
    }
    let out = run(&mut curl);
    assert_exit(&out, 0);
    let times: Vec<f64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    assert_eq!(times.len(), 5, "{times:?}");
    // The first GET opens the connection and the window (slow start).
    let fastest = times[1..].iter().copied().fold(f64::INFINITY, f64::min);
    let bound = 2.5 * rtt.as_secs_f64();
    assert!(
        fastest < bound,
        "the fastest warm 8 MiB GET took {fastest:.3} s, over {bound:.3} s \
         (2.5 round trips of {rtt:?}): all of them {times:?}"
    );
}
