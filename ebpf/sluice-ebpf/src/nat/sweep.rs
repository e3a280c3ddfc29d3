//! The sweeper: a perf-event program, once a second, deletes flows idle longer
//! than their timeout and stale fragment entries, so the maps never fill up
//! with dead flows (`bpf_for_each_map_elem`, 5.13+; older kernels expire
//! lazily, see `flow`).
use core::ffi::c_void;

use aya_ebpf::helpers::{bpf_for_each_map_elem, bpf_ktime_get_ns};
use sluice_common::{nat_flags, reason, FragEntry, FragKey, NatEntry, NatKey, FRAG_TIMEOUT_NS};

use super::flow::{is_expired, rev_key};
use crate::{
    counters::count,
    maps::{MASQ, NAT_FRAG, NAT_FWD, NAT_REV},
};

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
