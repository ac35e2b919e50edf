//! Compiles every `src/bpf/*.bpf.c` into a libbpf-rs skeleton (`$OUT_DIR/<name>.skel.rs`).
//!
//! clang-19 by default (Debian's `clang` is 14, too old for arenas); `BPF_CLANG` overrides.

use std::{env, path::PathBuf, process::Command};

use libbpf_cargo::SkeletonBuilder;

fn main() {
    let clang = env::var("BPF_CLANG").unwrap_or_else(|_| "clang-19".into());
    match Command::new(&clang).arg("--version").output() {
        Ok(o) if o.status.success() => {}
        _ => panic!(
            "\n\nqwen_bpf: `{clang}` not found or not working. The BPF programs need clang >= 18 with the BPF target.\n\
             Install it with `bash scripts/setup.sh` (apt-get install clang-19 llvm-19 libelf-dev zlib1g-dev pkg-config make),\n\
             or point BPF_CLANG at another clang >= 18.\n"
        ),
    }
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let mut sources: Vec<PathBuf> = std::fs::read_dir("src/bpf")
        .expect("src/bpf")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".bpf.c"))
        .collect();
    sources.sort();
    let args = [
        "-Wall",
        "-Werror",
        "-mcpu=v4",
        // No sign-extending loads (ldsx): verifiers before Linux 6.18 refuse them from an arena
        // ("sign extending loads from arena are not supported yet"). clang then loads and
        // sign-extends with movsx (v4, Linux >= 6.6): the same integers, one more instruction.
        // (-mcpu=v3 would drop movsx too, and its shift pairs make the verifier's loop analysis
        // blow up: measured on 7.3.4.)
        "-mllvm",
        "-disable-ldsx",
        "-Isrc/bpf",
        // Debian keeps asm/types.h in the multiarch directory, which `clang -target bpf` misses.
        "-I/usr/include/x86_64-linux-gnu",
        "-I/usr/include/aarch64-linux-gnu",
    ];
    for src in &sources {
        let stem = src
            .file_name()
            .unwrap()
            .to_string_lossy()
            .trim_end_matches(".bpf.c")
            .to_string();
        SkeletonBuilder::new()
            .source(src)
            .obj(out.join(format!("{stem}.bpf.o")))
            .clang(&clang)
            .clang_args(args)
            .build_and_generate(out.join(format!("{stem}.skel.rs")))
            .unwrap_or_else(|e| panic!("compiling {}: {e:#}", src.display()));
        println!("cargo:rerun-if-changed={}", src.display());
    }
    println!("cargo:rerun-if-changed=src/bpf");
    println!("cargo:rerun-if-env-changed=BPF_CLANG");
}
