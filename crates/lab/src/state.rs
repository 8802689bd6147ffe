//! Where a running lab is written down: one directory per lab under
//! `/run/fatpipe-lab/NAME`, holding the lab's record (`lab.json`: name,
//! address index, link spec, owner), the forwarder's pid file, its control
//! socket and its log. `/run` is a tmpfs, so a reboot forgets every lab, as
//! it forgets the namespaces. Names and addresses are derived here too, so
//! every part of the crate agrees on them.
//!
//! Addresses: lab number `i` gets 198.18.0.0 + 4i, a /30 whose `.1` is end
//! `a` and `.2` end `b`, and 2001:2:0:i::/64 with `::1` and `::2`; both
//! ranges are reserved for benchmarking (RFC 2544, RFC 5180), so several
//! labs coexist and nothing leaks onto a real network.

use std::fs;
use std::io::Write;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::spec::LinkSpec;
use crate::{sys, End, Error};

/// The directory under which every lab keeps its state.
pub const RUN_DIR: &str = "/run/fatpipe-lab";

/// Every namespace this crate makes starts with this.
pub const NS_PREFIX: &str = "fp-";

/// How many labs can exist at once (the /30s in 198.18.0.0/15).
pub const MAX_LABS: u32 = 1 << 15;

/// What is written down about a lab when it comes up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabRecord {
    /// The lab's name.
    pub name: String,
    /// Which /30 and /64 it uses.
    pub index: u32,
    /// The link as brought up (later `set`s live in the forwarder).
    pub spec: LinkSpec,
    /// The lab removes itself when this process exits, if set.
    pub owner: Option<u32>,
}

impl LabRecord {
    /// The network namespace of one end.
    pub fn netns(&self, end: End) -> String {
        netns_name(&self.name, end)
    }

    /// The IPv4 address of one end.
    pub fn addr(&self, end: End) -> Ipv4Addr {
        let base = u32::from(Ipv4Addr::new(198, 18, 0, 0)) + 4 * self.index;
        Ipv4Addr::from(base + end.host())
    }

    /// The IPv6 address of one end.
    pub fn addr6(&self, end: End) -> Ipv6Addr {
        Ipv6Addr::new(0x2001, 2, 0, self.index as u16, 0, 0, 0, end.host() as u16)
    }
}

/// The namespace name of one end of lab `name`.
pub fn netns_name(name: &str, end: End) -> String {
    format!("{NS_PREFIX}{name}-{}", end.letter())
}

/// The TUN device's name inside an end's namespace.
pub fn tun_name(end: End) -> String {
    format!("lab-{}", end.letter())
}

/// Checks that `name` can be part of namespace and file names.
pub fn validate_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 11
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::BadName(name.to_string()))
    }
}

/// The state directory of lab `name`.
pub fn dir(name: &str) -> PathBuf {
    PathBuf::from(RUN_DIR).join(name)
}

/// The control socket of lab `name`.
pub fn socket_path(name: &str) -> PathBuf {
    dir(name).join("control.sock")
}

/// The forwarder's log of lab `name`.
pub fn log_path(name: &str) -> PathBuf {
    dir(name).join("forwarder.log")
}

/// Reads the record of lab `name`.
pub fn read_record(name: &str) -> Result<LabRecord, Error> {
    validate_name(name)?;
    let path = dir(name).join("lab.json");
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::NotFound(name.to_string()))
        }
        Err(e) => return Err(Error::io(format!("read {}", path.display()), e)),
    };
    serde_json::from_str(&text).map_err(|e| Error::Forwarder(format!("{}: {e}", path.display())))
}

/// Names of labs with a state directory.
pub fn names() -> Vec<String> {
    let Ok(rd) = fs::read_dir(RUN_DIR) else {
        return Vec::new();
    };
    let mut v: Vec<String> = rd
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| validate_name(n).is_ok())
        .collect();
    v.sort();
    v
}

/// Writes the forwarder's pid file.
pub fn write_pid(name: &str, pid: u32) -> Result<(), Error> {
    let path = dir(name).join("pid");
    fs::write(&path, format!("{pid}\n"))
        .map_err(|e| Error::io(format!("write {}", path.display()), e))
}

/// The pid of lab `name`'s forwarder if it is running. The pid file alone
/// is not trusted: the process must be alive and be our forwarder for this
/// lab, so a recycled pid is never signalled.
pub fn forwarder_pid(name: &str) -> Option<u32> {
    let text = fs::read_to_string(dir(name).join("pid")).ok()?;
    let pid: u32 = text.trim().parse().ok()?;
    let args = sys::cmdline(pid);
    let ours = args.windows(2).any(|w| w[0] == "run-link" && w[1] == name);
    (ours && sys::alive(pid)).then_some(pid)
}

/// Picks a free address index and writes the record of a new lab, under a
/// lock so that two `lab up`s at once never share a subnet.
pub fn create(name: &str, spec: &LinkSpec, owner: Option<u32>) -> Result<LabRecord, Error> {
    fs::create_dir_all(RUN_DIR).map_err(|e| Error::io(format!("create {RUN_DIR}"), e))?;
    let lock_path = PathBuf::from(RUN_DIR).join(".lock");
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| Error::io(format!("open {}", lock_path.display()), e))?;
    // Released when `lock` closes.
    if let Err(e) = fatpipe_sys::lock_exclusive(&lock, true) {
        return Err(Error::io("lock the lab directory", e));
    }
    let d = dir(name);
    if d.exists() {
        return Err(Error::Exists(name.to_string()));
    }
    let used: Vec<u32> = names()
        .iter()
        .filter_map(|n| read_record(n).ok())
        .map(|r| r.index)
        .collect();
    let index = (0..MAX_LABS)
        .find(|i| !used.contains(i))
        .ok_or_else(|| Error::Invalid(format!("at most {MAX_LABS} labs can be up at once")))?;
    let rec = LabRecord {
        name: name.to_string(),
        index,
        spec: spec.clone(),
        owner,
    };
    fs::create_dir_all(&d).map_err(|e| Error::io(format!("create {}", d.display()), e))?;
    let json = serde_json::to_string_pretty(&rec)
        .map_err(|e| Error::Invalid(format!("cannot store the link spec: {e}")))?;
    let path = d.join("lab.json");
    let mut f =
        fs::File::create(&path).map_err(|e| Error::io(format!("write {}", path.display()), e))?;
    f.write_all(json.as_bytes())
        .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
    Ok(rec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for ok in ["fp0", "demo", "t-1_x", "abcdefghijk"] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "UP", "a b", "../x", "abcdefghijkl", "a.b"] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn addresses_come_from_the_benchmarking_ranges() {
        let rec = |index| LabRecord {
            name: "t".into(),
            index,
            spec: LinkSpec::default(),
            owner: None,
        };
        assert_eq!(rec(0).addr(End::A), Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(rec(0).addr(End::B), Ipv4Addr::new(198, 18, 0, 2));
        assert_eq!(rec(65).addr(End::B), Ipv4Addr::new(198, 18, 1, 6));
        let last = rec(MAX_LABS - 1);
        assert_eq!(last.addr(End::B), Ipv4Addr::new(198, 19, 255, 254));
        assert_eq!(
            rec(3).addr6(End::A),
            "2001:2:0:3::1".parse::<Ipv6Addr>().expect("v6")
        );
        assert_eq!(rec(0).netns(End::B), "fp-t-b");
        assert_eq!(tun_name(End::A), "lab-a");
    }
}
