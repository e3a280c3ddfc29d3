//! The `sluice` CNI plugin. `main.rs` is a thin shell around [`run`].
pub mod cni;
pub mod error;
pub mod ipam;
