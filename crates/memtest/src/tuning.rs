//! Auto-tuning a test: the pre-flight's settings written into the test's
//! parameters, the in-flight adjuster's configuration for a test, and the
//! running test as a [`Steerable`] for `fatpipe_tune::steer::Driver`.
//!
//! The test's session loop is an event loop that must keep running while a
//! change is under way (dialing, the server's answer), so it cannot block
//! in a driver. It keeps its [`Adjust`] callbacks, and a bridge turns them
//! into the driver's blocking calls on a thread beside it
//! ([`run_client_steered`]): the loop hands each merged interval to the
//! driver and waits for its answer (hold, or a change), and after a change
//! waits until the driver has taken the outcome in. So the adjuster sees
//! exactly the intervals it saw when it ran in the loop (one sample per
//! merged interval, none while a change is under way) in the same order,
//! and whatever the driver's caller prints for a change comes before the
//! next interval, as before.

use std::sync::mpsc::{self, Receiver, Sender};
use std::time::Duration;

use fatpipe_audit::host::{is_privileged, Host};
use fatpipe_schema::test::TestInterval;
use fatpipe_schema::tune::AutoTune;
use fatpipe_tune::adjust::{AdjustConfig, Sample, Start};
use fatpipe_tune::auto::{Settings, Tuned};
use fatpipe_tune::steer::{Added, Reading, Steerable};

use crate::msg::{Direction, TestParams, MAX_STREAMS};
use crate::{run_client_adjusting, Adjust, Adjustment, Applied, Progress, TestPlan};
use fatpipe_engine::Result;
use fatpipe_schema::test as schema;

/// Writes the pre-flight's outcome into the test parameters: the merged
/// settings and the start-up window the receivers hold.
pub fn tune(p: &mut TestParams, t: &Tuned) {
    apply(&t.settings, p);
    p.start_window = t
        .start_window
        .map(|(w, d)| (w, u64::try_from(d.as_millis()).unwrap_or(u64::MAX)));
}

/// Writes merged settings into the test parameters.
pub fn apply(s: &Settings, p: &mut TestParams) {
    p.streams = s.streams.clamp(1, MAX_STREAMS);
    p.window = s.buffer;
    p.force_buffers = s.forced_buffers;
    p.congestion.clone_from(&s.congestion);
    p.fq_rate = s.pacing_rate;
}

/// The in-flight adjuster's configuration for a test tuned by `auto`.
/// BBR may be switched to (and a clean BBR test cruise on CUBIC) only if
/// no `-C` fixed the congestion control (`congestion_given`) and this host
/// is the sender and offers it: the server's list is not known here.
pub fn adjust_config(p: &TestParams, auto: &AutoTune, congestion_given: bool) -> AdjustConfig {
    let offered = Host::live()
        .limits(is_privileged())
        .map(|l| l.congestion)
        .unwrap_or_default();
    let switchable = !congestion_given && p.direction == Direction::Up;
    AdjustConfig::for_transfer(
        auto,
        &Start {
            streams: p.streams,
            congestion: p.congestion.clone(),
            switchable: switchable.then_some(offered),
            // Receivers hold windows that are set (by the plan or -w).
            held_windows: p.window.is_some(),
            stream_window: p.window,
            rate_cap: None,
            peer_max_streams: None,
        },
    )
}

/// The adjuster's view of an interval: goodput at the receivers,
/// retransmits at the senders and their mean RTT, over all directions.
pub fn sample_of(iv: &TestInterval) -> Option<Sample> {
    if iv.sums.is_empty() {
        return None;
    }
    // A direction whose streams know no RTT yet sums to 0 (unknown, as in
    // `sums`); counting it would halve the mean and fake a shorter path.
    let known: Vec<u64> = iv
        .sums
        .iter()
        .filter_map(|s| s.rtt_us.filter(|&r| r > 0).map(u64::from))
        .collect();
    let rtt_us = known.iter().sum::<u64>() / (known.len() as u64).max(1);
    Some(Sample {
        now: Duration::try_from_secs_f64(iv.end_s).unwrap_or_default(),
        throughput: iv.sums.iter().map(|s| s.bits_per_second).sum::<f64>() as u64,
        retransmits: iv.sums.iter().filter_map(|s| s.retransmits).sum(),
        rtt: Duration::from_micros(rtt_us),
    })
}

/// [`run_client_adjusting`] with `steer` run on a thread beside it,
/// steering the test through a [`TestTarget`]. Returns the report and what
/// `steer` returned (`None` if it panicked).
pub fn run_client_steered<R: Send>(
    plan: &TestPlan,
    on_progress: &mut dyn FnMut(Progress<'_>),
    steer: impl FnOnce(&mut TestTarget) -> R + Send,
) -> (Result<schema::TestReport>, Option<R>) {
    let (to_driver, from_test) = mpsc::channel();
    let (to_test, from_driver) = mpsc::channel();
    let mut target = TestTarget {
        tx: to_test,
        rx: from_test,
        streams: plan.params.streams,
        owed: None,
        unavailable: None,
    };
    std::thread::scope(|scope| {
        let driver = scope.spawn(move || {
            let r = steer(&mut target);
            // Closing the channels frees a loop still waiting for it.
            drop(target);
            r
        });
        let mut bridge = Bridge {
            tx: to_driver,
            rx: from_driver,
        };
        let report = run_client_adjusting(plan, on_progress, Some(&mut bridge));
        drop(bridge);
        (report, driver.join().ok())
    })
}

/// The running test as the driver sees it (see the module docs).
pub struct TestTarget {
    tx: Sender<ToTest>,
    rx: Receiver<ToDriver>,
    /// Streams per direction now.
    streams: u32,
    /// What the session loop waits for before it goes on.
    owed: Option<Owed>,
    unavailable: Option<String>,
}

impl TestTarget {
    /// Why the test cannot be steered (UDP, a server too old), once it
    /// said so; then it gave no sample.
    pub fn unavailable(&self) -> Option<&str> {
        self.unavailable.as_deref()
    }

    /// Lets the session loop go on: the interval it handed over is
    /// answered (hold), or the outcome it reported was taken in.
    fn settle(&mut self) {
        let _ = match self.owed.take() {
            Some(Owed::Answer) => self.tx.send(ToTest::Hold),
            Some(Owed::Resume) => self.tx.send(ToTest::Resume),
            None => Ok(()),
        };
    }

    /// Asks for a change in answer to the last interval, and waits for it
    /// to be carried out at both ends or refused.
    fn change(&mut self, change: Adjustment) -> std::result::Result<Applied, String> {
        if self.owed != Some(Owed::Answer) {
            return Err("no interval to act on".into());
        }
        self.owed = None;
        if self.tx.send(ToTest::Change(change)).is_err() {
            return Err("the test ended first".into());
        }
        loop {
            match self.rx.recv() {
                Ok(ToDriver::Outcome(r)) => {
                    self.owed = Some(Owed::Resume);
                    if let Ok(a) = &r {
                        self.streams = a.streams;
                    }
                    return r;
                }
                Ok(_) => continue,
                Err(_) => return Err("the test ended first".into()),
            }
        }
    }
}

impl Steerable for TestTarget {
    fn next_sample(&mut self) -> Option<Reading> {
        self.settle();
        loop {
            match self.rx.recv().ok()? {
                ToDriver::Interval(sample) => {
                    self.owed = Some(Owed::Answer);
                    return Some(Reading {
                        sample,
                        streams: self.streams,
                        congestion: None,
                    });
                }
                ToDriver::Unavailable(why) => {
                    self.unavailable = Some(why);
                    return None;
                }
                ToDriver::Outcome(_) => continue,
            }
        }
    }

    fn streams(&self) -> u32 {
        self.streams
    }

    fn add_streams(&mut self, n: u32) -> std::result::Result<Added, String> {
        // Both ends add all of them or none.
        let applied = self.change(Adjustment::AddStreams(n))?;
        Ok(Added {
            streams: n,
            warnings: applied.warnings,
        })
    }

    fn set_congestion(&mut self, name: &str) -> std::result::Result<Vec<String>, String> {
        let applied = self.change(Adjustment::SetCongestion(name.to_string()))?;
        Ok(applied.warnings)
    }
}

/// The session loop's side of the bridge.
struct Bridge {
    tx: Sender<ToDriver>,
    rx: Receiver<ToTest>,
}

impl Adjust for Bridge {
    fn on_interval(&mut self, iv: &TestInterval) -> Option<Adjustment> {
        self.tx.send(ToDriver::Interval(sample_of(iv))).ok()?;
        match self.rx.recv() {
            Ok(ToTest::Change(c)) => Some(c),
            _ => None,
        }
    }

    fn on_result(&mut self, _change: &Adjustment, result: std::result::Result<Applied, String>) {
        if self.tx.send(ToDriver::Outcome(result)).is_ok() {
            let _ = self.rx.recv();
        }
    }

    fn unavailable(&mut self, why: &str) {
        if self.tx.send(ToDriver::Unavailable(why.to_string())).is_ok() {
            // Until the driver is gone: it asks for nothing more.
            let _ = self.rx.recv();
        }
    }
}

/// The session loop to the driver.
enum ToDriver {
    Interval(Option<Sample>),
    Outcome(std::result::Result<Applied, String>),
    Unavailable(String),
}

/// The driver to the session loop.
enum ToTest {
    /// No change for this interval.
    Hold,
    Change(Adjustment),
    /// The outcome was taken in (and shown).
    Resume,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owed {
    Answer,
    Resume,
}

#[cfg(test)]
mod tests {
    use super::*;
    use fatpipe_schema::test::StreamStats;

    fn sums(v: &[(f64, u64, u32)]) -> TestInterval {
        TestInterval {
            index: 3,
            start_s: 3.0,
            end_s: 4.0,
            omitted: false,
            streams: vec![],
            sums: v
                .iter()
                .map(|&(bps, retx, rtt)| StreamStats {
                    bits_per_second: bps,
                    retransmits: Some(retx),
                    rtt_us: Some(rtt),
                    ..StreamStats::default()
                })
                .collect(),
        }
    }

    #[test]
    fn a_sample_sums_both_directions_and_averages_their_rtt() {
        let s = sample_of(&sums(&[(4e8, 3, 90_000), (2e8, 5, 100_000)])).unwrap();
        assert_eq!(s.now, Duration::from_secs(4));
        assert_eq!((s.throughput, s.retransmits), (600_000_000, 8));
        assert_eq!(s.rtt, Duration::from_micros(95_000));
        assert_eq!(sample_of(&sums(&[])), None);
        // The down direction knows no RTT yet (0): only up's counts.
        let s = sample_of(&sums(&[(4e8, 3, 90_000), (2e8, 5, 0)])).unwrap();
        assert_eq!(s.rtt, Duration::from_micros(90_000));
        let s = sample_of(&sums(&[(4e8, 3, 0)])).unwrap();
        assert_eq!(s.rtt, Duration::ZERO);
    }
}
