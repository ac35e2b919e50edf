//! Running a model: token-by-token generation with greedy or sampled choice ([`generate`],
//! [`sampling`]), whole generations inside the kernel ([`in_kernel`]), generations started by
//! a datagram ([`event`]), tokenizing in the kernel with the model's arena ([`tokenize`]), and a
//! model installed in the kernel that answers datagrams on its own ([`serve`], its datagrams in
//! [`wire`]), and the packet filter's rule and classifier ([`filter`]).

pub mod event;
pub mod filter;
pub mod generate;
pub mod in_kernel;
pub mod sampling;
pub mod serve;
pub mod wire;
pub mod tokenize;
