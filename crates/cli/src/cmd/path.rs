//! `fatpipe path`: being built; its owner replaces this module.

/// Arguments of `fatpipe path`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    Err(crate::exit::usage("'fatpipe path' is not built yet"))
}
