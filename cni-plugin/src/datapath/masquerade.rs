//! Masquerade on the plugin's side: what it needs from the node and the config,
//! worked out at ADD (the address, the NAT ports, the prefixes never
//! masqueraded). The maps and their rules are `sluice_maps::nat`.
use std::net::{IpAddr, Ipv4Addr};

use ipnetwork::{IpNetwork, Ipv4Network};
use sluice_common::{masq_flags, MasqConfig};

use super::Uplink;
use crate::{
    cni::{config::NetConf, result::IpConfig},
    error::Error,
    ipam::Ipam,
    netlink::Netlink,
};

/// Masquerade as the programs see it: the config entry and the prefixes never
/// masqueraded.
#[derive(Clone, Debug)]
pub struct MasqSpec {
    pub config: MasqConfig,
    pub non_masq: Vec<(u32, [u8; 4])>,
}

const PORT_RANGE_FILE: &str = "/proc/sys/net/ipv4/ip_local_port_range";
/// Fewest NAT ports worth running with.
const MIN_PORTS: u32 = 1024;

/// The masquerade spec for this network, `None` without `ipMasq`.
pub async fn spec(
    conf: &NetConf,
    host_nl: &Netlink,
    uplink: Option<&Uplink>,
    ipam: &Ipam,
    ips: &[IpConfig],
) -> Result<Option<MasqSpec>, Error> {
    if !conf.ip_masq {
        return Ok(None);
    }
    let addr = match conf.masq.address {
        Some(a) => a,
        None => uplink_v4(host_nl, uplink).await?,
    };
    let node_range = node_port_range()?;
    let [(port_min, port_max), (port2_min, port2_max)] = nat_ports(conf.masq.ports, node_range)?;
    let t = conf.masq.timeouts;
    let config = MasqConfig {
        addr: addr.octets(),
        flags: masq_flags::ENABLED,
        port_min,
        port_max,
        port2_min,
        port2_max,
        tcp_syn_secs: t.tcp_syn,
        tcp_established_secs: t.tcp_established,
        tcp_closing_secs: t.tcp_closing,
        udp_secs: t.udp,
        icmp_secs: t.icmp,
        // Kept from the map by sluice_maps::nat::write_config.
        prev_addr: [0; 4],
    };
    let non_masq = match &conf.masq.non_masq {
        Some(v) => v.clone(),
        None => default_non_masq(conf, ipam, ips),
    };
    Ok(Some(MasqSpec {
        config,
        non_masq: non_masq
            .iter()
            .map(|n| (u32::from(n.prefix()), n.network().octets()))
            .collect(),
    }))
}

/// The first IPv4 address of the uplink.
async fn uplink_v4(host_nl: &Netlink, uplink: Option<&Uplink>) -> Result<Ipv4Addr, Error> {
    let u = uplink.ok_or_else(|| {
        Error::config(
            "masqueradeAddress",
            "null",
            "there is no uplink (no default route and no `uplink`) to take the address from; set it",
        )
    })?;
    host_nl
        .addresses(u.ifindex)
        .await?
        .into_iter()
        .find_map(|a| match a.ip() {
            IpAddr::V4(v4) => Some(v4),
            IpAddr::V6(_) => None,
        })
        .ok_or_else(|| {
            Error::config(
                "masqueradeAddress",
                "null",
                format!("the uplink {} has no IPv4 address; set it", u.ifname),
            )
        })
}

/// The node's ephemeral port range (its own outgoing connections use these).
fn node_port_range() -> Result<(u16, u16), Error> {
    let s = std::fs::read_to_string(PORT_RANGE_FILE)
        .map_err(|e| Error::io(format!("reading {PORT_RANGE_FILE}"), e))?;
    parse_range(&s).ok_or_else(|| Error::Decode {
        what: PORT_RANGE_FILE.into(),
        reason: format!("{s:?} is not two port numbers"),
    })
}

fn parse_range(s: &str) -> Option<(u16, u16)> {
    let mut it = s.split_whitespace().map(str::parse::<u16>);
    Some((it.next()?.ok()?, it.next()?.ok()?))
}

/// No second range.
const NONE: (u16, u16) = (1, 0);

/// NAT ports: the configured range, or every port from 1024 up that lies outside
/// the node's ephemeral range (two ranges, e.g. 1024-32767 and 61000-65535). Either
/// way disjoint from the ephemeral range, so a masqueraded flow never takes the
/// tuple of a connection the node itself makes to the same server. (Ports below
/// 1024 are left alone: some clients bind them on purpose, e.g. NFS.)
fn nat_ports(configured: Option<(u16, u16)>, node: (u16, u16)) -> Result<[(u16, u16); 2], Error> {
    let (lo, hi) = node;
    if let Some((a, b)) = configured {
        if a <= hi && b >= lo {
            return Err(Error::config(
                "masqueradePorts",
                format!("{a}-{b}"),
                format!("overlaps the node's ip_local_port_range {lo}-{hi}"),
            ));
        }
        return Ok([(a, b), NONE]);
    }
    let below = (lo > 1024).then(|| (1024, lo - 1));
    let above = (hi < 65_535).then(|| (hi + 1, 65_535));
    let count = |r: Option<(u16, u16)>| r.map_or(0, |(a, b)| u32::from(b - a) + 1);
    if count(below) + count(above) < MIN_PORTS {
        return Err(Error::config(
            "masqueradePorts",
            "null",
            format!(
                "the node's ip_local_port_range {lo}-{hi} leaves fewer than {MIN_PORTS} ports from 1024 up; set masqueradePorts to a range outside it"
            ),
        ));
    }
    Ok(match (below, above) {
        (Some(a), Some(b)) => [a, b],
        (Some(a), None) | (None, Some(a)) => [a, NONE],
        (None, None) => [NONE, NONE],
    })
}

/// This network's pods, here and on the other nodes: the IPAM ranges, the pod's
/// own subnets, and `nodes`' pod CIDRs (IPv4).
fn default_non_masq(conf: &NetConf, ipam: &Ipam, ips: &[IpConfig]) -> Vec<Ipv4Network> {
    let mut out: Vec<Ipv4Network> = Vec::new();
    let mut add = |n: IpNetwork| {
        if let IpNetwork::V4(v4) = n {
            if let Ok(net) = Ipv4Network::new(v4.network(), v4.prefix()) {
                if !out.contains(&net) {
                    out.push(net);
                }
            }
        }
    };
    if let Ipam::Builtin(b) = ipam {
        for set in &b.config().range_sets {
            for r in set.ranges() {
                add(r.subnet);
            }
        }
    }
    for ip in ips {
        add(ip.address);
    }
    for n in &conf.nodes {
        add(n.pod_cidr);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nat_ports_stay_off_the_node_range() {
        assert_eq!(
            nat_ports(None, (32768, 60999)).unwrap(),
            [(1024, 32767), (61000, 65535)]
        );
        assert_eq!(
            nat_ports(None, (1024, 40000)).unwrap(),
            [(40001, 65535), NONE]
        );
        assert_eq!(
            nat_ports(None, (30000, 65535)).unwrap(),
            [(1024, 29999), NONE]
        );
        let e = nat_ports(None, (1024, 65000)).unwrap_err();
        assert_eq!(e.code(), 7);
        assert!(e.to_string().contains("1024-65000"));
        assert_eq!(
            nat_ports(Some((20000, 29999)), (32768, 60999)).unwrap(),
            [(20000, 29999), NONE]
        );
        let e = nat_ports(Some((60000, 62000)), (32768, 60999)).unwrap_err();
        assert!(e.to_string().contains("60000-62000"), "{e}");
    }

    #[test]
    fn reads_the_kernel_range_format() {
        assert_eq!(parse_range("32768\t60999\n"), Some((32768, 60999)));
        assert_eq!(parse_range("x"), None);
    }
}
