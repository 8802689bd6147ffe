//! What several subcommands share: reading the server's address as the
//! user wrote it.
//!
//! `test`, `path`, `tune --for` and `copy` all dial the same server, so
//! they read `HOST[:PORT]` the same way and fail the same way (exit 2 for
//! text that is no host or a name that does not resolve). The port a
//! server listens on by default is the engine's
//! [`DEFAULT_PORT`](fatpipe_engine::server::DEFAULT_PORT), one for every
//! service.

use std::net::{SocketAddr, ToSocketAddrs};

/// Resolves `host`, `host:port`, `[v6]:port` or a bare IPv6 address;
/// `default_port` when the text names none.
pub(crate) fn resolve(host: &str, default_port: u16) -> anyhow::Result<SocketAddr> {
    let (name, port) = split_host(host, default_port)
        .ok_or_else(|| crate::exit::usage(format!("cannot read '{host}' as HOST[:PORT]")))?;
    (name.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| crate::exit::usage(format!("cannot resolve '{name}': {e}")))?
        .next()
        .ok_or_else(|| crate::exit::usage(format!("'{name}' has no address")))
}

/// Refuses `--encrypt` where it cannot work: without the pre-shared key
/// (nothing would authenticate the server) and over UDP (whose datagrams
/// the TLS streams do not carry). One line each, exit 2.
pub(crate) fn check_encrypt(encrypt: bool, has_key: bool, udp: bool) -> anyhow::Result<()> {
    if !encrypt {
        return Ok(());
    }
    if !has_key {
        return Err(crate::exit::usage(
            "--encrypt needs the pre-shared key (--key-file): without it nothing authenticates the server",
        ));
    }
    if udp {
        return Err(crate::exit::usage(
            "--encrypt covers TCP only: UDP datagrams would go unencrypted; drop -u or --encrypt",
        ));
    }
    Ok(())
}

/// Splits the host and port; `None` if the text is malformed.
fn split_host(host: &str, default_port: u16) -> Option<(String, u16)> {
    if let Some(rest) = host.strip_prefix('[') {
        let (ip, after) = rest.split_once(']')?;
        let port = match after {
            "" => default_port,
            p => p.strip_prefix(':')?.parse().ok()?,
        };
        return Some((ip.to_string(), port));
    }
    match host.matches(':').count() {
        0 => (!host.is_empty()).then(|| (host.to_string(), default_port)),
        1 => {
            let (h, p) = host.split_once(':')?;
            (!h.is_empty()).then_some(())?;
            Some((h.to_string(), p.parse().ok()?))
        }
        // A bare IPv6 address.
        _ => Some((host.to_string(), default_port)),
    }
}

/// Writes `v` as pretty JSON and a newline to `out` in one write. Stdout is
/// line-buffered, and serde's writer hands it a piece at a time: a report
/// of a 1,024-stream test was some 130,000 `write` calls.
pub(crate) fn json_pretty(
    out: &mut impl std::io::Write,
    v: &impl serde::Serialize,
) -> std::io::Result<()> {
    let mut buf = serde_json::to_vec_pretty(v).map_err(std::io::Error::other)?;
    buf.push(b'\n');
    out.write_all(&buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_forms() {
        assert_eq!(split_host("h", 5301), Some(("h".into(), 5301)));
        assert_eq!(split_host("h:80", 5301), Some(("h".into(), 80)));
        assert_eq!(split_host("[::1]:80", 5301), Some(("::1".into(), 80)));
        assert_eq!(split_host("[::1]", 5301), Some(("::1".into(), 5301)));
        assert_eq!(split_host("::1", 5301), Some(("::1".into(), 5301)));
        assert_eq!(split_host("h:x", 5301), None);
        assert_eq!(split_host("[::1]x", 5301), None);
        assert_eq!(split_host(":80", 5301), None);
        assert_eq!(resolve("127.0.0.1:9", 1).unwrap().port(), 9);
        assert_eq!(
            resolve("[::1]:7", 1).unwrap(),
            "[::1]:7".parse::<SocketAddr>().unwrap()
        );
    }

    #[test]
    fn copy_hosts_resolve_as_before() {
        // `copy` passes the host of HOST:EXPORT/PATH (brackets of an IPv6
        // address already removed) with its -p port.
        assert_eq!(
            resolve("127.0.0.1", 7).unwrap(),
            "127.0.0.1:7".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(
            resolve("::1", 7).unwrap(),
            "[::1]:7".parse::<SocketAddr>().unwrap()
        );
    }
}
