//! The in-flight adjuster of an auto-tuned `fatpipe test`.
//!
//! On loopback: the contract — it runs when auto-tuning chose the streams
//! (`start.auto.adjusting`), not with `-P`, and its `--json-stream` lines
//! are well formed. The lab tests check its point on emulated long links:
//! streams capped by their window under loss get more streams and the
//! transfer speeds up; a clean link at its rate is left alone.

use std::time::Duration;

use fatpipe_lab::{End, Lab, LinkSpec};
use fatpipe_schema::test::{TestReport, TestStreamLine};
use fatpipe_schema::tune::Action;

use crate::util::{self, assert_exit, run, setup, spawn_server};

fn report(out: &std::process::Output) -> TestReport {
    assert_exit(out, 0);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "report does not parse: {e}\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[test]
fn adjuster_runs_when_auto_tuning_chose_the_streams() {
    let dir = setup();
    let mut cmd = dir.cmd();
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0", "--quiet"]);
    let (_srv, port) = spawn_server(cmd);
    let host = format!("127.0.0.1:{port}");

    let out = run(dir
        .cmd()
        .args(["test", &host, "-t", "3", "-i", "0.5", "--json-stream"]));
    assert_exit(&out, 0);
    let lines: Vec<TestStreamLine> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let Some(TestStreamLine::Start(start)) = lines.first() else {
        panic!("no start line: {lines:?}");
    };
    let auto = start.auto.as_ref().expect("start.auto");
    assert!(auto.adjusting, "{auto:?}");
    let Some(TestStreamLine::End(end)) = lines.last() else {
        panic!("no end line");
    };
    // Every adjust line is a change, and the streams in the end are those
    // the test started with plus those the changes added.
    let mut streams = start.streams;
    for l in &lines {
        if let TestStreamLine::Adjust(d) = l {
            assert!(d.is_change(), "{d:?}");
            if let Action::AddStreams { n } = d.action {
                streams += n;
                assert_eq!(d.streams, streams);
            }
        }
    }
    assert_eq!(end.streams.len() as u32, streams);
    let stream_sum: u64 = end.streams.iter().map(|s| s.bytes).sum();
    assert_eq!(end.sums[0].bytes, stream_sum);

    // -P fixes the streams: no adjuster.
    let out = run(dir
        .cmd()
        .args(["test", &host, "-t", "1", "-P", "2", "--json"]));
    let r = report(&out);
    let auto = r.start.auto.as_ref().expect("start.auto with -P alone");
    assert!(!auto.adjusting && auto.decisions.is_empty(), "{auto:?}");
    assert_eq!(r.end.streams.len(), 2);
}

/// A lab with its server; `None` when not root.
fn lab_with_server(test: &str, name: &str, spec: &LinkSpec) -> Option<(Lab, util::Guard, String)> {
    if !util::need_root(test) {
        return None;
    }
    let (lab, srv, host, _) = util::lab_with_server(name, spec, &[]);
    Some((lab, srv, host))
}

fn lab_test(lab: &Lab, host: &str, args: &[&str]) -> TestReport {
    let mut cmd = lab.command(End::A, util::bin());
    cmd.args(["test", host, "--json"]).args(args);
    report(&run(&mut cmd))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Receiver goodput (Mbit/s) of the intervals ending in `from..to` seconds.
fn rates(r: &TestReport, from: f64, to: f64) -> Vec<f64> {
    r.intervals
        .iter()
        .filter(|i| i.end_s > from && i.end_s <= to)
        .map(|i| i.sums[0].bits_per_second / 1e6)
        .collect()
}

#[test]
fn lab_adjust_adds_streams_to_window_capped_streams_under_loss() {
    let name = "adj-lossit";
    let spec = LinkSpec {
        loss: 0.001,
        seed: 11,
        ..LinkSpec::new(Duration::from_millis(93), 1_000_000_000)
    };
    let Some((lab, srv, host)) = lab_with_server(
        "lab_adjust_adds_streams_to_window_capped_streams_under_loss",
        name,
        &spec,
    ) else {
        return;
    };
    // 1 MiB buffers (as a host capped at 1 MiB would give) hold each stream
    // far below its share; the planned streams assumed bigger ones.
    let r = lab_test(&lab, &host, &["-t", "25", "-w", "1M"]);
    drop(srv);
    lab.down().expect("lab down");
    let auto = r.start.auto.as_ref().expect("start.auto");
    assert!(auto.adjusting, "{auto:?}");
    let first = auto.decisions.first().unwrap_or_else(|| {
        panic!(
            "no change on window-capped streams; intervals {:?}",
            rates(&r, 0.0, 99.0)
        )
    });
    assert!(
        auto.decisions
            .iter()
            .all(|d| matches!(d.action, Action::AddStreams { .. })),
        "{:?}",
        auto.decisions
    );
    let last = auto.decisions.last().map_or(0, |d| d.streams);
    assert!(last > r.start.streams, "{:?}", auto.decisions);
    assert_eq!(r.end.streams.len() as u32, last);
    for s in &r.end.streams {
        assert!(s.bytes > 0, "stream {:?} moved nothing", s.id);
    }
    // Before the first change against the last 5 s.
    let before = median(rates(&r, 2.0, first.at_secs));
    let after = median(rates(&r, 20.0, 25.0));
    eprintln!(
        "lab_adjust_adds_streams: {} → {last} streams, {before:.0} → {after:.0} Mbit/s; {:?}",
        r.start.streams, auto.decisions
    );
    assert!(
        after > 1.2 * before,
        "{before:.0} → {after:.0} Mbit/s after {:?}",
        auto.decisions
    );
}

#[test]
fn lab_adjust_leaves_a_clean_link_at_rate_alone() {
    let name = "adj-clean";
    let spec = LinkSpec {
        seed: 12,
        ..LinkSpec::new(Duration::from_millis(93), 1_000_000_000)
    };
    let Some((lab, srv, host)) =
        lab_with_server("lab_adjust_leaves_a_clean_link_at_rate_alone", name, &spec)
    else {
        return;
    };
    let r = lab_test(&lab, &host, &["-t", "20"]);
    drop(srv);
    lab.down().expect("lab down");
    let auto = r.start.auto.as_ref().expect("start.auto");
    assert!(auto.adjusting, "{auto:?}");
    let steady = median(rates(&r, 4.0, 20.0));
    eprintln!(
        "lab_adjust_leaves_a_clean_link: {} streams, {steady:.0} Mbit/s; {:?}",
        r.start.streams, auto.decisions
    );
    // 88 % of what TCP can carry through the framed link (941.5 Mbit/s).
    let ceiling = spec
        .tcp_goodput_ceiling(fatpipe_lab::Dir::AtoB)
        .unwrap_or(0.0)
        / 1e6;
    assert!(
        steady > 0.88 * ceiling,
        "not at rate ({ceiling:.0} Mbit/s): {:?}",
        rates(&r, 0.0, 99.0)
    );
    // No streams added. A BBR plan (set buffers, so the windows are held)
    // hands the clean transfer to CUBIC once: cruising, and only that.
    let want: Vec<Action> = if auto.congestion.as_deref() == Some("bbr") && auto.buffer.is_some() {
        vec![Action::SwitchCongestion { to: "cubic".into() }]
    } else {
        Vec::new()
    };
    let got: Vec<Action> = auto.decisions.iter().map(|d| d.action.clone()).collect();
    assert_eq!(got, want, "{:?}", auto.decisions);
    assert_eq!(r.end.streams.len() as u32, r.start.streams);
}
