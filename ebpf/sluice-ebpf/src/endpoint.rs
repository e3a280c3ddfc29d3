//! Per-endpoint packet and byte counters, keyed by the host veth's ifindex.
use aya_ebpf::programs::TcContext;

use crate::maps::ENDPOINT_STATS;

#[inline(always)]
fn ifindex(ctx: &TcContext) -> u32 {
    // SAFETY: `skb` points at the context the kernel passed in; reading a field is
    // a plain context access the verifier allows.
    unsafe { (*ctx.skb.skb).ifindex }
}

/// Counts a packet the pod sent. Userspace creates the entry at ADD, so the hot
/// path never inserts.
#[inline(always)]
pub fn count_from_pod(ctx: &TcContext) {
    if let Some(s) = ENDPOINT_STATS.get_ptr_mut(ifindex(ctx)) {
        // SAFETY: per-CPU value, only this CPU writes it while the program runs.
        unsafe {
            (*s).from_pod_packets += 1;
            (*s).from_pod_bytes += u64::from(ctx.len());
        }
    }
}

/// Counts a packet going into the pod.
#[inline(always)]
pub fn count_to_pod(ctx: &TcContext) {
    if let Some(s) = ENDPOINT_STATS.get_ptr_mut(ifindex(ctx)) {
        // SAFETY: as above.
        unsafe {
            (*s).to_pod_packets += 1;
            (*s).to_pod_bytes += u64::from(ctx.len());
        }
    }
}
