//! The leg: a `COPY` pull from, or push to, another fatpipe server over
//! the copy protocol instead of HTTP (docs/http.md, "The leg"); encrypted
//! with the ticket's key when the peer's URL is `https`.
//!
//! The source's `HEAD` was asked `Fatpipe-Ticket: read` and answered with
//! a one-time ticket for that file ([`crate::ticket`]). The copy then
//! runs as `fatpipe copy` pulls: auto-tuned by the same pre-flight (the
//! ticket also opens a few sessions of the source's path probe; without
//! one, planned from the HTTP connection's round trip) and adjusted in
//! flight,
//! chunks verified as they land, a dropped session resumed from the
//! journal (each new session with a fresh ticket, asked with another
//! `HEAD`), the file named only once whole. The markers count what the
//! receiver verified and wrote. The source's checksums (its `Digest`)
//! are carried along and kept with the file: every chunk was compared
//! with the source's hash of it, so the whole file is the source's.
//!
//! Anything failing before a byte moved (the copy port unreachable, the
//! ticket refused, another protocol version) leaves the copy to HTTP:
//! [`End::Fallback`], its reason in the copy's log line.

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::OnceLock;

use fatpipe_engine::Stream;
use fatpipe_transfer::hash::Algo as ChunkAlgo;
use fatpipe_transfer::journal::{journal_name, part_name};
use fatpipe_transfer::live::Live;
use fatpipe_transfer::service::{self, CopyTuning, DataOpts, EngineLink, TicketSource};
use fatpipe_transfer::session::{self, Conn, CopyError, Link};
use fatpipe_transfer::tuner::CopyTuner;
use fatpipe_transfer::wire::{Direction, SocketTuning};
use fatpipe_tune::auto;

use super::*;
use crate::ticket::{self, Offer};

/// How the leg ended.
pub(super) enum End {
    /// The file is named; the copy's summary.
    Done(String),
    /// Nothing moved: the copy goes over HTTP; why not the leg.
    Fallback(String),
    /// It failed after data moved: the copy fails.
    Failed(String),
}

/// Reconnects a leg makes after a dropped session.
const RETRIES: u32 = 5;
/// Chunk size when the plan gives none.
const CHUNK: u32 = 4 << 20;

/// Whether a pull from `url` may go over the leg at all (its `HEAD` asks
/// for a ticket): enabled, and a pull (an `https` source's leg is
/// encrypted, [`encrypted`]).
pub(super) fn wanted(job: &Job, _url: &Url) -> bool {
    job.leg && job.pull
}

/// Whether the leg to `url` is encrypted: for an `https`/`davs` URL, with
/// TLS 1.3 keyed by the ticket (whose key came over HTTPS, so only the
/// two servers know it; docs/protocol.md, "Tickets"). A plain-HTTP
/// source's leg is plain, as its HTTP is.
pub(super) fn encrypted(url: &Url) -> bool {
    url.tls
}

/// The `Fatpipe-Ticket` of an answer: `None` without one, else the offer
/// or why it is unusable.
pub(super) fn offer_of(h: &HeaderMap) -> Option<Result<Offer, String>> {
    let v = h.get(ticket::HEADER)?;
    Some(Offer::parse(v.as_bytes()))
}

/// A fresh ticket for `url` (a reconnecting leg's): for a pull a `HEAD`
/// asking for one, for a push an `OPTIONS` ([`write_ticket_request`]).
async fn ask_ticket(url: &Url, opts: &Options, push: Option<bool>) -> Result<Offer, String> {
    let mut conn = client::connect(url, opts)
        .await
        .map_err(|e| e.to_string())?;
    let (method, req) = match push {
        None => (
            Method::HEAD,
            conn.request(Method::HEAD, &url.path, opts)
                .header(ticket::HEADER, "read"),
        ),
        Some(overwrite) => (
            Method::OPTIONS,
            write_ticket_request(&mut conn, url, opts, overwrite),
        ),
    };
    let req = req.body(client::empty()).map_err(|e| e.to_string())?;
    let res = conn.send(req).await.map_err(|e| e.to_string())?;
    if !res.status().is_success() {
        return Err(format!("{method} {}: {}", url.display(), res.status()));
    }
    match offer_of(res.headers()) {
        Some(o) => o,
        None => Err("the peer issued no ticket".into()),
    }
}

/// The request that asks a push's destination for a ticket to write it:
/// `OPTIONS` of the destination URL itself (the file need not exist, and
/// any WebDAV server answers `OPTIONS` for a name it does not have) with
/// `Fatpipe-Ticket: write`, the forwarded `Authorization`, and
/// `If-None-Match: *` for `Overwrite: F`. A fatpipe destination checks it
/// as it would check the `PUT`.
pub(super) fn write_ticket_request(
    conn: &mut Connection,
    url: &Url,
    opts: &Options,
    overwrite: bool,
) -> hyper::http::request::Builder {
    let mut rb = conn
        .request(Method::OPTIONS, &url.path, opts)
        .header(ticket::HEADER, "write");
    if !overwrite {
        rb = rb.header(header::IF_NONE_MATCH, "*");
    }
    rb
}

/// The engine's link, with every connection noted in the copy's state (a
/// cancelled copy shuts them) and no new session once cancelled.
struct LegLink {
    inner: EngineLink,
    state: Arc<State>,
}

struct LegConn {
    inner: Box<dyn Conn>,
    state: Arc<State>,
}

impl LegConn {
    fn noted(&self, s: Stream) -> Stream {
        if let Ok(dup) = s.tcp().try_clone() {
            if self.state.cancelled() {
                let _ = dup.shutdown(std::net::Shutdown::Both);
            }
            lock(&self.state.sockets).push(dup);
        }
        s
    }
}

impl Link for LegLink {
    fn connect(&self) -> Result<Box<dyn Conn>, CopyError> {
        if self.state.cancelled() {
            return Err(CopyError::Usage("cancelled".into()));
        }
        let inner = self.inner.connect()?;
        Ok(Box::new(LegConn {
            inner,
            state: Arc::clone(&self.state),
        }))
    }
}

impl Conn for LegConn {
    fn open(&self, tag: u32) -> Result<Stream, CopyError> {
        self.inner.open(tag).map(|s| self.noted(s))
    }

    fn open_early(&self, tag: u32) -> Result<Stream, CopyError> {
        self.inner.open_early(tag).map(|s| self.noted(s))
    }

    fn open_greeted(&self, tag: u32, hello: &[u8]) -> Result<Stream, CopyError> {
        self.inner.open_greeted(tag, hello).map(|s| self.noted(s))
    }

    /// The engine's dialer, on the calling thread (the default would
    /// take a thread per connection).
    fn open_many(
        &self,
        tags: &[u32],
        push: bool,
        hello: &[u8],
        ready: &mut dyn FnMut(Result<Stream, CopyError>),
    ) {
        self.inner
            .open_many(tags, push, hello, &mut |r| ready(r.map(|s| self.noted(s))));
    }
}

/// Plans probed for peers (the copy port's address), kept for
/// [`PLAN_TTL`]: a warm pair's next leg starts without a probe. Bounded.
static PLANS: Mutex<Vec<Plan>> = Mutex::new(Vec::new());
/// A kept plan: the peer's copy port and whether a push's, when probed,
/// and the plan.
type Plan = ((SocketAddr, bool), Instant, CopyTuning);
/// How long a probed plan is used again.
const PLAN_TTL: Duration = Duration::from_secs(600);
/// The most peers whose plans are kept.
const MAX_PLANS: usize = 256;

/// The plan kept for `addr` in that direction (a push's plan is the
/// sender's), if fresh.
fn remembered(addr: SocketAddr, push: bool) -> Option<CopyTuning> {
    let mut p = lock(&PLANS);
    p.retain(|(_, at, _)| at.elapsed() < PLAN_TTL);
    p.iter()
        .find(|(a, _, _)| *a == (addr, push))
        .map(|(_, _, t)| t.clone())
}

fn remember(addr: SocketAddr, push: bool, t: &CopyTuning) {
    let mut p = lock(&PLANS);
    p.retain(|(a, at, _)| *a != (addr, push) && at.elapsed() < PLAN_TTL);
    if p.len() >= MAX_PLANS {
        p.remove(0);
    }
    p.push(((addr, push), Instant::now(), t.clone()));
}

/// Where the leg pulls to.
pub(super) struct Dest<'a> {
    pub(super) parent: &'a Dir,
    pub(super) name: &'a [u8],
}

/// The file a leg pushes.
#[derive(Clone, Copy)]
pub(super) struct Src<'a> {
    pub(super) parent: &'a Dir,
    pub(super) name: &'a [u8],
}

/// A leg's run: what the copy protocol reported, where it went, and how
/// long it took.
struct Ran {
    report: session::Report,
    addr: SocketAddr,
    t0: Instant,
    took: Duration,
    encrypt: bool,
}

/// Runs `tj` over the copy protocol with the server that issued `offer`
/// (at the address `conn` reached, on the ticket's port): auto-tuned, a
/// reconnect with a fresh ticket. `Err` is how the leg ended without a
/// report.
fn run_leg(
    job: &Job,
    url: &Url,
    conn: &Connection,
    offer: &Offer,
    mut tj: session::Job,
    moved_nothing: &dyn Fn() -> bool,
) -> Result<Ran, End> {
    let push = tj.direction == Direction::Push;
    // The address the HTTP connection reached (or, if the peer closed
    // it, the URL's, within the policy), on the ticket's port.
    let ip = match conn.socket.peer_addr() {
        Ok(p) => p.ip(),
        Err(_) => match resolve_allowed(url, &job.policy).map(|a| a.first().copied()) {
            Ok(Some(a)) => a.ip(),
            Ok(None) => return Err(End::Fallback(format!("{}: no address", url.display()))),
            Err(why) => return Err(End::Fallback(why)),
        },
    };
    let addr = SocketAddr::new(ip, offer.port);
    if let Err(why) = job.policy.check(addr.ip()) {
        return Err(End::Fallback(format!("{addr}: {why}")));
    }
    let t0 = Instant::now();
    let Some(first) = offer.key() else {
        return Err(End::Fallback("the ticket's key is unusable".into()));
    };
    let rtt = fatpipe_sys::tcp::tcp_info(&conn.socket)
        .ok()
        .and_then(|i| i.rtt_us)
        .map_or(Duration::from_millis(1), |us| {
            Duration::from_micros(u64::from(us))
        });
    // Auto-tuning as `fatpipe copy` runs it: the ticket also opens the
    // peer's path probe (a few sessions, no file); the plan comes while
    // the copy's control session connects. Without a probe (it failed),
    // the plan from the HTTP connection's round trip alone.
    let encrypt = encrypted(url);
    let options = fatpipe_engine::ClientOptions {
        key: Some(first.clone()),
        encrypt,
        ..fatpipe_engine::ClientOptions::default()
    };
    let pre = service::preflight_request(addr, options, push, None);
    let ceiling = job
        .ceiling
        .map(|c| u16::try_from(c).unwrap_or(u16::MAX).max(1));
    tj.streams = ceiling.unwrap_or(8);
    // The first session proves the answer's ticket; a reconnect asks for
    // a new one (each is spent by one session).
    let first = Mutex::new(Some(first));
    let (u, o) = (url.clone(), job.opts.clone());
    let again = push.then_some(job.overwrite);
    let draw: TicketSource = Arc::new(move || {
        if let Some(k) = lock(&first).take() {
            return Ok(k);
        }
        let rt = pool::runtime()
            .ok_or_else(|| CopyError::Failed("no runtime to ask for a ticket".into()))?;
        let offer = rt
            .block_on(ask_ticket(&u, &o, again))
            .map_err(|e| CopyError::Network(format!("a new ticket: {e}")))?;
        offer
            .key()
            .ok_or_else(|| CopyError::Failed("the new ticket's key is unusable".into()))
    });
    let link = LegLink {
        inner: EngineLink::new(addr, None)
            .with_tickets(draw)
            .encrypted(encrypt),
        state: Arc::clone(&job.state),
    };
    {
        let mut r = lock(&job.state.remote);
        r.clear();
        r.push(addr);
    }
    // In flight the streams are adjusted, unless the client set a ceiling.
    let tuner: OnceLock<CopyTuner> = OnceLock::new();
    let steer = |live: &Live| {
        if let Some(t) = tuner.get() {
            t.run(live, &mut |_| {});
        }
    };
    let progress = Arc::clone(&job.state.progress);
    let quiet = |_: &str| {};
    // A warm pair: a plan probed for this peer in the last minutes is
    // used again, without a probe (FTS sends one COPY per file).
    let mut warm = remembered(addr, push);
    let result = std::thread::scope(|scope| {
        let mut probe = warm.is_none().then(|| {
            scope.spawn(|| match auto::run(&pre) {
                Ok(t) => {
                    let t = CopyTuning::new(t, push, None);
                    remember(addr, push, &t);
                    Some(t)
                }
                Err(_) => auto::blind_live(rtt, 1500, &pre.preflight.policy)
                    .ok()
                    .map(|p| CopyTuning::new(auto::settle_with(p, (&pre).into()), push, None)),
            })
        });
        let (tuner, link) = (&tuner, &link);
        let mut prepare = move |tj: &mut session::Job| -> Result<(), CopyError> {
            let tuned = match (warm.take(), probe.take()) {
                (Some(t), _) => Some(t),
                (None, Some(p)) => p
                    .join()
                    .map_err(|_| CopyError::Failed("the auto-tuning thread panicked".into()))?,
                (None, None) => return Err(CopyError::Failed("auto-tuning ran twice".into())),
            };
            match tuned {
                Some(t) => {
                    tj.streams = ceiling.map_or(t.streams, |c| t.streams.min(c));
                    tj.chunk_size = t.chunk_size;
                    tj.tuning = t.server.clone();
                    link.inner.set_data(t.data.clone());
                    if ceiling.is_none() {
                        let _ = tuner.set(CopyTuner::new(&t, None));
                    }
                }
                None => link.inner.set_data(DataOpts::default()),
            }
            Ok(())
        };
        session::run_client_prepared(
            link,
            &tj,
            Some(&mut prepare as &mut session::Prepare<'_>),
            Arc::clone(&progress),
            &quiet,
            Some(&steer as &session::Tuner<'_>),
        )
    });
    let took = t0.elapsed();
    match result {
        Ok(r) if r.failures.is_empty() => Ok(Ran {
            report: r,
            addr,
            t0,
            took,
            encrypt,
        }),
        Ok(r) => {
            let why = r
                .failures
                .first()
                .map_or_else(|| "the file failed".to_string(), |f| f.message.clone());
            Err(End::Failed(format!("over the fatpipe leg: {why}")))
        }
        Err(e) => {
            if job.state.cancelled() {
                return Err(End::Failed("cancelled".into()));
            }
            let why = format!("fatpipe leg to {addr}: {e}");
            Err(if moved_nothing() {
                End::Fallback(why)
            } else {
                End::Failed(why)
            })
        }
    }
}

/// The part of a leg's log line after "over the fatpipe leg".
fn summary(ran: &Ran, way: &str, carried: &str) -> String {
    let report = &ran.report;
    let secs = report.elapsed.as_secs_f64();
    let timing = format!(
        "; {:.1} s to connect and plan, {:.1} s copying, {:.1} s to finish",
        report
            .marks
            .prepared
            .map_or(0.0, |p| p.saturating_duration_since(ran.t0).as_secs_f64()),
        secs,
        (ran.t0.elapsed() - ran.took).as_secs_f64()
    );
    let enc = match (&report.encryption, ran.encrypt) {
        (Some(e), _) => format!(
            " (encrypted: {}, {}, keyed by the ticket)",
            e.protocol, e.suite
        ),
        (None, true) => " (encrypted: keyed by the ticket)".to_string(),
        (None, false) => String::new(),
    };
    format!(
        "{} bytes over the fatpipe leg{enc} {way} {} ({} streams, {:.2} Gbit/s, every chunk verified{}){carried}",
        report.summary.bytes_written,
        ran.addr,
        report.streams,
        if secs > 0.0 {
            report.summary.bytes_written as f64 * 8.0 / secs / 1e9
        } else {
            0.0
        },
        if report.reconnects > 0 {
            format!(", {} reconnects", report.reconnects)
        } else {
            String::new()
        } + &timing
    )
}

fn base_job(direction: Direction, offer: &Offer) -> session::Job {
    session::Job {
        direction,
        export: offer.export.clone(),
        remote: vec![offer.path.clone()],
        local_sources: Vec::new(),
        local_dest: PathBuf::new(),
        recursive: false,
        // Durable before it is named: a COPY's success means on disk.
        sync: true,
        direct: true,
        algo: ChunkAlgo::Xxh3,
        streams: 8,
        chunk_size: CHUNK,
        auto_chunk: true,
        bwlimit: None,
        tuning: SocketTuning::default(),
        retries: RETRIES,
        sendfile: true,
        corrupt_chunk: None,
    }
}

/// The path of `name` in the directory `parent` is open on.
fn fd_path(parent: &Dir, name: &[u8]) -> PathBuf {
    let fd = parent.as_fd().as_raw_fd();
    PathBuf::from(format!("/proc/self/fd/{fd}")).join(OsStr::from_bytes(name))
}

/// Pulls the file `offer` names from `conn`'s server over the copy
/// protocol into `dest` (which does not exist).
pub(super) fn pull(
    job: &Job,
    url: &Url,
    conn: &Connection,
    offer: Offer,
    stat: &Stat,
    dest: Dest<'_>,
) -> End {
    let mut tj = base_job(Direction::Pull, &offer);
    tj.local_dest = fd_path(dest.parent, dest.name);
    // The source's checksum, to carry: asked for meanwhile when its HEAD
    // did not say it (the source keeps it once computed).
    let rt = pool::runtime();
    let asked = match (stat.digests.is_empty(), rt) {
        (true, Some(rt)) => {
            let (u, o) = (url.clone(), job.opts.clone());
            Some(rt.spawn(async move {
                let mut c = client::connect(&u, &o).await.ok()?;
                let (_, st) = client::head(&mut c, &o).await.ok()?;
                pool::put(c);
                Some(st.digests)
            }))
        }
        _ => None,
    };
    let cleanup = || {
        let _ = dest.parent.unlink_at(&part_name(dest.name));
        let _ = dest.parent.unlink_at(&journal_name(dest.name));
    };
    let moved_nothing =
        || job.state.progress.bytes.load(Ordering::Relaxed) == 0 && !dest_exists(&dest);
    let ran = match run_leg(job, url, conn, &offer, tj, &moved_nothing) {
        Ok(r) => r,
        Err(end) => {
            cleanup();
            return end;
        }
    };
    // The source's checksums, carried along.
    let file = match dest.parent.open_at(dest.name, OFlags::RDONLY, 0) {
        Ok(f) => f,
        Err(e) => return End::Failed(format!("the file the leg wrote: {e}")),
    };
    match (fstat(&file), stat.size) {
        (Ok(m), Some(n)) if m.size != n => {
            return End::Failed(format!(
                "the source announced {n} bytes but the leg wrote {}",
                m.size
            ))
        }
        (Err(e), _) => return End::Failed(format!("the file the leg wrote: {e}")),
        _ => {}
    }
    let digests = match (asked, rt) {
        (Some(h), Some(rt)) => rt.block_on(h).ok().flatten().unwrap_or_default(),
        _ => stat.digests.clone(),
    };
    let mut sums = Sums::default();
    for (a, v) in &digests {
        sums.set(*a, v.clone());
    }
    let carried = digests
        .first()
        .map(|(a, v)| format!(", {} carried from the source", client::show_digest(*a, v)))
        .unwrap_or_default();
    if !digests.is_empty() {
        let _ = digest::store(dest.parent, dest.name, &file, &sums);
    }
    if let Err(e) = dest.parent.sync() {
        return End::Failed(format!("syncing the directory: {e}"));
    }
    End::Done(summary(&ran, "from", &carried))
}

/// Pushes `src` over the copy protocol to the server that issued `offer`
/// (a ticket to write the file it names): auto-tuned streams, every chunk
/// verified, resumed after a drop, the file named at the destination only
/// once whole and flushed. Nothing moved when it fails early: the copy
/// goes over HTTP.
pub(super) fn push(job: &Job, url: &Url, conn: &Connection, offer: Offer, src: Src<'_>) -> End {
    let mut tj = base_job(Direction::Push, &offer);
    tj.local_sources = vec![fd_path(src.parent, src.name)];
    let moved_nothing = || job.state.progress.bytes.load(Ordering::Relaxed) == 0;
    match run_leg(job, url, conn, &offer, tj, &moved_nothing) {
        Ok(ran) => End::Done(summary(&ran, "to", "")),
        Err(end) => end,
    }
}

fn dest_exists(dest: &Dest<'_>) -> bool {
    matches!(dest.parent.stat_at(dest.name), Ok(Some(_)))
}
