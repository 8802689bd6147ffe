//! The probe service's decoders on arbitrary bytes: UDP probe datagrams,
//! control messages and open parameters. Whatever decodes must re-encode
//! to something that decodes to the same value, and a reverse session's
//! `SendTrains` that decodes must be within the caps the server relies on
//! (train numbers below 64, the length, packet size and gap limits). The
//! packed binary train report decodes from the same bytes, and every message
//! round-trips through both encodings.
#![no_main]

use fatpipe_probe::wire::{
    Packet, ProbeMsg, ProbeParams, MAX_COLLECT_WAIT_MS, MAX_GAP_US, MAX_REVERSE_PACKET, MAX_TRAINS,
    MAX_TRAIN_LEN, MIN_REVERSE_PACKET,
};
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
        let packed = ProbeMsg::decode(&m.encode_packed()).expect("packed message decodes");
        assert_eq!(packed, m);
        match m {
            ProbeMsg::SendTrains {
                first,
                count,
                len,
                size,
                gap_us,
                ..
            } => {
                assert!(count >= 1 && u64::from(first) + u64::from(count) <= u64::from(MAX_TRAINS));
                assert!(len >= 1 && len <= MAX_TRAIN_LEN);
                assert!((MIN_REVERSE_PACKET..=MAX_REVERSE_PACKET).contains(&size));
                assert!(gap_us <= MAX_GAP_US);
            }
            ProbeMsg::Train { train, arrivals } => {
                assert!(train < MAX_TRAINS && arrivals.len() <= MAX_TRAIN_LEN as usize);
            }
            ProbeMsg::Collect { wait_for, wait_ms } => {
                assert!(wait_for.is_none_or(|t| t < MAX_TRAINS) && wait_ms <= MAX_COLLECT_WAIT_MS);
            }
            ProbeMsg::Sent { trains } => {
                assert!(trains.len() <= MAX_TRAINS as usize);
                assert!(trains
                    .iter()
                    .all(|t| t.0 < MAX_TRAINS && t.1 <= MAX_TRAIN_LEN));
            }
            _ => {}
        }
    }
    if let Ok(p) = ProbeParams::decode(data) {
        assert_eq!(ProbeParams::decode(&p.encode()).expect("params decode"), p);
    }
});
