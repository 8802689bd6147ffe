//! The test service's messages and parameters on arbitrary bytes, and the
//! server's checks of the mid-test messages (`add_streams`,
//! `set_congestion`) on whatever decoded.
#![no_main]

use fatpipe_memtest::msg::{
    check_congestion_name, Direction, Protocol, TestMsg, TestParams, MAX_STREAMS,
};
use libfuzzer_sys::fuzz_target;

fn both_ways() -> TestParams {
    TestParams {
        protocol: Protocol::Tcp,
        streams: 4,
        direction: Direction::Both,
        duration_ms: 1000,
        bytes: None,
        omit_ms: 0,
        interval_ms: 1000,
        window: None,
        force_buffers: false,
        start_window: None,
        mss: None,
        congestion: None,
        fq_rate: None,
        zerocopy: false,
        length: 65536,
        bitrate: 0,
        no_batch: false,
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = TestMsg::decode(data) {
        match &msg {
            TestMsg::AddStreams(add) => {
                if both_ways().check_add(8, 4, 4, add).is_ok() {
                    assert_eq!(add.first, 8);
                    assert!(add.count() >= 1);
                    assert!(4 + add.up <= MAX_STREAMS && 4 + add.down <= MAX_STREAMS);
                }
            }
            TestMsg::SetCongestion { name } => {
                if check_congestion_name(name).is_ok() {
                    assert!(!name.is_empty() && name.len() < 16);
                }
            }
            _ => {}
        }
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
