//! hostPort for IPv6: the same translations as IPv4 with maps of their own
//! (`sl_ports6`, `sl_hp_ct6`, `sl_node_addrs6`, `sl_hp_sock6`). IPv6 has no
//! header checksum: an address change goes into the L4 checksum through the
//! pseudo header (`l4::rewrite6`). Only packets whose next header is TCP, UDP
//! or SCTP are translated; extension headers leave the packet to the kernel.
//!
//! Each tc entry point is a call of its own, made only for IPv6 frames: its
//! locals stay off the IPv4 path's stack frame (512 bytes for a chain of calls).
#![expect(
    clippy::needless_borrows_for_generic_args,
    reason = "keys go to the map helpers by reference: IPv6 keys are 20 to 40 bytes of a 512-byte stack"
)]
use aya_ebpf::{
    bindings::TC_ACT_SHOT,
    macros::map,
    maps::PerCpuArray,
    programs::{TcContext, XdpContext},
};
use sluice_common::{event_kind, reason, Addr6, HpFlow6, IpKey, Nat6Key, PortKey6, PortTarget6};

use super::{config, hairpin, Translated};
use crate::{
    counters::count,
    csum,
    endpoint::deliver_hostport,
    events::{self, note_drop},
    l3::same6,
    l4::{self, rewrite6, Rewrite6, ETH_LEN, L4, PROTO_SCTP, PROTO_TCP, PROTO_UDP},
    maps::{HP_CT6, NODE_ADDRS6, PORTS6},
    packet::ptr_at,
    proto::{IP6_DST_OFF as DST_OFF, IP6_L4_OFF as L4_OFF, IP6_SRC_OFF as SRC_OFF},
};

/// Not pinned: an IPv6 packet between the steps of its hostPort translation.
#[map(name = "sl_hp_scratch6")]
pub(crate) static HP_SCRATCH6: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// `::1`.
pub(super) const LOOPBACK: Addr6 = Addr6([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);

/// What the tc entry points return for a packet that is not theirs.
pub const NOT_OURS: i32 = i32::MIN;

/// The mapping for `k`: one of that exact address, else a wildcard one when
/// the address is one of the node's (then `k.host_ip` is left as the wildcard).
/// The key is the caller's: on the stack of a socket hook, in the scratch
/// entry on tc's path (see [`lookup_into`]).
#[inline(always)]
pub(super) fn lookup(k: &mut PortKey6) -> Option<&'static PortTarget6> {
    // SAFETY: map values are only read.
    if let Some(t) = unsafe { PORTS6.get(&*k) } {
        return Some(t);
    }
    // SAFETY: as above.
    unsafe { NODE_ADDRS6.get(&k.host_ip) }?;
    k.host_ip = Addr6::default();
    // SAFETY: as above.
    unsafe { PORTS6.get(&*k) }
}

/// Rewrites the packet (flow `p.k`) to `p.f`: source and destination, address
/// and port, each only where it changes, reading the addresses where they are
/// in the scratch entry. Inline: a call of its own (and the `memset` calls the
/// compiler adds under it) made `uplink_in -> from_uplink -> apply -> memset`
/// 576 bytes of stack on 5.10, where `uplink_in`'s frame is 320.
#[inline(always)]
pub(crate) fn apply(ctx: &TcContext, p: &Scratch) -> bool {
    let (k, f, l4) = (&p.k, &p.f, &p.l4);
    let Some(dport_off) = l4.dport_off else {
        return false;
    };
    if !same6(&k.src_ip, &f.src_ip) || k.src_port != f.src_port {
        let r = Rewrite6 {
            addr_off: SRC_OFF,
            old_addr: &k.src_ip,
            new_addr: &f.src_ip,
            port_off: l4.sport_off,
            old_port: k.src_port,
            new_port: f.src_port,
        };
        if rewrite6(ctx, l4, &r).is_err() {
            return false;
        }
    }
    if !same6(&k.dst_ip, &f.dst_ip) || k.dst_port != f.dst_port {
        let r = Rewrite6 {
            addr_off: DST_OFF,
            old_addr: &k.dst_ip,
            new_addr: &f.dst_ip,
            port_off: dport_off,
            old_port: k.dst_port,
            new_port: f.dst_port,
        };
        if rewrite6(ctx, l4, &r).is_err() {
            return false;
        }
    }
    true
}

/// An IPv6 packet between the steps of its translation (value of
/// `sl_hp_scratch6`): on the stack, these 200 bytes and the pod program's own
/// frame exceeded the 512 bytes a chain of calls may use.
/// (`lb::uplink6` uses it too, for Services from outside.)
#[derive(Default)]
pub struct Scratch {
    /// The flow as the packet carries it.
    pub(crate) k: Nat6Key,
    pub(crate) l4: L4,
    /// The mapping's key being looked up, and the mapping found.
    pk: PortKey6,
    t: PortTarget6,
    /// The rewrite.
    pub(crate) f: HpFlow6,
    /// A hairpin flow's reverse entry.
    pub(crate) rk: Nat6Key,
    pub(crate) back: HpFlow6,
}

/// [`lookup`] for the packet in `p` (its destination), the key built and the
/// mapping copied in the scratch entry: on `uplink_in`'s path under 5.10 the
/// call may use 128 bytes of stack (`uplink_in` 320, the compiler's
/// `memset`/`memmove` two calls of their own below it). `_pad` of `p.pk` is
/// never written: it stays the zero the per-CPU entry starts with.
#[inline(always)]
fn lookup_into(p: &mut Scratch) -> bool {
    p.pk.host_ip = p.k.dst_ip;
    p.pk.host_port = p.k.dst_port;
    p.pk.proto = p.k.proto;
    match lookup(&mut p.pk) {
        Some(t) => {
            p.t = *t;
            true
        }
        None => false,
    }
}

/// This CPU's scratch entry with the packet parsed into it, if it is a
/// translatable IPv6 packet (TCP, UDP or SCTP right after the fixed header).
#[inline(always)]
pub(crate) fn parse(ctx: &TcContext) -> Option<&'static mut Scratch> {
    let proto: u8 = ctx.load(ETH_LEN + 6).ok()?;
    if !matches!(proto, PROTO_TCP | PROTO_UDP | PROTO_SCTP) {
        return None;
    }
    let p = HP_SCRATCH6.get_ptr_mut(0)?;
    // SAFETY: this CPU's entry, used by this program run only.
    let p = unsafe { &mut *p };
    p.l4 = l4::l4(ctx, proto, L4_OFF, 0).ok()?;
    p.k = Nat6Key::new(
        ctx.load(SRC_OFF).ok()?,
        ctx.load(DST_OFF).ok()?,
        p.l4.sport,
        p.l4.dport,
        proto,
    );
    Some(p)
}

/// Uplink ingress, IPv6: a packet to a mapped port goes to its pod, and how
/// its replies are translated back is recorded. [`NOT_OURS`]: not a hostPort.
#[inline(never)]
pub fn from_uplink(ctx: &TcContext) -> i32 {
    if config().is_none() {
        return NOT_OURS;
    }
    let Some(p) = parse(ctx) else {
        return NOT_OURS;
    };
    if !lookup_into(p) {
        return NOT_OURS;
    }
    remember_reply(p);
    p.f = HpFlow6 {
        src_ip: p.k.src_ip,
        dst_ip: p.t.pod_ip,
        src_port: p.k.src_port,
        dst_port: p.t.pod_port,
        _pad: 0,
    };
    if !apply(ctx, p) {
        note_drop(reason::DROP_MALFORMED, 0);
        return TC_ACT_SHOT;
    }
    count(reason::HOSTPORT_DNAT);
    deliver_hostport(ctx, IpKey::v6(p.t.pod_ip.0))
}

/// Records how the pod's answers to the client of `p` (from outside, to a
/// mapping found by [`lookup_into`]) are translated back.
#[inline(always)]
fn remember_reply(p: &mut Scratch) {
    // Field by field: a whole key built first is a 40-byte temporary on the
    // stack (and a `memmove`), which `uplink_xdp`'s chain has no room for.
    // The padding stays the zero the per-CPU entry starts with.
    p.rk.src_ip = p.t.pod_ip;
    p.rk.dst_ip = p.k.src_ip;
    p.rk.src_port = p.t.pod_port;
    p.rk.dst_port = p.k.src_port;
    p.rk.proto = p.k.proto;
    p.back.src_ip = p.k.dst_ip;
    p.back.dst_ip = p.k.src_ip;
    p.back.src_port = p.k.dst_port;
    p.back.dst_port = p.k.src_port;
    // Written only when new or changed: the LRU refreshes its recency on
    // lookups.
    // SAFETY: map values are only read.
    let known = unsafe { HP_CT6.get(&p.rk) }
        .is_some_and(|f| same6(&f.src_ip, &p.back.src_ip) && f.src_port == p.back.src_port);
    if !known {
        let _ = HP_CT6.insert(&p.rk, &p.back, 0);
        // client -> [node]:hostPort, translated to [pod]:containerPort.
        events::flow6(
            event_kind::HOSTPORT_NEW,
            &p.k,
            Some(&p.t.pod_ip),
            p.t.pod_port,
            p.t.pod_ifindex,
        );
    }
}

/// XDP (native mode only, see `nat::dnat_xdp`), IPv6: [`from_uplink`] with
/// the checksum updated by hand (`csum::l4_replace6`); `true` when translated,
/// the pod in [`xdp_pod`]. A call of its own, its state in the scratch entry:
/// `uplink_xdp`'s own frame is over 300 bytes of the 512 a chain may use.
#[inline(never)]
pub fn from_uplink_xdp(ctx: &XdpContext) -> bool {
    if config().is_none() {
        return false;
    }
    let Some((p, frame)) = xdp_load(ctx) else {
        return false;
    };
    if !lookup_into(p) {
        return false;
    }
    remember_reply(p);
    if !xdp_to(ctx, &frame, p) {
        return false;
    }
    count(reason::HOSTPORT_DNAT);
    true
}

/// Where an IPv6 frame's destination and ports are, for [`xdp_to`].
pub(crate) struct XdpFrame {
    dst: *mut [u16; 8],
    ports: *mut [u16; 2],
}

/// XDP: this CPU's scratch entry with the frame's flow in `k` (TCP, UDP or
/// SCTP right after the fixed header: fragments and extension headers are
/// the kernel's), and where to rewrite it.
#[inline(always)]
pub(crate) fn xdp_load(ctx: &XdpContext) -> Option<(&'static mut Scratch, XdpFrame)> {
    let proto = ptr_at::<u8>(ctx, ETH_LEN + 6)?;
    // SAFETY: bounds checked by ptr_at.
    let proto = unsafe { *proto };
    if !matches!(proto, PROTO_TCP | PROTO_UDP | PROTO_SCTP) {
        return None;
    }
    // Addresses as eight 16-bit words: in the frame they are 2-byte aligned
    // only (after the 14-byte Ethernet header).
    let src = ptr_at::<[u16; 8]>(ctx, SRC_OFF)?;
    let dst = ptr_at::<[u16; 8]>(ctx, DST_OFF)?;
    let ports = ptr_at::<[u16; 2]>(ctx, L4_OFF)?;
    let p = HP_SCRATCH6.get_ptr_mut(0)?;
    // SAFETY: this CPU's entry, used by this program run only; the packet
    // pointers were bounds checked by ptr_at.
    let p = unsafe { &mut *p };
    // SAFETY: as above.
    unsafe {
        p.k.src_ip = Addr6(core::mem::transmute::<[u16; 8], [u8; 16]>(*src));
        p.k.dst_ip = Addr6(core::mem::transmute::<[u16; 8], [u8; 16]>(*dst));
        p.k.src_port = (*ports)[0];
        p.k.dst_port = (*ports)[1];
        p.k.proto = proto;
    }
    Some((p, XdpFrame { dst, ports }))
}

/// XDP: the frame's destination `p.k` becomes `p.t`'s pod address and port,
/// the L4 checksum updated by hand; `false` (nothing written) where the
/// checksum is out of reach.
#[inline(always)]
pub(crate) fn xdp_to(ctx: &XdpContext, frame: &XdpFrame, p: &Scratch) -> bool {
    let proto = p.k.proto;
    // The checksum pointer is taken on the path that uses it (5.10's verifier
    // loses a pointer chosen on a merged path, see `csum::l4_replace`).
    let ports_change = (p.k.dst_port, p.t.pod_port);
    let addrs = (&p.k.dst_ip, &p.t.pod_ip);
    match proto {
        PROTO_TCP => {
            let Some(c) = ptr_at::<u16>(ctx, L4_OFF + 16) else {
                return false;
            };
            // SAFETY: bounds checked by ptr_at.
            unsafe { csum::l4_replace6(c, proto, addrs, ports_change) };
        }
        PROTO_UDP => {
            let Some(c) = ptr_at::<u16>(ctx, L4_OFF + 6) else {
                return false;
            };
            // SAFETY: bounds checked by ptr_at.
            unsafe { csum::l4_replace6(c, proto, addrs, ports_change) };
        }
        // SCTP's CRC32c covers no pseudo header, and the port keeps its number.
        _ => {}
    }
    // SAFETY: bounds checked by ptr_at in `xdp_load`.
    unsafe {
        (*frame.ports)[1] = p.t.pod_port;
        *frame.dst = core::mem::transmute::<[u8; 16], [u16; 8]>(p.t.pod_ip.0);
    }
    true
}

/// Where [`xdp_to`] sends the packet in the scratch entry: a pod's address
/// and port (`lb::uplink6`'s flows from outside set it too).
#[inline(always)]
pub(crate) fn set_xdp_target(p: &mut Scratch, addr: Addr6, port: u16) {
    p.t.pod_ip = addr;
    p.t.pod_port = port;
}

/// The pod [`from_uplink_xdp`] translated the packet to.
#[inline(always)]
pub fn xdp_pod() -> Option<IpKey> {
    HP_SCRATCH6.get(0).map(|p| IpKey::v6(p.t.pod_ip.0))
}

/// What [`from_pod`] did, as one register: [`NOT_OURS`], [`TRANSLATED`], or a
/// drop verdict.
pub const TRANSLATED: i32 = i32::MIN + 1;

/// Host veth ingress, IPv6: replies of translated flows, and hairpin.
#[inline(never)]
pub fn from_pod(ctx: &TcContext) -> i32 {
    let Some(p) = parse(ctx) else {
        return NOT_OURS;
    };
    // SAFETY: map values are only read.
    let reply = match unsafe { HP_CT6.get(&p.k) } {
        Some(f) => {
            p.f = *f;
            true
        }
        None => {
            if !lookup_into(p) {
                return NOT_OURS;
            }
            if !hairpin(&HP_CT6, &p.k, &p.t, (&mut p.rk, &mut p.back), &mut p.f) {
                note_drop(reason::DROP_HOSTPORT_NO_PORT, 0);
                return TC_ACT_SHOT;
            }
            false
        }
    };
    if !apply(ctx, p) {
        note_drop(reason::DROP_MALFORMED, 0);
        return TC_ACT_SHOT;
    }
    count(if reply {
        reason::HOSTPORT_REPLY
    } else {
        reason::HOSTPORT_HAIRPIN
    });
    TRANSLATED
}

/// [`from_pod`]'s answer as the IPv4 path gives it.
#[inline(always)]
pub fn translated(v: i32) -> Translated {
    match v {
        NOT_OURS => Translated::NoAfterCall,
        TRANSLATED => Translated::Yes,
        v => Translated::Drop(v),
    }
}
