//! CPU accounting for "how much CPU did this test cost", like iperf3's.
//!
//! A [`CpuSample`] pairs the process's user and system time (`getrusage`)
//! with a monotonic wall clock; the difference of two samples gives
//! utilisation as a percentage of *one core* (so a process saturating two
//! cores shows 200%), which is the convention iperf3 and nuttcp print and
//! what users compare against.

use std::io;
use std::time::{Duration, Instant};

use crate::platform;

/// Process CPU time and wall-clock time at one instant.
#[derive(Debug, Clone, Copy)]
pub struct CpuSample {
    /// When the sample was taken (monotonic).
    pub wall: Instant,
    /// User-mode CPU time consumed by the whole process so far.
    pub user: Duration,
    /// Kernel-mode CPU time consumed by the whole process so far.
    pub system: Duration,
}

/// CPU used between two samples, as percentages of one core.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuUsage {
    /// User time / wall time × 100.
    pub user_pct: f64,
    /// System time / wall time × 100.
    pub system_pct: f64,
    /// `user_pct + system_pct`.
    pub total_pct: f64,
}

impl CpuSample {
    /// Samples this process's CPU times (`getrusage(RUSAGE_SELF)`) and the
    /// monotonic clock.
    pub fn now() -> io::Result<CpuSample> {
        // SAFETY: rusage is plain data; all-zero is a valid value to overwrite.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `ru` is valid for writes for the duration of the call.
        platform::cvt(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) })?;
        Ok(CpuSample {
            wall: Instant::now(),
            user: timeval(ru.ru_utime),
            system: timeval(ru.ru_stime),
        })
    }

    /// Utilisation between `earlier` and this sample. Zero when no wall
    /// time passed (or the samples are out of order).
    pub fn utilisation_since(&self, earlier: &CpuSample) -> CpuUsage {
        let wall = self
            .wall
            .saturating_duration_since(earlier.wall)
            .as_secs_f64();
        if wall <= 0.0 {
            return CpuUsage::default();
        }
        let pct =
            |now: Duration, then: Duration| now.saturating_sub(then).as_secs_f64() / wall * 100.0;
        let user_pct = pct(self.user, earlier.user);
        let system_pct = pct(self.system, earlier.system);
        CpuUsage {
            user_pct,
            system_pct,
            total_pct: user_pct + system_pct,
        }
    }
}

fn timeval(tv: libc::timeval) -> Duration {
    let secs = u64::try_from(tv.tv_sec).unwrap_or(0);
    let micros = u32::try_from(tv.tv_usec).unwrap_or(0).min(999_999);
    Duration::new(secs, micros * 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The most cores this test can use (a loose upper bound).
    fn cpus() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }

    #[test]
    fn busy_thread_shows_user_time() {
        let a = CpuSample::now().unwrap();
        let end = Instant::now() + Duration::from_millis(200);
        let mut x = 0u64;
        while Instant::now() < end {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let b = CpuSample::now().unwrap();
        let u = b.utilisation_since(&a);
        // Spinning for the whole interval: a good share of a core even on a
        // loaded machine, and never more than every core we may use.
        assert!(u.user_pct > 10.0, "{u:?}");
        assert!(u.total_pct <= 100.0 * cpus() as f64 + 20.0, "{u:?}");
        assert!((u.total_pct - u.user_pct - u.system_pct).abs() < 1e-9);
    }

    #[test]
    fn idle_interval_and_reversed_samples() {
        let a = CpuSample::now().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let b = CpuSample::now().unwrap();
        // Other test threads may run concurrently, so only bound it loosely.
        assert!(b.utilisation_since(&a).total_pct < 100.0 * cpus() as f64 + 20.0);
        assert_eq!(a.utilisation_since(&b), CpuUsage::default());
        assert_eq!(a.utilisation_since(&a), CpuUsage::default());
    }
}
