//! `fatpipe test --rfc6349`: RFC 6349 metrics after a throughput test.
//!
//! On loopback the tests check the contract (the `end.rfc6349` object is
//! there with sane figures, absent without the flag, the text block is
//! printed, a lower-bound rate leaves the ratio out with a reason, and
//! `--no-auto` still probes). The lab test checks the figures mean what
//! the RFC says on a 1 Gbit/s × 40 ms link, clean and then with 1 % loss.

use std::process::Output;
use std::time::Duration;

use fatpipe_lab::{End, Lab, LinkChange, LinkSpec};
use fatpipe_schema::test::{Direction, Rfc6349, TestReport};

use crate::util::{self, assert_exit, run, setup, spawn_server};

fn report(out: &Output) -> TestReport {
    assert_exit(out, 0);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "report does not parse: {e}\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Checks what holds on any path, and returns the object.
fn sane(r: &TestReport) -> &Rfc6349 {
    let m = r.end.rfc6349.as_ref().expect("end.rfc6349 with --rfc6349");
    let sum = &r.end.sums[0];
    assert_eq!(m.direction, Direction::Up);
    assert_eq!((m.bytes, m.bytes_sent), (sum.bytes, sum.bytes_sent));
    assert_eq!(m.seconds, sum.seconds);
    assert!(m.bytes > 0 && m.actual_bps > 0.0, "{m:?}");
    assert_eq!(m.mss, r.start.local[0].mss);
    let eff = m.tcp_efficiency_percent.expect("efficiency");
    assert!(eff > 0.0 && eff <= 100.0, "efficiency {eff}");
    assert_eq!(m.retransmitted_bytes, m.retransmits * u64::from(m.mss));
    assert!(m.baseline_rtt_us.is_some(), "{m:?}");
    assert!(m.avg_rtt_us.is_some_and(|a| a > 0), "{m:?}");
    assert!(m.buffer_delay_percent.is_some(), "{m:?}");
    if m.bottleneck_lower_bound || m.bottleneck_bps.is_none() {
        // No made-up ideal: left out, and said why.
        assert_eq!((m.transfer_time_ratio, m.ideal_seconds), (None, None));
        assert!(
            m.unavailable
                .iter()
                .any(|u| u.starts_with("transfer_time_ratio: ")),
            "{m:?}"
        );
    } else {
        let ratio = m.transfer_time_ratio.expect("ratio from a measured rate");
        assert!(ratio > 0.0, "{m:?}");
        let ideal = m.ideal_seconds.expect("ideal time");
        assert!((ratio * ideal - m.seconds).abs() < 1e-6, "{m:?}");
        assert!(m.unavailable.is_empty(), "{m:?}");
    }
    m
}

#[test]
fn rfc6349_on_loopback_with_and_without_auto() {
    let dir = setup();
    let mut cmd = dir.cmd();
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0", "--quiet"]);
    let (_srv, port) = spawn_server(cmd);
    let host = format!("127.0.0.1:{port}");

    // Auto-tuned: the pre-flight's probe is the baseline.
    let r = report(&run(dir.cmd().args([
        "test",
        &host,
        "-t",
        "1",
        "--json",
        "--rfc6349",
    ])));
    let m = sane(&r);
    let auto = r.start.auto.as_ref().expect("start.auto");
    assert_eq!(
        m.baseline_rtt_us,
        Some((auto.facts.rtt_secs * 1e6).round() as u64)
    );
    assert_eq!(m.bottleneck_bps, auto.facts.bottleneck_rate);
    assert!(m.baseline_rtt_us.is_some_and(|b| b < 10_000), "{m:?}");

    // Not auto-tuned: --rfc6349 probes by itself.
    let out = run(dir
        .cmd()
        .args(["test", &host, "-t", "1", "--json", "--rfc6349", "--no-auto"]));
    let r = report(&out);
    assert!(r.start.auto.is_none());
    let m = sane(&r);
    assert!(m.baseline_rtt_us.is_some_and(|b| b < 10_000), "{m:?}");

    // Without the flag: no object at all.
    let out = run(dir.cmd().args(["test", &host, "-t", "0.5", "--json"]));
    assert!(report(&out).end.rfc6349.is_none());
    assert!(!String::from_utf8_lossy(&out.stdout).contains("rfc6349"));

    // Text: the block follows the final table.
    let out = run(dir
        .cmd()
        .args(["test", &host, "-t", "0.5", "--rfc6349", "--no-auto"]));
    assert_exit(&out, 0);
    let text = String::from_utf8_lossy(&out.stdout);
    let block = text
        .split_once("RFC 6349 (client to server):\n")
        .map(|(_, b)| b)
        .unwrap_or_else(|| panic!("no RFC 6349 block in\n{text}"));
    for label in [
        "baseline RTT",
        "actual TCP throughput",
        "TCP efficiency",
        "buffer delay",
    ] {
        assert!(block.contains(label), "{label} missing from\n{block}");
    }
    assert!(
        block.contains("transfer time ratio")
            || block.contains("not computed: transfer_time_ratio"),
        "{block}"
    );

    // UDP has no RFC 6349 view: a usage error.
    let out = run(dir.cmd().args(["test", &host, "-u", "--rfc6349"]));
    assert_exit(&out, 2);
}

fn lab_test(lab: &Lab, host: &str, args: &[&str]) -> TestReport {
    let mut cmd = lab.command(End::A, util::bin());
    cmd.args(["test", host, "--json", "--rfc6349"]).args(args);
    report(&run(&mut cmd))
}

#[test]
fn lab_rfc6349_1gbit_40ms() {
    if !util::need_root("lab_rfc6349_1gbit_40ms") {
        return;
    }
    let spec = LinkSpec {
        seed: 11,
        ..LinkSpec::new(Duration::from_millis(40), 1_000_000_000)
    };
    let (lab, srv, host, _) = util::lab_with_server("rfc-it", &spec, &[]);

    // Clean: slow start included, an auto-tuned 10 s test is close to
    // ideal. On a loaded host the probe's sender may not outrun the link
    // (its rate is then only a lower bound and no ratio is computed): try
    // once more, then check only the contract for that case.
    let mut m = sane(&lab_test(&lab, &host, &["-t", "10"])).clone();
    if m.bottleneck_lower_bound {
        eprintln!("lab_rfc6349_1gbit_40ms: probe sender-limited, once more");
        m = sane(&lab_test(&lab, &host, &["-t", "10"])).clone();
    }
    let base = m.baseline_rtt_us.unwrap_or(0);
    assert!((39_000..45_000).contains(&base), "baseline {base} us");
    let eff = m.tcp_efficiency_percent.unwrap_or(0.0);
    assert!(eff >= 99.0, "clean link efficiency {eff}: {m:?}");
    let ratio = m.transfer_time_ratio.unwrap_or(f64::NAN);
    if m.bottleneck_lower_bound {
        // sane() checked the ratio is left out with the reason.
        eprintln!(
            "lab_rfc6349_1gbit_40ms: probe sender-limited twice (host loaded): ratio not checked"
        );
    } else {
        let bb = m.bottleneck_bps.unwrap_or(0) as f64;
        assert!((0.9e9..1.1e9).contains(&bb), "bottleneck {bb}");
        // The probe's estimate is good to a few percent, so a ratio a
        // little under 1 is the estimate's error, not TCP beating the path.
        assert!((0.95..1.5).contains(&ratio), "ratio {ratio}: {m:?}");
    }

    // 1 % loss: retransmissions, so efficiency falls below 100 %.
    lab.set(&LinkChange {
        loss: Some(0.01),
        ..LinkChange::default()
    })
    .expect("lab set loss");
    let r = lab_test(&lab, &host, &["-t", "4"]);
    let lossy = sane(&r).clone();
    assert!(lossy.retransmits > 0, "{lossy:?}");
    let lossy_eff = lossy.tcp_efficiency_percent.unwrap_or(100.0);
    assert!(lossy_eff < 100.0, "lossy efficiency {lossy_eff}");
    eprintln!(
        "lab_rfc6349_1gbit_40ms: clean ratio {ratio:.3}, efficiency {eff:.3}%, buffer delay {:.1}%, \
         {:.3} of {:.3} Gbit/s; 1% loss: efficiency {lossy_eff:.3}% ({} retransmits), ratio {:?}",
        m.buffer_delay_percent.unwrap_or(f64::NAN),
        m.actual_bps / 1e9,
        m.max_tcp_bps.unwrap_or(f64::NAN) / 1e9,
        lossy.retransmits,
        lossy.transfer_time_ratio,
    );
    drop(srv);
    lab.down().expect("lab down");
}
