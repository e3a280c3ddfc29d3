//! Per-reason packet counters (`sl_counters`, per CPU; userspace sums them).
use crate::maps::COUNTERS;

#[inline(always)]
pub fn count(reason: u32) {
    if let Some(c) = COUNTERS.get_ptr_mut(reason) {
        // SAFETY: per-CPU slot, only this CPU writes it while the program runs.
        unsafe { *c += 1 };
    }
}
