//! A network namespace with a veth pair into it, for the tests and benches that need a real link
//! (native XDP on a veth end): [`Veth::new`] makes it, dropping it deletes both, so that a failing
//! test leaves no namespace or link behind. Included by tests/common/mod.rs and, through
//! `#[path]`, by benches.
#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::process::Command;

/// Runs `ip ARGS`, panicking with its stderr when it fails.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Namespace `ns` with a veth pair: `host` in this namespace with `a.b.c.1/24`, `peer` in `ns`
/// with `a.b.c.2/24` (and `ns`'s `lo` up). Deleted, with the pair, when dropped.
pub struct Veth {
    /// The namespace.
    pub ns: &'static str,
    /// The end in the caller's namespace.
    pub host: &'static str,
    /// The end in `ns`.
    pub peer: &'static str,
    /// `host`'s address.
    pub host_addr: Ipv4Addr,
    /// `peer`'s address.
    pub peer_addr: Ipv4Addr,
}

impl Veth {
    /// Makes the namespace and the pair (any left by a killed run are deleted first).
    pub fn new(ns: &'static str, host: &'static str, peer: &'static str, net: [u8; 3]) -> Veth {
        let _ = Command::new("ip").args(["netns", "del", ns]).output();
        let _ = Command::new("ip").args(["link", "del", host]).output();
        ip(&["netns", "add", ns]);
        // from here on, a panic deletes what was made
        let v = Veth {
            ns,
            host,
            peer,
            host_addr: Ipv4Addr::new(net[0], net[1], net[2], 1),
            peer_addr: Ipv4Addr::new(net[0], net[1], net[2], 2),
        };
        ip(&[
            "link", "add", host, "type", "veth", "peer", "name", peer, "netns", ns,
        ]);
        ip(&["addr", "add", &format!("{}/24", v.host_addr), "dev", host]);
        ip(&["link", "set", host, "up"]);
        ip(&[
            "-n",
            ns,
            "addr",
            "add",
            &format!("{}/24", v.peer_addr),
            "dev",
            peer,
        ]);
        ip(&["-n", ns, "link", "set", peer, "up"]);
        ip(&["-n", ns, "link", "set", "lo", "up"]);
        v
    }

    /// Runs `f` on a thread inside the namespace.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        in_netns(self.ns, f)
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        // deleting the namespace deletes `peer`, and so the pair; `host` too, in case
        let _ = Command::new("ip").args(["netns", "del", self.ns]).output();
        let _ = Command::new("ip").args(["link", "del", self.host]).output();
    }
}

/// The index of link `dev` in the calling thread's namespace (panics when there is none).
pub fn ifindex(dev: &str) -> i32 {
    let name = std::ffi::CString::new(dev).unwrap();
    // SAFETY: a NUL-terminated name.
    let i = unsafe { libc::if_nametoindex(name.as_ptr()) } as i32;
    assert!(i > 0, "no link {dev}");
    i
}

/// Whether link `dev` exists in this namespace.
pub fn link_exists(dev: &str) -> bool {
    Command::new("ip")
        .args(["link", "show", dev])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Whether namespace `ns` exists.
pub fn netns_exists(ns: &str) -> bool {
    std::path::Path::new("/var/run/netns").join(ns).exists()
}

/// Runs `f` on a thread inside network namespace `ns`.
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(format!("/var/run/netns/{ns}")).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns on this thread only, with an open namespace file.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .unwrap()
    })
}

/// Whether `dev` has an XDP program attached in native (driver) mode, per `ip link show`.
pub fn native_xdp(dev: &str) -> bool {
    let out = Command::new("ip")
        .args(["link", "show", dev])
        .output()
        .unwrap();
    let link = String::from_utf8_lossy(&out.stdout);
    link.contains(" xdp ") && !link.contains("xdpgeneric")
}

/// Loads a program that passes every frame (`r0 = XDP_PASS; exit`) and attaches it in native mode
/// to interface `ifindex` of the calling thread's namespace; the attachment holds the program.
/// A veth delivers the frames its peer sends with XDP_TX only when it has an XDP program of its
/// own (its NAPI and XDP ring exist only then), and a veth end with a program receives through
/// that path: the baseline of a native XDP program on it.
pub fn attach_xdp_pass(ifindex: i32) {
    use libbpf_rs::libbpf_sys;
    let insns: [[u8; 8]; 2] = [[0xb7, 0, 0, 0, 2, 0, 0, 0], [0x95, 0, 0, 0, 0, 0, 0, 0]];
    // SAFETY: two valid instructions, a NUL-terminated licence; a non-negative result is an fd.
    let fd = unsafe {
        libbpf_sys::bpf_prog_load(
            libbpf_sys::BPF_PROG_TYPE_XDP,
            c"pass".as_ptr(),
            c"GPL".as_ptr(),
            insns.as_ptr().cast(),
            2,
            std::ptr::null_mut(),
        )
    };
    assert!(
        fd >= 0,
        "loading the pass program: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: the program's fd, no options; then our fd, closed once.
    let rc = unsafe {
        let rc = libbpf_sys::bpf_xdp_attach(
            ifindex,
            fd,
            libbpf_sys::XDP_FLAGS_DRV_MODE,
            std::ptr::null(),
        );
        libc::close(fd);
        rc
    };
    assert_eq!(rc, 0, "attaching the pass program to interface {ifindex}");
}

/// Turns transmit checksum offload off on link `dev` of the calling thread's namespace (what
/// `ethtool -K DEV tx off` does, through the same ioctl), so that the TCP segments its sockets
/// send carry full checksums: a veth otherwise hands its peer segments whose checksum is only
/// partly computed, which the packet filter, checking every segment it reads, drops.
pub fn tx_checksum_off(dev: &str) {
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    const ETHTOOL_STXCSUM: u32 = 0x17;
    let mut value = EthtoolValue {
        cmd: ETHTOOL_STXCSUM,
        data: 0,
    };
    // SAFETY: an ifreq with a NUL-terminated name (checked to fit) whose data points at a live
    // ethtool_value; the socket is closed here.
    let rc = unsafe {
        let mut req: libc::ifreq = std::mem::zeroed();
        assert!(dev.len() < req.ifr_name.len(), "interface name {dev}");
        for (d, s) in req.ifr_name.iter_mut().zip(dev.bytes()) {
            *d = s as libc::c_char;
        }
        req.ifr_ifru.ifru_data = (&mut value as *mut EthtoolValue).cast();
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let rc = libc::ioctl(fd, libc::SIOCETHTOOL, &mut req);
        libc::close(fd);
        rc
    };
    assert_eq!(
        rc,
        0,
        "turning tx checksum offload off on {dev}: {}",
        std::io::Error::last_os_error()
    );
}
