//! The per-reason counters (`sl_counters`, per CPU).
use aya::maps::{MapData, PerCpuArray};
use sluice_common::{maps, reason};

use crate::{Error, PinRoot, Result};

/// Every defined reason's count summed over CPUs, by index (see
/// `sluice_common::reason`).
pub fn read(root: &PinRoot) -> Result<Vec<u64>> {
    let arr: PerCpuArray<MapData, u64> = root.typed(&maps::COUNTERS)?;
    (0..u32::try_from(reason::COUNT).unwrap_or(u32::MAX))
        .map(|i| {
            arr.get(&i, 0)
                .map(|v| v.iter().sum())
                .map_err(|e| Error::map("read", maps::COUNTERS.name, e))
        })
        .collect()
}

/// (name, count) of every defined reason.
pub fn named(root: &PinRoot) -> Result<Vec<(&'static str, u64)>> {
    Ok(reason::NAMES.iter().copied().zip(read(root)?).collect())
}
