//! NIC offloads and ring sizes for the audit, from `fatpipe_sys::ethtool`
//! (the `SIOCETHTOOL` ioctl), as [`Probe`]s: a driver that does not answer
//! is unknown with the error.

use fatpipe_sys::ethtool::{self, OFFLOADS};

use crate::host::{Probe, Rings};

/// The NIC's offloads by the names `ethtool -k` uses.
pub fn offloads(ifname: &str) -> Probe<Vec<(String, bool)>> {
    let mut out = Vec::new();
    for (name, cmd) in OFFLOADS {
        match ethtool::offload(ifname, cmd) {
            Ok(on) => out.push((name.to_string(), on)),
            Err(e) => return Probe::Unknown(format!("ethtool ioctl on {ifname} ({name}): {e}")),
        }
    }
    Probe::Known(out)
}

/// The NIC's ring sizes.
pub fn rings(ifname: &str) -> Probe<Rings> {
    match ethtool::rings(ifname) {
        Ok(r) => Probe::Known(Rings {
            rx: r.rx,
            rx_max: r.rx_max,
            tx: r.tx,
            tx_max: r.tx_max,
        }),
        Err(e) => Probe::Unknown(format!("ethtool ioctl on {ifname} (ring parameters): {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_says_which_interface_and_why() {
        match rings("lo") {
            Probe::Unknown(why) => assert!(why.starts_with("ethtool ioctl on lo"), "{why}"),
            Probe::Known(r) => panic!("lo reported rings {r:?}"),
        }
        assert!(matches!(offloads(""), Probe::Unknown(_)));
    }
}
