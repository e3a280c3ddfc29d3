//! EDT egress shaping (Early Departure Time, as Cilium's Bandwidth Manager):
//! `pod_edt` runs at the tc egress of a limited pod's own `eth0`, inside its
//! namespace, whose root qdisc is `fq`. It gives each packet a departure time in
//! `skb->tstamp` from the pod's clock in `sl_edt`, and `fq` holds the packet
//! until then: TCP meets the limit through its small-queue backpressure instead
//! of losses (UDP too: a packet stays charged to its socket's buffer until it
//! leaves). Packets the clock would send more than [`EDT_HORIZON_NS`] from now
//! are dropped. `from_pod` then
//! skips the pod's egress bucket (`bandwidth::admit`). docs/bandwidth.md.
use core::intrinsics::{atomic_xadd, AtomicOrdering};

use aya_ebpf::{bindings::TC_ACT_SHOT, helpers::bpf_ktime_get_ns, programs::TcContext};
use sluice_common::{reason, EDT_HORIZON_NS};

use crate::{
    bandwidth::wire_len,
    events::note_drop,
    l3,
    maps::{BANDWIDTH, EDT, ENDPOINTS},
    TCX_NEXT,
};

/// The verdict for one packet leaving a pod's `eth0`, and the host veth's
/// ifindex of the pod it was charged to (0: none).
#[inline(always)]
pub fn stamp(ctx: &TcContext) -> (i32, u32) {
    let Ok(h) = l3::parse(ctx) else {
        return (TCX_NEXT, 0);
    };
    // SAFETY: the map value is only read.
    let Some(ep) = (unsafe { ENDPOINTS.get(h.src_key()) }) else {
        return (TCX_NEXT, 0);
    };
    let ifindex = ep.ifindex;
    let Some(slot) = EDT.get_ptr_mut(ifindex) else {
        return (TCX_NEXT, 0);
    };
    let Some(bw) = BANDWIDTH.get_ptr_mut(ifindex) else {
        return (TCX_NEXT, 0);
    };
    let skb = ctx.skb.skb;
    // SAFETY: `skb` is the context the kernel passed in; `slot` and `bw` are
    // live map values, whose racy plain stores lose at most one packet's time
    // (as in Cilium); counters change by atomic adds.
    unsafe {
        // Only the pod's own interface spends its clock (a pod sending with
        // another pod's address is dropped as spoofed in from_pod anyway).
        if (*slot).pod_ifindex != (*skb).ifindex {
            return (TCX_NEXT, 0);
        }
        let rate = (*bw).egress.rate;
        if rate == 0 {
            return (TCX_NEXT, 0);
        }
        let now = bpf_ktime_get_ns();
        // TCP may have given the packet its own pacing time.
        let t = if (*skb).tstamp > now {
            (*skb).tstamp
        } else {
            now
        };
        let delay = u64::from(wire_len(ctx)) * 1_000_000_000 / rate;
        let next = (*slot).last_ns + delay;
        if next <= t {
            (*slot).last_ns = t;
        } else if next - now > EDT_HORIZON_NS {
            atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(&raw mut (*bw).egress.dropped, 1);
            note_drop(reason::DROP_BW_EGRESS, ifindex);
            return (TC_ACT_SHOT, ifindex);
        } else {
            (*slot).last_ns = next;
            (*skb).tstamp = next;
        }
        atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(&raw mut (*bw).egress.passed, 1);
    }
    (TCX_NEXT, ifindex)
}
