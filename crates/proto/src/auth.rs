//! Pre-shared-key proofs: HMAC-SHA256 challenge–response in both directions.
//!
//! Each side sends a fresh random nonce; each proves the key by a MAC over
//! both nonces with a label naming its role, so a proof can neither be
//! replayed in another session (the other side's nonce is new) nor reflected
//! back at its sender (the labels differ). The key itself never crosses the
//! wire. Verification uses the `hmac` crate's constant-time comparison.

use hmac::{Hmac, Mac as _};
use sha2::Sha256;

use crate::message::{Mac, Nonce, TicketId};

/// A pre-shared key, or a one-time ticket's key with the ticket's id
/// ([`Key::ticket`]: the client then proves it with `TicketAuth`). Its
/// bytes are not printed by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Key(Vec<u8>, Option<TicketId>);

/// The key is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// A key shorter than this protects nothing worth protecting.
    #[error("the key is {0} bytes; use at least {MIN_KEY_LEN} (e.g. `head -c 32 /dev/urandom | base64 > key`)")]
    TooShort(usize),
}

/// The shortest key accepted.
pub const MIN_KEY_LEN: usize = 8;

const CLIENT_LABEL: &[u8] = b"fatpipe/1 client";
const SERVER_LABEL: &[u8] = b"fatpipe/1 server";

impl Key {
    /// A key from its bytes (e.g. a key file's contents, trimmed).
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Key, KeyError> {
        let bytes = bytes.into();
        if bytes.len() < MIN_KEY_LEN {
            return Err(KeyError::TooShort(bytes.len()));
        }
        Ok(Key(bytes, None))
    }

    /// A ticket's key (32 random bytes the issuer drew) with its id: a
    /// client holding it proves it with `TicketAuth` instead of
    /// `ClientAuth` (docs/protocol.md, "Tickets").
    pub fn ticket(id: TicketId, bytes: impl Into<Vec<u8>>) -> Result<Key, KeyError> {
        let mut k = Key::new(bytes)?;
        k.1 = Some(id);
        Ok(k)
    }

    /// The ticket's id, for a ticket's key.
    pub fn ticket_id(&self) -> Option<&TicketId> {
        self.1.as_ref()
    }

    /// The key's bytes (the TLS identity of `--encrypt` is derived from
    /// them, under a label of its own).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The client's proof: covers the server's nonce first.
    pub fn client_proof(&self, server_nonce: &Nonce, client_nonce: &Nonce) -> Mac {
        self.mac(CLIENT_LABEL, server_nonce, client_nonce)
    }

    /// The server's proof: covers the client's nonce first.
    pub fn server_proof(&self, client_nonce: &Nonce, server_nonce: &Nonce) -> Mac {
        self.mac(SERVER_LABEL, client_nonce, server_nonce)
    }

    /// Checks a client's proof in constant time.
    pub fn verify_client(&self, server_nonce: &Nonce, client_nonce: &Nonce, mac: &Mac) -> bool {
        self.verify(CLIENT_LABEL, server_nonce, client_nonce, mac)
    }

    /// Checks a server's proof in constant time.
    pub fn verify_server(&self, client_nonce: &Nonce, server_nonce: &Nonce, mac: &Mac) -> bool {
        self.verify(SERVER_LABEL, client_nonce, server_nonce, mac)
    }

    fn hmac(&self, label: &[u8], first: &Nonce, second: &Nonce) -> Hmac<Sha256> {
        // HMAC accepts keys of any length; `new_from_slice` cannot fail for it.
        let mut h = match Hmac::<Sha256>::new_from_slice(&self.0) {
            Ok(h) => h,
            Err(_) => unreachable!("HMAC takes keys of any length"),
        };
        h.update(label);
        h.update(first);
        h.update(second);
        h
    }

    fn mac(&self, label: &[u8], first: &Nonce, second: &Nonce) -> Mac {
        self.hmac(label, first, second)
            .finalize()
            .into_bytes()
            .into()
    }

    fn verify(&self, label: &[u8], first: &Nonce, second: &Nonce, mac: &Mac) -> bool {
        self.hmac(label, first, second).verify_slice(mac).is_ok()
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({} bytes)", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_bind_key_nonces_and_role() {
        let k = Key::new(*b"correct horse").unwrap();
        let other = Key::new(*b"battery staple").unwrap();
        let (cn, sn) = ([1u8; 32], [2u8; 32]);
        let p = k.client_proof(&sn, &cn);
        assert!(k.verify_client(&sn, &cn, &p));
        assert!(!other.verify_client(&sn, &cn, &p));
        assert!(!k.verify_client(&[3u8; 32], &cn, &p), "fresh nonce");
        // A client proof is not a server proof (no reflection).
        assert!(!k.verify_server(&sn, &cn, &p));
        assert!(!k.verify_server(&cn, &sn, &p));
        let s = k.server_proof(&cn, &sn);
        assert!(k.verify_server(&cn, &sn, &s));
    }

    #[test]
    fn short_keys_and_debug() {
        assert_eq!(Key::new(*b"short"), Err(KeyError::TooShort(5)));
        let k = Key::new(*b"0123456789").unwrap();
        assert_eq!(format!("{k:?}"), "Key(10 bytes)");
    }

    #[test]
    fn matches_rfc4231_case_2() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        // Our label+nonces layout differs, so check the primitive directly.
        let mut h = Hmac::<Sha256>::new_from_slice(b"Jefe").unwrap();
        h.update(b"what do ya want for nothing?");
        let out: [u8; 32] = h.finalize().into_bytes().into();
        assert_eq!(out[..4], [0x5b, 0xdc, 0xc1, 0x46]);
    }
}
