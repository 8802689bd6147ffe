//! A small seeded random number generator for the link model.
//!
//! The model must be reproducible (a test that fails prints its seed and can
//! be replayed) and cheap per segment, so it carries its own generator rather
//! than pulling in `rand`: SplitMix64, which passes BigCrush and needs one
//! word of state. It is not for anything security-related.

/// A SplitMix64 generator. Every stage owns one, seeded from the link seed
/// and its own salt, so adding a stage does not shift another's sequence.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator whose sequence depends only on `seed` and `salt`.
    pub fn new(seed: u64, salt: u64) -> Rng {
        let mut rng = Rng {
            state: seed ^ salt.wrapping_mul(0xA076_1D64_78BD_642F),
        };
        // Discard one output so that nearby seeds do not start alike.
        rng.next_u64();
        rng
    }

    /// The next 64 uniformly distributed bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform float in [0, 1) with 53 bits of precision.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `p` (clamped to [0, 1]).
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (p >= 1.0 || self.next_f64() < p)
    }

    /// A uniform integer in [0, n); `n` must be non-zero.
    pub fn below(&mut self, n: u64) -> u64 {
        // Multiply-shift: unbiased enough for n far below 2^64 (bit positions
        // in a packet), and branch-free.
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence_and_salts_differ() {
        let mut a = Rng::new(7, 1);
        let mut b = Rng::new(7, 1);
        let mut c = Rng::new(7, 2);
        let xa: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let xb: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        let xc: Vec<u64> = (0..8).map(|_| c.next_u64()).collect();
        assert_eq!(xa, xb);
        assert_ne!(xa, xc);
    }

    #[test]
    fn floats_are_uniform_enough() {
        let mut r = Rng::new(42, 0);
        let n = 200_000;
        let mut buckets = [0u32; 10];
        for _ in 0..n {
            let x = r.next_f64();
            assert!((0.0..1.0).contains(&x));
            buckets[(x * 10.0) as usize] += 1;
        }
        for b in buckets {
            // Expected 20,000 each; 5 sigma is about 670.
            assert!((b as i64 - 20_000).abs() < 700, "{buckets:?}");
        }
    }

    #[test]
    fn below_stays_in_range() {
        let mut r = Rng::new(3, 3);
        for n in [1u64, 2, 12_000, 523_776] {
            for _ in 0..1000 {
                assert!(r.below(n) < n);
            }
        }
    }
}
