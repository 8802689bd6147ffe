//! Encrypted connections keyed by a one-time ticket (the leg of an
//! `https` third-party copy; docs/protocol.md, "Tickets"; the TLS side is
//! [`fatpipe_secure::ticket`]).
//!
//! A connection whose `ClientHello` names a ticket (`<id>.ticket.fatpipe`)
//! gets the TLS identity derived from that ticket's key, if the ticket is
//! live, or if a session that ticket opened is still running (its data
//! connections come later, possibly after the ticket expired). Such a
//! connection is *keyed by* the ticket, and:
//! - it may prove only that ticket (`TicketAuth`; no other ticket, no
//!   keyless service) and open only a session with it ([`only`]);
//! - a session opened on it takes only data connections keyed by the same
//!   ticket (and a session opened otherwise takes none keyed by a ticket).
//!
//! Bounds: the identities kept for running sessions are one per running
//! ticket session (at most the server's session cap), dropped when the
//! last session of the ticket ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use fatpipe_proto::{Key, ServerConfig, TicketId, Tickets};
use fatpipe_secure::tls::{ServerTls, TlsError};

use crate::control::lock;

/// What keyed a connection: the ticket and the identity it was given.
#[derive(Clone)]
pub(crate) struct Keyed {
    pub(crate) id: TicketId,
    pub(crate) tls: ServerTls,
}

/// The identities of tickets whose sessions are running, with how many
/// run.
#[derive(Default)]
pub(crate) struct Running(Mutex<HashMap<TicketId, (ServerTls, usize)>>);

impl Running {
    /// The identity for ticket `id`: a running session's, else the live
    /// ticket's (derived now); `None` for a ticket neither running nor
    /// live.
    pub(crate) fn identity(
        &self,
        tickets: Option<&Arc<dyn Tickets>>,
        id: &TicketId,
        now: Instant,
    ) -> Result<ServerTls, TlsError> {
        if let Some((tls, _)) = lock(&self.0).get(id) {
            return Ok(tls.clone());
        }
        let key = tickets
            .and_then(|t| t.key(id, now))
            .ok_or_else(|| TlsError::Identity("no such ticket".into()))?;
        ServerTls::ticket(id, key.as_bytes())
    }

    /// Keeps `k`'s identity while the guard lives (a session it opened).
    pub(crate) fn hold<'a>(&'a self, k: &Keyed) -> Held<'a> {
        lock(&self.0)
            .entry(k.id)
            .or_insert_with(|| (k.tls.clone(), 0))
            .1 += 1;
        Held(self, k.id)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.0).len()
    }
}

/// A running session's hold on its ticket's identity.
pub(crate) struct Held<'a>(&'a Running, TicketId);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut m = lock(&(self.0).0);
        if let Some(e) = m.get_mut(&self.1) {
            e.1 = e.1.saturating_sub(1);
            if e.1 == 0 {
                m.remove(&self.1);
            }
        }
    }
}

/// The handshake configuration of a connection keyed by ticket `id`: it
/// may prove that ticket only, and opens no keyless service.
pub(crate) fn only(config: &ServerConfig, id: TicketId) -> ServerConfig {
    ServerConfig {
        tickets: config
            .tickets
            .clone()
            .map(|inner| Arc::new(Only { id, inner }) as Arc<dyn Tickets>),
        keyless_services: Vec::new(),
        ..config.clone()
    }
}

/// The handshake configuration of a connection not keyed by a ticket
/// (plain, or encrypted with the pre-shared key): it may prove no ticket
/// that opens only sessions encrypted with its own key. `None` when the
/// server takes no tickets (the shared configuration serves).
pub(crate) fn unkeyed(config: &ServerConfig) -> Option<ServerConfig> {
    let inner = config.tickets.clone()?;
    Some(ServerConfig {
        tickets: Some(Arc::new(Clear { inner })),
        ..config.clone()
    })
}

/// A ticket book without the tickets that open only encrypted sessions.
#[derive(Debug)]
struct Clear {
    inner: Arc<dyn Tickets>,
}

impl Tickets for Clear {
    fn key(&self, id: &TicketId, now: Instant) -> Option<Key> {
        (!self.inner.encrypted_only(id))
            .then(|| self.inner.key(id, now))
            .flatten()
    }

    fn redeem(&self, id: &TicketId, service: &str, now: Instant) -> Option<Vec<u8>> {
        (!self.inner.encrypted_only(id))
            .then(|| self.inner.redeem(id, service, now))
            .flatten()
    }
}

/// A ticket book narrowed to one ticket.
#[derive(Debug)]
struct Only {
    id: TicketId,
    inner: Arc<dyn Tickets>,
}

impl Tickets for Only {
    fn key(&self, id: &TicketId, now: Instant) -> Option<Key> {
        (*id == self.id).then(|| self.inner.key(id, now)).flatten()
    }

    fn redeem(&self, id: &TicketId, service: &str, now: Instant) -> Option<Vec<u8>> {
        (*id == self.id)
            .then(|| self.inner.redeem(id, service, now))
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Two;

    impl Tickets for Two {
        fn key(&self, id: &TicketId, _: Instant) -> Option<Key> {
            (id[0] < 2).then(|| Key::ticket(*id, vec![id[0]; 32]).ok())?
        }
        fn redeem(&self, id: &TicketId, _: &str, _: Instant) -> Option<Vec<u8>> {
            (id[0] < 2).then(Vec::new)
        }
        fn encrypted_only(&self, id: &TicketId) -> bool {
            id[0] == 1
        }
    }

    #[test]
    fn a_keyed_connection_proves_only_its_ticket() {
        let book: Arc<dyn Tickets> = Arc::new(Two);
        let config = ServerConfig {
            key: None,
            preauth_timeout: std::time::Duration::from_secs(1),
            keyless_services: vec!["probe".into()],
            tickets: Some(book),
        };
        let narrowed = only(&config, [1; 16]);
        let t = narrowed.tickets.as_ref().unwrap();
        let now = Instant::now();
        assert!(t.key(&[1; 16], now).is_some());
        assert!(t.key(&[0; 16], now).is_none(), "another live ticket");
        assert!(t.redeem(&[0; 16], "copy", now).is_none());
        assert!(t.redeem(&[1; 16], "copy", now).is_some());
        assert!(narrowed.keyless_services.is_empty());
        // Not keyed by a ticket: the ticket that opens only encrypted
        // sessions is not there, the other is.
        let clear = unkeyed(&config).unwrap();
        let t = clear.tickets.as_ref().unwrap();
        assert!(t.key(&[1; 16], now).is_none());
        assert!(t.redeem(&[1; 16], "copy", now).is_none());
        assert!(t.key(&[0; 16], now).is_some());
        assert_eq!(clear.keyless_services, config.keyless_services);
        let none = ServerConfig {
            tickets: None,
            ..config.clone()
        };
        assert!(unkeyed(&none).is_none());
    }

    #[test]
    fn a_running_sessions_identity_outlives_its_ticket_and_then_goes() {
        let book: Arc<dyn Tickets> = Arc::new(Two);
        let running = Running::default();
        let now = Instant::now();
        // Live: derived; unknown: refused.
        let tls = running.identity(Some(&book), &[1; 16], now).unwrap();
        assert!(running.identity(Some(&book), &[7; 16], now).is_err());
        assert!(running.identity(None, &[1; 16], now).is_err());
        // A session of ticket 7 (its ticket gone from the book) keeps
        // its identity while it runs, twice held, then it is gone.
        let k = Keyed { id: [7; 16], tls };
        let a = running.hold(&k);
        let b = running.hold(&k);
        assert!(running.identity(Some(&book), &[7; 16], now).is_ok());
        drop(a);
        assert!(running.identity(Some(&book), &[7; 16], now).is_ok());
        drop(b);
        assert_eq!(running.len(), 0);
        assert!(running.identity(Some(&book), &[7; 16], now).is_err());
    }
}
