//! A full flow table makes room instead of refusing new flows, and no pod
//! takes more than its share of it.
//!
//! Every new flow's key goes into its family's ring of recent flows
//! (`sl_nat_ring`, `sl_nat6_ring`, as many slots as the table). When an insert
//! finds the table full (`-E2BIG` from a preallocated hash map), an eviction
//! hand looks at the next [`NAT_EVICT_WINDOW`] slots, oldest first, and evicts
//! the first flow that never saw a reply, else the least recently used one
//! that is not an established TCP connection ([`eviction_rank`]); an
//! established connection is never cut to make room. The hand moves past what
//! it looked at, as the hand of a CLOCK cache does, so the next look is at the
//! next window. This is what conntrack's `early_drop` does for a full table
//! (it drops an unreplied entry of the bucket), with the window in place of
//! the bucket.
//!
//! A pod at its share (`natPodShare`, [`NatLimits::pod_max_flows`]) makes
//! room among its own flows only, before it creates one: its new flows replace
//! its old ones, and the rest of the table stays open to the other pods. Flows
//! per pod are counted in `sl_nat_pods`: added here, subtracted where a flow
//! is removed (the sweepers, eviction); the node agent recounts them on every
//! pass, which corrects what races lose.
//!
//! Only with the sweeper's kernels (HASH tables). Without it the tables are
//! LRU maps (see `flow::expired_now`): the kernel itself replaces the least
//! recently used entry when one is full, and nothing here runs.
#![expect(
    clippy::needless_borrows_for_generic_args,
    reason = "flow keys go to the map helpers by reference: an IPv6 key is 40 bytes of a 512-byte stack"
)]
use core::intrinsics::{atomic_xadd, AtomicOrdering};

use aya_ebpf::bindings::BPF_NOEXIST;
use sluice_common::{eviction_rank, nat_flags, reason, NatLimits, NAT_EVICT_WINDOW};

use super::{
    family::{Family, FlowKey},
    flow::{now, New},
};
use crate::{
    counters::count,
    maps::{NAT_CURSOR, NAT_LIMITS, NAT_PODS},
};

/// The settings, where eviction runs at all (sweeper kernels, ring sized).
#[inline(always)]
fn limits() -> Option<&'static NatLimits> {
    if crate::kernel::lazy_expiry() {
        return None;
    }
    NAT_LIMITS.get(0).filter(|l| l.ring_slots != 0)
}

/// The timeout of an unreplied UDP flow, seconds (0: none of its own).
#[inline(always)]
pub(super) fn udp_unreplied_secs() -> u32 {
    NAT_LIMITS.get(0).map_or(0, |l| l.udp_unreplied_secs)
}

/// Records a new flow `k` of the pod `pod_ifindex` (0: the node's): its key
/// in the ring, one more flow in the pod's count.
#[inline(never)]
pub(super) fn note_new<F: Family>(k: &FlowKey<F>, pod_ifindex: u32) {
    // Read once, before the cursor's write (which may alias it for the
    // compiler, and a divisor read again could be 0: a panic path).
    let Some(slots) = limits()
        .map(|l| u64::from(l.ring_slots))
        .filter(|&s| s != 0)
    else {
        return;
    };
    let Some(written) = NAT_CURSOR.get_ptr_mut(F::WRITTEN) else {
        return;
    };
    // Not atomic: two CPUs may write one slot, and a flow without a slot is
    // only never a candidate (it still expires).
    // SAFETY: a live map value.
    let n = unsafe {
        let n = *written;
        *written = n.wrapping_add(1);
        n
    };
    let slot = (n % slots) as u32;
    if let Some(s) = F::ring().get_ptr_mut(slot) {
        // SAFETY: a live map value of the key's type.
        unsafe { *s = *k };
    }
    if let Some(c) = NAT_CURSOR.get_ptr_mut(F::FLOWS) {
        // SAFETY: a live map value; an atomic add.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(c, 1) };
    }
    if pod_ifindex != 0 {
        pod_add(pod_ifindex);
    }
}

/// One flow fewer in the table of `F`, and in the pod's count: a flow was
/// removed (the sweeper, an eviction).
#[inline(always)]
pub(super) fn removed<F: Family>(pod_ifindex: u32) {
    if crate::kernel::lazy_expiry() {
        return;
    }
    if let Some(c) = NAT_CURSOR.get_ptr_mut(F::FLOWS) {
        // SAFETY: a live map value; never below zero (see `pod_sub`).
        unsafe {
            if *c > 0 {
                atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(c, u64::MAX);
            }
        }
    }
    pod_sub(pod_ifindex);
}

/// Before a new flow of the pod `pod_ifindex` is made: a pod at its share
/// makes room among its own flows (`Err`: it has none to give up), and a
/// table that is (nearly) full makes room for it, so the insert does not
/// fail. Within a window of the full mark, so that CPUs racing for the last
/// entries do not meet a full table. A call of its own: inline, its calls'
/// arguments grew the IPv6 flow function's frame past what the 512-byte
/// stack of the masquerade chain allows.
#[inline(never)]
pub(super) fn make_room_for<F: Family>(pod_ifindex: u32) -> Result<(), u32> {
    let Some(lim) = limits() else {
        return Ok(());
    };
    let max = u64::from(lim.max_flows);
    if at_share(pod_ifindex) && make_room::<F>(pod_ifindex, 1) == 0 {
        return Err(reason::DROP_MASQ_POD_SHARE);
    }
    let held = NAT_CURSOR.get(F::FLOWS).map_or(0, |n| *n);
    if max != 0 && held + u64::from(NAT_EVICT_WINDOW) >= max {
        make_room::<F>(pod_ifindex, 0);
    }
    Ok(())
}

/// One more flow for the pod.
#[inline(always)]
fn pod_add(ifindex: u32) {
    match NAT_PODS.get_ptr_mut(&ifindex) {
        // SAFETY: a live map value; an atomic add (BPF_XADD: 5.10 has it).
        Some(c) => unsafe {
            atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(c, 1);
        },
        // Another CPU's first flow of the pod may come first: one lost count,
        // which the agent's recount restores.
        None => {
            let _ = NAT_PODS.insert(&ifindex, &1, u64::from(BPF_NOEXIST));
        }
    }
}

/// One flow fewer for the pod (never below zero).
#[inline(always)]
fn pod_sub(ifindex: u32) {
    if ifindex == 0 || crate::kernel::lazy_expiry() {
        return;
    }
    if let Some(c) = NAT_PODS.get_ptr_mut(&ifindex) {
        // SAFETY: a live map value; the check and the add race only with
        // another removal of the same pod, which the recount corrects.
        unsafe {
            if *c > 0 {
                atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(c, u64::MAX);
            }
        }
    }
}

/// Whether the pod holds its share of the table or more.
#[inline(always)]
fn at_share(pod_ifindex: u32) -> bool {
    let Some(lim) = limits() else {
        return false;
    };
    if lim.pod_max_flows == 0 || pod_ifindex == 0 {
        return false;
    }
    // SAFETY: map values are only read.
    unsafe { NAT_PODS.get(&pod_ifindex) }.is_some_and(|n| *n >= u64::from(lim.pod_max_flows))
}

/// Below this idle time a flow keeps its port even when every port a new flow
/// tried is taken: a reply may still be on its way.
const RECLAIM_IDLE_NS: u64 = 1_000_000_000;

/// Every port tried for the new flow `k` was taken: one destination holds
/// most of the NAT ports (thousands of flows to one resolver, say). The
/// holder of `nat_port` (the first candidate) gives it up if it may be
/// evicted ([`eviction_rank`]) and has been idle over a second, as a full
/// table's victim would. Returns non-zero when the port is free.
#[inline(never)]
pub(super) fn reclaim_port<F: Family>(k: &FlowKey<F>, n: &New<F>, nat_port: u16) -> u32 {
    if limits().is_none() {
        return 0;
    }
    let rk = k.reverse(n.addr, nat_port);
    let rk = &rk;
    // SAFETY: map values are only read.
    let Some(rev) = (unsafe { F::rev().get(rk) }) else {
        return 1;
    };
    let fk = FlowKey::<F>::new(rev.pod_ip, rk.src_ip, rev.pod_port, rk.src_port, rk.proto);
    let Some(e) = F::fwd().get_ptr(&fk) else {
        let _ = F::rev().remove(rk);
        return 1;
    };
    // SAFETY: a live map value; fields read one by one.
    let (state, flags, seen, pod) =
        unsafe { ((*e).state, (*e).flags, (*e).last_seen_ns, (*e).pod_ifindex) };
    let rank = eviction_rank(state, flags);
    if rank == 0 || now().saturating_sub(seen) < RECLAIM_IDLE_NS {
        return 0;
    }
    let _ = F::rev().remove(rk);
    if F::fwd().remove(&fk).is_ok() {
        removed::<F>(pod);
    }
    let r = if rank == 2 {
        reason::NAT_EVICT_UNREPLIED
    } else {
        reason::NAT_EVICT_IDLE
    };
    count(r);
    crate::events::note_eviction(&fk, &rk.dst_ip, rk.dst_port, pod, r);
    r
}

/// Makes room in the table of family `F` by evicting one flow: of any pod
/// (`own` 0) or of the pod `pod_ifindex` only (`own` 1). Returns the reason
/// counted for the eviction, 0 when the window had nothing to evict.
///
/// Two calls, one after the other, not one inside the other: the IPv6
/// masquerade path is deep already, and the verifier adds up the frames of
/// a chain of calls (512 bytes in all).
#[inline(always)]
fn make_room<F: Family>(pod_ifindex: u32, own: u32) -> u32 {
    match pick::<F>(pod_ifindex, own) {
        0 => 0,
        slot => evict::<F>(slot - 1, own),
    }
}

/// The ring slot (+ 1) of the flow to evict, 0 for none.
#[inline(never)]
fn pick<F: Family>(pod_ifindex: u32, own: u32) -> u32 {
    let Some(lim) = limits() else {
        return 0;
    };
    let (Some(written), Some(hand)) = (NAT_CURSOR.get(F::WRITTEN), NAT_CURSOR.get_ptr_mut(F::HAND))
    else {
        return 0;
    };
    // Until the ring wraps, only its first `written` slots hold flows.
    let slots = u64::from(lim.ring_slots).min(*written);
    if slots == 0 {
        return 0;
    }
    // SAFETY: a live map value; a race with another CPU's hand only makes
    // both look at the same window.
    let start = unsafe { *hand };
    let (mut best, mut best_rank, mut best_seen) = (0u64, 0u8, u64::MAX);
    let mut i = 0u64;
    while i < u64::from(NAT_EVICT_WINDOW) {
        let at = start.wrapping_add(i);
        i += 1;
        let Some(k) = F::ring().get((at % slots) as u32) else {
            continue;
        };
        let Some(e) = F::fwd().get_ptr(k) else {
            continue;
        };
        // SAFETY: a live map value; fields read one by one.
        let (state, flags, seen, pod) =
            unsafe { ((*e).state, (*e).flags, (*e).last_seen_ns, (*e).pod_ifindex) };
        if own != 0 && pod != pod_ifindex {
            continue;
        }
        let rank = eviction_rank(state, flags);
        if rank > best_rank || (rank == best_rank && rank != 0 && seen < best_seen) {
            (best, best_rank, best_seen) = (at, rank, seen);
        }
    }
    // SAFETY: as above.
    unsafe {
        *hand = if best_rank == 0 {
            start.wrapping_add(u64::from(NAT_EVICT_WINDOW))
        } else {
            best.wrapping_add(1)
        };
    }
    if best_rank == 0 {
        return 0;
    }
    (best % slots) as u32 + 1
}

/// Evicts the flow in ring slot `slot` (read again: another CPU may have
/// written the slot, or changed the flow, since the window was looked at).
#[inline(never)]
fn evict<F: Family>(slot: u32, own: u32) -> u32 {
    let Some(k) = F::ring().get(slot) else {
        return 0;
    };
    let Some(e) = F::fwd().get_ptr(k) else {
        return 0;
    };
    // SAFETY: a live map value; fields read one by one.
    let (state, flags, pod, nat_addr, nat_port) = unsafe {
        (
            (*e).state,
            (*e).flags,
            (*e).pod_ifindex,
            (*e).nat_addr,
            (*e).nat_port,
        )
    };
    let rank = eviction_rank(state, flags);
    if rank == 0 {
        return 0;
    }
    // Inbound flows have no reverse entry (and their key could be a
    // masqueraded flow's).
    if flags & nat_flags::INBOUND == 0 {
        let _ = F::rev().remove(&k.reverse(nat_addr, nat_port));
    }
    if F::fwd().remove(k).is_err() {
        // Removed meanwhile (the sweeper, another eviction): room all the same.
        return reason::NAT_EVICT_IDLE;
    }
    removed::<F>(pod);
    let r = if own != 0 {
        reason::NAT_EVICT_POD_SHARE
    } else if rank == 2 {
        reason::NAT_EVICT_UNREPLIED
    } else {
        reason::NAT_EVICT_IDLE
    };
    count(r);
    crate::events::note_eviction(k, &nat_addr, nat_port, pod, r);
    r
}
