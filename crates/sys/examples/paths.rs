//! Compares the stream paths of fatpipe-sys on one loopback TCP connection:
//! which send path (plain `write`, `sendfile` from a pattern memfd,
//! `MSG_ZEROCOPY`) and which receive path (`read` into a buffer, `MSG_TRUNC`
//! discard) moves the most bytes per second and per CPU second.
//!
//! Not a test and not the benchmark against peers (that is
//! `bench/vs-iperf.sh`); a quick way to see what this kernel rewards before
//! choosing data-plane defaults.
//!
//! `cargo run --release -p fatpipe-sys --example paths [SECONDS] [BLOCK]`

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fatpipe_sys::{pattern_memfd, sendfile, CpuSample, Discarder, IoPath, ZeroCopySender};

#[derive(Clone, Copy, Debug)]
enum Send {
    Write,
    Sendfile,
    Zerocopy,
}

#[derive(Clone, Copy, Debug)]
enum Recv {
    Read,
    Trunc,
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let secs: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let block: usize = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(128 * 1024);
    println!(
        "{:<10} {:<6} {:>10} {:>9} {:>9}  paths",
        "send", "recv", "Gbit/s", "cpu %", "Gbit/cpu"
    );
    for (s, r) in [
        (Send::Write, Recv::Read),
        (Send::Write, Recv::Trunc),
        (Send::Sendfile, Recv::Read),
        (Send::Sendfile, Recv::Trunc),
        (Send::Zerocopy, Recv::Trunc),
    ] {
        run(s, r, Duration::from_secs_f64(secs), block)?;
    }
    Ok(())
}

fn run(s: Send, r: Recv, dur: Duration, block: usize) -> std::io::Result<()> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let receiver = std::thread::spawn(move || -> std::io::Result<(u64, IoPath)> {
        let (mut sock, _) = l.accept()?;
        let mut total = 0u64;
        let mut path = IoPath::Copy;
        match r {
            Recv::Read => {
                let mut buf = vec![0u8; block];
                loop {
                    let n = sock.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    total += n as u64;
                }
            }
            Recv::Trunc => {
                let mut d = Discarder::new();
                loop {
                    let t = d.recv(&sock, 1 << 20)?;
                    if t.bytes == 0 {
                        break;
                    }
                    path = t.path;
                    total += t.bytes as u64;
                }
            }
        }
        Ok((total, path))
    });
    let mut sock = TcpStream::connect(addr)?;
    let memfd = pattern_memfd(block * 8)?;
    let payload: Arc<[u8]> = vec![0x5au8; block].into();
    let mut zc = ZeroCopySender::new(&sock, payload.clone(), 64);
    let cpu0 = CpuSample::now()?;
    let start = Instant::now();
    let mut sent = 0u64;
    let mut spath = IoPath::Copy;
    let mut off = 0u64;
    while start.elapsed() < dur {
        let n = match s {
            Send::Write => {
                sock.write_all(&payload)?;
                block
            }
            Send::Sendfile => {
                if off >= (block * 8) as u64 {
                    off = 0;
                }
                let t = sendfile(&sock, &memfd, &mut off, block)?;
                spath = t.path;
                t.bytes
            }
            Send::Zerocopy => {
                let t = zc.send(&sock, 0, block)?;
                spath = t.path;
                t.bytes
            }
        };
        sent += n as u64;
    }
    if let Send::Zerocopy = s {
        zc.finish(&sock, Duration::from_secs(2))?;
    }
    drop(sock);
    let (got, rpath) = receiver.join().expect("receiver thread")?;
    let wall = start.elapsed().as_secs_f64();
    let cpu = CpuSample::now()?.utilisation_since(&cpu0);
    let gbit = got as f64 * 8.0 / wall / 1e9;
    assert_eq!(got, sent, "receiver must count every byte sent");
    println!(
        "{:<10} {:<6} {:>10.2} {:>9.0} {:>9.2}  {spath}/{rpath}",
        format!("{s:?}"),
        format!("{r:?}"),
        gbit,
        cpu.total_pct,
        gbit / (cpu.total_pct / 100.0)
    );
    Ok(())
}
