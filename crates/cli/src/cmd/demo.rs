//! `fatpipe demo`: being built; its owner replaces this module.

/// Arguments of `fatpipe demo`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    Err(crate::exit::usage("'fatpipe demo' is not built yet"))
}
