//! HTTP third-party copy (HTTP-TPC), the active side: a WebDAV `COPY`
//! with `Source:` (pull: this server fetches the file from another
//! endpoint and writes it here) or `Destination:` (push: this server
//! sends one of its files to another endpoint), as FTS3, gfal2 and davix
//! ask for it (docs/http.md, "Third-party copy").
//!
//! The request's rules ([`parse`]): exactly one of `Source` and
//! `Destination` (http, https, dav or davs URLs); `Credential` absent or
//! `none` (anything else is 400 at once, so gfal2 falls back to
//! streaming); `Overwrite` T (default) or F (an existing destination is
//! 412); `RequireChecksumVerification` true (default: the source's
//! checksum must match the one computed while writing) or false;
//! `X-Number-Of-Streams` 0-100 (0 and 1: the server chooses; more is a
//! ceiling); every `TransferHeader<X>` forwarded as `<X>`; `SciTag` and
//! `ClientInfo` recorded in the server's log line for the copy.
//!
//! The answer is `202 Accepted`, a chunked `text/plain` body of
//! performance markers ([`markers`]) from the moment the copy starts,
//! then at least every 5 s, ending in `success: Created` or
//! `failure: <why>`. The copy itself runs on threads of its own
//! ([`active`]); which addresses it may reach is the server's
//! `--http-tpc-allow` ([`Policy`]: loopback and private addresses are
//! refused unless allowed), and how many run at once `--http-tpc-max`.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, StatusCode};

use crate::client::Url;
use crate::conn::Shared;
use crate::handler::{text, Resp};
use crate::path::Target;

pub mod active;
pub mod markers;
pub mod pool;
pub mod request;

/// The third-party copy's settings (server flags `--http-tpc-*`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Which addresses a copy may reach.
    pub policy: Policy,
    /// The most copies running at once (503 beyond).
    pub max_active: usize,
    /// Copies running now (shared by every connection).
    pub active: Arc<AtomicUsize>,
    /// A copy that moved no byte for this long fails.
    pub progress_timeout: Duration,
    /// A copy whose first byte did not arrive in this long fails.
    pub first_byte_timeout: Duration,
    /// Time between performance markers (at most 5 s).
    pub marker_period: Duration,
    /// The fewest connections a ranged pull opens (more on a long path:
    /// one per 10 ms of round trip, up to 16, within the client's
    /// `X-Number-Of-Streams` ceiling).
    pub streams: u32,
    /// The CA certificates (PEM) trusted for `https://` peers, instead of
    /// the Mozilla roots.
    pub ca: Option<PathBuf>,
    /// Pull from a fatpipe server over the copy protocol when it offers a
    /// ticket (`--http-tpc-leg`; docs/http.md, "The leg").
    pub leg: bool,
    /// The smallest file pulled over the leg (`--http-tpc-leg-min`).
    pub leg_min: u64,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            policy: Policy::default(),
            max_active: 16,
            active: Arc::new(AtomicUsize::new(0)),
            progress_timeout: Duration::from_secs(60),
            first_byte_timeout: Duration::from_secs(120),
            marker_period: Duration::from_secs(5),
            streams: 4,
            ca: None,
            leg: true,
            leg_min: 64 << 20,
        }
    }
}

/// The most connections one pull opens.
pub const MAX_STREAMS: u32 = 32;

/// Which addresses a copy may connect to: public ones always; loopback,
/// private, link-local and unique-local ones only when allowed, or inside
/// a listed network.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// 127.0.0.0/8, ::1 (and 0.0.0.0, ::).
    pub loopback: bool,
    /// 10/8, 172.16/12, 192.168/16, 100.64/10, 169.254/16, fc00::/7,
    /// fe80::/10.
    pub private: bool,
    /// Networks allowed whatever they are: (address, prefix length).
    pub nets: Vec<(IpAddr, u8)>,
}

impl Policy {
    /// Parses `--http-tpc-allow`: a comma list of `loopback`, `private`
    /// and CIDR networks (`10.1.0.0/16`, `2001:db8::/32`, or one address).
    pub fn parse(list: &str) -> Result<Policy, String> {
        let mut p = Policy::default();
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item.to_ascii_lowercase().as_str() {
                "loopback" => p.loopback = true,
                "private" => p.private = true,
                _ => {
                    let (a, len) = match item.split_once('/') {
                        Some((a, l)) => (a, Some(l)),
                        None => (item, None),
                    };
                    let addr: IpAddr = a.parse().map_err(|_| {
                        format!("'{item}': expected loopback, private or a network (10.0.0.0/8)")
                    })?;
                    let max = if addr.is_ipv4() { 32 } else { 128 };
                    let len = match len {
                        Some(l) => l
                            .parse::<u8>()
                            .ok()
                            .filter(|&l| l <= max)
                            .ok_or_else(|| format!("'{item}': a prefix length 0-{max}"))?,
                        None => max,
                    };
                    p.nets.push((addr, len));
                }
            }
        }
        Ok(p)
    }

    /// Whether a copy may connect to `ip`; the reason it may not.
    pub fn check(&self, ip: IpAddr) -> Result<(), &'static str> {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        if self.nets.iter().any(|(n, l)| within(ip, *n, *l)) {
            return Ok(());
        }
        let (loopback, private) = match ip {
            IpAddr::V4(a) => {
                let o = a.octets();
                (
                    a.is_loopback() || a.is_unspecified(),
                    a.is_private() || a.is_link_local() || (o[0] == 100 && (o[1] & 0xc0) == 64),
                )
            }
            IpAddr::V6(a) => {
                let s = a.segments();
                (
                    a.is_loopback() || a.is_unspecified(),
                    (s[0] & 0xfe00) == 0xfc00 || (s[0] & 0xffc0) == 0xfe80,
                )
            }
        };
        if loopback && !self.loopback {
            return Err("a loopback address (allowed with --http-tpc-allow loopback)");
        }
        if private && !self.private {
            return Err("a private address (allowed with --http-tpc-allow private or a network)");
        }
        Ok(())
    }
}

fn within(ip: IpAddr, net: IpAddr, len: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if len == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(len))
            };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(len))
            };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// Resolves a URL's host and checks every address against the policy:
/// the addresses, or the line to answer with.
pub fn resolve_allowed(url: &Url, policy: &Policy) -> Result<Vec<SocketAddr>, String> {
    let addrs: Vec<SocketAddr> = (url.host.as_str(), url.port)
        .to_socket_addrs()
        .map_err(|e| format!("{}: cannot resolve {}: {e}", url.display(), url.host))?
        .collect();
    if addrs.is_empty() {
        return Err(format!("{}: {} has no address", url.display(), url.host));
    }
    for a in &addrs {
        policy.check(a.ip()).map_err(|why| {
            format!(
                "{}: the server may not connect to {}: {why}",
                url.display(),
                a.ip()
            )
        })?;
    }
    Ok(addrs)
}

/// Which way the data goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// `Source:`: fetch from there, write here.
    Pull(Url),
    /// `Destination:`: send from here to there.
    Push(Url),
}

/// A `COPY` request's headers, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copy {
    /// Pull or push, and the other end.
    pub mode: Mode,
    /// `Overwrite` (default T).
    pub overwrite: bool,
    /// `RequireChecksumVerification` (default true).
    pub verify: bool,
    /// `X-Number-Of-Streams` (0-100; 0 when absent).
    pub streams: u32,
    /// `TransferHeader<X>: v` as `(<X>, v)`.
    pub forward: Vec<(HeaderName, HeaderValue)>,
    /// `SciTag` (65-65535).
    pub scitag: Option<u16>,
    /// `ClientInfo`, capped at [`MAX_CLIENT_INFO`] characters.
    pub client_info: Option<String>,
}

/// The longest `ClientInfo` kept.
pub const MAX_CLIENT_INFO: usize = 256;
/// The prefix of forwarded headers.
const TRANSFER_HEADER: &str = "transferheader";
/// Headers never forwarded: they describe the hop, not the request.
const NOT_FORWARDED: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "proxy-connection",
];

/// Checks a `COPY` request's headers (every rule of the module's list);
/// the line for a 400 otherwise.
pub fn parse(h: &HeaderMap) -> Result<Copy, String> {
    for v in h.get_all("credential") {
        if !v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"none") {
            let shown: String = String::from_utf8_lossy(v.as_bytes())
                .chars()
                .take(40)
                .collect();
            return Err(format!(
                "Credential: {shown} is not supported (only 'none'; give the other end's token as TransferHeaderAuthorization)"
            ));
        }
    }
    let one = |name: &str| -> Result<Option<String>, String> {
        let mut all = h.get_all(name).iter();
        let Some(v) = all.next() else {
            return Ok(None);
        };
        if all.next().is_some() {
            return Err(format!("more than one {name} header"));
        }
        let s = v
            .to_str()
            .map_err(|_| format!("{name}: not ASCII text"))?
            .trim();
        Ok(Some(s.to_string()))
    };
    let mode = match (one("source")?, one("destination")?) {
        (Some(_), Some(_)) => return Err(
            "both Source and Destination: a COPY pulls (Source) or pushes (Destination), not both"
                .into(),
        ),
        (None, None) => return Err(
            "COPY needs a Source (pull) or a Destination (push) header, an http(s) or dav(s) URL"
                .into(),
        ),
        (Some(s), None) => Mode::Pull(Url::parse(&s).map_err(|e| format!("Source: {e}"))?),
        (None, Some(d)) => Mode::Push(Url::parse(&d).map_err(|e| format!("Destination: {e}"))?),
    };
    let overwrite = match one("overwrite")?.as_deref() {
        None => true,
        Some(v) if v.eq_ignore_ascii_case("t") => true,
        Some(v) if v.eq_ignore_ascii_case("f") => false,
        Some(_) => return Err("Overwrite must be T or F".into()),
    };
    let verify = match one("requirechecksumverification")?.as_deref() {
        None => true,
        Some(v) if v.eq_ignore_ascii_case("true") => true,
        Some(v) if v.eq_ignore_ascii_case("false") => false,
        Some(_) => return Err("RequireChecksumVerification must be true or false".into()),
    };
    let streams = match one("x-number-of-streams")? {
        None => 0,
        Some(v) => v
            .parse::<u32>()
            .ok()
            .filter(|n| *n <= 100 && v.len() <= 3)
            .ok_or("X-Number-Of-Streams must be a number from 0 to 100")?,
    };
    let scitag = match one("scitag")? {
        None => None,
        Some(v) => Some(
            v.parse::<u16>()
                .ok()
                .filter(|n| *n >= 65)
                .ok_or("SciTag must be a number from 65 to 65535")?,
        ),
    };
    let client_info = one("clientinfo")?.map(|v| v.chars().take(MAX_CLIENT_INFO).collect());
    let mut forward = Vec::new();
    for (name, value) in h {
        let Some(rest) = name.as_str().strip_prefix(TRANSFER_HEADER) else {
            continue;
        };
        if rest.is_empty() || NOT_FORWARDED.contains(&rest) {
            continue;
        }
        let n = HeaderName::from_bytes(rest.as_bytes())
            .map_err(|_| format!("{}: not a header name", name.as_str()))?;
        forward.push((n, value.clone()));
    }
    Ok(Copy {
        mode,
        overwrite,
        verify,
        streams,
        forward,
        scitag,
        client_info,
    })
}

/// Serves a `COPY`.
pub(crate) async fn copy(sh: &std::rc::Rc<Shared>, t: &Target, req: Request<Incoming>) -> Resp {
    let c = match parse(req.headers()) {
        Ok(c) => c,
        Err(why) => return text(StatusCode::BAD_REQUEST, &why),
    };
    active::start(sh, t, req.headers(), c).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(list: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in list {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn the_headers_of_a_copy() {
        let c = parse(&headers(&[
            ("Source", "davs://a.example:8443/d/f"),
            ("Credential", "none"),
            ("Credential", "NONE"),
            ("X-Number-Of-Streams", "4"),
            ("TransferHeaderAuthorization", "Bearer abc"),
            ("TransferHeaderX-Thing", "1"),
            ("TransferHeaderHost", "evil"),
            ("RequireChecksumVerification", "false"),
            ("SciTag", "313"),
            ("ClientInfo", "job-id=1;file-id=2;retry=0"),
        ]))
        .unwrap();
        assert!(matches!(&c.mode, Mode::Pull(u) if u.tls && u.port == 8443));
        assert!(c.overwrite);
        assert!(!c.verify);
        assert_eq!(c.streams, 4);
        assert_eq!(c.scitag, Some(313));
        let names: Vec<&str> = c.forward.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, vec!["authorization", "x-thing"]);
        assert_eq!(c.forward[0].1, "Bearer abc");
        let c = parse(&headers(&[
            ("Destination", "http://h/x"),
            ("Overwrite", "F"),
        ]))
        .unwrap();
        assert!(matches!(c.mode, Mode::Push(_)));
        assert!(!c.overwrite && c.verify);
        assert_eq!(c.streams, 0);
    }

    #[test]
    fn what_a_copy_refuses() {
        for bad in [
            vec![("Source", "http://h/x"), ("Destination", "http://h/y")],
            vec![],
            vec![("Source", "file:///etc/passwd")],
            vec![("Source", "root://h//x")],
            vec![("Source", "http://h/x"), ("Credential", "gridsite")],
            vec![
                ("Source", "http://h/x"),
                ("Credential", "none"),
                ("Credential", "gridsite"),
            ],
            vec![("Source", "http://h/x"), ("Overwrite", "yes")],
            vec![("Source", "http://h/x"), ("X-Number-Of-Streams", "101")],
            vec![("Source", "http://h/x"), ("X-Number-Of-Streams", "-1")],
            vec![
                ("Source", "http://h/x"),
                ("RequireChecksumVerification", "1"),
            ],
            vec![("Source", "http://h/x"), ("SciTag", "64")],
        ] {
            assert!(parse(&headers(&bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_address_policy() {
        let none = Policy::default();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(none.check(ip("127.0.0.1")).is_err());
        assert!(none.check(ip("::1")).is_err());
        assert!(none.check(ip("::ffff:127.0.0.1")).is_err());
        assert!(none.check(ip("10.1.2.3")).is_err());
        assert!(none.check(ip("192.168.1.1")).is_err());
        assert!(none.check(ip("169.254.1.1")).is_err());
        assert!(none.check(ip("fd00::1")).is_err());
        assert!(none.check(ip("0.0.0.0")).is_err());
        assert!(none.check(ip("198.18.0.1")).is_ok());
        assert!(none.check(ip("2001:db8::1")).is_ok());
        let p = Policy::parse("loopback, 10.1.0.0/16,fd00::/8").unwrap();
        assert!(p.check(ip("127.0.0.1")).is_ok());
        assert!(p.check(ip("10.1.9.9")).is_ok());
        assert!(p.check(ip("10.2.0.1")).is_err());
        assert!(p.check(ip("fd12::1")).is_ok());
        let p = Policy::parse("private").unwrap();
        assert!(p.check(ip("172.16.0.1")).is_ok() && p.check(ip("127.0.0.1")).is_err());
        assert!(Policy::parse("10.0.0.0/33").is_err());
        assert!(Policy::parse("everything").is_err());
        assert_eq!(Policy::parse("0.0.0.0/0").unwrap().nets.len(), 1);
        assert!(Policy::parse("0.0.0.0/0")
            .unwrap()
            .check(ip("127.0.0.1"))
            .is_ok());
    }
}
