//! The pod's network interface: a veth (or netkit, `podDevice`) pair whose
//! host end stays in the node's namespace (no bridge: every pod packet enters
//! the node through its own pair, where the datapath sees it).
//!
//! Addressing is point-to-point, as the reference `ptp` plugin does it:
//! - pod: the IPAM address (without the kernel's subnet route), `gw/32 dev eth0
//!   scope link`, the subnet and IPAM routes via the gateway, and a permanent
//!   neighbour entry gateway -> host veth MAC (no ARP/ND needed);
//! - node: the gateway address, once on the node's loopback device (so the pod
//!   can reach it; a link-local IPv6 gateway, the default, on each host veth
//!   instead), a /32 (/128) route to the pod, and a permanent neighbour pod
//!   IP -> pod MAC.
//!
//! With these kernel routes pods stay reachable even with no program attached; the
//! datapath only makes the path shorter.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnetwork::IpNetwork;

use crate::{
    cni::{
        config::PodDeviceKind,
        result::{IpConfig, Route},
    },
    error::Error,
    gateway::{self, host_prefix},
    netlink::{LinkInfo, Netlink, RouteSpec},
    netns::Netns,
};

/// Gateway used for a family when IPAM gives none: link-local, as Calico does.
pub const DEFAULT_GW_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
pub const DEFAULT_GW_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

/// Both ends of a pod's pair after creation.
pub struct PodPair {
    pub host: LinkInfo,
    pub pod: LinkInfo,
    /// A netkit pair (else a veth).
    pub netkit: bool,
}

/// Creates the pod's pair (`device` decides veth or netkit) and sets both ends
/// up.
#[expect(clippy::too_many_arguments, reason = "one pair, described in full")]
pub async fn create(
    host_nl: &Netlink,
    pod_nl: &Netlink,
    pod_ns: &Netns,
    host_name: &str,
    pod_name: &str,
    mtu: u32,
    pod_mac: Option<[u8; 6]>,
    device: PodDeviceKind,
) -> Result<PodPair, Error> {
    let spec = crate::netlink::VethSpec {
        host_name,
        peer_name: pod_name,
        peer_ns: pod_ns,
        mtu,
        peer_mac: pod_mac,
    };
    let netkit = match device {
        PodDeviceKind::Veth => false,
        PodDeviceKind::Netkit | PodDeviceKind::Auto if !crate::datapath::features::netkit() => {
            no_netkit(device)?
        }
        PodDeviceKind::Netkit | PodDeviceKind::Auto => {
            host_nl.create_netkit(&spec).await? || no_netkit(device)?
        }
    };
    if !netkit {
        host_nl.create_veth(&spec).await?;
    }
    let host = host_nl
        .link_by_name(host_name)
        .await?
        .ok_or_else(|| Error::netlink(format!("find {host_name}"), "vanished after creation"))?;
    let pod = pod_nl
        .link_by_name(pod_name)
        .await?
        .ok_or_else(|| Error::netlink(format!("find {pod_name}"), "not in the pod namespace"))?;
    // The host end gets no automatic IPv6 link-local address: nothing uses it
    // (a v6 pod's gateway, fe80::1 by default, is added to it explicitly, and
    // neighbours on both sides are permanent), and each one costs the node
    // namespace a DAD run, a solicited-node MLD join and an fe80::/64 route
    // beside every other veth's: route inserts and lookups there (`fib6_add_rt2node`,
    // `__find_rr_leaf`) and `addrconf_dad_work` under RTNL grew with the node's
    // pods (perf, 20 against 1,000 pods).
    host_nl.no_link_local(host.index).await?;
    host_nl.set_up(host.index).await?;
    pod_nl.set_up(pod.index).await?;
    Ok(PodPair { host, pod, netkit })
}

/// The kernel has no netkit: `auto` takes a veth (`Ok(false)`), `netkit` fails.
fn no_netkit(device: PodDeviceKind) -> Result<bool, Error> {
    if device == PodDeviceKind::Auto {
        return Ok(false);
    }
    Err(Error::config(
        "podDevice",
        "netkit",
        "this kernel has no netkit devices (Linux 6.7+ with CONFIG_NETKIT); use veth or auto",
    ))
}

/// The gateway of each family the pod has addresses in: IPAM's, or the default.
pub fn gateways(ips: &[IpConfig]) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = Vec::new();
    for v6 in [false, true] {
        let fam: Vec<&IpConfig> = ips.iter().filter(|i| i.address.is_ipv6() == v6).collect();
        if fam.is_empty() {
            continue;
        }
        let gw = fam.iter().find_map(|i| i.gateway).unwrap_or(if v6 {
            IpAddr::V6(DEFAULT_GW_V6)
        } else {
            IpAddr::V4(DEFAULT_GW_V4)
        });
        out.push(gw);
    }
    out
}

fn host_net(ip: IpAddr) -> Result<IpNetwork, Error> {
    IpNetwork::new(ip, host_prefix(ip)).map_err(|e| Error::netlink("route", e))
}

fn gw_for(gws: &[IpAddr], v6: bool) -> Option<IpAddr> {
    gws.iter().copied().find(|g| g.is_ipv6() == v6)
}

/// Addresses, routes and the gateway neighbour inside the pod.
pub async fn configure_pod(
    pod_nl: &Netlink,
    pair: &PodPair,
    ips: &[IpConfig],
    routes: &[Route],
    gws: &[IpAddr],
) -> Result<(), Error> {
    let idx = pair.pod.index;
    let host_mac = pair
        .host
        .mac
        .ok_or_else(|| Error::netlink("read host veth MAC", "no address"))?;
    for gw in gws {
        pod_nl
            .add_route(&RouteSpec {
                oif: Some(idx),
                link_scope: true,
                ..RouteSpec::new(host_net(*gw)?)
            })
            .await?;
        pod_nl.set_permanent_neighbour(idx, *gw, host_mac).await?;
    }
    for ip in ips {
        pod_nl
            .add_address(idx, ip.address.ip(), ip.address.prefix(), true)
            .await?;
        let subnet = IpNetwork::new(ip.address.network(), ip.address.prefix())
            .map_err(|e| Error::netlink("route", e))?;
        if subnet.prefix() < host_prefix(subnet.ip()) {
            if let Some(gw) = gw_for(gws, subnet.is_ipv6()) {
                pod_nl
                    .add_route(&RouteSpec {
                        gw: Some(gw),
                        oif: Some(idx),
                        onlink: true,
                        ..RouteSpec::new(subnet)
                    })
                    .await?;
            }
        }
    }
    for r in routes {
        let gw = r.gw.or_else(|| gw_for(gws, r.dst.is_ipv6()));
        pod_nl
            .add_route(&RouteSpec {
                gw,
                oif: Some(idx),
                onlink: gw.is_some(),
                mtu: r.mtu,
                priority: r.priority,
                table: r.table,
                ..RouteSpec::new(r.dst)
            })
            .await?;
    }
    Ok(())
}

/// The gateway address, pod routes and pod neighbours on the node side.
pub async fn configure_host(
    host_nl: &Netlink,
    pair: &PodPair,
    ips: &[IpConfig],
    gws: &[IpAddr],
) -> Result<(), Error> {
    let idx = pair.host.index;
    let pod_mac = pair
        .pod
        .mac
        .ok_or_else(|| Error::netlink("read pod MAC", "no address"))?;
    for gw in gws {
        gateway::add(host_nl, idx, *gw).await?;
    }
    for ip in ips {
        let a = ip.address.ip();
        host_nl
            .add_route(&RouteSpec {
                oif: Some(idx),
                link_scope: true,
                ..RouteSpec::new(host_net(a)?)
            })
            .await?;
        host_nl.set_permanent_neighbour(idx, a, pod_mac).await?;
    }
    Ok(())
}

/// Turns on GRO on the pod end of the veth (`ETHTOOL_SGRO`, in the pod's
/// namespace). GRO makes the veth run NAPI, without which frames redirected to it
/// by XDP (`veth_xdp_xmit`) are dropped; veth has GRO off by default.
pub fn enable_gro(pod_ns: &Netns, ifname: &str) -> Result<(), Error> {
    /// `struct ethtool_value` (linux/ethtool.h).
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    const ETHTOOL_SGRO: u32 = 0x0000_002c;
    pod_ns.run(|| -> Result<(), Error> {
        // SAFETY: plain socket(2); the fd is closed by OwnedFd below.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(Error::io(
                "opening an ioctl socket",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: `fd` is a fresh descriptor owned by nobody else.
        let _owned = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let mut value = EthtoolValue {
            cmd: ETHTOOL_SGRO,
            data: 1,
        };
        // SAFETY: ifreq is plain data; zero is a valid initial value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in ifr.ifr_name.iter_mut().zip(ifname.bytes().take(15)) {
            *dst = libc::c_char::from_ne_bytes([src]);
        }
        ifr.ifr_ifru.ifru_data = (&raw mut value).cast();
        // SAFETY: SIOCETHTOOL with a valid ifreq pointing at a live ethtool_value.
        let rc = unsafe { libc::ioctl(fd, libc::SIOCETHTOOL, &mut ifr) };
        if rc < 0 {
            return Err(Error::io(
                format!("enabling GRO on {ifname}"),
                std::io::Error::last_os_error(),
            ));
        }
        Ok(())
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ipc(a: &str, gw: Option<&str>) -> IpConfig {
        IpConfig {
            address: a.parse().unwrap(),
            gateway: gw.map(|g| g.parse().unwrap()),
            interface: None,
        }
    }

    #[test]
    fn gateways_per_family_with_defaults() {
        let g = gateways(&[
            ipc("10.0.0.5/24", Some("10.0.0.1")),
            ipc("fd00::5/64", None),
        ]);
        assert_eq!(
            g,
            vec![
                "10.0.0.1".parse::<IpAddr>().unwrap(),
                IpAddr::V6(DEFAULT_GW_V6)
            ]
        );
        assert_eq!(
            gateways(&[ipc("10.0.0.5/32", None)]),
            vec![IpAddr::V4(DEFAULT_GW_V4)]
        );
        assert!(gateways(&[]).is_empty());
    }
}
