//! The data plane of an iperf3 test, either end: every stream a task of
//! the engine's runner (`fatpipe_engine::dataplane::runner`, one I/O
//! thread per core for every stream of the process), no thread per stream.
//!
//! TCP streams carry raw payload with no framing; UDP datagrams start with
//! iperf3's header (send time as seconds and microseconds, then a sequence
//! number of 32 or 64 bits, all big-endian) and receivers count loss,
//! reordering and RFC 3550 jitter from it. Workers publish counters in
//! atomics that the session thread samples once per interval. Sockets are
//! non-blocking; a stop flag is set with `Shared::stop_sending` or
//! `stop_receiving`, which wake the runner so that every stream sees it.
//!
//! TCP senders write (or, `-Z`, `sendfile`) the process's one shared
//! pattern (`fatpipe_engine::dataplane::payload`), so a peer's streams ×
//! block length do not decide the server's memory.

use std::io::{self, Write};
use std::net::{TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use fatpipe_engine::dataplane::payload;
use fatpipe_engine::dataplane::runner::{self, Step};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How often a blocked worker looks at its stop flag.
pub const POLL: Duration = Duration::from_millis(200);

/// What one stream's worker has moved so far.
#[derive(Debug, Default)]
pub struct Counters {
    /// Payload bytes sent or received.
    pub bytes: AtomicU64,
    /// UDP datagrams sent or received.
    pub packets: AtomicU64,
    /// UDP receiver: the highest sequence number seen.
    pub max_seq: AtomicU64,
    /// UDP receiver: datagrams that came after a later one.
    pub out_of_order: AtomicU64,
    /// UDP receiver: jitter in seconds, as `f64` bits.
    pub jitter_bits: AtomicU64,
    /// The worker stopped on an error (its text), if it did.
    pub failed: std::sync::Mutex<Option<String>>,
}

/// A snapshot of [`Counters`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Snapshot {
    /// Bytes.
    pub bytes: u64,
    /// Datagrams.
    pub packets: u64,
    /// Highest sequence number.
    pub max_seq: u64,
    /// Out of order.
    pub out_of_order: u64,
    /// Jitter, seconds.
    pub jitter: f64,
}

impl Snapshot {
    /// Datagrams lost: sequence numbers never seen (a late one that comes
    /// after its gap was counted takes itself off again, as in iperf3).
    pub fn lost(&self) -> u64 {
        self.max_seq.saturating_sub(self.packets)
    }
}

impl Counters {
    /// Reads every counter.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            bytes: self.bytes.load(Ordering::Relaxed),
            packets: self.packets.load(Ordering::Relaxed),
            max_seq: self.max_seq.load(Ordering::Relaxed),
            out_of_order: self.out_of_order.load(Ordering::Relaxed),
            jitter: f64::from_bits(self.jitter_bits.load(Ordering::Relaxed)),
        }
    }

    fn fail(&self, what: String) {
        if let Ok(mut f) = self.failed.lock() {
            f.get_or_insert(what);
        }
    }

    /// The error the worker stopped on, if any.
    pub fn failure(&self) -> Option<String> {
        self.failed.lock().ok().and_then(|f| f.clone())
    }
}

/// What the workers of one test share.
#[derive(Debug, Default)]
pub struct Shared {
    /// Senders stop.
    pub stop_send: AtomicBool,
    /// Receivers stop.
    pub stop_recv: AtomicBool,
    /// Bytes left to send in all with `-n`.
    pub budget: Option<AtomicU64>,
}

impl Shared {
    /// Workers for a test that sends `budget` bytes in all, if given.
    pub fn new(budget: Option<u64>) -> Arc<Shared> {
        Arc::new(Shared {
            budget: budget.map(AtomicU64::new),
            ..Shared::default()
        })
    }

    /// Takes a block of `want` bytes from the budget, whole as iperf3's
    /// senders do (the last may go past the budget); 0 once it is spent.
    fn take(&self, want: usize) -> usize {
        let Some(b) = &self.budget else {
            return want;
        };
        let mut left = b.load(Ordering::Relaxed);
        loop {
            if left == 0 {
                return 0;
            }
            let after = left.saturating_sub(want as u64);
            match b.compare_exchange_weak(left, after, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return want,
                Err(now) => left = now,
            }
        }
    }

    /// Senders stop (and the runner gives them a turn to see it).
    pub fn stop_sending(&self) {
        self.stop_send.store(true, Ordering::Relaxed);
        runner::wake_all();
    }

    /// Receivers stop (and the runner gives them a turn to see it).
    pub fn stop_receiving(&self) {
        self.stop_recv.store(true, Ordering::Relaxed);
        runner::wake_all();
    }

    fn sending(&self) -> bool {
        !self.stop_send.load(Ordering::Relaxed)
    }

    fn receiving(&self) -> bool {
        !self.stop_recv.load(Ordering::Relaxed)
    }
}

/// One stream of an iperf3 test, a task of the engine's data-plane
/// runner (`fatpipe_engine::dataplane::runner`) over a non-blocking
/// socket: no thread of its own.
pub struct Flow {
    kind: FlowKind,
    shared: Arc<Shared>,
    c: Arc<Counters>,
}

enum FlowKind {
    /// Whole `len`-byte blocks from the budget, written from the shared
    /// pattern (or `sendfile`d from the shared memory file).
    TcpSend {
        sock: TcpStream,
        buf: payload::Payload,
        file: Option<payload::PayloadFile>,
        len: usize,
        /// The block in progress: its size and what went of it.
        want: usize,
        done: usize,
    },
    /// Discarded (`recv(MSG_TRUNC)` where it works).
    TcpRecv {
        sock: TcpStream,
        sink: fatpipe_sys::Discarder,
    },
    /// Datagrams with iperf3's header at `rate` bit/s (0: unpaced).
    UdpSend {
        sock: UdpSocket,
        buf: Vec<u8>,
        len: usize,
        rate: u64,
        wide: bool,
        start: Instant,
        seq: u64,
        sent_bits: f64,
    },
    /// Loss, reordering and jitter.
    UdpRecv {
        sock: UdpSocket,
        buf: Vec<u8>,
        wide: bool,
        max_seq: u64,
        prev_transit: Option<f64>,
        jitter: f64,
    },
}

impl Flow {
    /// Sends `len`-byte writes on `sock` until told to stop or the budget
    /// is spent; with `zerocopy`, `sendfile`s them from a memory file.
    pub fn tcp_send(
        sock: TcpStream,
        len: usize,
        zerocopy: bool,
        shared: &Arc<Shared>,
        c: &Arc<Counters>,
    ) -> io::Result<Flow> {
        sock.set_nonblocking(true)?;
        // The process's one shared pattern (engine::dataplane::payload),
        // not a buffer or memory file of the peer-chosen length per
        // stream; a length past its cap (16 MiB) writes blocks of the cap.
        let buf = payload::pattern(len);
        let len = buf.len();
        let file = if zerocopy {
            static STRIPE: AtomicUsize = AtomicUsize::new(0);
            let stripe = STRIPE.fetch_add(1, Ordering::Relaxed);
            let f = payload::pattern_file(len, stripe)
                .map_err(|e| io::Error::new(e.kind(), format!("zero-copy source: {e}")))?;
            Some(f)
        } else {
            None
        };
        Ok(Flow::new(
            FlowKind::TcpSend {
                sock,
                buf,
                file,
                len,
                want: 0,
                done: 0,
            },
            shared,
            c,
        ))
    }

    /// Receives and discards until told to stop or the peer closes; the
    /// kernel drops the data without copying it out where it can
    /// (`recv(MSG_TRUNC)`, `fatpipe_sys::Discarder`).
    pub fn tcp_recv(sock: TcpStream, shared: &Arc<Shared>, c: &Arc<Counters>) -> io::Result<Flow> {
        sock.set_nonblocking(true)?;
        let sink = fatpipe_sys::Discarder::new();
        Ok(Flow::new(FlowKind::TcpRecv { sock, sink }, shared, c))
    }

    /// Sends `len`-byte datagrams at `rate` bit/s (0: as fast as
    /// possible) with iperf3's header, 64-bit sequence numbers if `wide`.
    pub fn udp_send(
        sock: UdpSocket,
        len: usize,
        rate: u64,
        wide: bool,
        shared: &Arc<Shared>,
        c: &Arc<Counters>,
    ) -> io::Result<Flow> {
        sock.set_nonblocking(true)?;
        // Its own: every datagram's header is written in place (one
        // datagram).
        let buf = datagram(len.max(UDP_HEADER_WIDE));
        let kind = FlowKind::UdpSend {
            sock,
            buf,
            len,
            rate,
            wide,
            start: Instant::now(),
            seq: 0,
            sent_bits: 0.0,
        };
        Ok(Flow::new(kind, shared, c))
    }

    /// Receives datagrams, counting loss, reordering and jitter.
    pub fn udp_recv(
        sock: UdpSocket,
        wide: bool,
        shared: &Arc<Shared>,
        c: &Arc<Counters>,
    ) -> io::Result<Flow> {
        sock.set_nonblocking(true)?;
        let kind = FlowKind::UdpRecv {
            sock,
            buf: vec![0u8; 65_536],
            wide,
            max_seq: 0,
            prev_transit: None,
            jitter: 0.0,
        };
        Ok(Flow::new(kind, shared, c))
    }

    fn new(kind: FlowKind, shared: &Arc<Shared>, c: &Arc<Counters>) -> Flow {
        Flow {
            kind,
            shared: Arc::clone(shared),
            c: Arc::clone(c),
        }
    }

    /// One turn: at most a quantum of calls.
    fn step(&mut self) -> Step {
        let (shared, c) = (&*self.shared, &*self.c);
        for _ in 0..runner::QUANTUM_CALLS {
            match &mut self.kind {
                FlowKind::TcpSend {
                    sock,
                    buf,
                    file,
                    len,
                    want,
                    done,
                } => {
                    if !shared.sending() {
                        return Step::Done;
                    }
                    if *done >= *want {
                        *want = shared.take(*len);
                        *done = 0;
                        if *want == 0 {
                            return Step::Done;
                        }
                    }
                    let ask = *want - *done;
                    let r = match file {
                        Some(f) => {
                            let mut off = *done as u64;
                            fatpipe_sys::sendfile(&*sock, f.file(), &mut off, ask).map(|t| t.bytes)
                        }
                        None => (&*sock).write(&buf[*done..*want]),
                    };
                    match r {
                        Ok(0) => {
                            c.fail("the peer closed the stream".into());
                            return Step::Done;
                        }
                        Ok(n) => {
                            *done += n;
                            c.bytes.fetch_add(n as u64, Ordering::Relaxed);
                            if n < ask {
                                // The socket is full; it says when it has room.
                                return Step::Blocked(None);
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            return Step::Blocked(None)
                        }
                        Err(e) if is_retry(&e) => {}
                        Err(e) => {
                            if shared.sending() {
                                c.fail(format!("send: {e}"));
                            }
                            return Step::Done;
                        }
                    }
                }
                FlowKind::TcpRecv { sock, sink } => {
                    if !shared.receiving() {
                        return Step::Done;
                    }
                    const ASK: usize = 4 << 20;
                    match sink.recv(&*sock, ASK) {
                        Ok(t) if t.bytes == 0 => return Step::Done,
                        Ok(t) => {
                            c.bytes.fetch_add(t.bytes as u64, Ordering::Relaxed);
                            if t.bytes < ASK {
                                // The queue is empty; data wakes it.
                                return Step::Blocked(None);
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            return Step::Blocked(None)
                        }
                        Err(e) if is_retry(&e) => {}
                        Err(e) => {
                            if shared.receiving() {
                                c.fail(format!("receive: {e}"));
                            }
                            return Step::Done;
                        }
                    }
                }
                FlowKind::UdpSend {
                    sock,
                    buf,
                    len,
                    rate,
                    wide,
                    start,
                    seq,
                    sent_bits,
                } => {
                    if !shared.sending() {
                        return Step::Done;
                    }
                    if *rate > 0 {
                        let allowed = *rate as f64 * start.elapsed().as_secs_f64();
                        if *sent_bits >= allowed {
                            let wait = (*sent_bits - allowed) / *rate as f64;
                            return Step::Sleep(
                                Instant::now() + Duration::from_secs_f64(wait.min(0.005)),
                            );
                        }
                    }
                    let n = shared.take(*len);
                    if n == 0 {
                        return Step::Done;
                    }
                    *seq += 1;
                    write_header(buf, *seq, *wide);
                    match sock.send(&buf[..*len]) {
                        Ok(sent) => {
                            c.bytes.fetch_add(sent as u64, Ordering::Relaxed);
                            c.packets.fetch_add(1, Ordering::Relaxed);
                            *sent_bits += (*len * 8) as f64;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            *seq -= 1;
                            return Step::Blocked(None);
                        }
                        Err(e) if is_retry(&e) || fatpipe_sys::udp::is_no_buffer_space(&e) => {
                            // A full device queue says nothing when it
                            // drains: a short breath.
                            *seq -= 1;
                            return Step::Sleep(Instant::now() + Duration::from_micros(50));
                        }
                        Err(e) => {
                            // The peer's socket is gone once its test ended.
                            if shared.sending() && e.kind() != io::ErrorKind::ConnectionRefused {
                                c.fail(format!("send: {e}"));
                            }
                            return Step::Done;
                        }
                    }
                }
                FlowKind::UdpRecv {
                    sock,
                    buf,
                    wide,
                    max_seq,
                    prev_transit,
                    jitter,
                } => {
                    if !shared.receiving() {
                        return Step::Done;
                    }
                    let n = match sock.recv(buf) {
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            return Step::Blocked(None)
                        }
                        Err(e) if is_retry(&e) || e.kind() == io::ErrorKind::ConnectionRefused => {
                            continue
                        }
                        Err(e) => {
                            if shared.receiving() {
                                c.fail(format!("receive: {e}"));
                            }
                            return Step::Done;
                        }
                    };
                    let Some((sent, seq)) = read_header(&buf[..n], *wide) else {
                        continue;
                    };
                    c.bytes.fetch_add(n as u64, Ordering::Relaxed);
                    c.packets.fetch_add(1, Ordering::Relaxed);
                    if seq > *max_seq {
                        *max_seq = seq;
                        c.max_seq.store(seq, Ordering::Relaxed);
                    } else {
                        c.out_of_order.fetch_add(1, Ordering::Relaxed);
                    }
                    let transit = wall_secs() - sent;
                    if let Some(prev) = *prev_transit {
                        *jitter += ((transit - prev).abs() - *jitter) / 16.0;
                        c.jitter_bits.store(jitter.to_bits(), Ordering::Relaxed);
                    }
                    *prev_transit = Some(transit);
                }
            }
        }
        Step::Again
    }
}

impl runner::Task for Flow {
    fn fd(&self) -> RawFd {
        match &self.kind {
            FlowKind::TcpSend { sock, .. } | FlowKind::TcpRecv { sock, .. } => sock.as_raw_fd(),
            FlowKind::UdpSend { sock, .. } | FlowKind::UdpRecv { sock, .. } => sock.as_raw_fd(),
        }
    }

    fn wants(&self) -> runner::Wants {
        match self.kind {
            FlowKind::TcpSend { .. } | FlowKind::UdpSend { .. } => runner::Wants::Write,
            FlowKind::TcpRecv { .. } | FlowKind::UdpRecv { .. } => runner::Wants::Read,
        }
    }

    fn turn(&mut self) -> Step {
        self.step()
    }
}

/// Bytes of the UDP header with a 32-bit sequence number.
pub const UDP_HEADER: usize = 12;
/// Bytes of the UDP header with a 64-bit sequence number.
pub const UDP_HEADER_WIDE: usize = 16;

/// Writes the send time and `seq` at the start of `buf`.
fn write_header(buf: &mut [u8], seq: u64, wide: bool) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    buf[0..4].copy_from_slice(&(now.as_secs() as u32).to_be_bytes());
    buf[4..8].copy_from_slice(&now.subsec_micros().to_be_bytes());
    if wide {
        buf[8..16].copy_from_slice(&seq.to_be_bytes());
    } else {
        buf[8..12].copy_from_slice(&(seq as u32).to_be_bytes());
    }
}

/// The send time (seconds) and sequence number of a datagram, if it is
/// long enough to hold them.
pub fn read_header(d: &[u8], wide: bool) -> Option<(f64, u64)> {
    let word = |i: usize| -> Option<u32> {
        let b = d.get(i..i + 4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    let sec = word(0)?;
    let usec = word(4)?;
    let seq = if wide {
        (u64::from(word(8)?) << 32) | u64::from(word(12)?)
    } else {
        u64::from(word(8)?)
    };
    Some((f64::from(sec) + f64::from(usec) / 1e6, seq))
}

fn wall_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// A datagram buffer of the repeating pattern (iperf3 sends whatever is in
/// its buffer; the pattern makes misplaced data easy to see in a capture).
fn datagram(len: usize) -> Vec<u8> {
    (0..len as u64).map(fatpipe_sys::pattern_byte).collect()
}

fn is_retry(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_header_round_trips_both_widths() {
        let mut buf = vec![0u8; 64];
        write_header(&mut buf, 7, false);
        let (t, seq) = read_header(&buf, false).unwrap();
        assert_eq!(seq, 7);
        assert!((wall_secs() - t).abs() < 5.0);
        write_header(&mut buf, (1 << 40) + 3, true);
        assert_eq!(read_header(&buf, true).unwrap().1, (1 << 40) + 3);
        assert!(read_header(&buf[..11], false).is_none());
    }

    #[test]
    fn loss_is_gaps_less_late_arrivals() {
        let s = Snapshot {
            packets: 8,
            max_seq: 10,
            ..Snapshot::default()
        };
        assert_eq!(s.lost(), 2);
    }

    #[test]
    fn budget_is_spent_in_whole_blocks() {
        let s = Shared::new(Some(10));
        assert_eq!(s.take(4), 4);
        assert_eq!(s.take(4), 4);
        assert_eq!(s.take(4), 4, "the last block is whole, as in iperf3");
        assert_eq!(s.take(4), 0);
        assert_eq!(Shared::new(None).take(9), 9);
    }
}
