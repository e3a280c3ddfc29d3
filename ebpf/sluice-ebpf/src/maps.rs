//! The pinned maps. Names and value types come from `sluice-common`; every map is
//! pinned by name so that a later load (and `sluicectl`) finds the same map.
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, PerCpuHashMap},
};
use sluice_common::{map_sizes, DatapathMeta, Endpoint, EndpointInfo, EndpointStats, IpKey};

#[map(name = "sl_endpoints")]
pub static ENDPOINTS: HashMap<IpKey, Endpoint> = HashMap::pinned(map_sizes::ENDPOINTS, 0);

#[map(name = "sl_ep_stats")]
pub static ENDPOINT_STATS: PerCpuHashMap<u32, EndpointStats> =
    PerCpuHashMap::pinned(map_sizes::ENDPOINT_STATS, 0);

/// Written by userspace only; declared here so that one object defines every map.
#[map(name = "sl_ep_info")]
pub static ENDPOINT_INFO: HashMap<u32, EndpointInfo> = HashMap::pinned(map_sizes::ENDPOINT_INFO, 0);

#[map(name = "sl_meta")]
pub static META: Array<DatapathMeta> = Array::pinned(1, 0);
