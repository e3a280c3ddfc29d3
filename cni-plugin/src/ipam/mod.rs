//! IP address management: the built-in host-local-compatible allocator, or
//! delegation to another IPAM plugin through `CNI_PATH` (spec section 4).
pub mod allocator;
pub mod builtin;
pub mod config;
pub mod range;
pub mod store;
