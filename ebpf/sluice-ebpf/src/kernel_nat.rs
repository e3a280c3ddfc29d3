//! Traffic the node's own stack translates: kube-proxy's Services (iptables,
//! nftables, IPVS) and any other netfilter or IPVS DNAT. The datapath never
//! bypasses a translation the kernel owns (see `sluice_common::kernel_nat`):
//!
//! - [`to_service`]: `from_pod` hands a packet for the Service ranges to the
//!   stack, where kube-proxy's rules translate it.
//! - [`note_delivered`] (`to_pod`) and [`note_routed`] (`uplink_out`):
//!   packets the stack delivered into a pod or routed out of the uplink from
//!   one, without a Sluice redirect, have their flow remembered in `sl_kflows`
//!   (the flows the stack translated are among them).
//! - [`is_kernel_flow`]: before every redirect that would skip the stack
//!   (`from_pod`'s delivery and forwarding, the uplink's delivery into a pod in
//!   tc and XDP), a packet of such a flow goes to the stack instead, so
//!   conntrack (or IPVS) sees each packet of the flow both ways and undoes its
//!   translation on the replies.
//!
//! TCP, UDP and SCTP flows are tracked (what Services carry); IPv4 fragments
//! follow their datagram's first fragment (`sl_kflow_frag`); IPv6 packets with
//! extension headers are not tracked. Entries end by the map's LRU: when it is
//! full, a new flow takes the place of the one used longest ago (each lookup
//! of a flow counts as a use).
#![expect(
    clippy::needless_borrows_for_generic_args,
    reason = "keys go to the map helpers by reference: by value they would be copied out of the scratch slot onto the stack"
)]
use core::ptr::copy_nonoverlapping;

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::bpf_ktime_get_ns,
    macros::map,
    maps::lpm_trie::Key,
    maps::PerCpuArray,
    programs::{TcContext, XdpContext},
};
use sluice_common::{
    kernel_flow_origin, reason, FragKey, IpKey, KernelFlow, KernelFlowKey, FRAG_TIMEOUT_NS,
};

use crate::{
    counters::count,
    l3::{Headers, L3},
    l4::{ETH_LEN, PROTO_SCTP, PROTO_TCP, PROTO_UDP},
    maps::{ENDPOINTS, KFLOWS, KFLOW_FRAG, SVC, SVC6},
    packet::{ptr_at, pull, read},
};

/// Not pinned: the flow key `kernel_nat` looks up, off the stack.
#[map(name = "sl_kflow_key")]
pub(crate) static KFLOW_SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// Whether the packet's destination is in the Service ranges.
#[inline(always)]
pub fn to_service(h: &Headers) -> bool {
    // SAFETY: header pointers were bounds checked by `l3::parse`.
    match h.l3 {
        L3::V4(ip) => SVC.get(Key::new(32, unsafe { (*ip).dst_addr })).is_some(),
        L3::V6(ip) => SVC6.get(Key::new(128, unsafe { (*ip).dst_addr })).is_some(),
    }
}

/// The source and destination ports of the L4 header at `off`, in network
/// byte order.
pub trait Ports {
    fn ports(&self, off: usize) -> Option<[u16; 2]>;
}

impl Ports for TcContext {
    #[inline(always)]
    fn ports(&self, off: usize) -> Option<[u16; 2]> {
        read::<[u16; 2]>(self, off).ok()
    }
}

impl Ports for XdpContext {
    #[inline(always)]
    fn ports(&self, off: usize) -> Option<[u16; 2]> {
        // SAFETY: bounds checked by ptr_at; packet data has no alignment.
        ptr_at::<[u16; 2]>(self, off).map(|p| unsafe { p.cast_const().read_unaligned() })
    }
}

#[inline(always)]
fn tracked(proto: u8) -> bool {
    proto == PROTO_TCP || proto == PROTO_UDP || proto == PROTO_SCTP
}

/// This CPU's key of the packet being looked at: kept off the stack, since on
/// the uplink [`is_kernel_flow`] runs at the end of call chains that use most
/// of the 512 bytes the verifier allows them.
#[repr(C)]
pub struct Scratch {
    key: KernelFlowKey,
    /// The packet's IPv4 datagram, when it is a fragment.
    datagram: FragKey,
    _pad: u32,
}

/// What [`probe`] found.
const UNTRACKED: u8 = 0;
/// A whole packet: its flow in `key`.
const WHOLE: u8 = 1;
/// A first fragment: its flow in `key`, its datagram in `datagram`.
const FIRST_FRAGMENT: u8 = 2;
/// A later IPv4 fragment: no ports, only its datagram.
const LATER_FRAGMENT: u8 = 3;

/// Writes the flow key of the packet `h` into `s`, with the pod on its source
/// side (`pod_is_src`: the pod sent it) or its destination side. Returns what
/// it found ([`WHOLE`], ...).
#[inline(always)]
fn probe(p: &impl Ports, h: &Headers, pod_is_src: bool, s: *mut Scratch) -> u8 {
    // SAFETY: `s` is this CPU's scratch slot; header pointers were bounds
    // checked by `l3::parse`; every field of the key is written.
    unsafe {
        let k = &raw mut (*s).key;
        // Where the packet's source and destination address go in the key.
        let (src, dst) = if pod_is_src {
            (&raw mut (*k).pod, &raw mut (*k).peer)
        } else {
            (&raw mut (*k).peer, &raw mut (*k).pod)
        };
        let (off, found) = match h.l3 {
            L3::V4(ip) => {
                let proto = (*ip).proto;
                if !tracked(proto) {
                    return UNTRACKED;
                }
                let frags = u16::from_be_bytes((*ip).frags);
                let found = if frags & 0x3fff == 0 {
                    WHOLE
                } else {
                    let d = &raw mut (*s).datagram;
                    (*d).src_ip = (*ip).src_addr;
                    (*d).dst_ip = (*ip).dst_addr;
                    (*d).id = u16::from_ne_bytes((*ip).id);
                    (*d).proto = proto;
                    (*d)._pad = 0;
                    if frags & 0x1fff != 0 {
                        return LATER_FRAGMENT;
                    }
                    FIRST_FRAGMENT
                };
                *src = IpKey::v4((*ip).src_addr);
                *dst = IpKey::v4((*ip).dst_addr);
                (*k).proto = proto;
                (ETH_LEN + usize::from((*ip).vihl & 0x0f) * 4, found)
            }
            L3::V6(ip) => {
                let next = (*ip).next_hdr;
                if !tracked(next) {
                    return UNTRACKED;
                }
                copy_nonoverlapping((*ip).src_addr.as_ptr(), (*src).addr.as_mut_ptr(), 16);
                copy_nonoverlapping((*ip).dst_addr.as_ptr(), (*dst).addr.as_mut_ptr(), 16);
                (*k).proto = next;
                (ETH_LEN + 40, WHOLE)
            }
        };
        let Some([sport, dport]) = p.ports(off) else {
            return UNTRACKED;
        };
        if pod_is_src {
            (*k).pod_port = sport;
            (*k).peer_port = dport;
        } else {
            (*k).pod_port = dport;
            (*k).peer_port = sport;
        }
        (*k)._pad = 0;
        (*k)._pad2 = 0;
        found
    }
}

/// Whether `h` (the pod sent it: `pod_is_src`, or it is for the pod) is a
/// packet of a flow the node's stack translates: then it must go to the stack.
/// A first fragment of one makes its datagram's later fragments follow.
#[inline(never)]
pub fn is_kernel_flow<P: Ports>(p: &P, h: &Headers, pod_is_src: bool) -> bool {
    let Some(s) = KFLOW_SCRATCH.get_ptr_mut(0) else {
        return false;
    };
    let found = probe(p, h, pod_is_src, s);
    // SAFETY: `s` is this CPU's scratch slot, written by `probe`; map values
    // are only read.
    unsafe {
        if found == LATER_FRAGMENT {
            return KFLOW_FRAG
                .get(&(*s).datagram)
                .is_some_and(|t| bpf_ktime_get_ns().saturating_sub(*t) < FRAG_TIMEOUT_NS);
        }
        if found == UNTRACKED || KFLOWS.get(&(*s).key).is_none() {
            return false;
        }
        if found == FIRST_FRAGMENT {
            let _ = KFLOW_FRAG.insert(&(*s).datagram, &bpf_ktime_get_ns(), 0);
        }
    }
    true
}

/// `to_pod`: the stack delivered this packet into the pod on `pod_ifindex`
/// (no Sluice program redirected it there): its flow is remembered, unless a
/// socket of the node itself sent it (`skb->sk` set): the pod's replies to the
/// node's own addresses reach the stack anyway, and the kubelet's probes would
/// fill the table. (Not `ingress_ifindex`: netkit clears it, with the rest of
/// `skb_scrub_packet`, before its programs run.)
#[inline(never)]
pub fn note_delivered(ctx: &TcContext, pod_ifindex: u32) {
    // SAFETY: `skb` points at the context the kernel passed in; `sk` is only
    // compared with null.
    if !unsafe { (*ctx.skb.skb).__bindgen_anon_2.sk }.is_null() {
        return;
    }
    pull(ctx, crate::HEADERS_LEN);
    let Ok(h) = crate::l3::parse(ctx) else {
        return;
    };
    remember(ctx, &h, false, pod_ifindex, kernel_flow_origin::DELIVERED);
}

/// `from_pod`: the pod's packet goes to the stack for a Service address or
/// one of the node's own, where kube-proxy may translate it (a ClusterIP, a
/// NodePort): its socket is remembered ([`kernel_flow_origin::CLIENT`]), so
/// that what the stack then routes out of the uplink from it counts as the
/// stack's flow ([`note_routed`]).
#[inline(never)]
pub fn note_client(ctx: &TcContext, h: &Headers, pod_ifindex: u32) {
    let Some(s) = KFLOW_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    if probe_client(ctx, h, s) {
        // SAFETY: this CPU's scratch slot, written by `probe_client`.
        remember_key(
            unsafe { &(*s).key },
            pod_ifindex,
            kernel_flow_origin::CLIENT,
            reason::KERNEL_FLOW_CLIENT,
        );
    }
}

/// Writes the key of the socket that sent `h` (a pod's packet) into `s`: the
/// flow's key with the peer's side zero. Whether the packet has one.
#[inline(always)]
fn probe_client(p: &impl Ports, h: &Headers, s: *mut Scratch) -> bool {
    if !matches!(probe(p, h, true, s), WHOLE | FIRST_FRAGMENT) {
        return false;
    }
    // SAFETY: `s` is this CPU's scratch slot, written whole by `probe`.
    unsafe {
        (*s).key.peer = IpKey { addr: [0; 16] };
        (*s).key.peer_port = 0;
    }
    true
}

/// `uplink_out`: a packet leaving by the uplink. One that `forward` sent here
/// is Sluice's own ([`mark_forwarded`]); any other that a pod socket sent
/// after [`note_client`] remembered it was routed by the stack, maybe
/// translated, and its flow is remembered.
#[inline(never)]
pub fn note_routed(ctx: &TcContext) {
    if take_forwarded(ctx) {
        return;
    }
    pull(ctx, crate::HEADERS_LEN);
    let Ok(h) = crate::l3::parse(ctx) else {
        return;
    };
    // SAFETY: the map value is only read.
    let Some(ep) = (unsafe { ENDPOINTS.get(h.src_key()) }) else {
        return;
    };
    let pod_ifindex = ep.ifindex;
    let Some(s) = KFLOW_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's scratch slot, written by `probe_client`; the map
    // value is only read.
    if !probe_client(ctx, &h, s) || unsafe { KFLOWS.get(&(*s).key) }.is_none() {
        return;
    }
    remember(ctx, &h, true, pod_ifindex, kernel_flow_origin::ROUTED);
}

/// Remembers the flow of `h` (see [`probe`]) unless it is known.
#[inline(always)]
fn remember(ctx: &TcContext, h: &Headers, pod_is_src: bool, pod_ifindex: u32, origin: u8) {
    let Some(s) = KFLOW_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    if !matches!(probe(ctx, h, pod_is_src, s), WHOLE | FIRST_FRAGMENT) {
        return;
    }
    // SAFETY: this CPU's scratch slot, written by `probe`.
    remember_key(
        unsafe { &(*s).key },
        pod_ifindex,
        origin,
        reason::KERNEL_FLOW_NEW,
    );
}

/// Inserts `key` unless it is there, counting `new` when it was not.
#[inline(always)]
fn remember_key(key: &KernelFlowKey, pod_ifindex: u32, origin: u8, new: u32) {
    // A lookup first: it refreshes the entry's place in the LRU, and most
    // packets of a flow find it.
    // SAFETY: the map value is only read.
    if unsafe { KFLOWS.get(key) }.is_some() {
        return;
    }
    let v = KernelFlow {
        // SAFETY: plain helper call.
        created_ns: unsafe { bpf_ktime_get_ns() },
        pod_ifindex,
        origin,
        _pad: 0,
        _pad2: 0,
    };
    if KFLOWS.insert(key, &v, u64::from(BPF_NOEXIST)).is_ok() {
        count(new);
    }
}

/// `skb->cb` words of a packet `forward` redirected out of the node, with
/// [`FORWARDED_LEN`] xor its length (as `endpoint::DELIVERED`): the control
/// block survives the redirect to the egress device's tc hook, where
/// [`note_routed`] tells Sluice's own packets from the stack's.
const FORWARDED: u32 = 0x5e1c_f0d0;
const FORWARDED_LEN: u32 = 0xf0d0_5e1c;

/// Marks a packet `forward` is about to redirect (see [`FORWARDED`]).
#[inline(always)]
pub fn mark_forwarded(ctx: &TcContext) {
    // SAFETY: `skb` points at the context the kernel passed in; tc programs may
    // write cb[0..5].
    unsafe {
        let skb = ctx.skb.skb;
        (*skb).cb[0] = FORWARDED;
        (*skb).cb[1] = FORWARDED_LEN ^ (*skb).len;
    }
}

#[inline(always)]
fn take_forwarded(ctx: &TcContext) -> bool {
    // SAFETY: as above.
    unsafe {
        let skb = ctx.skb.skb;
        if (*skb).cb[0] == FORWARDED && (*skb).cb[1] == FORWARDED_LEN ^ (*skb).len {
            (*skb).cb[0] = 0;
            return true;
        }
    }
    false
}
