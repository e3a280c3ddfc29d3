//! Services from outside: packets arriving on the uplink for a NodePort (a
//! node address), an external IP, a load balancer IP or a ClusterIP routed
//! to the node, translated in tc (`uplink_in`), the part of kube-proxy's
//! `KUBE-NODEPORTS` and `KUBE-EXT-*` chains (and of Cilium's NodePort) that a
//! socket hook cannot do.
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
//!   Service without local endpoints the same way; where the Service port
//!   has no endpoint at all, the opening packet is answered with port
//!   unreachable, as kube-proxy's `REJECT` does (`super::reject`).
//!
//! - In native XDP ([`from_uplink_xdp`], both families) the packets of a
//!   known flow to a pod here are translated and delivered before any skb
//!   exists, and those of a flow to a backend elsewhere, and its answers,
//!   translated and sent back out ([`xdp_send`]) where the FIB knows the
//!   next hop; first packets and the rest go on to tc.
//! - `sl_lb_ct` also holds the per-packet flows of pods outside the hooks'
//!   cgroup (`super::packet`): their replies from another node come back
//!   through here.
//!
//! IPv4 TCP and UDP here, IPv6 in `super::uplink6`; fragments are left to
//! the stack.
use core::mem::size_of;

use aya_ebpf::{
    bindings::{
        bpf_fib_lookup as FibParams, xdp_action, BPF_FIB_LKUP_RET_SUCCESS, BPF_NOEXIST, TC_ACT_SHOT,
    },
    helpers::{bpf_fib_lookup, bpf_redirect},
    macros::map,
    maps::PerCpuArray,
    programs::{TcContext, XdpContext},
    EbpfContext,
};
use sluice_common::{
    config_flags, event_kind, lb_flags, reason, svc_flags, svc_scope, HpFlow, IpKey, LbConfig,
    NatKey, SvcKey, SvcValue,
};

use super::choose;
use crate::{
    counters::count,
    csum,
    events::{self, note_drop},
    forward,
    hostport::{
        try_port,
        v4::{apply, parse},
        v6::{NOT_OURS, TRANSLATED},
        PORT_TRIES,
    },
    l3::{self, Headers, AF_INET},
    l4::{self, ETH_LEN, L4, PROTO_TCP, PROTO_UDP},
    maps::{ENDPOINTS, LB_CONFIG, LB_CT, LB_SVC, NODE_ADDRS},
    packet::ptr_at,
};

/// `sl_lb_cfg` when `sl_lb_ct` may hold flows: the agent wrote an external
/// frontend, or pods outside the hooks' cgroup get per-packet translation
/// (`super::packet`).
#[inline(always)]
pub fn config() -> Option<&'static LbConfig> {
    LB_CONFIG
        .get(0)
        .filter(|c| c.flags & (lb_flags::EXTERNAL | lb_flags::PER_PACKET) != 0)
}

/// The external frontend for `dst`:`port`: that address's, else the
/// NodePort (the unspecified address) when `dst` is the node's, else a
/// ClusterIP routed to this node from outside (kube-proxy translates those
/// too), with the endpoints the cluster's own clients get.
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
    if unsafe { NODE_ADDRS.get(dst) }.is_none() {
        k.scope = svc_scope::NODE;
        // SAFETY: as above.
        return unsafe { LB_SVC.get(&k) }.copied();
    }
    k.addr = IpKey::v4([0; 4]);
    // SAFETY: as above.
    unsafe { LB_SVC.get(&k) }.copied()
}

/// Session affinity's client from outside: its address (the socket hooks'
/// clients are network namespace cookies, which are never this high).
#[inline(always)]
pub(super) fn client_id(src: [u8; 4]) -> u64 {
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
pub(super) fn new_flow(
    k: &NatKey,
    ip: [u8; 4],
    port: u16,
    local: bool,
    via: [u8; 4],
) -> Option<HpFlow> {
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
    // One key, rewritten each try (a key per try, unrolled, took a stack
    // slot each).
    let mut rk = NatKey::new(ip, src, port, k.src_port, k.proto);
    let mut i = 0;
    while i < tries {
        rk.dst_port = try_port(k.src_port, i);
        if LB_CT.insert(&rk, &back, u64::from(BPF_NOEXIST)).is_ok() {
            let out = HpFlow {
                src_ip: src,
                dst_ip: ip,
                src_port: rk.dst_port,
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

/// What a packet's flow is to become.
enum Flow {
    /// Not a Service flow.
    NotOurs,
    /// Dropped for `reason`.
    Drop(u32),
    /// Answered with port unreachable (`svc_flags::REJECT`).
    Reject,
    /// Translated to this (new or known) flow.
    To(HpFlow),
}

/// A new flow for the packet `k` (client -> destination, not in
/// `sl_lb_ct`) when the destination is an external frontend: a backend
/// chosen, both directions recorded (see [`new_flow`]). `snat4`: where a
/// flow to another node's backend comes from when the client did not send
/// to a node address.
#[inline(always)]
fn flow_of(k: &NatKey, snat4: [u8; 4]) -> Flow {
    let Some(svc) = frontend(k.dst_ip, k.dst_port, k.proto) else {
        return Flow::NotOurs;
    };
    let src = k.src_ip;
    let Some(b) = choose(&svc, || client_id(src)) else {
        if svc.flags & svc_flags::REJECT != 0 {
            return Flow::Reject;
        }
        return Flow::Drop(reason::DROP_LB_NO_ENDPOINT);
    };
    // The agent gives an IPv4 frontend IPv4 backends only.
    let Some(bip) = b.addr.as_v4() else {
        return Flow::NotOurs;
    };
    // SAFETY: map values are only read.
    let local = unsafe { ENDPOINTS.get(IpKey::v4(bip)) }.is_some();
    // SAFETY: as above.
    let via = if unsafe { NODE_ADDRS.get(k.dst_ip) }.is_some() {
        k.dst_ip
    } else {
        snat4
    };
    if !local && via == [0; 4] {
        return Flow::NotOurs;
    }
    match new_flow(k, bip, b.port, local, via) {
        Some(f) => {
            count(reason::LB_UPLINK_NEW);
            Flow::To(f)
        }
        None => Flow::Drop(reason::DROP_LB_NO_PORT),
    }
}

/// A packet between the steps of its translation ([`decide`], [`start`],
/// [`translate`]): its key, its L4 header and the flow it becomes.
#[derive(Clone, Copy, Default)]
pub(super) struct Step {
    pub(super) k: NatKey,
    pub(super) l4: L4,
    pub(super) f: HpFlow,
    pub(super) snat4: [u8; 4],
}

/// Not pinned: [`Step`] per CPU (off the stack: the steps' locals in one
/// frame, below `uplink_in`'s, passed the 512 bytes a chain of calls may use
/// on Linux 5.10, where `uplink_in` inlines masquerade).
#[map(name = "sl_lb_step")]
pub(super) static STEP: PerCpuArray<Step> = PerCpuArray::with_max_entries(1, 0);

/// What the steps return to go on (else [`NOT_OURS`] or a drop verdict):
/// the flow is known (translate it), or a new one is to be started.
pub(super) const DECIDED: i32 = i32::MIN + 2;
pub(super) const NEW: i32 = i32::MIN + 3;
/// The packet is to be answered with port unreachable
/// (`super::reject::from_outside`).
pub(super) const REJECT: i32 = i32::MIN + 4;

/// tc ingress of the uplink: a packet of a flow to a Service from outside,
/// or of a remote backend's reply to one, translated and sent on.
/// [`NOT_OURS`]: neither, or translated to a pod here (see [`send`]). Calls of their own, one after the other (each
/// frame beside the others, not on top).
#[inline(always)]
pub fn from_uplink(ctx: &TcContext) -> i32 {
    if l4::is_ipv6(ctx) {
        if config().is_none() {
            return NOT_OURS;
        }
        return super::uplink6::from_uplink(ctx);
    }
    let mut v = decide(ctx);
    if v == NEW {
        v = start();
        if v == DECIDED {
            report();
        }
    }
    if v == REJECT {
        return super::reject::from_outside(ctx, true);
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

/// The packet's key and L4 header into this CPU's [`Step`], with its known
/// flow ([`DECIDED`]), or [`NEW`].
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "keys go to the map helpers by reference, not copied onto the stack"
)]
#[inline(never)]
fn decide(ctx: &TcContext) -> i32 {
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
    let Some(step) = STEP.get_ptr_mut(0) else {
        return NOT_OURS;
    };
    // SAFETY: this CPU's slot; only this program uses it, between its
    // steps.
    let step = unsafe { &mut *step };
    step.k = NatKey::new(ip.src_addr, ip.dst_addr, l4.sport, l4.dport, ip.proto);
    step.l4 = l4;
    step.snat4 = snat4;
    // SAFETY: map values are only read.
    match unsafe { LB_CT.get(&step.k) } {
        Some(f) => {
            step.f = *f;
            DECIDED
        }
        None if ip.proto == PROTO_TCP && !opens(ctx, ETH_LEN + usize::from(ip.vihl & 0x0f) * 4) => {
            NOT_OURS
        }
        None => NEW,
    }
}

/// Whether the TCP segment at `l4` opens a connection (SYN without ACK):
/// only such a segment looks for a frontend; the rest of the uplink's
/// traffic (to pods, from other nodes) pays the flow lookup alone.
#[inline(always)]
pub(super) fn opens(ctx: &TcContext, l4: usize) -> bool {
    const SYN: u8 = 0x02;
    const ACK: u8 = 0x10;
    l4::tcp_flags(ctx, l4) & (SYN | ACK) == SYN
}

/// A new flow for this CPU's [`Step`] ([`flow_of`]).
#[inline(never)]
fn start() -> i32 {
    let Some(step) = STEP.get_ptr_mut(0) else {
        return NOT_OURS;
    };
    // SAFETY: as in `decide`.
    let step = unsafe { &mut *step };
    match flow_of(&step.k, step.snat4) {
        Flow::NotOurs => NOT_OURS,
        Flow::Drop(why) => {
            note_drop(why, 0);
            TC_ACT_SHOT
        }
        Flow::Reject => REJECT,
        Flow::To(f) => {
            step.f = f;
            DECIDED
        }
    }
}

/// The new flow of this CPU's [`Step`], to a running monitor (`sluicectl
/// monitor --type service`): client, the address it sent to, the backend.
/// A call beside the steps (the event's own call below it).
#[inline(never)]
fn report() {
    let Some(step) = STEP.get_ptr(0) else {
        return;
    };
    // SAFETY: this CPU's slot, written by the steps before for this packet.
    let step = unsafe { &*step };
    events::flow(
        event_kind::SERVICE_FLOW,
        &step.k,
        step.f.dst_ip,
        step.f.dst_port,
        0,
    );
}

/// Rewrites the packet as its [`Step`] says; [`DECIDED`]: [`send`] it on.
#[inline(never)]
pub(super) fn translate(ctx: &TcContext) -> i32 {
    let Some(step) = STEP.get_ptr(0) else {
        return NOT_OURS;
    };
    // SAFETY: this CPU's slot, written by the steps before for this packet.
    let (k, l4, f) = unsafe { ((*step).k, (*step).l4, (*step).f) };
    if apply(ctx, (k.src_ip, k.dst_ip), &l4, &f).is_err() {
        note_drop(reason::DROP_MALFORMED, 0);
        return TC_ACT_SHOT;
    }
    DECIDED
}

/// What [`from_uplink_xdp`] did with a packet.
pub enum Xdp {
    /// Not a Service flow XDP handles: the rest of `uplink_xdp`, then tc.
    Pass,
    /// Translated for this pod here, to deliver.
    Pod(IpKey),
    /// Translated and sent on (a backend elsewhere, or its answer going
    /// back to the client): this verdict.
    Sent(u32),
}

/// XDP (native mode only, see `nat::dnat_xdp`): a packet from outside of a
/// known Service flow. To a pod on this node with the client's own address:
/// its destination rewritten with incremental checksum updates, the pod
/// returned to deliver to. Both ends rewritten (a backend on another node,
/// or its answer to the client): sent on from here ([`xdp_send`]). A flow's
/// first packet goes on to tc, which gives it its backend and records it
/// (choosing here too pushed `uplink_xdp`'s chain of calls past 512 bytes
/// of stack). IPv6 in `super::uplink6::from_uplink_xdp`.
#[inline(always)]
pub fn from_uplink_xdp(ctx: &XdpContext, h: &Headers) -> Xdp {
    use super::uplink6;
    // Each send a call beside the one that found the flow, not below it:
    // `uplink_xdp`'s chain.
    let sent = |v: u64| match v {
        0 => Xdp::Pass,
        v => Xdp::Sent(v as u32),
    };
    if h.v4_fields().is_none() {
        return match uplink6::from_uplink_xdp(ctx) {
            uplink6::XDP_POD => match crate::hostport::v6::xdp_pod() {
                Some(pod) => Xdp::Pod(pod),
                None => Xdp::Pass,
            },
            uplink6::XDP_SEND => sent(uplink6::xdp_send(ctx)),
            _ => Xdp::Pass,
        };
    }
    let v = xdp_translate(ctx);
    match v >> 32 {
        1 => Xdp::Pod(IpKey::v4((v as u32).to_ne_bytes())),
        2 => sent(xdp_send(ctx)),
        _ => Xdp::Pass,
    }
}

/// [`from_uplink_xdp`]'s work, in a call of its own beside hostPort's IPv6
/// call (not inlined into `uplink_xdp`'s frame), parsing the frame itself
/// (no packet pointers passed in). Returns the pod's address as
/// `1 << 32 | address` (native byte order), `2 << 32` for a flow whose
/// both ends change (its rewrite in `sl_lb_step`, for [`xdp_send`]), or 0.
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "keys go to the map helpers by reference, not copied onto the stack"
)]
#[inline(never)]
fn xdp_translate(ctx: &XdpContext) -> u64 {
    if config().is_none() {
        return 0;
    }
    let Ok(h) = l3::parse(ctx) else {
        return 0;
    };
    let Some(v4) = h.v4_fields() else {
        return 0;
    };
    let (ip, src, dst, proto) = (v4.hdr, v4.src, v4.dst, v4.proto);
    if v4.fragment() {
        return 0;
    }
    let l4_off = v4.l4_off();
    let csum_off = match proto {
        PROTO_TCP => l4_off + 16,
        PROTO_UDP => l4_off + 6,
        _ => return 0,
    };
    let Some(ports) = ptr_at::<[u16; 2]>(ctx, l4_off) else {
        return 0;
    };
    // SAFETY: bounds checked by ptr_at.
    let [sport, dport] = unsafe { *ports };
    let k = NatKey::new(src, dst, sport, dport, proto);
    // SAFETY: map values are only read.
    let Some(f) = unsafe { LB_CT.get(&k) }.copied() else {
        return 0;
    };
    // SAFETY: as above.
    let here = unsafe { ENDPOINTS.get(IpKey::v4(f.dst_ip)) }.is_some();
    if f.src_ip != src || f.src_port != sport {
        // Both ends rewritten: a backend elsewhere, or its answer.
        if here {
            return 0;
        }
        let Some(step) = STEP.get_ptr_mut(0) else {
            return 0;
        };
        // SAFETY: this CPU's slot, for this packet's next call.
        unsafe { (*step).f = f };
        return 2 << 32;
    }
    if !here {
        return 0;
    }
    let Some(c) = ptr_at::<u16>(ctx, csum_off) else {
        return 0;
    };
    // SAFETY: bounds checked by ptr_at / l3::parse.
    unsafe {
        csum::l4_replace(c, proto, (dst, f.dst_ip), (dport, f.dst_port));
        (*ports)[1] = f.dst_port;
        csum::set_dst_addr(ip, f.dst_ip);
    }
    count(reason::LB_UPLINK_FLOW);
    (1 << 32) | u64::from(u32::from_ne_bytes(f.dst_ip))
}

/// Not pinned: the FIB lookup's parameters of [`xdp_send`] (64 bytes its
/// call has no room for on `uplink_xdp`'s chain).
#[map(name = "sl_lb_fib")]
static FIB: PerCpuArray<FibParams> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's FIB parameters (`super::uplink6::xdp_send` too).
#[inline(always)]
pub(super) fn fib() -> Option<*mut FibParams> {
    FIB.get_ptr_mut(0)
}

/// Sends a packet XDP rewrote out of `out` (from the uplink, `ingress`):
/// `2 << 32 | verdict`. Back out of the uplink: `XDP_TX`, except on a veth,
/// which hands what `XDP_TX` returns to its peer but wakes the peer only
/// when that has an XDP program of its own (`veth_xdp_flush`); a
/// redirect's flush wakes it either way (`XDP_XMIT_FLUSH`).
#[inline(always)]
pub(super) fn xdp_out(ingress: u32, out: u32) -> u64 {
    count(reason::LB_UPLINK_FLOW);
    count(reason::XDP_LB_SEND);
    let veth = crate::maps::CONFIG
        .get(0)
        .is_some_and(|c| c.flags & config_flags::UPLINK_VETH != 0);
    let v = if out == ingress && !veth {
        xdp_action::XDP_TX
    } else {
        // SAFETY: plain helper call.
        unsafe { bpf_redirect(out, 0) as u32 }
    };
    (2 << 32) | u64::from(v)
}

/// XDP: a packet of a Service flow whose both ends change (`f`): a client's
/// to a backend on another node, from the node address, or that backend's
/// answer on its way back to the client. The FIB is asked first, for the
/// translated addresses, and the packet is rewritten and sent (`XDP_TX`
/// back out of the uplink, else redirected) only when the FIB knows the
/// next hop's address (`BPF_FIB_LKUP_RET_SUCCESS`) and its MTU takes the
/// packet (`tot_len`); anything else goes on to tc untouched, which
/// forwards it (`send`). Returns `2 << 32 | verdict`, or 0. A call of its
/// own, the flow in `sl_lb_step` ([`xdp_translate`] found it): `uplink_xdp`'s
/// chain.
#[inline(never)]
fn xdp_send(ctx: &XdpContext) -> u64 {
    let (Some(p), Some(step)) = (FIB.get_ptr_mut(0), STEP.get_ptr(0)) else {
        return 0;
    };
    // SAFETY: this CPU's slot, written by `xdp_translate` for this packet.
    let f = unsafe { &(*step).f };
    let Ok(h) = l3::parse(ctx) else {
        return 0;
    };
    let Some(v4) = h.v4_fields() else {
        return 0;
    };
    let (ip, proto) = (v4.hdr, v4.proto);
    if h.ttl() <= 1 || v4.vihl != 0x45 {
        return 0;
    }
    let l4_off = v4.l4_off();
    let Some(ports) = ptr_at::<[u16; 2]>(ctx, l4_off) else {
        return 0;
    };
    // SAFETY: this CPU's entry, used by this program run only; `ip` was
    // bounds checked by `l3::parse`.
    let (tot_len, ifindex) = unsafe {
        crate::mem::zero_words(p);
        (
            u16::from_be_bytes((*ip).tot_len),
            (*ctx.ctx).ingress_ifindex,
        )
    };
    // SAFETY: as above.
    let rc = unsafe {
        (*p).family = AF_INET;
        (*p).l4_protocol = proto;
        (*p).__bindgen_anon_1.tot_len = tot_len;
        (*p).ifindex = ifindex;
        (*p).__bindgen_anon_3.ipv4_src = u32::from_ne_bytes(f.src_ip);
        (*p).__bindgen_anon_4.ipv4_dst = u32::from_ne_bytes(f.dst_ip);
        bpf_fib_lookup(ctx.as_ptr(), p, size_of::<FibParams>() as i32, 0)
    };
    if rc != i64::from(BPF_FIB_LKUP_RET_SUCCESS) {
        return 0;
    }
    // The L4 checksum pointer on the path that uses it (see
    // `csum::l4_replace`).
    let c = match proto {
        PROTO_TCP => ptr_at::<u16>(ctx, l4_off + 16),
        PROTO_UDP => ptr_at::<u16>(ctx, l4_off + 6),
        _ => None,
    };
    let Some(c) = c else {
        return 0;
    };
    // SAFETY: bounds checked by ptr_at / l3::parse; `p` as above.
    unsafe {
        let (src, dst) = ((*ip).src_addr, (*ip).dst_addr);
        let [sport, dport] = *ports;
        csum::l4_replace(c, proto, (src, f.src_ip), (sport, f.src_port));
        csum::l4_replace(c, proto, (dst, f.dst_ip), (dport, f.dst_port));
        *ports = [f.src_port, f.dst_port];
        csum::set_src_addr(ip, f.src_ip);
        csum::set_dst_addr(ip, f.dst_ip);
        h.decrement_ttl();
        h.set_macs((*p).dmac, (*p).smac);
    }
    // SAFETY: as above.
    xdp_out(ifindex, unsafe { (*p).ifindex })
}

/// A translated packet: to a pod here, [`NOT_OURS`] (`uplink_in` then
/// delivers it as any packet to a pod, which it now is: one copy of that
/// code for the verifier to walk); else out by FIB lookup (to a remote
/// backend, or back to the client).
#[inline(never)]
fn send(ctx: &TcContext) -> i32 {
    let Some(step) = STEP.get_ptr(0) else {
        return NOT_OURS;
    };
    // SAFETY: this CPU's slot, written by the steps before for this packet.
    let dst = unsafe { (*step).f.dst_ip };
    // SAFETY: map values are only read.
    if unsafe { ENDPOINTS.get(IpKey::v4(dst)) }.is_some() {
        return NOT_OURS;
    }
    // The rewrite's helpers invalidated the packet pointers.
    let Ok(h) = l3::parse(ctx) else {
        return crate::TCX_NEXT;
    };
    // SAFETY: `skb` points at the context the kernel passed in.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    forward::forward(ctx, &h, ifindex, false)
}

/// Host veth ingress: a packet of a flow in `sl_lb_ct` (`sl_lb_ct6`): a
/// local backend's reply to a client from outside, rewritten to come from
/// the Service address; or a pod's per-packet ClusterIP flow
/// (`super::packet`) either way. [`NOT_OURS`]: not one; [`TRANSLATED`]:
/// rewritten (the caller routes it); else a drop verdict. Each family a
/// call of its own, beside the other.
#[inline(always)]
pub fn from_pod(ctx: &TcContext) -> i32 {
    if l4::is_ipv6(ctx) {
        super::uplink6::from_pod(ctx)
    } else {
        from_pod4(ctx)
    }
}

/// [`from_pod`] for IPv4.
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "keys and values go to the map helpers by reference, not copied onto the stack"
)]
#[inline(never)]
fn from_pod4(ctx: &TcContext) -> i32 {
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
