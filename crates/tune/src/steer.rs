//! The in-flight driver: runs the [`Adjuster`] beside a transfer and carries
//! out what it decides, for every service that can be steered.
//!
//! The adjuster is pure (a sample in, a [`Decision`] out); something has to
//! fetch the samples, act on the decisions, keep their record and notice
//! when acting failed. That is [`Driver`], and it is the one place with
//! those rules, so `fatpipe test` and `fatpipe copy` steer the same way.
//! The services differ only in how they sample and how they change a
//! running transfer, which is the small [`Steerable`] trait: the
//! memory-to-memory test implements it over its session loop (one sample
//! per merged interval), the copy over its `Live` handle (one a second).
//!
//! The driver blocks in [`Steerable::next_sample`] and in the changes, so it
//! runs on a thread of its own beside the transfer; it reads no clock (the
//! samples carry their time) and prints nothing: every sample and every
//! change is handed to the caller as an [`Event`], and the binary renders
//! them. So its tests drive it with samples given as values.
//!
//! A copy reconnects after a dropped connection and its new session starts
//! from the planned streams: the driver outlives sessions ([`Driver::run`]
//! is called once per session) and brings a new one back to the streams
//! and congestion control the adjuster had reached before it samples.

use fatpipe_schema::tune::{Action, Decision};

use crate::adjust::{Adjuster, Sample};

/// A running transfer the [`Driver`] can watch and change.
pub trait Steerable {
    /// Blocks until the next reading; `None` once the transfer (or this
    /// session of it) is over.
    fn next_sample(&mut self) -> Option<Reading>;
    /// Streams the transfer has now (per direction).
    fn streams(&self) -> u32;
    /// Adds `n` streams and returns once they carry data or the peer said
    /// no: how many were added, and what either end capped or refused.
    fn add_streams(&mut self, n: u32) -> Result<Added, String>;
    /// Switches the sending streams (and any added later) to `name`;
    /// returns what either end warned about.
    fn set_congestion(&mut self, name: &str) -> Result<Vec<String>, String>;
}

/// One look at the transfer.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// The adjuster's sample, or `None` when this look could not make one
    /// (the first look of a session is only a baseline; a pull has no
    /// sender counters before the server's first report).
    pub sample: Option<Sample>,
    /// Streams at the time of the look.
    pub streams: u32,
    /// The sender's congestion control as read, when the service knows it
    /// (for traces only).
    pub congestion: Option<String>,
}

/// What an added-streams request came to.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Added {
    /// Streams added (the peer may grant fewer than asked).
    pub streams: u32,
    /// What either end capped or refused on the way.
    pub warnings: Vec<String>,
}

/// A change the driver makes whatever the adjuster says (a test hook: it
/// makes the in-flight path run on a link where the adjuster would hold).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForcedAdd {
    /// Streams to add.
    pub streams: u32,
    /// At which sample (1 is the first the adjuster would see).
    pub at_sample: u32,
    /// The hook's name, for the decision's reason.
    pub hook: &'static str,
}

/// How a driver keeps its record.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Options {
    /// Keep changes that failed in [`Driver::decisions`] too, their reason
    /// followed by why (copy lists what it tried); otherwise only those
    /// carried out are kept (test).
    pub record_failed: bool,
    /// A test hook's forced add, if any.
    pub forced_add: Option<ForcedAdd>,
}

/// A change the driver tried.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The decision as carried out: the streams actually added, the
    /// streams after it, and on failure the reason followed by why.
    pub decision: Decision,
    /// The warnings of a change carried out, or why it was not.
    pub outcome: Result<Vec<String>, String>,
    /// A failed add: the adjuster's stream count no longer matches the
    /// transfer's, so nothing more is asked until a new session.
    pub last: bool,
}

/// What the driver tells its caller.
#[derive(Debug)]
pub enum Event<'a> {
    /// Every sample the adjuster (or a forced add) answered, before the
    /// answer is carried out: for traces.
    Sampled {
        /// 1 for the first sample, counted across sessions.
        index: u32,
        /// The look the sample came from.
        reading: &'a Reading,
        /// The answer.
        decision: &'a Decision,
    },
    /// A change was carried out or failed.
    Changed(&'a Step),
}

/// Runs an [`Adjuster`] over a [`Steerable`] transfer; see the module docs.
#[derive(Debug)]
pub struct Driver {
    adjuster: Adjuster,
    options: Options,
    decisions: Vec<Decision>,
    /// Samples the adjuster (or a forced add) answered, over all sessions.
    samples: u32,
    /// A congestion switch was tried: a new session switches back to
    /// where the adjuster is.
    switched: bool,
}

impl Driver {
    /// A driver for a transfer that starts where `adjuster` does.
    pub fn new(adjuster: Adjuster, options: Options) -> Driver {
        Driver {
            adjuster,
            options,
            decisions: Vec::new(),
            samples: 0,
            switched: false,
        }
    }

    /// The changes so far (see [`Options::record_failed`]), for the JSON.
    pub fn decisions(&self) -> &[Decision] {
        &self.decisions
    }

    /// Steers one session of the transfer until `target` has no more
    /// readings, telling `on_event` about every sample and change.
    pub fn run(&mut self, target: &mut dyn Steerable, on_event: &mut dyn FnMut(Event<'_>)) {
        let mut restored = false;
        let mut stopped = false;
        while let Some(reading) = target.next_sample() {
            if !restored {
                restored = true;
                self.restore(target);
            }
            let Some(sample) = reading.sample else {
                continue;
            };
            if stopped {
                continue;
            }
            self.samples += 1;
            let index = self.samples;
            let decision = match &self.options.forced_add {
                Some(f) if f.at_sample == index => Decision {
                    at_secs: sample.now.as_secs_f64(),
                    action: Action::AddStreams { n: f.streams },
                    streams: target.streams() + f.streams,
                    reason: format!(
                        "test hook {}: {} streams at sample {index}",
                        f.hook, f.streams
                    ),
                },
                _ => self.adjuster.handle_sample(sample),
            };
            on_event(Event::Sampled {
                index,
                reading: &reading,
                decision: &decision,
            });
            if !decision.is_change() {
                continue;
            }
            let step = self.carry_out(target, decision);
            stopped = step.last;
            on_event(Event::Changed(&step));
            if step.outcome.is_ok() || self.options.record_failed {
                self.decisions.push(step.decision);
            }
        }
    }

    /// A session that starts below the adjuster's streams (a reconnected
    /// copy starts from the plan) or on another congestion control is
    /// brought back to where the adjuster is. Best effort: a failure here
    /// shows in the samples, and the adjuster goes on from its own count.
    fn restore(&mut self, target: &mut dyn Steerable) {
        let (want, have) = (self.adjuster.streams(), target.streams());
        if want > have {
            let _ = target.add_streams(want - have);
        }
        if self.switched {
            let cc = self.adjuster.congestion().to_string();
            let _ = target.set_congestion(&cc);
        }
    }

    fn carry_out(&mut self, target: &mut dyn Steerable, mut d: Decision) -> Step {
        let mut last = false;
        let outcome = match d.action.clone() {
            Action::Hold => Ok(Vec::new()),
            Action::AddStreams { n } => {
                let r = match target.add_streams(n) {
                    Ok(a) if a.streams == n => Ok(a.warnings),
                    Ok(a) => {
                        d.action = Action::AddStreams { n: a.streams };
                        Err(format!("the server granted {} of {n}", a.streams))
                    }
                    Err(e) => Err(e),
                };
                last = r.is_err();
                r
            }
            Action::SwitchCongestion { to } => {
                self.switched = true;
                target.set_congestion(&to)
            }
        };
        d.streams = target.streams();
        if let Err(why) = &outcome {
            d.reason = format!("{} ({why})", d.reason);
        }
        Step {
            decision: d,
            outcome,
            last,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::time::Duration;

    use super::*;
    use crate::adjust::AdjustConfig;

    const G: u64 = 1_000_000_000;

    /// A transfer whose samples are given as values; its changes are
    /// recorded and answered from a script.
    #[derive(Default)]
    struct Fake {
        readings: VecDeque<Reading>,
        streams: u32,
        congestion: String,
        /// Answers to add requests, in order (`Ok(n)` grants n).
        adds: VecDeque<Result<u32, String>>,
        asked: Vec<String>,
    }

    impl Steerable for Fake {
        fn next_sample(&mut self) -> Option<Reading> {
            self.readings.pop_front()
        }
        fn streams(&self) -> u32 {
            self.streams
        }
        fn add_streams(&mut self, n: u32) -> Result<Added, String> {
            self.asked.push(format!("add {n}"));
            let granted = self.adds.pop_front().unwrap_or(Ok(n))?;
            self.streams += granted;
            Ok(Added {
                streams: granted,
                warnings: vec![],
            })
        }
        fn set_congestion(&mut self, name: &str) -> Result<Vec<String>, String> {
            self.asked.push(format!("cc {name}"));
            self.congestion = name.to_string();
            Ok(vec![])
        }
    }

    /// One sample a second: `thr` bit/s with `retx` retransmits at 93 ms.
    fn reading(sec: u64, thr: u64, retx: u64, streams: u32) -> Reading {
        Reading {
            sample: Some(Sample {
                now: Duration::from_secs(sec),
                throughput: thr,
                retransmits: retx,
                rtt: Duration::from_millis(93),
            }),
            streams,
            congestion: None,
        }
    }

    /// A loss-limited transfer on a 1 Gbit/s × 93 ms path: the adjuster
    /// adds streams once it is past settling and has three samples.
    fn lossy(from: u64, to: u64, streams: u32) -> VecDeque<Reading> {
        (from..=to)
            .map(|s| reading(s, 300_000_000, 50, streams))
            .collect()
    }

    fn adjuster(streams: u32, cc: &str, bbr: bool) -> Adjuster {
        Adjuster::new(AdjustConfig {
            path_rate: Some(G),
            min_rtt: Duration::from_millis(93),
            streams,
            max_streams: 64,
            congestion: cc.to_string(),
            bbr_available: bbr,
            near_rate: 0.92,
            samples_per_decision: 3,
            cruise: None,
            stream_window: None,
            mss: 1448,
            headroom: 1.5,
        })
    }

    fn run(d: &mut Driver, t: &mut Fake) -> Vec<String> {
        let mut seen = Vec::new();
        d.run(t, &mut |e| match e {
            Event::Sampled {
                index, decision, ..
            } if decision.is_change() => seen.push(format!("{index}: {:?}", decision.action)),
            Event::Sampled { .. } => {}
            Event::Changed(s) => seen.push(format!(
                "{:?} → {} {}",
                s.decision.action,
                s.decision.streams,
                if s.outcome.is_ok() { "ok" } else { "failed" }
            )),
        });
        seen
    }

    #[test]
    fn a_decision_is_carried_out_and_recorded() {
        let mut t = Fake {
            readings: lossy(1, 6, 4),
            streams: 4,
            ..Fake::default()
        };
        let mut d = Driver::new(adjuster(4, "bbr", true), Options::default());
        let seen = run(&mut d, &mut t);
        // Settling ends at 2 s; samples at 2, 3, 4 s make the decision.
        assert_eq!(t.asked, ["add 4"], "{seen:?}");
        assert_eq!(t.streams, 8);
        assert_eq!(d.decisions().len(), 1);
        let rec = &d.decisions()[0];
        assert_eq!(rec.action, Action::AddStreams { n: 4 });
        assert_eq!((rec.streams, rec.at_secs), (8, 4.0));
        assert_eq!(
            seen,
            ["4: AddStreams { n: 4 }", "AddStreams { n: 4 } → 8 ok"]
        );
    }

    #[test]
    fn a_failed_add_stops_further_changes_in_that_session() {
        let mut t = Fake {
            readings: lossy(1, 30, 4),
            streams: 4,
            adds: VecDeque::from([Err("server refused: busy".to_string())]),
            ..Fake::default()
        };
        let mut d = Driver::new(adjuster(4, "bbr", true), Options::default());
        let seen = run(&mut d, &mut t);
        assert_eq!(t.asked, ["add 4"], "{seen:?}");
        assert!(
            d.decisions().is_empty(),
            "only changes carried out are kept"
        );
        assert_eq!(
            seen.last().map(String::as_str),
            Some("AddStreams { n: 4 } → 4 failed")
        );
        // Copy keeps what it tried, saying why it failed; a grant short of
        // the request is a failure too, recorded with what was granted.
        let mut t = Fake {
            readings: lossy(1, 30, 4),
            streams: 4,
            adds: VecDeque::from([Ok(1)]),
            ..Fake::default()
        };
        let opts = Options {
            record_failed: true,
            forced_add: None,
        };
        let mut d = Driver::new(adjuster(4, "bbr", true), opts);
        run(&mut d, &mut t);
        assert_eq!(t.asked, ["add 4"]);
        let rec = &d.decisions()[0];
        assert_eq!(rec.action, Action::AddStreams { n: 1 });
        assert_eq!(rec.streams, 5);
        assert!(
            rec.reason.ends_with("(the server granted 1 of 4)"),
            "{}",
            rec.reason
        );
    }

    #[test]
    fn a_new_session_is_brought_back_to_the_streams_and_congestion_reached() {
        // CUBIC under loss with BBR on offer: switch first, then (BBR
        // having gained) add.
        let mut readings = lossy(1, 4, 4);
        readings.extend((5..=16).map(|s| reading(s, 400_000_000, 50, 4)));
        let mut t = Fake {
            readings,
            streams: 4,
            congestion: "cubic".into(),
            ..Fake::default()
        };
        let mut d = Driver::new(adjuster(4, "cubic", true), Options::default());
        run(&mut d, &mut t);
        assert_eq!(t.asked, ["cc bbr", "add 4"], "{:?}", d.decisions());
        // The connection dropped; the new session starts from the plan.
        let mut again = Fake {
            readings: lossy(17, 18, 4),
            streams: 4,
            congestion: "cubic".into(),
            ..Fake::default()
        };
        run(&mut d, &mut again);
        assert_eq!(again.asked, ["add 4", "cc bbr"]);
        assert_eq!((again.streams, again.congestion.as_str()), (8, "bbr"));
        assert_eq!(d.decisions().len(), 2, "a restore is not a decision");
    }

    #[test]
    fn a_forced_add_comes_at_its_sample_whatever_the_adjuster_says() {
        // A clean transfer at the path rate: the adjuster only holds.
        let mut readings: VecDeque<Reading> =
            (1..=5).map(|s| reading(s, 950_000_000, 0, 2)).collect();
        // A look without a sample is not counted.
        readings.push_front(Reading {
            sample: None,
            streams: 2,
            congestion: None,
        });
        let mut t = Fake {
            readings,
            streams: 2,
            ..Fake::default()
        };
        let opts = Options {
            record_failed: true,
            forced_add: Some(ForcedAdd {
                streams: 3,
                at_sample: 2,
                hook: "FATPIPE_TEST_COPY_ADD",
            }),
        };
        let mut d = Driver::new(adjuster(2, "cubic", false), opts);
        let seen = run(&mut d, &mut t);
        assert_eq!(t.asked, ["add 3"], "{seen:?}");
        let rec = &d.decisions()[0];
        assert_eq!((rec.streams, rec.at_secs), (5, 2.0));
        assert_eq!(
            rec.reason,
            "test hook FATPIPE_TEST_COPY_ADD: 3 streams at sample 2"
        );
    }
}
