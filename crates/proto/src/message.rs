//! The control messages and their binary encoding.
//!
//! Each frame body is one message: a type byte, then fixed fields in order.
//! [`Message::decode`] rejects unknown types, short bodies, over-long text and
//! trailing bytes, so anything it returns is well-formed. What a message
//! *means* in a given state is the business of the session state machines in
//! [`crate::conn`]; this module only turns bytes into values and back.
//!
//! docs/protocol.md lists the same layouts for people.

use crate::coding::{put_text, DecodeError, Reader};
use crate::frame;

/// The protocol version this crate speaks. Peers negotiate the highest
/// version both support; there is only one so far.
pub const VERSION: u16 = 1;

/// Opens a control or data hello, so that a stray client of another protocol
/// fails on the first frame.
pub const MAGIC: [u8; 4] = *b"FPIP";

/// Longest service name, in bytes.
pub const MAX_SERVICE_NAME: usize = 64;

/// Longest human-readable reason in a `Reject` or `Close`, in bytes.
pub const MAX_REASON: usize = 1024;

/// A random 32-byte value: handshake nonces and the session cookie.
pub type Nonce = [u8; 32];

/// A session's data-stream cookie: random, unguessable, per session.
pub type Cookie = [u8; 32];

/// An HMAC-SHA256 tag.
pub type Mac = [u8; 32];

/// A one-time ticket's id (random; docs/protocol.md, `TicketAuth`).
pub type TicketId = [u8; 16];

/// Why a peer refused or ended a session, carried in `Reject` and `Close`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// No common protocol version.
    BadVersion,
    /// The client's proof of the key was wrong.
    AuthFailed,
    /// The server needs a key and the client has none.
    AuthRequired,
    /// The named service is not registered on this server.
    UnknownService,
    /// The server is at its session limit.
    Busy,
    /// A message arrived that the state does not allow, or did not decode.
    Protocol,
    /// A step did not finish before its deadline.
    Timeout,
    /// A data connection presented a cookie no live session holds.
    BadCookie,
    /// The service refused its parameters or failed.
    Service,
    /// A code from a newer peer; kept so it can be shown.
    Other(u8),
}

impl ErrorCode {
    fn to_u8(self) -> u8 {
        match self {
            ErrorCode::BadVersion => 1,
            ErrorCode::AuthFailed => 2,
            ErrorCode::AuthRequired => 3,
            ErrorCode::UnknownService => 4,
            ErrorCode::Busy => 5,
            ErrorCode::Protocol => 6,
            ErrorCode::Timeout => 7,
            ErrorCode::BadCookie => 8,
            ErrorCode::Service => 9,
            ErrorCode::Other(n) => n,
        }
    }

    fn from_u8(n: u8) -> Self {
        match n {
            1 => ErrorCode::BadVersion,
            2 => ErrorCode::AuthFailed,
            3 => ErrorCode::AuthRequired,
            4 => ErrorCode::UnknownService,
            5 => ErrorCode::Busy,
            6 => ErrorCode::Protocol,
            7 => ErrorCode::Timeout,
            8 => ErrorCode::BadCookie,
            9 => ErrorCode::Service,
            n => ErrorCode::Other(n),
        }
    }
}

/// One control-protocol message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Client → server, first frame of a control connection.
    ClientHello {
        /// Lowest version the client accepts.
        version_min: u16,
        /// Highest version the client speaks.
        version_max: u16,
        /// Fresh random value the server's proof must cover.
        nonce: Nonce,
    },
    /// Server → client: chosen version, whether a key is required, and the
    /// random value the client's proof must cover.
    ServerHello {
        /// The version both will speak.
        version: u16,
        /// True if the client must prove the pre-shared key.
        auth_required: bool,
        /// Fresh random value the client's proof must cover.
        nonce: Nonce,
    },
    /// Client → server: HMAC proof of the key.
    ClientAuth {
        /// `HMAC(key, "fatpipe/1 client" || server nonce || client nonce)`.
        mac: Mac,
    },
    /// Client → server, instead of `ClientAuth`: the proof of a one-time
    /// ticket's key (the HTTP port issued it; docs/http.md, "The leg").
    TicketAuth {
        /// The ticket's id.
        ticket: TicketId,
        /// `HMAC(ticket key, "fatpipe/1 client" || server nonce || client nonce)`.
        mac: Mac,
    },
    /// Server → client: the server's HMAC proof of the key (mutual auth).
    ServerAuth {
        /// `HMAC(key, "fatpipe/1 server" || client nonce || server nonce)`.
        mac: Mac,
    },
    /// Client → server: which service to run, with its opaque parameters.
    Open {
        /// Registered service name, e.g. "test".
        service: String,
        /// Service-defined parameters.
        params: Vec<u8>,
    },
    /// Server → client: the session is established; data connections must
    /// present this cookie.
    Accept {
        /// The session's cookie.
        cookie: Cookie,
    },
    /// Either way: the request is refused; the connection closes after it.
    Reject {
        /// Machine-readable reason.
        code: ErrorCode,
        /// One line for people.
        reason: String,
    },
    /// Client → server, first frame of a data connection.
    DataHello {
        /// The version agreed on the control connection.
        version: u16,
        /// The session's cookie.
        cookie: Cookie,
        /// Service-defined label of this stream (e.g. its index).
        tag: u32,
    },
    /// Server → client: the data connection is attached to its session; raw
    /// service bytes follow in both directions.
    DataAck,
    /// Either way, after `Accept`: one service message.
    Payload(Vec<u8>),
    /// Either way, after `Accept`: the sender is ending the session.
    Close {
        /// One line for people; empty for a normal end.
        reason: String,
    },
}

const T_CLIENT_HELLO: u8 = 0x01;
const T_SERVER_HELLO: u8 = 0x02;
const T_CLIENT_AUTH: u8 = 0x03;
const T_SERVER_AUTH: u8 = 0x04;
const T_OPEN: u8 = 0x05;
const T_ACCEPT: u8 = 0x06;
const T_REJECT: u8 = 0x07;
const T_DATA_HELLO: u8 = 0x08;
const T_DATA_ACK: u8 = 0x09;
const T_PAYLOAD: u8 = 0x10;
const T_CLOSE: u8 = 0x11;
const T_TICKET_AUTH: u8 = 0x0a;

impl Message {
    /// Appends this message as one frame. Fails only if the encoded message
    /// exceeds [`frame::MAX_FRAME`] (a payload or params too large).
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), DecodeError> {
        let mut body = Vec::with_capacity(64);
        self.encode_body(&mut body);
        frame::encode_frame(out, &body)
    }

    /// The frame body of this message (type byte and fields).
    pub fn encode_body(&self, b: &mut Vec<u8>) {
        match self {
            Message::ClientHello {
                version_min,
                version_max,
                nonce,
            } => {
                b.push(T_CLIENT_HELLO);
                b.extend_from_slice(&MAGIC);
                b.extend_from_slice(&version_min.to_be_bytes());
                b.extend_from_slice(&version_max.to_be_bytes());
                b.extend_from_slice(nonce);
            }
            Message::ServerHello {
                version,
                auth_required,
                nonce,
            } => {
                b.push(T_SERVER_HELLO);
                b.extend_from_slice(&version.to_be_bytes());
                b.push(u8::from(*auth_required));
                b.extend_from_slice(nonce);
            }
            Message::ClientAuth { mac } => {
                b.push(T_CLIENT_AUTH);
                b.extend_from_slice(mac);
            }
            Message::TicketAuth { ticket, mac } => {
                b.push(T_TICKET_AUTH);
                b.extend_from_slice(ticket);
                b.extend_from_slice(mac);
            }
            Message::ServerAuth { mac } => {
                b.push(T_SERVER_AUTH);
                b.extend_from_slice(mac);
            }
            Message::Open { service, params } => {
                b.push(T_OPEN);
                put_text(b, service, MAX_SERVICE_NAME);
                b.extend_from_slice(params);
            }
            Message::Accept { cookie } => {
                b.push(T_ACCEPT);
                b.extend_from_slice(cookie);
            }
            Message::Reject { code, reason } => {
                b.push(T_REJECT);
                b.push(code.to_u8());
                put_text(b, reason, MAX_REASON);
            }
            Message::DataHello {
                version,
                cookie,
                tag,
            } => {
                b.push(T_DATA_HELLO);
                b.extend_from_slice(&MAGIC);
                b.extend_from_slice(&version.to_be_bytes());
                b.extend_from_slice(cookie);
                b.extend_from_slice(&tag.to_be_bytes());
            }
            Message::DataAck => b.push(T_DATA_ACK),
            Message::Payload(data) => {
                b.push(T_PAYLOAD);
                b.extend_from_slice(data);
            }
            Message::Close { reason } => {
                b.push(T_CLOSE);
                put_text(b, reason, MAX_REASON);
            }
        }
    }

    /// Decodes one frame body. Never panics; see the module docs for what it
    /// rejects.
    pub fn decode(body: &[u8]) -> Result<Message, DecodeError> {
        if body.len() > frame::MAX_FRAME {
            return Err(DecodeError::TooLarge {
                len: body.len(),
                max: frame::MAX_FRAME,
            });
        }
        let mut r = Reader::new(body);
        let ty = r.u8()?;
        let msg = match ty {
            T_CLIENT_HELLO => {
                expect_magic(&mut r)?;
                let version_min = r.u16()?;
                let version_max = r.u16()?;
                if version_min > version_max {
                    return Err(DecodeError::Invalid("version range"));
                }
                Message::ClientHello {
                    version_min,
                    version_max,
                    nonce: r.array()?,
                }
            }
            T_SERVER_HELLO => Message::ServerHello {
                version: r.u16()?,
                auth_required: match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(DecodeError::Invalid("auth flag")),
                },
                nonce: r.array()?,
            },
            T_CLIENT_AUTH => Message::ClientAuth { mac: r.array()? },
            T_SERVER_AUTH => Message::ServerAuth { mac: r.array()? },
            T_TICKET_AUTH => Message::TicketAuth {
                ticket: r.array()?,
                mac: r.array()?,
            },
            T_OPEN => {
                let service = r.text(MAX_SERVICE_NAME, "service name")?;
                if service.is_empty()
                    || !service
                        .bytes()
                        .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
                {
                    return Err(DecodeError::Invalid("service name"));
                }
                Message::Open {
                    service,
                    params: r.rest().to_vec(),
                }
            }
            T_ACCEPT => Message::Accept { cookie: r.array()? },
            T_REJECT => Message::Reject {
                code: ErrorCode::from_u8(r.u8()?),
                reason: r.text(MAX_REASON, "reason")?,
            },
            T_DATA_HELLO => {
                expect_magic(&mut r)?;
                Message::DataHello {
                    version: r.u16()?,
                    cookie: r.array()?,
                    tag: r.u32()?,
                }
            }
            T_DATA_ACK => Message::DataAck,
            T_PAYLOAD => Message::Payload(r.rest().to_vec()),
            T_CLOSE => Message::Close {
                reason: r.text(MAX_REASON, "reason")?,
            },
            other => return Err(DecodeError::UnknownType(other)),
        };
        r.finish()?;
        Ok(msg)
    }
}

/// The largest service payload (or Open params) that fits in one frame.
pub const MAX_PAYLOAD: usize = frame::MAX_FRAME - 1;

/// The largest `Open` params for a service name of `name_len` bytes.
pub fn max_params(name_len: usize) -> usize {
    frame::MAX_FRAME - 1 - 2 - name_len
}

fn expect_magic(r: &mut Reader<'_>) -> Result<(), DecodeError> {
    if r.array::<4>()? != MAGIC {
        return Err(DecodeError::Invalid("magic"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::FrameDecoder;

    fn all_messages() -> Vec<Message> {
        vec![
            Message::ClientHello {
                version_min: 1,
                version_max: 3,
                nonce: [1; 32],
            },
            Message::ServerHello {
                version: 1,
                auth_required: true,
                nonce: [2; 32],
            },
            Message::ClientAuth { mac: [3; 32] },
            Message::ServerAuth { mac: [4; 32] },
            Message::Open {
                service: "test".into(),
                params: b"{\"x\":1}".to_vec(),
            },
            Message::Accept { cookie: [5; 32] },
            Message::Reject {
                code: ErrorCode::Busy,
                reason: "server is at 10 sessions".into(),
            },
            Message::Reject {
                code: ErrorCode::Other(200),
                reason: String::new(),
            },
            Message::DataHello {
                version: 1,
                cookie: [6; 32],
                tag: 77,
            },
            Message::DataAck,
            Message::Payload(vec![9; 300]),
            Message::Payload(Vec::new()),
            Message::Close {
                reason: "done".into(),
            },
        ]
    }

    #[test]
    fn every_message_round_trips_through_frames() {
        let mut wire = Vec::new();
        let msgs = all_messages();
        for m in &msgs {
            m.encode(&mut wire).unwrap();
        }
        let mut d = FrameDecoder::new();
        d.push(&wire);
        for m in &msgs {
            let body = d.next_frame().unwrap().unwrap();
            assert_eq!(&Message::decode(&body).unwrap(), m);
        }
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        for m in all_messages() {
            let mut body = Vec::new();
            m.encode_body(&mut body);
            for cut in 0..body.len() {
                let short = &body[..cut];
                // A payload may legitimately be shorter; everything else must fail.
                if let Ok(got) = Message::decode(short) {
                    assert!(
                        matches!(got, Message::Payload(_) | Message::Open { .. }),
                        "{m:?} cut at {cut} decoded as {got:?}"
                    );
                }
            }
            let mut long = body.clone();
            long.push(0);
            if !matches!(m, Message::Payload(_) | Message::Open { .. }) {
                assert_eq!(Message::decode(&long), Err(DecodeError::TrailingBytes(1)));
            }
        }
    }

    #[test]
    fn hostile_fields_are_rejected() {
        assert_eq!(
            Message::decode(&[0xee]),
            Err(DecodeError::UnknownType(0xee))
        );
        // Bad magic.
        let mut b = vec![T_CLIENT_HELLO];
        b.extend_from_slice(b"HTTP");
        b.extend_from_slice(&[0, 1, 0, 1]);
        b.extend_from_slice(&[0; 32]);
        assert_eq!(Message::decode(&b), Err(DecodeError::Invalid("magic")));
        // Service names are restricted.
        let mut b = vec![T_OPEN];
        put_text(&mut b, "../x", 64);
        assert_eq!(
            Message::decode(&b),
            Err(DecodeError::Invalid("service name"))
        );
        // Inverted version range.
        let mut b = vec![T_CLIENT_HELLO];
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&[0, 2, 0, 1]);
        b.extend_from_slice(&[0; 32]);
        assert_eq!(
            Message::decode(&b),
            Err(DecodeError::Invalid("version range"))
        );
    }

    #[test]
    fn oversized_payload_cannot_be_encoded() {
        let mut out = Vec::new();
        assert!(Message::Payload(vec![0; MAX_PAYLOAD])
            .encode(&mut out)
            .is_ok());
        let mut out = Vec::new();
        assert!(Message::Payload(vec![0; MAX_PAYLOAD + 1])
            .encode(&mut out)
            .is_err());
        let name = "test";
        let mut out = Vec::new();
        let open = Message::Open {
            service: name.into(),
            params: vec![0; max_params(name.len())],
        };
        assert!(open.encode(&mut out).is_ok());
    }
}
