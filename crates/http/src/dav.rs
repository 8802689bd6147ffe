//! WebDAV (RFC 4918) as clients of storage use it: PROPFIND's request
//! (`Depth`, the optional body) and its 207 multistatus answer.
//!
//! Every PROPFIND is answered with the same live properties, whatever it
//! asked for (what davix, gfal2, rclone and cadaver read: size, mtime,
//! collection, ETag, name); `allprop`, `prop` and an empty body are all
//! served so. Every `<D:propstat>` carries its `<D:status>` (davix drops
//! properties without one). The request body is only checked, never
//! interpreted: at most `Limits::propfind_body` bytes (413 beyond), UTF-8,
//! and a `propfind` element, or 400 ([`check_body`], fuzzed).

use std::fmt::Write as _;

use fatpipe_transfer::beneath::{Kind, Meta};

/// How deep a PROPFIND looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// The resource itself.
    Zero,
    /// The resource and its direct children.
    One,
    /// Everything beneath: refused (403), as RFC 4918 §9.1 lets a
    /// server do, so one request cannot walk a whole export.
    Infinity,
}

/// The `Depth` header's value; absent means infinity (RFC 4918 §9.1).
/// `None` for a value that is none of `0`, `1`, `infinity`.
pub fn depth(value: Option<&[u8]>) -> Option<Depth> {
    match value.map(|v| v.trim_ascii()) {
        None => Some(Depth::Infinity),
        Some(b"0") => Some(Depth::Zero),
        Some(b"1") => Some(Depth::One),
        Some(v) if v.eq_ignore_ascii_case(b"infinity") => Some(Depth::Infinity),
        Some(_) => None,
    }
}

/// Why a PROPFIND body is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// Larger than the cap.
    #[error("PROPFIND body larger than {0} bytes")]
    TooLarge(usize),
    /// Not a propfind document.
    #[error("PROPFIND body is not a DAV:propfind XML document")]
    NotPropfind,
}

/// Checks a PROPFIND request body (empty is `allprop`).
pub fn check_body(body: &[u8], max: usize) -> Result<(), BodyError> {
    if body.len() > max {
        return Err(BodyError::TooLarge(max));
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    let text = std::str::from_utf8(body).map_err(|_| BodyError::NotPropfind)?;
    let t = text.trim_start_matches('\u{feff}').trim_start();
    if !t.starts_with('<') || !t.contains("propfind") {
        return Err(BodyError::NotPropfind);
    }
    Ok(())
}

/// One resource of a multistatus answer.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its URL path, percent-encoded (a collection's ends in `/`).
    pub href: String,
    /// Its last path segment, decoded (lossy UTF-8).
    pub name: String,
    /// Its metadata.
    pub meta: Meta,
}

/// The 207 body listing `entries`.
pub fn multistatus(entries: &[Entry]) -> String {
    let mut s = String::with_capacity(200 + entries.len() * 400);
    s.push_str("<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<D:multistatus xmlns:D=\"DAV:\">\n");
    for e in entries {
        let dir = e.meta.kind == Kind::Dir;
        let _ = write!(
            s,
            "<D:response><D:href>{}</D:href><D:propstat><D:prop>\
             <D:displayname>{}</D:displayname>",
            xml_escape(&e.href),
            xml_escape(&e.name)
        );
        if dir {
            s.push_str("<D:resourcetype><D:collection/></D:resourcetype>");
        } else {
            let _ = write!(
                s,
                "<D:resourcetype/><D:getcontentlength>{}</D:getcontentlength>\
                 <D:getcontenttype>application/octet-stream</D:getcontenttype>",
                e.meta.size
            );
        }
        let _ = writeln!(
            s,
            "<D:getlastmodified>{}</D:getlastmodified><D:getetag>{}</D:getetag>\
             </D:prop><D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response>",
            http_date(&e.meta),
            xml_escape(&crate::digest::etag(&e.meta))
        );
    }
    s.push_str("</D:multistatus>\n");
    s
}

/// The modification time as an HTTP date (`Last-Modified`,
/// `getlastmodified`).
pub fn http_date(meta: &Meta) -> String {
    let t = if meta.mtime_s >= 0 {
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(meta.mtime_s.unsigned_abs())
    } else {
        std::time::UNIX_EPOCH
    };
    httpdate::fmt_http_date(t)
}

/// Text as XML character data: markup escaped, and characters XML 1.0
/// cannot carry (controls) replaced by U+FFFD.
pub fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_values() {
        assert_eq!(depth(Some(b"0")), Some(Depth::Zero));
        assert_eq!(depth(Some(b" 1 ")), Some(Depth::One));
        assert_eq!(depth(Some(b"Infinity")), Some(Depth::Infinity));
        assert_eq!(depth(None), Some(Depth::Infinity));
        assert_eq!(depth(Some(b"2")), None);
    }

    #[test]
    fn bodies_are_capped_and_must_be_propfind() {
        assert_eq!(check_body(b"", 10), Ok(()));
        assert_eq!(check_body(b" \r\n", 10), Ok(()));
        let allprop =
            br#"<?xml version="1.0"?><D:propfind xmlns:D="DAV:"><D:allprop/></D:propfind>"#;
        assert_eq!(check_body(allprop, 1000), Ok(()));
        assert_eq!(check_body(allprop, 10), Err(BodyError::TooLarge(10)));
        assert_eq!(check_body(b"hello", 100), Err(BodyError::NotPropfind));
        assert_eq!(check_body(&[0xff, b'<'], 100), Err(BodyError::NotPropfind));
    }

    #[test]
    fn markup_and_controls_are_escaped() {
        assert_eq!(
            xml_escape("a<b>&\"'\u{1}c"),
            "a&lt;b&gt;&amp;&quot;&apos;\u{fffd}c"
        );
    }
}
