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
//! Checksums are updated with the kernel's helpers (`bpf_l3_csum_replace`,
//! `bpf_l4_csum_replace` with `BPF_F_PSEUDO_HDR`), which handle partial checksum
//! offload. IPv4 fragments: the first one carries the L4 header and is
//! translated like any packet of its flow, and remembered in `sl_nat_frag` (by
//! the fields that identify a datagram's fragments); the later ones carry no
//! ports and are translated from that entry. A later fragment seen before its
//! first is dropped (leaving) or left to the kernel (arriving: it may be the
//! node's own).
use core::ffi::c_void;

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, BPF_NOEXIST, TC_ACT_SHOT},
    helpers::{bpf_for_each_map_elem, bpf_ktime_get_coarse_ns, bpf_ktime_get_ns},
    maps::lpm_trie::Key,
    programs::{TcContext, XdpContext},
};
use network_types::ip::Ipv4Hdr;
use sluice_common::{
    event_kind, masq_flags, nat_flags, nat_state, reason, FragEntry, FragKey, IpKey, MasqConfig,
    NatEntry, NatKey, NatRev, FRAG_TIMEOUT_NS,
};

use crate::{
    counters::count,
    endpoint,
    events::{self, note_drop},
    l3::{Headers, L3},
    maps::{ENDPOINTS, MASQ, NAT_FRAG, NAT_FWD, NAT_REV, NON_MASQ},
    packet::{ptr_at, Packet},
    TCX_NEXT,
};

pub(crate) const ETH_LEN: usize = 14;
const ETH_P_IP_BE: u16 = 0x0800u16.to_be();
const PROTO_ICMP: u8 = 1;
pub(crate) const PROTO_TCP: u8 = 6;
pub(crate) const PROTO_UDP: u8 = 17;
/// SCTP: its CRC32c covers the ports but no pseudo header (RFC 4960 6.8), so
/// addresses change without a checksum update; ports must not change.
pub(crate) const PROTO_SCTP: u8 = 132;
const ICMP_ECHO_REPLY: u8 = 0;
const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_ECHO: u8 = 8;
const ICMP_TIME_EXCEEDED: u8 = 11;
const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;
const EEXIST: i32 = 17;
/// Ports tried for a new flow before giving up.
const PORT_TRIES: u32 = 32;
/// `last_seen_ns` is refreshed at most this often (fewer writes to a shared line).
const REFRESH_NS: u64 = 1_000_000_000;
/// IPv4 header checksum offset.
const IP_CSUM: usize = ETH_LEN + 10;

/// CLOCK_MONOTONIC: the coarse clock where the kernel has it (cheaper), else
/// the fine one (ahead of the coarse one by less than a tick).
#[inline(always)]
pub(crate) fn now() -> u64 {
    if crate::kernel::ktime_coarse() {
        // SAFETY: plain helper call.
        unsafe { bpf_ktime_get_coarse_ns() }
    } else {
        // SAFETY: plain helper call.
        unsafe { bpf_ktime_get_ns() }
    }
}

/// How long a flow in `state` may stay idle (seconds of the config, in ns).
#[inline(always)]
fn timeout_ns(cfg: &MasqConfig, state: u8) -> u64 {
    // All five loaded first: matching on the state to pick a field made LLVM
    // compute the field offset from the state, which the verifier cannot bound.
    let (syn, est, closing, udp, icmp) = (
        cfg.tcp_syn_secs,
        cfg.tcp_established_secs,
        cfg.tcp_closing_secs,
        cfg.udp_secs,
        cfg.icmp_secs,
    );
    let secs = match state {
        nat_state::TCP_SYN => syn,
        nat_state::TCP_ESTABLISHED => est,
        nat_state::TCP_CLOSING => closing,
        nat_state::ICMP => icmp,
        _ => udp,
    };
    u64::from(secs) * 1_000_000_000
}

/// Whether a flow idle since `last_seen_ns` in `state` is past its timeout.
#[inline(always)]
fn is_expired(cfg: &MasqConfig, state: u8, last_seen_ns: u64, now: u64) -> bool {
    now.saturating_sub(last_seen_ns) > timeout_ns(cfg, state)
}

/// On a kernel without the sweeper, whether the flow `k` (value `e`) is past
/// its timeout; if so it is removed (both entries), as the sweeper would have.
/// The check is inline; the work a BPF-to-BPF call of its own (its locals stay
/// off the caller's stack frame, and kernels with the sweeper never call it).
#[inline(always)]
fn expired_now(cfg: &MasqConfig, k: &NatKey, e: *const NatEntry) -> bool {
    crate::kernel::lazy_expiry() && expire_if_idle(cfg, k, e) != 0
}

#[inline(never)]
fn expire_if_idle(cfg: &MasqConfig, k: &NatKey, e: *const NatEntry) -> u32 {
    // SAFETY: a live map value; fields read one by one.
    let (state, last_seen, flags, nat_addr, nat_port) = unsafe {
        (
            (*e).state,
            (*e).last_seen_ns,
            (*e).flags,
            (*e).nat_addr,
            (*e).nat_port,
        )
    };
    if !is_expired(cfg, state, last_seen, now()) {
        return 0;
    }
    if flags & nat_flags::INBOUND == 0 {
        let _ = NAT_REV.remove(rev_key(k, nat_addr, nat_port));
    }
    let _ = NAT_FWD.remove(k);
    count(reason::NAT_EXPIRED);
    1
}

/// On a kernel without the sweeper, a reverse entry `rk` whose flow is gone or
/// past its timeout is removed (with the flow); `true` then.
#[inline(always)]
fn stale_reverse(cfg: &MasqConfig, rk: &NatKey) -> bool {
    crate::kernel::lazy_expiry() && free_if_stale(cfg, rk) != 0
}

// Inline: as a call of its own it made 5.10's verifier crash (a NULL
// dereference in __mark_chain_precision backtracking through nested calls).
#[inline(always)]
fn free_if_stale(cfg: &MasqConfig, rk: &NatKey) -> u32 {
    // SAFETY: map values are only read.
    let Some(rev) = (unsafe { NAT_REV.get(rk) }) else {
        return 0;
    };
    let fk = NatKey::new(rev.pod_ip, rk.src_ip, rev.pod_port, rk.src_port, rk.proto);
    match NAT_FWD.get_ptr(fk) {
        Some(e) => expire_if_idle(cfg, &fk, e),
        None => {
            let _ = NAT_REV.remove(rk);
            1
        }
    }
}

#[inline(always)]
fn config() -> Option<&'static MasqConfig> {
    MASQ.get(0).filter(|c| c.flags & masq_flags::ENABLED != 0)
}

/// Where the ports and the L4 checksum of a packet are.
pub(crate) struct L4 {
    /// Source port (ICMP echo: identifier).
    pub sport_off: usize,
    pub sport: u16,
    /// Destination port (ICMP echo: none, 0).
    pub dport_off: Option<usize>,
    pub dport: u16,
    csum_off: usize,
    /// The checksum covers a pseudo header (TCP, UDP).
    pseudo: bool,
    /// UDP without a checksum (0): leave it alone.
    no_csum: bool,
    /// `BPF_F_MARK_MANGLED_0` for UDP: a checksum that becomes 0 is sent as 0xffff
    /// (0 means "no checksum").
    mangled: u64,
}

/// One address and one port to replace in a packet.
pub(crate) struct Rewrite {
    pub addr_off: usize,
    pub old_addr: [u8; 4],
    pub new_addr: [u8; 4],
    pub port_off: usize,
    pub old_port: u16,
    pub new_port: u16,
}

/// The IPv4 header of a frame, if it is IPv4.
#[inline(always)]
pub(crate) fn ipv4(ctx: &TcContext) -> Option<Ipv4Hdr> {
    if ctx.load::<u16>(12).ok()? != ETH_P_IP_BE {
        return None;
    }
    ctx.load::<Ipv4Hdr>(ETH_LEN).ok()
}

#[inline(always)]
pub(crate) fn is_fragment(ip: &Ipv4Hdr) -> bool {
    u16::from_be_bytes(ip.frags) & 0x3fff != 0
}

/// A later fragment: no L4 header.
#[inline(always)]
fn later_fragment(ip: &Ipv4Hdr) -> bool {
    u16::from_be_bytes(ip.frags) & 0x1fff != 0
}

#[inline(always)]
fn frag_key(ip: &Ipv4Hdr) -> FragKey {
    FragKey {
        src_ip: ip.src_addr,
        dst_ip: ip.dst_addr,
        id: u16::from_ne_bytes(ip.id),
        proto: ip.proto,
        _pad: 0,
    }
}

/// After the first fragment of a datagram (more fragments follow): the later
/// ones get `addr` too. Keyed by the fields as the first fragment arrived.
#[inline(always)]
fn remember_fragments(ip: &Ipv4Hdr, addr: [u8; 4]) {
    if u16::from_be_bytes(ip.frags) & 0x2000 == 0 {
        return;
    }
    let e = FragEntry {
        addr,
        _pad: 0,
        created_ns: now(),
    };
    let _ = NAT_FRAG.insert(frag_key(ip), e, 0);
}

/// The address a later fragment's first fragment was translated to.
#[inline(always)]
fn fragment_target(ip: &Ipv4Hdr) -> Option<[u8; 4]> {
    // SAFETY: the map value is only read.
    let e = unsafe { NAT_FRAG.get(frag_key(ip)) }?;
    (now().saturating_sub(e.created_ns) < FRAG_TIMEOUT_NS).then_some(e.addr)
}

/// Replaces the IPv4 address at `off` (source 12, destination 16 past the
/// Ethernet header) of a later fragment: only the IP header checksum covers it.
#[inline(always)]
fn rewrite_addr(ctx: &TcContext, off: usize, old: [u8; 4], new: [u8; 4]) -> Result<(), ()> {
    let (oa, na) = (
        u64::from(u32::from_ne_bytes(old)),
        u64::from(u32::from_ne_bytes(new)),
    );
    ctx.l3_csum_replace(IP_CSUM, oa, na, 4).map_err(|_| ())?;
    ctx.store(ETH_LEN + off, &new, 0).map_err(|_| ())
}

/// TCP/UDP ports, or an ICMP echo request/reply identifier, at `l4`.
#[inline(always)]
pub(crate) fn l4(ctx: &TcContext, proto: u8, l4: usize, echo_type: u8) -> Result<L4, u32> {
    let bad = |_| reason::DROP_MASQ_MALFORMED;
    match proto {
        PROTO_TCP | PROTO_UDP => {
            let csum_off = if proto == PROTO_TCP { l4 + 16 } else { l4 + 6 };
            let csum: u16 = ctx.load(csum_off).map_err(bad)?;
            Ok(L4 {
                sport_off: l4,
                sport: ctx.load(l4).map_err(bad)?,
                dport_off: Some(l4 + 2),
                dport: ctx.load(l4 + 2).map_err(bad)?,
                csum_off,
                pseudo: true,
                no_csum: proto == PROTO_UDP && csum == 0,
                mangled: if proto == PROTO_UDP {
                    u64::from(BPF_F_MARK_MANGLED_0)
                } else {
                    0
                },
            })
        }
        PROTO_ICMP => {
            let t: u8 = ctx.load(l4).map_err(bad)?;
            if t != echo_type {
                return Err(reason::DROP_MASQ_PROTO);
            }
            Ok(L4 {
                sport_off: l4 + 4,
                sport: ctx.load(l4 + 4).map_err(bad)?,
                dport_off: None,
                dport: 0,
                csum_off: l4 + 2,
                pseudo: false,
                no_csum: false,
                mangled: 0,
            })
        }
        PROTO_SCTP => Ok(L4 {
            sport_off: l4,
            sport: ctx.load(l4).map_err(bad)?,
            dport_off: Some(l4 + 2),
            dport: ctx.load(l4 + 2).map_err(bad)?,
            csum_off: l4 + 8,
            pseudo: false,
            no_csum: true,
            mangled: 0,
        }),
        _ => Err(reason::DROP_MASQ_PROTO),
    }
}

/// The reverse key of a forward flow `k` that left with `addr`:`nat_port`.
#[inline(always)]
fn rev_key(k: &NatKey, addr: [u8; 4], nat_port: u16) -> NatKey {
    k.reverse(addr, nat_port)
}

#[inline(always)]
fn flow_hash(k: &NatKey) -> u32 {
    let a = u32::from_ne_bytes(k.src_ip);
    let b = u32::from_ne_bytes(k.dst_ip);
    let c = (u32::from(k.src_port) << 16) | u32::from(k.dst_port);
    let mut h = a ^ b.rotate_left(11) ^ c.rotate_left(22) ^ u32::from(k.proto);
    h ^= h >> 16;
    h = h.wrapping_mul(0x7feb_352d);
    h ^= h >> 15;
    h.wrapping_mul(0x846c_a68b)
}

/// Takes a NAT port for a new flow: reverse entry first (BPF_NOEXIST makes the
/// port ours), then the forward entry.
#[inline(always)]
fn allocate(k: &NatKey, cfg: &MasqConfig, pod_ifindex: u32, state: u8) -> Result<(), u32> {
    let n1 = u32::from(cfg.port_max.saturating_sub(cfg.port_min)) + 1;
    let n2 = if cfg.port2_min <= cfg.port2_max {
        u32::from(cfg.port2_max - cfg.port2_min) + 1
    } else {
        0
    };
    let range = n1 + n2;
    let h = flow_hash(k);
    let rev = NatRev {
        pod_ip: k.src_ip,
        pod_port: k.src_port,
        _pad: 0,
    };
    let mut i = 0;
    while i < PORT_TRIES {
        let nat_port = candidate_port(cfg, h.wrapping_add(i) % range, n1);
        if let Some(r) = claim(k, cfg, nat_port, rev, pod_ifindex, state) {
            return r;
        }
        i += 1;
    }
    // Without the sweeper a port may be held by a dead flow until a packet
    // meets it: the first candidate's holder is checked, once, after the loop.
    // (Checked inside the loop, 5.10's verifier walked every iteration apart
    // and gave up at a million instructions.)
    let nat_port = candidate_port(cfg, h % range, n1);
    if stale_reverse(cfg, &rev_key(k, cfg.addr, nat_port)) {
        if let Some(r) = claim(k, cfg, nat_port, rev, pod_ifindex, state) {
            return r;
        }
    }
    Err(reason::DROP_MASQ_NO_PORT)
}

/// The port at index `idx` over both ranges (the first, then the second), in
/// network byte order.
#[inline(always)]
fn candidate_port(cfg: &MasqConfig, idx: u32, n1: u32) -> u16 {
    let port = if idx < n1 {
        cfg.port_min.wrapping_add(idx as u16)
    } else {
        cfg.port2_min.wrapping_add((idx - n1) as u16)
    };
    port.to_be()
}

/// Takes `nat_port` for the flow `k` if no flow holds it: `None` when one does,
/// else the outcome of creating the flow.
#[inline(always)]
fn claim(
    k: &NatKey,
    cfg: &MasqConfig,
    nat_port: u16,
    rev: NatRev,
    pod_ifindex: u32,
    state: u8,
) -> Option<Result<(), u32>> {
    let rk = rev_key(k, cfg.addr, nat_port);
    match NAT_REV.insert(rk, rev, u64::from(BPF_NOEXIST)) {
        Ok(()) => {
            let t = now();
            let e = NatEntry {
                nat_port,
                state,
                flags: if pod_ifindex == 0 { nat_flags::NODE } else { 0 },
                pod_ifindex,
                last_seen_ns: t,
                created_ns: t,
                nat_addr: cfg.addr,
                _pad: 0,
            };
            Some(match NAT_FWD.insert(k, e, u64::from(BPF_NOEXIST)) {
                Ok(()) => {
                    count(reason::MASQ_NEW_FLOW);
                    events::flow(event_kind::NAT_NEW, k, cfg.addr, nat_port, pod_ifindex);
                    Ok(())
                }
                // Another CPU created the same flow meanwhile: use its port.
                Err(e) if e == -EEXIST => {
                    let _ = NAT_REV.remove(rk);
                    Ok(())
                }
                Err(_) => {
                    let _ = NAT_REV.remove(rk);
                    Err(reason::DROP_MASQ_MAP_FULL)
                }
            })
        }
        Err(e) if e == -EEXIST => None,
        Err(_) => Some(Err(reason::DROP_MASQ_MAP_FULL)),
    }
}

/// The TCP state after a packet with `flags`; `reply` for the return direction.
#[inline(always)]
fn next_state(cur: u8, proto: u8, flags: u8, reply: bool) -> u8 {
    match proto {
        PROTO_TCP if flags & (TCP_FIN | TCP_RST) != 0 => nat_state::TCP_CLOSING,
        PROTO_TCP if cur == nat_state::TCP_SYN && reply => nat_state::TCP_ESTABLISHED,
        // A SYN from the pod opens a connection: on a new flow, or on a flow the
        // previous connection of the same 4-tuple left closing.
        PROTO_TCP
            if !reply
                && (cur == 0 || cur == nat_state::TCP_CLOSING)
                && flags & TCP_SYN != 0
                && flags & TCP_ACK == 0 =>
        {
            nat_state::TCP_SYN
        }
        // A flow first seen mid-stream (after a restart or expiry) is established.
        PROTO_TCP if cur == 0 => nat_state::TCP_ESTABLISHED,
        PROTO_TCP => cur,
        PROTO_UDP => nat_state::UDP,
        _ => nat_state::ICMP,
    }
}

/// Refreshes a flow's state and timestamp.
#[inline(always)]
fn touch(e: *mut NatEntry, proto: u8, flags: u8, reply: bool) {
    let t = now();
    // SAFETY: a live map value; concurrent writers race benignly (last writer
    // wins on a timestamp and a state that only moves forward in practice).
    unsafe {
        let s = next_state((*e).state, proto, flags, reply);
        if s != (*e).state {
            (*e).state = s;
        }
        if t.saturating_sub((*e).last_seen_ns) > REFRESH_NS {
            (*e).last_seen_ns = t;
        }
    }
}

/// Rewrites an address and a port with their checksums.
#[inline(always)]
pub(crate) fn rewrite(ctx: &TcContext, l4: &L4, r: &Rewrite) -> Result<(), ()> {
    let (oa, na) = (
        u64::from(u32::from_ne_bytes(r.old_addr)),
        u64::from(u32::from_ne_bytes(r.new_addr)),
    );
    let (op, np) = (u64::from(r.old_port), u64::from(r.new_port));
    if !l4.no_csum {
        if l4.pseudo {
            ctx.l4_csum_replace(
                l4.csum_off,
                oa,
                na,
                u64::from(BPF_F_PSEUDO_HDR) | l4.mangled | 4,
            )
            .map_err(|_| ())?;
        }
        ctx.l4_csum_replace(l4.csum_off, op, np, l4.mangled | 2)
            .map_err(|_| ())?;
    }
    ctx.l3_csum_replace(IP_CSUM, oa, na, 4).map_err(|_| ())?;
    ctx.store(r.addr_off, &r.new_addr, 0).map_err(|_| ())?;
    ctx.store(r.port_off, &r.new_port, 0).map_err(|_| ())
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
    let key = NatKey {
        src_ip: ip.src_addr,
        dst_ip: ip.dst_addr,
        src_port: l4.sport,
        dst_port: l4.dport,
        proto: ip.proto,
        _pad: [0; 3],
    };
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

/// The node's own ICMP echo requests. Echo identifiers are not split like ports
/// (ping sockets hand out all 65535), so a node ping could use a pod flow's NAT
/// identifier to the same destination and its reply would be delivered into the
/// pod. So node echoes are flows too (`pod_ifindex` 0): a free identifier is
/// reserved as it is, one a pod flow holds is translated like a pod's. Node
/// traffic is never dropped here: without room in the maps it leaves untracked.
#[inline(always)]
fn node_echo(ctx: &TcContext, cfg: &MasqConfig, ip: &Ipv4Hdr) {
    let l4_off = ETH_LEN + usize::from(ip.vihl & 0x0f) * 4;
    let Ok(l4) = l4(ctx, PROTO_ICMP, l4_off, ICMP_ECHO) else {
        return;
    };
    let key = NatKey {
        src_ip: ip.src_addr,
        dst_ip: ip.dst_addr,
        src_port: l4.sport,
        dst_port: 0,
        proto: PROTO_ICMP,
        _pad: [0; 3],
    };
    if NAT_FWD.get_ptr(key).is_none() && reserve(&key, cfg).is_err() {
        let _ = allocate(&key, cfg, 0, nat_state::ICMP);
    }
    let Some(e) = NAT_FWD.get_ptr_mut(key) else {
        return;
    };
    touch(e, PROTO_ICMP, 0, false);
    // SAFETY: a live map value.
    let nat_id = unsafe { (*e).nat_port };
    if nat_id != l4.sport {
        let r = Rewrite {
            addr_off: ETH_LEN + 12,
            old_addr: ip.src_addr,
            new_addr: ip.src_addr,
            port_off: l4.sport_off,
            old_port: l4.sport,
            new_port: nat_id,
        };
        if rewrite(ctx, &l4, &r).is_ok() {
            count(reason::MASQ_SNAT);
        }
    }
}

/// Takes a node echo's own identifier as its NAT identifier, if no flow holds it.
#[inline(always)]
fn reserve(k: &NatKey, cfg: &MasqConfig) -> Result<(), ()> {
    let rk = rev_key(k, cfg.addr, k.src_port);
    let rev = NatRev {
        pod_ip: k.src_ip,
        pod_port: k.src_port,
        _pad: 0,
    };
    NAT_REV
        .insert(rk, rev, u64::from(BPF_NOEXIST))
        .map_err(|_| ())?;
    let t = now();
    let e = NatEntry {
        nat_port: k.src_port,
        state: nat_state::ICMP,
        flags: nat_flags::NODE,
        pod_ifindex: 0,
        last_seen_ns: t,
        created_ns: t,
        nat_addr: cfg.addr,
        _pad: 0,
    };
    match NAT_FWD.insert(k, e, u64::from(BPF_NOEXIST)) {
        Ok(()) => {
            count(reason::MASQ_NEW_FLOW);
            events::flow(event_kind::NAT_NEW, k, cfg.addr, k.src_port, 0);
            Ok(())
        }
        // Map full (the echo leaves untracked), or another CPU made the flow.
        Err(_) => {
            let _ = NAT_REV.remove(rk);
            Ok(())
        }
    }
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
    let L3::V4(ip) = h.l3 else {
        return;
    };
    // SAFETY: `ip` was bounds checked by l3::parse.
    let (src, dst, proto, vihl, frags) = unsafe {
        (
            (*ip).src_addr,
            (*ip).dst_addr,
            (*ip).proto,
            (*ip).vihl,
            (*ip).frags,
        )
    };
    if (proto != PROTO_TCP && proto != PROTO_UDP) || u16::from_be_bytes(frags) & 0x3fff != 0 {
        return;
    }
    let l4_off = ETH_LEN + usize::from(vihl & 0x0f) * 4;
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
    let key = NatKey {
        src_ip: dst,
        dst_ip: src,
        src_port: dport,
        dst_port: sport,
        proto,
        _pad: [0; 3],
    };
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
        let outside = NatKey {
            src_ip: src,
            dst_ip: dst,
            src_port: sport,
            dst_port: dport,
            proto,
            _pad: [0; 3],
        };
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
        NatKey {
            src_ip: ip.src_addr,
            dst_ip: ip.dst_addr,
            src_port: 0,
            dst_port: l4.sport,
            proto: ip.proto,
            _pad: [0; 3],
        }
    } else {
        NatKey {
            src_ip: ip.src_addr,
            dst_ip: ip.dst_addr,
            src_port: l4.sport,
            dst_port: l4.dport,
            proto: ip.proto,
            _pad: [0; 3],
        }
    };
    // SAFETY: map values are only read.
    let rev = *unsafe { NAT_REV.get(rk) }?;
    if stale_reverse(cfg, &rk) {
        // Past its timeout: the kernel answers as it would after a sweep.
        return None;
    }
    let fk = NatKey {
        src_ip: rev.pod_ip,
        dst_ip: ip.src_addr,
        src_port: rev.pod_port,
        dst_port: rk.src_port,
        proto: ip.proto,
        _pad: [0; 3],
    };
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
fn is_nat_addr(cfg: &MasqConfig, a: [u8; 4]) -> bool {
    a == cfg.addr || (a == cfg.prev_addr && a != [0; 4])
}

/// An ICMP error quoting a masqueraded packet (its inner source is the masquerade
/// address and NAT port): the inner source, the outer destination and the ICMP
/// checksum are rewritten to the pod's. The inner IP header checksum is updated
/// with it, which leaves the ICMP checksum unchanged for those two fields (a
/// header with a correct checksum always sums to 0xffff); the inner L4 checksum is
/// left alone, receivers do not check it.
#[inline(always)]
fn icmp_error(ctx: &TcContext, cfg: &MasqConfig, l4_off: usize) -> Option<i32> {
    let inner_off = l4_off + 8;
    let inner: Ipv4Hdr = ctx.load(inner_off).ok()?;
    if !is_nat_addr(cfg, inner.src_addr) {
        return None;
    }
    let inner_l4 = inner_off + usize::from(inner.vihl & 0x0f) * 4;
    let (sport_off, rk) = match inner.proto {
        PROTO_TCP | PROTO_UDP => {
            let sport: u16 = ctx.load(inner_l4).ok()?;
            let dport: u16 = ctx.load(inner_l4 + 2).ok()?;
            (
                inner_l4,
                NatKey {
                    src_ip: inner.dst_addr,
                    dst_ip: inner.src_addr,
                    src_port: dport,
                    dst_port: sport,
                    proto: inner.proto,
                    _pad: [0; 3],
                },
            )
        }
        PROTO_ICMP => {
            let id: u16 = ctx.load(inner_l4 + 4).ok()?;
            (
                inner_l4 + 4,
                NatKey {
                    src_ip: inner.dst_addr,
                    dst_ip: inner.src_addr,
                    src_port: 0,
                    dst_port: id,
                    proto: PROTO_ICMP,
                    _pad: [0; 3],
                },
            )
        }
        _ => return None,
    };
    // SAFETY: map values are only read.
    let rev = *unsafe { NAT_REV.get(rk) }?;
    let (old_a, new_a) = (
        u64::from(u32::from_ne_bytes(inner.src_addr)),
        u64::from(u32::from_ne_bytes(rev.pod_ip)),
    );
    let ok = ctx.l3_csum_replace(inner_off + 10, old_a, new_a, 4).is_ok()
        && ctx.store(inner_off + 12, &rev.pod_ip, 0).is_ok()
        && ctx
            .l4_csum_replace(
                l4_off + 2,
                u64::from(rk.dst_port),
                u64::from(rev.pod_port),
                2,
            )
            .is_ok()
        && ctx.store(sport_off, &rev.pod_port, 0).is_ok()
        && ctx.l3_csum_replace(IP_CSUM, old_a, new_a, 4).is_ok()
        && ctx.store(ETH_LEN + 16, &rev.pod_ip, 0).is_ok();
    if !ok {
        note_drop(reason::DROP_MASQ_MALFORMED, 0);
        return Some(TC_ACT_SHOT);
    }
    count(reason::MASQ_ICMP_ERROR);
    Some(deliver(ctx, rev.pod_ip))
}

/// Delivers a translated packet into the pod (or to the kernel, which routes it
/// there, when the pod is not in the endpoint map).
#[inline(always)]
pub(crate) fn deliver(ctx: &TcContext, pod_ip: [u8; 4]) -> i32 {
    // The helpers above may have moved the packet: parse it again.
    let Ok(h) = crate::l3::parse(ctx) else {
        return TCX_NEXT;
    };
    // SAFETY: map values are only read.
    match unsafe { ENDPOINTS.get(IpKey::v4(pod_ip)) } {
        Some(ep) if h.ttl() > 1 => endpoint::deliver_tc(
            &h,
            ep,
            crate::bandwidth::wire_len(ctx),
            reason::UPLINK_TO_POD,
        ),
        _ => TCX_NEXT,
    }
}

/// Deletes every flow idle longer than its timeout. Runs from a perf event.
#[inline(always)]
pub fn sweep() {
    // SAFETY: the callback matches the helper's contract (map, key, value, ctx).
    unsafe {
        bpf_for_each_map_elem(
            (&raw const NAT_FWD).cast_mut().cast::<c_void>(),
            sweep_one as *mut c_void,
            core::ptr::null_mut(),
            0,
        );
        bpf_for_each_map_elem(
            (&raw const NAT_FRAG).cast_mut().cast::<c_void>(),
            sweep_frag as *mut c_void,
            core::ptr::null_mut(),
            0,
        );
    }
}

/// Fragment entries are ignored after `FRAG_TIMEOUT_NS`; this removes them.
#[inline(never)]
extern "C" fn sweep_frag(
    _map: *mut c_void,
    key: *mut FragKey,
    value: *mut FragEntry,
    _ctx: *mut c_void,
) -> i64 {
    // SAFETY: the helper passes valid key and value pointers of this map.
    let (k, created) = unsafe { (*key, (*value).created_ns) };
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    if now.saturating_sub(created) > FRAG_TIMEOUT_NS {
        let _ = NAT_FRAG.remove(k);
    }
    0
}

#[inline(never)]
extern "C" fn sweep_one(
    _map: *mut c_void,
    key: *mut NatKey,
    value: *mut NatEntry,
    _ctx: *mut c_void,
) -> i64 {
    let Some(cfg) = MASQ.get(0) else {
        return 1;
    };
    // SAFETY: the helper passes valid key and value pointers of this map.
    let (k, e) = unsafe { (*key, *value) };
    // Perf-event programs may not call bpf_ktime_get_coarse_ns; the fine clock is
    // the same CLOCK_MONOTONIC, ahead of the coarse one by less than a tick.
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    if is_expired(cfg, e.state, e.last_seen_ns, now) {
        // Inbound flows have no reverse entry (and their key could be a
        // masqueraded flow's).
        if e.flags & nat_flags::INBOUND == 0 {
            let _ = NAT_REV.remove(rev_key(&k, e.nat_addr, e.nat_port));
        }
        let _ = NAT_FWD.remove(k);
        count(reason::NAT_EXPIRED);
    }
    0
}

/// RFC 1624 incremental update of a checksum `check` (as stored) when 16-bit words
/// `old` become `new` (as stored). Only valid for complete checksums.
#[inline(always)]
pub(crate) fn csum_update(check: u16, old: [u16; 3], new: [u16; 3]) -> u16 {
    let mut sum = u32::from(!check);
    let mut i = 0;
    while i < 3 {
        sum += u32::from(!old[i]) + u32::from(new[i]);
        i += 1;
    }
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

/// The two 16-bit words of an address as stored.
#[inline(always)]
pub(crate) fn words(a: [u8; 4]) -> [u16; 2] {
    [
        u16::from_ne_bytes([a[0], a[1]]),
        u16::from_ne_bytes([a[2], a[3]]),
    ]
}

/// XDP: translates a TCP/UDP reply or ICMP echo reply to the masquerade address
/// back to the pod and returns the pod's endpoint to deliver to. Native XDP only:
/// there frames come from a NIC with complete checksums, which an incremental
/// update keeps right; a generic-XDP skb may carry a partial checksum, which it
/// would corrupt, so those go on to the tc program and its checksum helpers.
#[inline(always)]
pub fn dnat_xdp(ctx: &XdpContext, h: &crate::l3::Headers) -> Option<[u8; 4]> {
    let cfg = config()?;
    let crate::l3::L3::V4(ip) = h.l3 else {
        return None;
    };
    // SAFETY: `ip` was bounds checked by l3::parse.
    let (dst, src, proto, vihl, frags) = unsafe {
        (
            (*ip).dst_addr,
            (*ip).src_addr,
            (*ip).proto,
            (*ip).vihl,
            (*ip).frags,
        )
    };
    if !is_nat_addr(cfg, dst) || u16::from_be_bytes(frags) & 0x3fff != 0 {
        return None;
    }
    let l4_off = ETH_LEN + usize::from(vihl & 0x0f) * 4;
    // Ports (or type/code and identifier) and the checksum, bounds checked.
    let hdr: *mut [u16; 4] = ptr_at(ctx, l4_off)?;
    // SAFETY: bounds checked by ptr_at.
    let w = unsafe { *hdr };
    let (sport, dport, port_idx, csum_ptr): (u16, u16, usize, *mut u16) = match proto {
        PROTO_TCP => {
            let c: *mut u16 = ptr_at(ctx, l4_off + 16)?;
            (w[0], w[1], 1, c)
        }
        PROTO_UDP => {
            let c: *mut u16 = ptr_at(ctx, l4_off + 6)?;
            (w[0], w[1], 1, c)
        }
        PROTO_ICMP => {
            // Echo reply: type 0, code 0; the identifier is the third word.
            if u16::from_be(w[0]) >> 8 != u16::from(ICMP_ECHO_REPLY) {
                return None;
            }
            let c: *mut u16 = ptr_at(ctx, l4_off + 2)?;
            (0, w[2], 2, c)
        }
        _ => return None,
    };
    let rk = NatKey {
        src_ip: src,
        dst_ip: dst,
        src_port: sport,
        dst_port: dport,
        proto,
        _pad: [0; 3],
    };
    // SAFETY: map values are only read.
    let rev = *unsafe { NAT_REV.get(rk) }?;
    if stale_reverse(cfg, &rk) {
        return None;
    }
    // A node echo's reply (see node_echo) is tc's: after XDP translated it, tc
    // would look its identifier up again.
    if rev.pod_ip == dst {
        return None;
    }
    let fk = NatKey {
        src_ip: rev.pod_ip,
        dst_ip: src,
        src_port: rev.pod_port,
        dst_port: sport,
        proto,
        _pad: [0; 3],
    };
    if let Some(e) = NAT_FWD.get_ptr_mut(fk) {
        // The flags are byte 13 of the TCP header.
        let flags = if proto == PROTO_TCP {
            // SAFETY: bounds checked by ptr_at.
            ptr_at::<u8>(ctx, l4_off + 13).map_or(0, |f| unsafe { *f })
        } else {
            0
        };
        touch(e, proto, flags, true);
    }
    let (od, nd) = (words(dst), words(rev.pod_ip));
    // SAFETY: every pointer below was bounds checked by ptr_at / l3::parse.
    unsafe {
        let old_port = (*hdr)[port_idx];
        let c = *csum_ptr;
        // UDP checksum 0: none to update.
        if !(proto == PROTO_UDP && c == 0) {
            let nc = if proto == PROTO_ICMP {
                // No pseudo header: only the identifier is in the checksum.
                csum_update(c, [old_port, 0, 0], [rev.pod_port, 0, 0])
            } else {
                csum_update(c, [od[0], od[1], old_port], [nd[0], nd[1], rev.pod_port])
            };
            *csum_ptr = if proto == PROTO_UDP && nc == 0 {
                0xffff
            } else {
                nc
            };
        }
        (*hdr)[port_idx] = rev.pod_port;
        (*ip).check = csum_update(
            u16::from_ne_bytes((*ip).check),
            [od[0], od[1], 0],
            [nd[0], nd[1], 0],
        )
        .to_ne_bytes();
        (*ip).dst_addr = rev.pod_ip;
    }
    Some(rev.pod_ip)
}
