//! The performance-marker parser of `fatpipe copy URL URL` (what an HTTP
//! third-party copy's active end streams back) on arbitrary bytes, fed in
//! arbitrary pieces: no panic, bounded state, and what it keeps within
//! its caps.
#![no_main]

use fatpipe_http::tpc::markers::{Parser, MAX_REMOTE};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut p = Parser::new();
    // The first byte picks the piece size: the stream arrives in frames.
    let step = usize::from(data.first().copied().unwrap_or(1)).max(1);
    for piece in data.chunks(step) {
        p.feed(piece);
    }
    p.finish();
    assert!(p.progress.remote.len() <= MAX_REMOTE);
    assert!(p.progress.remote.iter().all(|r| r.chars().count() <= 64));
});
