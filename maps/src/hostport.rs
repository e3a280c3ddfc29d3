//! hostPort: the mappings (`sl_ports`) and their rules, the node addresses a
//! wildcard mapping matches (`sl_node_addrs`), translated flows (`sl_hp_ct`),
//! the socket hooks' state (`sl_hp_sock`) and the switch that turns the
//! programs' hostPort path on (`sl_hp_config`).
use std::net::Ipv4Addr;

use aya::maps::{Array, HashMap, MapData};
use sluice_common::{
    maps, port_flags, EndpointInfo, HostPortConfig, HpFlow, NatKey, PortKey, PortTarget, SockKey,
    SockOrig,
};

use crate::{endpoint::text, error::is_exists, Error, PinRoot, Result};

/// `BPF_NOEXIST`: insert only where the key is free.
const BPF_NOEXIST: u64 = 1;

/// `tcp`, `udp`, `sctp` or `?` for an IP protocol number.
pub fn proto_name(n: u8) -> &'static str {
    match n {
        6 => "tcp",
        17 => "udp",
        132 => "sctp",
        _ => "?",
    }
}

/// `*:8080/tcp` or `192.168.1.5:8080/tcp`.
pub fn describe(k: &PortKey) -> String {
    let host = if k.host_ip == [0; 4] {
        "*".to_string()
    } else {
        Ipv4Addr::from(k.host_ip).to_string()
    };
    format!("{host}:{}/{}", k.port(), proto_name(k.proto))
}

/// `10.22.0.5:80`.
pub fn describe_target(t: &PortTarget) -> String {
    format!("{}:{}", Ipv4Addr::from(t.pod_ip), u16::from_be(t.pod_port))
}

fn ports(root: &PinRoot) -> Result<HashMap<MapData, PortKey, PortTarget>> {
    root.typed(&maps::PORTS)
}

/// Every mapping, sorted by port, protocol, address.
pub fn list(root: &PinRoot) -> Result<Vec<(PortKey, PortTarget)>> {
    let mut v: Vec<(PortKey, PortTarget)> = ports(root)?
        .iter()
        .filter_map(std::result::Result::ok)
        .collect();
    v.sort_by_key(|(k, _)| (k.port(), k.proto, k.host_ip));
    Ok(v)
}

/// Who owns a mapping: the container id (and interface) of its pod, from
/// `sl_ep_info`, or "an operator".
pub fn owner(root: &PinRoot, t: &PortTarget) -> String {
    let who = root
        .typed::<HashMap<MapData, u32, EndpointInfo>>(&maps::ENDPOINT_INFO)
        .ok()
        .and_then(|m| m.get(&t.pod_ifindex, 0).ok())
        .map(|i| format!("container {} ({})", text(&i.container_id), text(&i.ifname)));
    let who = who.unwrap_or_else(|| format!("the pod on ifindex {}", t.pod_ifindex));
    if t.flags & port_flags::OPERATOR == 0 {
        who
    } else {
        format!("an operator (sluicectl ports add, to {who})")
    }
}

fn conflict(root: &PinRoot, k: PortKey, t: PortTarget) -> Error {
    Error::PortConflict {
        port: describe(&k),
        target: describe_target(&t),
        owner: owner(root, &t),
    }
}

/// Keys that would overlap `k`: a wildcard mapping overlaps the same port on
/// each node address, and the other way round.
pub fn overlapping(k: &PortKey, node_addrs: &[[u8; 4]]) -> Vec<PortKey> {
    if k.host_ip == [0; 4] {
        node_addrs
            .iter()
            .map(|a| PortKey { host_ip: *a, ..*k })
            .collect()
    } else {
        vec![k.any_address()]
    }
}

/// Publishes `entries`, all or none: each key is taken with `BPF_NOEXIST`, so two
/// ADDs (or an ADD and an operator) racing for one port cannot both win. A key
/// the same pod holds already (a repeated ADD) is fine; a key overlapping
/// another pod's mapping (wildcard vs. a node address) is a conflict naming
/// the port and its owner. Turns the programs' hostPort path on for the node
/// namespace whose cookie is `netns_cookie` (see [`node_netns_cookie`]).
pub fn add(root: &PinRoot, entries: &[(PortKey, PortTarget)], netns_cookie: u64) -> Result<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let mut map = ports(root)?;
    let node_addrs = node_addrs(root)?;
    let mut taken: Vec<PortKey> = Vec::new();
    let mut result = Ok(());
    'entries: for (k, t) in entries {
        for o in overlapping(k, &node_addrs) {
            if let Ok(other) = map.get(&o, 0) {
                if other.pod_ifindex != t.pod_ifindex {
                    result = Err(conflict(root, o, other));
                    break 'entries;
                }
            }
        }
        match map.insert(k, t, BPF_NOEXIST) {
            Ok(()) => taken.push(*k),
            Err(e) if is_exists(&e) => match map.get(k, 0) {
                Ok(other) if other == *t => {}
                Ok(other) => {
                    result = Err(conflict(root, *k, other));
                    break;
                }
                Err(e) => {
                    result = Err(Error::map(
                        format!("read {}", describe(k)),
                        maps::PORTS.name,
                        e,
                    ));
                    break;
                }
            },
            Err(e) => {
                result = Err(Error::map(
                    format!("add {}", describe(k)),
                    maps::PORTS.name,
                    e,
                ));
                break;
            }
        }
    }
    if result.is_err() {
        for k in &taken {
            let _ = map.remove(k);
        }
        return result;
    }
    activate(root, netns_cookie)
}

/// Removes the mapping at `k` whatever its owner; `false` when there was none.
pub fn remove_key(root: &PinRoot, k: &PortKey) -> Result<bool> {
    Ok(ports(root)?.remove(k).is_ok())
}

/// Removes every mapping whose pod is on one of `ifindexes` (operator mappings
/// included). Walks the whole map. Returns how many went.
pub fn remove_of_pods(root: &PinRoot, ifindexes: &[u32]) -> Result<usize> {
    if ifindexes.is_empty() || !root.has(&maps::PORTS) {
        return Ok(0);
    }
    let mut map = ports(root)?;
    let doomed: Vec<PortKey> = map
        .iter()
        .filter_map(std::result::Result::ok)
        .filter(|(_, t)| ifindexes.contains(&t.pod_ifindex))
        .map(|(k, _)| k)
        .collect();
    for k in &doomed {
        let _ = map.remove(k);
    }
    Ok(doomed.len())
}

/// Removes every mapping whose pod is not one of `live` (host veth ifindexes).
pub fn remove_orphans(root: &PinRoot, live: &[u32]) -> Result<usize> {
    if !root.has(&maps::PORTS) {
        return Ok(0);
    }
    let mut orphans: Vec<u32> = ports(root)?
        .iter()
        .filter_map(std::result::Result::ok)
        .map(|(_, t)| t.pod_ifindex)
        .filter(|i| !live.contains(i))
        .collect();
    orphans.sort_unstable();
    orphans.dedup();
    remove_of_pods(root, &orphans)
}

/// Forgets the translated flows and socket rewrites of pod addresses `ips`, so
/// a later pod with a reused address inherits none.
pub fn forget_pods(root: &PinRoot, ips: &[[u8; 4]]) -> Result<()> {
    if ips.is_empty() || !root.has(&maps::HP_CT) {
        return Ok(());
    }
    let mut ct: HashMap<MapData, NatKey, HpFlow> = root.typed(&maps::HP_CT)?;
    let doomed: Vec<NatKey> = ct
        .iter()
        .filter_map(std::result::Result::ok)
        .filter(|(k, f)| ips.contains(&k.src_ip) || ips.contains(&f.dst_ip))
        .map(|(k, _)| k)
        .collect();
    for k in &doomed {
        let _ = ct.remove(k);
    }
    let mut socks: HashMap<MapData, SockKey, SockOrig> = root.typed(&maps::HP_SOCK)?;
    let doomed: Vec<SockKey> = socks
        .keys()
        .filter_map(std::result::Result::ok)
        .filter(|k| ips.contains(&k.pod_ip))
        .collect();
    for k in &doomed {
        let _ = socks.remove(k);
    }
    Ok(())
}

/// CHECK: each entry is in place, for this pod.
pub fn check(root: &PinRoot, entries: &[(PortKey, PortTarget)]) -> Result<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let map =
        ports(root).map_err(|e| Error::Check(format!("hostPort mappings unreadable: {e}")))?;
    for (k, t) in entries {
        match map.get(k, 0) {
            Ok(found) if found == *t => {}
            Ok(found) => {
                return Err(Error::Check(format!(
                    "hostPort {} goes to {} (ifindex {}), not {} (ifindex {})",
                    describe(k),
                    describe_target(&found),
                    found.pod_ifindex,
                    describe_target(t),
                    t.pod_ifindex
                )))
            }
            Err(_) => {
                return Err(Error::Check(format!(
                    "hostPort mapping {} -> {} is missing",
                    describe(k),
                    describe_target(t)
                )))
            }
        }
    }
    Ok(())
}

fn node_addrs_map(root: &PinRoot) -> Result<HashMap<MapData, [u8; 4], u8>> {
    root.typed(&maps::NODE_ADDRS)
}

/// The node addresses in `sl_node_addrs`.
pub fn node_addrs(root: &PinRoot) -> Result<Vec<[u8; 4]>> {
    Ok(node_addrs_map(root)?
        .keys()
        .filter_map(std::result::Result::ok)
        .collect())
}

/// Makes `sl_node_addrs` hold exactly `addrs` (the node's IPv4 addresses now).
pub fn set_node_addrs(root: &PinRoot, addrs: &[[u8; 4]]) -> Result<()> {
    let mut map = node_addrs_map(root)?;
    let old: Vec<[u8; 4]> = map.keys().filter_map(std::result::Result::ok).collect();
    for a in addrs {
        if !old.contains(a) {
            map.insert(a, 1, 0).map_err(|e| {
                Error::map(
                    format!("add {}", Ipv4Addr::from(*a)),
                    maps::NODE_ADDRS.name,
                    e,
                )
            })?;
        }
    }
    for a in old.iter().filter(|a| !addrs.contains(a)) {
        let _ = map.remove(a);
    }
    Ok(())
}

/// Turns the pod programs' flow lookup on and records the node namespace (the
/// socket hooks act there only).
fn activate(root: &PinRoot, netns_cookie: u64) -> Result<()> {
    let mut arr: Array<MapData, HostPortConfig> = root.typed(&maps::HP_CONFIG)?;
    let cfg = HostPortConfig {
        netns_cookie,
        active: 1,
        _pad: 0,
    };
    if arr.get(&0, 0).ok() != Some(cfg) {
        arr.set(0, cfg, 0)
            .map_err(|e| Error::map("write", maps::HP_CONFIG.name, e))?;
    }
    Ok(())
}

/// The node namespace's cookie as the socket hooks see it: `SO_NETNS_COOKIE`
/// of a socket in the calling thread's namespace (Linux 5.14); without it, the
/// one recorded in `sl_hp_config` by an earlier ADD (the plugin learns it with
/// `hp_learn4`), if any. `None`: neither.
pub fn node_netns_cookie(root: &PinRoot) -> Result<Option<u64>> {
    match sluice_common::user::netns_cookie() {
        Ok(c) => Ok(Some(c)),
        Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => {
            let arr: Array<MapData, HostPortConfig> = root.typed(&maps::HP_CONFIG)?;
            Ok(arr
                .get(&0, 0)
                .ok()
                .map(|c| c.netns_cookie)
                .filter(|c| *c != 0))
        }
        Err(e) => Err(Error::io("reading the node's SO_NETNS_COOKIE", e)),
    }
}

/// Takes what `hp_learn4` recorded for the socket with cookie `socket_cookie`.
pub fn take_learned_cookie(root: &PinRoot, socket_cookie: u64) -> Result<Option<u64>> {
    let mut m: HashMap<MapData, u64, u64> = root.typed(&maps::HP_LEARN)?;
    let v = m.get(&socket_cookie, 0).ok();
    let _ = m.remove(&socket_cookie);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_and_specific_mappings_overlap() {
        let any = PortKey::new([0; 4], 80, 6);
        let addrs = [[192, 0, 2, 1], [10, 0, 0, 1]];
        let o = overlapping(&any, &addrs);
        assert_eq!(o.len(), 2);
        assert!(o
            .iter()
            .all(|k| k.host_port == any.host_port && k.proto == 6));
        assert_eq!(o[0].host_ip, [192, 0, 2, 1]);
        let one = PortKey::new([192, 0, 2, 1], 80, 6);
        assert_eq!(overlapping(&one, &addrs), vec![any]);
    }

    #[test]
    fn descriptions() {
        assert_eq!(describe(&PortKey::new([0; 4], 8080, 6)), "*:8080/tcp");
        assert_eq!(
            describe(&PortKey::new([192, 0, 2, 7], 5353, 17)),
            "192.0.2.7:5353/udp"
        );
        let t = PortTarget {
            pod_ip: [10, 1, 2, 3],
            pod_port: 80u16.to_be(),
            flags: 0,
            pod_ifindex: 4,
        };
        assert_eq!(describe_target(&t), "10.1.2.3:80");
    }
}
