//! `fatpipe path`: the real binary against a real server, on loopback and
//! on emulated long fat links (root).
//!
//! The loopback tests check that the probe runs end to end and that its
//! output is what the schema says; only the lab tests can check accuracy,
//! because only there is the true RTT and bottleneck known: each brings up
//! a lab link with its own name, runs the server in namespace `b` and the
//! probe from `a`, and compares with the configured link. Servers are
//! ended by PID through their guard; a `Lab` removes itself when dropped
//! (also on panic), and its owner is this process in case it is killed.

use std::sync::Mutex;
use std::time::Duration;

use fatpipe_lab::{End, LinkSpec};
use fatpipe_schema::path::{PathReport, PATH_SCHEMA, PATH_SCHEMA_VERSION};

use crate::util::{self, assert_exit, run, setup, spawn_server};

fn parse(out: &std::process::Output) -> PathReport {
    assert_exit(out, 0);
    let r: PathReport = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "report does not parse: {e}\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    assert_eq!(r.schema, PATH_SCHEMA);
    assert_eq!(r.version, PATH_SCHEMA_VERSION);
    r
}

#[test]
fn loopback_probe_reports_small_rtt_mtu_rate_and_a_plan() {
    let dir = setup();
    let mut cmd = dir.cmd();
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0", "--quiet"]);
    let (_srv, port) = spawn_server(cmd);
    let host = format!("127.0.0.1:{port}");
    let r = parse(&run(dir
        .cmd()
        .args(["path", &host, "--count", "7", "--json"])));
    assert_eq!(r.server, host);
    assert_eq!((r.rtt.sent, r.rtt.received), (7, 7));
    assert!(
        r.rtt.min_secs > 0.0 && r.rtt.min_secs < 0.005,
        "{:?}",
        r.rtt
    );
    assert!(r.rtt.min_secs <= r.rtt.avg_secs && r.rtt.avg_secs <= r.rtt.max_secs);
    // Loopback's MTU is 65536 (16436 on old kernels); the search must
    // confirm the route's MTU, capped at the largest IPv4 packet.
    let route = r.mtu.route_mtu.expect("route MTU on Linux");
    assert!(route >= 16436, "{:?}", r.mtu);
    assert_eq!(r.mtu.path_mtu, Some(route.min(65_535)), "{:?}", r.mtu);
    let b = r.bottleneck.as_ref().expect("a rate estimate on loopback");
    assert!(b.rate > 100_000_000, "{b:?}");
    assert!(b.low <= b.rate && b.rate <= b.high, "{b:?}");
    assert!((0.0..=1.0).contains(&b.confidence));
    assert_eq!(r.loss.echo_lost, 0);
    assert_eq!(r.facts.bottleneck_rate, Some(b.rate));
    assert_eq!(r.bdp, r.single_stream_window);
    let plan = r.plan.as_ref().expect("host limits are readable on Linux");
    assert!(
        plan.streams >= 1 && plan.reason.starts_with("auto:"),
        "{plan:?}"
    );

    // The text for people has one line per measurement.
    let out = run(dir.cmd().args(["path", &host, "-c", "3"]));
    assert_exit(&out, 0);
    let text = String::from_utf8_lossy(&out.stdout);
    for want in ["rtt ", "mtu ", "rate ", "loss ", "bdp ", "auto:"] {
        assert!(
            text.lines().any(|l| l.starts_with(want)),
            "no {want:?} line in\n{text}"
        );
    }
}

#[test]
fn reverse_loopback_probe_has_the_server_send_the_trains() {
    let dir = setup();
    let mut cmd = dir.cmd();
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0", "--quiet"]);
    let (_srv, port) = spawn_server(cmd);
    let host = format!("127.0.0.1:{port}");
    let r = parse(&run(dir.cmd().args([
        "path",
        &host,
        "--reverse",
        "-c",
        "3",
        "--json",
    ])));
    assert!(r.reverse);
    assert_eq!(r.rtt.received, 3);
    let b = r
        .bottleneck
        .as_ref()
        .expect("a rate from the server's trains");
    assert!(b.rate > 100_000_000, "{b:?}");
    assert!(
        r.loss.train_sent > 0 && r.loss.train_lost == 0,
        "{:?}",
        r.loss
    );
    let out = run(dir.cmd().args(["path", &host, "-R", "-c", "2"]));
    assert_exit(&out, 0);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .next()
            .is_some_and(|l| l.contains("in reverse")),
        "{text}"
    );
    // A forward report says it is one.
    let r = parse(&run(dir.cmd().args(["path", &host, "-c", "2", "--json"])));
    assert!(!r.reverse);
}

#[test]
fn ipv6_loopback_probe() {
    if std::net::UdpSocket::bind("[::1]:0").is_err() {
        crate::util::skip("ipv6_loopback_probe: this host has no IPv6 loopback");
        return;
    }
    let dir = setup();
    let mut cmd = dir.cmd();
    cmd.args(["server", "--bind", "::1", "--port", "0", "--quiet"]);
    let (_srv, port) = spawn_server(cmd);
    let host = format!("[::1]:{port}");
    let r = parse(&run(dir.cmd().args(["path", &host, "-c", "3", "--json"])));
    assert_eq!(r.remote, host);
    assert_eq!(r.rtt.received, 3);
    // IPv6 counts its 40-byte header outside the 65535 payload limit, so
    // the whole 65536-byte loopback MTU can pass.
    let route = r.mtu.route_mtu.expect("route MTU");
    assert_eq!(r.mtu.path_mtu, Some(route), "{:?}", r.mtu);
    assert!(r.bottleneck.is_some());
}

#[test]
fn bad_host_is_a_usage_error_in_one_line() {
    let dir = setup();
    for host in ["no-such-host.invalid", "127.0.0.1:notaport", "[::1"] {
        let out = run(dir.cmd().args(["path", host]));
        assert_exit(&out, 2);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("fatpipe: "), "{err}");
    }
    let out = run(dir.cmd().args(["path", "127.0.0.1", "--count", "0"]));
    assert_exit(&out, 2);
}

#[test]
fn wrong_key_is_a_usage_error_and_no_server_a_failure() {
    let dir = setup();
    crate::util::write_key(dir.path().join("server.key"), "correct horse battery\n");
    crate::util::write_key(dir.path().join("client.key"), "wrong horse battery\n");
    let mut cmd = dir.cmd();
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0", "--quiet"])
        .args(["--key-file", "server.key"]);
    let (srv, port) = spawn_server(cmd);
    let host = format!("127.0.0.1:{port}");
    let out = run(dir.cmd().args(["path", &host, "--key-file", "client.key"]));
    assert_exit(&out, 2);
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
    let ok = parse(&run(dir.cmd().args([
        "path",
        &host,
        "--key-file",
        "server.key",
        "-c",
        "2",
        "--json",
    ])));
    assert_eq!(ok.rtt.received, 2);
    // Nothing listens once the server is gone: the probe fails (exit 1).
    drop(srv);
    let out = run(dir.cmd().args(["path", &host]));
    assert_exit(&out, 1);
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
}

/// The lab tests here run one at a time: two probes sharing two cores
/// would each see the other's traffic in their timing.
static LAB_SERIAL: Mutex<()> = Mutex::new(());

/// Probes a lab link of `rtt` and `rate` three times and checks that every
/// probe reports the RTT within 2 ms, and the bottleneck within 15 % or says
/// that it is rough; at least two of the three must be within 15 %.
///
/// The allowance is the probe's own contract: when its trains disagree it
/// labels its confidence "low" and warns "treat the rate as rough"
/// (docs/path.md). On this 2-core lab about one probe in fifteen
/// does, with either the current build or the one before the crate split
/// (measured side by side: 915 and 891 Mbit/s on 1 Gbit/s, each flagged),
/// so a single such probe is the tool being honest, not a failure.
fn lab_accuracy(name: &str, rtt: Duration, rate: u64) {
    let _serial = LAB_SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let spec = LinkSpec {
        rtt,
        rate_up: rate,
        rate_down: rate,
        seed: 7,
        ..LinkSpec::default()
    };
    let (l, _srv, host, _) = util::lab_with_server(name, &spec, &[]);
    let mut accurate = 0;
    for attempt in 0..3 {
        let out = run(l
            .command(End::A, util::bin())
            .args(["path", &host, "--json"]));
        let r = parse(&out);
        let got_rtt = r.rtt.min_secs;
        assert!(
            (got_rtt - rtt.as_secs_f64()).abs() < 0.002,
            "probe {attempt}: RTT {got_rtt} s on a {rtt:?} link"
        );
        let b = r.bottleneck.as_ref().expect("a rate estimate");
        let err = (b.rate as f64 / rate as f64 - 1.0).abs();
        if err < 0.15 {
            accurate += 1;
        } else {
            let rough = r
                .warnings
                .iter()
                .any(|w| w.contains("treat the rate as rough"));
            assert!(
                b.confidence_label == "low" && rough,
                "probe {attempt}: bottleneck {} bit/s on a {rate} bit/s link ({:.1} % off) \
                 without saying it is rough: {b:?} {:?}",
                b.rate,
                err * 100.0,
                r.warnings
            );
        }
        assert!(!b.lower_bound, "{b:?}");
        assert_eq!(r.mtu.path_mtu, Some(1500), "{:?}", r.mtu);
        assert_eq!(r.loss.echo_lost, 0);
        eprintln!(
            "{name}: rtt {:.2} ms, rate {:.1} Mbit/s ({:+.1} %), confidence {:.2}",
            got_rtt * 1e3,
            b.rate as f64 / 1e6,
            (b.rate as f64 / rate as f64 - 1.0) * 100.0,
            b.confidence
        );
    }
    assert!(
        accurate >= 2,
        "only {accurate} of 3 probes within 15 % of {rate} bit/s"
    );
}

#[test]
fn lab_path_reports_rtt_and_bottleneck_of_a_1gbit_40ms_link() {
    if !util::need_root("lab_path_reports_rtt_and_bottleneck_of_a_1gbit_40ms_link") {
        return;
    }
    lab_accuracy("path1g", Duration::from_millis(40), 1_000_000_000);
}

#[test]
fn lab_path_reports_rtt_and_bottleneck_of_a_200mbit_93ms_link() {
    if !util::need_root("lab_path_reports_rtt_and_bottleneck_of_a_200mbit_93ms_link") {
        return;
    }
    lab_accuracy("path200m", Duration::from_millis(93), 200_000_000);
}

/// `path --reverse` on an asymmetric link: 100 Mbit/s from `a` to `b`,
/// 1 Gbit/s back. The forward probe (the client in `a` sends) must find
/// the first, the reverse probe (the server in `b` sends) the second.
#[test]
fn lab_path_reverse_measures_each_direction_of_an_asymmetric_link() {
    if !util::need_root("lab_path_reverse_measures_each_direction_of_an_asymmetric_link") {
        return;
    }
    let _serial = LAB_SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let name = "tfasym";
    let (up, down) = (100_000_000u64, 1_000_000_000u64);
    let spec = LinkSpec {
        rtt: Duration::from_millis(40),
        rate_up: up,
        rate_down: down,
        seed: 7,
        ..LinkSpec::default()
    };
    let (l, _srv, host, _) = util::lab_with_server(name, &spec, &[]);
    for (flag, want) in [(None, up), (Some("--reverse"), down)] {
        let mut cmd = l.command(End::A, util::bin());
        cmd.args(["path", &host, "--json"]).args(flag);
        let r = parse(&run(&mut cmd));
        assert_eq!(r.reverse, flag.is_some());
        assert!((r.rtt.min_secs - 0.04).abs() < 0.002, "{:?}", r.rtt);
        let b = r.bottleneck.as_ref().expect("a rate estimate");
        let err = b.rate as f64 / want as f64 - 1.0;
        eprintln!(
            "{name} {}: rate {:.1} Mbit/s ({:+.1} % of {} Mbit/s), confidence {:.2}",
            flag.unwrap_or("forward"),
            b.rate as f64 / 1e6,
            err * 100.0,
            want / 1_000_000,
            b.confidence
        );
        assert!(
            err.abs() < 0.15,
            "{flag:?}: {b:?} on a {want} bit/s direction"
        );
        assert!(!b.lower_bound, "{b:?}");
    }
    // The pre-flight of a reverse test (the server sends) plans from the
    // direction the data takes: 1 Gbit/s, not the 100 Mbit/s forward. The
    // pre-flight's short probe is checked for that (the directions are 10×
    // apart), not for the `path` probe's 15 % above: its few trains once
    // landed 16 % low on this 2-core lab (CI run of f8c1ee9), and the
    // in-flight adjuster exists to make such a start up.
    for (flag, want) in [(None, up), (Some("-R"), down)] {
        let mut cmd = l.command(End::A, util::bin());
        cmd.args(["test", &host, "-t", "1", "--json"]).args(flag);
        let out = run(&mut cmd);
        assert_exit(&out, 0);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("test --json");
        let got = v["start"]["auto"]["facts"]["bottleneck_rate"]
            .as_u64()
            .unwrap_or_else(|| panic!("no start.auto rate: {}", v["start"]["auto"]));
        let err = got as f64 / want as f64 - 1.0;
        eprintln!(
            "{name} test {}: pre-flight rate {:.1} Mbit/s ({:+.1} %)",
            flag.unwrap_or("forward"),
            got as f64 / 1e6,
            err * 100.0
        );
        assert!(
            err.abs() < 0.3,
            "{flag:?}: pre-flight {got} on a {want} bit/s direction"
        );
    }
}
