//! `fatpipe copy` over an emulated long fat link (root): the copy tests of
//! `copy.rs` run on loopback, where auto-tuning, slow start and loss never
//! show; here the client runs in lab end `a`, the server in end `b`, across
//! 1 Gbit/s × 50 ms with 0.01 % loss, with no tuning flags.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use fatpipe_lab::{End, LinkSpec};

use crate::util::{self, assert_exit, assert_same_tree, json, mkdir, random_file, wait_for};

/// Lowest goodput (Gbit/s, after the probe) accepted for the ~200 MiB tree,
/// slow start and small files included; the link's ceiling is ~0.94.
/// Measured on the shared 2-core machine at load 8-9: 0.65-0.66 pushing,
/// 0.45-0.65 pulling; the bound leaves a third below the worst of those.
/// A guard against collapse (stalls, a copy path gone slow), not a speed
/// target: on a BDP this small untuned copies reach it too (4 streams
/// ~0.5, one stream ~0.32); that auto-tuning ran is checked in the JSON.
const MIN_GBPS: f64 = 0.3;

/// One big file and a few hundred small ones (4-60 KiB), ~200 MiB.
fn make_tree(root: &Path) -> u64 {
    let t = mkdir(root);
    random_file(&t.join("big.bin"), 190 << 20, 11);
    let mut bytes = 190 << 20;
    for i in 0..300u64 {
        let d = mkdir(&t.join(format!("small/d{}", i / 50)));
        let len = 4096 + (i * 7919) % (56 << 10);
        random_file(&d.join(format!("f{i:03}")), len, 100 + i);
        bytes += len;
    }
    bytes
}

/// Runs a copy, checks it succeeded with auto-tuning applied, and returns
/// its JSON with its goodput in Gbit/s: bytes moved over the run's seconds
/// after the pre-flight probe (a fixed ~1.2 s that would otherwise weigh
/// more than the data on a tree this small).
fn tuned_copy(what: &str, cmd: &mut Command) -> (serde_json::Value, f64) {
    let out: Output = util::run(cmd);
    assert_exit(&out, 0);
    let j = json(&out);
    assert_eq!(j["files_failed"], 0, "{what}: {j}");
    let auto = &j["auto"];
    assert!(
        auto.is_object(),
        "{what}: no auto-tuning in the report:\n{j}"
    );
    assert_eq!(j["streams"], auto["streams"], "{what}: plan not applied");
    let bytes = j["bytes_transferred"].as_u64().unwrap_or(0) as f64;
    let secs = j["seconds"].as_f64().unwrap_or(f64::INFINITY);
    let probe = auto["probe_secs"].as_f64().unwrap_or(0.0);
    let gbps = bytes * 8.0 / (secs - probe).max(1e-3) / 1e9;
    eprintln!(
        "{what}: {bytes} bytes in {secs:.2} s ({probe:.2} s probe) = {:.3} Gbit/s overall, {gbps:.3} after the probe; {} streams; {}",
        bytes * 8.0 / secs / 1e9,
        j["streams"],
        auto["plan"]["reason"]
    );
    (j, gbps)
}

#[test]
fn lab_copy_push_pull_and_resume_over_a_long_fat_link() {
    if !util::need_root("lab_copy_push_pull_and_resume_over_a_long_fat_link") {
        return;
    }
    let started = Instant::now();
    let dir = util::setup();
    let src = dir.path().join("src");
    let total = make_tree(&src);
    let exp = mkdir(&dir.path().join("export"));

    // The PID makes the name unique among concurrent runs (11 characters at most).
    let name = format!("bnc{}", std::process::id());
    let spec = LinkSpec {
        loss: 1e-4,
        seed: 7,
        ..LinkSpec::new(Duration::from_millis(50), 1_000_000_000)
    };
    let export = format!("data={}:public", exp.display());
    let (lab, _srv, _, port) = util::lab_with_server(&name, &spec, &["--export", &export]);
    let b = lab.addr(End::B).to_string();

    // Push the tree with no flags.
    let (j, push) = tuned_copy(
        "push",
        util::lab_copy(&lab, port, &["-r", "--json"])
            .arg(&src)
            .arg(format!("{b}:data/")),
    );
    assert_eq!(j["bytes_transferred"].as_u64(), Some(total));
    assert_eq!(j["files_verified"].as_u64(), Some(301));
    assert_same_tree(&src, &exp.join("src"));
    assert!(
        push >= MIN_GBPS,
        "push: {push:.3} Gbit/s < {MIN_GBPS} over 1 Gbit/s x 50 ms"
    );

    // Pull it back.
    let back = dir.path().join("back");
    let (j, pull) = tuned_copy(
        "pull",
        util::lab_copy(&lab, port, &["-r", "--json", &format!("{b}:data/src/")]).arg(&back),
    );
    assert_eq!(j["bytes_transferred"].as_u64(), Some(total));
    assert_same_tree(&src, &back);
    assert!(
        pull >= MIN_GBPS,
        "pull: {pull:.3} Gbit/s < {MIN_GBPS} over 1 Gbit/s x 50 ms"
    );

    // A larger file, its push killed (SIGKILL) mid-transfer, then re-run: it
    // resumes from the journal and sends less the second time.
    let big = mkdir(&dir.path().join("big"));
    let size: u64 = 512 << 20;
    random_file(&big.join("f.bin"), size, 99);
    let mut first = util::lab_copy(&lab, port, &["-r", "-q"]);
    first
        .arg(&big)
        .arg(format!("{b}:data/"))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // `ip netns exec` execs the client, so this is the client's PID.
    let mut child = first.spawn().expect("spawn copy");
    // Killed once 24 chunks (12-48 MiB) have landed: well before the end
    // (512 MiB, ~4.5 s).
    wait_for(Duration::from_secs(20), "journaled chunks", || {
        util::journal_records(&exp.join("big")) >= 24
    });
    child.kill().expect("SIGKILL the client");
    let status = child.wait().expect("reap the client");
    assert!(
        !status.success(),
        "the first push ended before it was killed; nothing to resume"
    );
    assert!(
        !exp.join("big/f.bin").exists(),
        "a partial file is under its final name"
    );

    let (j, _) = tuned_copy(
        "resumed push",
        util::lab_copy(&lab, port, &["-r", "--json"])
            .arg(&big)
            .arg(format!("{b}:data/")),
    );
    let moved = j["bytes_transferred"].as_u64().unwrap_or(u64::MAX);
    assert!(
        moved < size,
        "the re-run sent {moved} of {size} bytes: it did not resume"
    );
    assert!(
        moved > 0,
        "the re-run sent nothing, yet the first was killed"
    );
    assert_same_tree(&big, &exp.join("big"));

    drop(_srv);
    lab.down().expect("lab down");
    eprintln!(
        "lab_copy: push {push:.3}, pull {pull:.3} Gbit/s; the resumed push sent {moved} of {size} bytes; {:.1?} in all",
        started.elapsed()
    );
}

/// Issue 18: a 256 MiB push with no flags over a clean 1 Gbit/s × 228 ms
/// lab link (Ethernet framing) finishes within a bound derived from the
/// path, and its JSON timeline puts the steps in their order.
///
/// The bound is the slow-start model of `fatpipe_tune::ramp` (the streams
/// the copy used, each from Linux's 10-segment initial window, doubling
/// each round trip until they fill the link's TCP goodput ceiling) over an
/// efficiency for a shared 2-core host (the forwarder and both ends on the
/// same cores: measured 0.91 of the ceiling at load 9), plus its tail
/// (`ramp::tail_secs`: the streams running out of whole chunks one by one
/// at the end), plus the round
/// trips the protocol spends that the model does not: the pre-flight
/// (engine connect 3, echoes and the first train 1, a second and third
/// round of trains when the first disagree 2 each, the collect 1: 9),
/// the request and its `Accept` (1), the last chunk's arrival, check and
/// `Done` (2), and two for scheduling on a loaded host.
#[test]
fn lab_copy_of_256mib_at_228ms_finishes_within_the_path_bound() {
    if !util::need_root("lab_copy_of_256mib_at_228ms_finishes_within_the_path_bound") {
        return;
    }
    const SETUP_RTTS: f64 = 9.0 + 1.0 + 2.0 + 2.0;
    const HOST_EFFICIENCY: f64 = 0.8;
    let dir = util::setup();
    let src = mkdir(&dir.path().join("src"));
    let size: u64 = 256 << 20;
    random_file(&src.join("f.bin"), size, 18);
    let exp = mkdir(&dir.path().join("export"));
    let name = format!("bnd{}", std::process::id() % 100_000_000);
    let rtt = Duration::from_millis(228);
    let spec = LinkSpec {
        seed: 18,
        ..LinkSpec::new(rtt, 1_000_000_000)
    };
    let export = format!("data={}:public", exp.display());
    let (lab, _srv, _, port) = util::lab_with_server(&name, &spec, &["--export", &export]);
    let b = lab.addr(End::B).to_string();
    let started = Instant::now();
    let out = util::run(
        util::lab_copy(&lab, port, &["--json"])
            .arg(src.join("f.bin"))
            .arg(format!("{b}:data/")),
    );
    let wall = started.elapsed().as_secs_f64();
    drop(_srv);
    lab.down().expect("lab down");
    assert_exit(&out, 0);
    let j = json(&out);
    assert_eq!(j["files_verified"], 1, "{j}");
    assert_same_tree(&src, &exp);

    let ceiling = spec
        .tcp_goodput_ceiling(fatpipe_lab::Dir::AtoB)
        .expect("a rate");
    let streams = j["streams"].as_u64().unwrap_or(1) as u32;
    let model = fatpipe_tune::ramp::SlowStart::linux(ceiling, rtt, streams, 1448);
    let chunk = j["chunk_size"].as_u64().unwrap_or(0);
    let tail = fatpipe_tune::ramp::tail_secs(chunk, streams, ceiling);
    let bound =
        SETUP_RTTS * rtt.as_secs_f64() + (model.transfer_secs(size) + tail) / HOST_EFFICIENCY;
    let t = &j["timeline"];
    let at = |k: &str| t[k].as_f64().unwrap_or(f64::NAN);
    eprintln!(
        "lab_copy_256mib_228ms: {wall:.2} s (bound {bound:.2} s; slow start alone {:.2} s, \
         {} RTTs, {streams} streams, tail {tail:.2} s); timeline {t}",
        model.transfer_secs(size),
        model.round_trips()
    );
    assert!(
        wall <= bound,
        "{wall:.2} s > {bound:.2} s for 256 MiB over 1 Gbit/s x 228 ms; timeline {t}"
    );
    // The timeline's steps in their order, all within the command.
    let steps = [
        "connected_at",
        "request_at",
        "accepted_at",
        "first_byte_sent_at",
        "first_stream_idle_at",
        "last_byte_at",
        "done_at",
    ];
    let mut last = 0.0;
    for k in steps {
        let v = at(k);
        assert!(v >= last, "{k} = {v} before {last}: {t}");
        last = v;
    }
    assert!(at("plan_at") <= at("request_at") + 1e-3, "{t}");
    assert!(last <= at("wall_secs") && at("wall_secs") <= wall, "{t}");
    assert!(t["first_byte_on_disk_at"].is_null(), "a push: {t}");
    // 256 MiB is mostly start-up at 228 ms (its second half still ramps),
    // so the final rate is only checked against the link: never above.
    let rate = t["final_rate"].as_f64().unwrap_or(f64::NAN);
    assert!(
        rate > 0.0 && rate <= 1.02 * ceiling,
        "final rate {rate} against the ceiling {ceiling}: {t}"
    );
}
