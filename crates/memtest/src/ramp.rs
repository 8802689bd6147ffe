//! The test's ramp: how long from its start until data arrived at 90 % of
//! its steady rate, so a user sees the start-up cost and not only an
//! average (issue 18; the copy reports the same figure in its timeline).
//!
//! The client samples, every [`SAMPLE_EVERY`], the bytes the far end has
//! demonstrably received: on a stream this end receives, its own count; on
//! a TCP stream this end sends, the kernel's `tcpi_bytes_acked` (what the
//! receiver acknowledged, not what sat in the send buffer, which at the
//! start would make the ramp look instant). The one-second interval reports
//! are too coarse for a ramp of a few round trips.
//!
//! The samples are kept in a bounded series: when it is full, every other
//! sample is dropped and the spacing doubles, so an hour-long test costs
//! the same memory as a minute's and the series still spans the whole test
//! (the steady rate is that of its second half). The ramp itself is
//! `fatpipe_tune::ramp::measure`, the copy's definition.

use std::time::Duration;

/// How often the client samples delivered bytes at first.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// The rate is taken over this many seconds when looking for 90 %.
const WINDOW_SECS: f64 = 1.0;

/// The share of the steady rate the ramp ends at.
const FRACTION: f64 = 0.9;

/// Samples kept at most before thinning.
const MAX_SAMPLES: usize = 4096;

/// A bounded series of (seconds since the test started, bytes delivered).
#[derive(Debug, Clone)]
pub(crate) struct Series {
    samples: Vec<(f64, u64)>,
    every: Duration,
    max: usize,
}

impl Series {
    pub(crate) fn new() -> Series {
        Series::with_cap(MAX_SAMPLES)
    }

    fn with_cap(max: usize) -> Series {
        Series {
            samples: Vec::new(),
            every: SAMPLE_EVERY,
            max: max.max(4),
        }
    }

    /// The spacing samples are taken at now (doubles at each thinning).
    pub(crate) fn every(&self) -> Duration {
        self.every
    }

    /// Records a sample; thins the series when it is full.
    pub(crate) fn push(&mut self, secs: f64, bytes: u64) {
        self.samples.push((secs, bytes));
        if self.samples.len() >= self.max {
            // Keep the even ones: the first sample (the start) stays, the
            // spacing of what is kept is uniform.
            let mut i = 0;
            self.samples.retain(|_| {
                i += 1;
                i % 2 == 1
            });
            self.every *= 2;
        }
    }

    /// The ramp of the series, as the report shows it; `None` when the
    /// data took too short a time to tell (under two windows).
    pub(crate) fn ramp(&self) -> Option<fatpipe_schema::test::TestRamp> {
        let r = fatpipe_tune::ramp::measure(&self.samples, 0.0, FRACTION, WINDOW_SECS)?;
        Some(fatpipe_schema::test::TestRamp {
            secs: r.secs,
            final_rate: r.final_rate as u64,
        })
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.samples.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds a series from a rate curve sampled on a virtual clock.
    fn run(series: &mut Series, secs: f64, rate_at: impl Fn(f64) -> f64) {
        let mut t = 0.0;
        let mut bytes = 0.0;
        while t < secs {
            let dt = series.every().as_secs_f64();
            bytes += rate_at(t) * dt / 8.0;
            t += dt;
            series.push(t, bytes as u64);
        }
    }

    #[test]
    fn a_linear_ramp_to_one_gigabit_over_two_seconds_ends_where_the_closed_form_says() {
        let mut s = Series::new();
        // Rate climbs linearly to 1 Gbit/s at 2 s, then holds, for 10 s.
        run(&mut s, 10.0, |t| 1e9 * (t / 2.0).min(1.0));
        let r = s.ramp().expect("long enough");
        assert!((r.final_rate as f64 - 1e9).abs() < 1e7, "{r:?}");
        // The bytes so far are F(t) = t²/4 Gbit before 2 s and t - 1 after,
        // so the one-second mean at t is F(t) - F(t - 1): the ramp is the
        // first 100 ms sample where that reaches 0.9 Gbit/s.
        let mean = |t: f64| {
            let f = |x: f64| if x < 2.0 { x * x / 4.0 } else { x - 1.0 };
            (f(t) - f(t - 1.0)) * 1e9
        };
        let want = (1..=100)
            .map(|i| 1.0 + f64::from(i) * 0.1)
            .find(|&t| mean(t) >= 0.9e9)
            .expect("reaches it");
        let got = r.secs.expect("reached");
        assert!(
            (got - want).abs() <= 0.11,
            "ramp {got} s, closed form {want} s"
        );
    }

    #[test]
    fn a_flat_rate_ramps_in_one_window() {
        let mut s = Series::new();
        run(&mut s, 5.0, |_| 5e9);
        let r = s.ramp().expect("long enough");
        let got = r.secs.expect("reached");
        assert!((got - WINDOW_SECS).abs() <= 0.11, "{got}");
    }

    #[test]
    fn too_short_a_test_has_no_ramp() {
        let mut s = Series::new();
        run(&mut s, 1.5, |_| 1e9);
        assert!(s.ramp().is_none());
    }

    #[test]
    fn a_long_test_thins_its_series_and_keeps_its_whole_span() {
        let mut s = Series::with_cap(64);
        // 100 s at 100 ms would be 1000 samples; the cap holds it under 64.
        run(&mut s, 100.0, |t| 1e9 * (t / 4.0).min(1.0));
        assert!(s.len() < 64, "{}", s.len());
        assert!(s.every() > SAMPLE_EVERY);
        let last = s.samples.last().expect("samples").0;
        assert!(last >= 99.0, "the series still reaches the end: {last}");
        let r = s.ramp().expect("long enough");
        assert!((r.final_rate as f64 - 1e9).abs() < 2e7, "{r:?}");
        // A 4 s linear ramp: the one-second mean reaches 90 % at about
        // 4.1 s; the thinned spacing (here 1.6 s or more) rounds it up to
        // the next sample, never below the truth.
        let got = r.secs.expect("reached");
        assert!(
            (4.0..=4.1 + s.every().as_secs_f64()).contains(&got),
            "{got}"
        );
    }
}
