//! hostPort for the node's own sockets (cgroup `sock_addr` hooks, both
//! families): a connect or sendmsg to `127.0.0.1`/`::1` or a node address
//! and a mapped port is pointed at the pod before any packet exists;
//! recvmsg and getpeername show the address the socket asked for. They act
//! only in the node's network namespace (netns cookie), whatever cgroup they
//! are attached to.
use aya_ebpf::{
    helpers::{bpf_get_netns_cookie, bpf_get_socket_cookie},
    programs::SockAddrContext,
};
use sluice_common::{
    reason, Addr6, PortKey, PortKey6, PortTarget, PortTarget6, SockKey, SockKey6, SockOrig,
    SockOrig6,
};

use super::{config, v4, v6};
use crate::{
    counters::count,
    l3::same6,
    maps::{HP_SOCK, HP_SOCK6, PORTS},
    proto::{AF_INET, AF_INET6, PROTO_TCP, PROTO_UDP},
    sock_addr::{set_user_ip6, user_ip6},
};

// --- IPv4 -----------------------------------------------------------------------

/// The socket's family, protocol and destination, when the hooks may act on it.
#[inline(always)]
fn target4(ctx: &SockAddrContext) -> Option<(PortTarget, [u8; 4], u16)> {
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
    if family != u32::from(AF_INET)
        || (proto != u32::from(PROTO_TCP) && proto != u32::from(PROTO_UDP))
    {
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
        v4::lookup(dst, port, proto as u8)?
    };
    Some((t, dst, port))
}

/// cgroup connect4 / sendmsg4: a node socket to a hostPort goes to the pod.
#[inline(always)]
pub fn connect4(ctx: &SockAddrContext) {
    let Some((t, dst, port)) = target4(ctx) else {
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
pub fn restore4(ctx: &SockAddrContext) {
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
    if family != u32::from(AF_INET) {
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
pub fn learn4(ctx: &SockAddrContext) {
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

// --- IPv6 -----------------------------------------------------------------------

/// The mapping an IPv6 node socket is connecting or sending to: `[::1]` or a
/// node address (or a mapping's own `hostIP`).
#[inline(always)]
fn target6(ctx: &SockAddrContext) -> Option<(PortTarget6, Addr6, u16)> {
    let cfg = config()?;
    // SAFETY: plain helper call on this program's context.
    if unsafe { bpf_get_netns_cookie(ctx.sock_addr.cast()) } != cfg.netns_cookie {
        return None;
    }
    // SAFETY: the kernel passes a valid bpf_sock_addr.
    let (family, proto, port) = unsafe {
        let sa = &*ctx.sock_addr;
        (sa.family, sa.protocol, sa.user_port)
    };
    if family != u32::from(AF_INET6)
        || (proto != u32::from(PROTO_TCP) && proto != u32::from(PROTO_UDP))
    {
        return None;
    }
    let dst = user_ip6(ctx);
    // `user_port` holds the port in network byte order in its first two bytes.
    let port = port as u16;
    // `[::1]` matches the wildcard mappings only (it is in no node address
    // list, so the fallback finds nothing more).
    let mut k = PortKey6 {
        host_ip: if same6(&dst, &v6::LOOPBACK) {
            Addr6::default()
        } else {
            dst
        },
        host_port: port,
        proto: proto as u8,
        _pad: 0,
    };
    let t = *v6::lookup(&mut k)?;
    Some((t, dst, port))
}

/// cgroup connect6 / sendmsg6: a node socket to an IPv6 hostPort goes to the pod.
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "keys go to the map helpers by reference: IPv6 keys are 20 to 40 bytes of a 512-byte stack"
)]
#[inline(always)]
pub fn connect6(ctx: &SockAddrContext) {
    let Some((t, dst, port)) = target6(ctx) else {
        return;
    };
    set_user_ip6(ctx, &t.pod_ip);
    // SAFETY: a writable field of these hooks; plain helper call.
    let cookie = unsafe {
        (*ctx.sock_addr).user_port = u32::from(t.pod_port);
        bpf_get_socket_cookie(ctx.sock_addr.cast())
    };
    let k = SockKey6 {
        cookie,
        pod_ip: t.pod_ip,
        pod_port: t.pod_port,
        _pad: 0,
        _pad2: 0,
    };
    let o = SockOrig6 {
        ip: dst,
        port,
        _pad: 0,
    };
    let _ = HP_SOCK6.insert(&k, &o, 0);
    count(reason::HOSTPORT_SOCK);
}

/// cgroup recvmsg6 / getpeername6: the peer shows as what the socket asked for.
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "keys go to the map helpers by reference: IPv6 keys are 20 to 40 bytes of a 512-byte stack"
)]
#[inline(always)]
pub fn restore6(ctx: &SockAddrContext) {
    // SAFETY: the kernel passes a valid bpf_sock_addr; plain helper call.
    let (family, port, cookie) = unsafe {
        let sa = &*ctx.sock_addr;
        (
            sa.family,
            sa.user_port,
            bpf_get_socket_cookie(ctx.sock_addr.cast()),
        )
    };
    if family != u32::from(AF_INET6) {
        return;
    }
    let k = SockKey6 {
        cookie,
        pod_ip: user_ip6(ctx),
        pod_port: port as u16,
        _pad: 0,
        _pad2: 0,
    };
    // SAFETY: map values are only read.
    if let Some(o) = unsafe { HP_SOCK6.get(&k) }.copied() {
        set_user_ip6(ctx, &o.ip);
        // SAFETY: a writable field of these hooks.
        unsafe { (*ctx.sock_addr).user_port = u32::from(o.port) };
    }
}
