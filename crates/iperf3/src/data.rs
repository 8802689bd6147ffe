//! The data plane of an iperf3 test, either end: one OS thread per stream.
//!
//! TCP streams carry raw payload with no framing; UDP datagrams start with
//! iperf3's header (send time as seconds and microseconds, then a sequence
//! number of 32 or 64 bits, all big-endian) and receivers count loss,
//! reordering and RFC 3550 jitter from it. Workers publish counters in
//! atomics that the session thread samples once per interval. Every
//! blocking call has a short timeout so that a worker notices its stop
//! flag within a fraction of a second.
//!
//! TCP senders write (or, `-Z`, `sendfile`) the process's one shared
//! pattern (`fatpipe_engine::dataplane::payload`), so a peer's streams ×
//! block length do not decide the server's memory. These threads are not
//! yet on the engine's runner (`dataplane::runner`), as the test
//! service's streams are.

use std::io::{self, Write};
use std::net::{TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use fatpipe_engine::dataplane::payload;
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

    fn sending(&self) -> bool {
        !self.stop_send.load(Ordering::Relaxed)
    }

    fn receiving(&self) -> bool {
        !self.stop_recv.load(Ordering::Relaxed)
    }
}

/// Sends `len`-byte writes on `sock` until told to stop or the budget is
/// spent; with `zerocopy`, `sendfile`s them from a memory file instead.
pub fn tcp_send(mut sock: TcpStream, len: usize, zerocopy: bool, shared: &Shared, c: &Counters) {
    let _ = sock.set_write_timeout(Some(POLL));
    // The process's one shared pattern (engine::dataplane::payload), not a
    // buffer or memory file of the peer-chosen length per stream; a length
    // past its cap (16 MiB) writes blocks of the cap.
    let buf = payload::pattern(len);
    let len = buf.len();
    let file: Option<payload::PayloadFile> = if zerocopy {
        static STRIPE: AtomicUsize = AtomicUsize::new(0);
        match payload::pattern_file(len, STRIPE.fetch_add(1, Ordering::Relaxed)) {
            Ok(f) => Some(f),
            Err(e) => {
                c.fail(format!("zero-copy source: {e}"));
                return;
            }
        }
    } else {
        None
    };
    while shared.sending() {
        let want = shared.take(len);
        if want == 0 {
            break;
        }
        let mut done = 0;
        while done < want && shared.sending() {
            let r = match &file {
                Some(f) => {
                    let mut off = done as u64;
                    fatpipe_sys::sendfile(&sock, f.file(), &mut off, want - done).map(|t| t.bytes)
                }
                None => sock.write(&buf[done..want]),
            };
            match r {
                Ok(0) => {
                    c.fail("the peer closed the stream".into());
                    return;
                }
                Ok(n) => {
                    done += n;
                    c.bytes.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e) if is_retry(&e) => {}
                Err(e) => {
                    if shared.sending() {
                        c.fail(format!("send: {e}"));
                    }
                    return;
                }
            }
        }
    }
}

/// Receives and discards until told to stop or the peer closes; the
/// kernel drops the data without copying it out where it can
/// (`recv(MSG_TRUNC)`, `fatpipe_sys::Discarder`).
pub fn tcp_recv(sock: TcpStream, shared: &Shared, c: &Counters) {
    let _ = sock.set_read_timeout(Some(POLL));
    let mut sink = fatpipe_sys::Discarder::new();
    while shared.receiving() {
        match sink.recv(&sock, 4 << 20) {
            Ok(t) if t.bytes == 0 => return,
            Ok(t) => {
                c.bytes.fetch_add(t.bytes as u64, Ordering::Relaxed);
            }
            Err(e) if is_retry(&e) => {}
            Err(e) => {
                if shared.receiving() {
                    c.fail(format!("receive: {e}"));
                }
                return;
            }
        }
    }
}

/// Sends `len`-byte datagrams at `rate` bit/s (0: as fast as possible)
/// with iperf3's header, 64-bit sequence numbers if `wide`.
pub fn udp_send(sock: UdpSocket, len: usize, rate: u64, wide: bool, shared: &Shared, c: &Counters) {
    let _ = sock.set_write_timeout(Some(POLL));
    // Its own: every datagram's header is written in place (one datagram).
    let mut buf = datagram(len.max(UDP_HEADER_WIDE));
    let start = Instant::now();
    let mut seq: u64 = 0;
    let mut sent_bits: f64 = 0.0;
    while shared.sending() {
        if rate > 0 {
            let allowed = rate as f64 * start.elapsed().as_secs_f64();
            if sent_bits >= allowed {
                let wait = (sent_bits - allowed) / rate as f64;
                std::thread::sleep(Duration::from_secs_f64(wait.min(0.005)));
                continue;
            }
        }
        let n = shared.take(len);
        if n == 0 {
            break;
        }
        seq += 1;
        write_header(&mut buf, seq, wide);
        match sock.send(&buf[..len]) {
            Ok(sent) => {
                c.bytes.fetch_add(sent as u64, Ordering::Relaxed);
                c.packets.fetch_add(1, Ordering::Relaxed);
                sent_bits += (len * 8) as f64;
            }
            Err(e) if is_retry(&e) || fatpipe_sys::udp::is_no_buffer_space(&e) => {
                seq -= 1;
                std::thread::yield_now();
            }
            Err(e) => {
                // The peer's socket is gone once its test ended.
                if shared.sending() && e.kind() != io::ErrorKind::ConnectionRefused {
                    c.fail(format!("send: {e}"));
                }
                return;
            }
        }
    }
}

/// Receives datagrams, counting loss, reordering and jitter.
pub fn udp_recv(sock: UdpSocket, wide: bool, shared: &Shared, c: &Counters) {
    let _ = sock.set_read_timeout(Some(POLL));
    let mut buf = vec![0u8; 65_536];
    let mut max_seq = 0u64;
    let mut prev_transit: Option<f64> = None;
    let mut jitter = 0.0f64;
    while shared.receiving() {
        let n = match sock.recv(&mut buf) {
            Ok(n) => n,
            Err(e) if is_retry(&e) || e.kind() == io::ErrorKind::ConnectionRefused => continue,
            Err(e) => {
                if shared.receiving() {
                    c.fail(format!("receive: {e}"));
                }
                return;
            }
        };
        let Some((sent, seq)) = read_header(&buf[..n], wide) else {
            continue;
        };
        c.bytes.fetch_add(n as u64, Ordering::Relaxed);
        c.packets.fetch_add(1, Ordering::Relaxed);
        if seq > max_seq {
            max_seq = seq;
            c.max_seq.store(seq, Ordering::Relaxed);
        } else {
            c.out_of_order.fetch_add(1, Ordering::Relaxed);
        }
        let transit = wall_secs() - sent;
        if let Some(prev) = prev_transit {
            jitter += ((transit - prev).abs() - jitter) / 16.0;
            c.jitter_bits.store(jitter.to_bits(), Ordering::Relaxed);
        }
        prev_transit = Some(transit);
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
