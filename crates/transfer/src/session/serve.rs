//! The server's side of a session: the exports, [`serve`], the checks a
//! request must pass, and mapping its paths beneath an export.

use super::*;

/// Server configuration of one export: `name=path[:ro][:public][:encrypted]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Export {
    /// The name clients use (`HOST:NAME/path`).
    pub name: String,
    /// The directory it publishes.
    pub path: PathBuf,
    /// Refuse pushes.
    pub read_only: bool,
    /// Serve without the pre-shared key.
    pub public: bool,
    /// Serve only encrypted sessions (`--encrypt`).
    pub encrypted: bool,
}

impl std::str::FromStr for Export {
    type Err = String;

    fn from_str(s: &str) -> Result<Export, String> {
        let (name, mut rest) = s
            .split_once('=')
            .ok_or_else(|| format!("export '{s}': expected NAME=PATH[:ro][:public][:encrypted]"))?;
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        {
            return Err(format!(
                "export '{s}': the name may use letters, digits, '-', '_' and '.'"
            ));
        }
        let (mut read_only, mut public, mut encrypted) = (false, false, false);
        loop {
            if let Some(r) = rest.strip_suffix(":ro") {
                read_only = true;
                rest = r;
            } else if let Some(r) = rest.strip_suffix(":rw") {
                rest = r;
            } else if let Some(r) = rest.strip_suffix(":public") {
                public = true;
                rest = r;
            } else if let Some(r) = rest.strip_suffix(":encrypted") {
                encrypted = true;
                rest = r;
            } else {
                break;
            }
        }
        if rest.is_empty() {
            return Err(format!("export '{s}': missing the directory"));
        }
        Ok(Export {
            name: name.to_string(),
            path: PathBuf::from(rest),
            read_only,
            public,
            encrypted,
        })
    }
}

/// What the server's copy service knows.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The exports.
    pub exports: Vec<Export>,
    /// True when the server requires the pre-shared key (every session is
    /// then authenticated); otherwise only public exports are served.
    pub keyed: bool,
    /// Use `sendfile` when sending.
    pub sendfile: bool,
    /// A session opened with a one-time ticket: the one file and
    /// direction it may copy (any other request is refused).
    pub grant: Option<crate::grant::Grant>,
}

/// Serves one copy session. `accept` yields this session's connections
/// (copy-control first), waiting at most the given time.
pub fn serve(cfg: &ServerConfig, accept: &AcceptFn<'_>) -> Result<Summary, CopyError> {
    // The control connection comes first: the client dials the data
    // connections once it is acknowledged, and the engine queues them in
    // that order.
    let mut ctrl = accept(SETUP_TIMEOUT).map_err(accept_failed)?;
    // Small messages each awaiting an answer: Nagle would hold them back.
    ctrl.set_nodelay(true).map_err(net)?;
    // The client may hold the connection open while its pre-flight probe
    // runs (seconds) before the request comes: well within this.
    ctrl.set_read_timeout(Some(SETUP_TIMEOUT)).map_err(net)?;
    expect_hello(&mut ctrl, Hello::Control)?;
    let req = match read_msg(&mut ctrl).map_err(net)? {
        Msg::Request(r) => r,
        other => {
            return Err(CopyError::Failed(format!(
                "expected a request, got {other:?}"
            )))
        }
    };
    let outside = cfg.grant.as_ref().filter(|g| !g.allows(&req));
    let checked = match (outside, refuse_plaintext(cfg, &req, ctrl.is_encrypted())) {
        (Some(g), _) => Err(Refuse {
            class: RefuseClass::Usage,
            message: g.refusal(),
        }),
        (None, Some(refuse)) => Err(refuse),
        (None, None) => check_request(cfg, &req),
    };
    let plan = match checked {
        Ok(p) => p,
        Err(refuse) => {
            let _ = write_msg(&mut ctrl, &Msg::Refuse(refuse.clone()));
            drain_after_refusal(&mut ctrl);
            return Err(CopyError::Usage(refuse.message));
        }
    };
    let streams = req.streams.clamp(1, MAX_STREAMS);
    let progress = Arc::new(Progress::default());
    let io_name = match req.direction {
        Direction::Push if req.direct => "pwrite+O_DIRECT",
        Direction::Push => "pwrite",
        // sendfile would bypass TLS: encrypted streams are written.
        Direction::Pull if cfg.sendfile && !ctrl.is_encrypted() => "pread+sendfile",
        Direction::Pull => "pread+write",
    };
    let congestion = fatpipe_sys::get_congestion(ctrl.tcp()).unwrap_or_default();
    write_msg(
        &mut ctrl,
        &Msg::Accept(Accept {
            streams,
            io: io_name.into(),
            max_streams: MAX_STREAMS,
            congestion,
            congestion_allowed: congestion_allowed(),
        }),
    )
    .map_err(net)?;
    // The manifest and needs go first (the sink may take long to plan);
    // the data connections the client dialled meanwhile wait in the
    // engine's queue until the source or sink takes them.
    ctrl.set_read_timeout(None).map_err(net)?;
    // Every data connection, at set-up and added later, gets the plan's
    // socket settings as it is taken: the receiver's window hold takes
    // its size from the buffer set here.
    // Each is tuned before its hello is read: the client sends data right
    // behind the hello (and the needs are already on their way), so the
    // settings are in place before the data comes.
    let tuned_accept = |timeout: Duration| -> Result<Stream, AcceptError> {
        let s = accept(timeout)?;
        apply_tuning(&s, &req.tuning, req.direction);
        Ok(s)
    };
    let data = DataConns {
        count: streams,
        next: Box::new(|ended: &AtomicBool| {
            let end = Instant::now() + SETUP_TIMEOUT;
            // One queued is taken even when the session is over: the
            // client may be waiting for its End (see `feed_late`). Past
            // `ended`, one last wait of zero takes what came meanwhile.
            let mut over = false;
            loop {
                let left = end.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Some(Err(accept_failed(AcceptError::Timeout)));
                }
                let slice = if over {
                    Duration::ZERO
                } else {
                    left.min(LATE_SLICE)
                };
                match tuned_accept(slice) {
                    Ok(mut s) => return Some(greeted(&mut s).map(|()| s)),
                    Err(AcceptError::Timeout) if over => return None,
                    Err(AcceptError::Timeout) => over = ended.load(Ordering::SeqCst),
                    Err(e) => return Some(Err(accept_failed(e))),
                }
            }
        }),
    };
    let grow = Grow::Server {
        accept: &tuned_accept,
        max: MAX_STREAMS,
    };
    match plan {
        ServerPlan::Pull(m) => {
            let notes = m.notes_to_send();
            let src = Arc::new(Source::new(
                m.entries,
                m.origins,
                SourceOptions {
                    chunk_size: req.chunk_size,
                    algo: req.algo,
                    sendfile: cfg.sendfile,
                    bwlimit: (req.bwlimit > 0).then_some(req.bwlimit),
                    corrupt_chunk: SourceOptions::corrupt_from_env(),
                },
                progress,
            ));
            send_manifest(&mut ctrl, src.entries(), &notes)?;
            run_source(src, ctrl, data, &grow)
        }
        ServerPlan::Push {
            root,
            dest,
            into_dir,
        } => {
            let opts = sink_options(&req);
            let map = move |entries: &[Entry]| map_beneath(&root, dest.as_ref(), into_dir, entries);
            run_sink(ctrl, data, opts, progress, &map, &grow, false).map(|r| r.summary)
        }
    }
}

/// After refusing a request: a pushing client has sent its manifest
/// behind it, and closing with those bytes unread would reset the
/// connection, which may destroy the refusal before the client reads it.
/// So the server closes its side and reads until the client closes its own
/// (it does once it has read the refusal), for at most 3 s and 256 MiB.
pub(super) fn drain_after_refusal(ctrl: &mut Stream) {
    const DRAIN_FOR: Duration = Duration::from_secs(3);
    const DRAIN_MAX: u64 = 256 << 20;
    let _ = ctrl.shutdown(Shutdown::Write);
    let end = Instant::now() + DRAIN_FOR;
    let mut left = DRAIN_MAX;
    let mut buf = [0u8; 64 << 10];
    while left > 0 {
        let now = Instant::now();
        if now >= end || ctrl.set_read_timeout(Some(end - now)).is_err() {
            return;
        }
        match ctrl.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => left = left.saturating_sub(n as u64),
        }
    }
}

/// Server: answers a request for `n` more streams with what the cap
/// allows, then accepts that many with the setup timeout. A connection
/// that does not come fails the session (the client resumes it).
pub(super) fn server_grow(
    n: u16,
    max: u16,
    accept: &AcceptFn<'_>,
    pool: &Pool,
    ctrl: &dyn CtrlSend,
) -> Result<Vec<Stream>, CopyError> {
    let grant = n.min(max.saturating_sub(pool.streams()));
    pool.promise(grant);
    ctrl.send_control(&Msg::StreamsAdded { n: grant })
        .map_err(net)?;
    let mut out = Vec::new();
    for _ in 0..grant {
        let mut s = accept(SETUP_TIMEOUT).map_err(accept_failed)?;
        greeted(&mut s)?;
        pool.add(&s).map_err(net)?;
        out.push(s);
    }
    Ok(out)
}

pub(super) enum ServerPlan {
    Pull(Manifest),
    Push {
        root: Dir,
        dest: Option<RelPath>,
        into_dir: bool,
    },
}

/// Applies the client's socket settings to one of the server's data
/// connections: the receive buffer on a push; send buffer, congestion
/// control, pacing and the unsent backlog on a pull (the server sends). Best effort, like the
/// client's own: a refused option leaves the kernel's default, which still
/// copies correctly.
pub(super) fn apply_tuning(s: &Stream, t: &SocketTuning, direction: Direction) {
    if let Some(bytes) = planned_window(t) {
        let _ = match direction {
            Direction::Push => fatpipe_sys::set_recv_buffer(s.tcp(), bytes, t.force),
            Direction::Pull => fatpipe_sys::set_send_buffer(s.tcp(), bytes, t.force),
        };
    }
    if direction == Direction::Pull {
        if !t.congestion.is_empty() {
            let _ = fatpipe_sys::set_congestion(s.tcp(), &t.congestion);
        }
        if t.pacing > 0 {
            let _ = fatpipe_sys::set_max_pacing_rate(s.tcp(), t.pacing / 8);
        }
        if let Some(bytes) = planned_window(t) {
            let _ = fatpipe_sys::set_notsent_lowat(s.tcp(), crate::service::unsent_backlog(bytes));
        }
    }
}

/// The refusal of a plaintext session to an `:encrypted` export: one line
/// telling the client what to add.
pub(super) fn refuse_plaintext(
    cfg: &ServerConfig,
    req: &Request,
    encrypted: bool,
) -> Option<Refuse> {
    let export = cfg
        .exports
        .iter()
        .find(|e| e.name.as_bytes() == &req.export[..])?;
    (export.encrypted && !encrypted).then(|| Refuse {
        class: RefuseClass::Usage,
        message: format!(
            "export '{}' requires encryption: add --encrypt (with --key-file)",
            export.name
        ),
    })
}

pub(super) fn check_request(cfg: &ServerConfig, req: &Request) -> Result<ServerPlan, Refuse> {
    let usage = |m: String| Refuse {
        class: RefuseClass::Usage,
        message: m,
    };
    if req.version != VERSION {
        return Err(usage(format!(
            "copy protocol version {} is not supported (server speaks {VERSION}); use matching fatpipe versions",
            req.version
        )));
    }
    let name = String::from_utf8_lossy(&req.export);
    let Some(export) = cfg
        .exports
        .iter()
        .find(|e| e.name.as_bytes() == &req.export[..])
    else {
        let names: Vec<&str> = cfg.exports.iter().map(|e| e.name.as_str()).collect();
        return Err(usage(format!(
            "no export named '{name}' on this server (exports: {})",
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        )));
    };
    if !export.public && !cfg.keyed {
        return Err(usage(format!(
            "export '{name}' is not public: it needs the server's pre-shared key (the client passes --key-file; a server without a key serves only :public exports)"
        )));
    }
    if !(CHUNK_LIMITS.0..=CHUNK_LIMITS.1).contains(&req.chunk_size) {
        return Err(usage(format!(
            "chunk size {} is out of range",
            req.chunk_size
        )));
    }
    let root = Dir::open(&export.path).map_err(|e| Refuse {
        class: RefuseClass::Failed,
        message: format!("export '{name}' is unavailable: {e}"),
    })?;
    let bad_path =
        |p: &[u8], why: String| usage(format!("{name}/{}: {why}", String::from_utf8_lossy(p)));
    match req.direction {
        Direction::Push => {
            if export.read_only {
                return Err(usage(format!("export '{name}' is read-only")));
            }
            let raw = req.paths.first().cloned().unwrap_or_default();
            let dest = RelPath::parse_optional(&raw).map_err(|e| bad_path(&raw, e.to_string()))?;
            if let Some(d) = &dest {
                // Refuse escapes now, with a clear message, rather than after
                // the manifest: resolve the deepest existing ancestor.
                let (parent, _) = d.split_last();
                match root.dir_beneath(parent.as_ref()) {
                    Err(ResolveError::Escapes) => {
                        return Err(bad_path(&raw, "leads outside the export".into()))
                    }
                    Err(ResolveError::Io(e)) => return Err(bad_path(&raw, e.to_string())),
                    Ok(p) => {
                        if let Err(ResolveError::Escapes) = root.dir_beneath(Some(d)) {
                            return Err(bad_path(&raw, "leads outside the export".into()));
                        }
                        drop(p);
                    }
                }
            }
            Ok(ServerPlan::Push {
                root,
                dest,
                into_dir: raw.ends_with(b"/") && !raw.iter().all(|&b| b == b'/'),
            })
        }
        Direction::Pull => {
            if req.paths.is_empty() {
                return Err(usage("nothing to copy".into()));
            }
            let root = Arc::new(root);
            // The peer chose the tree: the walk is bounded.
            let mut m = Manifest::bounded(Limits {
                entries: MAX_ENTRIES,
                bytes: MAX_MANIFEST_BYTES,
            });
            for raw in &req.paths {
                let p = RelPath::parse_optional(raw).map_err(|e| bad_path(raw, e.to_string()))?;
                let contents = p.is_none() || raw.ends_with(b"/");
                if contents && !req.recursive {
                    return Err(bad_path(
                        raw,
                        "is a directory (use -r to copy directories)".into(),
                    ));
                }
                let walked = match &p {
                    None => m.add_contents(Arc::clone(&root)),
                    Some(p) if contents => {
                        // rsync's "dir/": the directory's contents. It
                        // must resolve as one, beneath the export.
                        match root.dir_beneath(Some(p)) {
                            Ok(d) => m.add_contents(Arc::new(d)),
                            Err(ResolveError::Escapes) => {
                                return Err(bad_path(raw, "leads outside the export".into()))
                            }
                            Err(ResolveError::Io(e)) => return Err(bad_path(raw, e.to_string())),
                        }
                    }
                    Some(p) => {
                        let (parent, last) = p.split_last();
                        let dir = match root.dir_beneath(parent.as_ref()) {
                            Ok(d) => Arc::new(d),
                            Err(ResolveError::Escapes) => {
                                return Err(bad_path(raw, "leads outside the export".into()))
                            }
                            Err(ResolveError::Io(e)) => return Err(bad_path(raw, e.to_string())),
                        };
                        let as_name =
                            RelPath::new(last).map_err(|e| bad_path(raw, e.to_string()))?;
                        m.add(dir, last, &as_name, req.recursive)
                    }
                };
                walked.map_err(|e| usage(format!("{name}/{e}")))?;
                if let Some(bound) = m.exceeded() {
                    return Err(usage(format!(
                        "{name}: the pull lists {bound}, past this server's bound \
                         (docs/security.md); pull a smaller part of the tree"
                    )));
                }
            }
            check_unique_tops(&m.entries).map_err(usage)?;
            Ok(ServerPlan::Pull(m))
        }
    }
}

pub(super) fn sink_options(req: &Request) -> SinkOptions {
    SinkOptions {
        chunk_size: req.chunk_size,
        algo: req.algo,
        sync: req.sync,
        direct: req.direct,
        max_resends: 5,
        window: planned_window(&req.tuning),
        start: planned_start(&req.tuning),
    }
}

/// The receive window a data connection is held at: the plan's per-stream
/// buffer (capped as [`apply_tuning`] caps it), or none when the kernel's
/// autotuning is left in charge.
pub(super) fn planned_window(t: &SocketTuning) -> Option<u64> {
    match (t.buffer, t.force) {
        (0, _) => None,
        (b, true) => Some(b.min(MAX_FORCED_BUFFER)),
        (b, false) => Some(b),
    }
}

/// The smaller window held during the sender's start-up, and for how long
/// (`WindowHold::starting_at` ignores one that is not smaller and caps the
/// time); none without a held window.
pub(super) fn planned_start(t: &SocketTuning) -> Option<(u64, Duration)> {
    planned_window(t)?;
    (t.start_window > 0).then(|| (t.start_window, Duration::from_millis(u64::from(t.start_ms))))
}

/// Server side: where pushed entries go, beneath the export root.
pub(super) fn map_beneath(
    root: &Dir,
    dest: Option<&RelPath>,
    into_dir: bool,
    entries: &[Entry],
) -> Result<(Dir, Option<Vec<u8>>), CopyError> {
    let Some(d) = dest else {
        return Ok((root.try_clone().map_err(fail)?, None));
    };
    let shown = d.display();
    match root.dir_beneath(Some(d)) {
        Ok(dir) => return Ok((dir, None)),
        Err(ResolveError::Escapes) => {
            return Err(CopyError::Usage(format!(
                "{shown}: leads outside the export"
            )))
        }
        Err(ResolveError::Io(e))
            if e.raw_os_error().is_some()
                && matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) => {}
        Err(ResolveError::Io(e)) => return Err(CopyError::Failed(format!("{shown}: {e}"))),
    }
    let (parent, name) = d.split_last();
    let pdir = match root.dir_beneath(parent.as_ref()) {
        Ok(p) => p,
        Err(ResolveError::Escapes) => {
            return Err(CopyError::Usage(format!(
                "{shown}: leads outside the export"
            )))
        }
        Err(ResolveError::Io(e)) => {
            return Err(CopyError::Usage(format!("{shown}: parent directory: {e}")))
        }
    };
    if renames_single_file(into_dir, entries) {
        return Ok((pdir, Some(name.to_vec())));
    }
    pdir.mkdir_at(name, 0o755)
        .map_err(|e| CopyError::Failed(format!("{shown}: {e}")))?;
    let dir = pdir
        .subdir(name)
        .map_err(|e| CopyError::Failed(format!("{shown}: {e}")))?;
    Ok((dir, None))
}

/// rsync's destination rule, the same at both ends. The destination is
/// a directory (created if missing, its last component only) that the
/// top-level entries go into, unless the copy is one file (or symlink)
/// named as such, not as a directory's contents, and the destination is
/// not an existing directory and has no trailing `/` (`into_dir`): then
/// the file takes the destination's name. A directory without a trailing
/// `/` goes inside the destination, whether or not it exists, so running
/// a command again lands where the first run did.
pub(super) fn renames_single_file(into_dir: bool, entries: &[Entry]) -> bool {
    let mut tops = entries.iter().filter(|e| e.path.depth() == 1);
    match (tops.next(), tops.next()) {
        (Some(top), None) => !into_dir && !matches!(top.kind, EntryKind::Dir),
        _ => false,
    }
}

/// Client side: where pulled entries go on the local file system
/// (`into_dir`: the sources were contents, or several; see
/// [`renames_single_file`]).
pub(super) fn map_local(
    dest: &Path,
    into_dir: bool,
    entries: &[Entry],
) -> Result<(Dir, Option<Vec<u8>>), CopyError> {
    let into_dir = into_dir || dest.as_os_str().as_encoded_bytes().ends_with(b"/");
    let shown = dest.display();
    if dest.is_dir() {
        return Ok((
            Dir::open(dest).map_err(|e| CopyError::Usage(format!("{shown}: {e}")))?,
            None,
        ));
    }
    let name = dest
        .file_name()
        .ok_or_else(|| CopyError::Usage(format!("{shown}: not a usable destination")))?;
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let pdir =
        Dir::open(parent).map_err(|e| CopyError::Usage(format!("{}: {e}", parent.display())))?;
    let name = name.as_encoded_bytes();
    if renames_single_file(into_dir, entries) {
        return Ok((pdir, Some(name.to_vec())));
    }
    pdir.mkdir_at(name, 0o755)
        .map_err(|e| CopyError::Usage(format!("{shown}: {e}")))?;
    Ok((
        pdir.subdir(name)
            .map_err(|e| CopyError::Failed(format!("{shown}: {e}")))?,
        None,
    ))
}

pub(super) fn rename_top(entries: Vec<Entry>, name: &[u8]) -> Result<Vec<Entry>, CopyError> {
    entries
        .into_iter()
        .map(|mut e| {
            let p = match e.path.rest() {
                None => RelPath::new(name),
                Some(rest) => {
                    let mut v = name.to_vec();
                    v.push(b'/');
                    v.extend_from_slice(rest);
                    RelPath::new(&v)
                }
            };
            e.path = p.map_err(|err| {
                CopyError::Usage(format!(
                    "{}: cannot take the destination name '{}': {err}",
                    e.path.display(),
                    String::from_utf8_lossy(name)
                ))
            })?;
            Ok(e)
        })
        .collect()
}

pub(super) fn check_unique_tops(entries: &[Entry]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for e in entries.iter().filter(|e| e.path.depth() == 1) {
        if !seen.insert(e.path.as_bytes()) {
            return Err(format!(
                "two sources are both named '{}' at the destination",
                e.path.display()
            ));
        }
    }
    Ok(())
}
