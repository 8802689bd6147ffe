//! `fatpipe path HOST`: probe the path to a `fatpipe server` — RTT, path
//! MTU, bottleneck rate, loss, BDP — and say what auto-tuning would choose.
//!
//! Two phases, as elsewhere in the binary: [`config`] validates the raw
//! [`Args`] into a [`ProbeConfig`] without touching the network (tested
//! below), then `fatpipe_probe` runs the probe and builds the
//! [`PathReport`]; this module only renders it, as a few lines for people
//! or one JSON document (`--json`, schema `fatpipe.path`).

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fatpipe_archive::RunKind;
use fatpipe_audit::host::{is_privileged, Host};
use fatpipe_engine::ClientOptions;
use fatpipe_probe::{self as probe, ProbeConfig, ProbeError};
use fatpipe_schema::path::PathReport;
use fatpipe_schema::units;
use fatpipe_tune::Policy;

use super::archive::Recorder;

use fatpipe_engine::server::DEFAULT_PORT;

/// Most echoes `--count` accepts.
const MAX_COUNT: u32 = 10_000;

/// Arguments of `fatpipe path`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Server: HOST, HOST:PORT or [IPv6]:PORT.
    pub host: String,
    /// Server port when HOST has none.
    #[arg(short = 'p', long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// RTT echoes to send (20 ms apart).
    #[arg(short = 'c', long, default_value_t = 10)]
    pub count: u32,
    /// Packet trains for the bottleneck estimate (per round: up to 3 rounds
    /// while they disagree).
    #[arg(long, default_value_t = 10)]
    pub trains: u32,
    /// Measure the server → client direction: the server sends the
    /// packet trains and this host times them (RTT and MTU as usual).
    #[arg(short = 'R', long)]
    pub reverse: bool,
    /// Print one JSON report (schema fatpipe.path).
    #[arg(long)]
    pub json: bool,
    /// Pre-shared key file (must match the server's).
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// Store the result in the archive: this SQLite file or postgres://
    /// URL, or with no value $FATPIPE_ARCHIVE, else the user's data
    /// directory (also on whenever FATPIPE_ARCHIVE is set). Give it after
    /// HOST, or as --archive=LOCATION.
    #[arg(long, value_name = "LOCATION", num_args = 0..=1, default_missing_value = "")]
    pub archive: Option<String>,
}

/// Probes the path and prints what it found.
pub fn run(args: Args) -> anyhow::Result<()> {
    let rec = Recorder::new(args.archive.as_deref(), RunKind::Path, &args.host)?;
    let result = measure(&args, rec.as_ref());
    if let (Some(r), Err(e)) = (&rec, &result) {
        r.failed(e);
    }
    result
}

fn measure(args: &Args, rec: Option<&Recorder>) -> anyhow::Result<()> {
    let outcome = probe_host(
        &args.host,
        args.port,
        args.key_file.as_deref(),
        args.count,
        args.trains,
        args.reverse,
    )?;
    let local = Host::live().limits(is_privileged());
    let report = probe::report(&outcome, &args.host, local, |facts, sender, receiver| {
        fatpipe_tune::plan(facts, sender, receiver, &Policy::default())
    });
    let mut out = std::io::stdout().lock();
    if args.json {
        crate::cmd::common::json_pretty(&mut out, &report)?;
    } else {
        out.write_all(render(&report).as_bytes())?;
    }
    out.flush()?;
    if let Some(r) = rec {
        r.path(&report)?;
    }
    Ok(())
}

/// Probes the server at `host` (HOST, HOST:PORT or [IPv6]:PORT; `port`
/// when it has none) with `echoes` echoes and `trains` trains: resolves
/// it as `test` does, loads the key, and turns failures into one line
/// (exit 2 for a bad host, flag or key, 1 when the probe fails). Shared
/// with `fatpipe tune --for`. `reverse` has the server send the trains.
pub(crate) fn probe_host(
    host: &str,
    port: u16,
    key_file: Option<&Path>,
    echoes: u32,
    trains: u32,
    reverse: bool,
) -> anyhow::Result<probe::ProbeOutcome> {
    let addr = super::common::resolve(host, port)?;
    let key = match key_file {
        Some(path) => {
            Some(fatpipe_engine::load_key(path).map_err(|e| crate::exit::usage(e.to_string()))?)
        }
        None => None,
    };
    let mut cfg = config(echoes, trains, addr, key)?;
    cfg.reverse = reverse;
    probe::run(&cfg).map_err(|e| classify(e, host))
}

/// Validates the flags into a probe configuration.
fn config(
    count: u32,
    trains: u32,
    addr: SocketAddr,
    key: Option<fatpipe_proto::Key>,
) -> anyhow::Result<ProbeConfig> {
    if count == 0 || count > MAX_COUNT {
        return Err(crate::exit::usage(format!(
            "--count must be 1..={MAX_COUNT}"
        )));
    }
    let max_trains = fatpipe_probe::wire::MAX_TRAINS;
    if trains == 0 || trains > max_trains {
        return Err(crate::exit::usage(format!(
            "--trains must be 1..={max_trains}"
        )));
    }
    let mut cfg = ProbeConfig::new(
        addr,
        ClientOptions {
            key,
            ..ClientOptions::default()
        },
    );
    cfg.echoes = count;
    cfg.trains = trains;
    Ok(cfg)
}

/// The report for people, one line per measurement.
fn render(r: &PathReport) -> String {
    let d = Duration::from_secs_f64;
    let mut s = format!(
        "fatpipe path {} ({}){}, probed in {}\n",
        r.server,
        r.remote,
        if r.reverse {
            " in reverse: rate and train loss are server → this host"
        } else {
            ""
        },
        units::format_duration(d(r.duration_secs))
    );
    s += &format!(
        "rtt       min {}  avg {}  max {}  stddev {}  ({} of {} echoes)\n",
        units::format_duration(d(r.rtt.min_secs)),
        units::format_duration(d(r.rtt.avg_secs)),
        units::format_duration(d(r.rtt.max_secs)),
        units::format_duration(d(r.rtt.stddev_secs)),
        r.rtt.received,
        r.rtt.sent
    );
    let route = match (r.mtu.route_mtu, &r.mtu.route_mtu_error) {
        (Some(m), _) => format!("route {m} B"),
        (None, Some(e)) => format!("route unknown: {e}"),
        (None, None) => "route unknown".into(),
    };
    s += &match r.mtu.path_mtu {
        Some(m) => format!(
            "mtu       {m} B passes with DF ({route}; probes sent: {})\n",
            r.mtu.probes
        ),
        None => format!("mtu       unknown ({route})\n"),
    };
    s += &match &r.bottleneck {
        Some(b) => format!(
            "rate      {}{} bottleneck, confidence {} ({:.2}; {}–{} over {} of {} trains of {} × {} B)\n",
            if b.lower_bound { "≥ " } else { "~" },
            units::format_rate(b.rate as f64),
            b.confidence_label,
            b.confidence,
            units::format_rate(b.low as f64),
            units::format_rate(b.high as f64),
            b.used,
            b.trains,
            b.packets_per_train,
            b.packet_bytes
        ),
        None => "rate      unknown (no train gave an estimate)\n".into(),
    };
    s += &format!(
        "loss      {} of {} echoes, {} of {} train packets\n",
        r.loss.echo_lost, r.loss.echo_sent, r.loss.train_lost, r.loss.train_sent
    );
    if let (Some(bdp), Some(rate)) = (r.bdp, r.facts.bottleneck_rate) {
        s += &format!(
            "bdp       {} ({} × {}); one stream needs a window of {}, i.e. tcp_rmem/tcp_wmem max ≥ {} at both ends\n",
            units::format_bytes(bdp),
            units::format_rate(rate as f64),
            units::format_duration(d(r.rtt.min_secs)),
            units::format_bytes(r.single_stream_window.unwrap_or(bdp)),
            units::format_bytes(r.single_stream_buffer.unwrap_or(bdp * 2)),
        );
    }
    if let Some(p) = &r.plan {
        s += &format!("{}\n", p.reason);
    }
    for w in &r.warnings {
        s += &format!("warning: {w}\n");
    }
    s
}

/// Auth failures are the user's to fix (exit 2); the rest is exit 1.
fn classify(e: ProbeError, host: &str) -> anyhow::Error {
    if e.is_auth() {
        crate::exit::usage(format!("{host}: {e}"))
    } else {
        anyhow::Error::new(e).context(format!("path to {host}"))
    }
}

#[cfg(test)]
mod tests {
    use super::super::common::resolve;
    use super::*;

    fn addr() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 5301))
    }

    #[test]
    fn count_and_trains_are_checked() {
        let cfg = config(25, 4, addr(), None).unwrap();
        assert_eq!((cfg.echoes, cfg.trains), (25, 4));
        for (c, t) in [(0, 10), (MAX_COUNT + 1, 10), (10, 0), (10, 65)] {
            let e = config(c, t, addr(), None).unwrap_err();
            assert!(e.is::<crate::exit::UsageError>(), "{c} {t}: {e}");
        }
    }

    #[test]
    fn hosts_resolve_or_say_why() {
        assert_eq!(
            resolve("127.0.0.1", 7).unwrap(),
            "127.0.0.1:7".parse().unwrap()
        );
        assert_eq!(
            resolve("127.0.0.1:9", 7).unwrap(),
            "127.0.0.1:9".parse().unwrap()
        );
        assert_eq!(resolve("[::1]:9", 7).unwrap(), "[::1]:9".parse().unwrap());
        assert_eq!(resolve("::1", 7).unwrap(), "[::1]:7".parse().unwrap());
        for bad in [
            "",
            ":5",
            "[::1",
            "[::1]x",
            "host:port",
            "no-such-host.invalid",
        ] {
            let e = resolve(bad, 7).unwrap_err();
            assert!(e.is::<crate::exit::UsageError>(), "{bad}: {e}");
        }
    }

    #[test]
    fn render_shows_every_measurement() {
        let json = r#"{"schema":"fatpipe.path","version":1,"server":"lab","remote":"198.18.0.2:5301",
          "rtt":{"sent":10,"received":10,"min_secs":0.0401,"avg_secs":0.0403,"max_secs":0.0409,"stddev_secs":0.0002},
          "mtu":{"path_mtu":1500,"route_mtu":1500,"route_mtu_error":null,"probes":1},
          "bottleneck":{"rate":1000000000,"low":980000000,"high":1020000000,"confidence":0.93,
            "confidence_label":"high","lower_bound":false,"trains":10,"used":9,"outliers":1,"rejected":0,
            "packet_bytes":1500,"packets_per_train":400,"kernel_timestamps":true},
          "loss":{"echo_sent":10,"echo_lost":0,"train_sent":4000,"train_lost":2,"rate":0.0005},
          "bdp":5012500,"single_stream_window":5012500,"single_stream_buffer":10025000,
          "facts":{"rtt_secs":0.0401,"bottleneck_rate":1000000000,"loss_rate":0.0005,"mtu":1500},
          "plan":null,"warnings":["a warning"],"duration_secs":1.5}"#;
        let r: PathReport = serde_json::from_str(json).unwrap();
        let text = render(&r);
        for want in [
            "min 40.1 ms",
            "1500 B passes",
            "~1.00 Gbit/s bottleneck, confidence high",
            "9 of 10 trains of 400 × 1500 B",
            "0 of 10 echoes, 2 of 4000 train packets",
            "bdp       5.01 MB",
            "≥ 10.0 MB",
            "warning: a warning",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }
}
