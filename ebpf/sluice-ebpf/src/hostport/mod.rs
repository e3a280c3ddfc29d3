//! hostPort mappings (CNI `portMappings`) without iptables: one hash lookup per
//! packet whatever the number of mappings.
//!
//! - [`from_uplink`] (tc ingress of the uplink): TCP/UDP/SCTP to a mapped port of
//!   a node address (or of a mapping's own `hostIP`) is translated to
//!   pod:containerPort and delivered into the pod; how its replies are translated
//!   back is recorded in `sl_hp_ct`.
//! - [`from_pod`] (tc ingress of a host veth): a pod packet whose tuple is in
//!   `sl_hp_ct` is rewritten (replies; both directions of hairpin flows). A pod
//!   packet to a node address and mapped port starts a hairpin flow: to the target
//!   pod, from the node address (so the reply comes back through the node, even
//!   when the target is the sender itself).
//! - [`sock`] (cgroup `sock_addr` hooks, both families): the node's own
//!   sockets connecting or sending to `127.0.0.1:hostPort` or a node address
//!   are pointed at the pod before any packet exists; `recvmsg`/`getpeername`
//!   show the address the socket asked for. They act only in the node's
//!   network namespace (netns cookie), whatever cgroup they are attached to.
//!
//! IPv4 in [`v4`], IPv6 in [`v6`] with maps of its own, the socket hooks in
//! [`sock`]; here what both families share (the settings, hairpin flows).
//! Fragments are not translated (left to the kernel).
use aya_ebpf::{bindings::BPF_NOEXIST, maps::LruHashMap};
use sluice_common::{HostPortConfig, HpFlowOf, NatKeyOf, PortTargetOf};

use crate::{l4::PROTO_SCTP, maps::HP_CONFIG};

pub mod sock;
pub mod v4;
pub mod v6;

pub use v4::{from_pod, from_uplink, from_uplink_xdp};
/// Source ports tried for a hairpin flow whose own port is taken (and for
/// a Service flow from the uplink to a remote backend, `lb::uplink`).
pub(crate) const PORT_TRIES: u32 = 16;

/// The source port of try `i` for a flow from `src_port` (network byte
/// order): its own first, then hashed others in 1024..=65535.
#[inline(always)]
pub(crate) fn try_port(src_port: u16, i: u32) -> u16 {
    if i == 0 {
        return src_port;
    }
    // Host order, then stored in network order.
    let h = u32::from(u16::from_be(src_port))
        .wrapping_mul(0x9e37_79b1)
        .wrapping_add(i.wrapping_mul(0x85eb_ca6b));
    ((1024 + h % 64_512) as u16).to_be()
}

#[inline(always)]
pub(super) fn config() -> Option<&'static HostPortConfig> {
    HP_CONFIG.get(0).filter(|c| c.active != 0)
}

/// What [`from_pod`] did.
pub enum Translated {
    /// Nothing: not a hostPort flow.
    No,
    /// Nothing, as the IPv6 call ([`v6::from_pod`]) found. The caller's packet
    /// pointers are still valid, but parse again: held across the call, they
    /// came back with another range from each path its bounds checks took,
    /// and the verifier walked what follows once per range (`from_pod`: 38,000
    /// instructions verified instead of 28,000 on 6.18).
    NoAfterCall,
    /// Rewritten: parse again and route by the new destination.
    Yes,
    /// Dropped (the verdict).
    Drop(i32),
}

/// A new hairpin flow from `k` (pod -> node address:hostPort) to `t`: the source
/// becomes the node address the pod used, with the pod's own port unless another
/// hairpin flow to the same target holds it (then a hashed other one; SCTP keeps
/// its port, its CRC covers it). The reverse entry is inserted first with
/// BPF_NOEXIST, which makes the port this flow's. Both families: `ct` is
/// `sl_hp_ct` or `sl_hp_ct6`; the flow goes to `out`, the reverse entry is
/// built in `back` (IPv6 passes a per-CPU scratch entry for both: the stack
/// is short). `false`: no port free.
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "keys go to the map helpers by reference, not copied (an IPv6 key is 40 bytes)"
)]
#[inline(always)]
fn hairpin<A: Copy + 'static>(
    ct: &LruHashMap<NatKeyOf<A>, HpFlowOf<A>>,
    k: &NatKeyOf<A>,
    t: &PortTargetOf<A>,
    (rk, back): (&mut NatKeyOf<A>, &mut HpFlowOf<A>),
    out: &mut HpFlowOf<A>,
) -> bool {
    let tries = if k.proto == PROTO_SCTP { 1 } else { PORT_TRIES };
    *back = HpFlowOf {
        src_ip: k.dst_ip,
        dst_ip: k.src_ip,
        src_port: k.dst_port,
        dst_port: k.src_port,
        _pad: 0,
    };
    let mut i = 0;
    while i < tries {
        let port = try_port(k.src_port, i);
        *rk = NatKeyOf::new(t.pod_ip, k.dst_ip, t.pod_port, port, k.proto);
        if ct.insert(&*rk, &*back, u64::from(BPF_NOEXIST)).is_ok() {
            *out = HpFlowOf {
                src_ip: k.dst_ip,
                dst_ip: t.pod_ip,
                src_port: port,
                dst_port: t.pod_port,
                _pad: 0,
            };
            let _ = ct.insert(k, &*out, 0);
            return true;
        }
        i += 1;
    }
    false
}
