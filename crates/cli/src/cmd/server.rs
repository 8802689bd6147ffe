//! `fatpipe server`: one daemon for tests and transfers, many clients at once.
//!
//! Binds, installs its SIGTERM/SIGINT handler, and only then prints
//! `listening on IP:PORT` as its first stdout line (scripts and tests read
//! it as "ready": every port is bound and a signal drains; with `--port 0` it is how they learn the port; with
//! `--metrics`, `metrics on IP:PORT` follows, then with `--iperf3-port`
//! `iperf3 listening on IP:PORT`, then with `--http` `http listening on
//! IP:PORT`), then serves until SIGTERM or
//! SIGINT, on which it drains every port (the engine refuses new sessions,
//! running tests, iperf3's too, end with "the server is shutting down",
//! sessions left after `--drain-timeout` are closed with that reason) and
//! exits 0. The metrics and iperf3 ports are front ends of the same
//! engine server, under its caps, observer and log. Each
//! registered service is one line in [`run`]; session events go to
//! stderr, one line each, unless `--quiet`.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use fatpipe_engine::server::DEFAULT_PORT;
use fatpipe_engine::Server;
use fatpipe_memtest::TestService;
use fatpipe_schema::units;
use fatpipe_transfer::service::CopyService;

/// Arguments of `fatpipe server`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Read settings from this TOML file: each key is a long flag below
    /// (`max-sessions = 64`, `export = ["data=/srv/data"]`); a flag on the
    /// command line wins over the file's key (docs/config.md).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the effective settings (defaults, file, command line) as a
    /// configuration file and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Address to listen on (IPv4 or IPv6).
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: IpAddr,
    /// Port to listen on; 0 picks a free one (printed on the first line).
    #[arg(short = 'p', long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Require clients to prove this pre-shared key.
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// Most sessions at once; more are told the server is busy.
    #[arg(long, default_value_t = fatpipe_engine::server::DEFAULT_MAX_SESSIONS)]
    pub max_sessions: usize,
    /// Time a connection has to authenticate and open a service, from
    /// its accept (the whole handshake: sending slowly does not extend it).
    #[arg(long, default_value = "5s")]
    pub preauth_timeout: String,
    /// Most sessions at once from one address (IPv6: one /64).
    #[arg(long, default_value_t = fatpipe_engine::server::DEFAULT_MAX_SESSIONS_PER_SOURCE)]
    pub max_sessions_per_source: usize,
    /// Most connections still handshaking at once, in all; more are
    /// closed unread.
    #[arg(long, default_value_t = fatpipe_engine::server::DEFAULT_MAX_HANDSHAKES)]
    pub max_handshakes: usize,
    /// Most connections still handshaking at once from one address (IPv6:
    /// one /64); more are closed unread.
    #[arg(long, default_value_t = fatpipe_engine::server::DEFAULT_MAX_HANDSHAKES_PER_SOURCE)]
    pub max_handshakes_per_source: usize,
    /// Most data connections (streams) at once over all sessions; more
    /// are refused, and the session that asked goes on with those it has.
    #[arg(long, default_value_t = fatpipe_engine::server::DEFAULT_MAX_STREAMS)]
    pub max_streams: usize,
    /// Time an opened session has to start (a data connection or a
    /// control message) before it is ended.
    #[arg(long, default_value = "30s")]
    pub start_timeout: String,
    /// No per-session log lines on stderr.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Publish a directory to `fatpipe copy` (repeatable); `:ro` refuses
    /// writes, `:public` serves it without the key (also on a keyed
    /// server: clients without the key may copy public exports only),
    /// `:encrypted` only to clients that `--encrypt`.
    #[arg(long = "export", value_name = "NAME=DIR[:ro][:public][:encrypted]")]
    pub exports: Vec<String>,
    /// Started as root: bind, then run as this user (and its group) from
    /// then on. Each export directory must be owned by it or by root and
    /// not writable by others, or the server refuses to start.
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    /// On SIGTERM/SIGINT, how long running sessions may go on before they
    /// are closed ("the server is shutting down").
    #[arg(long, default_value = "10s")]
    pub drain_timeout: String,
    #[command(flatten)]
    pub metrics: super::metrics::MetricsArgs,
    #[command(flatten)]
    pub http: super::http::HttpArgs,
    /// Also serve stock iperf3 clients on this port (TCP and UDP; 5201 is
    /// iperf3's; 0 picks one, printed on the second line). Off unless
    /// given; no key applies there (docs/iperf3.md).
    #[arg(long, value_name = "PORT")]
    pub iperf3_port: Option<u16>,
    /// iperf3 clients must authenticate (iperf3's RSA scheme): this
    /// server's private key (PEM), as iperf3's --rsa-private-key-path.
    #[arg(long, requires_all = ["iperf3_port", "iperf3_authorized_users"], value_name = "FILE")]
    pub iperf3_rsa_private_key: Option<PathBuf>,
    /// The users iperf3 clients may authenticate as: lines USER,SHA256HEX
    /// of "{USER}PASSWORD", as iperf3's --authorized-users-path.
    #[arg(long, requires = "iperf3_rsa_private_key", value_name = "FILE")]
    pub iperf3_authorized_users: Option<PathBuf>,
    /// Largest difference, in seconds, between an iperf3 client's clock
    /// and this server's that authentication accepts (iperf3's
    /// --time-skew-threshold).
    #[arg(long, default_value_t = fatpipe_iperf3::auth::DEFAULT_SKEW_S, value_name = "SECONDS")]
    pub iperf3_time_skew: u64,
}

/// Binds and serves until the process is stopped.
pub fn run(args: Args) -> anyhow::Result<()> {
    let preauth = units::parse_duration(&args.preauth_timeout)
        .map_err(|e| crate::exit::usage(e.to_string()))?;
    let start = units::parse_duration(&args.start_timeout)
        .map_err(|e| crate::exit::usage(format!("--start-timeout: {e}")))?;
    let drain = units::parse_duration(&args.drain_timeout)
        .map_err(|e| crate::exit::usage(format!("--drain-timeout: {e}")))?;
    let key = match &args.key_file {
        Some(path) => {
            Some(fatpipe_engine::load_key(path).map_err(|e| crate::exit::usage(e.to_string()))?)
        }
        None => None,
    };
    for (flag, n) in [
        ("--max-sessions", args.max_sessions),
        ("--max-sessions-per-source", args.max_sessions_per_source),
        ("--max-streams", args.max_streams),
        ("--max-handshakes", args.max_handshakes),
        (
            "--max-handshakes-per-source",
            args.max_handshakes_per_source,
        ),
    ] {
        if n == 0 {
            return Err(crate::exit::usage(format!("{flag} must be at least 1")));
        }
    }
    // Thousand-stream tests need more descriptors than the usual soft limit.
    fatpipe_engine::raise_fd_limit();
    let logger: fatpipe_engine::Logger = if args.quiet {
        Arc::new(|_| {})
    } else {
        // Lines quote what clients sent (service names, reasons, paths):
        // escaped, so no client can write control sequences into the log.
        Arc::new(|line| eprintln!("fatpipe server: {}", fatpipe_proto::escape(line)))
    };
    let copy = CopyService::new(&args.exports, key.is_some(), &mut |w| {
        eprintln!("fatpipe: server: {w}");
    })
    .map_err(|e| crate::exit::usage(e.to_string()))?;
    let metrics = super::metrics::bind(&args.metrics, key.clone(), logger.clone())?;
    // The leg of a third-party copy between two fatpipe servers: the HTTP
    // port issues one-time tickets, the protocol port takes them.
    let book = Arc::new(fatpipe_http::ticket::Book::default());
    let leg_port = Arc::new(std::sync::OnceLock::new());
    let passive = fatpipe_http::Passive {
        port: Arc::clone(&leg_port),
        book: Arc::clone(&book),
    };
    let http = super::http::bind(&args.http, &args.exports, key.as_ref(), Some(passive))?;
    let iperf3 = match args.iperf3_port {
        Some(port) => Some(super::iperf3::bind_server(&args, port, preauth, start)?),
        None => None,
    };
    // Every port is a front end of the one server: the same caps,
    // observer, log and drain (docs/security.md lists them per port).
    let mut builder = Server::builder();
    let mut addrs = Vec::new();
    let mut registry = None;
    if let Some(m) = metrics {
        builder = builder.observer(m.metrics.clone()).front_end(
            m.listener,
            Arc::new(m.port),
            fatpipe_metrics::http::CAPS,
        );
        addrs.push(format!("metrics on {}", m.addr));
        registry = Some(m.metrics);
    }
    if let Some((listener, port)) = iperf3 {
        addrs.push(format!("iperf3 listening on {}", port.local_addr()));
        // The iperf3 port takes the protocol port's handshake flags, held
        // to its own ceiling.
        let caps = fatpipe_engine::PortCaps::new(
            args.max_handshakes
                .min(fatpipe_iperf3::server::MAX_HANDSHAKES),
            args.max_handshakes_per_source
                .min(fatpipe_iperf3::server::MAX_HANDSHAKES_PER_SOURCE),
        );
        builder = builder.front_end(listener, Arc::new(port), caps);
    }
    if let Some(h) = http {
        addrs.push(format!(
            "http listening on {}{}",
            h.addr,
            if h.tls { " (https)" } else { "" }
        ));
        builder = builder
            .front_end(h.listener, Arc::new(h.port), fatpipe_http::CAPS)
            .tickets(book);
    }
    let server = builder
        .service(TestService)
        .service(fatpipe_probe::ProbeService)
        .service(copy)
        .key(key)
        .max_sessions(args.max_sessions)
        .max_sessions_per_source(args.max_sessions_per_source)
        .max_streams(args.max_streams)
        .max_handshakes(args.max_handshakes, args.max_handshakes_per_source)
        .start_timeout(start)
        .preauth_timeout(preauth)
        .logger(logger.clone())
        .drain_timeout(drain)
        .bind(SocketAddr::new(args.bind, args.port))
        .map_err(|e| crate::exit::usage(e.to_string()))?;
    let _ = leg_port.set(server.local_addr().port());
    // Every socket is bound: root is needed no longer.
    if let Some(name) = &args.user {
        drop_privileges(name, &args.exports)?;
    }
    // The handler is in place before the first line: a script or test that
    // signals the server as soon as it reads that line gets the drain, not
    // the default death.
    let stop = server.shutdown_handle();
    fatpipe_sys::process::on_termination(move |signal| {
        logger(&format!("{signal}: shutting down"));
        stop.trigger();
    })?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "listening on {}", server.local_addr())?;
    if let Some(registry) = &registry {
        let mut services = server.services();
        if args.iperf3_port.is_some() {
            services.push(fatpipe_iperf3::server::SERVICE);
        }
        if args.http.http.is_some() {
            services.push(fatpipe_http::SERVICE);
        }
        registry.declare_services(&services);
    }
    for line in &addrs {
        writeln!(out, "{line}")?;
    }
    out.flush()?;
    drop(out);
    server.run()?;
    Ok(())
}

/// `--user NAME`: checks the exports for that user, then becomes it. Any
/// failure is one line and exit 2; the server never serves half-dropped.
fn drop_privileges(name: &str, exports: &[String]) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let usage = |m: String| crate::exit::usage(format!("--user {name}: {m}"));
    if !fatpipe_sys::process::is_root() {
        return Err(usage("needs the server started as root".into()));
    }
    let user = fatpipe_sys::process::lookup_user(name)
        .map_err(|e| usage(format!("cannot look the user up: {e}")))?
        .ok_or_else(|| usage("no such user".into()))?;
    for spec in exports {
        let export: fatpipe_transfer::session::Export =
            spec.parse().map_err(|e: String| usage(e))?;
        let meta = std::fs::metadata(&export.path)
            .map_err(|e| usage(format!("export {}: {e}", export.path.display())))?;
        if meta.uid() != user.uid && meta.uid() != 0 {
            return Err(usage(format!(
                "export {} is owned by uid {}, not by {name} or root",
                export.path.display(),
                meta.uid()
            )));
        }
        if meta.mode() & 0o002 != 0 {
            return Err(usage(format!(
                "export {} is writable by others (mode {:o})",
                export.path.display(),
                meta.mode() & 0o7777
            )));
        }
    }
    fatpipe_sys::process::drop_to(&user)
        .map_err(|e| usage(format!("cannot become uid {}: {e}", user.uid)))
}
