//! The client half of the probe: RTT echoes, the MTU search, packet trains,
//! then the server's train timestamps.
//!
//! One thread, one connected UDP socket, and a state machine of phases
//! (`Phase`: each one's I/O is a method of `Run`, the choice of the
//! next a pure function tested on its own), in a fixed order because
//! each one sizes the next: the echoes give the RTT that sets every later
//! timeout; the MTU search gives the packet size of the trains; the trains
//! go last so their queueing cannot disturb the RTT samples, and come in up
//! to [`MAX_ROUNDS`] rounds, the next only when the last ones disagree.
//! Round trips are what a probe of a long path costs, so nothing waits that
//! need not: the echoes follow the UDP hello without waiting for its answer
//! (the server reads in order, so the hello has bound the address by the
//! time they arrive; if nothing at all comes back, the hello is repeated
//! and waited for), the MTU search's first probe (the route MTU, which
//! passes on most paths and settles the search) rides along with the
//! echoes, and so does a forward probe's first train, at that probe's size.
//! With a server that collects pipelined, the timestamps are asked for
//! right behind each round's last train.
//! The socket has Don't Fragment set throughout, so no phase is silently
//! fragmented.
//!
//! With [`ProbeConfig::reverse`] the trains run the other way: the client
//! asks the server for them on the control channel (with the token the
//! server sent to this socket) and times their arrival here, so the
//! estimate is of the server → client direction. Echoes and the MTU search
//! are unchanged (an RTT has no direction; the MTU is the forward path's).

use std::collections::HashSet;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use fatpipe_engine::{connect_with, ClientOptions, ClientSession, Control};
use fatpipe_schema::tune::HostLimits;

use crate::estimate::{self, Arrival, RateEstimate, RttStats, TrainObs};
use crate::mtu::{MtuResult, MtuSearch};
use crate::wire::{
    Packet, ProbeMsg, ProbeParams, MAX_COLLECT_WAIT_MS, MAX_DATAGRAM, MAX_GAP_US, MAX_TRAINS,
    MAX_TRAIN_LEN, SERVICE,
};
use crate::{ip_overhead, send_train, ProbeError};
use fatpipe_sys::probe as sock;
use fatpipe_sys::udp::SendBatch;

/// What to probe and how hard.
#[derive(Debug, Clone)]
pub struct ProbeConfig {
    /// The server's control address.
    pub addr: SocketAddr,
    /// Key and timeouts for the session.
    pub options: ClientOptions,
    /// RTT echoes to send.
    pub echoes: u32,
    /// Time between echoes.
    pub echo_interval: Duration,
    /// Packet trains to send.
    pub trains: u32,
    /// Largest packet size (IP bytes) the trains use; the path MTU if smaller.
    pub max_train_packet: u32,
    /// Most bytes per train; trains are sized to the rate the first one
    /// shows, within this.
    pub train_bytes: u32,
    /// True to measure server → client: the server sends the trains.
    pub reverse: bool,
    /// True (the default) to collect the timestamps pipelined when the
    /// server can; false collects as clients before it did.
    pub pipelined: bool,
}

impl ProbeConfig {
    /// Defaults for a probe of `addr`: 10 echoes 20 ms apart, 10 trains of
    /// about 600 kB in packets of up to 9000 bytes. (1.5 MB trains, to
    /// span 2.5 ms at 5 Gbit/s, overran a loaded receiver on loopback,
    /// where reverse trains arrive at tens of Gbit/s.)
    pub fn new(addr: SocketAddr, options: ClientOptions) -> ProbeConfig {
        ProbeConfig {
            addr,
            options,
            echoes: 10,
            echo_interval: Duration::from_millis(20),
            trains: 10,
            max_train_packet: 9000,
            train_bytes: 600_000,
            reverse: false,
            pipelined: true,
        }
    }
}

/// Packets in the first train, which sizes the others.
const FIRST_TRAIN_LEN: u32 = 64;
/// Fewest packets in a train.
const MIN_TRAIN_LEN: u32 = 32;
/// How long, at the bottleneck, the trains after the first should last.
const TRAIN_SPAN: Duration = Duration::from_millis(4);
/// Rounds of trains sent at most while they disagree.
const MAX_ROUNDS: u32 = 3;
/// Confidence at which the trains count as agreeing.
const AGREED: f64 = 0.5;

/// Everything the probe measured, before it is turned into a report.
#[derive(Debug, Clone)]
pub struct ProbeOutcome {
    /// The server's control address.
    pub remote: SocketAddr,
    /// Round-trip statistics of the echoes.
    pub rtt: RttStats,
    /// Local route MTU toward the server, or why it is unknown.
    pub route_mtu: Result<u32, String>,
    /// The MTU search's outcome.
    pub mtu: MtuResult,
    /// IP size of the train packets.
    pub train_packet: u32,
    /// Packets per train (of the last train: the first one is shorter).
    pub train_len: u32,
    /// The bottleneck estimate; `None` when no train gave one.
    pub rate: Option<RateEstimate>,
    /// True when the server timed every arrival in the kernel.
    pub kernel_clock: bool,
    /// Train packets sent and received.
    pub train_packets: (u64, u64),
    /// The server's host limits, or why they are unknown.
    pub peer_limits: Result<HostLimits, String>,
    /// True when the trains ran server → client (`rate`, `kernel_clock`
    /// and `train_packets` describe that direction).
    pub reverse: bool,
    /// How long the probe took.
    pub elapsed: Duration,
}

/// Runs every phase against the server at `cfg.addr`.
pub fn run(cfg: &ProbeConfig) -> Result<ProbeOutcome, ProbeError> {
    let started = Instant::now();
    let params = ProbeParams {
        pipelined: cfg.pipelined,
        ..if cfg.reverse {
            ProbeParams::reverse()
        } else {
            ProbeParams::current()
        }
    };
    let session = connect_with(cfg.addr, &cfg.options, SERVICE, &params.encode())?;
    let control = session.control().clone();
    let result = probe(cfg, &session, &control, started);
    match &result {
        Ok(_) => {
            let _ = control.send(&ProbeMsg::Done.encode());
            control.close("");
        }
        Err(e) => control.close(&e.to_string()),
    }
    result
}

fn probe(
    cfg: &ProbeConfig,
    session: &ClientSession,
    control: &Control,
    started: Instant,
) -> Result<ProbeOutcome, ProbeError> {
    let mut run = Run::open(cfg, session, control)?;
    let mut phase = Phase::Start;
    loop {
        phase = match phase {
            Phase::Done => return run.outcome(started),
            p => run.step(p)?,
        };
    }
}

/// The probe client's phases. Each one's I/O is [`Run::step`]; which comes
/// next is decided from what it learnt ([`after_echoes`], [`after_round`],
/// pure and table-tested).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The UDP hello, and without waiting for its answer the MTU search's
    /// first probe and (forward) the first train's set-up.
    Start,
    /// RTT echoes, the first train right behind them.
    Echoes,
    /// (Reverse) the echoes came back but the server's token did not: ask
    /// for it again.
    Token,
    /// The MTU search, which sizes the trains.
    Mtu,
    /// The first train's acknowledgement, which sizes the others.
    FirstAck,
    /// Round `n` of trains.
    Round(u32),
    /// Measured.
    Done,
}

/// After the echoes: the token a reverse probe still lacks, else the MTU
/// search.
fn after_echoes(reverse: bool, have_token: bool) -> Phase {
    if reverse && !have_token {
        Phase::Token
    } else {
        Phase::Mtu
    }
}

/// After round `round` of trains (`trains` the trains in all so far,
/// `estimate` what they agree on): another round while they disagree and
/// the rounds and trains last; a sender-limited forward round is given one
/// more chance (a busy host descheduled the sender), twice in a row this
/// host is what limits them and more trains cannot help; a reverse round
/// ends on a sender-limited estimate at once (the server's host limits it).
fn after_round(round: u32, trains: u32, estimate: Option<&RateEstimate>, reverse: bool) -> Phase {
    let agreed = estimate.is_some_and(|e| e.confidence >= AGREED);
    let limited = estimate.is_some_and(|e| e.sender_limited);
    let done = agreed || (limited && (reverse || round > 0));
    if done || round + 1 >= MAX_ROUNDS || trains >= MAX_TRAINS {
        Phase::Done
    } else {
        Phase::Round(round + 1)
    }
}

/// One probe's socket and what its phases have learnt so far.
struct Run<'a> {
    cfg: &'a ProbeConfig,
    session: &'a ClientSession,
    control: &'a Control,
    io: Udp,
    /// IP and UDP header bytes of each datagram.
    overhead: u32,
    /// The smallest MTU the IP version guarantees.
    floor: u32,
    /// Trains asked for (the first round's).
    trains: u32,
    /// The server collects timestamps pipelined.
    pipelined: bool,
    peer_limits: Result<HostLimits, String>,
    route_mtu: Result<u32, String>,
    search: Option<MtuSearch>,
    /// The early MTU probe's size, if one went with the echoes.
    early: Option<u32>,
    first_train: Option<FirstTrain>,
    mtu_acks: Vec<u32>,
    rtt: Option<RttStats>,
    /// Reverse: the token that asks the server for trains.
    token: Option<u64>,
    /// Every wait after the echoes: twice the largest RTT and a margin.
    timeout: Duration,
    mtu: MtuResult,
    train_packet: u32,
    shape: Option<TrainShape>,
    sizer: Option<Sizer>,
    obs: Vec<TrainObs>,
    kernel_clock: bool,
}

impl<'a> Run<'a> {
    /// Waits for the server's `Ready` and opens the UDP socket to the port
    /// it names, Don't Fragment set.
    fn open(
        cfg: &'a ProbeConfig,
        session: &'a ClientSession,
        control: &'a Control,
    ) -> Result<Run<'a>, ProbeError> {
        let (udp_port, peer_limits, pipelined) = match recv_msg(control, Duration::from_secs(10))? {
            ProbeMsg::Ready {
                udp_port,
                limits,
                limits_error,
                reverse,
                pipelined,
            } => {
                if cfg.reverse && !reverse {
                    return Err(ProbeError::Unsupported(
                        "the server cannot probe in reverse (it predates reverse probing): upgrade it"
                            .into(),
                    ));
                }
                (
                    udp_port,
                    limits.ok_or_else(|| limits_error.unwrap_or_else(|| "not sent".into())),
                    pipelined,
                )
            }
            other => return Err(unexpected(&other, "Ready")),
        };
        let server_udp = SocketAddr::new(cfg.addr.ip(), udp_port);
        let local = match server_udp {
            SocketAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
            SocketAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
        };
        let udp = UdpSocket::bind(local).map_err(|e| ProbeError::io("bind UDP", e))?;
        udp.connect(server_udp)
            .map_err(|e| ProbeError::io(format!("connect UDP to {server_udp}"), e))?;
        let v6 = server_udp.is_ipv6() && ip_overhead(server_udp) == 48;
        let df = sock::set_df_probe(&udp, v6);
        // Replies are timed by the kernel too, so this process being
        // descheduled between the reply's arrival and `recv` costs nothing.
        let _ = sock::enable_rx_timestamps(&udp);
        let io = Udp {
            sock: udp,
            buf: vec![0; MAX_DATAGRAM],
            stamp: None,
            len: 0,
            token: None,
            hello_answered: false,
        };
        if cfg.reverse {
            // A whole train must wait here while this thread is descheduled.
            let _ = fatpipe_sys::buffers::set_recv_buffer(
                &io.sock,
                8 << 20,
                fatpipe_audit::host::is_privileged(),
            );
        }
        let route_mtu = match df {
            Ok(()) => sock::route_mtu(&io.sock, v6).map_err(|e| e.to_string()),
            Err(e) => Err(format!("cannot set Don't Fragment: {e}")),
        };
        Ok(Run {
            cfg,
            session,
            control,
            io,
            overhead: ip_overhead(server_udp) as u32,
            floor: if v6 { 1280 } else { 576 },
            trains: cfg.trains.clamp(1, MAX_TRAINS),
            pipelined,
            peer_limits,
            route_mtu,
            search: None,
            early: None,
            first_train: None,
            mtu_acks: Vec::new(),
            rtt: None,
            token: None,
            timeout: Duration::from_millis(50),
            mtu: MtuResult {
                path_mtu: None,
                probes: 0,
            },
            train_packet: 0,
            shape: None,
            sizer: None,
            obs: Vec::new(),
            kernel_clock: true,
        })
    }

    /// Runs phase `p`; returns the next.
    fn step(&mut self, p: Phase) -> Result<Phase, ProbeError> {
        match p {
            Phase::Start => self.start(),
            Phase::Echoes => self.echo(),
            Phase::Token => {
                hello(&mut self.io, self.session)?;
                self.take_token()?;
                Ok(Phase::Mtu)
            }
            Phase::Mtu => self.search_mtu(),
            Phase::FirstAck => self.first_ack(),
            Phase::Round(n) => self.round(n),
            Phase::Done => Ok(Phase::Done),
        }
    }

    /// Trains of `packet`-byte datagrams.
    fn shape_of(&self, packet: u32) -> TrainShape {
        TrainShape {
            packet,
            payload: packet.saturating_sub(self.overhead) as usize,
            max_len: (self.cfg.train_bytes / packet).clamp(MIN_TRAIN_LEN, MAX_TRAIN_LEN),
        }
    }

    /// The hello goes out and everything after it follows without waiting
    /// for its answer: the server reads its socket in order, so the hello
    /// has bound this address before the echoes arrive. The MTU search's
    /// first probe (the route MTU, which passes on most paths) goes along
    /// with the echoes, and so does a forward probe's first train, at the
    /// size that probe tests: on most paths they cost no round trip of
    /// their own.
    fn start(&mut self) -> Result<Phase, ProbeError> {
        send_hello(&self.io, self.session)?;
        let ceiling = MAX_DATAGRAM as u32 + self.overhead;
        self.search = self
            .route_mtu
            .as_ref()
            .ok()
            .map(|route| MtuSearch::new(self.floor, (*route).min(ceiling), 2));
        if let Some(s) = self.search.as_mut() {
            if let Some(size) = s.poll_probe() {
                if send_mtu_probe(&self.io, 1, size, self.overhead)? {
                    self.early = Some(size);
                } else {
                    s.handle_too_big(size);
                }
            }
        }
        if let (Some(size), false, true) = (self.early, self.cfg.reverse, self.trains > 1) {
            let shape = self.shape_of(size.min(self.cfg.max_train_packet).max(self.floor));
            self.io.fit_send_buffer(&shape);
            self.first_train = Some(FirstTrain {
                shape,
                sent: None,
                ack: None,
            });
        }
        Ok(Phase::Echoes)
    }

    /// The echoes. If nothing came back, not even the hello's answer, the
    /// hello (or everything) was lost: hello again, waiting this time, and
    /// echo again; the early MTU probe and train count as lost.
    fn echo(&mut self) -> Result<Phase, ProbeError> {
        let (io, cfg) = (&mut self.io, self.cfg);
        let rtt = match echoes(io, cfg, self.first_train.as_mut(), &mut self.mtu_acks) {
            Ok(rtt) => rtt,
            Err(ProbeError::Timeout(_)) if !io.hello_answered => {
                self.first_train = None;
                hello(io, self.session)?;
                echoes(io, cfg, None, &mut self.mtu_acks)?
            }
            Err(e) => return Err(e),
        };
        self.timeout = (rtt.max * 2 + Duration::from_millis(20)).max(Duration::from_millis(50));
        self.rtt = Some(rtt);
        if !self.cfg.reverse || self.io.token.is_some() {
            self.take_token()?;
        }
        Ok(after_echoes(self.cfg.reverse, self.token.is_some()))
    }

    /// A reverse probe's token, which the server must have sent by now.
    fn take_token(&mut self) -> Result<(), ProbeError> {
        self.token = match (self.cfg.reverse, self.io.token) {
            (false, _) => None,
            (true, Some(t)) => Some(t),
            (true, None) => {
                return Err(ProbeError::Protocol(
                    "the server took a reverse session but sent no token".into(),
                ))
            }
        };
        Ok(())
    }

    /// The MTU search, then the trains' packet size and shape.
    fn search_mtu(&mut self) -> Result<Phase, ProbeError> {
        if let Some(mut s) = self.search.take() {
            if let Some(size) = self.early {
                // Echoes take a round trip and more: a probe that passed
                // has been answered by now. Unanswered, it counts as one
                // of its size's tries and the search goes on as usual.
                if self.mtu_acks.contains(&size) {
                    s.handle_ack(size);
                } else {
                    s.handle_timeout(size);
                }
            }
            self.mtu = search_mtu(&mut self.io, s, self.overhead, self.timeout, 1)?;
        }
        self.train_packet = self
            .mtu
            .path_mtu
            .unwrap_or(1500)
            .min(self.cfg.max_train_packet)
            .max(self.floor);
        let shape = self.shape_of(self.train_packet);
        if self
            .first_train
            .as_ref()
            .is_none_or(|t| t.shape.packet != shape.packet)
        {
            self.io.fit_send_buffer(&shape);
        }
        self.sizer = Some(Sizer::new(&shape));
        self.shape = Some(shape);
        Ok(Phase::FirstAck)
    }

    /// The first train, if it went with the echoes: its acknowledgement is
    /// usually in by the time the echoes are; it sizes the others.
    fn first_ack(&mut self) -> Result<Phase, ProbeError> {
        let (Some(shape), Some(sizer)) = (&self.shape, self.sizer.as_mut()) else {
            return Ok(Phase::Round(0));
        };
        if let Some(FirstTrain {
            shape: first_shape,
            sent: Some((len, (send_span_ns, send_busy_ns), at)),
            mut ack,
        }) = self.first_train.take()
        {
            self.obs.push(TrainObs {
                sent: len,
                ip_bytes: first_shape.packet,
                send_span_ns,
                send_busy_ns,
                arrivals: Vec::new(),
            });
            let deadline = at + self.timeout + sizer.drain(&first_shape, len) * 2;
            while ack.is_none() {
                match self.io.recv_until(deadline)? {
                    Some(Packet::TrainAck {
                        train: 0,
                        received,
                        span_ns,
                    }) => ack = Some((received, span_ns)),
                    Some(_) => {}
                    None => break,
                }
            }
            match ack {
                Some((received, span_ns)) => sizer.handle_ack(&first_shape, len, received, span_ns),
                None => sizer.handle_lost_tail(shape),
            }
        }
        Ok(Phase::Round(0))
    }

    /// One round of trains until they agree (or the rounds run out): a
    /// receiver or forwarder descheduled during a round spoils its trains,
    /// and more trains are cheaper than a wrong rate. The first train, if
    /// it went with the echoes, is one of the first round's.
    fn round(&mut self, round: u32) -> Result<Phase, ProbeError> {
        let (Some(shape), Some(sizer)) = (&self.shape, self.sizer.as_mut()) else {
            return Ok(Phase::Done);
        };
        let first = self.obs.len() as u32;
        let n = if round == 0 {
            self.trains.saturating_sub(first)
        } else {
            self.trains.min(MAX_TRAINS - first)
        };
        if n == 0 {
            return Ok(Phase::Done);
        }
        if let Some(token) = self.token {
            let r = Round {
                token,
                first,
                trains: n,
                overhead: self.overhead as usize,
                timeout: self.timeout,
            };
            let (got, kernel) = reverse_round(&mut self.io, self.control, &r, shape, sizer)?;
            self.obs.extend(got);
            self.kernel_clock &= kernel;
        } else {
            let sent = send_trains(
                &mut self.io,
                first,
                n,
                shape,
                sizer,
                self.timeout,
                self.pipelined,
            )?;
            for &(len, (send_span_ns, send_busy_ns)) in &sent.trains {
                self.obs.push(TrainObs {
                    sent: len,
                    ip_bytes: self.train_packet,
                    send_span_ns,
                    send_busy_ns,
                    arrivals: Vec::new(),
                });
            }
            let last = first + n - 1;
            let wait = sent.collect_wait.map(|w| (last, w));
            self.kernel_clock = collect(self.control, &mut self.obs, wait)?;
            if sent.collect_wait.is_some() {
                // The last train was not waited for: its report sizes the
                // next round instead of its acknowledgement.
                if let Some(t) = self.obs.last() {
                    sizer.handle_report(shape, t);
                }
            }
        }
        let e = estimate::combine(&self.obs);
        Ok(after_round(
            round,
            self.obs.len() as u32,
            e.as_ref(),
            self.token.is_some(),
        ))
    }

    /// Everything measured.
    fn outcome(self, started: Instant) -> Result<ProbeOutcome, ProbeError> {
        let rtt = self
            .rtt
            .ok_or_else(|| ProbeError::Protocol("the probe ended before its echoes".into()))?;
        let received: u64 = self.obs.iter().map(|t| t.arrivals.len() as u64).sum();
        let sent_packets: u64 = self.obs.iter().map(|t| u64::from(t.sent)).sum();
        // The length the sizing settled on (the last train's) is the one to show.
        let train_len = self.obs.last().map_or(0, |t| t.sent);
        Ok(ProbeOutcome {
            remote: self.cfg.addr,
            rtt,
            route_mtu: self.route_mtu,
            mtu: self.mtu,
            train_packet: self.train_packet,
            train_len,
            rate: estimate::combine(&self.obs),
            kernel_clock: self.kernel_clock,
            train_packets: (sent_packets, received),
            peer_limits: self.peer_limits,
            reverse: self.cfg.reverse,
            elapsed: started.elapsed(),
        })
    }
}

/// The UDP socket and what every phase needs around it.
struct Udp {
    sock: UdpSocket,
    buf: Vec<u8>,
    /// Kernel receive time (realtime ns) of the last packet returned by
    /// [`Udp::recv_until`], if the kernel gave one.
    stamp: Option<u64>,
    /// UDP payload bytes of that packet.
    len: usize,
    /// Reverse sessions: the token from the server's `HelloToken`.
    token: Option<u64>,
    /// True once the server answered a hello.
    hello_answered: bool,
}

impl Udp {
    /// Takes in a hello's answer; false for any other packet.
    fn hello_answer(&mut self, p: &Packet) -> bool {
        match *p {
            Packet::HelloAck => {}
            Packet::HelloToken { token } => self.token = Some(token),
            _ => return false,
        }
        self.hello_answered = true;
        true
    }

    /// Room in the send buffer for two of the longest trains of `shape`.
    /// Best effort: a smaller buffer only makes `sendmmsg` wait.
    fn fit_send_buffer(&self, shape: &TrainShape) {
        let bytes = u64::from(shape.packet) * u64::from(shape.max_len) * 2;
        let _ = fatpipe_sys::buffers::set_send_buffer(&self.sock, bytes, false);
    }

    fn send(&self, packet: Packet, total: usize) -> io::Result<()> {
        let mut out = Vec::with_capacity(total.max(packet.header_len()));
        packet.encode(&mut out, total);
        self.sock.send(&out).map(|_| ())
    }

    /// The next probe reply before `deadline`; `None` when time runs out.
    /// Datagrams that do not decode are skipped.
    fn recv_until(&mut self, deadline: Instant) -> Result<Option<Packet>, ProbeError> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.sock
                .set_read_timeout(Some(left))
                .map_err(|e| ProbeError::io("set UDP timeout", e))?;
            match sock::recv_timestamped(&self.sock, &mut self.buf) {
                Ok((n, _, stamp)) => {
                    if let Ok(p) = Packet::decode(&self.buf[..n]) {
                        self.stamp = stamp;
                        self.len = n;
                        return Ok(Some(p));
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) => {}
                // An ICMP error from an earlier datagram (port unreachable):
                // the server's socket is gone.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    return Err(ProbeError::io("UDP probe refused by the server host", e))
                }
                Err(e) => return Err(ProbeError::io("receive UDP reply", e)),
            }
        }
    }
}

/// Sends the session's cookie from this UDP address, once.
fn send_hello(io: &Udp, session: &ClientSession) -> Result<(), ProbeError> {
    io.send(
        Packet::Hello {
            cookie: *session.cookie(),
        },
        0,
    )
    .map_err(|e| ProbeError::io("send UDP hello", e))
}

/// Proves the session's cookie from this UDP address, waiting for the
/// answer and retrying for 5 s.
fn hello(io: &mut Udp, session: &ClientSession) -> Result<(), ProbeError> {
    let give_up = Instant::now() + Duration::from_secs(5);
    while Instant::now() < give_up {
        send_hello(io, session)?;
        let wait = (Instant::now() + Duration::from_millis(250)).min(give_up);
        while let Some(p) = io.recv_until(wait)? {
            if io.hello_answer(&p) {
                return Ok(());
            }
        }
    }
    Err(ProbeError::Timeout(
        "no UDP reply from the server in 5 s (is UDP filtered on the path?)".into(),
    ))
}

/// A forward probe's first train, sent right behind the last echo at the
/// size of the early MTU probe (which passes on most paths), so that its
/// round trip overlaps the echoes'.
struct FirstTrain {
    /// Its packets.
    shape: TrainShape,
    /// Once sent: packets, send span and busy time (ns), when.
    sent: Option<(u32, (u64, u64), Instant)>,
    /// Its `TrainAck` (received, span in ns), if it came with the echoes.
    ack: Option<(u32, u64)>,
}

/// Sends `cfg.echoes` echoes `cfg.echo_interval` apart and collects replies,
/// then `first_train` (if any) right behind the last. A hello's answer
/// that arrives meanwhile is taken in, the first train's acknowledgement
/// kept with it, and MTU probe acknowledgements go to `mtu_acks`.
fn echoes(
    io: &mut Udp,
    cfg: &ProbeConfig,
    mut first_train: Option<&mut FirstTrain>,
    mtu_acks: &mut Vec<u32>,
) -> Result<RttStats, ProbeError> {
    let n = cfg.echoes.max(1);
    let mut samples = Vec::with_capacity(n as usize);
    let mut seen = HashSet::new();
    let mut sent = 0u32;
    let mut next = Instant::now();
    let mut last_deadline = None;
    let mut last_sent = next;
    loop {
        let now = Instant::now();
        if sent < n && now >= next {
            let sent_ns = sock::realtime_ns();
            io.send(Packet::Echo { seq: sent, sent_ns }, 0)
                .map_err(|e| ProbeError::io("send echo", e))?;
            sent += 1;
            next += cfg.echo_interval;
            if sent == n {
                if let Some(t) = first_train.as_deref_mut() {
                    let len = FIRST_TRAIN_LEN.min(t.shape.max_len);
                    let at = Instant::now();
                    let span =
                        send_train(&io.sock, &mut SendBatch::new(), 0, len, t.shape.payload)?;
                    t.sent = Some((len, span, at));
                }
                let slowest = samples.iter().copied().max().unwrap_or(Duration::ZERO);
                last_deadline = Some(now + (slowest * 3).max(Duration::from_secs(1)));
                last_sent = now;
            }
            continue;
        }
        let wait_until = match last_deadline {
            Some(d) if samples.len() as u32 == n || now >= d => break,
            Some(d) => match stragglers_given_up(&samples, n, last_sent) {
                Some(by) if now >= by => break,
                Some(by) => by.min(d),
                None => d,
            },
            None => next,
        };
        match io.recv_until(wait_until)? {
            Some(Packet::EchoReply {
                seq,
                sent_ns,
                hold_ns,
            }) => {
                let at = io.stamp.unwrap_or_else(sock::realtime_ns);
                if seq < sent && seen.insert(seq) {
                    if let Some(rtt) = echo_rtt(sent_ns, at, hold_ns) {
                        samples.push(rtt);
                    }
                }
            }
            Some(Packet::TrainAck {
                train: 0,
                received,
                span_ns,
            }) if first_train.is_some() => {
                if let Some(t) = first_train.as_deref_mut() {
                    t.ack = Some((received, span_ns));
                }
            }
            Some(Packet::MtuAck { size, .. }) => mtu_acks.push(size),
            Some(p) => {
                io.hello_answer(&p);
            }
            None => {}
        }
    }
    estimate::rtt_stats(sent, &samples).ok_or_else(|| {
        ProbeError::Timeout(format!("none of {sent} echoes came back from the server"))
    })
}

/// When the echoes still missing count as lost: once at least half of the
/// `n` are back, the last one (sent at `last_sent`) has had half as long
/// again as the slowest reply seen, and 20 ms. `None` while fewer than half
/// are back (then the caller's own deadline, a second or more, stands).
///
/// On a lossy path one of a handful of echoes is often lost (at 1 % each
/// way, one of 5 in about 10 % of probes); waiting out the full deadline
/// for it cost 0.77 s at 228 ms, about three round trips of a copy's
/// start-up, for a sample the minimum RTT does not need.
fn stragglers_given_up(samples: &[Duration], n: u32, last_sent: Instant) -> Option<Instant> {
    if samples.is_empty() || (samples.len() as u32) * 2 < n {
        return None;
    }
    let slowest = samples.iter().copied().max()?;
    Some(last_sent + slowest * 3 / 2 + Duration::from_millis(20))
}

/// One echo's round trip: sent at `sent_ns`, reply received at `at_ns`
/// (both realtime ns), minus the `hold_ns` the server held it. `None` when
/// the numbers cannot be a round trip (a clock step, a forged reply).
fn echo_rtt(sent_ns: u64, at_ns: u64, hold_ns: u64) -> Option<Duration> {
    let total = at_ns.checked_sub(sent_ns)?;
    if total > 60_000_000_000 {
        return None;
    }
    // A hold longer than the whole round trip is not believable: keep the
    // unadjusted time rather than invent one.
    let rtt = total.checked_sub(hold_ns).unwrap_or(total);
    Some(Duration::from_nanos(rtt))
}

/// Sends an MTU probe of `size` IP bytes as number `seq`; false when this
/// host refused the size (larger than the local device).
fn send_mtu_probe(io: &Udp, seq: u32, size: u32, overhead: u32) -> Result<bool, ProbeError> {
    let payload = size.saturating_sub(overhead) as usize;
    match io.send(Packet::Mtu { seq, size }, payload) {
        Ok(()) => Ok(true),
        Err(e) if sock::is_too_big(&e) => Ok(false),
        Err(e) => Err(ProbeError::io(format!("send MTU probe of {size} B"), e)),
    }
}

/// Drives the MTU search with padded probes, numbered after the `sent`
/// already sent.
fn search_mtu(
    io: &mut Udp,
    mut search: MtuSearch,
    overhead: u32,
    timeout: Duration,
    sent: u32,
) -> Result<MtuResult, ProbeError> {
    let mut seq = sent;
    while let Some(size) = search.poll_probe() {
        seq += 1;
        if !send_mtu_probe(io, seq, size, overhead)? {
            search.handle_too_big(size);
            continue;
        }
        let deadline = Instant::now() + timeout;
        loop {
            match io.recv_until(deadline)? {
                Some(Packet::MtuAck { size: acked, .. }) => {
                    search.handle_ack(acked);
                    if search.pending() != Some(size) {
                        break;
                    }
                }
                Some(_) => {}
                None => {
                    search.handle_timeout(size);
                    break;
                }
            }
        }
    }
    Ok(search.result())
}

/// Packet size and bounds of the trains.
struct TrainShape {
    /// IP bytes per packet.
    packet: u32,
    /// UDP payload bytes per packet.
    payload: usize,
    /// Most packets per train (the configured train bytes).
    max_len: u32,
}

/// What [`send_trains`] sent.
struct SentTrains {
    /// Each train's length, and its send span and busy time in ns.
    trains: Vec<(u32, (u64, u64))>,
    /// Pipelined: the last train was not waited for; the server should
    /// wait this long for it before reporting.
    collect_wait: Option<Duration>,
}

/// Sends trains numbered `first..first + trains` and returns each one's
/// length, send span and busy time in ns.
///
/// With `pipelined` (the server said it can), the last train of the round
/// is not waited for either: `Collect` follows it at once and the server
/// holds the reports until it is in, which saves a round trip a round.
///
/// Until a train has reported a rate, each train waits for the previous
/// one's acknowledgement, so the first trains never queue behind each
/// other. After that, trains leave twice their drain time at the last rate
/// apart without waiting a round trip each: on a 228 ms path ten trains
/// take a quarter of a second instead of two. The round ends when its last
/// train is acknowledged (or timed out), so the server holds every arrival
/// before the client collects them.
///
/// The very first train is short ([`FIRST_TRAIN_LEN`]); the rate each
/// acknowledgement shows sizes the next trains to span about [`TRAIN_SPAN`]
/// at the bottleneck. A fixed size would either overflow the queue of a
/// slow link (a 600 kB train into a 50 Mbit/s × 40 ms link's 250 kB queue
/// loses half of itself) or span too little time on a fast one for the
/// receiver's timer to resolve.
fn send_trains(
    io: &mut Udp,
    first: u32,
    trains: u32,
    shape: &TrainShape,
    sizer: &mut Sizer,
    timeout: Duration,
    pipelined: bool,
) -> Result<SentTrains, ProbeError> {
    let mut batch = SendBatch::new();
    let mut out: Vec<(u32, (u64, u64))> = Vec::with_capacity(trains as usize);
    let last = first + trains - 1;
    for train in first..=last {
        let len = sizer.len;
        out.push((
            len,
            send_train(&io.sock, &mut batch, train, len, shape.payload)?,
        ));
        let drain = sizer.drain(shape, len);
        if train == last && pipelined {
            return Ok(SentTrains {
                trains: out,
                collect_wait: Some(timeout + drain * 2),
            });
        }
        let wait_for = if train == last || sizer.measured.is_none() {
            Some(train)
        } else {
            None
        };
        let deadline = match wait_for {
            Some(_) => Instant::now() + timeout + drain * 2,
            None => Instant::now() + (drain * 2).max(Duration::from_millis(1)),
        };
        let mut acked = false;
        while let Some(p) = io.recv_until(deadline)? {
            if let Packet::TrainAck {
                train: t,
                received,
                span_ns,
            } = p
            {
                let sent = t
                    .checked_sub(first)
                    .and_then(|i| out.get(i as usize))
                    .map(|o| o.0);
                if let Some(sent) = sent {
                    sizer.handle_ack(shape, sent, received, span_ns);
                }
                if Some(t) == wait_for {
                    acked = true;
                    break;
                }
            }
        }
        if wait_for.is_some() && !acked {
            sizer.handle_lost_tail(shape);
        }
    }
    Ok(SentTrains {
        trains: out,
        collect_wait: None,
    })
}

/// One round of reverse trains: what to ask for.
struct Round {
    /// The server's token.
    token: u64,
    /// First train number.
    first: u32,
    /// Trains in the round.
    trains: u32,
    /// IP and UDP header bytes (arrivals count whole IP packets).
    overhead: usize,
    /// How long to wait beyond a train's drain time.
    timeout: Duration,
}

/// Asks the server for a round of trains and times their arrival here.
/// Until a train has shown the rate, trains are asked for one at a time
/// (the first is short) so the sizing works as in the forward probe; then
/// the rest of the round in one request, twice their drain time apart.
/// Returns the trains, with the server's send spans, and whether every
/// arrival was timed by the kernel.
fn reverse_round(
    io: &mut Udp,
    control: &Control,
    round: &Round,
    shape: &TrainShape,
    sizer: &mut Sizer,
) -> Result<(Vec<TrainObs>, bool), ProbeError> {
    let mut obs = Vec::with_capacity(round.trains as usize);
    let mut kernel = true;
    let end = round.first + round.trains;
    let mut next = round.first;
    while next < end {
        let count = if sizer.measured.is_none() {
            1
        } else {
            end - next
        };
        let len = sizer.len;
        let drain = sizer.drain(shape, len);
        let gap = (drain * 2)
            .max(Duration::from_millis(1))
            .min(Duration::from_micros(u64::from(MAX_GAP_US)));
        control.send(
            &ProbeMsg::SendTrains {
                token: round.token,
                first: next,
                count,
                len,
                size: shape.packet,
                gap_us: gap.as_micros() as u32,
            }
            .encode(),
        )?;
        let mut arrivals: Vec<Vec<Arrival>> = vec![Vec::new(); count as usize];
        let mut tails = 0u32;
        let deadline = Instant::now() + round.timeout + (drain + gap) * count;
        while tails < count {
            let Some(p) = io.recv_until(deadline)? else {
                break;
            };
            let Packet::Train {
                train,
                index,
                count: of,
            } = p
            else {
                continue;
            };
            if train < next || train >= next + count || of != len {
                continue;
            }
            let at_ns = io.stamp.unwrap_or_else(|| {
                kernel = false;
                sock::realtime_ns()
            });
            let list = &mut arrivals[(train - next) as usize];
            if list.len() < len as usize {
                list.push(Arrival {
                    index,
                    at_ns,
                    ip_bytes: (io.len + round.overhead) as u32,
                });
            }
            if index + 1 == len {
                tails += 1;
            }
        }
        let sent = match recv_msg(control, Duration::from_secs(10))? {
            ProbeMsg::Sent { trains } => trains,
            other => return Err(unexpected(&other, "Sent")),
        };
        for (i, list) in arrivals.into_iter().enumerate() {
            let train = next + i as u32;
            let send_span_ns = sent.iter().find(|s| s.0 == train).map_or(0, |s| s.2);
            let t = TrainObs {
                sent: len,
                ip_bytes: shape.packet,
                send_span_ns,
                // The server reports its span only.
                send_busy_ns: 0,
                arrivals: list,
            };
            sizer.handle_report(shape, &t);
            obs.push(t);
        }
        next += count;
    }
    Ok((obs, kernel))
}

/// The train length, from the rate the acknowledged trains showed.
struct Sizer {
    /// Packets in the next train.
    len: u32,
    /// Last rough rate (bit/s) a train showed, if any has.
    measured: Option<f64>,
}

impl Sizer {
    fn new(shape: &TrainShape) -> Sizer {
        Sizer {
            len: FIRST_TRAIN_LEN.min(shape.max_len),
            measured: None,
        }
    }

    /// How long `len` packets take through the bottleneck; until a train
    /// has shown the rate, a slow 10 Mbit/s one is assumed.
    fn drain(&self, shape: &TrainShape, len: u32) -> Duration {
        let rate = self.measured.unwrap_or(10e6);
        Duration::from_secs_f64((f64::from(len) * f64::from(shape.packet) * 8.0 / rate).min(5.0))
    }

    /// A train of `sent` packets was acknowledged: `received` arrived,
    /// first to last over `span_ns`.
    fn handle_ack(&mut self, shape: &TrainShape, sent: u32, received: u32, span_ns: u64) {
        if received < 2 || span_ns == 0 {
            return self.handle_lost_tail(shape);
        }
        let bytes = f64::from(received - 1) * f64::from(shape.packet);
        let rate = bytes * 8.0 / (span_ns as f64 * 1e-9);
        self.measured = Some(rate);
        let want = rate / 8.0 * TRAIN_SPAN.as_secs_f64() / f64::from(shape.packet);
        let mut len = (want.round() as u32).clamp(MIN_TRAIN_LEN, shape.max_len);
        // A train that lost a tenth of itself met a queue shorter than it.
        if received * 10 < sent * 9 {
            len = len.min(received / 2).max(MIN_TRAIN_LEN);
        }
        self.len = len;
    }

    /// A train's arrivals came instead of its acknowledgement (a pipelined
    /// round's last train, or a reverse train timed here): the same
    /// reading, from the arrivals; a missing last packet counts as a lost
    /// tail, as the missing acknowledgement does.
    fn handle_report(&mut self, shape: &TrainShape, train: &TrainObs) {
        let tail = train.arrivals.iter().any(|a| a.index + 1 == train.sent);
        let first = train.arrivals.iter().map(|a| a.at_ns).min();
        let last = train.arrivals.iter().map(|a| a.at_ns).max();
        match (tail, first, last) {
            (true, Some(f), Some(l)) => {
                self.handle_ack(shape, train.sent, train.arrivals.len() as u32, l - f)
            }
            _ => self.handle_lost_tail(shape),
        }
    }

    /// A train's last packet never arrived: a short queue or a lossy path.
    /// Shorter trains lose less of themselves.
    fn handle_lost_tail(&mut self, shape: &TrainShape) {
        self.len = MIN_TRAIN_LEN.min(shape.max_len);
    }
}

/// Asks the server for every train's arrivals and fills them into `obs`
/// (indexed by train number). Returns whether the kernel timed them all.
fn collect(
    control: &Control,
    obs: &mut [TrainObs],
    wait: Option<(u32, Duration)>,
) -> Result<bool, ProbeError> {
    let (wait_for, wait_ms) = match wait {
        Some((train, d)) => (
            Some(train),
            (d.as_millis() as u32).clamp(1, MAX_COLLECT_WAIT_MS),
        ),
        None => (None, 0),
    };
    control.send(&ProbeMsg::Collect { wait_for, wait_ms }.encode())?;
    let patience = Duration::from_secs(10) + Duration::from_millis(u64::from(wait_ms));
    loop {
        match recv_msg(control, patience)? {
            ProbeMsg::Train { train, arrivals } => {
                if let Some(t) = obs.get_mut(train as usize) {
                    t.arrivals = arrivals
                        .into_iter()
                        .map(|(index, at_ns, ip_bytes)| Arrival {
                            index,
                            at_ns,
                            ip_bytes,
                        })
                        .collect();
                }
            }
            ProbeMsg::Collected { kernel_clock, .. } => return Ok(kernel_clock),
            other => return Err(unexpected(&other, "Train or Collected")),
        }
    }
}

fn recv_msg(control: &Control, timeout: Duration) -> Result<ProbeMsg, ProbeError> {
    let bytes = control
        .recv(Some(timeout))?
        .ok_or_else(|| ProbeError::Timeout("waiting for the probe server".into()))?;
    match ProbeMsg::decode(&bytes)? {
        ProbeMsg::Error { message } => Err(ProbeError::Peer(message)),
        m => Ok(m),
    }
}

fn unexpected(got: &ProbeMsg, want: &str) -> ProbeError {
    ProbeError::Protocol(format!(
        "expected {want} from the server, got {}",
        got.name()
    ))
}

#[cfg(test)]
mod tests;
