//! Length-prefixed frames with a hard size cap.
//!
//! A frame is a big-endian `u32` length `L` followed by `L` bytes of body
//! (`1 <= L <= MAX_FRAME`). The body is one [`Message`](crate::Message): a
//! type byte and its fields. The cap is checked on the length prefix, before
//! any body byte is buffered, so a peer announcing a 4 GB frame costs us four
//! bytes of memory and one error, never an allocation.
//!
//! [`FrameDecoder`] accumulates bytes as they arrive from a stream socket (in
//! any split: one byte at a time, or many frames at once) and hands out
//! complete frame bodies.

use crate::coding::DecodeError;

/// The largest frame body, in bytes. Control messages are small; service
/// parameters and payloads must fit in this too.
pub const MAX_FRAME: usize = 64 * 1024;

/// Bytes of the length prefix.
pub const HEADER_LEN: usize = 4;

/// Appends a frame holding `body` to `out`.
///
/// Fails with [`DecodeError::TooLarge`] (and appends nothing) if `body` is
/// empty-or-over-cap; the same rule the decoder enforces, so a frame this side
/// writes is always one the peer accepts.
pub fn encode_frame(out: &mut Vec<u8>, body: &[u8]) -> Result<(), DecodeError> {
    if body.is_empty() {
        return Err(DecodeError::Invalid("empty frame"));
    }
    if body.len() > MAX_FRAME {
        return Err(DecodeError::TooLarge {
            len: body.len(),
            max: MAX_FRAME,
        });
    }
    out.reserve(HEADER_LEN + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    Ok(())
}

/// Reassembles frames from a byte stream.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    /// Start of unconsumed bytes in `buf`; compacted lazily to avoid a
    /// memmove per frame.
    start: usize,
}

impl FrameDecoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds bytes read from the stream.
    pub fn push(&mut self, data: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > MAX_FRAME {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// The next complete frame body, `Ok(None)` if more bytes are needed, or
    /// an error if the next frame is malformed. After an error the stream is
    /// unusable: framing is lost.
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, DecodeError> {
        let avail = &self.buf[self.start..];
        let Some(header) = avail.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let mut len_bytes = [0u8; HEADER_LEN];
        len_bytes.copy_from_slice(header);
        let len = u32::from_be_bytes(len_bytes) as usize;
        if len == 0 {
            return Err(DecodeError::Invalid("empty frame"));
        }
        if len > MAX_FRAME {
            return Err(DecodeError::TooLarge {
                len,
                max: MAX_FRAME,
            });
        }
        let Some(body) = avail.get(HEADER_LEN..HEADER_LEN + len) else {
            return Ok(None);
        };
        let body = body.to_vec();
        self.start += HEADER_LEN + len;
        Ok(Some(body))
    }

    /// How many more bytes complete the frame being received (its header
    /// first), at least 1. A reader that never reads more than this reads
    /// nothing past a frame, leaving what follows in the socket.
    pub fn wanted(&self) -> usize {
        let avail = self.buffered();
        let Some(header) = avail.get(..HEADER_LEN) else {
            return HEADER_LEN - avail.len();
        };
        let mut len_bytes = [0u8; HEADER_LEN];
        len_bytes.copy_from_slice(header);
        let len = u32::from_be_bytes(len_bytes) as usize;
        (HEADER_LEN + len).saturating_sub(avail.len()).max(1)
    }

    /// Bytes received but not yet returned as frames.
    pub fn buffered(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// Takes the bytes not yet returned as frames, leaving the decoder empty.
    pub fn take_buffered(&mut self) -> Vec<u8> {
        let rest = self.buf.split_off(self.start);
        self.buf.clear();
        self.start = 0;
        rest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extreme_length_prefixes_neither_overflow_nor_panic() {
        // Run by `cargo test` in debug, with overflow checks on.
        for len in [u32::MAX, u32::MAX - 3, MAX_FRAME as u32 + 1, 1 << 31] {
            let mut d = FrameDecoder::new();
            d.push(&len.to_be_bytes());
            assert!(d.wanted() >= 1);
            assert!(matches!(d.next_frame(), Err(DecodeError::TooLarge { .. })));
        }
    }

    #[test]
    fn reading_what_is_wanted_never_crosses_a_frame() {
        let mut wire = Vec::new();
        encode_frame(&mut wire, b"hello").unwrap();
        encode_frame(&mut wire, &[9u8; 300]).unwrap();
        let first_end = HEADER_LEN + 5;
        let mut d = FrameDecoder::new();
        let mut at = 0;
        let mut ends = Vec::new();
        while at < wire.len() {
            // A reader with room for 7 bytes at most, as a socket may give.
            let n = d.wanted().min(7);
            d.push(&wire[at..at + n]);
            at += n;
            if let Some(f) = d.next_frame().unwrap() {
                ends.push((at, f.len()));
            }
        }
        assert_eq!(ends, vec![(first_end, 5), (wire.len(), 300)]);
        assert_eq!(d.wanted(), HEADER_LEN);
    }

    #[test]
    fn frames_survive_any_split() {
        let mut wire = Vec::new();
        encode_frame(&mut wire, b"first").unwrap();
        encode_frame(&mut wire, &[7u8; 1000]).unwrap();
        encode_frame(&mut wire, b"x").unwrap();
        for chunk in [1, 2, 3, 5, 7, 100, wire.len()] {
            let mut d = FrameDecoder::new();
            let mut got = Vec::new();
            for piece in wire.chunks(chunk) {
                d.push(piece);
                while let Some(f) = d.next_frame().unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(got.len(), 3, "chunk {chunk}");
            assert_eq!(got[0], b"first");
            assert_eq!(got[1], vec![7u8; 1000]);
            assert_eq!(got[2], b"x");
            assert!(d.buffered().is_empty());
        }
    }

    #[test]
    fn oversized_frame_is_refused_from_its_header() {
        let mut d = FrameDecoder::new();
        d.push(&(MAX_FRAME as u32 + 1).to_be_bytes());
        assert_eq!(
            d.next_frame(),
            Err(DecodeError::TooLarge {
                len: MAX_FRAME + 1,
                max: MAX_FRAME
            })
        );
        let mut d = FrameDecoder::new();
        d.push(&[0, 0, 0, 0]);
        assert!(d.next_frame().is_err());
        let mut out = Vec::new();
        assert!(encode_frame(&mut out, &vec![0u8; MAX_FRAME + 1]).is_err());
        assert!(out.is_empty());
        assert!(encode_frame(&mut out, &vec![0u8; MAX_FRAME]).is_ok());
    }

    #[test]
    fn partial_frame_waits() {
        let mut d = FrameDecoder::new();
        d.push(&[0, 0, 0, 3, b'a']);
        assert_eq!(d.next_frame(), Ok(None));
        d.push(b"bc");
        assert_eq!(d.next_frame(), Ok(Some(b"abc".to_vec())));
        assert_eq!(d.next_frame(), Ok(None));
    }
}
