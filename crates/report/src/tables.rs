//! The tables of a report, built from the archive's measurements.
//!
//! Cells are grouped by (sweep, cell key, path, command), as the archive's
//! `stats::by_cell` groups them; a cell's parameters are read back from its
//! key. Parameter values sort by what they mean (`64K` before `1M`, `93ms`
//! before `1s`), not as text.

use std::collections::{BTreeMap, BTreeSet};

use fatpipe_archive::stats::{self, summarise};
use fatpipe_archive::Measurement;
use fatpipe_schema::units;
use fatpipe_sweep::SeedFigure;
use serde_json::Value;

use crate::metric::{Metric, Stat};
use crate::Table;

/// One group of runs: a cell of a sweep (or the plain runs on one path).
#[derive(Debug, Clone)]
pub struct Group<'a> {
    /// Its sweep.
    pub sweep: Option<&'a str>,
    /// Its parameters (empty outside sweeps).
    pub params: BTreeMap<String, Value>,
    /// The path key.
    pub path: &'a str,
    /// The command's name.
    pub kind: &'static str,
    /// Its runs, failed ones included.
    pub runs: Vec<&'a Measurement>,
}

/// The runs grouped into cells, in the order their first run was stored.
pub fn groups(runs: &[Measurement]) -> Vec<Group<'_>> {
    /// (sweep, cell, path, command).
    type Key<'k> = (Option<&'k str>, Option<&'k str>, &'k str, &'k str);
    let mut index: BTreeMap<Key<'_>, usize> = BTreeMap::new();
    let mut out: Vec<Group<'_>> = Vec::new();
    for m in runs {
        let sweep = m.sweep.as_ref().map(|s| s.sweep.as_str());
        let cell = m.sweep.as_ref().map(|s| s.cell.as_str());
        let key = (sweep, cell, m.path.as_str(), m.kind.as_str());
        let i = *index.entry(key).or_insert_with(|| {
            out.push(Group {
                sweep,
                params: cell.map(fatpipe_sweep::key_params).unwrap_or_default(),
                path: m.path.as_str(),
                kind: m.kind.as_str(),
                runs: Vec::new(),
            });
            out.len() - 1
        });
        out[i].runs.push(m);
    }
    out
}

/// The parameters whose value differs between groups: what a label needs.
pub fn varying(groups: &[Group<'_>]) -> Vec<String> {
    let mut seen: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for g in groups {
        for (k, v) in &g.params {
            seen.entry(k).or_default().insert(v.to_string());
        }
    }
    seen.into_iter()
        .filter(|(k, vs)| vs.len() > 1 || groups.iter().any(|g| !g.params.contains_key(*k)))
        .map(|(k, _)| k.to_string())
        .collect()
}

/// One row per cell with every statistic: throughput (n, min, p10, median,
/// mean, p90, max, sd), retransmits (median), RTT over the cell (smallest
/// minimum, mean of means, largest maximum, pooled deviation), loss and
/// jitter (median), CPU of both ends (median).
pub fn cells(runs: &[Measurement]) -> Table {
    let gs = groups(runs);
    let vary = varying(&gs);
    let header: Vec<String> = [
        "cell",
        "n",
        "failed",
        "min",
        "p10",
        "median",
        "mean",
        "p90",
        "max",
        "sd",
        "retrans",
        "RTT min/avg/max (std) ms",
        "loss",
        "jitter",
        "CPU here/peer",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut rows = Vec::new();
    let mut values = Vec::new();
    for g in &gs {
        let ok: Vec<&Measurement> = g.runs.iter().copied().filter(|m| m.ok).collect();
        let col = |m: Metric| -> Vec<f64> { ok.iter().filter_map(|r| m.of(&r.metrics)).collect() };
        let thr = summarise(&col(Metric::Throughput));
        let med = |m: Metric| summarise(&col(m)).map(|s| s.median);
        let f = |m: Metric, v: Option<f64>| v.map(|x| m.format(x)).unwrap_or_else(|| "-".into());
        let t = |pick: fn(&stats::Summary) -> Option<f64>| thr.as_ref().and_then(pick);
        let rtt = cell_rtt(&ok);
        let label = label(g, &vary);
        let cpu = match (med(Metric::CpuLocal), med(Metric::CpuRemote)) {
            (None, None) => "-".to_string(),
            (a, b) => format!(
                "{}/{}",
                a.map(|v| format!("{v:.0}")).unwrap_or_else(|| "-".into()),
                b.map(|v| format!("{v:.0}")).unwrap_or_else(|| "-".into())
            ),
        };
        let nums = [
            None,
            Some(ok.len() as f64),
            Some((g.runs.len() - ok.len()) as f64),
            t(|s| Some(s.min)),
            t(|s| Some(s.p10)),
            t(|s| Some(s.median)),
            t(|s| Some(s.mean)),
            t(|s| Some(s.p90)),
            t(|s| Some(s.max)),
            t(|s| s.stddev),
            med(Metric::Retransmits),
            rtt.map(|r| r.1),
            med(Metric::Loss),
            med(Metric::Jitter),
            med(Metric::CpuLocal),
        ];
        rows.push(vec![
            label,
            ok.len().to_string(),
            (g.runs.len() - ok.len()).to_string(),
            f(Metric::Throughput, nums[3]),
            f(Metric::Throughput, nums[4]),
            f(Metric::Throughput, nums[5]),
            f(Metric::Throughput, nums[6]),
            f(Metric::Throughput, nums[7]),
            f(Metric::Throughput, nums[8]),
            f(Metric::Throughput, nums[9]),
            f(Metric::Retransmits, nums[10]),
            rtt.map(|(a, b, c, d)| {
                format!(
                    "{:.1}/{:.1}/{:.1} ({:.2})",
                    a / 1000.0,
                    b / 1000.0,
                    c / 1000.0,
                    d / 1000.0
                )
            })
            .unwrap_or_else(|| "-".into()),
            f(Metric::Loss, nums[12]),
            f(Metric::Jitter, nums[13]),
            cpu,
        ]);
        values.push(nums.to_vec());
    }
    Table {
        title: "per cell: throughput statistics over the repetitions, RTT over all runs".into(),
        header,
        rows,
        values,
        notes: Vec::new(),
    }
}

/// How a pivot table is laid out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PivotSpec {
    /// Parameter down the rows.
    pub rows: String,
    /// Parameter across the columns (none: one column).
    pub columns: Option<String>,
    /// Parameters splitting the grid into several tables.
    pub split: Vec<String>,
    /// The measure.
    pub metric: Metric,
    /// The statistic over the runs of a grid cell.
    pub stat: Stat,
}

/// One grid of `spec.metric`'s `spec.stat` per value of the split
/// parameters, rows × columns. Runs of cells that differ only in a
/// parameter the layout does not show are pooled, and the table says so.
pub fn pivot(runs: &[Measurement], spec: &PivotSpec) -> Vec<Table> {
    let gs = groups(runs);
    type Key = Vec<Value>;
    let get = |g: &Group<'_>, k: &str| g.params.get(k).cloned().unwrap_or(Value::Null);
    let mut split_vals: Vec<Key> = Vec::new();
    let mut row_vals: Vec<Value> = Vec::new();
    let mut col_vals: Vec<Value> = Vec::new();
    let mut grid: BTreeMap<(String, String, String), Vec<f64>> = BTreeMap::new();
    let id = |v: &Value| v.to_string();
    for g in &gs {
        let s: Key = spec.split.iter().map(|k| get(g, k)).collect();
        let r = get(g, &spec.rows);
        let c = spec.columns.as_ref().map_or(Value::Null, |k| get(g, k));
        if !split_vals.contains(&s) {
            split_vals.push(s.clone());
        }
        if !row_vals.contains(&r) {
            row_vals.push(r.clone());
        }
        if !col_vals.contains(&c) {
            col_vals.push(c.clone());
        }
        let cell = grid
            .entry((Value::Array(s).to_string(), id(&r), id(&c)))
            .or_default();
        cell.extend(
            g.runs
                .iter()
                .filter(|m| m.ok)
                .filter_map(|m| spec.metric.of(&m.metrics)),
        );
    }
    sort_values(&mut row_vals);
    sort_values(&mut col_vals);
    split_vals.sort_by(|a, b| {
        let ka: Vec<SortKey> = a.iter().map(sort_key).collect();
        let kb: Vec<SortKey> = b.iter().map(sort_key).collect();
        ka.partial_cmp(&kb).unwrap_or(std::cmp::Ordering::Equal)
    });
    // Parameters whose values differ between groups that land in the same
    // grid cell: their runs are pooled there, and the table says so.
    let mut members: BTreeMap<(String, String, String), Vec<&Group<'_>>> = BTreeMap::new();
    for g in &gs {
        let s: Key = spec.split.iter().map(|k| get(g, k)).collect();
        let c = spec.columns.as_ref().map_or(Value::Null, |k| get(g, k));
        members
            .entry((Value::Array(s).to_string(), id(&get(g, &spec.rows)), id(&c)))
            .or_default()
            .push(g);
    }
    let mut pooled: BTreeSet<String> = BTreeSet::new();
    for together in members.values() {
        if together.len() > 1 {
            let owned: Vec<Group<'_>> = together.iter().map(|g| (*g).clone()).collect();
            pooled.extend(varying(&owned));
        }
    }
    let pooled: Vec<String> = pooled.into_iter().collect();
    let mut tables = Vec::new();
    for s in &split_vals {
        let skey = Value::Array(s.clone()).to_string();
        let mut header = vec![spec.rows.clone()];
        for c in &col_vals {
            header.push(match (&spec.columns, c) {
                (Some(k), Value::Null) => format!("{k}=-"),
                (Some(k), v) => format!("{k}={}", show(v)),
                (None, _) => format!("{} ({})", spec.metric.label(), spec.stat.name()),
            });
        }
        let mut rows = Vec::new();
        let mut values = Vec::new();
        for r in &row_vals {
            let mut row = vec![show(r)];
            let mut nums = vec![None];
            let mut any = false;
            for c in &col_vals {
                let v = grid
                    .get(&(skey.clone(), id(r), id(c)))
                    .and_then(|vals| summarise(vals))
                    .and_then(|sum| spec.stat.of(&sum));
                any |= grid.contains_key(&(skey.clone(), id(r), id(c)));
                row.push(match (v, spec.stat) {
                    (Some(x), Stat::N) => format!("{x:.0}"),
                    (Some(x), _) => spec.metric.format(x),
                    (None, _) => "-".into(),
                });
                nums.push(v);
            }
            if any {
                rows.push(row);
                values.push(nums);
            }
        }
        let mut title = format!("{} ({})", spec.metric.label(), spec.stat.name());
        title.push_str(&format!(", {}", spec.rows));
        if let Some(c) = &spec.columns {
            title.push_str(&format!(" × {c}"));
        }
        for (k, v) in spec.split.iter().zip(s) {
            title.push_str(&format!(", {k}={}", show(v)));
        }
        let mut notes = Vec::new();
        if !pooled.is_empty() {
            notes.push(format!(
                "pooled over {} (not shown in this layout)",
                pooled.join(", ")
            ));
        }
        tables.push(Table {
            title,
            header,
            rows,
            values,
            notes,
        });
    }
    tables
}

/// Each seed figure beside the same statistic of fatpipe's runs in the
/// cells it names, and their ratio.
pub fn seed(runs: &[Measurement], figures: &[SeedFigure]) -> Table {
    let gs = groups(runs);
    let mut rows = Vec::new();
    let mut values = Vec::new();
    let mut notes = Vec::new();
    for f in figures {
        let metric = Metric::parse(&f.metric).unwrap_or(Metric::Throughput);
        let stat = Stat::parse(&f.stat).unwrap_or(Stat::Median);
        let pool = |cell: &BTreeMap<String, Value>| -> Option<(f64, usize)> {
            let vals: Vec<f64> = gs
                .iter()
                .filter(|g| cell.iter().all(|(k, v)| g.params.get(k) == Some(v)))
                .flat_map(|g| g.runs.iter())
                .filter(|m| m.ok)
                .filter_map(|m| metric.of(&m.metrics))
                .collect();
            summarise(&vals)
                .and_then(|s| stat.of(&s))
                .map(|x| (x, vals.len()))
        };
        let mine = pool(&f.cell);
        let runs = mine.map_or(0, |m| m.1);
        // A ratio figure compares ours over its base cells; a plain one
        // our statistic itself.
        let (ours, show_value): (Option<f64>, fn(Metric, f64) -> String) = match &f.ratio_to {
            Some(base) => (
                mine.zip(pool(base))
                    .filter(|(_, b)| b.0 != 0.0)
                    .map(|(a, b)| a.0 / b.0),
                |_, x| format!("{x:.2}×"),
            ),
            None => (mine.map(|m| m.0), |m, x| m.format(x)),
        };
        let cell = describe(&f.cell);
        let ratio = ours.filter(|_| f.value != 0.0).map(|o| o / f.value);
        let cell = match &f.ratio_to {
            Some(base) => format!("{cell} over {}", describe(base)),
            None => cell,
        };
        if let Some(n) = &f.note {
            notes.push(format!("{cell}: {n}"));
        }
        rows.push(vec![
            cell,
            format!("{} ({})", metric.label(), stat.name()),
            show_value(metric, f.value),
            ours.map(|o| show_value(metric, o))
                .unwrap_or_else(|| "no runs".into()),
            ratio
                .map(|r| format!("{r:.2}"))
                .unwrap_or_else(|| "-".into()),
            runs.to_string(),
            f.source.clone(),
        ]);
        values.push(vec![
            None,
            None,
            Some(f.value),
            ours,
            ratio,
            Some(runs as f64),
            None,
        ]);
    }
    Table {
        title: "the source document's figures beside fatpipe's".into(),
        header: [
            "cell", "measure", "seed", "fatpipe", "ratio", "runs", "source",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        rows,
        values,
        notes,
    }
}

/// `phase=oc3 streams=1`, or `all`.
fn describe(cell: &BTreeMap<String, Value>) -> String {
    if cell.is_empty() {
        return "all".into();
    }
    cell.iter()
        .map(|(k, v)| format!("{k}={}", show(v)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A cell's RTT as the seeds quote it: smallest minimum, mean of the runs'
/// means, largest maximum, and the deviation of all samples pooled (each
/// run weighted equally: the root of the mean of `std² + mean²` less the
/// squared mean).
fn cell_rtt(ok: &[&Measurement]) -> Option<(f64, f64, f64, f64)> {
    let per: Vec<(f64, f64, f64, f64)> = ok
        .iter()
        .filter_map(|m| {
            let x = &m.metrics;
            Some((
                x.rtt_min_us?,
                x.rtt_avg_us?,
                x.rtt_max_us?,
                x.rtt_std_us.unwrap_or(0.0),
            ))
        })
        .collect();
    if per.is_empty() {
        return None;
    }
    let n = per.len() as f64;
    let min = per.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let max = per.iter().map(|p| p.2).fold(f64::NEG_INFINITY, f64::max);
    let mean = per.iter().map(|p| p.1).sum::<f64>() / n;
    let second = per.iter().map(|p| p.3 * p.3 + p.1 * p.1).sum::<f64>() / n;
    let std = (second - mean * mean).max(0.0).sqrt();
    Some((min, mean, max, std))
}

/// `streams=4 window=1M`, or the path and command outside sweeps.
fn label(g: &Group<'_>, vary: &[String]) -> String {
    let parts: Vec<String> = vary
        .iter()
        .filter_map(|k| g.params.get(k).map(|v| format!("{k}={}", show(v))))
        .collect();
    if parts.is_empty() {
        match g.sweep {
            Some(s) => s.to_string(),
            None => format!("{} {}", g.kind, g.path),
        }
    } else {
        parts.join(" ")
    }
}

/// A parameter value for people: strings without quotes.
pub(crate) fn show(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// How values sort: by what they mean when they are quantities.
#[derive(Debug, Clone, PartialEq, PartialOrd)]
pub(crate) enum SortKey {
    Number(f64),
    Text(String),
}

pub(crate) fn sort_key(v: &Value) -> SortKey {
    match v {
        Value::Number(n) => SortKey::Number(n.as_f64().unwrap_or(0.0)),
        Value::Bool(b) => SortKey::Number(f64::from(u8::from(*b))),
        Value::String(s) => units::parse_size(s)
            .map(|x| x as f64)
            .or_else(|_| units::parse_rate(s).map(|x| x as f64))
            .or_else(|_| units::parse_duration(s).map(|d| d.as_secs_f64()))
            .map(SortKey::Number)
            .unwrap_or_else(|_| SortKey::Text(s.clone())),
        _ => SortKey::Text(v.to_string()),
    }
}

fn sort_values(vals: &mut [Value]) {
    vals.sort_by(|a, b| {
        sort_key(a)
            .partial_cmp(&sort_key(b))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{DateTime, Utc};
    use fatpipe_archive::{Metrics, RunKind, SweepRef};

    fn m(cell: &str, rep: u32, bps: f64, ok: bool) -> Measurement {
        Measurement {
            id: 0,
            kind: RunKind::Test,
            started: DateTime::<Utc>::UNIX_EPOCH,
            ok,
            sweep: Some(SweepRef {
                sweep: "s".into(),
                cell: cell.into(),
                repetition: rep,
            }),
            path: "lab:s".into(),
            metrics: Metrics {
                throughput_bps: ok.then_some(bps),
                rtt_min_us: Some(88_000.0),
                rtt_avg_us: Some(88_000.0 + bps / 1e6),
                rtt_max_us: Some(90_000.0),
                rtt_std_us: Some(1000.0),
                ..Metrics::default()
            },
        }
    }

    fn key(window: &str, mtu: u32, proto: &str) -> String {
        format!("{{\"mtu\":{mtu},\"protocol\":\"{proto}\",\"window\":\"{window}\"}}")
    }

    fn runs() -> Vec<Measurement> {
        let mut v = Vec::new();
        for (w, base) in [("1M", 100e6), ("64K", 2e6), ("16M", 700e6)] {
            for mtu in [9000, 1500] {
                for rep in 0..3 {
                    let bps = base * if mtu == 9000 { 1.1 } else { 1.0 } + rep as f64 * 1e6;
                    v.push(m(&key(w, mtu, "tcp"), rep, bps, true));
                }
            }
        }
        v.push(m(&key("1M", 1500, "tcp"), 3, 0.0, false));
        v
    }

    #[test]
    fn a_pivot_is_the_seeds_grid_sorted_by_meaning() {
        let t = pivot(
            &runs(),
            &PivotSpec {
                rows: "window".into(),
                columns: Some("mtu".into()),
                split: vec!["protocol".into()],
                metric: Metric::Throughput,
                stat: Stat::Median,
            },
        );
        assert_eq!(t.len(), 1);
        let t = &t[0];
        assert_eq!(t.title, "throughput (median), window × mtu, protocol=tcp");
        assert_eq!(t.header, vec!["window", "mtu=1500", "mtu=9000"]);
        let first: Vec<&str> = t.rows.iter().map(|r| r[0].as_str()).collect();
        assert_eq!(first, vec!["64K", "1M", "16M"]);
        // Median of 100, 101, 102 Mbit/s (the failed run left out).
        assert_eq!(t.values[1][1], Some(101e6));
        assert!((t.values[1][2].unwrap() - 111e6).abs() < 1e-3);
        assert!(t.notes.is_empty());
    }

    #[test]
    fn a_layout_that_hides_a_parameter_says_it_pooled() {
        let t = pivot(
            &runs(),
            &PivotSpec {
                rows: "window".into(),
                columns: None,
                split: vec![],
                metric: Metric::Throughput,
                stat: Stat::N,
            },
        );
        assert_eq!(t[0].values[1][1], Some(6.0));
        assert_eq!(
            t[0].notes,
            vec!["pooled over mtu (not shown in this layout)"]
        );
    }

    #[test]
    fn a_parameter_that_follows_the_split_is_not_called_pooled() {
        // rate is set by the phase: splitting by phase shows it already.
        let runs: Vec<Measurement> = [("a", "100M"), ("b", "622M")]
            .iter()
            .flat_map(|(phase, rate)| {
                (1..=2).map(move |st| {
                    m(
                        &format!("{{\"phase\":\"{phase}\",\"rate\":\"{rate}\",\"streams\":{st}}}"),
                        0,
                        1e6,
                        true,
                    )
                })
            })
            .collect();
        let t = pivot(
            &runs,
            &PivotSpec {
                rows: "streams".into(),
                columns: None,
                split: vec!["phase".into()],
                metric: Metric::Throughput,
                stat: Stat::Median,
            },
        );
        assert_eq!(t.len(), 2);
        assert!(t.iter().all(|t| t.notes.is_empty()), "{:?}", t[0].notes);
    }

    #[test]
    fn the_cell_table_has_every_statistic_against_hand_computed_values() {
        let t = cells(&runs());
        assert_eq!(t.rows.len(), 6);
        let row = t
            .rows
            .iter()
            .position(|r| r[0] == "mtu=1500 window=1M")
            .unwrap();
        let v = &t.values[row];
        // n = 3 ok, 1 failed; 100, 101, 102 Mbit/s.
        assert_eq!((v[1], v[2]), (Some(3.0), Some(1.0)));
        assert_eq!((v[3], v[5], v[8]), (Some(100e6), Some(101e6), Some(102e6)));
        assert_eq!(v[4], Some(100.2e6)); // p10: 100 + 0.2 × 1
        assert_eq!(v[6], Some(101e6));
        assert!((v[9].unwrap() - 1e6).abs() < 1e-3); // sample sd of 100, 101, 102
                                                     // RTT: mean of means 88.101 ms; pooled sd √(1² + var of means) ms.
        assert!((v[11].unwrap() - 88_101.0).abs() < 1e-6);
        assert_eq!(t.rows[row][11], "88.0/88.1/90.0 (1.00)");
    }

    #[test]
    fn seed_figures_stand_beside_ours_with_a_ratio() {
        let mut cell = BTreeMap::new();
        cell.insert("window".to_string(), Value::from("16M"));
        cell.insert("mtu".to_string(), Value::from(9000));
        let f = SeedFigure {
            cell: cell.clone(),
            metric: "throughput".into(),
            stat: "max".into(),
            ratio_to: None,
            value: 800e6,
            source: "Table 3".into(),
            note: Some("NIC-limited".into()),
        };
        let t = seed(&runs(), std::slice::from_ref(&f));
        assert_eq!(t.rows[0][0], "mtu=9000 window=16M");
        assert!((t.values[0][3].unwrap() - 772e6).abs() < 1e-3); // 770 + 2 Mbit/s
        assert_eq!(t.rows[0][4], "0.97"); // 772 / 800 = 0.965
        assert_eq!(t.notes, vec!["mtu=9000 window=16M: NIC-limited"]);

        // As a ratio: MTU 9000 over 1500 at 16M is 1.1 by construction.
        let mut over = f.clone();
        over.cell.remove("window");
        over.cell.insert("window".into(), Value::from("16M"));
        let mut base = over.cell.clone();
        base.insert("mtu".into(), Value::from(1500));
        over.ratio_to = Some(base);
        over.value = 1.1;
        let t = seed(&runs(), &[over]);
        assert_eq!(t.rows[0][0], "mtu=9000 window=16M over mtu=1500 window=16M");
        assert_eq!(t.rows[0][2], "1.10×");
        assert!((t.values[0][3].unwrap() - 772.0 / 702.0).abs() < 1e-9);
    }
}
