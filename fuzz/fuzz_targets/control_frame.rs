//! The frame decoder and message decoder on arbitrary bytes, split at
//! arbitrary points. Whatever decodes must re-encode to the same message.
#![no_main]

use fatpipe_proto::{FrameDecoder, Message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks a chunk size, so splits are explored too.
    let Some((&chunk, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk).max(1);
    let mut d = FrameDecoder::new();
    for piece in rest.chunks(chunk) {
        d.push(piece);
        loop {
            match d.next_frame() {
                Ok(Some(body)) => {
                    assert!(body.len() <= fatpipe_proto::MAX_FRAME);
                    if let Ok(msg) = Message::decode(&body) {
                        let mut wire = Vec::new();
                        msg.encode(&mut wire).expect("a decoded message re-encodes");
                        let mut again = FrameDecoder::new();
                        again.push(&wire);
                        let body2 = again.next_frame().expect("frame").expect("complete");
                        assert_eq!(Message::decode(&body2).expect("decodes"), msg);
                    }
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
    // Plain message decoding of the raw input, too.
    let _ = Message::decode(rest);
});
