//! Auto-tuning before data flows: the pre-flight shared by `fatpipe test`
//! and `fatpipe copy`.
//!
//! [`preflight`] probes the path briefly (a few RTT echoes and a handful of
//! packet trains through the server's `probe` service, which also reports
//! the server's host limits), reads this end's limits and runs [`plan()`].
//! [`merge`] then lets explicit flags replace parts of the plan, and [`run`]
//! is the whole sequence a command runs (probe, plan, flags, its floor of
//! streams, start window, record, the `auto:` line), with what differs
//! between `test` and `copy` given in a [`Request`]; it returns the line to
//! print rather than printing, so the binary only renders. The two
//! halves are split so that the flag rules, which users will argue about,
//! are a pure function tested below without a socket, and so both commands
//! apply them the same way; only the probe itself does I/O.
//!
//! The planner needs to know which end sends: congestion control is chosen
//! from the sender's list, and a reverse test sends from the server. That is
//! [`Role`]. When the server sends ([`Role::Receiver`]: `test -R`, a pull)
//! the probe's trains run server → client too (a reverse probe), so an
//! asymmetric path is planned from the direction the data takes; a server
//! too old for that is probed forward, with a warning. What came out is recorded as a
//! [`fatpipe_schema::tune::AutoTune`] in the command's JSON result.

use std::net::SocketAddr;
use std::time::Duration;

use fatpipe_engine::ClientOptions;
use fatpipe_schema::tune::{AutoTune, HostLimits, PathFacts, Plan};
use fatpipe_schema::units::{format_bytes, format_bytes_iec, format_duration, format_rate};

use crate::plan::{plan_with, Policy};
use fatpipe_audit::host::{is_privileged, Host};
use fatpipe_probe::{self as probe, ProbeConfig, ProbeError, ProbeOutcome};

/// Which way data will flow, seen from this end.
///
/// Not the test's [`TestDirection`](fatpipe_schema::test::TestDirection)
/// nor the copy's push/pull: the pre-flight serves both commands and needs
/// only to know which end sends, so each command maps its own direction
/// onto this (up or push: `Sender`; down or pull: `Receiver`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// This end sends (a test or a push).
    Sender,
    /// The peer sends (a reverse test or a pull).
    Receiver,
    /// Both send (a bidirectional test): planned with this end as sender.
    Both,
}

/// Time between the pre-flight's echoes. A plan needs the path's minimum
/// RTT, not how it varies over time (what `fatpipe path` spreads its echoes
/// 20 ms apart for), and the first train waits for the last echo: 5 echoes
/// take 20 ms instead of 80.
pub const PREFLIGHT_ECHO_INTERVAL: Duration = Duration::from_millis(5);

/// What to probe and how.
#[derive(Debug, Clone)]
pub struct PreflightConfig {
    /// The server's control address.
    pub addr: SocketAddr,
    /// Key and timeouts, as for the command's own session.
    pub options: ClientOptions,
    /// Which end sends.
    pub role: Role,
    /// Planner bounds.
    pub policy: Policy,
    /// RTT echoes ([`PREFLIGHT_ECHO_INTERVAL`] apart).
    pub echoes: u32,
    /// Packet trains for the rate estimate.
    pub trains: u32,
    /// True when the peer sets the socket buffers it is asked for (the
    /// test service); false when its sockets keep kernel autotuning (the
    /// copy service), so only this end's buffers can be fixed.
    pub peer_sets_buffers: bool,
}

impl PreflightConfig {
    /// A short probe: 5 echoes and 6 trains, which takes about 5.5 round
    /// trips (0.56 s at 93 ms, 1.25 s at 228 ms), 3 of them the session's
    /// connect, authenticate and open.
    pub fn new(addr: SocketAddr, options: ClientOptions, role: Role) -> PreflightConfig {
        PreflightConfig {
            addr,
            options,
            role,
            policy: Policy::default(),
            echoes: 5,
            trains: 6,
            peer_sets_buffers: true,
        }
    }
}

/// What the pre-flight found and planned.
#[derive(Debug, Clone)]
pub struct Preflight {
    /// The path as probed.
    pub facts: PathFacts,
    /// The planner's choice.
    pub plan: Plan,
    /// Seconds the probe took.
    pub probe_secs: f64,
    /// True when the probe's rate is only a lower bound (this host could
    /// not send its trains faster than they arrived).
    pub rate_lower_bound: bool,
    /// What could not be known (a limit unread, a rate that is only a
    /// lower bound); the plan was made anyway.
    pub warnings: Vec<String>,
    /// The warnings among `warnings` that the user should act on (a
    /// server too old to probe the direction the data takes); the rest
    /// only explain the plan.
    pub actionable: Vec<String>,
}

/// Why there is no plan.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    /// The probe failed (no server, no `probe` service, keys, timeouts).
    #[error("probe failed: {0}")]
    Probe(#[from] ProbeError),
    /// Neither end's host limits could be read.
    #[error("host limits unknown here ({local}) and at the server ({peer})")]
    NoLimits {
        /// Why this end's limits are unknown.
        local: String,
        /// Why the server's are unknown.
        peer: String,
    },
}

impl PreflightError {
    /// True if the keys are missing or do not match (the user's to fix).
    pub fn is_auth(&self) -> bool {
        matches!(self, PreflightError::Probe(e) if e.is_auth())
    }
}

/// Explicit flags that replace parts of a plan; `None` leaves that part to
/// the planner.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// Streams (`-P`).
    pub streams: Option<u32>,
    /// Socket buffer per stream in bytes (`-w`).
    pub buffer: Option<u64>,
    /// Congestion control (`-C`).
    pub congestion: Option<String>,
    /// Pacing cap per stream in bit/s (`--fq-rate`).
    pub pacing_rate: Option<u64>,
}

impl Overrides {
    /// True when every part the planner chooses was given: there is
    /// nothing left to plan, so the probe can be skipped.
    pub fn all_given(&self) -> bool {
        self.streams.is_some()
            && self.buffer.is_some()
            && self.congestion.is_some()
            && self.pacing_rate.is_some()
    }
}

/// Whether a command auto-tunes: TCP, not `--no-auto`, and some part of
/// the plan (streams, buffer, congestion control, pacing) left to choose.
/// The one answer for `test`, `test --iperf3` and `copy`.
pub fn wanted(no_auto: bool, tcp: bool, o: &Overrides) -> bool {
    !no_auto && tcp && !o.all_given()
}

/// What to run with: the plan with the user's flags laid over it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Streams.
    pub streams: u32,
    /// Socket buffer per stream; `None` leaves kernel autotuning in charge.
    pub buffer: Option<u64>,
    /// Request the buffer with `SO_SNDBUFFORCE`/`SO_RCVBUFFORCE`.
    pub forced_buffers: bool,
    /// Congestion control to request.
    pub congestion: Option<String>,
    /// Pacing cap per stream, bit/s.
    pub pacing_rate: Option<u64>,
    /// Parts given by flags: "streams", "buffer", "congestion", "pacing".
    pub overridden: Vec<String>,
}

impl Settings {
    /// Raises the stream count to `floor` (when a command needs streams for
    /// more than the window, as `copy` does to read, hash and write in
    /// parallel), keeping the total pacing and the total window the plan
    /// chose: the planned buffer is shared out among the streams (each
    /// receiver holds its window at its share), so more streams never
    /// put more in flight than the plan meant.
    pub fn at_least(&mut self, floor: u32) {
        if self.streams >= floor {
            return;
        }
        let old = u128::from(self.streams.max(1));
        let new = u128::from(floor.max(1));
        if let Some(per) = self.pacing_rate {
            self.pacing_rate = Some(u64::try_from(u128::from(per) * old / new).unwrap_or(u64::MAX));
        }
        if let Some(per) = self.buffer {
            let share = (u128::from(per) * old).div_ceil(new);
            self.buffer = Some(
                u64::try_from(share)
                    .unwrap_or(u64::MAX)
                    .max(MIN_SHARED_BUFFER),
            );
        }
        self.streams = floor;
    }
}

/// The smallest per-stream buffer [`Settings::at_least`] shares a window
/// out into: below this a stream's window holds too few segments to
/// recover from a loss without a timeout.
const MIN_SHARED_BUFFER: u64 = 256 * 1024;

/// Probes the path, reads both ends' limits and plans.
pub fn preflight(cfg: &PreflightConfig) -> Result<Preflight, PreflightError> {
    let mut pc = ProbeConfig::new(cfg.addr, cfg.options.clone());
    pc.echoes = cfg.echoes.max(1);
    pc.echo_interval = PREFLIGHT_ECHO_INTERVAL;
    pc.trains = cfg.trains.max(1);
    pc.reverse = cfg.role == Role::Receiver;
    let mut fallback = None;
    let outcome = match probe::run(&pc) {
        Err(ProbeError::Unsupported(why)) if pc.reverse => {
            fallback = Some(format!(
                "{why}; planned from the client → server direction instead"
            ));
            pc.reverse = false;
            probe::run(&pc)?
        }
        other => other?,
    };
    let local = Host::live().limits(is_privileged());
    let mut pre = from_outcome(
        &outcome,
        local,
        cfg.role,
        &cfg.policy,
        cfg.peer_sets_buffers,
    )?;
    pre.warnings.extend(fallback.clone());
    pre.actionable.extend(fallback);
    Ok(pre)
}

/// A pre-flight for a peer without a probe service (a stock iperf3
/// server): only the round trip, from this end's control connection, and
/// this host's limits are known. The peer is planned as this host (iperf3
/// sets the buffer asked of it, within its own caps), the rate as unknown,
/// and a buffer only up to this host's `SO_*BUF` caps (iperf3 refuses a
/// buffer the kernel would not grant exactly); the warnings name what could
/// not be learnt.
pub fn blind(
    rtt: Duration,
    mtu: u32,
    local: Result<HostLimits, String>,
    policy: &Policy,
) -> Result<Preflight, PreflightError> {
    let local = local.map_err(|why| PreflightError::NoLimits {
        local: why,
        peer: "not asked (no probe service there)".into(),
    })?;
    let facts = PathFacts {
        rtt_secs: rtt.as_secs_f64(),
        bottleneck_rate: None,
        loss_rate: 0.0,
        mtu,
        loss_packets: 0,
    };
    let mut plan = plan_with(&facts, None, &local, &local, policy);
    let cap = local.rmem_max.min(local.wmem_max);
    if plan.per_stream_buffer > cap {
        plan.set_buffers = false;
    }
    plan.forced_buffers = false;
    // The planner counts on the in-flight adjuster, which cannot run here.
    plan.reason = plan
        .reason
        .replace("; streams are added if loss holds them back", "");
    let warnings = vec![
        "no path probe on this server: bottleneck rate and loss unknown, RTT from the control connection".to_string(),
        "the server's host limits unknown: planned as if they were this host's".to_string(),
    ];
    Ok(Preflight {
        facts,
        plan,
        probe_secs: 0.0,
        rate_lower_bound: false,
        // Against an iperf3 server each of these is worth acting on: the
        // user may want a fatpipe server there instead.
        actionable: warnings.clone(),
        warnings,
    })
}

/// [`blind`] with this host's live limits.
pub fn blind_live(rtt: Duration, mtu: u32, policy: &Policy) -> Result<Preflight, PreflightError> {
    blind(rtt, mtu, Host::live().limits(is_privileged()), policy)
}

/// The limits a peer that keeps kernel autotuning really has: whatever
/// buffer is asked of it, a socket's window grows only as far as
/// autotuning takes it (about half of `tcp_*mem[2]`), and it forces nothing.
pub fn autotuning_only(peer: &HostLimits) -> HostLimits {
    HostLimits {
        rmem_max: peer.rmem_max.min(peer.tcp_rmem[2] / 2),
        wmem_max: peer.wmem_max.min(peer.tcp_wmem[2] / 2),
        privileged: false,
        ..peer.clone()
    }
}

/// Plans from a finished probe and this end's limits (pure). A missing
/// limit on one end is taken from the other, with a warning.
pub fn from_outcome(
    o: &ProbeOutcome,
    local: Result<HostLimits, String>,
    role: Role,
    policy: &Policy,
    peer_sets_buffers: bool,
) -> Result<Preflight, PreflightError> {
    let facts = probe::facts(o);
    let mut warnings = Vec::new();
    if let Some(r) = &o.rate {
        if r.sender_limited {
            warnings.push(format!(
                "{} could not send probe trains faster than {}: the path rate is a lower bound",
                if o.reverse { "the server" } else { "this host" },
                format_rate(r.rate)
            ));
        }
    } else {
        warnings.push("no probe train gave a rate estimate: planned for an unknown rate".into());
    }
    let (local, peer) = match (local, o.peer_limits.clone()) {
        (Ok(l), Ok(p)) => (l, p),
        (Ok(l), Err(why)) => {
            warnings.push(format!(
                "server's host limits unknown ({why}): planned as if they were this host's"
            ));
            (l.clone(), l)
        }
        (Err(why), Ok(p)) => {
            warnings.push(format!(
                "this host's limits unknown ({why}): planned as if they were the server's"
            ));
            (p.clone(), p)
        }
        (Err(local), Err(peer)) => return Err(PreflightError::NoLimits { local, peer }),
    };
    let peer = if peer_sets_buffers {
        peer
    } else {
        autotuning_only(&peer)
    };
    let (sender, receiver) = match role {
        Role::Sender | Role::Both => (&local, &peer),
        Role::Receiver => (&peer, &local),
    };
    let estimate = probe::rate_confidence(o);
    let mut plan = plan_with(&facts, estimate.as_ref(), sender, receiver, policy);
    if let Some(why) = unseen_loss_matters(o, &facts, &plan, sender) {
        // Plan again with BBR as the only choice: same window and streams
        // rules, a congestion control that random loss does not throttle.
        let bbr_only = HostLimits {
            congestion: vec!["bbr".into()],
            ..sender.clone()
        };
        plan = plan_with(&facts, estimate.as_ref(), &bbr_only, receiver, policy);
        plan.reason.push_str("; ");
        plan.reason.push_str(&why);
    }
    let lower_bound = o.rate.as_ref().is_some_and(|r| r.sender_limited);
    if lower_bound {
        unpace(&mut plan);
    }
    Ok(Preflight {
        facts,
        plan,
        probe_secs: o.elapsed.as_secs_f64(),
        rate_lower_bound: lower_bound,
        warnings,
        actionable: Vec::new(),
    })
}

/// Drops a plan's pacing because its rate is only a lower bound: pacing at
/// a rate the path exceeds would cap the transfer below it (loopback: this
/// host's own send rate). Says so in the reason.
pub fn unpace(plan: &mut Plan) {
    if let Some(p) = plan.pacing_rate.take() {
        let said = format!(", paced at {} each", format_rate(p as f64));
        plan.reason = plan.reason.replacen(&said, "", 1);
        plan.reason
            .push_str("; not paced (the rate is a lower bound)");
    }
}

/// Why a loss-based plan is too risky although the probe lost nothing:
/// a few thousand probe packets cannot rule out a loss rate (the "rule of
/// three" bound, 3/n at 95 %) that would hold CUBIC's streams far below
/// the path on a long RTT (at 93 ms, 1e-4 holds one stream to ~15 Mbit/s),
/// and the in-flight adjuster would need several steps to catch up. `None` when
/// the plan already avoids loss-based control, BBR is not on offer, or even
/// that loss would not matter (short paths).
fn unseen_loss_matters(
    o: &ProbeOutcome,
    facts: &PathFacts,
    plan: &Plan,
    sender: &HostLimits,
) -> Option<String> {
    let rate = facts.bottleneck_rate? as f64;
    let sent = u64::from(o.rtt.sent) + o.train_packets.0;
    let received = u64::from(o.rtt.received) + o.train_packets.1;
    if sent == 0 || received < sent || plan.congestion == "bbr" {
        return None;
    }
    if !sender.congestion.iter().any(|c| c == "bbr") {
        return None;
    }
    let bound = 3.0 / sent as f64;
    let rtt = std::time::Duration::from_secs_f64(facts.rtt_secs.clamp(0.0, 3600.0));
    let per_stream = crate::plan::mathis_rate(crate::plan::mss_for(facts.mtu), rtt, bound)?;
    let reach = per_stream * f64::from(plan.streams.max(1));
    (reach < 0.9 * rate).then(|| {
        format!(
            "bbr: {sent} probe packets cannot rule out {} loss, which would hold {} to {}",
            crate::plan::format_loss(bound),
            plan.congestion,
            format_rate(reach)
        )
    })
}

/// Lays explicit flags over a plan. Each flag replaces exactly its part;
/// the rest stays as planned, except that the plan's per-stream pacing is
/// spread over the user's stream count so that the streams together are
/// still paced at the path rate. A given buffer is never forced.
pub fn merge(plan: &Plan, o: &Overrides) -> Settings {
    let mut overridden = Vec::new();
    let streams = match o.streams {
        Some(n) => {
            overridden.push("streams".to_string());
            n.max(1)
        }
        None => plan.streams.max(1),
    };
    let (buffer, forced_buffers) = match o.buffer {
        Some(b) => {
            overridden.push("buffer".to_string());
            (Some(b), false)
        }
        None if plan.set_buffers => (Some(plan.per_stream_buffer), plan.forced_buffers),
        None => (None, false),
    };
    let congestion = match &o.congestion {
        Some(c) => {
            overridden.push("congestion".to_string());
            Some(c.clone())
        }
        None => Some(plan.congestion.clone()),
    };
    let pacing_rate = match o.pacing_rate {
        Some(r) => {
            overridden.push("pacing".to_string());
            Some(r)
        }
        None => plan.pacing_rate.map(|per| {
            let total = u128::from(per) * u128::from(plan.streams.max(1));
            u64::try_from(total / u128::from(streams)).unwrap_or(u64::MAX)
        }),
    };
    Settings {
        streams,
        buffer,
        forced_buffers,
        congestion,
        pacing_rate,
        overridden,
    }
}

/// The smaller window the receivers hold during the sender's start-up, in
/// bytes per stream, and for how long ([`crate::plan::start_hold`]): only
/// for a planned buffer (not one given as a flag), and in proportion to the
/// buffer each stream got (copy shares it out among more streams).
pub fn start_window(pre: &Preflight, s: &Settings, policy: &Policy) -> Option<(u64, Duration)> {
    if s.overridden.iter().any(|o| o == "buffer") {
        return None;
    }
    let buffer = s.buffer?;
    let congestion = s.congestion.as_deref().unwrap_or(&pre.plan.congestion);
    let (fraction, hold) = crate::plan::start_hold(&pre.facts, congestion, policy)?;
    let window = (buffer as f64 * fraction) as u64;
    (window > 0).then_some((window, hold))
}

/// The line printed on stderr: the plan's reason, then what flags changed.
pub fn line(plan: &Plan, s: &Settings) -> String {
    if s.overridden.is_empty() {
        return plan.reason.clone();
    }
    let parts: Vec<String> = s
        .overridden
        .iter()
        .map(|part| match part.as_str() {
            "streams" => format!("{} streams", s.streams),
            "buffer" => format!(
                "buffer {}",
                s.buffer.map_or("default".into(), format_bytes_iec)
            ),
            "congestion" => s.congestion.clone().unwrap_or_default(),
            "pacing" => format!(
                "paced at {}",
                s.pacing_rate
                    .map_or("none".into(), |r| format_rate(r as f64))
            ),
            other => other.to_string(),
        })
        .collect();
    format!("{}; flags override: {}", plan.reason, parts.join(", "))
}

/// The record for a command's JSON result. `adjusting` says whether the
/// in-flight adjuster ran; its decisions are added by whoever ran it.
pub fn record(pre: &Preflight, s: &Settings, adjusting: bool) -> AutoTune {
    AutoTune {
        facts: pre.facts.clone(),
        plan: pre.plan.clone(),
        streams: s.streams,
        buffer: s.buffer,
        forced_buffers: s.forced_buffers,
        congestion: s.congestion.clone(),
        pacing_rate: s.pacing_rate,
        overridden: s.overridden.clone(),
        probe_secs: pre.probe_secs,
        rate_lower_bound: pre.rate_lower_bound,
        adjusting,
        decisions: Vec::new(),
        warnings: pre.warnings.clone(),
    }
}

/// What a command asks of the whole pre-flight ([`run`]): where to probe
/// and who sends, then what the command lays over the plan.
#[derive(Debug, Clone)]
pub struct Request {
    /// The probe and the planner's bounds.
    pub preflight: PreflightConfig,
    /// The user's flags.
    pub overrides: Overrides,
    /// Streams the command needs whatever the window needs, if any.
    pub floor: Option<Floor>,
    /// A rate cap that paces the sender instead of the plan (`copy
    /// --bwlimit`): the record then shows the plan's pacing as replaced.
    pub rate_cap: Option<u64>,
}

/// A command's own minimum of streams ([`Settings::at_least`]) and why, for
/// the `auto:` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Floor {
    /// The minimum.
    pub streams: u32,
    /// The command, e.g. "copy".
    pub who: &'static str,
    /// Why it needs them.
    pub why: &'static str,
}

/// What the pre-flight came to: everything a command needs to start its
/// transfer tuned, and the lines to print (this crate prints nothing).
#[derive(Debug, Clone)]
pub struct Tuned {
    /// What the probe found and the planner chose.
    pub preflight: Preflight,
    /// The plan with the flags (and the floor) laid over it.
    pub settings: Settings,
    /// The start-up window the receivers hold, and for how long.
    pub start_window: Option<(u64, Duration)>,
    /// The record for the command's JSON (`adjusting` still false).
    pub record: AutoTune,
    /// The `auto:` line for stderr with the planner's whole reasoning
    /// (`-v`, and the JSON); the record's warnings follow it.
    pub line: String,
    /// The one short `auto:` line printed by default ([`short_line`]).
    pub short: String,
    /// The warnings the user should act on (printed by default); the
    /// others are in the record and shown with `-v`.
    pub act_on: Vec<String>,
}

/// The whole pre-flight: probe, plan, lay the flags over it, the start
/// window, the record and the `auto:` line. Only the probe does I/O; the
/// rest is [`settle`].
pub fn run(req: &Request) -> Result<Tuned, PreflightError> {
    Ok(settle(preflight(&req.preflight)?, req))
}

/// The pre-flight after its probe (pure).
pub fn settle(pre: Preflight, req: &Request) -> Tuned {
    settle_with(pre, req.into())
}

/// What [`settle`] lays over a pre-flight's plan: the part of a
/// [`Request`] that is not the probe, so a pre-flight that had no probe
/// ([`blind_live`], a stock iperf3 server) settles the same way.
#[derive(Debug, Clone, Copy)]
pub struct Laid<'a> {
    /// The user's flags.
    pub overrides: &'a Overrides,
    /// The command's own minimum of streams.
    pub floor: Option<&'a Floor>,
    /// A rate cap that replaces the plan's pacing.
    pub rate_cap: Option<u64>,
    /// The planner's bounds.
    pub policy: &'a Policy,
}

impl<'a> From<&'a Request> for Laid<'a> {
    fn from(req: &'a Request) -> Laid<'a> {
        Laid {
            overrides: &req.overrides,
            floor: req.floor.as_ref(),
            rate_cap: req.rate_cap,
            policy: &req.preflight.policy,
        }
    }
}

/// [`settle`] for a pre-flight however it was made (pure).
pub fn settle_with(pre: Preflight, laid: Laid<'_>) -> Tuned {
    let mut settings = merge(&pre.plan, laid.overrides);
    if let Some(f) = laid.floor {
        settings.at_least(f.streams);
    }
    let mut line = line(&pre.plan, &settings);
    if let Some(f) = laid.floor.filter(|_| settings.streams > pre.plan.streams) {
        line += &format!("; {} uses {} streams ({})", f.who, settings.streams, f.why);
    }
    let start_window = start_window(&pre, &settings, laid.policy);
    let short = short_line(&pre, &settings);
    let act_on = pre.actionable.clone();
    let mut record = record(&pre, &settings, false);
    if laid.rate_cap.is_some() && settings.pacing_rate.is_some() {
        record.pacing_rate = None;
        record.overridden.push("pacing".into());
    }
    Tuned {
        preflight: pre,
        settings,
        start_window,
        record,
        line,
        short,
        act_on,
    }
}

/// One line saying what was chosen and for what path, the default output
/// (the planner's reasoning is [`Tuned::line`]): streams, buffer,
/// congestion control and pacing, then the probed rate (`≥` when it is only
/// a lower bound; with its confidence and range when the probe was unsure),
/// RTT, loss and BDP that made them, and the rate the plan was sized for
/// when that is above the estimate.
pub fn short_line(pre: &Preflight, s: &Settings) -> String {
    let mut out = format!("auto: {} streams", s.streams);
    match s.buffer {
        Some(b) => out += &format!(" × {}", format_bytes_iec(b)),
        None => out += ", kernel buffers",
    }
    if let Some(cc) = &s.congestion {
        out += &format!(", {cc}");
    }
    if let Some(p) = s.pacing_rate {
        out += &format!(", paced at {} each", format_rate(p as f64));
    }
    let f = &pre.facts;
    let rtt = Duration::from_secs_f64(f.rtt_secs.clamp(0.0, 3600.0));
    // How sure the probe was, only when it matters: an unsure estimate
    // shows its confidence and trains' range.
    let unsure = pre.plan.estimate.as_ref().filter(|e| e.label != "high");
    out += &match f.bottleneck_rate {
        Some(r) if pre.rate_lower_bound => format!(" for ≥ {}", format_rate(r as f64)),
        Some(r) => match unsure {
            Some(e) => format!(
                " for ~{} ({} confidence: {}–{})",
                format_rate(r as f64),
                e.label,
                format_rate(e.low as f64),
                format_rate(e.high as f64)
            ),
            None => format!(" for {}", format_rate(r as f64)),
        },
        None => " for an unknown rate".to_string(),
    };
    out += &format!(" × {}", format_duration(rtt));
    if f.loss_rate > 0.0 {
        out += &format!(", loss {}", crate::plan::format_loss(f.loss_rate));
    }
    if let Some(bdp) = pre.plan.bdp {
        out += &format!(" (BDP {})", format_bytes(bdp));
    }
    if let Some(w) = pre.plan.window_rate {
        out += &format!(", sized for up to {}", format_rate(w as f64));
    }
    if !s.overridden.is_empty() {
        out += &format!("; flags set {}", s.overridden.join(", "));
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use super::*;
    use fatpipe_probe::estimate::{RateEstimate, RttStats};
    use fatpipe_probe::mtu::MtuResult;

    /// Host limits with one cap for every buffer (also used by peer's tests).
    pub(crate) fn limits(max: u64, cc: &[&str], privileged: bool) -> HostLimits {
        HostLimits {
            rmem_max: max,
            wmem_max: max,
            tcp_rmem: [4096, 131072, max],
            tcp_wmem: [4096, 16384, max],
            congestion: cc.iter().map(|s| s.to_string()).collect(),
            privileged,
        }
    }

    fn outcome(rtt_ms: u64, rate: Option<f64>, peer: Result<HostLimits, String>) -> ProbeOutcome {
        let ms = Duration::from_millis;
        ProbeOutcome {
            remote: SocketAddr::from(([198, 18, 0, 2], 5301)),
            rtt: RttStats {
                sent: 5,
                received: 5,
                min: ms(rtt_ms),
                avg: ms(rtt_ms),
                max: ms(rtt_ms),
                stddev: ms(0),
            },
            route_mtu: Ok(1500),
            mtu: MtuResult {
                path_mtu: Some(1500),
                probes: 1,
            },
            train_packet: 1500,
            train_len: 300,
            rate: rate.map(|r| RateEstimate {
                rate: r,
                low: r,
                high: r,
                confidence: 0.9,
                trains: 6,
                used: 6,
                outliers: 0,
                rejected: 0,
                sender_limited: false,
            }),
            kernel_clock: true,
            train_packets: (1800, 1800),
            peer_limits: peer,
            reverse: false,
            elapsed: Duration::from_millis(1200),
        }
    }

    /// The lab's 1 Gbit/s × 93 ms link between hosts capped at 4 MiB.
    fn lab_plan() -> Plan {
        let l = limits(4 << 20, &["cubic", "bbr"], false);
        from_outcome(
            &outcome(93, Some(1e9), Ok(l.clone())),
            Ok(l),
            Role::Sender,
            &Policy::default(),
            true,
        )
        .unwrap()
        .plan
    }

    #[test]
    fn no_flags_take_the_whole_plan() {
        let p = lab_plan();
        assert!(p.streams > 1, "{p:?}");
        let s = merge(&p, &Overrides::default());
        assert_eq!(s.streams, p.streams);
        assert_eq!(s.congestion.as_deref(), Some(p.congestion.as_str()));
        assert_eq!(s.pacing_rate, p.pacing_rate);
        assert_eq!(
            s.buffer,
            p.set_buffers.then_some(p.per_stream_buffer),
            "{p:?}"
        );
        assert!(s.overridden.is_empty());
        assert_eq!(line(&p, &s), p.reason);
        assert!(p.reason.starts_with("auto: RTT 93"), "{}", p.reason);
    }

    #[test]
    fn each_flag_replaces_only_its_part() {
        let mut p = lab_plan();
        p.pacing_rate = Some(200_000_000);
        p.streams = 5;
        let s = merge(
            &p,
            &Overrides {
                streams: Some(10),
                ..Overrides::default()
            },
        );
        assert_eq!(s.streams, 10);
        assert_eq!(s.overridden, ["streams"]);
        assert_eq!(s.congestion.as_deref(), Some(p.congestion.as_str()));
        // 5 × 200 Mbit/s stays 1 Gbit/s in total over 10 streams.
        assert_eq!(s.pacing_rate, Some(100_000_000));
        assert!(line(&p, &s).ends_with("flags override: 10 streams"));

        let s = merge(
            &p,
            &Overrides {
                congestion: Some("reno".into()),
                buffer: Some(1 << 20),
                ..Overrides::default()
            },
        );
        assert_eq!(s.streams, 5);
        assert_eq!(s.buffer, Some(1 << 20));
        assert!(!s.forced_buffers);
        assert_eq!(s.congestion.as_deref(), Some("reno"));
        assert_eq!(s.pacing_rate, Some(200_000_000));
        assert_eq!(s.overridden, ["buffer", "congestion"]);

        let s = merge(
            &p,
            &Overrides {
                pacing_rate: Some(5),
                ..Overrides::default()
            },
        );
        assert_eq!(s.pacing_rate, Some(5));
        assert_eq!(s.streams, 5);
    }

    #[test]
    fn a_floor_of_streams_keeps_the_total_pacing() {
        let mut p = lab_plan();
        p.streams = 2;
        p.pacing_rate = Some(500_000_000);
        let mut s = merge(&p, &Overrides::default());
        s.at_least(4);
        assert_eq!((s.streams, s.pacing_rate), (4, Some(250_000_000)));
        s.at_least(3);
        assert_eq!(s.streams, 4, "a floor never lowers");
        assert!(s.overridden.is_empty());
    }

    #[test]
    fn a_floor_of_streams_shares_out_the_window() {
        // (planned streams, buffer each, floor) → buffer each after
        let cases = [
            (1, 64 << 20, 4, 16 << 20),
            (2, 3 << 20, 4, 3 << 19),
            (3, 1_000_001, 4, 750_001),
            (1, 512 << 10, 4, MIN_SHARED_BUFFER),
            (8, 4 << 20, 4, 4 << 20),
        ];
        for (streams, buffer, floor, want) in cases {
            let mut p = lab_plan();
            p.streams = streams;
            p.set_buffers = true;
            p.per_stream_buffer = buffer;
            let mut s = merge(&p, &Overrides::default());
            s.at_least(floor);
            assert_eq!(s.buffer, Some(want), "{streams} × {buffer} → {floor}");
        }
    }

    #[test]
    fn a_given_buffer_is_never_forced_and_a_planned_one_is_when_planned() {
        let mut p = lab_plan();
        p.set_buffers = true;
        p.forced_buffers = true;
        p.per_stream_buffer = 64 << 20;
        let s = merge(&p, &Overrides::default());
        assert_eq!((s.buffer, s.forced_buffers), (Some(64 << 20), true));
        let s = merge(
            &p,
            &Overrides {
                buffer: Some(8 << 20),
                ..Overrides::default()
            },
        );
        assert_eq!((s.buffer, s.forced_buffers), (Some(8 << 20), false));
        p.set_buffers = false;
        p.forced_buffers = false;
        assert_eq!(merge(&p, &Overrides::default()).buffer, None);
    }

    #[test]
    fn all_given_skips_planning() {
        let mut o = Overrides {
            streams: Some(1),
            buffer: Some(1),
            congestion: Some("bbr".into()),
            pacing_rate: None,
        };
        assert!(!o.all_given());
        o.pacing_rate = Some(1);
        assert!(o.all_given());
    }

    #[test]
    fn a_peer_on_autotuning_caps_the_window_and_asks_for_more_streams() {
        // Receiver with tcp_rmem[2] 8 MiB: autotuning gives a 4 MiB window;
        // asking it for 16 MiB fixed buffers gets nothing more.
        let here = limits(16 << 20, &["cubic"], true);
        let mut there = limits(16 << 20, &["cubic"], true);
        there.tcp_rmem[2] = 8 << 20;
        let o = outcome(93, Some(1e9), Ok(there.clone()));
        let fixed = from_outcome(&o, Ok(here.clone()), Role::Sender, &Policy::default(), true)
            .unwrap()
            .plan;
        let auto = from_outcome(&o, Ok(here), Role::Sender, &Policy::default(), false)
            .unwrap()
            .plan;
        assert!(auto.streams > fixed.streams, "{fixed:?} vs {auto:?}");
        assert!(auto.per_stream_buffer <= 4 << 20, "{auto:?}");
        let only = autotuning_only(&there);
        assert_eq!((only.rmem_max, only.privileged), (4 << 20, false));
        assert_eq!(only.wmem_max, 8 << 20);
    }

    #[test]
    fn loss_the_probe_cannot_rule_out_picks_bbr_on_long_paths_only() {
        let l = limits(4 << 20, &["cubic", "bbr"], false);
        // 93 ms, no loss seen in 1805 packets: 0.17 % is possible and
        // would cripple cubic, so bbr.
        let long = from_outcome(
            &outcome(93, Some(1e9), Ok(l.clone())),
            Ok(l.clone()),
            Role::Sender,
            &Policy::default(),
            true,
        )
        .unwrap();
        assert_eq!(long.plan.congestion, "bbr", "{}", long.plan.reason);
        assert_eq!(long.plan.pacing_rate, None);
        assert!(
            long.plan.reason.contains("cannot rule out"),
            "{}",
            long.plan.reason
        );
        assert_eq!(long.facts.loss_rate, 0.0, "the facts stay as measured");
        // 1 ms at 100 Mbit/s: the same bound leaves cubic above the path.
        let short = from_outcome(
            &outcome(1, Some(1e8), Ok(l.clone())),
            Ok(l),
            Role::Sender,
            &Policy::default(),
            true,
        )
        .unwrap();
        assert_eq!(short.plan.congestion, "cubic", "{}", short.plan.reason);
        // Without bbr on offer the plan stays as it was.
        let no_bbr = limits(4 << 20, &["cubic"], false);
        let p = from_outcome(
            &outcome(93, Some(1e9), Ok(no_bbr.clone())),
            Ok(no_bbr),
            Role::Sender,
            &Policy::default(),
            true,
        )
        .unwrap();
        assert_eq!(p.plan.congestion, "cubic");
        assert!(!p.plan.reason.contains("cannot rule out"));
    }

    #[test]
    fn a_lower_bound_rate_is_not_paced() {
        let l = limits(4 << 20, &["cubic"], false);
        let mut o = outcome(1, Some(9e9), Ok(l.clone()));
        let paced =
            from_outcome(&o, Ok(l.clone()), Role::Sender, &Policy::default(), true).unwrap();
        assert!(paced.plan.pacing_rate.is_some(), "{:?}", paced.plan);
        assert!(paced.plan.reason.contains("paced at"));
        if let Some(r) = o.rate.as_mut() {
            r.sender_limited = true;
        }
        let pre = from_outcome(&o, Ok(l), Role::Sender, &Policy::default(), true).unwrap();
        assert_eq!(pre.plan.pacing_rate, None);
        assert!(!pre.plan.reason.contains("paced at"), "{}", pre.plan.reason);
        assert!(pre
            .plan
            .reason
            .ends_with("not paced (the rate is a lower bound)"));
        assert!(pre.warnings.iter().any(|w| w.contains("lower bound")));
    }

    #[test]
    fn the_sender_picks_the_congestion_control() {
        // Loss makes the planner want BBR; only the server has it.
        let here = limits(4 << 20, &["reno", "cubic"], false);
        let there = limits(4 << 20, &["cubic", "bbr"], false);
        let mut o = outcome(93, Some(1e9), Ok(there));
        o.train_packets = (10_000, 9_990);
        let up =
            from_outcome(&o, Ok(here.clone()), Role::Sender, &Policy::default(), true).unwrap();
        let down = from_outcome(&o, Ok(here), Role::Receiver, &Policy::default(), true).unwrap();
        assert_ne!(up.plan.congestion, "bbr", "{:?}", up.plan);
        assert_eq!(down.plan.congestion, "bbr", "{:?}", down.plan);
    }

    #[test]
    fn unknowns_are_said_and_both_unknown_is_an_error() {
        let l = limits(4 << 20, &["cubic"], false);
        let pre = from_outcome(
            &outcome(228, None, Err("no /proc".into())),
            Ok(l),
            Role::Sender,
            &Policy::default(),
            true,
        )
        .unwrap();
        assert_eq!(pre.plan.bdp, None);
        assert!(
            pre.plan.reason.contains("rate unknown"),
            "{}",
            pre.plan.reason
        );
        let all = pre.warnings.join("\n");
        assert!(all.contains("no probe train"), "{all}");
        assert!(all.contains("server's host limits unknown"), "{all}");
        let e = from_outcome(
            &outcome(228, None, Err("a".into())),
            Err("b".into()),
            Role::Sender,
            &Policy::default(),
            true,
        )
        .unwrap_err();
        assert!(matches!(e, PreflightError::NoLimits { .. }), "{e}");
    }

    #[test]
    fn settle_lays_flags_floor_and_rate_cap_over_the_plan() {
        let l = limits(4 << 20, &["cubic", "bbr"], false);
        let mut pre = from_outcome(
            &outcome(93, Some(1e9), Ok(l.clone())),
            Ok(l),
            Role::Sender,
            &Policy::default(),
            true,
        )
        .unwrap();
        pre.plan.streams = 2;
        pre.plan.pacing_rate = Some(500_000_000);
        let mut req = request();
        // test: the plan as it is, the line is its reason.
        let t = settle(pre.clone(), &req);
        assert_eq!((t.settings.streams, t.record.streams), (2, 2));
        assert_eq!(t.line, pre.plan.reason);
        assert_eq!(t.record.pacing_rate, Some(500_000_000));
        // copy: at least 4 streams, said on the line; --bwlimit replaces
        // the pacing in the record.
        req.floor = Some(Floor {
            streams: 4,
            who: "copy",
            why: "they also read",
        });
        req.rate_cap = Some(100_000_000);
        let t = settle(pre.clone(), &req);
        assert_eq!((t.settings.streams, t.record.streams), (4, 4));
        assert_eq!(
            t.line,
            format!("{}; copy uses 4 streams (they also read)", pre.plan.reason)
        );
        assert_eq!(t.record.pacing_rate, None);
        assert_eq!(t.record.overridden, ["pacing"]);
        assert_eq!(t.settings.pacing_rate, Some(250_000_000));
    }

    #[test]
    fn an_unsure_probe_shows_its_range_and_the_plan_reaches_past_it() {
        // 5 Gbit/s × 93 ms probed on a loaded host: trains from 1.2 to 5.1.
        let l = limits(4 << 20, &["cubic", "bbr"], false);
        let mut o = outcome(93, Some(2.7e9), Ok(l.clone()));
        if let Some(r) = o.rate.as_mut() {
            (r.low, r.high, r.confidence) = (1.2e9, 5.1e9, 0.2);
        }
        let pre = from_outcome(&o, Ok(l), Role::Sender, &Policy::default(), true).unwrap();
        assert_eq!(pre.plan.window_rate, Some(5_100_000_000));
        let e = pre.plan.estimate.clone().unwrap();
        assert_eq!(
            (e.rate, e.low, e.label.as_str()),
            (2_700_000_000, 1_200_000_000, "low")
        );
        let req = request();
        let t = settle(pre, &req);
        assert!(
            t.short
                .contains(" for ~2.70 Gbit/s (low confidence: 1.20 Gbit/s–5.10 Gbit/s)"),
            "{}",
            t.short
        );
        assert!(
            t.short.contains(", sized for up to 5.10 Gbit/s"),
            "{}",
            t.short
        );
        // The JSON record carries the numbers.
        assert_eq!(t.record.plan.window_rate, Some(5_100_000_000));
    }

    /// A test's pre-flight request to a loopback server, with no flags.
    fn request() -> Request {
        let addr = SocketAddr::from(([127, 0, 0, 1], 5301));
        Request {
            preflight: PreflightConfig::new(addr, ClientOptions::default(), Role::Sender),
            overrides: Overrides::default(),
            floor: None,
            rate_cap: None,
        }
    }

    #[test]
    fn the_short_line_says_what_was_chosen_for_which_path_on_one_line() {
        let l = limits(4 << 20, &["cubic", "bbr"], false);
        let mut o = outcome(228, Some(979e6), Ok(l.clone()));
        o.train_packets = (10_000, 9_995);
        let pre = from_outcome(&o, Ok(l), Role::Sender, &Policy::default(), true).unwrap();
        let req = request();
        let t = settle(pre.clone(), &req);
        let s = &t.short;
        assert!(
            s.starts_with(&format!(
                "auto: {} streams × {}, {}",
                t.settings.streams,
                format_bytes_iec(t.settings.buffer.unwrap_or(0)),
                t.settings.congestion.as_deref().unwrap_or("?")
            )),
            "{s}"
        );
        assert!(s.contains(" for 979 Mbit/s × 228"), "{s}");
        assert!(
            s.contains("loss 0.05%") && s.contains("(BDP 27.9 MB)"),
            "{s}"
        );
        // Short: no reasoning, no line break, far shorter than the reason.
        assert!(
            !s.contains('\n') && !s.contains("because") && s.len() < 120,
            "{s}"
        );
        assert!(t.line.len() > s.len());
        assert!(t.act_on.is_empty());
        // A lower bound says so in one character, not in a warning.
        if let Some(r) = o.rate.as_mut() {
            r.sender_limited = true;
        }
        let l = limits(4 << 20, &["cubic", "bbr"], false);
        let low = from_outcome(&o, Ok(l), Role::Sender, &Policy::default(), true).unwrap();
        let t = settle(low, &req);
        assert!(t.short.contains(" for ≥ 979 Mbit/s"), "{}", t.short);
        assert!(
            t.act_on.is_empty(),
            "nothing for the user to do: {:?}",
            t.act_on
        );
        // Flags are named.
        let flagged = Request {
            overrides: Overrides {
                streams: Some(3),
                ..Overrides::default()
            },
            ..req
        };
        let t = settle(pre, &flagged);
        assert!(
            t.short.starts_with("auto: 3 streams") && t.short.ends_with("; flags set streams"),
            "{}",
            t.short
        );
    }

    #[test]
    fn record_keeps_plan_and_applied_settings() {
        let l = limits(4 << 20, &["cubic", "bbr"], false);
        let pre = from_outcome(
            &outcome(93, Some(1e9), Ok(l.clone())),
            Ok(l),
            Role::Sender,
            &Policy::default(),
            true,
        )
        .unwrap();
        let s = merge(
            &pre.plan,
            &Overrides {
                streams: Some(3),
                ..Overrides::default()
            },
        );
        let r = record(&pre, &s, false);
        assert_eq!(r.streams, 3);
        assert_eq!(r.plan, pre.plan);
        assert_eq!(r.overridden, ["streams"]);
        assert!(!r.adjusting && r.decisions.is_empty());
        let json = serde_json::to_string(&r).unwrap();
        let back: AutoTune = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn blind_plans_for_an_unknown_rate_within_the_buffer_caps() {
        let policy = Policy {
            max_streams: 128,
            ..Policy::default()
        };
        let local = limits(4 << 20, &["cubic", "bbr"], false);
        let pre = blind(Duration::from_millis(50), 1500, Ok(local.clone()), &policy).unwrap();
        assert_eq!(pre.facts.bottleneck_rate, None);
        assert_eq!(pre.plan.streams, policy.unknown_rate_streams);
        assert!(!pre.plan.forced_buffers);
        assert!(
            !pre.plan.set_buffers || pre.plan.per_stream_buffer <= 4 << 20,
            "{:?}",
            pre.plan
        );
        assert!(pre
            .warnings
            .iter()
            .any(|w| w.contains("rate and loss unknown")));
        // Autotuning past the SO_*BUF caps: no fixed buffer is asked for.
        let mut big = local;
        big.tcp_rmem[2] = 64 << 20;
        big.tcp_wmem[2] = 64 << 20;
        let pre = blind(Duration::from_millis(50), 1500, Ok(big), &policy).unwrap();
        assert!(!pre.plan.set_buffers, "{:?}", pre.plan);
        assert!(blind(
            Duration::from_millis(50),
            1500,
            Err("no /proc".into()),
            &policy
        )
        .is_err());
    }
}
