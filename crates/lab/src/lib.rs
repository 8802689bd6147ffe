//! fatpipe-lab: a long-fat-network emulator on one machine.
//!
//! `fatpipe lab up` joins two network namespaces, `a` and `b`, through a
//! user-space link with a bottleneck rate, a drop-tail queue, propagation
//! delay, jitter, random and bursty loss, bit errors and down-time. It needs
//! no netem: a forwarder process moves packets between a TUN device in each
//! namespace. The kernels hand it TCP super-packets of up to 64 KB (virtio
//! headers with TSO offloads), and on Linux 6.2+ UDP GSO super-packets of
//! up to 64 datagrams, which is how it reaches multi-gigabit rates, while
//! every decision (loss, queue drop, timing) is still made per MTU-sized
//! segment or datagram; a super-packet is cut only when part of it is lost.
//!
//! The crate is layered so most of it is pure and tested on a virtual clock:
//!
//! * [`model`]: the link as stages over one trait, fed segments and `now`.
//! * [`packet`]: virtio-net headers, cutting super-packets, checksums.
//! * [`ring`] and [`pipe`]: the backlog of one direction and the per-frame
//!   logic around the model, still without I/O.
//! * [`spec`]: what users type (`--rtt 93ms --rate 1gbit --queue 1bdp`).
//! * `forward`, `sys`, `lab`, `state`, [`control`]: the thin driver
//!   (threads, TUN devices, namespaces, the control socket).
//!
//! # Using it from Rust (what `fatpipe demo` does)
//!
//! ```no_run
//! use std::time::Duration;
//! use fatpipe_lab::{End, Lab, LinkSpec, UpOptions};
//!
//! # fn main() -> Result<(), fatpipe_lab::Error> {
//! // CERN - New York: 93 ms, 1 Gbit/s each way, a 1 BDP drop-tail queue.
//! let spec = LinkSpec::new(Duration::from_millis(93), 1_000_000_000);
//! // The owner makes the lab remove itself even if this process is killed.
//! let opts = UpOptions { owner: Some(std::process::id()), ..UpOptions::default() };
//! let lab = Lab::up("demo", &spec, &opts)?;
//! let server = lab.command(End::B, "iperf3").arg("-s").spawn();
//! println!("server at {} ({})", lab.addr(End::B), lab.addr6(End::B));
//! let stats = lab.stats()?;
//! println!("{} segments a->b", stats.a_to_b.link.segments);
//! lab.down()?; // or just drop it
//! # drop(server);
//! # Ok(())
//! # }
//! ```
//!
//! Requires root (CAP_NET_ADMIN and CAP_SYS_ADMIN); without it
//! [`Lab::up`] returns [`Error::NotPermitted`]. The forwarder is the
//! `fatpipe` binary itself (`fatpipe lab run-link NAME`, hidden), so a
//! program other than `fatpipe` must point [`UpOptions::exe`] at it.

pub mod control;
mod error;
mod forward;
mod lab;
pub mod model;
pub mod packet;
pub mod pipe;
pub mod ring;
pub mod spec;
mod state;
mod sys;

pub use control::LabStats;
pub use error::Error;
pub use lab::{down, down_all, list, run_link, set, stats, Lab, LabInfo, UpOptions};
pub use model::ETHERNET_OVERHEAD;
pub use pipe::DirStats;
pub use spec::{Dir, LinkChange, LinkSpec, QueueSpec};
pub use state::{netns_name, LabRecord, NS_PREFIX, RUN_DIR};

/// One end of a lab link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum End {
    /// The `a` side (the sender in most setups; "up" is a to b).
    A,
    /// The `b` side.
    B,
}

impl End {
    /// `'a'` or `'b'`.
    pub fn letter(self) -> char {
        match self {
            End::A => 'a',
            End::B => 'b',
        }
    }

    /// The host number within the lab's /30 and /64.
    fn host(self) -> u32 {
        match self {
            End::A => 1,
            End::B => 2,
        }
    }
}

impl std::str::FromStr for End {
    type Err = Error;

    fn from_str(s: &str) -> Result<End, Error> {
        match s {
            "a" | "A" => Ok(End::A),
            "b" | "B" => Ok(End::B),
            _ => Err(Error::Invalid(format!("end '{s}': use a or b"))),
        }
    }
}
