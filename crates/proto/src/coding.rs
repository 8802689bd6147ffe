//! Checked reading and plain writing of the integers, byte strings and text
//! that make up message bodies.
//!
//! Every read goes through [`Reader`], which checks the remaining length
//! before it touches the slice, so a decoder built on it cannot panic on short
//! or hostile input: it returns [`DecodeError::UnexpectedEnd`] instead. Writes
//! append to a `Vec<u8>` and cannot fail; the frame layer checks the total size.
//! All integers are big-endian (network order).

/// Why a frame or message could not be decoded. Every variant means the peer
/// sent something this side will not act on; the connection is then closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The input ended before the field being read was complete.
    #[error("unexpected end of input")]
    UnexpectedEnd,
    /// A length prefix announced more than the hard cap allows.
    #[error("frame of {len} bytes exceeds the cap of {max} bytes")]
    TooLarge {
        /// The announced length.
        len: usize,
        /// The cap it exceeded.
        max: usize,
    },
    /// A frame carried a message type this version does not know.
    #[error("unknown message type {0:#04x}")]
    UnknownType(u8),
    /// A frame carried bytes after the last field of its message.
    #[error("{0} trailing bytes after the message")]
    TrailingBytes(usize),
    /// A field held a value outside its allowed range or format.
    #[error("invalid {0}")]
    Invalid(&'static str),
}

/// A cursor over a byte slice whose every read is bounds-checked.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Starts reading at the beginning of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// Takes the next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.buf.len() {
            return Err(DecodeError::UnexpectedEnd);
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    /// Takes a fixed-size array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    /// Takes one byte.
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    /// Takes a big-endian u16.
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    /// Takes a big-endian u32.
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    /// Takes a big-endian u64.
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    /// Takes UTF-8 text prefixed by a u16 length, at most `max` bytes long.
    pub fn text(&mut self, max: usize, what: &'static str) -> Result<String, DecodeError> {
        let len = usize::from(self.u16()?);
        if len > max {
            return Err(DecodeError::Invalid(what));
        }
        let raw = self.bytes(len)?;
        std::str::from_utf8(raw)
            .map(str::to_owned)
            .map_err(|_| DecodeError::Invalid(what))
    }

    /// Takes everything that is left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }

    /// Succeeds only if every byte was consumed.
    pub fn finish(&self) -> Result<(), DecodeError> {
        match self.buf.len() {
            0 => Ok(()),
            n => Err(DecodeError::TrailingBytes(n)),
        }
    }
}

/// Appends UTF-8 text with a u16 length prefix, truncated at a character
/// boundary to `max` bytes so that an over-long reason never breaks a frame.
pub fn put_text(out: &mut Vec<u8>, text: &str, max: usize) {
    let mut end = text.len().min(max).min(usize::from(u16::MAX));
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&(end as u16).to_be_bytes());
    out.extend_from_slice(&text.as_bytes()[..end]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_checked() {
        let mut r = Reader::new(&[0, 1, 0, 0, 0, 2, 9]);
        assert_eq!(r.u16(), Ok(1));
        assert_eq!(r.u32(), Ok(2));
        assert_eq!(r.u16(), Err(DecodeError::UnexpectedEnd));
        assert_eq!(r.u8(), Ok(9));
        assert_eq!(r.u8(), Err(DecodeError::UnexpectedEnd));
        assert!(r.finish().is_ok());
    }

    #[test]
    fn text_round_trip_and_truncation() {
        let mut out = Vec::new();
        put_text(&mut out, "héllo", 2);
        // "h" + the 2-byte 'é' does not fit in 2 bytes: only "h" is kept.
        let mut r = Reader::new(&out);
        assert_eq!(r.text(100, "t").as_deref(), Ok("h"));
        let mut out = Vec::new();
        put_text(&mut out, "fine", 100);
        assert_eq!(
            Reader::new(&out).text(3, "t"),
            Err(DecodeError::Invalid("t"))
        );
        let bad = [0, 2, 0xff, 0xfe];
        assert_eq!(
            Reader::new(&bad).text(10, "t"),
            Err(DecodeError::Invalid("t"))
        );
    }
}
