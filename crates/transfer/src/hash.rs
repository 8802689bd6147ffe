//! Chunk checksums: fast xxh3-128 by default, BLAKE3 with `--verify=strong`.
//!
//! A chunk's digest covers its offset and length as well as its bytes, so a
//! header corrupted on the wire (data landing at the wrong offset) fails the
//! check just like a flipped payload bit. The digest does not cover the
//! per-session file number, so the receiver's journal can store it and
//! re-verify chunks on disk in a later session (resume).
//!
//! xxh3-128 is not cryptographic: it detects accidents (bit flips, misplaced
//! data), which is what TCP's 16-bit checksum lets through on long transfers.
//! BLAKE3 also resists a peer or middlebox forging data to match.

/// Which checksum protects each chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algo {
    /// xxh3, 128-bit: tens of GB/s per core.
    Xxh3,
    /// BLAKE3, 256-bit: cryptographic, a few GB/s per core.
    Blake3,
}

impl Algo {
    /// Wire code.
    pub fn code(self) -> u8 {
        match self {
            Algo::Xxh3 => 1,
            Algo::Blake3 => 2,
        }
    }

    /// From a wire code.
    pub fn from_code(code: u8) -> Option<Algo> {
        match code {
            1 => Some(Algo::Xxh3),
            2 => Some(Algo::Blake3),
            _ => None,
        }
    }

    /// Digest length in bytes.
    pub fn digest_len(self) -> usize {
        match self {
            Algo::Xxh3 => 16,
            Algo::Blake3 => 32,
        }
    }

    /// The name shown to users and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Algo::Xxh3 => "xxh3-128",
            Algo::Blake3 => "blake3",
        }
    }

    /// Starts a digest of the chunk at `offset` of `len` bytes.
    pub fn start(self, offset: u64, len: u64) -> ChunkHasher {
        let mut h = match self {
            Algo::Xxh3 => ChunkHasher::Xxh3(Box::new(xxhash_rust::xxh3::Xxh3::new())),
            Algo::Blake3 => ChunkHasher::Blake3(Box::new(blake3::Hasher::new())),
        };
        h.update(&offset.to_le_bytes());
        h.update(&len.to_le_bytes());
        h
    }

    /// Digest of a whole chunk held in memory.
    pub fn digest(self, offset: u64, data: &[u8]) -> Digest {
        let mut h = self.start(offset, data.len() as u64);
        h.update(data);
        h.finish()
    }
}

/// A digest of up to 32 bytes (`len` says how many are used).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Digest {
    bytes: [u8; 32],
    len: u8,
}

impl Digest {
    /// From wire bytes (16 or 32 of them).
    pub fn from_slice(s: &[u8]) -> Option<Digest> {
        if s.len() != 16 && s.len() != 32 {
            return None;
        }
        let mut bytes = [0u8; 32];
        bytes[..s.len()].copy_from_slice(s);
        Some(Digest {
            bytes,
            len: s.len() as u8,
        })
    }

    /// The used bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in self.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// An in-progress chunk digest.
pub enum ChunkHasher {
    /// xxh3-128 state (boxed: it is large).
    Xxh3(Box<xxhash_rust::xxh3::Xxh3>),
    /// BLAKE3 state.
    Blake3(Box<blake3::Hasher>),
}

impl ChunkHasher {
    /// Feeds bytes.
    pub fn update(&mut self, data: &[u8]) {
        match self {
            ChunkHasher::Xxh3(h) => h.update(data),
            ChunkHasher::Blake3(h) => {
                h.update(data);
            }
        }
    }

    /// The digest.
    pub fn finish(self) -> Digest {
        match self {
            ChunkHasher::Xxh3(h) => {
                let v = h.digest128().to_le_bytes();
                Digest::from_slice(&v).unwrap_or(Digest {
                    bytes: [0; 32],
                    len: 16,
                })
            }
            ChunkHasher::Blake3(h) => Digest {
                bytes: *h.finalize().as_bytes(),
                len: 32,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_equals_one_shot_and_binds_offset() {
        for algo in [Algo::Xxh3, Algo::Blake3] {
            let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
            let one = algo.digest(4096, &data);
            let mut h = algo.start(4096, data.len() as u64);
            for part in data.chunks(999) {
                h.update(part);
            }
            assert_eq!(h.finish(), one);
            assert_eq!(one.as_bytes().len(), algo.digest_len());
            assert_ne!(algo.digest(0, &data), one, "offset must be covered");
            let mut flipped = data.clone();
            flipped[500] ^= 1;
            assert_ne!(algo.digest(4096, &flipped), one);
            assert_eq!(Algo::from_code(algo.code()), Some(algo));
        }
        assert_eq!(Algo::from_code(9), None);
        assert!(Digest::from_slice(&[0; 5]).is_none());
    }
}
