//! The client's session loop: intervals merged as they come, the end of the
//! test, and the stall limit.

use super::*;

pub(super) fn client_loop(
    side: &mut Side,
    control: &Control,
    p: &TestParams,
    on_progress: &mut dyn FnMut(Progress<'_>),
    steer: &mut Steer<'_>,
) -> Result<(Vec<schema::TestInterval>, Vec<StreamSample>, CpuSample)> {
    let mut local: BTreeMap<u32, LocalInterval> = BTreeMap::new();
    // Per interval: the server's samples, whether they are complete, and
    // where the server ended the interval (ms after Start).
    let mut remote: BTreeMap<u32, (Vec<StreamSample>, bool, u64)> = BTreeMap::new();
    let mut merged = Vec::new();
    let mut remote_final: Vec<StreamSample> = Vec::new();
    let mut remote_cpu = CpuSample::default();
    let mut final_done = false;
    // A server that never finishes must not hang the client.
    let budget = Duration::from_millis(p.omit_ms + p.duration_ms) + Duration::from_secs(30);
    let give_up = if p.bytes.is_some() {
        None
    } else {
        Some(Instant::now() + budget)
    };
    loop {
        side.check_stall()?;
        if give_up.is_some_and(|g| Instant::now() > g) {
            return Err(EngineError::Timeout(
                "waiting for the server to finish the test".into(),
            ));
        }
        steer.check_timeout();
        if let Some(ev) = side.next_event(None) {
            match ev {
                Ev::Done(_, Some(err)) => return Err(EngineError::Service(err)),
                Ev::Done(id, None) => {
                    if side.on_done(id) {
                        control.send(&TestMsg::SendDone.encode())?;
                    }
                }
                Ev::Peer(TestMsg::SendDone) => side.on_peer_send_done(),
                Ev::Peer(TestMsg::Interval {
                    index,
                    streams,
                    more,
                    end_ms,
                    ..
                }) => {
                    let e = remote.entry(index).or_default();
                    e.0.extend(streams);
                    e.1 = !more;
                    e.2 = e.2.max(end_ms);
                }
                Ev::Peer(TestMsg::Final {
                    streams, more, cpu, ..
                }) => {
                    remote_final.extend(streams);
                    remote_cpu = cpu;
                    final_done = !more;
                }
                Ev::Peer(TestMsg::Error { message }) => {
                    return Err(EngineError::Service(format!("server: {message}")))
                }
                Ev::Peer(TestMsg::Adjusted {
                    streams,
                    warnings,
                    refused,
                    more,
                }) => steer.on_adjusted(side, streams, warnings, refused, more)?,
                Ev::Dialed(d) => steer.on_dialed(side, d)?,
                Ev::Peer(other) => return Err(unexpected(&other, "Interval or Final")),
                // The server may hang up once its Final is out.
                Ev::PeerGone(_) if final_done => {}
                Ev::PeerGone(e) => return Err(e),
            }
        }
        side.poll_ramp();
        while let Some((index, begin, end, omitted, streams)) = side.poll_timers() {
            local.insert(index, (begin, end, omitted, streams));
        }
        // Print every interval both ends have reported, in order.
        while let Some((&index, _)) = local.iter().next() {
            let Some((r, true, remote_end)) = remote.get(&index) else {
                break;
            };
            let (r, remote_end) = (r.clone(), Duration::from_millis(*remote_end));
            remote.remove(&index);
            let Some((begin, end, omitted, l)) = local.remove(&index) else {
                break;
            };
            // The last, partial interval closes at each end when its
            // streams are done: at the sender on its deadline, at the
            // receiver only once the bytes in flight have drained. The
            // interval spans both, or the receiver's drained bytes would
            // be divided by the sender's shorter time.
            let end = end.max(remote_end);
            let iv = merge_interval(p, index, begin, end, omitted, &l, &r);
            on_progress(Progress::Interval(&iv));
            steer.on_interval(side, control, &iv)?;
            merged.push(iv);
        }
        if side.done() && side.closed && final_done {
            if let Some(p) = steer.pending.take() {
                steer.finish(&p.change, Err("the test ended first".into()));
            }
            return Ok((merged, remote_final, remote_cpu));
        }
    }
}

/// How long a test may go without moving a byte before it is abandoned:
/// a minute, or three datagram times for a very slow UDP test.
pub(super) fn stall_limit(p: &TestParams) -> Duration {
    let base = Duration::from_secs(60);
    if p.protocol == Protocol::Udp && p.bitrate > 0 {
        let per_packet = f64::from(p.length) * 8.0 / p.bitrate as f64;
        return base.max(Duration::from_secs_f64((per_packet * 3.0).min(86_400.0)));
    }
    base
}
