//! fatpipe-http: `fatpipe server --http ADDR`, the copy service's exports
//! over HTTP(S) and WebDAV, as storage systems (XRootD, dCache, StoRM)
//! serve files to curl, davix, gfal2 and FTS.
//!
//! The port is one more engine front end ([`HttpPort`]): the engine's
//! accept framework gives it its handshake caps, the pre-auth deadline,
//! the server's session caps (one session per connection, admitted at its
//! first request), the Observer (`/metrics`), the escaped log and the
//! SIGTERM drain. Each connection runs on the thread the engine gives it,
//! under a current-thread tokio runtime of its own that drives hyper's
//! HTTP/1.1 server (and rustls for HTTPS): the file I/O of a request is
//! plain blocking I/O on that thread, which delays nobody else.
//!
//! What is served, and the rules every request passes through:
//! - **Paths** ([`path`]) are split on `/` *before* percent-decoding, so an
//!   encoded `%2f` can never make a separator, and each segment is checked
//!   (`..`, `.`, NUL and encoded `/` refused); `/NAME/rest` names export
//!   NAME and a path beneath it, resolved with the copy service's own
//!   confinement (`fatpipe_transfer::relpath` and `beneath`: lexical
//!   checks, then `openat2(RESOLVE_BENEATH)`, no symlink followed).
//! - **Authorisation**: `:public` exports need nothing; the others a
//!   bearer token ([`token`]) whose scope covers the path; `:ro` refuses
//!   every write with 403.
//! - **Methods** ([`handler`]): GET/HEAD with ranges ([`range`]), PUT
//!   (temporary file, fsync, rename), PROPFIND Depth 0/1, MKCOL, DELETE,
//!   MOVE, OPTIONS; checksums ([`digest`]) on HEAD/GET, computed while a
//!   PUT writes and kept with the file; `COPY`, HTTP third-party copy
//!   ([`tpc`]), pulling from or pushing to another endpoint.
//!
//! Its bounds are in docs/security.md ("Every port") and [`Limits`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fatpipe_engine::{Conn, FrontEnd, PortCaps};

pub mod archive;
mod body;
pub mod client;
mod conn;
pub mod dav;
pub mod digest;
pub mod handler;
pub mod path;
pub mod range;
mod sndbuf;
pub mod ticket;
pub mod token;
pub mod tpc;

/// The service name its sessions and bytes are reported under.
pub const SERVICE: &str = "http";

/// Connections still before their first request at once, in all, and from
/// one address (IPv6: one /64): the port's handshake caps.
pub const CAPS: PortCaps = PortCaps {
    handshakes: 256,
    handshakes_per_source: 32,
};

/// What one connection may make the server spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// hyper's read buffer: the largest request head (request line and
    /// headers), answered 431 beyond it.
    pub max_buf: usize,
    /// The most header fields in one request (431 beyond).
    pub max_headers: usize,
    /// The largest PROPFIND request body read (413 beyond).
    pub propfind_body: usize,
    /// Time to read each request head once the connection is admitted
    /// (the first one must arrive by the pre-auth deadline).
    pub header_timeout: Duration,
    /// A connection with no byte read or written for this long is closed
    /// (a stalled upload or download, or an idle keep-alive).
    pub idle: Duration,
    /// The most entries one PROPFIND Depth 1 or directory GET lists (507
    /// beyond).
    pub max_listing: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_buf: 256 * 1024,
            max_headers: 100,
            propfind_body: 64 * 1024,
            header_timeout: Duration::from_secs(30),
            idle: Duration::from_secs(60),
            max_listing: 100_000,
        }
    }
}

/// One export as the HTTP port serves it (parsed by the copy service's
/// own `--export` syntax).
#[derive(Debug, Clone)]
pub struct Export {
    /// `/NAME/` on the port.
    pub name: String,
    /// The directory it publishes.
    pub path: PathBuf,
    /// Writes refused (403).
    pub read_only: bool,
    /// Served without a token.
    pub public: bool,
}

/// Why the port could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// An `--export` that does not parse, or names no directory.
    #[error("{0}")]
    Export(String),
    /// The certificate or key file could not be used.
    #[error("{0}")]
    Tls(String),
    /// An unknown checksum name.
    #[error("unknown checksum '{0}' (adler32, crc32c, md5, sha-256)")]
    Checksum(String),
}

/// Everything the port serves and how.
#[derive(Debug, Clone)]
pub struct Config {
    /// The exports, by name.
    pub exports: Vec<Export>,
    /// How bearer tokens are verified; `None` (a server without a key):
    /// only public exports are served.
    pub tokens: Option<token::Verifier>,
    /// HTTPS when set.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Checksums computed while a PUT writes a file.
    pub inline: Vec<digest::Algo>,
    /// Per-connection bounds.
    pub limits: Limits,
    /// Where file transfers are recorded (`--archive`), if anywhere.
    pub archive: Option<archive::Sink>,
    /// Third-party copy (`COPY`): address policy, caps, timeouts.
    pub tpc: tpc::Settings,
    /// The passive end of a third-party copy's leg: the one-time tickets
    /// this port issues for the copy service's port (docs/http.md, "The
    /// leg"); `None`: no `Fatpipe-Copy` or `Fatpipe-Ticket` answers.
    pub leg: Option<Passive>,
}

/// What the HTTP port offers a peer that copies from it over the copy
/// protocol (docs/http.md, "The leg").
#[derive(Debug, Clone)]
pub struct Passive {
    /// The copy service's port (set once it is bound).
    pub port: Arc<std::sync::OnceLock<u16>>,
    /// The tickets, shared with the copy service's port
    /// (`ServerBuilder::tickets`).
    pub book: Arc<ticket::Book>,
}

impl Config {
    /// A configuration of `--export` specs (the copy service's syntax;
    /// `:encrypted` exports are left out: the copy service's encryption
    /// is its own, not TLS).
    pub fn new(specs: &[String]) -> Result<Config, SetupError> {
        let mut exports = Vec::new();
        for spec in specs {
            let e: fatpipe_transfer::session::Export = spec.parse().map_err(SetupError::Export)?;
            if !e.path.is_dir() {
                return Err(SetupError::Export(format!(
                    "export '{spec}': {} is not a directory",
                    e.path.display()
                )));
            }
            if e.encrypted {
                continue;
            }
            exports.push(Export {
                name: e.name,
                path: e.path,
                read_only: e.read_only,
                public: e.public,
            });
        }
        Ok(Config {
            exports,
            tokens: None,
            tls: None,
            inline: vec![digest::Algo::Adler32, digest::Algo::Crc32c],
            limits: Limits::default(),
            archive: None,
            tpc: tpc::Settings::default(),
            leg: None,
        })
    }

    /// Sets the checksums computed while writing from a comma list.
    pub fn inline_checksums(&mut self, list: &str) -> Result<(), SetupError> {
        let mut v = Vec::new();
        for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let a = digest::Algo::from_name(name)
                .ok_or_else(|| SetupError::Checksum(name.chars().take(32).collect()))?;
            if !v.contains(&a) {
                v.push(a);
            }
        }
        self.inline = v;
        Ok(())
    }
}

/// Loads a PEM certificate chain and private key for HTTPS (HTTP/1.1
/// over TLS 1.2 or 1.3).
pub fn load_tls(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, SetupError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| SetupError::Tls(format!("--tls-cert {}: {e}", cert.display())))?
        .collect::<Result<_, _>>()
        .map_err(|e| SetupError::Tls(format!("--tls-cert {}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(SetupError::Tls(format!(
            "--tls-cert {}: no certificate in the file",
            cert.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| SetupError::Tls(format!("--tls-key {}: {e}", key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| SetupError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| SetupError::Tls(format!("--tls-cert/--tls-key: {e}")))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// The HTTP/WebDAV port as an engine front end: register it with
/// `ServerBuilder::front_end`, its listener and [`CAPS`].
pub struct HttpPort {
    cfg: Arc<Config>,
}

impl HttpPort {
    /// The front end serving `cfg`.
    pub fn new(cfg: Config) -> HttpPort {
        HttpPort { cfg: Arc::new(cfg) }
    }
}

impl FrontEnd for HttpPort {
    fn name(&self) -> &'static str {
        SERVICE
    }

    fn serve(&self, tcp: std::net::TcpStream, conn: Conn) {
        conn::serve(Arc::clone(&self.cfg), tcp, conn);
    }
}
