//! The memory layer (src/bpf/mem.h) in both builds, run for real: `mem_selftest` reads, sums,
//! writes and refuses exactly what its Rust twin does, at element ends, across them and outside
//! the memory. The array test runs on every kernel with mmapable array maps, natively on a host
//! that refuses arenas; the arena test where arenas run (the VMs' smoke suite on such a host).

use qwen_bpf::kernel::memory::{selftest, LayerProbe, MemoryLayer};

#[test]
fn the_array_layer_reads_writes_and_refuses_what_its_twin_does() {
    let ran = selftest(MemoryLayer::Array).expect("the memory selftest on array maps");
    assert_eq!(ran, MemoryLayer::Array, "the layer that ran");
}

#[test]
fn the_arena_layer_reads_and_writes_what_its_twin_does() {
    let ran = selftest(MemoryLayer::Arena).expect("the memory selftest on a BPF arena");
    assert_eq!(ran, MemoryLayer::Arena, "the layer that ran");
}

/// Auto takes the arena when the kernel gives one and the array maps when it refuses it, and a
/// forced layer the kernel refuses is an error naming the kernel's answer.
#[test]
fn auto_takes_the_arena_where_it_is_given_and_the_array_maps_otherwise() {
    let here = LayerProbe::run();
    assert_eq!(here.array, 1, "a one-page mmapable array map: {here:?}");
    let auto = selftest(MemoryLayer::Auto).expect("the memory selftest on the layer Auto chose");
    let want = if here.arena == 1 {
        MemoryLayer::Arena
    } else {
        MemoryLayer::Array
    };
    assert_eq!(auto, want, "Auto's layer with {here:?}");
    let refused = LayerProbe {
        arena: -libc::EPERM,
        array: 1,
    };
    let (layer, why) = refused.choose(MemoryLayer::Auto).unwrap();
    assert_eq!(layer, MemoryLayer::Array);
    assert_eq!(why, "arena map: Operation not permitted (os error 1)");
    assert_eq!(
        refused.choose(MemoryLayer::Arena).unwrap_err(),
        "arena map: Operation not permitted (os error 1)"
    );
    let neither = LayerProbe {
        arena: -libc::EINVAL,
        array: -libc::EPERM,
    };
    assert_eq!(
        neither.choose(MemoryLayer::Auto).unwrap_err(),
        "arena map: Invalid argument (os error 22); \
         mmapable array map: Operation not permitted (os error 1)"
    );
}
