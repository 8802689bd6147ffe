//! The bearer-token verifier on arbitrary strings: no panic, and nothing
//! but a token signed with the server's key is accepted (the fuzzer cannot
//! forge an HMAC-SHA256 tag). Scope parsing never yields a path that
//! climbs.
#![no_main]

use fatpipe_http::token::{Scope, Verifier};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let v = Verifier::new(b"fuzzing key of some length", vec!["fatpipe".into()]);
    assert!(v.verify(&text, 1_000_000).is_err());
    for word in text.split_ascii_whitespace() {
        if let Some(s) = Scope::parse(word) {
            assert!(s.path.starts_with('/'));
            assert!(!s.path.split('/').any(|c| c == ".." || c == "."));
        }
    }
});
