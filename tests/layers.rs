//! The crate's layering: every module of `src/` sits in one layer, and a module may use its own
//! layer and those below it, never one above (see README, "Architecture"). The test reads every
//! `crate::` path in `src/` (imports and paths in code alike), resolves the names `lib.rs`
//! re-exports to the module they come from, and fails on a use of a higher layer. It also fails
//! on a circle between the layer folders or between any two files (through any chain of imports),
//! and on a source file (`.rs`, `.c`, `.h`) above 800 lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, lowest first: a module may use the layers at or before its own.
const LAYERS: &[&[&str]] = &[
    &["error"],
    &["hf"],
    &["types", "forward", "num"],
    &["kernel"],
    &["store"],
    &["verify"],
    &["model"],
    &["run"],
    // the `qwen-bpf` command line (feature `cli`), over the whole library
    &["cli"],
];

fn rank(module: &str) -> usize {
    LAYERS
        .iter()
        .position(|l| l.contains(&module))
        .unwrap_or_else(|| panic!("module `{module}` is in no layer of tests/layers.rs"))
}

/// The files under `dir` whose extension is one of `exts`, recursively.
fn files_with(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files_with(&p, exts, out);
        } else if p.extension().is_some_and(|x| exts.iter().any(|e| x == *e)) {
            out.push(p);
        }
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    files_with(dir, &["rs"], out);
}

/// The top-level module a file of `src/` belongs to (`src/num/fixed.rs` → `num`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// The names `lib.rs` re-exports (`pub use model::{Model, ...}`) and the module each is from.
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for stmt in lib.split(';') {
        let Some(rest) = stmt
            .rfind("pub use ")
            .map(|i| &stmt[i + "pub use ".len()..])
        else {
            continue;
        };
        let module = rest.split("::").next().unwrap().trim().to_string();
        let names = match rest.find('{') {
            Some(i) => rest[i + 1..].trim_end_matches('}').to_string(),
            None => rest.rsplit("::").next().unwrap().to_string(),
        };
        for n in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            map.insert(n.to_string(), module.clone());
        }
    }
    map
}

/// Every `crate::a` or `crate::{A, b::c}` a line names, as top-level names (`a`, `A`, `b`).
fn crate_paths(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // e.g. `qwen_bpf_crate::`
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let name: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

#[test]
fn no_module_uses_a_layer_above_its_own_and_the_layers_form_no_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let names = reexports(&lib);
    // the crate-root helpers every layer may use
    let root: BTreeSet<&str> = ["progress_bar"].into();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut violations = Vec::new();
    let mut edges: BTreeSet<(String, String)> = BTreeSet::new();
    for file in files.iter().filter(|f| !f.ends_with("lib.rs")) {
        let from = module_of(&src, file);
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue; // docs may point anywhere
            }
            for name in crate_paths(line) {
                if root.contains(name.as_str()) {
                    continue;
                }
                let to = names.get(&name).cloned().unwrap_or(name.clone());
                if to == from {
                    continue;
                }
                edges.insert((from.clone(), to.clone()));
                if rank(&to) > rank(&from) {
                    violations.push(format!(
                        "{}:{}: `{from}` (layer {}) uses `crate::{name}` of `{to}` (layer {})",
                        file.strip_prefix(&src).unwrap().display(),
                        n + 1,
                        rank(&from),
                        rank(&to)
                    ));
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "imports from a higher layer:\n{}",
        violations.join("\n")
    );
    // No circle between the layer folders: with every edge pointing to a layer at or below its
    // own, a circle could only run inside one layer; look for one among all edges.
    let modules: BTreeSet<&String> = edges.iter().flat_map(|(a, b)| [a, b]).collect();
    for start in modules {
        let mut seen = BTreeSet::new();
        let mut stack = vec![start.clone()];
        while let Some(m) = stack.pop() {
            for (_, to) in edges.iter().filter(|(a, _)| *a == m) {
                assert!(
                    to != start,
                    "a dependency circle through `{start}` and `{m}`"
                );
                if seen.insert(to.clone()) {
                    stack.push(to.clone());
                }
            }
        }
    }
}

#[test]
fn the_layer_scan_sees_imports_groups_and_reexported_names() {
    assert_eq!(crate_paths("use crate::num::fixed::{self, Q};"), ["num"]);
    assert_eq!(
        crate_paths("use crate::{Config, Error, Result};"),
        ["Config", "Error", "Result"]
    );
    assert_eq!(
        crate_paths("let x = crate::run::event::MAGIC + qwen_bpf_crate::y;"),
        ["run"]
    );
    let names = reexports("pub use model::{KernelMemory, Model};\npub use types::Backend;");
    assert_eq!(names["Model"], "model");
    assert_eq!(names["Backend"], "types");
    assert_eq!(rank("run"), LAYERS.len() - 2);
    assert_eq!(rank("cli"), LAYERS.len() - 1);
}

#[test]
fn no_source_file_is_longer_than_800_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "tests", "benches", "examples", "dev"] {
        files_with(&root.join(dir), &["rs", "c", "h"], &mut files);
    }
    // the BPF sources are among them (a wrong extension list would pass vacuously)
    assert!(files.iter().any(|f| f.ends_with("src/bpf/ops.bpf.c")));
    assert!(files.iter().any(|f| f.ends_with("src/bpf/common.h")));
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).unwrap().lines().count();
            (n > 800).then(|| format!("{} ({n} lines)", f.strip_prefix(root).unwrap().display()))
        })
        .collect();
    assert!(long.is_empty(), "files above 800 lines: {long:?}");
}

/// Every path a Rust `use` tree (or a path in code) starting at byte `i` of `s` names, each as
/// its segments after `prefix`: `a::{b, c::{d, self}}` gives `a::b`, `a::c::d` and `a::c`.
fn use_tree(s: &[u8], i: &mut usize, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let skip_ws = |i: &mut usize| {
        while *i < s.len() && s[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    loop {
        skip_ws(i);
        if *i < s.len() && s[*i] == b'{' {
            *i += 1;
            loop {
                skip_ws(i);
                if *i >= s.len() || s[*i] == b'}' {
                    *i += 1;
                    return;
                }
                use_tree(s, i, prefix.clone(), out);
                skip_ws(i);
                if *i < s.len() && s[*i] == b',' {
                    *i += 1;
                }
            }
        }
        let start = *i;
        while *i < s.len() && (s[*i].is_ascii_alphanumeric() || s[*i] == b'_') {
            *i += 1;
        }
        let ident = String::from_utf8_lossy(&s[start..*i]).into_owned();
        if !ident.is_empty() && ident != "self" {
            prefix.push(ident);
        }
        if s[*i..].starts_with(b"::") {
            *i += 2;
            continue;
        }
        out.push(prefix);
        return;
    }
}

/// The module path of a file of `src/` (`kernel/pins.rs` → `[kernel, pins]`, `kernel/mod.rs` →
/// `[kernel]`).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut m: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if m.last().is_some_and(|l| l == "mod") {
        m.pop();
    }
    m
}

/// The file that module path `m` (segments after the crate root, `super` and `self` already
/// applied) lands in: the deepest module file it names; later segments are items.
fn file_of(src: &Path, m: &[String]) -> PathBuf {
    let (mut dir, mut file) = (src.to_path_buf(), src.join("lib.rs"));
    for seg in m {
        if dir.join(seg).is_dir() {
            dir = dir.join(seg);
            file = dir.join("mod.rs");
        } else if dir.join(format!("{seg}.rs")).is_file() {
            return dir.join(format!("{seg}.rs"));
        } else {
            break;
        }
    }
    file
}

/// The imports between the files of `src/` (the crate root and the binary left out): every
/// `crate::`, `super::` and `self::` path of a file's code, `use` groups included, resolved to the
/// file it lands in; a name the crate root re-exports resolves to the file it comes from.
fn file_edges(src: &Path) -> BTreeSet<(PathBuf, PathBuf)> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let mut roots: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (at, _) in lib.match_indices("pub use ") {
        let mut paths = Vec::new();
        use_tree(
            lib.as_bytes(),
            &mut (at + "pub use ".len()),
            Vec::new(),
            &mut paths,
        );
        for p in paths {
            if let Some((name, module)) = p.split_last() {
                roots.insert(name.clone(), module.to_vec());
            }
        }
    }
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut edges = BTreeSet::new();
    for file in &files {
        if file.ends_with("lib.rs") || file.starts_with(src.join("bin")) {
            continue;
        }
        let here = module_path(src, file);
        // the file's own code: its unit tests (a `#[cfg(test)]` module at the end, whose
        // `super::` is the file itself) are left out
        let code: String = std::fs::read_to_string(file)
            .unwrap()
            .lines()
            .take_while(|l| l.trim() != "#[cfg(test)]")
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let s = code.as_bytes();
        // a `mod.rs` may name its children without a prefix: `pub use options::{ModelOptions}`
        if file.ends_with("mod.rs") {
            for (at, _) in code.match_indices("use ") {
                let mut paths = Vec::new();
                use_tree(s, &mut (at + "use ".len()), Vec::new(), &mut paths);
                for p in paths {
                    let child = file.parent().unwrap().join(&p[0]);
                    if child.is_dir() || child.with_extension("rs").is_file() {
                        let full: Vec<String> = here.iter().chain(&p).cloned().collect();
                        edges.insert((file.clone(), file_of(src, &full)));
                    }
                }
            }
        }
        for kw in ["crate::", "super::", "self::"] {
            for (at, _) in code.match_indices(kw) {
                if at > 0
                    && (s[at - 1].is_ascii_alphanumeric() || s[at - 1] == b'_' || s[at - 1] == b':')
                {
                    continue; // `qwen_bpf_crate::`, or the `super::` of `super::super::`
                }
                let mut base = match kw {
                    "crate::" => Vec::new(),
                    _ => here.clone(),
                };
                let mut i = at;
                // `super::super::x`: each `super` climbs one module
                while s[i..].starts_with(b"super::") {
                    base.pop();
                    i += "super::".len();
                }
                if kw == "self::" {
                    i += kw.len();
                } else if kw == "crate::" {
                    i += kw.len();
                }
                let mut paths = Vec::new();
                use_tree(s, &mut i, Vec::new(), &mut paths);
                for p in paths {
                    let full = match (kw, p.first().and_then(|n| roots.get(n))) {
                        ("crate::", Some(module)) if file_of(src, &p[..1]).ends_with("lib.rs") => {
                            module.clone()
                        }
                        _ => base.iter().chain(&p).cloned().collect(),
                    };
                    let to = file_of(src, &full);
                    if &to != file && !to.ends_with("lib.rs") {
                        edges.insert((file.clone(), to));
                    }
                }
            }
        }
    }
    edges
}

#[test]
fn no_two_files_import_each_other_through_any_chain() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edges = file_edges(&src);
    // the scan sees imports: a few that must be there
    for (from, to) in [
        ("kernel/filter.rs", "kernel/pins.rs"),
        ("model/mod.rs", "kernel/ops.rs"),
        ("run/serve.rs", "model/mod.rs"),
        ("kernel/swar_ops.rs", "kernel/operators.rs"),
    ] {
        assert!(
            edges.contains(&(src.join(from), src.join(to))),
            "the scan misses {from} -> {to}"
        );
    }
    let next = |f: &PathBuf| -> Vec<PathBuf> {
        edges
            .iter()
            .filter(|(a, _)| a == f)
            .map(|(_, b)| b.clone())
            .collect()
    };
    let nodes: BTreeSet<PathBuf> = edges.iter().map(|(a, _)| a.clone()).collect();
    for start in &nodes {
        // a path from start back to start: depth-first, remembering each file's predecessor
        let mut pred: BTreeMap<PathBuf, PathBuf> = BTreeMap::new();
        let mut stack = vec![start.clone()];
        while let Some(f) = stack.pop() {
            for to in next(&f) {
                if &to == start {
                    let mut chain = vec![f.clone()];
                    while let Some(p) = pred.get(chain.last().unwrap()) {
                        chain.push(p.clone());
                    }
                    let names: Vec<String> = chain
                        .iter()
                        .rev()
                        .chain([start])
                        .map(|p| p.strip_prefix(&src).unwrap().display().to_string())
                        .collect();
                    panic!("an import circle: {}", names.join(" -> "));
                }
                if !pred.contains_key(&to) {
                    pred.insert(to.clone(), f.clone());
                    stack.push(to);
                }
            }
        }
    }
}

#[test]
fn the_file_scan_reads_nested_use_groups() {
    let mut out = Vec::new();
    use_tree(b"a::{b, c::{d, self}}, e;", &mut 0, Vec::new(), &mut out);
    let got: Vec<String> = out.iter().map(|p| p.join("::")).collect();
    assert_eq!(got, ["a::b", "a::c::d", "a::c"]);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    assert_eq!(module_path(&src, &src.join("kernel/mod.rs")), ["kernel"]);
    assert!(
        file_of(&src, &["kernel".into(), "ops".into(), "Ops".into()]).ends_with("kernel/ops.rs")
    );
    assert!(file_of(&src, &["model".into(), "Model".into()]).ends_with("model/mod.rs"));
}
