//! The server's session: from `Open` to `Final`, the streams the client
//! adds in flight and the congestion control it switches.

use super::*;

/// The server's session.
pub(super) fn serve(session: &ServerSession) -> Result<()> {
    let control = session.control();
    let p: TestParams = serde_params(session.params()).map_err(EngineError::Service)?;
    let mut warnings = Vec::new();
    let total = p.total_streams();
    let server_role = |id: u32| {
        if p.client_sends(id) {
            Role::Recv
        } else {
            Role::Send
        }
    };
    let mut streams = Vec::with_capacity(total as usize);
    match p.protocol {
        Protocol::Tcp => {
            let ready = TestMsg::Ready {
                udp_ports: vec![],
                adjustable: true,
            };
            control.send(&ready.encode())?;
            // Each connection may take up to the setup timeout after the
            // previous one: a thousand streams on a long path arrive slowly.
            let mut seen = HashMap::new();
            while seen.len() < total as usize {
                let conn = session.accept_data(SETUP_TIMEOUT)?;
                if conn.tag >= total || seen.contains_key(&conn.tag) {
                    return Err(EngineError::Service(format!(
                        "data connection with bad stream id {}",
                        conn.tag
                    )));
                }
                let role = server_role(conn.tag);
                data::configure_tcp(conn.stream.tcp(), &p, role, &mut warnings);
                let sock = Sock::Tcp(conn.stream);
                seen.insert(conn.tag, ());
                streams.push(new_stream(conn.tag, role, sock, &p));
            }
            streams.sort_by_key(|s| s.id);
        }
        Protocol::Udp => {
            let ip = session.local_addr().ip();
            let mut socks = Vec::with_capacity(total as usize);
            for _ in 0..total {
                let u = UdpSocket::bind(SocketAddr::new(ip, 0))
                    .map_err(|e| EngineError::io("bind UDP socket", e))?;
                data::configure_buffers(&u, &p, &mut warnings);
                socks.push(u);
            }
            let ports = socks
                .iter()
                .map(|u| u.local_addr().map(|a| a.port()))
                .collect::<std::io::Result<Vec<_>>>()
                .map_err(|e| EngineError::io("read UDP port", e))?;
            let ready = TestMsg::Ready {
                udp_ports: ports,
                adjustable: false,
            };
            control.send(&ready.encode())?;
            bind_udp_peers(&socks, session)?;
            for (id, u) in socks.into_iter().enumerate() {
                let id = id as u32;
                streams.push(new_stream(id, server_role(id), Sock::Udp(u), &p));
            }
        }
    }
    let mut meter = report::Meter::new(session.report(), streams.len());
    let setups: Vec<SocketSetup> = streams.iter().map(|s| s.setup.clone()).collect();
    // The same refusal on every stream is one line, not a thousand.
    let mut seen = std::collections::HashSet::new();
    warnings.retain(|w| seen.insert(w.clone()));
    send_split(
        control,
        TestMsg::Attached {
            streams: setups,
            warnings,
            more: false,
        },
    )?;
    match recv_msg(control, SETUP_TIMEOUT, "waiting for Start")? {
        TestMsg::Start => {}
        TestMsg::Stop => return Ok(()),
        other => return Err(unexpected(&other, "Start")),
    }
    let (tx, rx) = mpsc::channel();
    let finished = Arc::new(AtomicBool::new(false));
    spawn_reader(control.clone(), tx.clone(), Arc::clone(&finished));
    let cpu0 = fatpipe_sys::CpuSample::now().ok();
    let mut side = Side::start(p.clone(), streams, tx, rx)?;
    let result = server_loop(&mut side, control, session, &mut meter);
    if let (Err(e), true) = (&result, session.shutdown().is_set()) {
        // The server is stopping: tell the client why while its streams
        // still work, or it would only see them break ("broken pipe").
        let msg = TestMsg::Error {
            message: e.to_string(),
        };
        if control.send(&msg.encode()).is_ok() {
            wait_for_hangup(&side, Duration::from_secs(1));
        }
    }
    let cpu = cpu_seconds_since(cpu0);
    side.stop();
    meter.bytes(session.report(), &side.streams);
    if let Err(e) = result {
        finished.store(true, Ordering::Relaxed);
        return Err(e);
    }
    let totals = side.totals();
    for summary in report::summaries(&totals) {
        session.report().test_result(&summary);
    }
    send_split(
        control,
        TestMsg::Final {
            elapsed_ms: side.shared.start().elapsed().as_millis() as u64,
            streams: totals,
            cpu,
            more: false,
        },
    )?;
    // Wait for the client to hang up (it has what it needs).
    wait_for_hangup(&side, Duration::from_secs(5));
    finished.store(true, Ordering::Relaxed);
    Ok(())
}

/// Waits up to `limit` for the peer to close the control connection.
pub(super) fn wait_for_hangup(side: &Side, limit: Duration) {
    let grace = Instant::now() + limit;
    while Instant::now() < grace {
        match side.rx.recv_timeout(Duration::from_millis(100)) {
            Ok(Ev::PeerGone(_)) => break,
            Ok(_) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
}

/// Streams the client is adding: those accepted so far, until all are.
pub(super) struct ServerAdd {
    pub(super) add: AddStreams,
    pub(super) got: BTreeMap<u32, Stream>,
    pub(super) warnings: Vec<String>,
    pub(super) deadline: Instant,
}

/// Server: takes an `AddStreams`, or refuses it.
pub(super) fn on_add_streams(
    side: &Side,
    control: &Control,
    pending: &mut Option<ServerAdd>,
    add: AddStreams,
) -> Result<()> {
    let total = side.streams.len() as u32;
    let (up, down) = (side.count(Role::Recv), side.count(Role::Send));
    let check = if pending.is_some() {
        Err("streams are already being added".to_string())
    } else if side.ending() {
        Err("the test is ending".to_string())
    } else {
        side.shared.params.check_add(total, up, down, &add)
    };
    match check {
        Ok(()) => {
            *pending = Some(ServerAdd {
                add,
                got: BTreeMap::new(),
                warnings: Vec::new(),
                deadline: Instant::now() + SETUP_TIMEOUT,
            });
            Ok(())
        }
        Err(why) => refuse(control, why),
    }
}

pub(super) fn refuse(control: &Control, why: String) -> Result<()> {
    let msg = TestMsg::Adjusted {
        streams: Vec::new(),
        warnings: Vec::new(),
        refused: Some(why),
        more: false,
    };
    control.send(&msg.encode())
}

/// Server: accepts the data connections of a pending `AddStreams` (their
/// tags must be the new ids), and once all are in starts their workers and
/// answers `Adjusted`; refuses the change when they do not come in time.
pub(super) fn poll_add(
    side: &mut Side,
    control: &Control,
    session: &ServerSession,
    pending: &mut Option<ServerAdd>,
    meter: &report::Meter,
) -> Result<()> {
    let Some(add) = pending.as_mut() else {
        return Ok(());
    };
    let want = add.add.count() as usize;
    while add.got.len() < want {
        let conn = match session.accept_data(Duration::ZERO) {
            Ok(c) => c,
            Err(EngineError::Timeout(_)) => break,
            Err(e) => return Err(e),
        };
        let id = conn.tag;
        let first = add.add.first;
        if id < first || id - first >= add.add.count() || add.got.contains_key(&id) {
            return Err(EngineError::Service(format!(
                "data connection with bad stream id {id}"
            )));
        }
        let role = if add.add.client_sends(id) {
            Role::Recv
        } else {
            Role::Send
        };
        data::configure_tcp(conn.stream.tcp(), &side.config, role, &mut add.warnings);
        let stream = new_stream(id, role, Sock::Tcp(conn.stream), &side.config);
        add.got.insert(id, stream);
    }
    if add.got.len() == want {
        let Some(add) = pending.take() else {
            return Ok(());
        };
        let streams: Vec<Stream> = add.got.into_values().collect();
        let setups = streams.iter().map(|s| s.setup.clone()).collect();
        let added = streams.len();
        side.add(streams)?;
        meter.add_streams(added);
        let mut seen = std::collections::HashSet::new();
        let mut warnings = add.warnings;
        warnings.retain(|w| seen.insert(w.clone()));
        send_split(
            control,
            TestMsg::Adjusted {
                streams: setups,
                warnings,
                refused: None,
                more: false,
            },
        )?;
    } else if Instant::now() > add.deadline || side.ending() {
        // The streams accepted so far close with `add`.
        *pending = None;
        refuse(
            control,
            "the new data connections did not all arrive in time".into(),
        )?;
    }
    Ok(())
}

/// Server: switches its sending streams' congestion control.
pub(super) fn on_set_congestion(side: &mut Side, control: &Control, name: &str) -> Result<()> {
    if let Err(why) = check_congestion_name(name) {
        return refuse(control, why);
    }
    let (warnings, ok) = side.set_congestion(name);
    if !ok {
        return refuse(control, warnings.join("; "));
    }
    let setups = side
        .streams
        .iter()
        .filter(|s| s.role == Role::Send)
        .map(|s| s.setup.clone())
        .collect();
    send_split(
        control,
        TestMsg::Adjusted {
            streams: setups,
            warnings,
            refused: None,
            more: false,
        },
    )
}

pub(super) fn server_loop(
    side: &mut Side,
    control: &Control,
    session: &ServerSession,
    meter: &mut report::Meter,
) -> Result<()> {
    let mut adding: Option<ServerAdd> = None;
    loop {
        side.check_stall()?;
        if session.shutdown().is_set() {
            return Err(EngineError::Service("the server is shutting down".into()));
        }
        poll_add(side, control, session, &mut adding, meter)?;
        let wait = adding.as_ref().map(|_| Duration::from_millis(10));
        if let Some(ev) = side.next_event(wait) {
            match ev {
                Ev::Done(_, Some(err)) => return Err(EngineError::Service(err)),
                Ev::Done(id, None) => {
                    if side.on_done(id) {
                        control.send(&TestMsg::SendDone.encode())?;
                    }
                }
                Ev::Peer(TestMsg::SendDone) => side.on_peer_send_done(),
                Ev::Peer(TestMsg::Stop) => {
                    return Err(EngineError::Service("the client stopped the test".into()))
                }
                Ev::Peer(TestMsg::AddStreams(add)) => {
                    on_add_streams(side, control, &mut adding, add)?;
                    poll_add(side, control, session, &mut adding, meter)?;
                }
                Ev::Peer(TestMsg::SetCongestion { name }) => {
                    on_set_congestion(side, control, &name)?;
                }
                Ev::Peer(other) => return Err(unexpected(&other, "SendDone or Stop")),
                Ev::PeerGone(e) => return Err(e),
                Ev::Dialed(_) => {}
            }
        }
        while let Some((index, begin, end, omitted, streams)) = side.poll_timers() {
            meter.bytes(session.report(), &side.streams);
            send_split(
                control,
                TestMsg::Interval {
                    index,
                    start_ms: begin.as_millis() as u64,
                    end_ms: end.as_millis() as u64,
                    omitted,
                    streams,
                    more: false,
                },
            )?;
        }
        if side.done() && side.closed {
            return Ok(());
        }
    }
}
