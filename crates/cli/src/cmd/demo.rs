//! `fatpipe demo`: the main job on a fresh machine, in one command.
//!
//! It brings up a lab link shaped like the CERN–New York path (93 ms RTT,
//! 1 Gbit/s), starts a server in one end, and from the other end runs:
//!
//! 1. a test with the settings a user of iperf3 gets by default (one stream,
//!    kernel buffer autotuning, no fatpipe auto-tuning);
//! 2. a test with fatpipe's defaults (auto-tuned streams and buffers);
//! 3. a copy of a generated dataset (one large file and many small ones),
//!    checked byte for byte afterwards;
//!
//! then prints a short report comparing them and removes the link.
//!
//! Every demo's runs go into an archive of its own (`demo.sqlite` in the
//! report directory, under the user's data directory by default), as a
//! sweep named `demo` whose cells are the three steps, so repeated demos
//! pile up as repetitions; and each demo writes the HTML report of that
//! archive beside it (`fatpipe report --html`), and says where. The page
//! opens with this demo's runs over time (`report --run`): both tests on
//! one time axis, then the copy's bytes against the link's capacity.
//!
//! The demo drives the real `fatpipe` binary (this executable) as separate
//! processes with `--json`, exactly as a user or script would, and reads the
//! results through the shared schema: what it shows is what `test` and
//! `copy` measure, not a separate code path. Without root there is no lab, so
//! it runs the same steps on loopback and says what it skipped.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use fatpipe_archive::Run;
use fatpipe_lab::{End, Lab, LinkSpec, UpOptions};
use fatpipe_schema::copy::CopyReport;
use fatpipe_schema::test::TestReport;
use fatpipe_schema::units::{self, format_bytes, format_rate};

use crate::exit::usage;

/// Arguments of `fatpipe demo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Round-trip time of the emulated link.
    #[arg(long, default_value = "93ms", value_parser = units::parse_duration)]
    rtt: Duration,
    /// Bottleneck rate of the emulated link (bits per second).
    #[arg(long, default_value = "1gbit", value_parser = units::parse_rate)]
    rate: u64,
    /// Random loss on the emulated link, e.g. 0.01%.
    #[arg(long, default_value = "0", value_parser = units::parse_probability)]
    loss: f64,
    /// Length of each throughput test.
    #[arg(short = 't', long, default_value = "10s", value_parser = units::parse_duration)]
    time: Duration,
    /// Size of the generated dataset's large file.
    #[arg(long, default_value = "512M", value_parser = units::parse_size)]
    size: u64,
    /// Number of small (16 KiB) files in the generated dataset.
    #[arg(long, default_value_t = 2000)]
    small_files: u32,
    /// Run on loopback even when root could bring up the emulated link.
    #[arg(long)]
    loopback: bool,
    /// Where the demo's archive (demo.sqlite) and HTML report
    /// (demo-report.html) go [default: fatpipe/demo in the user's data
    /// directory].
    #[arg(long, value_name = "DIR")]
    report_dir: Option<PathBuf>,
}

/// Where the demo runs: through a lab link, or on this host's loopback.
enum Place {
    Lab(Lab),
    Loopback,
}

impl Place {
    fn command(&self, end: End, exe: &Path) -> Command {
        match self {
            Place::Lab(lab) => lab.command(end, exe),
            Place::Loopback => Command::new(exe),
        }
    }

    fn server_host(&self) -> String {
        match self {
            Place::Lab(lab) => lab.addr(End::B).to_string(),
            Place::Loopback => "127.0.0.1".to_string(),
        }
    }
}

/// A child process ended by PID and reaped when dropped.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.time < Duration::from_secs(1) {
        return Err(usage("demo: --time must be at least 1s"));
    }
    if args.rate == 0 {
        return Err(usage("demo: --rate must be above 0"));
    }
    let exe = std::env::current_exe().context("demo: cannot find the fatpipe executable")?;
    let work = tempdir()?;
    let result = run_in(&args, &exe, &work);
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn run_in(args: &Args, exe: &Path, work: &Path) -> anyhow::Result<()> {
    let root = is_root();
    let place = if root && !args.loopback {
        let spec = LinkSpec {
            rtt: args.rtt,
            rate_up: args.rate,
            rate_down: args.rate,
            loss: args.loss,
            ..LinkSpec::default()
        };
        let opts = UpOptions {
            exe: Some(exe.to_path_buf()),
            // The lab removes itself if this process dies, even by SIGKILL.
            owner: Some(std::process::id()),
        };
        let name = format!("demo{}", std::process::id() % 10000);
        say(&format!(
            "bringing up lab '{name}': {} RTT, {} (like CERN–New York)",
            units::format_duration(args.rtt),
            format_rate(args.rate as f64)
        ));
        Place::Lab(Lab::up(&name, &spec, &opts).context("demo: lab up")?)
    } else {
        if !root {
            say("not root: no emulated link (it needs network namespaces and TUN devices);");
            say("running the same steps on loopback, so the numbers show this host, not a long fat network");
        } else {
            say("--loopback: running on loopback");
        }
        Place::Loopback
    };

    let outcome = steps(args, exe, work, &place);
    if let Place::Lab(lab) = place {
        let name = lab.name().to_string();
        lab.down()
            .with_context(|| format!("demo: lab down {name}"))?;
        say(&format!("removed lab '{name}'"));
    }
    outcome
}

fn steps(args: &Args, exe: &Path, work: &Path, place: &Place) -> anyhow::Result<()> {
    let src = work.join("dataset");
    let dst = work.join("export");
    std::fs::create_dir_all(&dst).context("demo: create export dir")?;
    say(&format!(
        "generating dataset: one {} file and {} files of 16 KiB",
        format_bytes(args.size),
        args.small_files
    ));
    generate_dataset(&src, args.size, args.small_files)?;

    let (_server, port) = start_server(place, exe, &dst)?;
    let target = format!("{}:{port}", place.server_host());
    let secs = format!("{}ms", args.time.as_millis());

    say("test 1/2: default settings (1 stream, kernel buffers, no auto-tuning)");
    let baseline = run_test(place, exe, &[&target, "-t", &secs, "--no-auto", "-P", "1"])?;
    say("test 2/2: fatpipe defaults (auto-tuned)");
    let tuned = run_test(place, exe, &[&target, "-t", &secs])?;

    say("copy: dataset to the server's export, verified end to end");
    let dest_spec = format!("{}:demo/", place.server_host());
    let src_arg = src.to_string_lossy().into_owned();
    let port_arg = port.to_string();
    let copy = run_copy(place, exe, &["-r", "-p", &port_arg, &src_arg, &dest_spec])?;
    let copied = dst.join("dataset");
    let checked = compare_trees(&src, &copied)?;

    println!();
    println!("fatpipe demo report");
    match place {
        Place::Lab(lab) => println!("  link    {}", lab.spec().summary()),
        Place::Loopback => {
            println!("  link    loopback (no emulated link: not root or --loopback)")
        }
    }
    println!(
        "  {:<28} {:>12} {:>8} {:>12} {:>9}",
        "", "throughput", "streams", "retransmits", "RTT"
    );
    print_test_row("test, default settings", &baseline);
    print_test_row("test, fatpipe auto", &tuned);
    println!(
        "  {:<28} {:>12} {:>8} {:>12} {:>9}",
        "copy, dataset",
        format_rate(copy.rate as f64),
        copy.streams,
        "-",
        "-"
    );
    let base = sum_rate(&baseline);
    if base > 0.0 {
        println!(
            "  auto-tuning gave {:.1}x the default settings' throughput",
            sum_rate(&tuned) / base
        );
    }
    println!(
        "  copy: {} in {} files ({} verified by checksum, {} compared byte for byte here), {:.1} s",
        format_bytes(copy.bytes_total),
        copy.files_total,
        copy.files_verified,
        checked,
        copy.seconds
    );
    if let Some(w) = tuned.start.warnings.first() {
        println!("  note: {w}");
    }
    let (archive, html) = keep(args, place, &baseline, &tuned, &copy)?;
    println!("  archive {}", archive.display());
    println!("  report  {}", html.display());
    Ok(())
}

/// Stores the demo's three runs in its archive and writes the archive's
/// HTML report; returns where both are.
fn keep(
    args: &Args,
    place: &Place,
    baseline: &TestReport,
    tuned: &TestReport,
    copy: &CopyReport,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let dir = match &args.report_dir {
        Some(d) => d.clone(),
        None => match fatpipe_archive::Location::default_sqlite() {
            Ok(fatpipe_archive::Location::Sqlite(p)) => p
                .parent()
                .map(|d| d.join("demo"))
                .ok_or_else(|| anyhow!("demo: no data directory; give --report-dir"))?,
            _ => bail!(
                "demo: no data directory (HOME and XDG_DATA_HOME are unset); give --report-dir"
            ),
        },
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("demo: create {}", dir.display()))?;
    let archive = dir.join("demo.sqlite");
    let html = dir.join("demo-report.html");
    let location = archive.to_string_lossy().into_owned();
    let mut store = super::archive::open(Some(&location))?;
    let rep = store
        .done_runs("demo")?
        .iter()
        .map(|d| d.repetition + 1)
        .max()
        .unwrap_or(0);
    let (path, link) = match place {
        Place::Lab(lab) => (
            "lab:demo".to_string(),
            serde_json::to_value(lab.spec()).ok(),
        ),
        Place::Loopback => ("loopback".to_string(), None),
    };
    let now = chrono::Utc::now();
    let host = super::archive::host_facts();
    let cell = |step: &str| serde_json::json!({ "step": step }).to_string();
    let runs = [
        Run::from_test(baseline, &path, host.clone(), now)?.with_sweep(
            "demo",
            cell("1 test, default settings"),
            rep,
        ),
        Run::from_test(tuned, &path, host.clone(), now)?.with_sweep(
            "demo",
            cell("2 test, auto-tuned"),
            rep,
        ),
        Run::from_copy(copy, &path, host, now)?.with_sweep("demo", cell("3 copy, auto-tuned"), rep),
    ];
    let runs: Vec<Run> = runs
        .into_iter()
        .map(|mut r| {
            r.link = link.clone();
            r
        })
        .collect();
    let ids: Vec<i64> = store
        .insert_runs(&runs)?
        .ids
        .into_iter()
        .flatten()
        .collect();
    drop(store);
    super::report::write(super::report::Args {
        select: super::archive::Select {
            archive: Some(location),
            sweep: Some("demo".into()),
            ..Default::default()
        },
        rows: Some("step".into()),
        format: "text".into(),
        html: Some(html.clone()),
        // The story first: this demo's tests over time on one plot (the
        // default's flat line against the auto-tuned ramp) and the copy's
        // progress, where the terminal's summary stands in the output.
        run: ids,
        ..Default::default()
    })?;
    Ok((archive, html))
}

fn print_test_row(label: &str, r: &TestReport) {
    let rtt = r
        .end
        .streams
        .iter()
        .filter_map(|s| s.rtt_us)
        .max()
        .map(|us| format!("{:.1} ms", us as f64 / 1000.0))
        .unwrap_or_else(|| "-".into());
    let retrans: u64 = r.end.streams.iter().filter_map(|s| s.retransmits).sum();
    println!(
        "  {:<28} {:>12} {:>8} {:>12} {:>9}",
        label,
        format_rate(sum_rate(r)),
        r.start.streams,
        retrans,
        rtt
    );
}

/// The receiver-side throughput of the whole test (all streams).
fn sum_rate(r: &TestReport) -> f64 {
    r.end.sums.iter().map(|s| s.bits_per_second).sum()
}

/// Starts `fatpipe server` at the B end on a free port; returns its guard and port.
fn start_server(place: &Place, exe: &Path, export: &Path) -> anyhow::Result<(ChildGuard, u16)> {
    let mut cmd = place.command(End::B, exe);
    cmd.arg("server")
        .args(["--port", "0", "--export"])
        .arg(format!("demo={}:public", export.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        // Session start/end lines would interleave with the demo's own; a
        // failing session shows in the client's error instead.
        .stderr(Stdio::null());
    let mut child = cmd.spawn().context("demo: start fatpipe server")?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("demo: server has no stdout"))?;
    let guard = ChildGuard(child);
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .context("demo: read the server's first line")?;
    let port = line
        .trim()
        .strip_prefix("listening on ")
        .and_then(|addr| addr.rsplit(':').next())
        .and_then(|p| p.parse::<u16>().ok())
        .ok_or_else(|| anyhow!("demo: server did not say where it listens (got {line:?})"))?;
    Ok((guard, port))
}

fn run_test(place: &Place, exe: &Path, args: &[&str]) -> anyhow::Result<TestReport> {
    let out = run_json(place, exe, "test", args)?;
    let report: TestReport =
        serde_json::from_slice(&out).context("demo: parse fatpipe test --json output")?;
    let r = sum_rate(&report);
    say(&format!(
        "  {} with {} stream(s)",
        format_rate(r),
        report.start.streams
    ));
    Ok(report)
}

fn run_copy(place: &Place, exe: &Path, args: &[&str]) -> anyhow::Result<CopyReport> {
    let out = run_json(place, exe, "copy", args)?;
    let report: CopyReport =
        serde_json::from_slice(&out).context("demo: parse fatpipe copy --json output")?;
    say(&format!(
        "  {} files, {} at {}",
        report.files_total,
        format_bytes(report.bytes_total),
        format_rate(report.rate as f64)
    ));
    Ok(report)
}

/// Runs `fatpipe SUB ARGS --json` at the A end; its stderr goes to ours.
fn run_json(place: &Place, exe: &Path, sub: &str, args: &[&str]) -> anyhow::Result<Vec<u8>> {
    let started = Instant::now();
    let out = place
        .command(End::A, exe)
        .arg(sub)
        .args(args)
        .arg("--json")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("demo: run fatpipe {sub}"))?;
    if !out.status.success() {
        bail!(
            "demo: fatpipe {sub} {} failed ({}) after {:.1} s",
            args.join(" "),
            out.status,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(out.stdout)
}

/// Writes `dataset/big.bin` (pseudo-random, incompressible) and
/// `dataset/small/dNN/fNNNNN` files of 16 KiB each.
fn generate_dataset(dir: &Path, big: u64, small: u32) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir.join("small")).context("demo: create dataset dir")?;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut buf = vec![0u8; 1 << 20];
    let path = dir.join("big.bin");
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(&path).with_context(|| format!("demo: create {}", path.display()))?,
    );
    let mut left = big;
    while left > 0 {
        fill(&mut rng, &mut buf);
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])
            .with_context(|| format!("demo: write {}", path.display()))?;
        left -= n as u64;
    }
    f.flush()
        .with_context(|| format!("demo: write {}", path.display()))?;
    let mut small_buf = vec![0u8; 16 * 1024];
    for i in 0..small {
        let sub = dir.join("small").join(format!("d{:02}", i % 50));
        if i < 50 {
            std::fs::create_dir_all(&sub).context("demo: create dataset dir")?;
        }
        fill(&mut rng, &mut small_buf);
        let p = sub.join(format!("f{i:05}"));
        std::fs::write(&p, &small_buf).with_context(|| format!("demo: write {}", p.display()))?;
    }
    Ok(())
}

/// xorshift64*: fast, dependency-free filler so the dataset does not compress.
fn fill(state: &mut u64, buf: &mut [u8]) {
    for chunk in buf.chunks_mut(8) {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        let v = state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

/// Compares two trees file by file (names, sizes, bytes); returns the number
/// of files compared or an error naming the first difference.
fn compare_trees(a: &Path, b: &Path) -> anyhow::Result<u64> {
    let mut count = 0;
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = a.join(&rel);
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("demo: read {}", dir.display()))?
        {
            let entry = entry.with_context(|| format!("demo: read {}", dir.display()))?;
            let rel = rel.join(entry.file_name());
            let ty = entry.file_type().context("demo: stat")?;
            if ty.is_dir() {
                stack.push(rel);
            } else if ty.is_file() {
                if !same_contents(&a.join(&rel), &b.join(&rel))? {
                    bail!("demo: {} differs after the copy", rel.display());
                }
                count += 1;
            }
        }
    }
    Ok(count)
}

fn same_contents(a: &Path, b: &Path) -> anyhow::Result<bool> {
    let open =
        |p: &Path| std::fs::File::open(p).with_context(|| format!("demo: open {}", p.display()));
    let (mut fa, mut fb) = (open(a)?, open(b)?);
    if fa.metadata()?.len() != fb.metadata()?.len() {
        return Ok(false);
    }
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = read_full(&mut fa, &mut ba)?;
        let m = read_full(&mut fb, &mut bb)?;
        if n != m || ba[..n] != bb[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> anyhow::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]).context("demo: read")? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn tempdir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("fatpipe-demo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("demo: create {}", dir.display()))?;
    Ok(dir)
}

fn is_root() -> bool {
    fatpipe_sys::process::is_root()
}

fn say(msg: &str) {
    eprintln!("demo: {msg}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filler_is_deterministic_and_not_constant() {
        let (mut s1, mut s2) = (1u64, 1u64);
        let (mut a, mut b) = (vec![0u8; 64], vec![0u8; 64]);
        fill(&mut s1, &mut a);
        fill(&mut s2, &mut b);
        assert_eq!(a, b);
        assert!(a.windows(2).any(|w| w[0] != w[1]));
    }

    #[test]
    fn compare_trees_finds_a_difference() {
        let t = tempdir_for_test();
        let (a, b) = (t.join("a"), t.join("b"));
        generate_dataset(&a, 3000, 3).unwrap();
        generate_dataset(&b, 3000, 3).unwrap();
        assert_eq!(compare_trees(&a, &b).unwrap(), 4);
        std::fs::write(b.join("small/d01/f00001"), b"changed").unwrap();
        assert!(compare_trees(&a, &b).is_err());
        let _ = std::fs::remove_dir_all(&t);
    }

    fn tempdir_for_test() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "fatpipe-demo-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
