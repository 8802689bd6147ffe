//! `--encrypt` (docs/encryption.md) against a real `fatpipe server` on
//! loopback: copies both ways, a test, the refusals (wrong key, no key,
//! UDP, a plaintext client at an `:encrypted` export), and what a relay in
//! the middle sees and can do: the file's bytes are visible without
//! `--encrypt` and not with it, and a byte it flips is caught as a TLS
//! authentication failure, after which the copy reconnects and the file
//! arrives intact.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::util::{
    self, assert_exit, assert_same_tree, json, mkdir, random_file, stderr, Dir, Guard,
};

const KEY: &str = "encrypt-test-key-0123456789\n";

/// A server with `exports`, its port, and the file its log goes to.
struct Server {
    _guard: Guard,
    port: u16,
    log: PathBuf,
}

fn server(dir: &Dir, exports: &[String]) -> Server {
    let key = key_file(dir, "key", KEY);
    let log = dir.path().join("server.log");
    let mut c = Command::new(util::bin());
    c.current_dir(dir.path())
        .args(["server", "--bind", "127.0.0.1", "--port", "0", "--key-file"])
        .arg(&key)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap());
    for e in exports {
        c.arg("--export").arg(e);
    }
    let mut child = c.spawn().expect("spawn server");
    let stdout = child.stdout.take().expect("server stdout");
    let guard = Guard(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let port = line
        .trim()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    Server {
        _guard: guard,
        port,
        log,
    }
}

fn key_file(dir: &Dir, name: &str, text: &str) -> PathBuf {
    let p = dir.path().join(name);
    crate::util::write_key(&p, text);
    p
}

/// `fatpipe copy` to `port` with the test key, no pre-flight, few retries.
fn copy(dir: &Dir, port: u16) -> Command {
    let mut c = dir.cmd();
    c.args([
        "copy",
        "--no-auto",
        "--retries",
        "3",
        "--port",
        &port.to_string(),
    ])
    .arg("--key-file")
    .arg(dir.path().join("key"));
    c
}

#[test]
fn encrypted_copy_push_and_pull_give_an_identical_tree() {
    let dir = util::setup();
    let src = mkdir(&dir.path().join("src/tree"));
    random_file(&src.join("big.bin"), 3 << 20, 7);
    std::fs::write(src.join("small.txt"), b"hello\n").unwrap();
    mkdir(&src.join("sub"));
    random_file(&src.join("sub/mid.bin"), 300_000, 8);
    let exp = mkdir(&dir.path().join("export"));
    let srv = server(&dir, &[format!("data={}:encrypted", exp.display())]);

    let out = util::run(
        copy(&dir, srv.port)
            .args(["--encrypt", "-r", "--json", "-P", "3", "--chunk-size", "1M"])
            .arg(&src)
            .arg("127.0.0.1:data/"),
    );
    assert_exit(&out, 0);
    let j = json(&out);
    assert_eq!(j["encryption"]["protocol"], "TLS 1.3", "{j}");
    assert_eq!(j["encryption"]["suite"], "TLS13_AES_128_GCM_SHA256", "{j}");
    // sendfile would bypass TLS: the encrypted path writes.
    assert_eq!(j["io_local"], "pread+write", "{j}");
    assert_same_tree(&src, &exp.join("tree"));

    let back = mkdir(&dir.path().join("back"));
    let out = util::run(
        copy(&dir, srv.port)
            .args(["--encrypt", "-r", "--json"])
            .arg("127.0.0.1:data/tree")
            .arg(&back),
    );
    assert_exit(&out, 0);
    let j = json(&out);
    assert_eq!(j["encryption"]["suite"], "TLS13_AES_128_GCM_SHA256", "{j}");
    assert_eq!(j["io_remote"], "pread+write", "{j}");
    assert_same_tree(&src, &back.join("tree"));
}

#[test]
fn encrypted_test_names_its_suite_in_json() {
    let dir = util::setup();
    let srv = server(&dir, &[]);
    let out = util::run(
        dir.cmd()
            .args([
                "test",
                "--encrypt",
                "--no-auto",
                "--json",
                "-t",
                "1",
                "--key-file",
            ])
            .arg(dir.path().join("key"))
            .args(["--port", &srv.port.to_string(), "127.0.0.1"]),
    );
    assert_exit(&out, 0);
    let j = json(&out);
    let start = &j["start"];
    assert_eq!(start["encryption"]["protocol"], "TLS 1.3", "{start}");
    assert_eq!(
        start["encryption"]["suite"], "TLS13_AES_128_GCM_SHA256",
        "{start}"
    );
    assert_eq!(start["local"][0]["send_path"], "tls", "{start}");
    assert!(
        j["end"]["sums"][0]["bytes"].as_u64().unwrap_or(0) > 0,
        "{j}"
    );
}

#[test]
fn encrypt_with_a_wrong_key_is_refused_in_one_line() {
    let dir = util::setup();
    let exp = mkdir(&dir.path().join("export"));
    let srv = server(&dir, &[format!("data={}", exp.display())]);
    std::fs::write(dir.path().join("f"), b"x").unwrap();
    let wrong = key_file(&dir, "wrong", "not-the-server-key-at-all\n");
    let out = util::run(
        dir.cmd()
            .args([
                "copy",
                "--encrypt",
                "--no-auto",
                "--port",
                &srv.port.to_string(),
            ])
            .arg("--key-file")
            .arg(&wrong)
            .arg(dir.path().join("f"))
            .arg("127.0.0.1:data/f"),
    );
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("does not hold this pre-shared key"), "{err}");
    assert!(!exp.join("f").exists());
}

#[test]
fn encrypt_needs_a_key_and_tcp() {
    let dir = util::setup();
    std::fs::write(dir.path().join("f"), b"x").unwrap();
    // Refused before connecting: nothing listens on port 9.
    let out =
        util::run(
            dir.cmd()
                .args(["copy", "--encrypt", "--port", "9", "f", "127.0.0.1:data/f"]),
        );
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--encrypt needs the pre-shared key"), "{err}");

    let key = key_file(&dir, "key", KEY);
    let out = util::run(
        dir.cmd()
            .args(["test", "-u", "--encrypt", "--port", "9", "--key-file"])
            .arg(&key)
            .arg("127.0.0.1"),
    );
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("UDP"), "{err}");
}

#[test]
fn plaintext_client_at_an_encrypted_export_is_told_to_add_encrypt() {
    let dir = util::setup();
    let exp = mkdir(&dir.path().join("export"));
    let srv = server(&dir, &[format!("data={}:encrypted", exp.display())]);
    std::fs::write(dir.path().join("f"), b"secret").unwrap();
    let out = util::run(
        copy(&dir, srv.port)
            .arg(dir.path().join("f"))
            .arg("127.0.0.1:data/f"),
    );
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("add --encrypt"), "{err}");
    assert!(!exp.join("f").exists());
}

/// A relay on loopback between client and server: records what the client
/// sends, and can flip one byte once a connection has carried `flip_at`
/// bytes towards the server.
struct Relay {
    port: u16,
    seen: Arc<Mutex<Vec<u8>>>,
    flipped: Arc<AtomicBool>,
}

impl Relay {
    fn start(server_port: u16, flip_at: Option<u64>) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let flipped = Arc::new(AtomicBool::new(false));
        let (s, f) = (Arc::clone(&seen), Arc::clone(&flipped));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(("127.0.0.1", server_port)) else {
                    return;
                };
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (seen, flipped) = (Arc::clone(&s), Arc::clone(&f));
                std::thread::spawn(move || pump(client, server, Some((seen, flipped, flip_at))));
                std::thread::spawn(move || pump(s2, c2, None));
            }
        });
        Relay {
            port,
            seen,
            flipped,
        }
    }

    fn saw(&self, needle: &[u8]) -> bool {
        let seen = self.seen.lock().unwrap();
        seen.windows(needle.len()).any(|w| w == needle)
    }
}

type Tap = (Arc<Mutex<Vec<u8>>>, Arc<AtomicBool>, Option<u64>);

fn pump(mut from: TcpStream, mut to: TcpStream, tap: Option<Tap>) {
    let mut buf = vec![0u8; 64 * 1024];
    let carried = AtomicU64::new(0);
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some((seen, flipped, flip_at)) = &tap {
            let before = carried.fetch_add(n as u64, Ordering::Relaxed);
            if let Some(at) = *flip_at {
                let end = before + n as u64;
                if before <= at && at < end && !flipped.swap(true, Ordering::SeqCst) {
                    buf[(at - before) as usize] ^= 0x20;
                }
            }
            let mut s = seen.lock().unwrap();
            if s.len() < 64 << 20 {
                s.extend_from_slice(&buf[..n]);
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// A file that is the marker over and over (1 MiB).
fn marked_file(path: &Path, marker: &[u8]) {
    let mut data = Vec::with_capacity(1 << 20);
    while data.len() < 1 << 20 {
        data.extend_from_slice(marker);
    }
    std::fs::write(path, data).unwrap();
}

/// The encrypted copy's destination name, looked for in what the relay saw.
const SECRET_NAME: &str = "tls-destination-name-5e0c2a";

#[test]
fn an_observer_sees_the_data_without_encrypt_and_not_with_it() {
    let dir = util::setup();
    let exp = mkdir(&dir.path().join("export"));
    let srv = server(&dir, &[format!("data={}", exp.display())]);
    let marker = b"MARKER-3f9a1c-the-patients-genome-";
    marked_file(&dir.path().join("f"), marker);

    let plain = Relay::start(srv.port, None);
    let out = util::run(copy(&dir, plain.port).args(["-P", "1", "f", "127.0.0.1:data/plain"]));
    assert_exit(&out, 0);
    assert!(
        plain.saw(marker),
        "the relay should see the plaintext copy's data"
    );

    let tls = Relay::start(srv.port, None);
    // A name long enough that ciphertext cannot hold it by chance: a
    // 3-byte one ("tls") turns up in 1 MiB of random bytes about 6 % of
    // the time, and did in CI.
    let out = util::run(copy(&dir, tls.port).args([
        "--encrypt",
        "-P",
        "1",
        "f",
        &format!("127.0.0.1:data/{SECRET_NAME}"),
    ]));
    assert_exit(&out, 0);
    assert!(!tls.seen.lock().unwrap().is_empty());
    assert!(!tls.saw(marker), "the relay saw the encrypted copy's data");
    // Nor the names or the export: only TLS records after the hello.
    assert!(
        !tls.saw(SECRET_NAME.as_bytes()),
        "the relay saw a path of the encrypted copy"
    );
    assert_eq!(
        std::fs::read(exp.join(SECRET_NAME)).unwrap(),
        std::fs::read(dir.path().join("f")).unwrap()
    );
}

#[test]
fn a_byte_flipped_on_the_wire_is_an_authentication_failure_and_the_copy_recovers() {
    let dir = util::setup();
    let exp = mkdir(&dir.path().join("export"));
    let srv = server(&dir, &[format!("data={}", exp.display())]);
    let src = dir.path().join("f");
    random_file(&src, 4 << 20, 11);
    // Past the handshakes and the manifest, inside the file's data.
    let relay = Relay::start(srv.port, Some(1 << 20));
    let out = util::run(copy(&dir, relay.port).args([
        "--encrypt",
        "--json",
        "-P",
        "1",
        "f",
        "127.0.0.1:data/f",
    ]));
    assert!(
        relay.flipped.load(Ordering::SeqCst),
        "the relay flipped nothing"
    );
    assert_exit(&out, 0);
    let j = json(&out);
    assert!(j["reconnects"].as_u64().unwrap_or(0) >= 1, "{j}");
    assert_eq!(
        std::fs::read(exp.join("f")).unwrap(),
        std::fs::read(&src).unwrap()
    );
    let log = std::fs::read_to_string(&srv.log).unwrap();
    assert!(
        log.contains("TLS record failed authentication"),
        "the server should name the failure: {log}"
    );
}

/// The lab's `--tamper` flips payload bits and fixes the TCP checksum, so
/// TCP delivers the damage; with `--encrypt` TLS rejects the record, the
/// stream fails, the copy reconnects and resumes, and no damaged byte ever
/// reaches the chunk check (nothing is re-sent for a bad checksum) or the
/// file. Tampering is turned off once it has hit, so that the copy needs
/// a reconnect or two, not one per flipped bit (each costs a backoff).
#[test]
fn lab_copy_encrypted_over_a_tampering_link_never_writes_bad_data() {
    if !util::need_root("lab_copy_encrypted_over_a_tampering_link_never_writes_bad_data") {
        return;
    }
    use fatpipe_lab::{End, LinkChange, LinkSpec};
    let dir = util::setup();
    let src = dir.path().join("f");
    random_file(&src, 16 << 20, 21);
    let exp = mkdir(&dir.path().join("export"));
    let key = key_file(&dir, "key", KEY);
    let name = format!("enc{}", std::process::id());
    // A flipped bit every ~125 kB of payload: one hits within milliseconds.
    let spec = LinkSpec {
        tamper: 1e-6,
        seed: 5,
        ..LinkSpec::new(std::time::Duration::from_millis(10), 200_000_000)
    };
    let export = format!("data={}", exp.display());
    let key_arg = key.display().to_string();
    let (lab, _srv, _, port) =
        util::lab_with_server(&name, &spec, &["--export", &export, "--key-file", &key_arg]);
    let b = lab.addr(End::B).to_string();
    let mut c = lab.command(End::A, util::bin());
    c.args(["copy", "--encrypt", "--json", "--no-auto", "-P", "2"])
        .args(["--chunk-size", "1M", "--retries", "10"])
        .args(["--port", &port.to_string(), "--key-file"])
        .arg(&key)
        .arg(&src)
        .arg(format!("{b}:data/f"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = c.spawn().unwrap();
    let tampered = || {
        lab.stats()
            .map(|s| s.a_to_b.link.tampered + s.b_to_a.link.tampered)
            .unwrap_or(0)
    };
    util::wait_for(
        std::time::Duration::from_secs(20),
        "a tampered packet",
        || tampered() > 0,
    );
    lab.set(&LinkChange {
        tamper: Some(0.0),
        ..LinkChange::default()
    })
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_exit(&out, 0);
    let j = json(&out);
    assert!(tampered() > 0);
    assert!(
        j["reconnects"].as_u64().unwrap_or(0) >= 1,
        "a tampered record was not caught: {j}"
    );
    assert_eq!(j["chunks_resent"], 0, "damage got past TLS: {j}");
    assert_eq!(
        std::fs::read(exp.join("f")).unwrap(),
        std::fs::read(&src).unwrap()
    );
}
