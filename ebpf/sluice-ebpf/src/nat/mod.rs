//! Masquerade (SNAT to the node's address) with Sluice's own connection tracking:
//! no `nf_conntrack`, no iptables.
//!
//! - [`snat`] (tc egress of the uplink): IPv4 from a local pod to a destination
//!   outside `nonMasqueradeCIDRs` leaves with the masquerade address and a NAT
//!   port. A new flow takes a port by inserting its reverse entry with
//!   `BPF_NOEXIST`, so two CPUs can never hand out the same port.
//! - [`dnat`] (tc ingress of the uplink): replies to the masquerade address, and
//!   ICMP errors quoting a masqueraded packet, are translated back and delivered
//!   straight into the pod.
//! - [`sweep`] (a perf-event program, once a second): deletes flows idle longer
//!   than their timeout, so the maps never fill up with dead flows.
//!
//! Checksums are updated with the kernel's helpers (see `l4::rewrite`). IPv4
//! fragments: the first one carries the L4 header and is
//! translated like any packet of its flow, and remembered in `sl_nat_frag` (by
//! the fields that identify a datagram's fragments); the later ones carry no
//! ports and are translated from that entry. A later fragment seen before its
//! first is dropped (leaving) or left to the kernel (arriving: it may be the
//! node's own).
//!
//! Modules: `flow` (ports, states, timeouts of the flow table), `frag`
//! (fragments), `icmp` (ICMP errors, the node's own echoes), `icmp6` (ICMPv6
//! errors), `v6` (IPv6), `sweep` (the sweeper), `xdp` (replies in native XDP).
#![expect(
    clippy::needless_borrows_for_generic_args,
    reason = "flow keys go to the map helpers by reference: an IPv6 key is 40 bytes of a 512-byte stack"
)]
mod evict;
mod family;
mod flow;
mod frag;
mod icmp;
mod icmp6;
mod sweep;
mod v6;
mod xdp;

use aya_ebpf::{
    bindings::{BPF_NOEXIST, TC_ACT_SHOT},
    maps::lpm_trie::Key,
    programs::TcContext,
};
use sluice_common::{
    event_kind, masq_flags, nat_flags, nat_state, reason, Addr6, IpKey, MasqConfig, Nat6Key, NatKey,
};

pub use sweep::sweep;
pub use xdp::dnat_xdp;

use self::{
    family::{Entry, Family, FlowKey, Rev, V4, V6},
    flow::{allocate, expired_now, next_state, now, stale_reverse, touch},
    frag::{fragment_target, later_fragment, remember_fragments, rewrite_addr},
    icmp::{icmp_error, node_echo},
};
use crate::{
    counters::count,
    endpoint::deliver_masq_reply as deliver,
    events::note_drop,
    l3::Headers,
    l4::{
        ipv4, is_fragment, l4, rewrite, Rewrite, ETH_LEN, ICMP_DEST_UNREACH, ICMP_ECHO,
        ICMP_ECHO_REPLY, ICMP_TIME_EXCEEDED, PROTO_ICMP, PROTO_SCTP, PROTO_TCP, PROTO_UDP, TCP_ACK,
        TCP_SYN,
    },
    maps::{ENDPOINTS, MASQ, NON_MASQ, NON_MASQ6},
    packet::{ptr_at, Packet},
    TCX_NEXT,
};

#[inline(always)]
pub(super) fn config() -> Option<&'static MasqConfig> {
    MASQ.get(0).filter(|c| c.flags & masq_flags::ENABLED != 0)
}

/// uplink egress: masquerades pod traffic leaving the cluster range.
#[inline(always)]
pub fn snat(ctx: &TcContext) -> i32 {
    // Without IPv6 masquerade (the kernels without the sweeper), IPv4 inline as
    // it always was: a call that makes calls took 5.10's verifier minutes. The
    // verifier never walks the branch the kernel-feature constant rules out,
    // and a frame counts only the stack its walked instructions use.
    if !crate::kernel::masq6() {
        return match config() {
            Some(cfg) => snat4_inline(ctx, cfg),
            None => TCX_NEXT,
        };
    }
    // Each family a call of its own: inlined together their locals overflowed
    // the 512 bytes of stack a chain of calls may use. (The settings are read
    // after the family: held across that read, the pointer took a slot of this
    // frame.)
    let verdict = if crate::l4::is_ipv6(ctx) {
        match config() {
            Some(cfg) => v6::snat6(ctx, cfg),
            None => TCX_NEXT,
        }
    } else {
        snat4(ctx)
    };
    // An eviction to make room for this packet's flow (the sweeper's kernels
    // only: without it the kernel's LRU maps make room) is reported here.
    crate::events::report_eviction();
    verdict
}

#[inline(never)]
fn snat4(ctx: &TcContext) -> i32 {
    match config() {
        Some(cfg) => snat4_inline(ctx, cfg),
        None => TCX_NEXT,
    }
}

#[inline(always)]
fn snat4_inline(ctx: &TcContext, cfg: &MasqConfig) -> i32 {
    let Some(ip) = ipv4(ctx) else {
        return TCX_NEXT;
    };
    // SAFETY: map values are only read.
    let Some(ep) = (unsafe { ENDPOINTS.get(IpKey::v4(ip.src_addr)) }) else {
        if ip.src_addr == cfg.addr && ip.proto == PROTO_ICMP && !is_fragment(&ip) {
            node_echo(ctx, cfg, &ip);
        }
        return TCX_NEXT;
    };
    if NON_MASQ.get(Key::new(32, ip.dst_addr)).is_some() {
        return TCX_NEXT;
    }
    if later_fragment(&ip) {
        return match fragment_target(&ip) {
            // Its first fragment left as it was (an answer from the pod's address).
            Some(a) if a == ip.src_addr => TCX_NEXT,
            Some(a) if rewrite_addr(ctx, 12, ip.src_addr, a).is_ok() => {
                count(reason::MASQ_FRAGMENT);
                TCX_NEXT
            }
            // Never with the pod's address.
            _ => {
                note_drop(reason::DROP_MASQ_FRAGMENT, ep.ifindex);
                TC_ACT_SHOT
            }
        };
    }
    let l4_off = ETH_LEN + usize::from(ip.vihl & 0x0f) * 4;
    // Only echo requests open ICMP flows. Echo replies and errors (destination
    // unreachable, time exceeded, parameter problem: RFC 792) answer what the
    // outside sent to the pod's own address, and leave as they are; any other
    // ICMP request would leak the pod's address, so it is dropped.
    if ip.proto == PROTO_ICMP {
        match ctx.load::<u8>(l4_off) {
            Ok(ICMP_ECHO) => {}
            Ok(ICMP_ECHO_REPLY | 3 | 11 | 12) => {
                remember_fragments(&ip, ip.src_addr);
                return TCX_NEXT;
            }
            _ => {
                note_drop(reason::DROP_MASQ_PROTO, ep.ifindex);
                return TC_ACT_SHOT;
            }
        }
    }
    // SCTP would need a new NAT port, which its CRC32c covers: not masqueraded.
    if ip.proto == PROTO_SCTP {
        note_drop(reason::DROP_MASQ_PROTO, ep.ifindex);
        return TC_ACT_SHOT;
    }
    let l4 = match l4(ctx, ip.proto, l4_off, ICMP_ECHO) {
        Ok(l) => l,
        Err(r) => {
            note_drop(r, ep.ifindex);
            return TC_ACT_SHOT;
        }
    };
    let flags: u8 = if ip.proto == PROTO_TCP {
        crate::l4::tcp_flags(ctx, l4_off)
    } else {
        0
    };
    let key = NatKey::new(ip.src_addr, ip.dst_addr, l4.sport, l4.dport, ip.proto);
    let mut new = false;
    let (nat_addr, nat_port) =
        match flow_out::<V4>(cfg, &key, cfg.addr, ep.ifindex, (flags, &mut new)) {
            Ok(Some(t)) => t,
            // A connection from outside: the pod answers from its own address.
            Ok(None) => {
                remember_fragments(&ip, ip.src_addr);
                return TCX_NEXT;
            }
            Err(r) => {
                note_drop(r, ep.ifindex);
                return TC_ACT_SHOT;
            }
        };
    let r = Rewrite {
        addr_off: ETH_LEN + 12,
        old_addr: ip.src_addr,
        new_addr: nat_addr,
        port_off: l4.sport_off,
        old_port: l4.sport,
        new_port: nat_port,
    };
    if rewrite(ctx, &l4, &r).is_err() {
        note_drop(reason::DROP_MASQ_MALFORMED, ep.ifindex);
        return TC_ACT_SHOT;
    }
    remember_fragments(&ip, nat_addr);
    count(reason::MASQ_SNAT);
    TCX_NEXT
}

/// The translation of a leaving packet of the pod-side flow `key` (TCP flags
/// `flags`), the flow opened with `addr` and a new port if it has none:
/// `Some((address, port))`, or `None` for a connection opened from outside,
/// whose packets leave as they are. `Err`: the drop reason.
#[inline(always)]
fn flow_out<F: Family>(
    cfg: &MasqConfig,
    key: &FlowKey<F>,
    addr: F::Addr,
    pod_ifindex: u32,
    (flags, new): (u8, &mut bool),
) -> Result<Option<(F::Addr, u16)>, u32> {
    // One lookup for a live flow, the common case (every packet after the first).
    let e = match F::fwd().get_ptr_mut(key) {
        Some(e) if !expired_now::<F>(cfg, key, e) => e,
        _ => {
            // A TCP segment other than a SYN opens nothing: its flow expired or
            // was flushed, and with the pod's address it would only leak.
            let syn = flags & (TCP_SYN | TCP_ACK) == TCP_SYN;
            if key.proto == PROTO_TCP && !syn {
                return Err(reason::DROP_MASQ_NO_FLOW);
            }
            // A pod at its share, or a full table, makes room first (IPv6:
            // the caller did, see `Family::ROOM_IN_FLOW`).
            if F::ROOM_IN_FLOW {
                evict::make_room_for::<F>(pod_ifindex)?;
            }
            let state = next_state(0, key.proto, flags, false);
            allocate::<F>(key, cfg, addr, pod_ifindex, state)?;
            if F::ROOM_IN_FLOW {
                evict::note_new::<F>(key, pod_ifindex);
            }
            *new = true;
            F::fwd()
                .get_ptr_mut(key)
                .ok_or(reason::DROP_MASQ_MAP_FULL)?
        }
    };
    // SAFETY: a live map value.
    let (nat_port, nat_addr, eflags) = unsafe { ((*e).nat_port, (*e).nat_addr, (*e).flags) };
    let inbound = eflags & nat_flags::INBOUND != 0;
    touch(e, key.proto, flags, inbound);
    Ok((!inbound).then_some((nat_addr, nat_port)))
}

/// Where a reply with the reverse key `rk` (TCP flags `flags`) goes: the pod's
/// address and port, with its flow refreshed. `None`: no live flow.
#[inline(always)]
fn flow_back<F: Family>(cfg: &MasqConfig, rk: &FlowKey<F>, flags: u8) -> Option<Rev<F>> {
    // SAFETY: map values are only read.
    let rev = *unsafe { F::rev().get(rk) }?;
    if stale_reverse::<F>(cfg, rk) {
        // Past its timeout: the kernel answers as it would after a sweep.
        return None;
    }
    let fk = FlowKey::<F>::new(rev.pod_ip, rk.src_ip, rev.pod_port, rk.src_port, rk.proto);
    if let Some(e) = F::fwd().get_ptr_mut(&fk) {
        touch(e, rk.proto, flags, true);
    }
    Some(rev)
}

/// A connection from outside straight to a local pod (routed pod addresses):
/// tracked as an inbound flow, so that [`snat`] lets the pod's replies leave
/// from the pod's own address, as nf_conntrack does for MASQUERADE. A TCP SYN or
/// any UDP datagram opens one; ICMP needs none (only echo requests are
/// masqueraded). Sources in `nonMasqueradeCIDRs` are skipped: replies to them are
/// never translated anyway. IPv6 packets with extension headers open none.
#[inline(always)]
pub fn note_inbound(p: &impl Packet, h: &Headers, pod_ifindex: u32) {
    let Some(_cfg) = config() else {
        return;
    };
    if let Some(v4) = h.v4_fields() {
        if v4.fragment() || NON_MASQ.get(Key::new(32, v4.src)).is_some() {
            return;
        }
        if let Some((sport, dport)) = opening_ports(p, v4.proto, v4.l4_off()) {
            let key = NatKey::new(v4.dst, v4.src, dport, sport, v4.proto);
            open_inbound::<V4>(&key, [0; 4], pod_ifindex);
        }
    } else if let Some((src, dst, proto)) = h.v6_fields().filter(|_| crate::kernel::masq6()) {
        if v6::config6().is_none() || NON_MASQ6.get(Key::new(128, src)).is_some() {
            return;
        }
        if let Some((sport, dport)) = opening_ports(p, proto, ETH_LEN + 40) {
            let key = Nat6Key::new(Addr6(dst), Addr6(src), dport, sport, proto);
            open_inbound::<V6>(&key, Addr6::default(), pod_ifindex);
        }
    }
    if !crate::kernel::lazy_expiry() {
        crate::events::report_eviction();
    }
}

/// The ports of a packet that opens an inbound flow: a TCP SYN or a UDP
/// datagram, its L4 header at `l4_off`.
#[inline(always)]
fn opening_ports(p: &impl Packet, proto: u8, l4_off: usize) -> Option<(u16, u16)> {
    if proto != PROTO_TCP && proto != PROTO_UDP {
        return None;
    }
    if proto == PROTO_TCP {
        let f = ptr_at::<u8>(p, l4_off + 13)?;
        // SAFETY: bounds checked by ptr_at.
        if unsafe { *f } & (TCP_SYN | TCP_ACK) != TCP_SYN {
            return None;
        }
    }
    let ports = ptr_at::<[u16; 2]>(p, l4_off)?;
    // SAFETY: bounds checked by ptr_at.
    let [sport, dport] = unsafe { *ports };
    Some((sport, dport))
}

/// Records the inbound flow `key` (pod-side tuple) unless it exists.
#[inline(always)]
fn open_inbound<F: Family>(key: &FlowKey<F>, none: F::Addr, pod_ifindex: u32) {
    if F::fwd().get_ptr(key).is_some() {
        return;
    }
    let t = now();
    let e = Entry::<F> {
        nat_port: key.src_port,
        state: if key.proto == PROTO_TCP {
            nat_state::TCP_SYN
        } else {
            nat_state::UDP
        },
        flags: nat_flags::INBOUND,
        pod_ifindex,
        last_seen_ns: t,
        created_ns: t,
        nat_addr: none,
        _pad: F::PAD,
    };
    // A full table makes room (see `evict`), as for a new flow out; the
    // pod's share does not apply: the connection is not its doing.
    if evict::make_room_for::<F>(0).is_ok()
        && F::fwd().insert(key, &e, u64::from(BPF_NOEXIST)).is_ok()
    {
        evict::note_new::<F>(key, pod_ifindex);
        count(reason::MASQ_INBOUND_FLOW);
        // Described as the outside sees it: client -> pod.
        let outside = FlowKey::<F>::new(
            key.dst_ip,
            key.src_ip,
            key.dst_port,
            key.src_port,
            key.proto,
        );
        F::event(event_kind::NAT_INBOUND, &outside, none, 0, pod_ifindex);
    }
}

/// uplink ingress: translates replies (and ICMP errors about) masqueraded flows
/// back and delivers them into the pod. `None`: not masquerade traffic.
#[inline(always)]
pub fn dnat(ctx: &TcContext) -> Option<i32> {
    let cfg = config()?;
    // As in [`snat`]: IPv4 inline where there is no IPv6 masquerade, else a
    // call per family; a call returns one register, so the verdict comes back
    // as an i32, [`NOT_NAT`] for `None`.
    if !crate::kernel::masq6() {
        return dnat4_inner(ctx, cfg);
    }
    let v = if crate::l4::is_ipv6(ctx) {
        match v6::dnat6(ctx, cfg) {
            v6::ICMP6_ERROR => icmp6::icmp6_error(ctx),
            v => v,
        }
    } else {
        dnat4(ctx, cfg)
    };
    (v != NOT_NAT).then_some(v)
}

/// What [`dnat4`] and `v6::dnat6` return for a packet that is not theirs.
pub(super) const NOT_NAT: i32 = i32::MIN;

#[inline(never)]
fn dnat4(ctx: &TcContext, cfg: &MasqConfig) -> i32 {
    dnat4_inner(ctx, cfg).unwrap_or(NOT_NAT)
}

#[inline(always)]
fn dnat4_inner(ctx: &TcContext, cfg: &MasqConfig) -> Option<i32> {
    let ip = ipv4(ctx)?;
    if !is_nat_addr(cfg, ip.dst_addr) {
        return None;
    }
    if later_fragment(&ip) {
        // Not seen the first: maybe the node's own datagram; the kernel's.
        let pod = fragment_target(&ip)?;
        if rewrite_addr(ctx, 16, ip.dst_addr, pod).is_err() {
            note_drop(reason::DROP_MASQ_MALFORMED, 0);
            return Some(TC_ACT_SHOT);
        }
        count(reason::MASQ_FRAGMENT);
        return Some(deliver(ctx, IpKey::v4(pod)));
    }
    let l4_off = ETH_LEN + usize::from(ip.vihl & 0x0f) * 4;
    if ip.proto == PROTO_ICMP {
        let t: u8 = ctx.load(l4_off).ok()?;
        if t == ICMP_DEST_UNREACH || t == ICMP_TIME_EXCEEDED {
            return icmp_error(ctx, cfg, l4_off);
        }
    }
    let l4 = l4(ctx, ip.proto, l4_off, ICMP_ECHO_REPLY).ok()?;
    // Replies carry the NAT port as destination (ICMP: the identifier).
    let rk = if ip.proto == PROTO_ICMP {
        NatKey::new(ip.src_addr, ip.dst_addr, 0, l4.sport, ip.proto)
    } else {
        NatKey::new(ip.src_addr, ip.dst_addr, l4.sport, l4.dport, ip.proto)
    };
    let flags: u8 = if ip.proto == PROTO_TCP {
        crate::l4::tcp_flags(ctx, l4_off)
    } else {
        0
    };
    let rev = flow_back::<V4>(cfg, &rk, flags)?;
    let (port_off, old_port) = match l4.dport_off {
        Some(off) => (off, l4.dport),
        None => (l4.sport_off, l4.sport),
    };
    let r = Rewrite {
        addr_off: ETH_LEN + 16,
        old_addr: ip.dst_addr,
        new_addr: rev.pod_ip,
        port_off,
        old_port,
        new_port: rev.pod_port,
    };
    if rewrite(ctx, &l4, &r).is_err() {
        note_drop(reason::DROP_MASQ_MALFORMED, 0);
        return Some(TC_ACT_SHOT);
    }
    remember_fragments(&ip, rev.pod_ip);
    count(reason::MASQ_DNAT);
    Some(deliver(ctx, IpKey::v4(rev.pod_ip)))
}

/// The masquerade address, or the one before (its flows still get replies).
#[inline(always)]
pub(super) fn is_nat_addr(cfg: &MasqConfig, a: [u8; 4]) -> bool {
    a == cfg.addr || (a == cfg.prev_addr && a != [0; 4])
}
