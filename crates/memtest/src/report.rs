//! What the test service tells the server's observer (the Prometheus
//! metrics of `fatpipe server --metrics`): bytes as they move, the data
//! streams open, and at the end what the server saw of the test.
//!
//! Bytes are reported at every interval tick and once more at the end, as
//! the growth of each stream's counter since the last report, so a scrape
//! during a long test sees them rise, and the sum over a test equals what
//! the streams moved (warm-up included: it crossed the wire too).

use std::collections::HashMap;
use std::time::Duration;

use fatpipe_engine::{Flow, Report, Streams, TestSummary};

use crate::data::{self, Stream};
use crate::msg::{Role, StreamSample};

/// A session's running report: its open streams, and how much of each
/// stream's bytes was already reported.
pub(crate) struct Meter {
    streams: Streams,
    reported: HashMap<u32, u64>,
}

impl Meter {
    /// Counts `n` streams as open until the meter drops.
    pub(crate) fn new(report: &Report, n: usize) -> Meter {
        Meter {
            streams: report.streams(n as u64),
            reported: HashMap::new(),
        }
    }

    /// `n` more streams are open.
    pub(crate) fn add_streams(&self, n: usize) {
        self.streams.add(n as u64);
    }

    /// Reports what each stream moved since the last call.
    pub(crate) fn bytes(&mut self, report: &Report, streams: &[Stream]) {
        let (mut sent, mut received) = (0u64, 0u64);
        for s in streams {
            let now = data::snapshot(s).bytes();
            let before = self.reported.insert(s.id, now).unwrap_or(0);
            let grew = now.saturating_sub(before);
            match s.role {
                Role::Send => sent += grew,
                Role::Recv => received += grew,
            }
        }
        report.bytes(Flow::Sent, sent);
        report.bytes(Flow::Received, received);
    }
}

/// What the server saw of a finished test, one summary per direction it
/// had streams in: bytes over the longest stream's measured time, the
/// sender's retransmits (known only where the server sent), the mean RTT
/// of the streams whose TCP knew it.
pub(crate) fn summaries(totals: &[StreamSample]) -> Vec<TestSummary> {
    [(Role::Send, Flow::Sent), (Role::Recv, Flow::Received)]
        .into_iter()
        .filter_map(|(role, flow)| {
            let mine: Vec<&StreamSample> = totals.iter().filter(|s| s.role == Some(role)).collect();
            let bytes: u64 = mine.iter().map(|s| s.bytes).sum();
            let elapsed_us = mine.iter().map(|s| s.elapsed_us).max()?;
            if elapsed_us == 0 {
                return None;
            }
            let rtts: Vec<u64> = mine
                .iter()
                .filter(|s| s.rtt_us > 0)
                .map(|s| u64::from(s.rtt_us))
                .collect();
            let rtt = (!rtts.is_empty())
                .then(|| Duration::from_micros(rtts.iter().sum::<u64>() / rtts.len() as u64));
            Some(TestSummary {
                flow,
                bytes_per_second: bytes as f64 / (elapsed_us as f64 / 1e6),
                retransmits: (role == Role::Send).then(|| mine.iter().map(|s| s.retransmits).sum()),
                rtt,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(
        id: u32,
        role: Role,
        bytes: u64,
        elapsed_us: u64,
        rtt_us: u32,
        rx: u64,
    ) -> StreamSample {
        StreamSample {
            id,
            role: Some(role),
            bytes,
            elapsed_us,
            rtt_us,
            retransmits: rx,
            ..Default::default()
        }
    }

    #[test]
    fn one_summary_per_direction_with_retransmits_only_where_the_server_sent() {
        let totals = [
            sample(0, Role::Recv, 1_000_000, 1_000_000, 100, 0),
            sample(1, Role::Recv, 1_000_000, 2_000_000, 300, 0),
            sample(2, Role::Send, 4_000_000, 2_000_000, 0, 7),
            sample(3, Role::Send, 0, 1_000_000, 1000, 5),
        ];
        let got = summaries(&totals);
        assert_eq!(
            got,
            [
                TestSummary {
                    flow: Flow::Sent,
                    bytes_per_second: 2_000_000.0,
                    retransmits: Some(12),
                    rtt: Some(Duration::from_micros(1000)),
                },
                TestSummary {
                    flow: Flow::Received,
                    bytes_per_second: 1_000_000.0,
                    retransmits: None,
                    rtt: Some(Duration::from_micros(200)),
                },
            ]
        );
    }

    #[test]
    fn a_direction_without_streams_or_time_has_no_summary() {
        assert!(summaries(&[]).is_empty());
        let got = summaries(&[sample(0, Role::Recv, 5, 0, 0, 0)]);
        assert!(got.is_empty(), "{got:?}");
    }
}
