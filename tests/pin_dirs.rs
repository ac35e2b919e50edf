//! The directories pins go in cannot be turned against root: an installation directory is made
//! 0700 in a pin root that is a real directory of root's, writable by no one else; a symbolic
//! link, another user's directory or a world-writable one is refused with its reason, and an
//! installation directory another user made first is never taken; `remove` refuses a link,
//! another user's directory or one in a root others may write in, and, when one pin cannot be
//! removed, still removes the others.
//!
//! Plain directories stand in for the BPF filesystem (the checks are the same on both), so this
//! runs on any host; it needs root to give a directory to another user.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use qwen_bpf::kernel::pins::{check_private_dir, create_install_dir, remove, EVENT_PINS};
use qwen_bpf::Error;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("qwen-bpf-pin-dirs-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

fn refused(r: qwen_bpf::Result<impl std::fmt::Debug>, path: &Path, reason: &str) {
    match r {
        Err(Error::UnsafePinDir {
            path: p,
            reason: why,
        }) => {
            assert_eq!(p, path, "the directory named");
            assert!(why.contains(reason), "{why:?} says {reason:?}");
        }
        other => panic!(
            "{} was not refused for {reason:?}: {other:?}",
            path.display()
        ),
    }
}

#[test]
fn install_dirs_are_private_and_unsafe_ones_are_refused() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "needs root (to chown)");
    let base = scratch("create");
    let root = base.join("qwen_bpf");
    let dir = root.join("m");
    assert!(create_install_dir(&root, &dir).unwrap(), "made");
    for d in [&root, &dir] {
        let mode = std::fs::symlink_metadata(d).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o700, "{} is 0700", d.display());
    }
    assert!(
        !create_install_dir(&root, &dir).unwrap(),
        "exists: not made again"
    );

    // a symbolic link at the installation's name: "exists", never followed
    let elsewhere = scratch("elsewhere");
    std::os::unix::fs::symlink(&elsewhere, root.join("link")).unwrap();
    assert!(!create_install_dir(&root, &root.join("link")).unwrap());
    refused(
        check_private_dir(&root.join("link")),
        &root.join("link"),
        "symbolic link",
    );
    refused(
        remove(&root.join("link")),
        &root.join("link"),
        "symbolic link",
    );
    assert!(elsewhere.is_dir(), "remove did not follow the link");

    // a pin root that is a link, another user's, or writable by others
    let linked = base.join("linked");
    std::os::unix::fs::symlink(&elsewhere, &linked).unwrap();
    refused(
        create_install_dir(&linked, &linked.join("m")),
        &linked,
        "symbolic link",
    );
    let theirs = base.join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    refused(
        create_install_dir(&theirs, &theirs.join("m")),
        &theirs,
        "owned by uid 65534",
    );
    assert!(!theirs.join("m").exists(), "nothing made in it");
    let open = base.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    refused(
        create_install_dir(&open, &open.join("m")),
        &open,
        "others may write",
    );
    // the installation directory pre-made by another user: never taken as ours ("exists":
    // AlreadyInstalled), and remove refuses it, leaving it and what it holds
    let squatted = root.join("squatted");
    std::fs::create_dir(&squatted).unwrap();
    std::fs::write(squatted.join("ev_xdp"), b"theirs").unwrap();
    std::os::unix::fs::chown(&squatted, Some(65534), Some(65534)).unwrap();
    assert!(!create_install_dir(&root, &squatted).unwrap());
    refused(remove(&squatted), &squatted, "owned by uid 65534");
    assert!(squatted.join("ev_xdp").exists(), "remove touched nothing");
    // a directory in a pin root others may write in: remove refuses the root
    std::fs::create_dir(open.join("m")).unwrap();
    std::fs::set_permissions(open.join("m"), std::fs::Permissions::from_mode(0o700)).unwrap();
    refused(remove(&open.join("m")), &open, "others may write");
    assert!(open.join("m").is_dir(), "left in place");
    let file = base.join("file");
    std::fs::write(&file, b"").unwrap();
    refused(check_private_dir(&file), &file, "not a directory");

    std::fs::remove_dir_all(&base).unwrap();
    std::fs::remove_dir_all(&elsewhere).unwrap();
}

#[test]
fn remove_goes_on_past_a_pin_it_cannot_remove() {
    let base = scratch("remove");
    let dir = base.join("m");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    // plain files in place of the pins (no link pin: nothing to detach), and the first map's
    // name taken by a non-empty directory, which unlink cannot remove
    let (stuck, rest) = EVENT_PINS.maps.split_first().unwrap();
    std::fs::create_dir(dir.join(stuck)).unwrap();
    std::fs::write(dir.join(stuck).join("x"), b"").unwrap();
    for name in rest.iter().chain(EVENT_PINS.progs) {
        std::fs::write(dir.join(name), b"").unwrap();
    }
    let e = remove(&dir).expect_err("a pin could not be removed");
    assert!(e.to_string().contains(stuck), "{e} names {stuck}");
    let left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, [stuck.to_string()], "every other pin was removed");
    std::fs::remove_dir_all(&base).unwrap();
}
