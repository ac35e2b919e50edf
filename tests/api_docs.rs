//! The public API's documentation builds without a warning: no broken intra-doc link, no link
//! into a private module, no public item without docs (`cargo doc` with `-D warnings`, as a new
//! user's `cargo doc` would show it: without the `internals` feature).

use std::process::Command;

#[test]
fn cargo_doc_of_the_public_api_has_no_warning() {
    let root = env!("CARGO_MANIFEST_DIR");
    // A target directory of its own: the one `cargo test` uses is locked while tests run.
    let target = std::path::Path::new(root).join("target").join("doc-check");
    let out = Command::new(env!("CARGO"))
        .args(["doc", "--no-deps", "-p", "qwen_bpf"])
        .env("RUSTDOCFLAGS", "-D warnings")
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(root)
        .output()
        .expect("running cargo doc");
    assert!(
        out.status.success(),
        "cargo doc -D warnings failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let index = target.join("doc").join("qwen_bpf").join("index.html");
    let html = std::fs::read_to_string(&index).expect("the crate's doc page");
    // the public API is on the page and the internals are not
    for item in [
        "struct.Model",
        "struct.ModelOptions",
        "struct.Tokenizer",
        "trait.Forward",
    ] {
        assert!(
            html.contains(&format!("href=\"{item}.html\"")),
            "{item} missing from {}",
            index.display()
        );
    }
    for hidden in ["mod.kernel", "mod.num", "mod.store"] {
        assert!(
            !html.contains(hidden),
            "internal module {hidden} on the doc page"
        );
    }
}
