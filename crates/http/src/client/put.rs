//! Upload: one `PUT` with `Content-Length` and `Expect: 100-continue` (the
//! body waits for `100 Continue`, or a second, as curl does, so a refusal
//! comes before any byte is sent), its adler32 computed as the file is
//! read, then a `HEAD` with `Want-Digest: adler32` compared with it when
//! the server offers a checksum.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use fatpipe_transfer::Progress;
use http_body_util::BodyExt;
use hyper::body::{Bytes, Frame, SizeHint};
use hyper::{Method, StatusCode};

use super::{
    connect, failed, head, poll_waiting, runtime, status_error, ClientError, Options, Throttle,
    Url, Waiting,
};
use crate::digest::{Algo, Hasher};

/// Bytes read from the file per frame.
const CHUNK: usize = 1 << 20;
/// How long the body waits for `100 Continue` before it is sent anyway.
const EXPECT_WAIT: Duration = Duration::from_secs(1);

/// What to upload where.
#[derive(Debug, Clone)]
pub struct Request {
    /// The local file.
    pub source: PathBuf,
    /// The URL it becomes.
    pub url: Url,
    /// A rate cap, bit/s.
    pub bwlimit: Option<u64>,
}

/// How an upload went.
#[derive(Debug, Clone)]
pub struct Report {
    /// The URL written.
    pub url: Url,
    /// Bytes sent.
    pub size: u64,
    /// The status of the PUT (201 created, 204/200 replaced).
    pub status: u16,
    /// The server's checksum the upload matched, if it offered one.
    pub verified: Option<(Algo, Vec<u8>)>,
    /// The server's `Server` header.
    pub server: Option<String>,
}

struct FileBody {
    file: File,
    left: u64,
    hasher: Arc<Mutex<Option<Hasher>>>,
    progress: Arc<Progress>,
    throttle: Arc<Throttle>,
    gate: Option<Waiting>,
    buf: Vec<u8>,
}

impl hyper::body::Body for FileBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = &mut *self;
        if poll_waiting(&mut this.gate, cx).is_pending() {
            return Poll::Pending;
        }
        if this.left == 0 {
            return Poll::Ready(None);
        }
        let want = (this.left as usize).min(CHUNK);
        this.buf.resize(want, 0);
        // Blocking read on this connection's own thread.
        let n = match this.file.read(&mut this.buf[..want]) {
            Ok(0) => {
                return Poll::Ready(Some(Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the file shrank while it was sent",
                ))))
            }
            Ok(n) => n,
            Err(e) => return Poll::Ready(Some(Err(e))),
        };
        this.left -= n as u64;
        if let Some(h) = this
            .hasher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            h.update(&this.buf[..n]);
        }
        this.progress.moved(n as u64);
        this.throttle.take(n as u64);
        Poll::Ready(Some(Ok(Frame::data(Bytes::copy_from_slice(
            &this.buf[..n],
        )))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}

fn local(path: &Path, what: &str, e: std::io::Error) -> ClientError {
    ClientError::Usage(format!("{what} {}: {e}", path.display()))
}

/// Uploads one file.
pub fn upload(
    req: &Request,
    opts: &Options,
    progress: Arc<Progress>,
) -> Result<Report, ClientError> {
    let file = File::open(&req.source).map_err(|e| local(&req.source, "open", e))?;
    let meta = file.metadata().map_err(|e| local(&req.source, "stat", e))?;
    if !meta.is_file() {
        return Err(ClientError::Usage(format!(
            "{}: not a regular file (directories over HTTP: not yet)",
            req.source.display()
        )));
    }
    let size = meta.len();
    if progress.total_files.load(Ordering::Relaxed) == 0 {
        progress.total_bytes.store(size, Ordering::Relaxed);
        progress.total_files.store(1, Ordering::Relaxed);
    }
    let hasher = Arc::new(Mutex::new(Some(Hasher::new(&[Algo::Adler32]))));
    let rt = runtime()?;
    let url = &req.url;
    rt.block_on(async {
        let mut conn = connect(url, opts).await?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let tx = Mutex::new(Some(tx));
        let gate: Waiting = Box::pin(async move {
            let _ = tokio::time::timeout(EXPECT_WAIT, rx).await;
        });
        let body = FileBody {
            file,
            left: size,
            hasher: Arc::clone(&hasher),
            progress: Arc::clone(&progress),
            throttle: Arc::new(Throttle::new(req.bwlimit)),
            gate: (size > 0).then_some(gate),
            buf: Vec::new(),
        };
        conn.widen_for(size);
        let mut r = conn
            .request(Method::PUT, &url.path, opts)
            .header(hyper::header::CONTENT_LENGTH, size)
            .header(hyper::header::CONTENT_TYPE, "application/octet-stream");
        if size > 0 {
            r = r.header(hyper::header::EXPECT, "100-continue");
        }
        let mut request = r
            .body(body.boxed_unsync())
            .map_err(|e| failed(e.to_string()))?;
        hyper::ext::on_informational(&mut request, move |res| {
            if res.status() == StatusCode::CONTINUE {
                if let Some(tx) = tx.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    let _ = tx.send(());
                }
            }
        });
        let res = conn.send(request).await?;
        let status = res.status();
        if !status.is_success() {
            let why = super::error_text(res.into_body()).await;
            return Err(status_error(url, &Method::PUT, status, &why));
        }
        // Drain the (short) answer so the connection can be reused.
        let mut body = res.into_body();
        while let Ok(Some(_)) = super::next_frame(&mut body, url).await {}
        let sent = hasher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .map(Hasher::finish)
            .and_then(|s| s.get(Algo::Adler32).map(<[u8]>::to_vec))
            .unwrap_or_default();
        progress.files.fetch_add(1, Ordering::Relaxed);
        // Verify: the size, and the server's checksum when it has one.
        let (_, stat) = head(&mut conn, opts).await?;
        if let Some(n) = stat.size.filter(|&n| n != size) {
            return Err(failed(format!(
                "{}: the server has {n} bytes after the upload, not {size}",
                url.display()
            )));
        }
        let verified = match stat.digests.iter().find(|(a, _)| *a == Algo::Adler32) {
            Some((a, theirs)) if *theirs != sent => {
                return Err(failed(format!(
                    "{}: checksum mismatch after the upload: the server has {}, the file sent {}",
                    url.display(),
                    super::show_digest(*a, theirs),
                    super::show_digest(*a, &sent)
                )))
            }
            Some((a, theirs)) => Some((*a, theirs.clone())),
            None => None,
        };
        Ok(Report {
            url: url.clone(),
            size,
            status: status.as_u16(),
            verified,
            server: stat.server,
        })
    })
}

/// How a tree upload went.
#[derive(Debug, Clone, Default)]
pub struct TreeReport {
    /// Regular files found.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Files uploaded and matched by the server's checksum.
    pub verified: u64,
    /// Collections created (MKCOL 201).
    pub created: u64,
    /// Objects left out: symlinks and special files (`path (what)`).
    pub skipped: Vec<String>,
    /// The server's `Server` header.
    pub server: Option<String>,
    /// Files not sent because the server has them already (same path and
    /// size: a rerun resumes), and their bytes.
    pub present: u64,
    /// Bytes of the files in [`TreeReport::present`].
    pub present_bytes: u64,
}

/// Creates a collection; one that exists already (405) is fine.
pub fn mkcol(url: &Url, opts: &Options) -> Result<bool, ClientError> {
    let rt = runtime()?;
    rt.block_on(async {
        let mut conn = connect(url, opts).await?;
        let req = conn
            .request(
                Method::from_bytes(b"MKCOL").map_err(|e| failed(e.to_string()))?,
                &url.path,
                opts,
            )
            .body(super::empty())
            .map_err(|e| failed(e.to_string()))?;
        let res = conn.send(req).await?;
        match res.status() {
            StatusCode::CREATED => Ok(true),
            StatusCode::METHOD_NOT_ALLOWED => Ok(false),
            st => {
                let why = super::error_text(res.into_body()).await;
                Err(status_error(
                    url,
                    &Method::from_bytes(b"MKCOL").unwrap_or(Method::PUT),
                    st,
                    &why,
                ))
            }
        }
    })
}

/// Uploads the directory `root` into the collection `url` (rsync's rule:
/// `contents` puts what is in `root` there, else `root` itself goes
/// inside), one MKCOL per directory and one verified PUT per file, in
/// name order. Symlinks and special files are left out and listed.
pub fn upload_tree(
    root: &Path,
    url: &Url,
    contents: bool,
    bwlimit: Option<u64>,
    opts: &Options,
    progress: Arc<Progress>,
) -> Result<TreeReport, ClientError> {
    if url.path.contains('?') {
        return Err(ClientError::Usage(format!(
            "{}: a tree goes to a collection URL without a query",
            url.display()
        )));
    }
    let mut base = url.clone();
    if !base.is_dir() {
        base.path.push('/');
    }
    let mut out = TreeReport::default();
    // The walk first, for the totals the progress bar shows.
    let mut dirs: Vec<Vec<Vec<u8>>> = Vec::new();
    let mut files: Vec<(PathBuf, Vec<Vec<u8>>)> = Vec::new();
    let start: Vec<Vec<u8>> = if contents {
        Vec::new()
    } else {
        let name = root
            .file_name()
            .ok_or_else(|| ClientError::Usage(format!("{}: no directory name", root.display())))?;
        vec![name.as_encoded_bytes().to_vec()]
    };
    if !start.is_empty() {
        dirs.push(start.clone());
    }
    walk(root, &start, &mut dirs, &mut files, &mut out)?;
    progress.total_files.store(out.files, Ordering::Relaxed);
    progress.total_bytes.store(out.bytes, Ordering::Relaxed);
    let at = |rel: &[Vec<u8>], dir: bool| {
        let mut u = base.clone();
        for (i, seg) in rel.iter().enumerate() {
            u = u.join(seg);
            if dir || i + 1 < rel.len() {
                u.path.push('/');
            }
        }
        u
    };
    // What the server has already (a rerun): files by path below the
    // tree's collection, with their sizes. A server that cannot list
    // (no PROPFIND, or no collection yet) has nothing.
    let there: std::collections::HashMap<Vec<Vec<u8>>, u64> =
        super::list::walk(&at(&start, true), opts)
            .map(|entries| {
                entries
                    .into_iter()
                    .filter(|e| !e.dir)
                    .filter_map(|e| e.size.map(|s| (e.rel, s)))
                    .collect()
            })
            .unwrap_or_default();
    for d in &dirs {
        if mkcol(&at(d, true), opts)? {
            out.created += 1;
        }
    }
    for (path, rel) in &files {
        let size = std::fs::metadata(path).map(|m| m.len()).ok();
        let below = rel.get(start.len()..).unwrap_or_default();
        if size.is_some() && there.get(below).copied() == size {
            let n = size.unwrap_or(0);
            out.present += 1;
            out.present_bytes += n;
            progress.bytes.fetch_add(n, Ordering::Relaxed);
            progress.files.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let r = upload(
            &Request {
                source: path.clone(),
                url: at(rel, false),
                bwlimit,
            },
            opts,
            Arc::clone(&progress),
        )?;
        if r.verified.is_some() {
            out.verified += 1;
        }
        out.server = r.server;
    }
    Ok(out)
}

fn walk(
    dir: &Path,
    rel: &[Vec<u8>],
    dirs: &mut Vec<Vec<Vec<u8>>>,
    files: &mut Vec<(PathBuf, Vec<Vec<u8>>)>,
    out: &mut TreeReport,
) -> Result<(), ClientError> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| local(dir, "read", e))?
        .collect::<Result<_, _>>()
        .map_err(|e| local(dir, "read", e))?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().as_encoded_bytes().to_vec();
        let path = e.path();
        let mut r = rel.to_vec();
        r.push(name);
        let ft = e.file_type().map_err(|er| local(&path, "stat", er))?;
        if ft.is_dir() {
            dirs.push(r.clone());
            walk(&path, &r, dirs, files, out)?;
        } else if ft.is_file() {
            out.files += 1;
            out.bytes += e.metadata().map_err(|er| local(&path, "stat", er))?.len();
            files.push((path, r));
        } else {
            let what = if ft.is_symlink() {
                "symlink"
            } else {
                "special file"
            };
            out.skipped.push(format!("{} ({what})", path.display()));
        }
    }
    Ok(())
}
