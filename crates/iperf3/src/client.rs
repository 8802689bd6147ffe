//! `fatpipe test --iperf3`: one test against a stock iperf3 server.
//!
//! The client drives iperf3's control protocol ([`crate::wire`]) over a
//! blocking socket: cookie, parameters, data streams (TCP with the cookie,
//! UDP with the "9876" hello), then the test, whose end the client decides
//! (`TEST_END`), and the results exchange. What comes back is a
//! `fatpipe.test` report like a fatpipe test's: this end's own counters
//! and `TCP_INFO` for the intervals, and the server's results document for
//! its side of the totals (iperf3 reports nothing per interval).
//!
//! Two waits keep the two ends' byte counts equal, which iperf3 itself does
//! not do: before `TEST_END` the senders' queues drain (iperf3's server
//! stops counting at `TEST_END`), and receivers read what the server sent
//! before its `TEST_END` until the streams fall quiet.

use std::io::Write;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fatpipe_schema::test::{
    CpuUse, Direction, Protocol, SocketInfo, StreamStats, TestDirection, TestEnd, TestInterval,
    TestReport, TestStart, TEST_SCHEMA, TEST_SCHEMA_VERSION,
};
use socket2::{Domain, Socket, Type};

use crate::data::{self, Shared};
use crate::session::{
    drained, is_timeout, our_results, percent, random36, spawn, sums, tcp_info, unexpected,
    Control, Sampler, Sock, Stream, Totals, Work, DRAIN, QUIET, SETTLE, STEP_TIMEOUT,
};
use crate::wire::{self, Expect, Params, Results, State, Transport, MAX_RESULTS_JSON};
use crate::{Iperf3Error, Result};

/// One test against an iperf3 server.
#[derive(Debug, Clone)]
pub struct Config {
    /// The server as the user wrote it.
    pub server: String,
    /// Its address.
    pub addr: SocketAddr,
    /// TCP or UDP.
    pub protocol: Protocol,
    /// Who sends.
    pub direction: TestDirection,
    /// Streams per direction (1..=128).
    pub streams: u32,
    /// Measured time, whole seconds (iperf3's unit); ignored with `bytes`.
    pub time_s: u64,
    /// Bytes to send in all per direction instead of a time.
    pub bytes: Option<u64>,
    /// Warm-up, whole seconds.
    pub omit_s: u64,
    /// Report interval of this end.
    pub interval: Duration,
    /// Write or datagram size.
    pub length: u32,
    /// UDP rate per stream, bit/s.
    pub bitrate: u64,
    /// Socket buffer for both ends.
    pub window: Option<u64>,
    /// TCP MSS for both ends.
    pub mss: Option<u32>,
    /// Congestion control for both ends.
    pub congestion: Option<String>,
    /// Congestion control for this end's sockets only (auto-tuning's
    /// choice: the server may not offer it, and iperf3 fails a test whose
    /// congestion control it cannot set).
    pub local_congestion: Option<String>,
    /// Pacing cap per stream, bit/s.
    pub fq_rate: Option<u64>,
    /// `sendfile` the payload at this end.
    pub zerocopy: bool,
    /// TCP connect limit.
    pub connect_timeout: Duration,
    /// iperf3's RSA authentication, when the server asks for it.
    pub auth: Option<crate::auth::Credentials>,
}

/// What the control connection showed of the path before the test.
#[derive(Debug, Clone, Copy)]
pub struct Link {
    /// Smallest round trip seen (the TCP handshake and the first reply).
    pub rtt: Option<Duration>,
    /// Path MTU, 0 if unknown.
    pub mtu: u32,
}

/// What the client reports while the test runs.
#[derive(Debug)]
pub enum Progress<'a> {
    /// Streams connected, data about to flow.
    Start(&'a TestStart),
    /// An interval ended.
    Interval(&'a TestInterval),
}

/// Runs the test and returns the report. `tune` sees what the control
/// connection learnt of the path and may change the settings before they
/// are sent.
pub fn run(
    cfg: &Config,
    tune: &mut dyn FnMut(&Link, &mut Config),
    on_progress: &mut dyn FnMut(Progress<'_>),
) -> Result<TestReport> {
    let mut cfg = cfg.clone();
    let cfg = &mut cfg;
    let sock = TcpStream::connect_timeout(&cfg.addr, cfg.connect_timeout)
        .map_err(|e| Iperf3Error::io(format!("connect to {}", cfg.addr), e))?;
    let mut ctrl = Control::new(sock);
    let cookie = wire::make_cookie(&random36());
    ctrl.write(&cookie, "send the cookie")?;
    match ctrl.expect(State::ParamExchange, "waiting for the parameter request") {
        // A fatpipe server's first frame starts with a zero length byte.
        Err(Iperf3Error::Wire(wire::WireError::UnknownState(0))) => {
            return Err(Iperf3Error::Unsupported(
                "not an iperf3 server: it answers like a fatpipe server; drop --iperf3".into(),
            ))
        }
        r => r?,
    }
    let info = fatpipe_sys::tcp_info(&ctrl.sock).ok();
    let link = Link {
        rtt: info
            .as_ref()
            .and_then(|t| t.min_rtt_us.or(t.rtt_us))
            .map(|us| Duration::from_micros(u64::from(us))),
        mtu: info.as_ref().and_then(|t| t.pmtu).unwrap_or(0),
    };
    tune(&link, cfg);
    let cfg = &*cfg;
    let mut p = params(cfg);
    if let Some(c) = &cfg.auth {
        p.authtoken = Some(crate::auth::token(c, unix_now())?);
    }
    ctrl.write(&wire::encode_json(&p.to_json()), "send the parameters")?;
    match ctrl.expect(State::CreateStreams, "waiting for the stream request") {
        // iperf3 (3.12 at least) closes the connection on a refused token
        // without saying why: with credentials sent, that is the reason.
        Err(Iperf3Error::Closed(_)) if cfg.auth.is_some() => {
            return Err(Iperf3Error::Auth(crate::auth::AuthError::Refused(
                "the iperf3 server closed the connection after the credentials (wrong user, password or key, or clocks more than its skew apart)".into(),
            )))
        }
        r => r?,
    }
    let streams = connect_streams(cfg, &cookie)?;
    ctrl.expect(State::TestStart, "waiting for the test to start")?;
    ctrl.expect(State::TestRunning, "waiting for the test to run")?;
    let cpu_start = fatpipe_sys::CpuSample::now().ok();
    let mut start = start_record(cfg, &streams);
    on_progress(Progress::Start(&start));
    let shared = Shared::new(cfg.bytes);
    let work = Work {
        sends: Direction::Up,
        length: cfg.length,
        zerocopy: cfg.zerocopy,
        bitrate: cfg.bitrate,
        wide: false,
    };
    let workers = spawn(work, &streams, &shared)?;
    let mut sampler = Sampler::new(cfg.protocol, Direction::Up, cfg.omit_s, &streams);
    let outcome = run_test(cfg, &mut ctrl, &shared, &streams, &mut sampler, on_progress);
    // Whatever happened, the workers stop and are joined.
    let finish =
        outcome.and_then(|()| finish(&mut ctrl, cfg, &shared, &streams, &mut sampler, cpu_start));
    shared.stop_sending();
    shared.stop_receiving();
    for w in workers {
        w.join();
    }
    let (end, server) = finish?;
    for s in &streams {
        if let Some(why) = s.counters.failure() {
            start.warnings.push(format!("stream {}: {why}", s.id));
        }
    }
    if let Some(c) = &server.congestion_used {
        start
            .warnings
            .push(format!("the server's congestion control: {c}"));
    }
    Ok(TestReport {
        schema: TEST_SCHEMA.into(),
        version: TEST_SCHEMA_VERSION,
        start,
        intervals: sampler.intervals,
        end,
    })
}

/// The parameters document for `cfg`.
pub fn params(cfg: &Config) -> Params {
    Params {
        transport: Some(match cfg.protocol {
            Protocol::Tcp => Transport::Tcp,
            Protocol::Udp => Transport::Udp,
        }),
        omit: cfg.omit_s,
        time: if cfg.bytes.is_some() { 0 } else { cfg.time_s },
        num: cfg.bytes.unwrap_or(0),
        blockcount: 0,
        parallel: cfg.streams,
        reverse: cfg.direction == TestDirection::Down,
        bidirectional: cfg.direction == TestDirection::Both,
        window: cfg.window,
        mss: cfg.mss,
        len: Some(cfg.length),
        bandwidth: (cfg.protocol == Protocol::Udp).then_some(cfg.bitrate),
        fqrate: cfg.fq_rate,
        congestion: cfg.congestion.clone(),
        client_version: Some(format!("fatpipe {}", env!("CARGO_PKG_VERSION"))),
        ..Params::default()
    }
}

/// Seconds since the Unix epoch, as iperf3's authentication dates a token.
fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Opens every stream in iperf3's order: with `--bidir`, the client's
/// senders first, then its receivers.
fn connect_streams(cfg: &Config, cookie: &wire::Cookie) -> Result<Vec<Stream>> {
    let n = cfg.streams as usize;
    let total = if cfg.direction == TestDirection::Both {
        2 * n
    } else {
        n
    };
    let mut out = Vec::with_capacity(total);
    for i in 0..total {
        let direction = match cfg.direction {
            TestDirection::Up => Direction::Up,
            TestDirection::Down => Direction::Down,
            TestDirection::Both if i < n => Direction::Up,
            TestDirection::Both => Direction::Down,
        };
        let sock = match cfg.protocol {
            Protocol::Tcp => Sock::Tcp(connect_tcp(cfg, cookie)?),
            Protocol::Udp => Sock::Udp(connect_udp(cfg)?),
        };
        out.push(Stream::new(i, direction, sock));
    }
    Ok(out)
}

/// A socket with the buffers set before it connects (window scaling is
/// fixed at the handshake).
fn socket(cfg: &Config, ty: Type) -> Result<Socket> {
    let proto = if ty == Type::STREAM {
        socket2::Protocol::TCP
    } else {
        socket2::Protocol::UDP
    };
    let s = Socket::new(Domain::for_address(cfg.addr), ty, Some(proto))
        .map_err(|e| Iperf3Error::io("create a data socket", e))?;
    if let Some(w) = cfg.window {
        fatpipe_sys::set_send_buffer(&s, w, false)
            .and_then(|_| fatpipe_sys::set_recv_buffer(&s, w, false))
            .map_err(|e| Iperf3Error::io("set the socket buffer (-w)", e))?;
    }
    Ok(s)
}

fn connect_tcp(cfg: &Config, cookie: &wire::Cookie) -> Result<TcpStream> {
    let s = socket(cfg, Type::STREAM)?;
    if let Some(m) = cfg.mss {
        fatpipe_sys::tcp::set_mss(&s, m).map_err(|e| Iperf3Error::io("set the MSS (-M)", e))?;
    }
    if let Some(c) = cfg.congestion.as_ref().or(cfg.local_congestion.as_ref()) {
        fatpipe_sys::tcp::set_congestion(&s, c)
            .map_err(|e| Iperf3Error::io(format!("set congestion control {c}"), e))?;
    }
    if let Some(r) = cfg.fq_rate {
        let _ = fatpipe_sys::tcp::set_max_pacing_rate(&s, r / 8);
    }
    s.connect_timeout(&cfg.addr.into(), cfg.connect_timeout)
        .map_err(|e| Iperf3Error::io(format!("connect a data stream to {}", cfg.addr), e))?;
    let mut t: TcpStream = s.into();
    let _ = t.set_write_timeout(Some(STEP_TIMEOUT));
    t.write_all(cookie)
        .map_err(|e| Iperf3Error::io("send the cookie on a data stream", e))?;
    Ok(t)
}

/// Connects a UDP stream: the "9876" hello, answered by "6789" once the
/// server has connected a socket to this one. With `-R` the server may
/// send data before its reply; such datagrams are skipped.
fn connect_udp(cfg: &Config) -> Result<UdpSocket> {
    let s = socket(cfg, Type::DGRAM)?;
    let any: SocketAddr = if cfg.addr.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    s.bind(&any.into())
        .map_err(|e| Iperf3Error::io("bind a UDP stream", e))?;
    let u: UdpSocket = s.into();
    u.connect(cfg.addr)
        .map_err(|e| Iperf3Error::io(format!("connect a UDP stream to {}", cfg.addr), e))?;
    u.send(&wire::UDP_HELLO)
        .map_err(|e| Iperf3Error::io("send the UDP stream hello", e))?;
    let deadline = Instant::now() + STEP_TIMEOUT;
    let mut buf = [0u8; 65_536];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Iperf3Error::Timeout(
                "waiting for the UDP stream reply".into(),
            ));
        }
        let _ = u.set_read_timeout(Some(left));
        match u.recv(&mut buf) {
            Ok(4) if buf[..4] == wire::UDP_REPLY || buf[..4] == wire::UDP_REPLY_LEGACY => {
                return Ok(u)
            }
            Ok(_) => {}
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(Iperf3Error::io("wait for the UDP stream reply", e)),
        }
    }
}

/// Runs the measured period (and the warm-up): an interval line each
/// `interval`, and the end when the time is up or the bytes are sent. The
/// control connection is watched meanwhile: a server that fails or goes
/// away ends the test at once.
fn run_test(
    cfg: &Config,
    ctrl: &mut Control,
    shared: &Shared,
    streams: &[Stream],
    sampler: &mut Sampler,
    on_progress: &mut dyn FnMut(Progress<'_>),
) -> Result<()> {
    let end_at =
        (cfg.bytes.is_none()).then(|| sampler.start + Duration::from_secs(cfg.omit_s + cfg.time_s));
    let mut next = sampler.start + cfg.interval;
    loop {
        let now = Instant::now();
        if end_at.is_some_and(|e| now >= e) || bytes_done(cfg, shared, streams) {
            let iv = sampler.sample(streams, now);
            if iv.end_s - iv.start_s > 0.05 {
                on_progress(Progress::Interval(iv));
            } else {
                sampler.intervals.pop();
            }
            return Ok(());
        }
        if now >= next {
            on_progress(Progress::Interval(sampler.sample(streams, now)));
            next += cfg.interval;
            continue;
        }
        let wake = end_at.map_or(next, |e| e.min(next)).min(now + data::POLL);
        if let Some(m) = ctrl.read(Expect::State, wake - now, "running the test")? {
            return Err(unexpected(m, "running the test"));
        }
        if let Some((id, why)) = streams
            .iter()
            .find_map(|s| s.counters.failure().map(|f| (s.id, f)))
        {
            return Err(Iperf3Error::Stream(format!("stream {id} failed: {why}")));
        }
    }
}

/// With `-n`: every byte sent (client senders) or received (`-R`).
fn bytes_done(cfg: &Config, shared: &Shared, streams: &[Stream]) -> bool {
    let Some(total) = cfg.bytes else {
        return false;
    };
    let sent_all = shared
        .budget
        .as_ref()
        .is_none_or(|b| b.load(std::sync::atomic::Ordering::Relaxed) == 0)
        && streams
            .iter()
            .filter(|s| s.direction == Direction::Up)
            .all(drained);
    let got: u64 = streams
        .iter()
        .filter(|s| s.direction == Direction::Down)
        .map(|s| s.counters.snapshot().bytes)
        .sum();
    let has_down = streams.iter().any(|s| s.direction == Direction::Down);
    let has_up = streams.iter().any(|s| s.direction == Direction::Up);
    (!has_up || sent_all) && (!has_down || got >= total)
}

/// Ends the test: senders stop and drain, `TEST_END`, receivers drain,
/// results both ways, `IPERF_DONE`.
fn finish(
    ctrl: &mut Control,
    cfg: &Config,
    shared: &Shared,
    streams: &[Stream],
    sampler: &mut Sampler,
    cpu_start: Option<fatpipe_sys::CpuSample>,
) -> Result<(TestEnd, Results)> {
    let seconds = Instant::now()
        .duration_since(sampler.measured_from)
        .as_secs_f64();
    shared.stop_sending();
    let t0 = Instant::now();
    let senders: Vec<&Stream> = streams
        .iter()
        .filter(|s| s.direction == Direction::Up)
        .collect();
    while t0.elapsed() < DRAIN && !senders.iter().all(|s| drained(s)) {
        std::thread::sleep(Duration::from_millis(5));
    }
    // The last byte reached the server about when it was acknowledged.
    let acked_secs = Instant::now()
        .duration_since(sampler.measured_from)
        .as_secs_f64();
    // Acknowledged is not yet read: the server counts only what its
    // process read before TEST_END. Its reads catch up once the senders
    // stop, and the windows it advertises stop changing when they have
    // (the kernel announces a window that at least doubled): wait until
    // they held still for SETTLE. A server that is not reading at all
    // (single-threaded iperf3 busy sending with --bidir) is given DRAIN.
    if cfg.protocol == Protocol::Tcp && !senders.is_empty() {
        let windows = || -> Vec<Option<u32>> {
            senders
                .iter()
                .map(|s| tcp_info(s).and_then(|t| t.snd_wnd))
                .collect()
        };
        let t1 = Instant::now();
        let mut last = windows();
        let mut still = Instant::now();
        while t1.elapsed() < DRAIN && still.elapsed() < SETTLE {
            std::thread::sleep(SETTLE / 10);
            let now = windows();
            if now != last {
                (last, still) = (now, Instant::now());
            }
        }
    }
    ctrl.send_state(State::TestEnd)?;
    // Receivers take what the server sent before it saw TEST_END; their
    // time runs to the last arrival.
    let mut last = total_received(streams);
    let mut quiet_since = Instant::now();
    let mut last_arrival = quiet_since;
    let t0 = Instant::now();
    while t0.elapsed() < DRAIN {
        std::thread::sleep(Duration::from_millis(20));
        let now = total_received(streams);
        if now != last {
            last = now;
            quiet_since = Instant::now();
            last_arrival = quiet_since;
        } else if quiet_since.elapsed() >= QUIET {
            break;
        }
    }
    shared.stop_receiving();
    let totals = Totals::take(streams, sampler, cpu_start, seconds);
    ctrl.expect(State::ExchangeResults, "waiting for the results exchange")?;
    let ours = our_results(
        cfg.protocol,
        Direction::Up,
        cfg.congestion.clone(),
        streams,
        &totals,
    );
    ctrl.write(&wire::encode_json(&ours.to_json()), "send the results")?;
    let theirs = Results::parse(&ctrl.json(MAX_RESULTS_JSON, "reading the server's results")?)?;
    ctrl.expect(State::DisplayResults, "waiting for the end of the results")?;
    ctrl.send_state(State::IperfDone)?;
    let received_secs = last_arrival
        .duration_since(sampler.measured_from)
        .as_secs_f64();
    let end = end_record(cfg, streams, &totals, &theirs, (acked_secs, received_secs));
    Ok((end, theirs))
}

fn total_received(streams: &[Stream]) -> u64 {
    streams
        .iter()
        .filter(|s| s.direction == Direction::Down)
        .map(|s| s.counters.snapshot().bytes)
        .sum()
}

/// The totals: each direction's receiver bytes from whichever end received.
///
/// Throughput is over the receiver's time, to the last arrival: for
/// client-to-server streams until this end's data was all acknowledged,
/// for the others until their last bytes came (`secs`: both, from the
/// start of the measured time). The sender's time would leave out what
/// was still queued on the path when it stopped; iperf3's server's own
/// time would add this end's wait for its reads to catch up.
fn end_record(
    cfg: &Config,
    streams: &[Stream],
    t: &Totals,
    theirs: &Results,
    (acked_secs, received_secs): (f64, f64),
) -> TestEnd {
    let cpu = t.cpu;
    let up_secs = acked_secs.max(t.seconds);
    let down_secs = received_secs.max(t.seconds);
    let mut out = Vec::with_capacity(streams.len());
    for (s, ((now, retr), (b, bretr))) in streams.iter().zip(t.now.iter().zip(&t.base)) {
        let peer = theirs.streams.iter().find(|r| r.id == s.id);
        let ours = now.bytes.saturating_sub(b.bytes);
        let seconds = match s.direction {
            Direction::Up => up_secs,
            Direction::Down => down_secs,
        };
        let mut st = StreamStats {
            id: Some(s.id),
            direction: Some(s.direction),
            seconds,
            ..StreamStats::default()
        };
        match s.direction {
            Direction::Up => {
                st.bytes_sent = ours;
                st.bytes = peer.map_or(0, |p| p.bytes);
                if let (Protocol::Tcp, Some(info)) = (cfg.protocol, tcp_info(s)) {
                    st.retransmits = Some(retr.saturating_sub(*bretr));
                    st.rtt_us = info.rtt_us;
                    st.rttvar_us = info.rttvar_us;
                    st.cwnd = info.cwnd_bytes();
                }
                if cfg.protocol == Protocol::Udp {
                    let sent = now.packets.saturating_sub(b.packets);
                    st.packets_sent = Some(sent);
                    if let Some(p) = peer {
                        st.packets = Some(p.packets);
                        st.lost = Some(p.errors);
                        st.lost_percent = Some(percent(p.errors, sent.max(p.packets + p.errors)));
                        st.jitter_ms = Some(p.jitter * 1000.0);
                        st.out_of_order = Some(0);
                    }
                }
            }
            Direction::Down => {
                st.bytes = ours;
                st.bytes_sent = peer.map_or(0, |p| p.bytes);
                st.retransmits = peer
                    .and_then(|p| p.retransmits)
                    .filter(|_| theirs.sender_has_retransmits == 1);
                if cfg.protocol == Protocol::Udp {
                    let got = now.packets.saturating_sub(b.packets);
                    let lost = now.lost().saturating_sub(b.lost());
                    st.packets = Some(got);
                    st.lost = Some(lost);
                    st.packets_sent = peer.map(|p| p.packets);
                    st.lost_percent = Some(percent(
                        lost,
                        peer.map_or(got + lost, |p| p.packets.max(got + lost)),
                    ));
                    st.out_of_order = Some(now.out_of_order.saturating_sub(b.out_of_order));
                    st.jitter_ms = Some(now.jitter * 1000.0);
                }
            }
        }
        st.bits_per_second = st.bytes as f64 * 8.0 / seconds.max(1e-9);
        out.push(st);
    }
    TestEnd {
        seconds: out.iter().map(|s| s.seconds).fold(t.seconds, f64::max),
        sums: [(Direction::Up, up_secs), (Direction::Down, down_secs)]
            .into_iter()
            .flat_map(|(d, secs)| {
                sums(&out, secs)
                    .into_iter()
                    .filter(move |x| x.direction == Some(d))
            })
            .collect(),
        streams: out,
        cpu_local: CpuUse {
            total_percent: cpu.total_pct,
            user_percent: cpu.user_pct,
            system_percent: cpu.system_pct,
        },
        cpu_remote: CpuUse {
            total_percent: theirs.cpu_total,
            user_percent: theirs.cpu_user,
            system_percent: theirs.cpu_system,
        },
        rfc6349: None,
        ramp: None,
    }
}

/// What was asked and what this end's sockets got. iperf3 reports nothing
/// of the server's sockets, so `remote` stays empty and a warning says so.
fn start_record(cfg: &Config, streams: &[Stream]) -> TestStart {
    let local = streams
        .iter()
        .map(|s| {
            let (snd, rcv, mss, cc) = match &s.sock {
                Sock::Tcp(t) => (
                    fatpipe_sys::buffers::get_send_buffer(t).unwrap_or(0),
                    fatpipe_sys::buffers::get_recv_buffer(t).unwrap_or(0),
                    fatpipe_sys::tcp::get_mss(t).unwrap_or(0),
                    fatpipe_sys::tcp::get_congestion(t).unwrap_or_default(),
                ),
                Sock::Udp(u) => (
                    fatpipe_sys::buffers::get_send_buffer(u).unwrap_or(0),
                    fatpipe_sys::buffers::get_recv_buffer(u).unwrap_or(0),
                    0,
                    String::new(),
                ),
            };
            SocketInfo {
                id: s.id,
                direction: s.direction,
                sndbuf: snd,
                rcvbuf: rcv,
                mss,
                congestion: cc,
                send_path: if cfg.zerocopy && s.direction == Direction::Up {
                    "sendfile".into()
                } else {
                    "copy".into()
                },
                // Linux drops TCP data unread (the discarder falls back to
                // copying elsewhere).
                recv_path: match (&s.sock, s.direction) {
                    (Sock::Tcp(_), Direction::Down) if cfg!(target_os = "linux") => {
                        "recv_trunc".into()
                    }
                    _ => "copy".into(),
                },
            }
        })
        .collect();
    let mut warnings = vec![
        "iperf3 server: it reports no socket settings (remote is empty) and nothing per interval (client-to-server intervals count bytes sent)".to_string(),
    ];
    if cfg.protocol == Protocol::Udp && cfg.direction != TestDirection::Down {
        warnings
            .push("iperf3 server: UDP out-of-order counts of the server are not exchanged".into());
    }
    TestStart {
        timestamp: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
        server: cfg.server.clone(),
        server_addr: cfg.addr.to_string(),
        protocol: cfg.protocol,
        direction: cfg.direction,
        streams: cfg.streams,
        duration_s: if cfg.bytes.is_some() {
            0.0
        } else {
            cfg.time_s as f64
        },
        bytes: cfg.bytes,
        omit_s: cfg.omit_s as f64,
        interval_s: cfg.interval.as_secs_f64(),
        length: cfg.length,
        bitrate: (cfg.protocol == Protocol::Udp).then_some(cfg.bitrate),
        window: cfg.window,
        mss: cfg.mss,
        congestion: cfg.congestion.clone(),
        fq_rate: cfg.fq_rate,
        zerocopy: cfg.zerocopy,
        local,
        remote: Vec::new(),
        warnings,
        auto: None,
        encryption: None,
    }
}
