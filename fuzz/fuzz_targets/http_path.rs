//! Request-path and `Destination` decoding on arbitrary strings: no panic,
//! and no decoded path ever holds a component that climbs or a NUL.
#![no_main]

use fatpipe_http::path::{destination, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(t) = parse(&text) {
        if let Some(r) = &t.rel {
            let b = r.as_bytes();
            assert!(!b.contains(&0));
            assert!(!b.split(|&c| c == b'/').any(|c| c == b".." || c == b"." || c.is_empty()));
        }
        if let Some(e) = &t.export {
            assert!(!e.contains('/') && e != ".." && !e.is_empty());
        }
    }
    let _ = destination(data);
});
