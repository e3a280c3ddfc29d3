//! Services from outside over IPv6: [`super::uplink`]'s translation with
//! `sl_lb_ct6`, the packet held in hostPort's IPv6 scratch entry (its key,
//! L4 header, rewrite and reverse entry: 40-byte keys on the stack of
//! `uplink_in`'s chain do not fit). A flow to another node's endpoint leaves
//! from the node address the client sent to (a NodePort); one to an external
//! or load balancer IPv6 address with its endpoint elsewhere is left to the
//! stack (the agent's `--node-ip` is IPv4). Each step a call of its own.
#![expect(
    clippy::needless_borrows_for_generic_args,
    reason = "keys go to the map helpers by reference: IPv6 keys are 20 to 40 bytes of a 512-byte stack"
)]
use aya_ebpf::{
    bindings::{bpf_fib_lookup as FibParams, BPF_FIB_LKUP_RET_SUCCESS, BPF_NOEXIST, TC_ACT_SHOT},
    helpers::bpf_fib_lookup,
    programs::{TcContext, XdpContext},
    EbpfContext,
};
use sluice_common::{event_kind, reason, svc_flags, svc_scope, Addr6, IpKey, SvcKey, SvcValue};

use super::{
    choose,
    uplink::{opens, DECIDED, NEW, REJECT},
};
use crate::{
    counters::count,
    csum,
    events::{self, note_drop},
    forward,
    hostport::{
        try_port,
        v6::{
            apply, parse, set_xdp_target, xdp_load, xdp_to, Scratch, HP_SCRATCH6, NOT_OURS,
            TRANSLATED,
        },
        PORT_TRIES,
    },
    l3::{self, same6, AF_INET6},
    l4::{ETH_LEN, PROTO_TCP, PROTO_UDP},
    maps::{ENDPOINTS, LB_CT6, LB_SVC, NODE_ADDRS6},
    packet::ptr_at,
    proto::{IP6_DST_OFF as DST_OFF, IP6_L4_OFF as L4_OFF, IP6_SRC_OFF as SRC_OFF},
};

/// This CPU's scratch entry, as the steps after [`decide`] find it.
#[inline(always)]
fn scratch() -> Option<&'static mut Scratch> {
    let p = HP_SCRATCH6.get_ptr_mut(0)?;
    // SAFETY: this CPU's entry, used by this program run only, between its
    // steps.
    Some(unsafe { &mut *p })
}

/// tc ingress of the uplink, IPv6: as [`super::uplink::from_uplink`].
#[inline(always)]
pub fn from_uplink(ctx: &TcContext) -> i32 {
    let mut v = decide(ctx);
    if v == NEW {
        v = start(true);
        if v == DECIDED {
            report();
        }
    }
    if v == REJECT {
        return super::reject::from_outside(ctx, false);
    }
    if v != DECIDED {
        return v;
    }
    match translate(ctx) {
        DECIDED => {
            count(reason::LB_UPLINK_FLOW);
            send(ctx)
        }
        v => v,
    }
}

/// The packet into the scratch entry, with its known flow ([`DECIDED`]),
/// or [`NEW`].
#[inline(never)]
fn decide(ctx: &TcContext) -> i32 {
    let Some(p) = parse(ctx) else {
        return NOT_OURS;
    };
    if !matches!(p.k.proto, PROTO_TCP | PROTO_UDP) {
        return NOT_OURS;
    }
    // SAFETY: map values are only read.
    match unsafe { LB_CT6.get(&p.k) } {
        Some(f) => {
            p.f = *f;
            DECIDED
        }
        None if p.k.proto == PROTO_TCP && !opens(ctx, ETH_LEN + 40) => NOT_OURS,
        None => NEW,
    }
}

/// The frontend for the packet in `p`. From outside (`external`): its
/// destination's external one, else the NodePort (the unspecified address)
/// when that is the node's, else a ClusterIP routed here. From a pod
/// (`super::packet`): its destination's of the node's scope.
#[inline(always)]
fn frontend(p: &Scratch, external: bool) -> Option<&'static SvcValue> {
    let mut k = SvcKey::new(IpKey::v6(p.k.dst_ip.0), p.k.dst_port, p.k.proto);
    if external {
        k = k.external();
        // SAFETY: map values are only read.
        if let Some(v) = unsafe { LB_SVC.get(&k) } {
            return Some(v);
        }
        // SAFETY: as above.
        if unsafe { NODE_ADDRS6.get(&p.k.dst_ip) }.is_some() {
            k.addr = IpKey::v6([0; 16]);
            // SAFETY: as above.
            return unsafe { LB_SVC.get(&k) };
        }
        k.scope = svc_scope::NODE;
    }
    // SAFETY: as above.
    unsafe { LB_SVC.get(&k) }
}

/// Session affinity's client from outside: its address folded into 63
/// bits (the socket hooks' clients are namespace cookies, below them).
#[inline(always)]
fn client_id(a: &Addr6) -> u64 {
    let mut hi = [0u8; 8];
    let mut lo = [0u8; 8];
    hi.copy_from_slice(&a.0[..8]);
    lo.copy_from_slice(&a.0[8..]);
    (1 << 63) | ((u64::from_ne_bytes(hi) ^ u64::from_ne_bytes(lo)) >> 1)
}

/// A new flow for the packet in the scratch entry, to a frontend's backend;
/// both directions in `sl_lb_ct6` (see `super::uplink::new_flow`: the same
/// choices, field by field here). `external`: from the uplink (else from a
/// pod, which always keeps its address).
#[inline(never)]
fn start(external: bool) -> i32 {
    let Some(p) = scratch() else {
        return NOT_OURS;
    };
    let Some(svc) = frontend(p, external) else {
        return NOT_OURS;
    };
    let Some(b) = choose(svc, || client_id(&p.k.src_ip)) else {
        if svc.flags & svc_flags::REJECT != 0 {
            return REJECT;
        }
        note_drop(reason::DROP_LB_NO_ENDPOINT, 0);
        return TC_ACT_SHOT;
    };
    // The agent gives an IPv6 frontend IPv6 backends only.
    if b.addr.as_v4().is_some() {
        return NOT_OURS;
    }
    // SAFETY: map values are only read.
    let local = !external || unsafe { ENDPOINTS.get(b.addr) }.is_some();
    // One test after the other: combined, the compiler OR'd the two lookups'
    // pointers, which the verifier refuses.
    // SAFETY: as above.
    if !local && unsafe { NODE_ADDRS6.get(&p.k.dst_ip) }.is_none() {
        return NOT_OURS;
    }
    // What the backend's packets become: from the frontend, to the client.
    p.back.src_ip = p.k.dst_ip;
    p.back.dst_ip = p.k.src_ip;
    p.back.src_port = p.k.dst_port;
    p.back.dst_port = p.k.src_port;
    // The backend's reverse key: to the client itself (local), or to the
    // node address it sent to.
    p.rk.src_ip = Addr6(b.addr.addr);
    p.rk.dst_ip = if local { p.k.src_ip } else { p.k.dst_ip };
    p.rk.src_port = b.port;
    p.rk.proto = p.k.proto;
    let tries = if local { 1 } else { PORT_TRIES };
    let mut i = 0;
    while i < tries {
        p.rk.dst_port = try_port(p.k.src_port, i);
        if LB_CT6
            .insert(&p.rk, &p.back, u64::from(BPF_NOEXIST))
            .is_ok()
        {
            p.f.src_ip = p.rk.dst_ip;
            p.f.dst_ip = p.rk.src_ip;
            p.f.src_port = p.rk.dst_port;
            p.f.dst_port = b.port;
            let _ = LB_CT6.insert(&p.k, &p.f, 0);
            count(if external {
                reason::LB_UPLINK_NEW
            } else {
                reason::LB_PACKET_NEW
            });
            return DECIDED;
        }
        i += 1;
    }
    note_drop(reason::DROP_LB_NO_PORT, 0);
    TC_ACT_SHOT
}

/// The new flow in the scratch entry, to a running monitor (as
/// `super::uplink`'s).
#[inline(never)]
fn report() {
    let Some(p) = scratch() else {
        return;
    };
    events::flow6(
        event_kind::SERVICE_FLOW,
        &p.k,
        Some(&p.f.dst_ip),
        p.f.dst_port,
        0,
    );
}

/// Rewrites the packet as the scratch entry says.
#[inline(never)]
fn translate(ctx: &TcContext) -> i32 {
    let Some(p) = scratch() else {
        return NOT_OURS;
    };
    if !apply(ctx, p) {
        note_drop(reason::DROP_MALFORMED, 0);
        return TC_ACT_SHOT;
    }
    DECIDED
}

/// As `super::uplink`'s: a pod here is `uplink_in`'s to deliver
/// ([`NOT_OURS`]); the rest leaves by FIB lookup.
#[inline(never)]
fn send(ctx: &TcContext) -> i32 {
    let Some(p) = scratch() else {
        return NOT_OURS;
    };
    // SAFETY: map values are only read.
    if unsafe { ENDPOINTS.get(IpKey::v6(p.f.dst_ip.0)) }.is_some() {
        return NOT_OURS;
    }
    let Ok(h) = l3::parse(ctx) else {
        return crate::TCX_NEXT;
    };
    // SAFETY: `skb` points at the context the kernel passed in.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    forward::forward(ctx, &h, ifindex, false)
}

/// What [`from_uplink_xdp`] found: not a flow XDP handles, translated for
/// a pod here, or one whose both ends change (for [`xdp_send`]).
pub const XDP_PASS_ON: u32 = 0;
pub const XDP_POD: u32 = 1;
pub const XDP_SEND: u32 = 2;

/// XDP (native mode only, see `nat::dnat_xdp`), IPv6: as
/// `super::uplink::from_uplink_xdp`: a packet of a known flow from outside
/// to a pod here (only its destination rewritten), translated with the
/// checksum updated by hand ([`XDP_POD`], the pod in
/// `hostport::v6::xdp_pod`); one whose both ends change, its rewrite in the
/// scratch entry ([`XDP_SEND`]). A flow's first packet goes on to tc. A
/// call of its own beside hostPort's, its state in the same scratch entry.
#[inline(never)]
pub fn from_uplink_xdp(ctx: &XdpContext) -> u32 {
    if super::uplink::config().is_none() {
        return XDP_PASS_ON;
    }
    let Some((p, frame)) = xdp_load(ctx) else {
        return XDP_PASS_ON;
    };
    if !matches!(p.k.proto, PROTO_TCP | PROTO_UDP) {
        return XDP_PASS_ON;
    }
    // SAFETY: map values are only read.
    let Some(f) = (unsafe { LB_CT6.get(&p.k) }) else {
        return XDP_PASS_ON;
    };
    // SAFETY: as above.
    let here = unsafe { ENDPOINTS.get(IpKey::v6(f.dst_ip.0)) }.is_some();
    if !same6(&f.src_ip, &p.k.src_ip) || f.src_port != p.k.src_port {
        if here {
            return XDP_PASS_ON;
        }
        // Field by field: a whole copy is a `memmove` call.
        p.f.src_ip = f.src_ip;
        p.f.dst_ip = f.dst_ip;
        p.f.src_port = f.src_port;
        p.f.dst_port = f.dst_port;
        return XDP_SEND;
    }
    if !here {
        return XDP_PASS_ON;
    }
    set_xdp_target(p, f.dst_ip, f.dst_port);
    if !xdp_to(ctx, &frame, p) {
        return XDP_PASS_ON;
    }
    count(reason::LB_UPLINK_FLOW);
    XDP_POD
}

/// XDP, IPv6: `super::uplink::xdp_send` for the flow in the scratch entry
/// (both addresses and ports rewritten, the L4 checksum by hand: IPv6 has
/// no header checksum). Returns `2 << 32 | verdict`, or 0 (untouched, on to
/// tc).
#[inline(never)]
pub fn xdp_send(ctx: &XdpContext) -> u64 {
    let (Some(fib), Some(p)) = (super::uplink::fib(), HP_SCRATCH6.get_ptr(0)) else {
        return 0;
    };
    // SAFETY: this CPU's entry, written by `from_uplink_xdp` for this packet.
    let p = unsafe { &*p };
    let Ok(h) = l3::parse(ctx) else {
        return 0;
    };
    let Some((_, _, next)) = h.v6_fields() else {
        return 0;
    };
    if h.ttl() <= 1 || next != p.k.proto {
        return 0;
    }
    let (Some(src), Some(dst), Some(ports), Some(plen)) = (
        ptr_at::<[u16; 8]>(ctx, SRC_OFF),
        ptr_at::<[u16; 8]>(ctx, DST_OFF),
        ptr_at::<[u16; 2]>(ctx, L4_OFF),
        ptr_at::<[u8; 2]>(ctx, ETH_LEN + 4),
    ) else {
        return 0;
    };
    // SAFETY: this CPU's entry; bounds checked by ptr_at.
    let (ifindex, rc) = unsafe {
        let ifindex = (*ctx.ctx).ingress_ifindex;
        crate::mem::zero_words(fib);
        (*fib).family = AF_INET6;
        (*fib).l4_protocol = p.k.proto;
        (*fib).__bindgen_anon_1.tot_len = u16::from_be_bytes(*plen).saturating_add(40);
        (*fib).ifindex = ifindex;
        core::ptr::copy_nonoverlapping(
            p.f.src_ip.0.as_ptr(),
            (&raw mut (*fib).__bindgen_anon_3.ipv6_src).cast::<u8>(),
            16,
        );
        core::ptr::copy_nonoverlapping(
            p.f.dst_ip.0.as_ptr(),
            (&raw mut (*fib).__bindgen_anon_4.ipv6_dst).cast::<u8>(),
            16,
        );
        (
            ifindex,
            bpf_fib_lookup(
                ctx.as_ptr(),
                fib,
                core::mem::size_of::<FibParams>() as i32,
                0,
            ),
        )
    };
    if rc != i64::from(BPF_FIB_LKUP_RET_SUCCESS) {
        return 0;
    }
    // The checksum pointer on the path that uses it (see
    // `csum::l4_replace`).
    let c = match p.k.proto {
        PROTO_TCP => ptr_at::<u16>(ctx, L4_OFF + 16),
        PROTO_UDP => ptr_at::<u16>(ctx, L4_OFF + 6),
        _ => None,
    };
    let Some(c) = c else {
        return 0;
    };
    // SAFETY: bounds checked by ptr_at / l3::parse; `fib` as above.
    unsafe {
        let k = &p.k;
        csum::l4_replace6(
            c,
            k.proto,
            (&k.src_ip, &p.f.src_ip),
            (k.src_port, p.f.src_port),
        );
        csum::l4_replace6(
            c,
            k.proto,
            (&k.dst_ip, &p.f.dst_ip),
            (k.dst_port, p.f.dst_port),
        );
        *ports = [p.f.src_port, p.f.dst_port];
        // Copies, not assignments (those became `memmove` calls).
        core::ptr::copy_nonoverlapping(p.f.src_ip.0.as_ptr(), src.cast::<u8>(), 16);
        core::ptr::copy_nonoverlapping(p.f.dst_ip.0.as_ptr(), dst.cast::<u8>(), 16);
        h.decrement_ttl();
        h.set_macs((*fib).dmac, (*fib).smac);
        super::uplink::xdp_out(ifindex, (*fib).ifindex)
    }
}

/// Host veth ingress, IPv6: a local backend's reply to a client from
/// outside, as `super::uplink::from_pod`.
#[inline(never)]
pub fn from_pod(ctx: &TcContext) -> i32 {
    let Some(p) = parse(ctx) else {
        return NOT_OURS;
    };
    // SAFETY: map values are only read.
    let Some(f) = (unsafe { LB_CT6.get(&p.k) }) else {
        return NOT_OURS;
    };
    p.f = *f;
    if !apply(ctx, p) {
        note_drop(reason::DROP_MALFORMED, 0);
        return TC_ACT_SHOT;
    }
    count(reason::LB_UPLINK_FLOW);
    TRANSLATED
}

/// Host veth ingress, IPv6: `super::packet::start` for IPv6 (a pod outside
/// the hooks' cgroup, its new flow to a ClusterIP): [`crate::TCX_NEXT`]
/// when translated (the kernel routes the first packet), [`NOT_OURS`], or
/// a drop verdict.
#[inline(always)]
pub fn packet_start(ctx: &TcContext) -> i32 {
    match decide(ctx) {
        NEW => {}
        _ => return NOT_OURS,
    }
    if start(false) != DECIDED {
        return NOT_OURS;
    }
    // A failed rewrite is translate's drop, never NOT_OURS: its helpers
    // may have moved the packet under the caller's pointers.
    match translate(ctx) {
        DECIDED => crate::TCX_NEXT,
        v => v,
    }
}
