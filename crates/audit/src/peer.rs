//! `fatpipe tune --for HOST`: the audit target from a probe of the peer,
//! and the peer's own limits judged against it.
//!
//! Pure functions, so the rules are pinned by tables below:
//!
//! * [`target_for`] turns what the probe measured ([`Probed`]) and the
//!   flags the user gave ([`Given`]) into the [`Target`] the host audit
//!   runs against, plus the record of where each value came from
//!   ([`AuditTarget`]). A flag wins for its part. The probe's rate is used
//!   when it is a real estimate; when it is only a lower bound (this host
//!   could not send trains faster than they arrived, e.g. loopback) or
//!   missing, the target falls back to the `--rate` default, or to the
//!   lower bound when that is higher, and a note says so.
//! * [`path_findings`]: loss and path MTU from the probe, as findings on
//!   this host (area `path`), since neither fits the rate × RTT target.
//! * [`peer_findings`]: the peer's buffer caps and congestion controls,
//!   which its probe service reports, judged by the same rules as this
//!   host's: a window covers the BDP only if both ends allow it.

use std::time::Duration;

use fatpipe_schema::tune::{
    AuditTarget, Finding, HostLimits, Observed, Severity, TargetSource, ValueSource,
};
use fatpipe_schema::units::{format_duration, format_rate};

use crate::host::HostFacts;
use crate::rules::{buffer_max, finding, judge_buffer, Target};

/// Rate audited for when no flag or probe gives one: `--rate`'s default.
pub const DEFAULT_RATE: u64 = 10_000_000_000;
/// RTT audited for when no flag or probe gives one: `--rtt`'s default.
pub const DEFAULT_RTT: Duration = Duration::from_millis(100);
/// Smallest RTT a target may have (a loopback probe can measure less than
/// the clock's resolution; a zero BDP would judge nothing).
const MIN_RTT: Duration = Duration::from_micros(1);

/// What a probe measured, as the audit needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Probed {
    /// The address probed.
    pub remote: String,
    /// Minimum round-trip time.
    pub rtt: Duration,
    /// Bottleneck estimate in bit/s; `None` when no train gave one.
    pub rate: Option<f64>,
    /// True when the estimate is only a lower bound.
    pub lower_bound: bool,
    /// The estimate's confidence, 0 to 1.
    pub confidence: Option<f64>,
    /// Loss seen while probing, 0 to 1.
    pub loss_rate: f64,
    /// Path MTU, or why it is unknown.
    pub mtu: Result<u32, String>,
    /// Seconds the probe took.
    pub probe_secs: f64,
}

/// Target values given as flags; `None` leaves the part to the probe (or
/// to the default without one).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Given {
    /// `--rate`, bit/s.
    pub rate: Option<u64>,
    /// `--rtt`.
    pub rtt: Option<Duration>,
}

/// The target from flags alone (`fatpipe tune` without `--for`).
pub fn target_from_flags(given: Given) -> (Target, AuditTarget) {
    let source = |given: bool| {
        if given {
            ValueSource::Flag
        } else {
            ValueSource::Default
        }
    };
    let target = Target {
        rate: given.rate.unwrap_or(DEFAULT_RATE),
        rtt: given.rtt.unwrap_or(DEFAULT_RTT),
    };
    let record = AuditTarget {
        source: TargetSource::Flags,
        rate_source: source(given.rate.is_some()),
        rtt_source: source(given.rtt.is_some()),
        peer: None,
        remote: None,
        probed_rtt_secs: None,
        probed_rate: None,
        rate_lower_bound: false,
        rate_confidence: None,
        loss_rate: None,
        mtu: None,
        probe_secs: None,
        notes: Vec::new(),
    };
    (target, record)
}

/// The target for a probed peer: the probe's minimum RTT and bottleneck
/// rate, each replaced by its flag when one was given.
pub fn target_for(peer: &str, p: &Probed, given: Given) -> (Target, AuditTarget) {
    let mut notes = Vec::new();
    let (rtt, rtt_source) = match given.rtt {
        Some(rtt) => {
            notes.push(format!(
                "--rtt {} replaces the probed {}",
                format_duration(rtt),
                format_duration(p.rtt)
            ));
            (rtt, ValueSource::Flag)
        }
        None => (p.rtt.max(MIN_RTT), ValueSource::Probe),
    };
    let probed = p.rate.filter(|r| r.is_finite() && *r >= 1.0);
    let (rate, rate_source) = match (given.rate, probed) {
        (Some(rate), _) => {
            if let Some(r) = probed {
                notes.push(format!(
                    "--rate {} replaces the probed {}{}",
                    format_rate(rate as f64),
                    if p.lower_bound { "≥ " } else { "~" },
                    format_rate(r)
                ));
            }
            (rate, ValueSource::Flag)
        }
        (None, Some(r)) if !p.lower_bound => {
            if p.confidence.is_some_and(|c| c < 0.4) {
                notes.push(format!(
                    "the probe's trains disagree (confidence {:.2}): treat ~{} as rough, or give --rate",
                    p.confidence.unwrap_or(0.0),
                    format_rate(r)
                ));
            }
            (r.round() as u64, ValueSource::Probe)
        }
        (None, Some(r)) if r.round() as u64 >= DEFAULT_RATE => {
            notes.push(format!(
                "the probed rate is only a lower bound (this host could not send faster than ≥ {}): \
                 auditing for it; give --rate if the path is faster",
                format_rate(r)
            ));
            (r.round() as u64, ValueSource::Probe)
        }
        (None, Some(r)) => {
            notes.push(format!(
                "the probed rate is only a lower bound (this host could not send faster than ≥ {}): \
                 auditing for the --rate default {} instead; give --rate for the path's real rate",
                format_rate(r),
                format_rate(DEFAULT_RATE as f64)
            ));
            (DEFAULT_RATE, ValueSource::Default)
        }
        (None, None) => {
            notes.push(format!(
                "the probe gave no rate estimate (no train got through intact): auditing for the \
                 --rate default {}; give --rate for the path's real rate",
                format_rate(DEFAULT_RATE as f64)
            ));
            (DEFAULT_RATE, ValueSource::Default)
        }
    };
    let record = AuditTarget {
        source: TargetSource::Probe,
        rate_source,
        rtt_source,
        peer: Some(peer.to_string()),
        remote: Some(p.remote.clone()),
        probed_rtt_secs: Some(p.rtt.as_secs_f64()),
        probed_rate: probed.map(|r| r.round() as u64),
        rate_lower_bound: probed.is_some() && p.lower_bound,
        rate_confidence: p.confidence.map(|c| (c * 100.0).round() / 100.0),
        loss_rate: Some(p.loss_rate),
        mtu: p.mtu.as_ref().ok().copied(),
        probe_secs: Some(p.probe_secs),
        notes,
    };
    (Target { rate, rtt }, record)
}

/// Loss and path MTU as findings on this host (area `path`).
pub fn path_findings(p: &Probed, facts: &HostFacts) -> Vec<Finding> {
    let cc = facts
        .sysctls
        .get("net.ipv4.tcp_congestion_control")
        .and_then(|c| c.known().cloned());
    let lossy = p.loss_rate > 0.0;
    let (severity, recommended, why) = match (lossy, cc.as_deref()) {
        (false, _) => (
            Severity::Ok,
            None,
            "no probe packet was lost (a few thousand packets cannot rule out rare loss)"
                .to_string(),
        ),
        (true, Some("bbr")) => (
            Severity::Info,
            None,
            "BBR keeps its rate under this loss".to_string(),
        ),
        (true, cc) => (
            Severity::Warn,
            Some("bbr".to_string()),
            format!(
                "{} holds a long path far below its rate at this loss; fatpipe picks bbr per stream when it can, other tools use the default (includes drops at a queue shorter than a probe train)",
                cc.unwrap_or("loss-based congestion control")
            ),
        ),
    };
    let mut out = vec![finding(
        "path",
        "path loss",
        Observed::Known(format_loss(p.loss_rate)),
        recommended,
        why,
        severity,
    )];
    let nic_mtu = facts.nics.iter().filter_map(|n| n.mtu.known()).max();
    let (current, severity, why) = match (&p.mtu, nic_mtu) {
        (Ok(m), _) if *m >= 9000 => (
            Observed::Known(format!("{m} B")),
            Severity::Ok,
            "jumbo frames pass end to end".to_string(),
        ),
        (Ok(m), Some(&nic)) if nic > *m => (
            Observed::Known(format!("{m} B")),
            Severity::Info,
            format!(
                "the path carries at most {m}-byte packets although a NIC here has {nic}: TCP segments follow the path MTU (keep net.ipv4.tcp_mtu_probing on)"
            ),
        ),
        (Ok(m), _) => (
            Observed::Known(format!("{m} B")),
            Severity::Info,
            format!("the path carries {m}-byte packets: jumbo frames on this host would not reach the peer"),
        ),
        (Err(why), _) => (
            Observed::Unknown(why.clone()),
            Severity::Info,
            "the largest packet the path carries".to_string(),
        ),
    };
    out.push(finding("path", "path mtu", current, None, why, severity));
    out
}

/// The peer's limits (from its probe service) judged against the target,
/// with what to set there. `Err` carries why the peer could not say; every
/// item is then unknown with that reason.
pub fn peer_findings(target: &Target, limits: &Result<HostLimits, String>) -> Vec<Finding> {
    let want = buffer_max(target);
    let mut out = Vec::new();
    type Cap = fn(&HostLimits) -> (u64, String, String);
    let caps: [(&str, &str, bool, Cap); 4] = [
        ("net.core.rmem_max", "SO_RCVBUF", false, |l| {
            (l.rmem_max, l.rmem_max.to_string(), String::new())
        }),
        ("net.core.wmem_max", "SO_SNDBUF", false, |l| {
            (l.wmem_max, l.wmem_max.to_string(), String::new())
        }),
        ("net.ipv4.tcp_rmem", "receive autotuning", true, |l| {
            let [a, b, c] = l.tcp_rmem;
            (c, format!("{a} {b} {c}"), format!("{a} {b} "))
        }),
        ("net.ipv4.tcp_wmem", "send autotuning", true, |l| {
            let [a, b, c] = l.tcp_wmem;
            (c, format!("{a} {b} {c}"), format!("{a} {b} "))
        }),
    ];
    for (key, what, autotune, get) in caps {
        let role = if key.contains("rmem") {
            "when the peer receives (a test, a push)"
        } else {
            "when the peer sends (test -R, a pull)"
        };
        match limits {
            Ok(l) => {
                let (cap, text, prefix) = get(l);
                let (severity, why) =
                    judge_buffer(target, cap, autotune, &format!("the peer's {what}"));
                out.push(finding(
                    "peer",
                    key,
                    Observed::Known(text),
                    Some(format!("{prefix}{}", cap.max(want))),
                    format!("{why} {role}"),
                    severity,
                ));
            }
            Err(e) => out.push(finding(
                "peer",
                key,
                Observed::Unknown(e.clone()),
                Some(want.to_string()),
                format!("caps the peer's {what} {role}"),
                Severity::Info,
            )),
        }
    }
    let cc = match limits {
        Ok(l) if l.congestion.iter().any(|c| c == "bbr") => finding(
            "peer",
            "congestion controls",
            Observed::Known(l.congestion.join(" ")),
            None,
            "fatpipe can choose bbr on the peer when it sends (test -R, a pull)".into(),
            Severity::Ok,
        ),
        Ok(l) => finding(
            "peer",
            "congestion controls",
            Observed::Known(if l.congestion.is_empty() {
                "none listed".into()
            } else {
                l.congestion.join(" ")
            }),
            Some("bbr (modprobe tcp_bbr; add it to net.ipv4.tcp_allowed_congestion_control)".into()),
            "without bbr the peer's sends (test -R, a pull) fall to a few percent of a long path at 0.01% loss".into(),
            Severity::Warn,
        ),
        Err(e) => finding(
            "peer",
            "congestion controls",
            Observed::Unknown(e.clone()),
            Some("bbr".into()),
            "what the peer may choose when it sends".into(),
            Severity::Info,
        ),
    };
    out.push(cc);
    let forcing = match limits {
        Ok(l) => {
            let caps_enough = l.rmem_max >= want && l.wmem_max >= want;
            finding(
                "peer",
                "buffer forcing",
                Observed::Known(if l.privileged { "yes" } else { "no" }.into()),
                None,
                if l.privileged {
                    "the peer's server may exceed its caps (SO_*BUFFORCE) when 64 streams cannot cover the window".into()
                } else if caps_enough {
                    "the peer's server runs without CAP_NET_ADMIN; its caps are enough".into()
                } else {
                    "the peer's server runs without CAP_NET_ADMIN, so its caps bind: raise them (above)".into()
                },
                if l.privileged || caps_enough {
                    Severity::Ok
                } else {
                    Severity::Info
                },
            )
        }
        Err(e) => finding(
            "peer",
            "buffer forcing",
            Observed::Unknown(e.clone()),
            None,
            "whether the peer's server may exceed its caps (CAP_NET_ADMIN)".into(),
            Severity::Info,
        ),
    };
    out.push(forcing);
    out
}

/// A loss probability as a percentage ("0%" for none).
fn format_loss(p: f64) -> String {
    if p > 0.0 {
        fatpipe_schema::units::format_loss(p)
    } else {
        "0%".to_string()
    }
}

/// The line saying where the target came from, for the text output.
pub fn describe_source(t: &AuditTarget) -> String {
    let from = |s: ValueSource| match s {
        ValueSource::Probe => "probed",
        ValueSource::Flag => "from the flag",
        ValueSource::Default => "the default",
    };
    let mut line = format!("rtt {}, rate {}", from(t.rtt_source), from(t.rate_source));
    if let Some(m) = t.mtu {
        line.push_str(&format!(", path MTU {m} B"));
    }
    if let Some(l) = t.loss_rate {
        line.push_str(&format!(", loss {}", format_loss(l)));
    }
    line
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::host::{Nic, Probe};

    fn limits(max: u64, cc: &[&str], privileged: bool) -> HostLimits {
        HostLimits {
            rmem_max: max,
            wmem_max: max,
            tcp_rmem: [4096, 131072, max],
            tcp_wmem: [4096, 16384, max],
            congestion: cc.iter().map(|s| s.to_string()).collect(),
            privileged,
        }
    }

    fn probed(rtt_ms: u64, rate: Option<f64>, lower_bound: bool) -> Probed {
        Probed {
            remote: "198.18.0.2:5301".into(),
            rtt: Duration::from_millis(rtt_ms),
            rate,
            lower_bound,
            confidence: rate.map(|_| 0.9),
            loss_rate: 0.0,
            mtu: Ok(1500),
            probe_secs: 1.2,
        }
    }

    #[test]
    fn probe_facts_become_the_target() {
        let ms = Duration::from_millis;
        let g = 1e9;
        // (probe, flags) → (rate, rate source, rtt, rtt source, a note mentioning)
        type Case = (
            Probed,
            Given,
            u64,
            &'static str,
            Duration,
            &'static str,
            Option<&'static str>,
        );
        let cases: Vec<Case> = vec![
            // a clean estimate: both from the probe, nothing to say
            (
                probed(100, Some(g), false),
                Given::default(),
                1_000_000_000,
                "probe",
                ms(100),
                "probe",
                None,
            ),
            // flags win for their part only
            (
                probed(100, Some(g), false),
                Given {
                    rate: Some(5_000_000_000),
                    rtt: None,
                },
                5_000_000_000,
                "flag",
                ms(100),
                "probe",
                Some("--rate 5.00 Gbit/s replaces"),
            ),
            (
                probed(100, Some(g), false),
                Given {
                    rate: None,
                    rtt: Some(ms(40)),
                },
                1_000_000_000,
                "probe",
                ms(40),
                "flag",
                Some("--rtt 40.0 ms replaces"),
            ),
            // a lower bound below the default: the default, and why
            (
                probed(1, Some(3e9), true),
                Given::default(),
                DEFAULT_RATE,
                "default",
                ms(1),
                "probe",
                Some("only a lower bound"),
            ),
            // a lower bound above the default: the bound itself
            (
                probed(1, Some(2e10), true),
                Given::default(),
                20_000_000_000,
                "probe",
                ms(1),
                "probe",
                Some("give --rate if the path is faster"),
            ),
            // a lower bound with --rate: the flag, no fallback
            (
                probed(1, Some(3e9), true),
                Given {
                    rate: Some(2_000_000_000),
                    rtt: None,
                },
                2_000_000_000,
                "flag",
                ms(1),
                "probe",
                Some("≥ 3.00 Gbit/s"),
            ),
            // no estimate at all
            (
                probed(100, None, false),
                Given::default(),
                DEFAULT_RATE,
                "default",
                ms(100),
                "probe",
                Some("no rate estimate"),
            ),
            // a nonsense estimate counts as none
            (
                probed(100, Some(f64::NAN), false),
                Given::default(),
                DEFAULT_RATE,
                "default",
                ms(100),
                "probe",
                Some("no rate estimate"),
            ),
            // a zero RTT (below the clock) is raised, not audited as a zero BDP
            (
                probed(0, Some(g), false),
                Given::default(),
                1_000_000_000,
                "probe",
                MIN_RTT,
                "probe",
                None,
            ),
        ];
        for (i, (p, given, rate, rate_src, rtt, rtt_src, note)) in cases.into_iter().enumerate() {
            let (t, rec) = target_for("peer", &p, given);
            assert_eq!((t.rate, t.rtt), (rate, rtt), "case {i}");
            assert_eq!(
                (rec.rate_source.as_str(), rec.rtt_source.as_str()),
                (rate_src, rtt_src),
                "case {i}"
            );
            assert_eq!(rec.source, TargetSource::Probe);
            assert_eq!(rec.peer.as_deref(), Some("peer"));
            assert_eq!(rec.mtu, Some(1500));
            assert_eq!(rec.loss_rate, Some(0.0));
            assert_eq!(rec.probed_rtt_secs, Some(p.rtt.as_secs_f64()));
            match note {
                None => assert!(rec.notes.is_empty(), "case {i}: {:?}", rec.notes),
                Some(n) => assert!(
                    rec.notes.iter().any(|x| x.contains(n)),
                    "case {i}: no {n:?} in {:?}",
                    rec.notes
                ),
            }
        }
    }

    #[test]
    fn a_lower_bound_is_recorded_as_one() {
        let (_, rec) = target_for("p", &probed(1, Some(3e9), true), Given::default());
        assert!(rec.rate_lower_bound);
        assert_eq!(rec.probed_rate, Some(3_000_000_000));
        let (_, rec) = target_for("p", &probed(1, None, true), Given::default());
        assert!(!rec.rate_lower_bound);
        assert_eq!(rec.probed_rate, None);
        let (t, rec) = target_from_flags(Given {
            rate: None,
            rtt: Some(Duration::from_millis(30)),
        });
        assert_eq!((t.rate, t.rtt), (DEFAULT_RATE, Duration::from_millis(30)));
        assert_eq!(
            (
                rec.source.as_str(),
                rec.rate_source.as_str(),
                rec.rtt_source.as_str()
            ),
            ("flags", "default", "flag")
        );
    }

    fn find<'a>(f: &'a [Finding], item: &str) -> &'a Finding {
        f.iter()
            .find(|x| x.item == item)
            .unwrap_or_else(|| panic!("no {item}"))
    }

    #[test]
    fn peer_limits_are_judged_against_the_target() {
        // 1 Gbit/s × 100 ms: BDP 12.5 MB, caps of 32 MiB wanted.
        let t = Target {
            rate: 1_000_000_000,
            rtt: Duration::from_millis(100),
        };
        let small = peer_findings(&t, &Ok(limits(4 << 20, &["cubic", "reno"], false)));
        assert_eq!(small.len(), 6);
        assert!(small.iter().all(|f| f.area == "peer"));
        let r = find(&small, "net.core.rmem_max");
        assert_eq!(r.current, Observed::Known("4194304".into()));
        assert_eq!(r.recommended.as_deref(), Some("33554432"));
        assert_eq!(r.severity, Severity::Warn);
        assert!(r.why.contains("when the peer receives"), "{}", r.why);
        let w = find(&small, "net.ipv4.tcp_wmem");
        assert_eq!(w.current, Observed::Known("4096 16384 4194304".into()));
        assert_eq!(w.recommended.as_deref(), Some("4096 16384 33554432"));
        let cc = find(&small, "congestion controls");
        assert_eq!(cc.severity, Severity::Warn);
        assert!(cc.recommended.as_deref().unwrap_or("").starts_with("bbr"));
        assert_eq!(find(&small, "buffer forcing").severity, Severity::Info);

        let big = peer_findings(&t, &Ok(limits(64 << 20, &["cubic", "bbr"], false)));
        for f in &big {
            assert_eq!(f.severity, Severity::Ok, "{f:?}");
        }
        // A peer tuned beyond the target keeps its values.
        assert_eq!(
            find(&big, "net.core.wmem_max").recommended.as_deref(),
            Some("67108864")
        );

        // 10 Gbit/s × 250 ms with 1 MiB caps: 64 streams cannot cover it.
        let far = Target {
            rate: 10_000_000_000,
            rtt: Duration::from_millis(250),
        };
        let tiny = peer_findings(&far, &Ok(limits(1 << 20, &["bbr"], false)));
        assert_eq!(
            find(&tiny, "net.core.rmem_max").severity,
            Severity::Critical
        );

        let unknown = peer_findings(&t, &Err("peer has no /proc".into()));
        assert_eq!(unknown.len(), 6);
        for f in &unknown {
            assert_eq!(
                f.current,
                Observed::Unknown("peer has no /proc".into()),
                "{f:?}"
            );
            assert_eq!(f.severity, Severity::Info);
        }
    }

    fn facts(cc: &str, nic_mtu: Option<u32>) -> HostFacts {
        let mut sysctls = BTreeMap::new();
        sysctls.insert(
            "net.ipv4.tcp_congestion_control".to_string(),
            Probe::Known(cc.to_string()),
        );
        HostFacts {
            sysctls,
            fq_available: Probe::Known(true),
            nics: nic_mtu
                .map(|m| {
                    let u = || "test".to_string();
                    Nic {
                        name: "eth0".into(),
                        driver: Probe::Unknown(u()),
                        mtu: Probe::Known(m),
                        speed_mbps: Probe::Unknown(u()),
                        offloads: Probe::Unknown(u()),
                        rings: Probe::Unknown(u()),
                        numa_node: Probe::Unknown(u()),
                        local_cpus: Probe::Unknown(u()),
                        irqs: Probe::Unknown(u()),
                    }
                })
                .into_iter()
                .collect(),
            governors: Probe::Unknown("test".into()),
            numa_nodes: Probe::Known(1),
        }
    }

    #[test]
    fn loss_and_mtu_become_path_findings() {
        let mut p = probed(100, Some(1e9), false);
        let f = path_findings(&p, &facts("cubic", Some(9000)));
        let loss = find(&f, "path loss");
        assert_eq!(
            (loss.severity, &loss.current),
            (Severity::Ok, &Observed::Known("0%".into()))
        );
        let mtu = find(&f, "path mtu");
        assert_eq!(mtu.current, Observed::Known("1500 B".into()));
        assert!(mtu.why.contains("9000"), "{}", mtu.why);

        p.loss_rate = 0.002;
        let f = path_findings(&p, &facts("cubic", None));
        let loss = find(&f, "path loss");
        assert_eq!(loss.severity, Severity::Warn);
        assert_eq!(loss.recommended.as_deref(), Some("bbr"));
        assert_eq!(loss.current, Observed::Known("0.2%".into()));
        assert_eq!(
            find(&path_findings(&p, &facts("bbr", None)), "path loss").severity,
            Severity::Info
        );

        p.mtu = Ok(9000);
        assert_eq!(
            find(&path_findings(&p, &facts("bbr", None)), "path mtu").severity,
            Severity::Ok
        );
        p.mtu = Err("not probed: cannot set Don't Fragment".into());
        let m = path_findings(&p, &facts("bbr", None));
        assert!(
            matches!(&find(&m, "path mtu").current, Observed::Unknown(w) if w.contains("Don't"))
        );
    }
}
