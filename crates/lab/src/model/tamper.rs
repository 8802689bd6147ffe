//! Payload tampering that checksums do not catch (`lab set --tamper 1e-7`).
//!
//! [`Corrupt`](super::Corrupt) models noise on the wire: the receiver's
//! checksum sees the flipped bit and drops the segment, so TCP resends it
//! and the application never sees an error. A faulty NIC, a bad memory
//! cell in a router or a middlebox that rewrites packets does worse: it
//! changes the payload and the checksum is computed (or fixed up) after,
//! so the receiving TCP accepts the damage. That is what a copy's own
//! per-chunk checksums exist for, and this stage lets a test prove it.
//!
//! The rate counts payload bits only ([`Segment::payload`]): headers are
//! never touched, so the packet still reaches the right socket at the
//! right sequence number and only the data is wrong. A segment of `n`
//! payload bits is hit with probability `1 - (1 - ber)^n`, as one flipped
//! bit chosen uniformly among them (two hits in one segment are rare at
//! the rates worth emulating). The model only names the bit; the driver
//! flips it and leaves a checksum that verifies.

use super::rng::Rng;
use super::{DirConfig, Segment, Stage, Verdict};

/// Its own salt, so turning tampering on does not shift the other stages'
/// random sequences (nor they its).
const SALT: u64 = 0x7A3E;

/// Marks segments for an undetected payload bit flip.
#[derive(Debug)]
pub struct Tamper {
    ber: f64,
    rng: Rng,
}

impl Tamper {
    /// A tampering stage drawing from `seed`.
    pub fn new(seed: u64) -> Tamper {
        Tamper {
            ber: 0.0,
            rng: Rng::new(seed, SALT),
        }
    }
}

impl Stage for Tamper {
    fn process(&mut self, seg: &mut Segment) -> Verdict {
        if self.ber <= 0.0 || seg.payload == 0 {
            return Verdict::Pass;
        }
        let bits = f64::from(seg.payload) * 8.0;
        let p = -(bits * (-self.ber).ln_1p()).exp_m1();
        if self.rng.chance(p) {
            seg.tamper_bit = Some(self.rng.below(u64::from(seg.payload) * 8) as u32);
        }
        Verdict::Pass
    }

    fn configure(&mut self, cfg: &DirConfig) {
        self.ber = cfg.tamper.clamp(0.0, 1.0);
    }
}
