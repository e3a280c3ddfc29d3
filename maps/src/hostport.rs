//! hostPort: the mappings (`sl_ports`, `sl_ports6`) and their rules, the node
//! addresses a wildcard mapping matches (`sl_node_addrs`, `sl_node_addrs6`),
//! translated flows (`sl_hp_ct`, `sl_hp_ct6`), the socket hooks' state
//! (`sl_hp_sock`, `sl_hp_sock6`) and the switch that turns the programs'
//! hostPort path on (`sl_hp_config`). Each function works on one family's
//! maps, [`V4`] or [`V6`].
use std::net::{Ipv4Addr, Ipv6Addr};

use aya::maps::{Array, HashMap, MapData};
use sluice_common::{
    maps, maps::MapSpec, port_flags, Addr6, EndpointInfo, HostPortConfig, HpAddr, HpFlowOf,
    NatKeyOf, PortKeyOf, PortTargetOf, SockKey, SockKey6,
};

use crate::{endpoint::text, error::is_exists, Error, PinRoot, Result};

/// An address family's hostPort maps.
pub trait Family: 'static {
    type Addr: HpAddr + aya::Pod + Ord + std::fmt::Debug;
    type SockKey: aya::Pod;
    const PORTS: MapSpec;
    const HP_CT: MapSpec;
    const HP_SOCK: MapSpec;
    const NODE_ADDRS: MapSpec;
    /// How a wildcard mapping's host address shows: `*`, `[::]`.
    const ANY: &'static str;
    /// `192.0.2.1`, `[fd00::1]`.
    fn show(a: &Self::Addr) -> String;
    /// The pod address a socket entry points at.
    fn sock_pod_ip(k: &Self::SockKey) -> Self::Addr;
}

/// IPv4: `sl_ports`, `sl_hp_ct`, `sl_hp_sock`, `sl_node_addrs`.
pub struct V4;
/// IPv6: `sl_ports6`, `sl_hp_ct6`, `sl_hp_sock6`, `sl_node_addrs6`.
pub struct V6;

impl Family for V4 {
    type Addr = [u8; 4];
    type SockKey = SockKey;
    const PORTS: MapSpec = maps::PORTS;
    const HP_CT: MapSpec = maps::HP_CT;
    const HP_SOCK: MapSpec = maps::HP_SOCK;
    const NODE_ADDRS: MapSpec = maps::NODE_ADDRS;
    const ANY: &'static str = "*";
    fn show(a: &[u8; 4]) -> String {
        Ipv4Addr::from(*a).to_string()
    }
    fn sock_pod_ip(k: &SockKey) -> [u8; 4] {
        k.pod_ip
    }
}

impl Family for V6 {
    type Addr = Addr6;
    type SockKey = SockKey6;
    const PORTS: MapSpec = maps::PORTS6;
    const HP_CT: MapSpec = maps::HP_CT6;
    const HP_SOCK: MapSpec = maps::HP_SOCK6;
    const NODE_ADDRS: MapSpec = maps::NODE_ADDRS6;
    const ANY: &'static str = "[::]";
    fn show(a: &Addr6) -> String {
        format!("[{}]", Ipv6Addr::from(a.0))
    }
    fn sock_pod_ip(k: &SockKey6) -> Addr6 {
        k.pod_ip
    }
}

/// A mapping of family `F`: its key and where it goes.
pub type Mapping<F> = (
    PortKeyOf<<F as Family>::Addr>,
    PortTargetOf<<F as Family>::Addr>,
);

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

/// `*:8080/tcp`, `192.168.1.5:8080/tcp`, `[::]:8080/tcp` (every node IPv6
/// address), `[fd00::5]:8080/tcp`.
pub fn describe<F: Family>(k: &PortKeyOf<F::Addr>) -> String {
    let host = if k.host_ip == F::Addr::default() {
        F::ANY.to_string()
    } else {
        F::show(&k.host_ip)
    };
    format!("{host}:{}/{}", k.port(), proto_name(k.proto))
}

/// `10.22.0.5:80`, `[fd00::5]:80`.
pub fn describe_target<F: Family>(t: &PortTargetOf<F::Addr>) -> String {
    format!("{}:{}", F::show(&t.pod_ip), u16::from_be(t.pod_port))
}

type Ports<F> = HashMap<MapData, PortKeyOf<<F as Family>::Addr>, PortTargetOf<<F as Family>::Addr>>;

fn ports<F: Family>(root: &PinRoot) -> Result<Ports<F>> {
    root.typed(&F::PORTS)
}

/// Every mapping, sorted by port, protocol, address.
pub fn list<F: Family>(root: &PinRoot) -> Result<Vec<Mapping<F>>> {
    if !root.has(&F::PORTS) {
        // A datapath from before IPv6 hostPorts.
        return Ok(Vec::new());
    }
    let mut v: Vec<_> = ports::<F>(root)?
        .iter()
        .filter_map(std::result::Result::ok)
        .collect();
    v.sort_by_key(|(k, _)| (k.port(), k.proto, k.host_ip));
    Ok(v)
}

/// Who owns a mapping: the container id (and interface) of its pod, from
/// `sl_ep_info`, or "an operator".
pub fn owner<A>(root: &PinRoot, t: &PortTargetOf<A>) -> String {
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

fn conflict<F: Family>(root: &PinRoot, k: PortKeyOf<F::Addr>, t: PortTargetOf<F::Addr>) -> Error {
    Error::PortConflict {
        port: describe::<F>(&k),
        target: describe_target::<F>(&t),
        owner: owner(root, &t),
    }
}

/// Keys that would overlap `k`: a wildcard mapping overlaps the same port on
/// each node address, and the other way round.
pub fn overlapping<A: HpAddr>(k: &PortKeyOf<A>, node_addrs: &[A]) -> Vec<PortKeyOf<A>> {
    if k.host_ip == A::default() {
        node_addrs
            .iter()
            .map(|a| PortKeyOf { host_ip: *a, ..*k })
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
pub fn add<F: Family>(root: &PinRoot, entries: &[Mapping<F>], netns_cookie: u64) -> Result<()> {
    if entries.is_empty() {
        return Ok(());
    }
    publish::<F>(root, entries)?;
    activate(root, netns_cookie)
}

/// A pod's mappings of both families, as [`add`] publishes one family's: all
/// or none across both. When the IPv6 side fails, only the IPv4 keys this call
/// took go again; those the pod held from an earlier ADD stay.
pub fn add_pod(
    root: &PinRoot,
    v4: &[Mapping<V4>],
    v6: &[Mapping<V6>],
    netns_cookie: u64,
) -> Result<()> {
    if v4.is_empty() && v6.is_empty() {
        return Ok(());
    }
    let taken = publish::<V4>(root, v4)?;
    if let Err(e) = publish::<V6>(root, v6) {
        if let Ok(mut map) = ports::<V4>(root) {
            for k in &taken {
                let _ = map.remove(k);
            }
        }
        return Err(e);
    }
    activate(root, netns_cookie)
}

/// [`add`]'s rules for one family without turning the path on. Returns the
/// keys it took (those that were free); on an error it has given them back.
fn publish<F: Family>(root: &PinRoot, entries: &[Mapping<F>]) -> Result<Vec<PortKeyOf<F::Addr>>> {
    let mut taken: Vec<PortKeyOf<F::Addr>> = Vec::new();
    if entries.is_empty() {
        return Ok(taken);
    }
    let mut map = ports::<F>(root)?;
    let node_addrs = node_addrs::<F>(root)?;
    let mut result = Ok(());
    'entries: for (k, t) in entries {
        for o in overlapping(k, &node_addrs) {
            if let Ok(other) = map.get(&o, 0) {
                if other.pod_ifindex != t.pod_ifindex {
                    result = Err(conflict::<F>(root, o, other));
                    break 'entries;
                }
            }
        }
        match map.insert(k, t, BPF_NOEXIST) {
            Ok(()) => taken.push(*k),
            Err(e) if is_exists(&e) => match map.get(k, 0) {
                Ok(other) if other == *t => {}
                Ok(other) => {
                    result = Err(conflict::<F>(root, *k, other));
                    break;
                }
                Err(e) => {
                    result = Err(Error::map(
                        format!("read {}", describe::<F>(k)),
                        F::PORTS.name,
                        e,
                    ));
                    break;
                }
            },
            Err(e) => {
                result = Err(Error::map(
                    format!("add {}", describe::<F>(k)),
                    F::PORTS.name,
                    e,
                ));
                break;
            }
        }
    }
    if let Err(e) = result {
        for k in &taken {
            let _ = map.remove(k);
        }
        return Err(e);
    }
    Ok(taken)
}

/// Removes the mapping at `k` whatever its owner; `false` when there was none.
pub fn remove_key<F: Family>(root: &PinRoot, k: &PortKeyOf<F::Addr>) -> Result<bool> {
    Ok(ports::<F>(root)?.remove(k).is_ok())
}

/// A directory `sluicectl ports add` makes in the pin root (bpffs holds
/// directories as well as pins): operator mappings may exist. They are in no
/// attachment record, so while it is there a pod's DEL looks through every
/// mapping for those of the pod ([`remove_of_pods`]); without it, the pod's own
/// keys are removed one by one ([`remove_mappings`]), whatever the number of
/// mappings on the node.
const OPERATOR_MARK: &str = "operator-ports";

/// Notes that operator mappings may exist (see [`OPERATOR_MARK`]).
pub fn mark_operator_mappings(root: &PinRoot) -> Result<()> {
    let path = root.path().join(OPERATOR_MARK);
    match std::fs::create_dir(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(Error::Io {
            op: format!("creating {}", path.display()),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// Whether operator mappings may exist (see [`OPERATOR_MARK`]).
pub fn operator_mappings_marked(root: &PinRoot) -> bool {
    root.path().join(OPERATOR_MARK).exists()
}

/// Removes a pod's own mappings by key: each of `entries` whose key still goes
/// to that entry's pod (a key another pod holds now is left alone). One
/// lookup and one delete per mapping; returns how many went.
pub fn remove_mappings<F: Family>(root: &PinRoot, entries: &[Mapping<F>]) -> Result<usize> {
    if entries.is_empty() || !root.has(&F::PORTS) {
        return Ok(0);
    }
    let mut map = ports::<F>(root)?;
    let mut n = 0;
    for (k, t) in entries {
        if map
            .get(k, 0)
            .is_ok_and(|found| found.pod_ifindex == t.pod_ifindex)
            && map.remove(k).is_ok()
        {
            n += 1;
        }
    }
    Ok(n)
}

/// Removes every mapping whose pod is on one of `ifindexes` (operator mappings
/// included). Walks the whole map. Returns how many went.
pub fn remove_of_pods<F: Family>(root: &PinRoot, ifindexes: &[u32]) -> Result<usize> {
    if ifindexes.is_empty() || !root.has(&F::PORTS) {
        return Ok(0);
    }
    let mut map = ports::<F>(root)?;
    let doomed: Vec<PortKeyOf<F::Addr>> = map
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
pub fn remove_orphans<F: Family>(root: &PinRoot, live: &[u32]) -> Result<usize> {
    if !root.has(&F::PORTS) {
        return Ok(0);
    }
    let mut orphans: Vec<u32> = ports::<F>(root)?
        .iter()
        .filter_map(std::result::Result::ok)
        .map(|(_, t)| t.pod_ifindex)
        .filter(|i| !live.contains(i))
        .collect();
    orphans.sort_unstable();
    orphans.dedup();
    remove_of_pods::<F>(root, &orphans)
}

/// Forgets the translated flows and socket rewrites of pod addresses `ips`, so
/// a later pod with a reused address inherits none.
pub fn forget_pods<F: Family>(root: &PinRoot, ips: &[F::Addr]) -> Result<()> {
    if ips.is_empty() || !root.has(&F::HP_CT) {
        return Ok(());
    }
    let mut ct: HashMap<MapData, NatKeyOf<F::Addr>, HpFlowOf<F::Addr>> = root.typed(&F::HP_CT)?;
    let doomed: Vec<NatKeyOf<F::Addr>> = ct
        .iter()
        .filter_map(std::result::Result::ok)
        .filter(|(k, f)| ips.contains(&k.src_ip) || ips.contains(&f.dst_ip))
        .map(|(k, _)| k)
        .collect();
    for k in &doomed {
        let _ = ct.remove(k);
    }
    let mut socks: HashMap<MapData, F::SockKey, sluice_common::SockOrigOf<F::Addr>> =
        root.typed(&F::HP_SOCK)?;
    let doomed: Vec<F::SockKey> = socks
        .keys()
        .filter_map(std::result::Result::ok)
        .filter(|k| ips.contains(&F::sock_pod_ip(k)))
        .collect();
    for k in &doomed {
        let _ = socks.remove(k);
    }
    Ok(())
}

/// CHECK: each entry is in place, for this pod.
pub fn check<F: Family>(root: &PinRoot, entries: &[Mapping<F>]) -> Result<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let map =
        ports::<F>(root).map_err(|e| Error::Check(format!("hostPort mappings unreadable: {e}")))?;
    for (k, t) in entries {
        match map.get(k, 0) {
            Ok(found) if found == *t => {}
            Ok(found) => {
                return Err(Error::Check(format!(
                    "hostPort {} goes to {} (ifindex {}), not {} (ifindex {})",
                    describe::<F>(k),
                    describe_target::<F>(&found),
                    found.pod_ifindex,
                    describe_target::<F>(t),
                    t.pod_ifindex
                )))
            }
            Err(_) => {
                return Err(Error::Check(format!(
                    "hostPort mapping {} -> {} is missing",
                    describe::<F>(k),
                    describe_target::<F>(t)
                )))
            }
        }
    }
    Ok(())
}

fn node_addrs_map<F: Family>(root: &PinRoot) -> Result<HashMap<MapData, F::Addr, u8>> {
    root.typed(&F::NODE_ADDRS)
}

/// The node addresses in `sl_node_addrs` (`sl_node_addrs6`).
pub fn node_addrs<F: Family>(root: &PinRoot) -> Result<Vec<F::Addr>> {
    if !root.has(&F::NODE_ADDRS) {
        return Ok(Vec::new());
    }
    Ok(node_addrs_map::<F>(root)?
        .keys()
        .filter_map(std::result::Result::ok)
        .collect())
}

/// Makes `sl_node_addrs` (`sl_node_addrs6`) hold exactly `addrs` (the node's
/// addresses of the family now).
pub fn set_node_addrs<F: Family>(root: &PinRoot, addrs: &[F::Addr]) -> Result<()> {
    let mut map = node_addrs_map::<F>(root)?;
    let old: Vec<F::Addr> = map.keys().filter_map(std::result::Result::ok).collect();
    for a in addrs {
        if !old.contains(a) {
            map.insert(a, 1, 0)
                .map_err(|e| Error::map(format!("add {}", F::show(a)), F::NODE_ADDRS.name, e))?;
        }
    }
    for a in old.iter().filter(|a| !addrs.contains(a)) {
        let _ = map.remove(a);
    }
    Ok(())
}

/// Whether the node agent keeps `sl_node_addrs` and `sl_node_addrs6` in step
/// with the node's addresses now (its lease in `sl_agent` lasts), so an ADD
/// need not read the node's addresses itself.
pub fn node_addrs_kept_by_agent(root: &PinRoot) -> bool {
    node_addrs_lease_left_ns(root).is_ok_and(|left| left > 0)
}

/// How long the node agent's node-address lease still lasts, in ns (0: not
/// held).
pub fn node_addrs_lease_left_ns(root: &PinRoot) -> Result<u64> {
    crate::agent::lease_left_ns(root, sluice_common::agent_slot::NODE_ADDRS_UNTIL_NS)
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
        let any = sluice_common::PortKey::new([0; 4], 80, 6);
        let addrs = [[192, 0, 2, 1], [10, 0, 0, 1]];
        let o = overlapping(&any, &addrs);
        assert_eq!(o.len(), 2);
        assert!(o
            .iter()
            .all(|k| k.host_port == any.host_port && k.proto == 6));
        assert_eq!(o[0].host_ip, [192, 0, 2, 1]);
        let one = sluice_common::PortKey::new([192, 0, 2, 1], 80, 6);
        assert_eq!(overlapping(&one, &addrs), vec![any]);
    }

    #[test]
    fn descriptions() {
        use sluice_common::{PortKey, PortKey6, PortTarget};
        assert_eq!(describe::<V4>(&PortKey::new([0; 4], 8080, 6)), "*:8080/tcp");
        assert_eq!(
            describe::<V4>(&PortKey::new([192, 0, 2, 7], 5353, 17)),
            "192.0.2.7:5353/udp"
        );
        assert_eq!(
            describe::<V6>(&PortKey6::new(Addr6::default(), 8080, 6)),
            "[::]:8080/tcp"
        );
        let mut a = [0u8; 16];
        a[0] = 0xfd;
        a[15] = 5;
        assert_eq!(
            describe::<V6>(&PortKey6::new(Addr6(a), 53, 17)),
            "[fd00::5]:53/udp"
        );
        let t = PortTarget {
            pod_ip: [10, 1, 2, 3],
            pod_port: 80u16.to_be(),
            flags: 0,
            pod_ifindex: 4,
        };
        assert_eq!(describe_target::<V4>(&t), "10.1.2.3:80");
    }
}
