//! fatpipe-engine: drives sessions and data streams over real sockets.
//!
//! The protocol crate decides *what* is said; this crate says it over
//! blocking TCP sockets, one OS thread per connection and per data stream,
//! which is simple and fast for tens to a thousand heavy streams.
//!
//! # Services: how `server` serves more than tests
//!
//! A [`Server`] accepts connections, authenticates them (pre-shared key,
//! deadline on every pre-auth step) and then hands each session to the
//! [`Service`] the client named. A service is anything implementing:
//!
//! ```ignore
//! pub trait Service: Send + Sync + 'static {
//!     fn name(&self) -> &'static str;                      // e.g. "copy"
//!     fn check(&self, params: &[u8]) -> Result<(), String> // optional: refuse early
//!     fn serve(&self, session: ServerSession) -> ServiceResult;
//! }
//! ```
//!
//! A [`ServerSession`] gives the service its opaque, size-capped `params`,
//! the authenticated [`Control`] channel (framed payloads of up to
//! [`fatpipe_proto::MAX_PAYLOAD`] bytes, with timeouts), data connections
//! that presented this session's cookie ([`ServerSession::accept_data`],
//! already past the data hello, each with the client's `tag`), the peer and
//! local addresses, [`ServerSession::cookie_matches`] for hellos that arrive
//! another way (the test service's UDP streams) and a [`Shutdown`] flag.
//! [`Service::check`] may refuse the parameters before the session is
//! accepted; the client then sees the reason. Registering a service is one
//! line:
//!
//! ```ignore
//! Server::builder().service(TestService).service(CopyService::new(exports)).bind(addr)?
//! ```
//!
//! On the client, [`client::connect`] returns a [`ClientSession`] with the
//! same [`Control`] channel and [`ClientSession::open_data_with`], which
//! dials a data connection carrying the cookie and lets the caller set
//! socket options before connecting.
//!
//! The services themselves live in crates of their own, each holding its
//! messages, its client and its server side: `fatpipe-memtest` (the
//! memory-to-memory test), `fatpipe-probe` (the path probe) and
//! `fatpipe-transfer` (copy). This crate knows none of them; the binary
//! registers them. docs/protocol.md describes the wire protocol.
//!
//! Shutdown drains (running sessions end or are aborted with a reason the
//! client sees; new ones are refused), and an [`Observer`] hears of every
//! session, refusal and failed authentication: the interface the
//! Prometheus metrics of `fatpipe-metrics` implement ([`observe`]).
//!
//! # Front ends: every port of the server
//!
//! The fatpipe protocol is one [`FrontEnd`] of the server; the iperf3 port
//! (`fatpipe-iperf3`), the metrics port (`fatpipe-metrics`) and any other
//! listener are others, registered with [`ServerBuilder::front_end`]. The
//! accept framework in [`front`] gives all of them the same pre-auth
//! deadline, handshake caps per port and per source, the server's session
//! and stream caps, the observer, the escaped log with its summaries, and
//! one drain on shutdown; a front end only speaks its protocol over the
//! connection it is handed.
//!
//! The system calls behind it (socket options, the open-file limit that
//! [`raise_fd_limit`] raises) are `fatpipe-sys`'s, the one crate allowed
//! raw system calls.

pub mod client;
pub mod control;
pub mod dataplane;
pub mod dial;
pub mod error;
pub mod front;
mod keyed;
pub mod logsum;
pub mod observe;
pub mod server;

pub use client::{connect, connect_with, ClientOptions, ClientSession};
pub use control::Control;
pub use error::{EngineError, Result};
pub use fatpipe_proto::escape;
pub use fatpipe_secure::{Encryption, Stream};
pub use front::{Conn, FrontEnd, PortCaps, Refused, Session, StreamSlots};
pub use observe::{Flow, Observer, Outcome, Refusal, Report, Streams, TestSummary};
pub use server::{
    DataConn, Logger, Server, ServerBuilder, ServerSession, Service, ServiceResult, Shutdown,
};

/// Reads a pre-shared key file: its contents with trailing whitespace
/// (a final newline) removed. At least 8 bytes. A file that any other user
/// may read or write (a group or other permission bit, as ssh judges a
/// private key) is refused, with the command that fixes it.
pub fn load_key(path: &std::path::Path) -> Result<fatpipe_proto::Key> {
    let mut file = std::fs::File::open(path)
        .map_err(|e| EngineError::io(format!("read key file {}", path.display()), e))?;
    let meta = file
        .metadata()
        .map_err(|e| EngineError::io(format!("read key file {}", path.display()), e))?;
    key_mode_ok(path, &meta)?;
    let mut raw = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(&mut file, MAX_KEY_FILE + 1),
        &mut raw,
    )
    .map_err(|e| EngineError::io(format!("read key file {}", path.display()), e))?;
    if raw.len() as u64 > MAX_KEY_FILE {
        return Err(EngineError::Service(format!(
            "key file {}: longer than {MAX_KEY_FILE} bytes; is it the right file?",
            path.display()
        )));
    }
    let end = raw
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    fatpipe_proto::Key::new(&raw[..end])
        .map_err(|e| EngineError::Service(format!("key file {}: {e}", path.display())))
}

/// The largest key file read (`fatpipe key new` writes 65 bytes).
const MAX_KEY_FILE: u64 = 64 * 1024;

/// Refuses a key file other users may read or write.
fn key_mode_ok(path: &std::path::Path, meta: &std::fs::Metadata) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        let p = fatpipe_proto::escape(&path.display().to_string()).into_owned();
        return Err(EngineError::Service(format!(
            "key file {p} may be read or written by other users (mode {mode:04o}); \
             make it private: chmod 600 {p}"
        )));
    }
    Ok(())
}

/// Raises this process's open-file limit to its hard limit: a test with
/// 1024 streams needs a descriptor per stream at each end, beyond the usual
/// soft limit of 1024. Best effort; failure leaves the limit as it was.
pub fn raise_fd_limit() {
    fatpipe_sys::process::raise_fd_limit();
}

#[cfg(test)]
mod tests;
