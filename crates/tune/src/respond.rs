//! What a server sets on a connection that answers with a large body (the
//! HTTP port's file `GET`s, which a third-party copy's pulls are): a send
//! buffer big enough for the body to leave in one round trip on a long
//! path, where the host's autotuning would stop short of it.
//!
//! Linux autotunes a socket's send buffer up to `net.ipv4.tcp_wmem[2]`
//! (4 MiB by default), of which roughly half carries payload. A client on
//! the other side of 93 ms that asks for an 8 MiB file then gets it in
//! three round trips, however wide its window: measured on a 1 Gbit/s ×
//! 93 ms lab link, an 8 MiB `GET` on a warm connection took 310 ms with
//! the default limit and 175 ms with the limit raised (the wire time is
//! 67 ms). FTS issues one `COPY` per file, so a dataset of small files is
//! paid in those round trips. A server that may force its buffers (root,
//! or `CAP_NET_ADMIN`) sizes the send buffer from the connection's round
//! trip and the body instead; the caller bounds the total it forces.

use std::time::Duration;

/// Below this round trip the host's autotuning already lets a few MiB
/// leave per round trip fast enough: nothing is forced.
pub const MIN_RTT: Duration = Duration::from_millis(5);

/// The rate a forced buffer is sized for when the body is larger than what
/// one round trip carries: 10 Gbit/s, in bytes per second.
pub const SIZED_FOR: u64 = 10_000_000_000 / 8;

/// The largest send buffer forced for one connection.
pub const MAX_FORCED: u64 = 64 << 20;

/// The send buffer (payload bytes, what `SO_SNDBUF` is given) to force for
/// a body of `body` bytes on a connection whose smoothed round trip is
/// `rtt`, on a host whose autotuning stops at `autotune_max`
/// (`tcp_wmem[2]`, of which about half is payload); `None` when
/// autotuning does as well (a short path, a small body, a generous host).
///
/// The buffer holds what should be in flight in one round trip: the whole
/// body when it fits in a round trip at [`SIZED_FOR`], else that round
/// trip's worth; at most [`MAX_FORCED`].
pub fn send_buffer(rtt: Duration, body: u64, autotune_max: u64) -> Option<u64> {
    if rtt < MIN_RTT {
        return None;
    }
    let per_rtt = (rtt.as_secs_f64() * SIZED_FOR as f64) as u64;
    let want = body.min(per_rtt).min(MAX_FORCED);
    (want > autotune_max / 2).then_some(want)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const DEFAULT_MAX: u64 = 4 * MIB;

    #[test]
    fn sizes_for_the_body_or_a_round_trip_only_past_what_autotuning_reaches() {
        let ms = Duration::from_millis;
        // (rtt, body, host max, forced)
        let cases = [
            // An 8 MiB file at 93 ms: all of it in one round trip.
            (ms(93), 8 * MIB, DEFAULT_MAX, Some(8 * MIB)),
            // A large file at 93 ms: a round trip at 10 Gbit/s, capped.
            (ms(93), 1 << 34, DEFAULT_MAX, Some(MAX_FORCED)),
            // At 20 ms a round trip at 10 Gbit/s is 25 MB.
            (ms(20), 1 << 34, DEFAULT_MAX, Some(25_000_000)),
            // Small bodies fit what autotuning gives.
            (ms(93), MIB, DEFAULT_MAX, None),
            (ms(93), 2 * MIB, DEFAULT_MAX, None),
            // A short path: autotuning keeps up.
            (ms(1), 1 << 34, DEFAULT_MAX, None),
            // A host already tuned for long paths (tcp_wmem 256 MiB).
            (ms(93), 1 << 34, 256 * MIB, None),
            // Just past half the host's maximum.
            (ms(93), 2 * MIB + 1, DEFAULT_MAX, Some(2 * MIB + 1)),
        ];
        for (rtt, body, max, want) in cases {
            assert_eq!(send_buffer(rtt, body, max), want, "{rtt:?} {body} {max}");
        }
    }
}
