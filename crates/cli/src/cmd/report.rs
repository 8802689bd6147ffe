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

use fatpipe_archive::{Annotation, RunFilter};
use fatpipe_report::html::Page;
use fatpipe_report::metric::{Metric, Stat};
use fatpipe_report::plot::{self, Caption, Plot};
use fatpipe_report::runs::TimeKind;
use fatpipe_report::tables::{self, PivotSpec};
use fatpipe_report::{render, Format, Table};
use fatpipe_sweep::Experiment;

use super::archive::Select;
use crate::exit::usage;

/// Arguments of `fatpipe report`.
#[derive(Debug, Default, clap::Args)]
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
    /// Draw a plot instead of tables: a swept parameter to plot the measure
    /// against (window, streams, length, ...; `line` for --rows), `heatmap`
    /// (--rows × --columns, one panel per --split value), `history` (the
    /// path's runs over time with its annotations), `seed` (the source
    /// document's figures beside fatpipe's), or of the --run runs
    /// `timeseries` (each interval over time, runs overlaid; a copy's
    /// bytes over time) or `cdf` (their per-interval figures). Needs --out.
    #[arg(long, value_name = "KIND", requires = "out")]
    pub plot: Option<String>,
    /// One line per value of these parameters in a line plot [default:
    /// --columns and --split].
    #[arg(long, value_delimiter = ',')]
    pub series: Vec<String>,
    /// Where the plot goes: FILE.svg or FILE.png.
    #[arg(long, value_name = "FILE", requires = "plot")]
    pub out: Option<PathBuf>,
    /// Write one self-contained HTML report (plots and tables) to FILE.
    #[arg(long, value_name = "FILE", conflicts_with = "plot")]
    pub html: Option<PathBuf>,
    /// A run to draw over time, by its id (`fatpipe archive list`); give
    /// it again for more, overlaid. With --plot timeseries|cdf, or with
    /// --html (drawn first on the page).
    #[arg(long = "run", value_name = "ID")]
    pub run: Vec<i64>,
}

/// The most cells whose median run the HTML report draws over time.
const CELLS_OVER_TIME: usize = 12;

/// Runs `fatpipe report`.
pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(file) = write(args)? {
        println!("wrote {}", file.display());
    }
    Ok(())
}

/// Makes the report `args` ask for: tables on stdout, or a plot or an HTML
/// file, whose path it returns.
pub fn write(args: Args) -> anyhow::Result<Option<PathBuf>> {
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
    let time_kind = args.plot.as_deref().and_then(TimeKind::parse);
    if let (Some(kind), Some(file)) = (time_kind, &args.out) {
        return plot_runs(&args, kind, file).map(Some);
    }
    if !args.run.is_empty() && args.html.is_none() {
        return Err(usage(
            "--run draws runs over time: add --plot timeseries|cdf --out FILE, or --html FILE",
        ));
    }
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

    // A plot alone needs none of the tables.
    let mut out_tables: Vec<Table> = Vec::new();
    if args.plot.is_none() {
        if let Some(r) = &rows {
            out_tables.extend(tables::pivot(
                &runs,
                &PivotSpec {
                    rows: r.clone(),
                    columns: columns.clone(),
                    split: split.clone(),
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
    }
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
        None => match (&filter.sweep, &filter.path) {
            (Some(sw), _) => format!("sweep {sw}: {} runs{heading_extra}", runs.len()),
            (None, Some(p)) => format!("path {p}: {} runs{heading_extra}", runs.len()),
            (None, None) => format!(
                "{} runs from {}{}",
                runs.len(),
                store.location(),
                heading_extra
            ),
        },
    };
    if left_out > 0 {
        if let Some(t) = out_tables.last_mut() {
            t.notes.push(format!(
                "{left_out} runs of this sweep's cells that the file no longer has are left out"
            ));
        }
    }
    if args.plot.is_some() || args.html.is_some() {
        let sample = store
            .runs(&RunFilter {
                ok: Some(true),
                limit: Some(1),
                ..filter.clone()
            })?
            .into_iter()
            .next();
        let notes = match runs.first() {
            Some(r) => store.annotations(Some(&r.path))?,
            None => Vec::new(),
        };
        let ctx = Context {
            runs: &runs,
            notes: &notes,
            context: context_line(sample.as_ref(), &runs),
            exp: exp.as_ref(),
            rows: rows.as_deref(),
            columns: columns.as_deref(),
            split: &split,
            series: &args.series,
            metric,
            stat,
        };
        if let (Some(kind), Some(file)) = (&args.plot, &args.out) {
            let plot = plot_of(kind, &ctx)?;
            write_plot(&plot, file)?;
            return Ok(Some(file.clone()));
        }
        if let Some(file) = &args.html {
            let lead = if args.run.is_empty() {
                Vec::new()
            } else {
                let runs = runs_by_id(store.as_mut(), &args.run)?;
                fatpipe_report::runs::plots(&runs, TimeKind::Timeseries, &run_context(&runs))
                    .map_err(|e| usage(e.to_string()))?
            };
            let over_time = if args.run.is_empty() {
                cells_over_time(store.as_mut(), &runs)?
            } else {
                Vec::new()
            };
            let mut page = page_of(
                &ctx,
                &heading,
                out_tables,
                &store.location(),
                sample.as_ref(),
            );
            page.lead = lead;
            page.runs = over_time;
            let html = fatpipe_report::html::render(&page)?;
            write_file(file, html.as_bytes())?;
            return Ok(Some(file.clone()));
        }
    }
    let mut out = std::io::stdout().lock();
    out.write_all(render(&heading, &out_tables, format).as_bytes())?;
    out.flush()?;
    Ok(None)
}

/// What the plots of a report are drawn from.
struct Context<'a> {
    runs: &'a [fatpipe_archive::Measurement],
    notes: &'a [Annotation],
    context: String,
    exp: Option<&'a Experiment>,
    rows: Option<&'a str>,
    columns: Option<&'a str>,
    split: &'a [String],
    series: &'a [String],
    metric: Metric,
    stat: Stat,
}

impl Context<'_> {
    fn caption(&self, title: String) -> Caption {
        Caption {
            title,
            context: self.context.clone(),
        }
    }

    /// The parameter a line plot puts on x when none is named: the
    /// layout's rows, else the first swept parameter that is a quantity
    /// people plot against.
    fn default_x(&self) -> Option<String> {
        if let Some(r) = self.rows {
            return Some(r.to_string());
        }
        let groups = tables::groups(self.runs);
        let vary = tables::varying(&groups);
        [
            "window", "streams", "length", "mss", "rate", "rtt", "loss", "mtu",
        ]
        .into_iter()
        .find(|k| vary.iter().any(|v| v == k))
        .map(str::to_string)
        .or_else(|| vary.first().cloned())
    }

    /// Series of a line plot over `x`: --series, else the layout's columns
    /// and split, else what else varies (at most one parameter).
    fn series_for(&self, x: &str) -> Vec<String> {
        if !self.series.is_empty() {
            return self.series.to_vec();
        }
        let mut s: Vec<String> = self.columns.iter().map(|c| c.to_string()).collect();
        s.extend(self.split.iter().cloned());
        if s.is_empty() && self.rows.is_none() {
            let groups = tables::groups(self.runs);
            s.extend(
                tables::varying(&groups)
                    .into_iter()
                    .filter(|k| k != x && k != "phase")
                    .take(1),
            );
        }
        s.retain(|k| k != x);
        s
    }

    fn line(&self, x: &str) -> anyhow::Result<Plot> {
        let series = self.series_for(x);
        let title = format!(
            "{} against {x}{}",
            self.metric.label(),
            if series.is_empty() {
                String::new()
            } else {
                format!(", by {}", series.join(" and "))
            }
        );
        Ok(Plot::Line(
            plot::line_data(
                self.runs,
                x,
                &series,
                self.metric,
                self.stat,
                self.caption(title),
            )
            .map_err(|e| usage(e.to_string()))?,
        ))
    }

    fn heatmap(&self) -> anyhow::Result<Plot> {
        let (Some(r), Some(c)) = (self.rows, self.columns) else {
            return Err(usage(
                "--plot heatmap needs --rows and --columns (or an experiment's [report])",
            ));
        };
        Ok(Plot::Heatmap(
            plot::heatmap_data(
                self.runs,
                r,
                c,
                self.split,
                self.metric,
                self.stat,
                self.caption(format!("{}, {r} × {c}", self.metric.label())),
            )
            .map_err(|e| usage(e.to_string()))?,
        ))
    }

    fn history(&self) -> anyhow::Result<Plot> {
        let title = match self.notes.len() {
            0 => format!("{} over time", self.metric.label()),
            _ => format!("{} over time, with the path's notes", self.metric.label()),
        };
        Ok(Plot::History(
            plot::history_data(self.runs, self.notes, self.metric, self.caption(title))
                .map_err(|e| usage(e.to_string()))?,
        ))
    }

    fn seed(&self) -> anyhow::Result<Plot> {
        let Some(e) = self.exp else {
            return Err(usage(
                "--plot seed needs an experiment file with [[seed_figure]]s",
            ));
        };
        Ok(Plot::Seed(
            plot::seed_data(
                self.runs,
                &e.seed_figures,
                self.caption(format!(
                    "source document {} beside fatpipe",
                    e.seed.as_deref().unwrap_or(&e.name)
                )),
            )
            .map_err(|e| usage(e.to_string()))?,
        ))
    }
}

/// The plot `--plot KIND` names.
fn plot_of(kind: &str, ctx: &Context<'_>) -> anyhow::Result<Plot> {
    match kind {
        "heatmap" => ctx.heatmap(),
        "history" => ctx.history(),
        "seed" => ctx.seed(),
        "line" => match ctx.default_x() {
            Some(x) => ctx.line(&x),
            None => Err(usage(
                "--plot line: these runs sweep no parameter; try --plot history",
            )),
        },
        param => ctx.line(param),
    }
}

/// The plots an HTML report carries: the measure against the layout's
/// rows (or the first swept quantity), the heat map when there are rows
/// and columns, the source document's figures, and the history when the
/// path has notes or the runs are not a sweep.
fn page_plots(ctx: &Context<'_>) -> Vec<(Plot, String)> {
    let mut out = Vec::new();
    let spread = "line: the statistic over the repetitions; band and bars: their p10–p90";
    if let Some(x) = ctx.default_x() {
        if let Ok(p) = ctx.line(&x) {
            out.push((
                p,
                format!(
                    "{} ({}) against {x}. {spread}.",
                    ctx.metric.label(),
                    ctx.stat.name()
                ),
            ));
        }
    }
    if ctx.rows.is_some() && ctx.columns.is_some() {
        if let Ok(p) = ctx.heatmap() {
            out.push((
                p,
                format!(
                    "{} ({}) in each cell; lighter is higher.",
                    ctx.metric.label(),
                    ctx.stat.name()
                ),
            ));
        }
    }
    if ctx.exp.is_some_and(|e| !e.seed_figures.is_empty()) {
        if let Ok(p) = ctx.seed() {
            out.push((p, "grey: the figure as the source document quotes it; blue: the same statistic of fatpipe's runs in the cells it names.".into()));
        }
    }
    let swept = ctx.runs.iter().any(|m| m.sweep.is_some());
    if !ctx.notes.is_empty() || !swept {
        if let Ok(p) = ctx.history() {
            out.push((p, "each run, or per time bucket its median and p10–p90; dashed lines: the archive's notes on the path.".into()));
        }
    }
    out
}

fn page_of(
    ctx: &Context<'_>,
    heading: &str,
    tables: Vec<Table>,
    location: &str,
    sample: Option<&fatpipe_archive::Run>,
) -> Page {
    let mut facts = vec![("runs".to_string(), {
        let failed = ctx.runs.iter().filter(|m| !m.ok).count();
        format!("{} ({failed} failed)", ctx.runs.len())
    })];
    if let (Some(a), Some(b)) = (
        ctx.runs.iter().map(|m| m.started).min(),
        ctx.runs.iter().map(|m| m.started).max(),
    ) {
        facts.push((
            "from, to".into(),
            format!(
                "{} — {}",
                a.format("%Y-%m-%d %H:%M UTC"),
                b.format("%Y-%m-%d %H:%M UTC")
            ),
        ));
    }
    if let Some(r) = sample {
        facts.push(("path".into(), r.path.clone()));
        if let Some(l) = r.link.as_ref().and_then(link_text) {
            facts.push(("link".into(), l));
        }
        let h = &r.host;
        let about: Vec<String> = [
            format!("{} {}", h.os, h.kernel).trim().to_string(),
            match (h.cpu_count, h.cpu_model.as_str()) {
                (0, _) => String::new(),
                (n, "") => format!("{n} CPUs"),
                (n, m) => format!("{n} × {m}"),
            },
        ]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect();
        facts.push((
            "host".into(),
            format!("{} ({})", h.hostname, about.join(", ")),
        ));
        if let Some(cc) = h.sysctls.get("net.ipv4.tcp_congestion_control") {
            facts.push(("congestion control".into(), cc.clone()));
        }
        facts.push(("fatpipe".into(), h.fatpipe_version.clone()));
    }
    if let Some(e) = ctx.exp {
        facts.push(("experiment".into(), e.file.display().to_string()));
    }
    for n in ctx.notes {
        facts.push((
            format!("note {}", n.at.format("%Y-%m-%d %H:%M UTC")),
            n.note.clone(),
        ));
    }
    Page {
        title: heading.to_string(),
        subtitle: ctx.context.clone(),
        facts,
        plots: page_plots(ctx),
        tables,
        source: location.to_string(),
        ..Page::default()
    }
}

/// `report --run ID… --plot timeseries|cdf --out FILE`: the runs' documents
/// drawn over time.
fn plot_runs(args: &Args, kind: TimeKind, file: &std::path::Path) -> anyhow::Result<PathBuf> {
    if args.run.is_empty() {
        return Err(usage(format!(
            "--plot {}: name the runs with --run ID (`fatpipe archive list` shows their ids)",
            args.plot.as_deref().unwrap_or_default()
        )));
    }
    check_plot_file(file)?;
    let mut store = super::archive::open(args.select.archive.as_deref())?;
    let runs = runs_by_id(store.as_mut(), &args.run)?;
    let plots = fatpipe_report::runs::plots(&runs, kind, &run_context(&runs))
        .map_err(|e| usage(e.to_string()))?;
    match plots.as_slice() {
        [(p, _)] => write_plot(p, file)?,
        _ => {
            return Err(usage(
                "--plot timeseries: these runs mix tests and copies, and a file holds one plot; give the tests' ids or the copies'",
            ))
        }
    }
    Ok(file.to_path_buf())
}

/// The stored runs with these ids, documents included, in the order given.
fn runs_by_id(
    store: &mut dyn fatpipe_archive::Store,
    ids: &[i64],
) -> anyhow::Result<Vec<fatpipe_archive::Run>> {
    let mut out = Vec::new();
    for &id in ids {
        let filter = RunFilter {
            after_id: Some(id - 1),
            limit: Some(1),
            ..RunFilter::default()
        };
        let run = store
            .runs(&filter)?
            .into_iter()
            .find(|r| r.id == Some(id))
            .ok_or_else(|| {
                usage(format!(
                    "--run {id}: {} has no run {id} (`fatpipe archive list` shows the ids)",
                    store.location()
                ))
            })?;
        out.push(run);
    }
    Ok(out)
}

/// The HTML report's "runs over time": each cell's median run drawn from
/// its document (runs without one, or from before intervals were kept,
/// are left out), at most [`CELLS_OVER_TIME`] cells.
fn cells_over_time(
    store: &mut dyn fatpipe_archive::Store,
    runs: &[fatpipe_archive::Measurement],
) -> anyhow::Result<Vec<(Plot, String)>> {
    let ids = fatpipe_report::runs::median_runs(runs, CELLS_OVER_TIME);
    let cells = fatpipe_report::runs::median_runs(runs, usize::MAX).len();
    let mut out = Vec::new();
    for id in ids {
        let one = runs_by_id(store, &[id])?;
        if let Ok(plots) =
            fatpipe_report::runs::plots(&one, TimeKind::Timeseries, &run_context(&one))
        {
            for (p, caption) in plots {
                out.push((p, format!("The median run of its cell. {caption}")));
            }
        }
    }
    if cells > CELLS_OVER_TIME {
        if let Some(last) = out.last_mut() {
            last.1.push_str(&format!(
                " {} more cells not drawn: `fatpipe report --run ID --plot timeseries --out FILE` draws any run.",
                cells - CELLS_OVER_TIME
            ));
        }
    }
    Ok(out)
}

/// The subtitle of runs drawn by id: their path, the first's link and host.
fn run_context(runs: &[fatpipe_archive::Run]) -> String {
    let mut paths: Vec<&str> = runs.iter().map(|r| r.path.as_str()).collect();
    paths.sort_unstable();
    paths.dedup();
    context_of(runs.first(), &paths)
}

/// `path lab:x · link 1 Gbit/s, 93 ms, 0.1 % loss · host dtn1 (Linux 6.1)`.
fn context_line(
    sample: Option<&fatpipe_archive::Run>,
    runs: &[fatpipe_archive::Measurement],
) -> String {
    let mut paths: Vec<&str> = runs.iter().map(|m| m.path.as_str()).collect();
    paths.sort_unstable();
    paths.dedup();
    context_of(sample, &paths)
}

fn context_of(sample: Option<&fatpipe_archive::Run>, paths: &[&str]) -> String {
    let mut parts = Vec::new();
    match paths {
        [one] => parts.push(format!("path {one}")),
        many => parts.push(format!("{} paths", many.len())),
    }
    if let Some(r) = sample {
        if let Some(l) = r.link.as_ref().and_then(link_text) {
            parts.push(format!("link {l}"));
        }
        let os = format!("{} {}", r.host.os, r.host.kernel);
        parts.push(match os.trim() {
            "" => format!("host {}", r.host.hostname),
            os => format!("host {} ({os})", r.host.hostname),
        });
    }
    parts.join(" · ")
}

/// A lab link's spec for people: `1 Gbit/s, 93 ms RTT, 0.1% loss, MTU 1500`.
fn link_text(v: &serde_json::Value) -> Option<String> {
    let dur = |k: &str| -> Option<f64> {
        let d = v.get(k)?;
        Some(d.get("secs")?.as_f64()? + d.get("nanos")?.as_f64()? / 1e9)
    };
    let mut parts = Vec::new();
    match v.get("rate_up").and_then(|r| r.as_f64()) {
        Some(r) if r > 0.0 => parts.push(
            fatpipe_schema::units::format_rate(r)
                .replace(".00 ", " ")
                .replace(".0 ", " "),
        ),
        Some(_) => parts.push("unlimited rate".into()),
        None => {}
    }
    if let Some(rtt) = dur("rtt") {
        parts.push(format!("{:.0} ms RTT", rtt * 1e3));
    }
    if let Some(l) = v.get("loss").and_then(|l| l.as_f64()).filter(|l| *l > 0.0) {
        parts.push(format!("{} loss", fatpipe_schema::units::format_loss(l)));
    }
    if let Some(m) = v.get("mtu").and_then(|m| m.as_u64()) {
        parts.push(format!("MTU {m}"));
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// Writes `plot` to `file` as SVG or PNG, by its extension.
pub(crate) fn write_plot(plot: &Plot, file: &std::path::Path) -> anyhow::Result<()> {
    check_plot_file(file)?;
    if file.extension().and_then(|e| e.to_str()) == Some("png") {
        plot.png(file)
            .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
        Ok(())
    } else {
        write_file(file, plot.svg()?.as_bytes())
    }
}

/// Refuses a plot file that is neither `.svg` nor `.png` (before a run
/// that would draw it, so no measurement is lost to a typo).
pub(crate) fn check_plot_file(file: &std::path::Path) -> anyhow::Result<()> {
    match file.extension().and_then(|e| e.to_str()) {
        Some("svg" | "png") => Ok(()),
        _ => Err(usage(format!(
            "{}: a plot file must end in .svg or .png",
            file.display()
        ))),
    }
}

fn write_file(file: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    std::fs::write(file, bytes).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))
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
