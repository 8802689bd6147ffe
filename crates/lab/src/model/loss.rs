//! Random loss: independent (Bernoulli) or bursty (Gilbert–Elliott).
//!
//! Users give one number, the long-run loss rate `p`, and optionally a mean
//! burst length `b` in segments. With `b <= 1` every segment is lost with
//! probability `p` on its own. With `b > 1` a two-state chain runs: the bad
//! state loses everything and is left with probability `1/b` per segment (so
//! bursts average `b` segments); the good state loses nothing and is left
//! with probability `p / (b (1 - p))`, which makes the bad state's share of
//! time, and so the long-run loss rate, exactly `p`.

use super::rng::Rng;
use super::{DirConfig, DropReason, Segment, Stage, Verdict};

const SALT: u64 = 0x1055;

/// Bernoulli or Gilbert–Elliott loss at a long-run rate.
#[derive(Debug)]
pub struct Loss {
    p: f64,
    burst: f64,
    bad: bool,
    rng: Rng,
}

impl Loss {
    /// A loss stage drawing from `seed`.
    pub fn new(seed: u64) -> Loss {
        Loss {
            p: 0.0,
            burst: 1.0,
            bad: false,
            rng: Rng::new(seed, SALT),
        }
    }
}

impl Stage for Loss {
    fn process(&mut self, _seg: &mut Segment) -> Verdict {
        if self.p <= 0.0 {
            return Verdict::Pass;
        }
        let lost = if self.burst <= 1.0 || self.p >= 1.0 {
            self.rng.chance(self.p)
        } else {
            let leave = if self.bad {
                1.0 / self.burst
            } else {
                self.p / (self.burst * (1.0 - self.p))
            };
            if self.rng.chance(leave) {
                self.bad = !self.bad;
            }
            self.bad
        };
        if lost {
            Verdict::Drop(DropReason::Random)
        } else {
            Verdict::Pass
        }
    }

    fn configure(&mut self, cfg: &DirConfig) {
        self.p = cfg.loss.clamp(0.0, 1.0);
        self.burst = if cfg.loss_burst.is_finite() {
            cfg.loss_burst
        } else {
            1.0
        };
        if self.p <= 0.0 {
            self.bad = false;
        }
    }
}
