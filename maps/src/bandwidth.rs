//! Bandwidth limits: each pod's two token buckets (`sl_bw`), and which pods EDT
//! shapes (`sl_edt`).
use aya::maps::{HashMap, MapData};
use sluice_common::{endpoint_flags, maps, BwState, EdtSlot, Endpoint, IpKey};

use crate::{Error, PinRoot, Result};

/// `BPF_EXIST`: update only a key that is there.
const BPF_EXIST: u64 = 2;

fn map(root: &PinRoot) -> Result<HashMap<MapData, u32, BwState>> {
    root.typed(&maps::BANDWIDTH)
}

/// Every pod's state: (host veth ifindex, state), sorted.
pub fn list(root: &PinRoot) -> Result<Vec<(u32, BwState)>> {
    let mut v: Vec<(u32, BwState)> = map(root)?
        .iter()
        .filter_map(std::result::Result::ok)
        .collect();
    v.sort_by_key(|(i, _)| *i);
    Ok(v)
}

/// The state of the pod on host veth `ifindex`, if it has limits.
pub fn get(root: &PinRoot, ifindex: u32) -> Result<Option<BwState>> {
    Ok(map(root)?.get(&ifindex, 0).ok())
}

/// Sets the pod's limits (the next packet sees them).
pub fn set(root: &PinRoot, ifindex: u32, state: BwState) -> Result<()> {
    map(root)?
        .insert(ifindex, state, 0)
        .map_err(|e| Error::map(format!("write ifindex {ifindex}"), maps::BANDWIDTH.name, e))
}

/// Marks the endpoints (`sl_endpoints`) of the pods with limits
/// `endpoint_flags::LIMITED` and clears the mark on the others: all of them, or
/// only those on host veth `only`. The programs look a pod's buckets up only
/// when its endpoint has the mark. For what changes limits after ADD
/// (`sluicectl bandwidth set`) and for a datapath load over endpoints an older
/// datapath wrote without the mark; one walk of the endpoints. Both callers
/// hold the datapath's exclusive lock, so no ADD runs meanwhile; a DEL takes
/// no lock, so an entry is written only if it still is the one walked (and
/// `BPF_EXIST` keeps a removed one removed). Returns how many endpoints it
/// changed.
pub fn sync_limited(root: &PinRoot, only: Option<u32>) -> Result<usize> {
    if !root.has(&maps::ENDPOINTS) {
        return Ok(0);
    }
    let limited: std::collections::HashSet<u32> = if root.has(&maps::BANDWIDTH) {
        map(root)?
            .keys()
            .filter_map(std::result::Result::ok)
            .collect()
    } else {
        std::collections::HashSet::new()
    };
    let mut eps: HashMap<MapData, IpKey, Endpoint> = root.typed(&maps::ENDPOINTS)?;
    let stale: Vec<(IpKey, Endpoint)> = eps
        .iter()
        .filter_map(std::result::Result::ok)
        .filter(|(_, ep)| only.is_none_or(|i| i == ep.ifindex))
        .filter_map(|(k, ep)| {
            let flags = if limited.contains(&ep.ifindex) {
                ep.flags | endpoint_flags::LIMITED
            } else {
                ep.flags & !endpoint_flags::LIMITED
            };
            (flags != ep.flags).then_some((k, Endpoint { flags, ..ep }))
        })
        .collect();
    let mut changed = 0;
    for (k, ep) in &stale {
        // A DEL takes no lock: an address whose endpoint changed since the
        // walk (its pod deleted, the address given to another by an ADD after
        // our lock) is left as it is now. An endpoint removed meanwhile stays
        // removed (BPF_EXIST).
        let now = eps.get(k, 0).ok();
        if now.map(|n| (n.ifindex, n.pod_mac)) != Some((ep.ifindex, ep.pod_mac)) {
            continue;
        }
        match eps.insert(k, ep, BPF_EXIST) {
            Err(e) if !crate::error::is_not_found(&e) => {
                return Err(Error::map(
                    format!("mark ifindex {}", ep.ifindex),
                    maps::ENDPOINTS.name,
                    e,
                ));
            }
            Err(_) => {}
            Ok(()) => changed += 1,
        }
    }
    Ok(changed)
}

/// Removes the pod's limits (none is fine).
pub fn remove(root: &PinRoot, ifindex: u32) -> Result<()> {
    if !root.has(&maps::BANDWIDTH) {
        return Ok(());
    }
    let _ = map(root)?.remove(&ifindex);
    Ok(())
}

/// CHECK: the limits in place are `want` (rates and bursts; the buckets' fill
/// and counters are live state).
pub fn check(root: &PinRoot, ifindex: u32, want: Option<&BwState>) -> Result<()> {
    let found = map(root).ok().and_then(|m| m.get(&ifindex, 0).ok());
    match (want, found) {
        (None, None) => Ok(()),
        (None, Some(_)) => Err(Error::Check(format!(
            "ifindex {ifindex} has bandwidth limits the config does not ask for"
        ))),
        (Some(_), None) => Err(Error::Check(format!(
            "bandwidth limits of ifindex {ifindex} are missing from sl_bw"
        ))),
        (Some(w), Some(h)) => {
            for (dir, w, h) in [
                ("egress", w.egress, h.egress),
                ("ingress", w.ingress, h.ingress),
            ] {
                if (w.rate, w.burst) != (h.rate, h.burst) {
                    return Err(Error::Check(format!(
                        "{dir} limit of ifindex {ifindex} is {} B/s burst {} B, the config asks for {} B/s burst {} B",
                        h.rate, h.burst, w.rate, w.burst
                    )));
                }
            }
            Ok(())
        }
    }
}

// --- EDT egress (`sl_edt`) -------------------------------------------------------

/// How a pod's egress limit is enforced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EgressMode {
    /// The token bucket in `from_pod` drops what exceeds it.
    Policer,
    /// `pod_edt` stamps departure times and `fq` on the pod's `eth0` holds
    /// packets until then.
    Edt,
}

impl EgressMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Policer => "policer",
            Self::Edt => "edt",
        }
    }
}

fn edt_map(root: &PinRoot) -> Result<HashMap<MapData, u32, EdtSlot>> {
    root.typed(&maps::EDT)
}

/// Shapes the egress of the pod on host veth `ifindex` with EDT; its `eth0` has
/// index `pod_ifindex` in its namespace (its clock starts now).
pub fn enable_edt(root: &PinRoot, ifindex: u32, pod_ifindex: u32) -> Result<()> {
    let slot = EdtSlot {
        last_ns: 0,
        pod_ifindex,
        _pad: 0,
    };
    edt_map(root)?
        .insert(ifindex, slot, 0)
        .map_err(|e| Error::map(format!("write ifindex {ifindex}"), maps::EDT.name, e))
}

/// Back to the policer for the pod on `ifindex` (none is fine; a datapath
/// pinned before `sl_edt` existed has none).
pub fn disable_edt(root: &PinRoot, ifindex: u32) -> Result<()> {
    if !root.has(&maps::EDT) {
        return Ok(());
    }
    let _ = edt_map(root)?.remove(&ifindex);
    Ok(())
}

/// The egress mode of the pod on `ifindex`.
pub fn egress_mode(root: &PinRoot, ifindex: u32) -> EgressMode {
    match edt_map(root).ok().and_then(|m| m.get(&ifindex, 0).ok()) {
        Some(_) => EgressMode::Edt,
        None => EgressMode::Policer,
    }
}

/// The egress modes of every pod, from one read of `sl_edt` (for listings:
/// [`egress_mode`] reads the map per pod).
pub struct EgressModes(Vec<u32>);

impl EgressModes {
    pub fn read(root: &PinRoot) -> Result<Self> {
        Ok(Self(edt_list(root)?.into_iter().map(|(i, _)| i).collect()))
    }

    /// The egress mode of the pod on `ifindex`.
    pub fn of(&self, ifindex: u32) -> EgressMode {
        if self.0.binary_search(&ifindex).is_ok() {
            EgressMode::Edt
        } else {
            EgressMode::Policer
        }
    }
}

/// Every pod with EDT egress: (host veth ifindex, its slot), sorted.
pub fn edt_list(root: &PinRoot) -> Result<Vec<(u32, EdtSlot)>> {
    if !root.has(&maps::EDT) {
        return Ok(Vec::new());
    }
    let mut v: Vec<(u32, EdtSlot)> = edt_map(root)?
        .iter()
        .filter_map(std::result::Result::ok)
        .collect();
    v.sort_by_key(|(i, _)| *i);
    Ok(v)
}
