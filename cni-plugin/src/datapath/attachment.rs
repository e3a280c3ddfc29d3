//! One pod's attachment as the datapath's verbs take it ([`super::Datapath::attach`],
//! `check`), whoever learnt it: ADD from the pair it made, CHECK from what it
//! finds of the pair, a repair from a record and the kernel's view of its veth
//! ([`Attachment::from_record`]). A DEL has no pair left to look at: what the
//! pod's record says it was given ([`Known`]) is what it removes by key.
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

/// One pod as the datapath sees it.
pub struct Attachment<'a> {
    pub id: &'a AttachmentId,
    pub host_ifname: &'a str,
    pub host_ifindex: u32,
    pub host_mac: [u8; 6],
    pub pod_mac: [u8; 6],
    pub ips: &'a [IpAddr],
    /// Inode of the pod's network namespace (0 unknown).
    pub netns_ino: u64,
    /// The pod end takes XDP frames (see `endpoint_flags::XDP_READY`).
    pub xdp_ready: bool,
    pub attach: PodAttach,
    /// The pair is netkit (its programs attach to netkit's hooks; `attach`
    /// is for a veth's).
    pub netkit: bool,
    pub port_mappings: &'a [PortMapping],
    pub bandwidth: Option<&'a Bandwidth>,
    /// The pod's own interface, where EDT shapes an egress limit; `None`: the
    /// policer only (e.g. a repair, which does not enter pods).
    pub device: Option<PodDevice<'a>>,
}

/// A pod's own interface (its `eth0`), inside its namespace.
pub struct PodDevice<'a> {
    pub ns: &'a Netns,
    /// A netlink socket in the pod's namespace.
    pub nl: &'a Netlink,
    pub ifname: &'a str,
    pub ifindex: u32,
    /// `fq` is its root qdisc (ADD made it so; false where the kernel has no
    /// `sch_fq`).
    pub fq: bool,
}

/// The host side of a recorded pod as the kernel shows it now (a repair).
pub struct HostLink {
    pub ifindex: u32,
    pub mac: [u8; 6],
    pub netkit: bool,
}

impl<'a> Attachment<'a> {
    /// A recorded pod re-attached to a datapath loaded anew: its veth as the
    /// kernel shows it, its addresses, mappings and limits as its record has
    /// them. No pod interface: a repair does not enter pods, so an egress
    /// limit is the policer's (the pod's `fq` stays).
    #[expect(
        clippy::too_many_arguments,
        reason = "each is one fact about the pod, named at the one call site"
    )]
    pub fn from_record(
        id: &'a AttachmentId,
        host_ifname: &'a str,
        host: &HostLink,
        pod_mac: [u8; 6],
        ips: &'a [IpAddr],
        port_mappings: &'a [PortMapping],
        bandwidth: Option<&'a Bandwidth>,
        netns_ino: u64,
        xdp_ready: bool,
        attach: PodAttach,
    ) -> Self {
        Self {
            id,
            host_ifname,
            host_ifindex: host.ifindex,
            host_mac: host.mac,
            pod_mac,
            ips,
            netns_ino,
            xdp_ready,
            attach,
            netkit: host.netkit,
            port_mappings,
            bandwidth,
            device: None,
        }
    }
}

/// What a pod's complete record says it was given, for
/// [`super::Datapath::detach`] to remove by key.
pub struct Known<'a> {
    pub host_ifindex: u32,
    pub ips: &'a [IpAddr],
    pub port_mappings: &'a [PortMapping],
}
