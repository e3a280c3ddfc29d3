//! What keeps a full flow table open to every pod (`nat::evict` of the eBPF
//! crate): the settings (`sl_nat_limits`), and the flows each pod holds
//! (`sl_nat_pods`), which the datapath keeps in step and the node agent
//! recounts on every sweep.
use std::collections::BTreeMap;

use aya::{
    maps::{Array, HashMap, MapData},
    Pod,
};
use sluice_common::{maps, nat_cursor, NatEntryOf, NatKeyOf, NatLimits};

use crate::{batch, Error, PinRoot, Result};

/// The settings; all zero where the datapath predates them.
pub fn limits(root: &PinRoot) -> Result<NatLimits> {
    if !root.has(&maps::NAT_LIMITS) {
        return Ok(NatLimits::default());
    }
    let arr: Array<MapData, NatLimits> = root.typed(&maps::NAT_LIMITS)?;
    arr.get(&0, 0)
        .map_err(|e| Error::map("read", maps::NAT_LIMITS.name, e))
}

/// Writes the settings: unreplied UDP flows expire after
/// `udp_unreplied_secs`; a pod may hold `pod_share` percent of the table
/// (as large as the pinned `sl_nat_fwd`, which may predate this config's
/// `natMaxFlows`) before its new flows replace its own. A datapath without
/// the map (an older sluice's) is left as it is.
pub fn write_limits(root: &PinRoot, udp_unreplied_secs: u32, pod_share: u32) -> Result<()> {
    if !root.has(&maps::NAT_LIMITS) {
        return Ok(());
    }
    let table = root.capacity(&maps::NAT_FWD)?;
    let ring = root
        .capacity(&maps::NAT_RING)?
        .min(root.capacity(&maps::NAT6_RING)?);
    let cfg = NatLimits {
        udp_unreplied_secs,
        pod_max_flows: pod_max_flows(table, pod_share),
        ring_slots: ring.min(table),
        max_flows: table,
    };
    let mut arr: Array<MapData, NatLimits> = root.typed(&maps::NAT_LIMITS)?;
    if arr.get(&0, 0).ok() == Some(cfg) {
        return Ok(());
    }
    arr.set(0, cfg, 0)
        .map_err(|e| Error::map("write", maps::NAT_LIMITS.name, e))
}

/// A pod's share of a table of `table` flows, `share` percent (at least one
/// flow).
pub fn pod_max_flows(table: u32, share: u32) -> u32 {
    u32::try_from(u64::from(table) * u64::from(share.min(100)) / 100)
        .unwrap_or(u32::MAX)
        .max(1)
}

/// Flows per pod (host veth ifindex) as the datapath counts them, largest
/// first. A count the datapath took below zero (a race) reads as 0.
pub fn pod_counts(root: &PinRoot) -> Result<Vec<(u32, u64)>> {
    if !root.has(&maps::NAT_PODS) {
        return Ok(Vec::new());
    }
    let m: HashMap<MapData, u32, u64> = root.typed(&maps::NAT_PODS)?;
    let mut v: Vec<(u32, u64)> = m
        .iter()
        .filter_map(std::result::Result::ok)
        .map(|(k, n)| (k, if n > u64::from(u32::MAX) { 0 } else { n }))
        .collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    Ok(v)
}

/// Flows per pod in a table's entries (the node's own, ifindex 0, left out).
pub fn count_by_pod<A, P>(
    flows: &[(NatKeyOf<A>, NatEntryOf<A, P>)],
    into: &mut BTreeMap<u32, u64>,
) {
    for (_, e) in flows {
        if e.pod_ifindex != 0 {
            *into.entry(e.pod_ifindex).or_default() += 1;
        }
    }
}

/// Makes `sl_nat_pods` say `counts`: what a walk of both tables found. Races
/// with the datapath (a flow made between the walk and this write) are off by
/// a flow or two until the next recount.
pub fn set_pod_counts(root: &PinRoot, counts: &BTreeMap<u32, u64>) -> Result<()> {
    if !root.has(&maps::NAT_PODS) {
        return Ok(());
    }
    let mut m: HashMap<MapData, u32, u64> = root.typed(&maps::NAT_PODS)?;
    let stale: Vec<u32> = m
        .keys()
        .filter_map(std::result::Result::ok)
        .filter(|k| !counts.contains_key(k))
        .collect();
    for k in stale {
        let _ = m.remove(&k);
    }
    for (k, n) in counts {
        if m.get(k, 0).ok() != Some(*n) {
            m.insert(k, n, 0)
                .map_err(|e| Error::map("write", maps::NAT_PODS.name, e))?;
        }
    }
    Ok(())
}

/// Recounts every pod's flows from both tables, the walk and the write under
/// the maps directory's lock (see [`crate::MapsLock`]).
pub fn recount(root: &PinRoot) -> Result<()> {
    if !root.has(&maps::NAT_PODS) {
        return Ok(());
    }
    let _walk_to_write = root.lock_maps()?;
    let mut counts = BTreeMap::new();
    let v4 = count_table::<[u8; 4], u32>(root, &maps::NAT_FWD, &mut counts)?;
    let v6 = if root.has(&maps::NAT6_FWD) {
        count_table::<sluice_common::Addr6, ()>(root, &maps::NAT6_FWD, &mut counts)?
    } else {
        0
    };
    set_pod_counts(root, &counts)?;
    set_table_counts(root, v4, v6)
}

/// Makes the datapath's count of each table's flows say `v4` and `v6` (what a
/// walk found; it decides when a new flow makes room first).
pub fn set_table_counts(root: &PinRoot, v4: u64, v6: u64) -> Result<()> {
    if !root.has(&maps::NAT_CURSOR) {
        return Ok(());
    }
    let mut arr: Array<MapData, u64> = root.typed(&maps::NAT_CURSOR)?;
    for (slot, n) in [(nat_cursor::FLOWS_V4, v4), (nat_cursor::FLOWS_V6, v6)] {
        arr.set(slot, n, 0)
            .map_err(|e| Error::map("write", maps::NAT_CURSOR.name, e))?;
    }
    Ok(())
}

/// Adds a table's flows to `counts` by pod; how many it holds.
fn count_table<A, P>(
    root: &PinRoot,
    spec: &maps::MapSpec,
    counts: &mut BTreeMap<u32, u64>,
) -> Result<u64>
where
    NatKeyOf<A>: Pod,
    NatEntryOf<A, P>: Pod,
{
    let flows = batch::lookup_all::<NatKeyOf<A>, NatEntryOf<A, P>>(root, spec)?;
    count_by_pod(&flows, counts);
    Ok(flows.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_share_is_a_percentage_of_the_table_and_never_zero() {
        assert_eq!(pod_max_flows(65_536, 50), 32_768);
        assert_eq!(pod_max_flows(1_024, 25), 256);
        assert_eq!(pod_max_flows(1_024, 100), 1_024);
        assert_eq!(pod_max_flows(1_024, 1), 10);
        assert_eq!(pod_max_flows(10, 1), 1);
        assert_eq!(pod_max_flows(4_194_304, 100), 4_194_304);
    }

    #[test]
    fn flows_are_counted_by_pod_without_the_nodes_own() {
        let e = |pod| sluice_common::NatEntry {
            pod_ifindex: pod,
            ..Default::default()
        };
        let k = sluice_common::NatKey::default();
        let mut c = BTreeMap::new();
        count_by_pod(&[(k, e(7)), (k, e(7)), (k, e(0)), (k, e(9))], &mut c);
        assert_eq!(c, BTreeMap::from([(7, 2), (9, 1)]));
    }
}
