//! The `fatpipe` binary: argument parsing, rendering, progress and exit codes.
//!
//! This crate is glue. Each subcommand lives in `cmd/<name>.rs`, which owns
//! its clap arguments, turns them into a plan for a library crate, and renders
//! what comes back. No protocol, socket or file-transfer logic lives here.
//!
//! Exit codes are mapped in one place ([`exit`]): 0 ok, 1 the measured thing
//! failed, 2 usage, configuration or authentication errors.

mod cmd;
mod config;
mod exit;

use clap::{CommandFactory, Parser, Subcommand};

/// Measure, tune and fill long fat networks.
#[derive(Debug, Parser)]
#[command(name = "fatpipe", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve tests and transfers to many clients at once.
    Server(cmd::server::Args),
    /// Memory-to-memory TCP/UDP throughput test against a fatpipe server.
    Test(cmd::test::Args),
    /// Copy files to or from a fatpipe server (HOST:EXPORT/PATH; rsync's destination rules).
    Copy(cmd::copy::Args),
    /// Probe a path: RTT, MTU, bottleneck rate (either direction: -R), BDP.
    Path(cmd::path::Args),
    /// Audit this host for a target rate and RTT, or for a probed peer (--for HOST); emit, apply or revert sysctls.
    Tune(cmd::tune::Args),
    /// Emulate a long fat network between two namespaces on this machine.
    Lab(cmd::lab::Args),
    /// Bring up an emulated CERN–New York link and show test, copy and report.
    Demo(cmd::demo::Args),
    /// Run a study from an experiment file (TOML) into the archive; rerun to resume.
    Sweep(cmd::sweep::Args),
    /// Statistics and tables over the archive (text, markdown, CSV, JSON).
    Report(cmd::report::Args),
    /// List, show, export, import and annotate archived runs.
    Archive(cmd::archive::Args),
    /// Make a pre-shared key file (`key new PATH`, mode 0600).
    Key(cmd::key::Args),
    /// Mint a bearer token (WLCG scopes) for the server's HTTP port.
    Token(cmd::http::TokenArgs),
    /// Print a shell completion script (bash, zsh, fish, …) for fatpipe.
    Completions(cmd::completions::CompletionsArgs),
    /// Print fatpipe's manual page (or write every page with --dir).
    Man(cmd::completions::ManArgs),
}

fn main() -> std::process::ExitCode {
    // `fatpipe server --config FILE`: the file's keys become flags before
    // the command line's; an error in it is one line, exit 2.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let expanded = if config::wanted(&argv) {
        config::expand(argv, &Cli::command())
    } else {
        Ok(config::Expanded::Run(argv))
    };
    let argv = match expanded {
        Ok(config::Expanded::Run(argv)) => argv,
        Ok(config::Expanded::Print(text)) => {
            print!("{text}");
            return std::process::ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("fatpipe: {}", fatpipe_proto::escape(&e.to_string()));
            return std::process::ExitCode::from(2);
        }
    };
    // clap prints usage errors itself and exits 2, as we want.
    let cli = Cli::parse_from(argv);
    let result = match cli.command {
        Command::Server(a) => cmd::server::run(a),
        Command::Test(a) => cmd::test::run(a),
        Command::Copy(a) => cmd::copy::run(a),
        Command::Path(a) => cmd::path::run(a),
        Command::Tune(a) => cmd::tune::run(a),
        Command::Lab(a) => cmd::lab::run(a),
        Command::Demo(a) => cmd::demo::run(a),
        Command::Sweep(a) => cmd::sweep::run(a),
        Command::Report(a) => cmd::report::run(a),
        Command::Archive(a) => cmd::archive::run(a),
        Command::Key(a) => cmd::key::run(a),
        Command::Token(a) => cmd::http::mint(a),
        Command::Completions(a) => cmd::completions::completions(a, Cli::command()),
        Command::Man(a) => cmd::completions::man(a, Cli::command()),
    };
    exit::report(result)
}
