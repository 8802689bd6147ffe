//! `fatpipe sweep`, `report` and `archive` end to end: bad experiment
//! files, a sweep killed and resumed, failed runs stored and skipped past,
//! report formats, export → import, `--archive` on `test` — on loopback
//! against a real server, into a real SQLite archive. The lab sweep brings
//! up its own emulated link.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::util::{self, assert_exit, run, setup, spawn_server, Guard};

fn loopback_server(d: &util::Dir) -> (Guard, u16) {
    let mut cmd = d.cmd();
    cmd.args(["server", "--port", "0", "--bind", "127.0.0.1", "--quiet"]);
    spawn_server(cmd)
}

/// Every stored run of the archive as (cell, repetition, ok).
fn stored(d: &util::Dir, archive: &Path) -> Vec<(String, u64, bool)> {
    let out = run(d
        .cmd()
        .args(["archive", "list", "--json", "--archive"])
        .arg(archive));
    assert_exit(&out, 0);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
            (
                v["sweep"]["cell"].as_str().unwrap_or("").to_string(),
                v["sweep"]["repetition"].as_u64().unwrap_or(u64::MAX),
                v["status"] == "ok",
            )
        })
        .collect()
}

#[test]
fn sweep_bad_files_get_one_line_naming_file_line_and_key_and_exit_2() {
    let d = setup();
    let cases = [
        (
            "name = \"b\"\ntarget = \"lab\"\n\n[matrix]\nwindow = [\"64K\", \"1Q\"]\n",
            "bad.toml:5: matrix.window:",
        ),
        (
            "name = \"b\"\ntarget = \"lab\"\ncolour = \"red\"\n",
            "bad.toml:3: colour:",
        ),
        (
            "name = \"b\"\ntarget = \"127.0.0.1:1\"\n[defaults]\nmtu = 9000\n",
            "bad.toml:4: defaults.mtu: is a lab link parameter",
        ),
    ];
    for (text, want) in cases {
        std::fs::write(d.path().join("bad.toml"), text).unwrap();
        let out = run(d.cmd().args(["sweep", "bad.toml", "--archive", "a.sqlite"]));
        assert_exit(&out, 2);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.starts_with(&format!("fatpipe: {want}")), "{err}");
        assert!(
            !d.path().join("a.sqlite").exists(),
            "nothing may happen before the file is right"
        );
    }
    let out = run(d.cmd().args(["sweep", "missing.toml"]));
    assert_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.toml"));
}

#[test]
fn sweep_killed_then_rerun_finishes_without_doing_a_run_twice() {
    let d = setup();
    let (_srv, port) = loopback_server(&d);
    std::fs::write(
        d.path().join("s.toml"),
        format!(
            "name = \"resume\"\ntarget = \"127.0.0.1:{port}\"\nrepetitions = 2\n\
             [defaults]\ntime = \"500ms\"\nauto = false\n\
             [matrix]\nstreams = [1, 2, 3]\n"
        ),
    )
    .unwrap();
    let archive = d.path().join("a.sqlite");
    // First invocation: killed (SIGKILL, by PID) after two runs are stored.
    let mut child = d
        .cmd()
        .args(["sweep", "s.toml", "--archive", "a.sqlite"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sweep");
    let stderr = child.stderr.take().expect("stderr");
    let mut finished = 0;
    for line in BufReader::new(stderr).lines() {
        let line = line.expect("read sweep progress");
        if line.starts_with('[') {
            finished += 1;
            if finished == 2 {
                break;
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let before = stored(&d, &archive);
    assert!(before.len() >= 2 && before.len() < 6, "{before:?}");

    // The same command again: only the missing runs.
    let out = run(d
        .cmd()
        .args(["sweep", "s.toml", "--archive", "a.sqlite", "--json"]));
    assert_exit(&out, 0);
    let doc = util::json(&out);
    assert_eq!(doc["schema"], "fatpipe.sweep");
    assert_eq!(doc["runs_total"], 6);
    assert_eq!(doc["runs_already"].as_u64(), Some(before.len() as u64));
    assert_eq!(doc["runs_done"].as_u64(), Some(6 - before.len() as u64));
    let after = stored(&d, &archive);
    assert_eq!(after.len(), 6, "{after:?}");
    let unique: BTreeSet<(String, u64)> = after.iter().map(|(c, r, _)| (c.clone(), *r)).collect();
    assert_eq!(unique.len(), 6, "a run was done twice: {after:?}");
    assert!(after.iter().all(|r| r.2), "{after:?}");
    assert_eq!(
        &after[..before.len()],
        &before[..],
        "stored runs are kept as they were"
    );

    // A third time: nothing left to do.
    let out = run(d
        .cmd()
        .args(["sweep", "s.toml", "--archive", "a.sqlite", "--json"]));
    assert_exit(&out, 0);
    assert_eq!(util::json(&out)["runs_done"], 0);

    // Dry run of the finished sweep: six runs, none left.
    let out = run(d.cmd().args([
        "sweep",
        "s.toml",
        "--archive",
        "a.sqlite",
        "--dry-run",
        "--json",
    ]));
    assert_exit(&out, 0);
    let plan = util::json(&out);
    assert_eq!(
        (plan["runs_total"].as_u64(), plan["runs_left"].as_u64()),
        (Some(6), Some(0))
    );
    assert_eq!(plan["cells"].as_array().map(Vec::len), Some(3));
}

#[test]
fn sweep_stores_failed_runs_with_their_error_goes_on_and_retries_them() {
    let d = setup();
    let (srv, port) = loopback_server(&d);
    std::fs::write(
        d.path().join("f.toml"),
        format!(
            "name = \"fails\"\ntarget = \"127.0.0.1:{port}\"\nrepetitions = 1\n\
             [defaults]\ntime = \"300ms\"\nauto = false\n\
             [matrix]\nstreams = [1, 2, 3, 4]\n"
        ),
    )
    .unwrap();
    // The server goes away after the first run: the runs after it fail,
    // are stored as failed, and the sweep goes on to the end.
    let mut child = d
        .cmd()
        .args(["sweep", "f.toml", "--archive", "a.sqlite"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sweep");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut srv = Some(srv);
    let mut progress = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("read progress");
        if line.starts_with("[1/4]") {
            drop(srv.take());
        }
        progress.push(line);
    }
    let status = child.wait().expect("wait for sweep");
    assert_eq!(status.code(), Some(1), "{progress:?}");
    let text = progress.join("\n");
    assert!(
        text.contains("FAILED: ") && text.contains("runs failed"),
        "{text}"
    );
    let runs = stored(&d, &d.path().join("a.sqlite"));
    assert_eq!(runs.len(), 4, "{runs:?}");
    let failed = runs.iter().filter(|r| !r.2).count();
    assert!(failed >= 2, "{runs:?}");
    let list = run(d
        .cmd()
        .args(["archive", "list", "--failed", "--archive", "a.sqlite"]));
    assert_exit(&list, 0);
    let listed = String::from_utf8_lossy(&list.stdout);
    assert!(
        listed.contains("failed: ") && listed.contains("refused"),
        "{listed}"
    );

    // With the server back on its port, the same command redoes only the
    // failed runs.
    let mut cmd = d.cmd();
    cmd.args([
        "server",
        "--bind",
        "127.0.0.1",
        "--quiet",
        "--port",
        &port.to_string(),
    ]);
    let (_srv2, _) = spawn_server(cmd);
    let out = run(d
        .cmd()
        .args(["sweep", "f.toml", "--archive", "a.sqlite", "--json"]));
    assert_exit(&out, 0);
    assert_eq!(util::json(&out)["runs_done"].as_u64(), Some(failed as u64));
    let ok: BTreeSet<String> = stored(&d, &d.path().join("a.sqlite"))
        .into_iter()
        .filter(|r| r.2)
        .map(|r| r.0)
        .collect();
    assert_eq!(ok.len(), 4, "every cell has its successful run now");
}

#[test]
fn report_formats_and_export_import_round_trip() {
    let d = setup();
    let (_srv, port) = loopback_server(&d);
    std::fs::write(
        d.path().join("r.toml"),
        format!(
            "name = \"rep\"\ntitle = \"windows\"\ntarget = \"127.0.0.1:{port}\"\nrepetitions = 2\n\
             [defaults]\ntime = \"300ms\"\nauto = false\n\
             [matrix]\nwindow = [\"1M\", \"128K\"]\nstreams = [1, 2]\n\
             [report]\nrows = \"window\"\ncolumns = \"streams\"\n\
             [[seed_figure]]\ncell = {{ window = \"1M\" }}\nmetric = \"throughput\"\nstat = \"p90\"\n\
             value = \"1G\"\nsource = \"made up for the test\"\n"
        ),
    )
    .unwrap();
    let out = run(d.cmd().args(["sweep", "r.toml", "--archive", "a.sqlite"]));
    assert_exit(&out, 0);
    // A test stored with --archive joins the same archive.
    let t = run(d
        .cmd()
        .args([
            "test",
            &format!("127.0.0.1:{port}"),
            "-t",
            "300ms",
            "--no-auto",
        ])
        .arg("--archive=a.sqlite"));
    assert_exit(&t, 0);

    let out = run(d.cmd().args([
        "report",
        "r.toml",
        "--archive",
        "a.sqlite",
        "--format",
        "json",
    ]));
    assert_exit(&out, 0);
    let doc = util::json(&out);
    assert_eq!(doc["schema"], "fatpipe.report");
    let tables = doc["tables"].as_array().expect("tables");
    // The grid, the seed's figures beside ours, the per-cell statistics.
    assert_eq!(tables.len(), 3, "{doc}");
    assert_eq!(
        tables[0]["header"],
        serde_json::json!(["window", "streams=1", "streams=2"])
    );
    assert_eq!(tables[0]["rows"][0][0], "128K", "sorted by size, not text");
    assert!(tables[0]["values"][1][1].as_f64().unwrap_or(0.0) > 1e8);
    assert_eq!(
        tables[1]["rows"][0][5], "4",
        "the seed figure pools 2 cells × 2 runs"
    );
    assert_eq!(tables[2]["rows"].as_array().map(Vec::len), Some(4));
    assert!(doc["heading"].as_str().unwrap_or("").contains("8 runs"));

    let csv = run(d.cmd().args([
        "report",
        "r.toml",
        "--archive",
        "a.sqlite",
        "--format",
        "csv",
    ]));
    assert_exit(&csv, 0);
    let csv = String::from_utf8_lossy(&csv.stdout);
    assert!(
        csv.starts_with("table,window,streams=1,streams=2\r\n"),
        "{csv}"
    );
    let md = run(d
        .cmd()
        .args([
            "report",
            "--archive",
            "a.sqlite",
            "--sweep",
            "rep",
            "--rows",
            "streams",
        ])
        .args(["--format", "markdown", "--stat", "n"]));
    assert_exit(&md, 0);
    let md = String::from_utf8_lossy(&md.stdout);
    assert!(md.contains("| streams | throughput (n) |"), "{md}");
    assert!(md.contains("| 1 | 4 |"), "{md}");
    assert!(md.contains("pooled over window"), "{md}");

    // Export all nine runs and an annotation; import twice into another
    // archive: everything once.
    let note = run(d.cmd().args([
        "archive",
        "annotate",
        "lab:x",
        "upgraded",
        "--archive",
        "a.sqlite",
    ]));
    assert_exit(&note, 0);
    let exp = run(d.cmd().args([
        "archive",
        "export",
        "-o",
        "e.jsonl",
        "--archive",
        "a.sqlite",
    ]));
    assert_exit(&exp, 0);
    for (added, present) in [(9, 0), (0, 9)] {
        let imp = run(d
            .cmd()
            .args(["archive", "import", "e.jsonl", "--archive", "b.sqlite"]));
        assert_exit(&imp, 0);
        let s = String::from_utf8_lossy(&imp.stdout);
        assert!(
            s.contains(&format!("{added} runs added, {present} already there")),
            "{s}"
        );
    }
    assert_eq!(
        stored(&d, &d.path().join("b.sqlite")),
        stored(&d, &d.path().join("a.sqlite"))
    );
    // Bad selections are one line, exit 2.
    for args in [
        vec!["report", "--archive", "a.sqlite", "--format", "pdf"],
        vec!["report", "--archive", "a.sqlite", "--sweep", "none"],
        vec![
            "report",
            "--archive",
            "a.sqlite",
            "--before",
            "no such note",
        ],
        vec![
            "archive",
            "list",
            "--archive",
            "a.sqlite",
            "--since",
            "soon",
        ],
        vec!["archive", "show", "999", "--archive", "a.sqlite"],
    ] {
        let out = run(d.cmd().args(&args));
        assert_exit(&out, 2);
        assert_eq!(
            String::from_utf8_lossy(&out.stderr).lines().count(),
            1,
            "{args:?}"
        );
    }
}

#[test]
fn sweep_cells_may_be_copies_and_path_probes() {
    let d = setup();
    let export = util::mkdir(&d.path().join("export"));
    let mut cmd = d.cmd();
    cmd.args([
        "server",
        "--port",
        "0",
        "--bind",
        "127.0.0.1",
        "--quiet",
        "--export",
    ])
    .arg(format!("in={}:public", export.display()));
    let (_srv, port) = spawn_server(cmd);
    std::fs::write(
        d.path().join("c.toml"),
        format!(
            "name = \"mixed\"\ntarget = \"127.0.0.1:{port}\"\nexport = \"in\"\nrepetitions = 1\n\
             [matrix]\nstep = [{{ command = \"path\" }}, \
             {{ command = \"copy\", size = 3000000, files = 3, auto = false, streams = 2 }}]\n"
        ),
    )
    .unwrap();
    let out = run(d.cmd().args(["sweep", "c.toml", "--archive", "a.sqlite"]));
    assert_exit(&out, 0);
    let list = run(d
        .cmd()
        .args(["archive", "list", "--json", "--archive", "a.sqlite"]));
    let runs: Vec<serde_json::Value> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    let kinds: Vec<&str> = runs.iter().filter_map(|r| r["kind"].as_str()).collect();
    assert_eq!(kinds, vec!["path", "copy"]);
    assert_eq!(runs[1]["metrics"]["bytes"], 3_000_000, "{}", runs[1]);
    // The copy arrived whole under the export, in a directory of its own.
    let dirs: Vec<_> = std::fs::read_dir(&export).unwrap().flatten().collect();
    assert_eq!(dirs.len(), 1);
    let total: u64 = std::fs::read_dir(dirs[0].path())
        .unwrap()
        .flatten()
        .map(|f| f.metadata().unwrap().len())
        .sum();
    assert_eq!(total, 3_000_000);
}

#[test]
fn test_with_the_archive_variable_stores_its_run_and_its_failure() {
    let d = setup();
    let (_srv, port) = loopback_server(&d);
    let archive = d.path().join("env.sqlite");
    let ok = run(d.cmd().env("FATPIPE_ARCHIVE", &archive).args([
        "test",
        &format!("127.0.0.1:{port}"),
        "-t",
        "300ms",
        "--no-auto",
        "--json",
    ]));
    assert_exit(&ok, 0);
    let bad = run(d.cmd().env("FATPIPE_ARCHIVE", &archive).args([
        "test",
        "127.0.0.1:1",
        "-t",
        "300ms",
        "--no-auto",
    ]));
    assert_exit(&bad, 1);
    // A usage error measured nothing: not stored.
    let usage =
        run(d
            .cmd()
            .env("FATPIPE_ARCHIVE", &archive)
            .args(["test", "127.0.0.1:1", "-P", "0"]));
    assert_exit(&usage, 2);
    let out = run(d
        .cmd()
        .args(["archive", "list", "--json", "--archive"])
        .arg(&archive));
    assert_exit(&out, 0);
    let runs: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[0]["status"], "ok");
    assert!(runs[0]["metrics"]["throughput_bps"].as_f64().unwrap_or(0.0) > 0.0);
    assert!(runs[0]["path"]
        .as_str()
        .unwrap_or("")
        .ends_with("→127.0.0.1"));
    assert!(runs[0]["host"]["sysctls"]["net.ipv4.tcp_rmem"].is_string());
    assert!(runs[1]["status"]["failed"]
        .as_str()
        .unwrap_or("")
        .contains("127.0.0.1:1"));
}

#[test]
fn lab_sweep_runs_a_small_study_end_to_end() {
    if !util::need_root("lab_sweep_runs_a_small_study_end_to_end") {
        return;
    }
    let d = setup();
    // Two windows × two rates on a 20 ms link, one run each: the small
    // window is window-bound (64 KiB per RTT ≈ 26 Mbit/s), the large one
    // rate-bound; the rate changes between runs on the running link.
    std::fs::write(
        d.path().join("lab.toml"),
        "name = \"labsweep\"\ntarget = \"lab\"\nrepetitions = 1\n\
         [defaults]\nrtt = \"20ms\"\ntime = \"2s\"\nomit = \"1s\"\nauto = false\n\
         [matrix]\nwindow = [\"64K\", \"4M\"]\nrate = [\"50M\", \"100M\"]\n\
         [report]\nrows = \"window\"\ncolumns = \"rate\"\n",
    )
    .unwrap();
    // Labs up before this sweep (another sweep's, on a shared machine) are
    // not this test's to account for.
    let before = lab_names(&d);
    let out = run(d
        .cmd()
        .args(["sweep", "lab.toml", "--archive", "a.sqlite", "--json"]));
    assert_exit(&out, 0);
    let doc = util::json(&out);
    assert_eq!(doc["runs_done"], 4);
    let report = run(d.cmd().args([
        "report",
        "lab.toml",
        "--archive",
        "a.sqlite",
        "--format",
        "json",
    ]));
    assert_exit(&report, 0);
    let r = util::json(&report);
    let grid = &r["tables"][0];
    assert_eq!(
        grid["header"],
        serde_json::json!(["window", "rate=50M", "rate=100M"])
    );
    let v = |row: usize, col: usize| grid["values"][row][col].as_f64().unwrap_or(0.0);
    // 64K: the kernel's window of 64 KiB socket buffer holds about half of
    // it in flight; whatever it is, the same at both rates and far below
    // either.
    let window_bound = 65536.0 * 8.0 / 0.020;
    for col in [1, 2] {
        assert!(v(0, col) < window_bound * 1.1, "64K: {}", v(0, col));
    }
    assert!(
        v(1, 1) > 0.8 * 50e6 && v(1, 1) < 1.02 * 50e6,
        "4M at 50M: {}",
        v(1, 1)
    );
    assert!(
        v(1, 2) > 0.8 * 100e6 && v(1, 2) < 1.02 * 100e6,
        "4M at 100M: {}",
        v(1, 2)
    );
    // Each run carries the link it ran on.
    let list = run(d
        .cmd()
        .args(["archive", "list", "--json", "--archive", "a.sqlite"]));
    let rates: BTreeSet<u64> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["link"]["rate_up"].as_u64())
        .collect();
    assert_eq!(rates, [50_000_000, 100_000_000].into_iter().collect());
    // The sweep removed its labs.
    let mut left: Vec<String> = Vec::new();
    let gone = util::within(Duration::from_secs(5), || {
        left = lab_names(&d)
            .into_iter()
            .filter(|n| n.starts_with("sw") && !before.contains(n))
            .collect();
        left.is_empty()
    });
    assert!(gone, "labs left behind: {left:?}");
}

/// The names of the labs that are up.
fn lab_names(d: &util::Dir) -> Vec<String> {
    let labs = run(d.cmd().args(["lab", "list", "--json"]));
    assert_exit(&labs, 0);
    let v: serde_json::Value = serde_json::from_slice(&labs.stdout).unwrap_or_default();
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["name"].as_str().map(str::to_string))
        .collect()
}
