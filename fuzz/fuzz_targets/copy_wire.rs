//! The copy protocol's decoders on arbitrary bytes: control frames (through
//! the same length-checked reader the sessions use), chunk headers and
//! connection hellos. Nothing may panic or allocate past the frame cap, and
//! whatever decodes must re-encode to the same message. The messages of a
//! growing session (`AddStreams`, `StreamsAdded`, `SetCongestion`, `Stats`,
//! and `Accept`'s congestion list) and the sender's `Notes` must also
//! respect their own caps.
#![no_main]

use fatpipe_transfer::wire::{
    read_msg, ChunkHeader, Hello, Msg, HEADER_LEN, MAX_CONGESTION_NAME, MAX_CONGESTION_NAMES,
    MAX_FRAME, MAX_NOTES, MAX_TEXT,
};
use libfuzzer_sys::fuzz_target;

/// The caps the decoder promises for the session-growing messages and notes.
fn check_caps(msg: &Msg) {
    match msg {
        Msg::Accept(a) => {
            assert!(a.congestion.len() <= MAX_CONGESTION_NAME);
            assert!(a.congestion_allowed.len() <= MAX_CONGESTION_NAMES);
            assert!(a
                .congestion_allowed
                .iter()
                .all(|c| c.len() <= MAX_CONGESTION_NAME));
        }
        Msg::SetCongestion { name } => assert!(name.len() <= MAX_CONGESTION_NAME),
        Msg::Stats(st) => assert!(st.congestion.len() <= MAX_CONGESTION_NAME),
        Msg::Notes(notes) => {
            assert!(notes.len() <= MAX_NOTES + 1);
            assert!(notes
                .iter()
                .all(|n| n.path.len() <= MAX_TEXT && n.detail.len() <= MAX_TEXT));
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    // A payload decoded directly.
    if let Ok(msg) = Msg::decode(data) {
        check_caps(&msg);
        let mut wire = Vec::new();
        msg.encode(&mut wire);
        assert!(wire.len() - 4 <= data.len().min(MAX_FRAME));
        assert_eq!(Msg::decode(&wire[4..]).expect("re-decodes"), msg);
    }
    // A stream of frames, as a session reads them.
    let mut r = data;
    while let Ok(msg) = read_msg(&mut r) {
        check_caps(&msg);
        let mut wire = Vec::new();
        msg.encode(&mut wire);
        assert_eq!(Msg::decode(&wire[4..]).expect("re-decodes"), msg);
    }
    // Chunk headers and hellos at every offset.
    for w in data.windows(HEADER_LEN).take(64) {
        let mut b = [0u8; HEADER_LEN];
        b.copy_from_slice(w);
        if let Ok(h) = ChunkHeader::decode(&b) {
            assert_eq!(ChunkHeader::decode(&h.encode()).expect("re-decodes"), h);
        }
        let mut hello = [0u8; 8];
        hello.copy_from_slice(&w[..8]);
        if let Ok(h) = Hello::decode(&hello) {
            assert_eq!(h.encode(), hello);
        }
    }
});
