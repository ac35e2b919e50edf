//! The kernel facilities qwen_bpf uses, each asked for real and answered with its cause: what
//! `doctor` prints, in the manner of `bpftool feature probe`.

use super::memory::{selftest_chosen, LayerProbe, MemoryLayer};
use super::{classify, probe_results, release_version};

/// One facility and the kernel's answer.
#[derive(Clone, Debug)]
pub struct Feature {
    /// What it is ("BTF", "BPF arena maps", ...).
    pub name: &'static str,
    /// `Ok(detail)` when it works, `Err(why)` naming the cause when not.
    pub status: std::result::Result<String, String>,
}

impl Feature {
    /// Whether it works.
    pub fn works(&self) -> bool {
        self.status.is_ok()
    }

    /// "yes (detail)" or "NO: why".
    pub fn describe(&self) -> String {
        match &self.status {
            Ok(d) if d.is_empty() => "yes".into(),
            Ok(d) => format!("yes ({d})"),
            Err(why) => format!("NO: {why}"),
        }
    }
}

/// The running kernel and what it lets this process do.
#[derive(Clone, Debug)]
pub struct ProbeReport {
    /// `uname -r`.
    pub kernel: String,
    /// BTF, the JIT, syscall programs and bpf_loop (with privileges), arena maps, the memory
    /// layers, BPF workqueues, bpffs.
    pub features: Vec<Feature>,
}

impl ProbeReport {
    /// Whether every facility works.
    pub fn all_work(&self) -> bool {
        self.features.iter().all(Feature::works)
    }
}

/// Whether `kfunc` is named in the kernel's BTF (`/sys/kernel/btf/vmlinux`).
fn btf_has(btf: &[u8], kfunc: &str) -> bool {
    let needle: Vec<u8> = [&[0u8][..], kfunc.as_bytes(), &[0u8]].concat();
    btf.windows(needle.len()).any(|w| w == needle.as_slice())
}

/// Asks the kernel about every facility (no model needed; takes milliseconds).
pub fn probe() -> ProbeReport {
    probe_with(&LayerProbe::run())
}

/// [`probe`], with the memory layers' answers `layers` already asked for (`doctor` loads the
/// programs on the same layers).
pub(crate) fn probe_with(layers: &LayerProbe) -> ProbeReport {
    let p = probe_results();
    let kernel = p.release.clone().unwrap_or_else(|| "(unknown)".into());
    let version = p.release.as_deref().and_then(release_version);
    let btf = std::fs::read("/sys/kernel/btf/vmlinux");
    let mut features = Vec::new();
    features.push(Feature {
        name: "BTF",
        status: match &btf {
            Ok(b) => Ok(format!("/sys/kernel/btf/vmlinux, {} bytes", b.len())),
            Err(e) => Err(format!(
                "/sys/kernel/btf/vmlinux: {e}: the kernel was built without CONFIG_DEBUG_INFO_BTF"
            )),
        },
    });
    features.push(Feature {
        name: "BPF JIT",
        status: match std::fs::read_to_string("/proc/sys/net/core/bpf_jit_enable") {
            Ok(v) if v.trim() != "0" => Ok(format!("bpf_jit_enable = {}", v.trim())),
            Ok(_) => Err("net.core.bpf_jit_enable = 0: the programs would run interpreted, if at all (sysctl -w net.core.bpf_jit_enable=1)".into()),
            Err(e) => Err(format!("/proc/sys/net/core/bpf_jit_enable: {e}")),
        },
    });
    // privileges, syscall programs, bpf_loop and arenas: the verdict Model::open acts on
    features.push(Feature {
        name: "programs and arena",
        status: classify(&p)
            .map(|()| "syscall programs, bpf_loop, arena maps".into())
            .map_err(|e| e.to_string()),
    });
    // the memory layers (kernel::memory): each the kernel gives, run through its selftest
    features.push(Feature {
        name: "memory layers",
        status: {
            // (passed, text) per layer; a layer the kernel does not give is not a failure
            // while the other one runs, a selftest that fails always is
            let layer = |l: MemoryLayer| match layers.choose(l) {
                Ok(_) => match selftest_chosen(l) {
                    Ok(_) => (Some(true), format!("{l}: selftest passed")),
                    Err(e) => (Some(false), format!("{l}: selftest FAILED: {e}")),
                },
                Err(why) => (None, format!("{l}: {why}")),
            };
            let all = [layer(MemoryLayer::Arena), layer(MemoryLayer::Array)];
            let text = all.iter().map(|l| l.1.as_str()).collect::<Vec<_>>().join("; ");
            let passed = all.iter().any(|l| l.0 == Some(true));
            let failed = all.iter().any(|l| l.0 == Some(false));
            if passed && !failed {
                Ok(text)
            } else {
                Err(text)
            }
        },
    });
    features.push(Feature {
        name: "BPF workqueues",
        status: match &btf {
            Ok(b) if btf_has(b, "bpf_wq_init") => Ok(
                if btf_has(b, "bpf_wq_set_callback") { "bpf_wq_set_callback (7.x)" } else { "bpf_wq_set_callback_impl" }.into()
            ),
            Ok(_) => Err(format!(
                "kernel {kernel} has no bpf_wq kfuncs (Linux >= 6.10): in-kernel events, the server and the filter cannot run{}",
                if version.is_some_and(|v| v >= (6, 10)) { "; the kernel may be built without them" } else { "" }
            )),
            Err(_) => Err("unknown without BTF".into()),
        },
    });
    features.push(Feature {
        name: "bpffs",
        status: {
            // SAFETY: statfs on a NUL-terminated path into a zeroed struct.
            let mut st: libc::statfs = unsafe { std::mem::zeroed() };
            let rc = unsafe { libc::statfs(c"/sys/fs/bpf".as_ptr(), &mut st) };
            const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
            if rc == 0 && st.f_type as i64 == BPF_FS_MAGIC {
                Ok("/sys/fs/bpf".into())
            } else {
                // not a failure: installing mounts it
                Ok("not mounted yet at /sys/fs/bpf; `serve install` mounts it".into())
            }
        },
    });
    ProbeReport { kernel, features }
}
