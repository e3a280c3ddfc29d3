//! One pod's attachment through its life, below the CNI glue of `commands/`:
//!
//! - [`setup`]: what an ADD makes once its preconditions hold and IPAM gave
//!   addresses: the record, the pair, addressing, node settings, the datapath;
//! - [`teardown`]: what a DEL (and a failed ADD's rollback, and GC) removes;
//! - [`check`]: CHECK of what Sluice keeps (the pair, the record, the datapath);
//! - [`repair`]: the recorded pods re-attached to a datapath loaded anew;
//! - [`policy_wait`]: ADD's bounded wait for the pod's NetworkPolicy.
//!
//! Each builds the one [`Attachment`] the datapath's verbs take, from what it
//! has: the pair it made ([`setup`]) or finds ([`check`]), both
//! [`Attachment::paired`]; a record and the kernel's view of its veth
//! ([`repair`]); a record alone ([`Attachment::recorded`], a DEL).
pub mod check;
pub mod policy_wait;
pub mod repair;
pub mod setup;
pub mod teardown;

use std::net::IpAddr;

use crate::{
    cni::{
        config::{NetConf, PodAttach},
        AttachmentId,
    },
    datapath::{Attachment, PodDevice},
    netlink::{LinkInfo, Netlink},
    netns::Netns,
    state::AttachmentRecord,
};

pub use check::check;
pub use repair::repair;
pub use setup::{setup, Made, Setup};
pub use teardown::{teardown, VethRemoval};

impl<'a> Attachment<'a> {
    /// A pod whose pair is in sight (an ADD made it, CHECK found it): host
    /// end `host`, the pod's own interface `pod` in `ns` (`nl`: a socket
    /// there; `fq`: its root qdisc is `fq`), addresses `ips`, and the attach
    /// mode, mappings and limits of `conf`. Netkit as `host` says; XDP off
    /// until the caller knows the pod end takes frames.
    pub fn paired(
        conf: &NetConf,
        id: &AttachmentId,
        ips: Vec<IpAddr>,
        (host, pod): (&LinkInfo, &LinkInfo),
        (ns, nl): (&'a Netns, &'a Netlink),
        fq: bool,
    ) -> Self {
        Self {
            id: id.clone(),
            host_ifname: host.name.clone(),
            host_ifindex: host.index,
            host_mac: host.mac.unwrap_or_default(),
            pod_mac: pod.mac.unwrap_or_default(),
            ips,
            netns_ino: ns.inode(),
            xdp_ready: false,
            attach: conf.pod_attach,
            netkit: host.is_netkit(),
            port_mappings: conf.runtime.port_mappings.clone(),
            bandwidth: conf.bandwidth,
            device: Some(PodDevice {
                ns,
                nl,
                ifname: id.ifname.clone(),
                ifindex: pod.index,
                fq,
            }),
        }
    }

    /// A pod as its complete record has it: index of its host end, addresses,
    /// mappings, limits. What only the kernel knows (MACs, the namespace, the
    /// device kind) is unset; [`repair`] fills it in, a DEL has no use for it.
    /// `None` for a record without the host index (an ADD that died before
    /// its veth existed): the datapath then walks its maps.
    pub fn recorded(rec: &AttachmentRecord, attach: PodAttach) -> Option<Self> {
        Some(Self {
            id: rec.id(),
            host_ifname: rec.host_ifname.clone(),
            host_ifindex: rec.host_ifindex?,
            host_mac: [0; 6],
            pod_mac: [0; 6],
            ips: rec.addrs(),
            netns_ino: 0,
            xdp_ready: false,
            attach,
            netkit: false,
            port_mappings: rec.port_mappings.clone(),
            bandwidth: rec.bandwidth,
            device: None,
        })
    }
}
