//! NIC offloads and ring sizes through the `SIOCETHTOOL` ioctl.
//!
//! sysfs does not expose offloads or ring sizes, and the `ethtool` program
//! is often missing on minimal hosts, so the audit asks the kernel directly
//! with the small fixed-layout legacy commands (`ETHTOOL_GTSO`, `..GGRO`,
//! `..GRINGPARAM`), which every kernel since 2.6 still answers. A NIC whose
//! driver does not implement one reports it as unknown with the errno.
//!
//! This is the only `unsafe` in the crate. It belongs in `fatpipe-sys` (the
//! system-call layer) and moves there once that crate has an ethtool module.

use crate::host::{Probe, Rings};

/// The NIC's offloads by the names `ethtool -k` uses.
pub fn offloads(ifname: &str) -> Probe<Vec<(String, bool)>> {
    const COMMANDS: [(&str, u32); 6] = [
        ("tcp-segmentation-offload", 0x1e),
        ("generic-segmentation-offload", 0x23),
        ("generic-receive-offload", 0x2b),
        ("scatter-gather", 0x18),
        ("rx-checksumming", 0x14),
        ("tx-checksumming", 0x16),
    ];
    let mut out = Vec::new();
    for (name, cmd) in COMMANDS {
        match imp::get_value(ifname, cmd) {
            Ok(v) => out.push((name.to_string(), v != 0)),
            Err(e) => return Probe::Unknown(format!("ethtool ioctl on {ifname} ({name}): {e}")),
        }
    }
    Probe::Known(out)
}

/// The NIC's ring sizes.
pub fn rings(ifname: &str) -> Probe<Rings> {
    match imp::get_rings(ifname) {
        Ok(r) => Probe::Known(r),
        Err(e) => Probe::Unknown(format!("ethtool ioctl on {ifname} (ring parameters): {e}")),
    }
}

#[cfg(target_os = "linux")]
mod imp {
    use std::io;

    use crate::host::Rings;

    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    const ETHTOOL_GRINGPARAM: u32 = 0x10;

    /// `struct ifreq` with the `ifr_data` member of its union; padded to the
    /// kernel's 40 bytes.
    #[repr(C)]
    struct IfReq {
        name: [libc::c_char; libc::IFNAMSIZ],
        data: *mut libc::c_void,
        _pad: [u8; 16],
    }

    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }

    #[repr(C)]
    #[derive(Default)]
    struct EthtoolRingParam {
        cmd: u32,
        rx_max_pending: u32,
        rx_mini_max_pending: u32,
        rx_jumbo_max_pending: u32,
        tx_max_pending: u32,
        rx_pending: u32,
        rx_mini_pending: u32,
        rx_jumbo_pending: u32,
        tx_pending: u32,
    }

    pub fn get_value(ifname: &str, cmd: u32) -> io::Result<u32> {
        let mut v = EthtoolValue { cmd, data: 0 };
        ioctl(ifname, (&mut v as *mut EthtoolValue).cast())?;
        Ok(v.data)
    }

    pub fn get_rings(ifname: &str) -> io::Result<Rings> {
        let mut r = EthtoolRingParam {
            cmd: ETHTOOL_GRINGPARAM,
            ..Default::default()
        };
        ioctl(ifname, (&mut r as *mut EthtoolRingParam).cast())?;
        Ok(Rings {
            rx: r.rx_pending,
            rx_max: r.rx_max_pending,
            tx: r.tx_pending,
            tx_max: r.tx_max_pending,
        })
    }

    fn ioctl(ifname: &str, data: *mut libc::c_void) -> io::Result<()> {
        let bytes = ifname.as_bytes();
        if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a valid interface name",
            ));
        }
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            data,
            _pad: [0; 16],
        };
        for (d, s) in req.name.iter_mut().zip(bytes) {
            *d = *s as libc::c_char;
        }
        // SAFETY: plain socket(2); the descriptor is closed below.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `req` is a valid ifreq whose data points at a live ethtool
        // command struct of the layout the command number names; both
        // outlive the call.
        let rc = unsafe { libc::ioctl(fd, SIOCETHTOOL as _, &mut req as *mut IfReq) };
        let err = io::Error::last_os_error();
        // SAFETY: fd is ours and closed once.
        unsafe { libc::close(fd) };
        if rc < 0 {
            return Err(err);
        }
        Ok(())
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::io;

    use crate::host::Rings;

    fn unsupported() -> io::Error {
        io::Error::new(io::ErrorKind::Unsupported, "ethtool is Linux only")
    }

    pub fn get_value(_ifname: &str, _cmd: u32) -> io::Result<u32> {
        Err(unsupported())
    }

    pub fn get_rings(_ifname: &str) -> io::Result<Rings> {
        Err(unsupported())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_names_are_refused_not_sent() {
        for name in ["", "a-name-far-too-long-for-ifreq", "nul\0x"] {
            assert!(matches!(rings(name), Probe::Unknown(_)), "{name:?}");
        }
    }

    #[test]
    fn loopback_has_no_rings_but_says_why() {
        // lo implements no ring parameters: the answer must be an errno, not
        // zeros.
        match rings("lo") {
            Probe::Unknown(why) => assert!(why.contains("lo"), "{why}"),
            Probe::Known(r) => panic!("lo reported rings {r:?}"),
        }
    }
}
