//! `sl_agent`: the node agent's leases (see `sluice_common::agent`). The
//! agent takes and renews them; the datapath's in-kernel sweeper and the
//! plugin read them to know what they may leave to it.
use aya::maps::{Array, MapData};
use sluice_common::maps;

use crate::{Error, PinRoot, Result};

/// Whether this datapath has `sl_agent` (one loaded by an older sluice has
/// not: its work cannot be handed to the agent).
pub fn supported(root: &PinRoot) -> bool {
    root.has(&maps::AGENT)
}

/// One slot of `sl_agent` (`sluice_common::agent_slot`).
pub fn slot(root: &PinRoot, slot: u32) -> Result<u64> {
    let arr: Array<MapData, u64> = root.typed(&maps::AGENT)?;
    arr.get(&slot, 0)
        .map_err(|e| Error::map("read", maps::AGENT.name, e))
}

pub(crate) fn set_slot(root: &PinRoot, slot: u32, value: u64) -> Result<()> {
    let mut arr: Array<MapData, u64> = root.typed(&maps::AGENT)?;
    arr.set(slot, value, 0)
        .map_err(|e| Error::map("write", maps::AGENT.name, e))
}

/// How long the lease in `lease` (a `*_UNTIL_NS` slot) still lasts, in ns
/// (0: not held, or no `sl_agent`).
pub fn lease_left_ns(root: &PinRoot, lease: u32) -> Result<u64> {
    if !supported(root) {
        return Ok(0);
    }
    let until = slot(root, lease)?;
    Ok(until.saturating_sub(sluice_common::user::monotonic_ns()))
}

/// Takes (or renews) the lease in `lease` until `until_ns`
/// (`CLOCK_MONOTONIC`); 0 gives the work back at once.
pub fn set_lease(root: &PinRoot, lease: u32, until_ns: u64) -> Result<()> {
    set_slot(root, lease, until_ns)
}
