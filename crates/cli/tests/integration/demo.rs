//! `fatpipe demo`: the README's first command must work end to end.

use crate::report::{chromium, near, screenshot, BLUE, ORANGE};
use crate::util::{assert_exit, need_root, run, setup, Dir};

/// The copy's colour beside two tests: Okabe–Ito's bluish green.
const GREEN: [u8; 3] = [0x00, 0x9E, 0x73];

/// The demo's page in headless Chromium: no console messages, and the
/// default test's, the auto-tuned test's and the copy's colours on screen
/// (the lead plots fill the first screen).
fn lead_on_screen(dir: &Dir, page: &std::path::Path) {
    let Some(browser) = chromium() else { return };
    let (px, console) = screenshot(&browser, dir, page, "demo");
    assert!(console.is_empty(), "console messages: {console:?}");
    for (what, c, least) in [
        ("default settings", BLUE, 400),
        ("auto-tuned", ORANGE, 400),
        ("copy", GREEN, 400),
    ] {
        let n = near(&px, c);
        assert!(n > least, "{what}: {n} pixels of its colour");
    }
}

/// On loopback (any user): test, auto test, copy and report all run.
/// Tests of 2 s: two intervals each, so the page's time series are lines
/// (one interval would be a dot per panel, too few pixels to tell).
#[test]
fn demo_on_loopback_runs_every_step() {
    let dir = setup();
    let out = run(dir.cmd().args([
        "demo",
        "--loopback",
        "-t",
        "2s",
        "--size",
        "8M",
        "--small-files",
        "50",
    ]));
    assert_exit(&out, 0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    for want in [
        "fatpipe demo report",
        "test, default settings",
        "test, fatpipe auto",
        "copy, dataset",
        "51 files",
    ] {
        assert!(stdout.contains(want), "missing {want:?} in:\n{stdout}");
    }
    // Its runs in an archive of its own, its report beside it, and both
    // named in the output.
    let here = dir.path().join(".data/fatpipe/demo");
    let html = here.join("demo-report.html");
    assert!(
        stdout.contains(&format!("report  {}", html.display())),
        "report path missing:\n{stdout}"
    );
    let page = std::fs::read_to_string(&html).expect("the demo's HTML report");
    assert!(page.contains("<svg "), "no plot in the demo's report");
    assert!(page.contains("2 test, auto-tuned"));
    // The story first: both tests over time on one plot, then the copy's
    // progress, before the facts and the tables.
    let at = |s: &str| page.find(s).unwrap_or_else(|| panic!("{s} missing"));
    assert!(at("<figure id=\"lead-2\">") < at("<dl class=\"facts\">"));
    assert!(at("2 tests over time") < at("bytes over time"));
    assert!(page.contains("1 test, default settings (1 stream)"));
    lead_on_screen(&dir, &html);
    let listed = run(dir
        .cmd()
        .args(["archive", "list", "--archive"])
        .arg(here.join("demo.sqlite")));
    assert_exit(&listed, 0);
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.matches("demo").count() >= 3, "{listed}");
}

/// On an emulated long fat link (root): the same steps through the lab, and
/// the lab is gone afterwards.
#[test]
fn demo_on_lab_link_cleans_up() {
    if !need_root("demo_on_lab_link_cleans_up") {
        return;
    }
    let dir = setup();
    let out = run(dir.cmd().args([
        "demo",
        "--rtt",
        "30ms",
        "--rate",
        "500mbit",
        "-t",
        "3s",
        "--size",
        "32M",
        "--small-files",
        "200",
    ]));
    assert_exit(&out, 0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("30.0 ms"),
        "link summary missing:\n{stdout}"
    );
    assert!(stdout.contains("201 files"), "copy line missing:\n{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("removed lab"), "lab not removed:\n{stderr}");
    let name = stderr
        .split("bringing up lab '")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .expect("demo names its lab");
    let netns = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    let listed = String::from_utf8_lossy(&netns.stdout);
    let ours = format!("fp-{name}-");
    assert!(
        !listed.lines().any(|l| l.starts_with(&ours)),
        "lab {name}'s namespaces are left behind:\n{listed}"
    );
}
