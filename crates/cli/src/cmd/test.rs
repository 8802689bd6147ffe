//! `fatpipe test`: being built; its owner replaces this module.

/// Arguments of `fatpipe test`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    Err(crate::exit::usage("'fatpipe test' is not built yet"))
}
