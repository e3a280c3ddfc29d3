//! The node's own networking: its uplink, forwarding, and routes to the pods of
//! other nodes. All of it lives in the namespace the plugin runs in (the node's).
use crate::{
    cni::{config::RemoteNode, result::IpConfig},
    datapath::Uplink,
    error::Error,
    netlink::{Netlink, RouteSpec},
};

/// Turns on forwarding for the families the pod uses (as the reference bridge
/// plugin does); pods reach each other and the world through the node.
pub fn enable_forwarding(ips: &[IpConfig]) -> Result<(), Error> {
    let mut files = Vec::new();
    if ips.iter().any(|i| i.address.is_ipv4()) {
        files.push((libc::AF_INET, "/proc/sys/net/ipv4/ip_forward"));
    }
    if ips.iter().any(|i| i.address.is_ipv6()) {
        files.push((libc::AF_INET6, "/proc/sys/net/ipv6/conf/all/forwarding"));
    }
    for (family, f) in files {
        // Asked over netlink: reading the file costs O(namespaces) (see
        // netconf); it is opened only to turn forwarding on, or when the
        // kernel did not answer.
        let on = u8::try_from(family)
            .ok()
            .and_then(crate::netlink::netconf::forwarding);
        let on = on.unwrap_or_else(|| std::fs::read_to_string(f).unwrap_or_default().trim() == "1");
        if !on {
            std::fs::write(f, "1").map_err(|e| Error::io(format!("writing 1 to {f}"), e))?;
        }
    }
    Ok(())
}

/// The uplink: the configured interface, or the one of the IPv4 default route.
/// `None` when there is neither (a node without a way out).
pub async fn uplink(host_nl: &Netlink, configured: Option<&str>) -> Result<Option<Uplink>, Error> {
    let link = match configured {
        Some(name) => Some(host_nl.link_by_name(name).await?.ok_or_else(|| {
            Error::config(
                "uplink",
                name,
                "no interface of that name in the node namespace",
            )
        })?),
        None => match host_nl.default_route_oif().await? {
            Some(oif) => host_nl.link_by_index(oif).await?,
            None => None,
        },
    };
    Ok(link.map(|l| Uplink {
        is_veth: l.kind.as_deref() == Some("veth"),
        ifname: l.name,
        ifindex: l.index,
        mac: l.mac.unwrap_or_default(),
    }))
}

/// MTU of the uplink, or 1500 without one.
pub async fn uplink_mtu(host_nl: &Netlink, uplink: Option<&Uplink>) -> Result<u32, Error> {
    if let Some(u) = uplink {
        if let Some(l) = host_nl.link_by_index(u.ifindex).await? {
            if l.mtu >= 68 {
                return Ok(l.mtu);
            }
        }
    }
    Ok(1500)
}

/// Routes to other nodes' pod ranges (config `nodes`): `podCIDR via nodeIP`.
/// Existing ones are left as they are.
pub async fn ensure_remote_routes(host_nl: &Netlink, nodes: &[RemoteNode]) -> Result<(), Error> {
    for n in nodes {
        host_nl
            .add_route(&RouteSpec {
                gw: Some(n.node_ip),
                ..RouteSpec::new(n.pod_cidr)
            })
            .await?;
    }
    Ok(())
}
