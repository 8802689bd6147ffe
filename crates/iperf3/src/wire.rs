//! iperf3's control messages, sans-IO: state bytes, the 37-byte cookie,
//! length-prefixed JSON, and the parameter and result documents.
//!
//! The control connection carries no type tags: what comes next depends on
//! the state the protocol is in (a state byte, then a JSON document after
//! `PARAM_EXCHANGE` or `EXCHANGE_RESULTS`). So the [`Reader`] is told what
//! to expect ([`Expect`]) and decodes that from its buffer, never holding
//! more than one capped message: a JSON length above the cap is refused
//! from its four length bytes alone.
//!
//! The documents are read the way iperf3 reads them (`get_parameters`,
//! `get_results` in its `iperf_api.c`): a key of the wrong JSON type is
//! ignored and unknown keys are ignored, so clients of any version
//! interoperate. Numbers are read as JSON numbers of any form, since cJSON
//! prints large integers with an exponent.

use serde_json::{json, Map, Value};

/// iperf3's default port.
pub const DEFAULT_PORT: u16 = 5201;
/// Bytes of a cookie on the wire: 36 characters and a NUL.
pub const COOKIE_LEN: usize = 37;
/// The cap iperf3 puts on a parameters document.
pub const MAX_PARAMS_JSON: usize = 8 * 1024;
/// Our cap on a results document (iperf3 has none; `server_output_json`
/// of a long many-stream test runs to hundreds of KiB).
pub const MAX_RESULTS_JSON: usize = 4 << 20;
/// Most streams iperf3 accepts per test (`MAX_STREAMS`).
pub const MAX_STREAMS: u32 = 128;
/// Most stream entries read from a results document.
pub const MAX_RESULT_STREAMS: usize = 2 * MAX_STREAMS as usize;
/// Largest TCP write size iperf3 accepts (`MAX_BLOCKSIZE`).
pub const MAX_TCP_BLOCK: u32 = 1 << 20;
/// UDP datagram sizes iperf3 accepts.
pub const UDP_BLOCK: std::ops::RangeInclusive<u32> = 16..=65_507;
/// Largest socket buffer iperf3 accepts (`MAX_TCP_BUFFER`).
pub const MAX_WINDOW: u64 = 512 << 20;
/// Longest test iperf3 accepts, seconds (`MAX_TIME`).
pub const MAX_TIME: u64 = 86_400;
/// Longest warm-up iperf3 3.12 accepts, seconds (`MAX_OMIT_TIME`).
pub const MAX_OMIT: u64 = 600;
/// Largest MSS iperf3 accepts.
pub const MAX_MSS: u32 = 32_767;
/// The datagram a UDP stream's client sends first ("9876").
pub const UDP_HELLO: [u8; 4] = *b"9876";
/// The server's reply to it ("6789").
pub const UDP_REPLY: [u8; 4] = *b"6789";
/// The reply of servers before 3.1 (987654321 in host order).
pub const UDP_REPLY_LEGACY: [u8; 4] = 987_654_321u32.to_le_bytes();

/// iperf3's error numbers (`i_errno`, `iperf_api.h`) this crate sends or
/// names.
pub mod errno {
    /// Test duration too long.
    pub const DURATION: i32 = 5;
    /// Too many parallel streams.
    pub const NUMSTREAMS: i32 = 6;
    /// Block size too large.
    pub const BLOCKSIZE: i32 = 7;
    /// Socket buffer too large.
    pub const BUFSIZE: i32 = 8;
    /// MSS too large.
    pub const MSS: i32 = 10;
    /// Bad omit.
    pub const OMIT: i32 = 12;
    /// Not implemented.
    pub const UNIMP: i32 = 13;
    /// UDP block size invalid.
    pub const UDPBLOCKSIZE: i32 = 20;
    /// Control connection closed.
    pub const CTRLCLOSE: i32 = 109;
    /// Unknown message.
    pub const MESSAGE: i32 = 110;
    /// Cannot receive the parameters.
    pub const RECVPARAMS: i32 = 114;
    /// Cannot receive the results.
    pub const RECVRESULTS: i32 = 117;
    /// The server is busy.
    pub const ACCESSDENIED: i32 = 121;
    /// Cannot set the MSS.
    pub const SETMSS: i32 = 123;
    /// Cannot set a socket buffer.
    pub const SETBUF: i32 = 124;
    /// Cannot set the window size.
    pub const SETWINDOWSIZE: i32 = 130;
    /// Protocol does not exist.
    pub const PROTOCOL: i32 = 131;
    /// Cannot set the congestion control.
    pub const SETCONGESTION: i32 = 134;
    /// Socket buffer not what was asked.
    pub const SETBUF2: i32 = 141;
    /// Authentication failed.
    pub const AUTHTEST: i32 = 142;
    /// Cannot accept a data stream.
    pub const STREAMACCEPT: i32 = 204;
}

/// A state byte of the control connection (`iperf_api.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Streams are connected; the test is about to start.
    TestStart,
    /// Data flows.
    TestRunning,
    /// The client says the test is over.
    TestEnd,
    /// The server asks for the parameters.
    ParamExchange,
    /// The server asks the client to connect the data streams.
    CreateStreams,
    /// The server is going away (signal).
    ServerTerminate,
    /// The client is going away (signal).
    ClientTerminate,
    /// Time to swap results documents.
    ExchangeResults,
    /// The server has sent its results.
    DisplayResults,
    /// The client is done.
    IperfDone,
    /// The server is busy or the cookie is wrong.
    AccessDenied,
    /// The server failed; two big-endian `i32`s follow (iperf's error
    /// number and the system's).
    ServerError,
}

impl State {
    /// The byte on the wire (a signed char).
    pub fn byte(self) -> u8 {
        let v: i8 = match self {
            State::TestStart => 1,
            State::TestRunning => 2,
            State::TestEnd => 4,
            State::ParamExchange => 9,
            State::CreateStreams => 10,
            State::ServerTerminate => 11,
            State::ClientTerminate => 12,
            State::ExchangeResults => 13,
            State::DisplayResults => 14,
            State::IperfDone => 16,
            State::AccessDenied => -1,
            State::ServerError => -2,
        };
        v as u8
    }

    /// The state a byte names, if any.
    pub fn from_byte(b: u8) -> Option<State> {
        Some(match b as i8 {
            1 => State::TestStart,
            2 => State::TestRunning,
            4 => State::TestEnd,
            9 => State::ParamExchange,
            10 => State::CreateStreams,
            11 => State::ServerTerminate,
            12 => State::ClientTerminate,
            13 => State::ExchangeResults,
            14 => State::DisplayResults,
            16 => State::IperfDone,
            -1 => State::AccessDenied,
            -2 => State::ServerError,
            _ => return None,
        })
    }
}

/// A session cookie as it travels: 36 characters of iperf3's alphabet and
/// a NUL.
pub type Cookie = [u8; COOKIE_LEN];

/// Makes a cookie from 36 random bytes (iperf3's `make_cookie` alphabet).
pub fn make_cookie(random: &[u8; COOKIE_LEN - 1]) -> Cookie {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut c = [0u8; COOKIE_LEN];
    for (out, r) in c.iter_mut().zip(random) {
        *out = ALPHABET[usize::from(*r) % ALPHABET.len()];
    }
    c
}

/// Why bytes from the peer do not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A byte that names no state.
    #[error("unknown iperf3 state byte {0}")]
    UnknownState(i8),
    /// A JSON document's length is zero or above the cap.
    #[error("iperf3 JSON document of {len} bytes (allowed 1..={cap})")]
    JsonLength {
        /// The length announced.
        len: u64,
        /// The cap in force.
        cap: usize,
    },
    /// The document is not JSON, or not an object.
    #[error("bad iperf3 JSON document: {0}")]
    Json(String),
    /// A field the protocol requires is missing or of the wrong type.
    #[error("iperf3 {0} is missing or not a number")]
    Missing(&'static str),
    /// A value outside what iperf3 allows.
    #[error("iperf3 parameter {0}")]
    Range(String),
    /// A parameter iperf3 itself refuses, with its error number.
    #[error("iperf3 parameter {what}")]
    Refused {
        /// iperf3's `i_errno` for it.
        i_errno: i32,
        /// What is wrong.
        what: String,
    },
}

/// What the next bytes of the control connection should be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// A state byte (with `SERVER_ERROR`'s two codes, if that is what comes).
    State,
    /// A length-prefixed JSON document of at most this many bytes.
    Json(usize),
    /// A cookie (the first bytes of a control or TCP data connection).
    Cookie,
}

/// One decoded control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// A state byte (never `ServerError`: that comes as [`Msg::ServerError`]).
    State(State),
    /// `SERVER_ERROR` with iperf's error number and the system's `errno`.
    ServerError {
        /// iperf3's `i_errno`.
        i_errno: i32,
        /// The system's `errno`, 0 if none.
        errno: i32,
    },
    /// A JSON document, still text.
    Json(Vec<u8>),
    /// A cookie.
    Cookie(Cookie),
}

/// Decodes control messages from bytes pushed in, as they are expected.
#[derive(Debug, Default)]
pub struct Reader {
    buf: Vec<u8>,
}

impl Reader {
    /// An empty reader.
    pub fn new() -> Reader {
        Reader::default()
    }

    /// Adds bytes read from the socket.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Bytes held that no message has taken yet.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Bytes the next message of kind `expect` needs before it can decode
    /// (at least 1 while incomplete): read at most this many so that
    /// nothing past the message is taken from the socket.
    pub fn wanted(&self, expect: Expect) -> usize {
        let need = match expect {
            Expect::Cookie => COOKIE_LEN,
            Expect::State => match self.buf.first() {
                Some(&b) if b == State::ServerError.byte() => 9,
                _ => 1,
            },
            Expect::Json(cap) => match self.buf.get(..4) {
                Some(len) => {
                    let n = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
                    n.min(cap).saturating_add(4)
                }
                None => 4,
            },
        };
        need.saturating_sub(self.buf.len()).max(1)
    }

    /// The next message, `Ok(None)` until enough bytes are in.
    pub fn next(&mut self, expect: Expect) -> Result<Option<Msg>, WireError> {
        match expect {
            Expect::Cookie => {
                let Some(c) = self.buf.get(..COOKIE_LEN) else {
                    return Ok(None);
                };
                let mut cookie = [0u8; COOKIE_LEN];
                cookie.copy_from_slice(c);
                self.buf.drain(..COOKIE_LEN);
                Ok(Some(Msg::Cookie(cookie)))
            }
            Expect::State => {
                let Some(&b) = self.buf.first() else {
                    return Ok(None);
                };
                let state = State::from_byte(b).ok_or(WireError::UnknownState(b as i8))?;
                if state != State::ServerError {
                    self.buf.drain(..1);
                    return Ok(Some(Msg::State(state)));
                }
                let Some(codes) = self.buf.get(1..9) else {
                    return Ok(None);
                };
                let i_errno = i32::from_be_bytes([codes[0], codes[1], codes[2], codes[3]]);
                let errno = i32::from_be_bytes([codes[4], codes[5], codes[6], codes[7]]);
                self.buf.drain(..9);
                Ok(Some(Msg::ServerError { i_errno, errno }))
            }
            Expect::Json(cap) => {
                let Some(len) = self.buf.get(..4) else {
                    return Ok(None);
                };
                let n = u32::from_be_bytes([len[0], len[1], len[2], len[3]]);
                if n == 0 || n as usize > cap {
                    return Err(WireError::JsonLength {
                        len: u64::from(n),
                        cap,
                    });
                }
                // n <= cap, so this only saturates for an absurd cap.
                let end = (n as usize).saturating_add(4);
                if self.buf.len() < end {
                    return Ok(None);
                }
                let doc = self.buf[4..end].to_vec();
                self.buf.drain(..end);
                Ok(Some(Msg::Json(doc)))
            }
        }
    }
}

/// Frames a JSON document: a 4-byte big-endian length, then the text.
pub fn encode_json(doc: &Value) -> Vec<u8> {
    let text = doc.to_string();
    let mut out = Vec::with_capacity(4 + text.len());
    out.extend_from_slice(&(text.len() as u32).to_be_bytes());
    out.extend_from_slice(text.as_bytes());
    out
}

/// `SERVER_ERROR` with its two codes.
pub fn encode_server_error(i_errno: i32, errno: i32) -> Vec<u8> {
    let mut out = vec![State::ServerError.byte()];
    out.extend_from_slice(&i_errno.to_be_bytes());
    out.extend_from_slice(&errno.to_be_bytes());
    out
}

/// Transport of a test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP (recognised so that it can be refused).
    Sctp,
}

/// A test's parameters (`send_parameters`/`get_parameters`), the keys
/// fatpipe understands plus the ones it must notice to refuse.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Params {
    /// The transport; `None` if the document names none.
    pub transport: Option<Transport>,
    /// Warm-up, seconds.
    pub omit: u64,
    /// Test length, seconds (0 with a byte or block count).
    pub time: u64,
    /// Bytes to send in all, 0 for none.
    pub num: u64,
    /// Blocks to send in all, 0 for none.
    pub blockcount: u64,
    /// Streams (per direction).
    pub parallel: u32,
    /// The server sends.
    pub reverse: bool,
    /// Both send.
    pub bidirectional: bool,
    /// Socket buffer, bytes.
    pub window: Option<u64>,
    /// TCP MSS.
    pub mss: Option<u32>,
    /// Write or datagram size.
    pub len: Option<u32>,
    /// UDP (or paced TCP) rate per stream, bit/s.
    pub bandwidth: Option<u64>,
    /// Pacing cap per stream, bit/s.
    pub fqrate: Option<u64>,
    /// Congestion control asked for.
    pub congestion: Option<String>,
    /// The client wants the server's report in the results.
    pub get_server_output: bool,
    /// UDP sequence numbers are 64-bit.
    pub udp_counters_64bit: bool,
    /// TCP_NODELAY on the data streams.
    pub nodelay: bool,
    /// The client's version string.
    pub client_version: Option<String>,
    /// An RSA-encrypted credential (`--username`).
    pub authtoken: Option<String>,
    /// Keys present that this implementation does not carry out (TOS,
    /// flow label, burst, MPTCP, don't-fragment, ...), named for the error.
    pub unsupported: Vec<&'static str>,
}

impl Params {
    /// Reads a parameters document the way iperf3 does.
    pub fn parse(doc: &[u8]) -> Result<Params, WireError> {
        let v = object(doc)?;
        let flag = |k: &str| matches!(v.get(k), Some(Value::Bool(true)));
        let num = |k: &str| v.get(k).and_then(number);
        let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        let transport = if flag("tcp") {
            Some(Transport::Tcp)
        } else if flag("udp") {
            Some(Transport::Udp)
        } else if flag("sctp") {
            Some(Transport::Sctp)
        } else {
            None
        };
        let mut p = Params {
            transport,
            omit: num("omit").unwrap_or(0),
            time: num("time").unwrap_or(0),
            num: num("num").unwrap_or(0),
            blockcount: num("blockcount").unwrap_or(0),
            parallel: num("parallel").map_or(1, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            reverse: flag("reverse"),
            bidirectional: flag("bidirectional"),
            window: num("window").filter(|&w| w > 0),
            mss: num("MSS")
                .filter(|&m| m > 0)
                .map(|m| m.min(u64::from(u32::MAX)) as u32),
            len: num("len")
                .filter(|&l| l > 0)
                .map(|l| l.min(u64::from(u32::MAX)) as u32),
            bandwidth: num("bandwidth").filter(|&b| b > 0),
            fqrate: num("fqrate").filter(|&b| b > 0),
            congestion: text("congestion"),
            get_server_output: num("get_server_output").is_some_and(|n| n != 0),
            udp_counters_64bit: num("udp_counters_64bit").is_some_and(|n| n != 0),
            nodelay: flag("nodelay"),
            client_version: text("client_version"),
            authtoken: text("authtoken"),
            unsupported: Vec::new(),
        };
        for (key, set) in [
            ("TOS", num("TOS").is_some_and(|n| n != 0)),
            ("flowlabel", num("flowlabel").is_some_and(|n| n != 0)),
            ("burst", num("burst").is_some_and(|n| n > 1)),
            ("mptcp", flag("mptcp")),
            (
                "dont_fragment",
                num("dont_fragment").is_some_and(|n| n != 0),
            ),
            ("server_affinity", num("server_affinity").is_some()),
            ("gso", num("gso").is_some_and(|n| n != 0)),
        ] {
            if set {
                p.unsupported.push(key);
            }
        }
        Ok(p)
    }

    /// The document a client sends (`send_parameters`).
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        let key = match self.transport.unwrap_or(Transport::Tcp) {
            Transport::Tcp => "tcp",
            Transport::Udp => "udp",
            Transport::Sctp => "sctp",
        };
        m.insert(key.into(), json!(true));
        m.insert("omit".into(), json!(self.omit));
        m.insert("time".into(), json!(self.time));
        m.insert("num".into(), json!(self.num));
        m.insert("blockcount".into(), json!(self.blockcount));
        m.insert("parallel".into(), json!(self.parallel));
        if self.reverse {
            m.insert("reverse".into(), json!(true));
        }
        if self.bidirectional {
            m.insert("bidirectional".into(), json!(true));
        }
        if self.nodelay {
            m.insert("nodelay".into(), json!(true));
        }
        for (k, v) in [
            ("window", self.window),
            ("MSS", self.mss.map(u64::from)),
            ("len", self.len.map(u64::from)),
            ("bandwidth", self.bandwidth),
            ("fqrate", self.fqrate),
        ] {
            if let Some(v) = v {
                m.insert(k.into(), json!(v));
            }
        }
        if let Some(c) = &self.congestion {
            m.insert("congestion".into(), json!(c));
        }
        if self.get_server_output {
            m.insert("get_server_output".into(), json!(1));
        }
        if self.udp_counters_64bit {
            m.insert("udp_counters_64bit".into(), json!(1));
        }
        if let Some(v) = &self.client_version {
            m.insert("client_version".into(), json!(v));
        }
        if let Some(t) = &self.authtoken {
            m.insert("authtoken".into(), json!(t));
        }
        Value::Object(m)
    }

    /// Checks the ranges iperf3 checks; the error carries iperf3's error
    /// number for the refusal and names the parameter.
    pub fn check(&self) -> Result<(), WireError> {
        let refuse = |i_errno: i32, what: String| Err(WireError::Refused { i_errno, what });
        if self.omit > MAX_OMIT {
            return refuse(
                errno::OMIT,
                format!("omit {} s is above {MAX_OMIT}", self.omit),
            );
        }
        if self.time > MAX_TIME {
            return refuse(
                errno::DURATION,
                format!("time {} s is above {MAX_TIME}", self.time),
            );
        }
        if self.parallel == 0 || self.parallel > MAX_STREAMS {
            return refuse(
                errno::NUMSTREAMS,
                format!("parallel {} is not 1..={MAX_STREAMS}", self.parallel),
            );
        }
        if self.window.is_some_and(|w| w > MAX_WINDOW) {
            return refuse(errno::BUFSIZE, "window is above 512 MiB".into());
        }
        if self.mss.is_some_and(|m| m > MAX_MSS) {
            return refuse(errno::MSS, format!("MSS is above {MAX_MSS}"));
        }
        match (self.transport, self.len) {
            (Some(Transport::Udp), Some(l)) if !UDP_BLOCK.contains(&l) => refuse(
                errno::UDPBLOCKSIZE,
                format!("len {l} is not 16..=65507 for UDP"),
            ),
            (_, Some(l)) if l > MAX_TCP_BLOCK => {
                refuse(errno::BLOCKSIZE, format!("len {l} is above 1 MiB"))
            }
            _ => Ok(()),
        }
    }
}

/// One stream's entry of a results document.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StreamResult {
    /// Stream id (1, 3, 4, …).
    pub id: u32,
    /// Sender: bytes sent after the warm-up; receiver: bytes received.
    pub bytes: u64,
    /// TCP retransmits, `None` where unknown (-1).
    pub retransmits: Option<u64>,
    /// UDP jitter, seconds.
    pub jitter: f64,
    /// UDP datagrams lost.
    pub errors: u64,
    /// UDP datagrams (sent or received).
    pub packets: u64,
    /// Seconds from the stream's start to its end.
    pub end_time: f64,
}

/// A results document (`send_results`/`get_results`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Results {
    /// CPU of that end's process, percent.
    pub cpu_total: f64,
    /// User part.
    pub cpu_user: f64,
    /// System part.
    pub cpu_system: f64,
    /// 1 if that end sent with TCP_INFO retransmits, 0 if it sent without,
    /// -1 if it only received.
    pub sender_has_retransmits: i64,
    /// The congestion control that end used.
    pub congestion_used: Option<String>,
    /// Per stream.
    pub streams: Vec<StreamResult>,
    /// That end's report as text (`--get-server-output`).
    pub server_output_text: Option<String>,
    /// That end's report as JSON (`--get-server-output` with `-J`).
    pub server_output_json: Option<Value>,
}

impl Results {
    /// Reads a results document; the fields `get_results` requires must
    /// be there.
    pub fn parse(doc: &[u8]) -> Result<Results, WireError> {
        let v = object(doc)?;
        let f = |k: &'static str| v.get(k).and_then(signed).ok_or(WireError::Missing(k));
        let streams = v
            .get("streams")
            .and_then(Value::as_array)
            .ok_or(WireError::Missing("streams"))?;
        if streams.len() > MAX_RESULT_STREAMS {
            return Err(WireError::Range(format!(
                "results list {} streams (at most {MAX_RESULT_STREAMS})",
                streams.len()
            )));
        }
        let mut out = Results {
            cpu_total: f("cpu_util_total")?,
            cpu_user: f("cpu_util_user")?,
            cpu_system: f("cpu_util_system")?,
            sender_has_retransmits: f("sender_has_retransmits")? as i64,
            congestion_used: v
                .get("congestion_used")
                .and_then(Value::as_str)
                .map(str::to_owned),
            streams: Vec::with_capacity(streams.len()),
            server_output_text: v
                .get("server_output_text")
                .and_then(Value::as_str)
                .map(str::to_owned),
            server_output_json: v.get("server_output_json").cloned(),
        };
        for s in streams {
            let g = |k: &'static str| s.get(k).and_then(signed).ok_or(WireError::Missing(k));
            let id = g("id")?;
            // iperf3 before 3.14 prints -1 as 2^64 - 1.
            let retr = g("retransmits")?;
            out.streams.push(StreamResult {
                id: if (0.0..=f64::from(u32::MAX)).contains(&id) {
                    id as u32
                } else {
                    return Err(WireError::Missing("id"));
                },
                bytes: g("bytes")?.max(0.0) as u64,
                retransmits: (retr >= 0.0).then_some(retr as u64),
                jitter: g("jitter")?,
                errors: g("errors")?.max(0.0) as u64,
                packets: g("packets")?.max(0.0) as u64,
                end_time: s.get("end_time").and_then(Value::as_f64).unwrap_or(0.0),
            });
        }
        Ok(out)
    }

    /// The document this end sends.
    pub fn to_json(&self) -> Value {
        let streams: Vec<Value> = self
            .streams
            .iter()
            .map(|s| {
                json!({
                    "id": s.id,
                    "bytes": s.bytes,
                    "retransmits": s.retransmits.map_or(-1, |r| r as i64),
                    "jitter": s.jitter,
                    "errors": s.errors,
                    "omitted_errors": 0,
                    "packets": s.packets,
                    "omitted_packets": 0,
                    "start_time": 0,
                    "end_time": s.end_time,
                })
            })
            .collect();
        let mut m = Map::new();
        m.insert("cpu_util_total".into(), json!(self.cpu_total));
        m.insert("cpu_util_user".into(), json!(self.cpu_user));
        m.insert("cpu_util_system".into(), json!(self.cpu_system));
        m.insert(
            "sender_has_retransmits".into(),
            json!(self.sender_has_retransmits),
        );
        if let Some(c) = &self.congestion_used {
            m.insert("congestion_used".into(), json!(c));
        }
        m.insert("streams".into(), Value::Array(streams));
        if let Some(t) = &self.server_output_text {
            m.insert("server_output_text".into(), json!(t));
        }
        if let Some(j) = &self.server_output_json {
            m.insert("server_output_json".into(), j.clone());
        }
        Value::Object(m)
    }
}

/// Stream ids in creation order: 1, 3, 4, 5, … (iperf3 skips 2).
pub fn stream_id(index: usize) -> u32 {
    if index == 0 {
        1
    } else {
        index as u32 + 2
    }
}

/// A number of a results document. iperf3 before 3.14 printed signed
/// numbers as unsigned 64-bit ones, so -1 arrives as
/// 18446744073709551615: an integer past `i64::MAX` is read as the
/// negative number it was.
fn signed(v: &Value) -> Option<f64> {
    match v.as_u64() {
        Some(u) if u > i64::MAX as u64 => Some(u as i64 as f64),
        _ => v.as_f64(),
    }
}

/// A JSON object from a document.
fn object(doc: &[u8]) -> Result<Map<String, Value>, WireError> {
    match serde_json::from_slice::<Value>(doc) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(WireError::Json("not an object".into())),
        Err(e) => Err(WireError::Json(e.to_string())),
    }
}

/// A non-negative whole number from any JSON number (cJSON may print one
/// as `1.2e+10`); negative, fractional parts and non-numbers are `None`
/// or truncated as iperf3's `valueint` would.
fn number(v: &Value) -> Option<u64> {
    let f = v.as_f64()?;
    (f >= 0.0 && f.is_finite()).then(|| f.min(u64::MAX as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_bytes_round_trip() {
        for b in 0..=255u8 {
            if let Some(s) = State::from_byte(b) {
                assert_eq!(s.byte(), b);
            }
        }
        assert_eq!(State::AccessDenied.byte(), 0xff);
        assert_eq!(State::ServerError.byte(), 0xfe);
        assert_eq!(State::ParamExchange.byte(), 9);
    }

    #[test]
    fn reader_takes_states_server_errors_and_json_in_pieces() {
        let mut r = Reader::new();
        let mut wire = vec![State::ParamExchange.byte()];
        wire.extend(encode_server_error(118, 2));
        wire.extend(encode_json(&json!({"a": 1})));
        let mut got = Vec::new();
        for expect in [Expect::State, Expect::State, Expect::Json(64)] {
            loop {
                if let Some(m) = r.next(expect).unwrap() {
                    got.push(m);
                    break;
                }
                let n = r.wanted(expect).min(wire.len());
                assert!(n > 0, "ran out of input for {expect:?}");
                r.push(&wire[..1.min(n)]);
                wire.drain(..1.min(n));
            }
        }
        assert_eq!(got[0], Msg::State(State::ParamExchange));
        assert_eq!(
            got[1],
            Msg::ServerError {
                i_errno: 118,
                errno: 2
            }
        );
        assert_eq!(got[2], Msg::Json(br#"{"a":1}"#.to_vec()));
        assert_eq!(r.buffered(), 0);
    }

    #[test]
    fn json_length_is_capped_from_the_length_alone() {
        let mut r = Reader::new();
        r.push(&9000u32.to_be_bytes());
        assert!(matches!(
            r.next(Expect::Json(MAX_PARAMS_JSON)),
            Err(WireError::JsonLength { len: 9000, .. })
        ));
        let mut r = Reader::new();
        r.push(&0u32.to_be_bytes());
        assert!(r.next(Expect::Json(10)).is_err());
        assert_eq!(Reader::new().wanted(Expect::Json(10)), 4);
        let mut r = Reader::new();
        r.push(&u32::MAX.to_be_bytes());
        assert_eq!(r.wanted(Expect::Json(10)), 10, "never more than the cap");
        let mut r = Reader::new();
        r.push(&[3]);
        assert_eq!(r.next(Expect::State), Err(WireError::UnknownState(3)));
    }

    #[test]
    fn cookies_use_iperf3s_alphabet_and_end_in_nul() {
        let c = make_cookie(&[255; 36]);
        assert_eq!(c[36], 0);
        assert!(c[..36]
            .iter()
            .all(|b| b"abcdefghijklmnopqrstuvwxyz234567".contains(b)));
        let mut r = Reader::new();
        r.push(&c);
        assert_eq!(r.next(Expect::Cookie).unwrap(), Some(Msg::Cookie(c)));
    }

    #[test]
    fn params_read_like_iperf3_wrong_types_ignored() {
        let doc = br#"{"tcp":true,"omit":2,"time":5,"num":0,"blockcount":0,"parallel":4,
            "reverse":true,"window":"big","len":131072,"MSS":1.4e3,"TOS":0,
            "congestion":"bbr","get_server_output":1,"client_version":"3.12","burst":7}"#;
        let p = Params::parse(doc).unwrap();
        assert_eq!(p.transport, Some(Transport::Tcp));
        assert_eq!((p.omit, p.time, p.parallel), (2, 5, 4));
        assert!(p.reverse && !p.bidirectional && p.get_server_output);
        assert_eq!(p.window, None, "a string window is ignored");
        assert_eq!(p.mss, Some(1400));
        assert_eq!(p.congestion.as_deref(), Some("bbr"));
        assert_eq!(p.unsupported, vec!["burst"]);
        assert!(p.check().is_ok());
        let back = Params::parse(p.to_json().to_string().as_bytes()).unwrap();
        assert_eq!(back.parallel, 4);
        assert!(back.reverse);
        for bad in [
            r#"{"tcp":true,"parallel":129}"#,
            r#"{"tcp":true,"parallel":0}"#,
            r#"{"udp":true,"len":8}"#,
            r#"{"tcp":true,"len":2000000}"#,
            r#"{"tcp":true,"time":90000}"#,
        ] {
            assert!(
                Params::parse(bad.as_bytes()).unwrap().check().is_err(),
                "{bad}"
            );
        }
        assert!(Params::parse(b"[1]").is_err());
        assert!(Params::parse(b"{").is_err());
    }

    #[test]
    fn results_round_trip_and_require_iperf3s_fields() {
        let r = Results {
            cpu_total: 12.5,
            cpu_user: 2.5,
            cpu_system: 10.0,
            sender_has_retransmits: 1,
            congestion_used: Some("cubic".into()),
            streams: vec![StreamResult {
                id: 3,
                bytes: 12_345_678_901,
                retransmits: None,
                jitter: 0.001,
                errors: 2,
                packets: 100,
                end_time: 10.0,
            }],
            server_output_text: Some("hi".into()),
            server_output_json: None,
        };
        let back = Results::parse(r.to_json().to_string().as_bytes()).unwrap();
        assert_eq!(back, r);
        // cJSON prints big integers with an exponent.
        let doc = br#"{"cpu_util_total":1,"cpu_util_user":0,"cpu_util_system":1,
            "sender_has_retransmits":-1,"streams":[{"id":1,"bytes":1.2345e10,
            "retransmits":-1,"jitter":0,"errors":0,"packets":0}]}"#;
        assert_eq!(
            Results::parse(doc).unwrap().streams[0].bytes,
            12_345_000_000
        );
        let missing = br#"{"cpu_util_total":1,"cpu_util_user":0,"cpu_util_system":1,
            "sender_has_retransmits":-1,"streams":[{"id":1,"bytes":1}]}"#;
        assert!(Results::parse(missing).is_err());
    }

    #[test]
    fn ids_skip_two() {
        let ids: Vec<u32> = (0..4).map(stream_id).collect();
        assert_eq!(ids, vec![1, 3, 4, 5]);
    }

    #[test]
    fn json_lengths_at_and_past_the_cap_and_at_u32_max_do_not_overflow() {
        let framed = |len: u32, body: &[u8]| [&len.to_be_bytes()[..], body].concat();
        for cap in [MAX_RESULTS_JSON, usize::MAX] {
            let mut r = Reader::new();
            r.push(&framed(u32::MAX, b"{}"));
            assert!(r.wanted(Expect::Json(cap)) >= 1);
            if cap == usize::MAX {
                // Within this cap: waits for the body, never wraps.
                assert!(matches!(r.next(Expect::Json(cap)), Ok(None)));
            } else {
                assert!(matches!(
                    r.next(Expect::Json(cap)),
                    Err(WireError::JsonLength { len, .. }) if len == u64::from(u32::MAX)
                ));
            }
        }
        // Zero is refused; exactly the cap decodes; one past it is refused.
        let mut r = Reader::new();
        r.push(&framed(0, b""));
        assert!(r.next(Expect::Json(2)).is_err());
        let mut r = Reader::new();
        r.push(&framed(2, b"{}"));
        assert_eq!(r.wanted(Expect::Json(2)), 1);
        assert!(matches!(r.next(Expect::Json(2)), Ok(Some(Msg::Json(d))) if d == b"{}"));
        let mut r = Reader::new();
        r.push(&framed(3, b"{} "));
        assert!(r.next(Expect::Json(2)).is_err());
    }
}
