//! The `Fatpipe-Ticket` answer header the active end of a third-party
//! copy reads from a passive fatpipe server (the leg's one-time ticket),
//! on arbitrary bytes: no panic, anything beyond the cap refused, and
//! what it accepts survives its own encoding.
#![no_main]

use fatpipe_http::ticket::{Offer, MAX_OFFER};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match Offer::parse(data) {
        Ok(o) => {
            assert!(data.len() <= MAX_OFFER);
            assert!(o.port != 0 && !o.export.is_empty() && !o.path.is_empty());
            assert_eq!(Offer::parse(o.header().as_bytes()), Ok(o));
        }
        Err(why) => assert!(!why.is_empty()),
    }
});
