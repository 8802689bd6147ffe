//! The TLS record opener (`fatpipe_secure::record::Opener`, what an
//! encrypted connection reads before anything is authenticated) on
//! arbitrary bytes split at arbitrary points, and on valid records with
//! one byte changed: it never panics, never hands out more than a record's
//! content at a time, and a changed record never yields content that was
//! not sealed. With `mode & 4` the content is passed over
//! (`Opener::discard`, a throughput test's receiver) instead of copied
//! out: the same bounds hold on its length.
#![no_main]

use fatpipe_secure::record::{Opener, Sealer, MAX_CONTENT};
use libfuzzer_sys::fuzz_target;
use rustls::crypto::cipher::{AeadKey, Iv};
use rustls::ConnectionTrafficSecrets;

fn secrets() -> ConnectionTrafficSecrets {
    ConnectionTrafficSecrets::Aes256Gcm {
        key: AeadKey::from([7u8; 32]),
        iv: Iv::from([9u8; 12]),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&[chunk, mode, at_hi, at_lo], rest)) = data.split_first_chunk::<4>() else {
        return;
    };
    let chunk = usize::from(chunk).max(1);
    let (wire, sealed) = if mode & 1 == 0 {
        (rest.to_vec(), None)
    } else {
        // Valid records of `rest`, one byte changed if `mode & 2`.
        let mut wire = Vec::new();
        let Ok(mut sealer) = Sealer::new(&secrets(), 0) else {
            return;
        };
        if sealer.seal(rest, &mut wire).is_err() {
            return;
        }
        if mode & 2 != 0 && !wire.is_empty() {
            let at = usize::from(u16::from_be_bytes([at_hi, at_lo])) % wire.len();
            wire[at] ^= mode | 1;
        }
        (wire, Some(rest))
    };
    let Ok(mut opener) = Opener::new(&secrets(), 0) else {
        return;
    };
    let mut got = Vec::new();
    let mut discarded = 0usize;
    let discard = mode & 4 != 0;
    let mut fed = 0;
    let mut out = vec![0u8; 3 * MAX_CONTENT];
    loop {
        let r = if discard {
            opener.discard(out.len())
        } else {
            opener.read(&mut out)
        };
        match r {
            Ok(Some(0)) | Err(_) => break,
            Ok(Some(n)) => {
                assert!(n <= MAX_CONTENT);
                if discard {
                    discarded += n;
                } else {
                    got.extend_from_slice(&out[..n]);
                }
            }
            Ok(None) if fed == wire.len() => break,
            Ok(None) => {
                let spare = opener.spare();
                assert!(!spare.is_empty());
                let n = chunk.min(wire.len() - fed).min(spare.len());
                spare[..n].copy_from_slice(&wire[fed..fed + n]);
                opener.filled(n);
                fed += n;
            }
        }
    }
    if let Some(sealed) = sealed {
        // Whatever was opened is a prefix of what was sealed.
        assert!(sealed.starts_with(&got));
        assert!(discarded <= sealed.len());
    }
});
