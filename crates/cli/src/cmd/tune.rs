//! `fatpipe tune`: audit this host against a target rate × RTT, print a
//! sysctl snippet for Linux, FreeBSD or macOS, or apply/revert the Linux one.
//!
//! Glue only: `fatpipe_audit` collects, judges and applies; this module
//! parses the flags (quantities through `fatpipe_schema::units`, so a bad
//! `--rate` is one line and exit 2), picks the mode and renders. The audit
//! never fails the command: findings are information, so it exits 0; only
//! a failed apply, revert or disk test exits 1.
//!
//!
//! `--for HOST[:PORT]` probes a `fatpipe server` first (the same probe,
//! resolver and key handling as `fatpipe path`) and audits for the path it
//! measured: the probe's RTT and bottleneck rate become the target (a flag
//! given beside it wins for its part; `fatpipe_audit::peer` holds the rules),
//! its loss and path MTU become findings, and the peer's limits, which its
//! probe service reports, are judged too. A probe that fails is one line
//! and exit 1 (exit 2 for a bad host or key), as for `fatpipe path`.

use std::io::Write;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use fatpipe_audit::apply::DEFAULT_BACKUP_DIR;
use fatpipe_audit::emit::Os;
use fatpipe_audit::host::{is_privileged, Host};
use fatpipe_audit::peer::{self, Given};
use fatpipe_audit::rules::{audit, linux_settings, Target};
use fatpipe_audit::{apply, disk, emit};
use fatpipe_engine::server::DEFAULT_PORT;
use fatpipe_schema::tune::{
    Audit, AuditTarget, Finding, Observed, PathFacts, PeerAudit, Severity, ValueSource,
};
use fatpipe_schema::units::{parse_duration, parse_rate, parse_size};
use fatpipe_tune::{plan, Policy};

use crate::exit::usage;

/// Arguments of `fatpipe tune`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Rate the host should fill, in bit/s (e.g. 10gbit, 100g) [default:
    /// 10gbit, or the rate --for measures].
    #[arg(long)]
    rate: Option<String>,
    /// Round-trip time of the paths it serves (e.g. 100ms) [default: 100ms,
    /// or the RTT --for measures].
    #[arg(long)]
    rtt: Option<String>,
    /// Probe this `fatpipe server` (HOST, HOST:PORT or [IPv6]:PORT) and
    /// audit for the path measured; also judges the peer's limits.
    #[arg(long = "for", value_name = "HOST[:PORT]", conflicts_with = "revert")]
    for_host: Option<String>,
    /// Server port for --for when HOST has none.
    #[arg(short = 'p', long, default_value_t = DEFAULT_PORT, requires = "for_host")]
    port: u16,
    /// Pre-shared key file for --for (must match the server's).
    #[arg(long, value_name = "FILE", requires = "for_host")]
    key_file: Option<PathBuf>,
    /// Check only this network interface (default: every one with a device).
    #[arg(long, value_name = "IFACE")]
    dev: Option<String>,
    /// Measure sequential write and read throughput of this directory.
    #[arg(long, value_name = "DIR")]
    disk: Option<PathBuf>,
    /// Bytes to write and read for --disk (e.g. 1G, 256M).
    #[arg(long, value_name = "SIZE", default_value = "1G", requires = "disk")]
    disk_size: String,
    /// Print the audit as JSON (the schema in fatpipe_schema::tune).
    #[arg(long, conflicts_with_all = ["emit", "apply", "revert"])]
    json: bool,
    /// Print a sysctl.conf snippet for linux, freebsd or macos.
    #[arg(long, value_name = "OS", conflicts_with_all = ["apply", "revert"])]
    emit: Option<String>,
    /// Apply the Linux settings now (root), saving the old values first.
    #[arg(long, conflicts_with = "revert")]
    apply: bool,
    /// Restore the values saved by the latest --apply (root).
    #[arg(long)]
    revert: bool,
    /// Where --apply saves backups and --revert finds them.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_BACKUP_DIR)]
    backup_dir: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let given = given(&args)?;
    let os: Option<Os> = match &args.emit {
        Some(os) => Some(os.parse().map_err(usage)?),
        None => None,
    };
    if args.apply || args.revert {
        if !cfg!(target_os = "linux") {
            return Err(usage(
                "--apply and --revert work on Linux only; use --emit for other systems",
            ));
        }
        if !is_privileged() {
            return Err(usage(format!(
                "--{} writes /proc/sys and needs root: run it with sudo",
                if args.apply { "apply" } else { "revert" }
            )));
        }
        if args.revert {
            return run_revert(&args);
        }
    }
    let disk_bytes = parse_size(&args.disk_size).map_err(|e| usage(e.to_string()))?;
    let host = Host::live();
    let facts = host.collect(args.dev.as_deref());
    if let Some(dev) = &args.dev {
        if facts.nics.iter().all(|n| n.mtu.known().is_none()) {
            return Err(usage(format!(
                "--dev {dev}: no such interface under /sys/class/net"
            )));
        }
    }

    // The probe comes after every check of the flags, so a typo costs no
    // round trips.
    let probed = match &args.for_host {
        Some(peer) => {
            let outcome = super::path::probe_host(
                peer,
                args.port,
                args.key_file.as_deref(),
                PROBE_ECHOES,
                PROBE_TRAINS,
                false,
            )?;
            Some((peer.as_str(), fatpipe_probe::probed(&outcome), outcome))
        }
        None => None,
    };
    let (target, record) = match &probed {
        Some((peer, p, _)) => peer::target_for(peer, p, given),
        None => peer::target_from_flags(given),
    };

    if let Some(os) = os {
        let text = match os {
            Os::Linux => emit::linux(&target, &linux_settings(&target, &facts)),
            Os::FreeBsd => emit::freebsd(&target),
            Os::MacOs => emit::macos(&target),
        };
        return out(&(comment_source(&record) + &text));
    }
    if args.apply {
        return run_apply(&target, &record, &args);
    }

    let disk = match &args.disk {
        Some(dir) => Some(disk::measure(dir, disk_bytes).context("tune --disk")?),
        None => None,
    };
    let mut findings = audit(&target, &facts, disk.as_ref());
    let nic_mtu = facts.nics.first().and_then(|n| n.mtu.known().copied());
    let (path, peer_limits, peer_audit) = match &probed {
        Some((name, p, o)) => {
            findings.extend(peer::path_findings(p, &facts));
            let path = PathFacts {
                rtt_secs: target.rtt.as_secs_f64(),
                bottleneck_rate: Some(target.rate),
                loss_rate: p.loss_rate,
                mtu: p.mtu.as_ref().ok().copied().or(nic_mtu).unwrap_or(1500),
                loss_packets: 0,
            };
            let audit = PeerAudit {
                server: name.to_string(),
                remote: p.remote.clone(),
                findings: peer::peer_findings(&target, &o.peer_limits),
            };
            (path, o.peer_limits.clone().ok(), Some(audit))
        }
        None => (
            PathFacts {
                rtt_secs: target.rtt.as_secs_f64(),
                bottleneck_rate: Some(target.rate),
                loss_rate: 0.0,
                mtu: nic_mtu.unwrap_or(1500),
                loss_packets: 0,
            },
            None,
            None,
        ),
    };
    let policy = Policy::default();
    let mut planned = match (host.limits(is_privileged()).ok(), peer_limits) {
        (Some(l), Some(p)) => Some(plan(&path, &l, &p, &policy)),
        (Some(l), None) => Some(plan(&path, &l, &l, &policy)),
        (None, Some(p)) => Some(plan(&path, &p, &p, &policy)),
        (None, None) => None,
    };
    if let Some(p) = planned
        .as_mut()
        .filter(|_| record.rate_lower_bound && record.rate_source == ValueSource::Probe)
    {
        fatpipe_tune::auto::unpace(p);
    }
    let report = Audit {
        target_rate: target.rate,
        target_rtt_secs: target.rtt.as_secs_f64(),
        bdp: target.bdp(),
        findings,
        disk,
        plan: planned,
        target: Some(record),
        peer: peer_audit,
    };
    if args.json {
        out(&(serde_json::to_string_pretty(&report)? + "\n"))
    } else {
        out(&render(&target, &report))
    }
}

/// Echoes and trains of the `--for` probe: as many as `fatpipe path` sends.
const PROBE_ECHOES: u32 = 10;
const PROBE_TRAINS: u32 = 10;

/// The target values given as flags.
fn given(args: &Args) -> anyhow::Result<Given> {
    let rate = match &args.rate {
        Some(r) => Some(parse_rate(r).map_err(|e| usage(e.to_string()))?),
        None => None,
    };
    let rtt = match &args.rtt {
        Some(r) => Some(parse_duration(r).map_err(|e| usage(e.to_string()))?),
        None => None,
    };
    if rate == Some(0) {
        return Err(usage("--rate must be above zero, e.g. 10gbit"));
    }
    if rtt.is_some_and(|r| r.is_zero()) {
        return Err(usage("--rtt must be above zero, e.g. 100ms"));
    }
    Ok(Given { rate, rtt })
}

/// Where a probed target came from, as comment lines for a snippet
/// (sysctl.conf takes `#` comments on all three systems); empty without
/// `--for`.
fn comment_source(t: &AuditTarget) -> String {
    let mut s = String::new();
    if let Some(peer) = &t.peer {
        s.push_str(&format!(
            "# target from a probe of {peer}: {}\n",
            peer::describe_source(t)
        ));
        for n in &t.notes {
            s.push_str(&format!("# note: {n}\n"));
        }
    }
    s
}

fn run_apply(target: &Target, record: &AuditTarget, args: &Args) -> anyhow::Result<()> {
    let host = Host::live();
    let settings = linux_settings(target, &host.collect(None));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let stamp = format!("{:010}.{:09}", now.as_secs(), now.subsec_nanos());
    let done = apply::apply(&host, &settings, &args.backup_dir, &stamp).context("tune --apply")?;
    let mut text = format!(
        "fatpipe tune --apply: Linux settings for {}\n",
        target.describe()
    );
    text.push_str(&comment_source(record).replace("# ", ""));
    for c in &done.changes {
        text.push_str(&format!("  {} = {}    (was {})\n", c.key, c.new, c.old));
    }
    for (key, why) in &done.skipped {
        text.push_str(&format!("  {key}: left out: {why}\n"));
    }
    text.push_str(&match &done.backup {
        Some(b) => format!(
            "backup: {}; undo with: fatpipe tune --revert\n",
            b.display()
        ),
        None => "nothing to change: the host already has these settings\n".to_string(),
    });
    out(&text)
}

fn run_revert(args: &Args) -> anyhow::Result<()> {
    let done = apply::revert(&Host::live(), &args.backup_dir).context("tune --revert")?;
    let mut text = format!(
        "fatpipe tune --revert: restored from {}\n",
        done.backup.display()
    );
    for (key, value) in &done.restored {
        text.push_str(&format!("  {key} = {value}\n"));
    }
    out(&text)
}

/// Writes to stdout, returning a broken pipe as an error that the exit
/// module turns into a quiet exit (`fatpipe tune | head`).
fn out(text: &str) -> anyhow::Result<()> {
    let mut o = std::io::stdout().lock();
    o.write_all(text.as_bytes())?;
    o.flush()?;
    Ok(())
}

/// The report for people: where the target came from, a table of this
/// host's findings, then the peer's with `--for`.
fn render(target: &Target, a: &Audit) -> String {
    let mut out = format!("fatpipe tune: this host against {}\n", target.describe());
    if let Some(t) = a.target.as_ref().filter(|t| t.peer.is_some()) {
        out.push_str(&probe_lines(t));
    }
    out.push('\n');
    out.push_str(&table(&a.findings));
    out.push_str(&format!("\n{}.\n", counts(&a.findings)));
    if let Some(p) = &a.peer {
        let name = if p.server == p.remote {
            p.server.clone()
        } else {
            format!("{} ({})", p.server, p.remote)
        };
        out.push_str(&format!(
            "\nthe peer {name}, as its probe service reported (its server's limits):\n\n"
        ));
        out.push_str(&table(&p.findings));
        out.push_str(&format!(
            "\npeer: {}. Tune it too: run fatpipe tune --for THIS-HOST there, or its --emit.\n",
            counts(&p.findings)
        ));
    }
    if let Some(p) = &a.plan {
        out.push_str(&if a.peer.is_some() {
            format!(
                "With this host's and the peer's limits, fatpipe would plan (this host sending): {}\n",
                p.reason
            )
        } else {
            format!(
                "With these limits at both ends, fatpipe would plan: {}\n",
                p.reason
            )
        });
    }
    out.push_str(
        "fatpipe tune --emit linux|freebsd|macos prints the settings; --apply applies them (root) with a backup.\n",
    );
    out
}

/// "target from a probe of HOST (IP:PORT) in 1.2 s: …" and its notes.
fn probe_lines(t: &AuditTarget) -> String {
    let peer = t.peer.as_deref().unwrap_or("?");
    let remote = t.remote.as_deref().unwrap_or("?");
    let mut out = format!(
        "target from a probe of {}{}: {}\n",
        if peer == remote {
            peer.to_string()
        } else {
            format!("{peer} ({remote})")
        },
        t.probe_secs
            .map(|s| format!(
                " in {}",
                fatpipe_schema::units::format_duration(std::time::Duration::from_secs_f64(
                    s.max(0.0)
                ))
            ))
            .unwrap_or_default(),
        peer::describe_source(t)
    );
    for n in &t.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}

/// One row per finding, why last because it is long.
fn table(findings: &[Finding]) -> String {
    let mut out = String::new();
    let rows: Vec<[String; 5]> = findings.iter().map(row).collect();
    let head = ["SEVERITY", "ITEM", "CURRENT", "RECOMMENDED", "WHY"].map(String::from);
    let mut width = [0usize; 4];
    for r in std::iter::once(&head).chain(&rows) {
        for (w, cell) in width.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for r in std::iter::once(&head).chain(&rows) {
        let mut line = String::new();
        for (w, cell) in width.iter().zip(r) {
            line.push_str(cell);
            line.push_str(&" ".repeat(w - cell.chars().count() + 2));
        }
        line.push_str(&r[4]);
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// "0 critical, 1 warn, 1 info, 0 ok"
fn counts(findings: &[Finding]) -> String {
    let count = |s: Severity| findings.iter().filter(|f| f.severity == s).count();
    format!(
        "{} critical, {} warn, {} info, {} ok",
        count(Severity::Critical),
        count(Severity::Warn),
        count(Severity::Info),
        count(Severity::Ok)
    )
}

fn row(f: &Finding) -> [String; 5] {
    let severity = match f.severity {
        Severity::Ok => "ok",
        Severity::Info => "info",
        Severity::Warn => "WARN",
        Severity::Critical => "CRITICAL",
    };
    let (current, why) = match &f.current {
        Observed::Known(v) => (v.clone(), f.why.clone()),
        Observed::Unknown(reason) => (
            "unknown".to_string(),
            format!("{} (unknown: {reason})", f.why),
        ),
    };
    [
        severity.to_string(),
        f.item.clone(),
        current,
        f.recommended.clone().unwrap_or_else(|| "-".to_string()),
        why,
    ]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn table_shows_unknown_with_its_reason() {
        let t = Target {
            rate: 10_000_000_000,
            rtt: Duration::from_millis(100),
        };
        let a = Audit {
            target_rate: t.rate,
            target_rtt_secs: 0.1,
            bdp: t.bdp(),
            findings: vec![
                Finding {
                    area: "buffers".into(),
                    item: "net.core.rmem_max".into(),
                    current: Observed::Known("4194304".into()),
                    recommended: Some("268435456".into()),
                    why: "caps SO_RCVBUF".into(),
                    severity: Severity::Warn,
                },
                Finding {
                    area: "cpu".into(),
                    item: "scaling governor".into(),
                    current: Observed::Unknown("no cpufreq".into()),
                    recommended: Some("performance".into()),
                    why: "clock ramp-up".into(),
                    severity: Severity::Info,
                },
            ],
            disk: None,
            plan: None,
            target: None,
            peer: None,
        };
        let text = render(&t, &a);
        let want = "\
fatpipe tune: this host against 10.0 Gbit/s × 100.0 ms (BDP 125 MB)

SEVERITY  ITEM               CURRENT  RECOMMENDED  WHY
WARN      net.core.rmem_max  4194304  268435456    caps SO_RCVBUF
info      scaling governor   unknown  performance  clock ramp-up (unknown: no cpufreq)

0 critical, 1 warn, 1 info, 0 ok.
";
        assert!(text.starts_with(want), "{text}");
    }
}
