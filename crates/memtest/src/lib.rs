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
//! Modules by job: `side` (one end's machinery, shared by both loops),
//! `server` (the server's session loop), `client` (the client's), `steer`
//! (in-flight changes the client asks for), `dial` (opening the streams),
//! `merge` (both ends' samples into the printed numbers), `data` (the
//! streams on the data plane).
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

mod client;
mod dial;
mod merge;
mod server;
mod side;
mod steer;

use {client::*, dial::*, merge::*, server::*, side::*, steer::*};

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

#[cfg(test)]
mod service_tests;

#[cfg(test)]
mod tests;
