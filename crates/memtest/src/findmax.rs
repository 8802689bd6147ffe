//! `fatpipe test -u --find-max`: the highest UDP rate a path and its
//! receiver carry without loss, and the highest within an allowed loss,
//! per datagram length (RFC 2544, section 26.1, "throughput").
//!
//! Two halves, kept apart so the policy is testable without a socket.
//! [`Search`] is the pure state machine: it proposes the next trial
//! ([`Search::poll_trial`]) and takes each trial's outcome
//! ([`Search::handle_outcome`]); it reads no clock and opens nothing, and
//! the tests below run it against simulated receivers. [`run`] is the
//! driver: each trial is one ordinary UDP test session at a fixed rate
//! (short while searching, one full-length trial to confirm), and the
//! outcomes become the schema's [`FindMaxReport`].
//!
//! The search: a first trial as fast as the sender can (or at `-b`) gives
//! the sender's ceiling and, from what arrived, a first guess of the
//! receiver's capacity; then two brackets narrow at once, one for "no
//! loss" and one for "at most `loss_max`", each trial informing both.
//! A failing trial's received rate is the next guess (the capacity is
//! near it); when a guess would not halve the bracket, plain bisection
//! does. Every trial is judged at the rate the sender actually offered,
//! not the one asked, so a sender that falls short never passes for one
//! that kept up; and when the top of the range passes, the answer is the
//! sender's ceiling and is reported as a lower bound on the path.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fatpipe_engine::{EngineError, Result};
use fatpipe_schema::test::{self as schema, FindMaxLength, FindMaxReport, FindMaxTrial, RatePoint};
use fatpipe_schema::units;

use crate::msg::{Direction, Protocol, TestParams};
use crate::TestPlan;

/// Per-stream rate asked for when the sender should go as fast as it can.
pub const UNLIMITED_BPS: u64 = 1_000_000_000_000;

/// Bytes each frame costs on Ethernet beyond its IP packet: preamble and
/// start delimiter 8, header 14, FCS 4, inter-frame gap 12.
pub const ETHERNET_FRAMING: u32 = 38;

/// A trial whose sender offered less than this share of the asked rate
/// shows the sender's limit.
const SHORT: f64 = 0.98;

/// How the search runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchConfig {
    /// Loss allowed for the second answer, as a fraction (0.005 = 0.5 %).
    pub loss_max: f64,
    /// Relative width at which a bracket counts as found (0.01 = 1 %).
    pub precision: f64,
    /// Most trials per length, confirmations included.
    pub max_trials: u32,
    /// Most confirming trials (each one lower after a failed one).
    pub max_confirms: u32,
    /// Highest rate to offer, payload bit/s (`-b`); `None`: as fast as the
    /// sender can.
    pub ceiling: Option<f64>,
}

impl Default for SearchConfig {
    fn default() -> Self {
        SearchConfig {
            loss_max: 0.005,
            precision: 0.01,
            max_trials: 24,
            max_confirms: 3,
            ceiling: None,
        }
    }
}

/// The next trial the search wants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Trial {
    /// Payload bit/s to offer; `None`: the ceiling (`-b`, or as fast as the
    /// sender can).
    pub rate: Option<f64>,
    /// The full-length confirming trial.
    pub confirm: bool,
}

/// What one trial measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    /// Payload bit/s the sender offered (datagrams sent over the trial).
    pub offered_bps: f64,
    /// Payload bit/s that arrived.
    pub received_bps: f64,
    /// Datagrams sent.
    pub sent: u64,
    /// Datagrams lost.
    pub lost: u64,
}

impl Outcome {
    fn loss(&self) -> f64 {
        if self.sent == 0 {
            1.0
        } else {
            self.lost as f64 / self.sent as f64
        }
    }
}

/// What the search found for one length.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    /// Highest loss-free payload bit/s (the confirming trial's offered
    /// rate when it passed).
    pub loss_free: Option<f64>,
    /// The confirming trial lost nothing.
    pub confirmed: bool,
    /// Highest payload bit/s within the allowed loss.
    pub with_loss: Option<f64>,
    /// The sender, not the path, bounded the answer.
    pub lower_bound: bool,
    /// Most the sender offered in any trial, payload bit/s.
    pub sender_max: f64,
    /// Trials run.
    pub trials: u32,
    /// How the search ended, in one sentence.
    pub statement: String,
}

/// The search state machine for one datagram length.
#[derive(Debug, Clone)]
pub struct Search {
    cfg: SearchConfig,
    trials: u32,
    /// The first (ceiling) trial is done.
    started: bool,
    /// Highest rate the sender managed where it was asked for more.
    sender_limit: Option<f64>,
    sender_max: f64,
    free: Bracket,
    lossy: Bracket,
    /// Capacity estimates from the last failing trials, for the probes.
    hint_free: Hint,
    hint_lossy: Hint,
    /// Offered over asked in the last trial where the sender fell a
    /// little short (it starts late, its clock is coarse): asks are
    /// divided by it so that what is offered is what the search meant.
    gain: f64,
    /// The confirmation under way: the rate asked (`None`: the ceiling).
    confirming: Option<Option<f64>>,
    confirms: u32,
    /// The short trials' loss-free rate, kept while confirming.
    short_lo: Option<f64>,
    /// Offered rates of every short trial that lost nothing.
    free_passes: Vec<f64>,
    done: Option<Found>,
    /// Why the search stopped early, if it did.
    cut_short: Option<String>,
}

/// A capacity estimate from a failing trial and how much of it the
/// probes used: first just below it, then just above it, then nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Hint {
    value: Option<f64>,
    used: u8,
    precision: f64,
}

impl Hint {
    fn new(precision: f64) -> Hint {
        Hint {
            value: None,
            used: 0,
            precision,
        }
    }

    /// A new estimate; one within the precision of the last keeps what
    /// was already tried of it.
    fn renew(self, value: f64) -> Hint {
        match self.value {
            Some(v) if (value - v).abs() <= v * self.precision / 2.0 => self,
            _ => Hint {
                value: Some(value),
                used: 0,
                ..self
            },
        }
    }

    /// The next candidate rate, once each.
    fn next(&mut self) -> Option<f64> {
        let v = self.value?;
        let p = self.precision;
        self.used += 1;
        match self.used {
            1 => Some(v * (1.0 - p / 2.0)),
            2 => Some(v * (1.0 + p)),
            _ => None,
        }
    }
}

/// Highest passing and lowest failing offered rate of one criterion.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Bracket {
    lo: Option<f64>,
    hi: Option<f64>,
}

impl Bracket {
    /// Takes a trial at offered `rate`. A result that contradicts the
    /// bracket (noise near the edge) wins over the older one.
    fn update(&mut self, rate: f64, pass: bool) {
        if pass {
            if self.hi.is_some_and(|h| rate >= h) {
                self.hi = None;
            }
            self.lo = Some(self.lo.map_or(rate, |l| l.max(rate)));
        } else {
            if self.lo.is_some_and(|l| rate <= l) {
                self.lo = None;
            }
            self.hi = Some(self.hi.map_or(rate, |h| h.min(rate)));
        }
    }
}

impl Search {
    /// A search that has run no trial yet.
    pub fn new(cfg: SearchConfig) -> Search {
        Search {
            cfg,
            trials: 0,
            started: false,
            sender_limit: None,
            sender_max: 0.0,
            free: Bracket::default(),
            lossy: Bracket::default(),
            hint_free: Hint::new(cfg.precision),
            hint_lossy: Hint::new(cfg.precision),
            gain: 1.0,
            confirming: None,
            confirms: 0,
            short_lo: None,
            free_passes: Vec::new(),
            done: None,
            cut_short: None,
        }
    }

    /// The next trial, or `None` once [`result`](Self::result) is set.
    pub fn poll_trial(&mut self) -> Option<Trial> {
        if self.done.is_some() {
            return None;
        }
        if !self.started {
            return Some(Trial {
                rate: None,
                confirm: false,
            });
        }
        if let Some(rate) = self.confirming {
            return Some(Trial {
                rate,
                confirm: true,
            });
        }
        if self.trials + 1 >= self.cfg.max_trials {
            self.cut_short = Some(format!(
                "the search stopped after {} trials, its budget",
                self.trials
            ));
            return self.start_confirming();
        }
        let next = if !self.settled(&self.free) {
            let (rate, hint) = self.probe(self.free, self.hint_free);
            self.hint_free = hint;
            rate
        } else if !self.settled(&self.lossy) {
            let (rate, hint) = self.probe(self.lossy, self.hint_lossy);
            self.hint_lossy = hint;
            rate
        } else {
            return self.start_confirming();
        };
        Some(Trial {
            rate: Some(next / self.gain),
            confirm: false,
        })
    }

    /// Takes the outcome of the trial [`poll_trial`](Self::poll_trial)
    /// proposed last.
    pub fn handle_outcome(&mut self, trial: Trial, out: Outcome) {
        self.trials += 1;
        self.sender_max = self.sender_max.max(out.offered_bps);
        if out.sent == 0 {
            self.finish(false, "the sender sent no datagram".into());
            return;
        }
        let rate = out.offered_bps;
        if let Some(r) = trial.rate.filter(|_| !trial.confirm) {
            let g = rate / r;
            // A sender far short is at its limit, not late: that is for
            // the brackets, not the gain.
            if (0.9..=1.05).contains(&g) {
                self.gain = g.min(1.0);
            }
        }
        // The sender fell short of what it was asked (or was asked for
        // everything): it showed what it can offer. The most it ever
        // showed is the top; a trial where it fell short through noise
        // (another process took the core) does not lower it.
        if trial.rate.is_none_or(|r| rate < r * SHORT) {
            self.sender_limit = Some(self.sender_limit.map_or(rate, |l| l.max(rate)));
        }
        let loss = out.loss();
        let free = out.lost == 0;
        let lossy = loss <= self.cfg.loss_max;
        if trial.confirm {
            self.handle_confirm(trial, out, free);
            return;
        }
        self.started = true;
        if free {
            self.free_passes.push(rate);
        }
        self.free.update(rate, free);
        self.lossy.update(rate, lossy);
        // What arrived when too much was sent is near the capacity; the
        // allowed loss lets the sender go that much above it.
        if !free {
            self.hint_free = self.hint_free.renew(out.received_bps);
        }
        if !lossy {
            self.hint_lossy = self
                .hint_lossy
                .renew(out.received_bps / (1.0 - self.cfg.loss_max));
        }
    }

    /// The result, once the search is over.
    pub fn result(&self) -> Option<&Found> {
        self.done.as_ref()
    }

    /// The top of the range: what the sender can offer.
    fn top(&self) -> f64 {
        self.sender_limit.unwrap_or(self.sender_max)
    }

    /// Whether a bracket needs no more trials.
    fn settled(&self, b: &Bracket) -> bool {
        let top = self.top();
        let lo = b.lo.unwrap_or(0.0);
        if lo >= top * (1.0 - self.cfg.precision) {
            return true;
        }
        match b.hi {
            Some(hi) => hi - lo <= hi * self.cfg.precision || hi < top / 1000.0,
            None => false,
        }
    }

    /// The next rate to try in a bracket, strictly inside it so that
    /// every trial narrows it: just below the capacity estimate (expected
    /// to pass), else just above it (expected to fail), else the middle.
    fn probe(&self, b: Bracket, hint: Hint) -> (f64, Hint) {
        let lo = b.lo.unwrap_or(0.0);
        let hi = b.hi.unwrap_or_else(|| self.top()).min(self.top());
        let p = self.cfg.precision;
        let inside = |r: f64| r > lo * (1.0 + p / 4.0) && r < hi * (1.0 - p / 4.0);
        // Each estimate is tried once below and once above: a sender that
        // keeps falling a little short of it must not be asked for the
        // same rate trial after trial.
        let mut hint = hint;
        while let Some(r) = hint.next() {
            if inside(r) {
                return (r, hint);
            }
        }
        ((lo + hi) / 2.0, hint)
    }

    fn start_confirming(&mut self) -> Option<Trial> {
        // A later failure below an earlier pass (noise) may have left the
        // bracket without a passing rate: the highest pass is still the
        // best candidate, and the confirming trial judges it.
        if self.free.lo.is_none() {
            self.free.lo = self.free_passes.iter().copied().reduce(f64::max);
        }
        let Some(lo) = self.free.lo else {
            let lowest = self.free.hi.unwrap_or(0.0);
            let why = format!(
                "datagrams were lost even at {}, the lowest rate tried",
                rate_text(lowest)
            );
            self.finish(false, why);
            return None;
        };
        // At the sender's ceiling the confirmation asks for the ceiling
        // again rather than a figure the sender may not reach twice.
        let rate = if lo >= self.top() * (1.0 - self.cfg.precision) {
            None
        } else {
            Some(lo)
        };
        self.confirming = Some(rate);
        self.short_lo = Some(lo);
        Some(Trial {
            rate,
            confirm: true,
        })
    }

    fn handle_confirm(&mut self, trial: Trial, out: Outcome, free: bool) {
        self.confirms += 1;
        let fell_short = trial.rate.is_some_and(|r| out.offered_bps < r * SHORT);
        if fell_short && self.confirms < self.cfg.max_confirms && self.trials < self.cfg.max_trials
        {
            // The sender did not offer the rate: nothing was confirmed,
            // so the same trial again.
            return;
        }
        if free && !fell_short {
            self.free.lo = Some(out.offered_bps);
            self.finish(true, String::new());
            return;
        }
        if self.confirms >= self.cfg.max_confirms || self.trials >= self.cfg.max_trials {
            // Nothing held over the long run: the short trials' figure,
            // said to be unconfirmed.
            self.free.lo = self.short_lo;
            self.finish(false, String::new());
            return;
        }
        // Lost over the long run: one step of the precision lower, and no
        // higher than what arrived.
        let asked = trial.rate.unwrap_or(out.offered_bps);
        let next = (asked * (1.0 - self.cfg.precision)).min(out.received_bps);
        self.free.lo = Some(next);
        self.confirming = Some(Some(next));
    }

    fn finish(&mut self, confirmed: bool, why: String) {
        let top = self.top();
        let loss_free = self.free.lo;
        let lower_bound = loss_free.is_some_and(|l| l >= top * (1.0 - self.cfg.precision));
        let with_loss = match (self.lossy.lo, loss_free) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let statement = if !why.is_empty() {
            why
        } else if lower_bound {
            format!(
                "the sender could not offer more than {}, and nothing was lost at it: \
                 the loss-free rate is at least that (the sender, not the path, is the limit)",
                rate_text(top)
            )
        } else {
            let mut s = format!(
                "loss-free up to {}{}",
                rate_text(loss_free.unwrap_or(0.0)),
                if confirmed {
                    " (confirmed)"
                } else {
                    "; the confirming trial lost datagrams each time, so this is the short trials' figure"
                }
            );
            if let Some(hi) = self.free.hi {
                s += &format!("; loss from {}", rate_text(hi));
            }
            s
        };
        let statement = match &self.cut_short {
            Some(c) => format!("{statement}; {c}"),
            None => statement,
        };
        self.done = Some(Found {
            loss_free,
            confirmed,
            with_loss,
            lower_bound,
            sender_max: self.sender_max,
            trials: self.trials,
            statement,
        });
    }
}

/// What `fatpipe test -u --find-max` asks for.
#[derive(Debug, Clone)]
pub struct FindMaxPlan {
    /// The server, the streams and direction, `-w`, `--no-batch`: every
    /// trial is this test with its rate, length and duration replaced.
    pub base: TestPlan,
    /// Datagram lengths, searched in this order.
    pub lengths: Vec<u32>,
    /// The search's settings.
    pub search: SearchConfig,
    /// Length of a searching trial.
    pub trial: Duration,
    /// Length of the confirming trial.
    pub confirm: Duration,
}

/// Runs the search for every length; `on_trial` sees each trial as it
/// ends (the length and the trial).
pub fn run(
    plan: &FindMaxPlan,
    on_trial: &mut dyn FnMut(u32, &FindMaxTrial),
) -> Result<FindMaxReport> {
    let base = &plan.base.params;
    if base.protocol != Protocol::Udp || base.direction == Direction::Both {
        return Err(EngineError::Service(
            "--find-max searches one direction of UDP".into(),
        ));
    }
    let timestamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let (mtu, v6) = route_mtu(plan.base.addr);
    let mut report = FindMaxReport {
        schema: schema::FIND_MAX_SCHEMA.into(),
        version: schema::FIND_MAX_SCHEMA_VERSION,
        timestamp,
        server: plan.base.server.clone(),
        server_addr: plan.base.addr.to_string(),
        direction: base.direction,
        streams: base.streams,
        loss_max_percent: plan.search.loss_max * 100.0,
        precision_percent: plan.search.precision * 100.0,
        trial_s: plan.trial.as_secs_f64(),
        confirm_s: plan.confirm.as_secs_f64(),
        mtu,
        framing_bytes: ETHERNET_FRAMING,
        lengths: Vec::new(),
        warnings: Vec::new(),
    };
    let wire = Wire {
        mtu,
        ip_header: if v6 { 40 } else { 20 },
        framing: ETHERNET_FRAMING,
    };
    for &length in &plan.lengths {
        let mut search = Search::new(plan.search);
        let mut trials = Vec::new();
        let (mut send_path, mut recv_path) = (String::new(), String::new());
        while let Some(trial) = search.poll_trial() {
            let params = trial_params(base, length, trial, plan);
            let seconds = params.duration_ms as f64 / 1e3;
            let test = TestPlan {
                params,
                ..plan.base.clone()
            };
            let r = crate::run_client(&test, &mut |_| {})?;
            for w in &r.start.warnings {
                if !report.warnings.contains(w) {
                    report.warnings.push(w.clone());
                }
            }
            let (s, rx) = ends(&r.start, base.direction);
            send_path = s;
            recv_path = rx;
            let sum = r.end.sums.first().cloned().unwrap_or_default();
            let sent = sum.packets_sent.unwrap_or(0);
            let got = sum.packets.unwrap_or(0);
            let lost = sent.saturating_sub(got);
            let bps = |packets: u64| packets as f64 * f64::from(length) * 8.0 / seconds;
            let out = Outcome {
                offered_bps: bps(sent),
                received_bps: bps(got),
                sent,
                lost,
            };
            let t = FindMaxTrial {
                requested_bps: trial.rate,
                offered: wire.point(length, out.offered_bps),
                received: wire.point(length, out.received_bps),
                packets_sent: sent,
                lost,
                loss_percent: out.loss() * 100.0,
                seconds,
                confirm: trial.confirm,
            };
            on_trial(length, &t);
            trials.push(t);
            search.handle_outcome(trial, out);
            // Let the previous trial's queues drain.
            std::thread::sleep(Duration::from_millis(100));
        }
        let found = search.result().cloned().unwrap_or_else(|| Found {
            loss_free: None,
            confirmed: false,
            with_loss: None,
            lower_bound: false,
            sender_max: 0.0,
            trials: 0,
            statement: "no trial ran".into(),
        });
        let probe = TestParams {
            length,
            ..base.clone()
        };
        let burst = if probe.no_batch {
            1
        } else {
            crate::data::udp_burst(&probe, path_of(&send_path))
        };
        report.lengths.push(FindMaxLength {
            length,
            loss_free: found.loss_free.map(|r| wire.point(length, r)),
            confirmed: found.confirmed,
            with_loss: found.with_loss.map(|r| wire.point(length, r)),
            lower_bound: found.lower_bound,
            sender_max: wire.point(length, found.sender_max),
            trial_count: found.trials,
            trials,
            send_path,
            recv_path,
            burst: burst as u32,
            statement: found.statement,
        });
    }
    Ok(report)
}

/// Bytes on the wire for one UDP datagram: IP fragments above the MTU,
/// each with its IP header and the link's framing, Ethernet's minimum
/// frame respected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wire {
    /// Route MTU, bytes.
    pub mtu: u32,
    /// IP header, bytes (20 for IPv4, 40 for IPv6).
    pub ip_header: u32,
    /// Per-frame bytes beyond the IP packet.
    pub framing: u32,
}

impl Wire {
    /// Wire bytes of one datagram of `length` payload bytes.
    pub fn bytes(&self, length: u32) -> u64 {
        let ip_payload = u64::from(length) + 8;
        // Fragments carry a multiple of 8 bytes, except the last.
        let per_fragment = (u64::from(self.mtu.saturating_sub(self.ip_header)) / 8 * 8).max(8);
        let fragments = ip_payload.div_ceil(per_fragment);
        let last = ip_payload - (fragments - 1) * per_fragment;
        // Ethernet pads a frame's payload to 46 bytes.
        let frame = |ip_payload: u64| (ip_payload + u64::from(self.ip_header)).max(46);
        (fragments - 1) * frame(per_fragment) + frame(last) + fragments * u64::from(self.framing)
    }

    /// A payload rate in every unit the report shows.
    pub fn point(&self, length: u32, payload_bps: f64) -> RatePoint {
        let pps = payload_bps / (f64::from(length) * 8.0);
        RatePoint {
            payload_bps,
            wire_bps: pps * self.bytes(length) as f64 * 8.0,
            packets_per_second: pps,
        }
    }
}

/// One trial's test: the base test at this length, rate and duration,
/// one interval long.
fn trial_params(base: &TestParams, length: u32, trial: Trial, plan: &FindMaxPlan) -> TestParams {
    let streams = u64::from(base.streams.max(1));
    let total = match trial.rate {
        Some(r) => r as u64,
        None => plan
            .search
            .ceiling
            .map_or(UNLIMITED_BPS * streams, |c| c as u64),
    };
    let duration = if trial.confirm {
        plan.confirm
    } else {
        plan.trial
    };
    let ms = (duration.as_millis() as u64).max(10);
    TestParams {
        length,
        bitrate: (total / streams).max(1),
        duration_ms: ms,
        interval_ms: ms,
        omit_ms: 0,
        bytes: None,
        ..base.clone()
    }
}

/// The sender's and receiver's I/O paths, from the start record.
fn ends(start: &schema::TestStart, direction: Direction) -> (String, String) {
    let (send, recv) = match direction {
        Direction::Down => (&start.remote, &start.local),
        _ => (&start.local, &start.remote),
    };
    (
        send.first()
            .map_or_else(|| "?".into(), |s| s.send_path.clone()),
        recv.first()
            .map_or_else(|| "?".into(), |s| s.recv_path.clone()),
    )
}

fn path_of(name: &str) -> crate::data::UdpPath {
    match name {
        "plain" => crate::data::UdpPath::Plain,
        "gso" => crate::data::UdpPath::Gso,
        _ => crate::data::UdpPath::Mmsg,
    }
}

/// The MTU of the route to the server (what a datagram is cut into), and
/// whether it is IPv6; 1500 when the kernel will not say.
fn route_mtu(addr: SocketAddr) -> (u32, bool) {
    let v6 = addr.is_ipv6();
    let local: SocketAddr = if v6 {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    };
    let mtu = UdpSocket::bind(local)
        .and_then(|s| s.connect(addr).map(|()| s))
        .and_then(|s| fatpipe_sys::probe::route_mtu(&s, v6))
        .unwrap_or(1500);
    (mtu, v6)
}

fn rate_text(bps: f64) -> String {
    units::format_rate(bps)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (the tests need no crate for it).
    struct Lcg(u64);

    impl Lcg {
        /// Uniform in [-1, 1).
        fn next(&mut self) -> f64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        }
    }

    /// A sender that reaches `sender` bit/s (± `noise`) and a receiver
    /// that keeps `capacity` bit/s (± `noise`) and drops the excess.
    struct Sim {
        sender: f64,
        capacity: f64,
        noise: f64,
        rng: Lcg,
    }

    impl Sim {
        fn trial(&mut self, t: Trial, ceiling: Option<f64>) -> Outcome {
            let can = self.sender * (1.0 + self.noise * self.rng.next());
            let want = t.rate.or(ceiling).unwrap_or(f64::INFINITY);
            let offered = want.min(can);
            let cap = self.capacity * (1.0 + self.noise * self.rng.next());
            let received = offered.min(cap);
            let per = 1000.0 * 8.0;
            let sent = (offered / per) as u64;
            let got = (received / per) as u64;
            Outcome {
                offered_bps: offered,
                received_bps: received,
                sent,
                lost: sent - got,
            }
        }
    }

    fn search(sim: &mut Sim, cfg: SearchConfig) -> (Found, Vec<Trial>) {
        let mut s = Search::new(cfg);
        let mut trials = Vec::new();
        while let Some(t) = s.poll_trial() {
            trials.push(t);
            let out = sim.trial(t, cfg.ceiling);
            s.handle_outcome(t, out);
            assert!(trials.len() <= cfg.max_trials as usize, "{trials:?}");
        }
        (s.result().cloned().unwrap(), trials)
    }

    #[test]
    fn finds_a_receivers_capacity_within_precision() {
        for seed in 1..=50u64 {
            for (capacity, sender) in [(2e9, 5e9), (150e6, 10e9), (9.5e9, 10e9), (1e6, 40e9)] {
                let mut sim = Sim {
                    sender,
                    capacity,
                    noise: 0.002,
                    rng: Lcg(seed),
                };
                let cfg = SearchConfig::default();
                let (f, trials) = search(&mut sim, cfg);
                let free = f.loss_free.unwrap();
                // Within precision (plus the noise) below the capacity,
                // never above what it can carry.
                assert!(free <= capacity * 1.002, "{seed}: {free} > {capacity}");
                assert!(
                    free >= capacity * (1.0 - 0.01 - 0.004),
                    "{seed} {capacity}: {free}, {trials:?}"
                );
                assert!(!f.lower_bound, "{seed} {capacity}: {}", f.statement);
                assert!(f.trials <= 16, "{seed} {capacity}: {} trials", f.trials);
                assert_eq!(f.trials as usize, trials.len());
                assert!(f.confirmed, "{}", f.statement);
                assert!(trials.last().unwrap().confirm);
                assert!(
                    f.statement.starts_with("loss-free up to"),
                    "{}",
                    f.statement
                );
            }
        }
    }

    #[test]
    fn a_sender_falling_short_now_and_then_does_not_lower_the_top() {
        // Every third trial another process takes the sender's core and
        // it offers only 60 % of the asked rate.
        for seed in 1..=20 {
            let mut sim = Sim {
                sender: 10e9,
                capacity: 2e9,
                noise: 0.002,
                rng: Lcg(seed),
            };
            let mut s = Search::new(SearchConfig::default());
            let mut n = 0;
            while let Some(t) = s.poll_trial() {
                n += 1;
                let mut out = sim.trial(t, None);
                if n % 3 == 0 {
                    let cut = out.offered_bps * 0.6;
                    let got = cut.min(out.received_bps);
                    out = Outcome {
                        offered_bps: cut,
                        received_bps: got,
                        sent: (cut / 8000.0) as u64,
                        lost: (cut / 8000.0) as u64 - (got / 8000.0) as u64,
                    };
                }
                s.handle_outcome(t, out);
            }
            let f = s.result().unwrap();
            assert!(!f.lower_bound, "{seed}: {}", f.statement);
            let free = f.loss_free.unwrap();
            assert!(free > 2e9 * 0.98 && free <= 2e9 * 1.002, "{seed}: {free}");
            assert!(f.trials <= 20, "{seed}: {}", f.trials);
        }
    }

    #[test]
    fn the_trial_budget_holds_confirmations_included() {
        // Every trial falls 10 % short and every other one loses: the
        // search and its repeated confirmations must still stop in time.
        let cfg = SearchConfig {
            max_trials: 8,
            ..SearchConfig::default()
        };
        let mut s = Search::new(cfg);
        let mut n = 0;
        while let Some(t) = s.poll_trial() {
            n += 1;
            let offered = t.rate.unwrap_or(1e9) * 0.9;
            let sent = (offered / 8000.0) as u64;
            s.handle_outcome(
                t,
                Outcome {
                    offered_bps: offered,
                    received_bps: offered,
                    sent,
                    lost: if n % 2 == 0 { sent / 100 } else { 0 },
                },
            );
            assert!(n <= 8, "trial {n}");
        }
        assert!(s.result().is_some());
    }

    #[test]
    fn a_sender_always_a_little_short_is_not_asked_the_same_rate_again() {
        // The sender offers 1.2 % less than asked, every time (it starts
        // a little late): each estimate is tried once.
        let mut s = Search::new(SearchConfig::default());
        let mut asked = Vec::new();
        while let Some(t) = s.poll_trial() {
            let offered = t.rate.map_or(8e9, |r| r * 0.988);
            let got = offered.min(193e6);
            asked.push(t.rate);
            s.handle_outcome(
                t,
                Outcome {
                    offered_bps: offered,
                    received_bps: got,
                    sent: (offered / 8000.0) as u64,
                    lost: (offered / 8000.0) as u64 - (got / 8000.0) as u64,
                },
            );
        }
        let f = s.result().unwrap();
        let repeats = asked
            .windows(3)
            .filter(|w| w[0] == w[1] && w[1] == w[2])
            .count();
        assert_eq!(repeats, 0, "{asked:?}");
        assert!(f.trials <= 20, "{asked:?}");
        let free = f.loss_free.unwrap();
        assert!(free > 193e6 * 0.97 && free <= 193e6, "{free} {asked:?}");
    }

    #[test]
    fn a_noisy_failure_below_a_pass_does_not_lose_the_pass() {
        // Passes at 1 Gbit/s, then a trial at 0.9 Gbit/s loses (another
        // process took the receiver's core), and the budget ends there.
        let cfg = SearchConfig {
            max_trials: 4,
            ..SearchConfig::default()
        };
        let mut s = Search::new(cfg);
        let out = |offered: f64, lost: u64| Outcome {
            offered_bps: offered,
            received_bps: offered,
            sent: 100_000,
            lost,
        };
        let t = s.poll_trial().unwrap();
        s.handle_outcome(t, out(5e9, 50_000));
        let t = s.poll_trial().unwrap();
        s.handle_outcome(
            Trial {
                rate: Some(1e9),
                ..t
            },
            out(1e9, 0),
        );
        let t = s.poll_trial().unwrap();
        s.handle_outcome(
            Trial {
                rate: Some(0.9e9),
                ..t
            },
            out(0.9e9, 10),
        );
        let t = s.poll_trial().unwrap();
        assert_eq!(t.rate, Some(1e9), "confirms the pass: {t:?}");
        assert!(t.confirm);
        s.handle_outcome(t, out(1e9, 0));
        let f = s.result().unwrap();
        assert!(f.loss_free.is_some(), "{}", f.statement);
    }

    #[test]
    fn the_allowed_loss_rate_sits_above_the_loss_free_one() {
        // A receiver that drops everything above its capacity: 0.5 %
        // loss is reached at capacity / 0.995.
        let mut sim = Sim {
            sender: 10e9,
            capacity: 1e9,
            noise: 0.0,
            rng: Lcg(7),
        };
        let (f, _) = search(&mut sim, SearchConfig::default());
        let lossy = f.with_loss.unwrap();
        let edge = 1e9 / 0.995;
        assert!(lossy <= edge && lossy >= edge * 0.99, "{lossy}");
        assert!(lossy > f.loss_free.unwrap());
    }

    #[test]
    fn a_sender_below_the_capacity_gives_a_lower_bound() {
        for seed in 1..=20 {
            let mut sim = Sim {
                sender: 3e9,
                capacity: 8e9,
                noise: 0.003,
                rng: Lcg(seed),
            };
            let (f, trials) = search(&mut sim, SearchConfig::default());
            assert!(f.lower_bound, "{}", f.statement);
            assert!(f.statement.contains("the sender, not the path"));
            assert!(f.confirmed);
            let free = f.loss_free.unwrap();
            assert!(free >= 3e9 * 0.99, "{free}");
            assert!(trials.len() <= 3, "{trials:?}");
            assert!(trials.iter().all(|t| t.rate.is_none()), "{trials:?}");
        }
    }

    #[test]
    fn a_ceiling_given_with_b_is_the_top() {
        let mut sim = Sim {
            sender: 10e9,
            capacity: 8e9,
            noise: 0.0,
            rng: Lcg(1),
        };
        let cfg = SearchConfig {
            ceiling: Some(1e9),
            ..SearchConfig::default()
        };
        let (f, trials) = search(&mut sim, cfg);
        assert!(f.lower_bound);
        assert_eq!(f.loss_free, Some(1e9));
        assert_eq!(trials.len(), 2, "ceiling, confirmation");
    }

    #[test]
    fn a_receiver_that_loses_everywhere_has_no_loss_free_rate() {
        // Random loss at any rate: 1 in 1000 datagrams.
        let mut s = Search::new(SearchConfig::default());
        let mut n = 0;
        while let Some(t) = s.poll_trial() {
            let offered = t.rate.unwrap_or(1e9);
            let sent = (offered / 8000.0) as u64 + 1000;
            s.handle_outcome(
                t,
                Outcome {
                    offered_bps: offered,
                    received_bps: offered * 0.999,
                    sent,
                    lost: sent / 1000,
                },
            );
            n += 1;
        }
        let f = s.result().unwrap();
        assert_eq!(f.loss_free, None);
        assert!(f.statement.contains("lost even at"), "{}", f.statement);
        assert!(n <= 24);
        // 0.1 % is within the default 0.5 %: the whole range passes.
        assert!(f.with_loss.unwrap() >= 0.99e9);
    }

    #[test]
    fn a_failing_confirmation_steps_down() {
        // Short trials pass up to 2 Gbit/s, but over the long trial only
        // 1.9 Gbit/s holds.
        let mut s = Search::new(SearchConfig::default());
        let mut confirms = Vec::new();
        while let Some(t) = s.poll_trial() {
            let offered = t.rate.unwrap_or(5e9);
            let cap = if t.confirm { 1.9e9 } else { 2e9 };
            if t.confirm {
                confirms.push(offered);
            }
            let sent = (offered / 8000.0) as u64;
            let got = (offered.min(cap) / 8000.0) as u64;
            s.handle_outcome(
                t,
                Outcome {
                    offered_bps: offered,
                    received_bps: offered.min(cap),
                    sent,
                    lost: sent - got,
                },
            );
        }
        let f = s.result().unwrap();
        assert!(confirms.len() >= 2, "{confirms:?}");
        assert!(f.confirmed, "{}", f.statement);
        let free = f.loss_free.unwrap();
        assert!(free <= 1.9e9 && free > 1.8e9, "{free}");
    }

    #[test]
    fn wire_bytes_count_headers_fragments_and_framing() {
        let eth = Wire {
            mtu: 1500,
            ip_header: 20,
            framing: 38,
        };
        // 64 B payload: 64 + 8 + 20 = 92 B IP packet, + 38.
        assert_eq!(eth.bytes(64), 130);
        assert_eq!(eth.bytes(1472), 1538, "a full 1500-byte frame");
        // 1473 B: two fragments, 1480 + 1 payload bytes.
        // The second fragment (1 + 20 bytes) is padded to 46.
        assert_eq!(eth.bytes(1473), 1538 + 46 + 38);
        // 65507 B: 65515 IP payload bytes in 45 fragments of 1480 (the
        // last 395).
        assert_eq!(eth.bytes(65_507), 44 * 1538 + (395 + 20 + 38));
        let v6 = Wire {
            mtu: 9000,
            ip_header: 40,
            framing: 38,
        };
        assert_eq!(v6.bytes(8952), 9038);
        let p = eth.point(1472, 1472.0 * 8.0 * 1000.0);
        assert!((p.packets_per_second - 1000.0).abs() < 1e-9);
        assert!((p.wire_bps - 1538.0 * 8.0 * 1000.0).abs() < 1e-6);
    }
}
