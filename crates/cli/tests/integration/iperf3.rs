//! iperf3 interoperability against the real Debian `iperf3` (3.12), both
//! ways: `fatpipe test --iperf3` against `iperf3 -s`, stock `iperf3 -c`
//! against `fatpipe server --iperf3-port`, and `fatpipe test` pointed at an
//! iperf3 server by mistake. Byte counts are cross-checked between the two
//! programs' own reports: they must agree within one block wherever the
//! protocol lets both ends count the same bytes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::process::{Child, ChildStderr, Command, Output, Stdio};
use std::time::{Duration, Instant};

use fatpipe_schema::test::{Direction, TestReport};
use serde_json::Value;

use crate::util::{self, assert_exit, free_port, run, setup, Dir, Guard};

/// True when something listens on TCP `port` (from /proc, so that iperf3
/// does not take a probe connection for a client).
fn listening(port: u16) -> bool {
    let hex = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f)
            .unwrap_or_default()
            .lines()
            .any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && format!("{} ", cols[1]).ends_with(&hex) && cols[3] == "0A"
            })
    })
}

/// `iperf3 -s -1 -J` on a free port: one test, then its JSON report.
/// A stock `iperf3 -s` on a free port, made by `cmd(port)`, returned once
/// it listens. The port is free when chosen, but a parallel test's
/// connection may take it before iperf3 binds it; iperf3 then exits at
/// once ("address already in use"), and another port is tried.
fn stock_listening(mut cmd: impl FnMut(u16) -> Command) -> (Child, u16) {
    let mut why = String::new();
    for _ in 0..5 {
        let port = free_port();
        let mut child = cmd(port)
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn iperf3 -s (apt-get install iperf3)");
        let mut exited = false;
        let up = util::within(Duration::from_secs(5), || {
            exited = matches!(child.try_wait(), Ok(Some(_)));
            exited || listening(port)
        });
        if up && !exited {
            return (child, port);
        }
        let _ = child.kill();
        let _ = child.wait();
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        why = format!("port {port}: exited {exited}: {}", err.trim());
        if !exited {
            break;
        }
    }
    panic!("iperf3 -s did not listen ({why})");
}

struct StockServer {
    child: Child,
    port: u16,
}

impl StockServer {
    fn start() -> StockServer {
        let (child, port) = stock_listening(|port| {
            let mut c = Command::new("iperf3");
            c.args(["-s", "-1", "-J", "-p", &port.to_string()])
                .stdout(Stdio::piped());
            c
        });
        StockServer { child, port }
    }

    /// Waits for the server's one test to end and returns its report.
    fn report(mut self) -> Value {
        let mut text = String::new();
        if let Some(mut out) = self.child.stdout.take() {
            let _ = out.read_to_string(&mut text);
        }
        let _ = self.child.wait();
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("iperf3 -J output ({e}): {text}"))
    }
}

impl Drop for StockServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `fatpipe test --iperf3` against a fresh stock server: our report, the
/// server's.
fn against_stock(dir: &Dir, args: &[&str]) -> (TestReport, Value) {
    let srv = StockServer::start();
    let out = run(dir
        .cmd()
        .args([
            "test",
            "--iperf3",
            &format!("127.0.0.1:{}", srv.port),
            "--json",
        ])
        .args(args));
    assert_exit(&out, 0);
    let ours: TestReport = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "report does not parse: {e}\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    (ours, srv.report())
}

fn bytes(v: &Value, key: &str) -> u64 {
    v["end"][key]["bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no end.{key}.bytes in {}", v["end"]))
}

fn sum(r: &TestReport, d: Direction) -> &fatpipe_schema::test::StreamStats {
    r.end
        .sums
        .iter()
        .find(|s| s.direction == Some(d))
        .unwrap_or_else(|| panic!("no {d:?} sum in {:?}", r.end.sums))
}

/// Asserts `a` and `b` are within `block` bytes of each other.
fn within(what: &str, a: u64, b: u64, block: u64) {
    assert!(
        a.abs_diff(b) <= block,
        "{what}: {a} vs {b} differ by more than {block}"
    );
}

const BLOCK: u64 = 128 * 1024;

#[test]
fn iperf3_server_is_recognised_within_a_second_and_named() {
    let dir = setup();
    let (child, port) = stock_listening(|port| {
        let mut c = Command::new("iperf3");
        c.args(["-s", "-p", &port.to_string()])
            .stdout(Stdio::null());
        c
    });
    let _srv = Guard(child);
    for extra in [&[][..], &["--no-auto"]] {
        let t0 = Instant::now();
        let out = run(dir
            .cmd()
            .args(["test", &format!("127.0.0.1:{port}"), "-t", "1"])
            .args(extra));
        let took = t0.elapsed();
        assert_exit(&out, 2);
        let err = String::from_utf8_lossy(&out.stderr);
        // Recognised from the server's first byte; the budget also holds
        // a debug binary's start on a loaded two-core machine.
        assert!(took < Duration::from_secs(2), "took {took:?}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.contains("iperf3") && err.contains("--iperf3"), "{err}");
    }
}

#[test]
fn iperf3_client_tcp_counts_agree_with_the_stock_server() {
    let dir = setup();
    // Upload, with the socket options iperf3 passes to the server.
    let (r, s) = against_stock(
        &dir,
        &[
            "-P", "2", "-t", "1", "-w", "1M", "-M", "1400", "-C", "reno", "-Z",
        ],
    );
    let up = sum(&r, Direction::Up);
    within(
        "sent vs server received",
        up.bytes_sent,
        bytes(&s, "sum_received"),
        BLOCK,
    );
    assert_eq!(
        up.bytes,
        bytes(&s, "sum_received"),
        "receiver bytes are the server's"
    );
    assert!(up.bytes > 1_000_000, "{up:?}");
    assert_eq!(
        r.end.streams.iter().map(|s| s.id).collect::<Vec<_>>(),
        [Some(1), Some(3)]
    );
    assert!(
        r.start
            .local
            .iter()
            .all(|l| l.mss <= 1400 && l.congestion == "reno"),
        "{:?}",
        r.start.local
    );
    assert!(r.start.local.iter().all(|l| l.send_path == "sendfile"));
    assert_eq!(
        s["end"]["receiver_tcp_congestion"], "reno",
        "the server took -C"
    );
    assert!(
        r.end.cpu_remote.total_percent > 0.0,
        "the server's CPU comes from its results"
    );
    // Reverse: every byte the server sent arrives.
    let (r, s) = against_stock(&dir, &["-R", "-P", "3", "-t", "1"]);
    let down = sum(&r, Direction::Down);
    within(
        "received vs server sent",
        down.bytes,
        bytes(&s, "sum_sent"),
        BLOCK,
    );
    assert_eq!(down.bytes_sent, bytes(&s, "sum_sent"));
    // Both ways at once: the client's senders are 1, the receivers 3.
    // iperf3's server is single-threaded: busy sending, it may not catch
    // up on its reads within the client's wait on a loaded machine, so
    // this direction is held to 2 % rather than a block.
    let (r, s) = against_stock(&dir, &["--bidir", "-t", "1"]);
    let (sent, got) = (sum(&r, Direction::Up).bytes_sent, bytes(&s, "sum_received"));
    within("up", sent, got, BLOCK.max(sent / 50));
    within(
        "down",
        sum(&r, Direction::Down).bytes,
        bytes(&s, "sum_sent_bidir_reverse"),
        BLOCK,
    );
    // A byte count ends the test, exactly.
    let (r, s) = against_stock(&dir, &["-n", "20M", "-P", "2"]);
    // Auto-tuning chose the buffer (no -w) from the control connection's
    // RTT and this host's limits, and says what it could not learn.
    let auto = r.start.auto.as_ref().expect("auto-tuned without -w");
    assert_eq!(
        (auto.streams, auto.overridden.as_slice()),
        (2, &["streams".to_string()][..])
    );
    assert_eq!(auto.facts.bottleneck_rate, None);
    assert!(auto.facts.rtt_secs > 0.0, "{:?}", auto.facts);
    assert!(
        auto.warnings
            .iter()
            .any(|w| w.contains("rate and loss unknown")),
        "{:?}",
        auto.warnings
    );
    assert!(!auto.adjusting);
    assert_eq!(sum(&r, Direction::Up).bytes_sent, 20 << 20);
    assert_eq!(bytes(&s, "sum_received"), 20 << 20);
}

#[test]
fn iperf3_client_omit_and_text_output() {
    let dir = setup();
    let srv = StockServer::start();
    let out = run(dir
        .cmd()
        .args(["test", "--iperf3", &format!("127.0.0.1:{}", srv.port)])
        .args(["-t", "1", "-O", "1", "-i", "0.5", "-P", "2"]));
    assert_exit(&out, 0);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("(omitted)"), "{text}");
    assert!(text.contains("[ SUM]"), "{text}");
    assert!(text.contains("client to server:"), "{text}");
    let s = srv.report();
    assert_eq!(
        s["start"]["test_start"]["omit"], 1,
        "the server was told -O"
    );
}

#[test]
fn iperf3_client_udp_counts_agree_with_the_stock_server() {
    const RATE: u64 = 20_000_000; // bit/s per stream
    const LEN: u64 = 1200;
    const STREAMS: u64 = 2;
    let dir = setup();
    let (rate, len, streams) = (RATE.to_string(), LEN.to_string(), STREAMS.to_string());
    let (r, s) = against_stock(
        &dir,
        &["-u", "-b", &rate, "-l", &len, "-P", &streams, "-t", "1"],
    );
    let up = sum(&r, Direction::Up);
    let got = s["end"]["sum"]["packets"].as_u64().unwrap_or(0);
    let lost = s["end"]["sum"]["lost_packets"].as_u64().unwrap_or(u64::MAX);
    let sent = up.packets_sent.unwrap_or(0);
    assert!(sent > 500, "{up:?}");
    // Received and lost make up what was sent; the server stops counting
    // at TEST_END, so datagrams still in flight or unread then are missing:
    // as many as the client sends in the 10 ms a loaded host may take
    // between its last datagram and the server reading TEST_END (41 here;
    // a loaded CI host missed 3 where 2 were allowed). iperf3 counts a
    // reordered one as lost as well.
    let in_flight = STREAMS * RATE / (8 * LEN) / 100;
    assert!(
        got <= sent && sent - got <= lost + in_flight,
        "sent {sent}, server got {got} and lost {lost}"
    );
    assert!(lost <= sent / 20, "loopback lost {lost} of {sent}");
    within(
        "bytes",
        up.bytes_sent,
        bytes(&s, "sum_received") + lost * LEN,
        in_flight * LEN,
    );
    assert_eq!(up.lost, Some(lost), "the loss is the server's count");
    let (r, s) = against_stock(&dir, &["-u", "-b", "20m", "-R", "-t", "1"]);
    let down = sum(&r, Direction::Down);
    let lost = down.lost.unwrap_or(u64::MAX);
    assert!(lost <= down.packets.unwrap_or(0) / 20, "{down:?}");
    within(
        "reverse bytes",
        down.bytes + lost * 1460,
        bytes(&s, "sum_sent"),
        1460,
    );
}

/// `fatpipe server --iperf3-port 0`: the guard and the iperf3 port.
fn fatpipe_server(dir: &Dir, extra: &[&str]) -> (Guard, u16) {
    let mut cmd = dir.cmd();
    cmd.args([
        "server",
        "--bind",
        "127.0.0.1",
        "--port",
        "0",
        "--iperf3-port",
        "0",
        "--quiet",
    ])
    .args(extra)
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    let mut child = cmd.spawn().expect("spawn fatpipe server");
    let stdout = child.stdout.take().expect("stdout");
    let guard = Guard(child);
    let mut lines = BufReader::new(stdout).lines();
    let _first = lines.next();
    let second = lines.next().and_then(|l| l.ok()).unwrap_or_default();
    let port = second
        .strip_prefix("iperf3 listening on ")
        .and_then(|a| a.rsplit_once(':'))
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("unexpected second line: {second:?}"));
    (guard, port)
}

fn stock_client(port: u16, args: &[&str]) -> Command {
    let mut c = Command::new("iperf3");
    c.args(["-c", "127.0.0.1", "-p", &port.to_string(), "-J"])
        .args(args);
    c
}

fn client_json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "iperf3 -c output ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[test]
fn stock_iperf3_clients_against_a_fatpipe_server() {
    let dir = setup();
    let (_srv, port) = fatpipe_server(&dir, &[]);
    // Upload: what the client sent is what this server counted.
    let out = run(&mut stock_client(
        port,
        &["-P", "2", "-t", "1", "--get-server-output"],
    ));
    assert_exit(&out, 0);
    let v = client_json(&out);
    within(
        "sent vs received",
        bytes(&v, "sum_sent"),
        bytes(&v, "sum_received"),
        BLOCK,
    );
    assert!(bytes(&v, "sum_received") > 1_000_000);
    let server_text = v["server_output_text"].as_str().unwrap_or_default();
    assert!(server_text.contains("fatpipe server"), "{v}");
    // Reverse and both ways end cleanly (the client stops reading at
    // TEST_END, so it may count less than this server sent).
    for args in [&["-R", "-P", "2", "-t", "1"][..], &["--bidir", "-t", "1"]] {
        let out = run(&mut stock_client(port, args));
        assert_exit(&out, 0);
        let v = client_json(&out);
        let (sent, got) = (bytes(&v, "sum_sent"), bytes(&v, "sum_received"));
        assert!(
            got > 1_000_000 && got <= sent,
            "{args:?}: sent {sent}, got {got}"
        );
    }
    // UDP up, down and 64-bit counters (-l: iperf3's default datagram is
    // the control connection's MSS, 32 KiB on loopback).
    for args in [
        &["-u", "-b", "20m", "-l", "1000", "-P", "2", "-t", "1"][..],
        &["-u", "-b", "20m", "-l", "1200", "-R", "-t", "1"],
        &[
            "-u",
            "-b",
            "10m",
            "-l",
            "1200",
            "--udp-counters-64bit",
            "--bidir",
            "-t",
            "1",
        ],
    ] {
        let out = run(&mut stock_client(port, args));
        assert_exit(&out, 0);
        let v = client_json(&out);
        let s = &v["end"]["sum"];
        let (packets, lost) = (
            s["packets"].as_u64().unwrap_or(0),
            s["lost_packets"].as_u64().unwrap_or(u64::MAX),
        );
        // Loopback loses datagrams only when a receiver is descheduled
        // (tests share two cores): a few percent at most.
        assert!(packets > 100 && lost <= packets / 20, "{args:?}: {s}");
    }
    // An option this server does not carry out: iperf3's own error, fast.
    let t0 = Instant::now();
    // (iperf3 3.12 exits 0 after an error with -J; the text is the check.)
    let out = run(&mut stock_client(port, &["-S", "16", "-t", "1"]));
    assert!(t0.elapsed() < Duration::from_secs(5));
    let v = client_json(&out);
    assert!(
        v["error"]
            .as_str()
            .unwrap_or_default()
            .contains("not implemented"),
        "{v}"
    );
}

#[test]
fn twenty_stock_iperf3_clients_at_once() {
    let dir = setup();
    let (_srv, port) = fatpipe_server(&dir, &[]);
    let children: Vec<(String, Child)> = (0..20)
        .map(|i| {
            let args: &[&str] = match i % 4 {
                0 => &["-t", "2", "-b", "100m"],
                1 => &["-t", "2", "-b", "100m", "-R"],
                2 => &["-t", "2", "-u", "-b", "10m"],
                _ => &["-t", "2", "-b", "50m", "-P", "2", "--bidir"],
            };
            let child = stock_client(port, args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn iperf3 -c");
            (format!("client {i} {args:?}"), child)
        })
        .collect();
    for (what, child) in children {
        let out = child.wait_with_output().expect("wait for iperf3 -c");
        assert_exit(&out, 0);
        assert!(out.stdout.len() > 2, "{what}: no output");
        let v = client_json(&out);
        let got = bytes(&v, "sum_received");
        // At least half of what was asked arrived (100m for 2 s = 25 MB).
        assert!(got > 1_000_000, "{what}: received {got}: {}", v["end"]);
    }
}

#[test]
fn iperf3_sessions_past_the_limit_are_told_busy() {
    let dir = setup();
    let (_srv, port) = fatpipe_server(&dir, &["--max-sessions", "1", "--preauth-timeout", "3s"]);
    // One session that sends its cookie and then nothing.
    let mut hold = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    hold.write_all(&[b'h'; 36]).expect("write");
    hold.write_all(&[0]).expect("write");
    let mut first = [0u8; 1];
    hold.read_exact(&mut first).expect("PARAM_EXCHANGE");
    assert_eq!(first[0], 9);
    let t0 = Instant::now();
    let out = run(&mut stock_client(port, &["-t", "1"]));
    assert!(t0.elapsed() < Duration::from_secs(3), "told at once");
    let v = client_json(&out);
    assert!(
        v["error"].as_str().unwrap_or_default().contains("busy"),
        "{v}"
    );
    // The stalled session ends when its holder goes; the next client is
    // served (the server may take a moment to see the close: a busy reply
    // until then).
    drop(hold);
    let mut out = None;
    util::within(Duration::from_secs(5), || {
        let o = run(&mut stock_client(port, &["-t", "1"]));
        let served = o.status.success();
        out = Some(o);
        served
    });
    let out = out.expect("ran the client");
    assert_exit(&out, 0);
    assert!(bytes(&client_json(&out), "sum_received") > 0);
}

#[test]
fn iperf3_port_fed_garbage_keeps_serving() {
    let dir = setup();
    let (_srv, port) = fatpipe_server(&dir, &["--preauth-timeout", "1s"]);
    let addr = ("127.0.0.1", port);
    // Short garbage, then a close.
    let mut c = TcpStream::connect(addr).expect("connect");
    c.write_all(b"GET / HTTP/1.0\r\n\r\n").expect("write");
    drop(c);
    // A cookie, then a JSON length far past the cap: an error state byte
    // comes back (SERVER_ERROR, -2) and the connection closes.
    let mut c = TcpStream::connect(addr).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    c.write_all(&[b'a'; 36]).expect("write");
    c.write_all(&[0]).expect("write");
    c.write_all(&u32::MAX.to_be_bytes()).expect("write");
    let mut reply = Vec::new();
    let _ = c.read_to_end(&mut reply);
    assert_eq!(reply.first(), Some(&9), "PARAM_EXCHANGE first: {reply:?}");
    assert_eq!(reply.get(1), Some(&0xfe), "then SERVER_ERROR: {reply:?}");
    // Valid framing, not JSON.
    let mut c = TcpStream::connect(addr).expect("connect");
    c.write_all(&[b'b'; 37]).expect("write");
    c.write_all(&5u32.to_be_bytes()).expect("write");
    c.write_all(b"{oops").expect("write");
    drop(c);
    // Silent connections, held open past the handshake timeout.
    let silent: Vec<TcpStream> = (0..8)
        .map(|_| TcpStream::connect(addr).expect("connect"))
        .collect();
    // Stray datagrams on the UDP port.
    let u = UdpSocket::bind("127.0.0.1:0").expect("bind");
    for i in 0..50u8 {
        let _ = u.send_to(&[i; 100], addr);
    }
    // A real client still gets its test, TCP and UDP.
    for args in [&["-t", "1"][..], &["-u", "-b", "5m", "-t", "1"]] {
        let out = run(&mut stock_client(port, args));
        assert_exit(&out, 0);
        assert!(bytes(&client_json(&out), "sum_received") > 0);
    }
    drop(silent);
}

/// `fatpipe test --iperf3` and stock `iperf3 -c` against the same stock
/// iperf3 server across an emulated 200 Mbit/s, 20 ms link: the two
/// clients' receiver throughputs agree within 10 %, both ways.
#[test]
fn lab_iperf3_client_agrees_with_stock_iperf3_on_one_server() {
    use fatpipe_lab::{End, Lab, LinkSpec, UpOptions};
    if !crate::util::need_root("lab_iperf3_client_agrees_with_stock_iperf3_on_one_server") {
        return;
    }
    let name = "ip3-agree";
    let _ = fatpipe_lab::down(name);
    let spec = LinkSpec {
        seed: 7,
        ..LinkSpec::new(Duration::from_millis(20), 200_000_000)
    };
    let opts = UpOptions {
        exe: Some(crate::util::bin()),
        owner: Some(std::process::id()),
    };
    let lab = Lab::up(name, &spec, &opts).expect("lab up");
    let b = lab.addr(End::B).to_string();
    let srv = lab
        .command(End::B, "iperf3")
        .args(["-s", "-B", &b, "-p", "5201", "--forceflush"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("iperf3 -s in the lab");
    let mut srv = Guard(srv);
    let mut lines = util::Lines::read(srv.0.stdout.take().expect("iperf3 stdout"));
    lines.wait_for(Duration::from_secs(10), "Server listening");
    for dir_args in [&[][..], &["-R"]] {
        let mut fp = lab.command(End::A, crate::util::bin());
        fp.args([
            "test",
            "--iperf3",
            &b,
            "-t",
            "3",
            "-P",
            "2",
            "--no-auto",
            "--json",
        ])
        .args(dir_args);
        let out = run(&mut fp);
        assert_exit(&out, 0);
        let r: TestReport = serde_json::from_slice(&out.stdout).expect("fatpipe report");
        let ours = r.end.sums[0].bits_per_second;
        let mut ip = lab.command(End::A, "iperf3");
        ip.args(["-c", &b, "-t", "3", "-P", "2", "-J"])
            .args(dir_args);
        let out = run(&mut ip);
        assert_exit(&out, 0);
        let v: Value = serde_json::from_slice(&out.stdout).expect("iperf3 -J");
        let theirs = v["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .unwrap_or(0.0);
        let ratio = ours / theirs.max(1.0);
        eprintln!(
            "{dir_args:?}: fatpipe --iperf3 {:.1} Mbit/s, iperf3 -c {:.1} Mbit/s, ratio {ratio:.3}",
            ours / 1e6,
            theirs / 1e6
        );
        assert!(
            (0.9..=1.1).contains(&ratio),
            "{dir_args:?}: fatpipe {:.1} Mbit/s vs iperf3 {:.1} Mbit/s",
            ours / 1e6,
            theirs / 1e6
        );
        assert!(
            ours > 100e6,
            "{dir_args:?}: {:.1} Mbit/s on a 200 Mbit/s link",
            ours / 1e6
        );
    }
    drop(srv);
    drop(lab);
}

/// An RSA key pair made by `openssl` (as iperf3's documentation makes
/// them: a traditional private key, a `PUBLIC KEY` public one) and an
/// authorized-users file admitting mario / rossi.
fn auth_files(dir: &Dir) -> (String, String, String) {
    let key = dir.path().join("private.pem");
    let public = dir.path().join("public.pem");
    let users = dir.path().join("users.csv");
    let ok = |c: &mut Command| {
        let out = c.output().expect("run openssl (apt-get install openssl)");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    ok(Command::new("openssl")
        .args(["genrsa", "-traditional", "-out"])
        .arg(&key)
        .arg("2048"));
    ok(Command::new("openssl")
        .args(["rsa", "-in"])
        .arg(&key)
        .args(["-outform", "PEM", "-pubout", "-out"])
        .arg(&public));
    std::fs::write(
        &users,
        format!(
            "# user,sha256 of {{user}}password\nmario,{}\n",
            fatpipe_iperf3::auth::user_hash("mario", "rossi")
        ),
    )
    .expect("write users");
    let s = |p: std::path::PathBuf| p.display().to_string();
    (s(key), s(public), s(users))
}

#[test]
fn iperf3_auth_stock_clients_against_a_fatpipe_server() {
    let dir = setup();
    let (key, public, users) = auth_files(&dir);
    let (_srv, port) = fatpipe_server(
        &dir,
        &[
            "--iperf3-rsa-private-key",
            &key,
            "--iperf3-authorized-users",
            &users,
        ],
    );
    let auth = ["--username", "mario", "--rsa-public-key-path", &public];
    // The right password: the test runs.
    let out = stock_client(port, &["-t", "1"])
        .args(auth)
        .env("IPERF3_PASSWORD", "rossi")
        .output()
        .expect("run iperf3 -c");
    let v = client_json(&out);
    assert!(v["error"].is_null(), "{}", v["error"]);
    assert!(v["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0) > 0);
    // A wrong password, and no credentials at all: iperf3's own refusal.
    for (args, password) in [(&auth[..], "verdi"), (&[][..], "rossi")] {
        let out = stock_client(port, &["-t", "1"])
            .args(args)
            .env("IPERF3_PASSWORD", password)
            .output()
            .expect("run iperf3 -c");
        let v = client_json(&out);
        let err = v["error"].as_str().unwrap_or("");
        assert!(err.contains("authorization failed"), "{v}");
    }
}

#[test]
fn iperf3_auth_fatpipe_client_against_a_stock_server() {
    let dir = setup();
    let (key, public, users) = auth_files(&dir);
    let stock = || {
        let (child, port) = stock_listening(|port| {
            let mut c = Command::new("iperf3");
            c.args(["-s", "-1", "-p", &port.to_string()])
                .args([
                    "--rsa-private-key-path",
                    &key,
                    "--authorized-users-path",
                    &users,
                ])
                .stdout(Stdio::null());
            c
        });
        (Guard(child), port)
    };
    let test = |port: u16, password: &str| {
        run(dir
            .cmd()
            .args([
                "test",
                "--iperf3",
                &format!("127.0.0.1:{port}"),
                "-t",
                "1",
                "--json",
            ])
            .args([
                "--iperf3-username",
                "mario",
                "--iperf3-rsa-public-key",
                &public,
            ])
            .env("IPERF3_PASSWORD", password))
    };
    let (_srv, port) = stock();
    let out = test(port, "rossi");
    assert_exit(&out, 0);
    let r: TestReport = serde_json::from_slice(&out.stdout).expect("a fatpipe.test report");
    assert!(sum(&r, Direction::Up).bytes > 0);
    let (_srv, port) = stock();
    let out = test(port, "verdi");
    assert_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("authentication failed"), "{err}");
    assert_eq!(
        err.lines()
            .filter(|l| l.starts_with("fatpipe: ") && !l.contains("warning"))
            .count(),
        1,
        "{err}"
    );
    // Without IPERF3_PASSWORD: one line, before anything is sent.
    let out = run(dir
        .cmd()
        .args(["test", "--iperf3", "127.0.0.1:1", "-t", "1"])
        .args([
            "--iperf3-username",
            "mario",
            "--iperf3-rsa-public-key",
            &public,
        ])
        .env_remove("IPERF3_PASSWORD"));
    assert_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("IPERF3_PASSWORD"));
}

// Issue 34: the iperf3 port is an engine front end. These pin what that
// gives it: --max-streams over every port, /metrics, the drain on
// SIGTERM, and escaped client text in the log.

/// `fatpipe server --iperf3-port 0 --metrics 127.0.0.1:0` with `extra`:
/// the guard, the iperf3 port, the metrics address, and the server's
/// stderr (piped unless `--quiet` is among `extra`).
fn server_with_metrics(dir: &Dir, extra: &[&str]) -> (Guard, u16, String, Option<ChildStderr>) {
    let mut cmd = dir.cmd();
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0"])
        .args(["--iperf3-port", "0", "--metrics", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn fatpipe server");
    let stdout = child.stdout.take().expect("stdout");
    let stderr = child.stderr.take();
    let guard = Guard(child);
    let mut lines = BufReader::new(stdout).lines();
    let mut next = || lines.next().and_then(|l| l.ok()).unwrap_or_default();
    let (_first, metrics, iperf3) = (next(), next(), next());
    let maddr = metrics
        .strip_prefix("metrics on ")
        .unwrap_or_else(|| panic!("unexpected second line: {metrics:?}"))
        .to_string();
    let port = iperf3
        .strip_prefix("iperf3 listening on ")
        .and_then(|a| a.rsplit_once(':'))
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("unexpected third line: {iperf3:?}"));
    (guard, port, maddr, stderr)
}

/// The `/metrics` text.
fn scrape(maddr: &str) -> String {
    let mut s = TcpStream::connect(maddr).expect("connect to the metrics port");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text
}

/// The value of one series, 0 if it is not exposed.
fn series(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

const IP3_ACTIVE: &str = "fatpipe_active_sessions{service=\"iperf3\"}";
const IP3_STREAMS: &str = "fatpipe_active_streams{service=\"iperf3\"}";
const IP3_OK: &str = "fatpipe_sessions_total{service=\"iperf3\",outcome=\"ok\"}";
const IP3_RECEIVED: &str = "fatpipe_data_bytes_total{service=\"iperf3\",direction=\"received\"}";

#[test]
fn iperf3_streams_count_against_max_streams_and_sessions_show_in_metrics() {
    let dir = setup();
    let (_srv, port, maddr, _) = server_with_metrics(&dir, &["--quiet", "--max-streams", "4"]);
    let busy = |out: &Output, what: &str| {
        let v = client_json(out);
        assert!(
            v["error"].as_str().unwrap_or_default().contains("busy"),
            "{what}: refused as busy: {v}"
        );
    };
    // More streams than the server has slots: refused whole, at once.
    let t0 = Instant::now();
    busy(
        &run(&mut stock_client(port, &["-P", "5", "-t", "1"])),
        "-P 5",
    );
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // A running test holds its 3; 2 more do not fit, 1 does.
    let holder = stock_client(port, &["-P", "3", "-t", "4"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn iperf3 -c");
    let mut text = String::new();
    crate::util::wait_for(
        Duration::from_secs(10),
        "the iperf3 test in /metrics",
        || {
            text = scrape(&maddr);
            series(&text, IP3_ACTIVE) == 1.0 && series(&text, IP3_RECEIVED) > 0.0
        },
    );
    assert_eq!(series(&text, IP3_STREAMS), 3.0, "{text}");
    busy(
        &run(&mut stock_client(port, &["-P", "2", "-t", "1"])),
        "-P 2 beside 3",
    );
    let one = run(&mut stock_client(port, &["-t", "1"]));
    assert_exit(&one, 0);
    let held = holder.wait_with_output().expect("wait for iperf3 -c");
    assert_exit(&held, 0);
    // Both finished tests are counted, with the bytes the clients were told.
    let want =
        bytes(&client_json(&one), "sum_received") + bytes(&client_json(&held), "sum_received");
    crate::util::wait_for(Duration::from_secs(10), "both sessions counted", || {
        text = scrape(&maddr);
        series(&text, IP3_OK) == 2.0 && series(&text, IP3_ACTIVE) == 0.0
    });
    assert_eq!(series(&text, IP3_STREAMS), 0.0, "{text}");
    let last = text
        .lines()
        .find(|l| {
            l.starts_with("fatpipe_peer_last_test_throughput_bytes_per_second{service=\"iperf3\"")
                && l.contains("direction=\"received\"")
        })
        .unwrap_or_else(|| panic!("no last-test gauge for the iperf3 peer:\n{text}"));
    let rate: f64 = last
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(rate > 0.0, "{last}");
    within(
        "received in /metrics vs the clients' reports",
        series(&text, IP3_RECEIVED) as u64,
        want,
        BLOCK,
    );
}

#[test]
fn sigterm_ends_a_running_iperf3_test_with_a_reason_and_exits_0() {
    let dir = setup();
    let (mut srv, port, maddr, _) = server_with_metrics(&dir, &["--quiet"]);
    let client = stock_client(port, &["-t", "30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn iperf3 -c");
    let client_guard = ClientGuard(client.id());
    crate::util::wait_for(Duration::from_secs(10), "the iperf3 test to run", || {
        series(&scrape(&maddr), IP3_RECEIVED) > 0.0
    });
    let t0 = Instant::now();
    assert!(fatpipe_sys::process::kill(
        srv.0.id(),
        fatpipe_sys::process::Signal::Term
    ));
    let out = client.wait_with_output().expect("wait for iperf3 -c");
    // Reaped: its PID is no longer ours to signal.
    std::mem::forget(client_guard);
    let v = client_json(&out);
    assert!(
        v["error"]
            .as_str()
            .unwrap_or_default()
            .contains("server has terminated"),
        "the client is told why: {v}"
    );
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(
        util::exits_within(srv.0.id(), Duration::from_secs(10)),
        "the server did not exit"
    );
    let status = srv.0.wait().expect("reap the server").code();
    assert_eq!(status, Some(0), "the server exits 0");
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "nothing listens"
    );
}

/// Ends a spawned client by PID if a test fails before it exits.
struct ClientGuard(u32);

impl Drop for ClientGuard {
    fn drop(&mut self) {
        let _ = fatpipe_sys::process::kill(self.0, fatpipe_sys::process::Signal::Term);
    }
}

#[test]
fn iperf3_client_text_is_logged_escaped() {
    let dir = setup();
    let (_srv, port, _maddr, stderr) = server_with_metrics(&dir, &[]);
    let lines = std::sync::mpsc::channel::<String>();
    let (tx, rx) = lines;
    let stderr = stderr.expect("the server's stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // A client whose version and congestion control carry an ANSI escape
    // and a newline that would start a forged log line.
    let cookie = [b'e'; 36];
    let mut ctrl = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    ctrl.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    ctrl.write_all(&cookie).expect("write");
    ctrl.write_all(&[0]).expect("write");
    let mut state = [0u8; 1];
    ctrl.read_exact(&mut state).expect("PARAM_EXCHANGE");
    assert_eq!(state[0], 9);
    let params = serde_json::json!({
        "tcp": true, "omit": 0, "time": 1, "parallel": 1, "len": 131072,
        "client_version": "3.12\u{1b}[2J\nfatpipe server: forged",
        "congestion": "\u{1b}[31mevil\nforged",
    })
    .to_string();
    ctrl.write_all(&(params.len() as u32).to_be_bytes())
        .expect("write");
    ctrl.write_all(params.as_bytes()).expect("write");
    ctrl.read_exact(&mut state).expect("CREATE_STREAMS");
    assert_eq!(state[0], 10);
    let mut data = TcpStream::connect(("127.0.0.1", port)).expect("connect a stream");
    data.write_all(&cookie).expect("write");
    data.write_all(&[0]).expect("write");
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let refused = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no refusal logged; the log so far: {seen:#?}"));
        seen.push(line.clone());
        if line.contains("refused: congestion") {
            break line;
        }
    };
    assert!(
        refused.contains("(client 3.12\\x1b[2J\\x0afatpipe server: forged)"),
        "{refused}"
    );
    assert!(
        refused.contains("congestion \\x1b[31mevil\\x0aforged"),
        "{refused}"
    );
    for line in &seen {
        assert!(
            !line.contains('\u{1b}'),
            "a raw escape in the log: {line:?}"
        );
        assert!(!line.starts_with("forged"), "a forged line: {line:?}");
        assert!(
            !line.starts_with("fatpipe server: forged"),
            "a forged line: {line:?}"
        );
    }
}

#[test]
fn timeouts_and_garbage_on_the_iperf3_and_metrics_ports_are_summarised() {
    let dir = setup();
    let (mut srv, port, maddr, stderr) = server_with_metrics(&dir, &["--preauth-timeout", "1s"]);
    let stderr = stderr.expect("the server's stderr");
    let log = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut text);
        text
    });
    let addr = ("127.0.0.1", port);
    // Silent connections on both ports, and half a cookie then a close
    // on the iperf3 port, several of each.
    let mut silent: Vec<TcpStream> = (0..6)
        .map(|_| TcpStream::connect(addr).expect("connect"))
        .collect();
    silent.extend((0..6).map(|_| TcpStream::connect(maddr.as_str()).expect("connect")));
    for _ in 0..6 {
        let mut c = TcpStream::connect(addr).expect("connect");
        c.write_all(&[b'g'; 20]).expect("write");
    }
    // The server closes the silent ones at its pre-auth deadline.
    for s in &mut silent {
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    }
    // A real client is served meanwhile; then SIGTERM writes the summaries.
    let out = run(&mut stock_client(port, &["-t", "1"]));
    assert_exit(&out, 0);
    assert!(fatpipe_sys::process::kill(
        srv.0.id(),
        fatpipe_sys::process::Signal::Term
    ));
    let _ = srv.0.wait();
    let text = log.join().expect("the log");
    for want in [
        "6 pre-auth timeouts on the iperf3 port from 127.0.0.1",
        "6 failed handshakes on the iperf3 port from 127.0.0.1",
        "6 pre-auth timeouts on the metrics port from 127.0.0.1",
    ] {
        assert!(text.contains(want), "no {want:?} in the log:\n{text}");
    }
    // Summaries, not a line per connection: the real session's line and a
    // handful of others.
    assert!(text.lines().count() <= 12, "{text}");
}

#[test]
fn the_iperf3_port_takes_the_handshake_flags() {
    let dir = setup();
    let (_srv, port, _maddr, _) = server_with_metrics(
        &dir,
        &[
            "--quiet",
            "--max-handshakes-per-source",
            "2",
            "--preauth-timeout",
            "20s",
        ],
    );
    let addr = ("127.0.0.1", port);
    let silent: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(addr).expect("connect"))
        .collect();
    // Past the cap a connection is closed unread, long before the
    // pre-auth deadline (once the server has accepted the two above).
    let closed_at_once = || {
        let mut c = TcpStream::connect(addr).expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
        let mut b = [0u8; 1];
        matches!(c.read(&mut b), Ok(0))
    };
    crate::util::wait_for(
        Duration::from_secs(10),
        "a third connection closed unread",
        closed_at_once,
    );
    // Their slots come back when they leave; then a client is served.
    drop(silent);
    crate::util::wait_for(Duration::from_secs(10), "the slots back", || {
        !closed_at_once()
    });
    let out = run(&mut stock_client(port, &["-t", "1"]));
    assert_exit(&out, 0);
}
