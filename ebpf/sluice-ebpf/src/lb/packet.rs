//! A pod's ClusterIP flows that no socket hook translated, translated per
//! packet in `from_pod`: the hooks act only in their cgroup (the node's
//! root in the DaemonSet: every pod), so a pod outside it (where the agent
//! runs its hooks on a cgroup of its own, `lb_flags::PER_PACKET`) sends its
//! packets to the Service address itself, as it would to kube-proxy's
//! rules.
//!
//! A flow's first packet to a Service frontend with endpoints gets one
//! ([`super::choose`], session affinity by the pod's address) and both
//! directions are recorded in `sl_lb_ct` (the pod keeps its own source
//! address, as with the hooks); that first packet then goes to the kernel,
//! which routes it to the backend. The rest of the flow is rewritten by
//! [`super::uplink::from_pod`] (the pod's packets; a local backend's
//! replies) and `uplink_in` (a remote backend's replies), before routing,
//! on the fast path. TCP and UDP, IPv4 here, IPv6 in
//! `super::uplink6::packet_start`.
use aya_ebpf::programs::TcContext;
use sluice_common::{reason, IpKey, NatKey, SvcKey};

use super::{
    choose,
    uplink::{client_id, new_flow, translate, DECIDED, STEP},
};
use crate::{
    counters::count,
    hostport::{v4::parse, v6::NOT_OURS},
    l4::{PROTO_TCP, PROTO_UDP},
    maps::LB_SVC,
    TCX_NEXT,
};

/// Host veth ingress, after the pod's packet was found not to be for a pod
/// here: a new flow to a ClusterIP (a frontend of the node's scope) with
/// endpoints, translated and handed to the kernel ([`TCX_NEXT`]).
/// [`NOT_OURS`]: not one (a frontend without endpoints was answered
/// before, see `super::reject`). Calls of their own, one after the other
/// (`from_pod`'s frame is the largest).
#[inline(always)]
pub fn start(ctx: &TcContext) -> i32 {
    if crate::l4::is_ipv6(ctx) {
        return super::uplink6::packet_start(ctx);
    }
    match decide(ctx) {
        DECIDED => {}
        v => return v,
    }
    match record() {
        DECIDED => {}
        v => return v,
    }
    match translate(ctx) {
        DECIDED => {
            count(reason::LB_PACKET_NEW);
            TCX_NEXT
        }
        v => v,
    }
}

/// The packet and the backend its flow gets, into this CPU's [`Step`].
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "keys go to the map helpers by reference, not copied onto the stack"
)]
#[inline(never)]
fn decide(ctx: &TcContext) -> i32 {
    let Some((ip, l4)) = parse(ctx) else {
        return NOT_OURS;
    };
    if !matches!(ip.proto, PROTO_TCP | PROTO_UDP) {
        return NOT_OURS;
    }
    let key = SvcKey::new(IpKey::v4(ip.dst_addr), l4.dport, ip.proto);
    // SAFETY: map values are only read.
    let Some(svc) = (unsafe { LB_SVC.get(&key) }) else {
        return NOT_OURS;
    };
    let src = ip.src_addr;
    let Some(b) = choose(svc, || client_id(src)) else {
        return NOT_OURS;
    };
    // The agent gives an IPv4 frontend IPv4 backends only.
    let Some(bip) = b.addr.as_v4() else {
        return NOT_OURS;
    };
    let Some(step) = STEP.get_ptr_mut(0) else {
        return NOT_OURS;
    };
    // SAFETY: this CPU's slot; only this program uses it, between its
    // calls.
    let step = unsafe { &mut *step };
    step.k = NatKey::new(ip.src_addr, ip.dst_addr, l4.sport, l4.dport, ip.proto);
    step.l4 = l4;
    // The backend, for `record`.
    step.f.dst_ip = bip;
    step.f.dst_port = b.port;
    DECIDED
}

/// The flow of this CPU's [`Step`] to the backend [`decide`] chose, both
/// directions in `sl_lb_ct`.
#[inline(never)]
fn record() -> i32 {
    let Some(step) = STEP.get_ptr_mut(0) else {
        return NOT_OURS;
    };
    // SAFETY: as in `decide`.
    let step = unsafe { &mut *step };
    // The pod keeps its address: the backend's answers come back to it.
    match new_flow(&step.k, step.f.dst_ip, step.f.dst_port, true, [0; 4]) {
        Some(f) => {
            step.f = f;
            DECIDED
        }
        None => NOT_OURS,
    }
}
