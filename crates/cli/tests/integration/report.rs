//! `fatpipe report --plot` and `--html` over a fixed archive: each plot
//! kind's content (axis labels, series, the annotation marker), and the
//! HTML report as a person sees it, rendered by a real headless Chromium:
//! no console errors, and the plots' series colours on screen.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use crate::util::{assert_exit, run, setup, Dir};

/// The report's first two series colours (Okabe–Ito blue and orange).
pub(crate) const BLUE: [u8; 3] = [0x00, 0x72, 0xB2];
pub(crate) const ORANGE: [u8; 3] = [0xE6, 0x9F, 0x00];

/// Writes the fixture as an export file and imports it into `a.sqlite`:
/// a window × MTU sweep on a lab link (3 repetitions), and 40 daily runs
/// on another path with a link upgrade noted half-way.
fn archive(dir: &Dir) -> PathBuf {
    let mut lines = vec![json!({"record": "header", "format": "fatpipe.archive", "version": 1})];
    let host = json!({"hostname": "dtn1", "os": "linux", "kernel": "6.1.0", "fatpipe_version": "0.1.0",
                      "cpu_model": "Xeon", "cpu_count": 2, "sysctls": {}, "nics": []});
    let link = json!({"rtt": {"secs": 0, "nanos": 93_000_000}, "rate_up": 1_000_000_000u64,
                      "rate_down": 1_000_000_000u64, "loss": 0.0001, "mtu": 1500});
    let t0 = 1_790_000_000i64;
    let mut n = 0i64;
    let mut push = |path: &str,
                    at: i64,
                    bps: f64,
                    sweep: Option<serde_json::Value>,
                    link: &serde_json::Value| {
        n += 1;
        let start = chrono::DateTime::from_timestamp(at, 0)
            .unwrap()
            .to_rfc3339();
        let end = chrono::DateTime::from_timestamp(at + 10, 0)
            .unwrap()
            .to_rfc3339();
        lines.push(json!({
            "record": "run", "uuid": format!("00000000-0000-4000-8000-{n:012}"), "kind": "test",
            "started": start, "finished": end, "status": "ok", "sweep": sweep, "path": path,
            "peer": null, "host": host, "link": link,
            "metrics": {"throughput_bps": bps, "retransmits": 3, "rtt_min_us": 93000.0,
                        "rtt_avg_us": 94000.0, "rtt_max_us": 96000.0, "rtt_std_us": 500.0}
        }));
    };
    let mut at = t0;
    for rep in 0..3u32 {
        for (i, w) in ["64K", "256K", "1M", "4M", "16M", "64M"].iter().enumerate() {
            for mtu in [1500, 9000] {
                let bps = (2.2e6 * 4f64.powi(i as i32)).min(700e6)
                    * if mtu == 9000 { 1.3 } else { 1.0 }
                    * (1.0 + 0.02 * f64::from(rep));
                let cell = json!({"mtu": mtu, "protocol": "tcp", "window": w}).to_string();
                push(
                    "lab:korea→seattle",
                    at,
                    bps,
                    Some(json!({"sweep": "fixture-000", "cell": cell, "repetition": rep})),
                    &link,
                );
                at += 20;
            }
        }
    }
    for day in 0..40i64 {
        let bps = if day < 20 { 88e6 } else { 190e6 } + (day % 4) as f64 * 1e6;
        push(
            "dtn1→dtn2",
            t0 + day * 86_400,
            bps,
            None,
            &serde_json::Value::Null,
        );
    }
    lines.push(json!({"record": "annotation", "path": "dtn1→dtn2",
                      "at": chrono::DateTime::from_timestamp(t0 + 20 * 86_400 - 3600, 0).unwrap().to_rfc3339(),
                      "note": "link upgraded to 622 Mbit/s"}));
    let file = dir.path().join("fixture.jsonl");
    let text: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    std::fs::write(&file, text.join("\n") + "\n").unwrap();
    let a = dir.path().join("a.sqlite");
    let out = run(dir
        .cmd()
        .args(["archive", "import"])
        .arg(&file)
        .arg("--archive")
        .arg(&a));
    assert_exit(&out, 0);
    a
}

fn report(dir: &Dir, a: &Path, args: &[&str]) -> std::process::Output {
    run(dir.cmd().arg("report").arg("--archive").arg(a).args(args))
}

/// The texts of an SVG's `<text>` elements.
pub(crate) fn texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let body = &t[t.find('>')? + 1..t.find("</text>")?];
            Some(
                body.trim()
                    .replace("&amp;", "&")
                    .replace("&lt;", "<")
                    .replace("&gt;", ">")
                    .replace("&apos;", "'")
                    .replace("&quot;", "\""),
            )
        })
        .collect()
}

pub(crate) fn has(t: &[String], want: &str) -> bool {
    t.iter().any(|x| x == want)
}

#[test]
fn report_draws_each_plot_kind_from_a_fixed_archive() {
    let dir = setup();
    let a = archive(&dir);
    let sweep = ["--sweep", "fixture-000"];

    // Throughput against window: log axis of the swept sizes, a series per
    // MTU in its colour, the path and link in the title block.
    let out = report(
        &dir,
        &a,
        &[
            &sweep[..],
            &["--plot", "window", "--series", "mtu", "--out", "w.svg"],
        ]
        .concat(),
    );
    assert_exit(&out, 0);
    let svg = std::fs::read_to_string(dir.path().join("w.svg")).unwrap();
    let t = texts(&svg);
    for want in [
        "throughput against window, by mtu",
        "window (bytes, log scale)",
        "throughput (median, log scale)",
        "64 KB",
        "64 MB",
        "1 Gbit/s",
        "mtu=1500",
        "mtu=9000",
    ] {
        assert!(has(&t, want), "{want:?} not in {t:?}");
    }
    assert!(
        t.iter()
            .any(|x| x.contains("lab:korea→seattle") && x.contains("1 Gbit/s, 93 ms RTT")),
        "{t:?}"
    );
    for c in [BLUE, ORANGE] {
        assert!(
            svg.contains(&format!("#{:02X}{:02X}{:02X}", c[0], c[1], c[2])),
            "series colour missing"
        );
    }

    // The heat map: window × mtu with the values written in the cells.
    let out = report(
        &dir,
        &a,
        &[
            &sweep[..],
            &[
                "--plot",
                "heatmap",
                "--rows",
                "window",
                "--columns",
                "mtu",
                "--out",
                "h.svg",
            ],
        ]
        .concat(),
    );
    assert_exit(&out, 0);
    let t = texts(&std::fs::read_to_string(dir.path().join("h.svg")).unwrap());
    for want in [
        "throughput, window × mtu",
        "window",
        "mtu",
        "1500",
        "9000",
        "64 MB",
        "714",
    ] {
        assert!(has(&t, want), "{want:?} not in {t:?}");
    }

    // A path's history with its note as a marker.
    let out = report(
        &dir,
        &a,
        &["--path", "dtn1→dtn2", "--plot", "history", "--out", "t.svg"],
    );
    assert_exit(&out, 0);
    let svg = std::fs::read_to_string(dir.path().join("t.svg")).unwrap();
    let t = texts(&svg);
    for want in [
        "throughput over time, with the path's notes",
        "link upgraded to 622 Mbit/s",
        "time (UTC)",
        "throughput (each run, Mbit/s)",
    ] {
        assert!(has(&t, want), "{want:?} not in {t:?}");
    }
    // The note's marker: a dashed line of short black width-2 segments
    // (axes and ticks are width 1).
    let dashes = svg.matches("stroke=\"#000000\" stroke-width=\"2\"").count();
    assert!(
        dashes >= 10,
        "no dashed marker for the note ({dashes} segments)"
    );

    // PNG: a real image of the default size.
    let out = report(
        &dir,
        &a,
        &[&sweep[..], &["--plot", "window", "--out", "w.png"]].concat(),
    );
    assert_exit(&out, 0);
    let (w, h, _) = decode(&dir.path().join("w.png"));
    assert_eq!((w, h), (960, 540));

    // Mistakes: one line, exit 2.
    for (args, says) in [
        (
            &["--plot", "streams", "--out", "x.svg"][..],
            "'streams' is not a parameter of these runs",
        ),
        (
            &["--plot", "window", "--out", "x.pdf"][..],
            "must end in .svg or .png",
        ),
        (
            &["--plot", "heatmap", "--out", "x.svg"][..],
            "needs --rows and --columns",
        ),
    ] {
        let out = report(&dir, &a, &[&sweep[..], args].concat());
        assert_exit(&out, 2);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(says) && err.trim().lines().count() == 1,
            "{err}"
        );
    }
}

/// Decodes a PNG: width, height and RGB pixels.
pub(crate) fn decode(p: &Path) -> (u32, u32, Vec<[u8; 3]>) {
    let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(p).unwrap()));
    let mut reader = dec.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let step = match info.color_type {
        png::ColorType::Rgba => 4,
        png::ColorType::Rgb => 3,
        other => panic!("unexpected PNG colour type {other:?}"),
    };
    let px = buf[..info.buffer_size()]
        .chunks_exact(step)
        .map(|c| [c[0], c[1], c[2]])
        .collect();
    (info.width, info.height, px)
}

pub(crate) fn near(px: &[[u8; 3]], c: [u8; 3]) -> usize {
    px.iter()
        .filter(|p| {
            p.iter()
                .zip(c)
                .all(|(a, b)| (i16::from(*a) - i16::from(b)).abs() <= 12)
        })
        .count()
}

/// Debian's Chromium, or why the test cannot run: in CI it must (./test.sh
/// installs it); elsewhere the test skips and says so.
pub(crate) fn chromium() -> Option<PathBuf> {
    let found = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists());
    if found.is_none() {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("CI must have Debian's chromium (./test.sh installs it)");
        }
        eprintln!("skipping the browser check: no chromium (./test.sh installs Debian's package)");
    }
    found
}

/// Opens `page` in headless Chromium, takes a screenshot; returns its
/// pixels and the page's console messages.
pub(crate) fn screenshot(
    browser: &Path,
    dir: &Dir,
    page: &Path,
    name: &str,
) -> (Vec<[u8; 3]>, Vec<String>) {
    let shot = dir.path().join(format!("{name}.png"));
    let profile = dir.path().join(format!("chromium-{name}"));
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1100,2400",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // To look at them: FATPIPE_TEST_SCREENSHOTS=DIR keeps a copy.
    if let Some(keep) = std::env::var_os("FATPIPE_TEST_SCREENSHOTS") {
        let _ = std::fs::copy(&shot, Path::new(&keep).join(format!("{name}.png")));
    }
    let console = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(str::to_string)
        .collect();
    (decode(&shot).2, console)
}

#[test]
fn report_html_opens_in_chromium_with_its_plots_drawn() {
    let Some(browser) = chromium() else { return };
    let dir = setup();
    let a = archive(&dir);

    // The check can fail: a page that logs an error is caught.
    let bad = dir.path().join("bad.html");
    std::fs::write(
        &bad,
        "<!DOCTYPE html><p>x<script>console.error('planted')</script>",
    )
    .unwrap();
    let (_, console) = screenshot(&browser, &dir, &bad, "control");
    assert!(
        console.iter().any(|l| l.contains("planted")),
        "console check is blind: {console:?}"
    );

    // A sweep's report: the line plot and the heat map.
    let out = report(
        &dir,
        &a,
        &[
            "--sweep",
            "fixture-000",
            "--rows",
            "window",
            "--columns",
            "mtu",
            "--html",
            "sweep.html",
        ],
    );
    assert_exit(&out, 0);
    let page = dir.path().join("sweep.html");
    let html = std::fs::read_to_string(&page).unwrap();
    assert_eq!(html.matches("<svg ").count(), 2, "line plot and heat map");
    let (px, console) = screenshot(&browser, &dir, &page, "sweep");
    assert!(console.is_empty(), "console messages: {console:?}");
    // Pixels of both series' colours: the plot is drawn, not blank.
    let (blue, orange) = (near(&px, BLUE), near(&px, ORANGE));
    assert!(
        blue > 400 && orange > 400,
        "series pixels: blue {blue}, orange {orange}"
    );
    // The heat map's viridis extremes (dark purple, yellow).
    assert!(
        near(&px, [0x44, 0x01, 0x54]) > 2000,
        "no heat map low end on screen"
    );
    assert!(
        near(&px, [0xFD, 0xE7, 0x25]) + near(&px, [0xF1, 0xE5, 0x1D]) > 500,
        "no heat map high end"
    );

    // A path over time: the history with its annotation.
    let out = report(&dir, &a, &["--path", "dtn1→dtn2", "--html", "path.html"]);
    assert_exit(&out, 0);
    let page = dir.path().join("path.html");
    assert!(std::fs::read_to_string(&page)
        .unwrap()
        .contains("link upgraded to 622 Mbit/s"));
    let (px, console) = screenshot(&browser, &dir, &page, "path");
    assert!(console.is_empty(), "console messages: {console:?}");
    assert!(near(&px, BLUE) > 300, "history series not on screen");
    assert!(
        near(&px, [0, 0, 0]) > 500,
        "no dark ink (axes, the note's dashed line)"
    );
}
