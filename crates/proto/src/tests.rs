//! Both state machines wired together in memory on a virtual clock.
//!
//! [`Pair`] plays the network: bytes a side transmits arrive at the other
//! after a one-way latency, cut into `mtu`-sized pieces, and time advances
//! only when nothing is left to do now (to the next arrival or deadline).
//! The server side answers `Open` with a policy closure, as the engine would.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::*;

const LATENCY: Duration = Duration::from_millis(50);
const TIMEOUT: Duration = Duration::from_secs(5);
const COOKIE: Cookie = [0xc0; 32];

type Policy = Box<dyn FnMut(&str, &[u8]) -> Result<Cookie, (ErrorCode, String)>>;

struct Pair {
    now: Instant,
    start: Instant,
    mtu: usize,
    client: ClientConn,
    server: ServerConn,
    /// In flight towards the server / the client: (arrival time, bytes).
    to_server: VecDeque<(Instant, Vec<u8>)>,
    to_client: VecDeque<(Instant, Vec<u8>)>,
    client_events: Vec<ClientEvent>,
    server_events: Vec<ServerEvent>,
    policy: Policy,
    /// When false, the client's bytes are dropped (a stalled client).
    client_talks: bool,
    /// When false, the server's bytes are dropped (a stalled server).
    server_talks: bool,
}

impl Pair {
    fn new(client_key: Option<&[u8]>, server_key: Option<&[u8]>) -> Pair {
        Pair::opening("test", client_key, server_key)
    }

    /// A pair whose client opens `service` (the server serves "public"
    /// to clients without the key).
    fn opening(service: &str, client_key: Option<&[u8]>, server_key: Option<&[u8]>) -> Pair {
        let start = Instant::now();
        let client = ClientConn::new(
            ClientConfig {
                key: client_key.map(|k| Key::new(k).unwrap()),
                service: service.into(),
                params: b"params".to_vec(),
                handshake_timeout: TIMEOUT * 2,
            },
            start,
            [0x11; 32],
        );
        let server = ServerConn::new(
            &ServerConfig {
                key: server_key.map(|k| Key::new(k).unwrap()),
                preauth_timeout: TIMEOUT,
                keyless_services: vec!["public".into()],
                tickets: None,
            },
            start,
            [0x22; 32],
        );
        Pair {
            now: start,
            start,
            mtu: 1500,
            client,
            server,
            to_server: VecDeque::new(),
            to_client: VecDeque::new(),
            client_events: Vec::new(),
            server_events: Vec::new(),
            policy: Box::new(|svc, _| {
                if svc == "test" || svc == "public" {
                    Ok(COOKIE)
                } else {
                    Err((ErrorCode::UnknownService, svc.to_string()))
                }
            }),
            client_talks: true,
            server_talks: true,
        }
    }

    fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// Moves bytes and events until nothing is in flight and no deadline
    /// is pending, or `limit` of virtual time has passed.
    fn drive(&mut self, limit: Duration) {
        let end = self.now + limit;
        loop {
            self.step_now();
            let next = [
                self.to_server.front().map(|x| x.0),
                self.to_client.front().map(|x| x.0),
                self.client.poll_timeout(),
                self.server.poll_timeout(),
            ]
            .into_iter()
            .flatten()
            .min();
            match next {
                Some(t) if t <= end => {
                    self.now = self.now.max(t);
                    self.client.handle_timeout(self.now);
                    self.server.handle_timeout(self.now);
                }
                _ => break,
            }
        }
    }

    /// Does everything due at `now`.
    fn step_now(&mut self) {
        loop {
            let mut progressed = false;
            while self.to_server.front().is_some_and(|x| x.0 <= self.now) {
                let (_, bytes) = self.to_server.pop_front().unwrap();
                self.server.handle_input(self.now, &bytes);
                progressed = true;
            }
            while self.to_client.front().is_some_and(|x| x.0 <= self.now) {
                let (_, bytes) = self.to_client.pop_front().unwrap();
                self.client.handle_input(self.now, &bytes);
                progressed = true;
            }
            while let Some(bytes) = self.client.poll_transmit() {
                if self.client_talks {
                    for piece in bytes.chunks(self.mtu) {
                        self.to_server
                            .push_back((self.now + LATENCY, piece.to_vec()));
                    }
                }
                progressed = true;
            }
            while let Some(bytes) = self.server.poll_transmit() {
                if self.server_talks {
                    for piece in bytes.chunks(self.mtu) {
                        self.to_client
                            .push_back((self.now + LATENCY, piece.to_vec()));
                    }
                }
                progressed = true;
            }
            while let Some(ev) = self.client.poll_event() {
                self.client_events.push(ev);
                progressed = true;
            }
            while let Some(ev) = self.server.poll_event() {
                if let ServerEvent::Open {
                    service, params, ..
                } = &ev
                {
                    match (self.policy)(service, params) {
                        Ok(cookie) => self.server.accept(self.now, cookie),
                        Err((code, reason)) => self.server.reject(code, &reason),
                    }
                }
                self.server_events.push(ev);
                progressed = true;
            }
            if !progressed {
                break;
            }
        }
    }

    fn client_closed(&self) -> Option<&ConnError> {
        self.client_events.iter().find_map(|e| match e {
            ClientEvent::Closed(err) => Some(err),
            _ => None,
        })
    }

    fn server_closed(&self) -> Option<&ConnError> {
        self.server_events.iter().find_map(|e| match e {
            ServerEvent::Closed(err) => Some(err),
            _ => None,
        })
    }
}

#[test]
fn open_without_key_takes_two_round_trips() {
    let mut p = Pair::new(None, None);
    p.drive(Duration::from_secs(1));
    assert_eq!(
        p.client_events,
        vec![ClientEvent::Established {
            cookie: COOKIE,
            version: VERSION
        }]
    );
    assert_eq!(
        p.server_events,
        vec![ServerEvent::Open {
            service: "test".into(),
            params: b"params".to_vec(),
            authenticated: true,
            ticket: None,
        }]
    );
    // Without a key the Open rides with the hello: hello and open, server
    // hello and accept, one round trip.
    assert!(p.client.is_established() && p.server.is_established());
    assert_eq!(p.elapsed(), LATENCY * 2);
}

#[test]
fn payloads_flow_both_ways_after_accept() {
    let mut p = Pair::new(None, None);
    p.drive(Duration::from_secs(1));
    p.client.send_payload(b"ping").unwrap();
    p.server.send_payload(b"pong").unwrap();
    p.server.send_payload(&[]).unwrap();
    p.drive(Duration::from_secs(1));
    assert!(p
        .server_events
        .contains(&ServerEvent::Payload(b"ping".to_vec())));
    assert_eq!(
        p.client_events[1..],
        [
            ClientEvent::Payload(b"pong".to_vec()),
            ClientEvent::Payload(Vec::new())
        ]
    );
    p.client.close("bye");
    p.drive(Duration::from_secs(1));
    assert_eq!(p.server_closed(), Some(&ConnError::Closed("bye".into())));
    assert!(p
        .client
        .send_payload(b"late")
        .is_err_and(|e| e == ConnError::NotEstablished));
}

/// The frames a fresh client queues before hearing from the server.
fn first_flight(key: Option<&[u8]>) -> Vec<Message> {
    let mut c = ClientConn::new(
        ClientConfig {
            key: key.map(|k| Key::new(k).unwrap()),
            service: "test".into(),
            params: b"params".to_vec(),
            handshake_timeout: TIMEOUT,
        },
        Instant::now(),
        [0x11; 32],
    );
    let mut d = FrameDecoder::new();
    d.push(&c.poll_transmit().unwrap_or_default());
    let mut out = Vec::new();
    while let Ok(Some(body)) = d.next_frame() {
        out.push(Message::decode(&body).unwrap());
    }
    out
}

#[test]
fn a_keyless_client_sends_open_with_its_hello_and_a_keyed_one_waits_for_the_nonce() {
    let open = Message::Open {
        service: "test".into(),
        params: b"params".to_vec(),
    };
    let keyless = first_flight(None);
    assert!(
        matches!(keyless[..], [Message::ClientHello { .. }, _]) && keyless[1] == open,
        "{keyless:?}"
    );
    // The proof needs the server's nonce, and Open follows the proof.
    let keyed = first_flight(Some(b"sesame-sesame"));
    assert!(
        matches!(keyed[..], [Message::ClientHello { .. }]),
        "{keyed:?}"
    );
    // That the Open goes out once, not again when the server's hello
    // comes, is in the handshake tests: the server sees exactly one.
}

#[test]
fn mutual_auth_with_the_same_key_is_still_two_round_trips() {
    let mut p = Pair::new(Some(b"sesame-sesame"), Some(b"sesame-sesame"));
    p.mtu = 1; // and survives any segmentation
    p.drive(Duration::from_secs(1));
    assert!(matches!(
        p.client_events[..],
        [ClientEvent::Established { cookie: COOKIE, .. }]
    ));
    assert_eq!(p.elapsed(), LATENCY * 4);
}

#[test]
fn wrong_key_is_refused_on_both_ends() {
    let mut p = Pair::new(Some(b"wrong-key-here"), Some(b"sesame-sesame"));
    p.drive(Duration::from_secs(1));
    let err = p.client_closed().unwrap().clone();
    assert!(
        matches!(
            err,
            ConnError::Rejected {
                code: ErrorCode::AuthFailed,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.is_auth());
    assert!(err.to_string().contains("wrong key"), "{err}");
    assert_eq!(p.server_closed(), Some(&ConnError::AuthFailed));
    // The service was never asked.
    assert!(!p
        .server_events
        .iter()
        .any(|e| matches!(e, ServerEvent::Open { .. })));
}

#[test]
fn missing_key_on_either_end_is_an_auth_error() {
    let mut p = Pair::new(None, Some(b"sesame-sesame"));
    p.drive(Duration::from_secs(1));
    assert_eq!(p.client_closed(), Some(&ConnError::AuthRequired));
    assert!(p.client_closed().unwrap().is_auth());

    let mut p = Pair::new(Some(b"sesame-sesame"), None);
    p.drive(Duration::from_secs(1));
    assert_eq!(p.client_closed(), Some(&ConnError::ServerUnauthenticated));
    assert!(!p
        .server_events
        .iter()
        .any(|e| matches!(e, ServerEvent::Open { .. })));
}

#[test]
fn impostor_server_fails_the_clients_check() {
    // The impostor does not know the key: it answers the hello as a keyed
    // server, then sends a made-up proof and an Accept.
    let start = Instant::now();
    let mut c = ClientConn::new(
        ClientConfig {
            key: Some(Key::new(*b"sesame-sesame").unwrap()),
            service: "test".into(),
            params: Vec::new(),
            handshake_timeout: TIMEOUT,
        },
        start,
        [1; 32],
    );
    let mut wire = Vec::new();
    Message::ServerHello {
        version: VERSION,
        auth_required: true,
        nonce: [2; 32],
    }
    .encode(&mut wire)
    .unwrap();
    Message::ServerAuth { mac: [0; 32] }
        .encode(&mut wire)
        .unwrap();
    Message::Accept { cookie: COOKIE }
        .encode(&mut wire)
        .unwrap();
    c.handle_input(start, &wire);
    assert_eq!(
        c.poll_event(),
        Some(ClientEvent::Closed(ConnError::ServerProofFailed))
    );
    assert_eq!(c.poll_event(), None, "no Established after a bad proof");
}

#[test]
fn stalled_client_is_dropped_at_the_preauth_deadline() {
    let mut p = Pair::new(None, None);
    p.client_talks = false;
    p.drive(Duration::from_secs(60));
    assert_eq!(
        p.server_closed(),
        Some(&ConnError::Timeout("waiting for the client's hello"))
    );
    // The Reject the server sends at the deadline is the last thing moving.
    assert_eq!(p.elapsed(), TIMEOUT + LATENCY);
    assert_eq!(p.server.poll_timeout(), None);
}

#[test]
fn client_stalling_after_hello_hits_the_same_deadline() {
    // With a key, the proof waits for the server's nonce: a client that
    // stalls then has sent its hello and nothing else.
    let mut p = Pair::new(Some(b"sesame-sesame"), Some(b"sesame-sesame"));
    p.drive(LATENCY); // the hello reaches the server
    p.client_talks = false;
    p.drive(Duration::from_secs(60));
    assert_eq!(
        p.server_closed(),
        Some(&ConnError::Timeout("waiting for the client's proof"))
    );
    // The deadline counts from the accept, not from the last byte.
    assert_eq!(p.server_events.len(), 1);
}

#[test]
fn silent_server_times_the_client_out() {
    let mut p = Pair::new(None, None);
    p.server_talks = false;
    p.drive(Duration::from_secs(60));
    assert_eq!(
        p.client_closed(),
        Some(&ConnError::Timeout("waiting for the server's hello"))
    );
    // Its Close reaches the (long since timed out) server one trip later.
    assert_eq!(p.elapsed(), TIMEOUT * 2 + LATENCY);
}

#[test]
fn unknown_service_is_rejected_with_its_name() {
    let mut p = Pair::new(None, None);
    p.policy = Box::new(|_, _| Err((ErrorCode::UnknownService, "no 'test' here".into())));
    p.drive(Duration::from_secs(1));
    let err = p.client_closed().unwrap();
    assert!(
        err.to_string().contains("does not offer") && err.to_string().contains("no 'test' here"),
        "{err}"
    );
    assert!(!err.is_auth());
}

#[test]
fn garbage_and_oversized_frames_close_only_that_connection() {
    let now = Instant::now();
    let cfg = ServerConfig {
        key: None,
        preauth_timeout: TIMEOUT,
        keyless_services: Vec::new(),
        tickets: None,
    };
    let mut s = ServerConn::new(&cfg, now, [0; 32]);
    s.handle_input(now, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(matches!(
        s.poll_event(),
        Some(ServerEvent::Closed(ConnError::Decode(
            DecodeError::TooLarge { .. }
        )))
    ));
    // The peer is told why, in a Reject frame.
    let reply = s.poll_transmit().unwrap();
    let mut d = FrameDecoder::new();
    d.push(&reply);
    let msg = Message::decode(&d.next_frame().unwrap().unwrap()).unwrap();
    assert!(matches!(
        msg,
        Message::Reject {
            code: ErrorCode::Protocol,
            ..
        }
    ));
    // Further input is ignored.
    s.handle_input(now, &[0, 0, 0, 1, 1]);
    assert_eq!(s.poll_event(), None);

    let mut s = ServerConn::new(&cfg, now, [0; 32]);
    let mut wire = Vec::new();
    Message::Payload(b"too early".to_vec())
        .encode(&mut wire)
        .unwrap();
    s.handle_input(now, &wire);
    assert!(matches!(
        s.poll_event(),
        Some(ServerEvent::Closed(ConnError::Unexpected {
            got: "Payload",
            ..
        }))
    ));
}

#[test]
fn version_mismatch_is_refused() {
    let now = Instant::now();
    let cfg = ServerConfig {
        key: None,
        preauth_timeout: TIMEOUT,
        keyless_services: Vec::new(),
        tickets: None,
    };
    let mut s = ServerConn::new(&cfg, now, [0; 32]);
    let mut wire = Vec::new();
    Message::ClientHello {
        version_min: VERSION + 1,
        version_max: VERSION + 5,
        nonce: [0; 32],
    }
    .encode(&mut wire)
    .unwrap();
    s.handle_input(now, &wire);
    assert!(matches!(
        s.poll_event(),
        Some(ServerEvent::Closed(ConnError::BadVersion { .. }))
    ));
}

#[test]
fn data_hello_reports_cookie_and_stops_framing() {
    let now = Instant::now();
    let cfg = ServerConfig {
        key: Some(Key::new(*b"sesame-sesame").unwrap()),
        preauth_timeout: TIMEOUT,
        keyless_services: Vec::new(),
        tickets: None,
    };
    let mut s = ServerConn::new(&cfg, now, [0; 32]);
    let mut wire = Vec::new();
    Message::DataHello {
        version: VERSION,
        cookie: COOKIE,
        tag: 3,
    }
    .encode(&mut wire)
    .unwrap();
    // Bytes after the hello belong to the service, not to the framer.
    wire.extend_from_slice(&[0xff; 10]);
    s.handle_input(now, &wire);
    assert_eq!(
        s.poll_event(),
        Some(ServerEvent::DataHello {
            cookie: COOKIE,
            tag: 3
        })
    );
    assert_eq!(s.poll_event(), None);
    assert_eq!(s.poll_timeout(), None);
    s.attach();
    let mut d = FrameDecoder::new();
    d.push(&s.poll_transmit().unwrap());
    assert_eq!(
        Message::decode(&d.next_frame().unwrap().unwrap()),
        Ok(Message::DataAck)
    );
    assert_eq!(s.take_buffered(), vec![0xff; 10]);
}

#[test]
fn oversized_payloads_are_refused_locally() {
    let mut p = Pair::new(None, None);
    p.drive(Duration::from_secs(1));
    assert_eq!(
        p.client.send_payload(&vec![0; MAX_PAYLOAD + 1]),
        Err(ConnError::PayloadTooLarge(MAX_PAYLOAD + 1))
    );
    assert!(p.client.send_payload(&vec![0; MAX_PAYLOAD]).is_ok());
    p.drive(Duration::from_secs(1));
    assert!(p
        .server_events
        .iter()
        .any(|e| matches!(e, ServerEvent::Payload(v) if v.len() == MAX_PAYLOAD)));
}

#[test]
fn a_payload_in_the_same_segment_as_accept_is_not_lost() {
    // The server's first service message may ride with the Accept.
    let start = Instant::now();
    let mut c = ClientConn::new(
        ClientConfig {
            key: None,
            service: "test".into(),
            params: Vec::new(),
            handshake_timeout: TIMEOUT,
        },
        start,
        [1; 32],
    );
    let mut wire = Vec::new();
    Message::ServerHello {
        version: VERSION,
        auth_required: false,
        nonce: [2; 32],
    }
    .encode(&mut wire)
    .unwrap();
    Message::Accept { cookie: COOKIE }
        .encode(&mut wire)
        .unwrap();
    Message::Payload(b"first".to_vec())
        .encode(&mut wire)
        .unwrap();
    c.handle_input(start, &wire);
    assert!(matches!(
        c.poll_event(),
        Some(ClientEvent::Established { .. })
    ));
    assert_eq!(
        c.poll_event(),
        Some(ClientEvent::Payload(b"first".to_vec()))
    );
}

#[test]
fn frames_sent_while_the_server_decides_wait_for_its_answer() {
    // Bytes after Open are not judged until the caller accepts: then they
    // are payloads of the established session, not protocol errors.
    let now = Instant::now();
    let cfg = ServerConfig {
        key: None,
        preauth_timeout: TIMEOUT,
        keyless_services: Vec::new(),
        tickets: None,
    };
    let mut s = ServerConn::new(&cfg, now, [0; 32]);
    let mut wire = Vec::new();
    Message::ClientHello {
        version_min: VERSION,
        version_max: VERSION,
        nonce: [3; 32],
    }
    .encode(&mut wire)
    .unwrap();
    Message::Open {
        service: "test".into(),
        params: Vec::new(),
    }
    .encode(&mut wire)
    .unwrap();
    Message::Payload(b"eager".to_vec())
        .encode(&mut wire)
        .unwrap();
    s.handle_input(now, &wire);
    assert!(matches!(s.poll_event(), Some(ServerEvent::Open { .. })));
    assert_eq!(s.poll_event(), None);
    s.accept(now, COOKIE);
    assert_eq!(
        s.poll_event(),
        Some(ServerEvent::Payload(b"eager".to_vec()))
    );
}

/// An iperf3 server answers a connection with one state byte and waits;
/// the client must recognise it from that byte alone, not time out.
#[test]
fn client_recognises_a_server_that_is_not_fatpipe_from_its_first_byte() {
    for (first, words) in [
        (0x09u8, "iperf3 server; run `fatpipe test --iperf3`"),
        (0xff, "busy iperf3 server"),
        (b'S', "first byte was 0x53"),
    ] {
        let start = Instant::now();
        let mut c = ClientConn::new(
            ClientConfig {
                key: None,
                service: "test".into(),
                params: vec![],
                handshake_timeout: TIMEOUT,
            },
            start,
            [0x11; 32],
        );
        assert!(c.poll_transmit().is_some(), "the hello goes out first");
        c.handle_input(start, &[first]);
        let err = match c.poll_event() {
            Some(ClientEvent::Closed(e)) => e,
            other => panic!("{first:#x}: {other:?}"),
        };
        assert_eq!(err, ConnError::NotFatpipe(first));
        assert!(err.is_auth(), "the user's to fix: exit 2");
        assert!(err.to_string().contains(words), "{err}");
        assert!(c.poll_transmit().is_none(), "nothing more is sent to it");
    }
}

#[test]
fn a_keyless_client_of_a_keyed_server_opens_only_its_keyless_services() {
    let key = Some(&b"sesame-sesame"[..]);
    let mut p = Pair::opening("public", None, key);
    p.drive(Duration::from_secs(1));
    assert!(p.client.is_established(), "{:?}", p.client_events);
    assert_eq!(
        p.server_events,
        vec![ServerEvent::Open {
            service: "public".into(),
            params: b"params".to_vec(),
            authenticated: false,
            ticket: None,
        }]
    );
    // One round trip: the Open rides with the hello.
    assert_eq!(p.elapsed(), LATENCY * 2);

    // Anything else needs the key; the client says so.
    let mut p = Pair::opening("test", None, key);
    p.drive(Duration::from_secs(1));
    assert_eq!(p.client_closed(), Some(&ConnError::AuthRequired));
    assert_eq!(p.server_closed(), Some(&ConnError::AuthRequired));
    assert!(!p
        .server_events
        .iter()
        .any(|e| matches!(e, ServerEvent::Open { .. })));
}

#[test]
fn a_client_with_the_key_is_authenticated_for_keyless_services_too() {
    let key = Some(&b"sesame-sesame"[..]);
    let mut p = Pair::opening("public", key, key);
    p.drive(Duration::from_secs(1));
    assert!(p.client.is_established());
    assert!(matches!(
        p.server_events[..],
        [ServerEvent::Open {
            authenticated: true,
            ..
        }]
    ));
}

#[test]
fn a_wrong_key_is_refused_even_for_keyless_services() {
    let mut p = Pair::opening("public", Some(b"wrong-wrong-wrong"), Some(b"sesame-sesame"));
    p.drive(Duration::from_secs(1));
    assert_eq!(p.server_closed(), Some(&ConnError::AuthFailed));
    assert!(!p.client.is_established());
}

/// A ticket book of one ticket, spendable once for "copy".
#[derive(Debug)]
struct OneTicket {
    id: crate::TicketId,
    key: Key,
    spent: std::sync::Mutex<bool>,
    until: Instant,
}

impl crate::Tickets for OneTicket {
    fn key(&self, id: &crate::TicketId, now: Instant) -> Option<Key> {
        (*id == self.id && now < self.until && !*self.spent.lock().unwrap())
            .then(|| self.key.clone())
    }
    fn redeem(&self, id: &crate::TicketId, service: &str, now: Instant) -> Option<Vec<u8>> {
        let mut spent = self.spent.lock().unwrap();
        if *id != self.id || now >= self.until || *spent || service != "copy" {
            return None;
        }
        *spent = true;
        Some(b"grant".to_vec())
    }
}

/// A pair whose client proves `client_ticket` against a server holding
/// `book` (and `server_key`).
fn ticket_pair(
    service: &str,
    client_ticket: Key,
    server_key: Option<&[u8]>,
    book: &std::sync::Arc<OneTicket>,
) -> Pair {
    let mut p = Pair::opening(service, None, server_key);
    p.client = ClientConn::new(
        ClientConfig {
            key: Some(client_ticket),
            service: service.into(),
            params: b"params".to_vec(),
            handshake_timeout: TIMEOUT * 2,
        },
        p.now,
        [0x11; 32],
    );
    p.server = ServerConn::new(
        &ServerConfig {
            key: server_key.map(|k| Key::new(k).unwrap()),
            preauth_timeout: TIMEOUT,
            keyless_services: vec!["public".into()],
            tickets: Some(book.clone() as std::sync::Arc<dyn crate::Tickets>),
        },
        p.now,
        [0x22; 32],
    );
    p.policy = Box::new(|_, _| Ok(COOKIE));
    p
}

#[test]
fn a_ticket_opens_one_session_of_its_service_once_on_keyed_and_keyless_servers() {
    for server_key in [Some(&b"sesame-sesame"[..]), None] {
        let book = std::sync::Arc::new(OneTicket {
            id: [7; 16],
            key: Key::new([9u8; 32]).unwrap(),
            spent: std::sync::Mutex::new(false),
            until: Instant::now() + Duration::from_secs(60),
        });
        let ticket = Key::ticket([7; 16], [9u8; 32]).unwrap();
        let mut p = ticket_pair("copy", ticket.clone(), server_key, &book);
        p.drive(Duration::from_secs(1));
        assert!(p.client.is_established(), "{:?}", p.client_events);
        assert_eq!(
            p.server_events,
            vec![ServerEvent::Open {
                service: "copy".into(),
                params: b"params".to_vec(),
                authenticated: false,
                ticket: Some(b"grant".to_vec()),
            }]
        );
        // Spent: a second session with it is refused.
        let mut p = ticket_pair("copy", ticket, server_key, &book);
        p.drive(Duration::from_secs(1));
        assert_eq!(p.server_closed(), Some(&ConnError::TicketRefused));
        assert!(p.client_closed().is_some_and(|e| e.is_auth()));
    }
}

#[test]
fn a_ticket_is_refused_with_a_wrong_key_for_another_service_or_without_a_book() {
    let fresh = || {
        std::sync::Arc::new(OneTicket {
            id: [7; 16],
            key: Key::new([9u8; 32]).unwrap(),
            spent: std::sync::Mutex::new(false),
            until: Instant::now() + Duration::from_secs(60),
        })
    };
    let wrong = Key::ticket([7; 16], [8u8; 32]).unwrap();
    let book = fresh();
    let mut p = ticket_pair("copy", wrong, None, &book);
    p.drive(Duration::from_secs(1));
    assert_eq!(p.server_closed(), Some(&ConnError::TicketRefused));
    assert!(!*book.spent.lock().unwrap(), "a wrong proof spends nothing");

    let right = Key::ticket([7; 16], [9u8; 32]).unwrap();
    let mut p = ticket_pair("test", right.clone(), None, &book);
    p.drive(Duration::from_secs(1));
    assert_eq!(p.server_closed(), Some(&ConnError::TicketRefused));
    assert!(!p
        .server_events
        .iter()
        .any(|e| matches!(e, ServerEvent::Open { .. })));

    // A server that issues no tickets refuses one.
    let mut p = Pair::opening("copy", None, None);
    p.client = ClientConn::new(
        ClientConfig {
            key: Some(right),
            service: "copy".into(),
            params: Vec::new(),
            handshake_timeout: TIMEOUT * 2,
        },
        p.now,
        [0x11; 32],
    );
    p.drive(Duration::from_secs(1));
    assert_eq!(p.server_closed(), Some(&ConnError::TicketRefused));
}
