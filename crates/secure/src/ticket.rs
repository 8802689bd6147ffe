//! Encrypted sessions keyed by a one-time ticket instead of the
//! pre-shared key (the leg of an `https` third-party copy; docs/http.md,
//! "The leg", and docs/protocol.md, "Tickets").
//!
//! A ticket is a random 128-bit id and 256-bit key that the server's HTTPS
//! port handed to one client. The session it opens is encrypted as
//! `--encrypt` encrypts (TLS 1.3, [`crate::tls`]), with the server's
//! identity derived from the ticket ([`material`]: the id and key under a
//! label of their own) instead of from the pre-shared key. The server
//! learns which ticket before it answers: the client's `ClientHello`
//! names it as its server name (SNI, [`server_name`]:
//! `<32 hex>.ticket.fatpipe`), and [`server_handshake_by_name`] reads the
//! `ClientHello`, asks the caller for the identity of that name, and only
//! then completes the handshake.
//!
//! What an on-path attacker sees: the id (in the clear, as it is in a
//! plain leg's `TicketAuth`), never the key; without the key it can
//! neither present the identity the client accepts (so it cannot stand in
//! for the server, nor read the session) nor prove the ticket inside the
//! TLS session (`TicketAuth`'s HMAC). Knowing the id lets anyone finish a
//! TLS handshake with the server (TLS authenticates only the server here),
//! which gives it nothing a plain connection does not: the session still
//! opens only with the ticket's proof, inside TLS.

use std::net::TcpStream;
use std::time::Instant;

use rustls::server::Acceptor;
use rustls::Connection;

use crate::record::{HEADER, MAX_CIPHERTEXT};
use crate::stream::Stream;
use crate::tls::{classify, finish, read_record, ServerTls, TlsError};

/// The server name a ticket's session asks for: its id in hex under
/// `.ticket.fatpipe` (a valid DNS name, so rustls sends it).
pub fn server_name(id: &[u8; 16]) -> String {
    let mut s = String::with_capacity(32 + SUFFIX.len());
    for b in id {
        s.push_str(&format!("{b:02x}"));
    }
    s.push_str(SUFFIX);
    s
}

const SUFFIX: &str = ".ticket.fatpipe";

/// The ticket id a server name names, if it is a ticket's
/// ([`server_name`]'s form, hex in either case).
pub fn parse_name(name: &str) -> Option<[u8; 16]> {
    let lower = name.to_ascii_lowercase();
    let hex = lower.strip_suffix(SUFFIX)?;
    if hex.len() != 32 || !hex.is_ascii() {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, o) in id.iter_mut().enumerate() {
        *o = u8::from_str_radix(&hex[i * 2..i * 2 + 2], 16).ok()?;
    }
    Some(id)
}

/// What a ticket's TLS identity is derived from: a label of its own, the
/// id and the key (never equal to a pre-shared key's input, and bound to
/// the id the client named).
pub fn material(id: &[u8; 16], key: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(LABEL.len() + 16 + key.len());
    m.extend_from_slice(LABEL);
    m.extend_from_slice(id);
    m.extend_from_slice(key);
    m
}

const LABEL: &[u8] = b"fatpipe one-time ticket tls v1\0";

/// The server's handshake when the identity depends on the name the
/// client asks for: reads the `ClientHello` (whole records, by
/// `deadline`), calls `choose` with its server name (`None` without SNI),
/// and completes the handshake with the identity `choose` returns. An
/// error from `choose` ends the connection (no alert: a stranger learns
/// nothing about which tickets live).
pub fn server_handshake_by_name(
    tcp: TcpStream,
    deadline: Instant,
    choose: impl FnOnce(Option<&str>) -> Result<ServerTls, TlsError>,
) -> Result<Stream, TlsError> {
    let mut tcp = tcp;
    let mut acceptor = Acceptor::default();
    let mut record = Vec::with_capacity(HEADER + MAX_CIPHERTEXT);
    let accepted = loop {
        read_record(&mut tcp, &mut record, deadline)?;
        acceptor.read_tls(&mut record.as_slice())?;
        match acceptor.accept() {
            Ok(Some(a)) => break a,
            Ok(None) => {}
            Err((e, mut alert)) => {
                let _ = alert.write_all(&mut tcp);
                return Err(classify(e));
            }
        }
    };
    let tls = choose(accepted.client_hello().server_name())?;
    let conn = match accepted.into_connection(tls.config()) {
        Ok(c) => c,
        Err((e, mut alert)) => {
            let _ = alert.write_all(&mut tcp);
            return Err(classify(e));
        }
    };
    finish(Connection::Server(conn), tcp, deadline)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::{client_handshake, ClientTls};
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::time::Duration;

    const ID: [u8; 16] = [0x5a; 16];
    const KEY: [u8; 32] = [7; 32];

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    #[test]
    fn names_round_trip_and_others_are_not_tickets() {
        let n = server_name(&ID);
        assert_eq!(n, format!("{}.ticket.fatpipe", "5a".repeat(16)));
        assert_eq!(parse_name(&n), Some(ID));
        assert_eq!(parse_name(&n.to_ascii_uppercase()), Some(ID));
        assert_eq!(parse_name("fatpipe"), None);
        assert_eq!(parse_name(".ticket.fatpipe"), None);
        assert_eq!(
            parse_name(&format!("{}.ticket.fatpipe", "5g".repeat(16))),
            None
        );
        assert_eq!(
            parse_name(&format!("{}.ticket.fatpipe", "5a".repeat(17))),
            None
        );
        // A multi-byte character where hex belongs: no panic.
        assert_eq!(
            parse_name(&format!("é{}.ticket.fatpipe", "5".repeat(30))),
            None
        );
        assert_ne!(material(&ID, &KEY), material(&[0; 16], &KEY));
    }

    /// Serves one handshake choosing by name: the ticket's identity for
    /// its name, an error otherwise. Returns what the server saw.
    fn serve_one(s: TcpStream) -> std::thread::JoinHandle<Result<Option<String>, String>> {
        std::thread::spawn(move || {
            let seen = std::sync::Mutex::new(None);
            let r = server_handshake_by_name(s, Instant::now() + Duration::from_secs(10), |name| {
                *seen.lock().unwrap() = name.map(str::to_string);
                match name.and_then(parse_name) {
                    Some(id) if id == ID => ServerTls::ticket(&id, &KEY),
                    _ => Err(TlsError::Identity("no such ticket".into())),
                }
            });
            let seen = seen.into_inner().unwrap();
            match r {
                Ok(mut stream) => {
                    let mut b = [0u8; 5];
                    stream.read_exact(&mut b).map_err(|e| e.to_string())?;
                    stream.write_all(&b).map_err(|e| e.to_string())?;
                    Ok(seen)
                }
                Err(e) => Err(e.to_string()),
            }
        })
    }

    #[test]
    fn a_ticket_holder_gets_an_encrypted_session_keyed_by_its_ticket() {
        let (c, s) = pair();
        let server = serve_one(s);
        let client = ClientTls::ticket(&ID, &KEY).unwrap();
        let mut stream = client_handshake(&client, c, Duration::from_secs(10)).unwrap();
        assert!(stream.is_encrypted());
        stream.write_all(b"hello").unwrap();
        let mut b = [0u8; 5];
        stream.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"hello");
        assert_eq!(server.join().unwrap(), Ok(Some(server_name(&ID))));
    }

    #[test]
    fn a_wrong_key_for_the_id_cannot_authenticate_the_server() {
        // The client names the right id but holds another key: the
        // server's identity (derived from the real key) is refused, so
        // nothing is sent; the server's handshake fails on the alert.
        let (c, s) = pair();
        let server = serve_one(s);
        let client = ClientTls::ticket(&ID, &[8; 32]).unwrap();
        let e = client_handshake(&client, c, Duration::from_secs(10)).unwrap_err();
        assert!(matches!(e, TlsError::WrongServerKey), "{e}");
        assert!(server.join().unwrap().is_err());
        // And a server that holds a wrong key for the id is refused by
        // the real holder.
        let (c, s) = pair();
        let server = std::thread::spawn(move || {
            server_handshake_by_name(s, Instant::now() + Duration::from_secs(10), |_| {
                ServerTls::ticket(&ID, &[9; 32])
            })
            .map(|_| ())
        });
        let client = ClientTls::ticket(&ID, &KEY).unwrap();
        let e = client_handshake(&client, c, Duration::from_secs(10)).unwrap_err();
        assert!(matches!(e, TlsError::WrongServerKey), "{e}");
        assert!(server.join().unwrap().is_err());
        // The pre-shared key's identity is not a ticket's, nor the other
        // way round.
        let (c, s) = pair();
        let server = std::thread::spawn(move || {
            server_handshake_by_name(s, Instant::now() + Duration::from_secs(10), |_| {
                ServerTls::new(&KEY)
            })
            .map(|_| ())
        });
        let client = ClientTls::ticket(&ID, &KEY).unwrap();
        assert!(client_handshake(&client, c, Duration::from_secs(10)).is_err());
        let _ = server.join().unwrap();
    }

    #[test]
    fn an_unknown_ticket_ends_the_connection() {
        let (c, s) = pair();
        let server = serve_one(s);
        let other = [1u8; 16];
        let client = ClientTls::ticket(&other, &KEY).unwrap();
        assert!(client_handshake(&client, c, Duration::from_secs(10)).is_err());
        let seen = server.join().unwrap();
        assert!(seen.is_err(), "{seen:?}");
    }

    #[test]
    fn a_pre_shared_key_client_still_names_fatpipe() {
        let (c, s) = pair();
        let server = std::thread::spawn(move || {
            let mut name = None;
            let r = server_handshake_by_name(s, Instant::now() + Duration::from_secs(10), |n| {
                name = n.map(str::to_string);
                ServerTls::new(b"a pre-shared key")
            });
            (r.is_ok(), name)
        });
        let client = ClientTls::new(b"a pre-shared key").unwrap();
        assert!(client_handshake(&client, c, Duration::from_secs(10)).is_ok());
        assert_eq!(
            server.join().unwrap(),
            (true, Some(crate::keys::SERVER_NAME.to_string()))
        );
    }
}
