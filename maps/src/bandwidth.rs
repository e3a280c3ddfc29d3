//! Bandwidth limits: each pod's two token buckets (`sl_bw`).
use aya::maps::{HashMap, MapData};
use sluice_common::{maps, BwState};

use crate::{Error, PinRoot, Result};

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
