//! `fatpipe copy` with an `http(s)://` or `dav(s)://` URL on one side: the
//! client of `fatpipe_http::client` (docs/http.md, "fatpipe copy over
//! HTTP"). A pull fetches ranged blocks over several connections, their
//! count steered by the in-flight adjuster as the copy's streams are
//! (`-P` fixes it); a push is one PUT. Both verify against the server's
//! checksum when it offers one, and print the copy's summary or JSON.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fatpipe_archive::RunKind;
use fatpipe_http::client::{self, get, put, ClientError, Options, Url};
use fatpipe_http::tpc::request as tpc;
use fatpipe_proto::escape;
use fatpipe_schema::copy::{
    CopyDirection, CopyReport, CopyTimeline, COPY_SCHEMA, COPY_SCHEMA_VERSION,
};
use fatpipe_schema::tune::Action;
use fatpipe_schema::units;
use fatpipe_transfer::Progress;
use fatpipe_tune::adjust::{AdjustConfig, Adjuster};
use fatpipe_tune::steer::{Driver, Event, Steerable};

use super::archive::Recorder;
use super::copy::Args;

/// Connections a download starts with when auto-tuning steers it, and
/// its fixed count with `--no-auto`.
const DEFAULT_CONNECTIONS: u32 = 4;
/// The environment variables WLCG tools read a bearer token from.
const TOKEN_ENV: &str = "BEARER_TOKEN";
const TOKEN_FILE_ENV: &str = "BEARER_TOKEN_FILE";
/// The largest token accepted.
const MAX_TOKEN: usize = 16 * 1024;

/// Whether any path of the copy is an HTTP(S)/WebDAV URL.
pub fn applies(args: &Args) -> bool {
    args.paths
        .iter()
        .any(|p| client::is_url(p.as_encoded_bytes()))
}

fn usage(e: ClientError) -> anyhow::Error {
    match e {
        ClientError::Usage(m) => crate::exit::usage(format!("copy: {}", escape(&m))),
        ClientError::Failed(m) => anyhow::anyhow!("copy: {}", escape(&m)),
    }
}

/// The bearer token: `--token FILE`, else `$BEARER_TOKEN`, else the file
/// `$BEARER_TOKEN_FILE` names (WLCG bearer token discovery), trimmed.
fn token(file: Option<&Path>) -> anyhow::Result<Option<String>> {
    let (text, from) = match file {
        Some(f) => (
            read_token(f)
                .map_err(|e| crate::exit::usage(format!("--token {}: {e}", f.display())))?,
            format!("--token {}", f.display()),
        ),
        None => match std::env::var(TOKEN_ENV) {
            Ok(t) => (t, TOKEN_ENV.to_string()),
            Err(_) => match std::env::var_os(TOKEN_FILE_ENV) {
                Some(f) => {
                    let f = PathBuf::from(f);
                    (
                        read_token(&f).map_err(|e| {
                            crate::exit::usage(format!("{TOKEN_FILE_ENV} {}: {e}", f.display()))
                        })?,
                        TOKEN_FILE_ENV.to_string(),
                    )
                }
                None => return Ok(None),
            },
        },
    };
    let t = text.trim();
    if t.is_empty() {
        return Err(crate::exit::usage(format!("{from}: the token is empty")));
    }
    if t.len() > MAX_TOKEN || !t.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(crate::exit::usage(format!(
            "{from}: not a bearer token (printable ASCII without spaces, at most {MAX_TOKEN} bytes)"
        )));
    }
    Ok(Some(t.to_string()))
}

fn read_token(f: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut s = String::new();
    std::fs::File::open(f)?
        .take(MAX_TOKEN as u64 + 1)
        .read_to_string(&mut s)?;
    Ok(s)
}

enum Job {
    Pull {
        url: Url,
        dest: PathBuf,
    },
    Push {
        source: PathBuf,
        url: Url,
    },
    PushTree {
        root: PathBuf,
        url: Url,
        contents: bool,
    },
    PullTree {
        url: Url,
        dest: PathBuf,
    },
    /// Both ends remote: a third-party copy.
    Tpc {
        source: Url,
        dest: Url,
        way: tpc::Way,
    },
}

fn plan(args: &Args) -> anyhow::Result<Job> {
    let u = |m: &str| crate::exit::usage(m.to_string());
    if args.paths.len() != 2 {
        return Err(u(
            "over HTTP, copy one file: SOURCE DEST (several sources: not yet)",
        ));
    }
    if args.encrypt || args.key_file.is_some() {
        return Err(u(
            "--encrypt and --key-file are for fatpipe servers; an HTTPS URL is encrypted, a token goes in --token FILE",
        ));
    }
    let (src, dst) = (&args.paths[0], &args.paths[1]);
    let parse = |p: &OsString| -> anyhow::Result<Option<Url>> {
        if !client::is_url(p.as_encoded_bytes()) {
            return Ok(None);
        }
        let s = p.to_str().ok_or_else(|| u("a URL must be valid text"))?;
        Url::parse(s).map(Some).map_err(crate::exit::usage)
    };
    match (parse(src)?, parse(dst)?) {
        (Some(source), Some(dest)) => {
            if args.recursive || source.is_dir() {
                return Err(u(
                    "a third-party copy is one file: name it (no -r, no trailing /)",
                ));
            }
            let dest = if dest.is_dir() {
                let name = source.file_name().ok_or_else(|| {
                    u("the source URL has no file name to copy into a collection")
                })?;
                dest.join(&name)
            } else {
                dest
            };
            let way = match args.tpc.as_deref() {
                Some("push") => tpc::Way::Push,
                _ => tpc::Way::Pull,
            };
            Ok(Job::Tpc { source, dest, way })
        }
        (Some(url), None) if args.recursive => {
            if url.path.contains('?') {
                return Err(u("-r from a URL: name a collection without a query"));
            }
            // As for a local tree: a source ending in / copies what is in
            // it into DEST, otherwise the collection itself (by its name).
            let dest = PathBuf::from(dst);
            let dest = if url.is_dir() {
                dest
            } else {
                let name = url
                    .file_name()
                    .ok_or_else(|| u("the source URL has no collection name"))?;
                dest.join(std::ffi::OsStr::from_bytes(&name))
            };
            Ok(Job::PullTree { url, dest })
        }
        (Some(url), None) => {
            if url.is_dir() {
                return Err(u(
                    "the source URL names a collection (ends with /): name a file",
                ));
            }
            let dest = PathBuf::from(dst);
            let into_dir = dst.as_encoded_bytes().ends_with(b"/") || dest.is_dir();
            let dest = if into_dir {
                let name = url
                    .file_name()
                    .ok_or_else(|| u("the source URL has no file name to copy into a directory"))?;
                // A name from the URL: one component, never a path.
                dest.join(std::ffi::OsStr::from_bytes(&name))
            } else {
                dest
            };
            Ok(Job::Pull { url, dest })
        }
        (None, Some(url)) if std::path::Path::new(src).is_dir() => {
            if !args.recursive {
                return Err(u("the source is a directory: copy it with -r"));
            }
            Ok(Job::PushTree {
                root: PathBuf::from(src),
                url,
                contents: src.as_encoded_bytes().ends_with(b"/"),
            })
        }
        (None, Some(url)) => {
            let source = PathBuf::from(src);
            let url = if url.is_dir() {
                let name = source
                    .file_name()
                    .ok_or_else(|| u("the source has no file name to put into the collection"))?;
                url.join(name.as_encoded_bytes())
            } else {
                url
            };
            Ok(Job::Push { source, url })
        }
        (None, None) => Err(u("neither side is a URL")),
    }
    .and_then(|j| match (&j, &args.tpc) {
        (Job::Tpc { .. }, _) | (_, None) => Ok(j),
        _ => Err(u("--tpc is for a copy between two URLs")),
    })
}

use std::os::unix::ffi::OsStrExt;

/// Runs an HTTP copy.
pub fn run(args: Args) -> anyhow::Result<()> {
    let job = plan(&args)?;
    let host = match &job {
        Job::Pull { url, .. }
        | Job::Push { url, .. }
        | Job::PushTree { url, .. }
        | Job::PullTree { url, .. } => url.authority(),
        Job::Tpc { dest, .. } => dest.authority(),
    };
    let rec = Recorder::new(args.archive.as_deref(), RunKind::Copy, &host)?;
    let result = transfer(&args, job, rec.as_ref());
    if let (Some(r), Err(e)) = (&rec, &result) {
        r.failed(e);
    }
    result
}

fn transfer(args: &Args, job: Job, rec: Option<&Recorder>) -> anyhow::Result<()> {
    let t0 = Instant::now();
    if let Some(p) = args.parallel {
        if !(1..=get::MAX_CONNECTIONS).contains(&u32::from(p)) {
            return Err(crate::exit::usage(format!(
                "-P/--parallel over HTTP must be 1..={}",
                get::MAX_CONNECTIONS
            )));
        }
    }
    let bwlimit = match &args.bwlimit {
        Some(r) => match units::parse_rate(r) {
            Ok(0) => return Err(crate::exit::usage("--bwlimit must be above 0")),
            Ok(v) => Some(v),
            Err(e) => return Err(crate::exit::usage(e.to_string())),
        },
        None => None,
    };
    let opts = Options::new(args.ca.as_deref(), token(args.token.as_deref())?).map_err(usage)?;
    let progress = Arc::new(Progress::default());
    let show_bar = !args.quiet && !args.json && std::io::stderr().is_terminal();
    let stop = Arc::new(AtomicBool::new(false));
    let bar = show_bar.then(|| {
        let (p, s) = (Arc::clone(&progress), Arc::clone(&stop));
        std::thread::spawn(move || super::copy::progress_bar(&p, &s))
    });
    let samples = super::copy::Sampler::start(Arc::clone(&progress), t0);
    let auto_on = !(args.no_auto || args.parallel.is_some());
    let outcome = match &job {
        Job::Pull { url, dest } => {
            pull_file(url, dest, args, &opts, &progress, bwlimit, auto_on).map(Outcome::Pull)
        }
        Job::PullTree { url, dest } => {
            pull_tree(url, dest, args, &opts, &progress, bwlimit, auto_on).map(Outcome::PullTree)
        }
        Job::Push { source, url } => put::upload(
            &put::Request {
                source: source.clone(),
                url: url.clone(),
                bwlimit,
            },
            &opts,
            Arc::clone(&progress),
        )
        .map(Outcome::Push),
        Job::PushTree {
            root,
            url,
            contents,
        } => put::upload_tree(root, url, *contents, bwlimit, &opts, Arc::clone(&progress))
            .map(Outcome::Tree),
        Job::Tpc { source, dest, way } => tpc::copy(
            &tpc::Request {
                source: source.clone(),
                dest: dest.clone(),
                way: *way,
                streams: args.parallel.map_or(0, u32::from),
                verify: true,
            },
            &opts,
            Arc::clone(&progress),
        )
        .map(Outcome::Tpc),
    };
    stop.store(true, Ordering::SeqCst);
    if let Some(b) = bar {
        let _ = b.join();
    }
    let samples = samples.finish();
    let outcome = outcome.map_err(usage)?;
    let out = report(args, &job, &outcome, t0, bwlimit, &progress, &samples);
    if args.json {
        let mut stdout = std::io::stdout().lock();
        crate::cmd::common::json_pretty(&mut stdout, &out)?;
    } else if !args.quiet {
        summary(&out, &outcome);
    }
    if let Some(r) = rec {
        r.copy(&out)?;
    }
    if let Some(file) = &args.plot {
        super::plots::copy(&out, file)?;
    }
    Ok(())
}

/// Downloads one file (auto-tuned connections unless fixed).
fn pull_file(
    url: &Url,
    dest: &std::path::Path,
    args: &Args,
    opts: &Options,
    progress: &Arc<Progress>,
    bwlimit: Option<u64>,
    auto_on: bool,
) -> Result<get::Report, client::ClientError> {
    let quiet = args.quiet;
    let dest = dest.to_path_buf();
    let connections = args.parallel.map_or(DEFAULT_CONNECTIONS, u32::from);
    let req = get::Request {
        url: url.clone(),
        dest: dest.clone(),
        connections,
        max_connections: if auto_on {
            get::MAX_CONNECTIONS
        } else {
            connections
        },
        bwlimit,
    };
    get::Download::start(req, opts, Arc::clone(progress)).and_then(|mut d| {
        let rtt = d.rtt().unwrap_or(Duration::ZERO);
        let connections = if auto_on {
            start_connections(rtt)
        } else {
            connections
        };
        d.set_connections(connections);
        if d.resumed() > 0 && !quiet {
            eprintln!(
                "{}fatpipe: copy: resuming: {} of {} already here",
                super::copy::clear_line(),
                units::format_bytes(d.resumed()),
                units::format_bytes(d.stat().size.unwrap_or(0))
            );
        }
        let driver = Mutex::new(Driver::new(
            Adjuster::new(AdjustConfig::for_connections(
                connections,
                get::MAX_CONNECTIONS,
                rtt,
                bwlimit,
            )),
            fatpipe_tune::steer::Options {
                record_failed: true,
                forced_add: None,
            },
        ));
        let tune = |s: &mut dyn Steerable| {
            let mut d = driver.lock().unwrap_or_else(|e| e.into_inner());
            d.run(s, &mut |e| print_event(&e, quiet));
        };
        d.run(auto_on.then_some(&tune as &get::Tune<'_>))
    })
}

/// Downloads the tree under the collection `url` into `dest` (created):
/// the walk first (PROPFIND), then the collections made and the files
/// fetched one after the other. A file already at its place with the
/// listed size is left as it is, so a rerun after an interruption fetches
/// only what is missing (the file it stopped in resumes from its journal).
fn pull_tree(
    url: &Url,
    dest: &std::path::Path,
    args: &Args,
    opts: &Options,
    progress: &Arc<Progress>,
    bwlimit: Option<u64>,
    auto_on: bool,
) -> Result<put::TreeReport, client::ClientError> {
    let local = |p: &std::path::Path, e: std::io::Error| {
        client::ClientError::Failed(format!("{}: {e}", p.display()))
    };
    let entries = client::list::walk(url, opts)?;
    let mut out = put::TreeReport::default();
    std::fs::create_dir_all(dest).map_err(|e| local(dest, e))?;
    let place = |rel: &[Vec<u8>]| {
        let mut p = dest.to_path_buf();
        for seg in rel {
            p.push(std::ffi::OsStr::from_bytes(seg));
        }
        p
    };
    for e in entries.iter().filter(|e| e.dir) {
        let p = place(&e.rel);
        match std::fs::create_dir(&p) {
            Ok(()) => out.created += 1,
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists && p.is_dir() => {}
            Err(err) => return Err(local(&p, err)),
        }
    }
    for e in entries.iter().filter(|e| !e.dir) {
        let p = place(&e.rel);
        out.files += 1;
        let have = std::fs::symlink_metadata(&p).ok();
        if let (Some(m), Some(size)) = (&have, e.size) {
            if m.is_file() && m.len() == size {
                out.skipped.push(p.display().to_string());
                continue;
            }
        }
        let r = pull_file(&e.url, &p, args, opts, progress, bwlimit, auto_on)?;
        out.bytes += r.size;
        out.verified += u64::from(r.verified.is_some());
        if out.server.is_none() {
            out.server = r.server.clone();
        }
    }
    Ok(out)
}

enum Outcome {
    Pull(get::Report),
    PullTree(put::TreeReport),
    Push(put::Report),
    Tree(put::TreeReport),
    Tpc(tpc::Report),
}

/// Connections an auto-tuned download starts with: one per 10 ms of
/// round trip, 4 to 16. The server's window and congestion control are
/// its own, so a long path needs more connections from the start (each
/// one's slow start and, with loss, its window are what limit it); the
/// adjuster adds from there while adding helps.
fn start_connections(rtt: Duration) -> u32 {
    let per = (rtt.as_millis() / 10) as u32;
    per.clamp(DEFAULT_CONNECTIONS, 16)
}

fn print_event(e: &Event<'_>, quiet: bool) {
    if let Event::Changed(step) = e {
        if quiet {
            return;
        }
        if let Action::AddStreams { n } = step.decision.action {
            eprintln!(
                "{}auto: +{n} connections at {:.1} s: {}",
                super::copy::clear_line(),
                step.decision.at_secs,
                step.decision.reason
            );
        }
    }
}

fn report(
    args: &Args,
    job: &Job,
    outcome: &Outcome,
    t0: Instant,
    bwlimit: Option<u64>,
    progress: &Progress,
    samples: &[(f64, u64)],
) -> CopyReport {
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    let show = |p: &OsString| p.to_string_lossy().into_owned();
    let (direction, url) = match job {
        Job::Pull { url, .. } | Job::PullTree { url, .. } => (CopyDirection::Pull, url),
        Job::Push { url, .. } | Job::PushTree { url, .. } => (CopyDirection::Push, url),
        Job::Tpc { dest, way, source } => match way {
            tpc::Way::Pull => (CopyDirection::Pull, dest),
            tpc::Way::Push => (CopyDirection::Push, source),
        },
    };
    let (streams, chunk, checksum, total, moved, skipped_bytes, remote) = match outcome {
        Outcome::Pull(r) => (
            r.connections,
            r.block,
            r.verified.as_ref(),
            r.size,
            r.moved,
            r.resumed,
            r.server.clone(),
        ),
        Outcome::Push(r) => (
            1,
            r.size,
            r.verified.as_ref(),
            r.size,
            r.size,
            0,
            r.server.clone(),
        ),
        Outcome::Tree(r) | Outcome::PullTree(r) => (
            1,
            0,
            None,
            r.bytes,
            r.bytes - r.present_bytes.min(r.bytes),
            0,
            r.server.clone(),
        ),
        Outcome::Tpc(r) => (
            args.parallel.map_or(0, u32::from),
            0,
            r.verified.as_ref(),
            r.size,
            r.size,
            0,
            r.server.clone(),
        ),
    };
    let _ = skipped_bytes;
    let (files_total, files_verified, tree_checksum) = match outcome {
        Outcome::Tree(r) | Outcome::PullTree(r) => (
            r.files,
            r.verified,
            if r.verified == r.files && r.files > 0 {
                "adler32 (each file)".to_string()
            } else {
                format!("adler32 ({} of {} files)", r.verified, r.files)
            },
        ),
        _ => (1, u64::from(checksum.is_some()), String::new()),
    };
    let first = progress
        .first_at
        .get()
        .map(|i| i.saturating_duration_since(t0).as_secs_f64());
    let last = samples
        .last()
        .and_then(|&(_, total)| samples.iter().find(|s| s.1 >= total && total > 0))
        .map(|s| s.0);
    let ramp = first.and_then(|f| fatpipe_tune::ramp::measure(samples, f, 0.9, 1.0));
    let pull = matches!(direction, CopyDirection::Pull);
    CopyReport {
        schema: COPY_SCHEMA.into(),
        version: COPY_SCHEMA_VERSION,
        direction,
        server: url.authority(),
        export: url.path.clone(),
        sources: vec![show(&args.paths[0])],
        destination: show(&args.paths[1]),
        streams,
        chunk_size: chunk,
        checksum: match (checksum, outcome) {
            (_, Outcome::Tree(_) | Outcome::PullTree(_)) => tree_checksum,
            (Some((a, v)), _) => client::show_digest(*a, v),
            (None, _) => "none".into(),
        },
        sync: true,
        direct: false,
        bwlimit,
        files_total,
        files_verified,
        files_skipped: match outcome {
            Outcome::PullTree(r) => r.skipped.len() as u64,
            Outcome::Tree(r) => r.present,
            _ => 0,
        },
        files_failed: 0,
        bytes_total: total,
        bytes_transferred: moved,
        chunks_resent: 0,
        reconnects: 0,
        seconds: secs,
        rate: (moved as f64 * 8.0 / secs) as u64,
        files_per_sec: files_total as f64 / secs,
        io_local: match outcome {
            Outcome::Tpc(_) => "none (third-party copy)",
            _ if pull => "pwrite",
            _ => "read",
        }
        .into(),
        io_remote: format!(
            "http ({})",
            remote.unwrap_or_else(|| "server not named".into())
        ),
        peak_rss_local: super::copy::peak_rss(),
        failures: vec![],
        problems: vec![],
        skipped: match outcome {
            Outcome::Tree(r) => r
                .skipped
                .iter()
                .map(|s| fatpipe_schema::copy::CopyNote {
                    path: s.clone(),
                    detail: "not uploaded".into(),
                })
                .collect(),
            Outcome::PullTree(r) => r
                .skipped
                .iter()
                .map(|s| fatpipe_schema::copy::CopyNote {
                    path: s.clone(),
                    detail: "not fetched".into(),
                })
                .collect(),
            _ => vec![],
        },
        hard_links: vec![],
        notes_not_listed: 0,
        auto: None,
        timeline: Some(CopyTimeline {
            wall_secs: secs,
            first_byte_sent_at: first.filter(|_| !pull),
            first_byte_on_disk_at: first.filter(|_| pull),
            ramp_secs: ramp.and_then(|r| r.secs),
            final_rate: ramp.map(|r| r.final_rate as u64),
            last_byte_at: last,
            done_at: Some(secs),
            progress: super::copy::thin(samples, fatpipe_schema::copy::PROGRESS_SAMPLES_MAX),
            ..CopyTimeline::default()
        }),
        encryption: None,
    }
}

fn summary(r: &CopyReport, outcome: &Outcome) {
    let dur = Duration::from_secs_f64(r.seconds);
    let resumed = match outcome {
        Outcome::Pull(p) if p.resumed > 0 => {
            format!(" ({} were already here)", units::format_bytes(p.resumed))
        }
        _ => String::new(),
    };
    println!(
        "copied {} in {}: {}{resumed}",
        units::format_bytes(r.bytes_transferred),
        units::format_duration(dur),
        units::format_rate(r.rate as f64),
    );
    let verified = if r.checksum == "none" {
        "not verified: the server offers no checksum".to_string()
    } else {
        format!("verified against the server's {}", r.checksum)
    };
    match outcome {
        Outcome::Pull(p) => println!(
            "{verified}; {} connections, {} blocks{}; server: {}",
            r.streams,
            units::format_bytes_iec(r.chunk_size),
            if p.added.is_empty() {
                String::new()
            } else {
                format!(
                    ", {} added in flight",
                    p.added.iter().map(|a| a.1).sum::<u32>()
                )
            },
            escape(&r.io_remote)
        ),
        Outcome::Push(p) => println!(
            "{verified}; PUT -> {}; server: {}",
            p.status,
            escape(&r.io_remote)
        ),
        Outcome::PullTree(t) => println!(
            "{} files ({} fetched and verified against the server's checksum, {} already here); {} directories created; server: {}",
            t.files,
            t.verified,
            t.skipped.len(),
            t.created,
            escape(&r.io_remote)
        ),
        Outcome::Tpc(t) => println!(
            "{}; third-party copy (COPY -> {}, {} performance markers{}); server: {}",
            if r.checksum == "none" {
                "not verified: the ends offer no common checksum".to_string()
            } else {
                format!("verified: both ends have {}", r.checksum)
            },
            t.status,
            t.markers,
            if t.remote.is_empty() {
                String::new()
            } else {
                format!(", connections {}", t.remote.join(","))
            },
            escape(&r.io_remote)
        ),
        Outcome::Tree(t) => {
            println!(
                "{} files, {} verified against the server's adler32, {} there already; {} collections created; server: {}",
                t.files,
                t.verified,
                t.present,
                t.created,
                escape(&r.io_remote)
            );
            if !t.skipped.is_empty() {
                println!(
                    "left out (symlinks, special files): {}",
                    escape(&t.skipped.join(", "))
                );
            }
        }
    }
}
