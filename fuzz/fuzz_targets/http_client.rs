//! What the HTTP client decodes from a server's headers — `Digest` (RFC
//! 3230), `Repr-Digest` (RFC 9530) and `Content-Range` — on arbitrary
//! bytes: no panic, every checksum has its algorithm's length, and a
//! range is ordered and within the size it names.
#![no_main]

use fatpipe_http::client::parse_content_range;
use fatpipe_http::digest::{parse_digest, parse_repr_digest};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for (algo, raw) in parse_digest(data).into_iter().chain(parse_repr_digest(data)) {
        assert_eq!(raw.len(), algo.raw_len());
    }
    if let Some((first, last, size)) = parse_content_range(data) {
        assert!(first <= last);
        if let Some(n) = size {
            assert!(last < n);
        }
    }
});
