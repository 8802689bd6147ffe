//! `fatpipe test --iperf3 HOST[:PORT]`: the same test against a stock
//! iperf3 server, rendered and emitted exactly like a fatpipe test.
//!
//! The flags are validated by `test`'s own plan first, then held to
//! iperf3's limits here (128 streams, whole seconds, its block sizes),
//! each refusal one usage line; `fatpipe_iperf3::client` runs the test and
//! returns a `fatpipe.test` report; `test`'s renderers print it.
//!
//! [`bind_server`] is `fatpipe server --iperf3-port`'s side.

use std::cell::RefCell;
use std::io::Write;
use std::time::Duration;

use fatpipe_iperf3::auth;
use fatpipe_iperf3::client::{self, Config, Link, Progress};
use fatpipe_iperf3::wire;
use fatpipe_memtest::msg::{Protocol, TestParams};
use fatpipe_schema::test::TestStreamLine;
use fatpipe_schema::tune::AutoTune;
use fatpipe_tune::auto;
use fatpipe_tune::plan::Policy;

use super::test::{json_line, plan, print_end, print_interval, print_start, Args};

/// Runs `fatpipe test --iperf3`.
pub fn run(args: &Args, rec: Option<&super::archive::Recorder>) -> anyhow::Result<()> {
    let params = plan(args)?;
    // `-p` defaults to fatpipe's port; an iperf3 server's is 5201.
    let port = if args.port == fatpipe_engine::server::DEFAULT_PORT {
        wire::DEFAULT_PORT
    } else {
        args.port
    };
    let addr = super::common::resolve(&args.host, port)?;
    let mut cfg = config(&params)?;
    cfg.server = args.host.clone();
    cfg.addr = addr;
    cfg.auth = credentials(args)?;
    for w in notes(&params) {
        eprintln!("fatpipe: warning: {w}");
    }
    let record: RefCell<Option<AutoTune>> = RefCell::new(None);
    let mut tune = |link: &Link, c: &mut Config| {
        if wants_auto(args, &params) {
            *record.borrow_mut() = auto_tune(args, link, c);
        }
    };
    let mut out = std::io::stdout();
    let mut io_err: Option<std::io::Error> = None;
    let mut on_progress = |p: Progress<'_>| {
        if io_err.is_some() {
            return;
        }
        let r = match (args.json, args.json_stream, p) {
            (false, false, Progress::Start(s)) => print_start(&mut out, s),
            (false, false, Progress::Interval(iv)) => print_interval(&mut out, &params, iv),
            (_, true, Progress::Start(s)) => {
                let mut s = s.clone();
                s.auto.clone_from(&record.borrow());
                json_line(&mut out, &TestStreamLine::Start(s))
            }
            (_, true, Progress::Interval(iv)) => {
                json_line(&mut out, &TestStreamLine::Interval(iv.clone()))
            }
            (true, false, _) => Ok(()),
        };
        if let Err(e) = r {
            io_err = Some(e);
        }
    };
    let mut report = client::run(&cfg, &mut tune, &mut on_progress).map_err(|e| {
        if e.is_usage() {
            crate::exit::usage(format!("{}: {e}", args.host))
        } else {
            anyhow::Error::new(e).context(format!("iperf3 test against {}", args.host))
        }
    })?;
    if let Some(e) = io_err {
        return Err(e.into());
    }
    report.start.auto = record.into_inner();
    if args.json {
        crate::cmd::common::json_pretty(&mut out, &report)?;
    } else if args.json_stream {
        json_line(&mut out, &TestStreamLine::End(report.end.clone()))?;
    } else {
        print_end(&mut out, &params, &report.end)?;
    }
    out.flush()?;
    if let Some(r) = rec {
        r.test(&report)?;
    }
    if let Some(file) = &args.plot {
        super::plots::test(&report, file)?;
    }
    Ok(())
}

/// Binds `fatpipe server --iperf3-port`'s port (TCP and UDP) on the
/// server's address: the front end the server runs beside the fatpipe
/// protocol's, under the same caps, log (escaped), observer and drain.
pub fn bind_server(
    a: &super::server::Args,
    port: u16,
    handshake: Duration,
    start: Duration,
) -> anyhow::Result<(std::net::TcpListener, fatpipe_iperf3::server::Iperf3Port)> {
    let auth = match (&a.iperf3_rsa_private_key, &a.iperf3_authorized_users) {
        (Some(key), Some(users)) => Some(std::sync::Arc::new(
            auth::Authorizer::load(key, users, a.iperf3_time_skew)
                .map_err(|e| crate::exit::usage(e.to_string()))?,
        )),
        (None, None) => None,
        _ => {
            return Err(crate::exit::usage(
                "--iperf3-rsa-private-key and --iperf3-authorized-users go together",
            ))
        }
    };
    let opts = fatpipe_iperf3::server::Options {
        handshake_timeout: handshake,
        start_timeout: start,
        auth,
    };
    fatpipe_iperf3::server::Iperf3Port::bind(std::net::SocketAddr::new(a.bind, port), opts)
        .map_err(|e| crate::exit::usage(format!("--iperf3-port: {e}")))
}

/// Holds a validated plan to what iperf3 accepts.
fn config(p: &TestParams) -> anyhow::Result<Config> {
    let usage = |m: &str| crate::exit::usage(m);
    if p.streams > wire::MAX_STREAMS {
        return Err(crate::exit::usage(format!(
            "-P/--parallel: an iperf3 server takes at most {} streams",
            wire::MAX_STREAMS
        )));
    }
    match p.protocol {
        Protocol::Tcp if p.length > wire::MAX_TCP_BLOCK => {
            return Err(usage("-l/--length: iperf3 takes at most 1M for TCP"));
        }
        Protocol::Udp if !wire::UDP_BLOCK.contains(&p.length) => {
            return Err(usage("-l/--length: iperf3 takes 16..65507 for UDP"));
        }
        _ => {}
    }
    if p.window.is_some_and(|w| w > wire::MAX_WINDOW) {
        return Err(usage("-w/--window: iperf3 takes at most 512M"));
    }
    if p.mss.is_some_and(|m| m > wire::MAX_MSS) {
        return Err(crate::exit::usage(format!(
            "-M/--mss: iperf3 takes at most {}",
            wire::MAX_MSS
        )));
    }
    let time_s = p.duration_ms.div_ceil(1000);
    let omit_s = p.omit_ms.div_ceil(1000);
    if p.bytes.is_none() && time_s > wire::MAX_TIME {
        return Err(usage("-t/--time: iperf3 takes at most 86400 s"));
    }
    if omit_s > wire::MAX_OMIT {
        return Err(usage("-O/--omit: iperf3 3.12 takes at most 600 s"));
    }
    Ok(Config {
        server: String::new(),
        addr: ([127, 0, 0, 1], wire::DEFAULT_PORT).into(),
        protocol: p.protocol,
        direction: p.direction,
        streams: p.streams,
        time_s,
        bytes: p.bytes,
        omit_s,
        interval: Duration::from_millis(p.interval_ms),
        length: p.length,
        bitrate: p.bitrate,
        window: p.window,
        mss: p.mss,
        congestion: p.congestion.clone(),
        fq_rate: p.fq_rate,
        zerocopy: p.zerocopy,
        local_congestion: None,
        connect_timeout: Duration::from_secs(10),
        auth: None,
    })
}

/// iperf3's RSA credentials from `--iperf3-username`, the public key and
/// `IPERF3_PASSWORD` (iperf3 reads its password there too).
fn credentials(args: &Args) -> anyhow::Result<Option<auth::Credentials>> {
    let (Some(user), Some(key)) = (&args.iperf3_username, &args.iperf3_rsa_public_key) else {
        return Ok(None);
    };
    if user.is_empty() || user.chars().any(char::is_whitespace) {
        return Err(crate::exit::usage(
            "--iperf3-username: a name without spaces (iperf3's format cannot carry them)",
        ));
    }
    let password = std::env::var("IPERF3_PASSWORD").map_err(|_| {
        crate::exit::usage("--iperf3-username: set the password in IPERF3_PASSWORD, as for iperf3")
    })?;
    if password.is_empty() || password.chars().any(char::is_whitespace) {
        return Err(crate::exit::usage(
            "IPERF3_PASSWORD: a password without spaces (iperf3's format cannot carry them)",
        ));
    }
    let key = auth::load_public_key(key).map_err(|e| crate::exit::usage(e.to_string()))?;
    Ok(Some(auth::Credentials {
        user: user.clone(),
        password,
        key,
        padding: if args.iperf3_oaep {
            auth::Padding::Oaep
        } else {
            auth::Padding::Pkcs1v15
        },
    }))
}

/// What the user should know before the test: roundings to iperf3's
/// whole seconds, and what auto-tuning cannot do against iperf3.
fn notes(p: &TestParams) -> Vec<String> {
    let mut out = Vec::new();
    if p.bytes.is_none() && !p.duration_ms.is_multiple_of(1000) {
        out.push(format!(
            "iperf3 counts whole seconds: -t rounded up to {} s",
            p.duration_ms.div_ceil(1000)
        ));
    }
    if !p.omit_ms.is_multiple_of(1000) {
        out.push(format!(
            "iperf3 counts whole seconds: -O rounded up to {} s",
            p.omit_ms.div_ceil(1000)
        ));
    }
    out
}

/// True when auto-tuning has something to choose: the same answer as
/// `fatpipe test`'s.
fn wants_auto(a: &Args, p: &TestParams) -> bool {
    auto::wanted(
        a.no_auto,
        p.protocol == Protocol::Tcp,
        &super::test::overrides(a, p),
    )
}

/// Plans from what the control connection showed (RTT, MTU) and this
/// host's limits, within iperf3's: streams (≤ 128) and a buffer the
/// server will grant; the congestion control only on this end's sockets.
/// Prints the `auto:` line and what could not be learnt; `None` (and the
/// flags as given) when it cannot plan.
fn auto_tune(a: &Args, link: &Link, c: &mut Config) -> Option<AutoTune> {
    let Some(rtt) = link.rtt else {
        eprintln!(
            "fatpipe: warning: auto-tuning off: no round trip seen on the control connection"
        );
        return None;
    };
    let policy = Policy {
        max_streams: Policy::default().max_streams.min(wire::MAX_STREAMS),
        ..Policy::default()
    };
    let pre = match auto::blind_live(rtt, link.mtu, &policy) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("fatpipe: warning: auto-tuning off: {e}");
            return None;
        }
    };
    let overrides = auto::Overrides {
        streams: a.parallel.map(|_| c.streams),
        buffer: c.window,
        congestion: c.congestion.clone(),
        pacing_rate: c.fq_rate,
    };
    // Settled as `test` and `copy` settle their probe's plan, and printed
    // as `test` prints it.
    let t = auto::settle_with(
        pre,
        auto::Laid {
            overrides: &overrides,
            floor: None,
            rate_cap: None,
            policy: &policy,
        },
    );
    let s = &t.settings;
    c.streams = s.streams.min(wire::MAX_STREAMS);
    c.window = s.buffer.map(|b| b.min(wire::MAX_WINDOW));
    c.fq_rate = s.pacing_rate;
    if c.congestion.is_none() {
        c.local_congestion = s.congestion.clone();
    }
    // What only iperf3 lacks is always said.
    let mut own = vec!["no in-flight adjustment: iperf3 cannot add streams to a running test"];
    if c.congestion.is_none() {
        own.push("congestion control set at this end only (the server may not offer it)");
    }
    let mut rec = t.record;
    let (line, warnings) = if a.verbose {
        (&t.line, &rec.warnings)
    } else {
        (&t.short, &t.act_on)
    };
    eprintln!("{line}");
    for w in warnings
        .iter()
        .map(String::as_str)
        .chain(own.iter().copied())
    {
        eprintln!("fatpipe: warning: auto: {w}");
    }
    rec.warnings.extend(own.into_iter().map(String::from));
    Some(rec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn cfg(argv: &[&str]) -> anyhow::Result<Config> {
        let mut full = vec!["fatpipe-test", "--iperf3"];
        full.extend_from_slice(argv);
        let cli = Cli::try_parse_from(full)?;
        config(&plan(&cli.args)?)
    }

    #[test]
    fn flags_map_to_iperf3_parameters() {
        let c = cfg(&[
            "h", "-P", "4", "-R", "-w", "4M", "-M", "1400", "-C", "reno", "-t", "3", "-O", "1",
            "-Z",
        ])
        .unwrap();
        assert_eq!((c.streams, c.time_s, c.omit_s), (4, 3, 1));
        assert_eq!(c.direction, fatpipe_schema::test::TestDirection::Down);
        let p = client::params(&c);
        assert!(p.reverse && !p.bidirectional);
        assert_eq!(
            (p.window, p.mss, p.len),
            (Some(4 << 20), Some(1400), Some(128 * 1024))
        );
        assert_eq!(p.congestion.as_deref(), Some("reno"));
        assert!(p.check().is_ok());
        let c = cfg(&["h", "-u", "-b", "10m", "-l", "1200", "--bidir", "-n", "1M"]).unwrap();
        let p = client::params(&c);
        assert_eq!(p.transport, Some(wire::Transport::Udp));
        assert_eq!(
            (p.bandwidth, p.len, p.num, p.time),
            (Some(10_000_000), Some(1200), 1 << 20, 0)
        );
        assert!(p.bidirectional);
        assert_eq!(
            cfg(&["h", "-t", "1.5s"]).unwrap().time_s,
            2,
            "whole seconds, rounded up"
        );
    }

    #[test]
    fn iperf3_limits_are_usage_errors() {
        for argv in [
            &["h", "-P", "129"][..],
            &["h", "-l", "2M"],
            &["h", "-w", "1G"],
            &["h", "-M", "40000"],
        ] {
            let err = cfg(argv).unwrap_err();
            assert!(
                err.chain().any(|e| e.is::<crate::exit::UsageError>()),
                "{argv:?}: {err}"
            );
        }
        assert!(cfg(&["h", "-P", "128"]).is_ok());
    }
}
