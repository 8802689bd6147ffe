//! fatpipe-tune: the auto-tuning planners and the host audit.
//!
//! Three layers, kept apart so each can be tested without the others:
//!
//! * **Planners** (pure): [`plan`] turns path facts and both ends' limits into
//!   streams, buffers, congestion control and pacing before data flows;
//!   [`adjust`] is a state machine fed one sample per interval while data
//!   flows, which adds streams or switches to BBR when loss holds a transfer
//!   below the path rate. Neither reads a clock or a file.
//! * **Collectors** ([`host`], [`disk`]): read `/proc` and `/sys` under an
//!   injectable root, so tests run against a fake tree; a value that cannot
//!   be read is `Unknown(reason)`, never a guess.
//! * **Rules and emitters** ([`rules`], [`emit`]) (pure): turn collected facts
//!   and a target rate × RTT into findings and sysctl snippets for Linux,
//!   FreeBSD and macOS; [`apply`] writes them with a backup and reverts.
//!
//! Rendering for people lives in the binary; the serde result types live in
//! `fatpipe_schema::tune` so the engine and the protocol can name them.

pub mod adjust;
pub mod plan;

pub use adjust::{AdjustConfig, Adjuster, Sample};
pub use fatpipe_schema::tune::{Action, Decision, HostLimits, PathFacts, Plan};
pub use plan::{plan, Policy};
