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
pub mod error;
pub mod front;
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
/// (a final newline) removed. At least 8 bytes.
pub fn load_key(path: &std::path::Path) -> Result<fatpipe_proto::Key> {
    let raw = std::fs::read(path)
        .map_err(|e| EngineError::io(format!("read key file {}", path.display()), e))?;
    let end = raw
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    fatpipe_proto::Key::new(&raw[..end])
        .map_err(|e| EngineError::Service(format!("key file {}: {e}", path.display())))
}

/// Raises this process's open-file limit to its hard limit: a test with
/// 1024 streams needs a descriptor per stream at each end, beyond the usual
/// soft limit of 1024. Best effort; failure leaves the limit as it was.
pub fn raise_fd_limit() {
    fatpipe_sys::process::raise_fd_limit();
}

#[cfg(test)]
mod tests;
