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
    // The array memory layer (src/bpf/mem.h, issue 35): the objects built a second time, as
    // `<stem>_array`, over mmapable array maps and with only what Linux 6.1's verifier takes
    // (cpu v3: no movsx, no sign-extending loads).
    let array_args = [
        "-Wall",
        "-Werror",
        "-mcpu=v3",
        "-DQB_ARRAY_LAYER",
        "-Isrc/bpf",
        "-I/usr/include/x86_64-linux-gnu",
        "-I/usr/include/aarch64-linux-gnu",
    ];
    const ARRAY_LAYER: &[&str] = &["mem", "ops"];
    // objects whose array build has, so far, only some of the programs (issue 35 moves them
    // over step by step; docs/plans/array-layer.md)
    const ARRAY_PARTIAL: &[&str] = &["ops"];
    for src in &sources {
        let stem = src
            .file_name()
            .unwrap()
            .to_string_lossy()
            .trim_end_matches(".bpf.c")
            .to_string();
        let mut builds = vec![(stem.clone(), &args[..])];
        if ARRAY_LAYER.contains(&stem.as_str()) {
            builds.push((format!("{stem}_array"), &array_args[..]));
        }
        for (name, flags) in &builds {
            SkeletonBuilder::new()
                .source(src)
                .obj(out.join(format!("{name}.bpf.o")))
                .clang(&clang)
                .clang_args(*flags)
                .build_and_generate(out.join(format!("{name}.skel.rs")))
                .unwrap_or_else(|e| panic!("compiling {} as {name}: {e:#}", src.display()));
        }
        if builds.len() == 2 {
            same_ctx_types(&out, &stem, ARRAY_PARTIAL.contains(&stem.as_str()));
        }
        println!("cargo:rerun-if-changed={}", src.display());
    }
    println!("cargo:rerun-if-changed=src/bpf");
    println!("cargo:rerun-if-env-changed=BPF_CLANG");
}

/// The two builds of one object must give user space the same ctx structs, so that Rust keeps one
/// set of types for both layers: every `pub struct` of the arena build's `types` module must
/// appear, the same text, in the array build's (which has one more: the layer's `rodata`). A
/// `partial` array build (some programs not moved over yet) may lack structs, and its `.bss`
/// differs; every struct it has must still be the arena build's.
fn same_ctx_types(out: &std::path::Path, stem: &str, partial: bool) {
    let read = |name: &str| std::fs::read_to_string(out.join(format!("{name}.skel.rs"))).unwrap();
    let (arena, array) = (read(stem), read(&format!("{stem}_array")));
    let structs = |s: &str| -> Vec<String> {
        s.split("pub struct ")
            .skip(1)
            // a struct's text: up to its closing brace, without what follows it
            .map(|b| {
                b.lines()
                    .take_while(|l| l.trim() != "}")
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            // the map definitions (`__anon_N`) and the layer's `rodata` differ by design
            .filter(|b| !b.starts_with("__anon") && !b.starts_with("rodata"))
            // and so does a partial build's .bss (the globals of the programs it lacks)
            .filter(|b| !(partial && b.starts_with("bss")))
            .collect()
    };
    let name = |s: &str| s.split([' ', '<', '{']).next().unwrap_or("").to_string();
    // the skeleton's own structs carry the object's name (`MemMaps`, `MemArrayMaps`)
    let own = |n: &str| n.contains(&skeleton_name(stem)) || n == "maps";
    let (ours, theirs) = (structs(&arena), structs(&array));
    let (from, to) = if partial {
        (&theirs, &ours)
    } else {
        (&ours, &theirs)
    };
    for s in from {
        let n = name(s);
        if !own(&n) && !to.contains(s) {
            panic!("{stem}: the array build's `{n}` differs from the arena build's:\n{s}");
        }
    }
}

/// The name libbpf-cargo gives an object's skeleton types: `ops` → `Ops`, `mem_array` → `MemArray`.
fn skeleton_name(stem: &str) -> String {
    stem.split('_')
        .map(|w| w[..1].to_uppercase() + &w[1..])
        .collect()
}
