//! The `--metrics` listener's request parser and the probe's query reader
//! on arbitrary bytes, fed as a peer would send them: growing by pieces.
#![no_main]

use fatpipe_metrics::http::{parse_request, MAX_REQUEST};
use fatpipe_metrics::probe::{params, parse_query};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk).max(1);
    let mut end = 0;
    while end < rest.len().min(MAX_REQUEST) {
        end = (end + chunk).min(rest.len()).min(MAX_REQUEST);
        match parse_request(&rest[..end]) {
            Ok(Some(req)) => {
                if let Ok(q) = parse_query(&req.query) {
                    assert!(!q.target.is_empty());
                    let _ = params(&q);
                }
                return;
            }
            Ok(None) => {}
            Err(_) => return,
        }
    }
});
