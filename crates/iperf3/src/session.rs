//! What both ends of an iperf3 test share: the control connection with its
//! decoder, the data streams and their worker threads, the per-interval
//! sampler, and this end's results document.
//!
//! Directions are the client's view everywhere (`Up` is client to server);
//! each end says which one it sends (`sends`), so one sampler and one
//! results builder serve the client and the server alike.

use std::io::{Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fatpipe_engine::dataplane::runner;
use fatpipe_schema::test::{Direction, Protocol, StreamStats, TestInterval};

use crate::data::{self, Counters, Shared, Snapshot};
use crate::wire::{Expect, Msg, Reader, Results, State, StreamResult};
use crate::{Iperf3Error, Result};

/// Longest wait for the peer at each step outside the measured period.
pub(crate) const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for senders' queues to drain before `TEST_END`.
pub(crate) const DRAIN: Duration = Duration::from_secs(3);
/// The windows the server advertises to this end's senders must hold
/// still this long before `TEST_END` (its reads have caught up).
pub(crate) const SETTLE: Duration = Duration::from_millis(250);
/// Receivers stop once nothing arrived for this long after `TEST_END`.
pub(crate) const QUIET: Duration = Duration::from_millis(250);

/// The control connection with its decoder.
pub(crate) struct Control {
    pub(crate) sock: TcpStream,
    reader: Reader,
}

impl Control {
    /// Wraps a connected control socket.
    pub(crate) fn new(sock: TcpStream) -> Control {
        let _ = sock.set_nodelay(true);
        let _ = sock.set_write_timeout(Some(STEP_TIMEOUT));
        Control {
            sock,
            reader: Reader::new(),
        }
    }

    pub(crate) fn write(&mut self, bytes: &[u8], what: &'static str) -> Result<()> {
        self.sock
            .write_all(bytes)
            .map_err(|e| Iperf3Error::io(what, e))
    }

    pub(crate) fn send_state(&mut self, s: State) -> Result<()> {
        self.write(&[s.byte()], "send a state to the peer")
    }

    /// The next message of kind `expect`, waiting at most `limit`;
    /// `Ok(None)` when `limit` passes first.
    pub(crate) fn read(
        &mut self,
        expect: Expect,
        limit: Duration,
        what: &'static str,
    ) -> Result<Option<Msg>> {
        let deadline = Instant::now() + limit;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if let Some(m) = self.reader.next(expect)? {
                return Ok(Some(m));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let _ = self
                .sock
                .set_read_timeout(Some((deadline - now).max(Duration::from_millis(1))));
            let want = self.reader.wanted(expect).min(buf.len());
            match self.sock.read(&mut buf[..want]) {
                Ok(0) => return Err(Iperf3Error::Closed(what)),
                Ok(n) => self.reader.push(&buf[..n]),
                Err(e) if is_timeout(&e) => {}
                Err(e) => return Err(Iperf3Error::io(what, e)),
            }
        }
    }

    /// Waits for state `want`; a server error, a busy server or any other
    /// state ends the test.
    pub(crate) fn expect(&mut self, want: State, what: &'static str) -> Result<()> {
        match self.read(Expect::State, STEP_TIMEOUT, what)? {
            Some(Msg::State(s)) if s == want => Ok(()),
            Some(m) => Err(unexpected(m, what)),
            None => Err(Iperf3Error::Timeout(what.into())),
        }
    }

    pub(crate) fn json(&mut self, cap: usize, what: &'static str) -> Result<Vec<u8>> {
        match self.read(Expect::Json(cap), STEP_TIMEOUT, what)? {
            Some(Msg::Json(doc)) => Ok(doc),
            Some(m) => Err(unexpected(m, what)),
            None => Err(Iperf3Error::Timeout(what.into())),
        }
    }
}

pub(crate) fn unexpected(m: Msg, waiting: &'static str) -> Iperf3Error {
    match m {
        Msg::ServerError { i_errno, errno } => Iperf3Error::Server { i_errno, errno },
        Msg::State(State::AccessDenied) => Iperf3Error::Busy,
        Msg::State(got) => Iperf3Error::Unexpected { got, waiting },
        Msg::Json(_) | Msg::Cookie(_) => {
            Iperf3Error::Protocol(format!("unexpected data while {waiting}"))
        }
    }
}

pub(crate) fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock
            | std::io::ErrorKind::TimedOut
            | std::io::ErrorKind::Interrupted
    )
}

/// One data stream at this end.
pub(crate) struct Stream {
    pub(crate) id: u32,
    /// Which way its data flows, seen from the client.
    pub(crate) direction: Direction,
    pub(crate) sock: Sock,
    pub(crate) counters: Arc<Counters>,
}

impl Stream {
    pub(crate) fn new(index: usize, direction: Direction, sock: Sock) -> Stream {
        Stream {
            id: crate::wire::stream_id(index),
            direction,
            sock,
            counters: Arc::new(Counters::default()),
        }
    }
}

/// A stream's socket.
pub(crate) enum Sock {
    Tcp(TcpStream),
    Udp(UdpSocket),
}

/// How this end's workers move data.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Work {
    /// The direction this end sends.
    pub sends: Direction,
    /// Write or datagram size.
    pub length: u32,
    /// `sendfile` TCP payload.
    pub zerocopy: bool,
    /// UDP rate per stream, bit/s (0: unpaced).
    pub bitrate: u64,
    /// 64-bit UDP sequence numbers.
    pub wide: bool,
}

/// Starts every stream on the engine's data-plane runner (no thread per
/// stream); join the handles after a stop.
pub(crate) fn spawn(
    w: Work,
    streams: &[Stream],
    shared: &Arc<Shared>,
) -> Result<Vec<runner::TaskHandle>> {
    let mut out = Vec::with_capacity(streams.len());
    let started = |out: &mut Vec<runner::TaskHandle>, flow: std::io::Result<data::Flow>| {
        let flow = flow.map_err(|e| Iperf3Error::io("start a stream", e))?;
        let h = runner::spawn(Box::new(flow)).map_err(|e| Iperf3Error::io("start a stream", e))?;
        out.push(h);
        Ok::<(), Iperf3Error>(())
    };
    for s in streams {
        let c = &s.counters;
        let len = w.length as usize;
        let (zc, rate, wide) = (w.zerocopy, w.bitrate, w.wide);
        let result = match (&s.sock, s.direction) {
            (Sock::Tcp(t), d) => t
                .try_clone()
                .map_err(|e| Iperf3Error::io("clone a stream", e))
                .and_then(|t| {
                    let flow = if d == w.sends {
                        data::Flow::tcp_send(t, len, zc, shared, c)
                    } else {
                        data::Flow::tcp_recv(t, shared, c)
                    };
                    started(&mut out, flow)
                }),
            (Sock::Udp(u), d) => u
                .try_clone()
                .map_err(|e| Iperf3Error::io("clone a stream", e))
                .and_then(|u| {
                    let flow = if d == w.sends {
                        data::Flow::udp_send(u, len, rate, wide, shared, c)
                    } else {
                        data::Flow::udp_recv(u, wide, shared, c)
                    };
                    started(&mut out, flow)
                }),
        };
        if let Err(e) = result {
            // Those already started see the stop and end.
            shared.stop_sending();
            shared.stop_receiving();
            for h in out {
                h.join();
            }
            return Err(e);
        }
    }
    Ok(out)
}

/// Samples the streams once per interval and keeps the intervals.
pub(crate) struct Sampler {
    pub(crate) start: Instant,
    omit: Duration,
    protocol: Protocol,
    sends: Direction,
    /// Counters (and total retransmits) at the last interval's end.
    last: Vec<(Snapshot, u64)>,
    /// The same at the end of the warm-up.
    pub(crate) base: Vec<(Snapshot, u64)>,
    last_at: Instant,
    pub(crate) measured_from: Instant,
    pub(crate) intervals: Vec<TestInterval>,
}

impl Sampler {
    pub(crate) fn new(
        protocol: Protocol,
        sends: Direction,
        omit_s: u64,
        streams: &[Stream],
    ) -> Sampler {
        let now = Instant::now();
        let zero = vec![(Snapshot::default(), 0); streams.len()];
        Sampler {
            start: now,
            omit: Duration::from_secs(omit_s),
            protocol,
            sends,
            last: zero.clone(),
            base: zero,
            last_at: now,
            measured_from: now,
            intervals: Vec::new(),
        }
    }

    fn omitting(&self, at: Instant) -> bool {
        at.duration_since(self.start) < self.omit
    }

    /// Closes the interval ending now.
    pub(crate) fn sample(&mut self, streams: &[Stream], now: Instant) -> &TestInterval {
        let secs = now.duration_since(self.last_at).as_secs_f64().max(1e-9);
        let omitted = self.omitting(self.last_at + (now - self.last_at) / 2);
        let mut stats = Vec::with_capacity(streams.len());
        for (i, s) in streams.iter().enumerate() {
            let snap = s.counters.snapshot();
            let info = tcp_info(s);
            let retr = info
                .as_ref()
                .and_then(|t| t.total_retrans)
                .map_or(0, u64::from);
            let (prev, prev_retr) = self.last[i];
            let mut st = delta(self.protocol, self.sends, s, &snap, &prev, secs);
            if s.direction == self.sends {
                if let Some(t) = &info {
                    st.retransmits = Some(retr.saturating_sub(prev_retr));
                    st.rtt_us = t.rtt_us;
                    st.rttvar_us = t.rttvar_us;
                    st.cwnd = t.cwnd_bytes();
                }
            }
            self.last[i] = (snap, retr);
            stats.push(st);
        }
        let iv = TestInterval {
            index: self.intervals.len() as u32,
            start_s: self.last_at.duration_since(self.start).as_secs_f64(),
            end_s: now.duration_since(self.start).as_secs_f64(),
            omitted,
            sums: sums(&stats, secs),
            streams: stats,
        };
        self.last_at = now;
        if omitted && !self.omitting(now) {
            // The warm-up ends here: the totals count from now.
            self.base.clone_from(&self.last);
            self.measured_from = now;
        }
        let at = self.intervals.len();
        self.intervals.push(iv);
        &self.intervals[at]
    }
}

/// One stream's figures between two snapshots.
fn delta(
    protocol: Protocol,
    sends: Direction,
    s: &Stream,
    now: &Snapshot,
    prev: &Snapshot,
    secs: f64,
) -> StreamStats {
    let bytes = now.bytes.saturating_sub(prev.bytes);
    let mut st = StreamStats {
        id: Some(s.id),
        direction: Some(s.direction),
        seconds: secs,
        bytes,
        bits_per_second: bytes as f64 * 8.0 / secs,
        bytes_sent: if s.direction == sends { bytes } else { 0 },
        ..StreamStats::default()
    };
    if protocol == Protocol::Udp {
        let packets = now.packets.saturating_sub(prev.packets);
        if s.direction == sends {
            st.packets_sent = Some(packets);
        } else {
            let lost = now.lost().saturating_sub(prev.lost());
            st.packets = Some(packets);
            st.lost = Some(lost);
            st.lost_percent = Some(percent(lost, packets + lost));
            st.out_of_order = Some(now.out_of_order.saturating_sub(prev.out_of_order));
            st.jitter_ms = Some(now.jitter * 1000.0);
        }
    }
    st
}

/// Sums per direction, "up" first.
pub(crate) fn sums(streams: &[StreamStats], secs: f64) -> Vec<StreamStats> {
    let mut out = Vec::new();
    for d in [Direction::Up, Direction::Down] {
        let of: Vec<&StreamStats> = streams.iter().filter(|s| s.direction == Some(d)).collect();
        if of.is_empty() {
            continue;
        }
        let add = |f: fn(&StreamStats) -> Option<u64>| -> Option<u64> {
            of.iter().map(|s| f(s)).sum::<Option<u64>>()
        };
        let bytes: u64 = of.iter().map(|s| s.bytes).sum();
        let rtts: Vec<u32> = of.iter().filter_map(|s| s.rtt_us).collect();
        let jitters: Vec<f64> = of.iter().filter_map(|s| s.jitter_ms).collect();
        let packets_sent = add(|s| s.packets_sent);
        let lost = add(|s| s.lost);
        out.push(StreamStats {
            id: None,
            direction: Some(d),
            seconds: secs,
            bytes,
            bits_per_second: bytes as f64 * 8.0 / secs.max(1e-9),
            bytes_sent: of.iter().map(|s| s.bytes_sent).sum(),
            retransmits: add(|s| s.retransmits),
            rtt_us: (!rtts.is_empty()).then(|| {
                (rtts.iter().map(|&r| u64::from(r)).sum::<u64>() / rtts.len() as u64) as u32
            }),
            rttvar_us: None,
            cwnd: add(|s| s.cwnd),
            packets_sent,
            packets: add(|s| s.packets),
            lost,
            lost_percent: match (
                lost,
                packets_sent.or(add(|s| s.packets).zip(lost).map(|(p, l)| p + l)),
            ) {
                (Some(l), Some(t)) => Some(percent(l, t)),
                _ => None,
            },
            out_of_order: add(|s| s.out_of_order),
            jitter_ms: (!jitters.is_empty())
                .then(|| jitters.iter().sum::<f64>() / jitters.len() as f64),
        });
    }
    out
}

pub(crate) fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

pub(crate) fn tcp_info(s: &Stream) -> Option<fatpipe_sys::TcpInfo> {
    match &s.sock {
        Sock::Tcp(t) => fatpipe_sys::tcp_info(t).ok(),
        Sock::Udp(_) => None,
    }
}

/// True when a TCP sender's data has all been acknowledged.
pub(crate) fn drained(s: &Stream) -> bool {
    match tcp_info(s) {
        Some(t) => t.unacked.unwrap_or(0) == 0 && t.notsent_bytes.unwrap_or(0) == 0,
        None => true,
    }
}

/// Where a test ended: each stream's counters (and TCP retransmits) now
/// and at the end of the warm-up, this process's CPU, the measured time.
pub(crate) struct Totals {
    pub now: Vec<(Snapshot, u64)>,
    pub base: Vec<(Snapshot, u64)>,
    pub cpu: fatpipe_sys::CpuUsage,
    pub seconds: f64,
}

impl Totals {
    /// Reads every stream's counters now.
    pub(crate) fn take(
        streams: &[Stream],
        sampler: &Sampler,
        cpu_start: Option<fatpipe_sys::CpuSample>,
        seconds: f64,
    ) -> Totals {
        let cpu = match (cpu_start, fatpipe_sys::CpuSample::now().ok()) {
            (Some(a), Some(b)) => b.utilisation_since(&a),
            _ => fatpipe_sys::CpuUsage::default(),
        };
        let now = streams
            .iter()
            .map(|s| {
                let retr = tcp_info(s)
                    .and_then(|t| t.total_retrans)
                    .map_or(0, u64::from);
                (s.counters.snapshot(), retr)
            })
            .collect();
        Totals {
            now,
            base: sampler.base.clone(),
            cpu,
            seconds,
        }
    }
}

/// This end's results document.
pub(crate) fn our_results(
    protocol: Protocol,
    sends: Direction,
    congestion: Option<String>,
    streams: &[Stream],
    t: &Totals,
) -> Results {
    let (cpu, seconds) = (t.cpu, t.seconds);
    let sender = streams.iter().any(|s| s.direction == sends);
    let tcp = protocol == Protocol::Tcp;
    Results {
        cpu_total: cpu.total_pct,
        cpu_user: cpu.user_pct,
        cpu_system: cpu.system_pct,
        sender_has_retransmits: match (sender, tcp) {
            (true, true) => 1,
            (true, false) => 0,
            (false, _) => -1,
        },
        congestion_used: congestion,
        streams: streams
            .iter()
            .zip(t.now.iter().zip(&t.base))
            .map(|(s, ((now, retr), (b, bretr)))| {
                let up = s.direction == sends;
                StreamResult {
                    id: s.id,
                    bytes: now.bytes.saturating_sub(b.bytes),
                    retransmits: (up && tcp).then(|| retr.saturating_sub(*bretr)),
                    jitter: if up { 0.0 } else { now.jitter },
                    errors: if up {
                        0
                    } else {
                        now.lost().saturating_sub(b.lost())
                    },
                    packets: now.packets.saturating_sub(b.packets),
                    end_time: seconds,
                }
            })
            .collect(),
        server_output_text: None,
        server_output_json: None,
    }
}

/// 36 random bytes for a cookie.
pub(crate) fn random36() -> [u8; 36] {
    let mut b = [0u8; 36];
    // A failing system RNG would leave zeros: a valid, guessable cookie,
    // which matters little for a client's one test; the time mixes in.
    if getrandom::fill(&mut b).is_err() {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        for (i, x) in b.iter_mut().enumerate() {
            *x = (t >> (i % 16 * 8)) as u8;
        }
    }
    b
}
