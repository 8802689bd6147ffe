//! The in-flight tuning of an auto-tuned copy: a session's [`Live`] handle
//! as a `fatpipe_tune::steer::Steerable`, and [`CopyTuner`], which keeps
//! one `Driver` across the reconnects of a copy.
//!
//! The copy samples the sending end once a second: pushing, this end's
//! data sockets (`TCP_INFO` `bytes_acked`, retransmits, RTT); pulling, the
//! bytes received here and the server's `Stats` for the rest. A sample is
//! the difference of two readings, so each session's first reading is
//! only a baseline; time counts from the first session's baseline so that
//! the adjuster's settling spans reconnects.
//!
//! Its configuration waits for the first session: pulling, the server
//! sends, so its congestion control and the ones it may switch to (and
//! its cap on streams) come with its `Accept`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use fatpipe_schema::tune::{AutoTune, Decision};
use fatpipe_tune::adjust::{AdjustConfig, Adjuster, Sample, Start};
use fatpipe_tune::steer::{self, Added, Driver, Event, ForcedAdd, Reading, Steerable};

use crate::live::{congestion_allowed, Live};
use crate::plan::lock;
use crate::service::CopyTuning;
use crate::wire::Direction;

/// How often the adjuster samples the transfer.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// How long adding streams may take (the server's own accept timeout
/// plus a margin).
const SETUP_WAIT: Duration = Duration::from_secs(40);

/// Test hook `N@K`: add N streams at the adjuster's K-th sample, whatever
/// it would have decided.
pub const TEST_ADD_ENV: &str = "FATPIPE_TEST_COPY_ADD";

/// An auto-tuned copy's in-flight tuning, shared by its sessions.
pub struct CopyTuner {
    record: AutoTune,
    /// Streams the copy started with.
    streams: u32,
    /// This end's congestion control when it sends (push).
    congestion: Option<String>,
    bwlimit: Option<u64>,
    forced_add: Option<ForcedAdd>,
    /// Made at the first session, when the server's answer is known.
    driver: Mutex<Option<Driver>>,
    /// When data started flowing (the adjuster's time zero).
    zero: Mutex<Option<Instant>>,
}

impl CopyTuner {
    /// The tuning of a copy that starts as `t` says, capped by `bwlimit`.
    pub fn new(t: &CopyTuning, bwlimit: Option<u64>) -> CopyTuner {
        CopyTuner {
            record: t.record.clone(),
            streams: u32::from(t.streams),
            congestion: t.data.congestion.clone(),
            bwlimit,
            forced_add: test_add_hook(),
            driver: Mutex::new(None),
            zero: Mutex::new(None),
        }
    }

    /// Runs beside one session until it ends, telling `on_event` about
    /// every sample and change (the binary prints them).
    pub fn run(&self, live: &Live, on_event: &mut dyn FnMut(Event<'_>)) {
        let mut driver = lock(&self.driver);
        let driver = driver.get_or_insert_with(|| {
            let options = steer::Options {
                // The record lists what was tried, and why it failed.
                record_failed: true,
                forced_add: self.forced_add.clone(),
            };
            Driver::new(Adjuster::new(self.config(live)), options)
        });
        let mut target = LiveTarget {
            live,
            zero: &self.zero,
            last: None,
        };
        driver.run(&mut target, on_event);
    }

    /// The changes so far, for the JSON.
    pub fn decisions(&self) -> Vec<Decision> {
        lock(&self.driver)
            .as_ref()
            .map_or_else(Vec::new, |d| d.decisions().to_vec())
    }

    /// The adjuster's configuration, from what the server said (pulling,
    /// the server sends: its congestion control and choices).
    fn config(&self, live: &Live) -> AdjustConfig {
        let acc = live.accepted();
        let (congestion, allowed) = match live.direction() {
            Direction::Push => (
                self.congestion.clone().unwrap_or_default(),
                congestion_allowed(),
            ),
            Direction::Pull => (acc.congestion.clone(), acc.congestion_allowed.clone()),
        };
        let held = self.record.plan.set_buffers;
        AdjustConfig::for_transfer(
            &self.record,
            &Start {
                streams: self.streams,
                congestion: Some(congestion),
                switchable: Some(allowed),
                // Receivers hold the planned windows.
                held_windows: held,
                // Each stream's share of the planned window (copy may use
                // more streams than planned, each with a share): what one
                // more adds.
                stream_window: self.record.buffer.filter(|_| held),
                rate_cap: self.bwlimit,
                peer_max_streams: Some(u32::from(acc.max_streams)),
            },
        )
    }
}

/// The test hook [`TEST_ADD_ENV`], if set (`crate::test_hook`: only in builds with the
/// `test-hooks` feature; others ignore the variable).
fn test_add_hook() -> Option<ForcedAdd> {
    let v = crate::test_hook(TEST_ADD_ENV)?;
    let (n, k) = v.split_once('@')?;
    Some(ForcedAdd {
        streams: n.trim().parse().ok()?,
        at_sample: k.trim().parse().ok()?,
        hook: TEST_ADD_ENV,
    })
}

/// One session as the driver sees it.
struct LiveTarget<'a> {
    live: &'a Live,
    zero: &'a Mutex<Option<Instant>>,
    /// The last reading: when, bytes moved, sender retransmits.
    last: Option<(Instant, u64, u64)>,
}

impl Steerable for LiveTarget<'_> {
    fn next_sample(&mut self) -> Option<Reading> {
        loop {
            if self.live.sleep(INTERVAL) {
                return None;
            }
            let Some(s) = self.live.sample() else {
                continue;
            };
            let streams = u32::from(s.streams);
            // Pulling, the sender's counters come from the server.
            let Some(sender) = s.sender else {
                return Some(Reading {
                    sample: None,
                    streams,
                    congestion: None,
                });
            };
            let now = Instant::now();
            let sample = self.last.replace((now, s.bytes, sender.retransmits)).map(
                |(t0, bytes0, retrans0)| {
                    let dt = now.duration_since(t0).as_secs_f64().max(1e-3);
                    let throughput = (s.bytes.saturating_sub(bytes0) as f64 * 8.0 / dt) as u64;
                    let zero = *lock(self.zero).get_or_insert(t0);
                    Sample {
                        now: now.duration_since(zero),
                        throughput,
                        retransmits: sender.retransmits.saturating_sub(retrans0),
                        rtt: Duration::from_micros(u64::from(sender.rtt_us)),
                    }
                },
            );
            return Some(Reading {
                sample,
                streams,
                congestion: Some(sender.congestion),
            });
        }
    }

    fn streams(&self) -> u32 {
        u32::from(self.live.streams())
    }

    fn add_streams(&mut self, n: u32) -> Result<Added, String> {
        let n = u16::try_from(n).unwrap_or(u16::MAX);
        self.live.add_streams(n, SETUP_WAIT).map(|got| Added {
            streams: u32::from(got),
            warnings: Vec::new(),
        })
    }

    fn set_congestion(&mut self, name: &str) -> Result<Vec<String>, String> {
        self.live.set_congestion(name).map(|()| Vec::new())
    }
}
