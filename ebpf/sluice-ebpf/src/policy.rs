//! NetworkPolicy: each new flow of a pod the agent compiled policy for is
//! checked once, at the pod's side of it (egress in `from_pod`, ingress
//! where the packet is delivered into the pod: `from_pod`'s local delivery,
//! `uplink_in`, `to_pod`), and its verdict kept in `sl_pol_ct` for both
//! directions: the flow's later packets and its replies pass on one lookup.
//! Pods no policy selects (flags 0) pay one `sl_pol_pods` lookup and no
//! flow entry; with policy off (`sl_pol_config`), one array read.
//!
//! The verdict names the pod's rule set; the agent gives changed rules a new
//! set id, so a flow let in under the old rules is checked again at its next
//! packet (a policy that tightens cuts open flows it no longer allows).
//! Reply entries pass while they exist.
//!
//! See `sluice_common::policy` for the maps.
use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, TC_ACT_SHOT},
    macros::map,
    maps::{lpm_trie::Key, Array, HashMap, LpmTrie, LruHashMap, PerCpuArray},
    programs::TcContext,
};
use sluice_common::{
    map_sizes, pod_policy, policy_dir, policy_flags, policy_flow, reason, IpKey, PolicyConfig,
    PolicyFlow, PolicyFlowKey, PolicyKey, PolicyPod, PolicyRules, MAX_PORT_RANGES,
};

use crate::{
    counters::count,
    events::note_drop,
    maps::ENDPOINTS,
    packet::read,
    proto::{
        ETH_LEN, ETH_P_IPV6_BE, ETH_P_IP_BE, IP6_DST_OFF, IP6_L4_OFF, IP6_SRC_OFF, PROTO_ICMPV6,
        PROTO_SCTP, PROTO_TCP, PROTO_UDP, TCP_ACK, TCP_SYN,
    },
};

#[map(name = "sl_pol_config")]
static CONFIG: Array<PolicyConfig> = Array::pinned(1, 0);

#[map(name = "sl_pol_pods")]
static PODS: HashMap<IpKey, PolicyPod> = HashMap::pinned(map_sizes::POL_PODS, BPF_F_NO_PREALLOC);

#[map(name = "sl_pol_rules")]
static RULES: LpmTrie<[u8; 24], PolicyRules> =
    LpmTrie::pinned(map_sizes::POL_RULES, BPF_F_NO_PREALLOC);

#[map(name = "sl_pol_ct")]
static FLOWS: LruHashMap<PolicyFlowKey, PolicyFlow> = LruHashMap::pinned(map_sizes::POL_CT, 0);

#[map(name = "sl_pol_hits")]
static HITS: PerCpuArray<u64> = PerCpuArray::pinned(map_sizes::POL_HITS, 0);

/// The flow being checked, off the stack (the callers' frames are large).
#[repr(C)]
pub struct Step {
    flow: PolicyFlowKey,
    rules: PolicyKey,
    /// The packet opens its flow: a TCP SYN without ACK, or any packet of
    /// another protocol (no state to tell). Only then is the reverse kept as
    /// the flow's replies: a packet mid-way through a TCP connection (the
    /// pod's ACK of a connection a tightened policy now refuses) must not
    /// open the way back for the other side.
    opens: bool,
}

/// Not pinned: [`Step`] per CPU.
#[map(name = "sl_pol_step")]
static STEP: PerCpuArray<Step> = PerCpuArray::with_max_entries(1, 0);

/// What [`check`] returns to go on.
pub const PASS: i32 = 0;

/// Whether NetworkPolicy is on; off, nothing else here runs.
#[inline(always)]
pub fn on() -> bool {
    CONFIG
        .get(0)
        .is_some_and(|c| c.flags & policy_flags::ON != 0)
}

/// XDP: whether a packet may go into the pod at `pod` from XDP: policy
/// off, or the pod without policy. Otherwise tc delivers it, after
/// [`check`] (which also keeps the flow for the pod's replies).
#[inline(always)]
pub fn xdp_may_deliver(pod: &IpKey) -> bool {
    if !on() {
        return true;
    }
    // SAFETY: the map value is only read.
    unsafe { PODS.get(pod) }.is_some_and(|p| p.flags == 0)
}

/// Checks the packet against the policy of the pod on its `dir` side
/// ([`policy_dir`]): the source for egress, the destination for ingress.
/// `pod_ifindex`: that pod's host device (its drop counter); 0 for
/// "look it up": a packet not to a pod here then passes. [`PASS`], or
/// [`TC_ACT_SHOT`] with the drop noted.
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "keys go to the map helpers by reference, not copied onto the stack"
)]
#[inline(never)]
pub fn check(ctx: &TcContext, dir: u32, pod_ifindex: u32) -> i32 {
    let Some(step) = STEP.get_ptr_mut(0) else {
        return PASS;
    };
    // SAFETY: this CPU's slot, used only while this program runs.
    let step = unsafe { &mut *step };
    if !fill(ctx, step) {
        return PASS;
    }
    step.flow.dir = dir as u8;
    let ingress = dir == u32::from(policy_dir::INGRESS);
    let pod = if ingress {
        &step.flow.dst
    } else {
        &step.flow.src
    };
    let mut pod_ifindex = pod_ifindex;
    if pod_ifindex == 0 {
        // SAFETY: the map value is only read.
        match unsafe { ENDPOINTS.get(pod) } {
            Some(ep) => pod_ifindex = ep.ifindex,
            None => return PASS,
        }
    }
    // SAFETY: the map value is only read.
    let Some(p) = (unsafe { PODS.get(pod) }) else {
        // Pending: the agent has not compiled this pod yet.
        note_drop(reason::DROP_POLICY_PENDING, pod_ifindex);
        return TC_ACT_SHOT;
    };
    if p.flags == 0 {
        return PASS;
    }
    let set = p.set;
    let isolated = p.flags
        & if ingress {
            pod_policy::INGRESS
        } else {
            pod_policy::EGRESS
        };
    // SAFETY: the map value is only read.
    if let Some(f) = unsafe { FLOWS.get(&step.flow) } {
        if f.flags & policy_flow::REPLY != 0 || f.set == set {
            return PASS;
        }
    }
    let allowed = isolated == 0 || allows(step, set, ingress);
    if allowed {
        count(reason::POLICY_NEW);
        record(step, set, 0);
        return PASS;
    }
    let audit = CONFIG
        .get(0)
        .is_some_and(|c| c.flags & policy_flags::AUDIT != 0);
    if audit {
        let r = if ingress {
            reason::POLICY_AUDIT_INGRESS
        } else {
            reason::POLICY_AUDIT_EGRESS
        };
        count(r);
        crate::events::policy_audit(&step.flow, r, pod_ifindex);
        record(step, set, policy_flow::AUDITED);
        return PASS;
    }
    note_drop(
        if ingress {
            reason::DROP_POLICY_INGRESS
        } else {
            reason::DROP_POLICY_EGRESS
        },
        pod_ifindex,
    );
    TC_ACT_SHOT
}

/// Whether a rule of `set` lets the flow in; counts the rule.
#[inline(always)]
fn allows(step: &mut Step, set: u32, ingress: bool) -> bool {
    let peer = if ingress {
        step.flow.src
    } else {
        step.flow.dst
    };
    let k = &mut step.rules;
    k.prefixlen = PolicyKey::FIXED_BITS + 128;
    k.set = set;
    // `dir` and the padding as one word: zeroing the three bytes on their
    // own became a call to bpf-linker's memset, a frame more in the chain.
    // SAFETY: `dir` starts a 4-byte aligned word of the key (after two
    // u32), which the padding fills.
    unsafe { *core::ptr::addr_of_mut!(k.dir).cast::<u32>() = u32::from(step.flow.dir).to_le() };
    k.peer = peer;
    // SAFETY: PolicyKey is repr(C): prefixlen, then 24 bytes of data, as
    // LpmTrie's Key<[u8; 24]> lays them out.
    let key: &Key<[u8; 24]> = unsafe { &*(core::ptr::from_ref(&step.rules).cast()) };
    let Some(r) = RULES.get(key) else {
        return false;
    };
    let (proto, port) = (step.flow.proto, step.flow.dport);
    let n = r.count as usize;
    for i in 0..MAX_PORT_RANGES {
        if i >= n {
            break;
        }
        let range = &r.ranges[i];
        if range.allows(proto, port) {
            if let Some(h) = HITS.get_ptr_mut(u32::from(range.rule)) {
                // SAFETY: per-CPU slot.
                unsafe { *h += 1 };
            }
            return true;
        }
    }
    false
}

/// Keeps the verdict for the flow and, when the packet opens it, for its
/// replies.
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "keys go to the map helpers by reference, not copied onto the stack"
)]
#[inline(always)]
fn record(step: &mut Step, set: u32, flags: u32) {
    let f = PolicyFlow { set, flags };
    let _ = FLOWS.insert(&step.flow, &f, 0);
    if !step.opens {
        return;
    }
    let k = &mut step.flow;
    core::mem::swap(&mut k.src, &mut k.dst);
    core::mem::swap(&mut k.sport, &mut k.dport);
    k.dir ^= 1;
    let r = PolicyFlow {
        set,
        flags: flags | policy_flow::REPLY,
    };
    let _ = FLOWS.insert(k, &r, 0);
}

/// The flow of an IP packet into `k` (ports in host order; 0 for protocols
/// without them). False for what policy does not look at: not IP, and IPv6
/// neighbour discovery (RFC 4861 types 133-137), which NetworkPolicy does
/// not cover.
#[inline(always)]
fn fill(ctx: &TcContext, step: &mut Step) -> bool {
    step.opens = true;
    let k = &mut step.flow;
    let Ok(ether) = read::<u16>(ctx, 12) else {
        return false;
    };
    let l4_off;
    if ether == ETH_P_IP_BE {
        let Ok(vihl) = read::<[u8; 2]>(ctx, ETH_LEN) else {
            return false;
        };
        let Ok(frag) = read::<[u8; 2]>(ctx, ETH_LEN + 6) else {
            return false;
        };
        let Ok(proto) = read::<[u8; 2]>(ctx, ETH_LEN + 8) else {
            return false;
        };
        let Ok(src) = read::<[u8; 4]>(ctx, ETH_LEN + 12) else {
            return false;
        };
        let Ok(dst) = read::<[u8; 4]>(ctx, ETH_LEN + 16) else {
            return false;
        };
        k.src = IpKey::v4(src);
        k.dst = IpKey::v4(dst);
        k.proto = proto[1];
        // A later fragment has no ports: it is checked as the protocol alone
        // (and opens nothing).
        if u16::from_be_bytes(frag) & 0x1fff != 0 {
            step.opens = false;
            k.sport = 0;
            k.dport = 0;
            return true;
        }
        l4_off = ETH_LEN + usize::from(vihl[0] & 0x0f) * 4;
    } else if ether == ETH_P_IPV6_BE {
        let Ok(nh) = read::<[u8; 2]>(ctx, ETH_LEN + 6) else {
            return false;
        };
        let Ok(src) = read::<[u8; 16]>(ctx, IP6_SRC_OFF) else {
            return false;
        };
        let Ok(dst) = read::<[u8; 16]>(ctx, IP6_DST_OFF) else {
            return false;
        };
        k.src = IpKey::v6(src);
        k.dst = IpKey::v6(dst);
        k.proto = nh[0];
        l4_off = IP6_L4_OFF;
        if k.proto == PROTO_ICMPV6 {
            let Ok(t) = read::<[u8; 2]>(ctx, l4_off) else {
                return false;
            };
            if (133..=137).contains(&t[0]) {
                return false;
            }
        }
    } else {
        return false;
    }
    k.sport = 0;
    k.dport = 0;
    if matches!(k.proto, PROTO_TCP | PROTO_UDP | PROTO_SCTP) {
        if let Ok(ports) = read::<[u8; 4]>(ctx, l4_off) {
            k.sport = u16::from_be_bytes([ports[0], ports[1]]);
            k.dport = u16::from_be_bytes([ports[2], ports[3]]);
        }
    }
    if k.proto == PROTO_TCP {
        // Byte 13 of the TCP header: the flags.
        step.opens =
            read::<[u8; 2]>(ctx, l4_off + 12).is_ok_and(|f| f[1] & (TCP_SYN | TCP_ACK) == TCP_SYN);
    }
    true
}
