//! The receiver's journal of verified chunks, for resume.
//!
//! A file in transit lives under a temporary name beside its final name
//! (`.fatpipe-<hash>.part`); next to it a journal (`.fatpipe-<hash>.journal`)
//! records each chunk once its bytes have been verified and written. The
//! names are derived from a hash of the final name so they stay short even
//! for 255-byte names, and are the same in every session, which is how a
//! re-run finds them.
//!
//! The journal starts with a header naming the source file's size and mtime,
//! the chunk size and the checksum; a re-run whose source or checksum
//! differs discards it. A re-run with another chunk size keeps it: the
//! receiver re-verifies the old chunks, keeps every new chunk that lies
//! wholly within verified ones ([`crate::plan::rechunk`]) and writes the
//! journal again for the new size ([`Journal::replace`]), because the
//! chunk size of an auto-tuned copy follows the probed path.
//! Each record is written with one `write(2)` on an `O_APPEND` descriptor,
//! after the chunk's `pwrite`, so after a SIGKILL the page cache holds the
//! data of every journaled chunk. Against power loss `--sync` orders an
//! `fdatasync` of the data before the records that name it; without it,
//! records can outlive their data, which is why each record carries the
//! chunk digest and a re-run re-verifies journaled chunks against the bytes
//! on disk before trusting them. A torn or damaged last record fails its own
//! check and is ignored.
//!
//! With `--sync` the flushes are grouped ([`SyncGroup`]): one `fdatasync`
//! per [`sync_group`] bytes of a file (a sixteenth of it, at most
//! [`SYNC_GROUP`]) rather than one per chunk (a flush per
//! 8 MiB chunk cost a tenth of the disk's rate, and each one stalls the
//! stream that makes it). The rule that keeps the journal true after a
//! crash: **a chunk is journaled only after an `fdatasync` that began after
//! the chunk's last `pwrite` returned.** A chunk enters the group once its
//! bytes are written and verified; a flush takes the whole group as it
//! stands when the flush starts, and only that batch is journaled when the
//! flush returns. Chunks written meanwhile wait for the next flush. A crash
//! between flushes loses at most one group of journal records, never
//! claims a chunk that is not on disk; the data of those chunks is simply
//! asked for again. The file's last chunk is covered by the `fsync` before
//! its rename, so the copy reports done only when every byte is on disk.

use std::fs::File;
use std::io::{self, Read, Write};

use fatpipe_sys::OFlags;

use crate::beneath::Dir;
use crate::hash::{Algo, Digest};

const MAGIC: &[u8; 8] = b"FPJRNL01";
const HEADER_LEN: usize = 36;
/// Where the header holds the chunk size: a journal is read back whatever
/// its chunk size, so `load` takes the size from here before it compares.
const CHUNK_SIZE_AT: std::ops::Range<usize> = 28..32;
const RECORD_LEN: usize = 41;

/// Most bytes of a file written between two `fdatasync`s under `--sync`:
/// large enough that flushes cost little next to the writes (4 GiB is 16
/// flushes), small enough that a crash loses little work.
pub const SYNC_GROUP: u64 = 256 << 20;

/// The flush group for a file of `size` bytes in chunks of `chunk`: about
/// a sixteenth of the file (so at most ~16 flushes per file, and a crash
/// loses at most that share of its journal), at least one chunk, at most
/// [`SYNC_GROUP`].
pub fn sync_group(size: u64, chunk: u32) -> u64 {
    (size / 16).clamp(u64::from(chunk), SYNC_GROUP.max(u64::from(chunk)))
}

/// Chunks of one file that are written and verified but not yet covered by
/// an `fdatasync`, hence not yet journaled (see the module's rule). Pure
/// bookkeeping: the caller flushes and journals.
#[derive(Debug, Default)]
pub struct SyncGroup {
    waiting: Vec<(u32, Digest)>,
    bytes: u64,
    flushing: bool,
}

/// Chunks a flush covers: journal them once that `fdatasync` returned.
pub type Batch = Vec<(u32, Digest)>;

/// What the journal must agree with to be reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// Source size.
    pub size: u64,
    /// Source mtime (seconds).
    pub mtime_s: i64,
    /// Source mtime (nanoseconds).
    pub mtime_ns: u32,
    /// Chunk size in force.
    pub chunk_size: u32,
    /// Checksum in force.
    pub algo: Algo,
}

/// A journal as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    /// The chunk size its records count in.
    pub chunk_size: u32,
    /// The chunks it records, in the order written.
    pub records: Vec<(u32, Digest)>,
}

/// An open journal being appended to.
#[derive(Debug)]
pub struct Journal {
    file: File,
}

/// The temporary name for `name`'s data.
pub fn part_name(name: &[u8]) -> Vec<u8> {
    temp_name(name, "part")
}

/// The journal name for `name`.
pub fn journal_name(name: &[u8]) -> Vec<u8> {
    temp_name(name, "journal")
}

impl Journal {
    /// Starts a fresh journal (replacing any old one).
    pub fn create(dir: &Dir, name: &[u8], id: &Identity) -> io::Result<Journal> {
        let mut file = dir.open_at(
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::APPEND,
            0o600,
        )?;
        file.write_all(&encode_header(id))?;
        Ok(Journal { file })
    }

    /// Reopens an existing journal for appending.
    pub fn reopen(dir: &Dir, name: &[u8]) -> io::Result<Journal> {
        let file = dir.open_at(name, OFlags::WRONLY | OFlags::APPEND, 0)?;
        Ok(Journal { file })
    }

    /// Writes a journal for `id` holding `records` in place of `name`'s:
    /// written under a temporary name and renamed over it, so a crash
    /// leaves the old journal or the new one, never a part of either.
    /// Returns it open for appending.
    pub fn replace(
        dir: &Dir,
        name: &[u8],
        id: &Identity,
        records: &[(u32, Digest)],
    ) -> io::Result<Journal> {
        let tmp = replacement_name(name);
        let mut journal = Journal::create(dir, &tmp, id)?;
        journal.record_all(records)?;
        journal.sync()?;
        dir.rename_at(&tmp, name)?;
        Ok(journal)
    }

    /// Removes what a [`replace`](Self::replace) cut short by a crash left
    /// (its temporary file; the old journal is still in place). A resume
    /// that keeps the old journal calls this: only another change of the
    /// chunk size would write that name again and rename it.
    pub fn remove_unfinished_replace(dir: &Dir, name: &[u8]) -> io::Result<()> {
        dir.unlink_at(&replacement_name(name))
    }

    /// Reads the chunks recorded in `name`, if it exists and matches `id`
    /// in all but the chunk size; the chunk size it was written with comes
    /// back with them (a journal naming a chunk larger than any session's,
    /// [`CHUNK_LIMITS`](crate::session::CHUNK_LIMITS), is not used: the
    /// resume reads a chunk into one buffer).
    pub fn load(dir: &Dir, name: &[u8], id: &Identity) -> io::Result<Option<Loaded>> {
        let mut file = match dir.open_at(name, OFlags::RDONLY, 0) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        if bytes.len() < HEADER_LEN {
            return Ok(None);
        }
        let mut field = [0u8; 4];
        field.copy_from_slice(&bytes[CHUNK_SIZE_AT]);
        let chunk_size = u32::from_le_bytes(field);
        if !(1..=crate::session::CHUNK_LIMITS.1).contains(&chunk_size)
            || bytes[..HEADER_LEN] != encode_header(&Identity { chunk_size, ..*id })
        {
            return Ok(None);
        }
        let mut out = Vec::new();
        for rec in bytes[HEADER_LEN..].chunks_exact(RECORD_LEN) {
            let check = u32::from_le_bytes([rec[37], rec[38], rec[39], rec[40]]);
            if check != xxhash_rust::xxh3::xxh3_64(&rec[..37]) as u32 {
                break;
            }
            let chunk = u32::from_le_bytes([rec[0], rec[1], rec[2], rec[3]]);
            let len = rec[4] as usize;
            if len != id.algo.digest_len() {
                break;
            }
            match Digest::from_slice(&rec[5..5 + len]) {
                Some(d) => out.push((chunk, d)),
                None => break,
            }
        }
        Ok(Some(Loaded {
            chunk_size,
            records: out,
        }))
    }

    /// Records a verified chunk with one `write(2)`.
    pub fn record(&mut self, chunk: u32, digest: &Digest) -> io::Result<()> {
        self.file.write_all(&encode_record(chunk, digest))
    }

    /// Records a batch of chunks with one `write(2)` (each record keeps
    /// its own check, so a torn write leaves a valid prefix).
    pub fn record_all(&mut self, batch: &[(u32, Digest)]) -> io::Result<()> {
        let mut buf = Vec::with_capacity(batch.len() * RECORD_LEN);
        for (chunk, digest) in batch {
            buf.extend_from_slice(&encode_record(*chunk, digest));
        }
        self.file.write_all(&buf)
    }

    /// Flushes the journal to stable storage.
    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}

impl SyncGroup {
    /// Adds a chunk of `len` bytes whose writes have all returned. Returns
    /// the batch to flush now when the group has reached `limit` bytes and
    /// no flush is under way; the caller then `fdatasync`s, journals the
    /// batch, and calls [`SyncGroup::flushed`].
    pub fn add(&mut self, chunk: u32, digest: Digest, len: u64, limit: u64) -> Option<Batch> {
        self.waiting.push((chunk, digest));
        self.bytes += len;
        self.take_if_due(limit)
    }

    /// Ends the flush begun by the last batch handed out. Returns the next
    /// batch when chunks that arrived during that flush already make a
    /// full group (the caller flushes again).
    pub fn flushed(&mut self, limit: u64) -> Option<Batch> {
        self.flushing = false;
        self.take_if_due(limit)
    }

    /// Chunks waiting for a flush.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    fn take_if_due(&mut self, limit: u64) -> Option<Batch> {
        if self.flushing || self.bytes < limit || self.waiting.is_empty() {
            return None;
        }
        self.flushing = true;
        self.bytes = 0;
        Some(std::mem::take(&mut self.waiting))
    }
}

/// Where [`Journal::replace`] writes before renaming over `name`.
pub(crate) fn replacement_name(name: &[u8]) -> Vec<u8> {
    let mut tmp = name.to_vec();
    tmp.extend_from_slice(b".new");
    tmp
}

fn temp_name(name: &[u8], suffix: &str) -> Vec<u8> {
    let h = xxhash_rust::xxh3::xxh3_128(name);
    format!(".fatpipe-{h:032x}.{suffix}").into_bytes()
}

fn encode_record(chunk: u32, digest: &Digest) -> [u8; RECORD_LEN] {
    let mut rec = [0u8; RECORD_LEN];
    rec[..4].copy_from_slice(&chunk.to_le_bytes());
    let d = digest.as_bytes();
    rec[4] = d.len() as u8;
    rec[5..5 + d.len()].copy_from_slice(d);
    let check = xxhash_rust::xxh3::xxh3_64(&rec[..37]) as u32;
    rec[37..].copy_from_slice(&check.to_le_bytes());
    rec
}

fn encode_header(id: &Identity) -> [u8; HEADER_LEN] {
    let mut b = [0u8; HEADER_LEN];
    b[..8].copy_from_slice(MAGIC);
    b[8..16].copy_from_slice(&id.size.to_le_bytes());
    b[16..24].copy_from_slice(&id.mtime_s.to_le_bytes());
    b[24..28].copy_from_slice(&id.mtime_ns.to_le_bytes());
    b[CHUNK_SIZE_AT].copy_from_slice(&id.chunk_size.to_le_bytes());
    b[32] = id.algo.code();
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_and_torn_tail_is_ignored() {
        let t = tempfile::tempdir().unwrap();
        let dir = Dir::open(t.path()).unwrap();
        let id = Identity {
            size: 100,
            mtime_s: 5,
            mtime_ns: 6,
            chunk_size: 64 << 10,
            algo: Algo::Xxh3,
        };
        let jn = journal_name(b"file");
        assert!(Journal::load(&dir, &jn, &id).unwrap().is_none());
        let d1 = Algo::Xxh3.digest(0, b"abc");
        let d2 = Algo::Xxh3.digest(10, b"def");
        {
            let mut j = Journal::create(&dir, &jn, &id).unwrap();
            j.record(0, &d1).unwrap();
        }
        {
            let mut j = Journal::reopen(&dir, &jn).unwrap();
            j.record(1, &d2).unwrap();
            j.sync().unwrap();
        }
        assert_eq!(
            Journal::load(&dir, &jn, &id).unwrap().unwrap().records,
            vec![(0, d1), (1, d2)]
        );
        // A flushed group goes in with one write and reads back in order.
        let d3 = Algo::Xxh3.digest(20, b"ghi");
        let d4 = Algo::Xxh3.digest(30, b"jkl");
        {
            let mut j = Journal::reopen(&dir, &jn).unwrap();
            j.record_all(&[(3, d3), (2, d4)]).unwrap();
        }
        assert_eq!(
            Journal::load(&dir, &jn, &id).unwrap().unwrap().records,
            vec![(0, d1), (1, d2), (3, d3), (2, d4)]
        );
        let path = t.path().join(std::str::from_utf8(&jn).unwrap());
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.truncate(HEADER_LEN + 2 * RECORD_LEN);
        std::fs::write(&path, &bytes).unwrap();
        // A torn record (a crash mid-append) is dropped, the rest kept.
        bytes.extend_from_slice(&[1, 2, 3]);
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(
            Journal::load(&dir, &jn, &id)
                .unwrap()
                .unwrap()
                .records
                .len(),
            2
        );
        // A damaged record stops the replay there.
        bytes[HEADER_LEN + RECORD_LEN + 7] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(
            Journal::load(&dir, &jn, &id).unwrap().unwrap().records,
            vec![(0, d1)]
        );
        // A changed source or checksum invalidates it.
        let other = Identity { size: 101, ..id };
        assert!(Journal::load(&dir, &jn, &other).unwrap().is_none());
        let other = Identity {
            algo: Algo::Blake3,
            ..id
        };
        assert!(Journal::load(&dir, &jn, &other).unwrap().is_none());
        // Another chunk size does not: it comes back with the records.
        let other = Identity {
            chunk_size: 1 << 20,
            ..id
        };
        let got = Journal::load(&dir, &jn, &other).unwrap().unwrap();
        assert_eq!((got.chunk_size, got.records), (64 << 10, vec![(0, d1)]));
        // A header naming a chunk size no session could use is not trusted
        // (it sizes the buffer the resume reads into).
        for bad in [0u32, (64 << 20) + 1, u32::MAX] {
            let mut b = bytes.clone();
            b[CHUNK_SIZE_AT].copy_from_slice(&bad.to_le_bytes());
            std::fs::write(&path, &b).unwrap();
            assert!(Journal::load(&dir, &jn, &id).unwrap().is_none(), "{bad}");
        }
    }

    #[test]
    fn replace_swaps_in_a_whole_journal_for_the_new_chunk_size() {
        let t = tempfile::tempdir().unwrap();
        let dir = Dir::open(t.path()).unwrap();
        let old = Identity {
            size: 4 << 20,
            mtime_s: 5,
            mtime_ns: 6,
            chunk_size: 2 << 20,
            algo: Algo::Xxh3,
        };
        let jn = journal_name(b"file");
        let d = |c: u32| Algo::Xxh3.digest(u64::from(c), b"x");
        Journal::create(&dir, &jn, &old)
            .unwrap()
            .record(1, &d(1))
            .unwrap();
        let new = Identity {
            chunk_size: 1 << 20,
            ..old
        };
        let mut j = Journal::replace(&dir, &jn, &new, &[(2, d(2)), (3, d(3))]).unwrap();
        j.record(0, &d(0)).unwrap();
        let got = Journal::load(&dir, &jn, &new).unwrap().unwrap();
        assert_eq!(got.chunk_size, 1 << 20);
        assert_eq!(got.records, vec![(2, d(2)), (3, d(3)), (0, d(0))]);
        // Nothing is left under the temporary name.
        let names = dir.read_dir().unwrap();
        assert_eq!(names, vec![jn.clone()], "{names:?}");

        // A crash between writing the replacement and renaming it leaves
        // both; the old journal still loads, and the leftover goes.
        Journal::create(&dir, &replacement_name(&jn), &old).unwrap();
        assert_eq!(dir.read_dir().unwrap().len(), 2);
        assert!(Journal::load(&dir, &jn, &new).unwrap().is_some());
        Journal::remove_unfinished_replace(&dir, &jn).unwrap();
        Journal::remove_unfinished_replace(&dir, &jn).unwrap();
        assert_eq!(dir.read_dir().unwrap(), vec![jn.clone()]);
    }

    #[test]
    fn sync_group_flushes_a_full_group_and_never_hands_out_a_chunk_twice() {
        let d = |c: u32| Algo::Xxh3.digest(u64::from(c), b"x");
        let mut g = SyncGroup::default();
        assert_eq!(g.add(0, d(0), 10, 25), None);
        assert_eq!(g.add(1, d(1), 10, 25), None);
        // The third chunk fills the group: one flush covers all three.
        let b = g.add(2, d(2), 10, 25).unwrap();
        assert_eq!(b.iter().map(|r| r.0).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(g.waiting(), 0);
        // Chunks written while that flush runs are not in its batch (the
        // flush began before their writes returned) and, while it runs,
        // no second flush starts even past the limit.
        assert_eq!(g.add(3, d(3), 10, 25), None);
        assert_eq!(g.add(4, d(4), 10, 25), None);
        assert_eq!(g.add(5, d(5), 10, 25), None);
        // When it returns, the waiting chunks already make a group.
        let b = g.flushed(25).unwrap();
        assert_eq!(b.iter().map(|r| r.0).collect::<Vec<_>>(), vec![3, 4, 5]);
        assert_eq!(g.flushed(25), None);
        assert_eq!(g.add(6, d(6), 10, 25), None);
        assert_eq!(
            g.waiting(),
            1,
            "a partial group waits for the file's last fsync"
        );
    }

    #[test]
    fn sync_group_is_a_sixteenth_of_the_file_within_a_chunk_and_256_mib() {
        assert_eq!(sync_group(4 << 30, 8 << 20), SYNC_GROUP);
        assert_eq!(sync_group(96 << 20, 1 << 20), 6 << 20);
        assert_eq!(sync_group(20 << 20, 8 << 20), 8 << 20);
        assert_eq!(sync_group(1 << 40, 1 << 30), 1 << 30);
    }

    #[test]
    fn temp_names_are_short_and_stable() {
        let long = vec![b'n'; 255];
        assert!(part_name(&long).len() < 64);
        assert_eq!(part_name(b"a"), part_name(b"a"));
        assert_ne!(part_name(b"a"), part_name(b"b"));
        assert_ne!(part_name(b"a"), journal_name(b"a"));
    }
}
