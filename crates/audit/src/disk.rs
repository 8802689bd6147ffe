//! Sequential disk throughput of a directory (`tune --disk DIR`): write a
//! temporary file, then read it back, and time both.
//!
//! The point is to tell an NVMe array from a disk that will cap a transfer
//! long before the network does, so the page cache must not flatter the
//! numbers: the file is opened with `O_DIRECT` and written from an aligned
//! buffer. File systems that refuse `O_DIRECT` (tmpfs, some FUSE and network
//! file systems) fall back to buffered I/O with `fdatasync` in the timed
//! write and the file's cached pages dropped (`POSIX_FADV_DONTNEED`) before
//! the read, and the result says so. The buffer holds pseudo-random bytes so
//! compressing file systems cannot shrink the work. The file is removed even
//! when the test fails.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use fatpipe_schema::tune::DiskResult;

use crate::Error;

/// Bytes per write and read; large enough for any device's queue.
const BLOCK: usize = 4 << 20;
/// `O_DIRECT` needs buffers and offsets aligned to the logical block size;
/// 4 KiB covers every common device.
const ALIGN: usize = 4096;

/// Writes and reads `bytes` (rounded up to whole blocks) in `dir`.
pub fn measure(dir: &Path, bytes: u64) -> Result<DiskResult, Error> {
    let err = |source| Error::Disk {
        path: dir.to_path_buf(),
        source,
    };
    let blocks = bytes.div_ceil(BLOCK as u64).max(1);
    let total = blocks * BLOCK as u64;
    let path = dir.join(format!(".fatpipe-disk-test-{}", std::process::id()));
    let _cleanup = Remove(path.clone());

    let mut storage = vec![0u8; BLOCK + ALIGN];
    let offset = storage.as_ptr().align_offset(ALIGN);
    if offset > ALIGN {
        return Err(err(io::Error::other("cannot align the I/O buffer")));
    }
    let buf = &mut storage[offset..offset + BLOCK];
    fill_random(buf);

    let (mut file, direct_io) = open(&path, true).map_err(err)?;
    let start = Instant::now();
    for _ in 0..blocks {
        file.write_all(buf).map_err(err)?;
    }
    file.sync_data().map_err(err)?;
    let write_secs = start.elapsed().as_secs_f64();
    if !direct_io {
        drop_cache(&file);
    }
    drop(file);

    let (mut file, _) = open(&path, false).map_err(err)?;
    if !direct_io {
        drop_cache(&file);
    }
    let start = Instant::now();
    let mut read = 0u64;
    loop {
        let n = file.read(buf).map_err(err)?;
        if n == 0 {
            break;
        }
        read += n as u64;
    }
    let read_secs = start.elapsed().as_secs_f64();
    if read != total {
        return Err(err(io::Error::other(format!(
            "read back {read} bytes of {total}"
        ))));
    }
    let rate = |secs: f64| (total as f64 * 8.0 / secs.max(1e-9)) as u64;
    Ok(DiskResult {
        dir: dir.display().to_string(),
        bytes: total,
        write_rate: rate(write_secs),
        read_rate: rate(read_secs),
        direct_io,
    })
}

/// Opens for writing (create) or reading, with `O_DIRECT` when the file
/// system allows it; says which it got.
fn open(path: &Path, write: bool) -> io::Result<(File, bool)> {
    let mut o = OpenOptions::new();
    if write {
        o.write(true).create(true).truncate(true);
    } else {
        o.read(true);
    }
    fatpipe_sys::open_direct(&o, path)
}

fn drop_cache(file: &File) {
    // Errors only mean the cache stays, which the `direct_io: false` flag
    // already admits.
    let _ = fatpipe_sys::fadvise(file, 0, 0, fatpipe_sys::Advice::DontNeed);
}

/// xorshift64*: cheap incompressible bytes, no dependency.
fn fill_random(buf: &mut [u8]) {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for chunk in buf.chunks_mut(8) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let v = x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

/// Removes the test file when dropped, whatever happened.
struct Remove(PathBuf);

impl Drop for Remove {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_and_cleans_up() {
        let dir = tempfile::tempdir().expect("temp dir");
        let r = measure(dir.path(), 1).expect("measure");
        assert_eq!(r.bytes, BLOCK as u64);
        assert!(r.write_rate > 0 && r.read_rate > 0, "{r:?}");
        assert_eq!(
            fs::read_dir(dir.path()).expect("list").count(),
            0,
            "test file left behind"
        );
    }

    #[test]
    fn a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir().expect("temp dir");
        let missing = dir.path().join("nope");
        let e = measure(&missing, 1).expect_err("missing dir");
        assert!(e.to_string().contains("nope"), "{e}");
    }

    #[test]
    fn random_fill_is_not_constant() {
        let mut b = [0u8; 64];
        fill_random(&mut b);
        assert!(b.windows(2).any(|w| w[0] != w[1]));
    }
}
