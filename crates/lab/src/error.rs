//! The lab's one error type: what went wrong bringing up, driving or
//! removing an emulated link. The binary maps the user's mistakes
//! ([`Error::is_usage`]) to exit code 2 and the rest to 1.

use std::io;

/// Why a lab operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Namespaces and TUN devices need root (CAP_NET_ADMIN and CAP_SYS_ADMIN).
    #[error("fatpipe lab needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to create namespaces and TUN devices; run it with sudo")]
    NotPermitted,
    /// The lab name is not usable as part of a namespace name.
    #[error("lab name '{0}': use 1 to 11 characters of a-z, 0-9, '-' or '_'")]
    BadName(String),
    /// A lab of this name is already running.
    #[error("lab '{0}' is already up; 'fatpipe lab down {0}' removes it")]
    Exists(String),
    /// No lab of this name exists.
    #[error("no lab named '{0}'; 'fatpipe lab list' shows the labs that are up")]
    NotFound(String),
    /// A parameter is out of range.
    #[error("{0}")]
    Invalid(String),
    /// A quantity could not be parsed.
    #[error(transparent)]
    Unit(#[from] fatpipe_schema::units::UnitError),
    /// An `ip` command (or another helper) failed.
    #[error("'{cmd}' failed: {stderr}")]
    Command {
        /// The command line.
        cmd: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// The forwarder process did not start or died.
    #[error("the link forwarder did not come up: {0}")]
    Forwarder(String),
    /// The link did not carry a test packet in time.
    #[error("the link did not carry a test packet: {0}")]
    NotReady(String),
    /// The control channel to the forwarder failed or answered nonsense.
    #[error("control channel of lab '{name}': {why}")]
    Control {
        /// The lab.
        name: String,
        /// What went wrong.
        why: String,
    },
    /// A system call or file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: io::Error,
    },
}

impl Error {
    /// True when the user can fix it by changing the command (exit 2).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            Error::NotPermitted
                | Error::BadName(_)
                | Error::Exists(_)
                | Error::NotFound(_)
                | Error::Invalid(_)
                | Error::Unit(_)
        )
    }

    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Error {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}
