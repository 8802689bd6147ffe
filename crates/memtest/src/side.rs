//! One end of a test (`Side`): its streams on the data plane, the channel
//! their events and the peer's messages arrive on, the interval clock, and
//! what the client and the server loops share.

use super::*;

/// One end's streams, workers and interval bookkeeping.
pub(super) struct Side {
    pub(super) shared: Arc<data::Shared>,
    pub(super) streams: Vec<Stream>,
    pub(super) workers: Vec<data::Worker>,
    pub(super) rx: Receiver<Ev>,
    /// For the workers of streams added while the test runs.
    pub(super) tx: Sender<Ev>,
    /// The parameters new streams are configured with: the test's, with
    /// the congestion control switched to if it was.
    pub(super) config: TestParams,
    /// This end said `SendDone`; the peer said it.
    pub(super) sent_done: bool,
    pub(super) peer_sent_done: bool,
    pub(super) running: usize,
    pub(super) senders_running: usize,
    pub(super) interval: Duration,
    pub(super) omit: Duration,
    pub(super) next_tick: Instant,
    pub(super) tick_index: u32,
    pub(super) last: Vec<data::Snapshot>,
    /// Counters at the end of the warm-up (all zero without one).
    pub(super) at_omit: Vec<data::Snapshot>,
    pub(super) omit_ns: u64,
    pub(super) udp_drain_at: Option<Instant>,
    /// The closing partial interval was considered.
    pub(super) closed: bool,
    /// Bytes moved at the last tick, and when that total last changed:
    /// a peer that stops moving data without closing is given up on.
    pub(super) moved: u64,
    pub(super) last_progress: Instant,
    pub(super) stall_limit: Duration,
    /// The client's delivered-bytes series for the ramp, and when it is
    /// sampled next (TCP clients only; see `ramp`).
    pub(super) ramp: Option<(ramp::Series, Instant)>,
}

/// Index, start and end (after the test start), omitted, per-stream samples.
pub(super) type IntervalSample = (u32, Duration, Duration, bool, Vec<StreamSample>);

impl Side {
    /// Starts the clock, then every stream on the runner.
    pub(super) fn start(
        params: TestParams,
        streams: Vec<Stream>,
        tx: Sender<Ev>,
        rx: Receiver<Ev>,
    ) -> Result<Side> {
        let omit = Duration::from_millis(params.omit_ms);
        let interval = Duration::from_millis(params.interval_ms);
        let config = params.clone();
        let shared = Arc::new(data::Shared::new(params));
        let mut workers = Vec::with_capacity(streams.len());
        // Runner tasks start at once: after the clock.
        let start = shared.go().start;
        for s in &streams {
            match data::spawn(s, &shared, tx.clone()) {
                Ok(w) => workers.push(w),
                Err(e) => {
                    // Let the ones already started see the stop and end.
                    shared.stop_all();
                    for w in workers {
                        w.join();
                    }
                    return Err(EngineError::io("start a stream", e));
                }
            }
        }
        let stall_limit = stall_limit(&shared.params);
        let n = streams.len();
        let senders_running = streams.iter().filter(|s| s.role == Role::Send).count();
        Ok(Side {
            shared,
            workers,
            rx,
            tx,
            config,
            sent_done: false,
            peer_sent_done: false,
            running: n,
            senders_running,
            interval,
            omit,
            next_tick: start + interval,
            tick_index: 0,
            last: vec![data::Snapshot::default(); n],
            at_omit: vec![data::Snapshot::default(); n],
            omit_ns: 0,
            udp_drain_at: None,
            closed: false,
            moved: 0,
            last_progress: start,
            stall_limit,
            ramp: None,
            streams,
        })
    }

    /// Starts sampling delivered bytes for the ramp (the client does).
    pub(super) fn track_ramp(&mut self) {
        let series = ramp::Series::new();
        let next = self.shared.start() + series.every();
        self.ramp = Some((series, next));
    }

    /// Takes a ramp sample if one is due.
    pub(super) fn poll_ramp(&mut self) {
        let Some((series, next)) = &mut self.ramp else {
            return;
        };
        let now = Instant::now();
        if now < *next {
            return;
        }
        let start = self.shared.start();
        let bytes: u64 = self.streams.iter().map(data::delivered).sum();
        series.push((now - start).as_secs_f64(), bytes);
        *next += series.every();
        if *next <= now {
            // Descheduled past a whole spacing: resume from now.
            *next = now + series.every();
        }
    }

    /// The ramp measured on the samples (see `ramp`).
    pub(super) fn ramp(&self) -> Option<schema::TestRamp> {
        self.ramp.as_ref().and_then(|(series, _)| series.ramp())
    }

    /// Waits for the next event or the next tick (`None`); no longer than
    /// `at_most` when given (something else needs polling).
    pub(super) fn next_event(&mut self, at_most: Option<Duration>) -> Option<Ev> {
        let now = Instant::now();
        let mut until = self.next_tick;
        if let Some(d) = at_most {
            until = until.min(now + d);
        }
        if let Some(d) = self.udp_drain_at {
            until = until.min(d);
        }
        if let Some((_, d)) = &self.ramp {
            until = until.min(*d);
        }
        let wait = until.saturating_duration_since(now);
        match self.rx.recv_timeout(wait) {
            Ok(ev) => Some(ev),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(Ev::PeerGone(EngineError::Service(
                "internal: event channel closed".into(),
            ))),
        }
    }

    /// Handles a worker's end; true if it was this end's last sender.
    pub(super) fn on_done(&mut self, id: u32) -> bool {
        self.running = self.running.saturating_sub(1);
        let was_sender = self
            .streams
            .iter()
            .any(|s| s.id == id && s.role == Role::Send);
        if was_sender {
            self.senders_running = self.senders_running.saturating_sub(1);
            if self.senders_running == 0 {
                self.sent_done = true;
                return true;
            }
        }
        false
    }

    /// True once streams may no longer be added: a sender finished its
    /// part (either end), the send time is over, or everything stopped.
    pub(super) fn ending(&self) -> bool {
        self.sent_done
            || self.peer_sent_done
            || self.done()
            || self.shared.stop.load(Ordering::Relaxed)
            || self
                .shared
                .clock
                .get()
                .and_then(|c| c.send_until)
                .is_some_and(|d| Instant::now() >= d)
    }

    /// Streams at this end with `role`.
    pub(super) fn count(&self, role: Role) -> u32 {
        self.streams.iter().filter(|s| s.role == role).count() as u32
    }

    /// Starts workers for streams added while the test runs; they join the
    /// interval samples and totals from their first byte.
    pub(super) fn add(&mut self, streams: Vec<Stream>) -> Result<()> {
        for s in streams {
            let handle = data::spawn(&s, &self.shared, self.tx.clone())
                .map_err(|e| EngineError::io("start a stream", e))?;
            self.workers.push(handle);
            self.running += 1;
            if s.role == Role::Send {
                self.senders_running += 1;
            }
            self.last.push(data::Snapshot::default());
            self.at_omit.push(data::Snapshot::default());
            self.streams.push(s);
        }
        Ok(())
    }

    /// Switches this end's sending streams (and those added later) to
    /// congestion control `name`. Returns the warnings (one per distinct
    /// failure) and whether any stream switched (true with none sending).
    pub(super) fn set_congestion(&mut self, name: &str) -> (Vec<String>, bool) {
        let mut warnings = Vec::new();
        let (mut tried, mut ok) = (0, 0);
        for s in self.streams.iter_mut().filter(|s| s.role == Role::Send) {
            let data::Sock::Tcp(t) = &*s.sock else {
                continue;
            };
            tried += 1;
            match fatpipe_sys::set_congestion(t.tcp(), name) {
                Ok(()) => {
                    ok += 1;
                    s.setup.congestion = fatpipe_sys::get_congestion(t.tcp()).unwrap_or_default();
                }
                Err(e) => {
                    let line = format!("congestion control '{name}' unavailable ({e})");
                    if !warnings.contains(&line) {
                        warnings.push(line);
                    }
                }
            }
        }
        if tried == 0 || ok > 0 {
            self.config.congestion = Some(name.to_string());
        }
        (warnings, tried == 0 || ok > 0)
    }

    /// The peer's senders are done: UDP receivers drain, then stop.
    pub(super) fn on_peer_send_done(&mut self) {
        self.peer_sent_done = true;
        if self.shared.params.protocol == Protocol::Udp {
            self.udp_drain_at = Some(Instant::now() + UDP_DRAIN);
        }
    }

    /// Fires due timers; returns a finished interval if one ended. Once
    /// every stream is done, a last partial interval is closed at "now" if
    /// it covers at least a tenth of an interval (both ends apply the same
    /// rule, so indices still match; an interval only one end reports is
    /// dropped by the client).
    pub(super) fn poll_timers(&mut self) -> Option<IntervalSample> {
        let now = Instant::now();
        if self.udp_drain_at.is_some_and(|d| now >= d) {
            self.shared.stop_udp_receivers();
            self.udp_drain_at = None;
        }
        if self.closed {
            return None;
        }
        let end = if now >= self.next_tick {
            self.next_tick - self.shared.start()
        } else if self.done() && !self.closed {
            self.closed = true;
            let end = now - self.shared.start();
            let begin = self.next_tick - self.interval - self.shared.start();
            if end.saturating_sub(begin) < self.interval / 10 {
                return None;
            }
            end
        } else {
            return None;
        };
        let begin = (self.next_tick - self.interval) - self.shared.start();
        let snaps: Vec<_> = self.streams.iter().map(data::snapshot).collect();
        let samples: Vec<StreamSample> = self
            .streams
            .iter()
            .zip(self.last.iter().zip(&snaps))
            .map(|(s, (a, b))| data::sample(s, a, b, 0))
            .collect();
        if self.closed && samples.iter().all(|x| x.bytes == 0) {
            // Only the UDP drain or the last FIN: nothing worth a line.
            return None;
        }
        let moved: u64 = snaps.iter().map(data::Snapshot::bytes).sum();
        if moved != self.moved {
            self.moved = moved;
            self.last_progress = now;
        }
        let omitted = end <= self.omit;
        if omitted {
            self.at_omit = snaps.clone();
            self.omit_ns = end.as_nanos() as u64;
        }
        self.last = snaps;
        let index = self.tick_index;
        self.tick_index += 1;
        self.next_tick += self.interval;
        Some((index, begin, end, omitted, samples))
    }

    pub(super) fn done(&self) -> bool {
        self.running == 0
    }

    /// An error once no stream has moved a byte for too long.
    pub(super) fn check_stall(&self) -> Result<()> {
        if !self.done() && self.last_progress.elapsed() > self.stall_limit {
            return Err(EngineError::Timeout(format!(
                "no data moved for {} s; the peer stalled",
                self.stall_limit.as_secs()
            )));
        }
        Ok(())
    }

    /// Totals since the warm-up, per stream.
    pub(super) fn totals(&self) -> Vec<StreamSample> {
        self.streams
            .iter()
            .zip(&self.at_omit)
            .map(|(s, from)| data::sample(s, from, &data::snapshot(s), self.omit_ns))
            .collect()
    }

    /// Stops and joins every worker.
    pub(super) fn stop(&mut self) {
        self.shared.stop_all();
        data::shutdown_all(&self.streams);
        for w in self.workers.drain(..) {
            w.join();
        }
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        self.stop();
    }
}
