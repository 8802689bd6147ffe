//! Statistics over runs: the numbers `fatpipe report` and `archive show`
//! print per sweep cell.
//!
//! Pure functions over slices, no database, so they are tested against
//! hand-computed values and the same code serves every backend. The
//! definitions are the common ones, stated so a reader can check a figure:
//!
//! * **stddev** is the *sample* standard deviation (divisor n − 1): a cell's
//!   repetitions are a sample of what the path would do; `None` for n < 2.
//! * **percentiles** (median, p10, p90) interpolate linearly between the
//!   closest ranks, numpy's default: rank `p/100 × (n − 1)` in the sorted
//!   values, so the median of 1, 2, 3, 4 is 2.5 and p90 of 1..=10 is 9.1.
//!   p90 is what the issue calls "top 10%": the value 10% of runs exceed.
//! * non-finite values (NaN, ∞) are left out: they mean "not measured".
//!
//! Within one run, the RTT spread (`rtt_std_us`) is instead a *population*
//! deviation ([`population`]), like ping's mdev and `fatpipe path`: those
//! samples are the whole run, not a sample of it.

use std::collections::BTreeMap;

use crate::record::{Measurement, Metrics, RunKind};

/// The statistics of one set of values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// How many values.
    pub n: usize,
    /// Smallest.
    pub min: f64,
    /// 10th percentile.
    pub p10: f64,
    /// 50th percentile.
    pub median: f64,
    /// Arithmetic mean.
    pub mean: f64,
    /// 90th percentile ("top 10%").
    pub p90: f64,
    /// Largest.
    pub max: f64,
    /// Sample standard deviation (n − 1); `None` for a single value.
    pub stddev: Option<f64>,
}

/// What identifies a cell: runs of a sweep group by (sweep, cell); runs
/// outside sweeps by path and kind alone (sweep and cell `None`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CellKey {
    /// The sweep, if any.
    pub sweep: Option<String>,
    /// The cell key, if any.
    pub cell: Option<String>,
    /// The path key.
    pub path: String,
    /// The command.
    pub kind: RunKind,
}

/// Statistics of one cell: every figure of [`Metrics`] summarised over the
/// cell's successful runs (`None` where no run measured it).
#[derive(Debug, Clone, PartialEq)]
pub struct CellStats {
    /// Which cell.
    pub key: CellKey,
    /// Runs in the cell, failed ones included.
    pub runs: usize,
    /// Failed runs (their figures are left out).
    pub failed: usize,
    /// Throughput, bit/s.
    pub throughput_bps: Option<Summary>,
    /// Retransmitted segments.
    pub retransmits: Option<Summary>,
    /// Each run's minimum RTT, µs.
    pub rtt_min_us: Option<Summary>,
    /// Each run's mean RTT, µs.
    pub rtt_avg_us: Option<Summary>,
    /// Each run's maximum RTT, µs.
    pub rtt_max_us: Option<Summary>,
    /// Each run's RTT deviation, µs.
    pub rtt_std_us: Option<Summary>,
    /// Loss, percent.
    pub loss_percent: Option<Summary>,
    /// UDP jitter, ms.
    pub jitter_ms: Option<Summary>,
    /// This end's CPU, percent of one core.
    pub cpu_local_percent: Option<Summary>,
    /// The peer's CPU, percent of one core.
    pub cpu_remote_percent: Option<Summary>,
}

/// The statistics of `values` (non-finite ones left out); `None` when none
/// is left.
pub fn summarise(values: &[f64]) -> Option<Summary> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let mean = v.iter().sum::<f64>() / n as f64;
    let stddev = (n > 1).then(|| {
        let ss: f64 = v.iter().map(|x| (x - mean) * (x - mean)).sum();
        (ss / (n - 1) as f64).sqrt()
    });
    Some(Summary {
        n,
        min: v[0],
        p10: percentile_sorted(&v, 10.0),
        median: percentile_sorted(&v, 50.0),
        mean,
        p90: percentile_sorted(&v, 90.0),
        max: v[n - 1],
        stddev,
    })
}

/// The `p`th percentile (0–100) of `sorted` (ascending, finite, not
/// empty), by linear interpolation between closest ranks.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    let Some(&last) = sorted.last() else {
        return f64::NAN;
    };
    let rank = (p.clamp(0.0, 100.0) / 100.0) * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = (lo + 1).min(sorted.len() - 1);
    if lo >= sorted.len() - 1 {
        return last;
    }
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

/// Min, mean, max and *population* standard deviation of one run's
/// samples (non-finite ones left out); `None` when none is left.
pub fn population(values: &[f64]) -> Option<(f64, f64, f64, f64)> {
    let v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((min, mean, max, var.sqrt()))
}

/// Groups `runs` by cell (see [`CellKey`]) and summarises each, in key
/// order.
pub fn by_cell(runs: &[Measurement]) -> Vec<CellStats> {
    type Key<'a> = (Option<&'a str>, Option<&'a str>, &'a str, RunKind);
    let mut groups: BTreeMap<Key<'_>, Vec<&Measurement>> = BTreeMap::new();
    for m in runs {
        let key = (
            m.sweep.as_ref().map(|s| s.sweep.as_str()),
            m.sweep.as_ref().map(|s| s.cell.as_str()),
            m.path.as_str(),
            m.kind,
        );
        groups.entry(key).or_default().push(m);
    }
    groups
        .into_iter()
        .map(|((sweep, cell, path, kind), members)| {
            let ok: Vec<&Metrics> = members
                .iter()
                .filter(|m| m.ok)
                .map(|m| &m.metrics)
                .collect();
            let col = |f: fn(&Metrics) -> Option<f64>| -> Option<Summary> {
                let values: Vec<f64> = ok.iter().filter_map(|m| f(m)).collect();
                summarise(&values)
            };
            CellStats {
                key: CellKey {
                    sweep: sweep.map(str::to_owned),
                    cell: cell.map(str::to_owned),
                    path: path.to_owned(),
                    kind,
                },
                runs: members.len(),
                failed: members.len() - ok.len(),
                throughput_bps: col(|m| m.throughput_bps),
                retransmits: col(|m| m.retransmits.map(|r| r as f64)),
                rtt_min_us: col(|m| m.rtt_min_us),
                rtt_avg_us: col(|m| m.rtt_avg_us),
                rtt_max_us: col(|m| m.rtt_max_us),
                rtt_std_us: col(|m| m.rtt_std_us),
                loss_percent: col(|m| m.loss_percent),
                jitter_ms: col(|m| m.jitter_ms),
                cpu_local_percent: col(|m| m.cpu_local_percent),
                cpu_remote_percent: col(|m| m.cpu_remote_percent),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{from_micros, SweepRef};

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-9, "{a} != {b}");
    }

    #[test]
    fn summary_of_four_values_by_hand() {
        // 1 2 3 4 (given out of order): mean 2.5; deviations ±1.5, ±0.5,
        // squares 2.25+0.25+0.25+2.25 = 5, /3 → sd √(5/3) = 1.2909944487.
        // Ranks: p10 at 0.3 → 1 + 0.3 = 1.3; median at 1.5 → 2.5;
        // p90 at 2.7 → 3 + 0.7 = 3.7.
        let s = summarise(&[3.0, 1.0, 4.0, 2.0]).unwrap();
        assert_eq!(s.n, 4);
        close(s.min, 1.0);
        close(s.max, 4.0);
        close(s.mean, 2.5);
        close(s.median, 2.5);
        close(s.p10, 1.3);
        close(s.p90, 3.7);
        close(s.stddev.unwrap(), (5.0f64 / 3.0).sqrt());
    }

    #[test]
    fn summary_of_ten_values_by_hand() {
        // 1..=10: mean 5.5, median 5.5, p10 at rank 0.9 → 1.9, p90 at 8.1 →
        // 9.1, sum of squared deviations 82.5, /9 → sd 3.0276503541.
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        let s = summarise(&v).unwrap();
        close(s.median, 5.5);
        close(s.p10, 1.9);
        close(s.p90, 9.1);
        close(s.stddev.unwrap(), 3.0276503540974917);
    }

    #[test]
    fn odd_count_median_is_the_middle_value() {
        // 10, 20, 60: mean 30, median 20; p10 at rank 0.2 → 12, p90 at 1.8
        // → 52; sd √((400+100+900)/2) = √700.
        let s = summarise(&[60.0, 10.0, 20.0]).unwrap();
        close(s.median, 20.0);
        close(s.mean, 30.0);
        close(s.p10, 12.0);
        close(s.p90, 52.0);
        close(s.stddev.unwrap(), 700.0f64.sqrt());
    }

    #[test]
    fn single_value_and_empty_and_non_finite() {
        let s = summarise(&[7.0, f64::NAN]).unwrap();
        assert_eq!(
            (s.n, s.min, s.median, s.p90, s.max),
            (1, 7.0, 7.0, 7.0, 7.0)
        );
        assert_eq!(s.stddev, None);
        assert_eq!(summarise(&[]), None);
        assert_eq!(summarise(&[f64::NAN, f64::INFINITY]), None);
    }

    #[test]
    fn population_deviation_by_hand() {
        // 2 4 4 4 5 5 7 9: mean 5, population sd exactly 2.
        let (min, mean, max, sd) = population(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]).unwrap();
        assert_eq!((min, mean, max, sd), (2.0, 5.0, 9.0, 2.0));
    }

    #[test]
    fn groups_by_cell_and_leaves_out_failed_runs() {
        let m = |cell: &str, rep: u32, ok: bool, bps: f64| Measurement {
            id: 0,
            kind: RunKind::Test,
            started: from_micros(0).unwrap(),
            ok,
            sweep: Some(SweepRef {
                sweep: "s".into(),
                cell: cell.into(),
                repetition: rep,
            }),
            path: "a→b".into(),
            metrics: Metrics {
                throughput_bps: Some(bps),
                ..Metrics::default()
            },
        };
        let runs = vec![
            m("b", 0, true, 100.0),
            m("a", 0, true, 1.0),
            m("a", 1, false, 1e9),
            m("a", 2, true, 3.0),
        ];
        let cells = by_cell(&runs);
        assert_eq!(cells.len(), 2);
        assert_eq!(cells[0].key.cell.as_deref(), Some("a"));
        assert_eq!((cells[0].runs, cells[0].failed), (3, 1));
        let t = cells[0].throughput_bps.unwrap();
        assert_eq!((t.n, t.mean, t.median), (2, 2.0, 2.0));
        assert_eq!(cells[0].retransmits, None);
        assert_eq!(cells[1].throughput_bps.unwrap().n, 1);
    }
}
