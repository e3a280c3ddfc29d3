//! The Service socket hooks (cgroup `sock_addr`, both families): `connect`
//! and `sendmsg` to a Service go to a backend ([`super::pick`]),
//! `recvmsg` and `getpeername` show the Service the socket asked for. A
//! hook's return value is the kernel's verdict: 1 lets the call go on, 0
//! fails it with `EPERM` (a Service without endpoints, see
//! [`no_endpoint`]).
use aya_ebpf::{
    helpers::bpf_get_socket_cookie, macros::cgroup_sock_addr, programs::SockAddrContext,
};
use sluice_common::{lb_flags, reason, Addr6, Backend, IpKey, LbSockKey, LbSockOrig, SvcKey};

use super::{netns, pick, Pick};
use crate::{
    counters::count,
    events,
    l3::same6,
    maps::{LB_CONFIG, LB_SOCK, NODE_ADDRS, NODE_ADDRS6},
    proto::{AF_INET, AF_INET6, PROTO_TCP, PROTO_UDP},
    sock_addr::{set_user_ip6, user_ip6},
};

/// `::1`.
const LOOPBACK6: Addr6 = Addr6([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);

/// Let the call go on.
const ALLOW: i32 = 1;
/// Fail it (`EPERM`).
const REFUSE: i32 = 0;

/// The socket's family, protocol (TCP or UDP) and destination port (network
/// byte order, the first two bytes of `user_port`), if `family` is its.
#[inline(always)]
fn socket(ctx: &SockAddrContext, family: u8) -> Option<(u8, u16)> {
    // SAFETY: the kernel passes a valid bpf_sock_addr.
    let (f, proto, port) = unsafe {
        let sa = &*ctx.sock_addr;
        (sa.family, sa.protocol, sa.user_port)
    };
    if f != u32::from(family) || (proto != u32::from(PROTO_TCP) && proto != u32::from(PROTO_UDP)) {
        return None;
    }
    Some((proto as u8, port as u16))
}

/// Whether the agent wrote a NodePort frontend (skips the node address
/// lookup of every other connect when it did not).
#[inline(always)]
fn node_ports() -> bool {
    LB_CONFIG
        .get(0)
        .is_some_and(|c| c.flags & lb_flags::NODE_PORTS != 0)
}

/// A connect (or datagram) to the Service `key`, which has no endpoint.
/// kube-proxy's `REJECT` rule answers a pod with ICMP port unreachable
/// (`ECONNREFUSED`): a pod's connect goes on untranslated and its first
/// packet gets that answer from `from_pod` ([`super::reject`]). The hooks
/// cannot tell a pod's namespace from the node's but by the node's cookie
/// (the agent writes it where the kernel tells it, 5.14 on): the node's own
/// sockets, and every socket while it is unknown, are refused here
/// (`EPERM`): the node's packets to a Service address would leave by its
/// default route.
#[inline(always)]
fn no_endpoint(ctx: &SockAddrContext, key: &SvcKey) -> i32 {
    let node = LB_CONFIG.get(0).map_or(0, |c| c.node_netns);
    if node != 0 && netns(ctx) != node {
        return ALLOW;
    }
    count(reason::DROP_LB_NO_ENDPOINT);
    events::service(key, None, reason::DROP_LB_NO_ENDPOINT);
    REFUSE
}

/// A connect (or datagram) to the Service `key` was pointed at `b`.
#[inline(always)]
fn translated(key: &SvcKey, b: &Backend) {
    events::service(key, Some(b), reason::LB_SOCK);
}

/// Remembers that the socket now points at `backend`:`port` instead of the
/// Service `orig`.
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "keys go to the map helpers by reference: a 32-byte key on a 512-byte stack"
)]
#[inline(always)]
fn remember(ctx: &SockAddrContext, backend: IpKey, port: u16, orig: &SvcKey) {
    // SAFETY: plain helper call on this program's context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.sock_addr.cast()) };
    let k = LbSockKey {
        cookie,
        addr: backend,
        port,
        _pad: 0,
        _pad2: 0,
    };
    let o = LbSockOrig {
        addr: orig.addr,
        port: orig.port,
        _pad: 0,
    };
    let _ = LB_SOCK.insert(&k, &o, 0);
}

/// The Service the socket asked for, if it was pointed at `addr`:`port`.
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "keys go to the map helpers by reference: a 32-byte key on a 512-byte stack"
)]
#[inline(always)]
fn asked_for(ctx: &SockAddrContext, addr: IpKey, port: u16) -> Option<LbSockOrig> {
    // SAFETY: plain helper call on this program's context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.sock_addr.cast()) };
    let k = LbSockKey {
        cookie,
        addr,
        port,
        _pad: 0,
        _pad2: 0,
    };
    // SAFETY: map values are only read.
    unsafe { LB_SOCK.get(&k) }.copied()
}

// --- IPv4 -----------------------------------------------------------------------

#[inline(always)]
fn to_backend4(ctx: &SockAddrContext) -> i32 {
    let Some((proto, port)) = socket(ctx, AF_INET) else {
        return ALLOW;
    };
    // SAFETY: the kernel passes a valid bpf_sock_addr.
    let dst = unsafe { (*ctx.sock_addr).user_ip4 }.to_ne_bytes();
    let mut key = SvcKey::new(IpKey::v4(dst), port, proto);
    let mut picked = pick(&key, ctx);
    // A NodePort: a node address (`sl_node_addrs`, kept by the agent) or
    // loopback, and a port the agent wrote with the unspecified address.
    // SAFETY: map values are only read.
    if matches!(picked, Pick::NotService)
        && node_ports()
        && (dst[0] == 127 || unsafe { NODE_ADDRS.get(dst) }.is_some())
    {
        key = SvcKey::new(IpKey::v4([0; 4]), port, proto);
        picked = pick(&key, ctx);
    }
    // What the socket shows as its peer, and the event: what it asked for.
    key.addr = IpKey::v4(dst);
    let b = match picked {
        Pick::NotService => return ALLOW,
        Pick::NoEndpoint => return no_endpoint(ctx, &key),
        Pick::Backend(b) => b,
    };
    translated(&key, &b);
    // The agent gives an IPv4 frontend IPv4 backends only.
    let Some(ip) = b.addr.as_v4() else {
        return REFUSE;
    };
    // SAFETY: writable fields of the connect4/sendmsg4 hooks.
    unsafe {
        (*ctx.sock_addr).user_ip4 = u32::from_ne_bytes(ip);
        (*ctx.sock_addr).user_port = u32::from(b.port);
    }
    remember(ctx, b.addr, b.port, &key);
    ALLOW
}

#[inline(always)]
fn to_service4(ctx: &SockAddrContext) -> i32 {
    // SAFETY: the kernel passes a valid bpf_sock_addr.
    let (family, ip, port) = unsafe {
        let sa = &*ctx.sock_addr;
        (sa.family, sa.user_ip4, sa.user_port)
    };
    if family != u32::from(AF_INET) {
        return ALLOW;
    }
    if let Some(o) = asked_for(ctx, IpKey::v4(ip.to_ne_bytes()), port as u16) {
        if let Some(vip) = o.addr.as_v4() {
            // SAFETY: writable fields of the recvmsg4/getpeername4 hooks.
            unsafe {
                (*ctx.sock_addr).user_ip4 = u32::from_ne_bytes(vip);
                (*ctx.sock_addr).user_port = u32::from(o.port);
            }
        }
    }
    ALLOW
}

#[cgroup_sock_addr(connect4)]
pub fn lb_connect4(ctx: SockAddrContext) -> i32 {
    to_backend4(&ctx)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn lb_sendmsg4(ctx: SockAddrContext) -> i32 {
    to_backend4(&ctx)
}

#[cgroup_sock_addr(recvmsg4)]
pub fn lb_recvmsg4(ctx: SockAddrContext) -> i32 {
    to_service4(&ctx)
}

#[cgroup_sock_addr(getpeername4)]
pub fn lb_getpeername4(ctx: SockAddrContext) -> i32 {
    to_service4(&ctx)
}

// --- IPv6 -----------------------------------------------------------------------

#[inline(always)]
fn to_backend6(ctx: &SockAddrContext) -> i32 {
    let Some((proto, port)) = socket(ctx, AF_INET6) else {
        return ALLOW;
    };
    let dst = user_ip6(ctx);
    let mut key = SvcKey::new(IpKey::v6(dst.0), port, proto);
    let mut picked = pick(&key, ctx);
    // A NodePort (see `to_backend4`).
    // SAFETY: map values are only read.
    if matches!(picked, Pick::NotService)
        && node_ports()
        && (same6(&dst, &LOOPBACK6) || unsafe { NODE_ADDRS6.get(dst) }.is_some())
    {
        key = SvcKey::new(IpKey::v6([0; 16]), port, proto);
        picked = pick(&key, ctx);
    }
    key.addr = IpKey::v6(dst.0);
    let b = match picked {
        Pick::NotService => return ALLOW,
        Pick::NoEndpoint => return no_endpoint(ctx, &key),
        Pick::Backend(b) => b,
    };
    translated(&key, &b);
    set_user_ip6(ctx, &Addr6(b.addr.addr));
    // SAFETY: a writable field of the connect6/sendmsg6 hooks.
    unsafe { (*ctx.sock_addr).user_port = u32::from(b.port) };
    remember(ctx, b.addr, b.port, &key);
    ALLOW
}

#[inline(always)]
fn to_service6(ctx: &SockAddrContext) -> i32 {
    // SAFETY: the kernel passes a valid bpf_sock_addr.
    let (family, port) = unsafe {
        let sa = &*ctx.sock_addr;
        (sa.family, sa.user_port)
    };
    if family != u32::from(AF_INET6) {
        return ALLOW;
    }
    if let Some(o) = asked_for(ctx, IpKey::v6(user_ip6(ctx).0), port as u16) {
        set_user_ip6(ctx, &Addr6(o.addr.addr));
        // SAFETY: a writable field of the recvmsg6/getpeername6 hooks.
        unsafe { (*ctx.sock_addr).user_port = u32::from(o.port) };
    }
    ALLOW
}

#[cgroup_sock_addr(connect6)]
pub fn lb_connect6(ctx: SockAddrContext) -> i32 {
    to_backend6(&ctx)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn lb_sendmsg6(ctx: SockAddrContext) -> i32 {
    to_backend6(&ctx)
}

#[cgroup_sock_addr(recvmsg6)]
pub fn lb_recvmsg6(ctx: SockAddrContext) -> i32 {
    to_service6(&ctx)
}

#[cgroup_sock_addr(getpeername6)]
pub fn lb_getpeername6(ctx: SockAddrContext) -> i32 {
    to_service6(&ctx)
}
