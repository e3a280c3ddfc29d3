//! Traffic the node's own stack translates: kube-proxy's Services (iptables,
//! nftables and IPVS modes) and any other netfilter or IPVS DNAT on the node.
//! Sluice never bypasses such a translation:
//!
//! - `sl_svc`, `sl_svc6`: the Service ranges (config `serviceCIDRs`, and what
//!   the node agent learns from the cluster). `from_pod` hands a pod's packet
//!   to one of them to the stack instead of forwarding it itself, so that
//!   kube-proxy's rules see it.
//! - `sl_kflows`: the flows the stack delivered into a pod (`to_pod`) or routed
//!   out of the uplink from one (`uplink_out`, for a pod socket that sent to a
//!   Service or the node: [`kernel_flow_origin::CLIENT`]) without Sluice's
//!   programs having redirected them. Every later packet of such a flow, either way, is handed
//!   to the stack too, so conntrack (or IPVS) sees the whole flow and undoes its
//!   translation on the replies.
//! - `sl_kflow_frag`: IPv4 datagrams of those flows whose first fragment was
//!   handed to the stack; their later fragments (no ports) follow it.

use crate::IpKey;

/// A flow as the pod's own packets carry it: the pod's address and port as
/// the source, the peer's as the destination (IPv4 as IPv4-mapped addresses,
/// [`IpKey::v4`]); ports in network byte order. TCP, UDP and SCTP only.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct KernelFlowKey {
    pub pod: IpKey,
    pub peer: IpKey,
    pub pod_port: u16,
    pub peer_port: u16,
    pub proto: u8,
    /// Zero (two fields: see `NatKeyOf::_pad`).
    pub _pad: u8,
    pub _pad2: u16,
}

impl KernelFlowKey {
    #[inline(always)]
    pub const fn new(pod: IpKey, peer: IpKey, pod_port: u16, peer_port: u16, proto: u8) -> Self {
        Self {
            pod,
            peer,
            pod_port,
            peer_port,
            proto,
            _pad: 0,
            _pad2: 0,
        }
    }
}

/// Value of `sl_kflows`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct KernelFlow {
    /// `bpf_ktime_get_ns` when the flow was first seen.
    pub created_ns: u64,
    /// The pod's host device (0: not known, a flow routed out of the uplink).
    pub pod_ifindex: u32,
    /// [`kernel_flow_origin`].
    pub origin: u8,
    pub _pad: u8,
    pub _pad2: u16,
}

/// Where a kernel flow was first seen.
pub mod kernel_flow_origin {
    /// The stack delivered a packet of it into the pod (`to_pod`): the pod is
    /// the flow's destination (a Service endpoint, a NodePort's pod, ...).
    pub const DELIVERED: u8 = 1;
    /// The stack routed the pod's packet out of the uplink (`uplink_out`): the
    /// pod is the flow's client (a ClusterIP whose endpoint is off the node).
    pub const ROUTED: u8 = 2;
    /// Not a flow but a pod's socket (the key's peer is `::`, port 0) that
    /// `from_pod` handed to the stack for a Service address or one of the
    /// node's own (a NodePort): only such a socket's packets that the stack
    /// routes out of the uplink are remembered as [`ROUTED`] flows, not those
    /// of a flow the stack forwarded for another reason (an unresolved
    /// neighbour before Linux 5.12).
    pub const CLIENT: u8 = 3;
}
