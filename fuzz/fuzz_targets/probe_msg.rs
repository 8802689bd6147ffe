//! The probe service's decoders on arbitrary bytes: UDP probe datagrams,
//! control messages and open parameters. Whatever decodes must re-encode
//! to something that decodes to the same value.
#![no_main]

use fatpipe_tune::probe::wire::{Packet, ProbeMsg, ProbeParams};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = Packet::decode(data) {
        let mut wire = Vec::new();
        // Re-encoded at the input's length, so padded kinds keep their size.
        p.encode(&mut wire, data.len());
        assert_eq!(Packet::decode(&wire).expect("re-encoded packet decodes"), p);
        let mut bare = Vec::new();
        p.encode(&mut bare, 0);
        assert_eq!(bare.len(), p.header_len());
    }
    if let Ok(m) = ProbeMsg::decode(data) {
        let again = ProbeMsg::decode(&m.encode()).expect("re-encoded message decodes");
        assert_eq!(again, m);
    }
    if let Ok(p) = ProbeParams::decode(data) {
        assert_eq!(ProbeParams::decode(&p.encode()).expect("params decode"), p);
    }
});
