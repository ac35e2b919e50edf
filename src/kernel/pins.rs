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
use libbpf_rs::skel::Skel;

use super::ops::Ops;
use crate::{Error, Result};

/// Where the BPF filesystem is mounted.
pub const BPFFS: &str = "/sys/fs/bpf";
/// `BPF_FS_MAGIC`, the BPF filesystem's `statfs` type.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// What one kind of installation pins under its directory, by file name: the programs (the XDP
/// program first, then the workqueue setup its slots need), the maps they use (each the map of
/// the same name in `ops.bpf.c`; `bss` is its `.bss`) and the XDP link ([`LINK_PIN`]).
#[derive(Debug)]
pub struct PinSet {
    /// The kind, for messages: "the event path", "the filter".
    pub what: &'static str,
    /// The programs, the XDP program first.
    pub progs: &'static [&'static str],
    /// The maps.
    pub maps: &'static [&'static str],
    /// A tc program (one of `progs`) attached to the egress of the same interface (tcx), its
    /// link pinned as [`EGRESS_LINK_PIN`].
    pub egress: Option<&'static str>,
}

/// A model installed in the kernel (`src/bpf/event.inc.c`, `event_xdp.inc.c`).
pub const EVENT_PINS: PinSet = PinSet {
    what: "the event path",
    progs: &["ev_xdp", "ev_setup"],
    maps: &["arena", "bss", "ev_slots", "tokens"],
    egress: None,
};

/// A packet filter (`src/bpf/filter.inc.c`, `filter_xdp.inc.c`).
pub const FILTER_PINS: PinSet = PinSet {
    what: "the filter",
    progs: &["flt_xdp", "flt_setup", "flt_egress"],
    maps: &["arena", "bss", "flt_slots", "flt_flows", "flt_syns", "flt_log"],
    egress: Some("flt_egress"),
};

/// Every kind of installation.
pub const PIN_SETS: [&PinSet; 2] = [&EVENT_PINS, &FILTER_PINS];

/// The XDP link's pin.
pub const LINK_PIN: &str = "link";

/// The egress (tcx) link's pin, for an installation that has one ([`PinSet::egress`]).
pub const EGRESS_LINK_PIN: &str = "egress_link";

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
    let (src, dst, ty, data) = (c"bpf", c_path(root)?, c"bpf", c"mode=0700");
    // SAFETY: NUL-terminated strings. `mode=0700`: only root reaches what is pinned (the kernel's
    // default is 1777), as systemd mounts it.
    let rc = unsafe {
        libc::mount(src.as_ptr(), dst.as_ptr(), ty.as_ptr(), 0, data.as_ptr().cast())
    };
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

/// Refuses `dir` unless it is a directory (not a symbolic link) owned by this process's user and
/// writable by no one else: what lets root pin into it, and later remove from it, without a
/// local user swapping it for a link to somewhere else or filling it first.
pub fn check_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let refuse = |reason: String| Error::UnsafePinDir {
        path: dir.into(),
        reason,
    };
    let m = std::fs::symlink_metadata(dir).map_err(|e| Error::io(dir, e))?;
    if m.file_type().is_symlink() {
        return Err(refuse("it is a symbolic link".into()));
    }
    if !m.is_dir() {
        return Err(refuse("it is not a directory".into()));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if m.uid() != me {
        return Err(refuse(format!("it is owned by uid {}, not {me}", m.uid())));
    }
    if m.mode() & 0o022 != 0 {
        return Err(refuse(format!(
            "others may write in it (mode {:o})",
            m.mode() & 0o7777
        )));
    }
    Ok(())
}

/// Creates the installation directory `dir` in the pin root `root` (itself made if missing),
/// both mode 0700, and checks both with [`check_private_dir`]. `Ok(false)` when `dir` exists
/// already (an installation of that name), and nothing is changed.
pub fn create_install_dir(root: &Path, dir: &Path) -> Result<bool> {
    use std::os::unix::fs::DirBuilderExt;
    let mut b = std::fs::DirBuilder::new();
    b.mode(0o700);
    match b.create(root) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(Error::io(root, e))
        }
        _ => {}
    }
    check_private_dir(root)?;
    // mkdir does not follow a symbolic link in its last component: a link planted at `dir`
    // fails here as "exists".
    match b.create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
        Err(e) => return Err(Error::io(dir, e)),
    }
    check_private_dir(dir)?;
    Ok(true)
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
    /// Attaches the XDP program of `set` (configured by [`Ops::configure_events`] or
    /// `configure_filter`) to `ifindex` in `mode` and pins it, the other programs and maps of
    /// `set` and the link under `dir` (see [`pin_attached`]).
    pub(crate) fn pin(&mut self, set: &PinSet, ifindex: u32, mode: XdpMode, dir: &Path) -> Result<()> {
        for p in set.progs {
            self.require(p)?;
        }
        let obj = self.skel(set.what)?.object();
        let fd_of = |kind: &str, name: &'static str, fd: Option<i32>| {
            fd.ok_or_else(|| Error::Bpf {
                what: format!("pinning {}", set.what),
                detail: format!("no {kind} `{name}` in ops.bpf.c"),
            })
            .map(|fd| (name, fd))
        };
        let progs = set
            .progs
            .iter()
            .map(|&n| {
                let fd = obj.progs().find(|p| p.name() == n).map(|p| p.as_fd().as_raw_fd());
                fd_of("program", n, fd)
            })
            .collect::<Result<Vec<_>>>()?;
        let maps = set
            .maps
            .iter()
            .map(|&n| {
                // the .bss map's name is the object's name and ".bss", cut to 15 bytes
                let fd = obj
                    .maps()
                    .find(|m| m.name() == n || (n == "bss" && m.name().to_string_lossy().ends_with(".bss")))
                    .map(|m| m.as_fd().as_raw_fd());
                fd_of("map", n, fd)
            })
            .collect::<Result<Vec<_>>>()?;
        // the egress program is one of `progs`, whose fds were found above
        let egress = set.egress.and_then(|e| progs.iter().find(|p| p.0 == e)).map(|p| p.1);
        pin_attached(set.what, progs[0].1, egress, ifindex, mode, dir, &maps, &progs)
    }
}

/// Attaches XDP program `xdp` (of `what`, for errors) to `ifindex` in `mode`, and tc program
/// `egress` to its egress when given, and pins them, the `maps` and `progs` (file name, fd) and
/// the links ([`LINK_PIN`], [`EGRESS_LINK_PIN`]) under `dir`, which must exist and be empty:
/// from then on it runs without this process. On failure it removes what it pinned (the
/// programs are detached when the links' fds close).
#[allow(clippy::too_many_arguments)]
pub(crate) fn pin_attached(
    what: &str,
    xdp: i32,
    egress: Option<i32>,
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
            what: format!("attaching {what}'s XDP program to interface {ifindex} ({mode:?} mode)"),
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
    let egress_link = match egress {
        Some(prog) => Some(attach_egress(what, prog, ifindex)?),
        None => None,
    };
    let all: Vec<(&str, i32)> = maps
        .iter()
        .chain(progs)
        .copied()
        .chain([(LINK_PIN, link.as_raw_fd())])
        .chain(egress_link.as_ref().map(|l| (EGRESS_LINK_PIN, l.as_raw_fd())))
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

/// Attaches tc program `prog` to the egress of `ifindex` (tcx, Linux >= 6.6): its link.
fn attach_egress(what: &str, prog: i32, ifindex: u32) -> Result<OwnedFd> {
    let mut opts: libbpf_sys::bpf_link_create_opts = Default::default();
    opts.sz = std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _;
    // SAFETY: a loaded tc program's fd and a sized, zero-initialised opts.
    let fd = unsafe {
        libbpf_sys::bpf_link_create(prog, ifindex as i32, libbpf_sys::BPF_TCX_EGRESS, &opts)
    };
    if fd < 0 {
        return Err(Error::Bpf {
            what: format!("attaching {what}'s tc program to the egress of interface {ifindex}"),
            detail: format!("{} (tcx links need Linux >= 6.6)", std::io::Error::last_os_error()),
        });
    }
    // SAFETY: a new link fd we own; closing it detaches the program unless pinned.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
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

/// Opens the maps of `set` pinned under `dir`, in `set.maps`' order, after checking that its
/// programs and link are pinned too and that its `.bss` is this build's; [`Error::LostPin`]
/// names the first pin that is missing.
pub(crate) fn open_set(set: &PinSet, dir: &Path) -> Result<Vec<MapHandle>> {
    for name in set.progs.iter().chain([&LINK_PIN]).chain(set.egress.map(|_| &EGRESS_LINK_PIN)) {
        if !dir.join(name).exists() {
            return Err(Error::LostPin {
                path: dir.join(name),
            });
        }
    }
    let maps = set
        .maps
        .iter()
        .map(|n| open_map(&dir.join(n)))
        .collect::<Result<Vec<_>>>()?;
    if let Some(i) = set.maps.iter().position(|&n| n == "bss") {
        check_bss_size(&maps[i], &dir.join("bss"))?;
    }
    Ok(maps)
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
        // EVENT_PINS.maps: arena, bss, ev_slots, tokens
        let [arena, bss, slots, _tokens]: [MapHandle; 4] = open_set(&EVENT_PINS, dir)?
            .try_into()
            .expect("EVENT_PINS has four maps");
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

/// Opens directory `dir` without following a symbolic link at it (`O_NOFOLLOW`), and checks the
/// directory opened (fstat, as [`check_private_dir`] checks a path): every later step works on
/// this descriptor (`*at` calls), so the path cannot be swapped in between.
fn open_private_dir(dir: &Path) -> Result<OwnedFd> {
    let refuse = |reason: String| Error::UnsafePinDir {
        path: dir.into(),
        reason,
    };
    check_private_dir(dir)?; // the reasons, by path; then the same on what was opened
    let c = c_path(dir)?;
    // SAFETY: a NUL-terminated path; the flags open a directory for *at calls only.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            // swapped since the check
            Some(libc::ELOOP | libc::ENOTDIR) => {
                refuse("it is a symbolic link or not a directory".into())
            }
            _ => Error::io(dir, e),
        });
    }
    // SAFETY: a new descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: a zeroed stat for fstat to fill, and a live descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(Error::io(dir, std::io::Error::last_os_error()));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if st.st_uid != me {
        return Err(refuse(format!("it is owned by uid {}, not {me}", st.st_uid)));
    }
    if st.st_mode & 0o022 != 0 {
        return Err(refuse(format!(
            "others may write in it (mode {:o})",
            st.st_mode & 0o7777
        )));
    }
    Ok(fd)
}

/// `unlinkat(dirfd, name, flags)`.
fn unlink_at(dirfd: &OwnedFd, name: &std::ffi::OsStr, flags: i32) -> std::io::Result<()> {
    let c = CString::new(name.as_bytes()).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    // SAFETY: a live directory descriptor and a NUL-terminated name.
    if unsafe { libc::unlinkat(dirfd.as_raw_fd(), c.as_ptr(), flags) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Detaches the XDP link pinned under `dir` and removes every pin and the directory. What the
/// pins held is freed by the kernel once nothing else refers to it. Missing pins are skipped; a
/// pin that cannot be removed does not stop the others: the first such error is returned after
/// every pin was tried. `dir` and its parent must be private directories (see
/// [`check_private_dir`]); both are opened once, without following a symbolic link, and every
/// pin is removed through them (`unlinkat`), so nothing outside `dir` can be reached by swapping
/// a path while it runs.
pub fn remove(dir: &Path) -> Result<()> {
    let (parent, leaf) = match (dir.parent(), dir.file_name()) {
        (Some(p), Some(l)) => (p, l),
        _ => return Err(Error::Invalid(format!("{}: not a pin directory", dir.display()))),
    };
    let pfd = open_private_dir(parent)?;
    let dfd = open_private_dir(dir)?;
    for name in [LINK_PIN, EGRESS_LINK_PIN] {
        let link = dir.join(name);
        if !link.exists() {
            continue;
        }
        let fd = get_pinned(&link)?;
        // SAFETY: a link fd we own.
        if unsafe { libbpf_sys::bpf_link_detach(fd.as_raw_fd()) } != 0 {
            let e = std::io::Error::last_os_error();
            // ENOLINK: already detached (its interface went away)
            if e.raw_os_error() != Some(libc::ENOLINK) {
                return Err(Error::Bpf {
                    what: format!("detaching the link {}", link.display()),
                    detail: e.to_string(),
                });
            }
        }
    }
    // every pin of every kind of installation
    let names = PIN_SETS.iter().flat_map(|s| s.progs.iter().chain(s.maps));
    let mut first = None;
    for &name in [LINK_PIN, EGRESS_LINK_PIN].iter().chain(names) {
        match unlink_at(&dfd, name.as_ref(), 0) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                log::warn!("removing {}: {e}", dir.join(name).display());
                first.get_or_insert(Error::io(dir.join(name), e));
            }
            _ => {}
        }
    }
    drop(dfd);
    if let Err(e) = unlink_at(&pfd, leaf, libc::AT_REMOVEDIR) {
        first.get_or_insert(Error::io(dir, e));
    }
    first.map_or(Ok(()), Err)
}

/// Whether a BPF map with id `id` exists (false once the kernel has freed it).
pub fn map_exists(id: u32) -> bool {
    MapHandle::from_map_id(id).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_egress_program_is_one_of_its_sets_programs() {
        // `Ops::pin` finds the egress program's fd among `progs`: one missing would go unattached
        for set in PIN_SETS {
            if let Some(e) = set.egress {
                assert!(set.progs.contains(&e), "{}: {e} is not in its progs", set.what);
            }
        }
    }
}
