//! iperf3's `authtoken` as a server with RSA authentication checks it, on
//! arbitrary bytes: once as the token text (base64, capped), once as the
//! ciphertext itself (decryption in both paddings, the credentials'
//! format, the clock, the user table). Every outcome is Ok or a refusal;
//! nothing panics or allocates beyond the cap.
#![no_main]

use std::sync::OnceLock;

use fatpipe_iperf3::auth::Authorizer;
use libfuzzer_sys::fuzz_target;

fn server() -> &'static Authorizer {
    static S: OnceLock<Authorizer> = OnceLock::new();
    S.get_or_init(|| Authorizer::ephemeral(&[("mario", "rossi")], 10).expect("a key"))
}

fuzz_target!(|data: &[u8]| {
    let s = server();
    let _ = s.check(Some(&String::from_utf8_lossy(data)), 0);
    let _ = s.check_sealed(data, 0);
});
