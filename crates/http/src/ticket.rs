//! One-time tickets: how a third-party copy between two fatpipe servers
//! moves its data over the copy protocol (the "leg") although the two
//! share no pre-shared key (docs/http.md, "The leg").
//!
//! The passive server's HTTP port issues a ticket to whoever may read a
//! file by HTTP's own rules (its token's scopes): asked with
//! `Fatpipe-Ticket: read` on a `HEAD` or `GET`, it answers
//! `Fatpipe-Ticket: v=1; port=P; id=…; key=…; export=…; path=…`. The
//! active server then opens one copy session on port `P` proving the key
//! (`TicketAuth`, docs/protocol.md), and that session may copy only that
//! file in that direction ([`fatpipe_transfer::grant::Grant`]).
//!
//! [`Book`] holds the tickets: each is spent by the first session that
//! opens with it, and dies after its time to live unspent; at most
//! [`MAX_TICKETS`] live at once (past it none is issued, and the copy goes
//! over HTTP). [`Offer::parse`] reads the answer's header, size-capped and
//! fuzzed (`fuzz/fuzz_targets/http_ticket.rs`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fatpipe_proto::Key;
use fatpipe_transfer::grant::Grant;
use fatpipe_transfer::wire::Direction;

/// The request header that asks for a ticket, and the answer's.
pub const HEADER: &str = "fatpipe-ticket";
/// The answer header that says the copy service serves this file, on
/// which port (every `HEAD`/`GET` of a file, asked or not).
pub const COPY_HEADER: &str = "fatpipe-copy";
/// The ticket format this server issues and takes.
pub const VERSION: u32 = 1;
/// How long an unspent ticket lives.
pub const TTL: Duration = Duration::from_secs(60);
/// The most tickets alive at once.
pub const MAX_TICKETS: usize = 4096;
/// The longest `Fatpipe-Ticket` answer read.
pub const MAX_OFFER: usize = 8192;
/// The service a ticket opens, once.
pub const SERVICE: &str = "copy";
/// The service a ticket may also open, a few times before it expires:
/// the path probe the copy's auto-tuning runs first (measurement traffic,
/// bounded by the probe's own caps; no file).
pub const PROBE: &str = "probe";
/// Probe sessions one ticket may open.
pub const MAX_PROBES: u8 = 4;

/// A ticket's id.
pub type Id = fatpipe_proto::TicketId;

#[derive(Debug)]
struct Entry {
    key: [u8; 32],
    grant: Vec<u8>,
    until: Instant,
    /// The copy session is still to come.
    copy: bool,
    /// Probe sessions left.
    probes: u8,
    /// Issued over HTTPS: opens only sessions encrypted with its key.
    encrypted: bool,
}

/// The server's live tickets (the HTTP port issues, the protocol port
/// spends). Time is the caller's: tests run it on a virtual clock.
#[derive(Debug)]
pub struct Book {
    live: Mutex<HashMap<Id, Entry>>,
    ttl: Duration,
    max: usize,
}

impl Default for Book {
    fn default() -> Book {
        Book::new(TTL, MAX_TICKETS)
    }
}

impl Book {
    /// A book whose tickets live `ttl`, at most `max` at once.
    pub fn new(ttl: Duration, max: usize) -> Book {
        Book {
            live: Mutex::new(HashMap::new()),
            ttl,
            max,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Id, Entry>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Issues a ticket for `grant`: its id and key, or `None` when
    /// [`MAX_TICKETS`] are alive (expired ones are dropped first) or the
    /// system has no randomness.
    pub fn issue(&self, grant: &Grant, now: Instant) -> Option<(Id, [u8; 32])> {
        self.issue_with(grant, now, false)
    }

    /// [`Book::issue`]; `encrypted`: the ticket opens only sessions
    /// encrypted with its key (it was issued over HTTPS).
    pub fn issue_with(
        &self,
        grant: &Grant,
        now: Instant,
        encrypted: bool,
    ) -> Option<(Id, [u8; 32])> {
        let mut live = self.lock();
        live.retain(|_, e| now < e.until);
        if live.len() >= self.max {
            return None;
        }
        let mut id: Id = [0; 16];
        let mut key = [0u8; 32];
        getrandom::fill(&mut id).ok()?;
        getrandom::fill(&mut key).ok()?;
        live.insert(
            id,
            Entry {
                key,
                grant: grant.encode(),
                until: now + self.ttl,
                copy: true,
                probes: MAX_PROBES,
                encrypted,
            },
        );
        Some((id, key))
    }

    /// Tickets alive (unspent, unexpired) at `now`.
    pub fn len(&self, now: Instant) -> usize {
        self.lock().values().filter(|e| now < e.until).count()
    }

    /// Whether none is alive at `now`.
    pub fn is_empty(&self, now: Instant) -> bool {
        self.len(now) == 0
    }
}

impl fatpipe_proto::Tickets for Book {
    fn encrypted_only(&self, id: &Id) -> bool {
        self.lock().get(id).is_some_and(|e| e.encrypted)
    }

    fn key(&self, id: &Id, now: Instant) -> Option<Key> {
        let live = self.lock();
        let e = live.get(id).filter(|e| now < e.until)?;
        Key::ticket(*id, e.key).ok()
    }

    /// The copy session spends the ticket's one copy; a probe session
    /// one of its [`MAX_PROBES`]; a ticket shown for any other service is
    /// gone.
    fn redeem(&self, id: &Id, service: &str, now: Instant) -> Option<Vec<u8>> {
        let mut live = self.lock();
        let e = live.get_mut(id).filter(|e| now < e.until)?;
        let out = match service {
            SERVICE if e.copy => {
                e.copy = false;
                Some(e.grant.clone())
            }
            PROBE if e.probes > 0 => {
                e.probes -= 1;
                Some(Vec::new())
            }
            SERVICE | PROBE => None,
            _ => {
                e.copy = false;
                e.probes = 0;
                None
            }
        };
        if !e.copy && e.probes == 0 {
            live.remove(id);
        }
        out
    }
}

/// The answer's `Fatpipe-Ticket`, as the active side reads it.
#[derive(Clone, PartialEq, Eq)]
pub struct Offer {
    /// The copy service's port on the same host.
    pub port: u16,
    /// The ticket's id.
    pub id: Id,
    /// The ticket's key.
    pub key: [u8; 32],
    /// The export the file is in.
    pub export: String,
    /// The file, relative to the export.
    pub path: Vec<u8>,
}

impl std::fmt::Debug for Offer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Offer")
            .field("port", &self.port)
            .field("export", &self.export)
            .field("path", &String::from_utf8_lossy(&self.path))
            .finish_non_exhaustive()
    }
}

/// Bytes written as they are in a header's `path=`; the rest as `%XX`.
const PATH_SET: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'/')
    .remove(b'.')
    .remove(b'-')
    .remove(b'_')
    .remove(b'~');

impl Offer {
    /// The header's value.
    pub fn header(&self) -> String {
        format!(
            "v={VERSION}; port={}; id={}; key={}; export={}; path={}",
            self.port,
            hex(&self.id),
            hex(&self.key),
            percent_encoding::utf8_percent_encode(&self.export, PATH_SET),
            percent_encoding::percent_encode(&self.path, PATH_SET)
        )
    }

    /// The key to prove on the copy port.
    pub fn key(&self) -> Option<Key> {
        Key::ticket(self.id, self.key).ok()
    }

    /// Reads a `Fatpipe-Ticket` answer: `;`-separated `name=value` pairs
    /// (unknown names ignored), at most [`MAX_OFFER`] bytes; `v` must be
    /// [`VERSION`]. One line why not.
    pub fn parse(value: &[u8]) -> Result<Offer, String> {
        if value.len() > MAX_OFFER {
            return Err(format!("longer than {MAX_OFFER} bytes"));
        }
        let s = std::str::from_utf8(value).map_err(|_| "not UTF-8".to_string())?;
        let (mut v, mut port, mut id, mut key, mut export, mut path) =
            (None, None, None, None, None, None);
        for item in s.split(';') {
            let Some((name, val)) = item.split_once('=') else {
                continue;
            };
            let val = val.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "v" => v = val.parse::<u32>().ok(),
                "port" => port = val.parse::<u16>().ok().filter(|&p| p != 0),
                "id" => id = unhex::<16>(val),
                "key" => key = unhex::<32>(val),
                "export" => {
                    export = percent_encoding::percent_decode_str(val)
                        .decode_utf8()
                        .ok()
                        .map(|c| c.into_owned())
                }
                "path" => {
                    path = Some(percent_encoding::percent_decode_str(val).collect::<Vec<u8>>())
                }
                _ => {}
            }
        }
        match v {
            Some(VERSION) => {}
            Some(n) => return Err(format!("ticket version {n} (this server takes {VERSION})")),
            None => return Err("no ticket version".into()),
        }
        let missing = |what: &str| format!("no valid {what}");
        let export = export
            .filter(|e| !e.is_empty())
            .ok_or_else(|| missing("export"))?;
        let path = path
            .filter(|p| fatpipe_transfer::relpath::RelPath::new(p).is_ok())
            .ok_or_else(|| missing("path"))?;
        Ok(Offer {
            port: port.ok_or_else(|| missing("port"))?,
            id: id.ok_or_else(|| missing("id"))?,
            key: key.ok_or_else(|| missing("key"))?,
            export,
            path,
        })
    }
}

/// The passive end's headers on a `HEAD` or `GET` of a file the request
/// may read: `Fatpipe-Copy` always, and a ticket to read it when asked
/// with `Fatpipe-Ticket: read` (none when the book is full: the copy then
/// goes over HTTP). `https`: the request came over HTTPS, so the ticket
/// opens only sessions encrypted with its key.
pub fn answer(
    leg: &crate::Passive,
    req: &hyper::HeaderMap,
    export: &str,
    path: &[u8],
    https: bool,
    h: &mut hyper::HeaderMap,
) {
    let Some(&port) = leg.port.get() else {
        return;
    };
    let copy = format!("v={VERSION}; port={port}");
    if let Ok(v) = hyper::header::HeaderValue::from_str(&copy) {
        h.insert(COPY_HEADER, v);
    }
    if asked(req) != Some(Direction::Pull) {
        return;
    }
    issue(leg, port, Direction::Pull, export, path, https, h);
}

/// What a request's `Fatpipe-Ticket` asks for: `read` a ticket to pull
/// the file, `write` one to push it; `None` for anything else.
pub fn asked(req: &hyper::HeaderMap) -> Option<Direction> {
    let v = req.get(HEADER)?.as_bytes().trim_ascii();
    if v.eq_ignore_ascii_case(b"read") {
        Some(Direction::Pull)
    } else if v.eq_ignore_ascii_case(b"write") {
        Some(Direction::Push)
    } else {
        None
    }
}

/// The passive end's headers on an `OPTIONS` with `Fatpipe-Ticket: write`
/// for a file the request may write (checked by the caller as a `PUT`
/// is): `Fatpipe-Copy`, and a ticket to push that one file (none when the
/// book is full: the copy then goes over HTTP).
pub fn answer_write(
    leg: &crate::Passive,
    export: &str,
    path: &[u8],
    https: bool,
    h: &mut hyper::HeaderMap,
) {
    let Some(&port) = leg.port.get() else {
        return;
    };
    let copy = format!("v={VERSION}; port={port}");
    if let Ok(v) = hyper::header::HeaderValue::from_str(&copy) {
        h.insert(COPY_HEADER, v);
    }
    issue(leg, port, Direction::Push, export, path, https, h);
}

fn issue(
    leg: &crate::Passive,
    port: u16,
    direction: Direction,
    export: &str,
    path: &[u8],
    https: bool,
    h: &mut hyper::HeaderMap,
) {
    let grant = Grant {
        direction,
        export: export.to_string(),
        path: path.to_vec(),
    };
    let Some((id, key)) = leg.book.issue_with(&grant, Instant::now(), https) else {
        return;
    };
    let offer = Offer {
        port,
        id,
        key,
        export: grant.export,
        path: grant.path,
    };
    if let Ok(v) = hyper::header::HeaderValue::from_str(&offer.header()) {
        h.insert(HEADER, v);
        // A secret: no cache may keep it.
        h.insert(
            hyper::header::CACHE_CONTROL,
            hyper::header::HeaderValue::from_static("no-store"),
        );
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != N * 2 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[i * 2..i * 2 + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fatpipe_proto::Tickets as _;

    fn grant(path: &str) -> Grant {
        Grant {
            direction: Direction::Pull,
            export: "data".into(),
            path: path.as_bytes().to_vec(),
        }
    }

    #[test]
    fn a_ticket_is_spent_once_and_only_for_copy() {
        let book = Book::default();
        let t0 = Instant::now();
        let (id, key) = book.issue(&grant("f"), t0).unwrap();
        assert_eq!(book.key(&id, t0), Key::ticket(id, key).ok());
        assert_eq!(book.redeem(&id, "probe", t0), Some(Vec::new()));
        assert_eq!(book.redeem(&id, "copy", t0), Some(grant("f").encode()));
        // Reused: refused.
        assert_eq!(book.redeem(&id, "copy", t0), None);
        // The probes it has left, then nothing.
        for _ in 1..MAX_PROBES {
            assert_eq!(book.redeem(&id, "probe", t0), Some(Vec::new()));
        }
        assert_eq!(book.redeem(&id, "probe", t0), None);
        assert_eq!(book.key(&id, t0), None, "gone once all is spent");
        // Shown for another service: refused, and spent whole.
        let (id, _) = book.issue(&grant("f"), t0).unwrap();
        assert_eq!(book.redeem(&id, "test", t0), None);
        assert_eq!(book.redeem(&id, "copy", t0), None);
        assert_eq!(book.redeem(&id, "probe", t0), None);
        // An id never issued.
        assert_eq!(book.key(&[0; 16], t0), None);
    }

    #[test]
    fn a_ticket_expires_and_expired_ones_make_room() {
        let book = Book::new(Duration::from_secs(60), 2);
        let t0 = Instant::now();
        let (a, _) = book.issue(&grant("a"), t0).unwrap();
        let later = t0 + Duration::from_secs(30);
        let (b, _) = book.issue(&grant("b"), later).unwrap();
        assert_eq!(book.issue(&grant("c"), later), None, "full");
        let at_60 = t0 + Duration::from_secs(60);
        assert_eq!(book.key(&a, at_60), None, "expired");
        assert_eq!(book.redeem(&a, "copy", at_60), None);
        assert!(book.key(&b, at_60).is_some());
        assert_eq!(book.len(at_60), 1);
        assert!(book.issue(&grant("c"), at_60).is_some(), "room again");
        assert_eq!(
            book.redeem(&b, "copy", t0 + Duration::from_secs(91)),
            None,
            "b expired at 90 s"
        );
    }

    #[test]
    fn an_offer_round_trips_and_bad_ones_say_why() {
        let o = Offer {
            port: 5301,
            id: [0xab; 16],
            key: [7; 32],
            export: "data".into(),
            path: b"dir/a b;c=%.bin".to_vec(),
        };
        let h = o.header();
        assert!(!h.contains(' ') || h.contains("; "), "{h}");
        assert_eq!(Offer::parse(h.as_bytes()), Ok(o.clone()));
        assert!(!format!("{o:?}").contains("key"), "the key is not shown");
        let without = |k: &str| {
            h.split("; ")
                .filter(|p| !p.starts_with(k))
                .collect::<Vec<_>>()
                .join("; ")
        };
        for k in ["v=", "port=", "id=", "key=", "export=", "path="] {
            assert!(Offer::parse(without(k).as_bytes()).is_err(), "{k}");
        }
        assert!(Offer::parse(h.replace("v=1", "v=2").as_bytes())
            .unwrap_err()
            .contains("version 2"));
        assert!(Offer::parse(h.replace("path=dir", "path=../dir").as_bytes()).is_err());
        assert!(Offer::parse(&vec![b'a'; MAX_OFFER + 1]).is_err());
        assert!(Offer::parse(b"\xff").is_err());
    }

    #[test]
    fn a_request_asks_to_read_or_to_write_and_nothing_else() {
        let with = |v: &str| {
            let mut h = hyper::HeaderMap::new();
            h.insert(HEADER, hyper::header::HeaderValue::from_str(v).unwrap());
            asked(&h)
        };
        assert_eq!(with("read"), Some(Direction::Pull));
        assert_eq!(with(" Write "), Some(Direction::Push));
        assert_eq!(with("readwrite"), None);
        assert_eq!(asked(&hyper::HeaderMap::new()), None);
    }

    #[test]
    fn a_write_ticket_grants_a_push_of_its_file_only() {
        let leg = crate::Passive {
            port: std::sync::Arc::new(std::sync::OnceLock::new()),
            book: std::sync::Arc::new(Book::default()),
        };
        let mut h = hyper::HeaderMap::new();
        answer_write(&leg, "data", b"f", false, &mut h);
        assert!(h.is_empty(), "no port yet: nothing offered");
        leg.port.set(5301).unwrap();
        answer_write(&leg, "data", b"dir/f", false, &mut h);
        assert_eq!(h.get(COPY_HEADER).unwrap(), "v=1; port=5301");
        let offer = Offer::parse(h.get(HEADER).unwrap().as_bytes()).unwrap();
        assert_eq!(h.get(hyper::header::CACHE_CONTROL).unwrap(), "no-store");
        assert!(
            !leg.book.encrypted_only(&offer.id),
            "issued over plain HTTP"
        );
        let g =
            Grant::decode(&leg.book.redeem(&offer.id, SERVICE, Instant::now()).unwrap()).unwrap();
        assert_eq!(g.direction, Direction::Push);
        assert_eq!(
            (g.export.as_str(), g.path.as_slice()),
            ("data", &b"dir/f"[..])
        );
        // A read request on the same file gets a pull grant instead.
        let mut req = hyper::HeaderMap::new();
        req.insert(HEADER, hyper::header::HeaderValue::from_static("read"));
        let mut h = hyper::HeaderMap::new();
        answer(&leg, &req, "data", b"dir/f", true, &mut h);
        let offer = Offer::parse(h.get(HEADER).unwrap().as_bytes()).unwrap();
        let g =
            Grant::decode(&leg.book.redeem(&offer.id, SERVICE, Instant::now()).unwrap()).unwrap();
        assert_eq!(g.direction, Direction::Pull);
        // Over HTTPS: it opens only encrypted sessions (an HTTP one not).
        assert!(leg.book.encrypted_only(&offer.id));
        // A GET/HEAD never issues a write ticket.
        req.insert(HEADER, hyper::header::HeaderValue::from_static("write"));
        let mut h = hyper::HeaderMap::new();
        answer(&leg, &req, "data", b"dir/f", true, &mut h);
        assert!(h.get(HEADER).is_none());
    }
}
