//! `fatpipe server --http ADDR` (the flags of the HTTP/WebDAV port and its
//! wiring; the port itself is `fatpipe-http`'s) and `fatpipe token`, which
//! mints the bearer tokens that port verifies (docs/http.md).

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;

use fatpipe_http::token::{self, Audience, Claims};
use fatpipe_http::{Config, HttpPort};
use fatpipe_schema::units;

/// The HTTP flags of `fatpipe server`.
#[derive(Debug, clap::Args)]
pub struct HttpArgs {
    /// Serve the exports over HTTP/WebDAV on ADDR (HTTPS with --tls-cert
    /// and --tls-key), e.g. 0.0.0.0:8443; port 0 picks one (printed as
    /// `http listening on IP:PORT`). Export NAME is at /NAME/; :public
    /// exports need no token, the others a bearer token (fatpipe token).
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// The HTTPS certificate chain (PEM).
    #[arg(long, requires_all = ["http", "tls_key"], value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The HTTPS private key (PEM).
    #[arg(long, requires_all = ["http", "tls_cert"], value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// A token audience (`aud`) this server accepts (repeatable; default
    /// "fatpipe"; the WLCG "any" audience is always accepted).
    #[arg(long = "http-audience", requires = "http", value_name = "AUD")]
    pub audiences: Vec<String>,
    /// Trust bearer tokens of an external issuer (repeatable): tokens whose
    /// `iss` is ISS, signed RS256 or ES256 by a key of the JWKS file
    /// (e.g. the issuer's jwks_uri document, saved).
    #[arg(long = "http-issuer", requires = "http", value_name = "ISS=JWKS_FILE")]
    pub issuers: Vec<String>,
    /// Accept the static bearer tokens of FILE: lines `TOKEN SCOPE...`
    /// (e.g. `0f3a…e1 storage.read:/data`), for sites without a token
    /// issuer; they never expire (remove the line and restart to revoke).
    #[arg(long, requires = "http", value_name = "FILE")]
    pub http_token_file: Option<PathBuf>,
    /// Checksums computed while an upload is written and kept with the
    /// file (others are computed on the first request and kept).
    #[arg(
        long,
        requires = "http",
        default_value = "adler32,crc32c",
        value_name = "LIST"
    )]
    pub http_checksums: String,
    /// Record every file transfer of the HTTP port (a GET of a file or a
    /// range of it, a PUT: bytes, duration, peer) as a run in the archive:
    /// this SQLite file or postgres:// URL, or with no value
    /// $FATPIPE_ARCHIVE, else the user's data directory. Give it as
    /// --archive=LOCATION, or last.
    #[arg(
        long,
        requires = "http",
        value_name = "LOCATION",
        num_args = 0..=1,
        default_missing_value = ""
    )]
    pub archive: Option<String>,
    /// Addresses a third-party COPY may connect to besides public ones: a
    /// comma list of `loopback`, `private` (10/8, 172.16/12, 192.168/16,
    /// 100.64/10, link-local, fc00::/7) and networks (198.18.0.0/15).
    #[arg(long, requires = "http", value_name = "LIST")]
    pub http_tpc_allow: Option<String>,
    /// The most third-party COPYs running at once (503 beyond).
    #[arg(long, requires = "http", default_value_t = 16, value_name = "N")]
    pub http_tpc_max: usize,
    /// A COPY fails when no byte moved for PROGRESS, or none at all
    /// arrived in FIRST (XRootD's tpc.timeout).
    #[arg(
        long,
        requires = "http",
        default_value = "60s,120s",
        value_name = "PROGRESS,FIRST"
    )]
    pub http_tpc_timeout: String,
    /// Time between a COPY's performance markers (at most 5s).
    #[arg(long, requires = "http", default_value = "5s", value_name = "DURATION")]
    pub http_tpc_markers: String,
    /// The fewest connections a ranged COPY pull opens (more on a long
    /// path: one per 10 ms of round trip, up to 16); a client's
    /// X-Number-Of-Streams above 1 is the ceiling.
    #[arg(long, requires = "http", default_value_t = 4, value_name = "N")]
    pub http_tpc_streams: u32,
    /// CA certificates (PEM) trusted for https:// peers of a COPY, instead
    /// of the Mozilla roots.
    #[arg(long, requires = "http", value_name = "FILE")]
    pub http_tpc_ca: Option<PathBuf>,
    /// Between two fatpipe servers a COPY's data moves over the copy
    /// protocol (the "leg": auto-tuned streams, verified chunks, resume),
    /// authorised by a one-time ticket the other server's HTTP port issues
    /// (docs/http.md); `off`: neither use it nor offer it.
    #[arg(long, requires = "http", default_value = "on", value_name = "on|off",
          value_parser = ["on", "off"])]
    pub http_tpc_leg: String,
    /// The smallest file a COPY pull moves over the leg (smaller ones go
    /// over HTTP, on a warm connection: the leg's own connections start
    /// cold).
    #[arg(long, requires = "http", default_value = "64M", value_name = "SIZE")]
    pub http_tpc_leg_min: String,
}

/// The bound HTTP port.
pub struct Bound {
    pub addr: SocketAddr,
    pub listener: TcpListener,
    pub port: HttpPort,
    pub tls: bool,
}

/// Binds the port (before the server runs, so a bad address, certificate
/// or export is a usage error), if `--http` asked.
pub fn bind(
    args: &HttpArgs,
    exports: &[String],
    key: Option<&fatpipe_proto::Key>,
    leg: Option<fatpipe_http::Passive>,
) -> anyhow::Result<Option<Bound>> {
    let Some(addr) = args.http else {
        return Ok(None);
    };
    let usage = |e: fatpipe_http::SetupError| crate::exit::usage(e.to_string());
    let mut cfg = Config::new(exports).map_err(usage)?;
    for spec in exports {
        if let Ok(e) = spec.parse::<fatpipe_transfer::session::Export>() {
            if e.encrypted {
                eprintln!(
                    "fatpipe: server: export '{}' is :encrypted (the copy protocol's encryption): not served over --http",
                    e.name
                );
            }
        }
    }
    cfg.inline_checksums(&args.http_checksums).map_err(usage)?;
    if let (Some(cert), Some(k)) = (&args.tls_cert, &args.tls_key) {
        cfg.tls = Some(fatpipe_http::load_tls(cert, k).map_err(usage)?);
    }
    let audiences = if args.audiences.is_empty() {
        vec![token::DEFAULT_AUDIENCE.to_string()]
    } else {
        args.audiences.clone()
    };
    let mut verifier = match key {
        Some(k) => Some(token::Verifier::new(k.as_bytes(), audiences)),
        None if !args.issuers.is_empty() || args.http_token_file.is_some() => {
            Some(token::Verifier::without_key(audiences))
        }
        None => None,
    };
    for spec in &args.issuers {
        let usage = |m: String| crate::exit::usage(format!("--http-issuer {spec}: {m}"));
        let (iss, file) = spec
            .split_once('=')
            .ok_or_else(|| usage("expected ISS=JWKS_FILE".into()))?;
        let doc = std::fs::read(file).map_err(|e| usage(e.to_string()))?;
        let issuer = token::Issuer::from_jwks(iss, &doc).map_err(usage)?;
        verifier = verifier.map(|v| v.trust(issuer));
    }
    if let Some(path) = &args.http_token_file {
        let usage =
            |m: String| crate::exit::usage(format!("--http-token-file {}: {m}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| usage(e.to_string()))?;
        let tokens = token::parse_token_file(&text).map_err(usage)?;
        verifier = verifier.map(|v| v.with_static(tokens));
    }
    cfg.tokens = verifier;
    if let Some(flag) = &args.archive {
        cfg.archive = Some(archive_writer(flag)?);
    }
    tpc_settings(args, &mut cfg.tpc)?;
    if cfg.tpc.leg {
        cfg.leg = leg;
    }
    let listener = TcpListener::bind(addr)
        .map_err(|e| crate::exit::usage(format!("--http: bind {addr}: {e}")))?;
    Ok(Some(Bound {
        addr: listener.local_addr()?,
        listener,
        tls: cfg.tls.is_some(),
        port: HttpPort::new(cfg),
    }))
}

/// Opens the archive (now: before the server may drop root, and so that
/// a wrong location is a usage error at start) on a thread of its own
/// that stores the port's transfer records as they come.
fn archive_writer(flag: &str) -> anyhow::Result<fatpipe_http::archive::Sink> {
    let flag = flag.to_string();
    let (sink, rx) = fatpipe_http::archive::Sink::new();
    let dropped = sink.dropped_count();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("http-archive".into())
        .spawn(move || {
            let mut store = match super::archive::open(Some(flag.as_str())) {
                Ok(s) => {
                    let _ = ready_tx.send(Ok(()));
                    s
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let host = super::archive::host_facts();
            let mut said = 0;
            for t in rx {
                let run = transfer_run(&t, host.clone());
                if let Err(e) = store.insert_runs(std::slice::from_ref(&run)) {
                    eprintln!("fatpipe: server: archive: {e}");
                }
                let now = dropped.load(std::sync::atomic::Ordering::Relaxed);
                if now > said {
                    eprintln!(
                        "fatpipe: server: archive: {} transfer records dropped (the archive is slower than the port)",
                        now - said
                    );
                    said = now;
                }
            }
        })?;
    ready_rx
        .recv()
        .map_err(|_| anyhow::anyhow!("archive: its thread ended"))??;
    Ok(sink)
}

/// One HTTP transfer as a run of kind copy: its document a `fatpipe.copy`
/// report seen from the server (`server` is the client's address; a GET
/// is the client's pull).
fn transfer_run(
    t: &fatpipe_http::archive::Transfer,
    host: fatpipe_archive::HostFacts,
) -> fatpipe_archive::Run {
    use fatpipe_schema::copy::{
        CopyDirection, CopyReport, CopyTimeline, COPY_SCHEMA, COPY_SCHEMA_VERSION,
    };
    let secs = t.seconds.max(1e-9);
    let get = t.method == "GET";
    let peer = t.peer.to_string();
    let report = CopyReport {
        schema: COPY_SCHEMA.into(),
        version: COPY_SCHEMA_VERSION,
        direction: if get {
            CopyDirection::Pull
        } else {
            CopyDirection::Push
        },
        server: peer.clone(),
        export: t.path.clone(),
        sources: vec![if get { t.path.clone() } else { peer.clone() }],
        destination: if get { peer.clone() } else { t.path.clone() },
        streams: 1,
        chunk_size: t.bytes,
        checksum: "none".into(),
        sync: !get,
        direct: false,
        bwlimit: None,
        files_total: 1,
        files_verified: 0,
        files_skipped: 0,
        files_failed: u64::from(!t.complete),
        bytes_total: t.bytes,
        bytes_transferred: t.bytes,
        chunks_resent: 0,
        reconnects: 0,
        seconds: secs,
        rate: (t.bytes as f64 * 8.0 / secs) as u64,
        files_per_sec: 1.0 / secs,
        io_local: if get {
            "http GET (server)"
        } else {
            "http PUT (server)"
        }
        .into(),
        io_remote: format!("http {}", t.status),
        peak_rss_local: super::copy::peak_rss(),
        failures: if t.complete {
            vec![]
        } else {
            vec![fatpipe_schema::copy::CopyFailure {
                path: t.path.clone(),
                message: format!("the connection ended after {} bytes", t.bytes),
            }]
        },
        problems: vec![],
        skipped: vec![],
        hard_links: vec![],
        notes_not_listed: 0,
        auto: None,
        timeline: Some(CopyTimeline {
            wall_secs: secs,
            ..CopyTimeline::default()
        }),
        encryption: None,
    };
    let finished: chrono::DateTime<chrono::Utc> = t.finished.into();
    let path = super::archive::path_key(&peer);
    match fatpipe_archive::Run::from_copy(&report, path.clone(), host.clone(), finished) {
        Ok(r) => r.with_peer(peer),
        Err(e) => fatpipe_archive::Run::failed(
            fatpipe_archive::RunKind::Copy,
            path,
            host,
            finished,
            finished,
            e.to_string(),
        ),
    }
}

/// Reads the third-party copy's flags into its settings.
fn tpc_settings(args: &HttpArgs, t: &mut fatpipe_http::tpc::Settings) -> anyhow::Result<()> {
    if let Some(list) = &args.http_tpc_allow {
        t.policy = fatpipe_http::tpc::Policy::parse(list)
            .map_err(|e| crate::exit::usage(format!("--http-tpc-allow {e}")))?;
    }
    t.max_active = args.http_tpc_max.max(1);
    let secs = |flag: &str, v: &str| {
        units::parse_duration(v.trim())
            .map_err(|e| crate::exit::usage(format!("--{flag} '{v}': {e}")))
    };
    let (progress, first) = match args.http_tpc_timeout.split_once(',') {
        Some((p, f)) => (p, Some(f)),
        None => (args.http_tpc_timeout.as_str(), None),
    };
    t.progress_timeout = secs("http-tpc-timeout", progress)?;
    t.first_byte_timeout = match first {
        Some(f) => secs("http-tpc-timeout", f)?,
        None => t.progress_timeout * 2,
    };
    let period = secs("http-tpc-markers", &args.http_tpc_markers)?;
    if period.is_zero() || period > std::time::Duration::from_secs(5) {
        return Err(crate::exit::usage(
            "--http-tpc-markers: between 0 and 5s (davix and FTS expect a marker at least every 5s)",
        ));
    }
    t.marker_period = period;
    if !(1..=fatpipe_http::tpc::MAX_STREAMS).contains(&args.http_tpc_streams) {
        return Err(crate::exit::usage(format!(
            "--http-tpc-streams: 1 to {}",
            fatpipe_http::tpc::MAX_STREAMS
        )));
    }
    t.streams = args.http_tpc_streams;
    t.leg = args.http_tpc_leg == "on";
    t.leg_min = units::parse_size(&args.http_tpc_leg_min)
        .map_err(|e| crate::exit::usage(format!("--http-tpc-leg-min: {e}")))?;
    if let Some(ca) = &args.http_tpc_ca {
        fatpipe_http::client::Options::new(Some(ca), None)
            .map_err(|e| crate::exit::usage(format!("--http-tpc-ca: {e}")))?;
        t.ca = Some(ca.clone());
    }
    Ok(())
}

/// Arguments of `fatpipe token`.
#[derive(Debug, clap::Args)]
pub struct TokenArgs {
    /// The server's pre-shared key (its --key-file): tokens are signed
    /// with a key derived from it.
    #[arg(long, value_name = "FILE")]
    pub key_file: PathBuf,
    /// A WLCG storage scope (repeatable): storage.read:/PATH,
    /// storage.create:/PATH or storage.modify:/PATH, where /PATH is the
    /// URL path (/EXPORT/dir; / is every export).
    #[arg(long = "scope", required = true, value_name = "SCOPE")]
    pub scopes: Vec<String>,
    /// The audience (`aud`): a name the server accepts (--http-audience).
    #[arg(long, default_value = token::DEFAULT_AUDIENCE, value_name = "AUD")]
    pub aud: String,
    /// How long the token is valid.
    #[arg(long, default_value = "1h", value_name = "DURATION")]
    pub lifetime: String,
    /// The subject (`sub`): who the token is for (shown in the log).
    #[arg(long, default_value = "fatpipe-user", value_name = "NAME")]
    pub sub: String,
    /// When the token's validity starts (`iat`, `nbf`), in seconds since
    /// the epoch; default now.
    #[arg(long, value_name = "UNIX_SECONDS")]
    pub issued_at: Option<u64>,
    /// Print the claims as JSON on stderr as well.
    #[arg(long)]
    pub show: bool,
}

/// Prints one token on stdout.
pub fn mint(args: TokenArgs) -> anyhow::Result<()> {
    let key =
        fatpipe_engine::load_key(&args.key_file).map_err(|e| crate::exit::usage(e.to_string()))?;
    let lifetime = units::parse_duration(&args.lifetime)
        .map_err(|e| crate::exit::usage(format!("--lifetime: {e}")))?;
    for s in &args.scopes {
        if token::Scope::parse(s).is_none() {
            return Err(crate::exit::usage(format!(
                "--scope '{s}': expected storage.read:/PATH, storage.create:/PATH or storage.modify:/PATH"
            )));
        }
    }
    let now = match args.issued_at {
        Some(t) => t,
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs(),
    };
    let mut jti = [0u8; 12];
    getrandom::fill(&mut jti).map_err(|e| anyhow::anyhow!("random: {e}"))?;
    let claims = Claims {
        iss: token::ISSUER.into(),
        sub: args.sub,
        aud: Audience::One(args.aud),
        exp: now + lifetime.as_secs().max(1),
        nbf: Some(now),
        iat: now,
        jti: jti.iter().map(|b| format!("{b:02x}")).collect(),
        scope: args.scopes.join(" "),
        wlcg_ver: "1.0".into(),
    };
    if args.show {
        eprintln!("{}", serde_json::to_string_pretty(&claims)?);
    }
    println!("{}", token::mint(key.as_bytes(), &claims));
    Ok(())
}
