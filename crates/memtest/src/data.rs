//! The data plane of the throughput test, on the engine's runner.
//!
//! Every plain TCP and UDP stream is a task of
//! `fatpipe_engine::dataplane::runner`: a few I/O threads (one per core)
//! serve all streams of the process over non-blocking sockets, a quantum
//! each per round, so `-P 1024` adds no thread and every stream moves
//! data. TCP senders write the one shared pattern (or `sendfile` it from a
//! shared memfd with `-Z`), TCP receivers discard with `recv(MSG_TRUNC)`
//! so the kernel never copies the data out, UDP senders pace datagrams
//! with `sendmmsg` or GSO bursts, UDP receivers (`recvmmsg`, GRO) track
//! loss, reordering and RFC 3550 jitter. An encrypted (`--encrypt`) TCP
//! stream is a runner task too, its records written and opened through
//! the non-blocking socket (`tls`). Streams publish counters in atomics; the
//! session thread samples them (and `TCP_INFO`) once per interval, so the
//! hot paths take no lock and allocate nothing.
//!
//! What a sender does next (write how much, wait for the pacer, stop at
//! the deadline or when the `-n` budget is spent) is decided by its
//! sans-IO state, `fatpipe_engine::dataplane::stream::Sender`, one
//! quantum at a time (`runner::send_turn`); the code here only does the
//! I/O it asks for and reports what the kernel took.
//!
//! What a stream sends is the process's one shared pattern
//! (`fatpipe_engine::dataplane::payload`), and the buffers it needs of its
//! own come from the process-wide budget (`dataplane::budget`), so a peer's
//! streams × length no longer decide the server's memory (docs/security.md).
//!
//! Stopping: the session sets a stop flag and wakes the runner
//! (`Shared::stop_all`).

use std::io::{self, Write};
use std::net::{Shutdown, TcpStream, UdpSocket};

use fatpipe_secure::Stream as Conn;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::msg::{Role, SocketSetup, StreamSample, TestParams};
use fatpipe_engine::dataplane::runner::{self, SendClock, Step, Wrote};
use fatpipe_engine::dataplane::stream::Sender as StreamSender;
use fatpipe_engine::dataplane::stream::{
    ByteBudget, Datagrams, RecvTick, SendAction, SendSpec, SendTotals,
};
use fatpipe_engine::dataplane::udp::UdpReceiver;
use fatpipe_engine::dataplane::{budget, payload};
use fatpipe_schema::units;

mod tls;

/// Most bytes a TCP receiver lets accumulate before it wakes
/// (`SO_RCVLOWAT`; see [`recv_mark`]). A receiver's CPU goes with its
/// wake-ups: each costs a context switch, an `epoll_wait`, a `recv` and,
/// as the read opens the window, an ACK; over veth or loopback the
/// sender's handling of that ACK runs in the receiver's softirq too,
/// unless the sender holds its socket then (the ACK waits in its backlog).
/// A thread-per-stream receiver sleeping in `recv` reads the moment it is
/// woken, mostly while the sender is still in its `write`; the runner's
/// receiver returns through `epoll_wait` first, and pays for most of those
/// ACKs itself. At 256 KiB that was 1.2 to 1.4 times the receiver's CPU
/// per byte of the thread-per-stream build (`bench/cpu.sh`: one stream
/// paced at 10 Gbit/s over veth, same count of wake-ups, `recv` calls and
/// ACKs); at 512 KiB it wakes half as often and matched it. Not more: at
/// 1 MiB the receiver used less again, but what it leaves queued, with
/// what is in flight, no longer fits a core's L2 cache (1 MiB here), and
/// the sender's copies into fresh socket buffers looked slower (noisy).
const RCV_LOWAT: u64 = 512 << 10;

/// The least mark, however many streams share the total.
const RCV_LOWAT_MIN: u64 = 16 * 1024;

/// Most bytes a TCP receiver under `-w` lets accumulate: what it leaves
/// queued shrinks the window the sender sees, which `-w` sets exactly.
const RCV_LOWAT_HELD: u64 = 256 * 1024;

/// Bytes all TCP receivers of one end may park below their marks together.
const RCV_LOWAT_TOTAL: u64 = 32 << 20;

/// Unsent bytes all TCP senders of one end may queue together.
const NOTSENT_TOTAL: u64 = 32 << 20;

/// Longest a TCP receiver sleeps with bytes waiting below the low mark.
const RECV_TICK: Duration = Duration::from_millis(20);

/// Longest a TCP receiver that keeps finding its queue empty waits before
/// it looks again (`dataplane::stream::RecvTick`).
const RECV_TICK_MAX: Duration = Duration::from_millis(160);

/// Largest UDP payload over IPv4.
const MAX_UDP_PAYLOAD: usize = 65_507;

/// Most lateness a UDP sender catches up (see `pacer`): long enough for
/// the stalls a loaded host gives a sleeping thread (tens of ms), which
/// the pacer makes good at 1.5 times the rate in batches, not at once.
const MAX_LAG: Duration = Duration::from_millis(100);

/// Bytes of receive slots a batching UDP receiver passes per call.
const RECV_STORAGE: usize = 1 << 20;

/// Longest a stopping UDP receiver reads what is already queued.
const DRAIN_LIMIT: Duration = Duration::from_millis(200);

/// Most receive slots per `recvmmsg` call.
const RECV_SLOTS: usize = 256;

/// Bytes of the UDP datagram header: sequence number and send time.
pub(crate) const UDP_HEADER: usize = fatpipe_engine::dataplane::udp::UDP_HEADER;

/// First bytes of a UDP hello datagram (magic, cookie, stream id).
pub(crate) const UDP_HELLO: &[u8; 4] = b"FPUH";

/// A stream's socket.
#[derive(Debug)]
pub(crate) enum Sock {
    /// Plain or TLS (`--encrypt`).
    Tcp(Conn),
    Udp(UdpSocket),
}

impl Sock {
    fn shutdown(&self) {
        if let Sock::Tcp(s) = self {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// Counters a worker publishes; read by the sampler.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    bytes: AtomicU64,
    packets: AtomicU64,
    /// UDP receiver: sequence numbers its front has passed (received or
    /// lost; `dataplane::udp`).
    expected: AtomicU64,
    out_of_order: AtomicU64,
    /// UDP receiver: jitter in microseconds, as f64 bits.
    jitter_bits: AtomicU64,
    /// Nanoseconds after the test start of the last byte moved.
    last_ns: AtomicU64,
}

/// One stream at one end.
#[derive(Debug)]
pub(crate) struct Stream {
    pub id: u32,
    pub role: Role,
    pub sock: Arc<Sock>,
    pub counters: Arc<Counters>,
    pub setup: SocketSetup,
}

/// What all workers of one end share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub params: TestParams,
    /// The test clock, set before the first stream starts.
    pub clock: OnceLock<Clock>,
    /// Bytes left to send at this end with `-n`.
    pub budget: ByteBudget,
    /// Everything stops (abort or end).
    pub stop: AtomicBool,
    /// UDP receivers stop (the peer's senders are done and the queue drained).
    pub udp_recv_stop: AtomicBool,
}

/// When the test started and when its senders stop.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    pub start: Instant,
    /// start + omit + duration; `None` with `-n`.
    pub send_until: Option<Instant>,
}

impl Shared {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// A shared state whose clock is not yet started.
    pub fn new(params: TestParams) -> Shared {
        Shared {
            budget: ByteBudget::new(params.bytes),
            params,
            clock: OnceLock::new(),
            stop: AtomicBool::new(false),
            udp_recv_stop: AtomicBool::new(false),
        }
    }

    /// Starts the clock now (before the streams start).
    pub fn go(&self) -> Clock {
        let start = Instant::now();
        let p = &self.params;
        let send_until = p.bytes.is_none().then(|| {
            start + Duration::from_millis(p.omit_ms) + Duration::from_millis(p.duration_ms)
        });
        *self.clock.get_or_init(|| Clock { start, send_until })
    }

    /// Stops every stream: sets the stop flag and gives every runner task
    /// a turn to see it.
    pub fn stop_all(&self) {
        self.stop.store(true, Ordering::Relaxed);
        runner::wake_all();
    }

    /// UDP receivers drain what is queued, then stop.
    pub fn stop_udp_receivers(&self) {
        self.udp_recv_stop.store(true, Ordering::Relaxed);
        runner::wake_all();
    }

    /// The test start (now, before `go`; workers never ask that early).
    pub fn start(&self) -> Instant {
        self.clock.get().map_or_else(Instant::now, |c| c.start)
    }

    fn now_ns(&self) -> u64 {
        self.start().elapsed().as_nanos() as u64
    }
}

/// A started stream: a task on the data plane's runner.
pub(crate) type Worker = runner::TaskHandle;

/// Starts `stream` as a task on the runner (call after the clock is set).
/// It sends `id` on `done` when it ends.
pub(crate) fn spawn(
    stream: &Stream,
    shared: &Arc<Shared>,
    done: Sender<super::Ev>,
) -> io::Result<Worker> {
    let task = Work::new(stream, shared, done)?;
    runner::spawn(Box::new(task))
}

/// Wakes every worker blocked on its socket.
pub(crate) fn shutdown_all(streams: &[Stream]) {
    for s in streams {
        s.sock.shutdown();
    }
}

/// Keeps little unsent data queued in the kernel: the window still fills
/// (in-flight bytes are not limited), but a few hundred streams no longer
/// park gigabytes in send queues, which on a small host trips the global
/// TCP memory limit and starves whole streams.
fn limit_notsent(s: &TcpStream, sh: &Shared) {
    let per_stream = NOTSENT_TOTAL / u64::from(sh.params.total_streams());
    let notsent = per_stream.clamp(128 * 1024, 1 << 20);
    let _ = fatpipe_sys::set_notsent_lowat(s, notsent);
}

/// A new sending stream's state and clocks.
fn new_sender(
    sh: &Shared,
    chunk: usize,
    datagrams: Option<Datagrams>,
) -> (StreamSender, SendClock) {
    // The stream's own clock: a stream added mid-test is paced from its
    // own start, not asked to catch up since the test's.
    let t0 = Instant::now();
    let until_ns = sh
        .clock
        .get()
        .and_then(|k| k.send_until)
        .map(|u| u.saturating_duration_since(t0).as_nanos() as u64);
    let st = StreamSender::new(SendSpec {
        chunk,
        datagrams,
        until_ns,
    });
    let clock = SendClock {
        stream_start: t0,
        test_start: sh.start(),
    };
    (st, clock)
}

/// Publishes a sender's totals (its only writer: plain stores do).
fn publish_sent(c: &Counters, t: &SendTotals, test_ns: u64) {
    c.bytes.store(t.bytes, Ordering::Relaxed);
    c.packets.store(t.packets, Ordering::Relaxed);
    c.last_ns.store(test_ns, Ordering::Relaxed);
}

/// A TCP receiver's socket settings; returns the length to ask per call,
/// the window hold (`-w`) and the low-water mark it set.
fn tcp_recv_setup(s: &TcpStream, sh: &Shared) -> (usize, Option<fatpipe_sys::WindowHold>, u64) {
    // Wake the receiver per half megabyte, not per segment: on a 2-core host
    // the wakeups cost more than the discarding. A receiver that found
    // fewer bytes than the mark looks again RECV_TICK later, which bounds
    // how late a slow stream's bytes are counted; one that keeps finding
    // nothing looks less often, up to RECV_TICK_MAX (`RecvTick`). The
    // kernel wakes it early anyway under memory pressure, when the
    // window left is below one segment, or at end of file.
    let granted = fatpipe_sys::get_recv_buffer(s).unwrap_or(0);
    let window = sh.params.window.map(|_| granted);
    let lowat = recv_mark(sh.params.total_streams(), window);
    let _ = set_rcvlowat(s, lowat);
    // `-w` (or a plan) sets the window the sender may fill, exactly: the
    // kernel would otherwise let a multiple of the buffer be in flight.
    let hold = sh
        .params
        .window
        .and_then(|w| fatpipe_sys::WindowHold::new(s, w))
        .map(|h| {
            let start = sh.params.start_window;
            h.starting_at(start.map(|(w, ms)| (w, std::time::Duration::from_millis(ms))))
        });
    // Ask for a lot per call: with MSG_TRUNC it costs nothing, and fewer
    // calls is the whole point.
    let len = (sh.params.length as usize).max(4 << 20);
    (len, hold, lowat)
}

/// A TCP receiver's low-water mark among `streams` streams of its end,
/// `window` the receive buffer granted under `-w` (`None`: autotuned).
/// [`RCV_LOWAT`] for a few streams; with hundreds the parked bytes add up
/// against the host's TCP memory limit (tcp_mem), so the mark shrinks to
/// a share of [`RCV_LOWAT_TOTAL`] (at least [`RCV_LOWAT_MIN`]); under
/// `-w`, at most [`RCV_LOWAT_HELD`] and a quarter of the buffer, so the
/// window the sender sees stays open.
fn recv_mark(streams: u32, window: Option<u64>) -> u64 {
    let per_stream = (RCV_LOWAT_TOTAL / u64::from(streams.max(1))).max(RCV_LOWAT_MIN);
    let mark = RCV_LOWAT.min(per_stream);
    match window {
        Some(granted) => mark.min(RCV_LOWAT_HELD).min(granted / 4),
        None => mark,
    }
}

/// A stream on the runner: its socket (non-blocking), counters and the
/// state of its role.
struct Work {
    sock: Arc<Sock>,
    c: Arc<Counters>,
    sh: Arc<Shared>,
    id: u32,
    done: Sender<super::Ev>,
    kind: Kind,
    /// Its end was reported on `done`.
    reported: bool,
}

enum Kind {
    /// Plain TCP: `write` from the shared pattern, or `sendfile` from the
    /// shared memory file (`-Z`).
    TcpSend {
        st: StreamSender,
        clock: SendClock,
        src: Src,
    },
    /// Plain TCP: discarded with `recv(MSG_TRUNC)`.
    TcpRecv {
        sink: fatpipe_sys::Discarder,
        len: usize,
        hold: Option<fatpipe_sys::WindowHold>,
        tick: RecvTick,
    },
    /// Paced datagrams: `sendmmsg` batches, GSO, or one per call.
    UdpSend {
        st: StreamSender,
        clock: SendClock,
        path: UdpPath,
        gso: bool,
        len: usize,
        buf: Vec<u8>,
        batch: fatpipe_sys::SendBatch,
        _grant: budget::Grant,
    },
    /// Datagrams counted for loss, order and jitter.
    UdpRecv {
        rx: UdpRx,
        recv: UdpIn,
        draining: Option<Instant>,
    },
    /// Encrypted TCP (`--encrypt`), either role.
    Tls(tls::Tls),
}

enum Src {
    Buf(payload::Payload),
    File(payload::PayloadFile),
}

/// How a UDP receiver reads.
enum UdpIn {
    /// `--no-batch`: one datagram per call.
    Plain(Vec<u8>),
    /// `recvmmsg` (with GRO where offered), slots from the budget.
    Batch {
        batch: fatpipe_sys::RecvBatch,
        _grant: budget::Grant,
    },
}

impl Work {
    fn new(stream: &Stream, sh: &Arc<Shared>, done: Sender<super::Ev>) -> io::Result<Work> {
        let p = &sh.params;
        let kind = match (&*stream.sock, stream.role) {
            (Sock::Tcp(t), role) if t.is_encrypted() => Kind::Tls(tls::Tls::new(t, role, sh)?),
            (Sock::Tcp(t), Role::Send) => {
                let s = t.tcp();
                s.set_nonblocking(true)?;
                limit_notsent(s, sh);
                let len = p.length as usize;
                // Every sender of the process sends the one shared pattern.
                let src = if p.zerocopy {
                    Src::File(payload::pattern_file(len, stream.id as usize)?)
                } else {
                    Src::Buf(payload::pattern(len))
                };
                let chunk = match &src {
                    Src::Buf(b) => b.len(),
                    Src::File(f) => f.len(),
                };
                let (st, clock) = new_sender(sh, chunk, None);
                Kind::TcpSend { st, clock, src }
            }
            (Sock::Tcp(t), Role::Recv) => {
                let s = t.tcp();
                s.set_nonblocking(true)?;
                let (len, hold, mark) = tcp_recv_setup(s, sh);
                Kind::TcpRecv {
                    sink: fatpipe_sys::Discarder::new(),
                    len,
                    hold,
                    tick: RecvTick::new(RECV_TICK, RECV_TICK_MAX, mark as usize),
                }
            }
            (Sock::Udp(u), Role::Send) => {
                u.set_nonblocking(true)?;
                let len = (p.length as usize).max(1);
                let path = udp_send_path(u, p);
                // The datagrams of one call are written in place (each
                // carries its sequence number and send time), so this
                // buffer is the stream's own: from the budget, at least
                // one datagram.
                let streams = p.total_streams() as usize;
                let burst = udp_burst(p, path);
                let grant = budget::reserve(budget::share(burst * len, len, streams), len);
                let per_call = (grant.bytes() / len).clamp(1, burst.max(1));
                let buf: Vec<u8> = (0..(per_call * len) as u64)
                    .map(|i| fatpipe_sys::pattern_byte(i % len as u64))
                    .collect();
                let plan = Datagrams {
                    bitrate: p.bitrate,
                    burst: per_call,
                    max_lag: MAX_LAG,
                };
                let (st, clock) = new_sender(sh, len, Some(plan));
                Kind::UdpSend {
                    st,
                    clock,
                    path,
                    gso: path == UdpPath::Gso,
                    len,
                    buf,
                    batch: fatpipe_sys::SendBatch::new(),
                    _grant: grant,
                }
            }
            (Sock::Udp(u), Role::Recv) => {
                u.set_nonblocking(true)?;
                // Once: choosing the path turns GRO on, a system call.
                let path = udp_recv_path(u, p);
                let recv = if path == UdpPath::Plain {
                    UdpIn::Plain(vec![0u8; MAX_UDP_PAYLOAD])
                } else {
                    // Many datagrams per call, in about 1 MiB of slots
                    // (GRO's are 64 KiB, each holding up to 64 of the
                    // sender's datagrams).
                    let slot = if path == UdpPath::Gso {
                        65_536
                    } else {
                        (p.length as usize).clamp(UDP_HEADER, 65_536)
                    };
                    let streams = p.total_streams() as usize;
                    let grant = budget::reserve(budget::share(RECV_STORAGE, slot, streams), slot);
                    let count = (grant.bytes() / slot).clamp(1, RECV_SLOTS);
                    UdpIn::Batch {
                        batch: fatpipe_sys::RecvBatch::new(count, slot),
                        _grant: grant,
                    }
                };
                Kind::UdpRecv {
                    rx: UdpRx::default(),
                    recv,
                    draining: None,
                }
            }
        };
        Ok(Work {
            sock: Arc::clone(&stream.sock),
            c: Arc::clone(&stream.counters),
            sh: Arc::clone(sh),
            id: stream.id,
            done,
            kind,
            reported: false,
        })
    }

    /// One turn of the stream's role.
    fn step(&mut self) -> io::Result<Step> {
        let sh = &*self.sh;
        let c = &*self.c;
        match (&mut self.kind, &*self.sock) {
            (Kind::Tls(k), Sock::Tcp(t)) => k.step(t, sh, c),
            (Kind::TcpSend { st, clock, src }, Sock::Tcp(t)) => {
                let s = t.tcp();
                runner::send_turn(
                    st,
                    *clock,
                    &sh.budget,
                    sh.stopped(),
                    |action| {
                        let SendAction::Write { bytes, .. } = *action else {
                            return Ok(Wrote::Took(0, 0));
                        };
                        let r = match src {
                            Src::Buf(buf) => (&*s).write(&buf[..bytes]),
                            // -Z: the kernel takes page references of the
                            // shared memory file instead of copying.
                            Src::File(f) => {
                                fatpipe_sys::sendfile(s, f.file(), &mut 0, bytes).map(|t| t.bytes)
                            }
                        };
                        match r {
                            Ok(n) => Ok(Wrote::Took(n, 0)),
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Wrote::Blocked),
                            Err(e) if is_retry(&e) => Ok(Wrote::Took(0, 0)),
                            Err(e) => Err(e),
                        }
                    },
                    |t, ns| publish_sent(c, t, ns),
                )
            }
            (
                Kind::TcpRecv {
                    sink,
                    len,
                    hold,
                    tick,
                },
                Sock::Tcp(t),
            ) => {
                let s = t.tcp();
                let mut moved = 0usize;
                for _ in 0..runner::QUANTUM_CALLS {
                    if sh.stopped() {
                        return Ok(Step::Done);
                    }
                    match sink.recv(s, *len) {
                        Ok(t) if t.bytes == 0 => return Ok(Step::Done),
                        Ok(t) => {
                            if let Some(h) = hold.as_mut() {
                                h.tick(s);
                            }
                            // One clock read for the count and the tick.
                            let now = Instant::now();
                            c.bytes.fetch_add(t.bytes as u64, Ordering::Relaxed);
                            let ns = now.saturating_duration_since(sh.start()).as_nanos();
                            c.last_ns.store(ns as u64, Ordering::Relaxed);
                            moved += t.bytes;
                            if moved >= *len {
                                break;
                            }
                            if t.bytes < *len {
                                // The queue is empty: the next read would
                                // only fail; data (past the low-water
                                // mark) or the tick wakes the stream.
                                return Ok(Step::Blocked(Some(now + tick.after(moved))));
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            // Nothing this turn (moved 0): the tick backs off.
                            let wait = tick.after(moved);
                            return Ok(Step::Blocked(Some(Instant::now() + wait)));
                        }
                        Err(e) if is_retry(&e) => {}
                        Err(e) => return Err(e),
                    }
                }
                tick.after(moved);
                Ok(Step::Again)
            }
            (
                Kind::UdpSend {
                    st,
                    clock,
                    path,
                    gso,
                    len,
                    buf,
                    batch,
                    ..
                },
                Sock::Udp(s),
            ) => {
                let (path, len) = (*path, *len);
                runner::send_turn(
                    st,
                    *clock,
                    &sh.budget,
                    sh.stopped(),
                    |action| {
                        let SendAction::Write {
                            datagrams: n,
                            first_seq: seq,
                            ..
                        } = *action
                        else {
                            return Ok(Wrote::Took(0, 0));
                        };
                        udp_write(s, sh, path, gso, len, buf, batch, n, seq)
                    },
                    |t, ns| publish_sent(c, t, ns),
                )
            }
            (Kind::UdpRecv { rx, recv, draining }, Sock::Udp(s)) => {
                if sh.stopped() {
                    return Ok(Step::Done);
                }
                if draining.is_none() && sh.udp_recv_stop.load(Ordering::Relaxed) {
                    // Count what is already queued, then stop.
                    *draining = Some(Instant::now() + DRAIN_LIMIT);
                }
                let mut step = Step::Again;
                for _ in 0..runner::QUANTUM_CALLS {
                    let got = match recv {
                        UdpIn::Plain(buf) => s.recv(buf).map(|n| {
                            rx.datagram(&buf[..n], sh.now_ns());
                        }),
                        UdpIn::Batch { batch, .. } => batch.recv(s.as_fd()).map(|_| {
                            let now = sh.now_ns();
                            for i in 0..batch.len() {
                                for d in batch.segments(i) {
                                    rx.datagram(d, now);
                                }
                            }
                        }),
                    };
                    match got {
                        Ok(()) => {}
                        Err(_) if draining.is_some() => {
                            step = Step::Done;
                            break;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            step = Step::Blocked(None);
                            break;
                        }
                        Err(e) if is_retry(&e) || e.kind() == io::ErrorKind::ConnectionRefused => {}
                        Err(e) => return Err(e),
                    }
                    if draining.is_some_and(|d| Instant::now() >= d) {
                        step = Step::Done;
                        break;
                    }
                }
                // One publication per turn, not per datagram: at millions
                // of datagrams a second the shared counters' cache line
                // would otherwise bounce to the sampler's core on every one.
                rx.publish(c, sh.now_ns());
                Ok(step)
            }
            _ => Ok(Step::Done),
        }
    }
}

impl runner::Task for Work {
    fn fd(&self) -> RawFd {
        match &*self.sock {
            Sock::Tcp(t) => t.tcp().as_raw_fd(),
            Sock::Udp(u) => u.as_raw_fd(),
        }
    }

    fn wants(&self) -> runner::Wants {
        match self.kind {
            Kind::TcpSend { .. } | Kind::UdpSend { .. } => runner::Wants::Write,
            Kind::TcpRecv { .. } | Kind::UdpRecv { .. } => runner::Wants::Read,
            Kind::Tls(ref k) => k.wants(),
        }
    }

    fn turn(&mut self) -> Step {
        let result = match self.step() {
            Ok(Step::Done) => Ok(()),
            Ok(step) => return step,
            Err(e) => Err(e),
        };
        if let (Kind::TcpSend { .. }, Sock::Tcp(t)) = (&self.kind, &*self.sock) {
            // The receiver's end of file marks the end of this stream.
            let _ = t.shutdown(Shutdown::Write);
        }
        // Errors after a stop are the stop's doing (sockets shut down).
        let err = match result {
            Err(e) if !self.sh.stopped() => Some(format!("stream {}: {e}", self.id)),
            _ => None,
        };
        let _ = self.done.send(super::Ev::Done(self.id, err));
        self.reported = true;
        Step::Done
    }
}

impl Drop for Work {
    /// A stream dropped without reporting its end (its turn panicked)
    /// still ends, with an error, so that its session does not wait for it.
    fn drop(&mut self) {
        if !self.reported {
            let err = format!("stream {}: internal error in the data plane", self.id);
            let _ = self.done.send(super::Ev::Done(self.id, Some(err)));
        }
    }
}

/// One call of a UDP sender: `n` datagrams numbered from `seq`, stamped
/// with the send time.
#[allow(clippy::too_many_arguments)]
fn udp_write(
    s: &UdpSocket,
    sh: &Shared,
    path: UdpPath,
    gso: &mut bool,
    len: usize,
    buf: &mut [u8],
    batch: &mut fatpipe_sys::SendBatch,
    n: usize,
    seq: u64,
) -> io::Result<Wrote> {
    let now_ns = sh.now_ns();
    for (k, d) in buf.chunks_mut(len).take(n).enumerate() {
        d[..8].copy_from_slice(&seq.wrapping_add(k as u64).to_be_bytes());
        d[8..16].copy_from_slice(&now_ns.to_be_bytes());
    }
    let sent = if path == UdpPath::Plain {
        // --no-batch: one datagram, one system call.
        s.send(&buf[..len]).map(|bytes| fatpipe_sys::Batch {
            datagrams: 1,
            bytes,
            path: fatpipe_sys::IoPath::Copy,
        })
    } else if *gso {
        fatpipe_sys::send_gso(s.as_fd(), &buf[..n * len], len)
    } else {
        let packets: Vec<&[u8]> = buf[..n * len].chunks(len).collect();
        batch.send(s.as_fd(), &packets)
    };
    match sent {
        Ok(sent) => Ok(Wrote::Took(sent.bytes, sent.datagrams)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Wrote::Blocked),
        // A full queue (ENOBUFS) or a refused port costs these datagrams'
        // time, not the test: they were never sent, so they count neither
        // as sent nor as lost, and the pacer forgives them if the sender
        // stays behind.
        Err(e)
            if is_retry(&e)
                || fatpipe_sys::udp::is_no_buffer_space(&e)
                || e.kind() == io::ErrorKind::ConnectionRefused =>
        {
            Ok(Wrote::Backoff(Duration::from_micros(50)))
        }
        // GSO refused for this size (e.g. datagrams above the MTU):
        // batches of plain datagrams from now on.
        Err(_) if *gso => {
            *gso = false;
            Ok(Wrote::Backoff(Duration::ZERO))
        }
        Err(e) => Err(e),
    }
}

/// How a UDP stream moves datagrams at one end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UdpPath {
    /// One datagram per system call (`--no-batch`).
    Plain,
    /// `sendmmsg`/`recvmmsg` batches.
    Mmsg,
    /// UDP GSO on send, GRO on receive (batched with `recvmmsg`).
    Gso,
}

/// The send path a UDP stream takes: GSO where the kernel offers it and
/// two datagrams fit one send, else `sendmmsg` batches.
pub(crate) fn udp_send_path(s: &UdpSocket, p: &TestParams) -> UdpPath {
    if p.no_batch {
        UdpPath::Plain
    } else if p.length as usize * 2 <= MAX_UDP_PAYLOAD && fatpipe_sys::gso_supported(s) {
        UdpPath::Gso
    } else {
        UdpPath::Mmsg
    }
}

/// The receive path a UDP stream takes; turns GRO on where offered (the
/// call is idempotent, so the setup report and the worker agree).
pub(crate) fn udp_recv_path(s: &UdpSocket, p: &TestParams) -> UdpPath {
    if p.no_batch {
        UdpPath::Plain
    } else if fatpipe_sys::set_gro(s, true).is_ok() {
        UdpPath::Gso
    } else {
        UdpPath::Mmsg
    }
}

/// Most datagrams one send call carries: the pacer's burst. One GSO send
/// of up to 64 KiB (at most 64 segments), a `sendmmsg` batch of as many
/// (32 for datagrams above 32 KiB), or one with `--no-batch`.
pub(crate) fn udp_burst(p: &TestParams, path: UdpPath) -> usize {
    let len = (p.length as usize).max(1);
    match path {
        UdpPath::Plain => 1,
        _ if len <= MAX_UDP_PAYLOAD / 2 => {
            (MAX_UDP_PAYLOAD / len).min(fatpipe_sys::UDP_MAX_GSO_SEGMENTS)
        }
        _ => 32,
    }
}

/// The receive buffer a UDP receiver asks for when `-w` gives none: the
/// kernel's default (about 208 KiB) holds only a few hundred small
/// datagrams, a fraction of a millisecond at millions a second. Forced
/// past `net.core.rmem_max` where the process may; capped quietly where
/// it may not (the granted size is in the test's start record).
pub(crate) const UDP_RCVBUF: u64 = 16 << 20;

/// What all UDP receivers of one end ask for together, so that hundreds
/// of streams do not ask for gigabytes.
const UDP_RCVBUF_TOTAL: u64 = 64 << 20;

/// Gives a UDP receiver its default large receive buffer (no `-w`).
pub(crate) fn configure_udp_receiver(s: &UdpSocket, p: &TestParams) {
    if p.window.is_none() {
        let per_stream =
            (UDP_RCVBUF_TOTAL / u64::from(p.total_streams().max(1))).clamp(1 << 20, UDP_RCVBUF);
        let _ = fatpipe_sys::set_recv_buffer(s, per_stream, true);
    }
}

/// A UDP receiver's accounting (`dataplane::udp`, wrap-safe) and its
/// publication to the sampler.
#[derive(Debug, Default)]
struct UdpRx {
    rx: UdpReceiver,
}

impl UdpRx {
    fn datagram(&mut self, d: &[u8], now_ns: u64) {
        if !d.starts_with(UDP_HELLO) {
            self.rx.handle_datagram(d, now_ns);
        }
    }

    /// Publishes the running totals (this worker is the counters' only
    /// writer, so plain stores of totals do).
    fn publish(&self, c: &Counters, now_ns: u64) {
        let t = self.rx.totals();
        if t.packets == c.packets.load(Ordering::Relaxed) {
            return;
        }
        c.packets.store(t.packets, Ordering::Relaxed);
        c.bytes.store(t.bytes, Ordering::Relaxed);
        c.expected.store(t.expected, Ordering::Relaxed);
        c.out_of_order.store(t.out_of_order, Ordering::Relaxed);
        c.jitter_bits
            .store(t.jitter_us.to_bits(), Ordering::Relaxed);
        c.last_ns.store(now_ns, Ordering::Relaxed);
    }
}

/// Sets `SO_RCVLOWAT`.
fn set_rcvlowat(s: &TcpStream, bytes: u64) -> io::Result<()> {
    fatpipe_sys::set_recv_lowat(s, bytes)
}

fn is_retry(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// A point-in-time copy of one stream's counters and TCP state.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Snapshot {
    bytes: u64,
    packets: u64,
    expected: u64,
    out_of_order: u64,
    retransmits: u64,
    last_ns: u64,
}

impl Snapshot {
    /// Bytes moved so far.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// Reads a stream's counters.
pub(crate) fn snapshot(s: &Stream) -> Snapshot {
    let c = &s.counters;
    let retransmits = match &*s.sock {
        Sock::Tcp(t) if s.role == Role::Send => fatpipe_sys::tcp_info(t.tcp())
            .ok()
            .and_then(|i| i.total_retrans)
            .map_or(0, u64::from),
        _ => 0,
    };
    Snapshot {
        bytes: c.bytes.load(Ordering::Relaxed),
        packets: c.packets.load(Ordering::Relaxed),
        expected: c.expected.load(Ordering::Relaxed),
        out_of_order: c.out_of_order.load(Ordering::Relaxed),
        retransmits,
        last_ns: c.last_ns.load(Ordering::Relaxed),
    }
}

/// Bytes of this stream the far end has demonstrably received: a
/// receiver's own count, a TCP sender's acknowledged bytes (not what sits
/// in its send buffer), a UDP sender's sent bytes (nothing better is known
/// here).
pub(crate) fn delivered(s: &Stream) -> u64 {
    let counted = s.counters.bytes.load(Ordering::Relaxed);
    match &*s.sock {
        Sock::Tcp(t) if s.role == Role::Send => fatpipe_sys::tcp_info(t.tcp())
            .ok()
            .and_then(|i| i.bytes_acked)
            .unwrap_or(counted),
        _ => counted,
    }
}

/// The sample between two snapshots, plus the stream's current RTT, cwnd
/// and jitter. `base_ns` is the time the period started (for `elapsed_us`).
pub(crate) fn sample(s: &Stream, from: &Snapshot, to: &Snapshot, base_ns: u64) -> StreamSample {
    let mut out = StreamSample {
        id: s.id,
        role: Some(s.role),
        bytes: to.bytes.saturating_sub(from.bytes),
        packets: to.packets.saturating_sub(from.packets),
        out_of_order: to.out_of_order.saturating_sub(from.out_of_order),
        retransmits: to.retransmits.saturating_sub(from.retransmits),
        elapsed_us: to.last_ns.saturating_sub(base_ns) / 1000,
        ..Default::default()
    };
    if s.role == Role::Recv {
        let expected = to.expected.saturating_sub(from.expected);
        out.lost = expected.saturating_sub(out.packets);
        out.jitter_us = f64::from_bits(s.counters.jitter_bits.load(Ordering::Relaxed));
    }
    if let Sock::Tcp(t) = &*s.sock {
        if let Ok(info) = fatpipe_sys::tcp_info(t.tcp()) {
            out.rtt_us = info.rtt_us.unwrap_or(0);
            out.rttvar_us = info.rttvar_us.unwrap_or(0);
            out.cwnd = info.cwnd_bytes().unwrap_or(0);
        }
    }
    out
}

/// Applies the test's socket options to a TCP socket (before connect on
/// the client, after accept on the server) and returns warnings for what
/// the host refused or capped.
pub(crate) fn configure_tcp(fd: impl AsFd, p: &TestParams, role: Role, warnings: &mut Vec<String>) {
    configure_buffers(&fd, p, warnings);
    if let Some(mss) = p.mss {
        if let Err(e) = fatpipe_sys::set_mss(&fd, mss) {
            warnings.push(format!("MSS {mss}: {e}"));
        }
    }
    if role == Role::Send {
        if let Some(cc) = &p.congestion {
            if let Err(e) = fatpipe_sys::set_congestion(&fd, cc) {
                warnings.push(format!(
                    "congestion control '{cc}' unavailable ({e}); using the host default"
                ));
            }
        }
        if let Some(rate) = p.fq_rate {
            if let Err(e) = fatpipe_sys::set_max_pacing_rate(&fd, rate / 8) {
                warnings.push(format!(
                    "pacing at {}: {e}",
                    units::format_rate(rate as f64)
                ));
            }
        }
    }
}

/// Applies `-w` to any socket.
pub(crate) fn configure_buffers(fd: &impl AsFd, p: &TestParams, warnings: &mut Vec<String>) {
    let Some(w) = p.window else { return };
    for (send, what, sysctl) in [
        (true, "send", "net.core.wmem_max"),
        (false, "receive", "net.core.rmem_max"),
    ] {
        let grant = if send {
            fatpipe_sys::set_send_buffer(fd, w, p.force_buffers)
        } else {
            fatpipe_sys::set_recv_buffer(fd, w, p.force_buffers)
        };
        match grant {
            Ok(g) if g.forced && g.capped => warnings.push(format!(
                "{what} buffer forced past {sysctl} but still capped at {} of the {} asked",
                units::format_bytes_iec(g.granted),
                units::format_bytes_iec(w)
            )),
            Ok(g) if g.capped => warnings.push(format!(
                "{what} buffer capped at {} of the {} asked ({sysctl}); see `fatpipe tune`",
                units::format_bytes_iec(g.granted),
                units::format_bytes_iec(w)
            )),
            Ok(_) => {}
            Err(e) => warnings.push(format!("{what} buffer {}: {e}", units::format_bytes_iec(w))),
        }
    }
}

/// What a socket actually got, read back after connect/accept.
pub(crate) fn setup_of(id: u32, sock: &Sock, role: Role, p: &TestParams) -> SocketSetup {
    let (sndbuf, rcvbuf, mss, congestion) = match sock {
        Sock::Tcp(t) => (
            fatpipe_sys::get_send_buffer(t.tcp()).unwrap_or(0),
            fatpipe_sys::get_recv_buffer(t.tcp()).unwrap_or(0),
            fatpipe_sys::get_mss(t.tcp()).unwrap_or(0),
            fatpipe_sys::get_congestion(t.tcp()).unwrap_or_default(),
        ),
        Sock::Udp(u) => (
            fatpipe_sys::get_send_buffer(u).unwrap_or(0),
            fatpipe_sys::get_recv_buffer(u).unwrap_or(0),
            0,
            String::new(),
        ),
    };
    // A UDP stream reports the path of its role at this end; the other
    // column names what the same socket would take the other way.
    let (send_path, recv_path) = match (sock, p.zerocopy) {
        // TLS (`--encrypt`): written and read through the record layer.
        (Sock::Tcp(t), _) if t.is_encrypted() => ("tls", "tls"),
        (Sock::Tcp(_), true) => ("sendfile", "recv_trunc"),
        (Sock::Tcp(_), false) => ("copy", "recv_trunc"),
        (Sock::Udp(u), _) => {
            let send = match udp_send_path(u, p) {
                UdpPath::Plain => "plain",
                UdpPath::Mmsg => "mmsg",
                UdpPath::Gso => "gso",
            };
            let recv = if role == Role::Recv {
                match udp_recv_path(u, p) {
                    UdpPath::Plain => "plain",
                    UdpPath::Mmsg => "mmsg",
                    UdpPath::Gso => "gro",
                }
            } else if p.no_batch {
                "plain"
            } else {
                "mmsg"
            };
            (send, recv)
        }
    };
    SocketSetup {
        id,
        sndbuf,
        rcvbuf,
        mss,
        congestion,
        send_path: send_path.into(),
        recv_path: recv_path.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn datagram(seq: u64, sent_ns: u64) -> Vec<u8> {
        let mut d = vec![0u8; 100];
        d[..8].copy_from_slice(&seq.to_be_bytes());
        d[8..16].copy_from_slice(&sent_ns.to_be_bytes());
        d
    }

    #[test]
    fn udp_loss_order_and_jitter() {
        let c = Counters::default();
        let mut rx = UdpRx::default();
        // 0, 1, 3, 2 (late), 5: one lost (4), one out of order.
        for (seq, at) in [(0, 0), (1, 1000), (3, 3000), (2, 3500), (5, 5000)] {
            rx.datagram(&datagram(seq, seq * 1000), at * 1000 + 7_000_000);
        }
        assert_eq!(c.packets.load(Ordering::Relaxed), 0, "not yet published");
        rx.publish(&c, 12_000_000);
        assert_eq!(c.last_ns.load(Ordering::Relaxed), 12_000_000);
        assert_eq!(c.packets.load(Ordering::Relaxed), 5);
        assert_eq!(c.expected.load(Ordering::Relaxed), 6);
        assert_eq!(c.out_of_order.load(Ordering::Relaxed), 1);
        // Transit grows by 0.999 ms per ms of sending; the late packet adds
        // a 1.5 ms excursion; jitter is positive but far below it.
        let j = f64::from_bits(c.jitter_bits.load(Ordering::Relaxed));
        assert!(j > 0.0 && j < 1500.0, "{j}");
        // Hellos and runts are not data.
        let mut hello = datagram(9, 0);
        hello[..4].copy_from_slice(UDP_HELLO);
        rx.datagram(&hello, 0);
        rx.datagram(&[1, 2, 3], 0);
        rx.publish(&c, 13_000_000);
        assert_eq!(c.last_ns.load(Ordering::Relaxed), 12_000_000, "nothing new");
        assert_eq!(c.packets.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn the_receive_mark_is_half_a_megabyte_for_a_few_streams_a_share_for_many() {
        let mib = 1u64 << 20;
        // (streams, -w buffer granted, mark)
        let table = [
            (1, None, mib / 2),
            (0, None, mib / 2), // no stream counted: one
            (64, None, mib / 2),
            (128, None, 256 << 10),
            (1024, None, 32 << 10),
            (4096, None, RCV_LOWAT_MIN),
            (1, Some(8 * mib), 256 << 10), // -w: as before
            (1, Some(mib), 256 << 10),
            (1, Some(mib / 2), 128 << 10),
            (1024, Some(mib), 32 << 10),
        ];
        for (streams, window, mark) in table {
            assert_eq!(recv_mark(streams, window), mark, "{streams} {window:?}");
        }
    }

    #[test]
    fn issue_34_a_sequence_number_of_u64_max_is_late_not_a_panic() {
        // It overflowed `seq + 1` (a panic with overflow checks, the
        // expected count running backwards without).
        let c = Counters::default();
        let mut rx = UdpRx::default();
        for seq in [0, 1, u64::MAX, 2] {
            rx.datagram(&datagram(seq, 0), 0);
        }
        rx.publish(&c, 1);
        assert_eq!(c.packets.load(Ordering::Relaxed), 4);
        assert_eq!(c.expected.load(Ordering::Relaxed), 3);
        assert_eq!(c.out_of_order.load(Ordering::Relaxed), 1);
    }
}
