//! Pods on this node: addresses (`sl_endpoints`), owners (`sl_ep_info`),
//! counters (`sl_ep_stats`) and drops by reason (`sl_ep_drops`).
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use aya::maps::{HashMap, MapData, PerCpuHashMap, PerCpuValues};
use sluice_common::{
    from_cbuf, maps, reason, Endpoint, EndpointInfo, EndpointStats, EpDropKey, IpKey,
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
        })
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
            let stats = self
                .stats
                .get(&ep.ifindex, 0)
                .map(|per_cpu| per_cpu.iter().fold(EndpointStats::default(), |a, b| a + *b))
                .unwrap_or_default();
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
