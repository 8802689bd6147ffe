//! Plots of one run over time, drawn from its result document: a test's
//! throughput, per-stream spread, RTT, window and retransmits (UDP: loss
//! and jitter) per interval; a copy's bytes against the path's capacity
//! with its timeline's marks; several runs overlaid on one time axis; and
//! the CDF of their per-interval figures.
//!
//! One recipe per plot kind, as flent's `plotters.py` has one per kind:
//! [`test_data`] (the `timeseries` of tests), [`copy_data`] (a copy's
//! progress) and [`cdf_data`] turn documents into what the plot shows
//! (pure, tested without drawing), and [`crate::plot::Plot`] draws them
//! with the same conventions as every other plot: units on the axes, the
//! Okabe–Ito colours with a marker shape per run, the path and link in the
//! subtitle, DejaVu Sans compiled in.
//!
//! Why a band and not a line per stream: a run of hundreds of streams
//! drawn as lines is a solid smear that hides the one stream that starves.
//! Per-stream figures (throughput, RTT, window) are drawn as their median
//! with the interquartile range and the min–max range as two bands, and
//! the sum of the streams has a panel of its own, above them on the same
//! time axis: a stream that starves shows as the band's floor falling to
//! zero while the sum holds.

use fatpipe_schema::copy::CopyReport;
use fatpipe_schema::test::{Protocol, StreamStats, TestReport};
use fatpipe_schema::tune::Action;
use fatpipe_schema::units;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::plot::{
    clip, draw_err, draw_marker, num, rel, text, unit_for, y_range, Caption, PlotError, PALETTE,
};

/// What one panel of a time series shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantity {
    /// The receiver's throughput summed over the streams (both directions
    /// of a bidirectional test together), bit/s.
    Throughput,
    /// Each stream's receiver throughput, bit/s.
    StreamThroughput,
    /// Each stream's smoothed RTT (sender's `TCP_INFO`), seconds.
    Rtt,
    /// Each stream's congestion window (sender), bytes.
    Cwnd,
    /// Segments retransmitted in the interval, all streams.
    Retransmits,
    /// UDP datagrams lost in the interval, percent of those sent.
    Loss,
    /// UDP jitter (RFC 3550), mean over the streams, milliseconds.
    Jitter,
}

impl Quantity {
    /// The panel's title.
    pub fn label(self) -> &'static str {
        match self {
            Quantity::Throughput => "throughput, sum of streams",
            Quantity::StreamThroughput => "throughput per stream",
            Quantity::Rtt => "RTT per stream",
            Quantity::Cwnd => "congestion window per stream",
            Quantity::Retransmits => "retransmits per interval",
            Quantity::Loss => "loss per interval",
            Quantity::Jitter => "jitter",
        }
    }

    /// Divisor and unit for values up to `max`.
    pub fn unit(self, max: f64) -> (f64, &'static str) {
        match self {
            Quantity::Throughput | Quantity::StreamThroughput => {
                unit_for(crate::metric::Metric::Throughput, max)
            }
            // Loopback's tens of microseconds would all print as 0 ms.
            Quantity::Rtt if max < 1e-3 => (1e-6, "µs"),
            Quantity::Rtt => (1e-3, "ms"),
            Quantity::Cwnd => bytes_unit(max),
            Quantity::Retransmits => (1.0, "segments"),
            Quantity::Loss => (1.0, "%"),
            Quantity::Jitter if max < 1.0 => (1e-3, "µs"),
            Quantity::Jitter => (1.0, "ms"),
        }
    }
}

/// The per-stream spread at one interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// Smallest stream's value.
    pub min: f64,
    /// 25th percentile.
    pub q1: f64,
    /// 75th percentile.
    pub q3: f64,
    /// Largest stream's value.
    pub max: f64,
}

/// One interval of a series.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimePoint {
    /// Middle of the interval, seconds since the run started.
    pub t: f64,
    /// The value (a sum, or the streams' median), base unit.
    pub y: f64,
    /// The streams' spread, for per-stream quantities of runs with more
    /// than one stream.
    pub spread: Option<Spread>,
}

/// One run's line in one panel.
#[derive(Debug, Clone, PartialEq)]
pub struct TimeSeries {
    /// Which run (its colour and marker shape).
    pub run: usize,
    /// Points in time order.
    pub points: Vec<TimePoint>,
}

/// One panel: a quantity, every run's series on the shared time axis.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// What it shows.
    pub quantity: Quantity,
    /// One per run that has the quantity.
    pub series: Vec<TimeSeries>,
}

/// A moment marked on the time axis: an adjuster's change, the ramp's end,
/// a copy's timeline step.
#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    /// Which run.
    pub run: usize,
    /// Seconds since the run started.
    pub t: f64,
    /// A few words at the line (`+4 streams`, `→ bbr`, `ramp 90 %`).
    pub label: String,
    /// Why, in one line (the adjuster's reason); empty when the label says
    /// it all.
    pub reason: String,
}

/// Test runs over time: the `timeseries` plot.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeseries {
    /// Title block.
    pub caption: Caption,
    /// Legend text per run, in colour order.
    pub runs: Vec<String>,
    /// Panels, top to bottom.
    pub panels: Vec<Panel>,
    /// Adjuster changes and ramps.
    pub marks: Vec<Mark>,
    /// Warm-up (omitted) intervals, `[from, to)` seconds, shaded.
    pub warmup: Vec<(f64, f64)>,
    /// The time axis' end, seconds.
    pub span: f64,
}

/// One copy's progress.
#[derive(Debug, Clone, PartialEq)]
pub struct CopyRun {
    /// Legend text.
    pub label: String,
    /// (seconds since the command started, bytes moved so far).
    pub samples: Vec<(f64, f64)>,
    /// False when the document holds no samples and the line only joins
    /// the first and the last byte.
    pub sampled: bool,
    /// What the path could carry from the first byte on: (first byte's
    /// time, bit/s).
    pub capacity: Option<(f64, f64)>,
    /// The timeline's steps.
    pub marks: Vec<Mark>,
    /// Times the client reconnected (the document counts them; it does
    /// not say when).
    pub reconnects: u32,
}

/// Copies over time: bytes moved against the path's capacity line.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// Title block.
    pub caption: Caption,
    /// One per copy, in colour order.
    pub runs: Vec<CopyRun>,
    /// The first copy's colour and marker (0: the palette's first); a page
    /// that shows tests beside copies starts the copies after the tests,
    /// so no copy looks like a test.
    pub first_colour: usize,
}

/// The distribution of per-interval figures, one line per run.
#[derive(Debug, Clone, PartialEq)]
pub struct Cdf {
    /// Title block.
    pub caption: Caption,
    /// Legend text per run.
    pub runs: Vec<String>,
    /// Per panel (throughput of each interval; RTT of each stream in each
    /// interval): per run, its values sorted.
    pub panels: Vec<(Quantity, Vec<CdfLine>)>,
}

/// One run's values in a CDF panel: (run, its values sorted; at most 501
/// quantiles of them when there are more).
pub type CdfLine = (usize, Vec<f64>);

/// The most per-run points a CDF line keeps (its quantiles).
const CDF_POINTS: usize = 500;

/// The test runs in `runs` (legend text, document) over time, overlaid on
/// one time axis: the sum's throughput, the per-stream spread of
/// throughput, RTT and window, retransmits (UDP: loss and jitter), the
/// adjuster's changes and the ramp marked, warm-up shaded.
pub fn test_data(
    runs: &[(String, &TestReport)],
    caption: Caption,
) -> Result<Timeseries, PlotError> {
    if runs.iter().all(|(_, r)| r.intervals.is_empty()) {
        return Err(PlotError::Empty(
            "plot: the run has no intervals to draw over time".into(),
        ));
    }
    let multi = runs
        .iter()
        .any(|(_, r)| r.intervals.iter().any(|iv| iv.streams.len() > 1));
    let any = |f: &dyn Fn(&StreamStats) -> bool| {
        runs.iter()
            .any(|(_, r)| r.intervals.iter().flat_map(|iv| &iv.streams).any(f))
    };
    let udp = runs.iter().any(|(_, r)| r.start.protocol == Protocol::Udp);
    let mut kinds = vec![Quantity::Throughput];
    if multi {
        kinds.push(Quantity::StreamThroughput);
    }
    if any(&|s| s.rtt_us.is_some()) {
        kinds.push(Quantity::Rtt);
    }
    if any(&|s| s.cwnd.is_some()) {
        kinds.push(Quantity::Cwnd);
    }
    if any(&|s| s.retransmits.is_some()) {
        kinds.push(Quantity::Retransmits);
    }
    if udp && any(&|s| s.lost.is_some() || s.lost_percent.is_some()) {
        kinds.push(Quantity::Loss);
    }
    if udp && any(&|s| s.jitter_ms.is_some()) {
        kinds.push(Quantity::Jitter);
    }
    let panels = kinds
        .iter()
        .map(|&q| Panel {
            quantity: q,
            series: runs
                .iter()
                .enumerate()
                .map(|(i, (_, r))| TimeSeries {
                    run: i,
                    points: r
                        .intervals
                        .iter()
                        .filter_map(|iv| {
                            let t = (iv.start_s + iv.end_s) / 2.0;
                            let (y, spread) = value(q, &iv.streams, &iv.sums)?;
                            Some(TimePoint { t, y, spread })
                        })
                        .collect(),
                })
                .filter(|s| !s.points.is_empty())
                .collect(),
        })
        .collect();
    let mut marks = Vec::new();
    let mut warmup: Vec<(f64, f64)> = Vec::new();
    let mut span: f64 = 0.0;
    for (i, (_, r)) in runs.iter().enumerate() {
        span = span.max(r.intervals.last().map_or(0.0, |iv| iv.end_s));
        for iv in r.intervals.iter().filter(|iv| iv.omitted) {
            if warmup.iter().any(|w| w.0 <= iv.start_s && iv.end_s <= w.1) {
                continue;
            }
            match warmup.iter_mut().find(|w| (w.1 - iv.start_s).abs() < 1e-6) {
                Some(w) => w.1 = iv.end_s,
                None => warmup.push((iv.start_s, iv.end_s)),
            }
        }
        if let Some(a) = &r.start.auto {
            for d in a.decisions.iter().filter(|d| d.is_change()) {
                let label = match &d.action {
                    Action::AddStreams { n } => format!("+{n} streams"),
                    Action::SwitchCongestion { to } => format!("→ {to}"),
                    Action::Hold => continue,
                };
                marks.push(Mark {
                    run: i,
                    t: d.at_secs,
                    label,
                    reason: d.reason.clone(),
                });
            }
        }
        if let Some(secs) = r
            .end
            .ramp
            .and_then(|rp| rp.secs.map(|s| (s, rp.final_rate)))
        {
            marks.push(Mark {
                run: i,
                t: secs.0,
                label: "90 %".into(),
                reason: format!(
                    "ramp: 90 % of {} after {:.1} s",
                    units::format_rate(secs.1 as f64),
                    secs.0
                ),
            });
        }
    }
    marks.sort_by(|a, b| a.t.total_cmp(&b.t));
    Ok(Timeseries {
        caption,
        runs: runs.iter().map(|(l, _)| l.clone()).collect(),
        panels,
        marks,
        warmup,
        span: span.max(1.0),
    })
}

/// The copies in `runs` (legend text, document) over time: bytes moved,
/// the path's capacity from the first byte (`capacity` in bit/s when the
/// caller knows the link, else the probe's bottleneck estimate), and the
/// timeline's steps.
pub fn copy_data(
    runs: &[(String, &CopyReport)],
    capacity: Option<f64>,
    caption: Caption,
) -> Result<Progress, PlotError> {
    let mut out = Vec::new();
    for (label, r) in runs {
        let Some(tl) = &r.timeline else {
            return Err(PlotError::Empty(format!(
                "plot: the copy to {} has no timeline (its document is from before fatpipe recorded one)",
                r.server
            )));
        };
        let first = tl.first_byte_sent_at.or(tl.first_byte_on_disk_at);
        let sampled = !tl.progress.is_empty();
        let samples: Vec<(f64, f64)> = if sampled {
            tl.progress.iter().map(|&(t, b)| (t, b as f64)).collect()
        } else {
            match (first, tl.last_byte_at) {
                (Some(a), Some(b)) => vec![(a, 0.0), (b, r.bytes_transferred as f64)],
                _ => Vec::new(),
            }
        };
        let cap = capacity.or_else(|| {
            r.auto
                .as_ref()
                .and_then(|a| a.facts.bottleneck_rate)
                .map(|b| b as f64)
        });
        let mut marks = Vec::new();
        let mut mark = |t: Option<f64>, label: &str| {
            if let Some(t) = t {
                marks.push(Mark {
                    run: out.len(),
                    t,
                    label: label.into(),
                    reason: String::new(),
                });
            }
        };
        mark(tl.probe_secs.filter(|s| *s > 0.0), "probe");
        mark(tl.connected_at, "connect");
        mark(tl.request_at, "request");
        mark(first, "first byte");
        mark(
            first.zip(tl.ramp_secs).map(|(f, r)| f + r),
            "90 % of final rate",
        );
        for &a in &tl.adjust_at {
            mark(Some(a), "adjust");
        }
        mark(tl.first_stream_idle_at, "first idle stream");
        mark(tl.last_byte_at, "last byte");
        mark(tl.done_at, "done");
        marks.sort_by(|a, b| a.t.total_cmp(&b.t));
        out.push(CopyRun {
            label: label.clone(),
            samples,
            sampled,
            capacity: first.zip(cap.filter(|c| *c > 0.0)),
            marks,
            reconnects: r.reconnects,
        });
    }
    if out.iter().all(|c| c.samples.is_empty()) {
        return Err(PlotError::Empty(
            "plot: no copy moved any data to draw over time".into(),
        ));
    }
    Ok(Progress {
        caption,
        runs: out,
        first_colour: 0,
    })
}

/// The distribution of the runs' per-interval throughput (the sum) and
/// per-stream RTT, warm-up left out, one line per run.
pub fn cdf_data(runs: &[(String, &TestReport)], caption: Caption) -> Result<Cdf, PlotError> {
    let mut panels = Vec::new();
    for q in [Quantity::Throughput, Quantity::Rtt] {
        let mut lines = Vec::new();
        for (i, (_, r)) in runs.iter().enumerate() {
            let mut v: Vec<f64> = r
                .intervals
                .iter()
                .filter(|iv| !iv.omitted)
                .flat_map(|iv| match q {
                    Quantity::Rtt => iv
                        .streams
                        .iter()
                        .filter_map(|s| s.rtt_us.map(|u| f64::from(u) / 1e6))
                        .collect::<Vec<_>>(),
                    _ => value(q, &iv.streams, &iv.sums)
                        .map(|(y, _)| y)
                        .into_iter()
                        .collect(),
                })
                .filter(|v| v.is_finite())
                .collect();
            if v.is_empty() {
                continue;
            }
            v.sort_by(f64::total_cmp);
            if v.len() > CDF_POINTS + 1 {
                v = (0..=CDF_POINTS)
                    .map(|k| quantile(&v, k as f64 / CDF_POINTS as f64))
                    .collect();
            }
            lines.push((i, v));
        }
        if !lines.is_empty() {
            panels.push((q, lines));
        }
    }
    if panels.is_empty() {
        return Err(PlotError::Empty(
            "plot: the runs have no measured intervals for a CDF".into(),
        ));
    }
    Ok(Cdf {
        caption,
        runs: runs.iter().map(|(l, _)| l.clone()).collect(),
        panels,
    })
}

impl Timeseries {
    /// Pixel height that fits its panels and notes at [`crate::plot::WIDTH`].
    pub fn height(&self) -> u32 {
        LEGEND_H + 70 + 48 + PANEL_H * self.panels.len() as u32 + NOTE_H * self.notes_len() as u32
    }

    fn notes_len(&self) -> usize {
        self.marks
            .iter()
            .filter(|m| !m.reason.is_empty())
            .count()
            .min(MAX_NOTES)
    }
}

// --- data helpers -------------------------------------------------------------

/// A quantity's value at one interval: the sum, or the streams' median
/// and spread; `None` when no stream has it.
fn value(
    q: Quantity,
    streams: &[StreamStats],
    sums: &[StreamStats],
) -> Option<(f64, Option<Spread>)> {
    let totals = if sums.is_empty() { streams } else { sums };
    match q {
        Quantity::Throughput => {
            (!totals.is_empty()).then(|| (totals.iter().map(|s| s.bits_per_second).sum(), None))
        }
        Quantity::StreamThroughput => spread(streams.iter().map(|s| Some(s.bits_per_second))),
        Quantity::Rtt => spread(streams.iter().map(|s| s.rtt_us.map(|u| f64::from(u) / 1e6))),
        Quantity::Cwnd => spread(streams.iter().map(|s| s.cwnd.map(|c| c as f64))),
        Quantity::Retransmits => {
            let v: Vec<u64> = streams.iter().filter_map(|s| s.retransmits).collect();
            (!v.is_empty()).then(|| (v.iter().sum::<u64>() as f64, None))
        }
        Quantity::Loss => {
            let sent: u64 = totals.iter().filter_map(|s| s.packets_sent).sum();
            let lost: u64 = totals.iter().filter_map(|s| s.lost).sum();
            if sent > 0 {
                Some((lost as f64 / sent as f64 * 100.0, None))
            } else {
                let p: Vec<f64> = totals.iter().filter_map(|s| s.lost_percent).collect();
                (!p.is_empty()).then(|| (p.iter().sum::<f64>() / p.len() as f64, None))
            }
        }
        Quantity::Jitter => {
            let j: Vec<f64> = totals.iter().filter_map(|s| s.jitter_ms).collect();
            (!j.is_empty()).then(|| (j.iter().sum::<f64>() / j.len() as f64, None))
        }
    }
}

/// The median of the streams' values and, for more than one, their spread.
fn spread(vals: impl Iterator<Item = Option<f64>>) -> Option<(f64, Option<Spread>)> {
    let mut v: Vec<f64> = vals.flatten().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let med = quantile(&v, 0.5);
    let s = (v.len() > 1).then(|| Spread {
        min: v[0],
        q1: quantile(&v, 0.25),
        q3: quantile(&v, 0.75),
        max: v[v.len() - 1],
    });
    Some((med, s))
}

/// The `p` quantile of sorted `v`, interpolating between closest ranks (as
/// the archive's statistics do).
fn quantile(v: &[f64], p: f64) -> f64 {
    let pos = p * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

/// A tick label on an axis spanning `span` (in its unit): as many
/// decimals as the ticks need to differ (`0.25`, `0.5`), no more.
fn tick(v: f64, span: f64) -> String {
    if span <= 0.0 || !span.is_finite() || span >= 5.0 {
        return num(v);
    }
    // One more than the tick step needs, for steps of 2.5; trailing zeros go.
    let decimals = ((-(span / 5.0).log10()).ceil() + 1.0).clamp(0.0, 6.0) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Divisor and SI unit for a byte count up to `max` (as `format_bytes`).
fn bytes_unit(max: f64) -> (f64, &'static str) {
    if max >= 1e9 {
        (1e9, "GB")
    } else if max >= 1e6 {
        (1e6, "MB")
    } else if max >= 1e3 {
        (1e3, "kB")
    } else {
        (1.0, "bytes")
    }
}

// --- drawing -------------------------------------------------------------------

const LEGEND_H: u32 = 56;
const PANEL_H: u32 = 170;
const NOTE_H: u32 = 18;
const MAX_NOTES: usize = 8;
const GRID: RGBColor = RGBColor(0xDD, 0xDD, 0xDD);
const SHADE: RGBColor = RGBColor(0x70, 0x70, 0x70);
const INK: RGBColor = RGBColor(0x40, 0x40, 0x40);

fn colour(run: usize) -> RGBColor {
    // Yellow is hard to see on white; a run that would get it takes black.
    match run % 7 {
        6 => PALETTE[7],
        i => PALETTE[i],
    }
}

/// The mark lines' colour: black for one run, else the run's.
fn mark_colour(runs: usize, run: usize) -> RGBColor {
    if runs > 1 {
        colour(run)
    } else {
        BLACK
    }
}

/// One legend row entry after another from `x`, wrapping to a second row;
/// returns where the next would go.
struct LegendRow {
    x: i32,
    y: i32,
    width: i32,
}

impl LegendRow {
    fn room(&mut self, w: i32) {
        if self.x + w > self.width - 16 && self.y < 30 {
            self.x = 16;
            self.y += 24;
        }
    }

    fn run<DB: DrawingBackend>(
        &mut self,
        area: &DrawingArea<DB, Shift>,
        run: usize,
        label: &str,
    ) -> Result<(), PlotError> {
        let label = clip(label, 48);
        let w = 44 + 8 * label.chars().count() as i32 + 20;
        self.room(w);
        let c = colour(run);
        area.draw(&PathElement::new(
            vec![(self.x, self.y), (self.x + 28, self.y)],
            c.stroke_width(3),
        ))
        .map_err(draw_err)?;
        draw_marker(area, run, (self.x + 14, self.y), c)?;
        area.draw_text(
            &label,
            &text(15).pos(Pos::new(HPos::Left, VPos::Center)),
            (self.x + 36, self.y),
        )
        .map_err(draw_err)?;
        self.x += w;
        Ok(())
    }

    fn swatch<DB: DrawingBackend>(
        &mut self,
        area: &DrawingArea<DB, Shift>,
        style: ShapeStyle,
        dashed: bool,
        label: &str,
    ) -> Result<(), PlotError> {
        let w = 30 + 7 * label.chars().count() as i32 + 18;
        self.room(w);
        if dashed {
            for k in 0..3 {
                area.draw(&PathElement::new(
                    vec![
                        (self.x + 9, self.y - 9 + 7 * k),
                        (self.x + 9, self.y - 5 + 7 * k),
                    ],
                    style,
                ))
                .map_err(draw_err)?;
            }
        } else {
            area.draw(&Rectangle::new(
                [(self.x, self.y - 7), (self.x + 20, self.y + 7)],
                style,
            ))
            .map_err(draw_err)?;
        }
        area.draw_text(
            label,
            &text(13).color(&INK).pos(Pos::new(HPos::Left, VPos::Center)),
            (self.x + 26, self.y),
        )
        .map_err(draw_err)?;
        self.x += w;
        Ok(())
    }
}

/// Draws a [`Timeseries`] below its caption.
pub(crate) fn draw_timeseries<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    ts: &Timeseries,
) -> Result<(), PlotError> {
    let (w, h) = area.dim_in_pixel();
    let (legend, rest) = area.split_vertically(LEGEND_H);
    let notes_h = NOTE_H * ts.notes_len() as u32;
    let (body, notes) = rest.split_vertically(h.saturating_sub(LEGEND_H + notes_h + 4));
    // Legend: each run, then what the bands, shading and dashes mean.
    let mut row = LegendRow {
        x: 16,
        y: 14,
        width: w as i32,
    };
    for (i, label) in ts.runs.iter().enumerate() {
        row.run(&legend, i, label)?;
    }
    let banded = ts
        .panels
        .iter()
        .flat_map(|p| &p.series)
        .flat_map(|s| &s.points)
        .any(|p| p.spread.is_some());
    if banded {
        row.swatch(
            &legend,
            SHADE.mix(0.4).filled(),
            false,
            "middle half of the streams",
        )?;
        row.swatch(
            &legend,
            SHADE.mix(0.15).filled(),
            false,
            "min–max of the streams",
        )?;
    }
    if !ts.warmup.is_empty() {
        row.swatch(
            &legend,
            RGBColor(0xE8, 0xE8, 0xE8).filled(),
            false,
            "warm-up (omitted)",
        )?;
    }
    if !ts.marks.is_empty() {
        row.swatch(
            &legend,
            BLACK.stroke_width(2),
            true,
            "adjuster changes, ramp to 90 %",
        )?;
    }
    // Panels share the time axis; the last one carries its labels.
    let n = ts.panels.len().max(1) as u32;
    let (_, bh) = body.dim_in_pixel();
    let last_extra = 48;
    let each = bh.saturating_sub(last_extra) / n;
    let mut rest = body.clone();
    let mut numbered = 0usize;
    for (k, p) in ts.panels.iter().enumerate() {
        let last = k + 1 == ts.panels.len();
        let (panel, below) = if last {
            (rest.clone(), rest.clone())
        } else {
            rest.split_vertically(each)
        };
        rest = below;
        let ys = p.series.iter().flat_map(|s| &s.points);
        let ymax = ys
            .clone()
            .map(|q| q.spread.map_or(q.y, |s| s.max.max(q.y)))
            .fold(0.0, f64::max);
        let (div, unit) = p.quantity.unit(ymax);
        let (y0, y1) = y_range(0.0, ymax / div);
        let mut chart = ChartBuilder::on(&panel)
            .margin_left(16)
            .margin_right(28)
            .margin_top(22)
            .margin_bottom(4)
            .x_label_area_size(if last { 50 } else { 24 })
            .y_label_area_size(112)
            .build_cartesian_2d(0.0..ts.span, y0..y1)
            .map_err(draw_err)?;
        let yfmt = |v: &f64| tick(*v, y1 - y0);
        let xfmt = |v: &f64| tick(*v, ts.span);
        chart
            .configure_mesh()
            .x_desc(if last {
                "time since the run started (s)"
            } else {
                " "
            })
            .y_desc(unit)
            .axis_desc_style(text(16))
            .label_style(text(14))
            .x_labels(12)
            .y_labels(5)
            .x_label_formatter(&xfmt)
            .y_label_formatter(&yfmt)
            .light_line_style(RGBColor(0xF4, 0xF4, 0xF4))
            .bold_line_style(GRID)
            .draw()
            .map_err(draw_err)?;
        let pa = chart.plotting_area().strip_coord_spec();
        let top_left = rel(&panel, chart.backend_coord(&(0.0, y1)));
        panel
            .draw_text(
                p.quantity.label(),
                &text(15).pos(Pos::new(HPos::Left, VPos::Bottom)),
                (top_left.0, top_left.1 - 4),
            )
            .map_err(draw_err)?;
        for &(a, b) in &ts.warmup {
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(a, y0), (b.min(ts.span), y1)],
                    RGBColor(0xE8, 0xE8, 0xE8).filled(),
                )))
                .map_err(draw_err)?;
        }
        for s in &p.series {
            let c = colour(s.run);
            let band = |f: &dyn Fn(&Spread) -> (f64, f64)| -> Vec<(f64, f64)> {
                let pts: Vec<(f64, (f64, f64))> = s
                    .points
                    .iter()
                    .filter_map(|q| q.spread.as_ref().map(|sp| (q.t, f(sp))))
                    .collect();
                let mut poly: Vec<(f64, f64)> =
                    pts.iter().map(|(t, (_, hi))| (*t, hi / div)).collect();
                poly.extend(pts.iter().rev().map(|(t, (lo, _))| (*t, lo / div)));
                poly
            };
            let outer = band(&|sp| (sp.min, sp.max));
            if outer.len() > 2 {
                chart
                    .draw_series(std::iter::once(Polygon::new(outer, c.mix(0.15).filled())))
                    .map_err(draw_err)?;
                let inner = band(&|sp| (sp.q1, sp.q3));
                chart
                    .draw_series(std::iter::once(Polygon::new(inner, c.mix(0.4).filled())))
                    .map_err(draw_err)?;
            }
            let width = if p.quantity == Quantity::Throughput {
                3
            } else {
                2
            };
            chart
                .draw_series(LineSeries::new(
                    s.points.iter().map(|q| (q.t, q.y / div)),
                    c.stroke_width(width),
                ))
                .map_err(draw_err)?;
            // A marker every tenth or so of the line: the run's shape, for
            // greyscale, without hiding the line under 300 of them.
            let every = s.points.len().div_ceil(10).max(1);
            for (j, q) in s.points.iter().enumerate() {
                if j % every == every / 2 {
                    let at = rel(&pa, chart.backend_coord(&(q.t, q.y / div)));
                    draw_marker(&pa, s.run, at, c)?;
                }
            }
        }
        for m in &ts.marks {
            chart
                .draw_series(DashedLineSeries::new(
                    [(m.t, y0), (m.t, y1)],
                    6,
                    4,
                    mark_colour(ts.runs.len(), m.run).stroke_width(2),
                ))
                .map_err(draw_err)?;
        }
        if k == 0 {
            // The marks' labels at the top of the first panel, staggered so
            // neighbours do not overwrite each other; numbered when their
            // reasons are listed under the plot.
            let (pw, _) = pa.dim_in_pixel();
            for (j, m) in ts.marks.iter().enumerate() {
                let at = rel(&pa, chart.backend_coord(&(m.t, y1)));
                let label = if m.reason.is_empty() || numbered >= MAX_NOTES {
                    m.label.clone()
                } else {
                    numbered += 1;
                    format!("{numbered} {}", m.label)
                };
                let lw = 8 * label.chars().count() as i32;
                let right = at.0 + 8 + lw > pw as i32;
                let (x, y) = (
                    if right { at.0 - 5 } else { at.0 + 5 },
                    at.1 + 4 + 16 * (j as i32 % 3),
                );
                // On white, so the line under it does not cross the words.
                let x0 = if right { x - lw } else { x - 1 };
                pa.draw(&Rectangle::new(
                    [(x0, y), (x0 + lw + 2, y + 15)],
                    WHITE.mix(0.85).filled(),
                ))
                .map_err(draw_err)?;
                pa.draw_text(
                    &label,
                    &text(13)
                        .color(&mark_colour(ts.runs.len(), m.run))
                        .pos(Pos::new(
                            if right { HPos::Right } else { HPos::Left },
                            VPos::Top,
                        )),
                    (x, y),
                )
                .map_err(draw_err)?;
            }
        }
    }
    // The reasons, numbered as at their lines.
    let multi = ts.runs.len() > 1;
    for (j, m) in ts
        .marks
        .iter()
        .filter(|m| !m.reason.is_empty())
        .take(MAX_NOTES)
        .enumerate()
    {
        let who = if multi {
            format!(" ({})", clip(&ts.runs[m.run], 24))
        } else {
            String::new()
        };
        notes
            .draw_text(
                &clip(
                    &format!("{} at {:.1} s{who}: {}", j + 1, m.t, m.reason),
                    (w as usize).saturating_sub(140) / 7,
                ),
                &text(13).color(&INK),
                (128, NOTE_H as i32 * j as i32),
            )
            .map_err(draw_err)?;
    }
    Ok(())
}

/// Draws a [`Progress`] below its caption.
pub(crate) fn draw_progress<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &Progress,
) -> Result<(), PlotError> {
    let (w, _) = area.dim_in_pixel();
    let (legend, body) = area.split_vertically(LEGEND_H);
    let mut row = LegendRow {
        x: 16,
        y: 14,
        width: w as i32,
    };
    for (i, c) in p.runs.iter().enumerate() {
        let mut label = c.label.clone();
        if c.reconnects > 0 {
            label.push_str(&format!(", {} reconnect(s)", c.reconnects));
        }
        if !c.sampled {
            label.push_str(" (first and last byte only)");
        }
        row.run(&legend, i + p.first_colour, &label)?;
    }
    if let Some(cap) = p.runs.iter().find_map(|c| c.capacity) {
        row.swatch(
            &legend,
            SHADE.stroke_width(2),
            true,
            &format!(
                "path capacity from the first byte ({})",
                units::format_rate(cap.1)
            ),
        )?;
    }
    let tmax = p
        .runs
        .iter()
        .flat_map(|c| {
            c.samples
                .iter()
                .map(|s| s.0)
                .chain(c.marks.iter().map(|m| m.t))
        })
        .fold(1.0, f64::max);
    let bmax = p
        .runs
        .iter()
        .flat_map(|c| &c.samples)
        .map(|s| s.1)
        .fold(0.0, f64::max);
    let (div, unit) = bytes_unit(bmax);
    let (y0, y1) = y_range(0.0, bmax / div * 1.05);
    let span = tmax * 1.02;
    let mut chart = ChartBuilder::on(&body)
        .margin_left(16)
        .margin_right(28)
        .margin_top(8)
        .margin_bottom(8)
        .x_label_area_size(56)
        .y_label_area_size(112)
        .build_cartesian_2d(0.0..span, y0..y1)
        .map_err(draw_err)?;
    let fmt = |v: &f64| num(*v);
    chart
        .configure_mesh()
        .x_desc("time since the command started (s)")
        .y_desc(format!("bytes moved ({unit})"))
        .axis_desc_style(text(16))
        .label_style(text(14))
        .x_labels(12)
        .y_labels(8)
        .x_label_formatter(&fmt)
        .y_label_formatter(&fmt)
        .light_line_style(RGBColor(0xF4, 0xF4, 0xF4))
        .bold_line_style(GRID)
        .draw()
        .map_err(draw_err)?;
    for (i, c) in p.runs.iter().enumerate() {
        let k = i + p.first_colour;
        let col = colour(k);
        if let Some((t0, bps)) = c.capacity {
            // Where a copy at the path's full rate from its first byte
            // would be, up to the bytes this one moved.
            let total = c.samples.last().map_or(0.0, |s| s.1);
            let t1 = (t0 + total * 8.0 / bps).min(span);
            chart
                .draw_series(DashedLineSeries::new(
                    [(t0, 0.0), (t1, (t1 - t0) * bps / 8.0 / div)],
                    8,
                    5,
                    SHADE.stroke_width(2),
                ))
                .map_err(draw_err)?;
        }
        chart
            .draw_series(LineSeries::new(
                c.samples.iter().map(|s| (s.0, s.1 / div)),
                col.stroke_width(3),
            ))
            .map_err(draw_err)?;
        let pa = chart.plotting_area().strip_coord_spec();
        let every = c.samples.len().div_ceil(10).max(1);
        for (j, s) in c.samples.iter().enumerate() {
            if j % every == every / 2 || c.samples.len() <= 2 {
                let at = rel(&pa, chart.backend_coord(&(s.0, s.1 / div)));
                draw_marker(&pa, k, at, col)?;
            }
        }
        let mc = mark_colour(p.runs.len(), k);
        let (pw, _) = pa.dim_in_pixel();
        for (j, m) in c.marks.iter().enumerate() {
            chart
                .draw_series(DashedLineSeries::new(
                    [(m.t, y0), (m.t, y1)],
                    4,
                    4,
                    mc.mix(0.7).stroke_width(1),
                ))
                .map_err(draw_err)?;
            let at = rel(&pa, chart.backend_coord(&(m.t, y1)));
            let right = at.0 + 8 + 7 * m.label.chars().count() as i32 > pw as i32;
            pa.draw_text(
                &m.label,
                &text(13).color(&mc).pos(Pos::new(
                    if right { HPos::Right } else { HPos::Left },
                    VPos::Top,
                )),
                (
                    if right { at.0 - 4 } else { at.0 + 4 },
                    at.1 + 4 + 16 * (j as i32 % 5) + 84 * i as i32,
                ),
            )
            .map_err(draw_err)?;
        }
    }
    Ok(())
}

/// Draws a [`Cdf`] below its caption: its panels side by side.
pub(crate) fn draw_cdf<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    c: &Cdf,
) -> Result<(), PlotError> {
    let (w, _) = area.dim_in_pixel();
    let (legend, body) = area.split_vertically(LEGEND_H);
    let mut row = LegendRow {
        x: 16,
        y: 14,
        width: w as i32,
    };
    for (i, label) in c.runs.iter().enumerate() {
        row.run(&legend, i, label)?;
    }
    let parts = body.split_evenly((1, c.panels.len().max(1)));
    for ((q, lines), panel) in c.panels.iter().zip(parts) {
        let lo = lines
            .iter()
            .filter_map(|l| l.1.first())
            .copied()
            .fold(f64::INFINITY, f64::min);
        let hi = lines
            .iter()
            .filter_map(|l| l.1.last())
            .copied()
            .fold(0.0, f64::max);
        let (div, unit) = q.unit(hi);
        let (x0, x1) = if *q == Quantity::Rtt {
            let pad = ((hi - lo) / div * 0.05).max(0.5);
            ((lo / div - pad).max(0.0), hi / div + pad)
        } else {
            y_range(0.0, hi / div)
        };
        let mut chart = ChartBuilder::on(&panel)
            .margin_left(12)
            .margin_right(24)
            .margin_top(8)
            .margin_bottom(8)
            .x_label_area_size(56)
            .y_label_area_size(70)
            .build_cartesian_2d(x0..x1, 0.0..1.0)
            .map_err(draw_err)?;
        let fmt = |v: &f64| tick(*v, x1 - x0);
        let what = match q {
            Quantity::Rtt => "RTT of each stream in each interval",
            _ => "throughput of each interval",
        };
        chart
            .configure_mesh()
            .x_desc(format!("{what} ({unit})"))
            .y_desc("fraction at or below")
            .axis_desc_style(text(15))
            .label_style(text(14))
            .x_labels(7)
            .y_labels(6)
            .x_label_formatter(&fmt)
            .y_label_formatter(&fmt)
            .light_line_style(RGBColor(0xF4, 0xF4, 0xF4))
            .bold_line_style(GRID)
            .draw()
            .map_err(draw_err)?;
        for (run, v) in lines {
            let col = colour(*run);
            let n = v.len();
            // A step up at each value: the empirical distribution.
            let mut pts = Vec::with_capacity(2 * n);
            for (k, x) in v.iter().enumerate() {
                pts.push((x / div, k as f64 / n as f64));
                pts.push((x / div, (k + 1) as f64 / n as f64));
            }
            chart
                .draw_series(LineSeries::new(pts, col.stroke_width(3)))
                .map_err(draw_err)?;
            let pa = chart.plotting_area().strip_coord_spec();
            for f in [0.1, 0.5, 0.9] {
                let x = quantile(v, f);
                let at = rel(&pa, chart.backend_coord(&(x / div, f)));
                draw_marker(&pa, *run, at, col)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::plot::tests::outline;
    use crate::plot::Plot;
    use fatpipe_schema::copy::CopyTimeline;
    use fatpipe_schema::test::{CpuUse, TestDirection, TestEnd, TestInterval, TestRamp, TestStart};
    use fatpipe_schema::tune::{AutoTune, Decision, PathFacts, Plan};

    fn start(streams: u32, protocol: Protocol) -> TestStart {
        TestStart {
            timestamp: 1.79e9,
            server: "198.18.0.2:5301".into(),
            server_addr: "198.18.0.2:5301".into(),
            protocol,
            direction: TestDirection::Up,
            streams,
            duration_s: 10.0,
            bytes: None,
            omit_s: 1.0,
            interval_s: 1.0,
            length: 131_072,
            bitrate: None,
            window: None,
            mss: None,
            congestion: None,
            fq_rate: None,
            zerocopy: false,
            local: vec![],
            remote: vec![],
            warnings: vec![],
            auto: None,
            encryption: None,
        }
    }

    /// A TCP test of `streams` streams and `n` one-second intervals (the
    /// first omitted): each stream ramps to its share of 1 Gbit/s over 3 s,
    /// stream 0 starves from the middle on, RTT rises as the queue fills,
    /// a burst of retransmits at 4 s. `adjusted` adds the adjuster's
    /// switch to BBR at 4 s and 4 more streams at 6 s.
    pub(crate) fn tcp(streams: u32, n: u32, adjusted: bool) -> TestReport {
        let share = 940e6 / f64::from(streams);
        let intervals = (0..n)
            .map(|i| {
                let ramp = (f64::from(i + 1) / 3.0).min(1.0);
                let ss: Vec<StreamStats> = (0..streams)
                    .map(|s| {
                        let starve = s == 0 && streams > 1 && i >= n / 2;
                        let jitter = 1.0 + 0.05 * f64::from(s % 7) - 0.15;
                        let bps = if starve { 0.0 } else { share * ramp * jitter };
                        StreamStats {
                            id: Some(s),
                            seconds: 1.0,
                            bytes: (bps / 8.0) as u64,
                            bits_per_second: bps,
                            retransmits: Some(if i == 4 { 30 + u64::from(s % 3) } else { 0 }),
                            rtt_us: Some(228_000 + 2_000 * i.min(5) + 100 * (s % 11)),
                            cwnd: Some((bps * 0.228 / 8.0) as u64 + 14_480),
                            ..StreamStats::default()
                        }
                    })
                    .collect();
                let sum = StreamStats {
                    bits_per_second: ss.iter().map(|s| s.bits_per_second).sum(),
                    ..StreamStats::default()
                };
                TestInterval {
                    index: i,
                    start_s: f64::from(i),
                    end_s: f64::from(i + 1),
                    omitted: i == 0,
                    streams: ss,
                    sums: vec![sum],
                }
            })
            .collect();
        let mut st = start(streams, Protocol::Tcp);
        if adjusted {
            st.auto = Some(auto(vec![
                Decision {
                    at_secs: 4.0,
                    action: Action::SwitchCongestion { to: "bbr".into() },
                    streams,
                    reason: "retransmits 31 per interval while the rate stayed under 80 % of 1 Gbit/s: switching to bbr".into(),
                },
                Decision {
                    at_secs: 6.0,
                    action: Action::AddStreams { n: 4 },
                    streams: streams + 4,
                    reason: "rate 600 Mbit/s under 80 % of the bottleneck for 2 intervals".into(),
                },
            ]));
        }
        TestReport {
            schema: "fatpipe.test".into(),
            version: 1,
            start: st,
            intervals,
            end: TestEnd {
                seconds: f64::from(n),
                streams: vec![],
                sums: vec![],
                cpu_local: CpuUse::default(),
                cpu_remote: CpuUse::default(),
                rfc6349: None,
                ramp: Some(TestRamp {
                    secs: Some(2.6),
                    final_rate: 940_000_000,
                }),
            },
        }
    }

    fn auto(decisions: Vec<Decision>) -> AutoTune {
        AutoTune {
            facts: PathFacts {
                rtt_secs: 0.228,
                bottleneck_rate: Some(1_000_000_000),
                loss_rate: 0.0,
                mtu: 1500,
                loss_packets: 0,
            },
            plan: Plan {
                streams: 4,
                per_stream_buffer: 8 << 20,
                set_buffers: true,
                forced_buffers: false,
                congestion: "cubic".into(),
                pacing_rate: None,
                bdp: Some(28_500_000),
                reason: "plan".into(),
                estimate: None,
                window_rate: None,
            },
            streams: 4,
            buffer: Some(8 << 20),
            forced_buffers: false,
            congestion: Some("cubic".into()),
            pacing_rate: None,
            overridden: vec![],
            probe_secs: 0.4,
            rate_lower_bound: false,
            adjusting: true,
            decisions,
            warnings: vec![],
        }
    }

    /// A default-settings run: one stream, flat at its window's bound.
    fn flat() -> TestReport {
        let mut r = tcp(1, 10, false);
        for iv in &mut r.intervals {
            for s in iv.streams.iter_mut().chain(iv.sums.iter_mut()) {
                s.bits_per_second = 280e6;
            }
        }
        r.end.ramp = None;
        r
    }

    pub(crate) fn copy(samples: bool) -> CopyReport {
        let progress: Vec<(f64, u64)> = if samples {
            (0..=120)
                .map(|i| {
                    let t = 1.0 + f64::from(i) * 0.1;
                    // Slow start over the first 3 s, then 900 Mbit/s.
                    let d = (t - 1.2).max(0.0);
                    let b = if d < 3.0 {
                        900e6 / 8.0 * d * d / 6.0
                    } else {
                        900e6 / 8.0 * (d - 1.5)
                    };
                    (t, b as u64)
                })
                .collect()
        } else {
            Vec::new()
        };
        let total = progress.last().map_or(1_000_000_000, |p| p.1);
        CopyReport {
            schema: "fatpipe.copy".into(),
            version: 1,
            direction: fatpipe_schema::copy::CopyDirection::Push,
            server: "198.18.0.2:5301".into(),
            export: "demo".into(),
            sources: vec!["dataset".into()],
            destination: "demo/".into(),
            streams: 8,
            chunk_size: 8 << 20,
            checksum: "xxh3-128".into(),
            sync: false,
            direct: false,
            bwlimit: None,
            files_total: 2001,
            files_verified: 2001,
            files_skipped: 0,
            files_failed: 0,
            bytes_total: total,
            bytes_transferred: total,
            chunks_resent: 0,
            reconnects: 1,
            seconds: 13.5,
            rate: 700_000_000,
            files_per_sec: 150.0,
            io_local: "pread+sendfile".into(),
            io_remote: "pwrite".into(),
            peak_rss_local: 0,
            failures: vec![],
            problems: vec![],
            skipped: vec![],
            hard_links: vec![],
            notes_not_listed: 0,
            auto: Some(auto(vec![])),
            timeline: Some(CopyTimeline {
                wall_secs: 13.5,
                plan_at: Some(0.5),
                probe_secs: Some(0.4),
                connected_at: Some(0.3),
                request_at: Some(0.6),
                accepted_at: Some(0.9),
                data_open_at: Some(1.4),
                first_byte_sent_at: Some(1.2),
                first_byte_on_disk_at: None,
                ramp_secs: Some(3.4),
                final_rate: Some(900_000_000),
                first_stream_idle_at: Some(12.6),
                last_byte_at: Some(13.0),
                done_at: Some(13.4),
                adjust_at: vec![3.5],
                progress,
            }),
            encryption: None,
        }
    }

    fn caption(t: &str) -> Caption {
        Caption {
            title: t.into(),
            context: "path lab:demo · link 1 Gbit/s, 228 ms RTT · host dtn1".into(),
        }
    }

    fn texts(svg: &str) -> Vec<String> {
        outline(svg)
            .lines()
            .filter_map(|l| l.strip_prefix("text: ").map(str::to_string))
            .collect()
    }

    fn hex(c: RGBColor) -> String {
        format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
    }

    pub(crate) fn one() -> Plot {
        let r = tcp(4, 10, true);
        Plot::Timeseries(
            test_data(
                &[("auto-tuned".into(), &r)],
                caption("a 228 ms lab test over time"),
            )
            .unwrap(),
        )
    }

    pub(crate) fn overlay() -> Plot {
        let (a, b) = (flat(), tcp(8, 10, true));
        Plot::Timeseries(
            test_data(
                &[("default settings".into(), &a), ("auto-tuned".into(), &b)],
                caption("default settings against auto-tuned"),
            )
            .unwrap(),
        )
    }

    fn progress() -> Plot {
        let c = copy(true);
        Plot::Progress(
            copy_data(&[("copy, auto-tuned".into(), &c)], None, caption("copy")).unwrap(),
        )
    }

    fn cdf() -> Plot {
        let (a, b) = (flat(), tcp(8, 10, true));
        Plot::Cdf(
            cdf_data(
                &[("default settings".into(), &a), ("auto-tuned".into(), &b)],
                caption("per-interval figures"),
            )
            .unwrap(),
        )
    }

    #[test]
    fn a_test_run_has_a_panel_per_quantity_its_marks_and_warm_up() {
        let Plot::Timeseries(t) = one() else { panic!() };
        let kinds: Vec<Quantity> = t.panels.iter().map(|p| p.quantity).collect();
        assert_eq!(
            kinds,
            [
                Quantity::Throughput,
                Quantity::StreamThroughput,
                Quantity::Rtt,
                Quantity::Cwnd,
                Quantity::Retransmits
            ]
        );
        assert_eq!(t.warmup, [(0.0, 1.0)]);
        assert_eq!(t.span, 10.0);
        let marks: Vec<(f64, &str)> = t.marks.iter().map(|m| (m.t, m.label.as_str())).collect();
        assert_eq!(marks, [(2.6, "90 %"), (4.0, "→ bbr"), (6.0, "+4 streams")]);
        assert!(t.marks[1].reason.contains("switching to bbr"));
        // The sum at its middle, the streams' spread (stream 0 starves
        // from 5 s: the band's floor is 0 while the sum holds).
        let sum = &t.panels[0].series[0].points;
        assert_eq!(sum.len(), 10);
        assert!((sum[3].t - 3.5).abs() < 1e-9);
        assert!(sum[3].spread.is_none());
        let per = &t.panels[1].series[0].points;
        let s4 = per[4].spread.unwrap();
        let s6 = per[6].spread.unwrap();
        assert!(s4.min > 0.0 && s6.min == 0.0, "{s4:?} {s6:?}");
        assert!(s6.q1 <= per[6].y && per[6].y <= s6.q3 && s6.q3 <= s6.max);
        // RTT in seconds, retransmits summed over the streams.
        assert!((t.panels[2].series[0].points[0].y - 0.22815).abs() < 1e-3);
        assert_eq!(t.panels[4].series[0].points[4].y, 30.0 + 31.0 + 32.0 + 30.0);
    }

    #[test]
    fn a_test_run_draws_units_titles_marks_reasons_and_the_band() {
        let svg = one().svg().unwrap();
        let t = texts(&svg);
        for want in [
            "a 228 ms lab test over time",
            "path lab:demo · link 1 Gbit/s, 228 ms RTT · host dtn1",
            "auto-tuned",
            "throughput, sum of streams",
            "throughput per stream",
            "RTT per stream",
            "congestion window per stream",
            "retransmits per interval",
            "Mbit/s",
            "ms",
            "MB",
            "segments",
            "time since the run started (s)",
            "warm-up (omitted)",
            "middle half of the streams",
            "min–max of the streams",
            "1 90 %",
            "2 → bbr",
            "3 +4 streams",
        ] {
            assert!(t.iter().any(|x| x == want), "{want:?} missing from {t:?}");
        }
        assert!(
            t.iter()
                .any(|x| x.starts_with("2 at 4.0 s: retransmits 31 per interval")),
            "{t:?}"
        );
        // The band: translucent polygons in the run's colour.
        let blue = hex(PALETTE[0]);
        let bands = svg
            .split("<polygon")
            .skip(1)
            .map(|p| p.split('>').next().unwrap_or(""))
            .filter(|p| p.contains(&blue) && !p.contains("opacity=\"1\""))
            .count();
        assert!(bands >= 6, "3 per-stream panels × 2 bands: {bands}");
        // The three marks as dashed black lines in each of the 5 panels.
        assert!(crate::plot::tests::dashes(&svg) >= 3 * 5 * 5);
    }

    #[test]
    fn runs_overlay_in_their_own_colours_and_marker_shapes() {
        let Plot::Timeseries(t) = overlay() else {
            panic!()
        };
        assert_eq!(t.runs, ["default settings", "auto-tuned"]);
        assert_eq!(t.panels[0].series.len(), 2);
        // The one-stream run has no spread, so no series in that panel.
        assert_eq!(t.panels[1].series.len(), 2);
        assert!(t.panels[1].series[0].points[0].spread.is_none());
        assert!(t.marks.iter().all(|m| m.run == 1));
        let svg = overlay().svg().unwrap();
        for c in [PALETTE[0], PALETTE[1]] {
            assert!(svg.contains(&hex(c)), "{} missing", hex(c));
        }
        // Blue circles for the first run, orange triangles for the second.
        assert!(svg.contains("<circle"));
        assert!(svg
            .split("<polygon")
            .skip(1)
            .map(|p| p.split('>').next().unwrap_or(""))
            .any(|p| p.contains(&hex(PALETTE[1])) && p.contains("opacity=\"1\"")));
        let t = texts(&svg);
        assert!(
            t.iter().any(|x| x.contains("(auto-tuned): retransmits")),
            "{t:?}"
        );
    }

    #[test]
    fn a_udp_run_shows_loss_and_jitter() {
        let mut r = tcp(2, 5, false);
        r.start.protocol = Protocol::Udp;
        r.end.ramp = None;
        for iv in &mut r.intervals {
            for s in iv.streams.iter_mut().chain(iv.sums.iter_mut()) {
                s.rtt_us = None;
                s.cwnd = None;
                s.retransmits = None;
                s.packets_sent = Some(1000);
                s.lost = Some(u64::from(iv.index));
                s.jitter_ms = Some(0.5);
            }
        }
        let t = test_data(&[("udp".into(), &r)], caption("udp")).unwrap();
        let kinds: Vec<Quantity> = t.panels.iter().map(|p| p.quantity).collect();
        assert_eq!(
            kinds,
            [
                Quantity::Throughput,
                Quantity::StreamThroughput,
                Quantity::Loss,
                Quantity::Jitter
            ]
        );
        assert!(
            (t.panels[2].series[0].points[3].y - 0.3).abs() < 1e-9,
            "3 of 1000 lost"
        );
        let svg = Plot::Timeseries(t).svg().unwrap();
        let texts = texts(&svg);
        assert!(texts.iter().any(|x| x == "loss per interval"));
        assert!(texts.iter().any(|x| x == "%"));
    }

    #[test]
    fn small_values_keep_their_digits_and_units() {
        assert_eq!(tick(0.25, 1.0), "0.25");
        assert_eq!(tick(0.5, 1.0), "0.5");
        assert_eq!(tick(0.004, 0.01), "0.004");
        assert_eq!(tick(200.0, 800.0), "200");
        assert_eq!(Quantity::Rtt.unit(40e-6), (1e-6, "µs"));
        assert_eq!(Quantity::Rtt.unit(0.228), (1e-3, "ms"));
        assert_eq!(Quantity::Jitter.unit(0.02), (1e-3, "µs"));
    }

    #[test]
    fn a_run_without_intervals_is_one_clear_error() {
        let mut r = tcp(1, 3, false);
        r.intervals.clear();
        let e = test_data(&[("x".into(), &r)], caption("x")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "plot: the run has no intervals to draw over time"
        );
    }

    /// 1,024 streams × 300 intervals: one band, not a thousand lines, and
    /// the drawing stays small.
    #[test]
    fn a_thousand_streams_are_a_band_not_a_thousand_lines() {
        let r = tcp(1024, 300, true);
        let t = test_data(&[("1024 streams".into(), &r)], caption("many")).unwrap();
        for p in &t.panels {
            assert_eq!(p.series.len(), 1, "{:?}: one series", p.quantity);
            assert_eq!(p.series[0].points.len(), 300);
        }
        let svg = Plot::Timeseries(t).svg().unwrap();
        // One line in the run's colour per panel (and the legend's): none
        // per stream.
        let blue = svg
            .split("<polyline")
            .skip(1)
            .filter(|p| p.split('>').next().unwrap_or("").contains(&hex(PALETTE[0])))
            .count();
        assert_eq!(blue, 5 + 1, "a line per panel and the legend's");
        assert!(svg.len() < 2_000_000, "{} bytes of SVG", svg.len());
        let texts = texts(&svg);
        assert!(texts.iter().any(|x| x == "min–max of the streams"));
        assert!(
            texts.iter().any(|x| x == "300"),
            "time axis reaches 300 s: {texts:?}"
        );
    }

    #[test]
    fn a_copy_shows_bytes_against_capacity_with_its_timeline() {
        let Plot::Progress(p) = progress() else {
            panic!()
        };
        let c = &p.runs[0];
        assert!(c.sampled);
        assert_eq!(c.samples.len(), 121);
        assert_eq!(c.capacity, Some((1.2, 1e9)));
        let labels: Vec<&str> = c.marks.iter().map(|m| m.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "connect",
                "probe",
                "request",
                "first byte",
                "adjust",
                "90 % of final rate",
                "first idle stream",
                "last byte",
                "done"
            ]
        );
        let svg = progress().svg().unwrap();
        let t = texts(&svg);
        for want in [
            "bytes moved (GB)",
            "time since the command started (s)",
            "copy, auto-tuned, 1 reconnect(s)",
            "path capacity from the first byte (1.00 Gbit/s)",
            "first byte",
            "last byte",
        ] {
            assert!(t.iter().any(|x| x == want), "{want:?} missing from {t:?}");
        }
    }

    #[test]
    fn a_copy_without_samples_joins_first_and_last_byte_and_says_so() {
        let c = copy(false);
        let p = copy_data(&[("old".into(), &c)], Some(5e8), caption("c")).unwrap();
        assert!(!p.runs[0].sampled);
        assert_eq!(p.runs[0].samples, [(1.2, 0.0), (13.0, 1e9)]);
        assert_eq!(
            p.runs[0].capacity,
            Some((1.2, 5e8)),
            "the caller's link wins"
        );
        let t = texts(&Plot::Progress(p).svg().unwrap());
        assert!(
            t.iter()
                .any(|x| x == "old, 1 reconnect(s) (first and last byte only)"),
            "{t:?}"
        );
        let mut c = copy(false);
        c.timeline = None;
        let e = copy_data(&[("x".into(), &c)], None, caption("c")).unwrap_err();
        assert!(e.to_string().contains("has no timeline"), "{e}");
    }

    #[test]
    fn a_cdf_has_throughput_and_rtt_per_run_without_warm_up() {
        let Plot::Cdf(c) = cdf() else { panic!() };
        assert_eq!(c.panels.len(), 2);
        let (q, lines) = &c.panels[0];
        assert_eq!(*q, Quantity::Throughput);
        assert_eq!(lines[0].1.len(), 9, "10 intervals, the first omitted");
        assert!(lines[0].1.iter().all(|v| (*v - 280e6).abs() < 1.0));
        let (q, lines) = &c.panels[1];
        assert_eq!(*q, Quantity::Rtt);
        assert_eq!(lines[1].1.len(), 8 * 9);
        assert!(lines[1].1.windows(2).all(|w| w[0] <= w[1]));
        let svg = cdf().svg().unwrap();
        let t = texts(&svg);
        for want in [
            "throughput of each interval (Mbit/s)",
            "RTT of each stream in each interval (ms)",
            "fraction at or below",
            "default settings",
            "auto-tuned",
        ] {
            assert!(t.iter().any(|x| x == want), "{want:?} missing from {t:?}");
        }
        // Many values are thinned to quantiles.
        let big = tcp(1024, 30, false);
        let c = cdf_data(&[("x".into(), &big)], caption("x")).unwrap();
        assert_eq!(c.panels[1].1[0].1.len(), CDF_POINTS + 1);
    }

    #[test]
    fn snapshots_of_every_time_kind() {
        insta::assert_snapshot!("timeseries", outline(&one().svg().unwrap()));
        insta::assert_snapshot!("overlay", outline(&overlay().svg().unwrap()));
        insta::assert_snapshot!("progress", outline(&progress().svg().unwrap()));
        insta::assert_snapshot!("cdf", outline(&cdf().svg().unwrap()));
    }

    /// Not a check: `FATPIPE_PLOT_DUMP=DIR cargo test -p fatpipe-report --
    /// --ignored dump_time` writes every kind as SVG and PNG, to look at.
    #[test]
    #[ignore = "writes files to look at; run with --ignored"]
    fn dump_time_kinds_for_people() {
        let Ok(dir) = std::env::var("FATPIPE_PLOT_DUMP") else {
            return;
        };
        let many = tcp(1024, 300, true);
        let many = Plot::Timeseries(
            test_data(
                &[("1024 streams".into(), &many)],
                caption("1,024 streams × 300 intervals"),
            )
            .unwrap(),
        );
        for (name, p) in [
            ("timeseries", one()),
            ("overlay", overlay()),
            ("progress", progress()),
            ("cdf", cdf()),
            ("many", many),
        ] {
            let d = std::path::Path::new(&dir);
            std::fs::write(d.join(format!("{name}.svg")), p.svg().unwrap()).unwrap();
            p.png(&d.join(format!("{name}.png"))).unwrap();
        }
    }
}
