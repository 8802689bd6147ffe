//! The numbers fatpipe shows, one way everywhere.
//!
//! Two things live here because every other crate needs both and neither
//! deserves a crate of its own:
//!
//! * [`units`]: parsing and printing of the quantities users type and read
//!   (`2M`, `1gbit`, `93ms`, `0.01%`; "941 Mbit/s", "11.6 MB").
//! * the versioned result schema (serde types) that feeds `--json`, the
//!   archive and the reports. It is documented in `docs/json-schema.md`;
//!   changing a type here is changing a public interface.

pub mod copy;
pub mod path;
pub mod test;
pub mod tune;
pub mod units;
