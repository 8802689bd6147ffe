//! The session's tests: both ends over plain loopback TCP.

use super::*;
use crate::journal::{journal_name, part_name};
use std::collections::BTreeMap;
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Plain-TCP link; records every stream so a test can cut them.
struct TestLink {
    addr: std::net::SocketAddr,
    opened: Arc<Mutex<Vec<Stream>>>,
    on_connect: Option<Box<dyn Fn() + Send + Sync>>,
    /// A data connection dialled only after a wait (a lost SYN).
    slow_tag: Option<(u32, Duration)>,
}

struct TestConn {
    addr: std::net::SocketAddr,
    opened: Arc<Mutex<Vec<Stream>>>,
    slow_tag: Option<(u32, Duration)>,
}

impl Link for TestLink {
    fn connect(&self) -> Result<Box<dyn Conn>, CopyError> {
        if let Some(f) = &self.on_connect {
            f();
        }
        Ok(Box::new(TestConn {
            addr: self.addr,
            opened: Arc::clone(&self.opened),
            slow_tag: self.slow_tag,
        }))
    }
}

impl Conn for TestConn {
    fn open(&self, tag: u32) -> Result<Stream, CopyError> {
        if let Some((_, wait)) = self.slow_tag.filter(|&(t, _)| t == tag) {
            std::thread::sleep(wait);
        }
        let s = Stream::from(std::net::TcpStream::connect(self.addr).map_err(net)?);
        self.opened.lock().unwrap().push(s.try_clone().unwrap());
        Ok(s)
    }
}

struct TestServer {
    link: TestLink,
    stop: Arc<AtomicBool>,
    results: Arc<Mutex<Vec<Result<Summary, String>>>>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn server(cfg: ServerConfig) -> TestServer {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let results = Arc::new(Mutex::new(Vec::new()));
    let (st, rs) = (Arc::clone(&stop), Arc::clone(&results));
    std::thread::spawn(move || {
        // Plain TCP has no cookie to route a connection to its session,
        // as the engine does; the sessions here come one at a time, so
        // the hello does: a session's first connection is its control
        // connection (data connections of the one before, which ended
        // without taking them, are closed), and a control connection
        // that comes while a session takes data ones is the next
        // session's, kept for it.
        let want_control = AtomicBool::new(true);
        let next_control: Mutex<Option<TcpStream>> = Mutex::new(None);
        let hello = |s: &TcpStream| {
            let mut b = [0u8; 8];
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let n = s.peek(&mut b).unwrap_or(0);
            s.set_read_timeout(None).unwrap();
            (n == 8).then(|| Hello::decode(&b).ok()).flatten()
        };
        let accept = |t: Duration| -> Result<Stream, AcceptError> {
            let control = want_control.swap(false, Ordering::SeqCst);
            if control {
                if let Some(s) = next_control.lock().unwrap().take() {
                    return Ok(Stream::from(s));
                }
            }
            let end = Instant::now() + t;
            loop {
                if st.load(Ordering::SeqCst) {
                    return Err(AcceptError::Failed("stopped".into()));
                }
                match l.accept() {
                    Ok((s, _)) => {
                        s.set_nonblocking(false).unwrap();
                        match (control, hello(&s)) {
                            (true, Some(Hello::Data)) => continue,
                            (false, Some(Hello::Control)) => {
                                *next_control.lock().unwrap() = Some(s);
                                return Err(AcceptError::Timeout);
                            }
                            _ => return Ok(Stream::from(s)),
                        }
                    }
                    Err(e) if e.kind() != io::ErrorKind::WouldBlock => {
                        return Err(AcceptError::Failed(e.to_string()))
                    }
                    Err(_) if Instant::now() < end => std::thread::sleep(Duration::from_millis(2)),
                    Err(_) => return Err(AcceptError::Timeout),
                }
            }
        };
        while !st.load(Ordering::SeqCst) {
            want_control.store(true, Ordering::SeqCst);
            let r = serve(&cfg, &accept);
            if st.load(Ordering::SeqCst) {
                break;
            }
            rs.lock().unwrap().push(r.map_err(|e| e.to_string()));
        }
    });
    TestServer {
        link: TestLink {
            addr,
            opened: Arc::new(Mutex::new(Vec::new())),
            on_connect: None,
            slow_tag: None,
        },
        stop,
        results,
    }
}

fn export(name: &str, path: &Path, ro: bool) -> Export {
    Export {
        name: name.into(),
        path: path.to_path_buf(),
        read_only: ro,
        public: false,
        encrypted: false,
    }
}

fn job(direction: Direction, export: &str, remote: &[&str]) -> Job {
    Job {
        direction,
        export: export.into(),
        remote: remote.iter().map(|r| r.as_bytes().to_vec()).collect(),
        local_sources: vec![],
        local_dest: PathBuf::new(),
        recursive: true,
        sync: false,
        direct: false,
        algo: Algo::Xxh3,
        streams: 3,
        chunk_size: 64 * 1024,
        auto_chunk: false,
        bwlimit: None,
        tuning: SocketTuning::default(),
        retries: 3,
        sendfile: true,
        corrupt_chunk: None,
    }
}

fn pseudo_random(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A tree with the awkward cases: odd names, empty dir and file, sparse
/// file, symlinks (one pointing outside), multi-chunk file.
fn make_tree(root: &Path) {
    let t = root.join("tree");
    std::fs::create_dir_all(t.join("empty dir")).unwrap();
    std::fs::create_dir_all(t.join("ünïcödé/deeper")).unwrap();
    std::fs::write(t.join("ünïcödé/deeper/small file.txt"), b"hello world").unwrap();
    std::fs::write(t.join("zero"), b"").unwrap();
    std::fs::write(t.join("N".repeat(255)), b"long name").unwrap();
    std::fs::write(t.join("big.bin"), pseudo_random(1_000_000, 7)).unwrap();
    let sparse = std::fs::File::create(t.join("sparse")).unwrap();
    sparse.set_len(3 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&sparse, b"middle", 1 << 20).unwrap();
    symlink("ünïcödé/deeper", t.join("inside-link")).unwrap();
    symlink("/etc/passwd", t.join("outside-link")).unwrap();
    std::fs::set_permissions(t.join("zero"), std::fs::Permissions::from_mode(0o640)).unwrap();
    let ro = t.join("ünïcödé/deeper");
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
}

/// Everything a copy must reproduce, per relative path.
fn snapshot(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for p in names {
            let rel = p.strip_prefix(base).unwrap().display().to_string();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let desc = if m.file_type().is_symlink() {
                format!("link {}", std::fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                walk(base, &p, out);
                format!("dir {:o} {}", m.mode() & 0o7777, m.mtime())
            } else {
                let data = std::fs::read(&p).unwrap();
                format!(
                    "file {:o} {}.{} {} {:x}",
                    m.mode() & 0o7777,
                    m.mtime(),
                    m.mtime_nsec(),
                    data.len(),
                    xxhash_rust::xxh3::xxh3_64(&data)
                )
            };
            out.insert(rel, desc);
        }
    }
    walk(root, root, &mut out);
    out
}

fn cfg(exports: Vec<Export>) -> ServerConfig {
    ServerConfig {
        exports,
        keyed: true,
        sendfile: true,
        grant: None,
    }
}

#[test]
fn a_receiver_whose_stream_never_ends_is_shut_after_the_grace() {
    // One receiver ends at once; the other blocks until it is shut
    // (as a socket read would until `pool.all()`).
    let (shut_tx, shut_rx) = mpsc::channel::<()>();
    let threads = vec![
        std::thread::spawn(|| {}),
        std::thread::spawn(move || {
            let _ = shut_rx.recv();
        }),
    ];
    let started = Instant::now();
    let gave_up = std::cell::Cell::new(false);
    join_within(threads, Duration::from_millis(200), || {
        gave_up.set(true);
        drop(shut_tx);
    });
    assert!(gave_up.get());
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert!(started.elapsed() < Duration::from_secs(5));

    // Receivers that end in time are joined without giving up.
    let threads = vec![std::thread::spawn(|| {
        std::thread::sleep(Duration::from_millis(20))
    })];
    let gave_up = std::cell::Cell::new(false);
    join_within(threads, Duration::from_secs(5), || gave_up.set(true));
    assert!(!gave_up.get());
}

#[test]
fn push_then_pull_reproduces_the_tree() {
    let src = tempfile::tempdir().unwrap();
    make_tree(src.path());
    let exp = tempfile::tempdir().unwrap();
    let srv = server(cfg(vec![export("data", exp.path(), false)]));
    let mut j = job(Direction::Push, "data", &[""]);
    j.local_sources = vec![src.path().join("tree")];
    let rep = run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
    assert!(rep.failures.is_empty(), "{:?}", rep.failures);
    assert_eq!(rep.summary.files_verified, 5);
    assert_eq!(
        snapshot(&src.path().join("tree")),
        snapshot(&exp.path().join("tree"))
    );
    // Holes stay holes.
    let m = std::fs::metadata(exp.path().join("tree/sparse")).unwrap();
    assert!(
        m.blocks() * 512 < 1 << 20,
        "sparse file was filled: {} blocks",
        m.blocks()
    );
    // No temporary names are left behind.
    assert!(!snapshot(exp.path()).keys().any(|k| k.contains(".fatpipe-")));

    // Same again: everything is skipped.
    let rep = run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
    assert_eq!(
        (rep.summary.files_skipped, rep.summary.bytes_written),
        (5, 0)
    );

    // Pull its contents back under a new name ("tree/": rsync's rule).
    let back = tempfile::tempdir().unwrap();
    let mut j = job(Direction::Pull, "data", &["tree/"]);
    j.local_dest = back.path().join("copy");
    j.algo = Algo::Blake3;
    let rep = run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
    assert!(rep.failures.is_empty(), "{:?}", rep.failures);
    assert_eq!(
        snapshot(&src.path().join("tree")),
        snapshot(&back.path().join("copy"))
    );
}

/// rsync's destination rule at both ends: the same command run twice
/// lands in the same place, whether the destination existed or not.
#[test]
fn a_rerun_lands_where_the_first_run_did() {
    let src = tempfile::tempdir().unwrap();
    let exp = tempfile::tempdir().unwrap();
    let tree = src.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    std::fs::write(tree.join("sub/only"), b"one file").unwrap();
    std::fs::write(src.path().join("file"), b"a file").unwrap();
    let srv = server(ServerConfig {
        exports: vec![export("data", exp.path(), false)],
        keyed: true,
        sendfile: true,
        grant: None,
    });
    let push = |from: PathBuf, to: &str| {
        let mut j = job(Direction::Push, "data", &[to]);
        j.local_sources = vec![from];
        let rep = run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
        assert!(rep.failures.is_empty(), "{:?}", rep.failures);
        rep
    };
    let mut contents = tree.clone().into_os_string();
    contents.push("/");
    for _ in 0..2 {
        // "tree/" -> t: the contents, with or without t existing.
        push(PathBuf::from(&contents), "t");
        // "tree" -> u: the directory inside u.
        push(tree.clone(), "u");
        // "file" -> f: renamed; -> g/: inside g.
        push(src.path().join("file"), "f");
        push(src.path().join("file"), "g/");
    }
    let mut got: Vec<String> = snapshot(exp.path()).into_keys().collect();
    got.sort();
    assert_eq!(
        got,
        [
            "f",
            "g",
            "g/file",
            "t",
            "t/sub",
            "t/sub/only",
            "u",
            "u/tree",
            "u/tree/sub",
            "u/tree/sub/only"
        ]
    );
    // Pull: "t/" -> a new directory holds its contents, twice.
    let back = tempfile::tempdir().unwrap();
    for _ in 0..2 {
        let mut j = job(Direction::Pull, "data", &["t/"]);
        j.local_dest = back.path().join("p");
        run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
        let mut j = job(Direction::Pull, "data", &["t"]);
        j.local_dest = back.path().join("q");
        run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
    }
    let mut got: Vec<String> = snapshot(back.path()).into_keys().collect();
    got.sort();
    assert_eq!(
        got,
        [
            "p",
            "p/sub",
            "p/sub/only",
            "q",
            "q/t",
            "q/t/sub",
            "q/t/sub/only"
        ]
    );
}

#[test]
fn corrupted_chunk_is_detected_and_sent_again() {
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("f"), pseudo_random(500_000, 3)).unwrap();
    let exp = tempfile::tempdir().unwrap();
    let srv = server(cfg(vec![export("data", exp.path(), false)]));
    let mut j = job(Direction::Push, "data", &["g"]);
    j.local_sources = vec![src.path().join("f")];
    j.corrupt_chunk = Some(2);
    let rep = run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
    assert_eq!(rep.summary.chunks_resent, 1);
    assert_eq!(rep.summary.files_verified, 1);
    assert_eq!(
        std::fs::read(src.path().join("f")).unwrap(),
        std::fs::read(exp.path().join("g")).unwrap()
    );
}

/// A 6 MiB push at ~7.5 MB/s whose connections are all cut once 2 MiB
/// are in, so the first session drops mid-file.
struct CutPush {
    _src: tempfile::TempDir,
    exp: tempfile::TempDir,
    srv: TestServer,
    job: Job,
    data: Vec<u8>,
    progress: Arc<Progress>,
    cutter: std::thread::JoinHandle<()>,
}

fn cut_push(seed: u64) -> CutPush {
    let src = tempfile::tempdir().unwrap();
    let data = pseudo_random(6 << 20, seed);
    std::fs::write(src.path().join("f"), &data).unwrap();
    let exp = tempfile::tempdir().unwrap();
    let srv = server(cfg(vec![export("data", exp.path(), false)]));
    let mut job = job(Direction::Push, "data", &[""]);
    job.local_sources = vec![src.path().join("f")];
    job.bwlimit = Some(60_000_000); // the first session takes a while
    let progress = Arc::new(Progress::default());
    let opened = Arc::clone(&srv.link.opened);
    let p2 = Arc::clone(&progress);
    let cutter = std::thread::spawn(move || {
        while p2.bytes.load(Ordering::Relaxed) < 2 << 20 {
            std::thread::sleep(Duration::from_millis(5));
        }
        for s in opened.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    });
    CutPush {
        _src: src,
        exp,
        srv,
        job,
        data,
        progress,
        cutter,
    }
}

#[test]
fn prepare_runs_once_with_the_control_connection_open_and_reconnects_skip_it() {
    let CutPush {
        _src,
        exp,
        srv,
        job: mut j,
        data,
        progress,
        cutter,
    } = cut_push(12);
    j.streams = 1;
    let calls = Mutex::new(Vec::new());
    let mut prepare = |job: &mut Job| -> Result<(), CopyError> {
        // Only the control connection is open: nothing waits on the plan.
        calls
            .lock()
            .unwrap()
            .push(srv.link.opened.lock().unwrap().len());
        std::thread::sleep(Duration::from_millis(300));
        job.streams = 3;
        Ok(())
    };
    let wall = Instant::now();
    let rep = run_client_prepared(
        &srv.link,
        &j,
        Some(&mut prepare),
        Arc::clone(&progress),
        &|_| {},
        None,
    )
    .unwrap();
    cutter.join().unwrap();
    assert_eq!(*calls.lock().unwrap(), vec![1]);
    assert_eq!(rep.reconnects, 1);
    assert_eq!(
        rep.streams, 3,
        "the prepared streams, also after the reconnect"
    );
    // The time waited for the plan is not the copy's.
    assert!(wall.elapsed() >= rep.elapsed + Duration::from_millis(300));
    assert_eq!(std::fs::read(exp.path().join("f")).unwrap(), data);
}

#[test]
fn a_failed_prepare_comes_before_the_sessions_own_error() {
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("f"), b"x").unwrap();
    // Nothing listens here: the session fails before preparing.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let link = TestLink {
        addr: l.local_addr().unwrap(),
        opened: Arc::default(),
        on_connect: None,
        slow_tag: None,
    };
    drop(l);
    let mut j = job(Direction::Push, "data", &[""]);
    j.local_sources = vec![src.path().join("f")];
    let calls = Mutex::new(0);
    let mut prepare = |_: &mut Job| -> Result<(), CopyError> {
        *calls.lock().unwrap() += 1;
        Err(CopyError::Usage("the probe was refused".into()))
    };
    match run_client_prepared(&link, &j, Some(&mut prepare), Arc::default(), &|_| {}, None) {
        Err(CopyError::Usage(m)) => assert_eq!(m, "the probe was refused"),
        other => panic!("expected the prepare's error, got {other:?}"),
    }
    // A prepare that succeeds leaves the session's own error, retried
    // without preparing again.
    let mut prepare = |_: &mut Job| -> Result<(), CopyError> {
        *calls.lock().unwrap() += 1;
        Ok(())
    };
    j.retries = 2;
    let retried = Mutex::new(0);
    let r = run_client_prepared(
        &link,
        &j,
        Some(&mut prepare),
        Arc::default(),
        &|_| *retried.lock().unwrap() += 1,
        None,
    );
    assert!(matches!(r, Err(CopyError::Failed(_))), "{r:?}");
    assert_eq!(*calls.lock().unwrap(), 2);
    assert_eq!(*retried.lock().unwrap(), 2);
}

/// A file that is one chunk at this session's size may still have a
/// journal and a part from a run that cut it smaller (an auto-tuned
/// chunk follows the path): they go when the file takes its name, on
/// both ways a one-chunk file is stored (a small one whole into an
/// unnamed file, a larger one through its part).
#[test]
fn a_one_chunk_file_drops_what_an_earlier_smaller_cut_left() {
    let src = tempfile::tempdir().unwrap();
    let exp = tempfile::tempdir().unwrap();
    std::fs::create_dir(src.path().join("t")).unwrap();
    std::fs::create_dir(exp.path().join("t")).unwrap();
    let mut stale = Vec::new();
    for (name, size) in [("small", 100_000), ("large", 300_000)] {
        std::fs::write(src.path().join("t").join(name), pseudo_random(size, 3)).unwrap();
        for temp in [journal_name(name.as_bytes()), part_name(name.as_bytes())] {
            let p = exp.path().join("t").join(String::from_utf8(temp).unwrap());
            std::fs::write(&p, b"an earlier run's, at 64 KiB chunks").unwrap();
            stale.push(p);
        }
    }
    let srv = server(cfg(vec![export("data", exp.path(), false)]));
    let mut j = job(Direction::Push, "data", &[""]);
    j.local_sources = vec![src.path().join("t")];
    j.chunk_size = 512 << 10;
    let rep = run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
    assert_eq!(rep.summary.files_verified, 2);
    assert_eq!(
        snapshot(&src.path().join("t")),
        snapshot(&exp.path().join("t"))
    );
    for p in stale {
        assert!(!p.exists(), "{} was left", p.display());
    }
}

/// A receiving client tracks at most 2^26 chunks: a pull past that at
/// the auto-tuned size asks again with chunks that fit, as a push fits
/// its own before asking; a given size is refused with one line.
#[test]
fn an_auto_chunked_pull_past_the_chunk_bound_asks_again_with_larger_chunks() {
    let exp = tempfile::tempdir().unwrap();
    std::fs::create_dir(exp.path().join("huge")).unwrap();
    // 33 TiB in sparse files: past 2^26 chunks of 512 KiB (32 TiB),
    // within 2^26 of 1 MiB.
    for name in ["a", "b", "c"] {
        std::fs::File::create(exp.path().join("huge").join(name))
            .unwrap()
            .set_len(11 << 40)
            .unwrap();
    }
    let srv = server(cfg(vec![export("data", exp.path(), true)]));
    let back = tempfile::tempdir().unwrap();
    let mut j = job(Direction::Pull, "data", &["huge"]);
    // Past the manifest's check the destination fails (its parent is
    // missing), so none of the 33 TiB moves.
    j.local_dest = back.path().join("missing/huge");
    j.chunk_size = 512 << 10;
    let said = Mutex::new(Vec::<String>::new());
    let on_retry = |m: &str| said.lock().unwrap().push(m.to_string());
    match run_client(&srv.link, &j, Arc::default(), &on_retry) {
        Err(CopyError::Failed(m)) => {
            assert!(m.contains("use larger chunks"), "{m}")
        }
        other => panic!("a given chunk size must be refused, got {other:?}"),
    }
    assert!(said.lock().unwrap().is_empty());

    j.auto_chunk = true;
    match run_client(&srv.link, &j, Arc::default(), &on_retry) {
        Err(CopyError::Usage(m)) => assert!(m.contains("missing"), "{m}"),
        other => panic!("expected the destination's error, got {other:?}"),
    }
    let said = said.lock().unwrap();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].ends_with("asking again with 1 MiB chunks"),
        "{said:?}"
    );
}

#[test]
fn a_dropped_session_resumes_where_it_stopped() {
    let CutPush {
        _src,
        exp,
        srv,
        job: j,
        data,
        progress,
        cutter,
    } = cut_push(11);
    let retries = Mutex::new(0);
    let rep = run_client(&srv.link, &j, Arc::clone(&progress), &|_| {
        *retries.lock().unwrap() += 1
    })
    .unwrap();
    cutter.join().unwrap();
    assert_eq!(*retries.lock().unwrap(), 1);
    assert_eq!(rep.reconnects, 1);
    assert!(
        rep.summary.bytes_written < data.len() as u64 - (1 << 20),
        "the second session re-sent {} bytes",
        rep.summary.bytes_written
    );
    assert_eq!(std::fs::read(exp.path().join("f")).unwrap(), data);
    assert!(!snapshot(exp.path()).keys().any(|k| k.contains(".fatpipe-")));
}

/// Runs a copy with a tuner that asks for 3 more streams at its 2nd
/// sample and (pulling) switches the server to reno at its 3rd; returns
/// the report, what `add_streams` answered and the samples seen.
fn tuned_copy(
    srv: &TestServer,
    j: &Job,
) -> (
    Report,
    Option<Result<u16, String>>,
    Vec<crate::live::LiveSample>,
) {
    let added = Mutex::new(None);
    let samples = Mutex::new(Vec::new());
    let tuner = |live: &Live| {
        let mut k = 0;
        while !live.sleep(Duration::from_millis(250)) {
            let Some(s) = live.sample() else { continue };
            samples.lock().unwrap().push(s);
            k += 1;
            if k == 2 {
                *added.lock().unwrap() = Some(live.add_streams(3, Duration::from_secs(10)));
            }
            if k == 3 && live.direction() == Direction::Pull {
                live.set_congestion("reno").unwrap();
            }
        }
    };
    let rep = run_client_tuned(&srv.link, j, Arc::default(), &|_| {}, Some(&tuner)).unwrap();
    let a = added.lock().unwrap().clone();
    let s = samples.lock().unwrap().clone();
    (rep, a, s)
}

#[test]
fn streams_added_mid_copy_carry_data_and_the_copy_is_identical() {
    let src = tempfile::tempdir().unwrap();
    let t = src.path().join("t");
    std::fs::create_dir(&t).unwrap();
    std::fs::write(t.join("big"), pseudo_random(24 << 20, 21)).unwrap();
    for i in 0..50 {
        std::fs::write(t.join(format!("s{i}")), pseudo_random(5000 + i, i as u64)).unwrap();
    }
    let exp = tempfile::tempdir().unwrap();
    let srv = server(cfg(vec![export("data", exp.path(), false)]));
    let mut j = job(Direction::Push, "data", &[""]);
    j.local_sources = vec![t.clone()];
    j.streams = 2;
    j.bwlimit = Some(100_000_000); // ~2 s: the streams are added mid-copy
    let (rep, added, samples) = tuned_copy(&srv, &j);
    assert_eq!(added, Some(Ok(3)), "{samples:?}");
    assert_eq!(rep.streams, 5);
    assert!(rep.failures.is_empty(), "{:?}", rep.failures);
    assert_eq!(snapshot(&t), snapshot(&exp.path().join("t")));
    assert_eq!(
        rep.summary.bytes_written,
        (24 << 20) + (0..50).map(|i| 5000 + i).sum::<u64>()
    );
    // Push: the client's own sockets are the senders.
    assert!(samples.iter().all(|s| s.sender.is_some()), "{samples:?}");
    assert!(
        samples.last().is_some_and(|s| s.streams == 5),
        "{samples:?}"
    );
    // Control plus 5 data connections, and the added ones carried data.
    let opened = srv.link.opened.lock().unwrap();
    assert_eq!(opened.len(), 6);
    for s in &opened[3..] {
        let acked = fatpipe_sys::tcp_info(s.tcp())
            .unwrap()
            .bytes_acked
            .unwrap_or(0);
        assert!(acked > 1 << 20, "an added stream moved only {acked} bytes");
    }
    drop(opened);

    // Pull it back the same way: the server sends on the added streams,
    // reports its counters and switches congestion control when asked.
    srv.link.opened.lock().unwrap().clear();
    let back = tempfile::tempdir().unwrap();
    let mut j = job(Direction::Pull, "data", &["t/"]);
    j.local_dest = back.path().join("t");
    j.streams = 2;
    j.bwlimit = Some(100_000_000);
    let (rep, added, samples) = tuned_copy(&srv, &j);
    assert_eq!(added, Some(Ok(3)), "{samples:?}");
    assert_eq!(rep.streams, 5);
    assert_eq!(snapshot(&t), snapshot(&back.path().join("t")));
    let opened = srv.link.opened.lock().unwrap();
    assert_eq!(opened.len(), 6);
    for s in &opened[3..] {
        let got = fatpipe_sys::tcp_info(s.tcp())
            .unwrap()
            .bytes_received
            .unwrap_or(0);
        assert!(got > 1 << 20, "an added stream moved only {got} bytes");
    }
    let stats: Vec<_> = samples.iter().filter_map(|s| s.sender.clone()).collect();
    assert!(stats.iter().any(|s| s.bytes_acked > 0), "{samples:?}");
    assert!(
        stats
            .last()
            .is_some_and(|s| s.streams == 5 && s.congestion == "reno"),
        "{samples:?}"
    );
    let results = srv.results.lock().unwrap();
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
}

#[test]
fn the_server_grants_no_more_than_its_cap() {
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("f"), pseudo_random(8 << 20, 5)).unwrap();
    let exp = tempfile::tempdir().unwrap();
    let srv = server(cfg(vec![export("data", exp.path(), false)]));
    let mut j = job(Direction::Push, "data", &[""]);
    j.local_sources = vec![src.path().join("f")];
    j.streams = MAX_STREAMS - 1;
    j.bwlimit = Some(50_000_000);
    let (rep, added, _) = tuned_copy(&srv, &j);
    assert_eq!(added, Some(Ok(1)));
    assert_eq!(rep.streams, MAX_STREAMS);
    assert_eq!(
        std::fs::read(src.path().join("f")).unwrap(),
        std::fs::read(exp.path().join("f")).unwrap()
    );
}

#[test]
fn escapes_read_only_and_unknown_exports_are_refused() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), b"s").unwrap();
    let exp = tempfile::tempdir().unwrap();
    symlink(outside.path(), exp.path().join("out")).unwrap();
    let ro = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("f"), b"x").unwrap();
    let mut exports = vec![
        export("data", exp.path(), false),
        export("pub", ro.path(), true),
    ];
    exports.push(Export {
        name: "open".into(),
        path: ro.path().to_path_buf(),
        read_only: false,
        public: false,
        encrypted: false,
    });
    let mut c = cfg(exports);
    let srv = server(c.clone());
    let usage = |j: &Job, link: &TestLink| {
        let r = run_client(link, j, Arc::default(), &|_| {});
        // The harness's clones of the client's connections go with it,
        // as the client's own did: the server, draining after its
        // refusal until the client closes, must see the close (kept,
        // each refusal cost its 3 s drain limit: 30 s for this test).
        link.opened.lock().unwrap().clear();
        match r {
            Err(CopyError::Usage(m)) => m,
            other => panic!("expected a usage error, got {other:?}"),
        }
    };
    for dest in ["out/x", "out/", "../x", "/etc/x", "a/../../x"] {
        let mut j = job(Direction::Push, "data", &[dest]);
        j.local_sources = vec![src.path().join("f")];
        let m = usage(&j, &srv.link);
        assert!(
            m.contains("outside") || m.contains("..") || m.contains("absolute"),
            "{dest}: {m}"
        );
    }
    // ("out" itself may be pulled: it is copied as a link, not followed.)
    for path in ["out/secret", "out/", "..", "/etc/passwd"] {
        let mut j = job(Direction::Pull, "data", &[path]);
        j.local_dest = src.path().to_path_buf();
        usage(&j, &srv.link);
    }
    assert!(!outside.path().join("x").exists());
    let mut j = job(Direction::Push, "pub", &[""]);
    j.local_sources = vec![src.path().join("f")];
    assert!(usage(&j, &srv.link).contains("read-only"));
    j.export = "nope".into();
    assert!(usage(&j, &srv.link).contains("no export named 'nope'"));
    drop(srv);
    // Without a key, only public exports are served.
    c.keyed = false;
    let srv = server(c);
    j.export = "open".into();
    assert!(usage(&j, &srv.link).contains("not public"));
    assert!(std::fs::read_dir(ro.path()).unwrap().next().is_none());
}

#[test]
fn thousands_of_small_files() {
    let src = tempfile::tempdir().unwrap();
    for d in 0..10 {
        let dir = src.path().join("many").join(format!("d{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..200 {
            std::fs::write(
                dir.join(format!("f{f}")),
                pseudo_random(1000 + f, (d * 1000 + f) as u64),
            )
            .unwrap();
        }
    }
    let exp = tempfile::tempdir().unwrap();
    let srv = server(cfg(vec![export("data", exp.path(), false)]));
    let mut j = job(Direction::Push, "data", &["dest/"]);
    j.local_sources = vec![src.path().join("many")];
    let rep = run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
    assert_eq!(rep.summary.files_verified, 2000);
    assert_eq!(
        snapshot(&src.path().join("many")),
        snapshot(&exp.path().join("dest/many"))
    );
    let results = srv.results.lock().unwrap();
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
}

#[test]
fn direct_and_sync_writes_are_identical() {
    let src = tempfile::tempdir().unwrap();
    // Aligned chunks go through O_DIRECT, the odd tail through the page cache.
    std::fs::write(src.path().join("f"), pseudo_random(3 * 65536 + 1234, 5)).unwrap();
    let exp = tempfile::tempdir().unwrap();
    let srv = server(cfg(vec![export("data", exp.path(), false)]));
    let mut j = job(Direction::Push, "data", &[""]);
    j.local_sources = vec![src.path().join("f")];
    j.direct = true;
    j.sync = true;
    let rep = run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
    assert_eq!(rep.summary.files_verified, 1);
    assert_eq!(snapshot(src.path()), snapshot(exp.path()));
}

#[test]
fn data_flows_on_the_first_connections_while_a_late_one_is_dialled() {
    // One of three data connections connects only after `LATE`. Half
    // way through that wait, most of the file must have moved (both
    // ends took the first connections as they came), and the copy
    // must complete intact, whichever way it goes.
    const LATE: Duration = Duration::from_secs(4);
    const SIZE: usize = 96 << 20;
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("f"), pseudo_random(SIZE, 9)).unwrap();
    for direction in [Direction::Push, Direction::Pull] {
        let exp = tempfile::tempdir().unwrap();
        let dst = tempfile::tempdir().unwrap();
        let (export_dir, mut j) = match direction {
            Direction::Push => {
                let mut j = job(Direction::Push, "data", &[""]);
                j.local_sources = vec![src.path().join("f")];
                (exp.path(), j)
            }
            Direction::Pull => {
                let mut j = job(Direction::Pull, "data", &["f"]);
                j.local_dest = dst.path().to_path_buf();
                (src.path(), j)
            }
        };
        j.chunk_size = 1 << 20;
        let mut srv = server(cfg(vec![export("data", export_dir, false)]));
        srv.link.slow_tag = Some((2, LATE));
        let progress = Arc::new(Progress::default());
        let watch = {
            let p = Arc::clone(&progress);
            std::thread::spawn(move || {
                std::thread::sleep(LATE / 2);
                p.bytes.load(Ordering::Relaxed)
            })
        };
        let rep = run_client(&srv.link, &j, progress, &|_| {}).unwrap();
        let moved = watch.join().unwrap();
        assert!(
            moved >= SIZE as u64 / 2,
            "{direction:?}: {moved} bytes moved before the late connection"
        );
        assert_eq!(rep.summary.files_verified, 1, "{direction:?}");
        let landed = match direction {
            Direction::Push => exp.path().join("f"),
            Direction::Pull => dst.path().join("f"),
        };
        assert!(
            std::fs::read(src.path().join("f")).unwrap() == std::fs::read(landed).unwrap(),
            "{direction:?}: the copy differs"
        );
    }
}

#[test]
fn a_vanished_source_fails_alone_with_one_line() {
    let src = tempfile::tempdir().unwrap();
    let t = src.path().join("t");
    std::fs::create_dir(&t).unwrap();
    for n in ["a", "b", "c"] {
        std::fs::write(t.join(n), pseudo_random(200_000, 1)).unwrap();
    }
    let exp = tempfile::tempdir().unwrap();
    let mut srv = server(cfg(vec![export("data", exp.path(), false)]));
    // The manifest is taken before connecting; "b" disappears after.
    let gone = t.join("b");
    srv.link.on_connect = Some(Box::new(move || {
        let _ = std::fs::remove_file(&gone);
    }));
    let mut j = job(Direction::Push, "data", &[""]);
    j.local_sources = vec![t.clone()];
    let rep = run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
    assert_eq!(rep.failures.len(), 1, "{:?}", rep.failures);
    assert_eq!(rep.failures[0].path, "t/b");
    assert!(
        rep.failures[0].message.contains("vanished"),
        "{:?}",
        rep.failures
    );
    assert_eq!(rep.summary.files_verified, 2);
    assert!(exp.path().join("t/a").exists() && exp.path().join("t/c").exists());
    assert!(!exp.path().join("t/b").exists());
}

#[test]
fn a_full_disk_fails_that_file_alone_and_a_rerun_completes() {
    if !fatpipe_sys::process::is_root() {
        crate::skip_test("mounting a small tmpfs needs root");
        return;
    }
    let mnt = tempfile::tempdir().unwrap();
    let m = mnt.path().display().to_string();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=3m", "fatpipe-test", &m])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        crate::skip_test("cannot mount tmpfs here");
        return;
    }
    struct Unmount(String);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _u = Unmount(m.clone());
    let src = tempfile::tempdir().unwrap();
    let t = src.path().join("t");
    std::fs::create_dir(&t).unwrap();
    std::fs::write(t.join("fits"), pseudo_random(500_000, 2)).unwrap();
    std::fs::write(t.join("too big"), pseudo_random(5 << 20, 3)).unwrap();
    let srv = server(cfg(vec![export("data", mnt.path(), false)]));
    let mut j = job(Direction::Push, "data", &[""]);
    j.local_sources = vec![t.clone()];
    let rep = run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
    assert_eq!(rep.failures.len(), 1, "{:?}", rep.failures);
    assert_eq!(rep.failures[0].path, "t/too big");
    assert!(
        rep.failures[0].message.contains("no space left"),
        "{:?}",
        rep.failures
    );
    // The kind came over the wire with the message (the server's sink
    // failed the file; the client's source reports it).
    assert!(
        matches!(rep.failures[0].kind, crate::FailureKind::NoSpace { .. }),
        "{:?}",
        rep.failures
    );
    assert!(mnt.path().join("t/fits").exists());
    assert!(
        !mnt.path().join("t/too big").exists(),
        "a partial file has its final name"
    );
    // Preallocation caught it before any byte moved. Free space (grow
    // the tmpfs) and re-run: the file that fitted is skipped.
    let remount = std::process::Command::new("mount")
        .args(["-o", "remount,size=16m", &m])
        .status()
        .is_ok_and(|s| s.success());
    assert!(remount);
    let rep = run_client(&srv.link, &j, Arc::default(), &|_| {}).unwrap();
    assert!(rep.failures.is_empty(), "{:?}", rep.failures);
    assert_eq!(rep.summary.files_skipped, 1);
    assert_eq!(snapshot(&t), snapshot(&mnt.path().join("t")));
}

#[test]
fn export_syntax() {
    let e: Export = "data=/srv/data:ro:public".parse().unwrap();
    assert_eq!(
        e,
        Export {
            name: "data".into(),
            path: "/srv/data".into(),
            read_only: true,
            public: true,
            encrypted: false
        }
    );
    let e: Export = "med=/srv/med:encrypted:ro".parse().unwrap();
    assert!(e.encrypted && e.read_only && !e.public);
    assert_eq!(e.path, PathBuf::from("/srv/med"));
    let e: Export = "x=/a:b".parse().unwrap();
    assert_eq!(e.path, PathBuf::from("/a:b"));
    assert!("noequals".parse::<Export>().is_err());
    assert!("bad name=/x".parse::<Export>().is_err());
    assert!("n=:ro".parse::<Export>().is_err());
}

fn declared_file(path: &str, size: u64) -> Entry {
    Entry {
        path: RelPath::new(path.as_bytes()).unwrap(),
        kind: EntryKind::File {
            size,
            sparse: false,
        },
        mode: 0o644,
        mtime_s: 0,
        mtime_ns: 0,
    }
}

#[test]
fn a_received_manifest_above_2_gib_is_refused_with_one_line() {
    let e = declared_file("some/file", 1);
    let cost = entry_cost(&e);
    let batch = [e.clone(), e.clone()];
    // Exactly at the cap: accepted; one byte over: refused.
    let at = MAX_MANIFEST_BYTES - 2 * cost;
    assert_eq!(add_manifest_cost(at, &batch).unwrap(), MAX_MANIFEST_BYTES);
    for before in [at + 1, MAX_MANIFEST_BYTES, usize::MAX - cost, usize::MAX] {
        let err = add_manifest_cost(before, &batch).unwrap_err().to_string();
        assert_eq!(
            err, "the manifest is larger than 2048 MiB (the receiver's bound)",
            "{before}"
        );
        assert!(!err.contains('\n'));
    }
    assert_eq!(add_manifest_cost(5, &[]).unwrap(), 5);
}

#[test]
fn a_received_manifest_above_2_pow_26_chunks_is_refused_with_one_line() {
    let mib = 1u32 << 20;
    let cap = MAX_SESSION_CHUNKS * u64::from(mib);
    // Exactly 2^26 chunks over two files: accepted.
    let at = [
        declared_file("a", cap - u64::from(mib)),
        declared_file("b", 1),
    ];
    assert_eq!(check_session_chunks(&at, mib).unwrap(), MAX_SESSION_CHUNKS);
    // One byte more starts one chunk more: refused.
    let over = [
        declared_file("a", cap - u64::from(mib) + 1),
        declared_file("b", 1),
    ];
    let err = check_session_chunks(&over, mib).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "the manifest holds {} chunks, more than the receiver's bound of {} \
             (at 1 MiB per chunk); use larger chunks or copy less at once",
            MAX_SESSION_CHUNKS + 1,
            MAX_SESSION_CHUNKS
        )
    );
    // Declared sizes of u64::MAX, and a chunk size of 0 or 1: the sum
    // saturates and is refused, never wraps to something small.
    let huge = [declared_file("a", u64::MAX), declared_file("b", u64::MAX)];
    for chunk in [0, 1, mib, u32::MAX] {
        let err = check_session_chunks(&huge, chunk).unwrap_err().to_string();
        assert!(err.starts_with("the manifest holds "), "{err}");
        assert!(!err.contains('\n'));
    }
    assert_eq!(check_session_chunks(&[], 0).unwrap(), 0);
}

#[test]
fn a_ticket_session_copies_only_its_granted_file_and_direction() {
    let exp = tempfile::tempdir().unwrap();
    std::fs::write(exp.path().join("granted"), b"the granted file").unwrap();
    std::fs::write(exp.path().join("other"), b"another file").unwrap();
    let mut c = cfg(vec![export("data", exp.path(), false)]);
    c.grant = Some(crate::grant::Grant {
        direction: Direction::Pull,
        export: "data".into(),
        path: b"granted".to_vec(),
    });
    let srv = server(c);
    let back = tempfile::tempdir().unwrap();
    let quiet = |_: &str| {};
    for (what, dir, path) in [
        ("another file", Direction::Pull, "other"),
        ("the other direction", Direction::Push, "granted"),
    ] {
        let mut j = job(dir, "data", &[path]);
        j.recursive = false;
        j.local_dest = back.path().join("x");
        j.local_sources = vec![exp.path().join("other")];
        match run_client(&srv.link, &j, Arc::default(), &quiet) {
            Err(CopyError::Usage(m)) => {
                assert!(m.contains("ticket grants only reading data/granted"), "{m}")
            }
            other => panic!("{what} must be refused, got {other:?}"),
        }
    }
    let mut j = job(Direction::Pull, "data", &["granted"]);
    j.recursive = false;
    j.local_dest = back.path().join("got");
    run_client(&srv.link, &j, Arc::default(), &quiet).unwrap();
    assert_eq!(
        std::fs::read(back.path().join("got")).unwrap(),
        b"the granted file"
    );
}
