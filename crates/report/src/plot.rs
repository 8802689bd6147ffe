//! Plots of a report: a measure against a swept parameter (one line per
//! series, the repetitions' p10–p90 spread as a band and error bars), a
//! heat map of two parameters, a path's history over time with the
//! archive's annotations marked, and a source document's figures beside
//! fatpipe's.
//!
//! Two steps, so each can be tested alone: the `*_data` functions turn
//! measurements into what a plot shows (pure, no drawing), and [`Plot`]
//! draws it with `plotters` onto SVG (text stays text, so a browser or a
//! test can read it) or PNG. Fonts are DejaVu Sans, compiled in and
//! measured with `ab_glyph`, so no system font library is needed at run
//! time and a plot's layout is the same on every host.
//!
//! Readability rules, from the "plots a person can read": axes name
//! their unit; sizes and rates print as people write them (`64 KB`,
//! `941 Mbit/s`); a parameter spanning 16× or more is on a log axis whose
//! ticks are the swept values; series differ in colour (Okabe and Ito's
//! palette, safe for colour blindness) *and* in marker shape, so they
//! survive greyscale printing; the heat map uses viridis, whose lightness
//! rises monotonically.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Once;

use chrono::{DateTime, Utc};
use fatpipe_archive::stats::summarise;
use fatpipe_archive::{Annotation, Measurement};
use fatpipe_schema::units;
use fatpipe_sweep::SeedFigure;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::Value;

use crate::metric::{Metric, Stat};
use crate::tables::{self, Group};

/// A plot could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// There is nothing to draw (no successful runs with the measure, or
    /// the parameter is not swept).
    #[error("{0}")]
    Empty(String),
    /// The drawing library failed (a file could not be written, say).
    #[error("drawing the plot: {0}")]
    Draw(String),
}

/// The default size, in pixels: legible at 100 % in a browser, and the
/// aspect of a paper's column-wide figure.
pub const WIDTH: u32 = 960;
/// See [`WIDTH`].
pub const HEIGHT: u32 = 540;

/// Okabe and Ito's colour-blind-safe palette (black last), chosen so
/// neighbouring series also differ in lightness.
pub const PALETTE: [RGBColor; 8] = [
    RGBColor(0x00, 0x72, 0xB2), // blue
    RGBColor(0xE6, 0x9F, 0x00), // orange
    RGBColor(0x00, 0x9E, 0x73), // bluish green
    RGBColor(0xD5, 0x5E, 0x00), // vermillion
    RGBColor(0xCC, 0x79, 0xA7), // reddish purple
    RGBColor(0x56, 0xB4, 0xE9), // sky blue
    RGBColor(0xF0, 0xE4, 0x42), // yellow
    RGBColor(0x00, 0x00, 0x00), // black
];

/// The grey the source document's figures are drawn in.
pub const SEED_GREY: RGBColor = RGBColor(0x80, 0x80, 0x80);

/// What a plot shows, ready to draw.
#[derive(Debug, Clone, PartialEq)]
pub enum Plot {
    /// A measure against a parameter.
    Line(LinePlot),
    /// A measure over two parameters, one panel per split value.
    Heatmap(Heatmap),
    /// One path's results over time.
    History(History),
    /// A source document's figures beside fatpipe's.
    Seed(SeedPlot),
    /// Test runs over time (`crate::timeseries`).
    Timeseries(crate::timeseries::Timeseries),
    /// Copies' bytes over time.
    Progress(crate::timeseries::Progress),
    /// The distribution of runs' per-interval figures.
    Cdf(crate::timeseries::Cdf),
}

/// The title block every plot carries.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Caption {
    /// First line: what is plotted against what.
    pub title: String,
    /// Second line: path, link and host.
    pub context: String,
}

/// An x axis: where each value sits and how it is labelled.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    /// The parameter's name with its unit (`window (bytes, log scale)`).
    pub label: String,
    /// Log scale (positions are log2 of the value).
    pub log: bool,
    /// Words, not quantities: evenly spaced, and points are not joined
    /// (a line between `cubic` and `bbr` would mean nothing).
    pub categorical: bool,
    /// Tick positions and their labels, one per value.
    pub ticks: Vec<(f64, String)>,
}

/// One point of a series: the statistic and the repetitions' spread.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// Position on the x axis.
    pub x: f64,
    /// The statistic (median by default), base unit.
    pub y: f64,
    /// 10th percentile.
    pub lo: f64,
    /// 90th percentile.
    pub hi: f64,
    /// Runs behind it.
    pub n: usize,
}

/// One line.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text (`mtu=9000`), empty when there is one series.
    pub label: String,
    /// Points in x order.
    pub points: Vec<Point>,
}

/// A measure against a parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct LinePlot {
    /// Title block.
    pub caption: Caption,
    /// The x axis.
    pub x: Axis,
    /// The measure.
    pub metric: Metric,
    /// The statistic the line joins.
    pub stat: Stat,
    /// The lines.
    pub series: Vec<Series>,
    /// Said under the plot (what was pooled).
    pub notes: Vec<String>,
}

/// One panel of a heat map.
#[derive(Debug, Clone, PartialEq)]
pub struct HeatPanel {
    /// `protocol=tcp`, empty without a split.
    pub label: String,
    /// Values down the rows (the y parameter), top to bottom.
    pub rows: Vec<String>,
    /// Values across (the x parameter).
    pub columns: Vec<String>,
    /// `cells[row][column]`, base unit.
    pub cells: Vec<Vec<Option<f64>>>,
}

/// A measure over two parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Heatmap {
    /// Title block.
    pub caption: Caption,
    /// Parameter down the rows.
    pub y_param: String,
    /// Parameter across.
    pub x_param: String,
    /// The measure.
    pub metric: Metric,
    /// The statistic in each cell.
    pub stat: Stat,
    /// One panel per value of the split parameters.
    pub panels: Vec<HeatPanel>,
}

/// One time bucket of a history.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    /// Middle of the bucket, seconds since the Unix epoch.
    pub t: f64,
    /// Median of its runs.
    pub y: f64,
    /// 10th percentile.
    pub lo: f64,
    /// 90th percentile.
    pub hi: f64,
    /// Runs in it.
    pub n: usize,
}

/// One path's results over time.
#[derive(Debug, Clone, PartialEq)]
pub struct History {
    /// Title block.
    pub caption: Caption,
    /// The measure.
    pub metric: Metric,
    /// Bucket width in seconds (every run alone below 400 runs: 0).
    pub bucket_s: f64,
    /// One series per path.
    pub series: Vec<(String, Vec<Bucket>)>,
    /// The archive's notes on those paths, as markers.
    pub annotations: Vec<(f64, String)>,
}

/// One figure of a source document and fatpipe's value beside it.
#[derive(Debug, Clone, PartialEq)]
pub struct SeedBar {
    /// What it is (`phase=oc3: throughput (p90)`).
    pub label: String,
    /// The document's value, base unit or a ratio.
    pub seed: f64,
    /// Ours, if any run matched.
    pub ours: Option<f64>,
    /// Both values as printed.
    pub seed_text: String,
    /// Ours as printed (`no runs` when missing).
    pub ours_text: String,
}

/// A source document's figures beside fatpipe's.
#[derive(Debug, Clone, PartialEq)]
pub struct SeedPlot {
    /// Title block.
    pub caption: Caption,
    /// One pair of bars per figure.
    pub bars: Vec<SeedBar>,
}

/// The measure against parameter `x`, one series per combination of the
/// `series` parameters' values. Every other parameter that varies is
/// pooled, and a note says so.
pub fn line_data(
    runs: &[Measurement],
    x: &str,
    series: &[String],
    metric: Metric,
    stat: Stat,
    caption: Caption,
) -> Result<LinePlot, PlotError> {
    let gs = tables::groups(runs);
    let xs: Vec<Value> = distinct(&gs, x);
    if xs.iter().all(Value::is_null) {
        return Err(PlotError::Empty(format!(
            "plot: '{x}' is not a parameter of these runs (the sweep's parameters are: {})",
            params_of(&gs)
        )));
    }
    let axis = axis_for(x, &xs);
    let mut by: BTreeMap<String, BTreeMap<String, Vec<f64>>> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut series_keys: Vec<Vec<Value>> = Vec::new();
    for g in &gs {
        let skey: Vec<Value> = series.iter().map(|k| param(g, k)).collect();
        let slabel = series_label(series, &skey);
        if !order.contains(&slabel) {
            order.push(slabel.clone());
            series_keys.push(skey);
        }
        by.entry(slabel)
            .or_default()
            .entry(param(g, x).to_string())
            .or_default()
            .extend(values(g, metric));
    }
    // Series in the order of their parameters' meaning (mtu 1500 before 9000).
    let mut idx: Vec<usize> = (0..order.len()).collect();
    idx.sort_by(|&a, &b| {
        let ka: Vec<_> = series_keys[a].iter().map(tables::sort_key).collect();
        let kb: Vec<_> = series_keys[b].iter().map(tables::sort_key).collect();
        ka.partial_cmp(&kb).unwrap_or(std::cmp::Ordering::Equal)
    });
    let mut out = Vec::new();
    for i in idx {
        let label = &order[i];
        let Some(cells) = by.get(label) else { continue };
        let mut points = Vec::new();
        for (v, (pos, _)) in xs.iter().zip(&axis.ticks) {
            let Some(vals) = cells.get(&v.to_string()) else {
                continue;
            };
            let Some(s) = summarise(vals) else { continue };
            let Some(y) = stat.of(&s) else { continue };
            points.push(Point {
                x: *pos,
                y,
                lo: s.p10,
                hi: s.p90,
                n: vals.len(),
            });
        }
        if !points.is_empty() {
            out.push(Series {
                label: label.clone(),
                points,
            });
        }
    }
    if out.is_empty() {
        return Err(PlotError::Empty(format!(
            "plot: no successful run has a {} value",
            metric.label()
        )));
    }
    let mut shown = vec![x.to_string()];
    shown.extend(series.iter().cloned());
    let pooled: Vec<String> = tables::varying(&gs)
        .into_iter()
        .filter(|k| !shown.contains(k))
        .collect();
    let notes = if pooled.is_empty() {
        Vec::new()
    } else {
        vec![format!("pooled over {}", pooled.join(", "))]
    };
    Ok(LinePlot {
        caption,
        x: axis,
        metric,
        stat,
        series: out,
        notes,
    })
}

/// The measure as a grid of `y` (rows) × `x` (columns), one panel per value
/// of the `split` parameters.
pub fn heatmap_data(
    runs: &[Measurement],
    y: &str,
    x: &str,
    split: &[String],
    metric: Metric,
    stat: Stat,
    caption: Caption,
) -> Result<Heatmap, PlotError> {
    let gs = tables::groups(runs);
    for p in [x, y] {
        if distinct(&gs, p).iter().all(Value::is_null) {
            return Err(PlotError::Empty(format!(
                "plot: '{p}' is not a parameter of these runs (the sweep's parameters are: {})",
                params_of(&gs)
            )));
        }
    }
    let rows_v = distinct(&gs, y);
    let cols_v = distinct(&gs, x);
    let mut splits: Vec<Vec<Value>> = Vec::new();
    let mut grid: BTreeMap<(String, String, String), Vec<f64>> = BTreeMap::new();
    for g in &gs {
        let s: Vec<Value> = split.iter().map(|k| param(g, k)).collect();
        if !splits.contains(&s) {
            splits.push(s.clone());
        }
        grid.entry((
            Value::Array(s).to_string(),
            param(g, y).to_string(),
            param(g, x).to_string(),
        ))
        .or_default()
        .extend(values(g, metric));
    }
    splits.sort_by(|a, b| {
        let ka: Vec<_> = a.iter().map(tables::sort_key).collect();
        let kb: Vec<_> = b.iter().map(tables::sort_key).collect();
        ka.partial_cmp(&kb).unwrap_or(std::cmp::Ordering::Equal)
    });
    let mut panels = Vec::new();
    for s in &splits {
        let sk = Value::Array(s.clone()).to_string();
        // Largest row value on top, as a chart's y axis reads.
        let cells: Vec<Vec<Option<f64>>> = rows_v
            .iter()
            .rev()
            .map(|r| {
                cols_v
                    .iter()
                    .map(|c| {
                        grid.get(&(sk.clone(), r.to_string(), c.to_string()))
                            .and_then(|v| summarise(v))
                            .and_then(|sum| stat.of(&sum))
                    })
                    .collect()
            })
            .collect();
        panels.push(HeatPanel {
            label: series_label(split, s),
            rows: rows_v.iter().rev().map(|v| value_label(y, v)).collect(),
            columns: cols_v.iter().map(|v| value_label(x, v)).collect(),
            cells,
        });
    }
    if panels
        .iter()
        .all(|p| p.cells.iter().flatten().all(Option::is_none))
    {
        return Err(PlotError::Empty(format!(
            "plot: no successful run has a {} value",
            metric.label()
        )));
    }
    Ok(Heatmap {
        caption,
        y_param: y.to_string(),
        x_param: x.to_string(),
        metric,
        stat,
        panels,
    })
}

/// The runs over time, one series per path: every run as a point when
/// there are few, else medians and p10–p90 per time bucket (a minute to a
/// week, whichever keeps the buckets under 200). `notes` are drawn as
/// markers where they fall in the time range.
pub fn history_data(
    runs: &[Measurement],
    notes: &[Annotation],
    metric: Metric,
    caption: Caption,
) -> Result<History, PlotError> {
    let mut by_path: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for m in runs.iter().filter(|m| m.ok) {
        if let Some(v) = metric.of(&m.metrics) {
            by_path
                .entry(m.path.as_str())
                .or_default()
                .push((epoch_s(m.started), v));
        }
    }
    let all: Vec<f64> = by_path.values().flatten().map(|p| p.0).collect();
    if all.is_empty() {
        return Err(PlotError::Empty(format!(
            "plot: no successful run has a {} value",
            metric.label()
        )));
    }
    let t0 = all.iter().copied().fold(f64::INFINITY, f64::min);
    let t1 = all.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let bucket_s = if all.len() < 400 {
        0.0
    } else {
        [60.0, 600.0, 3600.0, 6.0 * 3600.0, 86_400.0, 7.0 * 86_400.0]
            .into_iter()
            .find(|w| (t1 - t0) / w < 200.0)
            .unwrap_or(30.0 * 86_400.0)
    };
    let mut series = Vec::new();
    for (path, mut pts) in by_path {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let buckets = if bucket_s == 0.0 {
            pts.iter()
                .map(|&(t, y)| Bucket {
                    t,
                    y,
                    lo: y,
                    hi: y,
                    n: 1,
                })
                .collect()
        } else {
            let mut b: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
            for (t, y) in pts {
                b.entry((t / bucket_s).floor() as i64).or_default().push(y);
            }
            b.into_iter()
                .filter_map(|(k, ys)| {
                    let s = summarise(&ys)?;
                    Some(Bucket {
                        t: (k as f64 + 0.5) * bucket_s,
                        y: s.median,
                        lo: s.p10,
                        hi: s.p90,
                        n: ys.len(),
                    })
                })
                .collect()
        };
        series.push((path.to_string(), buckets));
    }
    let span = (t1 - t0).max(1.0);
    let annotations = notes
        .iter()
        .map(|a| (epoch_s(a.at), a.note.clone()))
        .filter(|(t, _)| *t >= t0 - span * 0.05 && *t <= t1 + span * 0.05)
        .collect();
    Ok(History {
        caption,
        metric,
        bucket_s,
        series,
        annotations,
    })
}

/// Each figure of a source document beside the same statistic of
/// fatpipe's runs in the cells it names (as the seed table computes it).
pub fn seed_data(
    runs: &[Measurement],
    figures: &[SeedFigure],
    caption: Caption,
) -> Result<SeedPlot, PlotError> {
    if figures.is_empty() {
        return Err(PlotError::Empty(
            "plot: the experiment quotes no figures of its source document ([[seed_figure]])"
                .into(),
        ));
    }
    let table = tables::seed(runs, figures);
    let bars = figures
        .iter()
        .zip(table.rows.iter().zip(&table.values))
        .map(|(f, (row, vals))| SeedBar {
            label: format!("{}: {}", row[0], row[1]),
            seed: f.value,
            ours: vals[3],
            seed_text: row[2].clone(),
            ours_text: row[3].clone(),
        })
        .collect();
    Ok(SeedPlot { caption, bars })
}

impl Plot {
    /// Its title block.
    pub fn caption(&self) -> &Caption {
        match self {
            Plot::Line(p) => &p.caption,
            Plot::Heatmap(p) => &p.caption,
            Plot::History(p) => &p.caption,
            Plot::Seed(p) => &p.caption,
            Plot::Timeseries(p) => &p.caption,
            Plot::Progress(p) => &p.caption,
            Plot::Cdf(p) => &p.caption,
        }
    }

    /// Height that fits its content at [`WIDTH`]: heat maps and seed
    /// figures grow with their panels and bars.
    pub fn height(&self) -> u32 {
        match self {
            Plot::Heatmap(h) => {
                let rows: usize = h.panels.iter().map(|p| p.rows.len().max(2)).sum();
                (140 + 46 * rows as u32 + 70 * h.panels.len() as u32).max(HEIGHT)
            }
            Plot::Seed(s) => (150 + 64 * s.bars.len() as u32).max(300),
            Plot::Timeseries(t) => t.height(),
            Plot::Cdf(_) => 600,
            _ => HEIGHT,
        }
    }

    /// Draws it as an SVG document.
    pub fn svg(&self) -> Result<String, PlotError> {
        fonts();
        let mut out = String::new();
        {
            let root =
                SVGBackend::with_string(&mut out, (WIDTH, self.height())).into_drawing_area();
            self.draw(&root)?;
            root.present().map_err(draw_err)?;
        }
        Ok(out)
    }

    /// Draws it as a PNG file at `path`.
    pub fn png(&self, path: &Path) -> Result<(), PlotError> {
        fonts();
        let root = BitMapBackend::new(path, (WIDTH, self.height())).into_drawing_area();
        self.draw(&root)?;
        root.present().map_err(draw_err)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError> {
        root.fill(&WHITE).map_err(draw_err)?;
        let body = caption(root, self.caption())?;
        match self {
            Plot::Line(p) => draw_line(&body, p),
            Plot::Heatmap(p) => draw_heatmap(&body, p),
            Plot::History(p) => draw_history(&body, p),
            Plot::Seed(p) => draw_seed(&body, p),
            Plot::Timeseries(p) => crate::timeseries::draw_timeseries(&body, p),
            Plot::Progress(p) => crate::timeseries::draw_progress(&body, p),
            Plot::Cdf(p) => crate::timeseries::draw_cdf(&body, p),
        }
    }
}

/// How a value of the measure is scaled for an axis: the divisor and the
/// unit, picked from the largest value (`Mbit/s` below 1 Gbit/s).
pub fn unit_for(metric: Metric, max: f64) -> (f64, &'static str) {
    match metric {
        Metric::Throughput => {
            if max >= 1e9 {
                (1e9, "Gbit/s")
            } else if max >= 1e6 {
                (1e6, "Mbit/s")
            } else if max >= 1e3 {
                (1e3, "kbit/s")
            } else {
                (1.0, "bit/s")
            }
        }
        Metric::RttMin | Metric::Rtt | Metric::RttMax | Metric::RttStd => (1e3, "ms"),
        Metric::Loss | Metric::CpuLocal | Metric::CpuRemote => (1.0, "%"),
        Metric::Jitter => (1.0, "ms"),
        Metric::Retransmits => (1.0, "segments"),
    }
}

/// A byte size as people write a swept buffer: `64 KB`, `256 MB` (powers of
/// 1024, as the source documents use them); a size below 1 MB that is
/// not one, such as a datagram length, exactly (`1472 B`, `65507 B`: a
/// rounded `1.47 kB` would hide the very value swept); else SI.
pub fn size_label(bytes: f64) -> String {
    for (div, unit) in [(1u64 << 30, "GB"), (1 << 20, "MB"), (1 << 10, "KB")] {
        let v = bytes / div as f64;
        if v >= 1.0 && (v - v.round()).abs() < 1e-9 {
            return format!("{} {unit}", v.round());
        }
    }
    if (0.0..1e6).contains(&bytes) && bytes.fract() == 0.0 {
        return format!("{bytes} B");
    }
    units::format_bytes(bytes.max(0.0) as u64)
}

// --- data helpers -------------------------------------------------------------

fn param(g: &Group<'_>, k: &str) -> Value {
    g.params.get(k).cloned().unwrap_or(Value::Null)
}

fn values(g: &Group<'_>, metric: Metric) -> Vec<f64> {
    g.runs
        .iter()
        .filter(|m| m.ok)
        .filter_map(|m| metric.of(&m.metrics))
        .collect()
}

/// The distinct values of parameter `k`, in the order of their meaning.
fn distinct(gs: &[Group<'_>], k: &str) -> Vec<Value> {
    let mut v: Vec<Value> = Vec::new();
    for g in gs {
        let p = param(g, k);
        if !v.contains(&p) {
            v.push(p);
        }
    }
    v.sort_by(|a, b| {
        tables::sort_key(a)
            .partial_cmp(&tables::sort_key(b))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    v
}

fn params_of(gs: &[Group<'_>]) -> String {
    let mut ks: Vec<&str> = gs
        .iter()
        .flat_map(|g| g.params.keys().map(String::as_str))
        .collect();
    ks.sort_unstable();
    ks.dedup();
    if ks.is_empty() {
        "none: these runs are not from a sweep".into()
    } else {
        ks.join(", ")
    }
}

fn series_label(keys: &[String], vals: &[Value]) -> String {
    keys.iter()
        .zip(vals)
        .map(|(k, v)| format!("{k}={}", value_label(k, v)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Parameters whose values are byte sizes, printed as `64 KB`.
const SIZE_PARAMS: [&str; 5] = ["window", "length", "mss", "buffer", "size"];

fn value_label(k: &str, v: &Value) -> String {
    if SIZE_PARAMS.contains(&k) {
        if let tables::SortKey::Number(n) = tables::sort_key(v) {
            return size_label(n);
        }
    }
    // Otherwise as the tables print it, so a legend and a table agree.
    tables::show(v)
}

/// The x axis for parameter `k` over its values `xs` (sorted): numbers on
/// a log scale when they span 16× or more, else linear; words as evenly
/// spaced categories.
fn axis_for(k: &str, xs: &[Value]) -> Axis {
    let nums: Vec<Option<f64>> = xs
        .iter()
        .map(|v| match tables::sort_key(v) {
            tables::SortKey::Number(n) if !v.is_boolean() => Some(n),
            _ => None,
        })
        .collect();
    let unit = if SIZE_PARAMS.contains(&k) {
        "bytes"
    } else {
        ""
    };
    if nums.iter().all(Option::is_some) {
        let n: Vec<f64> = nums.into_iter().flatten().collect();
        let lo = n.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = n.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let log = lo > 0.0 && hi / lo >= 16.0;
        let ticks = n
            .iter()
            .zip(xs)
            .map(|(&x, v)| (if log { x.log2() } else { x }, value_label(k, v)))
            .collect();
        let label = match (unit, log) {
            ("", false) => k.to_string(),
            ("", true) => format!("{k} (log scale)"),
            (u, false) => format!("{k} ({u})"),
            (u, true) => format!("{k} ({u}, log scale)"),
        };
        Axis {
            label,
            log,
            categorical: false,
            ticks,
        }
    } else {
        Axis {
            label: k.to_string(),
            log: false,
            categorical: true,
            ticks: xs
                .iter()
                .enumerate()
                .map(|(i, v)| (i as f64, value_label(k, v)))
                .collect(),
        }
    }
}

fn epoch_s(t: DateTime<Utc>) -> f64 {
    t.timestamp() as f64 + f64::from(t.timestamp_subsec_micros()) / 1e6
}

// --- drawing -------------------------------------------------------------------

/// The font family every text uses; registered once per process.
pub(crate) const FONT: &str = "sans-serif";

pub(crate) fn fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Compiled-in fonts: a failure here is a build defect, and text
        // would then be missing from every plot, which the tests catch.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
        let _ = plotters::style::register_font(FONT, FontStyle::Bold, dejavu::sans::bold());
    });
}

pub(crate) fn draw_err<E: std::fmt::Display>(e: E) -> PlotError {
    PlotError::Draw(e.to_string())
}

pub(crate) fn text(size: u32) -> TextStyle<'static> {
    TextStyle::from((FONT, size).into_font()).color(&BLACK)
}

/// Draws the title and context lines; returns the area below them.
pub(crate) fn caption<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    c: &Caption,
) -> Result<DrawingArea<DB, Shift>, PlotError> {
    let (top, body) = root.split_vertically(if c.context.is_empty() { 44 } else { 70 });
    let (w, _) = top.dim_in_pixel();
    let max_chars = (w as usize).saturating_sub(32) / 10;
    top.draw_text(
        &clip(&c.title, max_chars),
        &TextStyle::from((FONT, 26).into_font().style(FontStyle::Bold)).color(&BLACK),
        (16, 12),
    )
    .map_err(draw_err)?;
    if !c.context.is_empty() {
        top.draw_text(
            &clip(&c.context, max_chars + 12),
            &text(18).color(&RGBColor(0x40, 0x40, 0x40)),
            (16, 44),
        )
        .map_err(draw_err)?;
    }
    Ok(body)
}

pub(crate) fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// A tick label on a log axis, in the unit that suits the value itself
/// (`2 Mbit/s`, `1 Gbit/s`).
fn tick_label(metric: Metric, v: f64) -> String {
    let (div, unit) = unit_for(metric, v);
    format!("{} {unit}", num(v / div))
}

/// A human tick label for a value already divided into `unit`.
pub(crate) fn num(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}").trim_end_matches(".0").to_string()
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

pub(crate) fn y_range(lo: f64, hi: f64) -> (f64, f64) {
    let lo = lo.min(0.0);
    let hi = if hi <= lo { lo + 1.0 } else { hi };
    (lo, hi + (hi - lo) * 0.08)
}

pub(crate) fn draw_marker<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    shape: usize,
    at: (i32, i32),
    color: RGBColor,
) -> Result<(), PlotError> {
    let s = color.filled();
    let r = match shape % 5 {
        0 => area.draw(&Circle::new(at, 5, s)),
        1 => area.draw(&TriangleMarker::new(at, 7, s)),
        2 => area.draw(&Rectangle::new(
            [(at.0 - 5, at.1 - 5), (at.0 + 5, at.1 + 5)],
            s,
        )),
        3 => area.draw(&Polygon::new(
            vec![
                (at.0, at.1 - 7),
                (at.0 + 7, at.1),
                (at.0, at.1 + 7),
                (at.0 - 7, at.1),
            ],
            s,
        )),
        _ => area.draw(&Cross::new(at, 6, color.stroke_width(3))),
    };
    r.map_err(draw_err)
}

/// A backend pixel as a position inside `area`.
pub(crate) fn rel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    abs: (i32, i32),
) -> (i32, i32) {
    let base = area.get_base_pixel();
    (abs.0 - base.0, abs.1 - base.1)
}

/// A legend entry: the series' line with its marker on it, so the legend
/// reads in greyscale too.
pub(crate) fn legend<'a, DB: DrawingBackend + 'a>(
    anno: &mut plotters::chart::SeriesAnno<'a, DB>,
    shape: usize,
    color: RGBColor,
) {
    let line = move |p: (i32, i32)| {
        EmptyElement::at(p) + PathElement::new(vec![(0, 0), (28, 0)], color.stroke_width(3))
    };
    let s = color.filled();
    match shape % 5 {
        0 => anno.legend(move |p| line(p) + Circle::new((14, 0), 5, s)),
        1 => anno.legend(move |p| line(p) + TriangleMarker::new((14, 0), 7, s)),
        2 => anno.legend(move |p| line(p) + Rectangle::new([(9, -5), (19, 5)], s)),
        3 => anno
            .legend(move |p| line(p) + Polygon::new(vec![(14, -7), (21, 0), (14, 7), (7, 0)], s)),
        _ => anno.legend(move |p| line(p) + Cross::new((14, 0), 6, color.stroke_width(3))),
    };
}

fn draw_line<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &LinePlot,
) -> Result<(), PlotError> {
    let pts = p.series.iter().flat_map(|s| &s.points);
    let ymax = pts.clone().map(|q| q.hi.max(q.y)).fold(0.0, f64::max);
    let ymin = pts.clone().map(|q| q.lo.min(q.y)).fold(0.0, f64::min);
    let (div, unit) = unit_for(p.metric, ymax);
    // Throughput against window spans three decades: on a linear axis the
    // small windows' values all sit on zero, so such a span goes on a log
    // axis (positions are log10 of the scaled value; ticks 1-2-5).
    let minpos = pts
        .clone()
        .flat_map(|q| [q.lo, q.y])
        .filter(|v| *v > 0.0)
        .fold(f64::INFINITY, f64::min);
    let ylog = minpos.is_finite() && ymax / minpos >= 50.0;
    let fy = move |v: f64| {
        if ylog {
            (v.max(minpos) / div).log10()
        } else {
            v / div
        }
    };
    let (y0, y1) = if ylog {
        let (a, b) = ((minpos / div).log10(), (ymax / div).log10());
        (a - (b - a) * 0.04, b + (b - a) * 0.08)
    } else {
        y_range(ymin / div, ymax / div)
    };
    let xs: Vec<f64> = p.x.ticks.iter().map(|t| t.0).collect();
    let (x0, x1) = (
        xs.iter().copied().fold(f64::INFINITY, f64::min),
        xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    );
    let pad = if p.x.categorical {
        0.5
    } else if x1 > x0 {
        (x1 - x0) * 0.05
    } else {
        1.0
    };
    let (plot_area, note_area) = if p.notes.is_empty() {
        (area.clone(), None)
    } else {
        let (a, b) = area.split_vertically(area.dim_in_pixel().1.saturating_sub(26));
        (a, Some(b))
    };
    let mut chart = ChartBuilder::on(&plot_area)
        .margin_left(16)
        .margin_right(28)
        .margin_bottom(8)
        .x_label_area_size(56)
        .y_label_area_size(112)
        .build_cartesian_2d(x0 - pad..x1 + pad, y0..y1)
        .map_err(draw_err)?;
    let yfmt = |v: &f64| num(*v);
    // The x ticks are the swept values themselves (plotters would pick
    // round numbers), drawn by hand: a grid line and the value under it.
    for (x, label) in &p.x.ticks {
        chart
            .draw_series(LineSeries::new(
                [(*x, y0), (*x, y1)],
                RGBColor(0xDD, 0xDD, 0xDD).stroke_width(1),
            ))
            .map_err(draw_err)?;
        let at = rel(&plot_area, chart.backend_coord(&(*x, y0)));
        plot_area
            .draw_text(
                label,
                &text(16).pos(Pos::new(HPos::Center, VPos::Top)),
                (at.0, at.1 + 8),
            )
            .map_err(draw_err)?;
    }
    if ylog {
        let mut decade = y0.floor() as i32;
        while f64::from(decade) <= y1 {
            for m in [1.0, 2.0, 5.0] {
                let v = 10f64.powi(decade) * m;
                let y = v.log10();
                if y < y0 || y > y1 {
                    continue;
                }
                chart
                    .draw_series(LineSeries::new(
                        [(x0 - pad, y), (x1 + pad, y)],
                        RGBColor(0xDD, 0xDD, 0xDD).stroke_width(1),
                    ))
                    .map_err(draw_err)?;
                let at = rel(&plot_area, chart.backend_coord(&(x0 - pad, y)));
                plot_area
                    .draw_text(
                        &tick_label(p.metric, v * div),
                        &text(16).pos(Pos::new(HPos::Right, VPos::Center)),
                        (at.0 - 8, at.1),
                    )
                    .map_err(draw_err)?;
            }
            decade += 1;
        }
    }
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .x_desc(p.x.label.clone())
        .y_desc(format!(
            "{} ({}, {})",
            p.metric.label(),
            p.stat.name(),
            if ylog { "log scale" } else { unit }
        ))
        .axis_desc_style(text(18))
        .label_style(text(16))
        .y_label_formatter(&yfmt)
        .y_labels(if ylog { 0 } else { 8 })
        .light_line_style(RGBColor(0xF0, 0xF0, 0xF0))
        .bold_line_style(RGBColor(0xDD, 0xDD, 0xDD))
        .draw()
        .map_err(draw_err)?;
    let nser = p.series.len();
    for (i, s) in p.series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        // Series beside each other at a word's place, not on top.
        let dodge = if p.x.categorical {
            (i as f64 - (nser as f64 - 1.0) / 2.0) * (0.6 / nser.max(1) as f64)
        } else {
            0.0
        };
        let s = &Series {
            label: s.label.clone(),
            points: s
                .points
                .iter()
                .map(|q| Point {
                    x: q.x + dodge,
                    ..*q
                })
                .collect(),
        };
        // Bands of more than three series hide each other; the error bars
        // still show each one's spread.
        if s.points.len() > 1 && p.series.len() <= 3 && !p.x.categorical {
            let mut band: Vec<(f64, f64)> = s.points.iter().map(|q| (q.x, fy(q.hi))).collect();
            band.extend(s.points.iter().rev().map(|q| (q.x, fy(q.lo))));
            chart
                .draw_series(std::iter::once(Polygon::new(
                    band,
                    color.mix(0.15).filled(),
                )))
                .map_err(draw_err)?;
        }
        chart
            .draw_series(s.points.iter().map(|q| {
                ErrorBar::new_vertical(q.x, fy(q.lo), fy(q.y), fy(q.hi), color.stroke_width(1), 8)
            }))
            .map_err(draw_err)?;
        let joined = if p.x.categorical {
            Vec::new()
        } else {
            s.points.iter().map(|q| (q.x, fy(q.y))).collect()
        };
        let anno = chart
            .draw_series(LineSeries::new(joined, color.stroke_width(3)))
            .map_err(draw_err)?;
        if !s.label.is_empty() {
            legend(anno.label(s.label.clone()), i, color);
        }
        let pa = chart.plotting_area().strip_coord_spec();
        for q in &s.points {
            let at = rel(&pa, chart.backend_coord(&(q.x, fy(q.y))));
            draw_marker(&pa, i, at, color)?;
        }
    }
    if p.series.iter().any(|s| !s.label.is_empty()) {
        // The legend goes in the corner with the fewest points near it
        // (a third of the width and of the height), upper corners first.
        let (xa, xb) = (x0 - pad, x1 + pad);
        let crowd = |right: bool, top: bool| {
            p.series
                .iter()
                .flat_map(|s| &s.points)
                .filter(|q| {
                    let fx = (q.x - xa) / (xb - xa);
                    let fyv = (fy(q.y) - y0) / (y1 - y0);
                    (if right { fx > 0.6 } else { fx < 0.4 })
                        && (if top { fyv > 0.6 } else { fyv < 0.4 })
                })
                .count()
        };
        let corner = [
            (SeriesLabelPosition::UpperLeft, false, true),
            (SeriesLabelPosition::UpperRight, true, true),
            (SeriesLabelPosition::LowerRight, true, false),
            (SeriesLabelPosition::LowerLeft, false, false),
        ]
        .into_iter()
        .min_by_key(|(_, r, t)| crowd(*r, *t))
        .map_or(SeriesLabelPosition::UpperLeft, |c| c.0);
        chart
            .configure_series_labels()
            .position(corner)
            .label_font(text(16))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(0x99, 0x99, 0x99))
            .draw()
            .map_err(draw_err)?;
    }
    if let Some(na) = note_area {
        na.draw_text(
            &format!(
                "line: {}; band and bars: p10–p90 of the repetitions; {}",
                p.stat.name(),
                p.notes.join("; ")
            ),
            &text(13).color(&RGBColor(0x40, 0x40, 0x40)),
            (102, 4),
        )
        .map_err(draw_err)?;
    }
    Ok(())
}

fn draw_heatmap<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    h: &Heatmap,
) -> Result<(), PlotError> {
    let all: Vec<f64> = h
        .panels
        .iter()
        .flat_map(|p| p.cells.iter().flatten().flatten().copied())
        .collect();
    let lo = all.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = all.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (div, unit) = unit_for(h.metric, hi);
    // Colours on a log scale when the values span decades (throughput
    // against window), else the small windows' cells all look alike.
    let logc = lo > 0.0 && hi / lo >= 50.0;
    let weights: Vec<u32> = h
        .panels
        .iter()
        .map(|p| p.rows.len().max(2) as u32 * 46 + 70)
        .collect();
    let total: u32 = weights.iter().sum();
    let (_, ah) = area.dim_in_pixel();
    let mut rest = area.clone();
    for (i, p) in h.panels.iter().enumerate() {
        let this_h = if i + 1 == h.panels.len() {
            rest.dim_in_pixel().1
        } else {
            ah * weights[i] / total.max(1)
        };
        let (panel, below) = rest.split_vertically(this_h);
        rest = below;
        let scale = if logc { ", log colour scale" } else { "" };
        let title = if p.label.is_empty() {
            format!("{} ({}, {unit}{scale})", h.metric.label(), h.stat.name())
        } else {
            format!(
                "{}: {} ({}, {unit}{scale})",
                p.label,
                h.metric.label(),
                h.stat.name()
            )
        };
        let nr = p.rows.len();
        let nc = p.columns.len();
        let mut chart = ChartBuilder::on(&panel)
            .caption(title, text(16))
            .margin_left(16)
            .margin_right(120)
            .x_label_area_size(50)
            .y_label_area_size(96)
            .build_cartesian_2d(0f64..nc as f64, 0f64..nr as f64)
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc(h.x_param.clone())
            .y_desc(h.y_param.clone())
            .axis_desc_style(text(18))
            .x_labels(0)
            .y_labels(0)
            .draw()
            .map_err(draw_err)?;
        // Each value under its column and beside its row, by hand: plotters
        // would label the cells' edges, not their middles.
        for (c, label) in p.columns.iter().enumerate() {
            let at = rel(&panel, chart.backend_coord(&(c as f64 + 0.5, 0.0)));
            panel
                .draw_text(
                    label,
                    &text(16).pos(Pos::new(HPos::Center, VPos::Top)),
                    (at.0, at.1 + 8),
                )
                .map_err(draw_err)?;
        }
        for (r, label) in p.rows.iter().enumerate() {
            let y = (nr - 1 - r) as f64 + 0.5;
            let at = rel(&panel, chart.backend_coord(&(0.0, y)));
            panel
                .draw_text(
                    label,
                    &text(16).pos(Pos::new(HPos::Right, VPos::Center)),
                    (at.0 - 8, at.1),
                )
                .map_err(draw_err)?;
        }
        for (r, row) in p.cells.iter().enumerate() {
            let y = (nr - 1 - r) as f64;
            for (c, v) in row.iter().enumerate() {
                let x = c as f64;
                let (fill, label) = match v {
                    Some(v) => {
                        let t = if logc {
                            (v.ln() - lo.ln()) / (hi.ln() - lo.ln())
                        } else if hi > lo {
                            (v - lo) / (hi - lo)
                        } else {
                            0.5
                        };
                        (ViridisRGB::get_color_normalized(t, 0.0, 1.0), num(v / div))
                    }
                    None => (RGBColor(0xEE, 0xEE, 0xEE), "-".to_string()),
                };
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(x, y), (x + 1.0, y + 1.0)],
                        fill.filled(),
                    )))
                    .map_err(draw_err)?;
                let ink = if luminance(fill) > 0.45 { BLACK } else { WHITE };
                let at = rel(&panel, chart.backend_coord(&(x + 0.5, y + 0.5)));
                panel
                    .draw_text(
                        &label,
                        &text(14)
                            .color(&ink)
                            .pos(Pos::new(HPos::Center, VPos::Center)),
                        at,
                    )
                    .map_err(draw_err)?;
            }
        }
        // The colour scale beside the grid.
        let (pw, _) = panel.dim_in_pixel();
        let top = rel(&panel, chart.backend_coord(&(nc as f64, nr as f64)));
        let bot = rel(&panel, chart.backend_coord(&(nc as f64, 0.0)));
        let x0 = (pw as i32 - 100).max(top.0 + 16);
        let steps = 32;
        for s in 0..steps {
            let t = f64::from(s) / f64::from(steps);
            let ya = bot.1 - ((bot.1 - top.1) as f64 * (t + 1.0 / f64::from(steps))) as i32;
            let yb = bot.1 - ((bot.1 - top.1) as f64 * t) as i32;
            panel
                .draw(&Rectangle::new(
                    [(x0, ya), (x0 + 16, yb)],
                    ViridisRGB::get_color_normalized(t, 0.0, 1.0).filled(),
                ))
                .map_err(draw_err)?;
        }
        for (v, y) in [(hi, top.1), (lo, bot.1)] {
            panel
                .draw_text(
                    &format!("{} {unit}", num(v / div)),
                    &text(13).pos(Pos::new(HPos::Left, VPos::Center)),
                    (x0 + 22, y),
                )
                .map_err(draw_err)?;
        }
    }
    Ok(())
}

fn luminance(c: RGBColor) -> f64 {
    (0.2126 * f64::from(c.0) + 0.7152 * f64::from(c.1) + 0.0722 * f64::from(c.2)) / 255.0
}

fn draw_history<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    h: &History,
) -> Result<(), PlotError> {
    let pts = h.series.iter().flat_map(|s| &s.1);
    let t0 = pts.clone().map(|b| b.t).fold(f64::INFINITY, f64::min);
    let t1 = pts.clone().map(|b| b.t).fold(f64::NEG_INFINITY, f64::max);
    let t0 = h.annotations.iter().map(|a| a.0).fold(t0, f64::min);
    let t1 = h.annotations.iter().map(|a| a.0).fold(t1, f64::max);
    let span = (t1 - t0).max(60.0);
    let (x0, x1) = (t0 - span * 0.04, t1 + span * 0.04);
    let ymax = pts.clone().map(|b| b.hi.max(b.y)).fold(0.0, f64::max);
    let (div, unit) = unit_for(h.metric, ymax);
    let (y0, y1) = y_range(0.0, ymax / div * 1.12);
    let mut chart = ChartBuilder::on(area)
        .margin_left(16)
        .margin_right(28)
        .margin_bottom(8)
        .x_label_area_size(56)
        .y_label_area_size(112)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(draw_err)?;
    let fmt = if span > 3.0 * 86_400.0 {
        "%Y-%m-%d"
    } else if span > 86_400.0 {
        "%m-%d %H:%M"
    } else {
        "%H:%M:%S"
    };
    let xfmt = move |v: &f64| {
        DateTime::<Utc>::from_timestamp(*v as i64, 0)
            .map(|t| t.format(fmt).to_string())
            .unwrap_or_default()
    };
    let yfmt = |v: &f64| num(*v);
    let what = if h.bucket_s == 0.0 {
        "each run".to_string()
    } else {
        format!("median per {}", bucket_name(h.bucket_s))
    };
    chart
        .configure_mesh()
        .x_desc("time (UTC)")
        .y_desc(format!("{} ({what}, {unit})", h.metric.label()))
        .axis_desc_style(text(18))
        .label_style(text(16))
        .x_labels(6)
        .y_labels(8)
        .x_label_formatter(&xfmt)
        .y_label_formatter(&yfmt)
        .light_line_style(RGBColor(0xF0, 0xF0, 0xF0))
        .bold_line_style(RGBColor(0xDD, 0xDD, 0xDD))
        .draw()
        .map_err(draw_err)?;
    for (i, (path, b)) in h.series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        if h.bucket_s > 0.0 && b.len() > 1 {
            let mut band: Vec<(f64, f64)> = b.iter().map(|q| (q.t, q.hi / div)).collect();
            band.extend(b.iter().rev().map(|q| (q.t, q.lo / div)));
            chart
                .draw_series(std::iter::once(Polygon::new(
                    band,
                    color.mix(0.15).filled(),
                )))
                .map_err(draw_err)?;
        }
        let anno = chart
            .draw_series(LineSeries::new(
                b.iter().map(|q| (q.t, q.y / div)),
                color.mix(0.6).stroke_width(2),
            ))
            .map_err(draw_err)?;
        if h.series.len() > 1 {
            legend(anno.label(path.clone()), i, color);
        }
        let pa = chart.plotting_area().strip_coord_spec();
        for q in b {
            let at = rel(&pa, chart.backend_coord(&(q.t, q.y / div)));
            draw_marker(&pa, i, at, color)?;
        }
    }
    // Annotations: a dashed vertical line and the note at its top.
    for (k, (t, note)) in h.annotations.iter().enumerate() {
        chart
            .draw_series(DashedLineSeries::new(
                [(*t, y0), (*t, y1)],
                6,
                4,
                BLACK.stroke_width(2),
            ))
            .map_err(draw_err)?;
        let pa = chart.plotting_area().strip_coord_spec();
        let at = rel(&pa, chart.backend_coord(&(*t, y1)));
        pa.draw(&TriangleMarker::new((at.0, at.1 + 6), 7, BLACK.filled()))
            .map_err(draw_err)?;
        let (pw, _) = pa.dim_in_pixel();
        let right = at.0 as u32 + 8 + 8 * note.chars().count() as u32 > pw;
        let pos = Pos::new(if right { HPos::Right } else { HPos::Left }, VPos::Top);
        pa.draw_text(
            &clip(note, 70),
            &text(14).pos(pos),
            (
                if right { at.0 - 8 } else { at.0 + 8 },
                at.1 + 14 + 18 * (k as i32 % 3),
            ),
        )
        .map_err(draw_err)?;
    }
    if h.series.len() > 1 {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .label_font(text(16))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(0x99, 0x99, 0x99))
            .draw()
            .map_err(draw_err)?;
    }
    Ok(())
}

fn bucket_name(s: f64) -> &'static str {
    match s as u64 {
        60 => "minute",
        600 => "10 minutes",
        3600 => "hour",
        21_600 => "6 hours",
        86_400 => "day",
        604_800 => "week",
        _ => "30 days",
    }
}

fn draw_seed<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    s: &SeedPlot,
) -> Result<(), PlotError> {
    let n = s.bars.len();
    let (legend, body) = area.split_vertically(30);
    let mut x = 16;
    for (label, color) in [("source document", SEED_GREY), ("fatpipe", PALETTE[0])] {
        legend
            .draw(&Rectangle::new([(x, 8), (x + 18, 22)], color.filled()))
            .map_err(draw_err)?;
        legend
            .draw_text(label, &text(14), (x + 24, 8))
            .map_err(draw_err)?;
        x += 40 + 9 * label.len() as i32;
    }
    legend
        .draw_text(
            "each pair scaled to the larger of its two values",
            &text(13).color(&RGBColor(0x40, 0x40, 0x40)),
            (x + 20, 9),
        )
        .map_err(draw_err)?;
    let mut chart = ChartBuilder::on(&body)
        .margin_left(16)
        .margin_right(24)
        .x_label_area_size(44)
        .y_label_area_size(0)
        .build_cartesian_2d(0f64..135f64, 0f64..n as f64)
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc("percent of the larger value")
        .axis_desc_style(text(15))
        .label_style(text(13))
        .x_labels(8)
        .x_label_formatter(&|v| {
            if *v <= 100.0 {
                format!("{v:.0}")
            } else {
                String::new()
            }
        })
        .light_line_style(RGBColor(0xF4, 0xF4, 0xF4))
        .bold_line_style(RGBColor(0xE4, 0xE4, 0xE4))
        .draw()
        .map_err(draw_err)?;
    let pa = chart.plotting_area().strip_coord_spec();
    for (i, b) in s.bars.iter().enumerate() {
        let y = (n - 1 - i) as f64;
        let big = b.ours.map_or(b.seed.abs(), |o| o.abs().max(b.seed.abs()));
        let scale = |v: f64| {
            if big > 0.0 {
                v.abs() / big * 100.0
            } else {
                0.0
            }
        };
        let lt = rel(&pa, chart.backend_coord(&(0.0, y + 1.0)));
        pa.draw_text(&clip(&b.label, 100), &text(14), (lt.0 + 4, lt.1 + 4))
            .map_err(draw_err)?;
        for (k, (v, t, color)) in [
            (Some(b.seed), &b.seed_text, SEED_GREY),
            (b.ours, &b.ours_text, PALETTE[0]),
        ]
        .into_iter()
        .enumerate()
        {
            let (ya, yb) = if k == 0 {
                (y + 0.46, y + 0.64)
            } else {
                (y + 0.22, y + 0.40)
            };
            let w = v.map_or(0.0, scale);
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(0.0, ya), (w, yb)],
                    color.filled(),
                )))
                .map_err(draw_err)?;
            let at = rel(&pa, chart.backend_coord(&(w, (ya + yb) / 2.0)));
            pa.draw_text(
                t,
                &text(13).pos(Pos::new(HPos::Left, VPos::Center)),
                (at.0 + 6, at.1),
            )
            .map_err(draw_err)?;
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use chrono::TimeZone;
    use fatpipe_archive::{Metrics, RunKind, SweepRef};
    use std::collections::BTreeMap as Map;

    fn run(cell: &str, rep: u32, at: DateTime<Utc>, bps: f64) -> Measurement {
        Measurement {
            id: 0,
            kind: RunKind::Test,
            started: at,
            ok: true,
            sweep: Some(SweepRef {
                sweep: "s".into(),
                cell: cell.into(),
                repetition: rep,
            }),
            path: "lab:korea→seattle".into(),
            metrics: Metrics {
                throughput_bps: Some(bps),
                rtt_avg_us: Some(93_000.0),
                ..Metrics::default()
            },
        }
    }

    /// window × mtu × protocol, three repetitions; throughput rises with
    /// the window until it meets the link, jumbo frames a little higher,
    /// UDP flat.
    pub(crate) fn sweep() -> Vec<Measurement> {
        let t0 = Utc.with_ymd_and_hms(2026, 11, 1, 0, 0, 0).single().unwrap();
        let mut v = Vec::new();
        for (i, w) in ["64K", "256K", "1M", "4M", "16M", "64M"].iter().enumerate() {
            for mtu in [1500, 9000] {
                for proto in ["tcp", "udp"] {
                    for rep in 0..3u32 {
                        let tcp = (2.2e6 * 4f64.powi(i as i32)).min(940e6);
                        let bps = if proto == "udp" { 900e6 } else { tcp }
                            * if mtu == 9000 { 1.02 } else { 1.0 }
                            * (1.0 + 0.03 * f64::from(rep));
                        let key = format!(
                            "{{\"mtu\":{mtu},\"protocol\":\"{proto}\",\"window\":\"{w}\"}}"
                        );
                        v.push(run(
                            &key,
                            rep,
                            t0 + chrono::Duration::minutes(v.len() as i64),
                            bps,
                        ));
                    }
                }
            }
        }
        v
    }

    fn caption(t: &str) -> Caption {
        Caption {
            title: t.into(),
            context: "path lab:korea→seattle · link 1 Gbit/s, 93 ms · host dtn1".into(),
        }
    }

    /// The SVG's structure for review: how many of each element, and every
    /// text in order. Coordinates are left out, so a diff shows what a
    /// person would notice (a label, a series, a marker) rather than a
    /// one-pixel move.
    pub(crate) fn outline(svg: &str) -> String {
        let mut counts: Map<String, usize> = Map::new();
        let mut texts = Vec::new();
        let mut rest = svg;
        while let Some(i) = rest.find('<') {
            rest = &rest[i + 1..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            if name.is_empty() {
                continue;
            }
            *counts.entry(name.clone()).or_default() += 1;
            if name == "text" {
                if let (Some(a), Some(b)) = (rest.find('>'), rest.find("</text>")) {
                    if a < b {
                        texts.push(rest[a + 1..b].trim().to_string());
                    }
                }
            }
        }
        let mut out = String::new();
        for (k, n) in counts {
            out.push_str(&format!("<{k}> × {n}\n"));
        }
        for t in texts {
            out.push_str(&format!("text: {t}\n"));
        }
        out
    }

    /// Segments of an annotation's dashed line in `svg`.
    pub(crate) fn dashes(svg: &str) -> usize {
        svg.matches("stroke=\"#000000\" stroke-width=\"2\"").count()
    }

    fn texts(svg: &str) -> Vec<String> {
        outline(svg)
            .lines()
            .filter_map(|l| l.strip_prefix("text: ").map(str::to_string))
            .collect()
    }

    fn line() -> Plot {
        let runs: Vec<Measurement> = sweep()
            .into_iter()
            .filter(|m| m.sweep.as_ref().is_some_and(|s| s.cell.contains("tcp")))
            .collect();
        Plot::Line(
            line_data(
                &runs,
                "window",
                &["mtu".to_string()],
                Metric::Throughput,
                Stat::Median,
                caption("throughput against window"),
            )
            .unwrap(),
        )
    }

    #[test]
    fn sizes_print_as_swept_windows_round_and_datagram_lengths_exact() {
        let labels: Vec<String> = [
            64.0,
            1472.0,
            4096.0,
            8972.0,
            65507.0,
            65536.0,
            268_435_456.0,
        ]
        .into_iter()
        .map(size_label)
        .collect();
        assert_eq!(
            labels,
            ["64 B", "1472 B", "4 KB", "8972 B", "65507 B", "64 KB", "256 MB"]
        );
        assert_eq!(size_label(1_500_000.0), "1.50 MB");
    }

    #[test]
    fn a_line_plot_has_a_log_window_axis_with_the_swept_sizes() {
        let Plot::Line(p) = line() else { panic!() };
        assert!(p.x.log);
        assert_eq!(p.x.label, "window (bytes, log scale)");
        let labels: Vec<&str> = p.x.ticks.iter().map(|t| t.1.as_str()).collect();
        assert_eq!(
            labels,
            ["64 KB", "256 KB", "1 MB", "4 MB", "16 MB", "64 MB"]
        );
        // Evenly spaced: each window is 4× the last.
        assert!((p.x.ticks[1].0 - p.x.ticks[0].0 - 2.0).abs() < 1e-9);
        assert_eq!(p.series.len(), 2);
        assert_eq!(p.series[0].label, "mtu=1500");
        assert_eq!(p.series[1].label, "mtu=9000");
        // Median of 3 repetitions and their spread.
        let q = p.series[0].points[0];
        assert!((q.y - 2.2e6 * 1.03).abs() < 1.0);
        assert!(q.lo < q.y && q.y < q.hi);
        assert_eq!(q.n, 3);
        assert!(p.notes.is_empty(), "{:?}", p.notes);
    }

    #[test]
    fn a_line_plot_draws_axes_with_units_a_legend_and_every_series() {
        let svg = line().svg().unwrap();
        let t = texts(&svg);
        for want in [
            "throughput against window",
            "window (bytes, log scale)",
            "throughput (median, log scale)",
            "2 Mbit/s",
            "1 Gbit/s",
            "64 KB",
            "64 MB",
            "mtu=1500",
            "mtu=9000",
        ] {
            assert!(t.iter().any(|x| x == want), "{want:?} missing from {t:?}");
        }
        // Each series in its own colour: a line of 3 px in that colour.
        for c in &PALETTE[..2] {
            let hex = format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2);
            assert!(svg.contains(&hex), "{hex} missing");
        }
        assert!(!svg.contains(&format!(
            "#{:02X}{:02X}{:02X}",
            PALETTE[2].0, PALETTE[2].1, PALETTE[2].2
        )));
    }

    #[test]
    fn a_parameter_not_swept_is_one_clear_error() {
        let e = line_data(
            &sweep(),
            "streams",
            &[],
            Metric::Throughput,
            Stat::Median,
            caption("x"),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "plot: 'streams' is not a parameter of these runs (the sweep's parameters are: mtu, protocol, window)"
        );
    }

    #[test]
    fn a_hidden_parameter_is_pooled_and_said() {
        let p = line_data(
            &sweep(),
            "window",
            &[],
            Metric::Throughput,
            Stat::Median,
            caption("x"),
        )
        .unwrap();
        assert_eq!(p.notes, ["pooled over mtu, protocol"]);
    }

    fn heat() -> Plot {
        Plot::Heatmap(
            heatmap_data(
                &sweep(),
                "window",
                "mtu",
                &["protocol".to_string()],
                Metric::Throughput,
                Stat::Median,
                caption("throughput, window × mtu"),
            )
            .unwrap(),
        )
    }

    #[test]
    fn a_heatmap_has_one_panel_per_split_with_values_in_cells() {
        let Plot::Heatmap(h) = heat() else { panic!() };
        assert_eq!(h.panels.len(), 2);
        assert_eq!(h.panels[0].label, "protocol=tcp");
        assert_eq!(h.panels[0].rows[0], "64 MB", "largest window on top");
        assert_eq!(h.panels[0].columns, ["1500", "9000"]);
        let svg = heat().svg().unwrap();
        let t = texts(&svg);
        assert!(
            t.iter()
                .any(|x| x == "protocol=udp: throughput (median, Mbit/s, log colour scale)"),
            "{t:?}"
        );
        assert!(t.iter().any(|x| x == "window"));
        assert!(t.iter().any(|x| x == "mtu"));
        assert!(t.iter().any(|x| x == "2.27"), "a cell's value: {t:?}");
    }

    fn history() -> Plot {
        let t0 = Utc.with_ymd_and_hms(2026, 9, 1, 0, 0, 0).single().unwrap();
        let runs: Vec<Measurement> = (0..60)
            .map(|d| {
                let bps = if d < 30 { 88e6 } else { 180e6 } + f64::from(d % 5) * 1e6;
                run(
                    "{}",
                    0,
                    t0 + chrono::Duration::hours(12 * i64::from(d)),
                    bps,
                )
            })
            .collect();
        let note = Annotation {
            id: Some(1),
            path: "lab:korea→seattle".into(),
            at: t0 + chrono::Duration::days(15),
            note: "link upgraded to 622 Mbit/s".into(),
        };
        Plot::History(history_data(&runs, &[note], Metric::Throughput, caption("history")).unwrap())
    }

    #[test]
    fn a_history_marks_the_annotation() {
        let Plot::History(h) = history() else {
            panic!()
        };
        assert_eq!(h.bucket_s, 0.0, "60 runs are drawn one by one");
        assert_eq!(h.series.len(), 1);
        assert_eq!(h.annotations.len(), 1);
        let svg = history().svg().unwrap();
        let t = texts(&svg);
        assert!(
            t.iter().any(|x| x == "link upgraded to 622 Mbit/s"),
            "{t:?}"
        );
        assert!(t.iter().any(|x| x == "time (UTC)"));
        assert!(t.iter().any(|x| x.starts_with("2026-09-")), "{t:?}");
        // The marker: a dashed line, drawn as short black segments of
        // width 2 (the axes and ticks are width 1), all at one x.
        assert!(dashes(&svg) >= 10, "no dashed marker: {}", dashes(&svg));
    }

    #[test]
    fn a_long_history_is_bucketed() {
        let t0 = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).single().unwrap();
        let runs: Vec<Measurement> = (0..5000)
            .map(|i| {
                run(
                    "{}",
                    0,
                    t0 + chrono::Duration::minutes(90 * i64::from(i)),
                    1e9,
                )
            })
            .collect();
        let h = history_data(&runs, &[], Metric::Throughput, caption("h")).unwrap();
        assert_eq!(
            dashes(&Plot::History(h.clone()).svg().unwrap()),
            0,
            "no note, no marker"
        );
        // 312 days: a day would make 312 buckets, a week 45.
        assert_eq!(h.bucket_s, 7.0 * 86_400.0);
        assert!(h.series[0].1.len() < 200);
        assert_eq!(h.series[0].1.iter().map(|b| b.n).sum::<usize>(), 5000);
    }

    fn seed() -> Plot {
        let fig = |cell: &[(&str, Value)], stat: &str, value: f64| SeedFigure {
            cell: cell
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            metric: "throughput".into(),
            stat: stat.into(),
            ratio_to: None,
            value,
            source: "the seed".into(),
            note: None,
        };
        Plot::Seed(
            seed_data(
                &sweep(),
                &[
                    fig(
                        &[
                            ("window", Value::from("64M")),
                            ("protocol", Value::from("tcp")),
                        ],
                        "max",
                        800e6,
                    ),
                    fig(&[("window", Value::from("64K"))], "median", 2.5e6),
                ],
                caption("seed"),
            )
            .unwrap(),
        )
    }

    #[test]
    fn the_seed_figures_are_drawn_beside_ours() {
        let svg = seed().svg().unwrap();
        let t = texts(&svg);
        assert!(t.iter().any(|x| x == "800 Mbit/s"), "{t:?}");
        assert!(t.iter().any(|x| x == "source document"));
        assert!(t.iter().any(|x| x == "fatpipe"));
        assert!(svg.contains("#808080"));
    }

    #[test]
    fn snapshots_of_every_kind() {
        insta::assert_snapshot!("line", outline(&line().svg().unwrap()));
        insta::assert_snapshot!("heatmap", outline(&heat().svg().unwrap()));
        insta::assert_snapshot!("history", outline(&history().svg().unwrap()));
        insta::assert_snapshot!("seed", outline(&seed().svg().unwrap()));
    }

    /// Not a check: `FATPIPE_PLOT_DUMP=DIR cargo test -p fatpipe-report --
    /// --ignored dump` writes every kind as SVG and PNG, to look at.
    #[test]
    #[ignore = "writes files to look at; run with --ignored"]
    fn dump_for_people() {
        let Ok(dir) = std::env::var("FATPIPE_PLOT_DUMP") else {
            return;
        };
        for (name, p) in [
            ("line", line()),
            ("heatmap", heat()),
            ("history", history()),
            ("seed", seed()),
        ] {
            let d = Path::new(&dir);
            std::fs::write(d.join(format!("{name}.svg")), p.svg().unwrap()).unwrap();
            p.png(&d.join(format!("{name}.png"))).unwrap();
        }
    }
}
