//! A pod's first packet to a Service without endpoints is answered with
//! ICMP port unreachable, as kube-proxy's `REJECT` rule answers it
//! (iptables' default `icmp-port-unreachable`, `icmp6-port-unreachable` for
//! IPv6): the client sees `ECONNREFUSED` at once. The socket hook let the
//! connect go on untranslated (`sock::no_endpoint`); `from_pod` finds its
//! destination among the frontends here.
//!
//! Built in place, as Cilium's `tail_no_service_ipv4` does: the frame is cut
//! to the IP header and the start of L4 (what an ICMP error quotes: 8 bytes
//! at least, RFC 792; more is allowed, RFC 1812 4.3.2.3, RFC 4443 3.1),
//! grown at its head by the new IP and ICMP headers
//! (`bpf_skb_change_tail`, `bpf_skb_change_head`), written in one store and
//! redirected out of the pod's host device, into the pod. A TCP SYN keeps
//! its whole 20-byte header: a pod's own packets carry a partial checksum
//! (`CHECKSUM_PARTIAL` crosses the veth), and `bpf_skb_change_tail` refuses
//! to cut before the checksum field it points at (`__bpf_skb_min_len`).
use aya_ebpf::{
    bindings::TC_ACT_SHOT,
    helpers::{
        bpf_csum_diff, bpf_redirect, bpf_skb_change_head, bpf_skb_change_tail, bpf_skb_load_bytes,
    },
    macros::map,
    maps::PerCpuArray,
    programs::TcContext,
};
use sluice_common::{lb_flags, svc_flags, IpKey, SvcKey};

use crate::{
    l3::{Headers, L3},
    maps::{LB_CONFIG, LB_SVC},
    packet::read,
    proto::{PROTO_TCP, PROTO_UDP},
};

const ETH: usize = 14;
/// TCP's SYN and ACK flags (byte 13 of its header).
const SYN: u8 = 0x02;
const ACK: u8 = 0x10;

/// The new headers: IPv4 (no options) and ICMP; IPv6 and ICMPv6.
const V4_ROOM: usize = 20 + 8;
const V6_ROOM: usize = 40 + 8;
/// L4 bytes quoted: UDP's header; TCP's fixed header (see above).
const UDP_Q: usize = 8;
const TCP_Q: usize = 20;
/// Whole frames: Ethernet, the new headers, the quoted IP header and L4.
const V4_UDP: usize = ETH + V4_ROOM + 20 + UDP_Q;
const V4_TCP: usize = ETH + V4_ROOM + 20 + TCP_Q;
const V6_UDP: usize = ETH + V6_ROOM + 40 + UDP_Q;
const V6_TCP: usize = ETH + V6_ROOM + 40 + TCP_Q;

/// The largest frame.
const MAX_FRAME: usize = 128;

/// Not pinned: the frame being built (off the stack: on it, with the
/// programs' own frames, it passed the 512 bytes a chain of calls may use).
#[map(name = "sl_lb_reject")]
static SCRATCH: PerCpuArray<[u8; MAX_FRAME]> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's frame buffer, as `N` bytes.
#[inline(always)]
fn frame<const N: usize>() -> Option<&'static mut [u8; N]> {
    const { assert!(N <= MAX_FRAME) };
    let p = SCRATCH.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot of MAX_FRAME >= N bytes; only the running
    // program uses it, and not across calls that could run another.
    Some(unsafe { &mut *p.cast::<[u8; N]>() })
}

/// A pod's packet to a Service frontend without endpoints, as [`send`]
/// answers it: IPv4 or IPv6, TCP or UDP. `None` for every other packet.
/// Only a connection's opening packet is looked at (a TCP SYN; any UDP
/// datagram): established TCP pays one compare.
#[derive(Clone, Copy)]
pub struct Rejected {
    v4: bool,
    tcp: bool,
    /// Answered (the port has no endpoint anywhere, `svc_flags::REJECT`);
    /// else dropped, as kube-proxy drops what an `internalTrafficPolicy:
    /// Local` Service without a local endpoint gets ("has no local
    /// endpoints").
    pub answer: bool,
}

#[inline(always)]
pub fn to_reject(ctx: &TcContext, h: &Headers) -> Option<Rejected> {
    // Nothing to answer unless the agent wrote a Service port without
    // endpoints: one array lookup instead of a hash lookup per datagram.
    if !LB_CONFIG
        .get(0)
        .is_some_and(|c| c.flags & lb_flags::EMPTY_SERVICES != 0)
    {
        return None;
    }
    // The frontend: destination, port, protocol; IPv4 without options and
    // not a fragment, IPv6 with TCP or UDP right after its header.
    let (key, l4, v4) = match h.l3 {
        L3::V4(_) => {
            let f = h.v4_fields()?;
            if f.vihl != 0x45 || f.fragment() || !matches!(f.proto, PROTO_TCP | PROTO_UDP) {
                return None;
            }
            (IpKey::v4(f.dst), f.proto, true)
        }
        L3::V6(_) => {
            let (_, dst, next) = h.v6_fields()?;
            if !matches!(next, PROTO_TCP | PROTO_UDP) {
                return None;
            }
            (IpKey::v6(dst), next, false)
        }
    };
    let off = ETH + if v4 { 20 } else { 40 };
    if l4 == PROTO_TCP {
        let flags = read::<[u8; 2]>(ctx, off + 12).ok()?[1];
        if flags & (SYN | ACK) != SYN {
            return None;
        }
    }
    let port = read::<[u16; 2]>(ctx, off).ok()?[1];
    // SAFETY: map values are only read.
    let svc = unsafe { LB_SVC.get(SvcKey::new(key, port, l4)) }?;
    // A Service with endpoints the socket hook did not translate (a pod
    // outside its cgroup): left to the routing, as before.
    (svc.count == 0).then_some(Rejected {
        v4,
        tcp: l4 == PROTO_TCP,
        answer: svc.flags & svc_flags::REJECT != 0,
    })
}

/// A packet from outside (the uplink) to a Service with no endpoint at
/// all, which kube-proxy's `KUBE-EXTERNAL-SERVICES` rule rejects: its
/// opening packet (a TCP SYN, a UDP datagram; IPv4 without options) is
/// answered with port unreachable back out of the uplink; any other is
/// dropped. Counted as `drop_lb_no_endpoint` either way.
#[inline(always)]
pub fn from_outside(ctx: &TcContext, v4: bool) -> i32 {
    crate::events::note_drop(sluice_common::reason::DROP_LB_NO_ENDPOINT, 0);
    // (Reads of two bytes: `read` takes no single one.) IPv4: version and
    // length, then TTL and protocol; IPv6: next header and hop limit.
    let proto = if v4 {
        match (read::<[u8; 2]>(ctx, ETH), read::<[u8; 2]>(ctx, ETH + 8)) {
            (Ok([0x45, _]), Ok([_, p])) => p,
            _ => return TC_ACT_SHOT,
        }
    } else {
        match read::<[u8; 2]>(ctx, ETH + 6) {
            Ok([p, _]) => p,
            Err(_) => return TC_ACT_SHOT,
        }
    };
    let l4_off = if v4 { ETH + 20 } else { ETH + 40 };
    let tcp = match proto {
        PROTO_TCP => {
            let Ok(flags) = read::<[u8; 2]>(ctx, l4_off + 12) else {
                return TC_ACT_SHOT;
            };
            if flags[1] & (SYN | ACK) != SYN {
                return TC_ACT_SHOT;
            }
            true
        }
        PROTO_UDP => false,
        _ => return TC_ACT_SHOT,
    };
    // SAFETY: `skb` points at the context the kernel passed in.
    let uplink = unsafe { (*ctx.skb.skb).ifindex };
    reject(
        ctx,
        Rejected {
            v4,
            tcp,
            answer: true,
        },
        uplink,
    )
}

/// Answers the packet [`to_reject`] found with port unreachable, sent back
/// out of `ifindex` (into the pod behind it; out of the uplink for
/// [`from_outside`]): `TC_ACT_REDIRECT`, or a drop where the answer cannot
/// be built.
#[inline(always)]
pub fn reject(ctx: &TcContext, r: Rejected, ifindex: u32) -> i32 {
    match (r.v4, r.tcp) {
        (true, true) => reject4::<V4_TCP>(ctx, ifindex),
        (true, false) => reject4::<V4_UDP>(ctx, ifindex),
        (false, true) => reject6::<V6_TCP>(ctx, ifindex),
        (false, false) => reject6::<V6_UDP>(ctx, ifindex),
    }
}

/// The ones' complement sum of `f[from..to]` (`to - from` a multiple of 4)
/// added to `seed`, not folded (`bpf_csum_diff`; words as the CPU reads
/// them, which [`fold`] stores back the same way). A helper, not a loop: an
/// unrolled loop's spills passed the stack a chain of calls may use.
#[inline(always)]
fn sum<const N: usize>(f: &mut [u8; N], from: usize, to: usize, seed: u32) -> u32 {
    if from > to || to > N || !(to - from).is_multiple_of(4) {
        return seed;
    }
    // SAFETY: `f[from..to]` is inside the buffer.
    unsafe {
        bpf_csum_diff(
            core::ptr::null_mut(),
            0,
            f.as_mut_ptr().add(from).cast(),
            (to - from) as u32,
            seed,
        ) as u32
    }
}

/// `acc` folded and complemented, as stored.
#[inline(always)]
fn fold(mut acc: u32) -> [u8; 2] {
    acc = (acc & 0xffff) + (acc >> 16);
    acc = (acc & 0xffff) + (acc >> 16);
    (!(acc as u16)).to_ne_bytes()
}

/// Writes the swapped Ethernet addresses of the original frame, copied to
/// `at`, into the head of `f` (before the new headers overwrite the copy).
#[inline(always)]
fn swap_macs<const N: usize>(f: &mut [u8; N], at: usize, ethertype: [u8; 2]) {
    let mut i = 0;
    while i < 6 && at + 12 <= N {
        let (dst, src) = (f[at + i], f[at + 6 + i]);
        f[i] = src;
        f[6 + i] = dst;
        i += 1;
    }
    f[12] = ethertype[0];
    f[13] = ethertype[1];
}

/// Cuts the frame to `keep` bytes, grows it at its head by `room`, writes
/// `f` over it and sends it back into the pod.
#[inline(always)]
fn send<const N: usize>(
    ctx: &TcContext,
    f: &[u8; N],
    keep: usize,
    room: usize,
    ifindex: u32,
) -> i32 {
    // SAFETY: helper calls on this program's skb; `f` is N bytes of stack.
    unsafe {
        let skb = ctx.skb.skb;
        if bpf_skb_change_tail(skb, keep as u32, 0) != 0
            || bpf_skb_change_head(skb, room as u32, 0) != 0
        {
            return TC_ACT_SHOT;
        }
        if ctx.store(0, f, 0).is_err() {
            return TC_ACT_SHOT;
        }
        // Out of the pod's host device (into the pod), or of the uplink.
        bpf_redirect(ifindex, 0) as i32
    }
}

/// This CPU's frame buffer of `N` bytes with the original frame's start
/// (Ethernet, IP header, the start of L4) loaded after `room` bytes, where
/// the frame holds it once grown, and the swapped Ethernet addresses with
/// `ethertype` at its head.
#[inline(always)]
fn original<const N: usize>(
    ctx: &TcContext,
    room: usize,
    ethertype: [u8; 2],
) -> Option<&'static mut [u8; N]> {
    let f = frame::<N>()?;
    if room > N {
        return None;
    }
    // SAFETY: N - room bytes into the buffer from its `room`.
    let rc = unsafe {
        bpf_skb_load_bytes(
            ctx.skb.skb.cast(),
            0,
            f.as_mut_ptr().add(room).cast(),
            (N - room) as u32,
        )
    };
    if rc != 0 {
        return None;
    }
    swap_macs(f, room, ethertype);
    Some(f)
}

/// An ICMP (or ICMPv6) error header at `at`: its type and code, the
/// checksum and the unused word zero.
#[inline(always)]
fn icmp_head<const N: usize>(f: &mut [u8; N], at: usize, kind: u8, code: u8) {
    if at + 8 > N {
        return;
    }
    f[at] = kind;
    f[at + 1] = code;
    let mut i = 2;
    while i < 8 {
        f[at + i] = 0;
        i += 1;
    }
}

/// The frame of `N` bytes answering an IPv4 packet.
#[inline(never)]
fn reject4<const N: usize>(ctx: &TcContext, ifindex: u32) -> i32 {
    let Some(f) = original::<N>(ctx, V4_ROOM, [0x08, 0x00]) else {
        return TC_ACT_SHOT;
    };
    let q = ETH + V4_ROOM; // the quoted IPv4 header
                           // IPv4: version 4, IHL 5, TOS as Linux's icmp_send
                           // (IPTOS_PREC_INTERNETCONTROL), length, no fragmentation fields, TTL 64,
                           // ICMP; from the Service address to the client.
    let ip = ETH;
    f[ip] = 0x45;
    f[ip + 1] = 0xc0;
    let len = ((N - ETH) as u16).to_be_bytes();
    f[ip + 2] = len[0];
    f[ip + 3] = len[1];
    f[ip + 4] = 0;
    f[ip + 5] = 0;
    f[ip + 6] = 0;
    f[ip + 7] = 0;
    f[ip + 8] = 64;
    f[ip + 9] = 1;
    f[ip + 10] = 0;
    f[ip + 11] = 0;
    let mut i = 0;
    while i < 4 {
        f[ip + 12 + i] = f[q + 16 + i];
        f[ip + 16 + i] = f[q + 12 + i];
        i += 1;
    }
    let c = fold(sum(f, ip, ip + 20, 0));
    f[ip + 10] = c[0];
    f[ip + 11] = c[1];
    // ICMP destination unreachable (3), port unreachable (3).
    let icmp = ETH + 20;
    icmp_head(f, icmp, 3, 3);
    let c = fold(sum(f, icmp, N, 0));
    f[icmp + 2] = c[0];
    f[icmp + 3] = c[1];
    send(ctx, f, N - V4_ROOM, V4_ROOM, ifindex)
}

/// The frame of `N` bytes answering an IPv6 packet.
#[inline(never)]
fn reject6<const N: usize>(ctx: &TcContext, ifindex: u32) -> i32 {
    let Some(f) = original::<N>(ctx, V6_ROOM, [0x86, 0xdd]) else {
        return TC_ACT_SHOT;
    };
    let q = ETH + V6_ROOM;
    // IPv6: version 6, no class or flow label, payload length, ICMPv6 (58),
    // hop limit 64; from the Service address to the client.
    let ip = ETH;
    let plen = ((N - ETH - 40) as u16).to_be_bytes();
    f[ip] = 0x60;
    f[ip + 1] = 0;
    f[ip + 2] = 0;
    f[ip + 3] = 0;
    f[ip + 4] = plen[0];
    f[ip + 5] = plen[1];
    f[ip + 6] = 58;
    f[ip + 7] = 64;
    let mut i = 0;
    while i < 16 {
        f[ip + 8 + i] = f[q + 24 + i];
        f[ip + 24 + i] = f[q + 8 + i];
        i += 1;
    }
    // ICMPv6 destination unreachable (1), port unreachable (4).
    let icmp = ETH + 40;
    icmp_head(f, icmp, 1, 4);
    // The pseudo header (RFC 8200 8.1): both addresses, the upper-layer
    // length and the next header; then the message.
    let mut rest = [0, 0, plen[0], plen[1], 0, 0, 0, 58];
    // SAFETY: 8 bytes of stack.
    let tail =
        unsafe { bpf_csum_diff(core::ptr::null_mut(), 0, rest.as_mut_ptr().cast(), 8, 0) as u32 };
    let pseudo = sum(f, ip + 8, ip + 40, tail);
    let c = fold(sum(f, icmp, N, pseudo));
    f[icmp + 2] = c[0];
    f[icmp + 3] = c[1];
    send(ctx, f, N - V6_ROOM, V6_ROOM, ifindex)
}
