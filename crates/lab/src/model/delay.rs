//! Propagation delay with jitter that never reorders.
//!
//! Drawing an independent jitter per packet and then refusing to reorder
//! (as netem does with a rate) collapses at high packet rates: every packet
//! waits for the slowest recent one, so the delay sits at `delay + jitter`
//! and the jitter disappears. Here jitter is a property of time instead:
//! a piecewise-linear curve through random points in `[-jitter, +jitter]`
//! spaced `4 * jitter` apart (at least 1 ms). Its slope is at most 1/2, so
//! `t + jitter(t)` only grows and segments keep their order by construction;
//! a final `max` with the previous due time guards equal arrival times and
//! a delay that a live `lab set` lowered while segments were in flight.

use super::rng::Rng;
use super::{DirConfig, Nanos, Segment, Stage, Verdict};

const SALT: u64 = 0xD31A;

/// Fixed delay plus slope-limited jitter; keeps order.
#[derive(Debug)]
pub struct DelayLine {
    delay: Nanos,
    jitter: Nanos,
    rng: Rng,
    /// The jitter curve between knots (t0, j0) and (t1, j1), in ns.
    t0: Nanos,
    j0: i64,
    t1: Nanos,
    j1: i64,
    last_due: Nanos,
}

impl DelayLine {
    /// A delay line whose jitter curve is drawn from `seed`.
    pub fn new(seed: u64) -> DelayLine {
        DelayLine {
            delay: 0,
            jitter: 0,
            rng: Rng::new(seed, SALT),
            t0: 0,
            j0: 0,
            t1: 0,
            j1: 0,
            last_due: 0,
        }
    }

    fn knot_spacing(&self) -> Nanos {
        (4 * self.jitter).max(1_000_000)
    }

    fn draw(&mut self) -> i64 {
        let span = 2 * self.jitter + 1;
        self.rng.below(span) as i64 - self.jitter as i64
    }

    /// The jitter offset at time `t` (t never goes backwards by much: the
    /// driver feeds arrivals in order).
    fn offset(&mut self, t: Nanos) -> i64 {
        if self.jitter == 0 {
            return 0;
        }
        let spacing = self.knot_spacing();
        if t >= self.t1 {
            if t >= self.t1 + spacing {
                // Idle for a while: restart the curve at `t`, continuing
                // from the last knot's value so the curve stays continuous.
                self.t0 = t;
                self.j0 = self.j1;
            } else {
                self.t0 = self.t1;
                self.j0 = self.j1;
            }
            self.t1 = self.t0 + spacing;
            self.j1 = self.draw();
        }
        if t <= self.t0 {
            return self.j0;
        }
        let frac = (t - self.t0) as f64 / (self.t1 - self.t0) as f64;
        self.j0 + ((self.j1 - self.j0) as f64 * frac).round() as i64
    }
}

impl Stage for DelayLine {
    fn process(&mut self, seg: &mut Segment) -> Verdict {
        let off = self.offset(seg.at);
        let base = seg.at + self.delay;
        let due = if off < 0 {
            base.saturating_sub(off.unsigned_abs()).max(seg.at)
        } else {
            base + off as u64
        };
        let due = due.max(self.last_due);
        self.last_due = due;
        seg.at = due;
        Verdict::Pass
    }

    fn configure(&mut self, cfg: &DirConfig) {
        self.delay = cfg.delay;
        if cfg.jitter != self.jitter {
            self.jitter = cfg.jitter;
            // Restart the curve so the old amplitude does not linger.
            self.t0 = 0;
            self.j0 = 0;
            self.t1 = 0;
            self.j1 = 0;
        }
    }
}
