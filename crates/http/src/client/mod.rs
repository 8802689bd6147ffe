//! The client side: `fatpipe copy` to and from any HTTP(S)/WebDAV server
//! (`http://`, `https://`, `dav://`, `davs://`), fatpipe's own port or
//! another storage system's (XRootD, dCache, EOS, StoRM, nginx).
//!
//! - **Download** ([`get`]): a `HEAD` (size, `Accept-Ranges`, `ETag`,
//!   `Last-Modified`, and `Want-Digest: adler32` for the server's
//!   checksum), then ranged `GET`s of runs of [`get::BLOCK`]-byte blocks
//!   over several connections at once into a hidden partial file beside
//!   the destination; a journal beside it records each block once
//!   written, so rerunning the command after an interruption fetches only
//!   the blocks it lacks (checked against the size, `ETag` and
//!   `Last-Modified`). The file is hashed in order as its blocks come in
//!   and checked against the server's `Digest` (adler32, crc32c, md5 or
//!   sha-256) when the last is in, then flushed and renamed.
//! - **Upload** ([`put`]): one `PUT` with `Content-Length` and `Expect:
//!   100-continue`, its adler32 computed while it is read, then a `HEAD`
//!   with `Want-Digest: adler32` to compare with the server's, when it
//!   offers one.
//!
//! Each connection runs on a thread of its own under a current-thread
//! tokio runtime driving hyper's HTTP/1.1 client (rustls for HTTPS, with
//! the Mozilla roots of `webpki-roots` or a `--ca` file's), and writes what
//! it receives with `pwrite`: blocking on that thread delays nobody else,
//! as on the server side.
//!
//! What the server sends is peer input: its headers are decoded with size
//! caps ([`parse_content_range`]; the checksum fields through
//! [`crate::digest::parse_digest`], fuzzed), an error
//! body is read to at most [`ERROR_BODY`] bytes and escaped by the caller,
//! and a body that does not match what was asked for (another range, more
//! or fewer bytes) fails the block.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::{Bytes, Frame};
use hyper::client::conn::http1::SendRequest;
use hyper::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;

use crate::digest::{self, Algo};

pub mod get;
pub mod list;
pub mod put;

/// The longest error body read from a server (the rest is dropped).
pub const ERROR_BODY: usize = 1024;
/// The longest `Digest`/`Repr-Digest`/`Content-Range` value decoded.
pub const MAX_HEADER: usize = 2048;
/// Redirects followed for one request.
pub const MAX_REDIRECTS: usize = 5;
/// Time to connect (TCP and TLS).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// Time for a server to answer a request's head, or to send the next piece
/// of a body.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a client operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The user's to fix: a bad URL, a refused token (401/403), a
    /// missing local file.
    #[error("{0}")]
    Usage(String),
    /// The transfer failed.
    #[error("{0}")]
    Failed(String),
}

fn failed(m: impl Into<String>) -> ClientError {
    ClientError::Failed(m.into())
}

/// An `http(s)://` or `dav(s)://` URL, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    /// HTTPS (`https://`, `davs://`).
    pub tls: bool,
    /// The host as written (brackets removed from IPv6).
    pub host: String,
    /// The port (80 or 443 when not given).
    pub port: u16,
    /// Path and query, percent-encoded as given (at least `/`).
    pub path: String,
}

/// Whether an argument is a URL this client serves.
pub fn is_url(arg: &[u8]) -> bool {
    ["http://", "https://", "dav://", "davs://"]
        .iter()
        .any(|p| arg.len() > p.len() && arg[..p.len()].eq_ignore_ascii_case(p.as_bytes()))
}

impl Url {
    /// Parses an `http(s)://` or `dav(s)://` URL.
    pub fn parse(s: &str) -> Result<Url, String> {
        let (scheme, rest) = s
            .split_once("://")
            .ok_or_else(|| format!("'{s}': not a URL"))?;
        let tls = match scheme.to_ascii_lowercase().as_str() {
            "http" | "dav" => false,
            "https" | "davs" => true,
            _ => {
                return Err(format!(
                    "'{s}': the scheme must be http, https, dav or davs"
                ))
            }
        };
        let uri: Uri = format!("{}://{rest}", if tls { "https" } else { "http" })
            .parse()
            .map_err(|e| format!("'{s}': {e}"))?;
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| format!("'{s}': no host"))?;
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err(format!(
                "'{s}': credentials in the URL are not accepted (use --token FILE or BEARER_TOKEN)"
            ));
        }
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let path = uri
            .path_and_query()
            .map_or("/".to_string(), |p| p.as_str().to_string());
        let path = if path.is_empty() { "/".into() } else { path };
        Ok(Url {
            tls,
            port: uri.port_u16().unwrap_or(if tls { 443 } else { 80 }),
            host,
            path,
        })
    }

    /// The URL as `https://host:port/path` (for messages and reports).
    pub fn display(&self) -> String {
        format!(
            "{}://{}{}",
            if self.tls { "https" } else { "http" },
            self.authority(),
            self.path
        )
    }

    /// `host:port` for the Host header and reports (IPv6 bracketed).
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The last path segment, percent-decoded (a local name for it).
    pub fn file_name(&self) -> Option<Vec<u8>> {
        let path = self.path.split(['?', '#']).next().unwrap_or("");
        let last = path.rsplit('/').next().filter(|s| !s.is_empty())?;
        let name: Vec<u8> = percent_encoding::percent_decode_str(last).collect();
        (!name.is_empty()
            && name != b"."
            && name != b".."
            && !name.contains(&b'/')
            && !name.contains(&0))
        .then_some(name)
    }

    /// Whether the path ends with `/` (a collection).
    pub fn is_dir(&self) -> bool {
        self.path
            .split(['?', '#'])
            .next()
            .unwrap_or("")
            .ends_with('/')
    }

    /// This URL with `name` (percent-encoded) appended to its path.
    pub fn join(&self, name: &[u8]) -> Url {
        let mut u = self.clone();
        let (path, query) = match self.path.split_once('?') {
            Some((p, q)) => (p.to_string(), format!("?{q}")),
            None => (self.path.clone(), String::new()),
        };
        let sep = if path.ends_with('/') { "" } else { "/" };
        u.path = format!("{path}{sep}{}{query}", crate::path::encode(name));
        u
    }

    /// Resolves a `Location` header against this URL.
    fn redirect(&self, location: &str) -> Result<Url, ClientError> {
        if location.starts_with('/') {
            let mut u = self.clone();
            u.path = location.to_string();
            return Ok(u);
        }
        let u = Url::parse(location).map_err(|e| failed(format!("redirect to {e}")))?;
        if self.tls && !u.tls {
            return Err(failed(format!(
                "{}: the server redirected from https to plain http ({}): refused",
                self.display(),
                u.display()
            )));
        }
        Ok(u)
    }
}

/// How to reach servers: TLS roots and the bearer token.
#[derive(Clone)]
pub struct Options {
    /// The TLS client configuration (HTTPS).
    pub tls: Arc<rustls::ClientConfig>,
    /// `Authorization: Bearer` token, if any.
    pub token: Option<String>,
    /// `User-Agent`.
    pub agent: String,
    /// Headers added to every request (a third-party copy's forwarded
    /// `TransferHeader<X>` fields), after the token's `Authorization`.
    pub headers: Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)>,
}

impl Options {
    /// Options trusting the Mozilla roots (`webpki-roots`), or only the
    /// certificates in `ca` (PEM), as curl's `--cacert`.
    pub fn new(ca: Option<&Path>, token: Option<String>) -> Result<Options, ClientError> {
        let mut roots = rustls::RootCertStore::empty();
        match ca {
            Some(path) => {
                use rustls::pki_types::pem::PemObject;
                use rustls::pki_types::CertificateDer;
                let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                    .map_err(|e| ClientError::Usage(format!("--ca {}: {e}", path.display())))?
                    .collect::<Result<_, _>>()
                    .map_err(|e| ClientError::Usage(format!("--ca {}: {e}", path.display())))?;
                let (added, _) = roots.add_parsable_certificates(certs);
                if added == 0 {
                    return Err(ClientError::Usage(format!(
                        "--ca {}: no usable certificate in the file",
                        path.display()
                    )));
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| failed(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Options {
            tls: Arc::new(cfg),
            token,
            agent: format!("fatpipe/{}", env!("CARGO_PKG_VERSION")),
            headers: Vec::new(),
        })
    }
}

/// A request or response body: empty, bytes, or a file being uploaded.
pub type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>;

/// An empty body.
pub fn empty() -> Body {
    http_body_util::Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A body of bytes in memory.
pub fn full(data: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(data.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// One open connection to a server.
pub struct Connection {
    send: SendRequest<Body>,
    /// A duplicate of the socket, to read `TCP_INFO`.
    pub socket: std::net::TcpStream,
    /// Where it goes.
    pub url: Url,
    /// The send buffer forced for large bodies on a long path (crate::sndbuf).
    forced: crate::sndbuf::Forced,
}

fn resolve(url: &Url) -> Result<Vec<SocketAddr>, ClientError> {
    let addrs: Vec<SocketAddr> = (url.host.as_str(), url.port)
        .to_socket_addrs()
        .map_err(|e| {
            ClientError::Usage(format!(
                "{}: cannot resolve {}: {e}",
                url.display(),
                url.host
            ))
        })?
        .collect();
    if addrs.is_empty() {
        return Err(ClientError::Usage(format!(
            "{}: {} has no address",
            url.display(),
            url.host
        )));
    }
    Ok(addrs)
}

/// Connects (TCP, then TLS for HTTPS) and starts hyper's connection task
/// on the current runtime.
pub async fn connect(url: &Url, opts: &Options) -> Result<Connection, ClientError> {
    let addrs = resolve(url)?;
    let mut last = None;
    let mut tcp = None;
    for a in &addrs {
        match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(a)).await {
            Ok(Ok(s)) => {
                tcp = Some(s);
                break;
            }
            Ok(Err(e)) => last = Some(e.to_string()),
            Err(_) => last = Some("timed out".into()),
        }
    }
    let tcp = tcp.ok_or_else(|| {
        failed(format!(
            "{}: connect to {}: {}",
            url.display(),
            url.authority(),
            last.unwrap_or_default()
        ))
    })?;
    let _ = tcp.set_nodelay(true);
    let std = tcp.into_std().map_err(|e| failed(e.to_string()))?;
    let dup = std.try_clone().map_err(|e| failed(e.to_string()))?;
    let tcp = tokio::net::TcpStream::from_std(std).map_err(|e| failed(e.to_string()))?;
    finish_connect(url, opts, tcp, dup).await
}

async fn finish_connect(
    url: &Url,
    opts: &Options,
    tcp: tokio::net::TcpStream,
    socket: std::net::TcpStream,
) -> Result<Connection, ClientError> {
    let send = if url.tls {
        let name = rustls::pki_types::ServerName::try_from(url.host.clone())
            .map_err(|e| ClientError::Usage(format!("{}: {e}", url.display())))?;
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(&opts.tls));
        let tls = tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name, tcp))
            .await
            .map_err(|_| failed(format!("{}: TLS handshake timed out", url.display())))?
            .map_err(|e| tls_error(url, &e))?;
        handshake(url, tls).await?
    } else {
        handshake(url, tcp).await?
    };
    Ok(Connection {
        send,
        socket,
        url: url.clone(),
        forced: crate::sndbuf::Forced::default(),
    })
}

fn tls_error(url: &Url, e: &std::io::Error) -> ClientError {
    let text = e.to_string();
    if text.contains("certificate")
        || text.contains("UnknownIssuer")
        || text.contains("NotValidForName")
    {
        ClientError::Usage(format!(
            "{}: TLS: {text} (a private CA's certificate goes in --ca FILE)",
            url.display()
        ))
    } else {
        failed(format!("{}: TLS: {text}", url.display()))
    }
}

async fn handshake<T>(url: &Url, io: T) -> Result<SendRequest<Body>, ClientError>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(256 * 1024)
        // XRootD 5.5's XrdHttp matches header names case-sensitively: a
        // lowercase `content-length` reads as no body (it answers 200 and
        // writes an empty file).
        .title_case_headers(true)
        .handshake(TokioIo::new(io))
        .await
        .map_err(|e| failed(format!("{}: {e}", url.display())))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(send)
}

impl Connection {
    /// Widens the send buffer for a request body of `body` bytes when the
    /// path is long and this process may force buffers (crate::sndbuf):
    /// call it before sending a large `PUT`.
    pub fn widen_for(&mut self, body: u64) {
        crate::sndbuf::widen(&self.socket, body, &mut self.forced);
    }

    /// Whether the server closed the connection (or it failed): not to be
    /// reused.
    pub fn is_closed(&self) -> bool {
        self.send.is_closed()
    }

    /// A request for `path` on this connection's server with the usual
    /// headers (Host, User-Agent, the token).
    pub fn request(
        &self,
        method: Method,
        path: &str,
        opts: &Options,
    ) -> hyper::http::request::Builder {
        let mut b = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, host_header(&self.url))
            .header(hyper::header::USER_AGENT, &opts.agent);
        if let Some(t) = &opts.token {
            b = b.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        for (k, v) in &opts.headers {
            b = b.header(k, v);
        }
        b
    }

    /// Sends a request and waits for the response's head.
    pub async fn send(
        &mut self,
        req: Request<Body>,
    ) -> Result<Response<hyper::body::Incoming>, ClientError> {
        let url = format!("{} {}", req.method(), self.url.display());
        tokio::time::timeout(IDLE_TIMEOUT, self.send.ready())
            .await
            .map_err(|_| failed(format!("{url}: the connection stalled")))?
            .map_err(|e| failed(format!("{url}: {e}")))?;
        tokio::time::timeout(IDLE_TIMEOUT, self.send.send_request(req))
            .await
            .map_err(|_| failed(format!("{url}: no answer in {} s", IDLE_TIMEOUT.as_secs())))?
            .map_err(|e| failed(format!("{url}: {e}")))
    }
}

fn host_header(url: &Url) -> String {
    let default = if url.tls { 443 } else { 80 };
    if url.port == default {
        if url.host.contains(':') {
            format!("[{}]", url.host)
        } else {
            url.host.clone()
        }
    } else {
        url.authority()
    }
}

/// Reads at most [`ERROR_BODY`] bytes of a body as one line of text.
pub async fn error_text(body: hyper::body::Incoming) -> String {
    let mut body = body;
    let mut out = Vec::new();
    while out.len() < ERROR_BODY {
        match tokio::time::timeout(Duration::from_secs(5), body.frame()).await {
            Ok(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    out.extend_from_slice(&d[..d.len().min(ERROR_BODY - out.len())]);
                }
            }
            _ => break,
        }
    }
    let text = String::from_utf8_lossy(&out);
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The error for a refused or failed request: 401/403 are the user's to
/// fix (a token), the rest failures.
pub fn status_error(url: &Url, method: &Method, status: StatusCode, why: &str) -> ClientError {
    let mut line = format!("{method} {}: {status}", url.display());
    if !why.is_empty() {
        line.push_str(": ");
        line.push_str(why);
    }
    match status {
        StatusCode::UNAUTHORIZED => ClientError::Usage(format!(
            "{line} (the server wants a valid bearer token: --token FILE or BEARER_TOKEN)"
        )),
        StatusCode::FORBIDDEN => ClientError::Usage(format!(
            "{line} (the token's scope, or the server, does not allow this)"
        )),
        _ => failed(line),
    }
}

/// What a `HEAD` said about a file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stat {
    /// `Content-Length`.
    pub size: Option<u64>,
    /// `Accept-Ranges: bytes`.
    pub ranges: bool,
    /// `ETag`, as sent.
    pub etag: Option<String>,
    /// `Last-Modified`, as sent.
    pub modified: Option<String>,
    /// The server's checksums (`Digest`, `Repr-Digest`).
    pub digests: Vec<(Algo, Vec<u8>)>,
    /// `Server`, for the report.
    pub server: Option<String>,
}

/// What `Want-Digest` asks for: adler32, what storage systems keep and
/// FTS verifies (XRootD 5.5 answers a list with nothing at all).
pub const WANT_DIGEST: &str = "adler32";

/// Sends `HEAD` with `Want-Digest`, following redirects; returns the final
/// URL (redirects followed) and what it said.
pub async fn head(conn: &mut Connection, opts: &Options) -> Result<(Url, Stat), ClientError> {
    let mut url = conn.url.clone();
    for _ in 0..=MAX_REDIRECTS {
        if url.host != conn.url.host || url.port != conn.url.port || url.tls != conn.url.tls {
            *conn = connect(&url, opts).await?;
        }
        let req = conn
            .request(Method::HEAD, &url.path, opts)
            .header("want-digest", WANT_DIGEST)
            .body(empty())
            .map_err(|e| failed(e.to_string()))?;
        let res = conn.send(req).await?;
        let status = res.status();
        if status.is_redirection() {
            let loc = res
                .headers()
                .get(hyper::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| {
                    failed(format!("HEAD {}: {status} without Location", url.display()))
                })?;
            url = url.redirect(loc)?;
            continue;
        }
        if !status.is_success() {
            // A HEAD answer has no body: ask for the reason with a GET
            // of one byte, read to ERROR_BODY at most.
            let why = if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
                reason(conn, &url, opts).await
            } else {
                String::new()
            };
            return Err(status_error(&url, &Method::HEAD, status, &why));
        }
        return Ok((url, stat(res.headers())));
    }
    Err(failed(format!(
        "{}: more than {MAX_REDIRECTS} redirects",
        conn.url.display()
    )))
}

async fn reason(conn: &mut Connection, url: &Url, opts: &Options) -> String {
    let Ok(req) = conn
        .request(Method::GET, &url.path, opts)
        .header(hyper::header::RANGE, "bytes=0-0")
        .body(empty())
    else {
        return String::new();
    };
    match conn.send(req).await {
        Ok(res) if !res.status().is_success() => error_text(res.into_body()).await,
        _ => String::new(),
    }
}

/// Decodes a response's headers into a [`Stat`].
pub fn stat(h: &HeaderMap) -> Stat {
    let text = |name: &str| {
        h.get(name)
            .and_then(|v| v.to_str().ok())
            .filter(|v| v.len() <= MAX_HEADER)
            .map(str::to_string)
    };
    // One value per algorithm: the first a `Digest` field gives, else a
    // `Repr-Digest` one.
    let mut digests: Vec<(Algo, Vec<u8>)> = Vec::new();
    let fields = h
        .get_all("digest")
        .iter()
        .map(|v| digest::parse_digest(v.as_bytes()));
    let repr = h
        .get_all("repr-digest")
        .iter()
        .map(|v| digest::parse_repr_digest(v.as_bytes()));
    for d in fields.chain(repr).flatten() {
        if !digests.iter().any(|(a, _)| *a == d.0) {
            digests.push(d);
        }
    }
    Stat {
        size: text("content-length").and_then(|v| v.trim().parse().ok()),
        ranges: text("accept-ranges")
            .is_some_and(|v| v.split(',').any(|u| u.trim().eq_ignore_ascii_case("bytes"))),
        etag: text("etag"),
        modified: text("last-modified"),
        digests,
        server: text("server"),
    }
}

/// A checksum as the report and messages show it: `adler32=0a1b2c3d`.
pub fn show_digest(algo: Algo, raw: &[u8]) -> String {
    format!("{}={}", algo.name(), algo.digest_value(raw))
}

/// Decodes `Content-Range: bytes FIRST-LAST/SIZE` (SIZE may be `*`):
/// `(first, last, size)`.
pub fn parse_content_range(value: &[u8]) -> Option<(u64, u64, Option<u64>)> {
    if value.len() > 100 {
        return None;
    }
    let s = std::str::from_utf8(value).ok()?.trim();
    let rest = s.strip_prefix("bytes")?.trim_start();
    let (range, size) = rest.split_once('/')?;
    let (a, b) = range.trim().split_once('-')?;
    let num = |t: &str| -> Option<u64> {
        let t = t.trim();
        (!t.is_empty() && t.len() <= 20 && t.bytes().all(|c| c.is_ascii_digit()))
            .then(|| t.parse().ok())
            .flatten()
    };
    let (first, last) = (num(a)?, num(b)?);
    if last < first {
        return None;
    }
    let size = match size.trim() {
        "*" => None,
        t => Some(num(t)?),
    };
    if size.is_some_and(|n| last >= n) {
        return None;
    }
    Some((first, last, size))
}

/// A rate cap shared by every connection of a transfer: each waits until
/// the bytes moved so far are due.
pub struct Throttle {
    start: std::time::Instant,
    bytes_per_sec: Option<f64>,
    moved: std::sync::atomic::AtomicU64,
}

impl Throttle {
    /// A cap of `bits_per_sec` (none when `None`).
    pub fn new(bits_per_sec: Option<u64>) -> Throttle {
        Throttle {
            start: std::time::Instant::now(),
            bytes_per_sec: bits_per_sec.map(|b| b as f64 / 8.0),
            moved: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Counts `n` bytes and sleeps (this thread) until they are due.
    pub fn take(&self, n: u64) {
        let Some(rate) = self.bytes_per_sec else {
            return;
        };
        let total = self
            .moved
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed)
            + n;
        let due = Duration::from_secs_f64(total as f64 / rate);
        let now = self.start.elapsed();
        if due > now {
            std::thread::sleep((due - now).min(Duration::from_secs(5)));
        }
    }
}

/// A future that polls a boxed future (for `Body` impls that wait).
pub(crate) type Waiting = Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

pub(crate) fn poll_waiting(w: &mut Option<Waiting>, cx: &mut Context<'_>) -> Poll<()> {
    match w {
        Some(f) => match f.as_mut().poll(cx) {
            Poll::Ready(()) => {
                *w = None;
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        },
        None => Poll::Ready(()),
    }
}

/// A current-thread runtime for one connection's thread.
pub fn runtime() -> Result<tokio::runtime::Runtime, ClientError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| failed(format!("runtime: {e}")))
}

/// Frames of a body as they come, each within [`IDLE_TIMEOUT`].
pub async fn next_frame(
    body: &mut hyper::body::Incoming,
    url: &Url,
) -> Result<Option<Frame<Bytes>>, ClientError> {
    match tokio::time::timeout(IDLE_TIMEOUT, body.frame()).await {
        Err(_) => Err(failed(format!(
            "{}: no data for {} s",
            url.display(),
            IDLE_TIMEOUT.as_secs()
        ))),
        Ok(None) => Ok(None),
        Ok(Some(Err(e))) => Err(failed(format!("{}: {e}", url.display()))),
        Ok(Some(Ok(f))) => Ok(Some(f)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = Url::parse("davs://host.example:8443/data/a%20b.bin").unwrap();
        assert!(u.tls);
        assert_eq!((u.host.as_str(), u.port), ("host.example", 8443));
        assert_eq!(u.file_name().unwrap(), b"a b.bin");
        assert!(!u.is_dir());
        let u = Url::parse("http://[::1]/d/").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.is_dir()), ("::1", 80, true));
        assert_eq!(u.authority(), "[::1]:80");
        assert_eq!(u.join(b"x y").path, "/d/x%20y");
        assert_eq!(Url::parse("https://h").unwrap().path, "/");
        assert!(Url::parse("ftp://h/x").is_err());
        assert!(Url::parse("https://user:pw@h/x").is_err());
        assert!(Url::parse("https:///x").is_err());
        assert!(is_url(b"DAVS://h/x"));
        assert!(!is_url(b"h:data/x"));
        assert!(Url::parse("http://h/%2e%2e").unwrap().file_name().is_none());
    }

    #[test]
    fn content_ranges() {
        assert_eq!(
            parse_content_range(b"bytes 0-99/1000"),
            Some((0, 99, Some(1000)))
        );
        assert_eq!(parse_content_range(b"bytes 5-9/*"), Some((5, 9, None)));
        assert_eq!(parse_content_range(b"bytes 9-5/10"), None);
        assert_eq!(parse_content_range(b"bytes 0-10/10"), None);
        assert_eq!(parse_content_range(b"bytes */10"), None);
        assert_eq!(parse_content_range(b"bytes 0-+1/10"), None);
    }
}
