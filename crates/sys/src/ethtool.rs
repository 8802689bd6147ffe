//! NIC offloads and ring sizes through the `SIOCETHTOOL` ioctl.
//!
//! sysfs does not expose offloads or ring sizes, and the `ethtool` program
//! is often missing on minimal hosts, so the audit (`fatpipe tune`) asks the
//! kernel directly with the small fixed-layout legacy commands
//! (`ETHTOOL_GTSO`, `..GGRO`, `..GRINGPARAM`), which every kernel since 2.6
//! still answers. A driver that does not implement one answers with an
//! errno, returned as is; other platforms answer `Unsupported`.

use std::io;

use crate::platform;

/// The offloads the audit checks: the names `ethtool -k` prints and their
/// legacy `ETHTOOL_G*` command numbers.
pub const OFFLOADS: [(&str, u32); 6] = [
    ("tcp-segmentation-offload", 0x1e),
    ("generic-segmentation-offload", 0x23),
    ("generic-receive-offload", 0x2b),
    ("scatter-gather", 0x18),
    ("rx-checksumming", 0x14),
    ("tx-checksumming", 0x16),
];

/// A NIC's ring sizes (`ethtool -g`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingParams {
    /// Receive ring in use.
    pub rx: u32,
    /// Largest receive ring the NIC supports.
    pub rx_max: u32,
    /// Transmit ring in use.
    pub tx: u32,
    /// Largest transmit ring the NIC supports.
    pub tx_max: u32,
}

/// One offload flag (a command from [`OFFLOADS`]) of interface `ifname`.
pub fn offload(ifname: &str, cmd: u32) -> io::Result<bool> {
    platform::ethtool_value(ifname, cmd).map(|v| v != 0)
}

/// The ring sizes of interface `ifname`.
pub fn rings(ifname: &str) -> io::Result<RingParams> {
    let [rx, rx_max, tx, tx_max] = platform::ethtool_rings(ifname)?;
    Ok(RingParams {
        rx,
        rx_max,
        tx,
        tx_max,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_names_are_refused_not_sent() {
        for name in ["", "a-name-far-too-long-for-ifreq", "nul\0x"] {
            assert!(rings(name).is_err(), "{name:?}");
            assert!(offload(name, OFFLOADS[0].1).is_err(), "{name:?}");
        }
    }

    #[test]
    fn loopback_has_no_rings_but_says_why() {
        // lo implements no ring parameters: the answer must be an error,
        // not zeros.
        let e = rings("lo").expect_err("lo has no rings");
        assert!(
            e.raw_os_error().is_some() || e.kind() == io::ErrorKind::Unsupported,
            "{e}"
        );
    }
}
