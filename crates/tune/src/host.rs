//! Which congestion controls this host may use: one answer, aware of
//! capabilities, for every policy that picks or switches one (the
//! planner through `HostLimits`, the in-flight adjusters' switchable
//! lists).
//!
//! The kernel lets a socket select a loaded congestion control outside
//! `net.ipv4.tcp_allowed_congestion_control` only with `CAP_NET_ADMIN`.
//! The shipped systemd unit runs the server as its own user with that
//! capability alone, so "root" is the wrong test: a root-only answer
//! offers the adjuster the allowed list while the planner, asking by
//! capability, may already have chosen BBR outside it. Both ask here.

use fatpipe_audit::host::{is_privileged, Host};

/// Congestion controls a socket of this process may select on this host;
/// empty if the host does not say.
pub fn congestion_allowed() -> Vec<String> {
    congestion_allowed_on(&Host::live(), is_privileged())
}

/// As [`congestion_allowed`], for `host` and a process that is
/// `privileged` (root or `CAP_NET_ADMIN`) or not.
pub fn congestion_allowed_on(host: &Host, privileged: bool) -> Vec<String> {
    host.congestion(privileged)
        .known()
        .cloned()
        .unwrap_or_default()
}

/// Where this host's send-buffer autotuning stops (`net.ipv4.tcp_wmem[2]`,
/// read in this process's network namespace); `None` if the host does not
/// say.
pub fn send_autotune_max() -> Option<u64> {
    Host::live()
        .sysctl_triple("net.ipv4.tcp_wmem")
        .known()
        .map(|t| t[2])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host whose kernel has loaded bbr but allows only reno and cubic
    /// to unprivileged sockets (Debian's defaults with tcp_bbr loaded).
    fn host(dir: &std::path::Path) -> Host {
        let sys = dir.join("proc/sys/net/ipv4");
        std::fs::create_dir_all(&sys).unwrap();
        std::fs::write(
            sys.join("tcp_available_congestion_control"),
            "reno cubic bbr\n",
        )
        .unwrap();
        std::fs::write(sys.join("tcp_allowed_congestion_control"), "reno cubic\n").unwrap();
        std::fs::write(sys.join("tcp_rmem"), "4096 131072 6291456\n").unwrap();
        std::fs::write(sys.join("tcp_wmem"), "4096 16384 4194304\n").unwrap();
        let core = dir.join("proc/sys/net/core");
        std::fs::create_dir_all(&core).unwrap();
        std::fs::write(core.join("rmem_max"), "212992\n").unwrap();
        std::fs::write(core.join("wmem_max"), "212992\n").unwrap();
        Host::at(dir)
    }

    #[test]
    fn the_planner_and_the_adjusters_get_one_answer_by_capability() {
        let dir = tempfile::tempdir().unwrap();
        let h = host(dir.path());
        // Privileged (root, or CAP_NET_ADMIN without root): every loaded one.
        assert_eq!(congestion_allowed_on(&h, true), ["reno", "cubic", "bbr"]);
        assert_eq!(congestion_allowed_on(&h, false), ["reno", "cubic"]);
        // The planner's limits say the same for the same process.
        for privileged in [true, false] {
            assert_eq!(
                h.limits(privileged).expect("limits").congestion,
                congestion_allowed_on(&h, privileged),
                "privileged: {privileged}"
            );
        }
    }

    #[test]
    fn a_host_that_does_not_say_allows_nothing_named() {
        let dir = tempfile::tempdir().unwrap();
        assert!(congestion_allowed_on(&Host::at(dir.path()), true).is_empty());
    }
}
