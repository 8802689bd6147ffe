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
//! - [`stream`]: a stream's state, sans-IO: what to write or wait for
//!   next given `now` and what the last write did (counters, the shared
//!   `-n` [`stream::ByteBudget`], the UDP [`pacer`], datagram numbers) and
//!   what a receiver counted ([`udp`] for loss, order and jitter).
//!
//! - [`runner`]: the threads that drive it: at most one per core
//!   (`runner::MAX_THREADS`), each an epoll loop over many streams'
//!   non-blocking sockets, serving ready streams round robin a quantum
//!   at a time, whatever the stream count.
//! - [`blocking`]: the few threads (2 × cores, at most 16) that do a
//!   stream's disk work (reads, writes, hashing, flushes) so that the
//!   runner's threads never block; a task hands a job there and is woken
//!   ([`runner::TaskWaker`]) when it is done.

pub mod blocking;
pub mod budget;
pub mod pacer;
pub mod payload;
pub mod runner;
pub mod stream;
pub mod udp;
