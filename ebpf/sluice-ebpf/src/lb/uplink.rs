//! Services from outside: packets arriving on the uplink for a NodePort (a
//! node address), an external IP or a load balancer IP, translated in tc
//! (`uplink_in`), the part of kube-proxy's `KUBE-NODEPORTS` and `KUBE-EXT-*`
//! chains (and of Cilium's NodePort) that a socket hook cannot do.
//!
//! - A new flow (no `sl_lb_ct` entry) looks its destination up among the
//!   external frontends (`svc_scope::EXTERNAL`: the agent gives them only
//!   this node's endpoints under `externalTrafficPolicy: Local`) and gets a
//!   backend ([`super::choose`]; session affinity by client address).
//! - A backend on this node: only the destination is rewritten, so the pod
//!   sees the client's own address (what `Local` promises; with `Cluster`
//!   kube-proxy would masquerade, Cilium does not for a local backend).
//! - A backend elsewhere (`Cluster`): the source becomes the node address
//!   the client sent to (or `sl_lb_cfg`'s `snat4` for an address that is
//!   not the node's), with the client's own port unless another flow to
//!   that backend holds it, and the packet leaves by FIB redirect: the
//!   backend's node answers this node, which translates the reply back.
//! - Both directions go in `sl_lb_ct` (client -> frontend and backend ->
//!   client or node), so the flow keeps its backend; a local backend's
//!   replies are translated in `from_pod` ([`from_pod`]).
//! - A frontend without endpoints drops the packet, counted
//!   (`drop_lb_no_endpoint`): kube-proxy drops external traffic to a `Local`
//!   Service without local endpoints the same way.
//!
//! IPv4 TCP and UDP; IPv6 from outside and fragments are left to the stack.
use aya_ebpf::{
    bindings::{BPF_NOEXIST, TC_ACT_SHOT},
    programs::TcContext,
};
use sluice_common::{lb_flags, reason, HpFlow, IpKey, LbConfig, NatKey, SvcKey, SvcValue};

use super::choose;
use crate::{
    counters::count,
    endpoint::deliver_translated,
    events::note_drop,
    forward,
    hostport::{
        try_port,
        v4::{apply, parse},
        v6::{NOT_OURS, TRANSLATED},
        PORT_TRIES,
    },
    l3,
    l4::{PROTO_TCP, PROTO_UDP},
    maps::{ENDPOINTS, LB_CONFIG, LB_CT, LB_SVC, NODE_ADDRS},
};

/// `sl_lb_cfg` when the agent wrote an external frontend.
#[inline(always)]
pub fn config() -> Option<&'static LbConfig> {
    LB_CONFIG
        .get(0)
        .filter(|c| c.flags & lb_flags::EXTERNAL != 0)
}

/// The external frontend for `dst`:`port`: that address's, else the
/// NodePort (the unspecified address) when `dst` is the node's.
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "keys and values go to the map helpers by reference, not copied onto the stack"
)]
#[inline(always)]
fn frontend(dst: [u8; 4], port: u16, proto: u8) -> Option<SvcValue> {
    let mut k = SvcKey::new(IpKey::v4(dst), port, proto).external();
    // SAFETY: map values are only read.
    if let Some(v) = unsafe { LB_SVC.get(&k) } {
        return Some(*v);
    }
    // SAFETY: as above.
    unsafe { NODE_ADDRS.get(dst) }?;
    k.addr = IpKey::v4([0; 4]);
    // SAFETY: as above.
    unsafe { LB_SVC.get(&k) }.copied()
}

/// Session affinity's client from outside: its address (the socket hooks'
/// clients are network namespace cookies, which are never this high).
#[inline(always)]
fn client_id(src: [u8; 4]) -> u64 {
    (1 << 63) | u64::from(u32::from_be_bytes(src))
}

/// The flow `k` (client -> frontend) to backend `b` (`ip`, `port`): the
/// entries of both directions. A local backend keeps the client's address;
/// a remote one gets `via` (a node address) as the source, with the
/// client's port or, when another flow to the same backend holds it, a
/// hashed other one (the reverse entry is inserted first with
/// `BPF_NOEXIST`, which makes the port this flow's). `None`: no port free.
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "keys and values go to the map helpers by reference, not copied onto the stack"
)]
#[inline(always)]
fn new_flow(k: &NatKey, ip: [u8; 4], port: u16, local: bool, via: [u8; 4]) -> Option<HpFlow> {
    // What the backend's packets become: from the frontend, to the client.
    let back = HpFlow {
        src_ip: k.dst_ip,
        dst_ip: k.src_ip,
        src_port: k.dst_port,
        dst_port: k.src_port,
        _pad: 0,
    };
    let (src, tries) = if local {
        (k.src_ip, 1)
    } else {
        (via, PORT_TRIES)
    };
    let mut i = 0;
    while i < tries {
        let sport = try_port(k.src_port, i);
        let rk = NatKey::new(ip, src, port, sport, k.proto);
        if LB_CT.insert(&rk, &back, u64::from(BPF_NOEXIST)).is_ok() {
            let out = HpFlow {
                src_ip: src,
                dst_ip: ip,
                src_port: sport,
                dst_port: port,
                _pad: 0,
            };
            let _ = LB_CT.insert(k, &out, 0);
            return Some(out);
        }
        i += 1;
    }
    None
}

/// tc ingress of the uplink: a packet of a flow to a Service from outside,
/// or of a remote backend's reply to one, translated and sent on.
/// [`NOT_OURS`]: neither.
// A call of its own: `uplink_in`'s masquerade and hostPort calls come first.
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "keys and values go to the map helpers by reference, not copied onto the stack"
)]
#[inline(never)]
pub fn from_uplink(ctx: &TcContext) -> i32 {
    let Some(cfg) = config() else {
        return NOT_OURS;
    };
    let snat4 = cfg.snat4;
    let Some((ip, l4)) = parse(ctx) else {
        return NOT_OURS;
    };
    if !matches!(ip.proto, PROTO_TCP | PROTO_UDP) {
        return NOT_OURS;
    }
    let k = NatKey::new(ip.src_addr, ip.dst_addr, l4.sport, l4.dport, ip.proto);
    // SAFETY: map values are only read.
    let f = if let Some(f) = unsafe { LB_CT.get(&k) }.copied() {
        count(reason::LB_UPLINK_FLOW);
        f
    } else {
        let svc = match frontend(ip.dst_addr, l4.dport, ip.proto) {
            Some(svc) => svc,
            None => return NOT_OURS,
        };
        let Some(b) = choose(&svc, || client_id(ip.src_addr)) else {
            note_drop(reason::DROP_LB_NO_ENDPOINT, 0);
            return TC_ACT_SHOT;
        };
        // The agent gives an IPv4 frontend IPv4 backends only.
        let Some(bip) = b.addr.as_v4() else {
            return NOT_OURS;
        };
        // SAFETY: map values are only read.
        let local = unsafe { ENDPOINTS.get(IpKey::v4(bip)) }.is_some();
        // SAFETY: as above.
        let via = if unsafe { NODE_ADDRS.get(ip.dst_addr) }.is_some() {
            ip.dst_addr
        } else {
            snat4
        };
        if !local && via == [0; 4] {
            return NOT_OURS;
        }
        let Some(f) = new_flow(&k, bip, b.port, local, via) else {
            note_drop(reason::DROP_LB_NO_PORT, 0);
            return TC_ACT_SHOT;
        };
        count(reason::LB_UPLINK_NEW);
        f
    };
    if apply(ctx, (ip.src_addr, ip.dst_addr), &l4, &f).is_err() {
        note_drop(reason::DROP_MALFORMED, 0);
        return TC_ACT_SHOT;
    }
    send(ctx, f.dst_ip)
}

/// A translated packet to `dst`: into its pod when it is one here, else out
/// by FIB lookup (to a remote backend, or back to the client).
#[inline(always)]
fn send(ctx: &TcContext, dst: [u8; 4]) -> i32 {
    // SAFETY: map values are only read.
    if unsafe { ENDPOINTS.get(IpKey::v4(dst)) }.is_some() {
        return deliver_translated(ctx, IpKey::v4(dst), false);
    }
    // The rewrite's helpers invalidated the packet pointers.
    let Ok(h) = l3::parse(ctx) else {
        return crate::TCX_NEXT;
    };
    // SAFETY: `skb` points at the context the kernel passed in.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    forward::forward(ctx, &h, ifindex, false)
}

/// Host veth ingress: a local backend's reply to a client from outside
/// (`sl_lb_ct`), rewritten to come from the Service address. [`NOT_OURS`]:
/// not one; [`TRANSLATED`]: rewritten (the caller routes it); else a drop
/// verdict.
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "keys and values go to the map helpers by reference, not copied onto the stack"
)]
#[inline(never)]
pub fn from_pod(ctx: &TcContext) -> i32 {
    let Some((ip, l4)) = parse(ctx) else {
        return NOT_OURS;
    };
    let k = NatKey::new(ip.src_addr, ip.dst_addr, l4.sport, l4.dport, ip.proto);
    // SAFETY: map values are only read.
    let Some(f) = (unsafe { LB_CT.get(&k) }).copied() else {
        return NOT_OURS;
    };
    if apply(ctx, (ip.src_addr, ip.dst_addr), &l4, &f).is_err() {
        note_drop(reason::DROP_MALFORMED, 0);
        return TC_ACT_SHOT;
    }
    count(reason::LB_UPLINK_FLOW);
    TRANSLATED
}
