//! The copy service on the engine: the server's [`CopyService`], the
//! client's engine-backed [`EngineLink`], and what auto-tuning sets on a
//! copy's sockets at either end.
//!
//! [`crate::session`] speaks over plain streams so its tests need no
//! server; this module is the one adapter between it and the engine
//! (authentication, cookies, the service registry), so that the copy
//! service's messages, client and server sides all live in this crate and
//! the binary only wires them. The pre-flight's settings are split here
//! between the two ends of each stream: this end's sockets ([`DataOpts`],
//! applied as the engine hands out each data connection) and the server's
//! ([`remote_tuning`], carried in the request).

use std::net::SocketAddr;

use fatpipe_secure::Stream;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fatpipe_engine::{
    ClientOptions, ClientSession, EngineError, ServerSession, Service, ServiceResult,
};
use fatpipe_schema::tune::AutoTune;
use fatpipe_tune::auto;

use crate::session::{self, AcceptError, Conn, CopyError, Export, Link, ServerConfig};
use crate::wire::SocketTuning;

/// Streams an auto-tuned copy keeps at least: they also read, hash and
/// write in parallel, which a short path's single window would leave to
/// one thread.
pub const MIN_TUNED_STREAMS: u32 = 4;

/// Test hook: start an auto-tuned copy with this many streams instead of
/// the plan's (the adjuster then starts from there).
pub const TEST_STREAMS_ENV: &str = "FATPIPE_TEST_COPY_STREAMS";

/// Why `--export` values were refused.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The value does not read as `NAME=DIR[:ro][:public][:encrypted]`.
    #[error("{0}")]
    Syntax(String),
    /// The directory does not exist or is not one.
    #[error("--export {spec}: {} is not a directory", path.display())]
    NotADirectory {
        /// The value as given.
        spec: String,
        /// Its directory.
        path: std::path::PathBuf,
    },
    /// Two exports share a name.
    #[error("--export {spec}: the name '{name}' is used twice")]
    Duplicate {
        /// The value as given.
        spec: String,
        /// The name.
        name: String,
    },
}

/// The server's `copy` service.
pub struct CopyService {
    cfg: ServerConfig,
}

impl CopyService {
    /// Builds the service from `--export NAME=DIR[:ro][:public][:encrypted]`
    /// values.
    /// `keyed` is true when the server requires the pre-shared key; an
    /// export that needs the key on a server without one is served to
    /// nobody, which `warn` is told.
    pub fn new(
        exports: &[String],
        keyed: bool,
        warn: &mut dyn FnMut(&str),
    ) -> Result<CopyService, ExportError> {
        let mut parsed: Vec<Export> = Vec::new();
        for e in exports {
            let ex: Export = e.parse().map_err(ExportError::Syntax)?;
            if !ex.path.is_dir() {
                return Err(ExportError::NotADirectory {
                    spec: e.clone(),
                    path: ex.path,
                });
            }
            if parsed.iter().any(|p| p.name == ex.name) {
                return Err(ExportError::Duplicate {
                    spec: e.clone(),
                    name: ex.name,
                });
            }
            if !ex.public && !keyed {
                warn(&format!(
                    "export '{}' needs the key but the server has none: \
                     add --key-file, or mark it :public",
                    ex.name
                ));
            }
            if ex.encrypted && !keyed {
                warn(&format!(
                    "export '{}' is :encrypted but the server has no key to encrypt with: \
                     add --key-file",
                    ex.name
                ));
            }
            parsed.push(ex);
        }
        Ok(CopyService {
            cfg: ServerConfig {
                exports: parsed,
                keyed,
                sendfile: true,
                grant: None,
            },
        })
    }
}

impl Service for CopyService {
    fn name(&self) -> &'static str {
        "copy"
    }

    /// A keyed server serves its `:public` exports to clients without the
    /// key too (docs/security.md); a keyless server serves everyone
    /// anyway.
    fn open_without_key(&self) -> bool {
        self.cfg.keyed && self.cfg.exports.iter().any(|e| e.public)
    }

    fn serve(&self, session: ServerSession) -> ServiceResult {
        // A client that did not prove the key gets what a keyless server
        // gives: the public exports only.
        let unproven;
        let cfg = if let Some(raw) = session.ticket() {
            // A one-time ticket (the HTTP port's, for a third-party copy's
            // leg) grants one file, whatever the export's `:public`.
            let grant = crate::grant::Grant::decode(raw)
                .ok_or("the session's ticket grants nothing this service knows")?;
            unproven = ServerConfig {
                keyed: true,
                grant: Some(grant),
                ..self.cfg.clone()
            };
            &unproven
        } else if session.authenticated() {
            &self.cfg
        } else {
            unproven = ServerConfig {
                keyed: false,
                ..self.cfg.clone()
            };
            &unproven
        };
        let accept = |t: Duration| -> Result<Stream, AcceptError> {
            match session.poll_data(t) {
                Ok(Some(d)) => Ok(d.stream),
                Ok(None) => Err(AcceptError::Timeout),
                Err(e) => Err(AcceptError::Failed(e.to_string())),
            }
        };
        session::serve(cfg, &accept)
            .map(|_| ())
            .map_err(|e| e.into())
    }
}

/// The client's sessions through the engine.
pub struct EngineLink {
    addr: SocketAddr,
    key: Option<fatpipe_proto::Key>,
    /// Every connection through TLS (`--encrypt`).
    encrypt: bool,
    /// Set once the plan is known (before any data connection is dialled).
    data: Arc<OnceLock<DataOpts>>,
    /// Draws a fresh one-time ticket for each session (the leg of a
    /// third-party copy: a reconnect needs a new one); used instead of
    /// `key` when set.
    ticket: Option<TicketSource>,
}

/// Draws a one-time ticket's key ([`fatpipe_proto::Key::ticket`]).
pub type TicketSource = Arc<dyn Fn() -> Result<fatpipe_proto::Key, CopyError> + Send + Sync>;

impl EngineLink {
    /// Sessions with the server at `addr`, authenticated with `key`.
    pub fn new(addr: SocketAddr, key: Option<fatpipe_proto::Key>) -> EngineLink {
        EngineLink {
            addr,
            key,
            encrypt: false,
            data: Arc::new(OnceLock::new()),
            ticket: None,
        }
    }

    /// Authenticates every session with a fresh ticket drawn from
    /// `source` instead of the key.
    pub fn with_tickets(mut self, source: TicketSource) -> EngineLink {
        self.ticket = Some(source);
        self
    }

    /// Encrypts every connection of every session (`--encrypt`; needs the
    /// key).
    pub fn encrypted(mut self, on: bool) -> EngineLink {
        self.encrypt = on;
        self
    }

    /// Sets this end's data socket settings, once: before the first data
    /// connection (later calls change nothing).
    pub fn set_data(&self, opts: DataOpts) {
        let _ = self.data.set(opts);
    }
}

struct EngineConn(ClientSession, Arc<OnceLock<DataOpts>>);

impl Link for EngineLink {
    fn connect(&self) -> Result<Box<dyn Conn>, CopyError> {
        let key = match (&self.ticket, ticket_hook()) {
            (Some(draw), _) => Some(draw()?),
            (None, Some(k)) => Some(k),
            (None, None) => self.key.clone(),
        };
        let options = ClientOptions {
            key,
            encrypt: self.encrypt,
            ..ClientOptions::default()
        };
        match fatpipe_engine::connect_with(self.addr, &options, "copy", &[]) {
            Ok(s) => Ok(Box::new(EngineConn(s, Arc::clone(&self.data)))),
            Err(e) => Err(classify(e)),
        }
    }
}

impl EngineConn {
    /// Applies this end's data socket settings (not to copy-control, tag 0).
    fn tuned(&self, tag: u32, s: Stream) -> Stream {
        if let (true, Some(opts)) = (tag > 0, self.1.get()) {
            opts.apply(&s);
        }
        s
    }
}

impl Conn for EngineConn {
    fn open(&self, tag: u32) -> Result<Stream, CopyError> {
        let s = self.0.open_data(tag).map_err(classify)?;
        Ok(self.tuned(tag, s))
    }

    fn open_early(&self, tag: u32) -> Result<Stream, CopyError> {
        let s = self.0.open_data_early(tag).map_err(classify)?;
        Ok(self.tuned(tag, s))
    }

    fn open_greeted(&self, tag: u32, hello: &[u8]) -> Result<Stream, CopyError> {
        let s = self.0.open_data_then(tag, hello).map_err(classify)?;
        Ok(self.tuned(tag, s))
    }

    /// All on the calling thread: the engine drives every connection's
    /// set-up in flight on one poll (a thread each made a `copy -P 256`
    /// client's set-up its thread peak).
    fn open_many(
        &self,
        tags: &[u32],
        push: bool,
        hello: &[u8],
        ready: &mut dyn FnMut(Result<Stream, CopyError>),
    ) {
        use fatpipe_engine::dial::{Attach, DataDial};
        let dial = DataDial {
            tags,
            attach: if push {
                Attach::Early
            } else {
                Attach::Then(hello)
            },
            configure: None,
            at_once: session::AT_ONCE,
        };
        self.0.open_data_many(&dial, &mut |tag, r| {
            ready(r.map_err(classify).and_then(|s| {
                let mut s = self.tuned(tag, s);
                if push {
                    std::io::Write::write_all(&mut s, hello).map_err(session::net)?;
                }
                Ok(s)
            }))
        });
    }
}

/// What auto-tuning sets on this end's data sockets; the server's share
/// travels in the request ([`remote_tuning`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataOpts {
    /// This end sends (push): the buffer is SO_SNDBUF, and congestion
    /// control and pacing apply; otherwise SO_RCVBUF only.
    pub sends: bool,
    /// Socket buffer per stream.
    pub buffer: Option<u64>,
    /// Force the buffer past the host's caps.
    pub forced: bool,
    /// Congestion control (sending only).
    pub congestion: Option<String>,
    /// Pacing cap per stream, bit/s (sending only).
    pub pacing_rate: Option<u64>,
}

impl DataOpts {
    /// From merged settings; `--bwlimit` replaces the plan's pacing.
    pub fn new(s: &auto::Settings, sends: bool, bwlimit: Option<u64>) -> DataOpts {
        DataOpts {
            sends,
            buffer: s.buffer,
            forced: s.forced_buffers,
            congestion: if sends { s.congestion.clone() } else { None },
            pacing_rate: if sends && bwlimit.is_none() {
                s.pacing_rate
            } else {
                None
            },
        }
    }

    /// Best effort: a refused option leaves the kernel's default, which
    /// still copies correctly, so failures are not errors.
    fn apply(&self, s: &Stream) {
        if let Some(b) = self.buffer {
            let _ = if self.sends {
                fatpipe_sys::set_send_buffer(s.tcp(), b, self.forced)
            } else {
                fatpipe_sys::set_recv_buffer(s.tcp(), b, self.forced)
            };
        }
        if let Some(cc) = &self.congestion {
            let _ = fatpipe_sys::set_congestion(s.tcp(), cc);
        }
        if let Some(r) = self.pacing_rate {
            let _ = fatpipe_sys::set_max_pacing_rate(s.tcp(), r / 8);
        }
        if let (true, Some(lowat)) = (self.sends, self.buffer.map(unsent_backlog)) {
            let _ = fatpipe_sys::set_notsent_lowat(s.tcp(), lowat);
        }
    }
}

/// How much unsent data a sending data socket may queue beyond what is in
/// flight (`TCP_NOTSENT_LOWAT`), given its planned buffer: a quarter of
/// the buffer, at least 256 KiB.
///
/// Without it the kernel queues up to the whole send buffer (doubled by
/// the kernel, so several round trips of a stream's share on a long
/// path). Chunks are handed out from one queue, so at the end of a copy
/// the streams whose sockets hold the most drain for seconds while the
/// others are idle (a push's last write to `Done` took 0.6–1.0 s at
/// 1 Gbit/s × 228 ms, 0.3–0.5 s with the mark). Capped at a quarter of the
/// buffer, a stream's backlog drains in well under a round trip of its
/// share, and the writer is woken (at half the mark) long before the
/// socket runs dry. The floor keeps fast streams with small buffers from
/// waiting on wake-ups; only planned buffers (long fat paths) get a mark.
pub fn unsent_backlog(buffer: u64) -> u64 {
    (buffer / 4).max(256 << 10)
}

/// What the server sets on its data sockets: the same buffer at the other
/// end of each stream (so the planned window holds there too, instead of
/// kernel autotuning's), and for a pull, where the server sends, the
/// congestion control and pacing (`--bwlimit` replaces the pacing; the
/// server applies it from the request).
pub fn remote_tuning(s: &auto::Settings, push: bool, bwlimit: Option<u64>) -> SocketTuning {
    SocketTuning {
        buffer: s.buffer.unwrap_or(0),
        force: s.forced_buffers,
        congestion: if push {
            String::new()
        } else {
            s.congestion.clone().unwrap_or_default()
        },
        pacing: if push || bwlimit.is_some() {
            0
        } else {
            s.pacing_rate.unwrap_or(0)
        },
        start_window: 0,
        start_ms: 0,
    }
}

/// The pre-flight a copy runs ([`auto::run`]): the server sends on a pull,
/// no flags to lay over the plan (`-P` turns auto-tuning off), at least
/// [`MIN_TUNED_STREAMS`], and `--bwlimit` paces instead of the plan.
pub fn preflight_request(
    addr: SocketAddr,
    options: ClientOptions,
    push: bool,
    bwlimit: Option<u64>,
) -> auto::Request {
    let role = if push {
        auto::Role::Sender
    } else {
        auto::Role::Receiver
    };
    let mut preflight = auto::PreflightConfig::new(addr, options, role);
    // A copy pays for its start-up in its wall clock: enough streams for
    // slow start to fill the path in a few round trips.
    preflight.policy.ramp_rtts = Some(fatpipe_tune::plan::RAMP_RTTS);
    auto::Request {
        preflight,
        overrides: auto::Overrides::default(),
        floor: Some(auto::Floor {
            streams: MIN_TUNED_STREAMS,
            who: "copy",
            why: "they also read, hash and write in parallel",
        }),
        rate_cap: bwlimit,
    }
}

/// An auto-tuned copy's start: the streams, this end's and the server's
/// socket settings and the record of what auto-tuning did.
#[derive(Debug, Clone)]
pub struct CopyTuning {
    /// Data streams to start with.
    pub streams: u16,
    /// This end's data sockets.
    pub data: DataOpts,
    /// The server's data sockets (sent in the request).
    pub server: SocketTuning,
    /// The chunk size for the path ([`fatpipe_tune::plan::auto_chunk_size`]), used
    /// unless `--chunk-size` gives one.
    pub chunk_size: u32,
    /// For the JSON (`adjusting`: the in-flight adjuster always runs).
    pub record: AutoTune,
}

impl CopyTuning {
    /// Splits the pre-flight's outcome between the ends.
    pub fn new(t: auto::Tuned, push: bool, bwlimit: Option<u64>) -> CopyTuning {
        let mut streams = u16::try_from(t.settings.streams)
            .unwrap_or(session::MAX_STREAMS)
            .clamp(1, session::MAX_STREAMS);
        let data = DataOpts::new(&t.settings, push, bwlimit);
        let mut server = remote_tuning(&t.settings, push, bwlimit);
        if let Some((window, hold)) = t.start_window {
            server.start_window = window;
            server.start_ms = u32::try_from(hold.as_millis()).unwrap_or(u32::MAX);
        }
        let mut record = t.record;
        if let Some(n) = test_streams_hook() {
            streams = u16::try_from(n).unwrap_or(1).clamp(1, session::MAX_STREAMS);
            record.warnings.push(format!(
                "{TEST_STREAMS_ENV}: started with {streams} streams"
            ));
        }
        record.streams = u32::from(streams);
        record.adjusting = true;
        // The largest rate the probe could not rule out: a doubtful
        // estimate errs toward the larger chunks of fast paths.
        let plan = &t.preflight.plan;
        let rate = plan
            .window_rate
            .or(t.preflight.facts.bottleneck_rate)
            .map(|r| bwlimit.map_or(r, |cap| r.min(cap)));
        CopyTuning {
            streams,
            data,
            server,
            chunk_size: fatpipe_tune::plan::auto_chunk_size(rate, u32::from(streams)),
            record,
        }
    }
}

/// Test hook: `fatpipe copy` proves this one-time ticket (`IDHEX:KEYHEX`,
/// as an HTTP port's `Fatpipe-Ticket` gives them) instead of the key.
pub const TEST_TICKET_ENV: &str = "FATPIPE_TEST_COPY_TICKET";

/// The test hook [`TEST_TICKET_ENV`], if set and well-formed.
fn ticket_hook() -> Option<fatpipe_proto::Key> {
    let v = crate::test_hook(TEST_TICKET_ENV)?;
    let (id, key) = v.trim().split_once(':')?;
    let bytes = |h: &str| -> Option<Vec<u8>> {
        (0..h.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok())
            .collect()
    };
    let id: [u8; 16] = bytes(id)?.try_into().ok()?;
    fatpipe_proto::Key::ticket(id, bytes(key)?).ok()
}

/// The test hook [`TEST_STREAMS_ENV`], if set.
fn test_streams_hook() -> Option<u32> {
    crate::test_hook(TEST_STREAMS_ENV)?.trim().parse().ok()
}

fn classify(e: EngineError) -> CopyError {
    if e.is_auth() {
        return CopyError::Usage(format!("{e} (check --key-file)"));
    }
    match e {
        EngineError::Io { .. } | EngineError::Timeout(_) => CopyError::Network(e.to_string()),
        other => CopyError::Failed(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_settings_go_to_the_sending_end_and_bwlimit_replaces_pacing() {
        let s = auto::Settings {
            streams: 5,
            buffer: Some(3 << 20),
            forced_buffers: false,
            congestion: Some("cubic".into()),
            pacing_rate: Some(200_000_000),
            overridden: vec![],
        };
        let push = DataOpts::new(&s, true, None);
        assert_eq!(push.buffer, Some(3 << 20));
        assert_eq!(push.congestion.as_deref(), Some("cubic"));
        assert_eq!(push.pacing_rate, Some(200_000_000));
        // Pulling, this end receives: only its receive buffer is set.
        let pull = DataOpts::new(&s, false, None);
        assert_eq!(
            (pull.buffer, pull.congestion, pull.pacing_rate),
            (Some(3 << 20), None, None)
        );
        assert_eq!(DataOpts::new(&s, true, Some(1_000_000)).pacing_rate, None);
        // The server's end: on a push it receives (buffer only); on a pull
        // it sends with the plan's congestion control and pacing, unless
        // --bwlimit paces it instead.
        let to_server = |push, bwlimit| {
            let t = remote_tuning(&s, push, bwlimit);
            (t.buffer, t.force, t.congestion, t.pacing)
        };
        assert_eq!(to_server(true, None), (3 << 20, false, String::new(), 0));
        assert_eq!(
            to_server(false, None),
            (3 << 20, false, "cubic".to_string(), 200_000_000)
        );
        assert_eq!(to_server(false, Some(1_000_000)).3, 0);
    }

    #[test]
    fn exports_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let mut warned = Vec::new();
        let mut warn = |w: &str| warned.push(w.to_string());
        assert!(CopyService::new(
            &[format!("data={d}"), format!("pub={d}:ro:public")],
            true,
            &mut warn
        )
        .is_ok());
        assert!(CopyService::new(&[format!("data={d}")], false, &mut warn).is_ok());
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert!(warned[0].starts_with("export 'data' needs the key"));
        for bad in [
            format!("data={d}/missing"),
            "nodir".to_string(),
            format!("a b={d}"),
        ] {
            assert!(
                CopyService::new(std::slice::from_ref(&bad), true, &mut |_| {}).is_err(),
                "{bad}"
            );
        }
        let e = CopyService::new(&[format!("x={d}"), format!("x={d}")], true, &mut |_| {})
            .err()
            .unwrap();
        assert!(e.to_string().contains("twice"));
    }
}
