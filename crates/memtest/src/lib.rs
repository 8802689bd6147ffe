//! fatpipe-memtest: the memory-to-memory throughput test service behind
//! `fatpipe test`: its messages ([`msg`]), its server ([`TestService`]) and
//! client ([`run_client`]), and the RFC 6349 metrics of a finished test
//! ([`rfc6349`]).
//!
//! Both ends run the same machinery (`Side`): every stream a task on the
//! engine's data-plane runner (a few threads for all streams; `data`), and
//! the session thread as an event loop over one
//! channel fed by the workers ("stream done"), a control-reader thread
//! (peer messages) and the interval clock. The server reports each interval
//! to the client; the client merges the two views stream by stream — bytes
//! from the receiver, window, RTT and retransmits from the sender — into the
//! schema types the binary prints ([`fatpipe_schema::test`]).
//!
//! Auto-tuning a test ([`tuning`]): the pre-flight's settings go into the
//! parameters, and the in-flight driver of `fatpipe-tune` steers a running
//! test through the [`Adjust`] callbacks of the session loop, bridged to
//! its `Steerable` trait by [`tuning::run_client_steered`].
//!
//! The exchange (docs/protocol.md, "test service"): `Open("test", params)`
//! → `Ready` → data connections (tag = stream id) or UDP hellos →
//! `Attached` → `Start` → `Interval`s and `SendDone`s → `Final` → `Close`.

pub(crate) mod data;
pub mod findmax;
pub mod msg;
mod ramp;
mod report;
pub mod rfc6349;
pub mod tuning;

use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::msg::{
    check_congestion_name, AddStreams, CpuSample, Direction, Protocol, Role, SocketSetup,
    StreamSample, TestMsg, TestParams,
};
use fatpipe_schema::test as schema;

use data::{Sock, Stream};
use fatpipe_engine::{
    connect_with, ClientOptions, ClientSession, Control, EngineError, Result, ServerSession,
    Service, ServiceResult,
};

/// The service name clients open.
pub const SERVICE: &str = "test";

/// How long setup steps (data connections, UDP hellos, Start) may take.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// How long UDP receivers keep listening after the sender said it is done.
const UDP_DRAIN: Duration = Duration::from_millis(250);

/// The server half: register with `Server::builder().service(TestService)`.
#[derive(Debug, Default, Clone, Copy)]
pub struct TestService;

impl Service for TestService {
    fn name(&self) -> &'static str {
        SERVICE
    }

    fn check(&self, params: &[u8]) -> std::result::Result<(), String> {
        serde_params(params).map(|_| ())
    }

    fn serve(&self, session: ServerSession) -> ServiceResult {
        serve(&session).map_err(|e| {
            // Tell the client why, if it is still there.
            let msg = TestMsg::Error {
                message: e.to_string(),
            };
            let _ = session.control().send(&msg.encode());
            Box::new(e) as Box<dyn std::error::Error + Send + Sync>
        })
    }
}

/// What `fatpipe test` asks for.
#[derive(Debug, Clone)]
pub struct TestPlan {
    /// The server as the user wrote it (for the report).
    pub server: String,
    /// The resolved address.
    pub addr: SocketAddr,
    /// Key and timeouts.
    pub options: ClientOptions,
    /// The test.
    pub params: TestParams,
}

/// Progress reported while the test runs.
#[derive(Debug)]
pub enum Progress<'a> {
    /// Both ends are set up; the test starts now.
    Start(&'a schema::TestStart),
    /// One interval, merged from both ends.
    Interval(&'a schema::TestInterval),
}

/// A change to a running test, asked for by an [`Adjust`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Adjustment {
    /// Open this many more streams per direction (in both with `--bidir`).
    AddStreams(u32),
    /// Switch every sending stream (either end) to this congestion control.
    SetCongestion(String),
}

/// What came of an [`Adjustment`] that both ends carried out.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Applied {
    /// When it took effect, seconds after the test start.
    pub at_s: f64,
    /// Streams per direction from now on.
    pub streams: u32,
    /// What either host refused or capped (the server's start "server: ").
    pub warnings: Vec<String>,
}

/// Steers a running test: sees every merged interval and may ask for a
/// change (`tuning` bridges it to the auto-tuning driver; the session loop
/// does not know its rules).
pub trait Adjust {
    /// Called with each interval, merged from both ends, right after it is
    /// reported. Not called while an earlier change is under way.
    fn on_interval(&mut self, iv: &schema::TestInterval) -> Option<Adjustment>;
    /// Called once per change asked for: carried out at both ends, or why
    /// not (then nothing changed, or only this end's part of a switch).
    fn on_result(&mut self, change: &Adjustment, result: std::result::Result<Applied, String>);
    /// Called before the test starts if it cannot be adjusted (UDP, or a
    /// server too old for it); nothing else is called then.
    fn unavailable(&mut self, why: &str) {
        let _ = why;
    }
}

/// Runs a test as the client and returns the full report.
pub fn run_client(
    plan: &TestPlan,
    on_progress: &mut dyn FnMut(Progress<'_>),
) -> Result<schema::TestReport> {
    run_client_adjusting(plan, on_progress, None)
}

/// [`run_client`], with `adjust` consulted after each interval to add
/// streams or switch congestion control while data flows (TCP only; a UDP
/// test never asks it). Streams added report their own bytes in the
/// intervals and totals, with ids after the first ones; the report's
/// `start.local`/`start.remote` list them too.
pub fn run_client_adjusting(
    plan: &TestPlan,
    on_progress: &mut dyn FnMut(Progress<'_>),
    adjust: Option<&mut dyn Adjust>,
) -> Result<schema::TestReport> {
    let p = &plan.params;
    p.validate().map_err(EngineError::Service)?;
    let session = Arc::new(connect_with(
        plan.addr,
        &plan.options,
        SERVICE,
        &p.encode(),
    )?);
    let control = session.control().clone();
    let (udp_ports, adjustable) = match recv_msg(&control, SETUP_TIMEOUT, "waiting for Ready")? {
        TestMsg::Ready {
            udp_ports,
            adjustable,
        } => (udp_ports, adjustable),
        other => return Err(unexpected(&other, "Ready")),
    };
    let mut warnings = Vec::new();
    let (streams, remote_setup) = match p.protocol {
        Protocol::Tcp => {
            let streams = open_tcp_streams(&session, p, &mut warnings)?;
            let remote = recv_attached(&control, &mut warnings)?;
            (streams, remote)
        }
        Protocol::Udp => open_udp_streams(&session, p, &udp_ports, &mut warnings)?,
    };
    let mut start_info = start_info(plan, &session, &streams, &remote_setup, warnings);
    on_progress(Progress::Start(&start_info));

    let (tx, rx) = mpsc::channel();
    let finished = Arc::new(AtomicBool::new(false));
    spawn_reader(control.clone(), tx.clone(), Arc::clone(&finished));
    control.send(&TestMsg::Start.encode())?;
    let cpu0 = fatpipe_sys::CpuSample::now().ok();
    let mut side = Side::start(p.clone(), streams, tx, rx)?;
    if p.protocol == Protocol::Tcp {
        side.track_ramp();
    }
    let adjust = match adjust {
        Some(a) if p.protocol != Protocol::Tcp => {
            a.unavailable("only TCP tests can be adjusted");
            None
        }
        Some(a) if !adjustable => {
            a.unavailable("the server is too old to add streams mid-test");
            None
        }
        other => other,
    };
    let mut steer = Steer {
        adjust,
        session: Arc::clone(&session),
        pending: None,
        off: false,
        local: Vec::new(),
        remote: Vec::new(),
    };
    let result = client_loop(&mut side, &control, p, on_progress, &mut steer);
    start_info.local.append(&mut steer.local);
    start_info.remote.append(&mut steer.remote);
    let cpu_local = cpu_use_since(cpu0);
    side.stop();
    finished.store(true, Ordering::Relaxed);
    let (intervals, remote_final, remote_cpu) = match result {
        Ok(x) => x,
        Err(e) => {
            let _ = control.send(&TestMsg::Stop.encode());
            control.close(&e.to_string());
            return Err(e);
        }
    };
    control.close("");
    let mut end = merge_final(p, &side, &remote_final, cpu_local, cpu_use(&remote_cpu));
    end.ramp = side.ramp();
    Ok(schema::TestReport {
        schema: schema::TEST_SCHEMA.into(),
        version: schema::TEST_SCHEMA_VERSION,
        start: start_info,
        intervals,
        end,
    })
}

/// Events the session thread waits on.
#[derive(Debug)]
pub(crate) enum Ev {
    /// A worker finished, with its error if it failed.
    Done(u32, Option<String>),
    /// The peer said something.
    Peer(TestMsg),
    /// The control connection failed or closed.
    PeerGone(EngineError),
    /// The client finished dialing streams it is adding.
    Dialed(Result<Vec<Dialed>>),
}

/// One end's streams, workers and interval bookkeeping.
struct Side {
    shared: Arc<data::Shared>,
    streams: Vec<Stream>,
    workers: Vec<data::Worker>,
    rx: Receiver<Ev>,
    /// For the workers of streams added while the test runs.
    tx: Sender<Ev>,
    /// The parameters new streams are configured with: the test's, with
    /// the congestion control switched to if it was.
    config: TestParams,
    /// This end said `SendDone`; the peer said it.
    sent_done: bool,
    peer_sent_done: bool,
    running: usize,
    senders_running: usize,
    interval: Duration,
    omit: Duration,
    next_tick: Instant,
    tick_index: u32,
    last: Vec<data::Snapshot>,
    /// Counters at the end of the warm-up (all zero without one).
    at_omit: Vec<data::Snapshot>,
    omit_ns: u64,
    udp_drain_at: Option<Instant>,
    /// The closing partial interval was considered.
    closed: bool,
    /// Bytes moved at the last tick, and when that total last changed:
    /// a peer that stops moving data without closing is given up on.
    moved: u64,
    last_progress: Instant,
    stall_limit: Duration,
    /// The client's delivered-bytes series for the ramp, and when it is
    /// sampled next (TCP clients only; see `ramp`).
    ramp: Option<(ramp::Series, Instant)>,
}

/// Index, start and end (after the test start), omitted, per-stream samples.
type IntervalSample = (u32, Duration, Duration, bool, Vec<StreamSample>);

impl Side {
    /// Spawns every worker, then starts the clock and releases them.
    fn start(
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
        // Threads of their own (encrypted streams) first: they wait for
        // the clock, so spawning them does not eat into the test. Runner
        // tasks start at once: after the clock.
        let threaded = streams.iter().filter(|s| !data::on_runner(s));
        let tasks = streams.iter().filter(|s| data::on_runner(s));
        let mut start = None;
        for s in threaded.chain(tasks) {
            if data::on_runner(s) && start.is_none() {
                start = Some(shared.go().start);
            }
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
        let start = start.unwrap_or_else(|| shared.go().start);
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
    fn track_ramp(&mut self) {
        let series = ramp::Series::new();
        let next = self.shared.start() + series.every();
        self.ramp = Some((series, next));
    }

    /// Takes a ramp sample if one is due.
    fn poll_ramp(&mut self) {
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
    fn ramp(&self) -> Option<schema::TestRamp> {
        self.ramp.as_ref().and_then(|(series, _)| series.ramp())
    }

    /// Waits for the next event or the next tick (`None`); no longer than
    /// `at_most` when given (something else needs polling).
    fn next_event(&mut self, at_most: Option<Duration>) -> Option<Ev> {
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
    fn on_done(&mut self, id: u32) -> bool {
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
    fn ending(&self) -> bool {
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
    fn count(&self, role: Role) -> u32 {
        self.streams.iter().filter(|s| s.role == role).count() as u32
    }

    /// Starts workers for streams added while the test runs; they join the
    /// interval samples and totals from their first byte.
    fn add(&mut self, streams: Vec<Stream>) -> Result<()> {
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
    fn set_congestion(&mut self, name: &str) -> (Vec<String>, bool) {
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
    fn on_peer_send_done(&mut self) {
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
    fn poll_timers(&mut self) -> Option<IntervalSample> {
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

    fn done(&self) -> bool {
        self.running == 0
    }

    /// An error once no stream has moved a byte for too long.
    fn check_stall(&self) -> Result<()> {
        if !self.done() && self.last_progress.elapsed() > self.stall_limit {
            return Err(EngineError::Timeout(format!(
                "no data moved for {} s; the peer stalled",
                self.stall_limit.as_secs()
            )));
        }
        Ok(())
    }

    /// Totals since the warm-up, per stream.
    fn totals(&self) -> Vec<StreamSample> {
        self.streams
            .iter()
            .zip(&self.at_omit)
            .map(|(s, from)| data::sample(s, from, &data::snapshot(s), self.omit_ns))
            .collect()
    }

    /// Stops and joins every worker.
    fn stop(&mut self) {
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

/// The server's session.
fn serve(session: &ServerSession) -> Result<()> {
    let control = session.control();
    let p: TestParams = serde_params(session.params()).map_err(EngineError::Service)?;
    let mut warnings = Vec::new();
    let total = p.total_streams();
    let server_role = |id: u32| {
        if p.client_sends(id) {
            Role::Recv
        } else {
            Role::Send
        }
    };
    let mut streams = Vec::with_capacity(total as usize);
    match p.protocol {
        Protocol::Tcp => {
            let ready = TestMsg::Ready {
                udp_ports: vec![],
                adjustable: true,
            };
            control.send(&ready.encode())?;
            // Each connection may take up to the setup timeout after the
            // previous one: a thousand streams on a long path arrive slowly.
            let mut seen = HashMap::new();
            while seen.len() < total as usize {
                let conn = session.accept_data(SETUP_TIMEOUT)?;
                if conn.tag >= total || seen.contains_key(&conn.tag) {
                    return Err(EngineError::Service(format!(
                        "data connection with bad stream id {}",
                        conn.tag
                    )));
                }
                let role = server_role(conn.tag);
                data::configure_tcp(conn.stream.tcp(), &p, role, &mut warnings);
                let sock = Sock::Tcp(conn.stream);
                seen.insert(conn.tag, ());
                streams.push(new_stream(conn.tag, role, sock, &p));
            }
            streams.sort_by_key(|s| s.id);
        }
        Protocol::Udp => {
            let ip = session.local_addr().ip();
            let mut socks = Vec::with_capacity(total as usize);
            for _ in 0..total {
                let u = UdpSocket::bind(SocketAddr::new(ip, 0))
                    .map_err(|e| EngineError::io("bind UDP socket", e))?;
                data::configure_buffers(&u, &p, &mut warnings);
                socks.push(u);
            }
            let ports = socks
                .iter()
                .map(|u| u.local_addr().map(|a| a.port()))
                .collect::<std::io::Result<Vec<_>>>()
                .map_err(|e| EngineError::io("read UDP port", e))?;
            let ready = TestMsg::Ready {
                udp_ports: ports,
                adjustable: false,
            };
            control.send(&ready.encode())?;
            bind_udp_peers(&socks, session)?;
            for (id, u) in socks.into_iter().enumerate() {
                let id = id as u32;
                streams.push(new_stream(id, server_role(id), Sock::Udp(u), &p));
            }
        }
    }
    let mut meter = report::Meter::new(session.report(), streams.len());
    let setups: Vec<SocketSetup> = streams.iter().map(|s| s.setup.clone()).collect();
    // The same refusal on every stream is one line, not a thousand.
    let mut seen = std::collections::HashSet::new();
    warnings.retain(|w| seen.insert(w.clone()));
    send_split(
        control,
        TestMsg::Attached {
            streams: setups,
            warnings,
            more: false,
        },
    )?;
    match recv_msg(control, SETUP_TIMEOUT, "waiting for Start")? {
        TestMsg::Start => {}
        TestMsg::Stop => return Ok(()),
        other => return Err(unexpected(&other, "Start")),
    }
    let (tx, rx) = mpsc::channel();
    let finished = Arc::new(AtomicBool::new(false));
    spawn_reader(control.clone(), tx.clone(), Arc::clone(&finished));
    let cpu0 = fatpipe_sys::CpuSample::now().ok();
    let mut side = Side::start(p.clone(), streams, tx, rx)?;
    let result = server_loop(&mut side, control, session, &mut meter);
    if let (Err(e), true) = (&result, session.shutdown().is_set()) {
        // The server is stopping: tell the client why while its streams
        // still work, or it would only see them break ("broken pipe").
        let msg = TestMsg::Error {
            message: e.to_string(),
        };
        if control.send(&msg.encode()).is_ok() {
            wait_for_hangup(&side, Duration::from_secs(1));
        }
    }
    let cpu = cpu_seconds_since(cpu0);
    side.stop();
    meter.bytes(session.report(), &side.streams);
    if let Err(e) = result {
        finished.store(true, Ordering::Relaxed);
        return Err(e);
    }
    let totals = side.totals();
    for summary in report::summaries(&totals) {
        session.report().test_result(&summary);
    }
    send_split(
        control,
        TestMsg::Final {
            elapsed_ms: side.shared.start().elapsed().as_millis() as u64,
            streams: totals,
            cpu,
            more: false,
        },
    )?;
    // Wait for the client to hang up (it has what it needs).
    wait_for_hangup(&side, Duration::from_secs(5));
    finished.store(true, Ordering::Relaxed);
    Ok(())
}

/// Waits up to `limit` for the peer to close the control connection.
fn wait_for_hangup(side: &Side, limit: Duration) {
    let grace = Instant::now() + limit;
    while Instant::now() < grace {
        match side.rx.recv_timeout(Duration::from_millis(100)) {
            Ok(Ev::PeerGone(_)) => break,
            Ok(_) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
}

/// Streams the client is adding: those accepted so far, until all are.
struct ServerAdd {
    add: AddStreams,
    got: BTreeMap<u32, Stream>,
    warnings: Vec<String>,
    deadline: Instant,
}

/// Server: takes an `AddStreams`, or refuses it.
fn on_add_streams(
    side: &Side,
    control: &Control,
    pending: &mut Option<ServerAdd>,
    add: AddStreams,
) -> Result<()> {
    let total = side.streams.len() as u32;
    let (up, down) = (side.count(Role::Recv), side.count(Role::Send));
    let check = if pending.is_some() {
        Err("streams are already being added".to_string())
    } else if side.ending() {
        Err("the test is ending".to_string())
    } else {
        side.shared.params.check_add(total, up, down, &add)
    };
    match check {
        Ok(()) => {
            *pending = Some(ServerAdd {
                add,
                got: BTreeMap::new(),
                warnings: Vec::new(),
                deadline: Instant::now() + SETUP_TIMEOUT,
            });
            Ok(())
        }
        Err(why) => refuse(control, why),
    }
}

fn refuse(control: &Control, why: String) -> Result<()> {
    let msg = TestMsg::Adjusted {
        streams: Vec::new(),
        warnings: Vec::new(),
        refused: Some(why),
        more: false,
    };
    control.send(&msg.encode())
}

/// Server: accepts the data connections of a pending `AddStreams` (their
/// tags must be the new ids), and once all are in starts their workers and
/// answers `Adjusted`; refuses the change when they do not come in time.
fn poll_add(
    side: &mut Side,
    control: &Control,
    session: &ServerSession,
    pending: &mut Option<ServerAdd>,
    meter: &report::Meter,
) -> Result<()> {
    let Some(add) = pending.as_mut() else {
        return Ok(());
    };
    let want = add.add.count() as usize;
    while add.got.len() < want {
        let conn = match session.accept_data(Duration::ZERO) {
            Ok(c) => c,
            Err(EngineError::Timeout(_)) => break,
            Err(e) => return Err(e),
        };
        let id = conn.tag;
        let first = add.add.first;
        if id < first || id - first >= add.add.count() || add.got.contains_key(&id) {
            return Err(EngineError::Service(format!(
                "data connection with bad stream id {id}"
            )));
        }
        let role = if add.add.client_sends(id) {
            Role::Recv
        } else {
            Role::Send
        };
        data::configure_tcp(conn.stream.tcp(), &side.config, role, &mut add.warnings);
        let stream = new_stream(id, role, Sock::Tcp(conn.stream), &side.config);
        add.got.insert(id, stream);
    }
    if add.got.len() == want {
        let Some(add) = pending.take() else {
            return Ok(());
        };
        let streams: Vec<Stream> = add.got.into_values().collect();
        let setups = streams.iter().map(|s| s.setup.clone()).collect();
        let added = streams.len();
        side.add(streams)?;
        meter.add_streams(added);
        let mut seen = std::collections::HashSet::new();
        let mut warnings = add.warnings;
        warnings.retain(|w| seen.insert(w.clone()));
        send_split(
            control,
            TestMsg::Adjusted {
                streams: setups,
                warnings,
                refused: None,
                more: false,
            },
        )?;
    } else if Instant::now() > add.deadline || side.ending() {
        // The streams accepted so far close with `add`.
        *pending = None;
        refuse(
            control,
            "the new data connections did not all arrive in time".into(),
        )?;
    }
    Ok(())
}

/// Server: switches its sending streams' congestion control.
fn on_set_congestion(side: &mut Side, control: &Control, name: &str) -> Result<()> {
    if let Err(why) = check_congestion_name(name) {
        return refuse(control, why);
    }
    let (warnings, ok) = side.set_congestion(name);
    if !ok {
        return refuse(control, warnings.join("; "));
    }
    let setups = side
        .streams
        .iter()
        .filter(|s| s.role == Role::Send)
        .map(|s| s.setup.clone())
        .collect();
    send_split(
        control,
        TestMsg::Adjusted {
            streams: setups,
            warnings,
            refused: None,
            more: false,
        },
    )
}

fn server_loop(
    side: &mut Side,
    control: &Control,
    session: &ServerSession,
    meter: &mut report::Meter,
) -> Result<()> {
    let mut adding: Option<ServerAdd> = None;
    loop {
        side.check_stall()?;
        if session.shutdown().is_set() {
            return Err(EngineError::Service("the server is shutting down".into()));
        }
        poll_add(side, control, session, &mut adding, meter)?;
        let wait = adding.as_ref().map(|_| Duration::from_millis(10));
        if let Some(ev) = side.next_event(wait) {
            match ev {
                Ev::Done(_, Some(err)) => return Err(EngineError::Service(err)),
                Ev::Done(id, None) => {
                    if side.on_done(id) {
                        control.send(&TestMsg::SendDone.encode())?;
                    }
                }
                Ev::Peer(TestMsg::SendDone) => side.on_peer_send_done(),
                Ev::Peer(TestMsg::Stop) => {
                    return Err(EngineError::Service("the client stopped the test".into()))
                }
                Ev::Peer(TestMsg::AddStreams(add)) => {
                    on_add_streams(side, control, &mut adding, add)?;
                    poll_add(side, control, session, &mut adding, meter)?;
                }
                Ev::Peer(TestMsg::SetCongestion { name }) => {
                    on_set_congestion(side, control, &name)?;
                }
                Ev::Peer(other) => return Err(unexpected(&other, "SendDone or Stop")),
                Ev::PeerGone(e) => return Err(e),
                Ev::Dialed(_) => {}
            }
        }
        while let Some((index, begin, end, omitted, streams)) = side.poll_timers() {
            meter.bytes(session.report(), &side.streams);
            send_split(
                control,
                TestMsg::Interval {
                    index,
                    start_ms: begin.as_millis() as u64,
                    end_ms: end.as_millis() as u64,
                    omitted,
                    streams,
                    more: false,
                },
            )?;
        }
        if side.done() && side.closed {
            return Ok(());
        }
    }
}

type LocalInterval = (Duration, Duration, bool, Vec<StreamSample>);

/// The client's end of in-flight changes.
struct Steer<'a> {
    adjust: Option<&'a mut dyn Adjust>,
    session: Arc<ClientSession>,
    pending: Option<Pending>,
    /// A change failed half-way: ask for no more.
    off: bool,
    /// Socket settings of added streams, this end's and the server's.
    local: Vec<schema::SocketInfo>,
    remote: Vec<schema::SocketInfo>,
}

/// A change sent to the server and not yet answered.
struct Pending {
    change: Adjustment,
    /// `Some` for `AddStreams`.
    add: Option<AddStreams>,
    /// Streams dialed (`AddStreams`), once the dialer is done.
    dialed: Option<Vec<Stream>>,
    /// The server's `Adjusted` parts so far, and whether the last came.
    reply: Vec<SocketSetup>,
    replied: bool,
    warnings: Vec<String>,
    since: Instant,
}

impl Steer<'_> {
    /// After an interval: asks the adjuster, and starts what it wants.
    fn on_interval(
        &mut self,
        side: &mut Side,
        control: &Control,
        iv: &schema::TestInterval,
    ) -> Result<()> {
        if self.off || self.pending.is_some() {
            return Ok(());
        }
        let Some(adjust) = self.adjust.as_mut() else {
            return Ok(());
        };
        let Some(change) = adjust.on_interval(iv) else {
            return Ok(());
        };
        if side.ending() {
            adjust.on_result(&change, Err("the test is ending".into()));
            return Ok(());
        }
        match &change {
            Adjustment::AddStreams(n) => self.start_add(side, control, change.clone(), *n),
            Adjustment::SetCongestion(name) => {
                let name = name.clone();
                self.start_congestion(side, control, change, &name)
            }
        }
    }

    fn start_add(
        &mut self,
        side: &mut Side,
        control: &Control,
        change: Adjustment,
        n: u32,
    ) -> Result<()> {
        let p = &side.shared.params;
        let (up, down) = match p.direction {
            Direction::Up => (n, 0),
            Direction::Down => (0, n),
            Direction::Both => (n, n),
        };
        let add = AddStreams {
            first: side.streams.len() as u32,
            up,
            down,
        };
        let (up_now, down_now) = (side.count(Role::Send), side.count(Role::Recv));
        if let Err(why) = p.check_add(add.first, up_now, down_now, &add) {
            self.finish(&change, Err(why));
            return Ok(());
        }
        control.send(&TestMsg::AddStreams(add).encode())?;
        let session = Arc::clone(&self.session);
        let config = side.config.clone();
        let tx = side.tx.clone();
        let dialer = std::thread::Builder::new()
            .name("adding streams".into())
            .spawn(move || {
                let ids = client_roles(add.first..add.first + add.count(), |id| {
                    add.client_sends(id)
                });
                let _ = tx.send(Ev::Dialed(dial_tcp_streams(&session, &config, &ids)));
            });
        if let Err(e) = dialer {
            // The server times out waiting and refuses; nothing changes.
            self.off = true;
            self.finish(&change, Err(format!("start a dialing thread: {e}")));
            return Ok(());
        }
        self.pending = Some(Pending {
            change,
            add: Some(add),
            dialed: None,
            reply: Vec::new(),
            replied: false,
            warnings: Vec::new(),
            since: Instant::now(),
        });
        Ok(())
    }

    fn start_congestion(
        &mut self,
        side: &mut Side,
        control: &Control,
        change: Adjustment,
        name: &str,
    ) -> Result<()> {
        if let Err(why) = check_congestion_name(name) {
            self.finish(&change, Err(why));
            return Ok(());
        }
        let (warnings, ok) = side.set_congestion(name);
        if !ok {
            self.finish(&change, Err(warnings.join("; ")));
            return Ok(());
        }
        if side.shared.params.direction == Direction::Up {
            let applied = applied(side, warnings);
            self.finish(&change, Ok(applied));
            return Ok(());
        }
        control.send(
            &TestMsg::SetCongestion {
                name: name.to_string(),
            }
            .encode(),
        )?;
        self.pending = Some(Pending {
            change,
            add: None,
            dialed: None,
            reply: Vec::new(),
            replied: false,
            warnings,
            since: Instant::now(),
        });
        Ok(())
    }

    /// The dialer of an `AddStreams` finished.
    fn on_dialed(&mut self, side: &mut Side, dialed: Result<Vec<Dialed>>) -> Result<()> {
        let Some(pending) = self.pending.as_mut().filter(|p| p.add.is_some()) else {
            // A change already given up on: the sockets close here.
            return Ok(());
        };
        match dialed {
            Ok(d) => {
                let mut streams = Vec::with_capacity(d.len());
                for (stream, w) in d {
                    for line in w {
                        if !pending.warnings.contains(&line) {
                            pending.warnings.push(line);
                        }
                    }
                    streams.push(stream);
                }
                pending.dialed = Some(streams);
                self.complete(side)
            }
            Err(e) => {
                // The server may have some of them: ask for nothing more.
                self.off = true;
                if let Some(p) = self.pending.take() {
                    self.finish(&p.change, Err(format!("dialing the new streams: {e}")));
                }
                Ok(())
            }
        }
    }

    /// A part of the server's `Adjusted`.
    fn on_adjusted(
        &mut self,
        side: &mut Side,
        streams: Vec<SocketSetup>,
        warnings: Vec<String>,
        refused: Option<String>,
        more: bool,
    ) -> Result<()> {
        let Some(pending) = self.pending.as_mut() else {
            return Ok(());
        };
        if let Some(why) = refused {
            if let Some(p) = self.pending.take() {
                self.finish(&p.change, Err(format!("server refused: {why}")));
            }
            return Ok(());
        }
        pending.reply.extend(streams);
        add_server_warnings(&mut pending.warnings, warnings);
        pending.replied = !more;
        self.complete(side)
    }

    /// Starts the added streams once both the dialer and the server are
    /// done; reports a finished switch.
    fn complete(&mut self, side: &mut Side) -> Result<()> {
        let Some(pending) = self.pending.as_mut() else {
            return Ok(());
        };
        if !pending.replied || (pending.add.is_some() && pending.dialed.is_none()) {
            return Ok(());
        }
        let Some(p) = self.pending.take() else {
            return Ok(());
        };
        if let (Some(add), Some(streams)) = (p.add, p.dialed) {
            let up = |id: u32| add.client_sends(id);
            self.local
                .extend(streams.iter().map(|s| socket_info(&s.setup, up(s.id))));
            self.remote
                .extend(p.reply.iter().map(|s| socket_info(s, up(s.id))));
            side.add(streams)?;
        }
        let applied = applied(side, p.warnings);
        self.finish(&p.change, Ok(applied));
        Ok(())
    }

    /// Gives up on a change the server never answered.
    fn check_timeout(&mut self) {
        let late = self
            .pending
            .as_ref()
            .is_some_and(|p| p.since.elapsed() > SETUP_TIMEOUT + Duration::from_secs(5));
        if late {
            self.off = true;
            if let Some(p) = self.pending.take() {
                self.finish(&p.change, Err("the server did not answer in time".into()));
            }
        }
    }

    fn finish(&mut self, change: &Adjustment, result: std::result::Result<Applied, String>) {
        if let Some(a) = self.adjust.as_mut() {
            a.on_result(change, result);
        }
    }
}

/// What a change leaves: the time and streams per direction now.
fn applied(side: &Side, warnings: Vec<String>) -> Applied {
    let (up, down) = (side.count(Role::Send), side.count(Role::Recv));
    Applied {
        at_s: side.shared.start().elapsed().as_secs_f64(),
        streams: match side.shared.params.direction {
            Direction::Up => up,
            Direction::Down => down,
            Direction::Both => up.max(down),
        },
        warnings,
    }
}

fn client_loop(
    side: &mut Side,
    control: &Control,
    p: &TestParams,
    on_progress: &mut dyn FnMut(Progress<'_>),
    steer: &mut Steer<'_>,
) -> Result<(Vec<schema::TestInterval>, Vec<StreamSample>, CpuSample)> {
    let mut local: BTreeMap<u32, LocalInterval> = BTreeMap::new();
    // Per interval: the server's samples, whether they are complete, and
    // where the server ended the interval (ms after Start).
    let mut remote: BTreeMap<u32, (Vec<StreamSample>, bool, u64)> = BTreeMap::new();
    let mut merged = Vec::new();
    let mut remote_final: Vec<StreamSample> = Vec::new();
    let mut remote_cpu = CpuSample::default();
    let mut final_done = false;
    // A server that never finishes must not hang the client.
    let budget = Duration::from_millis(p.omit_ms + p.duration_ms) + Duration::from_secs(30);
    let give_up = if p.bytes.is_some() {
        None
    } else {
        Some(Instant::now() + budget)
    };
    loop {
        side.check_stall()?;
        if give_up.is_some_and(|g| Instant::now() > g) {
            return Err(EngineError::Timeout(
                "waiting for the server to finish the test".into(),
            ));
        }
        steer.check_timeout();
        if let Some(ev) = side.next_event(None) {
            match ev {
                Ev::Done(_, Some(err)) => return Err(EngineError::Service(err)),
                Ev::Done(id, None) => {
                    if side.on_done(id) {
                        control.send(&TestMsg::SendDone.encode())?;
                    }
                }
                Ev::Peer(TestMsg::SendDone) => side.on_peer_send_done(),
                Ev::Peer(TestMsg::Interval {
                    index,
                    streams,
                    more,
                    end_ms,
                    ..
                }) => {
                    let e = remote.entry(index).or_default();
                    e.0.extend(streams);
                    e.1 = !more;
                    e.2 = e.2.max(end_ms);
                }
                Ev::Peer(TestMsg::Final {
                    streams, more, cpu, ..
                }) => {
                    remote_final.extend(streams);
                    remote_cpu = cpu;
                    final_done = !more;
                }
                Ev::Peer(TestMsg::Error { message }) => {
                    return Err(EngineError::Service(format!("server: {message}")))
                }
                Ev::Peer(TestMsg::Adjusted {
                    streams,
                    warnings,
                    refused,
                    more,
                }) => steer.on_adjusted(side, streams, warnings, refused, more)?,
                Ev::Dialed(d) => steer.on_dialed(side, d)?,
                Ev::Peer(other) => return Err(unexpected(&other, "Interval or Final")),
                // The server may hang up once its Final is out.
                Ev::PeerGone(_) if final_done => {}
                Ev::PeerGone(e) => return Err(e),
            }
        }
        side.poll_ramp();
        while let Some((index, begin, end, omitted, streams)) = side.poll_timers() {
            local.insert(index, (begin, end, omitted, streams));
        }
        // Print every interval both ends have reported, in order.
        while let Some((&index, _)) = local.iter().next() {
            let Some((r, true, remote_end)) = remote.get(&index) else {
                break;
            };
            let (r, remote_end) = (r.clone(), Duration::from_millis(*remote_end));
            remote.remove(&index);
            let Some((begin, end, omitted, l)) = local.remove(&index) else {
                break;
            };
            // The last, partial interval closes at each end when its
            // streams are done: at the sender on its deadline, at the
            // receiver only once the bytes in flight have drained. The
            // interval spans both, or the receiver's drained bytes would
            // be divided by the sender's shorter time.
            let end = end.max(remote_end);
            let iv = merge_interval(p, index, begin, end, omitted, &l, &r);
            on_progress(Progress::Interval(&iv));
            steer.on_interval(side, control, &iv)?;
            merged.push(iv);
        }
        if side.done() && side.closed && final_done {
            if let Some(p) = steer.pending.take() {
                steer.finish(&p.change, Err("the test ended first".into()));
            }
            return Ok((merged, remote_final, remote_cpu));
        }
    }
}

/// How long a test may go without moving a byte before it is abandoned:
/// a minute, or three datagram times for a very slow UDP test.
fn stall_limit(p: &TestParams) -> Duration {
    let base = Duration::from_secs(60);
    if p.protocol == Protocol::Udp && p.bitrate > 0 {
        let per_packet = f64::from(p.length) * 8.0 / p.bitrate as f64;
        return base.max(Duration::from_secs_f64((per_packet * 3.0).min(86_400.0)));
    }
    base
}

fn new_stream(id: u32, role: Role, sock: Sock, p: &TestParams) -> Stream {
    if let (Sock::Udp(u), Role::Recv) = (&sock, role) {
        data::configure_udp_receiver(u, p);
    }
    let setup = data::setup_of(id, &sock, role, p);
    Stream {
        id,
        role,
        sock: Arc::new(sock),
        counters: Arc::default(),
        setup,
    }
}

/// The client's role on each stream id: it sends where `client_sends`.
fn client_roles(ids: std::ops::Range<u32>, client_sends: impl Fn(u32) -> bool) -> Vec<(u32, Role)> {
    ids.map(|id| {
        let role = if client_sends(id) {
            Role::Send
        } else {
            Role::Recv
        };
        (id, role)
    })
    .collect()
}

fn open_tcp_streams(
    session: &ClientSession,
    p: &TestParams,
    warnings: &mut Vec<String>,
) -> Result<Vec<Stream>> {
    let ids = client_roles(0..p.total_streams(), |id| p.client_sends(id));
    let mut streams = Vec::with_capacity(ids.len());
    for (stream, w) in dial_tcp_streams(session, p, &ids)? {
        // The same refusal on every stream is one warning, not a thousand.
        for line in w {
            if !warnings.contains(&line) {
                warnings.push(line);
            }
        }
        streams.push(stream);
    }
    Ok(streams)
}

/// Dials the data connections `ids` (with this end's role on each), in
/// parallel, configured by `p`; sorted by id.
fn dial_tcp_streams(
    session: &ClientSession,
    p: &TestParams,
    ids: &[(u32, Role)],
) -> Result<Vec<Dialed>> {
    // Dial in parallel: one at a time, a thousand streams over a 250 ms
    // path would take minutes of round trips before the test even starts.
    let dialers = (ids.len() as u32).clamp(1, DIALERS) as usize;
    let results: Vec<Result<Vec<Dialed>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..dialers)
            .map(|first| {
                scope.spawn(move || {
                    ids.iter()
                        .skip(first)
                        .step_by(dialers)
                        .map(|&(id, role)| open_tcp_stream(session, p, id, role))
                        .collect::<Result<Vec<_>>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(EngineError::Service("a dialing thread panicked".into()))
                })
            })
            .collect()
    });
    let mut streams = Vec::with_capacity(ids.len());
    for r in results {
        streams.extend(r?);
    }
    streams.sort_by_key(|(s, _)| s.id);
    Ok(streams)
}

/// A dialed stream and the warnings its socket options raised.
type Dialed = (Stream, Vec<String>);

/// Most data connections a client dials at once.
const DIALERS: u32 = 64;

fn open_tcp_stream(session: &ClientSession, p: &TestParams, id: u32, role: Role) -> Result<Dialed> {
    let mut w = Vec::new();
    let tcp = session.open_data_with(id, |sock| {
        data::configure_tcp(sock, p, role, &mut w);
        Ok(())
    })?;
    Ok((new_stream(id, role, Sock::Tcp(tcp), p), w))
}

/// UDP: one socket per stream connected to the server's port for it; hellos
/// carrying the cookie tell the server where the client is, repeated until
/// the server confirms with `Attached`.
fn open_udp_streams(
    session: &ClientSession,
    p: &TestParams,
    ports: &[u16],
    warnings: &mut Vec<String>,
) -> Result<(Vec<Stream>, Vec<SocketSetup>)> {
    if ports.len() != p.total_streams() as usize {
        return Err(EngineError::Service(format!(
            "server offered {} UDP ports for {} streams",
            ports.len(),
            p.total_streams()
        )));
    }
    let local_ip = session.local_addr().ip();
    let server_ip = session.peer_addr().ip();
    let mut socks = Vec::with_capacity(ports.len());
    for &port in ports {
        let u = UdpSocket::bind(SocketAddr::new(local_ip, 0))
            .map_err(|e| EngineError::io("bind UDP socket", e))?;
        let mut w = Vec::new();
        data::configure_buffers(&u, p, &mut w);
        for line in w {
            if !warnings.contains(&line) {
                warnings.push(line);
            }
        }
        u.connect(SocketAddr::new(server_ip, port))
            .map_err(|e| EngineError::io("connect UDP socket", e))?;
        socks.push(u);
    }
    let control = session.control();
    let deadline = Instant::now() + SETUP_TIMEOUT;
    let mut remote = Vec::new();
    loop {
        for (id, u) in socks.iter().enumerate() {
            let mut hello = Vec::with_capacity(40);
            hello.extend_from_slice(data::UDP_HELLO);
            hello.extend_from_slice(session.cookie());
            hello.extend_from_slice(&(id as u32).to_be_bytes());
            // Lost or refused hellos are retried on the next round.
            let _ = u.send(&hello);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(EngineError::Timeout("attaching UDP streams".into()));
        }
        match control.recv(Some(left.min(Duration::from_millis(50))))? {
            None => continue,
            Some(bytes) => match TestMsg::decode(&bytes)? {
                TestMsg::Attached {
                    streams,
                    warnings: theirs,
                    more,
                } => {
                    remote.extend(streams);
                    add_server_warnings(warnings, theirs);
                    if !more {
                        break;
                    }
                }
                TestMsg::Error { message } => {
                    return Err(EngineError::Service(format!("server: {message}")))
                }
                other => return Err(unexpected(&other, "Attached")),
            },
        }
    }
    let streams = socks
        .into_iter()
        .enumerate()
        .map(|(id, u)| {
            let id = id as u32;
            let role = if p.client_sends(id) {
                Role::Send
            } else {
                Role::Recv
            };
            new_stream(id, role, Sock::Udp(u), p)
        })
        .collect();
    Ok((streams, remote))
}

/// Server side of the UDP hellos: learn each stream's client address from
/// a hello that carries the session cookie, and connect to it.
fn bind_udp_peers(socks: &[UdpSocket], session: &ServerSession) -> Result<()> {
    // The hello must carry this session's cookie and come from the control
    // connection's IP; anything else is ignored.
    let peer_ip = session.peer_addr().ip();
    let mut bound = vec![false; socks.len()];
    for u in socks {
        u.set_nonblocking(true)
            .map_err(|e| EngineError::io("set UDP socket non-blocking", e))?;
    }
    let deadline = Instant::now() + SETUP_TIMEOUT;
    let mut buf = [0u8; 64];
    while bound.iter().any(|b| !b) {
        if Instant::now() > deadline {
            return Err(EngineError::Timeout("waiting for UDP hellos".into()));
        }
        let mut progressed = false;
        for (id, u) in socks.iter().enumerate() {
            if bound[id] {
                continue;
            }
            if let Ok((n, from)) = u.recv_from(&mut buf) {
                let ok = n == 40
                    && buf.starts_with(data::UDP_HELLO)
                    && buf[36..40] == (id as u32).to_be_bytes()
                    && session.cookie_matches(&buf[4..36])
                    && from.ip() == peer_ip;
                if ok {
                    u.connect(from)
                        .map_err(|e| EngineError::io("connect UDP socket", e))?;
                    bound[id] = true;
                    progressed = true;
                }
            }
        }
        if !progressed {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    for u in socks {
        u.set_nonblocking(false)
            .map_err(|e| EngineError::io("set UDP socket blocking", e))?;
    }
    Ok(())
}

fn recv_attached(control: &Control, warnings: &mut Vec<String>) -> Result<Vec<SocketSetup>> {
    let mut all = Vec::new();
    loop {
        match recv_msg(control, SETUP_TIMEOUT, "waiting for Attached")? {
            TestMsg::Attached {
                streams,
                warnings: theirs,
                more,
            } => {
                all.extend(streams);
                add_server_warnings(warnings, theirs);
                if !more {
                    return Ok(all);
                }
            }
            other => return Err(unexpected(&other, "Attached")),
        }
    }
}

fn add_server_warnings(warnings: &mut Vec<String>, theirs: Vec<String>) {
    for w in theirs {
        let line = format!("server: {w}");
        if !warnings.contains(&line) {
            warnings.push(line);
        }
    }
}

fn recv_msg(control: &Control, timeout: Duration, what: &str) -> Result<TestMsg> {
    match control.recv(Some(timeout))? {
        Some(bytes) => match TestMsg::decode(&bytes)? {
            TestMsg::Error { message } => Err(EngineError::Service(format!("peer: {message}"))),
            m => Ok(m),
        },
        None => Err(EngineError::Timeout(what.to_string())),
    }
}

fn send_split(control: &Control, msg: TestMsg) -> Result<()> {
    for part in msg.split() {
        control.send(&part.encode())?;
    }
    Ok(())
}

fn spawn_reader(control: Control, tx: Sender<Ev>, finished: Arc<AtomicBool>) {
    let _ = std::thread::Builder::new()
        .name("control reader".into())
        .spawn(move || loop {
            if finished.load(Ordering::Relaxed) {
                return;
            }
            match control.recv(Some(Duration::from_millis(500))) {
                Ok(None) => {}
                Ok(Some(bytes)) => {
                    let ev = match TestMsg::decode(&bytes) {
                        Ok(m) => Ev::Peer(m),
                        Err(e) => Ev::PeerGone(e.into()),
                    };
                    let gone = matches!(ev, Ev::PeerGone(_));
                    if tx.send(ev).is_err() || gone {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Ev::PeerGone(e));
                    return;
                }
            }
        });
}

fn serde_params(bytes: &[u8]) -> std::result::Result<TestParams, String> {
    let p = TestParams::decode(bytes)
        .map_err(|_| "test parameters do not parse (client and server versions differ?)")?;
    p.validate()?;
    Ok(p)
}

fn unexpected(msg: &TestMsg, wanted: &str) -> EngineError {
    let got = match msg {
        TestMsg::Error { message } => return EngineError::Service(format!("peer: {message}")),
        TestMsg::Ready { .. } => "Ready",
        TestMsg::Attached { .. } => "Attached",
        TestMsg::Start => "Start",
        TestMsg::Interval { .. } => "Interval",
        TestMsg::SendDone => "SendDone",
        TestMsg::Stop => "Stop",
        TestMsg::Final { .. } => "Final",
        TestMsg::AddStreams(_) => "AddStreams",
        TestMsg::SetCongestion { .. } => "SetCongestion",
        TestMsg::Adjusted { .. } => "Adjusted",
    };
    EngineError::Service(format!("protocol: got {got} while waiting for {wanted}"))
}

/// The process's CPU seconds since `start`, for the peer.
fn cpu_seconds_since(start: Option<fatpipe_sys::CpuSample>) -> CpuSample {
    let (Some(a), Ok(b)) = (start, fatpipe_sys::CpuSample::now()) else {
        return CpuSample::default();
    };
    CpuSample {
        user_s: b.user.saturating_sub(a.user).as_secs_f64(),
        system_s: b.system.saturating_sub(a.system).as_secs_f64(),
        wall_s: b.wall.saturating_duration_since(a.wall).as_secs_f64(),
    }
}

/// Utilisation from the peer's CPU seconds.
fn cpu_use(c: &CpuSample) -> schema::CpuUse {
    if c.wall_s <= 0.0 {
        return schema::CpuUse::default();
    }
    let user = c.user_s / c.wall_s * 100.0;
    let system = c.system_s / c.wall_s * 100.0;
    schema::CpuUse {
        total_percent: user + system,
        user_percent: user,
        system_percent: system,
    }
}

fn cpu_use_since(start: Option<fatpipe_sys::CpuSample>) -> schema::CpuUse {
    let (Some(a), Ok(b)) = (start, fatpipe_sys::CpuSample::now()) else {
        return schema::CpuUse::default();
    };
    let u = b.utilisation_since(&a);
    schema::CpuUse {
        total_percent: u.total_pct,
        user_percent: u.user_pct,
        system_percent: u.system_pct,
    }
}

fn start_info(
    plan: &TestPlan,
    session: &ClientSession,
    streams: &[Stream],
    remote: &[SocketSetup],
    warnings: Vec<String>,
) -> schema::TestStart {
    let p = &plan.params;
    let info = |s: &SocketSetup| socket_info(s, p.client_sends(s.id));
    let mut warnings = warnings;
    if let Some(cc) = &p.congestion {
        let used: Vec<&str> = streams
            .iter()
            .filter(|s| s.role == Role::Send)
            .map(|s| s.setup.congestion.as_str())
            .chain(
                remote
                    .iter()
                    .filter(|s| !p.client_sends(s.id))
                    .map(|s| s.congestion.as_str()),
            )
            .collect();
        let refused = warnings
            .iter()
            .any(|w| w.contains(&format!("congestion control '{cc}'")));
        if let Some(other) = used.iter().find(|u| !refused && !u.is_empty() && *u != cc) {
            let line = format!("asked for congestion control '{cc}', the sender uses '{other}'");
            if !warnings.contains(&line) {
                warnings.push(line);
            }
        }
    }
    let timestamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    schema::TestStart {
        timestamp,
        server: plan.server.clone(),
        server_addr: session.peer_addr().to_string(),
        protocol: p.protocol,
        direction: p.direction,
        streams: p.streams,
        duration_s: if p.bytes.is_some() {
            0.0
        } else {
            p.duration_ms as f64 / 1e3
        },
        bytes: p.bytes,
        omit_s: p.omit_ms as f64 / 1e3,
        interval_s: p.interval_ms as f64 / 1e3,
        length: p.length,
        bitrate: (p.protocol == Protocol::Udp).then_some(p.bitrate),
        window: p.window,
        mss: p.mss,
        congestion: p.congestion.clone(),
        fq_rate: p.fq_rate,
        zerocopy: p.zerocopy,
        local: streams.iter().map(|s| info(&s.setup)).collect(),
        remote: remote.iter().map(info).collect(),
        warnings,
        // Auto-tuning happens before the session, in the binary, which
        // fills this in.
        auto: None,
        encryption: session.encryption().map(|e| fatpipe_schema::Encryption {
            protocol: e.protocol.into(),
            suite: e.suite.into(),
        }),
    }
}

/// One stream's socket settings for the report; `up` if the client sends.
fn socket_info(s: &SocketSetup, up: bool) -> schema::SocketInfo {
    schema::SocketInfo {
        id: s.id,
        direction: if up {
            schema::Direction::Up
        } else {
            schema::Direction::Down
        },
        sndbuf: s.sndbuf,
        rcvbuf: s.rcvbuf,
        mss: s.mss,
        congestion: s.congestion.clone(),
        send_path: s.send_path.clone(),
        recv_path: s.recv_path.clone(),
    }
}

/// True if the client sends on the stream of this client-side sample (its
/// role says; streams added mid-test do not follow the `--bidir` id split).
fn client_sends(p: &TestParams, local: &StreamSample) -> bool {
    match local.role {
        Some(Role::Send) => true,
        Some(Role::Recv) => false,
        None => p.client_sends(local.id),
    }
}

/// One stream's numbers from the two ends' samples.
fn merge_stream(
    p: &TestParams,
    id: u32,
    up: bool,
    local: Option<&StreamSample>,
    remote: Option<&StreamSample>,
    seconds: f64,
) -> schema::StreamStats {
    let (sender, receiver) = if up { (local, remote) } else { (remote, local) };
    let recv = receiver.cloned().unwrap_or_default();
    let send = sender.cloned().unwrap_or_default();
    let tcp = p.protocol == Protocol::Tcp;
    let bps = if seconds > 0.0 {
        recv.bytes as f64 * 8.0 / seconds
    } else {
        0.0
    };
    schema::StreamStats {
        id: Some(id),
        direction: Some(if up {
            schema::Direction::Up
        } else {
            schema::Direction::Down
        }),
        seconds,
        bytes: recv.bytes,
        bits_per_second: bps,
        bytes_sent: send.bytes,
        retransmits: tcp.then_some(send.retransmits),
        rtt_us: tcp.then_some(send.rtt_us),
        rttvar_us: tcp.then_some(send.rttvar_us),
        cwnd: tcp.then_some(send.cwnd),
        packets_sent: (!tcp).then_some(send.packets),
        packets: (!tcp).then_some(recv.packets),
        lost: (!tcp).then_some(recv.lost),
        lost_percent: (!tcp).then(|| percent(recv.lost, recv.lost + recv.packets)),
        out_of_order: (!tcp).then_some(recv.out_of_order),
        jitter_ms: (!tcp).then_some(recv.jitter_us / 1e3),
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// Per-direction sums of per-stream stats.
fn sums(p: &TestParams, streams: &[schema::StreamStats]) -> Vec<schema::StreamStats> {
    let mut out = Vec::new();
    for dir in [schema::Direction::Up, schema::Direction::Down] {
        let these: Vec<_> = streams
            .iter()
            .filter(|s| s.direction == Some(dir))
            .collect();
        if these.is_empty() {
            continue;
        }
        let n = these.len() as f64;
        let add = |f: fn(&schema::StreamStats) -> Option<u64>| -> Option<u64> {
            these.iter().map(|s| f(s)).sum::<Option<u64>>()
        };
        let seconds = these.iter().map(|s| s.seconds).fold(0.0, f64::max);
        let bytes: u64 = these.iter().map(|s| s.bytes).sum();
        let tcp = p.protocol == Protocol::Tcp;
        let lost = add(|s| s.lost);
        let packets = add(|s| s.packets);
        // An RTT of 0 is unknown (no TCP_INFO, or no sample from the
        // sender yet): the mean is over the streams that know theirs.
        let known: Vec<_> = these
            .iter()
            .filter(|s| s.rtt_us.is_some_and(|r| r > 0))
            .collect();
        let mean = |f: fn(&schema::StreamStats) -> Option<u32>| -> u32 {
            let sum: u64 = known.iter().map(|s| u64::from(f(s).unwrap_or(0))).sum();
            (sum as f64 / known.len().max(1) as f64) as u32
        };
        out.push(schema::StreamStats {
            id: None,
            direction: Some(dir),
            seconds,
            bytes,
            bits_per_second: these.iter().map(|s| s.bits_per_second).sum(),
            bytes_sent: these.iter().map(|s| s.bytes_sent).sum(),
            retransmits: add(|s| s.retransmits),
            rtt_us: tcp.then(|| mean(|s| s.rtt_us)),
            rttvar_us: tcp.then(|| mean(|s| s.rttvar_us)),
            cwnd: add(|s| s.cwnd),
            packets_sent: add(|s| s.packets_sent),
            packets,
            lost,
            lost_percent: match (lost, packets) {
                (Some(l), Some(r)) => Some(percent(l, l + r)),
                _ => None,
            },
            out_of_order: add(|s| s.out_of_order),
            jitter_ms: (!tcp).then(|| {
                these
                    .iter()
                    .map(|s| s.jitter_ms.unwrap_or(0.0))
                    .sum::<f64>()
                    / n
            }),
        });
    }
    out
}

fn merge_interval(
    p: &TestParams,
    index: u32,
    begin: Duration,
    end: Duration,
    omitted: bool,
    local: &[StreamSample],
    remote: &[StreamSample],
) -> schema::TestInterval {
    let seconds = (end - begin).as_secs_f64();
    let by_id: HashMap<u32, &StreamSample> = remote.iter().map(|s| (s.id, s)).collect();
    let streams: Vec<_> = local
        .iter()
        .map(|l| {
            let up = client_sends(p, l);
            merge_stream(p, l.id, up, Some(l), by_id.get(&l.id).copied(), seconds)
        })
        .collect();
    schema::TestInterval {
        index,
        start_s: begin.as_secs_f64(),
        end_s: end.as_secs_f64(),
        omitted,
        sums: sums(p, &streams),
        streams,
    }
}

fn merge_final(
    p: &TestParams,
    side: &Side,
    remote: &[StreamSample],
    cpu_local: schema::CpuUse,
    cpu_remote: schema::CpuUse,
) -> schema::TestEnd {
    let local = side.totals();
    let by_id: HashMap<u32, &StreamSample> = remote.iter().map(|s| (s.id, s)).collect();
    let streams: Vec<_> = local
        .iter()
        .map(|l| {
            let r = by_id.get(&l.id).copied();
            // Measured time is the receiver's: warm-up end to last byte.
            let up = client_sends(p, l);
            let recv = if up { r } else { Some(l) };
            let seconds = recv.map_or(0, |s| s.elapsed_us) as f64 / 1e6;
            let mut s = merge_stream(p, l.id, up, Some(l), r, seconds);
            if p.protocol == Protocol::Udp {
                // Over the whole test the sender's count is the truth.
                let sent = s.packets_sent.unwrap_or(0);
                let got = s.packets.unwrap_or(0);
                let lost = sent.saturating_sub(got);
                s.lost = Some(lost);
                s.lost_percent = Some(percent(lost, sent));
            }
            s
        })
        .collect();
    let seconds = streams.iter().map(|s| s.seconds).fold(0.0, f64::max);
    schema::TestEnd {
        seconds,
        sums: sums(p, &streams),
        streams,
        cpu_local,
        cpu_remote,
        rfc6349: None,
        ramp: None,
    }
}

#[cfg(test)]
mod service_tests;

#[cfg(test)]
mod tests {
    //! Table tests for the arithmetic behind every number `fatpipe test`
    //! prints: each row is a hand-built pair of samples and the stats
    //! worked out by hand (the sums in the comments), never by calling the
    //! code under test.

    use super::*;
    use crate::msg::SocketSetup;
    use schema::StreamStats;

    fn params(protocol: Protocol, direction: Direction, streams: u32) -> TestParams {
        TestParams {
            protocol,
            streams,
            direction,
            duration_ms: 10_000,
            bytes: None,
            omit_ms: 0,
            interval_ms: 1000,
            window: None,
            force_buffers: false,
            start_window: None,
            mss: None,
            congestion: None,
            fq_rate: None,
            zerocopy: false,
            length: 1470,
            bitrate: 10_000_000,
            no_batch: false,
        }
    }

    fn tcp(direction: Direction, streams: u32) -> TestParams {
        params(Protocol::Tcp, direction, streams)
    }

    fn udp(direction: Direction, streams: u32) -> TestParams {
        params(Protocol::Udp, direction, streams)
    }

    fn send(id: u32) -> StreamSample {
        StreamSample {
            id,
            role: Some(Role::Send),
            ..Default::default()
        }
    }

    fn recv(id: u32) -> StreamSample {
        StreamSample {
            id,
            role: Some(Role::Recv),
            ..Default::default()
        }
    }

    const UP: Option<schema::Direction> = Some(schema::Direction::Up);
    const DOWN: Option<schema::Direction> = Some(schema::Direction::Down);

    /// Equal within rounding of the last bits (rates over 0.1 s, means).
    fn close(a: f64, b: f64) -> bool {
        a == b || (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
    }

    fn close_opt(a: Option<f64>, b: Option<f64>) -> bool {
        match (a, b) {
            (Some(a), Some(b)) => close(a, b),
            (a, b) => a == b,
        }
    }

    /// Every field equal, the floating-point ones within rounding.
    fn assert_stats(row: &str, got: &StreamStats, want: &StreamStats) {
        let exact = |s: &StreamStats| StreamStats {
            seconds: 0.0,
            bits_per_second: 0.0,
            lost_percent: s.lost_percent.map(|_| 0.0),
            jitter_ms: s.jitter_ms.map(|_| 0.0),
            ..s.clone()
        };
        assert_eq!(exact(got), exact(want), "{row}");
        assert!(close(got.seconds, want.seconds), "{row}: seconds\n{got:?}");
        assert!(
            close(got.bits_per_second, want.bits_per_second),
            "{row}: bits_per_second {} != {}",
            got.bits_per_second,
            want.bits_per_second
        );
        assert!(
            close_opt(got.lost_percent, want.lost_percent),
            "{row}: lost_percent {:?} != {:?}",
            got.lost_percent,
            want.lost_percent
        );
        assert!(
            close_opt(got.jitter_ms, want.jitter_ms),
            "{row}: jitter_ms {:?} != {:?}",
            got.jitter_ms,
            want.jitter_ms
        );
    }

    fn assert_all(row: &str, got: &[StreamStats], want: &[StreamStats]) {
        assert_eq!(got.len(), want.len(), "{row}: count\n{got:#?}");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert_stats(&format!("{row} [{i}]"), g, w);
        }
    }

    /// A TCP stream's stats; the UDP fields stay `None`.
    fn tcp_stats(
        id: Option<u32>,
        direction: Option<schema::Direction>,
        seconds: f64,
        bytes: u64,
        bits_per_second: f64,
        bytes_sent: u64,
        (retransmits, rtt_us, rttvar_us, cwnd): (u64, u32, u32, u64),
    ) -> StreamStats {
        StreamStats {
            id,
            direction,
            seconds,
            bytes,
            bits_per_second,
            bytes_sent,
            retransmits: Some(retransmits),
            rtt_us: Some(rtt_us),
            rttvar_us: Some(rttvar_us),
            cwnd: Some(cwnd),
            ..Default::default()
        }
    }

    /// A UDP stream's stats; the TCP fields stay `None`.
    #[allow(clippy::too_many_arguments)]
    fn udp_stats(
        id: Option<u32>,
        direction: Option<schema::Direction>,
        seconds: f64,
        bytes: u64,
        bits_per_second: f64,
        bytes_sent: u64,
        (packets_sent, packets, lost, lost_percent): (u64, u64, u64, f64),
        (out_of_order, jitter_ms): (u64, f64),
    ) -> StreamStats {
        StreamStats {
            id,
            direction,
            seconds,
            bytes,
            bits_per_second,
            bytes_sent,
            packets_sent: Some(packets_sent),
            packets: Some(packets),
            lost: Some(lost),
            lost_percent: Some(lost_percent),
            out_of_order: Some(out_of_order),
            jitter_ms: Some(jitter_ms),
            ..Default::default()
        }
    }

    #[test]
    fn percent_of_a_whole() {
        let rows: &[(u64, u64, f64)] = &[
            (0, 0, 0.0), // nothing sent: 0, not NaN
            (5, 0, 0.0), // an impossible whole: still 0
            (0, 10, 0.0),
            (1, 4, 25.0),
            (1, 3, 33.333_333_333_333_336), // 100/3, unrounded
            (7, 7, 100.0),
            (1, 1_000_000, 0.0001),
        ];
        for &(part, whole, want) in rows {
            let got = percent(part, whole);
            assert!(
                close(got, want),
                "percent({part}, {whole}) = {got}, not {want}"
            );
        }
    }

    #[test]
    fn client_sends_follows_the_role_then_the_id_split() {
        let no_role = |id| StreamSample {
            id,
            ..Default::default()
        };
        let rows = [
            // The sample's role wins over the test's direction (streams
            // added mid-test do not follow the --bidir id split).
            (tcp(Direction::Down, 1), send(0), true),
            (tcp(Direction::Up, 1), recv(0), false),
            (tcp(Direction::Both, 1), send(5), true),
            (tcp(Direction::Both, 1), recv(0), false),
            // Without one: the direction, and for bidir ids below
            // `streams` are the client's.
            (tcp(Direction::Up, 2), no_role(1), true),
            (tcp(Direction::Down, 2), no_role(0), false),
            (tcp(Direction::Both, 2), no_role(1), true),
            (tcp(Direction::Both, 2), no_role(2), false),
        ];
        for (i, (p, s, want)) in rows.iter().enumerate() {
            assert_eq!(
                client_sends(p, s),
                *want,
                "row {i}: {:?} {s:?}",
                p.direction
            );
        }
    }

    #[test]
    fn cpu_use_is_percent_of_one_core() {
        // user, system, wall seconds -> total, user, system percent
        let rows: &[([f64; 3], [f64; 3])] = &[
            ([0.5, 0.25, 2.0], [37.5, 25.0, 12.5]),
            // Two busy cores: over 100 %.
            ([3.0, 1.0, 2.0], [200.0, 150.0, 50.0]),
            // 1 s of user time in 3 s: 100 / 3 %, unrounded.
            (
                [1.0, 0.0, 3.0],
                [33.333_333_333_333_336, 33.333_333_333_333_336, 0.0],
            ),
            // No wall time (the peer could not read its clock): zeros.
            ([1.0, 1.0, 0.0], [0.0, 0.0, 0.0]),
            ([1.0, 1.0, -1.0], [0.0, 0.0, 0.0]),
        ];
        for &([user_s, system_s, wall_s], [total, user, system]) in rows {
            let got = cpu_use(&CpuSample {
                user_s,
                system_s,
                wall_s,
            });
            assert!(
                close(got.total_percent, total)
                    && close(got.user_percent, user)
                    && close(got.system_percent, system),
                "{user_s}/{system_s}/{wall_s}: {got:?}"
            );
        }
    }

    #[test]
    fn merge_stream_takes_bytes_from_the_receiver_and_state_from_the_sender() {
        struct Row {
            name: &'static str,
            p: TestParams,
            up: bool,
            local: Option<StreamSample>,
            remote: Option<StreamSample>,
            seconds: f64,
            want: StreamStats,
        }
        let rows = [
            Row {
                name: "tcp up: client sends, server receives",
                p: tcp(Direction::Up, 1),
                up: true,
                local: Some(StreamSample {
                    bytes: 1_300_000,
                    retransmits: 4,
                    rtt_us: 20_000,
                    rttvar_us: 3_000,
                    cwnd: 262_144,
                    ..send(0)
                }),
                // The receiver's own TCP_INFO is not the path's: ignored.
                remote: Some(StreamSample {
                    bytes: 1_250_000,
                    retransmits: 9,
                    rtt_us: 150,
                    cwnd: 14_480,
                    ..recv(0)
                }),
                seconds: 1.0,
                // 1_250_000 B * 8 / 1 s = 10 Mbit/s
                want: tcp_stats(
                    Some(0),
                    UP,
                    1.0,
                    1_250_000,
                    10_000_000.0,
                    1_300_000,
                    (4, 20_000, 3_000, 262_144),
                ),
            },
            Row {
                name: "tcp reverse: server sends, client receives",
                p: tcp(Direction::Down, 1),
                up: false,
                local: Some(StreamSample {
                    bytes: 500_000,
                    rtt_us: 99,
                    ..recv(3)
                }),
                remote: Some(StreamSample {
                    bytes: 600_000,
                    retransmits: 7,
                    rtt_us: 40_000,
                    rttvar_us: 10_000,
                    cwnd: 1_048_576,
                    ..send(3)
                }),
                seconds: 0.5,
                // 500_000 B * 8 / 0.5 s = 8 Mbit/s
                want: tcp_stats(
                    Some(3),
                    DOWN,
                    0.5,
                    500_000,
                    8_000_000.0,
                    600_000,
                    (7, 40_000, 10_000, 1_048_576),
                ),
            },
            Row {
                name: "zero-length interval: bytes counted, no rate (not inf/NaN)",
                p: tcp(Direction::Up, 1),
                up: true,
                local: Some(StreamSample {
                    bytes: 4096,
                    ..send(0)
                }),
                remote: Some(StreamSample {
                    bytes: 1000,
                    ..recv(0)
                }),
                seconds: 0.0,
                want: tcp_stats(Some(0), UP, 0.0, 1000, 0.0, 4096, (0, 0, 0, 0)),
            },
            Row {
                name: "rates are not rounded: 1000 B in 0.3 s",
                p: tcp(Direction::Up, 1),
                up: true,
                local: Some(StreamSample {
                    bytes: 1000,
                    ..send(0)
                }),
                remote: Some(StreamSample {
                    bytes: 1000,
                    ..recv(0)
                }),
                seconds: 0.3,
                // 8000 bit / 0.3 s = 26 666.666… bit/s
                want: tcp_stats(
                    Some(0),
                    UP,
                    0.3,
                    1000,
                    26_666.666_666_666_668,
                    1000,
                    (0, 0, 0, 0),
                ),
            },
            Row {
                name: "receiver's sample missing: nothing received, sender's state kept",
                p: tcp(Direction::Up, 1),
                up: true,
                local: Some(StreamSample {
                    bytes: 65_536,
                    retransmits: 1,
                    rtt_us: 12_000,
                    rttvar_us: 600,
                    cwnd: 43_440,
                    ..send(1)
                }),
                remote: None,
                seconds: 1.0,
                want: tcp_stats(Some(1), UP, 1.0, 0, 0.0, 65_536, (1, 12_000, 600, 43_440)),
            },
            Row {
                name: "sender's sample missing: bytes received, TCP state all 0",
                p: tcp(Direction::Down, 1),
                up: false,
                local: Some(StreamSample {
                    bytes: 250_000,
                    ..recv(1)
                }),
                remote: None,
                seconds: 2.0,
                // 250_000 B * 8 / 2 s = 1 Mbit/s
                want: tcp_stats(Some(1), DOWN, 2.0, 250_000, 1_000_000.0, 0, (0, 0, 0, 0)),
            },
            Row {
                name: "sender without TCP_INFO: 0 RTT, cwnd, retransmits (Some, for TCP)",
                p: tcp(Direction::Up, 1),
                up: true,
                local: Some(StreamSample {
                    bytes: 2_000_000,
                    ..send(0)
                }),
                remote: Some(StreamSample {
                    bytes: 2_000_000,
                    rtt_us: 300,
                    ..recv(0)
                }),
                seconds: 1.0,
                want: tcp_stats(
                    Some(0),
                    UP,
                    1.0,
                    2_000_000,
                    16_000_000.0,
                    2_000_000,
                    (0, 0, 0, 0),
                ),
            },
            Row {
                name: "udp up: packets, loss, order, jitter from the receiver",
                p: udp(Direction::Up, 1),
                up: true,
                // 1000 datagrams of 1470 B sent.
                local: Some(StreamSample {
                    bytes: 1_470_000,
                    packets: 1000,
                    ..send(0)
                }),
                // 960 arrived, 40 missing, 2 late.
                remote: Some(StreamSample {
                    bytes: 1_411_200,
                    packets: 960,
                    lost: 40,
                    out_of_order: 2,
                    jitter_us: 1_250.0,
                    rtt_us: 5,
                    ..recv(0)
                }),
                seconds: 1.0,
                // 960 * 1470 B * 8 / 1 s = 11 289 600 bit/s;
                // lost 40 / (40 + 960) = 4 %; 1250 µs = 1.25 ms
                want: udp_stats(
                    Some(0),
                    UP,
                    1.0,
                    1_411_200,
                    11_289_600.0,
                    1_470_000,
                    (1000, 960, 40, 4.0),
                    (2, 1.25),
                ),
            },
            Row {
                name: "udp reverse: everything lost",
                p: udp(Direction::Down, 1),
                up: false,
                local: Some(StreamSample {
                    lost: 25,
                    ..recv(0)
                }),
                remote: Some(StreamSample {
                    bytes: 36_750,
                    packets: 25,
                    ..send(0)
                }),
                seconds: 1.0,
                // 25 / (25 + 0) = 100 %
                want: udp_stats(
                    Some(0),
                    DOWN,
                    1.0,
                    0,
                    0.0,
                    36_750,
                    (25, 0, 25, 100.0),
                    (0, 0.0),
                ),
            },
            Row {
                name: "udp with zero packets: 0 % lost, not NaN",
                p: udp(Direction::Up, 1),
                up: true,
                local: Some(send(0)),
                remote: Some(recv(0)),
                seconds: 1.0,
                want: udp_stats(Some(0), UP, 1.0, 0, 0.0, 0, (0, 0, 0, 0.0), (0, 0.0)),
            },
            Row {
                name: "udp, neither sample: all zero",
                p: udp(Direction::Both, 1),
                up: false,
                local: None,
                remote: None,
                seconds: 0.25,
                want: udp_stats(Some(2), DOWN, 0.25, 0, 0.0, 0, (0, 0, 0, 0.0), (0, 0.0)),
            },
        ];
        for (i, r) in rows.iter().enumerate() {
            let id = r.want.id.unwrap_or(0);
            let got = merge_stream(
                &r.p,
                id,
                r.up,
                r.local.as_ref(),
                r.remote.as_ref(),
                r.seconds,
            );
            assert_stats(&format!("row {i}: {}", r.name), &got, &r.want);
        }
    }

    #[test]
    fn sums_add_per_direction() {
        struct Row {
            name: &'static str,
            p: TestParams,
            streams: Vec<StreamStats>,
            want: Vec<StreamStats>,
        }
        let t = |id, dir, seconds, bytes, bps, sent, tcp| {
            tcp_stats(Some(id), dir, seconds, bytes, bps, sent, tcp)
        };
        let rows = [
            Row {
                name: "tcp, two streams up: counts add, RTT is the mean",
                p: tcp(Direction::Up, 2),
                streams: vec![
                    t(
                        0,
                        UP,
                        1.0,
                        1_000_000,
                        8e6,
                        1_100_000,
                        (2, 10_000, 1_000, 100_000),
                    ),
                    t(
                        1,
                        UP,
                        1.0,
                        3_000_000,
                        24e6,
                        3_000_000,
                        (0, 30_000, 3_000, 300_000),
                    ),
                ],
                // rtt (10 000 + 30 000) / 2, rttvar (1000 + 3000) / 2,
                // cwnd 100 000 + 300 000
                want: vec![tcp_stats(
                    None,
                    UP,
                    1.0,
                    4_000_000,
                    32e6,
                    4_100_000,
                    (2, 20_000, 2_000, 400_000),
                )],
            },
            Row {
                name: "periods differ: the longest; rates add (not bytes / longest)",
                p: tcp(Direction::Up, 2),
                streams: vec![
                    t(0, UP, 2.0, 1_000_000, 4e6, 1_000_000, (0, 0, 0, 0)),
                    t(1, UP, 1.0, 1_000_000, 8e6, 1_000_000, (0, 0, 0, 0)),
                ],
                // 4 + 8 Mbit/s = 12 Mbit/s, where 2 MB / 2 s would be 8.
                want: vec![tcp_stats(
                    None,
                    UP,
                    2.0,
                    2_000_000,
                    12e6,
                    2_000_000,
                    (0, 0, 0, 0),
                )],
            },
            Row {
                name: "RTT mean truncates to whole µs",
                p: tcp(Direction::Down, 2),
                streams: vec![
                    t(0, DOWN, 1.0, 1, 8.0, 1, (0, 10_001, 3, 1)),
                    t(1, DOWN, 1.0, 1, 8.0, 1, (0, 10_000, 0, 1)),
                ],
                // (10 001 + 10 000) / 2 = 10 000.5 -> 10 000;
                // (3 + 0) / 2 = 1.5 -> 1
                want: vec![tcp_stats(None, DOWN, 1.0, 2, 16.0, 2, (0, 10_000, 1, 2))],
            },
            Row {
                name: "a sender without TCP_INFO (RTT 0, unknown) is not in the RTT mean",
                p: tcp(Direction::Up, 3),
                streams: vec![
                    t(
                        0,
                        UP,
                        1.0,
                        1_000_000,
                        8e6,
                        1_000_000,
                        (1, 40_000, 4_000, 100_000),
                    ),
                    t(1, UP, 1.0, 1_000_000, 8e6, 1_000_000, (0, 0, 0, 0)),
                    t(
                        2,
                        UP,
                        1.0,
                        1_000_000,
                        8e6,
                        1_000_000,
                        (2, 20_000, 2_000, 50_000),
                    ),
                ],
                // rtt (40 000 + 20 000) / 2 streams that know it, not / 3;
                // rttvar (4000 + 2000) / 2
                want: vec![tcp_stats(
                    None,
                    UP,
                    1.0,
                    3_000_000,
                    24e6,
                    3_000_000,
                    (3, 30_000, 3_000, 150_000),
                )],
            },
            Row {
                name: "bidir: one sum per direction, up first, never mixed",
                p: tcp(Direction::Both, 2),
                streams: vec![
                    t(
                        2,
                        DOWN,
                        1.0,
                        500_000,
                        4e6,
                        600_000,
                        (5, 40_000, 4_000, 80_000),
                    ),
                    t(
                        0,
                        UP,
                        1.0,
                        1_000_000,
                        8e6,
                        1_000_000,
                        (1, 10_000, 1_000, 50_000),
                    ),
                    t(
                        3,
                        DOWN,
                        1.0,
                        1_500_000,
                        12e6,
                        1_500_000,
                        (0, 60_000, 2_000, 20_000),
                    ),
                    t(
                        1,
                        UP,
                        0.5,
                        250_000,
                        4e6,
                        300_000,
                        (2, 30_000, 3_000, 70_000),
                    ),
                ],
                want: vec![
                    // 1 MB + 0.25 MB, 8 + 4 Mbit/s, rtt (10 + 30 ms) / 2
                    tcp_stats(
                        None,
                        UP,
                        1.0,
                        1_250_000,
                        12e6,
                        1_300_000,
                        (3, 20_000, 2_000, 120_000),
                    ),
                    // 0.5 MB + 1.5 MB, 4 + 12 Mbit/s, rtt (40 + 60 ms) / 2
                    tcp_stats(
                        None,
                        DOWN,
                        1.0,
                        2_000_000,
                        16e6,
                        2_100_000,
                        (5, 50_000, 3_000, 100_000),
                    ),
                ],
            },
            Row {
                name: "reverse only: a single down sum",
                p: tcp(Direction::Down, 1),
                streams: vec![t(0, DOWN, 1.0, 10, 80.0, 10, (0, 1, 1, 1))],
                want: vec![tcp_stats(None, DOWN, 1.0, 10, 80.0, 10, (0, 1, 1, 1))],
            },
            Row {
                name: "no streams: no sums",
                p: tcp(Direction::Both, 1),
                streams: vec![],
                want: vec![],
            },
            Row {
                name: "udp: counts add, loss % of all packets, jitter the mean",
                p: udp(Direction::Up, 2),
                streams: vec![
                    udp_stats(
                        Some(0),
                        UP,
                        1.0,
                        1_455_300,
                        11_642_400.0,
                        1_470_000,
                        (1000, 990, 10, 1.0),
                        (1, 0.5),
                    ),
                    udp_stats(
                        Some(1),
                        UP,
                        1.0,
                        1_425_900,
                        11_407_200.0,
                        1_470_000,
                        (1000, 970, 30, 3.0),
                        (0, 1.5),
                    ),
                ],
                // lost 10 + 30 = 40 of 40 + 1960 = 2 %; jitter (0.5 + 1.5) / 2
                want: vec![udp_stats(
                    None,
                    UP,
                    1.0,
                    2_881_200,
                    23_049_600.0,
                    2_940_000,
                    (2000, 1960, 40, 2.0),
                    (1, 1.0),
                )],
            },
            Row {
                name: "udp: loss % weighs packets, not the streams' percentages",
                p: udp(Direction::Down, 2),
                streams: vec![
                    udp_stats(Some(0), DOWN, 1.0, 0, 0.0, 0, (10, 9, 1, 10.0), (0, 0.0)),
                    udp_stats(Some(1), DOWN, 1.0, 0, 0.0, 0, (90, 90, 0, 0.0), (0, 0.0)),
                ],
                // 1 of 1 + 99 = 1 %, where the mean of 10 % and 0 % is 5 %.
                want: vec![udp_stats(
                    None,
                    DOWN,
                    1.0,
                    0,
                    0.0,
                    0,
                    (100, 99, 1, 1.0),
                    (0, 0.0),
                )],
            },
            Row {
                name: "udp with zero packets: 0 %, not NaN",
                p: udp(Direction::Both, 1),
                streams: vec![
                    udp_stats(Some(0), UP, 0.0, 0, 0.0, 0, (0, 0, 0, 0.0), (0, 0.0)),
                    udp_stats(Some(1), DOWN, 0.0, 0, 0.0, 0, (0, 0, 0, 0.0), (0, 0.0)),
                ],
                want: vec![
                    udp_stats(None, UP, 0.0, 0, 0.0, 0, (0, 0, 0, 0.0), (0, 0.0)),
                    udp_stats(None, DOWN, 0.0, 0, 0.0, 0, (0, 0, 0, 0.0), (0, 0.0)),
                ],
            },
        ];
        for (i, r) in rows.iter().enumerate() {
            assert_all(
                &format!("row {i}: {}", r.name),
                &sums(&r.p, &r.streams),
                &r.want,
            );
        }
    }

    #[test]
    fn merge_interval_pairs_the_ends_by_stream_id() {
        struct Row {
            name: &'static str,
            p: TestParams,
            index: u32,
            begin_ms: u64,
            end_ms: u64,
            omitted: bool,
            local: Vec<StreamSample>,
            remote: Vec<StreamSample>,
            want_streams: Vec<StreamStats>,
            want_sums: Vec<StreamStats>,
        }
        let rows = [
            Row {
                name: "tcp bidir: the server's samples in another order",
                p: tcp(Direction::Both, 1),
                index: 2,
                begin_ms: 2000,
                end_ms: 3000,
                omitted: false,
                local: vec![
                    StreamSample {
                        bytes: 2_000_000,
                        retransmits: 1,
                        rtt_us: 10_000,
                        rttvar_us: 500,
                        cwnd: 200_000,
                        ..send(0)
                    },
                    StreamSample {
                        bytes: 750_000,
                        ..recv(1)
                    },
                ],
                remote: vec![
                    StreamSample {
                        bytes: 800_000,
                        retransmits: 5,
                        rtt_us: 30_000,
                        rttvar_us: 1_500,
                        cwnd: 90_000,
                        ..send(1)
                    },
                    StreamSample {
                        bytes: 1_900_000,
                        ..recv(0)
                    },
                ],
                // 1.9 MB * 8 / 1 s = 15.2 Mbit/s; 0.75 MB * 8 / 1 s = 6
                want_streams: vec![
                    tcp_stats(
                        Some(0),
                        UP,
                        1.0,
                        1_900_000,
                        15_200_000.0,
                        2_000_000,
                        (1, 10_000, 500, 200_000),
                    ),
                    tcp_stats(
                        Some(1),
                        DOWN,
                        1.0,
                        750_000,
                        6_000_000.0,
                        800_000,
                        (5, 30_000, 1_500, 90_000),
                    ),
                ],
                want_sums: vec![
                    tcp_stats(
                        None,
                        UP,
                        1.0,
                        1_900_000,
                        15_200_000.0,
                        2_000_000,
                        (1, 10_000, 500, 200_000),
                    ),
                    tcp_stats(
                        None,
                        DOWN,
                        1.0,
                        750_000,
                        6_000_000.0,
                        800_000,
                        (5, 30_000, 1_500, 90_000),
                    ),
                ],
            },
            Row {
                name: "udp reverse, omitted warm-up, half a second",
                p: udp(Direction::Down, 2),
                index: 0,
                begin_ms: 0,
                end_ms: 500,
                omitted: true,
                local: vec![
                    StreamSample {
                        bytes: 147_000,
                        packets: 100,
                        jitter_us: 200.0,
                        ..recv(0)
                    },
                    StreamSample {
                        bytes: 132_300,
                        packets: 90,
                        lost: 10,
                        out_of_order: 3,
                        jitter_us: 600.0,
                        ..recv(1)
                    },
                ],
                remote: vec![
                    StreamSample {
                        bytes: 147_000,
                        packets: 100,
                        ..send(0)
                    },
                    StreamSample {
                        bytes: 147_000,
                        packets: 100,
                        ..send(1)
                    },
                ],
                // 147 000 B * 8 / 0.5 s = 2 352 000 bit/s;
                // 132 300 B * 8 / 0.5 s = 2 116 800 bit/s, 10 of 100 lost
                want_streams: vec![
                    udp_stats(
                        Some(0),
                        DOWN,
                        0.5,
                        147_000,
                        2_352_000.0,
                        147_000,
                        (100, 100, 0, 0.0),
                        (0, 0.2),
                    ),
                    udp_stats(
                        Some(1),
                        DOWN,
                        0.5,
                        132_300,
                        2_116_800.0,
                        147_000,
                        (100, 90, 10, 10.0),
                        (3, 0.6),
                    ),
                ],
                // 10 of 10 + 190 = 5 %; jitter (0.2 + 0.6) / 2 = 0.4 ms
                want_sums: vec![udp_stats(
                    None,
                    DOWN,
                    0.5,
                    279_300,
                    4_468_800.0,
                    294_000,
                    (200, 190, 10, 5.0),
                    (3, 0.4),
                )],
            },
            Row {
                name: "tcp reverse, a stream just added the server has not reported: \
                       its unknown RTT does not halve the sum's",
                p: tcp(Direction::Down, 1),
                index: 3,
                begin_ms: 3000,
                end_ms: 4000,
                omitted: false,
                local: vec![
                    StreamSample {
                        bytes: 1_000_000,
                        ..recv(0)
                    },
                    StreamSample {
                        bytes: 10_000,
                        ..recv(1)
                    },
                ],
                remote: vec![StreamSample {
                    bytes: 1_000_000,
                    rtt_us: 30_000,
                    rttvar_us: 900,
                    cwnd: 400_000,
                    ..send(0)
                }],
                // 1 MB * 8 / 1 s = 8 Mbit/s; 10 kB * 8 / 1 s = 80 kbit/s
                want_streams: vec![
                    tcp_stats(
                        Some(0),
                        DOWN,
                        1.0,
                        1_000_000,
                        8e6,
                        1_000_000,
                        (0, 30_000, 900, 400_000),
                    ),
                    tcp_stats(Some(1), DOWN, 1.0, 10_000, 80_000.0, 0, (0, 0, 0, 0)),
                ],
                // rtt and rttvar: stream 0's alone (stream 1's are unknown)
                want_sums: vec![tcp_stats(
                    None,
                    DOWN,
                    1.0,
                    1_010_000,
                    8_080_000.0,
                    1_000_000,
                    (0, 30_000, 900, 400_000),
                )],
            },
            Row {
                name: "zero-length closing interval: bytes, no rate",
                p: tcp(Direction::Up, 1),
                index: 4,
                begin_ms: 4000,
                end_ms: 4000,
                omitted: false,
                local: vec![StreamSample {
                    bytes: 8192,
                    rtt_us: 1000,
                    ..send(0)
                }],
                remote: vec![StreamSample {
                    bytes: 4096,
                    ..recv(0)
                }],
                want_streams: vec![tcp_stats(
                    Some(0),
                    UP,
                    0.0,
                    4096,
                    0.0,
                    8192,
                    (0, 1000, 0, 0),
                )],
                want_sums: vec![tcp_stats(None, UP, 0.0, 4096, 0.0, 8192, (0, 1000, 0, 0))],
            },
            Row {
                name: "a stream only at the client (just added) counts 0 received; \
                       one only at the server is dropped; roles beat the id split",
                p: tcp(Direction::Both, 1),
                index: 7,
                begin_ms: 7000,
                end_ms: 7250,
                omitted: false,
                local: vec![
                    StreamSample {
                        bytes: 250_000,
                        rtt_us: 20_000,
                        cwnd: 100_000,
                        ..send(0)
                    },
                    StreamSample {
                        bytes: 125_000,
                        ..recv(1)
                    },
                    // Added mid-test as an up stream: id 2 >= streams, yet up.
                    StreamSample {
                        bytes: 65_536,
                        rtt_us: 30_000,
                        cwnd: 20_000,
                        ..send(2)
                    },
                ],
                remote: vec![
                    StreamSample {
                        bytes: 250_000,
                        ..recv(0)
                    },
                    StreamSample {
                        bytes: 125_000,
                        rtt_us: 8_000,
                        cwnd: 64_000,
                        ..send(1)
                    },
                    StreamSample {
                        bytes: 999,
                        ..recv(9)
                    },
                ],
                // 250 000 B * 8 / 0.25 s = 8 Mbit/s; 125 000 -> 4 Mbit/s
                want_streams: vec![
                    tcp_stats(
                        Some(0),
                        UP,
                        0.25,
                        250_000,
                        8e6,
                        250_000,
                        (0, 20_000, 0, 100_000),
                    ),
                    tcp_stats(
                        Some(1),
                        DOWN,
                        0.25,
                        125_000,
                        4e6,
                        125_000,
                        (0, 8_000, 0, 64_000),
                    ),
                    tcp_stats(Some(2), UP, 0.25, 0, 0.0, 65_536, (0, 30_000, 0, 20_000)),
                ],
                // up: 250 000 B, 250 000 + 65 536 sent, rtt (20 + 30 ms) / 2,
                // cwnd 100 000 + 20 000
                want_sums: vec![
                    tcp_stats(
                        None,
                        UP,
                        0.25,
                        250_000,
                        8e6,
                        315_536,
                        (0, 25_000, 0, 120_000),
                    ),
                    tcp_stats(
                        None,
                        DOWN,
                        0.25,
                        125_000,
                        4e6,
                        125_000,
                        (0, 8_000, 0, 64_000),
                    ),
                ],
            },
        ];
        for (i, r) in rows.iter().enumerate() {
            let name = format!("row {i}: {}", r.name);
            let iv = merge_interval(
                &r.p,
                r.index,
                Duration::from_millis(r.begin_ms),
                Duration::from_millis(r.end_ms),
                r.omitted,
                &r.local,
                &r.remote,
            );
            assert_eq!(iv.index, r.index, "{name}");
            assert_eq!(iv.start_s, r.begin_ms as f64 / 1e3, "{name}");
            assert_eq!(iv.end_s, r.end_ms as f64 / 1e3, "{name}");
            assert_eq!(iv.omitted, r.omitted, "{name}");
            assert_all(&format!("{name}: streams"), &iv.streams, &r.want_streams);
            assert_all(&format!("{name}: sums"), &iv.sums, &r.want_sums);
        }
    }

    /// A finished end whose streams never moved a byte and whose sockets
    /// give no TCP_INFO (UDP sockets on loopback, no workers): its totals
    /// are all zero, so every number comes from the peer's samples.
    fn idle_side(p: &TestParams, streams: &[(u32, Role)]) -> Side {
        let (tx, rx) = mpsc::channel();
        let streams: Vec<Stream> = streams
            .iter()
            .map(|&(id, role)| Stream {
                id,
                role,
                sock: Arc::new(Sock::Udp(
                    UdpSocket::bind("127.0.0.1:0").expect("bind a loopback UDP socket"),
                )),
                counters: Arc::default(),
                setup: SocketSetup::default(),
            })
            .collect();
        let n = streams.len();
        let now = Instant::now();
        Side {
            shared: Arc::new(data::Shared::new(p.clone())),
            streams,
            workers: Vec::new(),
            rx,
            tx,
            config: p.clone(),
            sent_done: true,
            peer_sent_done: true,
            running: 0,
            senders_running: 0,
            interval: Duration::from_millis(p.interval_ms),
            omit: Duration::ZERO,
            next_tick: now,
            tick_index: 0,
            last: vec![data::Snapshot::default(); n],
            at_omit: vec![data::Snapshot::default(); n],
            omit_ns: 0,
            udp_drain_at: None,
            closed: true,
            moved: 0,
            last_progress: now,
            stall_limit: Duration::from_secs(60),
            ramp: None,
        }
    }

    #[test]
    fn totals_of_idle_streams_keep_ids_and_roles() {
        let side = idle_side(
            &tcp(Direction::Both, 1),
            &[(0, Role::Send), (1, Role::Recv), (5, Role::Send)],
        );
        assert_eq!(side.totals(), vec![send(0), recv(1), send(5)]);
    }

    #[test]
    fn merge_final_times_each_stream_by_its_receiver() {
        struct Row {
            name: &'static str,
            p: TestParams,
            local: Vec<(u32, Role)>,
            remote: Vec<StreamSample>,
            want_seconds: f64,
            want_streams: Vec<StreamStats>,
            want_sums: Vec<StreamStats>,
        }
        let rows = [
            Row {
                name: "tcp up: the server receives, its elapsed time is the period",
                p: tcp(Direction::Up, 2),
                local: vec![(0, Role::Send), (1, Role::Send)],
                remote: vec![
                    StreamSample {
                        bytes: 5_000_000,
                        elapsed_us: 2_000_000,
                        ..recv(0)
                    },
                    StreamSample {
                        bytes: 2_500_000,
                        elapsed_us: 1_000_000,
                        ..recv(1)
                    },
                ],
                want_seconds: 2.0,
                // 5 MB * 8 / 2 s = 20 Mbit/s; 2.5 MB * 8 / 1 s = 20 Mbit/s
                want_streams: vec![
                    tcp_stats(Some(0), UP, 2.0, 5_000_000, 20e6, 0, (0, 0, 0, 0)),
                    tcp_stats(Some(1), UP, 1.0, 2_500_000, 20e6, 0, (0, 0, 0, 0)),
                ],
                want_sums: vec![tcp_stats(None, UP, 2.0, 7_500_000, 40e6, 0, (0, 0, 0, 0))],
            },
            Row {
                name: "tcp reverse: the client receives; the server's time is not used",
                p: tcp(Direction::Down, 1),
                local: vec![(0, Role::Recv)],
                remote: vec![StreamSample {
                    bytes: 9_000_000,
                    retransmits: 12,
                    rtt_us: 50_000,
                    rttvar_us: 5_000,
                    cwnd: 2_000_000,
                    elapsed_us: 3_000_000,
                    ..send(0)
                }],
                want_seconds: 0.0,
                want_streams: vec![tcp_stats(
                    Some(0),
                    DOWN,
                    0.0,
                    0,
                    0.0,
                    9_000_000,
                    (12, 50_000, 5_000, 2_000_000),
                )],
                want_sums: vec![tcp_stats(
                    None,
                    DOWN,
                    0.0,
                    0,
                    0.0,
                    9_000_000,
                    (12, 50_000, 5_000, 2_000_000),
                )],
            },
            Row {
                name: "udp reverse: the sender's count is the truth (all lost)",
                p: udp(Direction::Down, 1),
                local: vec![(0, Role::Recv)],
                remote: vec![StreamSample {
                    bytes: 588_000,
                    packets: 400,
                    elapsed_us: 4_000_000,
                    ..send(0)
                }],
                want_seconds: 0.0,
                // 400 sent, 0 received: 400 lost, 400 / 400 = 100 %
                want_streams: vec![udp_stats(
                    Some(0),
                    DOWN,
                    0.0,
                    0,
                    0.0,
                    588_000,
                    (400, 0, 400, 100.0),
                    (0, 0.0),
                )],
                want_sums: vec![udp_stats(
                    None,
                    DOWN,
                    0.0,
                    0,
                    0.0,
                    588_000,
                    (400, 0, 400, 100.0),
                    (0, 0.0),
                )],
            },
            Row {
                name: "udp up: the receiver's own loss count is replaced (0 sent here)",
                p: udp(Direction::Up, 1),
                local: vec![(0, Role::Send)],
                remote: vec![StreamSample {
                    bytes: 14_700,
                    packets: 10,
                    lost: 2,
                    out_of_order: 1,
                    jitter_us: 300.0,
                    elapsed_us: 500_000,
                    ..recv(0)
                }],
                want_seconds: 0.5,
                // 14 700 B * 8 / 0.5 s = 235 200 bit/s; lost = 0 sent - 10
                // received, saturated to 0; 0 % of 0 sent
                want_streams: vec![udp_stats(
                    Some(0),
                    UP,
                    0.5,
                    14_700,
                    235_200.0,
                    0,
                    (0, 10, 0, 0.0),
                    (1, 0.3),
                )],
                want_sums: vec![udp_stats(
                    None,
                    UP,
                    0.5,
                    14_700,
                    235_200.0,
                    0,
                    (0, 10, 0, 0.0),
                    (1, 0.3),
                )],
            },
            Row {
                name: "udp with zero packets at both ends: 0 % lost",
                p: udp(Direction::Up, 1),
                local: vec![(0, Role::Send)],
                remote: vec![recv(0)],
                want_seconds: 0.0,
                want_streams: vec![udp_stats(
                    Some(0),
                    UP,
                    0.0,
                    0,
                    0.0,
                    0,
                    (0, 0, 0, 0.0),
                    (0, 0.0),
                )],
                want_sums: vec![udp_stats(
                    None,
                    UP,
                    0.0,
                    0,
                    0.0,
                    0,
                    (0, 0, 0, 0.0),
                    (0, 0.0),
                )],
            },
            Row {
                name: "tcp bidir: a stream missing from the server's totals has no \
                       time; one only the server has is dropped; sums apart",
                p: tcp(Direction::Both, 1),
                local: vec![(0, Role::Send), (1, Role::Recv)],
                remote: vec![
                    StreamSample {
                        bytes: 1_000_000,
                        retransmits: 3,
                        rtt_us: 25_000,
                        cwnd: 500_000,
                        elapsed_us: 4_000_000,
                        ..send(1)
                    },
                    StreamSample {
                        bytes: 77,
                        elapsed_us: 9_000_000,
                        ..recv(9)
                    },
                ],
                want_seconds: 0.0,
                want_streams: vec![
                    tcp_stats(Some(0), UP, 0.0, 0, 0.0, 0, (0, 0, 0, 0)),
                    tcp_stats(
                        Some(1),
                        DOWN,
                        0.0,
                        0,
                        0.0,
                        1_000_000,
                        (3, 25_000, 0, 500_000),
                    ),
                ],
                want_sums: vec![
                    tcp_stats(None, UP, 0.0, 0, 0.0, 0, (0, 0, 0, 0)),
                    tcp_stats(None, DOWN, 0.0, 0, 0.0, 1_000_000, (3, 25_000, 0, 500_000)),
                ],
            },
        ];
        let cpu_local = schema::CpuUse {
            total_percent: 30.0,
            user_percent: 10.0,
            system_percent: 20.0,
        };
        let cpu_remote = schema::CpuUse {
            total_percent: 5.0,
            user_percent: 4.0,
            system_percent: 1.0,
        };
        for (i, r) in rows.iter().enumerate() {
            let name = format!("row {i}: {}", r.name);
            let side = idle_side(&r.p, &r.local);
            let end = merge_final(&r.p, &side, &r.remote, cpu_local, cpu_remote);
            assert!(
                close(end.seconds, r.want_seconds),
                "{name}: {}",
                end.seconds
            );
            assert_all(&format!("{name}: streams"), &end.streams, &r.want_streams);
            assert_all(&format!("{name}: sums"), &end.sums, &r.want_sums);
            assert_eq!(end.cpu_local, cpu_local, "{name}");
            assert_eq!(end.cpu_remote, cpu_remote, "{name}");
            assert_eq!(end.rfc6349, None, "{name}");
        }
    }
}
