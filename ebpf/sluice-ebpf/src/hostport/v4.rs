//! hostPort for IPv4: the uplink's packets to a mapped port (tc and XDP,
//! [`from_uplink`], [`from_uplink_xdp`]), and a pod's replies and hairpin
//! flows ([`from_pod`]); see the module above.
use aya_ebpf::{
    bindings::TC_ACT_SHOT,
    programs::{TcContext, XdpContext},
};
use network_types::ip::Ipv4Hdr;
use sluice_common::{event_kind, reason, HpFlow, IpKey, NatKey, PortKey, PortTarget};

use super::{config, hairpin, v6, Translated};
use crate::{
    counters::count,
    csum,
    endpoint::deliver_hostport4,
    events::{self, note_drop},
    l3::{Headers, L3},
    l4::{
        self, ipv4, is_fragment, rewrite, Rewrite, ETH_LEN, L4, PROTO_SCTP, PROTO_TCP, PROTO_UDP,
    },
    maps::{HP_CT, NODE_ADDRS, PORTS},
    packet::ptr_at,
};

/// The mapping for `dst`:`port`: one of that exact address, else a wildcard one
/// when `dst` is the node's.
#[inline(always)]
pub(super) fn lookup(dst: [u8; 4], port: u16, proto: u8) -> Option<PortTarget> {
    let mut k = PortKey {
        host_ip: dst,
        host_port: port,
        proto,
        _pad: 0,
    };
    // SAFETY: map values are only read.
    if let Some(t) = unsafe { PORTS.get(k) } {
        return Some(*t);
    }
    // SAFETY: as above.
    unsafe { NODE_ADDRS.get(dst) }?;
    k.host_ip = [0; 4];
    // SAFETY: as above.
    unsafe { PORTS.get(k) }.copied()
}

/// A translatable packet: IPv4 TCP/UDP/SCTP, not a fragment.
#[inline(always)]
pub(crate) fn parse(ctx: &TcContext) -> Option<(Ipv4Hdr, L4)> {
    let ip = ipv4(ctx)?;
    let l4_off = ETH_LEN + usize::from(ip.vihl & 0x0f) * 4;
    let l4 = translatable(ctx, ip.proto, l4_off, is_fragment(&ip))?;
    Some((ip, l4))
}

/// The L4 header of a translatable packet (TCP/UDP/SCTP, not a fragment).
#[inline(always)]
fn translatable(ctx: &TcContext, proto: u8, l4_off: usize, fragment: bool) -> Option<L4> {
    if !matches!(proto, PROTO_TCP | PROTO_UDP | PROTO_SCTP) || fragment {
        return None;
    }
    l4::l4(ctx, proto, l4_off, 0).ok()
}

/// Rewrites the packet, whose addresses are `src` and `dst`, to `f` (source
/// and destination, address and port, each only where it changes). The
/// addresses are copies: the first rewrite invalidates packet pointers.
#[inline(always)]
pub(crate) fn apply(
    ctx: &TcContext,
    (src, dst): ([u8; 4], [u8; 4]),
    l4: &L4,
    f: &HpFlow,
) -> Result<(), ()> {
    let dport_off = l4.dport_off.ok_or(())?;
    // Decided before the first rewrite: compared after it, the destination
    // was kept as four bytes across its helper calls, four stack slots.
    let new_dst = dst != f.dst_ip || l4.dport != f.dst_port;
    if src != f.src_ip || l4.sport != f.src_port {
        let r = Rewrite {
            addr_off: ETH_LEN + 12,
            old_addr: src,
            new_addr: f.src_ip,
            port_off: l4.sport_off,
            old_port: l4.sport,
            new_port: f.src_port,
        };
        rewrite(ctx, l4, &r)?;
    }
    if new_dst {
        let r = Rewrite {
            addr_off: ETH_LEN + 16,
            old_addr: dst,
            new_addr: f.dst_ip,
            port_off: dport_off,
            old_port: l4.dport,
            new_port: f.dst_port,
        };
        rewrite(ctx, l4, &r)?;
    }
    Ok(())
}

/// [`apply`] to a packet whose header `l3::parse` checked, at `ip`. The
/// addresses are read from it here, right before the first rewrite
/// invalidates the pointer: copies kept across the map lookups took stack
/// slots.
#[inline(always)]
fn apply_parsed(ctx: &TcContext, ip: *mut Ipv4Hdr, l4: &L4, f: &HpFlow) -> Result<(), ()> {
    // SAFETY: bounds checked by `l3::parse`; nothing has changed the packet since.
    let addrs = unsafe { ((*ip).src_addr, (*ip).dst_addr) };
    apply(ctx, addrs, l4, f)
}

/// Records how the pod's answers to the client `src`:`sport` are translated
/// back (to `dst`:`dport`, what the client sent to).
#[inline(always)]
fn remember_reply(t: &PortTarget, proto: u8, src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) {
    let key = NatKey::new(t.pod_ip, src, t.pod_port, sport, proto);
    let f = HpFlow {
        src_ip: dst,
        dst_ip: src,
        src_port: dport,
        dst_port: sport,
        _pad: 0,
    };
    // SAFETY: map values are only read. Written only when new or changed: the
    // LRU refreshes its recency on lookups.
    if unsafe { HP_CT.get(key) } != Some(&f) {
        let _ = HP_CT.insert(key, f, 0);
        // client -> node:hostPort, translated to pod:containerPort.
        let outside = NatKey::new(src, dst, sport, dport, proto);
        events::flow(
            event_kind::HOSTPORT_NEW,
            &outside,
            t.pod_ip,
            t.pod_port,
            t.pod_ifindex,
        );
    }
}

/// Uplink ingress: a packet to a mapped port goes to its pod. `None`: not ours.
#[inline(always)]
pub fn from_uplink(ctx: &TcContext) -> Option<i32> {
    config()?;
    if l4::is_ipv6(ctx) {
        let v = v6::from_uplink(ctx);
        return (v != v6::NOT_OURS).then_some(v);
    }
    let (ip, l4) = parse(ctx)?;
    let t = lookup(ip.dst_addr, l4.dport, ip.proto)?;
    remember_reply(&t, ip.proto, ip.src_addr, ip.dst_addr, l4.sport, l4.dport);
    let f = HpFlow {
        src_ip: ip.src_addr,
        dst_ip: t.pod_ip,
        src_port: l4.sport,
        dst_port: t.pod_port,
        _pad: 0,
    };
    if apply(ctx, (ip.src_addr, ip.dst_addr), &l4, &f).is_err() {
        note_drop(reason::DROP_MALFORMED, 0);
        return Some(TC_ACT_SHOT);
    }
    count(reason::HOSTPORT_DNAT);
    Some(deliver_hostport4(ctx, u32::from_ne_bytes(t.pod_ip)))
}

/// XDP (native mode only, see `nat::dnat_xdp`): the same as [`from_uplink`]
/// with incremental checksum updates; returns the pod to deliver to.
#[inline(always)]
pub fn from_uplink_xdp(ctx: &XdpContext, h: &Headers) -> Option<IpKey> {
    config()?;
    let Some(v4) = h.v4_fields() else {
        return if v6::from_uplink_xdp(ctx) {
            v6::xdp_pod()
        } else {
            None
        };
    };
    let (ip, src, dst, proto) = (v4.hdr, v4.src, v4.dst, v4.proto);
    if v4.fragment() {
        return None;
    }
    let l4_off = v4.l4_off();
    let csum_off = match proto {
        PROTO_TCP => l4_off + 16,
        PROTO_UDP => l4_off + 6,
        PROTO_SCTP => 0,
        _ => return None,
    };
    let ports: *mut [u16; 2] = ptr_at(ctx, l4_off)?;
    // SAFETY: bounds checked by ptr_at.
    let [sport, dport] = unsafe { *ports };
    let t = lookup(dst, dport, proto)?;
    remember_reply(&t, proto, src, dst, sport, dport);
    if proto != PROTO_SCTP {
        let c: *mut u16 = ptr_at(ctx, csum_off)?;
        // SAFETY: bounds checked by ptr_at.
        unsafe { csum::l4_replace(c, proto, (dst, t.pod_ip), (dport, t.pod_port)) };
    }
    // SAFETY: bounds checked by ptr_at / l3::parse.
    unsafe {
        (*ports)[1] = t.pod_port;
        csum::set_dst_addr(ip, t.pod_ip);
    }
    count(reason::HOSTPORT_DNAT);
    Some(IpKey::v4(t.pod_ip))
}

/// Host veth ingress: replies of translated flows, and hairpin. `h`: the
/// packet's headers, parsed by the caller.
#[inline(always)]
pub fn from_pod(ctx: &TcContext, h: &Headers) -> Translated {
    if config().is_none() {
        return Translated::No;
    }
    // (The IPv6 path parses into its per-CPU scratch itself: a call of its own
    // for the stack, and no packet pointers passed into it.)
    let L3::V4(ip) = h.l3 else {
        return v6::translated(v6::from_pod(ctx));
    };
    // SAFETY: bounds checked by `l3::parse`.
    let (proto, l4_off, fragment) = unsafe {
        let l4_off = ETH_LEN + usize::from((*ip).vihl & 0x0f) * 4;
        ((*ip).proto, l4_off, is_fragment(&*ip))
    };
    let Some(l4) = translatable(ctx, proto, l4_off, fragment) else {
        return Translated::No;
    };
    // SAFETY: as above (reading the L4 header changed no packet data).
    let key = unsafe { NatKey::new((*ip).src_addr, (*ip).dst_addr, l4.sport, l4.dport, proto) };
    // SAFETY: map values are only read.
    if let Some(f) = unsafe { HP_CT.get(key) }.copied() {
        if apply_parsed(ctx, ip, &l4, &f).is_err() {
            note_drop(reason::DROP_MALFORMED, 0);
            return Translated::Drop(TC_ACT_SHOT);
        }
        count(reason::HOSTPORT_REPLY);
        return Translated::Yes;
    }
    let Some(t) = lookup(key.dst_ip, l4.dport, proto) else {
        return Translated::No;
    };
    let (mut rk, mut back, mut f) = Default::default();
    if !hairpin(&HP_CT, &key, &t, (&mut rk, &mut back), &mut f) {
        note_drop(reason::DROP_HOSTPORT_NO_PORT, 0);
        return Translated::Drop(TC_ACT_SHOT);
    }
    if apply_parsed(ctx, ip, &l4, &f).is_err() {
        note_drop(reason::DROP_MALFORMED, 0);
        return Translated::Drop(TC_ACT_SHOT);
    }
    count(reason::HOSTPORT_HAIRPIN);
    Translated::Yes
}
