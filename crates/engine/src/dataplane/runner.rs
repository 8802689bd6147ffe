//! The runner: every data stream of the process on a bounded set of I/O
//! threads, whatever the stream count.
//!
//! A thread per stream put ~1,030 threads in each process for
//! `test -P 1024` and left the kernel's scheduler to share two cores
//! between them: over 8 s a tenth of the streams moved no byte. Here the
//! process has at most [`MAX_THREADS`] I/O threads (one per core), each an
//! epoll loop (through `mio`) over the non-blocking sockets of the streams
//! it was given. A stream is a [`Task`]: the runner calls
//! [`Task::turn`] when its socket is ready (or its timer is due), and the
//! task moves at most one *quantum* of data (a few writes or reads) and
//! says what it waits for next ([`Step`]). Ready tasks are served round
//! robin, one turn each per round, so a thousand streams on one thread
//! each move data every round instead of whichever the scheduler wakes.
//!
//! The tasks are the services' (memtest's streams), built on the sans-IO
//! state of [`super::stream`]; [`send_turn`] is the sending half every
//! service shares: one quantum of a [`Sender`]'s writes.
//!
//! Stopping: a task reads its own stop flag (its session's) at each turn;
//! whoever sets one calls [`wake_all`], which gives every task of the
//! process one turn soon. [`TaskHandle::join`] waits until the runner has
//! dropped the task (its socket deregistered), so a session may close its
//! sockets after joining.
//!
//! Threads: [`threads`] of them, started on the first [`spawn`] and kept
//! for the life of the process (docs/security.md: the thread bound).

use std::collections::{BinaryHeap, VecDeque};
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};

use super::stream::{ByteBudget, SendAction, SendTotals, Sender};

/// Most I/O threads of the process.
pub const MAX_THREADS: usize = 8;

/// Bytes a stream moves in one turn at most (several calls when the
/// kernel takes less per call): large enough that a single fast stream
/// pays one `epoll_wait` per quantum, small enough that a round over a
/// thousand streams stays short.
pub const QUANTUM_BYTES: usize = 1 << 20;

/// Most system calls a stream makes in one turn.
pub const QUANTUM_CALLS: usize = 8;

/// Bytes all senders of one I/O thread write in one round together, at
/// most: a sender's quantum is the round over the thread's task count
/// (within [`QUANTUM_MIN`]..=[`QUANTUM_BYTES`], see [`quantum`]), and the
/// round is half the host's TCP memory low mark (`tcp_mem`) over the
/// threads, within [`ROUND_MIN`]..=[`ROUND_BYTES`]. With a fixed 1 MiB
/// quantum, `test --bidir -P 1024` on loopback put 2,048 × 1 MiB in
/// flight per round: the receivers on the same threads were served once a
/// round, their queues grew past the host's TCP memory limit (1.7 GB
/// seen), the kernel dropped segments (TCPRcvQDrop) and streams stalled
/// on retransmission timeouts for seconds. A smaller round costs CPU per
/// byte instead: each burst wakes its receiver once (measured at
/// `-R -P 1024`, 64 MiB rounds cost the receiver twice and the sender
/// 1.5 times the CPU per byte of 256 MiB rounds).
pub const ROUND_BYTES: usize = 256 << 20;

/// The least round of one I/O thread.
pub const ROUND_MIN: usize = 16 << 20;

/// The least quantum of a sender, however many tasks share a thread.
pub const QUANTUM_MIN: usize = 64 << 10;

thread_local! {
    /// This thread's sender quantum: [`QUANTUM_BYTES`] outside the runner.
    static QUANTUM: std::cell::Cell<usize> = const { std::cell::Cell::new(QUANTUM_BYTES) };
}

/// Bytes a sending task moves in one turn at most, on the calling thread:
/// [`ROUND_BYTES`] shared by the thread's tasks, within
/// [`QUANTUM_MIN`]..=[`QUANTUM_BYTES`].
pub fn quantum() -> usize {
    QUANTUM.with(|q| q.get())
}

fn quantum_for(round: usize, tasks: usize) -> usize {
    (round / tasks.max(1)).clamp(QUANTUM_MIN, QUANTUM_BYTES)
}

/// The round of one I/O thread on this host (read once).
fn round_bytes() -> usize {
    static ROUND: OnceLock<usize> = OnceLock::new();
    *ROUND.get_or_init(|| {
        let low = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_mem")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<usize>().ok())
            .map(|pages| pages.saturating_mul(4096));
        round_for(low, threads())
    })
}

/// Half the TCP memory low mark (bytes; `None`: unknown) shared by
/// `threads` threads, within [`ROUND_MIN`]..=[`ROUND_BYTES`].
fn round_for(tcp_mem_low: Option<usize>, threads: usize) -> usize {
    match tcp_mem_low {
        Some(low) => (low / 2 / threads.max(1)).clamp(ROUND_MIN, ROUND_BYTES),
        None => ROUND_BYTES,
    }
}

/// What a task waits for after a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// It used its quantum and could do more: run it again next round.
    Again,
    /// The socket would block: run it when it is ready, or at the time
    /// given (a receiver's bytes below its low-water mark, a retry).
    Blocked(Option<Instant>),
    /// Nothing to do before this time (a pacer).
    Sleep(Instant),
    /// Finished: the runner deregisters and drops it.
    Done,
}

/// Which readiness of its socket a task waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wants {
    Read,
    Write,
}

/// One stream, driven by the runner.
pub trait Task: Send + 'static {
    /// The socket to wait on; it must stay open until the task is
    /// dropped, and be non-blocking (a turn must never block).
    fn fd(&self) -> RawFd;

    /// The readiness it waits for.
    fn wants(&self) -> Wants;

    /// Moves at most a quantum and says what it waits for next. A turn
    /// that panics ends the task (it is dropped as if it said `Done`).
    fn turn(&mut self) -> Step;
}

/// A task handed to the runner.
#[derive(Debug, Clone)]
pub struct TaskHandle {
    done: Arc<Done>,
}

#[derive(Debug, Default)]
struct Done {
    flag: Mutex<bool>,
    cv: Condvar,
}

impl TaskHandle {
    /// Waits until the runner has dropped the task.
    pub fn join(&self) {
        let mut done = lock(&self.done.flag);
        while !*done {
            done = self
                .done
                .cv
                .wait(done)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// True once the runner has dropped the task.
    pub fn is_done(&self) -> bool {
        *lock(&self.done.flag)
    }
}

impl Done {
    fn set(&self) {
        *lock(&self.flag) = true;
        self.cv.notify_all();
    }
}

/// I/O threads of the process: one per core, at most [`MAX_THREADS`]
/// (`FATPIPE_DATAPLANE_THREADS=N` chooses N instead, still 1 to
/// [`MAX_THREADS`]: for experiments; on a loaded 2-core host 4 threads
/// moved no more than 2).
pub fn threads() -> usize {
    if let Some(n) = std::env::var("FATPIPE_DATAPLANE_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        return n.clamp(1, MAX_THREADS);
    }
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, MAX_THREADS)
}

/// Hands `task` to the least loaded I/O thread (starting the threads on
/// first use). Fails only if no thread could be started.
pub fn spawn(task: Box<dyn Task>) -> io::Result<TaskHandle> {
    spawn_with_waker(|_| task)
}

/// Wakes one task: gives it a turn soon, whatever its socket's readiness
/// (work it handed to the [`super::blocking`] pool is done). Waking a
/// task that has ended does nothing.
#[derive(Clone)]
pub struct TaskWaker {
    worker: Arc<Worker>,
    /// The task's slot on its thread; [`UNPLACED`] until the thread took
    /// it (its first turn comes then anyway) and once it ended.
    slot: Arc<AtomicUsize>,
}

impl std::fmt::Debug for TaskWaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskWaker")
            .field("slot", &self.slot.load(Ordering::Relaxed))
            .finish()
    }
}

const UNPLACED: usize = usize::MAX;

impl TaskWaker {
    /// Gives the task a turn soon.
    pub fn wake(&self) {
        let i = self.slot.load(Ordering::Acquire);
        if i == UNPLACED {
            return;
        }
        lock(&self.worker.woken).push(i);
        let _ = self.worker.waker.wake();
    }
}

/// [`spawn`], for a task that hands work to other threads and must be
/// woken when it is done: `make` gets the task's [`TaskWaker`] and builds
/// the task.
pub fn spawn_with_waker(make: impl FnOnce(TaskWaker) -> Box<dyn Task>) -> io::Result<TaskHandle> {
    let pool = pool()?;
    let worker = pool
        .workers
        .iter()
        .min_by_key(|w| w.load.load(Ordering::Relaxed))
        .ok_or_else(|| io::Error::other("no runner thread"))?;
    let slot = Arc::new(AtomicUsize::new(UNPLACED));
    let task = make(TaskWaker {
        worker: Arc::clone(worker),
        slot: Arc::clone(&slot),
    });
    worker.load.fetch_add(1, Ordering::Relaxed);
    let done = Arc::new(Done::default());
    lock(&worker.inbox).push((task, Arc::clone(&done), slot));
    worker.waker.wake()?;
    Ok(TaskHandle { done })
}

/// Gives every task of the process a turn soon: call after setting a
/// stop flag the tasks read.
pub fn wake_all() {
    let Some(Ok(pool)) = POOL.get() else {
        return;
    };
    for w in &pool.workers {
        w.wake_all.store(true, Ordering::Release);
        let _ = w.waker.wake();
    }
}

/// Tasks the runner holds now (all threads).
pub fn tasks() -> usize {
    match POOL.get() {
        Some(Ok(pool)) => pool
            .workers
            .iter()
            .map(|w| w.load.load(Ordering::Relaxed))
            .sum(),
        _ => 0,
    }
}

struct Pool {
    workers: Vec<Arc<Worker>>,
}

/// A task handed over, with the flag its handle waits on and the slot
/// its waker reads.
type Handed = (Box<dyn Task>, Arc<Done>, Arc<AtomicUsize>);

/// What other threads share with one I/O thread.
struct Worker {
    inbox: Mutex<Vec<Handed>>,
    /// Slots whose [`TaskWaker`] was called.
    woken: Mutex<Vec<usize>>,
    waker: Waker,
    load: AtomicUsize,
    wake_all: AtomicBool,
}

static POOL: OnceLock<Result<Pool, String>> = OnceLock::new();

fn pool() -> io::Result<&'static Pool> {
    POOL.get_or_init(|| start(threads()).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| io::Error::other(format!("start the data plane's threads: {e}")))
}

const WAKER: Token = Token(usize::MAX);

fn start(n: usize) -> io::Result<Pool> {
    let mut workers = Vec::with_capacity(n);
    for i in 0..n {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let worker = Arc::new(Worker {
            inbox: Mutex::new(Vec::new()),
            woken: Mutex::new(Vec::new()),
            waker,
            load: AtomicUsize::new(0),
            wake_all: AtomicBool::new(false),
        });
        let w = Arc::clone(&worker);
        std::thread::Builder::new()
            .name(format!("dataplane {i}"))
            .stack_size(512 * 1024)
            .spawn(move || Loop::new(poll, w).run())?;
        workers.push(worker);
    }
    Ok(Pool { workers })
}

struct Slot {
    task: Box<dyn Task>,
    fd: RawFd,
    done: Arc<Done>,
    /// What its waker reads: set back to [`UNPLACED`] when it ends.
    place: Arc<AtomicUsize>,
    queued: bool,
    /// When it wants a turn without readiness (a retry, a pacer, a
    /// receiver's tick); `None`: only on readiness.
    due: Option<Instant>,
    /// The time of its one entry in the timer heap, if it has one.
    armed: Option<Instant>,
}

/// One I/O thread's state.
struct Loop {
    poll: Poll,
    worker: Arc<Worker>,
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    ready: VecDeque<usize>,
    /// (when, slot), earliest first: at most one entry per slot (its
    /// `armed`); an entry that fires before the slot's `due` (it asked
    /// for a later time since) is pushed again at `due`, so a fast
    /// receiver that re-asks for its tick on every read costs one heap
    /// entry per tick, not one per read.
    timers: BinaryHeap<std::cmp::Reverse<(Instant, usize)>>,
    /// Tasks on this thread.
    live: usize,
}

impl Loop {
    fn new(poll: Poll, worker: Arc<Worker>) -> Loop {
        Loop {
            poll,
            worker,
            slots: Vec::new(),
            free: Vec::new(),
            ready: VecDeque::new(),
            timers: BinaryHeap::new(),
            live: 0,
        }
    }

    fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        loop {
            let timeout = if self.ready.is_empty() {
                self.next_timer()
                    .map(|at| at.saturating_duration_since(Instant::now()))
            } else {
                Some(Duration::ZERO)
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    // Nothing sensible to do but retry after a breath.
                    std::thread::sleep(Duration::from_millis(1));
                }
                continue;
            }
            let mut woke = false;
            for ev in events.iter() {
                if ev.token() == WAKER {
                    woke = true;
                } else {
                    self.enqueue(ev.token().0);
                }
            }
            if woke {
                self.take_inbox();
                let woken = std::mem::take(&mut *lock(&self.worker.woken));
                for i in woken {
                    self.enqueue(i);
                }
                if self.worker.wake_all.swap(false, Ordering::AcqRel) {
                    for i in 0..self.slots.len() {
                        self.enqueue(i);
                    }
                }
            }
            if self.timers.peek().is_some() {
                self.fire_timers(Instant::now());
            }
            // One round: every task ready now gets one turn.
            for _ in 0..self.ready.len() {
                let Some(i) = self.ready.pop_front() else {
                    break;
                };
                self.turn(i);
            }
        }
    }

    /// The earliest time a slot is due. Entries at the heap's head that
    /// are stale (their slot asked for a later time since, or for none)
    /// are moved to their slot's time first, as [`Loop::fire_timers`]
    /// would when they fire: a thread then sleeps until a task is really
    /// due instead of waking for every receiver that moved its tick on
    /// (a thousand receivers' ticks had the thread wake thousands of
    /// times a second to re-arm them).
    fn next_timer(&mut self) -> Option<Instant> {
        while let Some(std::cmp::Reverse((at, i))) = self.timers.peek().copied() {
            let Some(Some(slot)) = self.slots.get_mut(i) else {
                self.timers.pop();
                continue;
            };
            if slot.armed != Some(at) {
                self.timers.pop(); // an entry of an earlier task in this slot
                continue;
            }
            match slot.due {
                Some(due) if due > at => {
                    self.timers.pop();
                    slot.armed = Some(due);
                    self.timers.push(std::cmp::Reverse((due, i)));
                }
                Some(_) => return Some(at),
                None => {
                    self.timers.pop();
                    slot.armed = None;
                }
            }
        }
        None
    }

    /// Queues every slot whose time has come; re-arms those that asked
    /// for a later time since their entry was pushed.
    fn fire_timers(&mut self, now: Instant) {
        while let Some(std::cmp::Reverse((at, i))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            let Some(Some(slot)) = self.slots.get_mut(i) else {
                continue;
            };
            if slot.armed != Some(at) {
                continue; // an entry of an earlier task in this slot
            }
            slot.armed = None;
            match slot.due {
                Some(due) if due <= now => {
                    slot.due = None;
                    self.enqueue(i);
                }
                Some(due) => {
                    slot.armed = Some(due);
                    self.timers.push(std::cmp::Reverse((due, i)));
                }
                None => {}
            }
        }
    }

    fn enqueue(&mut self, i: usize) {
        if let Some(Some(slot)) = self.slots.get_mut(i) {
            if !slot.queued {
                slot.queued = true;
                self.ready.push_back(i);
            }
        }
    }

    fn take_inbox(&mut self) {
        let new = std::mem::take(&mut *lock(&self.worker.inbox));
        for (task, done, place) in new {
            let fd = task.fd();
            let i = match self.free.pop() {
                Some(i) => i,
                None => {
                    self.slots.push(None);
                    self.slots.len() - 1
                }
            };
            let interest = match task.wants() {
                Wants::Read => Interest::READABLE,
                Wants::Write => Interest::WRITABLE,
            };
            if self
                .poll
                .registry()
                .register(&mut SourceFd(&fd), Token(i), interest)
                .is_err()
            {
                // Not pollable (closed already): the task still gets its
                // turns, by timer, so it sees its error and ends.
            }
            place.store(i, Ordering::Release);
            self.slots[i] = Some(Slot {
                task,
                fd,
                done,
                place,
                queued: false,
                due: None,
                armed: None,
            });
            self.enqueue(i);
            self.set_live(self.live + 1);
        }
    }

    /// Records the thread's task count and the senders' quantum for it.
    fn set_live(&mut self, live: usize) {
        self.live = live;
        QUANTUM.with(|q| q.set(quantum_for(round_bytes(), live)));
    }

    fn turn(&mut self, i: usize) {
        let Some(Some(slot)) = self.slots.get_mut(i) else {
            return;
        };
        slot.queued = false;
        // A task that panics ends (dropped like a finished one), instead
        // of taking the thread and every other stream on it down.
        let task = &mut slot.task;
        let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task.turn()))
            .unwrap_or(Step::Done);
        match step {
            Step::Again => {
                slot.due = None;
                slot.queued = true;
                self.ready.push_back(i);
            }
            Step::Blocked(None) => slot.due = None,
            Step::Blocked(Some(at)) | Step::Sleep(at) => {
                slot.due = Some(at);
                if slot.armed.is_none_or(|armed| armed > at) {
                    slot.armed = Some(at);
                    self.timers.push(std::cmp::Reverse((at, i)));
                }
            }
            Step::Done => {
                if let Some(slot) = self.slots[i].take() {
                    let _ = self.poll.registry().deregister(&mut SourceFd(&slot.fd));
                    let Slot {
                        task, done, place, ..
                    } = slot;
                    place.store(UNPLACED, Ordering::Release);
                    drop(task);
                    self.worker.load.fetch_sub(1, Ordering::Relaxed);
                    self.set_live(self.live.saturating_sub(1));
                    done.set();
                }
                self.free.push(i);
            }
        }
    }
}

/// How one call of a sender's write went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wrote {
    /// The kernel took these bytes and datagrams.
    Took(usize, usize),
    /// The socket would block (wait for it to be writable).
    Blocked,
    /// Nothing went and no readiness will say when to retry (a full
    /// device queue, a refused port): retry after this long.
    Backoff(Duration),
}

/// A sending stream's clock: its own start (a stream added mid-test is
/// paced from its start) and the test's (for the published times).
#[derive(Debug, Clone, Copy)]
pub struct SendClock {
    pub stream_start: Instant,
    pub test_start: Instant,
}

/// One turn of a sending stream: up to [`quantum`] bytes in at most
/// [`QUANTUM_CALLS`] calls of `write` (which does the I/O the action asks
/// for), reporting each outcome to the sender's state; `published` gets
/// the totals and the test-clock time in nanoseconds after each write
/// that moved bytes. `stop` ends the stream (its write in progress given
/// back). An error from `write` ends the turn with it. A short stream
/// write (no datagrams) ends the turn as blocked: the kernel took what
/// fitted, and the socket's next writable edge says when more fits.
#[allow(clippy::too_many_arguments)]
pub fn send_turn(
    st: &mut Sender,
    clock: SendClock,
    budget: &ByteBudget,
    stop: bool,
    mut write: impl FnMut(&SendAction) -> io::Result<Wrote>,
    mut published: impl FnMut(&SendTotals, u64),
) -> io::Result<Step> {
    if stop {
        st.handle_stop(budget);
    }
    let mut moved = 0usize;
    let quantum = quantum();
    for _ in 0..QUANTUM_CALLS {
        let now = clock.stream_start.elapsed().as_nanos() as u64;
        let action = st.poll_action(now, budget);
        match action {
            SendAction::Write { bytes, .. } => match write(&action) {
                Ok(Wrote::Took(n, d)) => {
                    // One clock read for both clocks.
                    let at = Instant::now();
                    let ns = at.saturating_duration_since(clock.stream_start).as_nanos() as u64;
                    st.handle_written(ns, n, d, budget);
                    let test_ns = at.saturating_duration_since(clock.test_start).as_nanos() as u64;
                    published(&st.totals(), test_ns);
                    moved += n;
                    if moved >= quantum {
                        return Ok(Step::Again);
                    }
                    if d == 0 && n > 0 && n < bytes {
                        // A short stream write: the socket is full, and
                        // says so when it has room again; the next write
                        // would only fail.
                        return Ok(Step::Blocked(None));
                    }
                }
                Ok(Wrote::Blocked) => {
                    st.handle_blocked(budget);
                    return Ok(Step::Blocked(None));
                }
                Ok(Wrote::Backoff(d)) => {
                    st.handle_blocked(budget);
                    return Ok(Step::Sleep(Instant::now() + d));
                }
                Err(e) => {
                    st.handle_blocked(budget);
                    return Err(e);
                }
            },
            SendAction::WaitUntil(at) => {
                let wait = Duration::from_nanos(at.saturating_sub(now));
                return Ok(Step::Sleep(Instant::now() + wait));
            }
            SendAction::Finish(_) => return Ok(Step::Done),
        }
    }
    Ok(Step::Again)
}

/// Locks a mutex, taking the value even if a thread panicked holding it
/// (the values are replaced whole).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::stream::SendSpec;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;
    use std::sync::atomic::AtomicU64;

    /// A sender of `QUANTUM`s over a socket pair; counts what it wrote.
    struct Writer {
        sock: TcpStream,
        st: Sender,
        clock: SendClock,
        budget: Arc<ByteBudget>,
        sent: Arc<AtomicU64>,
        stop: Arc<AtomicBool>,
    }

    impl Task for Writer {
        fn fd(&self) -> RawFd {
            self.sock.as_raw_fd()
        }
        fn wants(&self) -> Wants {
            Wants::Write
        }
        fn turn(&mut self) -> Step {
            let buf = [7u8; 65536];
            let sock = &self.sock;
            let sent = &self.sent;
            let r = send_turn(
                &mut self.st,
                self.clock,
                &self.budget,
                self.stop.load(Ordering::Acquire),
                |a| {
                    let SendAction::Write { bytes, .. } = *a else {
                        return Ok(Wrote::Blocked);
                    };
                    match (&*sock).write(&buf[..bytes]) {
                        Ok(n) => Ok(Wrote::Took(n, 0)),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Wrote::Blocked),
                        Err(e) => Err(e),
                    }
                },
                |t, _| sent.store(t.bytes, Ordering::Relaxed),
            );
            match r {
                Ok(Step::Done) | Err(_) => {
                    let _ = self.sock.shutdown(std::net::Shutdown::Write);
                    Step::Done
                }
                Ok(s) => s,
            }
        }
    }

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    /// A sender over `sock` (made non-blocking) of `chunk`-byte writes
    /// until `budget` bytes (`None`: until stopped), and its byte count.
    fn writer(
        sock: TcpStream,
        chunk: usize,
        budget: Option<u64>,
        stop: &Arc<AtomicBool>,
    ) -> (Box<Writer>, Arc<AtomicU64>) {
        sock.set_nonblocking(true).unwrap();
        let sent = Arc::new(AtomicU64::new(0));
        let now = Instant::now();
        let w = Writer {
            sock,
            st: Sender::new(SendSpec {
                chunk,
                datagrams: None,
                until_ns: None,
            }),
            clock: SendClock {
                stream_start: now,
                test_start: now,
            },
            budget: Arc::new(ByteBudget::new(budget)),
            sent: Arc::clone(&sent),
            stop: Arc::clone(stop),
        };
        (Box::new(w), sent)
    }

    #[test]
    fn many_streams_share_the_threads_and_all_move_their_bytes() {
        // 64 senders of 1 MB each (the -n budget of each), their readers
        // on plain threads: every byte arrives, every task ends.
        let mut readers = Vec::new();
        let mut handles = Vec::new();
        for _ in 0..64 {
            let (a, b) = pair();
            let (task, sent) = writer(a, 65536, Some(1_000_000), &Arc::new(AtomicBool::new(false)));
            handles.push((spawn(task).unwrap(), sent));
            readers.push(std::thread::spawn(move || {
                let mut got = Vec::new();
                (&b).read_to_end(&mut got).unwrap();
                got.len()
            }));
        }
        for r in readers {
            assert_eq!(r.join().unwrap(), 1_000_000);
        }
        for (h, sent) in handles {
            h.join();
            assert!(h.is_done());
            assert_eq!(sent.load(Ordering::Relaxed), 1_000_000);
        }
        assert!(threads() <= MAX_THREADS);
    }

    /// A task whose first turn panics.
    struct Panics(TcpStream);

    impl Task for Panics {
        fn fd(&self) -> RawFd {
            self.0.as_raw_fd()
        }
        fn wants(&self) -> Wants {
            Wants::Read
        }
        fn turn(&mut self) -> Step {
            panic!("a bug in a task");
        }
    }

    #[test]
    fn the_quantum_shares_a_round_between_the_threads_tasks() {
        let round = 256 << 20;
        // (tasks on the thread, quantum)
        let table = [
            (0, QUANTUM_BYTES),
            (1, QUANTUM_BYTES),
            (256, QUANTUM_BYTES),
            (512, 512 << 10),
            (1024, 256 << 10),
            (4096, QUANTUM_MIN),
            (100_000, QUANTUM_MIN),
        ];
        for (tasks, q) in table {
            assert_eq!(quantum_for(round, tasks), q, "{tasks} tasks");
        }
        assert_eq!(quantum_for(16 << 20, 1024), QUANTUM_MIN);
        // Off the runner's threads: the largest.
        assert_eq!(quantum(), QUANTUM_BYTES);
    }

    #[test]
    fn the_round_is_half_the_tcp_memory_low_mark_over_the_threads() {
        let gib = 1usize << 30;
        // (tcp_mem low in bytes, threads, round)
        let table = [
            (None, 2, ROUND_BYTES),
            (Some(gib), 2, ROUND_BYTES),        // 256 MiB each
            (Some(gib), 8, 64 << 20),           // 64 MiB each
            (Some(64 << 20), 2, ROUND_MIN),     // a small host
            (Some(usize::MAX), 1, ROUND_BYTES), // a huge one
            (Some(gib), 0, ROUND_BYTES),        // no thread counted: one
        ];
        for (low, threads, round) in table {
            assert_eq!(round_for(low, threads), round, "{low:?} {threads}");
        }
    }

    #[test]
    fn a_task_that_panics_ends_and_the_thread_goes_on() {
        let threads_before = threads();
        let (a, _b) = pair();
        let h = spawn(Box::new(Panics(a))).unwrap();
        h.join();
        // The threads still serve: a sender after it moves its bytes.
        let (a, b) = pair();
        let (task, _) = writer(a, 1000, Some(5000), &Arc::new(AtomicBool::new(false)));
        let h = spawn(task).unwrap();
        let mut got = Vec::new();
        (&b).read_to_end(&mut got).unwrap();
        h.join();
        assert_eq!(got.len(), 5000);
        assert_eq!(threads(), threads_before);
    }

    #[test]
    fn a_stop_flag_and_wake_all_end_a_blocked_task() {
        // A sender whose peer never reads blocks on a full socket; the
        // stop flag and a wake end it.
        let (a, _b) = pair();
        let stop = Arc::new(AtomicBool::new(false));
        let (task, sent) = writer(a, 65536, None, &stop);
        let h = spawn(task).unwrap();
        // Wait until it has filled the socket (sent stops growing).
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut last = u64::MAX;
        loop {
            let s = sent.load(Ordering::Relaxed);
            if s > 0 && s == last {
                break;
            }
            last = s;
            assert!(Instant::now() < deadline, "never filled");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(!h.is_done());
        stop.store(true, Ordering::Release);
        wake_all();
        h.join();
    }

    /// A task that waits for no readiness, only its waker: counts its
    /// turns, ends at the third.
    struct Parked {
        sock: TcpStream,
        turns: Arc<AtomicUsize>,
    }

    impl Task for Parked {
        fn fd(&self) -> RawFd {
            self.sock.as_raw_fd()
        }
        fn wants(&self) -> Wants {
            Wants::Read
        }
        fn turn(&mut self) -> Step {
            if self.turns.fetch_add(1, Ordering::SeqCst) + 1 >= 3 {
                Step::Done
            } else {
                Step::Blocked(None)
            }
        }
    }

    #[test]
    fn a_waker_gives_a_parked_task_its_turns() {
        let (a, _b) = pair();
        let turns = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = std::sync::mpsc::channel();
        let t = Arc::clone(&turns);
        let h = spawn_with_waker(|w| {
            let _ = tx.send(w);
            Box::new(Parked { sock: a, turns: t })
        })
        .unwrap();
        let waker = rx.recv().unwrap();
        // Its first turn comes on its own; each wake gives one more.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !h.is_done() {
            assert!(Instant::now() < deadline, "turns: {turns:?}");
            let before = turns.load(Ordering::SeqCst);
            waker.wake();
            while turns.load(Ordering::SeqCst) == before && !h.is_done() {
                assert!(Instant::now() < deadline, "a wake gave no turn");
                std::thread::yield_now();
            }
        }
        assert_eq!(turns.load(Ordering::SeqCst), 3);
        // Waking an ended task does nothing.
        waker.wake();
    }
}
