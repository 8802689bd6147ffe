//! The HTTP port's `Range` decoder on arbitrary header values and file
//! sizes: every range it returns lies within the file, and there are never
//! more than it serves.
#![no_main]

use fatpipe_http::range::{parse, Ranges, MAX_RANGES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((size_bytes, value)) = data.split_at_checked(8) else {
        return;
    };
    let mut b = [0u8; 8];
    b.copy_from_slice(size_bytes);
    // Small sizes as often as huge ones.
    let size = if b[0] & 1 == 0 {
        u64::from(b[1])
    } else {
        u64::from_le_bytes(b)
    };
    if let Ranges::Partial(v) = parse(value, size) {
        assert!(!v.is_empty() && v.len() <= MAX_RANGES);
        for (a, z) in v {
            assert!(a <= z && z < size, "{a}-{z} of {size}");
        }
    }
});
