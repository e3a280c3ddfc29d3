//! Node-wide state: the loaded datapath's identity (`sl_meta`), the settings
//! the programs read (`sl_config`) and the monitor switches (`sl_monitor`).
use aya::maps::{Array, MapData};
use sluice_common::{maps, DatapathMeta, NodeConfig};

use crate::{Error, PinRoot, Result};

/// The identity of the pinned datapath; `None` when nothing is pinned, or when
/// the maps were created by a load that did not finish (a zeroed entry).
pub fn meta(root: &PinRoot) -> Result<Option<DatapathMeta>> {
    if !root.has(&maps::META) {
        return Ok(None);
    }
    Ok(Some(read_meta(root)?).filter(|m| m.layout_version != 0))
}

/// The `sl_meta` entry as it is (layout 0: a load that did not finish); an
/// error naming why when it cannot be read (nothing pinned, root-only).
pub fn read_meta(root: &PinRoot) -> Result<DatapathMeta> {
    let arr: Array<MapData, DatapathMeta> = root.typed(&maps::META)?;
    arr.get(&0, 0)
        .map_err(|e| Error::map("read", maps::META.name, e))
}

/// Records the identity of the datapath just loaded.
pub fn write_meta(root: &PinRoot, meta: DatapathMeta) -> Result<()> {
    let mut arr: Array<MapData, DatapathMeta> = root.typed(&maps::META)?;
    arr.set(0, meta, 0)
        .map_err(|e| Error::map("write", maps::META.name, e))
}

/// The node settings the programs read.
pub fn config(root: &PinRoot) -> Result<NodeConfig> {
    let arr: Array<MapData, NodeConfig> = root.typed(&maps::CONFIG)?;
    arr.get(&0, 0)
        .map_err(|e| Error::map("read", maps::CONFIG.name, e))
}

/// Writes the node settings the programs read.
pub fn write_config(root: &PinRoot, cfg: NodeConfig) -> Result<()> {
    let mut arr: Array<MapData, NodeConfig> = root.typed(&maps::CONFIG)?;
    arr.set(0, cfg, 0)
        .map_err(|e| Error::map("write", maps::CONFIG.name, e))
}

/// One slot of `sl_monitor` (see `sluice_common::monitor_slot`).
pub fn monitor_slot(root: &PinRoot, slot: u32) -> Result<u64> {
    let arr: Array<MapData, u64> = root.typed(&maps::MONITOR)?;
    arr.get(&slot, 0)
        .map_err(|e| Error::map("read", maps::MONITOR.name, e))
}

/// Writes one slot of `sl_monitor` unless it holds `value` already. A datapath
/// loaded before the map existed has none: nothing to switch.
pub fn set_monitor_slot(root: &PinRoot, slot: u32, value: u64) -> Result<()> {
    if !root.has(&maps::MONITOR) {
        return Ok(());
    }
    let mut arr: Array<MapData, u64> = root.typed(&maps::MONITOR)?;
    if arr.get(&slot, 0).ok() == Some(value) {
        return Ok(());
    }
    arr.set(slot, value, 0)
        .map_err(|e| Error::map("write", maps::MONITOR.name, e))
}
