//! The engine's one error type.
//!
//! Sessions fail in a few ways a caller treats differently: the keys do not
//! match (the user's configuration: exit 2), the peer refused or broke the
//! protocol, a step timed out, or the network failed. [`EngineError`] keeps
//! those apart so the binary can map them without parsing text.

use std::io;

use fatpipe_proto::{ConnError, DecodeError};

/// Why a session, a data connection or a service failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A socket operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The system's error.
        #[source]
        source: io::Error,
    },
    /// The control protocol ended the session (refusal, auth, peer close).
    #[error(transparent)]
    Conn(#[from] ConnError),
    /// The peer sent bytes that do not decode. (Not a `source`: the text
    /// already says it, and error chains would print it twice.)
    #[error("malformed message from peer: {0}")]
    Decode(DecodeError),
    /// A step did not finish in time.
    #[error("timed out {0}")]
    Timeout(String),
    /// The peer's service (or ours) reported a failure.
    #[error("{0}")]
    Service(String),
    /// The TLS handshake of `--encrypt` failed (a server with another key
    /// is [`is_auth`](EngineError::is_auth)).
    #[error(transparent)]
    Tls(#[from] fatpipe_secure::TlsError),
    /// `--encrypt` was asked for without a pre-shared key.
    #[error("--encrypt needs the pre-shared key (--key-file): without it nothing authenticates the server")]
    EncryptWithoutKey,
}

impl From<DecodeError> for EngineError {
    fn from(e: DecodeError) -> Self {
        EngineError::Decode(e)
    }
}

impl EngineError {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        EngineError::Io {
            context: context.into(),
            source,
        }
    }

    /// True if the keys are missing or do not match: the user must fix
    /// `--key-file` (exit code 2).
    pub fn is_auth(&self) -> bool {
        matches!(self, EngineError::Conn(c) if c.is_auth())
            || matches!(
                self,
                EngineError::Tls(fatpipe_secure::TlsError::WrongServerKey)
                    | EngineError::EncryptWithoutKey
            )
    }
}

/// Shorthand used throughout the engine.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
