//! The registry of pinned maps: every map's name, kind and key/value sizes in
//! one place. The loader checks pinned maps against it (aya reuses a pinned map
//! by name without comparing its shape), `sluicectl status` lists it, and a
//! unit test of the plugin compares it with the maps of the built object. The
//! programs' `#[map(name = "...")]` attributes need literals, so the eBPF crate
//! spells each name once more; that test keeps the two in step.
use core::mem::size_of;

use crate::{
    Addr6, BwState, DatapathMeta, EdtSlot, Endpoint, EndpointInfo, EndpointStats, EpDropKey,
    FragEntry, FragKey, HostPortConfig, HpFlow, HpFlow6, IpKey, KernelFlow, KernelFlowKey,
    Masq6Config, MasqConfig, Nat6Entry, Nat6Key, Nat6Rev, NatEntry, NatKey, NatLimits, NatRev,
    NodeConfig, PortKey, PortKey6, PortTarget, PortTarget6, SlotStats, SockKey, SockKey6, SockOrig,
    SockOrig6,
};
use crate::{
    Affinity, AffinityKey, Backend, BackendKey, LbConfig, LbSockKey, LbSockOrig, SvcKey, SvcValue,
};
use crate::{PolicyConfig, PolicyFlow, PolicyFlowKey, PolicyKey, PolicyPod, PolicyRules};

/// The kernel map type of a pinned map (`BPF_MAP_TYPE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapKind {
    Hash,
    LruHash,
    PerCpuHash,
    Array,
    PerCpuArray,
    LpmTrie,
    RingBuf,
}

impl MapKind {
    /// The `BPF_MAP_TYPE_*` number (include/uapi/linux/bpf.h).
    pub const fn bpf_type(self) -> u32 {
        match self {
            Self::Hash => 1,
            Self::Array => 2,
            Self::PerCpuHash => 5,
            Self::PerCpuArray => 6,
            Self::LruHash => 9,
            Self::LpmTrie => 11,
            Self::RingBuf => 27,
        }
    }
}

/// One pinned map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSpec {
    /// Name in the object, in bpffs and in `bpftool map` (the kernel keeps 15
    /// characters).
    pub name: &'static str,
    pub kind: MapKind,
    /// Bytes (0 for a ring buffer, which has neither keys nor values).
    pub key_size: usize,
    pub value_size: usize,
}

const fn spec<K, V>(name: &'static str, kind: MapKind) -> MapSpec {
    MapSpec {
        name,
        kind,
        key_size: size_of::<K>(),
        value_size: size_of::<V>(),
    }
}

/// [`IpKey`] -> [`Endpoint`]: every pod address on this node.
pub const ENDPOINTS: MapSpec = spec::<IpKey, Endpoint>("sl_endpoints", MapKind::Hash);
/// Host veth ifindex -> [`EndpointStats`] (per CPU).
pub const ENDPOINT_STATS: MapSpec = spec::<u32, EndpointStats>("sl_ep_stats", MapKind::PerCpuHash);
/// Slot (`endpoint_flags::slot`) -> [`SlotStats`] (per CPU): the counters of
/// the endpoints that have a slot.
pub const ENDPOINT_SLOTS: MapSpec = spec::<u32, SlotStats>("sl_ep_slots", MapKind::PerCpuArray);
/// Host veth ifindex -> [`EndpointInfo`]: who owns the endpoint (userspace only).
pub const ENDPOINT_INFO: MapSpec = spec::<u32, EndpointInfo>("sl_ep_info", MapKind::Hash);
/// Index 0 -> [`DatapathMeta`].
pub const META: MapSpec = spec::<u32, DatapathMeta>("sl_meta", MapKind::Array);
/// [`crate::reason`] -> packets (per CPU).
pub const COUNTERS: MapSpec = spec::<u32, u64>("sl_counters", MapKind::PerCpuArray);
/// Index 0 -> [`NodeConfig`].
pub const CONFIG: MapSpec = spec::<u32, NodeConfig>("sl_config", MapKind::Array);
/// Index 0 -> [`MasqConfig`].
pub const MASQ: MapSpec = spec::<u32, MasqConfig>("sl_masq", MapKind::Array);
/// IPv4 prefix (LPM key: prefix length, address) -> 1: destinations never
/// masqueraded.
pub const NON_MASQ: MapSpec = spec::<(u32, [u8; 4]), u8>("sl_nonmasq", MapKind::LpmTrie);
/// Pod-side [`NatKey`] -> [`NatEntry`]: every masqueraded flow.
pub const NAT_FWD: MapSpec = spec::<NatKey, NatEntry>("sl_nat_fwd", MapKind::Hash);
/// Outside [`NatKey`] -> [`NatRev`]: how replies find the pod.
pub const NAT_REV: MapSpec = spec::<NatKey, NatRev>("sl_nat_rev", MapKind::Hash);
/// Index 0 -> [`Masq6Config`].
pub const MASQ6: MapSpec = spec::<u32, Masq6Config>("sl_masq6", MapKind::Array);
/// IPv6 prefix (LPM key) -> 1: IPv6 destinations never masqueraded.
pub const NON_MASQ6: MapSpec = spec::<(u32, [u8; 16]), u8>("sl_nonmasq6", MapKind::LpmTrie);
/// Pod-side [`Nat6Key`] -> [`Nat6Entry`]: every masqueraded IPv6 flow.
pub const NAT6_FWD: MapSpec = spec::<Nat6Key, Nat6Entry>("sl_nat6_fwd", MapKind::Hash);
/// Outside [`Nat6Key`] -> [`Nat6Rev`].
pub const NAT6_REV: MapSpec = spec::<Nat6Key, Nat6Rev>("sl_nat6_rev", MapKind::Hash);
/// (LRU) [`FragKey`] -> [`FragEntry`]: fragmented datagrams of translated flows.
pub const NAT_FRAG: MapSpec = spec::<FragKey, FragEntry>("sl_nat_frag", MapKind::LruHash);
/// [`PortKey`] -> [`PortTarget`]: hostPort mappings.
pub const PORTS: MapSpec = spec::<PortKey, PortTarget>("sl_ports", MapKind::Hash);
/// (LRU) [`NatKey`] as a packet from a pod carries it -> [`HpFlow`]: how
/// translated hostPort flows (replies, hairpin) are rewritten.
pub const HP_CT: MapSpec = spec::<NatKey, HpFlow>("sl_hp_ct", MapKind::LruHash);
/// IPv4 address -> 1: the node's addresses (what a wildcard mapping matches).
pub const NODE_ADDRS: MapSpec = spec::<[u8; 4], u8>("sl_node_addrs", MapKind::Hash);
/// (LRU) [`SockKey`] -> [`SockOrig`]: what node sockets asked for.
pub const HP_SOCK: MapSpec = spec::<SockKey, SockOrig>("sl_hp_sock", MapKind::LruHash);
/// [`PortKey6`] -> [`PortTarget6`]: IPv6 hostPort mappings.
pub const PORTS6: MapSpec = spec::<PortKey6, PortTarget6>("sl_ports6", MapKind::Hash);
/// (LRU) [`Nat6Key`] as a packet from a pod carries it -> [`HpFlow6`].
pub const HP_CT6: MapSpec = spec::<Nat6Key, HpFlow6>("sl_hp_ct6", MapKind::LruHash);
/// IPv6 address -> 1: the node's IPv6 addresses.
pub const NODE_ADDRS6: MapSpec = spec::<Addr6, u8>("sl_node_addrs6", MapKind::Hash);
/// (LRU) [`SockKey6`] -> [`SockOrig6`]: what node IPv6 sockets asked for.
pub const HP_SOCK6: MapSpec = spec::<SockKey6, SockOrig6>("sl_hp_sock6", MapKind::LruHash);
/// Index 0 -> [`HostPortConfig`].
pub const HP_CONFIG: MapSpec = spec::<u32, HostPortConfig>("sl_hp_config", MapKind::Array);
/// Host veth ifindex -> [`BwState`]: a pod's bandwidth limits and their buckets.
pub const BANDWIDTH: MapSpec = spec::<u32, BwState>("sl_bw", MapKind::Hash);
/// Host veth ifindex -> [`EdtSlot`]: pods whose egress is shaped by EDT.
pub const EDT: MapSpec = spec::<u32, EdtSlot>("sl_edt", MapKind::Hash);
/// Ring buffer of [`crate::Event`]s (drops, new flows) for `sluicectl monitor`.
pub const EVENTS: MapSpec = MapSpec {
    name: "sl_events",
    kind: MapKind::RingBuf,
    key_size: 0,
    value_size: 0,
};
/// [`crate::monitor_slot`] -> u64: whether events and debug lines are on.
pub const MONITOR: MapSpec = spec::<u32, u64>("sl_monitor", MapKind::Array);
/// [`EpDropKey`] -> packets (per CPU): drops per endpoint and reason.
pub const EP_DROPS: MapSpec = spec::<EpDropKey, u64>("sl_ep_drops", MapKind::PerCpuHash);
/// (LRU) socket cookie -> network namespace cookie: what `hp_learn4` saw, for
/// kernels without `SO_NETNS_COOKIE` (before 5.14).
pub const HP_LEARN: MapSpec = spec::<u64, u64>("sl_hp_learn", MapKind::LruHash);

/// [`crate::agent_slot`] -> u64: the node agent's leases (on sweeping the NAT
/// tables, while it holds it the in-kernel sweeper leaves them alone; on
/// keeping the node's addresses current) and its count of flows removed.
pub const AGENT: MapSpec = spec::<u32, u64>("sl_agent", MapKind::Array);

/// IPv4 prefix (LPM key) -> owners (bits): the Service ranges, whose traffic
/// from pods the node's stack translates (kube-proxy).
pub const SVC: MapSpec = spec::<(u32, [u8; 4]), u8>("sl_svc", MapKind::LpmTrie);
/// IPv6 prefix (LPM key) -> owners: the IPv6 Service ranges.
pub const SVC6: MapSpec = spec::<(u32, [u8; 16]), u8>("sl_svc6", MapKind::LpmTrie);
/// Index 0 -> fingerprint of the config's Service ranges (`serviceCIDRs`) in
/// the tries, so an ADD rewrites them only when they changed (userspace only).
pub const SVC_CONFIG: MapSpec = spec::<u32, u64>("sl_svc_config", MapKind::Array);
/// (LRU) [`KernelFlowKey`] -> [`KernelFlow`]: flows the node's stack
/// translates; every packet of them takes the stack's path.
pub const KFLOWS: MapSpec = spec::<KernelFlowKey, KernelFlow>("sl_kflows", MapKind::LruHash);
/// (LRU) [`FragKey`] -> `bpf_ktime_get_ns` of the first fragment: IPv4
/// datagrams of kernel flows whose later fragments follow the first to the
/// stack.
pub const KFLOW_FRAG: MapSpec = spec::<FragKey, u64>("sl_kflow_frag", MapKind::LruHash);
/// [`SvcKey`] -> [`SvcValue`]: the frontends of the Services Sluice
/// translates (the agent's Service mode; see `lb`).
pub const LB_SVC: MapSpec = spec::<SvcKey, SvcValue>("sl_lb_svc", MapKind::Hash);
/// [`BackendKey`] -> [`Backend`]: each Service port's backends by slot.
pub const LB_BACKENDS: MapSpec = spec::<BackendKey, Backend>("sl_lb_be", MapKind::Hash);
/// (LRU) [`LbSockKey`] -> [`LbSockOrig`]: sockets the hooks pointed at a
/// backend, and the Service address they asked for.
pub const LB_SOCK: MapSpec = spec::<LbSockKey, LbSockOrig>("sl_lb_sock", MapKind::LruHash);
/// (LRU) [`AffinityKey`] -> [`Affinity`]: the backend each client of a
/// Service port with `sessionAffinity: ClientIP` keeps.
pub const LB_AFFINITY: MapSpec = spec::<AffinityKey, Affinity>("sl_lb_affinity", MapKind::LruHash);
/// Service port id -> translations at the socket (connections, and datagrams
/// of unconnected UDP), added to atomically: once per connection, not per
/// packet, and an array per CPU would be 512 KiB per CPU.
pub const LB_STATS: MapSpec = spec::<u32, u64>("sl_lb_stats", MapKind::Array);
/// Index 0 -> [`LbConfig`]: the node's network namespace and whether any
/// NodePort frontend exists.
pub const LB_CONFIG: MapSpec = spec::<u32, LbConfig>("sl_lb_cfg", MapKind::Array);
/// [`NatKey`] -> [`HpFlow`]: the flows from the uplink to a Service
/// (NodePort, external IP, load balancer IP), each in both directions: the
/// client's packets to the backend it was given, the backend's replies back
/// to the Service address (LRU, like `sl_hp_ct`).
pub const LB_CT: MapSpec = spec::<NatKey, HpFlow>("sl_lb_ct", MapKind::LruHash);
/// [`Nat6Key`] -> [`HpFlow6`]: [`LB_CT`] for IPv6.
pub const LB_CT6: MapSpec = spec::<Nat6Key, HpFlow6>("sl_lb_ct6", MapKind::LruHash);
/// Index 0 -> [`PolicyConfig`]: NetworkPolicy on or off, and audit.
pub const POL_CONFIG: MapSpec = spec::<u32, PolicyConfig>("sl_pol_config", MapKind::Array);
/// Pod address -> [`PolicyPod`]: the pods here the agent compiled.
pub const POL_PODS: MapSpec = spec::<IpKey, PolicyPod>("sl_pol_pods", MapKind::Hash);
/// (LPM) [`PolicyKey`] -> [`PolicyRules`]: each rule set's allowed peers.
pub const POL_RULES: MapSpec = spec::<PolicyKey, PolicyRules>("sl_pol_rules", MapKind::LpmTrie);
/// (LRU) [`PolicyFlowKey`] -> [`PolicyFlow`]: flows let in, both ways.
pub const POL_CT: MapSpec = spec::<PolicyFlowKey, PolicyFlow>("sl_pol_ct", MapKind::LruHash);
/// Rule id -> new flows it let in (per CPU).
pub const POL_HITS: MapSpec = spec::<u32, u64>("sl_pol_hits", MapKind::PerCpuArray);
/// Index 0 -> [`NatLimits`]: eviction, the per-pod share, the unreplied UDP
/// timeout.
pub const NAT_LIMITS: MapSpec = spec::<u32, NatLimits>("sl_nat_limits", MapKind::Array);
/// Slot -> the pod-side key of a recent IPv4 flow (a ring of `natMaxFlows`
/// slots): where a full table looks for a flow to evict.
pub const NAT_RING: MapSpec = spec::<u32, NatKey>("sl_nat_ring", MapKind::Array);
/// Slot -> the pod-side key of a recent IPv6 flow.
pub const NAT6_RING: MapSpec = spec::<u32, Nat6Key>("sl_nat6_ring", MapKind::Array);
/// [`nat_cursor`] -> each family's ring position and eviction hand.
pub const NAT_CURSOR: MapSpec = spec::<u32, u64>("sl_nat_cursor", MapKind::Array);
/// Pod host veth ifindex -> the flows (both families) it holds; the node
/// agent recounts it every sweep.
pub const NAT_PODS: MapSpec = spec::<u32, u64>("sl_nat_pods", MapKind::Hash);

/// Every pinned map. (`sl_scratch`, a per-CPU note from a drop site to its
/// program's exit, is not pinned and not here.)
pub const ALL: [MapSpec; 55] = [
    ENDPOINTS,
    ENDPOINT_STATS,
    ENDPOINT_SLOTS,
    ENDPOINT_INFO,
    META,
    COUNTERS,
    CONFIG,
    MASQ,
    NON_MASQ,
    NAT_FWD,
    NAT_REV,
    NAT_FRAG,
    PORTS,
    HP_CT,
    NODE_ADDRS,
    HP_SOCK,
    HP_CONFIG,
    BANDWIDTH,
    EVENTS,
    MONITOR,
    EP_DROPS,
    HP_LEARN,
    EDT,
    MASQ6,
    NON_MASQ6,
    NAT6_FWD,
    NAT6_REV,
    PORTS6,
    HP_CT6,
    NODE_ADDRS6,
    HP_SOCK6,
    AGENT,
    SVC,
    SVC6,
    SVC_CONFIG,
    KFLOWS,
    KFLOW_FRAG,
    NAT_LIMITS,
    NAT_RING,
    NAT6_RING,
    NAT_CURSOR,
    NAT_PODS,
    LB_SVC,
    LB_BACKENDS,
    LB_SOCK,
    LB_STATS,
    LB_AFFINITY,
    LB_CONFIG,
    LB_CT,
    LB_CT6,
    POL_CONFIG,
    POL_PODS,
    POL_RULES,
    POL_CT,
    POL_HITS,
];

/// The map names, for code that wants a name only.
pub mod map_names {
    pub const ENDPOINTS: &str = super::ENDPOINTS.name;
    pub const ENDPOINT_STATS: &str = super::ENDPOINT_STATS.name;
    pub const ENDPOINT_SLOTS: &str = super::ENDPOINT_SLOTS.name;
    pub const ENDPOINT_INFO: &str = super::ENDPOINT_INFO.name;
    pub const META: &str = super::META.name;
    pub const COUNTERS: &str = super::COUNTERS.name;
    pub const CONFIG: &str = super::CONFIG.name;
    pub const MASQ: &str = super::MASQ.name;
    pub const NON_MASQ: &str = super::NON_MASQ.name;
    pub const NAT_FWD: &str = super::NAT_FWD.name;
    pub const NAT_REV: &str = super::NAT_REV.name;
    pub const NAT_FRAG: &str = super::NAT_FRAG.name;
    pub const PORTS: &str = super::PORTS.name;
    pub const HP_CT: &str = super::HP_CT.name;
    pub const NODE_ADDRS: &str = super::NODE_ADDRS.name;
    pub const HP_SOCK: &str = super::HP_SOCK.name;
    pub const HP_CONFIG: &str = super::HP_CONFIG.name;
    pub const BANDWIDTH: &str = super::BANDWIDTH.name;
    pub const EVENTS: &str = super::EVENTS.name;
    pub const MONITOR: &str = super::MONITOR.name;
    pub const EP_DROPS: &str = super::EP_DROPS.name;
    pub const HP_LEARN: &str = super::HP_LEARN.name;
    pub const EDT: &str = super::EDT.name;
    pub const MASQ6: &str = super::MASQ6.name;
    pub const NON_MASQ6: &str = super::NON_MASQ6.name;
    pub const NAT6_FWD: &str = super::NAT6_FWD.name;
    pub const NAT6_REV: &str = super::NAT6_REV.name;
    pub const PORTS6: &str = super::PORTS6.name;
    pub const HP_CT6: &str = super::HP_CT6.name;
    pub const NODE_ADDRS6: &str = super::NODE_ADDRS6.name;
    pub const HP_SOCK6: &str = super::HP_SOCK6.name;
    pub const AGENT: &str = super::AGENT.name;
    pub const SVC: &str = super::SVC.name;
    pub const SVC6: &str = super::SVC6.name;
    pub const SVC_CONFIG: &str = super::SVC_CONFIG.name;
    pub const KFLOWS: &str = super::KFLOWS.name;
    pub const KFLOW_FRAG: &str = super::KFLOW_FRAG.name;
    pub const NAT_LIMITS: &str = super::NAT_LIMITS.name;
    pub const NAT_RING: &str = super::NAT_RING.name;
    pub const NAT6_RING: &str = super::NAT6_RING.name;
    pub const NAT_CURSOR: &str = super::NAT_CURSOR.name;
    pub const NAT_PODS: &str = super::NAT_PODS.name;
    pub const LB_SVC: &str = super::LB_SVC.name;
    pub const LB_BACKENDS: &str = super::LB_BACKENDS.name;
    pub const LB_SOCK: &str = super::LB_SOCK.name;
    pub const LB_STATS: &str = super::LB_STATS.name;
    pub const LB_AFFINITY: &str = super::LB_AFFINITY.name;
    pub const LB_CONFIG: &str = super::LB_CONFIG.name;
    pub const LB_CT: &str = super::LB_CT.name;
    pub const LB_CT6: &str = super::LB_CT6.name;
    pub const POL_CONFIG: &str = super::POL_CONFIG.name;
    pub const POL_PODS: &str = super::POL_PODS.name;
    pub const POL_RULES: &str = super::POL_RULES.name;
    pub const POL_CT: &str = super::POL_CT.name;
    pub const POL_HITS: &str = super::POL_HITS.name;
    /// Per-CPU scratch: the flow being checked against policy (not pinned).
    pub const POL_STEP: &str = "sl_pol_step";
    /// Per-CPU scratch: the reason and endpoint of the packet being dropped,
    /// handed from the drop site to the program's exit (not pinned).
    pub const SCRATCH: &str = "sl_scratch";
    /// Per-CPU scratch: a leaving IPv6 packet between the steps of its
    /// masquerade (not pinned).
    pub const SCRATCH6: &str = "sl_scratch6";
    /// Per-CPU scratch: an IPv6 packet between the steps of its hostPort
    /// translation (not pinned).
    pub const HP_SCRATCH6: &str = "sl_hp_scratch6";
    /// Per-CPU scratch: the kernel flow key being looked up (not pinned).
    pub const KFLOW_KEY: &str = "sl_kflow_key";
    /// Not pinned: an eviction's event on its way to the ring.
    pub const EVICT_NOTE: &str = "sl_evict_note";
    /// Per-CPU scratch: the port unreachable a Service without endpoints
    /// answers with, being built (not pinned).
    pub const LB_REJECT: &str = "sl_lb_reject";
    /// Per-CPU scratch: a packet from the uplink between the steps of its
    /// Service translation (not pinned).
    pub const LB_STEP: &str = "sl_lb_step";
    /// Per-CPU scratch: the FIB lookup of a Service flow XDP sends back out
    /// of the uplink (not pinned).
    pub const LB_FIB: &str = "sl_lb_fib";
}

/// Default sizes of the maps (entries).
pub mod map_sizes {
    pub const ENDPOINTS: u32 = 16_384;
    pub const ENDPOINT_STATS: u32 = 8_192;
    /// Endpoints with a counter slot (more pods than this count by ifindex):
    /// 80 KB per CPU.
    pub const ENDPOINT_SLOTS: u32 = 2_048;
    pub const ENDPOINT_INFO: u32 = 8_192;
    /// Default NAT flows (each map); config `natMaxFlows` changes it at load.
    pub const NAT_FLOWS: u32 = 65_536;
    pub const NON_MASQ: u32 = 256;
    /// Fragmented datagrams in flight (LRU: the oldest make room).
    pub const NAT_FRAGS: u32 = 8_192;
    /// hostPort mappings of the node (10,000 at least).
    pub const PORTS: u32 = 65_536;
    /// Translated hostPort flows (LRU, like Cilium's conntrack maps).
    pub const HP_CT: u32 = 65_536;
    pub const NODE_ADDRS: u32 = 256;
    pub const HP_SOCK: u32 = 16_384;
    /// IPv6 hostPort mappings, flows and sockets: fewer than IPv4's (each
    /// entry is larger and preallocated).
    pub const PORTS6: u32 = 16_384;
    pub const HP_CT6: u32 = 32_768;
    pub const HP_SOCK6: u32 = 8_192;
    /// Pods with bandwidth limits (and with EDT egress).
    pub const BANDWIDTH: u32 = 8_192;
    /// (endpoint, drop reason) pairs with a count.
    pub const EP_DROPS: u32 = 16_384;
    /// Netns cookies learned (a few at a time, LRU).
    pub const HP_LEARN: u32 = 64;
    /// Service prefixes of each family: the ranges, and one address per
    /// externalIP and load balancer IP the agent adds.
    pub const SVC: u32 = 16_384;
    /// Default kernel flows; config `natMaxFlows` sizes it with the NAT maps.
    pub const KFLOWS: u32 = 65_536;
    /// Fragmented datagrams of kernel flows in flight (LRU).
    pub const KFLOW_FRAG: u32 = 1_024;
    /// Pods with a flow count (`sl_nat_pods`).
    pub const NAT_PODS: u32 = 8_192;
    /// Service frontends (address, port, protocol): 10,000 Services with
    /// two ports in two families, and room.
    pub const LB_SVC: u32 = 65_536;
    /// Backend slots: 100,000 endpoints with two ports, and room.
    pub const LB_BACKENDS: u32 = 262_144;
    /// Sockets pointed at a backend, whose peer shows as the Service (LRU).
    pub const LB_SOCK: u32 = 65_536;
    /// Service port ids (`SvcValue::id` is below it).
    pub const LB_STATS: u32 = 65_536;
    /// Clients with session affinity to a Service port (LRU).
    pub const LB_AFFINITY: u32 = 65_536;
    /// Flows from the uplink to Services, two entries each (the default;
    /// config `natMaxFlows` sizes it: twice that many entries).
    pub const LB_CT: u32 = 131_072;
    /// IPv6 flows from the uplink to Services, two entries each (as
    /// [`LB_CT`]).
    pub const LB_CT6: u32 = 131_072;
    /// Pod addresses with policy (two per dual-stack pod).
    pub const POL_PODS: u32 = 8_192;
    /// Compiled (rule set, direction, peer prefix) entries: 1,000 rules for
    /// each of many distinct sets.
    pub const POL_RULES: u32 = 131_072;
    /// Flows of pods with policy, two entries each (LRU).
    pub const POL_CT: u32 = 131_072;
    /// Compiled rule ids (`PortRange::rule` is a u16).
    pub const POL_HITS: u32 = 65_536;
    /// Bytes of the event ring buffer (a power of two, a multiple of the page size).
    pub const EVENTS_BYTES: u32 = 256 * 1024;
}

/// The registry entry of map `name`.
pub fn find(name: &str) -> Option<&'static MapSpec> {
    ALL.iter().find(|m| m.name.as_bytes() == name.as_bytes())
}
