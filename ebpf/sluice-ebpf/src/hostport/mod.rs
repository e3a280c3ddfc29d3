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
//! - [`sock_connect`] and friends (cgroup sock_addr hooks): the node's own sockets
//!   connecting or sending to `127.0.0.1:hostPort` or a node address are pointed
//!   at the pod before any packet exists; `recvmsg`/`getpeername` show the
//!   address the socket asked for. They act only in the node's network namespace
//!   (netns cookie), whatever cgroup they are attached to.
//!
//! IPv6 in `v6`, with maps of its own. Fragments are not translated (left to
//! the kernel).
use aya_ebpf::maps::LruHashMap;
use aya_ebpf::{
    bindings::{BPF_NOEXIST, TC_ACT_SHOT},
    helpers::{bpf_get_netns_cookie, bpf_get_socket_cookie},
    programs::{SockAddrContext, TcContext, XdpContext},
};
use network_types::ip::Ipv4Hdr;
use sluice_common::{
    event_kind, reason, HostPortConfig, HpFlow, HpFlowOf, IpKey, NatKey, NatKeyOf, PortKey,
    PortTarget, PortTargetOf, SockKey, SockOrig,
};

use crate::{
    counters::count,
    csum,
    endpoint::deliver_translated,
    events::{self, note_drop},
    l3::Headers,
    l4::{
        self, ipv4, is_fragment, rewrite, Rewrite, ETH_LEN, L4, PROTO_SCTP, PROTO_TCP, PROTO_UDP,
    },
    maps::{HP_CONFIG, HP_CT, HP_SOCK, NODE_ADDRS, PORTS},
    packet::ptr_at,
};

const AF_INET: u32 = 2;

pub mod v6;
/// Source ports tried for a hairpin flow whose own port is taken.
const PORT_TRIES: u32 = 16;

#[inline(always)]
pub(super) fn config() -> Option<&'static HostPortConfig> {
    HP_CONFIG.get(0).filter(|c| c.active != 0)
}

/// The mapping for `dst`:`port`: one of that exact address, else a wildcard one
/// when `dst` is the node's.
#[inline(always)]
fn lookup(dst: [u8; 4], port: u16, proto: u8) -> Option<PortTarget> {
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
fn parse(ctx: &TcContext) -> Option<(Ipv4Hdr, L4)> {
    let ip = ipv4(ctx)?;
    if !matches!(ip.proto, PROTO_TCP | PROTO_UDP | PROTO_SCTP) || is_fragment(&ip) {
        return None;
    }
    let l4_off = ETH_LEN + usize::from(ip.vihl & 0x0f) * 4;
    let l4 = l4::l4(ctx, ip.proto, l4_off, 0).ok()?;
    Some((ip, l4))
}

/// Rewrites the packet to `f` (source and destination, address and port, each
/// only where it changes).
#[inline(always)]
fn apply(ctx: &TcContext, ip: &Ipv4Hdr, l4: &L4, f: &HpFlow) -> Result<(), ()> {
    let dport_off = l4.dport_off.ok_or(())?;
    if ip.src_addr != f.src_ip || l4.sport != f.src_port {
        let r = Rewrite {
            addr_off: ETH_LEN + 12,
            old_addr: ip.src_addr,
            new_addr: f.src_ip,
            port_off: l4.sport_off,
            old_port: l4.sport,
            new_port: f.src_port,
        };
        rewrite(ctx, l4, &r)?;
    }
    if ip.dst_addr != f.dst_ip || l4.dport != f.dst_port {
        let r = Rewrite {
            addr_off: ETH_LEN + 16,
            old_addr: ip.dst_addr,
            new_addr: f.dst_ip,
            port_off: dport_off,
            old_port: l4.dport,
            new_port: f.dst_port,
        };
        rewrite(ctx, l4, &r)?;
    }
    Ok(())
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
    if apply(ctx, &ip, &l4, &f).is_err() {
        note_drop(reason::DROP_MALFORMED, 0);
        return Some(TC_ACT_SHOT);
    }
    count(reason::HOSTPORT_DNAT);
    Some(deliver_translated(ctx, IpKey::v4(t.pod_ip), false))
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

/// What [`from_pod`] did.
pub enum Translated {
    /// Nothing: not a hostPort flow.
    No,
    /// Rewritten: parse again and route by the new destination.
    Yes,
    /// Dropped (the verdict).
    Drop(i32),
}

/// Host veth ingress: replies of translated flows, and hairpin.
#[inline(always)]
pub fn from_pod(ctx: &TcContext) -> Translated {
    if config().is_none() {
        return Translated::No;
    }
    if l4::is_ipv6(ctx) {
        return v6::translated(v6::from_pod(ctx));
    }
    let Some((ip, l4)) = parse(ctx) else {
        return Translated::No;
    };
    let key = NatKey::new(ip.src_addr, ip.dst_addr, l4.sport, l4.dport, ip.proto);
    // SAFETY: map values are only read.
    if let Some(f) = unsafe { HP_CT.get(key) }.copied() {
        if apply(ctx, &ip, &l4, &f).is_err() {
            note_drop(reason::DROP_MALFORMED, 0);
            return Translated::Drop(TC_ACT_SHOT);
        }
        count(reason::HOSTPORT_REPLY);
        return Translated::Yes;
    }
    let Some(t) = lookup(ip.dst_addr, l4.dport, ip.proto) else {
        return Translated::No;
    };
    let (mut rk, mut back, mut f) = Default::default();
    if !hairpin(&HP_CT, &key, &t, (&mut rk, &mut back), &mut f) {
        note_drop(reason::DROP_HOSTPORT_NO_PORT, 0);
        return Translated::Drop(TC_ACT_SHOT);
    }
    if apply(ctx, &ip, &l4, &f).is_err() {
        note_drop(reason::DROP_MALFORMED, 0);
        return Translated::Drop(TC_ACT_SHOT);
    }
    count(reason::HOSTPORT_HAIRPIN);
    Translated::Yes
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
        let port = if i == 0 {
            k.src_port
        } else {
            // 1024..=65535, host order, then stored in network order.
            let h = u32::from(u16::from_be(k.src_port))
                .wrapping_mul(0x9e37_79b1)
                .wrapping_add(i.wrapping_mul(0x85eb_ca6b));
            ((1024 + h % 64_512) as u16).to_be()
        };
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

// --- The node's own sockets -------------------------------------------------------

/// The socket's family, protocol and destination, when the hooks may act on it.
#[inline(always)]
fn sock_target(ctx: &SockAddrContext) -> Option<(PortTarget, [u8; 4], u16)> {
    let cfg = config()?;
    // SAFETY: plain helper call on this program's context.
    if unsafe { bpf_get_netns_cookie(ctx.sock_addr.cast()) } != cfg.netns_cookie {
        return None;
    }
    // SAFETY: the kernel passes a valid bpf_sock_addr.
    let (family, proto, ip, port) = unsafe {
        let sa = &*ctx.sock_addr;
        (sa.family, sa.protocol, sa.user_ip4, sa.user_port)
    };
    if family != AF_INET || (proto != u32::from(PROTO_TCP) && proto != u32::from(PROTO_UDP)) {
        return None;
    }
    let dst = ip.to_ne_bytes();
    // `user_port` holds the port in network byte order in its first two bytes.
    let port = port as u16;
    let t = if dst[0] == 127 {
        let k = PortKey {
            host_ip: [0; 4],
            host_port: port,
            proto: proto as u8,
            _pad: 0,
        };
        // SAFETY: map values are only read.
        *unsafe { PORTS.get(k) }?
    } else {
        lookup(dst, port, proto as u8)?
    };
    Some((t, dst, port))
}

/// cgroup connect4 / sendmsg4: a node socket to a hostPort goes to the pod.
#[inline(always)]
pub fn sock_connect(ctx: &SockAddrContext) {
    let Some((t, dst, port)) = sock_target(ctx) else {
        return;
    };
    // SAFETY: writable fields of this hook; plain helper call.
    let cookie = unsafe {
        (*ctx.sock_addr).user_ip4 = u32::from_ne_bytes(t.pod_ip);
        (*ctx.sock_addr).user_port = u32::from(t.pod_port);
        bpf_get_socket_cookie(ctx.sock_addr.cast())
    };
    let k = SockKey {
        cookie,
        pod_ip: t.pod_ip,
        pod_port: t.pod_port,
        _pad: 0,
    };
    let o = SockOrig {
        ip: dst,
        port,
        _pad: 0,
    };
    let _ = HP_SOCK.insert(k, o, 0);
    count(reason::HOSTPORT_SOCK);
}

/// cgroup recvmsg4 / getpeername4: the peer shows as what the socket asked for.
#[inline(always)]
pub fn sock_restore(ctx: &SockAddrContext) {
    // SAFETY: the kernel passes a valid bpf_sock_addr; plain helper call.
    let (family, ip, port, cookie) = unsafe {
        let sa = &*ctx.sock_addr;
        (
            sa.family,
            sa.user_ip4,
            sa.user_port,
            bpf_get_socket_cookie(ctx.sock_addr.cast()),
        )
    };
    if family != AF_INET {
        return;
    }
    let k = SockKey {
        cookie,
        pod_ip: ip.to_ne_bytes(),
        pod_port: port as u16,
        _pad: 0,
    };
    // SAFETY: map values are only read.
    if let Some(o) = unsafe { HP_SOCK.get(k) } {
        // SAFETY: writable fields of these hooks.
        unsafe {
            (*ctx.sock_addr).user_ip4 = u32::from_ne_bytes(o.ip);
            (*ctx.sock_addr).user_port = u32::from(o.port);
        }
    }
}

/// cgroup connect4 of `hp_learn4`: a socket connecting to `LEARN_ADDR` gets
/// its network namespace's cookie recorded under its own cookie (userspace
/// reads it back with SO_COOKIE; before 5.14 it has no SO_NETNS_COOKIE).
#[inline(always)]
pub fn sock_learn(ctx: &SockAddrContext) {
    let (ip, port) = sluice_common::programs::LEARN_ADDR;
    // SAFETY: the kernel passes a valid bpf_sock_addr.
    let (dst, dport) = unsafe {
        let sa = &*ctx.sock_addr;
        (sa.user_ip4.to_ne_bytes(), sa.user_port as u16)
    };
    if dst != ip || dport != port.to_be() {
        return;
    }
    // SAFETY: plain helper calls on this program's context.
    let (sock, netns) = unsafe {
        (
            bpf_get_socket_cookie(ctx.sock_addr.cast()),
            bpf_get_netns_cookie(ctx.sock_addr.cast()),
        )
    };
    let _ = crate::maps::HP_LEARN.insert(sock, netns, 0);
}
