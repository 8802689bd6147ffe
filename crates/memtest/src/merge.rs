//! The numbers `fatpipe test` prints: both ends' samples merged stream by
//! stream (bytes from the receiver, window, RTT and retransmits from the
//! sender), summed per direction, and the CPU each end used.

use super::*;

/// The process's CPU seconds since `start`, for the peer.
pub(super) fn cpu_seconds_since(start: Option<fatpipe_sys::CpuSample>) -> CpuSample {
    let (Some(a), Ok(b)) = (start, fatpipe_sys::CpuSample::now()) else {
        return CpuSample::default();
    };
    CpuSample {
        user_s: b.user.saturating_sub(a.user).as_secs_f64(),
        system_s: b.system.saturating_sub(a.system).as_secs_f64(),
        wall_s: b.wall.saturating_duration_since(a.wall).as_secs_f64(),
    }
}

/// Utilisation from the peer's CPU seconds.
pub(super) fn cpu_use(c: &CpuSample) -> schema::CpuUse {
    if c.wall_s <= 0.0 {
        return schema::CpuUse::default();
    }
    let user = c.user_s / c.wall_s * 100.0;
    let system = c.system_s / c.wall_s * 100.0;
    schema::CpuUse {
        total_percent: user + system,
        user_percent: user,
        system_percent: system,
    }
}

pub(super) fn cpu_use_since(start: Option<fatpipe_sys::CpuSample>) -> schema::CpuUse {
    let (Some(a), Ok(b)) = (start, fatpipe_sys::CpuSample::now()) else {
        return schema::CpuUse::default();
    };
    let u = b.utilisation_since(&a);
    schema::CpuUse {
        total_percent: u.total_pct,
        user_percent: u.user_pct,
        system_percent: u.system_pct,
    }
}

pub(super) fn start_info(
    plan: &TestPlan,
    session: &ClientSession,
    streams: &[Stream],
    remote: &[SocketSetup],
    warnings: Vec<String>,
) -> schema::TestStart {
    let p = &plan.params;
    let info = |s: &SocketSetup| socket_info(s, p.client_sends(s.id));
    let mut warnings = warnings;
    if let Some(cc) = &p.congestion {
        let used: Vec<&str> = streams
            .iter()
            .filter(|s| s.role == Role::Send)
            .map(|s| s.setup.congestion.as_str())
            .chain(
                remote
                    .iter()
                    .filter(|s| !p.client_sends(s.id))
                    .map(|s| s.congestion.as_str()),
            )
            .collect();
        let refused = warnings
            .iter()
            .any(|w| w.contains(&format!("congestion control '{cc}'")));
        if let Some(other) = used.iter().find(|u| !refused && !u.is_empty() && *u != cc) {
            let line = format!("asked for congestion control '{cc}', the sender uses '{other}'");
            if !warnings.contains(&line) {
                warnings.push(line);
            }
        }
    }
    let timestamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    schema::TestStart {
        timestamp,
        server: plan.server.clone(),
        server_addr: session.peer_addr().to_string(),
        protocol: p.protocol,
        direction: p.direction,
        streams: p.streams,
        duration_s: if p.bytes.is_some() {
            0.0
        } else {
            p.duration_ms as f64 / 1e3
        },
        bytes: p.bytes,
        omit_s: p.omit_ms as f64 / 1e3,
        interval_s: p.interval_ms as f64 / 1e3,
        length: p.length,
        bitrate: (p.protocol == Protocol::Udp).then_some(p.bitrate),
        window: p.window,
        mss: p.mss,
        congestion: p.congestion.clone(),
        fq_rate: p.fq_rate,
        zerocopy: p.zerocopy,
        local: streams.iter().map(|s| info(&s.setup)).collect(),
        remote: remote.iter().map(info).collect(),
        warnings,
        // Auto-tuning happens before the session, in the binary, which
        // fills this in.
        auto: None,
        encryption: session.encryption().map(|e| fatpipe_schema::Encryption {
            protocol: e.protocol.into(),
            suite: e.suite.into(),
        }),
    }
}

/// One stream's socket settings for the report; `up` if the client sends.
pub(super) fn socket_info(s: &SocketSetup, up: bool) -> schema::SocketInfo {
    schema::SocketInfo {
        id: s.id,
        direction: if up {
            schema::Direction::Up
        } else {
            schema::Direction::Down
        },
        sndbuf: s.sndbuf,
        rcvbuf: s.rcvbuf,
        mss: s.mss,
        congestion: s.congestion.clone(),
        send_path: s.send_path.clone(),
        recv_path: s.recv_path.clone(),
    }
}

/// True if the client sends on the stream of this client-side sample (its
/// role says; streams added mid-test do not follow the `--bidir` id split).
pub(super) fn client_sends(p: &TestParams, local: &StreamSample) -> bool {
    match local.role {
        Some(Role::Send) => true,
        Some(Role::Recv) => false,
        None => p.client_sends(local.id),
    }
}

/// One stream's numbers from the two ends' samples.
pub(super) fn merge_stream(
    p: &TestParams,
    id: u32,
    up: bool,
    local: Option<&StreamSample>,
    remote: Option<&StreamSample>,
    seconds: f64,
) -> schema::StreamStats {
    let (sender, receiver) = if up { (local, remote) } else { (remote, local) };
    let recv = receiver.cloned().unwrap_or_default();
    let send = sender.cloned().unwrap_or_default();
    let tcp = p.protocol == Protocol::Tcp;
    let bps = if seconds > 0.0 {
        recv.bytes as f64 * 8.0 / seconds
    } else {
        0.0
    };
    schema::StreamStats {
        id: Some(id),
        direction: Some(if up {
            schema::Direction::Up
        } else {
            schema::Direction::Down
        }),
        seconds,
        bytes: recv.bytes,
        bits_per_second: bps,
        bytes_sent: send.bytes,
        retransmits: tcp.then_some(send.retransmits),
        rtt_us: tcp.then_some(send.rtt_us),
        rttvar_us: tcp.then_some(send.rttvar_us),
        cwnd: tcp.then_some(send.cwnd),
        packets_sent: (!tcp).then_some(send.packets),
        packets: (!tcp).then_some(recv.packets),
        lost: (!tcp).then_some(recv.lost),
        lost_percent: (!tcp).then(|| percent(recv.lost, recv.lost + recv.packets)),
        out_of_order: (!tcp).then_some(recv.out_of_order),
        jitter_ms: (!tcp).then_some(recv.jitter_us / 1e3),
    }
}

pub(super) fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// Per-direction sums of per-stream stats.
pub(super) fn sums(p: &TestParams, streams: &[schema::StreamStats]) -> Vec<schema::StreamStats> {
    let mut out = Vec::new();
    for dir in [schema::Direction::Up, schema::Direction::Down] {
        let these: Vec<_> = streams
            .iter()
            .filter(|s| s.direction == Some(dir))
            .collect();
        if these.is_empty() {
            continue;
        }
        let n = these.len() as f64;
        let add = |f: fn(&schema::StreamStats) -> Option<u64>| -> Option<u64> {
            these.iter().map(|s| f(s)).sum::<Option<u64>>()
        };
        let seconds = these.iter().map(|s| s.seconds).fold(0.0, f64::max);
        let bytes: u64 = these.iter().map(|s| s.bytes).sum();
        let tcp = p.protocol == Protocol::Tcp;
        let lost = add(|s| s.lost);
        let packets = add(|s| s.packets);
        // An RTT of 0 is unknown (no TCP_INFO, or no sample from the
        // sender yet): the mean is over the streams that know theirs.
        let known: Vec<_> = these
            .iter()
            .filter(|s| s.rtt_us.is_some_and(|r| r > 0))
            .collect();
        let mean = |f: fn(&schema::StreamStats) -> Option<u32>| -> u32 {
            let sum: u64 = known.iter().map(|s| u64::from(f(s).unwrap_or(0))).sum();
            (sum as f64 / known.len().max(1) as f64) as u32
        };
        out.push(schema::StreamStats {
            id: None,
            direction: Some(dir),
            seconds,
            bytes,
            bits_per_second: these.iter().map(|s| s.bits_per_second).sum(),
            bytes_sent: these.iter().map(|s| s.bytes_sent).sum(),
            retransmits: add(|s| s.retransmits),
            rtt_us: tcp.then(|| mean(|s| s.rtt_us)),
            rttvar_us: tcp.then(|| mean(|s| s.rttvar_us)),
            cwnd: add(|s| s.cwnd),
            packets_sent: add(|s| s.packets_sent),
            packets,
            lost,
            lost_percent: match (lost, packets) {
                (Some(l), Some(r)) => Some(percent(l, l + r)),
                _ => None,
            },
            out_of_order: add(|s| s.out_of_order),
            jitter_ms: (!tcp).then(|| {
                these
                    .iter()
                    .map(|s| s.jitter_ms.unwrap_or(0.0))
                    .sum::<f64>()
                    / n
            }),
        });
    }
    out
}

pub(super) fn merge_interval(
    p: &TestParams,
    index: u32,
    begin: Duration,
    end: Duration,
    omitted: bool,
    local: &[StreamSample],
    remote: &[StreamSample],
) -> schema::TestInterval {
    let seconds = (end - begin).as_secs_f64();
    let by_id: HashMap<u32, &StreamSample> = remote.iter().map(|s| (s.id, s)).collect();
    let streams: Vec<_> = local
        .iter()
        .map(|l| {
            let up = client_sends(p, l);
            merge_stream(p, l.id, up, Some(l), by_id.get(&l.id).copied(), seconds)
        })
        .collect();
    schema::TestInterval {
        index,
        start_s: begin.as_secs_f64(),
        end_s: end.as_secs_f64(),
        omitted,
        sums: sums(p, &streams),
        streams,
    }
}

pub(super) fn merge_final(
    p: &TestParams,
    side: &Side,
    remote: &[StreamSample],
    cpu_local: schema::CpuUse,
    cpu_remote: schema::CpuUse,
) -> schema::TestEnd {
    let local = side.totals();
    let by_id: HashMap<u32, &StreamSample> = remote.iter().map(|s| (s.id, s)).collect();
    let streams: Vec<_> = local
        .iter()
        .map(|l| {
            let r = by_id.get(&l.id).copied();
            // Measured time is the receiver's: warm-up end to last byte.
            let up = client_sends(p, l);
            let recv = if up { r } else { Some(l) };
            let seconds = recv.map_or(0, |s| s.elapsed_us) as f64 / 1e6;
            let mut s = merge_stream(p, l.id, up, Some(l), r, seconds);
            if p.protocol == Protocol::Udp {
                // Over the whole test the sender's count is the truth.
                let sent = s.packets_sent.unwrap_or(0);
                let got = s.packets.unwrap_or(0);
                let lost = sent.saturating_sub(got);
                s.lost = Some(lost);
                s.lost_percent = Some(percent(lost, sent));
            }
            s
        })
        .collect();
    let seconds = streams.iter().map(|s| s.seconds).fold(0.0, f64::max);
    schema::TestEnd {
        seconds,
        sums: sums(p, &streams),
        streams,
        cpu_local,
        cpu_remote,
        rfc6349: None,
        ramp: None,
    }
}
