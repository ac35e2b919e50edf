//! What the engine is checked against: the f32 forward pass of `modeling_qwen3.py`
//! ([`reference`]), the fixed-point twin of the whole model ([`twin`]) and the Rust executor of a
//! recorded plan ([`twin_plan`]), which computes the BPF programs' integers in user space.

pub mod reference;
pub mod twin;
pub mod twin_plan;
