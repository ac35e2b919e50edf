//! Running a model: token-by-token generation with greedy or sampled choice ([`generate`],
//! [`sampling`]), whole generations inside the kernel ([`in_kernel`]) and generations started by
//! a datagram ([`event`]), and tokenizing in the kernel with the model's arena ([`tokenize`]).

pub mod event;
pub mod generate;
pub mod in_kernel;
pub mod sampling;
pub mod tokenize;
