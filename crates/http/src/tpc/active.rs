//! A `COPY` running: the local end prepared on the connection's thread
//! (the destination's temporary file for a pull, the source file for a
//! push; every refusal a plain HTTP status), then the transfer on a
//! thread of its own, reported to the client by [`Markers`], the answer's
//! body.
//!
//! - **Pull**: a `HEAD` of the source (`Want-Digest: adler32`, redirects
//!   followed within the address policy), then one `GET` of the whole
//!   file, or ranged `GET`s of [`BLOCK`] bytes over several connections
//!   (each a thread with its own runtime, as the client's downloads) into
//!   a file that has no name yet (`O_TMPFILE`, or a hidden
//!   `.fatpipe-put.*` name). Its checksums are computed while it is
//!   written, in file order: a block completing the contiguous prefix has
//!   that prefix hashed at once (from the page cache), so the digest is
//!   ready with the last byte, never a second pass. When the source's
//!   checksum matches (`RequireChecksumVerification`), the file is
//!   fsynced, its checksums kept with it, and only then named.
//! - **Push**: one `PUT` with `Content-Length` and `Expect:
//!   100-continue` (adler32 computed while the file is read), then a
//!   `HEAD` comparing the destination's.
//!
//! The client gone (the answer's body dropped), or a stall (no first byte
//! in `first_byte_timeout`, no progress in `progress_timeout`), cancels
//! the copy: its connections are shut, and the file is never named (the
//! naming and the cancellation take the same lock).

// The helpers' error is the answer to send (a `Response`), as in
// `handler`: built once per request.
#![allow(clippy::result_large_err)]

use std::collections::VecDeque;
use std::fs::File;
use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use fatpipe_sys::OFlags;
use fatpipe_transfer::beneath::{fstat, Dir, Kind};
use fatpipe_transfer::Progress;
use hyper::body::{Bytes, Frame, SizeHint};
use hyper::header::{self, HeaderMap};
use hyper::{Method, Response, StatusCode};

use super::{markers, pool, resolve_allowed, Copy, Mode, Policy, MAX_STREAMS};
use crate::body::Body;
use crate::client::{self, Connection, Options, Stat, Url};
use crate::conn::Shared;
use crate::digest::{self, Algo, Hasher, Sums};
use crate::handler::{
    authorize, export_of, hidden, insert, io_resp, object, parent_of, text, Resp, Upload,
};
use crate::path::Target;
use crate::token::Perm;

mod leg;

/// Bytes one ranged `GET` of a pull fetches.
pub const BLOCK: u64 = client::get::BLOCK;
/// Attempts at one block before the pull fails.
const ATTEMPTS: u32 = 3;
/// Bytes hashed per read when the contiguous prefix grows.
const HASH_CHUNK: usize = 1 << 20;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where a copy is.
#[derive(Debug, Clone)]
enum Phase {
    Running,
    /// Ended by its thread: a summary for the log, or why it failed.
    Done(Result<String, String>),
    /// Ended from outside (client gone, stall): why.
    Cancelled(String),
}

/// What the copy's thread and the answer's body share.
pub(crate) struct State {
    t0: Instant,
    progress: Arc<Progress>,
    phase: Mutex<Phase>,
    waker: Mutex<Option<Waker>>,
    remote: Mutex<Vec<SocketAddr>>,
    sockets: Mutex<Vec<std::net::TcpStream>>,
}

impl State {
    fn new() -> State {
        State {
            t0: Instant::now(),
            progress: Arc::new(Progress::default()),
            phase: Mutex::new(Phase::Running),
            waker: Mutex::new(None),
            remote: Mutex::new(Vec::new()),
            sockets: Mutex::new(Vec::new()),
        }
    }

    fn bytes(&self) -> u64 {
        self.progress.bytes.load(Ordering::Relaxed)
    }

    fn wake(&self) {
        if let Some(w) = lock(&self.waker).take() {
            w.wake();
        }
    }

    /// Notes a connection to the other end (for `RemoteConnections`, and
    /// to shut it on cancellation).
    fn connected(&self, c: &Connection) {
        if let Ok(peer) = c.socket.peer_addr() {
            let mut r = lock(&self.remote);
            if !r.contains(&peer) && r.len() < markers::MAX_REMOTE {
                r.push(peer);
            }
        }
        if let Ok(dup) = c.socket.try_clone() {
            if self.cancelled() {
                let _ = dup.shutdown(std::net::Shutdown::Both);
            }
            lock(&self.sockets).push(dup);
        }
    }

    fn cancelled(&self) -> bool {
        matches!(*lock(&self.phase), Phase::Cancelled(_))
    }

    /// Cancels a running copy (its connections shut); false if it had
    /// already ended.
    fn cancel(&self, why: &str) -> bool {
        {
            let mut p = lock(&self.phase);
            if !matches!(*p, Phase::Running) {
                return false;
            }
            *p = Phase::Cancelled(why.to_string());
        }
        for s in lock(&self.sockets).iter() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        self.wake();
        true
    }

    fn end(&self, r: Result<String, String>) {
        {
            let mut p = lock(&self.phase);
            if matches!(*p, Phase::Running) {
                *p = Phase::Done(r);
            }
        }
        self.wake();
    }

    /// Runs `name_it` (giving the file its name) unless the copy was
    /// cancelled: the two never cross.
    fn commit(&self, name_it: impl FnOnce() -> std::io::Result<()>) -> Result<(), String> {
        let p = lock(&self.phase);
        if let Phase::Cancelled(why) = &*p {
            return Err(why.clone());
        }
        name_it().map_err(|e| format!("naming the file: {e}"))
    }
}

/// A slot among the server's running copies, released when dropped.
struct Slot(Arc<std::sync::atomic::AtomicUsize>);

impl Slot {
    fn take(active: &Arc<std::sync::atomic::AtomicUsize>, max: usize) -> Option<Slot> {
        let n = active.fetch_add(1, Ordering::SeqCst);
        if n >= max {
            active.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Slot(Arc::clone(active)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The local end of a copy, prepared.
enum Local {
    Pull {
        parent: Dir,
        name: Vec<u8>,
        /// Created last, once nothing can refuse the copy any more.
        tmp: Option<Upload>,
        existed: bool,
    },
    Push {
        file: File,
        size: u64,
        /// Where it is (the leg pushes it by name).
        parent: Dir,
        name: Vec<u8>,
    },
}

/// Everything the copy's thread needs.
struct Job {
    remote: Url,
    opts: Options,
    policy: Policy,
    verify: bool,
    overwrite: bool,
    /// The fewest connections a ranged pull opens (`--http-tpc-streams`).
    streams: u32,
    /// The client's ceiling (`X-Number-Of-Streams` above 1).
    ceiling: Option<u32>,
    inline: Vec<Algo>,
    state: Arc<State>,
    /// Pull over the copy protocol from a fatpipe source that offers a
    /// ticket (`--http-tpc-leg`).
    leg: bool,
    /// The smallest file pulled so (`--http-tpc-leg-min`).
    leg_min: u64,
    /// The ticket the source's `HEAD` answered with, if any.
    offer: Mutex<Option<Result<crate::ticket::Offer, String>>>,
    /// A pull (only a pull's `HEAD` asks for a ticket to read).
    pull: bool,
}

type Started = tokio::sync::oneshot::Sender<Result<(), (StatusCode, String)>>;

/// Prepares the local end, starts the copy and answers `202` with the
/// marker stream (or the refusal).
pub(crate) async fn start(sh: &Rc<Shared>, t: &Target, headers: &HeaderMap, c: Copy) -> Resp {
    let set = &sh.cfg.tpc;
    let (remote, local) = match &c.mode {
        Mode::Pull(u) => (u.clone(), prepare_pull(sh, t, headers, c.overwrite)),
        Mode::Push(u) => (u.clone(), prepare_push(sh, t, headers)),
    };
    let mut local = match local {
        Ok(l) => l,
        Err(r) => return r,
    };
    if let Err(why) = resolve_allowed(&remote, &set.policy) {
        return failure_resp(StatusCode::FORBIDDEN, &why);
    }
    let Some(slot) = Slot::take(&set.active, set.max_active) else {
        return failure_resp(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!(
                "the server runs {} copies already (--http-tpc-max); retry later",
                set.max_active
            ),
        );
    };
    let mut opts = match Options::new(set.ca.as_deref(), None) {
        Ok(o) => o,
        Err(e) => return failure_resp(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    opts.agent = format!("fatpipe-tpc/{}", env!("CARGO_PKG_VERSION"));
    opts.headers = c.forward.clone();
    let state = Arc::new(State::new());
    let job = Job {
        remote: remote.clone(),
        opts,
        policy: set.policy.clone(),
        verify: c.verify,
        overwrite: c.overwrite,
        streams: set.streams.clamp(1, MAX_STREAMS),
        ceiling: (c.streams > 1).then_some(c.streams),
        inline: sh.cfg.inline.clone(),
        state: Arc::clone(&state),
        leg: set.leg,
        leg_min: set.leg_min,
        offer: Mutex::new(None),
        pull: matches!(c.mode, Mode::Pull(_)),
    };
    if let Local::Pull {
        parent, name, tmp, ..
    } = &mut local
    {
        match Upload::start(parent, name) {
            Ok(u) => *tmp = Some(u),
            Err(e) => return io_resp(&e),
        }
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("http-tpc".into())
        .spawn(move || {
            let _slot = slot;
            run(job, local, tx);
        });
    if let Err(e) = spawned {
        return failure_resp(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("no thread for the copy: {e}"),
        );
    }
    match rx.await {
        Ok(Ok(())) => {}
        Ok(Err((code, why))) => return failure_resp(code, &why),
        Err(_) => {
            return failure_resp(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the copy ended before it started",
            )
        }
    }
    let way = match c.mode {
        Mode::Pull(_) => "pull from",
        Mode::Push(_) => "push to",
    };
    let mut what = format!("COPY {} {way} {}", t.scope_path(), remote.display());
    if let Some(tag) = c.scitag {
        what.push_str(&format!(" scitag={tag}"));
    }
    if let Some(ci) = &c.client_info {
        what.push_str(&format!(" clientinfo={ci}"));
    }
    sh.log(&format!("{what}: started"));
    let body = Markers {
        sh: Rc::clone(sh),
        state,
        what,
        period: set
            .marker_period
            .clamp(Duration::from_millis(100), Duration::from_secs(5)),
        first_byte: set.first_byte_timeout,
        progress: set.progress_timeout,
        sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
        next_marker: None,
        seen: (0, Instant::now()),
        ended: false,
    };
    let mut r = Response::new(Body::stream(Box::pin(body)));
    *r.status_mut() = StatusCode::ACCEPTED;
    insert(r.headers_mut(), header::CONTENT_TYPE, "text/plain");
    r
}

/// A refusal before the copy started: the status, and the body a
/// `failure:` line as XRootD sends it.
fn failure_resp(code: StatusCode, why: &str) -> Resp {
    let line = markers::failure(why);
    text(code, line.trim_end())
}

fn prepare_pull(
    sh: &Shared,
    t: &Target,
    headers: &HeaderMap,
    overwrite: bool,
) -> Result<Local, Resp> {
    let f = export_of(sh, t)?;
    let Some(rel) = &t.rel else {
        return Err(text(
            StatusCode::METHOD_NOT_ALLOWED,
            "cannot COPY onto an export itself",
        ));
    };
    if t.slash {
        return Err(text(
            StatusCode::BAD_REQUEST,
            "a COPY names a file, not a directory (trailing '/')",
        ));
    }
    let name = rel.split_last().1.to_vec();
    if hidden(&name) {
        return Err(text(
            StatusCode::FORBIDDEN,
            "names starting '.fatpipe-' are the server's own",
        ));
    }
    if f.export.read_only {
        return Err(text(
            StatusCode::FORBIDDEN,
            &format!("export '{}' is read-only", f.export.name),
        ));
    }
    let parent = match parent_of(&f.root, rel) {
        Ok(p) => p,
        Err(r) => {
            authorize(sh, headers, f.export, t, Perm::Create)?;
            return Err(r);
        }
    };
    let existing = parent.stat_at(&name).map_err(|e| io_resp(&e))?;
    let perm = if existing.is_some() {
        Perm::Modify
    } else {
        Perm::Create
    };
    authorize(sh, headers, f.export, t, perm)?;
    if matches!(existing, Some(m) if m.kind != Kind::File) {
        return Err(text(
            StatusCode::CONFLICT,
            "the name exists and is not a regular file",
        ));
    }
    if existing.is_some() && !overwrite {
        return Err(text(
            StatusCode::PRECONDITION_FAILED,
            "the destination exists and Overwrite is F",
        ));
    }
    Ok(Local::Pull {
        parent,
        name,
        tmp: None,
        existed: existing.is_some(),
    })
}

fn prepare_push(sh: &Shared, t: &Target, headers: &HeaderMap) -> Result<Local, Resp> {
    let f = export_of(sh, t)?;
    authorize(sh, headers, f.export, t, Perm::Read)?;
    let o = object(&f, t)?;
    let (Some(parent), Some(meta)) = (o.parent, o.meta) else {
        return Err(text(StatusCode::NOT_FOUND, "no such file"));
    };
    if hidden(&o.name) {
        return Err(text(StatusCode::NOT_FOUND, "no such file"));
    }
    if meta.kind != Kind::File {
        return Err(text(
            StatusCode::CONFLICT,
            "a COPY pushes one regular file (not a directory or a symlink)",
        ));
    }
    let file = parent
        .open_at(&o.name, OFlags::RDONLY, 0)
        .map_err(|e| io_resp(&e))?;
    let meta = fstat(&file).map_err(|e| io_resp(&e))?;
    if meta.kind != Kind::File {
        return Err(text(StatusCode::CONFLICT, "not a regular file"));
    }
    Ok(Local::Push {
        file,
        size: meta.size,
        parent,
        name: o.name,
    })
}

/// The copy's thread.
fn run(job: Job, local: Local, started: Started) {
    let state = Arc::clone(&job.state);
    let result = match local {
        Local::Pull {
            parent,
            name,
            tmp: Some(mut tmp),
            existed,
        } => {
            let r = pull(&job, &parent, &name, &mut tmp, existed, started);
            if r.is_err() {
                tmp.abandon(&parent);
            }
            r
        }
        Local::Pull { tmp: None, .. } => {
            let why = "no file to write into".to_string();
            let _ = started.send(Err((StatusCode::INTERNAL_SERVER_ERROR, why.clone())));
            Err(why)
        }
        Local::Push {
            file,
            size,
            parent,
            name,
        } => {
            if let Ok(addrs) = resolve_allowed(&job.remote, &job.policy) {
                lock(&job.state.remote).extend(addrs.into_iter().take(1));
            }
            let _ = started.send(Ok(()));
            push(
                &job,
                file,
                size,
                leg::Src {
                    parent: &parent,
                    name: &name,
                },
            )
        }
    };
    state.end(result);
}

fn pull(
    job: &Job,
    parent: &Dir,
    name: &[u8],
    tmp: &mut Upload,
    existed: bool,
    started: Started,
) -> Result<String, String> {
    let Some(rt) = pool::runtime() else {
        let why = "no runtime for the copy's connections".to_string();
        let _ = started.send(Err((StatusCode::SERVICE_UNAVAILABLE, why.clone())));
        return Err(why);
    };
    // A warm GET of a large file (one the leg would take) falls back to
    // the HEAD below, which asks a fatpipe source for a ticket.
    if let Some(c) = pool::take(&job.remote) {
        match rt.block_on(get_first(c, job)) {
            Warm::Refused(code, why) => {
                let _ = started.send(Err((code, why.clone())));
                return Err(why);
            }
            Warm::Body(b) => {
                let (conn, res, stat) = *b;
                if let Err(why) = fits(parent, &stat) {
                    let _ = started.send(Err((StatusCode::INSUFFICIENT_STORAGE, why.clone())));
                    return Err(why);
                }
                job.state.connected(&conn);
                let _ = started.send(Ok(()));
                let algos = algos_for(&job.inline, &stat);
                let url = job.remote.clone();
                let (sums, got) = rt.block_on(read_whole(
                    job, conn, res, &url, stat.size, &tmp.file, &algos,
                ))?;
                let mut stat = stat;
                if job.verify && stat.digests.is_empty() {
                    // The source gave no checksum with the body: ask.
                    stat.digests = rt.block_on(async {
                        let mut c = match pool::take(&url) {
                            Some(c) => c,
                            None => client::connect(&url, &job.opts)
                                .await
                                .map_err(|e| e.to_string())?,
                        };
                        let (_, st) = head(&mut c, job).await.map_err(|e| e.1)?;
                        pool::put(c);
                        Ok::<_, String>(st.digests)
                    })?;
                }
                let done = Pulled {
                    sums,
                    got,
                    streams: 1,
                    existed,
                };
                return finish_pull(job, parent, name, tmp, &stat, done);
            }
            Warm::Fallback => {}
        }
    }
    let head = rt.block_on(async {
        let fresh = || async {
            client::connect(&job.remote, &job.opts)
                .await
                .map_err(|e| (StatusCode::BAD_GATEWAY, e.to_string()))
        };
        // A warm connection from the last copy, else a new one; a warm one
        // the peer has closed meanwhile is replaced once.
        let (mut conn, warm) = match pool::take(&job.remote) {
            Some(c) => (c, true),
            None => (fresh().await?, false),
        };
        let (url, stat) = match head(&mut conn, job).await {
            Err(e) if warm && e.0 == StatusCode::BAD_GATEWAY => {
                conn = fresh().await?;
                head(&mut conn, job).await?
            }
            r => r?,
        };
        Ok::<_, (StatusCode, String)>((conn, url, stat))
    });
    let (mut conn, url, stat) = match head {
        Ok(h) => h,
        Err(e) => {
            let why = e.1.clone();
            let _ = started.send(Err(e));
            return Err(why);
        }
    };
    if let Err(why) = fits(parent, &stat) {
        let _ = started.send(Err((StatusCode::INSUFFICIENT_STORAGE, why.clone())));
        return Err(why);
    }
    job.state.connected(&conn);
    let _ = started.send(Ok(()));
    // Over the copy protocol when the source is a fatpipe server that
    // offered a ticket; else (or if that fails before a byte moved) HTTP.
    let mut note = None;
    match lock(&job.offer).take() {
        None => {}
        Some(Err(why)) => note = Some(format!("leg not used: its ticket: {why}")),
        Some(Ok(_)) if existed => note = Some("leg not used: the destination exists".into()),
        Some(Ok(_)) if stat.size.is_none_or(|n| n < job.leg_min) => {}
        Some(Ok(offer)) => {
            let dest = leg::Dest { parent, name };
            match leg::pull(job, &url, &conn, offer, &stat, dest) {
                leg::End::Done(summary) => {
                    tmp.abandon(parent);
                    pool::put(conn);
                    return Ok(summary);
                }
                leg::End::Failed(why) => return Err(why),
                leg::End::Fallback(why) => {
                    note = Some(format!("leg not used: {why}"));
                    // The HEAD's connection may have gone idle meanwhile.
                    conn = rt
                        .block_on(client::connect(&url, &job.opts))
                        .map_err(|e| e.to_string())?;
                    lock(&job.state.remote).clear();
                    job.state.connected(&conn);
                }
            }
        }
    }
    let mut conn = conn;
    let mut stat = stat;
    if !stat.ranges && stat.size.is_some_and(|n| n > BLOCK) {
        // XRootD 5.5 serves ranges without saying `Accept-Ranges`: ask.
        match rt.block_on(serves_ranges(&mut conn, &url, job)) {
            Ok(r) => stat.ranges = r,
            Err(why) => return Err(why),
        }
        job.state.connected(&conn);
    }
    let algos = algos_for(&job.inline, &stat);
    let size = stat.size;
    let streams = match size {
        Some(n) if stat.ranges && n > BLOCK => {
            connections(job, &conn).min(n.div_ceil(BLOCK) as u32)
        }
        _ => 1,
    };
    let (sums, got) = if streams > 1 {
        let n = size.unwrap_or(0);
        let sums = ranged(job, rt, conn, &url, &stat, n, &tmp.file, &algos, streams)?;
        (sums, n)
    } else {
        whole(job, rt, conn, &url, size, &tmp.file, &algos)?
    };
    let done = Pulled {
        sums,
        got,
        streams,
        existed,
    };
    finish_pull(job, parent, name, tmp, &stat, done).map(|s| match note {
        Some(n) => format!("{s} ({n})"),
        None => s,
    })
}

/// What a pull moved.
struct Pulled {
    sums: Sums,
    got: u64,
    streams: u32,
    existed: bool,
}

/// The end of a pull: the source's checksum compared, the file flushed,
/// its checksums kept, named.
fn finish_pull(
    job: &Job,
    parent: &Dir,
    name: &[u8],
    tmp: &mut Upload,
    stat: &Stat,
    done: Pulled,
) -> Result<String, String> {
    let Pulled {
        sums,
        got,
        streams,
        existed,
    } = done;
    if job.state.cancelled() {
        return Err("cancelled".into());
    }
    let verified = match stat.digests.iter().find(|(a, _)| sums.get(*a).is_some()) {
        Some((a, want)) => {
            let have = sums.get(*a).unwrap_or_default();
            if have != want.as_slice() {
                return Err(format!(
                    "checksum mismatch: the source says {}, the file written has {}; nothing was kept",
                    client::show_digest(*a, want),
                    client::show_digest(*a, have)
                ));
            }
            Some(client::show_digest(*a, have))
        }
        None if job.verify => {
            return Err(
                "the source offers no checksum (no Digest for adler32 on HEAD) and \
                 RequireChecksumVerification is true; nothing was kept"
                    .into(),
            )
        }
        None => None,
    };
    tmp.file
        .sync_all()
        .map_err(|e| format!("writing the file: {e}"))?;
    let _ = digest::store(parent, name, &tmp.file, &sums);
    let replace = job.overwrite;
    job.state.commit(|| name_file(tmp, parent, name, replace))?;
    parent
        .sync()
        .map_err(|e| format!("syncing the directory: {e}"))?;
    Ok(format!(
        "{got} bytes over {streams} connection(s){}{}",
        if existed { ", replaced" } else { "" },
        verified
            .map(|v| format!(", {v} verified"))
            .unwrap_or_default()
    ))
}

/// Names the complete file: replacing what is there, or (`Overwrite: F`)
/// only if the name is still free.
fn name_file(tmp: &mut Upload, parent: &Dir, name: &[u8], replace: bool) -> std::io::Result<()> {
    if replace {
        return tmp.finish(parent, name);
    }
    match tmp.tmp_name.take() {
        None => parent.link_fd_at(&tmp.file, name),
        Some(t) => match parent.rename_to(&t, parent, name, false) {
            Ok(()) => Ok(()),
            Err(e) => {
                tmp.tmp_name = Some(t);
                Err(e)
            }
        },
    }
}

/// `HEAD` of the source (with `Want-Digest` when verifying), redirects
/// followed within the policy: the final URL and what it said.
async fn head(conn: &mut Connection, job: &Job) -> Result<(Url, Stat), (StatusCode, String)> {
    let bad = |m: String| (StatusCode::BAD_GATEWAY, m);
    let mut url = job.remote.clone();
    for _ in 0..=client::MAX_REDIRECTS {
        if url.host != conn.url.host || url.port != conn.url.port || url.tls != conn.url.tls {
            resolve_allowed(&url, &job.policy).map_err(|w| (StatusCode::FORBIDDEN, w))?;
            *conn = client::connect(&url, &job.opts)
                .await
                .map_err(|e| bad(e.to_string()))?;
        }
        // The source's checksum is asked for only when it is to be
        // verified: a source without one kept computes it with a read of
        // the whole file.
        let mut rb = conn.request(Method::HEAD, &url.path, &job.opts);
        if job.verify {
            rb = rb.header("want-digest", client::WANT_DIGEST);
        }
        if leg::wanted(job, &url) {
            rb = rb.header(crate::ticket::HEADER, "read");
        }
        let req = rb.body(client::empty()).map_err(|e| bad(e.to_string()))?;
        let res = conn.send(req).await.map_err(|e| bad(e.to_string()))?;
        let status = res.status();
        if status.is_redirection() {
            let loc = res
                .headers()
                .get(header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| bad(format!("HEAD {}: {status} without Location", url.display())))?;
            url = if loc.starts_with('/') {
                Url {
                    path: loc.to_string(),
                    ..url.clone()
                }
            } else {
                let u = Url::parse(loc).map_err(|e| bad(format!("redirect to {e}")))?;
                if url.tls && !u.tls {
                    return Err(bad(format!(
                        "{}: redirected from https to plain http: refused",
                        url.display()
                    )));
                }
                u
            };
            continue;
        }
        if !status.is_success() {
            let code = match status {
                StatusCode::NOT_FOUND | StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => status,
                _ => StatusCode::BAD_GATEWAY,
            };
            return Err((
                code,
                format!("the source answered HEAD {}: {status}", url.display()),
            ));
        }
        if leg::wanted(job, &url) {
            *lock(&job.offer) = leg::offer_of(res.headers());
        }
        return Ok((url, client::stat(res.headers())));
    }
    Err(bad(format!(
        "{}: more than {} redirects",
        job.remote.display(),
        client::MAX_REDIRECTS
    )))
}

/// Whether a source that did not say `Accept-Ranges: bytes` serves
/// ranges anyway: a `GET` of its first byte (a connection that answered
/// otherwise is replaced, its body unread).
async fn serves_ranges(conn: &mut Connection, url: &Url, job: &Job) -> Result<bool, String> {
    let req = conn
        .request(Method::GET, &url.path, &job.opts)
        .header(header::RANGE, "bytes=0-0")
        .body(client::empty())
        .map_err(|e| e.to_string())?;
    let res = conn.send(req).await.map_err(|e| e.to_string())?;
    if res.status() == StatusCode::PARTIAL_CONTENT {
        let mut body = res.into_body();
        while let Some(_f) = client::next_frame(&mut body, url)
            .await
            .map_err(|e| e.to_string())?
        {}
        return Ok(true);
    }
    drop(res);
    *conn = client::connect(url, &job.opts)
        .await
        .map_err(|e| e.to_string())?;
    Ok(false)
}

/// Connections a ranged pull opens: one per 10 ms of the round trip the
/// first connection measured (as `fatpipe copy https://…` starts), at
/// least `--http-tpc-streams`, at most [`START_MAX`] (a long lossy path
/// needs many: each connection's window is what limits it), and never
/// above the client's ceiling.
fn connections(job: &Job, conn: &Connection) -> u32 {
    let rtt_ms = fatpipe_sys::tcp::tcp_info(&conn.socket)
        .ok()
        .and_then(|i| i.rtt_us)
        .map_or(0, |r| r / 1000);
    let choice = (rtt_ms / 10).clamp(job.streams, START_MAX.max(job.streams));
    job.ceiling
        .map_or(choice, |c| c.min(choice))
        .clamp(1, MAX_STREAMS)
}

/// The most connections a pull starts with by the round trip alone.
pub const START_MAX: u32 = 16;

/// Whether the file the source announces fits here.
fn fits(parent: &Dir, stat: &Stat) -> Result<(), String> {
    let Some(n) = stat.size else { return Ok(()) };
    if n > client::get::MAX_SIZE {
        return Err(format!("the source has {n} bytes, more than a copy takes"));
    }
    match parent.space() {
        Ok(s) if s.free < n => Err(format!("{n} bytes do not fit: {} bytes free", s.free)),
        _ => Ok(()),
    }
}

/// The checksums computed while writing: the server's own, and the
/// source's algorithm.
fn algos_for(inline: &[Algo], stat: &Stat) -> Vec<Algo> {
    let mut algos = inline.to_vec();
    if let Some((a, _)) = stat.digests.first() {
        if !algos.contains(a) {
            algos.push(*a);
        }
    }
    algos
}

/// The largest file a warm pull reads with the one `GET` it starts with;
/// a larger one that serves ranges goes the cold way (HEAD, ranged GETs).
pub const WARM_WHOLE: u64 = BLOCK;

/// What a `GET` on a warm connection led to.
enum Warm {
    /// The source's refusal (404, 401, 403): the copy's answer.
    Refused(StatusCode, String),
    /// The whole file is coming on this connection.
    Body(Box<(Connection, hyper::Response<hyper::body::Incoming>, Stat)>),
    /// Anything else (a closed connection, a redirect, a large file with
    /// ranges): the cold way.
    Fallback,
}

/// A copy from a peer a connection is kept to starts with the `GET`
/// itself (with `Want-Digest`): no `HEAD` round trip for a small file.
async fn get_first(mut conn: Connection, job: &Job) -> Warm {
    let mut rb = conn.request(Method::GET, &job.remote.path, &job.opts);
    if job.verify {
        rb = rb.header("want-digest", client::WANT_DIGEST);
    }
    let Ok(req) = rb.body(client::empty()) else {
        return Warm::Fallback;
    };
    let Ok(res) = conn.send(req).await else {
        return Warm::Fallback;
    };
    let status = res.status();
    if matches!(
        status,
        StatusCode::NOT_FOUND | StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
    ) {
        return Warm::Refused(
            status,
            format!("the source answered GET {}: {status}", job.remote.display()),
        );
    }
    if status != StatusCode::OK {
        return Warm::Fallback;
    }
    let stat = client::stat(res.headers());
    match stat.size {
        Some(n) if n <= WARM_WHOLE || !stat.ranges => Warm::Body(Box::new((conn, res, stat))),
        _ => Warm::Fallback,
    }
}

/// One `GET` of the whole file, written and hashed in order.
fn whole(
    job: &Job,
    rt: &tokio::runtime::Runtime,
    mut conn: Connection,
    url: &Url,
    size: Option<u64>,
    file: &File,
    algos: &[Algo],
) -> Result<(Sums, u64), String> {
    rt.block_on(async {
        let req = conn
            .request(Method::GET, &url.path, &job.opts)
            .body(client::empty())
            .map_err(|e| e.to_string())?;
        let res = conn.send(req).await.map_err(|e| e.to_string())?;
        read_whole(job, conn, res, url, size, file, algos).await
    })
}

/// Reads a whole-file answer into `file`, hashing it; the connection is
/// kept for the next copy when the body ended cleanly.
async fn read_whole(
    job: &Job,
    conn: Connection,
    res: hyper::Response<hyper::body::Incoming>,
    url: &Url,
    size: Option<u64>,
    file: &File,
    algos: &[Algo],
) -> Result<(Sums, u64), String> {
    let state = &job.state;
    {
        let status = res.status();
        if !status.is_success() {
            let why = client::error_text(res.into_body()).await;
            return Err(format!("GET {}: {status}: {why}", url.display()));
        }
        let mut body = res.into_body();
        let mut hasher = Hasher::new(algos);
        let mut got = 0u64;
        while let Some(frame) = client::next_frame(&mut body, url)
            .await
            .map_err(|e| e.to_string())?
        {
            if state.cancelled() {
                return Err("cancelled".into());
            }
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if size.is_some_and(|n| got + data.len() as u64 > n) {
                return Err(format!(
                    "{}: the source sent more than its Content-Length",
                    url.display()
                ));
            }
            file.write_all_at(&data, got)
                .map_err(|e| format!("writing the file: {e}"))?;
            hasher.update(&data);
            got += data.len() as u64;
            state.progress.moved(data.len() as u64);
        }
        if let Some(n) = size.filter(|&n| n != got) {
            return Err(format!(
                "{}: the source sent {got} of {n} bytes",
                url.display()
            ));
        }
        pool::put(conn);
        Ok((hasher.finish(), got))
    }
}

/// The blocks of a ranged pull: those still to fetch, and the contiguous
/// prefix hashed so far.
struct Blocks<'a> {
    job: &'a Job,
    url: &'a Url,
    etag: Option<String>,
    size: u64,
    file: &'a File,
    reader: File,
    queue: Mutex<VecDeque<u64>>,
    order: Mutex<Order>,
    error: Mutex<Option<String>>,
}

struct Order {
    next: u64,
    done: Vec<bool>,
    hasher: Hasher,
    buf: Vec<u8>,
}

impl Blocks<'_> {
    fn stopped(&self) -> bool {
        self.job.state.cancelled() || lock(&self.error).is_some()
    }

    fn fail(&self, why: String) {
        lock(&self.error).get_or_insert(why);
        lock(&self.queue).clear();
    }

    /// Marks block `b` written and hashes the prefix it completes.
    fn complete(&self, b: u64) -> Result<(), String> {
        let mut o = lock(&self.order);
        let Some(slot) = o.done.get_mut(b as usize) else {
            return Err("block out of range".into());
        };
        *slot = true;
        while (o.next as usize) < o.done.len() && o.done[o.next as usize] {
            let start = o.next * BLOCK;
            let end = (start + BLOCK).min(self.size);
            let mut at = start;
            let Order { hasher, buf, .. } = &mut *o;
            while at < end {
                let n = ((end - at) as usize).min(HASH_CHUNK);
                buf.resize(n, 0);
                self.reader
                    .read_exact_at(&mut buf[..n], at)
                    .map_err(|e| format!("reading back the file to hash it: {e}"))?;
                hasher.update(&buf[..n]);
                at += n as u64;
            }
            o.next += 1;
        }
        Ok(())
    }

    async fn fetch(&self, c: &mut Connection, b: u64) -> Result<(), String> {
        let first = b * BLOCK;
        let len = (self.size - first).min(BLOCK);
        let last = first + len - 1;
        let mut rb = c
            .request(Method::GET, &self.url.path, &self.job.opts)
            .header(header::RANGE, format!("bytes={first}-{last}"));
        if let Some(e) = &self.etag {
            rb = rb.header(header::IF_RANGE, e);
        }
        let req = rb.body(client::empty()).map_err(|e| e.to_string())?;
        let res = c.send(req).await.map_err(|e| e.to_string())?;
        let status = res.status();
        if status != StatusCode::PARTIAL_CONTENT {
            let why = client::error_text(res.into_body()).await;
            let msg = format!(
                "GET {} bytes {first}-{last}: {status} (not 206){}{why}",
                self.url.display(),
                if why.is_empty() { "" } else { ": " }
            );
            // A whole file or another range: the file changed; fatal.
            self.fail(msg.clone());
            return Err(msg);
        }
        let cr = res
            .headers()
            .get(header::CONTENT_RANGE)
            .and_then(|v| client::parse_content_range(v.as_bytes()));
        if cr != Some((first, last, Some(self.size))) && cr != Some((first, last, None)) {
            let msg = format!(
                "GET {}: asked for bytes {first}-{last} of {}, the source sent another range",
                self.url.display(),
                self.size
            );
            self.fail(msg.clone());
            return Err(msg);
        }
        let mut body = res.into_body();
        let mut got = 0u64;
        let r = async {
            while let Some(frame) = client::next_frame(&mut body, self.url)
                .await
                .map_err(|e| e.to_string())?
            {
                if self.stopped() {
                    return Err("stopped".to_string());
                }
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                if got + data.len() as u64 > len {
                    return Err(format!("{}: more than asked for", self.url.display()));
                }
                self.file
                    .write_all_at(&data, first + got)
                    .map_err(|e| format!("writing the file: {e}"))?;
                got += data.len() as u64;
                self.job.state.progress.moved(data.len() as u64);
            }
            if got != len {
                return Err(format!(
                    "{}: a range ended after {got} of {len} bytes",
                    self.url.display()
                ));
            }
            Ok(())
        }
        .await;
        if r.is_err() {
            self.job
                .state
                .progress
                .bytes
                .fetch_sub(got, Ordering::Relaxed);
        }
        r
    }

    /// One connection's loop: blocks until none are left; then its
    /// connection is kept for the next copy.
    async fn work(&self, conn: Option<Connection>) {
        let mut conn = conn;
        let mut failures = 0;
        while !self.stopped() {
            let Some(b) = lock(&self.queue).pop_front() else {
                if let Some(c) = conn {
                    pool::put(c);
                }
                return;
            };
            let c = match conn.as_mut() {
                Some(c) => c,
                None => match match pool::take(self.url) {
                    Some(c) => Ok(c),
                    None => client::connect(self.url, &self.job.opts).await,
                } {
                    Ok(c) => {
                        self.job.state.connected(&c);
                        conn.insert(c)
                    }
                    Err(e) => {
                        lock(&self.queue).push_front(b);
                        failures += 1;
                        if failures >= ATTEMPTS {
                            self.fail(e.to_string());
                            return;
                        }
                        continue;
                    }
                },
            };
            match self.fetch(c, b).await {
                Ok(()) => {
                    failures = 0;
                    if let Err(e) = self.complete(b) {
                        self.fail(e);
                        return;
                    }
                }
                Err(e) => {
                    conn = None;
                    if self.stopped() {
                        return;
                    }
                    lock(&self.queue).push_front(b);
                    failures += 1;
                    if failures >= ATTEMPTS {
                        self.fail(e);
                        return;
                    }
                }
            }
        }
    }
}

/// Ranged `GET`s over `streams` connections.
#[allow(clippy::too_many_arguments)]
fn ranged(
    job: &Job,
    rt: &tokio::runtime::Runtime,
    conn: Connection,
    url: &Url,
    stat: &Stat,
    size: u64,
    file: &File,
    algos: &[Algo],
    streams: u32,
) -> Result<Sums, String> {
    let reader = File::open(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map_err(|e| format!("reopening the file to hash it: {e}"))?;
    file.set_len(size)
        .map_err(|e| format!("sizing the file: {e}"))?;
    let n = size.div_ceil(BLOCK);
    let blocks = Blocks {
        job,
        url,
        etag: stat.etag.clone().filter(|e| !e.starts_with("W/")),
        size,
        file,
        reader,
        queue: Mutex::new((0..n).collect()),
        order: Mutex::new(Order {
            next: 0,
            done: vec![false; n as usize],
            hasher: Hasher::new(algos),
            buf: Vec::new(),
        }),
        error: Mutex::new(None),
    };
    std::thread::scope(|scope| {
        for _ in 1..streams {
            let blocks = &blocks;
            scope.spawn(move || rt.block_on(blocks.work(None)));
        }
        rt.block_on(blocks.work(Some(conn)));
    });
    if let Some(e) = lock(&blocks.error).take() {
        return Err(e);
    }
    if job.state.cancelled() {
        return Err("cancelled".into());
    }
    let order = blocks.order.into_inner().unwrap_or_else(|e| e.into_inner());
    if order.next != n {
        return Err(format!(
            "{} of {n} blocks fetched",
            order.done.iter().filter(|d| **d).count()
        ));
    }
    Ok(order.hasher.finish())
}

fn push(job: &Job, file: File, size: u64, src: leg::Src<'_>) -> Result<String, String> {
    let rt = pool::runtime().ok_or("no runtime for the copy's connections")?;
    let url = &job.remote;
    let state = &job.state;
    // Over the copy protocol when the destination is a fatpipe server
    // that gives a ticket to write the file; else (or if that fails
    // before a byte moved) HTTP.
    let note = if job.leg && size >= job.leg_min {
        match push_leg(job, rt, &file, src) {
            PushLeg::Done(done) => return Ok(done),
            PushLeg::Failed(why) => return Err(why),
            PushLeg::NotUsed(note) => note,
        }
    } else {
        None
    };
    rt.block_on(async {
        let mut conn = match pool::take(url) {
            Some(c) => c,
            None => client::connect(url, &job.opts)
                .await
                .map_err(|e| e.to_string())?,
        };
        state.connected(&conn);
        let hasher = Arc::new(Mutex::new(Some(Hasher::new(&[Algo::Adler32]))));
        // `Expect: 100-continue`: the body waits for `100 Continue` (or a
        // second, as curl), so a refusal comes before any byte is sent.
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let tx = Mutex::new(Some(tx));
        let gate: client::Waiting = Box::pin(async move {
            let _ = tokio::time::timeout(Duration::from_secs(1), rx).await;
        });
        let body = PushBody {
            file,
            off: 0,
            left: size,
            hasher: Arc::clone(&hasher),
            state: Arc::clone(state),
            gate: (size > 0).then_some(gate),
        };
        conn.widen_for(size);
        let mut rb = conn
            .request(Method::PUT, &url.path, &job.opts)
            .header(header::CONTENT_LENGTH, size)
            .header(header::CONTENT_TYPE, "application/octet-stream");
        if size > 0 {
            rb = rb.header(header::EXPECT, "100-continue");
        }
        if !job.overwrite {
            // Create only (RFC 9110): the destination's 412 if it exists.
            rb = rb.header(header::IF_NONE_MATCH, "*");
        }
        let mut req = rb
            .body(http_body_util::BodyExt::boxed_unsync(body))
            .map_err(|e| e.to_string())?;
        hyper::ext::on_informational(&mut req, move |res| {
            if res.status() == StatusCode::CONTINUE {
                if let Some(tx) = lock(&tx).take() {
                    let _ = tx.send(());
                }
            }
        });
        let res = conn.send(req).await.map_err(|e| e.to_string())?;
        let status = res.status();
        if !status.is_success() {
            let why = client::error_text(res.into_body()).await;
            return Err(format!(
                "the destination answered PUT {}: {status}{}{why}",
                url.display(),
                if why.is_empty() { "" } else { ": " }
            ));
        }
        let mut body = res.into_body();
        while let Some(_f) = client::next_frame(&mut body, url)
            .await
            .map_err(|e| e.to_string())?
        {}
        let sent = lock(&hasher)
            .take()
            .map(Hasher::finish)
            .and_then(|s| s.get(Algo::Adler32).map(<[u8]>::to_vec))
            .unwrap_or_default();
        // Verify: the size, and the destination's checksum.
        let (_, stat) = head(&mut conn, job).await.map_err(|e| e.1)?;
        pool::put(conn);
        if let Some(n) = stat.size.filter(|&n| n != size) {
            return Err(format!(
                "{}: {n} bytes after the upload, not {size}",
                url.display()
            ));
        }
        match stat.digests.iter().find(|(a, _)| *a == Algo::Adler32) {
            Some((a, theirs)) if *theirs != sent => Err(format!(
                "checksum mismatch after the upload: the destination has {}, the file sent {}",
                client::show_digest(*a, theirs),
                client::show_digest(*a, &sent)
            )),
            Some((a, theirs)) => Ok(format!(
                "{size} bytes, {} verified",
                client::show_digest(*a, theirs)
            )),
            None if job.verify => Err(
                "the destination offers no checksum after the upload (no Digest for adler32 on \
                 HEAD) and RequireChecksumVerification is true"
                    .into(),
            ),
            None => Ok(format!("{size} bytes")),
        }
    })
    .map(|s| match note {
        Some(n) => format!("{s} ({n})"),
        None => s,
    })
}

/// How a push over the leg ended.
enum PushLeg {
    /// The file is at the destination, verified: the copy's summary.
    Done(String),
    /// It failed after data moved: the copy fails.
    Failed(String),
    /// Not used (the destination is not fatpipe, refused, or the leg
    /// failed before a byte moved): HTTP, with this note if any.
    NotUsed(Option<String>),
}

/// A push over the leg: `OPTIONS` of the destination asking for a ticket
/// to write it ([`leg::write_ticket_request`]; a fatpipe destination
/// checks it as the `PUT`, so a refusal, `Overwrite: F` onto an existing
/// file included, is left to the `PUT`, which meets the same answer);
/// with one, the copy protocol pushes the file, and the destination's
/// adler32 (its `HEAD` with `Want-Digest`) is compared with the source's.
fn push_leg(job: &Job, rt: &tokio::runtime::Runtime, file: &File, src: leg::Src<'_>) -> PushLeg {
    let url = &job.remote;
    let asked = rt.block_on(async {
        let mut conn = match pool::take(url) {
            Some(c) => c,
            None => client::connect(url, &job.opts)
                .await
                .map_err(|e| e.to_string())?,
        };
        let req = leg::write_ticket_request(&mut conn, url, &job.opts, job.overwrite)
            .body(client::empty())
            .map_err(|e| e.to_string())?;
        let res = conn.send(req).await.map_err(|e| e.to_string())?;
        let status = res.status();
        let offer = leg::offer_of(res.headers());
        let mut body = res.into_body();
        while client::next_frame(&mut body, url)
            .await
            .map_err(|e| e.to_string())?
            .is_some()
        {}
        Ok::<_, String>((conn, status, offer))
    });
    let (conn, status, offer) = match asked {
        Ok(a) => a,
        Err(why) => return PushLeg::NotUsed(Some(format!("leg not used: OPTIONS: {why}"))),
    };
    let offer = match offer {
        _ if !status.is_success() => {
            pool::put(conn);
            return PushLeg::NotUsed(None);
        }
        None => {
            pool::put(conn);
            return PushLeg::NotUsed(None);
        }
        Some(Err(why)) => {
            pool::put(conn);
            return PushLeg::NotUsed(Some(format!("leg not used: its ticket: {why}")));
        }
        Some(Ok(o)) => o,
    };
    let summary = match leg::push(job, url, &conn, offer, src) {
        leg::End::Done(s) => s,
        leg::End::Failed(why) => return PushLeg::Failed(why),
        leg::End::Fallback(why) => {
            lock(&job.state.remote).clear();
            return PushLeg::NotUsed(Some(format!("leg not used: {why}")));
        }
    };
    // Every chunk was verified as it landed. With
    // RequireChecksumVerification the end-to-end adler32 too, as over
    // HTTP: the source's (kept with the file, else computed while the
    // destination's HEAD runs) against the destination's (which it then
    // keeps, for the client's own check).
    if !job.verify {
        return PushLeg::Done(summary);
    }
    let ours = std::thread::scope(|scope| {
        let mine = scope.spawn(|| {
            let kept = digest::load(src.parent, src.name, file);
            match kept.get(Algo::Adler32) {
                Some(v) => Ok(v.to_vec()),
                None => digest::compute(file, &[Algo::Adler32])
                    .map(|s| s.get(Algo::Adler32).map(<[u8]>::to_vec).unwrap_or_default()),
            }
        });
        let theirs = rt.block_on(async {
            let mut conn = client::connect(url, &job.opts)
                .await
                .map_err(|e| e.to_string())?;
            let (_, stat) = head(&mut conn, job).await.map_err(|e| e.1)?;
            pool::put(conn);
            Ok::<_, String>(stat)
        });
        (mine.join(), theirs)
    });
    let sent = match ours.0 {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => return PushLeg::Failed(format!("reading the file for its adler32: {e}")),
        Err(_) => return PushLeg::Failed("the checksum thread panicked".into()),
    };
    let stat = match ours.1 {
        Ok(s) => s,
        Err(why) => return PushLeg::Failed(why),
    };
    match stat.digests.iter().find(|(a, _)| *a == Algo::Adler32) {
        Some((a, theirs)) if *theirs != sent => PushLeg::Failed(format!(
            "checksum mismatch after the leg: the destination has {}, the file {}",
            client::show_digest(*a, theirs),
            client::show_digest(*a, &sent)
        )),
        Some((a, theirs)) => PushLeg::Done(format!(
            "{summary}, {} verified",
            client::show_digest(*a, theirs)
        )),
        None if job.verify => PushLeg::Failed(
            "the destination offers no checksum after the leg (no Digest for adler32 on HEAD) \
             and RequireChecksumVerification is true"
                .into(),
        ),
        None => PushLeg::Done(summary),
    }
}

/// A push's request body: the file read as hyper asks (on the copy's
/// thread), hashed, counted; a cancelled copy ends it with an error.
struct PushBody {
    file: File,
    off: u64,
    left: u64,
    hasher: Arc<Mutex<Option<Hasher>>>,
    state: Arc<State>,
    gate: Option<client::Waiting>,
}

impl hyper::body::Body for PushBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = self.get_mut();
        if client::poll_waiting(&mut this.gate, cx).is_pending() {
            return Poll::Pending;
        }
        if this.left == 0 {
            return Poll::Ready(None);
        }
        if this.state.cancelled() {
            return Poll::Ready(Some(Err(std::io::Error::other("cancelled"))));
        }
        let n = (this.left as usize).min(HASH_CHUNK);
        let mut buf = vec![0u8; n];
        if let Err(e) = this.file.read_exact_at(&mut buf, this.off) {
            return Poll::Ready(Some(Err(e)));
        }
        if let Some(h) = lock(&this.hasher).as_mut() {
            h.update(&buf);
        }
        this.off += n as u64;
        this.left -= n as u64;
        this.state.progress.moved(n as u64);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(buf)))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}

/// The answer's body: a marker at once, then every `period`, and the last
/// line; cancels the copy when dropped before its end (the client went
/// away) or when the copy stalls.
struct Markers {
    sh: Rc<Shared>,
    state: Arc<State>,
    what: String,
    period: Duration,
    first_byte: Duration,
    progress: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
    next_marker: Option<Instant>,
    /// The bytes last seen, and when they last changed.
    seen: (u64, Instant),
    ended: bool,
}

impl Markers {
    fn marker(&self) -> String {
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let remote = lock(&self.state.remote).clone();
        markers::marker(unix, self.state.bytes(), &remote)
    }

    /// When the copy counts as stalled, and the line saying so.
    fn stall(&mut self, now: Instant) -> (Instant, String) {
        let bytes = self.state.bytes();
        if bytes != self.seen.0 {
            self.seen = (bytes, now);
        }
        if bytes == 0 {
            (
                self.state.t0 + self.first_byte,
                format!(
                    "no bytes were transferred in {} seconds (the other end stalled)",
                    self.first_byte.as_secs()
                ),
            )
        } else {
            (
                self.seen.1 + self.progress,
                format!(
                    "no progress for {} seconds after {bytes} bytes (the other end stalled)",
                    self.progress.as_secs()
                ),
            )
        }
    }
}

impl hyper::body::Body for Markers {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        *lock(&this.state.waker) = Some(cx.waker().clone());
        loop {
            let now = Instant::now();
            let phase = lock(&this.state.phase).clone();
            let last = match phase {
                Phase::Running => None,
                Phase::Done(Ok(summary)) => {
                    this.sh.log(&format!("{}: done, {summary}", this.what));
                    Some(markers::SUCCESS.to_string())
                }
                Phase::Done(Err(why)) | Phase::Cancelled(why) => {
                    this.sh.log(&format!("{}: failed: {why}", this.what));
                    Some(markers::failure(&why))
                }
            };
            if let Some(line) = last {
                this.ended = true;
                let text = this.marker() + &line;
                return Poll::Ready(Some(Ok(Frame::data(Bytes::from(text)))));
            }
            let (stall_at, why) = this.stall(now);
            if now >= stall_at {
                this.state.cancel(&why);
                continue;
            }
            let due = *this.next_marker.get_or_insert(now);
            if now >= due {
                this.next_marker = Some(now + this.period);
                return Poll::Ready(Some(Ok(Frame::data(Bytes::from(this.marker())))));
            }
            let wake = due.min(stall_at);
            this.sleep
                .as_mut()
                .reset(tokio::time::Instant::from_std(wake));
            if this.sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl Drop for Markers {
    fn drop(&mut self) {
        if !self.ended && self.state.cancel("the client closed the connection") {
            self.sh.log(&format!(
                "{}: cancelled: the client closed the connection; nothing was kept",
                self.what
            ));
        }
    }
}
