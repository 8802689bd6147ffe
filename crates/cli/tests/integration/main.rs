//! One integration-test binary that runs the real `fatpipe` executable.
//!
//! Each module covers one subcommand; `util` holds the shared harness.
//! Tests that need root (namespaces, TUN) call [`util::need_root`] first: they
//! skip with a message outside CI and fail loudly in CI if root is missing.
//! Regression tests are named after the issue they pin (`issue_12_...`).

mod util;

mod adjust;
mod auto;
mod config;
mod copy;
mod demo;
mod encrypt;
mod flood;
mod harden;
mod http;
mod http_client;
mod iperf3;
mod lab;
mod lab_copy;
mod lab_faults;
mod memory;
mod metrics;
mod path;
mod plots;
mod report;
mod rfc6349;
mod server_test;
mod sweep;
mod tpc;
mod tpc_leg;
mod tune;
mod udp;
