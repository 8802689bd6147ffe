//! Whole-file checksums as HTTP storage clients ask for them: RFC 3230's
//! `Want-Digest`/`Digest` (what gfal2, davix and FTS send: `adler32`, FTS's
//! default) and RFC 9530's `Want-Repr-Digest`/`Repr-Digest`, for adler32,
//! crc32c, md5 and sha-256.
//!
//! A checksum costs a full read of the file, so the server computes the
//! cheap ones while a PUT writes the file (a [`Hasher`] fed with the body)
//! and keeps every checksum it ever computed *with the file*: a `user.`
//! extended attribute ([`XATTR`]), or, where the file system keeps none, a
//! hidden sidecar file beside it ([`SIDECAR_PREFIX`]). The stored record
//! names the size and modification time it was computed for, so a file
//! changed behind the server's back is summed again, never answered with
//! a stale value. The HEAD a client sends after its upload is answered at
//! once.
//!
//! The header decoders ([`want_digest`], [`want_repr_digest`]) read peer
//! text: bounded (at most [`MAX_HEADER`] bytes, [`MAX_ITEMS`] items) and
//! fuzzed.

use std::io::{self, Read};

use base64::Engine as _;
use md5::Digest as _;

use fatpipe_sys::OFlags;
use fatpipe_transfer::beneath::{fstat, Dir, Meta};

/// The longest `Want-Digest`/`Want-Repr-Digest` value considered.
pub const MAX_HEADER: usize = 1024;
/// The most algorithms considered in one header.
pub const MAX_ITEMS: usize = 16;
/// The extended attribute the checksums are kept in.
pub const XATTR: &str = "user.fatpipe.digest";
/// The name prefix of a sidecar (`.fatpipe-digest.NAME`), where the file
/// system keeps no extended attributes. Names starting `.fatpipe-` are the
/// server's own: hidden from listings, refused to writers.
pub const SIDECAR_PREFIX: &[u8] = b".fatpipe-digest.";
/// The largest stored record read back.
const MAX_RECORD: usize = 1024;

/// A checksum algorithm the server computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Algo {
    /// Adler-32 (RFC 1950): what FTS and gfal2 verify by default.
    Adler32,
    /// CRC-32C (Castagnoli, RFC 4960 appendix B).
    Crc32c,
    /// MD5 (RFC 1321).
    Md5,
    /// SHA-256 (FIPS 180-4).
    Sha256,
}

/// Every algorithm, in the order they are listed.
pub const ALL: [Algo; 4] = [Algo::Adler32, Algo::Crc32c, Algo::Md5, Algo::Sha256];

impl Algo {
    /// The name in `Digest` headers and in the stored record.
    pub fn name(self) -> &'static str {
        match self {
            Algo::Adler32 => "adler32",
            Algo::Crc32c => "crc32c",
            Algo::Md5 => "md5",
            Algo::Sha256 => "sha-256",
        }
    }

    /// An algorithm by any of its names (case-insensitive): RFC 3230's
    /// (`ADLER32`, `MD5`, `SHA-256`, `CRC32c`), RFC 9530's (`adler`,
    /// `crc32c`, `md5`, `sha-256`) and `sha256`.
    pub fn from_name(s: &str) -> Option<Algo> {
        match s.to_ascii_lowercase().as_str() {
            "adler32" | "adler" => Some(Algo::Adler32),
            "crc32c" => Some(Algo::Crc32c),
            "md5" => Some(Algo::Md5),
            "sha-256" | "sha256" => Some(Algo::Sha256),
            _ => None,
        }
    }

    /// The value of a `Digest` (RFC 3230) field: adler32 and crc32c as 8
    /// lowercase hex digits (what XRootD and dCache send and davix and
    /// gfal2 compare), md5 and sha-256 in base64.
    pub fn digest_value(self, raw: &[u8]) -> String {
        match self {
            Algo::Adler32 | Algo::Crc32c => hex(raw),
            Algo::Md5 | Algo::Sha256 => base64::engine::general_purpose::STANDARD.encode(raw),
        }
    }

    /// Bytes of a raw checksum of this algorithm.
    pub fn raw_len(self) -> usize {
        match self {
            Algo::Adler32 | Algo::Crc32c => 4,
            Algo::Md5 => 16,
            Algo::Sha256 => 32,
        }
    }

    /// The value of a `Repr-Digest` (RFC 9530) member: a byte sequence,
    /// `:base64:`.
    pub fn repr_value(self, raw: &[u8]) -> String {
        format!(
            ":{}:",
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }
}

/// An algorithm a client asked for, under the name it used (answered
/// under that name, as clients match the name they sent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// The algorithm.
    pub algo: Algo,
    /// The name as the client spelt it, lowercased.
    pub name: String,
}

/// The algorithm a `Want-Digest` value (RFC 3230: `adler32, md5;q=0.5`)
/// prefers among those served: the highest `q` (default 1, `q=0` refused),
/// the first on a tie. `None` when it names none the server computes, or
/// is too long to consider.
pub fn want_digest(value: &[u8]) -> Option<Wanted> {
    let items = items(value)?;
    let mut best: Option<(u32, Wanted)> = None;
    for item in items {
        let mut parts = item.split(';');
        let name = parts.next().unwrap_or("").trim();
        let mut q = 1000u32;
        for param in parts {
            if let Some((k, v)) = param.split_once('=') {
                if k.trim().eq_ignore_ascii_case("q") {
                    q = qvalue(v.trim())?;
                }
            }
        }
        consider(&mut best, name, q);
    }
    best.map(|(_, w)| w)
}

/// The algorithm a `Want-Repr-Digest` value (RFC 9530: a dictionary of
/// preferences 0-10, `sha-256=10, adler=3`) prefers among those served;
/// preference 0 means "not acceptable".
pub fn want_repr_digest(value: &[u8]) -> Option<Wanted> {
    let items = items(value)?;
    let mut best: Option<(u32, Wanted)> = None;
    for item in items {
        // Parameters of a dictionary member (`;…`) carry nothing for us.
        let member = item.split(';').next().unwrap_or("").trim();
        let (name, pref) = match member.split_once('=') {
            Some((k, v)) => {
                let v = v.trim();
                if v.is_empty() || v.len() > 2 || !v.bytes().all(|b| b.is_ascii_digit()) {
                    continue;
                }
                (k.trim(), v.parse::<u32>().unwrap_or(0).min(10))
            }
            // A bare key is the boolean true: acceptable.
            None => (member, 1),
        };
        consider(&mut best, name, pref);
    }
    best.map(|(_, w)| w)
}

/// What a stored record is valid for: a file's size and mtime (seconds,
/// nanoseconds).
pub type Stamp = (u64, i64, u32);

/// A file's [`Stamp`].
pub fn stamp(meta: &Meta) -> Stamp {
    (meta.size, meta.mtime_s, meta.mtime_ns)
}

/// Decodes an RFC 3230 `Digest` value (`adler32=0a1b2c3d, md5=base64`)
/// into the algorithms known here, with their raw values: adler32 and
/// crc32c as hex (fewer than 8 digits are left-padded: gfal2 and some
/// servers drop leading zeros), md5 as base64 or 32 hex digits, sha-256 as
/// base64. Unknown algorithms and values that do not decode to the
/// algorithm's length are left out; at most [`MAX_HEADER`] bytes and
/// [`MAX_ITEMS`] items are read. Both the server (an upload's checksums)
/// and the client (a server's) read the field with this.
pub fn parse_digest(value: &[u8]) -> Vec<(Algo, Vec<u8>)> {
    decode(value, false)
}

/// Decodes an RFC 9530 `Repr-Digest` value (`sha-256=:base64:, adler=:…:`)
/// as [`parse_digest`] does a `Digest` one.
pub fn parse_repr_digest(value: &[u8]) -> Vec<(Algo, Vec<u8>)> {
    decode(value, true)
}

/// The checksums a client sent with its upload (`Digest` and/or
/// `Repr-Digest`) that the server can check.
pub fn sent_digests(digest: Option<&[u8]>, repr: Option<&[u8]>) -> Vec<(Algo, Vec<u8>)> {
    let mut out = digest.map(parse_digest).unwrap_or_default();
    out.extend(repr.map(parse_repr_digest).unwrap_or_default());
    out
}

fn decode(value: &[u8], repr: bool) -> Vec<(Algo, Vec<u8>)> {
    let mut out = Vec::new();
    for item in items(value).unwrap_or_default() {
        let Some((name, v)) = item.split_once('=') else {
            continue;
        };
        let Some(algo) = Algo::from_name(name.trim()) else {
            continue;
        };
        let v = v.split(';').next().unwrap_or("").trim();
        let raw = if repr {
            v.strip_prefix(':')
                .and_then(|v| v.strip_suffix(':'))
                .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        } else {
            match algo {
                Algo::Adler32 | Algo::Crc32c => (v.len() <= 8)
                    .then(|| format!("{v:0>8}"))
                    .and_then(|h| unhex(&h)),
                Algo::Md5 if v.len() == 32 => unhex(v),
                Algo::Md5 | Algo::Sha256 => {
                    base64::engine::general_purpose::STANDARD.decode(v).ok()
                }
            }
        };
        if let Some(raw) = raw.filter(|r| r.len() == algo.raw_len()) {
            out.push((algo, raw));
        }
    }
    out
}

/// Computes checksums of a byte stream fed in pieces.
pub struct Hasher {
    adler: Option<adler2::Adler32>,
    crc: Option<u32>,
    md5: Option<md5::Md5>,
    sha256: Option<ring::digest::Context>,
}

impl Hasher {
    /// A hasher for `algos`.
    pub fn new(algos: &[Algo]) -> Hasher {
        Hasher {
            adler: algos.contains(&Algo::Adler32).then(adler2::Adler32::new),
            crc: algos.contains(&Algo::Crc32c).then_some(0),
            md5: algos.contains(&Algo::Md5).then(md5::Md5::new),
            sha256: algos
                .contains(&Algo::Sha256)
                .then(|| ring::digest::Context::new(&ring::digest::SHA256)),
        }
    }

    /// Feeds the next bytes.
    pub fn update(&mut self, data: &[u8]) {
        if let Some(a) = &mut self.adler {
            a.write_slice(data);
        }
        if let Some(c) = &mut self.crc {
            *c = crc32c::crc32c_append(*c, data);
        }
        if let Some(m) = &mut self.md5 {
            m.update(data);
        }
        if let Some(s) = &mut self.sha256 {
            s.update(data);
        }
    }

    /// The checksums of everything fed.
    pub fn finish(self) -> Sums {
        let mut sums = Sums::default();
        if let Some(a) = self.adler {
            sums.set(Algo::Adler32, a.checksum().to_be_bytes().to_vec());
        }
        if let Some(c) = self.crc {
            sums.set(Algo::Crc32c, c.to_be_bytes().to_vec());
        }
        if let Some(m) = self.md5 {
            sums.set(Algo::Md5, m.finalize().to_vec());
        }
        if let Some(s) = self.sha256 {
            sums.set(Algo::Sha256, s.finish().as_ref().to_vec());
        }
        sums
    }
}

/// Checksums of one file's content, raw bytes by algorithm.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sums(Vec<(Algo, Vec<u8>)>);

impl Sums {
    /// The raw checksum for `algo`, if known.
    pub fn get(&self, algo: Algo) -> Option<&[u8]> {
        self.0
            .iter()
            .find(|(a, _)| *a == algo)
            .map(|(_, v)| v.as_slice())
    }

    /// Sets (or replaces) the checksum for `algo`.
    pub fn set(&mut self, algo: Algo, raw: Vec<u8>) {
        self.0.retain(|(a, _)| *a != algo);
        self.0.push((algo, raw));
        self.0.sort_by_key(|(a, _)| *a);
    }

    /// Adds every checksum `other` has.
    pub fn merge(&mut self, other: Sums) {
        for (a, v) in other.0 {
            self.set(a, v);
        }
    }

    /// The record kept with a file of this size and mtime.
    pub fn record(&self, stamp: Stamp) -> String {
        let mut s = format!("fatpipe-digest 1 {} {} {}", stamp.0, stamp.1, stamp.2);
        for (a, v) in &self.0 {
            s.push_str(&format!(" {}={}", a.name(), hex(v)));
        }
        s
    }

    /// The checksums a record holds, if it was made for a file of this
    /// size and mtime (a changed file has none).
    pub fn from_record(record: &[u8], stamp: Stamp) -> Option<Sums> {
        let text = std::str::from_utf8(record).ok()?;
        let mut words = text.split_ascii_whitespace();
        if words.next()? != "fatpipe-digest" || words.next()? != "1" {
            return None;
        }
        let size: u64 = words.next()?.parse().ok()?;
        let sec: i64 = words.next()?.parse().ok()?;
        let nsec: u32 = words.next()?.parse().ok()?;
        if (size, sec, nsec) != stamp {
            return None;
        }
        let mut sums = Sums::default();
        for w in words.take(ALL.len()) {
            let (name, value) = w.split_once('=')?;
            sums.set(Algo::from_name(name)?, unhex(value)?);
        }
        Some(sums)
    }
}

/// The checksums kept with `file` (name `name` in `parent`) that are still
/// valid for its current size and mtime.
pub fn load(parent: &Dir, name: &[u8], file: &std::fs::File) -> Sums {
    let Ok(meta) = fstat(file) else {
        return Sums::default();
    };
    let record = match fatpipe_sys::files::get_xattr(file, XATTR, MAX_RECORD) {
        Ok(Some(r)) => Some(r),
        Ok(None) => None,
        Err(_) => read_sidecar(parent, name),
    };
    record
        .and_then(|r| Sums::from_record(&r, stamp(&meta)))
        .unwrap_or_default()
}

/// Keeps `sums` with `file`: in its extended attribute, or in a sidecar
/// where the file system has none. Failing to keep them only costs a
/// later recomputation, so errors are returned for the log, not fatal.
pub fn store(parent: &Dir, name: &[u8], file: &std::fs::File, sums: &Sums) -> io::Result<()> {
    let meta = fstat(file)?;
    let record = sums.record(stamp(&meta));
    match fatpipe_sys::files::set_xattr(file, XATTR, record.as_bytes()) {
        Err(e) if e.kind() == io::ErrorKind::Unsupported => {
            write_sidecar(parent, name, record.as_bytes())
        }
        other => other,
    }
}

/// Removes the sidecar of `name`, if any (the file was deleted or moved).
pub fn forget(parent: &Dir, name: &[u8]) {
    if let Some(side) = sidecar_name(name) {
        let _ = parent.unlink_at(&side);
    }
}

/// Reads `file` from the start and returns the checksums for `algos`.
pub fn compute(file: &std::fs::File, algos: &[Algo]) -> io::Result<Sums> {
    let mut h = Hasher::new(algos);
    let mut buf = vec![0u8; 1 << 20];
    let mut f = file.try_clone()?;
    use std::io::Seek;
    f.seek(io::SeekFrom::Start(0))?;
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => h.update(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(h.finish())
}

/// The sidecar's name for `name`, if it fits a file name.
pub fn sidecar_name(name: &[u8]) -> Option<Vec<u8>> {
    let mut v = SIDECAR_PREFIX.to_vec();
    v.extend_from_slice(name);
    (v.len() <= fatpipe_transfer::relpath::MAX_NAME).then_some(v)
}

fn read_sidecar(parent: &Dir, name: &[u8]) -> Option<Vec<u8>> {
    let side = sidecar_name(name)?;
    let f = parent.open_at(&side, OFlags::RDONLY, 0).ok()?;
    let mut buf = Vec::new();
    f.take(MAX_RECORD as u64).read_to_end(&mut buf).ok()?;
    Some(buf)
}

fn write_sidecar(parent: &Dir, name: &[u8], record: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let side = sidecar_name(name)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "name too long"))?;
    let mut tmp = side.clone();
    tmp.extend_from_slice(b".tmp");
    if tmp.len() > fatpipe_transfer::relpath::MAX_NAME {
        tmp = b".fatpipe-digest.tmp".to_vec();
    }
    let _ = parent.unlink_at(&tmp);
    let mut f = parent.open_at(&tmp, OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL, 0o644)?;
    f.write_all(record)?;
    parent.rename_at(&tmp, &side)
}

fn items(value: &[u8]) -> Option<Vec<&str>> {
    if value.len() > MAX_HEADER {
        return None;
    }
    let text = std::str::from_utf8(value).ok()?;
    Some(
        text.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .take(MAX_ITEMS)
            .collect(),
    )
}

fn consider(best: &mut Option<(u32, Wanted)>, name: &str, weight: u32) {
    if weight == 0 {
        return;
    }
    let Some(algo) = Algo::from_name(name) else {
        return;
    };
    if best.as_ref().is_none_or(|(w, _)| weight > *w) {
        *best = Some((
            weight,
            Wanted {
                algo,
                name: name.to_ascii_lowercase(),
            },
        ));
    }
}

/// An RFC 9110 qvalue (`0`, `0.5`, `1.000`) in thousandths.
fn qvalue(v: &str) -> Option<u32> {
    let (int, frac) = v.split_once('.').unwrap_or((v, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole = match int {
        "0" => 0,
        "1" => 1000,
        _ => return None,
    };
    let mut f: u32 = 0;
    for (i, b) in frac.bytes().enumerate() {
        f += u32::from(b - b'0') * [100, 10, 1][i];
    }
    (whole + f <= 1000).then_some(whole + f)
}

fn hex(raw: &[u8]) -> String {
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.len() > 128 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The file's device/inode-independent identity for ETags: size and mtime.
pub fn etag(meta: &Meta) -> String {
    format!("\"{:x}-{:x}.{:x}\"", meta.size, meta.mtime_s, meta.mtime_ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        let mut h = Hasher::new(&ALL);
        h.update(b"Wiki");
        h.update(b"pedia");
        let s = h.finish();
        // Adler-32 of "Wikipedia" is 0x11E60398 (RFC 1950's example text).
        assert_eq!(hex(s.get(Algo::Adler32).unwrap()), "11e60398");
        let mut h = Hasher::new(&ALL);
        h.update(b"123456789");
        let s = h.finish();
        // The CRC-32C check value (RFC 3720 B.4).
        assert_eq!(hex(s.get(Algo::Crc32c).unwrap()), "e3069283");
        let s = Hasher::new(&ALL).finish();
        assert_eq!(
            Algo::Md5.digest_value(s.get(Algo::Md5).unwrap()),
            "1B2M2Y8AsgTpgAmY7PhCfg=="
        );
        assert_eq!(
            Algo::Sha256.digest_value(s.get(Algo::Sha256).unwrap()),
            "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="
        );
        assert_eq!(
            Algo::Adler32.digest_value(s.get(Algo::Adler32).unwrap()),
            "00000001"
        );
        assert_eq!(
            Algo::Adler32.repr_value(s.get(Algo::Adler32).unwrap()),
            ":AAAAAQ==:"
        );
    }

    #[test]
    fn want_digest_picks_the_preferred_served_algorithm() {
        let w = |v: &str| want_digest(v.as_bytes()).map(|w| (w.algo, w.name));
        assert_eq!(w("adler32"), Some((Algo::Adler32, "adler32".into())));
        assert_eq!(w("ADLER32"), Some((Algo::Adler32, "adler32".into())));
        assert_eq!(w("unixcksum, MD5"), Some((Algo::Md5, "md5".into())));
        assert_eq!(
            w("md5;q=0.3, sha-256;q=0.9, adler32;q=0.5"),
            Some((Algo::Sha256, "sha-256".into()))
        );
        assert_eq!(w("adler32;q=0, md5;q=0.1"), Some((Algo::Md5, "md5".into())));
        assert_eq!(w("crc32c,adler32"), Some((Algo::Crc32c, "crc32c".into())));
        assert_eq!(w("sha-512"), None);
        assert_eq!(w("adler32;q=2"), None, "a bad qvalue spoils the header");
        assert_eq!(w(""), None);
        assert_eq!(want_digest(&vec![b'a'; MAX_HEADER + 1]), None);
    }

    #[test]
    fn want_repr_digest_reads_preferences() {
        let w = |v: &str| want_repr_digest(v.as_bytes()).map(|w| (w.algo, w.name));
        assert_eq!(
            w("sha-256=10, adler=3"),
            Some((Algo::Sha256, "sha-256".into()))
        );
        assert_eq!(
            w("sha-256=0, adler=3"),
            Some((Algo::Adler32, "adler".into()))
        );
        assert_eq!(w("crc32c"), Some((Algo::Crc32c, "crc32c".into())));
        assert_eq!(w("sha-512=10"), None);
        assert_eq!(w("md5=x"), None);
    }

    #[test]
    fn digests_sent_with_an_upload_decode_in_both_syntaxes() {
        let sent = sent_digests(
            Some(b"ADLER32=1e60398, md5=1B2M2Y8AsgTpgAmY7PhCfg==, unixcksum=1, sha-256=zz"),
            Some(b"crc32c=:4waSgw==:, sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:"),
        );
        let names: Vec<Algo> = sent.iter().map(|(a, _)| *a).collect();
        assert_eq!(
            names,
            [Algo::Adler32, Algo::Md5, Algo::Crc32c, Algo::Sha256]
        );
        assert_eq!(sent[0].1, vec![0x01, 0xe6, 0x03, 0x98]);
        assert_eq!(sent[2].1, vec![0xe3, 0x06, 0x92, 0x83]);
        assert_eq!(
            sent_digests(Some(b"md5=d41d8cd98f00b204e9800998ecf8427e"), None)[0].1,
            Hasher::new(&[Algo::Md5]).finish().get(Algo::Md5).unwrap()
        );
        assert!(sent_digests(Some(b"adler32=123456789"), Some(b"md5=:x:")).is_empty());
    }

    #[test]
    fn records_hold_only_for_the_size_and_mtime_they_were_made_for() {
        let meta = |size, s, ns| (size, s, ns);
        let mut h = Hasher::new(&[Algo::Adler32, Algo::Md5]);
        h.update(b"abc");
        let sums = h.finish();
        let m = meta(3, 100, 7);
        let rec = sums.record(m);
        assert_eq!(Sums::from_record(rec.as_bytes(), m), Some(sums.clone()));
        assert_eq!(Sums::from_record(rec.as_bytes(), meta(3, 100, 8)), None);
        assert_eq!(Sums::from_record(rec.as_bytes(), meta(4, 100, 7)), None);
        assert_eq!(Sums::from_record(b"junk", m), None);
        assert_eq!(
            Sums::from_record(b"fatpipe-digest 1 3 100 7 md5=zz", m),
            None
        );
    }

    #[test]
    fn sums_are_kept_with_the_file_and_forgotten_when_it_changes() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("f"), b"hello").unwrap();
        let dir = Dir::open(root.path()).unwrap();
        let f = dir.open_at(b"f", OFlags::RDONLY, 0).unwrap();
        assert_eq!(load(&dir, b"f", &f), Sums::default());
        let sums = compute(&f, &[Algo::Adler32]).unwrap();
        store(&dir, b"f", &f, &sums).unwrap();
        assert_eq!(load(&dir, b"f", &f), sums);
        std::fs::write(root.path().join("f"), b"hello, world").unwrap();
        let f = dir.open_at(b"f", OFlags::RDONLY, 0).unwrap();
        assert_eq!(
            load(&dir, b"f", &f),
            Sums::default(),
            "stale after a change"
        );
    }

    #[test]
    fn the_sidecar_keeps_sums_where_xattrs_are_missing() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("f"), b"x").unwrap();
        let dir = Dir::open(root.path()).unwrap();
        let f = dir.open_at(b"f", OFlags::RDONLY, 0).unwrap();
        let meta = fstat(&f).unwrap();
        let sums = compute(&f, &[Algo::Crc32c]).unwrap();
        write_sidecar(&dir, b"f", sums.record(stamp(&meta)).as_bytes()).unwrap();
        let rec = read_sidecar(&dir, b"f").unwrap();
        assert_eq!(Sums::from_record(&rec, stamp(&meta)), Some(sums));
        forget(&dir, b"f");
        assert!(read_sidecar(&dir, b"f").is_none());
    }

    #[test]
    fn digests_as_servers_send_them() {
        assert_eq!(
            parse_digest(b"adler32=5f78c70e"),
            vec![(Algo::Adler32, vec![0x5f, 0x78, 0xc7, 0x0e])]
        );
        // Leading zeros dropped (some servers), upper case names.
        assert_eq!(
            parse_digest(b"ADLER32=78c70e"),
            vec![(Algo::Adler32, vec![0, 0x78, 0xc7, 0x0e])]
        );
        let md5 = [
            0xd4u8, 0x1d, 0x8c, 0xd9, 0x8f, 0x00, 0xb2, 0x04, 0xe9, 0x80, 0x09, 0x98, 0xec, 0xf8,
            0x42, 0x7e,
        ];
        let got = parse_digest(b"md5=1B2M2Y8AsgTpgAmY7PhCfg==, UNIXcksum=123, crc32c=zz");
        assert_eq!(got, vec![(Algo::Md5, md5.to_vec())]);
        assert_eq!(
            parse_digest(b"md5=d41d8cd98f00b204e9800998ecf8427e"),
            vec![(Algo::Md5, md5.to_vec())]
        );
        assert!(parse_digest(b"adler32=123456789").is_empty());
        assert!(parse_digest(&vec![b'a'; MAX_HEADER + 1]).is_empty());
        assert_eq!(
            parse_repr_digest(b"adler=:X3jHDg==:, sha-256=:nope:"),
            vec![(Algo::Adler32, vec![0x5f, 0x78, 0xc7, 0x0e])]
        );
    }
}
