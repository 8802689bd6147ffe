//! The server half of the probe: a [`Service`] that answers echoes and MTU
//! probes and timestamps packet trains on a UDP socket of its own.
//!
//! Two threads per session: the session thread answers probes on the UDP
//! socket and records train arrivals, and a helper thread runs the control
//! channel (answering `Collect`, ending on `Done`, an idle limit or the
//! server's shutdown). UDP is used for everything timed because TCP's
//! acknowledgements, retransmissions and coalescing would blur exactly what
//! is being measured.
//!
//! The UDP socket answers only the address that proved the session's cookie
//! in a `Hello`, and only with small replies (echoes and acknowledgements are
//! never larger than what they answer), so it cannot be used to reflect or
//! amplify traffic toward a third party. What it stores is capped by
//! [`MAX_TRAINS`] × [`MAX_TRAIN_LEN`] arrivals, and the session by
//! [`SESSION_LIMIT`].
//!
//! A reverse session (the client asked with `ProbeParams { reverse: true }`)
//! sends trains instead of timing them. It sends only what the client asks
//! on the authenticated control channel with the random token that went to
//! the hello's UDP address (proof that the asker receives there), each
//! train number once and within [`REVERSE_BUDGET`] bytes per session; the
//! control thread sends them on the UDP socket, connected to that address.

use std::collections::BTreeMap;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fatpipe_engine::{Control, ServerSession, Service, ServiceResult, Shutdown};

use crate::wire::{
    ArrivalWire, Packet, ProbeMsg, ProbeParams, MAX_DATAGRAM, MAX_TRAINS, MAX_TRAIN_LEN,
    REVERSE_BUDGET, SERVICE,
};
use crate::{ip_overhead, send_train, ProbeError};
use fatpipe_audit::host::{is_privileged, Host};
use fatpipe_sys::probe as sock;

/// The longest one probe session may last.
pub const SESSION_LIMIT: Duration = Duration::from_secs(120);
/// A session whose client says nothing on the control channel this long ends.
pub const IDLE_LIMIT: Duration = Duration::from_secs(30);
/// Receive buffer asked for the UDP socket: a whole train must fit while
/// the thread is descheduled.
const RECV_BUFFER: u64 = 8 << 20;
/// How often the UDP thread looks at the stop flag.
const UDP_POLL: Duration = Duration::from_millis(100);

/// The probe service: register with `Server::builder().service(ProbeService)`.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProbeService;

impl Service for ProbeService {
    fn name(&self) -> &'static str {
        SERVICE
    }

    fn check(&self, params: &[u8]) -> Result<(), String> {
        ProbeParams::decode(params)
            .map(|_| ())
            .map_err(|e| format!("probe parameters: {e}"))
    }

    fn serve(&self, session: ServerSession) -> ServiceResult {
        serve(&session).map_err(|e| {
            let msg = ProbeMsg::Error {
                message: e.to_string(),
            };
            let _ = session.control().send(&msg.encode());
            Box::new(e) as Box<dyn std::error::Error + Send + Sync>
        })
    }
}

/// What the UDP thread recorded.
#[derive(Debug, Default)]
struct Record {
    trains: BTreeMap<u32, Vec<ArrivalWire>>,
    /// Trains whose last packet arrived (bit per train number).
    tails: u64,
    arrivals: usize,
    user_clock: bool,
    ignored: u64,
    /// The UDP address that proved the cookie.
    peer: Option<SocketAddr>,
    /// Reverse sessions: the token sent to `peer`.
    token: Option<u64>,
    /// Reverse sessions: train numbers sent (bit per train).
    sent_trains: u64,
    /// Reverse sessions: train bytes sent.
    sent_bytes: u64,
}

/// Send buffer asked for a reverse session's UDP socket: a whole train
/// leaves in one `sendmmsg`.
const SEND_BUFFER: u64 = 8 << 20;

fn serve(session: &ServerSession) -> Result<(), ProbeError> {
    let params = ProbeParams::decode(session.params())?;
    let (reverse, pipelined) = (params.reverse, params.pipelined);
    let ip = session.local_addr().ip();
    let udp = UdpSocket::bind(SocketAddr::new(ip, 0))
        .map_err(|e| ProbeError::io(format!("bind UDP on {ip}"), e))?;
    let port = udp
        .local_addr()
        .map_err(|e| ProbeError::io("read UDP address", e))?
        .port();
    // Best effort: a smaller buffer only risks drops in long trains, which
    // the estimate tolerates.
    let _ = fatpipe_sys::buffers::set_recv_buffer(&udp, RECV_BUFFER, is_privileged());
    if reverse {
        let _ = fatpipe_sys::buffers::set_send_buffer(&udp, SEND_BUFFER, is_privileged());
    }
    let kernel_clock = sock::enable_rx_timestamps(&udp).is_ok();
    udp.set_read_timeout(Some(UDP_POLL))
        .map_err(|e| ProbeError::io("set UDP timeout", e))?;
    let (limits, limits_error) = match Host::live().limits(is_privileged()) {
        Ok(l) => (Some(l), None),
        Err(e) => (None, Some(e)),
    };
    let control = session.control();
    control.send(
        &ProbeMsg::Ready {
            udp_port: port,
            limits,
            limits_error,
            reverse,
            pipelined,
        }
        .encode(),
    )?;
    let record = Mutex::new(Record {
        user_clock: !kernel_clock,
        ..Record::default()
    });
    let stop = AtomicBool::new(false);
    // The session is not `Sync` (it holds the data-connection queue), so it
    // stays on this thread with the UDP loop; the control loop gets clones.
    let shutdown = session.shutdown().clone();
    std::thread::scope(|s| {
        let control_thread = s.spawn(|| {
            let r = control_loop(control, &shutdown, &record, &stop, &udp, pipelined);
            stop.store(true, Ordering::Relaxed);
            r
        });
        let udp_result = udp_loop(session, &udp, &stop, &record, reverse);
        stop.store(true, Ordering::Relaxed);
        let result = control_thread
            .join()
            .unwrap_or_else(|_| Err(ProbeError::Protocol("control thread panicked".into())));
        result.and(udp_result)
    })
}

fn control_loop(
    control: &Control,
    shutdown: &Shutdown,
    record: &Mutex<Record>,
    stop: &AtomicBool,
    udp: &UdpSocket,
    pipelined: bool,
) -> Result<(), ProbeError> {
    let start = Instant::now();
    let mut last = start;
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        if shutdown.is_set() {
            return Err(ProbeError::Protocol("the server is shutting down".into()));
        }
        if start.elapsed() > SESSION_LIMIT {
            return Err(ProbeError::Timeout(format!(
                "probe session longer than {} s",
                SESSION_LIMIT.as_secs()
            )));
        }
        let Some(bytes) = control.recv(Some(Duration::from_secs(1)))? else {
            if last.elapsed() > IDLE_LIMIT {
                return Err(ProbeError::Timeout("client idle".into()));
            }
            continue;
        };
        last = Instant::now();
        match ProbeMsg::decode(&bytes)? {
            ProbeMsg::Collect { wait_for, wait_ms } => {
                if let Some(train) = wait_for {
                    wait_for_tail(record, train, wait_ms, stop, shutdown);
                }
                let (trains, user_clock, ignored) = {
                    let r = lock(record);
                    (r.trains.clone(), r.user_clock, r.ignored)
                };
                for (train, arrivals) in trains {
                    let report = ProbeMsg::Train { train, arrivals };
                    control.send(&if pipelined {
                        report.encode_packed()
                    } else {
                        report.encode()
                    })?;
                }
                control.send(
                    &ProbeMsg::Collected {
                        kernel_clock: !user_clock,
                        ignored,
                    }
                    .encode(),
                )?;
            }
            ProbeMsg::SendTrains {
                token,
                first,
                count,
                len,
                size,
                gap_us,
            } => {
                let peer = {
                    let mut r = lock(record);
                    let peer = match (r.peer, r.token) {
                        (Some(p), Some(t)) if t == token => p,
                        (_, None) => {
                            return Err(ProbeError::Protocol(
                                "SendTrains before a reverse session's hello".into(),
                            ))
                        }
                        _ => {
                            return Err(ProbeError::Protocol(
                                "SendTrains with a wrong token".into(),
                            ))
                        }
                    };
                    // Each train number once (decode bounds first + count
                    // by MAX_TRAINS = 64, the bits of `sent_trains`).
                    let mask = (first..first + count).fold(0u64, |m, t| m | 1u64 << (t % 64));
                    if r.sent_trains & mask != 0 {
                        return Err(ProbeError::Protocol("a train number asked twice".into()));
                    }
                    let bytes = u64::from(count) * u64::from(len) * u64::from(size);
                    if r.sent_bytes + bytes > REVERSE_BUDGET {
                        return Err(ProbeError::Protocol(format!(
                            "reverse trains beyond {} MiB per session",
                            REVERSE_BUDGET >> 20
                        )));
                    }
                    r.sent_trains |= mask;
                    r.sent_bytes += bytes;
                    peer
                };
                let payload = (size as usize).saturating_sub(ip_overhead(peer));
                let gap = Duration::from_micros(u64::from(gap_us));
                let mut sent = Vec::with_capacity(count as usize);
                let mut batch = fatpipe_sys::udp::SendBatch::new();
                for train in first..first + count {
                    if shutdown.is_set() || start.elapsed() > SESSION_LIMIT {
                        return Err(ProbeError::Protocol(
                            "reverse trains cut short: the session is ending".into(),
                        ));
                    }
                    if train > first {
                        std::thread::sleep(gap);
                    }
                    let (span, _) = send_train(udp, &mut batch, train, len, payload)?;
                    sent.push((train, len, span));
                }
                control.send(&ProbeMsg::Sent { trains: sent }.encode())?;
            }
            ProbeMsg::Done => return Ok(()),
            other => {
                return Err(ProbeError::Protocol(format!(
                    "unexpected {} from the client",
                    other.name()
                )))
            }
        }
    }
}

/// A pipelined `Collect` came right behind the client's last train: waits
/// until that train's last packet is recorded, at most `wait_ms` (which
/// decoding capped), or until the session ends.
fn wait_for_tail(
    record: &Mutex<Record>,
    train: u32,
    wait_ms: u32,
    stop: &AtomicBool,
    shutdown: &Shutdown,
) {
    let until = Instant::now() + Duration::from_millis(u64::from(wait_ms));
    while Instant::now() < until && !stop.load(Ordering::Relaxed) && !shutdown.is_set() {
        if lock(record).tails & (1u64 << (train % 64)) != 0 {
            return;
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

fn udp_loop(
    session: &ServerSession,
    udp: &UdpSocket,
    stop: &AtomicBool,
    record: &Mutex<Record>,
    reverse: bool,
) -> Result<(), ProbeError> {
    let epoch = Instant::now();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut out = Vec::with_capacity(64);
    let mut peer: Option<SocketAddr> = None;
    while !stop.load(Ordering::Relaxed) && !session.shutdown().is_set() {
        let (n, from, stamp) = match sock::recv_timestamped(udp, &mut buf) {
            Ok(x) => x,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(e) => return Err(ProbeError::io("receive UDP probe", e)),
        };
        let Ok(packet) = Packet::decode(&buf[..n]) else {
            lock(record).ignored += 1;
            continue;
        };
        let reply = match packet {
            Packet::Hello { cookie } => {
                if peer.is_none_or(|p| p == from) && session.cookie_matches(&cookie) {
                    peer = Some(from);
                    if reverse {
                        Some(reverse_hello(udp, record, from)?)
                    } else {
                        Some(Packet::HelloAck)
                    }
                } else {
                    None
                }
            }
            _ if peer != Some(from) => None,
            Packet::Echo { seq, sent_ns } => Some(Packet::EchoReply {
                seq,
                sent_ns,
                hold_ns: stamp.map_or(0, |rx| sock::realtime_ns().saturating_sub(rx)),
            }),
            Packet::Mtu { seq, size } => Some(Packet::MtuAck { seq, size }),
            Packet::Train {
                train,
                index,
                count,
            } => {
                let at_ns = stamp.unwrap_or_else(|| epoch.elapsed().as_nanos() as u64);
                let ip_bytes = (n + ip_overhead(from)) as u32;
                let mut r = lock(record);
                if stamp.is_none() {
                    r.user_clock = true;
                }
                let room = r.arrivals < (MAX_TRAINS * MAX_TRAIN_LEN) as usize;
                let known = r.trains.len() < MAX_TRAINS as usize || r.trains.contains_key(&train);
                if room && known && train < MAX_TRAINS {
                    r.arrivals += 1;
                    let list = r.trains.entry(train).or_default();
                    list.push((index, at_ns, ip_bytes));
                    let received = list.len() as u32;
                    let first = list.iter().map(|a| a.1).min().unwrap_or(at_ns);
                    if index + 1 == count {
                        r.tails |= 1u64 << train;
                    }
                    (index + 1 == count).then_some(Packet::TrainAck {
                        train,
                        received,
                        span_ns: at_ns.saturating_sub(first),
                    })
                } else {
                    r.ignored += 1;
                    None
                }
            }
            // Replies travel server to client only.
            Packet::HelloAck
            | Packet::HelloToken { .. }
            | Packet::EchoReply { .. }
            | Packet::MtuAck { .. }
            | Packet::TrainAck { .. } => None,
        };
        match reply {
            Some(p) => {
                out.clear();
                p.encode(&mut out, 0);
                // A lost reply is the client's to notice; nothing to do here.
                let _ = udp.send_to(&out, from);
            }
            None if !matches!(packet, Packet::Train { .. }) => lock(record).ignored += 1,
            None => {}
        }
    }
    Ok(())
}

/// Binds a reverse session to the hello's address: connects the socket to
/// it (trains go there and nowhere else) and draws the token once.
fn reverse_hello(
    udp: &UdpSocket,
    record: &Mutex<Record>,
    from: SocketAddr,
) -> Result<Packet, ProbeError> {
    let mut r = lock(record);
    let token = match r.token {
        Some(t) => t,
        None => {
            let mut b = [0u8; 8];
            getrandom::fill(&mut b)
                .map_err(|e| ProbeError::io("draw a token", io::Error::other(e.to_string())))?;
            udp.connect(from)
                .map_err(|e| ProbeError::io(format!("connect UDP to {from}"), e))?;
            let t = u64::from_be_bytes(b);
            r.token = Some(t);
            r.peer = Some(from);
            t
        }
    };
    Ok(Packet::HelloToken { token })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use std::net::UdpSocket;
    use std::time::Duration;

    use fatpipe_engine::{connect, Server, Shutdown};

    use super::*;
    use crate::wire::ProbeParams;

    /// A server with only the probe service on loopback, run on a thread.
    fn start() -> (SocketAddr, Shutdown) {
        let server = Server::builder()
            .service(ProbeService)
            .bind("127.0.0.1:0".parse().unwrap())
            .unwrap();
        let addr = server.local_addr();
        let stop = server.shutdown_handle();
        std::thread::spawn(move || server.run());
        (addr, stop)
    }

    /// A whole probe of `addr`, short: 3 echoes, rounds of 4 trains.
    fn short_probe(addr: SocketAddr) -> crate::ProbeConfig {
        let mut cfg = crate::ProbeConfig::new(addr, fatpipe_engine::ClientOptions::default());
        cfg.echoes = 3;
        cfg.trains = 4;
        cfg
    }

    fn udp_to(addr: SocketAddr) -> UdpSocket {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        s
    }

    fn send(s: &UdpSocket, p: Packet) {
        let mut out = Vec::new();
        p.encode(&mut out, 0);
        s.send(&out).unwrap();
    }

    fn reply(s: &UdpSocket) -> Option<Packet> {
        let mut buf = [0u8; 256];
        let n = s.recv(&mut buf).ok()?;
        Packet::decode(&buf[..n]).ok()
    }

    #[test]
    fn udp_answers_only_the_address_that_proved_the_cookie() {
        let (addr, stop) = start();
        let session = connect(addr, None, SERVICE, &ProbeParams::current().encode()).unwrap();
        let ready = session
            .control()
            .recv(Some(Duration::from_secs(5)))
            .unwrap();
        let Ok(ProbeMsg::Ready { udp_port, .. }) = ProbeMsg::decode(&ready.unwrap()) else {
            panic!("no Ready");
        };
        let udp_addr = SocketAddr::new(addr.ip(), udp_port);
        let echo = Packet::Echo { seq: 1, sent_ns: 9 };

        let stranger = udp_to(udp_addr);
        send(&stranger, echo);
        assert_eq!(reply(&stranger), None, "echo before any hello");
        send(&stranger, Packet::Hello { cookie: [0; 32] });
        assert_eq!(reply(&stranger), None, "hello with a wrong cookie");

        let client = udp_to(udp_addr);
        send(
            &client,
            Packet::Hello {
                cookie: *session.cookie(),
            },
        );
        assert_eq!(reply(&client), Some(Packet::HelloAck));
        send(&client, echo);
        match reply(&client) {
            Some(Packet::EchoReply {
                seq: 1,
                sent_ns: 9,
                hold_ns,
            }) => assert!(hold_ns < 1_000_000_000, "{hold_ns}"),
            other => panic!("{other:?}"),
        }

        // Knowing the cookie is not enough once the address is bound.
        send(
            &stranger,
            Packet::Hello {
                cookie: *session.cookie(),
            },
        );
        assert_eq!(reply(&stranger), None);
        send(&stranger, echo);
        assert_eq!(reply(&stranger), None);

        // A train's last packet is acknowledged with what arrived; the
        // report then carries every arrival with a kernel timestamp.
        for index in [0, 1, 3] {
            send(
                &client,
                Packet::Train {
                    train: 0,
                    index,
                    count: 4,
                },
            );
        }
        match reply(&client) {
            Some(Packet::TrainAck {
                train: 0,
                received: 3,
                span_ns,
            }) => {
                assert!(span_ns < 1_000_000_000)
            }
            other => panic!("{other:?}"),
        }
        let control = session.control();
        control
            .send(
                &ProbeMsg::Collect {
                    wait_for: None,
                    wait_ms: 0,
                }
                .encode(),
            )
            .unwrap();
        let msg = |c: &fatpipe_engine::Control| {
            ProbeMsg::decode(&c.recv(Some(Duration::from_secs(5))).unwrap().unwrap()).unwrap()
        };
        match msg(control) {
            ProbeMsg::Train { train: 0, arrivals } => {
                let idx: Vec<u32> = arrivals.iter().map(|a| a.0).collect();
                assert_eq!(idx, [0, 1, 3]);
                assert!(arrivals.iter().all(|a| a.2 == 28 + 18));
            }
            other => panic!("{other:?}"),
        }
        match msg(control) {
            ProbeMsg::Collected {
                kernel_clock,
                ignored,
            } => {
                assert!(kernel_clock);
                // stranger: echo, bad hello, good hello, echo
                assert_eq!(ignored, 4);
            }
            other => panic!("{other:?}"),
        }
        control.send(&ProbeMsg::Done.encode()).unwrap();
        stop.trigger();
    }

    #[test]
    fn a_pipelined_collect_waits_for_its_train_and_no_longer_than_asked() {
        let (addr, stop) = start();
        let session = connect(addr, None, SERVICE, &ProbeParams::current().encode()).unwrap();
        let control = session.control();
        let msg = || {
            ProbeMsg::decode(
                &control
                    .recv(Some(Duration::from_secs(15)))
                    .unwrap()
                    .unwrap(),
            )
            .unwrap()
        };
        let ProbeMsg::Ready {
            udp_port,
            pipelined: true,
            ..
        } = msg()
        else {
            panic!("no pipelined Ready");
        };
        let client = udp_to(SocketAddr::new(addr.ip(), udp_port));
        send(
            &client,
            Packet::Hello {
                cookie: *session.cookie(),
            },
        );
        assert_eq!(reply(&client), Some(Packet::HelloAck));
        let train = |train, index| Packet::Train {
            train,
            index,
            count: 3,
        };
        let collect = |wait_for, wait_ms| {
            control
                .send(
                    &ProbeMsg::Collect {
                        wait_for: Some(wait_for),
                        wait_ms,
                    }
                    .encode(),
                )
                .unwrap();
        };
        let reports = || {
            let mut got = Vec::new();
            loop {
                match msg() {
                    ProbeMsg::Train { train, arrivals } => got.push((train, arrivals.len())),
                    ProbeMsg::Collected { .. } => return got,
                    other => panic!("{other:?}"),
                }
            }
        };
        send(&client, train(0, 0));
        // The Collect overtakes train 1, which is then sent 300 ms late:
        // the reports wait for its last packet, well short of 5 s.
        collect(1, 5000);
        std::thread::sleep(Duration::from_millis(300));
        let t0 = Instant::now();
        for index in 0..3 {
            send(&client, train(1, index));
        }
        assert_eq!(reports(), [(0, 1), (1, 3)]);
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        // A tail that never comes is waited for as long as asked, no longer.
        let t0 = Instant::now();
        collect(2, 400);
        assert_eq!(reports(), [(0, 1), (1, 3)]);
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_millis(400), "{waited:?}");
        assert!(waited < Duration::from_secs(3), "{waited:?}");
        control.send(&ProbeMsg::Done.encode()).unwrap();
        stop.trigger();
    }

    #[test]
    fn reverse_sessions_send_trains_only_with_the_token_and_once() {
        let (addr, stop) = start();
        let open = |params: &ProbeParams| {
            let session = connect(addr, None, SERVICE, &params.encode()).unwrap();
            let ready = session
                .control()
                .recv(Some(Duration::from_secs(5)))
                .unwrap();
            let Ok(ProbeMsg::Ready {
                udp_port, reverse, ..
            }) = ProbeMsg::decode(&ready.unwrap())
            else {
                panic!("no Ready");
            };
            assert_eq!(reverse, params.reverse);
            (session, SocketAddr::new(addr.ip(), udp_port))
        };
        let msg = |c: &fatpipe_engine::Control| {
            ProbeMsg::decode(&c.recv(Some(Duration::from_secs(5))).unwrap().unwrap()).unwrap()
        };
        let (session, udp_addr) = open(&ProbeParams::reverse());
        let client = udp_to(udp_addr);
        send(
            &client,
            Packet::Hello {
                cookie: *session.cookie(),
            },
        );
        let Some(Packet::HelloToken { token }) = reply(&client) else {
            panic!("no token");
        };
        let ask = |first, token| ProbeMsg::SendTrains {
            token,
            first,
            count: 2,
            len: 5,
            size: 200,
            gap_us: 1000,
        };
        let control = session.control();
        control.send(&ask(0, token).encode()).unwrap();
        let mut buf = [0u8; 512];
        let mut got = Vec::new();
        while let Ok(n) = client.recv(&mut buf) {
            assert_eq!(n, 200 - 28, "padded to the size asked");
            if let Ok(Packet::Train {
                train,
                index,
                count,
            }) = Packet::decode(&buf[..n])
            {
                assert_eq!(count, 5);
                got.push((train, index));
            }
            if got.len() == 10 {
                break;
            }
        }
        assert_eq!(got.len(), 10, "{got:?}");
        match msg(control) {
            ProbeMsg::Sent { trains } => {
                let t: Vec<(u32, u32)> = trains.iter().map(|t| (t.0, t.1)).collect();
                assert_eq!(t, [(0, 5), (1, 5)]);
            }
            other => panic!("{other:?}"),
        }
        // Train 1 again: refused, and the session ends with the reason.
        control.send(&ask(1, token).encode()).unwrap();
        match msg(control) {
            ProbeMsg::Error { message } => assert!(message.contains("twice"), "{message}"),
            other => panic!("{other:?}"),
        }

        // A wrong token sends nothing.
        let (session, udp_addr) = open(&ProbeParams::reverse());
        let client = udp_to(udp_addr);
        send(
            &client,
            Packet::Hello {
                cookie: *session.cookie(),
            },
        );
        let Some(Packet::HelloToken { token }) = reply(&client) else {
            panic!("no token");
        };
        session.control().send(&ask(0, token ^ 1).encode()).unwrap();
        match msg(session.control()) {
            ProbeMsg::Error { message } => assert!(message.contains("token"), "{message}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(reply(&client), None);

        // A forward session has no trains to send.
        let (session, udp_addr) = open(&ProbeParams::current());
        let client = udp_to(udp_addr);
        send(
            &client,
            Packet::Hello {
                cookie: *session.cookie(),
            },
        );
        assert_eq!(reply(&client), Some(Packet::HelloAck));
        session.control().send(&ask(0, 0).encode()).unwrap();
        assert!(matches!(msg(session.control()), ProbeMsg::Error { .. }));
        stop.trigger();
    }

    #[test]
    fn reverse_probe_on_loopback_gives_an_estimate_of_the_server_sending() {
        let (addr, stop) = start();
        let mut cfg = short_probe(addr);
        cfg.reverse = true;
        let o = crate::run(&cfg).unwrap();
        assert!(o.reverse);
        let r = o.rate.expect("an estimate from the server's trains");
        assert!(r.rate > 1e8, "{r:?}");
        assert!(r.low <= r.rate && r.rate <= r.high, "{r:?}");
        // Loopback loses nothing; every train sent was timed here.
        assert!(o.train_packets.0 > 0);
        assert_eq!(o.train_packets.0, o.train_packets.1);
        assert!(o.kernel_clock);
        stop.trigger();
    }

    #[test]
    fn forward_probe_on_loopback_pipelined_or_not() {
        let (addr, stop) = start();
        for pipelined in [true, false] {
            let mut cfg = short_probe(addr);
            cfg.pipelined = pipelined;
            let o = crate::run(&cfg).unwrap();
            let r = o.rate.expect("an estimate");
            assert!(r.rate > 1e8, "{pipelined}: {r:?}");
            // Rounds of 4: the first train, sent with the echoes, is one
            // of the first round's, and every one was reported.
            assert!(
                r.trains > 0 && r.trains.is_multiple_of(4),
                "{pipelined}: {r:?}"
            );
            assert!(o.train_packets.0 > 0);
            assert_eq!(o.train_packets.0, o.train_packets.1, "{pipelined}");
            assert_eq!(o.mtu.probes, 1, "the route MTU passed with the echoes");
        }
        stop.trigger();
    }

    #[test]
    fn bad_params_are_refused_before_the_session() {
        let (addr, stop) = start();
        let err = connect(addr, None, SERVICE, b"{\"version\":99}").unwrap_err();
        assert!(err.to_string().contains("probe"), "{err}");
        stop.trigger();
    }
}
