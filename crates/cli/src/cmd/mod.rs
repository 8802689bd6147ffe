//! One module per subcommand; each owns its `Args` and a `run` function.

pub mod archive;
pub mod common;
pub mod completions;
pub mod copy;
pub mod demo;
pub mod http;
pub mod httpcopy;
pub mod iperf3;
pub mod key;
pub mod lab;
pub mod metrics;
pub mod path;
pub mod plots;
pub mod report;
pub mod server;
pub mod sweep;
pub mod test;
pub mod tune;
