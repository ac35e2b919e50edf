//! Pure integer maths: the fixed-point formats and their operators ([`fixed`]), int4/int8
//! packing and the SWAR products ([`swar`]), the int8 KV cache's codes and attention ([`kv8`]),
//! the screened head's error bound ([`bound`]), the integer sampler ([`sample`]), the packet
//! filter's label scores ([`classify`]), every size bound
//! of the kernels ([`limits`]), and the in-kernel tokenizer's tables ([`tok_tables`]) and its Rust
//! twin ([`tok_twin`]).
//! No BPF and no I/O: these are the twins' arithmetic, which the BPF programs compute again.

pub mod bound;
pub mod classify;
pub mod fixed;
pub mod kv8;
pub mod limits;
pub mod sample;
pub mod swar;
pub mod tok_tables;
pub mod tok_twin;
