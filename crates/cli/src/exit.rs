//! Errors to exit codes, in one place.
//!
//! Library crates return their own `thiserror` enums; command modules wrap
//! them in `anyhow`. A command marks an error as a usage/config/auth problem
//! with [`usage`] (exit 2); anything else the measured thing failing (exit 1).
//! A broken pipe on stdout (e.g. `fatpipe test ... | head`) exits quietly.

use std::fmt;
use std::process::ExitCode;

/// Marks an error as the user's to fix: bad flags, config, or authentication.
#[derive(Debug)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Builds an exit-2 error with one line saying what to do.
pub fn usage(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UsageError(msg.into()))
}

/// Prints the error as one line and returns the exit code for it.
pub fn report(result: anyhow::Result<()>) -> ExitCode {
    let Err(err) = result else {
        return ExitCode::SUCCESS;
    };
    if err
        .chain()
        .filter_map(|e| e.downcast_ref::<std::io::Error>())
        .any(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    {
        return ExitCode::SUCCESS;
    }
    // `{:#}` prints the context chain on one line: "copy: open x: denied".
    eprintln!("fatpipe: {err:#}");
    if err.chain().any(|e| e.is::<UsageError>()) {
        ExitCode::from(2)
    } else {
        ExitCode::from(1)
    }
}
