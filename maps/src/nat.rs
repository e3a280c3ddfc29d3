//! Masquerade: settings (`sl_masq`, `sl_masq6`), the prefixes never
//! masqueraded (`sl_nonmasq`, `sl_nonmasq6`), the flow tables (`sl_nat_fwd`,
//! `sl_nat_rev`; `sl_nat6_fwd`, `sl_nat6_rev`) and fragments (`sl_nat_frag`).
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnetwork::IpNetwork;

use aya::{
    maps::{Array, HashMap, MapData},
    Pod,
};
use sluice_common::{
    maps::{self, MapSpec},
    masq_flags, nat_flags, Addr6, FragEntry, FragKey, Masq6Config, MasqConfig, Nat6Entry, Nat6Key,
    NatEntry, NatEntryOf, NatKey, NatKeyOf, NatRevOf,
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
        remove_flows_where(root, &V4, |_, _: &NatEntry| true)?;
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
        remove_flows_where(root, &V4, |_, e: &NatEntry| {
            e.flags & nat_flags::INBOUND == 0 && !keep.contains(&e.nat_addr)
        })?;
    }
    Ok(())
}

/// The IPv6 masquerade settings.
pub fn config6(root: &PinRoot) -> Result<Masq6Config> {
    let arr: Array<MapData, Masq6Config> = root.typed(&maps::MASQ6)?;
    arr.get(&0, 0)
        .map_err(|e| Error::map("read", maps::MASQ6.name, e))
}

/// [`write_config`] for IPv6: the same rules for a new address and for
/// turning it off, on the IPv6 flow table.
pub fn write_config6(root: &PinRoot, mut cfg: Masq6Config) -> Result<()> {
    let mut arr: Array<MapData, Masq6Config> = root.typed(&maps::MASQ6)?;
    let old = arr.get(&0, 0).unwrap_or_default();
    let on = cfg.flags & masq_flags::ENABLED != 0;
    let was_on = old.flags & masq_flags::ENABLED != 0;
    let changed = was_on && on && old.addr != cfg.addr;
    if on {
        cfg.prev_addr = if changed { old.addr } else { old.prev_addr };
        if cfg.prev_addr == cfg.addr {
            cfg.prev_addr = Addr6::default();
        }
    }
    if old == cfg {
        return Ok(());
    }
    arr.set(0, cfg, 0)
        .map_err(|e| Error::map("write", maps::MASQ6.name, e))?;
    if was_on && !on {
        remove_flows_where(root, &V6, |_, _: &Nat6Entry| true)?;
    } else if changed {
        let keep = [cfg.addr, cfg.prev_addr];
        remove_flows_where(root, &V6, |_, e: &Nat6Entry| {
            e.flags & nat_flags::INBOUND == 0 && !keep.contains(&e.nat_addr)
        })?;
    }
    Ok(())
}

/// Who put a prefix into a non-masquerade trie: the value is a set of these
/// bits, and the datapath only asks whether a prefix is there.
pub mod non_masq_owner {
    /// The network config (`nonMasqueradeCIDRs` or its defaults), set by ADD.
    pub const CONFIG: u8 = 1;
    /// Another node's pod range, kept by `sluice-node route-sync`.
    pub const NODES: u8 = 2;
}

/// A key of the IPv4 non-masquerade trie: (prefix length, network).
pub type Prefix4 = (u32, [u8; 4]);
/// A key of the IPv6 non-masquerade trie.
pub type Prefix6 = (u32, [u8; 16]);

/// `nets` as the non-masquerade tries' keys, (prefix length, network) of
/// each family.
pub fn trie_prefixes(nets: &[IpNetwork]) -> (Vec<Prefix4>, Vec<Prefix6>) {
    let (mut v4, mut v6) = (Vec::new(), Vec::new());
    for n in nets {
        match n {
            IpNetwork::V4(n) => v4.push((u32::from(n.prefix()), n.network().octets())),
            IpNetwork::V6(n) => v6.push((u32::from(n.prefix()), n.network().octets())),
        }
    }
    (v4, v6)
}

/// Makes the non-masquerade trie hold exactly `cidrs` (prefix length, network)
/// for `owner` ([`non_masq_owner`]); prefixes of the other owner stay. New
/// prefixes are added before stale ones go, so traffic inside the cluster
/// range is never masqueraded while it changes.
pub fn set_non_masq(root: &PinRoot, owner: u8, cidrs: &[(u32, [u8; 4])]) -> Result<()> {
    crate::trie::set_owned(root, &maps::NON_MASQ, owner, cidrs, |a| {
        Ipv4Addr::from(a).into()
    })
}

/// [`set_non_masq`] for the IPv6 prefixes.
pub fn set_non_masq6(root: &PinRoot, owner: u8, cidrs: &[(u32, [u8; 16])]) -> Result<()> {
    crate::trie::set_owned(root, &maps::NON_MASQ6, owner, cidrs, |a| {
        Ipv6Addr::from(a).into()
    })
}

/// The forward and reverse map of one address family.
struct FlowMaps {
    fwd: MapSpec,
    rev: MapSpec,
}

const V4: FlowMaps = FlowMaps {
    fwd: maps::NAT_FWD,
    rev: maps::NAT_REV,
};
const V6: FlowMaps = FlowMaps {
    fwd: maps::NAT6_FWD,
    rev: maps::NAT6_REV,
};

/// Every IPv4 flow: (pod-side key, entry), sorted.
pub fn flows(root: &PinRoot) -> Result<Vec<(NatKey, NatEntry)>> {
    flows_in(root, &V4)
}

/// Every IPv6 flow, sorted; none where the datapath predates IPv6 masquerade.
pub fn flows6(root: &PinRoot) -> Result<Vec<(Nat6Key, Nat6Entry)>> {
    if !root.has(&maps::NAT6_FWD) {
        return Ok(Vec::new());
    }
    flows_in(root, &V6)
}

/// A flow as the forward map holds it.
type Flow<A, P> = (NatKeyOf<A>, NatEntryOf<A, P>);

fn flows_in<A, P>(root: &PinRoot, m: &FlowMaps) -> Result<Vec<Flow<A, P>>>
where
    A: Ord + Copy,
    NatKeyOf<A>: Pod,
    NatEntryOf<A, P>: Pod,
{
    let fwd: HashMap<MapData, NatKeyOf<A>, NatEntryOf<A, P>> = root.typed(&m.fwd)?;
    let mut v: Vec<_> = fwd.iter().filter_map(std::result::Result::ok).collect();
    v.sort_by_key(|(k, _)| (k.src_ip, k.src_port, k.dst_ip, k.dst_port, k.proto));
    Ok(v)
}

/// Removes IPv4 `flows`, each with its reverse entry (made with the flow's own
/// address; inbound flows have none). Returns how many went.
pub fn remove_flows(root: &PinRoot, flows: &[(NatKey, NatEntry)]) -> Result<usize> {
    remove_in(root, &V4, flows)
}

/// [`remove_flows`] for IPv6 flows.
pub fn remove_flows6(root: &PinRoot, flows: &[(Nat6Key, Nat6Entry)]) -> Result<usize> {
    remove_in(root, &V6, flows)
}

fn remove_in<A, P>(
    root: &PinRoot,
    m: &FlowMaps,
    flows: &[(NatKeyOf<A>, NatEntryOf<A, P>)],
) -> Result<usize>
where
    A: Copy,
    NatKeyOf<A>: Pod,
    NatEntryOf<A, P>: Pod,
    NatRevOf<A>: Pod,
{
    if flows.is_empty() {
        return Ok(0);
    }
    let mut fwd: HashMap<MapData, NatKeyOf<A>, NatEntryOf<A, P>> = root.typed(&m.fwd)?;
    let mut rev: HashMap<MapData, NatKeyOf<A>, NatRevOf<A>> = root.typed(&m.rev)?;
    let mut n = 0;
    for (k, e) in flows {
        if e.flags & nat_flags::INBOUND == 0 {
            let _ = rev.remove(&k.reverse(e.nat_addr, e.nat_port));
        }
        if fwd.remove(k).is_ok() {
            n += 1;
        }
    }
    // The pods' flow counts follow (the datapath counts only its own removals).
    crate::nat_pressure::recount(root)?;
    Ok(n)
}

/// Removes the flows of one family `doomed` picks.
fn remove_flows_where<A, P>(
    root: &PinRoot,
    m: &FlowMaps,
    doomed: impl Fn(&NatKeyOf<A>, &NatEntryOf<A, P>) -> bool,
) -> Result<usize>
where
    A: Ord + Copy,
    NatKeyOf<A>: Pod,
    NatEntryOf<A, P>: Pod,
    NatRevOf<A>: Pod,
{
    if !root.has(&m.fwd) {
        return Ok(0);
    }
    let picked: Vec<_> = flows_in(root, m)?
        .into_iter()
        .filter(|(k, e)| doomed(k, e))
        .collect();
    remove_in(root, m, &picked)
}

/// Forgets everything of pod addresses `v4` and `v6`: their flows (both
/// directions) and the fragments of their datagrams, so a later pod with a
/// reused address inherits none. Returns how many flows went.
pub fn forget_pods(root: &PinRoot, v4: &[[u8; 4]], v6: &[[u8; 16]]) -> Result<usize> {
    let mut n = 0;
    if !v4.is_empty() {
        if root.has(&maps::NAT_FRAG) {
            let mut frags: HashMap<MapData, FragKey, FragEntry> = root.typed(&maps::NAT_FRAG)?;
            let doomed: Vec<FragKey> = frags
                .iter()
                .filter_map(std::result::Result::ok)
                .filter(|(k, e)| v4.contains(&k.src_ip) || v4.contains(&e.addr))
                .map(|(k, _)| k)
                .collect();
            for k in &doomed {
                let _ = frags.remove(k);
            }
        }
        n += remove_flows_where(root, &V4, |k, _: &NatEntry| v4.contains(&k.src_ip))?;
    }
    if !v6.is_empty() {
        n += remove_flows_where(root, &V6, |k, _: &Nat6Entry| v6.contains(&k.src_ip.0))?;
    }
    if n == 0 {
        // Nothing removed, so nothing recounted: the pod's count (0 once the
        // sweeper took its last flow) goes all the same.
        crate::nat_pressure::recount(root)?;
    }
    Ok(n)
}
