//! `fatpipe tune`: the audit, its JSON, the snippets, bad input, and (as
//! root) that `--apply` then `--revert` leaves every sysctl it touches as
//! it was.
//!
//! The apply test really changes this machine's sysctls, so it snapshots
//! every key the Linux snippet sets before it starts, and a guard writes the
//! snapshot back when the test ends, even when it fails half-way.

use std::path::PathBuf;

use crate::util::{assert_exit, need_root, run, setup};

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
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
