//! The UDP test's datagram receive path (`engine::dataplane::udp`) on
//! arbitrary datagrams and arrival times: every sequence number and send
//! time is the peer's choice. The input is a run of records, each a
//! length byte, an 8-byte arrival time and that many datagram bytes.
//! Nothing may panic (issue 34: `seq + 1` on `u64::MAX`), and the totals
//! must stay consistent: only datagrams with a full header count, every
//! counted one is either in order or late, an in-order one moves the front
//! by at least one, and jitter is a finite, non-negative number.
#![no_main]

use fatpipe_engine::dataplane::udp::{UdpReceiver, UdpTotals, UDP_HEADER};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut rx = UdpReceiver::new();
    let mut rest = data;
    let mut counted = 0u64;
    while let Some((&len, tail)) = rest.split_first() {
        let Some((now, tail)) = tail.split_first_chunk::<8>() else {
            break;
        };
        let take = usize::from(len).min(tail.len());
        let (d, tail) = tail.split_at(take);
        let before = rx.totals();
        let took = rx.handle_datagram(d, u64::from_le_bytes(*now));
        assert_eq!(took, d.len() >= UDP_HEADER);
        counted += u64::from(took);
        let after = rx.totals();
        assert!(after.expected >= before.expected);
        if took {
            let late = after.out_of_order - before.out_of_order;
            let moved = after.expected - before.expected;
            assert!(late == 1 || moved >= 1 || before.expected == u64::MAX);
        }
        rest = tail;
    }
    let t = rx.totals();
    assert_eq!(t.packets, counted);
    assert!(t.out_of_order <= t.packets);
    if t.expected < u64::MAX {
        assert!(t.packets - t.out_of_order <= t.expected);
    }
    assert!(t.lost_since(&UdpTotals::default()) <= t.expected);
    assert!(t.jitter_us.is_finite() && t.jitter_us >= 0.0);
});
