//! The client side of a third-party copy, as gfal-copy does it: `fatpipe
//! copy URL URL` asks the destination to pull (`COPY` with `Source:`, the
//! default) or the source to push (`COPY` with `Destination:`), follows
//! the performance markers ([`markers::Parser`], size-capped) as the
//! copy's progress, and afterwards compares the destination's checksum
//! with the source's (`HEAD` with `Want-Digest: adler32` on both).
//!
//! The one token (`--token`, `BEARER_TOKEN`) goes to both ends: as
//! `Authorization` to the active one, as `TransferHeaderAuthorization` to
//! be forwarded to the passive one.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use fatpipe_transfer::Progress;
use hyper::header::{self, HeaderValue};
use hyper::{Method, StatusCode};

use super::markers::{End, Parser};
use crate::client::{self, ClientError, Options, Url};
use crate::digest::Algo;

/// How long the active end may stay silent (no marker) before the copy
/// is given up: markers come at least every 5 s (XRootD, fatpipe); the
/// WLCG text asks for under 30 s.
pub const MARKER_TIMEOUT: Duration = Duration::from_secs(120);

/// Which end does the copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// The destination pulls from the source.
    Pull,
    /// The source pushes to the destination.
    Push,
}

/// What to copy.
#[derive(Debug, Clone)]
pub struct Request {
    /// The file to copy.
    pub source: Url,
    /// Where it goes.
    pub dest: Url,
    /// Pull or push.
    pub way: Way,
    /// `X-Number-Of-Streams` (0: the active end chooses).
    pub streams: u32,
    /// `RequireChecksumVerification` sent to the active end.
    pub verify: bool,
}

/// How it went.
#[derive(Debug, Clone)]
pub struct Report {
    /// The source's size (its HEAD), or the bytes the markers counted.
    pub size: u64,
    /// The checksum both ends agree on, when both offered one.
    pub verified: Option<(Algo, Vec<u8>)>,
    /// The active end's `Server` header.
    pub server: Option<String>,
    /// The status of the COPY (201 or 202).
    pub status: u16,
    /// Markers received.
    pub markers: u64,
    /// The last marker's `RemoteConnections`.
    pub remote: Vec<String>,
}

fn failed(m: impl Into<String>) -> ClientError {
    ClientError::Failed(m.into())
}

/// Runs a third-party copy; `progress` follows the markers.
pub fn copy(req: &Request, opts: &Options, progress: Arc<Progress>) -> Result<Report, ClientError> {
    let rt = client::runtime()?;
    rt.block_on(async {
        let mut sconn = client::connect(&req.source, opts).await?;
        let (_, sstat) = client::head(&mut sconn, opts).await?;
        drop(sconn);
        if let Some(n) = sstat.size {
            progress.total_bytes.store(n, Ordering::Relaxed);
        }
        progress.total_files.store(1, Ordering::Relaxed);
        let (active, other, field) = match req.way {
            Way::Pull => (&req.dest, &req.source, "source"),
            Way::Push => (&req.source, &req.dest, "destination"),
        };
        let mut url = active.clone();
        let mut conn = client::connect(&url, opts).await?;
        let mut res = None;
        for _ in 0..=client::MAX_REDIRECTS {
            if url.host != conn.url.host || url.port != conn.url.port || url.tls != conn.url.tls {
                conn = client::connect(&url, opts).await?;
            }
            let mut rb = conn
                .request(Method::from_bytes(b"COPY").map_err(|e| failed(e.to_string()))?, &url.path, opts)
                .header(field, other.display())
                .header("credential", "none")
                .header("x-number-of-streams", req.streams.to_string())
                .header(
                    "requirechecksumverification",
                    if req.verify { "true" } else { "false" },
                );
            if let Some(t) = &opts.token {
                rb = rb.header("transferheaderauthorization", format!("Bearer {t}"));
            }
            let r = conn
                .send(rb.body(client::empty()).map_err(|e| failed(e.to_string()))?)
                .await?;
            if r.status().is_redirection() {
                let loc = r
                    .headers()
                    .get(header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .ok_or_else(|| failed(format!("COPY {}: {} without Location", url.display(), r.status())))?;
                url = if loc.starts_with('/') {
                    Url {
                        path: loc.to_string(),
                        ..url.clone()
                    }
                } else {
                    Url::parse(loc).map_err(|e| failed(format!("redirect to {e}")))?
                };
                continue;
            }
            res = Some(r);
            break;
        }
        let res = res.ok_or_else(|| failed(format!("COPY {}: too many redirects", active.display())))?;
        let status = res.status();
        let server = res
            .headers()
            .get(header::SERVER)
            .and_then(|v: &HeaderValue| v.to_str().ok())
            .map(|s| s.chars().take(200).collect());
        if !status.is_success() {
            let why = client::error_text(res.into_body()).await;
            return Err(match status {
                StatusCode::BAD_REQUEST | StatusCode::METHOD_NOT_ALLOWED | StatusCode::NOT_IMPLEMENTED => {
                    ClientError::Usage(format!(
                        "COPY {}: {status}: {why} (the server does not do this third-party copy; try --tpc {})",
                        url.display(),
                        if req.way == Way::Pull { "push" } else { "pull" }
                    ))
                }
                _ => client::status_error(&url, &Method::from_bytes(b"COPY").unwrap_or(Method::POST), status, &why),
            });
        }
        let mut body = res.into_body();
        let mut parser = Parser::new();
        loop {
            let frame = match tokio::time::timeout(MARKER_TIMEOUT, http_body_util::BodyExt::frame(&mut body)).await {
                Err(_) => {
                    return Err(failed(format!(
                        "COPY {}: no performance marker for {} s",
                        url.display(),
                        MARKER_TIMEOUT.as_secs()
                    )))
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => return Err(failed(format!("COPY {}: {e}", url.display()))),
                Ok(Some(Ok(f))) => f,
            };
            if let Some(d) = frame.data_ref() {
                parser.feed(d);
                let now = parser.progress.bytes;
                let before = progress.bytes.load(Ordering::Relaxed);
                if now > before {
                    progress.moved(now - before);
                }
                if parser.end.is_some() {
                    break;
                }
            }
        }
        parser.finish();
        match parser.end.clone() {
            Some(End::Success) => {}
            Some(End::Failure(line)) => {
                return Err(failed(format!("COPY {}: {line}", url.display())))
            }
            Some(End::Aborted) => return Err(failed(format!("COPY {}: aborted", url.display()))),
            None => {
                return Err(failed(format!(
                    "COPY {}: the answer ended without success or failure: the copy's outcome is unknown",
                    url.display()
                )))
            }
        }
        // Verify, as gfal-copy does: the destination's checksum and size
        // against the source's.
        let mut dconn = client::connect(&req.dest, opts).await?;
        let (_, dstat) = client::head(&mut dconn, opts).await?;
        if let (Some(a), Some(b)) = (sstat.size, dstat.size) {
            if a != b {
                return Err(failed(format!(
                    "{}: {b} bytes after the copy, the source has {a}",
                    req.dest.display()
                )));
            }
        }
        let mut verified = None;
        for (algo, theirs) in &dstat.digests {
            if let Some((_, ours)) = sstat.digests.iter().find(|(a, _)| a == algo) {
                if ours != theirs {
                    return Err(failed(format!(
                        "checksum mismatch after the copy: the source has {}, the destination {}",
                        client::show_digest(*algo, ours),
                        client::show_digest(*algo, theirs)
                    )));
                }
                verified = Some((*algo, ours.clone()));
                break;
            }
        }
        let size = sstat.size.or(dstat.size).unwrap_or(parser.progress.bytes);
        let before = progress.bytes.load(Ordering::Relaxed);
        if size > before {
            progress.moved(size - before);
        }
        progress.files.store(1, Ordering::Relaxed);
        Ok(Report {
            size,
            verified,
            server,
            status: status.as_u16(),
            markers: parser.progress.markers,
            remote: parser.progress.remote.clone(),
        })
    })
}
