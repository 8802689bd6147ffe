//! The sink role ([`run_sink`]): whoever stores the files takes the manifest,
//! answers with what it needs and writes what arrives, a receiver per data
//! connection; the manifest's bounds.

use super::*;

pub(super) fn spawn_receiver(sink: &Arc<Sink>, pool: &Arc<Pool>, s: Stream) -> StreamTask {
    keepalive(s.tcp());
    let (sk, pool2) = (Arc::clone(sink), Arc::clone(pool));
    StreamTask::start(
        |end| crate::sink::task::spawn(Arc::clone(sink), s, usize::from(pool.streams()), end),
        move |r| {
            if let Err(e) = r {
                if !sk.finished() {
                    sk.abort(format!("data connection: {e}"));
                    pool2.all();
                }
            }
        },
    )
}

pub(super) enum SinkEvent {
    /// More streams: asked for (server) or granted (client).
    Grow(u16),
    /// The sink is complete or aborted.
    Finished(Result<Summary, String>),
}

/// Maps the manifest to a destination directory (and an optional new name
/// for its single top-level item).
pub type MapDest<'a> = dyn Fn(&[Entry]) -> Result<(Dir, Option<Vec<u8>>), CopyError> + 'a;

/// What a receiving session ends with.
#[derive(Debug)]
pub struct SinkResult {
    /// The receiver's counters.
    pub summary: Summary,
    /// Files that failed, one line each.
    pub failures: Vec<Failure>,
    /// What the sender's walk skipped or changed.
    pub notes: Vec<Note>,
}

/// Takes the manifest, plans, sends the needs, then takes the data
/// connections and receives until complete, reports `Done`.
///
/// `chunk_may_grow`: the receiving client of a pull whose chunk auto-tuning
/// chose; a manifest past [`MAX_SESSION_CHUNKS`] at `opts.chunk_size` then
/// ends the session with [`CopyError::Rechunk`] instead of a refusal.
pub fn run_sink(
    mut ctrl: Stream,
    mut data: DataConns<'_>,
    opts: SinkOptions,
    progress: Arc<Progress>,
    map: &MapDest<'_>,
    grow: &Grow<'_>,
    chunk_may_grow: bool,
) -> Result<SinkResult, CopyError> {
    let mut entries = Vec::new();
    let mut notes = Vec::new();
    let mut bytes = 0usize;
    loop {
        match read_msg(&mut ctrl).map_err(net)? {
            Msg::Notes(n) => {
                if notes.len() + n.len() > MAX_NOTES + 1 {
                    return Err(CopyError::Failed(format!(
                        "more than {MAX_NOTES} notes from the sender"
                    )));
                }
                notes.extend(n)
            }
            Msg::Entries(e) => {
                if entries.len() + e.len() > MAX_ENTRIES {
                    return Err(CopyError::Failed(format!(
                        "more than {MAX_ENTRIES} entries"
                    )));
                }
                bytes = add_manifest_cost(bytes, &e)?;
                entries.extend(e)
            }
            Msg::EntriesEnd { count } if count as usize == entries.len() => break,
            other => {
                return Err(CopyError::Failed(format!(
                    "bad manifest from sender: {other:?}"
                )))
            }
        }
    }
    // The receiver keeps a flag per chunk of every file: a manifest naming
    // a 2^60-byte file must not make it allocate gigabytes.
    if let Err(refused) = check_session_chunks(&entries, opts.chunk_size) {
        let fit = Some(fitting_chunk(&entries, opts.chunk_size))
            .filter(|&c| chunk_may_grow && c > opts.chunk_size)
            .filter(|&c| check_session_chunks(&entries, c).is_ok());
        let e = fit.map_or(refused, CopyError::Rechunk);
        let _ = write_msg(
            &mut ctrl,
            &Msg::Abort {
                message: e.to_string(),
            },
        );
        return Err(e);
    }
    let (base, rename) = match map(&entries) {
        Ok(x) => x,
        Err(e) => {
            let _ = write_msg(
                &mut ctrl,
                &Msg::Abort {
                    message: e.to_string(),
                },
            );
            return Err(e);
        }
    };
    if let Some(name) = rename {
        entries = rename_top(entries, &name)?;
    }
    progress.total_files.store(
        entries
            .iter()
            .filter(|e| matches!(e.kind, EntryKind::File { .. }))
            .count() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
    progress.total_bytes.store(
        entries
            .iter()
            .map(|e| match e.kind {
                EntryKind::File { size, .. } => size,
                _ => 0,
            })
            .sum(),
        std::sync::atomic::Ordering::Relaxed,
    );
    let (sink, needs) = Sink::prepare(base, entries, opts, progress)
        .map_err(|e| CopyError::Failed(e.to_string()))?;
    let sink = Arc::new(sink);
    // Failures found while planning go to the sender before the needs.
    ctrl.set_write_timeout(Some(CONTROL_WRITE_TIMEOUT))
        .map_err(net)?;
    sink.set_control(ctrl.try_clone().map_err(net)?);
    {
        let mut w = io::BufWriter::with_capacity(1 << 20, &mut ctrl);
        for msg in need_messages(needs) {
            write_msg(&mut w, &msg).map_err(net)?;
        }
        write_msg(&mut w, &Msg::NeedEnd).map_err(net)?;
        w.flush().map_err(net)?;
    }
    let first = data.first()?;
    let pool = Arc::new(Pool::new(&ctrl, std::slice::from_ref(&first), data.count).map_err(net)?);
    if let Grow::Client { live, .. } = grow {
        live.attach(Arc::clone(&pool), Arc::clone(&sink) as Arc<dyn CtrlSend>);
    }
    let threads = Mutex::new(vec![spawn_receiver(&sink, &pool, first)]);
    let ended = AtomicBool::new(false);
    let looped = std::thread::scope(|scope| {
        scope.spawn(|| {
            data.feed_late(
                &ended,
                |s| {
                    pool.add(&s)?;
                    lock(&threads).push(spawn_receiver(&sink, &pool, s));
                    Ok(())
                },
                |e| {
                    sink.abort(format!("data connection: {e}"));
                    pool.all();
                },
            )
        });
        // `Done` goes out before the late connections are given up (the
        // client shuts those that come after): the sender must know the
        // copy is complete before it sees one close.
        let looped = sink_loop(&sink, &pool, &ctrl, grow, &threads).map(|(result, reader)| {
            let sent = result.map(|summary| {
                let sent = sink.send_done(&summary);
                (summary, sent)
            });
            (sent, reader)
        });
        ended.store(true, Ordering::SeqCst);
        looped
    });
    let threads = threads.into_inner().unwrap_or_else(|p| p.into_inner());
    let (result, reader) = match looped {
        Ok(r) => r,
        Err(e) => {
            pool.all();
            for t in threads {
                let _ = t.join();
            }
            return Err(e);
        }
    };
    match result {
        Ok((summary, sent)) => {
            // Each stream's End follows its last chunk, which has come: the
            // receivers end at once, unless the sender keeps a connection
            // open without its End, which must not hold a thread forever.
            join_within(threads, END_GRACE, || pool.all());
            pool.all();
            let _ = reader.join();
            sent.map_err(net)?;
            Ok(SinkResult {
                summary,
                failures: sink.failures(),
                notes,
            })
        }
        Err(why) => {
            pool.all();
            for t in threads {
                let _ = t.join();
            }
            let _ = reader.join();
            Err(CopyError::Network(why))
        }
    }
}

/// Joins `threads`, calling `give_up` (which must make them return) if any
/// is still running after `grace`.
pub(super) fn join_within<T: Joinable>(threads: Vec<T>, grace: Duration, give_up: impl FnOnce()) {
    let until = Instant::now() + grace;
    while !threads.iter().all(|t| t.is_finished()) {
        if Instant::now() >= until {
            give_up();
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for t in threads {
        t.join_quietly();
    }
}

/// Something that ends on its own, to be waited for ([`join_within`]).
pub(super) trait Joinable {
    fn is_finished(&self) -> bool;
    fn join_quietly(self);
}

impl Joinable for StreamTask {
    fn is_finished(&self) -> bool {
        StreamTask::is_finished(self)
    }
    fn join_quietly(self) {
        let _ = self.join();
    }
}

impl Joinable for JoinHandle<()> {
    fn is_finished(&self) -> bool {
        JoinHandle::is_finished(self)
    }
    fn join_quietly(self) {
        let _ = self.join();
    }
}

/// The sink's control loop: reads the sender's messages on a thread of
/// its own, grows on request, and waits until the sink is complete or
/// aborted. Returns how it ended and the reader, to be joined once the
/// connections are shut.
#[allow(clippy::type_complexity)]
pub(super) fn sink_loop(
    sink: &Arc<Sink>,
    pool: &Arc<Pool>,
    ctrl: &Stream,
    grow: &Grow<'_>,
    threads: &Mutex<Vec<StreamTask>>,
) -> Result<(Result<Summary, String>, JoinHandle<()>), CopyError> {
    let live = match grow {
        Grow::Client { live, .. } => Some(Arc::clone(live)),
        Grow::Server { .. } => None,
    };
    keepalive(ctrl.tcp());
    let (tx, rx) = mpsc::channel();
    let reader = {
        let sk = Arc::clone(sink);
        let mut c = ctrl.try_clone().map_err(net)?;
        let td = Arc::clone(pool);
        let tx = tx.clone();
        std::thread::spawn(move || loop {
            let stop = |why: String| {
                sk.abort(why);
                td.all();
            };
            match (read_msg(&mut c), &live) {
                (Ok(Msg::FileFailed { file, message }), _) => sk.remote_failure(file, message),
                (Ok(Msg::Abort { message }), _) => {
                    return stop(format!("sender aborted: {message}"));
                }
                // The server is asked for streams; the client is granted them.
                (Ok(Msg::AddStreams { n }), None) | (Ok(Msg::StreamsAdded { n }), Some(_)) => {
                    if tx.send(SinkEvent::Grow(n)).is_err() {
                        return;
                    }
                }
                (Ok(Msg::Stats(st)), Some(l)) => l.set_remote(st),
                (Ok(other), _) => {
                    return stop(format!("unexpected message from sender: {other:?}"));
                }
                (Err(e), _) => {
                    if !sk.finished() {
                        stop(format!("control connection: {e}"));
                    }
                    return;
                }
            }
        })
    };
    let waiter = {
        let sk = Arc::clone(sink);
        std::thread::spawn(move || {
            let _ = tx.send(SinkEvent::Finished(sk.wait()));
        })
    };
    let result = loop {
        match rx.recv() {
            Ok(SinkEvent::Finished(r)) => break r,
            Ok(SinkEvent::Grow(n)) => {
                let added = match grow {
                    Grow::Server { accept, max } => server_grow(n, *max, *accept, pool, &**sink),
                    Grow::Client { open, live } => client_grow(n, *open, live, pool),
                };
                match added {
                    Ok(new) => {
                        lock(threads).extend(new.into_iter().map(|s| spawn_receiver(sink, pool, s)))
                    }
                    Err(e) => {
                        sink.abort(format!("adding streams: {e}"));
                        pool.all();
                    }
                }
            }
            Err(_) => break Err("the session's waiter stopped".into()),
        }
    };
    let _ = waiter.join();
    if let (Ok(_), Grow::Client { open, live }) = (&result, grow) {
        // Finished while asking for streams: the server may already have
        // granted them and be waiting for them (not reading our Done), so
        // open what it grants; they only carry its End.
        let end = Instant::now() + SETUP_TIMEOUT;
        while live.asking() && Instant::now() < end {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(SinkEvent::Grow(n)) => {
                    if let Ok(new) = client_grow(n, *open, live, pool) {
                        lock(threads)
                            .extend(new.into_iter().map(|s| spawn_receiver(sink, pool, s)));
                    }
                    break;
                }
                Ok(SinkEvent::Finished(_)) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
    }
    Ok((result, reader))
}

/// Adds a batch of received entries to the manifest's running cost
/// ([`entry_cost`]); refuses, with one line, past [`MAX_MANIFEST_BYTES`].
pub(super) fn add_manifest_cost(bytes: usize, batch: &[Entry]) -> Result<usize, CopyError> {
    let bytes = batch
        .iter()
        .map(entry_cost)
        .fold(bytes, usize::saturating_add);
    if bytes > MAX_MANIFEST_BYTES {
        return Err(CopyError::Failed(format!(
            "the manifest is larger than {} MiB (the receiver's bound)",
            MAX_MANIFEST_BYTES >> 20
        )));
    }
    Ok(bytes)
}

/// Checks the chunks over every file a received manifest declares against
/// [`MAX_SESSION_CHUNKS`] (the receiver keeps a flag per chunk: a manifest
/// naming a 2^60-byte file must not make it allocate gigabytes); the
/// count, or the one-line refusal.
pub(super) fn check_session_chunks(entries: &[Entry], chunk_size: u32) -> Result<u64, CopyError> {
    let chunks = entries
        .iter()
        .map(|e| match e.kind {
            EntryKind::File { size, .. } => crate::plan::chunk_count(size, chunk_size),
            _ => 0,
        })
        .fold(0u64, u64::saturating_add);
    if chunks > MAX_SESSION_CHUNKS {
        return Err(CopyError::Failed(format!(
            "the manifest holds {chunks} chunks, more than the receiver's bound of \
             {MAX_SESSION_CHUNKS} (at {} per chunk); use larger chunks or copy less at once",
            fatpipe_schema::units::format_bytes_iec(u64::from(chunk_size))
        )));
    }
    Ok(chunks)
}

/// `chunk`, doubled until the files of `entries` make at most
/// [`MAX_SESSION_CHUNKS`] chunks, within [`CHUNK_LIMITS`].
pub(super) fn fitting_chunk(entries: &[Entry], chunk: u32) -> u32 {
    let sizes: Vec<u64> = entries
        .iter()
        .filter_map(|e| match e.kind {
            EntryKind::File { size, .. } => Some(size),
            _ => None,
        })
        .collect();
    crate::plan::chunk_to_fit(&sizes, chunk, MAX_SESSION_CHUNKS, CHUNK_LIMITS.1)
}
