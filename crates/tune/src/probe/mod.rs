//! Path probing: what `fatpipe path` measures and auto-tuning starts from.
//!
//! The pure parts ([`estimate`], [`mtu`]) turn timestamps and echoes into
//! round-trip statistics, a bottleneck rate with a confidence, and a path
//! MTU; they are tested with synthetic timestamps.

pub mod estimate;
pub mod mtu;
