//! Per-stream state of the data plane, sans-IO: what a stream should do
//! next, given `now` and what its last I/O did.
//!
//! A sending stream asks [`Sender::poll_action`] and gets one of: write
//! this many bytes of the payload (a TCP write, or a batch of datagrams
//! numbered from a given sequence number), wait until a time (the UDP
//! pacer), or finish (deadline, `-n` budget spent, stopped). It then
//! reports what the kernel took with [`Sender::handle_written`] or that
//! the socket would block with [`Sender::handle_blocked`]; what was taken
//! from the shared [`ByteBudget`] but not sent goes back to it. A
//! receiving stream reports bytes or datagrams ([`Receiver`]). Counters,
//! budget, pacer and UDP accounting live here; sockets, threads, the
//! clock and the stop signal stay with whoever drives the state (today
//! memtest's workers, one thread per stream), so every rule below is
//! tested on a virtual clock in the table tests at the bottom, and a
//! runner that drives many streams from one thread can reuse it as is.
//!
//! Times are nanoseconds since the stream's test started.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::pacer::Pacer;
use super::udp::{UdpReceiver, UdpTotals};

/// The bytes a test may still send at one end (`-n`), shared by its
/// sending streams; unlimited when built with `None`.
#[derive(Debug, Default)]
pub struct ByteBudget {
    left: Option<AtomicU64>,
}

impl ByteBudget {
    /// A budget of `bytes` (`None`: unlimited).
    pub fn new(bytes: Option<u64>) -> ByteBudget {
        ByteBudget {
            left: bytes.map(AtomicU64::new),
        }
    }

    /// Takes up to `want` bytes; `want` when unlimited, 0 when spent.
    pub fn take(&self, want: usize) -> usize {
        let Some(left) = &self.left else {
            return want;
        };
        let got = left.fetch_update(Ordering::AcqRel, Ordering::Acquire, |l| {
            (l > 0).then(|| l.saturating_sub(want as u64))
        });
        match got {
            Ok(l) => l.min(want as u64) as usize,
            Err(_) => 0,
        }
    }

    /// Returns bytes taken but not sent.
    pub fn give_back(&self, n: usize) {
        if let Some(left) = &self.left {
            left.fetch_add(n as u64, Ordering::AcqRel);
        }
    }
}

/// How a sending stream sends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SendSpec {
    /// Bytes per write (TCP) or per datagram (UDP).
    pub chunk: usize,
    /// UDP: the datagram schedule; `None` for TCP (as fast as the socket
    /// takes it).
    pub datagrams: Option<Datagrams>,
    /// When sending stops (`None`: when the byte budget is spent).
    pub until_ns: Option<u64>,
}

/// A UDP sender's schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Datagrams {
    /// Payload bits per second.
    pub bitrate: u64,
    /// Most datagrams per send call.
    pub burst: usize,
    /// Most lateness caught up (see `pacer`).
    pub max_lag: Duration,
}

/// Why a stream finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// Its time was up.
    Deadline,
    /// The `-n` budget was spent.
    Budget,
    /// The driver stopped it (abort, end of the test, peer gone).
    Stopped,
}

/// What a sending stream does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendAction {
    /// Write `bytes` of the payload: one TCP write, or `datagrams`
    /// datagrams of the chunk size numbered from `first_seq` (wrapping).
    Write {
        bytes: usize,
        datagrams: usize,
        first_seq: u64,
    },
    /// Nothing may go before this time (the pacer).
    WaitUntil(u64),
    /// Done: a TCP sender shuts its write side (the receiver's end of
    /// file ends the stream).
    Finish(Finish),
}

/// What a sending stream has done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendTotals {
    /// Bytes the kernel took.
    pub bytes: u64,
    /// Datagrams sent (UDP).
    pub packets: u64,
    /// When the last bytes went.
    pub last_ns: u64,
}

/// A sending stream's state.
#[derive(Debug, Clone)]
pub struct Sender {
    spec: SendSpec,
    pacer: Option<Pacer>,
    /// The next datagram's sequence number.
    seq: u64,
    /// Taken from the budget for the write in progress: (bytes, datagrams).
    pending: Option<(usize, usize)>,
    totals: SendTotals,
    finished: Option<Finish>,
}

impl Sender {
    /// A sender that has sent nothing; datagrams are numbered from 0.
    pub fn new(spec: SendSpec) -> Sender {
        let pacer = spec
            .datagrams
            .map(|d| Pacer::new(d.bitrate, spec.chunk, d.burst, d.max_lag));
        Sender {
            spec,
            pacer,
            seq: 0,
            pending: None,
            totals: SendTotals::default(),
            finished: None,
        }
    }

    /// The next action at `now_ns`. A `Write` takes its bytes from
    /// `budget`; report the outcome before polling again.
    pub fn poll_action(&mut self, now_ns: u64, budget: &ByteBudget) -> SendAction {
        if let Some(why) = self.finished {
            return SendAction::Finish(why);
        }
        if let Some((bytes, datagrams)) = self.pending {
            // Polled again without an outcome: the same write.
            return self.write(bytes, datagrams);
        }
        if self.spec.until_ns.is_some_and(|u| now_ns >= u) {
            return self.finish(Finish::Deadline);
        }
        let chunk = self.spec.chunk.max(1);
        let Some(pacer) = self.pacer.as_mut() else {
            let bytes = budget.take(chunk);
            if bytes == 0 {
                return self.finish(Finish::Budget);
            }
            self.pending = Some((bytes, 0));
            return self.write(bytes, 0);
        };
        let ready = pacer.ready(now_ns);
        if ready == 0 {
            let wait = pacer.wait(now_ns).as_nanos() as u64;
            return SendAction::WaitUntil(now_ns.saturating_add(wait.max(1)));
        }
        // Whole datagrams only: a budget too small for one ends the stream.
        let mut n = 0;
        while n < ready {
            let got = budget.take(chunk);
            if got < chunk {
                budget.give_back(got);
                break;
            }
            n += 1;
        }
        if n == 0 {
            return self.finish(Finish::Budget);
        }
        self.pending = Some((n * chunk, n));
        self.write(n * chunk, n)
    }

    /// The kernel took `bytes` (and, for UDP, `datagrams`) of the write
    /// [`poll_action`](Self::poll_action) asked for at `now_ns`.
    pub fn handle_written(
        &mut self,
        now_ns: u64,
        bytes: usize,
        datagrams: usize,
        budget: &ByteBudget,
    ) {
        let Some((asked, asked_datagrams)) = self.pending.take() else {
            return;
        };
        let (bytes, datagrams) = if self.pacer.is_some() {
            let d = datagrams.min(asked_datagrams);
            (d * self.spec.chunk, d)
        } else {
            (bytes.min(asked), 0)
        };
        budget.give_back(asked - bytes);
        if let Some(p) = self.pacer.as_mut() {
            p.sent(datagrams);
        }
        self.seq = self.seq.wrapping_add(datagrams as u64);
        self.totals.bytes += bytes as u64;
        self.totals.packets += datagrams as u64;
        if bytes > 0 {
            self.totals.last_ns = now_ns;
        }
    }

    /// The write would block, timed out or was refused for now: nothing
    /// went; its bytes go back to the budget.
    pub fn handle_blocked(&mut self, budget: &ByteBudget) {
        if let Some((asked, _)) = self.pending.take() {
            budget.give_back(asked);
        }
    }

    /// The driver stops the stream (a write in progress is abandoned).
    pub fn handle_stop(&mut self, budget: &ByteBudget) {
        self.handle_blocked(budget);
        self.finished.get_or_insert(Finish::Stopped);
    }

    /// What it has sent.
    pub fn totals(&self) -> SendTotals {
        self.totals
    }

    /// Why it finished, once it has.
    pub fn finished(&self) -> Option<Finish> {
        self.finished
    }

    /// Datagrams the pacer gave up because the sender fell too far behind.
    pub fn forgiven(&self) -> u64 {
        self.pacer.as_ref().map_or(0, Pacer::forgiven)
    }

    fn write(&self, bytes: usize, datagrams: usize) -> SendAction {
        SendAction::Write {
            bytes,
            datagrams,
            first_seq: self.seq,
        }
    }

    fn finish(&mut self, why: Finish) -> SendAction {
        self.finished = Some(why);
        SendAction::Finish(why)
    }
}

/// What a receiving stream has counted.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RecvTotals {
    /// Bytes received (TCP: from the socket; UDP: data datagrams' bytes).
    pub bytes: u64,
    /// When the last bytes arrived.
    pub last_ns: u64,
    /// UDP: loss, order and jitter.
    pub udp: Option<UdpTotals>,
    /// The peer closed (TCP end of file).
    pub closed: bool,
}

/// A receiving stream's state.
#[derive(Debug, Clone, Default)]
pub struct Receiver {
    udp: Option<UdpReceiver>,
    totals: RecvTotals,
}

impl Receiver {
    /// A TCP receiver.
    pub fn tcp() -> Receiver {
        Receiver::default()
    }

    /// A UDP receiver.
    pub fn udp() -> Receiver {
        Receiver {
            udp: Some(UdpReceiver::new()),
            totals: RecvTotals {
                udp: Some(UdpTotals::default()),
                ..RecvTotals::default()
            },
        }
    }

    /// A read returned `bytes` at `now_ns`; 0 is the peer's end of file.
    pub fn handle_read(&mut self, now_ns: u64, bytes: usize) {
        if bytes == 0 {
            self.totals.closed = true;
            return;
        }
        self.totals.bytes += bytes as u64;
        self.totals.last_ns = now_ns;
    }

    /// A datagram arrived at `now_ns` (UDP); returns whether it was data.
    pub fn handle_datagram(&mut self, now_ns: u64, d: &[u8]) -> bool {
        let Some(rx) = self.udp.as_mut() else {
            return false;
        };
        if !rx.handle_datagram(d, now_ns) {
            return false;
        }
        let t = rx.totals();
        self.totals.bytes = t.bytes;
        self.totals.last_ns = now_ns;
        self.totals.udp = Some(t);
        true
    }

    /// What it has counted.
    pub fn totals(&self) -> RecvTotals {
        self.totals
    }
}

/// When a TCP receiver that waits for its socket's low-water mark
/// (`SO_RCVLOWAT`, `mark` bytes) looks at its socket again without
/// readiness. Bytes below the mark wake nobody, so a receiver that finds
/// fewer than `mark` bytes (a slow stream, found by its tick) looks again
/// after `base`. One that finds the mark or more was woken by it and will
/// be again: its tick is only a safety net and stays where it is. One that
/// finds nothing doubles its tick, up to `max`. Measured with
/// `test -R -P 1024` on loopback, half of the receivers' reads were empty
/// looks at a fixed 20 ms tick: a thousand streams whose senders write in
/// bursts (a round of the sender's runner) each looked 50 times a second
/// between bursts. A slow stream's bytes are counted at most `max` late
/// after a quiet spell, `base` late while it keeps moving (the mark, the
/// end of file and the stop wake the receiver at once anyway).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvTick {
    base: Duration,
    max: Duration,
    mark: usize,
    next: Duration,
}

impl RecvTick {
    /// Looks every `base` while it finds fewer than `mark` bytes, backs
    /// off to `max` (at least `base`) while it finds none.
    pub fn new(base: Duration, max: Duration, mark: usize) -> RecvTick {
        RecvTick {
            base,
            max: max.max(base),
            mark,
            next: base,
        }
    }

    /// A turn read `bytes` (0: it found the queue empty): how long until
    /// the next look.
    pub fn after(&mut self, bytes: usize) -> Duration {
        self.next = if bytes == 0 {
            self.next.saturating_mul(2).min(self.max)
        } else if bytes < self.mark {
            self.base
        } else {
            self.next
        };
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn tcp(chunk: usize, until_ns: Option<u64>) -> Sender {
        Sender::new(SendSpec {
            chunk,
            datagrams: None,
            until_ns,
        })
    }

    fn udp(bitrate: u64, chunk: usize, burst: usize) -> Sender {
        Sender::new(SendSpec {
            chunk,
            datagrams: Some(Datagrams {
                bitrate,
                burst,
                max_lag: Duration::from_millis(100),
            }),
            until_ns: Some(1000 * MS),
        })
    }

    fn write(bytes: usize, datagrams: usize, first_seq: u64) -> SendAction {
        SendAction::Write {
            bytes,
            datagrams,
            first_seq,
        }
    }

    /// One step of a sender's table: at `now` (ms) the kernel takes
    /// `took` bytes/datagrams of what is asked (`None`: would block),
    /// and the action asked must be `want`.
    struct Step {
        now_ms: u64,
        want: SendAction,
        took: Option<(usize, usize)>,
    }

    fn step(now_ms: u64, want: SendAction, took: Option<(usize, usize)>) -> Step {
        Step { now_ms, want, took }
    }

    fn run(name: &str, s: &mut Sender, budget: &ByteBudget, steps: &[Step]) {
        for (i, st) in steps.iter().enumerate() {
            let now = st.now_ms * MS;
            let got = s.poll_action(now, budget);
            assert_eq!(got, st.want, "{name}: step {i} at {} ms", st.now_ms);
            if let SendAction::Write { .. } = got {
                match st.took {
                    Some((b, d)) => s.handle_written(now, b, d, budget),
                    None => s.handle_blocked(budget),
                }
            }
        }
    }

    #[test]
    fn tcp_sender_table() {
        use SendAction::Finish as F;
        // A deadline: writes until it, short writes counted as taken.
        let mut s = tcp(1000, Some(10 * MS));
        let b = ByteBudget::new(None);
        run(
            "deadline",
            &mut s,
            &b,
            &[
                step(0, write(1000, 0, 0), Some((1000, 0))),
                step(1, write(1000, 0, 0), Some((400, 0))),
                step(2, write(1000, 0, 0), None),
                step(9, write(1000, 0, 0), Some((1000, 0))),
                step(10, F(Finish::Deadline), None),
                step(11, F(Finish::Deadline), None),
            ],
        );
        assert_eq!(
            s.totals(),
            SendTotals {
                bytes: 2400,
                packets: 0,
                last_ns: 9 * MS
            }
        );

        // -n 2500: what a short or blocked write did not send goes back.
        let mut s = tcp(1000, None);
        let b = ByteBudget::new(Some(2500));
        run(
            "budget",
            &mut s,
            &b,
            &[
                step(0, write(1000, 0, 0), Some((1000, 0))),
                step(1, write(1000, 0, 0), Some((700, 0))),
                step(2, write(800, 0, 0), None),
                step(3, write(800, 0, 0), Some((800, 0))),
                step(4, F(Finish::Budget), None),
            ],
        );
        assert_eq!(s.totals().bytes, 2500);
        assert_eq!(b.take(1), 0, "spent exactly");

        // Stopped with a write in progress: its bytes go back.
        let mut s = tcp(1000, None);
        let b = ByteBudget::new(Some(5000));
        assert_eq!(s.poll_action(0, &b), write(1000, 0, 0));
        s.handle_stop(&b);
        assert_eq!(s.poll_action(MS, &b), F(Finish::Stopped));
        assert_eq!(s.finished(), Some(Finish::Stopped));
        assert_eq!(b.take(10_000), 5000);
    }

    #[test]
    fn two_senders_share_one_budget() {
        let b = ByteBudget::new(Some(2500));
        let (mut x, mut y) = (tcp(1000, None), tcp(1000, None));
        assert_eq!(x.poll_action(0, &b), write(1000, 0, 0));
        assert_eq!(y.poll_action(0, &b), write(1000, 0, 0));
        x.handle_written(0, 1000, 0, &b);
        y.handle_blocked(&b);
        assert_eq!(x.poll_action(1, &b), write(1000, 0, 0));
        assert_eq!(y.poll_action(1, &b), write(500, 0, 0));
        x.handle_written(1, 1000, 0, &b);
        y.handle_written(1, 500, 0, &b);
        assert_eq!(x.poll_action(2, &b), SendAction::Finish(Finish::Budget));
        assert_eq!(x.totals().bytes + y.totals().bytes, 2500);
    }

    #[test]
    fn udp_sender_table() {
        use SendAction::WaitUntil as W;
        // 1,000 B datagrams at 8 Mbit/s: one a millisecond, bursts of 4.
        let mut s = udp(8_000_000, 1000, 4);
        let b = ByteBudget::new(None);
        run(
            "paced",
            &mut s,
            &b,
            &[
                // Datagram 0 is due at 0.
                step(0, write(1000, 1, 0), Some((1000, 1))),
                // Next due at 1 ms.
                step(0, W(MS), None),
                step(1, write(1000, 1, 1), Some((1000, 1))),
                // 3 ms late: three due, sent in one batch; the kernel
                // takes two, the third is asked again.
                step(4, write(3000, 3, 2), Some((2000, 2))),
                step(4, write(1000, 1, 4), Some((1000, 1))),
                // Would block (ENOBUFS): nothing sent, same datagram next.
                step(5, write(1000, 1, 5), None),
                step(5, write(1000, 1, 5), Some((1000, 1))),
            ],
        );
        assert_eq!(s.totals().packets, 6);
        assert_eq!(s.totals().bytes, 6000);
        assert_eq!(s.forgiven(), 0);
    }

    #[test]
    fn udp_sender_numbers_wrap_and_the_budget_takes_whole_datagrams() {
        let mut s = udp(8_000_000, 1000, 4);
        s.seq = u64::MAX - 1;
        let b = ByteBudget::new(Some(3500));
        assert_eq!(s.poll_action(4 * MS, &b), write(3000, 3, u64::MAX - 1));
        s.handle_written(4 * MS, 3000, 3, &b);
        assert_eq!(s.seq, 1, "MAX - 1, MAX, 0 sent");
        // 500 bytes left: not a whole datagram.
        assert_eq!(
            s.poll_action(10 * MS, &b),
            SendAction::Finish(Finish::Budget)
        );
        assert_eq!(b.take(1000), 500, "the partial datagram went back");
    }

    #[test]
    fn udp_sender_stops_at_its_deadline() {
        let mut s = udp(8_000_000, 1000, 4);
        let b = ByteBudget::new(None);
        assert_eq!(s.poll_action(999 * MS, &b), write(4000, 4, 0));
        s.handle_written(999 * MS, 4000, 4, &b);
        assert_eq!(
            s.poll_action(1000 * MS, &b),
            SendAction::Finish(Finish::Deadline)
        );
    }

    #[test]
    fn recv_tick_backs_off_while_empty_and_resets_on_a_slow_streams_bytes() {
        let ms = Duration::from_millis;
        let mut t = RecvTick::new(ms(20), ms(160), 1000);
        // (bytes the turn read, the wait it gets)
        let table = [
            (500, ms(20)),   // below the mark: found by the tick
            (0, ms(40)),     // empty: back off
            (0, ms(80)),     //
            (5000, ms(80)),  // the mark woke it: the tick stays
            (0, ms(160)),    //
            (0, ms(160)),    // at most max
            (1000, ms(160)), // the mark exactly: woken by it
            (999, ms(20)),   // a slow stream again: base
            (0, ms(40)),     //
            (1, ms(20)),     //
        ];
        for (i, (bytes, wait)) in table.into_iter().enumerate() {
            assert_eq!(t.after(bytes), wait, "row {i}");
        }
        // A max below the base is the base.
        let mut t = RecvTick::new(ms(20), ms(5), 1000);
        assert_eq!(
            (t.after(0), t.after(0), t.after(1)),
            (ms(20), ms(20), ms(20))
        );
    }

    #[test]
    fn receiver_table() {
        let mut r = Receiver::tcp();
        r.handle_read(MS, 500);
        r.handle_read(3 * MS, 700);
        assert_eq!(
            r.totals(),
            RecvTotals {
                bytes: 1200,
                last_ns: 3 * MS,
                udp: None,
                closed: false
            }
        );
        r.handle_read(4 * MS, 0);
        assert!(r.totals().closed);
        assert_eq!(r.totals().last_ns, 3 * MS);
        assert!(
            !r.handle_datagram(5 * MS, &[0; 32]),
            "a TCP receiver takes no datagrams"
        );

        let mut r = Receiver::udp();
        let d = |seq: u64| {
            let mut d = vec![0u8; 100];
            d[..8].copy_from_slice(&seq.to_be_bytes());
            d
        };
        assert!(r.handle_datagram(MS, &d(0)));
        assert!(r.handle_datagram(2 * MS, &d(2)));
        assert!(!r.handle_datagram(3 * MS, &[1, 2]), "a runt");
        let t = r.totals();
        assert_eq!((t.bytes, t.last_ns), (200, 2 * MS));
        let u = t.udp.unwrap();
        assert_eq!(
            (u.packets, u.expected, u.lost_since(&UdpTotals::default())),
            (2, 3, 1)
        );
    }
}
