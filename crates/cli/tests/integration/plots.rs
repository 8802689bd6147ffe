//! Runs drawn over time from where users are (issue 30): `test --plot`,
//! `copy --plot` and `report --run ID --plot timeseries|cdf`, over
//! loopback, read back as a person would see them: the texts of the SVG
//! (titles, panels, axes with units) and the pixels of the PNG.

use crate::report::{decode, has, near, texts, BLUE};
use crate::util::{assert_exit, json, mkdir, random_file, run, setup, spawn_server};

#[test]
fn test_and_copy_plot_their_run_and_report_draws_runs_by_id() {
    let dir = setup();
    let exp = mkdir(&dir.path().join("export"));
    let (_srv, port) = spawn_server({
        let mut c = dir.cmd();
        c.args(["server", "--port", "0", "--export"])
            .arg(format!("data={}:public", exp.display()));
        c
    });
    let port = port.to_string();
    let a = dir.path().join("a.sqlite");

    // A plot file that cannot be written is refused before the run.
    let out = run(dir.cmd().args([
        "test",
        "127.0.0.1",
        "-p",
        &port,
        "-t",
        "1s",
        "--plot",
        "t.pdf",
    ]));
    assert_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("t.pdf: a plot file must end in .svg or .png")
            && err.trim().lines().count() == 1,
        "{err}"
    );

    // The test: its JSON on stdout as ever, the plot beside it.
    let out = run(dir
        .cmd()
        .args([
            "test",
            "127.0.0.1",
            "-p",
            &port,
            "-t",
            "2s",
            "-P",
            "3",
            "--json",
        ])
        .args(["--plot", "t.svg", "--archive"])
        .arg(&a));
    assert_exit(&out, 0);
    assert_eq!(json(&out)["schema"], "fatpipe.test");
    let svg = std::fs::read_to_string(dir.path().join("t.svg")).expect("test --plot wrote t.svg");
    let t = texts(&svg);
    for want in [
        "fatpipe test to 127.0.0.1 over time",
        "throughput, sum of streams",
        "throughput per stream",
        "RTT per stream",
        "congestion window per stream",
        "retransmits per interval",
        "time since the run started (s)",
        "middle half of the streams",
    ] {
        assert!(has(&t, want), "{want:?} not in {t:?}");
    }
    assert!(
        t.iter()
            .any(|x| x.starts_with("to 127.0.0.1:") && x.contains("TCP, 3 streams")),
        "subtitle: {t:?}"
    );

    // The copy: bytes over time as a PNG.
    let src = mkdir(&dir.path().join("src"));
    random_file(&src.join("f.bin"), 24 << 20, 7);
    let out = run(dir
        .cmd()
        .args(["copy", "-r", "-p", &port, "--plot", "c.png", "--archive"])
        .arg(&a)
        .arg(&src)
        .arg("127.0.0.1:data/"));
    assert_exit(&out, 0);
    let (w, h, px) = decode(&dir.path().join("c.png"));
    assert_eq!((w, h), (960, 540));
    assert!(near(&px, BLUE) > 300, "the copy's line is not drawn");

    // Both again from the archive, by id.
    let report = |args: &[&str]| run(dir.cmd().arg("report").arg("--archive").arg(&a).args(args));
    let out = report(&["--run", "2", "--plot", "timeseries", "--out", "r2.svg"]);
    assert_exit(&out, 0);
    let t = texts(&std::fs::read_to_string(dir.path().join("r2.svg")).unwrap());
    for want in [
        "bytes moved (MB)",
        "time since the command started (s)",
        "first byte",
        "done",
    ] {
        assert!(has(&t, want), "{want:?} not in {t:?}");
    }
    let out = report(&[
        "--run", "1", "--run", "1", "--plot", "cdf", "--out", "cdf.svg",
    ]);
    assert_exit(&out, 0);
    let t = texts(&std::fs::read_to_string(dir.path().join("cdf.svg")).unwrap());
    assert!(has(&t, "fraction at or below"), "{t:?}");
    assert!(
        t.iter()
            .filter(|x| x.starts_with("run 1 (3 streams)"))
            .count()
            == 2,
        "{t:?}"
    );

    // Mistakes: one line, exit 2.
    for (args, says) in [
        (
            &["--run", "9", "--plot", "cdf", "--out", "x.svg"][..],
            "has no run 9",
        ),
        (
            &["--run", "2", "--plot", "cdf", "--out", "x.svg"][..],
            "use --plot timeseries",
        ),
        (
            &[
                "--run",
                "1",
                "--run",
                "2",
                "--plot",
                "timeseries",
                "--out",
                "x.svg",
            ][..],
            "mix tests and copies",
        ),
        (
            &["--plot", "timeseries", "--out", "x.svg"][..],
            "name the runs with --run ID",
        ),
        (&["--run", "1"][..], "--run draws runs over time"),
    ] {
        let out = report(args);
        assert_exit(&out, 2);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(says) && err.trim().lines().count() == 1,
            "{args:?}: {err}"
        );
    }
}
