//! `fatpipe lab`: being built; its owner replaces this module.

/// Arguments of `fatpipe lab`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    Err(crate::exit::usage("'fatpipe lab' is not built yet"))
}
