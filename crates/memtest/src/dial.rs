//! Opening a test's streams: TCP data connections dialed in parallel, UDP
//! sockets bound and greeted, and the socket settings each end applied.

use super::*;

pub(super) fn new_stream(id: u32, role: Role, sock: Sock, p: &TestParams) -> Stream {
    if let (Sock::Udp(u), Role::Recv) = (&sock, role) {
        data::configure_udp_receiver(u, p);
    }
    let setup = data::setup_of(id, &sock, role, p);
    Stream {
        id,
        role,
        sock: Arc::new(sock),
        counters: Arc::default(),
        setup,
    }
}

/// The client's role on each stream id: it sends where `client_sends`.
pub(super) fn client_roles(
    ids: std::ops::Range<u32>,
    client_sends: impl Fn(u32) -> bool,
) -> Vec<(u32, Role)> {
    ids.map(|id| {
        let role = if client_sends(id) {
            Role::Send
        } else {
            Role::Recv
        };
        (id, role)
    })
    .collect()
}

pub(super) fn open_tcp_streams(
    session: &ClientSession,
    p: &TestParams,
    warnings: &mut Vec<String>,
) -> Result<Vec<Stream>> {
    let ids = client_roles(0..p.total_streams(), |id| p.client_sends(id));
    let mut streams = Vec::with_capacity(ids.len());
    for (stream, w) in dial_tcp_streams(session, p, &ids)? {
        // The same refusal on every stream is one warning, not a thousand.
        for line in w {
            if !warnings.contains(&line) {
                warnings.push(line);
            }
        }
        streams.push(stream);
    }
    Ok(streams)
}

/// Dials the data connections `ids` (with this end's role on each), in
/// parallel, configured by `p`; sorted by id.
///
/// Up to [`DIALERS`] are set up at once, all on the calling thread (the
/// engine's [`open_data_many`](ClientSession::open_data_many)): one at a
/// time, a thousand streams over a 250 ms path would take minutes of round
/// trips before the test even starts, and a thread each in flight made
/// the client's set-up its thread peak.
pub(super) fn dial_tcp_streams(
    session: &ClientSession,
    p: &TestParams,
    ids: &[(u32, Role)],
) -> Result<Vec<Dialed>> {
    let roles: HashMap<u32, Role> = ids.iter().copied().collect();
    let tags: Vec<u32> = ids.iter().map(|&(id, _)| id).collect();
    // Each socket's warnings, from its last configuration (a slow connect
    // is dialled again on a fresh socket).
    let warned = std::sync::Mutex::new(HashMap::<u32, Vec<String>>::new());
    let configure = |id: u32, sock: &socket2::Socket| {
        let mut w = Vec::new();
        if let Some(&role) = roles.get(&id) {
            data::configure_tcp(sock, p, role, &mut w);
        }
        warned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, w);
        Ok(())
    };
    let dial = fatpipe_engine::dial::DataDial {
        tags: &tags,
        attach: fatpipe_engine::dial::Attach::Acked,
        configure: Some(&configure),
        at_once: DIALERS as usize,
    };
    let mut opened = Vec::with_capacity(ids.len());
    let mut failed = None;
    session.open_data_many(&dial, &mut |id, r| match r {
        Ok(tcp) => opened.push((id, tcp)),
        Err(e) => {
            failed.get_or_insert((id, e));
        }
    });
    if let Some((_, e)) = failed {
        return Err(e);
    }
    let mut warned = warned.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut streams: Vec<Dialed> = opened
        .into_iter()
        .map(|(id, tcp)| {
            let role = roles.get(&id).copied().unwrap_or(Role::Send);
            let w = warned.remove(&id).unwrap_or_default();
            (new_stream(id, role, Sock::Tcp(tcp), p), w)
        })
        .collect();
    streams.sort_by_key(|(s, _)| s.id);
    Ok(streams)
}

/// A dialed stream and the warnings its socket options raised.
pub(super) type Dialed = (Stream, Vec<String>);

/// Most data connections a client sets up at once (on one thread: 1,024
/// streams in eight waves of a few round trips; half the server's
/// per-source handshake cap, 256, left to another client on the host).
pub(super) const DIALERS: u32 = 128;

/// UDP: one socket per stream connected to the server's port for it; hellos
/// carrying the cookie tell the server where the client is, repeated until
/// the server confirms with `Attached`.
pub(super) fn open_udp_streams(
    session: &ClientSession,
    p: &TestParams,
    ports: &[u16],
    warnings: &mut Vec<String>,
) -> Result<(Vec<Stream>, Vec<SocketSetup>)> {
    if ports.len() != p.total_streams() as usize {
        return Err(EngineError::Service(format!(
            "server offered {} UDP ports for {} streams",
            ports.len(),
            p.total_streams()
        )));
    }
    let local_ip = session.local_addr().ip();
    let server_ip = session.peer_addr().ip();
    let mut socks = Vec::with_capacity(ports.len());
    for &port in ports {
        let u = UdpSocket::bind(SocketAddr::new(local_ip, 0))
            .map_err(|e| EngineError::io("bind UDP socket", e))?;
        let mut w = Vec::new();
        data::configure_buffers(&u, p, &mut w);
        for line in w {
            if !warnings.contains(&line) {
                warnings.push(line);
            }
        }
        u.connect(SocketAddr::new(server_ip, port))
            .map_err(|e| EngineError::io("connect UDP socket", e))?;
        socks.push(u);
    }
    let control = session.control();
    let deadline = Instant::now() + SETUP_TIMEOUT;
    let mut remote = Vec::new();
    loop {
        for (id, u) in socks.iter().enumerate() {
            let mut hello = Vec::with_capacity(40);
            hello.extend_from_slice(data::UDP_HELLO);
            hello.extend_from_slice(session.cookie());
            hello.extend_from_slice(&(id as u32).to_be_bytes());
            // Lost or refused hellos are retried on the next round.
            let _ = u.send(&hello);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(EngineError::Timeout("attaching UDP streams".into()));
        }
        match control.recv(Some(left.min(Duration::from_millis(50))))? {
            None => continue,
            Some(bytes) => match TestMsg::decode(&bytes)? {
                TestMsg::Attached {
                    streams,
                    warnings: theirs,
                    more,
                } => {
                    remote.extend(streams);
                    add_server_warnings(warnings, theirs);
                    if !more {
                        break;
                    }
                }
                TestMsg::Error { message } => {
                    return Err(EngineError::Service(format!("server: {message}")))
                }
                other => return Err(unexpected(&other, "Attached")),
            },
        }
    }
    let streams = socks
        .into_iter()
        .enumerate()
        .map(|(id, u)| {
            let id = id as u32;
            let role = if p.client_sends(id) {
                Role::Send
            } else {
                Role::Recv
            };
            new_stream(id, role, Sock::Udp(u), p)
        })
        .collect();
    Ok((streams, remote))
}

/// Server side of the UDP hellos: learn each stream's client address from
/// a hello that carries the session cookie, and connect to it.
pub(super) fn bind_udp_peers(socks: &[UdpSocket], session: &ServerSession) -> Result<()> {
    // The hello must carry this session's cookie and come from the control
    // connection's IP; anything else is ignored.
    let peer_ip = session.peer_addr().ip();
    let mut bound = vec![false; socks.len()];
    for u in socks {
        u.set_nonblocking(true)
            .map_err(|e| EngineError::io("set UDP socket non-blocking", e))?;
    }
    let deadline = Instant::now() + SETUP_TIMEOUT;
    let mut buf = [0u8; 64];
    while bound.iter().any(|b| !b) {
        if Instant::now() > deadline {
            return Err(EngineError::Timeout("waiting for UDP hellos".into()));
        }
        let mut progressed = false;
        for (id, u) in socks.iter().enumerate() {
            if bound[id] {
                continue;
            }
            if let Ok((n, from)) = u.recv_from(&mut buf) {
                let ok = n == 40
                    && buf.starts_with(data::UDP_HELLO)
                    && buf[36..40] == (id as u32).to_be_bytes()
                    && session.cookie_matches(&buf[4..36])
                    && from.ip() == peer_ip;
                if ok {
                    u.connect(from)
                        .map_err(|e| EngineError::io("connect UDP socket", e))?;
                    bound[id] = true;
                    progressed = true;
                }
            }
        }
        if !progressed {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    for u in socks {
        u.set_nonblocking(false)
            .map_err(|e| EngineError::io("set UDP socket blocking", e))?;
    }
    Ok(())
}

pub(super) fn recv_attached(
    control: &Control,
    warnings: &mut Vec<String>,
) -> Result<Vec<SocketSetup>> {
    let mut all = Vec::new();
    loop {
        match recv_msg(control, SETUP_TIMEOUT, "waiting for Attached")? {
            TestMsg::Attached {
                streams,
                warnings: theirs,
                more,
            } => {
                all.extend(streams);
                add_server_warnings(warnings, theirs);
                if !more {
                    return Ok(all);
                }
            }
            other => return Err(unexpected(&other, "Attached")),
        }
    }
}

pub(super) fn add_server_warnings(warnings: &mut Vec<String>, theirs: Vec<String>) {
    for w in theirs {
        let line = format!("server: {w}");
        if !warnings.contains(&line) {
            warnings.push(line);
        }
    }
}
