//! The server and client state machines fed arbitrary peer bytes: they must
//! never panic, and must never report an established session to a peer
//! that did not prove the key.
#![no_main]

use std::time::{Duration, Instant};

use fatpipe_proto::{
    ClientConfig, ClientConn, ClientEvent, Key, ServerConfig, ServerConn, ServerEvent,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let now = Instant::now();
    let keyed = mode & 1 == 1;
    let key = keyed.then(|| Key::new(*b"fuzzing-key-123").expect("key"));
    let chunk = usize::from(mode >> 1).max(1);

    let mut s = ServerConn::new(
        &ServerConfig {
            key: key.clone(),
            preauth_timeout: Duration::from_secs(5),
            keyless_services: vec!["copy".into()],
            tickets: None,
        },
        now,
        [7; 32],
    );
    for piece in rest.chunks(chunk) {
        s.handle_input(now, piece);
        while let Some(ev) = s.poll_event() {
            // Random bytes cannot produce a valid HMAC over our nonce.
            if keyed {
                // Only a keyless service may open without the proof.
                if let ServerEvent::Open {
                    service,
                    authenticated,
                    ..
                } = &ev
                {
                    assert!(!authenticated, "authenticated without proof");
                    assert_eq!(service, "copy", "open without proof");
                }
            }
            if let ServerEvent::Open { .. } = ev {
                s.accept(now, [1; 32]);
            }
            if let ServerEvent::DataHello { .. } = ev {
                s.attach();
            }
        }
        while s.poll_transmit().is_some() {}
    }
    s.handle_timeout(now + Duration::from_secs(6));

    let mut c = ClientConn::new(
        ClientConfig {
            key,
            service: "test".into(),
            params: Vec::new(),
            handshake_timeout: Duration::from_secs(5),
        },
        now,
        [9; 32],
    );
    for piece in rest.chunks(chunk) {
        c.handle_input(now, piece);
        while let Some(ev) = c.poll_event() {
            if keyed {
                assert!(
                    !matches!(ev, ClientEvent::Established { .. }),
                    "established without the server's proof"
                );
            }
        }
        while c.poll_transmit().is_some() {}
    }
});
