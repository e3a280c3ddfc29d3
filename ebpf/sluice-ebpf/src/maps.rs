//! The pinned maps. Names and value types come from `sluice-common`; every map is
//! pinned by name so that a later load (and `sluicectl`) finds the same map.
use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    macros::map,
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
use sluice_common::{
    agent_slot, map_sizes, monitor_slot, nat_cursor, reason, Addr6, BwState, DatapathMeta,
    DropNote, EdtSlot, Endpoint, EndpointInfo, EndpointStats, EpDropKey, FragEntry, FragKey,
    HostPortConfig, HpFlow, HpFlow6, IpKey, KernelFlow, KernelFlowKey, Masq6Config, MasqConfig,
    Nat6Entry, Nat6Key, Nat6Rev, NatEntry, NatKey, NatLimits, NatRev, NodeConfig, PortKey,
    PortKey6, PortTarget, PortTarget6, SlotStats, SockKey, SockKey6, SockOrig, SockOrig6,
};
use sluice_common::{
    Affinity, AffinityKey, Backend, BackendKey, LbConfig, LbSockKey, LbSockOrig, SvcKey, SvcValue,
};

#[map(name = "sl_endpoints")]
pub static ENDPOINTS: HashMap<IpKey, Endpoint> = HashMap::pinned(map_sizes::ENDPOINTS, 0);

#[map(name = "sl_ep_stats")]
pub static ENDPOINT_STATS: PerCpuHashMap<u32, EndpointStats> =
    PerCpuHashMap::pinned(map_sizes::ENDPOINT_STATS, 0);

#[map(name = "sl_ep_slots")]
pub static ENDPOINT_SLOTS: PerCpuArray<SlotStats> =
    PerCpuArray::pinned(map_sizes::ENDPOINT_SLOTS, 0);

/// Written by userspace only; declared here so that one object defines every map.
#[map(name = "sl_ep_info")]
pub static ENDPOINT_INFO: HashMap<u32, EndpointInfo> = HashMap::pinned(map_sizes::ENDPOINT_INFO, 0);

#[map(name = "sl_meta")]
pub static META: Array<DatapathMeta> = Array::pinned(1, 0);

#[map(name = "sl_counters")]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::pinned(reason::MAX, 0);

#[map(name = "sl_config")]
pub static CONFIG: Array<NodeConfig> = Array::pinned(1, 0);

#[map(name = "sl_masq")]
pub static MASQ: Array<MasqConfig> = Array::pinned(1, 0);

/// LPM tries must be created without preallocation (BPF_F_NO_PREALLOC).
#[map(name = "sl_nonmasq")]
pub static NON_MASQ: LpmTrie<[u8; 4], u8> = LpmTrie::pinned(map_sizes::NON_MASQ, BPF_F_NO_PREALLOC);

#[map(name = "sl_nat_fwd")]
pub static NAT_FWD: HashMap<NatKey, NatEntry> = HashMap::pinned(map_sizes::NAT_FLOWS, 0);

#[map(name = "sl_nat_rev")]
pub static NAT_REV: HashMap<NatKey, NatRev> = HashMap::pinned(map_sizes::NAT_FLOWS, 0);

#[map(name = "sl_masq6")]
pub static MASQ6: Array<Masq6Config> = Array::pinned(1, 0);

#[map(name = "sl_nonmasq6")]
pub static NON_MASQ6: LpmTrie<[u8; 16], u8> =
    LpmTrie::pinned(map_sizes::NON_MASQ, BPF_F_NO_PREALLOC);

#[map(name = "sl_nat6_fwd")]
pub static NAT6_FWD: HashMap<Nat6Key, Nat6Entry> = HashMap::pinned(map_sizes::NAT_FLOWS, 0);

#[map(name = "sl_nat6_rev")]
pub static NAT6_REV: HashMap<Nat6Key, Nat6Rev> = HashMap::pinned(map_sizes::NAT_FLOWS, 0);

#[map(name = "sl_nat_frag")]
pub static NAT_FRAG: LruHashMap<FragKey, FragEntry> = LruHashMap::pinned(map_sizes::NAT_FRAGS, 0);

#[map(name = "sl_ports")]
pub static PORTS: HashMap<PortKey, PortTarget> = HashMap::pinned(map_sizes::PORTS, 0);

#[map(name = "sl_hp_ct")]
pub static HP_CT: LruHashMap<NatKey, HpFlow> = LruHashMap::pinned(map_sizes::HP_CT, 0);

#[map(name = "sl_node_addrs")]
pub static NODE_ADDRS: HashMap<[u8; 4], u8> = HashMap::pinned(map_sizes::NODE_ADDRS, 0);

#[map(name = "sl_hp_sock")]
pub static HP_SOCK: LruHashMap<SockKey, SockOrig> = LruHashMap::pinned(map_sizes::HP_SOCK, 0);

#[map(name = "sl_ports6")]
pub static PORTS6: HashMap<PortKey6, PortTarget6> = HashMap::pinned(map_sizes::PORTS6, 0);

#[map(name = "sl_hp_ct6")]
pub static HP_CT6: LruHashMap<Nat6Key, HpFlow6> = LruHashMap::pinned(map_sizes::HP_CT6, 0);

#[map(name = "sl_node_addrs6")]
pub static NODE_ADDRS6: HashMap<Addr6, u8> = HashMap::pinned(map_sizes::NODE_ADDRS, 0);

#[map(name = "sl_hp_sock6")]
pub static HP_SOCK6: LruHashMap<SockKey6, SockOrig6> = LruHashMap::pinned(map_sizes::HP_SOCK6, 0);

#[map(name = "sl_hp_config")]
pub static HP_CONFIG: Array<HostPortConfig> = Array::pinned(1, 0);

#[map(name = "sl_bw")]
pub static BANDWIDTH: HashMap<u32, BwState> = HashMap::pinned(map_sizes::BANDWIDTH, 0);

/// Pods whose egress EDT shapes (see `edt`); written by userspace at ADD.
#[map(name = "sl_edt")]
pub static EDT: HashMap<u32, EdtSlot> = HashMap::pinned(map_sizes::BANDWIDTH, 0);

/// Drops and new flows for `sluicectl monitor` (see `events`).
#[map(name = "sl_events")]
pub static EVENTS: RingBuf = RingBuf::pinned(map_sizes::EVENTS_BYTES, 0);

#[map(name = "sl_monitor")]
pub static MONITOR: Array<u64> = Array::pinned(monitor_slot::MAX, 0);

/// The node agent's leases (the sweep's: see `nat::sweep`); written by `sluice-node`.
#[map(name = "sl_agent")]
pub static AGENT: Array<u64> = Array::pinned(agent_slot::MAX, 0);

/// Inserted on an endpoint's first drop of a reason, hence no preallocation.
#[map(name = "sl_ep_drops")]
pub static EP_DROPS: PerCpuHashMap<EpDropKey, u64> =
    PerCpuHashMap::pinned(map_sizes::EP_DROPS, BPF_F_NO_PREALLOC);

#[map(name = "sl_hp_learn")]
pub static HP_LEARN: LruHashMap<u64, u64> = LruHashMap::pinned(map_sizes::HP_LEARN, 0);

/// The Service ranges (see `kernel_nat`); LPM tries take no preallocation.
#[map(name = "sl_svc")]
pub static SVC: LpmTrie<[u8; 4], u8> = LpmTrie::pinned(map_sizes::SVC, BPF_F_NO_PREALLOC);

#[map(name = "sl_svc6")]
pub static SVC6: LpmTrie<[u8; 16], u8> = LpmTrie::pinned(map_sizes::SVC, BPF_F_NO_PREALLOC);

/// Written by userspace only (the config's Service ranges' fingerprint).
#[map(name = "sl_svc_config")]
pub static SVC_CONFIG: Array<u64> = Array::pinned(1, 0);

/// Flows the node's stack translates (see `kernel_nat`).
#[map(name = "sl_kflows")]
pub static KFLOWS: LruHashMap<KernelFlowKey, KernelFlow> = LruHashMap::pinned(map_sizes::KFLOWS, 0);

#[map(name = "sl_kflow_frag")]
pub static KFLOW_FRAG: LruHashMap<FragKey, u64> = LruHashMap::pinned(map_sizes::KFLOW_FRAG, 0);

/// Not pinned: an eviction's event, from the eviction to `nat::snat`'s end.
#[map(name = "sl_evict_note")]
pub static EVICT_NOTE: PerCpuArray<sluice_common::Event> = PerCpuArray::with_max_entries(1, 0);

/// Not pinned: only lives from a drop site to its program's exit.
#[map(name = "sl_scratch")]
pub static SCRATCH: PerCpuArray<DropNote> = PerCpuArray::with_max_entries(1, 0);

/// Eviction and share settings (see `nat::evict`).
#[map(name = "sl_nat_limits")]
pub static NAT_LIMITS: Array<NatLimits> = Array::pinned(1, 0);

/// Recent IPv4 flows, a ring (`natMaxFlows` slots, set at load).
#[map(name = "sl_nat_ring")]
pub static NAT_RING: Array<NatKey> = Array::pinned(map_sizes::NAT_FLOWS, 0);

/// Recent IPv6 flows, a ring.
#[map(name = "sl_nat6_ring")]
pub static NAT6_RING: Array<Nat6Key> = Array::pinned(map_sizes::NAT_FLOWS, 0);

#[map(name = "sl_nat_cursor")]
pub static NAT_CURSOR: Array<u64> = Array::pinned(nat_cursor::MAX, 0);

/// Flows per pod; inserted on a pod's first flow, hence no preallocation.
#[map(name = "sl_nat_pods")]
pub static NAT_PODS: HashMap<u32, u64> = HashMap::pinned(map_sizes::NAT_PODS, BPF_F_NO_PREALLOC);

// --- Services translated at the socket (`lb`) ----------------------------------
// Written by the agent only; not preallocated: a node that leaves Services to
// kube-proxy spends no memory on them.

#[map(name = "sl_lb_svc")]
pub static LB_SVC: HashMap<SvcKey, SvcValue> =
    HashMap::pinned(map_sizes::LB_SVC, BPF_F_NO_PREALLOC);

#[map(name = "sl_lb_be")]
pub static LB_BACKENDS: HashMap<BackendKey, Backend> =
    HashMap::pinned(map_sizes::LB_BACKENDS, BPF_F_NO_PREALLOC);

#[map(name = "sl_lb_sock")]
pub static LB_SOCK: LruHashMap<LbSockKey, LbSockOrig> = LruHashMap::pinned(map_sizes::LB_SOCK, 0);

#[map(name = "sl_lb_stats")]
pub static LB_STATS: Array<u64> = Array::pinned(map_sizes::LB_STATS, 0);

#[map(name = "sl_lb_affinity")]
pub static LB_AFFINITY: LruHashMap<AffinityKey, Affinity> =
    LruHashMap::pinned(map_sizes::LB_AFFINITY, 0);

#[map(name = "sl_lb_cfg")]
pub static LB_CONFIG: Array<LbConfig> = Array::pinned(1, 0);

#[map(name = "sl_lb_ct")]
pub static LB_CT: LruHashMap<NatKey, HpFlow> = LruHashMap::pinned(map_sizes::LB_CT, 0);

#[map(name = "sl_lb_ct6")]
pub static LB_CT6: LruHashMap<Nat6Key, HpFlow6> = LruHashMap::pinned(map_sizes::LB_CT6, 0);
