//! One module per subcommand; each owns its `Args` and a `run` function.

pub mod common;
pub mod copy;
pub mod demo;
pub mod iperf3;
pub mod lab;
pub mod path;
pub mod server;
pub mod test;
pub mod tune;
