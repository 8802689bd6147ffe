//! The server's TLS identity, derived from the pre-shared key.
//!
//! Both ends compute the same thing from the PSK alone: an Ed25519 seed
//! (HKDF-SHA256 with a label of its own, so it never equals a key the HMAC
//! handshake uses), the key pair's PKCS#8 v1 document (RFC 8410), and a
//! self-signed certificate over it whose every field is fixed (serial,
//! names, validity), so the DER is a function of the PSK. The server
//! presents the certificate; the client accepts exactly those bytes.
//! Ed25519 signatures are deterministic, which is what makes the
//! certificate's bytes reproducible.

use ring::hkdf;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::tls::TlsError;

/// The server identity derived from one pre-shared key.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The self-signed certificate (DER) the server presents.
    pub cert: CertificateDer<'static>,
    pkcs8: Vec<u8>,
}

impl Identity {
    /// Derives the identity of `psk` (the bytes of `--key-file`).
    pub fn derive(psk: &[u8]) -> Result<Identity, TlsError> {
        let seed = ed25519_seed(psk);
        let pkcs8 = pkcs8_v1(&seed);
        let key = rcgen::KeyPair::from_pkcs8_der_and_sign_algo(
            &PrivatePkcs8KeyDer::from(pkcs8.clone()),
            &rcgen::PKCS_ED25519,
        )
        .map_err(|e| TlsError::Identity(e.to_string()))?;
        let mut params = rcgen::CertificateParams::new(vec![SERVER_NAME.to_string()])
            .map_err(|e| TlsError::Identity(e.to_string()))?;
        params.serial_number = Some(rcgen::SerialNumber::from(vec![1u8]));
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(9999, 12, 31);
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::CommonName, "fatpipe pre-shared key");
        params.distinguished_name = dn;
        let cert = params
            .self_signed(&key)
            .map_err(|e| TlsError::Identity(e.to_string()))?;
        Ok(Identity {
            cert: cert.der().clone(),
            pkcs8,
        })
    }

    /// The private key, for the server's rustls config.
    pub fn private_key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.pkcs8.clone()))
    }
}

/// The name the client asks for and the certificate carries; nothing is
/// resolved by it (the verifier matches the whole certificate).
pub const SERVER_NAME: &str = "fatpipe";

/// HKDF-SHA256 of the PSK, with a label of its own, to a 32-byte seed.
pub fn ed25519_seed(psk: &[u8]) -> [u8; 32] {
    let salt = hkdf::Salt::new(hkdf::HKDF_SHA256, b"fatpipe tls 1.3 server identity v1");
    let prk = salt.extract(psk);
    let mut seed = [0u8; 32];
    let info: [&[u8]; 1] = [b"ed25519 seed"];
    // A 32-byte output is far below HKDF-SHA256's limit (255 × 32), so
    // neither step can fail.
    if let Ok(okm) = prk.expand(&info, Seed) {
        let _ = okm.fill(&mut seed);
    }
    seed
}

/// The PKCS#8 v1 document of an Ed25519 private key (RFC 8410 §10.3): a
/// fixed 16-byte prefix (version 0, algorithm id-Ed25519, an OCTET STRING
/// holding the 32-byte CurvePrivateKey) and the seed.
pub fn pkcs8_v1(seed: &[u8; 32]) -> Vec<u8> {
    const PREFIX: [u8; 16] = [
        0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    let mut doc = Vec::with_capacity(48);
    doc.extend_from_slice(&PREFIX);
    doc.extend_from_slice(seed);
    doc
}

struct Seed;

impl hkdf::KeyType for Seed {
    fn len(&self) -> usize {
        32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{Ed25519KeyPair, KeyPair};

    #[test]
    fn seed_is_deterministic_and_depends_on_the_key() {
        assert_eq!(ed25519_seed(b"key one!"), ed25519_seed(b"key one!"));
        assert_ne!(ed25519_seed(b"key one!"), ed25519_seed(b"key two!"));
        assert_ne!(ed25519_seed(b"key one!"), [0u8; 32]);
    }

    #[test]
    fn pkcs8_document_is_the_seeds_key_pair() {
        let seed = ed25519_seed(b"some pre-shared key");
        let from_doc = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&pkcs8_v1(&seed)).unwrap();
        let from_seed = Ed25519KeyPair::from_seed_unchecked(&seed).unwrap();
        assert_eq!(
            from_doc.public_key().as_ref(),
            from_seed.public_key().as_ref()
        );
    }

    #[test]
    fn certificate_is_a_function_of_the_key() {
        let a = Identity::derive(b"some pre-shared key").unwrap();
        let b = Identity::derive(b"some pre-shared key").unwrap();
        let c = Identity::derive(b"another shared key").unwrap();
        assert_eq!(a.cert, b.cert);
        assert_ne!(a.cert, c.cert);
        // The certificate carries the derived public key.
        let seed = ed25519_seed(b"some pre-shared key");
        let pair = Ed25519KeyPair::from_seed_unchecked(&seed).unwrap();
        let public = pair.public_key().as_ref();
        assert!(a.cert.windows(public.len()).any(|w| w == public));
    }
}
