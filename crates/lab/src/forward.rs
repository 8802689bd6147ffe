//! The driver: two threads, one per direction, each moving frames from one
//! TUN device through a [`Pipe`] to the other device when they are due.
//!
//! Each thread sleeps in `ppoll` on its input device with a timeout that
//! ends when the oldest held frame is due, so an idle link costs nothing and
//! a due frame is written within the timer's resolution (the timer slack is
//! set to 1 ns). Reads come in batches straight into the backlog ring.
//! Writing to a TUN device runs the receiving namespace's stack on this
//! thread, which is why the two directions get a thread each.
//!
//! Live changes arrive through [`Shared`]: the control thread swaps in a new
//! spec and bumps a generation counter that each loop checks with one
//! relaxed load; counters go the other way every few milliseconds.

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::control::LabStats;
use crate::model::{DirConfig, Nanos};
use crate::pipe::{DirStats, Pipe};
use crate::spec::{Dir, LinkChange, LinkSpec};
use crate::sys;

/// Frames read per wake-up before due frames get another look.
const READ_BATCH: usize = 32;
/// The longest a thread sleeps without looking at the config.
const MAX_SLEEP: Duration = Duration::from_millis(20);
/// On a quiet link, wake this long before a frame is due and spin the rest:
/// a sleeping thread wakes 50-150 us late on a virtual machine, which would
/// show in every ping. A busy link (more than [`SPIN_MAX_HELD`] frames held)
/// never spins, so a loaded machine keeps its CPU for the endpoints.
const SPIN_LEAD: Nanos = 200_000;
/// See [`SPIN_LEAD`].
const SPIN_MAX_HELD: usize = 8;
/// How often counters are published.
const PUBLISH_EVERY: Nanos = 10_000_000;

/// State shared between the forwarding threads and the control thread.
#[derive(Debug)]
pub struct Shared {
    name: String,
    epoch: Instant,
    spec: Mutex<LinkSpec>,
    down: Mutex<Option<(Nanos, Nanos)>>,
    generation: AtomicU64,
    stats: [Mutex<DirStats>; 2],
    udp_gso: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicked holder leaves plain data behind; keep going with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn index(dir: Dir) -> usize {
    match dir {
        Dir::AtoB => 0,
        Dir::BtoA => 1,
    }
}

impl Shared {
    /// Shared state for lab `name` starting with `spec`; `udp_gso` says
    /// whether both devices carry UDP GSO (reported in the stats).
    pub fn new(name: &str, spec: LinkSpec, udp_gso: bool) -> Shared {
        Shared {
            udp_gso,
            name: name.to_string(),
            epoch: Instant::now(),
            spec: Mutex::new(spec),
            down: Mutex::new(None),
            generation: AtomicU64::new(0),
            stats: Default::default(),
        }
    }

    /// Nanoseconds on the forwarder's monotonic clock.
    pub fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    fn dir_config(&self, dir: Dir) -> DirConfig {
        let down = *lock(&self.down);
        lock(&self.spec).dir_config(dir, down)
    }

    /// Applies a live change; returns the spec now in force, or why not.
    pub fn apply(&self, change: &LinkChange) -> Result<LinkSpec, String> {
        let mut spec = lock(&self.spec);
        let mut next = spec.clone();
        next.apply(change);
        next.validate().map_err(|e| e.to_string())?;
        *spec = next.clone();
        if let Some(d) = change.down {
            let now = self.now();
            *lock(&self.down) = Some((now, now + d.as_nanos() as Nanos));
        }
        self.generation.fetch_add(1, Ordering::Release);
        Ok(next)
    }

    /// A snapshot of counters and spec.
    pub fn stats(&self) -> LabStats {
        let now = self.now();
        let down_left_s = lock(&self.down)
            .filter(|&(_, end)| end > now)
            .map(|(_, end)| (end - now) as f64 / 1e9);
        LabStats {
            name: self.name.clone(),
            spec: lock(&self.spec).clone(),
            uptime_s: now as f64 / 1e9,
            down_left_s,
            udp_gso: self.udp_gso,
            a_to_b: *lock(&self.stats[0]),
            b_to_a: *lock(&self.stats[1]),
        }
    }
}

/// One direction a forwarding thread serves: frames from `input` go
/// through direction `dir` of the link to `output`.
#[derive(Debug, Clone)]
pub struct Lane {
    /// Which way through the link.
    pub dir: Dir,
    /// The TUN device frames are read from.
    pub input: Arc<File>,
    /// The TUN device frames are written to.
    pub output: Arc<File>,
}

/// Forwards frames on every lane (one or both directions), forever.
/// Returns only if a device fails for good.
pub fn forward(lanes: &[Lane], shared: &Shared) -> std::io::Error {
    sys::tight_timer_slack();
    if std::env::var("FATPIPE_LAB_RT").as_deref() != Ok("0") {
        // Best effort: without it the link still works, only less punctually.
        let _ = sys::realtime(10);
    }
    let mut generation = shared.generation.load(Ordering::Acquire);
    let mut pipes: Vec<Pipe> = lanes
        .iter()
        .map(|l| Pipe::new(&shared.dir_config(l.dir)))
        .collect();
    let inputs: Vec<&File> = lanes.iter().map(|l| &*l.input).collect();
    let mut readable = fatpipe_sys::poll::Readable::new(&inputs);
    let mut published = 0;
    loop {
        let mut now = 0;
        for (pipe, lane) in pipes.iter_mut().zip(lanes) {
            now = deliver_due(pipe, &lane.output, shared);
        }
        let g = shared.generation.load(Ordering::Acquire);
        if g != generation {
            generation = g;
            for (pipe, lane) in pipes.iter_mut().zip(lanes) {
                pipe.configure(&shared.dir_config(lane.dir));
            }
        }
        if now >= published + PUBLISH_EVERY {
            published = now;
            for (pipe, lane) in pipes.iter().zip(lanes) {
                *lock(&shared.stats[index(lane.dir)]) = pipe.stats();
            }
        }
        // Read while frames are waiting, writing out whatever falls due in
        // between: on a busy link this costs a read and a write per frame
        // and no poll at all.
        let mut got_any = false;
        for (pipe, lane) in pipes.iter_mut().zip(lanes) {
            for _ in 0..READ_BATCH {
                match read_one(pipe, &lane.input, shared) {
                    Ok(true) => got_any = true,
                    Ok(false) => break,
                    Err(e) => return e,
                }
                now = deliver_due(pipe, &lane.output, shared);
            }
        }
        if got_any {
            continue;
        }
        let wait = pipes
            .iter()
            .map(|pipe| sleep_for(pipe, now))
            .min()
            .unwrap_or(MAX_SLEEP);
        if let Err(e) = readable.wait(wait) {
            return e;
        }
    }
}

/// Reads one frame into the pipe if one is waiting.
fn read_one(pipe: &mut Pipe, input: &File, shared: &Shared) -> std::io::Result<bool> {
    match pipe.slot() {
        Some(slot) => match sys::read(input, slot)? {
            Some(n) => {
                pipe.admit(shared.now(), n);
                Ok(true)
            }
            None => Ok(false),
        },
        None => {
            let got = sys::read(input, pipe.overflow_slot())?.is_some();
            if got {
                pipe.overflowed();
            }
            Ok(got)
        }
    }
}

/// How long a pipe lets the thread sleep: until its next frame is due,
/// less [`SPIN_LEAD`] when the link is quiet (the rest is spun).
fn sleep_for(pipe: &Pipe, now: Nanos) -> Duration {
    let until_due = pipe.next_due().map(|due| due.saturating_sub(now));
    let quiet = pipe.held() <= SPIN_MAX_HELD;
    match until_due {
        Some(d) if quiet && d <= SPIN_LEAD => Duration::ZERO,
        Some(d) if quiet => Duration::from_nanos(d - SPIN_LEAD),
        Some(d) => Duration::from_nanos(d),
        None => MAX_SLEEP,
    }
    .min(MAX_SLEEP)
}

/// Writes every frame that is due; returns the time of the last look.
fn deliver_due(pipe: &mut Pipe, output: &File, shared: &Shared) -> Nanos {
    loop {
        let now = shared.now();
        match pipe.front() {
            Some((frame, due)) if due <= now => {
                let ok = sys::write(output, frame).is_ok();
                pipe.delivered(now, ok);
            }
            _ => return now,
        }
    }
}
