//! `fatpipe tune`: the audit, its JSON, the snippets, bad input, and (as
//! root) that `--apply` then `--revert` leaves every sysctl it touches as
//! it was.
//!
//! The apply test really changes this machine's sysctls, so it snapshots
//! every key the Linux snippet sets before it starts, and a guard writes the
//! snapshot back when the test ends, even when it fails half-way.

use std::path::PathBuf;

use fatpipe_schema::tune::{TargetSource, ValueSource};

use crate::util::{assert_exit, need_root, run, setup, spawn_server, stderr};

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn audit_prints_findings_and_exits_0() {
    let dir = setup();
    let out = run(dir
        .cmd()
        .args(["tune", "--rate", "10gbit", "--rtt", "100ms"]));
    assert_exit(&out, 0);
    let text = stdout(&out);
    assert!(
        text.starts_with("fatpipe tune: this host against 10.0 Gbit/s × 100.0 ms (BDP 125 MB)"),
        "{text}"
    );
    for item in [
        "net.core.rmem_max",
        "net.ipv4.tcp_congestion_control",
        "scaling governor",
    ] {
        assert!(text.contains(item), "no {item} in:\n{text}");
    }
    assert!(text.contains(" critical, "), "no summary in:\n{text}");
}

#[test]
fn audit_json_parses_and_matches_the_host() {
    let dir = setup();
    let out = run(dir
        .cmd()
        .args(["tune", "--rate", "1gbit", "--rtt", "93ms", "--json"]));
    assert_exit(&out, 0);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("tune --json is JSON");
    assert_eq!(v["bdp"], 11_625_000);
    assert_eq!(v["target_rate"], 1_000_000_000u64);
    let findings = v["findings"].as_array().expect("findings array");
    // The audit reads /proc directly; it must agree with the file. (A key
    // --apply never writes, so the root test running alongside cannot race.)
    let key = "net.ipv4.tcp_available_congestion_control";
    let cc = findings
        .iter()
        .find(|f| f["item"] == key)
        .expect("available congestion controls finding");
    match std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control") {
        Ok(s) => assert_eq!(cc["current"]["known"], s.trim(), "{cc}"),
        Err(_) => assert!(cc["current"]["unknown"].is_string(), "{cc}"),
    }
    for f in findings {
        let sev = f["severity"].as_str().unwrap_or("");
        assert!(["ok", "info", "warn", "critical"].contains(&sev), "{f}");
    }
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let dir = setup();
    for args in [
        &["tune", "--rate", "fast"][..],
        &["tune", "--rtt", "soon"],
        &["tune", "--rate", "0"],
        &["tune", "--emit", "plan9"],
        &["tune", "--disk", ".", "--disk-size", "lots"],
    ] {
        let out = run(dir.cmd().args(args));
        assert_exit(&out, 2);
        let err = stderr(&out);
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("fatpipe: "), "{args:?}: {err}");
    }
    let out = run(dir.cmd().args(["tune", "--rate", "fast"]));
    assert!(
        stderr(&out).contains("invalid rate 'fast'"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn emits_a_snippet_per_os() {
    let dir = setup();
    for (os, line) in [
        ("linux", "net.core.rmem_max = "),
        ("freebsd", "kern.ipc.maxsockbuf = 536870912"),
        ("macos", "kern.ipc.maxsockbuf = 268435456"),
    ] {
        let out = run(dir
            .cmd()
            .args(["tune", "--rate", "10gbit", "--rtt", "100ms", "--emit", os]));
        assert_exit(&out, 0);
        assert!(
            stdout(&out).lines().any(|l| l.starts_with(line)),
            "{os}:\n{}",
            stdout(&out)
        );
    }
}

#[test]
fn disk_test_reports_rates_and_leaves_nothing() {
    let dir = setup();
    let out = run(dir
        .cmd()
        .args(["tune", "--json", "--disk", ".", "--disk-size", "8M"]));
    assert_exit(&out, 0);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert!(
        v["disk"]["write_rate"].as_u64().unwrap_or(0) > 0,
        "{}",
        v["disk"]
    );
    assert!(
        v["disk"]["read_rate"].as_u64().unwrap_or(0) > 0,
        "{}",
        v["disk"]
    );
    let left: Vec<_> = std::fs::read_dir(dir.path()).expect("list").collect();
    assert!(left.is_empty(), "disk test left {left:?}");
}

/// Writes a snapshot of sysctls back when dropped.
struct Restore(Vec<(PathBuf, String)>);

impl Drop for Restore {
    fn drop(&mut self) {
        for (path, value) in &self.0 {
            let _ = std::fs::write(path, value);
        }
    }
}

fn sysctl_path(key: &str) -> PathBuf {
    PathBuf::from("/proc/sys").join(key.replace('.', "/"))
}

#[test]
fn apply_then_revert_leaves_every_sysctl_as_it_was() {
    if !need_root("apply_then_revert_leaves_every_sysctl_as_it_was") {
        return;
    }
    let dir = setup();
    let backups = dir.path().join("backups");
    // A target large enough that the buffers must change on any host.
    let target = ["tune", "--rate", "100gbit", "--rtt", "250ms"];

    let out = run(dir.cmd().args(target).args(["--emit", "linux"]));
    assert_exit(&out, 0);
    let wanted: Vec<(String, String)> = stdout(&out)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(" = "))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    assert!(wanted.len() >= 8, "{wanted:?}");
    let snapshot: Vec<(PathBuf, String)> = wanted
        .iter()
        .map(|(k, _)| {
            let p = sysctl_path(k);
            let v = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{k}: {e}"));
            (p, v)
        })
        .collect();
    let _restore = Restore(snapshot.clone());
    let norm = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");

    let out = run(dir
        .cmd()
        .args(target)
        .args(["--apply", "--backup-dir"])
        .arg(&backups));
    assert_exit(&out, 0);
    assert!(stdout(&out).contains("backup: "), "{}", stdout(&out));
    for (key, value) in &wanted {
        let now = std::fs::read_to_string(sysctl_path(key)).unwrap_or_default();
        assert_eq!(norm(&now), norm(value), "{key} after --apply");
    }

    let out = run(dir
        .cmd()
        .args(["tune", "--revert", "--backup-dir"])
        .arg(&backups));
    assert_exit(&out, 0);
    for (path, before) in &snapshot {
        let now = std::fs::read_to_string(path).unwrap_or_default();
        assert_eq!(now, *before, "{} after --revert", path.display());
    }

    // Nothing left to revert.
    let out = run(dir
        .cmd()
        .args(["tune", "--revert", "--backup-dir"])
        .arg(&backups));
    assert_exit(&out, 1);
    assert!(stderr(&out).contains("no backup"), "{}", stderr(&out));
}

fn audit_json(out: &std::process::Output) -> fatpipe_schema::tune::Audit {
    assert_exit(out, 0);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "tune --json does not parse: {e}\n{}\n{}",
            stdout(out),
            stderr(out)
        )
    })
}

#[test]
fn for_a_loopback_server_audits_the_probed_path_and_the_peer() {
    let dir = setup();
    let mut cmd = dir.cmd();
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0", "--quiet"]);
    let (_srv, port) = spawn_server(cmd);
    let host = format!("127.0.0.1:{port}");
    let a = audit_json(&run(dir.cmd().args(["tune", "--for", &host, "--json"])));
    let t = a.target.as_ref().expect("a target record");
    assert_eq!(t.source, TargetSource::Probe);
    assert_eq!(t.peer.as_deref(), Some(host.as_str()));
    assert_eq!(t.remote.as_deref(), Some(host.as_str()));
    assert_eq!(t.rtt_source, ValueSource::Probe);
    let rtt = t.probed_rtt_secs.expect("a probed RTT");
    assert!(rtt < 0.005, "loopback RTT {rtt}");
    assert!((a.target_rtt_secs - rtt.max(1e-6)).abs() < 1e-9, "{a:?}");
    // Loopback outruns this host's sender: the estimate is a lower bound,
    // and the target is that bound or the --rate default, whichever is
    // larger, with a note. On a loaded host the probe may instead find
    // the sender was not the limit: then the estimate is the target, said
    // to be rough when its trains disagree.
    let probed = t.probed_rate.expect("a rate estimate on loopback");
    if t.rate_lower_bound {
        assert_eq!(a.target_rate, probed.max(10_000_000_000), "{t:?}");
        assert!(t.notes.iter().any(|n| n.contains("lower bound")), "{t:?}");
    } else {
        assert_eq!(a.target_rate, probed, "{t:?}");
        if t.rate_confidence.is_some_and(|c| c < 0.4) {
            assert!(t.notes.iter().any(|n| n.contains("rough")), "{t:?}");
        }
    }
    // Loopback loses nothing on the wire, but a receiver descheduled on a
    // loaded host can overflow its socket buffer (CI saw 1 of ~2,000
    // probe packets dropped): the loss is reported, and small.
    assert!(t.loss_rate.is_some_and(|l| l < 0.01), "{t:?}");
    assert!(t.mtu.is_some_and(|m| m >= 16436), "{t:?}");
    assert!(a
        .findings
        .iter()
        .any(|f| f.item == "path mtu" && f.area == "path"));
    assert!(a.findings.iter().any(|f| f.item == "path loss"));
    // The peer is this machine: its limits must be what /proc says here.
    let peer = a.peer.as_ref().expect("peer findings");
    assert_eq!(peer.server, host);
    assert_eq!(peer.findings.len(), 6);
    assert!(peer.findings.iter().all(|f| f.area == "peer"));
    let rmem = peer
        .findings
        .iter()
        .find(|f| f.item == "net.core.rmem_max")
        .expect("peer rmem_max");
    match std::fs::read_to_string("/proc/sys/net/core/rmem_max") {
        Ok(s) => assert_eq!(rmem.current.known().map(String::as_str), Some(s.trim())),
        Err(_) => assert!(rmem.current.known().is_none()),
    }
    assert!(rmem.recommended.is_some());
    assert!(a.plan.is_some());

    // Flags win for their part; the text says where each value came from.
    let a = audit_json(&run(dir.cmd().args([
        "tune", "--for", &host, "--rate", "2gbit", "--rtt", "50ms", "--json",
    ])));
    let t = a.target.as_ref().expect("a target record");
    assert_eq!((a.target_rate, a.target_rtt_secs), (2_000_000_000, 0.05));
    assert_eq!(
        (t.rate_source.as_str(), t.rtt_source.as_str()),
        ("flag", "flag")
    );
    assert!(t.probed_rtt_secs.is_some());
    let out = run(dir.cmd().args(["tune", "--for", &host, "--rate", "2gbit"]));
    assert_exit(&out, 0);
    let text = stdout(&out);
    assert!(
        text.contains(&format!("target from a probe of {host}")),
        "{text}"
    );
    assert!(text.contains("rtt probed, rate from the flag"), "{text}");
    assert!(text.contains("the peer 127.0.0.1"), "{text}");

    // --emit works with --for and says where its target came from.
    let out = run(dir.cmd().args(["tune", "--for", &host, "--emit", "linux"]));
    assert_exit(&out, 0);
    let text = stdout(&out);
    assert!(text.starts_with("# target from a probe of"), "{text}");
    assert!(text.contains("net.core.rmem_max = "), "{text}");

    // Without --for the record says the values are flags or defaults.
    let a = audit_json(&run(dir.cmd().args(["tune", "--rtt", "20ms", "--json"])));
    let t = a.target.as_ref().expect("a target record");
    assert_eq!(
        (
            t.source.as_str(),
            t.rate_source.as_str(),
            t.rtt_source.as_str()
        ),
        ("flags", "default", "flag")
    );
    assert!(a.peer.is_none());
}

#[test]
fn for_errors_are_one_line_with_the_path_exit_codes() {
    let dir = setup();
    crate::util::write_key(dir.path().join("server.key"), "correct horse battery\n");
    crate::util::write_key(dir.path().join("client.key"), "wrong horse battery\n");
    let mut cmd = dir.cmd();
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0", "--quiet"])
        .args(["--key-file", "server.key"]);
    let (srv, port) = spawn_server(cmd);
    let host = format!("127.0.0.1:{port}");
    for (args, code) in [
        (vec!["--for", host.as_str(), "--key-file", "client.key"], 2),
        (vec!["--for", host.as_str()], 2),
        (vec!["--for", "no-such-host.invalid"], 2),
        (vec!["--for", "[::1"], 2),
    ] {
        let out = run(dir.cmd().arg("tune").args(&args));
        assert_exit(&out, code);
        let err = stderr(&out);
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    }
    // Flags that need --for, or clash with it, are clap's usage errors.
    for args in [
        &["--key-file", "client.key"][..],
        &["--port", "9"],
        &["--for", "127.0.0.1", "--revert"],
    ] {
        assert_exit(&run(dir.cmd().arg("tune").args(args)), 2);
    }
    let a = audit_json(&run(dir.cmd().args([
        "tune",
        "--for",
        &host,
        "--key-file",
        "server.key",
        "--json",
    ])));
    assert!(a.peer.is_some());
    drop(srv);
    let out = run(dir.cmd().args(["tune", "--for", &host]));
    assert_exit(&out, 1);
    let err = stderr(&out);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.starts_with("fatpipe: path to "), "{err}");
}

#[test]
fn lab_tune_for_a_1gbit_100ms_peer_targets_the_probed_path() {
    if !need_root("lab_tune_for_a_1gbit_100ms_peer_targets_the_probed_path") {
        return;
    }
    use fatpipe_lab::{End, LinkSpec};
    let name = "tfor1g";
    let spec = LinkSpec {
        rtt: std::time::Duration::from_millis(100),
        rate_up: 1_000_000_000,
        rate_down: 1_000_000_000,
        seed: 7,
        ..LinkSpec::default()
    };
    let (l, _srv, host, _) = crate::util::lab_with_server(name, &spec, &[]);
    let a = audit_json(&run(l
        .command(End::A, crate::util::bin())
        .args(["tune", "--for", &host, "--json"])));
    let t = a.target.as_ref().expect("a target record");
    assert_eq!(
        (t.rate_source.as_str(), t.rtt_source.as_str()),
        ("probe", "probe"),
        "{t:?}"
    );
    assert!(
        (a.target_rtt_secs - 0.1).abs() < 0.002,
        "RTT {}",
        a.target_rtt_secs
    );
    let err = a.target_rate as f64 / 1e9 - 1.0;
    assert!(
        err.abs() < 0.15,
        "rate {} ({:+.1} %)",
        a.target_rate,
        err * 100.0
    );
    assert_eq!(t.mtu, Some(1500));
    assert!(a.peer.as_ref().is_some_and(|p| p.findings.len() == 6));
    eprintln!(
        "{name}: target rtt {:.2} ms, rate {:.1} Mbit/s ({:+.1} %)",
        a.target_rtt_secs * 1e3,
        a.target_rate as f64 / 1e6,
        err * 100.0
    );
}
