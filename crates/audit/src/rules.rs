//! Recommendation rules: collected host facts and a target rate × RTT in,
//! audit findings and the Linux settings to emit or apply out.
//!
//! Pure functions, so each rule is pinned by a table of cases. The settings
//! list ([`linux_settings`]) is the single source for the audit's
//! "recommended" column, `--emit linux` and `--apply`, so the three can never
//! disagree. Recommendations never lower a value the host already has above
//! the target's need: a DTN tuned for a longer path stays tuned.
//!
//! Thresholds, and why:
//! * Buffer caps: 2 × BDP, because Linux counts its skb overhead against the
//!   buffer and so leaves about half of an autotuned buffer for the window
//!   (`SO_*BUF` values are doubled by the kernel for the same reason). When
//!   even the planner's most streams (64) cannot cover the BDP — critical.
//! * Jumbo frames, ring sizes, the backlog and the performance governor
//!   matter from 10 Gbit/s: per-packet CPU cost is what limits a host there
//!   (the 100G DTN study gained 3× from jumbo frames and the governor).

use std::collections::BTreeSet;
use std::time::Duration;

use fatpipe_schema::tune::{DiskResult, Finding, Observed, Severity, MAX_PLANNED_STREAMS};
use fatpipe_schema::units::{
    bdp_bytes, format_bytes, format_bytes_iec, format_duration, format_rate,
};

use crate::host::{HostFacts, Nic, Probe};

/// What the host should be able to fill.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target {
    /// Rate in bit/s.
    pub rate: u64,
    /// Round-trip time.
    pub rtt: Duration,
}

impl Target {
    /// The bandwidth-delay product in bytes.
    pub fn bdp(&self) -> u64 {
        bdp_bytes(self.rate, self.rtt)
    }

    /// "10.0 Gbit/s × 100.0 ms (BDP 125 MB)", for headers.
    pub fn describe(&self) -> String {
        format!(
            "{} × {} (BDP {})",
            format_rate(self.rate as f64),
            format_duration(self.rtt),
            format_bytes(self.bdp())
        )
    }
}

/// Buffer cap recommended for a target: 2 × BDP rounded up to a power of
/// two, at least 16 MiB and at most `i32::MAX` (the sysctls are ints).
pub fn buffer_max(target: &Target) -> u64 {
    let want = target.bdp().saturating_mul(2).max(16 << 20);
    want.checked_next_power_of_two()
        .unwrap_or(u64::MAX)
        .min(i32::MAX as u64)
}

/// `netdev_max_backlog` for a target rate; `None` below 10 Gbit/s, where
/// the kernel default (1000) keeps up.
pub fn backlog(target: &Target) -> Option<u64> {
    match target.rate {
        r if r >= 40_000_000_000 => Some(250_000),
        r if r >= 10_000_000_000 => Some(30_000),
        _ => None,
    }
}

/// One sysctl the Linux snippet sets, with why; `skip` says why it is left
/// commented out on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// Dotted sysctl name.
    pub key: &'static str,
    /// Value to write, in `/proc/sys` syntax.
    pub value: String,
    /// One line for the comment above it.
    pub why: &'static str,
    /// When set, the line is emitted commented out and never applied.
    pub skip: Option<String>,
}

/// The Linux sysctls for a target on this host. Unknown facts do not skip
/// a setting (the snippet may be meant for another host); known-missing
/// features do.
pub fn linux_settings(target: &Target, facts: &HostFacts) -> Vec<Setting> {
    let want = buffer_max(target);
    let cur = |k: &str| facts.sysctls.get(k).and_then(|p| p.known().cloned());
    let cur_u64 = |k: &str| cur(k).and_then(|v| v.parse::<u64>().ok());
    let cur_triple = |k: &str| {
        cur(k).and_then(|v| {
            let n: Vec<u64> = v
                .split_whitespace()
                .filter_map(|t| t.parse().ok())
                .collect();
            (n.len() == 3).then(|| [n[0], n[1], n[2]])
        })
    };
    let raise = |k: &str| cur_u64(k).map_or(want, |c| c.max(want));
    let range = |k: &str, default: u64| {
        let [min, def, max] = cur_triple(k).unwrap_or([4096, default, 0]);
        format!("{min} {def} {}", max.max(want))
    };
    let set = |key, value: String, why| Setting {
        key,
        value,
        why,
        skip: None,
    };

    let available: Option<Vec<String>> = cur("net.ipv4.tcp_available_congestion_control")
        .map(|s| s.split_whitespace().map(str::to_string).collect());
    let mut cc = set(
        "net.ipv4.tcp_congestion_control",
        "bbr".to_string(),
        "BBR keeps its rate under random loss, where CUBIC falls to a few percent",
    );
    if let Some(av) = &available {
        if !av.iter().any(|c| c == "bbr") {
            if av.iter().any(|c| c == "htcp") {
                cc.value = "htcp".to_string();
            } else {
                cc.skip = Some("bbr is not available here (modprobe tcp_bbr)".to_string());
            }
        }
    }
    let mut qdisc = set(
        "net.core.default_qdisc",
        "fq".to_string(),
        "fq paces each flow (SO_MAX_PACING_RATE) without bursts",
    );
    if facts.fq_available == Probe::Known(false) {
        qdisc.skip = Some(
            "this kernel has no fq qdisc; TCP paces internally (BBR, SO_MAX_PACING_RATE) without it"
                .to_string(),
        );
    }

    let mut out = vec![
        set(
            "net.core.rmem_max",
            raise("net.core.rmem_max").to_string(),
            "cap on SO_RCVBUF: 2 x BDP, so one stream's window can cover the path",
        ),
        set(
            "net.core.wmem_max",
            raise("net.core.wmem_max").to_string(),
            "cap on SO_SNDBUF: 2 x BDP, as for receiving",
        ),
        set(
            "net.ipv4.tcp_rmem",
            range("net.ipv4.tcp_rmem", 131072),
            "receive autotuning (min default max): the max lets autotuning reach the BDP",
        ),
        set(
            "net.ipv4.tcp_wmem",
            range("net.ipv4.tcp_wmem", 16384),
            "send autotuning (min default max), as for receiving",
        ),
        cc,
        qdisc,
        set(
            "net.ipv4.tcp_window_scaling",
            "1".to_string(),
            "without window scaling a window stops at 64 KiB",
        ),
        set(
            "net.ipv4.tcp_timestamps",
            "1".to_string(),
            "timestamps give RTT samples every ACK and guard sequence wrap at high rates",
        ),
        set(
            "net.ipv4.tcp_sack",
            "1".to_string(),
            "SACK recovers several losses per round trip instead of one",
        ),
        set(
            "net.ipv4.tcp_mtu_probing",
            "1".to_string(),
            "probe the path MTU when ICMP is blocked (black holes with jumbo frames)",
        ),
    ];
    if let Some(b) = backlog(target) {
        let v = cur_u64("net.core.netdev_max_backlog").map_or(b, |c| c.max(b));
        out.push(set(
            "net.core.netdev_max_backlog",
            v.to_string(),
            "packets queued per CPU before the kernel drops them, at 10 Gbit/s and up",
        ));
    }
    out
}

/// The audit: every check as a finding, in a stable order.
pub fn audit(target: &Target, facts: &HostFacts, disk: Option<&DiskResult>) -> Vec<Finding> {
    let settings = linux_settings(target, facts);
    let rec = |key: &str| settings.iter().find(|s| s.key == key);
    let mut out = Vec::new();
    let fast = target.rate >= 10_000_000_000;

    for (key, what) in [
        ("net.core.rmem_max", "SO_RCVBUF"),
        ("net.core.wmem_max", "SO_SNDBUF"),
        ("net.ipv4.tcp_rmem", "receive autotuning"),
        ("net.ipv4.tcp_wmem", "send autotuning"),
    ] {
        let current = sysctl(facts, key);
        let recommended = rec(key).map(|s| s.value.clone());
        let autotune = key.contains("tcp_");
        let cap = current.known().and_then(|v| {
            v.split_whitespace()
                .last()
                .and_then(|t| t.parse::<u64>().ok())
        });
        let (severity, why) = match cap {
            None => (Severity::Info, format!("caps {what}")),
            Some(cap) => judge_buffer(target, cap, autotune, what),
        };
        out.push(finding("buffers", key, current, recommended, why, severity));
    }

    let cc_current = sysctl(facts, "net.ipv4.tcp_congestion_control");
    let cc = rec("net.ipv4.tcp_congestion_control");
    let (severity, why) = match cc_current.known().map(String::as_str) {
        Some("bbr") => (Severity::Ok, "BBR keeps its rate under random loss".to_string()),
        Some(c) if cc.is_some_and(|s| s.skip.is_none()) => (
            if c == "reno" { Severity::Critical } else { Severity::Warn },
            format!("{c} falls to a few percent of a long path at 0.01% loss; fatpipe picks per stream, other tools use the default"),
        ),
        Some(c) => (
            Severity::Info,
            format!("{c}: no BBR or H-TCP in this kernel; load tcp_bbr for lossy paths"),
        ),
        None => (Severity::Info, "default congestion control".to_string()),
    };
    out.push(finding(
        "tcp",
        "net.ipv4.tcp_congestion_control",
        cc_current.clone(),
        cc.filter(|s| s.skip.is_none()).map(|s| s.value.clone()),
        why,
        severity,
    ));
    out.push(finding(
        "tcp",
        "net.ipv4.tcp_available_congestion_control",
        sysctl(facts, "net.ipv4.tcp_available_congestion_control"),
        None,
        "the congestion controls loaded in this kernel".to_string(),
        Severity::Ok,
    ));

    let qdisc = sysctl(facts, "net.core.default_qdisc");
    let bbr_now = cc_current.known().map(String::as_str) == Some("bbr");
    let (severity, recommended, why) =
        match (qdisc.known().map(String::as_str), &facts.fq_available) {
            (Some("fq"), _) => (Severity::Ok, None, "fq paces every flow".to_string()),
            (_, Probe::Known(false)) => (
                Severity::Info,
                None,
                "no fq in this kernel; TCP's internal pacing stands in (BBR, SO_MAX_PACING_RATE)"
                    .to_string(),
            ),
            (_, fq) => (
                if bbr_now {
                    Severity::Info
                } else {
                    Severity::Warn
                },
                Some("fq".to_string()),
                format!(
                    "fq paces flows so parallel streams do not burst into the bottleneck{}",
                    if let Probe::Unknown(why) = fq {
                        format!(" (could not check fq exists: {why})")
                    } else {
                        String::new()
                    }
                ),
            ),
        };
    out.push(finding(
        "tcp",
        "net.core.default_qdisc",
        qdisc,
        recommended,
        why,
        severity,
    ));

    for (key, bad, why) in [
        (
            "net.ipv4.tcp_window_scaling",
            Severity::Critical,
            "without it a window stops at 64 KiB",
        ),
        (
            "net.ipv4.tcp_timestamps",
            Severity::Warn,
            "RTT samples on every ACK; protects against sequence wrap at high rates",
        ),
        (
            "net.ipv4.tcp_sack",
            Severity::Warn,
            "recovers several losses per round trip instead of one",
        ),
        (
            "net.ipv4.tcp_mtu_probing",
            Severity::Info,
            "finds the path MTU when ICMP is filtered (jumbo-frame black holes)",
        ),
    ] {
        let current = sysctl(facts, key);
        let on = current.known().is_some_and(|v| v != "0");
        out.push(finding(
            "tcp",
            key,
            current,
            Some("1".to_string()),
            why.to_string(),
            if on { Severity::Ok } else { bad },
        ));
    }

    if let Some(s) = rec("net.core.netdev_max_backlog") {
        let current = sysctl(facts, s.key);
        let ok = current
            .known()
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|v| v.to_string() == s.value);
        out.push(finding(
            "tcp",
            s.key,
            current,
            Some(s.value.clone()),
            "packets queued per CPU before drops; bursts at 10 Gbit/s and up overrun the default"
                .to_string(),
            if ok { Severity::Ok } else { Severity::Warn },
        ));
    }

    if facts.nics.is_empty() {
        out.push(finding(
            "nic",
            "interfaces",
            Observed::Unknown("no interface with a device under /sys/class/net".to_string()),
            None,
            "NIC checks need a physical (or virtual PCI) interface".to_string(),
            Severity::Info,
        ));
    }
    for nic in &facts.nics {
        nic_findings(target, facts, nic, fast, &mut out);
    }

    let (current, severity, why) = match &facts.governors {
        Probe::Known(g) => {
            let text = g
                .iter()
                .map(|(name, n)| format!("{name} x{n}"))
                .collect::<Vec<_>>()
                .join(", ");
            let all = g.keys().all(|k| k == "performance");
            let severity = match (all, fast) {
                (true, _) => Severity::Ok,
                (false, true) => Severity::Warn,
                (false, false) => Severity::Info,
            };
            (
                Observed::Known(text),
                severity,
                "clock ramp-up lags bursts of packet work; the 100G DTN study needed performance"
                    .to_string(),
            )
        }
        Probe::Unknown(why) => (
            Observed::Unknown(why.clone()),
            Severity::Info,
            "the governor decides how fast a core wakes to packet work".to_string(),
        ),
    };
    out.push(finding(
        "cpu",
        "scaling governor",
        current,
        Some("performance".to_string()),
        why,
        severity,
    ));

    if let Some(d) = disk {
        out.push(disk_finding(target, d));
    }
    out
}

/// How far a buffer cap of `cap` bytes lets one stream's window go toward
/// the target, and why: ok at 2 × BDP ([`buffer_max`]), critical when even
/// the planner's most streams cannot cover the BDP, else a warning. An
/// autotuning maximum (`tcp_*mem[2]`) gives about half of itself as window.
pub fn judge_buffer(target: &Target, cap: u64, autotune: bool, what: &str) -> (Severity, String) {
    let window = if autotune { cap / 2 } else { cap };
    let need = buffer_max(target);
    let streams = (target.bdp() as f64 * 1.5 / window.max(1) as f64)
        .ceil()
        .max(1.0);
    let severity = if cap >= need {
        Severity::Ok
    } else if streams > f64::from(MAX_PLANNED_STREAMS) {
        Severity::Critical
    } else {
        Severity::Warn
    };
    let why = if severity == Severity::Ok {
        format!(
            "{what} reaches {} of window, enough for one stream",
            format_bytes_iec(window)
        )
    } else if streams <= 1.0 {
        format!(
            "{what} gives a stream at most {} of window: one stream fills the target, but {} is recommended for loss recovery and other paths",
            format_bytes_iec(window),
            format_bytes_iec(need)
        )
    } else {
        format!(
            "{what} gives a stream at most {} of window: filling the target takes {streams} streams",
            format_bytes_iec(window)
        )
    };
    (severity, why)
}

/// Parses a kernel CPU list ("0-3,8,10-11") into CPU numbers.
pub fn parse_cpulist(s: &str) -> Option<BTreeSet<u32>> {
    let mut set = BTreeSet::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if b < a || b - a > 65_536 {
                    return None;
                }
                set.extend(a..=b);
            }
            None => {
                set.insert(part.trim().parse().ok()?);
            }
        }
    }
    Some(set)
}

fn nic_findings(target: &Target, facts: &HostFacts, nic: &Nic, fast: bool, out: &mut Vec<Finding>) {
    let n = &nic.name;
    let mtu = nic.mtu.clone().map(|m| m.to_string());
    let jumbo = nic.mtu.known().is_some_and(|&m| m >= 9000);
    out.push(finding(
        "nic",
        &format!("{n} mtu"),
        probe(mtu),
        Some("9000 (if every hop carries jumbo frames)".to_string()),
        "6x fewer packets per byte; the 100G DTN study gained 3x with jumbo frames and the governor"
            .to_string(),
        match (jumbo, fast) {
            (true, _) => Severity::Ok,
            (false, true) => Severity::Warn,
            (false, false) => Severity::Info,
        },
    ));

    let speed = nic.speed_mbps.clone().map(|s| format_rate(s as f64 * 1e6));
    let slow = nic
        .speed_mbps
        .known()
        .is_some_and(|&s| s.saturating_mul(1_000_000) < target.rate);
    out.push(finding(
        "nic",
        &format!("{n} speed"),
        probe(speed),
        None,
        if slow {
            "the NIC is slower than the target".to_string()
        } else {
            "link speed".to_string()
        },
        if slow {
            Severity::Critical
        } else {
            Severity::Ok
        },
    ));

    let (current, severity) = match &nic.offloads {
        Probe::Known(list) => {
            let off: Vec<&str> = list
                .iter()
                .filter(|(_, on)| !on)
                .map(|(k, _)| k.as_str())
                .collect();
            if off.is_empty() {
                (Observed::Known("all on".to_string()), Severity::Ok)
            } else {
                (
                    Observed::Known(format!("off: {}", off.join(", "))),
                    Severity::Warn,
                )
            }
        }
        Probe::Unknown(why) => (Observed::Unknown(why.clone()), Severity::Info),
    };
    out.push(finding(
        "nic",
        &format!("{n} offloads"),
        current,
        Some("tso, gso, gro, sg, checksums on".to_string()),
        "segmentation and checksum offloads move per-packet work off the CPU".to_string(),
        severity,
    ));

    let (current, recommended, severity) = match &nic.rings {
        Probe::Known(r) => {
            let text = format!("rx {}/{} tx {}/{}", r.rx, r.rx_max, r.tx, r.tx_max);
            let at_max = r.rx >= r.rx_max && r.tx >= r.tx_max;
            let severity = match (at_max, fast) {
                (true, _) => Severity::Ok,
                (false, true) => Severity::Warn,
                (false, false) => Severity::Info,
            };
            let recommended = (!at_max).then(|| {
                format!(
                    "rx {} tx {} (ethtool -G {n} rx {} tx {})",
                    r.rx_max, r.tx_max, r.rx_max, r.tx_max
                )
            });
            (Observed::Known(text), recommended, severity)
        }
        Probe::Unknown(why) => (Observed::Unknown(why.clone()), None, Severity::Info),
    };
    out.push(finding(
        "nic",
        &format!("{n} rings"),
        current,
        recommended,
        "larger rings absorb bursts while the CPU is busy, instead of dropping".to_string(),
        severity,
    ));

    let multi_node = facts.numa_nodes.known().is_some_and(|&n| n > 1);
    let node_text = match (&nic.numa_node, &nic.local_cpus) {
        (Probe::Known(-1), Probe::Known(cpus)) => Probe::Known(format!("none (-1), cpus {cpus}")),
        (Probe::Known(node), Probe::Known(cpus)) => {
            Probe::Known(format!("node {node}, cpus {cpus}"))
        }
        (Probe::Known(node), Probe::Unknown(_)) => Probe::Known(format!("node {node}")),
        (Probe::Unknown(w), _) => Probe::Unknown(w.clone()),
    };
    let node = nic.numa_node.known().copied().filter(|&n| n >= 0);
    out.push(finding(
        "nic",
        &format!("{n} numa node"),
        probe(node_text),
        match (multi_node, node) {
            (true, Some(node)) => Some(format!("run transfers on node {node} (numactl -N {node})")),
            _ => None,
        },
        if multi_node {
            "memory and CPUs on the NIC's node avoid the inter-socket link".to_string()
        } else {
            "one NUMA node: placement does not matter".to_string()
        },
        if multi_node && node.is_some() {
            Severity::Info
        } else {
            Severity::Ok
        },
    ));

    let local = nic.local_cpus.known().and_then(|c| parse_cpulist(c));
    let (current, severity, why) = match &nic.irqs {
        Probe::Known(irqs) if irqs.is_empty() => (
            Observed::Known("none listed".to_string()),
            Severity::Info,
            "no MSI interrupts listed for the device".to_string(),
        ),
        Probe::Known(irqs) => {
            let text = irqs
                .iter()
                .map(|i| {
                    format!(
                        "{}→{}",
                        i.number,
                        i.cpus.known().map_or("?", String::as_str)
                    )
                })
                .collect::<Vec<_>>()
                .join(" ");
            let remote: Vec<u32> = irqs
                .iter()
                .filter(|i| {
                    let cpus = i.cpus.known().and_then(|c| parse_cpulist(c));
                    match (&local, cpus) {
                        (Some(l), Some(c)) if multi_node => !c.is_subset(l),
                        _ => false,
                    }
                })
                .map(|i| i.number)
                .collect();
            if remote.is_empty() {
                (
                    Observed::Known(text),
                    Severity::Ok,
                    "interrupts may run on the NIC's local CPUs".to_string(),
                )
            } else {
                (
                    Observed::Known(text),
                    Severity::Warn,
                    format!(
                        "IRQs {} may run off the NIC's node; pin them to its CPUs (the DTN study balanced cores this way)",
                        remote.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
                    ),
                )
            }
        }
        Probe::Unknown(why) => (
            Observed::Unknown(why.clone()),
            Severity::Info,
            "where the NIC's interrupts run".to_string(),
        ),
    };
    out.push(finding(
        "nic",
        &format!("{n} irq affinity"),
        current,
        nic.local_cpus
            .known()
            .filter(|_| multi_node)
            .map(|c| format!("cpus {c}")),
        why,
        severity,
    ));
}

fn disk_finding(target: &Target, d: &DiskResult) -> Finding {
    let slower = d.write_rate.min(d.read_rate);
    let class = if slower < 1_600_000_000 {
        "HDD-class (< 200 MB/s)"
    } else if slower < 8_000_000_000 {
        "SATA-SSD-class (< 1 GB/s)"
    } else {
        "NVMe-class"
    };
    let current = format!(
        "write {}, read {}{}",
        format_rate(d.write_rate as f64),
        format_rate(d.read_rate as f64),
        if d.direct_io {
            ""
        } else {
            " (buffered: no O_DIRECT)"
        }
    );
    let enough = slower >= target.rate;
    Finding {
        area: "disk".to_string(),
        item: d.dir.clone(),
        current: Observed::Known(current),
        recommended: (!enough).then(|| {
            format!(
                "≥ {} (NVMe or striped disks)",
                format_rate(target.rate as f64)
            )
        }),
        why: if enough {
            format!("{class}: keeps up with the target")
        } else {
            format!("{class}: disk-to-disk copies here top out below the target")
        },
        severity: if enough { Severity::Ok } else { Severity::Warn },
    }
}

fn sysctl(facts: &HostFacts, key: &str) -> Observed {
    probe(
        facts
            .sysctls
            .get(key)
            .cloned()
            .unwrap_or_else(|| Probe::Unknown(format!("{key} was not collected"))),
    )
}

fn probe(p: Probe<String>) -> Observed {
    match p {
        Probe::Known(v) => Observed::Known(v),
        Probe::Unknown(w) => Observed::Unknown(w),
    }
}

pub(crate) fn finding(
    area: &str,
    item: &str,
    current: Observed,
    recommended: Option<String>,
    why: String,
    severity: Severity,
) -> Finding {
    // A value that could not be read cannot be judged: say so, never guess.
    let severity = if matches!(current, Observed::Unknown(_)) {
        Severity::Info
    } else {
        severity
    };
    Finding {
        area: area.to_string(),
        item: item.to_string(),
        current,
        recommended,
        why,
        severity,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::tests::{fake_tree, TYPICAL};
    use crate::host::{Host, Rings};

    const G: u64 = 1_000_000_000;

    fn target(rate: u64, rtt_ms: u64) -> Target {
        Target {
            rate,
            rtt: Duration::from_millis(rtt_ms),
        }
    }

    #[test]
    fn a_cap_that_one_stream_fills_is_not_counted_in_streams() {
        // 1 Gbit/s x 10 ms: a 4 MiB buffer covers 1.5 BDP, but is below
        // the 16 MiB floor of the recommendation.
        let (sev, why) = judge_buffer(&target(G, 10), 4 << 20, false, "rmem_max");
        assert_eq!(sev, Severity::Warn);
        assert!(why.contains("one stream fills the target"), "{why}");
        assert!(why.contains("16 MiB is recommended"), "{why}");
        let (_, why) = judge_buffer(&target(G, 100), 4 << 20, false, "rmem_max");
        assert!(why.contains("takes 5 streams"), "{why}");
    }

    fn typical() -> HostFacts {
        let dir = fake_tree(TYPICAL);
        Host::at(dir.path()).collect(None)
    }

    fn with(mut f: HostFacts, key: &str, value: &str) -> HostFacts {
        f.sysctls
            .insert(key.to_string(), Probe::Known(value.to_string()));
        f
    }

    fn severity_of(findings: &[Finding], item: &str) -> Severity {
        findings
            .iter()
            .find(|f| f.item == item)
            .map(|f| f.severity)
            .unwrap_or_else(|| panic!("no finding {item}"))
    }

    #[test]
    fn buffer_max_table() {
        let cases = [
            (100_000_000, 10, 16 << 20),     // tiny BDP: the 16 MiB floor
            (G, 93, 32 << 20),               // 11.6 MB × 2 → 32 MiB
            (10 * G, 100, 256 << 20),        // 125 MB × 2 → 256 MiB
            (100 * G, 230, i32::MAX as u64), // 2.9 GB × 2 exceeds an int
        ];
        for (rate, rtt, want) in cases {
            assert_eq!(buffer_max(&target(rate, rtt)), want, "{rate} {rtt}");
        }
        assert_eq!(backlog(&target(G, 10)), None);
        assert_eq!(backlog(&target(10 * G, 10)), Some(30_000));
        assert_eq!(backlog(&target(100 * G, 10)), Some(250_000));
    }

    #[test]
    fn severities_table() {
        // (facts change, target, item, expected severity)
        let cases: Vec<(HostFacts, Target, &str, Severity)> = vec![
            (
                typical(),
                target(10 * G, 100),
                "net.core.rmem_max",
                Severity::Warn,
            ),
            (
                typical(),
                target(100 * G, 230),
                "net.core.rmem_max",
                Severity::Critical,
            ),
            (
                with(typical(), "net.core.rmem_max", "268435456"),
                target(10 * G, 100),
                "net.core.rmem_max",
                Severity::Ok,
            ),
            (
                typical(),
                target(10 * G, 100),
                "net.ipv4.tcp_wmem",
                Severity::Critical,
            ),
            (typical(), target(G, 93), "net.ipv4.tcp_rmem", Severity::Ok),
            (
                typical(),
                target(G, 93),
                "net.ipv4.tcp_congestion_control",
                Severity::Warn,
            ),
            (
                with(typical(), "net.ipv4.tcp_congestion_control", "reno"),
                target(G, 93),
                "net.ipv4.tcp_congestion_control",
                Severity::Critical,
            ),
            (
                with(typical(), "net.ipv4.tcp_congestion_control", "bbr"),
                target(G, 93),
                "net.ipv4.tcp_congestion_control",
                Severity::Ok,
            ),
            (
                with(
                    typical(),
                    "net.ipv4.tcp_available_congestion_control",
                    "reno cubic",
                ),
                target(G, 93),
                "net.ipv4.tcp_congestion_control",
                Severity::Info,
            ),
            // fq is not in the fake kernel: informational only.
            (
                typical(),
                target(G, 93),
                "net.core.default_qdisc",
                Severity::Info,
            ),
            (
                with(typical(), "net.ipv4.tcp_window_scaling", "0"),
                target(G, 93),
                "net.ipv4.tcp_window_scaling",
                Severity::Critical,
            ),
            (
                with(typical(), "net.ipv4.tcp_sack", "0"),
                target(G, 93),
                "net.ipv4.tcp_sack",
                Severity::Warn,
            ),
            (
                typical(),
                target(G, 93),
                "net.ipv4.tcp_mtu_probing",
                Severity::Info,
            ),
            (
                typical(),
                target(10 * G, 100),
                "net.core.netdev_max_backlog",
                Severity::Warn,
            ),
            (typical(), target(10 * G, 100), "eth0 mtu", Severity::Warn),
            (typical(), target(G, 100), "eth0 mtu", Severity::Info),
            (
                typical(),
                target(40 * G, 100),
                "eth0 speed",
                Severity::Critical,
            ),
            (typical(), target(10 * G, 100), "eth0 speed", Severity::Ok),
            (
                typical(),
                target(10 * G, 100),
                "scaling governor",
                Severity::Warn,
            ),
            // IRQ 40 may run on 0-15 though the NIC is local to 8-15.
            (
                typical(),
                target(10 * G, 100),
                "eth0 irq affinity",
                Severity::Warn,
            ),
            (
                typical(),
                target(10 * G, 100),
                "eth0 numa node",
                Severity::Info,
            ),
            // Unknown values are never judged.
            (typical(), target(10 * G, 100), "eth0 rings", Severity::Info),
        ];
        for (i, (facts, t, item, want)) in cases.into_iter().enumerate() {
            let findings = audit(&t, &facts, None);
            assert_eq!(severity_of(&findings, item), want, "case {i}: {item}");
        }
    }

    #[test]
    fn nic_rules_with_ioctl_facts() {
        let mut f = typical();
        f.nics[0].rings = Probe::Known(Rings {
            rx: 256,
            rx_max: 4096,
            tx: 4096,
            tx_max: 4096,
        });
        f.nics[0].offloads =
            Probe::Known(vec![("tso".to_string(), true), ("gro".to_string(), false)]);
        let findings = audit(&target(10 * G, 100), &f, None);
        assert_eq!(severity_of(&findings, "eth0 rings"), Severity::Warn);
        let off = findings
            .iter()
            .find(|x| x.item == "eth0 offloads")
            .expect("offloads");
        assert_eq!(off.severity, Severity::Warn);
        assert_eq!(off.current, Observed::Known("off: gro".to_string()));
    }

    #[test]
    fn unknown_values_stay_unknown() {
        let dir = fake_tree(&[]);
        let facts = Host::at(dir.path()).collect(None);
        let findings = audit(&target(10 * G, 100), &facts, None);
        let rmem = findings
            .iter()
            .find(|f| f.item == "net.core.rmem_max")
            .expect("rmem");
        assert!(matches!(&rmem.current, Observed::Unknown(w) if w.contains("rmem_max")));
        assert!(
            findings
                .iter()
                .all(|f| f.severity <= Severity::Info || f.area == "nic"),
            "{findings:#?}"
        );
        // The recommendation is still made from the target alone.
        assert_eq!(rmem.recommended.as_deref(), Some("268435456"));
    }

    #[test]
    fn settings_never_lower_and_skip_what_is_missing() {
        let f = with(typical(), "net.core.rmem_max", "2147483647");
        let s = linux_settings(&target(G, 93), &f);
        let get = |k: &str| s.iter().find(|x| x.key == k).expect(k).clone();
        assert_eq!(get("net.core.rmem_max").value, "2147483647");
        assert_eq!(get("net.core.wmem_max").value, (32u64 << 20).to_string());
        assert_eq!(get("net.ipv4.tcp_rmem").value, "4096 131072 33554432");
        assert!(get("net.core.default_qdisc").skip.is_some());
        assert_eq!(get("net.ipv4.tcp_congestion_control").value, "bbr");
        assert!(!s.iter().any(|x| x.key == "net.core.netdev_max_backlog"));
        let f = with(
            typical(),
            "net.ipv4.tcp_available_congestion_control",
            "reno cubic htcp",
        );
        let s = linux_settings(&target(G, 93), &f);
        assert!(s
            .iter()
            .any(|x| x.key == "net.ipv4.tcp_congestion_control" && x.value == "htcp"));
    }

    #[test]
    fn disk_classes() {
        let d = |w, r| DiskResult {
            dir: "/data".to_string(),
            bytes: 1 << 30,
            write_rate: w,
            read_rate: r,
            direct_io: true,
        };
        let f = disk_finding(&target(10 * G, 100), &d(1_000_000_000, 1_200_000_000));
        assert_eq!(f.severity, Severity::Warn);
        assert!(f.why.starts_with("HDD-class"), "{}", f.why);
        let f = disk_finding(&target(10 * G, 100), &d(20 * G, 25 * G));
        assert_eq!(f.severity, Severity::Ok);
        assert!(f.why.starts_with("NVMe-class"), "{}", f.why);
    }

    #[test]
    fn cpulists() {
        assert_eq!(
            parse_cpulist("0-3,8"),
            Some([0, 1, 2, 3, 8].into_iter().collect())
        );
        assert_eq!(parse_cpulist("5"), Some([5].into_iter().collect()));
        assert_eq!(parse_cpulist("3-1"), None);
        assert_eq!(parse_cpulist("x"), None);
    }
}
