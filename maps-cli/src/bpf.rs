//! Every aya call of sluicectl: finding the pin root and reading pinned maps.
use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
};

use anyhow::{bail, Context, Result};
use aya::{
    maps::{Array, HashMap, Map, MapData, MapError, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::SchedClassifier,
};
use sluice_common::{
    map_names, nat_flags, pin_dirs, reason, BwState, DatapathMeta, Endpoint, EndpointInfo,
    EndpointStats, EpDropKey, HostPortConfig, IpKey, MasqConfig, NatEntry, NatKey, NatRev,
    NodeConfig, PortKey, PortTarget, DEFAULT_PIN_BASE, LAYOUT_VERSION,
};

use crate::args::Target;

/// The pinned datapath of one network.
pub struct Datapath {
    pub pin_root: PathBuf,
}

impl Datapath {
    /// Resolves the target and checks that a datapath of our layout is pinned there.
    pub fn open(t: &Target) -> Result<Self> {
        let pin_root = match (&t.pin_root, &t.network) {
            (Some(p), _) => p.clone(),
            (None, Some(n)) => sluice_common::user::default_pin_root(n),
            (None, None) => {
                let nets = list_networks();
                match nets.as_slice() {
                    [one] => Path::new(DEFAULT_PIN_BASE).join(one),
                    [] => bail!(
                        "no Sluice datapath under {DEFAULT_PIN_BASE}; pass --pin-root or --network"
                    ),
                    many => bail!(
                        "several networks under {DEFAULT_PIN_BASE} ({}); pick one with --network",
                        many.join(", ")
                    ),
                }
            }
        };
        let dp = Self { pin_root };
        let meta = dp.meta()?;
        if meta.layout_version == 0 {
            bail!(
                "the datapath at {} is not loaded (a first load did not finish); the next ADD loads it",
                dp.pin_root.display()
            );
        }
        if meta.layout_version != LAYOUT_VERSION {
            bail!(
                "the datapath at {} uses map layout v{}, this sluicectl reads v{LAYOUT_VERSION}; use the sluicectl that matches the installed sluice",
                dp.pin_root.display(),
                meta.layout_version
            );
        }
        Ok(dp)
    }

    fn map(&self, name: &str) -> Result<Map> {
        let path = self.pin_root.join(pin_dirs::MAPS).join(name);
        // The pin root is root-only (0700): a user without the right cannot
        // even see whether the pin exists, and must not be told it is missing.
        if let Err(e) = std::fs::metadata(&path) {
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                bail!(
                    "reading {} needs root (CAP_BPF and CAP_SYS_ADMIN, and access to the root-only pin root): {e}",
                    path.display()
                );
            }
            bail!(
                "no datapath pinned at {} ({} is missing): no pod attached yet, or wrong --network/--pin-root",
                self.pin_root.display(),
                path.display()
            );
        }
        let data = MapData::from_pin(&path).map_err(|e| match &e {
            MapError::SyscallError(s)
                if s.io_error.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                anyhow::anyhow!(
                    "reading {} needs root (CAP_BPF and CAP_SYS_ADMIN): {e}",
                    path.display()
                )
            }
            _ => anyhow::anyhow!("opening {}: {e}", path.display()),
        })?;
        Map::from_map_data(data).with_context(|| format!("using {}", path.display()))
    }

    pub fn meta(&self) -> Result<DatapathMeta> {
        let arr: Array<MapData, DatapathMeta> = Array::try_from(self.map(map_names::META)?)?;
        Ok(arr.get(&0, 0)?)
    }

    /// Masquerade settings.
    pub fn masq(&self) -> Result<MasqConfig> {
        let arr: Array<MapData, MasqConfig> = Array::try_from(self.map(map_names::MASQ)?)?;
        Ok(arr.get(&0, 0)?)
    }

    /// Every hostPort mapping, sorted by port, protocol, address.
    pub fn ports(&self) -> Result<Vec<(PortKey, PortTarget)>> {
        let m: HashMap<MapData, PortKey, PortTarget> =
            HashMap::try_from(self.map(map_names::PORTS)?)?;
        let mut v: Vec<(PortKey, PortTarget)> = m.iter().filter_map(Result::ok).collect();
        v.sort_by_key(|(k, _)| (u16::from_be(k.host_port), k.proto, k.host_ip));
        Ok(v)
    }

    /// The node addresses wildcard mappings match.
    pub fn node_addrs(&self) -> Result<Vec<[u8; 4]>> {
        let m: HashMap<MapData, [u8; 4], u8> = HashMap::try_from(self.map(map_names::NODE_ADDRS)?)?;
        Ok(m.keys().filter_map(Result::ok).collect())
    }

    /// Adds a mapping unless its key exists (BPF_NOEXIST: `Ok(false)` then), and
    /// turns the programs' hostPort path on for this node namespace.
    pub fn insert_port(&self, k: &PortKey, t: &PortTarget) -> Result<bool> {
        let mut m: HashMap<MapData, PortKey, PortTarget> =
            HashMap::try_from(self.map(map_names::PORTS)?)?;
        match m.insert(k, t, 1) {
            Ok(()) => {}
            Err(MapError::SyscallError(s)) if s.io_error.raw_os_error() == Some(libc::EEXIST) => {
                return Ok(false)
            }
            Err(e) => return Err(e.into()),
        }
        let mut cfg: Array<MapData, HostPortConfig> =
            Array::try_from(self.map(map_names::HP_CONFIG)?)?;
        let c = HostPortConfig {
            netns_cookie: sluice_common::user::netns_cookie()
                .context("reading this network namespace's cookie")?,
            active: 1,
            _pad: 0,
        };
        cfg.set(0, c, 0)?;
        Ok(true)
    }

    /// Removes a mapping; `false` when there was none.
    pub fn remove_port(&self, k: &PortKey) -> Result<bool> {
        let mut m: HashMap<MapData, PortKey, PortTarget> =
            HashMap::try_from(self.map(map_names::PORTS)?)?;
        Ok(m.remove(k).is_ok())
    }

    /// Every pod's bandwidth state: (host veth ifindex, state).
    pub fn bandwidth(&self) -> Result<Vec<(u32, BwState)>> {
        let m: HashMap<MapData, u32, BwState> = HashMap::try_from(self.map(map_names::BANDWIDTH)?)?;
        let mut v: Vec<(u32, BwState)> = m.iter().filter_map(Result::ok).collect();
        v.sort_by_key(|(i, _)| *i);
        Ok(v)
    }

    /// Writes (or with `None` removes) a pod's bandwidth state.
    pub fn set_bandwidth(&self, ifindex: u32, s: Option<BwState>) -> Result<()> {
        let mut m: HashMap<MapData, u32, BwState> =
            HashMap::try_from(self.map(map_names::BANDWIDTH)?)?;
        match s {
            Some(s) => m.insert(ifindex, s, 0)?,
            None => {
                let _ = m.remove(&ifindex);
            }
        }
        Ok(())
    }

    /// Every masqueraded flow: (pod-side key, entry).
    pub fn nat_flows(&self) -> Result<Vec<(NatKey, NatEntry)>> {
        let fwd: HashMap<MapData, NatKey, NatEntry> =
            HashMap::try_from(self.map(map_names::NAT_FWD)?)?;
        let mut v: Vec<(NatKey, NatEntry)> = fwd.iter().filter_map(Result::ok).collect();
        v.sort_by_key(|(k, _)| (k.src_ip, k.src_port, k.dst_ip, k.dst_port, k.proto));
        Ok(v)
    }

    /// Deletes flows (both directions; each reverse key made with the flow's own
    /// address, inbound flows have none); returns how many went.
    pub fn delete_nat_flows(&self, flows: &[(NatKey, NatEntry)]) -> Result<usize> {
        let mut fwd: HashMap<MapData, NatKey, NatEntry> =
            HashMap::try_from(self.map(map_names::NAT_FWD)?)?;
        let mut rev: HashMap<MapData, NatKey, NatRev> =
            HashMap::try_from(self.map(map_names::NAT_REV)?)?;
        let mut n = 0;
        for (k, e) in flows {
            if e.flags & nat_flags::INBOUND == 0 {
                let _ = rev.remove(&k.reverse(e.nat_addr, e.nat_port));
            }
            if fwd.remove(k).is_ok() {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Node settings written at load (uplink, XDP mode).
    pub fn config(&self) -> Result<NodeConfig> {
        let arr: Array<MapData, NodeConfig> = Array::try_from(self.map(map_names::CONFIG)?)?;
        Ok(arr.get(&0, 0)?)
    }

    /// (name, count) of every reason, summed over CPUs.
    pub fn counters(&self) -> Result<Vec<(&'static str, u64)>> {
        let arr: PerCpuArray<MapData, u64> = PerCpuArray::try_from(self.map(map_names::COUNTERS)?)?;
        reason::NAMES
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let v = arr.get(&(i as u32), 0)?;
                Ok((*name, v.iter().sum()))
            })
            .collect()
    }

    /// Drops per (endpoint, reason), summed over CPUs; empty for a datapath
    /// loaded before the map existed.
    pub fn endpoint_drops(&self) -> Result<Vec<(EpDropKey, u64)>> {
        if !self.has_map(map_names::EP_DROPS) {
            return Ok(Vec::new());
        }
        let m: PerCpuHashMap<MapData, EpDropKey, u64> =
            PerCpuHashMap::try_from(self.map(map_names::EP_DROPS)?)?;
        let mut v: Vec<(EpDropKey, u64)> = m
            .iter()
            .filter_map(Result::ok)
            .map(|(k, per_cpu)| (k, per_cpu.iter().sum()))
            .collect();
        v.sort_by_key(|(k, _)| (k.ifindex, k.reason));
        Ok(v)
    }

    fn has_map(&self, name: &str) -> bool {
        self.pin_root.join(pin_dirs::MAPS).join(name).exists()
    }

    /// The event ring buffer (one reader at a time gets each event).
    pub fn events(&self) -> Result<RingBuf<MapData>> {
        if !self.has_map(map_names::EVENTS) {
            bail!(
                "the datapath at {} has no event ring buffer (loaded by an older sluice); `sluicectl datapath reload` with the installed sluice adds it",
                self.pin_root.display()
            );
        }
        Ok(RingBuf::try_from(self.map(map_names::EVENTS)?)?)
    }

    pub fn monitor_slot(&self, slot: u32) -> Result<u64> {
        let arr: Array<MapData, u64> = Array::try_from(self.map(map_names::MONITOR)?)?;
        Ok(arr.get(&slot, 0)?)
    }

    pub fn set_monitor_slot(&self, slot: u32, v: u64) -> Result<()> {
        let mut arr: Array<MapData, u64> = Array::try_from(self.map(map_names::MONITOR)?)?;
        arr.set(slot, v, 0)?;
        Ok(())
    }

    /// Names of the pins in `sub` (`progs` or `links`).
    pub fn pins(&self, sub: &str) -> Result<Vec<String>> {
        let dir = self.pin_root.join(sub);
        let mut out: Vec<String> = std::fs::read_dir(&dir)
            .with_context(|| format!("listing {}", dir.display()))?
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        out.sort();
        Ok(out)
    }

    /// Kernel id of a pinned program (as `bpftool prog` shows it).
    pub fn program_id(&self, name: &str) -> Result<u32> {
        // `from_pin` only opens the pin and reads its info, whatever the program
        // type, so it serves the XDP program too.
        let p = SchedClassifier::from_pin(self.pin_root.join(pin_dirs::PROGS).join(name))
            .with_context(|| format!("opening pinned program {name}"))?;
        Ok(p.info()?.id())
    }

    /// Every endpoint address with its interface's owner and summed counters.
    pub fn endpoints(&self) -> Result<Vec<EndpointRow>> {
        let eps: HashMap<MapData, IpKey, Endpoint> =
            HashMap::try_from(self.map(map_names::ENDPOINTS)?)?;
        let info: HashMap<MapData, u32, EndpointInfo> =
            HashMap::try_from(self.map(map_names::ENDPOINT_INFO)?)?;
        let stats: PerCpuHashMap<MapData, u32, EndpointStats> =
            PerCpuHashMap::try_from(self.map(map_names::ENDPOINT_STATS)?)?;
        let mut rows = Vec::new();
        for item in eps.iter() {
            let (key, ep) = item.context("iterating sl_endpoints")?;
            let owner = info.get(&ep.ifindex, 0).ok();
            let counters = stats
                .get(&ep.ifindex, 0)
                .map(|per_cpu| per_cpu.iter().fold(EndpointStats::default(), |a, b| a + *b))
                .unwrap_or_default();
            rows.push(EndpointRow {
                ip: key_ip(&key),
                endpoint: ep,
                owner,
                stats: counters,
            });
        }
        rows.sort_by_key(|r| (r.ip.is_ipv6(), r.ip));
        Ok(rows)
    }
}

/// Network directories under the default pin base.
fn list_networks() -> Vec<String> {
    std::fs::read_dir(DEFAULT_PIN_BASE)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter(|e| e.path().join(pin_dirs::MAPS).is_dir())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

pub fn key_ip(k: &IpKey) -> IpAddr {
    match k.as_v4() {
        Some(v4) => IpAddr::V4(Ipv4Addr::from(v4)),
        None => IpAddr::V6(Ipv6Addr::from(k.addr)),
    }
}

pub struct EndpointRow {
    pub ip: IpAddr,
    pub endpoint: Endpoint,
    pub owner: Option<EndpointInfo>,
    pub stats: EndpointStats,
}
