//! `fatpipe tune`: being built; its owner replaces this module.

/// Arguments of `fatpipe tune`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    Err(crate::exit::usage("'fatpipe tune' is not built yet"))
}
