//! The probe service's messages: UDP probe packets (binary) and control
//! messages (JSON over the session's control channel).
//!
//! **UDP packets** are what is timed, so they are small fixed binary
//! headers that cost nothing to build at line rate: magic `FPPB`, version,
//! kind, then the kind's fields (big-endian). MTU probes and train packets
//! are padded to the size under test; the padding is ignored. The session's
//! cookie in [`Packet::Hello`] is what lets the server accept the client's
//! UDP address: a datagram from anywhere else is dropped unread.
//!
//! **Control messages** ([`ProbeMsg`]) are JSON, like the test service's:
//! they are few, not timed, and readable in a capture; the frame cap
//! (64 KiB) bounds what `serde_json` parses, and [`ProbeMsg::decode`]
//! checks the lengths serde cannot (arrivals per train).
//!
//! Both decoders read untrusted bytes, never panic, and are fuzzed
//! (`fuzz/fuzz_targets/probe_msg.rs`).
//!
//! The exchange: `Open("probe", ProbeParams)` → `Ready{udp_port, limits}` →
//! UDP `Hello` ⇄ `HelloAck` → `Echo` ⇄ `EchoReply` (RTT) → `Mtu` ⇄ `MtuAck`
//! (path MTU) → `Train` packets, each train answered by a `TrainAck` →
//! control `Collect` → `Train` reports, one per train, then `Collected` →
//! `Done`.
//!
//! **Pipelined** (`ProbeParams { pipelined: true }`, granted by `Ready {
//! pipelined: true }`): the client sends `Collect { wait_for, wait_ms }`
//! right behind a round's last train instead of a round trip after its
//! `TrainAck`; the server holds the reports until that train's last packet
//! is in (or `wait_ms` passes). The reports go in the packed binary form
//! ([`ProbeMsg::encode_packed`]: varint deltas, 3–5 bytes an arrival
//! instead of about 30 in JSON), so a round's timestamps fit the control
//! connection's first congestion window instead of taking several round
//! trips of slow start. An older server leaves `pipelined` out of `Ready`,
//! and the client then collects as before.
//!
//! **Reverse** (`ProbeParams { reverse: true }`, answered by `Ready {
//! reverse: true }`): the server sends the trains and the client times
//! them, to measure the server → client direction. The server answers the
//! UDP `Hello` with `HelloToken { token }` (a random number) instead of
//! `HelloAck`; the client asks for trains on the control channel with
//! `SendTrains { token, … }`, which proves it receives at the UDP address
//! the trains will go to (so an authenticated client cannot aim them at a
//! third party). The server sends them, each train number once, within
//! [`REVERSE_BUDGET`] bytes per session, and reports its send spans in
//! `Sent`. Echoes and the MTU search are as in the forward probe.

use fatpipe_proto::coding::{DecodeError, Reader};
use fatpipe_proto::{Cookie, MAX_PAYLOAD};
use fatpipe_schema::tune::HostLimits;
use serde::{Deserialize, Serialize};

/// The service name clients open.
pub const SERVICE: &str = "probe";
/// Version of both message sets; a server refuses others.
pub const PROBE_VERSION: u32 = 1;
/// First bytes of every probe datagram.
pub const MAGIC: [u8; 4] = *b"FPPB";
/// Largest datagram either side reads (the largest IPv4 UDP payload).
pub const MAX_DATAGRAM: usize = 65_507;
/// Most packets in one train.
pub const MAX_TRAIN_LEN: u32 = 1024;
/// Most trains in one session.
pub const MAX_TRAINS: u32 = 64;
/// Largest IP packet a reverse train may ask the server to send.
pub const MAX_REVERSE_PACKET: u32 = 9000;
/// Most train bytes the server sends in one reverse session.
pub const REVERSE_BUDGET: u64 = 64 << 20;
/// Longest pause a reverse request may ask between trains (µs).
pub const MAX_GAP_US: u32 = 1_000_000;
/// Longest a pipelined `Collect` may ask the server to wait for its train.
pub const MAX_COLLECT_WAIT_MS: u32 = 10_000;
/// First byte of a packed train report (JSON messages start with `{`).
const PACKED_TRAIN: u8 = 0x01;

/// Header bytes of every probe datagram (magic, version, kind).
const HEADER: usize = 6;
/// Smallest IP packet a reverse train may ask for: IPv6 and UDP headers
/// plus a train packet's header.
pub const MIN_REVERSE_PACKET: u32 = 48 + HEADER as u32 + 12;

/// One probe datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packet {
    /// Client → server: "this UDP address is the session with this cookie".
    Hello {
        /// The session's cookie.
        cookie: Cookie,
    },
    /// Server → client: the hello was accepted.
    HelloAck,
    /// Client → server: please echo.
    Echo {
        /// Sequence number.
        seq: u32,
        /// Client's send time (ns, its own realtime clock, the clock kernel
        /// receive timestamps use), echoed back unchanged.
        sent_ns: u64,
    },
    /// Server → client: the echo.
    EchoReply {
        /// As in the echo.
        seq: u32,
        /// As in the echo.
        sent_ns: u64,
        /// How long the server held the echo (ns), from the kernel's receive
        /// timestamp to just before replying; the client subtracts it, so a
        /// server descheduled for a moment does not lengthen the RTT.
        hold_ns: u64,
    },
    /// Client → server: an MTU probe padded to `size` bytes of IP packet.
    Mtu {
        /// Sequence number.
        seq: u32,
        /// IP packet size this probe was sent at.
        size: u32,
    },
    /// Server → client: the probe of `size` arrived (small, so the reply
    /// path's MTU does not matter).
    MtuAck {
        /// As in the probe.
        seq: u32,
        /// As in the probe.
        size: u32,
    },
    /// Client → server: one packet of a train, padded to the train's size.
    Train {
        /// Train number.
        train: u32,
        /// Position in the train.
        index: u32,
        /// Packets in the train.
        count: u32,
    },
    /// Server → client, in a reverse session instead of `HelloAck`: the
    /// hello was accepted; `token` must come back in `SendTrains`.
    HelloToken {
        /// A random number, known only to whoever receives at the
        /// hello's address.
        token: u64,
    },
    /// Server → client: the last packet of a train arrived.
    TrainAck {
        /// Train number.
        train: u32,
        /// Packets of it received so far.
        received: u32,
        /// Time from its first to its last arrival (ns): enough for the
        /// client to size the next trains before the full report.
        span_ns: u64,
    },
}

impl Packet {
    /// Bytes of this packet before any padding.
    pub fn header_len(&self) -> usize {
        HEADER
            + match self {
                Packet::Hello { .. } => 32,
                Packet::HelloAck => 0,
                Packet::Echo { .. } => 12,
                Packet::EchoReply { .. } => 20,
                Packet::Mtu { .. } | Packet::MtuAck { .. } => 8,
                Packet::Train { .. } => 12,
                Packet::TrainAck { .. } => 16,
                Packet::HelloToken { .. } => 8,
            }
    }

    /// Appends the packet to `out`, then zero padding up to `total` bytes
    /// (no padding when `total` is at most the header).
    pub fn encode(&self, out: &mut Vec<u8>, total: usize) {
        let start = out.len();
        out.extend_from_slice(&MAGIC);
        out.push(PROBE_VERSION as u8);
        let put32 = |out: &mut Vec<u8>, v: u32| out.extend_from_slice(&v.to_be_bytes());
        match *self {
            Packet::Hello { cookie } => {
                out.push(1);
                out.extend_from_slice(&cookie);
            }
            Packet::HelloAck => out.push(2),
            Packet::Echo { seq, sent_ns } => {
                out.push(3);
                put32(out, seq);
                out.extend_from_slice(&sent_ns.to_be_bytes());
            }
            Packet::EchoReply {
                seq,
                sent_ns,
                hold_ns,
            } => {
                out.push(4);
                put32(out, seq);
                out.extend_from_slice(&sent_ns.to_be_bytes());
                out.extend_from_slice(&hold_ns.to_be_bytes());
            }
            Packet::Mtu { seq, size } | Packet::MtuAck { seq, size } => {
                out.push(if matches!(self, Packet::Mtu { .. }) {
                    5
                } else {
                    6
                });
                put32(out, seq);
                put32(out, size);
            }
            Packet::Train {
                train,
                index,
                count,
            } => {
                out.push(7);
                put32(out, train);
                put32(out, index);
                put32(out, count);
            }
            Packet::TrainAck {
                train,
                received,
                span_ns,
            } => {
                out.push(8);
                put32(out, train);
                put32(out, received);
                out.extend_from_slice(&span_ns.to_be_bytes());
            }
            Packet::HelloToken { token } => {
                out.push(9);
                out.extend_from_slice(&token.to_be_bytes());
            }
        }
        pad(out, start, total);
    }

    /// Decodes one datagram. Padding is accepted after MTU probes and
    /// train packets only; anything else must end with its last field.
    pub fn decode(buf: &[u8]) -> Result<Packet, DecodeError> {
        if buf.len() > MAX_DATAGRAM {
            return Err(DecodeError::TooLarge {
                len: buf.len(),
                max: MAX_DATAGRAM,
            });
        }
        let mut r = Reader::new(buf);
        if r.array::<4>()? != MAGIC {
            return Err(DecodeError::Invalid("probe magic"));
        }
        if u32::from(r.u8()?) != PROBE_VERSION {
            return Err(DecodeError::Invalid("probe version"));
        }
        let kind = r.u8()?;
        let (packet, padded) = match kind {
            1 => (Packet::Hello { cookie: r.array()? }, false),
            2 => (Packet::HelloAck, false),
            3 => (
                Packet::Echo {
                    seq: r.u32()?,
                    sent_ns: r.u64()?,
                },
                false,
            ),
            4 => (
                Packet::EchoReply {
                    seq: r.u32()?,
                    sent_ns: r.u64()?,
                    hold_ns: r.u64()?,
                },
                false,
            ),
            5 => (
                Packet::Mtu {
                    seq: r.u32()?,
                    size: r.u32()?,
                },
                true,
            ),
            6 => (
                Packet::MtuAck {
                    seq: r.u32()?,
                    size: r.u32()?,
                },
                false,
            ),
            7 => {
                let train = r.u32()?;
                let index = r.u32()?;
                let count = r.u32()?;
                if count == 0 || count > MAX_TRAIN_LEN || index >= count {
                    return Err(DecodeError::Invalid("train position"));
                }
                (
                    Packet::Train {
                        train,
                        index,
                        count,
                    },
                    true,
                )
            }
            8 => (
                Packet::TrainAck {
                    train: r.u32()?,
                    received: r.u32()?,
                    span_ns: r.u64()?,
                },
                false,
            ),
            9 => (Packet::HelloToken { token: r.u64()? }, false),
            k => return Err(DecodeError::UnknownType(k)),
        };
        if !padded {
            r.finish()?;
        }
        Ok(packet)
    }
}

/// What the client opens the service with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeParams {
    /// Must be [`PROBE_VERSION`].
    pub version: u32,
    /// True to have the server send the trains (server → client). Left
    /// out when false, so a forward probe reads as it always did.
    #[serde(default, skip_serializing_if = "is_false")]
    pub reverse: bool,
    /// True when the client can collect pipelined (see the module docs).
    /// A server from before it ignores the field.
    #[serde(default, skip_serializing_if = "is_false")]
    pub pipelined: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl ProbeParams {
    /// The parameters of this version.
    pub fn current() -> ProbeParams {
        ProbeParams {
            version: PROBE_VERSION,
            reverse: false,
            pipelined: true,
        }
    }

    /// The parameters of a reverse probe.
    pub fn reverse() -> ProbeParams {
        ProbeParams {
            reverse: true,
            ..ProbeParams::current()
        }
    }

    /// JSON bytes for `Open`.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parses and checks the client's parameters.
    pub fn decode(buf: &[u8]) -> Result<ProbeParams, DecodeError> {
        if buf.len() > MAX_PAYLOAD {
            return Err(DecodeError::TooLarge {
                len: buf.len(),
                max: MAX_PAYLOAD,
            });
        }
        let p: ProbeParams =
            serde_json::from_slice(buf).map_err(|_| DecodeError::Invalid("probe params"))?;
        if p.version != PROBE_VERSION {
            return Err(DecodeError::Invalid("probe version"));
        }
        Ok(p)
    }
}

/// One arrival as the server reports it: index in the train, receive time
/// in ns (the server's clock, any epoch), IP packet size.
pub type ArrivalWire = (u32, u64, u32);

/// Control messages of the probe service, both directions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ProbeMsg {
    /// Server → client: where to send UDP probes, and the server's limits
    /// (for the planner), or why they could not be read.
    Ready {
        /// The server's probe UDP port (same IP as the control connection).
        udp_port: u16,
        /// The server's socket-buffer limits and congestion controls.
        limits: Option<HostLimits>,
        /// Why `limits` is missing.
        limits_error: Option<String>,
        /// True when the server took a reverse session (it sends the
        /// trains). A server from before reverse probing leaves it out.
        #[serde(default, skip_serializing_if = "is_false")]
        reverse: bool,
        /// True when the server collects pipelined (the client asked, and
        /// the server knows how). A server from before it leaves it out.
        #[serde(default, skip_serializing_if = "is_false")]
        pipelined: bool,
    },
    /// Client → server, reverse sessions: send trains `first..first +
    /// count` of `len` packets of `size` IP bytes each, `gap_us` apart.
    SendTrains {
        /// The `HelloToken` the client received over UDP.
        token: u64,
        /// First train number.
        first: u32,
        /// Trains to send.
        count: u32,
        /// Packets per train.
        len: u32,
        /// IP bytes per packet.
        size: u32,
        /// Pause between trains (µs).
        gap_us: u32,
    },
    /// Server → client, reverse sessions: the trains were sent; one
    /// `(train, packets, send span in ns)` each.
    Sent {
        /// What was sent.
        trains: Vec<(u32, u32, u64)>,
    },
    /// Client → server: send the train timestamps.
    Collect {
        /// Pipelined: first wait until this train's last packet is in.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait_for: Option<u32>,
        /// How long to wait for it at most (ms, at most
        /// [`MAX_COLLECT_WAIT_MS`]).
        #[serde(default, skip_serializing_if = "is_zero")]
        wait_ms: u32,
    },
    /// Server → client: the arrivals of one train.
    Train {
        /// Train number.
        train: u32,
        /// Arrivals in receive order.
        arrivals: Vec<ArrivalWire>,
    },
    /// Server → client: every train was reported.
    Collected {
        /// True when every timestamp came from the kernel (SO_TIMESTAMPNS);
        /// false when some were taken in user space after `recv`.
        kernel_clock: bool,
        /// Probe datagrams dropped because they did not decode or came from
        /// an unknown address.
        ignored: u64,
    },
    /// Client → server: finished; end the session.
    Done,
    /// Server → client: the server failed.
    Error {
        /// Why.
        message: String,
    },
}

impl ProbeMsg {
    /// The message's name, for errors (never its contents, which may be long).
    pub fn name(&self) -> &'static str {
        match self {
            ProbeMsg::Ready { .. } => "Ready",
            ProbeMsg::Collect { .. } => "Collect",
            ProbeMsg::Train { .. } => "Train",
            ProbeMsg::Collected { .. } => "Collected",
            ProbeMsg::Done => "Done",
            ProbeMsg::SendTrains { .. } => "SendTrains",
            ProbeMsg::Sent { .. } => "Sent",
            ProbeMsg::Error { .. } => "Error",
        }
    }

    /// JSON bytes for the control channel.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Bytes for the control channel of a pipelined session: a `Train`
    /// report in the packed binary form, every other message as JSON.
    ///
    /// Packed: [`PACKED_TRAIN`], then LEB128 varints: the train number, the
    /// number of arrivals, and per arrival the index's step from the last
    /// one's plus one, the time's step from the last one's (the first from
    /// 0) and the size's step from the last one's (the first from 0), each
    /// step zigzag-coded. Arrivals in order, a train of one size and steady
    /// spacing cost 3–5 bytes each.
    pub fn encode_packed(&self) -> Vec<u8> {
        let ProbeMsg::Train { train, arrivals } = self else {
            return self.encode();
        };
        let mut out = Vec::with_capacity(8 + arrivals.len() * 5);
        out.push(PACKED_TRAIN);
        put_varint(&mut out, u64::from(*train));
        put_varint(&mut out, arrivals.len() as u64);
        let (mut index, mut at, mut size) = (-1i64, 0i128, 0i64);
        for &(i, a, b) in arrivals {
            put_varint(&mut out, zigzag(i128::from(i) - i128::from(index) - 1));
            put_varint(&mut out, zigzag(i128::from(a) - at));
            put_varint(&mut out, zigzag(i128::from(b) - i128::from(size)));
            (index, at, size) = (i64::from(i), i128::from(a), i64::from(b));
        }
        out
    }

    /// Parses a control payload (JSON, or a packed train report) and checks
    /// what serde cannot.
    pub fn decode(buf: &[u8]) -> Result<ProbeMsg, DecodeError> {
        if buf.len() > MAX_PAYLOAD {
            return Err(DecodeError::TooLarge {
                len: buf.len(),
                max: MAX_PAYLOAD,
            });
        }
        if buf.first() == Some(&PACKED_TRAIN) {
            return decode_packed(&buf[1..]);
        }
        let msg: ProbeMsg =
            serde_json::from_slice(buf).map_err(|_| DecodeError::Invalid("probe message"))?;
        match &msg {
            ProbeMsg::Train { train, arrivals } => check_train(*train, arrivals)?,
            ProbeMsg::SendTrains {
                first,
                count,
                len,
                size,
                gap_us,
                ..
            } => {
                let end = u64::from(*first) + u64::from(*count);
                if *count == 0 || end > u64::from(MAX_TRAINS) {
                    return Err(DecodeError::Invalid("train numbers"));
                }
                if *len == 0 || *len > MAX_TRAIN_LEN {
                    return Err(DecodeError::Invalid("train length"));
                }
                if *size < MIN_REVERSE_PACKET || *size > MAX_REVERSE_PACKET {
                    return Err(DecodeError::Invalid("train packet size"));
                }
                if *gap_us > MAX_GAP_US {
                    return Err(DecodeError::Invalid("train gap"));
                }
            }
            ProbeMsg::Sent { trains }
                if trains.len() > MAX_TRAINS as usize
                    || trains
                        .iter()
                        .any(|&(t, n, _)| t >= MAX_TRAINS || n == 0 || n > MAX_TRAIN_LEN) =>
            {
                return Err(DecodeError::Invalid("sent trains"));
            }
            ProbeMsg::Error { message } if message.len() > 4096 => {
                return Err(DecodeError::Invalid("error text"));
            }
            ProbeMsg::Collect { wait_for, wait_ms }
                if wait_for.is_some_and(|t| t >= MAX_TRAINS) || *wait_ms > MAX_COLLECT_WAIT_MS =>
            {
                return Err(DecodeError::Invalid("collect wait"));
            }
            _ => {}
        }
        Ok(msg)
    }
}

/// Checks one train report's numbers (both forms).
fn check_train(train: u32, arrivals: &[ArrivalWire]) -> Result<(), DecodeError> {
    if train >= MAX_TRAINS || arrivals.len() > MAX_TRAIN_LEN as usize {
        return Err(DecodeError::Invalid("train report"));
    }
    // Times below 2^63 ns (year 2262 on the realtime clock) keep every
    // step of the packed form within an i64.
    if arrivals.iter().any(|&(i, a, b)| {
        i >= MAX_TRAIN_LEN || a > i64::MAX as u64 || b as usize > MAX_DATAGRAM + 48
    }) {
        return Err(DecodeError::Invalid("train arrival"));
    }
    Ok(())
}

/// The packed train report after its first byte (see
/// [`ProbeMsg::encode_packed`]).
fn decode_packed(buf: &[u8]) -> Result<ProbeMsg, DecodeError> {
    let mut r = Reader::new(buf);
    let bad = DecodeError::Invalid("packed train report");
    let train = u32::try_from(varint(&mut r)?).map_err(|_| bad.clone())?;
    let n = varint(&mut r)?;
    // Checked before anything is allocated: each arrival takes 3 bytes.
    if n > u64::from(MAX_TRAIN_LEN) || n * 3 > r.remaining() as u64 {
        return Err(DecodeError::Invalid("train report"));
    }
    let mut arrivals = Vec::with_capacity(n as usize);
    let (mut index, mut at, mut size) = (-1i128, 0i128, 0i128);
    for _ in 0..n {
        index += unzigzag(varint(&mut r)?) + 1;
        at += unzigzag(varint(&mut r)?);
        size += unzigzag(varint(&mut r)?);
        let i = u32::try_from(index).map_err(|_| bad.clone())?;
        let a = u64::try_from(at).map_err(|_| bad.clone())?;
        let b = u32::try_from(size).map_err(|_| bad.clone())?;
        arrivals.push((i, a, b));
    }
    r.finish()?;
    check_train(train, &arrivals)?;
    Ok(ProbeMsg::Train { train, arrivals })
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// An LEB128 varint of at most 10 bytes (a u64); longer or overflowing
/// ones are refused.
fn varint(r: &mut Reader<'_>) -> Result<u64, DecodeError> {
    let mut v = 0u64;
    for shift in (0..70).step_by(7) {
        let b = r.u8()?;
        if shift == 63 && b > 1 {
            return Err(DecodeError::Invalid("varint"));
        }
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(DecodeError::Invalid("varint"))
}

/// A signed step as an unsigned varint value: 0, −1, 1, −2, … → 0, 1, 2, 3, ….
/// Every step of a report that passes [`check_train`] fits in an i64; the
/// clamp only keeps a report that would not from wrapping.
fn zigzag(v: i128) -> u64 {
    let v = v.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i128 {
    i128::from(((v >> 1) as i64) ^ -((v & 1) as i64))
}

fn pad(out: &mut Vec<u8>, start: usize, total: usize) {
    let len = out.len() - start;
    if total > len {
        out.resize(start + total, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_packets() -> Vec<Packet> {
        vec![
            Packet::Hello { cookie: [7; 32] },
            Packet::HelloAck,
            Packet::Echo {
                seq: 3,
                sent_ns: u64::MAX - 1,
            },
            Packet::EchoReply {
                seq: u32::MAX,
                sent_ns: 5,
                hold_ns: 7,
            },
            Packet::Mtu { seq: 1, size: 1500 },
            Packet::MtuAck { seq: 1, size: 9000 },
            Packet::Train {
                train: 2,
                index: 399,
                count: 400,
            },
            Packet::TrainAck {
                train: 2,
                received: 398,
                span_ns: 4_800_000,
            },
            Packet::HelloToken { token: u64::MAX },
        ]
    }

    #[test]
    fn packets_round_trip_and_lengths_match() {
        for p in all_packets() {
            let mut out = Vec::new();
            p.encode(&mut out, 0);
            assert_eq!(out.len(), p.header_len(), "{p:?}");
            assert_eq!(Packet::decode(&out), Ok(p));
        }
    }

    #[test]
    fn padding_only_where_allowed() {
        for p in all_packets() {
            let mut out = Vec::new();
            p.encode(&mut out, 1472);
            assert_eq!(out.len(), 1472);
            let got = Packet::decode(&out);
            match p {
                Packet::Mtu { .. } | Packet::Train { .. } => assert_eq!(got, Ok(p)),
                _ => assert!(matches!(got, Err(DecodeError::TrailingBytes(_))), "{p:?}"),
            }
        }
    }

    #[test]
    fn hostile_datagrams_are_refused() {
        let mut out = Vec::new();
        Packet::Echo { seq: 1, sent_ns: 2 }.encode(&mut out, 0);
        for cut in 0..out.len() {
            assert!(Packet::decode(&out[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = out.clone();
        bad[0] = b'X';
        assert_eq!(
            Packet::decode(&bad),
            Err(DecodeError::Invalid("probe magic"))
        );
        bad = out.clone();
        bad[4] = 9;
        assert!(Packet::decode(&bad).is_err());
        bad = out.clone();
        bad[5] = 0xee;
        assert_eq!(Packet::decode(&bad), Err(DecodeError::UnknownType(0xee)));
        let mut train = Vec::new();
        Packet::Train {
            train: 0,
            index: 0,
            count: 1,
        }
        .encode(&mut train, 0);
        // index beyond count, count beyond the cap
        train[13] = 5;
        assert!(Packet::decode(&train).is_err());
        train[13] = 0;
        train[14..18].copy_from_slice(&(MAX_TRAIN_LEN + 1).to_be_bytes());
        assert!(Packet::decode(&train).is_err());
        assert!(matches!(
            Packet::decode(&vec![0; MAX_DATAGRAM + 1]),
            Err(DecodeError::TooLarge { .. })
        ));
    }

    #[test]
    fn control_messages_round_trip() {
        let msgs = [
            ProbeMsg::Ready {
                udp_port: 40000,
                limits: None,
                limits_error: Some("no /proc".into()),
                reverse: false,
                pipelined: true,
            },
            ProbeMsg::Ready {
                udp_port: 40000,
                limits: None,
                limits_error: None,
                reverse: true,
                pipelined: false,
            },
            ProbeMsg::SendTrains {
                token: u64::MAX,
                first: 0,
                count: MAX_TRAINS,
                len: MAX_TRAIN_LEN,
                size: 1500,
                gap_us: 2000,
            },
            ProbeMsg::Sent {
                trains: vec![(0, 64, 120_000), (1, 333, 4_000_000)],
            },
            ProbeMsg::Collect {
                wait_for: None,
                wait_ms: 0,
            },
            ProbeMsg::Collect {
                wait_for: Some(MAX_TRAINS - 1),
                wait_ms: MAX_COLLECT_WAIT_MS,
            },
            ProbeMsg::Train {
                train: 3,
                arrivals: vec![(0, 10, 1500), (1, 22, 1500)],
            },
            ProbeMsg::Collected {
                kernel_clock: true,
                ignored: 0,
            },
            ProbeMsg::Done,
            ProbeMsg::Error {
                message: "boom".into(),
            },
        ];
        for m in msgs {
            assert_eq!(ProbeMsg::decode(&m.encode()), Ok(m));
        }
        let p = ProbeParams::current();
        assert_eq!(ProbeParams::decode(&p.encode()), Ok(p.clone()));
        // A forward probe's parameters read as before reverse existed, plus
        // the flag an older server ignores; one from an older client means
        // no pipelining.
        assert_eq!(p.encode(), b"{\"version\":1,\"pipelined\":true}");
        assert_eq!(
            ProbeParams::decode(b"{\"version\":1}").map(|p| p.pipelined),
            Ok(false)
        );
        // An older client's Collect reads as one that waits for nothing.
        assert_eq!(
            ProbeMsg::decode(b"{\"type\":\"collect\"}"),
            Ok(ProbeMsg::Collect {
                wait_for: None,
                wait_ms: 0
            })
        );
        let r = ProbeParams::reverse();
        assert_eq!(ProbeParams::decode(&r.encode()), Ok(r));
        // A Ready from an older server means a forward session, not
        // pipelined.
        assert!(matches!(
            ProbeMsg::decode(
                b"{\"type\":\"ready\",\"udp_port\":1,\"limits\":null,\"limits_error\":null}"
            ),
            Ok(ProbeMsg::Ready {
                reverse: false,
                pipelined: false,
                ..
            })
        ));
    }

    #[test]
    fn packed_train_reports_round_trip_and_are_small() {
        // 400 arrivals 12 µs apart at one size, two lost, one out of order.
        let mut arrivals: Vec<ArrivalWire> = (0..400u32)
            .filter(|i| i % 97 != 5)
            .map(|i| (i, 1_795_348_110_662_548_766 + u64::from(i) * 12_000, 1500))
            .collect();
        arrivals.swap(10, 11);
        arrivals.push((399, 1_795_348_110_662_548_000, 9000));
        let train = ProbeMsg::Train {
            train: MAX_TRAINS - 1,
            arrivals: arrivals.clone(),
        };
        let packed = train.encode_packed();
        assert_eq!(packed[0], PACKED_TRAIN);
        assert_eq!(ProbeMsg::decode(&packed), Ok(train.clone()));
        assert!(
            packed.len() <= arrivals.len() * 5 + 16,
            "{} B",
            packed.len()
        );
        assert!(
            packed.len() * 5 < train.encode().len(),
            "{} B",
            packed.len()
        );
        // Extremes of every field.
        for a in [
            vec![],
            vec![(0, 0, 0)],
            vec![
                (MAX_TRAIN_LEN - 1, i64::MAX as u64, MAX_DATAGRAM as u32 + 48),
                (0, 0, 0),
            ],
        ] {
            let m = ProbeMsg::Train {
                train: 0,
                arrivals: a,
            };
            assert_eq!(ProbeMsg::decode(&m.encode_packed()), Ok(m));
        }
        // Other messages stay JSON.
        assert_eq!(ProbeMsg::Done.encode_packed(), ProbeMsg::Done.encode());
    }

    #[test]
    fn packed_train_reports_are_checked() {
        let good = ProbeMsg::Train {
            train: 3,
            arrivals: vec![(0, 10, 1500), (1, 22, 1500)],
        }
        .encode_packed();
        assert!(ProbeMsg::decode(&good).is_ok());
        // Cut anywhere, or with a byte more: refused.
        for n in 1..good.len() {
            assert!(ProbeMsg::decode(&good[..n]).is_err(), "cut at {n}");
        }
        let mut long = good.clone();
        long.push(0);
        assert!(ProbeMsg::decode(&long).is_err());
        let packed = |body: &[u8]| [&[PACKED_TRAIN][..], body].concat();
        // More arrivals than a train holds, or than the bytes could carry,
        // are refused before anything is allocated.
        assert!(ProbeMsg::decode(&packed(&[0, 0x81, 0x08])).is_err());
        assert!(ProbeMsg::decode(&packed(&[0, 100, 0, 0, 0])).is_err());
        // Train number, index, time and size out of range.
        assert!(ProbeMsg::decode(&packed(&[64, 1, 0, 0, 0])).is_err());
        assert!(
            ProbeMsg::decode(&packed(&[0, 1, 1, 0, 0])).is_err(),
            "index -1"
        );
        assert!(
            ProbeMsg::decode(&packed(&[0, 1, 0, 1, 0])).is_err(),
            "time -1"
        );
        assert!(
            ProbeMsg::decode(&packed(&[0, 1, 0, 0, 1])).is_err(),
            "size -1"
        );
        let mut index = vec![0, 1];
        put_varint(&mut index, zigzag(i128::from(MAX_TRAIN_LEN)));
        index.extend([0, 0]);
        assert!(
            ProbeMsg::decode(&packed(&index)).is_err(),
            "index too large"
        );
        // Varints longer than a u64 are refused.
        let mut huge = vec![0, 1];
        huge.extend([0xff; 10]);
        huge.extend([0x01, 0, 0]);
        assert!(ProbeMsg::decode(&packed(&huge)).is_err());
        // A pipelined Collect's numbers are capped.
        for (wait_for, wait_ms) in [(Some(MAX_TRAINS), 1), (Some(0), MAX_COLLECT_WAIT_MS + 1)] {
            let m = ProbeMsg::Collect { wait_for, wait_ms };
            assert!(ProbeMsg::decode(&m.encode()).is_err(), "{m:?}");
        }
    }

    #[test]
    fn control_messages_are_checked() {
        assert!(ProbeMsg::decode(b"{\"type\":\"nope\"}").is_err());
        assert!(ProbeMsg::decode(b"\xff\xfe").is_err());
        let too_many = ProbeMsg::Train {
            train: 0,
            arrivals: vec![(0, 0, 1500); MAX_TRAIN_LEN as usize + 1],
        };
        assert!(ProbeMsg::decode(&too_many.encode()).is_err());
        let bad_train = ProbeMsg::Train {
            train: MAX_TRAINS,
            arrivals: vec![],
        };
        assert!(ProbeMsg::decode(&bad_train.encode()).is_err());
        assert!(ProbeParams::decode(b"{\"version\":2}").is_err());
        let send = |first, count, len, size, gap_us| ProbeMsg::SendTrains {
            token: 1,
            first,
            count,
            len,
            size,
            gap_us,
        };
        assert!(ProbeMsg::decode(&send(0, 10, 333, 1500, 1000).encode()).is_ok());
        for bad in [
            send(0, 0, 333, 1500, 0),
            send(60, 5, 333, 1500, 0),
            send(u32::MAX, 2, 333, 1500, 0),
            send(0, 1, 0, 1500, 0),
            send(0, 1, MAX_TRAIN_LEN + 1, 1500, 0),
            send(0, 1, 10, MAX_REVERSE_PACKET + 1, 0),
            send(0, 1, 10, MIN_REVERSE_PACKET - 1, 0),
            send(0, 1, 10, 1500, MAX_GAP_US + 1),
        ] {
            assert!(ProbeMsg::decode(&bad.encode()).is_err(), "{bad:?}");
        }
        for bad in [
            vec![(MAX_TRAINS, 1, 0)],
            vec![(0, 0, 0)],
            vec![(0, MAX_TRAIN_LEN + 1, 0)],
            vec![(0, 1, 0); MAX_TRAINS as usize + 1],
        ] {
            let m = ProbeMsg::Sent { trains: bad };
            assert!(ProbeMsg::decode(&m.encode()).is_err(), "{m:?}");
        }
        assert!(ProbeParams::decode(b"").is_err());
    }

    #[test]
    fn extreme_counts_and_steps_are_refused_without_overflow() {
        let packed = |body: &[u8]| [&[PACKED_TRAIN][..], body].concat();
        let max = {
            let mut v = Vec::new();
            put_varint(&mut v, u64::MAX);
            v
        };
        // A count of u64::MAX (n * 3 would wrap if it were not capped first).
        let count = [&[0][..], &max].concat();
        assert!(ProbeMsg::decode(&packed(&count)).is_err());
        // Steps of u64::MAX (the largest zigzag steps, both signs) in every
        // field, many times over: the i128 sums cannot wrap, the report is refused.
        let mut steps = vec![0];
        put_varint(&mut steps, u64::from(MAX_TRAIN_LEN));
        for _ in 0..MAX_TRAIN_LEN {
            for _ in 0..3 {
                steps.extend(&max);
            }
        }
        assert!(steps.len() < MAX_PAYLOAD);
        assert!(ProbeMsg::decode(&packed(&steps)).is_err());
        let mut steps = vec![0];
        put_varint(&mut steps, u64::from(MAX_TRAIN_LEN));
        for _ in 0..MAX_TRAIN_LEN {
            for _ in 0..3 {
                put_varint(&mut steps, u64::MAX - 1);
            }
        }
        assert!(ProbeMsg::decode(&packed(&steps)).is_err());
        // A train number of u32::MAX + 1.
        let mut train = Vec::new();
        put_varint(&mut train, u64::from(u32::MAX) + 1);
        train.push(0);
        assert!(ProbeMsg::decode(&packed(&train)).is_err());
        // JSON messages with every number at its maximum.
        let send = |first, count, len, size, gap_us| ProbeMsg::SendTrains {
            token: u64::MAX,
            first,
            count,
            len,
            size,
            gap_us,
        };
        for m in [
            send(u32::MAX, u32::MAX, 1, MIN_REVERSE_PACKET, 0),
            send(1, MAX_TRAINS, 1, MIN_REVERSE_PACKET, 0),
            send(0, 1, u32::MAX, MIN_REVERSE_PACKET, 0),
            send(0, 1, 1, u32::MAX, 0),
            send(0, 1, 1, MIN_REVERSE_PACKET, u32::MAX),
            ProbeMsg::Sent {
                trains: vec![(u32::MAX, u32::MAX, u64::MAX)],
            },
            ProbeMsg::Train {
                train: 0,
                arrivals: vec![(u32::MAX, u64::MAX, u32::MAX)],
            },
            ProbeMsg::Collect {
                wait_for: Some(u32::MAX),
                wait_ms: u32::MAX,
            },
        ] {
            assert!(ProbeMsg::decode(&m.encode()).is_err(), "{m:?}");
            assert!(ProbeMsg::decode(&m.encode_packed()).is_err(), "{m:?}");
        }
        // Off by one at the train cap: the last train is fine.
        let last = send(MAX_TRAINS - 1, 1, MAX_TRAIN_LEN, MIN_REVERSE_PACKET, 0);
        assert_eq!(ProbeMsg::decode(&last.encode()), Ok(last));
        // The encoder's steps clamp rather than wrap on extreme arrivals.
        let wild = ProbeMsg::Train {
            train: 0,
            arrivals: vec![(u32::MAX, u64::MAX, u32::MAX), (0, 0, 0)],
        };
        assert!(!wild.encode_packed().is_empty());
    }
}
