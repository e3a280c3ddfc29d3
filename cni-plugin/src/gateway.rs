//! The pods' gateway as an address of the node. ADD puts each gateway once on
//! the node's loopback device (a link-local IPv6 gateway on each host veth);
//! GC takes off `lo` the gateways no pod on the node uses any more.
use std::net::IpAddr;

use ipnetwork::IpNetwork;

use crate::{
    datapath::Datapath,
    error::Error,
    netlink::{Netlink, RouteSpec},
    state::StateStore,
};

/// The loopback device's ifindex, the same in every network namespace
/// (`LOOPBACK_IFINDEX`, `include/net/net_namespace.h`).
const LOOPBACK_IFINDEX: u32 = 1;

/// The prefix length of one address of `ip`'s family (32 or 128).
pub fn host_prefix(ip: IpAddr) -> u8 {
    if ip.is_ipv4() {
        32
    } else {
        128
    }
}

/// The prefix of IPv6 link-local addresses (RFC 4291 2.5.6).
const LINK_LOCAL_PREFIX: u8 = 64;

/// A link-local IPv6 gateway (the default `fe80::1`): local only on the link
/// that carries it (RFC 4291 scope), so it goes on each host veth.
fn per_link(gw: IpAddr) -> bool {
    matches!(gw, IpAddr::V6(a) if a.is_unicast_link_local())
}

/// Makes the pods' gateway `gw` a local address of the node. Once, on the
/// loopback device: Linux delivers a packet to a local address whatever
/// interface it came in on, and one copy keeps every ADD's address work O(1)
/// (a copy per host veth made each one more alias of one local route,
/// `fib_add_ifaddr`, and one more line in every address dump, which an ADD
/// with a hostPort reads). The pod never asks for the gateway's MAC (a
/// permanent neighbour, see `interface::configure_pod`). A link-local IPv6
/// gateway goes on host veth `host_index` instead, as `fe80::1/64` with its
/// `fe80::/64` route: the host veth has no link-local address of its own
/// (`interface::create`), and the node answers a pod's link-local source
/// (a `ping fe80::1%eth0`) through that route.
pub async fn add(host_nl: &Netlink, host_index: u32, gw: IpAddr) -> Result<(), Error> {
    if per_link(gw) {
        host_nl
            .add_address(host_index, gw, LINK_LOCAL_PREFIX, false)
            .await?;
        return Ok(());
    }
    let added = host_nl
        .add_address(LOOPBACK_IFINDEX, gw, host_prefix(gw), true)
        .await?;
    if added {
        // Local routes on a device that is down are dead; a node's loopback
        // is up, a fresh namespace's is not.
        host_nl.set_up(LOOPBACK_IFINDEX).await?;
    }
    Ok(())
}

/// Puts the gateways on `lo` again, under the datapath's shared lock (ADD,
/// after `Datapath::prepare`): a GC that found no pod of theirs, holding the
/// exclusive lock, may have taken them off between this ADD's first
/// [`add`] and its pod route. One request per gateway, answered `EEXIST`.
pub async fn readd(host_nl: &Netlink, gws: &[IpAddr]) -> Result<(), Error> {
    for gw in gws.iter().filter(|g| !per_link(**g)) {
        add(host_nl, LOOPBACK_IFINDEX, *gw).await?;
    }
    Ok(())
}

/// A gateway GC may take off `lo`, with the subnets its pods' addresses are
/// in (none known when the gateway is outside them, as the default
/// `169.254.1.1` is).
#[derive(Debug, Default)]
pub struct Candidates(Vec<(IpAddr, Vec<IpNetwork>)>);

impl Candidates {
    /// Notes gateway `gw`, serving pods in `subnet` (when it lies in it).
    pub fn note(&mut self, gw: IpAddr, subnet: Option<IpNetwork>) {
        if per_link(gw) {
            return;
        }
        let subnet = subnet.filter(|s| s.contains(gw)).map(|s| {
            // The network itself, not a pod's address with the prefix.
            IpNetwork::new(s.network(), s.prefix()).unwrap_or(s)
        });
        match self.0.iter_mut().find(|(g, _)| *g == gw) {
            Some((_, subnets)) => {
                if let Some(s) = subnet {
                    if !subnets.contains(&s) {
                        subnets.push(s);
                    }
                }
            }
            None => self.0.push((gw, subnet.into_iter().collect())),
        }
    }

    /// Notes the gateways of a pod with addresses `ips` (address/prefix).
    pub fn note_pod(&mut self, gws: &[IpAddr], ips: &[IpNetwork]) {
        for gw in gws {
            let subnet = ips.iter().copied().find(|n| n.contains(*gw));
            self.note(*gw, subnet);
        }
    }
}

/// Whether a pod may still use gateway `gw`: a record of this network names it,
/// or the node routes a pod address through a device of its own (a pod's
/// `scope link` host route via its host veth, which any network's pods have)
/// inside one of the gateway's `subnets`, or anywhere when no subnet is known.
/// Another network's pods may share the gateway, and only their routes tell.
fn in_use(gw: IpAddr, subnets: &[IpNetwork], routes: &[RouteSpec], recorded: &[IpAddr]) -> bool {
    if recorded.contains(&gw) {
        return true;
    }
    routes
        .iter()
        .filter(|r| {
            r.link_scope
                && r.oif.is_some_and(|i| i != LOOPBACK_IFINDEX)
                && r.dst.is_ipv4() == gw.is_ipv4()
                && r.dst.prefix() == host_prefix(r.dst.ip())
        })
        .any(|r| subnets.is_empty() || subnets.iter().any(|s| s.contains(r.dst.ip())))
}

/// GC: takes off `lo` each candidate gateway no pod on the node uses (see
/// [`in_use`]); the others, and any address of `lo` that is not a candidate's
/// exact `/32` (`/128`), stay. Under the datapath's exclusive lock, so no ADD
/// is between its gateway and [`readd`]. Each removal is logged to stderr.
pub async fn remove_unused(
    host_nl: &Netlink,
    dp: &Datapath,
    store: &StateStore,
    candidates: &Candidates,
) -> Result<(), Error> {
    if candidates.0.is_empty() {
        return Ok(());
    }
    let _lock = dp.lock_exclusive()?;
    let on_lo = host_nl.addresses(LOOPBACK_IFINDEX).await?;
    let recorded: Vec<IpAddr> = store.list()?.into_iter().flat_map(|r| r.gateways).collect();
    let mut routes: [Option<Vec<RouteSpec>>; 2] = [None, None];
    for (gw, subnets) in &candidates.0 {
        let mine = IpNetwork::new(*gw, host_prefix(*gw)).ok();
        if !on_lo.iter().any(|a| Some(*a) == mine) {
            continue;
        }
        let v6 = gw.is_ipv6();
        let family = &mut routes[usize::from(v6)];
        if family.is_none() {
            *family = Some(host_nl.routes(v6).await?);
        }
        let table = family.as_deref().unwrap_or_default();
        if in_use(*gw, subnets, table, &recorded) {
            continue;
        }
        if host_nl
            .del_address(LOOPBACK_IFINDEX, *gw, host_prefix(*gw))
            .await?
        {
            eprintln!("sluice: GC removes gateway {gw} from lo: no pod on the node uses it");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNetwork {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A pod's host route: `dst/32 dev #oif scope link`.
    fn pod_route(dst: &str, oif: u32) -> RouteSpec {
        RouteSpec {
            oif: Some(oif),
            link_scope: true,
            ..RouteSpec::new(net(dst))
        }
    }

    #[test]
    fn a_gateway_is_in_use_while_a_record_or_a_pod_route_in_its_subnet_is_left() {
        let gw = ip("10.85.0.1");
        let subnets = [net("10.85.0.0/24")];
        assert!(!in_use(gw, &subnets, &[], &[]));
        assert!(in_use(gw, &subnets, &[], &[gw]));
        assert!(in_use(gw, &subnets, &[pod_route("10.85.0.7/32", 9)], &[]));
        // Routes that are not a pod's: another subnet, on lo, not a host route,
        // not scope link, the other family.
        let others = [
            pod_route("10.86.0.7/32", 9),
            pod_route("10.85.0.7/32", LOOPBACK_IFINDEX),
            pod_route("10.85.0.0/24", 9),
            RouteSpec {
                oif: Some(9),
                ..RouteSpec::new(net("10.85.0.8/32"))
            },
            pod_route("fd00::7/128", 9),
        ];
        assert!(!in_use(gw, &subnets, &others, &[ip("10.85.0.2")]));
    }

    #[test]
    fn a_gateway_outside_its_pods_subnets_is_in_use_while_any_pod_route_is_left() {
        let gw = ip("169.254.1.1");
        assert!(in_use(gw, &[], &[pod_route("10.1.2.3/32", 9)], &[]));
        assert!(!in_use(gw, &[], &[pod_route("fd00::3/128", 9)], &[]));
        assert!(!in_use(gw, &[], &[], &[]));
    }

    #[test]
    fn candidates_keep_each_gateway_once_with_the_subnets_that_hold_it() {
        let mut c = Candidates::default();
        c.note_pod(
            &[ip("10.85.0.1"), ip("fe80::1"), ip("169.254.1.1")],
            &[net("10.85.0.5/24"), net("fd00::5/64")],
        );
        c.note(ip("10.85.0.1"), Some(net("10.85.0.0/24")));
        c.note(ip("10.85.0.1"), Some(net("10.99.0.0/24")));
        assert_eq!(
            c.0,
            [
                (ip("10.85.0.1"), vec![net("10.85.0.0/24")]),
                (ip("169.254.1.1"), vec![]),
            ]
        );
    }
}
