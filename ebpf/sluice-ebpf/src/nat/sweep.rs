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
use sluice_common::{nat_flags, reason, FragEntry, FragKey, FRAG_TIMEOUT_NS};

use super::{
    family::{Entry, Family, FlowKey, V4, V6},
    flow::is_expired,
};
use crate::{
    counters::count,
    maps::{MASQ, NAT6_FWD, NAT_FRAG, NAT_FWD},
};

/// Deletes every flow idle longer than its timeout. Runs from a perf event.
#[inline(always)]
pub fn sweep() {
    // SAFETY: the callback matches the helper's contract (map, key, value, ctx).
    unsafe {
        bpf_for_each_map_elem(
            (&raw const NAT_FWD).cast_mut().cast::<c_void>(),
            sweep_one::<V4> as *mut c_void,
            core::ptr::null_mut(),
            0,
        );
        bpf_for_each_map_elem(
            (&raw const NAT6_FWD).cast_mut().cast::<c_void>(),
            sweep_one::<V6> as *mut c_void,
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
    if is_expired(cfg, e.state, e.last_seen_ns, now) {
        // Inbound flows have no reverse entry (and their key could be a
        // masqueraded flow's).
        if e.flags & nat_flags::INBOUND == 0 {
            let _ = F::rev().remove(&k.reverse(e.nat_addr, e.nat_port));
        }
        let _ = F::fwd().remove(&k);
        count(reason::NAT_EXPIRED);
    }
    0
}
