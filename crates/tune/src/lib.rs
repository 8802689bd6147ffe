//! fatpipe-tune: auto-tuning policy, and nothing else.
//!
//! * **Planner** (pure): [`plan()`] turns path facts and both ends' limits
//!   into streams, buffers, congestion control and pacing before data flows.
//! * **Pre-flight** ([`auto`]): probes the path briefly through the
//!   `fatpipe-probe` service, reads this end's limits and runs the planner;
//!   explicit flags then replace parts of the plan by one set of rules that
//!   `test` and `copy` share.
//!   [`auto::run`] is the whole sequence both commands run (probe, plan,
//!   flags, start window, record, the `auto:` line), their differences
//!   given as inputs; it returns what to print instead of printing.
//! * **Adjuster** (pure): [`adjust`] is a state machine fed one sample per
//!   interval while data flows, which adds streams or switches to BBR when
//!   loss holds a transfer below the path rate. It reads no clock.
//!   [`adjust::AdjustConfig::for_transfer`] sets it up for either command.
//! * **Start-up** ([`ramp`], pure): the time a transfer takes to reach its
//!   rate, measured from its progress and modelled (slow start on a path),
//!   for the copy's timeline and for bounds that tests derive from a path.
//! * **Host** ([`host`]): which congestion controls this host may use,
//!   one answer by capability (root or `CAP_NET_ADMIN`) for the planner
//!   and every adjuster's switchable list.
//! * **Responses** ([`respond`], pure): the send buffer a server forces
//!   for a large body on a long path (the HTTP port's file `GET`s).
//! * **Driver** ([`steer`]): runs the adjuster beside a transfer and
//!   carries out its decisions through the [`steer::Steerable`] trait,
//!   which each steerable service implements.
//!
//! The services (the memory-to-memory test, copy) depend on this crate, not
//! the other way round: they implement `Steerable`, so the rules of when
//! and how to steer live here once. The host audit (`fatpipe tune`) is
//! `fatpipe-audit`.

pub mod adjust;
pub mod auto;
pub mod host;
pub mod plan;
pub mod ramp;
pub mod respond;
pub mod steer;

pub use adjust::{AdjustConfig, Adjuster, Sample};
pub use fatpipe_schema::tune::{Action, Decision, HostLimits, PathFacts, Plan};
pub use plan::{plan, Policy};
