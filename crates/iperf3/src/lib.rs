//! iperf3's wire protocol, so that fatpipe fits where iperf3 already runs:
//! a client for stock iperf3 servers (`fatpipe test --iperf3`) and a server
//! for stock iperf3 clients (`fatpipe server --iperf3-port`).
//!
//! A clean-room implementation from the protocol as iperf3's own source
//! defines it (notes in docs/iperf3.md). The control messages are sans-IO
//! ([`wire`]: state bytes, cookie, length-prefixed JSON, each decoder
//! size-capped and fuzzed); [`client`] and [`server`] drive them over
//! blocking control sockets, their data streams running as tasks of the
//! engine's data-plane runner ([`data`]: no thread per stream), and hand
//! back the same `fatpipe_schema::test` types as a fatpipe test, so the
//! binary renders and stores both alike.
//!
//! The server side is not an engine service (iperf3 has its own port,
//! handshake and cookie) but an engine front end
//! ([`server::Iperf3Port`] implements `fatpipe_engine::FrontEnd`): the
//! engine accepts its connections and gives it the server's pre-auth
//! deadline and caps, session and stream slots, observer, escaped log and
//! drain, exactly as to the fatpipe protocol's port.

pub mod auth;
pub mod client;
pub mod data;
pub mod server;
mod session;
pub mod wire;

use std::io;

/// Why an iperf3 test failed.
#[derive(Debug, thiserror::Error)]
pub enum Iperf3Error {
    /// A socket operation failed.
    /// (Not a `source`: the text already says it, and error chains would
    /// print it twice.)
    #[error("{context}: {error}")]
    Io {
        /// What was being done.
        context: String,
        /// The system's error.
        error: io::Error,
    },
    /// The peer's bytes did not decode.
    #[error(transparent)]
    Wire(#[from] wire::WireError),
    /// This end's RSA authentication could not be set up.
    #[error(transparent)]
    Auth(#[from] auth::AuthError),
    /// The server refused the test or failed (`SERVER_ERROR`).
    #[error("the iperf3 server reported an error: {}", server_error_text(*.i_errno, *.errno))]
    Server {
        /// iperf3's error number.
        i_errno: i32,
        /// The system's errno, 0 if none.
        errno: i32,
    },
    /// The server is running another test (iperf3 serves one at a time).
    #[error("the iperf3 server is busy with another test; try again later")]
    Busy,
    /// The peer sent a state that does not fit where the test is.
    #[error("iperf3 peer sent {got:?} while {waiting}")]
    Unexpected {
        /// What came.
        got: wire::State,
        /// What this side waited for.
        waiting: &'static str,
    },
    /// The peer closed the control connection.
    #[error("the iperf3 peer closed the connection while {0}")]
    Closed(&'static str),
    /// A step did not finish in time.
    #[error("timed out {0}")]
    Timeout(String),
    /// The peer is not what was asked for, or the test asked for
    /// something this implementation cannot do.
    #[error("{0}")]
    Unsupported(String),
    /// A data stream failed while the test ran.
    #[error("{0}")]
    Stream(String),
    /// The peer broke the protocol's order.
    #[error("iperf3 peer sent {0}")]
    Protocol(String),
}

impl Iperf3Error {
    /// True when the user's flags or target are at fault (exit 2): a
    /// parameter the server refused (iperf3's parameter errors are below
    /// 100), or a peer that is not an iperf3 server.
    pub fn is_usage(&self) -> bool {
        match self {
            Iperf3Error::Server { i_errno, .. } => {
                (1..100).contains(i_errno) || *i_errno == wire::errno::AUTHTEST
            }
            Iperf3Error::Auth(_) => true,
            Iperf3Error::Unsupported(_) => true,
            _ => false,
        }
    }

    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, error: io::Error) -> Self {
        Iperf3Error::Io {
            context: context.into(),
            error,
        }
    }
}

/// Shorthand.
pub type Result<T, E = Iperf3Error> = std::result::Result<T, E>;

/// Words for the iperf3 error numbers (`iperf_api.h`) a server sends.
fn server_error_text(i_errno: i32, errno: i32) -> String {
    use wire::errno as e;
    let what = match i_errno {
        e::DURATION => "test too long",
        e::NUMSTREAMS => "too many parallel streams",
        e::BLOCKSIZE | e::UDPBLOCKSIZE => "block size (-l) refused",
        e::BUFSIZE => "socket buffer (-w) too large",
        e::MSS => "MSS (-M) too large",
        e::OMIT => "bad --omit",
        e::UNIMP => "an option this server does not implement",
        e::RECVPARAMS => "the server could not read the parameters",
        e::ACCESSDENIED => "the server is busy",
        e::SETMSS => "the server cannot set that MSS",
        e::SETBUF | e::SETBUF2 | e::SETWINDOWSIZE => "the server cannot set that socket buffer",
        e::PROTOCOL => "protocol not supported by the server",
        e::SETCONGESTION => "the server cannot use that congestion control",
        e::AUTHTEST => "authentication failed",
        e::STREAMACCEPT => "the server could not accept a data stream",
        _ => "",
    };
    let sys = if errno != 0 {
        format!(", {}", io::Error::from_raw_os_error(errno))
    } else {
        String::new()
    };
    if what.is_empty() {
        format!("iperf3 error {i_errno}{sys}")
    } else {
        format!("{what} (iperf3 error {i_errno}{sys})")
    }
}

#[cfg(test)]
mod tests;
