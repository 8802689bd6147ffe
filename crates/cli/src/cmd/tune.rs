//! `fatpipe tune`: audit this host against a target rate × RTT, print a
//! sysctl snippet for Linux, FreeBSD or macOS, or apply/revert the Linux one.
//!
//! Glue only: `fatpipe_tune` collects, judges and applies; this module
//! parses the flags (quantities through `fatpipe_schema::units`, so a bad
//! `--rate` is one line and exit 2), picks the mode and renders. The audit
//! never fails the command: findings are information, so it exits 0; only
//! a failed apply, revert or disk test exits 1.
//!
//! `--for HOST` (audit against a probed peer path) is left out until the
//! server and `fatpipe path` exist: a flag that cannot work is not offered.

use std::io::Write;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use fatpipe_schema::tune::{Audit, Finding, Observed, Severity};
use fatpipe_schema::units::{parse_duration, parse_rate, parse_size};
use fatpipe_tune::apply::DEFAULT_BACKUP_DIR;
use fatpipe_tune::emit::Os;
use fatpipe_tune::host::{is_privileged, Host};
use fatpipe_tune::rules::{audit, linux_settings, Target};
use fatpipe_tune::{apply, disk, emit, plan, Policy};

use crate::exit::usage;

/// Arguments of `fatpipe tune`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Rate the host should fill, in bit/s (e.g. 10gbit, 100g).
    #[arg(long, default_value = "10gbit")]
    rate: String,
    /// Round-trip time of the paths it serves (e.g. 100ms).
    #[arg(long, default_value = "100ms")]
    rtt: String,
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
    let target = target(&args)?;
    if let Some(os) = &args.emit {
        let os: Os = os.parse().map_err(usage)?;
        let text = match os {
            Os::Linux => emit::linux(
                &target,
                &linux_settings(&target, &Host::live().collect(None)),
            ),
            Os::FreeBsd => emit::freebsd(&target),
            Os::MacOs => emit::macos(&target),
        };
        return out(&text);
    }
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
        return if args.apply {
            run_apply(&target, &args)
        } else {
            run_revert(&args)
        };
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
    let disk = match &args.disk {
        Some(dir) => Some(disk::measure(dir, disk_bytes).context("tune --disk")?),
        None => None,
    };
    let findings = audit(&target, &facts, disk.as_ref());
    let planned = host.limits(is_privileged()).ok().map(|l| {
        let path = fatpipe_schema::tune::PathFacts {
            rtt_secs: target.rtt.as_secs_f64(),
            bottleneck_rate: Some(target.rate),
            loss_rate: 0.0,
            mtu: facts
                .nics
                .first()
                .and_then(|n| n.mtu.known().copied())
                .unwrap_or(1500),
        };
        plan(&path, &l, &l, &Policy::default())
    });
    let report = Audit {
        target_rate: target.rate,
        target_rtt_secs: target.rtt.as_secs_f64(),
        bdp: target.bdp(),
        findings,
        disk,
        plan: planned,
    };
    if args.json {
        out(&(serde_json::to_string_pretty(&report)? + "\n"))
    } else {
        out(&render(&target, &report))
    }
}

fn target(args: &Args) -> anyhow::Result<Target> {
    let rate = parse_rate(&args.rate).map_err(|e| usage(e.to_string()))?;
    let rtt = parse_duration(&args.rtt).map_err(|e| usage(e.to_string()))?;
    if rate == 0 {
        return Err(usage("--rate must be above zero, e.g. 10gbit"));
    }
    if rtt.is_zero() {
        return Err(usage("--rtt must be above zero, e.g. 100ms"));
    }
    Ok(Target { rate, rtt })
}

fn run_apply(target: &Target, args: &Args) -> anyhow::Result<()> {
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

/// The table for people: one row per finding, why last because it is long.
fn render(target: &Target, a: &Audit) -> String {
    let mut out = format!("fatpipe tune: this host against {}\n\n", target.describe());
    let rows: Vec<[String; 5]> = a.findings.iter().map(row).collect();
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
    let count = |s: Severity| a.findings.iter().filter(|f| f.severity == s).count();
    out.push_str(&format!(
        "\n{} critical, {} warn, {} info, {} ok.\n",
        count(Severity::Critical),
        count(Severity::Warn),
        count(Severity::Info),
        count(Severity::Ok)
    ));
    if let Some(p) = &a.plan {
        out.push_str(&format!(
            "With these limits at both ends, fatpipe would plan: {}\n",
            p.reason
        ));
    }
    out.push_str(
        "fatpipe tune --emit linux|freebsd|macos prints the settings; --apply applies them (root) with a backup.\n",
    );
    out
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
