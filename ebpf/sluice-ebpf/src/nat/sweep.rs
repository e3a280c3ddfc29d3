//! The sweeper: a perf-event program, once a second, deletes flows idle longer
//! than their timeout and stale fragment entries, so the maps never fill up
//! with dead flows (`bpf_for_each_map_elem`, 5.13+; older kernels expire
//! lazily, see `flow`).
#![expect(
    clippy::needless_borrows_for_generic_args,
    reason = "flow keys go to the map helpers by reference: an IPv6 key is 40 bytes of a 512-byte stack"
)]
use core::ffi::c_void;

use aya_ebpf::helpers::{bpf_for_each_map_elem, bpf_ktime_get_ns};
use sluice_common::{agent_slot, nat_flags, reason, FragEntry, FragKey, FRAG_TIMEOUT_NS};

use super::family::{Entry, Family, FlowKey, V4, V6};
use crate::{
    counters::count,
    maps::{AGENT, MASQ, NAT6_FWD, NAT_FRAG, NAT_FWD},
};

/// Deletes every flow idle longer than its timeout. Runs from a perf event.
///
/// A family whose masquerade is off has no flows to expire, and walking its
/// empty table still visits every bucket (`bpf_for_each_hash_elem`): about
/// 2 ms a second for the three tables, in the perf event's hard interrupt, on
/// a node none of whose pods masquerades. Such a table is left alone; flows
/// a masquerade turned off since left behind are swept once it is on again.
///
/// Where the node agent (`sluice-node`) sweeps, from process context, it holds
/// a lease in `sl_agent` and this run does nothing: a walk of a masquerading
/// node's tables took about 2.6 ms here, in the perf event's hard interrupt.
/// The agent renews the lease every pass; a stopped agent's lease runs out
/// within `agent_slot::SWEEP_LEASE_NS` and this sweeper takes the tables back.
#[inline(always)]
pub fn sweep() {
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    if AGENT
        .get(agent_slot::SWEEP_UNTIL_NS)
        .is_some_and(|until| now < *until)
    {
        return;
    }
    let v4 = super::config().is_some();
    let v6 = crate::kernel::masq6() && super::v6::config6().is_some();
    if v4 {
        walk_v4();
    }
    if v6 {
        walk_v6();
    }
    if v4 || v6 {
        walk_frag();
    }
}

// One function per table, never inlined: each `bpf_for_each_map_elem` call
// instruction then sees one map. Inlined behind the gates above, LLVM merges
// the three calls into one instruction reached with different map pointers,
// which Linux 6.1 refuses ("tail_call abusing map_ptr", in
// `set_map_elem_callback_state`); 6.12 accepts it.

#[inline(never)]
fn walk_v4() {
    // SAFETY: the callback matches the helper's contract (map, key, value, ctx).
    unsafe {
        bpf_for_each_map_elem(
            (&raw const NAT_FWD).cast_mut().cast::<c_void>(),
            sweep_one::<V4> as *mut c_void,
            core::ptr::null_mut(),
            0,
        );
    }
}

#[inline(never)]
fn walk_v6() {
    // SAFETY: as in `walk_v4`.
    unsafe {
        bpf_for_each_map_elem(
            (&raw const NAT6_FWD).cast_mut().cast::<c_void>(),
            sweep_one::<V6> as *mut c_void,
            core::ptr::null_mut(),
            0,
        );
    }
}

#[inline(never)]
fn walk_frag() {
    // SAFETY: as in `walk_v4`.
    unsafe {
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
extern "C" fn sweep_one<F: Family>(
    _map: *mut c_void,
    key: *mut FlowKey<F>,
    value: *mut Entry<F>,
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
    if cfg.is_expired(
        (e.state, e.flags),
        super::evict::udp_unreplied_secs(),
        e.last_seen_ns,
        now,
    ) {
        // Inbound flows have no reverse entry (and their key could be a
        // masqueraded flow's).
        if e.flags & nat_flags::INBOUND == 0 {
            let _ = F::rev().remove(&k.reverse(e.nat_addr, e.nat_port));
        }
        if F::fwd().remove(&k).is_ok() {
            super::evict::removed::<F>(e.pod_ifindex);
        }
        count(reason::NAT_EXPIRED);
    }
    0
}
