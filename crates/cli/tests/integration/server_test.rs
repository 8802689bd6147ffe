//! `fatpipe server` and `fatpipe test`, the real binary on loopback.
//!
//! Every test starts its own server on port 0 (reading the port from the
//! first stdout line), keeps runs to about a second, and checks the JSON
//! report through the schema types rather than by grepping text.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fatpipe_schema::test::{
    Direction, Protocol, TestDirection, TestReport, TestStreamLine, TEST_SCHEMA_VERSION,
};

use crate::util::{assert_exit, run, setup, spawn_server, Dir, Guard};

/// Starts `fatpipe server --port 0` with `extra` flags; returns it and its port.
fn server(dir: &Dir, extra: &[&str]) -> (Guard, u16) {
    let mut cmd = dir.cmd();
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0", "--quiet"])
        .args(extra);
    spawn_server(cmd)
}

/// A `fatpipe test` command against `port`.
fn test_cmd(dir: &Dir, port: u16, args: &[&str]) -> Command {
    let mut cmd = dir.cmd();
    cmd.arg("test").arg(format!("127.0.0.1:{port}")).args(args);
    cmd
}

/// Runs a test with `--json`, asserts exit 0, returns the parsed report.
fn json_test(dir: &Dir, port: u16, args: &[&str]) -> TestReport {
    let out = run(test_cmd(dir, port, args).arg("--json"));
    assert_exit(&out, 0);
    let report: TestReport = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "report does not parse: {e}\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    assert_eq!(report.schema, "fatpipe.test");
    assert_eq!(report.version, TEST_SCHEMA_VERSION);
    report
}

#[test]
fn tcp_upload_reports_receiver_throughput_and_tcp_info() {
    let dir = setup();
    let (_srv, port) = server(&dir, &[]);
    // One stream, kernel buffers: what this test pins (auto-tuning has its
    // own tests and would choose per host).
    let r = json_test(&dir, port, &["-t", "1", "-i", "0.5", "--no-auto"]);
    assert_eq!(r.start.protocol, Protocol::Tcp);
    assert_eq!(r.start.direction, TestDirection::Up);
    assert!(r.intervals.len() >= 2, "{:?}", r.intervals.len());
    let sum = &r.end.sums[0];
    assert_eq!(sum.direction, Some(Direction::Up));
    assert!(sum.bytes > 10_000_000, "moved only {} bytes", sum.bytes);
    assert!(sum.bytes <= sum.bytes_sent);
    assert!(sum.bits_per_second > 1e8);
    assert!((0.8..1.5).contains(&sum.seconds), "{}", sum.seconds);
    assert!(sum.rtt_us.is_some_and(|r| r > 0), "RTT from TCP_INFO");
    assert!(sum.cwnd.is_some_and(|c| c > 0), "cwnd from TCP_INFO");
    assert!(r.end.cpu_local.total_percent > 0.0);
    assert!(r.end.cpu_remote.total_percent > 0.0, "server CPU reported");
    assert_eq!(r.start.local.len(), 1);
    assert_eq!(r.start.remote.len(), 1);
}

#[test]
fn reverse_and_byte_count() {
    let dir = setup();
    let (_srv, port) = server(&dir, &[]);
    let r = json_test(&dir, port, &["-R", "-n", "50M", "-P", "2"]);
    assert_eq!(r.start.direction, TestDirection::Down);
    let sum = &r.end.sums[0];
    assert_eq!(sum.direction, Some(Direction::Down));
    // -n is exact: what the sender wrote, and all of it arrived.
    assert_eq!(sum.bytes_sent, 50 << 20);
    assert_eq!(sum.bytes, 50 << 20);
}

#[test]
fn bidir_reports_both_directions() {
    let dir = setup();
    let (_srv, port) = server(&dir, &[]);
    let r = json_test(&dir, port, &["--bidir", "-P", "2", "-t", "1"]);
    assert_eq!(r.end.streams.len(), 4);
    let dirs: Vec<_> = r.end.sums.iter().map(|s| s.direction).collect();
    assert_eq!(dirs, vec![Some(Direction::Up), Some(Direction::Down)]);
    for s in &r.end.sums {
        assert!(s.bytes > 1_000_000, "{s:?}");
    }
}

#[test]
fn udp_counts_packets_loss_and_jitter() {
    let dir = setup();
    let (_srv, port) = server(&dir, &[]);
    let r = json_test(&dir, port, &["-u", "-b", "20M", "-l", "1000", "-t", "1"]);
    let sum = &r.end.sums[0];
    let sent = sum.packets_sent.expect("packets sent");
    // 20 Mbit/s of 1000-byte datagrams for a second is 2500 packets (a
    // sender starved by a busy host sends fewer, never more).
    assert!((1500..=2600).contains(&sent), "sent {sent}");
    let got = sum.packets.expect("packets received");
    assert!(got > sent / 2, "received {got} of {sent}");
    assert_eq!(sum.lost, Some(sent - got));
    assert!(sum.jitter_ms.is_some());
    assert!(sum.out_of_order.is_some());
    let r = json_test(
        &dir,
        port,
        &["-u", "-R", "-b", "5M", "-l", "64", "-t", "0.5"],
    );
    assert!(r.end.sums[0].packets.unwrap_or(0) > 1000);
    let r = json_test(&dir, port, &["-u", "-b", "50M", "-l", "65507", "-t", "0.5"]);
    assert!(r.end.sums[0].bytes > 1_000_000);
}

#[test]
fn many_streams() {
    let dir = setup();
    let (_srv, port) = server(&dir, &[]);
    let r = json_test(&dir, port, &["-P", "64", "-t", "1", "-l", "64K"]);
    assert_eq!(r.end.streams.len(), 64);
    for s in &r.end.streams {
        assert!(s.bytes > 0, "stream {:?} moved nothing", s.id);
    }
    let total: u64 = r.end.streams.iter().map(|s| s.bytes).sum();
    assert_eq!(r.end.sums[0].bytes, total);
}

#[test]
fn json_stream_is_one_object_per_line() {
    let dir = setup();
    let (_srv, port) = server(&dir, &[]);
    let out = run(&mut test_cmd(
        &dir,
        port,
        &["-t", "1", "-i", "0.25", "--json-stream"],
    ));
    assert_exit(&out, 0);
    let lines: Vec<TestStreamLine> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(matches!(lines.first(), Some(TestStreamLine::Start(_))));
    assert!(matches!(lines.last(), Some(TestStreamLine::End(_))));
    let intervals = lines
        .iter()
        .filter(|l| matches!(l, TestStreamLine::Interval(_)))
        .count();
    assert!(intervals >= 3, "{intervals} intervals");
}

#[test]
fn tcp_tests_report_their_ramp_and_udp_tests_none() {
    let dir = setup();
    let (_srv, port) = server(&dir, &[]);
    for args in [
        &["-t", "2.5", "--no-auto"][..],
        &["-t", "2.5", "-R", "-P", "2"],
    ] {
        let r = json_test(&dir, port, args);
        let ramp = r.end.ramp.unwrap_or_else(|| panic!("{args:?}: no ramp"));
        // Measured over one-second windows, so never under one second;
        // and some second of the test's second half carries about its
        // mean, so 90 % of it is reached inside the test.
        let secs = ramp
            .secs
            .unwrap_or_else(|| panic!("{args:?}: never reached 90 %: {ramp:?}"));
        assert!((0.99..=2.7).contains(&secs), "{args:?}: {ramp:?}");
        // The final rate is delivered bytes over the second half: of the
        // order of the test's average (loopback's rate swings, so only
        // within a factor of four).
        let avg = r.end.sums[0].bits_per_second;
        let fr = ramp.final_rate as f64;
        assert!(
            fr > avg / 4.0 && fr < avg * 4.0,
            "{args:?}: {fr} against {avg}"
        );
    }
    // Too short to tell; and UDP has no start-up to speak of.
    assert_eq!(json_test(&dir, port, &["-t", "1"]).end.ramp, None);
    let udp = json_test(&dir, port, &["-u", "-b", "10M", "-t", "2.5"]);
    assert_eq!(udp.end.ramp, None);
    let out = run(&mut test_cmd(&dir, port, &["-t", "2.5", "--no-auto"]));
    assert_exit(&out, 0);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ramp: 90% of "), "{text}");
}

#[test]
fn text_output_has_intervals_and_a_summary() {
    let dir = setup();
    let (_srv, port) = server(&dir, &[]);
    let out = run(&mut test_cmd(&dir, port, &["-t", "0.5", "-i", "0.25"]));
    assert_exit(&out, 0);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("0.00-0.25 s"), "{text}");
    assert!(text.contains("bit/s (receiver)"), "{text}");
    assert!(text.contains("CPU: client"), "{text}");
}

#[test]
fn wrong_key_exits_2_with_one_clear_line() {
    let dir = setup();
    crate::util::write_key(dir.path().join("server.key"), "correct horse battery\n");
    crate::util::write_key(dir.path().join("wrong.key"), "incorrect pony staple\n");
    let (_srv, port) = server(&dir, &["--key-file", "server.key"]);
    let out = run(&mut test_cmd(
        &dir,
        port,
        &["-t", "0.3", "--key-file", "wrong.key"],
    ));
    assert_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("wrong key"), "{err}");
    let out = run(&mut test_cmd(&dir, port, &["-t", "0.3"]));
    assert_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--key-file"));
    // The right key works.
    json_test(&dir, port, &["-t", "0.3", "--key-file", "server.key"]);
}

#[test]
fn socket_options_are_applied_and_reported() {
    let dir = setup();
    let (_srv, port) = server(&dir, &[]);
    let r = json_test(
        &dir,
        port,
        &[
            "-t",
            "0.5",
            // One stream: the pacing checked below is per stream, and with
            // no -P auto-tuning may plan more when the probe is unsure.
            "-P",
            "1",
            "-M",
            "1000",
            "-C",
            "reno",
            "--fq-rate",
            "200M",
            "-w",
            "64M",
        ],
    );
    let local = &r.start.local[0];
    assert!(local.mss > 0 && local.mss <= 1000, "MSS {}", local.mss);
    assert_eq!(local.congestion, "reno");
    // Pacing holds the stream near 200 Mbit/s.
    let bps = r.end.sums[0].bits_per_second;
    assert!((1.2e8..2.3e8).contains(&bps), "{bps} bit/s");
    // The grant is reported, and a cap below the request is warned about.
    let rmem_max: u64 = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    if rmem_max > 0 && rmem_max < 64 << 20 {
        assert!(
            r.start.warnings.iter().any(|w| w.contains("capped")),
            "{:?}",
            r.start.warnings
        );
        assert!(local.rcvbuf <= rmem_max);
    }
    // An unknown congestion control is a warning, not a failure.
    let r = json_test(&dir, port, &["-t", "0.3", "-C", "no-such-cc"]);
    assert!(
        r.start.warnings.iter().any(|w| w.contains("no-such-cc")),
        "{:?}",
        r.start.warnings
    );
}

#[test]
fn fifty_clients_at_once_all_succeed() {
    let dir = setup();
    let (_srv, port) = server(&dir, &[]);
    let children: Vec<_> = (0..50)
        .map(|_| {
            test_cmd(&dir, port, &["-t", "1", "--json"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn client")
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().expect("wait for client");
        assert_exit(&out, 0);
        let r: TestReport = serde_json::from_slice(&out.stdout).expect("report");
        assert!(r.end.sums[0].bytes > 0);
    }
}

#[test]
fn hostile_control_connections_do_not_hurt_a_session() {
    let dir = setup();
    let (_srv, port) = server(&dir, &["--preauth-timeout", "500ms"]);
    let addr = format!("127.0.0.1:{port}");
    let mut garbage = TcpStream::connect(&addr).unwrap();
    garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut oversized = TcpStream::connect(&addr).unwrap();
    oversized
        .write_all(&[0x7f, 0xff, 0xff, 0xff, 1, 2, 3])
        .unwrap();
    let mut stalled = TcpStream::connect(&addr).unwrap();
    // A test runs alongside them.
    let client = test_cmd(&dir, port, &["-t", "1", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The stalled connection is cut at the pre-auth deadline.
    let t0 = Instant::now();
    stalled
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut sink = Vec::new();
    let _ = stalled.read_to_end(&mut sink);
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    let out = client.wait_with_output().unwrap();
    assert_exit(&out, 0);
    let r: TestReport = serde_json::from_slice(&out.stdout).unwrap();
    assert!(r.end.sums[0].bytes > 1_000_000);
    // The garbage senders were refused, not left hanging.
    for s in [&mut garbage, &mut oversized] {
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut b = Vec::new();
        let _ = s.read_to_end(&mut b);
    }
}

#[test]
fn vanished_client_does_not_hurt_the_server() {
    let dir = setup();
    let (mut srv, port, mut log) = logged_server(&dir, &[]);
    let mut doomed = test_cmd(&dir, port, &["-t", "30", "-P", "4", "--no-auto"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed only once its session runs and data flows (its first interval
    // line), so the server really has a session and four streams to lose.
    log.wait_for(Duration::from_secs(10), "test session started");
    let mut lines = crate::util::Lines::read(doomed.stdout.take().unwrap());
    lines.wait_for(Duration::from_secs(10), "bit/s");
    doomed.kill().unwrap();
    doomed.wait().unwrap();
    // The server notices the loss, ends that session, and serves on.
    log.wait_for(Duration::from_secs(10), "test session");
    assert!(srv.0.try_wait().unwrap().is_none(), "the server died");
    let r = json_test(&dir, port, &["-t", "0.5", "-R"]);
    assert!(r.end.sums[0].bytes > 1_000_000);
}

/// [`server`] without `--quiet`: its log lines too, to wait on.
fn logged_server(dir: &Dir, extra: &[&str]) -> (Guard, u16, crate::util::Lines) {
    let mut cmd = dir.cmd();
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0"])
        .args(extra);
    crate::util::spawn_server_logged(cmd)
}

#[test]
fn a_full_server_says_busy_and_keeps_its_session() {
    let dir = setup();
    let (_srv, port, mut log) = logged_server(&dir, &["--max-sessions", "1"]);
    // Without auto-tuning each test is one session (no probe session).
    let first = test_cmd(&dir, port, &["-t", "1.5", "--json", "--no-auto"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    log.wait_for(Duration::from_secs(10), "test session started");
    let out = run(&mut test_cmd(&dir, port, &["-t", "0.3", "--no-auto"]));
    assert_exit(&out, 1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("busy"), "{err}");
    assert_eq!(err.matches("busy").count(), 1, "said once: {err}");
    let out = first.wait_with_output().unwrap();
    assert_exit(&out, 0);
    // The slot is free again.
    json_test(&dir, port, &["-t", "0.3", "--no-auto"]);
}

#[test]
fn unreachable_server_fails_with_exit_1() {
    let dir = setup();
    // Bind then drop to get a port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = run(&mut test_cmd(&dir, port, &["-t", "0.2"]));
    assert_exit(&out, 1);
    let out = run(&mut test_cmd(&dir, port, &["-t", "soon"]));
    assert_exit(&out, 2);
}
