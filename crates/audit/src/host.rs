//! Collectors: what this host's `/proc` and `/sys` say about its network
//! stack, NICs and CPUs, for the audit and for the planner's [`HostLimits`].
//!
//! Every value is a [`Probe`]: `Known(value)` or `Unknown(reason)`, and the
//! reason names the file and the error, so the audit can show "unknown: no
//! cpufreq in sysfs" instead of a guess. All paths hang off an injectable
//! root, so the tests build a fake tree in a temporary directory; only the
//! ethtool ioctls (offloads, ring sizes) need the live kernel and report
//! `Unknown` under a fake root.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use fatpipe_schema::tune::HostLimits;

use crate::ethtool;

/// A value read from the host, or why it could not be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe<T> {
    /// The value as read.
    Known(T),
    /// Why it could not be read, naming the file or call.
    Unknown(String),
}

impl<T> Probe<T> {
    /// The value, if known.
    pub fn known(&self) -> Option<&T> {
        match self {
            Probe::Known(v) => Some(v),
            Probe::Unknown(_) => None,
        }
    }

    /// Maps a known value.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Probe<U> {
        match self {
            Probe::Known(v) => Probe::Known(f(v)),
            Probe::Unknown(r) => Probe::Unknown(r),
        }
    }

    /// Maps a known value through a parser that may fail.
    pub fn and_then<U>(self, f: impl FnOnce(T) -> Probe<U>) -> Probe<U> {
        match self {
            Probe::Known(v) => f(v),
            Probe::Unknown(r) => Probe::Unknown(r),
        }
    }
}

/// The sysctls the audit reads and `--apply` may write (Linux names).
pub const SYSCTLS: [&str; 13] = [
    "net.core.rmem_max",
    "net.core.wmem_max",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
    "net.ipv4.tcp_congestion_control",
    "net.ipv4.tcp_available_congestion_control",
    "net.core.default_qdisc",
    "net.ipv4.tcp_window_scaling",
    "net.ipv4.tcp_timestamps",
    "net.ipv4.tcp_sack",
    "net.ipv4.tcp_mtu_probing",
    "net.core.netdev_max_backlog",
    "net.ipv4.tcp_allowed_congestion_control",
];

/// A view of one host's `/proc` and `/sys`.
#[derive(Debug, Clone)]
pub struct Host {
    root: PathBuf,
    live: bool,
}

/// Ring sizes of a NIC (descriptors), current and the hardware maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rings {
    /// Receive ring in use.
    pub rx: u32,
    /// Largest receive ring the NIC supports.
    pub rx_max: u32,
    /// Transmit ring in use.
    pub tx: u32,
    /// Largest transmit ring the NIC supports.
    pub tx_max: u32,
}

/// One interrupt line of a NIC and the CPUs it may run on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Irq {
    /// IRQ number.
    pub number: u32,
    /// `/proc/irq/N/smp_affinity_list`, e.g. "0-3".
    pub cpus: Probe<String>,
}

/// What the audit knows about one network interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nic {
    /// Interface name.
    pub name: String,
    /// Driver (from the device's `driver` link).
    pub driver: Probe<String>,
    /// MTU in bytes.
    pub mtu: Probe<u32>,
    /// Link speed in Mbit/s.
    pub speed_mbps: Probe<u64>,
    /// Offloads by name (tso, gso, gro, sg, rx-checksum, tx-checksum).
    pub offloads: Probe<Vec<(String, bool)>>,
    /// Ring sizes.
    pub rings: Probe<Rings>,
    /// NUMA node of the NIC's PCI device (-1: no NUMA information).
    pub numa_node: Probe<i32>,
    /// CPUs local to the NIC's device, e.g. "0-15".
    pub local_cpus: Probe<String>,
    /// The device's interrupts.
    pub irqs: Probe<Vec<Irq>>,
}

/// Everything the audit collects in one pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// Each of [`SYSCTLS`] with its whitespace-normalised value.
    pub sysctls: BTreeMap<String, Probe<String>>,
    /// Whether the kernel has the `fq` qdisc (built in or as a module).
    pub fq_available: Probe<bool>,
    /// Physical interfaces (those with a device), or the one asked for.
    pub nics: Vec<Nic>,
    /// Scaling governors: governor name → number of CPUs using it.
    pub governors: Probe<BTreeMap<String, u32>>,
    /// Number of NUMA nodes.
    pub numa_nodes: Probe<u32>,
}

impl Host {
    /// The running host: `/proc` and `/sys` at `/`, ioctls allowed.
    pub fn live() -> Self {
        Host {
            root: PathBuf::from("/"),
            live: true,
        }
    }

    /// A host tree under `root` (tests); ioctls report unknown.
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Host {
            root: root.into(),
            live: false,
        }
    }

    /// Path of a sysctl's file, e.g. `net.core.rmem_max` →
    /// `<root>/proc/sys/net/core/rmem_max`.
    pub fn sysctl_path(&self, key: &str) -> PathBuf {
        self.root.join("proc/sys").join(key.replace('.', "/"))
    }

    /// Reads a sysctl, whitespace normalised to single spaces.
    pub fn sysctl(&self, key: &str) -> Probe<String> {
        self.read(&self.sysctl_path(key)).map(|s| normalise(&s))
    }

    /// Reads a sysctl holding one unsigned integer.
    pub fn sysctl_u64(&self, key: &str) -> Probe<u64> {
        self.sysctl(key).and_then(|s| parse_u64(&s, key))
    }

    /// Reads a sysctl holding three integers (`tcp_rmem`, `tcp_wmem`).
    pub fn sysctl_triple(&self, key: &str) -> Probe<[u64; 3]> {
        self.sysctl(key).and_then(|s| parse_triple(&s, key))
    }

    /// The congestion controls a socket of this host may select: every
    /// loaded one (`tcp_available_congestion_control`) for a `privileged`
    /// process, else `tcp_allowed_congestion_control`. The kernel's check
    /// for a name outside the allowed list is `CAP_NET_ADMIN`, not uid 0,
    /// so `privileged` is [`is_privileged`] (root, or the capability alone,
    /// as contrib/systemd's server unit runs). `fatpipe_tune::host` is
    /// the one answer built on it that the planner and adjusters share.
    pub fn congestion(&self, privileged: bool) -> Probe<Vec<String>> {
        let key = if privileged {
            "net.ipv4.tcp_available_congestion_control"
        } else {
            "net.ipv4.tcp_allowed_congestion_control"
        };
        self.sysctl(key)
            .map(|s| s.split_whitespace().map(str::to_string).collect())
    }

    /// The planner's limits for this end. `privileged` is the caller's to
    /// say (the engine knows its capabilities); it also widens the
    /// congestion controls from the allowed to every available one
    /// ([`Host::congestion`]).
    pub fn limits(&self, privileged: bool) -> Result<HostLimits, String> {
        fn need<T>(p: Probe<T>) -> Result<T, String> {
            match p {
                Probe::Known(v) => Ok(v),
                Probe::Unknown(r) => Err(r),
            }
        }
        Ok(HostLimits {
            rmem_max: need(self.sysctl_u64("net.core.rmem_max"))?,
            wmem_max: need(self.sysctl_u64("net.core.wmem_max"))?,
            tcp_rmem: need(self.sysctl_triple("net.ipv4.tcp_rmem"))?,
            tcp_wmem: need(self.sysctl_triple("net.ipv4.tcp_wmem"))?,
            congestion: need(self.congestion(privileged))?,
            privileged,
        })
    }

    /// Collects everything the audit looks at. `only_nic` restricts the NICs
    /// to one interface; otherwise every interface with a device is taken.
    pub fn collect(&self, only_nic: Option<&str>) -> HostFacts {
        let sysctls = SYSCTLS
            .iter()
            .map(|k| (k.to_string(), self.sysctl(k)))
            .collect();
        HostFacts {
            sysctls,
            fq_available: self.fq_available(),
            nics: self.nics(only_nic),
            governors: self.governors(),
            numa_nodes: self.numa_nodes(),
        }
    }

    /// Whether the kernel has the `fq` qdisc: in use, loaded, or in the
    /// kernel's config (`/proc/config.gz`, `/boot/config-*`, modules list).
    pub fn fq_available(&self) -> Probe<bool> {
        if self
            .sysctl("net.core.default_qdisc")
            .known()
            .map(String::as_str)
            == Some("fq")
        {
            return Probe::Known(true);
        }
        if self.root.join("sys/module/sch_fq").exists() {
            return Probe::Known(true);
        }
        match self.kernel_config("CONFIG_NET_SCH_FQ") {
            Probe::Known(v) => Probe::Known(v == "y" || v == "m"),
            Probe::Unknown(why) => {
                if let Probe::Known(rel) = self.sysctl("kernel.osrelease") {
                    let dir = self.root.join("lib/modules").join(&rel);
                    let builtin = self.read(&dir.join("modules.builtin"));
                    if let Probe::Known(b) = &builtin {
                        if b.contains("/sch_fq.ko") {
                            return Probe::Known(true);
                        }
                    }
                    let module = dir.join("kernel/net/sched");
                    if let Ok(entries) = fs::read_dir(&module) {
                        let found = entries
                            .flatten()
                            .any(|e| e.file_name().to_string_lossy().starts_with("sch_fq.ko"));
                        return Probe::Known(found);
                    }
                }
                Probe::Unknown(format!("{why}; no module tree to look in either"))
            }
        }
    }

    /// A kernel config symbol's value ("y", "m", "n" for "is not set").
    pub fn kernel_config(&self, symbol: &str) -> Probe<String> {
        let text = match self.read_gzip(&self.root.join("proc/config.gz")) {
            Probe::Known(t) => t,
            Probe::Unknown(why_gz) => {
                let rel = self.sysctl("kernel.osrelease");
                let Probe::Known(rel) = rel else {
                    return Probe::Unknown(why_gz);
                };
                match self.read(&self.root.join("boot").join(format!("config-{rel}"))) {
                    Probe::Known(t) => t,
                    Probe::Unknown(why) => {
                        return Probe::Unknown(format!("no kernel config: {why_gz}; {why}"))
                    }
                }
            }
        };
        let set = format!("{symbol}=");
        let unset = format!("# {symbol} is not set");
        for line in text.lines() {
            if let Some(v) = line.strip_prefix(&set) {
                return Probe::Known(v.trim().to_string());
            }
            if line.trim() == unset {
                return Probe::Known("n".to_string());
            }
        }
        Probe::Known("n".to_string())
    }

    fn nics(&self, only: Option<&str>) -> Vec<Nic> {
        let class = self.root.join("sys/class/net");
        let mut names: Vec<String> = match only {
            Some(n) => vec![n.to_string()],
            None => fs::read_dir(&class)
                .map(|rd| {
                    rd.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .filter(|n| class.join(n).join("device").exists())
                        .collect()
                })
                .unwrap_or_default(),
        };
        names.sort();
        names.into_iter().map(|n| self.nic(&n)).collect()
    }

    fn nic(&self, name: &str) -> Nic {
        let dir = self.root.join("sys/class/net").join(name);
        let dev = dir.join("device");
        // Virtio and similar put the net device under a bus device; the PCI
        // function that owns the interrupts and NUMA node is its parent.
        let pci = fs::canonicalize(&dev).ok().and_then(|d| {
            [d.clone(), d.parent().map(Path::to_path_buf).unwrap_or(d)]
                .into_iter()
                .find(|c| c.join("numa_node").exists() || c.join("msi_irqs").exists())
        });
        let in_pci = |file: &str| match &pci {
            Some(p) => self.read(&p.join(file)).map(|s| s.trim().to_string()),
            None => Probe::Unknown(format!(
                "{}: no PCI device with {file} above it",
                dev.display()
            )),
        };
        let driver = fs::read_link(dev.join("driver"))
            .ok()
            .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
            .map_or_else(
                || Probe::Unknown(format!("{}: no driver link", dev.join("driver").display())),
                Probe::Known,
            );
        let irqs = match &pci {
            Some(p) => self.irqs(&p.join("msi_irqs")),
            None => Probe::Unknown(format!("{}: no PCI device above it", dev.display())),
        };
        let (offloads, rings) = if self.live {
            (ethtool::offloads(name), ethtool::rings(name))
        } else {
            let why = "ethtool ioctls query the live kernel only".to_string();
            (Probe::Unknown(why.clone()), Probe::Unknown(why))
        };
        Nic {
            name: name.to_string(),
            driver,
            mtu: self
                .read(&dir.join("mtu"))
                .and_then(|s| parse_u64(&s, "mtu"))
                .map(|v| v as u32),
            speed_mbps: self
                .read(&dir.join("speed"))
                .and_then(|s| match s.trim().parse::<i64>() {
                    Ok(v) if v > 0 => Probe::Known(v as u64),
                    _ => Probe::Unknown(format!(
                        "{}: driver reports '{}' (no link speed; virtual NIC or link down)",
                        dir.join("speed").display(),
                        s.trim()
                    )),
                }),
            offloads,
            rings,
            numa_node: in_pci("numa_node").and_then(|s| match s.parse::<i32>() {
                Ok(v) => Probe::Known(v),
                Err(_) => Probe::Unknown(format!("numa_node: not a number: '{s}'")),
            }),
            local_cpus: in_pci("local_cpulist"),
            irqs,
        }
    }

    fn irqs(&self, msi: &Path) -> Probe<Vec<Irq>> {
        let rd = match fs::read_dir(msi) {
            Ok(rd) => rd,
            Err(e) => return Probe::Unknown(format!("{}: {e}", msi.display())),
        };
        let mut numbers: Vec<u32> = rd
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
            .collect();
        numbers.sort_unstable();
        Probe::Known(
            numbers
                .into_iter()
                .map(|number| Irq {
                    number,
                    cpus: self
                        .read(
                            &self
                                .root
                                .join(format!("proc/irq/{number}/smp_affinity_list")),
                        )
                        .map(|s| s.trim().to_string()),
                })
                .collect(),
        )
    }

    fn governors(&self) -> Probe<BTreeMap<String, u32>> {
        let cpus = self.root.join("sys/devices/system/cpu");
        let rd = match fs::read_dir(&cpus) {
            Ok(rd) => rd,
            Err(e) => return Probe::Unknown(format!("{}: {e}", cpus.display())),
        };
        let mut counts = BTreeMap::new();
        let mut seen_cpu = false;
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let is_cpu = name
                .strip_prefix("cpu")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
            if !is_cpu {
                continue;
            }
            seen_cpu = true;
            if let Probe::Known(g) = self.read(&e.path().join("cpufreq/scaling_governor")) {
                *counts.entry(g.trim().to_string()).or_insert(0) += 1;
            }
        }
        if counts.is_empty() {
            let why = if seen_cpu {
                "no cpufreq/scaling_governor under /sys/devices/system/cpu/cpu*: \
                 no frequency-scaling driver (common in virtual machines)"
            } else {
                "no cpuN directories under /sys/devices/system/cpu"
            };
            return Probe::Unknown(why.to_string());
        }
        Probe::Known(counts)
    }

    fn numa_nodes(&self) -> Probe<u32> {
        let dir = self.root.join("sys/devices/system/node");
        match fs::read_dir(&dir) {
            Ok(rd) => Probe::Known(
                rd.flatten()
                    .filter(|e| {
                        let n = e.file_name().to_string_lossy().into_owned();
                        n.strip_prefix("node")
                            .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
                    })
                    .count() as u32,
            ),
            Err(e) => Probe::Unknown(format!("{}: {e}", dir.display())),
        }
    }

    fn read(&self, path: &Path) -> Probe<String> {
        match fs::read_to_string(path) {
            Ok(s) => Probe::Known(s),
            Err(e) => Probe::Unknown(format!("{}: {e}", path.display())),
        }
    }

    fn read_gzip(&self, path: &Path) -> Probe<String> {
        let file = match fs::File::open(path) {
            Ok(f) => f,
            Err(e) => return Probe::Unknown(format!("{}: {e}", path.display())),
        };
        let mut text = String::new();
        // The kernel config is ~200 KB; cap it so a strange file cannot eat memory.
        match flate2::read::GzDecoder::new(file)
            .take(16 << 20)
            .read_to_string(&mut text)
        {
            Ok(_) => Probe::Known(text),
            Err(e) => Probe::Unknown(format!("{}: {e}", path.display())),
        }
    }
}

/// True when this process may force buffers past the host caps and pick
/// any loaded congestion control: root, or CAP_NET_ADMIN alone (which is
/// how contrib/systemd's server unit runs, as its own user).
pub fn is_privileged() -> bool {
    fatpipe_sys::process::may_force_buffers()
}

/// Collapses runs of whitespace (tabs in `tcp_rmem`) to single spaces.
pub fn normalise(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn parse_u64(s: &str, what: &str) -> Probe<u64> {
    match s.trim().parse() {
        Ok(v) => Probe::Known(v),
        Err(_) => Probe::Unknown(format!("{what}: not a number: '{}'", s.trim())),
    }
}

fn parse_triple(s: &str, what: &str) -> Probe<[u64; 3]> {
    let v: Vec<u64> = s
        .split_whitespace()
        .filter_map(|t| t.parse().ok())
        .collect();
    match v.as_slice() {
        &[a, b, c] if s.split_whitespace().count() == 3 => Probe::Known([a, b, c]),
        _ => Probe::Unknown(format!(
            "{what}: expected three numbers, got '{}'",
            s.trim()
        )),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Writes `files` (path relative to root, content) under a temp dir.
    pub(crate) fn fake_tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("temp dir");
        for (path, content) in files {
            let p = dir.path().join(path);
            fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            fs::write(&p, content).expect("write");
        }
        dir
    }

    pub(crate) const TYPICAL: &[(&str, &str)] = &[
        ("proc/sys/net/core/rmem_max", "4194304\n"),
        ("proc/sys/net/core/wmem_max", "4194304\n"),
        ("proc/sys/net/ipv4/tcp_rmem", "4096\t131072\t33554432\n"),
        ("proc/sys/net/ipv4/tcp_wmem", "4096\t16384\t4194304\n"),
        ("proc/sys/net/ipv4/tcp_congestion_control", "cubic\n"),
        (
            "proc/sys/net/ipv4/tcp_available_congestion_control",
            "reno cubic bbr\n",
        ),
        (
            "proc/sys/net/ipv4/tcp_allowed_congestion_control",
            "reno cubic\n",
        ),
        ("proc/sys/net/core/default_qdisc", "pfifo_fast\n"),
        ("proc/sys/net/ipv4/tcp_window_scaling", "1\n"),
        ("proc/sys/net/ipv4/tcp_timestamps", "1\n"),
        ("proc/sys/net/ipv4/tcp_sack", "1\n"),
        ("proc/sys/net/ipv4/tcp_mtu_probing", "0\n"),
        ("proc/sys/net/core/netdev_max_backlog", "1000\n"),
        ("proc/sys/kernel/osrelease", "6.1.0-test\n"),
        (
            "boot/config-6.1.0-test",
            "CONFIG_X=y\n# CONFIG_NET_SCH_FQ is not set\n",
        ),
        ("sys/class/net/eth0/mtu", "1500\n"),
        ("sys/class/net/eth0/speed", "10000\n"),
        ("sys/class/net/eth0/device/numa_node", "1\n"),
        ("sys/class/net/eth0/device/local_cpulist", "8-15\n"),
        ("sys/class/net/eth0/device/msi_irqs/40", ""),
        ("sys/class/net/eth0/device/msi_irqs/41", ""),
        ("proc/irq/40/smp_affinity_list", "0-15\n"),
        ("proc/irq/41/smp_affinity_list", "9\n"),
        ("sys/class/net/lo/mtu", "65536\n"),
        (
            "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor",
            "powersave\n",
        ),
        (
            "sys/devices/system/cpu/cpu1/cpufreq/scaling_governor",
            "performance\n",
        ),
        (
            "sys/devices/system/cpu/cpu2/cpufreq/scaling_governor",
            "powersave\n",
        ),
        ("sys/devices/system/node/node0/meminfo", ""),
        ("sys/devices/system/node/node1/meminfo", ""),
    ];

    #[test]
    fn reads_a_fake_tree() {
        let dir = fake_tree(TYPICAL);
        let host = Host::at(dir.path());
        let f = host.collect(None);
        assert_eq!(
            f.sysctls["net.ipv4.tcp_rmem"],
            Probe::Known("4096 131072 33554432".to_string())
        );
        assert_eq!(f.fq_available, Probe::Known(false));
        assert_eq!(f.numa_nodes, Probe::Known(2));
        let gov = f.governors.known().cloned().unwrap_or_default();
        assert_eq!(gov.get("powersave"), Some(&2));
        assert_eq!(gov.get("performance"), Some(&1));
        // lo has no device: only eth0 is a NIC.
        assert_eq!(f.nics.len(), 1);
        let nic = &f.nics[0];
        assert_eq!(nic.mtu, Probe::Known(1500));
        assert_eq!(nic.speed_mbps, Probe::Known(10000));
        assert_eq!(nic.numa_node, Probe::Known(1));
        assert_eq!(nic.local_cpus, Probe::Known("8-15".to_string()));
        let irqs = nic.irqs.known().cloned().unwrap_or_default();
        assert_eq!(irqs.len(), 2);
        assert_eq!(irqs[1].cpus, Probe::Known("9".to_string()));
        assert!(matches!(nic.rings, Probe::Unknown(_)));
        assert!(matches!(nic.driver, Probe::Unknown(_)));
    }

    #[test]
    fn limits_for_the_planner() {
        let dir = fake_tree(TYPICAL);
        let host = Host::at(dir.path());
        let l = host.limits(false).expect("limits");
        assert_eq!(l.rmem_max, 4194304);
        assert_eq!(l.tcp_rmem, [4096, 131072, 33554432]);
        assert_eq!(l.congestion, ["reno", "cubic"]);
        let l = host.limits(true).expect("limits");
        assert_eq!(l.congestion, ["reno", "cubic", "bbr"]);
    }

    #[test]
    fn unreadable_values_say_why() {
        let dir = fake_tree(&[
            ("proc/sys/net/core/rmem_max", "lots\n"),
            ("proc/sys/net/ipv4/tcp_rmem", "4096 131072\n"),
            ("sys/class/net/eth0/speed", "-1\n"),
            ("sys/class/net/eth0/device/uevent", ""),
            ("sys/devices/system/cpu/cpu0/online", "1\n"),
        ]);
        let host = Host::at(dir.path());
        let Probe::Unknown(why) = host.sysctl_u64("net.core.rmem_max") else {
            panic!("rmem_max should be unknown");
        };
        assert!(why.contains("not a number: 'lots'"), "{why}");
        let Probe::Unknown(why) = host.sysctl_triple("net.ipv4.tcp_rmem") else {
            panic!("tcp_rmem should be unknown");
        };
        assert!(why.contains("three numbers"), "{why}");
        let Probe::Unknown(why) = host.sysctl("net.core.wmem_max") else {
            panic!("wmem_max should be unknown");
        };
        assert!(
            why.contains("wmem_max") && why.contains("No such file"),
            "{why}"
        );
        let f = host.collect(None);
        assert!(matches!(&f.nics[0].speed_mbps, Probe::Unknown(w) if w.contains("'-1'")));
        assert!(matches!(&f.governors, Probe::Unknown(w) if w.contains("no cpufreq")));
        assert!(matches!(&f.fq_available, Probe::Unknown(_)));
        assert!(host.limits(false).is_err());
    }

    #[test]
    fn fq_from_modules_or_config() {
        let dir = fake_tree(&[("sys/module/sch_fq/refcnt", "0\n")]);
        assert_eq!(Host::at(dir.path()).fq_available(), Probe::Known(true));
        let dir = fake_tree(&[
            ("proc/sys/kernel/osrelease", "6.1\n"),
            ("boot/config-6.1", "CONFIG_NET_SCH_FQ=m\n"),
        ]);
        assert_eq!(Host::at(dir.path()).fq_available(), Probe::Known(true));
        let dir = fake_tree(&[
            ("proc/sys/kernel/osrelease", "6.1\n"),
            ("lib/modules/6.1/kernel/net/sched/sch_fq.ko.xz", ""),
        ]);
        assert_eq!(Host::at(dir.path()).fq_available(), Probe::Known(true));
    }
}
