//! iperf3's control-message decoders on arbitrary bytes: the first byte
//! picks the order in which states, cookies and capped JSON documents are
//! expected (as the two ends do), the rest arrives in pieces of varying
//! size. The reader never holds more than one capped message, and every
//! document that parses as parameters or results re-encodes to one that
//! parses to the same value.
#![no_main]

use fatpipe_iperf3::data::read_header;
use fatpipe_iperf3::wire::{Expect, Msg, Params, Reader, Results, COOKIE_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&plan, rest)) = data.split_first() else {
        return;
    };
    let cap = 64 + usize::from(plan) * 16;
    let mut r = Reader::new();
    let mut i = 0usize;
    let mut step = 0u32;
    while i < rest.len() {
        let expect = match (plan >> (step % 4 * 2)) & 3 {
            0 => Expect::State,
            1 => Expect::Json(cap),
            2 => Expect::Cookie,
            _ => Expect::Json(8192),
        };
        let n = r.wanted(expect).min(1 + usize::from(rest[i]) % 97).min(rest.len() - i);
        r.push(&rest[i..i + n]);
        i += n;
        assert!(r.buffered() <= 9 + 4 + 8192 + COOKIE_LEN, "reader grew past one message");
        match r.next(expect) {
            Ok(Some(Msg::Json(doc))) => {
                assert!(!doc.is_empty() && doc.len() <= cap.max(8192));
                step += 1;
            }
            Ok(Some(_)) => step += 1,
            Ok(None) => {}
            Err(_) => return,
        }
    }
    if let Ok(p) = Params::parse(rest) {
        let _ = p.check();
        let again = Params::parse(p.to_json().to_string().as_bytes()).expect("re-encoded params parse");
        assert_eq!(again.parallel, p.parallel);
        assert_eq!(again.reverse, p.reverse);
        assert_eq!(again.len, p.len);
    }
    if let Ok(res) = Results::parse(rest) {
        let again = Results::parse(res.to_json().to_string().as_bytes()).expect("re-encoded results parse");
        assert_eq!(again.streams.len(), res.streams.len());
    }
    let _ = read_header(rest, plan & 1 == 1);
});
