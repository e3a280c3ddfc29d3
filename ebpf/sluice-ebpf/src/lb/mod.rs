//! Kubernetes Services translated at the socket (the agent's Service mode,
//! instead of kube-proxy), as Cilium's socket-LB does: a `connect` or
//! `sendmsg` to a Service address and port is pointed at one of its
//! backends before any packet exists, so the packets are plain pod-to-pod
//! (or node-to-pod) ones on the fast path; `recvmsg` and `getpeername` show
//! the Service again. The hooks ([`sock`]) act in every network namespace
//! of the cgroup they are attached to (pods' too); the maps are
//! `sluice_common::lb`'s.
use core::intrinsics::{atomic_xadd, AtomicOrdering};

use aya_ebpf::helpers::bpf_get_prandom_u32;
use sluice_common::{reason, Backend, BackendKey, SvcKey, SvcValue};

use crate::{
    counters::count,
    maps::{LB_BACKENDS, LB_STATS, LB_SVC},
};

pub mod sock;

/// What a connect to a frontend gets.
pub enum Pick {
    /// Not a Service: the socket is left alone.
    NotService,
    /// The Service has no endpoint: refused.
    NoEndpoint,
    /// This backend.
    Backend(Backend),
}

/// A backend of the Service at `key`, picked at random among its slots (a
/// new connection's; the agent keeps the slots dense).
#[inline(always)]
pub fn pick(key: &SvcKey) -> Pick {
    // SAFETY: map values are only read.
    let Some(svc): Option<SvcValue> = (unsafe { LB_SVC.get(key) }).copied() else {
        return Pick::NotService;
    };
    if svc.count == 0 {
        count(reason::DROP_LB_NO_ENDPOINT);
        return Pick::NoEndpoint;
    }
    // SAFETY: plain helper call.
    let slot = unsafe { bpf_get_prandom_u32() } % svc.count;
    let k = BackendKey { id: svc.id, slot };
    // SAFETY: map values are only read.
    match unsafe { LB_BACKENDS.get(k) } {
        Some(b) => {
            count(reason::LB_SOCK);
            if let Some(n) = LB_STATS.get_ptr_mut(svc.id) {
                // SAFETY: a slot of an array map; concurrent CPUs add to it,
                // hence the atomic add (once per connection, not per packet).
                unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(n, 1) };
            }
            Pick::Backend(*b)
        }
        // A slot the agent is rewriting (it lowers the count first): as if
        // the Service had no endpoint for this one connection.
        None => {
            count(reason::DROP_LB_NO_ENDPOINT);
            Pick::NoEndpoint
        }
    }
}
