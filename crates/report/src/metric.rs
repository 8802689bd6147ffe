//! The measures a report can show, where each comes from in a run's
//! columns, and how each is printed for people (through
//! `fatpipe_schema::units`, like every other number fatpipe prints).

use fatpipe_archive::stats::Summary;
use fatpipe_archive::Metrics;
use fatpipe_schema::units;

/// One measure of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// bit/s.
    Throughput,
    /// Retransmitted segments.
    Retransmits,
    /// The run's smallest RTT, µs.
    RttMin,
    /// The run's mean RTT, µs.
    Rtt,
    /// The run's largest RTT, µs.
    RttMax,
    /// The run's RTT deviation, µs.
    RttStd,
    /// Loss, percent.
    Loss,
    /// Jitter, ms.
    Jitter,
    /// This end's CPU, percent of a core.
    CpuLocal,
    /// The peer's CPU, percent of a core.
    CpuRemote,
}

/// One statistic over a cell's runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stat {
    /// Middle value.
    Median,
    /// Arithmetic mean.
    Mean,
    /// 10th percentile.
    P10,
    /// 90th percentile: "the top 10 % are above".
    P90,
    /// Smallest.
    Min,
    /// Largest.
    Max,
    /// Sample standard deviation.
    Stddev,
    /// How many runs.
    N,
}

impl Metric {
    /// Every metric, in report order.
    pub const ALL: [Metric; 10] = [
        Metric::Throughput,
        Metric::Retransmits,
        Metric::RttMin,
        Metric::Rtt,
        Metric::RttMax,
        Metric::RttStd,
        Metric::Loss,
        Metric::Jitter,
        Metric::CpuLocal,
        Metric::CpuRemote,
    ];

    /// Parses the names experiment files and `--metric` use.
    pub fn parse(s: &str) -> Option<Metric> {
        Metric::ALL.into_iter().find(|m| m.name() == s)
    }

    /// Its name in files and flags.
    pub fn name(self) -> &'static str {
        match self {
            Metric::Throughput => "throughput",
            Metric::Retransmits => "retransmits",
            Metric::RttMin => "rtt_min",
            Metric::Rtt => "rtt",
            Metric::RttMax => "rtt_max",
            Metric::RttStd => "rtt_std",
            Metric::Loss => "loss",
            Metric::Jitter => "jitter",
            Metric::CpuLocal => "cpu_local",
            Metric::CpuRemote => "cpu_remote",
        }
    }

    /// Its name for people, with the unit the values are in.
    pub fn label(self) -> &'static str {
        match self {
            Metric::Throughput => "throughput",
            Metric::Retransmits => "retransmits",
            Metric::RttMin => "RTT min",
            Metric::Rtt => "RTT avg",
            Metric::RttMax => "RTT max",
            Metric::RttStd => "RTT std",
            Metric::Loss => "loss",
            Metric::Jitter => "jitter",
            Metric::CpuLocal => "CPU here",
            Metric::CpuRemote => "CPU peer",
        }
    }

    /// The run's value, in the base unit.
    pub fn of(self, m: &Metrics) -> Option<f64> {
        match self {
            Metric::Throughput => m.throughput_bps,
            Metric::Retransmits => m.retransmits.map(|r| r as f64),
            Metric::RttMin => m.rtt_min_us,
            Metric::Rtt => m.rtt_avg_us,
            Metric::RttMax => m.rtt_max_us,
            Metric::RttStd => m.rtt_std_us,
            Metric::Loss => m.loss_percent,
            Metric::Jitter => m.jitter_ms,
            Metric::CpuLocal => m.cpu_local_percent,
            Metric::CpuRemote => m.cpu_remote_percent,
        }
    }

    /// `v` (base unit) for people.
    pub fn format(self, v: f64) -> String {
        if !v.is_finite() {
            return "-".into();
        }
        match self {
            Metric::Throughput => units::format_rate(v),
            Metric::Retransmits => format!("{:.0}", v),
            Metric::RttMin | Metric::Rtt | Metric::RttMax | Metric::RttStd => {
                format!("{:.2} ms", v / 1000.0)
            }
            Metric::Loss => format!("{v:.3} %"),
            Metric::Jitter => format!("{v:.3} ms"),
            Metric::CpuLocal | Metric::CpuRemote => format!("{v:.0} %"),
        }
    }
}

impl Stat {
    /// Every statistic.
    pub const ALL: [Stat; 8] = [
        Stat::Median,
        Stat::Mean,
        Stat::P10,
        Stat::P90,
        Stat::Min,
        Stat::Max,
        Stat::Stddev,
        Stat::N,
    ];

    /// Parses the names experiment files and `--stat` use.
    pub fn parse(s: &str) -> Option<Stat> {
        Stat::ALL.into_iter().find(|x| x.name() == s)
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Stat::Median => "median",
            Stat::Mean => "mean",
            Stat::P10 => "p10",
            Stat::P90 => "p90",
            Stat::Min => "min",
            Stat::Max => "max",
            Stat::Stddev => "stddev",
            Stat::N => "n",
        }
    }

    /// The statistic of a summary.
    pub fn of(self, s: &Summary) -> Option<f64> {
        match self {
            Stat::Median => Some(s.median),
            Stat::Mean => Some(s.mean),
            Stat::P10 => Some(s.p10),
            Stat::P90 => Some(s.p90),
            Stat::Min => Some(s.min),
            Stat::Max => Some(s.max),
            Stat::Stddev => s.stddev,
            Stat::N => Some(s.n as f64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_values_come_from_their_columns() {
        for m in Metric::ALL {
            assert_eq!(Metric::parse(m.name()), Some(m));
        }
        for s in Stat::ALL {
            assert_eq!(Stat::parse(s.name()), Some(s));
        }
        let m = Metrics {
            throughput_bps: Some(9.41e8),
            retransmits: Some(12),
            rtt_avg_us: Some(88_500.0),
            ..Metrics::default()
        };
        assert_eq!(Metric::Throughput.of(&m), Some(9.41e8));
        assert_eq!(Metric::Retransmits.of(&m), Some(12.0));
        assert_eq!(Metric::Rtt.format(88_500.0), "88.50 ms");
        assert_eq!(Metric::Loss.of(&m), None);
    }
}
