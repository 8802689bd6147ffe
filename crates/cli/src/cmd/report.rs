//! `fatpipe report [EXPERIMENT.toml]`: statistics and tables over the
//! archive.
//!
//! Glue: the selection flags become an archive filter (by sweep, path,
//! command, time range, or the runs before/after an annotation), the
//! archive returns the measurements (no documents), `fatpipe_report` builds
//! the tables and renders them as text, markdown, CSV or JSON. Given an
//! experiment file, the report is of its sweep, laid out as its `[report]`
//! section says, with the source document's figures beside fatpipe's.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;

use fatpipe_archive::Annotation;
use fatpipe_report::metric::{Metric, Stat};
use fatpipe_report::tables::{self, PivotSpec};
use fatpipe_report::{render, Format, Table};
use fatpipe_sweep::Experiment;

use super::archive::Select;
use crate::exit::usage;

/// Arguments of `fatpipe report`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// An experiment file: report its sweep, laid out as its [report] says,
    /// with the source document's figures beside fatpipe's.
    pub experiment: Option<PathBuf>,
    #[command(flatten)]
    pub select: Select,
    /// Only runs before this annotation (its id from `archive notes`, or
    /// words of its note), on its path.
    #[arg(long, conflicts_with = "after")]
    pub before: Option<String>,
    /// Only runs at or after this annotation, on its path.
    #[arg(long)]
    pub after: Option<String>,
    /// Parameter down the rows of a grid (e.g. window).
    #[arg(long)]
    pub rows: Option<String>,
    /// Parameter across the columns (e.g. mtu).
    #[arg(long)]
    pub columns: Option<String>,
    /// Parameters that split the grid into one table per value (e.g. protocol).
    #[arg(long, value_delimiter = ',')]
    pub split: Vec<String>,
    /// The grid's measure: throughput, retransmits, rtt, rtt_min, rtt_max,
    /// rtt_std, loss, jitter, cpu_local, cpu_remote.
    #[arg(long)]
    pub metric: Option<String>,
    /// The grid's statistic: median, mean, p10, p90, min, max, stddev, n.
    #[arg(long)]
    pub stat: Option<String>,
    /// Output format: text, markdown, csv or json.
    #[arg(long, default_value = "text")]
    pub format: String,
}

/// Runs `fatpipe report`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let format = Format::parse(&args.format).ok_or_else(|| {
        usage(format!(
            "--format: '{}' is not text, markdown, csv or json",
            args.format
        ))
    })?;
    let exp = args
        .experiment
        .as_deref()
        .map(Experiment::load)
        .transpose()
        .map_err(|e| usage(e.to_string()))?;
    let mut filter = args.select.filter()?;
    if let Some(e) = &exp {
        if filter.sweep.is_none() {
            filter.sweep = Some(e.name.clone());
        }
    }
    let mut store = super::archive::open(args.select.archive.as_deref())?;
    let mut heading_extra = String::new();
    for (flag, which, before) in [
        ("--before", &args.before, true),
        ("--after", &args.after, false),
    ] {
        if let Some(w) = which {
            let note = find_note(store.as_mut(), flag, w, filter.path.as_deref())?;
            heading_extra = format!(
                "; runs {} \"{}\" ({})",
                if before { "before" } else { "from" },
                note.note,
                note.at.format("%Y-%m-%d %H:%M UTC")
            );
            filter = if before {
                filter.before(&note)
            } else {
                filter.after(&note)
            };
        }
    }
    let mut runs = store.measurements(&filter)?;
    let mut left_out = 0;
    if let Some(e) = &exp {
        // Runs of cells the file no longer has (a parameter was changed
        // since they ran) are not this experiment's any more.
        let keys: BTreeSet<String> = fatpipe_sweep::cells(e).into_iter().map(|c| c.key).collect();
        let before = runs.len();
        runs.retain(|m| m.sweep.as_ref().is_some_and(|s| keys.contains(&s.cell)));
        left_out = before - runs.len();
    }
    if runs.is_empty() {
        return Err(usage(format!(
            "report: no runs in {} match{}",
            store.location(),
            exp.as_ref()
                .map(|e| format!(
                    " (sweep {}: run `fatpipe sweep {}` first)",
                    e.name,
                    e.file.display()
                ))
                .unwrap_or_default()
        )));
    }
    let spec = exp.as_ref().map(|e| e.report.clone()).unwrap_or_default();
    let rows = args.rows.clone().or(spec.rows);
    let columns = args.columns.clone().or(spec.columns);
    let split = if args.split.is_empty() {
        spec.split
    } else {
        args.split.clone()
    };
    let metric_name = args
        .metric
        .clone()
        .or(spec.metric)
        .unwrap_or_else(|| "throughput".into());
    let metric = Metric::parse(&metric_name)
        .ok_or_else(|| usage(format!("--metric: '{metric_name}' is not a measure")))?;
    let stat_name = args
        .stat
        .clone()
        .or(spec.stat)
        .unwrap_or_else(|| "median".into());
    let stat = Stat::parse(&stat_name)
        .ok_or_else(|| usage(format!("--stat: '{stat_name}' is not a statistic")))?;
    if rows.is_none() && (columns.is_some() || !split.is_empty()) {
        return Err(usage("--columns and --split need --rows"));
    }

    let mut out_tables: Vec<Table> = Vec::new();
    if let Some(rows) = rows {
        out_tables.extend(tables::pivot(
            &runs,
            &PivotSpec {
                rows,
                columns,
                split,
                metric,
                stat,
            },
        ));
    }
    if let Some(e) = &exp {
        if !e.seed_figures.is_empty() {
            out_tables.push(tables::seed(&runs, &e.seed_figures));
        }
    }
    out_tables.push(tables::cells(&runs));
    let heading = match &exp {
        Some(e) => format!(
            "{}{} — {} runs on {}{}",
            e.title.clone().unwrap_or_else(|| e.name.clone()),
            e.seed
                .as_deref()
                .map(|s| format!(" (source document {s})"))
                .unwrap_or_default(),
            runs.len(),
            e.path,
            heading_extra
        ),
        None => format!(
            "{} runs from {}{}",
            runs.len(),
            store.location(),
            heading_extra
        ),
    };
    if left_out > 0 {
        if let Some(t) = out_tables.last_mut() {
            t.notes.push(format!(
                "{left_out} runs of this sweep's cells that the file no longer has are left out"
            ));
        }
    }
    let mut out = std::io::stdout().lock();
    out.write_all(render(&heading, &out_tables, format).as_bytes())?;
    Ok(out.flush()?)
}

/// The annotation `which` names: its id, or the first whose note contains
/// the words (on `path` when given).
fn find_note(
    store: &mut dyn fatpipe_archive::Store,
    flag: &str,
    which: &str,
    path: Option<&str>,
) -> anyhow::Result<Annotation> {
    let notes = store.annotations(path)?;
    let id = which.parse::<i64>().ok();
    notes
        .into_iter()
        .find(|a| match id {
            Some(id) => a.id == Some(id),
            None => a.note.contains(which),
        })
        .ok_or_else(|| {
            usage(format!(
                "{flag}: no annotation '{which}'{}; `fatpipe archive notes` lists them",
                path.map(|p| format!(" on {p}")).unwrap_or_default()
            ))
        })
}
