//! Per-pod bandwidth limits (CNI `bandwidth`) as token buckets in `sl_bw`, with
//! no qdisc and no ifb device: packets over the limit are dropped (a policer),
//! which TCP reads as congestion. A bucket is never shallower than what a TCP
//! stream needs to keep the rate through drops (`Bucket::depth_for`, 300 ms of
//! the rate), whatever burst was configured.
//!
//! Only pods marked `endpoint_flags::LIMITED` in their endpoint are looked up:
//! the others pay nothing per packet (as hostPort's flow lookup waits for
//! `HostPortConfig::active`).
//!
//! Egress (what the pod sends) is checked in `from_pod`, unless EDT shapes it
//! (`edt`, on kernels with `sch_fq`); ingress (what it
//! receives) wherever a packet is handed to the pod: `bpf_redirect_peer` and the
//! XDP redirect skip the host veth's egress hook, so `endpoint::deliver_*` check
//! it, and `to_pod` for what the kernel routes.
//!
//! CPUs share a bucket without a lock: tokens and counters change by atomic adds
//! whose result is not used (BPF_ATOMIC add, which every BPF CPU version has;
//! fetching needs v3), and a refill raced by another CPU at worst credits one
//! interval twice (capped at `burst`).
use core::intrinsics::{atomic_xadd, AtomicOrdering};

use aya_ebpf::{helpers::bpf_ktime_get_ns, programs::TcContext};
use sluice_common::{endpoint_flags, reason, Bucket, Endpoint};

use crate::{
    events::note_drop,
    maps::{BANDWIDTH, EDT},
};

/// Headers each segment of a GSO packet carries on the wire: Ethernet, IPv4 and
/// TCP with timestamps (14 + 20 + 32).
const SEGMENT_HEADERS: u32 = 66;

/// What a packet weighs on the wire: a GSO packet (`skb->len` counts one set of
/// headers) is charged the headers of each segment it becomes, as a qdisc
/// charges them (measured: 3.5% over the limit at 1 Gbit/s without this).
#[inline(always)]
pub fn wire_len(ctx: &TcContext) -> u32 {
    // SAFETY: `skb` points at the context the kernel passed in.
    let segs = unsafe { (*ctx.skb.skb).gso_segs };
    ctx.len() + segs.saturating_sub(1) * SEGMENT_HEADERS
}

/// [`admit`] for a packet to the pod of endpoint `ep`: a pod without limits
/// (`endpoint_flags::LIMITED` clear) passes without a lookup.
#[inline(always)]
pub fn admit_to(ep: &Endpoint, len: u32) -> bool {
    ep.flags & endpoint_flags::LIMITED == 0 || admit(ep.ifindex, len, true)
}

/// Whether a packet of `len` bytes may pass the limit of the pod on `ifindex`
/// in one direction (`ingress`: to the pod). Counts what it drops.
#[inline(always)]
pub fn admit(ifindex: u32, len: u32, ingress: bool) -> bool {
    let Some(s) = BANDWIDTH.get_ptr_mut(ifindex) else {
        return true;
    };
    // EDT shapes this pod's egress on its own eth0 (see `edt`).
    if !ingress && EDT.get_ptr(ifindex).is_some() {
        return true;
    }
    // SAFETY: a live map value; fields are only touched through atomics or
    // plain racy stores whose loss is harmless (see the module doc).
    let b: *mut Bucket = unsafe {
        if ingress {
            &raw mut (*s).ingress
        } else {
            &raw mut (*s).egress
        }
    };
    // SAFETY: as above.
    unsafe {
        if (*b).rate == 0 {
            return true;
        }
        // SAFETY: plain helper call.
        let now = bpf_ktime_get_ns();
        let last = (*b).last_ns;
        let tokens = &raw mut (*b).tokens;
        // The burst, raised to what a TCP stream needs (Bucket::depth_for).
        let depth = Bucket::depth_for((*b).rate, (*b).burst) as i64;
        if now > last {
            (*b).last_ns = now;
            let elapsed = (now - last).min((*b).fill_ns);
            let add = (elapsed * (*b).rate / 1_000_000_000) as i64;
            atomic_xadd::<i64, i64, { AtomicOrdering::Relaxed }>(tokens, add);
            if core::ptr::read_volatile(tokens) > depth {
                core::ptr::write_volatile(tokens, depth);
            }
        }
        let t = core::ptr::read_volatile(tokens);
        // A packet needs its length in tokens (a GSO packet bigger than the
        // depth passes on a full bucket).
        if t < i64::from(len).min(depth) {
            atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(&raw mut (*b).dropped, 1);
            note_drop(
                if ingress {
                    reason::DROP_BW_INGRESS
                } else {
                    reason::DROP_BW_EGRESS
                },
                ifindex,
            );
            return false;
        }
        atomic_xadd::<i64, i64, { AtomicOrdering::Relaxed }>(tokens, -i64::from(len));
        atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(&raw mut (*b).passed, 1);
    }
    true
}
