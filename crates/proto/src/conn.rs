//! The client and server session state machines.
//!
//! Both are sans-IO in the quinn-proto style: bytes from the socket go in
//! through `handle_input`, the passage of time through `handle_timeout`, and
//! the caller drains `poll_transmit` (bytes to write), `poll_event` (what
//! happened) and `poll_timeout` (when to call back). Nothing here opens a
//! socket, reads a clock or draws a random number: nonces and cookies are
//! passed in, so the tests in `crate::tests` drive both ends in memory on a
//! virtual clock.
//!
//! The handshake (docs/protocol.md has the diagram):
//!
//! ```text
//! client                                   server
//!   ClientHello{versions, nonce_c}  ──▶
//!                                   ◀──    ServerHello{version, auth?, nonce_s}
//!   [ClientAuth{mac_c}] Open{svc,params} ──▶      (pipelined: one round trip)
//!                                   ◀──    [ServerAuth{mac_s}] Accept{cookie} | Reject
//! ```
//!
//! On a keyed server a client without the key may still open the
//! services the server names in [`ServerConfig::keyless_services`] (the
//! copy service, for `:public` exports): it sends `Open` right after the
//! hello, without `ClientAuth`, and the server reports the request as
//! [`ServerEvent::Open`] with `authenticated: false` (and sends no
//! `ServerAuth`); any other service gets `Reject` code `AuthRequired`,
//! which the client reports as [`ConnError::AuthRequired`].
//!
//! Every server step before `Open` runs under one deadline (the pre-auth
//! timeout), so a client that stalls mid-handshake costs the server at most
//! that long. A connection whose first frame is `DataHello` is a data
//! connection: the server machine reports its cookie and stops there once the
//! caller attaches it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::auth::Key;
use crate::coding::DecodeError;
use crate::frame::FrameDecoder;
use crate::message::{ErrorCode, Message, Nonce, TicketId, VERSION};
use crate::Cookie;

/// How a session ended, or why it could not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnError {
    /// The peer ended the session with `Close`; the reason may be empty.
    #[error("peer closed the session{}", if .0.is_empty() { String::new() } else { format!(": {}", crate::escape(.0)) })]
    Closed(String),
    /// The connection ended (EOF) without a `Close`.
    #[error("connection closed by peer")]
    Eof,
    /// The peer refused the request.
    #[error("{}", reject_text(*.code, .reason))]
    Rejected {
        /// Machine-readable reason.
        code: ErrorCode,
        /// The peer's words.
        reason: String,
    },
    /// The peer's bytes did not decode.
    #[error("malformed control data: {0}")]
    Decode(#[from] DecodeError),
    /// A well-formed message arrived where the protocol does not allow it.
    #[error("unexpected {got} while {state}")]
    Unexpected {
        /// What arrived.
        got: &'static str,
        /// What this side was waiting for.
        state: &'static str,
    },
    /// A handshake step did not finish in time.
    #[error("timed out while {0}")]
    Timeout(&'static str),
    /// No protocol version both sides speak.
    #[error("no common protocol version (we speak {ours}, peer offered {min}..={max})")]
    BadVersion {
        /// Our version.
        ours: u16,
        /// Lowest the peer accepts.
        min: u16,
        /// Highest the peer speaks.
        max: u16,
    },
    /// The server requires a key and this client has none.
    #[error("the server requires a key: pass --key-file")]
    AuthRequired,
    /// The client's proof was wrong (server side: the client has the wrong key).
    #[error("authentication failed: the client's key does not match")]
    AuthFailed,
    /// A one-time ticket was refused (server side).
    #[error(
        "the ticket is unknown, expired, spent or not for this service, or its proof is wrong"
    )]
    TicketRefused,
    /// This client has a key but the server did not prove it has it too.
    #[error("the server did not authenticate (it has no key, or is not the server you meant); drop --key-file only if you trust this path")]
    ServerUnauthenticated,
    /// The server's proof was wrong: it has a different key or is an impostor.
    #[error("the server's proof of the key is wrong (different key, or not the server you meant)")]
    ServerProofFailed,
    /// A payload larger than one frame allows.
    #[error("payload of {0} bytes exceeds the frame cap")]
    PayloadTooLarge(usize),
    /// The session is not established (or already closed).
    #[error("the session is not established")]
    NotEstablished,
    /// The server's first byte cannot start a fatpipe frame (whose length
    /// is at most 64 KiB, so its first byte is 0): another program listens
    /// there. iperf3 answers a connection at once with one state byte.
    #[error("{}", not_fatpipe_text(*.0))]
    NotFatpipe(u8),
}

impl ConnError {
    /// True if this error means the keys do not match or are missing, or
    /// the address is not a fatpipe server at all: the user's configuration
    /// to fix (exit code 2 in the binary), never worth a retry.
    pub fn is_auth(&self) -> bool {
        matches!(
            self,
            ConnError::NotFatpipe(_)
                | ConnError::AuthRequired
                | ConnError::AuthFailed
                | ConnError::TicketRefused
                | ConnError::ServerUnauthenticated
                | ConnError::ServerProofFailed
                | ConnError::Rejected {
                    code: ErrorCode::AuthFailed | ErrorCode::AuthRequired,
                    ..
                }
        )
    }
}

/// The line for [`ConnError::NotFatpipe`]: names iperf3 when its state
/// bytes (`PARAM_EXCHANGE` 9, `ACCESS_DENIED` -1, `SERVER_ERROR` -2) came.
fn not_fatpipe_text(first: u8) -> String {
    match first {
        0x09 => "not a fatpipe server: it answers like an iperf3 server; run `fatpipe test --iperf3` against it".into(),
        0xff => "not a fatpipe server: it answers like a busy iperf3 server (access denied); run `fatpipe test --iperf3` against it".into(),
        0xfe => "not a fatpipe server: it answers like an iperf3 server reporting an error; run `fatpipe test --iperf3` against it".into(),
        b => format!("not a fatpipe server: its first byte was 0x{b:02x} (a fatpipe server's is 0x00)"),
    }
}

fn reject_text(code: ErrorCode, reason: &str) -> String {
    let what = match code {
        ErrorCode::AuthFailed => "authentication failed: wrong key (check --key-file on both ends)",
        ErrorCode::AuthRequired => "the server requires a key: pass --key-file",
        ErrorCode::BadVersion => "no common protocol version",
        ErrorCode::UnknownService => "the server does not offer this service",
        ErrorCode::Busy => "the server is busy",
        ErrorCode::Protocol => "protocol error",
        ErrorCode::Timeout => "timed out",
        ErrorCode::BadCookie => "unknown session cookie",
        ErrorCode::Service => "the service refused",
        ErrorCode::Other(_) => "refused",
    };
    // For key problems the fix is always the same; the server's wording
    // would only repeat it.
    let auth = matches!(code, ErrorCode::AuthFailed | ErrorCode::AuthRequired);
    if reason.is_empty() || auth {
        format!("server refused: {what}")
    } else {
        // The reason is the peer's text: escaped before any terminal sees it.
        format!("server refused: {what}: {}", crate::escape(reason))
    }
}

/// What a client session reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientEvent {
    /// The server accepted the service request.
    Established {
        /// Present this on every data connection.
        cookie: Cookie,
        /// The negotiated protocol version.
        version: u16,
    },
    /// A service message from the server.
    Payload(Vec<u8>),
    /// The session is over; nothing more will be reported.
    Closed(ConnError),
}

/// What a server connection reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerEvent {
    /// A client asks for a service; answer with [`ServerConn::accept`] or
    /// [`ServerConn::reject`].
    Open {
        /// The service name.
        service: String,
        /// Its opaque parameters.
        params: Vec<u8>,
        /// True if the client proved the key, or the server has none;
        /// false for a keyless client of a keyed server opening one of
        /// its `keyless_services`.
        authenticated: bool,
        /// What the one-time ticket the client proved grants (opaque
        /// here: the service reads it); `None` without a ticket.
        ticket: Option<Vec<u8>>,
    },
    /// This is a data connection; answer with [`ServerConn::attach`] or
    /// [`ServerConn::reject`]. After `attach` the machine is done and the
    /// socket carries raw service bytes.
    DataHello {
        /// The cookie it presented.
        cookie: Cookie,
        /// The service-defined stream label.
        tag: u32,
    },
    /// A service message from the client.
    Payload(Vec<u8>),
    /// The connection is over; nothing more will be reported.
    Closed(ConnError),
}

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Pre-shared key, if the user gave one.
    pub key: Option<Key>,
    /// Service to open.
    pub service: String,
    /// Its parameters.
    pub params: Vec<u8>,
    /// Deadline for the whole handshake.
    pub handshake_timeout: Duration,
}

/// Server settings shared by all its connections.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Pre-shared key; `None` admits every client.
    pub key: Option<Key>,
    /// Deadline for everything before `Open` (and for a data hello).
    pub preauth_timeout: Duration,
    /// Services a client without the key may open on a keyed server (it
    /// is then told `authenticated: false`); empty: none.
    pub keyless_services: Vec<String>,
    /// The one-time tickets a client may prove instead of the key
    /// (`TicketAuth`); `None`: tickets are refused.
    pub tickets: Option<Arc<dyn Tickets>>,
}

/// The server's one-time tickets, issued elsewhere (the HTTP port, for
/// the leg of a third-party copy; docs/protocol.md, "Tickets"). Each
/// grants one session of one service, for a short time.
pub trait Tickets: Send + Sync + std::fmt::Debug {
    /// The key of a live ticket (not spent, not expired), without spending
    /// it.
    fn key(&self, id: &TicketId, now: Instant) -> Option<Key>;
    /// Spends the ticket on a session of `service`: what it grants, or
    /// `None` if it is unknown, expired, spent or not for this service.
    fn redeem(&self, id: &TicketId, service: &str, now: Instant) -> Option<Vec<u8>>;
    /// Whether the ticket opens only sessions encrypted with its own key
    /// (one issued over HTTPS: its sessions must not travel in the clear;
    /// docs/protocol.md, "Encrypted with a ticket"). The engine enforces
    /// it. Default: no.
    fn encrypted_only(&self, _id: &TicketId) -> bool {
        false
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientState {
    AwaitServerHello,
    AwaitServerAuth { server_nonce: Nonce },
    AwaitAccept,
    Established,
    Closed,
}

/// The client end of a control connection.
#[derive(Debug)]
pub struct ClientConn {
    config: ClientConfig,
    nonce: Nonce,
    state: ClientState,
    deadline: Option<Instant>,
    decoder: FrameDecoder,
    /// No byte has come from the server yet: the first one tells whether
    /// it speaks this protocol at all.
    silent: bool,
    out: Vec<u8>,
    events: VecDeque<ClientEvent>,
}

impl ClientConn {
    /// Starts a session: queues the `ClientHello`, and for a client without
    /// a key the `Open` right behind it. `nonce` must be fresh random bytes.
    ///
    /// Only a key's proof needs the server's nonce; without a key nothing
    /// the client sends depends on the server's hello, so waiting for it
    /// would cost a round trip for nothing (228 ms on a long path, paid by
    /// every probe, test and copy). The server reads frame by frame in
    /// order, so the `Open` is read exactly where it would have been.
    pub fn new(config: ClientConfig, now: Instant, nonce: Nonce) -> Self {
        let mut c = ClientConn {
            deadline: Some(now + config.handshake_timeout),
            config,
            nonce,
            state: ClientState::AwaitServerHello,
            decoder: FrameDecoder::new(),
            silent: true,
            out: Vec::new(),
            events: VecDeque::new(),
        };
        c.send(&Message::ClientHello {
            version_min: VERSION,
            version_max: VERSION,
            nonce,
        });
        if c.config.key.is_none() {
            c.send_open();
        }
        c
    }

    /// Feeds bytes read from the control socket.
    pub fn handle_input(&mut self, _now: Instant, data: &[u8]) {
        if self.state == ClientState::Closed {
            return;
        }
        if let (true, Some(&first)) = (self.silent, data.first()) {
            self.silent = false;
            if first != 0 {
                // Not ours: say so now rather than wait for three more
                // bytes that may never come (iperf3 sends one and waits).
                self.fail_quiet(ConnError::NotFatpipe(first));
                return;
            }
        }
        self.decoder.push(data);
        loop {
            match self.decoder.next_frame() {
                Ok(Some(body)) => match Message::decode(&body) {
                    Ok(msg) => self.on_message(msg),
                    Err(e) => self.fail(ConnError::Decode(e), true),
                },
                Ok(None) => break,
                Err(e) => self.fail(ConnError::Decode(e), true),
            }
            if self.state == ClientState::Closed {
                break;
            }
        }
    }

    /// The socket reached end of file.
    pub fn handle_eof(&mut self, _now: Instant) {
        if self.state != ClientState::Closed {
            self.fail(ConnError::Eof, false);
        }
    }

    /// Time passed; call at or after [`poll_timeout`](Self::poll_timeout).
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some(d) = self.deadline {
            if now >= d && self.state != ClientState::Closed {
                let step = match self.state {
                    ClientState::AwaitServerHello => "waiting for the server's hello",
                    ClientState::AwaitServerAuth { .. } => "waiting for the server's proof",
                    _ => "waiting for the server to accept",
                };
                self.fail(ConnError::Timeout(step), true);
            }
        }
    }

    /// When to call [`handle_timeout`](Self::handle_timeout), if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
    }

    /// Bytes to write to the socket, if any.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        (!self.out.is_empty()).then(|| std::mem::take(&mut self.out))
    }

    /// The next thing that happened.
    pub fn poll_event(&mut self) -> Option<ClientEvent> {
        self.events.pop_front()
    }

    /// Queues one service message.
    pub fn send_payload(&mut self, data: &[u8]) -> Result<(), ConnError> {
        if self.state != ClientState::Established {
            return Err(ConnError::NotEstablished);
        }
        Message::Payload(data.to_vec())
            .encode(&mut self.out)
            .map_err(|_| ConnError::PayloadTooLarge(data.len()))
    }

    /// Ends the session, queueing a `Close` for the peer.
    pub fn close(&mut self, reason: &str) {
        if self.state != ClientState::Closed {
            self.send(&Message::Close {
                reason: reason.into(),
            });
            self.state = ClientState::Closed;
            self.deadline = None;
        }
    }

    /// True once established and not closed.
    pub fn is_established(&self) -> bool {
        self.state == ClientState::Established
    }

    /// True once closed, for whatever reason.
    pub fn is_closed(&self) -> bool {
        self.state == ClientState::Closed
    }

    /// Bytes received after the last complete frame (the caller takes over
    /// the framing when it splits reading and writing across threads).
    pub fn take_buffered(&mut self) -> Vec<u8> {
        self.decoder.take_buffered()
    }

    fn on_message(&mut self, msg: Message) {
        match (self.state, msg) {
            (_, Message::Reject { code, reason }) => {
                if code == ErrorCode::AuthRequired && self.config.key.is_none() {
                    // The fix is ours to name: pass the key.
                    return self.fail_quiet(ConnError::AuthRequired);
                }
                self.fail_quiet(ConnError::Rejected { code, reason });
            }
            (ClientState::Established, Message::Payload(p)) => {
                self.events.push_back(ClientEvent::Payload(p));
            }
            (ClientState::Established, Message::Close { reason }) => {
                self.fail_quiet(ConnError::Closed(reason));
            }
            (
                ClientState::AwaitServerHello,
                Message::ServerHello {
                    version,
                    auth_required,
                    nonce: server_nonce,
                },
            ) => {
                if version != VERSION {
                    return self.fail(
                        ConnError::BadVersion {
                            ours: VERSION,
                            min: version,
                            max: version,
                        },
                        true,
                    );
                }
                match (auth_required, self.config.key.clone()) {
                    // A ticket is proven whatever the server requires: it
                    // is what grants the session.
                    (_, Some(key)) if key.ticket_id().is_some() => {
                        let ticket = key.ticket_id().copied().unwrap_or_default();
                        let mac = key.client_proof(&server_nonce, &self.nonce);
                        self.send(&Message::TicketAuth { ticket, mac });
                        self.send_open();
                        self.state = ClientState::AwaitServerAuth { server_nonce };
                    }
                    (true, Some(key)) => {
                        let mac = key.client_proof(&server_nonce, &self.nonce);
                        self.send(&Message::ClientAuth { mac });
                        self.send_open();
                        self.state = ClientState::AwaitServerAuth { server_nonce };
                    }
                    // Without the key the client may still open what the
                    // server serves keyless (public exports); the server
                    // refuses anything else with AuthRequired. Its Open
                    // went with the hello.
                    (_, None) => self.state = ClientState::AwaitAccept,
                    (false, Some(_)) => self.fail(ConnError::ServerUnauthenticated, true),
                }
            }
            (ClientState::AwaitServerAuth { server_nonce }, Message::ServerAuth { mac }) => {
                let ok = self
                    .config
                    .key
                    .as_ref()
                    .is_some_and(|k| k.verify_server(&self.nonce, &server_nonce, &mac));
                if ok {
                    self.state = ClientState::AwaitAccept;
                } else {
                    self.fail(ConnError::ServerProofFailed, true);
                }
            }
            (ClientState::AwaitAccept, Message::Accept { cookie }) => {
                self.state = ClientState::Established;
                self.deadline = None;
                self.events.push_back(ClientEvent::Established {
                    cookie,
                    version: VERSION,
                });
            }
            (state, msg) => {
                let err = ConnError::Unexpected {
                    got: msg_name(&msg),
                    state: client_state_name(state),
                };
                self.fail(err, true);
            }
        }
    }

    fn send_open(&mut self) {
        let open = Message::Open {
            service: self.config.service.clone(),
            params: self.config.params.clone(),
        };
        if open.encode(&mut self.out).is_err() {
            let n = self.config.params.len();
            self.fail(ConnError::PayloadTooLarge(n), true);
        }
    }

    fn send(&mut self, msg: &Message) {
        // Only handshake messages and reasons go through here; they are far
        // below the frame cap, so encoding cannot fail.
        let _ = msg.encode(&mut self.out);
    }

    fn fail(&mut self, err: ConnError, tell_peer: bool) {
        if tell_peer {
            self.send(&Message::Close {
                reason: err.to_string(),
            });
        }
        self.fail_quiet(err);
    }

    fn fail_quiet(&mut self, err: ConnError) {
        self.state = ClientState::Closed;
        self.deadline = None;
        self.events.push_back(ClientEvent::Closed(err));
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ServerState {
    AwaitHello,
    AwaitAuth { client_nonce: Nonce },
    AwaitOpen,
    AwaitTicketOpen { ticket: TicketId },
    AwaitDecision,
    Established,
    DataPending,
    DataAttached,
    Closed,
}

/// The server end of a connection: control or data, decided by its first
/// frame.
#[derive(Debug)]
pub struct ServerConn {
    key: Option<Key>,
    keyless_services: Vec<String>,
    tickets: Option<Arc<dyn Tickets>>,
    nonce: Nonce,
    client_nonce: Nonce,
    state: ServerState,
    deadline: Option<Instant>,
    decoder: FrameDecoder,
    out: Vec<u8>,
    events: VecDeque<ServerEvent>,
}

impl ServerConn {
    /// A freshly accepted connection. `nonce` must be fresh random bytes.
    pub fn new(config: &ServerConfig, now: Instant, nonce: Nonce) -> Self {
        ServerConn {
            key: config.key.clone(),
            keyless_services: config.keyless_services.clone(),
            tickets: config.tickets.clone(),
            nonce,
            client_nonce: [0; 32],
            state: ServerState::AwaitHello,
            deadline: Some(now + config.preauth_timeout),
            decoder: FrameDecoder::new(),
            out: Vec::new(),
            events: VecDeque::new(),
        }
    }

    /// Feeds bytes read from the socket.
    pub fn handle_input(&mut self, now: Instant, data: &[u8]) {
        if matches!(self.state, ServerState::Closed | ServerState::DataAttached) {
            return;
        }
        self.decoder.push(data);
        loop {
            // A data connection stops framing after its hello: what follows
            // belongs to the service once the caller attaches it. A control
            // connection pauses while the caller decides on `Open`.
            if matches!(
                self.state,
                ServerState::DataPending | ServerState::AwaitDecision
            ) {
                break;
            }
            match self.decoder.next_frame() {
                Ok(Some(body)) => match Message::decode(&body) {
                    Ok(msg) => self.on_message(now, msg),
                    Err(e) => self.fail(ConnError::Decode(e), ErrorCode::Protocol),
                },
                Ok(None) => break,
                Err(e) => self.fail(ConnError::Decode(e), ErrorCode::Protocol),
            }
            if self.state == ServerState::Closed {
                break;
            }
        }
    }

    /// The socket reached end of file.
    pub fn handle_eof(&mut self, _now: Instant) {
        if !matches!(self.state, ServerState::Closed | ServerState::DataAttached) {
            self.fail_quiet(ConnError::Eof);
        }
    }

    /// Time passed; call at or after [`poll_timeout`](Self::poll_timeout).
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some(d) = self.deadline {
            if now >= d {
                let step = match self.state {
                    ServerState::AwaitHello => "waiting for the client's hello",
                    ServerState::AwaitAuth { .. } => "waiting for the client's proof",
                    _ => "waiting for the client's request",
                };
                self.fail(ConnError::Timeout(step), ErrorCode::Timeout);
            }
        }
    }

    /// When to call [`handle_timeout`](Self::handle_timeout), if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
    }

    /// Bytes to write to the socket, if any.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        (!self.out.is_empty()).then(|| std::mem::take(&mut self.out))
    }

    /// The next thing that happened.
    pub fn poll_event(&mut self) -> Option<ServerEvent> {
        self.events.pop_front()
    }

    /// Accepts the service request reported by [`ServerEvent::Open`].
    pub fn accept(&mut self, now: Instant, cookie: Cookie) {
        if self.state == ServerState::AwaitDecision {
            self.send(&Message::Accept { cookie });
            self.state = ServerState::Established;
            // Frames that arrived while deciding.
            self.handle_input(now, &[]);
        }
    }

    /// Attaches the data connection reported by [`ServerEvent::DataHello`].
    pub fn attach(&mut self) {
        if self.state == ServerState::DataPending {
            self.send(&Message::DataAck);
            self.state = ServerState::DataAttached;
        }
    }

    /// Refuses an `Open` or `DataHello` (or ends an established session)
    /// with a reason the client will show.
    pub fn reject(&mut self, code: ErrorCode, reason: &str) {
        if self.state != ServerState::Closed {
            self.send(&Message::Reject {
                code,
                reason: reason.into(),
            });
            self.state = ServerState::Closed;
            self.deadline = None;
        }
    }

    /// Queues one service message.
    pub fn send_payload(&mut self, data: &[u8]) -> Result<(), ConnError> {
        if self.state != ServerState::Established {
            return Err(ConnError::NotEstablished);
        }
        Message::Payload(data.to_vec())
            .encode(&mut self.out)
            .map_err(|_| ConnError::PayloadTooLarge(data.len()))
    }

    /// Ends the session with a `Close`.
    pub fn close(&mut self, reason: &str) {
        if self.state != ServerState::Closed {
            self.send(&Message::Close {
                reason: reason.into(),
            });
            self.state = ServerState::Closed;
            self.deadline = None;
        }
    }

    /// True once the service request was accepted and the session not closed.
    pub fn is_established(&self) -> bool {
        self.state == ServerState::Established
    }

    /// True once closed, for whatever reason.
    pub fn is_closed(&self) -> bool {
        self.state == ServerState::Closed
    }

    /// Bytes received after the last complete frame.
    pub fn take_buffered(&mut self) -> Vec<u8> {
        self.decoder.take_buffered()
    }

    /// The most bytes to read next without reading past the frame being
    /// received ([`FrameDecoder::wanted`]): a data connection's client may
    /// send the service's bytes right behind its `DataHello`, and they must
    /// stay in the socket for the service.
    pub fn read_limit(&self) -> usize {
        self.decoder.wanted()
    }

    fn on_message(&mut self, now: Instant, msg: Message) {
        match (self.state, msg) {
            (ServerState::Established, Message::Payload(p)) => {
                self.events.push_back(ServerEvent::Payload(p));
            }
            (_, Message::Close { reason }) => self.fail_quiet(ConnError::Closed(reason)),
            (
                ServerState::AwaitHello,
                Message::ClientHello {
                    version_min,
                    version_max,
                    nonce,
                },
            ) => {
                if !(version_min..=version_max).contains(&VERSION) {
                    let err = ConnError::BadVersion {
                        ours: VERSION,
                        min: version_min,
                        max: version_max,
                    };
                    return self.fail(err, ErrorCode::BadVersion);
                }
                self.send(&Message::ServerHello {
                    version: VERSION,
                    auth_required: self.key.is_some(),
                    nonce: self.nonce,
                });
                self.client_nonce = nonce;
                self.state = match self.key {
                    Some(_) => ServerState::AwaitAuth {
                        client_nonce: nonce,
                    },
                    None => ServerState::AwaitOpen,
                };
            }
            (
                ServerState::AwaitHello,
                Message::DataHello {
                    version,
                    cookie,
                    tag,
                },
            ) => {
                if version != VERSION {
                    let err = ConnError::BadVersion {
                        ours: VERSION,
                        min: version,
                        max: version,
                    };
                    return self.fail(err, ErrorCode::BadVersion);
                }
                self.state = ServerState::DataPending;
                self.deadline = None;
                self.events
                    .push_back(ServerEvent::DataHello { cookie, tag });
            }
            (ServerState::AwaitAuth { client_nonce }, Message::ClientAuth { mac }) => {
                let ok = self
                    .key
                    .as_ref()
                    .is_some_and(|k| k.verify_client(&self.nonce, &client_nonce, &mac));
                if !ok {
                    return self.fail(ConnError::AuthFailed, ErrorCode::AuthFailed);
                }
                if let Some(k) = &self.key {
                    let mac = k.server_proof(&client_nonce, &self.nonce);
                    self.send(&Message::ServerAuth { mac });
                }
                self.state = ServerState::AwaitOpen;
            }
            (ServerState::AwaitAuth { .. }, Message::TicketAuth { ticket, mac })
            | (ServerState::AwaitOpen, Message::TicketAuth { ticket, mac })
                if self.key.is_none() || matches!(self.state, ServerState::AwaitAuth { .. }) =>
            {
                let key = self.tickets.as_ref().and_then(|t| t.key(&ticket, now));
                let ok = key
                    .as_ref()
                    .is_some_and(|k| k.verify_client(&self.nonce, &self.client_nonce, &mac));
                let Some(key) = key.filter(|_| ok) else {
                    return self.fail(ConnError::TicketRefused, ErrorCode::AuthFailed);
                };
                let mac = key.server_proof(&self.client_nonce, &self.nonce);
                self.send(&Message::ServerAuth { mac });
                self.state = ServerState::AwaitTicketOpen { ticket };
            }
            (ServerState::AwaitTicketOpen { ticket }, Message::Open { service, params }) => {
                let grant = self
                    .tickets
                    .as_ref()
                    .and_then(|t| t.redeem(&ticket, &service, now));
                let Some(grant) = grant else {
                    return self.fail(ConnError::TicketRefused, ErrorCode::AuthFailed);
                };
                self.state = ServerState::AwaitDecision;
                self.deadline = None;
                self.events.push_back(ServerEvent::Open {
                    service,
                    params,
                    authenticated: false,
                    ticket: Some(grant),
                });
            }
            (ServerState::AwaitAuth { .. }, Message::Open { service, params }) => {
                if !self.keyless_services.contains(&service) {
                    return self.fail(ConnError::AuthRequired, ErrorCode::AuthRequired);
                }
                self.state = ServerState::AwaitDecision;
                self.deadline = None;
                self.events.push_back(ServerEvent::Open {
                    service,
                    params,
                    authenticated: false,
                    ticket: None,
                });
            }
            (ServerState::AwaitOpen, Message::Open { service, params }) => {
                self.state = ServerState::AwaitDecision;
                self.deadline = None;
                self.events.push_back(ServerEvent::Open {
                    service,
                    params,
                    authenticated: true,
                    ticket: None,
                });
            }
            (state, msg) => {
                let err = ConnError::Unexpected {
                    got: msg_name(&msg),
                    state: server_state_name(state),
                };
                self.fail(err, ErrorCode::Protocol);
            }
        }
    }

    fn send(&mut self, msg: &Message) {
        // Handshake messages are far below the frame cap.
        let _ = msg.encode(&mut self.out);
    }

    fn fail(&mut self, err: ConnError, code: ErrorCode) {
        self.send(&Message::Reject {
            code,
            reason: err.to_string(),
        });
        self.fail_quiet(err);
    }

    fn fail_quiet(&mut self, err: ConnError) {
        self.state = ServerState::Closed;
        self.deadline = None;
        self.events.push_back(ServerEvent::Closed(err));
    }
}

fn msg_name(m: &Message) -> &'static str {
    match m {
        Message::ClientHello { .. } => "ClientHello",
        Message::ServerHello { .. } => "ServerHello",
        Message::ClientAuth { .. } => "ClientAuth",
        Message::ServerAuth { .. } => "ServerAuth",
        Message::TicketAuth { .. } => "TicketAuth",
        Message::Open { .. } => "Open",
        Message::Accept { .. } => "Accept",
        Message::Reject { .. } => "Reject",
        Message::DataHello { .. } => "DataHello",
        Message::DataAck => "DataAck",
        Message::Payload(_) => "Payload",
        Message::Close { .. } => "Close",
    }
}

fn client_state_name(s: ClientState) -> &'static str {
    match s {
        ClientState::AwaitServerHello => "waiting for ServerHello",
        ClientState::AwaitServerAuth { .. } => "waiting for ServerAuth",
        ClientState::AwaitAccept => "waiting for Accept",
        ClientState::Established => "established",
        ClientState::Closed => "closed",
    }
}

fn server_state_name(s: ServerState) -> &'static str {
    match s {
        ServerState::AwaitHello => "waiting for a hello",
        ServerState::AwaitAuth { .. } => "waiting for ClientAuth",
        ServerState::AwaitOpen => "waiting for Open",
        ServerState::AwaitTicketOpen { .. } => "waiting for Open after a ticket",
        ServerState::AwaitDecision => "deciding on Open",
        ServerState::Established => "established",
        ServerState::DataPending => "attaching a data connection",
        ServerState::DataAttached => "attached",
        ServerState::Closed => "closed",
    }
}
