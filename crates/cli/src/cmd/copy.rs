//! `fatpipe copy`: being built; its owner replaces this module.

/// Arguments of `fatpipe copy`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    Err(crate::exit::usage("'fatpipe copy' is not built yet"))
}
