//! sysctl.conf snippets for Linux, FreeBSD and macOS (`tune --emit OS`).
//!
//! Linux renders the same [`Setting`] list `--apply` writes, so what a user
//! reads is exactly what would be applied; settings this host cannot take
//! appear commented out with the reason. FreeBSD and macOS have no collector
//! (fatpipe runs its audit on Linux), so their snippets follow from the
//! target alone, with the same 2 × BDP buffer rule.

use crate::rules::{buffer_max, Setting, Target};

/// Operating systems with a snippet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Os {
    /// `/etc/sysctl.d/*.conf`.
    Linux,
    /// `/etc/sysctl.conf` plus a loader.conf line for H-TCP.
    FreeBsd,
    /// `/etc/sysctl.conf`.
    MacOs,
}

impl std::str::FromStr for Os {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "linux" => Ok(Os::Linux),
            "freebsd" => Ok(Os::FreeBsd),
            "macos" | "darwin" | "osx" => Ok(Os::MacOs),
            _ => Err(format!("unknown OS '{s}': use linux, freebsd or macos")),
        }
    }
}

/// The Linux snippet for `settings` (see [`crate::rules::linux_settings`]).
pub fn linux(target: &Target, settings: &[Setting]) -> String {
    let mut s = header(
        target,
        "Linux",
        "Save as /etc/sysctl.d/90-fatpipe.conf; load with: sysctl --system",
    );
    for set in settings {
        s.push_str(&format!("# {}\n", set.why));
        match &set.skip {
            None => s.push_str(&format!("{} = {}\n", set.key, set.value)),
            Some(why) => s.push_str(&format!(
                "# {} = {}    (left out: {why})\n",
                set.key, set.value
            )),
        }
    }
    s
}

/// The FreeBSD snippet for a target.
pub fn freebsd(target: &Target) -> String {
    let max = buffer_max(target);
    let mut s = header(
        target,
        "FreeBSD",
        "Add to /etc/sysctl.conf; for H-TCP also add cc_htcp_load=\"YES\" to /boot/loader.conf",
    );
    s.push_str(&format!(
        "# Largest socket buffer; it counts mbuf overhead too, so twice the buffer max\n\
         kern.ipc.maxsockbuf = {}\n\
         # Autotuning limits: 2 x BDP, so one stream's window can cover the path\n\
         net.inet.tcp.sendbuf_max = {max}\n\
         net.inet.tcp.recvbuf_max = {max}\n\
         net.inet.tcp.sendbuf_auto = 1\n\
         net.inet.tcp.recvbuf_auto = 1\n\
         # H-TCP grows back quickly after a loss on long paths\n\
         net.inet.tcp.cc.algorithm = htcp\n\
         # Window scaling and timestamps (RFC 1323), SACK\n\
         net.inet.tcp.rfc1323 = 1\n\
         net.inet.tcp.sack.enable = 1\n",
        max.saturating_mul(2)
    ));
    s
}

/// The macOS snippet for a target.
pub fn macos(target: &Target) -> String {
    let max = buffer_max(target);
    let mut s = header(
        target,
        "macOS",
        "Add to /etc/sysctl.conf (or apply with sudo sysctl -w); macOS refuses a \
         maxsockbuf its mbuf pool cannot back: lower it if sysctl says so",
    );
    s.push_str(&format!(
        "# Largest socket buffer: 2 x BDP, so one stream's window can cover the path\n\
         kern.ipc.maxsockbuf = {max}\n\
         # Autotuning limits, as large\n\
         net.inet.tcp.autorcvbufmax = {max}\n\
         net.inet.tcp.autosndbufmax = {max}\n\
         # Starting buffers; autotuning grows them\n\
         net.inet.tcp.sendspace = {start}\n\
         net.inet.tcp.recvspace = {start}\n\
         # Window scaling and timestamps (RFC 1323), SACK\n\
         net.inet.tcp.rfc1323 = 1\n\
         net.inet.tcp.sack = 1\n",
        start = (max / 2).min(4 << 20)
    ));
    s
}

fn header(target: &Target, os: &str, how: &str) -> String {
    format!(
        "# fatpipe tune: {os} settings for {}\n# {how}\n",
        target.describe()
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::host::tests::{fake_tree, TYPICAL};
    use crate::host::Host;
    use crate::rules::linux_settings;

    fn t() -> Target {
        Target {
            rate: 10_000_000_000,
            rtt: Duration::from_millis(100),
        }
    }

    #[test]
    fn linux_text() {
        let dir = fake_tree(TYPICAL);
        let facts = Host::at(dir.path()).collect(None);
        let want = "\
# fatpipe tune: Linux settings for 10.0 Gbit/s × 100.0 ms (BDP 125 MB)
# Save as /etc/sysctl.d/90-fatpipe.conf; load with: sysctl --system
# cap on SO_RCVBUF: 2 x BDP, so one stream's window can cover the path
net.core.rmem_max = 268435456
# cap on SO_SNDBUF: 2 x BDP, as for receiving
net.core.wmem_max = 268435456
# receive autotuning (min default max): the max lets autotuning reach the BDP
net.ipv4.tcp_rmem = 4096 131072 268435456
# send autotuning (min default max), as for receiving
net.ipv4.tcp_wmem = 4096 16384 268435456
# BBR keeps its rate under random loss, where CUBIC falls to a few percent
net.ipv4.tcp_congestion_control = bbr
# fq paces each flow (SO_MAX_PACING_RATE) without bursts
# net.core.default_qdisc = fq    (left out: this kernel has no fq qdisc; TCP paces internally (BBR, SO_MAX_PACING_RATE) without it)
# without window scaling a window stops at 64 KiB
net.ipv4.tcp_window_scaling = 1
# timestamps give RTT samples every ACK and guard sequence wrap at high rates
net.ipv4.tcp_timestamps = 1
# SACK recovers several losses per round trip instead of one
net.ipv4.tcp_sack = 1
# probe the path MTU when ICMP is blocked (black holes with jumbo frames)
net.ipv4.tcp_mtu_probing = 1
# packets queued per CPU before the kernel drops them, at 10 Gbit/s and up
net.core.netdev_max_backlog = 30000
";
        assert_eq!(linux(&t(), &linux_settings(&t(), &facts)), want);
    }

    #[test]
    fn freebsd_text() {
        let want = "\
# fatpipe tune: FreeBSD settings for 10.0 Gbit/s × 100.0 ms (BDP 125 MB)
# Add to /etc/sysctl.conf; for H-TCP also add cc_htcp_load=\"YES\" to /boot/loader.conf
# Largest socket buffer; it counts mbuf overhead too, so twice the buffer max
kern.ipc.maxsockbuf = 536870912
# Autotuning limits: 2 x BDP, so one stream's window can cover the path
net.inet.tcp.sendbuf_max = 268435456
net.inet.tcp.recvbuf_max = 268435456
net.inet.tcp.sendbuf_auto = 1
net.inet.tcp.recvbuf_auto = 1
# H-TCP grows back quickly after a loss on long paths
net.inet.tcp.cc.algorithm = htcp
# Window scaling and timestamps (RFC 1323), SACK
net.inet.tcp.rfc1323 = 1
net.inet.tcp.sack.enable = 1
";
        assert_eq!(freebsd(&t()), want);
    }

    #[test]
    fn macos_text() {
        let want = "\
# fatpipe tune: macOS settings for 10.0 Gbit/s × 100.0 ms (BDP 125 MB)
# Add to /etc/sysctl.conf (or apply with sudo sysctl -w); macOS refuses a maxsockbuf its mbuf pool cannot back: lower it if sysctl says so
# Largest socket buffer: 2 x BDP, so one stream's window can cover the path
kern.ipc.maxsockbuf = 268435456
# Autotuning limits, as large
net.inet.tcp.autorcvbufmax = 268435456
net.inet.tcp.autosndbufmax = 268435456
# Starting buffers; autotuning grows them
net.inet.tcp.sendspace = 4194304
net.inet.tcp.recvspace = 4194304
# Window scaling and timestamps (RFC 1323), SACK
net.inet.tcp.rfc1323 = 1
net.inet.tcp.sack = 1
";
        assert_eq!(macos(&t()), want);
    }

    #[test]
    fn os_names() {
        assert_eq!("Linux".parse::<Os>(), Ok(Os::Linux));
        assert_eq!("freebsd".parse::<Os>(), Ok(Os::FreeBsd));
        assert_eq!("darwin".parse::<Os>(), Ok(Os::MacOs));
        assert!("windows".parse::<Os>().is_err());
    }
}
