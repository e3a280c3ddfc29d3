//! Routes to the other nodes' pods, `podCIDR via InternalIP` (kindnet's
//! model: nodes share an L2 segment or a routed network that forwards pod
//! addresses), and the datapath's list of prefixes never masqueraded.
//!
//! The routes the agent makes carry their own `proto` ([`RT_PROTO`]), so that it
//! finds and removes exactly its own after a restart, and never touches a route
//! of the static `nodes` config, of the operator or of a routing daemon.
use std::{collections::BTreeSet, net::IpAddr};

use ipnetwork::IpNetwork;
use sluice_common::maps;
use sluice_host::{
    lock::FileLock,
    netlink::{Netlink, RouteSpec},
};
use sluice_maps::{
    nat::{non_masq_owner, set_non_masq, set_non_masq6, trie_prefixes},
    PinRoot,
};

use crate::{cluster::NodeInfo, error::Result};

/// `rtm_protocol` of the agent's routes ('S'; unassigned in
/// `/etc/iproute2/rt_protos`, which names 0-18 and the routing daemons' 42, 99,
/// 186-192). `ip route show proto 83` lists them.
pub(crate) const RT_PROTO: u8 = 83;

/// One route to another node's pods.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Route {
    pub(crate) dst: IpNetwork,
    pub(crate) via: IpAddr,
    /// The node it leads to (for messages; not compared with the kernel's).
    pub(crate) node: String,
}

/// The routes the nodes other than `me` call for, and a note for each pod range
/// that gets none (no InternalIP of its family; overlapping ours).
pub(crate) fn desired(nodes: &[NodeInfo], me: &str) -> (Vec<Route>, Vec<String>) {
    let own: Vec<IpNetwork> = nodes
        .iter()
        .filter(|n| n.name == me)
        .flat_map(|n| n.pod_cidrs.clone())
        .collect();
    let mut out = Vec::new();
    let mut notes = Vec::new();
    for n in nodes.iter().filter(|n| n.name != me) {
        for c in &n.pod_cidrs {
            if let Some(o) = own.iter().find(|o| overlaps(o, c)) {
                notes.push(format!(
                    "node {}: pod CIDR {c} overlaps this node's {o}; no route",
                    n.name
                ));
                continue;
            }
            match n.internal_ips.iter().find(|ip| ip.is_ipv6() == c.is_ipv6()) {
                Some(via) => out.push(Route {
                    dst: *c,
                    via: *via,
                    node: n.name.clone(),
                }),
                None => notes.push(format!(
                    "node {}: no InternalIP of the family of its pod CIDR {c}; no route",
                    n.name
                )),
            }
        }
    }
    out.sort();
    // Two nodes claiming one range: the first by name wins, deterministically.
    out.dedup_by(|b, a| a.dst == b.dst);
    (out, notes)
}

fn overlaps(a: &IpNetwork, b: &IpNetwork) -> bool {
    a.is_ipv4() == b.is_ipv4() && (a.contains(b.network()) || b.contains(a.network()))
}

/// What to change: `del` first (a range whose node changed address is deleted
/// and added again), then `add`.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) add: Vec<Route>,
    pub(crate) del: Vec<Route>,
}

/// `current`: the agent's routes in the kernel (their `node` unknown).
pub(crate) fn plan(desired: &[Route], current: &[Route]) -> Plan {
    let key = |r: &Route| (r.dst, r.via);
    let want: BTreeSet<_> = desired.iter().map(key).collect();
    let have: BTreeSet<_> = current.iter().map(key).collect();
    Plan {
        add: desired
            .iter()
            .filter(|r| !have.contains(&key(r)))
            .cloned()
            .collect(),
        del: current
            .iter()
            .filter(|r| !want.contains(&key(r)))
            .cloned()
            .collect(),
    }
}

fn spec(r: &Route) -> RouteSpec {
    RouteSpec {
        gw: Some(r.via),
        protocol: Some(RT_PROTO),
        ..RouteSpec::new(r.dst)
    }
}

/// What [`apply`] did: each change made, and each that failed with why (it is
/// tried again at the next pass).
#[derive(Debug, Default)]
pub(crate) struct Changes {
    pub(crate) added: Vec<Route>,
    pub(crate) removed: Vec<Route>,
    pub(crate) failed: Vec<String>,
}

/// Makes the kernel's routes of [`RT_PROTO`] (main table) the `desired` ones.
/// One route that cannot be made (its gateway not reachable yet, say) does
/// not hold up the others.
pub(crate) async fn apply(nl: &Netlink, desired: &[Route]) -> Result<Changes> {
    let mut current = Vec::new();
    for v6 in [false, true] {
        for r in nl.routes(v6).await? {
            if let (Some(RT_PROTO), Some(via)) = (r.protocol, r.gw) {
                current.push(Route {
                    dst: r.dst,
                    via,
                    node: String::new(),
                });
            }
        }
    }
    let p = plan(desired, &current);
    let mut done = Changes::default();
    for r in p.del {
        match nl.del_route(&spec(&r)).await {
            Ok(()) => done.removed.push(r),
            Err(e) => done.failed.push(e.to_string()),
        }
    }
    for r in p.add {
        match nl.add_route(&spec(&r)).await {
            Ok(()) => done.added.push(r),
            Err(e) => done.failed.push(format!("{e} (node {})", r.node)),
        }
    }
    Ok(done)
}

/// Puts the other nodes' pod ranges (`remote`) into the datapath's
/// non-masquerade prefixes, as the agent's own entries ([`non_masq_owner::NODES`]):
/// ADD's entries from the config stay. `false` when the datapath is not loaded
/// yet (no pod on this node so far); the first ADD loads it.
pub(crate) fn apply_datapath(root: &PinRoot, remote: &[IpNetwork]) -> Result<bool> {
    if !root.has(&maps::NON_MASQ) {
        return Ok(false);
    }
    // ADD writes its own bits under the shared lock; ours is a read, modify,
    // write of the same entries, so it excludes them.
    let _lock = FileLock::dir_exclusive(root.path())?;
    let (v4, v6) = trie_prefixes(remote);
    set_non_masq(root, non_masq_owner::NODES, &v4)?;
    if root.has(&maps::NON_MASQ6) {
        set_non_masq6(root, non_masq_owner::NODES, &v6)?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, cidrs: &[&str], ips: &[&str]) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            pod_cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
            internal_ips: ips.iter().map(|c| c.parse().unwrap()).collect(),
        }
    }

    fn r(dst: &str, via: &str) -> Route {
        Route {
            dst: dst.parse().unwrap(),
            via: via.parse().unwrap(),
            node: String::new(),
        }
    }

    #[test]
    fn one_route_per_remote_range_via_the_address_of_its_family() {
        let nodes = [
            node(
                "a",
                &["10.244.0.0/24", "fd00:0::/64"],
                &["192.168.0.1", "fd01::1"],
            ),
            node(
                "b",
                &["10.244.1.0/24", "fd00:1::/64"],
                &["192.168.0.2", "fd01::2"],
            ),
            node("c", &["10.244.2.0/24", "fd00:2::/64"], &["192.168.0.3"]),
            node("d", &[], &["192.168.0.4"]),
        ];
        let (routes, notes) = desired(&nodes, "a");
        let got: Vec<_> = routes
            .iter()
            .map(|r| format!("{} via {} ({})", r.dst, r.via, r.node))
            .collect();
        assert_eq!(
            got,
            [
                "10.244.1.0/24 via 192.168.0.2 (b)",
                "10.244.2.0/24 via 192.168.0.3 (c)",
                "fd00:1::/64 via fd01::2 (b)",
            ]
        );
        assert_eq!(notes.len(), 1);
        assert!(notes[0].contains("fd00:2::/64"), "{notes:?}");
    }

    #[test]
    fn overlapping_or_duplicate_ranges_get_one_route_or_none() {
        let nodes = [
            node("a", &["10.244.0.0/24"], &["192.168.0.1"]),
            node("b", &["10.244.0.0/16"], &["192.168.0.2"]),
            node("c", &["10.245.0.0/24"], &["192.168.0.3"]),
            node("d", &["10.245.0.0/24"], &["192.168.0.4"]),
        ];
        let (routes, notes) = desired(&nodes, "a");
        assert_eq!(routes.len(), 1, "{routes:?}");
        assert_eq!(routes[0].node, "c");
        assert!(notes[0].contains("overlaps"), "{notes:?}");
    }

    #[test]
    fn plan_adds_missing_deletes_stale_and_moves_a_changed_gateway() {
        let want = [
            r("10.244.1.0/24", "192.168.0.2"),
            r("10.244.2.0/24", "192.168.0.9"),
        ];
        let have = [
            r("10.244.2.0/24", "192.168.0.3"),
            r("10.244.3.0/24", "192.168.0.4"),
        ];
        let p = plan(&want, &have);
        assert_eq!(p.add, want.to_vec());
        assert_eq!(p.del, have.to_vec());
        assert_eq!(plan(&want, &want), Plan::default());
    }
}
