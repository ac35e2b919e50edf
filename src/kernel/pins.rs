//! The event path pinned in the BPF filesystem, so that it outlives the process that loaded it:
//! pinning an operator object's event path ([`Ops::pin_events`]), reading its state back from
//! the pins in any later process ([`PinnedEvents::open`]) and removing it ([`remove`]).
//!
//! What is pinned, under one directory: the maps the event path needs beyond its programs'
//! references (`arena`; `bss`, the configuration and counters; `ev_slots`, whose workqueue items
//! the kernel cancels once no user reference to the map is left; `tokens`, the ring buffer), the
//! programs `ev_xdp` and `ev_setup` (whose callback the workqueue items run) and the XDP link
//! (`link`), which keeps the program attached after every file descriptor is closed.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use libbpf_rs::libbpf_sys;
use libbpf_rs::{MapCore, MapFlags, MapHandle};

use super::ops::skel::types::{bss, ev_slot};
use super::ops::Ops;
use crate::{Error, Result};

/// Where the BPF filesystem is mounted.
pub const BPFFS: &str = "/sys/fs/bpf";
/// `BPF_FS_MAGIC`, the BPF filesystem's `statfs` type.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// The maps pinned, by file name: each is the map of the same name in `ops.bpf.c` (`bss` is
/// its `.bss`).
pub const MAP_PINS: [&str; 4] = ["arena", "bss", "ev_slots", "tokens"];
/// The programs pinned.
pub const PROG_PINS: [&str; 2] = ["ev_xdp", "ev_setup"];
/// The XDP link's pin.
pub const LINK_PIN: &str = "link";

/// How the XDP program is attached (the `XDP_FLAGS_*_MODE` of the link).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum XdpMode {
    /// The driver's mode where it has one, else generic (the kernel's choice).
    #[default]
    Auto,
    /// Generic (skb) mode: every interface, after the socket buffer is built.
    Generic,
    /// Native (driver) mode: the driver runs the program on the frame; refused by interfaces
    /// without XDP support.
    Native,
}

impl XdpMode {
    fn flags(self) -> u32 {
        match self {
            XdpMode::Auto => 0,
            XdpMode::Generic => libbpf_sys::XDP_FLAGS_SKB_MODE,
            XdpMode::Native => libbpf_sys::XDP_FLAGS_DRV_MODE,
        }
    }
}

fn c_path(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| Error::Invalid(format!("path {} holds a NUL byte", p.display())))
}

/// Whether `path` is on a BPF filesystem.
pub fn is_bpffs(path: &Path) -> bool {
    let Ok(c) = c_path(path) else { return false };
    // SAFETY: a zeroed statfs filled by the call; c is NUL-terminated.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == BPF_FS_MAGIC
    }
}

/// Makes sure the BPF filesystem is mounted at [`BPFFS`], mounting it if it is not;
/// [`Error::Bpffs`] when it is not and cannot be.
pub fn ensure_bpffs() -> Result<()> {
    let root = Path::new(BPFFS);
    if is_bpffs(root) {
        return Ok(());
    }
    let fail = |source: std::io::Error| Error::Bpffs {
        path: root.to_path_buf(),
        source,
    };
    if !root.is_dir() {
        return Err(fail(std::io::Error::from(std::io::ErrorKind::NotFound)));
    }
    let (src, dst, ty) = (c"bpf", c_path(root)?, c"bpf");
    // SAFETY: NUL-terminated strings; no mount data.
    let rc = unsafe { libc::mount(src.as_ptr(), dst.as_ptr(), ty.as_ptr(), 0, std::ptr::null()) };
    if rc != 0 {
        return Err(fail(std::io::Error::last_os_error()));
    }
    if !is_bpffs(root) {
        return Err(fail(std::io::Error::other(
            "mounted, but statfs does not see a BPF filesystem",
        )));
    }
    log::info!("mounted the BPF filesystem at {BPFFS}");
    Ok(())
}

fn pin_fd(fd: i32, path: &Path) -> Result<()> {
    let c = c_path(path)?;
    // SAFETY: a live BPF object fd and a NUL-terminated path.
    if unsafe { libbpf_sys::bpf_obj_pin(fd, c.as_ptr()) } != 0 {
        return Err(Error::Bpf {
            what: format!("pinning {}", path.display()),
            detail: std::io::Error::last_os_error().to_string(),
        });
    }
    Ok(())
}

fn get_pinned(path: &Path) -> Result<OwnedFd> {
    let c = c_path(path)?;
    // SAFETY: a NUL-terminated path; a non-negative result is a new fd we own.
    let fd = unsafe { libbpf_sys::bpf_obj_get(c.as_ptr()) };
    if fd < 0 {
        return Err(Error::Bpf {
            what: format!("opening the pin {}", path.display()),
            detail: std::io::Error::last_os_error().to_string(),
        });
    }
    // SAFETY: see above.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Ops {
    /// Attaches the event path's XDP program (configured by [`Ops::configure_events`]) to
    /// `ifindex` in `mode` and pins it, its link and the maps it needs under `dir` (see
    /// [`pin_attached`]).
    pub(crate) fn pin_events(&mut self, ifindex: u32, mode: XdpMode, dir: &Path) -> Result<()> {
        let s = &self.skel;
        let maps = [
            s.maps.arena.as_fd().as_raw_fd(),
            s.maps.bss.as_fd().as_raw_fd(),
            s.maps.ev_slots.as_fd().as_raw_fd(),
            s.maps.tokens.as_fd().as_raw_fd(),
        ];
        let progs = [
            s.progs.ev_xdp.as_fd().as_raw_fd(),
            s.progs.ev_setup.as_fd().as_raw_fd(),
        ];
        pin_attached(
            "the event path's XDP program",
            progs[0],
            ifindex,
            mode,
            dir,
            &MAP_PINS.iter().copied().zip(maps).collect::<Vec<_>>(),
            &PROG_PINS.iter().copied().zip(progs).collect::<Vec<_>>(),
        )
    }
}

/// Attaches XDP program `xdp` (`what`, for errors) to `ifindex` in `mode` and pins it, the
/// `maps` and `progs` (file name, fd) and the link ([`LINK_PIN`]) under `dir`, which must exist
/// and be empty: from then on it runs without this process. On failure it removes what it
/// pinned (the program is detached when the link's fd closes).
pub(crate) fn pin_attached(
    what: &str,
    xdp: i32,
    ifindex: u32,
    mode: XdpMode,
    dir: &Path,
    maps: &[(&str, i32)],
    progs: &[(&str, i32)],
) -> Result<()> {
    let mut opts: libbpf_sys::bpf_link_create_opts = Default::default();
    opts.sz = std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _;
    opts.flags = mode.flags();
    // SAFETY: a loaded XDP program's fd and a sized, zero-initialised opts.
    let fd = unsafe { libbpf_sys::bpf_link_create(xdp, ifindex as i32, libbpf_sys::BPF_XDP, &opts) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(Error::Bpf {
            what: format!("attaching {what} to interface {ifindex} ({mode:?} mode)"),
            detail: match e.raw_os_error() {
                Some(libc::EBUSY) | Some(libc::EEXIST) => {
                    format!("{e}: the interface has an XDP program already")
                }
                Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) if mode == XdpMode::Native => {
                    format!("{e}: the driver has no native XDP")
                }
                _ => e.to_string(),
            },
        });
    }
    // SAFETY: a new link fd we own; closing it detaches the program unless pinned.
    let link = unsafe { OwnedFd::from_raw_fd(fd) };
    let all: Vec<(&str, i32)> = maps
        .iter()
        .chain(progs)
        .copied()
        .chain([(LINK_PIN, link.as_raw_fd())])
        .collect();
    for &(name, fd) in &all {
        if let Err(e) = pin_fd(fd, &dir.join(name)) {
            for (n, _) in &all {
                let _ = std::fs::remove_file(dir.join(n));
            }
            return Err(e);
        }
    }
    Ok(())
}

/// Opens the map pinned at `p`; [`Error::LostPin`] when it is missing.
pub(crate) fn open_map(p: &Path) -> Result<MapHandle> {
    if !p.exists() {
        return Err(Error::LostPin { path: p.into() });
    }
    MapHandle::from_pinned_path(p).map_err(|e| Error::Bpf {
        what: format!("opening the pin {}", p.display()),
        detail: e.to_string(),
    })
}

/// Refuses a pinned `.bss` (at `path`) of another size than this build's.
pub(crate) fn check_bss_size(bss: &MapHandle, path: &Path) -> Result<()> {
    if bss.value_size() as usize != std::mem::size_of::<bss>() {
        return Err(Error::Bpf {
            what: format!("the pin {}", path.display()),
            detail: format!(
                "a .bss of {} bytes, not this build's {}: installed by another version",
                bss.value_size(),
                std::mem::size_of::<bss>()
            ),
        });
    }
    Ok(())
}

/// The pinned `.bss` of the installation in `dir`, read with one map lookup.
pub(crate) fn read_bss(map: &MapHandle, dir: &Path) -> Result<Box<bss>> {
    let err = |e: String| Error::Bpf {
        what: format!("reading the .bss of {}", dir.display()),
        detail: e,
    };
    let raw = map
        .lookup(&0u32.to_ne_bytes(), MapFlags::ANY)
        .map_err(|e| err(e.to_string()))?
        .ok_or_else(|| err("no element 0".into()))?;
    if raw.len() != std::mem::size_of::<bss>() {
        return Err(err(format!("{} bytes", raw.len())));
    }
    // SAFETY: `bss` is a repr(C) struct of integers (any bit pattern is a value) and raw
    // holds exactly its size.
    Ok(Box::new(unsafe { std::ptr::read_unaligned(raw.as_ptr().cast()) }))
}

/// An event path pinned under a directory, opened from its pins.
#[derive(Debug)]
pub struct PinnedEvents {
    dir: PathBuf,
    bss: MapHandle,
    arena: MapHandle,
    slots: MapHandle,
}

/// What the pins say.
#[derive(Debug, Clone)]
pub struct PinnedState {
    /// The object's `.bss`: the configuration (`ev_cfg`) and the counters.
    pub bss: Box<bss>,
    /// Each configured slot's state (`EV_FREE` 0, `EV_BUSY` 1, `EV_DONE` 2, `EV_CLAIMED` 3).
    pub slot_states: Vec<u32>,
    /// The arena's bytes: the kernel memory the model holds.
    pub arena_bytes: u64,
    /// The arena map's id (`bpftool map show id N`).
    pub arena_id: u32,
}

impl PinnedEvents {
    /// Opens the pins under `dir`; [`Error::LostPin`] names the first that is missing.
    pub fn open(dir: &Path) -> Result<PinnedEvents> {
        for name in PROG_PINS.iter().chain([&LINK_PIN]) {
            if !dir.join(name).exists() {
                return Err(Error::LostPin {
                    path: dir.join(name),
                });
            }
        }
        let map = |name: &str| open_map(&dir.join(name));
        let (bss, arena, slots) = (map("bss")?, map("arena")?, map("ev_slots")?);
        map("tokens")?;
        check_bss_size(&bss, &dir.join("bss"))?;
        Ok(PinnedEvents {
            dir: dir.to_path_buf(),
            bss,
            arena,
            slots,
        })
    }

    /// Reads the state: the `.bss` (one map lookup), each slot's state, the arena's size and id.
    pub fn state(&self) -> Result<PinnedState> {
        let err = |what: &str, e: String| Error::Bpf {
            what: format!("reading {} of {}", what, self.dir.display()),
            detail: e,
        };
        let bss = read_bss(&self.bss, &self.dir)?;
        let n = (bss.ev_cfg.n_slots as usize).min(self.slots.max_entries() as usize);
        let mut slot_states = Vec::with_capacity(n);
        for i in 0..n as u32 {
            let v = self
                .slots
                .lookup(&i.to_ne_bytes(), MapFlags::ANY)
                .map_err(|e| err("a slot", e.to_string()))?
                .ok_or_else(|| err("a slot", format!("no element {i}")))?;
            if v.len() < std::mem::size_of::<ev_slot>() {
                return Err(err("a slot", format!("{} bytes", v.len())));
            }
            // SAFETY: as above, for ev_slot (its bpf_wq is opaque integers).
            let s: ev_slot = unsafe { std::ptr::read_unaligned(v.as_ptr().cast()) };
            slot_states.push(s.state);
        }
        let info = self
            .arena
            .info()
            .map_err(|e| err("the arena's info", e.to_string()))?;
        Ok(PinnedState {
            bss,
            slot_states,
            arena_bytes: info.info.max_entries as u64 * super::arena::PAGE as u64,
            arena_id: info.info.id,
        })
    }
}

/// Detaches the XDP link pinned under `dir` and removes every pin and the directory. What the
/// pins held is freed by the kernel once nothing else refers to it. Missing pins are skipped.
pub fn remove(dir: &Path) -> Result<()> {
    let link = dir.join(LINK_PIN);
    if link.exists() {
        let fd = get_pinned(&link)?;
        // SAFETY: a link fd we own.
        if unsafe { libbpf_sys::bpf_link_detach(fd.as_raw_fd()) } != 0 {
            let e = std::io::Error::last_os_error();
            // ENOLINK: already detached (its interface went away)
            if e.raw_os_error() != Some(libc::ENOLINK) {
                return Err(Error::Bpf {
                    what: format!("detaching the XDP link {}", link.display()),
                    detail: e.to_string(),
                });
            }
        }
    }
    // every pin of either kind of installation (the event path's, the filter's)
    let names = [LINK_PIN]
        .into_iter()
        .chain(PROG_PINS)
        .chain(MAP_PINS)
        .chain(super::filter::PROG_PINS)
        .chain(super::filter::MAP_PINS);
    for name in names {
        match std::fs::remove_file(dir.join(name)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io(dir.join(name), e))
            }
            _ => {}
        }
    }
    std::fs::remove_dir(dir).map_err(|e| Error::io(dir, e))
}

/// Whether a BPF map with id `id` exists (false once the kernel has freed it).
pub fn map_exists(id: u32) -> bool {
    MapHandle::from_map_id(id).is_ok()
}
