//! NetworkPolicy: the switch (`sl_pol_config`), the pods the agent compiled
//! (`sl_pol_pods`), their rule sets (`sl_pol_rules`, an LPM trie), the flows
//! let in (`sl_pol_ct`) and the new flows each rule let in (`sl_pol_hits`,
//! per CPU). See `sluice_common::policy`.
//!
//! A datapath loaded by a sluice from before these maps has none of them:
//! readers then find nothing ([`config`] is `None`, the lists are empty),
//! [`write_config`] and the removals do nothing, and the other writes fail
//! with the missing pin's name.
//!
//! `sl_pol_rules` is opened as aya's `LpmTrie` whose `Key` is the trie's
//! `prefixlen` followed by `KeyData`, the 24 bytes of [`PolicyKey`] after
//! its own `prefixlen` (`set`, `dir`, the padding, `peer`) as a byte array:
//! `Key<KeyData>` has exactly `PolicyKey`'s layout (28 bytes, no padding),
//! and the conversion is field by field, without `unsafe`.
use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use aya::maps::{
    lpm_trie::{Key as LpmKey, LpmTrie},
    Array, HashMap, MapData, MapError, PerCpuArray, PerCpuValues,
};
use ipnetwork::IpNetwork;
use sluice_common::{
    map_sizes, maps, IpKey, PolicyConfig, PolicyFlow, PolicyFlowKey, PolicyKey, PolicyPod,
    PolicyRules,
};

use crate::{
    endpoint::{ip_key, key_ip},
    error::is_not_found,
    Error, PinRoot, Result,
};

/// What [`PolicyKey`] holds after its `prefixlen`: `set` (native byte
/// order), `dir`, three bytes of padding, `peer`.
type KeyData = [u8; 24];

/// Bits of the peer's address in a key: an IPv4 prefix is IPv4-mapped IPv6.
const V4_MAPPED_BITS: u32 = 96;

/// The key of rule set `set`, direction `dir` (`policy_dir`), peer prefix
/// `net`: `PolicyKey::FIXED_BITS` and then the prefix's length, IPv4 as
/// IPv4-mapped IPv6 (96 bits more). Host bits are cleared (`10.1.2.3/16` is
/// `10.1.0.0/16`), so a key written and a key listed compare equal.
pub fn key(set: u32, dir: u8, net: IpNetwork) -> PolicyKey {
    let (bits, peer) = match net {
        IpNetwork::V4(n) => (
            V4_MAPPED_BITS + u32::from(n.prefix()),
            IpKey::v4(n.network().octets()),
        ),
        IpNetwork::V6(n) => (u32::from(n.prefix()), IpKey::v6(n.network().octets())),
    };
    PolicyKey {
        prefixlen: PolicyKey::FIXED_BITS + bits,
        set,
        dir,
        _pad: [0; 3],
        peer,
    }
}

/// The peer prefix of a key; `None` when its length does not cover `set`
/// and `dir` or is longer than an address. A prefix of 96 bits or more
/// inside `::ffff:0:0/96` is IPv4 (`::ffff:0:0/96` itself is `0.0.0.0/0`,
/// which [`key`] writes the same way).
pub fn key_net(k: &PolicyKey) -> Option<IpNetwork> {
    let bits = k.prefixlen.checked_sub(PolicyKey::FIXED_BITS)?;
    if bits > 128 {
        return None;
    }
    let len = |b: u32| u8::try_from(b).ok();
    match k.peer.as_v4() {
        Some(v4) if bits >= V4_MAPPED_BITS => {
            IpNetwork::new(Ipv4Addr::from(v4).into(), len(bits - V4_MAPPED_BITS)?).ok()
        }
        _ => IpNetwork::new(Ipv6Addr::from(k.peer.addr).into(), len(bits)?).ok(),
    }
}

/// A [`PolicyKey`] as aya's trie key.
fn lpm_key(k: &PolicyKey) -> LpmKey<KeyData> {
    let mut d = [0u8; 24];
    d[..4].copy_from_slice(&k.set.to_ne_bytes());
    d[4] = k.dir;
    d[5..8].copy_from_slice(&k._pad);
    d[8..].copy_from_slice(&k.peer.addr);
    LpmKey::new(k.prefixlen, d)
}

/// The [`PolicyKey`] of aya's trie key.
fn policy_key(k: &LpmKey<KeyData>) -> PolicyKey {
    let d = k.data();
    let mut peer = [0u8; 16];
    peer.copy_from_slice(&d[8..]);
    PolicyKey {
        prefixlen: k.prefix_len(),
        set: u32::from_ne_bytes([d[0], d[1], d[2], d[3]]),
        dir: d[4],
        _pad: [d[5], d[6], d[7]],
        peer: IpKey::v6(peer),
    }
}

/// Whether a write failed because the map is full (a hash map or trie
/// answers `E2BIG` or `ENOSPC`; one without preallocation may answer
/// `ENOMEM`).
fn write_error(what: String, map: &'static str, max: u32, e: MapError) -> Error {
    match &e {
        MapError::SyscallError(s)
            if matches!(
                s.io_error.raw_os_error(),
                Some(libc::E2BIG | libc::ENOSPC | libc::ENOMEM)
            ) =>
        {
            Error::Full { map, max }
        }
        _ => Error::map(what, map, e),
    }
}

/// A removal of a key that is not there is no error.
fn removed(r: std::result::Result<(), MapError>, what: String, map: &'static str) -> Result<()> {
    match r {
        Ok(()) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(Error::map(what, map, e)),
    }
}

/// Whether the datapath has the policy maps (a sluice from before them
/// loaded it otherwise).
pub fn available(root: &PinRoot) -> bool {
    root.has(&maps::POL_CONFIG)
}

// --- the switch -------------------------------------------------------------

/// Whether and how policy is enforced (`sl_pol_config`); `None` without the
/// map.
pub fn config(root: &PinRoot) -> Result<Option<PolicyConfig>> {
    if !root.has(&maps::POL_CONFIG) {
        return Ok(None);
    }
    let m: Array<MapData, PolicyConfig> = root.typed(&maps::POL_CONFIG)?;
    m.get(&0, 0)
        .map(Some)
        .map_err(|e| Error::map("read", maps::POL_CONFIG.name, e))
}

/// Writes `sl_pol_config` unless it holds `cfg` already; a datapath without
/// the map is left alone.
pub fn write_config(root: &PinRoot, cfg: &PolicyConfig) -> Result<()> {
    if !root.has(&maps::POL_CONFIG) {
        return Ok(());
    }
    let mut m: Array<MapData, PolicyConfig> = root.typed(&maps::POL_CONFIG)?;
    if m.get(&0, 0).ok().as_ref() == Some(cfg) {
        return Ok(());
    }
    m.set(0, *cfg, 0)
        .map_err(|e| Error::map("write", maps::POL_CONFIG.name, e))
}

// --- the pods ---------------------------------------------------------------

/// Every pod address with an entry (compiled), by address; none without the
/// map.
pub fn pods(root: &PinRoot) -> Result<BTreeMap<IpAddr, PolicyPod>> {
    if !root.has(&maps::POL_PODS) {
        return Ok(BTreeMap::new());
    }
    let v: Vec<(IpKey, PolicyPod)> = crate::batch::lookup_all(root, &maps::POL_PODS)?;
    Ok(v.into_iter().map(|(k, p)| (key_ip(&k), p)).collect())
}

/// The entry of pod address `ip`, if it has one.
pub fn pod(root: &PinRoot, ip: IpAddr) -> Result<Option<PolicyPod>> {
    if !root.has(&maps::POL_PODS) {
        return Ok(None);
    }
    let m: HashMap<MapData, IpKey, PolicyPod> = root.typed(&maps::POL_PODS)?;
    match m.get(&ip_key(ip), 0) {
        Ok(p) => Ok(Some(p)),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(Error::map(format!("read {ip}"), maps::POL_PODS.name, e)),
    }
}

/// Creates or replaces the entry of pod address `ip`.
pub fn put_pod(root: &PinRoot, ip: IpAddr, pod: &PolicyPod) -> Result<()> {
    let mut m: HashMap<MapData, IpKey, PolicyPod> = root.typed(&maps::POL_PODS)?;
    m.insert(ip_key(ip), pod, 0).map_err(|e| {
        write_error(
            format!("write {ip}"),
            maps::POL_PODS.name,
            map_sizes::POL_PODS,
            e,
        )
    })
}

/// Removes the entry of pod address `ip` (the pod is pending again while
/// policy is on); nothing if it has none.
pub fn remove_pod(root: &PinRoot, ip: IpAddr) -> Result<()> {
    if !root.has(&maps::POL_PODS) {
        return Ok(());
    }
    let mut m: HashMap<MapData, IpKey, PolicyPod> = root.typed(&maps::POL_PODS)?;
    removed(
        m.remove(&ip_key(ip)),
        format!("remove {ip}"),
        maps::POL_PODS.name,
    )
}

// --- the rules --------------------------------------------------------------

fn rules_map(root: &PinRoot) -> Result<LpmTrie<MapData, KeyData, PolicyRules>> {
    root.typed(&maps::POL_RULES)
}

/// Every entry of `sl_pol_rules`, sorted by set, direction, peer address
/// and prefix length; none without the map.
pub fn rules(root: &PinRoot) -> Result<Vec<(PolicyKey, PolicyRules)>> {
    if !root.has(&maps::POL_RULES) {
        return Ok(Vec::new());
    }
    let m = rules_map(root)?;
    let mut v = Vec::new();
    for r in &m {
        let (k, rules) = r.map_err(|e| Error::map("read", maps::POL_RULES.name, e))?;
        v.push((policy_key(&k), rules));
    }
    v.sort_by_key(|(k, _)| (k.set, k.dir, k.peer.addr, k.prefixlen));
    Ok(v)
}

/// The entry the programs would find for `peer` in rule set `set`,
/// direction `dir`: the entry of the longest prefix holding it.
pub fn lookup_rules(
    root: &PinRoot,
    set: u32,
    dir: u8,
    peer: IpAddr,
) -> Result<Option<PolicyRules>> {
    if !root.has(&maps::POL_RULES) {
        return Ok(None);
    }
    let m = rules_map(root)?;
    match m.get(&lpm_key(&PolicyKey::lookup(set, dir, ip_key(peer))), 0) {
        Ok(v) => Ok(Some(v)),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(Error::map(
            format!("look up {peer}"),
            maps::POL_RULES.name,
            e,
        )),
    }
}

/// Creates or replaces the entry of key `k`.
pub fn put_rules(root: &PinRoot, k: &PolicyKey, rules: &PolicyRules) -> Result<()> {
    let mut m = rules_map(root)?;
    m.insert(&lpm_key(k), rules, 0).map_err(|e| {
        write_error(
            format!("write {}", show_key(k)),
            maps::POL_RULES.name,
            map_sizes::POL_RULES,
            e,
        )
    })
}

/// Removes the entry of key `k` (exactly: prefix length and address);
/// nothing if there is none.
pub fn remove_rules(root: &PinRoot, k: &PolicyKey) -> Result<()> {
    if !root.has(&maps::POL_RULES) {
        return Ok(());
    }
    let mut m = rules_map(root)?;
    removed(
        m.remove(&lpm_key(k)),
        format!("remove {}", show_key(k)),
        maps::POL_RULES.name,
    )
}

/// `set 3 ingress 10.0.0.0/8`, for errors and listings.
pub fn show_key(k: &PolicyKey) -> String {
    let dir = match k.dir {
        sluice_common::policy_dir::INGRESS => "ingress".to_string(),
        sluice_common::policy_dir::EGRESS => "egress".to_string(),
        d => format!("dir {d}"),
    };
    let net = key_net(k).map_or_else(
        || format!("{} (prefixlen {})", key_ip(&k.peer), k.prefixlen),
        |n| n.to_string(),
    );
    format!("set {} {dir} {net}", k.set)
}

// --- the counters -----------------------------------------------------------

fn hits_map(root: &PinRoot) -> Result<PerCpuArray<MapData, u64>> {
    root.typed(&maps::POL_HITS)
}

/// The new flows each rule id let in, summed over CPUs, by id (index `i`
/// is rule `i`: every id of the map, 65,536 reads); none without the map.
pub fn hits(root: &PinRoot) -> Result<Vec<u64>> {
    if !root.has(&maps::POL_HITS) {
        return Ok(Vec::new());
    }
    let m = hits_map(root)?;
    m.iter()
        .map(|r| {
            r.map(|v| v.iter().sum())
                .map_err(|e| Error::map("read", maps::POL_HITS.name, e))
        })
        .collect()
}

/// The new flows rule ids `ids` let in, summed over CPUs; none without the
/// map.
pub fn hits_of(root: &PinRoot, ids: &[u16]) -> Result<BTreeMap<u16, u64>> {
    if !root.has(&maps::POL_HITS) {
        return Ok(BTreeMap::new());
    }
    let m = hits_map(root)?;
    ids.iter()
        .map(|id| {
            m.get(&u32::from(*id), 0)
                .map(|v| (*id, v.iter().sum()))
                .map_err(|e| Error::map(format!("read rule {id}"), maps::POL_HITS.name, e))
        })
        .collect()
}

/// Zeroes the counters of rule ids `ids` on every CPU (ids given to new
/// rules); nothing without the map.
pub fn clear_hits(root: &PinRoot, ids: &[u16]) -> Result<()> {
    if ids.is_empty() || !root.has(&maps::POL_HITS) {
        return Ok(());
    }
    let mut m = hits_map(root)?;
    let cpus = aya::util::nr_cpus().map_err(|(_, e)| Error::io("counting CPUs", e))?;
    for id in ids {
        let zero = PerCpuValues::try_from(vec![0u64; cpus])
            .map_err(|e| Error::io("building per-CPU counters", e))?;
        m.set(u32::from(*id), zero, 0)
            .map_err(|e| Error::map(format!("clear rule {id}"), maps::POL_HITS.name, e))?;
    }
    Ok(())
}

// --- the flows --------------------------------------------------------------

/// Every flow verdict remembered, sorted by direction, source, destination,
/// ports and protocol; none without the map.
pub fn flows(root: &PinRoot) -> Result<Vec<(PolicyFlowKey, PolicyFlow)>> {
    if !root.has(&maps::POL_CT) {
        return Ok(Vec::new());
    }
    let mut v: Vec<(PolicyFlowKey, PolicyFlow)> = crate::batch::lookup_all(root, &maps::POL_CT)?;
    v.sort_by_key(|(k, _)| (k.dir, k.src.addr, k.dst.addr, k.sport, k.dport, k.proto));
    Ok(v)
}

/// Removes the flow verdicts `pred` picks (a pod's flows, the flows made
/// under a stale rule set); how many went. Entries the LRU evicted or the
/// programs removed meanwhile are skipped.
pub fn remove_flows_of(
    root: &PinRoot,
    pred: impl Fn(&PolicyFlowKey, &PolicyFlow) -> bool,
) -> Result<usize> {
    if !root.has(&maps::POL_CT) {
        return Ok(0);
    }
    let gone: Vec<PolicyFlowKey> = flows(root)?
        .into_iter()
        .filter(|(k, f)| pred(k, f))
        .map(|(k, _)| k)
        .collect();
    let mut m: HashMap<MapData, PolicyFlowKey, PolicyFlow> = root.typed(&maps::POL_CT)?;
    let mut n = 0;
    for k in &gone {
        match m.remove(k) {
            Ok(()) => n += 1,
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(Error::map("remove a flow", maps::POL_CT.name, e)),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use sluice_common::policy_dir::{EGRESS, INGRESS};

    use super::*;

    fn net(s: &str) -> IpNetwork {
        s.parse().unwrap()
    }

    #[test]
    fn policy_key_of_ipv4_prefix_is_mapped_and_masked() {
        let k = key(7, INGRESS, net("10.1.2.3/16"));
        assert_eq!(k.prefixlen, 64 + 96 + 16);
        assert_eq!((k.set, k.dir, k._pad), (7, INGRESS, [0; 3]));
        assert_eq!(k.peer, IpKey::v4([10, 1, 0, 0]));
        assert_eq!(key_net(&k), Some(net("10.1.0.0/16")));

        let host = key(1, EGRESS, net("192.0.2.9/32"));
        assert_eq!(host.prefixlen, 64 + 128);
        assert_eq!(
            host,
            PolicyKey::lookup(1, EGRESS, IpKey::v4([192, 0, 2, 9]))
        );
        assert_eq!(key_net(&host), Some(net("192.0.2.9/32")));

        let any = key(2, EGRESS, net("0.0.0.0/0"));
        assert_eq!(any.prefixlen, 64 + 96);
        assert_eq!(any.peer, IpKey::v4([0; 4]));
        assert_eq!(key_net(&any), Some(net("0.0.0.0/0")));
    }

    #[test]
    fn policy_key_of_ipv6_prefix_is_masked() {
        let k = key(3, EGRESS, net("fd00:1:2:3::9/48"));
        assert_eq!(k.prefixlen, 64 + 48);
        assert_eq!(key_ip(&k.peer), "fd00:1:2::".parse::<IpAddr>().unwrap());
        assert_eq!(key_net(&k), Some(net("fd00:1:2::/48")));

        let any = key(3, INGRESS, net("::/0"));
        assert_eq!(any.prefixlen, 64);
        assert_eq!(key_net(&any), Some(net("::/0")));

        let host = key(3, INGRESS, net("2001:db8::1/128"));
        assert_eq!(host.prefixlen, 64 + 128);
        assert_eq!(key_net(&host), Some(net("2001:db8::1/128")));
    }

    #[test]
    fn policy_key_net_round_trips_and_refuses_bad_lengths() {
        for s in [
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.0.2.128/25",
            "0.0.0.0/0",
            "255.255.255.255/32",
            "fd00::/8",
            "2001:db8:1::/64",
            "::/0",
            "::1/128",
        ] {
            let n = net(s);
            assert_eq!(key_net(&key(9, INGRESS, n)), Some(n), "{s}");
        }
        let mut k = key(9, INGRESS, net("10.0.0.0/8"));
        k.prefixlen = 63;
        assert_eq!(key_net(&k), None);
        k.prefixlen = 64 + 129;
        assert_eq!(key_net(&k), None);
        // A v4-mapped address under 96 bits is an IPv6 prefix (shown as the
        // key holds it).
        k.prefixlen = 64 + 80;
        assert_eq!(key_net(&k), Some(net("::ffff:10.0.0.0/80")));
    }

    #[test]
    fn policy_key_has_the_trie_key_layout() {
        assert_eq!(
            std::mem::size_of::<PolicyKey>(),
            std::mem::size_of::<LpmKey<KeyData>>()
        );
        assert_eq!(std::mem::size_of::<PolicyKey>(), maps::POL_RULES.key_size);
        let k = key(0x0102_0304, EGRESS, net("198.51.100.0/24"));
        let lk = lpm_key(&k);
        assert_eq!(lk.prefix_len(), k.prefixlen);
        assert_eq!(policy_key(&lk), k);
        // The bytes after prefixlen are PolicyKey's own, in its order.
        let d = lk.data();
        assert_eq!(&d[..4], &0x0102_0304u32.to_ne_bytes());
        assert_eq!(d[4], EGRESS);
        assert_eq!(&d[8..], &IpKey::v4([198, 51, 100, 0]).addr);
    }
}
