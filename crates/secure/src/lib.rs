//! Encrypted, authenticated connections for `--encrypt`: TLS 1.3 (rustls,
//! ring provider) keyed by the pre-shared key, and the stream type the data
//! paths read and write whether a connection is encrypted or not.
//!
//! Why it is shaped so:
//! - **The server proves the pre-shared key inside TLS, with no extra round
//!   trip.** Both ends derive one Ed25519 key pair from the PSK ([`keys`]);
//!   the server presents a self-signed certificate over it, and the client
//!   accepts exactly that certificate and checks the handshake signature
//!   with rustls's own verification ([`tls`]). Someone without the key can
//!   neither impersonate the server nor read the session; TLS 1.3's ECDHE
//!   gives forward secrecy. The client still proves the key to the server
//!   with the control protocol's HMAC challenge, now sent inside TLS.
//! - **Two independent halves after the handshake.** fatpipe reads a data
//!   stream on one thread and writes it on another, keeps `try_clone`s to
//!   shut streams down and sets socket options on the live socket. rustls's
//!   `StreamOwned` couples both directions in one object, so after the
//!   handshake this crate takes the traffic secrets and runs the TLS 1.3
//!   record layer itself ([`record`]: RFC 8446 §5.2–5.3 with ring's AEAD) as
//!   a sealing writer and an opening reader, each behind its own lock in
//!   [`Stream`]. An interop test against rustls's own record layer proves
//!   it is TLS.
//! - **Plain and encrypted streams are one type** ([`Stream`]), so the
//!   services have one data path; zero-copy calls get the socket only from
//!   [`Stream::plain`], which an encrypted stream never returns.

pub mod keys;
pub mod record;
mod stream;
pub mod ticket;
pub mod tls;

pub use record::RecordError;
pub use stream::{Encryption, Stream};
pub use tls::{client_handshake, is_tls_start, server_handshake, Handshake, TlsError, Want};
