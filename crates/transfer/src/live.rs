//! A running session's data connections, and the handle an in-flight tuner
//! uses to watch and grow them.
//!
//! [`Pool`] keeps a clone of every connection of a session (control and
//! data, including those added mid-session), so any thread can shut them
//! all down, sum their `TCP_INFO` counters, or switch their congestion
//! control; a connection added after the session was torn down is shut at
//! once.
//!
//! [`Live`] is the client's handle on its current session for a tuner
//! running on its own thread: it samples the sending end's counters (this
//! end's sockets when pushing, the server's [`Msg::Stats`] when pulling),
//! asks the server for more streams ([`Msg::AddStreams`]) and waits until
//! the session has opened and attached the ones granted, and switches the
//! sender's congestion control. The session does the opening on its own
//! thread; `Live` only passes requests and outcomes.

use std::io;
use std::net::Shutdown;

use fatpipe_secure::Stream;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::plan::lock;
use crate::wire::{Accept, Direction, Msg, SenderStats};

/// Something that writes control messages under the session's lock
/// (the [`crate::source::Source`] or [`crate::sink::Sink`] of the session).
pub trait CtrlSend: Send + Sync {
    /// Writes one control message.
    fn send_control(&self, msg: &Msg) -> io::Result<()>;
}

impl CtrlSend for crate::source::Source {
    fn send_control(&self, msg: &Msg) -> io::Result<()> {
        crate::source::Source::send_control(self, msg)
    }
}

impl CtrlSend for crate::sink::Sink {
    fn send_control(&self, msg: &Msg) -> io::Result<()> {
        crate::sink::Sink::send_control(self, msg)
    }
}

/// Every connection of one session.
#[derive(Debug)]
pub struct Pool {
    ctrl: Stream,
    data: Mutex<Vec<Stream>>,
    /// Connections the session set up with or was granted since, some
    /// perhaps still on their way (data flows on the first while the
    /// others come).
    promised: AtomicU16,
    down: AtomicBool,
    congestion: Mutex<Option<String>>,
}

impl Pool {
    /// A pool of the control connection and the first data connections,
    /// of `promised` in all at set-up (the others are [`add`](Pool::add)ed
    /// as they come).
    pub fn new(ctrl: &Stream, data: &[Stream], promised: u16) -> io::Result<Pool> {
        let data = data
            .iter()
            .map(Stream::try_clone)
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Pool {
            ctrl: ctrl.try_clone()?,
            data: Mutex::new(data),
            promised: AtomicU16::new(promised),
            down: AtomicBool::new(false),
            congestion: Mutex::new(None),
        })
    }

    /// Adds a data connection opened mid-session: it gets the congestion
    /// control set with [`Pool::set_congestion`], and is shut at once if
    /// the session is already down.
    pub fn add(&self, s: &Stream) -> io::Result<()> {
        let clone = s.try_clone()?;
        if let Some(cc) = lock(&self.congestion).as_deref() {
            let _ = fatpipe_sys::set_congestion(clone.tcp(), cc);
        }
        let mut data = lock(&self.data);
        if self.down.load(Ordering::SeqCst) {
            let _ = clone.shutdown(Shutdown::Both);
        }
        data.push(clone);
        Ok(())
    }

    /// Counts `n` more connections granted mid-session, before they come.
    pub fn promise(&self, n: u16) {
        let _ = self
            .promised
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |p| {
                Some(p.saturating_add(n))
            });
    }

    /// Data connections of the session: set up and granted, whether or
    /// not all of them came yet.
    pub fn streams(&self) -> u16 {
        let here = lock(&self.data).len().min(usize::from(u16::MAX)) as u16;
        here.max(self.promised.load(Ordering::SeqCst))
    }

    /// Shuts every connection down, waking every thread blocked on one.
    pub fn all(&self) {
        let data = lock(&self.data);
        self.down.store(true, Ordering::SeqCst);
        let _ = self.ctrl.shutdown(Shutdown::Both);
        for s in data.iter() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Switches every data connection, and those added later, to `name`.
    /// Fails (leaving the others switched) if the kernel refuses it.
    pub fn set_congestion(&self, name: &str) -> Result<(), String> {
        *lock(&self.congestion) = Some(name.to_string());
        let data = lock(&self.data);
        for s in data.iter() {
            fatpipe_sys::set_congestion(s.tcp(), name).map_err(|e| format!("{name}: {e}"))?;
        }
        Ok(())
    }

    /// This end's sending counters, summed over the data connections.
    pub fn sender_stats(&self) -> SenderStats {
        let data = lock(&self.data);
        let mut st = SenderStats {
            streams: data.len().min(usize::from(u16::MAX)) as u16,
            ..SenderStats::default()
        };
        let (mut rtt_sum, mut rtt_n) = (0u64, 0u64);
        for s in data.iter() {
            let Ok(info) = fatpipe_sys::tcp_info(s.tcp()) else {
                continue;
            };
            st.bytes_acked += info.bytes_acked.unwrap_or(0);
            st.retransmits += u64::from(info.total_retrans.unwrap_or(0));
            if let Some(r) = info.rtt_us.filter(|&r| r > 0) {
                rtt_sum += u64::from(r);
                rtt_n += 1;
            }
        }
        st.rtt_us = rtt_sum.checked_div(rtt_n).unwrap_or(0) as u32;
        if let Some(first) = data.first() {
            st.congestion = fatpipe_sys::get_congestion(first.tcp()).unwrap_or_default();
        }
        st
    }

    /// Payload bytes received on the data connections (`TCP_INFO`).
    pub fn bytes_received(&self) -> u64 {
        lock(&self.data)
            .iter()
            .filter_map(|s| fatpipe_sys::tcp_info(s.tcp()).ok())
            .map(|i| i.bytes_received.unwrap_or(0))
            .sum()
    }
}

/// What a tuner sees of the running session at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveSample {
    /// Data connections now.
    pub streams: u16,
    /// Bytes moved so far this session: acknowledged by the server when
    /// pushing, received here when pulling.
    pub bytes: u64,
    /// The sending end's counters (the server's latest report when
    /// pulling; `None` until the first arrives).
    pub sender: Option<SenderStats>,
}

#[derive(Default)]
struct State {
    pool: Option<Arc<Pool>>,
    writer: Option<Arc<dyn CtrlSend>>,
    remote: Option<SenderStats>,
    /// Set while an `AddStreams` waits for its outcome.
    asked: bool,
    outcome: Option<Result<u16, String>>,
}

/// The client's handle on its running session, for an in-flight tuner.
pub struct Live {
    direction: Direction,
    accept: Accept,
    started: Instant,
    state: Mutex<State>,
    changed: Condvar,
    ended: AtomicBool,
    next_tag: AtomicU32,
}

impl Live {
    /// A handle for a session the server accepted with `accept`.
    pub fn new(direction: Direction, accept: Accept) -> Live {
        Live {
            direction,
            next_tag: AtomicU32::new(u32::from(accept.streams) + 1),
            accept,
            started: Instant::now(),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            ended: AtomicBool::new(false),
        }
    }

    /// Push or pull.
    pub fn direction(&self) -> Direction {
        self.direction
    }

    /// What the server said when it accepted the session (its stream cap,
    /// its congestion control and which it may switch to).
    pub fn accepted(&self) -> &Accept {
        &self.accept
    }

    /// Time since the session was accepted.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Data connections of the session now.
    pub fn streams(&self) -> u16 {
        lock(&self.state)
            .pool
            .as_ref()
            .map_or(self.accept.streams, |p| p.streams())
    }

    /// True once the session is over (finished or broken).
    pub fn ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    /// Sleeps up to `d`, returning early (true) when the session ends.
    pub fn sleep(&self, d: Duration) -> bool {
        let end = Instant::now() + d;
        let mut st = lock(&self.state);
        while !self.ended() {
            let now = Instant::now();
            if now >= end {
                return false;
            }
            st = self
                .changed
                .wait_timeout(st, end - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        true
    }

    /// The session's counters now; `None` before its data connections are
    /// attached.
    pub fn sample(&self) -> Option<LiveSample> {
        let (pool, remote) = {
            let st = lock(&self.state);
            (st.pool.clone()?, st.remote.clone())
        };
        Some(match self.direction {
            Direction::Push => {
                let sender = pool.sender_stats();
                LiveSample {
                    streams: sender.streams,
                    bytes: sender.bytes_acked,
                    sender: Some(sender),
                }
            }
            Direction::Pull => LiveSample {
                streams: pool.streams(),
                bytes: pool.bytes_received(),
                sender: remote,
            },
        })
    }

    /// Asks the server for `n` more data connections and waits (up to
    /// `timeout`) until the session has opened and attached those granted.
    /// Returns how many were added (0 when the server is at its cap).
    pub fn add_streams(&self, n: u16, timeout: Duration) -> Result<u16, String> {
        let writer = {
            let mut st = lock(&self.state);
            if self.ended() {
                return Err("the session is over".into());
            }
            if st.asked {
                return Err("an earlier request is still open".into());
            }
            let w = st.writer.clone().ok_or("the session has not started")?;
            st.asked = true;
            st.outcome = None;
            w
        };
        if let Err(e) = writer.send_control(&Msg::AddStreams { n }) {
            lock(&self.state).asked = false;
            return Err(format!("control connection: {e}"));
        }
        let end = Instant::now() + timeout;
        let mut st = lock(&self.state);
        loop {
            if let Some(r) = st.outcome.take() {
                st.asked = false;
                return r;
            }
            let now = Instant::now();
            if self.ended() || now >= end {
                st.asked = false;
                return Err(if self.ended() {
                    "the session ended first".into()
                } else {
                    "no answer from the server".into()
                });
            }
            st = self
                .changed
                .wait_timeout(st, end - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Switches the sending end's congestion control: this end's sockets
    /// when pushing; when pulling, asks the server (its next statistics
    /// show whether it took).
    pub fn set_congestion(&self, name: &str) -> Result<(), String> {
        let (pool, writer) = {
            let st = lock(&self.state);
            (st.pool.clone(), st.writer.clone())
        };
        match self.direction {
            Direction::Push => pool
                .ok_or("the session has not started")?
                .set_congestion(name),
            Direction::Pull => writer
                .ok_or("the session has not started")?
                .send_control(&Msg::SetCongestion {
                    name: name.to_string(),
                })
                .map_err(|e| format!("control connection: {e}")),
        }
    }

    // The session's side.

    pub(crate) fn attach(&self, pool: Arc<Pool>, writer: Arc<dyn CtrlSend>) {
        let mut st = lock(&self.state);
        st.pool = Some(pool);
        st.writer = Some(writer);
    }

    /// True while an `AddStreams` waits for its answer.
    pub(crate) fn asking(&self) -> bool {
        lock(&self.state).asked
    }

    pub(crate) fn next_tag(&self) -> u32 {
        self.next_tag.fetch_add(1, Ordering::SeqCst)
    }

    pub(crate) fn set_remote(&self, stats: SenderStats) {
        lock(&self.state).remote = Some(stats);
    }

    pub(crate) fn streams_added(&self, outcome: Result<u16, String>) {
        let mut st = lock(&self.state);
        st.outcome = Some(outcome);
        self.changed.notify_all();
    }

    pub(crate) fn end(&self) {
        let _st = lock(&self.state);
        self.ended.store(true, Ordering::SeqCst);
        self.changed.notify_all();
    }
}

/// Congestion controls this host lets a socket select, as
/// [`fatpipe_tune::host::congestion_allowed`] answers for every policy (by
/// capability: root or `CAP_NET_ADMIN` may use every loaded one), held to
/// what one `Accept` may carry.
pub fn congestion_allowed() -> Vec<String> {
    fatpipe_tune::host::congestion_allowed()
        .into_iter()
        .filter(|n| n.len() <= crate::wire::MAX_CONGESTION_NAME)
        .take(crate::wire::MAX_CONGESTION_NAMES)
        .collect()
}
