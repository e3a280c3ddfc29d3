//! The LPM tries whose prefixes have owners (non-masquerade prefixes, Service
//! ranges): each value is a set of owner bits, so the plugin and the node
//! agent each keep their own prefixes without removing the other's.
use std::net::IpAddr;

use aya::{
    maps::{
        lpm_trie::{Key as LpmKey, LpmTrie},
        MapData,
    },
    Pod,
};
use sluice_common::maps::MapSpec;

use crate::{Error, PinRoot, Result};

/// Makes trie `spec` hold exactly `cidrs` (prefix length, network) for
/// `owner` (a bit); prefixes of other owners stay. New prefixes are added
/// before stale ones go, so a prefix that moves is never absent meanwhile.
/// `ip` names an address in errors.
pub(crate) fn set_owned<A: Pod + PartialEq>(
    root: &PinRoot,
    spec: &MapSpec,
    owner: u8,
    cidrs: &[(u32, A)],
    ip: fn(A) -> IpAddr,
) -> Result<()> {
    let mut trie: LpmTrie<MapData, A, u8> = root.typed(spec)?;
    let have: Vec<(LpmKey<A>, u8)> = trie.iter().filter_map(std::result::Result::ok).collect();
    let same = |h: &LpmKey<A>, len: u32, addr: A| h.prefix_len() == len && h.data() == addr;
    for (len, addr) in cidrs {
        let cur = have
            .iter()
            .find(|(h, _)| same(h, *len, *addr))
            .map_or(0, |(_, v)| *v);
        if cur & owner == 0 {
            trie.insert(&LpmKey::new(*len, *addr), cur | owner, 0)
                .map_err(|e| Error::map(format!("add {}/{len}", ip(*addr)), spec.name, e))?;
        }
    }
    for (h, v) in have {
        if v & owner == 0 || cidrs.iter().any(|(len, addr)| same(&h, *len, *addr)) {
            continue;
        }
        // Another owner's prefix stays; one written before owners existed
        // (value 1) counts as the config's.
        let _ = if v & !owner == 0 {
            trie.remove(&h)
        } else {
            trie.insert(&h, v & !owner, 0)
        };
    }
    Ok(())
}

/// Every prefix of trie `spec` with its owner bits, sorted.
pub(crate) fn list<A: Pod + Ord + Copy>(
    root: &PinRoot,
    spec: &MapSpec,
) -> Result<Vec<(u32, A, u8)>> {
    let trie: LpmTrie<MapData, A, u8> = root.typed(spec)?;
    let mut v: Vec<(u32, A, u8)> = trie
        .iter()
        .filter_map(std::result::Result::ok)
        .map(|(k, owners)| (k.prefix_len(), k.data(), owners))
        .collect();
    v.sort_by_key(|e| (e.1, e.0));
    Ok(v)
}
