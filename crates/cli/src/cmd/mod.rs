//! One module per subcommand; each owns its `Args` and a `run` function.

pub mod common;
pub mod completions;
pub mod copy;
pub mod demo;
pub mod lab;
pub mod metrics;
pub mod path;
pub mod server;
pub mod test;
pub mod tune;
