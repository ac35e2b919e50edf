//! Running a model: token-by-token generation with greedy or sampled choice ([`generate`],
//! [`sampling`]), whole generations inside the kernel ([`in_kernel`]) and generations started by
//! a datagram ([`event`]).

pub mod event;
pub mod generate;
pub mod in_kernel;
pub mod sampling;
