//! Per-endpoint packet and byte counters, and delivery straight into a pod.
use aya_ebpf::{
    bindings::{xdp_action, TC_ACT_SHOT},
    helpers::{bpf_redirect, bpf_redirect_peer},
    programs::TcContext,
};
use sluice_common::{endpoint_flags, reason, Endpoint, EndpointStats, IpKey};

use crate::{
    bandwidth,
    counters::count,
    l3::Headers,
    maps::{ENDPOINTS, ENDPOINT_SLOTS, ENDPOINT_STATS},
    TCX_NEXT,
};

/// The counters of the pod on host veth `ifindex` whose endpoint has `flags`
/// (0 when the packet's endpoint is not known): its slot in `sl_ep_slots`, an
/// array index, when it has one; else its `sl_ep_stats` entry, a hash lookup
/// of the ifindex (userspace creates both at ADD, so the hot path never
/// inserts). Measured on the pod->pod path, the two hash lookups a packet made
/// cost 3% of the round trip and 4% of the 64-byte packet rate.
#[inline(always)]
fn stats(ifindex: u32, flags: u32) -> Option<*mut EndpointStats> {
    match endpoint_flags::slot(flags) {
        // SAFETY: a pointer into this CPU's value; only its field is taken.
        Some(slot) => ENDPOINT_SLOTS
            .get_ptr_mut(slot)
            .map(|s| unsafe { &raw mut (*s).stats }),
        None => ENDPOINT_STATS.get_ptr_mut(ifindex),
    }
}

/// Counts a packet the pod on `ifindex` (endpoint flags `flags`) sent.
#[inline(always)]
pub fn count_from_pod(ifindex: u32, flags: u32, len: u32) {
    if let Some(s) = stats(ifindex, flags) {
        // SAFETY: per-CPU value, only this CPU writes it while the program runs.
        unsafe {
            (*s).from_pod_packets += 1;
            (*s).from_pod_bytes += u64::from(len);
        }
    }
}

/// Counts a packet going into the pod on `ifindex` (endpoint flags `flags`).
#[inline(always)]
pub fn count_to_pod(ifindex: u32, flags: u32, len: u32) {
    if let Some(s) = stats(ifindex, flags) {
        // SAFETY: as above.
        unsafe {
            (*s).to_pod_packets += 1;
            (*s).to_pod_bytes += u64::from(len);
        }
    }
}

/// Rewrites the frame for the pod's link (MACs, TTL) and counts it. The caller
/// has checked that the TTL does not expire.
#[inline(always)]
fn prepare(h: &Headers, ep: &Endpoint, len: u32) {
    h.decrement_ttl();
    h.set_macs(ep.pod_mac, ep.host_mac);
    count_to_pod(ep.ifindex, ep.flags, len);
}

/// tc: delivers into the pod with `bpf_redirect_peer` — from the host veth's
/// ingress straight to the pod end's ingress, without the backlog queue (only
/// valid from tc ingress). Returns the tc verdict.
#[inline(always)]
pub fn deliver_tc(h: &Headers, ep: &Endpoint, len: u32, reason: u32) -> i32 {
    // bpf_redirect_peer skips the host veth's egress, where to_pod would check.
    if !bandwidth::admit_to(ep, len) {
        return TC_ACT_SHOT;
    }
    prepare(h, ep, len);
    count(reason);
    // SAFETY: plain helper call; a bad ifindex makes the kernel drop the packet.
    unsafe { bpf_redirect_peer(ep.ifindex, 0) as i32 }
}

/// `skb->cb[0]` of a packet `from_netkit_pod` hands to another pod, with
/// [`DELIVERED_LEN`] xor the packet's length in `cb[1]`. The control block
/// survives the redirect to the target's host device (no qdisc on a host veth
/// or netkit device uses it on the way), where `to_pod` (`to_netkit_pod`)
/// runs: it sees the packet was admitted and counted already, without a map
/// lookup. Two words, one of them the length, so a stale control block (the
/// stack uses it too) matches by chance practically never.
const DELIVERED: u32 = 0x5e1c_0de1;
const DELIVERED_LEN: u32 = 0x0de1_5e1c;

/// From a netkit pod's peer hook: delivers into another pod with `bpf_redirect`
/// to its host device (`bpf_redirect_peer` is for tc ingress only:
/// `skb_do_redirect` drops a peer redirect outside it), whose transmit puts it
/// into the pod. Admission and counting as in [`deliver_tc`]; `to_pod` or
/// `to_netkit_pod` on the target then passes it on without doing them again
/// ([`take_delivered`]).
#[inline(always)]
pub fn deliver_from_netkit(
    ctx: &TcContext,
    h: &Headers,
    ep: &Endpoint,
    len: u32,
    reason: u32,
) -> i32 {
    if !bandwidth::admit_to(ep, len) {
        return TC_ACT_SHOT;
    }
    prepare(h, ep, len);
    count(reason);
    // SAFETY: `skb` points at the context the kernel passed in; tc programs may
    // write cb[0..5].
    unsafe {
        let skb = ctx.skb.skb;
        (*skb).cb[0] = DELIVERED;
        (*skb).cb[1] = DELIVERED_LEN ^ (*skb).len;
    }
    // SAFETY: plain helper call; a bad ifindex makes the kernel drop the packet.
    unsafe { bpf_redirect(ep.ifindex, 0) as i32 }
}

/// In `to_pod` / `to_netkit_pod`: whether `from_netkit_pod` delivered this
/// packet (and already admitted and counted it). Clears the mark.
#[inline(always)]
pub fn take_delivered(ctx: &TcContext) -> bool {
    // SAFETY: as above.
    unsafe {
        let skb = ctx.skb.skb;
        if (*skb).cb[0] == DELIVERED && (*skb).cb[1] == DELIVERED_LEN ^ (*skb).len {
            (*skb).cb[0] = 0;
            return true;
        }
    }
    false
}

/// XDP: redirects the frame to the host veth, whose `ndo_xdp_xmit` puts it on the
/// pod end's receive queue. Returns the XDP verdict.
#[inline(always)]
pub fn deliver_xdp(h: &Headers, ep: &Endpoint, len: u32, reason: u32) -> u32 {
    if !bandwidth::admit_to(ep, len) {
        return xdp_action::XDP_DROP;
    }
    prepare(h, ep, len);
    count(reason);
    // SAFETY: plain helper call.
    unsafe { bpf_redirect(ep.ifindex, 0) as u32 }
}

/// Delivers a packet masquerade or hostPort translated (`nat`, `hostport`)
/// into the pod (or to the kernel, which routes it there, when the pod is not
/// in the endpoint map). With `kernel_flows` (a reply masquerade translated
/// back: [`deliver_masq_reply`]), a packet of a flow the stack translated too
/// (a pod's Service flow Sluice masqueraded on its way out) goes to the
/// stack, which undoes its part. hostPort's deliveries never belong to the
/// stack's flows, and are not looked up: its IPv6 path, deep in `uplink_in`'s
/// calls, has no stack left for the lookup on Linux 5.10.
#[inline(always)]
pub(crate) fn deliver_translated(ctx: &TcContext, pod: IpKey, kernel_flows: bool) -> i32 {
    // The translation's checksum helpers may have moved the packet: parse it
    // again.
    let Ok(h) = crate::l3::parse(ctx) else {
        return TCX_NEXT;
    };
    // SAFETY: map values are only read.
    match unsafe { ENDPOINTS.get(pod) } {
        Some(_) if kernel_flows && crate::kernel_nat::is_kernel_flow(ctx, &h, false) => {
            count(reason::UPLINK_KERNEL_FLOW);
            TCX_NEXT
        }
        Some(ep) if h.ttl() > 1 => deliver_tc(
            &h,
            ep,
            crate::bandwidth::wire_len(ctx),
            reason::UPLINK_TO_POD,
        ),
        _ => TCX_NEXT,
    }
}

/// [`deliver_translated`] of a reply masquerade translated back (see there).
#[inline(always)]
pub(crate) fn deliver_masq_reply(ctx: &TcContext, pod: IpKey) -> i32 {
    deliver_translated(ctx, pod, true)
}

/// hostPort's delivery of a new flow it translated (see
/// [`deliver_translated`]). With NetworkPolicy on, the packet goes to the
/// kernel, whose routing takes it through `to_pod`'s check: `uplink_in` has
/// no stack left on Linux 5.10 for the check's call below hostPort's.
#[inline(always)]
pub(crate) fn deliver_hostport(ctx: &TcContext, pod: IpKey) -> i32 {
    if crate::policy::on() {
        return TCX_NEXT;
    }
    deliver_translated(ctx, pod, false)
}

/// [`deliver_hostport`] of an IPv4 flow (`pod_ip` in network order as
/// native bytes), in a call of its own: inlined into `uplink_in`, it made
/// that function too big for LLVM to keep in the program's own frame, and
/// the extra frame of the program's entry took Linux 5.10's chain of calls
/// past 512 bytes of stack.
#[inline(never)]
pub(crate) fn deliver_hostport4(ctx: &TcContext, pod_ip: u32) -> i32 {
    deliver_hostport(ctx, IpKey::v4(pod_ip.to_ne_bytes()))
}
