//! Masquerade: settings (`sl_masq`), the prefixes never masqueraded
//! (`sl_nonmasq`), the flow table (`sl_nat_fwd`, `sl_nat_rev`) and fragments
//! (`sl_nat_frag`).
use std::net::Ipv4Addr;

use aya::maps::{
    lpm_trie::{Key as LpmKey, LpmTrie},
    Array, HashMap, MapData,
};
use sluice_common::{
    maps, masq_flags, nat_flags, FragEntry, FragKey, MasqConfig, NatEntry, NatKey, NatRev,
};

use crate::{Error, PinRoot, Result};

/// The masquerade settings.
pub fn config(root: &PinRoot) -> Result<MasqConfig> {
    let arr: Array<MapData, MasqConfig> = root.typed(&maps::MASQ)?;
    arr.get(&0, 0)
        .map_err(|e| Error::map("read", maps::MASQ.name, e))
}

/// Writes the masquerade settings the programs read (unchanged ones are not
/// rewritten). A new address: flows opened before keep theirs and still get
/// replies (`prev_addr`); flows of any older address are removed. Turned off:
/// every flow goes (no program would ever use or expire them again).
pub fn write_config(root: &PinRoot, mut cfg: MasqConfig) -> Result<()> {
    let mut arr: Array<MapData, MasqConfig> = root.typed(&maps::MASQ)?;
    let old = arr.get(&0, 0).unwrap_or_default();
    let was_on = old.flags & masq_flags::ENABLED != 0;
    if was_on && cfg.flags & masq_flags::ENABLED == 0 {
        arr.set(0, cfg, 0)
            .map_err(|e| Error::map("write", maps::MASQ.name, e))?;
        remove_flows_where(root, |_, _| true)?;
        return Ok(());
    }
    let changed = was_on && old.addr != cfg.addr;
    if cfg.flags & masq_flags::ENABLED != 0 {
        cfg.prev_addr = if changed { old.addr } else { old.prev_addr };
        if cfg.prev_addr == cfg.addr {
            cfg.prev_addr = [0; 4];
        }
    }
    if old == cfg {
        return Ok(());
    }
    arr.set(0, cfg, 0)
        .map_err(|e| Error::map("write", maps::MASQ.name, e))?;
    if changed && cfg.flags & masq_flags::ENABLED != 0 {
        let keep = [cfg.addr, cfg.prev_addr];
        remove_flows_where(root, |_, e| {
            e.flags & nat_flags::INBOUND == 0 && !keep.contains(&e.nat_addr)
        })?;
    }
    Ok(())
}

/// Makes the non-masquerade trie hold exactly `cidrs` (prefix length, network):
/// new prefixes are added before stale ones go, so traffic inside the cluster
/// range is never masqueraded while it changes.
pub fn set_non_masq(root: &PinRoot, cidrs: &[(u32, [u8; 4])]) -> Result<()> {
    let mut trie: LpmTrie<MapData, [u8; 4], u8> = root.typed(&maps::NON_MASQ)?;
    let have: Vec<LpmKey<[u8; 4]>> = trie.keys().filter_map(std::result::Result::ok).collect();
    let same =
        |h: &LpmKey<[u8; 4]>, len: u32, addr: [u8; 4]| h.prefix_len() == len && h.data() == addr;
    for (len, addr) in cidrs {
        if !have.iter().any(|h| same(h, *len, *addr)) {
            trie.insert(&LpmKey::new(*len, *addr), 1, 0).map_err(|e| {
                Error::map(
                    format!("add {}/{len}", Ipv4Addr::from(*addr)),
                    maps::NON_MASQ.name,
                    e,
                )
            })?;
        }
    }
    for h in have {
        if !cidrs.iter().any(|(len, addr)| same(&h, *len, *addr)) {
            let _ = trie.remove(&h);
        }
    }
    Ok(())
}

/// Every flow: (pod-side key, entry), sorted.
pub fn flows(root: &PinRoot) -> Result<Vec<(NatKey, NatEntry)>> {
    let fwd: HashMap<MapData, NatKey, NatEntry> = root.typed(&maps::NAT_FWD)?;
    let mut v: Vec<(NatKey, NatEntry)> = fwd.iter().filter_map(std::result::Result::ok).collect();
    v.sort_by_key(|(k, _)| (k.src_ip, k.src_port, k.dst_ip, k.dst_port, k.proto));
    Ok(v)
}

/// Removes `flows`, each with its reverse entry (made with the flow's own
/// address; inbound flows have none). Returns how many went.
pub fn remove_flows(root: &PinRoot, flows: &[(NatKey, NatEntry)]) -> Result<usize> {
    let mut fwd: HashMap<MapData, NatKey, NatEntry> = root.typed(&maps::NAT_FWD)?;
    let mut rev: HashMap<MapData, NatKey, NatRev> = root.typed(&maps::NAT_REV)?;
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

/// Removes the flows `doomed` picks.
fn remove_flows_where(
    root: &PinRoot,
    doomed: impl Fn(&NatKey, &NatEntry) -> bool,
) -> Result<usize> {
    if !root.has(&maps::NAT_FWD) {
        return Ok(0);
    }
    let picked: Vec<(NatKey, NatEntry)> = flows(root)?
        .into_iter()
        .filter(|(k, e)| doomed(k, e))
        .collect();
    remove_flows(root, &picked)
}

/// Forgets everything of pod addresses `ips`: their flows (both directions)
/// and the fragments of their datagrams, so a later pod with a reused address
/// inherits none. Returns how many flows went.
pub fn forget_pods(root: &PinRoot, ips: &[[u8; 4]]) -> Result<usize> {
    if ips.is_empty() {
        return Ok(0);
    }
    if root.has(&maps::NAT_FRAG) {
        let mut frags: HashMap<MapData, FragKey, FragEntry> = root.typed(&maps::NAT_FRAG)?;
        let doomed: Vec<FragKey> = frags
            .iter()
            .filter_map(std::result::Result::ok)
            .filter(|(k, e)| ips.contains(&k.src_ip) || ips.contains(&e.addr))
            .map(|(k, _)| k)
            .collect();
        for k in &doomed {
            let _ = frags.remove(k);
        }
    }
    remove_flows_where(root, |k, _| ips.contains(&k.src_ip))
}
