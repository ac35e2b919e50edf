//! `qwen_bpf_dev`'s shared code: the candle Qwen3 forward pass, the optimiser loop and the
//! checkpoint writer that the training tools (`train_tiny`, `train_filter`) are made of.

#[path = "../../tests/common/rng.rs"]
pub mod rng;
pub mod train;
