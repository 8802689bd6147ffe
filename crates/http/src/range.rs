//! The `Range` request header (RFC 9110 §14.1-14.2) against a file's size.
//!
//! What a peer writes here becomes offsets the server reads at, so the
//! decoder is strict about numbers (digits only, no overflow) and bounded
//! in work: a header longer than [`MAX_HEADER`] or with more than
//! [`MAX_RANGES`] ranges is ignored (the whole file is served, which RFC
//! 9110 allows a server to do with any `Range`), as is anything that does
//! not parse or names another unit. Only a well-formed byte range set of
//! which no range overlaps the file is *unsatisfiable* (416).

/// The longest `Range` value considered.
pub const MAX_HEADER: usize = 4096;
/// The most ranges served in one `multipart/byteranges` answer.
pub const MAX_RANGES: usize = 64;

/// What a `Range` header asks of a file of a given size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ranges {
    /// The whole file, as 200 (no header, or one that is ignored).
    Full,
    /// These byte ranges, each `(first, last)` inclusive and within the
    /// file, in the order asked (one: a plain 206; more: multipart).
    Partial(Vec<(u64, u64)>),
    /// Well formed, but no range overlaps the file: 416.
    Unsatisfiable,
}

/// Interprets a `Range` header value for a file of `size` bytes.
pub fn parse(value: &[u8], size: u64) -> Ranges {
    if value.len() > MAX_HEADER {
        return Ranges::Full;
    }
    let Ok(value) = std::str::from_utf8(value) else {
        return Ranges::Full;
    };
    let Some((unit, set)) = value.trim().split_once('=') else {
        return Ranges::Full;
    };
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return Ranges::Full;
    }
    let mut out = Vec::new();
    let mut specs = 0usize;
    for spec in set.split(',') {
        let spec = spec.trim();
        if spec.is_empty() {
            // RFC 9110's list syntax tolerates empty elements.
            continue;
        }
        specs += 1;
        if specs > MAX_RANGES {
            return Ranges::Full;
        }
        let Some((first, last)) = spec.split_once('-') else {
            return Ranges::Full;
        };
        let (first, last) = (first.trim(), last.trim());
        if first.is_empty() {
            // A suffix: the last N bytes.
            let Some(n) = number(last) else {
                return Ranges::Full;
            };
            if n > 0 && size > 0 {
                out.push((size - n.min(size), size - 1));
            }
            continue;
        }
        let Some(a) = number(first) else {
            return Ranges::Full;
        };
        let b = if last.is_empty() {
            u64::MAX
        } else {
            match number(last) {
                Some(b) if b >= a => b,
                _ => return Ranges::Full,
            }
        };
        if a < size {
            out.push((a, b.min(size - 1)));
        }
    }
    if specs == 0 {
        return Ranges::Full;
    }
    if out.is_empty() {
        return Ranges::Unsatisfiable;
    }
    // Even `bytes=0-` is a 206: clients probing with it expect a
    // Content-Range back.
    Ranges::Partial(out)
}

/// A decimal number that fits a u64 (at most 20 digits, checked).
fn number(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(v: &str, size: u64) -> Ranges {
        parse(v.as_bytes(), size)
    }

    #[test]
    fn single_suffix_open_and_clipped_ranges() {
        assert_eq!(p("bytes=0-9", 100), Ranges::Partial(vec![(0, 9)]));
        assert_eq!(p("bytes=90-", 100), Ranges::Partial(vec![(90, 99)]));
        assert_eq!(p("bytes=-10", 100), Ranges::Partial(vec![(90, 99)]));
        assert_eq!(p("bytes=-1000", 100), Ranges::Partial(vec![(0, 99)]));
        assert_eq!(p("bytes=50-1000", 100), Ranges::Partial(vec![(50, 99)]));
        assert_eq!(p("BYTES = 0-0", 1), Ranges::Partial(vec![(0, 0)]));
    }

    #[test]
    fn several_ranges_keep_their_order_and_drop_those_past_the_end() {
        assert_eq!(
            p("bytes=10-19, 0-4,200-300,-5", 100),
            Ranges::Partial(vec![(10, 19), (0, 4), (95, 99)])
        );
    }

    #[test]
    fn nothing_within_the_file_is_unsatisfiable() {
        assert_eq!(p("bytes=100-", 100), Ranges::Unsatisfiable);
        assert_eq!(p("bytes=100-200,300-400", 100), Ranges::Unsatisfiable);
        assert_eq!(p("bytes=0-", 0), Ranges::Unsatisfiable);
        assert_eq!(p("bytes=-0", 100), Ranges::Unsatisfiable);
        assert_eq!(p("bytes=-5", 0), Ranges::Unsatisfiable);
    }

    #[test]
    fn malformed_foreign_or_huge_headers_are_ignored() {
        for v in [
            "",
            "bytes",
            "bytes=",
            "items=0-1",
            "bytes=5-1",
            "bytes=a-b",
            "bytes=1-2-3",
            "bytes=+1-2",
            "bytes=99999999999999999999-",
            "bytes=--1",
        ] {
            assert_eq!(p(v, 100), Ranges::Full, "{v:?}");
        }
        let many = format!("bytes={}", vec!["0-0"; MAX_RANGES + 1].join(","));
        assert_eq!(p(&many, 100), Ranges::Full);
        let fine = format!("bytes={}", vec!["0-0"; MAX_RANGES].join(","));
        assert!(matches!(p(&fine, 100), Ranges::Partial(v) if v.len() == MAX_RANGES));
        assert_eq!(parse(&[0xff, b'='], 10), Ranges::Full);
    }

    #[test]
    fn offsets_near_u64_max_do_not_overflow() {
        let big = u64::MAX;
        assert_eq!(
            p("bytes=18446744073709551614-", big),
            Ranges::Partial(vec![(big - 1, big - 1)])
        );
        assert_eq!(
            p("bytes=-18446744073709551615", 10),
            Ranges::Partial(vec![(0, 9)])
        );
    }
}
