//! What the HTTP client decodes from a server's headers — `Digest` (RFC
//! 3230), `Repr-Digest` (RFC 9530) and `Content-Range` — on arbitrary
//! bytes: no panic, every checksum has its algorithm's length, and a
//! range is ordered and within the size it names.
#![no_main]

use fatpipe_http::client::{parse_content_range, parse_digest, parse_repr_digest};
use fatpipe_http::digest::Algo;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for (algo, raw) in parse_digest(data).into_iter().chain(parse_repr_digest(data)) {
        let want = match algo {
            Algo::Adler32 | Algo::Crc32c => 4,
            Algo::Md5 => 16,
            Algo::Sha256 => 32,
        };
        assert_eq!(raw.len(), want);
    }
    if let Some((first, last, size)) = parse_content_range(data) {
        assert!(first <= last);
        if let Some(n) = size {
            assert!(last < n);
        }
    }
});
