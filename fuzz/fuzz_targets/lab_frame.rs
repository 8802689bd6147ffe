//! The lab forwarder's frame handling on arbitrary bytes: a TUN device
//! hands over what any process in a lab namespace sends (raw and packet
//! sockets can put any IP packet, and any virtio-net header, in front of
//! it). Parsing the header, the layout of a TCP or UDP GSO super-packet,
//! cutting every segment, and a pipe with loss and bit errors (so the cut
//! and checksum paths run) must never panic, and each cut segment must be
//! exactly as long as the layout says.
#![no_main]

use std::cell::RefCell;

use fatpipe_lab::model::DirConfig;
use fatpipe_lab::packet::{Layout, VnetHdr, VNET_HDR_LEN};
use fatpipe_lab::pipe::{Pipe, MAX_FRAME};
use libfuzzer_sys::fuzz_target;

thread_local! {
    // One pipe for the whole run: its backlog ring is tens of MB.
    static PIPE: RefCell<Pipe> = RefCell::new(Pipe::new(&DirConfig {
        loss: 0.3,
        ber: 1e-4,
        seed: 1,
        ..DirConfig::default()
    }));
}

fuzz_target!(|data: &[u8]| {
    let data = &data[..data.len().min(MAX_FRAME)];
    if let Some(hdr) = VnetHdr::parse(data) {
        let pkt = &data[VNET_HDR_LEN..];
        if let Some(l) = Layout::of(&hdr, pkt) {
            let n = l.segments();
            assert!(n >= 2 && n <= pkt.len());
            // The first, a middle and the last segment are enough to reach
            // every branch; a 1-byte gso_size makes tens of thousands.
            for i in [0, n / 2, n - 1] {
                let mut out = vec![0u8; VNET_HDR_LEN + l.wire_len(i)];
                assert_eq!(l.write_segment(pkt, i, &mut out), out.len());
            }
        }
    }
    PIPE.with(|p| {
        let mut p = p.borrow_mut();
        if let Some(slot) = p.slot() {
            slot[..data.len()].copy_from_slice(data);
            p.admit(0, data.len());
        }
        while let Some((_, due)) = p.front() {
            p.delivered(due, true);
        }
    });
});
