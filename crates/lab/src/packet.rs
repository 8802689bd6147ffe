//! Frames as the TUN devices hand them over: a virtio-net header, then an
//! IP packet that may be a GSO super-packet of many TCP segments or (with
//! UDP segmentation offload, Linux 6.2+) of many UDP datagrams.
//!
//! With `IFF_VNET_HDR` and TSO offloads turned on, the sending kernel gives
//! the emulator TCP super-packets of up to 64 KB instead of 1500-byte
//! packets, which is what makes multi-gigabit forwarding possible in user
//! space. The link model still decides per MTU-sized segment ([`Layout`]
//! says how a super-packet segments). When every segment survives, the
//! super-packet travels whole. When any is lost or corrupted, it is cut into
//! its segments here, exactly as the kernel's software GSO would cut it
//! (sequence numbers, IP IDs and lengths advance; FIN/PSH stay on the last
//! segment, CWR on the first) and only the survivors go on. Loss rates thus
//! mean per segment what users expect, with no statistical shortcut.
//! A UDP super-packet (`GSO_UDP_L4`) is a run of datagrams of `gso_size`
//! payload bytes (the last may be shorter) behind one UDP header; it is cut
//! as the kernel's `__udp_gso_segment` cuts it: each datagram gets the
//! headers with its own UDP and IP lengths, the IPv4 ID advances, and the
//! partial checksum is the pseudo-header sum for its own length. A whole
//! one is written on as it came; the receiving kernel segments it (or
//! hands it whole to a socket with `UDP_GRO`), so nothing is cut here
//! unless the link model loses or corrupts part of it.
//!
//! Checksums: segments keep `NEEDS_CSUM` (the receiving kernel trusts a
//! partial checksum from a TUN device, as it trusts a virtio NIC), so the
//! common path never sums a payload. A corrupted segment is the exception:
//! its checksum is completed first and the bit flipped after, so the
//! receiving stack detects the error as a real one would. A tampered
//! segment ([`tamper_payload`]) is the opposite: a payload bit changes and
//! the checksum is left to match, so the receiver accepts the damage.

/// Bytes of the `virtio_net_hdr` in front of every frame.
pub const VNET_HDR_LEN: usize = 10;

/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the L4 checksum is partial.
pub const F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_NONE`.
pub const GSO_NONE: u8 = 0;
/// `VIRTIO_NET_HDR_GSO_TCPV4`.
pub const GSO_TCPV4: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_TCPV6`.
pub const GSO_TCPV6: u8 = 4;
/// `VIRTIO_NET_HDR_GSO_UDP_L4`: UDP datagrams of `gso_size`, IPv4 or IPv6.
pub const GSO_UDP_L4: u8 = 5;
/// `VIRTIO_NET_HDR_GSO_ECN` flag bit.
pub const GSO_ECN: u8 = 0x80;

const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const UDP_HDR: usize = 8;

/// The virtio-net header (native little-endian on every host we run on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VnetHdr {
    /// `F_NEEDS_CSUM` and friends.
    pub flags: u8,
    /// `GSO_*`.
    pub gso_type: u8,
    /// Length of the headers (a hint only).
    pub hdr_len: u16,
    /// Segment payload size (MSS) of a GSO packet.
    pub gso_size: u16,
    /// Where checksumming starts, from the start of the IP packet.
    pub csum_start: u16,
    /// Where the checksum is stored, from `csum_start`.
    pub csum_offset: u16,
}

impl VnetHdr {
    /// Reads the header at the start of `frame`; `None` if it is too short.
    pub fn parse(frame: &[u8]) -> Option<VnetHdr> {
        let b = frame.get(..VNET_HDR_LEN)?;
        let u = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        Some(VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
        })
    }

    /// Writes the header into the first [`VNET_HDR_LEN`] bytes of `out`.
    pub fn write(&self, out: &mut [u8]) {
        out[0] = self.flags;
        out[1] = self.gso_type;
        out[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        out[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        out[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        out[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
    }
}

/// How a TCP or UDP super-packet splits into segments (datagrams, for UDP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// IP header length (20+ for IPv4, 40 for IPv6).
    pub ip_hdr: usize,
    /// TCP header length including options; for UDP, its 8-byte header.
    pub tcp_hdr: usize,
    /// IPv6 rather than IPv4.
    pub v6: bool,
    /// Payload bytes per segment.
    pub mss: usize,
    /// Payload bytes in the whole super-packet.
    pub payload: usize,
    /// A UDP super-packet (`GSO_UDP_L4`) rather than a TCP one.
    pub udp: bool,
}

impl Layout {
    /// The layout of a GSO TCP frame's packet, or `None` if it is not one
    /// this module can cut (then it travels as one segment).
    pub fn of(hdr: &VnetHdr, pkt: &[u8]) -> Option<Layout> {
        if hdr.gso_type == GSO_UDP_L4 {
            return Layout::of_udp(hdr, pkt);
        }
        let gso = hdr.gso_type & !GSO_ECN;
        if (gso != GSO_TCPV4 && gso != GSO_TCPV6) || hdr.gso_size == 0 {
            return None;
        }
        let (ip_hdr, proto, v6) = ip_header(pkt)?;
        if proto != PROTO_TCP || v6 != (gso == GSO_TCPV6) {
            return None;
        }
        let tcp_hdr = usize::from(*pkt.get(ip_hdr + 12)? >> 4) * 4;
        if tcp_hdr < 20 || pkt.len() < ip_hdr + tcp_hdr {
            return None;
        }
        let payload = pkt.len() - ip_hdr - tcp_hdr;
        let mss = usize::from(hdr.gso_size);
        if payload <= mss {
            return None;
        }
        Some(Layout {
            ip_hdr,
            tcp_hdr,
            v6,
            mss,
            payload,
            udp: false,
        })
    }

    /// Number of segments.
    pub fn segments(&self) -> usize {
        self.payload.div_ceil(self.mss)
    }

    /// Bytes on the wire of segment `i` (its IP packet).
    pub fn wire_len(&self, i: usize) -> usize {
        let start = i * self.mss;
        self.ip_hdr + self.tcp_hdr + self.mss.min(self.payload - start)
    }

    /// Writes segment `i` of `pkt` as a frame (virtio-net header and IP
    /// packet) into `out`, which must hold `VNET_HDR_LEN + wire_len(i)`
    /// bytes. Returns the frame length.
    pub fn write_segment(&self, pkt: &[u8], i: usize, out: &mut [u8]) -> usize {
        if self.udp {
            return self.write_datagram(pkt, i, out);
        }
        let (len, wire) = self.cut(pkt, i, out, 16);
        let p = &mut out[VNET_HDR_LEN..VNET_HDR_LEN + wire];
        let ip = self.ip_hdr;
        let seq = u32::from_be_bytes([p[ip + 4], p[ip + 5], p[ip + 6], p[ip + 7]])
            .wrapping_add((i * self.mss) as u32);
        p[ip + 4..ip + 8].copy_from_slice(&seq.to_be_bytes());
        let last = i + 1 == self.segments();
        if !last {
            p[ip + 13] &= !(0x01 | 0x08); // FIN, PSH only on the last
        }
        if i != 0 {
            p[ip + 13] &= !0x80; // CWR only on the first
        }
        // A partial checksum holds the pseudo-header sum, not complemented.
        let pseudo = pseudo_sum(p, self.v6, PROTO_TCP, self.tcp_hdr + len);
        put16(p, ip + 16, fold(pseudo));
        VNET_HDR_LEN + wire
    }

    /// The layout of a `GSO_UDP_L4` frame's packet (IPv4 or IPv6: the one
    /// GSO type serves both), or `None` if it holds a single datagram or is
    /// not a UDP packet this module can cut.
    fn of_udp(hdr: &VnetHdr, pkt: &[u8]) -> Option<Layout> {
        if hdr.gso_size == 0 {
            return None;
        }
        let (ip_hdr, proto, v6) = ip_header(pkt)?;
        if proto != PROTO_UDP || pkt.len() < ip_hdr + UDP_HDR {
            return None;
        }
        let payload = pkt.len() - ip_hdr - UDP_HDR;
        let mss = usize::from(hdr.gso_size);
        if payload <= mss {
            return None;
        }
        Some(Layout {
            ip_hdr,
            tcp_hdr: UDP_HDR,
            v6,
            mss,
            payload,
            udp: true,
        })
    }

    /// [`Layout::write_segment`] for a UDP super-packet: datagram `i`, with
    /// its own UDP length, IP length (and IPv4 ID and header checksum), and
    /// the partial checksum of its own pseudo-header, as software GSO makes
    /// it.
    fn write_datagram(&self, pkt: &[u8], i: usize, out: &mut [u8]) -> usize {
        let (len, wire) = self.cut(pkt, i, out, 6);
        let p = &mut out[VNET_HDR_LEN..VNET_HDR_LEN + wire];
        let ip = self.ip_hdr;
        put16(p, ip + 4, (UDP_HDR + len) as u16);
        let pseudo = pseudo_sum(p, self.v6, PROTO_UDP, UDP_HDR + len);
        put16(p, ip + 6, fold(pseudo));
        VNET_HDR_LEN + wire
    }

    /// What cutting segment `i` of `pkt` into `out` is the same for TCP and
    /// UDP: the virtio-net header (a partial checksum at `csum_offset` in
    /// the L4 header), the headers and the segment's payload, and the IP
    /// header's length (with the IPv4 ID advanced by `i` and its header
    /// checksum made anew, as software GSO does). Returns the payload and
    /// IP packet lengths; the L4 header is the caller's to fix.
    fn cut(&self, pkt: &[u8], i: usize, out: &mut [u8], csum_offset: u16) -> (usize, usize) {
        let hl = self.ip_hdr + self.tcp_hdr;
        let start = hl + i * self.mss;
        let len = self.mss.min(self.payload - i * self.mss);
        let wire = hl + len;
        let frame = &mut out[..VNET_HDR_LEN + wire];
        VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_NONE,
            hdr_len: hl as u16,
            gso_size: 0,
            csum_start: self.ip_hdr as u16,
            csum_offset,
        }
        .write(frame);
        let p = &mut frame[VNET_HDR_LEN..];
        p[..hl].copy_from_slice(&pkt[..hl]);
        p[hl..].copy_from_slice(&pkt[start..start + len]);
        if self.v6 {
            put16(p, 4, (self.tcp_hdr + len) as u16);
        } else {
            put16(p, 2, wire as u16);
            let id = get16(p, 4).wrapping_add(i as u16);
            put16(p, 4, id);
            put16(p, 10, 0);
            let c = !fold(sum(&p[..self.ip_hdr], 0));
            put16(p, 10, c);
        }
        (len, wire)
    }
}

/// Completes a partial L4 checksum in place (`NEEDS_CSUM` cleared) so the
/// receiver verifies it. Frames of GSO super-packets must be cut first.
/// Returns false if the header points outside the packet.
pub fn complete_checksum(frame: &mut [u8]) -> bool {
    let Some(mut hdr) = VnetHdr::parse(frame) else {
        return false;
    };
    if hdr.flags & F_NEEDS_CSUM == 0 {
        return true;
    }
    let pkt = &mut frame[VNET_HDR_LEN..];
    let start = usize::from(hdr.csum_start);
    let at = start + usize::from(hdr.csum_offset);
    if at + 2 > pkt.len() {
        return false;
    }
    // The stored field is the pseudo-header sum; summing over it and the
    // rest is what a NIC does.
    let mut c = !fold(sum(&pkt[start..], 0));
    if c == 0 && ip_header(pkt).is_some_and(|(_, proto, _)| proto == PROTO_UDP) {
        c = 0xFFFF;
    }
    put16(pkt, at, c);
    hdr.flags &= !F_NEEDS_CSUM;
    hdr.write(frame);
    true
}

/// Flips bit `bit` (counted over the IP packet, taken modulo the bytes after
/// the IP header) of a non-GSO frame whose checksum is complete. Headers are
/// spared so the corrupted packet still reaches the receiver's checksum check.
pub fn flip_bit(frame: &mut [u8], bit: u32) {
    let pkt = &mut frame[VNET_HDR_LEN..];
    let skip = ip_header(pkt).map_or(0, |(h, _, _)| h);
    let room = (pkt.len().saturating_sub(skip) * 8) as u64;
    if room == 0 {
        return;
    }
    let b = skip * 8 + (u64::from(bit) % room) as usize;
    pkt[b / 8] ^= 0x80 >> (b % 8);
}

/// Where the transport payload of `pkt` starts and how long it is, for
/// TCP and UDP over IPv4 or IPv6 (without extension headers); `None` for
/// anything else, including IPv4 fragments (only the first has an L4
/// header, and no fragment can have its checksum fixed on its own).
pub fn payload_span(pkt: &[u8]) -> Option<(usize, usize)> {
    let (ip, proto, v6) = ip_header(pkt)?;
    if !v6 && get16(pkt, 6) & 0x3FFF != 0 {
        return None;
    }
    let l4 = match proto {
        PROTO_TCP => usize::from(*pkt.get(ip + 12)? >> 4) * 4,
        PROTO_UDP => 8,
        _ => return None,
    };
    if l4 < 8 || pkt.len() < ip + l4 {
        return None;
    }
    Some((ip + l4, pkt.len() - ip - l4))
}

/// Flips payload bit `bit` of a frame, counted from byte `first` of its IP
/// packet (the first payload byte of the segment meant), and leaves an L4
/// checksum that verifies: the undetected error a faulty NIC or middlebox
/// makes. A partial checksum (`NEEDS_CSUM`) covers only the pseudo-header
/// and is completed later over the changed bytes (by the receiving kernel,
/// which trusts it, or by whoever segments a super-packet), so it stays as
/// it is; a complete one is summed again. Headers are never touched.
/// Returns false, changing nothing, if the bit is outside the payload or
/// the checksum cannot be made to match (a GSO frame without `NEEDS_CSUM`).
pub fn tamper_payload(frame: &mut [u8], first: usize, bit: u32) -> bool {
    let Some(hdr) = VnetHdr::parse(frame) else {
        return false;
    };
    let pkt = &mut frame[VNET_HDR_LEN..];
    let Some((start, len)) = payload_span(pkt) else {
        return false;
    };
    let at = first + bit as usize / 8;
    if first < start || at >= start + len {
        return false;
    }
    let partial = hdr.flags & F_NEEDS_CSUM != 0;
    if !partial && hdr.gso_type != GSO_NONE {
        return false;
    }
    pkt[at] ^= 0x80 >> (bit % 8);
    if !partial {
        refresh_l4_checksum(pkt);
    }
    true
}

/// The IP header length, L4 protocol and version of `pkt`.
pub fn ip_header(pkt: &[u8]) -> Option<(usize, u8, bool)> {
    match pkt.first()? >> 4 {
        4 => {
            let ihl = usize::from(pkt[0] & 0x0F) * 4;
            (ihl >= 20 && pkt.len() >= ihl).then(|| (ihl, pkt[9], false))
        }
        6 => (pkt.len() >= 40).then(|| (40, pkt[6], true)),
        _ => None,
    }
}

/// One's-complement sum of big-endian 16-bit words, added to `init`.
pub fn sum(data: &[u8], init: u64) -> u64 {
    let mut s = init;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        s += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        s += u64::from(*last) << 8;
    }
    s
}

/// Folds a wide one's-complement sum into 16 bits.
pub fn fold(mut s: u64) -> u16 {
    while s >> 16 != 0 {
        s = (s & 0xFFFF) + (s >> 16);
    }
    s as u16
}

/// Computes a complete TCP or UDP checksum of `pkt` again after its payload
/// changed. A UDP/IPv4 packet sent without a checksum (0) stays without.
fn refresh_l4_checksum(pkt: &mut [u8]) {
    let Some((ip, proto, v6)) = ip_header(pkt) else {
        return;
    };
    let at = ip + if proto == PROTO_TCP { 16 } else { 6 };
    if at + 2 > pkt.len() || (proto == PROTO_UDP && !v6 && get16(pkt, at) == 0) {
        return;
    }
    put16(pkt, at, 0);
    let l4_len = pkt.len() - ip;
    let mut c = !fold(pseudo_sum(pkt, v6, proto, l4_len) + sum(&pkt[ip..], 0));
    if c == 0 && proto == PROTO_UDP {
        c = 0xFFFF;
    }
    put16(pkt, at, c);
}

fn pseudo_sum(p: &[u8], v6: bool, proto: u8, l4_len: usize) -> u64 {
    if v6 {
        sum(&p[8..40], 0) + l4_len as u64 + u64::from(proto)
    } else {
        sum(&p[12..20], 0) + l4_len as u64 + u64::from(proto)
    }
}

fn get16(p: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([p[at], p[at + 1]])
}

fn put16(p: &mut [u8], at: usize, v: u16) {
    p[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A GSO TCP frame as a kernel would hand it over: `payload` bytes cut
    /// at `mss`, partial checksum, flags PSH|ACK|FIN|CWR to check their fate.
    pub(crate) fn gso_frame(v6: bool, payload: usize, mss: u16) -> Vec<u8> {
        let ip_hdr = if v6 { 40 } else { 20 };
        let tcp_hdr = 32; // with timestamps
        let mut f = vec![0u8; VNET_HDR_LEN + ip_hdr + tcp_hdr + payload];
        VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: if v6 { GSO_TCPV6 } else { GSO_TCPV4 },
            hdr_len: (ip_hdr + tcp_hdr) as u16,
            gso_size: mss,
            csum_start: ip_hdr as u16,
            csum_offset: 16,
        }
        .write(&mut f);
        let p = &mut f[VNET_HDR_LEN..];
        if v6 {
            p[0] = 0x60;
            put16(p, 4, (tcp_hdr + payload) as u16);
            p[6] = PROTO_TCP;
            p[7] = 64;
            p[8..24].copy_from_slice(&[0x20, 0x01, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1]);
            p[24..40].copy_from_slice(&[0x20, 0x01, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2]);
        } else {
            p[0] = 0x45;
            put16(p, 2, (ip_hdr + tcp_hdr + payload).min(65535) as u16);
            put16(p, 4, 0xFFFE); // the ID wraps while segmenting
            p[8] = 64;
            p[9] = PROTO_TCP;
            p[12..16].copy_from_slice(&[198, 18, 0, 1]);
            p[16..20].copy_from_slice(&[198, 18, 0, 2]);
            let c = !fold(sum(&p[..20], 0));
            put16(p, 10, c);
        }
        let t = ip_hdr;
        put16(p, t, 5201);
        put16(p, t + 2, 40000);
        p[t + 4..t + 8].copy_from_slice(&0xFFFF_FF00u32.to_be_bytes()); // seq wraps too
        p[t + 12] = ((tcp_hdr / 4) as u8) << 4;
        p[t + 13] = 0x80 | 0x10 | 0x08 | 0x01; // CWR ACK PSH FIN
        for (i, b) in p[ip_hdr + tcp_hdr..].iter_mut().enumerate() {
            *b = (i * 7 + i / 251) as u8;
        }
        f
    }

    /// A UDP GSO frame as a kernel with USO hands it over: `payload` bytes
    /// of datagrams of `size` behind one UDP header whose length is the
    /// whole (as `udp_send_skb` leaves it), with a partial checksum.
    pub(crate) fn udp_gso_frame(v6: bool, payload: usize, size: u16) -> Vec<u8> {
        let ip_hdr = if v6 { 40 } else { 20 };
        let mut f = vec![0u8; VNET_HDR_LEN + ip_hdr + UDP_HDR + payload];
        VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_UDP_L4,
            hdr_len: (ip_hdr + UDP_HDR) as u16,
            gso_size: size,
            csum_start: ip_hdr as u16,
            csum_offset: 6,
        }
        .write(&mut f);
        let p = &mut f[VNET_HDR_LEN..];
        let l4 = UDP_HDR + payload;
        if v6 {
            p[0] = 0x60;
            put16(p, 4, l4 as u16);
            p[6] = PROTO_UDP;
            p[7] = 64;
            p[8..24].copy_from_slice(&[0x20, 0x01, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1]);
            p[24..40].copy_from_slice(&[0x20, 0x01, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2]);
        } else {
            p[0] = 0x45;
            put16(p, 2, (ip_hdr + l4) as u16);
            put16(p, 4, 0xFFFD); // the ID wraps while segmenting
            p[6] = 0x40; // DF, as a connected UDP socket with PMTU discovery sends
            p[8] = 64;
            p[9] = PROTO_UDP;
            p[12..16].copy_from_slice(&[198, 18, 0, 1]);
            p[16..20].copy_from_slice(&[198, 18, 0, 2]);
            let c = !fold(sum(&p[..20], 0));
            put16(p, 10, c);
        }
        let u = ip_hdr;
        put16(p, u, 40000);
        put16(p, u + 2, 5201);
        put16(p, u + 4, l4 as u16);
        let pseudo = fold(pseudo_sum(p, v6, PROTO_UDP, l4));
        put16(p, u + 6, pseudo);
        for (i, b) in p[ip_hdr + UDP_HDR..].iter_mut().enumerate() {
            *b = (i * 13 + i / 241) as u8;
        }
        f
    }

    /// The UDP checksum of `pkt` computed from scratch (pseudo-header, the
    /// UDP header with a zero checksum field, the payload), as RFC 768 and
    /// RFC 8200 define it.
    fn udp_checksum(pkt: &[u8], v6: bool) -> u16 {
        let ip = if v6 { 40 } else { 20 };
        let mut l4 = pkt[ip..].to_vec();
        l4[6] = 0;
        l4[7] = 0;
        let c = !fold(pseudo_sum(pkt, v6, PROTO_UDP, l4.len()) + sum(&l4, 0));
        if c == 0 {
            0xFFFF
        } else {
            c
        }
    }

    fn l4_ok(pkt: &[u8], v6: bool) -> bool {
        let ip = if v6 { 40 } else { 20 };
        fold(pseudo_sum(pkt, v6, PROTO_TCP, pkt.len() - ip) + sum(&pkt[ip..], 0)) == 0xFFFF
    }

    fn split_all(frame: &[u8]) -> (Layout, Vec<Vec<u8>>) {
        let hdr = VnetHdr::parse(frame).expect("header");
        let pkt = &frame[VNET_HDR_LEN..];
        let l = Layout::of(&hdr, pkt).expect("a GSO TCP frame");
        let segs = (0..l.segments())
            .map(|i| {
                let mut out = vec![0u8; VNET_HDR_LEN + l.wire_len(i)];
                let n = l.write_segment(pkt, i, &mut out);
                assert_eq!(n, out.len());
                out
            })
            .collect();
        (l, segs)
    }

    #[test]
    fn cuts_like_software_gso_v4_and_v6() {
        for v6 in [false, true] {
            let payload = 10 * 1448 + 100;
            let frame = gso_frame(v6, payload, 1448);
            let (l, segs) = split_all(&frame);
            assert_eq!(l.segments(), 11);
            let ip = l.ip_hdr;
            let mut data = Vec::new();
            for (i, mut s) in segs.into_iter().enumerate() {
                let last = i == 10;
                let p = &s[VNET_HDR_LEN..];
                assert_eq!(p.len(), l.wire_len(i));
                assert_eq!(p.len(), ip + 32 + if last { 100 } else { 1448 });
                if v6 {
                    assert_eq!(usize::from(get16(p, 4)), p.len() - 40);
                } else {
                    assert_eq!(usize::from(get16(p, 2)), p.len());
                    assert_eq!(get16(p, 4), 0xFFFEu16.wrapping_add(i as u16));
                    assert_eq!(fold(sum(&p[..20], 0)), 0xFFFF, "IPv4 header checksum");
                }
                let seq = u32::from_be_bytes([p[ip + 4], p[ip + 5], p[ip + 6], p[ip + 7]]);
                assert_eq!(seq, 0xFFFF_FF00u32.wrapping_add((i * 1448) as u32));
                let flags = p[ip + 13];
                assert_eq!(flags & 0x01 != 0, last, "FIN on the last only");
                assert_eq!(flags & 0x08 != 0, last, "PSH on the last only");
                assert_eq!(flags & 0x80 != 0, i == 0, "CWR on the first only");
                data.extend_from_slice(&p[ip + 32..]);
                // A completed checksum verifies; after a flip it does not.
                assert!(complete_checksum(&mut s));
                assert_eq!(VnetHdr::parse(&s).map(|h| h.flags), Some(0));
                assert!(l4_ok(&s[VNET_HDR_LEN..], v6), "segment {i} checksum");
                flip_bit(&mut s, 12_345 + i as u32);
                assert!(
                    !l4_ok(&s[VNET_HDR_LEN..], v6),
                    "flip must break the checksum"
                );
            }
            assert_eq!(data, frame[VNET_HDR_LEN + ip + 32..].to_vec());
        }
    }

    #[test]
    fn cuts_udp_gso_like_the_kernel_v4_and_v6() {
        for v6 in [false, true] {
            let size = if v6 { 1452 } else { 1472 };
            let payload = 7 * usize::from(size) + 333;
            let frame = udp_gso_frame(v6, payload, size);
            let (l, segs) = split_all(&frame);
            assert!(l.udp);
            assert_eq!(l.segments(), 8);
            let ip = l.ip_hdr;
            let mut data = Vec::new();
            for (i, mut s) in segs.into_iter().enumerate() {
                let len = if i == 7 { 333 } else { usize::from(size) };
                let p = &s[VNET_HDR_LEN..];
                assert_eq!(p.len(), l.wire_len(i));
                assert_eq!(p.len(), ip + 8 + len);
                if v6 {
                    assert_eq!(usize::from(get16(p, 4)), len + 8, "IPv6 payload length");
                } else {
                    assert_eq!(usize::from(get16(p, 2)), p.len(), "IPv4 total length");
                    assert_eq!(get16(p, 4), 0xFFFDu16.wrapping_add(i as u16), "IPv4 ID");
                    assert_eq!(p[6], 0x40, "DF kept");
                    assert_eq!(fold(sum(&p[..20], 0)), 0xFFFF, "IPv4 header checksum");
                }
                assert_eq!((get16(p, ip), get16(p, ip + 2)), (40000, 5201), "ports");
                assert_eq!(usize::from(get16(p, ip + 4)), len + 8, "UDP length");
                data.extend_from_slice(&p[ip + 8..]);
                let hdr = VnetHdr::parse(&s).expect("hdr");
                assert_eq!((hdr.gso_type, hdr.flags), (GSO_NONE, F_NEEDS_CSUM));
                assert_eq!((hdr.csum_start, hdr.csum_offset), (ip as u16, 6));
                // Completing the partial checksum gives the datagram's real
                // one, computed here from scratch.
                let want = udp_checksum(&s[VNET_HDR_LEN..], v6);
                assert!(complete_checksum(&mut s));
                assert_eq!(get16(&s[VNET_HDR_LEN..], ip + 6), want, "datagram {i}");
                flip_bit(&mut s, 999 + 8 * i as u32);
                assert_ne!(
                    udp_checksum(&s[VNET_HDR_LEN..], v6),
                    get16(&s[VNET_HDR_LEN..], ip + 6),
                    "a flip must break the checksum"
                );
            }
            assert_eq!(data, frame[VNET_HDR_LEN + ip + 8..].to_vec());
        }
    }

    #[test]
    fn udp_gso_of_one_datagram_or_not_udp_is_not_cut() {
        // One datagram behind a GSO header (the kernel does not mark those,
        // but a header must not be trusted), no gso_size, a TCP packet.
        let one = udp_gso_frame(false, 1000, 1472);
        let h = VnetHdr::parse(&one).expect("hdr");
        assert_eq!(Layout::of(&h, &one[VNET_HDR_LEN..]), None);
        let mut f = udp_gso_frame(true, 3000, 1000);
        f[4] = 0;
        f[5] = 0;
        let h = VnetHdr::parse(&f).expect("hdr");
        assert_eq!(Layout::of(&h, &f[VNET_HDR_LEN..]), None);
        let mut t = gso_frame(false, 3000, 1000);
        t[1] = GSO_UDP_L4;
        let h = VnetHdr::parse(&t).expect("hdr");
        assert_eq!(Layout::of(&h, &t[VNET_HDR_LEN..]), None);
        // Truncated UDP super-packets never panic.
        for n in 0..80 {
            let g = udp_gso_frame(false, 5000, 1000);
            let cut = &g[..n.min(g.len())];
            if let Some(h) = VnetHdr::parse(cut) {
                let _ = Layout::of(&h, &cut[VNET_HDR_LEN..]);
            }
        }
    }

    #[test]
    fn plain_frames_are_not_cut() {
        let mut f = gso_frame(false, 1000, 1448);
        assert_eq!(
            Layout::of(&VnetHdr::parse(&f).expect("hdr"), &f[VNET_HDR_LEN..]),
            None
        );
        f[1] = GSO_NONE;
        f[4] = 0;
        assert_eq!(
            Layout::of(&VnetHdr::parse(&f).expect("hdr"), &f[VNET_HDR_LEN..]),
            None
        );
        // Truncated or garbage packets never panic.
        for n in 0..80 {
            let g = gso_frame(true, 5000, 1000);
            let cut = &g[..n.min(g.len())];
            if let Some(h) = VnetHdr::parse(cut) {
                let _ = Layout::of(&h, &cut[VNET_HDR_LEN..]);
            }
        }
    }

    #[test]
    fn checksum_of_a_known_packet() {
        // RFC 1071's example words sum to 0xDDF2.
        let data = [0x00, 0x01, 0xF2, 0x03, 0xF4, 0xF5, 0xF6, 0xF7];
        assert_eq!(fold(sum(&data, 0)), 0xDDF2);
    }

    /// A plain (non-GSO) UDP frame of `payload` bytes with a partial
    /// checksum, as a kernel with checksum offload hands it over.
    fn udp_frame(v6: bool, payload: usize) -> Vec<u8> {
        let mut f = gso_frame(v6, 0, 1448);
        let ip = if v6 { 40 } else { 20 };
        f.truncate(VNET_HDR_LEN + ip + 8);
        f.extend((0..payload).map(|i| (i * 13 + 5) as u8));
        let p = &mut f[VNET_HDR_LEN..];
        let l4 = 8 + payload;
        if v6 {
            p[6] = PROTO_UDP;
            put16(p, 4, l4 as u16);
        } else {
            p[9] = PROTO_UDP;
            put16(p, 2, (ip + l4) as u16);
            put16(p, 10, 0);
            let c = !fold(sum(&p[..20], 0));
            put16(p, 10, c);
        }
        put16(p, ip + 4, l4 as u16);
        let pseudo = fold(pseudo_sum(p, v6, PROTO_UDP, l4));
        put16(p, ip + 6, pseudo);
        VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_NONE,
            hdr_len: (ip + 8) as u16,
            gso_size: 0,
            csum_start: ip as u16,
            csum_offset: 6,
        }
        .write(&mut f);
        f
    }

    /// Whether the frame's L4 checksum verifies as the receiver checks it
    /// (a partial one is completed first, as a NIC or segmenter would).
    fn verifies(frame: &[u8]) -> bool {
        let mut g = frame.to_vec();
        assert!(complete_checksum(&mut g));
        let p = &g[VNET_HDR_LEN..];
        let (ip, proto, v6) = ip_header(p).expect("ip");
        fold(pseudo_sum(p, v6, proto, p.len() - ip) + sum(&p[ip..], 0)) == 0xFFFF
    }

    /// Positions of the bits that differ between two equal-length buffers.
    fn diff_bits(a: &[u8], b: &[u8]) -> Vec<usize> {
        assert_eq!(a.len(), b.len());
        let mut out = Vec::new();
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            for k in 0..8 {
                if (x ^ y) & (0x80 >> k) != 0 {
                    out.push(i * 8 + k);
                }
            }
        }
        out
    }

    #[test]
    fn tampered_payload_still_verifies_tcp_and_udp_v4_and_v6() {
        for v6 in [false, true] {
            let tcp = {
                let mut f = gso_frame(v6, 700, 1448);
                f[1] = GSO_NONE;
                let ip = if v6 { 40 } else { 20 };
                let pseudo = fold(pseudo_sum(&f[VNET_HDR_LEN..], v6, PROTO_TCP, 32 + 700));
                put16(&mut f[VNET_HDR_LEN..], ip + 16, pseudo);
                f
            };
            for clean in [tcp, udp_frame(v6, 900)] {
                assert!(verifies(&clean));
                let (start, len) = payload_span(&clean[VNET_HDR_LEN..]).expect("span");
                // Partial checksum left partial, and a complete one refreshed.
                let mut complete = clean.clone();
                assert!(complete_checksum(&mut complete));
                for original in [clean.clone(), complete] {
                    for bit in [0, 7, 8 * len as u32 - 1, 1234] {
                        let mut f = original.clone();
                        assert!(tamper_payload(&mut f, start, bit));
                        assert!(verifies(&f), "v6 {v6} bit {bit}: receiver accepts it");
                        let d = diff_bits(
                            &f[VNET_HDR_LEN + start..],
                            &original[VNET_HDR_LEN + start..],
                        );
                        assert_eq!(d, vec![bit as usize], "exactly the named bit");
                        // Headers are untouched but for a refreshed checksum.
                        let (ip, proto, _) = ip_header(&f[VNET_HDR_LEN..]).expect("ip");
                        let cs = VNET_HDR_LEN + ip + if proto == PROTO_TCP { 16 } else { 6 };
                        let headers = |g: &[u8]| {
                            let mut h = g[..VNET_HDR_LEN + start].to_vec();
                            h[cs..cs + 2].fill(0);
                            h
                        };
                        assert_eq!(headers(&f), headers(&original), "headers");
                    }
                    // Outside the payload: refused, nothing changed.
                    let mut f = original.clone();
                    assert!(!tamper_payload(&mut f, start, 8 * len as u32));
                    assert!(!tamper_payload(&mut f, start - 1, 0));
                    assert_eq!(f, original);
                }
            }
        }
    }

    #[test]
    fn udp_without_checksum_stays_without() {
        let mut f = udp_frame(false, 100);
        assert!(complete_checksum(&mut f));
        put16(&mut f[VNET_HDR_LEN..], 26, 0);
        let (start, _) = payload_span(&f[VNET_HDR_LEN..]).expect("span");
        assert!(tamper_payload(&mut f, start, 3));
        assert_eq!(get16(&f[VNET_HDR_LEN..], 26), 0);
    }

    #[test]
    fn tampered_super_packet_segments_all_verify() {
        for v6 in [false, true] {
            let frame = gso_frame(v6, 10 * 1448 + 100, 1448);
            let (l, _) = split_all(&frame);
            let hl = l.ip_hdr + l.tcp_hdr;
            // Segment 3, bit 5000 of its payload; the whole frame travels.
            let mut f = frame.clone();
            assert!(tamper_payload(&mut f, hl + 3 * 1448, 5000));
            assert!(
                !tamper_payload(&mut f, hl + 10 * 1448, 100 * 8),
                "past the end"
            );
            let (_, segs) = split_all(&f);
            let (_, clean) = split_all(&frame);
            for (i, (s, c)) in segs.iter().zip(&clean).enumerate() {
                assert!(verifies(s), "segment {i}");
                let d = diff_bits(s, c);
                assert_eq!(d.len(), usize::from(i == 3), "segment {i}: {d:?}");
            }
            // Without NEEDS_CSUM a super-packet's checksum cannot be fixed.
            let mut g = frame.clone();
            g[0] = 0;
            assert!(!tamper_payload(&mut g, hl, 0));
            assert_eq!(g[VNET_HDR_LEN..], frame[VNET_HDR_LEN..]);
        }
    }

    #[test]
    fn no_payload_span_for_fragments_or_other_protocols() {
        let f = gso_frame(false, 100, 1448);
        let mut p = f[VNET_HDR_LEN..].to_vec();
        assert_eq!(payload_span(&p), Some((52, 100)));
        put16(&mut p, 6, 0x2000); // more fragments
        assert_eq!(payload_span(&p), None);
        put16(&mut p, 6, 0);
        p[9] = 1; // ICMP
        assert_eq!(payload_span(&p), None);
        for n in 0..60 {
            let _ = payload_span(&f[VNET_HDR_LEN..VNET_HDR_LEN + n]);
        }
    }
}
