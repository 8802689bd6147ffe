//! `fatpipe server --metrics`, `/probe`, stopping on a signal, and the
//! files that make fatpipe a daemon (completions, manual pages, systemd
//! units, the Grafana dashboard), with the real binary on loopback.
//!
//! The metrics tests scrape a real server during and after real tests and
//! check the counters against the client's own JSON report, so a counter
//! that moves by the wrong amount (or not at all) fails them.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fatpipe_schema::test::TestReport;

use crate::util::{
    assert_exit, bin, journal_has_records, json, random_file, run, setup, spawn_server, wait_for,
    Dir, Guard,
};

/// Starts `fatpipe server --port 0 --metrics 127.0.0.1:0` with `extra`;
/// returns it, its port and its metrics address (the second stdout line).
fn server_with_metrics(dir: &Dir, extra: &[&str]) -> (Guard, u16, String) {
    let mut cmd = dir.cmd();
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0", "--quiet"])
        .args(["--metrics", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().expect("spawn fatpipe server");
    let stdout = child.stdout.take().expect("server stdout");
    let guard = Guard(child);
    let mut lines = BufReader::new(stdout).lines();
    let mut next = || lines.next().and_then(|l| l.ok()).unwrap_or_default();
    let (first, second) = (next(), next());
    let port = first
        .strip_prefix("listening on ")
        .and_then(|a| a.rsplit_once(':'))
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line: {first:?}"));
    let metrics = second
        .strip_prefix("metrics on ")
        .unwrap_or_else(|| panic!("unexpected second line: {second:?}"))
        .to_string();
    (guard, port, metrics)
}

/// GETs `path` from `addr`; returns the status code and the body.
fn get(addr: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the metrics listener");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read the answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    (code, body.to_string())
}

/// The value of one series (`name{labels}` exactly as exposed).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Like [`sample`], but 0 for a series not exposed yet.
fn value(text: &str, series: &str) -> f64 {
    sample(text, series).unwrap_or(0.0)
}

/// The metrics once the server has closed its `ok` session number `n`: the
/// client can exit before the server has finished its side of the
/// session, so a scrape right after the client may be a moment early.
fn settled(maddr: &str, n: f64) -> String {
    let mut text = String::new();
    wait_for(Duration::from_secs(10), "the session to be counted", || {
        text = get(maddr, "/metrics").1;
        value(&text, OK) >= n && value(&text, ACTIVE) == 0.0
    });
    text
}

fn report(out: &std::process::Output) -> TestReport {
    assert_exit(out, 0);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "report does not parse: {e}\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

const UP: &str = "fatpipe_data_bytes_total{service=\"test\",direction=\"received\"}";
const DOWN: &str = "fatpipe_data_bytes_total{service=\"test\",direction=\"sent\"}";
const ACTIVE: &str = "fatpipe_active_sessions{service=\"test\"}";
const STREAMS: &str = "fatpipe_active_streams{service=\"test\"}";
const OK: &str = "fatpipe_sessions_total{service=\"test\",outcome=\"ok\"}";

#[test]
fn metrics_count_tests_during_and_after_by_the_right_amounts() {
    let dir = setup();
    crate::util::write_key(dir.path().join("key"), "metrics-test-key\n");
    crate::util::write_key(dir.path().join("wrong"), "not-the-key-at-all\n");
    let (_srv, port, maddr) = server_with_metrics(&dir, &["--key-file", "key"]);
    let target = format!("127.0.0.1:{port}");
    let (code, before) = get(&maddr, "/metrics");
    assert_eq!(code, 200, "{before}");
    assert_eq!(sample(&before, "fatpipe_auth_failures_total"), Some(0.0));

    // A wrong key: one authentication failure, no session.
    let out = run(dir
        .cmd()
        .args(["test", &target, "--key-file", "wrong", "--no-auto"]));
    assert_exit(&out, 2);
    // The client learns of the refusal before the server has counted it
    // (the count follows the refusal it sends): wait for the count, then
    // check it is exactly one. CI once read 0 here.
    let mut after_auth = String::new();
    crate::util::wait_for(Duration::from_secs(10), "the auth failure counted", || {
        after_auth = get(&maddr, "/metrics").1;
        sample(&after_auth, "fatpipe_auth_failures_total") != Some(0.0)
    });
    assert_eq!(
        sample(&after_auth, "fatpipe_auth_failures_total"),
        Some(1.0)
    );
    assert_eq!(value(&after_auth, OK), 0.0);

    // Up, two streams, long enough to be scraped while it runs.
    let client = dir
        .cmd()
        .args(["test", &target, "--key-file", "key", "--no-auto"])
        .args(["-P", "2", "-t", "2", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn fatpipe test");
    let mut during = String::new();
    wait_for(
        Duration::from_secs(10),
        "the test to be seen running",
        || {
            during = get(&maddr, "/metrics").1;
            value(&during, ACTIVE) == 1.0 && value(&during, UP) > 0.0
        },
    );
    assert_eq!(sample(&during, STREAMS), Some(2.0), "{during}");
    let up = report(&client.wait_with_output().expect("wait for the test"));
    let after_up = settled(&maddr, 1.0);
    let got = &up.end.sums[0];
    assert_eq!(value(&after_up, UP), got.bytes as f64, "{after_up}");
    // Under load the scrape "during" can land after the last interval's
    // report, so the count may not have risen since; it never falls.
    assert!(
        value(&after_up, UP) >= value(&during, UP),
        "the byte count fell after the scrape"
    );
    assert_eq!(value(&after_up, OK), 1.0);
    assert_eq!(value(&after_up, ACTIVE), 0.0);
    assert_eq!(value(&after_up, STREAMS), 0.0);
    let peer = "{service=\"test\",peer=\"127.0.0.1\",direction=\"received\"}";
    let rate = value(
        &after_up,
        &format!("fatpipe_peer_last_test_throughput_bytes_per_second{peer}"),
    );
    let client_rate = got.bits_per_second / 8.0;
    assert!(
        (rate - client_rate).abs() <= client_rate * 0.2,
        "server saw {rate} B/s, client {client_rate} B/s"
    );

    // Reverse: the server sends; its sent counter is what it wrote.
    let out = run(dir
        .cmd()
        .args(["test", &target, "--key-file", "key", "--no-auto"])
        .args(["-R", "-t", "1", "--json"]));
    let down = report(&out);
    let after_down = settled(&maddr, 2.0);
    assert_eq!(
        value(&after_down, DOWN),
        down.end.sums[0].bytes_sent as f64,
        "{after_down}"
    );
    assert_eq!(value(&after_down, UP), value(&after_up, UP));
    assert_eq!(value(&after_down, OK), 2.0);
    let sent = "{service=\"test\",peer=\"127.0.0.1\",direction=\"sent\"}";
    assert!(sample(
        &after_down,
        &format!("fatpipe_peer_last_test_retransmits{sent}")
    )
    .is_some());
    assert!(
        value(
            &after_down,
            "fatpipe_peer_last_test_rtt_seconds{service=\"test\",peer=\"127.0.0.1\"}"
        ) > 0.0
    );
}

#[test]
fn probe_runs_a_short_test_and_answers_with_its_result() {
    let dir = setup();
    crate::util::write_key(dir.path().join("key"), "probe-test-key-1\n");
    // The target: a plain server with the same key as the prober.
    let mut target_cmd = dir.cmd();
    target_cmd
        .args(["server", "--bind", "127.0.0.1", "--port", "0", "--quiet"])
        .args(["--key-file", "key"]);
    let (_target, tport) = spawn_server(target_cmd);
    let (_srv, port, maddr) = server_with_metrics(&dir, &["--key-file", "key"]);

    let t0 = Instant::now();
    let (code, body) = get(
        &maddr,
        &format!("/probe?target=127.0.0.1:{tport}&duration=1s&streams=2"),
    );
    assert_eq!(code, 200, "{body}");
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    assert_eq!(sample(&body, "fatpipe_probe_success"), Some(1.0), "{body}");
    let up = "{direction=\"up\"}";
    let bytes = value(&body, &format!("fatpipe_probe_received_bytes{up}"));
    let rate = value(
        &body,
        &format!("fatpipe_probe_throughput_bytes_per_second{up}"),
    );
    let measured = value(&body, "fatpipe_probe_measured_seconds");
    assert!(bytes > 1e6, "{body}");
    assert!((0.8..2.0).contains(&measured), "{body}");
    assert!(
        (rate * measured - bytes).abs() <= bytes * 0.05,
        "throughput × time is not the bytes: {body}"
    );
    assert!(sample(&body, &format!("fatpipe_probe_rtt_seconds{up}")).is_some());

    // Reverse: the result is the other direction.
    let (_, body) = get(
        &maddr,
        &format!("/probe?target=127.0.0.1:{tport}&duration=0.5s&reverse=1"),
    );
    assert_eq!(sample(&body, "fatpipe_probe_success"), Some(1.0), "{body}");
    assert!(value(&body, "fatpipe_probe_received_bytes{direction=\"down\"}") > 0.0);

    // Nothing listening there: a result of failure, not an HTTP error.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = closed.local_addr().unwrap();
    drop(closed);
    let (code, body) = get(&maddr, &format!("/probe?target={dead}&duration=1s"));
    assert_eq!(code, 200, "{body}");
    assert_eq!(sample(&body, "fatpipe_probe_success"), Some(0.0), "{body}");

    // A bad query says what is wrong.
    let (code, body) = get(&maddr, "/probe?duration=1s");
    assert_eq!(code, 400);
    assert!(body.contains("target"), "{body}");
    let (code, body) = get(&maddr, "/probe?target=h&duration=1h");
    assert_eq!(code, 400);
    assert!(body.contains("at most"), "{body}");

    // Every metric the Grafana dashboard plots is one the server or the
    // probe exposes: a probe of the prober itself fills both sides.
    let (_, probe) = get(
        &maddr,
        &format!("/probe?target=127.0.0.1:{port}&duration=0.2s&reverse=1"),
    );
    let (_, metrics) = get(&maddr, "/metrics");
    assert_eq!(
        value(
            &metrics,
            "fatpipe_sessions_total{service=\"copy\",outcome=\"ok\"}"
        ),
        0.0
    );
    assert!(metrics.contains("fatpipe_sessions_total{service=\"copy\",outcome=\"ok\"} 0"));
    let exposed = exposed(&format!("{metrics}\n{probe}"));
    let dashboard = std::fs::read_to_string(repo().join("contrib/grafana/fatpipe-dashboard.json"))
        .expect("read the dashboard");
    let dash: serde_json::Value = serde_json::from_str(&dashboard).expect("dashboard is JSON");
    let mut plotted = BTreeSet::new();
    for panel in dash["panels"].as_array().expect("panels") {
        for t in panel["targets"].as_array().into_iter().flatten() {
            plotted.extend(names(t["expr"].as_str().expect("an expr")));
        }
    }
    assert!(plotted.len() >= 10, "{plotted:?}");
    let missing: Vec<_> = plotted.difference(&exposed).collect();
    assert!(missing.is_empty(), "plotted but not exposed: {missing:?}");
}

/// The series names an exposition declares, with or without samples yet:
/// each `# TYPE` line's name (`_total` added to a counter's).
fn exposed(text: &str) -> BTreeSet<String> {
    let mut out = names(text);
    for line in text.lines() {
        let mut words = line.split(' ').skip(2);
        if !line.starts_with("# TYPE ") {
            continue;
        }
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            continue;
        };
        out.insert(match kind {
            "counter" => format!("{name}_total"),
            _ => name.to_string(),
        });
    }
    out
}

/// The `fatpipe_…` metric names in `text` (the series' names, so counter
/// samples keep their `_total`).
fn names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("fatpipe_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let preceded = rest[..i]
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if !preceded {
            out.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    out
}

fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn sigterm_ends_a_running_test_with_a_reason_and_exits_0() {
    let dir = setup();
    let (mut srv, port, maddr) = server_with_metrics(&dir, &[]);
    let client = dir
        .cmd()
        .args([
            "test",
            &format!("127.0.0.1:{port}"),
            "--no-auto",
            "-t",
            "30",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn fatpipe test");
    wait_for(Duration::from_secs(10), "the test to run", || {
        value(&get(&maddr, "/metrics").1, UP) > 0.0
    });
    let t0 = Instant::now();
    assert!(fatpipe_sys::process::kill(
        srv.0.id(),
        fatpipe_sys::process::Signal::Term
    ));
    let out = client.wait_with_output().expect("wait for the test");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("shutting down"),
        "the client is told why: {err}"
    );
    let status = wait_exit(&mut srv, Duration::from_secs(10));
    assert_eq!(status, Some(0), "the server exits 0");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    // Nothing listens any more.
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
}

/// A copy the server is receiving when it gets SIGTERM: the server exits 0
/// after its drain time, the chunks written so far are journaled, and the
/// client's retries finish the file against a new server from there.
#[test]
fn sigterm_during_a_copy_exits_0_and_the_copy_resumes_from_its_journal() {
    let dir = setup();
    crate::util::write_key(dir.path().join("key"), "copy-sigterm-key-1\n");
    let src = dir.path().join("f.bin");
    random_file(&src, 64 << 20, 11);
    let exp = dir.path().join("export");
    std::fs::create_dir(&exp).unwrap();
    let export = format!("data={}", exp.display());
    let server = |port: u16| {
        let mut cmd = dir.cmd();
        cmd.args([
            "server",
            "--bind",
            "127.0.0.1",
            "--quiet",
            "--key-file",
            "key",
        ])
        .args(["--port", &port.to_string(), "--export", &export])
        .args(["--drain-timeout", "0.3s"]);
        spawn_server(cmd)
    };
    let (mut srv, port) = server(0);
    // Slow enough (10 MB/s: 6.4 s for the file) that the signal lands
    // mid-file.
    let client = dir
        .cmd()
        .args([
            "copy",
            "--key-file",
            "key",
            "-p",
            &port.to_string(),
            "--json",
        ])
        .args(["--chunk-size", "1M", "--bwlimit", "80M", "--retries", "20"])
        .arg(&src)
        .arg("127.0.0.1:data/f.bin")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn fatpipe copy");
    wait_for(Duration::from_secs(20), "a journal", || {
        journal_has_records(&exp)
    });
    let t0 = Instant::now();
    assert!(fatpipe_sys::process::kill(
        srv.0.id(),
        fatpipe_sys::process::Signal::Term
    ));
    assert_eq!(wait_exit(&mut srv, Duration::from_secs(10)), Some(0));
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(!exp.join("f.bin").exists(), "the copy was cut short");
    assert!(journal_has_records(&exp), "the journal outlived the server");
    let (_srv2, _) = server(port);
    let out = client.wait_with_output().expect("wait for the copy");
    assert_exit(&out, 0);
    let j = json(&out);
    assert!(j["reconnects"].as_u64().unwrap_or(0) >= 1, "{j}");
    assert_eq!(
        std::fs::read(&src).unwrap(),
        std::fs::read(exp.join("f.bin")).expect("the copied file")
    );
}

#[test]
fn sigint_stops_an_idle_server_at_once_with_exit_0() {
    let dir = setup();
    let mut cmd = dir.cmd();
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0", "--quiet"]);
    // The signal handler is installed before the first line: SIGINT at
    // once must drain, not kill.
    let (mut srv, _port) = spawn_server(cmd);
    let t0 = Instant::now();
    // SIGINT through the shell's kill, as a terminal's Ctrl-C would send.
    let killed = Command::new("kill")
        .args(["-INT", &srv.0.id().to_string()])
        .status()
        .expect("run kill");
    assert!(killed.success());
    assert_eq!(wait_exit(&mut srv, Duration::from_secs(5)), Some(0));
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
}

/// Waits up to `limit` for the guarded process to exit; its exit code.
fn wait_exit(g: &mut Guard, limit: Duration) -> Option<i32> {
    if !crate::util::exits_within(g.0.id(), limit) {
        return None;
    }
    g.0.wait().ok().and_then(|s| s.code())
}

/// True if `tool` runs here; otherwise says why the check is skipped (a
/// failure in CI, where ./test.sh installs every tool).
fn have(tool: &str, what: &str) -> bool {
    let ok = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        crate::util::skip(&format!(
            "{what}: {tool} is not installed (./test.sh installs it)"
        ));
    }
    ok
}

#[test]
fn completions_are_valid_scripts_for_each_shell() {
    let dir = setup();
    for (shell, check) in [
        ("bash", &["-n"][..]),
        ("zsh", &["-n"][..]),
        ("fish", &["--no-execute"][..]),
    ] {
        let out = run(dir.cmd().args(["completions", shell]));
        assert_exit(&out, 0);
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(
            script.contains("server") && script.contains("metrics"),
            "{shell}: the subcommands and their flags are there"
        );
        if !have(shell, &format!("checking the {shell} script's syntax")) {
            continue;
        }
        let path = dir.path().join(format!("fatpipe.{shell}"));
        std::fs::write(&path, &out.stdout).unwrap();
        let checked = Command::new(shell)
            .args(check)
            .arg(&path)
            .output()
            .expect("run the shell");
        assert!(
            checked.status.success() && checked.stderr.is_empty(),
            "{shell} rejects its completions: {}",
            String::from_utf8_lossy(&checked.stderr)
        );
    }
    let out = run(dir.cmd().args(["completions", "tcsh"]));
    assert_exit(&out, 2);
}

#[test]
fn man_pages_render_without_warnings() {
    let dir = setup();
    let out = run(dir.cmd().arg("man"));
    assert_exit(&out, 0);
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(page.contains(".TH fatpipe 1"), "{page}");
    let out = run(dir.cmd().args(["man", "--dir", "pages"]));
    assert_exit(&out, 0);
    let pages = dir.path().join("pages");
    let server = std::fs::read_to_string(pages.join("fatpipe-server.1")).expect("server page");
    assert!(server.contains("metrics"), "{server}");
    assert!(pages.join("fatpipe-test.1").exists());
    assert!(pages.join("fatpipe-lab-up.1").exists());
    if !have("groff", "rendering the manual pages") {
        return;
    }
    for entry in std::fs::read_dir(&pages).unwrap() {
        let path = entry.unwrap().path();
        let out = Command::new("groff")
            .args(["-k", "-man", "-Tutf8", "-ww", "-z"])
            .arg(&path)
            .output()
            .expect("run groff");
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn systemd_units_pass_systemd_analyze_verify() {
    if !have("systemd-analyze", "verifying the systemd units") {
        return;
    }
    let dir = setup();
    let verify = |units: &[&str]| {
        Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .args(units)
            .current_dir(dir.path())
            .output()
            .expect("run systemd-analyze")
    };
    // First a unit that must pass: if even it fails, this machine cannot
    // run the check (no systemd to ask), and that is not the units' fault.
    std::fs::write(
        dir.path().join("canary.service"),
        "[Service]\nExecStart=/bin/true\n",
    )
    .unwrap();
    let canary = verify(&["./canary.service"]);
    if !canary.status.success() {
        crate::util::skip(&format!(
            "the systemd unit check: systemd-analyze cannot run here: {}",
            String::from_utf8_lossy(&canary.stderr)
        ));
        return;
    }
    // The units as shipped, pointing at the binary under test; the
    // template as an instance, which is how systemd loads it.
    let src = repo().join("contrib/systemd");
    let exe = bin();
    for (from, to) in [
        ("fatpipe-server.service", "fatpipe-server.service"),
        ("fatpipe-test@.service", "fatpipe-test@dtn2.service"),
        ("fatpipe-test@.timer", "fatpipe-test@dtn2.timer"),
    ] {
        let text = std::fs::read_to_string(src.join(from)).expect("read a unit");
        assert!(text.contains("/usr/bin/fatpipe ") || from.ends_with(".timer"));
        let text = text.replace("/usr/bin/fatpipe ", &format!("{} ", exe.to_string_lossy()));
        std::fs::write(dir.path().join(to), text).unwrap();
    }
    let out = verify(&[
        "./fatpipe-server.service",
        "./fatpipe-test@dtn2.service",
        "./fatpipe-test@dtn2.timer",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    // verify exits 0 on unknown keys and bad values ("ignoring"), so its
    // words about our units fail the test too.
    let ours: Vec<&str> = err.lines().filter(|l| l.contains("fatpipe")).collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify: {err}"
    );
    // The scheduled run tests and archives; the server drains on SIGTERM.
    let test_unit = std::fs::read_to_string(src.join("fatpipe-test@.service")).unwrap();
    assert!(test_unit.contains("fatpipe test %I") && test_unit.contains("--archive"));
    // The server's settings are the packaged file's (docs/config.md).
    let server_unit = std::fs::read_to_string(src.join("fatpipe-server.service")).unwrap();
    assert!(
        server_unit
            .contains("\nExecStart=/usr/bin/fatpipe server --config /etc/fatpipe/server.toml\n"),
        "{server_unit}"
    );
}
