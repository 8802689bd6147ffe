//! The client side of a session: connect, authenticate, open a service,
//! and dial data connections that carry the session's cookie.
//!
//! [`connect`] drives the sans-IO [`ClientConn`] over a blocking socket
//! until the server accepts (or refuses) the service; what comes back is a
//! [`ClientSession`] with the same [`Control`] channel the server's service
//! sees, and [`ClientSession::open_data_with`] to dial data streams whose
//! socket options (buffers, MSS, congestion control) are set *before*
//! connecting, when they matter for window scaling.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use fatpipe_proto::{
    ClientConfig, ClientConn, ClientEvent, ConnError, Cookie, Key, Message, VERSION,
};
use fatpipe_secure::tls::ClientTls;
use fatpipe_secure::{Encryption, Stream};
use socket2::{Domain, Protocol, Socket, Type};

use crate::control::{is_timeout, Control};
use crate::error::{EngineError, Result};
use crate::server::random_bytes;

/// How to reach and authenticate to a server.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Pre-shared key (`--key-file`).
    pub key: Option<Key>,
    /// Limit for the TCP connect of control and data connections.
    pub connect_timeout: Duration,
    /// Limit for the handshake after connecting (and for a data hello).
    pub handshake_timeout: Duration,
    /// Encrypt every connection of the session with TLS 1.3 keyed by
    /// `key` (`--encrypt`; needs the key).
    pub encrypt: bool,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            key: None,
            connect_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            encrypt: false,
        }
    }
}

/// An established session on the client side.
#[derive(Debug)]
pub struct ClientSession {
    control: Control,
    pub(crate) cookie: Cookie,
    peer: SocketAddr,
    local: SocketAddr,
    options: ClientOptions,
    tls: Option<ClientTls>,
}

/// Connects to `addr`, authenticates with `key` and opens `service`.
pub fn connect(
    addr: SocketAddr,
    key: Option<&Key>,
    service: &str,
    params: &[u8],
) -> Result<ClientSession> {
    let options = ClientOptions {
        key: key.cloned(),
        ..ClientOptions::default()
    };
    connect_with(addr, &options, service, params)
}

/// [`connect`] with every option.
pub fn connect_with(
    addr: SocketAddr,
    options: &ClientOptions,
    service: &str,
    params: &[u8],
) -> Result<ClientSession> {
    let tls = client_tls(options)?;
    let tcp = TcpStream::connect_timeout(&addr, options.connect_timeout)
        .map_err(|e| EngineError::io(format!("connect to {addr}"), e))?;
    let _ = tcp.set_nodelay(true);
    let mut stream = secure(tcp, tls.as_ref(), options.handshake_timeout)?;
    let _ = stream.set_write_timeout(Some(options.handshake_timeout));
    let local = stream
        .local_addr()
        .map_err(|e| EngineError::io("read local address", e))?;
    let config = ClientConfig {
        key: options.key.clone(),
        service: service.to_string(),
        params: params.to_vec(),
        handshake_timeout: options.handshake_timeout,
    };
    let mut conn = ClientConn::new(config, Instant::now(), random_bytes());
    let mut buf = [0u8; 4096];
    loop {
        while let Some(bytes) = conn.poll_transmit() {
            stream
                .write_all(&bytes)
                .map_err(|e| EngineError::io("write handshake", e))?;
        }
        while let Some(ev) = conn.poll_event() {
            match ev {
                ClientEvent::Established { cookie, .. } => {
                    let _ = stream.set_read_timeout(None);
                    let _ = stream.set_write_timeout(None);
                    // Messages that arrived with the Accept are the service's.
                    let mut early = Vec::new();
                    while let Some(ev) = conn.poll_event() {
                        match ev {
                            ClientEvent::Payload(p) => early.push(Ok(p)),
                            ClientEvent::Closed(e) => early.push(Err(e)),
                            ClientEvent::Established { .. } => {}
                        }
                    }
                    let control = Control::new(stream, &conn.take_buffered(), early)?;
                    return Ok(ClientSession {
                        control,
                        cookie,
                        peer: addr,
                        local,
                        options: options.clone(),
                        tls,
                    });
                }
                ClientEvent::Closed(err) => {
                    while let Some(bytes) = conn.poll_transmit() {
                        let _ = stream.write_all(&bytes);
                    }
                    return Err(err.into());
                }
                ClientEvent::Payload(_) => {}
            }
        }
        let now = Instant::now();
        let wait = match conn.poll_timeout() {
            Some(d) if d <= now => {
                conn.handle_timeout(now);
                continue;
            }
            Some(d) => d - now,
            None => options.handshake_timeout,
        };
        stream
            .set_read_timeout(Some(wait))
            .map_err(|e| EngineError::io("set read timeout", e))?;
        match stream.read(&mut buf) {
            Ok(0) => conn.handle_eof(Instant::now()),
            Ok(n) => conn.handle_input(Instant::now(), &buf[..n]),
            Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {
                conn.handle_timeout(Instant::now())
            }
            Err(e) => return Err(EngineError::io(format!("read from {addr}"), e)),
        }
    }
}

impl ClientSession {
    /// The control channel.
    pub fn control(&self) -> &Control {
        &self.control
    }

    /// The server's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// This end's address on the control connection.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// What encrypts the session's connections (`--encrypt`), if anything.
    pub fn encryption(&self) -> Option<&Encryption> {
        self.control.encryption()
    }

    /// The session's cookie (services that carry it elsewhere, e.g. in UDP
    /// hellos, need it).
    pub fn cookie(&self) -> &Cookie {
        &self.cookie
    }

    /// Dials a data connection labelled `tag`.
    pub fn open_data(&self, tag: u32) -> Result<Stream> {
        self.open_data_with(tag, |_| Ok(()))
    }

    /// Dials a data connection labelled `tag`, letting `configure` set
    /// socket options before the connect. Returns once the server has
    /// attached it to this session.
    pub fn open_data_with(
        &self,
        tag: u32,
        configure: impl FnOnce(&Socket) -> io::Result<()>,
    ) -> Result<Stream> {
        let mut stream = self.dial_data(tag, configure)?;
        read_data_ack(&mut stream)?;
        let _ = stream.set_read_timeout(None);
        let _ = stream.set_write_timeout(None);
        Ok(stream)
    }

    /// Dials data connection `tag` and returns as soon as its hello is
    /// sent, a round trip before [`open_data`](Self::open_data) would: what
    /// the caller writes next travels right behind the hello. For a
    /// connection this end only writes to, on a server that reads the data
    /// hello without reading past it (this crate's [`Server`](crate::Server)
    /// since the copy protocol's version 3; older ones refuse data that
    /// comes before their acknowledgement).
    ///
    /// A thread of its own reads the server's reply. If it is anything but
    /// the acknowledgement, or does not come within the handshake timeout,
    /// the thread shuts the connection down, so the caller's next write
    /// fails rather than sending into a connection nobody reads.
    pub fn open_data_early(&self, tag: u32) -> Result<Stream> {
        let stream = self.dial_data(tag, |_| Ok(()))?;
        let _ = stream.set_write_timeout(None);
        let mut reader = stream
            .try_clone()
            .map_err(|e| EngineError::io("clone data socket", e))?;
        let watch = std::thread::Builder::new()
            .name(format!("data {tag} attach"))
            .spawn(move || {
                if read_data_ack(&mut reader).is_err() {
                    let _ = reader.shutdown(std::net::Shutdown::Both);
                } else {
                    let _ = reader.set_read_timeout(None);
                }
            });
        if let Err(e) = watch {
            return Err(EngineError::io("start the data attach watcher", e));
        }
        Ok(stream)
    }

    /// Connects data connection `tag` and sends its hello; the read and
    /// write timeouts are left at the handshake timeout.
    fn dial_data(
        &self,
        tag: u32,
        configure: impl FnOnce(&Socket) -> io::Result<()>,
    ) -> Result<Stream> {
        let socket = Socket::new(
            Domain::for_address(self.peer),
            Type::STREAM,
            Some(Protocol::TCP),
        )
        .map_err(|e| EngineError::io("create data socket", e))?;
        configure(&socket).map_err(|e| EngineError::io("configure data socket", e))?;
        socket
            .connect_timeout(&self.peer.into(), self.options.connect_timeout)
            .map_err(|e| EngineError::io(format!("connect data stream to {}", self.peer), e))?;
        let tcp: TcpStream = socket.into();
        let mut stream = secure(tcp, self.tls.as_ref(), self.options.handshake_timeout)?;
        let mut hello = Vec::new();
        Message::DataHello {
            version: VERSION,
            cookie: self.cookie,
            tag,
        }
        .encode(&mut hello)?;
        let t = Some(self.options.handshake_timeout);
        let _ = stream.set_read_timeout(t);
        let _ = stream.set_write_timeout(t);
        stream
            .write_all(&hello)
            .map_err(|e| EngineError::io("send data hello", e))?;
        Ok(stream)
    }
}

/// Reads the server's one-frame answer to a data hello: `DataAck`, or the
/// reason it refused. Reads exactly that frame: what follows belongs to the
/// service.
fn read_data_ack(stream: &mut Stream) -> Result<()> {
    let mut header = [0u8; 4];
    read_exact(stream, &mut header)?;
    let len = u32::from_be_bytes(header) as usize;
    if len == 0 || len > fatpipe_proto::MAX_FRAME {
        return Err(fatpipe_proto::DecodeError::TooLarge {
            len,
            max: fatpipe_proto::MAX_FRAME,
        }
        .into());
    }
    let mut body = vec![0u8; len];
    read_exact(stream, &mut body)?;
    match Message::decode(&body)? {
        Message::DataAck => Ok(()),
        Message::Reject { code, reason } => Err(ConnError::Rejected { code, reason }.into()),
        _ => Err(ConnError::Unexpected {
            got: "a message other than DataAck",
            state: "attaching a data connection",
        }
        .into()),
    }
}

fn read_exact(stream: &mut Stream, buf: &mut [u8]) -> Result<()> {
    stream.read_exact(buf).map_err(|e| {
        if is_timeout(&e) {
            EngineError::Timeout("waiting for the data connection to be attached".into())
        } else if e.kind() == io::ErrorKind::UnexpectedEof {
            EngineError::Conn(ConnError::Eof)
        } else {
            EngineError::io("read data hello reply", e)
        }
    })
}

/// The TLS setup `options` ask for: none, or one keyed by the PSK (an
/// error if `--encrypt` came without a key).
fn client_tls(options: &ClientOptions) -> Result<Option<ClientTls>> {
    if !options.encrypt {
        return Ok(None);
    }
    let Some(key) = &options.key else {
        return Err(EngineError::EncryptWithoutKey);
    };
    Ok(Some(ClientTls::new(key.as_bytes())?))
}

/// A connected socket as a [`Stream`]: through the TLS handshake if `tls`.
fn secure(tcp: TcpStream, tls: Option<&ClientTls>, timeout: Duration) -> Result<Stream> {
    match tls {
        None => Ok(Stream::plain_tcp(tcp)),
        Some(tls) => Ok(fatpipe_secure::client_handshake(tls, tcp, timeout)?),
    }
}
