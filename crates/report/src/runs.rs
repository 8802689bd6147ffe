//! Stored runs (by id, or the median run of each cell) drawn over time:
//! what `fatpipe report --run ID… --plot timeseries|cdf` and the HTML
//! report's "over time" section show.
//!
//! The archive keeps each run's result document verbatim; this module
//! parses the documents ([`TestReport`], [`CopyReport`]), names each run
//! for a legend (its id, its sweep cell's values, its streams) and hands
//! them to the recipes in [`crate::timeseries`]. Tests go on one plot,
//! overlaid; copies on another; a lab link's rate is the copy's capacity
//! line.

use fatpipe_archive::{Measurement, Run, RunKind};
use fatpipe_schema::copy::CopyReport;
use fatpipe_schema::test::TestReport;
use serde_json::Value;

use crate::plot::{Caption, Plot, PlotError};
use crate::timeseries;

/// Which plot of runs over time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeKind {
    /// Each test's intervals (and each copy's progress) over time.
    Timeseries,
    /// The distribution of the tests' per-interval figures.
    Cdf,
}

impl TimeKind {
    /// `timeseries` or `cdf`.
    pub fn parse(s: &str) -> Option<TimeKind> {
        match s {
            "timeseries" => Some(TimeKind::Timeseries),
            "cdf" => Some(TimeKind::Cdf),
            _ => None,
        }
    }
}

/// The plots of `runs` over time, each with a caption for a page: for
/// [`TimeKind::Timeseries`] the tests overlaid on one plot and the copies
/// on another (whichever there are); for [`TimeKind::Cdf`] the tests'.
/// `context` is the subtitle (path, link, host).
pub fn plots(
    runs: &[Run],
    kind: TimeKind,
    context: &str,
) -> Result<Vec<(Plot, String)>, PlotError> {
    let mut tests: Vec<(String, TestReport)> = Vec::new();
    let mut copies: Vec<(String, CopyReport)> = Vec::new();
    let mut capacity = None;
    for r in runs {
        let id =
            r.id.map_or_else(|| "run".to_string(), |i| format!("run {i}"));
        let Some(doc) = &r.document else {
            return Err(PlotError::Empty(format!(
                "plot: {id} has no result document (it failed before it had one)"
            )));
        };
        let bad = |e: serde_json::Error| {
            PlotError::Empty(format!(
                "plot: {id}'s document cannot be read as a {} result: {e}",
                r.kind.as_str()
            ))
        };
        match r.kind {
            RunKind::Test => {
                let t: TestReport = doc.parse().map_err(bad)?;
                tests.push((label(r, &id, Some(streams_of(&t))), t));
            }
            RunKind::Copy => {
                let c: CopyReport = doc.parse().map_err(bad)?;
                capacity = capacity.or_else(|| link_rate(r));
                copies.push((label(r, &id, None), c));
            }
            RunKind::Path => {
                return Err(PlotError::Empty(format!(
                    "plot: {id} is a path probe: it has no figures over time"
                )))
            }
        }
    }
    let caption = |title: String| Caption {
        title,
        context: context.to_string(),
    };
    let mut out = Vec::new();
    let refs: Vec<(String, &TestReport)> = tests.iter().map(|(l, t)| (l.clone(), t)).collect();
    match kind {
        TimeKind::Timeseries => {
            if !refs.is_empty() {
                let title = if refs.len() == 1 {
                    format!("{} over time", refs[0].0)
                } else {
                    format!("{} tests over time", refs.len())
                };
                out.push((
                    Plot::Timeseries(timeseries::test_data(&refs, caption(title))?),
                    "per interval: the sum of the streams; per stream their median, middle half and min–max; dashed: the adjuster's changes and the ramp to 90 % of the final rate (reasons under the plot); grey: warm-up left out of the totals.".to_string(),
                ));
            }
            if !copies.is_empty() {
                let crefs: Vec<(String, &CopyReport)> =
                    copies.iter().map(|(l, c)| (l.clone(), c)).collect();
                let title = if crefs.len() == 1 {
                    format!("{}: bytes over time", crefs[0].0)
                } else {
                    format!("{} copies: bytes over time", crefs.len())
                };
                let mut p = timeseries::copy_data(&crefs, capacity, caption(title))?;
                p.first_colour = refs.len();
                out.push((
                    Plot::Progress(p),
                    "bytes moved since the command started; dashed grey: what the path's capacity would have moved from the first byte; dotted: the copy's timeline.".to_string(),
                ));
            }
        }
        TimeKind::Cdf => {
            if let Some((_, c)) = copies.first() {
                return Err(PlotError::Empty(format!(
                    "plot: a CDF is of tests' intervals, and the copy to {} has none; use --plot timeseries",
                    c.server
                )));
            }
            out.push((
                Plot::Cdf(timeseries::cdf_data(
                    &refs,
                    caption("per-interval throughput and RTT".into()),
                )?),
                "the fraction of measured intervals (warm-up left out) at or below each throughput, and of each stream's RTT in them.".to_string(),
            ));
        }
    }
    Ok(out)
}

/// The run of each cell whose throughput is the median of its cell's
/// successful runs (the lower middle one of an even count), in the order
/// the cells first appear; at most `max` cells. Runs outside sweeps are
/// one cell per path and command.
pub fn median_runs(runs: &[Measurement], max: usize) -> Vec<i64> {
    // Cells in first-seen order, found by key: an archive may hold
    // 100,000 runs of a thousand cells.
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut cells: Vec<Vec<&Measurement>> = Vec::new();
    for m in runs.iter().filter(|m| m.ok && m.kind != RunKind::Path) {
        let key = match &m.sweep {
            Some(s) => format!("{}\u{0}{}", s.sweep, s.cell),
            None => format!("{}\u{0}{}", m.path, m.kind.as_str()),
        };
        let i = *index.entry(key).or_insert_with(|| {
            cells.push(Vec::new());
            cells.len() - 1
        });
        cells[i].push(m);
    }
    cells
        .into_iter()
        .take(max)
        .filter_map(|mut ms| {
            ms.sort_by(|a, b| {
                let v = |m: &Measurement| m.metrics.throughput_bps.unwrap_or(0.0);
                v(a).total_cmp(&v(b))
            });
            ms.get((ms.len() - 1) / 2).map(|m| m.id)
        })
        .collect()
}

/// `run 12: step=2 test, auto-tuned (4 streams)`.
fn label(r: &Run, id: &str, streams: Option<String>) -> String {
    let cell = r
        .sweep
        .as_ref()
        .and_then(|s| serde_json::from_str::<Value>(&s.cell).ok())
        .and_then(|v| {
            let o = v.as_object()?;
            let parts: Vec<String> = o
                .iter()
                .map(|(k, v)| {
                    // A demo's or a sweep's lone `step` names itself.
                    if o.len() == 1 && k == "step" {
                        crate::tables::show(v)
                    } else {
                        format!("{k}={}", crate::tables::show(v))
                    }
                })
                .collect();
            (!parts.is_empty()).then(|| parts.join(" "))
        });
    let mut out = match cell {
        Some(c) => format!("{id}: {c}"),
        None => id.to_string(),
    };
    if let Some(s) = streams {
        out.push_str(&format!(" ({s})"));
    }
    out
}

/// `1 stream`, `4 streams`, `4→8 streams` when the adjuster added some.
fn streams_of(t: &TestReport) -> String {
    let first = t.start.streams;
    let last = t
        .start
        .auto
        .as_ref()
        .and_then(|a| a.decisions.last())
        .map_or(first, |d| d.streams);
    match (first, last) {
        (1, 1) => "1 stream".into(),
        (a, b) if a == b => format!("{a} streams"),
        (a, b) => format!("{a}→{b} streams"),
    }
}

/// A lab link's rate (bit/s), the copy's capacity line.
fn link_rate(r: &Run) -> Option<f64> {
    r.link
        .as_ref()?
        .get("rate_up")?
        .as_f64()
        .filter(|v| *v > 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeseries::tests::{copy, tcp};
    use chrono::{TimeZone, Utc};
    use fatpipe_archive::{Document, HostFacts, Metrics, SweepRef};

    fn stored(id: i64, kind: RunKind, doc: Option<String>, cell: &str) -> Run {
        let t = Utc
            .with_ymd_and_hms(2026, 11, 27, 12, 0, 0)
            .single()
            .unwrap();
        let mut r = Run::new(kind, "lab:demo", HostFacts::default(), t, t);
        r.id = Some(id);
        r.document = doc.map(|d| Document::from_json(d).unwrap());
        r.sweep = Some(SweepRef {
            sweep: "demo".into(),
            cell: serde_json::json!({ "step": cell }).to_string(),
            repetition: 0,
        });
        r.link = Some(serde_json::json!({"rate_up": 1e9}));
        r
    }

    fn demo() -> Vec<Run> {
        fn j<T: serde::Serialize>(v: &T) -> String {
            serde_json::to_string(v).unwrap()
        }
        vec![
            stored(
                1,
                RunKind::Test,
                Some(j(&tcp(1, 10, false))),
                "1 test, default settings",
            ),
            stored(
                2,
                RunKind::Test,
                Some(j(&tcp(4, 10, true))),
                "2 test, auto-tuned",
            ),
            stored(3, RunKind::Copy, Some(j(&copy(true))), "3 copy, auto-tuned"),
        ]
    }

    #[test]
    fn tests_overlay_on_one_plot_and_copies_on_another() {
        let p = plots(&demo(), TimeKind::Timeseries, "path lab:demo").unwrap();
        assert_eq!(p.len(), 2);
        let Plot::Timeseries(t) = &p[0].0 else {
            panic!("first: the tests")
        };
        assert_eq!(
            t.runs,
            [
                "run 1: 1 test, default settings (1 stream)",
                "run 2: 2 test, auto-tuned (4→8 streams)"
            ]
        );
        assert_eq!(t.caption.title, "2 tests over time");
        assert_eq!(t.caption.context, "path lab:demo");
        let Plot::Progress(c) = &p[1].0 else {
            panic!("second: the copy")
        };
        assert_eq!(c.runs[0].label, "run 3: 3 copy, auto-tuned");
        assert_eq!(c.first_colour, 2, "after the two tests' colours");
        assert_eq!(c.runs[0].capacity, Some((1.2, 1e9)), "the lab link's rate");
    }

    #[test]
    fn what_cannot_be_drawn_is_one_clear_error() {
        let mut runs = demo();
        let e = plots(&runs, TimeKind::Cdf, "").unwrap_err();
        assert!(e.to_string().contains("use --plot timeseries"), "{e}");
        runs[0].document = None;
        let e = plots(&runs[..1], TimeKind::Timeseries, "").unwrap_err();
        assert_eq!(
            e.to_string(),
            "plot: run 1 has no result document (it failed before it had one)"
        );
        runs[1].document = Some(Document::from_json("{\"schema\":\"fatpipe.test\"}").unwrap());
        let e = plots(&runs[1..2], TimeKind::Timeseries, "").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("plot: run 2's document cannot be read as a test result"),
            "{e}"
        );
        assert_eq!(TimeKind::parse("cdf"), Some(TimeKind::Cdf));
        assert_eq!(TimeKind::parse("line"), None);
    }

    #[test]
    fn the_median_run_of_each_cell_is_chosen() {
        let t = Utc
            .with_ymd_and_hms(2026, 11, 27, 12, 0, 0)
            .single()
            .unwrap();
        let m = |id: i64, cell: &str, bps: f64, ok: bool| Measurement {
            id,
            kind: RunKind::Test,
            started: t,
            ok,
            sweep: Some(SweepRef {
                sweep: "s".into(),
                cell: cell.into(),
                repetition: 0,
            }),
            path: "p".into(),
            metrics: Metrics {
                throughput_bps: Some(bps),
                ..Metrics::default()
            },
        };
        let runs = [
            m(1, "a", 300.0, true),
            m(2, "a", 100.0, true),
            m(3, "b", 5.0, true),
            m(4, "a", 200.0, true),
            m(5, "a", 1.0, false),
            m(6, "c", 7.0, true),
        ];
        assert_eq!(median_runs(&runs, 10), [4, 3, 6]);
        assert_eq!(median_runs(&runs, 2), [4, 3]);
    }
}
