//! Warm pairs: FTS issues one `COPY` per file, so consecutive copies from
//! the same peer reuse the connections the last one opened, their TCP
//! windows already open, instead of paying a handshake and a slow start
//! each time.
//!
//! The copies' HTTP connections are driven by one runtime shared by every
//! copy ([`runtime`], two worker threads), so a connection outlives the
//! copy that opened it; a copy whose last request on a connection ended
//! cleanly gives it back ([`put`]), the next copy to the same peer takes
//! it ([`take`]). Bounded: [`PER_PEER`] idle connections per peer,
//! [`TOTAL`] in all, each dropped after [`IDLE`] unused (and whenever the
//! peer closed it).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::client::{Connection, Url};

/// Idle connections kept per peer.
pub const PER_PEER: usize = 32;
/// Idle connections kept in all.
pub const TOTAL: usize = 256;
/// An idle connection is dropped after this long.
pub const IDLE: Duration = Duration::from_secs(30);

type Key = (bool, String, u16);
type Idle = HashMap<Key, Vec<(Connection, Instant)>>;

fn key(url: &Url) -> Key {
    (url.tls, url.host.to_ascii_lowercase(), url.port)
}

static POOL: OnceLock<Mutex<Idle>> = OnceLock::new();
static RUNTIME: OnceLock<Option<tokio::runtime::Runtime>> = OnceLock::new();

/// The runtime every copy's connections run on (built at the first copy);
/// `None` if it could not be built (copies then fail with a line).
pub fn runtime() -> Option<&'static tokio::runtime::Runtime> {
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("http-tpc-io")
                .enable_all()
                .build()
                .ok()
        })
        .as_ref()
}

fn pool() -> std::sync::MutexGuard<'static, Idle> {
    POOL.get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// An idle connection to `url`'s server, if one is kept.
pub fn take(url: &Url) -> Option<Connection> {
    let mut p = pool();
    let list = p.get_mut(&key(url))?;
    while let Some((c, at)) = list.pop() {
        if at.elapsed() < IDLE && !c.is_closed() {
            return Some(c);
        }
    }
    None
}

/// Keeps a connection whose last request ended cleanly, for the next copy.
pub fn put(c: Connection) {
    if c.is_closed() {
        return;
    }
    let mut p = pool();
    let now = Instant::now();
    for list in p.values_mut() {
        list.retain(|(c, at)| now.duration_since(*at) < IDLE && !c.is_closed());
    }
    p.retain(|_, l| !l.is_empty());
    let total: usize = p.values().map(Vec::len).sum();
    let list = p.entry(key(&c.url)).or_default();
    if list.len() < PER_PEER && total < TOTAL {
        list.push((c, now));
    }
}
