//! The auto-tuning planner: path facts and both ends' limits in, a [`Plan`]
//! (streams, per-stream buffer, congestion control, pacing) out.
//!
//! It is a pure function so that every rule can be pinned by a table of
//! cases, and so `test`, `copy` and `fatpipe path` can call it with facts
//! from wherever they came (a probe, the peer's hello, a flag).
//!
//! How it decides, in order:
//!
//! 1. **Window.** The streams together must keep `BDP × headroom` in flight;
//!    the headroom (50 % by default) lets a stream recovering from a loss, or
//!    BBR probing with its cwnd gain of 2, keep the pipe full. Under loss the
//!    buffers hold more than the window: the receiver keeps out-of-order data
//!    and the sender unacknowledged data for a round trip after every loss,
//!    so the headroom grows on a logarithmic scale from 0.01 % loss (×1)
//!    to 0.1 % (×2) and 1 % (×8/3); see [`loss_headroom`].
//! 2. **Per-stream cap.** Each end limits one socket's buffer in two ways:
//!    `SO_SNDBUF`/`SO_RCVBUF` may not exceed `wmem_max`/`rmem_max` (and the
//!    receiver holds the window at exactly the value asked for, with
//!    `TCP_WINDOW_CLAMP`: the kernel alone would allow a kernel-dependent
//!    1–1.4 × of it), while kernel autotuning grows a socket to
//!    `tcp_wmem[2]`/`tcp_rmem[2]` of which roughly half is window. The larger
//!    of the two is used; autotuning wins ties because it starts small. Only
//!    when even the stream cap cannot cover the window this way, and both
//!    ends are privileged, are buffers forced past the caps.
//! 3. **Loss.** Under loss a loss-based congestion control (CUBIC, Reno,
//!    H-TCP) gets per stream about the Mathis rate `MSS/RTT × 1.22/√p`, so
//!    the stream count is the path rate over that. BBR is preferred whenever
//!    it is available and the path loses packets (or its loss is unknown,
//!    because the rate is): its model ignores random loss, and a small floor
//!    of streams keeps the pipe full while one of them is in recovery.
//! 4. **Bounds.** A clean path gets exactly the streams its window needs —
//!    never more, because extra streams there only add queueing and CPU.
//!    Everything is capped at `max_streams` (64): beyond that streams cost
//!    memory, CPU and fairness to other users of a shared research link for
//!    little gain, and the reason line says when the cap bit.
//! 5. **Pacing.** With a known rate and a congestion control other than BBR,
//!    each stream is paced at rate/streams, so the streams do not burst into
//!    the bottleneck's queue together. `SO_MAX_PACING_RATE` works through
//!    TCP's internal pacing even without the `fq` qdisc.
//! 6. **Doubt.** A probe that is not sure of its rate ([`plan_with`] gets
//!    its interval and confidence) must not cap the transfer: windows,
//!    streams and pacing are sized for the largest rate it could not rule
//!    out ([`window_rate`]), since a window too large costs only memory
//!    (BBR keeps its own in-flight near the path's BDP; the receiver holds
//!    each window exactly), while one too small caps the transfer until
//!    the in-flight adjuster's first step seconds later. A low-confidence
//!    estimate gets at least the windows an unknown rate gets.

use std::time::Duration;

use fatpipe_schema::tune::{HostLimits, PathFacts, Plan, RateConfidence};
use fatpipe_schema::units::{
    bdp_bytes, format_bytes, format_bytes_iec, format_duration, format_rate,
};

/// Bounds and assumptions of the planner. `Default` is what `test` and
/// `copy` use; flags such as `--max-streams` override single fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// The most streams any plan may use.
    pub max_streams: u32,
    /// The largest buffer forced past the host caps (bytes per socket).
    pub max_forced_buffer: u64,
    /// In-flight window as a multiple of the BDP.
    pub headroom: f64,
    /// Streams used when the bottleneck rate is unknown; the in-flight
    /// adjuster adds more if loss turns out to limit them.
    pub unknown_rate_streams: u32,
    /// Total pacing as a multiple of the bottleneck rate. 1.0 paces the
    /// streams together at exactly the estimate; above 1 leaves room for
    /// an estimate that came out low (probes are good to ~15 %), at the
    /// cost of a slowly filling queue when it was right.
    pub pacing_gain: f64,
    /// With `Some(n)`, at least the streams whose slow start fills the BDP
    /// in `n` round trips ([`ramp_streams`]): copy sets it, because a copy
    /// of a few GB pays for its start-up in its wall clock; `test`
    /// measures the steady state and keeps the fewest streams.
    pub ramp_rtts: Option<u32>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            max_streams: fatpipe_schema::tune::MAX_PLANNED_STREAMS,
            // The kernel clamps SO_*BUFFORCE at INT_MAX/2 before doubling;
            // 512 MiB per socket is already 8 GB of kernel memory at 16 streams.
            max_forced_buffer: 512 << 20,
            headroom: 1.5,
            unknown_rate_streams: 4,
            pacing_gain: 1.0,
            ramp_rtts: None,
        }
    }
}

/// MSS assumed for an IP MTU: IPv4 and TCP headers plus timestamps (52 B).
pub fn mss_for(mtu: u32) -> u32 {
    let mtu = if mtu == 0 { 1500 } else { mtu.max(576) };
    mtu - 52
}

/// The Mathis et al. estimate of one loss-based TCP stream's rate in bit/s:
/// `MSS/RTT × 1.22/√p`; `None` for a loss-free path, where it does not bind.
pub fn mathis_rate(mss: u32, rtt: Duration, loss: f64) -> Option<f64> {
    if loss.is_nan() || loss <= 0.0 {
        return None;
    }
    let rtt = rtt.as_secs_f64().max(1e-6);
    Some(f64::from(mss) * 8.0 / rtt * 1.22 / loss.sqrt())
}

/// The window one stream gets at both ends without forcing: through kernel
/// autotuning (about half of `tcp_*mem[2]`) and through a fixed buffer
/// (`*mem_max`, which the kernel doubles for its overhead), in that order.
pub fn stream_windows(sender: &HostLimits, receiver: &HostLimits) -> (u64, u64) {
    let autotune = sender.tcp_wmem[2].min(receiver.tcp_rmem[2]) / 2;
    let fixed = sender.wmem_max.min(receiver.rmem_max);
    (autotune, fixed)
}

/// Chooses streams, buffers, congestion control and pacing for a path.
///
/// `sender` is the end that sends data (the server for a reverse test);
/// only its congestion controls matter, while buffers bind at both ends.
/// The rate in `path` is taken as sure; [`plan_with`] takes the probe's
/// doubt into account.
pub fn plan(path: &PathFacts, sender: &HostLimits, receiver: &HostLimits, policy: &Policy) -> Plan {
    plan_with(path, None, sender, receiver, policy)
}

/// How far above a lower-bound rate the windows reach: the probe's sender
/// measured itself, so the path may be much faster; twice the bound covers
/// a host that sends trains at half of what TCP with segmentation offload
/// sends, and the in-flight adjuster adds streams beyond it.
pub const LOWER_BOUND_REACH: f64 = 2.0;

/// The most a rough estimate's windows reach above it: the fastest kept
/// train, but no more than this multiple of the estimate.
pub const ROUGH_REACH: f64 = 2.0;

/// The rate to size windows, streams and pacing for: the estimate when the
/// probe was sure of it (confidence "high"); otherwise the largest rate it
/// could not rule out: the fastest kept train (at most [`ROUGH_REACH`] ×
/// the estimate), and for a lower bound at least [`LOWER_BOUND_REACH`] ×
/// it.
pub fn window_rate(rate: u64, estimate: Option<&RateConfidence>) -> u64 {
    let Some(e) = estimate else {
        return rate;
    };
    let r = rate as f64;
    let reach = if e.lower_bound {
        (e.high as f64).max(r * LOWER_BOUND_REACH)
    } else if e.label != "high" {
        (e.high as f64).min(r * ROUGH_REACH)
    } else {
        r
    };
    (reach.round() as u64).max(rate)
}

/// [`plan`] with the probe's doubt: `estimate` (its interval, confidence
/// and whether it is a lower bound) sizes the plan for [`window_rate`] and
/// is recorded in the plan.
pub fn plan_with(
    path: &PathFacts,
    estimate: Option<&RateConfidence>,
    sender: &HostLimits,
    receiver: &HostLimits,
    policy: &Policy,
) -> Plan {
    let rtt_secs = if path.rtt_secs.is_finite() {
        path.rtt_secs.max(0.0)
    } else {
        0.0
    };
    // An hour bounds any real round trip and keeps Duration from panicking.
    let rtt = Duration::from_secs_f64(rtt_secs.min(3600.0));
    let loss = seen_loss(path);
    let max_streams = policy.max_streams.max(1);
    let mss = mss_for(path.mtu);
    let congestion = choose_congestion(&sender.congestion, loss, path.bottleneck_rate.is_some());
    let (autotune_window, fixed_window) = stream_windows(sender, receiver);
    let cap = autotune_window.max(fixed_window).max(64 << 10);
    let may_force = sender.privileged && receiver.privileged;

    let mut head = format!("auto: RTT {}", format_duration(rtt));
    let Some(rate) = path.bottleneck_rate.filter(|&r| r > 0) else {
        head.push_str(", rate unknown");
        push_loss(&mut head, loss);
        let streams = policy.unknown_rate_streams.clamp(1, max_streams);
        let reason = format!(
            "{head}; host allows {} per stream → {streams} streams × {}, {congestion}; \
             streams are added if loss holds them back",
            format_bytes_iec(cap),
            format_bytes_iec(cap)
        );
        return Plan {
            streams,
            per_stream_buffer: cap,
            set_buffers: cap > autotune_window,
            forced_buffers: false,
            congestion,
            pacing_rate: None,
            bdp: None,
            reason,
            estimate: None,
            window_rate: None,
        };
    };
    let estimate = estimate.filter(|e| e.rate == rate).cloned();
    let sized = window_rate(rate, estimate.as_ref());

    let bdp = bdp_bytes(rate, rtt);
    let window_loss = window_loss(path, &congestion);
    let headroom = loss_headroom(policy.headroom, window_loss);
    let mut need = ((bdp_bytes(sized, rtt) as f64 * headroom).ceil() as u64).max(1);
    // A low-confidence estimate is no worse than none: at least the
    // windows an unknown rate gets (a host stalled through the probe can
    // make every train read a tenth of the path).
    let doubtful = estimate.as_ref().is_some_and(|e| e.label == "low");
    if doubtful {
        need = need.max(u64::from(policy.unknown_rate_streams.clamp(1, max_streams)) * cap);
    }
    head.push_str(&format!(", {}", rate_words(rate, estimate.as_ref())));
    push_loss(&mut head, loss);
    if window_loss > loss {
        head.push_str(&format!(
            " (sized for up to {}: {} probe packets cannot rule it out)",
            format_loss(window_loss),
            path.loss_packets
        ));
    }
    head.push_str(&format!(" → BDP {}", format_bytes(bdp)));
    if sized > rate {
        head.push_str(&format!(
            "; sized for {} (BDP {}): the probe was unsure",
            format_rate(sized as f64),
            format_bytes(bdp_bytes(sized, rtt))
        ));
    }

    let loss_streams = loss_streams(&congestion, mss, rtt, window_loss, sized);
    let buffer_streams = need.div_ceil(cap);
    let mut notes = Vec::new();
    let (per_stream_cap, forced, limit) = if buffer_streams > u64::from(max_streams) && may_force {
        (
            policy.max_forced_buffer.max(cap),
            true,
            format!(
                "host caps buffers at {}, {max_streams} streams are not enough",
                format_bytes_iec(cap)
            ),
        )
    } else if buffer_streams > 1 {
        (
            cap,
            false,
            format!("host caps buffers at {}", format_bytes_iec(cap)),
        )
    } else {
        (
            cap,
            false,
            format!("one window of {} covers it", format_bytes(need)),
        )
    };
    let buffer_streams = need.div_ceil(per_stream_cap);
    if headroom > policy.headroom.max(1.0) + 1e-9 {
        let start = (start_headroom(policy.headroom, loss) * 100.0).round() / 100.0;
        notes.push(format!(
            "window {headroom:.1} × BDP ({start} × through start-up): after a loss the buffers also hold out-of-order and unacknowledged data"
        ));
    }
    let others = buffer_streams.max(loss_streams.count).max(1);
    let ramp = policy.ramp_rtts.map_or(1, |r| {
        ramp_streams(bdp_bytes(sized, rtt), mss, rtt, r, others)
    });
    if ramp > others {
        notes.push(format!(
            "{ramp} streams so that slow start fills the BDP in {} round trips",
            policy.ramp_rtts.unwrap_or(0)
        ));
    }
    let wanted = others.max(ramp);
    let streams = wanted.min(u64::from(max_streams)) as u32;
    if wanted > u64::from(max_streams) {
        notes.push(format!(
            "capped at {max_streams} streams (more cost CPU and memory and crowd other traffic)"
        ));
        if buffer_streams > u64::from(max_streams) {
            notes.push(format!(
                "window short of the BDP: raise the host caps (fatpipe tune --rate {} --rtt {})",
                format_rate(rate as f64).replace(' ', "").replace("/s", ""),
                format_duration(rtt).replace(' ', "")
            ));
        }
    }
    let per_stream = round_up(need.div_ceil(u64::from(streams)), 64 << 10).min(per_stream_cap);
    let forced = forced && per_stream > cap;
    let set_buffers = forced || per_stream > autotune_window;
    if forced {
        notes.push("buffers forced past the host caps (privileged)".to_string());
    }
    let gain = if policy.pacing_gain.is_finite() {
        policy.pacing_gain.max(0.1)
    } else {
        1.0
    };
    let pacing_rate =
        (congestion != "bbr").then(|| (sized as f64 * gain / f64::from(streams)) as u64);

    let why = match &loss_streams.why {
        Some(w) if loss_streams.count > buffer_streams => w.clone(),
        _ => limit,
    };
    let mut reason = format!(
        "{head}; {why} → {streams} {} × {}, {congestion}",
        if streams == 1 { "stream" } else { "streams" },
        format_bytes_iec(per_stream)
    );
    if let Some(p) = pacing_rate {
        reason.push_str(&format!(", paced at {} each", format_rate(p as f64)));
    }
    for n in notes {
        reason.push_str("; ");
        reason.push_str(&n);
    }
    Plan {
        streams,
        per_stream_buffer: per_stream,
        set_buffers,
        forced_buffers: forced,
        congestion,
        pacing_rate,
        bdp: Some(bdp),
        reason,
        estimate,
        window_rate: (sized > rate).then_some(sized),
    }
}

/// The probed rate in words for the reason line: `~4.88 Gbit/s` when the
/// probe was sure, with its interval and confidence when it was not, `≥`
/// for a lower bound.
pub fn rate_words(rate: u64, estimate: Option<&RateConfidence>) -> String {
    let r = format_rate(rate as f64);
    match estimate {
        Some(e) if e.lower_bound => {
            format!("≥ {r} (a lower bound: the probe's sender was slower)")
        }
        Some(e) if e.label != "high" => format!(
            "~{r} ({} confidence: trains {}–{})",
            e.label,
            format_rate(e.low as f64),
            format_rate(e.high as f64)
        ),
        _ => format!("~{r}"),
    }
}

/// The window as a multiple of the BDP for a path with this loss: `base`
/// up to 0.01 % loss, twice `base` at 0.1 %, 8/3 of `base` from 1 %,
/// log-linear between.
///
/// Windows are exact: the receiver holds each stream's window at its
/// buffer (`TCP_WINDOW_CLAMP`, see `fatpipe_sys::WindowHold`). Measured on
/// a 1 Gbit/s × 228 ms lab link with a 1-BDP queue and BBR, when windows
/// were still about 1.33 × the buffer (30 s tests, steady state): 2.0 BDP
/// in flight gave 934–947 Mbit/s at 0 and 0.01 % loss but over-filled the
/// queue in start-up (≈10k segments lost, which 1.5 BDP avoids); at 0.1 %,
/// 2.0 BDP gave 844 and 2.8 BDP 947; at 1 %, 2.8 BDP gave 883 and 3.9 BDP
/// 937, while 5.6 BDP multiplied the retransmits by five.
pub fn loss_headroom(base: f64, loss: f64) -> f64 {
    let base = if base.is_finite() { base.max(1.0) } else { 1.5 };
    if loss.is_nan() || loss <= 1e-4 {
        return base;
    }
    base * (1.0 + decades_above(loss, 1e-4) + 2.0 / 3.0 * decades_above(loss, 1e-3))
}

/// How far `loss` lies above `from` in decades, from 0 (at or below it, or
/// not a number) to 1 (ten times it or more): the log-linear step the
/// window rules share.
fn decades_above(loss: f64, from: f64) -> f64 {
    let d = (loss / from).log10();
    if d.is_nan() {
        0.0
    } else {
        d.clamp(0.0, 1.0)
    }
}

/// The loss a plan sizes its windows for: with BBR on a path where the
/// probe lost packets, the most loss its packets could not rule out
/// ([`loss_upper_bound`]); otherwise the loss seen.
///
/// BBR's rate ignores random loss, but each loss leaves a round trip of
/// out-of-order and unacknowledged data in the buffers, so a window sized
/// for too little loss caps the streams, and the in-flight adjuster needs
/// seconds to see it: at 0.1 % loss a probe of ~5,000 packets sees 0.05 %
/// as often as 0.1 %, and a window sized for 0.05 % carried ~85 % of a
/// 1 Gbit/s × 228 ms path. A window too large costs only memory with BBR,
/// which keeps its own in-flight near its model, as long as the windows
/// stay below the BDP plus the bottleneck's queue: on a clean 1 Gbit/s ×
/// 93 ms lab link (1-BDP queue) windows sized for the 0.06 % that 5,000
/// clean packets cannot rule out (2.6 × BDP) let BBR's streams over-fill
/// the queue and retransmit where 1.5 × BDP lost nothing, so a probe that
/// lost nothing keeps the clean window (the in-flight adjuster widens it
/// if loss shows). Loss-based control fills whatever window it gets, so
/// there the larger window would only fill the queue: it is sized for the
/// loss seen.
pub fn window_loss(path: &PathFacts, congestion: &str) -> f64 {
    let loss = seen_loss(path);
    if congestion == "bbr" && loss > 0.0 {
        loss_upper_bound(loss, path.loss_packets)
    } else {
        loss
    }
}

/// The loss the probe saw, 0 when not known.
fn seen_loss(path: &PathFacts) -> f64 {
    if path.loss_rate.is_finite() {
        path.loss_rate.clamp(0.0, 1.0)
    } else {
        0.0
    }
}

/// The one-sided 95 % upper bound of a loss rate seen as `loss` over
/// `packets` packets: `3 / packets` when none was lost (the "rule of
/// three"), otherwise the Poisson bound by the Wilson–Hilferty
/// approximation, `(k+1)·(1 − 1/(9(k+1)) + 1.645/(3√(k+1)))³ / packets`
/// for `k` losses (within 1 % of the exact bound from k = 1). `loss`
/// itself when `packets` is 0 (not known).
pub fn loss_upper_bound(loss: f64, packets: u64) -> f64 {
    if packets == 0 || !loss.is_finite() {
        return loss;
    }
    let n = packets as f64;
    let k = (loss.clamp(0.0, 1.0) * n).round();
    let bound = if k == 0.0 {
        3.0 / n
    } else {
        let m = k + 1.0;
        m * (1.0 - 1.0 / (9.0 * m) + 1.645 / (3.0 * m.sqrt())).powi(3) / n
    };
    bound.max(loss).min(1.0)
}

/// Round trips a copy's slow start may take to fill the BDP: copy plans
/// at least enough streams for that ([`ramp_streams`], `Policy::ramp_rtts`).
pub const RAMP_RTTS: u32 = 5;

/// The most streams the ramp alone asks for.
pub const MAX_RAMP_STREAMS: u64 = 32;

/// A ramp shorter than this is not worth more streams.
const RAMP_WORTH: Duration = Duration::from_millis(100);

/// Streams enough for slow start to fill `bdp` bytes within `rtts` round
/// trips, at most [`MAX_RAMP_STREAMS`]; `planned` (what the window and loss
/// call for) when that many already ramp within 100 ms or the `rtts`.
///
/// Every new stream starts at the kernel's initial window (10 segments)
/// and doubles it each round trip, so a few streams take many round trips
/// to fill a long fat path: 5 streams need 8 of them for 1 Gbit/s × 93 ms,
/// and a copy of a few GB loses most of a second to it. A user cannot
/// raise the initial window without root (a route's `initcwnd`), but
/// streams add up: 26 streams fill that path in 5. The total window stays
/// what the BDP and loss call for, shared out in smaller buffers, so the
/// extra streams add no queueing (measured on the lab with iperf3 and BBR
/// at 1 Gbit/s × 93 ms: 32 streams of 512 KiB carried 905 Mbit/s over 12 s
/// with almost no queue drops, 9 of 1.5 MB 884; 2 GiB copies, 25 streams
/// against 5: 0.869 against 0.845 Gbit/s over the wall clock).
pub fn ramp_streams(bdp: u64, mss: u32, rtt: Duration, rtts: u32, planned: u64) -> u64 {
    let initial = u64::from(mss.max(1)) * INITIAL_WINDOW;
    let planned = planned.max(1);
    // Round trips the planned streams take: doublings from their initial
    // windows to the BDP.
    let mut rounds = 0u32;
    while planned.saturating_mul(initial) << rounds.min(62) < bdp && rounds < 64 {
        rounds += 1;
    }
    if rounds <= rtts || rtt.saturating_mul(rounds) < RAMP_WORTH {
        return planned;
    }
    let reach = initial.saturating_mul(1 << rtts.min(40));
    bdp.div_ceil(reach)
        .clamp(planned, MAX_RAMP_STREAMS.max(planned))
}

/// The kernel's initial congestion window, in segments (RFC 6928).
const INITIAL_WINDOW: u64 = 10;

/// Round trips a start window holds for, from a stream's first data: BBR's
/// start-up doubles the rate each round trip from 10 packets a stream, so
/// it reaches a 1 Gbit/s × 228 ms BDP from 20 streams in about 7, then needs
/// 3 more to see the rate stop growing and one to drain its queue.
pub const START_HOLD_RTTS: u32 = 11;

/// How much wider than the clean window the start-up hold is on a path
/// with 1 % loss or more ([`start_headroom`]).
pub const HOLD_HOLE_ROOM: f64 = 0.3;

/// The window start-up is held at, as a multiple of the BDP: the clean
/// window (`base`, as [`loss_headroom`] gives it for no loss) up to 0.1 %
/// loss, [`HOLD_HOLE_ROOM`] more from 1 %, log-linear between. `loss` is
/// the loss the probe saw, not the bound [`window_loss`] sizes the steady
/// window for: a hold too wide over-fills the queue, so it errs small. At
/// 0.1 % the bound (about 0.25 %) made it 1.75 × BDP and 2 GiB pushes lost
/// about 0.5 % (0.790 against 0.796, 3 runs); with the loss seen, 0.790
/// against 0.787 (4 runs).
///
/// At 1 % nearly every stream has a hole in its receive window every round
/// trip, and the data behind the hole holds window until the
/// retransmission fills it: held at the clean 1.5 × BDP, 32 BBR streams on
/// a 1 Gbit/s × 228 ms lab link with a 1-BDP queue carried about 750 Mbit/s
/// through start-up, and BBR then took two of its 8-round-trip gain cycles
/// to find the rest (ramp to 90 % 3–4.3 s; held at 1.95 × BDP 2.4–2.8 s,
/// and 2 GiB pushes 0.766 against 0.754 Gbit/s, medians of 15 alternating
/// runs in four batches). 1.95 × BDP stays below the 2 × BDP that
/// over-fills a 1-BDP queue.
pub fn start_headroom(base: f64, loss: f64) -> f64 {
    loss_headroom(base, 0.0) * (1.0 + HOLD_HOLE_ROOM * decades_above(loss, 1e-3))
}

/// The window each stream is held at during the sender's start-up, as a
/// fraction of the planned one, and for how long; `None` when the plan's
/// window is no wider than the hold (no loss seen, or the rate unknown).
///
/// The loss headroom ([`loss_headroom`]) keeps streams sending through
/// loss recovery, but in start-up BBR puts the whole window in flight: 3 ×
/// BDP over-fills a 1-BDP queue and loses thousands of segments at once.
/// Start-up at the clean window (`policy.headroom`, a little more at high
/// loss: [`start_headroom`]) loses none of them, and the window widens once
/// it is over.
pub fn start_hold(path: &PathFacts, congestion: &str, policy: &Policy) -> Option<(f64, Duration)> {
    path.bottleneck_rate.filter(|&r| r > 0)?;
    let loss = window_loss(path, congestion);
    let seen = seen_loss(path);
    let fraction = start_headroom(policy.headroom, seen) / loss_headroom(policy.headroom, loss);
    let rtt = path.rtt_secs;
    if fraction >= 1.0 - 1e-9 || !rtt.is_finite() || rtt <= 0.0 {
        return None;
    }
    let hold = Duration::from_secs_f64((rtt * f64::from(START_HOLD_RTTS)).min(3600.0));
    Some((fraction, hold))
}

pub use fatpipe_schema::units::format_loss;

/// How many streams loss alone calls for, and why (for the reason line).
struct LossStreams {
    count: u64,
    why: Option<String>,
}

/// BBR's floor of streams by loss: (at least this loss, streams).
const BBR_LOSS_STREAMS: [(f64, u64); 3] = [(1e-2, 8), (1e-3, 4), (0.0, 2)];

fn loss_streams(congestion: &str, mss: u32, rtt: Duration, loss: f64, rate: u64) -> LossStreams {
    if loss.is_nan() || loss <= 0.0 {
        return LossStreams {
            count: 1,
            why: None,
        };
    }
    if congestion == "bbr" {
        let count = BBR_LOSS_STREAMS
            .iter()
            .find(|(p, _)| loss >= *p)
            .map_or(2, |&(_, n)| n);
        return LossStreams {
            count,
            why: Some(format!(
                "bbr ignores random loss but recovers one stream at a time, so {count} streams share the window"
            )),
        };
    }
    let Some(per_stream) = mathis_rate(mss, rtt, loss) else {
        return LossStreams {
            count: 1,
            why: None,
        };
    };
    let count = ((rate as f64 / per_stream).ceil() as u64).max(1);
    LossStreams {
        count,
        why: Some(format!(
            "{congestion} gets ~{} per stream at this loss (Mathis)",
            format_rate(per_stream)
        )),
    }
}

/// BBR under loss or when the path is unknown; CUBIC on a clean path, where
/// it fills a BDP window and shares fairly. H-TCP is the loss-based fallback
/// built for long fat networks.
fn choose_congestion(available: &[String], loss: f64, rate_known: bool) -> String {
    let has = |name: &str| available.iter().any(|c| c == name);
    let order: &[&str] = if loss > 0.0 || !rate_known {
        &["bbr", "htcp", "cubic"]
    } else {
        &["cubic", "bbr", "htcp"]
    };
    order
        .iter()
        .find(|c| has(c))
        .map(|c| c.to_string())
        .or_else(|| available.first().cloned())
        .unwrap_or_else(|| "cubic".to_string())
}

fn push_loss(s: &mut String, loss: f64) {
    if loss > 0.0 {
        s.push_str(&format!(", loss {}", format_loss(loss)));
    }
}

fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to).saturating_mul(to)
}

/// The chunk size an auto-tuned copy uses when none is given: about
/// [`AUTO_CHUNK_SECS`] of one stream's share of the path's rate, rounded
/// down to a power of two within [`AUTO_CHUNK_RANGE`]; the range's top
/// when the rate is unknown.
///
/// Why: at the end of a copy the streams run out of chunks one by one, and
/// the last chunk a stream takes keeps it busy for the chunk's size at the
/// stream's share while the others idle (measured at 1 Gbit/s x 228 ms with
/// 32 streams, 2 MiB chunks: the streams went idle over 0.5-0.9 s). Small
/// chunks shorten that tail; on fast paths they cost per-chunk work (512 KiB
/// was 8 % slower to disk between namespaces than 2 MiB), so the size
/// follows the share.
pub fn auto_chunk_size(rate: Option<u64>, streams: u32) -> u32 {
    let (lo, hi) = AUTO_CHUNK_RANGE;
    let Some(rate) = rate.filter(|&r| r > 0) else {
        return hi;
    };
    let share = rate as f64 / 8.0 / f64::from(streams.max(1)) * AUTO_CHUNK_SECS;
    let mut cs = hi;
    while cs > lo && f64::from(cs) > share {
        cs /= 2;
    }
    cs
}

/// Seconds of a stream's share [`auto_chunk_size`] sizes a chunk to.
pub const AUTO_CHUNK_SECS: f64 = 0.15;

/// The smallest and largest chunk [`auto_chunk_size`] picks: 2 MiB was the
/// fixed default before, and below 512 KiB the per-chunk work grows with
/// no tail left to gain on the paths measured.
pub const AUTO_CHUNK_RANGE: (u32, u32) = (512 << 10, 2 << 20);

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn host(core_max: u64, tcp_max: u64, cc: &[&str], privileged: bool) -> HostLimits {
        HostLimits {
            rmem_max: core_max,
            wmem_max: core_max,
            tcp_rmem: [4096, 131072, tcp_max],
            tcp_wmem: [4096, 16384, tcp_max],
            congestion: cc.iter().map(|s| s.to_string()).collect(),
            privileged,
        }
    }

    fn path(rtt_ms: u64, rate: Option<u64>, loss: f64) -> PathFacts {
        PathFacts {
            rtt_secs: rtt_ms as f64 / 1e3,
            bottleneck_rate: rate,
            loss_rate: loss,
            mtu: 1500,
            loss_packets: 0,
        }
    }

    const G: u64 = 1_000_000_000;

    #[test]
    fn table_of_paths_and_hosts() {
        // (rtt ms, rate, loss, host core max, host tcp max, cc, privileged,
        //  streams, per-stream buffer, congestion, set, forced, paced)
        #[allow(clippy::type_complexity)]
        let cases: [(
            u64,
            Option<u64>,
            f64,
            u64,
            u64,
            &[&str],
            bool,
            u32,
            u64,
            &str,
            bool,
            bool,
            bool,
        ); 9] = [
            // Clean 1G × 93 ms, host capped at 4 MiB: 17.4 MB window over 4 MiB = 5 streams,
            // fixed buffers (autotuning would reach only 2 MiB of window).
            (
                93,
                Some(G),
                0.0,
                4 * MIB,
                4 * MIB,
                &["cubic", "bbr"],
                false,
                5,
                3456 << 10,
                "cubic",
                true,
                false,
                true,
            ),
            // Same path, well-tuned host: autotuning reaches 128 MiB, one stream, no setsockopt.
            (
                93,
                Some(G),
                0.0,
                256 * MIB,
                256 * MIB,
                &["cubic", "bbr"],
                false,
                1,
                17088 << 10,
                "cubic",
                false,
                false,
                true,
            ),
            // rmem_max 64 MiB but autotuning only to 8 MiB: one stream with a fixed buffer.
            (
                93,
                Some(G),
                0.0,
                64 * MIB,
                8 * MIB,
                &["cubic", "bbr"],
                false,
                1,
                17088 << 10,
                "cubic",
                true,
                false,
                true,
            ),
            // 0.1 % loss with BBR: BBR, floor of 4 streams, no pacing; 3 BDP of window.
            (
                228,
                Some(G),
                1e-3,
                256 * MIB,
                256 * MIB,
                &["cubic", "bbr"],
                false,
                4,
                20928 << 10,
                "bbr",
                false,
                false,
                false,
            ),
            // 0.1 % loss without BBR: Mathis gives ~2 Mbit/s per CUBIC stream; capped at 64.
            (
                228,
                Some(G),
                1e-3,
                256 * MIB,
                256 * MIB,
                &["reno", "cubic"],
                false,
                64,
                1344 << 10,
                "cubic",
                false,
                false,
                true,
            ),
            // 0.01 % loss at 93 ms: ~15 Mbit/s per stream wants 66 streams; capped at 64.
            (
                93,
                Some(G),
                1e-4,
                256 * MIB,
                256 * MIB,
                &["cubic"],
                false,
                64,
                320 << 10,
                "cubic",
                false,
                false,
                true,
            ),
            // 100G × 230 ms on a 4 MiB host, privileged: 64 streams cannot cover
            // 4.3 GB, so buffers are forced (512 MiB at most → 9 streams).
            (
                230,
                Some(100 * G),
                0.0,
                4 * MIB,
                4 * MIB,
                &["cubic", "bbr"],
                true,
                9,
                479_199_232,
                "cubic",
                true,
                true,
                true,
            ),
            // Same, unprivileged: capped at 64 streams of 4 MiB, window short.
            (
                230,
                Some(100 * G),
                0.0,
                4 * MIB,
                4 * MIB,
                &["cubic", "bbr"],
                false,
                64,
                4 * MIB,
                "cubic",
                true,
                false,
                true,
            ),
            // Rate unknown: 4 streams at the host's largest window (autotuning), BBR.
            (
                93,
                None,
                0.0,
                4 * MIB,
                32 * MIB,
                &["cubic", "bbr"],
                false,
                4,
                16 * MIB,
                "bbr",
                false,
                false,
                false,
            ),
        ];
        for (
            i,
            (
                rtt,
                rate,
                loss,
                core,
                tcp,
                cc,
                privileged,
                streams,
                buf,
                congestion,
                set,
                forced,
                paced,
            ),
        ) in cases.into_iter().enumerate()
        {
            let h = host(core, tcp, cc, privileged);
            let p = plan(&path(rtt, rate, loss), &h, &h, &Policy::default());
            let ctx = format!("case {i}: {p:?}");
            assert_eq!(p.streams, streams, "{ctx}");
            assert_eq!(p.per_stream_buffer, buf, "{ctx}");
            assert_eq!(p.congestion, congestion, "{ctx}");
            assert_eq!(p.set_buffers, set, "{ctx}");
            assert_eq!(p.forced_buffers, forced, "{ctx}");
            assert_eq!(p.pacing_rate.is_some(), paced, "{ctx}");
            if let (Some(rate), Some(pace)) = (rate, p.pacing_rate) {
                assert_eq!(pace, rate / u64::from(streams), "{ctx}");
            }
        }
    }

    #[test]
    fn windows_cover_the_bdp_with_headroom_unless_capped() {
        for rtt in [1, 20, 93, 228] {
            for rate in [100_000_000, G, 10 * G] {
                for core in [212_992, 4 * MIB, 64 * MIB, 1 << 30] {
                    let h = host(core, core, &["cubic", "bbr"], false);
                    let p = plan(&path(rtt, Some(rate), 0.0), &h, &h, &Policy::default());
                    let bdp = p.bdp.unwrap_or(0);
                    let total = p.per_stream_buffer * u64::from(p.streams);
                    if p.streams < 64 {
                        assert!(
                            total as f64 >= bdp as f64 * 1.5,
                            "{rtt} {rate} {core}: {p:?}"
                        );
                    }
                    // Never over-parallelise a clean path: one stream fewer
                    // would no longer cover the window.
                    if p.streams > 1 {
                        let fewer = p.per_stream_buffer.max(core) * u64::from(p.streams - 1);
                        assert!(
                            (fewer as f64) < bdp as f64 * 1.5,
                            "{rtt} {rate} {core}: {p:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_copy_plans_the_streams_that_fill_a_long_path_in_five_round_trips() {
        let copy = Policy {
            ramp_rtts: Some(RAMP_RTTS),
            ..Policy::default()
        };
        let capped = host(4 * MIB, 4 * MIB, &["cubic", "bbr"], false);
        let tuned = host(256 * MIB, 256 * MIB, &["cubic", "bbr"], false);
        // (rtt ms, rate, host, streams for test, streams for copy)
        let cases: [(u64, u64, &HostLimits, u32, u32); 6] = [
            // 1 Gbit/s × 93 ms: 11.6 MB over 10 segments × 32 = 26 streams.
            (93, G, &capped, 5, 26),
            // A well-tuned host needs one window, but one stream takes 10
            // round trips to fill it.
            (93, G, &tuned, 1, 26),
            // 228 ms: 62 would ramp in 5; the ramp alone asks for 32 at most.
            (228, G, &capped, 11, 32),
            // Short paths ramp within 100 ms whatever the streams: unchanged.
            (1, 10 * G, &capped, 1, 1),
            (5, G, &tuned, 1, 1),
            // 10 Gbit/s × 93 ms on a capped host: the window already wants 42.
            (93, 10 * G, &capped, 42, 42),
        ];
        for (rtt, rate, h, for_test, for_copy) in cases {
            let p = path(rtt, Some(rate), 0.0);
            let t = plan(&p, h, h, &Policy::default());
            let c = plan(&p, h, h, &copy);
            assert_eq!(
                (t.streams, c.streams),
                (for_test, for_copy),
                "{rtt} ms: {}",
                c.reason
            );
            // The window is shared out, not grown: the copy's streams
            // together hold no more than the test's (64 KiB rounding each).
            let window = |p: &Plan| u64::from(p.streams) * p.per_stream_buffer;
            assert!(
                window(&c) <= window(&t) + u64::from(c.streams) * (64 << 10),
                "{rtt} ms: {} vs {}",
                c.reason,
                t.reason
            );
            assert_eq!(
                c.reason
                    .contains("so that slow start fills the BDP in 5 round trips"),
                for_copy > for_test,
                "{}",
                c.reason
            );
        }
        // The count itself: the BDP over 10 segments doubled 5 times.
        assert_eq!(
            ramp_streams(11_625_000, 1448, Duration::from_millis(93), 5, 5),
            26
        );
        assert_eq!(
            ramp_streams(11_625_000, 1448, Duration::from_millis(93), 5, 30),
            30
        );
        assert_eq!(
            ramp_streams(u64::MAX, 1448, Duration::from_secs(1), 5, 1),
            MAX_RAMP_STREAMS
        );
        assert_eq!(
            ramp_streams(u64::MAX, 0, Duration::MAX, u32::MAX, u64::MAX),
            u64::MAX
        );
    }

    #[test]
    fn loss_upper_bound_is_the_rule_of_three_then_the_poisson_bound() {
        // None lost in 5,000: 3/n.
        assert!((loss_upper_bound(0.0, 5000) - 6e-4).abs() < 1e-12);
        // Exact one-sided 95 % Poisson bounds: k = 1 → 4.744, 3 → 7.754,
        // 10 → 16.96, 50 → 63.29 expected losses.
        for (k, exact) in [(1u64, 4.744), (3, 7.754), (10, 16.96), (50, 63.29)] {
            let n = 10_000u64;
            let got = loss_upper_bound(k as f64 / n as f64, n) * n as f64;
            assert!(
                (got - exact).abs() / exact < 0.01,
                "k = {k}: {got} vs {exact}"
            );
        }
        // Unknown packet count: the loss as seen; never below it or above 1.
        assert_eq!(loss_upper_bound(1e-3, 0), 1e-3);
        assert_eq!(loss_upper_bound(1.0, 10), 1.0);
        assert!(loss_upper_bound(0.5, 2) <= 1.0);
        assert_eq!(loss_upper_bound(1.5, 10), 1.0);
        assert!(loss_upper_bound(f64::NAN, 10).is_nan());
    }

    #[test]
    fn bbr_windows_are_sized_for_the_loss_the_probe_cannot_rule_out() {
        // 1 Gbit/s × 228 ms, 3 losses in 5,600 probe packets (0.054 %;
        // as likely at a true 0.1 % as at 0.05 %), host cap 4 MiB.
        let mut seen = path(228, Some(1_000_000_000), 3.0 / 5600.0);
        let bbr = host(4 * MIB, 4 * MIB, &["bbr", "cubic"], false);
        let as_seen = plan(&seen, &bbr, &bbr, &Policy::default());
        seen.loss_packets = 5600;
        let bounded = plan(&seen, &bbr, &bbr, &Policy::default());
        // Up to 0.14 % cannot be ruled out: over 2 × the 1.5 BDP of a
        // clean path, where 0.054 % alone gave 2.6 ×.
        let window = |p: &Plan| (p.streams as u64 * p.per_stream_buffer) as f64;
        let bdp = bounded.bdp.unwrap() as f64;
        assert!(window(&as_seen) / bdp < 2.7, "{}", as_seen.reason);
        assert!(window(&bounded) / bdp > 3.0, "{}", bounded.reason);
        assert!(bounded.streams > as_seen.streams);
        assert!(
            bounded
                .reason
                .contains("sized for up to 0.14%: 5600 probe packets cannot rule it out"),
            "{}",
            bounded.reason
        );
        // A probe that lost nothing keeps the clean window.
        let mut clean = path(228, Some(1_000_000_000), 0.0);
        clean.loss_packets = 5600;
        assert_eq!(
            plan(&clean, &bbr, &bbr, &Policy::default()),
            plan(
                &path(228, Some(1_000_000_000), 0.0),
                &bbr,
                &bbr,
                &Policy::default()
            )
        );
        // Start-up holds the clean window, a smaller share of the larger one.
        let (f_seen, _) = start_hold(
            &path(228, Some(1_000_000_000), 3.0 / 5600.0),
            "bbr",
            &Policy::default(),
        )
        .unwrap();
        let (f_bound, _) = start_hold(&seen, "bbr", &Policy::default()).unwrap();
        assert!(f_bound < f_seen);
        // Loss-based control fills whatever window it gets: sized for the
        // loss seen, the bound changes nothing.
        let cubic = host(4 * MIB, 4 * MIB, &["cubic"], false);
        let mut c = plan(&seen, &cubic, &cubic, &Policy::default());
        seen.loss_packets = 0;
        let c0 = plan(&seen, &cubic, &cubic, &Policy::default());
        c.reason = c0.reason.clone();
        assert_eq!(c, c0);
        assert_eq!(
            start_hold(&seen, "cubic", &Policy::default()),
            start_hold(
                &path(228, Some(1_000_000_000), 3.0 / 5600.0),
                "cubic",
                &Policy::default()
            )
        );
    }

    #[test]
    fn start_hold_is_the_clean_window_for_eleven_round_trips_on_lossy_paths() {
        // (rtt ms, rate, loss, fraction of the planned window, hold ms)
        type Want = Option<(f64, u64)>;
        let cases: [(u64, Option<u64>, f64, Want); 7] = [
            (228, Some(1_000_000_000), 0.0, None),
            (228, Some(1_000_000_000), 1e-4, None),
            (228, Some(1_000_000_000), 1e-3, Some((0.5, 2508))),
            (93, Some(1_000_000_000), 1e-3, Some((0.5, 1023))),
            // From 1 %, the hold also has room for a round trip of holes.
            (93, Some(1_000_000_000), 1e-2, Some((0.375 * 1.3, 1023))),
            (228, Some(1_000_000_000), 3e-2, Some((0.375 * 1.3, 2508))),
            // The rate unknown: no BDP-sized plan to start below.
            (228, None, 1e-3, None),
        ];
        for (rtt, rate, loss, want) in cases {
            let got = start_hold(&path(rtt, rate, loss), "bbr", &Policy::default());
            match (got, want) {
                (None, None) => {}
                (Some((f, d)), Some((wf, wms))) => {
                    assert!((f - wf).abs() < 1e-9, "{rtt} ms {loss}: {f} vs {wf}");
                    assert_eq!(d.as_millis() as u64, wms, "{rtt} ms {loss}");
                }
                _ => panic!("{rtt} ms {rate:?} {loss}: {got:?} vs {want:?}"),
            }
        }
    }

    #[test]
    fn the_reason_says_the_start_up_window() {
        let bbr = host(4 * MIB, 4 * MIB, &["bbr", "cubic"], false);
        for (loss, says) in [(1e-3, "(1.5 × through"), (1e-2, "(1.95 × through")] {
            let p = plan(
                &path(228, Some(1_000_000_000), loss),
                &bbr,
                &bbr,
                &Policy::default(),
            );
            assert!(p.reason.contains(says), "{loss}: {}", p.reason);
        }
    }

    #[test]
    fn loss_raises_the_window_headroom() {
        // (loss, headroom for base 1.5)
        let cases = [
            (0.0, 1.5),
            (5e-5, 1.5),
            (1e-4, 1.5),
            (1e-3, 3.0),
            (1e-2, 4.0),
            (0.2, 4.0),
            (f64::NAN, 1.5),
        ];
        for (loss, want) in cases {
            let got = loss_headroom(1.5, loss);
            assert!((got - want).abs() < 1e-9, "loss {loss}: {got} != {want}");
        }
        // 1 Gbit/s × 228 ms, 4 MiB caps, bbr: 11 streams clean, 21 at 0.1 %, 28 at 1 %.
        let h = host(4 * MIB, 4 * MIB, &["cubic", "bbr"], false);
        let streams = |loss| plan(&path(228, Some(G), loss), &h, &h, &Policy::default()).streams;
        assert_eq!(streams(0.0), 11);
        assert_eq!(streams(1e-3), 21);
        assert_eq!(streams(1e-2), 28);
        let p = plan(&path(228, Some(G), 1e-3), &h, &h, &Policy::default());
        assert!(p.reason.contains("window 3.0 × BDP"), "{}", p.reason);
    }

    #[test]
    fn reason_reads_like_the_issue() {
        let h = host(4 * MIB, 4 * MIB, &["reno", "bbr"], false);
        let p = plan(&path(93, Some(G), 1e-4), &h, &h, &Policy::default());
        assert_eq!(
            p.reason,
            "auto: RTT 93.0 ms, ~1.00 Gbit/s, loss 0.01% → BDP 11.6 MB; \
             host caps buffers at 4 MiB → 5 streams × 3.4 MiB, bbr"
        );
        let p = plan(
            &path(93, Some(G), 1e-4),
            &h,
            &h,
            &Policy {
                max_streams: 3,
                ..Policy::default()
            },
        );
        assert!(p.reason.ends_with("; capped at 3 streams (more cost CPU and memory and crowd other traffic); window short of the BDP: raise the host caps (fatpipe tune --rate 1.00Gbit --rtt 93.0ms)"), "{}", p.reason);
    }

    #[test]
    fn pacing_gain_scales_the_per_stream_rate() {
        let h = host(4 * MIB, 4 * MIB, &["cubic"], false);
        let policy = Policy {
            pacing_gain: 1.1,
            ..Policy::default()
        };
        let p = plan(&path(93, Some(G), 0.0), &h, &h, &policy);
        assert_eq!(p.streams, 5);
        assert_eq!(p.pacing_rate, Some(220_000_000));
    }

    #[test]
    fn mathis_and_mss() {
        assert_eq!(mss_for(1500), 1448);
        assert_eq!(mss_for(9000), 8948);
        assert_eq!(mss_for(0), 1448);
        assert_eq!(mathis_rate(1448, Duration::from_millis(93), 0.0), None);
        let r = mathis_rate(1448, Duration::from_millis(93), 1e-4).unwrap_or(0.0);
        assert!((r - 15.2e6).abs() < 0.1e6, "{r}");
    }

    #[test]
    fn loss_formatting() {
        assert_eq!(format_loss(1e-4), "0.01%");
        assert_eq!(format_loss(1e-3), "0.1%");
        assert_eq!(format_loss(0.01), "1%");
        assert_eq!(format_loss(0.025), "2.5%");
        assert_eq!(format_loss(1.5e-5), "0.0015%");
    }

    #[test]
    fn odd_inputs_do_not_panic() {
        let h = host(0, 0, &[], false);
        for f in [
            path(0, Some(G), 0.0),
            path(0, Some(0), f64::NAN),
            PathFacts {
                rtt_secs: f64::INFINITY,
                bottleneck_rate: Some(u64::MAX),
                loss_rate: 2.0,
                mtu: 1,
                loss_packets: 0,
            },
        ] {
            let p = plan(&f, &h, &h, &Policy::default());
            assert!(p.streams >= 1 && p.streams <= 64, "{p:?}");
            assert_eq!(p.congestion, "cubic");
        }
    }

    fn estimate(rate: u64, low: u64, high: u64, label: &str, lower_bound: bool) -> RateConfidence {
        RateConfidence {
            rate,
            low,
            high,
            confidence: if label == "high" { 0.9 } else { 0.2 },
            label: label.into(),
            lower_bound,
        }
    }

    #[test]
    fn window_rate_reaches_the_largest_rate_the_probe_could_not_rule_out() {
        let g = 1_000_000_000u64;
        // Sure: the estimate itself (a 4 % faster train changes nothing).
        let sure = estimate(5 * g, 49 * g / 10, 52 * g / 10, "high", false);
        assert_eq!(window_rate(5 * g, Some(&sure)), 5 * g);
        assert_eq!(window_rate(5 * g, None), 5 * g);
        // Rough: the fastest kept train, at most twice the estimate.
        let rough = estimate(27 * g / 10, 12 * g / 10, 51 * g / 10, "low", false);
        assert_eq!(window_rate(27 * g / 10, Some(&rough)), 51 * g / 10);
        let wild = estimate(g, g / 2, 9 * g, "medium", false);
        assert_eq!(window_rate(g, Some(&wild)), 2 * g);
        // A lower bound: twice it, or the fastest train if that is more.
        let bound = estimate(12 * g / 10, g, 13 * g / 10, "medium", true);
        assert_eq!(window_rate(12 * g / 10, Some(&bound)), 24 * g / 10);
        let fast = estimate(12 * g / 10, g, 3 * g, "low", true);
        assert_eq!(window_rate(12 * g / 10, Some(&fast)), 3 * g);
    }

    #[test]
    fn an_unsure_estimate_does_not_cap_the_plan() {
        // The 5 Gbit/s × 93 ms lab link between 4 MiB hosts, probed on a
        // loaded machine as 2.7 Gbit/s with trains from 1.2 to 5.1.
        let h = host(4 * MIB, 4 * MIB, &["cubic", "bbr"], false);
        let facts = path(93, Some(2_700_000_000), 0.0);
        let sure = plan(
            &path(93, Some(5_100_000_000), 0.0),
            &h,
            &h,
            &Policy::default(),
        );
        let rough = estimate(2_700_000_000, 1_200_000_000, 5_100_000_000, "low", false);
        let p = plan_with(&facts, Some(&rough), &h, &h, &Policy::default());
        // Windows and streams as for the fastest train; BDP of the estimate.
        assert_eq!(
            (p.streams, p.per_stream_buffer, p.pacing_rate),
            (sure.streams, sure.per_stream_buffer, sure.pacing_rate),
            "{p:?}"
        );
        assert_eq!(
            p.bdp,
            Some(bdp_bytes(2_700_000_000, Duration::from_millis(93)))
        );
        assert_eq!(p.window_rate, Some(5_100_000_000));
        assert_eq!(p.estimate.as_ref(), Some(&rough));
        // Cubic's pacing allows the streams together the fastest train.
        let paced = p.pacing_rate.unwrap() * u64::from(p.streams);
        assert!(paced >= 5_000_000_000, "{p:?}");
        assert!(
            p.reason
                .contains("low confidence: trains 1.20 Gbit/s–5.10 Gbit/s"),
            "{}",
            p.reason
        );
        assert!(p.reason.contains("sized for 5.10 Gbit/s"), "{}", p.reason);
        // Without the doubt, the same facts plan for 2.7 Gbit/s only.
        let blind = plan(&facts, &h, &h, &Policy::default());
        assert!(blind.streams < p.streams, "{blind:?}");
        assert_eq!(blind.window_rate, None);
        // A sure estimate plans exactly as plan() does.
        let high = estimate(2_700_000_000, 2_650_000_000, 2_750_000_000, "high", false);
        let same = plan_with(&facts, Some(&high), &h, &h, &Policy::default());
        assert_eq!(
            (same.streams, same.per_stream_buffer),
            (blind.streams, blind.per_stream_buffer)
        );
        assert_eq!(same.window_rate, None);
        // A low-confidence estimate far below the path (every train of a
        // stalled host read 0.1 Gbit/s) still gets an unknown rate's windows.
        let stalled = estimate(100_000_000, 80_000_000, 200_000_000, "low", false);
        let p = plan_with(
            &path(228, Some(100_000_000), 0.001),
            Some(&stalled),
            &h,
            &h,
            &Policy::default(),
        );
        let unknown = plan(&path(228, None, 0.001), &h, &h, &Policy::default());
        assert!(
            u64::from(p.streams) * p.per_stream_buffer
                >= u64::from(unknown.streams) * unknown.per_stream_buffer,
            "{p:?} vs {unknown:?}"
        );
        // An estimate of another rate (a flag replaced it) is ignored.
        let other = plan_with(
            &path(93, Some(9_000_000_000), 0.0),
            Some(&rough),
            &h,
            &h,
            &Policy::default(),
        );
        assert_eq!((other.estimate, other.window_rate), (None, None));
    }

    #[test]
    fn auto_chunk_size_is_a_power_of_two_near_a_fraction_of_a_streams_share() {
        // 1 Gbit/s over 32 streams: ~29 Mbit/s each, 0.15 s of it ~0.55 MB.
        assert_eq!(auto_chunk_size(Some(941_000_000), 32), 512 << 10);
        // Over 16 streams, twice that.
        assert_eq!(auto_chunk_size(Some(941_000_000), 16), 1 << 20);
        // Fast paths, few streams, or no rate known: the old default.
        assert_eq!(auto_chunk_size(Some(5_000_000_000), 32), 2 << 20);
        assert_eq!(auto_chunk_size(Some(941_000_000), 4), 2 << 20);
        assert_eq!(auto_chunk_size(None, 32), 2 << 20);
        assert_eq!(auto_chunk_size(Some(0), 0), 2 << 20);
        // Slow paths never go below the floor.
        assert_eq!(auto_chunk_size(Some(10_000_000), 32), 512 << 10);
        assert_eq!(auto_chunk_size(Some(10_000_000), 0), 512 << 10);
    }
}
