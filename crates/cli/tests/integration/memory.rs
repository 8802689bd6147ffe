//! What a peer can make the server hold in memory (issue 34): many long
//! sending streams share one payload pattern, so the server's RSS no
//! longer grows with streams × `-l`, and the server keeps serving others.
//!
//! The server is the real binary on loopback; its memory is read from
//! `/proc/PID/status` (`VmHWM`, the peak resident set, so no sample can
//! miss the worst moment) and its pattern memory files from `/proc/PID/fd`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use fatpipe_schema::test::{TestEnd, TestReport, TestStreamLine};

use crate::util::{assert_exit, run, setup, spawn_server, Dir, Guard};
use crate::util::{have, json, mkdir, random_file, skip};

/// Streams of the big test: the issue's 1,024 (the session's cap).
const STREAMS: u32 = 1024;

/// Stock iperf3 clients of 128 streams each beside it.
const IPERF3_CLIENTS: usize = 20;

/// What the server's resident set may grow by under it.
const RSS_BOUND_KIB: u64 = 256 * 1024;

/// Longest a test here waits for anything.
const DEADLINE: Duration = Duration::from_secs(120);

#[test]
fn issue_34_a_peers_long_streams_do_not_choose_the_servers_memory() {
    // The issue's load: `test -R -P 1024 -l 16M` (each sending stream had
    // its own 16 MiB pattern: 16 GiB) and 20 stock `iperf3 -c -P 128` at
    // once (2,560 more streams on the iperf3 port), while another client
    // runs a test of its own.
    let dir = setup();
    let (srv, port, iperf3_port) = server_with_iperf3(&dir);
    let pid = srv.0.id();
    let before = status(pid, "VmRSS:");
    let streams = STREAMS.to_string();
    let big = Client::spawn(&dir, port, &["-R", "-P", &streams, "-l", "16M", "-t", "4"]);
    // Once the big test reports its first interval every stream is
    // attached and sending; the others come then.
    big.next_interval();
    let iperf3: Vec<Guard> = (0..IPERF3_CLIENTS)
        .map(|_| {
            let child = Command::new("iperf3")
                .args(["-c", "127.0.0.1", "-p", &iperf3_port.to_string()])
                .args(["-P", "128", "-t", "2", "--connect-timeout", "60000"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn iperf3 -c (test.sh installs iperf3)");
            Guard(child)
        })
        .collect();
    let small = run(&mut test_cmd(&dir, port, &["-t", "1", "--json"]));
    assert_exit(&small, 0);
    let small: TestReport = serde_json::from_slice(&small.stdout).expect("small report");
    assert!(small.end.sums[0].bytes > 0, "the other client moved data");
    for (i, mut c) in iperf3.into_iter().enumerate() {
        let status = c.0.wait().expect("wait for iperf3 -c");
        let mut err = String::new();
        if let Some(mut e) = c.0.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        if !status.success() {
            let log = std::fs::read_to_string(dir.path().join(SERVER_LOG)).unwrap_or_default();
            let said: Vec<&str> = log.lines().filter(|l| !l.contains(" = ")).collect();
            panic!(
                "iperf3 client {i} exited {status}: {err}\nthe server said:\n{}",
                said.join("\n")
            );
        }
    }
    let end = big.end();
    let peak = status(pid, "VmHWM:");
    let grew = peak.saturating_sub(before);
    eprintln!("server RSS: {before} KiB before, peak {peak} KiB: grew {grew} KiB");
    assert!(
        grew <= RSS_BOUND_KIB,
        "the server's RSS grew by {grew} KiB (bound {RSS_BOUND_KIB} KiB)"
    );
    assert_eq!(end.streams.len(), STREAMS as usize);
    assert!(end.sums[0].bytes > 0);
}

#[test]
fn issue_34_udp_senders_batches_come_from_the_budget() {
    // Each UDP sender fills a batch of datagrams of its own (each carries
    // its sequence number); 32 of 65,507 B were 2 MiB a stream, 2 GiB for
    // 1,024. Now the batches come from the process's bounded budget.
    let dir = setup();
    let (srv, port) = server(&dir);
    let pid = srv.0.id();
    let before = status(pid, "VmRSS:");
    let streams = STREAMS.to_string();
    let big = Client::spawn(
        &dir,
        port,
        &["-u", "-R", "-P", &streams, "-l", "65507", "-t", "2"],
    );
    let end = big.end();
    let peak = status(pid, "VmHWM:");
    let grew = peak.saturating_sub(before);
    eprintln!("server RSS: {before} KiB before, peak {peak} KiB: grew {grew} KiB");
    assert!(
        grew <= RSS_BOUND_KIB,
        "the server's RSS grew by {grew} KiB (bound {RSS_BOUND_KIB} KiB)"
    );
    assert_eq!(end.streams.len(), STREAMS as usize);
}

#[test]
fn issue_34_zero_copy_streams_share_one_pattern_file() {
    let dir = setup();
    let (srv, port) = server(&dir);
    let pid = srv.0.id();
    let big = Client::spawn(
        &dir,
        port,
        &["-R", "-Z", "-P", "64", "-l", "16M", "-t", "2"],
    );
    // Each sending stream used to make a memory file of its own (64 here,
    // 16 MiB each); look at every interval, while they all send.
    let mut most = 0;
    for _ in 0..3 {
        big.next_interval();
        most = most.max(pattern_files(pid));
    }
    big.end();
    assert!(most > 0, "never saw the pattern file");
    assert!(
        most <= fatpipe_engine::dataplane::payload::FILE_STRIPES,
        "{most} pattern memory files open at once"
    );
}

#[test]
fn issue_34_a_thousand_streams_each_way_run_on_a_few_threads_and_all_move_data() {
    // A thread per stream ran 1,026 client and 1,029 server threads for
    // `test -P 1024` (twice that with --bidir) and left a tenth of the
    // streams with no byte. On the runner each process has one I/O thread
    // per core, whatever the stream count.
    let dir = setup();
    let (srv, port) = server(&dir);
    let server_pid = srv.0.id();
    let streams = STREAMS.to_string();
    let big = Client::spawn(&dir, port, &["--bidir", "-P", &streams, "-t", "3"]);
    let client_pid = big.guard.0.id();
    // From the start: the set-up (2,048 connections dialled, attached) too.
    let peak = Peak::watch(&[client_pid, server_pid]);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let bound = 4 * cores + 16;
    // Read at every interval line: data flows then, every stream attached.
    let mut most = (0, 0);
    let end = loop {
        match big.next() {
            TestStreamLine::Interval(_) => {
                let (c, s) = (
                    status(client_pid, "Threads:"),
                    status(server_pid, "Threads:"),
                );
                eprintln!("threads: client {c}, server {s}");
                most = (most.0.max(c), most.1.max(s));
            }
            TestStreamLine::End(end) => break big.end_after_end(end),
            _ => {}
        }
    };
    assert!(most.0 > 0 && most.1 > 0, "no interval seen");
    assert!(
        most.0 <= bound && most.1 <= bound,
        "threads: client {}, server {} (bound 4 x {cores} cores + 16 = {bound})",
        most.0,
        most.1
    );
    peak.end().within(bound);
    assert_eq!(end.streams.len(), 2 * STREAMS as usize);
    let bytes: Vec<u64> = end.streams.iter().map(|s| s.bytes).collect();
    let mean = bytes.iter().sum::<u64>() / bytes.len() as u64;
    let min = bytes.iter().copied().min().unwrap_or(0);
    eprintln!("per-stream bytes: min {min}, mean {mean}");
    let idle: Vec<_> = end
        .streams
        .iter()
        .filter(|s| s.bytes == 0)
        .map(|s| s.id)
        .collect();
    assert!(idle.is_empty(), "streams that moved nothing: {idle:?}");
}

#[test]
fn issue_34_encrypted_test_streams_run_on_the_same_few_threads_and_all_move_data() {
    // An encrypted stream had a thread of its own at each end (its record
    // layer driven by blocking reads and writes): `test --encrypt -P 256
    // --bidir` was over 512 threads per process. On the runner it is as
    // few as a plain test's.
    let dir = setup();
    let key = dir.path().join("key");
    crate::util::write_key(&key, "encrypted-test-key-0123456789\n");
    let mut cmd = dir.cmd();
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0", "--quiet"])
        .arg("--key-file")
        .arg(&key);
    let (srv, port) = spawn_server(cmd);
    let server_pid = srv.0.id();
    let key = key.to_string_lossy().into_owned();
    let args = ["--encrypt", "--key-file", &key, "--no-auto"];
    let big = Client::spawn(
        &dir,
        port,
        &[&args[..], &["--bidir", "-P", "256", "-t", "3"]].concat(),
    );
    let client_pid = big.guard.0.id();
    // From the start: 512 TLS handshakes at set-up.
    let peak = Peak::watch(&[client_pid, server_pid]);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let bound = 4 * cores + 16;
    let mut most = (0, 0);
    let end = loop {
        match big.next() {
            TestStreamLine::Interval(_) => {
                let (c, s) = (
                    status(client_pid, "Threads:"),
                    status(server_pid, "Threads:"),
                );
                eprintln!("threads: client {c}, server {s}");
                most = (most.0.max(c), most.1.max(s));
            }
            TestStreamLine::End(end) => break big.end_after_end(end),
            _ => {}
        }
    };
    assert!(most.0 > 0 && most.1 > 0, "no interval seen");
    assert!(
        most.0 <= bound && most.1 <= bound,
        "threads: client {}, server {} (bound 4 x {cores} cores + 16 = {bound})",
        most.0,
        most.1
    );
    peak.end().within(bound);
    assert_eq!(end.streams.len(), 512);
    let bytes: Vec<u64> = end.streams.iter().map(|s| s.bytes).collect();
    let mean = bytes.iter().sum::<u64>() / bytes.len() as u64;
    let min = bytes.iter().copied().min().unwrap_or(0);
    eprintln!("per-stream bytes: min {min}, mean {mean}");
    let idle: Vec<_> = end
        .streams
        .iter()
        .filter(|s| s.bytes == 0)
        .map(|s| s.id)
        .collect();
    assert!(idle.is_empty(), "streams that moved nothing: {idle:?}");
}

#[test]
fn issue_34_stock_iperf3_streams_run_on_the_servers_few_threads() {
    // iperf3's port gave every stream a thread (2 MiB stack reserved):
    // `iperf3 -c -P 128 --bidir` was 256 threads. On the runner the
    // server keeps its few threads.
    let dir = setup();
    let (srv, _, port) = server_with_iperf3(&dir);
    let mut client = Command::new("iperf3")
        .args(["-c", "127.0.0.1", "-p", &port.to_string()])
        .args([
            "-P",
            "128",
            "--bidir",
            "-t",
            "3",
            "-i",
            "0.5",
            "--forceflush",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn iperf3 -c (test.sh installs iperf3)");
    let out = client.stdout.take().expect("iperf3 stdout");
    let client = Guard(client);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let bound = 4 * cores + 16;
    // Each interval's sum line is printed while data flows.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let (mut most, mut intervals) = (0, 0);
    while let Ok(line) = rx.recv_timeout(DEADLINE) {
        if line.starts_with("[SUM]") && line.contains("sec") && !line.contains("sender") {
            let t = status(srv.0.id(), "Threads:");
            eprintln!("server threads: {t}  ({line})");
            most = most.max(t);
            intervals += 1;
        }
        if line.contains("iperf Done") {
            break;
        }
    }
    let mut client = client;
    let status = client.0.wait().expect("wait for iperf3 -c");
    assert!(status.success(), "iperf3 -c exited {status}");
    assert!(intervals > 0, "no interval line from iperf3 -c");
    assert!(
        most <= bound,
        "the server ran {most} threads (bound 4 x {cores} cores + 16 = {bound})"
    );
}

#[test]
fn issue_34_a_256_stream_copy_runs_on_a_few_threads_each_end_and_every_stream_moves_data() {
    // A thread per data connection (2 MiB stacks reserved) ran about 200
    // client and 280 server threads for `copy -P 256`. On the runner each
    // end has its few I/O threads and the blocking pool, whatever the
    // stream count, and every connection moves data.
    copy_256(false);
}

#[test]
fn issue_34_an_encrypted_256_stream_copy_runs_on_the_same_few_threads() {
    // TLS streams are the same tasks: the record layer works on a
    // non-blocking socket (a write that would block keeps what it sealed).
    copy_256(true);
}

#[test]
fn issue_34_a_256_stream_pull_sets_up_on_a_few_threads_each_end() {
    copy_256_pull(false);
}

#[test]
fn issue_34_an_encrypted_256_stream_pull_sets_up_on_a_few_threads_each_end() {
    copy_256_pull(true);
}

#[test]
fn issue_34_a_pull_at_a_tiny_rate_cap_does_not_hold_the_servers_disk_threads() {
    // A pulling client's --bwlimit is the server's sender's rate cap. The
    // server's streams share one blocking pool for their disk work: a cap
    // that slept there would hold its few threads and stall every other
    // session. A capped stream sleeps on the runner's timer instead.
    let dir = setup();
    let exp = mkdir(&dir.path().join("export"));
    random_file(&exp.join("slow.bin"), 32 << 20, 1);
    random_file(&exp.join("fast.bin"), 64 << 20, 2);
    let mut cmd = dir.cmd();
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0", "--quiet"])
        .arg("--export")
        .arg(format!("data={}:public", exp.display()));
    let (_srv, port) = spawn_server(cmd);
    let pull = |name: &str, to: &std::path::Path, extra: &[&str]| {
        let mut c = dir.cmd();
        c.args(["copy", "--port", &port.to_string(), "--json", "--no-auto"])
            .args(extra)
            .arg(format!("127.0.0.1:data/{name}"))
            .arg(to);
        c
    };
    let slow_to = mkdir(&dir.path().join("slow"));
    let mut slow = pull(
        "slow.bin",
        &slow_to,
        &["-P", "64", "--chunk-size", "64K", "--bwlimit", "2m"],
    );
    slow.stdout(Stdio::null()).stderr(Stdio::null());
    let _slow = Guard(slow.spawn().expect("spawn the capped pull"));
    // It is under way once its part file exists.
    crate::util::wait_for(DEADLINE, "the capped pull's first chunk", || {
        std::fs::read_dir(&slow_to).is_ok_and(|mut d| d.next().is_some())
    });
    let fast_to = mkdir(&dir.path().join("fast"));
    let started = std::time::Instant::now();
    let out = crate::util::run_within(
        &mut pull("fast.bin", &fast_to, &["-P", "4"]),
        Duration::from_secs(60),
    );
    let took = started.elapsed();
    assert_exit(&out, 0);
    assert_eq!(
        std::fs::read(exp.join("fast.bin")).ok(),
        std::fs::read(fast_to.join("fast.bin")).ok()
    );
    eprintln!("64 MiB pulled beside a 2 Mbit/s pull in {took:?}");
    // 32 MiB at 2 Mbit/s takes over two minutes: the other pull must not
    // wait for it.
    assert!(
        took < Duration::from_secs(20),
        "a pull beside a capped one took {took:?}"
    );
}

/// `copy -P 256` of 256 MiB into a server's export, with `--encrypt` or
/// not: both ends' threads while data flows within 4 x cores + 16, every
/// data connection moving at least a chunk, the copy whole.
fn copy_256(encrypt: bool) {
    if !have("ss") {
        skip("ss (iproute2) is not installed: test.sh installs it");
        return;
    }
    let dir = setup();
    let src = mkdir(&dir.path().join("src"));
    let exp = mkdir(&dir.path().join("export"));
    let size: u64 = 256 << 20;
    random_file(&src.join("f.bin"), size, 34);
    let key = dir.path().join("key");
    crate::util::write_key(&key, "copy-256-test-key-0123456789\n");
    let mut cmd = dir.cmd();
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0", "--quiet"])
        .arg("--key-file")
        .arg(&key)
        .arg("--export")
        .arg(format!("data={}", exp.display()));
    let (srv, port) = spawn_server(cmd);
    let server_pid = srv.0.id();
    // 64 KiB chunks (4,096 of them) so that every stream has work at
    // once; capped at 500 Mbit/s so that the copy lasts a few seconds.
    let mut copy = dir.cmd();
    copy.args(["copy", "--port", &port.to_string(), "--json", "-P", "256"])
        .args(["--chunk-size", "64K", "--bwlimit", "500m"])
        .arg("--key-file")
        .arg(&key)
        .args(encrypt.then_some("--encrypt"))
        .arg(src.join("f.bin"))
        .arg("127.0.0.1:data/")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let client = Guard(copy.spawn().expect("spawn fatpipe copy"));
    let client_pid = client.0.id();
    // From the start: the set-up dialled 256 connections (with a thread
    // each in flight, up to 32, before the dialer).
    let peak = Peak::watch(&[client_pid, server_pid]);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let bound = 4 * cores + 16;
    // Data flows on every connection once the server attached each: it
    // received its acknowledgement, the only bytes a pushing data
    // connection receives (so the set-up's dialing, handshake and attach
    // threads are ending), and had 256 KiB acknowledged. From then on
    // each end's threads are read. Each connection's acknowledged bytes
    // (from ss, by the client's port) are kept throughout.
    let until = std::time::Instant::now() + DEADLINE;
    let mut acked: std::collections::HashMap<String, u64> = Default::default();
    let (mut most, mut samples) = ((0, 0), 0);
    while status(client_pid, "Threads:") > 0 {
        assert!(std::time::Instant::now() < until, "the copy did not end");
        let conns = ss_acked(port);
        let flowing = conns
            .iter()
            .filter(|c| c.1 >= 256 * 1024 && c.2 > 0)
            .count()
            >= 256;
        for (local, n, _) in &conns {
            let e = acked.entry(local.clone()).or_default();
            *e = (*e).max(*n);
        }
        if flowing || samples > 0 {
            let (c, s) = (
                status(client_pid, "Threads:"),
                status(server_pid, "Threads:"),
            );
            if c > 0 {
                most = (most.0.max(c), most.1.max(s));
                samples += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
        if client_exited(&client) {
            break;
        }
    }
    let out = client.wait();
    let peak = peak.end();
    assert_exit(&out, 0);
    let j = json(&out);
    assert_eq!(j["files_verified"], 1, "{j}");
    assert_eq!(j["streams"], 256, "{j}");
    assert_eq!(j["encryption"].is_object(), encrypt, "{j}");
    assert_eq!(
        std::fs::read(src.join("f.bin")).ok(),
        std::fs::read(exp.join("f.bin")).ok(),
        "the copy differs from its source"
    );
    eprintln!(
        "threads while data flowed ({samples} samples): client {}, server {} (bound {bound})",
        most.0, most.1
    );
    peak.within(bound);
    assert!(samples > 0, "never saw every connection moving data");
    assert!(
        most.0 <= bound && most.1 <= bound,
        "threads: client {}, server {} (bound 4 x {cores} cores + 16 = {bound})",
        most.0,
        most.1
    );
    // The copy-control connection moves a few messages; each data
    // connection at least one 64 KiB chunk.
    let mut moved: Vec<u64> = acked.values().copied().collect();
    moved.sort_unstable();
    let data = &moved[moved.len().saturating_sub(256)..];
    let mean = data.iter().sum::<u64>() / data.len().max(1) as u64;
    eprintln!(
        "connections seen: {}; the 256 largest moved min {} B, mean {mean} B",
        moved.len(),
        data.first().copied().unwrap_or(0)
    );
    assert_eq!(data.len(), 256, "saw {} connections", moved.len());
    assert!(
        data[0] >= 64 * 1024,
        "a data connection moved only {} bytes (mean {mean})",
        data[0]
    );
}

/// `copy -P 256` pulling 64 MiB from a server's export, with `--encrypt`
/// or not: each end's thread peak from the client's start to its exit
/// (the set-up dials, handshakes and waits for 256 acknowledgements)
/// within 4 x cores + 16, the copy whole.
fn copy_256_pull(encrypt: bool) {
    let dir = setup();
    let exp = mkdir(&dir.path().join("export"));
    let to = mkdir(&dir.path().join("to"));
    random_file(&exp.join("f.bin"), 64 << 20, 35);
    let key = dir.path().join("key");
    crate::util::write_key(&key, "copy-256-pull-key-0123456789\n");
    let mut cmd = dir.cmd();
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0", "--quiet"])
        .arg("--key-file")
        .arg(&key)
        .arg("--export")
        .arg(format!("data={}", exp.display()));
    let (srv, port) = spawn_server(cmd);
    let mut copy = dir.cmd();
    copy.args(["copy", "--port", &port.to_string(), "--json", "-P", "256"])
        .args(["--chunk-size", "64K", "--no-auto"])
        .arg("--key-file")
        .arg(&key)
        .args(encrypt.then_some("--encrypt"))
        .arg("127.0.0.1:data/f.bin")
        .arg(&to)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let client = Guard(copy.spawn().expect("spawn fatpipe copy"));
    let peak = Peak::watch(&[client.0.id(), srv.0.id()]);
    let until = std::time::Instant::now() + DEADLINE;
    while !client_exited(&client) {
        assert!(std::time::Instant::now() < until, "the pull did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = client.wait();
    let peak = peak.end();
    assert_exit(&out, 0);
    let j = json(&out);
    assert_eq!(j["streams"], 256, "{j}");
    assert_eq!(j["encryption"].is_object(), encrypt, "{j}");
    assert_eq!(
        std::fs::read(exp.join("f.bin")).ok(),
        std::fs::read(to.join("f.bin")).ok(),
        "the copy differs from its source"
    );
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    peak.within(4 * cores + 16);
}

/// The most threads each of some processes ran, sampled from
/// `/proc/PID/status` every millisecond on a thread of its own from
/// [`Peak::watch`] to [`Peak::end`]: set-up included, where a thread per
/// connection being dialled made the peak.
struct Peak {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    watcher: std::thread::JoinHandle<Vec<u64>>,
}

/// What [`Peak::end`] found: each process's most threads, in order.
struct Peaks(Vec<u64>);

impl Peak {
    fn watch(pids: &[u32]) -> Peak {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (pids, halt) = (pids.to_vec(), std::sync::Arc::clone(&stop));
        let watcher = std::thread::spawn(move || {
            let mut most = vec![0; pids.len()];
            while !halt.load(std::sync::atomic::Ordering::Relaxed) {
                for (m, &pid) in most.iter_mut().zip(&pids) {
                    *m = (*m).max(status(pid, "Threads:"));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            most
        });
        Peak { stop, watcher }
    }

    fn end(self) -> Peaks {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        Peaks(self.watcher.join().expect("the thread watcher"))
    }
}

impl Peaks {
    /// Asserts each peak (client first, then server) is at most `bound`.
    fn within(&self, bound: u64) {
        eprintln!("thread peaks from the start (client, server): {:?}", self.0);
        assert!(self.0.iter().all(|&n| n > 0), "never sampled: {:?}", self.0);
        assert!(
            self.0.iter().all(|&n| n <= bound),
            "thread peaks (client, server) {:?} over 4 x cores + 16 = {bound}",
            self.0
        );
    }
}

/// A copy client beside the test.
impl Guard {
    fn wait(mut self) -> std::process::Output {
        let mut out = std::process::Output {
            status: self.0.wait().expect("wait for the copy"),
            stdout: Vec::new(),
            stderr: Vec::new(),
        };
        use std::io::Read;
        if let Some(mut o) = self.0.stdout.take() {
            let _ = o.read_to_end(&mut out.stdout);
        }
        if let Some(mut e) = self.0.stderr.take() {
            let _ = e.read_to_end(&mut out.stderr);
        }
        out
    }
}

fn client_exited(g: &Guard) -> bool {
    // Zombie or gone: /proc says so without reaping it.
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", g.0.id())).unwrap_or_default();
    stat.is_empty() || stat.contains(") Z ")
}

/// Established connections to `port` (seen from the client's side), the
/// bytes each had acknowledged and received, from `ss -tin`.
fn ss_acked(port: u16) -> Vec<(String, u64, u64)> {
    let out = Command::new("ss")
        .args(["-Htin", "state", "established"])
        .arg(format!("( dport = :{port} )"))
        .output()
        .expect("run ss");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut conns = Vec::new();
    let mut local = None;
    for line in text.lines() {
        if line.contains("bytes_acked:") {
            let field = |name: &str| -> u64 {
                line.split(name)
                    .nth(1)
                    .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
                    .unwrap_or(0)
            };
            if let Some(l) = local.take() {
                conns.push((l, field("bytes_acked:"), field("bytes_received:")));
            }
        } else if let Some(addr) = line
            .split_whitespace()
            .find(|t| t.starts_with("127.0.0.1:") && !t.ends_with(&format!(":{port}")))
        {
            local = Some(addr.to_string());
        }
    }
    conns
}

/// Starts `fatpipe server --port 0` (no key: anyone may test).
fn server(dir: &Dir) -> (Guard, u16) {
    let mut cmd = dir.cmd();
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0", "--quiet"]);
    spawn_server(cmd)
}

/// Where [`server_with_iperf3`] writes the server's stderr.
const SERVER_LOG: &str = "server.log";

/// Starts `fatpipe server` with its iperf3 port: (server, fatpipe port,
/// iperf3 port).
fn server_with_iperf3(dir: &Dir) -> (Guard, u16, u16) {
    let mut cmd = dir.cmd();
    cmd.args(["server", "--bind", "127.0.0.1", "--port", "0"])
        .args(["--iperf3-port", "0"])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.path().join(SERVER_LOG)).expect("server log"));
    let mut child = cmd.spawn().expect("spawn fatpipe server");
    let stdout = child.stdout.take().expect("server stdout");
    let srv = Guard(child);
    let mut lines = BufReader::new(stdout).lines();
    let mut port = |prefix: &str| -> u16 {
        let line = lines.next().and_then(|l| l.ok()).unwrap_or_default();
        line.strip_prefix(prefix)
            .and_then(|a| a.rsplit_once(':'))
            .and_then(|(_, p)| p.parse().ok())
            .unwrap_or_else(|| panic!("expected {prefix:?}, got {line:?}"))
    };
    let fatpipe = port("listening on ");
    let iperf3 = port("iperf3 listening on ");
    (srv, fatpipe, iperf3)
}

fn test_cmd(dir: &Dir, port: u16, args: &[&str]) -> Command {
    let mut cmd = dir.cmd();
    cmd.arg("test").arg(format!("127.0.0.1:{port}")).args(args);
    cmd
}

/// A `fatpipe test --json-stream` running beside the test, its lines
/// read on a thread so every wait has a deadline; killed (by PID) and
/// reaped when dropped.
struct Client {
    guard: Guard,
    lines: mpsc::Receiver<TestStreamLine>,
}

impl Client {
    fn spawn(dir: &Dir, port: u16, args: &[&str]) -> Client {
        let mut child = test_cmd(dir, port, args)
            .args(["--json-stream", "-i", "0.5"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn fatpipe test");
        let stdout = child.stdout.take().expect("client stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                let parsed = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
                if tx.send(parsed).is_err() {
                    return;
                }
            }
        });
        Client {
            guard: Guard(child),
            lines,
        }
    }

    fn next(&self) -> TestStreamLine {
        self.lines
            .recv_timeout(DEADLINE)
            .expect("the test printed nothing more before the deadline (or exited early)")
    }

    /// Waits for the next interval line.
    fn next_interval(&self) {
        loop {
            match self.next() {
                TestStreamLine::Interval(_) => return,
                TestStreamLine::End(_) => panic!("the test ended before an interval"),
                _ => {}
            }
        }
    }

    /// Waits for the end record and the exit (which must be 0).
    fn end(mut self) -> TestEnd {
        loop {
            if let TestStreamLine::End(end) = self.next() {
                self.exited_ok();
                return end;
            }
        }
    }

    /// The end record was read (`end`): waits for the exit (which must be 0).
    fn end_after_end(mut self, end: TestEnd) -> TestEnd {
        self.exited_ok();
        end
    }

    fn exited_ok(&mut self) {
        let status = self.guard.0.wait().expect("wait for fatpipe test");
        assert!(status.success(), "fatpipe test exited {status}");
    }
}

/// A field of `/proc/PID/status` (KiB for memory, a count for threads).
fn status(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Pattern memory files the process holds open.
fn pattern_files(pid: u32) -> usize {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|t| t.to_string_lossy().contains("fatpipe-pattern"))
        .count()
}
