//! The blocking pool: the work a stream needs that may block on a disk
//! (reading, writing, hashing, `fdatasync`, journal records), on a fixed
//! set of threads whatever the stream count.
//!
//! The runner's I/O threads must never block, so a stream that needs a
//! file read or written hands a job here ([`submit`]) and waits for it
//! (its task parks; the job wakes it through a [`super::runner::TaskWaker`]
//! when done). A stream has at most one job in the pool at a time, so a
//! thousand streams queue a thousand jobs, never a thousand threads.
//!
//! Fairness: every job has an [`Owner`] (its session). Each owner's jobs
//! run in the order submitted, and the owners with jobs waiting take
//! turns, one job each, so a session that queued a thousand jobs delays
//! another session's one by one job per busy owner, not by a thousand
//! (first come, first served made it wait for all of them).
//!
//! Threads: [`threads`] of them (2 × cores, 2 to [`MAX_THREADS`]),
//! started on the first [`submit`] and kept for the life of the process
//! (docs/security.md: the thread bound).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

/// Most threads of the pool.
pub const MAX_THREADS: usize = 16;

/// A unit of blocking work.
pub type Job = Box<dyn FnOnce() + Send + 'static>;

/// Threads of the pool: two per core (a disk wait leaves the core to
/// another job), 2 to [`MAX_THREADS`].
pub fn threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .saturating_mul(2)
        .clamp(2, MAX_THREADS)
}

/// Whose a job is: owners take turns (see the module's text).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Owner(usize);

impl Owner {
    /// Jobs submitted without an owner ([`submit`]).
    pub const NONE: Owner = Owner(0);

    /// The owner keyed by a session's shared state: its address while it
    /// lives (another state at the same address later is a new session;
    /// sharing a key only shares a turn).
    pub fn of<T>(shared: &Arc<T>) -> Owner {
        Owner(Arc::as_ptr(shared) as *const () as usize)
    }
}

/// The waiting jobs: one queue per owner, served round robin.
#[derive(Default)]
struct Queue {
    /// Each owner with jobs waiting, and its jobs in order.
    jobs: HashMap<Owner, VecDeque<Job>>,
    /// Owners with jobs waiting, in turn order (each once).
    turns: VecDeque<Owner>,
    len: usize,
}

impl Queue {
    fn push(&mut self, owner: Owner, job: Job) {
        let q = self.jobs.entry(owner).or_default();
        if q.is_empty() {
            self.turns.push_back(owner);
        }
        q.push_back(job);
        self.len += 1;
    }

    /// The next owner's next job; the owner goes to the back of the turns
    /// if it has more.
    fn pop(&mut self) -> Option<Job> {
        let owner = self.turns.pop_front()?;
        let q = self.jobs.get_mut(&owner)?;
        let job = q.pop_front();
        if q.is_empty() {
            self.jobs.remove(&owner);
        } else {
            self.turns.push_back(owner);
        }
        if job.is_some() {
            self.len -= 1;
        }
        job
    }
}

struct Pool {
    jobs: Mutex<Queue>,
    ready: Condvar,
}

static POOL: OnceLock<Result<&'static Pool, String>> = OnceLock::new();

fn pool() -> io::Result<&'static Pool> {
    POOL.get_or_init(|| start(threads()).map_err(|e| e.to_string()))
        .as_ref()
        .copied()
        .map_err(|e| io::Error::other(format!("start the blocking pool: {e}")))
}

fn start(n: usize) -> io::Result<&'static Pool> {
    let pool: &'static Pool = Box::leak(Box::new(Pool {
        jobs: Mutex::new(Queue::default()),
        ready: Condvar::new(),
    }));
    for i in 0..n {
        std::thread::Builder::new()
            .name(format!("blocking {i}"))
            .stack_size(1 << 20)
            .spawn(move || work(pool))?;
    }
    Ok(pool)
}

fn work(pool: &'static Pool) {
    loop {
        let job = {
            let mut q = lock(&pool.jobs);
            loop {
                if let Some(j) = q.pop() {
                    break j;
                }
                q = pool.ready.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        };
        // A job that panics is lost (its stream sees its result never
        // come, and is ended by its session); the thread goes on.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
    }
}

/// Runs `job` on the pool (starting it on first use), in the turn of
/// jobs without an owner. Fails only if no thread could be started.
pub fn submit(job: Job) -> io::Result<()> {
    submit_as(Owner::NONE, job)
}

/// Runs `job` on the pool in `owner`'s turn: after `owner`'s earlier
/// jobs, taking turns with other owners' (starting the pool on first
/// use). Fails only if no thread could be started.
pub fn submit_as(owner: Owner, job: Job) -> io::Result<()> {
    let pool = pool()?;
    lock(&pool.jobs).push(owner, job);
    pool.ready.notify_one();
    Ok(())
}

/// Jobs waiting for a thread now.
pub fn queued() -> usize {
    match POOL.get() {
        Some(Ok(pool)) => lock(&pool.jobs).len,
        _ => 0,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn many_jobs_run_on_the_few_threads() {
        let (tx, rx) = mpsc::channel();
        for i in 0..200u32 {
            let tx = tx.clone();
            submit(Box::new(move || {
                let name = std::thread::current().name().unwrap_or("").to_string();
                let _ = tx.send((i, name));
            }))
            .unwrap();
        }
        let mut seen = std::collections::HashSet::new();
        let mut names = std::collections::HashSet::new();
        for _ in 0..200 {
            let (i, name) = rx.recv_timeout(std::time::Duration::from_secs(20)).unwrap();
            seen.insert(i);
            names.insert(name);
        }
        assert_eq!(seen.len(), 200);
        assert!(names.len() <= threads(), "{names:?}");
        assert!(names.iter().all(|n| n.starts_with("blocking ")));
    }

    #[test]
    fn owners_take_turns_one_job_each() {
        let mut q = Queue::default();
        let (tx, rx) = mpsc::channel();
        let job = |tag: (char, u32)| -> Job {
            let tx = tx.clone();
            Box::new(move || {
                let _ = tx.send(tag);
            })
        };
        let (a, b, c) = (Owner(1), Owner(2), Owner(3));
        for i in 0..3 {
            q.push(a, job(('a', i)));
        }
        q.push(b, job(('b', 0)));
        q.push(c, job(('c', 0)));
        q.push(b, job(('b', 1)));
        assert_eq!(q.len, 6);
        while let Some(j) = q.pop() {
            j();
        }
        assert_eq!(q.len, 0);
        assert!(q.jobs.is_empty() && q.turns.is_empty());
        let order: Vec<_> = rx.try_iter().collect();
        assert_eq!(
            order,
            [('a', 0), ('b', 0), ('c', 0), ('a', 1), ('b', 1), ('a', 2)]
        );
    }

    #[test]
    fn issue_34_a_session_with_one_job_is_not_queued_behind_a_thousand() {
        // Every pool thread held busy, session A queues 1,000 jobs, then
        // session B one: first come, first served ran B's after all of
        // A's. Taking turns, it runs within the first few.
        let n = threads();
        let (started_tx, started) = mpsc::channel();
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let blockers = Owner::of(&gate);
        for _ in 0..n {
            let (tx, gate) = (started_tx.clone(), Arc::clone(&gate));
            submit_as(
                blockers,
                Box::new(move || {
                    let _ = tx.send(());
                    let mut open = lock(&gate.0);
                    while !*open {
                        open = gate.1.wait(open).unwrap_or_else(|p| p.into_inner());
                    }
                }),
            )
            .unwrap();
        }
        for _ in 0..n {
            started
                .recv_timeout(std::time::Duration::from_secs(20))
                .expect("every pool thread took a blocker");
        }
        let (session_a, session_b) = (Arc::new('a'), Arc::new('b'));
        let ran = Arc::new(Mutex::new(Vec::new()));
        let (done_tx, done) = mpsc::channel();
        for session in [&session_a; 1000].into_iter().chain([&session_b]) {
            let (ran, tag, done) = (Arc::clone(&ran), **session, done_tx.clone());
            submit_as(
                Owner::of(session),
                Box::new(move || {
                    lock(&ran).push(tag);
                    let _ = done.send(());
                }),
            )
            .unwrap();
        }
        *lock(&gate.0) = true;
        gate.1.notify_all();
        for _ in 0..1001 {
            done.recv_timeout(std::time::Duration::from_secs(20))
                .expect("every job ran");
        }
        let ran = lock(&ran);
        let b_at = ran.iter().position(|&t| t == 'b').unwrap();
        assert!(
            b_at <= 2 * n,
            "B's job ran after {b_at} of A's ({n} pool threads)"
        );
    }

    #[test]
    fn a_job_that_panics_leaves_the_pool_serving() {
        for _ in 0..2 * MAX_THREADS {
            submit(Box::new(|| panic!("a bug in a job"))).unwrap();
        }
        let (tx, rx) = mpsc::channel();
        submit(Box::new(move || {
            let _ = tx.send(());
        }))
        .unwrap();
        rx.recv_timeout(std::time::Duration::from_secs(20)).unwrap();
    }
}
