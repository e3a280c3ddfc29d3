//! The node's kernel interfaces that the plugin and the agent share: typed
//! rtnetlink operations ([`netlink`]), network namespaces ([`netns`]),
//! advisory file locks with a bounded wait ([`lock`]) and the bpffs under a
//! pin root ([`bpffs`]). Nothing here knows about CNI or Kubernetes.
pub mod bpffs;
pub mod error;
pub mod lock;
#[cfg(feature = "netlink")]
pub mod netlink;
pub mod netns;

pub use error::Error;
