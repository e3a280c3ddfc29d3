//! Pods on this node: addresses (`sl_endpoints`), owners (`sl_ep_info`),
//! counters (`sl_ep_slots` by slot, `sl_ep_stats` by ifindex) and drops by
//! reason (`sl_ep_drops`).
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use aya::maps::{HashMap, MapData, PerCpuArray, PerCpuHashMap, PerCpuValues};
use sluice_common::{
    endpoint_flags, from_cbuf, maps, reason, Endpoint, EndpointInfo, EndpointStats, EpDropKey,
    IpKey, SlotStats,
};

use crate::{error::is_not_found, Error, PinRoot, Result};

/// The key of an address.
pub fn ip_key(ip: IpAddr) -> IpKey {
    match ip {
        IpAddr::V4(v4) => IpKey::v4(v4.octets()),
        IpAddr::V6(v6) => IpKey::v6(v6.octets()),
    }
}

/// The address of a key.
pub fn key_ip(k: &IpKey) -> IpAddr {
    match k.as_v4() {
        Some(v4) => IpAddr::V4(Ipv4Addr::from(v4)),
        None => IpAddr::V6(Ipv6Addr::from(k.addr)),
    }
}

/// A NUL-padded name of [`EndpointInfo`] as text.
pub fn text(buf: &[u8]) -> String {
    String::from_utf8_lossy(from_cbuf(buf)).into_owned()
}

/// The endpoint maps, opened together (what ADD, DEL and CHECK touch).
#[expect(clippy::struct_field_names, reason = "fields named after their maps")]
pub struct Endpoints {
    root: PinRoot,
    endpoints: HashMap<MapData, IpKey, Endpoint>,
    stats: PerCpuHashMap<MapData, u32, EndpointStats>,
    info: HashMap<MapData, u32, EndpointInfo>,
    /// `None` for a datapath loaded before counter slots existed.
    slots: Option<PerCpuArray<MapData, SlotStats>>,
}

/// Slots a claim looks at, from the ifindex's own on, before it gives up (the
/// pod then counts by ifindex): each look is a syscall or two, and an ADD
/// stays O(1) however many pods the node has.
pub const SLOT_PROBES: u32 = 64;

/// The first of at most `limit` slots of `n`, from `start` on (wrapping), that
/// `free` says is free.
fn probe<E>(
    start: u32,
    n: u32,
    limit: u32,
    mut free: impl FnMut(u32) -> std::result::Result<bool, E>,
) -> std::result::Result<Option<u32>, E> {
    for i in 0..limit.min(n) {
        let slot = (start % n + i) % n;
        if free(slot)? {
            return Ok(Some(slot));
        }
    }
    Ok(None)
}

/// One address of a pod with its owner and summed counters (`sluicectl`).
#[derive(Clone, Debug)]
pub struct EndpointRow {
    pub ip: IpAddr,
    pub endpoint: Endpoint,
    pub owner: Option<EndpointInfo>,
    pub stats: EndpointStats,
}

impl Endpoints {
    pub fn open(root: &PinRoot) -> Result<Self> {
        Ok(Self {
            root: root.clone(),
            endpoints: root.typed(&maps::ENDPOINTS)?,
            stats: root.typed(&maps::ENDPOINT_STATS)?,
            info: root.typed(&maps::ENDPOINT_INFO)?,
            slots: if root.has(&maps::ENDPOINT_SLOTS) {
                Some(root.typed(&maps::ENDPOINT_SLOTS)?)
            } else {
                None
            },
        })
    }

    /// Gives the endpoint on `ifindex` a counter slot (see
    /// `endpoint_flags::SLOT_SHIFT`): the first free one from
    /// `ifindex % slots` on, zeroed, with `ifindex` as its owner. A slot is
    /// free when no one owns it, `ifindex` does (an index used again), or its
    /// owner has no `sl_ep_info` entry: DEL leaves the slot as it is and the
    /// next claim takes it. `None` when the datapath has no slots or none is
    /// free within [`SLOT_PROBES`]: the pod counts by ifindex.
    ///
    /// Two claims must not run at once (the caller holds a lock), and the
    /// endpoint's own `sl_ep_info` entry must be written first
    /// ([`Self::insert_interface`]): then a later claim sees the slot taken.
    pub fn claim_slot(&mut self, ifindex: u32) -> Result<Option<u32>> {
        let Some(slots) = self.slots.as_mut() else {
            return Ok(None);
        };
        let err = |slot: u32, e| {
            Error::map(
                format!("claim slot {slot} for ifindex {ifindex}"),
                maps::ENDPOINT_SLOTS.name,
                e,
            )
        };
        let info = &self.info;
        let found = probe(ifindex, slots.len(), SLOT_PROBES, |slot| {
            // Every CPU's copy carries the owner; the first is enough.
            let owner = slots
                .get(&slot, 0)
                .map_err(|e| err(slot, e))?
                .first()
                .map_or(0, |v| v.owner);
            Ok(owner == 0
                || owner == ifindex
                || matches!(info.get(&owner, 0), Err(e) if is_not_found(&e)))
        })?;
        let Some(slot) = found else {
            return Ok(None);
        };
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| Error::io("counting CPUs", e))?;
        let fresh = SlotStats {
            owner: ifindex,
            ..SlotStats::default()
        };
        let values = PerCpuValues::try_from(vec![fresh; cpus])
            .map_err(|e| Error::io("building per-CPU counters", e))?;
        slots.set(slot, values, 0).map_err(|e| err(slot, e))?;
        Ok(Some(slot))
    }

    /// The counters in slot `slot` summed over CPUs, if `ifindex` owns it.
    fn slot_stats(&self, slot: u32, ifindex: u32) -> EndpointStats {
        let Some(per_cpu) = self.slots.as_ref().and_then(|m| m.get(&slot, 0).ok()) else {
            return EndpointStats::default();
        };
        if per_cpu.first().is_none_or(|v| v.owner != ifindex) {
            return EndpointStats::default();
        }
        per_cpu
            .iter()
            .fold(EndpointStats::default(), |a, b| a + b.stats)
    }

    /// Adds the per-interface entries (zeroed counters, owner).
    pub fn insert_interface(&mut self, ifindex: u32, info: &EndpointInfo) -> Result<()> {
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| Error::io("counting CPUs", e))?;
        let zero = PerCpuValues::try_from(vec![EndpointStats::default(); cpus])
            .map_err(|e| Error::io("building per-CPU counters", e))?;
        self.stats.insert(ifindex, zero, 0).map_err(|e| {
            Error::map(
                format!("insert ifindex {ifindex}"),
                maps::ENDPOINT_STATS.name,
                e,
            )
        })?;
        self.info.insert(ifindex, *info, 0).map_err(|e| {
            Error::map(
                format!("insert ifindex {ifindex}"),
                maps::ENDPOINT_INFO.name,
                e,
            )
        })
    }

    pub fn insert(&mut self, ip: IpAddr, ep: Endpoint) -> Result<()> {
        self.endpoints
            .insert(ip_key(ip), ep, 0)
            .map_err(|e| Error::map(format!("insert {ip}"), maps::ENDPOINTS.name, e))
    }

    pub fn get(&self, ip: IpAddr) -> Option<Endpoint> {
        self.endpoints.get(&ip_key(ip), 0).ok()
    }

    /// Every address and its endpoint.
    pub fn list(&self) -> Vec<(IpAddr, Endpoint)> {
        self.endpoints
            .iter()
            .filter_map(std::result::Result::ok)
            .map(|(k, e)| (key_ip(&k), e))
            .collect()
    }

    /// Every interface and its owner.
    pub fn interfaces(&self) -> Vec<(u32, EndpointInfo)> {
        self.info
            .iter()
            .filter_map(std::result::Result::ok)
            .collect()
    }

    pub fn has_counters(&self, ifindex: u32) -> bool {
        self.stats.get(&ifindex, 0).is_ok()
    }

    /// Removes an address; a missing one is fine.
    pub fn remove(&mut self, ip: IpAddr) -> Result<()> {
        match self.endpoints.remove(&ip_key(ip)) {
            Err(e) if !is_not_found(&e) => {
                Err(Error::map(format!("remove {ip}"), maps::ENDPOINTS.name, e))
            }
            _ => Ok(()),
        }
    }

    /// Removes the per-interface entries and the interface's drop counters;
    /// missing ones are fine. Goes on past errors and returns them all.
    pub fn remove_interface(&mut self, ifindex: u32) -> Vec<Error> {
        let mut errors = Vec::new();
        if let Err(e) = self.stats.remove(&ifindex) {
            if !is_not_found(&e) {
                errors.push(Error::map(
                    format!("remove ifindex {ifindex}"),
                    maps::ENDPOINT_STATS.name,
                    e,
                ));
            }
        }
        if let Err(e) = self.info.remove(&ifindex) {
            if !is_not_found(&e) {
                errors.push(Error::map(
                    format!("remove ifindex {ifindex}"),
                    maps::ENDPOINT_INFO.name,
                    e,
                ));
            }
        }
        // One key per reason (the programs insert them). A datapath loaded
        // before per-endpoint drop counters existed has none.
        if self.root.has(&maps::EP_DROPS) {
            match self
                .root
                .typed::<PerCpuHashMap<MapData, EpDropKey, u64>>(&maps::EP_DROPS)
            {
                Ok(mut drops) => {
                    for r in 0..reason::MAX {
                        let _ = drops.remove(&EpDropKey { ifindex, reason: r });
                    }
                }
                Err(e) => errors.push(e),
            }
        }
        errors
    }

    /// Every address with its owner and counters summed over CPUs, IPv4 first.
    pub fn rows(&self) -> Result<Vec<EndpointRow>> {
        let mut rows = Vec::new();
        for item in &self.endpoints {
            let (key, ep) = item.map_err(|e| Error::map("iterate", maps::ENDPOINTS.name, e))?;
            let mut stats = self
                .stats
                .get(&ep.ifindex, 0)
                .map(|per_cpu| per_cpu.iter().fold(EndpointStats::default(), |a, b| a + *b))
                .unwrap_or_default();
            // The packets counted after the endpoint was known.
            if let Some(slot) = endpoint_flags::slot(ep.flags) {
                stats = stats + self.slot_stats(slot, ep.ifindex);
            }
            rows.push(EndpointRow {
                ip: key_ip(&key),
                endpoint: ep,
                owner: self.info.get(&ep.ifindex, 0).ok(),
                stats,
            });
        }
        rows.sort_by_key(|r| (r.ip.is_ipv6(), r.ip));
        Ok(rows)
    }
}

/// Drops per (endpoint, reason), summed over CPUs; empty for a datapath loaded
/// before the map existed.
pub fn drops(root: &PinRoot) -> Result<Vec<(EpDropKey, u64)>> {
    if !root.has(&maps::EP_DROPS) {
        return Ok(Vec::new());
    }
    let m: PerCpuHashMap<MapData, EpDropKey, u64> = root.typed(&maps::EP_DROPS)?;
    let mut v: Vec<(EpDropKey, u64)> = m
        .iter()
        .filter_map(std::result::Result::ok)
        .map(|(k, per_cpu)| (k, per_cpu.iter().sum()))
        .collect();
    v.sort_by_key(|(k, _)| (k.ifindex, k.reason));
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(start: u32, n: u32, limit: u32, taken: &[u32]) -> Option<u32> {
        probe::<()>(start, n, limit, |s| Ok(!taken.contains(&s))).unwrap()
    }

    #[test]
    fn a_claim_takes_the_first_free_slot_from_the_ifindex_on_and_wraps() {
        assert_eq!(claim(5, 8, 64, &[]), Some(5));
        // The ifindex is larger than the map: its own slot is the remainder.
        assert_eq!(claim(4096 + 7, 4096, 64, &[]), Some(7));
        assert_eq!(claim(6, 8, 64, &[6, 7]), Some(0));
        assert_eq!(claim(6, 8, 64, &[6, 7, 0, 1, 2, 3, 4]), Some(5));
    }

    #[test]
    fn a_claim_gives_up_after_its_limit_or_when_all_are_taken() {
        let all: Vec<u32> = (0..8).collect();
        assert_eq!(claim(3, 8, 64, &all), None);
        assert_eq!(claim(0, 100, 4, &[0, 1, 2, 3]), None);
        assert_eq!(claim(0, 100, 5, &[0, 1, 2, 3]), Some(4));
        assert_eq!(claim(1, 0, 64, &[]), None);
    }

    #[test]
    fn slot_flags_keep_the_other_bits() {
        let f = endpoint_flags::IPV6 | endpoint_flags::LIMITED;
        assert_eq!(endpoint_flags::slot(f), None);
        let g = endpoint_flags::with_slot(f, 0);
        assert_eq!(endpoint_flags::slot(g), Some(0));
        assert_eq!(g & 0xffff, f);
        let h = endpoint_flags::with_slot(g, 4095);
        assert_eq!(endpoint_flags::slot(h), Some(4095));
        assert_eq!(h & 0xffff, f);
    }
}
