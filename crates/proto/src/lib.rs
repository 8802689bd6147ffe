//! fatpipe's control protocol, sans-IO.
//!
//! A client and a server speak over one TCP control connection: a versioned
//! handshake with optional pre-shared-key authentication (HMAC-SHA256,
//! mutual), a request to open a named *service* with opaque parameters, and
//! then service messages in both directions. Data streams are separate TCP
//! connections that present the session's random cookie in their first frame.
//! docs/protocol.md describes the wire format for people.
//!
//! Layers, bottom up:
//!
//! * [`coding`]: checked readers ([`coding::Reader`]) that return
//!   [`DecodeError::UnexpectedEnd`] instead of panicking.
//! * [`frame`]: `u32` length-prefixed frames capped at [`MAX_FRAME`] bytes;
//!   the cap is checked on the prefix before anything is buffered.
//! * [`message`]: the typed [`Message`]s and their encoding.
//! * [`auth`]: the [`Key`] and its challenge–response proofs.
//! * [`text`]: [`escape`], which every place that shows peer text uses.
//! * [`conn`]: the [`ClientConn`] and [`ServerConn`] state machines, which
//!   take bytes and `now` and return bytes, events and deadlines. They open no
//!   socket and read no clock; the engine crate drives them over real sockets
//!   and the tests here drive them in memory on a virtual clock.
//!
//! Each service's own messages travel as payloads of an established
//! session and live with the service (`fatpipe-memtest`, `fatpipe-probe`,
//! `fatpipe-transfer`), which decode them with [`coding`].
//!
//! Every decoder here reads untrusted bytes and has a fuzz target in `fuzz/`.

pub mod auth;
pub mod coding;
pub mod conn;
pub mod frame;
pub mod message;
pub mod text;

pub use auth::{Key, KeyError};
pub use coding::DecodeError;
pub use conn::{
    ClientConfig, ClientConn, ClientEvent, ConnError, ServerConfig, ServerConn, ServerEvent,
    Tickets,
};
pub use frame::{FrameDecoder, MAX_FRAME};
pub use message::{Cookie, ErrorCode, Message, Nonce, TicketId, MAX_PAYLOAD, VERSION};
pub use text::escape;

#[cfg(test)]
mod tests;
