//! The TLS 1.3 record layer after the handshake (RFC 8446 §5.2–5.3), as two
//! independent halves: a [`Sealer`] that protects what one end writes and
//! an [`Opener`] that checks and decrypts what it reads.
//!
//! rustls does the handshake; this module only frames and protects
//! application data with the traffic keys rustls hands over
//! (`dangerous_extract_secrets`), so that each direction of a connection
//! can live on its own thread (see the crate docs). Each record is
//! `type(0x17) ‖ 0x0303 ‖ length(u16)` followed by the AEAD of
//! `content ‖ inner type`, with nonce = IV xor the record's sequence number
//! and the 5-byte header as associated data. Records carry at most 2^14
//! bytes of content; a received record's length is checked against the
//! RFC's cap (2^14 + 256) from its header, before anything is buffered
//! past it, so a peer costs us at most one record buffer.
//!
//! Key lifetime: AES-GCM may protect about 2^24.5 full records per key
//! (RFC 8446 §5.5). This layer does not send or accept KeyUpdate; it fails
//! the stream cleanly at [`RECORD_LIMIT`] records (256 GiB of 16 KiB
//! records) with [`RecordError::KeyExhausted`], and a copy reconnects the
//! stream with fresh keys, as after any broken connection.

use std::ops::Range;

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use rustls::ConnectionTrafficSecrets;

/// Most content bytes one record carries (RFC 8446 §5.1).
pub const MAX_CONTENT: usize = 1 << 14;
/// Most bytes a record's protected part may hold (RFC 8446 §5.2).
pub const MAX_CIPHERTEXT: usize = MAX_CONTENT + 256;
/// Bytes of a record header.
pub const HEADER: usize = 5;
/// Records one key protects before the stream is failed (below AES-GCM's
/// 2^24.5 of RFC 8446 §5.5).
pub const RECORD_LIMIT: u64 = 1 << 24;
/// Outer content type of every protected record.
const APPLICATION_DATA: u8 = 23;
const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
/// Handshake message type of a NewSessionTicket, the one post-handshake
/// message that can be skipped (resumption is off anyway).
const NEW_SESSION_TICKET: u8 = 4;
/// Bytes of the receive buffer: several full records per `read` call.
const RECV_BUF: usize = 8 * (HEADER + MAX_CIPHERTEXT);

/// Why a record could not be sealed or opened. Every one ends the stream.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    /// The record failed authentication: changed, forged or out of order.
    #[error("TLS record failed authentication (data changed on the wire)")]
    BadRecordMac,
    /// The header announces more than a record may hold.
    #[error("TLS record too large ({0} bytes)")]
    Oversized(usize),
    /// A header field that TLS 1.3 fixes has another value.
    #[error("malformed TLS record: {0}")]
    Malformed(&'static str),
    /// The peer sent an alert other than close_notify.
    #[error("the peer sent TLS alert {0}")]
    Alert(u8),
    /// The peer sent a post-handshake message this layer does not handle
    /// (KeyUpdate).
    #[error("unsupported TLS post-handshake message (type {0})")]
    Unsupported(u8),
    /// The key protected as many records as it safely may.
    #[error("TLS key used for its maximum number of records; reconnect")]
    KeyExhausted,
    /// The traffic secrets are of a cipher suite this layer does not run.
    #[error("unsupported TLS cipher suite")]
    Suite,
    /// The stream ended inside a record.
    #[error("the connection ended inside a TLS record")]
    Truncated,
}

/// One direction's key, IV and sequence number.
struct Keys {
    key: LessSafeKey,
    iv: [u8; 12],
    seq: u64,
}

impl Keys {
    fn new(secrets: &ConnectionTrafficSecrets, seq: u64) -> Result<Keys, RecordError> {
        let (alg, key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (&aead::CHACHA20_POLY1305, key, iv)
            }
            _ => return Err(RecordError::Suite),
        };
        let unbound = UnboundKey::new(alg, key.as_ref()).map_err(|_| RecordError::Suite)?;
        let iv: [u8; 12] = iv.as_ref().try_into().map_err(|_| RecordError::Suite)?;
        Ok(Keys {
            key: LessSafeKey::new(unbound),
            iv,
            seq,
        })
    }

    /// The next record's nonce (IV xor sequence number), or the end of the
    /// key's life.
    fn next_nonce(&mut self) -> Result<Nonce, RecordError> {
        if self.seq >= RECORD_LIMIT {
            return Err(RecordError::KeyExhausted);
        }
        let mut n = self.iv;
        for (b, s) in n[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *b ^= s;
        }
        self.seq += 1;
        Ok(Nonce::assume_unique_for_key(n))
    }

    fn tag_len(&self) -> usize {
        self.key.algorithm().tag_len()
    }
}

/// Protects one direction's outgoing data.
pub struct Sealer {
    keys: Keys,
}

impl Sealer {
    /// A sealer for the secrets of this direction, starting at record `seq`.
    pub fn new(secrets: &ConnectionTrafficSecrets, seq: u64) -> Result<Sealer, RecordError> {
        Ok(Sealer {
            keys: Keys::new(secrets, seq)?,
        })
    }

    /// Appends `data` to `out` as application-data records of at most
    /// [`MAX_CONTENT`] bytes each.
    pub fn seal(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), RecordError> {
        for piece in data.chunks(MAX_CONTENT) {
            self.seal_record(APPLICATION_DATA, piece, out)?;
        }
        Ok(())
    }

    /// Appends a close_notify alert record to `out`.
    pub fn close_notify(&mut self, out: &mut Vec<u8>) -> Result<(), RecordError> {
        self.seal_record(ALERT, &[1, 0], out)
    }

    /// Records sealed so far (the next record's sequence number).
    pub fn sequence(&self) -> u64 {
        self.keys.seq
    }

    fn seal_record(&mut self, kind: u8, data: &[u8], out: &mut Vec<u8>) -> Result<(), RecordError> {
        let nonce = self.keys.next_nonce()?;
        let len = data.len() + 1 + self.keys.tag_len();
        let len16 = u16::try_from(len).map_err(|_| RecordError::Oversized(len))?;
        let [hi, lo] = len16.to_be_bytes();
        let header = [APPLICATION_DATA, 3, 3, hi, lo];
        let start = out.len();
        out.reserve(HEADER + len);
        out.extend_from_slice(&header);
        out.extend_from_slice(data);
        out.push(kind);
        let tag = self
            .keys
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(header), &mut out[start + HEADER..])
            .map_err(|_| RecordError::KeyExhausted)?;
        out.extend_from_slice(tag.as_ref());
        Ok(())
    }
}

/// Checks and decrypts one direction's incoming records from a buffer the
/// caller fills ([`spare`](Opener::spare), [`filled`](Opener::filled)).
pub struct Opener {
    keys: Keys,
    buf: Box<[u8]>,
    /// Received bytes not yet opened: `buf[head..tail]`.
    head: usize,
    tail: usize,
    /// Opened content not yet handed out.
    plain: Range<usize>,
    closed: bool,
}

impl Opener {
    /// An opener for the secrets of this direction, starting at record `seq`.
    pub fn new(secrets: &ConnectionTrafficSecrets, seq: u64) -> Result<Opener, RecordError> {
        Ok(Opener {
            keys: Keys::new(secrets, seq)?,
            buf: vec![0u8; RECV_BUF].into_boxed_slice(),
            head: 0,
            tail: 0,
            plain: 0..0,
            closed: false,
        })
    }

    /// Copies opened content into `out`: `Ok(Some(n))` with `n > 0`, or
    /// `Ok(Some(0))` once the peer sent close_notify, or `Ok(None)` when
    /// more bytes must be received first.
    pub fn read(&mut self, out: &mut [u8]) -> Result<Option<usize>, RecordError> {
        let Some(got) = self.take(out.len())? else {
            return Ok(None);
        };
        let n = got.len();
        out[..n].copy_from_slice(&self.buf[got]);
        Ok(Some(n))
    }

    /// As [`read`](Opener::read), but the opened content (at most `max`
    /// bytes) is passed over, not copied out: for a reader that only
    /// counts it (a throughput test's receiver).
    pub fn discard(&mut self, max: usize) -> Result<Option<usize>, RecordError> {
        Ok(self.take(max)?.map(|got| got.len()))
    }

    /// The next opened content, at most `max` bytes, as a range of `buf`
    /// (valid until the next call); empty at close_notify or for `max` 0.
    fn take(&mut self, max: usize) -> Result<Option<std::ops::Range<usize>>, RecordError> {
        if max == 0 {
            return Ok(Some(0..0));
        }
        loop {
            if !self.plain.is_empty() {
                let n = self.plain.len().min(max);
                let from = self.plain.start;
                self.plain.start += n;
                return Ok(Some(from..from + n));
            }
            if self.closed {
                return Ok(Some(0..0));
            }
            if !self.open_next()? {
                return Ok(None);
            }
        }
    }

    /// Where the next received bytes go (never empty while content is not
    /// pending: a full record always fits).
    pub fn spare(&mut self) -> &mut [u8] {
        if self.plain.is_empty() && self.head > 0 {
            self.buf.copy_within(self.head..self.tail, 0);
            self.tail -= self.head;
            self.head = 0;
            self.plain = 0..0;
        }
        &mut self.buf[self.tail..]
    }

    /// Counts `n` bytes written into [`spare`](Opener::spare).
    pub fn filled(&mut self, n: usize) {
        self.tail = (self.tail + n).min(self.buf.len());
    }

    /// Whether part of a record has been received (an end of stream now
    /// would be a truncation).
    pub fn mid_record(&self) -> bool {
        self.tail > self.head
    }

    /// Records opened so far.
    pub fn sequence(&self) -> u64 {
        self.keys.seq
    }

    /// Opens the record at `head` if it is complete; false if more bytes
    /// are needed.
    fn open_next(&mut self) -> Result<bool, RecordError> {
        let avail = &self.buf[self.head..self.tail];
        let Some(header) = avail.get(..HEADER) else {
            return Ok(false);
        };
        let header: [u8; HEADER] = [header[0], header[1], header[2], header[3], header[4]];
        if header[0] != APPLICATION_DATA {
            return Err(RecordError::Malformed(
                "outer content type is not application_data",
            ));
        }
        if header[1..3] != [3, 3] {
            return Err(RecordError::Malformed(
                "legacy record version is not 0x0303",
            ));
        }
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if len > MAX_CIPHERTEXT {
            return Err(RecordError::Oversized(len));
        }
        if len <= self.keys.tag_len() {
            return Err(RecordError::Malformed("record shorter than its tag"));
        }
        if avail.len() < HEADER + len {
            return Ok(false);
        }
        let body = self.head + HEADER..self.head + HEADER + len;
        self.head = body.end;
        let nonce = self.keys.next_nonce()?;
        let opened = self
            .keys
            .key
            .open_in_place(nonce, Aad::from(header), &mut self.buf[body.clone()])
            .map_err(|_| RecordError::BadRecordMac)?;
        // The inner type is the last non-zero byte; zeros after it are padding.
        let Some(pos) = opened.iter().rposition(|&b| b != 0) else {
            return Err(RecordError::Malformed("record without a content type"));
        };
        let kind = opened[pos];
        if pos > MAX_CONTENT {
            return Err(RecordError::Oversized(pos));
        }
        let content = body.start..body.start + pos;
        match kind {
            APPLICATION_DATA => self.plain = content,
            ALERT => {
                let alert = &self.buf[content];
                match alert {
                    [_, 0] => self.closed = true,
                    [_, code] => return Err(RecordError::Alert(*code)),
                    _ => return Err(RecordError::Malformed("alert of the wrong length")),
                }
            }
            HANDSHAKE => match self.buf.get(content.start) {
                Some(&NEW_SESSION_TICKET) => {}
                Some(&t) => return Err(RecordError::Unsupported(t)),
                None => return Err(RecordError::Malformed("empty handshake record")),
            },
            _ => return Err(RecordError::Malformed("unknown inner content type")),
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::crypto::cipher::{AeadKey, Iv};

    fn secrets(k: u8) -> ConnectionTrafficSecrets {
        ConnectionTrafficSecrets::Aes256Gcm {
            key: AeadKey::from([k; 32]),
            iv: Iv::from([k; 12]),
        }
    }

    /// Feeds `wire` to `opener` in pieces of `step` bytes and collects the
    /// content until close_notify or the end of the bytes.
    fn open_all(opener: &mut Opener, wire: &[u8], step: usize) -> Result<Vec<u8>, RecordError> {
        let mut got = Vec::new();
        let mut fed = 0;
        let mut out = [0u8; 7000];
        loop {
            match opener.read(&mut out)? {
                Some(0) => return Ok(got),
                Some(n) => got.extend_from_slice(&out[..n]),
                None if fed == wire.len() => return Ok(got),
                None => {
                    let spare = opener.spare();
                    let n = step.min(wire.len() - fed).min(spare.len());
                    spare[..n].copy_from_slice(&wire[fed..fed + n]);
                    opener.filled(n);
                    fed += n;
                }
            }
        }
    }

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn round_trip_in_any_split() {
        let msg = data(100_000);
        for step in [1usize, 5, 1000, 16_421, 1 << 20] {
            let mut sealer = Sealer::new(&secrets(1), 0).unwrap();
            let mut wire = Vec::new();
            sealer.seal(&msg, &mut wire).unwrap();
            sealer.seal(b"tail", &mut wire).unwrap();
            sealer.close_notify(&mut wire).unwrap();
            let mut opener = Opener::new(&secrets(1), 0).unwrap();
            let got = open_all(&mut opener, &wire, step).unwrap();
            assert_eq!(got.len(), msg.len() + 4, "step {step}");
            assert_eq!(&got[..msg.len()], &msg[..]);
            assert_eq!(&got[msg.len()..], b"tail");
            assert_eq!(opener.sequence(), sealer.sequence());
        }
    }

    #[test]
    fn discarding_counts_what_reading_would_copy_and_still_checks_it() {
        let msg = data(100_000);
        let mut sealer = Sealer::new(&secrets(1), 0).unwrap();
        let mut wire = Vec::new();
        sealer.seal(&msg, &mut wire).unwrap();
        sealer.close_notify(&mut wire).unwrap();
        let mut opener = Opener::new(&secrets(1), 0).unwrap();
        let (mut counted, mut fed) = (0usize, 0usize);
        loop {
            match opener.discard(7000).unwrap() {
                Some(0) => break,
                Some(n) => {
                    assert!(n <= 7000);
                    counted += n;
                }
                None => {
                    let spare = opener.spare();
                    let n = 3000.min(wire.len() - fed).min(spare.len());
                    assert!(n > 0, "ran out of wire before close_notify");
                    spare[..n].copy_from_slice(&wire[fed..fed + n]);
                    opener.filled(n);
                    fed += n;
                }
            }
        }
        assert_eq!(counted, msg.len());
        assert_eq!(opener.discard(0).unwrap(), Some(0));
        // A flipped bit is still an authentication failure.
        let mut bad = wire.clone();
        bad[100] ^= 1;
        let mut opener = Opener::new(&secrets(1), 0).unwrap();
        opener.spare()[..bad.len().min(20_000)].copy_from_slice(&bad[..bad.len().min(20_000)]);
        opener.filled(bad.len().min(20_000));
        assert!(matches!(
            opener.discard(1 << 20),
            Err(RecordError::BadRecordMac)
        ));
    }

    #[test]
    fn records_are_full_and_numbered() {
        let mut sealer = Sealer::new(&secrets(1), 0).unwrap();
        let mut wire = Vec::new();
        sealer.seal(&data(3 * MAX_CONTENT + 10), &mut wire).unwrap();
        assert_eq!(sealer.sequence(), 4);
        // Three full records (content + type byte + 16-byte tag) and a short one.
        assert_eq!(
            wire.len(),
            3 * (HEADER + MAX_CONTENT + 17) + HEADER + 10 + 17
        );
        assert_eq!(&wire[..5], &[23, 3, 3, 0x40, 0x11]);
    }

    #[test]
    fn every_flipped_bit_is_an_authentication_error() {
        let mut sealer = Sealer::new(&secrets(1), 0).unwrap();
        let mut wire = Vec::new();
        sealer.seal(b"a secret line", &mut wire).unwrap();
        for i in HEADER..wire.len() {
            let mut bad = wire.clone();
            bad[i] ^= 0x10;
            let mut opener = Opener::new(&secrets(1), 0).unwrap();
            assert_eq!(
                open_all(&mut opener, &bad, 64),
                Err(RecordError::BadRecordMac)
            );
        }
        // A changed length in the header is authenticated too (it is the AAD).
        let mut bad = wire.clone();
        bad[4] -= 1;
        let mut opener = Opener::new(&secrets(1), 0).unwrap();
        assert_eq!(
            open_all(&mut opener, &bad[..bad.len() - 1], 64),
            Err(RecordError::BadRecordMac)
        );
    }

    #[test]
    fn wrong_key_or_sequence_is_refused() {
        let mut sealer = Sealer::new(&secrets(1), 0).unwrap();
        let mut wire = Vec::new();
        sealer.seal(b"x", &mut wire).unwrap();
        let mut other_key = Opener::new(&secrets(2), 0).unwrap();
        assert_eq!(
            open_all(&mut other_key, &wire, 64),
            Err(RecordError::BadRecordMac)
        );
        // A replayed or reordered record has the wrong sequence number.
        let mut later = Opener::new(&secrets(1), 1).unwrap();
        assert_eq!(
            open_all(&mut later, &wire, 64),
            Err(RecordError::BadRecordMac)
        );
        let mut twice = wire.clone();
        twice.extend_from_slice(&wire);
        let mut opener = Opener::new(&secrets(1), 0).unwrap();
        assert_eq!(
            open_all(&mut opener, &twice, 64),
            Err(RecordError::BadRecordMac)
        );
    }

    #[test]
    fn oversized_and_malformed_headers_are_refused_before_buffering() {
        let mut opener = Opener::new(&secrets(1), 0).unwrap();
        let huge = [23, 3, 3, 0xff, 0xff];
        assert_eq!(
            open_all(&mut opener, &huge, 5),
            Err(RecordError::Oversized(0xffff))
        );
        let mut opener = Opener::new(&secrets(1), 0).unwrap();
        assert!(matches!(
            open_all(&mut opener, &[22, 3, 1, 0, 10], 5),
            Err(RecordError::Malformed(_))
        ));
        let mut opener = Opener::new(&secrets(1), 0).unwrap();
        assert!(matches!(
            open_all(&mut opener, &[23, 3, 3, 0, 3, 1, 2, 3], 8),
            Err(RecordError::Malformed(_))
        ));
    }

    #[test]
    fn a_truncated_record_is_seen_as_such() {
        let mut sealer = Sealer::new(&secrets(1), 0).unwrap();
        let mut wire = Vec::new();
        sealer.seal(b"hello", &mut wire).unwrap();
        let mut opener = Opener::new(&secrets(1), 0).unwrap();
        let got = open_all(&mut opener, &wire[..wire.len() - 1], 64).unwrap();
        assert!(got.is_empty());
        assert!(opener.mid_record());
    }

    #[test]
    fn the_key_is_retired_at_the_record_limit() {
        let mut sealer = Sealer::new(&secrets(1), RECORD_LIMIT - 1).unwrap();
        let mut wire = Vec::new();
        sealer.seal(b"last", &mut wire).unwrap();
        assert_eq!(
            sealer.seal(b"one more", &mut wire),
            Err(RecordError::KeyExhausted)
        );
        let mut opener = Opener::new(&secrets(1), RECORD_LIMIT - 1).unwrap();
        assert_eq!(open_all(&mut opener, &wire, 1024).unwrap(), b"last");
    }

    #[test]
    fn an_alert_other_than_close_notify_is_an_error() {
        let mut sealer = Sealer::new(&secrets(1), 0).unwrap();
        let mut wire = Vec::new();
        sealer.seal_record(ALERT, &[2, 20], &mut wire).unwrap();
        let mut opener = Opener::new(&secrets(1), 0).unwrap();
        assert_eq!(
            open_all(&mut opener, &wire, 64),
            Err(RecordError::Alert(20))
        );
    }
}
