//! fatpipe-tune: auto-tuning policy, and nothing else.
//!
//! * **Planner** (pure): [`plan()`] turns path facts and both ends' limits
//!   into streams, buffers, congestion control and pacing before data flows.
//! * **Pre-flight** ([`auto`]): probes the path briefly through the
//!   `fatpipe-probe` service, reads this end's limits and runs the planner;
//!   explicit flags then replace parts of the plan by one set of rules that
//!   `test` and `copy` share.
//! * **Adjuster** (pure): [`adjust`] is a state machine fed one sample per
//!   interval while data flows, which adds streams or switches to BBR when
//!   loss holds a transfer below the path rate. It reads no clock.
//!
//! The services (the memory-to-memory test, copy) depend on this crate, not
//! the other way round. The host audit (`fatpipe tune`) is `fatpipe-audit`.

pub mod adjust;
pub mod auto;
pub mod plan;

pub use adjust::{AdjustConfig, Adjuster, Sample};
pub use fatpipe_schema::tune::{Action, Decision, HostLimits, PathFacts, Plan};
pub use plan::{plan, Policy};
