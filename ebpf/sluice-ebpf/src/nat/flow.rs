//! The flow table: NAT ports taken without races (`BPF_NOEXIST` on the reverse
//! entry), TCP states, idle timeouts, and the lazy expiry of kernels without
//! the sweeper.
#![expect(
    clippy::needless_borrows_for_generic_args,
    reason = "flow keys go to the map helpers by reference: an IPv6 key is 40 bytes of a 512-byte stack"
)]
use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_ktime_get_coarse_ns, bpf_ktime_get_ns},
};
use sluice_common::{nat_flags, nat_port_index, nat_state, reason, MasqConfig, NAT_PORT_TRIES};

use super::{
    evict::{reclaim_port, udp_unreplied_secs},
    family::{Entry, Family, FlowKey, Rev},
};
use crate::{
    counters::count,
    l4::{PROTO_TCP, PROTO_UDP, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
};

const EEXIST: i32 = 17;
/// `last_seen_ns` is refreshed at most this often (fewer writes to a shared line).
const REFRESH_NS: u64 = 1_000_000_000;

/// CLOCK_MONOTONIC: the coarse clock where the kernel has it (cheaper), else
/// the fine one (ahead of the coarse one by less than a tick).
#[inline(always)]
pub(super) fn now() -> u64 {
    if crate::kernel::ktime_coarse() {
        // SAFETY: plain helper call.
        unsafe { bpf_ktime_get_coarse_ns() }
    } else {
        // SAFETY: plain helper call.
        unsafe { bpf_ktime_get_ns() }
    }
}

/// On a kernel without the sweeper, whether the flow `k` (value `e`) is past
/// its timeout; if so it is removed (both entries), as the sweeper would have.
/// The check is inline; the work a BPF-to-BPF call of its own (its locals stay
/// off the caller's stack frame, and kernels with the sweeper never call it).
#[inline(always)]
pub(super) fn expired_now<F: Family>(cfg: &MasqConfig, k: &FlowKey<F>, e: *const Entry<F>) -> bool {
    crate::kernel::lazy_expiry() && expire_if_idle::<F>(cfg, k, e) != 0
}

#[inline(never)]
fn expire_if_idle<F: Family>(cfg: &MasqConfig, k: &FlowKey<F>, e: *const Entry<F>) -> u32 {
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
    if !cfg.is_expired((state, flags), udp_unreplied_secs(), last_seen, now()) {
        return 0;
    }
    if flags & nat_flags::INBOUND == 0 {
        let _ = F::rev().remove(&k.reverse(nat_addr, nat_port));
    }
    let _ = F::fwd().remove(k);
    count(reason::NAT_EXPIRED);
    1
}

/// On a kernel without the sweeper, a reverse entry `rk` whose flow is gone or
/// past its timeout is removed (with the flow); `true` then.
#[inline(always)]
pub(super) fn stale_reverse<F: Family>(cfg: &MasqConfig, rk: &FlowKey<F>) -> bool {
    crate::kernel::lazy_expiry() && free_if_stale::<F>(cfg, rk) != 0
}

// Inline: as a call of its own it made 5.10's verifier crash (a NULL
// dereference in __mark_chain_precision backtracking through nested calls).
#[inline(always)]
fn free_if_stale<F: Family>(cfg: &MasqConfig, rk: &FlowKey<F>) -> u32 {
    // SAFETY: map values are only read.
    let Some(rev) = (unsafe { F::rev().get(rk) }) else {
        return 0;
    };
    let fk = FlowKey::<F>::new(rev.pod_ip, rk.src_ip, rev.pod_port, rk.src_port, rk.proto);
    match F::fwd().get_ptr(&fk) {
        Some(e) => expire_if_idle::<F>(cfg, &fk, e),
        None => {
            let _ = F::rev().remove(rk);
            1
        }
    }
}

/// Where a flow's NAT port tries start (see `nat_port_index`): a hash of
/// everything but the pod's source port, plus that port, so that a pod's
/// consecutive source ports take consecutive NAT ports.
#[inline(always)]
fn flow_hash<F: Family>(k: &FlowKey<F>) -> u32 {
    let a = F::fold(&k.src_ip);
    let b = F::fold(&k.dst_ip);
    let mut h = a ^ b.rotate_left(11) ^ u32::from(k.dst_port).rotate_left(22) ^ u32::from(k.proto);
    h ^= h >> 16;
    h = h.wrapping_mul(0x7feb_352d);
    h ^= h >> 15;
    h = h.wrapping_mul(0x846c_a68b);
    h.wrapping_add(u32::from(u16::from_be(k.src_port)))
}

/// Takes a NAT port for a new flow leaving with `addr`: reverse entry first
/// (BPF_NOEXIST makes the port ours), then the forward entry.
#[inline(always)]
pub(super) fn allocate<F: Family>(
    k: &FlowKey<F>,
    cfg: &MasqConfig,
    addr: F::Addr,
    pod_ifindex: u32,
    state: u8,
) -> Result<(), u32> {
    let n1 = u32::from(cfg.port_max.saturating_sub(cfg.port_min)) + 1;
    let n2 = if cfg.port2_min <= cfg.port2_max {
        u32::from(cfg.port2_max - cfg.port2_min) + 1
    } else {
        0
    };
    let range = n1 + n2;
    let h = flow_hash::<F>(k);
    let rev = Rev::<F> {
        pod_ip: k.src_ip,
        pod_port: k.src_port,
        _pad: 0,
    };
    let flow = New {
        addr,
        rev,
        pod_ifindex,
        state,
    };
    // The tries written out, not a loop: in a loop the verifier keeps a state
    // per try at each of the body's prune points (the counter is precise, so
    // none prunes another) and compares each new one with all of them; on 5.10
    // and 6.1 that was half of a datapath load (docs/kernels.md). Each try
    // returns at once: code reached from every try (a call to make room when
    // the table is full, tried there first) had 6.1 walk it 32 times, and an
    // ADD there took over a minute. A full table makes room before the tries
    // (`evict::make_room_if_full`).
    macro_rules! tries {
        ($($i:literal)*) => {$(
            let nat_port = candidate_port(cfg, nat_port_index(h, $i, range), n1);
            if let Some(r) = claim_port::<F>(k, nat_port, &flow) {
                return r;
            }
        )*};
    }
    const _: () = assert!(NAT_PORT_TRIES == 32, "one line of tries! per try");
    tries!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31);
    // Without the sweeper a port may be held by a dead flow until a packet
    // meets it: the first candidate's holder is checked, once, after the tries.
    // (Checked in every try, as part of the loop the tries were then, 5.10's
    // verifier walked every iteration apart and gave up at a million
    // instructions.) With the sweeper, the holder gives its port up when it
    // is idle and not an established connection (`evict::reclaim_port`;
    // IPv4: see `Family::ROOM_IN_FLOW`).
    let nat_port = candidate_port(cfg, nat_port_index(h, 0, range), n1);
    if stale_reverse::<F>(cfg, &k.reverse(addr, nat_port))
        || (F::ROOM_IN_FLOW && reclaim_port::<F>(k, &flow, nat_port) != 0)
    {
        if let Some(r) = claim_port::<F>(k, nat_port, &flow) {
            return r;
        }
    }
    Err(reason::DROP_MASQ_NO_PORT)
}

/// What a new flow gets besides its port.
pub(super) struct New<F: Family> {
    pub(super) addr: F::Addr,
    rev: Rev<F>,
    pod_ifindex: u32,
    state: u8,
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

/// [`claim`], in a call of its own where the family wants it
/// ([`Family::CLAIM_CALL`]).
#[inline(always)]
fn claim_port<F: Family>(k: &FlowKey<F>, nat_port: u16, n: &New<F>) -> Option<Result<(), u32>> {
    if F::CLAIM_CALL {
        // A call returns one register: 0 taken, 1 held by another flow,
        // else the drop reason + 2.
        match claim_call::<F>(k, nat_port, n) {
            0 => Some(Ok(())),
            1 => None,
            r => Some(Err(r - 2)),
        }
    } else {
        claim::<F>(k, nat_port, n)
    }
}

#[inline(never)]
fn claim_call<F: Family>(k: &FlowKey<F>, nat_port: u16, n: &New<F>) -> u32 {
    match claim::<F>(k, nat_port, n) {
        Some(Ok(())) => 0,
        None => 1,
        Some(Err(r)) => r + 2,
    }
}

/// Takes `nat_port` for the flow `k` if no flow holds it: `None` when one does,
/// else the outcome of creating the flow.
#[inline(always)]
fn claim<F: Family>(k: &FlowKey<F>, nat_port: u16, n: &New<F>) -> Option<Result<(), u32>> {
    let rk = k.reverse(n.addr, nat_port);
    match F::rev().insert(&rk, &n.rev, u64::from(BPF_NOEXIST)) {
        Ok(()) => {
            let t = now();
            let e = Entry::<F> {
                nat_port,
                state: n.state,
                flags: if n.pod_ifindex == 0 {
                    nat_flags::NODE
                } else {
                    0
                },
                pod_ifindex: n.pod_ifindex,
                last_seen_ns: t,
                created_ns: t,
                nat_addr: n.addr,
                _pad: F::PAD,
            };
            Some(match F::fwd().insert(k, &e, u64::from(BPF_NOEXIST)) {
                Ok(()) => {
                    count(reason::MASQ_NEW_FLOW);
                    F::claimed(k, n.addr, nat_port, n.pod_ifindex);
                    Ok(())
                }
                // Another CPU created the same flow meanwhile: use its port.
                Err(e) if e == -EEXIST => {
                    let _ = F::rev().remove(&rk);
                    Ok(())
                }
                Err(_) => {
                    let _ = F::rev().remove(&rk);
                    Err(reason::DROP_MASQ_MAP_FULL)
                }
            })
        }
        Err(e) if e == -EEXIST => None,
        Err(_) => Some(Err(reason::DROP_MASQ_MAP_FULL)),
    }
}

/// Takes a node echo's own identifier as its NAT identifier, if no flow holds
/// it (the echo leaves with its own address, `k.src_ip`).
#[inline(always)]
pub(super) fn reserve<F: Family>(k: &FlowKey<F>) -> Result<(), ()> {
    let flow = New::<F> {
        addr: k.src_ip,
        rev: Rev::<F> {
            pod_ip: k.src_ip,
            pod_port: k.src_port,
            _pad: 0,
        },
        pod_ifindex: 0,
        state: nat_state::ICMP,
    };
    match claim::<F>(k, k.src_port, &flow) {
        // Held by a pod's flow.
        None => Err(()),
        // Made, made by another CPU, or the map is full (the echo leaves
        // untracked).
        Some(_) => Ok(()),
    }
}

/// The TCP state after a packet with `flags`; `reply` for the return direction.
#[inline(always)]
pub(super) fn next_state(cur: u8, proto: u8, flags: u8, reply: bool) -> u8 {
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

/// Refreshes a flow's state and timestamp; `reply` marks it replied.
#[inline(always)]
pub(super) fn touch<A, P>(
    e: *mut sluice_common::NatEntryOf<A, P>,
    proto: u8,
    flags: u8,
    reply: bool,
) {
    let t = now();
    // SAFETY: a live map value; concurrent writers race benignly (last writer
    // wins on a timestamp and a state that only moves forward in practice).
    unsafe {
        let s = next_state((*e).state, proto, flags, reply);
        if s != (*e).state {
            (*e).state = s;
        }
        if reply && (*e).flags & nat_flags::REPLIED == 0 {
            (*e).flags |= nat_flags::REPLIED;
        }
        if t.saturating_sub((*e).last_seen_ns) > REFRESH_NS {
            (*e).last_seen_ns = t;
        }
    }
}
