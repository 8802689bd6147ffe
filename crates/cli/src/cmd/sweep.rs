//! `fatpipe sweep EXPERIMENT.toml`: run a study into the archive.
//!
//! Glue: `fatpipe_sweep` reads and checks the file (every error one line
//! with the file, line and key, exit 2, before anything runs), plans the
//! interleaved runs the archive does not hold yet, and runs them as this
//! same binary's `test`/`copy`/`path` with `--json`. This module prints the
//! plan (`--dry-run`), the progress (a bar redrawn in place on a terminal,
//! one line per run otherwise), and the outcome (`--json` for machines).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use fatpipe_archive::RunStatus;
use fatpipe_schema::units;
use fatpipe_sweep::{plan, Event, Experiment, SweepError};
use serde::Serialize;

use crate::exit::usage;

/// Arguments of `fatpipe sweep`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The experiment file (TOML; see docs/sweep.md).
    pub file: PathBuf,
    /// List the cells and the estimated time; run nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print one JSON document at the end instead of the progress.
    #[arg(long)]
    pub json: bool,
    /// Repetitions per cell, instead of the file's.
    #[arg(long)]
    pub repetitions: Option<u32>,
    /// The archive (file or postgres:// URL) [default: $FATPIPE_ARCHIVE, then the user's data directory].
    #[arg(long, value_name = "LOCATION")]
    pub archive: Option<String>,
}

/// The `--dry-run --json` document.
#[derive(Debug, Serialize)]
struct DryRun<'a> {
    schema: &'static str,
    version: u32,
    sweep: &'a str,
    path: &'a str,
    cells: Vec<DryCell>,
    repetitions: u32,
    runs_total: usize,
    runs_left: usize,
    estimated_seconds: f64,
}

#[derive(Debug, Serialize)]
struct DryCell {
    label: String,
    key: String,
    argv: Vec<String>,
    estimated_seconds: f64,
}

/// The `--json` document of a sweep that ran.
#[derive(Debug, Serialize)]
struct Done<'a> {
    schema: &'static str,
    version: u32,
    archive: String,
    #[serde(flatten)]
    outcome: &'a fatpipe_sweep::Outcome,
}

/// Runs `fatpipe sweep`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut e = Experiment::load(&args.file).map_err(sweep_err)?;
    if let Some(r) = args.repetitions {
        if r == 0 || r > fatpipe_sweep::experiment::MAX_REPETITIONS {
            return Err(usage(format!(
                "--repetitions must be 1..={}",
                fatpipe_sweep::experiment::MAX_REPETITIONS
            )));
        }
        e.repetitions = r;
    }
    if e.target == fatpipe_sweep::Target::Lab && !args.dry_run && !fatpipe_sys::process::is_root() {
        return Err(sweep_err(SweepError::NeedRoot));
    }
    let mut store = super::archive::open(args.archive.as_deref())?;
    let (cells, todo) = fatpipe_sweep::run::pending(&e, store.as_mut()).map_err(sweep_err)?;
    if args.dry_run {
        return dry_run(&e, &cells, &todo, args.json);
    }
    let exe = std::env::current_exe().context("sweep: cannot find the fatpipe executable")?;
    let tty = !args.json && std::io::stderr().is_terminal();
    if !args.json {
        eprintln!(
            "sweep {}: {} cells × {} repetitions into {}; {} runs left, about {}",
            e.name,
            cells.len(),
            e.repetitions,
            store.location(),
            todo.len(),
            human(plan::total_estimate(&cells, &todo))
        );
    }
    let quiet = args.json;
    let mut on_event = |ev: Event<'_>| {
        if quiet {
            return;
        }
        progress(&ev, tty);
    };
    let outcome = fatpipe_sweep::run(&e, &exe, store.as_mut(), &mut on_event).map_err(sweep_err)?;
    if tty {
        eprint!("\r\x1b[K");
    }
    if args.json {
        let doc = Done {
            schema: "fatpipe.sweep",
            version: 1,
            archive: store.location(),
            outcome: &outcome,
        };
        let mut out = std::io::stdout().lock();
        crate::cmd::common::json_pretty(&mut out, &doc)?;
    } else {
        eprintln!(
            "sweep {}: {} runs done ({} failed), {} already in the archive; {:.1} s, of which {:.1} s outside the runs ({:.1} %)",
            outcome.sweep,
            outcome.runs_done,
            outcome.runs_failed,
            outcome.runs_already,
            outcome.seconds,
            outcome.overhead_seconds,
            100.0 * outcome.overhead_seconds / outcome.seconds.max(1e-9)
        );
        eprintln!(
            "report: fatpipe report {}{}",
            args.file.display(),
            args.archive
                .as_deref()
                .map(|a| format!(" --archive {a}"))
                .unwrap_or_default()
        );
    }
    if outcome.runs_failed > 0 {
        anyhow::bail!(
            "sweep {}: {} of {} runs failed (stored with their errors; rerun the same command to retry them)",
            outcome.sweep,
            outcome.runs_failed,
            outcome.runs_done
        );
    }
    Ok(())
}

fn dry_run(
    e: &Experiment,
    cells: &[plan::Cell],
    todo: &[plan::Planned],
    json: bool,
) -> anyhow::Result<()> {
    let end = plan::Endpoint {
        server: match &e.target {
            fatpipe_sweep::Target::Lab => "LAB".into(),
            fatpipe_sweep::Target::Server { host, .. } => host.clone(),
        },
        key_file: match &e.target {
            fatpipe_sweep::Target::Server { key_file, .. } => {
                key_file.as_ref().map(|k| k.display().to_string())
            }
            fatpipe_sweep::Target::Lab => None,
        },
        copy_paths: Some(("DATASET/".into(), "{host}:EXPORT/RUN".into())),
    };
    let total = plan::total_estimate(cells, todo);
    let doc = DryRun {
        schema: "fatpipe.sweep.plan",
        version: 1,
        sweep: &e.name,
        path: &e.path,
        cells: cells
            .iter()
            .map(|c| DryCell {
                label: c.label.clone(),
                key: c.key.clone(),
                argv: plan::argv(c, &end),
                estimated_seconds: plan::estimate(c).as_secs_f64(),
            })
            .collect(),
        repetitions: e.repetitions,
        runs_total: cells.len() * e.repetitions as usize,
        runs_left: todo.len(),
        estimated_seconds: total.as_secs_f64(),
    };
    let mut out = std::io::stdout().lock();
    if json {
        crate::cmd::common::json_pretty(&mut out, &doc)?;
        return Ok(());
    }
    writeln!(
        out,
        "sweep {} ({}): {} cells × {} repetitions = {} runs, {} left, about {}",
        e.name,
        e.path,
        doc.cells.len(),
        e.repetitions,
        doc.runs_total,
        doc.runs_left,
        human(total)
    )?;
    for (c, d) in cells.iter().zip(&doc.cells) {
        writeln!(
            out,
            "  {:<40} {:>8}  fatpipe {}",
            c.label,
            human(Duration::from_secs_f64(d.estimated_seconds)),
            d.argv.join(" ")
        )?;
    }
    Ok(())
}

/// One progress step on stderr: a bar redrawn in place on a terminal,
/// a line per finished run otherwise.
fn progress(ev: &Event<'_>, tty: bool) {
    match ev {
        Event::LabUp { name, link } => {
            if tty {
                eprint!("\r\x1b[K");
            }
            eprintln!("sweep: bringing up lab '{name}': {link}");
        }
        Event::Annotated(a) => {
            if tty {
                eprint!("\r\x1b[K");
            }
            eprintln!("sweep: noted on {}: {}", a.path, a.note);
        }
        Event::Start {
            done,
            total,
            cell,
            repetition,
            eta,
        } => {
            if tty {
                let width = 24;
                let filled = (done * width).checked_div(*total).unwrap_or(0);
                eprint!(
                    "\r\x1b[K[{}{}] {done}/{total} · {} #{} · ETA {}",
                    "#".repeat(filled),
                    "-".repeat(width - filled),
                    cell.label,
                    repetition,
                    human(*eta)
                );
                let _ = std::io::stderr().flush();
            }
        }
        Event::Finish {
            done,
            total,
            cell,
            repetition,
            run,
            took,
        } => {
            if tty {
                eprint!("\r\x1b[K");
            }
            let result = match &run.status {
                RunStatus::Ok => run
                    .metrics
                    .throughput_bps
                    .map(units::format_rate)
                    .unwrap_or_else(|| "ok".into()),
                RunStatus::Failed(e) => format!("FAILED: {e}"),
            };
            eprintln!(
                "[{done}/{total}] {} #{}: {result} ({:.1} s)",
                cell.label,
                repetition,
                took.as_secs_f64()
            );
        }
    }
}

/// `1h02m`, `3m20s`, `12s`.
fn human(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

/// A sweep's error with its exit code: the file's and root's are the
/// user's to fix (2).
fn sweep_err(e: SweepError) -> anyhow::Error {
    if e.is_usage() {
        usage(e.to_string())
    } else {
        anyhow::Error::new(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_an_eta() {
        assert_eq!(human(Duration::from_secs(12)), "12s");
        assert_eq!(human(Duration::from_secs(200)), "3m20s");
        assert_eq!(human(Duration::from_secs(3720)), "1h02m");
    }
}
