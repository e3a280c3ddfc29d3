//! One pod's attachment as the datapath's verbs take it ([`super::Datapath::attach`],
//! `detach`, `check`). Built where the plugin learns about the pod (see
//! `crate::pod`): an ADD from the pair it made, CHECK from what it finds of
//! the pair, a repair from a record and the kernel's view of its veth, a DEL
//! from the record alone.
use std::net::IpAddr;

use crate::{
    cni::{
        config::PodAttach,
        runtime_config::{Bandwidth, PortMapping},
        AttachmentId,
    },
    netlink::Netlink,
    netns::Netns,
};

/// One pod as the datapath sees it. Only its own interface (`device`) is
/// borrowed: the namespace and the socket into it belong to the caller.
pub struct Attachment<'a> {
    pub id: AttachmentId,
    pub host_ifname: String,
    pub host_ifindex: u32,
    /// Zero where unknown (a DEL: the pair may be gone).
    pub host_mac: [u8; 6],
    /// Zero where unknown (a DEL).
    pub pod_mac: [u8; 6],
    pub ips: Vec<IpAddr>,
    /// Inode of the pod's network namespace (0 unknown).
    pub netns_ino: u64,
    /// The pod end takes XDP frames (see `endpoint_flags::XDP_READY`).
    pub xdp_ready: bool,
    pub attach: PodAttach,
    /// The pair is netkit (its programs attach to netkit's hooks; `attach`
    /// is for a veth's).
    pub netkit: bool,
    pub port_mappings: Vec<PortMapping>,
    pub bandwidth: Option<Bandwidth>,
    /// The pod's own interface, where EDT shapes an egress limit; `None`: the
    /// policer only (a repair does not enter pods; a DEL has no pod left).
    pub device: Option<PodDevice<'a>>,
}

/// A pod's own interface (its `eth0`), inside its namespace.
pub struct PodDevice<'a> {
    pub ns: &'a Netns,
    /// A netlink socket in the pod's namespace.
    pub nl: &'a Netlink,
    pub ifname: String,
    pub ifindex: u32,
    /// `fq` is its root qdisc (ADD made it so; false where the kernel has no
    /// `sch_fq`).
    pub fq: bool,
}
