//! The host's network limits, read from the kernel's tunables.
//!
//! Auto-tuning and `fatpipe tune` need to know what the host will let a
//! socket have before asking for it: the buffer caps, TCP's autotuning
//! ranges, which congestion controls are loaded and which qdisc new
//! interfaces get. Every field is read independently and is either a value
//! or an [`Unavailable`] saying which file could not be read and why, so one
//! unreadable tunable (a container without `/proc/sys/net`, a BSD) never
//! hides the others. Parsing is separate from reading and tested on strings.

use std::fs;
use std::path::Path;

use crate::platform;

/// Why a host limit could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} unavailable: {reason}")]
pub struct Unavailable {
    /// The tunable, e.g. `net/core/rmem_max`.
    pub what: String,
    /// What went wrong (file missing, unparsable, platform without it).
    pub reason: String,
}

/// A value read from the host, or why it could not be.
pub type Limit<T> = Result<T, Unavailable>;

/// The host's socket-buffer caps and TCP defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostLimits {
    /// `net.core.rmem_max`: the most `SO_RCVBUF` may ask for unprivileged.
    pub rmem_max: Limit<u64>,
    /// `net.core.wmem_max`: the most `SO_SNDBUF` may ask for unprivileged.
    pub wmem_max: Limit<u64>,
    /// `net.ipv4.tcp_rmem`: min, default, max of receive autotuning.
    pub tcp_rmem: Limit<[u64; 3]>,
    /// `net.ipv4.tcp_wmem`: min, default, max of send autotuning.
    pub tcp_wmem: Limit<[u64; 3]>,
    /// `net.ipv4.tcp_available_congestion_control`: algorithms loaded now.
    pub available_congestion: Limit<Vec<String>>,
    /// `net.ipv4.tcp_congestion_control`: the default algorithm.
    pub default_congestion: Limit<String>,
    /// `net.core.default_qdisc`: the qdisc new interfaces get (`fq` is the
    /// one pacing wants).
    pub default_qdisc: Limit<String>,
}

/// Reads the host limits of this machine (`/proc/sys` on Linux; every field
/// [`Unavailable`] on platforms without it).
pub fn host_limits() -> HostLimits {
    match platform::proc_sys_root() {
        Some(root) => host_limits_from(&root),
        None => {
            let none = |what: &str| Unavailable {
                what: what.to_string(),
                reason: "not readable on this platform".to_string(),
            };
            HostLimits {
                rmem_max: Err(none(RMEM_MAX)),
                wmem_max: Err(none(WMEM_MAX)),
                tcp_rmem: Err(none(TCP_RMEM)),
                tcp_wmem: Err(none(TCP_WMEM)),
                available_congestion: Err(none(CC_AVAILABLE)),
                default_congestion: Err(none(CC_DEFAULT)),
                default_qdisc: Err(none(QDISC)),
            }
        }
    }
}

const RMEM_MAX: &str = "net/core/rmem_max";
const WMEM_MAX: &str = "net/core/wmem_max";
const TCP_RMEM: &str = "net/ipv4/tcp_rmem";
const TCP_WMEM: &str = "net/ipv4/tcp_wmem";
const CC_AVAILABLE: &str = "net/ipv4/tcp_available_congestion_control";
const CC_DEFAULT: &str = "net/ipv4/tcp_congestion_control";
const QDISC: &str = "net/core/default_qdisc";

/// Reads the limits from a `/proc/sys`-shaped directory (tests point this
/// at a temporary tree).
fn host_limits_from(root: &Path) -> HostLimits {
    HostLimits {
        rmem_max: read(root, RMEM_MAX, parse_u64),
        wmem_max: read(root, WMEM_MAX, parse_u64),
        tcp_rmem: read(root, TCP_RMEM, parse_triple),
        tcp_wmem: read(root, TCP_WMEM, parse_triple),
        available_congestion: read(root, CC_AVAILABLE, |s| {
            Ok(s.split_whitespace().map(str::to_string).collect())
        }),
        default_congestion: read(root, CC_DEFAULT, parse_word),
        default_qdisc: read(root, QDISC, parse_word),
    }
}

fn read<T>(root: &Path, what: &str, parse: impl Fn(&str) -> Result<T, String>) -> Limit<T> {
    let fail = |reason: String| Unavailable {
        what: what.to_string(),
        reason,
    };
    let text = fs::read_to_string(root.join(what)).map_err(|e| fail(e.to_string()))?;
    parse(text.trim()).map_err(fail)
}

fn parse_u64(s: &str) -> Result<u64, String> {
    s.parse().map_err(|_| format!("not a number: {s:?}"))
}

fn parse_triple(s: &str) -> Result<[u64; 3], String> {
    let v: Vec<u64> = s
        .split_whitespace()
        .map(parse_u64)
        .collect::<Result<_, _>>()?;
    <[u64; 3]>::try_from(v).map_err(|_| format!("expected three numbers: {s:?}"))
}

fn parse_word(s: &str) -> Result<String, String> {
    match s.split_whitespace().next() {
        Some(w) => Ok(w.to_string()),
        None => Err("empty".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }

    #[test]
    fn parses_a_full_tree() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        write(r, RMEM_MAX, "212992\n");
        write(r, WMEM_MAX, "67108864\n");
        write(r, TCP_RMEM, "4096\t131072\t6291456\n");
        write(r, TCP_WMEM, "4096 16384 4194304\n");
        write(r, CC_AVAILABLE, "reno cubic bbr\n");
        write(r, CC_DEFAULT, "cubic\n");
        write(r, QDISC, "fq_codel\n");
        let h = host_limits_from(r);
        assert_eq!(h.rmem_max, Ok(212992));
        assert_eq!(h.wmem_max, Ok(64 << 20));
        assert_eq!(h.tcp_rmem, Ok([4096, 131072, 6291456]));
        assert_eq!(h.tcp_wmem, Ok([4096, 16384, 4194304]));
        assert_eq!(
            h.available_congestion,
            Ok(vec!["reno".into(), "cubic".into(), "bbr".into()])
        );
        assert_eq!(h.default_congestion, Ok("cubic".into()));
        assert_eq!(h.default_qdisc, Ok("fq_codel".into()));
    }

    #[test]
    fn missing_and_garbled_fields_say_why_without_hiding_others() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        write(r, RMEM_MAX, "lots\n");
        write(r, TCP_RMEM, "1 2\n");
        write(r, CC_DEFAULT, "bbr\n");
        let h = host_limits_from(r);
        let e = h.rmem_max.unwrap_err();
        assert_eq!(e.what, RMEM_MAX);
        assert!(e.reason.contains("not a number"), "{e}");
        assert!(h.tcp_rmem.unwrap_err().reason.contains("three"));
        assert!(h.wmem_max.is_err());
        assert_eq!(h.default_congestion, Ok("bbr".into()));
    }

    #[test]
    fn this_host_reports_something_consistent() {
        let h = host_limits();
        if platform::proc_sys_root().is_none() {
            assert!(h.rmem_max.is_err() && h.default_qdisc.is_err());
            return;
        }
        if let (Ok(avail), Ok(default)) = (&h.available_congestion, &h.default_congestion) {
            assert!(avail.contains(default), "{avail:?} lacks {default}");
        }
        if let Ok([min, def, max]) = h.tcp_rmem {
            assert!(min <= def && def <= max);
        }
    }
}
