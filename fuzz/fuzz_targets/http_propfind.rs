//! The PROPFIND request checks (`Depth`, the body) on arbitrary bytes: no
//! panic, and a body over the cap is always refused.
#![no_main]

use fatpipe_http::dav::{check_body, depth};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = depth(Some(data));
    let cap = 64;
    let r = check_body(data, cap);
    if data.len() > cap {
        assert!(r.is_err());
    }
});
