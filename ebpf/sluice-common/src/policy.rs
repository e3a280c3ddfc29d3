//! NetworkPolicy: what the agent compiles for each pod on the node and the
//! per-flow verdicts the programs keep.
//!
//! - `sl_pol_config` (index 0 -> [`PolicyConfig`]): whether policy is on, and
//!   in which mode. Off, the programs do nothing more than read this word.
//! - `sl_pol_pods` ([`IpKey`] of a pod here -> [`PolicyPod`]): whether the pod
//!   is isolated for ingress and egress, and its rule set. While policy is on,
//!   a pod here without an entry is *pending*: the agent has not compiled it
//!   yet, and its new flows are refused both ways (never open by accident).
//! - `sl_pol_rules` (LPM [`PolicyKey`] -> [`PolicyRules`]): per rule set and
//!   direction, the peer prefixes allowed and, for each, the ports.
//! - `sl_pol_ct` (LRU [`PolicyFlowKey`] -> [`PolicyFlow`]): the verdict of
//!   each flow seen at a pod with policy, both directions written at once, so
//!   the flow's later packets and its replies need one lookup.
//! - `sl_pol_hits` (per CPU, rule id -> flows): the new flows each compiled
//!   rule let in.
use crate::IpKey;

/// Index 0 of `sl_pol_config`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PolicyConfig {
    /// [`policy_flags`].
    pub flags: u32,
    pub _pad: u32,
}

/// Bits of [`PolicyConfig::flags`].
pub mod policy_flags {
    /// Policy is enforced: flows of pods with an entry in `sl_pol_pods` are
    /// checked, pods without one are pending.
    pub const ON: u32 = 1 << 0;
    /// Audit (dry run): a flow policy would refuse is counted and reported
    /// (`policy_audit_*`) and let through.
    pub const AUDIT: u32 = 1 << 1;
}

/// A pod's entry in `sl_pol_pods`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct PolicyPod {
    /// [`pod_policy`].
    pub flags: u32,
    /// The pod's rule set in `sl_pol_rules`. The agent never reuses an id
    /// for other rules, so a flow's verdict made under another set is stale.
    pub set: u32,
}

/// Bits of [`PolicyPod::flags`].
pub mod pod_policy {
    /// Some policy of type Ingress selects the pod.
    pub const INGRESS: u32 = 1 << 0;
    /// Some policy of type Egress selects the pod.
    pub const EGRESS: u32 = 1 << 1;
}

/// The two directions, as in [`PolicyKey::dir`] and [`PolicyFlowKey::dir`].
pub mod policy_dir {
    /// Into the pod: the peer is the source.
    pub const INGRESS: u8 = 0;
    /// Out of the pod: the peer is the destination.
    pub const EGRESS: u8 = 1;
}

/// Key of `sl_pol_rules` (LPM trie): `prefixlen` counts the bits after it,
/// so a key is `set` and `dir` in full ([`PolicyKey::FIXED_BITS`]) and then
/// `prefix` bits of the peer's address (an IPv4 prefix as IPv4-mapped IPv6:
/// 96 bits more than its length).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct PolicyKey {
    pub prefixlen: u32,
    pub set: u32,
    pub dir: u8,
    pub _pad: [u8; 3],
    pub peer: IpKey,
}

impl PolicyKey {
    /// Bits of `set`, `dir` and the padding.
    pub const FIXED_BITS: u32 = 64;

    /// The key that looks `peer` up (its whole address).
    #[inline(always)]
    pub const fn lookup(set: u32, dir: u8, peer: IpKey) -> Self {
        Self {
            prefixlen: Self::FIXED_BITS + 128,
            set,
            dir,
            _pad: [0; 3],
            peer,
        }
    }
}

/// Port ranges of one [`PolicyRules`] entry.
pub const MAX_PORT_RANGES: usize = 16;

/// One allowed protocol and port range, and the rule that allows it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct PortRange {
    /// IP protocol number; 0: any protocol and port (a rule without ports).
    pub proto: u8,
    pub _pad: u8,
    /// The rule's id (its counter in `sl_pol_hits`).
    pub rule: u16,
    /// First and last port, inclusive (the destination port, both ways).
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    /// Whether a flow of `proto` to `port` is in the range.
    #[inline(always)]
    pub const fn allows(&self, proto: u8, port: u16) -> bool {
        self.proto == 0 || (self.proto == proto && self.first <= port && port <= self.last)
    }
}

/// Value of `sl_pol_rules`: what a peer prefix may do. `count` 0 allows
/// nothing (an `except` inside an allowed block).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct PolicyRules {
    pub count: u32,
    pub ranges: [PortRange; MAX_PORT_RANGES],
}

/// Key of `sl_pol_ct`: a flow as its packet carries it, and the pod's side
/// of it (`dir`: [`policy_dir`], ingress at the destination pod, egress at
/// the source pod). ICMP and other protocols without ports have ports 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct PolicyFlowKey {
    pub src: IpKey,
    pub dst: IpKey,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub dir: u8,
    pub _pad: u16,
}

/// Value of `sl_pol_ct`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PolicyFlow {
    /// The pod's rule set when the flow was let in (see [`PolicyPod::set`]).
    pub set: u32,
    /// [`policy_flow`].
    pub flags: u32,
}

/// Bits of [`PolicyFlow::flags`].
pub mod policy_flow {
    /// The entry is the reverse of a flow let in: replies always pass.
    pub const REPLY: u32 = 1 << 0;
    /// Let in by audit mode, not by a rule.
    pub const AUDITED: u32 = 1 << 1;
}
