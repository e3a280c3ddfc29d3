//! The namespace testbed of Sluice's integration tests, demo and benchmarks:
//! the one place that makes the world a CNI plugin runs in.
//!
//! - [`netns`]: network namespaces owned by a value (deleted on drop, also while
//!   a failed test unwinds), `ip -n`, and veth "wires" between them;
//! - [`world`]: a node's uplink to an external host, the shape every test, the
//!   demo and the benchmarks build;
//! - [`cni`]: a plugin run as a runtime runs it (the `CNI_*` environment, the
//!   config on stdin);
//! - [`exec`]: every program run with a cleared environment and a deadline;
//! - [`kube_proxy`]: kube-proxy's rules for a node, in each of its modes, written
//!   into a namespace with the real tools (the Service tests and benchmark).
//!
//! It never touches the machine's own interfaces, routes or sysctls: everything
//! happens inside namespaces the caller made. It depends on nothing that
//! `cargo xtask setup` installs, so xtask can build on a fresh machine.
use std::fmt;

pub mod cni;
pub mod exec;
pub mod kube_proxy;
pub mod netns;
pub mod world;

pub use netns::{netns_path, wire, Netns};
pub use world::Uplink;

/// A testbed failure: what was being done and why it failed.
#[derive(Debug)]
pub struct Error(pub String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Self(format!("I/O error: {e}"))
    }
}

impl From<nix::Error> for Error {
    fn from(e: nix::Error) -> Self {
        Self(format!("system call failed: {e}"))
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Self(format!("JSON: {e}"))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Builds an [`Error`] from a format string.
#[macro_export]
macro_rules! err {
    ($($t:tt)*) => { $crate::Error(format!($($t)*)) };
}
