//! Forced send buffers for large bodies on long paths, within one
//! server-wide budget.
//!
//! A file `GET` (a third-party copy's pull above all), or a `PUT` this
//! server or `fatpipe copy` sends (a third-party push), on a connection with
//! a long round trip would otherwise leave at the pace of the host's
//! send-buffer autotuning, a few MiB per round trip
//! ([`fatpipe_tune::respond`] has the rule and the figures). A server that
//! may force buffers (root, or `CAP_NET_ADMIN`) raises the connection's
//! send buffer to what the rule asks, once per connection and only
//! upwards. What it forces is counted against [`BUDGET`] for the life of
//! the connection: a peer that opens many connections and reads none of
//! what it asked for holds at most that much of the server's memory in
//! send buffers beyond autotuning (docs/security.md); past it, connections
//! keep the host's autotuning.

use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// The most send-buffer bytes forced at once, over every connection of
/// the process.
pub const BUDGET: u64 = 1 << 30;

static FORCED: AtomicU64 = AtomicU64::new(0);

/// Bytes forced on one connection, given back to the budget when dropped
/// (the connection's end).
#[derive(Debug, Default)]
pub(crate) struct Forced {
    bytes: u64,
}

impl Drop for Forced {
    fn drop(&mut self) {
        if self.bytes > 0 {
            FORCED.fetch_sub(self.bytes, Ordering::AcqRel);
        }
    }
}

/// Takes `n` bytes from the budget; false (nothing taken) if they do not fit.
fn reserve(n: u64) -> bool {
    FORCED
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
            used.checked_add(n).filter(|&u| u <= BUDGET)
        })
        .is_ok()
}

/// Whether this process may force buffers, and where the host's
/// autotuning stops: read once.
fn host() -> Option<u64> {
    static HOST: OnceLock<Option<u64>> = OnceLock::new();
    *HOST.get_or_init(|| {
        if fatpipe_sys::process::may_force_buffers() {
            fatpipe_tune::host::send_autotune_max()
        } else {
            None
        }
    })
}

/// Raises `sock`'s send buffer for a body of `body` bytes when the rule
/// asks for more than `held` already has and the budget allows; `held`
/// then owns the larger reservation.
pub(crate) fn widen(sock: &TcpStream, body: u64, held: &mut Forced) {
    let Some(autotune_max) = host() else { return };
    // A body autotuning carries anyway needs no round trip measured: most
    // GETs end here, before any system call.
    if body <= autotune_max / 2 {
        return;
    }
    let Some(rtt) = fatpipe_sys::tcp::tcp_info(sock)
        .ok()
        .and_then(|i| i.rtt_us)
        .map(|us| Duration::from_micros(u64::from(us)))
    else {
        return;
    };
    let Some(want) = fatpipe_tune::respond::send_buffer(rtt, body, autotune_max) else {
        return;
    };
    if want <= held.bytes {
        return;
    }
    let extra = want - held.bytes;
    if !reserve(extra) {
        return;
    }
    match fatpipe_sys::buffers::set_send_buffer(sock, want, true) {
        Ok(g) if g.forced => held.bytes = want,
        _ => {
            FORCED.fetch_sub(extra, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_never_exceeded_and_comes_back_when_a_connection_ends() {
        // The only test touching FORCED: others would race it.
        let base = FORCED.load(Ordering::Acquire);
        let half = (BUDGET - base) / 2;
        assert!(reserve(half));
        let a = Forced { bytes: half };
        assert!(reserve(half));
        let b = Forced { bytes: half };
        assert!(!reserve(BUDGET - base - 2 * half + 1), "past the budget");
        drop(a);
        assert!(reserve(1), "a connection's end gives its bytes back");
        FORCED.fetch_sub(1, Ordering::AcqRel);
        drop(b);
        assert_eq!(FORCED.load(Ordering::Acquire), base);
    }
}
