//! The TLS 1.3 handshake of an encrypted connection, over a blocking
//! `TcpStream`, and the rustls configurations both ends use.
//!
//! The client trusts exactly the certificate derived from the pre-shared
//! key ([`crate::keys`]); the handshake signature over it is checked by
//! rustls's own TLS 1.3 verification. Only TLS 1.3, only the ring
//! provider's AEAD suites (AES-128-GCM first: the fastest with AES-NI), no
//! resumption and no session tickets (every connection is a full handshake
//! with fresh ECDHE keys). The handshake reads whole TLS records only, one
//! at a time, so nothing after the handshake is left inside rustls when the
//! secrets are taken for [`crate::record`].

use std::io::{self, Read};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{ring as provider, CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, ClientConnection, Connection, DigitallySignedStruct,
    ServerConfig, ServerConnection, SignatureScheme,
};

use crate::keys::{Identity, SERVER_NAME};
use crate::record::{Opener, RecordError, Sealer, HEADER, MAX_CIPHERTEXT};
use crate::stream::{Encryption, Stream};

/// Why an encrypted connection could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The server's certificate is not the one the pre-shared key gives:
    /// the server holds another key (or is not who it claims).
    #[error("the server does not hold this pre-shared key (its TLS identity does not match)")]
    WrongServerKey,
    /// The peer refused the handshake with an alert (a client that refuses
    /// our certificate holds another key).
    #[error("the peer refused the TLS handshake: {0}")]
    PeerAlert(String),
    /// Any other TLS failure.
    #[error("TLS handshake failed: {0}")]
    Tls(rustls::Error),
    /// The handshake did not finish in time.
    #[error("the TLS handshake did not finish in time")]
    Timeout,
    /// The connection failed during the handshake.
    #[error("TLS handshake: {0}")]
    Io(#[from] io::Error),
    /// The key could not be turned into a TLS identity.
    #[error("TLS identity: {0}")]
    Identity(String),
    /// The negotiated keys cannot run the record layer.
    #[error("TLS: {0}")]
    Record(#[from] RecordError),
}

/// The client's TLS setup for one pre-shared key (or one-time ticket),
/// and the server name its `ClientHello` sends; cheap to clone.
#[derive(Clone)]
pub struct ClientTls(Arc<ClientConfig>, ServerName<'static>);

/// The server's TLS setup for one pre-shared key; cheap to clone.
#[derive(Clone)]
pub struct ServerTls(Arc<ServerConfig>);

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls")
    }
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerTls")
    }
}

impl ClientTls {
    /// A client that accepts only the server identity of `psk`.
    pub fn new(psk: &[u8]) -> Result<ClientTls, TlsError> {
        ClientTls::with_name(psk, SERVER_NAME)
    }

    /// A client of the session a one-time ticket opens: it accepts only
    /// the identity derived from the ticket, and names the ticket's id in
    /// its `ClientHello` (SNI) so that the server finds the key
    /// ([`crate::ticket`]).
    pub fn ticket(id: &[u8; 16], key: &[u8]) -> Result<ClientTls, TlsError> {
        ClientTls::with_name(
            &crate::ticket::material(id, key),
            &crate::ticket::server_name(id),
        )
    }

    fn with_name(psk: &[u8], name: &str) -> Result<ClientTls, TlsError> {
        let name = ServerName::try_from(name.to_string())
            .map_err(|e| TlsError::Identity(e.to_string()))?;
        let identity = Identity::derive(psk)?;
        let provider = Arc::new(fatpipe_provider());
        let verifier = Arc::new(PskVerifier {
            cert: identity.cert,
            algs: provider.signature_verification_algorithms,
        });
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(TlsError::Tls)?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        config.enable_secret_extraction = true;
        config.resumption = rustls::client::Resumption::disabled();
        Ok(ClientTls(Arc::new(config), name))
    }

    /// The server name the `ClientHello` sends (SNI).
    pub fn server_name(&self) -> ServerName<'static> {
        self.1.clone()
    }
}

impl ServerTls {
    /// A server presenting the identity of `psk`.
    pub fn new(psk: &[u8]) -> Result<ServerTls, TlsError> {
        ServerTls::derived(psk)
    }

    /// A server presenting the identity of one-time ticket `id` (key
    /// `key`): what [`ClientTls::ticket`] accepts.
    pub fn ticket(id: &[u8; 16], key: &[u8]) -> Result<ServerTls, TlsError> {
        ServerTls::derived(&crate::ticket::material(id, key))
    }

    fn derived(psk: &[u8]) -> Result<ServerTls, TlsError> {
        let identity = Identity::derive(psk)?;
        let mut config = ServerConfig::builder_with_provider(Arc::new(fatpipe_provider()))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(TlsError::Tls)?
            .with_no_client_auth()
            .with_single_cert(vec![identity.cert.clone()], identity.private_key())
            .map_err(TlsError::Tls)?;
        config.enable_secret_extraction = true;
        config.send_tls13_tickets = 0;
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        Ok(ServerTls(Arc::new(config)))
    }

    /// The rustls configuration (for tests that run rustls's own stream).
    pub fn config(&self) -> Arc<ServerConfig> {
        Arc::clone(&self.0)
    }
}

impl ClientTls {
    /// The rustls configuration (for tests that run rustls's own stream).
    pub fn config(&self) -> Arc<ClientConfig> {
        Arc::clone(&self.0)
    }
}

/// True if `first` (a connection's first byte) starts a TLS handshake
/// record (content type 22). A fatpipe frame starts with the high byte of
/// its length, which is 0 (frames are at most 64 KiB).
pub fn is_tls_start(first: u8) -> bool {
    first == 0x16
}

/// Runs the client's handshake on a connected socket, within `timeout`.
pub fn client_handshake(
    tls: &ClientTls,
    tcp: TcpStream,
    timeout: Duration,
) -> Result<Stream, TlsError> {
    let conn = ClientConnection::new(tls.config(), tls.server_name()).map_err(TlsError::Tls)?;
    finish(Connection::Client(conn), tcp, Instant::now() + timeout)
}

/// Runs the server's handshake on an accepted socket, by `deadline`.
pub fn server_handshake(
    tls: &ServerTls,
    tcp: TcpStream,
    deadline: Instant,
) -> Result<Stream, TlsError> {
    let conn = ServerConnection::new(tls.config()).map_err(TlsError::Tls)?;
    finish(Connection::Server(conn), tcp, deadline)
}

/// The ring provider with AES-128-GCM first.
fn fatpipe_provider() -> CryptoProvider {
    let mut p = provider::default_provider();
    p.cipher_suites = vec![
        provider::cipher_suite::TLS13_AES_128_GCM_SHA256,
        provider::cipher_suite::TLS13_AES_256_GCM_SHA384,
        provider::cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    ];
    p
}

/// Drives the handshake to its end, then moves the traffic keys into a
/// [`Stream`].
pub(crate) fn finish(
    mut conn: Connection,
    mut tcp: TcpStream,
    deadline: Instant,
) -> Result<Stream, TlsError> {
    let mut record = Vec::with_capacity(HEADER + MAX_CIPHERTEXT);
    loop {
        while conn.wants_write() {
            set_deadline(&tcp, deadline, false)?;
            conn.write_tls(&mut tcp).map_err(timeout_or)?;
        }
        if !conn.is_handshaking() {
            break;
        }
        read_record(&mut tcp, &mut record, deadline)?;
        conn.read_tls(&mut record.as_slice())?;
        if let Err(e) = conn.process_new_packets() {
            // Tell the peer why (an alert), then report.
            while conn.wants_write() {
                if conn.write_tls(&mut tcp).is_err() {
                    break;
                }
            }
            return Err(classify(e));
        }
    }
    into_stream(conn, tcp)
}

/// Moves a finished handshake's traffic keys into a [`Stream`] on `tcp`,
/// whose read and write timeouts are cleared.
fn into_stream(conn: Connection, tcp: TcpStream) -> Result<Stream, TlsError> {
    let suite = conn
        .negotiated_cipher_suite()
        .and_then(|s| s.suite().as_str())
        .unwrap_or("unknown");
    let secrets = conn.dangerous_extract_secrets().map_err(TlsError::Tls)?;
    let sealer = Sealer::new(&secrets.tx.1, secrets.tx.0)?;
    let opener = Opener::new(&secrets.rx.1, secrets.rx.0)?;
    let _ = tcp.set_read_timeout(None);
    let _ = tcp.set_write_timeout(None);
    Ok(Stream::tls(
        tcp,
        sealer,
        opener,
        Encryption {
            protocol: "TLS 1.3",
            suite,
        },
    ))
}

/// What a non-blocking handshake waits for before it can go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// The socket to be readable.
    Read,
    /// The socket to be writable.
    Write,
    /// Nothing: the handshake is over ([`Handshake::into_stream`]).
    Done,
    /// The server's identity: the `ClientHello` is in
    /// ([`Handshake::accept`], then [`Handshake::choose`]).
    Identity,
}

/// A TLS handshake on a non-blocking socket, for a caller that drives
/// many at once on one thread (the engine's dialer and its server's
/// pre-authentication driver): call [`advance`](Self::advance) whenever
/// the socket is ready for what it last wanted, then
/// [`into_stream`](Self::into_stream). It ends in the same [`Stream`] as
/// [`client_handshake`] and [`server_handshake`] and, like them, reads
/// whole records one at a time, so nothing after the handshake is left
/// inside rustls. The caller keeps the time limit (its error is
/// [`TlsError::Timeout`]).
pub struct Handshake {
    phase: Phase,
    /// The record being read: `record[..have]` has arrived.
    record: Vec<u8>,
    have: usize,
}

/// Where a [`Handshake`] is.
enum Phase {
    /// A server reading the `ClientHello` before it chooses its identity
    /// ([`Handshake::accept`]).
    Accepting(Box<rustls::server::Acceptor>),
    /// The `ClientHello` is in: [`Handshake::choose`] is next.
    Accepted(Box<rustls::server::Accepted>),
    /// Between the two, and after a failed choice.
    Gone,
    /// Running, with its identity.
    Running(Box<Connection>),
}

impl std::fmt::Debug for Handshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Handshake")
    }
}

impl Handshake {
    /// The client's handshake, trusting the server identity of `tls`;
    /// nothing is sent before the first [`advance`](Self::advance).
    pub fn client(tls: &ClientTls) -> Result<Handshake, TlsError> {
        let conn = ClientConnection::new(tls.config(), tls.server_name()).map_err(TlsError::Tls)?;
        Ok(Handshake::of(Phase::Running(Box::new(Connection::Client(
            conn,
        )))))
    }

    /// The server's handshake, presenting the identity of `tls`.
    pub fn server(tls: &ServerTls) -> Result<Handshake, TlsError> {
        let conn = ServerConnection::new(tls.config()).map_err(TlsError::Tls)?;
        Ok(Handshake::of(Phase::Running(Box::new(Connection::Server(
            conn,
        )))))
    }

    /// The server's handshake when its identity depends on the server
    /// name the client asks for (a one-time ticket's, [`crate::ticket`]):
    /// [`advance`](Self::advance) says [`Want::Identity`] once the
    /// `ClientHello` is in; then [`server_name`](Self::server_name) and
    /// [`choose`](Self::choose), and on.
    pub fn accept() -> Handshake {
        Handshake::of(Phase::Accepting(Box::default()))
    }

    /// The server name (SNI) of the `ClientHello`, once
    /// [`advance`](Self::advance) said [`Want::Identity`].
    pub fn server_name(&self) -> Option<String> {
        match &self.phase {
            Phase::Accepted(a) => a.client_hello().server_name().map(str::to_string),
            _ => None,
        }
    }

    /// Goes on with the identity of `tls` after [`Want::Identity`]; a
    /// refusal's alert is written to `io`.
    pub fn choose(&mut self, tls: &ServerTls, mut io: impl io::Write) -> Result<(), TlsError> {
        let Phase::Accepted(a) = std::mem::replace(&mut self.phase, Phase::Gone) else {
            return Err(TlsError::Tls(rustls::Error::General(
                "no ClientHello to answer".into(),
            )));
        };
        match a.into_connection(tls.config()) {
            Ok(c) => {
                self.phase = Phase::Running(Box::new(Connection::Server(c)));
                Ok(())
            }
            Err((e, mut alert)) => {
                let _ = alert.write_all(&mut io);
                Err(classify(e))
            }
        }
    }

    fn of(phase: Phase) -> Handshake {
        Handshake {
            phase,
            record: vec![0; HEADER],
            have: 0,
        }
    }

    /// Goes as far as `io` (a non-blocking socket) lets it: writes what
    /// rustls has to send, reads and processes whole records, and says
    /// what it waits for next. An error ends the handshake (an alert
    /// telling the peer why has been tried).
    pub fn advance(&mut self, mut io: impl Read + io::Write) -> Result<Want, TlsError> {
        loop {
            match &mut self.phase {
                Phase::Running(conn) => {
                    while conn.wants_write() {
                        match conn.write_tls(&mut io) {
                            Ok(_) => {}
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                return Ok(Want::Write)
                            }
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => return Err(TlsError::Io(e)),
                        }
                    }
                    if !conn.is_handshaking() {
                        return Ok(Want::Done);
                    }
                }
                Phase::Accepting(_) => {}
                Phase::Accepted(_) => return Ok(Want::Identity),
                Phase::Gone => {
                    return Err(TlsError::Tls(rustls::Error::General(
                        "the handshake was refused".into(),
                    )))
                }
            }
            let need = if self.have < HEADER {
                HEADER
            } else {
                self.record.len()
            };
            match io.read(&mut self.record[self.have..need]) {
                Ok(0) => {
                    return Err(TlsError::Io(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the peer closed the connection during the TLS handshake",
                    )))
                }
                Ok(n) => self.have += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Want::Read),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(TlsError::Io(e)),
            }
            if self.have == HEADER && self.record.len() == HEADER {
                let len = usize::from(u16::from_be_bytes([self.record[3], self.record[4]]));
                if len > MAX_CIPHERTEXT {
                    return Err(RecordError::Oversized(len).into());
                }
                self.record.resize(HEADER + len, 0);
            }
            if self.have < HEADER || self.have < self.record.len() {
                continue;
            }
            // A whole record: rustls takes all of it.
            let record = std::mem::take(&mut self.record);
            let taken = self.take_record(&record, &mut io);
            self.record = record;
            self.record.truncate(HEADER);
            self.have = 0;
            taken?;
        }
    }

    /// Hands one whole record to rustls (or to the acceptor).
    fn take_record(&mut self, record: &[u8], io: &mut impl io::Write) -> Result<(), TlsError> {
        match &mut self.phase {
            Phase::Running(conn) => {
                conn.read_tls(&mut &record[..])?;
                if let Err(e) = conn.process_new_packets() {
                    while conn.wants_write() {
                        if conn.write_tls(io).is_err() {
                            break;
                        }
                    }
                    return Err(classify(e));
                }
                Ok(())
            }
            Phase::Accepting(acceptor) => {
                acceptor.read_tls(&mut &record[..])?;
                match acceptor.accept() {
                    Ok(Some(a)) => {
                        self.phase = Phase::Accepted(Box::new(a));
                        Ok(())
                    }
                    Ok(None) => Ok(()),
                    Err((e, mut alert)) => {
                        let _ = alert.write_all(io);
                        self.phase = Phase::Gone;
                        Err(classify(e))
                    }
                }
            }
            Phase::Accepted(_) | Phase::Gone => Ok(()),
        }
    }

    /// The encrypted stream on `tcp` once [`advance`](Self::advance) said
    /// [`Want::Done`] (an error before). `tcp` keeps its blocking mode;
    /// its timeouts are cleared.
    pub fn into_stream(self, tcp: TcpStream) -> Result<Stream, TlsError> {
        match self.phase {
            Phase::Running(conn) if !conn.is_handshaking() && !conn.wants_write() => {
                into_stream(*conn, tcp)
            }
            _ => Err(TlsError::Tls(rustls::Error::General(
                "the handshake is not over".into(),
            ))),
        }
    }
}

/// Reads exactly one TLS record (header and body) into `out`.
pub(crate) fn read_record(
    tcp: &mut TcpStream,
    out: &mut Vec<u8>,
    deadline: Instant,
) -> Result<(), TlsError> {
    out.clear();
    out.resize(HEADER, 0);
    read_exact_by(tcp, &mut out[..], deadline)?;
    let len = usize::from(u16::from_be_bytes([out[3], out[4]]));
    if len > MAX_CIPHERTEXT {
        return Err(RecordError::Oversized(len).into());
    }
    out.resize(HEADER + len, 0);
    read_exact_by(tcp, &mut out[HEADER..], deadline)
}

fn read_exact_by(
    tcp: &mut TcpStream,
    mut buf: &mut [u8],
    deadline: Instant,
) -> Result<(), TlsError> {
    while !buf.is_empty() {
        set_deadline(tcp, deadline, true)?;
        match tcp.read(buf) {
            Ok(0) => {
                return Err(TlsError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection during the TLS handshake",
                )))
            }
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(timeout_or(e)),
        }
    }
    Ok(())
}

/// Sets the read or write timeout to what is left before `deadline`.
fn set_deadline(tcp: &TcpStream, deadline: Instant, read: bool) -> Result<(), TlsError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(TlsError::Timeout);
    }
    if read {
        tcp.set_read_timeout(Some(left))?;
    } else {
        tcp.set_write_timeout(Some(left))?;
    }
    Ok(())
}

fn timeout_or(e: io::Error) -> TlsError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => TlsError::Timeout,
        _ => TlsError::Io(e),
    }
}

pub(crate) fn classify(e: rustls::Error) -> TlsError {
    match e {
        rustls::Error::InvalidCertificate(_) => TlsError::WrongServerKey,
        rustls::Error::AlertReceived(a) => TlsError::PeerAlert(format!("{a:?}")),
        e => TlsError::Tls(e),
    }
}

/// Accepts exactly the certificate derived from the pre-shared key.
#[derive(Debug)]
struct PskVerifier {
    cert: CertificateDer<'static>,
    algs: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for PskVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if intermediates.is_empty() && end_entity.as_ref() == self.cert.as_ref() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // The configs offer TLS 1.3 only.
        Err(rustls::Error::General("TLS 1.2 is not offered".into()))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;
    use std::thread;

    const KEY: &[u8] = b"a pre-shared key for tests";

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 13 + i / 509) as u8).collect()
    }

    #[test]
    fn handshake_then_data_both_ways_on_split_halves() {
        let (c, s) = pair();
        let server_tls = ServerTls::new(KEY).unwrap();
        let server = thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(10);
            let stream = server_handshake(&server_tls, s, deadline).unwrap();
            // Echo on two threads: one reads, the other writes.
            let reader = stream.try_clone().unwrap();
            let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
            let t = thread::spawn(move || {
                let mut buf = vec![0u8; 50_000];
                loop {
                    let n = (&reader).read(&mut buf).unwrap();
                    if n == 0 {
                        break;
                    }
                    tx.send(buf[..n].to_vec()).unwrap();
                }
            });
            for piece in rx {
                (&stream).write_all(&piece).unwrap();
            }
            t.join().unwrap();
            stream.shutdown(std::net::Shutdown::Write).unwrap();
        });
        let client = ClientTls::new(KEY).unwrap();
        let stream = client_handshake(&client, c, Duration::from_secs(10)).unwrap();
        let enc = stream.encryption().unwrap();
        assert_eq!(enc.protocol, "TLS 1.3");
        assert_eq!(enc.suite, "TLS13_AES_128_GCM_SHA256");
        assert!(stream.plain().is_none());
        let msg = data(1_000_003);
        let writer = stream.try_clone().unwrap();
        let sent = msg.clone();
        let w = thread::spawn(move || {
            (&writer).write_all(&sent).unwrap();
            writer.shutdown(std::net::Shutdown::Write).unwrap();
        });
        let mut got = Vec::new();
        (&stream).read_to_end(&mut got).unwrap();
        w.join().unwrap();
        server.join().unwrap();
        assert_eq!(got, msg);
    }

    #[test]
    fn close_write_on_a_non_blocking_socket_never_cuts_a_record() {
        // A runner task writes without blocking: the socket fills, a
        // write leaves sealed bytes behind, and the end must wait for
        // them (shutdown(Write) would cut the record: the peer's read
        // fails as truncated).
        let (c, s) = pair();
        let server_tls = ServerTls::new(KEY).unwrap();
        let server = thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(10);
            server_handshake(&server_tls, s, deadline).unwrap()
        });
        let client = ClientTls::new(KEY).unwrap();
        let stream = client_handshake(&client, c, Duration::from_secs(10)).unwrap();
        let server = server.join().unwrap();
        stream.tcp().set_nonblocking(true).unwrap();
        let msg = data(1 << 20);
        let mut sent = 0;
        let mut blocked = false;
        // Fill the socket (the server does not read yet).
        while sent < 64 << 20 && !blocked {
            match (&stream).write(&msg) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => blocked = true,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(blocked, "the socket never filled");
        assert_eq!(
            stream.close_write().map_err(|e| e.kind()),
            Err(io::ErrorKind::WouldBlock)
        );
        assert!((&stream).write(&msg).is_err(), "a write after close_write");
        let reader = thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 16];
            let mut got = 0usize;
            loop {
                match (&server).read(&mut buf) {
                    Ok(0) => return Ok(got),
                    Ok(n) => got += n,
                    Err(e) => return Err(e),
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match stream.close_write() {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    assert!(Instant::now() < deadline, "close_write never finished");
                    thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("{e}"),
            }
        }
        let got = reader.join().unwrap().expect("the reader saw a clean end");
        assert_eq!(got, sent);
    }

    /// Drives a non-blocking client handshake on `c` to its end (or error).
    fn drive(hs: &mut Handshake, c: &TcpStream) -> Result<Vec<Want>, TlsError> {
        c.set_nonblocking(true).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut wants = Vec::new();
        loop {
            let w = hs.advance(c)?;
            wants.push(w);
            if w == Want::Done {
                return Ok(wants);
            }
            assert!(Instant::now() < deadline, "the handshake never finished");
            thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_non_blocking_handshake_ends_in_the_same_stream() {
        let (c, s) = pair();
        let server_tls = ServerTls::new(KEY).unwrap();
        let server = thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut s = server_handshake(&server_tls, s, deadline).unwrap();
            let mut got = vec![0u8; 5];
            s.read_exact(&mut got).unwrap();
            s.write_all(b"world").unwrap();
            got
        });
        let mut hs = Handshake::client(&ClientTls::new(KEY).unwrap()).unwrap();
        // Not over yet: no stream.
        let early = Handshake::client(&ClientTls::new(KEY).unwrap()).unwrap();
        assert!(early.into_stream(c.try_clone().unwrap()).is_err());
        let wants = drive(&mut hs, &c).unwrap();
        // It waited for the server's flight at least once.
        assert!(wants.contains(&Want::Read), "{wants:?}");
        c.set_nonblocking(false).unwrap();
        let mut stream = hs.into_stream(c).unwrap();
        assert_eq!(stream.encryption().map(|e| e.protocol), Some("TLS 1.3"));
        stream.write_all(b"hello").unwrap();
        let mut back = [0u8; 5];
        stream.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"world");
        assert_eq!(server.join().unwrap(), b"hello");
    }

    #[test]
    fn a_non_blocking_server_handshake_ends_in_the_same_stream() {
        let (c, s) = pair();
        let client = thread::spawn(move || {
            let tls = ClientTls::new(KEY).unwrap();
            let mut c = client_handshake(&tls, c, Duration::from_secs(10)).unwrap();
            c.write_all(b"hello").unwrap();
            let mut got = vec![0u8; 5];
            c.read_exact(&mut got).unwrap();
            got
        });
        let mut hs = Handshake::server(&ServerTls::new(KEY).unwrap()).unwrap();
        drive(&mut hs, &s).unwrap();
        s.set_nonblocking(false).unwrap();
        let mut stream = hs.into_stream(s).unwrap();
        let mut got = [0u8; 5];
        stream.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello");
        stream.write_all(b"world").unwrap();
        assert_eq!(client.join().unwrap(), b"world");
    }

    /// Drives a non-blocking accepting server handshake on `s`, choosing
    /// the identity with `choose` from the name the client asked for.
    fn drive_accept(
        s: &TcpStream,
        choose: impl Fn(Option<&str>) -> ServerTls,
    ) -> Result<(Handshake, Option<String>), TlsError> {
        s.set_nonblocking(true).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut hs = Handshake::accept();
        let mut named = None;
        loop {
            match hs.advance(s)? {
                Want::Done => return Ok((hs, named)),
                Want::Identity => {
                    named = hs.server_name();
                    hs.choose(&choose(named.as_deref()), s)?;
                }
                Want::Read | Want::Write => {
                    assert!(Instant::now() < deadline, "the handshake never finished");
                    thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }

    #[test]
    fn a_non_blocking_server_chooses_its_identity_by_the_name_asked_for() {
        const ID: [u8; 16] = [9; 16];
        const TICKET_KEY: [u8; 32] = [3; 32];
        let (c, s) = pair();
        let client = thread::spawn(move || {
            let tls = ClientTls::ticket(&ID, &TICKET_KEY).unwrap();
            let mut c = client_handshake(&tls, c, Duration::from_secs(10)).unwrap();
            c.write_all(b"hello").unwrap();
            let mut got = vec![0u8; 5];
            c.read_exact(&mut got).unwrap();
            got
        });
        let (hs, named) = drive_accept(&s, |name| {
            let id = name.and_then(crate::ticket::parse_name).unwrap();
            ServerTls::ticket(&id, &TICKET_KEY).unwrap()
        })
        .unwrap();
        assert_eq!(named, Some(crate::ticket::server_name(&ID)));
        s.set_nonblocking(false).unwrap();
        let mut stream = hs.into_stream(s).unwrap();
        let mut got = [0u8; 5];
        stream.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello");
        stream.write_all(b"world").unwrap();
        assert_eq!(client.join().unwrap(), b"world");

        // The pre-shared key's client names no ticket; an identity of
        // another key is refused by the client.
        let (c, s) = pair();
        let client = thread::spawn(move || {
            client_handshake(&ClientTls::new(KEY).unwrap(), c, Duration::from_secs(10)).map(|_| ())
        });
        let r = drive_accept(&s, |name| {
            assert!(
                name.and_then(crate::ticket::parse_name).is_none(),
                "{name:?}"
            );
            ServerTls::new(b"another key").unwrap()
        });
        assert!(r.is_err());
        let err = client.join().unwrap().unwrap_err();
        assert!(matches!(err, TlsError::WrongServerKey), "{err}");
    }

    #[test]
    fn a_non_blocking_handshake_refuses_another_key_and_a_closed_peer() {
        let (c, s) = pair();
        let server_tls = ServerTls::new(b"the server's other key").unwrap();
        let server = thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(10);
            server_handshake(&server_tls, s, deadline).map(|_| ())
        });
        let mut hs = Handshake::client(&ClientTls::new(KEY).unwrap()).unwrap();
        let err = drive(&mut hs, &c).unwrap_err();
        assert!(matches!(err, TlsError::WrongServerKey), "{err}");
        let server_err = server.join().unwrap().unwrap_err();
        assert!(matches!(server_err, TlsError::PeerAlert(_)), "{server_err}");

        let (c, s) = pair();
        drop(s);
        let mut hs = Handshake::client(&ClientTls::new(KEY).unwrap()).unwrap();
        let err = drive(&mut hs, &c).unwrap_err();
        assert!(matches!(err, TlsError::Io(_)), "{err}");
    }

    #[test]
    fn a_server_with_another_key_is_refused_and_says_so() {
        let (c, s) = pair();
        let server_tls = ServerTls::new(b"the server's other key").unwrap();
        let server = thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(10);
            server_handshake(&server_tls, s, deadline).map(|_| ())
        });
        let client = ClientTls::new(KEY).unwrap();
        let err = client_handshake(&client, c, Duration::from_secs(10)).unwrap_err();
        assert!(matches!(err, TlsError::WrongServerKey), "{err}");
        assert!(err.to_string().contains("pre-shared key"));
        // The server hears the client's refusal as an alert.
        let server_err = server.join().unwrap().unwrap_err();
        assert!(matches!(server_err, TlsError::PeerAlert(_)), "{server_err}");
    }

    #[test]
    fn the_verifier_accepts_only_the_derived_certificate() {
        let provider = fatpipe_provider();
        let mine = Identity::derive(KEY).unwrap();
        let other = Identity::derive(b"not the same key at all").unwrap();
        let v = PskVerifier {
            cert: mine.cert.clone(),
            algs: provider.signature_verification_algorithms,
        };
        let name = ServerName::try_from(SERVER_NAME).unwrap();
        let now = UnixTime::now();
        assert!(v
            .verify_server_cert(&mine.cert, &[], &name, &[], now)
            .is_ok());
        assert!(v
            .verify_server_cert(&other.cert, &[], &name, &[], now)
            .is_err());
        // The right certificate with a chain behind it is not it either.
        assert!(v
            .verify_server_cert(
                &mine.cert,
                std::slice::from_ref(&other.cert),
                &name,
                &[],
                now
            )
            .is_err());
    }

    /// The record layer is TLS: rustls's own stream on one side, ours on
    /// the other, data both ways, in both roles.
    #[test]
    fn interop_with_rustls_own_record_layer() {
        let msg = data(300_000);
        // rustls server, our client.
        let (c, s) = pair();
        let server_tls = ServerTls::new(KEY).unwrap();
        let expect = msg.clone();
        let server = thread::spawn(move || {
            let conn = ServerConnection::new(server_tls.config()).unwrap();
            let mut tls = rustls::StreamOwned::new(conn, s);
            let mut got = vec![0u8; expect.len()];
            tls.read_exact(&mut got).unwrap();
            assert_eq!(got, expect);
            tls.write_all(b"reply from rustls").unwrap();
            tls.conn.send_close_notify();
            tls.flush().unwrap();
        });
        let client = ClientTls::new(KEY).unwrap();
        let mut ours = client_handshake(&client, c, Duration::from_secs(10)).unwrap();
        ours.write_all(&msg).unwrap();
        let mut reply = Vec::new();
        ours.read_to_end(&mut reply).unwrap();
        assert_eq!(reply, b"reply from rustls");
        server.join().unwrap();

        // rustls client, our server.
        let (c, s) = pair();
        let server_tls = ServerTls::new(KEY).unwrap();
        let expect = msg.clone();
        let server = thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut ours = server_handshake(&server_tls, s, deadline).unwrap();
            let mut got = vec![0u8; expect.len()];
            ours.read_exact(&mut got).unwrap();
            assert_eq!(got, expect);
            ours.write_all(b"reply from ours").unwrap();
            ours.shutdown(std::net::Shutdown::Write).unwrap();
        });
        let name = ServerName::try_from(SERVER_NAME).unwrap().to_owned();
        let conn = ClientConnection::new(client.config(), name).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, c);
        tls.write_all(&msg).unwrap();
        let mut reply = Vec::new();
        tls.read_to_end(&mut reply).unwrap();
        assert_eq!(reply, b"reply from ours");
        server.join().unwrap();
    }

    #[test]
    fn a_silent_peer_times_the_handshake_out() {
        let (_c, s) = pair();
        let server_tls = ServerTls::new(KEY).unwrap();
        let deadline = Instant::now() + Duration::from_millis(200);
        let err = server_handshake(&server_tls, s, deadline).unwrap_err();
        assert!(matches!(err, TlsError::Timeout), "{err}");
    }
}
