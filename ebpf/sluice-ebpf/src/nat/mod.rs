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
//! (fragments), `icmp` (ICMP errors, the node's own echoes), `sweep` (the
//! sweeper), `xdp` (replies in native XDP).
mod flow;
mod frag;
mod icmp;
mod sweep;
mod xdp;

use aya_ebpf::{
    bindings::{BPF_NOEXIST, TC_ACT_SHOT},
    maps::lpm_trie::Key,
    programs::TcContext,
};
use sluice_common::{
    event_kind, masq_flags, nat_flags, nat_state, reason, IpKey, MasqConfig, NatEntry, NatKey,
};

pub use sweep::sweep;
pub use xdp::dnat_xdp;

use self::{
    flow::{allocate, expired_now, next_state, now, stale_reverse, touch},
    frag::{fragment_target, later_fragment, remember_fragments, rewrite_addr},
    icmp::{icmp_error, node_echo},
};
use crate::{
    counters::count,
    endpoint::deliver_translated as deliver,
    events::{self, note_drop},
    l3::Headers,
    l4::{
        ipv4, is_fragment, l4, rewrite, Rewrite, ETH_LEN, ICMP_DEST_UNREACH, ICMP_ECHO,
        ICMP_ECHO_REPLY, ICMP_TIME_EXCEEDED, PROTO_ICMP, PROTO_SCTP, PROTO_TCP, PROTO_UDP, TCP_ACK,
        TCP_SYN,
    },
    maps::{ENDPOINTS, MASQ, NAT_FWD, NAT_REV, NON_MASQ},
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
    let Some(cfg) = config() else {
        return TCX_NEXT;
    };
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
        ctx.load(l4_off + 13).unwrap_or(0)
    } else {
        0
    };
    let key = NatKey::new(ip.src_addr, ip.dst_addr, l4.sport, l4.dport, ip.proto);
    let live = match NAT_FWD.get_ptr(key) {
        Some(e) => !expired_now(cfg, &key, e),
        None => false,
    };
    if !live {
        // A TCP segment other than a SYN opens nothing: its flow expired or was
        // flushed, and with the pod's address it would only leak.
        let syn = flags & (TCP_SYN | TCP_ACK) == TCP_SYN;
        if ip.proto == PROTO_TCP && !syn {
            note_drop(reason::DROP_MASQ_NO_FLOW, ep.ifindex);
            return TC_ACT_SHOT;
        }
        let state = next_state(0, ip.proto, flags, false);
        if let Err(r) = allocate(&key, cfg, ep.ifindex, state) {
            note_drop(r, ep.ifindex);
            return TC_ACT_SHOT;
        }
    }
    let Some(e) = NAT_FWD.get_ptr_mut(key) else {
        note_drop(reason::DROP_MASQ_MAP_FULL, ep.ifindex);
        return TC_ACT_SHOT;
    };
    // SAFETY: a live map value.
    let (nat_port, nat_addr, eflags) = unsafe { ((*e).nat_port, (*e).nat_addr, (*e).flags) };
    // A connection from outside: the pod answers from its own address.
    if eflags & nat_flags::INBOUND != 0 {
        touch(e, ip.proto, flags, true);
        remember_fragments(&ip, ip.src_addr);
        return TCX_NEXT;
    }
    touch(e, ip.proto, flags, false);
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

/// A connection from outside straight to a local pod (routed pod addresses):
/// tracked as an inbound flow, so that [`snat`] lets the pod's replies leave
/// from the pod's own address, as nf_conntrack does for MASQUERADE. A TCP SYN or
/// any UDP datagram opens one; ICMP needs none (only echo requests are
/// masqueraded). Sources in `nonMasqueradeCIDRs` are skipped: replies to them are
/// never translated anyway.
#[inline(always)]
pub fn note_inbound(p: &impl Packet, h: &Headers, pod_ifindex: u32) {
    let Some(_cfg) = config() else {
        return;
    };
    let Some(v4) = h.v4_fields() else {
        return;
    };
    let (src, dst, proto) = (v4.src, v4.dst, v4.proto);
    if (proto != PROTO_TCP && proto != PROTO_UDP) || v4.fragment() {
        return;
    }
    let l4_off = v4.l4_off();
    if proto == PROTO_TCP {
        let Some(f) = ptr_at::<u8>(p, l4_off + 13) else {
            return;
        };
        // SAFETY: bounds checked by ptr_at.
        if unsafe { *f } & (TCP_SYN | TCP_ACK) != TCP_SYN {
            return;
        }
    }
    if NON_MASQ.get(Key::new(32, src)).is_some() {
        return;
    }
    let Some(ports) = ptr_at::<[u16; 2]>(p, l4_off) else {
        return;
    };
    // SAFETY: bounds checked by ptr_at.
    let [sport, dport] = unsafe { *ports };
    let key = NatKey::new(dst, src, dport, sport, proto);
    if NAT_FWD.get_ptr(key).is_some() {
        return;
    }
    let t = now();
    let e = NatEntry {
        nat_port: dport,
        state: if proto == PROTO_TCP {
            nat_state::TCP_SYN
        } else {
            nat_state::UDP
        },
        flags: nat_flags::INBOUND,
        pod_ifindex,
        last_seen_ns: t,
        created_ns: t,
        nat_addr: [0; 4],
        _pad: 0,
    };
    if NAT_FWD.insert(key, e, u64::from(BPF_NOEXIST)).is_ok() {
        count(reason::MASQ_INBOUND_FLOW);
        // Described as the outside sees it: client -> pod.
        let outside = NatKey::new(src, dst, sport, dport, proto);
        events::flow(event_kind::NAT_INBOUND, &outside, [0; 4], 0, pod_ifindex);
    }
}

/// uplink ingress: translates replies (and ICMP errors about) masqueraded flows
/// back and delivers them into the pod. `None`: not masquerade traffic.
#[inline(always)]
pub fn dnat(ctx: &TcContext) -> Option<i32> {
    let cfg = config()?;
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
        return Some(deliver(ctx, pod));
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
    // SAFETY: map values are only read.
    let rev = *unsafe { NAT_REV.get(rk) }?;
    if stale_reverse(cfg, &rk) {
        // Past its timeout: the kernel answers as it would after a sweep.
        return None;
    }
    let fk = NatKey::new(rev.pod_ip, ip.src_addr, rev.pod_port, rk.src_port, ip.proto);
    if let Some(e) = NAT_FWD.get_ptr_mut(fk) {
        let flags: u8 = if ip.proto == PROTO_TCP {
            ctx.load(l4_off + 13).unwrap_or(0)
        } else {
            0
        };
        touch(e, ip.proto, flags, true);
    }
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
    Some(deliver(ctx, rev.pod_ip))
}

/// The masquerade address, or the one before (its flows still get replies).
#[inline(always)]
pub(super) fn is_nat_addr(cfg: &MasqConfig, a: [u8; 4]) -> bool {
    a == cfg.addr || (a == cfg.prev_addr && a != [0; 4])
}
