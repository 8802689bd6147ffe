//! What the HTTP client decodes from a server's headers — `Digest` (RFC
//! 3230), `Repr-Digest` (RFC 9530) and `Content-Range` — and from its
//! `PROPFIND` answers (`copy -r URL`) on arbitrary bytes: no panic, every
//! checksum has its algorithm's length, a range is ordered and within the
//! size it names, and a listed name is one plain segment.
#![no_main]

use fatpipe_http::client::list::{child_name, parse_multistatus};
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
    if let Ok(listed) = parse_multistatus(data) {
        for l in listed {
            if let Some(name) = child_name(b"/e/d/", &l.href) {
                assert!(!name.is_empty() && !name.contains(&b'/') && !name.contains(&0));
                assert!(name != b"." && name != b"..");
            }
        }
    }
});
