//! The client's side of a session: the reconnecting driver ([`run_client`]),
//! its local manifest, dialing the data connections and the roles it takes
//! once the server accepted.

use super::*;

/// Runs a copy as the client, reconnecting after drops within the budget.
/// `on_retry` is told about each reconnect (one line).
pub fn run_client(
    link: &dyn Link,
    job: &Job,
    progress: Arc<Progress>,
    on_retry: &dyn Fn(&str),
) -> Result<Report, CopyError> {
    run_client_tuned(link, job, progress, on_retry, None)
}

/// [`run_client`] with an in-flight tuner started beside every session.
pub fn run_client_tuned(
    link: &dyn Link,
    job: &Job,
    progress: Arc<Progress>,
    on_retry: &dyn Fn(&str),
    tuner: Option<&Tuner<'_>>,
) -> Result<Report, CopyError> {
    run_client_prepared(link, job, None, progress, on_retry, tuner)
}

/// [`run_client_tuned`] with the job completed by `prepare` once the first
/// control connection is open (see [`Prepare`]); the report's `elapsed`
/// then starts when `prepare` returns. Reconnects reuse the prepared job.
pub fn run_client_prepared(
    link: &dyn Link,
    job: &Job,
    mut prepare: Option<&mut Prepare<'_>>,
    progress: Arc<Progress>,
    on_retry: &dyn Fn(&str),
    tuner: Option<&Tuner<'_>>,
) -> Result<Report, CopyError> {
    let mut started = Instant::now();
    let mut job = job.clone();
    let local = match job.direction {
        Direction::Push => {
            let (m, into_dir) = local_manifest(&job)?;
            // rsync's rule: contents or several sources need a directory
            // at the destination, which the server learns from a '/'.
            if let Some(dest) = job.remote.first_mut() {
                if into_dir && !dest.is_empty() && !dest.ends_with(b"/") {
                    dest.push(b'/');
                }
            }
            Some(m)
        }
        Direction::Pull => None,
    };
    let mut report = Report::default();
    let mut backoff = Duration::from_millis(200);
    let mut attempt = 0u32;
    loop {
        let session = client_session(
            link,
            &mut job,
            &mut prepare,
            &mut started,
            local.as_ref(),
            Arc::clone(&progress),
            &mut report,
            tuner,
        );
        if session.is_err() {
            // Failed before preparing: what prepares (the probe) may
            // explain why, and a retry must not wait for it again.
            if let Some(p) = prepare.take() {
                p(&mut job)?;
                started = Instant::now();
            }
        }
        match session {
            Ok(()) => {
                if let Some(m) = &local {
                    // Capped as a pull's are, so both directions report alike.
                    report.notes = m.notes_to_send();
                }
                report.reconnects = attempt;
                report.elapsed = started.elapsed();
                return Ok(report);
            }
            // Not a failure: nothing was moved at the size that did not fit.
            Err(CopyError::Rechunk(chunk)) if chunk > job.chunk_size => {
                on_retry(&format!(
                    "the server's manifest has more than {MAX_SESSION_CHUNKS} chunks of {}; asking again with {} chunks",
                    fatpipe_schema::units::format_bytes_iec(u64::from(job.chunk_size)),
                    fatpipe_schema::units::format_bytes_iec(u64::from(chunk)),
                ));
                job.chunk_size = chunk;
            }
            Err(CopyError::Network(why)) if attempt < job.retries => {
                attempt += 1;
                on_retry(&format!(
                    "connection lost ({why}); reconnecting in {} ms (attempt {attempt} of {})",
                    backoff.as_millis(),
                    job.retries
                ));
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(CopyError::Network(why)) => {
                // Say which end is missing: a server never reached, or one
                // that went away (stopped, killed, unreachable) mid-copy.
                let what = if report.marks.connected.is_some() {
                    "the server went away"
                } else {
                    "cannot reach the server"
                };
                return Err(CopyError::Failed(format!(
                    "{what} ({why}); gave up after {attempt} reconnect(s) (re-run the same command to resume)"
                )));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Client: opens the `n` streams the server granted and tells the tuner.
pub(super) fn client_grow(
    n: u16,
    open: &OpenMany<'_>,
    live: &Live,
    pool: &Pool,
) -> Result<Vec<Stream>, CopyError> {
    let tags: Vec<u32> = (0..n).map(|_| live.next_tag()).collect();
    pool.promise(n);
    let opened = open_data(open, &tags).and_then(|v| {
        for s in &v {
            pool.add(s).map_err(net)?;
        }
        Ok(v)
    });
    live.streams_added(match &opened {
        Ok(_) => Ok(n),
        Err(e) => Err(e.to_string()),
    });
    opened
}

/// Dials the data connections `tags` on one thread of `scope` (the
/// session's [`Conn::open_many`], which sets them up at once), each with
/// its data hello, and yields each as it is ready.
pub(super) fn dial_each<'scope, 'env>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    open: &'env OpenMany<'env>,
    tags: &'env [u32],
) -> mpsc::Receiver<Result<Stream, CopyError>> {
    let (tx, rx) = mpsc::channel();
    scope.spawn(move || {
        open(tags, &mut |r| {
            // Nobody takes it once the session is over: it is shut.
            if let Err(mpsc::SendError(r)) = tx.send(r) {
                shut(r);
            }
        });
    });
    rx
}

/// Walks a push's local sources. A source ending in `/` (or `.`, `..`)
/// is its directory's contents (rsync's rule); any other is the item
/// itself under its own name. Also returns whether the destination must
/// be a directory: several sources, or contents.
pub(super) fn local_manifest(job: &Job) -> Result<(Manifest, bool), CopyError> {
    let mut m = Manifest::default();
    let mut into_dir = job.local_sources.len() > 1;
    for src in &job.local_sources {
        let shown = src.display().to_string();
        if is_contents(src) {
            if !job.recursive {
                return Err(CopyError::Usage(format!(
                    "{shown}: is a directory (use -r to copy directories)"
                )));
            }
            into_dir = true;
            let dir = Dir::open(src).map_err(|e| CopyError::Usage(format!("{shown}: {e}")))?;
            m.add_contents(Arc::new(dir))
                .map_err(|e| CopyError::Failed(format!("{shown}: {e}")))?;
            continue;
        }
        let name = src
            .file_name()
            .ok_or_else(|| CopyError::Usage(format!("{shown}: not a usable source")))?
            .as_encoded_bytes()
            .to_vec();
        let parent = match src.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let dir = Dir::open(&parent).map_err(|e| CopyError::Usage(format!("{shown}: {e}")))?;
        let as_name = RelPath::new(&name).map_err(|e| CopyError::Usage(format!("{shown}: {e}")))?;
        m.add(Arc::new(dir), &name, &as_name, job.recursive)
            .map_err(|e| match e {
                WalkError::Io { .. } => CopyError::Failed(e.to_string()),
                other => CopyError::Usage(other.to_string()),
            })?;
    }
    check_unique_tops(&m.entries).map_err(CopyError::Usage)?;
    Ok((m, into_dir))
}

/// True for a local source that names a directory's contents: a trailing
/// `/`, or a last component `.` or `..` (rsync copies `.` as `./`).
pub(super) fn is_contents(src: &Path) -> bool {
    let b = src.as_os_str().as_encoded_bytes();
    b.ends_with(b"/") || b == b"." || b == b".." || b.ends_with(b"/.") || b.ends_with(b"/..")
}

/// True for a pull whose sources need a directory at the destination:
/// several of them, or one naming a directory's contents (the export
/// itself, or a path ending in `/`).
pub(super) fn pull_into_dir(remote: &[Vec<u8>]) -> bool {
    remote.len() > 1 || remote.iter().any(|r| r.is_empty() || r.ends_with(b"/"))
}

/// Connects, opens the control connection and sends its hello.
pub(super) fn client_open(link: &dyn Link) -> Result<(Box<dyn Conn>, Stream), CopyError> {
    let conn = link.connect()?;
    let ctrl = conn.open_greeted(0, &Hello::Control.encode())?;
    // Small messages each awaiting an answer: Nagle would hold one back
    // until the server's delayed ACK of the one before.
    ctrl.set_nodelay(true).map_err(net)?;
    Ok((conn, ctrl))
}

#[allow(clippy::too_many_arguments)]
pub(super) fn client_session(
    link: &dyn Link,
    job: &mut Job,
    prepare: &mut Option<&mut Prepare<'_>>,
    started: &mut Instant,
    local: Option<&Manifest>,
    progress: Arc<Progress>,
    report: &mut Report,
    tuner: Option<&Tuner<'_>>,
) -> Result<(), CopyError> {
    let (mut conn, mut ctrl) = client_open(link)?;
    report.marks.connected.get_or_insert_with(Instant::now);
    if let Some(p) = prepare.take() {
        let waited = Instant::now();
        p(job)?;
        *started = Instant::now();
        if waited.elapsed() > PREPARE_REUSE {
            drop(ctrl);
            (conn, ctrl) = client_open(link)?;
        }
    }
    report.marks.prepared.get_or_insert_with(Instant::now);
    if let (true, Direction::Push, Some(m)) = (job.auto_chunk, job.direction, local) {
        job.chunk_size = fitting_chunk(&m.entries, job.chunk_size);
    }
    report.chunk_size = job.chunk_size;
    let job = &*job;
    write_msg(
        &mut ctrl,
        &Msg::Request(Request {
            version: VERSION,
            direction: job.direction,
            recursive: job.recursive,
            sync: job.sync,
            direct: job.direct,
            algo: job.algo,
            streams: job.streams,
            chunk_size: job.chunk_size,
            bwlimit: job.bwlimit.unwrap_or(0),
            export: job.export.as_bytes().to_vec(),
            paths: job.remote.clone(),
            tuning: job.tuning.clone(),
        }),
    )
    .map_err(net)?;
    // A push's manifest follows at once: the server reads it right after
    // answering, so the needs come back with the answer.
    if let (Direction::Push, Some(m)) = (job.direction, local) {
        send_manifest(&mut ctrl, &m.entries, &m.notes_to_send())?;
    }
    // The server grants what it is asked for within its cap, so the data
    // connections are dialled now, while the request travels; each costs
    // round trips (connect, the engine's cookie check).
    let streams = job.streams.clamp(1, MAX_STREAMS);
    let conn = &*conn;
    // Each data connection's hello follows its opening handshake without
    // waiting for the server's acknowledgement, and so does pushed data:
    // the needs are back by then.
    let push = job.direction == Direction::Push;
    let hello = Hello::Data.encode();
    let open = move |tags: &[u32], ready: &mut dyn FnMut(Result<Stream, CopyError>)| {
        conn.open_many(tags, push, &hello, ready)
    };
    let tags: Vec<u32> = (1..=u32::from(streams)).collect();
    let data_open = std::sync::OnceLock::new();
    std::thread::scope(|scope| {
        let dialed = dial_each(scope, &open, &tags);
        // The server may walk a large tree before answering a pull.
        ctrl.set_read_timeout(Some(Duration::from_secs(600)))
            .map_err(net)?;
        let accept = match read_msg(&mut ctrl).map_err(net)? {
            Msg::Accept(a) => a,
            Msg::Refuse(r) => {
                return Err(match r.class {
                    RefuseClass::Usage => CopyError::Usage(r.message),
                    RefuseClass::Failed => CopyError::Failed(r.message),
                })
            }
            other => return Err(CopyError::Failed(format!("unexpected reply {other:?}"))),
        };
        ctrl.set_read_timeout(None).map_err(net)?;
        if accept.streams != streams {
            return Err(CopyError::Failed(format!(
                "protocol error: asked for {streams} streams, the server granted {}",
                accept.streams
            )));
        }
        report.streams = accept.streams;
        report.remote_io = accept.io.clone();
        report.encryption = ctrl.encryption().cloned();
        report.marks.accepted.get_or_insert_with(Instant::now);
        let first_open = report.marks.data_open.is_none();
        let data_open = &data_open;
        let (mut taken, total) = (0, tags.len());
        let data = DataConns {
            count: streams,
            next: Box::new(move |ended: &AtomicBool| loop {
                // A connection that comes once the session is over is
                // shut: the server may no longer take it and send on it,
                // and its receiver there must not wait for an End.
                if ended.load(Ordering::SeqCst) {
                    while let Ok(r) = dialed.try_recv() {
                        shut(r);
                    }
                    return None;
                }
                match dialed.recv_timeout(LATE_SLICE) {
                    Ok(r) => {
                        taken += 1;
                        if taken == total && first_open {
                            let _ = data_open.set(Instant::now());
                        }
                        return Some(r);
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        return Some(Err(CopyError::Failed("a dialing thread stopped".into())))
                    }
                }
            }),
        };
        let live = Arc::new(Live::new(job.direction, accept));
        let grow = Grow::Client {
            open: &open,
            live: Arc::clone(&live),
        };
        let r = std::thread::scope(|scope| {
            if let Some(t) = tuner {
                let l = &*live;
                scope.spawn(move || t(l));
            }
            let r = client_roles(job, local, progress, report, ctrl, data, &grow);
            live.end();
            r
        });
        report.streams = report.streams.max(live.streams());
        if let Some(&at) = data_open.get() {
            report.marks.data_open = Some(at);
        }
        if r.is_ok() {
            report.marks.done = Some(Instant::now());
        }
        r
    })
}

pub(super) fn client_roles(
    job: &Job,
    local: Option<&Manifest>,
    progress: Arc<Progress>,
    report: &mut Report,
    ctrl: Stream,
    data: DataConns<'_>,
    grow: &Grow<'_>,
) -> Result<(), CopyError> {
    match job.direction {
        Direction::Push => {
            let m = local.ok_or_else(|| CopyError::Failed("no manifest".into()))?;
            report.files_total = m.file_count() as u64;
            report.bytes_total = m.total_bytes();
            progress
                .total_files
                .store(report.files_total, std::sync::atomic::Ordering::Relaxed);
            progress
                .total_bytes
                .store(report.bytes_total, std::sync::atomic::Ordering::Relaxed);
            let src = Arc::new(Source::new(
                m.entries.clone(),
                m.origins.clone(),
                SourceOptions {
                    chunk_size: job.chunk_size,
                    algo: job.algo,
                    sendfile: job.sendfile,
                    bwlimit: job.bwlimit,
                    corrupt_chunk: job.corrupt_chunk,
                },
                progress,
            ));
            let r = run_source(Arc::clone(&src), ctrl, data, grow);
            report.local_io = src.io_path().into();
            merge_failures(&mut report.failures, src.failures());
            let summary = r?;
            report.bytes_moved += summary.bytes_written;
            report.summary = summary;
            Ok(())
        }
        Direction::Pull => {
            let opts = SinkOptions {
                chunk_size: job.chunk_size,
                algo: job.algo,
                sync: job.sync,
                direct: job.direct,
                max_resends: 5,
                window: planned_window(&job.tuning),
                start: planned_start(&job.tuning),
            };
            let dest = job.local_dest.clone();
            let into_dir = pull_into_dir(&job.remote);
            let p2 = Arc::clone(&progress);
            let map = move |entries: &[Entry]| map_local(&dest, into_dir, entries);
            let SinkResult {
                summary,
                failures,
                notes,
            } = run_sink(ctrl, data, opts, p2, &map, grow, job.auto_chunk)?;
            report.notes = notes;
            report.files_total = progress
                .total_files
                .load(std::sync::atomic::Ordering::Relaxed);
            report.bytes_total = progress
                .total_bytes
                .load(std::sync::atomic::Ordering::Relaxed);
            report.local_io = summary.io.clone();
            merge_failures(&mut report.failures, failures);
            report.bytes_moved += summary.bytes_written;
            report.summary = summary;
            Ok(())
        }
    }
}
