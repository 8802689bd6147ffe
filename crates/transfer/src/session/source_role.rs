//! The source role ([`run_source`]): whoever has the files sends the manifest
//! and then the chunks the sink needs, a sender per data connection.

use super::*;

/// Takes the needs for the manifest the caller sent ([`send_manifest`]:
/// a pushing client right behind its request, a pulling server behind its
/// answer), then the data connections, and streams until the receiver is
/// done. Streams added mid-session (`grow`) pull from the same queue.
pub fn run_source(
    src: Arc<Source>,
    mut ctrl: Stream,
    mut data: DataConns<'_>,
    grow: &Grow<'_>,
) -> Result<Summary, CopyError> {
    let mut needs = Vec::new();
    loop {
        match read_msg(&mut ctrl).map_err(net)? {
            Msg::Need(n) => needs.extend(n),
            Msg::NeedEnd => break,
            Msg::FileFailed { file, message } => {
                let _ = src.handle(Msg::FileFailed { file, message });
            }
            Msg::Abort { message } => {
                return Err(CopyError::Failed(format!("receiver: {message}")))
            }
            other => return Err(CopyError::Failed(format!("expected needs, got {other:?}"))),
        }
    }
    let first = data.first()?;
    src.plan(&needs);
    src.account_done_before(&needs);
    ctrl.set_write_timeout(Some(CONTROL_WRITE_TIMEOUT))
        .map_err(net)?;
    src.set_control(ctrl.try_clone().map_err(net)?);
    let pool = Arc::new(Pool::new(&ctrl, std::slice::from_ref(&first), data.count).map_err(net)?);
    if let Grow::Client { live, .. } = grow {
        live.attach(Arc::clone(&pool), Arc::clone(&src) as Arc<dyn CtrlSend>);
    }
    let threads = Mutex::new(vec![spawn_sender(&src, &pool, first)]);
    let (ended, late_err) = (AtomicBool::new(false), Mutex::new(None));
    let outcome = std::thread::scope(|scope| {
        scope.spawn(|| {
            data.feed_late(
                &ended,
                |s| {
                    pool.add(&s)?;
                    lock(&threads).push(spawn_sender(&src, &pool, s));
                    Ok(())
                },
                |e| {
                    *lock(&late_err) = Some(e);
                    src.stop();
                    pool.all();
                },
            )
        });
        let outcome = source_loop(&src, &pool, &mut ctrl, grow, &threads);
        ended.store(true, Ordering::SeqCst);
        outcome
    });
    let outcome = match lock(&late_err).take() {
        Some(e) => Err(e),
        None => outcome,
    };
    if outcome.is_err() {
        src.stop();
        pool.all();
    }
    let mut send_err = None;
    for t in threads.into_inner().unwrap_or_else(|p| p.into_inner()) {
        if let Err(e) = t.join() {
            send_err.get_or_insert(e);
        }
    }
    outcome?;
    let _ = ctrl.shutdown(Shutdown::Both);
    src.done().ok_or_else(|| {
        CopyError::Network(send_err.map_or("session ended early".into(), |e| e.to_string()))
    })
}

/// The source's control loop: reports its counters (a sending server),
/// grows on request, and hands the receiver's messages to `src` until it
/// is done.
pub(super) fn source_loop(
    src: &Arc<Source>,
    pool: &Arc<Pool>,
    ctrl: &mut Stream,
    grow: &Grow<'_>,
    threads: &Mutex<Vec<StreamTask>>,
) -> Result<(), CopyError> {
    keepalive(ctrl.tcp());
    // A sending server reports its counters so the client can tune.
    let stats_stop = Arc::new(AtomicBool::new(false));
    let stats = matches!(grow, Grow::Server { .. }).then(|| {
        let (src, pool, stop) = (Arc::clone(src), Arc::clone(pool), Arc::clone(&stats_stop));
        std::thread::spawn(move || {
            let step = Duration::from_millis(50);
            let mut next = Instant::now() + STATS_INTERVAL;
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(step);
                if Instant::now() < next {
                    continue;
                }
                next += STATS_INTERVAL;
                if src.send_control(&Msg::Stats(pool.sender_stats())).is_err() {
                    return;
                }
            }
        })
    });
    let outcome = loop {
        let msg = match read_msg(ctrl) {
            Ok(m) => m,
            Err(e) => break Err(net(e)),
        };
        let added = match (msg, grow) {
            (Msg::AddStreams { n }, Grow::Server { accept, max }) => {
                server_grow(n, *max, *accept, pool, &**src)
            }
            (Msg::StreamsAdded { n }, Grow::Client { open, live }) => {
                client_grow(n, *open, live, pool)
            }
            (Msg::SetCongestion { name }, Grow::Server { .. }) => {
                // Best effort: the next statistics show what took.
                let _ = pool.set_congestion(&name);
                Ok(Vec::new())
            }
            (msg, _) => match src.handle(msg) {
                Ok(true) => break Ok(()),
                Ok(false) => Ok(Vec::new()),
                Err(why) => break Err(CopyError::Failed(why)),
            },
        };
        match added {
            Ok(new) => lock(threads).extend(new.into_iter().map(|s| spawn_sender(src, pool, s))),
            Err(e) => break Err(e),
        }
    };
    stats_stop.store(true, Ordering::SeqCst);
    if let Some(t) = stats {
        let _ = t.join();
    }
    outcome
}

/// Sends a source's manifest: its entries, what the walk skipped or
/// changed (`notes` as [`Manifest::notes_to_send`] caps them: at most
/// [`MAX_NOTES`] + 1), then the entries' count.
pub(super) fn send_manifest(
    ctrl: &mut Stream,
    entries: &[Entry],
    notes: &[Note],
) -> Result<(), CopyError> {
    // Few large writes rather than one per message (no Nagle here).
    let mut w = io::BufWriter::with_capacity(1 << 20, ctrl);
    let stall = crate::Stall::default();
    for msg in entries_messages(entries) {
        write_msg(&mut w, &msg).map_err(net)?;
        if crate::Stall::armed("manifest") {
            // Part of the manifest is on its way, the rest never comes.
            w.flush().map_err(net)?;
            stall.check("manifest", 0);
        }
    }
    // A note's strings are cut to MAX_TEXT bytes (2 x 4 KiB): 100 notes
    // a frame stay well under its cap.
    let clip = |t: &str| {
        let mut end = t.len().min(MAX_TEXT);
        while !t.is_char_boundary(end) {
            end -= 1;
        }
        t[..end].to_string()
    };
    for batch in notes.chunks(100) {
        let batch = batch
            .iter()
            .map(|n| Note {
                kind: n.kind,
                path: clip(&n.path),
                detail: clip(&n.detail),
            })
            .collect();
        write_msg(&mut w, &Msg::Notes(batch)).map_err(net)?;
    }
    write_msg(
        &mut w,
        &Msg::EntriesEnd {
            count: entries.len() as u32,
        },
    )
    .map_err(net)?;
    w.flush().map_err(net)
}

pub(super) fn spawn_sender(src: &Arc<Source>, pool: &Arc<Pool>, s: Stream) -> StreamTask {
    keepalive(s.tcp());
    let (src2, pool) = (Arc::clone(src), Arc::clone(pool));
    StreamTask::start(
        |end| crate::source::task::spawn(Arc::clone(src), s, end),
        move |r| {
            if r.is_err() && src2.done().is_none() {
                src2.stop();
                pool.all();
            }
        },
    )
}
