//! `fatpipe server`: being built; its owner replaces this module.

/// Arguments of `fatpipe server`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    Err(crate::exit::usage("'fatpipe server' is not built yet"))
}
