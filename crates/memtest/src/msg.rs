//! Messages of the built-in `test` service (memory-to-memory throughput).
//!
//! They travel as [`Message::Payload`](fatpipe_proto::Message::Payload)s of an
//! established session, encoded as JSON: the service protocol is young and
//! changes faster than the handshake, JSON keeps it readable in a packet
//! capture, and the frame cap already bounds what `serde_json` must parse
//! (its own recursion limit bounds nesting). [`TestMsg::decode`] is fuzzed.
//!
//! A message that would exceed one frame (per-stream lists with `-P 1024`)
//! is sent as several with `more: true` on all but the last; see
//! [`TestMsg::split`].
//!
//! The flow (docs/protocol.md has it in full): the client opens `test` with
//! [`TestParams`]; the server answers [`TestMsg::Ready`]; the client dials
//! the data streams (tag = stream id); the server answers
//! [`TestMsg::Attached`]; the client sends [`TestMsg::Start`]; both sides
//! run, the server reporting [`TestMsg::Interval`]s; each side says
//! [`TestMsg::SendDone`] when its senders finish; the server ends with
//! [`TestMsg::Final`].
//!
//! While data flows the client may change the test (the auto-tuning
//! adjuster does): [`TestMsg::AddStreams`] opens more data streams, with
//! ids following the existing ones, and [`TestMsg::SetCongestion`] switches
//! the server's sending streams to another congestion control; the server
//! answers each with [`TestMsg::Adjusted`].

use serde::{Deserialize, Serialize};

use fatpipe_proto::coding::DecodeError;
use fatpipe_proto::MAX_PAYLOAD;

/// Most parallel streams a test may ask for.
pub const MAX_STREAMS: u32 = 1024;
/// Smallest UDP datagram (it carries a 24-byte header) and write size.
pub const MIN_LENGTH: u32 = 64;
/// Largest UDP datagram payload.
pub const MAX_UDP_LENGTH: u32 = 65_507;
/// Largest TCP write size.
pub const MAX_TCP_LENGTH: u32 = 16 << 20;

/// Transport under test: the result schema's type, so a request and the
/// [`TestStart`](fatpipe_schema::test::TestStart) it leads to say it with
/// the same JSON text (`"tcp"`, `"udp"`).
pub use fatpipe_schema::test::Protocol;
/// Who sends: the result schema's [`TestDirection`](fatpipe_schema::test::TestDirection)
/// (`"up"`, `"down"`, `"both"`), named `Direction` here as the messages
/// always have.
pub use fatpipe_schema::test::TestDirection as Direction;

/// What the client asks for, carried in `Open`'s params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestParams {
    /// TCP or UDP.
    pub protocol: Protocol,
    /// Streams per direction (1..=1024).
    pub streams: u32,
    /// Who sends.
    pub direction: Direction,
    /// Measured time, after the omitted warm-up; ignored when `bytes` is set.
    pub duration_ms: u64,
    /// Total bytes to send per direction (`-n`), instead of a time.
    pub bytes: Option<u64>,
    /// Warm-up excluded from the summary.
    pub omit_ms: u64,
    /// Report interval.
    pub interval_ms: u64,
    /// Socket buffer size to request (`-w`), both ends.
    pub window: Option<u64>,
    /// Request `window` with `SO_SNDBUFFORCE`/`SO_RCVBUFFORCE`, past the
    /// host caps, where the process is privileged (auto-tuning sets this
    /// when both ends are; absent from older clients, hence the default).
    #[serde(default)]
    pub force_buffers: bool,
    /// A smaller window each receiver holds first, for the sender's
    /// start-up, and for how long after a stream's first data (ms; the
    /// receiver holds it at most 60 s); auto-tuning sets it on lossy paths.
    /// Absent from older clients.
    #[serde(default)]
    pub start_window: Option<(u64, u64)>,
    /// TCP maximum segment size to request.
    pub mss: Option<u32>,
    /// TCP congestion control to request.
    pub congestion: Option<String>,
    /// Pacing cap per stream in bit/s (`SO_MAX_PACING_RATE`).
    pub fq_rate: Option<u64>,
    /// Send without copying (sendfile / MSG_ZEROCOPY).
    pub zerocopy: bool,
    /// Write size (TCP) or datagram size (UDP), bytes.
    pub length: u32,
    /// UDP target bitrate per stream, bit/s.
    pub bitrate: u64,
    /// UDP: one datagram per system call at both ends (`--no-batch`), the
    /// per-packet baseline; absent from older clients.
    #[serde(default)]
    pub no_batch: bool,
}

impl TestParams {
    /// Checks ranges both ends rely on; the server calls this on what a
    /// client sent before allocating anything.
    pub fn validate(&self) -> Result<(), String> {
        if self.streams == 0 || self.streams > MAX_STREAMS {
            return Err(format!("streams must be 1..={MAX_STREAMS}"));
        }
        let (max_len, what) = match self.protocol {
            Protocol::Tcp => (MAX_TCP_LENGTH, "write length"),
            Protocol::Udp => (
                MAX_UDP_LENGTH,
                "datagram length (the largest UDP payload is 65507)",
            ),
        };
        if self.length < MIN_LENGTH || self.length > max_len {
            return Err(format!("{what} must be {MIN_LENGTH}..={max_len} bytes"));
        }
        if self.interval_ms < 10 {
            return Err("interval must be at least 10 ms".into());
        }
        if self.bytes.is_none() && self.duration_ms == 0 {
            return Err("give a duration or a byte count".into());
        }
        if self.duration_ms > 7 * 24 * 3600 * 1000 || self.omit_ms > 3600 * 1000 {
            return Err("duration too long".into());
        }
        if self.protocol == Protocol::Udp && self.bitrate == 0 {
            return Err("UDP needs a bitrate above 0".into());
        }
        if let Some(cc) = &self.congestion {
            check_congestion_name(cc)?;
        }
        Ok(())
    }

    /// Checks an [`TestMsg::AddStreams`] against the test: ids must follow
    /// the `total_now` existing streams, the new streams must go the test's
    /// way(s), and no direction may exceed [`MAX_STREAMS`]. `up_now` and
    /// `down_now` count the existing streams per direction.
    pub fn check_add(
        &self,
        total_now: u32,
        up_now: u32,
        down_now: u32,
        add: &AddStreams,
    ) -> Result<(), String> {
        if self.protocol != Protocol::Tcp {
            return Err("streams can be added to TCP tests only".into());
        }
        if add.first != total_now {
            return Err(format!(
                "new stream ids must start at {total_now}, not {}",
                add.first
            ));
        }
        if add.up == 0 && add.down == 0 {
            return Err("no streams to add".into());
        }
        match self.direction {
            Direction::Up if add.down > 0 => return Err("this test only sends up".into()),
            Direction::Down if add.up > 0 => return Err("this test only sends down".into()),
            _ => {}
        }
        let up = up_now.saturating_add(add.up);
        let down = down_now.saturating_add(add.down);
        if up > MAX_STREAMS || down > MAX_STREAMS {
            return Err(format!("at most {MAX_STREAMS} streams per direction"));
        }
        Ok(())
    }

    /// Number of data streams in total (twice `streams` for `Both`).
    pub fn total_streams(&self) -> u32 {
        match self.direction {
            // Saturating: callers may ask before validate() capped it.
            Direction::Both => self.streams.saturating_mul(2),
            _ => self.streams,
        }
    }

    /// True if the client sends on stream `id`.
    pub fn client_sends(&self, id: u32) -> bool {
        match self.direction {
            Direction::Up => true,
            Direction::Down => false,
            Direction::Both => id < self.streams,
        }
    }

    /// Encodes for `Open`.
    pub fn encode(&self) -> Vec<u8> {
        // Serializing plain data to JSON cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes `Open` params from a client; call [`validate`](Self::validate)
    /// before acting on them.
    pub fn decode(bytes: &[u8]) -> Result<TestParams, DecodeError> {
        if bytes.len() > MAX_PAYLOAD {
            return Err(DecodeError::TooLarge {
                len: bytes.len(),
                max: MAX_PAYLOAD,
            });
        }
        serde_json::from_slice(bytes).map_err(|_| DecodeError::Invalid("test params"))
    }
}

/// Checks a congestion control name: 1..=15 printable ASCII bytes (the
/// kernel's `TCP_CA_NAME_MAX` is 16 with the terminating zero).
pub fn check_congestion_name(cc: &str) -> Result<(), String> {
    if cc.is_empty() || cc.len() > 15 || !cc.bytes().all(|c| c.is_ascii_graphic()) {
        return Err("congestion control name must be 1..15 printable bytes".into());
    }
    Ok(())
}

/// What [`TestMsg::AddStreams`] asks for: streams `first..first + up` carry
/// data client → server, `first + up..first + up + down` server → client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddStreams {
    /// Id of the first new stream: the number of streams so far.
    pub first: u32,
    /// New streams on which the client sends.
    pub up: u32,
    /// New streams on which the server sends.
    pub down: u32,
}

impl AddStreams {
    /// Number of new streams.
    pub fn count(&self) -> u32 {
        self.up.saturating_add(self.down)
    }

    /// True if the client sends on new stream `id`.
    pub fn client_sends(&self, id: u32) -> bool {
        id < self.first.saturating_add(self.up)
    }
}

/// Which way a stream carries data, seen from the end that reports it.
/// Not the schema's stream [`Direction`](fatpipe_schema::test::Direction)
/// (up or down, seen from the client): a server's sample says what the
/// server did, and the client turns it into up or down when it merges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// This end writes.
    Send,
    /// This end reads.
    Recv,
}

/// The socket settings one end actually got for a stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketSetup {
    /// Stream id (the data connection's tag).
    pub id: u32,
    /// Send buffer the kernel granted, bytes.
    pub sndbuf: u64,
    /// Receive buffer the kernel granted, bytes.
    pub rcvbuf: u64,
    /// MSS in use (TCP), bytes.
    pub mss: u32,
    /// Congestion control in use (TCP).
    pub congestion: String,
    /// How data is sent: "write", "sendfile", "zerocopy", "sendmmsg"...
    pub send_path: String,
    /// How data is received: "read", "trunc", ...
    pub recv_path: String,
}

/// One stream's numbers for an interval or for the whole test, as measured
/// by one end.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamSample {
    /// Stream id.
    pub id: u32,
    /// Whether this end sent or received on it.
    pub role: Option<Role>,
    /// Bytes sent (sender) or received (receiver).
    pub bytes: u64,
    /// UDP datagrams sent or received.
    pub packets: u64,
    /// UDP: datagrams missing at the receiver.
    pub lost: u64,
    /// UDP: datagrams that arrived after a later one.
    pub out_of_order: u64,
    /// UDP: interarrival jitter (RFC 3550), microseconds.
    pub jitter_us: f64,
    /// TCP sender: retransmitted segments.
    pub retransmits: u64,
    /// TCP: smoothed RTT, microseconds (0 if unknown).
    pub rtt_us: u32,
    /// TCP: RTT variance, microseconds.
    pub rttvar_us: u32,
    /// TCP: congestion window, bytes.
    pub cwnd: u64,
    /// Final totals only: time from the end of the warm-up to this
    /// stream's last byte, microseconds.
    pub elapsed_us: u64,
}

/// CPU time one end spent, for a utilisation figure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuSample {
    /// User CPU seconds.
    pub user_s: f64,
    /// System CPU seconds.
    pub system_s: f64,
    /// Wall-clock seconds over which they were spent.
    pub wall_s: f64,
}

/// The `test` service's messages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TestMsg {
    /// Server → client: parameters accepted; dial the data streams. For UDP,
    /// the server's port for each stream, in stream order.
    Ready {
        /// UDP ports, one per stream; empty for TCP.
        udp_ports: Vec<u16>,
        /// The server takes `AddStreams` and `SetCongestion` (absent, so
        /// false, from servers older than them).
        #[serde(default)]
        adjustable: bool,
    },
    /// Server → client: all streams attached, with the server's settings.
    Attached {
        /// Per stream.
        streams: Vec<SocketSetup>,
        /// What the server's host refused or capped (e.g. buffer sizes).
        #[serde(default)]
        warnings: Vec<String>,
        /// More `Attached` messages follow.
        more: bool,
    },
    /// Client → server: go.
    Start,
    /// Server → client: the server's view of one interval.
    Interval {
        /// Interval number from 0.
        index: u32,
        /// Start, ms after Start.
        start_ms: u64,
        /// End, ms after Start.
        end_ms: u64,
        /// Part of the omitted warm-up.
        omitted: bool,
        /// Per stream.
        streams: Vec<StreamSample>,
        /// More parts of this interval follow.
        more: bool,
    },
    /// Either way: this end's senders have finished.
    SendDone,
    /// Client → server: stop now (the user interrupted, or the client failed).
    Stop,
    /// Server → client: the server's totals (after the omitted warm-up).
    Final {
        /// Measured time at the server, ms.
        elapsed_ms: u64,
        /// Per stream.
        streams: Vec<StreamSample>,
        /// The server process's CPU over the test.
        cpu: CpuSample,
        /// More `Final` messages follow.
        more: bool,
    },
    /// Client → server, while data flows: open more streams. The client
    /// dials them right after this message (tag = stream id); the server
    /// accepts them, configures them like the first ones and answers
    /// [`Adjusted`](TestMsg::Adjusted); both ends start them at once.
    AddStreams(AddStreams),
    /// Client → server, while data flows: switch the server's sending
    /// streams (and any added later) to congestion control `name`.
    SetCongestion {
        /// Congestion control, e.g. "bbr".
        name: String,
    },
    /// Server → client: answer to `AddStreams` or `SetCongestion`.
    Adjusted {
        /// The new streams' settings (`AddStreams`), or the server's
        /// sending streams' after the switch (`SetCongestion`).
        streams: Vec<SocketSetup>,
        /// What the server's host refused or capped.
        #[serde(default)]
        warnings: Vec<String>,
        /// Why the server refused the change; nothing changed then.
        #[serde(default)]
        refused: Option<String>,
        /// More `Adjusted` messages follow.
        more: bool,
    },
    /// Either way: the test failed at this end.
    Error {
        /// One line for people.
        message: String,
    },
}

impl TestMsg {
    /// Encodes as one payload. Messages from [`split`](Self::split) always fit.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes one payload. Never panics.
    pub fn decode(bytes: &[u8]) -> Result<TestMsg, DecodeError> {
        if bytes.len() > MAX_PAYLOAD {
            return Err(DecodeError::TooLarge {
                len: bytes.len(),
                max: MAX_PAYLOAD,
            });
        }
        serde_json::from_slice(bytes).map_err(|_| DecodeError::Invalid("test message"))
    }

    /// Splits a message whose per-stream list makes it larger than one
    /// payload into parts that each fit, `more` set on all but the last.
    pub fn split(self) -> Vec<TestMsg> {
        if self.encode().len() <= MAX_PAYLOAD {
            return vec![self];
        }
        let halves = match self {
            TestMsg::Attached {
                streams,
                warnings,
                more,
            } if streams.len() > 1 => {
                let (a, b) = halve(streams);
                (
                    TestMsg::Attached {
                        streams: a,
                        warnings,
                        more: true,
                    },
                    TestMsg::Attached {
                        streams: b,
                        warnings: Vec::new(),
                        more,
                    },
                )
            }
            TestMsg::Adjusted {
                streams,
                warnings,
                refused,
                more,
            } if streams.len() > 1 => {
                let (a, b) = halve(streams);
                (
                    TestMsg::Adjusted {
                        streams: a,
                        warnings,
                        refused: refused.clone(),
                        more: true,
                    },
                    TestMsg::Adjusted {
                        streams: b,
                        warnings: Vec::new(),
                        refused,
                        more,
                    },
                )
            }
            TestMsg::Interval {
                index,
                start_ms,
                end_ms,
                omitted,
                streams,
                more,
            } if streams.len() > 1 => {
                let (a, b) = halve(streams);
                let part = |streams, more| TestMsg::Interval {
                    index,
                    start_ms,
                    end_ms,
                    omitted,
                    streams,
                    more,
                };
                (part(a, true), part(b, more))
            }
            TestMsg::Final {
                elapsed_ms,
                streams,
                cpu,
                more,
            } if streams.len() > 1 => {
                let (a, b) = halve(streams);
                (
                    TestMsg::Final {
                        elapsed_ms,
                        streams: a,
                        cpu,
                        more: true,
                    },
                    TestMsg::Final {
                        elapsed_ms,
                        streams: b,
                        cpu,
                        more,
                    },
                )
            }
            other => return vec![other],
        };
        let mut out = halves.0.split();
        out.extend(halves.1.split());
        out
    }
}

fn halve<T>(mut v: Vec<T>) -> (Vec<T>, Vec<T>) {
    let b = v.split_off(v.len() / 2);
    (v, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> TestParams {
        TestParams {
            protocol: Protocol::Tcp,
            streams: 4,
            direction: Direction::Both,
            duration_ms: 10_000,
            bytes: None,
            omit_ms: 0,
            interval_ms: 1000,
            window: Some(4 << 20),
            force_buffers: false,
            start_window: None,
            mss: None,
            congestion: Some("bbr".into()),
            fq_rate: None,
            zerocopy: false,
            length: 128 * 1024,
            bitrate: 0,
            no_batch: false,
        }
    }

    #[test]
    fn params_keep_their_json_text() {
        let text = String::from_utf8(params().encode()).unwrap();
        assert!(
            text.starts_with("{\"protocol\":\"tcp\",\"streams\":4,\"direction\":\"both\","),
            "{text}"
        );
    }

    #[test]
    fn params_round_trip_and_validate() {
        let p = params();
        assert_eq!(TestParams::decode(&p.encode()), Ok(p.clone()));
        assert_eq!(p.total_streams(), 8);
        assert!(p.client_sends(3) && !p.client_sends(4));
        let bad = [
            TestParams {
                streams: 0,
                ..p.clone()
            },
            TestParams {
                streams: MAX_STREAMS + 1,
                ..p.clone()
            },
            TestParams {
                length: 63,
                ..p.clone()
            },
            TestParams {
                protocol: Protocol::Udp,
                length: 65_508,
                bitrate: 1,
                ..p.clone()
            },
            TestParams {
                protocol: Protocol::Udp,
                bitrate: 0,
                length: 1000,
                ..p.clone()
            },
            TestParams {
                congestion: Some("a b".into()),
                ..p.clone()
            },
        ];
        for b in bad {
            assert!(b.validate().is_err(), "{b:?}");
            assert_eq!(TestParams::decode(&b.encode()).as_ref(), Ok(&b));
        }
        assert!(TestParams::decode(b"{not json").is_err());
    }

    #[test]
    fn messages_round_trip() {
        let msgs = [
            TestMsg::Ready {
                udp_ports: vec![1, 2],
                adjustable: true,
            },
            TestMsg::Start,
            TestMsg::SendDone,
            TestMsg::Stop,
            TestMsg::Error {
                message: "no".into(),
            },
            TestMsg::Final {
                elapsed_ms: 10,
                streams: vec![StreamSample::default()],
                cpu: CpuSample::default(),
                more: false,
            },
            TestMsg::AddStreams(AddStreams {
                first: 4,
                up: 2,
                down: 0,
            }),
            TestMsg::SetCongestion { name: "bbr".into() },
            TestMsg::Adjusted {
                streams: vec![SocketSetup::default()],
                warnings: vec!["w".into()],
                refused: None,
                more: false,
            },
        ];
        for m in msgs {
            assert_eq!(TestMsg::decode(&m.encode()), Ok(m));
        }
        assert!(TestMsg::decode(b"{\"type\":\"nope\"}").is_err());
    }

    #[test]
    fn adding_streams_is_checked_against_the_test() {
        let both = params();
        let add = |first, up, down| AddStreams { first, up, down };
        assert_eq!(both.check_add(8, 4, 4, &add(8, 2, 2)), Ok(()));
        assert!(both.check_add(8, 4, 4, &add(7, 2, 2)).is_err());
        assert!(both.check_add(8, 4, 4, &add(8, 0, 0)).is_err());
        assert!(both.check_add(8, 4, 4, &add(8, 1021, 0)).is_err());
        assert_eq!(both.check_add(8, 4, 4, &add(8, 1020, 0)), Ok(()));
        let up = TestParams {
            direction: Direction::Up,
            ..params()
        };
        assert!(up.check_add(4, 4, 0, &add(4, 0, 1)).is_err());
        assert_eq!(up.check_add(4, 4, 0, &add(4, 3, 0)), Ok(()));
        let down = TestParams {
            direction: Direction::Down,
            ..params()
        };
        assert!(down.check_add(4, 0, 4, &add(4, 1, 0)).is_err());
        let udp = TestParams {
            protocol: Protocol::Udp,
            bitrate: 1,
            ..up
        };
        assert!(udp.check_add(4, 4, 0, &add(4, 1, 0)).is_err());
        let a = add(10, 3, 2);
        assert_eq!(a.count(), 5);
        assert!(a.client_sends(12) && !a.client_sends(13));
        assert!(check_congestion_name("bbr").is_ok());
        assert!(check_congestion_name("").is_err());
        assert!(check_congestion_name("a\u{0}b").is_err());
    }

    #[test]
    fn big_messages_split_into_fitting_parts() {
        let streams: Vec<StreamSample> = (0..2048)
            .map(|id| StreamSample {
                id,
                role: Some(Role::Recv),
                bytes: u64::MAX,
                jitter_us: 1.0 / 3.0,
                ..Default::default()
            })
            .collect();
        let msg = TestMsg::Interval {
            index: 1,
            start_ms: 0,
            end_ms: 1000,
            omitted: false,
            streams,
            more: false,
        };
        assert!(msg.encode().len() > MAX_PAYLOAD);
        let parts = msg.split();
        assert!(parts.len() > 1);
        let mut ids = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            assert!(part.encode().len() <= MAX_PAYLOAD);
            let TestMsg::Interval { streams, more, .. } = part else {
                panic!("wrong kind")
            };
            assert_eq!(*more, i + 1 < parts.len());
            ids.extend(streams.iter().map(|s| s.id));
        }
        assert_eq!(ids, (0..2048).collect::<Vec<_>>());
    }

    #[test]
    fn extreme_stream_counts_saturate_and_are_refused_not_overflowed() {
        let huge = TestParams {
            streams: u32::MAX,
            ..params()
        };
        assert_eq!(huge.total_streams(), u32::MAX);
        assert!(huge.client_sends(u32::MAX - 1));
        assert!(huge.validate().is_err());
        let at_cap = TestParams {
            streams: MAX_STREAMS,
            ..params()
        };
        assert!(at_cap.validate().is_ok());
        assert_eq!(at_cap.total_streams(), 2 * MAX_STREAMS);
        let add = |first, up, down| AddStreams { first, up, down };
        let p = params();
        for a in [
            add(8, u32::MAX, u32::MAX),
            add(8, u32::MAX, 0),
            add(8, 0, u32::MAX),
            add(u32::MAX, 1, 1),
        ] {
            assert!(p.check_add(8, 4, 4, &a).is_err(), "{a:?}");
            assert!(p.check_add(u32::MAX, u32::MAX, u32::MAX, &a).is_err());
        }
        // Off by one at the per-direction cap.
        assert!(p.check_add(8, 4, 4, &add(8, MAX_STREAMS - 4, 0)).is_ok());
        assert!(p.check_add(8, 4, 4, &add(8, MAX_STREAMS - 3, 0)).is_err());
        let a = add(u32::MAX, u32::MAX, u32::MAX);
        assert_eq!(a.count(), u32::MAX);
        assert!(a.client_sends(u32::MAX - 1));
        let long = TestParams {
            duration_ms: u64::MAX,
            omit_ms: u64::MAX,
            length: u32::MAX,
            ..params()
        };
        assert!(long.validate().is_err());
    }
}
