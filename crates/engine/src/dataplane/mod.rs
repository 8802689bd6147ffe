//! The data plane's shared parts: what every stream of every service
//! draws on, so that what a peer makes the server spend grows with the
//! bounds in docs/security.md, not with streams × lengths.
//!
//! - [`payload`]: one read-only pattern per process (a buffer for
//!   `write`, a memory file for `sendfile`) that every sending stream
//!   slices, instead of a pattern of its own per stream.
//! - [`budget`]: the private buffers streams do need (datagram batches,
//!   TLS plaintext) reserved from one process-wide budget, scaled down
//!   when many streams share it, never below what one stream needs to move
//!   data at all.
//! - [`udp`]: a UDP receiver's loss, order and jitter accounting, sans-IO
//!   and wrap-safe (the peer chooses every sequence number).
//!
//! The per-stream state that moves the bytes (counters, byte budget,
//! pacer, UDP sequence/loss/jitter) still lives in the services' own
//! workers; issue 34 moves it here as sans-IO state driven by one runner.

pub mod budget;
pub mod payload;
pub mod udp;
