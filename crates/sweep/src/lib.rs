//! `fatpipe sweep`: a study as a file. An experiment names a target (a
//! `fatpipe server`, or a lab link the sweep brings up) and a matrix of
//! parameters; the sweep runs every cell of it, repeated and interleaved,
//! stores every run in the archive the moment it ends, and resumes from
//! the archive when run again.
//!
//! Layout: [`experiment`] (the file and its checks: every error one line
//! with the file, line and key), [`plan`] (cells, order, resume, estimates,
//! each run's command line: pure), [`run`] (labs, servers, processes,
//! storing), [`error`].

pub mod error;
pub mod experiment;
pub mod plan;
pub mod run;

pub use error::SweepError;
pub use experiment::{Experiment, Param, Phase, ReportSpec, SeedFigure, Target};
pub use plan::{cells, key_params, schedule, Cell, Planned};
pub use run::{run, Event, Outcome};
