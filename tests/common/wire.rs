//! Frames as a spoofing or evading sender writes them: Ethernet + IPv4 + TCP with the checksums
//! a receiver verifies (or a wrong one, on purpose), IPv4 fragments of them, and a packet socket
//! that sends such frames on a link and reads what arrives there. Included by tests/common/mod.rs
//! and, through `#[path]`, by the dev crate's tests.
#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

pub const FIN: u8 = 0x01;
pub const SYN: u8 = 0x02;
pub const RST: u8 = 0x04;
pub const PSH: u8 = 0x08;
pub const ACK: u8 = 0x10;

/// The Internet checksum's folded one's-complement sum of `b` (an odd last byte padded), plus
/// `sum`.
fn fold(mut sum: u32, b: &[u8]) -> u16 {
    for c in b.chunks(2) {
        sum += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// A TCP segment from `src` to `dst`: 20 bytes of header, no options.
#[derive(Clone, Debug)]
pub struct Segment<'a> {
    pub src: (Ipv4Addr, u16),
    pub dst: (Ipv4Addr, u16),
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub payload: &'a [u8],
    /// A TCP checksum off by 0x0101, as a receiver's stack drops.
    pub corrupt: bool,
}

impl Segment<'_> {
    /// The TCP header and payload, with its checksum over the IPv4 pseudo-header.
    pub fn tcp(&self) -> Vec<u8> {
        let mut t = Vec::with_capacity(20 + self.payload.len());
        t.extend_from_slice(&self.src.1.to_be_bytes());
        t.extend_from_slice(&self.dst.1.to_be_bytes());
        t.extend_from_slice(&self.seq.to_be_bytes());
        t.extend_from_slice(&self.ack.to_be_bytes());
        t.extend_from_slice(&[0x50, self.flags, 0xff, 0xff, 0, 0, 0, 0]);
        t.extend_from_slice(self.payload);
        let (s, d) = (self.src.0.octets(), self.dst.0.octets());
        let pseudo = fold(6 + t.len() as u32, &[s, d].concat());
        let csum = !fold(pseudo as u32, &t) ^ if self.corrupt { 0x0101 } else { 0 };
        t[16..18].copy_from_slice(&csum.to_be_bytes());
        t
    }

    /// The segment in an Ethernet frame from MAC `from` to `to`, unfragmented (DF set).
    pub fn frame(&self, from: [u8; 6], to: [u8; 6]) -> Vec<u8> {
        ipv4_frame(from, to, self.src.0, self.dst.0, 6, 0x4000, &self.tcp())
    }

    /// The segment in IPv4 fragments (each a frame from `from` to `to`) whose payloads are at
    /// most `size` bytes (a multiple of 8): the TCP header in the first only.
    pub fn fragments(&self, from: [u8; 6], to: [u8; 6], size: usize) -> Vec<Vec<u8>> {
        fragments(from, to, (self.src.0, self.dst.0, 6), &self.tcp(), size)
    }
}

/// IPv4 fragments (each an Ethernet frame from `from` to `to`) of the packet of protocol
/// `addrs.2` from `addrs.0` to `addrs.1` whose payload is `l4`, each carrying at most `size`
/// bytes of it (a multiple of 8): the L4 header in the first only.
pub fn fragments(
    from: [u8; 6],
    to: [u8; 6],
    addrs: (Ipv4Addr, Ipv4Addr, u8),
    l4: &[u8],
    size: usize,
) -> Vec<Vec<u8>> {
    assert!(size % 8 == 0 && size > 0);
    let n = l4.len().div_ceil(size);
    (0..n)
        .map(|i| {
            let part = &l4[i * size..l4.len().min((i + 1) * size)];
            let more = if i + 1 < n { 0x2000 } else { 0 };
            let off = (i * size / 8) as u16;
            ipv4_frame(from, to, addrs.0, addrs.1, addrs.2, more | off, part)
        })
        .collect()
}

/// A UDP datagram as a sender may forge it: the IPv4 total length, UDP length and fragment
/// field given, not computed ([`Udp::honest`] computes them), `pad` zero bytes of Ethernet
/// padding after it. The IPv4 header checksum is right; the UDP checksum is 0 (none).
#[derive(Clone, Debug)]
pub struct Udp<'a> {
    pub src: (Ipv4Addr, u16),
    pub dst: (Ipv4Addr, u16),
    pub payload: &'a [u8],
    pub ip_len: u16,
    pub udp_len: u16,
    pub frag: u16,
    pub pad: usize,
}

impl<'a> Udp<'a> {
    /// Lengths that agree, no fragment bits, no padding.
    pub fn honest(src: (Ipv4Addr, u16), dst: (Ipv4Addr, u16), payload: &'a [u8]) -> Udp<'a> {
        Udp {
            src,
            dst,
            payload,
            ip_len: (20 + 8 + payload.len()) as u16,
            udp_len: (8 + payload.len()) as u16,
            frag: 0,
            pad: 0,
        }
    }

    /// The UDP header (its length as given, no checksum) and the payload.
    pub fn udp(&self) -> Vec<u8> {
        let mut u = Vec::with_capacity(8 + self.payload.len());
        u.extend_from_slice(&self.src.1.to_be_bytes());
        u.extend_from_slice(&self.dst.1.to_be_bytes());
        u.extend_from_slice(&self.udp_len.to_be_bytes());
        u.extend_from_slice(&[0, 0]);
        u.extend_from_slice(self.payload);
        u
    }

    /// The datagram in an Ethernet frame from MAC `from` to `to`.
    pub fn frame(&self, from: [u8; 6], to: [u8; 6]) -> Vec<u8> {
        let ip = (self.src.0, self.dst.0, 17, self.frag, self.ip_len);
        let mut f = ipv4_frame_with(from, to, ip, &self.udp());
        f.resize(f.len() + self.pad, 0);
        f
    }
}

/// An Ethernet frame carrying an IPv4 packet of protocol `proto` with flags and fragment offset
/// `frag` (0x4000: don't fragment; 0x2000: more fragments; the low 13 bits: offset / 8), its
/// total length that of the packet, its header checksum right.
pub fn ipv4_frame(
    from: [u8; 6],
    to: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    proto: u8,
    frag: u16,
    payload: &[u8],
) -> Vec<u8> {
    let total = (20 + payload.len()) as u16;
    ipv4_frame_with(from, to, (src, dst, proto, frag, total), payload)
}

/// [`ipv4_frame`] with the IPv4 total length given (`ip.4`), as a forger writes it: source,
/// destination, protocol, fragment field, total length.
fn ipv4_frame_with(
    from: [u8; 6],
    to: [u8; 6],
    ip: (Ipv4Addr, Ipv4Addr, u8, u16, u16),
    payload: &[u8],
) -> Vec<u8> {
    let (src, dst, proto, frag, total) = ip;
    let mut f = Vec::with_capacity(34 + payload.len());
    f.extend_from_slice(&to);
    f.extend_from_slice(&from);
    f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
    f.extend_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&[0x51, 0x7a]); // the identification (one datagram's fragments share it)
    f.extend_from_slice(&frag.to_be_bytes());
    f.extend_from_slice(&[64, proto, 0, 0]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    let csum = !fold(0, &f[14..34]);
    f[24..26].copy_from_slice(&csum.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A TCP segment read from a frame (IPv4, unfragmented).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub src: (Ipv4Addr, u16),
    pub dst: (Ipv4Addr, u16),
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub payload: Vec<u8>,
}

/// The TCP segment in Ethernet frame `f`, if it carries one.
pub fn parse_tcp(f: &[u8]) -> Option<Seen> {
    if f.len() < 34 || f[12..14] != [0x08, 0x00] || f[14] >> 4 != 4 || f[23] != 6 {
        return None;
    }
    let ihl = (f[14] & 15) as usize * 4;
    let tot = u16::from_be_bytes([f[16], f[17]]) as usize;
    let ip = f.get(14..14 + tot)?;
    let t = ip.get(ihl..)?;
    let off = (*t.get(12)? >> 4) as usize * 4;
    let a = |i: usize| Ipv4Addr::new(ip[i], ip[i + 1], ip[i + 2], ip[i + 3]);
    let be16 = |i: usize| u16::from_be_bytes([t[i], t[i + 1]]);
    let be32 = |i: usize| u32::from_be_bytes([t[i], t[i + 1], t[i + 2], t[i + 3]]);
    Some(Seen {
        src: (a(12), be16(0)),
        dst: (a(16), be16(2)),
        seq: be32(4),
        ack: be32(8),
        flags: t[13],
        payload: t.get(off..)?.to_vec(),
    })
}

/// The MAC address of link `dev` in namespace `ns` (this one when `None`), per `ip -br link`.
pub fn mac(ns: Option<&str>, dev: &str) -> [u8; 6] {
    let mut cmd = std::process::Command::new("ip");
    if let Some(ns) = ns {
        cmd.args(["-n", ns]);
    }
    let out = cmd.args(["-br", "link", "show", dev]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let word = text
        .split_whitespace()
        .nth(2)
        .unwrap_or_else(|| panic!("no MAC for {dev}: {text}"));
    let mut m = [0u8; 6];
    for (b, h) in m.iter_mut().zip(word.split(':')) {
        *b = u8::from_str_radix(h, 16).unwrap();
    }
    m
}

/// A packet socket on one link (of the namespace of the thread that opened it): whole Ethernet
/// frames out, and the IPv4 frames that arrive in.
pub struct PacketSocket {
    fd: OwnedFd,
    ifindex: i32,
}

impl PacketSocket {
    /// Opens it on link `dev` (needs CAP_NET_RAW).
    pub fn open(dev: &str) -> PacketSocket {
        let proto = (libc::ETH_P_IP as u16).to_be();
        // SAFETY: plain socket calls; the fd is owned from here on.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, proto as i32) };
        assert!(fd >= 0, "AF_PACKET: {}", std::io::Error::last_os_error());
        // SAFETY: fd was just returned by socket().
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let ifindex = super::netns::ifindex(dev);
        // SAFETY: an initialised sockaddr_ll of its own size.
        let rc = unsafe {
            let mut sa: libc::sockaddr_ll = std::mem::zeroed();
            sa.sll_family = libc::AF_PACKET as u16;
            sa.sll_protocol = proto;
            sa.sll_ifindex = ifindex;
            libc::bind(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(rc, 0, "bind: {}", std::io::Error::last_os_error());
        PacketSocket { fd, ifindex }
    }

    /// Sends one whole frame.
    pub fn send(&self, frame: &[u8]) {
        // SAFETY: frame is a valid buffer of its length.
        let n = unsafe {
            let mut sa: libc::sockaddr_ll = std::mem::zeroed();
            sa.sll_family = libc::AF_PACKET as u16;
            sa.sll_ifindex = self.ifindex;
            sa.sll_halen = 6;
            sa.sll_addr[..6].copy_from_slice(&frame[..6]);
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&sa as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(
            n,
            frame.len() as isize,
            "sendto: {}",
            std::io::Error::last_os_error()
        );
    }

    /// The next arriving frame (not one this host sent) within `timeout`.
    pub fn recv(&self, timeout: Duration) -> Option<Vec<u8>> {
        let end = Instant::now() + timeout;
        let mut buf = vec![0u8; 65_536];
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let mut p = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd; then a buffer of its length and a sockaddr_ll of its size.
            let (ready, n, kind) = unsafe {
                let ready = libc::poll(&mut p, 1, left.as_millis().max(1) as i32);
                if ready <= 0 {
                    (ready, 0, 0)
                } else {
                    let mut sa: libc::sockaddr_ll = std::mem::zeroed();
                    let mut len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
                    let n = libc::recvfrom(
                        self.fd.as_raw_fd(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        0,
                        (&mut sa as *mut libc::sockaddr_ll).cast(),
                        &mut len,
                    );
                    (ready, n, sa.sll_pkttype)
                }
            };
            if ready > 0 && n > 0 && kind != libc::PACKET_OUTGOING {
                return Some(buf[..n as usize].to_vec());
            }
        }
    }

    /// The next TCP segment arriving from `from` to `to` within `timeout`.
    pub fn recv_tcp(
        &self,
        from: (Ipv4Addr, u16),
        to: (Ipv4Addr, u16),
        timeout: Duration,
    ) -> Option<Seen> {
        let end = Instant::now() + timeout;
        loop {
            let f = self.recv(end.saturating_duration_since(Instant::now()))?;
            match parse_tcp(&f) {
                Some(s) if s.src == from && s.dst == to => return Some(s),
                _ => continue,
            }
        }
    }
}
