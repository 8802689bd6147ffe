//! Rate-limited log summaries of the events a flood produces.
//!
//! A peer can make the server time out, fail or refuse a connection
//! thousands of times a second; a log line each would fill the disk and
//! bury the lines that matter. So these events are counted here and
//! written once per window per kind: "last 10 s: 1,234 pre-auth timeouts
//! from 127.0.0.2 (and 3 other addresses)". The summariser is pure (the
//! caller passes `now`), so the tests drive it on a virtual clock; the
//! server feeds it events and polls it from its watchdog thread.
//!
//! Every port of the server feeds the one summariser; an event on a port
//! other than the fatpipe protocol's names it ("on the iperf3 port").
//!
//! Its memory is bounded: at most [`MAX_ADDRESSES`] distinct addresses are
//! counted by name per kind, port and window; more only add to a count of
//! other addresses.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// How long events are gathered before their summary line.
pub const WINDOW: Duration = Duration::from_secs(10);

/// Distinct addresses remembered per kind and window.
pub const MAX_ADDRESSES: usize = 1024;

/// What happened to one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Event {
    /// The handshake did not finish before the pre-auth deadline.
    PreauthTimeout,
    /// The handshake failed (bad frame, wrong key, unexpected message).
    HandshakeFailed,
    /// Dropped unread: the source or the server had too many handshakes
    /// in flight.
    HandshakeCap,
    /// Refused: the source or the server had too many sessions.
    SessionCap,
    /// Refused: the server had too many data connections attached.
    StreamCap,
    /// An opened session did not start its work before the start deadline.
    NeverStarted,
}

impl Event {
    /// The plural noun of the summary line.
    fn noun(self) -> &'static str {
        match self {
            Event::PreauthTimeout => "pre-auth timeouts",
            Event::HandshakeFailed => "failed handshakes",
            Event::HandshakeCap => "connections dropped at the handshake limit",
            Event::SessionCap => "sessions refused at the session limit",
            Event::StreamCap => "data connections refused at the stream limit",
            Event::NeverStarted => "sessions ended for not starting",
        }
    }
}

/// Counts events and says, once per window, what they were.
#[derive(Debug)]
pub struct Summariser {
    window: Duration,
    start: Option<Instant>,
    /// By kind and port (`""`: the fatpipe protocol's).
    kinds: HashMap<(Event, &'static str), Kind>,
}

#[derive(Debug, Default)]
struct Kind {
    total: u64,
    by_addr: HashMap<IpAddr, u64>,
    /// Events from addresses past [`MAX_ADDRESSES`].
    unnamed: u64,
}

impl Default for Summariser {
    fn default() -> Self {
        Summariser::new(WINDOW)
    }
}

impl Summariser {
    /// Summaries every `window`.
    pub fn new(window: Duration) -> Summariser {
        Summariser {
            window,
            start: None,
            kinds: HashMap::new(),
        }
    }

    /// Counts one event from `addr`; returns the lines of a window that
    /// ended before `now`, if one did.
    pub fn record(&mut self, now: Instant, event: Event, addr: IpAddr) -> Vec<String> {
        self.record_on(now, "", event, addr)
    }

    /// As [`record`](Self::record), for an event on the port named `port`
    /// (`""` for the fatpipe protocol's, whose lines name no port).
    pub fn record_on(
        &mut self,
        now: Instant,
        port: &'static str,
        event: Event,
        addr: IpAddr,
    ) -> Vec<String> {
        let lines = self.poll(now);
        self.start.get_or_insert(now);
        let kind = self.kinds.entry((event, port)).or_default();
        kind.total = kind.total.saturating_add(1);
        if let Some(n) = kind.by_addr.get_mut(&addr) {
            *n = n.saturating_add(1);
        } else if kind.by_addr.len() < MAX_ADDRESSES {
            kind.by_addr.insert(addr, 1);
        } else {
            kind.unnamed = kind.unnamed.saturating_add(1);
        }
        lines
    }

    /// The summary lines, one per kind, if the window that began with the
    /// first counted event has ended by `now`; then starts afresh.
    pub fn poll(&mut self, now: Instant) -> Vec<String> {
        match self.start {
            Some(s) if now.saturating_duration_since(s) >= self.window => self.flush(now),
            _ => Vec::new(),
        }
    }

    /// The summary lines of what was counted so far, now (at shutdown):
    /// "last N s" names the time since the window began, at most the
    /// window.
    pub fn flush(&mut self, now: Instant) -> Vec<String> {
        let span = match self.start.take() {
            Some(s) => now.saturating_duration_since(s).min(self.window),
            None => self.window,
        };
        let mut kinds: Vec<_> = self.kinds.drain().collect();
        kinds.sort_by_key(|(e, _)| *e);
        kinds
            .into_iter()
            .map(|((event, port), kind)| line(span, event, port, &kind))
            .collect()
    }
}

fn line(window: Duration, event: Event, port: &str, kind: &Kind) -> String {
    let mut s = format!(
        "last {} s: {} {}",
        // Whole seconds, rounded up: a partial window at shutdown is not "0 s".
        window.as_millis().div_ceil(1000),
        thousands(kind.total),
        event.noun()
    );
    if !port.is_empty() {
        let _ = write!(s, " on the {port} port");
    }
    // The address with the most events, ties to the lowest for stable text.
    if let Some((addr, _)) = kind
        .by_addr
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
    {
        let _ = write!(s, " from {addr}");
        let others = kind.by_addr.len() - 1;
        match (others, kind.unnamed > 0) {
            (0, false) => {}
            (n, false) => {
                let _ = write!(s, " (and {n} other address{})", plural(n));
            }
            (n, true) => {
                let _ = write!(s, " (and more than {n} other addresses)");
            }
        }
    }
    s
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "es"
    }
}

/// `1234567` as `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn nothing_is_said_before_the_window_ends() {
        let t0 = Instant::now();
        let mut s = Summariser::new(Duration::from_secs(10));
        for i in 0..1000 {
            let now = t0 + Duration::from_millis(i * 9);
            assert!(s
                .record(now, Event::PreauthTimeout, ip("127.0.0.2"))
                .is_empty());
        }
        assert!(s.poll(t0 + Duration::from_millis(9_999)).is_empty());
        assert_eq!(
            s.poll(t0 + Duration::from_secs(10)),
            ["last 10 s: 1,000 pre-auth timeouts from 127.0.0.2"]
        );
        assert!(s.poll(t0 + Duration::from_secs(30)).is_empty(), "said once");
    }

    #[test]
    fn one_line_per_kind_naming_the_loudest_address_and_counting_the_rest() {
        let t0 = Instant::now();
        let mut s = Summariser::new(Duration::from_secs(10));
        for _ in 0..1234 {
            s.record(t0, Event::PreauthTimeout, ip("127.0.0.2"));
        }
        for a in ["10.0.0.1", "10.0.0.2", "::1"] {
            s.record(t0, Event::PreauthTimeout, ip(a));
        }
        s.record(t0, Event::SessionCap, ip("10.0.0.9"));
        s.record(t0, Event::SessionCap, ip("10.0.0.8"));
        let lines = s.record(
            t0 + Duration::from_secs(11),
            Event::HandshakeFailed,
            ip("::1"),
        );
        assert_eq!(
            lines,
            [
                "last 10 s: 1,237 pre-auth timeouts from 127.0.0.2 (and 3 other addresses)",
                "last 10 s: 2 sessions refused at the session limit from 10.0.0.8 (and 1 other address)",
            ]
        );
        // The event that ended the window opens the next one.
        assert_eq!(
            s.poll(t0 + Duration::from_secs(21)),
            ["last 10 s: 1 failed handshakes from ::1"]
        );
    }

    #[test]
    fn addresses_past_the_cap_are_counted_not_stored() {
        let t0 = Instant::now();
        let mut s = Summariser::new(Duration::from_secs(10));
        for i in 0..(MAX_ADDRESSES as u32 + 500) {
            s.record(t0, Event::HandshakeCap, IpAddr::from(i.to_be_bytes()));
        }
        s.record(t0, Event::HandshakeCap, ip("0.0.0.7"));
        assert_eq!(
            s.kinds[&(Event::HandshakeCap, "")].by_addr.len(),
            MAX_ADDRESSES
        );
        assert_eq!(
            s.flush(t0 + Duration::from_secs(10)),
            [format!(
                "last 10 s: 1,525 connections dropped at the handshake limit from 0.0.0.7 \
                 (and more than {} other addresses)",
                MAX_ADDRESSES - 1
            )]
        );
    }

    #[test]
    fn a_flush_at_shutdown_names_the_part_of_the_window_that_passed() {
        let t0 = Instant::now();
        let mut s = Summariser::new(Duration::from_secs(10));
        s.record(t0, Event::NeverStarted, ip("127.0.0.2"));
        assert_eq!(
            s.flush(t0 + Duration::from_millis(2_500)),
            ["last 3 s: 1 sessions ended for not starting from 127.0.0.2"]
        );
        assert!(s.flush(t0 + Duration::from_secs(3)).is_empty());
    }

    #[test]
    fn events_on_another_port_are_counted_apart_and_name_it() {
        let t0 = Instant::now();
        let mut s = Summariser::new(Duration::from_secs(10));
        s.record(t0, Event::PreauthTimeout, ip("127.0.0.2"));
        s.record_on(t0, "iperf3", Event::PreauthTimeout, ip("127.0.0.2"));
        s.record_on(t0, "iperf3", Event::PreauthTimeout, ip("127.0.0.3"));
        assert_eq!(
            s.flush(t0 + Duration::from_secs(10)),
            [
                "last 10 s: 1 pre-auth timeouts from 127.0.0.2",
                "last 10 s: 2 pre-auth timeouts on the iperf3 port from 127.0.0.2 \
                 (and 1 other address)",
            ]
        );
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(u64::MAX), "18,446,744,073,709,551,615");
    }
}
