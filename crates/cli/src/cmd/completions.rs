//! `fatpipe completions SHELL` and `fatpipe man`: shell completions and
//! manual pages generated from the clap definitions themselves, so they
//! can never disagree with the flags the binary takes.
//!
//! Both print to stdout by default (a package build runs
//! `fatpipe completions bash > …/fatpipe` and `fatpipe man > fatpipe.1`);
//! `fatpipe man --dir DIR` writes one page per subcommand as well
//! (`fatpipe-server.1`, `fatpipe-test.1`, …), for `man fatpipe-test`.

use std::io::Write;
use std::path::PathBuf;

/// Arguments of `fatpipe completions`.
#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for (bash, zsh, fish, elvish, powershell).
    pub shell: clap_complete::Shell,
}

/// Arguments of `fatpipe man`.
#[derive(Debug, clap::Args)]
pub struct ManArgs {
    /// Write fatpipe.1 and one page per subcommand into DIR instead of
    /// printing fatpipe.1 on stdout.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Prints the completion script for `args.shell`.
pub fn completions(args: CompletionsArgs, mut cmd: clap::Command) -> anyhow::Result<()> {
    // Into memory first: clap_complete panics on a failed write, and a
    // closed pipe (`| head`) must end quietly like every other command.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "fatpipe", &mut script);
    let mut out = std::io::stdout().lock();
    out.write_all(&script)?;
    out.flush()?;
    Ok(())
}

/// Prints the manual page, or writes every page into `--dir`.
pub fn man(args: ManArgs, cmd: clap::Command) -> anyhow::Result<()> {
    let Some(dir) = args.dir else {
        let mut out = std::io::stdout().lock();
        clap_mangen::Man::new(cmd).render(&mut out)?;
        out.flush()?;
        return Ok(());
    };
    std::fs::create_dir_all(&dir)
        .map_err(|e| crate::exit::usage(format!("--dir {}: {e}", dir.display())))?;
    clap_mangen::generate_to(cmd, &dir)
        .map_err(|e| anyhow::anyhow!("write manual pages into {}: {e}", dir.display()))?;
    Ok(())
}
