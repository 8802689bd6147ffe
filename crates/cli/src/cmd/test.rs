//! `fatpipe test HOST`: memory-to-memory TCP/UDP throughput against a
//! `fatpipe server`.
//!
//! Two phases, as in the rest of the binary: clap parses raw [`Args`], then
//! [`plan`] validates them into a [`TestParams`] (units parsed through
//! `fatpipe_schema::units`, ranges checked, defaults chosen per protocol),
//! so every flag is tested below without a socket. The engine runs the test
//! and hands back schema types; this module only renders them: a line per
//! interval and a final table for people, one JSON document (`--json`) or
//! one JSON object per line (`--json-stream`) for machines.
//!
//! Auto-tuning is wiring here too: `fatpipe_tune::auto::run` is the
//! pre-flight, `fatpipe_memtest::tuning` writes its settings into the test
//! and lets `fatpipe_tune::steer::Driver` steer the running test; this
//! module prints the `auto:` lines and what the driver reports.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use fatpipe_archive::RunKind;
use fatpipe_engine::server::DEFAULT_PORT;
use fatpipe_engine::{ClientOptions, EngineError};
use fatpipe_memtest::findmax::{self, FindMaxPlan, SearchConfig};
use fatpipe_memtest::msg::{Direction, Protocol, TestParams, MAX_STREAMS};
use fatpipe_memtest::rfc6349;
use fatpipe_memtest::tuning::{self, TestTarget};
use fatpipe_memtest::{run_client, Progress, TestPlan};
use fatpipe_schema::test::{
    FindMaxReport, FindMaxTrial, Rfc6349, StreamStats, TestEnd, TestInterval, TestStart,
    TestStreamLine,
};
use fatpipe_schema::tune::{Action, AutoTune, Decision};
use fatpipe_schema::units;
use fatpipe_tune::adjust::{AdjustConfig, Adjuster};
use fatpipe_tune::auto;
use fatpipe_tune::steer::{self, Driver, Event, Step};

use super::archive::Recorder;

/// Arguments of `fatpipe test`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Server: HOST, HOST:PORT or [IPv6]:PORT.
    pub host: String,
    /// Server port when HOST has none.
    #[arg(short = 'p', long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Parallel streams (per direction), 1..=1024 [default: auto-tuned, 1
    /// with --no-auto].
    #[arg(short = 'P', long)]
    pub parallel: Option<u32>,
    /// Socket buffer size to request on both ends, e.g. 4M.
    #[arg(short = 'w', long)]
    pub window: Option<String>,
    /// TCP maximum segment size, bytes.
    #[arg(short = 'M', long)]
    pub mss: Option<u32>,
    /// TCP congestion control for the sender, e.g. bbr or cubic.
    #[arg(short = 'C', long)]
    pub congestion: Option<String>,
    /// Pacing cap per stream (SO_MAX_PACING_RATE, needs fq), e.g. 2.5g.
    #[arg(long)]
    pub fq_rate: Option<String>,
    /// Measured time, e.g. 10s.
    #[arg(short = 't', long, default_value = "10s")]
    pub time: String,
    /// Send this many bytes per direction instead of running for a time.
    #[arg(short = 'n', long)]
    pub bytes: Option<String>,
    /// Warm-up left out of the totals, e.g. 2s (rounded up to intervals).
    #[arg(short = 'O', long, default_value = "0")]
    pub omit: String,
    /// Report interval.
    #[arg(short = 'i', long, default_value = "1s")]
    pub interval: String,
    /// Reverse: the server sends.
    #[arg(short = 'R', long, conflicts_with = "bidir")]
    pub reverse: bool,
    /// Both directions at once.
    #[arg(long)]
    pub bidir: bool,
    /// Send without copying (sendfile from memory).
    #[arg(short = 'Z', long)]
    pub zerocopy: bool,
    /// UDP instead of TCP.
    #[arg(short = 'u', long)]
    pub udp: bool,
    /// UDP bitrate per stream (default 1M).
    #[arg(short = 'b', long)]
    pub bitrate: Option<String>,
    /// Write size (TCP, default 128K) or datagram size (UDP, 64..65507,
    /// default 1460); with --find-max a list, e.g. 64,512,1472.
    #[arg(short = 'l', long)]
    pub length: Option<String>,
    /// UDP: search for the highest rate with no loss, and the highest
    /// with at most --loss-max, instead of sending at -b (then the most
    /// to offer); short trials, then one of -t to confirm (docs/udp.md).
    #[arg(long, requires = "udp", conflicts_with_all = ["json_stream", "bidir", "bytes", "iperf3"])]
    pub find_max: bool,
    /// With --find-max: the loss the second answer allows, e.g. 0.5% or
    /// 0.001.
    #[arg(long, requires = "find_max", default_value = "0.5%")]
    pub loss_max: String,
    /// With --find-max: length of each searching trial (-t is the
    /// confirming trial's).
    #[arg(long, requires = "find_max", default_value = "1s")]
    pub trial: String,
    /// UDP: one datagram per system call at both ends (no sendmmsg,
    /// recvmmsg, GSO or GRO): the per-packet baseline.
    #[arg(long, requires = "udp", conflicts_with = "iperf3")]
    pub no_batch: bool,
    /// Print one JSON report at the end.
    #[arg(long, conflicts_with = "json_stream")]
    pub json: bool,
    /// Print one JSON object per line: start, each interval, end.
    #[arg(long)]
    pub json_stream: bool,
    /// Pre-shared key file (must match the server's).
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// Encrypt and authenticate every connection with TLS 1.3 keyed by
    /// --key-file, to measure its cost (TCP only; docs/encryption.md).
    #[arg(long, conflicts_with = "iperf3")]
    pub encrypt: bool,
    /// Print auto-tuning's whole reasoning and every pre-flight warning,
    /// not only the one-line choice (both are in the JSON either way).
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Do not auto-tune: one stream (unless -P) and the kernel's buffers,
    /// congestion control and pacing unless given as flags.
    #[arg(long)]
    pub no_auto: bool,
    /// Add RFC 6349 metrics (transfer time ratio, TCP efficiency, buffer
    /// delay) against the path's probed baseline RTT and bottleneck; TCP
    /// only. Probes the path first when auto-tuning does not.
    #[arg(long)]
    pub rfc6349: bool,
    /// Store the result in the archive: this SQLite file or postgres://
    /// URL, or with no value $FATPIPE_ARCHIVE, else the user's data
    /// directory (also on whenever FATPIPE_ARCHIVE is set). Give it after
    /// HOST, or as --archive=LOCATION.
    #[arg(long, value_name = "LOCATION", num_args = 0..=1, default_missing_value = "")]
    pub archive: Option<String>,
    /// The server is a stock iperf3 server (default port 5201): speak
    /// iperf3's protocol (docs/iperf3.md).
    #[arg(long, conflicts_with_all = ["key_file", "rfc6349"])]
    pub iperf3: bool,
    /// With --iperf3: authenticate as this user (iperf3's --username; the
    /// password comes from IPERF3_PASSWORD, as for iperf3).
    #[arg(long, requires_all = ["iperf3", "iperf3_rsa_public_key"], value_name = "USER")]
    pub iperf3_username: Option<String>,
    /// With --iperf3: the server's RSA public key (PEM), as iperf3's
    /// --rsa-public-key-path.
    #[arg(long, requires = "iperf3_username", value_name = "FILE")]
    pub iperf3_rsa_public_key: Option<PathBuf>,
    /// With --iperf3 authentication: OAEP padding, for iperf3 3.17 and
    /// later (default PKCS#1 v1.5, which older servers and
    /// `--use-pkcs1-padding` expect).
    #[arg(long, requires = "iperf3_username")]
    pub iperf3_oaep: bool,
    /// When the test ends, draw it over time into FILE.svg or FILE.png:
    /// throughput (the sum, and the streams' spread), RTT, window and
    /// retransmits (UDP: loss and jitter) per interval, the adjuster's
    /// changes and the ramp marked.
    #[arg(long, value_name = "FILE", conflicts_with = "find_max")]
    pub plot: Option<PathBuf>,
}

/// Runs the test and prints it; stores it when `--archive` or
/// FATPIPE_ARCHIVE asks (a failed test too, with its error).
pub fn run(args: Args) -> anyhow::Result<()> {
    let rec = Recorder::new(args.archive.as_deref(), RunKind::Test, &args.host)?;
    let result = measure(args, rec.as_ref());
    if let (Some(r), Err(e)) = (&rec, &result) {
        r.failed(e);
    }
    result
}

fn measure(args: Args, rec: Option<&Recorder>) -> anyhow::Result<()> {
    if let Some(f) = &args.plot {
        super::report::check_plot_file(f)?;
    }
    if args.iperf3 {
        return super::iperf3::run(&args, rec);
    }
    let mut params = plan(&args)?;
    fatpipe_engine::raise_fd_limit();
    let addr = super::common::resolve(&args.host, args.port)?;
    let key = match &args.key_file {
        Some(path) => {
            Some(fatpipe_engine::load_key(path).map_err(|e| crate::exit::usage(e.to_string()))?)
        }
        None => None,
    };
    super::common::check_encrypt(args.encrypt, key.is_some(), args.udp)?;
    let options = ClientOptions {
        key,
        encrypt: args.encrypt,
        ..ClientOptions::default()
    };
    if args.find_max {
        return find_max(&args, params, addr, options, rec);
    }
    let mut baseline = None;
    let mut auto = if wants_auto(&args, &params) {
        auto_tune(&args, addr, &options, &mut params, &mut baseline)?
    } else {
        None
    };
    if args.rfc6349 && baseline.is_none() {
        baseline = Some(probe_baseline(&args, addr, &options)?);
    }
    let plan = TestPlan {
        server: args.host.clone(),
        addr,
        options,
        params,
    };
    let mode = if args.json {
        Output::Json
    } else if args.json_stream {
        Output::JsonStream
    } else {
        Output::Text
    };
    // The in-flight adjuster runs when auto-tuning chose the streams (no
    // -P) of a TCP test.
    let adjusting = args.parallel.is_none() && plan.params.protocol == Protocol::Tcp;
    let config = auto
        .as_ref()
        .filter(|_| adjusting)
        .map(|a| tuning::adjust_config(&plan.params, a, args.congestion.is_some()));
    if let (Some(a), true) = (auto.as_mut(), config.is_some()) {
        a.adjusting = true;
    }
    // Not locked for the whole run: the driver's thread prints its
    // `--json-stream` lines while the session waits for it.
    let mut out = std::io::stdout();
    let mut io_err: Option<std::io::Error> = None;
    let mut on_progress = |p: Progress<'_>| {
        if io_err.is_some() {
            return;
        }
        let r = match (mode, p) {
            (Output::Text, Progress::Start(s)) => print_start(&mut out, s),
            (Output::Text, Progress::Interval(iv)) => print_interval(&mut out, &plan.params, iv),
            (Output::JsonStream, Progress::Start(s)) => {
                let mut s = s.clone();
                s.auto.clone_from(&auto);
                json_line(&mut out, &TestStreamLine::Start(s))
            }
            (Output::JsonStream, Progress::Interval(iv)) => {
                json_line(&mut out, &TestStreamLine::Interval(iv.clone()))
            }
            (Output::Json, _) => Ok(()),
        };
        if let Err(e) = r {
            io_err = Some(e);
        }
    };
    let (result, steered) = match config {
        Some(cfg) => tuning::run_client_steered(&plan, &mut on_progress, |t| steer(t, cfg, mode)),
        None => (run_client(&plan, &mut on_progress), None),
    };
    let mut report = result.map_err(|e| classify(e, &plan))?;
    if let (Some(a), Some((decisions, unavailable))) = (auto.as_mut(), steered) {
        a.adjusting = !unavailable;
        a.decisions = decisions;
    }
    report.start.auto = auto;
    if let (true, Some(b)) = (args.rfc6349, &baseline) {
        report.end.rfc6349 = rfc6349::assess(b, &report);
    }
    if let Some(e) = io_err {
        return Err(e.into());
    }
    match mode {
        Output::Text => {
            print_end(&mut out, &plan.params, &report.end)?;
            if let Some(r) = &report.end.rfc6349 {
                print_rfc6349(&mut out, r)?;
            }
        }
        Output::JsonStream => json_line(&mut out, &TestStreamLine::End(report.end.clone()))?,
        Output::Json => {
            crate::cmd::common::json_pretty(&mut out, &report)?;
        }
    }
    out.flush()?;
    if let Some(r) = rec {
        r.test(&report)?;
    }
    if let Some(file) = &args.plot {
        super::plots::test(&report, file)?;
    }
    Ok(())
}

/// True when the test should be auto-tuned: TCP, no `--no-auto`, and some
/// part of the plan (streams, window, congestion, pacing) left to choose.
fn wants_auto(a: &Args, p: &TestParams) -> bool {
    auto::wanted(a.no_auto, p.protocol == Protocol::Tcp, &overrides(a, p))
}

/// The parts of a plan the user's flags fix.
pub(super) fn overrides(a: &Args, p: &TestParams) -> auto::Overrides {
    auto::Overrides {
        streams: a.parallel.map(|_| p.streams),
        buffer: p.window,
        congestion: p.congestion.clone(),
        pacing_rate: p.fq_rate,
    }
}

/// Probes the path, plans, prints the `auto:` line on stderr and applies
/// the plan to the parts no flag fixed. A failed probe is not fatal: the
/// test runs with the flags as given, and says so. The probe's findings
/// (or why there are none) go to `baseline` for `--rfc6349`.
fn auto_tune(
    a: &Args,
    addr: SocketAddr,
    options: &ClientOptions,
    params: &mut TestParams,
    baseline: &mut Option<Result<rfc6349::Baseline, String>>,
) -> anyhow::Result<Option<AutoTune>> {
    let role = match params.direction {
        Direction::Up => auto::Role::Sender,
        Direction::Down => auto::Role::Receiver,
        Direction::Both => auto::Role::Both,
    };
    let req = auto::Request {
        preflight: auto::PreflightConfig::new(addr, options.clone(), role),
        overrides: overrides(a, params),
        floor: None,
        rate_cap: None,
    };
    let t = match auto::run(&req) {
        Ok(t) => t,
        Err(e) if e.is_auth() => return Err(crate::exit::usage(format!("{}: {e}", a.host))),
        Err(e) => {
            eprintln!("fatpipe: warning: auto-tuning off: {e}");
            *baseline = Some(Err(e.to_string()));
            return Ok(None);
        }
    };
    *baseline = Some(Ok(rfc6349::Baseline::from_preflight(&t.preflight)));
    tuning::tune(params, &t);
    // One line by default, what was chosen for which path, as the copy
    // prints; the reasoning and the warnings that only explain it with -v
    // (all of it is in the JSON); a warning to act on is always shown.
    let (line, warnings) = if a.verbose {
        (&t.line, &t.record.warnings)
    } else {
        (&t.short, &t.act_on)
    };
    eprintln!("{line}");
    for w in warnings {
        eprintln!("fatpipe: warning: auto: {w}");
    }
    Ok(Some(t.record))
}

/// The path probe `--rfc6349` needs when auto-tuning did not run one. A
/// failed probe is not fatal: the metrics that need it are left out.
fn probe_baseline(
    a: &Args,
    addr: SocketAddr,
    options: &ClientOptions,
) -> anyhow::Result<Result<rfc6349::Baseline, String>> {
    match rfc6349::probe(addr, options.clone()) {
        Ok(b) => Ok(Ok(b)),
        Err(e) if e.is_auth() => Err(crate::exit::usage(format!("{}: {e}", a.host))),
        Err(e) => {
            eprintln!("fatpipe: warning: rfc6349: path probe failed: {e}");
            Ok(Err(e.to_string()))
        }
    }
}

/// Steers the running test with the in-flight driver, printing each change
/// (stderr, and `--json-stream` lines); returns the changes carried out and
/// whether the test could not be steered.
fn steer(t: &mut TestTarget, cfg: AdjustConfig, mode: Output) -> (Vec<Decision>, bool) {
    let mut driver = Driver::new(Adjuster::new(cfg), steer::Options::default());
    driver.run(t, &mut |e| {
        if let Event::Changed(step) = e {
            print_step(step, mode);
        }
    });
    if let Some(why) = t.unavailable() {
        eprintln!("fatpipe: warning: auto: no in-flight adjustment: {why}");
    }
    (driver.decisions().to_vec(), t.unavailable().is_some())
}

/// One change of the in-flight driver: carried out (with what either end
/// capped), or why not.
fn print_step(step: &Step, mode: Output) {
    let d = &step.decision;
    let what = match &d.action {
        Action::AddStreams { n } => format!("+{n} streams"),
        Action::SwitchCongestion { to } => format!("switch to {to}"),
        Action::Hold => "hold".to_string(),
    };
    match &step.outcome {
        Ok(warnings) => {
            eprintln!(
                "auto: {what} at {:.1} s → {} streams: {}",
                d.at_secs, d.streams, d.reason
            );
            for w in warnings {
                eprintln!("fatpipe: warning: auto: {w}");
            }
            if let Output::JsonStream = mode {
                let mut out = std::io::stdout().lock();
                let _ = json_line(&mut out, &TestStreamLine::Adjust(d.clone()));
            }
        }
        Err(why) => {
            let more = if step.last { "; no more changes" } else { "" };
            eprintln!(
                "fatpipe: warning: auto: {what} at {:.1} s not carried out: {why}{more}",
                d.at_secs
            );
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Output {
    Text,
    Json,
    JsonStream,
}

/// Turns the raw flags into test parameters.
pub(super) fn plan(a: &Args) -> anyhow::Result<TestParams> {
    let usage = |e: units::UnitError| crate::exit::usage(e.to_string());
    let streams = a.parallel.unwrap_or(1);
    if streams == 0 || streams > MAX_STREAMS {
        return Err(crate::exit::usage(format!(
            "-P/--parallel must be 1..={MAX_STREAMS}"
        )));
    }
    let protocol = if a.udp { Protocol::Udp } else { Protocol::Tcp };
    let interval = units::parse_duration(&a.interval).map_err(usage)?;
    if interval < Duration::from_millis(10) {
        return Err(crate::exit::usage("-i/--interval must be at least 10ms"));
    }
    let time = units::parse_duration(&a.time).map_err(usage)?;
    let bytes = a
        .bytes
        .as_deref()
        .map(units::parse_size)
        .transpose()
        .map_err(usage)?;
    if bytes.is_none() && time.is_zero() {
        return Err(crate::exit::usage("-t/--time must be above 0"));
    }
    if bytes == Some(0) {
        return Err(crate::exit::usage("-n/--bytes must be above 0"));
    }
    // The warm-up ends on an interval boundary so that intervals line up.
    let omit = units::parse_duration(&a.omit).map_err(usage)?;
    let omit_ms = round_up(omit.as_millis() as u64, interval.as_millis() as u64);
    let length = match (lengths(a)?.first(), protocol) {
        (Some(&l), _) => l,
        (None, Protocol::Tcp) => 128 * 1024,
        (None, Protocol::Udp) => 1460,
    };
    let bitrate = match (&a.bitrate, protocol) {
        (Some(b), _) => units::parse_rate(b).map_err(usage)?,
        (None, Protocol::Udp) => 1_000_000,
        (None, Protocol::Tcp) => 0,
    };
    if a.bitrate.is_some() && protocol == Protocol::Tcp {
        return Err(crate::exit::usage(
            "-b/--bitrate applies to UDP (-u); for TCP use --fq-rate",
        ));
    }
    if protocol == Protocol::Udp
        && (a.mss.is_some() || a.congestion.is_some() || a.zerocopy || a.rfc6349)
    {
        return Err(crate::exit::usage(
            "-M, -C, -Z and --rfc6349 apply to TCP only; drop them with -u",
        ));
    }
    let window = a
        .window
        .as_deref()
        .map(units::parse_size)
        .transpose()
        .map_err(usage)?;
    let fq_rate = a
        .fq_rate
        .as_deref()
        .map(units::parse_rate)
        .transpose()
        .map_err(usage)?;
    let p = TestParams {
        protocol,
        streams,
        direction: if a.bidir {
            Direction::Both
        } else if a.reverse {
            Direction::Down
        } else {
            Direction::Up
        },
        duration_ms: time.as_millis() as u64,
        bytes,
        omit_ms,
        interval_ms: interval.as_millis() as u64,
        window,
        force_buffers: false,
        start_window: None,
        mss: a.mss,
        congestion: a.congestion.clone(),
        fq_rate,
        zerocopy: a.zerocopy,
        length,
        bitrate,
        no_batch: a.no_batch,
    };
    p.validate().map_err(crate::exit::usage)?;
    for &l in lengths(a)?.iter().skip(1) {
        TestParams {
            length: l,
            ..p.clone()
        }
        .validate()
        .map_err(crate::exit::usage)?;
    }
    Ok(p)
}

/// The lengths `-l` names: one, or with `--find-max` a comma-separated
/// list; none when `-l` is absent.
fn lengths(a: &Args) -> anyhow::Result<Vec<u32>> {
    let Some(text) = &a.length else {
        return Ok(Vec::new());
    };
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    if parts.len() > 1 && !a.find_max {
        return Err(crate::exit::usage(
            "-l/--length takes a list (64,1472) only with --find-max",
        ));
    }
    if parts.len() > 64 {
        return Err(crate::exit::usage("-l/--length: at most 64 lengths"));
    }
    parts
        .into_iter()
        .map(|p| {
            let v = units::parse_size(p).map_err(|e| crate::exit::usage(e.to_string()))?;
            u32::try_from(v).map_err(|_| crate::exit::usage("-l/--length is too large"))
        })
        .collect()
}

/// `--find-max`'s search, from the flags: lengths, allowed loss, trial
/// lengths and the ceiling (`-b`, else as fast as the sender can).
fn find_max_plan(a: &Args, params: &TestParams, base: TestPlan) -> anyhow::Result<FindMaxPlan> {
    let usage = |e: units::UnitError| crate::exit::usage(e.to_string());
    let loss_max = units::parse_probability(&a.loss_max).map_err(usage)?;
    if loss_max <= 0.0 || loss_max >= 0.5 {
        return Err(crate::exit::usage(
            "--loss-max must be above 0 and below 50%, e.g. 0.5%",
        ));
    }
    let trial = units::parse_duration(&a.trial).map_err(usage)?;
    if trial < Duration::from_millis(100) || trial > Duration::from_secs(600) {
        return Err(crate::exit::usage("--trial must be 100ms..10m"));
    }
    let confirm = Duration::from_millis(params.duration_ms);
    let mut lengths = lengths(a)?;
    if lengths.is_empty() {
        lengths.push(params.length);
    }
    let ceiling = a
        .bitrate
        .is_some()
        .then(|| params.bitrate as f64 * f64::from(params.streams));
    Ok(FindMaxPlan {
        base,
        lengths,
        search: SearchConfig {
            loss_max,
            ceiling,
            ..SearchConfig::default()
        },
        trial,
        confirm,
    })
}

/// Runs `--find-max` and prints each trial as it ends, then the table
/// (or the JSON document).
fn find_max(
    a: &Args,
    params: TestParams,
    addr: SocketAddr,
    options: ClientOptions,
    rec: Option<&Recorder>,
) -> anyhow::Result<()> {
    let base = TestPlan {
        server: a.host.clone(),
        addr,
        options,
        params: params.clone(),
    };
    let plan = find_max_plan(a, &params, base)?;
    let mut out = std::io::stdout();
    if !a.json {
        print_find_max_start(&mut out, &plan)?;
    }
    let mut io_err: Option<std::io::Error> = None;
    let mut index = 0u32;
    let mut last_len = 0;
    let mut on_trial = |len: u32, t: &FindMaxTrial| {
        if a.json || io_err.is_some() {
            return;
        }
        if len != last_len {
            (index, last_len) = (0, len);
        }
        index += 1;
        if let Err(e) = print_trial(&mut out, len, index, t) {
            io_err = Some(e);
        }
    };
    let report = findmax::run(&plan, &mut on_trial).map_err(|e| {
        if e.is_auth() {
            crate::exit::usage(format!("{}: {e}", a.host))
        } else {
            anyhow::Error::new(e).context(format!("find-max against {}", a.host))
        }
    })?;
    if let Some(e) = io_err {
        return Err(e.into());
    }
    if a.json {
        crate::cmd::common::json_pretty(&mut out, &report)?;
    } else {
        print_find_max_end(&mut out, &report)?;
    }
    out.flush()?;
    if let Some(r) = rec {
        r.find_max(&report)?;
    }
    Ok(())
}

fn print_find_max_start(out: &mut impl Write, plan: &FindMaxPlan) -> std::io::Result<()> {
    let p = &plan.base.params;
    let dir = if p.direction == Direction::Down {
        "server sends"
    } else {
        "client sends"
    };
    let top = match plan.search.ceiling {
        Some(c) => format!("at most {}", units::format_rate(c)),
        None => "as fast as the sender can".into(),
    };
    writeln!(
        out,
        "find-max: UDP to {}, {} stream(s), {dir}; from {top}, {:.3}% loss allowed, \
         {:.0}% precision, trials of {} and one of {} to confirm{}",
        plan.base.server,
        p.streams,
        plan.search.loss_max * 100.0,
        plan.search.precision * 100.0,
        units::format_duration(plan.trial),
        units::format_duration(plan.confirm),
        if p.no_batch {
            "; one datagram per system call (--no-batch)"
        } else {
            ""
        }
    )?;
    out.flush()
}

fn print_trial(out: &mut impl Write, len: u32, i: u32, t: &FindMaxTrial) -> std::io::Result<()> {
    let what = if t.confirm {
        "confirm".to_string()
    } else {
        format!("trial {i:>2}")
    };
    let asked = match t.requested_bps {
        Some(r) => format!("at {}", units::format_rate(r)),
        None => "at the top".to_string(),
    };
    writeln!(
        out,
        "  {len:>5} B  {what:<9} {asked:<22} offered {:<13} ({})  received {:<13} lost {}/{} ({:.3}%)",
        units::format_rate(t.offered.payload_bps),
        units::format_packet_rate(t.offered.packets_per_second),
        units::format_rate(t.received.payload_bps),
        t.lost,
        t.packets_sent,
        t.loss_percent
    )?;
    out.flush()
}

fn print_find_max_end(out: &mut impl Write, r: &FindMaxReport) -> std::io::Result<()> {
    writeln!(
        out,
        "- - - - - - - - - - - - - - - - - - - - - - - - - - - - - -"
    )?;
    writeln!(
        out,
        "length    loss-free (UDP payload)      on the wire    ≤{}% loss (payload)  trials  send/recv     burst",
        r.loss_max_percent
    )?;
    for l in &r.lengths {
        let at_least = if l.lower_bound { "≥" } else { " " };
        let (free, pps, wire) = match &l.loss_free {
            Some(p) => (
                format!("{at_least}{}", units::format_rate(p.payload_bps)),
                units::format_packet_rate(p.packets_per_second),
                units::format_rate(p.wire_bps),
            ),
            None => ("none".into(), String::new(), String::new()),
        };
        let lossy = l.with_loss.map_or("none".into(), |p| {
            format!("{at_least}{}", units::format_rate(p.payload_bps))
        });
        writeln!(
            out,
            "{:<8}  {free:<15} {pps:<12} {wire:<14} {lossy:<21} {:<7} {:<13} {}",
            format!("{} B", l.length),
            l.trial_count,
            format!("{}/{}", l.send_path, l.recv_path),
            l.burst
        )?;
    }
    for l in &r.lengths {
        writeln!(out, "{} B: {}", l.length, l.statement)?;
    }
    writeln!(
        out,
        "on the wire: IP packets (MTU {}, fragments above it) with {} bytes of Ethernet framing each",
        r.mtu, r.framing_bytes
    )?;
    for w in &r.warnings {
        // Some come from the server: escaped.
        eprintln!("fatpipe: warning: {}", fatpipe_proto::escape(w));
    }
    Ok(())
}

fn round_up(v: u64, step: u64) -> u64 {
    if step == 0 {
        v
    } else {
        v.div_ceil(step) * step
    }
}

/// Auth failures are the user's to fix (exit 2); the rest is exit 1.
fn classify(e: EngineError, plan: &TestPlan) -> anyhow::Error {
    if e.is_auth() {
        crate::exit::usage(format!("{}: {e}", plan.server))
    } else {
        anyhow::Error::new(e).context(format!("test against {}", plan.server))
    }
}

pub(super) fn json_line(out: &mut impl Write, line: &TestStreamLine) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, line)?;
    writeln!(out)?;
    out.flush()
}

pub(super) fn print_start(out: &mut impl Write, s: &TestStart) -> std::io::Result<()> {
    let dir = match s.direction {
        Direction::Down => "reverse (server sends)",
        Direction::Both => "bidirectional",
        Direction::Up => "client sends",
    };
    let what = if s.bytes.is_some() {
        format!(
            "{} per direction",
            units::format_bytes(s.bytes.unwrap_or(0))
        )
    } else {
        format!("{} s", s.duration_s)
    };
    let server = if s.server == s.server_addr {
        s.server.clone()
    } else {
        format!("{} ({})", s.server, s.server_addr)
    };
    writeln!(
        out,
        "Connected to {server}: {} x {}, {dir}, {what}",
        s.streams,
        s.protocol.as_str().to_uppercase()
    )?;
    if let Some(e) = &s.encryption {
        writeln!(out, "  encrypted: {}, {}", e.protocol, e.suite)?;
    }
    if let Some(first) = s.local.first() {
        let remote = s.remote.first();
        let mut line = format!(
            "  buffers: local snd {} rcv {}",
            units::format_bytes_iec(first.sndbuf),
            units::format_bytes_iec(first.rcvbuf)
        );
        if let Some(r) = remote {
            line += &format!(
                ", server snd {} rcv {}",
                units::format_bytes_iec(r.sndbuf),
                units::format_bytes_iec(r.rcvbuf)
            );
        }
        if s.protocol == Protocol::Tcp {
            let sender = if s.direction == Direction::Down {
                remote.unwrap_or(first)
            } else {
                first
            };
            line += &format!(
                "; MSS {}; congestion {}; send {}, receive {}",
                sender.mss,
                sender.congestion,
                sender.send_path,
                remote.map_or("?", |r| r.recv_path.as_str())
            );
        }
        writeln!(out, "{line}")?;
    }
    for w in &s.warnings {
        // Some come from the server: escaped.
        eprintln!("fatpipe: warning: {}", fatpipe_proto::escape(w));
    }
    Ok(())
}

fn header(out: &mut impl Write, p: &TestParams) -> std::io::Result<()> {
    match p.protocol {
        Protocol::Tcp => writeln!(
            out,
            "[  ID]{}  Interval          Transfer     Bitrate          Retr   Cwnd       RTT",
            if p.direction == Direction::Both {
                "     "
            } else {
                ""
            }
        ),
        Protocol::Udp => writeln!(
            out,
            "[  ID]{}  Interval          Transfer     Bitrate          Jitter     Lost/Total",
            if p.direction == Direction::Both {
                "     "
            } else {
                ""
            }
        ),
    }
}

fn row(
    out: &mut impl Write,
    p: &TestParams,
    interval: &str,
    s: &StreamStats,
    omitted: bool,
) -> std::io::Result<()> {
    let tail = if omitted { "  (omitted)" } else { "" };
    let id = match s.id {
        Some(id) => format!("{id:>4}"),
        None => " SUM".to_string(),
    };
    let dir = match (p.direction, s.direction) {
        (Direction::Both, Some(fatpipe_schema::test::Direction::Up)) => " up  ",
        (Direction::Both, Some(fatpipe_schema::test::Direction::Down)) => " down",
        _ => "",
    };
    let transfer = units::format_bytes(s.bytes);
    let rate = units::format_rate(s.bits_per_second);
    match p.protocol {
        Protocol::Tcp => writeln!(
            out,
            "[{id}]{dir}  {interval:<16}  {transfer:<11}  {rate:<15}  {:>5}  {:<9}  {}{tail}",
            s.retransmits.unwrap_or(0),
            units::format_bytes(s.cwnd.unwrap_or(0)),
            units::format_duration(Duration::from_micros(u64::from(s.rtt_us.unwrap_or(0)))),
        ),
        Protocol::Udp => {
            let total = s.packets.unwrap_or(0) + s.lost.unwrap_or(0);
            writeln!(
                out,
                "[{id}]{dir}  {interval:<16}  {transfer:<11}  {rate:<15}  {:<9}  {}/{} ({:.2}%){tail}",
                format!("{:.3} ms", s.jitter_ms.unwrap_or(0.0)),
                s.lost.unwrap_or(0),
                total,
                s.lost_percent.unwrap_or(0.0)
            )
        }
    }
}

pub(super) fn print_interval(
    out: &mut impl Write,
    p: &TestParams,
    iv: &TestInterval,
) -> std::io::Result<()> {
    if iv.index == 0 {
        header(out, p)?;
    }
    let span = format!("{:.2}-{:.2} s", iv.start_s, iv.end_s);
    // More streams than asked for: the adjuster added some.
    let many = p.streams > 1 || iv.streams.len() > p.total_streams() as usize;
    if many || p.direction == Direction::Both {
        for s in &iv.streams {
            row(out, p, &span, s, iv.omitted)?;
        }
    }
    if many || iv.streams.is_empty() {
        for s in &iv.sums {
            row(out, p, &span, s, iv.omitted)?;
        }
    } else if p.direction != Direction::Both {
        for s in &iv.streams {
            row(out, p, &span, s, iv.omitted)?;
        }
    }
    out.flush()
}

pub(super) fn print_end(
    out: &mut impl Write,
    p: &TestParams,
    end: &TestEnd,
) -> std::io::Result<()> {
    writeln!(
        out,
        "- - - - - - - - - - - - - - - - - - - - - - - - - - - - - -"
    )?;
    header(out, p)?;
    for s in &end.streams {
        row(out, p, &format!("0.00-{:.2} s", s.seconds), s, false)?;
    }
    if end.streams.len() > 1 {
        for s in &end.sums {
            row(out, p, &format!("0.00-{:.2} s", s.seconds), s, false)?;
        }
    }
    for s in &end.sums {
        let dir = match s.direction {
            Some(fatpipe_schema::test::Direction::Down) => "server to client",
            _ => "client to server",
        };
        let mut line = format!(
            "{dir}: {} received in {:.2} s = {} (receiver)",
            units::format_bytes(s.bytes),
            s.seconds,
            units::format_rate(s.bits_per_second)
        );
        if let Some(r) = s.retransmits {
            line += &format!(", {r} retransmits");
        }
        if let (Some(sent), Some(lost)) = (s.packets_sent, s.lost) {
            line += &format!(
                ", {lost}/{sent} datagrams lost ({:.3}%), {} out of order, jitter {:.3} ms",
                s.lost_percent.unwrap_or(0.0),
                s.out_of_order.unwrap_or(0),
                s.jitter_ms.unwrap_or(0.0)
            );
        }
        writeln!(out, "{line}")?;
    }
    if let Some(r) = &end.ramp {
        let rate = units::format_rate(r.final_rate as f64);
        match r.secs {
            Some(secs) => writeln!(out, "ramp: 90% of {rate} after {secs:.1} s")?,
            None => writeln!(out, "ramp: never reached 90% of {rate} over one second")?,
        }
    }
    let cpu = |c: &fatpipe_schema::test::CpuUse| {
        format!(
            "{:.1}% ({:.1}%u/{:.1}%s)",
            c.total_percent, c.user_percent, c.system_percent
        )
    };
    writeln!(
        out,
        "CPU: client {}, server {} (percent of one core)",
        cpu(&end.cpu_local),
        cpu(&end.cpu_remote)
    )
}

/// The RFC 6349 block after the final table. Every figure that could not
/// be computed is named with the reason instead.
fn print_rfc6349(out: &mut impl Write, r: &Rfc6349) -> std::io::Result<()> {
    let dir = match r.direction {
        fatpipe_schema::test::Direction::Down => "server to client",
        fatpipe_schema::test::Direction::Up => "client to server",
    };
    let us = |v: u64| units::format_duration(Duration::from_micros(v));
    let at_least = if r.bottleneck_lower_bound {
        "at least "
    } else {
        ""
    };
    writeln!(out, "RFC 6349 ({dir}):")?;
    if let Some(b) = r.baseline_rtt_us {
        writeln!(out, "  baseline RTT            {}", us(b))?;
    }
    if let Some(bb) = r.bottleneck_bps {
        writeln!(
            out,
            "  bottleneck bandwidth    {at_least}{} (IP packets, probed)",
            units::format_rate(bb as f64)
        )?;
    }
    if let Some(bdp) = r.bdp_bytes {
        writeln!(
            out,
            "  BDP                     {at_least}{}",
            units::format_bytes(bdp)
        )?;
    }
    if let Some(max) = r.max_tcp_bps {
        writeln!(
            out,
            "  max achievable TCP      {at_least}{} (MSS {} in {}-byte packets)",
            units::format_rate(max),
            r.mss,
            r.packet_bytes
        )?;
    }
    writeln!(
        out,
        "  actual TCP throughput   {} ({} in {:.2} s)",
        units::format_rate(r.actual_bps),
        units::format_bytes(r.bytes),
        r.seconds
    )?;
    if let (Some(ratio), Some(ideal)) = (r.transfer_time_ratio, r.ideal_seconds) {
        writeln!(
            out,
            "  transfer time ratio     {ratio:.3} ({:.2} s actual / {ideal:.2} s ideal)",
            r.seconds
        )?;
    }
    if let Some(e) = r.tcp_efficiency_percent {
        writeln!(
            out,
            "  TCP efficiency          {e:.3}% ({} retransmits, ~{} of {} sent)",
            r.retransmits,
            units::format_bytes(r.retransmitted_bytes),
            units::format_bytes(r.bytes_sent + r.retransmitted_bytes)
        )?;
    }
    if let (Some(d), Some(avg)) = (r.buffer_delay_percent, r.avg_rtt_us) {
        writeln!(
            out,
            "  buffer delay            {d:.1}% (average RTT {})",
            us(avg)
        )?;
    }
    for u in &r.unavailable {
        writeln!(out, "  not computed: {u}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(argv: &[&str]) -> anyhow::Result<TestParams> {
        let mut full = vec!["fatpipe-test"];
        full.extend_from_slice(argv);
        let cli = Cli::try_parse_from(full)?;
        plan(&cli.args)
    }

    #[test]
    fn defaults_are_one_tcp_stream_for_ten_seconds() {
        let p = parse(&["h"]).unwrap();
        assert_eq!(p.protocol, Protocol::Tcp);
        assert_eq!(p.streams, 1);
        assert_eq!(p.direction, Direction::Up);
        assert_eq!(p.duration_ms, 10_000);
        assert_eq!(p.length, 128 * 1024);
        assert_eq!(p.interval_ms, 1000);
        assert_eq!(p.window, None);
    }

    #[test]
    fn units_flags_parse() {
        let p = parse(&[
            "h",
            "-P",
            "8",
            "-w",
            "4M",
            "-t",
            "1.5s",
            "-O",
            "1500ms",
            "-i",
            "500ms",
            "-C",
            "bbr",
            "--fq-rate",
            "2.5g",
            "-M",
            "1400",
            "-R",
            "-Z",
        ])
        .unwrap();
        assert_eq!(p.streams, 8);
        assert_eq!(p.window, Some(4 << 20));
        assert_eq!(p.duration_ms, 1500);
        assert_eq!(p.omit_ms, 1500, "1.5 s is three 500 ms intervals");
        assert_eq!(p.interval_ms, 500);
        assert_eq!(p.congestion.as_deref(), Some("bbr"));
        assert_eq!(p.fq_rate, Some(2_500_000_000));
        assert_eq!(p.mss, Some(1400));
        assert_eq!(p.direction, Direction::Down);
        assert!(p.zerocopy);
        let p = parse(&["h", "-O", "1200ms"]).unwrap();
        assert_eq!(p.omit_ms, 2000, "omit rounds up to whole intervals");
        let p = parse(&["h", "-n", "1G", "--bidir"]).unwrap();
        assert_eq!(p.bytes, Some(1 << 30));
        assert_eq!(p.direction, Direction::Both);
    }

    #[test]
    fn udp_defaults_and_limits() {
        let p = parse(&["h", "-u"]).unwrap();
        assert_eq!(p.protocol, Protocol::Udp);
        assert_eq!(p.bitrate, 1_000_000);
        assert_eq!(p.length, 1460);
        let p = parse(&["h", "-u", "-b", "1g", "-l", "64"]).unwrap();
        assert_eq!(p.bitrate, 1_000_000_000);
        assert_eq!(p.length, 64);
        assert!(parse(&["h", "-u", "-l", "63"]).is_err());
        assert!(parse(&["h", "-u", "-l", "64K"]).is_err(), "65536 > 65507");
        assert!(parse(&["h", "-u", "-l", "65507"]).is_ok());
        assert!(parse(&["h", "-b", "1g"]).is_err(), "bitrate needs -u");
        assert!(parse(&["h", "-u", "-Z"]).is_err());
        assert!(parse(&["h", "-u", "--rfc6349"]).is_err());
        assert!(parse(&["h", "--rfc6349", "--no-auto"]).is_ok());
    }

    fn find_max(argv: &[&str]) -> anyhow::Result<FindMaxPlan> {
        let mut full = vec!["fatpipe-test"];
        full.extend_from_slice(argv);
        let cli = Cli::try_parse_from(full)?;
        let p = plan(&cli.args)?;
        let base = TestPlan {
            server: "h".into(),
            addr: "127.0.0.1:5301".parse()?,
            options: ClientOptions::default(),
            params: p.clone(),
        };
        find_max_plan(&cli.args, &p, base)
    }

    #[test]
    fn find_max_takes_a_list_of_lengths_and_the_allowed_loss() {
        let f = find_max(&["h", "-u", "--find-max", "-l", "64,512, 1472,8972,65507"]).unwrap();
        assert_eq!(f.lengths, vec![64, 512, 1472, 8972, 65_507]);
        assert_eq!(f.base.params.length, 64);
        assert!((f.search.loss_max - 0.005).abs() < 1e-12, "0.5% by default");
        assert_eq!(f.search.ceiling, None, "no -b: as fast as the sender can");
        assert_eq!(f.trial, Duration::from_secs(1));
        assert_eq!(f.confirm, Duration::from_secs(10), "-t is the confirmation");
        let f = find_max(&[
            "h",
            "-u",
            "--find-max",
            "--loss-max",
            "0.1%",
            "-b",
            "1g",
            "-P",
            "2",
            "-t",
            "5s",
            "--trial",
            "250ms",
        ])
        .unwrap();
        assert_eq!(f.lengths, vec![1460], "the UDP default length");
        assert!((f.search.loss_max - 0.001).abs() < 1e-12);
        assert_eq!(f.search.ceiling, Some(2e9), "-b per stream, two streams");
        assert_eq!(
            (f.trial, f.confirm),
            (Duration::from_millis(250), Duration::from_secs(5))
        );
        let p = parse(&["h", "-u", "--no-batch"]).unwrap();
        assert!(p.no_batch);
        assert!(!parse(&["h", "-u"]).unwrap().no_batch);
    }

    #[test]
    fn find_max_refuses_what_it_cannot_search() {
        for argv in [
            &["h", "--find-max"][..],
            &["h", "--no-batch"],
            &["h", "-u", "-l", "64,1472"],
            &["h", "-u", "--find-max", "-l", "64,63"],
            &["h", "-u", "--find-max", "-l", "64,70000"],
            &["h", "-u", "--find-max", "--bidir"],
            &["h", "-u", "--find-max", "--json-stream"],
            &["h", "-u", "--find-max", "-n", "1G"],
            &["h", "-u", "--loss-max", "1%"],
        ] {
            let mut full = vec!["fatpipe-test"];
            full.extend_from_slice(argv);
            let refused = match Cli::try_parse_from(full) {
                Err(_) => true,
                Ok(cli) => plan(&cli.args).is_err(),
            };
            assert!(refused, "{argv:?}");
        }
        for argv in [
            &["h", "-u", "--find-max", "--loss-max", "0"][..],
            &["h", "-u", "--find-max", "--loss-max", "60%"],
            &["h", "-u", "--find-max", "--trial", "1ms"],
        ] {
            let err = find_max(argv).unwrap_err();
            assert!(
                err.chain().any(|e| e.is::<crate::exit::UsageError>()),
                "{argv:?}: {err}"
            );
        }
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for argv in [
            &["h", "-P", "0"][..],
            &["h", "-P", "1025"],
            &["h", "-t", "soon"],
            &["h", "-w", "lots"],
            &["h", "-i", "1ms"],
            &["h", "-t", "0"],
        ] {
            let err = parse(argv).unwrap_err();
            assert!(
                err.chain().any(|e| e.is::<crate::exit::UsageError>()),
                "{argv:?}: {err}"
            );
        }
        assert!(parse(&["h", "-P", "1024"]).is_ok());
        assert!(parse(&["h", "-R", "--bidir"]).is_err());
    }

    fn parsed(argv: &[&str]) -> (Args, TestParams) {
        let mut full = vec!["fatpipe-test"];
        full.extend_from_slice(argv);
        let cli = Cli::try_parse_from(full).unwrap();
        let p = plan(&cli.args).unwrap();
        (cli.args, p)
    }

    /// A plan like the lab's 1 Gbit/s × 93 ms link gets on a 4 MiB host.
    fn lab_plan() -> fatpipe_schema::tune::Plan {
        fatpipe_schema::tune::Plan {
            streams: 5,
            per_stream_buffer: 3_538_944,
            set_buffers: true,
            forced_buffers: false,
            congestion: "cubic".into(),
            pacing_rate: Some(200_000_000),
            bdp: Some(11_625_000),
            reason: "auto: …".into(),
            estimate: None,
            window_rate: None,
        }
    }

    fn merged(argv: &[&str]) -> TestParams {
        let (a, mut p) = parsed(argv);
        assert!(wants_auto(&a, &p), "{argv:?}");
        tuning::apply(&auto::merge(&lab_plan(), &overrides(&a, &p)), &mut p);
        p
    }

    #[test]
    fn no_flags_run_the_plan() {
        let p = merged(&["h"]);
        assert_eq!(p.streams, 5);
        assert_eq!(p.window, Some(3_538_944));
        assert_eq!(p.congestion.as_deref(), Some("cubic"));
        assert_eq!(p.fq_rate, Some(200_000_000));
    }

    #[test]
    fn explicit_flags_override_their_part_of_the_plan() {
        let p = merged(&["h", "-P", "3"]);
        assert_eq!(p.streams, 3);
        assert_eq!(p.window, Some(3_538_944));
        // The plan's 1 Gbit/s of pacing spread over the user's 3 streams.
        assert_eq!(p.fq_rate, Some(333_333_333));
        let p = merged(&["h", "-w", "1M", "-C", "bbr"]);
        assert_eq!((p.streams, p.window), (5, Some(1 << 20)));
        assert_eq!(p.congestion.as_deref(), Some("bbr"));
        let p = merged(&["h", "--fq-rate", "1g", "-P", "1"]);
        assert_eq!((p.streams, p.fq_rate), (1, Some(1_000_000_000)));
        assert!(!p.force_buffers);
        // A plan that forces buffers forces them, unless -w names the size.
        let mut forced = lab_plan();
        forced.forced_buffers = true;
        for (argv, force) in [(&["h"][..], true), (&["h", "-w", "8M"], false)] {
            let (a, mut p) = parsed(argv);
            tuning::apply(&auto::merge(&forced, &overrides(&a, &p)), &mut p);
            assert_eq!(p.force_buffers, force, "{argv:?}");
        }
        // -P 1 is a choice, not the default: it still wins.
        let p = merged(&["h", "-P", "1", "-R"]);
        assert_eq!(p.streams, 1);
    }

    #[test]
    fn no_auto_udp_and_all_flags_skip_the_probe() {
        for argv in [
            &["h", "--no-auto"][..],
            &["h", "-u"],
            &["h", "-P", "2", "-w", "1M", "-C", "reno", "--fq-rate", "1g"],
        ] {
            let (a, p) = parsed(argv);
            assert!(!wants_auto(&a, &p), "{argv:?}");
        }
        let (_, p) = parsed(&["h", "--no-auto"]);
        assert_eq!((p.streams, p.window, p.congestion), (1, None, None));
    }

    #[test]
    fn rfc6349_block_names_what_it_could_not_compute() {
        let r = Rfc6349 {
            direction: fatpipe_schema::test::Direction::Up,
            baseline_rtt_us: Some(40_000),
            bottleneck_bps: Some(900_000_000),
            bottleneck_lower_bound: true,
            packet_bytes: 1500,
            mss: 1448,
            bdp_bytes: Some(4_500_000),
            max_tcp_bps: Some(868_800_000.0),
            bytes: 1_000_000_000,
            seconds: 10.0,
            actual_bps: 800_000_000.0,
            ideal_seconds: None,
            transfer_time_ratio: None,
            bytes_sent: 1_000_000_000,
            retransmits: 0,
            retransmitted_bytes: 0,
            tcp_efficiency_percent: Some(100.0),
            avg_rtt_us: Some(50_000),
            buffer_delay_percent: Some(25.0),
            unavailable: vec!["transfer_time_ratio: lower bound".into()],
            notes: vec![],
        };
        let mut out = Vec::new();
        print_rfc6349(&mut out, &r).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("baseline RTT            40.0 ms"), "{text}");
        assert!(text.contains("bottleneck bandwidth    at least "), "{text}");
        assert!(!text.contains("transfer time ratio     "), "{text}");
        assert!(text.contains("not computed: transfer_time_ratio: lower bound"));
        assert!(text.contains("TCP efficiency          100.000%"), "{text}");
        assert!(text.contains("buffer delay            25.0% (average RTT 50.0 ms)"));
    }
}
