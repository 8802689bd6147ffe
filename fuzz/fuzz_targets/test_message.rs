//! The test service's messages and parameters on arbitrary bytes.
#![no_main]

use fatpipe_proto::testmsg::{TestMsg, TestParams};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = TestMsg::decode(data) {
        for part in msg.split() {
            assert!(part.encode().len() <= fatpipe_proto::MAX_PAYLOAD);
        }
    }
    if let Ok(p) = TestParams::decode(data) {
        if p.validate().is_ok() {
            assert!(p.streams >= 1 && p.total_streams() <= 2 * 1024);
        }
    }
});
