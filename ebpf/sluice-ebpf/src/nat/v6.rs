//! IPv6 masquerade: the same flow table design as IPv4 (`family::V6`: its own
//! maps, the same ports, states and timeouts), with what IPv6 changes:
//!
//! - no header checksum: the addresses are in the L4 checksum's pseudo header,
//!   ICMPv6's included (RFC 4443 2.3), see `l4::rewrite6`;
//! - extension headers (RFC 8200 4): hop-by-hop, routing and destination
//!   options are walked, at most [`EXT_MAX`]; a fragment header or anything
//!   else (ESP, AH, more headers) is not translated: a leaving packet is
//!   dropped and counted (it would leak the pod's address), an arriving one is
//!   left to the kernel;
//! - ICMPv6: echo requests open flows; echo replies and errors from a pod
//!   answer what the outside sent to the pod's own address and leave as they
//!   are, and neighbour discovery (link-local) never meets the uplink with a pod
//!   address. ICMPv6 errors arriving about masqueraded flows are translated
//!   back (`icmp6`). The node's own echo requests from the masquerade address
//!   are flows too, as in IPv4 (`icmp::node_echo_flow`).
use aya_ebpf::{
    bindings::TC_ACT_SHOT,
    macros::map,
    maps::{lpm_trie::Key, PerCpuArray},
    programs::TcContext,
};
use sluice_common::{
    event_kind, masq_flags, reason, Addr6, IpKey, Masq6Config, MasqConfig, Nat6Key,
};

use super::{evict, family::V6, flow_back, flow_out, icmp::node_echo_flow};
use crate::{
    counters::count,
    endpoint::deliver_masq_reply as deliver,
    events::{self, note_drop},
    l3::same6,
    l4::{
        l4, rewrite6, Rewrite6, ETH_LEN, ICMP6_DEST_UNREACH, ICMP6_ECHO, ICMP6_ECHO_REPLY,
        ICMP6_PARAM_PROBLEM, L4, PROTO_ICMPV6, PROTO_SCTP, PROTO_TCP,
    },
    maps::{ENDPOINTS, MASQ6, NAT6_FWD, NON_MASQ6},
    packet::read,
    TCX_NEXT,
};

/// Not pinned: a leaving IPv6 packet between the steps of its masquerade.
#[map(name = "sl_scratch6")]
pub(crate) static SCRATCH6: PerCpuArray<Leaving> = PerCpuArray::with_max_entries(1, 0);

/// Extension headers walked before the L4 header.
const EXT_MAX: usize = 4;
use crate::proto::{
    IP6_DST_OFF as DST_OFF, IP6_SRC_OFF as SRC_OFF, NH_DEST_OPTS, NH_FRAGMENT, NH_HOP_BY_HOP,
    NH_ROUTING,
};

/// The IPv6 masquerade settings when IPv6 masquerade is on, copied: filtering
/// the map value's pointer on its flags let LLVM mask the pointer instead of
/// branching ("bitwise operator &= on pointer prohibited").
#[inline(always)]
pub(super) fn config6() -> Option<Masq6Config> {
    let c = *MASQ6.get(0)?;
    if c.flags & masq_flags::ENABLED == 0 {
        return None;
    }
    Some(c)
}

/// The addresses and next header of an IPv6 frame (read one by one: the
/// header copied whole cost 40 bytes of the 512-byte stack).
#[inline(always)]
pub(super) fn addrs(ctx: &TcContext) -> Option<(Addr6, Addr6, u8)> {
    Some((
        read(ctx, SRC_OFF).ok()?,
        read(ctx, DST_OFF).ok()?,
        // Next header, with the hop limit after it (see `read`).
        read::<[u8; 2]>(ctx, ETH_LEN + 6).ok()?[0],
    ))
}

/// The upper-layer protocol and its offset after the extension headers that
/// can be walked; `Err` with the reason a leaving packet is dropped.
#[inline(always)]
pub(super) fn upper_layer(ctx: &TcContext, first: u8) -> Result<(u8, usize), u32> {
    let (mut nh, mut off) = (first, ETH_LEN + 40);
    let mut i = 0;
    while i < EXT_MAX {
        match nh {
            NH_HOP_BY_HOP | NH_ROUTING | NH_DEST_OPTS => {
                let hdr: [u8; 2] = ctx.load(off).map_err(|_| reason::DROP_MASQ_MALFORMED)?;
                nh = hdr[0];
                // Length in 8-octet units, not counting the first 8 (4.3-4.6).
                off += (usize::from(hdr[1]) + 1) * 8;
            }
            NH_FRAGMENT => return Err(reason::DROP_MASQ_FRAGMENT),
            _ => return Ok((nh, off)),
        }
        i += 1;
    }
    Err(reason::DROP_MASQ_PROTO)
}

/// A leaving IPv6 packet between the steps of [`snat6`] (value of
/// `sl_scratch6`).
#[derive(Default)]
pub struct Leaving {
    key: Nat6Key,
    l4: L4,
    /// 0: the node's own echo request.
    pod_ifindex: u32,
    tcp_flags: u8,
    /// The translation: address and port.
    out: (Addr6, u16),
}

/// What [`classify`] returns for a packet to translate.
const CONTINUE: i32 = i32::MIN;

/// uplink egress, IPv6: masquerades pod traffic leaving the cluster range.
/// Three calls in turn (what to do, the flow, the rewrite) sharing the
/// packet's state in a per-CPU scratch entry: on the stack of one function,
/// their locals exceeded the 512 bytes the verifier allows a chain of calls.
#[inline(never)]
pub(super) fn snat6(ctx: &TcContext, cfg: &MasqConfig) -> i32 {
    let Some(p) = SCRATCH6.get_ptr_mut(0) else {
        return TCX_NEXT;
    };
    // SAFETY: this CPU's entry, used by this program run only.
    let p = unsafe { &mut *p };
    let v = classify(ctx, p);
    if v != CONTINUE {
        return v;
    }
    let r = if p.pod_ifindex == 0 {
        node_echo6(cfg, &p.key, &mut p.out)
    } else {
        // A new flow's room is made here, not in the flow function (see
        // `Family::ROOM_IN_FLOW`).
        if NAT6_FWD.get_ptr(&p.key).is_none() {
            if let Err(r) = evict::make_room_for::<V6>(p.pod_ifindex) {
                note_drop(r, p.pod_ifindex);
                return TC_ACT_SHOT;
            }
        }
        flow_out6(cfg, &p.key, p.pod_ifindex, p.tcp_flags, &mut p.out)
    };
    match r {
        TRANSLATE => {}
        TRANSLATE_NEW => {
            if p.pod_ifindex != 0 {
                evict::note_new::<V6>(&p.key, p.pod_ifindex);
            }
            events::flow6(
                event_kind::NAT_NEW,
                &p.key,
                Some(&p.out.0),
                p.out.1,
                p.pod_ifindex,
            );
        }
        INBOUND => return TCX_NEXT,
        r => {
            note_drop(r as u32, p.pod_ifindex);
            return TC_ACT_SHOT;
        }
    }
    // A node echo that keeps its identifier.
    if p.out.1 == p.key.src_port && same6(&p.out.0, &p.key.src_ip) {
        return TCX_NEXT;
    }
    translate_source(ctx, p)
}

/// The verdict for a leaving IPv6 packet that is not translated, or
/// [`CONTINUE`] with `p` filled in for one that is.
#[inline(never)]
fn classify(ctx: &TcContext, p: &mut Leaving) -> i32 {
    if config6().is_none() {
        return TCX_NEXT;
    }
    let Some((src, dst, next_hdr)) = addrs(ctx) else {
        return TCX_NEXT;
    };
    // SAFETY: map values are only read.
    let Some(ep) = (unsafe { ENDPOINTS.get(IpKey::v6(src.0)) }) else {
        return node_echo(ctx, p, &src, &dst, next_hdr);
    };
    let ifindex = ep.ifindex;
    if NON_MASQ6.get(Key::new(128, dst.0)).is_some() {
        return TCX_NEXT;
    }
    let (proto, l4_off) = match upper_layer(ctx, next_hdr) {
        Ok(p) => p,
        Err(r) => {
            note_drop(r, ifindex);
            return TC_ACT_SHOT;
        }
    };
    // As for IPv4: echo requests open flows, echo replies and errors answer
    // what came to the pod's own address, anything else would leak it.
    if proto == PROTO_ICMPV6 {
        match ctx.load::<u8>(l4_off) {
            Ok(ICMP6_ECHO) => {}
            Ok(ICMP6_DEST_UNREACH..=ICMP6_PARAM_PROBLEM | ICMP6_ECHO_REPLY) => return TCX_NEXT,
            _ => {
                note_drop(reason::DROP_MASQ_PROTO, ifindex);
                return TC_ACT_SHOT;
            }
        }
    }
    if proto == PROTO_SCTP {
        note_drop(reason::DROP_MASQ_PROTO, ifindex);
        return TC_ACT_SHOT;
    }
    let l4 = match l4(ctx, proto, l4_off, ICMP6_ECHO) {
        Ok(l) => l,
        Err(r) => {
            note_drop(r, ifindex);
            return TC_ACT_SHOT;
        }
    };
    p.tcp_flags = if proto == PROTO_TCP {
        crate::l4::tcp_flags(ctx, l4_off)
    } else {
        0
    };
    p.key = Nat6Key::new(src, dst, l4.sport, l4.dport, proto);
    p.l4 = l4;
    p.pod_ifindex = ifindex;
    CONTINUE
}

/// [`classify`] for a packet from no pod: [`CONTINUE`] with `p` filled in
/// (`pod_ifindex` 0) for an echo request of the node's own from the masquerade
/// address, else [`TCX_NEXT`] (node traffic is never dropped here).
#[inline(always)]
fn node_echo(ctx: &TcContext, p: &mut Leaving, src: &Addr6, dst: &Addr6, next_hdr: u8) -> i32 {
    if !config6().is_some_and(|c| same6(&c.addr, src)) {
        return TCX_NEXT;
    }
    let Ok((PROTO_ICMPV6, l4_off)) = upper_layer(ctx, next_hdr) else {
        return TCX_NEXT;
    };
    let Ok(l4) = l4(ctx, PROTO_ICMPV6, l4_off, ICMP6_ECHO) else {
        return TCX_NEXT;
    };
    p.key = Nat6Key::new(*src, *dst, l4.sport, 0, PROTO_ICMPV6);
    p.l4 = l4;
    p.pod_ifindex = 0;
    p.tcp_flags = 0;
    CONTINUE
}

/// Gives a leaving packet the flow's address and port.
#[inline(never)]
fn translate_source(ctx: &TcContext, p: &Leaving) -> i32 {
    let r = Rewrite6 {
        addr_off: SRC_OFF,
        old_addr: &p.key.src_ip,
        new_addr: &p.out.0,
        port_off: p.l4.sport_off,
        old_port: p.l4.sport,
        new_port: p.out.1,
    };
    if rewrite6(ctx, &p.l4, &r).is_err() {
        // The node's own echo is never dropped (see `icmp::node_echo`).
        if p.pod_ifindex == 0 {
            return TCX_NEXT;
        }
        note_drop(reason::DROP_MASQ_MALFORMED, p.pod_ifindex);
        return TC_ACT_SHOT;
    }
    count(reason::MASQ_SNAT);
    TCX_NEXT
}

/// What [`flow_out6`] says: translate with the address and port it wrote,
/// leave as it is (a flow opened from outside), or (any other value) drop
/// for that reason.
const TRANSLATE: i64 = -1;
const INBOUND: i64 = -2;
/// As [`TRANSLATE`], for a flow this packet opened.
const TRANSLATE_NEW: i64 = -3;

/// [`flow_out`] for an IPv6 flow, a call of its own (its port choice and the
/// rest of [`snat6`] did not fit one 512-byte stack frame together); the
/// translation goes to `out` (a call returns one register).
#[inline(never)]
fn flow_out6(
    cfg: &MasqConfig,
    key: &Nat6Key,
    pod_ifindex: u32,
    flags: u8,
    out: &mut (Addr6, u16),
) -> i64 {
    let Some(c6) = config6() else {
        return INBOUND;
    };
    let mut new = false;
    match flow_out::<V6>(cfg, key, c6.addr, pod_ifindex, (flags, &mut new)) {
        Ok(Some(t)) => {
            *out = t;
            if new {
                TRANSLATE_NEW
            } else {
                TRANSLATE
            }
        }
        Ok(None) => INBOUND,
        Err(r) => i64::from(r),
    }
}

/// [`node_echo_flow`] for the node's echo request `key`, a call of its own as
/// [`flow_out6`] is: [`TRANSLATE`] (or [`TRANSLATE_NEW`]) with its identifier
/// in `out`, [`INBOUND`] when it leaves untracked (no room in the maps).
#[inline(never)]
fn node_echo6(cfg: &MasqConfig, key: &Nat6Key, out: &mut (Addr6, u16)) -> i64 {
    match node_echo_flow::<V6>(cfg, key) {
        Some((nat_id, new)) => {
            *out = (key.src_ip, nat_id);
            if new {
                TRANSLATE_NEW
            } else {
                TRANSLATE
            }
        }
        None => INBOUND,
    }
}

/// What [`dnat6`] returns for an ICMPv6 error to the masquerade address, for
/// the caller to hand to `icmp6::icmp6_error`: a call of its own, made from the
/// program rather than from here (one frame less deep, for the 512-byte stack).
pub(super) const ICMP6_ERROR: i32 = i32::MIN + 1;

/// uplink ingress, IPv6: replies to masqueraded flows, translated back and
/// delivered into the pod (a node echo's reply, translated back to the node's
/// address, is no endpoint's: it goes on to the kernel, as in IPv4);
/// [`super::NOT_NAT`]: not masquerade traffic.
#[inline(never)]
pub(super) fn dnat6(ctx: &TcContext, cfg: &MasqConfig) -> i32 {
    dnat6_inner(ctx, cfg).unwrap_or(super::NOT_NAT)
}

#[inline(always)]
fn dnat6_inner(ctx: &TcContext, cfg: &MasqConfig) -> Option<i32> {
    let c6 = config6()?;
    let (src, dst, next_hdr) = addrs(ctx)?;
    if dst != c6.addr && (dst != c6.prev_addr || dst == Addr6::default()) {
        return None;
    }
    let (proto, l4_off) = upper_layer(ctx, next_hdr).ok()?;
    if proto == PROTO_ICMPV6
        && matches!(
            ctx.load::<u8>(l4_off),
            Ok(ICMP6_DEST_UNREACH..=ICMP6_PARAM_PROBLEM)
        )
    {
        return Some(ICMP6_ERROR);
    }
    let l4 = l4(ctx, proto, l4_off, ICMP6_ECHO_REPLY).ok()?;
    // Replies carry the NAT port as destination (ICMPv6: the identifier).
    let rk = if proto == PROTO_ICMPV6 {
        Nat6Key::new(src, dst, 0, l4.sport, proto)
    } else {
        Nat6Key::new(src, dst, l4.sport, l4.dport, proto)
    };
    let flags: u8 = if proto == PROTO_TCP {
        crate::l4::tcp_flags(ctx, l4_off)
    } else {
        0
    };
    let rev = flow_back::<V6>(cfg, &rk, flags)?;
    let (port_off, old_port) = match l4.dport_off {
        Some(off) => (off, l4.dport),
        None => (l4.sport_off, l4.sport),
    };
    let r = Rewrite6 {
        addr_off: DST_OFF,
        old_addr: &dst,
        new_addr: &rev.pod_ip,
        port_off,
        old_port,
        new_port: rev.pod_port,
    };
    if rewrite6(ctx, &l4, &r).is_err() {
        note_drop(reason::DROP_MASQ_MALFORMED, 0);
        return Some(TC_ACT_SHOT);
    }
    count(reason::MASQ_DNAT);
    Some(deliver(ctx, IpKey::v6(rev.pod_ip.0)))
}
