//! The blocking pool: the work a stream needs that may block on a disk
//! (reading, writing, hashing, `fdatasync`, journal records), on a fixed
//! set of threads whatever the stream count.
//!
//! The runner's I/O threads must never block, so a stream that needs a
//! file read or written hands a job here ([`submit`]) and waits for it
//! (its task parks; the job wakes it through a [`super::runner::TaskWaker`]
//! when done). Jobs run first come, first served; a stream has at most
//! one job in the pool at a time, so a thousand streams queue a thousand
//! jobs, never a thousand threads.
//!
//! Threads: [`threads`] of them (2 × cores, 2 to [`MAX_THREADS`]),
//! started on the first [`submit`] and kept for the life of the process
//! (docs/security.md: the thread bound).

use std::collections::VecDeque;
use std::io;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

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

struct Pool {
    jobs: Mutex<VecDeque<Job>>,
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
        jobs: Mutex::new(VecDeque::new()),
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
                if let Some(j) = q.pop_front() {
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

/// Runs `job` on the pool (starting it on first use). Fails only if no
/// thread could be started.
pub fn submit(job: Job) -> io::Result<()> {
    let pool = pool()?;
    lock(&pool.jobs).push_back(job);
    pool.ready.notify_one();
    Ok(())
}

/// Jobs waiting for a thread now.
pub fn queued() -> usize {
    match POOL.get() {
        Some(Ok(pool)) => lock(&pool.jobs).len(),
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
