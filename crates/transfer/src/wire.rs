//! The copy protocol's messages and their codec (sans-IO).
//!
//! A copy session runs over one *copy-control* connection and N *data*
//! connections, all dialed by the client through the engine (which has
//! already authenticated the session). Each connection opens with an 8-byte
//! [`Hello`] naming its role.
//!
//! * Control messages are frames: a 4-byte big-endian length (at most
//!   [`MAX_FRAME`]) and a payload whose first byte is the message type. The
//!   client's first message is a [`Request`] carrying the protocol
//!   [`VERSION`]; a server that speaks another version refuses it.
//! * Data connections carry chunks: a fixed 32-byte [`ChunkHeader`] (with
//!   its own check value, so a damaged header is caught before its length is
//!   trusted), `len` payload bytes, then the chunk digest (16 or 32 bytes).
//!
//! Decoding works on byte slices and never allocates more than the frame it
//! was given; every count and length is checked against what remains, so a
//! hostile peer can waste at most one frame's worth of memory. The decoders
//! are fuzzed (`fuzz/fuzz_targets/copy_wire.rs`). The small blocking helpers
//! at the bottom ([`read_msg`], [`write_msg`]) only move frames.

use std::io::{self, Read, Write};

use crate::hash::Algo;
use crate::relpath::{PathError, RelPath, MAX_PATH};
use crate::{FailureKind, Reason};

/// Protocol version; bumped on any incompatible change (2: streams added
/// mid-session, sender statistics, congestion switches, the server's socket
/// settings in the request; 3: a pushing client sends its manifest right
/// behind the request, and its data connections' hellos right behind the
/// engine's data hello, without waiting for the answers; 4: rsync's
/// destination rule (a source path ending in `/`, or the export itself,
/// sends the directory's contents, not the directory), and the sender's
/// [`Msg::Notes`] on what it skipped or changed; 5: a `FileFailed` carries
/// its failure's kind, so the other end acts on a full disk without
/// reading the message).
pub const VERSION: u16 = 5;
/// The largest control frame accepted (payload bytes).
pub const MAX_FRAME: usize = 1 << 20;
/// The largest chunk accepted on a data connection.
pub const MAX_CHUNK: u32 = 64 << 20;
/// The most paths one request may name.
pub const MAX_REQUEST_PATHS: usize = 4096;
/// The longest message string accepted.
pub const MAX_TEXT: usize = 4096;
/// The most [`Note`]s a sender lists in one session (past it, one
/// [`NoteKind::More`] note says how many more there were).
pub const MAX_NOTES: usize = 10_000;
/// The most congestion-control names an [`Accept`] may list.
pub const MAX_CONGESTION_NAMES: usize = 64;
/// The longest congestion-control name (the kernel's `TCP_CA_NAME_MAX` is 16).
pub const MAX_CONGESTION_NAME: usize = 16;
/// Size of a chunk header on a data connection.
pub const HEADER_LEN: usize = 32;

/// Why bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The message ended before a field did.
    #[error("message truncated")]
    UnexpectedEnd,
    /// Bytes left over after the message.
    #[error("trailing bytes after message")]
    Trailing,
    /// A frame longer than the cap.
    #[error("frame of {0} bytes exceeds the limit")]
    TooLarge(usize),
    /// An unknown message type or enum value.
    #[error("unknown {what} {value}")]
    Unknown {
        /// Which field.
        what: &'static str,
        /// The value seen.
        value: u64,
    },
    /// The connection does not speak this protocol.
    #[error("not a fatpipe copy connection")]
    BadMagic,
    /// A chunk header whose check value does not match.
    #[error("corrupt chunk header")]
    BadHeader,
    /// A path the peer sent is not allowed.
    #[error("bad path from peer: {0}")]
    Path(#[from] PathError),
    /// A string that is not UTF-8.
    #[error("text is not UTF-8")]
    Utf8,
}

/// Which way files move, seen from the client.
///
/// Means what `fatpipe_schema::copy::CopyDirection` means, but is kept
/// apart on purpose: this one is a byte of the binary copy protocol, coded
/// by this module, and `transfer` depends on no result types (only on
/// `sys`); the schema's is the JSON report's `"push"`/`"pull"`. The binary
/// maps one onto the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client sends, server stores.
    Push,
    /// Server sends, client stores.
    Pull,
}

/// The client's opening message on the copy-control connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The client's protocol version.
    pub version: u16,
    /// Push or pull.
    pub direction: Direction,
    /// Copy directories recursively (pull: the server walks them).
    pub recursive: bool,
    /// Flush data before journaling and before renaming (`--sync`).
    pub sync: bool,
    /// Use O_DIRECT on the storing side (`--direct`).
    pub direct: bool,
    /// Chunk checksum.
    pub algo: Algo,
    /// Data connections the client will open.
    pub streams: u16,
    /// Chunk size in bytes.
    pub chunk_size: u32,
    /// Sending-rate cap in bit/s (0: none); the sender honours it, so a
    /// pull is capped on the server.
    pub bwlimit: u64,
    /// The export name.
    pub export: Vec<u8>,
    /// Pull: export-relative sources. Push: one entry, the destination.
    /// Raw bytes: the server validates them and refuses with a clear message.
    pub paths: Vec<Vec<u8>>,
    /// What the server sets on its data sockets (auto-tuning's plan).
    pub tuning: SocketTuning,
}

/// Socket settings the client asks the server to apply to its data
/// connections, so that the window the planner chose holds at both ends
/// (a push's receiver would otherwise let kernel autotuning open far wider
/// windows than the plan, and a pull's sender would keep its own congestion
/// control). Every field's zero value means "leave the kernel's default".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SocketTuning {
    /// Per-socket buffer in bytes: SO_RCVBUF on a push, SO_SNDBUF on a pull.
    pub buffer: u64,
    /// Force the buffer past the host caps (the server does so only when
    /// privileged, and never past its own bound).
    pub force: bool,
    /// Congestion control for the sending sockets of a pull.
    pub congestion: String,
    /// Per-stream pacing rate in bit/s for the sending sockets of a pull.
    pub pacing: u64,
    /// The smaller window a receiver holds each data connection at first,
    /// during the sender's start-up (`fatpipe_sys::WindowHold::starting_at`);
    /// 0 for none. Since version 3.
    pub start_window: u64,
    /// How long after a connection's first data the start window holds, in
    /// milliseconds (the receiver holds it at most 60 s).
    pub start_ms: u32,
}

/// The server's acceptance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accept {
    /// Data connections to open (may be fewer than asked).
    pub streams: u16,
    /// The I/O path the server will use ("sendfile", "pwrite", ...).
    pub io: String,
    /// The most data connections the session may have in all, counting
    /// those added later with [`Msg::AddStreams`].
    pub max_streams: u16,
    /// The congestion control the server's data sockets start with.
    pub congestion: String,
    /// Congestion controls the server may switch its sockets to
    /// ([`Msg::SetCongestion`]); empty when unknown.
    pub congestion_allowed: Vec<String>,
}

/// The sending end's TCP counters, summed over its data connections
/// (from `TCP_INFO`). Counters run from the start of the session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SenderStats {
    /// Data connections counted.
    pub streams: u16,
    /// Payload bytes the receiver acknowledged.
    pub bytes_acked: u64,
    /// Segments retransmitted.
    pub retransmits: u64,
    /// Smoothed RTT averaged over the connections, microseconds.
    pub rtt_us: u32,
    /// The congestion control of the connections (of the first, if mixed).
    pub congestion: String,
}

/// Whose fault a refusal is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefuseClass {
    /// The request was wrong (bad path, unknown export, read-only): exit 2.
    Usage,
    /// The server could not do it (I/O error): exit 1.
    Failed,
}

/// The server's refusal, with one line saying why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refuse {
    /// Usage or failure.
    pub class: RefuseClass,
    /// What to do.
    pub message: String,
}

/// What a manifest entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File {
        /// Its size.
        size: u64,
        /// Fewer blocks allocated than its size: holes should stay holes.
        sparse: bool,
    },
    /// A directory (created even when empty).
    Dir,
    /// A symlink, copied as a link.
    Symlink {
        /// Its target, verbatim.
        target: Vec<u8>,
    },
}

/// One object of the tree being copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Path relative to the destination base; parents come first.
    pub path: RelPath,
    /// Kind and kind-specific data.
    pub kind: EntryKind,
    /// Permission bits.
    pub mode: u32,
    /// Modification time (seconds).
    pub mtime_s: i64,
    /// Modification time (nanoseconds).
    pub mtime_ns: u32,
}

/// The chunks of one file the receiver still needs, as half-open index ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    /// Index of the file in the manifest.
    pub file: u32,
    /// `[start, end)` chunk ranges.
    pub ranges: Vec<(u32, u32)>,
}

/// The receiver's account of a finished session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Files whose every chunk was verified and which now carry their final name.
    pub files_verified: u64,
    /// Files already complete at the destination (size and mtime match).
    pub files_skipped: u64,
    /// Files that failed (each was reported with a `FileFailed`).
    pub files_failed: u64,
    /// Payload bytes written this session.
    pub bytes_written: u64,
    /// Chunks that failed their check and were sent again.
    pub chunks_resent: u64,
    /// The receiver's I/O path.
    pub io: String,
}

/// A control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// Client → server: what to copy.
    Request(Request),
    /// Server → client: go ahead.
    Accept(Accept),
    /// Server → client: no, and why.
    Refuse(Refuse),
    /// Sender → receiver: manifest entries (in order, possibly many messages).
    Entries(Vec<Entry>),
    /// Sender → receiver: the manifest is complete.
    EntriesEnd {
        /// Total entries sent, as a cross-check.
        count: u32,
    },
    /// Receiver → sender: chunks needed.
    Need(Vec<Need>),
    /// Receiver → sender: no more needs; the sender starts streaming.
    NeedEnd,
    /// Receiver → sender: chunk failed its check; send it again.
    Resend {
        /// File index.
        file: u32,
        /// Chunk index.
        chunk: u32,
    },
    /// Either way: this file could not be copied (one line why, and its
    /// kind).
    FileFailed {
        /// File index.
        file: u32,
        /// What went wrong.
        message: Reason,
    },
    /// Receiver → sender: every file is complete or failed.
    Done(Summary),
    /// Either way: the session cannot go on.
    Abort {
        /// Why.
        message: String,
    },
    /// Client → server: the client wants `n` more data connections.
    AddStreams {
        /// How many.
        n: u16,
    },
    /// Server → client: open `n` more data connections now (0: none; the
    /// session is at its cap). Their tags continue after the last one.
    StreamsAdded {
        /// How many the server will accept.
        n: u16,
    },
    /// Client → server: switch the server's data sockets (and any added
    /// later) to this congestion control. Only meaningful when the server
    /// sends (pull); the next [`Msg::Stats`] shows the outcome.
    SetCongestion {
        /// Kernel name, e.g. "bbr".
        name: String,
    },
    /// Server → client, about once a second while the server sends (pull):
    /// its TCP counters, so the client can tune from the sending end.
    Stats(SenderStats),
    /// Sender → receiver, with the manifest (before `EntriesEnd`): what
    /// the walk skipped or changed, so a pull tells its user what a push
    /// would (since version 4).
    Notes(Vec<Note>),
}

/// What the sender's walk did to one object other than copy it as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoteKind {
    /// Not copied by policy: a FIFO, socket or device.
    Skipped,
    /// A hard link to a file listed earlier: copied as a separate file.
    HardLink,
    /// Not copied because of an error (unreadable, unlistable).
    Problem,
    /// The list stopped at [`MAX_NOTES`]; `detail` says how many more.
    More,
}

/// One [`Msg::Notes`] line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// What happened.
    pub kind: NoteKind,
    /// The object, relative to the copy's destination (as the sender names it).
    pub path: String,
    /// Skipped: what it is; hard link: the path it is linked with;
    /// problem: the error; more: the count.
    pub detail: String,
}

/// The role a connection declares in its first 8 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hello {
    /// The copy-control connection.
    Control,
    /// A data connection.
    Data,
}

const HELLO_MAGIC: &[u8; 6] = b"FPCOPY";

impl Hello {
    /// The 8 bytes on the wire.
    pub fn encode(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[..6].copy_from_slice(HELLO_MAGIC);
        b[6] = VERSION as u8;
        b[7] = match self {
            Hello::Control => 1,
            Hello::Data => 2,
        };
        b
    }

    /// Parses the 8 bytes.
    pub fn decode(b: &[u8; 8]) -> Result<Hello, WireError> {
        if &b[..6] != HELLO_MAGIC {
            return Err(WireError::BadMagic);
        }
        if u16::from(b[6]) != VERSION {
            return Err(WireError::Unknown {
                what: "copy protocol version",
                value: u64::from(b[6]),
            });
        }
        match b[7] {
            1 => Ok(Hello::Control),
            2 => Ok(Hello::Data),
            v => Err(WireError::Unknown {
                what: "connection role",
                value: u64::from(v),
            }),
        }
    }
}

/// What follows a chunk header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkKind {
    /// `len` payload bytes, then the digest.
    Data,
    /// A hole of `len` bytes: no payload, no digest.
    Hole,
    /// The sender is finished with this connection.
    End,
}

/// The fixed header before each chunk on a data connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    /// Data, hole or end.
    pub kind: ChunkKind,
    /// File index in the manifest.
    pub file: u32,
    /// Byte offset in the file (a multiple of the chunk size).
    pub offset: u64,
    /// Payload length.
    pub len: u32,
}

const HDR_MAGIC: &[u8; 2] = b"FC";

impl ChunkHeader {
    /// The end-of-connection marker.
    pub fn end() -> ChunkHeader {
        ChunkHeader {
            kind: ChunkKind::End,
            file: 0,
            offset: 0,
            len: 0,
        }
    }

    /// The 32 header bytes: fields, then an xxh3-64 of them.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[..2].copy_from_slice(HDR_MAGIC);
        b[2] = match self.kind {
            ChunkKind::Data => 1,
            ChunkKind::Hole => 2,
            ChunkKind::End => 3,
        };
        b[4..8].copy_from_slice(&self.file.to_be_bytes());
        b[8..16].copy_from_slice(&self.offset.to_be_bytes());
        b[16..20].copy_from_slice(&self.len.to_be_bytes());
        let check = xxhash_rust::xxh3::xxh3_64(&b[..24]);
        b[24..].copy_from_slice(&check.to_be_bytes());
        b
    }

    /// Parses and checks a header.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<ChunkHeader, WireError> {
        if &b[..2] != HDR_MAGIC {
            return Err(WireError::BadMagic);
        }
        let check = u64::from_be_bytes(arr8(&b[24..32]));
        if check != xxhash_rust::xxh3::xxh3_64(&b[..24]) {
            return Err(WireError::BadHeader);
        }
        let kind = match b[2] {
            1 => ChunkKind::Data,
            2 => ChunkKind::Hole,
            3 => ChunkKind::End,
            v => {
                return Err(WireError::Unknown {
                    what: "chunk kind",
                    value: u64::from(v),
                })
            }
        };
        let len = u32::from_be_bytes(arr4(&b[16..20]));
        if len > MAX_CHUNK {
            return Err(WireError::TooLarge(len as usize));
        }
        Ok(ChunkHeader {
            kind,
            file: u32::from_be_bytes(arr4(&b[4..8])),
            offset: u64::from_be_bytes(arr8(&b[8..16])),
            len,
        })
    }
}

impl Msg {
    /// Appends the framed message (length prefix included) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; 4]);
        let mut w = Writer(out);
        match self {
            Msg::Request(r) => {
                w.u8(1);
                w.u16(r.version);
                w.u8(match r.direction {
                    Direction::Push => 1,
                    Direction::Pull => 2,
                });
                w.u8(u8::from(r.recursive) | u8::from(r.sync) << 1 | u8::from(r.direct) << 2);
                w.u8(r.algo.code());
                w.u16(r.streams);
                w.u32(r.chunk_size);
                w.u64(r.bwlimit);
                w.bytes(&r.export);
                w.u32(r.paths.len() as u32);
                for p in &r.paths {
                    w.bytes(p);
                }
                w.u64(r.tuning.buffer);
                w.u8(u8::from(r.tuning.force));
                w.bytes(r.tuning.congestion.as_bytes());
                w.u64(r.tuning.pacing);
                // Version 2 ended here (see the decoder).
                if r.version >= 3 {
                    w.u64(r.tuning.start_window);
                    w.u32(r.tuning.start_ms);
                }
            }
            Msg::Accept(a) => {
                w.u8(2);
                w.u16(a.streams);
                w.bytes(a.io.as_bytes());
                w.u16(a.max_streams);
                w.bytes(a.congestion.as_bytes());
                w.u32(a.congestion_allowed.len() as u32);
                for c in &a.congestion_allowed {
                    w.bytes(c.as_bytes());
                }
            }
            Msg::Refuse(r) => {
                w.u8(3);
                w.u8(match r.class {
                    RefuseClass::Usage => 1,
                    RefuseClass::Failed => 2,
                });
                w.bytes(r.message.as_bytes());
            }
            Msg::Entries(entries) => {
                w.u8(4);
                w.u32(entries.len() as u32);
                for e in entries {
                    w.entry(e);
                }
            }
            Msg::EntriesEnd { count } => {
                w.u8(5);
                w.u32(*count);
            }
            Msg::Need(needs) => {
                w.u8(6);
                w.u32(needs.len() as u32);
                for n in needs {
                    w.u32(n.file);
                    w.u32(n.ranges.len() as u32);
                    for &(a, b) in &n.ranges {
                        w.u32(a);
                        w.u32(b);
                    }
                }
            }
            Msg::NeedEnd => w.u8(7),
            Msg::Resend { file, chunk } => {
                w.u8(8);
                w.u32(*file);
                w.u32(*chunk);
            }
            Msg::FileFailed { file, message } => {
                w.u8(9);
                w.u32(*file);
                w.bytes(message.text.as_bytes());
                match &message.kind {
                    FailureKind::Other => w.u8(0),
                    FailureKind::NoSpace { on } => {
                        w.u8(1);
                        w.bytes(on.as_bytes());
                    }
                    FailureKind::Quota => w.u8(2),
                    FailureKind::Permission => w.u8(3),
                }
            }
            Msg::Done(s) => {
                w.u8(10);
                for v in [
                    s.files_verified,
                    s.files_skipped,
                    s.files_failed,
                    s.bytes_written,
                    s.chunks_resent,
                ] {
                    w.u64(v);
                }
                w.bytes(s.io.as_bytes());
            }
            Msg::Abort { message } => {
                w.u8(11);
                w.bytes(message.as_bytes());
            }
            Msg::AddStreams { n } => {
                w.u8(12);
                w.u16(*n);
            }
            Msg::StreamsAdded { n } => {
                w.u8(13);
                w.u16(*n);
            }
            Msg::SetCongestion { name } => {
                w.u8(14);
                w.bytes(name.as_bytes());
            }
            Msg::Stats(st) => {
                w.u8(15);
                w.u16(st.streams);
                w.u64(st.bytes_acked);
                w.u64(st.retransmits);
                w.u32(st.rtt_us);
                w.bytes(st.congestion.as_bytes());
            }
            Msg::Notes(notes) => {
                w.u8(16);
                w.u32(notes.len() as u32);
                for n in notes {
                    w.u8(match n.kind {
                        NoteKind::Skipped => 1,
                        NoteKind::HardLink => 2,
                        NoteKind::Problem => 3,
                        NoteKind::More => 4,
                    });
                    w.bytes(n.path.as_bytes());
                    w.bytes(n.detail.as_bytes());
                }
            }
        }
        let len = (out.len() - start - 4) as u32;
        out[start..start + 4].copy_from_slice(&len.to_be_bytes());
    }

    /// Decodes one frame's payload (without its length prefix).
    pub fn decode(payload: &[u8]) -> Result<Msg, WireError> {
        if payload.len() > MAX_FRAME {
            return Err(WireError::TooLarge(payload.len()));
        }
        let mut r = Reader { buf: payload };
        let msg = match r.u8()? {
            1 => {
                let version = r.u16()?;
                let direction = match r.u8()? {
                    1 => Direction::Push,
                    2 => Direction::Pull,
                    v => return Err(unknown("direction", v)),
                };
                let flags = r.u8()?;
                let code = r.u8()?;
                let algo = Algo::from_code(code).ok_or(unknown("checksum", code))?;
                let streams = r.u16()?;
                let chunk_size = r.u32()?;
                let bwlimit = r.u64()?;
                let export = r.bytes(MAX_TEXT)?.to_vec();
                let n = r.count(MAX_REQUEST_PATHS, 2)?;
                let mut paths = Vec::with_capacity(n);
                for _ in 0..n {
                    paths.push(r.bytes(MAX_PATH)?.to_vec());
                }
                let buffer = r.u64()?;
                let force = match r.u8()? {
                    0 => false,
                    1 => true,
                    v => return Err(unknown("force flag", v)),
                };
                let congestion = r.short_text(MAX_CONGESTION_NAME)?;
                let pacing = r.u64()?;
                // An older client's request ends here; it is refused for
                // its version, with a message that says so.
                let (start_window, start_ms) = if version >= 3 {
                    (r.u64()?, r.u32()?)
                } else {
                    (0, 0)
                };
                Msg::Request(Request {
                    version,
                    direction,
                    recursive: flags & 1 != 0,
                    sync: flags & 2 != 0,
                    direct: flags & 4 != 0,
                    algo,
                    streams,
                    chunk_size,
                    bwlimit,
                    export,
                    paths,
                    tuning: SocketTuning {
                        buffer,
                        force,
                        congestion,
                        pacing,
                        start_window,
                        start_ms,
                    },
                })
            }
            2 => {
                let streams = r.u16()?;
                let io = r.text()?;
                let max_streams = r.u16()?;
                let congestion = r.short_text(MAX_CONGESTION_NAME)?;
                let n = r.count(MAX_CONGESTION_NAMES, 2)?;
                let mut congestion_allowed = Vec::with_capacity(n);
                for _ in 0..n {
                    congestion_allowed.push(r.short_text(MAX_CONGESTION_NAME)?);
                }
                Msg::Accept(Accept {
                    streams,
                    io,
                    max_streams,
                    congestion,
                    congestion_allowed,
                })
            }
            3 => {
                let class = match r.u8()? {
                    1 => RefuseClass::Usage,
                    2 => RefuseClass::Failed,
                    v => return Err(unknown("refusal class", v)),
                };
                Msg::Refuse(Refuse {
                    class,
                    message: r.text()?,
                })
            }
            4 => {
                // The smallest entry is 1 + 4 + 8 + 4 + 2 + 1 bytes.
                let n = r.count(usize::MAX, 20)?;
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    entries.push(r.entry()?);
                }
                Msg::Entries(entries)
            }
            5 => Msg::EntriesEnd { count: r.u32()? },
            6 => {
                let n = r.count(usize::MAX, 8)?;
                let mut needs = Vec::with_capacity(n);
                for _ in 0..n {
                    let file = r.u32()?;
                    let m = r.count(usize::MAX, 8)?;
                    let mut ranges = Vec::with_capacity(m);
                    for _ in 0..m {
                        let a = r.u32()?;
                        let b = r.u32()?;
                        if a >= b {
                            return Err(WireError::Unknown {
                                what: "empty chunk range",
                                value: u64::from(a),
                            });
                        }
                        ranges.push((a, b));
                    }
                    needs.push(Need { file, ranges });
                }
                Msg::Need(needs)
            }
            7 => Msg::NeedEnd,
            8 => Msg::Resend {
                file: r.u32()?,
                chunk: r.u32()?,
            },
            9 => Msg::FileFailed {
                file: r.u32()?,
                message: Reason {
                    text: r.text()?,
                    kind: match r.u8()? {
                        0 => FailureKind::Other,
                        1 => FailureKind::NoSpace {
                            on: r.short_text(MAX_PATH)?,
                        },
                        2 => FailureKind::Quota,
                        3 => FailureKind::Permission,
                        k => {
                            return Err(WireError::Unknown {
                                what: "failure kind",
                                value: u64::from(k),
                            })
                        }
                    },
                },
            },
            10 => Msg::Done(Summary {
                files_verified: r.u64()?,
                files_skipped: r.u64()?,
                files_failed: r.u64()?,
                bytes_written: r.u64()?,
                chunks_resent: r.u64()?,
                io: r.text()?,
            }),
            11 => Msg::Abort { message: r.text()? },
            12 => Msg::AddStreams { n: r.u16()? },
            13 => Msg::StreamsAdded { n: r.u16()? },
            14 => Msg::SetCongestion {
                name: r.short_text(MAX_CONGESTION_NAME)?,
            },
            15 => Msg::Stats(SenderStats {
                streams: r.u16()?,
                bytes_acked: r.u64()?,
                retransmits: r.u64()?,
                rtt_us: r.u32()?,
                congestion: r.short_text(MAX_CONGESTION_NAME)?,
            }),
            16 => {
                // Each note is at least its kind and two empty strings.
                let n = r.count(MAX_NOTES + 1, 5)?;
                let mut notes = Vec::with_capacity(n);
                for _ in 0..n {
                    let kind = match r.u8()? {
                        1 => NoteKind::Skipped,
                        2 => NoteKind::HardLink,
                        3 => NoteKind::Problem,
                        4 => NoteKind::More,
                        v => return Err(unknown("note kind", v)),
                    };
                    notes.push(Note {
                        kind,
                        path: r.text()?,
                        detail: r.text()?,
                    });
                }
                Msg::Notes(notes)
            }
            v => return Err(unknown("message type", v)),
        };
        if !r.buf.is_empty() {
            return Err(WireError::Trailing);
        }
        Ok(msg)
    }
}

/// Encodes entries into as few `Entries` messages as fit under the frame cap.
pub fn entries_messages(entries: &[Entry]) -> Vec<Msg> {
    let mut out = Vec::new();
    let mut batch = Vec::new();
    let mut size = 0usize;
    for e in entries {
        let esz = 40 + e.path.as_bytes().len() + target_len(e);
        if size + esz > MAX_FRAME / 2 && !batch.is_empty() {
            out.push(Msg::Entries(std::mem::take(&mut batch)));
            size = 0;
        }
        size += esz;
        batch.push(e.clone());
    }
    if !batch.is_empty() {
        out.push(Msg::Entries(batch));
    }
    out
}

/// Splits needs into messages under the frame cap.
pub fn need_messages(needs: Vec<Need>) -> Vec<Msg> {
    let mut out = Vec::new();
    let mut batch = Vec::new();
    let mut size = 0usize;
    for n in needs {
        let nsz = 8 + 8 * n.ranges.len();
        if size + nsz > MAX_FRAME / 2 && !batch.is_empty() {
            out.push(Msg::Need(std::mem::take(&mut batch)));
            size = 0;
        }
        size += nsz;
        batch.push(n);
    }
    if !batch.is_empty() {
        out.push(Msg::Need(batch));
    }
    out
}

/// Reads one control frame and decodes it. Oversized frames are refused
/// before their payload is read.
pub fn read_msg(r: &mut impl Read) -> io::Result<Msg> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(invalid(WireError::TooLarge(len)));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf)?;
    Msg::decode(&buf).map_err(invalid)
}

/// Encodes and writes one control message.
pub fn write_msg(w: &mut impl Write, msg: &Msg) -> io::Result<()> {
    let mut buf = Vec::new();
    msg.encode(&mut buf);
    w.write_all(&buf)
}

/// Wraps a decode error as `InvalidData` (a protocol violation, not a drop).
pub fn invalid(e: WireError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

fn target_len(e: &Entry) -> usize {
    match &e.kind {
        EntryKind::Symlink { target } => target.len(),
        _ => 0,
    }
}

fn unknown(what: &'static str, v: u8) -> WireError {
    WireError::Unknown {
        what,
        value: u64::from(v),
    }
}

fn arr4(s: &[u8]) -> [u8; 4] {
    let mut a = [0u8; 4];
    a.copy_from_slice(&s[..4]);
    a
}

fn arr8(s: &[u8]) -> [u8; 8] {
    let mut a = [0u8; 8];
    a.copy_from_slice(&s[..8]);
    a
}

struct Writer<'a>(&'a mut Vec<u8>);

impl Writer<'_> {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u16(b.len().min(u16::MAX as usize) as u16);
        self.0
            .extend_from_slice(&b[..b.len().min(u16::MAX as usize)]);
    }
    fn entry(&mut self, e: &Entry) {
        match &e.kind {
            EntryKind::File { size, sparse } => {
                self.u8(1);
                self.u32(e.mode);
                self.u64(e.mtime_s as u64);
                self.u32(e.mtime_ns);
                self.bytes(e.path.as_bytes());
                self.u8(u8::from(*sparse));
                self.u64(*size);
            }
            EntryKind::Dir => {
                self.u8(2);
                self.u32(e.mode);
                self.u64(e.mtime_s as u64);
                self.u32(e.mtime_ns);
                self.bytes(e.path.as_bytes());
            }
            EntryKind::Symlink { target } => {
                self.u8(3);
                self.u32(e.mode);
                self.u64(e.mtime_s as u64);
                self.u32(e.mtime_ns);
                self.bytes(e.path.as_bytes());
                self.bytes(target);
            }
        }
    }
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.buf.len() < n {
            return Err(WireError::UnexpectedEnd);
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        let s = self.take(2)?;
        Ok(u16::from_be_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(arr4(self.take(4)?)))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(arr8(self.take(8)?)))
    }
    fn bytes(&mut self, max: usize) -> Result<&'a [u8], WireError> {
        let n = self.u16()? as usize;
        if n > max {
            return Err(WireError::TooLarge(n));
        }
        self.take(n)
    }
    fn text(&mut self) -> Result<String, WireError> {
        self.short_text(MAX_TEXT)
    }
    fn short_text(&mut self, max: usize) -> Result<String, WireError> {
        let b = self.bytes(max)?;
        String::from_utf8(b.to_vec()).map_err(|_| WireError::Utf8)
    }
    /// A count of items each at least `min_size` bytes: refused if the rest of
    /// the frame cannot hold that many, so no allocation exceeds the frame.
    fn count(&mut self, max: usize, min_size: usize) -> Result<usize, WireError> {
        let n = self.u32()? as usize;
        if n > max || n.saturating_mul(min_size) > self.buf.len() {
            return Err(WireError::TooLarge(n));
        }
        Ok(n)
    }
    fn entry(&mut self) -> Result<Entry, WireError> {
        let tag = self.u8()?;
        let mode = self.u32()? & 0o7777;
        let mtime_s = self.u64()? as i64;
        let mtime_ns = self.u32()?;
        if mtime_ns >= 1_000_000_000 {
            return Err(WireError::Unknown {
                what: "nanoseconds",
                value: u64::from(mtime_ns),
            });
        }
        let path = RelPath::new(self.bytes(MAX_PATH)?)?;
        let kind = match tag {
            1 => {
                let sparse = self.u8()? != 0;
                EntryKind::File {
                    size: self.u64()?,
                    sparse,
                }
            }
            2 => EntryKind::Dir,
            3 => {
                let target = self.bytes(MAX_PATH)?;
                if target.is_empty() || target.contains(&0) {
                    return Err(WireError::Path(PathError::Nul));
                }
                EntryKind::Symlink {
                    target: target.to_vec(),
                }
            }
            v => return Err(unknown("entry kind", v)),
        };
        Ok(Entry {
            path,
            kind,
            mode,
            mtime_s,
            mtime_ns,
        })
    }
}

#[cfg(test)]
mod tests;
