//! UDP batching: `sendmmsg`/`recvmmsg` over preallocated buffers, and UDP
//! GSO/GRO so one system call carries many datagrams.
//!
//! A UDP test at small packet sizes is bound by system calls per packet,
//! not bytes. Batching (many datagrams per call) and segmentation offload
//! (one large buffer the kernel cuts into datagrams, or coalesces back on
//! receive) cut that cost by an order of magnitude. All calls here work on
//! *connected* sockets, which is how the engine uses UDP, so no addresses
//! are carried per datagram.
//!
//! [`RecvBatch`] owns its buffers and is reused for every call, so the
//! receive loop does not allocate. With GRO on, one received "datagram" may
//! hold several of the sender's datagrams back to back; its
//! [`RecvBatch::segments`] splits it again, and [`Batch::datagrams`] always
//! counts the sender's datagrams.

use std::io;
use std::os::fd::AsFd;

use crate::{platform, IoPath};

/// Most datagrams one GSO send may carry (the kernel's limit in 4.18–6.x).
pub const UDP_MAX_GSO_SEGMENTS: usize = 64;

/// Largest UDP payload over IPv4.
const MAX_UDP_PAYLOAD: usize = 65_507;

/// The outcome of a batch call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    /// Datagrams moved, counted as the sender's datagrams (GRO-coalesced
    /// receives are counted per segment).
    pub datagrams: usize,
    /// Payload bytes moved.
    pub bytes: usize,
    /// The path used: [`IoPath::Mmsg`], [`IoPath::Gso`] or [`IoPath::Copy`].
    pub path: IoPath,
}

/// Sends batches of datagrams with `sendmmsg`, keeping its header arrays
/// between calls.
#[derive(Default)]
pub struct SendBatch {
    scratch: platform::MmsgScratch,
    mmsg_ok: Option<bool>,
}

impl std::fmt::Debug for SendBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendBatch")
            .field("mmsg_ok", &self.mmsg_ok)
            .finish()
    }
}

impl SendBatch {
    /// An empty batch sender.
    pub fn new() -> Self {
        SendBatch::default()
    }

    /// Sends each packet as one datagram on a connected socket. Returns how
    /// many (from the front) the kernel accepted; on a blocking socket that
    /// is all of them unless an error occurred after some were sent.
    pub fn send(&mut self, fd: impl AsFd, packets: &[&[u8]]) -> io::Result<Batch> {
        if self.mmsg_ok != Some(false) {
            match platform::send_batch(&fd, packets, &mut self.scratch) {
                Ok((n, path)) => {
                    self.mmsg_ok = Some(true);
                    let bytes = packets[..n].iter().map(|p| p.len()).sum();
                    return Ok(Batch {
                        datagrams: n,
                        bytes,
                        path,
                    });
                }
                Err(e) if self.mmsg_ok.is_none() && e.raw_os_error() == Some(libc::ENOSYS) => {
                    self.mmsg_ok = Some(false);
                }
                Err(e) => return Err(e),
            }
        }
        send_each(&fd, packets)
    }
}

/// Sends `buf` as datagrams of `segment` bytes (the last may be shorter)
/// with one UDP GSO call. Falls back to a `sendmmsg` batch of the segments
/// when the socket or kernel refuses GSO. `buf` may hold at most
/// [`UDP_MAX_GSO_SEGMENTS`] segments and 65,507 bytes.
pub fn send_gso(fd: impl AsFd, buf: &[u8], segment: usize) -> io::Result<Batch> {
    if segment == 0 || segment > MAX_UDP_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "bad segment size",
        ));
    }
    let count = buf.len().div_ceil(segment);
    if count > UDP_MAX_GSO_SEGMENTS || buf.len() > MAX_UDP_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{count} segments / {} bytes exceed one GSO send", buf.len()),
        ));
    }
    if count > 1 {
        match platform::send_gso(&fd, buf, segment as u16) {
            Ok(n) => {
                return Ok(Batch {
                    datagrams: n.div_ceil(segment),
                    bytes: n,
                    path: IoPath::Gso,
                })
            }
            Err(e) if platform::is_refusal(&e) || e.raw_os_error() == Some(libc::EIO) => {}
            Err(e) => return Err(e),
        }
    }
    let packets: Vec<&[u8]> = buf.chunks(segment).collect();
    SendBatch::new().send(&fd, &packets)
}

/// Whether this socket can send with UDP GSO (`UDP_SEGMENT`).
pub fn gso_supported(fd: impl AsFd) -> bool {
    platform::gso_supported(&fd)
}

/// Turns UDP GRO on or off for receives on this socket. `Unsupported` where
/// the platform has no GRO; receiving works either way.
pub fn set_gro(fd: impl AsFd, on: bool) -> io::Result<()> {
    platform::set_gro(&fd, on)
}

/// Whether a send failed because the interface queue was full (`ENOBUFS`):
/// the datagrams were dropped locally and a later send may succeed.
pub fn is_no_buffer_space(err: &io::Error) -> bool {
    err.raw_os_error() == Some(libc::ENOBUFS)
}

/// Preallocated receive buffers for `recvmmsg`, reused across calls.
pub struct RecvBatch {
    storage: Vec<u8>,
    slot: usize,
    control: Vec<u64>,
    ctl_slot: usize,
    lens: Vec<usize>,
    segs: Vec<Option<usize>>,
    filled: usize,
    scratch: platform::MmsgScratch,
}

impl std::fmt::Debug for RecvBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBatch")
            .field("count", &self.lens.len())
            .field("slot", &self.slot)
            .field("filled", &self.filled)
            .finish()
    }
}

impl RecvBatch {
    /// Room for `count` datagrams of up to `slot` bytes each. With GRO on,
    /// use a 64 KiB `slot` so coalesced datagrams fit.
    pub fn new(count: usize, slot: usize) -> Self {
        let count = count.max(1);
        let slot = slot.max(1);
        let ctl_slot = platform::gro_control_len().next_multiple_of(8);
        RecvBatch {
            storage: vec![0; count * slot],
            slot,
            control: vec![0; count * ctl_slot / 8],
            ctl_slot,
            lens: vec![0; count],
            segs: vec![None; count],
            filled: 0,
            scratch: Default::default(),
        }
    }

    /// Receives as many datagrams as are queued (waiting for at least one
    /// on a blocking socket), up to the batch size.
    pub fn recv(&mut self, fd: impl AsFd) -> io::Result<Batch> {
        self.filled = 0;
        let (n, path) = platform::recv_batch(
            &fd,
            &mut self.storage,
            self.slot,
            &mut self.control,
            self.ctl_slot,
            &mut self.lens,
            &mut self.segs,
            &mut self.scratch,
        )?;
        self.filled = n;
        let datagrams = (0..n).map(|i| self.segments(i).count()).sum();
        let bytes = self.lens[..n].iter().sum();
        Ok(Batch {
            datagrams,
            bytes,
            path,
        })
    }

    /// Received buffers in the last batch (a GRO buffer counts once).
    pub fn len(&self) -> usize {
        self.filled
    }

    /// Whether the last batch received nothing.
    pub fn is_empty(&self) -> bool {
        self.filled == 0
    }

    /// The `i`th received buffer (possibly several coalesced datagrams).
    /// Panics if `i >= self.len()`.
    pub fn datagram(&self, i: usize) -> &[u8] {
        assert!(i < self.filled, "datagram {i} of {}", self.filled);
        let len = self.lens[i].min(self.slot);
        &self.storage[i * self.slot..i * self.slot + len]
    }

    /// The GRO segment size of the `i`th buffer, if the kernel coalesced.
    fn segment_size(&self, i: usize) -> Option<usize> {
        self.segs.get(i).copied().flatten()
    }

    /// The sender's datagrams inside the `i`th buffer.
    pub fn segments(&self, i: usize) -> std::slice::Chunks<'_, u8> {
        let d = self.datagram(i);
        let size = self.segment_size(i).unwrap_or(d.len()).max(1);
        d.chunks(size)
    }
}

fn send_each(fd: &impl AsFd, packets: &[&[u8]]) -> io::Result<Batch> {
    let mut batch = Batch {
        datagrams: 0,
        bytes: 0,
        path: IoPath::Copy,
    };
    for p in packets {
        match platform::send(fd, p, 0) {
            Ok(n) => {
                batch.datagrams += 1;
                batch.bytes += n;
            }
            Err(e) if batch.datagrams > 0 && e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    Ok(batch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::time::Duration;

    fn linux() -> bool {
        cfg!(all(target_os = "linux", not(fatpipe_sys_fallback)))
    }

    fn pair() -> (UdpSocket, UdpSocket) {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        a.connect(b.local_addr().unwrap()).unwrap();
        b.connect(a.local_addr().unwrap()).unwrap();
        b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        crate::buffers::set_recv_buffer(&b, 4 << 20, false).unwrap();
        (a, b)
    }

    /// Receives until `want` sender datagrams arrived; returns them in order.
    /// Also returns the path of each call and every GRO segment size seen.
    fn collect(
        b: &UdpSocket,
        rb: &mut RecvBatch,
        want: usize,
    ) -> (Vec<Vec<u8>>, Vec<IoPath>, Vec<usize>) {
        let mut got = Vec::new();
        let mut paths = Vec::new();
        let mut seg_sizes = Vec::new();
        while got.len() < want {
            let batch = rb.recv(b).unwrap();
            paths.push(batch.path);
            for i in 0..rb.len() {
                got.extend(rb.segments(i).map(|s| s.to_vec()));
                seg_sizes.extend(rb.segment_size(i));
            }
            assert_eq!(
                batch.datagrams,
                (0..rb.len()).map(|i| rb.segments(i).count()).sum()
            );
        }
        (got, paths, seg_sizes)
    }

    #[test]
    fn mmsg_batch_round_trip() {
        let (a, b) = pair();
        let msgs: Vec<Vec<u8>> = (0..32u8).map(|i| vec![i; 100 + i as usize]).collect();
        let refs: Vec<&[u8]> = msgs.iter().map(|m| m.as_slice()).collect();
        let mut sb = SendBatch::new();
        let sent = sb.send(&a, &refs).unwrap();
        assert_eq!(sent.datagrams, 32);
        assert_eq!(sent.bytes, msgs.iter().map(Vec::len).sum::<usize>());
        assert_eq!(sent.path, if linux() { IoPath::Mmsg } else { IoPath::Copy });
        let mut rb = RecvBatch::new(16, 2048);
        let (got, paths, _) = collect(&b, &mut rb, 32);
        assert_eq!(got, msgs);
        if linux() {
            assert!(
                paths.len() < 32,
                "batched: {} calls for 32 datagrams",
                paths.len()
            );
        }
        assert_eq!(sb.send(&a, &[]).unwrap().datagrams, 0);
    }

    #[test]
    fn gso_send_arrives_as_separate_datagrams() {
        let (a, b) = pair();
        let buf: Vec<u8> = (0..10_000u32).map(|i| (i / 1000) as u8).collect();
        let sent = send_gso(&a, &buf, 1000).unwrap();
        assert_eq!((sent.datagrams, sent.bytes), (10, 10_000));
        // GSO needs Linux 4.18+; older kernels must take the batch path.
        let want = match (linux(), gso_supported(&a)) {
            (true, true) => IoPath::Gso,
            (true, false) => IoPath::Mmsg,
            (false, _) => IoPath::Copy,
        };
        assert_eq!(sent.path, want);
        let mut rb = RecvBatch::new(16, 2048);
        let (got, _, segs) = collect(&b, &mut rb, 10);
        assert_eq!(got.len(), 10);
        for (i, d) in got.iter().enumerate() {
            assert_eq!(d, &vec![i as u8; 1000]);
        }
        assert!(segs.is_empty(), "GRO is off: nothing coalesced");
        assert!(send_gso(&a, &buf, 0).is_err());
        assert!(
            send_gso(&a, &vec![0; 65 * 100], 100).is_err(),
            "too many segments"
        );
    }

    #[test]
    fn gro_receive_reports_segment_size() {
        let (a, b) = pair();
        let gro = set_gro(&b, true).is_ok() && platform::gro_enabled(&b).unwrap_or(false);
        // GRO needs Linux 5.0+; elsewhere it must be reported as off.
        if !linux() {
            assert!(!gro);
        }
        let buf: Vec<u8> = (0..8 * 1200u32).map(|i| (i / 1200) as u8).collect();
        send_gso(&a, &buf, 1200).unwrap();
        let mut rb = RecvBatch::new(8, 65_536);
        let (got, paths, segs) = collect(&b, &mut rb, 8);
        eprintln!("GRO on: {gro}, calls: {paths:?}, segment sizes: {segs:?}");
        assert_eq!(got.len(), 8);
        for (i, d) in got.iter().enumerate() {
            assert_eq!(d, &vec![i as u8; 1200]);
        }
        // Coalescing is the kernel's choice; when it happened it must be
        // reported as GRO with the sender's segment size.
        assert_eq!(paths.contains(&IoPath::Gso), !segs.is_empty());
        assert!(segs.iter().all(|&s| s == 1200), "{segs:?}");
        if !gro {
            assert!(segs.is_empty());
        }
    }
}
