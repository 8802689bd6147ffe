//! What a user asks of a lab link, before it is resolved for the model.
//!
//! [`LinkSpec`] is written as the user thinks of the path (a round-trip
//! time, a rate each way, a loss rate, a queue in BDPs, milliseconds or
//! bytes) and stored with the lab so `lab set` can change one knob and
//! re-resolve the rest. [`LinkSpec::dir_config`] turns it into the
//! per-direction [`DirConfig`] the model takes: half the RTT each way, the
//! queue in bytes at that direction's rate, jitter split between the two
//! directions so the RTT stays within `rtt ± jitter`.

use std::time::Duration;

use fatpipe_schema::units;
use serde::{Deserialize, Serialize};

use crate::model::{DirConfig, Nanos, ETHERNET_OVERHEAD};
use crate::Error;

/// The largest per-packet overhead accepted (far above any real framing;
/// a bound so a typo does not make a link crawl).
pub const MAX_OVERHEAD: u32 = 1000;

/// IPv4 + TCP headers of a full-sized Linux segment: 20 + 20 + 12 bytes of
/// timestamp option.
const TCP_IPV4_HEADERS: u32 = 52;

/// Which way through the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Dir {
    /// From end `a` to end `b` ("up").
    AtoB,
    /// From end `b` to end `a` ("down").
    BtoA,
}

/// The drop-tail queue limit in front of the bottleneck.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum QueueSpec {
    /// A multiple of the bandwidth-delay product (`1bdp`, `0.5bdp`).
    Bdp(f64),
    /// The bytes the rate drains in this time (`50ms`).
    Time(Duration),
    /// A fixed number of bytes (`16MB`, `4M`).
    Bytes(u64),
    /// No limit (the backlog buffer still bounds it).
    Unlimited,
}

impl QueueSpec {
    /// Parses `1bdp`, `0.5bdp`, `50ms`, `16MB`, `4M` or `unlimited`.
    pub fn parse(text: &str) -> Result<QueueSpec, Error> {
        let t = text.trim().to_ascii_lowercase();
        if t == "unlimited" || t == "none" {
            return Ok(QueueSpec::Unlimited);
        }
        if let Some(n) = t.strip_suffix("bdp") {
            let n = if n.is_empty() { "1" } else { n };
            return match n.parse::<f64>() {
                Ok(f) if f.is_finite() && f > 0.0 => Ok(QueueSpec::Bdp(f)),
                _ => Err(Error::Invalid(format!(
                    "queue '{text}': use e.g. 1bdp, 0.5bdp, 50ms or 16MB"
                ))),
            };
        }
        if t.ends_with('s') && !t.ends_with("bs") {
            return Ok(QueueSpec::Time(units::parse_duration(text)?));
        }
        Ok(QueueSpec::Bytes(units::parse_size(text)?))
    }

    /// The limit in bytes for a direction of `rate_bps` on a path of `rtt`.
    /// Derived limits never go below ten 1500-byte packets.
    pub fn bytes(&self, rate_bps: u64, rtt: Duration) -> u64 {
        let floor = 15_000;
        match *self {
            QueueSpec::Unlimited => u64::MAX,
            QueueSpec::Bytes(b) => b,
            _ if rate_bps == 0 => u64::MAX,
            QueueSpec::Bdp(f) => ((units::bdp_bytes(rate_bps, rtt) as f64 * f) as u64).max(floor),
            QueueSpec::Time(d) => units::bdp_bytes(rate_bps, d).max(floor),
        }
    }
}

impl std::fmt::Display for QueueSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueueSpec::Bdp(x) => write!(f, "{x}bdp"),
            QueueSpec::Time(d) => f.write_str(&units::format_duration(*d)),
            QueueSpec::Bytes(b) => f.write_str(&units::format_bytes(*b)),
            QueueSpec::Unlimited => f.write_str("unlimited"),
        }
    }
}

/// An emulated path as the user describes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkSpec {
    /// Round-trip propagation delay (half each way).
    pub rtt: Duration,
    /// Bottleneck rate from `a` to `b` in bit/s; 0 means unlimited.
    pub rate_up: u64,
    /// Bottleneck rate from `b` to `a` in bit/s; 0 means unlimited.
    pub rate_down: u64,
    /// Long-run random loss probability per segment, each direction.
    pub loss: f64,
    /// Mean loss burst length in segments (1 = independent losses).
    pub loss_burst: f64,
    /// The RTT varies within `rtt ± jitter` (half of it each way), without
    /// reordering.
    pub jitter: Duration,
    /// Drop-tail queue limit in front of each bottleneck.
    pub queue: QueueSpec,
    /// MTU of both ends' devices.
    pub mtu: u32,
    /// Bytes of framing each packet costs the bottleneck on top of its IP
    /// bytes ([`ETHERNET_OVERHEAD`] by default, 0 counts IP bytes only).
    /// Records written before this field existed had none, hence 0 there.
    #[serde(default)]
    pub overhead: u32,
    /// Bit error rate (each bit flipped with this probability).
    pub corrupt: f64,
    /// Undetected payload bit error rate: each payload bit flipped with
    /// this probability and the checksum fixed up, so the receiver's TCP
    /// or UDP accepts it. Records from before the field had none (0).
    #[serde(default)]
    pub tamper: f64,
    /// Seed of the link's random generators.
    pub seed: u64,
}

impl Default for LinkSpec {
    fn default() -> LinkSpec {
        LinkSpec {
            rtt: Duration::ZERO,
            rate_up: 0,
            rate_down: 0,
            loss: 0.0,
            loss_burst: 1.0,
            jitter: Duration::ZERO,
            queue: QueueSpec::Bdp(1.0),
            mtu: 1500,
            overhead: ETHERNET_OVERHEAD,
            corrupt: 0.0,
            tamper: 0.0,
            seed: 1,
        }
    }
}

/// A live change to a running link (`lab set`); `None` keeps a value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkChange {
    /// New round-trip time.
    pub rtt: Option<Duration>,
    /// New rate each way (a→b, b→a).
    pub rate: Option<(u64, u64)>,
    /// New loss probability.
    pub loss: Option<f64>,
    /// New mean loss burst length.
    pub loss_burst: Option<f64>,
    /// New jitter.
    pub jitter: Option<Duration>,
    /// New queue limit.
    pub queue: Option<QueueSpec>,
    /// New bit error rate.
    pub corrupt: Option<f64>,
    /// New undetected payload bit error rate.
    #[serde(default)]
    pub tamper: Option<f64>,
    /// New per-packet framing overhead in bytes.
    #[serde(default)]
    pub overhead: Option<u32>,
    /// Take the link down for this long, starting now.
    pub down: Option<Duration>,
}

impl LinkSpec {
    /// A symmetric link of `rtt` and `rate_bps` each way, everything else
    /// default (no loss, a 1 BDP queue, MTU 1500).
    pub fn new(rtt: Duration, rate_bps: u64) -> LinkSpec {
        LinkSpec {
            rtt,
            rate_up: rate_bps,
            rate_down: rate_bps,
            ..LinkSpec::default()
        }
    }

    /// Checks that every value is one the emulator can honour.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: &str| Err(Error::Invalid(m.to_string()));
        if self.rtt > Duration::from_secs(10) {
            return bad("--rtt must be at most 10s");
        }
        if self.jitter > self.rtt {
            return bad("--jitter must not exceed --rtt");
        }
        if ![self.loss, self.corrupt, self.tamper]
            .iter()
            .all(|p| (0.0..=1.0).contains(p))
        {
            return bad("--loss, --corrupt and --tamper must lie in [0, 1]");
        }
        if !self.loss_burst.is_finite() || self.loss_burst < 1.0 {
            return bad("--loss-burst must be at least 1 (segments)");
        }
        if !(1280..=65_535).contains(&self.mtu) {
            return bad("--mtu must lie in 1280..65535 (IPv6 needs 1280)");
        }
        if self.overhead > MAX_OVERHEAD {
            return bad("--overhead must be at most 1000 (bytes per packet)");
        }
        Ok(())
    }

    /// Applies a live change (the down window is the driver's to place).
    pub fn apply(&mut self, c: &LinkChange) {
        if let Some(v) = c.rtt {
            self.rtt = v;
        }
        if let Some((up, down)) = c.rate {
            self.rate_up = up;
            self.rate_down = down;
        }
        if let Some(v) = c.loss {
            self.loss = v;
        }
        if let Some(v) = c.loss_burst {
            self.loss_burst = v;
        }
        if let Some(v) = c.jitter {
            self.jitter = v;
        }
        if let Some(v) = c.queue {
            self.queue = v;
        }
        if let Some(v) = c.corrupt {
            self.corrupt = v;
        }
        if let Some(v) = c.tamper {
            self.tamper = v;
        }
        if let Some(v) = c.overhead {
            self.overhead = v;
        }
    }

    /// The rate of one direction in bit/s (0 = unlimited).
    pub fn rate(&self, dir: Dir) -> u64 {
        match dir {
            Dir::AtoB => self.rate_up,
            Dir::BtoA => self.rate_down,
        }
    }

    /// The model's parameters for one direction.
    pub fn dir_config(&self, dir: Dir, down: Option<(Nanos, Nanos)>) -> DirConfig {
        let rate = self.rate(dir);
        let salt = match dir {
            Dir::AtoB => 0,
            Dir::BtoA => 0x5EED_0000_0000_0001,
        };
        DirConfig {
            rate_bps: rate,
            overhead: self.overhead,
            delay: (self.rtt / 2).as_nanos() as Nanos,
            jitter: (self.jitter / 2).as_nanos() as Nanos,
            loss: self.loss,
            loss_burst: self.loss_burst,
            queue_bytes: self.queue.bytes(rate, self.rtt),
            ber: self.corrupt,
            tamper: self.tamper,
            down,
            seed: self.seed ^ salt,
        }
    }

    /// The most TCP payload one direction can carry, in bit/s (`None` when
    /// its rate is unlimited): each full-sized segment carries `mtu - 52`
    /// bytes (IPv4 and TCP headers with the timestamp option Linux sends)
    /// and costs the link `mtu + overhead`. 1 Gbit/s at MTU 1500 with
    /// Ethernet framing: 1448/1538 of it, 941.5 Mbit/s. Tests and benches
    /// derive their bounds from this rather than from a constant.
    pub fn tcp_goodput_ceiling(&self, dir: Dir) -> Option<f64> {
        let rate = self.rate(dir);
        if rate == 0 {
            return None;
        }
        let payload = f64::from(self.mtu.saturating_sub(TCP_IPV4_HEADERS));
        Some(rate as f64 * payload / f64::from(self.mtu + self.overhead))
    }

    /// One line for people: "93.0 ms, 1.00 Gbit/s, loss 0.01%, queue 1bdp".
    pub fn summary(&self) -> String {
        let rate = |r: u64| {
            if r == 0 {
                "unlimited".to_string()
            } else {
                units::format_rate(r as f64)
            }
        };
        let mut s = format!("rtt {}", units::format_duration(self.rtt));
        if self.rate_up == self.rate_down {
            s += &format!(", rate {}", rate(self.rate_up));
        } else {
            s += &format!(
                ", rate {} up / {} down",
                rate(self.rate_up),
                rate(self.rate_down)
            );
        }
        if self.loss > 0.0 {
            s += &format!(", loss {}%", self.loss * 100.0);
            if self.loss_burst > 1.0 {
                s += &format!(" (bursts of {})", self.loss_burst);
            }
        }
        if !self.jitter.is_zero() {
            s += &format!(", jitter {}", units::format_duration(self.jitter));
        }
        if self.corrupt > 0.0 {
            s += &format!(", ber {:e}", self.corrupt);
        }
        if self.tamper > 0.0 {
            s += &format!(", tamper {:e}", self.tamper);
        }
        s += &format!(", queue {}, mtu {}", self.queue, self.mtu);
        if self.overhead != ETHERNET_OVERHEAD {
            s += &format!(", overhead {} B", self.overhead);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_forms() {
        assert_eq!(QueueSpec::parse("1bdp").ok(), Some(QueueSpec::Bdp(1.0)));
        assert_eq!(QueueSpec::parse("0.5BDP").ok(), Some(QueueSpec::Bdp(0.5)));
        assert_eq!(
            QueueSpec::parse("50ms").ok(),
            Some(QueueSpec::Time(Duration::from_millis(50)))
        );
        assert_eq!(
            QueueSpec::parse("16MB").ok(),
            Some(QueueSpec::Bytes(16_000_000))
        );
        assert_eq!(QueueSpec::parse("4M").ok(), Some(QueueSpec::Bytes(4 << 20)));
        assert_eq!(
            QueueSpec::parse("unlimited").ok(),
            Some(QueueSpec::Unlimited)
        );
        for bad in ["xbdp", "-1bdp", "5 parsecs", "12Q"] {
            assert!(QueueSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn queue_bytes_follow_rate_and_rtt() {
        let rtt = Duration::from_millis(93);
        // 1 Gbit/s x 93 ms = 11.625 MB.
        assert_eq!(QueueSpec::Bdp(1.0).bytes(1_000_000_000, rtt), 11_625_000);
        assert_eq!(
            QueueSpec::Time(Duration::from_millis(50)).bytes(1_000_000_000, rtt),
            6_250_000
        );
        assert_eq!(QueueSpec::Bytes(16_000_000).bytes(1, rtt), 16_000_000);
        assert_eq!(
            QueueSpec::Bdp(1.0).bytes(0, rtt),
            u64::MAX,
            "no rate, no queue"
        );
        assert_eq!(
            QueueSpec::Bdp(1.0).bytes(1_000_000, Duration::from_millis(1)),
            15_000
        );
    }

    #[test]
    fn directions_split_rtt_jitter_and_rates() {
        let spec = LinkSpec {
            rtt: Duration::from_millis(93),
            rate_up: 100_000_000,
            rate_down: 1_000_000_000,
            jitter: Duration::from_millis(2),
            ..LinkSpec::default()
        };
        let up = spec.dir_config(Dir::AtoB, None);
        let down = spec.dir_config(Dir::BtoA, None);
        assert_eq!(up.delay, 46_500_000);
        assert_eq!(up.jitter, 1_000_000);
        assert_eq!((up.rate_bps, down.rate_bps), (100_000_000, 1_000_000_000));
        assert_ne!(up.seed, down.seed);
        assert_eq!(down.queue_bytes, 11_625_000);
    }

    #[test]
    fn ethernet_framing_by_default_and_the_goodput_it_leaves() {
        let spec = LinkSpec::new(Duration::from_millis(93), 1_000_000_000);
        assert_eq!(spec.overhead, 38);
        assert_eq!(spec.dir_config(Dir::AtoB, None).overhead, 38);
        // 1448 payload bytes per 1538 on the wire: what a real NIC carries.
        let eth = spec.tcp_goodput_ceiling(Dir::AtoB).unwrap_or(0.0);
        assert!((eth - 941.48e6).abs() < 0.01e6, "{eth}");
        let ip_only = LinkSpec {
            overhead: 0,
            ..spec.clone()
        };
        let ip = ip_only.tcp_goodput_ceiling(Dir::BtoA).unwrap_or(0.0);
        assert!((ip - 965.33e6).abs() < 0.01e6, "{ip}");
        assert!(ip_only.summary().contains("overhead 0 B"));
        assert!(!spec.summary().contains("overhead"), "{}", spec.summary());
        assert_eq!(LinkSpec::default().tcp_goodput_ceiling(Dir::AtoB), None);
        // A record from before the field existed counted IP bytes only.
        let mut old = serde_json::to_value(&spec).expect("json");
        old.as_object_mut().map(|o| o.remove("overhead"));
        let old: LinkSpec = serde_json::from_value(old).expect("old record");
        assert_eq!(old.overhead, 0);
        let too_big = LinkSpec {
            overhead: MAX_OVERHEAD + 1,
            ..spec
        };
        assert!(too_big.validate().is_err());
    }

    #[test]
    fn validation_and_live_changes() {
        let mut spec = LinkSpec::default();
        assert!(spec.validate().is_ok());
        spec.apply(&LinkChange {
            loss: Some(0.001),
            rtt: Some(Duration::from_millis(200)),
            ..LinkChange::default()
        });
        assert_eq!(spec.loss, 0.001);
        assert_eq!(spec.rtt, Duration::from_millis(200));
        assert!(spec.summary().contains("loss 0.1%"), "{}", spec.summary());
        spec.apply(&LinkChange {
            overhead: Some(0),
            ..LinkChange::default()
        });
        assert_eq!((spec.overhead, spec.loss), (0, 0.001));
        spec.apply(&LinkChange {
            tamper: Some(1e-7),
            ..LinkChange::default()
        });
        assert_eq!(spec.dir_config(Dir::BtoA, None).tamper, 1e-7);
        assert!(spec.summary().contains("tamper 1e-7"), "{}", spec.summary());
        assert!(spec.validate().is_ok());
        spec.tamper = 2.0;
        assert!(spec.validate().is_err());
        spec.tamper = 0.0;
        // A change sent by an older client has no tamper field: unchanged.
        let old: LinkChange = serde_json::from_str(r#"{"rtt":null,"rate":null,"loss":null,"loss_burst":null,"jitter":null,"queue":null,"corrupt":null,"down":null}"#)
            .expect("old change");
        assert_eq!(old.tamper, None);
        spec.mtu = 1000;
        assert!(spec.validate().is_err());
        spec.mtu = 9000;
        spec.jitter = Duration::from_secs(1);
        assert!(spec.validate().is_err());
    }
}
