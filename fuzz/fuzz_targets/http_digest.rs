//! `Want-Digest` (RFC 3230) and `Want-Repr-Digest` (RFC 9530) decoders,
//! and the kept checksum record, on arbitrary bytes: no panic, and what
//! they pick is an algorithm the server computes under a name the client
//! sent.
#![no_main]

use fatpipe_http::digest::{sent_digests, want_digest, want_repr_digest, Algo, Sums};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for w in [want_digest(data), want_repr_digest(data)].into_iter().flatten() {
        assert_eq!(Algo::from_name(&w.name), Some(w.algo));
        let text = String::from_utf8_lossy(data).to_ascii_lowercase();
        assert!(text.contains(&w.name));
    }
    let _ = Sums::from_record(data, (0, 0, 0));
    let (a, b) = data.split_at(data.len() / 2);
    for (algo, raw) in sent_digests(Some(a), Some(b)) {
        let want = match algo {
            Algo::Adler32 | Algo::Crc32c => 4,
            Algo::Md5 => 16,
            Algo::Sha256 => 32,
        };
        assert_eq!(raw.len(), want);
    }
});
