//! Bringing a lab up and down: namespaces, the forwarder process, addresses.
//!
//! A lab is two network namespaces (`fp-NAME-a`, `fp-NAME-b`), a TUN device
//! in each (`lab-a`, `lab-b`), and one forwarder process (`fatpipe lab
//! run-link NAME`, started in the background) that owns both devices and
//! runs the link model between them. The devices are not persistent: they
//! vanish with the forwarder, so a killed forwarder cannot leave a device
//! behind. Teardown is idempotent and works from whatever is left (a pid
//! file, namespaces without state, state without namespaces), and it ends
//! processes only by pid: the forwarder after checking its command line,
//! and whatever runs inside our namespaces.
//!
//! The `ip` tool does the namespace and address work: it is everywhere the
//! lab can run, its errors are the ones admins know, and it keeps this
//! module free of netlink code.

use std::fs;
use std::net::{Ipv4Addr, Ipv6Addr, UdpSocket};
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::control::{self, LabStats, Request, Response};
use crate::forward::{self, Lane, Shared};
use crate::spec::{Dir, LinkChange, LinkSpec};
use crate::state::{self, LabRecord};
use crate::{sys, End, Error};

/// How a lab is brought up by [`Lab::up`].
#[derive(Debug, Clone, Default)]
pub struct UpOptions {
    /// The `fatpipe` binary to run the forwarder (`EXE lab run-link NAME`);
    /// defaults to the running executable.
    pub exe: Option<PathBuf>,
    /// Remove the lab when this process exits, even if it is killed.
    pub owner: Option<u32>,
}

/// A lab that is up. Dropping it removes the lab unless [`Lab::detach`]ed.
#[derive(Debug)]
pub struct Lab {
    rec: LabRecord,
    child: Option<Child>,
    armed: bool,
}

/// One line of `lab list`.
#[derive(Debug, Clone)]
pub struct LabInfo {
    /// The lab's name.
    pub name: String,
    /// Its record, if its state directory is intact.
    pub record: Option<LabRecord>,
    /// The forwarder's pid if it runs.
    pub forwarder: Option<u32>,
}

impl Lab {
    /// Brings up lab `name` shaped by `spec` and returns once the link has
    /// carried a test packet from `a` to `b`. A lab left over from a killed
    /// run under the same name is removed first; a live one is an error.
    pub fn up(name: &str, spec: &LinkSpec, opts: &UpOptions) -> Result<Lab, Error> {
        state::validate_name(name)?;
        spec.validate()?;
        if !sys::has_caps() {
            return Err(Error::NotPermitted);
        }
        if state::forwarder_pid(name).is_some() {
            return Err(Error::Exists(name.to_string()));
        }
        teardown(name, None)?;
        let rec = state::create(name, spec, opts.owner)?;
        let mut lab = Lab {
            rec,
            child: None,
            armed: true,
        };
        // On any failure below, dropping `lab` removes what was made.
        lab.start(opts)?;
        Ok(lab)
    }

    /// A handle on a lab that is already up; dropping it leaves it up.
    pub fn open(name: &str) -> Result<Lab, Error> {
        let rec = state::read_record(name)?;
        if !sys::has_caps() {
            return Err(Error::NotPermitted);
        }
        Ok(Lab {
            rec,
            child: None,
            armed: false,
        })
    }

    /// Leaves the lab up when this handle is dropped (as `lab up` does).
    pub fn detach(mut self) {
        self.armed = false;
        self.child = None;
    }

    /// The lab's name.
    pub fn name(&self) -> &str {
        &self.rec.name
    }

    /// The link as brought up (see [`Lab::stats`] for the spec in force).
    pub fn spec(&self) -> &LinkSpec {
        &self.rec.spec
    }

    /// The network namespace of one end, for `ip netns exec`.
    pub fn netns(&self, end: End) -> String {
        self.rec.netns(end)
    }

    /// The IPv4 address of one end.
    pub fn addr(&self, end: End) -> Ipv4Addr {
        self.rec.addr(end)
    }

    /// The IPv6 address of one end.
    pub fn addr6(&self, end: End) -> Ipv6Addr {
        self.rec.addr6(end)
    }

    /// A command that runs `program` inside one end (through `ip netns
    /// exec`); add arguments and spawn it as usual.
    pub fn command(&self, end: End, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.netns(end)]).arg(program);
        c
    }

    /// Counters and the spec in force.
    pub fn stats(&self) -> Result<LabStats, Error> {
        stats(self.name())
    }

    /// Changes the running link; returns the spec now in force.
    pub fn set(&self, change: &LinkChange) -> Result<LinkSpec, Error> {
        set(self.name(), change)
    }

    /// Removes the lab: processes inside, forwarder, namespaces, state.
    pub fn down(mut self) -> Result<(), Error> {
        self.armed = false;
        let r = teardown(self.name(), None);
        self.reap();
        r
    }

    fn start(&mut self, opts: &UpOptions) -> Result<(), Error> {
        let name = self.rec.name.clone();
        for end in [End::A, End::B] {
            ip(&["netns", "add", &self.netns(end)])?;
        }
        let exe = match &opts.exe {
            Some(p) => p.clone(),
            None => std::env::current_exe().map_err(|e| Error::io("find the fatpipe binary", e))?,
        };
        let log_path = state::log_path(&name);
        let log = fs::File::create(&log_path)
            .map_err(|e| Error::io(format!("create {}", log_path.display()), e))?;
        let log2 = log
            .try_clone()
            .map_err(|e| Error::io(format!("open {}", log_path.display()), e))?;
        let child = Command::new(&exe)
            .args(["lab", "run-link", &name])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            // Its own process group: a Ctrl-C meant for the caller must not
            // take the link down under a running test.
            .process_group(0)
            .spawn()
            .map_err(|e| Error::io(format!("start {} lab run-link", exe.display()), e))?;
        self.child = Some(child);
        self.wait_forwarder(&log_path)?;
        for end in [End::A, End::B] {
            self.configure(end)?;
        }
        if self.rec.spec.loss < 0.5 {
            self.probe()?;
        }
        Ok(())
    }

    fn wait_forwarder(&mut self, log_path: &Path) -> Result<(), Error> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(child) = &mut self.child {
                if let Ok(Some(status)) = child.try_wait() {
                    let log = fs::read_to_string(log_path).unwrap_or_default();
                    let last = log.lines().last().unwrap_or("no output").to_string();
                    return Err(Error::Forwarder(format!("exited with {status}: {last}")));
                }
            }
            if let Ok(Response::Pong(_)) =
                control::call(self.name(), &Request::Ping, Duration::from_secs(1))
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Forwarder(
                    "no answer on its control socket within 10 s".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn configure(&self, end: End) -> Result<(), Error> {
        let ns = self.netns(end);
        let dev = state::tun_name(end);
        let mtu = self.rec.spec.mtu.to_string();
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        // A long device queue absorbs bursts while the forwarder is busy
        // writing the other way; TCP small queues keep it short in practice.
        ip(&[
            "-n",
            &ns,
            "link",
            "set",
            &dev,
            "mtu",
            &mtu,
            "txqueuelen",
            "10000",
            "up",
        ])?;
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{}/30", self.addr(end)),
            "dev",
            &dev,
        ])?;
        ip(&[
            "-n",
            &ns,
            "-6",
            "addr",
            "add",
            &format!("{}/64", self.addr6(end)),
            "dev",
            &dev,
            "nodad",
        ])?;
        Ok(())
    }

    /// Sends UDP datagrams from `a` to `b` until one arrives.
    fn probe(&self) -> Result<(), Error> {
        let (a, b) = (self.addr(End::A), self.addr(End::B));
        let rx = sys::in_netns(&self.netns(End::B), move || UdpSocket::bind((b, 0)))?;
        let tx = sys::in_netns(&self.netns(End::A), move || UdpSocket::bind((a, 0)))?;
        let port = rx
            .local_addr()
            .map_err(|e| Error::io("probe socket", e))?
            .port();
        let step = self.rec.spec.rtt + self.rec.spec.jitter + Duration::from_millis(100);
        rx.set_read_timeout(Some(step))
            .map_err(|e| Error::io("probe socket", e))?;
        let deadline = Instant::now() + Duration::from_secs(5) + 4 * step;
        let mut buf = [0u8; 64];
        while Instant::now() < deadline {
            tx.send_to(b"fatpipe lab probe", (b, port))
                .map_err(|e| Error::io("send a probe", e))?;
            if let Ok((_, from)) = rx.recv_from(&mut buf) {
                if from.ip() == a {
                    return Ok(());
                }
            }
        }
        Err(Error::NotReady(format!("no probe from {a} reached {b}")))
    }

    fn reap(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if self.armed {
            let _ = teardown(self.name(), None);
            self.reap();
        }
    }
}

/// Counters of lab `name` and the spec in force.
pub fn stats(name: &str) -> Result<LabStats, Error> {
    match ask(name, &Request::Stats)? {
        Response::Stats(s) => Ok(*s),
        other => Err(unexpected(name, &other)),
    }
}

/// Changes lab `name` live; returns the spec now in force.
pub fn set(name: &str, change: &LinkChange) -> Result<LinkSpec, Error> {
    match ask(name, &Request::Set(change.clone()))? {
        Response::Done(s) => Ok(*s),
        Response::Refused(why) => Err(Error::Invalid(why)),
        other => Err(unexpected(name, &other)),
    }
}

/// Every lab that is up or left over.
pub fn list() -> Vec<LabInfo> {
    all_names()
        .into_iter()
        .map(|name| LabInfo {
            record: state::read_record(&name).ok(),
            forwarder: state::forwarder_pid(&name),
            name,
        })
        .collect()
}

/// Removes lab `name`, whatever is left of it.
pub fn down(name: &str) -> Result<(), Error> {
    state::validate_name(name)?;
    if !sys::has_caps() {
        return Err(Error::NotPermitted);
    }
    let exists = state::dir(name).exists()
        || [End::A, End::B]
            .iter()
            .any(|&e| netns_exists(&state::netns_name(name, e)));
    if !exists {
        return Err(Error::NotFound(name.to_string()));
    }
    teardown(name, None)
}

/// Removes every lab (only namespaces named `fp-NAME-a|b`); returns names.
pub fn down_all() -> Result<Vec<String>, Error> {
    if !sys::has_caps() {
        return Err(Error::NotPermitted);
    }
    let names = all_names();
    for n in &names {
        teardown(n, None)?;
    }
    Ok(names)
}

/// The forwarder process's main: opens the two TUN devices inside the
/// lab's namespaces and forwards between them until killed. If the lab has
/// an owner, the forwarder removes the whole lab when the owner exits.
pub fn run_link(name: &str) -> Result<(), Error> {
    let rec = state::read_record(name)?;
    let (tun_a, uso_a) = sys::in_netns(&rec.netns(End::A), || {
        sys::open_tun(&state::tun_name(End::A))
    })?;
    let (tun_b, uso_b) = sys::in_netns(&rec.netns(End::B), || {
        sys::open_tun(&state::tun_name(End::B))
    })?;
    // Both devices live in one kernel, so they agree; a super-packet read
    // from one is written whole to the other, which that kernel accepts.
    let udp_gso = uso_a && uso_b;
    let me = sys::getpid();
    state::write_pid(name, me)?;
    let shared = Arc::new(Shared::new(name, rec.spec.clone(), udp_gso));
    let sock = state::socket_path(name);
    let _ = fs::remove_file(&sock);
    let listener =
        UnixListener::bind(&sock).map_err(|e| Error::io(format!("bind {}", sock.display()), e))?;
    eprintln!(
        "fatpipe lab {name}: forwarding, pid {me}: {}; UDP GSO {}",
        rec.spec.summary(),
        if udp_gso {
            "on"
        } else {
            "off (kernel before 6.2, or FATPIPE_LAB_UDP_GSO=0)"
        }
    );
    let ctl = Arc::clone(&shared);
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            control::serve(listener, |req| match req {
                Request::Ping => Response::Pong(me),
                Request::Stats => Response::Stats(Box::new(ctl.stats())),
                Request::Set(c) => match ctl.apply(&c) {
                    Ok(s) => {
                        eprintln!("fatpipe lab: set: {}", s.summary());
                        Response::Done(Box::new(s))
                    }
                    Err(why) => Response::Refused(why),
                },
            })
        })
        .map_err(|e| Error::io("start the control thread", e))?;
    if let Some(owner) = rec.owner {
        let name = name.to_string();
        std::thread::Builder::new()
            .name("owner".into())
            .spawn(move || {
                let _ = sys::wait_for_exit(owner);
                eprintln!("fatpipe lab {name}: owner {owner} exited; removing the lab");
                let _ = teardown(&name, Some(me));
                std::process::exit(0);
            })
            .map_err(|e| Error::io("start the owner watch", e))?;
    }
    let (a, b) = (Arc::new(tun_a), Arc::new(tun_b));
    let ab = Lane {
        dir: Dir::AtoB,
        input: Arc::clone(&a),
        output: Arc::clone(&b),
    };
    let ba = Lane {
        dir: Dir::BtoA,
        input: Arc::clone(&b),
        output: Arc::clone(&a),
    };
    // A thread per direction, so writing a burst one way never delays a
    // due frame the other way. FATPIPE_LAB_THREADS=1 serves both from one
    // thread (fewer wake-ups; on this project's 2-core machines neither
    // measured better under load).
    let err = if std::env::var("FATPIPE_LAB_THREADS").as_deref() != Ok("1") {
        let s1 = Arc::clone(&shared);
        let t1 = std::thread::Builder::new()
            .name("a-to-b".into())
            .spawn(move || forward::forward(&[ab], &s1))
            .map_err(|e| Error::io("start a forwarding thread", e))?;
        let e2 = forward::forward(&[ba], &shared);
        let e1 = t1
            .join()
            .map_err(|_| Error::Forwarder("forwarding thread panicked".into()))?;
        format!("{e1}; {e2}")
    } else {
        forward::forward(&[ab, ba], &shared).to_string()
    };
    // The descriptors must outlive the forwarding.
    drop((a, b));
    Err(Error::Forwarder(format!("device failed: {err}")))
}

/// Removes what exists of lab `name`: the forwarder (unless it is `me`),
/// processes inside its namespaces, the namespaces, the state directory.
pub(crate) fn teardown(name: &str, me: Option<u32>) -> Result<(), Error> {
    if let Some(pid) = state::forwarder_pid(name) {
        if Some(pid) != me {
            stop(pid);
        }
    }
    let mut first_err = None;
    for end in [End::A, End::B] {
        let ns = state::netns_name(name, end);
        if !netns_exists(&ns) {
            continue;
        }
        let pids: Vec<u32> = ip(&["netns", "pids", &ns])
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .filter(|&p| Some(p) != me)
            .collect();
        for &p in &pids {
            sys::kill(p, sys::Signal::Kill);
        }
        wait_gone(&pids, Duration::from_secs(3));
        if let Err(e) = ip(&["netns", "del", &ns]) {
            first_err.get_or_insert(e);
        }
    }
    let d = state::dir(name);
    if let Err(e) = fs::remove_dir_all(&d) {
        if e.kind() != std::io::ErrorKind::NotFound {
            first_err.get_or_insert(Error::io(format!("remove {}", d.display()), e));
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// Ends a forwarder: SIGTERM, then SIGKILL if it lingers.
fn stop(pid: u32) {
    sys::kill(pid, sys::Signal::Term);
    if !wait_gone(&[pid], Duration::from_secs(2)) {
        sys::kill(pid, sys::Signal::Kill);
        wait_gone(&[pid], Duration::from_secs(2));
    }
}

/// Waits until none of `pids` is alive; false on timeout.
fn wait_gone(pids: &[u32], limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if !pids.iter().any(|&p| sys::alive(p)) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn netns_exists(ns: &str) -> bool {
    Path::new("/run/netns").join(ns).exists()
}

/// Labs with state or with namespaces of our naming pattern.
fn all_names() -> Vec<String> {
    let mut names = state::names();
    if let Ok(rd) = fs::read_dir("/run/netns") {
        for e in rd.flatten() {
            let Ok(ns) = e.file_name().into_string() else {
                continue;
            };
            let lab = ns
                .strip_prefix(state::NS_PREFIX)
                .and_then(|r| r.strip_suffix("-a").or_else(|| r.strip_suffix("-b")));
            if let Some(lab) = lab {
                if state::validate_name(lab).is_ok() && !names.iter().any(|n| n == lab) {
                    names.push(lab.to_string());
                }
            }
        }
    }
    names.sort();
    names
}

fn ask(name: &str, req: &Request) -> Result<Response, Error> {
    state::validate_name(name)?;
    if !sys::has_caps() {
        return Err(Error::NotPermitted);
    }
    if !state::dir(name).exists() {
        return Err(Error::NotFound(name.to_string()));
    }
    control::call(name, req, Duration::from_secs(5))
}

fn unexpected(name: &str, r: &Response) -> Error {
    Error::Control {
        name: name.to_string(),
        why: format!("unexpected answer {r:?}"),
    }
}

/// Runs `ip ARGS`, returning stdout or the failure with its stderr.
fn ip(args: &[&str]) -> Result<String, Error> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::io("run ip (iproute2)", e))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::Command {
            cmd: format!("ip {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}
