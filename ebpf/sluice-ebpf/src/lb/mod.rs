//! Kubernetes Services translated at the socket (the agent's Service mode,
//! instead of kube-proxy), as Cilium's socket-LB does: a `connect` or
//! `sendmsg` to a Service address and port is pointed at one of its
//! backends before any packet exists, so the packets are plain pod-to-pod
//! (or node-to-pod) ones on the fast path; `recvmsg` and `getpeername` show
//! the Service again. The hooks ([`sock`]) act in every network namespace
//! of the cgroup they are attached to (pods' too); the maps are
//! `sluice_common::lb`'s.
use core::intrinsics::{atomic_xadd, AtomicOrdering};

use aya_ebpf::{
    helpers::{bpf_get_netns_cookie, bpf_get_prandom_u32, bpf_ktime_get_ns},
    programs::SockAddrContext,
};
use sluice_common::{reason, Affinity, AffinityKey, Backend, BackendKey, SvcKey, SvcValue};

use crate::{
    counters::count,
    maps::{LB_AFFINITY, LB_BACKENDS, LB_STATS, LB_SVC},
};

pub mod packet;
pub mod reject;
pub mod sock;
pub mod uplink;
pub mod uplink6;

/// The socket's network namespace, as its cookie (session affinity's
/// client: the hooks run before the socket has a source address).
#[inline(always)]
fn netns(ctx: &SockAddrContext) -> u64 {
    // SAFETY: plain helper call on this program's context.
    unsafe { bpf_get_netns_cookie(ctx.sock_addr.cast()) }
}

/// What a connect to a frontend gets.
pub enum Pick {
    /// Not a Service: the socket is left alone.
    NotService,
    /// The Service has no endpoint (see `sock::no_endpoint`).
    NoEndpoint,
    /// This backend.
    Backend(Backend),
}

/// A backend of the Service at `key` for the socket of `ctx` (see
/// [`choose`]; the client is the socket's network namespace).
// A call of its own: its keys and values inlined into the hooks, with the
// event's call on top, passed the 512 bytes of stack a chain may use.
#[inline(never)]
pub fn pick(key: &SvcKey, ctx: &SockAddrContext) -> Pick {
    // SAFETY: map values are only read.
    let Some(svc): Option<SvcValue> = (unsafe { LB_SVC.get(key) }).copied() else {
        return Pick::NotService;
    };
    match choose(&svc, || netns(ctx)) {
        Some(b) => {
            count(reason::LB_SOCK);
            Pick::Backend(*b)
        }
        None => Pick::NoEndpoint,
    }
}

/// A backend of the Service port `svc` for `client` (called only with
/// session affinity): with affinity the one the client had while it keeps
/// coming back within the timeout (what its slot holds now), else one
/// picked at random among the slots (the agent keeps them dense). `None`:
/// no endpoint. Counted in the Service port's `sl_lb_stats`.
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "keys and values go to the map helpers by reference: a 40-byte value on a 512-byte stack"
)]
#[inline(always)]
pub fn choose(svc: &SvcValue, client: impl FnOnce() -> u64) -> Option<&'static Backend> {
    if svc.count == 0 {
        return None;
    }
    // The clock and the client only where affinity needs them.
    let (now, client) = if svc.affinity_secs == 0 {
        (0, 0)
    } else {
        // SAFETY: plain helper call.
        (unsafe { bpf_ktime_get_ns() }, client())
    };
    let aff = AffinityKey {
        netns_cookie: client,
        id: svc.id,
        _pad: 0,
    };
    // SAFETY: plain helper call.
    let mut slot = unsafe { bpf_get_prandom_u32() } % svc.count;
    if svc.affinity_secs != 0 {
        // SAFETY: map values are only read.
        if let Some(a) = unsafe { LB_AFFINITY.get(&aff) }.copied() {
            let fresh =
                now.saturating_sub(a.last_ns) < u64::from(svc.affinity_secs) * 1_000_000_000;
            // The agent keeps a backend in its slot while it stays (see
            // its `stable_order`); a slot rewritten holds another, which
            // the client then keeps.
            if fresh && a.slot < svc.count {
                slot = a.slot;
            }
        }
    }
    let k = BackendKey { id: svc.id, slot };
    // SAFETY: map values are only read. None: a slot the agent is
    // rewriting (it lowers the count first): as if the Service had no
    // endpoint for this one connection. (The value, not a copy: its
    // 16-byte address is copied a byte at a time, each to a stack slot.)
    let b = unsafe { LB_BACKENDS.get(k) }?;
    if svc.affinity_secs != 0 {
        let a = Affinity {
            last_ns: now,
            slot,
            _pad: 0,
            backend: *b,
            _pad2: 0,
        };
        let _ = LB_AFFINITY.insert(&aff, &a, 0);
    }
    if let Some(n) = LB_STATS.get_ptr_mut(svc.id) {
        // SAFETY: a slot of an array map; concurrent CPUs add to it, hence
        // the atomic add (once per connection, not per packet).
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(n, 1) };
    }
    Some(b)
}
