//! Download: `HEAD`, then ranged `GET`s of runs of [`BLOCK`]-byte blocks
//! over several connections into a hidden partial file, a journal of the
//! blocks written beside it, the file hashed as its blocks come in
//! ([`follow`]) and the server's checksum compared, flushed, renamed.
//!
//! The partial file and the journal are named from a hash of the final
//! name (`.fatpipe-http-<hash>.part`, `.journal`) in the destination's
//! directory, so a rerun of the same command finds them. The journal's
//! first line names the URL, the size, the block size, the `ETag` and
//! `Last-Modified` the blocks were fetched under; a rerun whose HEAD
//! differs in any of them starts over. Each block is journaled with one
//! `write(2)` after its `pwrite`s, so after a kill the page cache holds
//! every journaled block (as the copy protocol's journal without `--sync`;
//! a power loss may lose journaled data, which the checksum then catches
//! when the server offers one). Every ranged `GET` carries `If-Range` with
//! a strong `ETag`, so a file changed on the server mid-copy answers 200
//! instead of 206 and the copy fails rather than mixing two versions.
//!
//! The connections are threads ([`super::runtime`] each), sharing a queue
//! of the blocks still missing. [`Download::run`] can hand the transfer to
//! the in-flight adjuster (`fatpipe_tune::steer`) as a [`Steerable`]: it
//! samples the rate each second and adds connections while each step
//! helps, up to the ceiling.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use fatpipe_transfer::Progress;
use fatpipe_tune::adjust::Sample;
use fatpipe_tune::steer::{Added, Reading, Steerable};
use hyper::{Method, StatusCode};

use super::{
    connect, failed, head, next_frame, parse_content_range, runtime, status_error, ClientError,
    Connection, Options, Stat, Throttle, Url,
};
use crate::digest::{self, Algo};

/// Bytes fetched by one ranged `GET`, and the unit of resume.
pub const BLOCK: u64 = 8 << 20;
/// The most connections one download opens.
pub const MAX_CONNECTIONS: u32 = 32;
/// Failed attempts in a row before a connection gives up.
const RETRIES: u32 = 5;
/// The largest journal read back.
const MAX_JOURNAL: u64 = 256 << 20;
/// The largest file a download takes (2^24 blocks): the queue of blocks
/// and the journal's map are sized by what the server says.
pub const MAX_SIZE: u64 = BLOCK << 24;

/// What steers a running download: called once, on a thread of its own,
/// with the download as a [`Steerable`].
pub type Tune<'a> = dyn Fn(&mut dyn Steerable) + Sync + 'a;

/// What to download where.
#[derive(Debug, Clone)]
pub struct Request {
    /// The file's URL.
    pub url: Url,
    /// The local file it becomes.
    pub dest: PathBuf,
    /// Connections to start with.
    pub connections: u32,
    /// The most connections the adjuster may reach.
    pub max_connections: u32,
    /// A rate cap, bit/s.
    pub bwlimit: Option<u64>,
}

/// How a download went.
#[derive(Debug, Clone)]
pub struct Report {
    /// The URL read (after redirects).
    pub url: Url,
    /// The file's size.
    pub size: u64,
    /// Bytes fetched in this run.
    pub moved: u64,
    /// Bytes an earlier run had fetched (resumed).
    pub resumed: u64,
    /// The most connections open at once.
    pub connections: u32,
    /// The block size (ranged) or the file's size (one GET).
    pub block: u64,
    /// The server's checksum the file matched, if it offered one.
    pub verified: Option<(Algo, Vec<u8>)>,
    /// The server's `Server` header.
    pub server: Option<String>,
    /// Connections added in flight: (seconds since data started, how many).
    pub added: Vec<(f64, u32)>,
}

#[derive(serde::Serialize, serde::Deserialize, PartialEq, Eq, Debug)]
struct Header {
    v: u32,
    url: String,
    size: u64,
    block: u64,
    etag: Option<String>,
    modified: Option<String>,
}

struct Shared {
    url: Url,
    opts: Options,
    file: File,
    journal: Option<Mutex<File>>,
    queue: Mutex<VecDeque<u64>>,
    size: u64,
    block: u64,
    /// Blocks are ranges (else one whole-file GET).
    ranged: bool,
    if_range: Option<String>,
    progress: Arc<Progress>,
    throttle: Throttle,
    fatal: Mutex<Option<ClientError>>,
    last_error: Mutex<Option<String>>,
    stop: AtomicBool,
    live: AtomicU32,
    peak: AtomicU32,
    max: u32,
    sockets: Mutex<Vec<std::net::TcpStream>>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Blocks on disk (journaled, or resumed), for the verifier.
    done: Mutex<Vec<bool>>,
    done_cv: Condvar,
    /// The connections have all ended.
    ended: AtomicBool,
}

/// A download ready to run: the HEAD answered, the partial file and the
/// journal open.
pub struct Download {
    shared: Arc<Shared>,
    req: Request,
    stat: Stat,
    part: PathBuf,
    journal_path: PathBuf,
    resumed: u64,
    conn: Option<Connection>,
}

fn local(path: &Path, what: &str, e: std::io::Error) -> ClientError {
    failed(format!("{what} {}: {e}", path.display()))
}

/// The hidden names beside `dest`: the partial file and its journal.
pub fn side_names(dest: &Path) -> (PathBuf, PathBuf) {
    let name = dest
        .file_name()
        .map(|n| n.as_encoded_bytes().to_vec())
        .unwrap_or_default();
    let h = ring::digest::digest(&ring::digest::SHA256, &name);
    let tag: String = h.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect();
    let dir = dest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    (
        dir.join(format!(".fatpipe-http-{tag}.part")),
        dir.join(format!(".fatpipe-http-{tag}.journal")),
    )
}

/// Reads a journal: the blocks it records, if its header is `want`.
fn load_journal(path: &Path, want: &Header) -> Option<Vec<bool>> {
    let f = File::open(path).ok()?;
    if f.metadata().ok()?.len() > MAX_JOURNAL {
        return None;
    }
    let mut text = Vec::new();
    f.take(MAX_JOURNAL).read_to_end(&mut text).ok()?;
    let mut lines = text.split_inclusive(|&b| b == b'\n');
    let first = lines.next()?;
    let header: Header = serde_json::from_slice(first.strip_suffix(b"\n")?).ok()?;
    if header != *want {
        return None;
    }
    let n = want.size.div_ceil(want.block);
    let mut done = vec![false; usize::try_from(n).ok()?];
    for line in lines {
        // A torn last record (no newline) is ignored.
        let Some(l) = line.strip_suffix(b"\n") else {
            break;
        };
        let i: u64 = std::str::from_utf8(l).ok()?.parse().ok()?;
        *done.get_mut(usize::try_from(i).ok()?)? = true;
    }
    Some(done)
}

impl Download {
    /// Sends the HEAD and opens the partial file and journal (resuming
    /// one a previous run left when it matches).
    pub fn start(
        req: Request,
        opts: &Options,
        progress: Arc<Progress>,
    ) -> Result<Download, ClientError> {
        let rt = runtime()?;
        let (url, mut stat, conn) = rt.block_on(async {
            let mut conn = connect(&req.url, opts).await?;
            let (url, mut stat) = head(&mut conn, opts).await?;
            if !stat.ranges && stat.size.is_some_and(|s| s > 0) {
                stat.ranges = probe_ranges(&mut conn, &url, opts).await;
            }
            Ok::<_, ClientError>((url, stat, conn))
        })?;
        drop(rt);
        if stat.size.is_none() {
            stat.ranges = false;
        }
        if let Some(n) = stat.size.filter(|&n| n > MAX_SIZE) {
            return Err(failed(format!(
                "{}: the server says the file has {n} bytes, more than the {MAX_SIZE} a download takes",
                url.display()
            )));
        }
        let size = stat.size.unwrap_or(0);
        let ranged = stat.ranges && size > 0;
        let (part, journal_path) = side_names(&req.dest);
        let header = Header {
            v: 1,
            url: url.display(),
            size,
            block: BLOCK,
            etag: stat.etag.clone(),
            modified: stat.modified.clone(),
        };
        let done = if ranged {
            load_journal(&journal_path, &header).filter(|_| part.exists())
        } else {
            None
        };
        let fresh = done.is_none();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(fresh)
            .open(&part)
            .map_err(|e| local(&part, "open", e))?;
        let nblocks = if ranged { size.div_ceil(BLOCK) } else { 1 };
        let done = done.unwrap_or_else(|| vec![false; nblocks as usize]);
        let journal = if ranged {
            let mut j = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .truncate(false)
                .open(&journal_path)
                .map_err(|e| local(&journal_path, "open", e))?;
            if fresh {
                j.set_len(0)
                    .map_err(|e| local(&journal_path, "truncate", e))?;
                let mut line = serde_json::to_vec(&header).map_err(|e| failed(e.to_string()))?;
                line.push(b'\n');
                j.write_all(&line)
                    .map_err(|e| local(&journal_path, "write", e))?;
            }
            Some(Mutex::new(j))
        } else {
            let _ = std::fs::remove_file(&journal_path);
            None
        };
        if size > 0 && fresh {
            file.set_len(size).map_err(|e| local(&part, "size", e))?;
        }
        let mut queue = VecDeque::new();
        let mut resumed = 0;
        for (i, d) in done.iter().enumerate() {
            let i = i as u64;
            if *d {
                resumed += (size - i * BLOCK).min(BLOCK);
            } else if size > 0 || !ranged {
                queue.push_back(i);
            }
        }
        if size == 0 && stat.size == Some(0) {
            queue.clear();
        }
        progress.total_bytes.store(size, Ordering::Relaxed);
        progress.total_files.store(1, Ordering::Relaxed);
        progress.bytes.store(resumed, Ordering::Relaxed);
        let if_range = stat.etag.clone().filter(|e| !e.starts_with("W/"));
        let max = req.max_connections.clamp(1, MAX_CONNECTIONS);
        let shared = Arc::new(Shared {
            url,
            opts: opts.clone(),
            file,
            journal,
            queue: Mutex::new(queue),
            size,
            block: if ranged { BLOCK } else { size },
            ranged,
            if_range,
            progress,
            throttle: Throttle::new(req.bwlimit),
            fatal: Mutex::new(None),
            last_error: Mutex::new(None),
            stop: AtomicBool::new(false),
            live: AtomicU32::new(0),
            peak: AtomicU32::new(0),
            max,
            sockets: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
            done: Mutex::new(if ranged { done } else { Vec::new() }),
            done_cv: Condvar::new(),
            ended: AtomicBool::new(false),
        });
        Ok(Download {
            shared,
            req,
            stat,
            part,
            journal_path,
            resumed,
            conn: Some(conn),
        })
    }

    /// What the server's HEAD said.
    pub fn stat(&self) -> &Stat {
        &self.stat
    }

    /// The round-trip time the HEAD's connection measured.
    pub fn rtt(&self) -> Option<Duration> {
        let c = self.conn.as_ref()?;
        let i = fatpipe_sys::tcp::tcp_info(&c.socket).ok()?;
        i.rtt_us
            .filter(|&r| r > 0)
            .map(|r| Duration::from_micros(u64::from(r)))
    }

    /// Sets the connections to start with.
    pub fn set_connections(&mut self, n: u32) {
        self.req.connections = n.max(1);
    }

    /// Bytes an earlier run had already fetched.
    pub fn resumed(&self) -> u64 {
        self.resumed
    }

    /// Fetches the missing blocks, then verifies and renames. `tune`, if
    /// given, runs on a thread of its own beside the transfer with the
    /// transfer as a [`Steerable`] (the in-flight adjuster).
    pub fn run(mut self, tune: Option<&Tune<'_>>) -> Result<Report, ClientError> {
        let s = &self.shared;
        let pending = lock(&s.queue).len() as u32;
        let first = if s.ranged {
            self.req.connections.clamp(1, s.max).min(pending.max(1))
        } else {
            1
        };
        // The HEAD's connection carries the first worker's requests.
        let conn = self.conn.take();
        if pending > 0 {
            spawn(s, conn);
            for _ in 1..first {
                spawn(s, None);
            }
        }
        let verifier = match self.stat.digests.first() {
            Some(&(algo, _)) if s.ranged => {
                let shared = Arc::clone(s);
                Some(std::thread::spawn(move || follow(&shared, algo)))
            }
            _ => None,
        };
        let t0 = Instant::now();
        let added = Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            if let (Some(tune), true) = (tune, s.ranged && pending > 1) {
                let added = &added;
                scope.spawn(move || {
                    let mut steer = Steer {
                        shared: Arc::clone(s),
                        last: None,
                        t0,
                        added,
                    };
                    tune(&mut steer);
                });
            }
        });
        loop {
            let next = lock(&s.threads).pop();
            match next {
                Some(h) => {
                    let _ = h.join();
                }
                None => break,
            }
        }
        s.ended.store(true, Ordering::SeqCst);
        s.done_cv.notify_all();
        let hashed = verifier.and_then(|v| v.join().ok()).flatten();
        if let Some(e) = lock(&s.fatal).take() {
            return Err(e);
        }
        let left = lock(&s.queue).len();
        if left > 0 || (pending > 0 && s.peak.load(Ordering::Relaxed) == 0) {
            let why = lock(&s.last_error).clone().unwrap_or_default();
            return Err(failed(format!(
                "{}: {left} of {} blocks not fetched ({why}); rerun the same command to resume",
                s.url.display(),
                s.size.div_ceil(s.block.max(1)).max(1),
            )));
        }
        self.finish(added.into_inner().unwrap_or_default(), hashed)
    }

    fn finish(
        self,
        added: Vec<(f64, u32)>,
        hashed: Option<digest::Sums>,
    ) -> Result<Report, ClientError> {
        let s = &self.shared;
        let size_now = s
            .file
            .metadata()
            .map_err(|e| local(&self.part, "stat", e))?
            .len();
        if s.ranged && size_now != s.size {
            return Err(failed(format!(
                "{}: the partial file has {size_now} bytes, not {}",
                self.part.display(),
                s.size
            )));
        }
        let verified = match self.stat.digests.first() {
            Some((algo, want)) => {
                let got = match hashed {
                    Some(sums) => sums,
                    None => digest::compute(&s.file, &[*algo])
                        .map_err(|e| local(&self.part, "read", e))?,
                };
                let got = got.get(*algo).unwrap_or_default().to_vec();
                if got != *want {
                    let _ = std::fs::remove_file(&self.part);
                    let _ = std::fs::remove_file(&self.journal_path);
                    return Err(failed(format!(
                        "{}: checksum mismatch: the server says {}, the received file has {}; it was removed (rerun to fetch it again)",
                        s.url.display(),
                        super::show_digest(*algo, want),
                        super::show_digest(*algo, &got)
                    )));
                }
                Some((*algo, got))
            }
            None => None,
        };
        s.file
            .sync_all()
            .map_err(|e| local(&self.part, "fsync", e))?;
        std::fs::rename(&self.part, &self.req.dest)
            .map_err(|e| local(&self.req.dest, "rename to", e))?;
        let _ = std::fs::remove_file(&self.journal_path);
        if let Some(dir) = self.req.dest.parent().filter(|p| !p.as_os_str().is_empty()) {
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        s.progress.files.store(1, Ordering::Relaxed);
        let total = s.progress.bytes.load(Ordering::Relaxed);
        Ok(Report {
            url: s.url.clone(),
            size: s.size.max(size_now),
            moved: total.saturating_sub(self.resumed),
            resumed: self.resumed,
            connections: s.peak.load(Ordering::Relaxed).max(1),
            block: s.block,
            verified,
            server: self.stat.server.clone(),
            added,
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether a server that did not say `Accept-Ranges: bytes` serves ranges
/// anyway: one `GET` of the first byte.
async fn probe_ranges(conn: &mut Connection, url: &Url, opts: &Options) -> bool {
    let Ok(req) = conn
        .request(Method::GET, &url.path, opts)
        .header(hyper::header::RANGE, "bytes=0-0")
        .body(super::empty())
    else {
        return false;
    };
    let Ok(res) = conn.send(req).await else {
        return false;
    };
    let ok = res.status() == StatusCode::PARTIAL_CONTENT;
    if ok {
        let mut body = res.into_body();
        while let Ok(Some(_)) = next_frame(&mut body, url).await {}
    } else {
        // Whatever else came is not read: this connection is dropped.
        *conn = match connect(url, opts).await {
            Ok(c) => c,
            Err(_) => return false,
        };
    }
    ok
}

fn spawn(s: &Arc<Shared>, conn: Option<Connection>) {
    let live = s.live.fetch_add(1, Ordering::SeqCst) + 1;
    s.peak.fetch_max(live, Ordering::SeqCst);
    let shared = Arc::clone(s);
    let h = std::thread::spawn(move || {
        worker(&shared, conn);
        shared.live.fetch_sub(1, Ordering::SeqCst);
    });
    lock(&s.threads).push(h);
}

fn worker(s: &Arc<Shared>, conn: Option<Connection>) {
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            *lock(&s.last_error) = Some(e.to_string());
            return;
        }
    };
    rt.block_on(async {
        let mut conn = conn;
        if let Some(c) = &conn {
            if let Ok(d) = c.socket.try_clone() {
                lock(&s.sockets).push(d);
            }
        }
        let mut failures = 0;
        while !s.stop.load(Ordering::SeqCst) {
            let Some((b, k)) = take_run(s) else {
                break;
            };
            let c = match conn.as_mut() {
                Some(c) => c,
                None => match connect(&s.url, &s.opts).await {
                    Ok(c) => {
                        if let Ok(d) = c.socket.try_clone() {
                            lock(&s.sockets).push(d);
                        }
                        conn.insert(c)
                    }
                    Err(e) => {
                        give_back(s, b, k);
                        if give_up(s, &mut failures, e) {
                            return;
                        }
                        tokio::time::sleep(backoff(failures)).await;
                        continue;
                    }
                },
            };
            match fetch(s, c, b, k).await {
                Ok(()) => failures = 0,
                Err((e, fetched)) => {
                    conn = None;
                    give_back(s, b + fetched, k - fetched);
                    if give_up(s, &mut failures, e) {
                        return;
                    }
                    tokio::time::sleep(backoff(failures)).await;
                }
            }
        }
    });
}

/// Blocks the verifier hashes between two `fdatasync`s of the partial
/// file (256 MiB).
const SYNC_EVERY: u64 = 32;

/// The verifier: hashes the partial file's blocks in order as they come
/// in (resumed ones first), so the checksum is ready when the last block
/// is, instead of being a second pass over the file after it; and flushes
/// what it has read every [`SYNC_EVERY`] blocks, so the final `fsync` has
/// little left to write. `None` if the download ended without every block
/// (or a read failed: the check after the download then reads the file).
fn follow(s: &Shared, algo: Algo) -> Option<digest::Sums> {
    let n = s.size.div_ceil(s.block.max(1));
    let mut h = digest::Hasher::new(&[algo]);
    let mut buf = vec![0u8; 1 << 20];
    for b in 0..n {
        {
            let mut d = lock(&s.done);
            loop {
                if d.get(usize::try_from(b).ok()?).copied().unwrap_or(false) {
                    break;
                }
                if s.ended.load(Ordering::SeqCst) || s.stop.load(Ordering::SeqCst) {
                    return None;
                }
                d = s
                    .done_cv
                    .wait_timeout(d, Duration::from_millis(200))
                    .map(|(g, _)| g)
                    .unwrap_or_else(|e| e.into_inner().0);
            }
        }
        let start = b * s.block;
        let end = (start + s.block).min(s.size);
        let mut at = start;
        while at < end {
            let want = usize::try_from(end - at)
                .unwrap_or(usize::MAX)
                .min(buf.len());
            match s.file.read_at(&mut buf[..want], at) {
                Ok(0) => return None,
                Ok(got) => {
                    h.update(&buf[..got]);
                    at += got as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
        if (b + 1) % SYNC_EVERY == 0 {
            let _ = s.file.sync_data();
        }
    }
    Some(h.finish())
}

/// The most blocks one ranged `GET` asks for.
const MAX_RUN: u64 = 8;

/// The next blocks to fetch in one request: a run of consecutive missing
/// blocks from the front of the queue. Each request costs its connection
/// a round trip without data (the next `GET` goes out only when the last
/// byte of the answer is in), so while many blocks are left a request
/// asks for several (at most [`MAX_RUN`], and no more than a half share
/// of what is left per open connection, so that the last requests of a
/// download stay one block and end together).
fn take_run(s: &Shared) -> Option<(u64, u64)> {
    let mut q = lock(&s.queue);
    if !s.ranged {
        return q.pop_front().map(|b| (b, 1));
    }
    run_of(&mut q, s.live.load(Ordering::SeqCst))
}

/// [`take_run`]'s choice from the queue `q` with `live` connections open.
fn run_of(q: &mut VecDeque<u64>, live: u32) -> Option<(u64, u64)> {
    let b = q.pop_front()?;
    let live = u64::from(live.max(1));
    let want = ((q.len() as u64 + 1) / (2 * live)).clamp(1, MAX_RUN);
    let mut k = 1;
    while k < want && q.front() == Some(&(b + k)) {
        q.pop_front();
        k += 1;
    }
    Some((b, k))
}

/// Puts blocks `b..b + k` back at the front of the queue, in order.
fn give_back(s: &Shared, b: u64, k: u64) {
    let mut q = lock(&s.queue);
    for i in (b..b + k).rev() {
        q.push_front(i);
    }
}

/// Records block `b` as on disk: the journal's line, and the verifier is
/// told.
fn block_done(s: &Shared, b: u64) -> Result<(), ClientError> {
    if let Some(j) = &s.journal {
        let line = format!("{b}\n");
        lock(j)
            .write_all(line.as_bytes())
            .map_err(|e| fatal(s, failed(format!("journal: {e}"))))?;
    }
    let mut d = lock(&s.done);
    if let Some(slot) = usize::try_from(b).ok().and_then(|i| d.get_mut(i)) {
        *slot = true;
    }
    drop(d);
    s.done_cv.notify_all();
    Ok(())
}

fn backoff(failures: u32) -> Duration {
    Duration::from_millis(200 << failures.min(5))
}

/// Records a failure; true when this connection should stop (a fatal
/// error stops them all).
fn give_up(s: &Shared, failures: &mut u32, e: ClientError) -> bool {
    *failures += 1;
    match e {
        ClientError::Usage(_) => {
            s.stop.store(true, Ordering::SeqCst);
            lock(&s.fatal).get_or_insert(e);
            true
        }
        ClientError::Failed(m) => {
            *lock(&s.last_error) = Some(m);
            *failures > RETRIES
        }
    }
}

/// A fatal failure: the file is not what was asked for.
fn fatal(s: &Shared, e: ClientError) -> ClientError {
    s.stop.store(true, Ordering::SeqCst);
    let line = e.to_string();
    lock(&s.fatal).get_or_insert(e);
    ClientError::Failed(line)
}

/// Fetches blocks `b..b + k` with one `GET`; on failure, how many of them
/// (from `b`) were fetched and journaled before it.
async fn fetch(s: &Shared, c: &mut Connection, b: u64, k: u64) -> Result<(), (ClientError, u64)> {
    let mut fetched = 0;
    fetch_run(s, c, b, k, &mut fetched)
        .await
        .map_err(|e| (e, fetched))
}

async fn fetch_run(
    s: &Shared,
    c: &mut Connection,
    b: u64,
    k: u64,
    fetched: &mut u64,
) -> Result<(), ClientError> {
    let (first, len) = if s.ranged {
        let end = ((b + k) * s.block).min(s.size);
        (b * s.block, end - b * s.block)
    } else {
        (0, s.size)
    };
    // Where (from `first`) each block of the run ends.
    let block_end = |i: u64| ((b + i + 1) * s.block).min(s.size) - first;
    let mut rb = c.request(Method::GET, &s.url.path, &s.opts);
    if s.ranged {
        rb = rb.header(
            hyper::header::RANGE,
            format!("bytes={first}-{}", first + len - 1),
        );
        if let Some(e) = &s.if_range {
            rb = rb.header(hyper::header::IF_RANGE, e);
        }
    }
    let req = rb.body(super::empty()).map_err(|e| failed(e.to_string()))?;
    let res = c.send(req).await?;
    let status = res.status();
    let url = &s.url;
    if s.ranged {
        match status {
            StatusCode::PARTIAL_CONTENT => {
                let cr = res
                    .headers()
                    .get(hyper::header::CONTENT_RANGE)
                    .and_then(|v| parse_content_range(v.as_bytes()));
                if cr != Some((first, first + len - 1, Some(s.size))) && cr != Some((first, first + len - 1, None)) {
                    return Err(fatal(
                        s,
                        failed(format!(
                            "{}: asked for bytes {first}-{} of {}, the server sent another range or size; rerun the same command",
                            url.display(),
                            first + len - 1,
                            s.size
                        )),
                    ));
                }
            }
            StatusCode::OK => {
                return Err(fatal(
                    s,
                    failed(format!(
                        "{}: the file changed on the server during the copy (a ranged GET was answered with the whole file); rerun the same command to start over",
                        url.display()
                    )),
                ))
            }
            StatusCode::RANGE_NOT_SATISFIABLE => {
                return Err(fatal(
                    s,
                    failed(format!(
                        "{}: the file shrank on the server during the copy (416); rerun the same command to start over",
                        url.display()
                    )),
                ))
            }
            st => {
                let why = super::error_text(res.into_body()).await;
                return Err(status_error(url, &Method::GET, st, &why));
            }
        }
    } else if !status.is_success() {
        let why = super::error_text(res.into_body()).await;
        return Err(status_error(url, &Method::GET, status, &why));
    }
    let mut body = res.into_body();
    let mut got = 0u64;
    let result = async {
        while let Some(frame) = next_frame(&mut body, url).await? {
            if s.stop.load(Ordering::Relaxed) {
                return Err(failed("stopped"));
            }
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if s.ranged && got + data.len() as u64 > len {
                return Err(failed(format!(
                    "{}: the server sent more than asked for",
                    url.display()
                )));
            }
            s.file
                .write_all_at(&data, first + got)
                .map_err(|e| fatal(s, failed(format!("write: {e}"))))?;
            got += data.len() as u64;
            s.progress.moved(data.len() as u64);
            s.throttle.take(data.len() as u64);
            // Blocks of a run are journaled as each is complete, so a
            // failure later in the run loses only the block it cut.
            while s.ranged && *fetched < k && got >= block_end(*fetched) {
                block_done(s, b + *fetched)?;
                *fetched += 1;
            }
        }
        if s.ranged && got != len {
            return Err(failed(format!(
                "{}: the body ended after {got} of {len} bytes",
                url.display()
            )));
        }
        Ok(())
    }
    .await;
    if let Err(e) = result {
        let kept = match *fetched {
            0 => 0,
            n => block_end(n - 1),
        };
        s.progress
            .bytes
            .fetch_sub(got.saturating_sub(kept), Ordering::Relaxed);
        return Err(e);
    }
    match &s.journal {
        Some(_) => {}
        None => {
            // One whole-file GET: its length is the size.
            if s.file.metadata().map(|m| m.len()).unwrap_or(0) > got {
                s.file
                    .set_len(got)
                    .map_err(|e| fatal(s, failed(format!("truncate: {e}"))))?;
            }
        }
    }
    Ok(())
}

/// The transfer as the in-flight adjuster sees it.
struct Steer<'a> {
    shared: Arc<Shared>,
    last: Option<(Instant, u64)>,
    t0: Instant,
    added: &'a Mutex<Vec<(f64, u32)>>,
}

impl Steerable for Steer<'_> {
    fn next_sample(&mut self) -> Option<Reading> {
        let s = &self.shared;
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline {
            if s.stop.load(Ordering::SeqCst)
                || lock(&s.queue).is_empty()
                || s.live.load(Ordering::SeqCst) == 0
            {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let now = Instant::now();
        let bytes = s.progress.bytes.load(Ordering::Relaxed);
        let streams = s.live.load(Ordering::SeqCst);
        let Some((then, before)) = self.last.replace((now, bytes)) else {
            return Some(Reading {
                sample: None,
                streams,
                congestion: None,
            });
        };
        let secs = now.duration_since(then).as_secs_f64().max(1e-3);
        // The sender is the server: its retransmits are not seen here; the
        // receiver's RTT estimate stands for the path's.
        let mut rtts = Vec::new();
        for sock in lock(&s.sockets).iter() {
            if let Ok(i) = fatpipe_sys::tcp::tcp_info(sock) {
                if let Some(r) = i.rcv_rtt_us.filter(|&r| r > 0).or(i.rtt_us) {
                    rtts.push(u64::from(r));
                }
            }
        }
        let rtt = if rtts.is_empty() {
            Duration::ZERO
        } else {
            Duration::from_micros(rtts.iter().sum::<u64>() / rtts.len() as u64)
        };
        Some(Reading {
            sample: Some(Sample {
                now: now.duration_since(self.t0),
                throughput: (bytes.saturating_sub(before) as f64 * 8.0 / secs) as u64,
                retransmits: 0,
                rtt,
            }),
            streams,
            congestion: None,
        })
    }

    fn streams(&self) -> u32 {
        self.shared.live.load(Ordering::SeqCst)
    }

    fn add_streams(&mut self, n: u32) -> Result<Added, String> {
        let s = &self.shared;
        let room = s.max.saturating_sub(s.live.load(Ordering::SeqCst));
        let pending = lock(&s.queue).len() as u32;
        let n2 = n.min(room).min(pending);
        for _ in 0..n2 {
            spawn(s, None);
        }
        lock(self.added).push((self.t0.elapsed().as_secs_f64(), n2));
        let mut warnings = Vec::new();
        if n2 < n {
            warnings.push(format!(
                "{n2} of {n} connections added (at most {} per download, {pending} blocks left)",
                s.max
            ));
        }
        Ok(Added {
            streams: n2,
            warnings,
        })
    }

    fn set_congestion(&mut self, _name: &str) -> Result<Vec<String>, String> {
        Err("the sender is the HTTP server: its congestion control is its own".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_journal_is_trusted_only_for_the_same_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("j");
        let h = Header {
            v: 1,
            url: "http://h/x".into(),
            size: 3 * BLOCK - 5,
            block: BLOCK,
            etag: Some("\"abc\"".into()),
            modified: None,
        };
        let mut text = serde_json::to_vec(&h).unwrap();
        text.extend_from_slice(b"\n0\n2\n1");
        std::fs::write(&p, &text).unwrap();
        // The torn last record is ignored.
        assert_eq!(load_journal(&p, &h), Some(vec![true, false, true]));
        let other = Header {
            etag: Some("\"abd\"".into()),
            ..h
        };
        assert_eq!(load_journal(&p, &other), None);
        let h2 = Header {
            v: 1,
            url: "http://h/x".into(),
            size: 3 * BLOCK - 5,
            block: BLOCK,
            etag: Some("\"abc\"".into()),
            modified: None,
        };
        std::fs::write(
            &p,
            [serde_json::to_vec(&h2).unwrap(), b"\n7\n".to_vec()].concat(),
        )
        .unwrap();
        assert_eq!(load_journal(&p, &h2), None, "a block beyond the file");
    }

    #[test]
    fn a_request_asks_for_a_run_of_consecutive_blocks_while_many_are_left() {
        let mut q: VecDeque<u64> = (0..100).collect();
        // 100 left, 4 connections: a run of the most.
        assert_eq!(run_of(&mut q, 4), Some((0, MAX_RUN)));
        // A gap ends a run.
        let mut q: VecDeque<u64> = [3, 4, 5, 9, 10].into_iter().chain(20..60).collect();
        assert_eq!(run_of(&mut q, 1), Some((3, 3)));
        assert_eq!(q.front(), Some(&9));
        // Few left per connection: one block at a time.
        let mut q: VecDeque<u64> = (0..10).collect();
        assert_eq!(run_of(&mut q, 8), Some((0, 1)));
        // 10 left, 2 connections: at most a half share (2 blocks).
        let mut q: VecDeque<u64> = (0..10).collect();
        assert_eq!(run_of(&mut q, 2), Some((0, 2)));
        assert_eq!(run_of(&mut VecDeque::new(), 2), None);
    }

    #[test]
    fn side_names_are_hidden_beside_the_destination() {
        let (p, j) = side_names(Path::new("out/f.bin"));
        assert_eq!(p.parent().unwrap(), Path::new("out"));
        assert!(p
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with(".fatpipe-http-"));
        assert_eq!(p.with_extension("journal"), j);
        let (p, _) = side_names(Path::new("f.bin"));
        assert_eq!(p.parent().unwrap(), Path::new("."));
    }
}
