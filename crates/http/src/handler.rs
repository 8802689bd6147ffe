//! The requests: one function per method, chosen by [`Method`] in
//! [`handle`]. A method joins by adding a variant and an arm (the
//! third-party `COPY` is [`crate::tpc`]'s).
//!
//! Every request goes the same way: admitted as a session at the
//! connection's first request; its path decoded and confined ([`path`]);
//! authorised for what it does on that path ([`Perm`]: `:public` exports
//! need no token, the others a bearer token whose scope covers it, `:ro`
//! exports refuse every write); then served from the export's directory
//! with the copy service's confinement (`beneath::Dir`). Answers to what
//! went wrong carry one line of text saying why.
//!
//! Writes never show a torn file: a PUT writes an unnamed file
//! (`O_TMPFILE`; a hidden `.fatpipe-put.*` name where the file system has
//! none, removed on failure), fsyncs it, keeps its checksums with it, and
//! only then gives it its name with a rename (and fsyncs the directory).
//! A body cut off midway leaves nothing under the final name.

// The helpers' error is the answer to send (a `Response`), built once per
// request: its size costs nothing worth a box.
#![allow(clippy::result_large_err)]

use std::convert::Infallible;
use std::fs::File;
use std::io::{self, Write};
use std::rc::Rc;

use fatpipe_engine::Flow;
use fatpipe_sys::OFlags;
use fatpipe_transfer::beneath::{fstat, Dir, Kind, Meta, ResolveError};
use fatpipe_transfer::relpath::RelPath;
use http_body_util::BodyExt;
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Request, Response, StatusCode};

use crate::body::{Body, Seg};
use crate::conn::Shared;
use crate::dav::{self, Depth};
use crate::digest::{self, Algo, Sums, Wanted};
use crate::path::{self, Target};
use crate::range::{self, Ranges};
use crate::token::Perm;
use crate::Export;

/// The methods served (and `Other` for the rest, answered 405).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// RFC 9110.
    Get,
    /// RFC 9110.
    Head,
    /// RFC 9110.
    Put,
    /// RFC 9110; only to answer macaroon requests (refused at once).
    Post,
    /// RFC 9110.
    Options,
    /// RFC 4918.
    Propfind,
    /// RFC 4918.
    Mkcol,
    /// RFC 4918.
    Delete,
    /// RFC 4918.
    Move,
    /// RFC 4918; HTTP third-party copy ([`crate::tpc`]).
    Copy,
    /// Anything else.
    Other,
}

impl Method {
    /// From the request's method.
    pub fn of(m: &hyper::Method) -> Method {
        match m.as_str() {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "PUT" => Method::Put,
            "POST" => Method::Post,
            "OPTIONS" => Method::Options,
            "PROPFIND" => Method::Propfind,
            "MKCOL" => Method::Mkcol,
            "DELETE" => Method::Delete,
            "MOVE" => Method::Move,
            "COPY" => Method::Copy,
            _ => Method::Other,
        }
    }

    /// The label in `/metrics` (a fixed set: a peer cannot grow it).
    pub fn label(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Put => "PUT",
            Method::Post => "POST",
            Method::Options => "OPTIONS",
            Method::Propfind => "PROPFIND",
            Method::Mkcol => "MKCOL",
            Method::Delete => "DELETE",
            Method::Move => "MOVE",
            Method::Copy => "COPY",
            Method::Other => "other",
        }
    }
}

/// The `Allow` header: every method served.
pub const ALLOW: &str = "OPTIONS, GET, HEAD, PUT, DELETE, MKCOL, MOVE, PROPFIND, COPY";

/// Prefix of the server's own names in an export (sidecars, temporary
/// uploads): hidden from listings, refused to clients.
pub const OWN_PREFIX: &[u8] = b".fatpipe-";

pub(crate) type Resp = Response<Body>;

/// Serves one request.
pub(crate) async fn handle(sh: Rc<Shared>, req: Request<Incoming>) -> Result<Resp, Infallible> {
    let method = Method::of(req.method());
    let shown = req.uri().path().chars().take(200).collect::<String>();
    let mut resp = match sh.admit() {
        Err(reason) => {
            let mut r = text(StatusCode::SERVICE_UNAVAILABLE, &reason);
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            r
        }
        Ok(()) => dispatch(&sh, method, req).await,
    };
    let status = resp.status().as_u16();
    sh.conn
        .borrow()
        .observer()
        .http_request(method.label(), status);
    let read_only = matches!(
        method,
        Method::Get | Method::Head | Method::Propfind | Method::Options
    );
    // Writes and refusals are logged; a read's 404 is how clients ask
    // whether something exists (gfal2 asks several times per copy).
    if !read_only || status == 401 || status == 403 || status >= 500 {
        sh.log(&format!("{} {shown} -> {status}", method.label()));
    }
    let h = resp.headers_mut();
    h.insert(
        header::SERVER,
        HeaderValue::from_static(concat!("fatpipe/", env!("CARGO_PKG_VERSION"))),
    );
    if sh.conn.borrow().shutdown().is_set() {
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    Ok(resp)
}

async fn dispatch(sh: &Rc<Shared>, method: Method, req: Request<Incoming>) -> Resp {
    let target = match path::parse(req.uri().path()) {
        Ok(t) => t,
        Err(e) => return text(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    match method {
        Method::Options => options_for(sh, &target, req.headers()),
        Method::Get | Method::Head => get(sh, &target, &req, method == Method::Head),
        Method::Put => put(sh, &target, req).await,
        Method::Propfind => propfind(sh, &target, req).await,
        Method::Mkcol => mkcol(sh, &target, req.headers()),
        Method::Delete => delete(sh, &target, req.headers()),
        Method::Move => do_move(sh, &target, req.headers()),
        Method::Post => post(req.headers()),
        Method::Copy => crate::tpc::copy(sh, &target, req).await,
        Method::Other => {
            let mut r = text(
                StatusCode::METHOD_NOT_ALLOWED,
                &format!(
                    "method {} is not served",
                    req.method().as_str().chars().take(20).collect::<String>()
                ),
            );
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(ALLOW));
            r
        }
    }
}

/// An export and the directory it publishes, found for a target.
pub(crate) struct Found<'a> {
    pub(crate) export: &'a Export,
    pub(crate) root: Dir,
}

/// The export a target names, opened, or the answer to give.
pub(crate) fn export_of<'a>(sh: &'a Shared, t: &Target) -> Result<Found<'a>, Resp> {
    let Some(name) = &t.export else {
        return Err(text(
            StatusCode::NOT_FOUND,
            "no export named in the path (/EXPORT/...)",
        ));
    };
    let Some(export) = sh.cfg.exports.iter().find(|e| &e.name == name) else {
        return Err(text(StatusCode::NOT_FOUND, "no such export on this server"));
    };
    let root = Dir::open(&export.path).map_err(|e| {
        text(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("export unavailable: {e}"),
        )
    })?;
    Ok(Found { export, root })
}

/// Checks the request may do `perm` on `t` in `export`.
pub(crate) fn authorize(
    sh: &Shared,
    headers: &HeaderMap,
    export: &Export,
    t: &Target,
    perm: Perm,
) -> Result<(), Resp> {
    if perm != Perm::Read && export.read_only {
        return Err(text(
            StatusCode::FORBIDDEN,
            &format!("export '{}' is read-only", export.name),
        ));
    }
    if export.public {
        return Ok(());
    }
    let Some(verifier) = &sh.cfg.tokens else {
        return Err(text(
            StatusCode::FORBIDDEN,
            &format!(
                "export '{}' needs a bearer token, and this server has no key to verify one (--key-file, --http-issuer)",
                export.name
            ),
        ));
    };
    let unauthorized = |why: &str, error: &str| {
        let mut r = text(StatusCode::UNAUTHORIZED, why);
        let challenge = if error.is_empty() {
            "Bearer realm=\"fatpipe\"".to_string()
        } else {
            format!("Bearer realm=\"fatpipe\", error=\"{error}\"")
        };
        if let Ok(v) = HeaderValue::from_str(&challenge) {
            r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
        }
        r
    };
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(unauthorized(
            &format!(
                "export '{}' needs an 'Authorization: Bearer' token",
                export.name
            ),
            "",
        ));
    };
    let value = value.to_str().unwrap_or("");
    let token = match value.split_once(' ') {
        Some((scheme, tok)) if scheme.eq_ignore_ascii_case("bearer") => tok.trim(),
        _ => {
            return Err(unauthorized(
                "only 'Authorization: Bearer' tokens are accepted",
                "invalid_request",
            ))
        }
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let grant = verifier
        .verify(token, now)
        .map_err(|e| unauthorized(&e.to_string(), "invalid_token"))?;
    let p = t.scope_path();
    if !grant.allows(perm, &p) {
        return Err(text(
            StatusCode::FORBIDDEN,
            &format!("the token's scope does not grant {} on {p}", perm.name()),
        ));
    }
    Ok(())
}

fn options() -> Resp {
    let mut r = Response::new(Body::empty());
    let h = r.headers_mut();
    h.insert(header::ALLOW, HeaderValue::from_static(ALLOW));
    h.insert("DAV", HeaderValue::from_static("1"));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    r
}

/// gfal2 asks for a macaroon with `POST` (`application/macaroon-request`)
/// and waits: refused at once, saying what to use instead.
fn post(headers: &HeaderMap) -> Resp {
    let macaroon = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/macaroon-request"));
    if macaroon {
        text(
            StatusCode::NOT_IMPLEMENTED,
            "macaroons are not issued here; use a bearer token minted with 'fatpipe token'",
        )
    } else {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "POST is not served");
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static(ALLOW));
        r
    }
}

/// Resolves the parent directory of `rel` beneath `root`; the answer to
/// give when it is missing (409) or leads out (403).
pub(crate) fn parent_of(root: &Dir, rel: &RelPath) -> Result<Dir, Resp> {
    let (parent, _) = rel.split_last();
    root.dir_beneath(parent.as_ref()).map_err(|e| match e {
        ResolveError::Escapes => text(StatusCode::FORBIDDEN, "the path leads outside the export"),
        ResolveError::Io(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            text(StatusCode::CONFLICT, "the parent directory does not exist")
        }
        ResolveError::Io(e) => io_resp(&e),
    })
}

/// The object `t` names: its parent directory, its name and metadata
/// (`None` if missing); the export root has no parent.
pub(crate) struct Object {
    pub(crate) parent: Option<Dir>,
    pub(crate) name: Vec<u8>,
    pub(crate) meta: Option<Meta>,
}

pub(crate) fn object(f: &Found<'_>, t: &Target) -> Result<Object, Resp> {
    let Some(rel) = &t.rel else {
        let meta = f.root.stat_self().map_err(|e| io_resp(&e))?;
        return Ok(Object {
            parent: None,
            name: Vec::new(),
            meta: Some(meta),
        });
    };
    let parent = match parent_of(&f.root, rel) {
        Ok(p) => p,
        Err(r) if r.status() == StatusCode::CONFLICT => {
            return Ok(Object {
                parent: None,
                name: rel.split_last().1.to_vec(),
                meta: None,
            })
        }
        Err(r) => return Err(r),
    };
    let name = rel.split_last().1.to_vec();
    let meta = parent.stat_at(&name).map_err(|e| io_resp(&e))?;
    Ok(Object {
        parent: Some(parent),
        name,
        meta,
    })
}

fn get(sh: &Shared, t: &Target, req: &Request<Incoming>, head: bool) -> Resp {
    if t.export.is_none() {
        return exports_index(sh, head);
    }
    let f = match export_of(sh, t) {
        Ok(f) => f,
        Err(r) => return r,
    };
    if let Err(r) = authorize(sh, req.headers(), f.export, t, Perm::Read) {
        return r;
    }
    let o = match object(&f, t) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let Some(meta) = o.meta else {
        return text(StatusCode::NOT_FOUND, "no such file or directory");
    };
    if hidden(&o.name) {
        return text(StatusCode::NOT_FOUND, "no such file or directory");
    }
    match meta.kind {
        Kind::Dir => return listing_page(sh, &f, t, head),
        Kind::File => {}
        _ => {
            return text(
                StatusCode::FORBIDDEN,
                "not a regular file (symlinks are not followed)",
            )
        }
    }
    let Some(parent) = &o.parent else {
        return text(StatusCode::NOT_FOUND, "no such file");
    };
    let file = match parent.open_at(&o.name, OFlags::RDONLY, 0) {
        Ok(f) => f,
        Err(e) => return io_resp(&e),
    };
    // The metadata of what was opened, not of the name a moment before.
    let meta = match fstat(&file) {
        Ok(m) if m.kind == Kind::File => m,
        Ok(_) => return text(StatusCode::FORBIDDEN, "not a regular file"),
        Err(e) => return io_resp(&e),
    };
    let size = meta.size;
    let etag = digest::etag(&meta);
    let mut h = HeaderMap::new();
    if let (Some(leg), Some(rel)) = (&sh.cfg.leg, &t.rel) {
        let https = sh.cfg.tls.is_some();
        crate::ticket::answer(
            leg,
            req.headers(),
            &f.export.name,
            rel.as_bytes(),
            https,
            &mut h,
        );
    }
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    insert(&mut h, header::ETAG, &etag);
    insert(&mut h, header::LAST_MODIFIED, &dav::http_date(&meta));
    let status_and_ranges = {
        let if_range_ok = req.headers().get(header::IF_RANGE).is_none_or(|v| {
            v.as_bytes() == etag.as_bytes() || v.to_str().ok() == Some(&dav::http_date(&meta))
        });
        match req.headers().get(header::RANGE) {
            Some(v) if if_range_ok => range::parse(v.as_bytes(), size),
            _ => Ranges::Full,
        }
    };
    let wants_whole_digest = matches!(status_and_ranges, Ranges::Full) || head;
    if wants_whole_digest {
        if let Err(r) = add_digests(sh, req.headers(), parent, &o.name, &file, &mut h) {
            return r;
        }
    }
    let report = sh.report();
    let (status, body) = match status_and_ranges {
        Ranges::Full => {
            insert(&mut h, header::CONTENT_TYPE, "application/octet-stream");
            (
                StatusCode::OK,
                Body::file(file, vec![Seg::File { off: 0, len: size }], report),
            )
        }
        Ranges::Unsatisfiable => {
            insert(&mut h, header::CONTENT_RANGE, &format!("bytes */{size}"));
            let mut r = text(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "no requested range overlaps the file",
            );
            r.headers_mut().extend(h);
            return r;
        }
        Ranges::Partial(ranges) if ranges.len() == 1 => {
            let (a, b) = ranges[0];
            insert(&mut h, header::CONTENT_TYPE, "application/octet-stream");
            insert(
                &mut h,
                header::CONTENT_RANGE,
                &format!("bytes {a}-{b}/{size}"),
            );
            (
                StatusCode::PARTIAL_CONTENT,
                Body::file(
                    file,
                    vec![Seg::File {
                        off: a,
                        len: b - a + 1,
                    }],
                    report,
                ),
            )
        }
        Ranges::Partial(ranges) => {
            let boundary = boundary();
            insert(
                &mut h,
                header::CONTENT_TYPE,
                &format!("multipart/byteranges; boundary={boundary}"),
            );
            let mut segs = Vec::with_capacity(ranges.len() * 2 + 1);
            for (a, b) in ranges {
                segs.push(Seg::Bytes(Bytes::from(format!(
                    "\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\
                     Content-Range: bytes {a}-{b}/{size}\r\n\r\n"
                ))));
                segs.push(Seg::File {
                    off: a,
                    len: b - a + 1,
                });
            }
            segs.push(Seg::Bytes(Bytes::from(format!("\r\n--{boundary}--\r\n"))));
            (StatusCode::PARTIAL_CONTENT, Body::file(file, segs, report))
        }
    };
    insert(&mut h, header::CONTENT_LENGTH, &body.len().to_string());
    let mut r = Response::new(if head { Body::empty() } else { body });
    *r.status_mut() = status;
    r.headers_mut().extend(h);
    r
}

/// Adds `Digest`/`Repr-Digest` when asked for: from what is kept with the
/// file, else computed now (one read) and kept.
fn add_digests(
    sh: &Shared,
    headers: &HeaderMap,
    parent: &Dir,
    name: &[u8],
    file: &File,
    out: &mut HeaderMap,
) -> Result<(), Resp> {
    let want: Option<Wanted> = headers
        .get("want-digest")
        .and_then(|v| digest::want_digest(v.as_bytes()));
    let want_repr: Option<Wanted> = headers
        .get("want-repr-digest")
        .and_then(|v| digest::want_repr_digest(v.as_bytes()));
    if want.is_none() && want_repr.is_none() {
        return Ok(());
    }
    let mut sums = digest::load(parent, name, file);
    let mut missing: Vec<Algo> = [&want, &want_repr]
        .into_iter()
        .flatten()
        .map(|w| w.algo)
        .filter(|a| sums.get(*a).is_none())
        .collect();
    if !missing.is_empty() {
        // One read of the file: the cheap inline ones come along.
        for a in &sh.cfg.inline {
            if sums.get(*a).is_none() && !missing.contains(a) {
                missing.push(*a);
            }
        }
        let computed = digest::compute(file, &missing).map_err(|e| io_resp(&e))?;
        sums.merge(computed);
        if let Err(e) = digest::store(parent, name, file, &sums) {
            sh.log(&format!("checksums not kept: {e}"));
        }
    }
    if let Some(w) = want {
        if let Some(raw) = sums.get(w.algo) {
            insert(
                out,
                "digest",
                &format!("{}={}", w.name, w.algo.digest_value(raw)),
            );
        }
    }
    if let Some(w) = want_repr {
        if let Some(raw) = sums.get(w.algo) {
            insert(
                out,
                "repr-digest",
                &format!("{}={}", w.name, w.algo.repr_value(raw)),
            );
        }
    }
    Ok(())
}

/// What a `PUT` (or a request checked as one) may write: the export, the
/// parent directory, the name and whether it existed.
pub(crate) struct Writable<'a> {
    pub(crate) f: Found<'a>,
    pub(crate) parent: Dir,
    pub(crate) name: Vec<u8>,
    pub(crate) existed: bool,
}

/// The checks of a `PUT` of `t` before its body: the name, the export
/// writable, the parent there, the token's right to create or modify,
/// a regular file if anything, and the preconditions (`If-None-Match: *`,
/// `If-Match: *`). Also what an `OPTIONS` asking for a ticket to write
/// `t` meets.
pub(crate) fn writable<'a>(
    sh: &'a Shared,
    t: &Target,
    headers: &HeaderMap,
) -> Result<Writable<'a>, Resp> {
    let f = export_of(sh, t)?;
    let Some(rel) = &t.rel else {
        return Err(text(
            StatusCode::METHOD_NOT_ALLOWED,
            "cannot PUT onto an export itself",
        ));
    };
    if t.slash {
        return Err(text(
            StatusCode::BAD_REQUEST,
            "a PUT names a file, not a directory (trailing '/')",
        ));
    }
    if headers.contains_key(header::CONTENT_RANGE) {
        return Err(text(
            StatusCode::BAD_REQUEST,
            "partial PUT (Content-Range) is not served",
        ));
    }
    let name = rel.split_last().1.to_vec();
    if hidden(&name) {
        return Err(text(
            StatusCode::FORBIDDEN,
            "names starting '.fatpipe-' are the server's own",
        ));
    }
    // Refuse before the body is read (and before `100 Continue` is sent):
    // read-only first, so a writer learns that without a token too.
    if f.export.read_only {
        return Err(text(
            StatusCode::FORBIDDEN,
            &format!("export '{}' is read-only", f.export.name),
        ));
    }
    let parent = match parent_of(&f.root, rel) {
        Ok(p) => p,
        Err(r) => {
            // A missing parent is 409 only to whom may know it.
            authorize(sh, headers, f.export, t, Perm::Create)?;
            return Err(r);
        }
    };
    let existing = parent.stat_at(&name).map_err(|e| io_resp(&e))?;
    let perm = if existing.is_some() {
        Perm::Modify
    } else {
        Perm::Create
    };
    authorize(sh, headers, f.export, t, perm)?;
    if matches!(existing, Some(m) if m.kind != Kind::File) {
        return Err(text(
            StatusCode::CONFLICT,
            "the name exists and is not a regular file",
        ));
    }
    // RFC 9110 preconditions: `If-None-Match: *` creates only,
    // `If-Match: *` replaces only.
    let star = |name| headers.get(name).is_some_and(|v| v.as_bytes() == b"*");
    if existing.is_some() && star(header::IF_NONE_MATCH) {
        return Err(text(
            StatusCode::PRECONDITION_FAILED,
            "the file exists (If-None-Match: *)",
        ));
    }
    if existing.is_none() && star(header::IF_MATCH) {
        return Err(text(
            StatusCode::PRECONDITION_FAILED,
            "no such file to replace (If-Match: *)",
        ));
    }
    Ok(Writable {
        f,
        parent,
        name,
        existed: existing.is_some(),
    })
}

/// `OPTIONS`: what the server serves; with `Fatpipe-Ticket: write` (the
/// push of a third-party copy from another fatpipe server, docs/http.md
/// "The leg"), checked as a `PUT` of the target and answered with a
/// ticket to push that file over the copy protocol.
fn options_for(sh: &Shared, t: &Target, headers: &HeaderMap) -> Resp {
    let Some(leg) = &sh.cfg.leg else {
        return options();
    };
    if crate::ticket::asked(headers) != Some(fatpipe_transfer::wire::Direction::Push) {
        return options();
    }
    let w = match writable(sh, t, headers) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let Some(rel) = &t.rel else {
        return options();
    };
    let mut r = options();
    let https = sh.cfg.tls.is_some();
    crate::ticket::answer_write(
        leg,
        &w.f.export.name,
        rel.as_bytes(),
        https,
        r.headers_mut(),
    );
    r
}

async fn put(sh: &Shared, t: &Target, req: Request<Incoming>) -> Resp {
    let Writable {
        parent,
        name,
        existed,
        ..
    } = match writable(sh, t, req.headers()) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let declared: Option<u64> = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    if let Some(len) = declared {
        match parent.space() {
            Ok(s) if s.free < len => {
                return text(
                    StatusCode::INSUFFICIENT_STORAGE,
                    &format!("{len} bytes do not fit: {} bytes free", s.free),
                )
            }
            _ => {}
        }
    }
    let mut algos = sh.cfg.inline.clone();
    for w in [
        req.headers()
            .get("want-digest")
            .and_then(|v| digest::want_digest(v.as_bytes())),
        req.headers()
            .get("want-repr-digest")
            .and_then(|v| digest::want_repr_digest(v.as_bytes())),
    ]
    .into_iter()
    .flatten()
    {
        if !algos.contains(&w.algo) {
            algos.push(w.algo);
        }
    }
    // Checksums the client sent with the body are checked before the file
    // gets its name: a mismatch leaves nothing.
    let sent = digest::sent_digests(
        req.headers().get("digest").map(HeaderValue::as_bytes),
        req.headers().get("repr-digest").map(HeaderValue::as_bytes),
    );
    for (a, _) in &sent {
        if !algos.contains(a) {
            algos.push(*a);
        }
    }
    let mut tmp = match Upload::start(&parent, &name) {
        Ok(u) => u,
        Err(e) => return io_resp(&e),
    };
    let mut hasher = digest::Hasher::new(&algos);
    let report = sh.report();
    let mut body = req.into_body();
    let mut written = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                tmp.abandon(&parent);
                return text(
                    StatusCode::BAD_REQUEST,
                    &format!("the body was cut off: {e}"),
                );
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if let Err(e) = tmp.file.write_all(&data) {
            tmp.abandon(&parent);
            return io_resp(&e);
        }
        hasher.update(&data);
        written += data.len() as u64;
        if let Some(r) = &report {
            r.bytes(Flow::Received, data.len() as u64);
        }
    }
    if declared.is_some_and(|d| d != written) {
        tmp.abandon(&parent);
        return text(
            StatusCode::BAD_REQUEST,
            "the body is not as long as its Content-Length",
        );
    }
    let sums = hasher.finish();
    if let Some((a, _)) = sent
        .iter()
        .find(|(a, v)| sums.get(*a) != Some(v.as_slice()))
    {
        tmp.abandon(&parent);
        return text(
            StatusCode::BAD_REQUEST,
            &format!(
                "the body's {} is not the one its Digest header gives; nothing was written",
                a.name()
            ),
        );
    }
    let done = tmp
        .file
        .sync_all()
        .and_then(|()| {
            if let Err(e) = digest::store(&parent, &name, &tmp.file, &sums) {
                sh.log(&format!("checksums not kept: {e}"));
            }
            tmp.finish(&parent, &name)
        })
        .and_then(|()| parent.sync());
    if let Err(e) = done {
        tmp.abandon(&parent);
        return io_resp(&e);
    }
    let mut r = Response::new(Body::empty());
    *r.status_mut() = if existed {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::CREATED
    };
    if let Ok(meta) = fstat(&tmp.file) {
        insert(r.headers_mut(), header::ETAG, &digest::etag(&meta));
    }
    r.extensions_mut().insert(crate::archive::Written(written));
    add_put_digests(&sums, r.headers_mut());
    r
}

/// The adler32 of what a PUT wrote, as `Digest` (what a client compares
/// with its own without asking).
fn add_put_digests(sums: &Sums, h: &mut HeaderMap) {
    if let Some(raw) = sums.get(Algo::Adler32) {
        insert(
            h,
            "digest",
            &format!("adler32={}", Algo::Adler32.digest_value(raw)),
        );
    }
}

/// A file being written: unnamed until complete, or under a hidden
/// temporary name where the file system has no unnamed files.
pub(crate) struct Upload {
    pub(crate) file: File,
    pub(crate) tmp_name: Option<Vec<u8>>,
}

impl Upload {
    pub(crate) fn start(parent: &Dir, name: &[u8]) -> io::Result<Upload> {
        if let Ok(file) = parent.open_unnamed(0o644) {
            return Ok(Upload {
                file,
                tmp_name: None,
            });
        }
        let mut rnd = [0u8; 8];
        getrandom::fill(&mut rnd).map_err(|e| io::Error::other(e.to_string()))?;
        let mut tmp = b".fatpipe-put.".to_vec();
        tmp.extend(
            rnd.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
                .bytes(),
        );
        let _ = name;
        let file = parent.open_at(&tmp, OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL, 0o644)?;
        Ok(Upload {
            file,
            tmp_name: Some(tmp),
        })
    }

    /// Gives the complete file its name (replacing what was there).
    pub(crate) fn finish(&mut self, parent: &Dir, name: &[u8]) -> io::Result<()> {
        if self.tmp_name.is_none() {
            let mut rnd = [0u8; 8];
            getrandom::fill(&mut rnd).map_err(|e| io::Error::other(e.to_string()))?;
            let mut tmp = b".fatpipe-put.".to_vec();
            tmp.extend(
                rnd.iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>()
                    .bytes(),
            );
            parent.link_fd_at(&self.file, &tmp)?;
            self.tmp_name = Some(tmp);
        }
        if let Some(tmp) = &self.tmp_name {
            // A sidecar of the old file (where there are no xattrs) was
            // already replaced by the new file's record (`digest::store`),
            // and a stale one would not match the new size and mtime.
            parent.rename_at(tmp, name)?;
        }
        self.tmp_name = None;
        Ok(())
    }

    /// Removes what was written (an unnamed file just goes with its
    /// descriptor).
    pub(crate) fn abandon(&mut self, parent: &Dir) {
        if let Some(tmp) = self.tmp_name.take() {
            let _ = parent.unlink_at(&tmp);
        }
    }
}

async fn propfind(sh: &Shared, t: &Target, req: Request<Incoming>) -> Resp {
    let depth = match dav::depth(req.headers().get("depth").map(HeaderValue::as_bytes)) {
        Some(Depth::Infinity) => {
            return text(
                StatusCode::FORBIDDEN,
                "PROPFIND with Depth: infinity (or no Depth) is not served; use Depth 0 or 1",
            )
        }
        Some(d) => d,
        None => return text(StatusCode::BAD_REQUEST, "Depth must be 0, 1 or infinity"),
    };
    let f = match export_of(sh, t) {
        Ok(f) => f,
        Err(r) => return r,
    };
    if let Err(r) = authorize(sh, req.headers(), f.export, t, Perm::Read) {
        return r;
    }
    let max = sh.cfg.limits.propfind_body;
    let mut body = req.into_body();
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return text(StatusCode::BAD_REQUEST, "the body was cut off");
        };
        if let Ok(d) = frame.into_data() {
            if buf.len() + d.len() > max {
                return text(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &format!("PROPFIND body larger than {max} bytes"),
                );
            }
            buf.extend_from_slice(&d);
        }
    }
    if let Err(e) = dav::check_body(&buf, max) {
        return text(StatusCode::BAD_REQUEST, &e.to_string());
    }
    let o = match object(&f, t) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let Some(meta) = o.meta.filter(|m| matches!(m.kind, Kind::File | Kind::Dir)) else {
        return text(StatusCode::NOT_FOUND, "no such file or directory");
    };
    if hidden(&o.name) {
        return text(StatusCode::NOT_FOUND, "no such file or directory");
    }
    let mut entries = vec![dav::Entry {
        href: t.href(meta.kind == Kind::Dir),
        name: display_name(t),
        meta,
    }];
    if depth == Depth::One && meta.kind == Kind::Dir {
        let dir = match &t.rel {
            None => f.root.try_clone(),
            Some(_) => match &o.parent {
                Some(p) => p.subdir(&o.name),
                None => Err(io::ErrorKind::NotFound.into()),
            },
        };
        let children = match dir.and_then(|d| list(&d, sh.cfg.limits.max_listing).map(|l| (d, l))) {
            Ok((_, l)) => l,
            Err(e) => return io_resp(&e),
        };
        for (name, m) in children {
            let Some(c) = t.child(&name) else { continue };
            entries.push(dav::Entry {
                href: c.href(m.kind == Kind::Dir),
                name: String::from_utf8_lossy(&name).into_owned(),
                meta: m,
            });
        }
    }
    let mut r = Response::new(Body::text(dav::multistatus(&entries)));
    *r.status_mut() = StatusCode::MULTI_STATUS;
    insert(
        r.headers_mut(),
        header::CONTENT_TYPE,
        "application/xml; charset=utf-8",
    );
    r
}

fn mkcol(sh: &Shared, t: &Target, headers: &HeaderMap) -> Resp {
    let f = match export_of(sh, t) {
        Ok(f) => f,
        Err(r) => return r,
    };
    let Some(rel) = &t.rel else {
        return text(StatusCode::METHOD_NOT_ALLOWED, "the export exists");
    };
    if let Err(r) = authorize(sh, headers, f.export, t, Perm::Create) {
        return r;
    }
    let has_body = headers
        .get(header::CONTENT_LENGTH)
        .is_some_and(|v| v.as_bytes() != b"0")
        || headers.contains_key(header::TRANSFER_ENCODING);
    if has_body {
        return text(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "MKCOL with a body is not served",
        );
    }
    let name = rel.split_last().1.to_vec();
    if hidden(&name) {
        return text(
            StatusCode::FORBIDDEN,
            "names starting '.fatpipe-' are the server's own",
        );
    }
    let parent = match parent_of(&f.root, rel) {
        Ok(p) => p,
        Err(r) => return r,
    };
    match parent.stat_at(&name) {
        Ok(Some(_)) => return text(StatusCode::METHOD_NOT_ALLOWED, "the name exists"),
        Ok(None) => {}
        Err(e) => return io_resp(&e),
    }
    match parent.mkdir_at(&name, 0o755).and_then(|()| parent.sync()) {
        Ok(()) => status(StatusCode::CREATED),
        Err(e) => io_resp(&e),
    }
}

fn delete(sh: &Shared, t: &Target, headers: &HeaderMap) -> Resp {
    let f = match export_of(sh, t) {
        Ok(f) => f,
        Err(r) => return r,
    };
    if t.rel.is_none() {
        return text(StatusCode::FORBIDDEN, "an export cannot be deleted");
    }
    if let Err(r) = authorize(sh, headers, f.export, t, Perm::Modify) {
        return r;
    }
    let o = match object(&f, t) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let (Some(parent), Some(meta)) = (&o.parent, o.meta) else {
        return text(StatusCode::NOT_FOUND, "no such file or directory");
    };
    if hidden(&o.name) {
        return text(StatusCode::NOT_FOUND, "no such file or directory");
    }
    let done = if meta.kind == Kind::Dir {
        remove_tree(parent, &o.name, sh.cfg.limits.max_listing)
    } else {
        parent
            .unlink_at(&o.name)
            .map(|()| digest::forget(parent, &o.name))
    };
    match done.and_then(|()| parent.sync()) {
        Ok(()) => status(StatusCode::NO_CONTENT),
        Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty => text(
            StatusCode::CONFLICT,
            "the directory changed while it was deleted",
        ),
        Err(e) => io_resp(&e),
    }
}

fn do_move(sh: &Shared, t: &Target, headers: &HeaderMap) -> Resp {
    let f = match export_of(sh, t) {
        Ok(f) => f,
        Err(r) => return r,
    };
    if t.rel.is_none() {
        return text(StatusCode::FORBIDDEN, "an export cannot be moved");
    }
    let Some(dest) = headers
        .get("destination")
        .and_then(|v| path::destination(v.as_bytes()))
    else {
        return text(
            StatusCode::BAD_REQUEST,
            "MOVE needs a Destination header (a URL on this server)",
        );
    };
    let dt = match path::parse(&dest) {
        Ok(d) => d,
        Err(e) => return text(StatusCode::BAD_REQUEST, &format!("Destination: {e}")),
    };
    if dt.export != t.export {
        return text(StatusCode::BAD_GATEWAY, "MOVE within one export only");
    }
    let Some(drel) = &dt.rel else {
        return text(StatusCode::FORBIDDEN, "cannot MOVE onto an export");
    };
    let replace = !headers
        .get("overwrite")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"F"));
    if let Err(r) = authorize(sh, headers, f.export, t, Perm::Modify) {
        return r;
    }
    let o = match object(&f, t) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let (Some(sparent), Some(_)) = (&o.parent, o.meta) else {
        return text(StatusCode::NOT_FOUND, "no such file or directory");
    };
    let dname = drel.split_last().1.to_vec();
    if hidden(&o.name) || hidden(&dname) {
        return text(
            StatusCode::FORBIDDEN,
            "names starting '.fatpipe-' are the server's own",
        );
    }
    let dparent = match parent_of(&f.root, drel) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let existed = match dparent.stat_at(&dname) {
        Ok(m) => m.is_some(),
        Err(e) => return io_resp(&e),
    };
    let perm = if existed { Perm::Modify } else { Perm::Create };
    if let Err(r) = authorize(sh, headers, f.export, &dt, perm) {
        return r;
    }
    if existed && !replace {
        return text(
            StatusCode::PRECONDITION_FAILED,
            "the destination exists and Overwrite is F",
        );
    }
    let done = sparent
        .rename_to(&o.name, &dparent, &dname, replace)
        .and_then(|()| sparent.sync())
        .and_then(|()| dparent.sync());
    match done {
        Ok(()) => {
            digest::forget(sparent, &o.name);
            digest::forget(&dparent, &dname);
            status(if existed {
                StatusCode::NO_CONTENT
            } else {
                StatusCode::CREATED
            })
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => text(
            StatusCode::PRECONDITION_FAILED,
            "the destination exists and Overwrite is F",
        ),
        Err(e) => io_resp(&e),
    }
}

/// The deepest directory tree DELETE removes (each level holds a
/// descriptor while its entries go).
pub const MAX_DELETE_DEPTH: usize = 256;

/// Removes directory `name` in `parent` and everything in it (WebDAV's
/// DELETE of a collection), never following a symlink (a link is removed,
/// not what it points to); at most `max` entries and
/// [`MAX_DELETE_DEPTH`] levels, then an error with what is left in place.
fn remove_tree(parent: &Dir, name: &[u8], max: usize) -> io::Result<()> {
    let mut stack: Vec<(Dir, Vec<u8>)> = vec![(parent.try_clone()?, name.to_vec())];
    let mut removed = 0usize;
    while let Some((p, n)) = stack.last() {
        let dir = p.subdir(n)?;
        let mut deeper = None;
        for child in dir.read_dir()? {
            match dir.stat_at(&child)? {
                Some(m) if m.kind == Kind::Dir => {
                    deeper = Some(child);
                    break;
                }
                Some(_) => dir.unlink_at(&child)?,
                None => {}
            }
            removed += 1;
            if removed > max {
                return Err(io::Error::new(
                    io::ErrorKind::StorageFull,
                    format!("more than {max} entries to delete; the rest is left"),
                ));
            }
        }
        match deeper {
            Some(child) => {
                if stack.len() >= MAX_DELETE_DEPTH {
                    return Err(io::Error::new(
                        io::ErrorKind::StorageFull,
                        format!("deeper than {MAX_DELETE_DEPTH} levels; the rest is left"),
                    ));
                }
                stack.push((dir, child));
            }
            None => {
                if let Some((p, n)) = stack.pop() {
                    p.rmdir_at(&n)?;
                }
            }
        }
    }
    Ok(())
}

/// `GET /`: the exports (names only; what each holds needs its rights).
fn exports_index(sh: &Shared, head: bool) -> Resp {
    let mut s =
        String::from("<html><head><title>fatpipe</title></head><body><h1>Exports</h1><ul>\n");
    for e in &sh.cfg.exports {
        let href = path::encode(e.name.as_bytes());
        s.push_str(&format!(
            "<li><a href=\"/{href}/\">{}</a></li>\n",
            dav::xml_escape(&e.name)
        ));
    }
    s.push_str("</ul></body></html>\n");
    html(s, head)
}

/// `GET` of a directory: its entries as links.
fn listing_page(sh: &Shared, f: &Found<'_>, t: &Target, head: bool) -> Resp {
    let dir = match &t.rel {
        None => f.root.try_clone(),
        Some(r) => f.root.dir_beneath(Some(r)).map_err(ResolveError::into_io),
    };
    let entries = match dir.and_then(|d| list(&d, sh.cfg.limits.max_listing)) {
        Ok(e) => e,
        Err(e) => return io_resp(&e),
    };
    let mut s = format!(
        "<html><head><title>{0}</title></head><body><h1>{0}</h1><ul>\n",
        dav::xml_escape(&t.scope_path())
    );
    for (name, m) in entries {
        let Some(c) = t.child(&name) else { continue };
        let dir = m.kind == Kind::Dir;
        s.push_str(&format!(
            "<li><a href=\"{}\">{}{}</a></li>\n",
            c.href(dir),
            dav::xml_escape(&String::from_utf8_lossy(&name)),
            if dir { "/" } else { "" }
        ));
    }
    s.push_str("</ul></body></html>\n");
    html(s, head)
}

/// The files and directories in `dir` (not the server's own names, not
/// symlinks or special files), sorted by name; more than `max` is an error.
fn list(dir: &Dir, max: usize) -> io::Result<Vec<(Vec<u8>, Meta)>> {
    let names = dir.read_dir()?;
    if names.len() > max {
        return Err(io::Error::new(
            io::ErrorKind::StorageFull,
            format!("more than {max} entries to list"),
        ));
    }
    let mut out = Vec::with_capacity(names.len());
    for n in names {
        if hidden(&n) {
            continue;
        }
        if let Ok(Some(m)) = dir.stat_at(&n) {
            if matches!(m.kind, Kind::File | Kind::Dir) {
                out.push((n, m));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn display_name(t: &Target) -> String {
    match (&t.rel, &t.export) {
        (Some(r), _) => String::from_utf8_lossy(r.split_last().1).into_owned(),
        (None, Some(e)) => e.clone(),
        (None, None) => String::new(),
    }
}

pub(crate) fn hidden(name: &[u8]) -> bool {
    name.starts_with(OWN_PREFIX)
}

fn boundary() -> String {
    let mut rnd = [0u8; 12];
    let _ = getrandom::fill(&mut rnd);
    format!(
        "fatpipe-{}",
        rnd.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

pub(crate) fn insert(h: &mut HeaderMap, name: impl header::IntoHeaderName, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        h.insert(name, v);
    }
}

fn status(code: StatusCode) -> Resp {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = code;
    r
}

fn html(s: String, head: bool) -> Resp {
    let len = s.len();
    let mut r = Response::new(if head { Body::empty() } else { Body::text(s) });
    insert(
        r.headers_mut(),
        header::CONTENT_TYPE,
        "text/html; charset=utf-8",
    );
    insert(r.headers_mut(), header::CONTENT_LENGTH, &len.to_string());
    r
}

/// An answer with one line of text saying why.
pub(crate) fn text(code: StatusCode, why: &str) -> Resp {
    let mut r = Response::new(Body::text(format!("{why}\n")));
    *r.status_mut() = code;
    insert(
        r.headers_mut(),
        header::CONTENT_TYPE,
        "text/plain; charset=utf-8",
    );
    r
}

/// The answer to a failed file-system call.
pub(crate) fn io_resp(e: &io::Error) -> Resp {
    use io::ErrorKind as K;
    let code = match e.kind() {
        K::NotFound => StatusCode::NOT_FOUND,
        K::PermissionDenied => StatusCode::FORBIDDEN,
        K::AlreadyExists => StatusCode::METHOD_NOT_ALLOWED,
        // EINVAL from a rename is a directory moved into itself; EXDEV a
        // mount point inside the export.
        K::NotADirectory
        | K::IsADirectory
        | K::DirectoryNotEmpty
        | K::InvalidInput
        | K::CrossesDevices => StatusCode::CONFLICT,
        K::StorageFull | K::QuotaExceeded | K::FileTooLarge => StatusCode::INSUFFICIENT_STORAGE,
        _ if fatpipe_sys::is_escape(e) => StatusCode::FORBIDDEN,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    text(code, &e.to_string())
}
