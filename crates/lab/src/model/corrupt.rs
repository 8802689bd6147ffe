//! Bit errors at a bit error rate (`lab set --corrupt 1e-6`).
//!
//! A segment of `n` bits is corrupted with probability `1 - (1 - ber)^n`;
//! at the rates worth emulating (1e-9 .. 1e-4) two errors in one segment are
//! rare enough to model as one flipped bit, chosen uniformly. The model only
//! names the bit; the driver flips it and makes sure the receiver's checksum
//! check sees it, as a real NIC's would.

use super::rng::Rng;
use super::{DirConfig, Segment, Stage, Verdict};

const SALT: u64 = 0xC0FF;

/// Marks segments for a bit flip at a given bit error rate.
#[derive(Debug)]
pub struct Corrupt {
    ber: f64,
    rng: Rng,
}

impl Corrupt {
    /// A corruption stage drawing from `seed`.
    pub fn new(seed: u64) -> Corrupt {
        Corrupt {
            ber: 0.0,
            rng: Rng::new(seed, SALT),
        }
    }
}

impl Stage for Corrupt {
    fn process(&mut self, seg: &mut Segment) -> Verdict {
        if self.ber <= 0.0 || seg.len == 0 {
            return Verdict::Pass;
        }
        let bits = f64::from(seg.len) * 8.0;
        let p = -(bits * (-self.ber).ln_1p()).exp_m1();
        if self.rng.chance(p) {
            seg.corrupt_bit = Some(self.rng.below(u64::from(seg.len) * 8) as u32);
        }
        Verdict::Pass
    }

    fn configure(&mut self, cfg: &DirConfig) {
        self.ber = cfg.ber.clamp(0.0, 1.0);
    }
}
