//! The server name (SNI) of a `ClientHello` as the protocol port reads it
//! for a one-time ticket's id (`<32 hex>.ticket.fatpipe`, the encrypted
//! leg of an `https` third-party copy), on arbitrary strings: no panic,
//! and an id it accepts names itself again.
#![no_main]

use fatpipe_secure::ticket::{parse_name, server_name};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(name) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(id) = parse_name(name) {
        assert!(name.len() == server_name(&id).len());
        assert_eq!(parse_name(&server_name(&id)), Some(id));
    }
});
