//! Listing a collection for `copy -r URL DIR`: `PROPFIND` with `Depth: 1`
//! on the collection and on each collection under it, breadth first.
//!
//! A server decides what the walk finds, so everything it says is
//! bounded and checked: one answer is read up to [`MAX_ANSWER`] bytes and
//! parsed as a `207 Multi-Status` ([`parse_multistatus`], fuzzed); an
//! entry counts only if its `href`, percent-decoded, is the listed
//! collection's path plus exactly one segment that is a plain name (not
//! empty, `.`, `..`, and without `/` or NUL), so no answer can name a
//! local path outside the destination; the walk stops with an error past
//! [`MAX_ENTRIES`] entries or [`MAX_DEPTH`] levels.

use hyper::{Method, StatusCode};
use quick_xml::events::Event;

use super::{
    connect, failed, next_frame, runtime, status_error, ClientError, Connection, Options, Url,
};

/// The largest `PROPFIND` answer read (bytes).
pub const MAX_ANSWER: usize = 16 << 20;
/// The most entries (files and collections) one walk takes.
pub const MAX_ENTRIES: usize = 100_000;
/// The deepest a walk goes below its collection.
pub const MAX_DEPTH: usize = 64;

/// One `<D:response>` of a multistatus answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The `href` as sent (not decoded).
    pub href: String,
    /// A collection (`<D:resourcetype><D:collection/>`).
    pub collection: bool,
    /// `getcontentlength`, when given and a number.
    pub size: Option<u64>,
}

/// Parses a `207 Multi-Status` body: its responses, in order. Element
/// names are matched by local name (servers use any prefix); text is
/// unescaped. Not well-formed XML is an error.
pub fn parse_multistatus(body: &[u8]) -> Result<Vec<Listed>, String> {
    if body.len() > MAX_ANSWER {
        return Err(format!("the listing is over {MAX_ANSWER} bytes"));
    }
    let text = std::str::from_utf8(body).map_err(|_| "the listing is not UTF-8".to_string())?;
    let mut reader = quick_xml::Reader::from_str(text);
    let mut out = Vec::new();
    // The open elements' local names, innermost last (bounded: the
    // answer's size bounds it, and a depth past 64 is refused).
    let mut stack: Vec<String> = Vec::new();
    let mut cur: Option<Listed> = None;
    let mut text_buf = String::new();
    loop {
        let ev = reader
            .read_event()
            .map_err(|e| format!("the listing is not XML: {e}"))?;
        match ev {
            Event::Start(e) => {
                let name = e.local_name().as_ref().to_string();
                if stack.len() >= 64 {
                    return Err("the listing nests over 64 elements".into());
                }
                if name == "response" {
                    cur = Some(Listed {
                        href: String::new(),
                        collection: false,
                        size: None,
                    });
                }
                text_buf.clear();
                stack.push(name);
            }
            Event::Empty(e)
                if e.local_name().as_ref() == "collection"
                    && stack.last().is_some_and(|p| p == "resourcetype") =>
            {
                if let Some(c) = &mut cur {
                    c.collection = true;
                }
            }
            Event::Text(t) => text_buf.push_str(&t.xml10_content()),
            Event::CData(t) => text_buf.push_str(&t.xml10_content()),
            Event::GeneralRef(r) => {
                let name = r.xml10_content();
                if let Some(s) = quick_xml::escape::resolve_predefined_entity(&name) {
                    text_buf.push_str(s);
                } else if let Ok(Some(c)) = r.resolve_char_ref() {
                    text_buf.push(c);
                } else {
                    return Err(format!(
                        "the listing uses an unknown entity &{};",
                        name.chars().take(32).collect::<String>()
                    ));
                }
            }
            Event::End(_) => {
                let name = stack.pop().unwrap_or_default();
                match name.as_str() {
                    "href" if stack.last().is_some_and(|p| p == "response") => {
                        if let Some(c) = &mut cur {
                            c.href = text_buf.trim().to_string();
                        }
                    }
                    "getcontentlength" => {
                        if let Some(c) = &mut cur {
                            c.size = text_buf.trim().parse().ok();
                        }
                    }
                    "collection" if stack.last().is_some_and(|p| p == "resourcetype") => {
                        if let Some(c) = &mut cur {
                            c.collection = true;
                        }
                    }
                    "response" => {
                        if let Some(c) = cur.take() {
                            if out.len() >= MAX_ENTRIES {
                                return Err(format!("the listing has over {MAX_ENTRIES} entries"));
                            }
                            out.push(c);
                        }
                    }
                    _ => {}
                }
                text_buf.clear();
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if !stack.is_empty() {
        return Err("the listing ends inside an element".into());
    }
    Ok(out)
}

/// The path part of an `href` (an absolute URL's path, or the path as it
/// is), percent-decoded.
fn href_path(href: &str) -> Vec<u8> {
    let path = match href.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => href,
    };
    let path = path.split(['?', '#']).next().unwrap_or("");
    percent_encoding::percent_decode_str(path).collect()
}

/// The child's name if `href` is `dir` (a decoded collection path ending
/// with `/`) plus one plain segment (and perhaps a trailing `/`).
pub fn child_name(dir: &[u8], href: &str) -> Option<Vec<u8>> {
    let p = href_path(href);
    let rest = p.strip_prefix(dir)?;
    let rest = rest.strip_suffix(b"/").unwrap_or(rest);
    (!rest.is_empty()
        && rest != b"."
        && rest != b".."
        && !rest.contains(&b'/')
        && !rest.contains(&0))
    .then(|| rest.to_vec())
}

/// An entry of a walked tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Path segments below the walked collection (decoded names).
    pub rel: Vec<Vec<u8>>,
    /// The entry's URL.
    pub url: Url,
    /// A collection.
    pub dir: bool,
    /// A file's size, as listed.
    pub size: Option<u64>,
}

const PROPFIND_BODY: &str = "<?xml version=\"1.0\" encoding=\"utf-8\"?>\
<D:propfind xmlns:D=\"DAV:\"><D:prop><D:resourcetype/><D:getcontentlength/></D:prop></D:propfind>";

async fn propfind(
    conn: &mut Connection,
    url: &Url,
    opts: &Options,
) -> Result<Vec<Listed>, ClientError> {
    let method = Method::from_bytes(b"PROPFIND").map_err(|e| failed(e.to_string()))?;
    let req = conn
        .request(method.clone(), &url.path, opts)
        .header("depth", "1")
        .header(hyper::header::CONTENT_TYPE, "application/xml")
        .body(super::full(PROPFIND_BODY))
        .map_err(|e| failed(e.to_string()))?;
    let res = conn.send(req).await?;
    let status = res.status();
    if status != StatusCode::MULTI_STATUS {
        let why = super::error_text(res.into_body()).await;
        return Err(status_error(url, &method, status, &why));
    }
    let mut body = res.into_body();
    let mut data = Vec::new();
    while let Some(f) = next_frame(&mut body, url).await? {
        if let Ok(d) = f.into_data() {
            if data.len() + d.len() > MAX_ANSWER {
                return Err(failed(format!(
                    "{}: the listing is over {MAX_ANSWER} bytes",
                    url.display()
                )));
            }
            data.extend_from_slice(&d);
        }
    }
    parse_multistatus(&data).map_err(|e| failed(format!("PROPFIND {}: {e}", url.display())))
}

/// Walks the collection `url` (breadth first): its files and
/// collections, each with its path below it. Names a server lists that
/// are not plain children of the collection listed are left out.
pub fn walk(url: &Url, opts: &Options) -> Result<Vec<Entry>, ClientError> {
    let mut base = url.clone();
    if !base.is_dir() {
        base.path.push('/');
    }
    let rt = runtime()?;
    rt.block_on(async {
        let mut conn = connect(&base, opts).await?;
        let mut out: Vec<Entry> = Vec::new();
        let mut queue = std::collections::VecDeque::from([(base.clone(), Vec::<Vec<u8>>::new())]);
        while let Some((dir, rel)) = queue.pop_front() {
            let listed = propfind(&mut conn, &dir, opts).await?;
            let dir_path = href_path(&dir.path);
            for l in listed {
                let Some(name) = child_name(&dir_path, &l.href) else {
                    continue;
                };
                if out.len() >= MAX_ENTRIES {
                    return Err(failed(format!(
                        "{}: over {MAX_ENTRIES} entries: copy a smaller tree",
                        base.display()
                    )));
                }
                let mut r = rel.clone();
                r.push(name.clone());
                let mut u = dir.join(&name);
                if l.collection {
                    if r.len() > MAX_DEPTH {
                        return Err(failed(format!(
                            "{}: deeper than {MAX_DEPTH} levels",
                            base.display()
                        )));
                    }
                    u.path.push('/');
                    queue.push_back((u.clone(), r.clone()));
                }
                out.push(Entry {
                    rel: r,
                    url: u,
                    dir: l.collection,
                    size: l.size,
                });
            }
        }
        Ok(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multistatus_of_any_prefix_is_read_and_names_are_checked() {
        let body = br#"<?xml version="1.0"?>
<d:multistatus xmlns:d="DAV:"><d:response><d:href>/e/dir/</d:href>
<d:propstat><d:prop><d:resourcetype><d:collection/></d:resourcetype></d:prop><d:status>HTTP/1.1 200 OK</d:status></d:propstat></d:response>
<d:response><d:href>http://h:1/e/dir/a%20b&amp;c.bin</d:href><d:propstat><d:prop><d:resourcetype/><d:getcontentlength>12</d:getcontentlength></d:prop></d:propstat></d:response>
<response xmlns="DAV:"><href>/e/dir/sub/</href><propstat><prop><resourcetype><collection></collection></resourcetype></prop></propstat></response>
<d:response><d:href>/e/dir/../etc/</d:href></d:response>
<d:response><d:href>/e/other/x</d:href></d:response>
<d:response><d:href>/e/dir/a%2fb</d:href></d:response>
</d:multistatus>"#;
        let l = parse_multistatus(body).unwrap();
        assert_eq!(l.len(), 6);
        assert!(l[0].collection);
        assert_eq!(l[1].href, "http://h:1/e/dir/a%20b&c.bin");
        assert_eq!((l[1].collection, l[1].size), (false, Some(12)));
        assert!(l[2].collection);
        let dir = b"/e/dir/";
        let names: Vec<Option<Vec<u8>>> = l.iter().map(|x| child_name(dir, &x.href)).collect();
        assert_eq!(
            names,
            [
                None,
                Some(b"a b&c.bin".to_vec()),
                Some(b"sub".to_vec()),
                None,
                None,
                None
            ]
        );
        assert!(parse_multistatus(b"<a><b></a>").is_err());
        assert!(parse_multistatus(b"<a>&bogus;</a>").is_err());
        assert!(parse_multistatus(&[0xff, 0xfe]).is_err());
    }
}
