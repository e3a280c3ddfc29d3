//! The typed map layer of Sluice's pinned datapath: how the plugin and
//! `sluicectl` open the maps a network's datapath pins, pack keys and values,
//! and the rules of each feature's maps (which hostPort mappings overlap, what
//! a masquerade address change flushes, which entries go with a pod).
//!
//! One module per feature: [`endpoint`], [`node`], [`counters`], [`nat`],
//! [`hostport`], [`services`] (traffic the node's stack translates), [`bandwidth`], [`policy`] (NetworkPolicy), [`events`], [`agent`] (the node agent's leases), [`sweep`] (its NAT
//! sweep); [`programs`] reads what is known of
//! the pinned programs; [`sock_hooks`] attaches the socket hooks (hostPort,
//! Services) to a cgroup and pins their links. Loading the object and
//! attaching the other programs is the plugin's loader's job. With the
//! loader, this crate holds every aya call of Sluice's userspace.
pub mod agent;
pub mod bandwidth;
mod batch;
pub mod counters;
pub mod endpoint;
mod error;
pub mod events;
pub mod hostport;
pub mod lb;
mod lock;
pub mod nat;
pub mod nat_pressure;
pub mod node;
mod pinned;
pub mod policy;
pub mod programs;
pub mod services;
pub mod sock_hooks;
pub mod sweep;
mod trie;

pub use error::Error;
pub use lock::MapsLock;
pub use pinned::PinRoot;

pub type Result<T, E = Error> = std::result::Result<T, E>;
