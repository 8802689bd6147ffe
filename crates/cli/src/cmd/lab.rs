//! `fatpipe lab`: bring up, drive and remove emulated long fat networks.
//!
//! Glue only: flags are parsed with `fatpipe_schema::units` into a
//! `fatpipe_lab::LinkSpec` or `LinkChange`, the library does the work, and
//! this module renders what comes back. `lab exec` replaces this process
//! with `ip netns exec`, so the command's exit code is the user's to see.
//! `run-link` is the hidden entry point of the forwarder process that
//! `lab up` starts in the background.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use fatpipe_lab::{DirStats, End, Lab, LabStats, LinkChange, LinkSpec, QueueSpec, UpOptions};
use fatpipe_schema::units;

/// Arguments of `fatpipe lab`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Bring up a link between namespaces a and b (returns when it carries packets).
    Up(UpArgs),
    /// Run a command inside one end: `fatpipe lab exec fp0 b -- iperf3 -s`.
    Exec {
        /// The lab.
        name: String,
        /// Which end: a or b.
        end: String,
        /// The command and its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        command: Vec<OsString>,
    },
    /// List the labs that are up.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Packets, bytes, losses, queue drops, peak queue and late deliveries.
    Stats {
        /// The lab.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Change a running link: `--loss 0.1% --rtt 200ms`, `--down 5s`, `--corrupt 1e-6`, `--tamper 1e-7`.
    Set(SetArgs),
    /// Remove a lab (namespaces, forwarder, processes inside), or all of them.
    Down {
        /// The lab.
        name: Option<String>,
        /// Remove every lab on this machine, whoever started it.
        #[arg(long, conflicts_with = "name")]
        all: bool,
    },
    /// The forwarder process (started by `lab up`).
    #[command(hide = true)]
    RunLink {
        /// The lab.
        name: String,
    },
}

#[derive(Debug, clap::Args)]
struct UpArgs {
    /// Name of the lab (namespaces fp-NAME-a and fp-NAME-b).
    #[arg(default_value = "fp0")]
    name: String,
    /// Round-trip propagation delay (half each way).
    #[arg(long, default_value = "0ms", value_parser = duration)]
    rtt: Duration,
    /// Bottleneck rate each way (e.g. 1gbit, 10G); 0 or "unlimited" for none.
    #[arg(long, default_value = "unlimited", value_parser = rate)]
    rate: u64,
    /// Different rates a to b and b to a: UP/DOWN, e.g. 100M/1G.
    #[arg(long, value_parser = asym)]
    asym_rate: Option<(u64, u64)>,
    /// Random loss per segment, each way (0.01%, 1e-4).
    #[arg(long, default_value = "0", value_parser = probability)]
    loss: f64,
    /// Mean loss burst in segments (Gilbert-Elliott); 1 means independent.
    #[arg(long, default_value_t = 1.0)]
    loss_burst: f64,
    /// Delay variation: the RTT stays within rtt ± jitter, never reordered.
    #[arg(long, default_value = "0ms", value_parser = duration)]
    jitter: Duration,
    /// Drop-tail queue in front of the bottleneck: 1bdp, 50ms, 16MB, unlimited.
    #[arg(long, default_value = "1bdp", value_parser = queue)]
    queue: QueueSpec,
    /// MTU of both ends (1500, 9000, ...).
    #[arg(long, default_value_t = 1500)]
    mtu: u32,
    /// Bytes of framing each packet costs the bottleneck on top of its IP
    /// bytes: 38 is Ethernet's (a 1 Gbit/s link then carries what a 1 Gbit/s
    /// NIC does); 0 counts IP bytes only.
    #[arg(long, value_name = "BYTES", default_value_t = fatpipe_lab::ETHERNET_OVERHEAD)]
    overhead: u32,
    /// Bit error rate: each bit flipped with this probability (1e-6).
    #[arg(long, default_value = "0", value_parser = probability)]
    corrupt: f64,
    /// Payload bit error rate the checksums miss: each payload bit flipped
    /// with this probability and the TCP/UDP checksum fixed up (a faulty
    /// NIC or middlebox); only end-to-end checks catch it (1e-7).
    #[arg(long, value_name = "BER", default_value = "0", value_parser = probability)]
    tamper: f64,
    /// Seed of the random loss, jitter and corruption (default: from the clock).
    #[arg(long)]
    seed: Option<u64>,
    /// Remove the lab when process PID exits (tests and scripts).
    #[arg(long, value_name = "PID")]
    owner: Option<u32>,
}

#[derive(Debug, clap::Args)]
struct SetArgs {
    /// The lab.
    name: String,
    /// New round-trip time.
    #[arg(long, value_parser = duration)]
    rtt: Option<Duration>,
    /// New rate each way.
    #[arg(long, value_parser = rate)]
    rate: Option<u64>,
    /// New rates UP/DOWN.
    #[arg(long, value_parser = asym, conflicts_with = "rate")]
    asym_rate: Option<(u64, u64)>,
    /// New random loss.
    #[arg(long, value_parser = probability)]
    loss: Option<f64>,
    /// New mean loss burst length.
    #[arg(long)]
    loss_burst: Option<f64>,
    /// New jitter.
    #[arg(long, value_parser = duration)]
    jitter: Option<Duration>,
    /// New queue limit.
    #[arg(long, value_parser = queue)]
    queue: Option<QueueSpec>,
    /// New bit error rate.
    #[arg(long, value_parser = probability)]
    corrupt: Option<f64>,
    /// New undetected payload bit error rate (checksums fixed up).
    #[arg(long, value_name = "BER", value_parser = probability)]
    tamper: Option<f64>,
    /// New per-packet framing overhead in bytes (38 Ethernet, 0 IP only).
    #[arg(long, value_name = "BYTES")]
    overhead: Option<u32>,
    /// Cut the link for this long, starting now.
    #[arg(long, value_parser = duration)]
    down: Option<Duration>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.cmd {
        Cmd::Up(a) => up(a),
        Cmd::Exec { name, end, command } => exec(&name, &end, command),
        Cmd::List { json } => list(json),
        Cmd::Stats { name, json } => stats(&name, json),
        Cmd::Set(a) => set(a),
        Cmd::Down { name, all } => down(name, all),
        Cmd::RunLink { name } => fatpipe_lab::run_link(&name).map_err(lab_err),
    }
}

fn up(a: UpArgs) -> anyhow::Result<()> {
    let (rate_up, rate_down) = a.asym_rate.unwrap_or((a.rate, a.rate));
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let spec = LinkSpec {
        rtt: a.rtt,
        rate_up,
        rate_down,
        loss: a.loss,
        loss_burst: a.loss_burst,
        jitter: a.jitter,
        queue: a.queue,
        mtu: a.mtu,
        overhead: a.overhead,
        corrupt: a.corrupt,
        tamper: a.tamper,
        seed,
    };
    let opts = UpOptions {
        owner: a.owner,
        ..UpOptions::default()
    };
    let lab = Lab::up(&a.name, &spec, &opts).map_err(lab_err)?;
    println!("lab {} is up: {}", lab.name(), spec.summary());
    for end in [End::A, End::B] {
        println!(
            "  {}: netns {:<14} {:<15} {}",
            end.letter(),
            lab.netns(end),
            lab.addr(end),
            lab.addr6(end)
        );
    }
    println!(
        "  try: fatpipe lab exec {0} b -- iperf3 -s -D; fatpipe lab exec {0} a -- iperf3 -c {1}",
        lab.name(),
        lab.addr(End::B)
    );
    lab.detach();
    Ok(())
}

fn exec(name: &str, end: &str, command: Vec<OsString>) -> anyhow::Result<()> {
    let end: End = end.parse().map_err(lab_err)?;
    let lab = Lab::open(name).map_err(lab_err)?;
    let mut it = command.into_iter();
    let program = it
        .next()
        .ok_or_else(|| crate::exit::usage("lab exec: give a command after '--'"))?;
    let mut cmd = lab.command(end, program);
    cmd.args(it);
    // Only returns if exec failed.
    let err = cmd.exec();
    Err(err).context("run ip netns exec (iproute2)")
}

fn list(json: bool) -> anyhow::Result<()> {
    let labs = fatpipe_lab::list();
    if json {
        let v: Vec<serde_json::Value> = labs
            .iter()
            .map(|l| {
                let end = |e: End| {
                    l.record.as_ref().map(|r| {
                        serde_json::json!({
                            "netns": r.netns(e),
                            "ipv4": r.addr(e).to_string(),
                            "ipv6": r.addr6(e).to_string(),
                        })
                    })
                };
                serde_json::json!({
                    "name": l.name,
                    "up": l.forwarder.is_some(),
                    "forwarder_pid": l.forwarder,
                    "a": end(End::A),
                    "b": end(End::B),
                    "spec": l.record.as_ref().map(|r| &r.spec),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if labs.is_empty() {
        println!("no labs are up");
        return Ok(());
    }
    println!("{:<12} {:<6} {:<15} {:<15} link", "NAME", "STATE", "A", "B");
    for l in labs {
        let state = if l.forwarder.is_some() { "up" } else { "stale" };
        match &l.record {
            Some(r) => println!(
                "{:<12} {:<6} {:<15} {:<15} {}",
                l.name,
                state,
                r.addr(End::A),
                r.addr(End::B),
                r.spec.summary()
            ),
            None => println!(
                "{:<12} {:<6} (left over; 'fatpipe lab down {}' removes it)",
                l.name, state, l.name
            ),
        }
    }
    Ok(())
}

fn stats(name: &str, json: bool) -> anyhow::Result<()> {
    let s = fatpipe_lab::stats(name).map_err(lab_err)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", render_stats(&s));
    }
    Ok(())
}

fn set(a: SetArgs) -> anyhow::Result<()> {
    let change = LinkChange {
        rtt: a.rtt,
        rate: a.asym_rate.or(a.rate.map(|r| (r, r))),
        loss: a.loss,
        loss_burst: a.loss_burst,
        jitter: a.jitter,
        queue: a.queue,
        corrupt: a.corrupt,
        tamper: a.tamper,
        overhead: a.overhead,
        down: a.down,
    };
    if change == LinkChange::default() {
        return Err(crate::exit::usage(
            "lab set: give at least one of --rtt --rate --asym-rate --loss --loss-burst --jitter --queue --corrupt --tamper --overhead --down",
        ));
    }
    let spec = fatpipe_lab::set(&a.name, &change).map_err(lab_err)?;
    println!("lab {}: {}", a.name, spec.summary());
    if let Some(d) = a.down {
        println!("lab {}: down for {}", a.name, units::format_duration(d));
    }
    Ok(())
}

fn down(name: Option<String>, all: bool) -> anyhow::Result<()> {
    if all {
        let names = fatpipe_lab::down_all().map_err(lab_err)?;
        if names.is_empty() {
            println!("no labs were up");
        } else {
            println!("removed {}", names.join(", "));
        }
        return Ok(());
    }
    let Some(name) = name else {
        return Err(crate::exit::usage("lab down: give a lab name or --all"));
    };
    fatpipe_lab::down(&name).map_err(lab_err)?;
    println!("lab {name} is down");
    Ok(())
}

/// The `lab stats` table, one column per direction.
fn render_stats(s: &LabStats) -> String {
    let mut out = format!(
        "lab {}: {}; up {:.1} s; UDP GSO {}{}\n",
        s.name,
        s.spec.summary(),
        s.uptime_s,
        if s.udp_gso { "on" } else { "off" },
        s.down_left_s
            .map(|d| format!("; DOWN for {d:.1} s more"))
            .unwrap_or_default()
    );
    out += &format!("{:<22} {:>16} {:>16}\n", "", "a -> b", "b -> a");
    type Row = (&'static str, fn(&DirStats) -> String);
    let rows: [Row; 16] = [
        ("frames in", |d| d.frames_in.to_string()),
        ("segments", |d| d.link.segments.to_string()),
        ("bytes", |d| units::format_bytes(d.link.bytes)),
        ("delivered segments", |d| d.link.delivered.to_string()),
        ("random losses", |d| d.link.random_losses.to_string()),
        ("queue drops", |d| d.link.queue_drops.to_string()),
        ("down drops", |d| d.link.down_drops.to_string()),
        ("corrupted", |d| d.link.corrupted.to_string()),
        ("tampered (undetected)", |d| d.link.tampered.to_string()),
        ("peak queue", |d| {
            units::format_bytes(d.link.peak_queue_bytes)
        }),
        ("backlog now", |d| units::format_bytes(d.backlog_bytes)),
        ("late (>1 ms)", |d| d.late.to_string()),
        ("mean lateness", |d| {
            let ns = d.lateness_ns.checked_div(d.frames_out).unwrap_or(0);
            units::format_duration(Duration::from_nanos(ns))
        }),
        ("max lateness", |d| {
            units::format_duration(Duration::from_nanos(d.max_lateness_ns))
        }),
        ("cut super-packets", |d| d.split_frames.to_string()),
        ("buffer overflows", |d| d.overflow_drops.to_string()),
    ];
    for (label, f) in rows {
        out += &format!("{label:<22} {:>16} {:>16}\n", f(&s.a_to_b), f(&s.b_to_a));
    }
    out
}

fn lab_err(e: fatpipe_lab::Error) -> anyhow::Error {
    if e.is_usage() {
        crate::exit::usage(e.to_string())
    } else {
        anyhow::Error::new(e)
    }
}

fn duration(s: &str) -> Result<Duration, String> {
    units::parse_duration(s).map_err(|e| e.to_string())
}

fn rate(s: &str) -> Result<u64, String> {
    if s.eq_ignore_ascii_case("unlimited") || s.eq_ignore_ascii_case("none") {
        return Ok(0);
    }
    units::parse_rate(s).map_err(|e| e.to_string())
}

fn asym(s: &str) -> Result<(u64, u64), String> {
    let (up, down) = s
        .split_once('/')
        .ok_or_else(|| format!("'{s}': use UP/DOWN, e.g. 100M/1G"))?;
    Ok((rate(up)?, rate(down)?))
}

fn probability(s: &str) -> Result<f64, String> {
    units::parse_probability(s).map_err(|e| e.to_string())
}

fn queue(s: &str) -> Result<QueueSpec, String> {
    QueueSpec::parse(s).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct T {
        #[command(flatten)]
        args: Args,
    }

    fn parse(args: &[&str]) -> Result<Cmd, clap::Error> {
        T::try_parse_from(std::iter::once("lab").chain(args.iter().copied())).map(|t| t.args.cmd)
    }

    #[test]
    fn up_flags_parse_through_units() {
        let Ok(Cmd::Up(u)) = parse(&[
            "up",
            "t1",
            "--rtt",
            "93ms",
            "--rate",
            "1gbit",
            "--loss",
            "0.01%",
            "--jitter",
            "2ms",
            "--queue",
            "50ms",
            "--mtu",
            "9000",
            "--asym-rate",
            "100M/1G",
        ]) else {
            panic!("up should parse");
        };
        assert_eq!(u.name, "t1");
        assert_eq!(u.rtt, Duration::from_millis(93));
        assert_eq!(u.rate, 1_000_000_000);
        assert_eq!(u.loss, 0.0001);
        assert_eq!(u.queue, QueueSpec::Time(Duration::from_millis(50)));
        assert_eq!(u.asym_rate, Some((100_000_000, 1_000_000_000)));
        let Ok(Cmd::Up(d)) = parse(&["up"]) else {
            panic!("defaults");
        };
        assert_eq!(
            (d.name.as_str(), d.rate, d.queue),
            ("fp0", 0, QueueSpec::Bdp(1.0))
        );
        // Ethernet-true rates unless told otherwise.
        assert_eq!(d.overhead, 38);
        let Ok(Cmd::Up(ip)) = parse(&["up", "--overhead", "0"]) else {
            panic!("--overhead 0");
        };
        assert_eq!(ip.overhead, 0);
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for bad in [
            &["up", "--rtt", "93 parsecs"][..],
            &["up", "--rate", "1gbyte"],
            &["up", "--loss", "150%"],
            &["up", "--asym-rate", "1G"],
            &["up", "--overhead", "-1"],
            &["down", "x", "--all"],
            &["exec", "x", "a"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn exec_keeps_the_command_verbatim() {
        let Ok(Cmd::Exec { name, end, command }) =
            parse(&["exec", "fp0", "b", "--", "iperf3", "-s", "-p", "5201"])
        else {
            panic!("exec should parse");
        };
        assert_eq!((name.as_str(), end.as_str()), ("fp0", "b"));
        assert_eq!(command, ["iperf3", "-s", "-p", "5201"].map(OsString::from));
    }

    #[test]
    fn set_takes_live_changes() {
        let Ok(Cmd::Set(s)) = parse(&[
            "set",
            "fp0",
            "--loss",
            "0.1%",
            "--rtt",
            "200ms",
            "--down",
            "5s",
            "--overhead",
            "24",
            "--tamper",
            "1e-7",
        ]) else {
            panic!("set should parse");
        };
        assert_eq!(s.overhead, Some(24));
        assert_eq!(s.tamper, Some(1e-7));
        assert_eq!(s.loss, Some(0.001));
        assert_eq!(s.rtt, Some(Duration::from_millis(200)));
        assert_eq!(s.down, Some(Duration::from_secs(5)));
    }

    #[test]
    fn stats_table_has_both_directions() {
        let mut s = LabStats {
            name: "t".into(),
            spec: LinkSpec::default(),
            uptime_s: 1.0,
            down_left_s: None,
            udp_gso: true,
            a_to_b: DirStats::default(),
            b_to_a: DirStats::default(),
        };
        s.a_to_b.link.random_losses = 17;
        s.b_to_a.link.tampered = 3;
        let t = render_stats(&s);
        assert!(t
            .lines()
            .any(|l| l.starts_with("tampered (undetected)") && l.ends_with(" 3")));
        assert!(t.contains("a -> b") && t.contains("b -> a"));
        assert!(t
            .lines()
            .any(|l| l.starts_with("random losses") && l.contains("17")));
    }
}
