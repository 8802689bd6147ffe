//! The control channel between the CLI (or the library API) and a running
//! forwarder: a Unix socket in the lab's state directory, one JSON request
//! line in, one JSON response line out.
//!
//! Only root can reach `/run/fatpipe-lab`, so the socket needs no
//! authentication, but requests are still size-capped and read with a
//! timeout so a stuck client cannot wedge the forwarder's control thread.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::pipe::DirStats;
use crate::spec::{LinkChange, LinkSpec};
use crate::{state, Error};

/// Requests are tiny; anything longer is refused.
const MAX_LINE: u64 = 64 * 1024;

/// What a client asks the forwarder.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    /// Are you there? (readiness)
    Ping,
    /// Counters and the current spec.
    Stats,
    /// Change the link live.
    Set(LinkChange),
}

/// What the forwarder answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Response {
    /// Answer to `Ping`, with the forwarder's pid.
    Pong(u32),
    /// Answer to `Stats`.
    Stats(Box<LabStats>),
    /// Answer to `Set`: the spec now in force.
    Done(Box<LinkSpec>),
    /// The request was refused.
    Refused(String),
}

/// Counters of a running lab, for `lab stats` and `--json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabStats {
    /// The lab.
    pub name: String,
    /// The spec in force (after any `set`).
    pub spec: LinkSpec,
    /// Seconds since the forwarder started.
    pub uptime_s: f64,
    /// Seconds left of a `set --down`, if the link is down.
    pub down_left_s: Option<f64>,
    /// Both TUN devices carry UDP GSO super-packets (Linux 6.2+); without
    /// it the sending kernel cuts UDP GSO sends into datagrams before the
    /// link, and the forwarder moves them one by one.
    #[serde(default)]
    pub udp_gso: bool,
    /// From end `a` to end `b`.
    pub a_to_b: DirStats,
    /// From end `b` to end `a`.
    pub b_to_a: DirStats,
}

/// Sends one request to lab `name`'s forwarder and reads the answer.
pub fn call(name: &str, req: &Request, timeout: Duration) -> Result<Response, Error> {
    let err = |why: String| Error::Control {
        name: name.to_string(),
        why,
    };
    let path = state::socket_path(name);
    let mut s =
        UnixStream::connect(&path).map_err(|e| err(format!("connect {}: {e}", path.display())))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| err(e.to_string()))?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| err(e.to_string()))?;
    let mut line = serde_json::to_string(req).map_err(|e| err(e.to_string()))?;
    line.push('\n');
    s.write_all(line.as_bytes())
        .map_err(|e| err(format!("send: {e}")))?;
    let mut answer = String::new();
    BufReader::new(s.take(MAX_LINE * 16))
        .read_line(&mut answer)
        .map_err(|e| err(format!("receive: {e}")))?;
    serde_json::from_str(&answer).map_err(|e| err(format!("bad answer: {e}")))
}

/// Serves requests forever, one connection at a time (they are rare).
pub fn serve(listener: UnixListener, handle: impl Fn(Request) -> Response) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let _ = serve_one(conn, &handle);
    }
}

fn serve_one(conn: UnixStream, handle: &impl Fn(Request) -> Response) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    conn.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut line = String::new();
    BufReader::new((&conn).take(MAX_LINE)).read_line(&mut line)?;
    let resp = match serde_json::from_str::<Request>(&line) {
        Ok(req) => handle(req),
        Err(e) => Response::Refused(format!("bad request: {e}")),
    };
    let mut out = serde_json::to_string(&resp).map_err(std::io::Error::other)?;
    out.push('\n');
    (&conn).write_all(out.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_garbage_is_refused() {
        let dir = std::env::temp_dir().join(format!("fp-ctl-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("s");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).expect("bind");
        std::thread::spawn(move || {
            serve(listener, |r| match r {
                Request::Ping => Response::Pong(7),
                Request::Set(c) => Response::Done(Box::new(LinkSpec {
                    loss: c.loss.unwrap_or(0.0),
                    ..LinkSpec::default()
                })),
                Request::Stats => Response::Refused("no".into()),
            })
        });
        let talk = |line: &str| {
            let mut s = UnixStream::connect(&path).expect("connect");
            s.write_all(line.as_bytes()).expect("send");
            let mut a = String::new();
            BufReader::new(s).read_line(&mut a).expect("read");
            serde_json::from_str::<Response>(&a).expect("json")
        };
        assert!(matches!(talk("\"Ping\"\n"), Response::Pong(7)));
        let set = serde_json::to_string(&Request::Set(LinkChange {
            loss: Some(0.5),
            ..LinkChange::default()
        }))
        .expect("json");
        assert!(matches!(talk(&(set + "\n")), Response::Done(s) if s.loss == 0.5));
        assert!(matches!(talk("{nonsense\n"), Response::Refused(_)));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
