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

/// The error and its causes on one line, `copy: open x: denied`, each
/// said once. Many errors both show their cause in their own message and
/// return it as `source()` (`io::Error::other(e)`, a thiserror variant
/// `"{context}: {source}"`), so printing every link of the chain, as
/// anyhow's `{:#}` does, said the OS error twice ("Connection refused (os
/// error 111): Connection refused (os error 111)"). A cause whose text is
/// already on the line is left out, whatever type carried it.
pub fn one_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for e in err.chain() {
        let text = e.to_string();
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
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
    // The chain may quote the peer (a server's refusal, a file name):
    // escaped, so it cannot drive the terminal.
    eprintln!("fatpipe: {}", fatpipe_proto::escape(&one_line(&err)));
    if err.chain().any(|e| e.is::<UsageError>()) {
        ExitCode::from(2)
    } else {
        ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Like a thiserror variant `"connect to h:1: {source}"`.
    #[derive(Debug)]
    struct Shows {
        source: std::io::Error,
    }

    impl fmt::Display for Shows {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "connect to h:1: {}", self.source)
        }
    }

    impl std::error::Error for Shows {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    #[test]
    fn a_cause_already_shown_is_not_repeated() {
        let refused = || std::io::Error::from_raw_os_error(111);
        let e = anyhow::Error::new(Shows { source: refused() }).context("test against h");
        let line = one_line(&e);
        assert_eq!(line.matches("os error 111").count(), 1, "{line}");
        assert!(
            line.starts_with("test against h: connect to h:1: "),
            "{line}"
        );
        // io::Error::other shows its inner error and returns it as source.
        let e = anyhow::Error::new(std::io::Error::other(Shows { source: refused() }));
        assert_eq!(one_line(&e).matches("os error 111").count(), 1);
        // Causes that add something are all kept.
        let e = anyhow::Error::new(refused())
            .context("open x")
            .context("copy");
        assert!(one_line(&e).starts_with("copy: open x: "));
    }
}
